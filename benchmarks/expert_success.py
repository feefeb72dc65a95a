"""Success rate of the scripted expert run directly against LIBERO (no HTTP).

Every chunk goes through the same action round trip as Cosmos3's: LIBERO 7-D ->
``libero_to_model_chunk`` (normalized rot6d, 10 channels) -> ``model_chunk_to_libero`` (binary
gripper), so the measured success is what the workflow gets. Episodes follow a named protocol
of ``libero_eval.rollout.protocols`` (settle steps, max steps, stop at success or not).

    MUJOCO_GL=egl python benchmarks/expert_success.py --suite libero_spatial --trials 5

Prints one line per episode, then success rate and mean steps per task and overall.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from libero_eval import package_data

DEFAULT_STATS = package_data.path("stats/libero_native_frame_wise_relative_rot6d.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        default="libero_spatial",
        help="a suite libero_eval.suites lists as runnable, e.g. libero_spatial_swap",
    )
    parser.add_argument(
        "--tasks", default="all", help="task ids, e.g. '0,3,5' or '0-4' or 'all' (default)"
    )
    parser.add_argument("--trials", type=int, default=5, help="init states per task (from 0)")
    parser.add_argument("--first-trial", type=int, default=0, help="first init state index")
    parser.add_argument(
        "--protocol", default="cosmos", help="episode protocol: cosmos (default), rlinf, openpi"
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="override the protocol's max policy steps"
    )
    parser.add_argument("--action-horizon", type=int, default=16)
    parser.add_argument("--stats", type=Path, default=DEFAULT_STATS)
    parser.add_argument(
        "--no-round-trip", action="store_true", help="skip the model action encoding round trip"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    return parser.parse_args(argv)


def parse_task_ids(spec: str, n_tasks: int) -> list[int]:
    if spec == "all":
        return list(range(n_tasks))
    ids: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            low, high = part.split("-")
            ids.extend(range(int(low), int(high) + 1))
        else:
            ids.append(int(part))
    bad = [i for i in ids if not 0 <= i < n_tasks]
    if bad:
        raise SystemExit(f"--tasks: task ids {bad} out of range 0..{n_tasks - 1}")
    return ids


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero_eval import suites as suite_catalog

    suite_catalog.expand_suites([args.suite])  # a clear error for suites that cannot run

    from libero.libero import benchmark

    from libero_eval.policy.families.cosmos3.actions import (
        libero_to_model_chunk,
        load_action_stats,
        model_chunk_to_libero,
    )
    from libero_eval.reference.policies.base import PolicyItem
    from libero_eval.reference.policies.scripted import ScriptedExpertPolicy
    from libero_eval.rollout.libero_env import physics_only_env
    from libero_eval.rollout.privileged import privileged_state
    from libero_eval.rollout.protocols import get_protocol, reset_seed_of

    protocol = get_protocol(args.protocol, args.max_steps)
    max_steps = protocol.policy_steps_for(args.suite)
    stats = load_action_stats(args.stats, "global_raw")
    policy = ScriptedExpertPolicy()
    suite = benchmark.get_benchmark_dict()[args.suite]()
    task_ids = parse_task_ids(args.tasks, suite.n_tasks)
    dummy_image = np.zeros((8, 8, 3), dtype=np.uint8)

    def round_trip(chunk: np.ndarray) -> np.ndarray:
        if args.no_round_trip:
            return chunk
        model = libero_to_model_chunk(chunk, stats)
        return model_chunk_to_libero(
            model, stats, num_action_chunks=len(chunk), gripper_mapping="binary"
        )

    results = []
    started = time.time()
    for task_id in task_ids:
        task = suite.get_task(task_id)
        env = physics_only_env(args.suite, task_id)
        init_states = suite.get_task_init_states(task_id)
        for trial in range(args.first_trial, args.first_trial + args.trials):
            init_state_id = trial % len(init_states)
            np.random.seed(reset_seed_of(protocol, "episode", args.suite, task_id, init_state_id))
            env.reset()
            obs = env.set_init_state(init_states[init_state_id])
            settle = np.zeros(7)
            settle[6] = -1.0
            for _ in range(protocol.settle_steps):
                obs, _, _, _ = env.step(settle)
            policy_steps = 0
            success = False
            first_success = None
            error = ""
            while policy_steps < max_steps and not (success and protocol.stop_at_success):
                state = json.loads(json.dumps(privileged_state(env, obs)))
                prompt = suite_catalog.instruction(args.suite, task_id) or task.language
                item = PolicyItem(image=dummy_image, prompt=prompt, privileged_state=state)
                try:
                    chunk = policy.act([item], args.action_horizon)[0]
                except (NotImplementedError, ValueError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    break
                for action in round_trip(chunk)[: protocol.actions_per_query]:
                    if policy_steps >= max_steps and not protocol.run_whole_chunks:
                        break
                    obs, _, done, _ = env.step(action)
                    policy_steps += 1
                    success = bool(done)
                    if success and first_success is None:
                        first_success = protocol.reported_steps(policy_steps)
                    if success and protocol.stop_at_success:
                        break
            steps = protocol.reported_steps(policy_steps)
            row = {
                "suite": args.suite,
                "task_id": task_id,
                "trial": trial,
                "success": success,
                "first_success_step": first_success,
                "steps": steps,
                "error": error,
            }
            results.append(row)
            print(
                f"{args.suite} task {task_id} trial {trial}: "
                f"{'SUCCESS' if success else 'fail'} steps={steps} first_success={first_success}"
                + (f" ({error})" if error else ""),
                flush=True,
            )
        env.close()

    print(f"\nprotocol={protocol.name} max_steps={max_steps} round_trip={not args.no_round_trip}")
    print(f"{'task':>5} {'success':>9} {'rate':>6} {'mean steps (successes)':>24}")
    for task_id in task_ids:
        rows = [r for r in results if r["task_id"] == task_id]
        wins = [r for r in rows if r["success"]]
        mean_steps = np.mean([r["first_success_step"] for r in wins]) if wins else float("nan")
        print(
            f"{task_id:>5} {len(wins):>4}/{len(rows):<4} {len(wins) / len(rows):>6.0%} "
            f"{mean_steps:>24.1f}"
        )
    wins = [r for r in results if r["success"]]
    mean_steps = np.mean([r["first_success_step"] for r in wins]) if wins else float("nan")
    print(
        f"overall {len(wins)}/{len(results)} = {len(wins) / max(1, len(results)):.1%}, "
        f"mean steps to success {mean_steps:.1f}, wall {time.time() - started:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
