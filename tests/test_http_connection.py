"""HttpConnection against a real HTTP server on 127.0.0.1: retries, errors, msgpack transport."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from libero_eval.config import RunSettings
from libero_eval.failures import FailurePolicy
from libero_eval.policy import codec
from libero_eval.policy.http_connection import (
    HttpConnection,
    PolicyRequestRejected,
    PolicyResponseError,
    PolicyServerUnavailable,
)


@dataclass
class Reply:
    """One scripted answer; a `held` one is sent only once the test has ended (the server's
    `release` event), so a client can get it only by waiting out its own timeout."""

    status: int = 200
    body: bytes = b"{}"
    content_type: str = "application/json"
    held: bool = False


HELD = Reply(held=True)


def json_reply(obj, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(obj).encode(), content_type="application/json")


@dataclass
class Seen:
    time: float
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedServer:
    """Answers each path from a queue of replies (the last one repeats) or a handler function."""

    url: str = ""
    replies: dict[str, list[Reply]] = field(default_factory=dict)
    handlers: dict[str, Callable[[Seen], Reply]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def reply_for(self, request: Seen) -> Reply:
        if request.path in self.handlers:
            return self.handlers[request.path](request)
        queue = self.replies.get(request.path)
        if not queue:
            return json_reply({"detail": "Not Found"}, status=404)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def requests_to(self, path: str) -> list[Seen]:
        return [request for request in self.seen if request.path == path]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    script = ScriptedServer()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = Seen(
                time=time.monotonic(),
                method=self.command,
                path=self.path,
                headers={key.lower(): value for key, value in self.headers.items()},
                body=self.rfile.read(length),
            )
            script.seen.append(request)
            reply = script.reply_for(request)
            if reply.held:
                script.release.wait()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        do_GET = _serve
        do_POST = _serve

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    script.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield script
    script.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        time.sleep(seconds)


GENERATIONS = "/v1/actions/generations"
PAYLOAD = {"request_id": "r1", "input": {"prompt": "open the drawer."}, "parameters": {}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------ errors


def test_4xx_is_not_retried_and_reports_the_servers_detail(server):
    detail = "Cosmos3 requires num_frames == action_horizon + 1, got num_frames=16"
    server.replies[GENERATIONS] = [json_reply({"detail": detail}, status=400)]
    sleep = RecordingSleep()
    client = HttpConnection(server.url, max_retries=3, retry_backoff_s=0.01, sleep=sleep)
    with pytest.raises(PolicyRequestRejected) as info:
        client.infer(PAYLOAD)
    assert info.value.status == 400 and info.value.detail == detail
    assert detail in str(info.value) and server.url + GENERATIONS in str(info.value)
    assert len(server.requests_to(GENERATIONS)) == 1 and sleep.calls == []


def test_5xx_is_retried_with_linear_backoff_then_raised(server):
    server.replies[GENERATIONS] = [json_reply({"detail": "CUDA out of memory"}, status=500)]
    sleep = RecordingSleep()
    client = HttpConnection(server.url, max_retries=3, retry_backoff_s=0.03, sleep=sleep)
    with pytest.raises(PolicyServerUnavailable) as info:
        client.infer(PAYLOAD)
    message = str(info.value)
    assert server.url + GENERATIONS in message and "4 attempt(s)" in message
    assert "HTTP 500" in message and "CUDA out of memory" in message
    assert sleep.calls == pytest.approx([0.03, 0.06, 0.09])
    arrivals = [request.time for request in server.requests_to(GENERATIONS)]
    assert len(arrivals) == 4
    gaps = np.diff(arrivals)
    assert np.all(gaps >= np.array([0.03, 0.06, 0.09]) - 0.005)
    assert client.last_attempts == 4


def test_transient_5xx_recovers_and_reports_attempts_and_latency(server):
    server.replies[GENERATIONS] = [
        json_reply({"detail": "busy"}, status=503),
        json_reply({"detail": "busy"}, status=502),
        json_reply({"id": "act_1", "data": []}),
    ]
    client = HttpConnection(server.url, wire_format="json", max_retries=5, retry_backoff_s=0.001)
    started = time.monotonic()
    assert client.infer(PAYLOAD) == {"id": "act_1", "data": []}
    took = time.monotonic() - started
    assert client.last_attempts == 3
    # seconds, within the call's own span
    assert client.last_latency_s is not None and 0 < client.last_latency_s <= took


def test_timeouts_are_retried_then_raised(server):
    """The server holds every answer until the test ends: only the client's own timeout can
    end each try."""
    server.replies[GENERATIONS] = [HELD]
    server.replies["/health"] = [json_reply({})]  # the server still answers its health path
    client = HttpConnection(server.url, timeout_s=0.15, max_retries=1, retry_backoff_s=0.01)
    with pytest.raises(PolicyServerUnavailable, match=r"2 attempt\(s\).*timed out after 0.15 s"):
        client.infer(PAYLOAD)
    assert len(server.requests_to(GENERATIONS)) == 2


def test_a_server_that_answers_nothing_at_all_is_given_up_after_one_try(server):
    """A request that times out while /health gets no answer either: no retry can help, so
    the connection gives up at once instead of waiting request_timeout_s per retry."""
    server.replies[GENERATIONS] = [HELD]
    server.replies["/health"] = [HELD]
    failures = FailurePolicy.defaults(request_timeout_s=0.2, request_retries=5)
    client = HttpConnection(server.url, failures, retry_backoff_s=0.01)
    with pytest.raises(PolicyServerUnavailable) as info:
        client.infer(PAYLOAD)
    assert len(server.requests_to(GENERATIONS)) == 1
    message = str(info.value)
    assert f"POST {server.url}{GENERATIONS} failed after 1 attempt(s)" in message
    assert "timed out after 0.2 s (rollout.failures.request_timeout_s" in message
    assert "Gave up before rollout.failures.request_retries ran out" in message
    assert f"{server.url}/health did not answer either" in message


def test_a_server_that_never_finishes_a_request_is_given_up_after_timeouts_in_a_row(server):
    server.replies[GENERATIONS] = [HELD]
    server.replies["/health"] = [json_reply({})]
    failures = FailurePolicy.defaults(request_timeout_s=0.2, request_retries=5, timeouts_in_a_row=3)
    client = HttpConnection(server.url, failures, retry_backoff_s=0.01)
    with pytest.raises(PolicyServerUnavailable) as info:
        client.infer(PAYLOAD)
    assert len(server.requests_to(GENERATIONS)) == 3
    message = str(info.value)
    assert "failed after 3 attempt(s)" in message
    assert "3 tries in a row got no answer within 0.2 s" in message
    assert "rollout.failures.timeouts_in_a_row=3" in message and "/health answers" in message


def test_a_timeout_and_an_answer_between_start_the_count_again(server):
    """Timeouts count in a row: a refused or failed try between them is not one."""
    server.replies[GENERATIONS] = [
        HELD,
        json_reply({"detail": "busy"}, status=503),
        HELD,
        json_reply({"id": "act_1", "data": []}),
    ]
    server.replies["/health"] = [json_reply({})]
    failures = FailurePolicy.defaults(request_timeout_s=0.2, request_retries=5, timeouts_in_a_row=2)
    client = HttpConnection(server.url, failures, wire_format="json", retry_backoff_s=0.01)
    assert client.infer(PAYLOAD) == {"id": "act_1", "data": []}
    assert client.last_attempts == 4


def test_the_capacity_probe_honours_probe_timeout_s_not_the_request_timeout(server, default_config):
    """The serve job's probe of a server that hangs ends after one try of probe_timeout_s
    (not request_timeout_s, 600 s by default), and its error names that setting."""
    default_config["rollout"]["failures"].update(probe_timeout_s=0.2, request_timeout_s=600)
    probe = RunSettings(default_config).capacity_probe
    assert (probe.timeout_s, probe.timeout_setting) == (0.2, "rollout.failures.probe_timeout_s")
    server.replies["/v1/actions/metadata"] = [json_reply({"capabilities": {"max_batch_size": 1}})]
    server.replies["/health"] = [json_reply({})]
    server.replies[GENERATIONS] = [HELD]
    with pytest.raises(PolicyServerUnavailable) as info:
        probe(server.url)
    assert "timed out after 0.2 s (rollout.failures.probe_timeout_s" in str(info.value)
    assert len(server.requests_to(GENERATIONS)) == 1


def test_connection_refused_is_retried_then_raised():
    url = f"http://127.0.0.1:{free_port()}"
    sleep = RecordingSleep()
    client = HttpConnection(url, max_retries=2, retry_backoff_s=0.01, sleep=sleep)
    with pytest.raises(PolicyServerUnavailable, match="connection failed") as info:
        client.infer(PAYLOAD)
    assert url in str(info.value) and sleep.calls == pytest.approx([0.01, 0.02])


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(body=b"\xc1\xc1 not msgpack", content_type="application/msgpack"), "undecodable"),
        (Reply(body=b"<html>oops</html>", content_type="application/json"), "undecodable"),
        (json_reply([1, 2, 3]), "expected an object"),
    ],
)
def test_garbage_bodies_raise_policy_response_error_without_retry(server, reply, message):
    server.replies[GENERATIONS] = [reply]
    client = HttpConnection(server.url, max_retries=3, retry_backoff_s=0.01)
    with pytest.raises(PolicyResponseError, match=message) as info:
        client.infer(PAYLOAD)
    assert server.url + GENERATIONS in str(info.value)
    assert len(server.requests_to(GENERATIONS)) == 1


# ------------------------------------------------------------------------------ transport


def test_msgpack_round_trip_keeps_uint8_images_as_raw_bytes(server):
    def echo(request: Seen) -> Reply:
        payload = codec.unpack(request.body)
        images = payload["input"]["input_reference"]
        response = {
            "data": [
                {"index": i, "action": {"values": np.full((16, 32), i, np.float32)}}
                for i in range(len(images))
            ],
            "echo": payload,
            "received_bytes": len(request.body),
        }
        return Reply(body=codec.pack(response), content_type="application/msgpack")

    server.handlers[GENERATIONS] = echo
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(192, 320, 3), dtype=np.uint8) for _ in range(4)]
    payload = {
        "request_id": "r2",
        "input": {"prompt": "open the drawer.", "input_reference": images},
        "parameters": {"num_frames": 17, "seed": 1140},
        "runtime": {"response_format": "envelope", "output_format": "numpy"},
    }
    client = HttpConnection(server.url, wire_format="msgpack")
    response = client.infer(payload)
    echoed = response["echo"]["input"]["input_reference"]
    for sent, received in zip(images, echoed, strict=True):
        assert received.dtype == np.uint8 and received.shape == (192, 320, 3)
        np.testing.assert_array_equal(sent, received)
    assert response["received_bytes"] < sum(image.nbytes for image in images) + 1024
    assert response["data"][3]["action"]["values"].dtype == np.float32
    assert response["echo"]["parameters"] == {"num_frames": 17, "seed": 1140}
    headers = server.requests_to(GENERATIONS)[0].headers
    assert headers["content-type"] == "application/msgpack"
    assert headers["accept"] == "application/msgpack"


def test_json_transport_sends_arrays_as_lists(server):
    def echo(request: Seen) -> Reply:
        return Reply(body=request.body, content_type="application/json")

    server.handlers[GENERATIONS] = echo
    client = HttpConnection(server.url, wire_format="json")
    payload = {"input": {"privileged_state": [{"pos": np.array([0.5, 1.5])}]}, "n": np.int64(3)}
    assert client.infer(payload) == {
        "input": {"privileged_state": [{"pos": [0.5, 1.5]}]},
        "n": 3,
    }


def test_environment_proxies_do_not_capture_loopback(server, monkeypatch):
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    server.replies[GENERATIONS] = [json_reply({"ok": True})]
    assert HttpConnection(server.url, max_retries=0).infer(PAYLOAD) == {"ok": True}


# ------------------------------------------------------------------------------ readiness


def test_health_and_wait_until_healthy(server):
    server.replies["/health"] = [Reply(status=503), Reply(status=503), Reply(status=200)]
    client = HttpConnection(server.url)
    client.wait_until_healthy(deadline_s=5, poll_s=0.01)
    assert len(server.requests_to("/health")) == 3
    assert client.health()


def test_wait_until_healthy_gives_up_at_the_deadline(server):
    server.replies["/health"] = [Reply(status=503)]
    client = HttpConnection(server.url)
    started = time.monotonic()
    with pytest.raises(PolicyServerUnavailable, match="within 0.2 s") as info:
        client.wait_until_healthy(deadline_s=0.2, poll_s=0.05)
    assert server.url + "/health" in str(info.value)
    assert time.monotonic() - started >= 0.2  # not before the deadline


def test_wait_until_healthy_stops_when_the_server_process_dies(server):
    server.replies["/health"] = [Reply(status=503)]
    client = HttpConnection(server.url)
    # the message says it stopped on the process's exit, not at the deadline
    with pytest.raises(PolicyServerUnavailable, match="exited before /health"):
        client.wait_until_healthy(deadline_s=600, poll_s=0.05, is_alive=lambda: False)


def test_health_is_false_when_nothing_listens():
    assert not HttpConnection(f"http://127.0.0.1:{free_port()}").health()


def test_metadata_and_max_batch_size(server):
    server.replies["/v1/actions/metadata"] = [
        json_reply({"policy_family": "cosmos3", "capabilities": {"max_batch_size": 8}}),
        json_reply({"policy_family": "cosmos3"}),
        json_reply({"capabilities": {"max_batch_size": 0}}),
    ]
    client = HttpConnection(server.url)
    assert client.max_batch_size() == 8
    assert client.max_batch_size() == 1
    with pytest.raises(PolicyResponseError, match="capabilities.max_batch_size"):
        client.max_batch_size()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "127.0.0.1:30000"}, "must look like http://HOST:PORT"),
        ({"base_url": "http://127.0.0.1:1", "timeout_s": 0}, "timeout_s"),
        (
            {"base_url": "http://127.0.0.1:1", "max_retries": -1},
            r"rollout\.failures\.request_retries: -1 is less than the minimum of 0",
        ),
        ({"base_url": "http://127.0.0.1:1", "wire_format": "grpc"}, "wire_format .grpc."),
    ],
)
def test_bad_client_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HttpConnection(**kwargs)
