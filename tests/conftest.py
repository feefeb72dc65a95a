"""Fixtures and builders shared by the test files."""

import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_side import SglangSide, start_or_skip

from libero_eval.config import validate_config

REPO = Path(__file__).resolve().parents[1]
# The marks of the slow tests (real LIBERO, Snakemake runs, the real `sglang serve`)
SLOW_MARKS = ("libero", "workflow", "sglang_serve")
# A test's user property (`record_property`) whose values are lines printed at the end of the
# run, under -q and from pytest-xdist's workers alike (tests/test_fault_tolerance.py's figures)
SUMMARY_LINE = "summary_line"
_summary_lines: list[str] = []
# the π0.5 layout specimens (`random_checkpoint.pi05_layouts`) are test material in tools/, not
# in the package
sys.path.insert(0, str(REPO / "tools"))
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, in their order: under `-n 2` both workers start on them and the
    fast tests fill in at the end, rather than one slow test running alone last."""
    items.sort(key=lambda item: not any(item.get_closest_marker(mark) for mark in SLOW_MARKS))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        lines = [value for name, value in report.user_properties if name == SUMMARY_LINE]
        _summary_lines.extend(lines)


def pytest_terminal_summary(terminalreporter) -> None:
    if _summary_lines:
        terminalreporter.write_line("")
        for line in _summary_lines:
            terminalreporter.write_line(line)


def workflow_dir(path: Path) -> Path:
    """A private working directory for Snakemake: the workflow's files linked in, so that its
    results/, logs/ and .snakemake/ (metadata, locks) are the test's, never the checkout's."""
    path.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        (path / name).symlink_to(REPO / name)
    return path


# One finished episode's result row, as the episode store holds it (every RESULT_SCHEMA column).
EPISODE_RECORD: dict[str, Any] = {
    "run_id": "test",
    "suite": "libero_spatial",
    "base_suite": "libero_spatial",
    "task_id": 0,
    "task_language": "task 0",
    "init_state_id": 0,
    "seed": 1140,
    "reset_seeding": "episode",
    "episode_seed": 12345,
    "protocol": "rlinf",
    "success_once": True,
    "success_at_end": True,
    "first_success_step": 100,
    "steps": 480,
    "policy_calls": 30,
    "policy_latency_mean_s": 0.1,
    "policy_latency_p50_s": 0.1,
    "policy_latency_p95_s": 0.2,
    "wall_time_s": 12.0,
    "server_slot": 0,
    "server_url": "http://127.0.0.1:1",
    "shard": "shard000",
    "finished_at": 0.0,
    "video_path": None,
    "error": None,
}


@cache
def pi05_checkpoint(lineage: str, **layout: Any) -> Path:
    """A π0.5 checkpoint directory laid out as its lineage's real one is (config files,
    statistics and tokenizer stand-ins; no weights), written once per test session.
    ``layout``: e.g. ``chunk_size`` / ``action_horizon``, LeRobot's ``normalization``."""
    from random_checkpoint import pi05_layouts

    root = Path(tempfile.mkdtemp(prefix=f"pi05_{lineage}_"))
    write = {"lerobot": pi05_layouts.write_lerobot, "openpi": pi05_layouts.write_openpi}[lineage]
    return pi05_layouts.write_tokenizer_standins(write(root / "checkpoint", **layout))


def make_record(**fields: Any) -> dict[str, Any]:
    """A complete result row: EPISODE_RECORD with `fields` replaced."""
    unknown = fields.keys() - EPISODE_RECORD.keys()
    assert not unknown, f"not result columns: {sorted(unknown)}"
    return {**EPISODE_RECORD, **fields}


@pytest.fixture
def default_config(monkeypatch) -> dict:
    """config/config.yaml with every default filled in by the schema, as the workflow sees it
    (relative paths resolve from the repository root)."""
    monkeypatch.chdir(REPO)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate_config(config)
    return config


@pytest.fixture(scope="session")
def sglang_side() -> SglangSide:
    """SGLang 0.5.23's own code in its side environment (skips when it is not installed)."""
    side = start_or_skip()
    yield side
    side.close()
