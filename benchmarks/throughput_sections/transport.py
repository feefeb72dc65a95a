"""(d) transport: client encode + decode ms per observation, msgpack with raw arrays against
JSON with base64 PNG, and the env worker -> shard pipe."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from throughput_sections.common import CHUNK, best_ms, default_config, table
from throughput_sections.env import EnvResult


def _observation_for_d(env_result: EnvResult | None, args: argparse.Namespace):
    if env_result is not None and env_result.observation is not None:
        return env_result.observation
    from libero_eval.rollout.libero_env import EnvSettings, EpisodeSpec, LiberoEpisodeEnv
    from libero_eval.rollout.protocols import get_protocol
    from libero_eval.settings_schema import build

    env = LiberoEpisodeEnv(
        build(EnvSettings, "rollout"), get_protocol("rlinf", max_steps_override=64)
    )
    try:
        return env.start_episode(EpisodeSpec(args.task[0], args.task[1], args.init_state))
    finally:
        env.close()


def _transport_costs(
    transport: str, batch: int, observation: Any, policy: dict[str, Any], repeats: int, seed: int
) -> dict[str, Any]:
    """Client-side ms (whole batch) of one request/response round in `transport`."""
    from libero_eval import settings_schema
    from libero_eval.policy import codec
    from libero_eval.policy.families import make_adapter
    from libero_eval.policy.families.cosmos3.actions import preprocess_observation_image
    from libero_eval.policy.families.cosmos3.reference_requests import parse_generation_request
    from libero_eval.policy.families.cosmos3.reference_responses import generation_envelope
    from libero_eval.policy.http_connection import HttpConnection
    from libero_eval.policy.reference_host.http import decode_body

    adapter = make_adapter("cosmos3", {**policy, "transport": transport})
    client = HttpConnection(
        "http://127.0.0.1:9", wire_format="msgpack" if transport == "msgpack" else "json"
    )
    server_max_batch = 64  # the reference server's limits; its padded width is the schema's
    server_padded_dim = settings_schema.default("server", "reference", "padded_action_dim")
    observations = [observation] * batch
    payload = adapter.build_request(observations, request_id="bench")
    body, headers = client.encode(payload)
    actions = np.random.default_rng(seed).uniform(-1, 1, size=(batch, CHUNK, 10))
    output = {
        "request_id": "bench",
        "actions": actions[0] if batch == 1 else actions,
        "action_mode": "policy",
        "domain_id": 5,
        "raw_action_dim": 10,
        "parameters": {"num_inference_steps": 30, "num_frames": 17},
    }
    msgpack_answer = transport == "msgpack"
    envelope = generation_envelope(
        {**output, "actions": np.asarray(output["actions"], dtype=np.float32)},
        "bench",
        preserve_numpy=msgpack_answer,
    )
    answer = codec.pack(envelope) if msgpack_answer else json.dumps(envelope).encode()

    def decode_answer() -> Any:
        return codec.unpack(answer) if msgpack_answer else json.loads(answer)

    response = decode_answer()
    return {
        "transport": transport,
        "batch": batch,
        "request_bytes": len(body),
        "preprocess_ms": best_ms(
            lambda: [preprocess_observation_image(o.agentview, o.wrist) for o in observations],
            repeats,
        ),
        "build_ms": best_ms(lambda: adapter.build_request(observations, "bench"), repeats),
        "encode_ms": best_ms(lambda: client.encode(payload), repeats),
        "decode_ms": best_ms(decode_answer, repeats),
        "parse_ms": best_ms(lambda: adapter.parse_response(response, batch), repeats),
        "server_decode_ms": best_ms(
            lambda: parse_generation_request(
                decode_body(body, headers["Content-Type"]), server_max_batch, server_padded_dim
            ),
            repeats,
        ),
    }


def section_d(args: argparse.Namespace, env_result: EnvResult | None) -> dict[str, Any]:
    import pickle

    observation = _observation_for_d(env_result, args)
    policy = default_config()["policy"]["cosmos3"]
    one_call_s = args.latency_fixed_s + args.latency_per_item_s
    rows, records = [], []
    for transport in ("msgpack", "png_base64"):
        for batch in (1, 8):
            r = _transport_costs(transport, batch, observation, policy, args.repeats, args.seed)
            payload_ms = max(0.0, r["build_ms"] - r["preprocess_ms"])  # PNG + base64 for JSON
            wire_only = payload_ms + r["encode_ms"] + r["decode_ms"]
            client_total = r["build_ms"] + r["encode_ms"] + r["decode_ms"] + r["parse_ms"]
            r["client_total_ms"] = client_total
            records.append(r)
            rows.append(
                [
                    transport,
                    batch,
                    r["request_bytes"] / batch / 1024,
                    r["preprocess_ms"] / batch,
                    wire_only / batch,
                    client_total / batch,
                    r["server_decode_ms"] / batch,
                    100 * client_total / batch / 1000 / one_call_s,
                ]
            )
    pickled = pickle.dumps(observation, protocol=pickle.HIGHEST_PROTOCOL)
    pipe_ms = best_ms(
        lambda: pickle.loads(pickle.dumps(observation, protocol=pickle.HIGHEST_PROTOCOL)),
        args.repeats,
    )
    print("\n### (d) Client encode + decode per observation\n")
    print(
        table(
            [
                "transport",
                "batch",
                "KiB/obs",
                "preprocess ms",
                "encode+decode ms (wire only)",
                "client total ms",
                "server decode ms",
                f"% of a {one_call_s:g} s call",
            ],
            rows,
        )
    )
    print(
        "\nBest of --repeats runs. client total = build_request (preprocess + payload) + body "
        "encoding + response decoding + parse_response (de-normalization), per observation; "
        "wire only leaves out the image preprocessing both transports share. Env worker -> "
        f"shard pipe (pickle round trip of one observation, {len(pickled) / 1024:.0f} KiB): "
        f"{pipe_ms:.3f} ms."
    )
    return {"rows": records, "pipe_ms": pipe_ms, "policy_call_s": one_call_s}
