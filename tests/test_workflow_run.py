"""benchmarks/workflow_run.py: the steady window, rates, duty cycle and GPU peaks it reports
for a run (the H200 figures in docs/performance.md come from it)."""

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
    """Four envs, two waves of 40 s episodes (64 steps, 4 calls); the second wave starts as
    the first ends, so the steady window is the 10 s between the first end and last start."""
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
    # second-wave starts at 40, 42.5, 45, 47.5 s
    for i, row in enumerate(rows[4:]):
        row["finished_at"] = T0 + 40.0 + 2.5 * i + 40.0
    pd.DataFrame(rows).to_parquet(run / "summary" / "episodes.parquet")
    serve = run / run.name / "serve"
    serve.mkdir(parents=True)
    lines = [
        f"[{_stamp(30)}] [Cosmos3DenoisingStage] finished in 5.0 seconds",  # before the window
        f"[{_stamp(42)}] [Cosmos3DenoisingStage] finished in 3.0 seconds",
        f"[{_stamp(44)}] [Cosmos3DecodingStage] finished in 0.5 seconds",
        f"[{_stamp(46)}] [Cosmos3DenoisingStage] finished in 2.5 seconds",
        "[12-01 10:00:00] Batch admission enabled: user_max=8, device_memory=140.4GiB, rules=0",
    ]
    (serve / "slot0.log").write_text("\n".join(lines) + "\n")
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


def test_rates_and_duty_come_from_the_steady_window(tmp_path):
    result = workflow_run.analyze(make_run(tmp_path), None)
    # window: first end (40 s) to last start (47.5 s)
    assert result["window_s"] == 7.5
    # each episode's 64 steps and 4 calls spread over its 40 s; 30 episode-seconds overlap
    # the window (2.5 + 5 + 7.5 of the first wave, 7.5 + 5 + 2.5 of the second)
    assert result["steps_per_s"] == pytest.approx(64 * 30 / 40 / 7.5, abs=0.05)
    assert result["obs_per_s"] == pytest.approx(4 * 30 / 40 / 7.5, abs=0.005)
    assert result["episodes_per_hour_full"] == round(0.4 * 3600 / 30)
    # stages that finished inside the window: 3.0 + 0.5 + 2.5 s of 7.5 s
    assert result["duty"] == pytest.approx(6.0 / 7.5, abs=0.001)
    assert result["batch_admission"].startswith("Batch admission enabled: user_max=8")
    assert (result["gpu_peak_mib"], result["server_peak_mib"]) == (45000, 44000)
    assert result["gpu_util_mean"] == 85.0  # the two samples inside the window
    assert result["gpu_after_mib"] == 615


def test_queries_per_episode_can_be_given(tmp_path):
    result = workflow_run.analyze(make_run(tmp_path), 44)
    assert result["episodes_per_hour_full"] == round(0.4 * 3600 / 44)
