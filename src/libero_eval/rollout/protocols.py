"""Named episode protocols: how an episode starts, how long it runs, when it stops, and how its
scene is seeded.

The protocol changes success rates as much as the policy does (wait steps, step limits,
actions per query, stopping at success), so it is chosen by name and recorded in every result
row. Each value below is taken from the protocol's reference implementation; `docs/protocols.md`
cites the file and line of every one.

Seeding. LIBERO's `env.seed(s)` only seeds numpy's global stream, and every `reset()`
re-samples where the fixtures (cabinets, stoves, ...) stand from that stream; `set_init_state`
restores objects and the robot only. So the stream at each reset decides the scene. With
`reset_seeding: episode` (the default) it is seeded right before every reset with
`episode_seed(seed, suite, task, init state)`, a function of the episode alone. With
`reset_seeding: reference` the env reproduces a reference that seeds once per task and runs its
trials in order (openpi, cosmos-framework): trial i's reset draws from the stream left by i
earlier resets, which the env replays exactly (measured: fixture positions and first images
byte-identical to the sequential run). RLinf's stream depends on its env rank and slot, not on
the episode, and cannot be reproduced from the episode alone.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field

import numpy as np

from libero_eval.suites import base_suite, catalog, pairing

RESET_SEEDINGS = ("episode", "reference")

# cosmos-framework closed_loop_eval.py TASK_MAX_STEPS == openpi examples/libero/main.py.
REFERENCE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}

# RLinf: libero_spatial 480 from its SGLang evaluation config; the other suites take the
# longer limit of RLinf's LIBERO evaluation guide and configs (docs/protocols.md cites each).
RLINF_MAX_STEPS = {
    "libero_spatial": 480,
    "libero_object": 512,
    "libero_goal": 512,
    "libero_10": 520,
    "libero_90": 512,
}


# LeRobot 0.6.1 envs/libero.py TASK_SUITE_MAX_STEPS (policy steps; the waits come on top).
LEROBOT_MAX_STEPS = {
    "libero_spatial": 280,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}


@dataclass(frozen=True)
class EpisodeProtocol:
    """How one episode runs.

    settle_steps: zero-action steps (gripper open) after reset, before the first policy query.
    settle_within_limit: the settle steps use up part of max_steps (cosmos-framework counts
        them inside its loop bound), else they come on top of it.
    count_settle_steps: the reported `steps` and `first_success_step` include the settle steps.
    stop_at_success: end the episode at the first success (else run to the limit and report
        success_at_end from the last step).
    max_steps: the step limit per suite (default_max_steps for other suites).
    actions_per_query: execute only the first N actions of each chunk, then query again
        (openpi's replan_steps); None executes the whole chunk.
    run_whole_chunks: the limit is checked between chunks, so the last chunk runs to its end
        (RLinf); else the episode stops at the limit inside a chunk.
    seed: the protocol's seed (openpi 7, cosmos-framework 0, RLinf 0).
    replays_reference_stream: the reference seeds once per task and runs trials in order, so
        `reset_seeding: reference` can reproduce its stream exactly.
    seed_per_trial: the reference seeds every reset with `seed + trial` (lerobot-eval's
        `start_seed + episode index`), which `reset_seeding: reference` reproduces directly.
    """

    name: str
    settle_steps: int
    settle_within_limit: bool
    count_settle_steps: bool
    stop_at_success: bool
    seed: int
    max_steps: dict[str, int] = field(default_factory=dict)
    default_max_steps: int = 480
    actions_per_query: int | None = None
    run_whole_chunks: bool = False
    replays_reference_stream: bool = False
    seed_per_trial: bool = False

    def with_seed(self, seed: int | None) -> EpisodeProtocol:
        """This protocol under run seed `seed` (one of `plan.seeds`); None keeps its seed."""
        return self if seed is None else dataclasses.replace(self, seed=int(seed))

    def max_steps_for(self, suite: str) -> int:
        """The step limit of `suite`'s base suite (settle steps included when
        settle_within_limit): a perturbation runs as long as its clean suite."""
        return self.max_steps.get(base_suite(suite) or suite, self.default_max_steps)

    def policy_steps_for(self, suite: str) -> int:
        """Policy steps an episode may take in `suite` (before whole-chunk rounding)."""
        limit = self.max_steps_for(suite)
        return limit - self.settle_steps if self.settle_within_limit else limit

    def reported_steps(self, policy_steps: int) -> int:
        """`steps` as the result row reports it."""
        return policy_steps + (self.settle_steps if self.count_settle_steps else 0)


PROTOCOLS: dict[str, EpisodeProtocol] = {
    # RLinf's SGLang evaluation: 15 uncounted settle steps, run to the limit in whole
    # chunks with terminations ignored (success_once / success_at_end).
    "rlinf": EpisodeProtocol(
        name="rlinf",
        settle_steps=15,
        settle_within_limit=False,
        count_settle_steps=False,
        stop_at_success=False,
        seed=0,
        max_steps=dict(RLINF_MAX_STEPS),
        default_max_steps=512,
        run_whole_chunks=True,
    ),
    # NVIDIA cosmos-framework's closed_loop_eval.py: 10 wait steps inside the step limit,
    # whole chunks, stop at success, seed 0 set per task.
    "cosmos": EpisodeProtocol(
        name="cosmos",
        settle_steps=10,
        settle_within_limit=True,
        count_settle_steps=True,
        stop_at_success=True,
        seed=0,
        max_steps=dict(REFERENCE_MAX_STEPS),
        default_max_steps=400,
        replays_reference_stream=True,
    ),
    # openpi's examples/libero/main.py: 10 wait steps on top of the limit, replan every 5
    # actions, stop at success, seed 7 set per task.
    "openpi": EpisodeProtocol(
        name="openpi",
        settle_steps=10,
        settle_within_limit=False,
        count_settle_steps=True,
        stop_at_success=True,
        seed=7,
        max_steps=dict(REFERENCE_MAX_STEPS),
        default_max_steps=400,
        actions_per_query=5,
        replays_reference_stream=True,
    ),
    # LeRobot 0.6.1 lerobot-eval on LIBERO (envs/libero.py, scripts/lerobot_eval.py): reset
    # seeded with 1000 + episode index (episode i of a task takes init state i), 10 waits
    # inside reset() that the step count does not see, then the suite's limit, stop at
    # success; the published π0.5 run executes n_action_steps=10 actions per query.
    "lerobot": EpisodeProtocol(
        name="lerobot",
        settle_steps=10,
        settle_within_limit=False,
        count_settle_steps=False,
        stop_at_success=True,
        seed=1000,
        max_steps=dict(LEROBOT_MAX_STEPS),
        default_max_steps=400,
        actions_per_query=10,
        seed_per_trial=True,
    ),
}


def get_protocol(
    name: str, max_steps_override: int | None = None, seed: int | None = None
) -> EpisodeProtocol:
    """The named protocol; `max_steps_override` replaces every suite's limit (short test runs),
    `seed` replaces the protocol's seed."""
    try:
        protocol = PROTOCOLS[name]
    except KeyError:
        raise ValueError(
            f"rollout.protocol: unknown episode protocol {name!r}; choose one of "
            f"{sorted(PROTOCOLS)}"
        ) from None
    changes: dict = {}
    if max_steps_override is not None:
        changes.update(max_steps={}, default_max_steps=int(max_steps_override))
    if seed is not None:
        changes["seed"] = int(seed)
    return dataclasses.replace(protocol, **changes) if changes else protocol


