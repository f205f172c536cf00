"""Device memory of the ``torch.npu`` module: torch.cuda's memory API over the
caching allocator of the device core (see Note [Caching allocator] in
``csrc/runtime/device_cache.cpp``), its settings (``PYTORCH_NPU_ALLOC_CONF``, Note
[Allocator settings] in ``npusim/config.py``) and its private pools (``MemPool``,
``use_mem_pool``, the graph-tree checkpoints; Note [Private pools] in
``csrc/runtime/private_pools.cpp``).

The statistics are CUDA's (``allocated_bytes.all.current``, ...): the core's
``c10::DeviceAllocator::getDeviceStats`` fills them and :func:`memory_stats` flattens
them as ``torch.accelerator.memory_stats`` does, so both report the same. The functions
here reach the core through torch's C++ bindings, never through the ``torch.accelerator``
module: frameworks replace that module with one built from ``torch.npu``'s functions
(MindSpeed does), which would then call themselves.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from npusim import config
from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index

__all__ = [
    "MemPool", "caching_allocator_alloc", "caching_allocator_delete", "empty_cache", "get_allocator_backend",
    "get_per_process_memory_fraction", "host_empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "max_memory_allocated", "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory_allocated",
    "memory_cached", "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_peak_host_memory_stats",
    "reset_peak_memory_stats", "set_memory_capacity", "set_per_process_memory_fraction", "use_mem_pool",
]


def _index(device: _device_t) -> int:
    index = _get_device_index(device)
    if not 0 <= index < acl.device_count():
        raise RuntimeError(f"Invalid device argument: npu:{index}; expected 0 <= index < device_count() = "
                           f"{acl.device_count()}")
    return index


def memory_stats(device: _device_t = None) -> collections.OrderedDict[str, Any]:
    """CUDA's flat statistics (``"<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>"``,
    ``num_ooms``, ``num_alloc_retries``, ...)."""
    index = _index(device)
    if not torch._C._accelerator_isAllocatorInitialized():
        return collections.OrderedDict()
    flat: list[tuple[str, Any]] = []

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    flatten("", torch._C._accelerator_getDeviceStats(index))
    return collections.OrderedDict(sorted(flat))


def memory_stats_as_nested_dict(device: _device_t = None) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device: _device_t = None) -> int:
    warnings.warn("torch.npu.memory_cached has been renamed to torch.npu.memory_reserved", FutureWarning,
                  stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device: _device_t = None) -> int:
    warnings.warn("torch.npu.max_memory_cached has been renamed to torch.npu.max_memory_reserved",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def reset_peak_memory_stats(device: _device_t = None) -> None:
    acl.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _device_t = None) -> None:
    acl.reset_accumulated_memory_stats(_index(device))


def reset_max_memory_allocated(device: _device_t = None) -> None:
    warnings.warn("torch.npu.reset_max_memory_allocated now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: _device_t = None) -> None:
    warnings.warn("torch.npu.reset_max_memory_cached now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Returns cached blocks that no stream can still touch to the host."""
    acl.empty_cache()


def host_empty_cache() -> None:
    """Nothing to release: pinned host blocks are returned to the host when freed, never cached
    (torch_npu: releases the pinned-memory cache)."""


def set_memory_capacity(nbytes: int | str | None, device: _device_t = None) -> None:
    """Sets the device's total memory (None: the profile's HBM size); over it, OutOfMemoryError."""
    from npusim.runtime.profiles import get_profile

    if nbytes is None:
        value = get_profile().total_memory
    else:
        value = config.parse_bytes(nbytes) if isinstance(nbytes, str) else int(nbytes)
    acl.set_memory_capacity(_index(device), value)


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) bytes: total is the device's capacity, free what the allocator has not reserved."""
    return torch._C._accelerator_getMemoryInfo(_index(device))


