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
(a timeout)     timed-out tries in a row         fail the shard at once when the server's
                                                 readiness path does not answer either (it
                                                 answers nothing at all), or at the
                                                 ``timeouts_in_a_row``-th; else as transient
``rejected``    --                               fail the shard: retrying cannot help
``bad_answer``  unusable answers in a row        record the error on the request's episodes;
                                                 the ``bad_answers_in_a_row``-th fails the shard
``env_error``   --                               record the error on the episode
``env_died``    attempts of this episode         retry the episode on a restarted worker while
                                                 ``episode_attempts`` allow, then record it
=============== ================================ =============================================

A request still unanswered is logged at a steady pace (``waiting_log_every_s``: its age and the
settings that bound it; ``rollout/waiting.py``), so a slow or hung server is never silent.

Its knobs are the ``rollout.failures`` config section (``libero_eval/data/schema.yaml``, the
one place of their names and defaults), outcome-neutral: no field is in the fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, ClassVar, Self

from libero_eval import settings_schema

SECTION = ("rollout", "failures")
PREFIX = "rollout.failures."  # how a message names a knob


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

    SECTION: ClassVar[tuple[str, ...]] = SECTION

    request_timeout_s: float
    request_retries: int
    retry_backoff_s: float
    probe_timeout_s: float
    episode_attempts: int
    bad_answers_in_a_row: int
    timeouts_in_a_row: int
    waiting_log_every_s: float

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> Self:
        """From the ``rollout.failures`` section, checked by its subschema (a bad value is a
        ``ValueError`` naming ``rollout.failures.<field>``; a field left out takes the
        schema's default)."""
        return settings_schema.load(cls, section)

    @classmethod
    def defaults(cls, **overrides: Any) -> Self:
        """The schema's defaults, with ``overrides`` (a connection built outside a run),
        checked as a config's section is."""
        return cls.from_config(overrides)

    def changed(self, **changes: Any) -> Self:
        """These settings with ``changes``, checked as a config's section is."""
        return self.from_config({**asdict(self), **changes})

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

    def decide_timeout(self, in_a_row: int, answers_health: bool, attempt: int) -> Action:
        """What to do about a try of a request that timed out: the ``in_a_row``-th of this
        request in a row, its ``attempt``-th try; ``answers_health``: the server's readiness
        path still answers. A server that answers nothing at all, or ``timeouts_in_a_row``
        timeouts, fail the shard before ``request_retries`` run out (each would wait
        ``request_timeout_s`` again); else it is any transient failure."""
        if not answers_health or in_a_row >= self.timeouts_in_a_row:
            return Action.FAIL_SHARD
        return self.decide(FailureKind.TRANSIENT, attempt)

    def probe_timeout(self) -> tuple[float, str]:
        """The per-request timeout of a first look at a server (a shard's, the serve job's
        capacity probe) and the setting that gives it: ``probe_timeout_s``, or
        ``request_timeout_s`` when that is shorter."""
        if self.request_timeout_s < self.probe_timeout_s:
            return self.request_timeout_s, f"{PREFIX}request_timeout_s"
        return self.probe_timeout_s, f"{PREFIX}probe_timeout_s"

    def longest_wait_s(self) -> float:
        """The longest a request can take before the shard gives up on it: every try timing
        out, with the backoffs between (``timeouts_in_a_row`` may end it sooner)."""
        tries = min(self.attempts_per_request, self.timeouts_in_a_row)
        return tries * self.request_timeout_s + sum(map(self.backoff_s, range(1, tries)))

    def backoff_s(self, attempt: int) -> float:
        """The wait before retry ``attempt`` of a request (linear backoff)."""
        return attempt * self.retry_backoff_s

    @property
    def attempts_per_request(self) -> int:
        return self.request_retries + 1
