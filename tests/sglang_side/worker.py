"""Runs SGLang 0.5.23's own request/response code for the contract tests (side environment).

Started by ``tests/sglang_side/__init__.py`` with the side environment's python; reads
requests from stdin and answers on stdout, each a 4-byte big-endian length and a plain msgpack
map. Request bodies and frames travel as the exact bytes our client sends, and SGLang decodes
them with its own ``unpack_msgpack`` / ``json``; SGLang-built responses travel back as the
bytes SGLang's handlers would send. Nothing here re-implements SGLang: the only stand-ins are
Cosmos3's sampling-params class (records what the parser passes it, as before) and the
PaliGemma tokenizer (a downloaded model asset; the stand-in records the prompt text SGLang
builds, which is what the contract is about).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import struct
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np


def _read(stream) -> dict[str, Any] | None:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return msgpack.unpackb(stream.read(size), raw=False)


def _write(stream, message: dict[str, Any]) -> None:
    data = msgpack.packb(message, use_bin_type=True)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


# --- Cosmos3 (tests/test_wire_fixtures.py) --------------------------------------------------


@dataclasses.dataclass
class CapturedSamplingParams:
    """Stands in for Cosmos3SamplingParams: records what SGLang's parser would pass it."""

    request_id: Any = None
    prompt: Any = None
    image_path: Any = None
    video_path: Any = None
    action_mode: Any = None
    domain_id: Any = None
    domain_name: Any = None
    raw_action_dim: Any = None
    action_fps: Any = None
    action_view_point: Any = None
    action_normalization: Any = None
    action_stats_path: Any = None
    num_frames: Any = None
    fps: Any = None
    height: Any = None
    width: Any = None
    num_inference_steps: Any = None
    guidance_scale: Any = None
    seed: Any = None

    def _adjust(self, server_args: Any) -> None:
        pass


def cosmos3_parse(body: bytes, content_type: str) -> dict[str, Any]:
    from sglang.multimodal_gen.runtime.entrypoints.action.cosmos3 import (
        build_cosmos3_action_sampling_params,
    )
    from sglang.multimodal_gen.runtime.entrypoints.action.protocol import (
        _action_request_to_observation,
        unpack_msgpack,
    )

    payload = unpack_msgpack(body) if "msgpack" in content_type else json.loads(body)
    server_args = SimpleNamespace(
        batching_max_size=8, pipeline_config=SimpleNamespace(action_stats_path=None)
    )
    params = build_cosmos3_action_sampling_params(
        payload, _action_request_to_observation(payload), server_args, CapturedSamplingParams
    )
    images = params.image_path if isinstance(params.image_path, list) else [params.image_path]
    fields = {
        f.name: getattr(params, f.name)
        for f in dataclasses.fields(params)
        if f.name not in ("image_path", "video_path")
    }
    return {**fields, "image_sizes": [list(image.size) for image in images]}


# --- π0.5 ------------------------------------------------------------------------------------


def _pi05_server_args(batching_max_size: int = 1, checkpoint: str | None = None):
    from sglang.multimodal_gen.configs.pipeline_configs.pi05 import Pi05PipelineConfig

    pipeline_config = Pi05PipelineConfig()
    if checkpoint is not None:  # what SGLang's worker does when it loads the model
        from sglang.multimodal_gen.runtime.models.vlas.pi05_policy import Pi05PolicyModel

        Pi05PolicyModel._apply_checkpoint_config(checkpoint, pipeline_config)
    return SimpleNamespace(  # as SGLang's test/unit/test_pi05_action_api.py builds it
        model_id=None,
        model_path="lerobot/pi05_base",
        served_model_name="pi05",
        output_path=None,
        comfyui_mode=False,
        num_gpus=1,
        tp_size=1,
        sp_degree=1,
        ulysses_degree=1,
        ring_degree=1,
        kv_gather_degree=1,
        batching_max_size=batching_max_size,
        pipeline_config=pipeline_config,
    )


class _RecordingTokenizer:
    """Stands in for the PaliGemma tokenizer: keeps the prompts SGLang builds."""

    pad_token_id = 0

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompts, max_length, **_kwargs):
        import torch

        self.prompts = list(prompts)
        shape = (len(prompts), max_length)
        return {
            "input_ids": torch.zeros(shape, dtype=torch.long),
            "attention_mask": torch.ones(shape, dtype=torch.bool),
        }


