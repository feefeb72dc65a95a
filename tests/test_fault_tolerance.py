"""Fault injection: whatever dies mid-run, a rerun finishes the evaluation and loses nothing.

Every test runs the real workflow (Snakemake, the reference policy server, LIBERO env workers)
in its own working directory, injects one fault, checks that no process of the run is left,
reruns, and compares the final result with an uninterrupted run's. Each prints a line:

    FAULT <name>: finished before fault F, lost L (in flight I), rerun R, aggregate equal True

`lost` counts episodes whose durable record disappeared or was rewritten by the rerun; only
the episodes in flight at the fault may be run again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from conftest import SUMMARY_LINE

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
KEYS = ["suite", "task_id", "init_state_id"]
DETERMINISTIC = [*KEYS, "success_once", "success_at_end", "first_success_step", "steps"]
NUM_EPISODES = 6  # 2 tasks x 3 init states
SUMMARY_FILES = ("episodes.parquet", "summary.parquet")

pytestmark = [pytest.mark.workflow, pytest.mark.libero]


# ----------------------------------------------------------------------------- helpers


def make_workdir(path: Path) -> Path:
    """A private working directory (own .snakemake/, results/, logs/) using the repo's workflow."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "config", "profiles"):
        (path / name).symlink_to(REPO / name)
    return path


