"""π0.5's part of the reference server: SGLang 0.5.23's π0.5 action API (``Pi05Pipeline``) and
openpi's own server protocol, served by the server policy (``libero_eval.policy.reference_host``
says what the server hands it; ``reference`` beside this file reads the requests and writes
the answers).

- ``GET /v1/actions/metadata``: ``protocol.py`` ``action_metadata`` for Pi05PipelineConfig.
- ``POST /v1/actions/generations``: SGLang's envelope, JSON or msgpack, answered
  ``action_generation_response`` (``envelope``) or ``action_raw_response`` (``raw``).
- websocket ``/openpi/policy``: SGLang's ``ws_utils.run_action_msgpack_ws``, the same
  observation as one flat msgpack map.
- ``GET /healthz`` and websocket ``/``: openpi's ``serve_policy.py`` (the raw LIBERO
  observation in, ``[10, 7]`` LIBERO actions out).

Each request holds one observation and is merged with those waiting into one batch
(``ReferenceHost.run_merged``), as SGLang's dynamic batching does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

import libero_eval.policy.families.pi05.reference as pi05
from libero_eval import package_data
from libero_eval.policy import codec
from libero_eval.policy.reference_host import PolicyOutputError, ReferenceHost
from libero_eval.policy.reference_host.http import add_action_generations


@dataclass(frozen=True)
class Settings:
    """π0.5's field of ``server.reference`` (``schema.yaml`` beside this file): the model's
    statistics file, or a checkpoint directory (its layout and its own statistics)."""

    norm_stats_path: str | Path


def add_routes(app: FastAPI, host: ReferenceHost, settings: Settings) -> None:
    """π0.5's routes; the model (statistics, layout) is read now."""
    model = pi05.Pi05Model.load(package_data.resolve(settings.norm_stats_path))
    metadata = pi05.metadata(model, host.model_name, host.policy)

    def compute(request: pi05.Pi05Request, model_space: bool) -> np.ndarray:
        """The expert's chunk in π0.5 model space ``float32[H, D]`` (or as LIBERO actions
        ``[H, 7]``, what openpi's server answers after its own transforms)."""
        (chunk,) = host.act([request.item], request.action_horizon)
        return pi05.model_actions(chunk, request, model) if model_space else chunk

    async def generate(request: pi05.Pi05Request, model_space: bool = True) -> dict[str, Any]:
        actions = await host.run_merged(request.request_id, lambda: compute(request, model_space))
        return pi05.output(request, actions)

    async def run(payload: Any, websocket: bool) -> dict[str, Any]:
        reason = host.not_ready()
        if reason is not None:
            raise PolicyOutputError(reason)
        return await generate(pi05.parse_request(payload, model, websocket=websocket))

    @app.get("/v1/actions/metadata")
    async def pi05_metadata() -> Response:
        return JSONResponse(metadata)

    parse = partial(pi05.parse_request, model=model, websocket=False)
    add_action_generations(app, host, parse, generate, pi05.envelope)

    @app.get("/healthz")
    async def healthz() -> Response:  # openpi's readiness path
        ready = host.not_ready() is None
        return Response("OK\n" if ready else "starting\n", 200 if ready else 503)

    async def openpi_answer(frame: bytes) -> dict[str, Any]:
        started = time.monotonic()
        reason = host.not_ready()
        if reason is not None:
            raise PolicyOutputError(reason)
        request = pi05.parse_openpi_request(codec.unpack(frame), model)
        result = await generate(request, model_space=False)
        infer_ms = (time.monotonic() - started) * 1000
        return {"actions": result["actions"], "server_timing": {"infer_ms": infer_ms}}

    async def openpi_failure(websocket: WebSocket, exc: Exception) -> None:
        await websocket.send_text(f"Traceback (reference server):\n{exc!r}")

    @app.websocket("/")
    async def openpi_serve_policy(websocket: WebSocket) -> None:
        """openpi's ``websocket_policy_server.py``: metadata, then the raw LIBERO observation
        in and ``{"actions": [10, 7]}`` out; on failure the traceback as a TEXT frame and
        close code 1011."""
        greeting = {"reference_policy": host.policy}
        await _serve_frames(websocket, host, greeting, openpi_answer, openpi_failure)

    async def sglang_answer(frame: bytes) -> dict[str, Any]:
        started = time.monotonic()
        result = await run(codec.unpack(frame), websocket=True)
        result["server_timing"] = {"infer_ms": (time.monotonic() - started) * 1000}
        return result

    async def sglang_failure(websocket: WebSocket, exc: Exception) -> None:
        await websocket.send_bytes(codec.pack({"error": f"{type(exc).__name__}: {exc}"}))

    @app.websocket("/openpi/policy")
    async def openpi_policy(websocket: WebSocket) -> None:
        """ws_utils.run_action_msgpack_ws: metadata, then one answer per frame; an error
        frame ``{"error": ...}`` and close code 1011 on failure."""
        await _serve_frames(websocket, host, metadata, sglang_answer, sglang_failure)


async def _serve_frames(
    websocket: WebSocket,
    host: ReferenceHost,
    greeting: dict[str, Any],
    respond: Callable[[bytes], Awaitable[dict[str, Any]]],
    report: Callable[[WebSocket, Exception], Awaitable[None]],
) -> None:
    """A websocket session: ``greeting`` first, then one answer per msgpack frame until the
    client leaves; a failure is counted as a refused request, reported to the client in the
    protocol's way (``report``), and closes the socket with code 1011."""
    await websocket.accept()
    await websocket.send_bytes(codec.pack(greeting))
    while True:
        try:
            frame = await websocket.receive_bytes()
        except WebSocketDisconnect:
            return
        try:
            await websocket.send_bytes(codec.pack(await respond(frame)))
        except WebSocketDisconnect:
            return
        except Exception as exc:  # noqa: BLE001 - reported to the client, then closed
            host.reject(f"websocket request failed: {exc}")
            await report(websocket, exc)
            await websocket.close(code=1011, reason="Internal server error")
            return
