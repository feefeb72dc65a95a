"""A run's GPU efficiency per server slot, from hand-made dispatch logs with known answers."""

import json
import math

import pandas as pd
import pytest
from conftest import make_record

from libero_eval.analysis.diagnosis import diagnose
from libero_eval.analysis.efficiency import (
    busy_seconds,
    efficiency_line,
    efficiency_markdown,
    efficiency_table,
    slot_efficiency,
    write_efficiency,
)
from libero_eval.analysis.efficiency_inputs import (
    Capacity,
    EfficiencyInputError,
    ServeLog,
    read_capacity,
    read_dispatch_log,
    read_serve_log,
)
from libero_eval.plan import Episode
from libero_eval.store import EpisodeStore

T0 = 1_700_000_000.0


def dispatch(shard="shard000", slot=0, requests=(), waiting=0.0, stepping=0.0, **extra) -> dict:
    """A dispatch log as the runner writes it; `requests` as (sent, answered, obs, ok) offsets."""
    return {
        "shard": shard,
        "slot": slot,
        "server_url": f"http://127.0.0.1:{30000 + slot}",
        "envs": 4,
        "max_batch_size": 4,
        "max_inflight_requests": 2,
        "started_at": T0,
        "ended_at": T0 + 100,
        "requests": [[T0 + r[0], T0 + r[1], *r[2:]] for r in requests],
        "env_seconds": {"waiting": waiting, "stepping": stepping},
        "reused_episodes": 0,
        "episodes_run": 2,
    } | extra


def capacity(obs_per_s=4.0, probes=((1, 1, 1.0), (4, 1, 2.5))) -> Capacity:
    frame = pd.DataFrame(probes, columns=["observations", "requests", "seconds"])
    return Capacity(max_batch_size=4, obs_per_s=obs_per_s, probes=frame)


def test_busy_time_is_the_union_of_overlapping_and_disjoint_intervals():
    assert busy_seconds(pd.DataFrame([[0, 2], [1, 3], [5, 6], [5.5, 5.8]]).to_numpy()) == 4.0
    assert busy_seconds(pd.DataFrame([[5, 6], [0, 1]]).to_numpy()) == 2.0  # any order
    assert busy_seconds(pd.DataFrame([[0, 1], [1, 2]]).to_numpy()) == 2.0  # touching
    assert busy_seconds(pd.DataFrame(columns=[0, 1]).to_numpy()) == 0.0


def test_one_slot_figures_with_overlapping_requests_and_a_failure():
    # in flight: [0, 2] and [1, 3] overlap, [6, 10] alone; busy 7 of a 10 s span
    log = dispatch(
        requests=[(0, 2, 4, True), (1, 3, 2, True), (6, 10, 4, False)], waiting=15, stepping=20
    )
    row = slot_efficiency([log], capacity(obs_per_s=4.0))
    assert row["requests"] == 3 and row["failed_requests"] == 1
    assert row["observations"] == 10 and row["observations_ok"] == 6
    assert row["span_s"] == 10.0
    assert row["obs_per_s"] == pytest.approx(0.6)  # answered ok / span
    assert row["mean_batch"] == pytest.approx(10 / 3)
    assert row["batch_fill"] == pytest.approx(10 / 3 / 4)
    assert row["duty"] == pytest.approx(0.7)
    assert row["latency_p50_s"] == 2.0 and row["latency_p95_s"] == 2.0  # ok requests only
    assert row["latency_mean_s"] == 2.0
    assert row["envs_waiting"] == 0.15 and row["envs_stepping"] == 0.2  # over the shard's 100 s
    assert row["capacity_obs_per_s"] == 4.0
    assert row["capacity_fraction"] == pytest.approx(0.15)


def test_latency_percentiles_interpolate():
    log = dispatch(requests=[(i, i + 1 + i, 1, True) for i in range(5)])  # latencies 1..5
    row = slot_efficiency([log], None)
    assert row["latency_p50_s"] == 3.0 and row["latency_p95_s"] == pytest.approx(4.8)


