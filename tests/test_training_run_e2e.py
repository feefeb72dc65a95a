"""A training run end to end: real Snakemake, real LIBERO, the reference server's policies as
checkpoints of different quality (tools/reference_checkpoint.py: hold, a scripted expert at
half speed, the scripted expert). One run evaluates three of them on the same episodes; a
fourth added later, first in step order, runs only its own episodes; a checkpoint changed on
disk runs again and the log says which file changed. The learning curve is read back against
each checkpoint's own summary.

Kept cheap (one module-scoped sequence of runs, 2 tasks x 1 init state of 112 steps, the
learning curve as the target so that no per-checkpoint report is drawn)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import workflow_dir
from reference_checkpoint import write_reference_checkpoint
from test_workflow_e2e import Run, run_workflow

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "pytest_training_run"
# The scripted expert succeeds after 82-89 steps on tasks 0 and 2 (init state 0, through the
# workflow); 7 chunks of 16 let it finish, and leave the half-speed expert short of the goal.
MAX_STEPS = 112
FIRST = {"checkpoint-1000": ("hold", None), "checkpoint-2000": ("scripted", 2.0)}
FIRST["checkpoint-3000"] = ("scripted", None)
# added after the first run, before the others in step order (so every other checkpoint's
# entry moves): holding still again
LATER = "checkpoint-500"
ROLLOUT_JOB = re.compile(
    r"rule checkpoint_rollout:\n(?:[ \t]+.*\n)*?[ \t]+wildcards: checkpoint=([^,\s]+)"
)

pytestmark = [pytest.mark.workflow, pytest.mark.libero]


def rollouts_run(run: Run) -> list[str]:
    """The checkpoints whose rollout jobs Snakemake ran in `run` (its job log)."""
    return sorted(ROLLOUT_JOB.findall(run.stderr))


def episode_records(checkpoint_dir: Path) -> dict[str, tuple[int, str]]:
    """Each stored episode record of a checkpoint: (mtime_ns, sha256), by path."""
    return {
        str(p.relative_to(checkpoint_dir)): (
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted((checkpoint_dir / "episodes").rglob("*.json"))
    }


@dataclass
class TrainingRun:
    workdir: Path
    checkpoints: Path
    configfile: Path
    runs: dict[str, Run] = field(default_factory=dict)
    records: dict[str, dict[str, dict[str, tuple[int, str]]]] = field(default_factory=dict)

    @property
    def results(self) -> Path:
        return self.workdir / "results" / RUN_ID

    @property
    def event_log(self) -> Path:
        return self.workdir / "logs" / RUN_ID / "eval_embodiment.log"

    def run(self, label: str) -> Run:
        run = run_workflow(self.workdir, self.configfile, "--", "learning_curve")
        assert run.returncode == 0, f"{label}: {run.stderr[-4000:]}"
        self.runs[label] = run
        self.records[label] = {
            d.name: episode_records(d) for d in (self.results / "checkpoints").iterdir()
        }
        return run


@pytest.fixture(scope="module")
def training_run(tmp_path_factory) -> TrainingRun:
    """Three checkpoints evaluated together ("first"); a fourth added ("added"); the hold
    checkpoint's file edited ("changed"). Each a real Snakemake run in one working directory."""
    root = tmp_path_factory.mktemp("training_run")
    checkpoints = root / "runs" / "reference"
    for name, (policy, slow) in FIRST.items():
        write_reference_checkpoint(checkpoints / name, policy, slow)
    configfile = root / "training.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "run_id": RUN_ID,
                "checkpoints": [str(checkpoints / "checkpoint-*")],
                "plan": {"task_ids": [0, 2], "num_trials_per_task": 1},
                "rollout": {"max_steps": MAX_STEPS, "envs_per_shard": 2},
            }
        )
    )
    training = TrainingRun(workflow_dir(root / "work"), checkpoints, configfile)
    training.run("first")
    write_reference_checkpoint(checkpoints / LATER, "hold")
    training.run("added")
    held = checkpoints / "checkpoint-1000" / "reference_checkpoint.yaml"
    held.write_text(held.read_text() + "# edited: the same policy, other bytes\n")
    training.run("changed")
    return training