def pi05_parse(
    body: bytes, content_type: str, route: str, checkpoint: str | None = None
) -> dict[str, Any]:
    """Our body through SGLang's π0.5 request handling, up to the model's input tensors; with
    ``checkpoint``, SGLang's config first rewritten from that directory's config.json."""
    from sglang.multimodal_gen.runtime.entrypoints.action import api, openpi
    from sglang.multimodal_gen.runtime.entrypoints.action.protocol import (
        build_action_sampling_params,
        unpack_msgpack,
    )
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages import (
        pi05_preprocess,
    )

    server_args = _pi05_server_args(checkpoint=checkpoint)
    if route == "http":  # api.py create_action_generation
        payload = unpack_msgpack(body) if "msgpack" in content_type else json.loads(body)
        if "msgpack" in content_type:
            api._prefer_numpy_output(payload)
        response_format = api._response_format(payload)
    else:  # openpi.py openpi_policy_ws
        payload = unpack_msgpack(body)
        openpi._prefer_numpy_output(payload)
        response_format = None
    params = build_action_sampling_params(payload, server_args)
    observation = params.build_request_extra()["vla"]["observation"]
    preprocessor = pi05_preprocess.Pi05Preprocessor.__new__(pi05_preprocess.Pi05Preprocessor)
    preprocessor.config = server_args.pipeline_config
    preprocessor.tokenizer = _RecordingTokenizer()
    batch = preprocessor(observation)
    config = server_args.pipeline_config
    return {
        "config": {
            "image_keys": list(config.image_keys),
            "state_dim": config.state_dim,
            "action_horizon": config.action_horizon,
            "action_dim": config.action_dim,
            "max_token_len": config.max_token_len,
        },
        "tokens": np.asarray(batch.tokens).reshape(-1).tolist(),
        "token_masks": np.asarray(batch.token_masks).reshape(-1).tolist(),
        "sampling_params": type(params).__name__,
        "request_id": params.request_id,
        "prompt": params.prompt,
        "action_horizon": params.action_horizon,
        "action_dim": params.action_dim,
        "num_inference_steps": params.num_inference_steps,
        "output_format": params.output_format,
        "response_format": response_format,
        "full_prompt": (preprocessor.tokenizer.prompts or [None])[0],
        # the image blocks the model encodes, in order (Pi05PolicyModel.encode_prefix iterates
        # this, duplicates included; ``images`` below is a dict)
        "camera_order": list(batch.metadata["camera_order"]),
        "state": np.asarray(batch.state, dtype=np.float32).tolist(),
        "images": {
            key: {
                "shape": list(tensor.shape),
                "values": tensor.numpy().astype(np.float32).tobytes(),
                "mask": bool(batch.image_masks[key][0]),
            }
            for key, tensor in batch.images.items()
        },
    }


def hf_tokenize(tokenizer_json: str, text: str, max_length: int) -> dict[str, Any]:
    """LeRobot's TokenizerProcessorStep call (lerobot processor/tokenizer_processor.py:263-270)
    on a Hugging Face fast tokenizer built from ``tokenizer_json``."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, pad_token="<pad>")
    encoded = tokenizer(
        [text],
        max_length=max_length,
        truncation=True,
        padding="max_length",
        padding_side="right",
        return_tensors="np",
    )
    return {
        "input_ids": encoded["input_ids"][0].tolist(),
        "attention_mask": encoded["attention_mask"][0].astype(bool).tolist(),
    }


def lerobot_model_image(frame: bytes, shape: list[int]) -> bytes:
    """LeRobot's π0.5 image preprocessing of a raw uint8 frame (``tests/reference_code``)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference_code.images import lerobot_model_image as preprocess

    array = np.frombuffer(frame, dtype=np.uint8).reshape(shape)
    return preprocess(torch.from_numpy(array.copy())).numpy().astype(np.float32).tobytes()


def pi05_response(actions: bytes, shape: list[int], route: str, response_format: str, wire: str):
    """The bytes SGLang's handlers send for a π0.5 output of ``actions``."""
    from sglang.multimodal_gen.runtime.entrypoints.action.protocol import (
        action_generation_response,
        action_raw_response,
        pack_msgpack,
    )

    server_args = _pi05_server_args()
    array = np.frombuffer(actions, dtype=np.float32).reshape(shape)
    output = {  # VLAActionPostprocessStage's payload
        "request_id": "req-1",
        "actions": array if (route == "ws" or wire == "msgpack") else array.tolist(),
        "parameters": {"num_inference_steps": 10},
        "timings": {"postprocess_ms": 0.1},
    }
    if route == "ws":
        response = dict(output)
        response.setdefault("server_timing", {})["infer_ms"] = 1.0
        return pack_msgpack(response)
    preserve = wire == "msgpack"
    if response_format == "raw":
        response = action_raw_response(output, preserve_numpy=preserve)
    else:
        response = action_generation_response(output, server_args, preserve_numpy=preserve)
    if preserve:
        return pack_msgpack(response)
    from sglang.srt.utils.json_response import orjson_response

    return bytes(orjson_response(response).body)


