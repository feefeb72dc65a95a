"""The built-in reference policy server: SGLang's Cosmos3 action API on a CPU.

It speaks the part of SGLang 0.5.23's action API that our client uses
(``sglang/multimodal_gen/runtime/entrypoints/action/{api.py,protocol.py,cosmos3.py}``):

- ``GET /health``: 200 ``{"status": "ok"}`` once the policy is built, 503 before (or if that
  failed).
- ``GET /v1/actions/metadata``: the structure of ``cosmos3_action_metadata``.
- ``POST /v1/actions/generations``: JSON, or msgpack when Content-Type contains ``msgpack``.
  The request is parsed and validated as ``_action_request_to_observation`` and
  ``build_cosmos3_action_sampling_params`` do, with the same error messages (HTTP 400,
  ``{"detail": message}``; ``requests.py``, which lists the deliberate differences); the
  answer is ``action_generation_response`` (``envelope``) or ``action_raw_response``
  (``raw``), msgpack when Content-Type or Accept contains ``msgpack`` (``responses.py``).
- ``GET /v1/stats`` (ours): requests, items, busy time and uptime, for duty-cycle benchmarks.

With ``family="pi05"`` (``--family pi05``) the same paths serve SGLang's π0.5 API instead
(``pi05.py``), plus openpi's readiness path ``/healthz`` and websockets ``/`` and
``/openpi/policy``.

A server policy (``reference/policies``) turns each image into a LIBERO 7-D chunk ``[H, 7]``;
the server normalizes it into the model's 10-channel form with the action stats file, so the
client sees what a Cosmos3 server without ``action_stats_path`` returns.
Values are zero-padded up to ``padded_action_dim`` channels (SGLang 0.5.23 itself returns
exactly ``raw_action_dim`` channels; padding lets tests exercise a client's slicing).
Like SGLang, ``runtime.output_format`` does not matter for Cosmos3: JSON answers carry lists,
msgpack answers numpy arrays.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

import libero_eval.policy.families.pi05.reference as pi05
from libero_eval.policy import codec
from libero_eval.policy.families.cosmos3.actions import (
    LIBERO_ACTION_DIM,
    MODEL_ACTION_DIM,
    ActionStats,
    libero_to_model_chunk,
    load_action_stats,
    stats_block_for,
)
from libero_eval.policy.families.cosmos3.reference_requests import (
    GenerationRequest,
    RequestError,
    decode_body,
    parse_generation_request,
)
from libero_eval.policy.families.cosmos3.reference_responses import (
    action_metadata,
    generation_envelope,
    raw_response,
    wants_msgpack,
)
from libero_eval.reference import settings as reference_settings
from libero_eval.reference.batching import BatchSlot
from libero_eval.reference.policies import (
    ServerPolicy,
    make_server_policy,
    server_policy_class,
)
from libero_eval.reference.settings import ReferenceServerSettings

logger = logging.getLogger("libero_eval.reference.server")


class PolicyOutputError(RuntimeError):
    """The server policy returned something other than one [H, 7] chunk per item."""


class ReferenceServer:
    """Policy, stats, the one-batch-at-a-time slot with its latency model, and counters."""

    def __init__(self, settings: ReferenceServerSettings) -> None:
        self.settings = settings
        server_policy_class(settings.policy)  # unknown names fail now, not in the background
        self.stats: ActionStats = load_action_stats(
            settings.action_stats_path, stats_block_for(settings.normalization)
        )
        self.pi05_model: pi05.Pi05Model | None = None
        if settings.family == "pi05":
            assert settings.norm_stats_path is not None
            self.pi05_model = pi05.Pi05Model.load(settings.norm_stats_path)
        self.policy: ServerPolicy | None = None
        self.load_error: str | None = None
        self.started = time.monotonic()
        self.rejected = 0
        # the GPU it stands in for: one batch at a time, with the latency model (batching.py)
        self.slot = BatchSlot(
            settings.latency_fixed_s, settings.latency_per_item_s, settings.max_batch_size
        )

    @property
    def ready(self) -> bool:
        return self.policy is not None

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
        self.policy = policy
        logger.info("server policy %r ready", self.settings.policy)

    def latency_s(self, batch_size: int) -> float:
        return self.slot.latency_s(batch_size)

    def compute_actions(self, request: GenerationRequest) -> np.ndarray:
        """Normalized model actions ``float32[B, H, padded_action_dim]`` for the request."""
        assert self.policy is not None
        horizon = request.action_horizon
        chunks = self.policy.act(request.items, horizon)
        if not isinstance(chunks, list | tuple) or len(chunks) != request.batch_size:
            raise PolicyOutputError(
                f"server policy {self.settings.policy!r} returned "
                f"{len(chunks) if isinstance(chunks, list | tuple) else type(chunks).__name__} "
                f"chunks for {request.batch_size} items; it must return one per item"
            )
        actions = np.zeros(
            (request.batch_size, horizon, self.settings.padded_action_dim), dtype=np.float32
        )
        for index, chunk in enumerate(chunks):
            chunk = np.asarray(chunk, dtype=np.float64)
            if chunk.shape != (horizon, LIBERO_ACTION_DIM) or not np.all(np.isfinite(chunk)):
                raise PolicyOutputError(
                    f"server policy {self.settings.policy!r} returned a chunk of shape "
                    f"{chunk.shape} for item {index}; it must be finite [{horizon}, 7]"
                )
            actions[index, :, :MODEL_ACTION_DIM] = libero_to_model_chunk(chunk, self.stats)
        return actions

    async def generate(self, request: GenerationRequest) -> dict[str, Any]:
        """Run one request as a batch of its own, after those queued before it, taking at least
        the modelled latency; returns the SGLang pipeline output dict."""
        timed = await self.slot.run(lambda: self.compute_actions(request), request.batch_size)
        actions = timed.value
        logger.info(
            "generation request_id=%s batch=%d latency=%.3fs queued=%.3fs",
            request.request_id,
            request.batch_size,
            timed.latency_s,
            timed.queued_s,
        )
        return {
            "request_id": request.request_id,
            # SGLang squeezes a batch of one to [H, D] (cosmos3.py decoding stage).
            "actions": actions[0] if request.batch_size == 1 else actions,
            "action_mode": "policy",
            "domain_id": request.domain_id,
            "raw_action_dim": request.raw_action_dim,
            "parameters": {
                "num_inference_steps": request.num_inference_steps,
                "num_frames": request.num_frames,
            },
        }

    def compute_pi05_actions(
        self, request: pi05.Pi05Request, model_space: bool = True
    ) -> np.ndarray:
        """The expert's chunk in π0.5 model space ``float32[H, D]`` (or as LIBERO actions
        ``[H, 7]``, what openpi's server answers after its own transforms)."""
        assert self.policy is not None and self.pi05_model is not None
        chunks = self.policy.act([request.item], request.action_horizon)
        chunk = np.asarray(chunks[0] if len(chunks) == 1 else chunks, dtype=np.float64)
        if chunk.shape != (request.action_horizon, LIBERO_ACTION_DIM) or not np.all(
            np.isfinite(chunk)
        ):
            raise PolicyOutputError(
                f"server policy {self.settings.policy!r} returned a chunk of shape "
                f"{chunk.shape}; it must be finite [{request.action_horizon}, 7]"
            )
        if not model_space:
            return chunk
        return pi05.model_actions(chunk, request, self.pi05_model)

    async def generate_pi05(
        self, request: pi05.Pi05Request, model_space: bool = True
    ) -> dict[str, Any]:
        """One π0.5 request (one observation), merged with the requests waiting into one
        batch of at most ``max_batch_size`` as SGLang's dynamic batching does
        (:meth:`BatchSlot.run_merged`); SGLang's π0.5 output dict."""
        timed = await self.slot.run_merged(lambda: self.compute_pi05_actions(request, model_space))
        logger.info(
            "generation request_id=%s batch=%d latency=%.3fs queued=%.3fs",
            request.request_id,
            timed.batch_size,
            timed.latency_s,
            timed.queued_s,
        )
        return pi05.output(request, timed.value)

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
    """The FastAPI app; the stats file and policy name are checked now, the policy is built in
    a background thread at startup (``/health`` answers 503 until it is ready)."""
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

    if settings.family == "pi05":
        _add_pi05_routes(app, server)
        return app

    @app.get("/v1/actions/metadata")
    async def metadata() -> Response:
        return JSONResponse(action_metadata(settings))

    @app.get("/v1/stats")
    async def stats() -> Response:
        return JSONResponse(server.counters())

    @app.post("/v1/actions/generations")
    async def create_action_generation(request: Request) -> Response:
        if not server.ready:
            raise HTTPException(
                status_code=503, detail=server.load_error or "server policy is not ready yet"
            )
        msgpack_answer = wants_msgpack(request)
        try:
            payload = decode_body(await request.body(), request.headers.get("content-type", ""))
            generation = parse_generation_request(payload, settings)
        except RequestError as exc:
            server.rejected += 1
            logger.info("generation rejected (400): %s", exc)
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        try:
            output = await server.generate(generation)
        except PolicyOutputError as exc:
            logger.error("generation failed (500): %s", exc)
            raise HTTPException(status_code=500, detail=str(exc)) from exc
        except Exception as exc:
            logger.exception("generation failed (500)")
            detail = f"server policy {settings.policy!r} failed: {exc!r}"
            raise HTTPException(status_code=500, detail=detail) from exc
        if generation.response_format == "raw":
            response = raw_response(output, preserve_numpy=msgpack_answer)
        else:
            response = generation_envelope(
                output, settings.model_name, preserve_numpy=msgpack_answer
            )
        if msgpack_answer:
            return Response(content=codec.pack(response), media_type=codec.MSGPACK_CONTENT_TYPE)
        return JSONResponse(response)

    return app


