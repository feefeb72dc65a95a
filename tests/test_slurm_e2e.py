"""The default evaluation through profiles/slurm on a real one-node Slurm (CI runs it).

`.ci/slurm/run.sh` starts Slurm (`.ci/slurm/setup.sh`: slurm-wlm + munge on localhost), runs
the evaluation with shard000 made to fail once, lets `--retries` resubmit its slot job, and
checks the summary, the resume and that no Slurm job or process is left. The test cuts the
default evaluation to task 0 (2 episodes: one before the failure, one after the resubmission)
of 96 steps (the scripted expert needs 82-89 there; the rlinf protocol runs each episode to its
limit); the Slurm plugin's status checks back off (5 s, then 10 s longer each time), so each
slot job costs its run time plus up to a check interval, and a shorter job waits less.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(
        os.environ.get("LIBERO_EVAL_SLURM_E2E") != "1",
        reason="set LIBERO_EVAL_SLURM_E2E=1 where .ci/slurm/setup.sh may install and start "
        "a one-node Slurm (as root; .ci/run does)",
    ),
]


def test_default_evaluation_through_slurm_with_a_resubmitted_shard(tmp_path):
    run_id = "pytest_slurm"
    env = {**os.environ, "PYTHON": sys.executable, "RUN_ID": run_id}
    overlay = tmp_path / "task0.yaml"
    overlay.write_text("plan: {task_ids: [0]}\nrollout: {max_steps: 96}\n")
    configs = ["--configfile", "config/config.yaml", str(overlay)]
    try:
        result = subprocess.run(
            ["bash", ".ci/slurm/run.sh", *configs],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        output = result.stderr + result.stdout  # the script's own verdict last
        assert result.returncode == 0, output[-5000:]
        assert "Slurm end-to-end run passed" in output
        assert "| libero_spatial | (suite)" in output
    finally:
        shutil.rmtree(REPO / "results" / run_id, ignore_errors=True)
        shutil.rmtree(REPO / "logs" / run_id, ignore_errors=True)
