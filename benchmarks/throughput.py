"""Throughput benchmark: env stepping, end-to-end observations/s, server duty cycle, transport
cost and planning cost, measured side by side in one run on one machine.

Sections (pick with --sections, default all):

  a  env steps/s per process: per-step rendering, render on demand, physics only (the floor),
     and one render of the two cameras alone; env CPU per policy query against its irreducible
     cost (16 physics steps + one render), and the speed-up over per-step rendering.
  b  observations/s end to end: real ShardRunner shards (each in its own process, like a
     rollout job) against the real reference server with a fixed latency model, for a grid of
     envs per shard x shards per server x requests in flight per shard (demand/supply table).
  c  server duty cycle in those runs: the fraction of wall time a request is being served,
     from the server's GET /v1/stats busy_s.
  d  client encode + decode ms per observation: msgpack with raw arrays vs JSON base64 PNG.
  e  planning cost from 1 to 2,000 episodes: plan alone, and `snakemake -n` (DAG build).

    MUJOCO_GL=egl python benchmarks/throughput.py                      # everything
    python benchmarks/throughput.py --sections a,d --chunks 4          # a quick look

The latency model stands in for the GPU: by default 0.5 s per request + 0.05 s per
observation, i.e. 0.55 s for one observation and 0.9 s for a batch of 8 (Cosmos3 at the seed's
30 denoising steps, 320x192, on one H100/H200-class GPU is assumed to be of that order; it is a
model, not a measurement). Everything else is measured. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA = REPO_ROOT / "config" / "schema.yaml"
STATS = REPO_ROOT / "config" / "stats" / "libero_native_frame_wise_relative_rot6d.json"
CHUNK = 16
SECTIONS = "abcde"
DEFAULT_GRID_TEXT = "1x1x1,2x1x1,2x1x2,1x2x1,2x2x1,4x1x1"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    """CPU time of this process, all threads included (llvmpipe renders on its own threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cost:
    """Wall and CPU seconds of `count` repetitions of something."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    count: int = 0

    @property
    def wall_ms(self) -> float:
        return 1000 * self.wall_s / max(self.count, 1)

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / max(self.count, 1)


@contextlib.contextmanager
def measure(cost: Cost, count: int = 1) -> Iterator[None]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    cost.wall_s += time.perf_counter() - wall
    cost.cpu_s += cpu_seconds() - cpu
    cost.count += count


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def default_config(**overrides: Any) -> dict[str, Any]:
    """The workflow config with the schema's defaults filled in (as common.smk does)."""
    from snakemake.utils import validate

    config: dict[str, Any] = {"run_id": "bench_throughput", **overrides}
    validate(config, str(SCHEMA))
    config["policy"]["cosmos3"]["action_stats_path"] = str(STATS)
    return config


def machine_summary() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "mem_gib": mem_gib,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "mujoco_gl": os.environ.get("MUJOCO_GL", "egl"),
    }


# ---------------------------------------------------------------------------------------------
# (a) env stepping
# ---------------------------------------------------------------------------------------------


@dataclass
class EnvResult:
    every_step: Cost
    on_demand: Cost  # per policy query (one chunk of 16 steps and its render)
    physics: Cost  # per step, camera observables disabled
    render: Cost  # per render of both cameras
    identical_queries: int
    compared_queries: int
    observation: Any = None  # one real observation, for (d)

    @property
    def irreducible_cpu_ms(self) -> float:
        return CHUNK * self.physics.cpu_ms + self.render.cpu_ms

    @property
    def irreducible_wall_ms(self) -> float:
        return CHUNK * self.physics.wall_ms + self.render.wall_ms


def _camera_sensors(env) -> list[Callable[[dict], np.ndarray]]:
    """The robosuite camera sensors of a LiberoEpisodeEnv, unwrapped from the lazy sensor."""
    from libero_eval.rollout.env_worker import CAMERAS

    observables = env._env.env._observables
    sensors = []
    for camera in CAMERAS:
        sensor = observables[f"{camera}_image"]._sensor
        sensors.append(getattr(sensor, "_sensor", sensor))
    return sensors


