"""Report material: Wilson bounds, figures, failure grouping, provenance, videos, run status."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pandas as pd
import pytest
from conftest import make_record
from docutils.core import publish_parts
from PIL import Image

from libero_eval import report
from libero_eval.analysis.aggregate import steps_note, success_tables, wilson_interval
from libero_eval.analysis.errors import NO_ERROR, failures_by_error
from libero_eval.analysis.throughput import steps_per_second
from libero_eval.cli import main as cli_main
from libero_eval.cli import run_status
from libero_eval.config import RunSettings
from libero_eval.eventlog import STAMP, last_invocation_start, log_launch
from libero_eval.plan import Episode, make_shards, plan_episodes, plan_table
from libero_eval.store import RESULT_COLUMNS, EpisodeStore, write_frame

REPO = Path(__file__).resolve().parents[1]
STATS = (
    REPO / "src" / "libero_eval" / "data" / "stats" / "libero_native_frame_wise_relative_rot6d.json"
)


def assert_chart_png(path: Path) -> None:
    """A rendered chart: a real PNG, mostly white, with dark ink and some colour on it."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert pixels.shape[0] >= 200 and pixels.shape[1] >= 300
    ink = (pixels < 200).any(axis=2).mean()
    colour = (pixels.max(axis=2) - pixels.min(axis=2) > 60).mean()
    assert 0.005 < ink < 0.6, f"{path.name}: {ink:.4f} of the pixels are ink"
    assert colour > 0.0005, f"{path.name}: no coloured marks"


def episode_record(suite: str, task_id: int, init: int, first: int | None, index: int) -> dict:
    """One result row (plain Python values, as the episode store holds it)."""
    return make_record(
        run_id="synthetic",
        suite=suite,
        task_id=task_id,
        task_language=f"{suite} task {task_id}",
        init_state_id=init,
        success_once=first is not None,
        success_at_end=first is not None and index % 2 == 0,
        first_success_step=first,
        policy_latency_mean_s=0.05 + 0.01 * index,
        policy_latency_p50_s=0.05,
        policy_latency_p95_s=0.08 + 0.01 * index,
        wall_time_s=30.0,
        server_slot=index % 2,
        server_url=f"http://127.0.0.1:{9000 + index % 2}",
        shard=f"shard{index % 2:03d}",
        finished_at=1_700_000_030.0 + 15 * index,
    )


KEYS = [(s, t, i) for s in ("libero_goal", "libero_spatial") for t in (0, 1) for i in range(3)]


def make_episodes(successes: dict[tuple[str, int, int], int | None] | None = None) -> pd.DataFrame:
    """Two suites x 2 tasks x 3 init states on 2 slots. `successes` maps a key to its first
    success step (None: failed); by default init state 0 fails and the others succeed."""
    rows = []
    for index, key in enumerate(KEYS):
        first = (successes or {}).get(key, None if key[2] == 0 else 40 + 10 * index)
        rows.append(episode_record(*key, first, index))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


# --------------------------------------------------------------------------- Wilson bounds


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        # Newcombe (1998), Stat. Med. 17:857, Table II, method 3 (score, no continuity corr.)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # by hand: z^2/n / (1 + z^2/n) with z = 1.959964, n = 10
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_bounds_match_published_values(successes, n, low, high):
    bounds = wilson_interval(successes, n, 0.95)
    assert bounds == pytest.approx((low, high), abs=5e-5)


def test_wilson_interval_is_empty_without_episodes():
    assert all(np.isnan(wilson_interval(0, 0)))


def test_success_table_html_shows_rates_with_wilson_intervals():
    episodes = make_episodes({("libero_goal", 0, i): (10 if i < 2 else None) for i in range(3)})
    page = report.success_table_html(success_tables(episodes), 0.95, 1)
    low, high = wilson_interval(2, 3)
    assert f"66.7% [{100 * low:.1f}, {100 * high:.1f}]" in page
    assert "success_once (95% Wilson CI)" in page
    assert "libero_goal task 0" in page


