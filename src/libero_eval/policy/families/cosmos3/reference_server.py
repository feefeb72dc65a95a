"""Cosmos3's part of the reference server: SGLang 0.5.23's Cosmos3 action API
(``sglang/multimodal_gen/runtime/entrypoints/action/{api.py,protocol.py,cosmos3.py}``) served
by the server policy (``libero_eval.policy.reference_host`` says what the server hands it).

- ``GET /v1/actions/metadata``: the structure of ``cosmos3_action_metadata``.
- ``POST /v1/actions/generations``: JSON, or msgpack when Content-Type contains ``msgpack``.
  The request is parsed and validated as ``_action_request_to_observation`` and
  ``build_cosmos3_action_sampling_params`` do, with the same error messages (HTTP 400,
  ``{"detail": message}``; ``reference_requests``, which lists the deliberate differences);
  the answer is ``action_generation_response`` (``envelope``) or ``action_raw_response``
  (``raw``), msgpack when Content-Type or Accept contains ``msgpack``.

A request is a batch of its own (``ReferenceHost.run_batch``). The server policy turns each
image into a LIBERO chunk ``[H, 7]``; it is normalized into the model's 10-channel form with
the model's statistics (``server.reference.action_stats_path``, ``normalization``), so the
client sees what a Cosmos3 server without ``action_stats_path`` returns, and zero-padded up to
``padded_action_dim`` channels (SGLang 0.5.23 itself returns exactly ``raw_action_dim``
channels; padding lets tests exercise a client's slicing). Like SGLang, ``runtime.output_format``
does not matter for Cosmos3: JSON answers carry lists, msgpack answers numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from libero_eval.policy.families.cosmos3.actions import (
    MODEL_ACTION_DIM,
    ActionStats,
    libero_to_model_chunk,
    load_action_stats,
    stats_block_for,
)
from libero_eval.policy.families.cosmos3.reference_requests import (
    GenerationRequest,
    parse_generation_request,
)
from libero_eval.policy.families.cosmos3.reference_responses import action_metadata
from libero_eval.policy.families.cosmos3.reference_responses import generation_envelope as envelope
from libero_eval.policy.reference_host import ReferenceHost
from libero_eval.policy.reference_host.http import add_action_generations


@dataclass(frozen=True)
class Settings:
    """Cosmos3's fields of ``server.reference`` (``schema.yaml`` beside this file): the
    model's statistics and normalization, and the channels of an answer's action rows."""

    action_stats_path: str | Path
    normalization: str
    padded_action_dim: int


def model_actions(
    chunks: list[np.ndarray], stats: ActionStats, horizon: int, padded_action_dim: int
) -> np.ndarray:
    """LIBERO chunks ``[H, 7]`` as normalized model actions ``float32[B, H, padded]``."""
    actions = np.zeros((len(chunks), horizon, padded_action_dim), dtype=np.float32)
    for index, chunk in enumerate(chunks):
        actions[index, :, :MODEL_ACTION_DIM] = libero_to_model_chunk(chunk, stats)
    return actions


def output(request: GenerationRequest, actions: np.ndarray) -> dict[str, Any]:
    """The SGLang pipeline's output dict for ``request``."""
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


def add_routes(app: FastAPI, host: ReferenceHost, settings: Settings) -> None:
    """Cosmos3's metadata and generations routes; the statistics file is read now."""
    stats = load_action_stats(settings.action_stats_path, stats_block_for(settings.normalization))
    padded = settings.padded_action_dim
    metadata = action_metadata(host.model_name, host.policy, host.max_batch_size, padded)

    def compute(request: GenerationRequest) -> np.ndarray:
        chunks = host.act(request.items, request.action_horizon)
        return model_actions(chunks, stats, request.action_horizon, padded)

    async def generate(request: GenerationRequest) -> dict[str, Any]:
        """One request, a batch of its own."""
        items = request.batch_size
        actions = await host.run_batch(request.request_id, lambda: compute(request), items)
        return output(request, actions)

    @app.get("/v1/actions/metadata")
    async def cosmos3_metadata() -> Response:
        return JSONResponse(metadata)

    parse = partial(
        parse_generation_request, max_batch_size=host.max_batch_size, padded_action_dim=padded
    )
    add_action_generations(app, host, parse, generate, envelope)