def section_a(args: argparse.Namespace) -> EnvResult:
    from libero_eval.rollout.env_worker import (
        CAMERAS,
        EnvSettings,
        EpisodeSpec,
        LiberoEpisodeEnv,
        seeded_action_chunks,
    )
    from libero_eval.rollout.protocols import get_protocol

    suite, task_id = args.task
    spec = EpisodeSpec(suite, task_id, args.init_state)
    chunks = seeded_action_chunks(args.seed, 1 + args.chunks)
    protocol = get_protocol("rlinf", max_steps_override=CHUNK * (len(chunks) + 1), seed=args.seed)
    print(f"(a) {suite} task {task_id} init {args.init_state} ...", file=sys.stderr)

    def start(render_mode: str) -> tuple[Any, list]:
        """An env on the episode, one chunk in (warm-up), and the queries so far."""
        env = LiberoEpisodeEnv(EnvSettings(render_mode=render_mode), protocol)
        queries = [(env.start_episode(spec), env.sim_state())]
        queries.append((env.step_chunk(chunks[0]), env.sim_state()))
        return env, queries

    # Three envs on the same episode; the modes are timed in turns, chunk by chunk, so that
    # load from other processes hits them alike.
    lazy_env, lazy_queries = start("on_demand")
    step_env, step_queries = start("every_step")
    physics_env, _ = start("on_demand")
    for camera in CAMERAS:
        physics_env._env.env._observables[f"{camera}_image"].set_enabled(False)
    sensors = _camera_sensors(lazy_env)
    on_demand, every_step, physics, render = Cost(), Cost(), Cost(), Cost()
    try:
        for index, chunk in enumerate(chunks[1:]):
            with measure(on_demand):
                observation = lazy_env.step_chunk(chunk)
            lazy_queries.append((observation, lazy_env.sim_state()))
            with measure(render):
                for sensor in sensors:
                    sensor({})
            with measure(physics, count=CHUNK):
                for action in chunk:
                    physics_env._env.step(action)
            if index < args.every_step_chunks:
                with measure(every_step):
                    observation = step_env.step_chunk(chunk)
                step_queries.append((observation, step_env.sim_state()))
    finally:
        for env in (lazy_env, step_env, physics_env):
            env.close()

    identical = 0
    for (obs, state), (ref, ref_state) in zip(lazy_queries, step_queries, strict=False):
        same = (
            obs.agentview.tobytes() == ref.agentview.tobytes()
            and obs.wrist.tobytes() == ref.wrist.tobytes()
            and np.array_equal(state, ref_state)
        )
        identical += int(same)
    return EnvResult(
        every_step=every_step,
        on_demand=on_demand,
        physics=physics,
        render=render,
        identical_queries=identical,
        compared_queries=min(len(lazy_queries), len(step_queries)),
        observation=lazy_queries[-1][0],
    )


def print_a(result: EnvResult) -> dict[str, Any]:
    od, es, ph, rd = result.on_demand, result.every_step, result.physics, result.render
    rows = [
        [
            "every_step (per-step rendering)",
            es.wall_ms / CHUNK,
            es.cpu_ms / CHUNK,
            1000 * CHUNK / es.wall_ms,
            es.cpu_ms,
            es.count,
        ],
        [
            "on_demand (render per query)",
            od.wall_ms / CHUNK,
            od.cpu_ms / CHUNK,
            1000 * CHUNK / od.wall_ms,
            od.cpu_ms,
            od.count,
        ],
        [
            "physics only (floor)",
            ph.wall_ms,
            ph.cpu_ms,
            1000 / ph.wall_ms,
            CHUNK * ph.cpu_ms,
            ph.count // CHUNK,
        ],
        ["render both cameras once", rd.wall_ms, rd.cpu_ms, "", "", rd.count],
    ]
    print("\n### (a) Env stepping, one process\n")
    print(
        table(
            ["mode", "ms/step wall", "ms/step CPU", "steps/s", "CPU ms/query", "n"],
            rows,
        )
    )
    ratio_cpu = od.cpu_ms / result.irreducible_cpu_ms
    ratio_wall = od.wall_ms / result.irreducible_wall_ms
    speedup_cpu = es.cpu_ms / od.cpu_ms
    speedup_wall = es.wall_ms / od.wall_ms
    print(
        "\n"
        + table(
            ["per policy query", "CPU", "wall", "target"],
            [
                [
                    "irreducible ms (16 physics steps + 1 render)",
                    result.irreducible_cpu_ms,
                    result.irreducible_wall_ms,
                    "",
                ],
                ["on_demand / irreducible", ratio_cpu, ratio_wall, "<= 1.2"],
                ["every_step / on_demand (speed-up)", speedup_cpu, speedup_wall, ">= 5"],
                [
                    "identical images + sim state at queries",
                    f"{result.identical_queries}/{result.compared_queries}",
                    "",
                    "all",
                ],
            ],
        )
    )
    return {
        "every_step": vars(es),
        "on_demand": vars(od),
        "physics": vars(ph),
        "render": vars(rd),
        "irreducible_cpu_ms": result.irreducible_cpu_ms,
        "ratio_cpu": ratio_cpu,
        "ratio_wall": ratio_wall,
        "speedup_cpu": speedup_cpu,
        "speedup_wall": speedup_wall,
        "identical_queries": result.identical_queries,
        "compared_queries": result.compared_queries,
    }


