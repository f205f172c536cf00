"""``aten::_foreach_copy_`` for the npu: the CUDA-aligned operator kernel (docs/SPEC.md 4.1, 4.2).

The kernel registered for ``aten::_foreach_copy_`` is native (csrc/foreach_copy.cpp):
it takes the fast route itself and hands every other call to :func:`foreach_copy_`,
the routing below, as ``npusim::_foreach_copy_routed``; this module pushes the mode
it reads. See Note [Native _foreach_copy_ kernel].

Routing, per dtype group of the lists:

- **fast**: one dtype, every tensor on one npu, dense, sizes and strides equal
  pair by pair (PyTorch's ``can_use_fast_route``) and a dtype the kernel
  supports: ``launch_foreach_copy`` per chunk of at most 48 pairs on the current
  stream, **asynchronous whatever the caller's non_blocking** (as CUDA's
  ``multi_tensor_apply``); the host never waits.
- **batch**: host<->device lists that ``_batch_device`` accepts: one batched
  memcpy with the caller's non_blocking.
- **slow**: ``self[i].copy_(src[i], non_blocking)`` pair by pair.
- **compat**: the profile has no kernel (DO_COMPATIBILITY): the slow path for
  the whole call, without grouping.

See Note [Legacy mode] for the kernel before the change.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from npusim import config
from npusim.ops import trace as _trace
from npusim.ops.trace import CallRecord, GroupRecord, Route
from npusim.runtime import acl, profiles

CHUNK = acl.SINGLE_FOREACH_OP_TENSOR_COUNT  # pairs per device task (aclnnForeachCopy limit)
MODES = config.FOREACH_COPY_MODES
MODE_ENV = "NPUSIM_FOREACH_COPY_MODE"

# Note [Legacy mode]
# Before the alignment the fast path handed the caller's non_blocking to the
# kernel, and with non_blocking=False (FSDP2's default) the host waited for the
# copy to finish. npusim keeps that behaviour selectable only so the difference
# can be measured (docs/SPEC.md section 6); it is never the recommended setting.


# torch.profiler ranges naming the route taken, e.g. "npusim::foreach_copy[fast]"; with the
# profiler off a range costs one C call.
_profiler_enabled = torch._C._autograd._profiler_enabled
_RANGES = {route: f"npusim::foreach_copy[{route}]" for route in ("fast", "batch", "slow", "compat")}
_NO_RANGE = nullcontext()


def _range(route: Route) -> AbstractContextManager[object]:
    return torch.profiler.record_function(_RANGES[route]) if _profiler_enabled() else _NO_RANGE


def _mode_from_env() -> str:
    return config.foreach_copy_mode()


_mode: str = _mode_from_env()
# Regression only (see original_batch_eligibility): batch without npusim's
# per-pair dtype / numel / contiguity correction.
_original_batch_eligibility = False


def get_foreach_copy_mode() -> str:
    return _mode


def set_foreach_copy_mode(mode: str) -> str:
    """Selects "aligned" (default) or "legacy" (see Note [Legacy mode]); returns the previous mode."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"npusim _foreach_copy_ mode: expected one of {MODES}, got {mode!r}")
    acl.set_foreach_copy_legacy(mode == "legacy")  # the native kernel's mirror
    previous, _mode = _mode, mode
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
    global _original_batch_eligibility
    previous, _original_batch_eligibility = _original_batch_eligibility, True
    try:
        yield
    finally:
        _original_batch_eligibility = previous


def _batch_device(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool) -> int | None:
    """The op-plugin's ``check_tensor_device_dtype_base`` plus npusim's correction: the npu
    index the batched memcpy runs on, or None when the lists are not eligible."""
    dst_device, src_device = self[0].device, src[0].device
    # One device per list also rules out mixed directions (some H2D, some D2H).
    if any(t.device != dst_device for t in self) or any(t.device != src_device for t in src):
        return None
    if dst_device.type == "npu" and src_device.type == "cpu":
        npu = dst_device
    elif dst_device.type == "cpu" and src_device.type == "npu":
        npu = src_device
    else:  # device-to-device (or host-to-host within a mixed list)
        return None
    if non_blocking and npu.index != acl.current_device():
        return None  # the async batch is enqueued on the current device's stream
    # The batch copies src's raw bytes: anything but the same byte layout corrupts data.
    if not _original_batch_eligibility and not acl.same_byte_layouts(self, src):
        return None
    return npu.index


def _slow(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool) -> None:
    # copy_ bumps each destination's version counter itself.
    for d, s in zip(self, src, strict=True):
        d.copy_(s, non_blocking=non_blocking)


