"""Which config a run gets, through the real `snakemake`: the README's demo command (no
--configfile) runs the demo, config/config.yaml; a user's `--configfile mine.yaml` starts from
the schema's defaults (config/README.md), not the demo's plan, which Snakemake would overlay it
on if the Snakefile loaded the demo unconditionally."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import workflow_dir

pytestmark = pytest.mark.workflow


def plan_of(work: Path, run_id: str, *args: str) -> pd.DataFrame:
    """Run only the plan rule of run `run_id` (as these arguments configure it); its plan."""
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", f"results/{run_id}/plan.csv", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return pd.read_csv(work / "results" / run_id / "plan.csv")


@pytest.mark.parametrize(
    "run_id, args", [("demo", ()), ("renamed", ("--config", "run_id=renamed"))]
)
def test_the_demo_command_plans_the_demo(tmp_path, run_id, args):
    """No --configfile (--config alone overlays the demo, as .ci/slurm/run.sh runs it)."""
    plan = plan_of(workflow_dir(tmp_path), run_id, *args)
    assert len(plan) == 4 and set(plan["suite"]) == {"libero_spatial"}
    assert set(plan["task_id"]) == {0, 1} and set(plan["init_state_id"]) == {0, 1}


def test_a_config_of_ones_own_starts_from_the_schema_defaults(tmp_path):
    """`plan: {suites: [libero_object]}` alone planned the demo's 2 tasks x 2 init states."""
    work = workflow_dir(tmp_path)
    (work / "mine.yaml").write_text("run_id: mine\nplan: {suites: [libero_object]}\n")
    plan = plan_of(work, "mine", "--configfile", "mine.yaml")
    assert set(plan["suite"]) == {"libero_object"}
    assert len(plan) == 10 * 50  # task_ids: all, num_trials_per_task: 50 (the schema's)
    assert set(plan["task_id"]) == set(range(10)) and set(plan["init_state_id"]) == set(range(50))


def test_the_demo_named_first_is_overlaid_by_ones_own(tmp_path):
    """The documented way to start from the demo: `--configfile config/config.yaml mine.yaml`."""
    work = workflow_dir(tmp_path)
    (work / "mine.yaml").write_text("run_id: both\nplan: {suites: [libero_object]}\n")
    plan = plan_of(work, "both", "--configfile", "config/config.yaml", "mine.yaml")
    assert len(plan) == 4 and set(plan["suite"]) == {"libero_object"}
    assert set(plan["task_id"]) == {0, 1}