# ---------------------------------------------------------------------------------------------
# (b) + (c) end to end through the reference server
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    envs_per_shard: int
    shards: int
    inflight: int
    mixed_tasks: bool = False  # a shard's episodes cycle over 10 tasks, as the plan interleaves

    @property
    def total_envs(self) -> int:
        return self.envs_per_shard * self.shards

    @property
    def label(self) -> str:
        return f"{self.envs_per_shard}x{self.shards}x{self.inflight}" + (
            "m" if self.mixed_tasks else ""
        )

    @staticmethod
    def parse(text: str) -> Cell:
        spec = text.strip().lower()
        mixed = spec.endswith("m")
        try:
            parts = [int(p) for p in spec.removesuffix("m").split("x")]
        except ValueError:
            parts = []
        if len(parts) not in (2, 3) or min(parts) < 1:
            raise argparse.ArgumentTypeError(
                f"--grid entry {text!r} must be ENVSxSHARDS[xINFLIGHT][m], e.g. 2x1x2 or 4x1x1m "
                "(m: every shard cycles over 10 tasks instead of running one)"
            )
        return Cell(parts[0], parts[1], parts[2] if len(parts) == 3 else 1, mixed)


def parse_grid(text: str) -> list[Cell]:
    return [Cell.parse(entry) for entry in text.split(",")]


class StatsPoller:
    """Polls GET /v1/stats and keeps a sample whenever the request count changes."""

    def __init__(self, url: str, interval_s: float):
        import requests

        self.url = url + "/v1/stats"
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._session = requests.Session()
        self._session.trust_env = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stats-poller", daemon=True)

    def _run(self) -> None:
        import requests

        last = None
        while not self._stop.is_set():
            try:
                stats = self._session.get(self.url, timeout=5).json()
            except (requests.RequestException, ValueError) as exc:
                print(f"(c) GET {self.url} failed: {exc}", file=sys.stderr)
                self._stop.wait(self.interval_s)
                continue
            now = time.monotonic()
            if stats["requests"] != last:
                self.samples.append((now, stats))
                last = stats["requests"]
            self._stop.wait(self.interval_s)

    def __enter__(self) -> StatsPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._session.close()


def _shard_main(
    name: str,
    episodes: list[tuple[str, int, int]],
    cell: Cell,
    max_steps: int,
    url: str,
    max_batch: int,
    store_root: str,
    events: Any,
) -> None:
    """One rollout shard in its own process, like a workflow rollout job."""
    from libero_eval.plan import Episode
    from libero_eval.policy.adapters import make_adapter
    from libero_eval.rollout.env_worker import EnvSettings
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.rollout.runner import ShardRunner, ShardSettings
    from libero_eval.store import EpisodeStore

    config = default_config()
    settings = ShardSettings(
        run_id=config["run_id"],
        shard=name,
        slot=0,
        protocol=get_protocol("rlinf", max_steps, config["plan"]["seed"]),
        env=EnvSettings(render_mode="on_demand"),
        adapter=make_adapter("cosmos3", config["policy"]["cosmos3"]),
        envs_per_shard=cell.envs_per_shard,
        max_inflight_requests=cell.inflight,
    )

    def progress(done: int, total: int, _successes: int) -> None:
        events.put((time.monotonic(), name, done, total))

    runner = ShardRunner(
        settings, EpisodeStore(store_root), url, progress=progress, max_batch_size=max_batch
    )
    records = runner.run([Episode(*episode) for episode in episodes])
    errors = [r["error"] for r in records if r["error"]]
    latencies = [
        (r["policy_latency_mean_s"], r["policy_calls"]) for r in records if r["policy_calls"]
    ]
    events.put((time.monotonic(), name, -1, (errors, latencies)))