def test_shards_of_one_slot_merge_and_slots_stay_apart():
    logs = [
        dispatch("shard000", 0, [(0, 1, 4, True)], waiting=4, stepping=8),
        dispatch("shard001", 0, [(3, 4, 4, True)], waiting=4, stepping=8),
        dispatch("shard002", 1, [(0, 2, 2, True), (2, 4, 2, True)]),
    ]
    table = efficiency_table(logs, {0: capacity(obs_per_s=4.0)})
    assert table["slot"].tolist() == [0, 1]
    zero, one = table.to_dict("records")
    assert zero["shards"] == "shard000 shard001" and zero["envs"] == 8
    assert zero["span_s"] == 4.0 and zero["obs_per_s"] == 2.0 and zero["duty"] == 0.5
    assert zero["envs_waiting"] == 0.08 and zero["envs_stepping"] == 0.16
    assert zero["capacity_fraction"] == 0.5
    assert one["obs_per_s"] == 1.0 and one["duty"] == 1.0 and one["batch_fill"] == 0.5
    assert math.isnan(one["capacity_fraction"]) and one["warning"] == ""  # unknown, no guess


def test_a_slot_whose_episodes_were_all_reused_has_no_rates():
    reused = dispatch(requests=[], reused_episodes=2, episodes_run=0)
    row = efficiency_table([reused], {0: capacity()}).iloc[0]
    assert row["requests"] == 0 and row["span_s"] == 0
    assert math.isnan(row["obs_per_s"]) and math.isnan(row["capacity_fraction"])
    assert row["warning"] == ""
    assert efficiency_line(row) == (
        "slot 0 efficiency: no policy requests: all 2 episodes reused from the store"
    )
    assert "No policy requests: all 2 episodes reused" in efficiency_markdown(pd.DataFrame([row]))
    unrecorded = efficiency_table([dispatch(requests=[])], {}).iloc[0]  # 2 run, none recorded
    assert "no policy requests recorded for 2 episodes run" in efficiency_line(unrecorded)
    # a reused shard next to a running one adds nothing to its slot's figures
    merged = efficiency_table([reused, dispatch("shard001", 0, [(0, 1, 4, True)])], {})
    assert merged.iloc[0]["obs_per_s"] == 4.0 and merged.iloc[0]["envs"] == 4


def test_an_envs_query_splits_into_simulating_rendering_and_hand_off_over_the_mid_run():
    # serving from T0 + 0 to T0 + 100: the mid-run window is T0 + 10 .. T0 + 90
    work = [
        # received_at, command, shard_s, wall_s, cpu_s, render_s
        [T0 - 5, "start", None, 1.0, 0.9, 0.01],  # before the server was ready (T0 - 2)
        [T0 + 1, "start", None, 1.0, 0.9, 0.03],  # after it: not the baseline
        [T0 + 5, "chunk", 0.2, 0.18, 0.15, 0.01],  # before the mid-run window
        [T0 + 50, "chunk", 0.4, 0.3, 0.2, 0.1],
        [T0 + 60, "chunk", 0.6, 0.5, 0.2, 0.3],
    ]
    log = dispatch(requests=[(0, 100, 4, True)], env_work=work, timeline={"service_ready": T0 - 2})
    table = efficiency_table([log], {0: capacity()})
    row = table.iloc[0]
    assert row["env_query_s"] == pytest.approx(0.5)
    assert row["env_render_s"] == pytest.approx(0.2)
    assert row["env_sim_s"] == pytest.approx(0.2)
    assert row["env_handoff_s"] == pytest.approx(0.1)
    assert row["env_cpu_s"] == pytest.approx(0.2)
    assert row["env_start_render_s"] == pytest.approx(0.01)
    shown = efficiency_markdown(table)
    assert "| an env's query, mid-run (in its worker) | 0.50 s: 0.20 simulating, 0.200 " in shown
    assert "rendering (0.010 before the server was ready), 0.10 hand-off; 0.20 s of CPU |" in shown

    # envs that render every step: no rendering figure, simulating holds it
    every_step = [[T0 + 50, "chunk", 0.4, 0.3, 0.2, None]]
    table = efficiency_table([dispatch(requests=[(0, 100, 4, True)], env_work=every_step)], {})
    row = table.iloc[0]
    assert math.isnan(row["env_render_s"]) and row["env_sim_s"] == pytest.approx(0.3)
    assert "0.30 simulating and rendering (every step)" in efficiency_markdown(table)
    # a log written before env_work was recorded: unknown, not shown
    table = efficiency_table([dispatch(requests=[(0, 100, 4, True)])], {})
    assert math.isnan(table.iloc[0]["env_query_s"])
    assert "an env's query" not in efficiency_markdown(table)


