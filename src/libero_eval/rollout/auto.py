"""How many envs a shard keeps and how its observations leave, chosen from measurement.

Two numbers decide (docs/rfcs/0008-dispatch.md, "auto"):
- the server's latency model and its time for a full batch, `batch_s` (its capacity probe at
  start, scaled by the median of the run's answers so far: `dispatch.LatencyModel.typical`;
  the first answers also hold the CUDA graphs the server captures for each new batch size,
  which once made a batch of 16 read 0.47 s against its 0.25 s), of `server_batch`
  observations;
- the envs' seconds per query, `step_s` (the shard's queries so far: from a chunk sent to the
  env until its next observation came back; the median where one number is wanted).

While one batch computes, the other envs step. The server is the bound when the envs not in
its batch bring a whole next batch before it is done: with `n` envs and batch `B`,
`step_s <= MARGIN x (n / B - 1) x batch_s`. MARGIN (0.85) leaves room for the spread of step
times about their median.

- Envs (`rollout.total_num_envs: auto`): the fewest whole batches that make the server the
  bound, `B x (1 + ceil(step_s / (MARGIN x batch_s)))`, at most the envs the shard started
  (its job's cores, the GPU's memory: `start_count`); the spare ones close as they finish
  their episode. More envs add latency, memory and CPU load beside the server, not
  observations per second. The discrete-event model (`dispatch_model`) gives the count it
  picks the server's capacity, one batch fewer well below it (tests/test_auto.py).
- Dispatch at a merging server (`rollout.merged_dispatch: auto`): the model of this shard
  (its envs stepping their measured times, its server's latency model) run both ways,
  `batches` and `as_ready`; as_ready unless batches give more than 2% more (`NEAR_TIE`).
  In the model as_ready never costs more than 2%, and gains 10-28% where the envs come back just
  as the server frees up; measured, it gained 10-16% on one H200 (a merging server with openpi
  and LeRobot checkpoints, 32 envs), and on the CPU cell a shard that chose it ran at 98% of the
  probe (an earlier run of that cell with as_ready set gave 78% against 93% with batches, a loss
  the model does not hold; docs/performance.md, "The start overlapped").

Both choices change timing only, never an episode (the merging server's shard tests run one
alone, merged, as_ready and auto and compare their episodes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from libero_eval.rollout.dispatch import LatencyModel
from libero_eval.rollout.dispatch_model import simulate

MARGIN = 0.85  # the envs must bring a batch within this part of the server's batch time
EGL_MIB_PER_ENV = 552  # GPU memory of one env's renderer (docs/performance.md, one H200)
# The renderers' part of the GPU when the server's is not set (server.sglang.gpu_memory_cap_gib):
# the most free memory a served model's SGLang pipeline asks for to keep its weights resident,
# 120 GiB at its start (the family package cites its pipeline config), is 86% of an H200's 140
# (rollout/startup.py); 14% is 19.6 GiB there, 36 envs.
RENDER_GPU_SHARE = 0.14


@dataclass(frozen=True)
class Choice:
    """A choice and why, as the dispatch log and the report show it."""

    value: Any  # the envs (int) or the merged dispatch ("batches", "as_ready", None)
    setting: Any  # the configured value
    reason: str

    def as_dict(self, key: str) -> dict[str, Any]:
        return {key: self.value, "setting": self.setting, "reason": self.reason}


def start_count(
    envs_per_shard: int, pending: int, auto: bool, render_gpu_budget_mib: int | None
) -> tuple[int, str]:
    """The envs a shard starts and the bound that set it: its episodes, its job's threads
    (`rollout.envs_per_shard`, lowered by Snakemake to --cores) and, with `auto`, the GPU
    memory its renderers may take."""
    count, bound = envs_per_shard, f"the job's {envs_per_shard} threads, rollout.envs_per_shard"
    if auto and render_gpu_budget_mib is not None:
        by_memory = max(1, render_gpu_budget_mib // EGL_MIB_PER_ENV)
        if by_memory < count:
            count = by_memory
            bound = (
                f"the GPU memory its renderers may take ({render_gpu_budget_mib} MiB at "
                f"{EGL_MIB_PER_ENV} MiB each)"
            )
    if pending < count:
        count, bound = pending, f"its {pending} episodes to run"
    return count, bound


def server_is_the_bound(envs: int, server_batch: int, batch_s: float, step_s: float) -> bool:
    """The envs not in the server's batch bring a whole next batch before it is done."""
    return step_s <= MARGIN * (envs / server_batch - 1) * batch_s


def envs_needed(server_batch: int, batch_s: float, step_s: float) -> int:
    """The fewest whole batches of envs that make the server the bound."""
    return server_batch * (1 + max(1, math.ceil(step_s / (MARGIN * batch_s))))


def choose_envs(
    setting: Any, started: int, server_batch: int, batch_s: float, step_s: Sequence[float]
) -> Choice:
    """`rollout.total_num_envs: auto`: the envs the shard keeps of the `started` ones."""
    step = median(step_s)
    needed = envs_needed(server_batch, batch_s, step)
    measured = (
        f"an env steps a query in {step:.2f} s and the server takes a batch of "
        f"{server_batch} in {batch_s:.2f} s"
    )
    if needed >= started:
        return Choice(
            started,
            setting,
            f"{started} envs, all it started: {measured}, so {needed} would keep the server "
            "busy (more cores or GPU memory per slot would help)"
            if needed > started
            else f"{started} envs: {measured}, so {needed} keep the server busy",
        )
    return Choice(
        needed,
        setting,
        f"{needed} of the {started} envs started: {measured}, so {needed // server_batch} "
        f"batches' worth keep the server busy; {started - needed} spare envs closed",
    )


