"""π0.5 checkpoint layout specimens of each lineage (no weights), for the tests and this
builder: test material, kept out of the ``libero_eval`` package. Pure Python and numpy.

Each is laid out as the real checkpoint of its lineage is, with this project's made-up test
statistics (``src/libero_eval/data/stats/pi05_libero_norm_stats.json``) instead of the real ones:

- ``pi05_libero_lerobot/``: ``config.json`` as LeRobot 0.6.1's ``PI05Config`` saves it for
  LIBERO (``input_features`` ``observation.images.image`` / ``image2`` at 256x256 and an 8-D
  ``observation.state``; ``chunk_size`` 50; with ``empty_cameras=1`` also
  ``observation.images.empty_camera_0``, as LeRobot's LIBERO recipe leaves it),
  ``policy_preprocessor.json`` with the steps of
  ``make_pi05_pre_post_processors`` and the normalizer's safetensors state file.
- ``pi05_libero_openpi/``: openpi's ``pi05_libero`` converted by
  ``examples/convert_jax_model_to_pytorch.py`` (its ``config.json`` fields, ``assets/``
  copied), plus the ``chunk_size`` SGLang reads.

The tests point ``policy.pi05.checkpoint`` at one written to a temporary directory; a real
run points ``server.sglang.model_path`` at the real checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

# the repository's made-up test statistics (the package data of libero_eval; read from the
# checkout, so that the SGLang side environment, without libero_eval, can build with them)
STATS = (
    Path(__file__).resolve().parents[2] / "src/libero_eval/data/stats/pi05_libero_norm_stats.json"
)


def norm_map(mode: str = "QUANTILES") -> dict[str, str]:
    """LeRobot's normalization_mapping: π0.5's QUANTILES, or MEAN_STD (pi05_..._v044)."""
    return {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}


NORMALIZER_FILE = "policy_preprocessor_step_2_normalizer_processor.safetensors"


def lerobot_config(
    chunk_size: int = 50,
    n_action_steps: int = 50,
    normalization: str = "QUANTILES",
    empty_cameras: int = 0,
) -> dict:
    """LeRobot's PI05Config for LIBERO, as ``config.json`` (the fields SGLang and LeRobot read).

    ``empty_cameras`` > 0: trained as LeRobot's π0.5 LIBERO recipe trains
    (``--policy.empty_cameras=1``, lerobot ``docs/source/pi05.mdx``): ``validate_features``
    (``configuration_pi05.py``) has added ``observation.images.empty_camera_i`` to
    ``input_features`` before the config is saved, and ``empty_cameras`` is kept as well."""
    features = {
        "observation.images.image": {"type": "VISUAL", "shape": [3, 256, 256]},
        "observation.images.image2": {"type": "VISUAL", "shape": [3, 256, 256]},
        "observation.state": {"type": "STATE", "shape": [8]},
    }
    for i in range(empty_cameras):  # appended by assignment, at image_resolution
        features[f"observation.images.empty_camera_{i}"] = {
            "type": "VISUAL",
            "shape": [3, 224, 224],
        }
    return {
        "type": "pi05",
        "n_obs_steps": 1,
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [7]}},
        "device": "cuda",
        "use_amp": False,
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "dtype": "bfloat16",
        "chunk_size": chunk_size,
        "n_action_steps": n_action_steps,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "num_inference_steps": 10,
        "min_period": 0.004,
        "max_period": 4.0,
        "image_resolution": [224, 224],
        "empty_cameras": empty_cameras,
        "tokenizer_max_length": 200,
        "normalization_mapping": norm_map(normalization),
    }


def lerobot_preprocessor(normalization: str = "QUANTILES") -> dict:
    """``policy_preprocessor.json`` of ``make_pi05_pre_post_processors`` (lerobot 0.6.1)."""
    return {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {
                "registry_name": "normalizer_processor",
                "config": {
                    "eps": 1e-08,
                    "features": {
                        "observation.state": {"type": "STATE", "shape": [8]},
                        "action": {"type": "ACTION", "shape": [7]},
                    },
                    "norm_map": norm_map(normalization),
                },
                "state_file": NORMALIZER_FILE,
            },
            {
                "registry_name": "pi05_prepare_state_tokenizer_processor_step",
                "config": {"max_state_dim": 32, "task_key": "task"},
            },
            {
                "registry_name": "tokenizer_processor",
                "config": {
                    "max_length": 200,
                    "task_key": "task",
                    "padding_side": "right",
                    "padding": "max_length",
                    "truncation": True,
                    "tokenizer_name": "google/paligemma-3b-pt-224",
                },
            },
            {
                "registry_name": "device_processor",
                "config": {"device": "cuda", "float_dtype": None},
            },
        ],
    }


def openpi_config(action_horizon: int = 10) -> dict:
    """openpi's converter output for ``pi05_libero`` plus SGLang's ``chunk_size``."""
    return {
        "action_dim": 32,
        "action_horizon": action_horizon,
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "precision": "bfloat16",
        "chunk_size": action_horizon,
    }


def write_lerobot(
    directory: Path, normalization: str = "QUANTILES", stats: Path = STATS, **config: int
) -> Path:
    """A LeRobot-lineage checkpoint directory (config files and statistics only); ``stats``
    is an openpi ``norm_stats.json`` whose blocks become the normalizer's state file."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config_json = lerobot_config(normalization=normalization, **config)
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    (directory / "policy_preprocessor.json").write_text(
        json.dumps(lerobot_preprocessor(normalization), indent=2) + "\n"
    )
    raw = json.loads(Path(stats).read_text())["norm_stats"]
    flat = {
        f"{feature}.{stat}": np.asarray(values, dtype=np.float32)
        for feature, block in (("observation.state", raw["state"]), ("action", raw["actions"]))
        for stat, values in block.items()
    }
    save_file(flat, str(directory / NORMALIZER_FILE))
    return directory


