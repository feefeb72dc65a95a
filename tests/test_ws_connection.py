"""The websocket policy client against a real websocket server speaking openpi's protocol."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from websockets.sync.server import ServerConnection, serve

from libero_eval.policy import codec
from libero_eval.policy.errors import PolicyRequestRejected, PolicyServerUnavailable
from libero_eval.policy.ws_connection import WebsocketConnection


@contextmanager
def ws_server(handle: Callable[[ServerConnection, dict], None]) -> Iterator[str]:
    """openpi's server loop: metadata on connect, then one answer per request frame."""

    def handler(ws: ServerConnection) -> None:
        ws.send(codec.pack({"policy": "test"}))
        for frame in ws:
            handle(ws, codec.unpack(frame))

    server = serve(handler, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def echo_actions(ws: ServerConnection, request: dict) -> None:
    ws.send(codec.pack({"actions": np.full((10, 7), float(request["step"]))}))


def test_requests_and_answers_travel_as_msgpack_numpy():
    with ws_server(echo_actions) as url, WebsocketConnection(url, max_retries=0) as client:
        assert client.metadata() == {"policy": "test"}
        for step in range(3):  # one connection, many requests
            answer = client.infer({"step": step, "image": np.zeros((4, 4, 3), np.uint8)})
            np.testing.assert_array_equal(answer["actions"], np.full((10, 7), float(step)))
        assert client.last_attempts == 1 and client.last_latency_s is not None


def test_an_error_frame_is_a_rejected_request_not_retried():
    calls = []

    def fail(ws: ServerConnection, request: dict) -> None:
        calls.append(request)
        ws.send("Traceback (most recent call last):\n  KeyError: 'observation/image'")
        ws.close(code=1011, reason="Internal server error")

    with (
        ws_server(fail) as url,
        WebsocketConnection(url, max_retries=3) as client,
        pytest.raises(PolicyRequestRejected, match="KeyError: 'observation/image'") as info,
    ):
        client.infer({"step": 0})
    assert len(calls) == 1 and info.value.kind == "rejected"


def test_a_connection_closed_mid_episode_is_retried_on_a_new_connection():
    answered = []

    def drop_first(ws: ServerConnection, request: dict) -> None:
        if not answered:
            answered.append(False)
            ws.close()  # the server went away while the request was in flight
            return
        echo_actions(ws, request)

    sleeps: list[float] = []
    with (
        ws_server(drop_first) as url,
        WebsocketConnection(url, max_retries=2, sleep=sleeps.append) as client,
    ):
        answer = client.infer({"step": 4})
    assert answer["actions"][0, 0] == 4.0
    assert client.last_attempts == 2 and sleeps == [1.0]


def test_a_close_with_1011_internal_error_is_transient_and_retried():
    """A server that fails inside (close 1011, no error frame) is retried like HTTP 5xx: the
    request is answered on a fresh connection and nothing fails the shard (issue 26)."""
    answered = []

    def crash_first(ws: ServerConnection, request: dict) -> None:
        if not answered:
            answered.append(False)
            ws.close(code=1011, reason="Internal server error")
            return
        echo_actions(ws, request)

    sleeps: list[float] = []
    with (
        ws_server(crash_first) as url,
        WebsocketConnection(url, max_retries=2, sleep=sleeps.append) as client,
    ):
        answer = client.infer({"step": 5})
    np.testing.assert_array_equal(answer["actions"], np.full((10, 7), 5.0))
    assert client.last_attempts == 2 and sleeps == [1.0]


def test_a_close_saying_the_request_is_bad_is_rejected_not_retried():
    calls = []

    def refuse(ws: ServerConnection, request: dict) -> None:
        calls.append(request)
        ws.close(code=1009, reason="frame too big")

    with (
        ws_server(refuse) as url,
        WebsocketConnection(url, max_retries=3) as client,
        pytest.raises(PolicyRequestRejected, match=r"code 1009 \(message too big\)") as info,
    ):
        client.infer({"step": 0})
    assert len(calls) == 1 and info.value.status == 1009


def test_a_server_that_stays_gone_fails_with_the_fix():
    def close(ws: ServerConnection, request: dict) -> None:
        ws.close()

    with ws_server(close) as url:
        client = WebsocketConnection(url, max_retries=1, sleep=lambda _s: None)
        with pytest.raises(PolicyServerUnavailable, match=r"2 attempt.*connection closed"):
            client.infer({"step": 0})
    with pytest.raises(PolicyServerUnavailable, match="connection failed"):
        client.infer({"step": 0})  # nothing listens any more
    assert not client.health()


def test_bad_urls_are_refused():
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        WebsocketConnection("127.0.0.1:8000")


def test_a_websocket_server_that_answers_nothing_is_given_up_after_one_try():
    """No answer within the timeout and no 200 from the health path either (a bare websocket
    server answers plain HTTP with an upgrade error): the server answers nothing at all."""
    held = threading.Event()
    requests: list[dict] = []

    def never_answer(ws: ServerConnection, request: dict) -> None:
        requests.append(request)
        held.wait(5)

    with (
        ws_server(never_answer) as url,
        WebsocketConnection(url, timeout_s=0.3, max_retries=5, sleep=lambda _s: None) as client,
        pytest.raises(PolicyServerUnavailable) as info,
    ):
        try:
            client.infer({"step": 0})
        finally:
            held.set()
    message = str(info.value)
    assert len(requests) == 1 and client.last_attempts == 1
    assert "no answer within 0.3 s (rollout.failures.request_timeout_s)" in message
    assert f"{url}/health did not answer either" in message
