"""The rollout fingerprint of every shipped config, pinned to its value before issue 21's
settings refactor: a refactor of how settings are read must not move any run's episode store
(``results/<run>/episodes/<fingerprint>``)."""

import copy
from pathlib import Path

import pytest
import yaml
from random_checkpoint import pi05_layouts

from libero_eval.config import validate_config

REPO = Path(__file__).resolve().parents[1]
# Fixed paths (not tmp_path): a checkpoint's resolved path is part of the fingerprint.
STANDIN_ROOT = Path("/tmp/libero_eval_fingerprint_pin")

PINNED = {
    "config.yaml": "a332ce35aacd",
    "libero_pi05_openpi.yaml": "93298ac9ce8f",
    # an overlay: alone it runs the scripted expert, whose privileged state the schema's null
    # now sends (alone it was refused before, "ca91e59bf65b" with none): the fingerprint of
    # `--configfile config/config.yaml config/libero_pro_robustness.yaml`, its runs' store
    "libero_pro_robustness.yaml": "a332ce35aacd",
    "libero_spatial_cosmos3_sglang.yaml": "2923b9a0afaa",
    "selftest.yaml": "2e91d42634dd",
}
# π0.5 through SGLang: the checkpoint (server.sglang.model_path) decides the layout, so these
# take a stand-in checkpoint of the config's lineage at a fixed path. The last value is the
# fingerprint without server.sglang.pipeline_config (pinned before issue 25 added it: an empty
# pipeline_config moves no store); the shipped one pads prompts to buckets, which changes the
# prefix's shapes, so its runs have their own store.
PINNED_WITH_CHECKPOINT = {
    "libero_pi05_openpi_sglang.yaml": ("openpi", {}, "bbed8ba0a958", "52ea1571a9fd"),
    # its policy_preprocessor.json normalizes with MEAN_STD (policy.pi05.normalization zscore)
    "libero_pi05_sglang.yaml": (
        "lerobot",
        {"normalization": "MEAN_STD"},
        "0c22f5530e6a",
        "a282d2aafb51",
    ),
}


def workflow_fingerprint(config: dict) -> str:
    """The fingerprint as workflow/rules/common.smk computes it for `--configfile <file>`."""
    from libero_eval.config import check_family_fields

    check_family_fields(config)
    validate_config(config)
    from libero_eval.config import RunSettings

    return RunSettings(config).fingerprint


def test_every_shipped_config_is_pinned():
    shipped = {p.name for p in (REPO / "config").glob("*.yaml")} - {"schema.yaml"}
    assert shipped == set(PINNED) | set(PINNED_WITH_CHECKPOINT) | {"training_run.yaml"}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_shipped_config_fingerprint_unchanged(name, monkeypatch):
    monkeypatch.chdir(REPO)
    config = yaml.safe_load((REPO / "config" / name).read_text())
    assert workflow_fingerprint(config) == PINNED[name]


@pytest.mark.parametrize("name", sorted(PINNED_WITH_CHECKPOINT))
def test_shipped_pi05_sglang_config_fingerprint_unchanged(name, monkeypatch):
    monkeypatch.chdir(REPO)
    lineage, layout, expected, without_pipeline_config = PINNED_WITH_CHECKPOINT[name]
    write = {"lerobot": pi05_layouts.write_lerobot, "openpi": pi05_layouts.write_openpi}[lineage]
    checkpoint = pi05_layouts.write_tokenizer_standins(write(STANDIN_ROOT / lineage, **layout))
    config = yaml.safe_load((REPO / "config" / name).read_text())
    config["server"]["sglang"]["model_path"] = str(checkpoint)
    assert config["server"]["sglang"]["pipeline_config"]
    assert workflow_fingerprint(copy.deepcopy(config)) == expected
    config["server"]["sglang"]["pipeline_config"] = {}
    assert workflow_fingerprint(config) == without_pipeline_config


# A training run (`checkpoints:`): the demo overlay's three reference checkpoints, written as
# its header says at a fixed place; each checkpoint's episodes sit under the single run's
# fingerprint with the checkpoint's content (its files' hash) in it.
PINNED_TRAINING_RUN = {
    "checkpoint-1000": "8c8e8995ab4a",
    "checkpoint-2000": "3d1ad58c7a27",
    "checkpoint-3000": "d8adbbeaf324",
}


def test_the_training_run_overlays_checkpoint_fingerprints_unchanged(monkeypatch):
    from reference_checkpoint import write_reference_checkpoint

    from libero_eval.config import RunSettings, check_config

    runs = STANDIN_ROOT / "training_run" / "runs" / "reference_demo"
    write_reference_checkpoint(runs / "checkpoint-1000", policy="hold")
    write_reference_checkpoint(runs / "checkpoint-2000", slow=2)
    write_reference_checkpoint(runs / "checkpoint-3000")
    monkeypatch.chdir(runs.parents[1])  # the overlay's glob is relative: runs/reference_demo/...
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for key, value in yaml.safe_load((REPO / "config" / "training_run.yaml").read_text()).items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    check_family_fields_and_validate(config)
    run: RunSettings = check_config(config)
    found = {c.name: run.for_checkpoint(c).fingerprint for c in run.checkpoints}
    assert found == PINNED_TRAINING_RUN


def check_family_fields_and_validate(config: dict) -> None:
    from libero_eval.config import check_family_fields

    check_family_fields(config)
    validate_config(config)
