"""toyvla's part of the CPU reference server (``server.backend: reference``): its own routes,
``POST /toy/act`` (JSON) and ``GET /toy/ready``, answered by the reference server's policy
(``server.reference.policy``, e.g. ``hold``) instead of toyvla's own server. The family names
this module in ``Family.reference``; the server imports it when it serves toyvla and hands it
a ``ReferenceHost`` (``libero_eval.policy.reference_host``): the server's policy, its batch
slot, its counters. Nothing here imports the reference server.

toyvla's wire carries LIBERO actions, so the server policy's chunks go out as they are, marked
``"server": "toyvla"`` (the adapter's check) and ``"model": <the server's model name>``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from libero_eval.policy.reference_host import PolicyItem, ReferenceHost, RequestError
from libero_eval.policy.reference_host.http import policy_failures_as_500, refuse, require_ready
from toyvla import ACT_PATH, MARK, READY_PATH


@dataclass(frozen=True)
class Settings:
    """toyvla adds no field to ``server.reference``: the server's own settings suffice."""


def items_of(body: object, max_batch_size: int) -> tuple[list[PolicyItem], int]:
    """The observations of a toyvla request (one grey pixel of its brightness each) and the
    chunk it asks for; ``RequestError`` for a body that is not toyvla's."""
    if not isinstance(body, dict) or not isinstance(body.get("brightness"), list):
        raise RequestError("expected toyvla's request: {prompt, brightness: [...], chunk}")
    brightness, chunk = body["brightness"], body.get("chunk")
    if not brightness or len(brightness) > max_batch_size:
        raise RequestError(f"brightness: 1 to {max_batch_size} observations, got {len(brightness)}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise RequestError(f"chunk: a positive integer, got {chunk!r}")
    pixel = [np.full((1, 1, 3), int(np.clip(b, 0, 255)), np.uint8) for b in brightness]
    prompt = str(body.get("prompt", ""))
    return [PolicyItem(image=image, prompt=prompt) for image in pixel], chunk


def add_routes(app: FastAPI, host: ReferenceHost, settings: Settings) -> None:
    @app.get(READY_PATH)
    async def ready() -> Response:
        require_ready(host)
        return JSONResponse({"ready": True})

    @app.post(ACT_PATH)
    async def act(request: Request) -> Response:
        require_ready(host)
        try:
            body = await request.json()
            items, chunk = items_of(body, host.max_batch_size)
        except (RequestError, ValueError) as exc:
            raise refuse(host, RequestError(str(exc))) from exc
        request_id = str(body.get("request_id"))
        with policy_failures_as_500(host):
            chunks = await host.run_batch(request_id, lambda: host.act(items, chunk), len(items))
        actions = [chunk.tolist() for chunk in chunks]
        return JSONResponse(
            {"server": MARK, "model": host.model_name, "request_id": request_id, "actions": actions}
        )


__all__ = ["Settings", "add_routes"]