@dataclass
class CellResult:
    cell: Cell
    obs_per_s: float | None = None
    duty: float | None = None
    mean_batch: float | None = None
    queue_wait_s: float | None = None
    window_s: float = 0.0
    run_s: float = 0.0
    items: int = 0
    client_latency_s: float | None = None  # mean HTTP round trip the envs waited, per query
    errors: list[str] = field(default_factory=list)

    @property
    def env_query_s(self) -> float | None:
        """Measured wall seconds an env spends stepping per query (its cycle minus its wait)."""
        if not self.obs_per_s or self.client_latency_s is None:
            return None
        return self.cell.total_envs / self.obs_per_s - self.client_latency_s


def _window(
    samples: list[tuple[float, dict[str, Any]]], start_items: int, warm_items: int, end: float
) -> dict[str, float] | None:
    """Steady-state deltas of the server counters: from the first sample with `warm_items`
    items served in this cell to the last sample before `end` (the first env out of work)."""
    begin = next(
        (i for i, (_, s) in enumerate(samples) if s["items"] - start_items >= warm_items), None
    )
    if begin is None:
        return None
    inside = [(t, s) for t, s in samples[begin:] if t <= end]
    if len(inside) < 3:
        return None
    (t0, s0), (t1, s1) = inside[0], inside[-1]
    return {
        "seconds": t1 - t0,
        "items": s1["items"] - s0["items"],
        "requests": s1["requests"] - s0["requests"],
        "busy_s": s1["busy_s"] - s0["busy_s"],
        "queue_wait_s": s1["queue_wait_s"] - s0["queue_wait_s"],
    }


def run_cell(
    cell: Cell, args: argparse.Namespace, url: str, poller: StatsPoller, first_init: int
) -> CellResult:
    suite, task_id = args.task
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    result = CellResult(cell)
    store_root = tempfile.mkdtemp(prefix="libero_bench_store_")
    per_shard = cell.envs_per_shard * args.episodes_per_env
    processes = []
    start_items = poller.samples[-1][1]["items"]
    started = time.monotonic()
    try:
        for index in range(cell.shards):
            episodes = [
                (
                    suite,
                    (task_id + j) % 10 if cell.mixed_tasks else task_id,
                    (first_init + index * per_shard + j) % 50,
                )
                for j in range(per_shard)
            ]
            process = ctx.Process(
                target=_shard_main,
                args=(
                    f"shard{index:03d}",
                    episodes,
                    cell,
                    args.episode_steps,
                    url,
                    args.server_batch,
                    os.path.join(store_root, f"shard{index:03d}"),
                    events,
                ),
                name=f"bench-shard{index}",
            )
            process.start()
            processes.append(process)
        idle_at: list[float] = []
        latencies: list[tuple[float, int]] = []
        finished = 0
        while finished < cell.shards:
            try:
                stamp, _name, done, extra = events.get(timeout=args.cell_timeout_s)
            except queue.Empty:
                result.errors.append(f"no progress for {args.cell_timeout_s} s")
                break
            if done == -1:
                finished += 1
                result.errors += extra[0]
                latencies += extra[1]
            elif done == per_shard - cell.envs_per_shard + 1:
                idle_at.append(stamp)  # this shard's first env has no episode left
        for process in processes:
            process.join(timeout=60)
            if process.exitcode not in (0, None):
                result.errors.append(f"{process.name} exited with {process.exitcode}")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        shutil.rmtree(store_root, ignore_errors=True)
    result.run_s = time.monotonic() - started
    calls = sum(count for _, count in latencies)
    if calls:
        result.client_latency_s = sum(mean * count for mean, count in latencies) / calls
    time.sleep(2 * poller.interval_s)
    # Warm: every env served twice (all envs built and stepping); end: first env out of work.
    window = _window(
        list(poller.samples), start_items, 2 * cell.total_envs, min(idle_at, default=float("inf"))
    )
    if window and window["seconds"] > 0 and window["requests"] > 0:
        result.window_s = window["seconds"]
        result.items = window["items"]
        result.obs_per_s = window["items"] / window["seconds"]
        result.duty = window["busy_s"] / window["seconds"]
        result.mean_batch = window["items"] / window["requests"]
        result.queue_wait_s = window["queue_wait_s"] / window["requests"]
    return result


