"""Config layout: every family's settings under ``policy.<family>``. The seed's own layout (its
first configs: Cosmos3 fields directly under ``policy``, ``policy.http_*``, its statistics file
under ``config/stats/``) still works, with a warning naming each old and new key, and the same
fingerprint; a key in a place no layout has is refused naming the field and its place."""

import copy
import warnings
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


# --- the seed's own configs ---------------------------------------------------------------------

SEED_CONFIGS = REPO / "tests" / "fixtures" / "seed_configs"
# the seed's request knobs and where they live now, written out by hand
SEED_HTTP_KEYS = {
    "http_timeout_s": "request_timeout_s",
    "http_max_retries": "request_retries",
    "http_retry_backoff_s": "retry_backoff_s",
}
PACKAGED_STATS = "libero_eval:stats/libero_native_frame_wise_relative_rot6d.json"


def in_todays_layout(seed: dict) -> dict:
    """A seed config as one writes it today: Cosmos3 fields under policy.cosmos3, the request
    knobs under rollout.failures, the packaged statistics file."""
    config = copy.deepcopy(seed)
    policy = config["policy"]
    failures = {
        SEED_HTTP_KEYS[key]: policy.pop(key) for key in list(policy) if key in SEED_HTTP_KEYS
    }
    if failures:
        config["rollout"]["failures"] = failures
    policy["cosmos3"] = {key: policy.pop(key) for key in list(policy) if key != "family"}
    policy["cosmos3"]["action_stats_path"] = PACKAGED_STATS
    return config


@pytest.mark.parametrize("name", ["config.yaml", "libero_spatial_cosmos3_sglang.yaml"])
def test_the_seeds_own_configs_work_warning_with_each_old_and_new_key(name, monkeypatch):
    """The seed's configs, as first committed: each old key is read in its new place, named
    with it in a deprecation, and the run is the one today's layout defines (same fingerprint;
    the seed's statistics file is the packaged one, byte for byte)."""
    monkeypatch.chdir(REPO)
    seed = yaml.safe_load((SEED_CONFIGS / name).read_text())
    old_keys = [key for key in seed["policy"] if key != "family"]
    assert "num_frames" in old_keys or name == "config.yaml"
    config = copy.deepcopy(seed)
    with pytest.warns(settings.ConfigDeprecationWarning) as caught:
        seed_fingerprint = fingerprint(config)
    said = " ".join(str(warning.message) for warning in caught)
    for key in old_keys:
        new = (
            f"rollout.failures.{SEED_HTTP_KEYS[key]}"
            if key in SEED_HTTP_KEYS
            else f"policy.cosmos3.{key}"
        )
        assert f"policy.{key}" in said and new in said, (key, said)
    assert "config/stats/libero_native_frame_wise_relative_rot6d.json" in said
    assert f"read as {PACKAGED_STATS}" in said
    assert config["policy"]["cosmos3"]["action_stats_path"] == PACKAGED_STATS
    if name != "config.yaml":
        assert config["rollout"]["failures"]["request_timeout_s"] == 600
        assert config["policy"]["cosmos3"]["num_inference_steps"] == 30
    today = in_todays_layout(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", settings.ConfigDeprecationWarning)
        assert fingerprint(today) == seed_fingerprint


def test_the_seeds_demo_config_passes_every_check(monkeypatch):
    monkeypatch.chdir(REPO)
    config = yaml.safe_load((SEED_CONFIGS / "config.yaml").read_text())
    with pytest.warns(settings.ConfigDeprecationWarning):
        settings.check_family_fields(config)
    settings.validate_config(config)
    assert settings.check_config(config).run_id == "demo"


@pytest.mark.parametrize(
    ("config", "field", "place"),
    [
        # π0.5 fields never sat directly under policy: no layout reads them there
        ({"policy": {"family": "pi05", "api": "sglang_http"}}, "policy.api", "policy.pi05.api"),
        (
            {"rollout": {"request_timeout_s": 5}},
            "rollout.request_timeout_s",
            "rollout.failures.request_timeout_s",
        ),
        ({"server": {"model_path": "/m"}}, "server.model_path", "server.sglang.model_path"),
    ],
)
def test_a_key_in_a_place_no_layout_has_is_refused_naming_its_place(config, field, place):
    """Only the seed's layout is read; any other key out of place is the schema's
    "unexpected" error, naming the field and where a field of that name lives."""
    settings.check_family_fields(config)
    with pytest.raises(settings.ConfigError) as error:
        settings.validate_config(config)
    message = str(error.value)
    assert f"{field}: '{field.rsplit('.', 1)[1]}' was unexpected" in message
    assert f"{place} is a field of that name: move it there" in message


def test_a_seed_file_that_is_there_is_left_alone(tmp_path, monkeypatch):
    """A config/stats/ file of one's own (a checkout from the seed's time) is read as it is."""
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "config" / "stats" / "libero_native_frame_wise_relative_rot6d.json"
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    config = {"policy": {"cosmos3": {"action_stats_path": str(own.relative_to(tmp_path))}}}
    assert config_layout.move_seed_files(config) == []
    assert config["policy"]["cosmos3"]["action_stats_path"] == str(own.relative_to(tmp_path))