# --------------------------------------------------------------------------- verdict


def figures(**values) -> dict:
    healthy = {
        "slot": 0,
        "capacity_fraction": 0.5,
        "latency_mean_s": 2.0,
        "predicted_latency_s": 2.0,
        "duty": 0.99,
        "batch_fill": 1.0,
        "envs_waiting": 12.0,
        "envs_stepping": 4.0,
    }
    return healthy | values


def test_verdict_none_at_capacity_or_when_it_is_unknown():
    assert diagnose(figures(capacity_fraction=0.8)) is None
    assert diagnose(figures(capacity_fraction=math.nan)) is None


def test_verdict_slowed_server_when_latency_is_well_above_the_probes():
    verdict = diagnose(figures(latency_mean_s=3.5, batch_fill=0.2))
    assert verdict.cause == "slowed_server"
    assert "server.cpu_threads" in verdict.message and "fewer envs per node" in verdict.message


def test_verdict_too_few_envs_comes_first_when_the_server_waits_anyway():
    # the CPU demo: an idle reference server answers in 0.03 s against 0.01 s probed
    verdict = diagnose(figures(duty=0.05, latency_mean_s=0.03, predicted_latency_s=0.01))
    assert verdict.cause == "envs_short"


def test_verdict_too_few_envs_when_the_server_waits():
    verdict = diagnose(figures(duty=0.5, predicted_latency_s=math.nan))  # no fit: skip (a)
    assert verdict.cause == "envs_short"
    assert "rollout.total_num_envs" in verdict.message and "envs_per_shard" in verdict.message


def test_verdict_unfilled_batches_when_busy_but_not_full():
    verdict = diagnose(figures(batch_fill=0.5))
    assert verdict.cause == "batches_unfilled"
    assert "plan.num_trials_per_task" in verdict.message


def test_verdict_slow_envs_when_batches_leave_partial_while_the_envs_step():
    # the CPU benchmark's cell: 6 envs on 2 cores, a group of 3 split 1 + 2 over and over
    verdict = diagnose(figures(batch_fill=0.6, envs_waiting=3.3, envs_stepping=3.9))
    assert verdict.cause == "envs_slow"
    assert "rollout.total_num_envs" in verdict.message
    assert "a prompt's envs" in verdict.message  # a request carries one prompt's batch


def test_slow_envs_whose_renders_wait_on_the_shared_gpu_are_told_to_render_elsewhere():
    split = {
        "env_query_s": 0.40,
        "env_sim_s": 0.20,
        "env_handoff_s": 0.02,
        "env_start_render_s": 0.01,
    }
    slow = figures(batch_fill=0.6, envs_waiting=3.3, envs_stepping=3.9, **split)
    waiting = diagnose(slow | {"env_render_s": 0.18}).message
    assert "An env's query took 0.40 s mid-run: 0.20 s simulating, 0.180 s rendering" in waiting
    assert "(0.010 s before the server was ready), 0.02 s in the pipes" in waiting
    assert "rollout.render_device" in waiting
    # renders as fast as with the GPU idle: the split is told, no render advice
    quick = diagnose(slow | {"env_render_s": 0.015}).message
    assert "0.015 s rendering" in quick and "rollout.render_device" not in quick
    # no baseline (the server was ready before any env): no claim about waiting
    unknown = diagnose(slow | {"env_render_s": 0.18, "env_start_render_s": math.nan}).message
    assert "rollout.render_device" not in unknown


def test_verdict_unexplained_otherwise():
    assert diagnose(figures()).cause == "unexplained"


def test_verdict_unexplained_names_the_server_as_the_bound_when_it_always_had_work():
    # the H200 runs beside 32 envs: duty 99%, full batches, the server's pace below its probe
    busy = diagnose(figures(duty=0.99)).message
    assert "the server always had work" in busy and "more envs per GPU" in busy
    assert "Where the server's time goes" in busy
    assert "always had work" not in diagnose(figures(duty=0.9)).message


