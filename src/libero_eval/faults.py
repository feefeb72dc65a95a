"""Opt-in fault injection for the fault-tolerance tests and the CI Slurm run.

Faults are read from the environment variable ``LIBERO_EVAL_FAULT``: ``;``-separated
``name=value`` items. When it is unset, :func:`active_faults` returns None and no code path
changes: the runner calls the hooks of :data:`NO_FAULTS` (which do nothing) and its env
workers run the plain env. Set, the runner's hooks are a :class:`FaultInjector` and each env
worker wraps its env in :class:`FaultyEnv`. Episode counts are 1-based and count what THIS
shard process did (a rerun starts again at 1).

=============================== ==================================================================
``crash_env_at_episode=N``      the env worker running the shard's N-th episode start kills
                                itself (SIGKILL) after the reset: a crashed env process
``raise_env_at_episode=N``      the env raises while starting the shard's N-th episode
``nan_action_at_episode=N``     the policy's first action chunk of the N-th episode is NaN
``exit_shard_after_episodes=N`` the shard process SIGKILLs itself once N episodes are persisted
``fail_shard_once=SHARD:MARKER`` shard SHARD fails (exit 1) after its first persisted episode,
                                once: it creates the file MARKER, and passes when MARKER exists
=============================== ==================================================================
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ENV_VAR = "LIBERO_EVAL_FAULT"
_COUNTS = ("crash_env_at_episode", "raise_env_at_episode", "nan_action_at_episode")


class InjectedFault(RuntimeError):
    """A failure raised on purpose by fault injection."""


@dataclass(frozen=True)
class Faults:
    """The parsed fault plan (None fields are off)."""

    crash_env_at_episode: int | None = None
    raise_env_at_episode: int | None = None
    nan_action_at_episode: int | None = None
    exit_shard_after_episodes: int | None = None
    fail_shard_once: tuple[str, Path] | None = None

    def after_episode_persisted(self, shard: str, persisted: int) -> None:
        """Called by the runner after each durable episode record of this process."""
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


class NoFaults:
    """The runner's fault hooks with no fault plan: nothing is injected."""

    injects_env_faults = False

    def env_fault(self, worker: int, first_attempts: int, attempt: int) -> str | None:
        """The fault the env worker ``worker`` injects into the episode it now starts."""
        return None

    def chunk(self, worker: int, chunk: np.ndarray) -> np.ndarray:
        """The action chunk ``worker`` is sent in place of the policy's ``chunk``."""
        return chunk

    def after_episode_persisted(self, shard: str, persisted: int) -> None:
        """Called by the runner after each durable episode record of this process."""


NO_FAULTS = NoFaults()


class FaultInjector(NoFaults):
    """The runner's fault hooks for a fault plan (see the module docstring)."""

    injects_env_faults = True

    def __init__(self, faults: Faults):
        self.faults = faults
        self._nan_chunk_for: set[int] = set()  # workers whose next chunk becomes NaN

    def env_fault(self, worker: int, first_attempts: int, attempt: int) -> str | None:
        """``first_attempts``: episodes this shard has started (retries not counted)."""
        faults = self.faults
        if attempt != 1:
            return None
        if first_attempts == faults.crash_env_at_episode:
            return "crash"
        if first_attempts == faults.raise_env_at_episode:
            return "raise"
        if first_attempts == faults.nan_action_at_episode:
            self._nan_chunk_for.add(worker)
        return None

    def chunk(self, worker: int, chunk: np.ndarray) -> np.ndarray:
        if worker not in self._nan_chunk_for:
            return chunk
        self._nan_chunk_for.discard(worker)
        return np.full_like(np.asarray(chunk, dtype=float), np.nan)

    def after_episode_persisted(self, shard: str, persisted: int) -> None:
        self.faults.after_episode_persisted(shard, persisted)


def fault_hooks(faults: Faults | None) -> NoFaults:
    """The runner's hooks for ``faults`` (None: :data:`NO_FAULTS`)."""
    return NO_FAULTS if faults is None else FaultInjector(faults)


class FaultyEnv:
    """An episode env whose ``EpisodeSpec.fault`` fails the episode's start: ``"raise"``
    raises before the reset, ``"crash"`` SIGKILLs the worker process after it."""

    def __init__(self, env: Any):
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def start_episode(self, spec: Any) -> Any:
        if spec.fault == "raise":
            raise RuntimeError("injected env error (LIBERO_EVAL_FAULT)")
        observation = self._env.start_episode(spec)
        if spec.fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        return observation


def parse_faults(text: str) -> Faults:
    """Parse a ``LIBERO_EVAL_FAULT`` value; unknown or malformed items raise ValueError."""
    values: dict = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"{ENV_VAR}: item {item!r} must look like name=value")
        if name in (*_COUNTS, "exit_shard_after_episodes"):
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
                f"{', '.join((*_COUNTS, 'exit_shard_after_episodes', 'fail_shard_once'))}"
            )
    return Faults(**values)


def active_faults() -> Faults | None:
    """The faults requested by ``LIBERO_EVAL_FAULT``, or None when it is unset or empty."""
    text = os.environ.get(ENV_VAR, "").strip()
    return parse_faults(text) if text else None
