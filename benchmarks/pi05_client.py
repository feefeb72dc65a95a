"""π0.5 client cost per observation: openpi's transforms, then encode + decode per API.

    python benchmarks/pi05_client.py [--repeats 200]

For each `policy.pi05.api` (and the sglang_http wire formats) it times, per observation:
the adapter's request (180-degree flip, two resize_with_pad to 224, state normalization and
padding), the body's encoding, the server side's decoding of it, and the answer's decoding
and conversion to LIBERO actions ([50, 32] model space, or openpi's [10, 7]). No server: the
bytes are what the client sends and receives. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
from scipy.spatial.transform import Rotation

from libero_eval import package_data
from libero_eval.policy import codec
from libero_eval.policy.families import Observation, make_adapter
from libero_eval.policy.http_connection import HttpConnection

STATS = package_data.path("stats/pi05_libero_norm_stats.json")


def observation(rng: np.random.Generator) -> Observation:
    return Observation(
        agentview=rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        wrist=rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        task_language="put the bowl on the plate",
        proprio={
            "robot0_eef_pos": np.array([-0.05, 0.02, 1.1]),
            "robot0_eef_quat": Rotation.from_rotvec([2.9, 0.2, -0.1]).as_quat(),
            "robot0_gripper_qpos": np.array([0.03, -0.03]),
        },
    )


def timed(function, repeats: int) -> tuple[float, object]:
    started = time.perf_counter()
    for _ in range(repeats):
        result = function()
    return (time.perf_counter() - started) / repeats * 1000, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    obs = observation(rng)
    variants = [
        ("sglang_http", "msgpack"),
        ("sglang_http", "json"),
        ("sglang_websocket", "msgpack"),
        ("openpi_websocket", "msgpack"),
    ]
    print(f"python {platform.python_version()}, {platform.machine()}, {args.repeats} repeats\n")
    print("| api | wire | request ms | encode ms | decode ms | body KiB | answer ms | total ms |")
    print("|---|---|---|---|---|---|---|---|")
    for api, wire in variants:
        adapter = make_adapter(
            "pi05", {"pi05": {"api": api, "wire_format": wire, "norm_stats_path": str(STATS)}}
        )
        request_ms, payload = timed(lambda a=adapter: a.build_request([obs], "r"), args.repeats)
        if wire == "json":
            client = HttpConnection("http://127.0.0.1:1", wire_format="json")
            encode_ms, (body, _) = timed(lambda p=payload, c=client: c.encode(p), args.repeats)
            decode_ms, _ = timed(lambda b=body: json.loads(b), args.repeats)
        else:
            encode_ms, body = timed(lambda p=payload: codec.pack(p), args.repeats)
            decode_ms, _ = timed(lambda b=body: codec.unpack(b), args.repeats)
        if api == "openpi_websocket":
            answer = codec.pack({"actions": rng.uniform(-1, 1, (10, 7))})
        else:
            actions = rng.uniform(-1, 1, (50, 32)).astype(np.float32)
            answer = (
                json.dumps({"actions": actions.tolist()}).encode()
                if wire == "json"
                else codec.pack({"actions": actions})
            )
        unpack = json.loads if wire == "json" else codec.unpack
        answer_ms, _ = timed(
            lambda a=adapter, b=answer, u=unpack: a.parse_response(u(b), 1), args.repeats
        )
        total = request_ms + encode_ms + decode_ms + answer_ms
        print(
            f"| {api} | {wire} | {request_ms:.2f} | {encode_ms:.2f} | {decode_ms:.2f} "
            f"| {len(body) / 1024:.0f} | {answer_ms:.2f} | {total:.2f} |"
        )


if __name__ == "__main__":
    main()