def section_bc(args: argparse.Namespace, env_result: EnvResult | None) -> dict[str, Any]:
    from libero_eval.reference.server import serve_in_thread
    from libero_eval.reference.settings import ReferenceServerSettings

    settings = ReferenceServerSettings(
        action_stats_path=STATS,
        policy="hold",
        max_batch_size=args.server_batch,
        latency_fixed_s=args.latency_fixed_s,
        latency_per_item_s=args.latency_per_item_s,
    )
    results: list[CellResult] = []
    with serve_in_thread(settings) as url, StatsPoller(url, args.poll_s) as poller:
        while not poller.samples:
            time.sleep(0.01)
        first_init = 0
        for cell in args.grid:
            print(f"(b) cell {cell.label} ...", file=sys.stderr)
            results.append(run_cell(cell, args, url, poller, first_init))
            first_init += cell.total_envs * args.episodes_per_env

    latency = args.latency_fixed_s, args.latency_per_item_s
    rows, records = [], []
    for r in results:
        c = r.cell
        server_cap = env_cap = bound = None
        if r.mean_batch:
            server_cap = r.mean_batch / (latency[0] + latency[1] * r.mean_batch)
            if r.env_query_s:
                # What the envs not in the request being served produce while it is served.
                env_cap = max(0.0, c.total_envs - r.mean_batch) / r.env_query_s
                bound = "server" if env_cap >= server_cap else "env"
        values = [
            r.obs_per_s,
            r.mean_batch,
            r.client_latency_s,
            r.env_query_s,
            server_cap,
            env_cap,
            bound,
            r.duty,
        ]
        errors = "; ".join(e.splitlines()[0] for e in r.errors)[:80] or "-"
        rows.append(
            [c.label, c.total_envs, "10 (cycled)" if c.mixed_tasks else "1"]
            + ["n/a" if v is None else v for v in values]
            + [r.window_s, r.run_s, errors]
        )
        records.append(
            {
                **vars(c),
                **{k: v for k, v in vars(r).items() if k != "cell"},
                "bound": bound,
                "server_capacity": server_cap,
                "env_capacity": env_cap,
            }
        )
    print(
        f"\n### (b) + (c) End to end through the reference server (latency {latency[0]:g} s + "
        f"{latency[1]:g} s/obs, max batch {args.server_batch}, {args.episode_steps}-step "
        f"episodes, {args.episodes_per_env} per env)\n"
    )
    headers = "cell ExSxI|envs|tasks/shard|obs/s|mean batch|client wait s|env s/query"
    headers += "|server cap obs/s|env cap obs/s|bound|duty|window s|run s|errors"
    print(table(headers.split("|"), rows))
    print(
        "\ncell E x S x I: E envs per shard, S shards on the server, I requests in flight per "
        "shard. duty = busy_s / wall from GET /v1/stats over the steady window (every env "
        "served twice .. first env out of episodes). client wait = mean HTTP round trip per "
        "query (queueing at the server included); env s/query = envs / (obs/s) - client wait: "
        "stepping a chunk, plus any wait for a free request slot. server cap = b / latency(b) "
        "at the mean batch b; env cap = (envs - b) / (env s/query): what the envs outside the "
        "request being served produce meanwhile. bound = server when env cap >= server cap."
    )
    if env_result is not None:
        print(
            f"For comparison, (a): one env alone needs {env_result.on_demand.wall_ms / 1000:.3f} "
            f"s wall ({env_result.on_demand.cpu_ms / 1000:.3f} s CPU) per query."
        )
    return {"latency": latency, "server_batch": args.server_batch, "cells": records}


# ---------------------------------------------------------------------------------------------
# (d) transport
# ---------------------------------------------------------------------------------------------


