"""Where a run's wall time went (`libero_eval.analysis.timeline`), on plain numbers: the π0.5
openpi run of issue 39's table (one H200, main 2814e16), as its logs would have said it."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest
from test_efficiency import T0, capacity, dispatch

from libero_eval.analysis.efficiency import efficiency_markdown, efficiency_table, write_efficiency
from libero_eval.analysis.efficiency_inputs import (
    EfficiencyInputError,
    ServiceTimeline,
    read_service_timeline,
)
from libero_eval.analysis.timeline import (
    launch_epoch,
    launch_time,
    record_end,
    record_launch,
    slot_timeline,
    timeline_line,
)
from libero_eval.report.efficiency import efficiency_html, write_efficiency_html

LAUNCH = T0  # test_efficiency's dispatch logs count their requests from it
# the server: launched 3 s after the workflow, ready 96 s later (its probe included)
SERVER = ServiceTimeline(
    launch=LAUNCH + 3,
    ready=LAUNCH + 99,
    startup_parts={"process_start": 8.0, "weights": 41.5, "cuda_graphs": 9.2, "probe": 6.1},
)


def shard(name: str, envs_ready: float, first: float, last: float, end: float) -> dict:
    """A shard's dispatch log with the rollout side's "timeline" (offsets from the launch)."""
    at = {k: LAUNCH + v for k, v in dict(envs_ready=envs_ready, first_request=first).items()}
    return dispatch(name, 0, [(first, last, 1, True)]) | {
        "timeline": {
            "job_start": LAUNCH + 4,
            "envs_started": LAUNCH + 10,
            **at,
            "service_ready": LAUNCH + 100,
            "last_answer": LAUNCH + last,
            "shard_end": LAUNCH + end,
        }
    }


CHOSEN = {
    "envs_choice": {"envs": 32, "setting": "auto", "reason": "32 envs keep 2 batches queued"},
    "dispatch_choice": {
        "merged_dispatch": "as_ready",
        "setting": "auto",
        "reason": "each observation as it is ready",
    },
}


def openpi_run() -> list[dict]:
    # two shards of slot 0: the slot's envs are ready with the later shard's, it asks with the
    # earlier one, and answers and ends with the later one
    return [
        shard("shard000", envs_ready=139.0, first=148.0, last=199.0, end=221.0) | CHOSEN,
        shard("shard001", envs_ready=140.0, first=148.5, last=201.0, end=226.0) | CHOSEN,
    ]


def test_each_window_of_a_slot_and_its_bound():
    row = slot_timeline(openpi_run(), SERVER, LAUNCH, LAUNCH + 231, 2640, 67.7)
    assert row["timeline_origin"] == "workflow launch" and row["launch_at"] == LAUNCH
    assert (row["server_launch_s"], row["server_ready_s"], row["envs_ready_s"]) == (3, 99, 140)
    assert (row["first_request_s"], row["last_answer_s"], row["shard_end_s"]) == (148, 201, 226)
    assert row["aggregate_s"] == 231
    gaps = [
        row[k]
        for k in (
            "launch_to_server_launch_s",
            "start_to_ready_s",
            "ready_to_first_request_s",
            "serving_s",
            "last_answer_to_shard_end_s",
            "shard_end_to_aggregate_s",
        )
    ]
    assert gaps == [3, 96, 49, 53, 25, 5]
    assert sum(gaps) == row["wall_s"] == 231
    # the bound: the server's start to ready, and 2,640 observations at 67.7 obs/s
    assert row["bound_serving_s"] == pytest.approx(39.0, abs=0.01)
    assert row["bound_s"] == pytest.approx(135.0, abs=0.01)
    assert row["wall_over_bound"] == pytest.approx(231 / 135.0, abs=1e-3)
    assert row["startup_parts"] == "process_start=8 weights=41.5 cuda_graphs=9.2 probe=6.1"
    # the rollout's choices, with why (the dispatch logs), once for the slot's two shards
    assert row["envs_choice"] == "32 (setting auto): 32 envs keep 2 batches queued"
    assert row["dispatch_choice"] == "as_ready (setting auto): each observation as it is ready"


def test_an_older_runners_log_gives_its_requests_and_end_and_no_envs_ready():
    log = dispatch(requests=[(148, 150, 1, True), (190, 201, 1, True)]) | {"ended_at": LAUNCH + 226}
    row = slot_timeline([log], SERVER, LAUNCH, LAUNCH + 231, 2, 1.0)
    assert (row["first_request_s"], row["last_answer_s"], row["shard_end_s"]) == (148, 201, 226)
    assert math.isnan(row["envs_ready_s"])


def test_without_the_workflows_launch_the_wall_time_counts_from_the_servers_launch():
    """A training run's checkpoint: its event log has no launch line (its server waited for a
    GPU while other checkpoints ran), so its own time is its server's launch to aggregate."""
    row = slot_timeline(openpi_run(), SERVER, None, LAUNCH + 231, 2640, 67.7)
    assert row["timeline_origin"] == "server launch" and row["server_launch_s"] == 0
    assert row["start_to_ready_s"] == 96 and row["first_request_s"] == 145
    assert math.isnan(row["launch_to_server_launch_s"])
    assert row["wall_s"] == 231 - 3  # the server launched 3 s after the workflow
    assert row["bound_s"] == pytest.approx(135.0, abs=0.01)  # the bound needs no launch
    assert row["wall_over_bound"] == pytest.approx(228 / 135.0, abs=1e-3)
    line = timeline_line(row | {"slot": 0, "observations": 2640, "capacity_obs_per_s": 67.7})
    assert "; server launch → aggregate 228.0 s against a bound of 135" in line


