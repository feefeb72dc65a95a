"""Each settings field is defined in one place: the schema owns the config's names and defaults
(`libero_eval.settings_schema` reads it), `ReferenceServerSettings` owns the reference server's
fields, and everything else derives from those, so no field list is written twice."""

import ast
import copy
from dataclasses import fields
from pathlib import Path

import pytest

from libero_eval import settings_schema
from libero_eval.reference import server as reference_server
from libero_eval.reference import settings as reference_settings
from libero_eval.serve.settings import ReferenceServerFlags, ServerSettings

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "libero_eval"
# Config sections whose defaults only the schema writes.
SCHEMA_OWNED = [("policy", "cosmos3"), ("policy", "pi05"), ("report",), ("rollout",)]
MIN_FIELDS = 3  # a literal naming this many of a section's fields is a second list of them


def sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


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


@pytest.mark.parametrize("path", SCHEMA_OWNED, ids=".".join)
def test_no_module_writes_a_schema_sections_defaults_again(path):
    defaults = settings_schema.defaults(*path)
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
        "    policy: str\n    normalization: str | None = None\n    max_batch_size: int = 8\n"
    )
    assert listed_fields(flags, reference_fields())
    copied = "def f(reference):\n    return {'policy': reference['policy'], " + ", ".join(
        f"'{k}': reference['{k}']" for k in ("normalization", "max_batch_size")
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
    # every server.reference field the schema has is a field of the server's settings
    assert set(settings_schema.fields("server", "reference")) <= names


def test_every_reference_setting_reaches_the_server_unchanged():
    """Config JSON → serve job → argv → the server's parser → ReferenceServerSettings."""
    values = {
        "policy": "scripted",
        "action_stats_path": Path("libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"),
        "policy_kwargs": {"speed": 0.5},
        "normalization": "quantile",
        "max_batch_size": 3,
        "padded_action_dim": 32,
        "latency_fixed_s": 0.25,
        "latency_per_item_s": 0.125,
        "model_name": "reference-x",
        "family": "pi05",
        "norm_stats_path": Path("libero_eval:stats/pi05_libero_norm_stats.json"),
    }
    assert set(values) == reference_fields()  # a new field must be added here too
    as_json = {k: str(v) if isinstance(v, Path) else copy.deepcopy(v) for k, v in values.items()}
    serve = ServerSettings.from_dict({"backend": "reference", "slot": 0, "reference": as_json})
    parsed = reference_server.build_parser().parse_args(serve.reference.argv())
    server = reference_server.settings_from_args(parsed)
    assert {name: getattr(server, name) for name in values} == values


def test_the_adapters_take_their_fields_and_defaults_from_the_schema():
    from libero_eval.policy.adapters import cosmos3, pi05

    assert settings_schema.defaults("policy", "pi05") == pi05.DEFAULTS
    assert settings_schema.fields("policy", "cosmos3") == cosmos3.POLICY_FIELDS


def test_the_schemas_allowed_values_are_the_ones_the_code_implements():
    """The adapters take each field's allowed values from the schema's enum; the action math
    they dispatch to must implement exactly those."""
    from libero_eval.policy import actions
    from libero_eval.policy.adapters import cosmos3, pi05

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
    from snakemake.utils import validate

    from libero_eval.config import RunSettings, check_family_fields

    repo = PACKAGE.parents[1]
    monkeypatch.chdir(repo)
    config = yaml.safe_load((repo / "config" / name).read_text())
    check_family_fields(config)
    validate(config, str(repo / "src" / "libero_eval" / "data" / "schema.yaml"))
    run = RunSettings(config)
    for slot in range(config["server"]["num_slots"]):
        settings = run.server(slot)
        assert isinstance(settings, ServerSettings)
        assert ServerSettings.from_dict(json.loads(settings.to_json())) == settings
