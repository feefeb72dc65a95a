"""`libero-eval watch`: a training run's checkpoints are evaluated once complete, all of them
in one workflow run at a time, again only when something changed, and the training run's
directory is never written. The clock is injected (the files' age), and the workflow runner
records what it was asked to run: what is tested is the watcher's decisions."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reference_checkpoint import write_reference_checkpoint

from libero_eval import cli
from libero_eval.watch import OVERLAY, Watcher, snakemake_runner, watch

HOUR = 3600.0


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
    }


class Runs:
    """A `Watcher.run` that records each call and answers `code`."""

    def __init__(self, code: int = 0):
        self.calls: list[list[str]] = []
        self.code = code

    def __call__(self, paths: list[str]) -> int:
        self.calls.append([Path(p).name for p in paths])
        return self.code


def test_complete_checkpoints_are_evaluated_together_then_only_on_a_change(tmp_path):
    run = tmp_path / "run"
    write_reference_checkpoint(run / "checkpoint-100", "hold")
    write_reference_checkpoint(run / "checkpoint-200")
    (run / "checkpoint-300").mkdir()  # being written: no file yet
    (run / ".tmp-checkpoint-400").mkdir()  # a trainer's temporary directory: never seen
    now = [time.time()]
    runs = Runs()
    watcher = Watcher(run, runs, stable_s=60, clock=lambda: now[0], say=lambda _: None)
    before = listing(run)

    # files just written: not complete yet
    assert watcher.poll() is None and runs.calls == []
    now[0] += HOUR  # an hour later nothing changed: both complete, one evaluation
    assert watcher.poll() == 0
    assert runs.calls == [["checkpoint-100", "checkpoint-200"]]
    assert watcher.poll() is None  # nothing new: nothing runs

    write_reference_checkpoint(run / "checkpoint-300", "scripted", slow=2.0)
    now[0] = time.time()
    assert watcher.poll() is None  # the new one is too fresh
    now[0] += HOUR
    assert watcher.poll() == 0
    assert runs.calls[-1] == ["checkpoint-100", "checkpoint-200", "checkpoint-300"]

    stats = run / "checkpoint-300" / "action_stats.json"
    stats.write_text(stats.read_text() + "\n")
    now[0] = time.time() + HOUR
    assert watcher.poll() == 0 and len(runs.calls) == 3  # a changed checkpoint runs again
    # the watcher wrote nothing where the training run writes
    after = listing(run)
    assert set(after) == set(before) | {
        "checkpoint-300/action_stats.json",
        "checkpoint-300/reference_checkpoint.yaml",
    }
    assert {k: v for k, v in after.items() if k in before and "300" not in k} == {
        k: v for k, v in before.items() if "300" not in k
    }


def test_a_marker_file_holds_a_checkpoint_back_until_it_exists(tmp_path):
    run = tmp_path / "run"
    write_reference_checkpoint(run / "checkpoint-100")
    runs = Runs()
    later = time.time() + HOUR
    watcher = Watcher(run, runs, stable_s=60, marker="trainer_state.json", clock=lambda: later)
    assert watcher.poll() is None
    (run / "checkpoint-100" / "trainer_state.json").write_text('{"global_step": 100}')
    assert watcher.poll() == 0 and runs.calls == [["checkpoint-100"]]


def test_a_failed_evaluation_is_said_and_tried_again_on_the_next_change(tmp_path):
    run = tmp_path / "run"
    write_reference_checkpoint(run / "checkpoint-100")
    said: list[str] = []
    runs = Runs(code=1)
    later = [time.time() + HOUR]
    watcher = Watcher(run, runs, stable_s=60, clock=lambda: later[0], say=said.append)
    assert watch(watcher, poll_s=0, once=True) == 1
    assert "the workflow failed (exit code 1)" in said[-1]
    assert watcher.poll() is None  # not again and again while nothing changes
    runs.code = 0
    write_reference_checkpoint(run / "checkpoint-200")
    later[0] = time.time() + HOUR
    assert watcher.poll() == 0 and runs.calls[-1] == ["checkpoint-100", "checkpoint-200"]


def test_the_runner_lists_the_checkpoints_in_an_overlay_and_runs_snakemake(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr("subprocess.call", lambda command: calls.append(command) or 0)
    run = snakemake_runner(["my.yaml"], "4", ["--resources", "gpu=8"])
    assert run(["runs/x/checkpoint-1"]) == 0
    (command,) = calls
    assert command[1:5] == ["-m", "snakemake", "--cores", "4"]
    assert command[5:8] == ["--configfile", "my.yaml", str(OVERLAY)]
    assert command[-2:] == ["--resources", "gpu=8"]
    assert f"- {os.path.abspath('runs/x/checkpoint-1')}" in OVERLAY.read_text()


def test_the_command_refuses_a_missing_directory_or_config(tmp_path, capsys):
    assert cli.main(["watch", str(tmp_path / "nope"), "--configfile", "x.yaml"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert cli.main(["watch", str(tmp_path), "--configfile", str(tmp_path / "x.yaml")]) == 2
    assert "--configfile" in capsys.readouterr().err
