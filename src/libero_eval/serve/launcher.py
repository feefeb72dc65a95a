"""Start a policy server as its own process group, wait for `/health`, tear it all down.

`ManagedServer` runs the built-in reference server, `sglang serve` or openpi's policy server
(`scripts/serve_policy.py`, a configurable command) in a new session
(its own process group), waits for `GET /health` to answer 200 (failing fast if the process
exits first) and on `stop()` terminates the whole group plus any descendant that left it.
The launcher follows its parent (Snakemake) into death with `libero_eval.service.ParentWatch`;
consumers wait for the service file with `libero_eval.service.wait_for_service`.

The SGLang flags emitted here all exist in SGLang 0.5.23's
`sglang/multimodal_gen/runtime/server_args/server_args.py` (`--model-path`,
`--pipeline-class-name`, `--attention-backend`, `--num-gpus`, `--tp-size`,
`--batching-max-size`, `--host`, `--port`); `serve` is the subcommand of the `sglang`
console script (`sglang = sglang.cli.main:main`, see `sglang/cli/main.py`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import IO, Any, Protocol

import psutil
import requests

from libero_eval.service import PR_SET_PDEATHSIG

BACKENDS = ("reference", "sglang", "openpi")
LOG_TAIL_LINES = 40
LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost")
DEFAULT_PIPELINE_CLASS = "Cosmos3OmniDiffusersPipeline"
# Flags `build_command` sets itself for sglang; also passing them in extra_args would make the
# server listen somewhere else than the URL we publish. `--pipeline` is an alias of
# `--pipeline-class-name` in server_args.py.
SGLANG_MANAGED_FLAGS = (
    "--model-path",
    "--host",
    "--port",
    "--num-gpus",
    "--tp-size",
    "--batching-max-size",
    "--pipeline-class-name",
    "--pipeline",
    "--attention-backend",
    "--performance-mode",
    "--mode",
)
# SGLang 0.5.23's diffusion server has no memory-fraction flag (--mem-fraction-static is the
# LLM server's). This variable caps its CUDA allocator (torch.cuda.set_per_process_memory_fraction
# in multimodal_gen/runtime/managers/gpu_worker.py); SGLang names it a test hook.
SGLANG_MEMORY_CAP_VARIABLE = "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"
SGLANG_PERFORMANCE_MODES = ("auto", "speed", "memory", "manual")


class ServerSettingsError(ValueError):
    """The server settings are invalid; the message names the `server.<field>`."""


class ServerStartError(RuntimeError):
    """The server could not be started or did not become healthy."""


class LaunchAborted(RuntimeError):
    """A stop was requested while waiting for the server to become healthy."""


# --------------------------------------------------------------------------- settings


def _check_keys(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ServerSettingsError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known fields: {', '.join(known)}"
        )


def _get_int(data: Mapping[str, Any], key: str, where: str, default: Any, minimum: int) -> Any:
    value = data.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServerSettingsError(f"{where}.{key}: expected an integer, got {value!r}")
    if value < minimum:
        raise ServerSettingsError(f"{where}.{key}: must be >= {minimum}, got {value}")
    return value


def _get_float(
    data: Mapping[str, Any], key: str, where: str, default: Any, minimum: float, strict: bool
) -> Any:
    value = data.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ServerSettingsError(f"{where}.{key}: expected a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        bound = ">" if strict else ">="
        raise ServerSettingsError(f"{where}.{key}: must be {bound} {minimum}, got {value}")
    return float(value)


def _get_str(data: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
    value = data.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, str) or not value:
        raise ServerSettingsError(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return value


def _get_str_list(data: Mapping[str, Any], key: str, where: str, default: list[str]) -> list[str]:
    value = data.get(key, default)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ServerSettingsError(f"{where}.{key}: expected a list of strings, got {value!r}")
    return list(value)


def _require(data: Mapping[str, Any], key: str, where: str) -> None:
    if data.get(key) is None:
        raise ServerSettingsError(f"{where}.{key}: required but missing")


@dataclass(frozen=True)
class ReferenceServerSettings:
    """Flags of `libero_eval.reference.server`; None means "leave the server's default"."""

    policy: str
    action_stats_path: str | None = None
    normalization: str | None = None
    max_batch_size: int | None = None
    padded_action_dim: int | None = None
    latency_fixed_s: float | None = None
    latency_per_item_s: float | None = None
    model_name: str | None = None
    family: str | None = None
    norm_stats_path: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "server.reference") -> ReferenceServerSettings:
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        _check_keys(data, [f.name for f in fields(cls)], where)
        _require(data, "policy", where)
        return cls(
            policy=_get_str(data, "policy", where, None),
            action_stats_path=_get_str(data, "action_stats_path", where, None),
            normalization=_get_str(data, "normalization", where, None),
            max_batch_size=_get_int(data, "max_batch_size", where, None, 1),
            padded_action_dim=_get_int(data, "padded_action_dim", where, None, 1),
            latency_fixed_s=_get_float(data, "latency_fixed_s", where, None, 0.0, False),
            latency_per_item_s=_get_float(data, "latency_per_item_s", where, None, 0.0, False),
            model_name=_get_str(data, "model_name", where, None),
            family=_get_str(data, "family", where, None),
            norm_stats_path=_get_str(data, "norm_stats_path", where, None),
        )


@dataclass(frozen=True)
class SglangServerSettings:
    """How to run `sglang serve` (SGLang lives in its own environment on GPU machines).

    `command` is the SGLang entry point: the console script (`/opt/sglang-env/bin/sglang`) or
    `["python", "-c", "from sglang.cli.main import main; main()"]`. Note that
    `python -m sglang.cli.main` does NOT work: that module has no `__main__` guard.
    """

    model_path: str
    command: list[str] = field(default_factory=lambda: ["sglang"])
    num_gpus: int = 1
    tp_size: int = 1
    # SGLang's own default is 1 (no batching); the Cosmos3 LIBERO reference setup uses 8.
    batching_max_size: int = 8
    pipeline_class_name: str = DEFAULT_PIPELINE_CLASS
    attention_backend: str | None = None
    performance_mode: str | None = None  # --performance-mode; None keeps SGLang's (auto)
    gpu_memory_cap_gib: float | None = None  # SGLANG_MEMORY_CAP_VARIABLE; None = no cap
    extra_args: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any, where: str = "server.sglang") -> SglangServerSettings:
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        _check_keys(data, [f.name for f in fields(cls)], where)
        _require(data, "model_path", where)
        command = _get_str_list(data, "command", where, ["sglang"])
        if not command or not command[0]:
            raise ServerSettingsError(
                f"{where}.command: must name the sglang executable, e.g. "
                '["/opt/sglang-env/bin/sglang"]'
            )
        if command[-2:] == ["-m", "sglang.cli.main"]:
            raise ServerSettingsError(
                f"{where}.command: `-m sglang.cli.main` exits without doing anything (the "
                "module has no __main__ guard); use the `sglang` console script of the SGLang "
                'environment or ["python", "-c", "from sglang.cli.main import main; main()"]'
            )
        extra_args = _get_str_list(data, "extra_args", where, [])
        for arg in extra_args:
            flag = arg.split("=", 1)[0]
            if flag in SGLANG_MANAGED_FLAGS:
                raise ServerSettingsError(
                    f"{where}.extra_args: {arg!r} is set by the launcher from the settings "
                    "fields (host/port/model_path/...); set that field instead"
                )
        num_gpus = _get_int(data, "num_gpus", where, 1, 1)
        tp_size = _get_int(data, "tp_size", where, 1, 1)
        performance_mode = _get_str(data, "performance_mode", where, None)
        if performance_mode is not None and performance_mode not in SGLANG_PERFORMANCE_MODES:
            raise ServerSettingsError(
                f"{where}.performance_mode: expected one of "
                f"{', '.join(SGLANG_PERFORMANCE_MODES)} or null, got {performance_mode!r}"
            )
        if tp_size > num_gpus:
            raise ServerSettingsError(
                f"{where}.tp_size: {tp_size} exceeds {where}.num_gpus ({num_gpus})"
            )
        return cls(
            model_path=_get_str(data, "model_path", where, None),
            command=command,
            num_gpus=num_gpus,
            tp_size=tp_size,
            batching_max_size=_get_int(data, "batching_max_size", where, 8, 1),
            pipeline_class_name=_get_str(
                data, "pipeline_class_name", where, DEFAULT_PIPELINE_CLASS
            ),
            attention_backend=_get_str(data, "attention_backend", where, None),
            performance_mode=performance_mode,
            gpu_memory_cap_gib=_get_float(data, "gpu_memory_cap_gib", where, None, 0.0, True),
            extra_args=extra_args,
        )


@dataclass(frozen=True)
class OpenpiServerSettings:
    """How to run openpi's websocket policy server (openpi's own environment and checkout).

    `command` is the full command line, e.g. `["uv", "run", "scripts/serve_policy.py", "--env",
    "LIBERO"]` run in the openpi checkout `cwd`. The launcher passes the port: every `{port}`
    in the command is replaced by it, or, when none is there, `--port <port>` is appended
    (put it before a tyro subcommand such as `policy:checkpoint` with `{port}`). openpi's
    server always listens on 0.0.0.0 and answers `GET /healthz` once the policy is loaded.
    """

    command: list[str]
    cwd: str | None = None
    health_path: str = "/healthz"

    @classmethod
    def from_dict(cls, data: Any, where: str = "server.openpi") -> OpenpiServerSettings:
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        _check_keys(data, [f.name for f in fields(cls)], where)
        _require(data, "command", where)
        command = _get_str_list(data, "command", where, [])
        if not command or not command[0]:
            raise ServerSettingsError(
                f"{where}.command: must be openpi's server command line, e.g. "
                '["uv", "run", "scripts/serve_policy.py", "--env", "LIBERO"]'
            )
        fixed_port = [
            arg
            for i, arg in enumerate(command)
            if (arg == "--port" and command[i + 1 : i + 2] != ["{port}"])
            or (arg.startswith("--port=") and "{port}" not in arg)
        ]
        if fixed_port:
            raise ServerSettingsError(
                f"{where}.command: do not pass --port yourself; the launcher picks the port "
                "(write {port} where it belongs, e.g. [..., '--port', '{port}', "
                "'policy:checkpoint', ...])"
            )
        health_path = _get_str(data, "health_path", where, "/healthz")
        if not health_path.startswith("/"):
            raise ServerSettingsError(
                f"{where}.health_path: must start with '/', got {health_path!r}"
            )
        return cls(command=command, cwd=_get_str(data, "cwd", where, None), health_path=health_path)


@dataclass(frozen=True)
class ServerSettings:
    """One server slot: which backend, where it listens, how long to wait, how to pin GPUs.

    port 0 picks a free port at launch. gpu_id pins CUDA_VISIBLE_DEVICES (an index or a list of
    indices); None keeps the environment's value (e.g. set by SLURM).
    """

    backend: str
    slot: int
    host: str = "127.0.0.1"
    port: int = 0
    health_timeout_s: float = 900.0
    health_poll_s: float = 1.0
    teardown_grace_s: float = 20.0
    gpu_id: int | tuple[int, ...] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    reference: ReferenceServerSettings | None = None
    sglang: SglangServerSettings | None = None
    openpi: OpenpiServerSettings | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "server") -> ServerSettings:
        """Parse and validate a settings mapping (the `server` section of a run config)."""
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        _check_keys(data, [f.name for f in fields(cls)], where)
        backend = data.get("backend")
        if backend not in BACKENDS:
            raise ServerSettingsError(
                f"{where}.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}"
            )
        _require(data, "slot", where)
        gpu_id = data.get("gpu_id")
        if isinstance(gpu_id, list):
            if not gpu_id or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in gpu_id
            ):
                raise ServerSettingsError(
                    f"{where}.gpu_id: expected a device index >= 0, a non-empty list of them, "
                    f"or null, got {gpu_id!r}"
                )
            gpu_id = tuple(gpu_id)
        elif gpu_id is not None:
            gpu_id = _get_int(data, "gpu_id", where, None, 0)
        extra_env = data.get("extra_env", {})
        if not isinstance(extra_env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
            for k, v in extra_env.items()
        ):
            raise ServerSettingsError(
                f"{where}.extra_env: expected a mapping of variable name to string, "
                f"got {extra_env!r}"
            )
        reference = sglang = openpi = None
        if backend == "reference":
            _require(data, "reference", where)
            reference = ReferenceServerSettings.from_dict(data["reference"], f"{where}.reference")
        elif backend == "openpi":
            _require(data, "openpi", where)
            openpi = OpenpiServerSettings.from_dict(data["openpi"], f"{where}.openpi")
        else:
            _require(data, "sglang", where)
            sglang = SglangServerSettings.from_dict(data["sglang"], f"{where}.sglang")
            pinned = 1 if isinstance(gpu_id, int) else len(gpu_id or ())
            if gpu_id is not None and pinned < sglang.num_gpus:
                raise ServerSettingsError(
                    f"{where}.gpu_id: pins {pinned} device(s) but {where}.sglang.num_gpus is "
                    f"{sglang.num_gpus}; give a list of {sglang.num_gpus} device indices"
                )
        port = _get_int(data, "port", where, 0, 0)
        if port > 65535:
            raise ServerSettingsError(f"{where}.port: must be <= 65535 (or 0), got {port}")
        return cls(
            backend=backend,
            slot=_get_int(data, "slot", where, None, 0),
            host=_get_str(data, "host", where, "127.0.0.1"),
            port=port,
            health_timeout_s=_get_float(data, "health_timeout_s", where, 900.0, 0.0, True),
            health_poll_s=_get_float(data, "health_poll_s", where, 1.0, 0.0, True),
            teardown_grace_s=_get_float(data, "teardown_grace_s", where, 20.0, 0.0, False),
            gpu_id=gpu_id,
            extra_env={k: str(v) for k, v in extra_env.items()},
            reference=reference,
            sglang=sglang,
            openpi=openpi,
        )

    @property
    def health_path(self) -> str:
        """Readiness path: openpi's `/healthz`, SGLang's and the reference server's `/health`."""
        return self.openpi.health_path if self.openpi is not None else "/health"

    @property
    def url(self) -> str:
        """Base URL clients use (wildcard listen addresses are reached through loopback)."""
        return f"http://{_url_host(self.host)}:{self.port}"


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


