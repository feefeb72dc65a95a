"""Weight names and shapes from SGLang 0.5.23's own model classes (runs where SGLang is).

The models are built on the meta device (no memory), exactly as SGLang's loaders build them
from a checkpoint directory's configuration; their state dicts give the target names and
shapes. The checkpoint must hold the *source* names each loader reads (diffusers names for
Cosmos3, LeRobot/openpi names for π0.5: unfused q/k/v and gate/up). Each source name is
checked against SGLang's own mapping (Cosmos3: the DiT's ``param_names_mapping``; π0.5:
``Pi05PolicyModel._candidate_target_weights``), so a name SGLang would not load fails here.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .specs import PI05_TINY_VARIANTS, PI05_TINY_VISION_LAYERS, PI05_TINY_VOCAB


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: its checkpoint name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_INITIALIZED: dict[str, object] = {}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_sglang(model_path: Path, pipeline_class_name: str, port: int | None = None):
    """SGLang's global server args and a one-process model-parallel group, as its worker has
    them when it builds models; returns the ServerArgs. ``port``: the group's rendezvous port,
    a free one by default (a fixed one made two builders at once fail with EADDRINUSE)."""
    port = port or free_port()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    for key, value in (("LOCAL_RANK", "0"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    from sglang.multimodal_gen.runtime.server_args import ServerArgs, set_global_server_args

    args = ServerArgs.from_kwargs(
        model_path=str(model_path), pipeline_class_name=pipeline_class_name, num_gpus=1
    )
    set_global_server_args(args)
    if "parallel" not in _INITIALIZED:
        from sglang.multimodal_gen.runtime.distributed.parallel_state import (
            maybe_init_distributed_environment_and_model_parallel,
        )

        maybe_init_distributed_environment_and_model_parallel(
            tp_size=1, sp_size=1, distributed_init_method=f"tcp://127.0.0.1:{port}"
        )
        from sglang.srt.runtime_context import get_context, publish
        from sglang.srt.server_args import ServerArgs as SrtServerArgs

        if get_context()._server_args is None:
            publish(SrtServerArgs(model_path="dummy", tp_size=1), role="diffusion_gpu_worker")
        _INITIALIZED["parallel"] = True
    return args


# --- Cosmos3 -------------------------------------------------------------------------------


def cosmos3_meta_models(checkpoint: Path):
    """SGLang's ``Cosmos3OmniTransformer`` and ``AutoencoderKLWan`` on the meta device, built
    from ``checkpoint``'s configs the way its component loaders build them."""
    from sglang.multimodal_gen.runtime.models.dits.cosmos3video import Cosmos3OmniTransformer
    from sglang.multimodal_gen.runtime.models.vaes.wanvae import AutoencoderKLWan
    from sglang.multimodal_gen.runtime.utils.hf_diffusers_utils import (
        get_diffusers_component_config,
    )

    args = init_sglang(checkpoint, "Cosmos3OmniDiffusersPipeline")
    pipeline = args.pipeline_config
    tcfg = get_diffusers_component_config(component_path=str(checkpoint / "transformer"))
    pipeline.dit_config.update_model_arch(tcfg)
    tcfg.pop("_class_name", None)
    vcfg = get_diffusers_component_config(component_path=str(checkpoint / "vae"))
    vcfg.pop("_class_name", None)
    pipeline.vae_config.update_model_arch(vcfg)
    if hasattr(pipeline.vae_config, "post_init"):
        pipeline.vae_config.post_init()
    with torch.device("meta"):
        transformer = Cosmos3OmniTransformer(config=pipeline.dit_config, hf_config=tcfg)
        vae = AutoencoderKLWan(config=pipeline.vae_config)
    return transformer, vae, pipeline.dit_config.arch_config


_C3_LAYER = re.compile(r"^language_model\.layers\.(\d+)\.(.*)$")
_C3_GEN = re.compile(r"^gen_layers\.(\d+)\.(.*)$")
_C3_GEN_RENAMES = (
    ("cross_attention.to_out.", "self_attn.to_add_out."),
    ("cross_attention.norm_q.", "self_attn.norm_added_q."),
    ("cross_attention.norm_k.", "self_attn.norm_added_k."),
    ("input_layernorm.", "input_layernorm_moe_gen."),
    ("post_attention_layernorm.", "post_attention_layernorm_moe_gen."),
    ("mlp.", "mlp_moe_gen."),
)


