"""A training run's checkpoints (`checkpoints:`): how entries resolve to named, stepped,
hashed checkpoints, what a checkpoint of each backend is, the errors that name the entry, and
each checkpoint's own config and fingerprint. Real directories on disk; no workflow run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from reference_checkpoint import write_reference_checkpoint

from libero_eval.checkpoint_identity import (
    Checkpoint,
    HashCache,
    changed_files,
    hash_directory,
    read_step,
    step_from_name,
)
from libero_eval.checkpoints import checkpoint_record, list_checkpoints, what_changed
from libero_eval.config import ConfigError, RunSettings, check_config, validate_config
from libero_eval.config_server import CheckpointFormatError, checkpoint_server

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the configs' relative paths (statistics) resolve from here


def config_with(checkpoints, **sections) -> dict:
    """The demo config (reference server) with `checkpoints`, validated and filled."""
    config = {
        "run_id": "training",
        "plan": {"task_ids": [0], "num_trials_per_task": 1},
        "checkpoints": checkpoints,
        **sections,
    }
    validate_config(config)
    return config


def reference_run(root: Path, steps=(500, 1000, 5000)) -> Path:
    """`root/checkpoint-<step>` for each step: hold, a slow scripted expert, scripted."""
    policies = [("hold", None), ("scripted", 3.0), ("scripted", None)]
    for step, (policy, slow) in zip(steps, policies, strict=False):
        write_reference_checkpoint(root / f"checkpoint-{step}", policy, slow)
    return root


# ----------------------------------------------------------------------------- steps, names


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-1000", 1000),  # Hugging Face Trainer (PREFIX_CHECKPOINT_DIR)
        ("step_1000", 1000),
        ("global_step1000", 1000),  # DeepSpeed
        ("ckpt-7", 7),
        ("005000", 5000),  # LeRobot's get_step_identifier, openpi's step directories
        ("final", None),
        ("exp2", None),
    ],
)
def test_a_step_is_read_from_the_directory_name(name, step):
    assert step_from_name(name) == step


def test_a_trainers_own_file_names_the_step_before_the_directory_name(tmp_path):
    hf = tmp_path / "checkpoint-100"
    hf.mkdir()
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 120, "epoch": 1.0}))
    assert read_step(hf) == (120, "trainer_state.json global_step (Hugging Face Trainer)")
    # LeRobot: checkpoints/<step>/pretrained_model, the step in ../training_state/
    lerobot = tmp_path / "checkpoints" / "002000" / "pretrained_model"
    lerobot.mkdir(parents=True)
    (lerobot.parent / "training_state").mkdir()
    (lerobot.parent / "training_state" / "training_step.json").write_text('{"step": 2000}')
    assert read_step(lerobot)[0] == 2000
    assert "LeRobot" in read_step(lerobot)[1]
    (lerobot.parent / "training_state" / "training_step.json").unlink()
    assert read_step(lerobot) == (2000, "name '002000'")  # the parent's name


def test_a_glob_resolves_to_checkpoints_sorted_by_step_named_by_what_it_matched(tmp_path):
    reference_run(tmp_path / "run")
    (tmp_path / "run" / "last").symlink_to(tmp_path / "run" / "checkpoint-5000")
    config = config_with([str(tmp_path / "run" / "*")])
    found, notes = list_checkpoints(config)
    assert [(c.name, c.step) for c in found] == [
        ("checkpoint-500", 500),
        ("checkpoint-1000", 1000),  # natural order: not after checkpoint-500 as text sorts
        ("checkpoint-5000", 5000),
    ]
    assert all(c.step_source == f"name 'checkpoint-{c.step}'" for c in found)
    # LeRobot's `last` symlink is the same directory as the newest: counted once
    assert any("last" in note and "counted once" in note for note in notes)


def test_an_entry_names_its_checkpoint_and_step(tmp_path):
    reference_run(tmp_path / "run")
    entry = {"path": str(tmp_path / "run" / "checkpoint-500"), "name": "early", "step": 7}
    (found,), _ = list_checkpoints(config_with([entry]))
    assert (found.name, found.step, found.step_source) == ("early", 7, "checkpoints[0].step")


def test_without_a_step_for_every_checkpoint_they_keep_the_order_listed(tmp_path):
    reference_run(tmp_path / "run")
    (tmp_path / "final").mkdir()
    write_reference_checkpoint(tmp_path / "final")
    entries = [str(tmp_path / "final"), str(tmp_path / "run" / "checkpoint-500")]
    found, notes = list_checkpoints(config_with(entries))
    assert [c.name for c in found] == ["final", "checkpoint-500"]
    assert found[0].step is None and found[0].step_source == "order"
    assert any("no training step for final" in note for note in notes)


# ----------------------------------------------------------------------------- bad input


def check(config: dict) -> RunSettings:
    return check_config(config)


def test_a_glob_that_matches_nothing_is_refused_naming_the_entry(tmp_path):
    reference_run(tmp_path / "run")
    config = config_with([str(tmp_path / "run" / "checkpoint-*"), str(tmp_path / "x" / "ck-*")])
    with pytest.raises(ConfigError, match=r"checkpoints\[1\]: .*x/ck-\*' matches no directory"):
        check(config)


def test_a_path_that_is_no_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoints\[0\]: .* is not a directory"):
        check(config_with([str(tmp_path / "missing")]))


def test_a_directory_that_is_not_a_reference_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ConfigError) as error:
        check(config_with([str(tmp_path / "checkpoint-*")]))
    message = str(error.value)
    assert message.startswith("checkpoints[0] (") and "no reference_checkpoint.yaml" in message


def test_a_reference_checkpoint_with_a_bad_field_is_refused_naming_file_and_key(tmp_path):
    write_reference_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "reference_checkpoint.yaml").write_text("policy: clever\n")
    with pytest.raises(ConfigError, match=r"reference_checkpoint.yaml: policy"):
        check(config_with([str(tmp_path / "ck")]))
    (tmp_path / "ck" / "reference_checkpoint.yaml").write_text("weights: x\n")
    with pytest.raises(ConfigError, match=r"'weights' is not a server.reference field"):
        check(config_with([str(tmp_path / "ck")]))


def test_a_directory_that_is_not_a_cosmos3_checkpoint_for_sglang_is_refused(tmp_path):
    """The family says what SGLang needs (Cosmos3: model_index.json, its
    Cosmos3Adapter.check_run_config), asked through the checkpoint's own config."""
    (tmp_path / "step_10").mkdir()
    (tmp_path / "step_10" / "config.json").write_text("{}")
    config = config_with([str(tmp_path / "step_*")], server={"backend": "sglang"})
    with pytest.raises(ConfigError) as error:
        check(config)
    message = str(error.value)
    assert f"checkpoints[0]: {tmp_path / 'step_10'} cannot be served as a Cosmos3" in message
    assert "has no model_index.json" in message