def test_verdict_judges_a_slowed_server_by_its_pace_where_the_run_had_full_batches():
    # the LeRobot lineage on the H200: latency 0.31 s against 0.18 s predicted (the wait behind
    # the other batch in flight), its full batches 0.28 s against 0.22 s: not slowed
    lerobot = dict(latency_mean_s=0.31, predicted_latency_s=0.18, batch_fill=0.64)
    assert diagnose(figures(**lerobot)).cause == "slowed_server"  # by latency alone
    paced = diagnose(figures(**lerobot, full_batch_s=0.28, probe_full_batch_s=0.22))
    assert paced.cause == "batches_unfilled"
    slowed = diagnose(figures(full_batch_s=0.5, probe_full_batch_s=0.22))
    assert (
        slowed.cause == "slowed_server" and "a full batch took 0.50 s vs 0.22 s" in slowed.message
    )
    unexplained = diagnose(figures(full_batch_s=0.30, probe_full_batch_s=0.24)).message
    assert "its full batches took 0.30 s against 0.24 s at the probe" in unexplained


def test_a_runs_pace_comes_from_full_server_batches_it_had_queued():
    # merged one-observation requests (batch 4): answers within 15 ms are one server batch
    def merged(sent, answered, n=4, spread=0.005):
        return [(sent, answered + i * spread / n, 1, True, f"b{sent}", T0 + sent) for i in range(n)]

    requests = [
        *merged(0.0, 1.0),  # the first batch: nothing before it to time it from
        *merged(0.5, 2.2),  # queued (left at 0.5, before 1.0): 1.2 s
        *merged(1.5, 3.2),  # queued: 1.0 s
        *merged(3.5, 4.9),  # left after the previous answer (3.2): the server waited, untimed
        *merged(4.0, 5.4, n=3),  # partial: untimed
    ]
    row = slot_efficiency(
        [dispatch(requests=requests, max_batch_size=1, server_batch=4)], capacity()
    )
    assert row["full_batch_s"] == pytest.approx(1.1, abs=1e-6)  # median of 1.2 and 1.0
    assert row["probe_full_batch_s"] == pytest.approx(2.5)  # the probes' fit at 4
    # a server that takes whole batches in one request (Cosmos3): each answer its own batch
    whole = [(0, 1, 4, True), (0.5, 2.0, 4, True), (1.5, 3.5, 4, True)]
    assert slot_efficiency([dispatch(requests=whole)], capacity())["full_batch_s"] == pytest.approx(
        1.25,
        abs=1e-6,  # the median of 1.0 and 1.5
    )
    alone = slot_efficiency([dispatch(requests=[(0, 1, 4, True)])], None)
    assert math.isnan(alone["full_batch_s"]) and math.isnan(alone["probe_full_batch_s"])


# A π0.5 server's log as SGLang 0.5.23 writes it (lines from a run on the H200, shortened):
# warm-up and capacity probe, the serve job's ready line, then captures while serving.
SERVE_LOG = """\
[12-02 00:53:56] Pi05 memory config: prefix_cache=False/1, cuda_graph=prefix:True/1 action:True/4
[12-02 00:54:20] Captured VLA prefix CUDA graph: batch=1 inputs=((1, 3, 224, 224),) (capacity=1)
[12-02 00:54:22] Captured VLA denoise CUDA graph: batch=1 prefix=770 action=10x32 (capacity=4)
[12-02 00:54:26] Captured VLA denoise CUDA graph: batch=16 prefix=770 action=10x32 (capacity=4)
{reached}[libero_eval.serve.job] slot 0: ready at http://127.0.0.1:60191 after 73.1 s
[12-02 00:55:01] Captured VLA denoise CUDA graph: batch=16 prefix=786 action=10x32 (capacity=4)
[12-02 00:55:02] Captured VLA denoise CUDA graph: batch=3 prefix=786 action=10x32 (capacity=4)
"""
REACHED = (
    "[12-02 00:54:27] VLA denoise CUDA graph capacity reached (4); new signatures run eagerly\n"
)


def test_the_serve_log_gives_graphs_captured_while_serving_and_the_capacity_reached(tmp_path):
    log = tmp_path / "slot0.log"
    log.write_text(SERVE_LOG.format(reached=REACHED))
    assert read_serve_log(log) == ServeLog(True, 2, 4, ())
    log.write_text(SERVE_LOG.format(reached=""))
    assert read_serve_log(log) == ServeLog(True, 2, None, ())
    log.write_text("[libero_eval.serve.job] slot 0: ready at http://127.0.0.1:1 after 1.0 s\n")
    assert read_serve_log(log) is None  # a server without CUDA graphs (the reference)
    assert read_serve_log(tmp_path / "missing.log") is None


