"""π0.5 prompts as each lineage's training code builds them (verbatim bodies, cited)."""

from __future__ import annotations

import numpy as np


def openpi_tokenize(tokenizer, max_len: int, prompt: str, state: np.ndarray | None = None):
    """openpi ``src/openpi/models/tokenizer.py`` ``PaligemmaTokenizer.tokenize`` (lines 22-47,
    openpi 15a9616); ``tokenizer`` is the ``sentencepiece.SentencePieceProcessor`` that
    ``__init__`` loads from ``paligemma_tokenizer.model``."""
    self = type("PaligemmaTokenizer", (), {"_tokenizer": tokenizer, "_max_len": max_len})()
    cleaned_text = prompt.strip().replace("_", " ").replace("\n", " ")
    if state is not None:
        # This is the Pi05 format, where the state is part of the discrete language input.
        discretized_state = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        state_str = " ".join(map(str, discretized_state))
        full_prompt = f"Task: {cleaned_text}, State: {state_str};\nAction: "
        tokens = self._tokenizer.encode(full_prompt, add_bos=True)
    else:
        # This is the Pi0 format, where the state is part of the continuous action expert input.
        # tokenize "\n" separately as the "start of answer" token
        tokens = self._tokenizer.encode(cleaned_text, add_bos=True) + self._tokenizer.encode("\n")
    tokens_len = len(tokens)
    if tokens_len < self._max_len:
        padding = [False] * (self._max_len - tokens_len)
        mask = [True] * tokens_len + padding
        tokens = tokens + padding
    else:
        tokens = tokens[: self._max_len]
        mask = [True] * self._max_len

    return np.asarray(tokens), np.asarray(mask)


def lerobot_prompt(state: np.ndarray, task: str, max_state_dim: int | None = None) -> str:
    """LeRobot ``Pi05PrepareStateTokenizerProcessorStep.__call__``: lerobot 0.6.1
    ``policies/pi05/processor_pi05.py`` lines 63-75 (``max_state_dim`` None); lerobot 0.4.4
    pads first, ``state = pad_vector(state, self.max_state_dim)`` (pass ``max_state_dim``)."""
    state = np.asarray(state)[None]
    if max_state_dim is not None:  # lerobot 0.4.4 pad_vector: zeros on the last axis
        state = np.pad(state, [(0, 0), (0, max_state_dim - state.shape[-1])])
    tasks = [task]
    state_np = state
    discretized_states = np.digitize(state_np, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1

    full_prompts = []
    for i, task in enumerate(tasks):
        cleaned_text = task.strip().replace("_", " ").replace("\n", " ")
        state_str = " ".join(map(str, discretized_states[i]))
        full_prompt = f"Task: {cleaned_text}, State: {state_str};\nAction: "
        full_prompts.append(full_prompt)
    return full_prompts[0]
