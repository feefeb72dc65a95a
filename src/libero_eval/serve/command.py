"""A slot's server command line, environment and port (from `ServerSettings`).

The SGLang flags emitted here all exist in SGLang 0.5.23's
`sglang/multimodal_gen/runtime/server_args/server_args.py` (`--model-path`,
`--pipeline-class-name`, `--attention-backend`, `--num-gpus`, `--tp-size`,
`--batching-max-size`, `--batching-delay-ms`, `--host`, `--port`, `--master-port`,
`--scheduler-port`, `--input-save-path`, `--pipeline-config-path`); `serve` is the subcommand
of the `sglang` console script (`sglang = sglang.cli.main:main`, see `sglang/cli/main.py`).

Besides its HTTP port P, `sglang serve` binds P + 1 (its ZMQ broker), a scheduler port (5555 +
random 0-100) and a torch.distributed master port (30005), checked free when it parses its
arguments and bound seconds later. Two servers started together on one host both take 30005
and the second dies with EADDRINUSE, so `resolve_port` gives every server its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from libero_eval.serve.settings import SGLANG_MEMORY_CAP_VARIABLE, ServerSettings

LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost")
# Snakemake exports these set to the job's `threads` (snakemake/shell.py). The serve rule has
# `threads: 0` (a service's resources add up with its consumers'), so they arrive as "0":
# libgomp rejects that ("Invalid value for environment variable OMP_NUM_THREADS"), and SGLang
# takes any OMP_NUM_THREADS as the deployer's choice and then does not size torch's pool.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# SGLang 0.5.23 sizes a worker's pool as min(16, host cores // GPUs) when OMP_NUM_THREADS is
# unset (multimodal_gen/runtime/managers/gpu_worker.py, _worker_cpu_intra_op_threads). On a
# node whose cores the env workers share, that starves both (one H200, 16 cores, through the
# workflow: one model 18.3 obs/s with 16 threads, 42.0 with 2, 46.4 with 4; another 2.24 with
# 16, 3.27 with 4; docs/performance.md, "Server threads"). So a server takes a quarter of the CPUs
# it shares with its envs, per GPU, and at most 4: the envs keep the other three quarters.
MAX_SERVER_THREADS = 4
SERVER_CPU_SHARE = 4  # a server's threads: its CPUs per GPU // this


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
    if settings.backend == "family":  # the family's own server, from its package
        family = settings.family
        assert family is not None
        values = {"{python}": sys.executable, "{host}": host, "{port}": port}
        argv = []
        for arg in family.command:
            for key, value in values.items():
                arg = arg.replace(key, value)
            argv.append(arg)
        return argv
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
    if sgl.batching_delay_ms is not None:
        cmd += ["--batching-delay-ms", f"{sgl.batching_delay_ms:g}"]
    cmd += ["--pipeline-class-name", sgl.pipeline_class_name]
    # SGLang saves uploads, and its warm-up image, under --input-save-path (default
    # inputs/uploads in its working directory: the repository); "" keeps them in a temp dir.
    cmd += ["--input-save-path", ""]
    if sgl.master_port is not None:
        cmd += ["--master-port", str(sgl.master_port)]
    if sgl.scheduler_port is not None:
        cmd += ["--scheduler-port", str(sgl.scheduler_port)]
    if sgl.attention_backend is not None:
        cmd += ["--attention-backend", sgl.attention_backend]
    if sgl.performance_mode is not None:
        cmd += ["--performance-mode", sgl.performance_mode]
    if sgl.pipeline_config:
        cmd += ["--pipeline-config-path", str(pipeline_config_file(sgl.pipeline_config))]
    return cmd + list(sgl.extra_args)


def pipeline_config_file(fields: Mapping[str, Any], directory: Path | None = None) -> Path:
    """`server.sglang.pipeline_config` as the JSON file SGLang reads (`--pipeline-config-path`),
    named by its content in `directory` (default: a folder in the node's temp dir), so every
    server of the same settings reads the same file and a rerun rewrites nothing."""
    text = json.dumps(dict(fields), sort_keys=True, indent=1) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = directory or Path(tempfile.gettempdir()) / "libero_eval_sglang"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"pipeline_config_{digest}.json"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    return path


def _merge_no_proxy(current: str | None, hosts: Sequence[str]) -> str:
    entries = [e.strip() for e in (current or "").split(",") if e.strip()]
    return ",".join(entries + [h for h in hosts if h not in entries])


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a Slurm cpuset, taskset, ...)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def server_threads(settings: ServerSettings, cpus: int | None = None) -> int:
    """CPU threads for the server: `settings.cpu_threads`, else a quarter of the usable CPUs
    per GPU (counted on the CPUs this job may use: its affinity, a Slurm cpuset, which it
    shares with the slot's env workers), 1 to 4 (`MAX_SERVER_THREADS`, measured)."""
    if settings.cpu_threads is not None:
        return settings.cpu_threads
    gpus = settings.sglang.num_gpus if settings.sglang is not None else 1
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(MAX_SERVER_THREADS, cpus // max(1, gpus) // SERVER_CPU_SHARE))


def _is_thread_count(value: str | None) -> bool:
    return value is not None and value.strip().isdigit() and int(value) > 0


def _fix_thread_variables(env: dict[str, str], threads: int, force: bool) -> None:
    """Set the thread variables that are not a positive integer (Snakemake's "0" for the
    serve job), or all of them with `force`, to `threads`; OMP_NUM_THREADS is set even when
    absent. Without `force` a valid value stays."""
    for key in THREAD_VARIABLES:
        present = key in env or key == "OMP_NUM_THREADS"
        if present and (force or not _is_thread_count(env.get(key))):
            env[key] = str(threads)


def build_env(settings: ServerSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: `base` (default os.environ) + loopback NO_PROXY + GPU pin +
    a positive thread count (`server_threads`); `settings.extra_env` overrides all of it."""
    env = dict(os.environ if base is None else base)
    _fix_thread_variables(env, server_threads(settings), settings.cpu_threads is not None)
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


def pick_free_port(host: str = "127.0.0.1", with_next: bool = False) -> int:
    """A TCP port the OS considers free on `host` right now (and port + 1 too, `with_next`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if not with_next or (port < 65535 and port_is_free(host, port + 1)):
                return port
    raise OSError(f"no free port P on {host} with P + 1 free as well")


def pick_free_ports(count: int, avoid: set[int], host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports on `host`, none in `avoid` (all held open while picking)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
        return ports


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


class ServerHostError(OSError):
    """`server.host` is no address a server could listen on here; the message says the fix."""


def check_host(host: str) -> None:
    """Raise :class:`ServerHostError` unless a server can listen on `host` on this machine
    (bound once, on a free port: an address of none of its interfaces fails with
    EADDRNOTAVAIL, a name that does not resolve with a gaierror)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as sock:
            sock.bind(address)
    except OSError as exc:  # socket.gaierror included
        raise ServerHostError(
            f"server.host {host!r} cannot be bound on this machine ({socket.gethostname()}): "
            f"{exc.strerror or exc}. Set server.host to 127.0.0.1 (the default: each shard "
            "reaches its server on the machine they share), or to an address of this "
            "machine's own interfaces"
        ) from exc


def exposure_warning(host: str) -> str | None:
    """The warning for a `server.host` that is not loopback: the policy servers answer
    anyone who can reach that address, with no authentication; None for loopback."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: loopback if every address it resolves to is
        try:
            infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
            loopback = all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
        except (OSError, ValueError):
            loopback = False
    if loopback:
        return None
    where = "every network interface" if host in ("0.0.0.0", "::", "") else host
    return (
        f"server.host {host!r}: the policy servers listen on {where}, so anyone who can reach "
        "this machine can send them requests (they have no authentication). Keep the default "
        "127.0.0.1 unless a client on another machine needs them."
    )


def resolve_port(settings: ServerSettings) -> ServerSettings:
    """Settings with concrete ports: port 0 becomes a free port on settings.host (for sglang
    one whose next port, SGLang's broker, is free too), and an sglang server without its own
    master and scheduler ports gets two free ones. Ports already set stay. A host no server
    could listen on here raises :class:`ServerHostError`, before any server starts."""
    check_host(settings.host)
    sglang = settings.backend == "sglang"
    if settings.port == 0:
        settings = replace(settings, port=pick_free_port(settings.host, with_next=sglang))
    sgl = settings.sglang
    if sglang and sgl is not None and (sgl.master_port is None or sgl.scheduler_port is None):
        avoid = {settings.port, settings.port + 1, sgl.master_port, sgl.scheduler_port}
        master, scheduler = pick_free_ports(2, {p for p in avoid if p is not None})
        sgl = replace(
            sgl,
            master_port=master if sgl.master_port is None else sgl.master_port,
            scheduler_port=scheduler if sgl.scheduler_port is None else sgl.scheduler_port,
        )
        settings = replace(settings, sglang=sgl)
    return settings
