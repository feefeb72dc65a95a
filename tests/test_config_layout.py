"""Config layout: every family's settings under ``policy.<family>``; the layout before issue 21
(Cosmos3 fields directly under ``policy``) still works, with a warning, and the same fingerprint."""

import copy
from pathlib import Path

import pytest
import yaml

from libero_eval import config as settings
from libero_eval import config_layout
from libero_eval.config import validate_config

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "config" / "libero_spatial_cosmos3_sglang.yaml"


def old_layout(config: dict) -> dict:
    """The config as written before issue 21: Cosmos3 fields directly under ``policy``."""
    config = copy.deepcopy(config)
    policy = config["policy"]
    policy.update(policy.pop("cosmos3"))
    return config


def fingerprint(config: dict) -> str:
    settings.check_family_fields(config)
    validate_config(config)
    return settings.RunSettings(config).fingerprint


def test_an_old_layout_cosmos3_config_validates_warns_and_keeps_its_fingerprint(monkeypatch):
    monkeypatch.chdir(REPO)
    new = yaml.safe_load(SEED.read_text())
    old = old_layout(new)
    assert "num_frames" in old["policy"] and "cosmos3" not in old["policy"]
    with pytest.warns(settings.ConfigDeprecationWarning) as caught:
        old_fingerprint = fingerprint(old)
    message = str(caught[0].message)
    assert "policy.num_frames" in message and "policy.cosmos3.num_frames" in message
    assert "policy.action_stats_path" in message
    assert "policy.cosmos3.action_stats_path" in message
    assert old["policy"]["cosmos3"]["num_inference_steps"] == 30
    assert "num_frames" not in old["policy"]
    assert old_fingerprint == fingerprint(new)


def test_a_new_layout_config_gives_no_warning(monkeypatch, recwarn):
    monkeypatch.chdir(REPO)
    fingerprint(yaml.safe_load(SEED.read_text()))
    assert not [w for w in recwarn if issubclass(w.category, settings.ConfigDeprecationWarning)]


def test_an_old_key_overrides_its_new_twin_from_a_stacked_config(monkeypatch):
    monkeypatch.chdir(REPO)
    config = yaml.safe_load(SEED.read_text())
    config["policy"]["num_inference_steps"] = 12  # an overlay written for the old layout
    with pytest.warns(settings.ConfigDeprecationWarning, match="policy.num_inference_steps"):
        settings.check_family_fields(config)
    assert config["policy"]["cosmos3"]["num_inference_steps"] == 12


def test_an_old_layout_cosmos3_field_is_still_refused_under_pi05():
    config = {"policy": {"family": "pi05", "num_frames": 17}}
    with pytest.raises(settings.ConfigError, match=r"policy\.num_frames: Cosmos3 setting"):
        settings.check_family_fields(config)


def test_a_cosmos3_section_is_refused_under_pi05():
    config = {"policy": {"family": "pi05", "cosmos3": {"num_frames": 17}}}
    with pytest.raises(settings.ConfigError, match=r"policy\.cosmos3: Cosmos3 settings"):
        settings.check_family_fields(config)


def test_every_shipped_config_uses_the_new_layout():
    fields = set(config_layout.family_fields("cosmos3"))
    for path in (REPO / "config").glob("*.yaml"):
        if path.name == "schema.yaml":
            continue
        policy = (yaml.safe_load(path.read_text()) or {}).get("policy") or {}
        assert not fields & set(policy), f"{path.name}: Cosmos3 fields outside policy.cosmos3"


def test_nothing_under_rollout_imports_the_config_layer():
    """The rollout job is composed above `libero_eval.config` (RunSettings.rollout_job) and
    handed down: no rollout module reaches the config layer."""
    from test_layout import imports, reachable

    graph = imports()
    rollout = [m for m in graph if m.startswith("libero_eval.rollout")]
    assert rollout
    reached = set().union(*(reachable(graph, m) | graph[m] for m in rollout))
    assert "libero_eval.config" not in reached


def test_the_workflow_reads_an_old_layout_overlay_and_prints_the_deprecation(tmp_path):
    from test_cosmos3_config import dry_run, overlay

    old = overlay(tmp_path, policy={"family": "cosmos3", "num_inference_steps": 30})
    result = dry_run(tmp_path, REPO / "config" / "config.yaml", old)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "Config warning: policy.num_inference_steps: deprecated layout" in out
    assert "policy.cosmos3.num_inference_steps" in out