# SGLang 0.5.23's lines for the batches it merged (runtime/managers/scheduler.py), as an H200
# serve log has them: the warm-up's and the capacity probe's before the "ready" line
BATCH_LOG = """\
[12-02 06:58:38] Processed native grouped batch of 16/16 request(s) with max_delay=0.00ms
[libero_eval.serve.job] slot 0: ready at http://127.0.0.1:46201 after 62.1 s
[12-02 06:59:29] Processed native grouped batch of 12/16 request(s) with max_delay=0.00ms
[2026-12-02 06:59:29] INFO:     127.0.0.1:50780 - "POST /v1/actions/generations HTTP/1.1" 200 OK
[12-02 06:59:29] Processed native grouped batch of 4/16 request(s) with max_delay=0.00ms
[12-02 06:59:30] Processed native grouped batch sequentially: 16/16 request(s) with max_delay=0.00ms
[12-02 06:59:31] Processed dynamic batch of 8/16 request(s) with max_delay=100.00ms
"""


def test_the_serve_log_gives_the_batches_the_server_merged_while_serving(tmp_path):
    log = tmp_path / "slot0.log"
    log.write_text(BATCH_LOG)
    assert read_serve_log(log) == ServeLog(False, 0, None, (12, 4, 16, 8))
    slot = dispatch(
        requests=[(0, 1, 1, True, 0), (0, 1, 1, True, 0), (1, 2, 1, True, 1)],
        max_batch_size=1,
        server_batch=16,
    )
    row = efficiency_table([slot], {0: capacity(obs_per_s=4.0)}, {0: read_serve_log(log)}).iloc[0]
    assert (row["server_batches"], row["server_mean_batch"]) == (4, 10.0)
    assert math.isnan(row["graphs_captured_serving"])  # the log has batches, no CUDA graphs
    markdown = efficiency_markdown(pd.DataFrame([row]))
    assert "| server batches (serve log) | 4, 10.00 requests each on average (of 16) |" in markdown
    from libero_eval.report.efficiency import write_efficiency_html

    pd.DataFrame([row]).to_csv(tmp_path / "e.csv", index=False)
    write_efficiency_html(tmp_path / "e.csv", tmp_path / "efficiency.html")
    page = (tmp_path / "efficiency.html").read_text()
    assert "server mean batch (its log)" in page and "<td>10.00</td>" in page
    plain = efficiency_table([slot], {0: capacity(obs_per_s=4.0)}).iloc[0]
    assert math.isnan(plain["server_batches"]) and math.isnan(plain["server_mean_batch"])
    assert "server batches" not in efficiency_markdown(pd.DataFrame([plain]))


def test_a_merging_servers_batch_fill_is_its_own_batches_and_low_fill_asks_for_envs():
    # π0.5: one-observation requests leave as they are ready; what fills is the server's
    # batch (its log: 12, 4, 16, 8 of 16), not the requests that left together
    slot = dispatch(
        requests=[(0, 1, 1, True, 0), (0, 1, 1, True, 1), (1, 2, 1, True, 2)],
        max_batch_size=1,
        server_batch=16,
    )
    served = ServeLog(False, 0, None, (12, 4, 16, 8))
    row = efficiency_table([slot], {0: capacity(obs_per_s=4.0)}, {0: served}).iloc[0]
    assert row["mean_batch"] == 10.0 and row["batch_fill"] == pytest.approx(10 / 16)
    # without its log, the answers that came together: 2 at t=1, 1 at t=2
    plain = efficiency_table([slot], {0: capacity(obs_per_s=4.0)}).iloc[0]
    assert plain["mean_batch"] == 1.5 and plain["batch_fill"] == pytest.approx(1.5 / 16)
    # a merging server takes any prompts: low fill means the envs, never too few trials
    verdict = diagnose(figures(max_batch_size=1, server_batch=16, batch_fill=0.5, envs_waiting=9.0))
    assert verdict.cause == "envs_slow"
    assert "batching_delay_ms" not in verdict.message
    assert "prompt" not in verdict.message  # its batch waits on no prompt's envs
    assert diagnose(figures(batch_fill=0.5, envs_waiting=9.0)).cause == "batches_unfilled"