# --------------------------------------------------------------------------- figures


@pytest.mark.parametrize(
    ("name", "draw"),
    [
        ("success_by_task", lambda e: report.success_by_task_figure(success_tables(e))),
        ("success_by_suite", lambda e: report.success_by_suite_figure(success_tables(e))),
        ("first_success_step", report.first_success_step_figure),
        ("latency_over_time", report.latency_over_time_figure),
        ("throughput_over_time", report.throughput_over_time_figure),
    ],
)
def test_figures_render_non_blank(tmp_path, name, draw):
    path = tmp_path / f"{name}.png"
    report.save_figure(draw(make_episodes()), path)
    assert_chart_png(path)


def test_bar_charts_draw_rates_of_0_and_100_percent(tmp_path):
    # Wilson bounds at 0/3 and 10/10 sit a rounding error beyond the rate
    assert wilson_interval(0, 3)[0] > 0 or wilson_interval(10, 10)[1] < 1
    outcomes = {key: (None if key[:2] == ("libero_goal", 0) else 5) for key in KEYS}
    table = success_tables(make_episodes(outcomes))
    for name, figure in [
        ("task", report.success_by_task_figure(table)),
        ("suite", report.success_by_suite_figure(table)),
    ]:
        report.save_figure(figure, tmp_path / f"{name}.png")
        assert_chart_png(tmp_path / f"{name}.png")


def test_figures_render_when_nothing_succeeded_and_nothing_was_measured(tmp_path):
    episodes = make_episodes(dict.fromkeys(KEYS))
    episodes["policy_latency_mean_s"] = np.nan
    for name, figure in [
        ("first", report.first_success_step_figure(episodes)),
        ("latency", report.latency_over_time_figure(episodes)),
    ]:
        report.save_figure(figure, tmp_path / f"{name}.png")
        pixels = np.asarray(Image.open(tmp_path / f"{name}.png").convert("L"))
        assert (pixels < 200).mean() > 0.005


def test_steps_per_second_spreads_each_episode_over_the_time_it_ran():
    episodes = pd.DataFrame(
        {
            "finished_at": [110.0, 130.0],
            "wall_time_s": [10.0, 20.0],  # runs 100-110 and 110-130
            "steps": [100, 400],
        }
    )
    rate = steps_per_second(episodes, np.array([0.0, 10.0, 20.0, 30.0]), origin=100.0)
    assert rate == pytest.approx([10.0, 20.0, 20.0])


def test_failures_are_grouped_by_the_first_line_of_their_error():
    episodes = make_episodes(dict.fromkeys(KEYS))
    episodes.loc[0, "error"] = "PolicyError: HTTP 500 from http://x\nTraceback ..."
    episodes.loc[1, "error"] = "PolicyError: HTTP 500 from http://x\nother detail"
    episodes.loc[2, "error"] = "EnvWorkerDied: exit code -9"
    failures = failures_by_error(episodes)
    assert failures[["error", "episodes"]].values.tolist() == [
        [NO_ERROR, 9],
        ["PolicyError: HTTP 500 from http://x", 2],
        ["EnvWorkerDied: exit code -9", 1],
    ]
    assert failures["share_of_failures"].sum() == pytest.approx(1.0)
    assert failures.loc[1, "examples"] == "libero_goal/task00/init00, libero_goal/task00/init01"
    assert "12 of 12 episodes failed" in report.failures_html(failures, 12)


# --------------------------------------------------------------------------- provenance