def episode_seed(seed: int, suite: str, task_id: int, init_state_id: int) -> int:
    """The numpy seed set before an episode's reset under `reset_seeding: episode`.

    numpy's SeedSequence mixes (protocol seed, CRC-32 of the suite name, task, init state) into
    one 32-bit seed, so it depends on the episode alone and never on the worker or the order.
    """
    words = [int(seed) & 0xFFFFFFFF, zlib.crc32(suite.encode()), int(task_id), int(init_state_id)]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint32)[0])


def _seeding_episode(suite: str, task_id: int) -> tuple[str, int]:
    """The (suite, task) whose seed an episode takes: a perturbation task that pairs with a clean
    task (libero_eval.suites.pairing) takes the clean task's, so both see the same reset stream."""
    if suite in catalog()["suites"] and base_suite(suite) not in (None, suite):
        clean_task_id, _why_not = pairing(suite, task_id)
        if clean_task_id is not None:
            return base_suite(suite), clean_task_id
    return suite, task_id


def reset_seed_of(
    protocol: EpisodeProtocol, reset_seeding: str, suite: str, task_id: int, init_state_id: int
) -> int:
    """The seed the env sets for this episode's reset stream (recorded in the result row).

    Under `reference`, the stream starts from the protocol seed and the env replays the
    `init_state_id` earlier resets of the task first; a protocol that seeds every trial
    (`seed_per_trial`, LeRobot) takes `seed + init_state_id` and replays nothing.
    """
    if reset_seeding == "episode":
        return episode_seed(protocol.seed, *_seeding_episode(suite, task_id), init_state_id)
    if reset_seeding == "reference":
        return protocol.seed + (int(init_state_id) if protocol.seed_per_trial else 0)
    raise ValueError(
        f"rollout.reset_seeding: {reset_seeding!r} is not one of {list(RESET_SEEDINGS)}"
    )