def test_verdict_graphs_exhausted_before_a_slowed_server():
    # the H200 baseline: latency 1.55x the probe's, which had its graphs; the run had none
    verdict = diagnose(figures(latency_mean_s=3.5, graph_capacity_reached=4))
    assert verdict.cause == "graphs_exhausted"
    assert "server.sglang.pipeline_config" in verdict.message
    assert "CUDA graph capacity reached (4)" in verdict.message
    assert diagnose(figures(latency_mean_s=3.5, graph_capacity_reached=math.nan)).cause == (
        "slowed_server"
    )
    assert diagnose(figures(capacity_fraction=0.9, graph_capacity_reached=4)) is None


def test_verdict_unexplained_names_graphs_captured_while_serving():
    assert (
        "captured 14 CUDA graphs while serving"
        in diagnose(figures(graphs_captured_serving=14)).message
    )
    assert "CUDA graphs" not in diagnose(figures(graphs_captured_serving=0)).message


def test_graph_figures_reach_the_table_and_the_summary(tmp_path):
    log = tmp_path / "slot0.log"
    log.write_text(SERVE_LOG.format(reached=REACHED))
    slow = dispatch(requests=[(0, 4, 4, True), (4, 8, 4, True)])
    table = efficiency_table([slow], {0: capacity(obs_per_s=4.0)}, {0: read_serve_log(log)})
    row = table.iloc[0]
    assert row["graphs_captured_serving"] == 2 and row["graph_capacity_reached"] == 4
    assert row["cause"] == "graphs_exhausted"
    assert "| CUDA graphs (serve log) | 2 captured while serving; capacity reached (4) |" in (
        efficiency_markdown(table)
    )
    plain = efficiency_table([slow], {0: capacity(obs_per_s=4.0)}).iloc[0]
    assert math.isnan(plain["graphs_captured_serving"]) and plain["cause"] == "slowed_server"
    assert "CUDA graphs (serve log)" not in efficiency_markdown(pd.DataFrame([plain]))


def test_the_probe_fit_predicts_latency_at_the_runs_batch():
    # probes: 1 obs 1.0 s, 4 obs 2.5 s -> 0.5 + 0.5 n; one request of 4 at a time
    assert capacity().latency_fit() == pytest.approx((0.5, 0.5))
    slow = dispatch(requests=[(0, 4, 4, True), (4, 8, 4, True)])  # 4 s each, 2.5 predicted
    row = slot_efficiency([slow], capacity(obs_per_s=4.0))
    assert row["predicted_latency_s"] == pytest.approx(2.5)
    assert row["cause"] == "slowed_server" and "at 25% of" in row["warning"]  # 1 obs/s of 4
    single = Capacity(
        4, 4.0, pd.DataFrame([[4, 1, 2.0]], columns=["observations", "requests", "seconds"])
    )
    assert single.latency_fit() is None


# --------------------------------------------------------------------------- files


def test_bad_dispatch_logs_name_the_file_and_the_fix(tmp_path):
    path = tmp_path / "shard000.dispatch.json"
    log = dispatch()
    del log["env_seconds"]
    path.write_text(json.dumps(log))
    with pytest.raises(EfficiencyInputError, match=r"shard000.dispatch.json.*env_seconds.*rerun"):
        read_dispatch_log(path)
    path.write_text(json.dumps(dispatch() | {"requests": [[T0, T0 + 1, 2]]}))
    with pytest.raises(EfficiencyInputError, match=r"requests\[0\]"):
        read_dispatch_log(path)
    path.write_text("{")
    with pytest.raises(EfficiencyInputError, match="not JSON"):
        read_dispatch_log(path)
    with pytest.raises(EfficiencyInputError, match="no dispatch log"):
        read_dispatch_log(tmp_path / "missing.json")


def test_capacity_is_read_from_the_service_file_or_unknown(tmp_path):
    service = tmp_path / "slot0.json"
    assert read_capacity(service) is None  # no file
    service.write_text(json.dumps({"url": "http://x", "status": "stopped"}))
    assert read_capacity(service) is None  # no probe
    probe = {"max_batch_size": 8, "probes": [{"observations": 1, "requests": 1, "seconds": 0.84}]}
    service.write_text(json.dumps({"capacity": probe}))
    with pytest.raises(EfficiencyInputError, match="slot0.json.*obs_per_s"):
        read_capacity(service)
    service.write_text(json.dumps({"capacity": probe | {"obs_per_s": 3.7}}))
    read = read_capacity(service)
    assert read.obs_per_s == 3.7 and read.probes["seconds"].tolist() == [0.84]


