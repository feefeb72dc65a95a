"""(a) env stepping: per-step rendering, render on demand, physics only (the floor), physics
with robosuite's own step loop (its controller's repeated forward, which the rollout skips:
`libero_eval.rollout.single_forward`) and one render of the two cameras, timed in turns on the
same episode."""

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
    robosuite_loop: Cost  # the same, robosuite's own step loop (two forwards before the torques)
    render: Cost  # per render of both cameras
    identical_queries: int
    compared_queries: int
    identical_loop_states: int  # robosuite's loop and ours, sim state after each chunk
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
    from libero_eval.rollout import single_forward
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
    install = single_forward.install
    single_forward.install = lambda env: False  # robosuite's own loop in this env
    try:
        loop_env, _ = start("on_demand")
    finally:
        single_forward.install = install
    for camera in CAMERAS:
        for env in (physics_env, loop_env):
            env._env.env._observables[f"{camera}_image"].set_enabled(False)
    sensors = _camera_sensors(lazy_env)
    on_demand, every_step, physics, render = Cost(), Cost(), Cost(), Cost()
    robosuite_loop, identical_loop_states = Cost(), 0
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
            with measure(robosuite_loop, count=CHUNK):
                for action in chunk:
                    loop_env._env.step(action)
            identical_loop_states += int(
                np.array_equal(physics_env.sim_state(), loop_env.sim_state())
            )
            if index < args.every_step_chunks:
                with measure(every_step):
                    observation = step_env.step_chunk(chunk)
                step_queries.append((observation, step_env.sim_state()))
    finally:
        for env in (lazy_env, step_env, physics_env, loop_env):
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
        robosuite_loop=robosuite_loop,
        render=render,
        identical_queries=identical,
        compared_queries=min(len(lazy_queries), len(step_queries)),
        identical_loop_states=identical_loop_states,
        observation=lazy_queries[-1][0],
    )


def print_a(result: EnvResult) -> dict[str, Any]:
    od, es, ph, rd = result.on_demand, result.every_step, result.physics, result.render
    rl = result.robosuite_loop
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
        [
            "physics only, robosuite's own step loop",
            rl.wall_ms,
            rl.cpu_ms,
            1000 / rl.wall_ms,
            CHUNK * rl.cpu_ms,
            rl.count // CHUNK,
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
                [
                    "physics: robosuite's loop / ours (one forward a substep)",
                    rl.cpu_ms / ph.cpu_ms,
                    rl.wall_ms / ph.wall_ms,
                    "",
                ],
                [
                    "identical sim state after each chunk, robosuite's loop and ours",
                    f"{result.identical_loop_states}/{ph.count // CHUNK}",
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
        "robosuite_loop": vars(rl),
        "identical_loop_states": result.identical_loop_states,
        "render": vars(rd),
        "irreducible_cpu_ms": result.irreducible_cpu_ms,
        "ratio_cpu": ratio_cpu,
        "ratio_wall": ratio_wall,
        "speedup_cpu": speedup_cpu,
        "speedup_wall": speedup_wall,
        "identical_queries": result.identical_queries,
        "compared_queries": result.compared_queries,
    }
