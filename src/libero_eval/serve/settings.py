"""Server settings: the `server` section of a run config for one slot, parsed and checked.

`ServerSettings.from_dict` is the one place a slot's settings are validated; every error is a
`ServerSettingsError` naming the `server.<field>` and the fix. The serve job
(`libero_eval.serve.job`) builds them once from the JSON the `serve` rule passes, and
`libero_eval.serve.command` turns them into the server's argv and environment.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from libero_eval import settings_schema
from libero_eval.reference import settings as reference_settings

BACKENDS = settings_schema.choices("server")["backend"]
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
    "--batching-delay-ms",
    "--pipeline-class-name",
    "--pipeline",
    "--attention-backend",
    "--performance-mode",
    "--mode",
    "--master-port",
    "--scheduler-port",
)
# SGLang 0.5.23's diffusion server has no memory-fraction flag (--mem-fraction-static is the
# LLM server's). This variable caps its CUDA allocator (torch.cuda.set_per_process_memory_fraction
# in multimodal_gen/runtime/managers/gpu_worker.py); SGLang names it a test hook.
SGLANG_MEMORY_CAP_VARIABLE = "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"
SGLANG_PERFORMANCE_MODES = ("auto", "speed", "memory", "manual")


class ServerSettingsError(ValueError):
    """The server settings are invalid; the message names the `server.<field>`."""


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


def _default(cls: Any, name: str) -> Any:
    """The value of a field left out of the mapping: for a field of the config section
    ``cls`` projects (``cls.SECTION``), the schema's default, the one place it is written;
    else the dataclass field's own (a serve-only field, such as ``health_poll_s``)."""
    if name in settings_schema.fields(*cls.SECTION):
        return settings_schema.default(*cls.SECTION, name)
    spec = next(f for f in fields(cls) if f.name == name)
    return spec.default_factory() if spec.default is MISSING else spec.default


def _require(data: Mapping[str, Any], key: str, where: str) -> None:
    if data.get(key) is None:
        raise ServerSettingsError(f"{where}.{key}: required but missing")


@dataclass(frozen=True)
class ReferenceServerFlags:
    """The `server.reference` values the serve job gives `python -m libero_eval.reference.server`.

    Their names, types and flags are the fields of the server's own
    `reference.settings.ReferenceServerSettings` (checked here by type, so a bad value fails
    in the serve job naming `server.reference.<field>`); an absent value (or None) leaves the
    server's default. Read one as an attribute: ``flags.max_batch_size``.
    """

    values: Mapping[str, Any]

    @classmethod
    def from_dict(cls, data: Any, where: str = "server.reference") -> ReferenceServerFlags:
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        kinds = reference_settings.setting_types()
        _check_keys(data, list(kinds), where)
        _require(data, "policy", where)
        values: dict[str, Any] = {}
        for key in kinds:
            if data.get(key) is None:
                continue
            kind = kinds[key]
            if kind is int:
                values[key] = _get_int(data, key, where, None, 1)
            elif kind is float:
                values[key] = _get_float(data, key, where, None, 0.0, False)
            elif kind is dict:
                if not isinstance(data[key], Mapping):
                    raise ServerSettingsError(f"{where}.{key}: expected a mapping")
                values[key] = dict(data[key])
            else:  # str, Path
                values[key] = _get_str(data, key, where, None)
        return cls(values)

    def __getattr__(self, name: str) -> Any:
        if name in reference_settings.setting_types():
            return self.values.get(name)
        raise AttributeError(name)

    def argv(self) -> list[str]:
        """The flags, in the server's own names (`reference.settings.to_argv`)."""
        return reference_settings.to_argv(self.values)