def test_the_aggregate_step_writes_the_csv_the_markdown_section_and_log_lines(tmp_path):
    shards, servers = tmp_path / "shards", tmp_path / "servers"
    shards.mkdir()
    servers.mkdir()
    logs = {
        "shard000": dispatch("shard000", 0, [(0, 2, 4, True), (2, 4, 4, True)], 200, 200),
        "shard001": dispatch("shard001", 1, [(0, 2, 4, True), (6, 8, 4, True)], 200, 200),
    }
    for name, log in logs.items():
        (shards / f"{name}.dispatch.json").write_text(json.dumps(log))
    probe = {"observations": 4, "requests": 1, "seconds": 2.0}
    (servers / "slot0.json").write_text(
        json.dumps({"capacity": {"max_batch_size": 4, "probes": [probe], "obs_per_s": 2.0}})
    )
    (servers / "slot1.json").write_text(
        json.dumps({"capacity": {"max_batch_size": 4, "probes": [probe], "obs_per_s": 2.0}})
    )
    markdown = tmp_path / "summary.md"
    markdown.write_text("# LIBERO evaluation `r`\n")
    event_log = tmp_path / "eval_embodiment.log"
    table = write_efficiency(
        sorted(shards.glob("*.dispatch.json")),
        {0: servers / "slot0.json", 1: servers / "slot1.json", 2: servers / "slot2.json"},
        tmp_path / "efficiency.csv",
        markdown,
        event_log,
    )
    csv = pd.read_csv(tmp_path / "efficiency.csv")
    assert csv["slot"].tolist() == [0, 1] and csv["obs_per_s"].tolist() == [2.0, 1.0]
    assert csv["capacity_fraction"].tolist() == [1.0, 0.5]
    assert csv["cause"].fillna("").tolist() == ["", "envs_short"]
    assert table["duty"].tolist() == [1.0, 0.5]
    text = markdown.read_text()
    assert text.startswith("# LIBERO evaluation `r`\n")  # appended, the summary kept
    assert "## Efficiency" in text and "### Slot 0" in text and "### Slot 1" in text
    assert "| fraction of capacity | 100% |" in text and "**Warning:** slot 1" in text
    lines = event_log.read_text().splitlines()
    assert "[aggregate] slot 0 efficiency: 2.00 obs/s (100% of 2.00 capacity)" in lines[0]
    assert "batch fill 1.00, duty 1.00, latency p50 2.0 s p95 2.0 s" in lines[0]
    assert "envs waiting 2.0 / stepping 2.0" in lines[0]
    assert "slot 1 efficiency: 1.00 obs/s (50% of 2.00 capacity)" in lines[1]
    assert "WARNING: slot 1 ran at 50%" in lines[2] and "rollout.total_num_envs" in lines[2]
    assert len(lines) == 3


def test_a_service_file_snakemake_removed_is_read_from_the_shards_copy(tmp_path):
    """Snakemake removes a service output when its group job ends, which can come before the
    serve job's last write (a server left running stops at once): the aggregate step then
    reads the service file as the shard saw it at ready, kept in its dispatch log."""
    probe = {"observations": 4, "requests": 1, "seconds": 2.0}
    seen = {
        "capacity": {"max_batch_size": 4, "probes": [probe], "obs_per_s": 2.0},
        "timeline": {"launch": T0 - 30, "healthy": T0 - 5, "ready": T0 - 2},
        "startup_parts": {"health": 25.0, "probe": 3.0},
    }
    path = tmp_path / "shard000.dispatch.json"
    path.write_text(json.dumps(dispatch(requests=[(0, 2, 4, True)], server=seen)))
    service = tmp_path / "slot0.json"  # gone
    row = write_efficiency([path], {0: service}, tmp_path / "e.csv").iloc[0]
    assert row["capacity_obs_per_s"] == 2.0 and row["capacity_fraction"] == 1.0
    assert row["start_to_ready_s"] == pytest.approx(28.0)
    assert row["startup_parts"] == "health=25 probe=3"
    # where the serve job wrote it again as it stopped, the file is read
    service.write_text(json.dumps(seen | {"capacity": seen["capacity"] | {"obs_per_s": 4.0}}))
    assert (
        write_efficiency([path], {0: service}, tmp_path / "e.csv").iloc[0]["capacity_obs_per_s"]
        == 4.0
    )


