"""The random-checkpoint builder (tools/random_checkpoint): its checkpoints load in SGLang
0.5.23's own loaders (side environment, tests/sglang_side), and the π0.5 lineage configs
read as each reader reads them (SGLang's ``_apply_checkpoint_config``, the project's
``load_norm_stats``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_side import INSTALL_HINT, SglangSideError, side_python

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tools"))

from random_checkpoint import specs  # noqa: E402

from libero_eval.policy.families.pi05 import openpi_transforms as T  # noqa: E402

STATS = REPO_ROOT / "src" / "libero_eval" / "data" / "stats" / "pi05_libero_norm_stats.json"

# One side-environment process: SGLang imports once (about 10 s), builds the tiny checkpoints
# on the CPU, loads each with SGLang's loaders, and sizes the true architectures on the meta
# device. It prints one JSON line per result.
SIDE_SCRIPT = r"""
import json, os, shutil, sys
from pathlib import Path
out, stats = Path(sys.argv[1]), Path(sys.argv[2])
os.environ["HF_HOME"] = str(out / "hf")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, sys.argv[3])
from random_checkpoint import build, specs, sglang_models
def emit(key, value):
    print("RESULT " + json.dumps({key: value}), flush=True)
emit("built_cosmos3", build.build_cosmos3(out / "c3", "tiny"))
emit("loaded_cosmos3", build.verify_cosmos3(out / "c3"))
for lineage in specs.PI05_LINEAGES:
    d = out / f"pi05_{lineage}"
    emit(f"built_pi05_{lineage}", build.build_pi05(d, lineage, "tiny", stats, out / "hf"))
    emit(f"loaded_pi05_{lineage}", build.verify_pi05(d, out / "hf"))