def _cosmos3_source(name: str, shape: tuple[int, ...], q: int, kv: int) -> list[tuple[str, tuple]]:
    """Diffusers source names (and shapes) of one SGLang Cosmos3 DiT tensor."""

    def split(prefix: str, suffix: str, parts: list[tuple[str, int]]) -> list[tuple[str, tuple]]:
        return [(f"{prefix}{part}.{suffix}", (size, *shape[1:])) for part, size in parts]

    if name.startswith("language_model.embed_tokens."):
        return [(name.removeprefix("language_model."), shape)]
    if m := _C3_LAYER.match(name):
        i, rest = m.groups()
        if rest.startswith("self_attn.to_qkv."):
            suffix = rest.removeprefix("self_attn.to_qkv.")
            return split(
                f"layers.{i}.self_attn.", suffix, [("to_q", q), ("to_k", kv), ("to_v", kv)]
            )
        if rest.startswith("mlp.gate_up_proj."):
            half = shape[0] // 2
            suffix = rest.removeprefix("mlp.gate_up_proj.")
            return split(f"layers.{i}.mlp.", suffix, [("gate_proj", half), ("up_proj", half)])
        return [(f"layers.{i}.{rest}", shape)]
    if m := _C3_GEN.match(name):
        i, rest = m.groups()
        if rest.startswith("cross_attention.to_qkv."):
            suffix = rest.removeprefix("cross_attention.to_qkv.")
            parts = [("add_q_proj", q), ("add_k_proj", kv), ("add_v_proj", kv)]
            return split(f"layers.{i}.self_attn.", suffix, parts)
        if rest.startswith("mlp.gate_up_proj."):
            half = shape[0] // 2
            suffix = rest.removeprefix("mlp.gate_up_proj.")
            return split(
                f"layers.{i}.mlp_moe_gen.", suffix, [("gate_proj", half), ("up_proj", half)]
            )
        for old, new in _C3_GEN_RENAMES:
            if rest.startswith(old):
                return [(f"layers.{i}.{new}{rest.removeprefix(old)}", shape)]
        raise ValueError(f"no diffusers name for SGLang's Cosmos3 tensor {name}")
    return [(name, shape)]


def cosmos3_tensors(checkpoint: Path) -> dict[str, list[Tensor]]:
    """``{"transformer": [...], "vae": [...]}``: every tensor SGLang's Cosmos3 loaders read,
    under the names they read. The transformer's are checked against its mapping."""
    from sglang.multimodal_gen.runtime.loader.utils import get_param_names_mapping

    transformer, vae, arch = cosmos3_meta_models(checkpoint)
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    target = transformer.state_dict()
    rows = [
        Tensor(src, tuple(shape), torch.bfloat16)
        for name, value in target.items()
        for src, shape in _cosmos3_source(name, tuple(value.shape), q, kv)
    ]
    mapping = get_param_names_mapping(
        transformer.param_names_mapping, valid_target_names=set(target)
    )
    covered: dict[str, set] = {}
    for row in rows:
        name, index, total = mapping(row.name)
        if name not in target:
            raise AssertionError(f"SGLang maps {row.name} to {name!r}, not a Cosmos3 tensor")
        covered.setdefault(name, set()).add((index, total))
    missing = sorted(set(target) - set(covered))
    if missing:
        raise AssertionError(f"Cosmos3 tensors no source name maps to: {missing[:8]}")
    vae_rows = [
        Tensor(name, tuple(v.shape), torch.bfloat16 if v.is_floating_point() else v.dtype)
        for name, v in vae.state_dict().items()
    ]
    return {"transformer": rows, "vae": vae_rows}


# --- π0.5 ---------------------------------------------------------------------------------