def write_openpi(directory: Path, stats: Path = STATS, **config: int) -> Path:
    """An openpi-lineage (converted) checkpoint directory (config and assets only)."""
    assets = directory / "assets" / "physical-intelligence" / "libero"
    assets.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(openpi_config(**config), indent=2) + "\n")
    shutil.copyfile(stats, assets / "norm_stats.json")
    return directory


# A STAND-IN for PaliGemma's tokenizer (a downloaded model asset): same special-token ids
# (<pad> 0, <eos> 1, <bos> 2, <unk> 3), one token per word, number and punctuation mark, so
# prompt lengths are realistic; the ids are not PaliGemma's.
_CORPUS = [
    "Task: pick up the black bowl between the plate and the ramekin and place it on the plate,"
    " State: 0 1 2 3 4 5 6 7 8 9 10 128 255;\nAction: ",
    "put both the alphabet soup and the tomato sauce in the basket",
    "open the middle drawer of the cabinet and put the bowl on the stove",
    "turn on the stove and put the moka pot on it next to the cream cheese box",
]


def write_tokenizer_standins(directory: Path) -> Path:
    """``tokenizer.model`` (SentencePiece) and ``tokenizer.json`` (Hugging Face) stand-ins."""
    import io

    import sentencepiece as spm
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    directory.mkdir(parents=True, exist_ok=True)
    words = sorted({w for line in _CORPUS for w in line.replace(",", " , ").split()})
    words += [str(i) for i in range(256)] + [";", ":", ",", "\n"]
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for word in dict.fromkeys(words):
        vocab.setdefault(word, len(vocab))
    hf = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    hf.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 2)]
    )
    hf.save(str(directory / "tokenizer.json"))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 4 + [" ".join(str(i) for i in range(256))]),
        model_writer=model,
        model_type="word",
        vocab_size=min(len(vocab), 120),
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        minloglevel=2,
    )
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    return directory
