"""The one owner of failures: the failure policy's decisions and settings, the kinds the
connections' errors carry, and fault injection as wrappers (no LIBERO, no server)."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import numpy as np
import pytest
from test_ws_connection import echo_actions, ws_server

from libero_eval import settings_schema
from libero_eval.config import check_family_fields
from libero_eval.failures import Action, FailureKind, FailurePolicy
from libero_eval.faults import InjectedFault, parse_faults
from libero_eval.plan import Episode
from libero_eval.policy.connection import ConnectionSpec
from libero_eval.policy.errors import (
    PolicyRequestRejected,
    PolicyResponseError,
    PolicyServerUnavailable,
    TransientFailure,
)
from libero_eval.rollout.env_worker import Command, Reply, Status
from libero_eval.rollout.fault_injection import (
    FaultyStore,
    faulty_connections,
    faulty_env_workers,
)
from libero_eval.rollout.libero_env import EpisodeSpec
from libero_eval.rollout.waiting import WaitingLog
from libero_eval.store import EpisodeStore


def test_the_policy_maps_each_kind_and_attempt_to_one_action():
    policy = FailurePolicy.defaults(request_retries=2, episode_attempts=2, bad_answers_in_a_row=3)
    transient = [policy.decide(FailureKind.TRANSIENT, k) for k in (1, 2, 3)]
    assert transient == [Action.RETRY_REQUEST, Action.RETRY_REQUEST, Action.FAIL_SHARD]
    assert policy.decide(FailureKind.REJECTED, 1) is Action.FAIL_SHARD
    bad = [policy.decide(FailureKind.BAD_ANSWER, k) for k in (1, 2, 3)]
    assert bad == [Action.RECORD, Action.RECORD, Action.FAIL_SHARD]
    assert policy.decide(FailureKind.ENV_ERROR, 1) is Action.RECORD
    died = [policy.decide(FailureKind.ENV_DIED, k) for k in (1, 2)]
    assert died == [Action.RETRY_EPISODE, Action.RECORD]
    assert [policy.backoff_s(k) for k in (1, 2)] == [
        policy.retry_backoff_s,
        2 * policy.retry_backoff_s,
    ]


def test_a_timeout_fails_the_shard_early_when_the_server_answers_nothing_or_times_out_again():
    policy = FailurePolicy.defaults(request_retries=5, timeouts_in_a_row=3)
    # the readiness path still answers: retried like any transient failure, up to 3 in a row
    answering = [policy.decide_timeout(k, True, k) for k in (1, 2, 3)]
    assert answering == [Action.RETRY_REQUEST, Action.RETRY_REQUEST, Action.FAIL_SHARD]
    # it does not answer either: the server answers nothing at all, no retry can help
    assert policy.decide_timeout(1, False, 1) is Action.FAIL_SHARD
    # retries run out first where they are fewer
    assert FailurePolicy.defaults(request_retries=0).decide_timeout(1, True, 1) is (
        Action.FAIL_SHARD
    )


def test_the_longest_wait_and_the_probe_timeout_name_their_settings():
    policy = FailurePolicy.defaults(
        request_timeout_s=600, request_retries=5, retry_backoff_s=1.0, timeouts_in_a_row=2
    )
    assert policy.longest_wait_s() == 600 + 600 + 1.0  # two timeouts and the backoff between
    unbounded = FailurePolicy.defaults(request_retries=5, timeouts_in_a_row=6)
    assert unbounded.longest_wait_s() == 6 * 600 + (1 + 2 + 3 + 4 + 5) * 1.0  # about 61 min
    assert FailurePolicy.defaults(probe_timeout_s=30).probe_timeout() == (
        30,
        "rollout.failures.probe_timeout_s",
    )
    assert FailurePolicy.defaults(request_timeout_s=5, probe_timeout_s=30).probe_timeout() == (
        5,
        "rollout.failures.request_timeout_s",
    )


def test_a_shard_waiting_for_an_answer_says_so_at_a_steady_pace(tmp_path, capsys):
    """The age of the oldest unanswered request and every setting that bounds the wait, to
    the shard's log and the event log, once it is `waiting_log_every_s` old and every
    `waiting_log_every_s` after (times given, no clock)."""
    policy = FailurePolicy.defaults(
        waiting_log_every_s=30, request_timeout_s=600, request_retries=5, timeouts_in_a_row=2
    )
    event_log = tmp_path / "eval_embodiment.log"
    waiting = WaitingLog(policy, "http://127.0.0.1:30000", "shard000", event_log)
    assert waiting.check({}, 100.0) is None
    assert waiting.check({7: 100.0}, 129.0) is None  # younger than the pace
    line = waiting.check({7: 100.0, 8: 120.0}, 131.0)
    assert line is not None
    assert "waiting for policy server http://127.0.0.1:30000: 2 request(s) unanswered" in line
    assert "the oldest sent 31 s ago" in line
    for setting in (
        "rollout.failures.request_timeout_s=600 s",
        "rollout.failures.request_retries=5",
        "rollout.failures.timeouts_in_a_row=2",
        "rollout.failures.waiting_log_every_s",
    ):
        assert setting in line
    assert "gives up on it after at most 1201 s" in line
    assert waiting.check({7: 100.0}, 150.0) is None  # said 19 s ago
    assert "the oldest sent 61 s ago" in (waiting.check({7: 100.0}, 161.0) or "")
    assert waiting.check({}, 162.0) is None  # answered: quiet until a request is old again
    assert waiting.check({9: 162.0}, 170.0) is None
    said = [x for x in event_log.read_text().splitlines() if "[rollout shard000] waiting" in x]
    assert len(said) == 2
    assert capsys.readouterr().err.count("[shard000] waiting for policy server") == 2


def test_the_knobs_and_their_defaults_are_the_schemas_and_outcome_neutral():
    defaults = settings_schema.defaults("rollout", "failures")
    assert FailurePolicy.defaults() == FailurePolicy(**defaults)
    assert "failures" in settings_schema.outcome_neutral("rollout")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("request_timeout_s", 0, "request_timeout_s: 0 is less than or equal to the minimum of 0"),
        ("request_retries", -1, "request_retries: -1 is less than the minimum of 0"),
        ("request_retries", True, "request_retries: True is not of type 'integer'"),
        ("episode_attempts", 0, "episode_attempts: 0 is less than the minimum of 1"),
        ("bad_answers_in_a_row", 1.5, "bad_answers_in_a_row: 1.5 is not of type 'integer'"),
        ("retry_backoff_s", -1, "retry_backoff_s: -1 is less than the minimum of 0"),
        ("timeouts_in_a_row", 0, "timeouts_in_a_row: 0 is less than the minimum of 1"),
        ("waiting_log_every_s", 0, "waiting_log_every_s: 0 is less than or equal to the minimum"),
        (
            "request_timeout",
            5,
            "request_timeout: 'request_timeout' was unexpected: .* did you "
            "mean rollout.failures.request_timeout_s",
        ),
    ],
)
def test_bad_knobs_are_named_with_the_field(field, value, message):
    """The schema checks them (`settings_schema.load`), in its words, naming the field."""
    with pytest.raises(ValueError, match="rollout.failures." + message):
        FailurePolicy.defaults(**{field: value})


def test_changed_settings_are_checked_as_a_config_section_is():
    assert FailurePolicy.defaults().changed(request_retries=1).request_retries == 1
    with pytest.raises(ValueError, match=r"rollout\.failures\.request_retries: -1 is less"):
        FailurePolicy.defaults().changed(request_retries=-1)


def test_every_connection_error_carries_its_kind():
    assert TransientFailure("x").kind is FailureKind.TRANSIENT
    assert PolicyServerUnavailable("x", attempts=3).kind is FailureKind.TRANSIENT
    assert PolicyRequestRejected("x", 400, "bad").kind is FailureKind.REJECTED
    assert PolicyResponseError("x").kind is FailureKind.BAD_ANSWER


def test_the_old_request_keys_are_read_as_rollout_failures_with_a_deprecation():
    config: dict[str, Any] = {
        "policy": {"http_timeout_s": 7, "http_max_retries": 1},
        "rollout": {"failures": {"request_timeout_s": 9}},
    }
    with pytest.warns(FutureWarning, match="policy.http_timeout_s, policy.http_max_retries"):
        messages = check_family_fields(config)
    assert "rollout.failures.request_timeout_s, rollout.failures.request_retries" in messages[0]
    assert config["policy"] == {}
    assert config["rollout"]["failures"] == {"request_timeout_s": 7, "request_retries": 1}


# -- fault injection as wrappers ---------------------------------------------------------------


class StandInWorker:
    """What the runner uses of an env worker, around a real (idle) child process: each start
    is answered with an observation, each chunk with "stepped"."""

    def __init__(self, index: int):
        self.index = index
        self.sent: list[tuple[Command, Any]] = []
        self.process = mp.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
        self.process.start()

    def send(self, command: Command, payload: Any) -> None:
        self.sent.append((command, payload))

    def receive(self) -> Reply:
        command = self.sent[-1][0]
        return Reply(Status.OK, "observation" if command == Command.START else "stepped")

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


def spec(init_state: int) -> EpisodeSpec:
    return EpisodeSpec("libero_spatial", 0, init_state)


def test_the_faulty_env_fails_the_planned_first_starts_and_spoils_one_chunk():
    plan = parse_faults("crash_env_at_episode=1;raise_env_at_episode=2;nan_action_at_episode=3")
    make = faulty_env_workers(StandInWorker, plan)
    first, second = make(0), make(1)  # one count of starts for the shard's workers
    try:
        first.send(Command.START, spec(0))
        status, message = first.receive()
        assert status is Status.DIED and not first.process.is_alive()
        assert message == "env worker process died (exit code -9)"
        second.send(Command.START, spec(1))
        assert second.receive() == (
            Status.ERROR,
            "RuntimeError: injected env error (LIBERO_EVAL_FAULT)",
        )
        first._worker = StandInWorker(0)  # what EnvWorker.restart() does: a fresh process
        first.send(Command.START, spec(0))  # the crashed episode's retry runs clean
        assert first.receive() == (Status.OK, "observation")
        second.send(Command.START, spec(2))  # the shard's 3rd episode: its first chunk is NaN
        assert second.receive() == (Status.OK, "observation")
        chunk = np.zeros((5, 7))
        second.send(Command.CHUNK, chunk)
        second.send(Command.CHUNK, chunk)
        sent = [payload for command, payload in second._worker.sent if command == Command.CHUNK]
        assert np.isnan(sent[0]).all() and sent[1] is chunk
        assert first.index == 0  # everything else is the worker's
    finally:
        first.stop()
        second.stop()


def test_the_faulty_store_fails_the_shard_once_after_a_durable_record(tmp_path):
    marker = tmp_path / "marker"
    plan = parse_faults(f"fail_shard_once=shard000:{marker}")
    store = FaultyStore(EpisodeStore(tmp_path / "episodes"), plan, "shard000")
    episode = Episode("libero_spatial", 0, 0)
    with pytest.raises(InjectedFault, match="shard000: injected failure"):
        store.write(episode, {"error": None})
    assert store.path_for(episode).exists() and marker.exists()  # written first
    store.write(Episode("libero_spatial", 0, 1), {"error": None})  # once only
    other = FaultyStore(EpisodeStore(tmp_path / "other"), plan, "shard001")
    other.write(episode, {"error": None})  # another shard is untouched


def test_the_faulty_connection_rejects_the_shards_planned_request():
    """The shard's policy threads share one count of requests: the 3rd of all is rejected
    (before it reaches the server), the others are the server's answers."""
    connect = faulty_connections(parse_faults("reject_request_at=3"))
    failures = FailurePolicy.defaults(request_retries=0)
    with ws_server(echo_actions) as url:
        spec = ConnectionSpec(url, "websocket")
        with connect(spec, failures) as first, connect(spec, failures) as second:
            assert first.infer({"step": 1})["actions"][0, 0] == 1.0
            assert second.infer({"step": 2})["actions"][0, 0] == 2.0
            with pytest.raises(PolicyRequestRejected, match="reject_request_at") as info:
                first.infer({"step": 3})
            assert info.value.kind is FailureKind.REJECTED
            assert second.infer({"step": 4})["actions"][0, 0] == 4.0
            assert first.failures is failures  # everything else is the connection's
