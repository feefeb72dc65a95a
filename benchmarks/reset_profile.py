"""Where one episode of our rollout spends its time, phase by phase (real LIBERO).

Runs `LiberoEpisodeEnv` (what each env worker process runs) on one task: env creation, then
episodes of settle steps + seeded random chunks of 16 actions, rendering on demand. Every phase
of `env.reset()` (robosuite's `_load_model` with LIBERO's arena / fixtures / objects XML,
`get_xml`, the `MjModel` compile, sim and renderer creation, `_reset_internal`, placement
sampling, observables setup, the first observation), `set_init_state`, the settle steps, the
policy steps and the camera renders are timed by wrapping the methods that do them; nested
phases are indented and their time is also counted in their parent. Prints Markdown tables:
per phase, the mean seconds per episode over the timed episodes (episode 0, which creates the
env, is reported apart), and optionally cProfile's top functions of the timed episodes.

    MUJOCO_GL=egl .venv/bin/python benchmarks/reset_profile.py --reset-mode hard
    MUJOCO_GL=egl .venv/bin/python benchmarks/reset_profile.py --reset-mode fast --cprofile 25

There is no policy wait in this loop (the actions are in-process); in a rollout the env worker
waits for the server between chunks, which costs it no CPU.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import io
import os
import pstats
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
os.environ.setdefault("OMP_NUM_THREADS", "1")


class PhaseTimer:
    """Inclusive wall and CPU seconds per labelled phase; nesting is kept for the table."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.parent: dict[str, str | None] = {}
        self.order: list[str] = []
        self._stack: list[str] = []

    def wrap(
        self, owner: Any, name: str, label: str, *, static: bool = False, parent: str = ""
    ) -> None:
        """Replace `owner.name` (an instance or a class attribute) by a timed version; the
        table nests it under `parent`, else under the phase it was first called from."""
        original = getattr(owner, name)
        timer = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if label not in timer.parent:
                caller = timer._stack[-1] if timer._stack else None
                timer.parent[label] = parent or (None if caller == "episode" else caller)
                timer.order.append(label)
            timer._stack.append(label)
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                timer.wall[label] += time.perf_counter() - wall
                timer.cpu[label] += time.process_time() - cpu
                timer.calls[label] += 1
                timer._stack.pop()

        setattr(owner, name, staticmethod(timed) if static else timed)

    def snapshot(self) -> dict[str, tuple[float, float, int]]:
        return {k: (self.wall[k], self.cpu[k], self.calls[k]) for k in self.order}

    def depth(self, label: str) -> int:
        depth, parent = 0, self.parent.get(label)
        while parent not in (None, "-"):
            depth, parent = depth + 1, self.parent.get(parent)
        return depth


def instrument_classes(timer: PhaseTimer) -> None:
    """Class-level phases: shared by every env the process builds."""
    from robosuite.models.base import MujocoXML
    from robosuite.utils import binding_utils
    from robosuite.utils.placement_samplers import SequentialCompositeSampler

    timer.wrap(MujocoXML, "get_xml", "get_xml (model to XML string)", parent="env.reset()")
    from_xml = binding_utils.MjSim.from_xml_string.__func__

    def compile_xml(xml):
        return from_xml(binding_utils.MjSim, xml)

    binding_utils.MjSim.from_xml_string = staticmethod(compile_xml)
    timer.wrap(
        binding_utils.MjSim,
        "from_xml_string",
        "MjModel compile + MjData",
        static=True,
        parent="_initialize_sim",
    )
    timer.wrap(
        binding_utils.MjRenderContext,
        "__init__",
        "renderer: EGL context + MjrContext",
        parent="_reset_internal",
    )
    timer.wrap(binding_utils.MjSim, "render", "camera render (sim.render)", parent="-")
    timer.wrap(SequentialCompositeSampler, "sample", "placement sampling", parent="_reset_internal")
    from libero_eval.rollout import fast_reset

    timer.wrap(
        fast_reset.FastReset,
        "__init__",
        "fast: install (snapshot of the creation's compile)",
        parent="env creation (LiberoEpisodeEnv._load)",
    )
    timer.wrap(fast_reset.ModelSnapshot, "__init__", "fast: model snapshot")
    timer.wrap(fast_reset.ModelSnapshot, "restore", "fast: restore model", parent="env.reset()")
    timer.wrap(binding_utils.MjSim, "reset", "fast: mj_resetData", parent="env.reset()")


