"""The HTTP forms a family's reference-server routes share: a body read as JSON or msgpack,
msgpack answered when the client asks for it (SGLang 0.5.23's action API, ``api.py``
``_wants_msgpack``; msgpack with SGLang's ndarray encoding, ``libero_eval.policy.codec``),
SGLang's raw answer (``protocol.py`` ``action_raw_response``) and the 503 of a server whose
policy is not ready."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from libero_eval.policy import codec
from libero_eval.policy.reference_host import PolicyOutputError, ReferenceHost, RequestError

logger = logging.getLogger("libero_eval.reference.server")


def decode_body(body: bytes, content_type: str) -> Any:
    """The request body as Python objects: msgpack when Content-Type says so, JSON otherwise."""
    if "multipart/form-data" in content_type:
        raise RequestError(
            "multipart/form-data uploads are not supported by the reference server; "
            "send a JSON object or an application/msgpack map"
        )
    if "msgpack" in content_type:
        try:
            return codec.unpack(body)
        except ValueError as exc:
            raise RequestError(f"request body is not valid msgpack: {exc}") from exc
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(
            f"request body is not valid JSON ({exc}); send a JSON object, or msgpack with "
            "Content-Type: application/msgpack"
        ) from exc


async def read_body(request: Request) -> Any:
    """The body of ``request`` (:func:`decode_body` by its Content-Type)."""
    return decode_body(await request.body(), request.headers.get("content-type", ""))


def wants_msgpack(request: Request) -> bool:
    """api.py ``_wants_msgpack``: msgpack in Content-Type or Accept."""
    content_type = request.headers.get("content-type", "").lower()
    accept = request.headers.get("accept", "").lower()
    return "msgpack" in content_type or "msgpack" in accept


def answer(body: dict[str, Any], msgpack: bool) -> Response:
    """``body`` as msgpack (numpy arrays kept, SGLang's encoding) or as JSON."""
    if msgpack:
        return Response(content=codec.pack(body), media_type=codec.MSGPACK_CONTENT_TYPE)
    return JSONResponse(body)


def raw_response(output: dict[str, Any], *, preserve_numpy: bool) -> dict[str, Any]:
    """``action_raw_response``: the model output itself."""
    response = dict(output)
    if not preserve_numpy:
        response["actions"] = np.asarray(output["actions"]).tolist()
    return response


def require_ready(host: ReferenceHost) -> None:
    """HTTP 503 while the server policy cannot answer (as SGLang before its model is up)."""
    reason = host.not_ready()
    if reason is not None:
        raise HTTPException(status_code=503, detail=reason)


@contextlib.contextmanager
def policy_failures_as_500(host: ReferenceHost) -> Iterator[None]:
    """A failure of the server policy inside the block as HTTP 500 naming it (its own message
    where it answered wrongly, :class:`PolicyOutputError`)."""
    try:
        yield
    except PolicyOutputError as exc:
        logger.error("generation failed (500): %s", exc)
        raise HTTPException(status_code=500, detail=str(exc)) from exc
    except Exception as exc:
        logger.exception("generation failed (500)")
        detail = f"server policy {host.policy!r} failed: {exc!r}"
        raise HTTPException(status_code=500, detail=detail) from exc


def refuse(host: ReferenceHost, error: RequestError) -> HTTPException:
    """A request refused as the client's fault: counted and logged, HTTP 400 with its message
    (``{"detail": message}``, as SGLang's action API answers)."""
    host.reject(str(error))
    return HTTPException(status_code=400, detail=str(error))


GENERATIONS_PATH = "/v1/actions/generations"


class GenerationRequest(Protocol):
    """What :func:`add_action_generations` needs of a family's parsed request."""

    response_format: str | None  # "envelope" or "raw" (SGLang's runtime.response_format)


def add_action_generations(
    app: FastAPI,
    host: ReferenceHost,
    parse: Callable[[Any], GenerationRequest],
    generate: Callable[[Any], Awaitable[dict[str, Any]]],
    envelope: Callable[..., dict[str, Any]],
) -> None:
    """SGLang's ``POST /v1/actions/generations`` (``api.py``) for a family: the body (JSON or
    msgpack) read, ``parse``\\ d (a :class:`RequestError` is HTTP 400), ``generate``\\ d (a
    failure of the server policy is HTTP 500), answered ``action_raw_response`` (``raw``) or
    the family's ``envelope(output, model_name, preserve_numpy=...)``, msgpack when asked.
    503 while the server policy is not ready."""

    @app.post(GENERATIONS_PATH)
    async def create_action_generation(request: Request) -> Response:
        require_ready(host)
        msgpack_answer = wants_msgpack(request)
        try:
            parsed = parse(await read_body(request))
        except RequestError as exc:
            raise refuse(host, exc) from exc
        with policy_failures_as_500(host):
            output = await generate(parsed)
        if parsed.response_format == "raw":
            body = raw_response(output, preserve_numpy=msgpack_answer)
        else:
            body = envelope(output, host.model_name, preserve_numpy=msgpack_answer)
        return answer(body, msgpack_answer)