# --------------------------------------------------------------------------- command, env, ports


def build_command(settings: ServerSettings) -> list[str]:
    """The server's argv for the configured backend (port must already be concrete)."""
    host, port = settings.host, str(settings.port)
    if settings.backend == "reference":
        ref = settings.reference
        assert ref is not None
        cmd = [sys.executable, "-m", "libero_eval.reference.server"]
        cmd += ["--host", host, "--port", port, "--policy", ref.policy]
        optional = [
            ("--action-stats", ref.action_stats_path),
            ("--normalization", ref.normalization),
            ("--max-batch-size", ref.max_batch_size),
            ("--padded-action-dim", ref.padded_action_dim),
            ("--latency-fixed-s", ref.latency_fixed_s),
            ("--latency-per-item-s", ref.latency_per_item_s),
            ("--model-name", ref.model_name),
            ("--family", ref.family),
            ("--norm-stats", ref.norm_stats_path),
        ]
        for flag, value in optional:
            if value is not None:
                cmd += [flag, str(value)]
        return cmd
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


# --------------------------------------------------------------------------- logs


def log_tail(path: str | os.PathLike[str] | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when unreadable)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            data = handle.read()
    except OSError:
        return ""
    tail = deque(data.decode("utf-8", errors="replace").splitlines(), maxlen=lines)
    return "\n".join(tail)