def set_per_process_memory_fraction(fraction: float, device: _device_t = None) -> None:
    """Caps what this process may reserve on the device at ``fraction`` of its total memory."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    acl.set_memory_fraction(_index(device), fraction)


def get_per_process_memory_fraction(device: _device_t = None) -> float:
    return acl.memory_fraction(_index(device))


def get_allocator_backend() -> str:
    """``"native"``: the device core's caching allocator (there is no async backend)."""
    return "native"


_raw_allocations: dict[int, torch.Tensor] = {}


def caching_allocator_alloc(size: int, device: _device_t = None, stream: torch.Stream | None = None) -> int:
    """Allocates ``size`` bytes from the caching allocator on ``stream``; returns the address."""
    from npusim.runtime.streams import current_stream
    from npusim.runtime.streams import stream as stream_context

    index = _index(device)
    if stream is None:
        stream = current_stream(index)
    if not isinstance(stream, torch.Stream):
        raise TypeError("Invalid type for stream argument, must be `torch.npu.Stream`")
    with stream_context(stream):
        block = torch.empty(size, dtype=torch.uint8, device=torch.device("npu", index))
    _raw_allocations[block.data_ptr()] = block
    return block.data_ptr()


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees memory from :func:`caching_allocator_alloc` (stream-ordered)."""
    if _raw_allocations.pop(mem_ptr, None) is None:
        raise RuntimeError(f"caching_allocator_delete: {mem_ptr:#x} was not allocated by caching_allocator_alloc")


def host_memory_stats() -> dict[str, int]:
    """Pinned host memory statistics under CUDA's keys (``allocations``, ``allocated_bytes``,
    ``active_requests``, ``active_bytes``, each ``.current/.peak/.allocated/.freed``; ``num_host_alloc``,
    ``num_host_free``): Note [Pinned host memory statistics] in csrc/runtime/host_allocator.cpp."""
    return dict(acl.host_memory_stats())


def reset_peak_host_memory_stats() -> None:
    """Each pinned host memory ``.peak`` back to its ``.current``, as torch.cuda's."""
    acl.reset_peak_host_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Each pinned host memory ``.allocated`` / ``.freed`` and the alloc / free counts to zero, as torch.cuda's."""
    acl.reset_accumulated_host_memory_stats()


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in host_memory_stats().items():
        name, _, leaf = key.partition(".")
        if leaf:
            nested.setdefault(name, {})[leaf] = value
        else:
            nested[name] = value
    return nested


# ---- settings (PYTORCH_NPU_ALLOC_CONF) -----------------------------------------

_conf = config.AllocConf()  # what the allocator holds


def _apply_alloc_conf(conf: config.AllocConf) -> None:
    global _conf
    acl.set_allocator_settings(-1 if conf.max_split_size is None else conf.max_split_size,
                               -1 if conf.max_non_split_rounding is None else conf.max_non_split_rounding,
                               conf.large_segment_size, conf.garbage_collection_threshold,
                               list(conf.roundup_power2_divisions), conf.expandable_segments)
    if conf.per_process_memory_fraction is not None:
        for index in range(acl.device_count()):
            acl.set_memory_fraction(index, conf.per_process_memory_fraction)
    _conf = conf


def _read_alloc_conf() -> None:
    """Reads ``PYTORCH_NPU_ALLOC_CONF`` into the allocator; the allocator calls this when it initialises
    (its first allocation or call), so a variable set after ``import`` is honoured."""
    _apply_alloc_conf(config.alloc_conf())


def _set_allocator_settings(settings: str) -> None:
    """torch_npu's ``torch.npu.memory._set_allocator_settings``: re-parses ``settings`` now, with the keys
    torch_npu allows there (``expandable_segments``, ``max_split_size_mb``, ``max_non_split_rounding_mb``,
    ``per_process_memory_fraction``, ...) and ``roundup_power2_divisions`` as torch.cuda's; others raise
    ``ValueError``. As in torch_npu, the
    environment's settings are read first, and ``max_split_size_mb``, ``garbage_collection_threshold``
    and ``roundup_power2_divisions`` return to their defaults unless given."""
    acl.ensure_allocator_settings()
    _apply_alloc_conf(config.parse_alloc_conf(settings, base=_conf, name="torch.npu.memory._set_allocator_settings",
                                              allowed=config.ALLOC_CONF_RUNTIME_KEYS))


