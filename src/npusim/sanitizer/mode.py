"""The sanitizer's view of operations: a TorchDispatchMode that turns each op into stream accesses.

Every op on npu tensors is an operation on the current stream of their device
(CUDA's model, and npusim's: a compute op is a task on that stream, or work
the host does in its place when the stream is idle, Note [Compute on the
stream]): it reads the arguments its schema does not mark as written and
writes the others and its fresh outputs. Copies follow npusim's copy
rules (SPEC.md section 3), which decide which stream a copy is on and when the
host waits for it; ``_local_scalar_dense`` (``item()``) and blocking
device-to-host copies are host reads. View and metadata ops touch no memory.
An op on a stream an npu graph is capturing touches memory at the graph's
replays instead (Note [Sanitizer and npu graphs]).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from npusim.runtime import acl
from npusim.sanitizer.clocks import StreamKey
from npusim.sanitizer.spans import Span
from npusim.sanitizer.state import HOST_DEVICE, State

aten = torch.ops.aten
_NO_ACCESS = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
              aten.is_pinned.default, aten._has_compatible_shallow_copy_type.default,
              aten.set_.source_Storage, aten.set_.source_Storage_storage_offset, aten.set_.default,
              aten.resize_.default, aten._pin_memory.default}


_FACTORIES = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default}
# Copies into a fresh result (``.to``, ``.npu()``, ``.cpu()``, functionalized copies): each follows the
# copy rules of copy_ with the result as its destination. See Note [Copies into a fresh result].
_COPIES_TO_FRESH = {aten._to_copy.default, aten.copy.default, aten._foreach_copy.default}

# Note [Copies into a fresh result]
# ``h.to("npu", non_blocking=True)`` reaches the dispatch mode as one
# ``_to_copy``: the empty destination and the ``copy_`` into it happen below
# the mode, unseen. Read as a generic op it would be a host op reading ``h``
# with a fresh npu output, which misses what matters: with a pinned ``h`` the
# stream reads ``h`` later, so a host write to ``h`` before the stream got
# there is the PINNED race (and a non-blocking device-to-host ``.to`` writes
# its pinned result later, so reading it early is a HOST race). So these ops
# are recorded as ``copy_`` into their result, after they ran: the result is a
# fresh block of the stream current at the call, then the copy's accesses.


def _stack() -> traceback.StackSummary:
    frames = [(f, n) for f, n in traceback.walk_stack(None) if not f.f_code.co_filename.startswith(_OWN_DIR)]
    return traceback.StackSummary.extract(iter(frames), limit=24, lookup_lines=False)


_OWN_DIR = __file__.rsplit("/", 1)[0]


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


def span_of(t: torch.Tensor) -> Span | None:
    """The bytes of its storage ``t`` can touch; None for an empty tensor."""
    if t.numel() == 0:
        return None
    ptr = t.untyped_storage().data_ptr()
    if ptr == 0:
        return None
    size = t.element_size()
    lo = t.storage_offset() * size
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if n > 1)
    device = t.device.index if t.device.type == "npu" else HOST_DEVICE
    return Span((device, ptr), lo, lo + extent * size)


def current(state: State, device: int) -> StreamKey:
    """The current stream of ``device``; ``state`` learns from the core whether an npu graph captures
    it, so that a captured op's accesses go to the graph (Note [Sanitizer and npu graphs])."""
    stream_id, index, _ = acl.current_stream(device)
    s = StreamKey(index, stream_id)
    state.capturing(s, acl.stream_is_capturing(stream_id, index))
    return s


class SanitizerMode(TorchDispatchMode):
    """Records every op's accesses in ``state`` before it runs."""

    def __init__(self, state: State, drain: Callable[[], None], after_op: Callable[[], None]) -> None:
        super().__init__()
        self.state = state
        self.drain = drain  # memory events logged off the GIL, in order
        self.after_op = after_op

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        tensors = [t for a in (*args, *kwargs.values()) for t in _tensors(a)]
        if any(isinstance(t, FakeTensor) for t in tensors):
            return func(*args, **kwargs)  # shape propagation (DTensor, compile): no memory
        if any(is_traceable_wrapper_subclass(t) for t in tensors):
            return NotImplemented  # let the subclass (DTensor) unwrap; its inner ops come back here
        state = self.state
        state.ops += 1
        if func in _NO_ACCESS:
            out = func(*args, **kwargs)
            if func in _FACTORIES and isinstance(out, torch.Tensor) and out.device.type == "npu":
                span = span_of(out)
                if span is not None:
                    with state.lock:
                        self.drain()
                        state.allocated(span.storage, current(state, out.device.index))
            return out
        stack = _stack()
        name = func._schema.name
        if func in _COPIES_TO_FRESH:
            out = func(*args, **kwargs)
            with state.lock:
                self.drain()  # the result's allocation comes first
                non_blocking = bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
                sources = args[0] if func is aten._to_copy.default else args[1]
                for dst, src in zip(_tensors(out), _tensors(sources), strict=False):
                    _fresh(state, dst)
                    _copy(state, dst, src, non_blocking, name, stack)
            self.after_op()
            return out
        written: set[int] = set()
        with state.lock:
            self.drain()
            if func is aten.copy_.default:
                _copy(state, args[0], args[1], bool(args[2] if len(args) > 2 else kwargs.get("non_blocking")),
                      name, stack)
            elif func is aten._foreach_copy_.default:
                non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking"))
                for d, s in zip(args[0], args[1], strict=False):
                    _copy(state, d, s, non_blocking, name, stack)
            elif func is aten._local_scalar_dense.default:
                _host_read(state, args[0], name, stack)
            elif func is aten.record_stream.default:
                span = span_of(args[0])
                if span is not None:
                    state.record_stream(span.storage, StreamKey(args[1].device_index, args[1].stream_id))
            else:
                written = _generic(state, func, args, kwargs, name, stack)
        out = func(*args, **kwargs)
        if func not in (aten.copy_.default, aten._foreach_copy_.default, aten._local_scalar_dense.default,
                        aten.record_stream.default):
            with state.lock:
                self.drain()  # the op's own allocations come before its outputs' state
                _outputs(state, out, written, name, stack)
        self.after_op()
        return out


