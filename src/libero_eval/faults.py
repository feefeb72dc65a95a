"""Opt-in fault injection for the fault-tolerance tests and the CI Slurm run.

Faults are read from the environment variable ``LIBERO_EVAL_FAULT``: ``;``-separated
``name=value`` items, parsed here into a :class:`Faults` plan. When it is unset,
:func:`active_faults` returns None and no code path changes. Set, the rollout job is composed
with wrappers that carry the plan out (``libero_eval.rollout.fault_injection``): its env
workers are wrapped in ``FaultyEnv``, its policy connections in ``FaultyConnection`` and its
episode store in ``FaultyStore``; the shard runner's loop has no fault hook. Episode and
request counts are 1-based and count what THIS shard process did (a rerun starts again at 1).

=============================== ==================================================================
``crash_env_at_episode=N``      the env worker running the shard's N-th episode start kills
                                itself (SIGKILL) after the reset: a crashed env process
``raise_env_at_episode=N``      the env raises while starting the shard's N-th episode
``nan_action_at_episode=N``     the policy's first action chunk of the N-th episode is NaN
``reject_request_at=N``         the shard's N-th policy request is rejected, as an HTTP 4xx is:
                                the shard fails at once (its finished episodes are kept)
``exit_shard_after_episodes=N`` the shard process SIGKILLs itself once N episodes are persisted
``disk_full_after_episodes=N``  once N episodes are persisted, the disk is full for the store:
                                each later record's temporary file is /dev/full, whose writes
                                fail with the kernel's ENOSPC
``fail_shard_once=SHARD:MARKER`` shard SHARD fails (exit 1) after its first persisted episode,
                                once: it creates the file MARKER, and passes when MARKER exists
=============================== ==================================================================
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "LIBERO_EVAL_FAULT"
_COUNTS = (
    "crash_env_at_episode",
    "raise_env_at_episode",
    "nan_action_at_episode",
    "reject_request_at",
)
_AFTER_PERSISTED = ("exit_shard_after_episodes", "disk_full_after_episodes")


class InjectedFault(RuntimeError):
    """A failure raised on purpose by fault injection."""


@dataclass(frozen=True)
class Faults:
    """The parsed fault plan (None fields are off)."""

    crash_env_at_episode: int | None = None
    raise_env_at_episode: int | None = None
    nan_action_at_episode: int | None = None
    reject_request_at: int | None = None
    exit_shard_after_episodes: int | None = None
    disk_full_after_episodes: int | None = None
    fail_shard_once: tuple[str, Path] | None = None

    def after_episode_persisted(self, shard: str, persisted: int) -> None:
        """Called (by ``FaultyStore``) after each durable episode record of this process."""
        if self.exit_shard_after_episodes is not None and persisted >= (
            self.exit_shard_after_episodes
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fail_shard_once is not None:
            target, marker = self.fail_shard_once
            if shard == target and not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"{shard} failed once on purpose\n")
                raise InjectedFault(
                    f"{shard}: injected failure (fail_shard_once, marker {marker}); "
                    "the next attempt passes"
                )


def parse_faults(text: str) -> Faults:
    """Parse a ``LIBERO_EVAL_FAULT`` value; unknown or malformed items raise ValueError."""
    values: dict = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"{ENV_VAR}: item {item!r} must look like name=value")
        if name in (*_COUNTS, *_AFTER_PERSISTED):
            try:
                count = int(value)
            except ValueError:
                count = 0
            if count < 1:
                raise ValueError(f"{ENV_VAR}: {name} needs an integer >= 1, got {value!r}")
            values[name] = count
        elif name == "fail_shard_once":
            shard, colon, marker = value.partition(":")
            if not colon or not shard or not marker:
                raise ValueError(
                    f"{ENV_VAR}: fail_shard_once needs SHARD:MARKER_FILE, got {value!r}"
                )
            values[name] = (shard, Path(marker))
        else:
            raise ValueError(
                f"{ENV_VAR}: unknown fault {name!r}; known: "
                f"{', '.join((*_COUNTS, *_AFTER_PERSISTED, 'fail_shard_once'))}"
            )
    return Faults(**values)


def active_faults() -> Faults | None:
    """The faults requested by ``LIBERO_EVAL_FAULT``, or None when it is unset or empty."""
    text = os.environ.get(ENV_VAR, "").strip()
    return parse_faults(text) if text else None