def test_two_checkpoints_of_one_name_are_refused(tmp_path):
    reference_run(tmp_path / "a")
    reference_run(tmp_path / "b")
    config = config_with([str(tmp_path / "a" / "checkpoint-*"), str(tmp_path / "b" / "*-500")])
    with pytest.raises(ConfigError) as error:
        check(config)
    message = str(error.value)
    assert "checkpoints[0] and checkpoints[1] both name a checkpoint 'checkpoint-500'" in message
    assert "give one of them another name" in message


def test_a_name_for_a_glob_of_several_is_refused(tmp_path):
    reference_run(tmp_path / "run")
    config = config_with([{"path": str(tmp_path / "run" / "*"), "name": "mine"}])
    with pytest.raises(ConfigError, match=r"checkpoints\[0\]: .* matches 3 directories, but name"):
        check(config)


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"server": {"port": 30000}}, "server.port 30000 with checkpoints"),
        ({"selftest": {"min_success_once": 0.5}}, "selftest.min_success_once with checkpoints"),
        (
            {"server": {"backend": "sglang", "sglang": {"model_path": "/x"}}},
            "server.sglang.model_path and checkpoints are both set",
        ),
    ],
)
def test_settings_that_cannot_go_with_checkpoints_are_refused(tmp_path, sections, field):
    reference_run(tmp_path / "run")
    with pytest.raises(ConfigError, match=field):
        check(config_with([str(tmp_path / "run" / "*")], **sections))


# ----------------------------------------------------------------------------- their servers


def test_each_backend_takes_the_checkpoint_where_it_names_its_model(tmp_path):
    ck = Checkpoint("c", str(tmp_path / "ck"), 1, "entry", 0)
    sglang = checkpoint_server(config_with(None, server={"backend": "sglang"}), ck)
    assert sglang["sglang"]["model_path"] == str(tmp_path / "ck")
    openpi = {"backend": "openpi", "openpi": {"command": ["serve", "--dir={checkpoint}"]}}
    policy = {"family": "pi05", "pi05": {"api": "openpi_websocket"}}
    server = checkpoint_server(config_with(None, server=openpi, policy=policy), ck)
    assert server["openpi"]["command"] == ["serve", f"--dir={tmp_path / 'ck'}"]
    without = {"backend": "openpi", "openpi": {"command": ["serve"]}}
    with pytest.raises(CheckpointFormatError, match=r"names no \{checkpoint\}"):
        checkpoint_server(config_with(None, server=without, policy=policy), ck)


