"""FSDP2 enhancement layer: ``fully_shard`` with two opt-in enhancements.

``npusim.distributed.fsdp.fully_shard`` has PyTorch's signature and return and
adds two keyword-only options:

- ``mem_cache``: all-gather outputs and reduce-scatter buffers come from a
  :class:`CommBufferCache` (``True``: the process-wide one; or a cache of your
  own), installed through FSDP2's public ``set_custom_all_gather`` /
  ``set_custom_reduce_scatter``. ``module._use_mem_cache = True`` (torch-npu's
  spelling) turns it on too, before wrapping or before the next forward.
- ``recompute_rule``: a forward run again inside backward (activation
  recompute) triggers no forward prefetch, and a reentrant recompute of a
  module run twice gets its own reduce-scatter and reshard (PyTorch 2.13
  drops that call's gradients); see the Notes in
  :mod:`npusim.distributed.fsdp.recompute`.

Neither replaces a PyTorch function, so ``audit_fsdp()`` stays clean and
training results are identical with and without them.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import fully_shard as _upstream_fully_shard

from npusim.distributed.fsdp.mem_cache import (
    CachedAllGather,
    CachedReduceScatter,
    CacheStats,
    CommBufferCache,
    default_cache,
)
from npusim.distributed.fsdp.recompute import in_backward, install_recompute_rule

__all__ = ["CacheStats", "CachedAllGather", "CachedReduceScatter", "CommBufferCache", "default_cache",
           "fully_shard", "in_backward", "mem_cache_stats", "release_mem_cache"]


def _install_mem_cache(module: FSDPModule, cache: CommBufferCache) -> None:
    module.set_custom_all_gather(CachedAllGather(cache))
    module.set_custom_reduce_scatter(CachedReduceScatter(cache))
    module._npusim_mem_cache = cache  # type: ignore[attr-defined]


def _late_mem_cache_hook(module: nn.Module, args: Any) -> None:
    """Honours ``_use_mem_cache = True`` set after wrapping (torch-npu sets it on the module)."""
    if getattr(module, "_use_mem_cache", False) and getattr(module, "_npusim_mem_cache", None) is None:
        _install_mem_cache(module, default_cache())  # type: ignore[arg-type]


@functools.wraps(_upstream_fully_shard)
def fully_shard(module: Any, *args: Any, mem_cache: bool | CommBufferCache | None = None,
                recompute_rule: bool = False, **kwargs: Any) -> Any:
    """PyTorch's ``fully_shard``, then the opt-in enhancements on the returned module(s).

    ``mem_cache=None`` (default) follows ``module._use_mem_cache``.
    """
    result = _upstream_fully_shard(module, *args, **kwargs)
    modules = list(module) if isinstance(module, list) else [module]
    for m in modules:
        wanted = getattr(m, "_use_mem_cache", False) if mem_cache is None else mem_cache
        if wanted:
            _install_mem_cache(m, mem_cache if isinstance(mem_cache, CommBufferCache) else default_cache())
        elif mem_cache is None:
            m.register_forward_pre_hook(_late_mem_cache_hook, prepend=True)
        if recompute_rule:
            install_recompute_rule(m)
    return result


def _signature() -> inspect.Signature:
    upstream = inspect.signature(_upstream_fully_shard)
    extra = [
        inspect.Parameter("mem_cache", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation="bool | CommBufferCache | None"),
        inspect.Parameter("recompute_rule", inspect.Parameter.KEYWORD_ONLY, default=False, annotation="bool"),
    ]
    return upstream.replace(parameters=[*upstream.parameters.values(), *extra])


fully_shard.__signature__ = _signature()  # type: ignore[attr-defined]


def mem_cache_stats() -> CacheStats:
    """Stats of the process-wide cache."""
    return default_cache().stats()


def release_mem_cache() -> int:
    """Frees the process-wide cache's idle buffers; returns the bytes freed."""
    return default_cache().release()