MODEL_ROUNDS = 24  # queries per env in the model of the shard (its start and tail included)
NEAR_TIE = 0.98  # as_ready unless batches do better than this in the model


def model_steps(step_s: Sequence[float], envs: int, per_env: int = 12) -> list[list[float]]:
    """The shard's measured step times handed round to `envs` model envs, each its own turn
    through them (so that the envs do not step in lockstep)."""
    samples = list(step_s)[-max(per_env * envs, 1) :]
    return [[samples[(i + k * envs) % len(samples)] for k in range(per_env)] for i in range(envs)]


def choose_dispatch(
    setting: str,
    envs: int,
    server_batch: int,
    latency: LatencyModel,
    step_s: Sequence[float],
    batch_timeout_s: float,
) -> Choice:
    """`rollout.merged_dispatch: auto` at a merging server, for `envs` envs: the discrete-event
    model of this shard (`dispatch_model`: its envs stepping their measured times, its server's
    latency model) run both ways; as_ready unless batches do clearly better."""
    steps = model_steps(step_s, envs)
    rate = {
        name: simulate(
            steps,
            latency,
            server_batch,
            merging=True,
            as_ready=name == "as_ready",
            rounds=MODEL_ROUNDS,
            batch_timeout_s=batch_timeout_s,
        ).obs_per_s
        for name in ("batches", "as_ready")
    }
    value = "as_ready" if rate["as_ready"] >= NEAR_TIE * rate["batches"] else "batches"
    other = "batches" if value == "as_ready" else "as_ready"
    return Choice(
        value,
        setting,
        f"{value}: in a model of this shard ({envs} envs stepping {median(step_s):.2f} s a "
        f"query, batches of {server_batch} in {latency.seconds(server_batch):.2f} s) it gives "
        f"{rate[value]:.2f} obs/s against {rate[other]:.2f} with {other}",
    )


class ShardChoices:
    """A shard's envs and dispatch: as configured, or chosen once its envs have stepped
    `QUERIES_BEFORE_CHOICE` queries each (their median step time settles by then)."""

    QUERIES_BEFORE_CHOICE = 2

    def __init__(self, envs_setting: Any, dispatch_setting: str, started: int, bound: str):
        self.envs_setting, self.dispatch_setting = envs_setting, dispatch_setting
        self.started = started
        self.step_s: list[float] = []  # each query's env seconds, in order
        self.envs: Choice | None = None
        self.dispatch: Choice | None = None
        if envs_setting != "auto":
            self.envs = Choice(started, envs_setting, f"{started} envs as configured ({bound})")
        self._start_bound = bound

    def on_server(self, merging: bool) -> bool:
        """The server is known: fix what needs no measurement; whether observations leave
        as they are ready until the choice (`batches` until then)."""
        if not merging:
            self.dispatch = Choice(
                None,
                self.dispatch_setting,
                "the server does not merge requests: each carries a batch of one prompt",
            )
        elif self.dispatch_setting != "auto":
            self.dispatch = Choice(
                self.dispatch_setting,
                self.dispatch_setting,
                f"{self.dispatch_setting} as configured (rollout.merged_dispatch)",
            )
        return self.dispatch is not None and self.dispatch.value == "as_ready"

    @property
    def pending(self) -> bool:
        return self.envs is None or self.dispatch is None

    def due(self, active: int) -> bool:
        return self.pending and len(self.step_s) >= self.QUERIES_BEFORE_CHOICE * max(1, active)

    def choose(
        self, active: int, server_batch: int, latency: LatencyModel, batch_timeout_s: float
    ) -> tuple[int, bool | None]:
        """Choose what is left from the measurements: (the envs to keep, as_ready or None
        where the dispatch was not chosen here)."""
        batch_s = latency.seconds(server_batch)
        if self.envs is None:
            self.envs = choose_envs(self.envs_setting, active, server_batch, batch_s, self.step_s)
        as_ready = None
        if self.dispatch is None:
            self.dispatch = choose_dispatch(
                self.dispatch_setting,
                self.envs.value,
                server_batch,
                latency,
                self.step_s,
                batch_timeout_s,
            )
            as_ready = self.dispatch.value == "as_ready"
        return self.envs.value, as_ready

    def close(self, ran: int, as_ready: bool | None) -> None:
        """The shard ends: what was never chosen stays as it ran, and says why."""
        why = (
            "not measured: the shard ended before its envs had stepped "
            f"{self.QUERIES_BEFORE_CHOICE} queries each"
        )
        if self.envs is None:
            self.envs = Choice(ran, self.envs_setting, f"{ran} envs, as started ({why})")
        if self.dispatch is None:
            ran_as = None if as_ready is None else ("as_ready" if as_ready else "batches")
            self.dispatch = Choice(ran_as, self.dispatch_setting, f"{ran_as} ({why})")

    def as_log(self) -> dict[str, dict[str, Any]]:
        assert self.envs is not None and self.dispatch is not None
        return {
            "envs_choice": self.envs.as_dict("envs"),
            "dispatch_choice": self.dispatch.as_dict("merged_dispatch"),
        }
