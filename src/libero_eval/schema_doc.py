"""Render the config schema as the Markdown config reference (config/README.md): the package's
``data/schema.yaml`` with every registered family's parts merged in (each built-in family's
``schema.yaml``, package data of its package), or the schema file named.

Usage: ``.venv/bin/python -m libero_eval.schema_doc > config/README.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from libero_eval import settings_schema
from libero_eval.policy import families

HEADER = """# Configuration reference

Generated from `src/libero_eval/data/schema.yaml` with each family's parts merged in
(`src/libero_eval/policy/families/<family>/schema.yaml`; package data: the workflow and the
package read these files) by `.venv/bin/python -m libero_eval.schema_doc > config/README.md` (a
test keeps it in sync). The workflow validates the config against the
schema, fills in the defaults, then checks what a schema cannot (files exist, the stats file
has the block the normalization needs, `num_frames == num_action_chunks + 1`, ...). Every
error names the field and the fix.

Configs: `config.yaml` is the demo (reference server, scripted expert, 2 tasks x 2 init
states), which the workflow loads only when no `--configfile` is given. A config of your own
(`.venv/bin/snakemake --cores 2 --configfile mine.yaml`) starts from the defaults below; to start
from the demo instead, name it first: `--configfile config/config.yaml mine.yaml` (one flag,
several files, merged in order). `libero_spatial_cosmos3_sglang.yaml` is the Cosmos3 seed
configuration for SGLang on GPUs.

| field | type | default | description |
|---|---|---|---|
"""


def _type(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return " \\| ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    if "oneOf" in spec:
        return " or ".join(_type(option) for option in spec["oneOf"])
    kind = spec.get("type", "")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and "items" in spec:
        kinds = [f"array of {_type(spec['items'])}" if k == "array" else k for k in kinds]
    return " or ".join(k for k in kinds if k)


# The note on a field the schema marks `x-fingerprint: false` (settings_schema.outcome_neutral).
OUTCOME_NEUTRAL_NOTE = "Outcome-neutral: not in the fingerprint."


def _description(spec: dict[str, Any]) -> str:
    text = " ".join(str(spec.get("description", "")).split())
    if spec.get("x-fingerprint") is False:
        text = f"{text} {OUTCOME_NEUTRAL_NOTE}".strip()
    return text


def rows(schema: dict[str, Any], prefix: str = "") -> list[str]:
    lines = []
    for name, spec in schema.get("properties", {}).items():
        field = f"{prefix}{name}"
        if spec.get("type") == "object" and "properties" in spec:
            description = _description(spec)
            lines.append(f"| **`{field}`** | section | | {description} |")
            lines += rows(spec, f"{field}.")
            continue
        default = json.dumps(spec.get("default")) if "default" in spec else ""
        if name in schema.get("required", ()):
            default = "required"
        description = _description(spec).replace("|", "\\|")
        default = f"`{default}`" if default != "required" else "required"
        lines.append(f"| `{field}` | {_type(spec)} | {default} | {description} |")
        entry = spec.get("additionalProperties")
        if isinstance(entry, dict) and "properties" in entry:  # a mapping of named entries
            lines += rows(entry, f"{field}.<name>.")
    return lines


def render(schema_path: Path | None = None) -> str:
    """config/README.md for the schema file ``schema_path``; None: the config schema with the
    registered families' parts (the built-in and installed ones)."""
    if schema_path is None:
        families.names()  # registered: their parts are in the schema
        schema = settings_schema.schema()
    else:
        schema = yaml.safe_load(Path(schema_path).read_text())
    return HEADER + "\n".join(rows(schema)) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
