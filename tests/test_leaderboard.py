"""The leaderboard over several runs: its numbers are each run's own summary, comparable runs
are grouped and paired, marked runs stay marked, bad input is refused, and the page renders in
headless Chromium. The runs are small result folders written by the package's own writers
(store and aggregate), not simulations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_record
from PIL import Image

from libero_eval.analysis.aggregate import write_summary
from libero_eval.analysis.leaderboard import LeaderboardError, build_leaderboard
from libero_eval.cli import main as cli_main
from libero_eval.report.leaderboard import write_leaderboard
from libero_eval.store import write_results

CHROMIUM = Path("/usr/bin/chromium")
PUBLISHED = {"libero_spatial": {"rate": 0.9, "n": None, "source": "a paper"}}


def write_run(
    results: Path,
    run_id: str,
    wins: dict[int, list[bool]],
    protocol: str = "rlinf",
    errors: int = 0,
    family: str = "cosmos3",
) -> Path:
    """results/<run_id> as the workflow leaves it: plan.csv, a shard table, the summary and
    provenance.json; 2 tasks x len(wins[s]) // 2 init states per seed."""
    run = results / run_id
    (run / "shards").mkdir(parents=True)
    (run / "summary").mkdir()
    (run / "report").mkdir()
    records, plan = [], []
    several = len(wins) > 1
    for seed, outcomes in wins.items():
        for index, win in enumerate(outcomes):
            task, init = index % 2, index // 2
            records.append(
                make_record(
                    run_id=run_id,
                    suite="libero_spatial",
                    task_id=task,
                    task_language=f"task {task}",
                    init_state_id=init,
                    seed=seed,
                    protocol=("openpi" if index else "rlinf") if protocol == "mixed" else protocol,
                    success_once=win,
                    success_at_end=win and index % 3 != 0,
                    steps=120,
                    wall_time_s=10.0,
                    finished_at=1_780_000_000.0 + 10 * index,
                    error="RuntimeError: env died" if index < errors else None,
                )
            )
            plan.append(
                {"suite": "libero_spatial", "task_id": task, "init_state_id": init}
                | ({"seed": seed} if several else {})
                | {"shard": "shard000", "slot": 0}
            )
    write_results(records, run / "shards" / "shard000.parquet")
    pd.DataFrame(plan).to_csv(run / "plan.csv", index=False)
    summary = run / "summary"
    names = {
        "episodes": "episodes.parquet",
        "per_task": "per_task.csv",
        "per_suite": "per_suite.csv",
        "per_seed": "per_seed.csv",
        "tables": "summary.parquet",
        "markdown": "summary.md",
    }
    write_summary(
        [str(run / "shards" / "shard000.parquet")],
        str(run / "plan.csv"),
        {k: str(summary / v) for k, v in names.items()},
        run_id,
        published=PUBLISHED,
    )
    provenance = {
        "model": {
            "family": family,
            "model_dir": f"/ckpt/{run_id}",
            "model_index_sha256": "ab" * 32,
        },
        "config": {"rollout": {"protocol": protocol, "max_steps": None}},
    }
    (run / "report" / "provenance.json").write_text(json.dumps(provenance))
    return run


@pytest.fixture
def results(tmp_path) -> Path:
    results = tmp_path / "results"
    three = {0: [True, True, False, True], 1: [True, False, False, True], 2: [True] * 4}
    write_run(results, "cosmos_a", three)
    write_run(results, "cosmos_b", {s: [not w for w in v] for s, v in three.items()})
    write_run(results, "cosmos_err", three, errors=1)
    write_run(results, "pi05_openpi", {7: [True, False, True, True]}, "openpi", family="pi05")
    efficiency = pd.DataFrame(
        {"slot": [0, 1], "obs_per_s": [2.0, 1.5], "capacity_fraction": [0.9, 0.7]}
    )
    efficiency.to_csv(results / "cosmos_a" / "summary" / "efficiency.csv", index=False)
    return results


def test_each_row_equals_its_runs_own_summary(results):
    table, pairs, left_out = build_leaderboard([results])
    assert sorted(table["run"]) == ["cosmos_a", "cosmos_b", "cosmos_err", "pi05_openpi"]
    assert left_out == []
    for _, row in table.iterrows():
        per_suite = pd.read_csv(results / row["run"] / "summary" / "per_suite.csv").set_index(
            "suite"
        )
        for name, suite in (("overall", "all"), ("libero_spatial", "libero_spatial")):
            for metric in ("success_once", "success_at_end"):
                for part in ("", "_ci_low", "_ci_high"):
                    assert row[f"{name}:{metric}{part}"] == per_suite.loc[suite, f"{metric}{part}"]
            assert row[f"{name}:n"] == per_suite.loc[suite, "num_trajectories"]
        if "success_once_seed_std" in per_suite:
            assert (
                row["overall:success_once_seed_std"]
                == per_suite.loc["all", "success_once_seed_std"]
            )
        assert row["published_verdict"] == per_suite.loc["libero_spatial", "published_verdict"]
    a = table.set_index("run").loc["cosmos_a"]
    assert (a["seeds"], a["episodes_done"], a["episodes_planned"]) == ("0,1,2", 12, 12)
    assert a["obs_per_s"] == 3.5 and a["capacity_fraction"] == pytest.approx(0.8)
    assert np.isnan(table.set_index("run").loc["cosmos_b", "obs_per_s"])  # not recorded: blank
    assert a["family"] == "cosmos3" and a["checkpoint"] == "/ckpt/cosmos_a"


