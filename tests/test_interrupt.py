"""A TERM or INT to the workflow's process alone is passed on to its jobs
(`libero_eval.interrupt`), then to the handler it replaced (Snakemake's); the end-to-end case,
on real Snakemake and LIBERO, is `tests/test_fault_tolerance.py`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, signal, subprocess, sys
from libero_eval.interrupt import StopJobsOnSignal

called = []
# Python's own SIGINT handler, also where this process started with SIGINT ignored (a job a
# non-interactive shell put in the background, where Python installs none)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, lambda signum, frame: called.append("replaced handler"))
job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
stop = StopJobsOnSignal().install()
try:
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
except KeyboardInterrupt:  # Python's own SIGINT handler, the one replaced
    called.append("KeyboardInterrupt")
job.wait(timeout=60)  # the job got SIGTERM: it ends now, not in 120 s
print(json.dumps({"job": job.returncode, "called": called, "explain": stop.explain("STORE")}))
"""


@pytest.mark.parametrize(
    ("name", "replaced"), [("SIGTERM", "replaced handler"), ("SIGINT", "KeyboardInterrupt")]
)
def test_a_stop_signal_stops_the_child_jobs_then_reaches_the_replaced_handler(name, replaced):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, name], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["job"] == -15  # SIGTERM
    assert result["called"] == [replaced]
    assert result["explain"].startswith(f"Interrupted by {name}, not failed")
    assert "kept in STORE" in result["explain"]
    assert f"{name}: stopping the 1 running job(s) now" in done.stderr


def test_nothing_to_explain_without_a_stop_signal():
    from libero_eval.interrupt import StopJobsOnSignal

    assert StopJobsOnSignal().explain("STORE") is None
