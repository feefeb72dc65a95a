"""STAND-IN for ``sgl_kernel`` 0.4.10 on a GPU machine where the real one cannot load.

The real wheel is built against torch 2.14 and fails to load on torch 2.11 (undefined c10
symbols). SGLang's diffusion layers call only a few of its ops on CUDA; this module gives
those in plain torch (slower than the fused kernels, so timings measured with it are
conservative): the RMSNorm family and the ``*_and_mul`` activations. Any other attribute, of
this module or of a submodule, is a function that raises ``NotImplementedError`` naming
itself, so a call to an op that is not here shows in the server log instead of passing
silently. ``scalar_type.py`` and ``utils.py`` (pure Python) are the real wheel's, put beside
this file by tools/gpu/bundle.sh. Serve with ``--attention-backend torch_sdpa`` (no FA3).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__version__ = "0.4.10"
STANDIN = True


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float()
    return (y * ((1.0 + w) if gemma else w)).to(x.dtype)


def _into(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    out.copy_(result)
    return out


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # noqa: A002
    return _into(_rms(input, weight, eps), out)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):  # noqa: A002
    return _into(_rms(input, weight, eps, gemma=True), out)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):  # noqa: A002
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):  # noqa: A002
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, gemma=True))


def _and_mul(act: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, out):
    half = x.shape[-1] // 2
    return _into(act(x[..., :half]) * x[..., half:], out)


def silu_and_mul(input, out=None, enable_pdl=None):  # noqa: A002
    return _and_mul(F.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):  # noqa: A002
    return _and_mul(F.gelu, input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):  # noqa: A002
    return _and_mul(lambda t: F.gelu(t, approximate="tanh"), input, out)


def _missing(name: str) -> Callable[..., Any]:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name} is not in the torch stand-in")

    op.__name__ = name
    return op


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)


_HERE = os.path.dirname(os.path.abspath(__file__))


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel.<sub>``: the real pure-Python file where one is here, else a module whose
    every attribute is a ``_missing`` op."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("sgl_kernel."):
            return None
        relative = fullname.split(".", 1)[1].replace(".", os.sep)
        if os.path.exists(os.path.join(_HERE, relative + ".py")):
            return None  # the normal path finder loads it
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        prefix = spec.name[len("sgl_kernel.") :]

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return _missing(f"{prefix}.{name}")

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _Submodules())