true_c3 = out / "c3_true"
specs.write_cosmos3_configs(true_c3, "true")
shutil.copytree(out / "c3" / "text_tokenizer", true_c3 / "text_tokenizer")
rows = sglang_models.cosmos3_tensors(true_c3)
emit("true_cosmos3", {k: sum(r.numel for r in v) for k, v in rows.items()})
true_pi = out / "pi05_true"
specs.write_pi05_configs(true_pi, "lerobot", "true")
emit("true_pi05", sum(r.numel for r in sglang_models.pi05_tensors(true_pi, "lerobot")))
"""


@pytest.fixture(scope="module")
def side_results(tmp_path_factory) -> dict:
    python = side_python()
    if python is None:
        import os

        if os.environ.get("LIBERO_EVAL_REQUIRE_SGLANG") == "1":
            raise SglangSideError(f"LIBERO_EVAL_REQUIRE_SGLANG=1 but no side env: {INSTALL_HINT}")
        pytest.skip(f"SGLang 0.5.23 side environment not installed; run {INSTALL_HINT}")
    out = tmp_path_factory.mktemp("random_checkpoints")
    proc = subprocess.run(
        [str(python), "-c", SIDE_SCRIPT, str(out), str(STATS), str(REPO_ROOT / "tools")],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(out), "TOKENIZERS_PARALLELISM": "false"},
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            results.update(json.loads(line[len("RESULT ") :]))
    assert proc.returncode == 0, proc.stderr[-4000:]
    results["dir"] = out
    return results


def test_tiny_cosmos3_loads_in_sglangs_own_loaders(side_results):
    built, loaded = side_results["built_cosmos3"], side_results["loaded_cosmos3"]
    assert loaded["transformer_class"] == "Cosmos3OmniTransformer"
    assert loaded["vae_class"] == "AutoencoderKLWan"
    # every parameter came from the checkpoint: counts match and values are the builder's
    assert loaded["transformer_parameters"] == built["transformer_parameters"]
    assert loaded["vae_parameters"] == built["vae_parameters"]
    assert loaded["transformer_all_finite"] and loaded["vae_all_finite"]
    assert 0.015 < loaded["transformer_std"] < 0.025
    # small enough for a CPU forward
    assert built["transformer_parameters"] < 100e6 and built["vae_parameters"] < 10e6
    d = side_results["dir"] / "c3"
    for relative in (
        "model_index.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
        "scheduler/scheduler_config.json",
        "text_tokenizer/tokenizer.json",
    ):
        assert (d / relative).is_file(), relative


def test_cosmos3_text_tokenizer_is_qwen2s_real_bpe(side_results):
    tokenizer = json.loads((side_results["dir"] / "c3/text_tokenizer/tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "BPE"
    assert len(tokenizer["model"]["vocab"]) == 151_643
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert specials["<|endoftext|>"] == 151_643 and specials["<|vision_start|>"] == 151_652


@pytest.mark.parametrize("lineage", specs.PI05_LINEAGES)
def test_tiny_pi05_loads_in_sglangs_own_loader(side_results, lineage):
    built, loaded = side_results[f"built_pi05_{lineage}"], side_results[f"loaded_pi05_{lineage}"]
    assert loaded["parameters"] == built["parameters"]
    if lineage == "lerobot":
        # SGLang took LeRobot's LIBERO cameras, state width and action width from config.json
        assert loaded["image_keys"] == ["image", "image2"]
        assert (loaded["state_dim"], loaded["output_action_dim"]) == (8, 7)
        assert loaded["action_horizon"] == 50
    else:
        # openpi's converted config.json: SGLang's default cameras and state width, and the
        # horizon from the chunk_size the project's layout adds (openpi's converter does not)
        assert loaded["image_keys"] == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
        assert loaded["state_dim"] == 32
        assert loaded["action_horizon"] == 10


def test_pi05_tokenizer_stand_in_gives_realistic_prompt_lengths(side_results):
    loaded = side_results["loaded_pi05_lerobot"]
    words = loaded["prompt_words"]
    # SGLang's own preprocessor: "Task: <words>, State: <8 or 32 bins>;\nAction: " with <bos>;
    # about one token per word and per state value
    assert words + 8 <= loaded["prompt_tokens_state8"] <= words + 8 + 10
    assert loaded["prompt_tokens_state32"] - loaded["prompt_tokens_state8"] == 24
    cache = side_results["dir"] / "hf/hub/models--google--paligemma-3b-pt-224"
    assert (cache / "refs/main").is_file()
    snapshot = cache / "snapshots" / (cache / "refs/main").read_text()
    assert "STAND-IN" in (snapshot / "README.md").read_text()


def test_true_sizes_are_the_real_architectures(side_results):
    c3 = side_results["true_cosmos3"]
    assert round(c3["transformer"] / 1e9, 2) == 14.55
    assert 0.5e9 < c3["vae"] < 1e9
    assert round(side_results["true_pi05"] / 1e9, 2) == 3.35


def test_lerobot_lineage_normalizer_is_read_by_the_project(tmp_path):
    specs.write_pi05_configs(tmp_path, "lerobot", norm_stats=STATS)
    stats = T.load_norm_stats(tmp_path)
    reference = T.load_norm_stats(STATS)
    assert stats.state_mode == stats.actions_mode == "quantile"
    assert stats.state.dim == 8 and stats.actions.dim == 7
    assert stats.state.q01.tolist() == pytest.approx(reference.state.q01.tolist(), rel=1e-6)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["input_features"]["observation.state"]["shape"] == [8]
    assert (config["chunk_size"], config["n_action_steps"]) == (50, 50)


def test_a_mean_std_lerobot_checkpoint_passes_the_shipped_lerobot_config(tmp_path):
    """--normalization MEAN_STD: the layout of pi05_libero_finetuned_v044, which
    config/libero_pi05_sglang.yaml (normalization: zscore) accepts; π0.5's own QUANTILES is
    refused by it, naming the field."""
    import yaml

    from libero_eval.config import ConfigError, RunSettings

    def settings_for(checkpoint: Path) -> RunSettings:
        config = yaml.safe_load((REPO_ROOT / "config" / "libero_pi05_sglang.yaml").read_text())
        config["server"]["sglang"]["model_path"] = str(checkpoint)
        return RunSettings(config)

    from random_checkpoint.pi05_layouts import write_tokenizer_standins

    for name in ("v044", "base"):  # the prompt is tokenized on the client: tokenizer.json
        write_tokenizer_standins(tmp_path / name)
    specs.write_pi05_configs(
        tmp_path / "v044", "lerobot", norm_stats=STATS, normalization="MEAN_STD"
    )
    assert T.load_norm_stats(tmp_path / "v044").state_mode == "zscore"
    assert settings_for(tmp_path / "v044").fingerprint
    specs.write_pi05_configs(tmp_path / "base", "lerobot", norm_stats=STATS)
    with pytest.raises(ConfigError, match="normalization: quantile"):
        _ = settings_for(tmp_path / "base").fingerprint


def test_openpi_lineage_is_pi05_libero_as_converted(tmp_path):
    specs.write_pi05_configs(tmp_path, "openpi", norm_stats=STATS)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["action_horizon"] == config["chunk_size"] == 10
    assert config["paligemma_variant"] == "gemma_2b"
    norm = tmp_path / "assets/physical-intelligence/libero/norm_stats.json"
    assert T.load_norm_stats(norm).state.dim == 8
    with pytest.raises(ValueError, match="unknown π0.5 lineage"):
        specs.pi05_config("lerobot_v2")
