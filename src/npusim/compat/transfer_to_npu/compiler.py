"""``transfer_to_npu`` on torch.compile's view of the machine: no triton, no GPU in the cache key.

With ``torch.cuda.is_available()`` now answering for the npu, PyTorch's
``has_triton()`` could report triton's CUDA path usable; torch_npu's transfer_to_npu
makes it say False, and so does npusim, in ``torch.utils._triton`` and in every module
that imported the function by name (those imported later take the patched one).

Inductor keys its on-disk caches by the GPU it finds through
``torch.cuda.get_device_properties`` and reads CUDA's or ROCm's fields of the answer
(``gcnArchName`` where ``torch.version.cuda`` is None, as on this CPU build), which the
npu's properties do not have. The npu compiles through inductor's C++ kernels, keyed as
on a machine without a GPU, so ``CacheBase.get_system`` runs with a
``torch.cuda.get_device_properties`` that raises the RuntimeError inductor takes, there,
to mean "no CUDA" (PyTorch's own cannot serve: it reads ``torch.cuda``'s patched
``is_initialized`` and skips its initialisation).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import torch.utils._triton

from npusim.compat.transfer_to_npu.ledger import Ledger
from npusim.compat.transfer_to_npu.libraries import with_cuda_names

__all__ = ["has_triton", "patch", "repoint"]


def _no_gpu_for_cache_keys(device: Any = None) -> Any:
    raise RuntimeError("transfer_to_npu: inductor's cache key names no GPU (the npu compiles through C++ kernels)")


def has_triton(*args: Any, **kwargs: Any) -> bool:
    """``has_triton`` under transfer_to_npu: triton's CUDA path is not the npu's."""
    return False


def repoint(ledger: Ledger, name: str, original: Any, replacement: Any) -> None:
    """Sets ``name`` to ``replacement`` in every imported module where it is ``original``."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and namespace.get(name) is original:
            ledger.set(module, name, replacement)


def _patch_codecache(ledger: Ledger, module: ModuleType) -> None:
    get_system = with_cuda_names(module.CacheBase.get_system, {"get_device_properties": _no_gpu_for_cache_keys})
    ledger.set(module.CacheBase, "get_system", staticmethod(get_system))


def patch(ledger: Ledger) -> None:
    """Applies the torch.compile patches to ``ledger``."""
    repoint(ledger, "has_triton", torch.utils._triton.has_triton, has_triton)
    ledger.when_imported("torch._inductor.codecache", lambda module: _patch_codecache(ledger, module))
