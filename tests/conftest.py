"""Fixtures shared by the test files."""

from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def default_config(monkeypatch) -> dict:
    """config/config.yaml with every default filled in by the schema, as the workflow sees it
    (relative paths resolve from the repository root)."""
    monkeypatch.chdir(REPO)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate(config, str(REPO / "config" / "schema.yaml"))
    return config