def instrument_env(timer: PhaseTimer, env) -> None:
    """Instance-level phases of one LiberoEpisodeEnv's inner LIBERO env."""
    outer = env._env
    inner = outer.env
    if getattr(inner, "_profiled", False):
        return
    inner._profiled = True
    timer.wrap(inner, "reset", "env.reset()", parent="start_episode")
    timer.wrap(inner, "_destroy_viewer", "destroy renderer", parent="env.reset()")
    timer.wrap(inner, "_destroy_sim", "destroy sim", parent="env.reset()")
    for name, label in (
        ("_load_model", "_load_model"),
        ("_load_robots", "robot models"),
        ("_load_fixtures_in_arena", "LIBERO fixtures XML"),
        ("_load_objects_in_arena", "LIBERO objects XML"),
        ("_setup_placement_initializer", "LIBERO placement samplers"),
        ("_initialize_sim", "_initialize_sim"),
        ("_reset_internal", "_reset_internal"),
        ("_setup_observables", "observables setup"),
        ("_get_observations", "get observations"),
    ):
        timer.wrap(inner, name, label)
    timer.wrap(inner, "step", "env.step (settle + policy steps)", parent="-")
    timer.wrap(outer, "set_init_state", "set_init_state", parent="start_episode")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from libero_eval.rollout.libero_env import (
        EnvSettings,
        EpisodeOutcome,
        EpisodeSpec,
        LiberoEpisodeEnv,
        seeded_action_chunks,
    )
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    timer = PhaseTimer()
    instrument_classes(timer)
    protocol = get_protocol("openpi", max_steps_override=args.steps, seed=7)
    protocol = dataclasses.replace(protocol, actions_per_query=None)
    timer.wrap(LiberoEpisodeEnv, "_load", "env creation (LiberoEpisodeEnv._load)")
    timer.wrap(LiberoEpisodeEnv, "start_episode", "start_episode")
    timer.wrap(LiberoEpisodeEnv, "step_chunk", "step_chunk (policy steps)")
    env = LiberoEpisodeEnv(build(EnvSettings, "rollout", reset_mode=args.reset_mode), protocol)
    episodes: list[dict[str, Any]] = []
    profiler = cProfile.Profile() if args.cprofile else None
    try:
        for episode in range(args.episodes + 1):
            before = timer.snapshot()
            if profiler is not None and episode == 1:
                profiler.enable()
            wall, cpu = time.perf_counter(), time.process_time()
            spec = EpisodeSpec(args.suite, args.task, episode % args.init_states)
            timer._stack.append("episode")
            env._load(spec.suite, spec.task_id)
            instrument_env(timer, env)
            env.start_episode(spec)
            result = None
            for chunk in seeded_action_chunks(seed=episode, count=-(-args.steps // 16)):
                result = env.step_chunk(chunk)
                if isinstance(result, EpisodeOutcome):
                    break
            timer._stack.pop()
            episodes.append(
                {
                    "wall": time.perf_counter() - wall,
                    "cpu": time.process_time() - cpu,
                    "phases": _delta(before, timer.snapshot()),
                }
            )
    finally:
        if profiler is not None:
            profiler.disable()
        env.close()
    return {"timer": timer, "episodes": episodes, "profiler": profiler}


def _delta(before: dict, after: dict) -> dict[str, tuple[float, float, int]]:
    out = {}
    for label, (wall, cpu, calls) in after.items():
        w0, c0, n0 = before.get(label, (0.0, 0.0, 0))
        out[label] = (wall - w0, cpu - c0, calls - n0)
    return out


def _tree_order(timer: PhaseTimer) -> list[str]:
    children: dict[str | None, list[str]] = defaultdict(list)
    for label in timer.order:
        parent = timer.parent[label]
        children[None if parent == "-" else parent].append(label)
    out: list[str] = []

    def visit(label: str | None) -> None:
        for child in children.get(label, []):
            out.append(child)
            visit(child)

    visit(None)
    return out


def markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    timer: PhaseTimer = result["timer"]
    episodes = result["episodes"]
    timed = episodes[1:] or episodes
    lines = [
        f"{args.suite} task {args.task}, reset_mode {args.reset_mode}, settle 10 + "
        f"{args.steps} policy steps, {len(timed)} timed episodes after episode 0 (creation)",
        "",
        "| phase | calls/episode | s/episode wall | s/episode CPU | episode 0 wall s |",
        "|---|---|---|---|---|",
    ]
    for label in _tree_order(timer):
        n = len(timed)
        wall = sum(e["phases"].get(label, (0, 0, 0))[0] for e in timed) / n
        cpu = sum(e["phases"].get(label, (0, 0, 0))[1] for e in timed) / n
        calls = sum(e["phases"].get(label, (0, 0, 0))[2] for e in timed) / n
        first = episodes[0]["phases"].get(label, (0, 0, 0))[0]
        indent = "&nbsp;&nbsp;" * (timer.depth(label) - (timer.parent.get(label) == "-"))
        lines.append(f"| {indent}{label} | {calls:g} | {wall:.3f} | {cpu:.3f} | {first:.3f} |")
    wall = sum(e["wall"] for e in timed) / len(timed)
    cpu = sum(e["cpu"] for e in timed) / len(timed)
    lines.append(f"| **whole episode** | 1 | {wall:.3f} | {cpu:.3f} | {episodes[0]['wall']:.3f} |")
    if result["profiler"] is not None:
        stream = io.StringIO()
        stats = pstats.Stats(result["profiler"], stream=stream)
        stats.sort_stats("cumulative").print_stats(args.cprofile)
        lines += ["", "cProfile, timed episodes, by cumulative time:", "", "```"]
        lines += [line for line in stream.getvalue().splitlines() if line.strip()][
            -args.cprofile - 2 :
        ]
        lines.append("```")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=3, help="timed episodes after episode 0")
    parser.add_argument("--init-states", type=int, default=50, help="episode i runs init i %% N")
    parser.add_argument("--steps", type=int, default=112, help="policy steps per episode")
    parser.add_argument("--reset-mode", choices=("hard", "fast"), default="hard")
    parser.add_argument("--cprofile", type=int, default=0, help="print cProfile's top N")
    args = parser.parse_args()
    print(f"uptime: {os.getloadavg()}")
    result = run(args)
    print(markdown(result, args))
    print(f"\nuptime: {os.getloadavg()}")


if __name__ == "__main__":
    main()
