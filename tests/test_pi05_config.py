"""The π0.5 configs: they validate, plan the right servers, and refuse the other family's fields."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import pi05_checkpoint
from test_cosmos3_config import dry_run, overlay

from libero_eval import config as settings
from libero_eval.config import validate_config

REPO = Path(__file__).resolve().parents[1]
SGLANG_CONFIG = REPO / "config" / "libero_pi05_sglang.yaml"  # LeRobot lineage
OPENPI_SGLANG_CONFIG = REPO / "config" / "libero_pi05_openpi_sglang.yaml"
OPENPI_CONFIG = REPO / "config" / "libero_pi05_openpi.yaml"
BASE = REPO / "config" / "config.yaml"


def local_checkpoint(path: Path = SGLANG_CONFIG) -> dict:
    """Stands for the user's paths overlay: the shipped config's model_path, made local (a
    directory laid out as that config's checkpoint is)."""
    if path == OPENPI_SGLANG_CONFIG:
        checkpoint = pi05_checkpoint("openpi")
    else:  # lerobot/pi05_libero_finetuned_v044: mean/std statistics
        checkpoint = pi05_checkpoint("lerobot", normalization="MEAN_STD")
    return {"server": {"sglang": {"model_path": str(checkpoint)}}}


def merged(*paths: Path, **sections) -> dict:
    """Configs merged as the workflow does (`--configfile` files in order; config.yaml, the
    demo, when there is none), before validation; the SGLang config's checkpoint is a local
    directory laid out as its lineage's."""
    config: dict = {}
    for path in paths or (BASE,):
        _deep_update(config, yaml.safe_load(path.read_text()))
        if path in (SGLANG_CONFIG, OPENPI_SGLANG_CONFIG):
            _deep_update(config, local_checkpoint(path))
    _deep_update(config, copy.deepcopy(sections))
    return config


def _deep_update(target: dict, source: dict) -> None:
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value


def checked(config: dict) -> dict:
    settings.check_family_fields(config)
    validate_config(config)
    settings.check_config(config)
    return config


@pytest.mark.parametrize(
    "path", [OPENPI_SGLANG_CONFIG, OPENPI_CONFIG], ids=["openpi-sglang", "openpi"]
)
def test_pi05_configs_validate_with_the_openpi_protocol(path):
    config = checked(merged(path))
    assert config["rollout"]["protocol"] == "openpi"
    assert settings.episode_protocol(config).seed == 7  # openpi's env.seed(7)
    assert config["policy"]["pi05"]["replan_steps"] == 5
    assert config["plan"]["suites"] == [
        "libero_spatial",
        "libero_object",
        "libero_goal",
        "libero_10",
    ]


@pytest.mark.parametrize(
    ("path", "sections", "message"),
    [
        (SGLANG_CONFIG, {"policy": {"num_frames": 17}}, r"policy\.num_frames: Cosmos3 setting"),
        (BASE, {"policy": {"pi05": {"api": "sglang_http"}}}, "policy.pi05: π0.5 settings"),
        (
            SGLANG_CONFIG,
            {"server": {"sglang": {"pipeline_class_name": "Cosmos3OmniDiffusersPipeline"}}},
            "Pi05Pipeline",
        ),
        (SGLANG_CONFIG, {"policy": {"pi05": {"api": "openpi_websocket"}}}, "sglang_websocket"),
        (OPENPI_CONFIG, {"policy": {"pi05": {"api": "sglang_http"}}}, "openpi_websocket"),
        (OPENPI_CONFIG, {"server": {"openpi": {"command": None}}}, "server.openpi.command"),
        (
            SGLANG_CONFIG,
            {"policy": {"pi05": {"norm_stats_path": "config/stats/missing.json"}}},
            r"policy\.pi05\.norm_stats_path: statistics file config/stats/missing.json",
        ),
        (
            SGLANG_CONFIG,
            {"server": {"sglang": {"model_path": "./models/pi05"}}},
            "server.sglang.model_path",
        ),
        (SGLANG_CONFIG, {"rollout": {"send_privileged_state": True}}, "send_privileged_state"),
        (
            OPENPI_SGLANG_CONFIG,
            {"server": {"sglang": {"pipeline_config": {"prompt_token_buckets": [32, 256]}}}},
            r"server\.sglang\.pipeline_config\.prompt_token_buckets: 256 exceeds the "
            r"checkpoint's max_token_len 200",
        ),
        (
            SGLANG_CONFIG,
            {"server": {"sglang": {"pipeline_config": {"prompt_token_buckets": [64, 32]}}}},
            r"prompt_token_buckets: must be strictly increasing",
        ),
        (
            SGLANG_CONFIG,
            {"server": {"sglang": {"pipeline_config": {"action_cuda_graph_max_entries": -1}}}},
            r"pipeline_config\.action_cuda_graph_max_entries: expected an integer >= 0",
        ),
    ],
    ids=[
        "cosmos3-field-in-pi05",
        "pi05-block-in-cosmos3",
        "cosmos3-pipeline",
        "openpi-api-on-sglang",
        "sglang-api-on-openpi",
        "no-openpi-command",
        "missing-stats",
        "missing-model",
        "privileged-state-to-sglang",
        "bucket-beyond-max-token-len",
        "buckets-not-increasing",
        "negative-graph-capacity",
    ],
)
def test_bad_pi05_settings_name_the_field_and_the_fix(path, sections, message):
    with pytest.raises(settings.ConfigError, match=message):
        checked(merged(path, **sections))


def test_fingerprints_separate_families_and_keep_cosmos3s():
    cosmos3 = checked(merged())
    before = settings.RunSettings(cosmos3).fingerprint
    cosmos3["policy"]["pi05"]["replan_steps"] = 8  # not a Cosmos3 setting: no effect
    assert settings.RunSettings(cosmos3).fingerprint == before
    pi05 = checked(merged(SGLANG_CONFIG))
    replanned = checked(merged(SGLANG_CONFIG, policy={"pi05": {"replan_steps": 8}}))
    wire = checked(merged(SGLANG_CONFIG, policy={"pi05": {"wire_format": "json"}}))
    assert settings.RunSettings(pi05).fingerprint != settings.RunSettings(replanned).fingerprint
    assert settings.RunSettings(pi05).fingerprint == settings.RunSettings(wire).fingerprint


def test_pi05_sglang_dry_run_has_one_pi05_server_per_gpu(tmp_path):
    paths = overlay(tmp_path, plan={"suites": ["libero_spatial"]}, **local_checkpoint())
    result = dry_run(tmp_path, SGLANG_CONFIG, paths)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.M))
    assert counts["serve"] == "8"
    commands = [line for line in out.splitlines() if "libero_eval.serve.job" in line]
    slots = [json.loads(shlex.split(c)[shlex.split(c).index("--settings") + 1]) for c in commands]
    assert sorted(s["gpu_id"] for s in slots) == list(range(8))
    assert {s["sglang"]["pipeline_class_name"] for s in slots} == {"Pi05Pipeline"}


def test_the_workflow_refuses_a_cosmos3_field_in_a_pi05_config(tmp_path):
    result = dry_run(
        tmp_path, SGLANG_CONFIG, overlay(tmp_path, policy={"size": "320x192"}, **local_checkpoint())
    )
    assert result.returncode != 0
    assert (
        "policy.size: Cosmos3 setting(s), but policy.family is pi05"
        in result.stdout + result.stderr
    )