def test_provenance_records_commit_stats_hash_model_and_versions(tmp_path, default_config):
    model_dir = tmp_path / "model_diffusers"
    model_dir.mkdir()
    (model_dir / "model_index.json").write_text('{"_class_name": "X"}')
    config = {
        "run_id": "prov",
        "server": {"backend": "sglang", "sglang": {"model_path": str(model_dir), "command": ["s"]}},
        "policy": {"cosmos3": {"action_stats_path": str(STATS)}},
    }
    default_config["policy"]["cosmos3"]["action_stats_path"] = str(STATS)
    action_stats = RunSettings(default_config).action_stats  # as the workflow's settings read it
    record = report.provenance(
        config, REPO, fingerprint="abc123", episodes=make_episodes(), action_stats=action_stats
    )
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert record["git"]["commit"] == head
    assert isinstance(record["git"]["dirty"], bool)
    assert record["action_stats"]["sha256"] == hashlib.sha256(STATS.read_bytes()).hexdigest()
    assert record["model"]["model_dir"] == str(model_dir.resolve())
    assert (
        record["model"]["model_index_sha256"] == hashlib.sha256(b'{"_class_name": "X"}').hexdigest()
    )
    assert record["packages"]["numpy"] == np.__version__
    assert set(report.PROVENANCE_PACKAGES) <= record["packages"].keys()
    assert record["episodes"]["count"] == 12
    assert record["rollout_fingerprint"] == "abc123"
    assert record["config"] is config
    page = report.provenance_html(record)
    assert head in page and "model_dir" in page and "&quot;run_id&quot;: &quot;prov&quot;" in page


def test_provenance_outside_a_git_checkout_has_no_commit(tmp_path):
    assert report.git_state(tmp_path) == {"commit": None, "dirty": None}


# --------------------------------------------------------------------------- videos