def test_a_reference_checkpoint_sets_its_server_reference_fields(tmp_path):
    write_reference_checkpoint(tmp_path / "ck", "scripted", slow=3.0, step=9)
    ck = Checkpoint("c", str(tmp_path / "ck"), 9, "entry", 0)
    server = checkpoint_server(config_with(None), ck)
    assert server["reference"]["policy"] == "scripted"
    # a file it names is its own, relative to the directory
    assert server["reference"]["action_stats_path"] == str(tmp_path / "ck" / "action_stats.json")


# ----------------------------------------------------------------------------- identity


def test_the_content_hash_covers_every_file_and_its_cache_spares_rereads(tmp_path):
    ck = write_reference_checkpoint(tmp_path / "ck", "scripted", slow=2.0)
    (ck / "weights").mkdir()
    (ck / "weights" / "model.safetensors").write_bytes(os.urandom(1 << 20))
    (ck / ".lock").write_text("")  # not the model
    cache = HashCache(tmp_path / "cache.json")
    first, files = hash_directory(ck, cache)
    cache.save()
    assert [f.path for f in files] == [
        "action_stats.json",
        "reference_checkpoint.yaml",
        "weights/model.safetensors",
    ]
    again = HashCache(tmp_path / "cache.json")
    assert hash_directory(ck, again)[0] == first and again.files_read == 0
    # moved elsewhere: the same content, the same hash
    moved = Path(shutil.copytree(ck, tmp_path / "moved"))
    assert hash_directory(moved, HashCache(None))[0] == first
    # one byte changed: another hash, and only that file is read again
    data = bytearray((ck / "weights" / "model.safetensors").read_bytes())
    data[0] ^= 1
    (ck / "weights" / "model.safetensors").write_bytes(bytes(data))
    changed, new_files = hash_directory(ck, again)
    assert changed != first and again.files_read == 1
    (phrase,) = changed_files(files, new_files)
    assert phrase.startswith("weights/model.safetensors changed (sha256 ")


def test_a_checkpoints_fingerprint_has_its_content_and_a_single_runs_has_none(tmp_path):
    reference_run(tmp_path / "run")
    config = config_with([str(tmp_path / "run" / "*")])
    settings = check_config(config)
    prints = {c.name: settings.for_checkpoint(c).fingerprint for c in settings.checkpoints}
    assert len(set(prints.values())) == 3
    # a checkpoint's config is a single run of its model: the same settings, plus its content
    single = dict(config, checkpoints=None)
    single["server"] = dict(config["server"], reference={**config["server"]["reference"]})
    single["server"]["reference"]["policy"] = "hold"
    assert RunSettings(single).fingerprint not in prints.values()
    # unchanged content moved elsewhere keeps the reference checkpoint's fingerprint (its
    # server part is the policy and the statistics' content, not the path)
    shutil.copytree(tmp_path / "run", tmp_path / "moved")
    moved = check_config(config_with([str(tmp_path / "moved" / "*")]))
    assert {c.name: moved.for_checkpoint(c).fingerprint for c in moved.checkpoints} == prints


def test_a_checkpoint_changed_on_disk_is_said_naming_the_file(tmp_path):
    reference_run(tmp_path / "run")
    config = config_with([str(tmp_path / "run" / "checkpoint-1000")])
    before = check_config(config)
    (ck,) = before.checkpoints
    fingerprint = before.for_checkpoint(ck).fingerprint
    record = tmp_path / "results" / "training" / "checkpoints" / ck.name / "summary"
    record.mkdir(parents=True)
    (record / "checkpoint.json").write_text(json.dumps(checkpoint_record(ck, fingerprint)))
    assert what_changed(tmp_path / "results" / "training", ck, fingerprint) is None
    stats = tmp_path / "run" / "checkpoint-1000" / "action_stats.json"
    stats.write_text(stats.read_text().replace("0.9375", "0.9376", 1))
    after = check_config(config)
    (changed,) = after.checkpoints
    new_print = after.for_checkpoint(changed).fingerprint
    assert new_print != fingerprint
    message = what_changed(tmp_path / "results" / "training", changed, new_print)
    assert "checkpoint checkpoint-1000 changed on disk since its episodes ran: " in message
    assert "action_stats.json changed (sha256 " in message
    assert f"episodes/{fingerprint}" in message  # where the old episodes stay