def _process(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool,
             profile: profiles.Profile, fast_route: bool | None) -> tuple[Route, int, bool]:
    """Copies one dtype group; returns (route, chunks, non_blocking passed down).
    ``fast_route`` is ``nd_out and can_use_fast_route`` when the caller already knows it."""
    if fast_route is None:
        fast_route = profile.nd_out and acl.can_use_fast_route(self, src)
    # can_use_fast_route puts every tensor on one device; a group of a mixed-device
    # list may be host-only, which the device kernel cannot copy.
    if fast_route and src[0].device.type == "npu" and src[0].dtype in profile.fast_dtypes:
        passed = True if _mode == "aligned" else non_blocking
        with _range("fast"):
            chunks = acl.launch_foreach_copy(self, src, not passed, profile.sync_timeout_s)
        return "fast", chunks, passed
    # A fast route (e.g. a dtype the kernel lacks) is device-to-device: never batch-eligible.
    if not fast_route and profile.batch and profile.memcpy_batch_available(non_blocking):
        device = _batch_device(self, src, non_blocking)
        if device is not None:
            with _range("batch"):
                if non_blocking:
                    acl.memcpy_batch_async(self, src)
                else:
                    acl.memcpy_batch(self, src, profile.sync_timeout_s)
            return "batch", 1, non_blocking
    with _range("slow"):
        _slow(self, src, non_blocking)
    return "slow", 0, non_blocking


def _group_by_src_dtype(self: list[torch.Tensor], src: list[torch.Tensor]
                        ) -> dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    groups: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # insertion = first appearance
    for d, s in zip(self, src, strict=True):
        group = groups.get(s.dtype)
        if group is None:
            group = groups[s.dtype] = ([], [])
        group[0].append(d)
        group[1].append(s)
    return groups


def foreach_copy_(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> None:
    """The routing of ``aten::_foreach_copy_(Tensor(a!)[] self, Tensor[] src, bool
    non_blocking=False) -> ()`` on the npu, the kernel of ``npusim::_foreach_copy_routed``:
    same argument errors, results and version-counter bumps (one per destination) as
    upstream; routes per docs/SPEC.md 4.1."""
    profile = profiles.get_profile()
    if not profile.foreach_copy_kernel:
        # Upstream's slow kernel, which DO_COMPATIBILITY falls back to, begins with the same checks.
        acl.check_foreach_api_restrictions(self, src)
        with _range("compat"):
            _slow(self, src, non_blocking)
        if _trace._active:
            group = GroupRecord("compat", len(self), 0, non_blocking, None)
            _trace.emit(CallRecord((group,), non_blocking, _mode))
        return
    acl.check_foreach_api_restrictions(self, src)
    fast_route = profile.nd_out and acl.can_use_fast_route(self, src)
    # can_use_fast_route implies one dtype across both lists, so the common case
    # needs no per-tensor dtype scan.
    dtype = src[0].dtype
    if fast_route or all(s.dtype == dtype for s in src):
        route, chunks, passed = _process(self, src, non_blocking, profile, fast_route)
        if _trace._active:
            group = GroupRecord(route, len(self), chunks, passed, dtype)
            _trace.emit(CallRecord((group,), non_blocking, _mode))
        return
    records: list[GroupRecord] = []
    for group_dtype, (group_self, group_src) in _group_by_src_dtype(self, src).items():
        route, chunks, passed = _process(group_self, group_src, non_blocking, profile, None)
        records.append(GroupRecord(route, len(group_self), chunks, passed, group_dtype))
    if _trace._active:
        _trace.emit(CallRecord(tuple(records), non_blocking, _mode))


def foreach_copy(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False
                 ) -> list[torch.Tensor]:
    """The PrivateUse1 kernel of the functional ``aten::_foreach_copy``: fresh tensors
    like ``self`` filled by :func:`foreach_copy_`, so the same routes apply.

    Functionalization (``torch.compile``'s AOT tracing) turns ``_foreach_copy_``
    into this op; without this kernel its composite would copy pair by pair and a
    compiled graph that is not lowered by inductor (``aot_eager``, a fallback)
    would never reach the npu kernel. The outputs are fully overwritten (same
    sizes, or ``src`` broadcast as by ``copy_``), so they need not start as clones.
    """
    out = [torch.empty_like(t) for t in self]
    foreach_copy_(out, src, non_blocking)
    return out


# The registrations live as long as these library objects (made by register()).
_libraries: list[torch.library.Library] = []


def register() -> None:
    """Registers the npu kernels of ``_foreach_copy_`` and ``_foreach_copy`` (idempotent).

    The native kernel's way into the routing, the op it calls and the mode it mirrors,
    exist before the kernel is registered (See Note [Native _foreach_copy_ kernel])."""
    if _libraries:
        return
    routed = torch.library.Library("npusim", "FRAGMENT")
    routed.define("_foreach_copy_routed(Tensor(a!)[] self, Tensor[] src, bool non_blocking=False) -> ()")
    routed.impl("_foreach_copy_routed", foreach_copy_, "PrivateUse1")
    set_foreach_copy_mode(_mode)
    acl.register_foreach_copy_kernel()
    # A PrivateUse1 kernel takes precedence over the CompositeExplicitAutograd composite.
    functional = torch.library.Library("aten", "IMPL")
    functional.impl("_foreach_copy", foreach_copy, "PrivateUse1")
    _libraries.extend((routed, functional))
