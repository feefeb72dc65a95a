"""Paired comparison of two runs: exact McNemar, paired bootstrap, pairing, outputs, CLI, rule."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_record
from PIL import Image

from libero_eval import cli
from libero_eval.analysis.comparable import SettingsDiffer, recorded_settings
from libero_eval.analysis.compare import (
    compare_runs,
    comparison_markdown,
    load_episodes,
    mcnemar_exact,
    paired_bootstrap_ci,
)
from libero_eval.report.comparison import write_comparison
from libero_eval.store import RESULT_COLUMNS, write_frame

REPO = Path(__file__).resolve().parents[1]


def episodes_frame(
    run_id: str, outcomes: dict[tuple[int, int], bool], overrides: dict | None = None
) -> pd.DataFrame:
    """A results table (every RESULT_SCHEMA column) with success per (task, init state)."""
    rows = []
    for (task_id, init_state_id), success in sorted(outcomes.items()):
        row = make_record(
            run_id=run_id,
            task_id=task_id,
            task_language=f"task {task_id}",
            init_state_id=init_state_id,
            success_once=success,
            success_at_end=success,
            first_success_step=100 if success else None,
            wall_time_s=60.0,
            finished_at=1_700_000_000.0 + 60 * len(rows),
        )
        row.update((overrides or {}).get((task_id, init_state_id), {}))
        rows.append(row)
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


# Baseline vs candidate over 2 tasks x 5 init states: task 0 gains 3 and loses 0 episodes,
# task 1 gains 1 and loses 1; 2 pairs succeed in both.
BASELINE = {(0, i): False for i in range(5)} | {(1, 0): True, (1, 1): False, (1, 2): True}
BASELINE |= {(1, 3): True, (1, 4): False}
CANDIDATE = {(0, 0): True, (0, 1): True, (0, 2): True, (0, 3): False, (0, 4): False}
CANDIDATE |= {(1, 0): True, (1, 1): True, (1, 2): False, (1, 3): True, (1, 4): False}


@pytest.mark.parametrize(
    ("lost", "gained", "p_value"),
    [
        (1, 7, 0.0703125),  # 2 * (C(8,0) + C(8,1)) / 2^8
        (7, 1, 0.0703125),  # symmetric
        (0, 5, 0.0625),  # 2 / 2^5
        (2, 10, 0.03857421875),  # 2 * (1 + 12 + 66) / 2^12
        (3, 3, 1.0),
        (0, 1, 1.0),
        (0, 0, 1.0),  # no discordant pairs: no evidence of a difference
    ],
)
def test_mcnemar_exact_p_values_match_the_binomial_tail(lost, gained, p_value):
    assert mcnemar_exact(lost, gained) == pytest.approx(p_value, rel=1e-12)


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError, match="discordant counts"):
        mcnemar_exact(-1, 3)


def test_paired_bootstrap_covers_the_true_difference_about_95_percent_of_the_time():
    # Joint law of (baseline, candidate): P(1,1)=.5, P(1,0)=.1, P(0,1)=.2, P(0,0)=.2,
    # so the true difference is 0.7 - 0.6 = 0.1.
    rng = np.random.default_rng(2024)
    outcomes = np.array([(1, 1), (1, 0), (0, 1), (0, 0)], dtype=bool)
    covered = 0
    repetitions = 200
    for repetition in range(repetitions):
        drawn = outcomes[rng.choice(4, size=150, p=[0.5, 0.1, 0.2, 0.2])]
        low, high = paired_bootstrap_ci(drawn[:, 0], drawn[:, 1], 0.95, 2000, seed=repetition)
        covered += low <= 0.1 <= high
    assert 0.90 <= covered / repetitions <= 0.99


def test_paired_bootstrap_matches_resampling_pairs_by_index():
    rng = np.random.default_rng(7)
    baseline = rng.random(60) < 0.5
    candidate = np.where(rng.random(60) < 0.3, ~baseline, baseline)
    draws = rng.integers(0, 60, size=(20_000, 60))
    naive = candidate[draws].mean(axis=1) - baseline[draws].mean(axis=1)
    expected = np.quantile(naive, [0.025, 0.975])
    low, high = paired_bootstrap_ci(baseline, candidate, 0.95, 20_000, seed=1)
    assert low == pytest.approx(expected[0], abs=0.02)
    assert high == pytest.approx(expected[1], abs=0.02)


def test_paired_bootstrap_is_reproducible_and_degenerate_without_discordant_pairs():
    a = np.array([1, 0, 1, 1, 0, 0, 1, 0], dtype=bool)
    b = np.array([1, 1, 1, 0, 1, 0, 1, 1], dtype=bool)
    assert paired_bootstrap_ci(a, b, seed=3) == paired_bootstrap_ci(a, b, seed=3)
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0)
    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap_ci(a, b[:-1])


def test_comparison_pairs_episodes_and_reports_task_and_overall_differences():
    comparison = compare_runs(
        episodes_frame("base", BASELINE), episodes_frame("cand", CANDIDATE), "base", "cand"
    )
    table = comparison.table.set_index(["level", "task_id"], drop=False)
    overall = comparison.overall
    assert overall["n_pairs"] == 10
    assert (overall["gained"], overall["lost"]) == (4, 1)
    assert overall["difference"] == pytest.approx(0.3)
    assert overall["mcnemar_p"] == pytest.approx(mcnemar_exact(1, 4))
    assert overall["difference_ci_low"] <= 0.3 <= overall["difference_ci_high"]
    task0 = table.loc[("task", 0)]
    assert (task0["baseline_rate"], task0["candidate_rate"]) == (0.0, 0.6)
    assert task0["mcnemar_p"] == pytest.approx(0.25)  # 3 gained of 3 discordant
    task1 = table.loc[("task", 1)]
    assert (task1["gained"], task1["lost"], task1["difference"]) == (1, 1, 0.0)
    assert list(comparison.table["level"]) == ["task", "task", "suite", "overall"]


def test_flipped_table_lists_exactly_the_discordant_episodes():
    comparison = compare_runs(
        episodes_frame("base", BASELINE), episodes_frame("cand", CANDIDATE), "base", "cand"
    )
    flipped = comparison.flipped
    assert list(
        zip(flipped["task_id"], flipped["init_state_id"], flipped["change"], strict=True)
    ) == [
        (0, 0, "gained"),
        (0, 1, "gained"),
        (0, 2, "gained"),
        (1, 1, "gained"),
        (1, 2, "lost"),
    ]


def test_errored_episodes_count_as_failures_and_show_their_error():
    candidate = episodes_frame(
        "cand", CANDIDATE, {(1, 3): {"success_once": False, "error": "HTTP 500 from server"}}
    )
    comparison = compare_runs(episodes_frame("base", BASELINE), candidate, "base", "cand")
    lost = comparison.flipped[comparison.flipped["change"] == "lost"]
    assert list(lost["init_state_id"]) == [2, 3]
    assert lost["candidate_error"].tolist()[1] == "HTTP 500 from server"
    assert "HTTP 500 from server" in comparison_markdown(comparison)


def test_unmatched_episodes_are_reported_not_dropped_silently():
    candidate = episodes_frame("cand", {**CANDIDATE, (2, 0): True})
    baseline = episodes_frame("base", {k: v for k, v in BASELINE.items() if k != (0, 4)})
    comparison = compare_runs(baseline, candidate, "base", "cand")
    assert comparison.overall["n_pairs"] == 9
    unmatched = comparison.unmatched[["task_id", "init_state_id", "seed", "only_in"]]
    assert unmatched.values.tolist() == [[0, 4, 1140, "cand"], [2, 0, 1140, "cand"]]
    markdown = comparison_markdown(comparison)
    assert "## Unmatched episodes (2)" in markdown
    assert "| suite | task | init state | seed | only in |" in markdown
    assert "| libero_spatial | 2 | 0 | 1140 | `cand` |" in markdown


def test_an_unmatched_episode_of_a_several_seed_run_shows_its_seed():
    seeds = {"seed": 2}
    baseline = pd.concat(
        [
            episodes_frame("base", BASELINE),
            episodes_frame("base", BASELINE, dict.fromkeys(BASELINE, seeds)),
        ]
    )
    comparison = compare_runs(baseline, episodes_frame("cand", CANDIDATE), "base", "cand")
    assert len(comparison.unmatched) == len(BASELINE)  # seed 2: the candidate has none
    assert set(comparison.unmatched["seed"]) == {2}
    assert "| libero_spatial | 0 | 0 | 2 | `base` |" in comparison_markdown(comparison)


RECORDED = {"rollout": {"protocol": "rlinf", "max_steps": 480, "camera_size": 256}}
SHORT = {"rollout": {**RECORDED["rollout"], "max_steps": 48}}


def test_runs_whose_episode_settings_differ_are_refused_naming_each_difference():
    baseline, candidate = episodes_frame("base", BASELINE), episodes_frame("cand", CANDIDATE)
    with pytest.raises(SettingsDiffer) as refused:
        compare_runs(baseline, candidate, "base", "cand", settings=(RECORDED, SHORT))
    message = str(refused.value)
    assert "runs `base` and `cand` are not comparable" in message
    assert "rollout.max_steps: `base` 480, `cand` 48" in message
    assert "camera_size" not in message  # equal in both
    assert "--allow-different-settings" in message
    assert "compare.allow_different_settings: true" in message

    allowed = compare_runs(
        baseline,
        candidate,
        "base",
        "cand",
        settings=(RECORDED, SHORT),
        allow_different_settings=True,
    )
    assert [d.setting for d in allowed.differences] == ["rollout.max_steps"]
    assert "The runs differ in rollout.max_steps" in allowed.warnings[0]
    assert "> **Warning.** The runs differ in rollout.max_steps" in comparison_markdown(allowed)


def test_episode_rows_are_checked_even_where_no_settings_were_recorded():
    baseline = episodes_frame("base", BASELINE)
    other = episodes_frame(
        "cand", CANDIDATE, dict.fromkeys(CANDIDATE, {"reset_seeding": "reference"})
    )
    with pytest.raises(SettingsDiffer, match="rollout.reset_seeding: `base` 'episode', `cand`"):
        compare_runs(baseline, other, "base", "cand", settings=(None, None))
    same = compare_runs(
        baseline, episodes_frame("cand", CANDIDATE), "base", "cand", settings=(RECORDED, None)
    )
    assert same.differences == ()
    assert same.warnings == [
        "Run `cand` recorded no settings (summary/settings.json or report/provenance.json): "
        "only the protocol, reset seeding and seed of its episodes were compared."
    ]


def test_recorded_settings_come_from_the_summary_or_an_older_runs_provenance(tmp_path):
    run = tmp_path / "run"
    assert recorded_settings(run) is None
    (run / "report").mkdir(parents=True)
    config = {"rollout": {"protocol": "cosmos", "max_steps": None, "envs_per_shard": 8}}
    (run / "report" / "provenance.json").write_text(json.dumps({"config": config}))
    # outcome-neutral fields (x-fingerprint: false) are left out
    assert recorded_settings(run) == {"rollout": {"protocol": "cosmos", "max_steps": None}}
    (run / "summary").mkdir()
    (run / "summary" / "settings.json").write_text(json.dumps(SHORT))
    assert recorded_settings(run) == SHORT


def test_duplicate_episodes_in_a_run_are_an_error_naming_the_run():
    baseline = episodes_frame("base", BASELINE)
    with pytest.raises(ValueError, match="run 'base' has 2 rows sharing"):
        compare_runs(
            pd.concat([baseline, baseline.iloc[:1]]), episodes_frame("c", CANDIDATE), "base"
        )


def test_unknown_metric_names_the_setting():
    with pytest.raises(ValueError, match="compare.metric"):
        compare_runs(episodes_frame("a", BASELINE), episodes_frame("b", CANDIDATE), metric="x")


def test_markdown_summarizes_runs_overall_tasks_and_flips():
    comparison = compare_runs(
        episodes_frame("base", BASELINE), episodes_frame("cand", CANDIDATE), "base", "cand"
    )
    markdown = comparison_markdown(comparison)
    low, high = comparison.overall[["difference_ci_low", "difference_ci_high"]]
    assert markdown.startswith("# Paired comparison: `cand` vs `base`")
    assert (
        f"| **all** | 30.0% (3/10) | 60.0% (6/10) | +30.0 [{100 * low:+.1f}, {100 * high:+.1f}] "
        f"| 4 | 1 | {mcnemar_exact(1, 4):.3g} |" in markdown  # p as every table shows it
    )
    assert "## Flipped episodes (5)" in markdown


def test_missing_run_names_the_file_and_the_command(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_episodes("nope", results_dir=tmp_path)
    message = str(error.value)
    assert str(tmp_path / "nope" / "summary" / "episodes.parquet") in message
    assert "snakemake" in message and "run_id=nope" in message


def write_run(results: Path, run_id: str, outcomes: dict) -> Path:
    path = results / run_id / "summary" / "episodes.parquet"
    path.parent.mkdir(parents=True)
    write_frame(episodes_frame(run_id, outcomes), path)
    return path


def test_written_outputs_round_trip(tmp_path):
    comparison = compare_runs(
        episodes_frame("base", BASELINE), episodes_frame("cand", CANDIDATE), "base", "cand"
    )
    outputs = {
        name: tmp_path / file
        for name, file in [
            ("markdown", "comparison.md"),
            ("html", "comparison.html"),
            ("per_task", "per_task.csv"),
            ("flipped", "flipped.csv"),
            ("unmatched", "unmatched.csv"),
            ("figure", "difference.png"),
        ]
    }
    write_comparison(comparison, outputs)
    per_task = pd.read_csv(outputs["per_task"])
    assert per_task[per_task["level"] == "overall"]["difference"].item() == pytest.approx(0.3)
    assert len(pd.read_csv(outputs["flipped"])) == 5
    assert "Paired comparison: cand vs base" in outputs["html"].read_text()
    pixels = np.asarray(Image.open(outputs["figure"]).convert("RGB"))
    assert pixels.shape[0] > 200 and (pixels < 250).any(axis=2).mean() > 0.02


def test_cli_compare_prints_the_comparison(tmp_path, capsys):
    write_run(tmp_path, "base", BASELINE)
    write_run(tmp_path, "cand", CANDIDATE)
    code = cli.main(["compare", str(tmp_path / "base"), str(tmp_path / "cand")])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("# Paired comparison: `cand` vs `base`")
    assert "| 4 | 1 |" in out


def test_cli_compare_refuses_runs_with_different_step_limits_unless_allowed(tmp_path, capsys):
    for run, settings in (("base", RECORDED), ("cand", SHORT)):
        path = write_run(tmp_path, run, BASELINE if run == "base" else CANDIDATE)
        (path.parent / "settings.json").write_text(json.dumps(settings))
    runs = [str(tmp_path / "base"), str(tmp_path / "cand")]
    assert cli.main(["compare", *runs]) == 2
    error = capsys.readouterr().err
    assert "libero-eval compare: error: runs `base` and `cand` are not comparable" in error
    assert "rollout.max_steps: `base` 480, `cand` 48" in error
    assert cli.main(["compare", *runs, "--allow-different-settings"]) == 0
    out, error = capsys.readouterr()
    assert "WARNING: The runs differ in rollout.max_steps" in error
    assert out.startswith("# Paired comparison: `cand` vs `base`")


def test_cli_compare_of_a_missing_run_fails_with_the_path(tmp_path, capsys):
    write_run(tmp_path, "base", BASELINE)
    code = cli.main(["compare", "base", "gone", "--results-dir", str(tmp_path)])
    assert code == 2
    assert "gone/summary/episodes.parquet does not exist" in capsys.readouterr().err


@pytest.mark.workflow
def test_compare_rule_writes_the_comparison_and_explains_a_missing_run(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    write_run(tmp_path / "results", "base", BASELINE)
    write_run(tmp_path / "results", "cand", CANDIDATE)
    snakemake = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    snakemake += ["-d", str(tmp_path), "--cores", "1", "compare"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        [*snakemake, "--config", "compare={baseline: base, candidate: cand}"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "results" / "compare" / "base_vs_cand"
    assert sorted(p.name for p in out.iterdir()) == [
        "comparison.html",
        "comparison.md",
        "difference.png",
        "flipped.csv",
        "per_task.csv",
        "unmatched.csv",
    ]
    assert "| **all** | 30.0% (3/10) | 60.0% (6/10)" in (out / "comparison.md").read_text()
    # `snakemake compare` ends by printing the comparison, not a run's summary
    assert "# Paired comparison: `cand` vs `base`" in done.stdout
    assert "# LIBERO evaluation" not in done.stdout

    # runs whose recorded episode settings differ are refused, naming the setting
    for run, settings in (("base", RECORDED), ("cand", SHORT)):
        (tmp_path / "results" / run / "summary" / "settings.json").write_text(json.dumps(settings))
    shutil.rmtree(out)
    refused = subprocess.run(
        [*snakemake, "--config", "compare={baseline: base, candidate: cand}"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert refused.returncode != 0
    assert "rollout.max_steps: `base` 480, `cand` 48" in refused.stdout + refused.stderr
    assert "compare.allow_different_settings: true" in refused.stdout + refused.stderr
    overlay = tmp_path / "allow.yaml"  # --config would pass the nested true as a string
    overlay.write_text(
        "compare: {baseline: base, candidate: cand, allow_different_settings: true}\n"
    )
    allowed = subprocess.run(
        [*snakemake, "--configfile", str(overlay)], capture_output=True, text=True, env=env
    )
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "> **Warning.** The runs differ in rollout.max_steps" in allowed.stdout

    shutil.rmtree(tmp_path / "results" / "cand")
    failed = subprocess.run(
        [*snakemake, "--config", "compare={baseline: base, candidate: cand}", "-n"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert failed.returncode != 0
    assert "results/cand/summary/episodes.parquet does not exist" in failed.stdout + failed.stderr
