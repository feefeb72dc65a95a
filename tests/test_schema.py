"""Every config field is typed, defaulted and described; the reference doc is in sync."""

from pathlib import Path

import yaml

from libero_eval.schema_doc import render

REPO = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((REPO / "src" / "libero_eval" / "data" / "schema.yaml").read_text())


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
    assert (REPO / "config" / "README.md").read_text() == render(
        REPO / "src" / "libero_eval" / "data" / "schema.yaml"
    )