def _generic(state: State, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str,
             stack: traceback.StackSummary) -> set[int]:
    schema = func._schema
    accesses: list[tuple[torch.Tensor, bool]] = []
    for i, arg in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        write = arg.alias_info is not None and arg.alias_info.is_write
        accesses.extend((t, write) for t in _tensors(value))
    if not accesses:
        return set()
    if not any(write for _, write in accesses) and all(r.alias_info is not None for r in schema.returns) \
            and schema.returns:
        return set()  # a view: no memory is touched
    device = next((t.device.index for t, _ in accesses if t.device.type == "npu"), None)
    written: set[int] = set()
    if device is None:  # a host op: only host buffers a stream uses are of interest
        if state.storages:
            for t, write in accesses:
                span = span_of(t)
                if span is not None and span.storage in state.storages:
                    state.host_access(span, write, name, stack)
        return written
    s = current(state, device)
    seq, clock = state.clocks.issue(s)
    for t, write in accesses:
        span = span_of(t)
        if span is None:
            continue
        if span.storage[0] == HOST_DEVICE:
            if span.storage in state.storages:
                state.host_access(span, write, name, stack)
            continue
        state.stream_access(span, s, seq, clock, write, name, stack)
        if write:
            written.add(id(t))
    return written


def _outputs(state: State, out: Any, written: set[int], name: str, stack: traceback.StackSummary) -> None:
    """Fresh npu outputs are written by the op, on the stream current when it ran."""
    for t in _tensors(out):
        if id(t) in written or t.device.type != "npu" or is_traceable_wrapper_subclass(t):
            continue
        span = span_of(t)
        if span is None:
            continue
        s = current(state, t.device.index)
        if span.storage in state.storages:
            continue  # an alias of an input (already recorded)
        seq, clock = state.clocks.issue(s)
        state.stream_access(span, s, seq, clock, True, name, stack, alloc=True)


def _fresh(state: State, t: torch.Tensor) -> None:
    """``t`` is a new npu block, allocated on the stream current at the call (host memory is
    tracked only once a stream touches it)."""
    if t.device.type != "npu":
        return
    span = span_of(t)
    if span is not None:
        state.allocated(span.storage, current(state, t.device.index))


def _host_read(state: State, t: torch.Tensor, name: str, stack: traceback.StackSummary) -> None:
    """The host waits for the current stream, then reads ``t`` itself."""
    span = span_of(t)
    if span is None:
        return
    if span.storage[0] != HOST_DEVICE:
        state.clocks.host_sync_stream(current(state, span.storage[0]))
    state.host_access(span, False, name, stack)


def _copy(state: State, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool, name: str,
          stack: traceback.StackSummary) -> None:
    """One ``copy_`` as npusim runs it (SPEC.md section 3)."""
    dst_span, src_span = span_of(dst), span_of(src)
    if dst_span is None or src_span is None:
        return
    dst_npu, src_npu = dst.device.type == "npu", src.device.type == "npu"
    clocks = state.clocks
    if src_npu and dst_npu:
        s = current(state, src.device.index)
        if dst.device != src.device:  # a two-way barrier around the copy (CUDA's peer copy)
            d = current(state, dst.device.index)
            clocks.wait_stream(s, d)
        seq, clock = clocks.issue(s)
        state.stream_access(src_span, s, seq, clock, False, name, stack)
        state.stream_access(dst_span, s, seq, clock, True, name, stack)
        if dst.device != src.device:
            clocks.wait_stream(d, s)
    elif dst_npu:  # host -> device
        s = current(state, dst.device.index)
        seq, clock = clocks.issue(s)
        state.stream_access(dst_span, s, seq, clock, True, name, stack)
        if non_blocking and src.is_pinned():
            state.stream_access(src_span, s, seq, clock, False, name, stack)  # the stream reads it later
        else:
            state.host_access(src_span, False, name, stack)  # read (or staged) now
            if not non_blocking:
                clocks.host_sync_stream(s)
    elif src_npu:  # device -> host
        s = current(state, src.device.index)
        if non_blocking and dst.is_pinned():
            seq, clock = clocks.issue(s)
            state.stream_access(src_span, s, seq, clock, False, name, stack)
            state.stream_access(dst_span, s, seq, clock, True, name, stack)
        else:  # the host waits for the stream and the copy: a host read of the source
            _host_read(state, src, name, stack)
            state.host_access(dst_span, True, name, stack)
    else:
        state.host_access(src_span, False, name, stack)
        state.host_access(dst_span, True, name, stack)