def write_video(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = np.full((4, 64, 64, 3), value, dtype=np.uint8)
    frames[:, 16:48, 16:48] = [200, 30, 30]
    iio.imwrite(path, frames, fps=10, codec="libx264")


def test_videos_sample_the_first_successes_and_failures_of_each_task():
    episodes = make_episodes()
    episodes["video_path"] = [f"v{i}.mp4" for i in range(len(episodes))]
    episodes.loc[4, "video_path"] = None  # not recorded
    selected = report.select_videos(episodes, per_task=1)
    chosen = selected[["suite", "task_id", "init_state_id", "success_once"]].values.tolist()
    assert chosen == [
        ["libero_goal", 0, 0, False],
        ["libero_goal", 0, 1, True],
        ["libero_goal", 1, 0, False],
        ["libero_goal", 1, 2, True],  # init 1 has no video
        ["libero_spatial", 0, 0, False],
        ["libero_spatial", 0, 1, True],
        ["libero_spatial", 1, 0, False],
        ["libero_spatial", 1, 1, True],
    ]
    assert len(report.select_videos(episodes, per_task=2)) == 12 - 1
    assert report.select_videos(episodes, per_task=0).empty


def test_video_page_embeds_playable_videos_and_names_missing_ones(tmp_path):
    episodes = make_episodes().iloc[:2].copy()
    good = tmp_path / "videos" / "libero_goal" / "task00_init00_failure.mp4"
    write_video(good, 20)
    episodes["video_path"] = [str(good), str(tmp_path / "gone.mp4")]
    page = report.videos_html(report.select_videos(episodes, per_task=1))
    embedded = re.findall(r'src="data:video/mp4;base64,([^"]+)"', page)
    assert len(embedded) == 1
    decoded = tmp_path / "decoded.mp4"
    decoded.write_bytes(base64.b64decode(embedded[0]))
    frames = iio.imread(decoded)
    assert frames.shape[1:] == (64, 64, 3) and frames[0, 32, 32, 0] > 150
    assert "libero_goal/task00/init00: failure" in page
    assert f"missing file {tmp_path / 'gone.mp4'}" in page


def test_video_page_without_videos_says_how_to_get_them():
    page = report.videos_html(report.select_videos(make_episodes(), 1))
    assert "rollout.videos.enabled: true" in page
    assert "raise <code>report.videos_per_task</code>" in report.videos_html(
        make_episodes().iloc[0:0], num_recorded=12
    )


# --------------------------------------------------------------------------- outputs


def test_write_report_outputs_writes_every_named_output(tmp_path):
    episodes_path = tmp_path / "episodes.parquet"
    tables_path = tmp_path / "summary.parquet"
    episodes = make_episodes()
    write_frame(episodes, episodes_path)
    success_tables(episodes).to_parquet(tables_path, index=False)
    names = {
        "success_by_task": "a.png",
        "success_by_suite": "b.png",
        "first_success_step": "c.png",
        "latency_over_time": "d.png",
        "throughput_over_time": "e.png",
        "success_table": "t.html",
        "failures_csv": "f.csv",
        "failures_html": "f.html",
        "provenance_json": "p.json",
        "provenance_html": "p.html",
        "videos": "v.html",
    }
    outputs = {key: tmp_path / "out" / name for key, name in names.items()}
    config = {"run_id": "synthetic", "report": {"confidence_level": 0.9, "decimals": 2}}
    report.write_report_outputs(episodes_path, tables_path, outputs, config, REPO, "fp")
    for key, path in outputs.items():
        if path.suffix == ".png":
            assert_chart_png(path)
        else:
            assert path.stat().st_size > 0, key
    assert json.loads(outputs["provenance_json"].read_text())["rollout_fingerprint"] == "fp"
    assert "90% Wilson CI" in outputs["success_table"].read_text()
    with pytest.raises(ValueError, match="unknown report output 'nope'"):
        report.write_report_outputs(episodes_path, tables_path, {"nope": tmp_path / "x"}, config)


# --------------------------------------------------------------------------- run status


def record_for(episode: Episode, success: bool, finished_at: float, error=None) -> dict:
    record = episode_record(episode.suite, episode.task_id, episode.init_state_id, None, 0)
    return record | {
        "success_once": success,
        "finished_at": finished_at,
        "wall_time_s": 100.0,
        "error": error,
    }


@pytest.fixture
def running_run(tmp_path):
    """A run with 8 planned episodes: an old fingerprint finished 8, the live one 3 so far."""
    run_dir = tmp_path / "results" / "live"
    run_dir.mkdir(parents=True)
    episodes = plan_episodes(["libero_spatial"], [0, 1], None, 4)
    plan_table(make_shards(episodes, 1, 1)).to_csv(run_dir / "plan.csv", index=False)
    old = EpisodeStore(run_dir / "episodes" / "aaaaaaaaaaaa")
    for episode in episodes:
        path = old.write(episode, record_for(episode, True, 500.0))
        os.utime(path, (1_000, 1_000))
    live = EpisodeStore(run_dir / "episodes" / "bbbbbbbbbbbb")
    live.write(episodes[0], record_for(episodes[0], True, 1_100.0))
    live.write(episodes[1], record_for(episodes[1], False, 1_200.0))
    live.write(episodes[2], record_for(episodes[2], False, 1_300.0, error="HTTP 500"))
    return run_dir


def test_status_reads_the_live_fingerprint_while_the_run_goes_on(running_run):
    status = run_status(running_run, now=1_600.0)
    assert status.fingerprint == "bbbbbbbbbbbb"
    assert (status.planned, status.done, status.successes, status.errors) == (8, 3, 1, 1)
    # no invocation line in the event log: from its first record, started at 1100 - 100 = 1000;
    # 600 s for 3 episodes, so 1000 s for the other 5
    assert status.line() == (
        "live: 3/8 episodes (37.5%), success_once 1/3 (33.3%), errors 1, "
        "elapsed 0:10:00 since the first episode, ETA 0:16:40"
    )


def test_status_of_a_resumed_run_counts_from_this_invocations_start(running_run):
    """A rerun resumes: elapsed time and ETA count from the latest invocation's line in the
    event log and the episodes finished since, not from the run's first episode ever."""
    event_log = running_run.parents[1] / "logs" / "live" / "eval_embodiment.log"
    event_log.parent.mkdir(parents=True)
    lines = [  # an earlier invocation, then the latest, as the workflow's onstart logs them
        f"{time.strftime(STAMP, time.localtime(start + 2))} [workflow] workflow launch: "
        f"snakemake (pid {pid}) started 2.0 s before its first job (epoch {start:.2f}); "
        "1 rollout job(s) to run\n"
        for start, pid in ((900, 11), (1_150, 12))
    ]
    event_log.write_text(lines[0] + "2026-01-01 00:00:00 [rollout shard000] ...\n" + lines[1])
    status = run_status(running_run, now=1_600.0)
    assert (status.since, status.done_since) == ("invocation", 2)  # finished at 1200, 1300
    # 450 s since 1150 for 2 episodes: 1125 s for the other 5
    assert status.line() == (
        "live: 3/8 episodes (37.5%), success_once 1/3 (33.3%), errors 1, "
        "elapsed 0:07:30 this invocation (2 episodes in it), ETA 0:18:45"
    )


def test_the_invocation_line_the_workflow_writes_is_the_one_status_reads(tmp_path):
    log_launch(tmp_path / "eval_embodiment.log", 1234.5, 4321, 2)
    assert last_invocation_start(tmp_path / "eval_embodiment.log") == 1234.5
    assert last_invocation_start(tmp_path / "missing.log") is None


def test_status_of_a_finished_run_reports_its_duration(running_run):
    live = EpisodeStore(running_run / "episodes" / "bbbbbbbbbbbb")
    for episode in plan_episodes(["libero_spatial"], [0, 1], None, 4)[3:]:
        live.write(episode, record_for(episode, True, 1_900.0))
    assert run_status(running_run, now=99_999.0).line() == (
        "live: 8/8 episodes (100.0%), success_once 6/8 (75.0%), errors 1, "
        "elapsed 0:15:00 since the first episode, ETA done"
    )


def test_status_before_any_episode_finished(tmp_path):
    run_dir = tmp_path / "fresh"
    run_dir.mkdir()
    episodes = plan_episodes(["libero_goal"], [3], None, 2)
    plan_table(make_shards(episodes, 1, 1)).to_csv(run_dir / "plan.csv", index=False)
    assert run_status(run_dir).line() == (
        "fresh: 0/2 episodes (0.0%), success_once 0/0 (n/a), errors 0, elapsed -, ETA -"
    )


def test_status_command_prints_one_line_and_explains_a_missing_plan(running_run, tmp_path, capsys):
    assert cli_main(["status", str(running_run)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("live: 3/8 episodes")
    assert cli_main(["status", str(tmp_path / "nothing")]) == 2
    assert "nothing/plan.csv does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("protocol", "max_steps", "says"),
    [
        ("rlinf", 100, ["up to the limit rollout.max_steps = 100", "not counted", "whole action"]),
        ("openpi", None, ["counts the 10 settle steps", "on top of them", "stops at its first"]),
        ("cosmos", None, ["counts the 10 settle steps after reset and the policy's actions, up"]),
        ("lerobot", 300, ["the 10 settle steps after reset are not counted"]),
    ],
)
def test_the_summary_says_how_steps_count_and_where_chunks_run_past_the_limit(
    protocol, max_steps, says
):
    note = steps_note([protocol, protocol], max_steps)
    assert note.startswith(f"**Steps** ({protocol} protocol): `steps` counts")
    for words in says:
        assert words in note
    assert ("mean steps can exceed the limit" in note) is (protocol == "rlinf")
    assert steps_note(["a protocol no longer known"]) == ""


def test_the_reports_first_screen_is_the_success_table_with_the_steps_note():
    table = success_tables(
        pd.DataFrame(
            [
                make_record(task_id=t, init_state_id=i, success_once=i == 0, steps=112)
                for t in (0, 1)
                for i in (0, 1)
            ]
        )
    )
    rst = report.success_overview_rst(table, "demo", steps=steps_note(["rlinf"], 100))
    body = publish_parts(rst, writer="html")["html_body"]
    assert '<h1 class="title">Result of run <tt class="docutils literal">demo</tt></h1>' in body
    assert "<td>libero_spatial</td>\n<td>50.0% [15.0, 85.0]</td>" in body
    assert "<td>all</td>" in body and "<td>112</td>" in body
    assert "mean steps can exceed the limit" in body
