"""The schema marks the outcome-neutral fields (`x-fingerprint: false`), and the rollout
fingerprint leaves out exactly those: a marked field moves no run's episode store, an unmarked
one does."""

import copy
from pathlib import Path

import pytest
import yaml

from libero_eval import config as config_module
from libero_eval import settings_schema
from libero_eval.config import validate_config

REPO = Path(__file__).resolve().parents[1]

# A valid value other than config/config.yaml's for each marked field (a new mark needs one).
OTHER_VALUES = {
    "envs_per_shard": 5,
    "total_num_envs": 4,
    "shards_per_slot": 2,
    "max_inflight_requests": 3,
    "merged_dispatch": "as_ready",
    "batch_timeout_s": 0.25,
    "reset_mode": "hard",
    "render_mode": "every_step",
    "mem_mb_per_env": 4000,
    "runtime_min": 30,
    "env_niceness": 0,
    "videos": {"enabled": True, "frame_stride": 2},
    "failures": {"request_retries": 0, "episode_attempts": 1, "request_timeout_s": 5},
}


def shipped_config() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate_config(config)
    return config


def fingerprint(config: dict) -> str:
    validate_config(config)
    return config_module.RunSettings(config).fingerprint


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_the_marked_fields_are_the_ones_the_fingerprint_leaves_out(monkeypatch):
    marked = settings_schema.outcome_neutral("rollout")
    assert set(marked) == set(OTHER_VALUES)
    hashed = {}
    monkeypatch.setattr(config_module, "fingerprint", lambda data: hashed.update(data) or "x")
    config = shipped_config()
    assert config_module.RunSettings(config).fingerprint == "x"
    assert set(config["rollout"]) - set(hashed["rollout"]) == set(marked)
    # rollout is the one section the fingerprint takes whole: a mark elsewhere would do nothing
    everywhere = settings_schema.outcome_neutral()
    assert set(everywhere) == {f"rollout.{name}" for name in marked}


@pytest.mark.parametrize("name", sorted(OTHER_VALUES))
def test_a_marked_field_changes_no_fingerprint(name):
    config = shipped_config()
    before = fingerprint(copy.deepcopy(config))
    assert config["rollout"][name] != OTHER_VALUES[name]
    config["rollout"][name] = copy.deepcopy(OTHER_VALUES[name])
    assert fingerprint(config) == before


@pytest.mark.parametrize(("name", "value"), [("max_steps", 7), ("camera_size", 128)])
def test_an_unmarked_field_changes_the_fingerprint(name, value):
    config = shipped_config()
    assert name not in settings_schema.outcome_neutral("rollout")
    before = fingerprint(copy.deepcopy(config))
    assert config["rollout"][name] != value
    config["rollout"][name] = value
    assert fingerprint(config) != before


def test_the_reference_renders_the_mark():
    readme = (REPO / "config" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if "not in the fingerprint" in line]
    assert len(rows) == len(settings_schema.outcome_neutral())