def _path_of_stream(stream: IO[Any]) -> str | None:
    """The regular file behind a stream, if any (for reading the log tail back)."""
    name = getattr(stream, "name", None)
    if isinstance(name, str) and os.path.isfile(name):
        return name
    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        target = os.readlink(f"/proc/self/fd/{fd}")
    except (OSError, ValueError, AttributeError):
        return None
    return target if os.path.isfile(target) else None


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --------------------------------------------------------------------------- parent death


def _child_parent_death_hook() -> Callable[[], None] | None:
    """A preexec_fn giving the server SIGTERM if the launcher dies without cleaning up."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return hook


# --------------------------------------------------------------------------- the server


class StopSignal(Protocol):
    """What wait_healthy needs of a stop request (threading.Event qualifies)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class ManagedServer:
    """A policy server in its own process group; a context manager that always tears down."""

    def __init__(self, settings: ServerSettings, die_with_launcher: bool = True):
        """`die_with_launcher`: arm PR_SET_PDEATHSIG(SIGTERM) in the server, so it does not
        outlive a launcher killed without cleanup (kill -9)."""
        self.settings = settings
        self.die_with_launcher = die_with_launcher
        self._proc: subprocess.Popen[bytes] | None = None
        self._known: dict[int, psutil.Process] = {}
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started_monotonic = 0.0
        self.log_path: str | None = None
        self.command: list[str] = []

    # ---- lifecycle

    def __enter__(self) -> ManagedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def pgid(self) -> int | None:
        # start_new_session=True makes the server a session and group leader: pgid == pid.
        return self.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    def poll(self) -> int | None:
        """The server's exit code, or None while it runs (or before start)."""
        return None if self._proc is None else self._proc.poll()

    def start(self, log_stream: IO[Any], log_path: str | os.PathLike[str] | None = None) -> None:
        """Spawn the server in a new session, stdout and stderr into `log_stream`.

        `log_path` is where the log can be read back for error messages; by default the
        regular file behind `log_stream`. With `die_with_launcher` the server gets SIGTERM
        when the calling THREAD ends (PR_SET_PDEATHSIG follows the spawning thread): call this
        from a long-lived thread, or pass die_with_launcher=False.
        """
        if self._proc is not None:
            raise RuntimeError("ManagedServer.start() called twice")
        if self.settings.port == 0:
            self.settings = resolve_port(self.settings)
        elif not port_is_free(self.settings.host, self.settings.port):
            raise ServerStartError(
                f"server.port: {self.settings.host}:{self.settings.port} is already in use by "
                "another process; stop it, choose another server.port, or use 0 for a free one"
            )
        self.command = build_command(self.settings)
        self.log_path = str(log_path) if log_path is not None else _path_of_stream(log_stream)
        log_stream.flush()
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log_stream,
                stderr=subprocess.STDOUT,
                env=build_env(self.settings),
                start_new_session=True,
                preexec_fn=_child_parent_death_hook() if self.die_with_launcher else None,
                cwd=self.settings.openpi.cwd if self.settings.openpi is not None else None,
            )
        except OSError as exc:
            where = {"sglang": "server.sglang.command", "openpi": "server.openpi.command"}.get(
                self.settings.backend, "server"
            )
            raise ServerStartError(
                f"{where}: cannot run {shlex.join(self.command)}: {exc}. Check that the "
                "executable exists (absolute path or on PATH) and is executable"
            ) from exc
        self._started_monotonic = time.monotonic()
        self._known[self._proc.pid] = psutil.Process(self._proc.pid)
        atexit.register(self.stop)

    def failure_report(self, message: str) -> str:
        """`message` followed by the command and the last lines of the server log."""
        tail = log_tail(self.log_path)
        where = f"server log {self.log_path}" if self.log_path else "server log (not a file)"
        text = f"{message}\ncommand: {shlex.join(self.command)}\n--- last lines of {where} ---"
        return f"{text}\n{tail or '(empty)'}"

    def _error(self, message: str) -> ServerStartError:
        return ServerStartError(self.failure_report(message))

    def wait_healthy(self, stop_event: StopSignal | None = None) -> float:
        """Poll GET <url><health_path> until 200; return seconds since launch.

        Raises ServerStartError (with the log tail) when the process exits first or the
        deadline `health_timeout_s` (counted from launch) passes; LaunchAborted when
        `stop_event` is set meanwhile.
        """
        if self._proc is None:
            raise RuntimeError("ManagedServer.wait_healthy() called before start()")
        health_url = f"{self.url}{self.settings.health_path}"
        deadline = self._started_monotonic + self.settings.health_timeout_s
        last_seen = "no answer yet"
        with requests.Session() as session:
            session.trust_env = False  # no proxies for loopback
            while True:
                code = self._proc.poll()
                if code is not None:
                    elapsed = time.monotonic() - self._started_monotonic
                    raise self._error(
                        f"{self.settings.backend} server (slot {self.settings.slot}) "
                        f"{_describe_exit(code)} {elapsed:.1f} s after launch, before "
                        f"{health_url} answered 200"
                    )
                if stop_event is not None and stop_event.is_set():
                    raise LaunchAborted(f"stop requested while waiting for {health_url}")
                remaining = deadline - time.monotonic()
                try:
                    response = session.get(health_url, timeout=max(0.5, min(5.0, remaining)))
                    if response.status_code == 200:
                        self._check_port_owner()
                        return time.monotonic() - self._started_monotonic
                    last_seen = f"HTTP {response.status_code}"
                except requests.RequestException as exc:
                    last_seen = type(exc).__name__
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._error(
                        f"{self.settings.backend} server (slot {self.settings.slot}) did not "
                        f"answer 200 on {health_url} within server.health_timeout_s="
                        f"{self.settings.health_timeout_s:g} s (last: {last_seen}); raise "
                        "server.health_timeout_s if loading the model takes longer"
                    )
                pause = min(self.settings.health_poll_s, remaining)
                if stop_event is not None:
                    stop_event.wait(pause)
                else:
                    time.sleep(pause)

    def _check_port_owner(self) -> None:
        """Fail if /health was answered by a program outside our process tree.

        SGLang silently moves to another port when the requested one is taken, so a foreign
        server on our port would otherwise be mistaken for ours.
        """
        port = self.settings.port
        checked_any = False
        for proc in [*self._known.values(), *self.track_descendants()]:
            try:
                conns = proc.net_connections(kind="inet")
            except psutil.AccessDenied:
                continue
            except psutil.Error:
                continue
            checked_any = True
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
                return
        if checked_any:
            raise self._error(
                f"{self.url}/health answered 200 but no process of the server listens on port "
                f"{port}: another program holds it. Choose another server.port (or 0)"
            )

    def track_descendants(self) -> list[psutil.Process]:
        """Remember the server's current descendants (so ones that leave the group or lose
        their parent can still be killed); returns the live ones."""
        if self._proc is None:
            return []
        found: list[psutil.Process] = []
        for proc in list(self._known.values()):
            if not _is_alive(proc):
                continue
            with contextlib.suppress(psutil.Error):
                found.extend(proc.children(recursive=True))
        for proc in found:
            self._known.setdefault(proc.pid, proc)
        return [p for p in found if _is_alive(p)]

    def _group_members(self) -> list[psutil.Process]:
        pgid = self.pgid
        members = []
        for proc in psutil.process_iter():
            if _pgid_of(proc.pid) == pgid and _is_alive(proc):
                members.append(proc)
        return members

    def _survivors(self) -> list[psutil.Process]:
        if self._proc is not None:
            self._proc.poll()  # reap the leader so it does not count as a zombie
        alive = {p.pid: p for p in self._known.values() if _is_alive(p)}
        for proc in self._group_members():
            alive.setdefault(proc.pid, proc)
        return list(alive.values())

    def _signal_all(self, signum: int) -> None:
        pgid = self.pgid
        assert pgid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
        for proc in self._known.values():
            if _pgid_of(proc.pid) != pgid and _is_alive(proc):
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signum)

    def _wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._survivors():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def stop(self) -> int | None:
        """Tear down the whole process tree: SIGTERM, grace, SIGKILL; idempotent.

        Returns the server's exit code (None if it was never started).
        """
        with self._stop_lock:
            if self._proc is None or self._stopped:
                return self.returncode
            self._stopped = True
            try:
                self.track_descendants()  # before signalling: children may re-parent after
                self._signal_all(signal.SIGTERM)
                if not self._wait_gone(self.settings.teardown_grace_s):
                    self.track_descendants()
                    self._signal_all(signal.SIGKILL)
                    self._wait_gone(5.0)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5.0)
            finally:
                atexit.unregister(self.stop)
            return self._proc.returncode
