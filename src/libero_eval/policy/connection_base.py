"""What the HTTP and websocket policy connections share: URL checks, loopback proxy handling,
``GET <health path>`` readiness, and one retry loop that asks the failure policy
(:class:`~libero_eval.failures.FailurePolicy`) what a classified failure means."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Self, TypedDict, TypeVar
from urllib.parse import urlsplit

import requests

from libero_eval.failures import Action, FailureKind, FailurePolicy
from libero_eval.policy.errors import PolicyClientError, PolicyServerUnavailable
from libero_eval.service import is_loopback

WIRE_FORMATS = ("msgpack", "json")

T = TypeVar("T")


class ConnectionOptions(TypedDict, total=False):
    """The keyword options both connections take (:class:`ConnectionBase`): overrides of the
    failure policy's request settings, the sleep between retries, the timeout's field."""

    timeout_s: float | None
    max_retries: int | None
    retry_backoff_s: float | None
    sleep: Callable[[float], None]
    timeout_setting: str | None


class ClosedOnExit:
    """A connection used as a context manager (``with connect(...) as c:``) closes at the
    end of the block; the class gives ``close``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ConnectionBase(ClosedOnExit):
    """What both connections share: the failure policy, an HTTP session for readiness
    (proxies from the environment ignored for loopback URLs: a cluster's ``http_proxy`` must
    not capture ``127.0.0.1``), and the retry loop."""

    def __init__(
        self,
        base_url: str,
        failures: FailurePolicy | None,
        health_path: str,
        schemes: tuple[str, ...] = ("http", "https"),
        *,
        sleep: Callable[[float], None] = time.sleep,
        timeout_setting: str | None = None,
        **overrides: float | None,
    ):
        """``failures``: the run's failure policy (``rollout.failures``); None: the schema's
        defaults. ``overrides`` (``timeout_s``, ``max_retries``, ``retry_backoff_s``, None:
        left as they are) replace its request settings, for a connection built outside a
        run (a probe, a test, a benchmark). ``sleep``: between retries (tests pass a
        recorder). ``timeout_setting``: the config field a timeout message names
        (``rollout.failures.request_timeout_s`` unless a probe says another)."""
        parts = urlsplit(base_url)
        if parts.scheme not in schemes or not parts.hostname:
            raise ValueError(
                f"policy server URL {base_url!r} must look like http://HOST:PORT "
                "(check policy.url / the server slot's host and port)"
            )
        names = {
            "timeout_s": "request_timeout_s",
            "max_retries": "request_retries",
            "retry_backoff_s": "retry_backoff_s",
        }
        changes = {names[k]: v for k, v in overrides.items() if v is not None}
        if failures is None:
            failures = FailurePolicy.defaults(**changes)
        elif changes:
            failures = failures.changed(**changes)
        self.failures = failures
        self.timeout_s = float(failures.request_timeout_s)
        self.timeout_setting = timeout_setting or "rollout.failures.request_timeout_s"
        self.health_path = health_path
        # the latest call of this instance: its successful attempt's wall time, its attempts
        self.last_latency_s: float | None = None
        self.last_attempts = 0
        self._sleep = sleep
        self._session = requests.Session()
        self._proxies: dict[str, str | None] | None = None
        if is_loopback(parts.hostname):
            self._session.trust_env = False
            self._proxies = {"http": None, "https": None}

    base_url: str

    def close(self) -> None:
        self._session.close()

    # ---------------------------------------------------------------- readiness

    def health(self) -> bool:
        """True when ``GET <health_path>`` answers 200 within a few seconds."""
        try:
            response = self._session.get(
                self.base_url + self.health_path,
                timeout=min(self.timeout_s, 5.0),
                proxies=self._proxies,
            )
        except requests.RequestException:
            return False
        return response.status_code == 200

    def wait_until_healthy(
        self, deadline_s: float, poll_s: float = 1.0, is_alive: Callable[[], bool] | None = None
    ) -> None:
        """Poll ``<health_path>`` until it answers 200, for at most ``deadline_s`` seconds.

        Raises :class:`PolicyServerUnavailable` at the deadline, or as soon as ``is_alive()``
        returns False (e.g. the server process exited).
        """
        start = time.monotonic()
        while True:
            if self.health():
                return
            if is_alive is not None and not is_alive():
                raise PolicyServerUnavailable(
                    f"policy server {self.base_url} exited before {self.health_path} answered "
                    f"200 (waited {time.monotonic() - start:.1f} s); read the server log"
                )
            elapsed = time.monotonic() - start
            if elapsed >= deadline_s:
                raise PolicyServerUnavailable(
                    f"policy server {self.base_url}{self.health_path} did not answer 200 within "
                    f"{deadline_s:g} s; check the server log, or raise the readiness deadline "
                    "(server.health_timeout_s) if model loading is slow"
                )
            time.sleep(max(0.0, min(poll_s, deadline_s - elapsed)))

    # ---------------------------------------------------------------- retries

    def _with_retries(
        self,
        attempt_once: Callable[[], T],
        failed: Callable[[int, str], str],
        on_failure: Callable[[], None] | None = None,
    ) -> T:
        """``attempt_once()`` until it returns. It raises a classified
        :class:`~libero_eval.policy.errors.PolicyClientError`; ``on_failure`` runs after each,
        and the failure policy says what follows: retry (after ``k * retry_backoff_s``), or
        give up. A try that timed out asks the server's readiness path too: a server that
        answers nothing at all, or ``timeouts_in_a_row`` timeouts, is given up on before the
        retries run out (``FailurePolicy.decide_timeout``). A transient failure given up on
        becomes :class:`PolicyServerUnavailable` with the message ``failed(attempts,
        last_error)`` and why; any other kind is raised as it is (the shard decides)."""
        attempt = timeouts = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                result = attempt_once()
            except PolicyClientError as failure:
                if on_failure is not None:
                    on_failure()
                self.last_attempts = attempt
                why = ""
                if getattr(failure, "timed_out", False):
                    timeouts += 1
                    answers_health = self.health()
                    action = self.failures.decide_timeout(timeouts, answers_health, attempt)
                    why = self._why_given_up(timeouts, answers_health, action)
                else:
                    timeouts = 0
                    action = self.failures.decide(failure.kind, attempt)
                if action is not Action.RETRY_REQUEST:
                    if failure.kind is FailureKind.TRANSIENT:
                        raise PolicyServerUnavailable(
                            failed(attempt, str(failure)) + why, attempts=attempt
                        ) from failure
                    raise
                self._sleep(self.failures.backoff_s(attempt))
            else:
                self.last_latency_s = time.monotonic() - started
                self.last_attempts = attempt
                return result

    def _why_given_up(self, timeouts: int, answers_health: bool, action: Action) -> str:
        """Why a request that timed out is given up before its retries run out ("" when it
        is not, or they ran out)."""
        if action is Action.RETRY_REQUEST or self.last_attempts > self.failures.request_retries:
            return ""
        if not answers_health:
            return (
                f". Gave up before rollout.failures.request_retries ran out: "
                f"{self.base_url}{self.health_path} did not answer either, so the server "
                "answers nothing at all (hung, stopped, or unreachable)"
            )
        return (
            f". Gave up before rollout.failures.request_retries ran out: {timeouts} tries in "
            f"a row got no answer within {self.timeout_s:g} s ({self.timeout_setting}; "
            f"rollout.failures.timeouts_in_a_row={self.failures.timeouts_in_a_row}), though "
            f"{self.health_path} answers: the server accepts requests but does not finish them"
        )
