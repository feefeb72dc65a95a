"""benchmarks/workflow_run.py: the serving window (the report's), rates, duty cycle, GPU peaks
and the timeline it reports for a run (the H200 figures in docs/performance.md come from it)."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import workflow_run  # noqa: E402

T0 = datetime(2026, 12, 1, 10, 0, 0).timestamp()


def _stamp(offset_s: float) -> str:
    return datetime.fromtimestamp(T0 + offset_s).strftime("%m-%d %H:%M:%S")


def make_run(tmp_path: Path) -> Path:
    """Four envs, two waves of 40 s episodes (64 steps, 4 calls each); the policy requests
    run from 40 s (the envs had started by 40 s) to 50 s: the serving window."""
    run = tmp_path / "runs" / "h200_cosmos3_e4"
    (run / "summary").mkdir(parents=True)
    rows = []
    for wave, start in ((0, 0.0), (1, 40.0)):
        for env in range(4):
            began = start + 2.5 * env * (1 - wave)  # first wave staggered 0-7.5 s
            rows.append(
                {
                    "protocol": "rlinf",
                    "steps": 64,
                    "policy_calls": 4,
                    "policy_latency_mean_s": 2.0,
                    "wall_time_s": 40.0,
                    "finished_at": T0 + began + 40.0,
                    "error": None,
                }
            )
    pd.DataFrame(rows).to_parquet(run / "summary" / "episodes.parquet")
    # 10 requests of 4 observations, one answered a second from 41 s to 50 s (the first sent
    # at 40 s); one of them failed
    requests = [[T0 + 39.0 + i, T0 + 40.0 + i, 4, i != 5] for i in range(1, 11)]
    requests[0][0] = T0 + 40.0
    (run / "shards").mkdir()
    log = {"requests": requests, "ended_at": T0 + 51.5}  # 1.5 s after its last answer
    (run / "shards" / "shard000.dispatch.json").write_text(json.dumps(log))
    timeline = {
        "capacity_obs_per_s": 4.0,
        "launch_to_server_launch_s": 2.0,
        "start_to_ready_s": 30.0,
        "envs_ready_s": 25.0,
        "ready_to_first_request_s": 8.0,
        "serving_s": 10.0,
        "last_answer_to_shard_end_s": 1.5,
        "shard_end_to_aggregate_s": 4.0,
        "wall_s": 55.5,
        "observations": 40,
        "bound_serving_s": 10.0,
        "bound_s": 40.0,
        "wall_over_bound": 55.5 / 40.0,
        # an env's query mid-run (libero_eval.analysis.env_time)
        "env_query_s": 0.4,
        "env_sim_s": 0.2,
        "env_render_s": 0.15,
        "env_handoff_s": 0.05,
        "env_cpu_s": 0.18,
        "env_start_render_s": 0.01,
    }
    pd.DataFrame([{"slot": 0, **timeline}]).to_csv(run / "summary" / "efficiency.csv")
    serve = run / run.name / "serve"
    serve.mkdir(parents=True)
    lines = [
        f"[{_stamp(30)}] [Cosmos3DenoisingStage] finished in 5.0 seconds",  # before the window
        f"[{_stamp(42)}] [Cosmos3DenoisingStage] finished in 3.0 seconds",
        f"[{_stamp(44)}] [Cosmos3DecodingStage] finished in 0.5 seconds",
        f"[{_stamp(46)}] [Cosmos3DenoisingStage] finished in 2.5 seconds",
        f"[{_stamp(52)}] [Cosmos3DenoisingStage] finished in 2.5 seconds",  # after it
        "[12-01 10:00:00] Batch admission enabled: user_max=8, device_memory=140.4GiB, rules=0",
    ]
    (serve / "slot0.log").write_text("\n".join(lines) + "\n")
    (run / run.name / "eval_embodiment.log").write_text(
        "2026-12-01 10:01:00 [report] slot 0: launch → report 60.0 s against a bound of 40.0 s\n"
    )
    samples = ((0, 615, 0, 0), (41, 40000, 39000, 80), (45, 45000, 44000, 90), (90, 615, 0, 0))
    gpu = [
        {
            "t": T0 + t,
            "used_mib": used,
            "server_mib": server,
            "renderer_mib": 0,
            "renderer_procs": 0,
            "server_procs": 1,
            "util": util,
        }
        for t, used, server, util in samples
    ]
    (run.parent / f"gpu_{run.name}.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gpu))
    return run


def test_rates_and_duty_come_from_the_serving_window_as_the_report_counts_it(tmp_path):
    result = workflow_run.analyze(make_run(tmp_path), None)
    # window: the first request (40 s) to the last answer (50 s), the report's
    assert result["window_s"] == 10.0
    # 36 observations answered ok (one request of 4 failed) in 10 s
    assert result["obs_per_s"] == 3.6
    # mid-run, the middle 80% (41-49 s): answers at 41, 42, 43, 44, 46, 47, 48, 49 s (45 failed)
    assert result["mid_obs_per_s"] == pytest.approx(8 * 4 / 8.0, abs=0.005)
    assert result["mid_of_capacity"] == 1.0
    # each episode's 64 steps spread over its 40 s, counted where it overlaps 40-50 s
    steps = sum(
        64 * max(0.0, min(end, 50) - max(end - 40, 40)) / 40
        for end in (40, 42.5, 45, 47.5, 80, 80, 80, 80)
    )
    assert result["steps_per_s"] == pytest.approx(steps / 10, abs=0.05)
    assert result["episodes_per_hour_full"] == round(4.0 * 3600 / 30)
    # stages that finished inside the window: 3.0 + 0.5 + 2.5 s of 10 s
    assert result["duty"] == pytest.approx(6.0 / 10, abs=0.001)
    assert result["batch_admission"].startswith("Batch admission enabled: user_max=8")
    assert (result["gpu_peak_mib"], result["server_peak_mib"]) == (45000, 44000)
    assert result["gpu_util_mean"] == 85.0  # the two samples inside the window
    assert result["gpu_after_mib"] == 615


def test_the_runs_timeline_bound_and_ratio_come_from_the_report(tmp_path):
    result = workflow_run.analyze(make_run(tmp_path), None)
    assert (result["start_to_ready_s"], result["ready_to_first_request_s"]) == (30.0, 8.0)
    assert (result["serving_s"], result["last_answer_to_shard_end_s"]) == (10.0, 1.5)
    assert (result["launch_to_aggregate_s"], result["bound_s"]) == (55.5, 40.0)
    assert result["ratio_aggregate"] == 1.39
    assert (result["launch_to_report_s"], result["ratio_report"]) == (60.0, 1.5)


def test_queries_per_episode_can_be_given(tmp_path):
    result = workflow_run.analyze(make_run(tmp_path), 44)
    assert result["episodes_per_hour_full"] == round(4.0 * 3600 / 44)


def test_the_done_table_takes_the_closed_loop_the_bench_measured_on_the_same_machine(
    tmp_path, capsys
):
    run = make_run(tmp_path)
    bench = tmp_path / "bench_cosmos3.json"
    bench.write_text(json.dumps({"saturated": {"requesters": 2, "obs_per_s": 5.0}}))
    assert workflow_run.main([str(run), "--done", "--bench", f"h200_cosmos3_={bench}"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| run | episodes | launch → report | server start → ready |")
    # the bound at the bench's rate: 30 s to ready + 40 observations at 5.0 obs/s = 38 s;
    # the report 60 s after launch: 1.58x; mid-run 4.0 obs/s is 80% of 5.0
    assert table[2] == (
        "| h200_cosmos3_e4 | 8 | 60 | 30 | 25 | 8.0 | 10 | 1.5 | 38 | 1.58 | 4.0 (80%) "
        "| 5.0 (bench bench_cosmos3.json) | 0.40 s: 0.20 / 0.150 (0.010) / 0.05 |"
    )
    workflow_run.main([str(run), "--done"])  # else the capacity probe's rate
    assert "| 40 | 1.50 | 4.0 (100%) | 4.0 (capacity probe) |" in capsys.readouterr().out


def test_a_run_that_did_not_finish_is_left_out_and_named(tmp_path, capsys):
    # a run the kit's deadline killed has no summary: the table shows the others
    run = make_run(tmp_path)
    killed = tmp_path / "h200_pi05lr_e48"
    (killed / "shards").mkdir(parents=True)
    assert workflow_run.main([str(killed), str(run), "--done"]) == 0
    out, err = capsys.readouterr()
    assert "| h200_cosmos3_e4 | 8 |" in out and "h200_pi05lr_e48" not in out
    assert f"{killed}: left out, no summary/episodes.parquet (it did not finish)" in err
    with pytest.raises(SystemExit, match="no finished run"):
        workflow_run.main([str(killed)])
