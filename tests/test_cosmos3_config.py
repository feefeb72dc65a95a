"""The Cosmos3 SGLang seed config: it validates, and its dry run plans one server per GPU."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import workflow_dir

from libero_eval.rollout.protocols import get_protocol

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "config" / "libero_spatial_cosmos3_sglang.yaml"


def dry_run(tmp_path: Path, *configfiles: Path) -> subprocess.CompletedProcess:
    """`snakemake -n` in a private working directory (never the checkout's .snakemake/)."""
    # One --configfile flag with several files: they merge in order (a repeated flag would not).
    args = [sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "128", "--configfile"]
    args += [str(configfile) for configfile in configfiles]
    work = workflow_dir(tmp_path / "work")
    return subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=300)


@pytest.fixture
def model_dir(tmp_path):
    model = tmp_path / "model_diffusers"
    (model / "text_tokenizer").mkdir(parents=True)
    (model / "model_index.json").write_text("{}")
    return model


def overlay(tmp_path, **sections) -> Path:
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def test_seed_dry_run_has_one_sglang_server_per_gpu_and_its_shards(tmp_path, model_dir):
    paths = overlay(tmp_path, server={"sglang": {"model_path": str(model_dir)}})
    result = dry_run(tmp_path, SEED, paths)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.M))
    assert counts["serve"] == "8"
    assert counts["rollout"] == "8"
    commands = [line for line in out.splitlines() if "libero_eval.serve.job" in line]
    assert len(commands) == 8
    settings = [
        json.loads(shlex.split(c)[shlex.split(c).index("--settings") + 1]) for c in commands
    ]
    assert sorted(s["slot"] for s in settings) == list(range(8))
    assert sorted(s["gpu_id"] for s in settings) == list(range(8))  # local pinning by slot
    assert {s["backend"] for s in settings} == {"sglang"}
    assert {s["sglang"]["batching_max_size"] for s in settings} == {8}
    assert {s["host"] for s in settings} == {"127.0.0.1"}


def test_seed_config_carries_the_reference_settings():
    seed = yaml.safe_load(SEED.read_text())
    policy = seed["policy"]["cosmos3"]
    assert policy["num_action_chunks"] == 16 and policy["num_frames"] == 17
    assert policy["size"] == "320x192" and policy["seed"] == 1140
    assert policy["num_inference_steps"] == 30 and policy["domain_name"] == "libero"
    assert policy["normalization"] == "quantile_rot"
    assert seed["rollout"]["failures"]["request_timeout_s"] == 600
    assert seed["rollout"]["total_num_envs"] == 128 and seed["rollout"]["protocol"] == "rlinf"
    # max_episode_steps 480 comes from the protocol, per suite, not from one override for all
    assert "max_steps" not in seed["rollout"]
    assert get_protocol("rlinf").max_steps_for("libero_spatial") == 480
    assert seed["server"]["sglang"]["batching_max_size"] == 8


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"server": {"sglang": {"model_path": "/nonexistent/model"}}}, "model_index.json"),
        ({"policy": {"num_frames": 13}}, "num_frames"),
        ({"rollout": {"total_num_envs": 100}}, "total_num_envs"),
        ({"rollout": {"reset_seeding": "reference"}}, "rollout.reset_seeding: reference"),
        ({"policy": {"size": "320"}}, "size"),
        ({"policy": {"normalization": "zscore"}}, "normalization"),
    ],
)
def test_bad_seed_overrides_name_the_field(tmp_path, model_dir, sections, message):
    sections.setdefault("server", {}).setdefault("sglang", {}).setdefault(
        "model_path", str(model_dir)
    )
    result = dry_run(tmp_path, SEED, overlay(tmp_path, **sections))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