def _best_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * min(times)


def _observation_for_d(env_result: EnvResult | None, args: argparse.Namespace):
    if env_result is not None and env_result.observation is not None:
        return env_result.observation
    from libero_eval.rollout.env_worker import EnvSettings, EpisodeSpec, LiberoEpisodeEnv
    from libero_eval.rollout.protocols import get_protocol

    env = LiberoEpisodeEnv(EnvSettings(), get_protocol("rlinf", max_steps_override=64))
    try:
        return env.start_episode(EpisodeSpec(args.task[0], args.task[1], args.init_state))
    finally:
        env.close()


def _transport_costs(
    transport: str, batch: int, observation: Any, policy: dict[str, Any], repeats: int, seed: int
) -> dict[str, Any]:
    """Client-side ms (whole batch) of one request/response round in `transport`."""
    from libero_eval.policy import codec
    from libero_eval.policy.actions import preprocess_observation_image
    from libero_eval.policy.adapters import make_adapter
    from libero_eval.policy.client import PolicyClient
    from libero_eval.reference.requests import decode_body, parse_generation_request
    from libero_eval.reference.responses import generation_envelope
    from libero_eval.reference.settings import ReferenceServerSettings

    adapter = make_adapter("cosmos3", {**policy, "transport": transport})
    client = PolicyClient("http://127.0.0.1:9", transport=transport)
    server_settings = ReferenceServerSettings(action_stats_path=STATS, max_batch_size=64)
    observations = [observation] * batch
    payload = adapter.build_request(observations, request_id="bench")
    body, headers = client.encode(payload)
    actions = np.random.default_rng(seed).uniform(-1, 1, size=(batch, CHUNK, 10))
    output = {
        "request_id": "bench",
        "actions": actions[0] if batch == 1 else actions,
        "action_mode": "policy",
        "domain_id": 5,
        "raw_action_dim": 10,
        "parameters": {"num_inference_steps": 30, "num_frames": 17},
    }
    msgpack_answer = transport == "msgpack"
    envelope = generation_envelope(
        {**output, "actions": np.asarray(output["actions"], dtype=np.float32)},
        "bench",
        preserve_numpy=msgpack_answer,
    )
    answer = codec.pack(envelope) if msgpack_answer else json.dumps(envelope).encode()

    def decode_answer() -> Any:
        return codec.unpack(answer) if msgpack_answer else json.loads(answer)

    response = decode_answer()
    return {
        "transport": transport,
        "batch": batch,
        "request_bytes": len(body),
        "preprocess_ms": _best_ms(
            lambda: [preprocess_observation_image(o.agentview, o.wrist) for o in observations],
            repeats,
        ),
        "build_ms": _best_ms(lambda: adapter.build_request(observations, "bench"), repeats),
        "encode_ms": _best_ms(lambda: client.encode(payload), repeats),
        "decode_ms": _best_ms(decode_answer, repeats),
        "parse_ms": _best_ms(lambda: adapter.parse_response(response, batch), repeats),
        "server_decode_ms": _best_ms(
            lambda: parse_generation_request(
                decode_body(body, headers["Content-Type"]), server_settings
            ),
            repeats,
        ),
    }


