"""The one owner of failures: what kind a failure is, and what a shard does about it.

Every failure is classified once, where it happens, into a :class:`FailureKind`: the policy
connections (``policy/http_connection.py``, ``policy/ws_connection.py``) sort theirs into
transient, rejected or bad answer (``policy/errors.py`` gives each error class its kind); the
shard runner adds the env's (an env that raised, an env worker process that died).
:class:`FailurePolicy` maps (kind, attempt) to one :class:`Action`:

=============== ================================ =============================================
kind            attempt counts                   action
=============== ================================ =============================================
``transient``   failed tries of this request     retry the request while ``request_retries``
                                                 allow (backoff ``k * retry_backoff_s``), then
                                                 fail the shard (the server is gone)
``rejected``    --                               fail the shard: retrying cannot help
``bad_answer``  unusable answers in a row        record the error on the request's episodes;
                                                 the ``bad_answers_in_a_row``-th fails the shard
``env_error``   --                               record the error on the episode
``env_died``    attempts of this episode         retry the episode on a restarted worker while
                                                 ``episode_attempts`` allow, then record it
=============== ================================ =============================================

Its knobs are the ``rollout.failures`` config section (``libero_eval/data/schema.yaml``, the
one place of their names and defaults), outcome-neutral: no field is in the fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Self

from libero_eval import settings_schema

SECTION = ("rollout", "failures")


class FailureKind(StrEnum):
    """What a failure says about the server or the env (see the module docstring)."""

    TRANSIENT = "transient"  # the server may answer the same request next time
    REJECTED = "rejected"  # the server refuses this request; it will refuse it again
    BAD_ANSWER = "bad_answer"  # an answer that cannot be decoded or is not a valid action
    ENV_ERROR = "env_error"  # the env raised while starting or stepping an episode
    ENV_DIED = "env_died"  # the env worker process died


class Action(StrEnum):
    """What the shard does about a failure."""

    RETRY_REQUEST = "retry_request"
    RETRY_EPISODE = "retry_episode"
    RECORD = "record"  # the episode is finished with the error in its record
    FAIL_SHARD = "fail_shard"  # finished episodes stay in the store; a rerun resumes


@dataclass(frozen=True)
class FailurePolicy:
    """The ``rollout.failures`` settings and the decision they make (:meth:`decide`)."""

    request_timeout_s: float
    request_retries: int
    retry_backoff_s: float
    probe_timeout_s: float
    episode_attempts: int
    bad_answers_in_a_row: int

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            value = getattr(self, name)
            return ValueError(
                f"rollout.failures.{name} must be {rule}, got {value!r} (fix it in the config)"
            )

        for name in ("request_timeout_s", "probe_timeout_s"):
            if isinstance(getattr(self, name), bool) or not getattr(self, name) > 0:
                raise bad(name, "a number > 0")
        if isinstance(self.retry_backoff_s, bool) or not self.retry_backoff_s >= 0:
            raise bad("retry_backoff_s", "a number >= 0")
        for name, least in (("request_retries", 0), ("episode_attempts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise bad(name, f"an int >= {least}")
        if (
            isinstance(self.bad_answers_in_a_row, bool)
            or not isinstance(self.bad_answers_in_a_row, int)
            or self.bad_answers_in_a_row < 1
        ):
            raise bad("bad_answers_in_a_row", "an int >= 1")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> Self:
        """From a validated ``rollout.failures`` section (every field present)."""
        return cls(**{f.name: section[f.name] for f in fields(cls)})

    @classmethod
    def defaults(cls, **overrides: Any) -> Self:
        """The schema's defaults, with ``overrides`` (a connection built outside a run)."""
        return replace(cls.from_config(settings_schema.defaults(*SECTION)), **overrides)

    def decide(self, kind: FailureKind, attempt: int = 1) -> Action:
        """What to do about the ``attempt``-th failure of ``kind`` (1-based; what it counts
        depends on the kind, see the module docstring)."""
        if kind is FailureKind.TRANSIENT:
            return Action.RETRY_REQUEST if attempt <= self.request_retries else Action.FAIL_SHARD
        if kind is FailureKind.REJECTED:
            return Action.FAIL_SHARD
        if kind is FailureKind.BAD_ANSWER:
            return Action.RECORD if attempt < self.bad_answers_in_a_row else Action.FAIL_SHARD
        if kind is FailureKind.ENV_DIED:
            return Action.RETRY_EPISODE if attempt < self.episode_attempts else Action.RECORD
        return Action.RECORD  # ENV_ERROR

    def backoff_s(self, attempt: int) -> float:
        """The wait before retry ``attempt`` of a request (linear backoff)."""
        return attempt * self.retry_backoff_s

    @property
    def attempts_per_request(self) -> int:
        return self.request_retries + 1
