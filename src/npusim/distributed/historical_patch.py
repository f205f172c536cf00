"""The old torch-npu FSDP2 collectives patch, reproduced for comparison only.

Before the NPU ``_foreach_copy_`` fast path was aligned with CUDA (see
docs/SPEC.md section 5 and the design review it restates), torch-npu overrode three
pieces of PyTorch's FSDP2 so that the two same-device foreach copies ran with
``non_blocking=True``:

- ``_fsdp_collectives._get_param_all_gather_inputs`` (the all-gather input cast),
- ``fsdp::all_gather_copy_in`` (the copy into the all-gather buffer), and
- ``FSDPParamGroup.finalize_backward``.

npusim never needs this: its fast path already queues same-device copies on the
stream. The patch exists so benchmarks and the auditor can compare against it.
It is applied only by :func:`apply_historical_patch` (or the
:func:`historical_patch` context manager) and undone by
:func:`remove_historical_patch`; importing this module changes nothing.

PyTorch 2.13's FSDP2 reaches the copy-in through ``torch.ops.fsdp.all_gather_copy_in``,
whose PrivateUse1 kernel is ``all_gather_copy_in_cuda``. The old patch rebound
the ``torch.ops.fsdp`` attribute; here the PrivateUse1 kernel is overridden
instead, which reaches every caller (``.default`` included) with the same effect.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_collectives
from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam, ShardedState
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

__all__ = [
    "HISTORICAL_TARGETS",
    "apply_historical_patch",
    "historical_patch",
    "is_historical_patch_applied",
    "remove_historical_patch",
]

# What the patch replaces, named as the auditor names it.
HISTORICAL_TARGETS: tuple[str, ...] = (
    "torch.distributed.fsdp._fully_shard._fsdp_collectives._get_param_all_gather_inputs",
    "fsdp::all_gather_copy_in[PrivateUse1]",
    "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup.finalize_backward",
)


@torch.no_grad()
def _historical_get_param_all_gather_inputs(fsdp_params: list[FSDPParam]) -> list[list[torch.Tensor]]:
    """Upstream ``_get_param_all_gather_inputs`` with the old NPU ``non_blocking=True`` copy."""
    inputs: list[list[torch.Tensor]] = [[] for _ in fsdp_params]
    copy_indices: list[int] = []
    copy_srcs: list[torch.Tensor] = []
    for i, fsdp_param in enumerate(fsdp_params):
        # Same fast-path condition as upstream: a plain cast of the local shard.
        if (
            fsdp_param.param_dtype is not None
            and not fsdp_param.offload_to_cpu
            and not hasattr(fsdp_param._sharded_local_tensor, "fsdp_pre_all_gather")
        ):
            copy_indices.append(i)
            copy_srcs.append(
                fsdp_param._sharded_param_data
                if fsdp_param.sharded_state == ShardedState.SHARDED
                else cast(torch.Tensor, fsdp_param._sharded_post_forward_param_data)
            )
        else:
            inputs[i] = fsdp_param.all_gather_inputs
    if copy_srcs:
        first = fsdp_params[copy_indices[0]]
        numels = [t.numel() for t in copy_srcs]
        flat = torch.empty((sum(numels),), device=first.device, dtype=first.param_dtype)
        splits = torch.split(flat, numels)
        # The historical NPU patch: same device -> force non_blocking=True.
        if splits[0].device == copy_srcs[0].device:
            torch._foreach_copy_(splits, copy_srcs, non_blocking=True)
        else:
            torch._foreach_copy_(splits, copy_srcs)
        for i, split in zip(copy_indices, splits, strict=True):
            inputs[i] = [split]
    return inputs


def _historical_all_gather_copy_in(
    all_gather_inputs: list[torch.Tensor],
    all_gather_output: torch.Tensor,
    inp_split_sizes: list[int],
    all_gather_input_numel: int,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PrivateUse1 kernel of ``fsdp::all_gather_copy_in`` with the old ``non_blocking=True`` copy.

    Same contract as upstream: returns this rank's slice of ``all_gather_output``
    (filled from ``all_gather_inputs``) and the output itself.
    """
    all_gather_input = all_gather_output.narrow(0, all_gather_input_numel * rank, all_gather_input_numel)
    dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        # The historical NPU patch: same device -> force non_blocking=True.
        if dsts[0].device == all_gather_inputs[0].device:
            torch._foreach_copy_(dsts, all_gather_inputs, non_blocking=True)
        else:
            torch._foreach_copy_(dsts, all_gather_inputs)
    return all_gather_input, all_gather_output