@contextlib.contextmanager
def pi05_tiny_variants() -> Iterator[None]:
    """Teach SGLang's π0.5 core the tiny variants of ``specs.PI05_TINY_VARIANTS``: their
    Gemma shapes, a small vocabulary and a one-layer SigLIP. Only tiny checkpoints name
    those variants; the true variants are untouched."""
    from sglang.multimodal_gen.runtime.models.vlas import pi05_core

    original = (pi05_core.get_gemma_variant_config, pi05_core.PALIGEMMA_VOCAB_SIZE)
    original_mapping = pi05_core.CONFIG_MAPPING

    def variant(name: str):
        if name in PI05_TINY_VARIANTS:
            return pi05_core.GemmaVariantConfig(**PI05_TINY_VARIANTS[name])
        return original[0](name)

    class _Mapping:
        def __getitem__(self, key: str):
            factory = original_mapping[key]
            if key != "paligemma":
                return factory

            def paligemma(**kwargs):
                config = factory(**kwargs)
                config.vision_config.num_hidden_layers = PI05_TINY_VISION_LAYERS
                return config

            return paligemma

    pi05_core.get_gemma_variant_config = variant
    pi05_core.PALIGEMMA_VOCAB_SIZE = PI05_TINY_VOCAB
    pi05_core.CONFIG_MAPPING = _Mapping()
    try:
        yield
    finally:
        pi05_core.get_gemma_variant_config, pi05_core.PALIGEMMA_VOCAB_SIZE = original
        pi05_core.CONFIG_MAPPING = original_mapping


def is_tiny_pi05(checkpoint: Path) -> bool:
    import json

    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    return config.get("paligemma_variant") in PI05_TINY_VARIANTS


def pi05_meta_model(checkpoint: Path):
    """SGLang's ``Pi05CoreModel`` on the meta device, configured from ``checkpoint``'s
    ``config.json`` by ``Pi05PolicyModel._apply_checkpoint_config``; returns (model, config)."""
    from sglang.multimodal_gen.runtime.models.vlas.pi05_core import Pi05CoreModel
    from sglang.multimodal_gen.runtime.models.vlas.pi05_policy import Pi05PolicyModel

    args = init_sglang(checkpoint, "Pi05Pipeline")
    config = args.pipeline_config
    Pi05PolicyModel._apply_checkpoint_config(str(checkpoint), config)
    with torch.device("meta"):
        model = Pi05CoreModel(config, runtime_role="all", prefix_tensor_parallel=False)
    return model, config


def pi05_tensors(checkpoint: Path, lineage: str) -> list[Tensor]:
    """Every tensor SGLang's π0.5 loader needs, under LeRobot's names (``model.`` prefix)
    or openpi's (none): unfused q/k/v and gate/up, SigLIP ``vision_model.`` and ``out_proj``."""
    from sglang.multimodal_gen.runtime.models.vlas.pi05_policy import Pi05PolicyModel

    model, _ = pi05_meta_model(checkpoint)
    prefix = "model." if lineage == "lerobot" else ""
    target = model.state_dict()
    rows: list[Tensor] = []
    for name, value in target.items():
        shape = tuple(value.shape)
        parts: list[tuple[str, tuple]]
        if ".qkv_proj." in name:
            attention = model.get_submodule(name.split(".qkv_proj.")[0])
            sizes = (
                [attention.q_size, attention.kv_size, attention.kv_size]
                if hasattr(attention, "q_size")
                else [shape[0] // 3] * 3
            )
            parts = [
                (name.replace(".qkv_proj.", f".{part}."), (size, *shape[1:]))
                for part, size in zip(("q_proj", "k_proj", "v_proj"), sizes, strict=True)
            ]
        elif ".gate_up_proj." in name:
            half = (shape[0] // 2, *shape[1:])
            parts = [
                (name.replace(".gate_up_proj.", f".{p}."), half) for p in ("gate_proj", "up_proj")
            ]
        else:
            parts = [(name, shape)]
        for source, source_shape in parts:
            if ".vision_tower." in source:
                source = source.replace(".vision_tower.", ".vision_tower.vision_model.", 1)
                source = source.replace(".self_attn.proj.", ".self_attn.out_proj.")
            rows.append(Tensor(prefix + source, source_shape, value.dtype))
    resolved = set()
    for row in rows:
        candidates = [c for c, _ in Pi05PolicyModel._candidate_target_weights(row.name)]
        hit = next((c for c in candidates if c in target), None)
        if hit is None:
            raise AssertionError(f"SGLang's π0.5 loader would not load {row.name}")
        resolved.add(hit)
    missing = sorted(set(target) - resolved)
    if missing:
        raise AssertionError(f"π0.5 tensors no source name maps to: {missing[:8]}")
    return rows
