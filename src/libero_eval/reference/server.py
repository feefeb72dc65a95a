"""The built-in reference policy server: a family's action API on a CPU, answered by a
server policy (docs/rfcs/0009-family-plug-ins.md).

The server is the same for every family; what it speaks on the wire is the family's
(``server.reference`` ``family``: its part of the server, ``Family.reference``, found through
the registry and handed a :class:`~libero_eval.policy.reference_host.ReferenceHost`, this
server). Its own routes:

- ``GET /health``: 200 ``{"status": "ok"}`` once the policy is built, 503 before (or if that
  failed).
- ``GET /v1/stats`` (ours): requests, items, batches, busy time and uptime, for duty-cycle
  benchmarks.

A server policy (``reference/policies``: ``hold``, the scripted expert) turns each observation
into a LIBERO 7-D chunk ``[H, 7]``, which the family's part puts into its model's form. The
batch slot (``batching.py``) stands in for the GPU: one batch at a time, each taking the
modelled latency.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from libero_eval.policy.reference_host import PolicyItem, PolicyOutputError
from libero_eval.reference import settings as reference_settings
from libero_eval.reference.batching import BatchSlot, Timed
from libero_eval.reference.policies import (
    ServerPolicy,
    make_server_policy,
    server_policy_class,
)
from libero_eval.reference.settings import ReferenceServerSettings

logger = logging.getLogger("libero_eval.reference.server")

LIBERO_ACTION_DIM = 7  # [dx, dy, dz, ax, ay, az, gripper]


class ReferenceServer:
    """Policy, the one-batch-at-a-time slot with its latency model, and counters: the
    :class:`~libero_eval.policy.reference_host.ReferenceHost` a family's routes answer
    through."""

    def __init__(self, settings: ReferenceServerSettings) -> None:
        self.settings = settings
        server_policy_class(settings.policy)  # unknown names fail now, not in the background
        self.policy: str = settings.policy
        self.model_name: str = settings.model_name or f"reference-{settings.policy}"
        self.max_batch_size: int = settings.max_batch_size
        self.server_policy: ServerPolicy | None = None
        self.load_error: str | None = None
        self.started = time.monotonic()
        self.rejected = 0
        # the GPU it stands in for: one batch at a time, with the latency model (batching.py)
        self.slot = BatchSlot(
            settings.latency_fixed_s, settings.latency_per_item_s, settings.max_batch_size
        )

    @property
    def ready(self) -> bool:
        return self.server_policy is not None

    def not_ready(self) -> str | None:
        if self.ready:
            return None
        return self.load_error or "server policy is not ready yet"

    def reject(self, reason: str) -> None:
        self.rejected += 1
        logger.info("generation rejected (400): %s", reason)

    def load_policy(self) -> None:
        """Build the policy (may be slow); /health turns 200 when done. With a start-up delay
        (`server.reference.startup_delay_s`) it first waits that long, as a GPU server loads
        its weights before it answers /health."""
        delay = self.settings.startup_delay_s
        if delay > 0:
            time.sleep(delay)
            # one line the serve side parses into the start's parts (docs: timeline contract)
            logger.info("start-up delay: %.1f s (server.reference.startup_delay_s)", delay)
        try:
            policy = make_server_policy(self.settings.policy, **self.settings.policy_kwargs)
        except Exception as exc:
            self.load_error = f"building server policy {self.settings.policy!r} failed: {exc!r}"
            logger.exception(self.load_error)
            return
        self.server_policy = policy
        logger.info("server policy %r ready", self.settings.policy)

    def latency_s(self, batch_size: int) -> float:
        return self.slot.latency_s(batch_size)

    def act(self, items: list[PolicyItem], action_horizon: int) -> list[np.ndarray]:
        """The server policy's chunks, one finite ``[action_horizon, 7]`` per item."""
        assert self.server_policy is not None
        name = self.settings.policy
        chunks = self.server_policy.act(items, action_horizon)
        if not isinstance(chunks, list | tuple) or len(chunks) != len(items):
            raise PolicyOutputError(
                f"server policy {name!r} returned "
                f"{len(chunks) if isinstance(chunks, list | tuple) else type(chunks).__name__} "
                f"chunks for {len(items)} items; it must return one per item"
            )
        checked = []
        for index, chunk in enumerate(chunks):
            chunk = np.asarray(chunk, dtype=np.float64)
            if chunk.shape != (action_horizon, LIBERO_ACTION_DIM) or not np.all(np.isfinite(chunk)):
                raise PolicyOutputError(
                    f"server policy {name!r} returned a chunk of shape {chunk.shape} for item "
                    f"{index}; it must be finite [{action_horizon}, {LIBERO_ACTION_DIM}]"
                )
            checked.append(chunk)
        return checked

    async def run_batch(self, request_id: str, compute: Callable[[], Any], items: int) -> Any:
        """One request as a batch of its own, after those queued before it, taking at least
        the modelled latency."""
        return self._logged(request_id, await self.slot.run(compute, items))

    async def run_merged(self, request_id: str, compute: Callable[[], Any]) -> Any:
        """One one-observation request, merged with the requests waiting into one batch of at
        most ``max_batch_size``, as SGLang's dynamic batching does
        (:meth:`BatchSlot.run_merged`)."""
        return self._logged(request_id, await self.slot.run_merged(compute))

    @staticmethod
    def _logged(request_id: str, timed: Timed) -> Any:
        logger.info(
            "generation request_id=%s batch=%d latency=%.3fs queued=%.3fs",
            request_id,
            timed.batch_size,
            timed.latency_s,
            timed.queued_s,
        )
        return timed.value

    def counters(self) -> dict[str, Any]:
        return {
            "batches": self.slot.batches,
            "requests": self.slot.requests,
            "items": self.slot.items,
            "rejected": self.rejected,
            "busy_s": self.slot.busy_s,
            "queue_wait_s": self.slot.queue_wait_s,
            "uptime_s": time.monotonic() - self.started,
            "policy": self.settings.policy,
            "max_batch_size": self.settings.max_batch_size,
            "latency_fixed_s": self.settings.latency_fixed_s,
            "latency_per_item_s": self.settings.latency_per_item_s,
        }


