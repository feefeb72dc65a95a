"""(b) + (c) end to end through the reference server: real ShardRunner shards, each in its own
process, against the reference server's latency model, and the server's duty cycle from
GET /v1/stats."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from throughput_sections.common import STATS, default_config, table
from throughput_sections.env import EnvResult


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
    from libero_eval.policy.families import make_adapter
    from libero_eval.rollout.libero_env import EnvSettings
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.rollout.runner import ShardRunner
    from libero_eval.rollout.shard_settings import ShardSettings
    from libero_eval.rollout.startup import ServerGate, ServerInfo
    from libero_eval.settings_schema import build
    from libero_eval.store import EpisodeStore

    config = default_config()
    settings = ShardSettings(
        run_id=config["run_id"],
        shard=name,
        slot=0,
        protocol=get_protocol("rlinf", max_steps, config["plan"]["seed"]),
        env=build(EnvSettings, "rollout", render_mode="on_demand"),
        adapter=make_adapter("cosmos3", config["policy"]["cosmos3"]),
        envs_per_shard=cell.envs_per_shard,
        total_num_envs=None,
        max_inflight_requests=cell.inflight,
        merged_dispatch="batches",
        batch_timeout_s=config["rollout"]["batch_timeout_s"],
        health_timeout_s=config["server"]["health_timeout_s"],
    )

    def progress(done: int, total: int, _successes: int) -> None:
        events.put((time.monotonic(), name, done, total))

    server = ServerGate.known(ServerInfo(url, max_batch, None, time.time()))
    runner = ShardRunner(settings, EpisodeStore(store_root), server, progress=progress)
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
        family_settings={"action_stats_path": STATS},
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
