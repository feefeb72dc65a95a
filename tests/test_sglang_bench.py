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

# A load as tools/gpu/env_load.py prints it: ready, then its chunks so far at each tick. Its
# chunks grow with time, 100 a second until a flag file exists (the loop has ended), 20 after,
# so its rate does not depend on how often a loaded machine lets it tick. It counts its ticks
# in a file, and ends 5 ticks after the flag (with `forever`, never).
LOAD = textwrap.dedent(
    """
    import json, os, sys, time
    flag, ticks_file, forever = sys.argv[1], sys.argv[2], sys.argv[3] == "forever"
    print(json.dumps({"load": "ready"}), flush=True)
    chunks, last, ticks, after = 0.0, time.time(), 0, 0
    while forever or after < 5:
        time.sleep(0.05)
        now = time.time()
        ended = os.path.exists(flag)
        chunks += (20 if ended else 100) * (now - last)
        last, ticks, after = now, ticks + 1, after + ended
        print(json.dumps({"t": now, "chunks": chunks}), flush=True)
        with open(ticks_file, "w") as out:
            out.write(str(ticks))
    print(json.dumps({"done": round(chunks)}), flush=True)
    """
)


def _load(tmp_path: Path, forever: bool = False) -> tuple[str, Path, Path]:
    script, flag, ticks = tmp_path / "load.py", tmp_path / "loop_ended", tmp_path / "ticks"
    script.write_text(LOAD, encoding="utf-8")
    mode = "forever" if forever else "ends"
    return f"{sys.executable} {script} {flag} {ticks} {mode}", flag, ticks


def _ticks(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except FileNotFoundError:
        return 0


def test_the_load_rate_is_taken_while_the_loop_runs_and_after(tmp_path):
    command, flag, ticks = _load(tmp_path)

    def loop() -> dict:  # the closed loop's stand-in: runs while the load ticks 5 times
        first = _ticks(ticks)
        while _ticks(ticks) < first + 5:
            time.sleep(0.02)
        flag.touch()
        return {"obs_per_s": 12.5}

    row = sglang_server.saturate_beside(command, loop, idle_s=600)
    assert row["obs_per_s"] == 12.5 and row["load"] == command
    assert row["load_chunks_per_s_saturated"] == pytest.approx(100, rel=0.1)
    assert row["load_chunks_per_s_idle"] == pytest.approx(20, rel=0.1)
    assert row["load_last_line"].startswith('{"done"')


def test_a_load_still_running_after_the_idle_window_is_stopped(tmp_path):
    command, flag, _ = _load(tmp_path, forever=True)
    row = sglang_server.saturate_beside(command, lambda: {"obs_per_s": 1.0}, idle_s=0.5)
    assert row["obs_per_s"] == 1.0
    procs = psutil.process_iter(["cmdline"])
    left = [p for p in procs if str(flag) in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_a_load_that_dies_before_it_is_ready_is_named(tmp_path):
    command = f"{sys.executable} -c 'raise SystemExit(3)'"
    with pytest.raises(RuntimeError, match="never got ready"):
        sglang_server.saturate_beside(command, lambda: {}, ready_timeout_s=30)