def create_app(settings: ReferenceServerSettings) -> FastAPI:
    """The FastAPI app with the family's routes (which read their files now); the policy name
    is checked now, the policy is built in a background thread at startup (``/health``
    answers 503 until it is ready)."""
    server = ReferenceServer(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = threading.Thread(target=server.load_policy, name="policy-loader", daemon=True)
        loader.start()
        yield

    app = FastAPI(title="libero_eval reference policy server", lifespan=lifespan)
    app.state.reference_server = server

    @app.get("/health")
    async def health() -> Response:
        if server.ready:
            return JSONResponse({"status": "ok"})
        if server.load_error:
            return JSONResponse({"status": "failed", "detail": server.load_error}, 503)
        return JSONResponse({"status": "starting"}, 503)

    @app.get("/v1/stats")
    async def stats() -> Response:
        return JSONResponse(server.counters())

    settings.family_part.add_routes(app, server, settings.family_part_settings)
    return app


@contextlib.contextmanager
def serve_in_thread(
    settings: ReferenceServerSettings,
    host: str = "127.0.0.1",
    *,
    wait_ready: bool = True,
    timeout_s: float = 10.0,
) -> Iterator[str]:
    """Serve ``create_app(settings)`` with uvicorn in a daemon thread on a free port of ``host``;
    yields the base URL (``http://host:port``) and stops the server on exit.

    With ``wait_ready`` it returns only once ``/health`` would answer 200.
    """
    app = create_app(settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"reference-server-{port}", daemon=True
    )
    thread.start()
    reference: ReferenceServer = app.state.reference_server
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started or (wait_ready and not reference.ready):
            if not thread.is_alive() or reference.load_error or time.monotonic() > deadline:
                raise RuntimeError(
                    f"reference server on {host}:{port} did not start within {timeout_s} s"
                    + (f": {reference.load_error}" if reference.load_error else "")
                )
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m libero_eval.reference.server",
        description="Serve a reference LIBERO policy over a policy family's action API.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="port (default 30000)")
    reference_settings.add_arguments(parser)  # one flag per ReferenceServerSettings field
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> ReferenceServerSettings:
    """The server's settings from its parsed flags (the serve job writes them with
    `reference.settings.to_argv`)."""
    return reference_settings.from_arguments(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; exit status 2 on bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        logging.basicConfig(
            level=args.log_level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
        app = create_app(settings)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