@dataclass(frozen=True)
class SglangServerSettings:
    """How to run `sglang serve` (SGLang lives in its own environment on GPU machines).

    `command` is the SGLang entry point: the console script (`/opt/sglang-env/bin/sglang`) or
    `["python", "-c", "from sglang.cli.main import main; main()"]`. Note that
    `python -m sglang.cli.main` does NOT work: that module has no `__main__` guard.
    """

    SECTION: ClassVar[tuple[str, ...]] = ("server", "sglang")

    model_path: str
    command: list[str]
    num_gpus: int
    tp_size: int
    # SGLang's own default is 1 (no batching); the schema's default is 8.
    batching_max_size: int
    # --batching-delay-ms: how long a batch that is not full waits for more requests;
    # None keeps SGLang's default (0: it starts with whatever has arrived)
    batching_delay_ms: float | None
    pipeline_class_name: str
    attention_backend: str | None
    performance_mode: str | None  # --performance-mode; None keeps SGLang's (auto)
    gpu_memory_cap_gib: float | None  # SGLANG_MEMORY_CAP_VARIABLE; None = no cap
    # SGLang pipeline-config fields, passed as a JSON file (command.pipeline_config_file)
    pipeline_config: dict[str, Any]
    extra_args: list[str]
    # serve-only (not config fields): --master-port / --scheduler-port; None: a free port
    # each at launch (command.resolve_port)
    master_port: int | None = None
    scheduler_port: int | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "server.sglang") -> SglangServerSettings:
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        _check_keys(data, [f.name for f in fields(cls)], where)
        _require(data, "model_path", where)
        command = _get_str_list(data, "command", where, _default(cls, "command"))
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
        extra_args = _get_str_list(data, "extra_args", where, _default(cls, "extra_args"))
        for arg in extra_args:
            flag = arg.split("=", 1)[0]
            if flag in ("--pipeline-config-path", "--pipeline-config"):
                raise ServerSettingsError(
                    f"{where}.extra_args: {arg!r}: write the pipeline config's fields in "
                    f"{where}.pipeline_config instead (the launcher passes them as "
                    "--pipeline-config-path)"
                )
            if flag in SGLANG_MANAGED_FLAGS:
                raise ServerSettingsError(
                    f"{where}.extra_args: {arg!r} is set by the launcher from the settings "
                    "fields (host/port/model_path/...); set that field instead"
                )
        pipeline_config = data.get("pipeline_config", _default(cls, "pipeline_config"))
        if not isinstance(pipeline_config, Mapping) or not all(
            isinstance(key, str) for key in pipeline_config
        ):
            raise ServerSettingsError(
                f"{where}.pipeline_config: expected a mapping of SGLang pipeline-config field "
                f"names to values, e.g. {{action_cuda_graph_max_entries: 32}}, got "
                f"{pipeline_config!r}"
            )
        try:
            json.dumps(dict(pipeline_config))
        except (TypeError, ValueError) as exc:
            raise ServerSettingsError(
                f"{where}.pipeline_config: its values must be JSON (numbers, strings, lists, "
                f"mappings): {exc}"
            ) from exc
        num_gpus = _get_int(data, "num_gpus", where, _default(cls, "num_gpus"), 1)
        tp_size = _get_int(data, "tp_size", where, _default(cls, "tp_size"), 1)
        performance_mode = _get_str(
            data, "performance_mode", where, _default(cls, "performance_mode")
        )
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
            batching_max_size=_get_int(
                data, "batching_max_size", where, _default(cls, "batching_max_size"), 1
            ),
            batching_delay_ms=_get_float(
                data, "batching_delay_ms", where, _default(cls, "batching_delay_ms"), 0.0, False
            ),
            pipeline_class_name=_get_str(
                data, "pipeline_class_name", where, _default(cls, "pipeline_class_name")
            ),
            attention_backend=_get_str(
                data, "attention_backend", where, _default(cls, "attention_backend")
            ),
            performance_mode=performance_mode,
            gpu_memory_cap_gib=_get_float(
                data, "gpu_memory_cap_gib", where, _default(cls, "gpu_memory_cap_gib"), 0.0, True
            ),
            pipeline_config=dict(pipeline_config),
            extra_args=extra_args,
            master_port=_get_port(data, "master_port", where),
            scheduler_port=_get_port(data, "scheduler_port", where),
        )


def _get_port(data: Mapping[str, Any], key: str, where: str) -> int | None:
    port = _get_int(data, key, where, None, 1)
    if port is not None and port > 65535:
        raise ServerSettingsError(f"{where}.{key}: must be <= 65535, got {port}")
    return port


@dataclass(frozen=True)
class OpenpiServerSettings:
    """How to run openpi's websocket policy server (openpi's own environment and checkout).

    `command` is the full command line, e.g. `["uv", "run", "scripts/serve_policy.py", "--env",
    "LIBERO"]` run in the openpi checkout `cwd`. The launcher passes the port: every `{port}`
    in the command is replaced by it, or, when none is there, `--port <port>` is appended
    (put it before a tyro subcommand such as `policy:checkpoint` with `{port}`). openpi's
    server always listens on 0.0.0.0 and answers `GET /healthz` once the policy is loaded.
    """

    SECTION: ClassVar[tuple[str, ...]] = ("server", "openpi")

    command: list[str]
    cwd: str | None
    health_path: str

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
        health_path = _get_str(data, "health_path", where, _default(cls, "health_path"))
        if not health_path.startswith("/"):
            raise ServerSettingsError(
                f"{where}.health_path: must start with '/', got {health_path!r}"
            )
        cwd = _get_str(data, "cwd", where, _default(cls, "cwd"))
        return cls(command=command, cwd=cwd, health_path=health_path)