def write_config(workdir: Path, run_id: str, **rollout: object) -> Path:
    config = {
        "run_id": run_id,
        "plan": {"task_ids": [0, 1], "num_trials_per_task": 3},
        "server": {
            "reference": {"policy": "hold", "latency_fixed_s": 0.05},
            "teardown_grace_s": 3,
        },
        "rollout": {
            "failures": {"request_retries": 2, "retry_backoff_s": 0.2, "request_timeout_s": 20},
            "send_privileged_state": False,
            "max_steps": 16,
            "camera_size": 64,
            "envs_per_shard": 2,
            **rollout,
        },
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Run:
    """One snakemake invocation and every process that descended from it while it ran."""

    workdir: Path
    proc: subprocess.Popen
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create_time
    stdout: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> None:
        root = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                for child in root.children(recursive=True):
                    self.seen.setdefault(child.pid, child.create_time())
            except psutil.Error:
                pass
            time.sleep(0.1)

    def wait(self, timeout: float = 600) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        self.stdout = out
        self._stop.set()
        return self.proc.returncode


def start_snakemake(workdir: Path, configfile: Path, *extra: str, env: dict | None = None) -> Run:
    """Start snakemake in its own process group (so a signal can target it alone).

    The target is the aggregate's summary (the evaluation proper), not the report figures.
    """
    run_id = yaml.safe_load(configfile.read_text())["run_id"]
    targets = [f"results/{run_id}/summary/{name}" for name in SUMMARY_FILES]
    proc = subprocess.Popen(
        [*SNAKEMAKE, *targets, "--cores", "2", *extra, "--configfile", str(configfile)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    run = Run(workdir, proc)
    threading.Thread(target=run.watch, daemon=True).start()
    return run


def snakemake(workdir: Path, configfile: Path, *extra: str, env: dict | None = None) -> Run:
    run = start_snakemake(workdir, configfile, *extra, env=env)
    run.wait()
    return run


def leftovers(run: Run) -> list[str]:
    """Live processes of the run: descendants seen while it ran, or anything working in its
    directory (servers, shards, env workers all inherit it)."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            ours = run.seen.get(proc.pid) == proc.info["create_time"]
            if ours or proc.cwd() == str(run.workdir):
                found.append(f"{proc.pid} {proc.info['name']} {' '.join(proc.info['cmdline'])}")
        except psutil.Error:
            continue
    return found


def assert_no_orphans(run: Run, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while (left := leftovers(run)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, "processes left behind:\n" + "\n".join(left)


def store_records(workdir: Path, run_id: str) -> dict[tuple, dict]:
    """The durable episode records of a run, keyed by (suite, task, init)."""
    records = {}
    for path in (workdir / "results" / run_id / "episodes").rglob("*.json"):
        record = json.loads(path.read_text())
        records[(record["suite"], record["task_id"], record["init_state_id"])] = record
    return records


def wait_for_records(workdir: Path, run_id: str, count: int, run: Run, timeout_s: float = 300):
    deadline = time.monotonic() + timeout_s
    while len(store_records(workdir, run_id)) < count:
        assert run.proc.poll() is None, f"run ended before {count} episodes:\n{run.stdout}"
        assert time.monotonic() < deadline, f"fewer than {count} episodes after {timeout_s} s"
        time.sleep(0.1)


def deterministic(workdir: Path, run_id: str) -> pd.DataFrame:
    frame = pd.read_parquet(workdir / "results" / run_id / "summary" / "episodes.parquet")
    return frame[DETERMINISTIC].sort_values(KEYS, ignore_index=True)


def summary_table(workdir: Path, run_id: str) -> pd.DataFrame:
    return pd.read_parquet(workdir / "results" / run_id / "summary" / "summary.parquet")


@dataclass
class Figures:
    name: str
    before: int  # episodes finished when the fault hit
    stopping: int  # episodes that finished after the fault, before the run ended
    lost: int  # finished episodes whose record vanished or was redone by the rerun
    rerun: int  # episodes the rerun ran (those unfinished when the run ended)
    equal: bool  # final tables equal the uninterrupted run's

    def line(self) -> str:
        return (
            f"FAULT {self.name}: finished before fault {self.before} (+{self.stopping} while "
            f"stopping), lost {self.lost}, rerun {self.rerun}, aggregate equal {self.equal}"
        )


def figures(
    name: str,
    before: dict[tuple, dict],
    ended: dict[tuple, dict],
    after: dict[tuple, dict],
    equal: bool,
) -> Figures:
    """`before`: store at the fault; `ended`: when the faulty run ended; `after`: rerun done."""
    finished = {key: r for key, r in ended.items() if r.get("error") is None}
    lost = sum(1 for key, r in finished.items() if after.get(key) != r)
    rerun = sum(1 for key, r in after.items() if ended.get(key) != r)
    done_before = sum(1 for r in before.values() if r.get("error") is None)
    return Figures(name, done_before, len(ended) - len(before), lost, rerun, equal)


@pytest.fixture
def report(record_property) -> Callable[[Figures], None]:
    """Records a test's figures line; tests/conftest.py prints it at the end of the run."""
    return lambda figures: record_property(SUMMARY_LINE, figures.line())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[pd.DataFrame, pd.DataFrame]:
    """An uninterrupted run (the success exit path): its episodes and summary tables."""
    workdir = make_workdir(tmp_path_factory.mktemp("baseline"))
    configfile = write_config(workdir, "ft_baseline")
    run = snakemake(workdir, configfile)
    assert run.proc.returncode == 0, run.stdout
    assert_no_orphans(run)
    frame = deterministic(workdir, "ft_baseline")
    assert len(frame) == NUM_EPISODES
    return frame, summary_table(workdir, "ft_baseline")


def finish_and_compare(
    workdir: Path, configfile: Path, run_id: str, baseline, *extra: str
) -> tuple[Run, bool]:
    rerun = snakemake(workdir, configfile, *extra)
    assert rerun.proc.returncode == 0, rerun.stdout
    assert_no_orphans(rerun)
    episodes, table = baseline
    got = deterministic(workdir, run_id)
    pd.testing.assert_frame_equal(got, episodes)
    pd.testing.assert_frame_equal(summary_table(workdir, run_id), table)
    return rerun, True


# ----------------------------------------------------------------------------- the faults


def test_killed_shard_resumes_from_its_finished_episodes(tmp_path, baseline, report):
    workdir = make_workdir(tmp_path / "wd")
    configfile = write_config(workdir, "ft_shard")
    first = snakemake(workdir, configfile, env={"LIBERO_EVAL_FAULT": "exit_shard_after_episodes=2"})
    assert first.proc.returncode != 0
    assert_no_orphans(first)
    before = store_records(workdir, "ft_shard")
    assert len(before) == 2
    assert not (workdir / "results/ft_shard/shards/shard000.parquet").exists()

    _, equal = finish_and_compare(workdir, configfile, "ft_shard", baseline)
    after = store_records(workdir, "ft_shard")
    result = figures("kill shard (SIGKILL)", before, before, after, equal)
    report(result)
    assert result.lost == 0
    assert result.rerun == NUM_EPISODES - len(before)


def test_killed_server_fails_the_shard_clearly_and_a_rerun_resumes(tmp_path, baseline, report):
    workdir = make_workdir(tmp_path / "wd")
    configfile = write_config(workdir, "ft_server")
    run = start_snakemake(workdir, configfile)
    wait_for_records(workdir, "ft_server", 2, run)
    service = json.loads((workdir / "results/ft_server/servers/slot0.json").read_text())
    os.kill(service["pid"], signal.SIGKILL)
    before = store_records(workdir, "ft_server")
    assert run.wait() != 0
    assert_no_orphans(run)
    shard_log = (workdir / "logs/ft_server/rollout/shard000.log").read_text()
    assert "policy server http://127.0.0.1:" in shard_log
    assert "rerun the workflow to resume" in shard_log
    during = store_records(workdir, "ft_server")
    assert len(during) < NUM_EPISODES

    _, equal = finish_and_compare(workdir, configfile, "ft_server", baseline)
    after = store_records(workdir, "ft_server")
    result = figures("kill server (SIGKILL)", before, during, after, equal)
    report(result)
    assert result.lost == 0
    assert result.rerun == NUM_EPISODES - len(during)


@pytest.mark.parametrize("whole_group", [False, True], ids=["snakemake", "whole-run"])
def test_kill_9_leaves_no_process_and_rerun_incomplete_resumes(
    tmp_path, baseline, report, whole_group
):
    """SIGKILL to snakemake alone (its jobs must follow it), or to its whole process group
    (snakemake, launcher, shard, env workers; the server has its own and follows its launcher)."""
    workdir = make_workdir(tmp_path / "wd")
    configfile = write_config(workdir, "ft_kill9")
    run = start_snakemake(workdir, configfile)
    wait_for_records(workdir, "ft_kill9", 2, run)
    if whole_group:
        os.killpg(run.proc.pid, signal.SIGKILL)
    else:
        run.proc.kill()
    before = store_records(workdir, "ft_kill9")
    run.wait()
    assert_no_orphans(run)
    during = store_records(workdir, "ft_kill9")

    # The documented recovery: release the stale lock, then rerun what was incomplete.
    unlock = snakemake(workdir, configfile, "--unlock")
    assert unlock.proc.returncode == 0, unlock.stdout
    _, equal = finish_and_compare(workdir, configfile, "ft_kill9", baseline, "--rerun-incomplete")
    after = store_records(workdir, "ft_kill9")
    name = "kill -9 whole run (process group)" if whole_group else "kill -9 snakemake"
    result = figures(name, before, during, after, equal)
    report(result)
    assert result.lost == 0
    assert result.rerun == NUM_EPISODES - len(during)


@pytest.mark.parametrize(
    ("exit_path", "signum", "group"),
    [
        ("Ctrl-C", signal.SIGINT, True),
        ("SIGTERM", signal.SIGTERM, False),
        ("SIGINT", signal.SIGINT, False),
    ],
)
def test_interrupted_run_stops_at_once_leaves_no_process_and_resumes(
    tmp_path, baseline, report, exit_path, signum, group
):
    """Ctrl-C reaches snakemake's whole process group (as a terminal sends it); a SIGTERM or
    SIGINT to snakemake alone (kill, a batch system, a parent script) is passed on to its jobs
    (libero_eval.interrupt). Either way the shard stops at once: no episode starts after the
    signal, only those in flight may finish, and the run says it was interrupted."""
    workdir = make_workdir(tmp_path / "wd")
    run_id = f"ft_{exit_path.lower().replace('-', '')}"
    configfile = write_config(workdir, run_id)
    run = start_snakemake(workdir, configfile)
    wait_for_records(workdir, run_id, 2, run)
    if group:
        os.killpg(run.proc.pid, signum)
    else:
        run.proc.send_signal(signum)
    before = store_records(workdir, run_id)
    assert run.wait() != 0
    assert_no_orphans(run)
    during = store_records(workdir, run_id)
    envs = 2  # write_config's rollout.envs_per_shard: the episodes in flight at the signal
    assert len(during) <= len(before) + envs < NUM_EPISODES, "the shard ran on"
    name = signal.Signals(signum).name
    assert f"Interrupted by {name}, not failed" in run.stdout
    shard_log = (workdir / f"logs/{run_id}/rollout/shard000.log").read_text()
    assert "stopped (interrupted, not failed): received" in shard_log

    _, equal = finish_and_compare(workdir, configfile, run_id, baseline)
    after = store_records(workdir, run_id)
    result = figures(exit_path, before, during, after, equal)
    report(result)
    assert result.lost == 0
    assert result.rerun == NUM_EPISODES - len(during)


def test_failed_shard_is_resubmitted_by_retries_and_resumes(tmp_path, baseline, report):
    """`--retries 1`: the shard fails once after its first episode, Snakemake reruns its group
    (attempt 2, with attempt-scaled resources) and the shard resumes from the store."""
    workdir = make_workdir(tmp_path / "wd")
    configfile = write_config(workdir, "ft_retry")
    marker = tmp_path / "failed_once"
    run = snakemake(
        workdir,
        configfile,
        "--retries",
        "1",
        env={"LIBERO_EVAL_FAULT": f"fail_shard_once=shard000:{marker}"},
    )
    assert run.proc.returncode == 0, run.stdout
    assert marker.exists()
    assert_no_orphans(run)
    events = (workdir / "logs/ft_retry/eval_embodiment.log").read_text()
    assert "shard000: injected failure (fail_shard_once" in events
    assert "(5 to run, 1 already finished" in events
    episodes, table = baseline
    pd.testing.assert_frame_equal(deterministic(workdir, "ft_retry"), episodes)
    pd.testing.assert_frame_equal(summary_table(workdir, "ft_retry"), table)
    report(Figures("fail shard once + --retries", 1, 0, 0, NUM_EPISODES - 1, True))


def test_episode_failures_are_recorded_and_a_forced_rerun_redoes_only_them(
    tmp_path, baseline, report
):
    """A crashed env worker is restarted and its episode retried; an env that raises and a
    NaN action are recorded as errors; the group succeeds. `--forcerun rollout` then reruns
    only the errored episodes."""
    workdir = make_workdir(tmp_path / "wd")
    configfile = write_config(workdir, "ft_episode")
    run = snakemake(
        workdir,
        configfile,
        env={
            "LIBERO_EVAL_FAULT": "crash_env_at_episode=1;raise_env_at_episode=3;"
            "nan_action_at_episode=4"
        },
    )
    assert run.proc.returncode == 0, run.stdout
    assert_no_orphans(run)
    frame = pd.read_parquet(workdir / "results/ft_episode/summary/episodes.parquet")
    errors = frame["error"].dropna().tolist()
    assert len(errors) == 2, errors
    assert any("injected env error" in e for e in errors)
    assert any("policy chunk must be finite" in e for e in errors)
    shard_log = (workdir / "logs/ft_episode/rollout/shard000.log").read_text()
    assert "env worker process died (exit code -9); retrying" in shard_log
    table = summary_table(workdir, "ft_episode")
    assert int(table.loc[table["level"] == "overall", "num_errors"].iloc[0]) == 2
    before = store_records(workdir, "ft_episode")

    _, equal = finish_and_compare(
        workdir, configfile, "ft_episode", baseline, "--forcerun", "rollout"
    )
    after = store_records(workdir, "ft_episode")
    result = figures("episode errors (env crash/raise, NaN)", before, before, after, equal)
    report(result)
    assert result.lost == 0
    assert result.rerun == 2


def test_a_full_disk_names_the_record_path_keeps_what_was_written_and_resumes(
    tmp_path, baseline, report
):
    """After 2 records the store's disk is full (the kernel's own ENOSPC: its temporary files
    are /dev/full). The shard fails naming the record it could not write and the fix, with no
    traceback; the 2 records stay intact, and a rerun once there is space finishes the run."""
    workdir = make_workdir(tmp_path / "wd")
    configfile = write_config(workdir, "ft_disk_full")
    first = snakemake(workdir, configfile, env={"LIBERO_EVAL_FAULT": "disk_full_after_episodes=2"})
    assert first.proc.returncode != 0
    assert_no_orphans(first)
    before = store_records(workdir, "ft_disk_full")
    assert len(before) == 2
    shard_log = (workdir / "logs/ft_disk_full/rollout/shard000.log").read_text()
    store = next((workdir / "results/ft_disk_full/episodes").iterdir()).relative_to(workdir)
    assert f"No space left on device: cannot write {store}/libero_spatial/task" in shard_log
    assert f"Free space on the disk that holds {store}/libero_spatial (df -h" in shard_log
    assert "Traceback" not in shard_log
    assert (
        "FAILED: [Errno 28] No space left on device: cannot write"
        in (workdir / "logs/ft_disk_full/eval_embodiment.log").read_text()
    )

    _, equal = finish_and_compare(workdir, configfile, "ft_disk_full", baseline)
    after = store_records(workdir, "ft_disk_full")
    result = figures("disk full (ENOSPC) after 2 records", before, before, after, equal)
    report(result)
    assert result.lost == 0
    assert result.rerun == NUM_EPISODES - len(before)
