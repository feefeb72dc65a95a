"""(a) env stepping: per-step rendering, render on demand, physics only (the floor) and one
render of the two cameras, timed in turns on the same episode."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from throughput_sections.common import CHUNK, Cost, measure, table


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
    from libero_eval.rollout.render_on_demand import CAMERAS

    observables = env._env.env._observables
    sensors = []
    for camera in CAMERAS:
        sensor = observables[f"{camera}_image"]._sensor
        sensors.append(getattr(sensor, "_sensor", sensor))
    return sensors


def section_a(args: argparse.Namespace) -> EnvResult:
    from libero_eval.rollout.libero_env import (
        EnvSettings,
        EpisodeSpec,
        LiberoEpisodeEnv,
        seeded_action_chunks,
    )
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.rollout.render_on_demand import CAMERAS
    from libero_eval.settings_schema import build

    suite, task_id = args.task
    spec = EpisodeSpec(suite, task_id, args.init_state)
    chunks = seeded_action_chunks(args.seed, 1 + args.chunks)
    protocol = get_protocol("rlinf", max_steps_override=CHUNK * (len(chunks) + 1), seed=args.seed)
    print(f"(a) {suite} task {task_id} init {args.init_state} ...", file=sys.stderr)

    def start(render_mode: str) -> tuple[Any, list]:
        """An env on the episode, one chunk in (warm-up), and the queries so far."""
        env = LiberoEpisodeEnv(build(EnvSettings, "rollout", render_mode=render_mode), protocol)
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