def test_nothing_known_is_nothing_guessed():
    row = slot_timeline([dispatch()], None, None, LAUNCH, 0, math.nan)
    assert row["timeline_origin"] == "" and math.isnan(row["launch_at"])
    assert all(math.isnan(row[k]) for k in ("first_request_s", "bound_s", "wall_over_bound"))
    assert row["startup_parts"] == ""
    assert "Where the wall time went: unknown" in efficiency_markdown(
        efficiency_table([dispatch(requests=[(0, 1, 1, True)])], {})
    )


def test_the_summary_the_event_line_and_the_report_page_say_where_the_time_went():
    table = efficiency_table(
        openpi_run(), {0: capacity(obs_per_s=67.7)}, None, {0: SERVER}, LAUNCH, LAUNCH + 231
    )
    row = table.iloc[0].to_dict()
    markdown = efficiency_markdown(table)
    assert "#### Where the wall time went (from the workflow launch)" in markdown
    assert "| server start → ready | 96.0 | 99.0 | 96.0 (the server's own start) |" in markdown
    assert "| first request → last answer | 53.0 | 201.0 | 0.0 (2 observations" in markdown
    assert "| ready → first request | 49.0 | 148.0 |  |" in markdown
    assert "| **launch → aggregate** | **231.0** |" in markdown
    assert "Envs ready 140.0 s after the workflow launch, 41.0 s after the server" in markdown
    assert (
        "The server's start (its log and the serve job): process start 8.0 s, weights 41.5 s, "
        "CUDA graphs 9.2 s, capacity probe 6.1 s." in markdown
    )
    assert "\nEnvs: 32 (setting auto): 32 envs keep 2 batches queued.\n" in markdown
    assert "\nDispatch: as_ready (setting auto): each observation" in markdown
    line = timeline_line(row)
    assert line.startswith("slot 0 timeline: launch → server launch 3.0 s, server start → ready")
    assert "launch → aggregate 231.0 s against a bound of 96.0 s" in line
    page = efficiency_html(table, now=LAUNCH + 233)
    assert "<h2>Where the wall time went, slot 0</h2>" in page
    assert "<td>launch → report</td>" in page and "<td>233.0</td>" in page
    assert "(ratio 2.43)" in page  # 233 s against 96 s + 2 observations at 67.7 obs/s
    assert "<p>Envs: 32 (setting auto): 32 envs keep 2 batches queued</p>" in page