@dataclass(frozen=True)
class FamilyServerSettings:
    """The policy family's own server (backend `family`), as its package gives it
    (`Family.server`, composed by the config): its command line, in which `{python}`, `{host}`
    and `{port}` are replaced at launch, and its readiness path."""

    command: list[str]
    health_path: str

    @classmethod
    def from_dict(cls, data: Any, where: str = "server.family") -> FamilyServerSettings:
        if not isinstance(data, Mapping):
            raise ServerSettingsError(
                f"{where}: expected a mapping, got {data!r}; server.backend family needs a "
                "policy.family whose package gives its own server (Family.server)"
            )
        _check_keys(data, [f.name for f in fields(cls)], where)
        _require(data, "command", where)
        _require(data, "health_path", where)
        command = _get_str_list(data, "command", where, [])
        if not command or not command[0]:
            raise ServerSettingsError(f"{where}.command: must name the server's executable")
        health_path = _get_str(data, "health_path", where, None)
        if not health_path.startswith("/"):
            raise ServerSettingsError(
                f"{where}.health_path: must start with '/', got {health_path!r}"
            )
        return cls(command=command, health_path=health_path)


@dataclass(frozen=True)
class ServerSettings:
    """One server slot: which backend, where it listens, how long to wait, how to pin GPUs.

    port 0 picks a free port at launch. gpu_id pins CUDA_VISIBLE_DEVICES (an index or a list of
    indices); None keeps the environment's value (e.g. set by SLURM).
    """

    SECTION: ClassVar[tuple[str, ...]] = ("server",)

    backend: str
    slot: int  # serve-only fields below have defaults; the config's fields come from it
    host: str
    port: int
    health_timeout_s: float
    teardown_grace_s: float
    cpu_threads: int | None  # None: command.server_threads picks
    health_poll_s: float = 1.0
    gpu_id: int | tuple[int, ...] | None = None  # server.gpu_ids resolved for the slot
    extra_env: dict[str, str] = field(default_factory=dict)
    reference: ReferenceServerFlags | None = None
    sglang: SglangServerSettings | None = None
    openpi: OpenpiServerSettings | None = None
    family: FamilyServerSettings | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "server") -> ServerSettings:
        """Parse and validate a settings mapping (the `server` section of a run config, for
        one slot): first each field it shares with the config against the schema's `server`
        subschema (jsonschema's message, naming the field), then what the schema cannot say."""
        if not isinstance(data, Mapping):
            raise ServerSettingsError(f"{where}: expected a mapping, got {data!r}")
        errors = settings_schema.shared_errors(dict(data), "server", where=where)
        if errors:
            raise ServerSettingsError("; ".join(errors))
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
        extra_env = data.get("extra_env", _default(cls, "extra_env"))
        if not isinstance(extra_env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
            for k, v in extra_env.items()
        ):
            raise ServerSettingsError(
                f"{where}.extra_env: expected a mapping of variable name to string, "
                f"got {extra_env!r}"
            )
        reference = sglang = openpi = family = None
        if backend == "family":
            family = FamilyServerSettings.from_dict(data.get("family"), f"{where}.family")
        elif backend == "reference":
            _require(data, "reference", where)
            reference = ReferenceServerFlags.from_dict(data["reference"], f"{where}.reference")
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
        port = _get_int(data, "port", where, _default(cls, "port"), 0)
        if port > 65535:
            raise ServerSettingsError(f"{where}.port: must be <= 65535 (or 0), got {port}")
        return cls(
            backend=backend,
            slot=_get_int(data, "slot", where, None, 0),
            host=_get_str(data, "host", where, _default(cls, "host")),
            port=port,
            health_timeout_s=_get_float(
                data, "health_timeout_s", where, _default(cls, "health_timeout_s"), 0.0, True
            ),
            health_poll_s=_get_float(
                data, "health_poll_s", where, _default(cls, "health_poll_s"), 0.0, True
            ),
            teardown_grace_s=_get_float(
                data, "teardown_grace_s", where, _default(cls, "teardown_grace_s"), 0.0, False
            ),
            cpu_threads=_get_int(data, "cpu_threads", where, _default(cls, "cpu_threads"), 1),
            gpu_id=gpu_id,
            extra_env={k: str(v) for k, v in extra_env.items()},
            reference=reference,
            sglang=sglang,
            openpi=openpi,
            family=family,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready mapping that :meth:`from_dict` reads back to these settings: what the
        workflow composes once and the serve job reads (``--settings``)."""
        data = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        data["reference"] = dict(self.reference.values) if self.reference is not None else None
        return data

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict())

    @property
    def health_path(self) -> str:
        """Readiness path: openpi's `/healthz`, a family server's own, SGLang's and the
        reference server's `/health`."""
        if self.family is not None:
            return self.family.health_path
        return self.openpi.health_path if self.openpi is not None else "/health"

    @property
    def url(self) -> str:
        """Base URL clients use (wildcard listen addresses are reached through loopback)."""
        return f"http://{_url_host(self.host)}:{self.port}"


def _plain(value: Any) -> Any:
    """A settings value as JSON has it: dataclasses as mappings, tuples as lists."""
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
