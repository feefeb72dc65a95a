"""benchmarks/sglang_server.py: the closed loop beside a load (`--beside`), with a real load
process whose rate is known."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import sglang_server  # noqa: E402

# A load as tools/gpu/env_load.py prints it: ready, then its chunks so far every 0.1 s; 10
# chunks a tick while a flag file is absent, 2 once it exists (the loop has ended).
LOAD = textwrap.dedent(
    """
    import json, os, sys, time
    flag = sys.argv[1]
    print(json.dumps({"load": "ready"}), flush=True)
    chunks, started = 0, time.time()
    while time.time() - started < float(sys.argv[2]):
        chunks += 2 if os.path.exists(flag) else 10
        print(json.dumps({"t": time.time(), "chunks": chunks}), flush=True)
        time.sleep(0.1)
    print(json.dumps({"done": chunks}), flush=True)
    """
)


def _load(tmp_path: Path, seconds: float) -> tuple[str, Path]:
    script, flag = tmp_path / "load.py", tmp_path / "loop_ended"
    script.write_text(LOAD, encoding="utf-8")
    return f"{sys.executable} {script} {flag} {seconds}", flag


def test_the_load_rate_is_taken_while_the_loop_runs_and_after(tmp_path):
    command, flag = _load(tmp_path, seconds=2.5)

    def loop() -> dict:
        time.sleep(1.0)
        flag.touch()
        return {"obs_per_s": 12.5}

    row = sglang_server.saturate_beside(command, loop, idle_s=10)
    assert row["obs_per_s"] == 12.5 and row["load"] == command
    assert row["load_chunks_per_s_saturated"] == pytest.approx(100, rel=0.3)
    assert row["load_chunks_per_s_idle"] == pytest.approx(20, rel=0.3)
    assert row["load_last_line"].startswith('{"done"')


def test_a_load_still_running_after_the_idle_window_is_stopped(tmp_path):
    command, flag = _load(tmp_path, seconds=600)
    row = sglang_server.saturate_beside(command, lambda: {"obs_per_s": 1.0}, idle_s=0.5)
    assert row["obs_per_s"] == 1.0
    procs = psutil.process_iter(["cmdline"])
    left = [p for p in procs if str(flag) in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_a_load_that_dies_before_it_is_ready_is_named(tmp_path):
    command = f"{sys.executable} -c 'raise SystemExit(3)'"
    with pytest.raises(RuntimeError, match="never got ready"):
        sglang_server.saturate_beside(command, lambda: {}, ready_timeout_s=30)