# ---- private pools (torch.cuda.MemPool, use_mem_pool, graph trees) --------------

class MemPool:
    """torch.cuda.MemPool's contract: a private pool of the caching allocator on the device current at
    construction. Allocations made inside :func:`use_mem_pool` come from it and its freed blocks are
    reused only by its own allocations; it lives while this object, a graph captured into it
    (``capture_begin(pool=pool.id)``) or an open ``use_mem_pool`` holds it, and its free segments go
    back to the host at the next ``empty_cache`` after that. ``use_on_oom``: an allocation outside
    the pool that would fail takes a free block of the pool first. ``no_split``: its segments are
    not split. Pluggable allocators are not simulated: ``allocator`` must be None."""

    def __init__(self, allocator: object | None = None, use_on_oom: bool = False, no_split: bool = False) -> None:
        if allocator is not None:
            raise RuntimeError("torch.npu.MemPool: pluggable allocators are not simulated; the device core's caching "
                               "allocator serves every pool (allocator must be None)")
        from npusim.runtime.device import current_device

        self._device = current_device()
        self._id: acl.PoolId = acl.new_mempool_id(True)
        acl.create_or_incref_pool(self._device, self._id, bool(no_split), bool(use_on_oom))

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, as graphs and ``use_mem_pool`` name it."""
        return self._id

    @property
    def allocator(self) -> None:
        return None

    def use_count(self) -> int:
        """How many hold the pool: this object, graphs captured into it, open ``use_mem_pool`` blocks."""
        return acl.pool_use_count(self._device, self._id)

    def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        """The pool's segments, as :func:`memory_snapshot` lists them."""
        return memory_snapshot(self._id)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the core may be gone
            acl.release_pool(self._device, self._id)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: _device_t = None) -> Iterator[None]:
    """Routes the calling thread's allocations on ``device`` (default: the current one) to ``pool``, as
    torch.cuda.use_mem_pool does (other threads, e.g. autograd's, are not routed)."""
    index = _index(device)
    acl.begin_allocate_current_thread_to_pool(index, pool.id)
    try:
        yield
    finally:
        acl.end_allocate_to_pool(index, pool.id)
        acl.release_pool(index, pool.id)


def _npu_getCheckpointState(device: int, pool: tuple[int, int]) -> Any:  # noqa: N802  (torch_npu's name)
    """The layout of private pool ``pool`` (CUDA's ``_cuda_getCheckpointState``), for
    :func:`_npu_setCheckpointPoolState`."""
    return acl.checkpoint_pool(_index(device), tuple(pool))


def _npu_setCheckpointPoolState(device: int, state: Any, stale_storages: Sequence[int],  # noqa: N802
                                storages_to_add_deleters_to: Sequence[int]) -> None:
    """CUDA's ``_cuda_setCheckpointPoolState``: restores the pool to ``state``; the storages (``_cdata``
    pointers) in ``stale_storages`` whose blocks it frees lose their deleter, and those in
    ``storages_to_add_deleters_to`` get the blocks it allocates at their addresses."""
    if state.device != _index(device):
        raise RuntimeError(f"_npu_setCheckpointPoolState: the state is of npu:{state.device}, not npu:{device}")
    acl.set_checkpoint_pool_state(state, list(stale_storages), list(storages_to_add_deleters_to))


def _npu_checkPoolLiveAllocations(device: int, pool: tuple[int, int], expected: set[int]) -> bool:  # noqa: N802
    """CUDA's ``_cuda_checkPoolLiveAllocations``: whether the pool's allocated blocks are exactly ``expected``."""
    return set(acl.pool_live_allocations(_index(device), tuple(pool))) == set(expected)


