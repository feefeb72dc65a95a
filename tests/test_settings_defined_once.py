"""Each settings field is defined in one place: the schema owns the config's names and defaults
(`libero_eval.settings_schema` reads it), `ReferenceServerSettings` owns the reference server's
fields, and everything else derives from those, so no field list or default is written twice.

Every section of the schema is covered: no module writes a config field's default again (as a
dataclass field's or a function parameter's default, in a ``.get(key, default)`` call, a dict
literal or a command-line flag's default) nor a field's choices (a flag's), the command line's
flags that stand for config fields take the schema's defaults, and the job-side settings
dataclasses are projections of the schema (their config fields have no default of their own).
A default that must stay is listed in :data:`JUSTIFIED`, with its reason; an entry that no
longer matches anything fails."""

import argparse
import ast
import copy
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from libero_eval import settings_schema
from libero_eval.policy import families
from libero_eval.reference import server as reference_server
from libero_eval.reference import settings as reference_settings
from libero_eval.serve.settings import ReferenceServerFlags, ServerSettings

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "libero_eval"
SCRIPTS = PACKAGE.parents[1] / "workflow" / "scripts"


def schema_sections(node: dict | None = None, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every config object of the schema that has fields, the top level first."""
    node = settings_schema.schema() if node is None else node
    found = [path]
    for name, spec in node.get("properties", {}).items():
        if "properties" in spec:
            found += schema_sections(spec, (*path, name))
    return found


# Every section of the schema (the top level is ``()``), every registered family's parts in it:
# what the scans below cover.
families.names()
SECTIONS = schema_sections()
MIN_FIELDS = 3  # a literal naming this many of a section's fields is a second list of them
# Code names of config fields: a parameter named so stands for the field (and must not repeat
# its default).
ALIASES: dict[str, str | tuple[str, ...]] = {
    "confidence": "report.confidence_level",
    "alpha": "report.published_alpha",
    "n_resamples": "compare.bootstrap_resamples",
    "resamples": "compare.bootstrap_resamples",  # libero-eval compare --resamples
    "per_task": "report.videos_per_task",
    "timeout_s": ("rollout.failures.request_timeout_s", "server.health_timeout_s"),
    "max_retries": "rollout.failures.request_retries",
}


def sources() -> dict[str, str]:
    """The package's modules and the workflow's scripts, by path (``scripts/`` for these)."""
    found = {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}
    found |= {f"scripts/{p.name}": p.read_text() for p in SCRIPTS.glob("*.py")}
    return found


def _constant(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return _NOT_A_CONSTANT


_NOT_A_CONSTANT = object()


def written_defaults(source: str, defaults: dict) -> list[set[str]]:
    """Places in ``source`` that pair a section's field names with their schema defaults: a
    dict literal ``{"field": default, ...}``, or a run of ``x.get("field", default)`` calls
    in one function. Non-null defaults only (None is every lookup's default)."""
    found: list[set[str]] = []
    real = {k: v for k, v in defaults.items() if v is not None}

    def matches(key: ast.AST, value: ast.AST) -> str | None:
        name = _constant(key)
        if isinstance(name, str) and name in real and _constant(value) == real[name]:
            return name
        return None

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            names = {matches(k, v) for k, v in zip(node.keys, node.values, strict=True) if k}
            found.append(names - {None})
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = {
                matches(*call.args)
                for call in ast.walk(node)
                if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("get", "setdefault")
                and len(call.args) == 2
            }
            found.append(names - {None})
    return [names for names in found if len(names) >= MIN_FIELDS]


def listed_fields(source: str, names: set[str], owner: str | None = None) -> list[set[str]]:
    """Places in ``source`` that list these field names themselves: a class's annotated
    attributes (other than ``owner``'s), a call's keyword arguments, a dict literal that copies
    them one by one (``{"field": section["field"], ...}``)."""
    found: list[set[str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name != owner:
            found.append(
                {
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
            )
        elif isinstance(node, ast.Call):
            found.append({kw.arg for kw in node.keywords if kw.arg})
        elif isinstance(node, ast.Dict):
            found.append(
                {
                    key
                    for key, value in zip(map(_constant, node.keys), node.values, strict=True)
                    if isinstance(key, str)
                    and isinstance(value, ast.Subscript)
                    and _constant(value.slice) == key
                }
            )
    return [hit & names for hit in found if len(hit & names) >= MIN_FIELDS]


@pytest.mark.parametrize("path", SECTIONS, ids=lambda path: ".".join(path) or "top")
def test_no_module_writes_a_schema_sections_defaults_again(path):
    section = settings_schema.section(*path)["properties"]
    # its fields (a subsection's `{}` is no value of its own: the subsection is checked itself)
    defaults = {
        k: v for k, v in settings_schema.defaults(*path).items() if "properties" not in section[k]
    }
    copies = {
        module: hits
        for module, source in sources().items()
        if (hits := written_defaults(source, defaults))
    }
    assert copies == {}, f"defaults of {'.'.join(path)} written again: {copies}"


def test_the_scans_catch_the_layouts_they_replaced():
    """The checks above and below fail on the code issue 21 removed (so they can fail)."""
    pi05_defaults = "DEFAULTS = {'api': 'sglang_http', 'replan_steps': 5, 'image_size': 224}"
    assert written_defaults(pi05_defaults, settings_schema.defaults("policy", "pi05"))
    report_defaults = (
        "def f(report):\n"
        "    a = report.get('confidence_level', 0.95)\n"
        "    b = report.get('decimals', 1)\n"
        "    c = report.get('published_alpha', 0.05)\n"
    )
    assert written_defaults(report_defaults, settings_schema.defaults("report"))
    flags = (
        "class ReferenceServerFlags:\n"
        "    policy: str\n    latency_fixed_s: float | None = None\n    max_batch_size: int = 8\n"
    )
    assert listed_fields(flags, reference_fields())
    copied = "def f(reference):\n    return {'policy': reference['policy'], " + ", ".join(
        f"'{k}': reference['{k}']" for k in ("latency_fixed_s", "max_batch_size")
    )
    assert listed_fields(copied + "}\n", reference_fields())


def reference_fields() -> set[str]:
    return {f.name for f in fields(reference_settings.ReferenceServerSettings)}


def test_the_reference_servers_fields_are_listed_only_by_its_settings_class():
    names = reference_fields()
    lists = {
        module: hits
        for module, source in sources().items()
        if (hits := listed_fields(source, names, owner="ReferenceServerSettings"))
    }
    assert lists == {}, f"reference server fields listed again: {lists}"
    # the serve side's flags hold values, not a field list of their own
    assert [f.name for f in fields(ReferenceServerFlags)] == ["values"]
    # every server.reference field the schema has is a field of the server's settings, or of
    # the settings of the family that added it (its part of the server)
    assert set(settings_schema.reference_fields()) <= names
    for name in families.names():
        own = settings_schema.family_reference_fields(name)
        part = families.get(name).reference
        if part is not None:
            settings = families.reference_server(name).Settings
            assert set(own) == {f.name for f in fields(settings)}, name


def test_every_reference_setting_reaches_the_server_unchanged():
    """Config JSON → serve job → argv → the server's parser → ReferenceServerSettings."""
    values = {
        "policy": "scripted",
        "policy_kwargs": {"speed": 0.5},
        "max_batch_size": 3,
        "latency_fixed_s": 0.25,
        "latency_per_item_s": 0.125,
        "startup_delay_s": 2.5,
        "model_name": "reference-x",
        "family": "pi05",
        "family_module": "libero_eval.policy.families.pi05",
        "family_settings": {"norm_stats_path": "libero_eval:stats/pi05_libero_norm_stats.json"},
    }
    assert set(values) == reference_fields()  # a new field must be added here too
    as_json = copy.deepcopy(values)
    serve = ServerSettings.from_dict({"backend": "reference", "slot": 0, "reference": as_json})
    parsed = reference_server.build_parser().parse_args(serve.reference.argv())
    server = reference_server.settings_from_args(parsed)
    assert {name: getattr(server, name) for name in values} == values


def test_the_adapters_take_their_fields_and_defaults_from_the_schema():
    from libero_eval.policy.families.cosmos3 import adapter as cosmos3
    from libero_eval.policy.families.pi05 import adapter as pi05

    assert settings_schema.defaults("policy", "pi05") == pi05.DEFAULTS
    assert settings_schema.fields("policy", "cosmos3") == cosmos3.POLICY_FIELDS


def test_the_schemas_allowed_values_are_the_ones_the_code_implements():
    """The adapters take each field's allowed values from the schema's enum; the action math
    they dispatch to must implement exactly those."""
    from libero_eval.policy.families.cosmos3 import actions
    from libero_eval.policy.families.cosmos3 import adapter as cosmos3
    from libero_eval.policy.families.pi05 import adapter as pi05

    assert settings_schema.choices("policy", "cosmos3") == cosmos3.CHOICES
    assert settings_schema.choices("policy", "pi05") == pi05.CHOICES
    assert set(cosmos3.CHOICES["normalization"]) == set(actions.NORMALIZATION_BLOCKS)
    assert set(cosmos3.CHOICES["gripper_mapping"]) == set(actions.GRIPPER_MAPPINGS)
    assert set(cosmos3.CHOICES["orthonormalization"]) == set(actions.ORTHONORMALIZATIONS)
    assert set(pi05.CHOICES["api"]) == set(pi05.API_ADAPTERS)


@pytest.mark.parametrize(
    "name",
    sorted(
        p.name for p in (PACKAGE.parents[1] / "config").glob("*.yaml") if p.name != "schema.yaml"
    ),
)
def test_every_slots_server_settings_cross_to_the_serve_job_unchanged(name, monkeypatch):
    """The serve boundary: the workflow composes each slot's `ServerSettings` once and hands
    the serve job its `to_json()`, which `from_dict` reads back to the same settings."""
    import json

    import yaml

    from libero_eval.config import RunSettings, check_family_fields, validate_config

    repo = PACKAGE.parents[1]
    monkeypatch.chdir(repo)
    config = yaml.safe_load((repo / "config" / name).read_text())
    check_family_fields(config)
    validate_config(config)
    run = RunSettings(config)
    for slot in range(config["server"]["num_slots"]):
        settings = run.server(slot)
        assert isinstance(settings, ServerSettings)
        assert ServerSettings.from_dict(json.loads(settings.to_json())) == settings


# --- one default per config field -------------------------------------------------------------

# Defaults written in Python that equal a config field's schema default and must stay, each
# with its reason: "<module>:<scope>.<name>" (the scope is the enclosing classes and functions).
_SGLANG_API = (
    "SGLang 0.5.23's own default for a request or metadata field, which the reference server "
    "reproduces (the client always sends the config's value)"
)
_LOOPBACK = "loopback where the caller names no host (tests, benchmarks); the serve job passes it"
JUSTIFIED: dict[str, str] = {
    "policy/http_connection.py:HttpConnection.__init__.wire_format": (
        "the HTTP wire format, msgpack unless a family's endpoint says json; the same word as "
        "policy.pi05.wire_format's default, not that field"
    ),
    "policy/endpoint.py:ConnectionSpec.wire_format": (
        "an endpoint's wire format (msgpack, the codec's native one) unless its family says "
        "otherwise; not policy.pi05.wire_format"
    ),
    "policy/families/cosmos3/__init__.py:endpoint.transport": (
        "a Cosmos3 settings mapping built without the schema (tests) talks msgpack, SGLang's "
        "own wire format"
    ),
    "policy/families/cosmos3/adapter.py:Cosmos3Adapter.family": (
        "the adapter's family name, no default"
    ),
    "analysis/errors.py:failures_by_error.metric": (
        "the failure table counts episodes that never succeeded; no config field chooses it"
    ),
    **dict.fromkeys(
        (
            "policy/families/cosmos3/reference_requests.py:parse_generation_request.action_mode",
            "policy/families/cosmos3/reference_requests.py:parse_generation_request.response_format",
        ),
        _SGLANG_API,
    ),
    "policy/families/cosmos3/reference_responses.py:action_metadata.num_gpus": _SGLANG_API,
    "policy/families/cosmos3/reference_responses.py:action_metadata.tp_size": _SGLANG_API,
    "policy/families/cosmos3/reference_responses.py:action_metadata.action_mode": _SGLANG_API,
    "policy/families/cosmos3/reference_server.py:output.action_mode": _SGLANG_API,
    "policy/families/pi05/reference.py:parse_request.response_format": _SGLANG_API,
    "policy/families/pi05/reference.py:parse_request.num_inference_steps": _SGLANG_API,
    "policy/families/pi05/reference.py:metadata.num_inference_steps": _SGLANG_API,
    "policy/families/pi05/reference.py:Pi05Model.normalization": (
        "SGLang's Pi05PipelineConfig default for a model without its own (the server's model)"
    ),
    "policy/families/pi05/reference.py:Pi05Model.image_size": (
        "SGLang's Pi05PipelineConfig default for a model without its own (the server's model)"
    ),
    "reference/server.py:serve_in_thread.host": _LOOPBACK,
    "reference/server.py:build_parser.host": _LOOPBACK,
    "serve/command.py:pick_free_port.host": _LOOPBACK,
    "serve/command.py:pick_free_ports.host": _LOOPBACK,
}


def field_defaults() -> dict[str, list[tuple[str, Any]]]:
    """Each config field's name (and its :data:`ALIASES`) -> the dotted fields of that name in
    the schema, every section, with their non-null defaults (None is every lookup's default)."""
    found: dict[str, list[tuple[str, Any]]] = {}
    for path in SECTIONS:
        for name, spec in settings_schema.section(*path)["properties"].items():
            if "properties" not in spec and spec.get("default") is not None:
                found.setdefault(name, []).append((".".join((*path, name)), spec["default"]))
    for alias, fields_of_alias in ALIASES.items():
        for dotted in (fields_of_alias,) if isinstance(fields_of_alias, str) else fields_of_alias:
            *path, name = dotted.split(".")
            found.setdefault(alias, []).append((dotted, settings_schema.default(*path, name)))
    return found


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: 600 is 600.0, a tuple is a list, True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


_EMPTY_FACTORIES = {"list": [], "dict": {}, "tuple": (), "set": set()}


def flag_dest(call: ast.Call) -> str | None:
    """The attribute an ``add_argument(...)`` call sets (its ``dest``, else its first long
    option's name with dashes as underscores, else its positional name)."""
    keywords = {k.arg: _constant(k.value) for k in call.keywords}
    if isinstance(keywords.get("dest"), str):
        return keywords["dest"]
    names = [_constant(arg) for arg in call.args]
    names = [name for name in names if isinstance(name, str)]
    long = [name for name in names if name.startswith("--")]
    chosen = long[0] if long else (names[0] if names else None)
    return chosen.lstrip("-").replace("-", "_") if chosen else None


def default_writes(source: str) -> list[tuple[str, str, Any]]:
    """Every default ``source`` writes, as (where, name, value): a dataclass field's (also
    ``field(default=...)``, ``field(default_factory=...)`` and ``_setting(...)``), a function
    parameter's, a ``.get``/``.setdefault``/``.pop(key, default)`` or ``getattr(x, key,
    default)`` call's, a dict literal's ``{key: value}`` and a command-line flag's
    (``add_argument("--name", default=...)``, named by its dest). ``where`` is
    ``<scope>.<name>``; a module-level constant's name stands for its value; values that are
    not constants are left out."""
    tree = ast.parse(source)
    constants: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = _constant(node.value) if getattr(node, "value", None) else _NOT_A_CONSTANT
        if isinstance(target, ast.Name) and value is not _NOT_A_CONSTANT:
            constants[target.id] = value

    def value_of(node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in constants:
            return constants[node.id]
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("field", "_setting"):
            keywords = {k.arg: k.value for k in node.keywords}
            if "default" in keywords:
                return value_of(keywords["default"])
            factory = keywords.get("default_factory")
            if isinstance(factory, ast.Lambda):
                return value_of(factory.body)
            if isinstance(factory, ast.Name):
                return _EMPTY_FACTORIES.get(factory.id, _NOT_A_CONSTANT)
            return value_of(node.args[0]) if node.args else _NOT_A_CONSTANT
        return _constant(node)

    found: list[tuple[str, str, Any]] = []

    def add(scope: tuple[str, ...], name: object, node: ast.AST) -> None:
        if isinstance(name, str):
            found.append((".".join((*scope, name)), name, value_of(node)))

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                inner = (*scope, getattr(child, "name", "<lambda>"))
                args = child.args
                positional = args.posonlyargs + args.args
                for arg, default in zip(
                    positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
                ):
                    add(inner, arg.arg, default)
                for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                    if default is not None:
                        add(inner, arg.arg, default)
            elif isinstance(child, ast.ClassDef):
                inner = (*scope, child.name)
                for item in child.body:
                    if isinstance(item, ast.AnnAssign) and item.value is not None:
                        add(inner, getattr(item.target, "id", None), item.value)
            elif isinstance(child, ast.Call):
                method = getattr(child.func, "attr", None)
                if method in ("get", "setdefault", "pop") and len(child.args) == 2:
                    add(scope, _constant(child.args[0]), child.args[1])
                elif getattr(child.func, "id", None) == "getattr" and len(child.args) == 3:
                    add(scope, _constant(child.args[1]), child.args[2])
                elif method == "add_argument":
                    for keyword in child.keywords:
                        if keyword.arg == "default":
                            add(scope, flag_dest(child), keyword.value)
            elif isinstance(child, ast.Dict):
                for key, value in zip(child.keys, child.values, strict=True):
                    if key is not None:
                        add(scope, _constant(key), value)
            visit(child, inner)

    visit(tree, ())
    return found


def defaults_written_again(source: str) -> dict[str, str]:
    """The defaults in ``source`` equal to the schema default of a config field of the same
    name (or alias): ``{where: "dotted.field = value"}``."""
    known = field_defaults()
    hits: dict[str, str] = {}
    for where, name, value in default_writes(source):
        if value is _NOT_A_CONSTANT or value is None:
            continue
        for dotted, default in known.get(name, ()):
            if _same(value, default):
                hits[where] = f"{dotted} = {default!r}"
    return hits


def test_no_module_writes_a_config_fields_default_again():
    """The schema writes each config field's default once; code that needs one reads it
    (`settings_schema.default`) or gets the value from the config."""
    found = {
        f"{module}:{where}": field
        for module, source in sources().items()
        for where, field in defaults_written_again(source).items()
    }
    unjustified = {where: field for where, field in found.items() if where not in JUSTIFIED}
    assert unjustified == {}, (
        f"config defaults written again (take them from the config or settings_schema, or "
        f"list them in JUSTIFIED with a reason): {unjustified}"
    )
    stale = sorted(set(JUSTIFIED) - set(found))
    assert stale == [], f"JUSTIFIED entries that match nothing any more (remove them): {stale}"


def test_the_default_scan_catches_every_way_of_writing_a_default():
    """Each form the scan looks for, fed to it: it can fail."""
    snippets = {
        "EnvSettings.camera_size": "class EnvSettings:\n    camera_size: int = 256\n",
        "Server.host": "class Server:\n    host: str = field(default='127.0.0.1')\n",
        "S.command": "class S:\n    command: list = field(default_factory=lambda: ['sglang'])\n",
        "R.policy": "class R:\n    policy: str = _setting('scripted', 'help')\n",
        "S.extra_args": "class S:\n    extra_args: list = field(default_factory=list)\n",
        "summary.decimals": "def summary(table, *, decimals=1):\n    pass\n",
        "ci.confidence": "def ci(x, confidence=0.95):\n    pass\n",
        "connect.timeout_s": "def connect(url, timeout_s=600.0, max_retries=5):\n    pass\n",
        "connect.max_retries": "def connect(url, timeout_s=600.0, max_retries=5):\n    pass\n",
        "f.batch_timeout_s": "def f(rollout):\n    return rollout.get('batch_timeout_s', 1.0)\n",
        "f.pipeline_class_name": (
            "PIPE = 'Cosmos3OmniDiffusersPipeline'\n"
            "def f(s):\n    return getattr(s, 'pipeline_class_name', PIPE)\n"
        ),
        "f.num_slots": "def f():\n    return {'num_slots': 1}\n",
        "f.enabled": "def f(videos):\n    return videos.setdefault('enabled', False)\n",
        "p.confidence": "def p(parser):\n    parser.add_argument('--confidence', default=0.95)\n",
        "wait.timeout_s": "def wait(path, timeout_s=900.0):\n    pass\n",
    }
    for where, source in snippets.items():
        assert where in defaults_written_again(source), (where, source)
    # other values, or a field's name given its value from elsewhere, are not a default
    quiet = (
        "def f(rollout, decimals=2, enabled=0):\n"
        "    camera_size = rollout['camera_size']\n"
        "    return {'decimals': decimals, 'camera_size': camera_size, 'port': None}\n"
    )
    assert defaults_written_again(quiet) == {}


# --- command-line flags that stand for config fields -------------------------------------------


def schema_enums() -> dict[str, list[Any]]:
    """Every field of the schema restricted to an ``enum``: dotted field -> its values."""
    return {
        ".".join((*path, name)): list(spec["enum"])
        for path in SECTIONS
        for name, spec in settings_schema.section(*path)["properties"].items()
        if "enum" in spec
    }


def choices_written_again(source: str) -> dict[str, str]:
    """``add_argument(..., choices=[...])`` literals that list a config field's allowed values
    (its schema ``enum``, in any order): ``{where: "dotted.field"}``."""
    enums = schema_enums()
    hits: dict[str, str] = {}

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = (*scope, child.name)
            elif (
                isinstance(child, ast.Call) and getattr(child.func, "attr", None) == "add_argument"
            ):
                for keyword in child.keywords:
                    value = _constant(keyword.value) if keyword.arg == "choices" else None
                    if isinstance(value, list | tuple):
                        same = [
                            dotted
                            for dotted, allowed in enums.items()
                            if sorted(map(str, value)) == sorted(map(str, allowed))
                        ]
                        if same:
                            hits[".".join((*scope, str(flag_dest(child))))] = " or ".join(same)
            visit(child, inner)

    visit(ast.parse(source), ())
    return hits


def test_no_flag_lists_a_config_fields_choices_again():
    """A flag that stands for a config field takes its choices from the schema
    (``settings_schema.choices``), as its default (``settings_schema.default``; the scan of
    defaults above covers flags' defaults too)."""
    found = {
        f"{module}:{where}": field
        for module, source in sources().items()
        for where, field in choices_written_again(source).items()
    }
    assert found == {}, f"a config field's choices written again in a flag: {found}"


def test_the_flag_scans_catch_the_cli_they_replaced():
    """libero-eval compare's flags as they were before issue 42: every copy is found."""
    before = (
        "def build_parser(compare):\n"
        "    compare.add_argument(\n"
        "        '--metric', choices=['success_once', 'success_at_end'], default='success_once'\n"
        "    )\n"
        "    compare.add_argument('--confidence', type=float, default=0.95)\n"
        "    compare.add_argument('--resamples', type=int, default=10_000)\n"
        "    compare.add_argument('--seed', type=int, default=0, help='bootstrap seed')\n"
        "    compare.add_argument('-n', '--n-samples', dest='n_resamples', default=10000)\n"
    )
    assert set(defaults_written_again(before)) == {
        "build_parser.metric",
        "build_parser.confidence",
        "build_parser.resamples",
        "build_parser.seed",
        "build_parser.n_resamples",
    }
    assert choices_written_again(before) == {
        "build_parser.metric": "report.published_metric or compare.metric"
    }
    # a flag read from the schema is no copy
    after = (
        "def build_parser(compare):\n"
        "    compare.add_argument('--metric', choices=settings_schema.choices('compare')"
        "['metric'], default=settings_schema.default('compare', 'metric'))\n"
    )
    assert defaults_written_again(after) == {} and choices_written_again(after) == {}


# libero-eval compare's flags that stand for config fields (the workflow's compare rule reads
# the same fields: one command line or the other gives the same comparison)
CLI_FIELDS = {
    "metric": "compare.metric",
    "confidence": "report.confidence_level",
    "resamples": "compare.bootstrap_resamples",
    "seed": "compare.seed",
    "allow_different_settings": "compare.allow_different_settings",
}


def test_the_cli_flags_take_the_schemas_defaults_choices_and_checks(capsys):
    from libero_eval.cli import build_parser

    parser = build_parser()
    args = vars(parser.parse_args(["compare", "baseline", "candidate"]))
    given = vars(parser.parse_args(["compare", "a", "b", "--confidence", "0.9", "--seed", "3"]))
    assert (given["confidence"], given["seed"]) == (0.9, 3)
    for flag, value, message in (
        ("--confidence", "1.5", "report.confidence_level: 1.5 is greater than or equal to"),
        ("--resamples", "10", "compare.bootstrap_resamples: 10 is less than the minimum of 100"),
        ("--seed", "x", "compare.seed: 'x' is not of type 'integer'"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(["compare", "a", "b", flag, value])
        assert message in capsys.readouterr().err
    for dest, dotted in CLI_FIELDS.items():
        *path, name = dotted.split(".")
        assert _same(args[dest], settings_schema.default(*path, name)), (dest, args[dest])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    metric = next(a for a in commands.choices["compare"]._actions if a.dest == "metric")
    assert list(metric.choices) == list(settings_schema.choices("compare")["metric"])
    # every flag of every command named like a config field (or an alias) has its default
    known = field_defaults()
    for command, sub in commands.choices.items():
        for action in sub._actions:
            written = known.get(action.dest)
            if written and action.default is not None:
                assert any(_same(action.default, value) for _, value in written), (
                    f"libero-eval {command} --{action.dest}: default {action.default!r}, the "
                    f"schema's {written}"
                )


# --- the job-side settings dataclasses are projections of the schema --------------------------


def _projections() -> list[tuple[type, tuple[str, ...], dict[str, str], dict[str, str]]]:
    """(dataclass, the schema section it projects, its fields from other sections as dotted
    schema fields, its fields that are no config field with why)."""
    from libero_eval.failures import FailurePolicy
    from libero_eval.rollout.libero_env import EnvSettings
    from libero_eval.rollout.shard_settings import ShardSettings
    from libero_eval.serve.settings import (
        OpenpiServerSettings,
        SglangServerSettings,
        UrlServerSettings,
    )

    job = "the job's own, set where the job is composed (libero_eval.config)"
    return [
        (
            EnvSettings,
            ("rollout",),
            {},
            {
                "video_stride": "rollout.videos.frame_stride, or 0 while videos are off",
                "render_env": "rollout.render_device resolved for the shard's slot",
            },
        ),
        (
            ShardSettings,
            ("rollout",),
            {"health_timeout_s": "server.health_timeout_s"},
            {
                **dict.fromkeys(("run_id", "shard", "slot", "env", "adapter"), job),
                "endpoint": "the family's endpoint (policy.connection)",
                "event_log": "a path of the job (its log)",
                "video_dir": "a path of the job (its videos)",
                "expected_batch": "the server's max batch as its section says (config)",
                "render_gpu_budget_mib": "the render GPU's memory less the server's (config)",
            },
        ),
        (
            ServerSettings,
            ("server",),
            {},
            {
                "slot": "the serve job's slot",
                "health_poll_s": "how often the serve job polls its server (no config field)",
                "gpu_id": "server.gpu_ids resolved for the slot (libero_eval.config)",
                "extra_env": "variables a test or benchmark adds to the server's environment",
                "family": "the family's own server (Family.server) for server.backend family",
            },
        ),
        (
            SglangServerSettings,
            ("server", "sglang"),
            {},
            {
                "master_port": "serve-only: picked free at launch unless a test pins it",
                "scheduler_port": "serve-only: picked free at launch unless a test pins it",
            },
        ),
        (OpenpiServerSettings, ("server", "openpi"), {}, {}),
        (
            UrlServerSettings,
            ("server", "url"),
            {},
            {
                "url": "server.url.urls resolved for the slot (libero_eval.config_server)",
                "source": "the config field that names the slot's URL, for its errors",
                "health_path": "the family's endpoint's readiness path",
            },
        ),
        (FailurePolicy, ("rollout", "failures"), {}, {}),
        # each family's part of the reference server: its fields of server.reference
        *(
            (families.reference_server(name).Settings, ("server", "reference"), {}, {})
            for name in families.names()
            if families.get(name).reference is not None
        ),
    ]


@pytest.mark.parametrize("projection", _projections(), ids=lambda p: p[0].__name__)
def test_a_settings_dataclass_is_a_projection_of_its_schema_section(projection):
    cls, path, elsewhere, own = projection
    section = settings_schema.section(*path)["properties"]
    names = [f.name for f in fields(cls)]
    # every field is the section's, another section's named here, or declared as the job's own
    unknown = set(names) - set(section) - set(elsewhere) - set(own)
    assert unknown == set(), f"{cls.__name__}: fields not in {'.'.join(path)}: {unknown}"
    assert set(own) <= set(names) and set(elsewhere) <= set(names), "a declared field is gone"
    assert not set(own) & set(section), f"{cls.__name__}: a declared own field is in the schema"
    for dotted in elsewhere.values():
        *other, leaf = dotted.split(".")
        assert leaf in settings_schema.section(*other)["properties"], dotted
    # a config field's value comes from the config (which the schema filled): no default here
    with_default = [
        f.name
        for f in fields(cls)
        if f.name not in own
        and "properties" not in section.get(f.name, {})  # a subsection has its own class
        and (f.default is not MISSING or f.default_factory is not MISSING)
    ]
    assert with_default == [], f"{cls.__name__}: config fields with a Python default"
    # the schema checks the values (settings_schema.load); no check of them in Python again
    assert "__post_init__" not in vars(cls), f"{cls.__name__}: checks its values again"


def test_no_module_checks_a_config_values_type_or_bounds_by_hand():
    """The schema is the one validator (`settings_schema.load`): the hand-written readers
    issue 42 removed (`serve/settings.py`'s `_get_int`, `_get_float`, ...) stay gone."""
    readers = {"_get_int", "_get_float", "_get_str", "_get_str_list", "_check_keys", "_require"}
    found = {
        f"{module}:{node.name}"
        for module, source in sources().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name in readers
    }
    assert found == set(), found


def test_the_reference_servers_defaults_are_the_schemas():
    """The reference server runs on its own too, so its settings have defaults: for the
    `server.reference` fields, the schema's (the drift of issue 26: `policy` was `hold`
    there while the schema said `scripted`); a family's own fields of it are the projection of
    their schema (test_a_settings_dataclass_is_a_projection_of_its_schema_section), built at
    the schema's defaults."""
    own = {f.name: f for f in fields(reference_settings.ReferenceServerSettings)}
    for name in settings_schema.reference_fields():
        assert name in own, f"server.reference.{name} is not a reference server setting"
        default = settings_schema.default("server", "reference", name)
        assert _same(own[name].default, default), (name, own[name].default, default)
    parsed = reference_server.build_parser().parse_args([])
    server = reference_server.settings_from_args(parsed)
    assert server.policy == settings_schema.default("server", "reference", "policy") == "scripted"
    defaults = settings_schema.defaults("server", "reference")
    family = server.family_part_settings
    assert {f.name: getattr(family, f.name) for f in fields(family)} == {
        name: defaults[name] for name in settings_schema.family_reference_fields(server.family)
    }


def test_the_projection_check_fails_on_a_field_with_a_default_or_a_stray_field():
    from dataclasses import dataclass

    @dataclass
    class WithDefault:
        camera_size: int = 256

    @dataclass
    class Stray:
        camera_size: int
        not_a_field: int

    with pytest.raises(AssertionError, match="Python default"):
        test_a_settings_dataclass_is_a_projection_of_its_schema_section(
            (WithDefault, ("rollout",), {}, {})
        )
    with pytest.raises(AssertionError, match="not_a_field"):
        test_a_settings_dataclass_is_a_projection_of_its_schema_section(
            (Stray, ("rollout",), {}, {})
        )


def test_the_guards_cover_every_section_of_the_schema():
    dotted = {".".join(path) for path in SECTIONS}
    assert {"", "plan", "server", "server.reference", "policy.pi05", "report", "slurm"} <= dotted
    assert set(dotted) >= {".".join(path) for path in settings_schema_section_paths()}


def settings_schema_section_paths() -> list[tuple[str, ...]]:
    """The schema's sections as the schema's top level lists them (a second walk, by hand)."""
    top = settings_schema.schema()["properties"]
    paths = [(name,) for name, spec in top.items() if "properties" in spec]
    for (name,) in list(paths):
        paths += [
            (name, sub) for sub, spec in top[name]["properties"].items() if "properties" in spec
        ]
    return paths
