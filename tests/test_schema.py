"""Every config field is typed, defaulted and described; the reference doc is in sync."""

from pathlib import Path

import jsonschema
import pytest

from libero_eval import settings_schema
from libero_eval.config import ConfigError, validate_config
from libero_eval.policy import families
from libero_eval.schema_doc import render

REPO = Path(__file__).resolve().parents[1]
families.names()  # the config schema with every registered family's parts
SCHEMA = settings_schema.schema()


def leaves(schema, prefix=""):
    for name, spec in schema.get("properties", {}).items():
        if spec.get("type") == "object" and "properties" in spec:
            yield from leaves(spec, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", spec


def test_every_field_has_a_type_a_default_and_a_description():
    fields = list(leaves(SCHEMA))
    assert len(fields) > 50
    for field, spec in fields:
        assert "default" in spec, field
        assert str(spec.get("description", "")).strip(), field
        assert any(key in spec for key in ("type", "enum", "oneOf", "const")), field


def test_config_readme_is_generated_from_the_schema():
    assert (REPO / "config" / "README.md").read_text() == render()


def patterned(node, path=()):
    """(field path, pattern) of every `pattern` in the schema, `propertyNames` included."""
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            yield ".".join(path), node["pattern"]
        for key, value in node.items():
            step = () if key in ("properties", "additionalProperties") else (key,)
            yield from patterned(value, path + step)
    elif isinstance(node, list):
        for value in node:
            yield from patterned(value, path)


# a value each pattern takes (run ids, a WxH size, a Slurm GPU model, a suite name, a URL path,
# a server URL)
EXAMPLES = ("demo", "320x192", "h100", "libero_spatial", "/healthz", "http://127.0.0.1:30000")


def test_every_pattern_matches_the_whole_value_and_rejects_a_trailing_newline():
    """`run_id: "abc\\n"` passed (`$` matches before a final newline in Python's re.search,
    which jsonschema applies) and made results/abc<newline>/."""
    found = dict(patterned(SCHEMA))
    assert {"run_id", "compare.baseline", "compare.candidate", "slurm.gpu_model"} <= set(found)
    assert any(path.endswith("propertyNames") for path in found)  # report.published's keys
    for path, pattern in found.items():
        validator = jsonschema.Draft202012Validator({"type": "string", "pattern": pattern})
        good = [value for value in EXAMPLES if validator.is_valid(value)]
        assert good, f"{path}: no example matches {pattern!r}; add one to EXAMPLES"
        for value in good:
            for bad in (f"{value}\n", f"\n{value}", f"{value}\nx", f"{value} "):
                assert not validator.is_valid(bad), f"{path}: {bad!r} passes {pattern!r}"


def test_a_run_id_with_a_trailing_newline_is_refused_naming_the_field():
    config = {"run_id": "abc\n"}
    with pytest.raises(ConfigError, match=r"run_id: 'abc\\n' does not match"):
        validate_config(config)