def test_one_run_evaluates_every_checkpoint_on_the_same_episodes(training_run):
    first = training_run.runs["first"]
    assert rollouts_run(first) == sorted(FIRST)
    episodes = {
        name: pd.read_parquet(
            training_run.results / "checkpoints" / name / "summary" / "episodes.parquet"
        ).sort_values(["task_id", "init_state_id", "seed"])
        for name in FIRST
    }
    keys = ["suite", "task_id", "init_state_id", "seed", "episode_seed"]
    plans = [frame[keys].reset_index(drop=True) for frame in episodes.values()]
    for plan in plans[1:]:
        pd.testing.assert_frame_equal(plan, plans[0])
    assert len(plans[0]) == 2
    for name, frame in episodes.items():
        assert frame["error"].isna().all(), (name, frame["error"].tolist())
    # the checkpoints differ in quality: hold never succeeds, the expert always does
    success = {name: int(frame["success_once"].sum()) for name, frame in episodes.items()}
    assert success["checkpoint-1000"] == 0 and success["checkpoint-3000"] == 2
    assert success["checkpoint-2000"] < 2
    # each checkpoint's episodes are stored under its own fingerprint
    stores = {name: next(iter(training_run.records["first"][name])).split("/")[1] for name in FIRST}
    assert len(set(stores.values())) == 3


def test_a_checkpoint_added_later_runs_only_its_own_episodes(training_run):
    added = training_run.runs["added"]
    assert rollouts_run(added) == [LATER]
    before, after = training_run.records["first"], training_run.records["added"]
    for name in FIRST:
        assert after[name] == before[name], f"{name}'s episode records changed"
    assert len(after[LATER]) == 2
    # the run's log counts each invocation's rollout jobs: 3, then 1, then 1 (the changed one)
    launches = re.findall(r"(\d+) rollout job\(s\) to run", training_run.event_log.read_text())
    assert launches == ["3", "1", "1"]


def test_the_learning_curve_is_each_checkpoints_per_suite_csv(training_run):
    names = [LATER, *FIRST]
    curve_dir = training_run.results / "learning_curve"
    table = pd.read_csv(curve_dir / "learning_curve.csv")
    for name in names:
        own = pd.read_csv(training_run.results / "checkpoints" / name / "summary" / "per_suite.csv")
        rows = table[table["checkpoint"] == name][own.columns].reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, own, check_dtype=False)
    overall = table[table["suite"] == "all"]
    assert overall["checkpoint"].tolist() == names  # by step
    assert overall["step"].tolist() == [500, 1000, 2000, 3000]

    tests = pd.read_csv(curve_dir / "paired_tests.csv")
    pairs = tests[(tests["suite"] == "all") & (tests["metric"] == "success_once")]
    consecutive = pairs[pairs["kind"] == "consecutive"][["baseline", "candidate"]]
    assert consecutive.values.tolist() == [list(p) for p in zip(names, names[1:], strict=False)]
    assert (pairs["n_pairs"] == 2).all() and pairs["p_holm"].notna().all()
    # the best: the first of the two experts that succeed every time (the earlier wins a tie)
    markdown = (curve_dir / "learning_curve.md").read_text()
    assert "**Best checkpoint: `checkpoint-3000` (step 3000), success_once 100.0% [" in markdown
    assert "## Paired tests on the shared episodes" in markdown and "Holm-adjusted p" in markdown
    assert (curve_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    log = training_run.event_log.read_text()
    assert "Best checkpoint: `checkpoint-3000`" in log
    # ... and Snakemake prints the curve at the end, as it prints a single run's summary
    printed = training_run.runs["added"].stdout
    assert f"# Learning curve `{RUN_ID}`" in printed
    assert "**Best checkpoint: `checkpoint-3000` (step 3000)" in printed


def test_a_checkpoint_changed_on_disk_runs_again_and_the_log_says_which_file(training_run):
    changed = training_run.runs["changed"]
    assert rollouts_run(changed) == ["checkpoint-1000"]
    said = "checkpoint checkpoint-1000 changed on disk since its episodes ran: "
    assert said in changed.stderr
    assert "reference_checkpoint.yaml changed" in changed.stderr
    own_log = training_run.workdir / "logs" / RUN_ID / "checkpoints" / "checkpoint-1000"
    assert said in (own_log / "eval_embodiment.log").read_text()
    # its new episodes sit beside the old ones, under a new fingerprint; the others untouched
    before, after = training_run.records["added"], training_run.records["changed"]
    old = set(before["checkpoint-1000"])
    assert old < set(after["checkpoint-1000"]) and len(after["checkpoint-1000"]) == 4
    for name in (*FIRST, LATER):
        if name != "checkpoint-1000":
            assert after[name] == before[name]
