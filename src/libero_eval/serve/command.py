"""A slot's server command line, environment and port (from `ServerSettings`).

The SGLang flags emitted here all exist in SGLang 0.5.23's
`sglang/multimodal_gen/runtime/server_args/server_args.py` (`--model-path`,
`--pipeline-class-name`, `--attention-backend`, `--num-gpus`, `--tp-size`,
`--batching-max-size`, `--host`, `--port`); `serve` is the subcommand of the `sglang`
console script (`sglang = sglang.cli.main:main`, see `sglang/cli/main.py`).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from libero_eval.serve.settings import SGLANG_MEMORY_CAP_VARIABLE, ServerSettings

LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost")


def build_command(settings: ServerSettings) -> list[str]:
    """The server's argv for the configured backend (port must already be concrete)."""
    host, port = settings.host, str(settings.port)
    if settings.backend == "reference":
        ref = settings.reference
        assert ref is not None
        return [
            sys.executable,
            "-m",
            "libero_eval.reference.server",
            *("--host", host, "--port", port),
            *ref.argv(),
        ]
    if settings.backend == "openpi":
        openpi = settings.openpi
        assert openpi is not None
        if any("{port}" in arg for arg in openpi.command):
            return [arg.replace("{port}", port) for arg in openpi.command]
        return [*openpi.command, "--port", port]
    sgl = settings.sglang
    assert sgl is not None
    cmd = [*sgl.command, "serve", "--model-path", sgl.model_path]
    cmd += ["--host", host, "--port", port]
    cmd += ["--num-gpus", str(sgl.num_gpus), "--tp-size", str(sgl.tp_size)]
    cmd += ["--batching-max-size", str(sgl.batching_max_size)]
    cmd += ["--pipeline-class-name", sgl.pipeline_class_name]
    if sgl.attention_backend is not None:
        cmd += ["--attention-backend", sgl.attention_backend]
    if sgl.performance_mode is not None:
        cmd += ["--performance-mode", sgl.performance_mode]
    return cmd + list(sgl.extra_args)


def _merge_no_proxy(current: str | None, hosts: Sequence[str]) -> str:
    entries = [e.strip() for e in (current or "").split(",") if e.strip()]
    return ",".join(entries + [h for h in hosts if h not in entries])


def build_env(settings: ServerSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: `base` (default os.environ) + loopback NO_PROXY + GPU pin."""
    env = dict(os.environ if base is None else base)
    hosts = list(LOOPBACK_NO_PROXY)
    if settings.host not in hosts and settings.host not in ("0.0.0.0", "::", ""):
        hosts.append(settings.host)
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = _merge_no_proxy(env.get("NO_PROXY") or env.get("no_proxy"), hosts)
    if isinstance(settings.gpu_id, int):
        env["CUDA_VISIBLE_DEVICES"] = str(settings.gpu_id)
    elif settings.gpu_id is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in settings.gpu_id)
    if settings.sglang is not None and settings.sglang.gpu_memory_cap_gib is not None:
        env[SGLANG_MEMORY_CAP_VARIABLE] = f"{settings.sglang.gpu_memory_cap_gib:g}"
    env.update(settings.extra_env)
    return env


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS considers free on `host` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind `host:port` (SO_REUSEADDR, as uvicorn/SGLang do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def resolve_port(settings: ServerSettings) -> ServerSettings:
    """Settings with a concrete port: port 0 becomes a free port on settings.host."""
    if settings.port != 0:
        return settings
    return replace(settings, port=pick_free_port(settings.host))
