"""Why a server slot ran below its server's capacity, from its efficiency figures
(`libero_eval.analysis.efficiency`): the likely cause, in a fixed order of checks, and the
setting to change (`diagnose`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from libero_eval.analysis.display import number

# A slot below this fraction of its server's capacity gets a warning.
LOW_FRACTION = 0.8
# Mean latency above this many times the probes' prediction: the server is slowed down.
SLOWDOWN = 1.5
# Client-side duty below this: the server waits for the envs.
LOW_DUTY = 0.8
# Mean batch fill below this (with a high duty): batches leave the server's batch unused.
LOW_FILL = 0.8
# An env's renders mid-run over its renders before the server was ready, at or above which
# (and at least RENDER_SHARE of its query) they wait on the GPU they share with the server.
RENDER_WAIT = 2.0
RENDER_SHARE = 0.25
ALWAYS_BUSY = 0.95  # client-side duty at or above this: the server was the bound
BOUND_HINT = (  # measured on one H200: docs/performance.md, "Where the server's time goes"
    "; the server always had work, so it was the bound: beside the envs, whose renders share "
    "its GPU, its batches take longer than at its probe, and a free server starts the "
    "requests that have come (split batches); more envs per GPU keep it queued (on one H200 "
    '48 gave 8% more than 32: docs/performance.md, "Where the server\'s time goes")'
)


@dataclass(frozen=True)
class Verdict:
    """Why a slot ran below capacity (`cause`: envs_short, graphs_exhausted, slowed_server,
    envs_slow, batches_unfilled, unexplained) and what to change (`message`)."""

    cause: str
    message: str


def merges_requests(figures: Mapping[str, Any]) -> bool:
    """Whether the slot's server merges one-observation requests into larger batches itself
    (π0.5 on SGLang): its batch is larger than a request's."""
    return figures.get("max_batch_size", 0) < figures.get("server_batch", 0)