# ---- snapshots and history (torch.cuda.memory._snapshot, ...) ----------------

def _snapshot(device: _device_t = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """Segments of every device and each device's alloc / free trace (while recording).

    ``augment_with_fx_traces``: as torch.cuda, frames of FX-generated code get their node and the model
    source behind it (``torch._utils._augment_memory_snapshot_stack_traces``); npusim records no stack
    frames (see :func:`_record_memory_history`), so today no frame is mapped."""
    snapshot = {
        "segments": acl.memory_snapshot(),
        "device_traces": [acl.memory_trace(index) for index in range(acl.device_count())],
        # What the allocator holds, and the keys accepted without effect (Note [Allocator settings]).
        "allocator_settings": {**acl.allocator_settings(), "without_effect": dict(_conf.without_effect)},
    }
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def memory_snapshot(mempool_id: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Every segment of every device (or of private pool ``mempool_id``), as torch.cuda.memory_snapshot
    lists them, each with its blocks."""
    if mempool_id is None:
        return _snapshot()["segments"]
    return acl.memory_snapshot(tuple(mempool_id))


def _record_memory_history(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, device: _device_t = None) -> None:
    """Starts (``enabled="all"`` or ``"state"``) or stops (None) recording allocations and frees.

    npusim records actions, addresses, sizes, streams and times; no stack frames (``frames`` is empty).
    """
    global _history_enabled
    if enabled not in (None, "all", "state"):
        raise ValueError(f"_record_memory_history: enabled must be None, 'state' or 'all', got {enabled!r}")
    acl.record_memory_history(enabled == "all", max_entries if enabled == "all" else 0)
    _history_enabled = enabled is not None


# Whether _record_memory_history last turned recording on (the only caller of acl.record_memory_history).
_history_enabled = False


def _npu_isHistoryEnabled() -> bool:  # noqa: N802  (torch_npu's name)
    """CUDA's ``_cuda_isHistoryEnabled``: whether :func:`_record_memory_history` recording is on."""
    return _history_enabled


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickles :func:`_snapshot` to ``filename`` (the file pytorch.org/memory_viz and ``_memory_viz`` read)."""
    with open(filename, "wb") as out:
        pickle.dump(_snapshot(augment_with_fx_traces=augment_with_fx_traces), out)


def memory_summary(device: _device_t = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator's statistics for one device."""
    index = _index(device)
    stats = memory_stats(index)
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    rows = [("allocated_bytes", "Allocated memory", True), ("active_bytes", "Active memory", True),
            ("requested_bytes", "Requested memory", True), ("reserved_bytes", "NPU reserved memory", True),
            ("allocation", "Allocations", False), ("active", "Active allocs", False),
            ("segment", "NPU reserved segments", False)]

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            n /= 1024
        return str(n)

    width = 82
    lines = ["=" * width,
             f" npusim NPU memory summary, device npu:{index} ({acl.device_count()} devices)".ljust(width),
             "-" * width,
             f" NPU OOMs: {stats.get('num_ooms', 0):<10} | cache flush retries: {stats.get('num_alloc_retries', 0)}",
             "=" * width,
             f" {'Metric':<26}| {'Cur Usage':>12} | {'Peak Usage':>12} | {'Tot Alloc':>12} | {'Tot Freed':>12}",
             "-" * width]
    for key, title, is_bytes in rows:
        for pool in pools:
            fmt = size if is_bytes else str
            values = [stats.get(f"{key}.{pool}.{metric}", 0) for metric in ("current", "peak", "allocated", "freed")]
            label = title if pool == "all" else f"      from {pool.replace('_pool', '')} pool"
            lines.append(f" {label:<26}| " + " | ".join(f"{fmt(v):>12}" for v in values))
        lines.append("-" * width)
    free, total = mem_get_info(index)
    lines.append(f" Device capacity: {size(total)}, free: {size(free)}, "
                 f"per-process fraction: {get_per_process_memory_fraction(index):g}")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
