"""Named episode protocols: how an episode starts, how long it runs and when it stops.

The protocol changes success rates as much as the policy does (wait steps, max steps,
stopping at success), so it is chosen by name and recorded in every result row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUITE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}


@dataclass(frozen=True)
class EpisodeProtocol:
    """How one episode runs.

    settle_steps: zero-action steps (gripper open) after reset, before the first policy query.
    count_settle_steps: whether those steps count towards max_steps (and `steps`).
    max_steps: policy steps per episode, per suite.
    stop_at_success: end the episode at the first success (else run to max_steps and report
        success_at_end from the last step).
    """

    name: str
    settle_steps: int
    count_settle_steps: bool
    stop_at_success: bool
    max_steps: dict[str, int] = field(default_factory=dict)
    default_max_steps: int = 480

    def max_steps_for(self, suite: str) -> int:
        return self.max_steps.get(suite, self.default_max_steps)


PROTOCOLS: dict[str, EpisodeProtocol] = {
    # RLinf's Cosmos3 SGLang evaluation: 15 uncounted settle steps, 480 steps, no early stop.
    "rlinf": EpisodeProtocol(
        name="rlinf",
        settle_steps=15,
        count_settle_steps=False,
        stop_at_success=False,
        default_max_steps=480,
    ),
    # NVIDIA cosmos-framework's LIBERO eval: 10 counted wait steps, per-suite limits, stop.
    "cosmos": EpisodeProtocol(
        name="cosmos",
        settle_steps=10,
        count_settle_steps=True,
        stop_at_success=True,
        max_steps=dict(SUITE_MAX_STEPS),
    ),
    # openpi's LIBERO example: the same limits as cosmos-framework.
    "openpi": EpisodeProtocol(
        name="openpi",
        settle_steps=10,
        count_settle_steps=True,
        stop_at_success=True,
        max_steps=dict(SUITE_MAX_STEPS),
    ),
}


def get_protocol(name: str, max_steps_override: int | None = None) -> EpisodeProtocol:
    """The named protocol, optionally with every suite's max steps replaced (for short tests)."""
    try:
        protocol = PROTOCOLS[name]
    except KeyError:
        raise ValueError(
            f"rollout.protocol: unknown episode protocol {name!r}; choose one of "
            f"{sorted(PROTOCOLS)}"
        ) from None
    if max_steps_override is None:
        return protocol
    return EpisodeProtocol(
        name=protocol.name,
        settle_steps=protocol.settle_steps,
        count_settle_steps=protocol.count_settle_steps,
        stop_at_success=protocol.stop_at_success,
        max_steps={},
        default_max_steps=int(max_steps_override),
    )