def pi05_error_frame(message: str) -> bytes:
    """ws_utils.run_action_msgpack_ws's error frame."""
    from sglang.multimodal_gen.runtime.entrypoints.action.protocol import pack_msgpack

    return pack_msgpack({"error": message})


def pi05_metadata() -> dict[str, Any]:
    from sglang.multimodal_gen.runtime.entrypoints.action.protocol import action_metadata

    return json.loads(json.dumps(action_metadata(_pi05_server_args())))


def serve_args(argv: list[str]) -> dict[str, Any]:
    """``sglang serve ARGV`` through SGLang's own dispatcher and diffusion argument parser."""
    from sglang.cli import serve as cli_serve
    from sglang.cli.serve_backends import ServeBackendDetection, ServeRequest
    from sglang.cli.utils import try_get_model_path
    from sglang.multimodal_gen.registry import get_pipeline_config_classes
    from sglang.multimodal_gen.runtime.entrypoints.cli.serve import (
        add_multimodal_gen_serve_args,
    )

    request = ServeRequest(
        argv=tuple(argv), model_path=try_get_model_path(argv), model_path_is_positional=False
    )
    detection = cli_serve._detect_diffusion(request)
    parser = argparse.ArgumentParser()
    add_multimodal_gen_serve_args(parser)
    parsed, unknown = parser.parse_known_args(argv)
    classes = get_pipeline_config_classes(parsed.pipeline_class_name)
    return {
        "diffusion_backend": detection == ServeBackendDetection.MATCH,
        "unknown": unknown,
        "parsed": {
            k: v
            for k, v in vars(parsed).items()
            if isinstance(v, str | int | float)
            or (isinstance(v, list) and all(isinstance(x, str | int) for x in v))
        },
        "pipeline_config": classes[0].__name__ if classes else None,
    }


def pi05_pipeline_config(path: str) -> dict[str, Any]:
    """The JSON file of ``--pipeline-config-path`` loaded by SGLang's own Pi05PipelineConfig
    (``load_from_json``, then the CUDA-graph checks it runs at start): its field names and the
    values it took."""
    from sglang.multimodal_gen.registry import get_pipeline_config_classes

    config = get_pipeline_config_classes("Pi05Pipeline")[0]()
    config.load_from_json(path)
    config.check_pipeline_config()
    names = [f.name for f in dataclasses.fields(config)]
    return {
        "fields": names,
        "values": {
            name: getattr(config, name)
            for name in json.loads(Path(path).read_text())
            if name in names
        },
    }


# --- openpi-client ---------------------------------------------------------------------------


def openpi_resize(image: bytes, shape: list[int], size: int) -> bytes:
    from openpi_client import image_tools

    array = np.frombuffer(image, dtype=np.uint8).reshape(shape)
    return image_tools.convert_to_uint8(image_tools.resize_with_pad(array, size, size)).tobytes()


def openpi_unpack(frame: bytes) -> dict[str, Any]:
    """A frame through openpi-client's msgpack_numpy, summarized."""
    from openpi_client import msgpack_numpy

    decoded = msgpack_numpy.unpackb(frame)
    return {
        key: (
            {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.tobytes()}
            if isinstance(value, np.ndarray)
            else value
        )
        for key, value in decoded.items()
        if key != "privileged_state"
    }


def openpi_pack_actions(actions: bytes, shape: list[int]) -> bytes:
    """An openpi server's answer frame (websocket_policy_server.py packs with msgpack_numpy)."""
    from openpi_client import msgpack_numpy

    array = np.frombuffer(actions, dtype=np.float64).reshape(shape)
    return msgpack_numpy.Packer().pack({"actions": array, "server_timing": {"infer_ms": 1.0}})


OPS = {
    name: globals()[name]
    for name in (
        "cosmos3_parse",
        "pi05_parse",
        "hf_tokenize",
        "lerobot_model_image",
        "pi05_response",
        "pi05_error_frame",
        "pi05_metadata",
        "serve_args",
        "pi05_pipeline_config",
        "openpi_resize",
        "openpi_unpack",
        "openpi_pack_actions",
    )
}


def main() -> None:
    import sglang.multimodal_gen.runtime.entrypoints.action.protocol  # noqa: F401 - warm up

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # SGLang's own prints must not corrupt the channel
    _write(stdout, {"ready": True})
    while (request := _read(stdin)) is not None:
        try:
            result = OPS[request["op"]](**request.get("args", {}))
            _write(stdout, {"ok": True, "result": result})
        except ValueError as exc:  # what SGLang's HTTP handler turns into a 400
            _write(stdout, {"ok": False, "value_error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - reported to the test
            _write(
                stdout,
                {"ok": False, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"},
            )


if __name__ == "__main__":
    main()
