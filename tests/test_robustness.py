"""The robustness report: perturbation suites against their clean suite, paired where they
correspond; and perturbed suites loaded and stepped for real through the whole workflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import workflow_dir
from PIL import Image

from libero_eval.analysis.robustness import robustness, robustness_markdown
from libero_eval.report.robustness import write_robustness
from libero_eval.store import RESULT_COLUMNS

REPO = Path(__file__).resolve().parents[1]


def rows(suite: str, outcomes: dict[tuple[int, int], bool]) -> list[dict]:
    """Result rows (every column) of one suite with success per (task, init state)."""
    return [
        {
            **{column: None for column in RESULT_COLUMNS},
            "run_id": "robust",
            "suite": suite,
            "task_id": task_id,
            "task_language": f"{suite} task {task_id}",
            "init_state_id": init_state_id,
            "seed": 1140,
            "protocol": "cosmos",
            "success_once": success,
            "success_at_end": success,
            "steps": 100,
            "error": None,
        }
        for (task_id, init_state_id), success in sorted(outcomes.items())
    ]


def synthetic_run() -> pd.DataFrame:
    """Clean libero_spatial succeeds everywhere on tasks 0-1 x init states 0-9; the swap suite
    loses 6 of task 0's episodes and none of task 1's; the _task suite (a different task) and
    with_milk (its own tasks and init states) cannot pair."""
    clean = {(t, i): True for t in (0, 1) for i in range(10)}
    swap = {(0, i): i >= 6 for i in range(10)} | {(1, i): True for i in range(10)}
    other_task = {(0, i): i < 2 for i in range(10)}
    milk = {(0, i): i < 5 for i in range(10)}
    frame = pd.DataFrame(
        rows("libero_spatial", clean)
        + rows("libero_spatial_swap", swap)
        + rows("libero_spatial_task", other_task)
        + rows("libero_spatial_with_milk", milk),
        columns=RESULT_COLUMNS,
    )
    return frame.drop(columns="base_suite")


def test_paired_where_tasks_and_init_states_correspond_unpaired_with_reasons_elsewhere(tmp_path):
    result = robustness(synthetic_run(), n_resamples=2000)
    table = result.table
    swap = table[table["suite"] == "libero_spatial_swap"].set_index("level", drop=False)
    overall = swap.loc["overall"]
    assert bool(overall["paired"])
    assert overall["n_perturbed"] == 20
    assert overall["difference"] == pytest.approx(-0.3)
    assert (overall["gained"], overall["lost"]) == (0, 6)
    assert overall["mcnemar_p"] == pytest.approx(2 * 0.5**6)  # exact binomial, 0 of 6
    assert overall["difference_ci_high"] < 0
    swap_tasks = table[(table["suite"] == "libero_spatial_swap") & (table["level"] == "task")]
    assert swap_tasks["difference"].tolist() == pytest.approx([-0.6, 0.0])
    assert swap_tasks["base_suite"].eq("libero_spatial").all()

    other = table[table["suite"] == "libero_spatial_task"]
    assert not other["paired"].any()
    assert "different task" in other["note"].iloc[0]
    task_row = other[other["level"] == "task"].iloc[0]
    assert task_row["perturbed_rate"] == pytest.approx(0.2)
    assert task_row["perturbed_ci_low"] < 0.2 < task_row["perturbed_ci_high"]  # Wilson
    assert task_row["clean_rate"] == pytest.approx(1.0)
    milk = table[(table["suite"] == "libero_spatial_with_milk") & (table["level"] == "task")]
    assert "no task of the clean suite" in milk["note"].iloc[0]
    assert "compared with all of libero_spatial" in milk["note"].iloc[0]

    markdown = robustness_markdown(result)
    assert "| libero_spatial_swap | object positions swapped | all | paired |" in markdown
    assert "+0 / -6" in markdown
    outputs = {
        key: tmp_path / f"robustness.{ext}"
        for key, ext in (("figure", "png"), ("html", "html"), ("markdown", "md"), ("csv", "csv"))
    }
    write_robustness(result, outputs)
    assert Image.open(outputs["figure"]).size[0] > 300
    assert "libero_spatial_task" in outputs["html"].read_text()
    assert len(pd.read_csv(outputs["csv"])) == len(table)


def test_without_the_clean_suite_everything_is_unpaired_and_says_why():
    run = synthetic_run()
    result = robustness(run[run["suite"] != "libero_spatial"])
    assert not result.table["paired"].any()
    assert (
        result.table["note"].str.contains("the clean suite libero_spatial is not in this run").any()
    )
    # Clean task 1 missing: the swap suite's task 1 cannot pair, its task 0 still does.
    partial = run[~((run["suite"] == "libero_spatial") & (run["task_id"] == 1))]
    swap = robustness(partial).table.query("suite == 'libero_spatial_swap' and level == 'task'")
    assert swap["paired"].tolist() == [True, False]
    assert "its clean task 1 is not in this run" in swap["note"].iloc[1]


@pytest.mark.workflow
@pytest.mark.libero
def test_swap_and_distractor_suites_run_end_to_end_with_the_robustness_report(tmp_path):
    """Real LIBERO episodes of libero_spatial, its _swap and _with_mug variants (task 0, init
    state 0, the scripted expert under protocol cosmos), then the robustness report."""
    run_id = f"pytest_robust_{tmp_path.name}"
    configfile = tmp_path / "config.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "run_id": run_id,
                "plan": {
                    "suites": ["libero_spatial", "libero_spatial_swap", "libero_spatial_with_mug"],
                    "task_ids": [0],
                    "num_trials_per_task": 1,
                },
                "rollout": {"protocol": "cosmos", "max_steps": None, "envs_per_shard": 2},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", str(configfile)],
        cwd=workflow_dir(tmp_path / "work"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = tmp_path / "work" / "results" / run_id
    episodes = pd.read_parquet(results / "summary" / "episodes.parquet")
    assert episodes["error"].isna().all(), episodes["error"].tolist()
    assert set(episodes["suite"]) == {
        "libero_spatial",
        "libero_spatial_swap",
        "libero_spatial_with_mug",
    }
    assert episodes["base_suite"].eq("libero_spatial").all()
    assert episodes["success_once"].all(), episodes[["suite", "steps"]].to_dict("records")
    report = results / "report"
    assert (report / "robustness.png").stat().st_size > 0
    table = pd.read_csv(report / "robustness.csv")
    assert set(table["suite"]) == {"libero_spatial_swap", "libero_spatial_with_mug"}
    assert table["paired"].all()