def _historical_finalize_backward(self: FSDPParamGroup) -> None:
    """The old patched ``finalize_backward``, in PyTorch 2.13 terms.

    It waits on this group's own post-reduce event (``_wait_for_post_backward``)
    rather than on every stream's last event in ``comm_ctx``; that still orders
    the current stream after every group's reduction because FSDP finalizes all
    groups at the end of the last backward. A stray all-gather is waited on the
    group's device stream (the old patch named ``torch.npu`` directly).
    """
    self._wait_for_post_backward()
    for fsdp_param in self.fsdp_params:
        if fsdp_param.grad_offload_event is not None:
            fsdp_param.grad_offload_event.synchronize()
            fsdp_param.grad_offload_event = None
    if self._all_gather_result is not None:
        # An unshard that nobody waited for: wait now so its buffers can go.
        if (event := self._all_gather_result.all_gather_event) is not None:
            self.device_handle.current_stream().wait_event(event)
        work = self._all_gather_result.all_gather_work
        if isinstance(work, dist.distributed_c10d.Work):
            work.wait()
        self._all_gather_result = None
    self._post_forward_indices.clear()


class _Applied(NamedTuple):
    get_inputs: Any  # the upstream module attribute that was replaced
    finalize_backward: Any  # the upstream class attribute that was replaced
    library: torch.library.Library  # owns the PrivateUse1 kernel override


_applied: _Applied | None = None


def is_historical_patch_applied() -> bool:
    """Whether :func:`apply_historical_patch` is in effect."""
    return _applied is not None


def apply_historical_patch() -> None:
    """Install the three historical overrides. Idempotent."""
    global _applied
    if _applied is not None:
        return
    library = torch.library.Library("fsdp", "IMPL")
    with warnings.catch_warnings():
        # Overriding PyTorch's kernel is the point; its warning is expected.
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        library.impl("all_gather_copy_in", _historical_all_gather_copy_in, "PrivateUse1")
    _applied = _Applied(
        _fsdp_collectives._get_param_all_gather_inputs, FSDPParamGroup.__dict__["finalize_backward"], library
    )
    _fsdp_collectives._get_param_all_gather_inputs = _historical_get_param_all_gather_inputs
    FSDPParamGroup.finalize_backward = _historical_finalize_backward


def remove_historical_patch() -> None:
    """Restore PyTorch's own implementations. A no-op when the patch is not applied.

    Raises ``RuntimeError`` if something else replaced a patched target on top
    of this patch, rather than silently discarding that replacement.
    """
    global _applied
    if _applied is None:
        return
    current = {
        "_get_param_all_gather_inputs": _fsdp_collectives._get_param_all_gather_inputs,
        "FSDPParamGroup.finalize_backward": FSDPParamGroup.__dict__["finalize_backward"],
    }
    ours = {
        "_get_param_all_gather_inputs": _historical_get_param_all_gather_inputs,
        "FSDPParamGroup.finalize_backward": _historical_finalize_backward,
    }
    for name, value in current.items():
        if value is not ours[name]:
            raise RuntimeError(
                f"remove_historical_patch: expected {name} to be the historical patch's function "
                f"but got {value!r}; something patched it afterwards"
            )
    _fsdp_collectives._get_param_all_gather_inputs = _applied.get_inputs
    FSDPParamGroup.finalize_backward = _applied.finalize_backward
    # Destroying the library deregisters our kernel; the dispatcher falls back
    # to the kernel it shadowed, PyTorch's own.
    _applied.library._destroy()
    _applied = None


@contextmanager
def historical_patch() -> Iterator[None]:
    """Apply the historical patch for the duration of a ``with`` block."""
    was_applied = is_historical_patch_applied()
    apply_historical_patch()
    try:
        yield
    finally:
        if not was_applied:
            remove_historical_patch()
