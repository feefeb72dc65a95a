"""Server settings: the `server` section of a run config for one slot, parsed and checked.

`ServerSettings.from_dict` is the one place a slot's settings are read; it checks them with the
schema alone (`libero_eval.settings_schema.load`: each field against the `server` section's
subschema, or the serve job's own field's), then the cross-field rules below, each a named
function. Every error is a `ServerSettingsError` naming the `server.<field>` and the fix. The
serve job (`libero_eval.serve.job`) builds them once from the JSON the `serve` rule passes
(`ServerSettings.to_json`), and `libero_eval.serve.command` turns them into the server's argv
and environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from libero_eval import settings_schema
from libero_eval.reference import settings as reference_settings
from libero_eval.settings_schema import Rule, field_schema

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
# The serve job's own fields (no config field has them), as JSON schemas.
PORT = {"type": ["integer", "null"], "minimum": 1, "maximum": 65535}
COMMAND = {"type": "array", "minItems": 1, "items": {"type": "string"}}
HEALTH_PATH = settings_schema.section("server", "openpi")["properties"]["health_path"]
URL_PATH = {"type": "string", "pattern": HEALTH_PATH["pattern"]}  # as server.openpi.health_path
SERVER_URL = settings_schema.section("server", "url")["properties"]["urls"]["items"]


class ServerSettingsError(ValueError):
    """The server settings are invalid; the message names the `server.<field>`."""


def reference_flags_schema() -> dict[str, Any]:
    """The schema of the `server.reference` values the serve job passes on: the section's
    subschema of each of its fields (without its default: an absent value or None leaves the
    server's own), and of the reference server's other settings (`model_name`, ...) their
    type; `policy` is required."""
    section = settings_schema.section("server", "reference")["properties"]
    by_type = {
        int: {"type": "integer", "minimum": 1},
        float: {"type": "number", "minimum": 0},
        dict: {"type": "object"},
    }
    properties = {}
    for name, kind in reference_settings.setting_types().items():
        spec = dict(section.get(name) or by_type.get(kind, {"type": "string", "minLength": 1}))
        spec.pop("default", None)
        if "type" in spec:
            kinds = [spec["type"]] if isinstance(spec["type"], str) else spec["type"]
            spec["type"] = [*dict.fromkeys([*kinds, "null"])]
        if "enum" in spec:
            spec["enum"] = [*dict.fromkeys([*spec["enum"], None])]
        properties[name] = spec
    return {
        "type": ["object", "null"],  # null: the backend is not the reference server
        "properties": properties,
        "additionalProperties": False,
        "required": ["policy"],
    }


@dataclass(frozen=True)
class ReferenceServerFlags:
    """The `server.reference` values the serve job gives `python -m libero_eval.reference.server`.

    Their names, types and flags are the fields of the server's own
    `reference.settings.ReferenceServerSettings` (checked by :func:`reference_flags_schema`,
    so a bad value fails in the serve job naming `server.reference.<field>`); an absent value
    (or None) leaves the server's default. Read one as an attribute: ``flags.max_batch_size``.
    """

    values: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        if name in reference_settings.setting_types():
            return self.values.get(name)
        raise AttributeError(name)

    def argv(self) -> list[str]:
        """The flags, in the server's own names (`reference.settings.to_argv`)."""
        return reference_settings.to_argv(self.values)


def names_a_model(settings: SglangServerSettings, where: str) -> str | None:
    """`sglang serve` needs a model: `model_path` is set (the schema allows null, for a
    config whose backend is not sglang)."""
    if settings.model_path is None:
        return (
            f"{where}.model_path: required with server.backend sglang (the directory "
            "`sglang serve --model-path` loads: the checkpoint's diffusers directory)"
        )
    return None


def runs_the_sglang_cli(settings: SglangServerSettings, where: str) -> str | None:
    """`command` runs SGLang's CLI: `python -m sglang.cli.main` exits at once (the module has
    no `__main__` guard)."""
    if settings.command[-2:] == ["-m", "sglang.cli.main"]:
        return (
            f"{where}.command: `-m sglang.cli.main` exits without doing anything (the "
            "module has no __main__ guard); use the `sglang` console script of the SGLang "
            'environment or ["python", "-c", "from sglang.cli.main import main; main()"]'
        )
    return None


def leaves_the_launchers_flags_alone(settings: SglangServerSettings, where: str) -> str | None:
    """`extra_args` sets no flag the launcher sets from a field (:data:`SGLANG_MANAGED_FLAGS`)
    nor a pipeline config file (`pipeline_config` is written to one)."""
    for arg in settings.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in ("--pipeline-config-path", "--pipeline-config"):
            return (
                f"{where}.extra_args: {arg!r}: write the pipeline config's fields in "
                f"{where}.pipeline_config instead (the launcher passes them as "
                "--pipeline-config-path)"
            )
        if flag in SGLANG_MANAGED_FLAGS:
            return (
                f"{where}.extra_args: {arg!r} is set by the launcher from the settings "
                "fields (host/port/model_path/...); set that field instead"
            )
    return None


def pipeline_config_is_json(settings: SglangServerSettings, where: str) -> str | None:
    """`pipeline_config` is written as a JSON file: its values are JSON (a YAML date is not)."""
    try:
        json.dumps(dict(settings.pipeline_config))
    except (TypeError, ValueError) as exc:
        return (
            f"{where}.pipeline_config: its values must be JSON (numbers, strings, lists, "
            f"mappings): {exc}"
        )
    return None


def tp_fits_the_gpus(settings: SglangServerSettings, where: str) -> str | None:
    """Tensor parallelism splits the model over the server's own GPUs: `tp_size` is at most
    `num_gpus`."""
    if settings.tp_size > settings.num_gpus:
        return (
            f"{where}.tp_size: {settings.tp_size} exceeds {where}.num_gpus "
            f"({settings.num_gpus}); lower tp_size or raise num_gpus"
        )
    return None


@dataclass(frozen=True)
class SglangServerSettings:
    """How to run `sglang serve` (SGLang lives in its own environment on GPU machines).

    `command` is the SGLang entry point: the console script (`/opt/sglang-env/bin/sglang`) or
    `["python", "-c", "from sglang.cli.main import main; main()"]`. Note that
    `python -m sglang.cli.main` does NOT work: that module has no `__main__` guard.
    """

    SECTION: ClassVar[tuple[str, ...]] = ("server", "sglang")
    RULES: ClassVar[tuple[Rule, ...]] = (
        names_a_model,
        runs_the_sglang_cli,
        leaves_the_launchers_flags_alone,
        pipeline_config_is_json,
        tp_fits_the_gpus,
    )

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
    master_port: int | None = field(default=None, metadata=field_schema(PORT))
    scheduler_port: int | None = field(default=None, metadata=field_schema(PORT))


def passes_no_port(settings: OpenpiServerSettings, where: str) -> str | None:
    """The launcher picks the port: `command` passes none of its own (`{port}` marks where
    the launcher puts it)."""
    command = settings.command or []
    fixed_port = [
        arg
        for i, arg in enumerate(command)
        if (arg == "--port" and command[i + 1 : i + 2] != ["{port}"])
        or (arg.startswith("--port=") and "{port}" not in arg)
    ]
    if fixed_port:
        return (
            f"{where}.command: do not pass --port yourself; the launcher picks the port "
            "(write {port} where it belongs, e.g. [..., '--port', '{port}', "
            "'policy:checkpoint', ...])"
        )
    return None


def names_openpis_command(settings: OpenpiServerSettings, where: str) -> str | None:
    """openpi's server needs its command line: `command` is set (the schema allows null, for
    a config whose backend is not openpi)."""
    if settings.command is None:
        return (
            f"{where}.command: required with server.backend openpi: openpi's server command "
            'line, e.g. ["uv", "run", "scripts/serve_policy.py", "--env", "LIBERO"]'
        )
    return None


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
    RULES: ClassVar[tuple[Rule, ...]] = (names_openpis_command, passes_no_port)

    command: list[str]
    cwd: str | None
    health_path: str


@dataclass(frozen=True)
class FamilyServerSettings:
    """The policy family's own server (backend `family`), as its package gives it
    (`Family.server`, composed by the config): its command line, in which `{python}`, `{host}`
    and `{port}` are replaced at launch, and its readiness path."""

    command: list[str] = field(metadata=field_schema(COMMAND))
    health_path: str = field(metadata=field_schema(URL_PATH))


@dataclass(frozen=True)
class UrlServerSettings:
    """A server the user already runs (backend `url`): the slot's URL and the config field that
    names it (`server.url.urls[k]`, said in every error about it), its readiness path (the
    family's endpoint's), the weights it must report (`model_id`) and how long a URL that
    nothing answers is tried (`connect_timeout_s`). The serve job checks and probes it and
    never starts or stops it (`libero_eval.serve.url_server`)."""

    SECTION: ClassVar[tuple[str, ...]] = ("server", "url")

    model_id: str | None
    connect_timeout_s: float
    # the slot's own (config_server composes them): its URL, the field it came from, and the
    # readiness path of the family's endpoint
    url: str = field(metadata=field_schema(SERVER_URL))
    source: str = field(metadata=field_schema({"type": "string", "minLength": 1}))
    health_path: str = field(metadata=field_schema(URL_PATH))


def has_its_backends_section(settings: ServerSettings, where: str) -> str | None:
    """The backend's own section is given (`server.<backend>`); the others are left out."""
    if getattr(settings, settings.backend) is None:
        if settings.backend == "family":
            return (
                f"{where}.family: required with server.backend family: a policy.family whose "
                "package gives its own server (Family.server)"
            )
        return f"{where}.{settings.backend}: required with server.backend {settings.backend}"
    return None


def pins_a_gpu_per_sglang_gpu(settings: ServerSettings, where: str) -> str | None:
    """A pinned SGLang server sees as many devices as it uses: `gpu_id` lists
    `sglang.num_gpus` of them (or is null: the environment's devices)."""
    gpu_id, sglang = settings.gpu_id, settings.sglang
    if sglang is None or gpu_id is None:
        return None
    pinned = 1 if isinstance(gpu_id, int) else len(gpu_id)
    if pinned < sglang.num_gpus:
        return (
            f"{where}.gpu_id: pins {pinned} device(s) but {where}.sglang.num_gpus is "
            f"{sglang.num_gpus}; give a list of {sglang.num_gpus} device indices"
        )
    return None


# The backends that have a section of their own (`server.<backend>`): each slot's settings
# carry only their backend's.
BACKEND_SECTIONS = ("reference", "sglang", "openpi", "family", "url")


@dataclass(frozen=True)
class ServerSettings:
    """One server slot: which backend, where it listens, how long to wait, how to pin GPUs.

    port 0 picks a free port at launch. gpu_id pins CUDA_VISIBLE_DEVICES (an index or a list of
    indices); None keeps the environment's value (e.g. set by SLURM).
    """

    SECTION: ClassVar[tuple[str, ...]] = ("server",)
    RULES: ClassVar[tuple[Rule, ...]] = (has_its_backends_section, pins_a_gpu_per_sglang_gpu)

    backend: str
    # the serve job's own fields (metadata: their schema); the config's come from it
    slot: int = field(metadata=field_schema({"type": "integer", "minimum": 0}))
    host: str
    port: int
    health_timeout_s: float
    teardown_grace_s: float
    cpu_threads: int | None  # None: command.server_threads picks
    health_poll_s: float = field(
        default=1.0, metadata=field_schema({"type": "number", "exclusiveMinimum": 0})
    )
    # server.gpu_ids resolved for the slot: a device index, a list of them, or None
    gpu_id: int | tuple[int, ...] | None = field(
        default=None,
        metadata=field_schema(
            {
                "type": ["integer", "array", "null"],
                "minimum": 0,
                "minItems": 1,
                "items": {"type": "integer", "minimum": 0},
            }
        ),
    )
    extra_env: dict[str, str] = field(
        default_factory=dict,
        metadata=field_schema({"type": "object", "additionalProperties": {"type": "string"}}),
    )
    reference: ReferenceServerFlags | None = field(
        default=None, metadata=field_schema(reference_flags_schema, ReferenceServerFlags)
    )
    sglang: SglangServerSettings | None = None
    openpi: OpenpiServerSettings | None = None
    family: FamilyServerSettings | None = None
    url: UrlServerSettings | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "server") -> ServerSettings:
        """Parse and check a settings mapping (the `server` section of a run config, for one
        slot, with the serve job's own fields): each field against its subschema (the
        schema's words, naming the field), then the rules the schema cannot say. Only the
        backend's own section is read; another backend's is left out."""
        if isinstance(data, Mapping):
            backend = data.get("backend")
            data = {**data, **{name: None for name in BACKEND_SECTIONS if name != backend}}
        return settings_schema.load(cls, data, where=where, error=ServerSettingsError)

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
        """Readiness path: openpi's `/healthz`, a family server's own, a URL server's family
        endpoint's, SGLang's and the reference server's `/health`."""
        if self.url is not None:
            return self.url.health_path
        if self.family is not None:
            return self.family.health_path
        return self.openpi.health_path if self.openpi is not None else "/health"

    @property
    def base_url(self) -> str:
        """Base URL clients use: a URL server's own, else the launched server's host and port
        (wildcard listen addresses are reached through loopback)."""
        if self.url is not None:
            return self.url.url
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