def test_without_capacity_the_fraction_is_reported_unknown(tmp_path):
    path = tmp_path / "shard000.dispatch.json"
    path.write_text(json.dumps(dispatch(requests=[(0, 1, 1, True)])))
    markdown, event_log = tmp_path / "summary.md", tmp_path / "events.log"
    write_efficiency([path], {}, tmp_path / "e.csv", markdown, event_log)
    assert "| fraction of capacity | unknown (no capacity probe) |" in markdown.read_text()
    assert "capacity unknown" in event_log.read_text()
    assert "WARNING" not in event_log.read_text()


def test_a_reused_shard_writes_a_dispatch_log_without_requests(tmp_path, default_config):
    """run_shard(dispatch_log=...) on a shard whose episodes are all in the store: no server,
    no env, a readable log with empty requests."""
    from libero_eval.config import RunSettings
    from libero_eval.rollout.shard_run import run_shard

    episodes = [Episode("libero_spatial", 0, 0), Episode("libero_spatial", 0, 1)]
    store = EpisodeStore(tmp_path / "episodes")
    for ep in episodes:
        store.write(ep, make_record(suite=ep.suite, task_id=0, init_state_id=ep.init_state_id))
    settings = RunSettings(default_config).shard_settings("shard000", 0, 1)
    path = tmp_path / "shard000.dispatch.json"
    run_shard(episodes, settings, store, "", tmp_path / "s.parquet", False, dispatch_log=path)
    log = read_dispatch_log(path)
    assert log["requests"] == [] and log["reused_episodes"] == 2 and log["episodes_run"] == 0
    assert efficiency_table([log], {}).iloc[0]["requests"] == 0


def test_the_report_page_shows_each_slot_and_its_warning(tmp_path):
    from libero_eval.report.efficiency import write_efficiency_html

    logs = [dispatch("shard000", 0, [(0, 2, 4, True)]), dispatch("shard001", 1, [(0, 1, 1, True)])]
    efficiency_table(logs, {1: capacity(obs_per_s=4.0)}).to_csv(tmp_path / "e.csv", index=False)
    write_efficiency_html(tmp_path / "e.csv", tmp_path / "report" / "efficiency.html")
    page = (tmp_path / "report" / "efficiency.html").read_text()
    assert "<td>http://127.0.0.1:30000</td>" in page and "<td>http://127.0.0.1:30001</td>" in page
    assert "<td>unknown</td>" in page and "<td>25%</td>" in page  # slot 0 unknown, slot 1 1/4
    assert "<h2>Warnings</h2>" in page and "slot 1 ran at 25%" in page


def test_merged_requests_fill_the_server_batch_they_were_sent_in():
    # π0.5: one observation per request, 4 requests a server batch (batch ids 1 and 2)
    requests = [(0, 1, 1, True, 1)] * 4 + [(1, 2, 1, True, 2)] * 2
    log = dispatch(requests=requests, max_batch_size=1, server_batch=4)
    row = slot_efficiency([log], None)
    assert row["requests"] == 6 and row["server_batch"] == 4
    assert row["mean_batch"] == 3.0 and row["batch_fill"] == 0.75


def test_send_spread_is_how_long_a_merged_batchs_requests_took_to_leave():
    # batch 0: two one-observation requests leaving 50 ms apart (built one after another at
    # sending); batch 1: 10 ms apart; a batch of one request has no spread
    slot = dispatch(
        requests=[
            (0, 1, 1, True, 0, T0 + 0.00),
            (0, 1, 1, True, 0, T0 + 0.05),
            (1, 2, 1, True, 1, T0 + 1.00),
            (1, 2, 1, True, 1, T0 + 1.01),
            (2, 3, 1, True, 2, T0 + 2.00),
        ],
        max_batch_size=1,
        server_batch=2,
    )
    row = efficiency_table([slot], {}).iloc[0]
    assert row["send_spread_ms"] == pytest.approx(30.0)
    assert "| a batch's requests leave over (mean) | 30.0 ms |" in efficiency_markdown(
        pd.DataFrame([row])
    )
    older = dispatch(requests=[(0, 1, 1, True, 0), (0, 1, 1, True, 0)])  # no left_at
    assert math.isnan(efficiency_table([older], {}).iloc[0]["send_spread_ms"])