def diagnose(figures: Mapping[str, Any]) -> Verdict | None:
    """The likely cause of a slot below `LOW_FRACTION` of its capacity, from its figures, and
    the setting to change; None at or above it, or when the capacity is unknown.

    In order, the first that holds:
    (a) duty below `LOW_DUTY`: the server idles while the envs step, too few envs (a slower
        answer matters little then);
    (a') the server's log says it ran out of CUDA graphs: batches of new shapes ran eagerly;
    (b) the server slowed down while the envs ran (shapes without CUDA graphs, contention):
        its full batches, back to back in the run, took over `SLOWDOWN` x the probes' fit
        (`libero_eval.analysis.server_pace`), or without such batches, the mean latency was over
        `SLOWDOWN` x the fit at the run's batch;
    (c) batch fill below `LOW_FILL` with the envs stepping as long as they wait, or at a
        server that merges any prompts: the envs are not back before the server is free,
        too few (or too slow) envs;
    (d) batch fill below `LOW_FILL` otherwise: too few trials per task to fill same-prompt
        batches;
    else the figures do not explain it.
    """
    fraction = figures["capacity_fraction"]
    if not fraction < LOW_FRACTION:  # NaN (unknown) too
        return None
    head = f"slot {figures['slot']} ran at {fraction:.0%} of its server's capacity"
    if figures["duty"] < LOW_DUTY:
        return Verdict(
            "envs_short",
            f"{head}: a request was in flight {figures['duty']:.0%} of the time, the server "
            "waits for the envs; raise rollout.total_num_envs / rollout.envs_per_shard",
        )
    reached = figures.get("graph_capacity_reached", math.nan)
    if not math.isnan(reached):
        return Verdict(
            "graphs_exhausted",
            f"{head}: the server ran out of CUDA graphs (its log: 'CUDA graph capacity "
            f"reached ({int(reached)}); new signatures run eagerly'), so batches of the shapes "
            "it had not captured ran eagerly, slower than the capacity probe's: raise the "
            "capacity, and give prompts fixed lengths, in server.sglang.pipeline_config "
            '(docs/performance.md, "SGLang\'s CUDA graphs")',
        )
    # the server's pace where the run had full batches back to back (a latency also holds
    # the wait behind other batches in flight), else the latency at the run's batch
    pace, probed = (
        figures.get("full_batch_s", math.nan),
        figures.get("probe_full_batch_s", math.nan),
    )
    paced = not math.isnan(pace) and not math.isnan(probed)
    if paced:
        slowed, what = pace > SLOWDOWN * probed, f"a full batch took {pace:.2f} s vs {probed:.2f}"
    else:
        predicted, latency = figures["predicted_latency_s"], figures["latency_mean_s"]
        slowed = latency > SLOWDOWN * predicted  # False when no fit (NaN)
        what = f"mean latency {latency:.2f} s vs {predicted:.2f}"
    if slowed:
        return Verdict(
            "slowed_server",
            f"{head}: {what} s the capacity probe predicts at this batch size; the server "
            "is slowed while the envs run: check its "
            "log for batch shapes captured or run without CUDA graphs (server.sglang."
            "pipeline_config), then CPU contention: server.cpu_threads (on a 16-core H200, 4 "
            "did best and SGLang's own 16 starved the node), rollout.env_niceness (the envs "
            "yield to the server at 10), more cores per GPU or fewer envs per node",
        )
    merging = merges_requests(figures)
    if figures["batch_fill"] < LOW_FILL and (
        merging or figures["envs_stepping"] >= figures["envs_waiting"]
    ):
        # a merging server batches requests of any prompt (SGLang 0.5.23: `prompt` is
        # batch_sig_exclude in configs/sample/action.py), so its batch waits on no prompt
        late = (
            "too few envs are back before the server is free, so it starts a partial batch"
            if merging
            else "a prompt's envs are not back before the server is free, so its batch "
            "leaves partial"
        )
        return Verdict(
            "envs_slow",
            f"{head}: batches are {figures['batch_fill']:.0%} full and the envs step "
            f"({figures['envs_stepping']:.1f} on average) as long as they wait "
            f"({figures['envs_waiting']:.1f}): {late}; add envs per GPU "
            "(rollout.total_num_envs: one more batch of envs; with total_num_envs auto, "
            "rollout.envs_per_shard, the most a shard starts) or give the envs more CPUs"
            + _env_query(figures),
        )
    if figures["batch_fill"] < LOW_FILL:
        return Verdict(
            "batches_unfilled",
            f"{head}: batches are {figures['batch_fill']:.0%} full; a request carries one "
            "prompt: give each task at least as many trials as the server's batch "
            "(plan.num_trials_per_task), a multiple of it for full batches to the end",
        )
    captured = figures.get("graphs_captured_serving", math.nan)
    stalls = (
        f"; the server captured {int(captured)} CUDA graphs while serving (its log), each "
        "stalling one batch once: a longer run spreads that cost"
        if captured > 0  # False for NaN
        else ""
    )
    bound = BOUND_HINT if figures["duty"] >= ALWAYS_BUSY else ""
    pace_note = (
        f"; its full batches took {pace:.2f} s against {probed:.2f} s at the probe" if paced else ""
    )
    return Verdict(
        "unexplained",
        f"{head}, with latency, duty ({figures['duty']:.0%}) and batch fill "
        f"({figures['batch_fill']:.0%}) as expected{pace_note}{stalls}{bound}; compare the "
        "capacity probe in the slot's service file with the serve log",
    )


def _env_query(figures: Mapping[str, Any]) -> str:
    """Where an env's query went (`libero_eval.analysis.env_time`), and whether its renders
    wait on the GPU they share with the server; "" where the queries were not recorded."""
    query, render = figures.get("env_query_s", math.nan), figures.get("env_render_s", math.nan)
    if math.isnan(query):
        return ""
    before = figures.get("env_start_render_s", math.nan)
    text = (
        f". An env's query took {query:.2f} s mid-run: {figures['env_sim_s']:.2f} s "
        f"simulating, {number(render, '.3f')} s rendering"
        + ("" if math.isnan(before) else f" ({before:.3f} s before the server was ready)")
        + f", {figures['env_handoff_s']:.2f} s in the pipes and the shard's loop"
    )
    if render >= RENDER_WAIT * before and render >= RENDER_SHARE * query:  # False for NaN
        text += (
            "; its renders wait on the GPU they share with the server, and more envs add to "
            "that wait: render elsewhere (rollout.render_device: a GPU without a server)"
        )
    return text
