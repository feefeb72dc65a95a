"""The learning curve of a training run from its checkpoints' summaries: the rates are each
checkpoint's per_suite.csv, the paired tests are compare's on the shared episodes with Holm's
adjustment beside the raw p-values, and the best checkpoint is chosen as documented."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_record

from libero_eval.analysis.aggregate import write_summary
from libero_eval.analysis.compare import mcnemar_exact
from libero_eval.analysis.learning_curve import (
    CAVEAT,
    best_checkpoint,
    curve_markdown,
    holm,
    learning_curve,
    load_checkpoint,
)
from libero_eval.plan import Episode, make_shards, plan_table
from libero_eval.report.learning_curve import write_learning_curve
from libero_eval.store import write_results

EPISODES = [
    Episode(suite, t, i)
    for suite in ("libero_spatial", "libero_goal")
    for t in range(3)
    for i in range(4)
]


def test_holm_matches_the_step_down_procedure():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.5 times 4, 3, 2, 1 -> 0.04, 0.06, 0.06, 0.5
    assert holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    # made monotone, and capped at 1
    assert holm([0.3, 0.2, 0.01]) == pytest.approx([0.4, 0.4, 0.03])
    assert holm([0.6, 0.5]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    assert holm([0.2]) == [0.2]


def summarize(tmp_path, name: str, successes: set[Episode], step: int | None) -> dict:
    """A checkpoint's summary files as the workflow's aggregate step writes them."""
    out = tmp_path / name
    out.mkdir()
    records = [
        make_record(
            suite=e.suite,
            task_id=e.task_id,
            init_state_id=e.init_state_id,
            success_once=e in successes,
            success_at_end=e in successes and e.init_state_id != 0,
        )
        for e in EPISODES
    ]
    write_results(records, out / "shard000.parquet")
    plan_table(make_shards(EPISODES, 1, 1)).to_csv(out / "plan.csv", index=False)
    outputs = {
        key: out / file
        for key, file in {
            "episodes": "episodes.parquet",
            "per_task": "per_task.csv",
            "per_suite": "per_suite.csv",
            "per_seed": "per_seed.csv",
            "tables": "summary.parquet",
            "markdown": "summary.md",
        }.items()
    }
    write_summary([str(out / "shard000.parquet")], str(out / "plan.csv"), outputs, name)
    record = {"name": name, "step": step, "step_source": "entry", "sha256": "ab" * 32}
    (out / "checkpoint.json").write_text(json.dumps(record))
    return {key: str(path) for key, path in outputs.items()} | {
        "checkpoint": str(out / "checkpoint.json")
    }


@pytest.fixture
def run(tmp_path):
    """Three checkpoints: none, most and some of the episodes succeed."""
    plans = {
        "checkpoint-100": (set(), 100),
        "checkpoint-200": (set(EPISODES[:20]), 200),
        "checkpoint-300": (set(EPISODES[:12]), 300),
    }
    return {name: summarize(tmp_path, name, *plan) for name, plan in plans.items()}


def test_the_curve_is_each_checkpoints_per_suite_csv_and_the_tests_pair_episodes(tmp_path, run):
    names = list(run)
    outputs = {
        key: tmp_path / "curve" / f"out.{key}"
        for key in ("csv", "markdown", "paired", "html", "overview")
    }
    outputs["figure"] = tmp_path / "curve" / "learning_curve.png"
    summaries = {
        key: [run[n][key] for n in names]
        for key in ("per_suite", "episodes", "per_seed", "checkpoint")
    }
    curve = write_learning_curve("training", names, summaries, outputs, n_resamples=200)
    table = pd.read_csv(outputs["csv"])
    for name in names:
        own = pd.read_csv(run[name]["per_suite"])
        rows = table[table["checkpoint"] == name][own.columns].reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, own, check_dtype=False)
    assert table.loc[table["suite"] == "all", "step"].tolist() == [100, 200, 300]

    tests = pd.read_csv(outputs["paired"])
    overall = tests[(tests["suite"] == "all") & (tests["metric"] == "success_once")]
    consecutive = overall[overall["kind"] == "consecutive"]
    assert consecutive[["baseline", "candidate"]].values.tolist() == [
        ["checkpoint-100", "checkpoint-200"],
        ["checkpoint-200", "checkpoint-300"],
    ]
    # 100 -> 200: 20 gained of 24 pairs, none lost: McNemar's exact p, Holm over the 2 tests
    first = consecutive.iloc[0]
    assert (first["n_pairs"], first["gained"], first["lost"]) == (24, 20, 0)
    assert first["mcnemar_p"] == pytest.approx(mcnemar_exact(0, 20))
    assert consecutive["p_holm"].tolist() == pytest.approx(holm(consecutive["mcnemar_p"].tolist()))
    against_best = overall[overall["kind"] == "vs_best"]
    assert set(against_best["baseline"]) == {"checkpoint-100", "checkpoint-300"}
    assert set(against_best["candidate"]) == {"checkpoint-200"}
    assert (against_best["difference"] >= 0).all()

    assert curve.best["checkpoint"] == "checkpoint-200"
    markdown = outputs["markdown"].read_text()
    assert "**Best checkpoint: `checkpoint-200` (step 200), success_once 83.3% [" in markdown
    assert CAVEAT in markdown and "Holm-adjusted p" in markdown
    assert "## Per suite" in markdown
    html = outputs["html"].read_text()
    assert "data:image/png;base64," in html and "Holm-adjusted p" in html
    assert outputs["figure"].read_bytes()[:4] == b"\x89PNG"


def test_a_tie_for_best_goes_to_the_other_metric_then_the_earlier_checkpoint(tmp_path):
    same = set(EPISODES[:10])
    run = {
        "a": summarize(tmp_path, "a", same, 1),
        "b": summarize(tmp_path, "b", same, 2),
    }
    loaded = [
        load_checkpoint(n, run[n]["per_suite"], run[n]["episodes"], run[n]["checkpoint"])
        for n in run
    ]
    curve = learning_curve("tie", loaded, n_resamples=100)
    assert curve.best["checkpoint"] == "a"  # equal on both metrics: the earlier
    table = curve.table.copy()
    table.loc[(table["checkpoint"] == "b") & (table["suite"] == "all"), "success_at_end"] = 1.0
    assert best_checkpoint(table, "success_once")["checkpoint"] == "b"
    assert "tie broken by success_at_end, then by the earlier checkpoint" in curve_markdown(curve)