def section_d(args: argparse.Namespace, env_result: EnvResult | None) -> dict[str, Any]:
    import pickle

    observation = _observation_for_d(env_result, args)
    policy = default_config()["policy"]["cosmos3"]
    one_call_s = args.latency_fixed_s + args.latency_per_item_s
    rows, records = [], []
    for transport in ("msgpack", "png_base64"):
        for batch in (1, 8):
            r = _transport_costs(transport, batch, observation, policy, args.repeats, args.seed)
            payload_ms = max(0.0, r["build_ms"] - r["preprocess_ms"])  # PNG + base64 for JSON
            wire_only = payload_ms + r["encode_ms"] + r["decode_ms"]
            client_total = r["build_ms"] + r["encode_ms"] + r["decode_ms"] + r["parse_ms"]
            r["client_total_ms"] = client_total
            records.append(r)
            rows.append(
                [
                    transport,
                    batch,
                    r["request_bytes"] / batch / 1024,
                    r["preprocess_ms"] / batch,
                    wire_only / batch,
                    client_total / batch,
                    r["server_decode_ms"] / batch,
                    100 * client_total / batch / 1000 / one_call_s,
                ]
            )
    pickled = pickle.dumps(observation, protocol=pickle.HIGHEST_PROTOCOL)
    pipe_ms = _best_ms(
        lambda: pickle.loads(pickle.dumps(observation, protocol=pickle.HIGHEST_PROTOCOL)),
        args.repeats,
    )
    print("\n### (d) Client encode + decode per observation\n")
    print(
        table(
            [
                "transport",
                "batch",
                "KiB/obs",
                "preprocess ms",
                "encode+decode ms (wire only)",
                "client total ms",
                "server decode ms",
                f"% of a {one_call_s:g} s call",
            ],
            rows,
        )
    )
    print(
        "\nBest of --repeats runs. client total = build_request (preprocess + payload) + body "
        "encoding + response decoding + parse_response (de-normalization), per observation; "
        "wire only leaves out the image preprocessing both transports share. Env worker -> "
        f"shard pipe (pickle round trip of one observation, {len(pickled) / 1024:.0f} KiB): "
        f"{pipe_ms:.3f} ms."
    )
    return {"rows": records, "pipe_ms": pipe_ms, "policy_call_s": one_call_s}


# ---------------------------------------------------------------------------------------------
# (e) planning and DAG build
# ---------------------------------------------------------------------------------------------