def _add_pi05_routes(app: FastAPI, server: ReferenceServer) -> None:
    """SGLang's π0.5 endpoints: metadata, POST generations and the /openpi/policy websocket."""
    settings, model = server.settings, server.pi05_model
    assert model is not None

    @app.get("/v1/stats")
    async def stats() -> Response:
        return JSONResponse(server.counters())

    @app.get("/v1/actions/metadata")
    async def metadata() -> Response:
        return JSONResponse(pi05.metadata(model, settings.model_name, settings.policy))

    async def run(payload: Any, websocket: bool) -> dict[str, Any]:
        if not server.ready:
            raise PolicyOutputError(server.load_error or "server policy is not ready yet")
        request = pi05.parse_request(payload, model, websocket=websocket)
        return await server.generate_pi05(request)

    @app.post("/v1/actions/generations")
    async def create_action_generation(request: Request) -> Response:
        if not server.ready:
            raise HTTPException(503, detail=server.load_error or "server policy is not ready yet")
        msgpack_answer = wants_msgpack(request)
        try:
            payload = decode_body(await request.body(), request.headers.get("content-type", ""))
            result = await run(payload, websocket=False)
        except (RequestError, pi05.Pi05RequestError) as exc:
            server.rejected += 1
            logger.info("generation rejected (400): %s", exc)
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        except Exception as exc:
            logger.exception("generation failed (500)")
            raise HTTPException(500, detail=f"server policy failed: {exc!r}") from exc
        runtime = payload.get("runtime") or {}
        if str(runtime.get("response_format", "envelope")).lower() == "raw":
            response = raw_response(result, preserve_numpy=msgpack_answer)
        else:
            response = pi05.envelope(result, settings.model_name, preserve_numpy=msgpack_answer)
        if msgpack_answer:
            return Response(content=codec.pack(response), media_type=codec.MSGPACK_CONTENT_TYPE)
        return JSONResponse(response)

    @app.get("/healthz")
    async def healthz() -> Response:  # openpi's readiness path
        return Response("OK\n" if server.ready else "starting\n", 200 if server.ready else 503)

    @app.websocket("/")
    async def openpi_serve_policy(websocket: WebSocket) -> None:
        """openpi's ``websocket_policy_server.py``: metadata, then the raw LIBERO observation
        in and ``{"actions": [10, 7]}`` out; on failure the traceback as a TEXT frame and
        close code 1011."""
        await websocket.accept()
        await websocket.send_bytes(codec.pack({"reference_policy": settings.policy}))
        while True:
            try:
                frame = await websocket.receive_bytes()
            except WebSocketDisconnect:
                return
            try:
                started = time.monotonic()
                if not server.ready:
                    raise PolicyOutputError(server.load_error or "server policy is not ready")
                request = pi05.parse_openpi_request(codec.unpack(frame), model)
                result = await server.generate_pi05(request, model_space=False)
                answer = {
                    "actions": result["actions"],
                    "server_timing": {"infer_ms": (time.monotonic() - started) * 1000},
                }
                await websocket.send_bytes(codec.pack(answer))
            except WebSocketDisconnect:
                return
            except Exception as exc:  # noqa: BLE001 - reported to the client, then closed
                server.rejected += 1
                await websocket.send_text(f"Traceback (reference server):\n{exc!r}")
                await websocket.close(code=1011, reason="Internal server error")
                return

    @app.websocket("/openpi/policy")
    async def openpi_policy(websocket: WebSocket) -> None:
        """ws_utils.run_action_msgpack_ws: metadata, then one answer per frame; an error
        frame ``{"error": ...}`` and close code 1011 on failure."""
        await websocket.accept()
        await websocket.send_bytes(
            codec.pack(pi05.metadata(model, settings.model_name, settings.policy))
        )
        while True:
            try:
                frame = await websocket.receive_bytes()
            except WebSocketDisconnect:
                return
            try:
                started = time.monotonic()
                result = await run(codec.unpack(frame), websocket=True)
                result["server_timing"] = {"infer_ms": (time.monotonic() - started) * 1000}
                await websocket.send_bytes(codec.pack(result))
            except WebSocketDisconnect:
                return
            except Exception as exc:  # noqa: BLE001 - reported to the client, then closed
                server.rejected += 1
                logger.info("websocket request failed: %s", exc)
                await websocket.send_bytes(codec.pack({"error": f"{type(exc).__name__}: {exc}"}))
                await websocket.close(code=1011, reason="Internal server error")
                return


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
        description="Serve a reference LIBERO policy over SGLang's Cosmos3 action API.",
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
