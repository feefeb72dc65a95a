"""openpi's π0.5 prompt, tokenized on the client with the PaliGemma SentencePiece model.

openpi tokenizes in its data transforms, not in the model (``src/openpi/models/tokenizer.py``
``PaligemmaTokenizer.tokenize``, lines 22-47 at openpi 15a9616; ``TokenizePrompt`` in
``src/openpi/transforms.py``, lines 248-266, which passes the state only when
``discrete_state_input`` is true, and runs before ``PadStatesAndActions``):

- cleaned text = ``prompt.strip().replace("_", " ").replace("\\n", " ")``;
- with a state (π0.5 format): ``"Task: {text}, State: {bins};\\nAction: "`` encoded with BOS,
  ``bins`` = ``np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1`` of the UNPADDED state;
- without (π0 format, openpi's ``pi05_libero``: ``discrete_state_input=False``,
  ``src/openpi/training/config.py`` line 745): ``encode(text, add_bos=True) + encode("\\n")``;
- padded with 0 to ``max_len`` (200 for π0.5), mask True on the real tokens; cut at ``max_len``.

SGLang builds its own prompt from the state it receives unless the request carries ``tokens``
and ``token_masks`` (``pi05_preprocess.py`` ``Pi05Preprocessor.__call__``), so an
openpi-trained checkpoint gets exactly these.

LeRobot <= 0.4.4 zero-padded the normalized state to ``max_state_dim`` (32) BEFORE
discretizing (``Pi05PrepareStateTokenizerProcessorStep``, ``state = pad_vector(state,
self.max_state_dim)``; removed in LeRobot 0.5.0 by commit f0d2b37, "remove state padding before
tokenization"), then tokenized with the Hugging Face PaliGemma tokenizer
(``TokenizerProcessorStep``: ``max_length`` 200, ``padding="max_length"``, right side).
Checkpoints trained then (``lerobot/pi05_libero_finetuned_v044``) saw 32 state values in every
prompt; SGLang would build 8, so :func:`lerobot_padded_tokens` sends LeRobot 0.4.4's tokens,
made with the ``tokenizers`` library from the tokenizer's ``tokenizer.json``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

PALIGEMMA_HF_ID = "google/paligemma-3b-pt-224"
MODEL_NAMES = ("tokenizer.model", "paligemma_tokenizer.model")


def candidate_paths(checkpoint: Path | None, kind: str = "sentencepiece") -> list[Path]:
    """Where a PaliGemma tokenizer file is looked for, in order: the SentencePiece model
    (``kind`` sentencepiece, openpi's) or the Hugging Face ``tokenizer.json`` (LeRobot's)."""
    names = MODEL_NAMES if kind == "sentencepiece" else ("tokenizer.json",)
    paths: list[Path] = []
    if checkpoint is not None:
        paths += [checkpoint / name for name in names]
    if kind == "sentencepiece":  # openpi's own download cache
        openpi_home = Path(os.environ.get("OPENPI_DATA_HOME", "~/.cache/openpi")).expanduser()
        paths.append(openpi_home / "big_vision" / "paligemma_tokenizer.model")
    hf_home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()
    hub = Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub"))
    repo = hub / ("models--" + PALIGEMMA_HF_ID.replace("/", "--")) / "snapshots"
    paths += sorted(repo.glob(f"*/{names[0]}"))
    return paths


def find_model(
    configured: str | Path | None, checkpoint: Path | None, kind: str = "sentencepiece"
) -> Path:
    """The tokenizer file: ``policy.pi05.tokenizer_path``, else the first one found."""
    what = "SentencePiece tokenizer.model" if kind == "sentencepiece" else "tokenizer.json"
    if configured is not None:
        path = Path(configured)
        if not path.is_file():
            raise FileNotFoundError(
                f"policy.pi05.tokenizer_path {path} does not exist: give PaliGemma's {what}"
            )
        return path
    candidates = candidate_paths(checkpoint, kind)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"this checkpoint's prompt is tokenized on the client, with PaliGemma's {what}, and "
        "none was found. Looked in: "
        + ", ".join(str(p) for p in candidates[:4])
        + f". Put {what.split()[-1]} in the checkpoint directory, cache {PALIGEMMA_HF_ID} in "
        "the Hugging Face cache (also what SGLang's own preprocessor loads), or set "
        "policy.pi05.tokenizer_path"
    )


@lru_cache(maxsize=4)
def _hf_tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def lerobot_padded_tokens(
    tokenizer_json: Path, prompt: str, state: np.ndarray, max_state_dim: int, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """LeRobot 0.4.4's π0.5 prompt tokens: the normalized state zero-padded to
    ``max_state_dim``, discretized, and tokenized as its ``TokenizerProcessorStep`` does."""
    state = np.asarray(state, dtype=np.float64)
    padded = np.pad(state, (0, max(0, max_state_dim - state.shape[-1])))
    text = prompt.strip().replace("_", " ").replace("\n", " ")
    bins = " ".join(map(str, discretize_state(padded)))
    tokenizer = _hf_tokenizer(str(tokenizer_json))
    ids = tokenizer.encode(f"Task: {text}, State: {bins};\nAction: ").ids[:max_len]
    pad_id = tokenizer.token_to_id("<pad>") or 0
    mask = [True] * len(ids) + [False] * (max_len - len(ids))
    ids = list(ids) + [pad_id] * (max_len - len(ids))
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool)


@lru_cache(maxsize=4)
def _processor(path: str):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path)


def discretize_state(state: np.ndarray) -> np.ndarray:
    """openpi's 256 bins over [-1, 1] (the same in LeRobot and in SGLang's ``_tokenize``)."""
    return np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1


def openpi_tokens(
    model: Path, prompt: str, state: np.ndarray | None, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens int32 [max_len], mask bool [max_len])`` as openpi's tokenizer makes them."""
    sp = _processor(str(model))
    text = prompt.strip().replace("_", " ").replace("\n", " ")
    if state is not None:
        bins = " ".join(map(str, discretize_state(np.asarray(state))))
        tokens = list(sp.encode(f"Task: {text}, State: {bins};\nAction: ", add_bos=True))
    else:
        tokens = list(sp.encode(text, add_bos=True)) + list(sp.encode("\n"))
    tokens = tokens[:max_len]
    mask = [True] * len(tokens) + [False] * (max_len - len(tokens))
    tokens = tokens + [0] * (max_len - len(tokens))
    return np.asarray(tokens, dtype=np.int32), np.asarray(mask, dtype=bool)
