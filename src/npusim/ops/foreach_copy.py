"""``aten::_foreach_copy_`` for the npu: the CUDA-aligned operator kernel (docs/SPEC.md 4.1, 4.2).

The kernel registered for ``aten::_foreach_copy_`` is native (csrc/aten/foreach_copy.cpp) and
decides every route itself (See Note [The _foreach_copy_ router]); this module registers it,
owns the functional ``_foreach_copy``, and offers the mode's accessors. Routing, per dtype group
of the lists:

- **fast**: one dtype, every tensor on one npu, dense, sizes and strides equal
  pair by pair (PyTorch's ``can_use_fast_route``) and a dtype the kernel
  supports: ``launch_foreach_copy`` per chunk of at most 48 pairs on the current
  stream, **asynchronous whatever the caller's non_blocking** (as CUDA's
  ``multi_tensor_apply``); the host never waits.
- **batch**: host<->device lists that the op-plugin's ``check_tensor_device_dtype_base``
  accepts, with npusim's per-pair correction: one batched memcpy with the caller's non_blocking.
- **slow**: ``self[i].copy_(src[i], non_blocking)`` pair by pair.
- **compat**: the profile has no kernel (DO_COMPATIBILITY): the slow path for
  the whole call, without grouping.

See Note [Legacy mode] for the kernel before the change.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from npusim import config
from npusim.runtime import acl

CHUNK = acl.SINGLE_FOREACH_OP_TENSOR_COUNT  # pairs per device task (aclnnForeachCopy limit)
MODES = config.FOREACH_COPY_MODES
MODE_ENV = "NPUSIM_FOREACH_COPY_MODE"

# Note [Legacy mode]
# Before the alignment the fast path handed the caller's non_blocking to the
# kernel, and with non_blocking=False (FSDP2's default) the host waited for the
# copy to finish. npusim keeps that behaviour selectable only so the difference
# can be measured (docs/SPEC.md section 6); it is never the recommended setting.


def _mode_from_env() -> str:
    return config.foreach_copy_mode()


def get_foreach_copy_mode() -> str:
    """The mode the kernel routes by: "aligned" or "legacy"."""
    return "legacy" if acl.foreach_copy_legacy() else "aligned"


def set_foreach_copy_mode(mode: str) -> str:
    """Selects "aligned" (default) or "legacy" (see Note [Legacy mode]); returns the previous mode."""
    if mode not in MODES:
        raise ValueError(f"npusim _foreach_copy_ mode: expected one of {MODES}, got {mode!r}")
    previous = get_foreach_copy_mode()
    acl.set_foreach_copy_legacy(mode == "legacy")
    return previous


@contextmanager
def foreach_copy_mode(mode: str) -> Iterator[str]:
    """Temporarily selects a ``_foreach_copy_`` mode."""
    previous = set_foreach_copy_mode(mode)
    try:
        yield mode
    finally:
        set_foreach_copy_mode(previous)


@contextmanager
def original_batch_eligibility() -> Iterator[None]:
    """Reproduces the op-plugin's uncorrected ``check_tensor_device_dtype_base``: pairs
    that differ in dtype or numel, or are not contiguous, still take the raw-byte batch
    copy and are silently corrupted. For the regression test only; no environment switch."""
    acl.set_original_batch_eligibility(True)
    try:
        yield
    finally:
        acl.set_original_batch_eligibility(False)


def foreach_copy(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False
                 ) -> list[torch.Tensor]:
    """The PrivateUse1 kernel of the functional ``aten::_foreach_copy``: fresh tensors
    like ``self`` filled by the npu kernel of ``_foreach_copy_``, so the same routes apply.

    Functionalization (``torch.compile``'s AOT tracing) turns ``_foreach_copy_``
    into this op; without this kernel its composite would copy pair by pair and a
    compiled graph that is not lowered by inductor (``aot_eager``, a fallback)
    would never reach the npu kernel. The outputs are fully overwritten (same
    sizes, or ``src`` broadcast as by ``copy_``), so they need not start as clones.
    """
    out = [torch.empty_like(t) for t in self]
    torch.ops.aten._foreach_copy_.default(out, src, non_blocking)
    return out


# The registrations live as long as these library objects (made by register()).
_libraries: list[torch.library.Library] = []


def register() -> None:
    """Registers the npu kernels of ``_foreach_copy_`` and ``_foreach_copy`` (idempotent), the
    kernel in the mode ``NPUSIM_FOREACH_COPY_MODE`` asks for."""
    if _libraries:
        return
    set_foreach_copy_mode(_mode_from_env())
    acl.register_foreach_copy_kernel()
    # A PrivateUse1 kernel takes precedence over the CompositeExplicitAutograd composite.
    functional = torch.library.Library("aten", "IMPL")
    functional.impl("_foreach_copy", foreach_copy, "PrivateUse1")
    _libraries.append(functional)
