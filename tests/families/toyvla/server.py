"""toyvla's own policy server: ``POST /toy/act`` (JSON) answers ``chunk`` still actions per
observation, marked ``"server": "toyvla"``; ``GET /toy/ready`` is 200 once it listens. One
line per answered request on stdout (the serve job's log): ``toyvla: answered request N``.

    python -m toyvla.server --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from toyvla import ACT_PATH, MARK, READY_PATH

GRIPPER = {"open": -1.0, "closed": 1.0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answered = 0
    lock = threading.Lock()

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == READY_PATH:
            self._send(200, {"ready": True})
        else:
            self._send(404, {"detail": f"no route {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != ACT_PATH:
            self._send(404, {"detail": f"no route {self.path}"})
            return
        if body.get("gripper") not in GRIPPER or not body.get("brightness"):
            self._send(422, {"detail": "expected gripper open|closed and brightness per obs"})
            return
        still = [0.0] * 6 + [GRIPPER[body["gripper"]]]
        actions = [[still] * int(body["chunk"]) for _ in body["brightness"]]
        with Handler.lock:
            Handler.answered += 1
            count = Handler.answered
        print(f"toyvla: answered request {count} ({len(actions)} observation(s))", flush=True)
        self._send(200, {"server": MARK, "request_id": body.get("request_id"), "actions": actions})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per answer above is the log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"toyvla: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