def test_rows_are_grouped_by_protocol_and_episodes_and_pairs_stay_within_a_group(results):
    table, pairs, _ = build_leaderboard([results], compute_pairs=True)
    groups = table.groupby("group")["run"].apply(sorted).to_dict()
    assert sorted(groups.values()) == [["cosmos_a", "cosmos_b", "cosmos_err"], ["pi05_openpi"]]
    status = table.set_index("run")["status"]
    assert status["cosmos_err"].startswith("errors: 3") and status["cosmos_a"] == "ok"
    assert len(pairs) == 3  # errored runs are marked but still comparable; pairs within a group
    ab = pairs[(pairs["baseline"] == "cosmos_a") & (pairs["candidate"] == "cosmos_b")].iloc[0]
    assert ab["n_pairs"] == 12 and ab["command"].startswith("libero-eval compare ")
    assert ab["difference"] == pytest.approx((3 - 9) / 12)


def test_stale_and_unaggregated_runs_are_marked_or_left_out_never_mixed_in(results):
    plan = results / "cosmos_b" / "plan.csv"
    os.utime(plan, (plan.stat().st_mtime + 100, plan.stat().st_mtime + 100))
    shutil.copytree(results / "cosmos_a", results / "unfinished")
    shutil.rmtree(results / "unfinished" / "summary")
    table, pairs, left_out = build_leaderboard([results])
    assert table.set_index("run").loc["cosmos_b", "status"].startswith("stale")
    assert "cosmos_b" not in set(pairs["baseline"]) | set(pairs["candidate"])
    assert [p.name for p in left_out] == ["unfinished"]
    with pytest.raises(LeaderboardError, match=r"unfinished: no summary .*has not been aggregated"):
        build_leaderboard([results / "unfinished"])


def test_a_run_mixing_protocols_is_refused(results):
    write_run(results, "mixed", {0: [True, False]}, protocol="mixed")
    with pytest.raises(LeaderboardError, match=r"mixed: episodes of several protocols \(openpi, "):
        build_leaderboard([results])


def test_cli_writes_markdown_csv_and_html(results, tmp_path, capsys):
    out = tmp_path / "board"
    assert cli_main(["leaderboard", str(results), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| cosmos_a | ok | cosmos3 |" in printed and "libero-eval compare" in printed
    assert len(pd.read_csv(out / "leaderboard.csv")) == 4
    # obs/s, then their share of the servers' capacity as a percent (0.8 -> 80.0%), not 0.80
    header = next(x for x in printed.splitlines() if x.startswith("| run |"))
    assert header.endswith("| obs/s | % of capacity |")
    assert "| 3.50 | 80.0% |" in printed
    assert cli_main(["leaderboard", str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_a_run_without_a_published_figure_or_checkpoint_hash_shows_blank_cells(results, tmp_path):
    """Beside runs that have them, a run without report.published and without a checkpoint
    hash (the reference server) shows blank cells: "nan" was printed as its verdict, and a
    missing hash (NaN in the table) failed the page with a TypeError."""
    plain = write_run(results, "reference_plain", {0: [True, False, True, True]})
    per_suite = pd.read_csv(plain / "summary" / "per_suite.csv")
    per_suite.drop(columns=[c for c in per_suite if c.startswith("published_")]).to_csv(
        plain / "summary" / "per_suite.csv", index=False
    )
    provenance = json.loads((plain / "report" / "provenance.json").read_text())
    provenance["model"] = {"family": "cosmos3", "reference_policy": "scripted"}
    (plain / "report" / "provenance.json").write_text(json.dumps(provenance))
    paths = write_leaderboard([results], tmp_path / "board")
    markdown = paths["md"].read_text()
    line = next(x for x in markdown.splitlines() if x.startswith("| reference_plain |"))
    assert "nan" not in line.lower()
    assert "| reference-scripted |  |" in line  # no hash
    assert "|  |  | 2026-" in line  # no published figure, no verdict, then the date
    assert ">nan<" not in paths["html"].read_text().lower()  # shown text (sort keys aside)


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
)
def test_leaderboard_page_renders_in_chromium_with_no_network(results, tmp_path):
    paths = write_leaderboard([results], tmp_path / "board")
    page = paths["html"].read_text()
    assert "http://" not in page and "https://" not in page  # nothing fetched
    shot = tmp_path / "board.png"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1600,900",
        "--virtual-time-budget=4000",
    ]
    subprocess.run([*command, f"--screenshot={shot}", paths["html"].as_uri()], timeout=120)
    dom = subprocess.run(
        [*command, "--dump-dom", paths["html"].as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert dom.count('<table class="board">') == 2
    for run in ("cosmos_a", "cosmos_b", "cosmos_err", "pi05_openpi"):
        assert f">{run}</td>" in dom
    assert 'class="marked"' in dom  # the errored run
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    ink = (pixels < 160).any(axis=2).mean()
    assert 0.002 < ink < 0.5, f"{ink:.4f} of the screenshot is ink: no table drawn"