def test_the_launch_line_the_snakefile_writes_is_what_the_aggregate_reads(tmp_path):
    event_log = tmp_path / "logs" / "eval_embodiment.log"
    assert launch_time(event_log) is None
    record_launch(event_log)
    started = psutil.Process().create_time()
    assert launch_time(event_log) == pytest.approx(started, abs=0.01)
    # a resumed run launches again: the last launch counts
    with open(event_log, "a") as handle:
        handle.write("2026-12-03 10:00:00 [workflow] workflow launch: again (epoch 1234.5)\n")
    assert launch_time(event_log) == 1234.5
    assert "[workflow] workflow launch: snakemake (pid" in event_log.read_text()
    record_end(event_log)  # the onsuccess line: the whole workflow, its report included
    assert re.search(
        r"\[workflow\] workflow end: \d+\.\d s after its launch\n$", event_log.read_text()
    )


def test_the_launch_is_snakemakes_start_even_where_a_shell_execd_it_after_other_commands():
    # the process began with the shell (pip install first): its start is not the launch
    assert launch_epoch(created=1000.0, parsed_at=1050.0, cpu_s=1.2) == pytest.approx(1048.8)
    # a process that only computed until the workflow was parsed: its own start
    assert launch_epoch(created=1000.0, parsed_at=1002.0, cpu_s=1.2) == 1000.0
    assert launch_epoch(created=1000.0, parsed_at=1009.0, cpu_s=0.5) == 1000.0  # within the gap


def test_a_shell_execs_the_last_command_of_a_chain_in_its_own_process(tmp_path):
    # `bash -c 'a && b'` runs b in the shell's process (the README's demo command ends with
    # `&& .venv/bin/snakemake`), so the process's start is before `a`: what launch_epoch is for
    event_log = tmp_path / "eval_embodiment.log"
    code = (
        "import sys, time; parsed = (time.time(), time.process_time()); "
        "from libero_eval.analysis.timeline import launch_epoch, record_launch; "
        "import psutil; created = psutil.Process().create_time(); "
        "record_launch(sys.argv[1], 0, parsed); "
        "print(created, parsed[0], launch_epoch(created, *parsed, gap_s=1.0))"
    )
    command = f"sleep 2 && {sys.executable} -c '{code}' {event_log}"
    created, parsed_at, launch = map(
        float, subprocess.check_output(["bash", "-c", command]).split()
    )
    assert parsed_at - created >= 2.0  # the sleep ran in the same process, before Python
    assert created + 2.0 <= launch <= parsed_at  # with a 1 s gap: after the sleep
    # the default gap (10 s) keeps the process's start for a 2 s wait
    assert launch_time(event_log) == pytest.approx(created, abs=0.01)


def test_the_aggregate_step_and_the_report_rule_log_the_windows(tmp_path):
    event_log = tmp_path / "eval_embodiment.log"
    event_log.write_text(
        f"2026-12-03 10:00:00 [workflow] workflow launch: snakemake (epoch {time.time() - 50})\n"
    )
    shards = []
    for log in openpi_run():
        path = tmp_path / f"{log['shard']}.dispatch.json"
        path.write_text(json.dumps(log))
        shards.append(path)
    service = tmp_path / "slot0.json"
    probe = {"observations": 1, "requests": 1, "seconds": 0.5}
    service.write_text(
        json.dumps(
            {
                "capacity": {"max_batch_size": 1, "probes": [probe], "obs_per_s": 2.0},
                "timeline": {"launch": SERVER.launch, "healthy": None, "ready": SERVER.ready},
                "startup_parts": SERVER.startup_parts,
            }
        )
    )
    csv = tmp_path / "efficiency.csv"
    write_efficiency(shards, {0: service}, csv, tmp_path / "summary.md", event_log)
    frame = pd.read_csv(csv)
    assert frame["timeline_origin"].tolist() == ["workflow launch"]
    assert frame["start_to_ready_s"].tolist() == [96.0]
    assert "slot 0 timeline:" in event_log.read_text()
    write_efficiency_html(csv, tmp_path / "efficiency.html", event_log)
    assert "[report] slot 0: launch → report" in event_log.read_text()


def test_a_service_file_without_a_timeline_is_an_older_one_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "slot0.json"
    assert read_service_timeline(path) is None  # gone
    path.write_text(json.dumps({"status": "stopped"}))
    assert read_service_timeline(path) is None
    path.write_text(json.dumps({"timeline": {"launch": "soon"}}))
    with pytest.raises(EfficiencyInputError, match="slot0.json: its timeline needs epoch"):
        read_service_timeline(path)