def plan_for(size: int) -> dict[str, Any]:
    """A plan section with exactly `size` episodes (up to 2,000: 4 suites x 10 tasks x 50)."""
    suites = ["libero_spatial", "libero_object", "libero_goal", "libero_10"]
    if size <= 10:
        return {"suites": suites[:1], "task_ids": list(range(size)), "num_trials_per_task": 1}
    if size <= 500 and size % 10 == 0:
        return {"suites": suites[:1], "task_ids": "all", "num_trials_per_task": size // 10}
    if size <= 2000 and size % 40 == 0:
        return {"suites": suites, "task_ids": "all", "num_trials_per_task": size // 40}
    raise SystemExit(f"--plan-sizes: {size} is not 1..10, a multiple of 10 up to 500, or of 40")


def section_e(args: argparse.Namespace) -> dict[str, Any]:
    from libero_eval.config import check_config
    from libero_eval.plan import plan_table

    rows, records = [], []
    workdir = Path(tempfile.mkdtemp(prefix="libero_bench_dag_"))
    try:
        for size in args.plan_sizes:
            overrides = {
                "run_id": f"bench_throughput_dag{size}",
                "plan": plan_for(size),
                "server": {"num_slots": args.slots, "reference": {"policy": "hold"}},
                "rollout": {"send_privileged_state": False},
            }
            config = default_config(**json.loads(json.dumps(overrides)))

            def plan(config=config):
                shards = check_config(config).shards
                return plan_table(shards), shards

            frame, shards = plan()
            if len(frame) != size:
                raise SystemExit(f"(e) planned {len(frame)} episodes, expected {size}")
            plan_ms = _best_ms(plan, 5)
            configfile = workdir / f"config{size}.json"
            configfile.write_text(json.dumps(overrides))
            command = [
                str(Path(sys.executable).with_name("snakemake")),
                "-n",
                "--nolock",
                "--cores",
                "2",
                "--configfile",
                str(configfile),
                "--quiet",
                "rules",
            ]
            started = time.perf_counter()
            done = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, check=False
            )
            dag_s = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"(e) {' '.join(command)} failed:\n{done.stderr[-2000:]}")
            totals = re.findall(r"^total\s+(\d+)", done.stdout + done.stderr, re.MULTILINE)
            jobs = int(totals[-1]) if totals else "?"
            rows.append([size, len(shards), args.slots, jobs, plan_ms, dag_s])
            records.append(
                {
                    "episodes": size,
                    "shards": len(shards),
                    "jobs": jobs,
                    "plan_ms": plan_ms,
                    "snakemake_n_s": dag_s,
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n### (e) Planning and DAG build ({args.slots} server slots, 1 shard per slot)\n")
    print(
        table(
            [
                "episodes",
                "shards",
                "slots",
                "DAG jobs",
                "plan ms (check + shards + table)",
                "snakemake -n s (incl. startup)",
            ],
            rows,
        )
    )
    return {"rows": records}


# ---------------------------------------------------------------------------------------------


def parse_task(text: str) -> tuple[str, int]:
    from libero_eval.plan import SUITE_NUM_TASKS

    suite, _, task = text.partition(":")
    if suite not in SUITE_NUM_TASKS or not task.isdigit() or int(task) >= SUITE_NUM_TASKS[suite]:
        raise argparse.ArgumentTypeError(
            f"--task {text!r} must be SUITE:TASK_ID with SUITE one of {sorted(SUITE_NUM_TASKS)} "
            "and a task id of that suite, e.g. libero_spatial:0"
        )
    return suite, int(task)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sections", default=SECTIONS, help="any of 'abcde' (default all)")
    parser.add_argument(
        "--task",
        type=parse_task,
        default=("libero_spatial", 0),
        help="SUITE:TASK_ID for (a), (b), (d) (default libero_spatial:0)",
    )
    parser.add_argument("--init-state", type=int, default=0, help="(a) init state")
    parser.add_argument("--seed", type=int, default=1140, help="random actions and env seed")
    parser.add_argument(
        "--chunks",
        type=int,
        default=6,
        help="(a) timed chunks of 16 steps, on_demand and physics (default 6)",
    )
    parser.add_argument(
        "--every-step-chunks",
        type=int,
        default=2,
        help="(a) timed chunks with per-step rendering (default 2)",
    )
    parser.add_argument(
        "--grid",
        type=parse_grid,
        default=parse_grid(DEFAULT_GRID_TEXT),
        help="(b) cells ENVSxSHARDSxINFLIGHT[m], comma-separated; m: each shard cycles over 10 "
        f"tasks (default {DEFAULT_GRID_TEXT})",
    )
    parser.add_argument(
        "--episode-steps",
        type=int,
        default=160,
        help="(b) policy steps per episode, multiple of 16 (default 160)",
    )
    parser.add_argument("--episodes-per-env", type=int, default=1, help="(b) default 1")
    parser.add_argument("--latency-fixed-s", type=float, default=0.5)
    parser.add_argument("--latency-per-item-s", type=float, default=0.05)
    parser.add_argument("--server-batch", type=int, default=8, help="server max batch size")
    parser.add_argument("--poll-s", type=float, default=0.05, help="(c) /v1/stats poll period")
    parser.add_argument("--cell-timeout-s", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=50, help="(d) timing repetitions")
    parser.add_argument(
        "--plan-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 10, 100, 2000],
        help="(e) episode counts",
    )
    parser.add_argument("--slots", type=int, default=8, help="(e) server slots")
    parser.add_argument("--json", type=Path, default=None, help="also write all figures here")
    args = parser.parse_args(argv)
    args.sections = args.sections.replace(",", "")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; use letters of {SECTIONS!r}")
    if args.episode_steps % CHUNK or args.episode_steps < 2 * CHUNK:
        parser.error(f"--episode-steps must be a multiple of {CHUNK} and >= {2 * CHUNK}")
    if min(args.chunks, args.every_step_chunks) < 1:
        parser.error("--chunks and --every-step-chunks must be >= 1")
    if args.every_step_chunks > args.chunks:
        parser.error("--every-step-chunks must not exceed --chunks")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.chdir(REPO_ROOT)
    machine = machine_summary()
    print(
        f"# Throughput benchmark\n\nmachine: {machine['nproc']} CPUs ({machine['cpu']}), "
        f"{machine['mem_gib']} GiB RAM, load average {machine['loadavg']} at start, "
        f"Python {machine['python']}, MUJOCO_GL={machine['mujoco_gl']}\n"
        f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}"
    )
    report: dict[str, Any] = {"machine": machine, "argv": sys.argv[1:]}
    env_result = None
    if "a" in args.sections:
        env_result = section_a(args)
        report["a"] = print_a(env_result)
    if "d" in args.sections:
        report["d"] = section_d(args, env_result)
    if "b" in args.sections or "c" in args.sections:
        report["bc"] = section_bc(args, env_result)
    if "e" in args.sections:
        report["e"] = section_e(args)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average at end: {report['loadavg_end']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
