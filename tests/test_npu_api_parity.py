"""torch.npu parity: every name torch_npu's torch.npu shares with torch.cuda exists and behaves like torch.cuda's.

The list and the not-applicable reasons are in npusim/runtime/parity.py (with where they come from).
"""

from __future__ import annotations

import collections
import inspect
import warnings
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from npusim.runtime.parity import (
    GRAPH_METHODS_NOT_APPLICABLE,
    GRAPH_METHODS_SHARED_WITH_CUDA,
    NOT_APPLICABLE,
    SHARED_WITH_CUDA,
)

BAD = 99  # past device_count(): torch.cuda raises for it


def _raises(kind: type[BaseException], fn: Callable[[], object]) -> None:
    with pytest.raises(kind):
        fn()


def _int_query(name: str, bad: type[BaseException] = RuntimeError) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            value = getattr(m, name)()
            assert isinstance(value, int) and value >= 0 and getattr(m, name)(1) >= 0
            _raises(bad, lambda: getattr(m, name)(BAD))
    return check


def _none_call(name: str, *args: object, warns: bool = False) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        if warns:
            with pytest.warns(FutureWarning):
                assert getattr(m, name)(*args) is None
        else:
            assert getattr(m, name)(*args) is None
        if args:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                _raises(RuntimeError, lambda: getattr(m, name)(BAD))
    return check


def _legacy_tensor(prefix: str, dtype: torch.dtype) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        cls = getattr(m, f"{prefix}Tensor")
        t = cls(2, 3)
        assert (t.device.type, t.dtype, tuple(t.shape)) == ("npu", dtype, (2, 3)) and isinstance(t, cls)
        assert not isinstance(torch.zeros(1, dtype=dtype), cls)
        assert torch.equal(cls([1, 0]).cpu(), torch.tensor([1, 0], dtype=dtype))
    return check


def _legacy_storage(prefix: str, dtype: torch.dtype) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated (as on CUDA)
            storage = getattr(m, f"{prefix}Storage")(5)
            assert (storage.device.type, storage.dtype, storage.size()) == ("npu", dtype, 5)
    return check


def _stream_checks(m: ModuleType) -> None:
    s = m.Stream(priority=-1)
    assert isinstance(s, torch.Stream) and s.device == torch.device("npu", 0) and s.priority < 0
    _raises(RuntimeError, lambda: m.Stream(device=BAD))


def _stream_context(m: ModuleType) -> None:
    s = m.Stream(device=1)
    with m.StreamContext(s):
        assert m.current_stream(1) == s and m.current_device() == 1
    assert m.current_device() == 0 and m.current_stream(1) != s


def _stream_fn(m: ModuleType) -> None:
    s = m.Stream()
    with m.stream(s):
        assert m.current_stream() == s
    assert m.current_stream() == m.default_stream()


def _set_stream(m: ModuleType) -> None:
    s, default = m.Stream(), m.current_stream()
    m.set_stream(s)
    try:
        assert m.current_stream() == s
    finally:
        m.set_stream(default)


def _stream_query(name: str) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        s = getattr(m, name)(2)
        assert isinstance(s, m.Stream) and s.device_index == 2
        _raises(RuntimeError, lambda: getattr(m, name)(BAD))
    return check


def _device_ctx(m: ModuleType) -> None:
    with m.device(3):
        assert m.current_device() == 3
    assert m.current_device() == 0
    with m.device_of(torch.empty(1, device="npu:2")):
        assert m.current_device() == 2


def _set_device(m: ModuleType) -> None:
    m.set_device(1)
    try:
        assert m.current_device() == 1 and torch.empty(1, device="npu").device.index == 1
    finally:
        m.set_device(0)
    _raises(RuntimeError, lambda: m.set_device(BAD))


def _assert_query(name: str, check_value: Callable[[object], bool], *args: object) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            assert check_value(getattr(m, name)(*args))
            _raises(AssertionError, lambda: getattr(m, name)(*args[:-1], BAD) if args else getattr(m, name)(BAD))
    return check


def _mem_get_info(m: ModuleType) -> None:
    free, total = m.mem_get_info(0)
    assert isinstance(free, int) and 0 < free <= total
    _raises(RuntimeError, lambda: m.mem_get_info(BAD))


def _memory_stats(m: ModuleType) -> None:
    stats = m.memory_stats(0)
    assert isinstance(stats, collections.OrderedDict) and stats["allocated_bytes.all.current"] >= 0
    _raises(RuntimeError, lambda: m.memory_stats(BAD))


def _fraction(m: ModuleType) -> None:
    m.set_per_process_memory_fraction(0.75, 2)
    try:
        assert m.get_per_process_memory_fraction(2) == 0.75
    finally:
        m.set_per_process_memory_fraction(1.0, 2)
    _raises(RuntimeError, lambda: m.get_per_process_memory_fraction(BAD))


def _mem_pool(m: ModuleType) -> None:
    pool = m.MemPool()
    assert pool.use_count() == 1 and isinstance(pool.id, tuple)
    with m.use_mem_pool(pool):
        t = torch.empty(1024, device="npu")
        assert pool.use_count() == 2
    assert [s["segment_pool_id"] for s in pool.snapshot()] == [pool.id] and t.numel() == 1024
    _raises(RuntimeError, lambda: m.use_mem_pool(pool, BAD).__enter__())


def _reset_peak_host_memory_stats(m: ModuleType) -> None:
    pinned = torch.ones(256).pin_memory()
    del pinned
    m.reset_peak_host_memory_stats()
    stats = m.host_memory_stats()
    assert stats["allocated_bytes.peak"] == stats["allocated_bytes.current"]


def _reset_accumulated_host_memory_stats(m: ModuleType) -> None:
    assert torch.ones(8).pin_memory().is_pinned()
    m.reset_accumulated_host_memory_stats()
    stats = m.host_memory_stats()
    assert stats["allocations.allocated"] == stats["allocations.freed"] == stats["num_host_alloc"] == 0


def _caching_allocator(m: ModuleType) -> None:
    before = m.memory_allocated(1)
    ptr = m.caching_allocator_alloc(4096, device=1)
    assert isinstance(ptr, int) and m.memory_allocated(1) == before + 4096
    m.caching_allocator_delete(ptr)
    assert m.memory_allocated(1) == before
    _raises(RuntimeError, lambda: m.caching_allocator_delete(ptr))


def _rng_state(m: ModuleType) -> None:
    state = m.get_rng_state(1)
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    first = torch.rand(4, device="npu:1")
    m.set_rng_state(state, 1)
    assert torch.equal(torch.rand(4, device="npu:1").cpu(), first.cpu())


def _rng_state_all(m: ModuleType) -> None:
    states = m.get_rng_state_all()
    assert len(states) == m.device_count()
    first = torch.rand(3, device="npu")
    m.set_rng_state_all(states)
    assert torch.equal(torch.rand(3, device="npu").cpu(), first.cpu())


def _seeding(name: str) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        if name in ("manual_seed", "manual_seed_all"):
            getattr(m, name)(123)
            assert m.initial_seed() == 123
        else:
            assert getattr(m, name)() is None and isinstance(m.initial_seed(), int)
    return check


def _amp(m: ModuleType) -> None:
    with m.amp.autocast():
        out = torch.ones(4, 4, device="npu") @ torch.ones(4, 4, device="npu")
    assert out.dtype == torch.float16
    assert isinstance(m.amp.GradScaler(), torch.amp.GradScaler) and m.amp.GradScaler()._device == "npu"
    assert callable(m.amp.custom_fwd) and callable(m.amp.custom_bwd)


def _submodule(name: str, *attrs: str) -> Callable[[ModuleType], None]:
    def check(m: ModuleType) -> None:
        sub = getattr(m, name)
        assert isinstance(sub, ModuleType) and all(hasattr(sub, a) for a in attrs)
    return check


# torch.cuda.graph's debugging aids of torch 2.13 that need CUDA itself: kernel annotations (the
# cuda.bindings package, driver 13.1) and the input liveness tracker (torch.utils._cuda_debug).
CUDA_ONLY_GRAPH_PARAMETERS = ("enable_annotations", "check_input_liveness")


def _same_parameters(npu_fn: Callable[..., object], cuda_fn: Callable[..., object]) -> None:
    """The same parameters in the same order, torch_npu's npu_graph for cuda_graph."""
    cuda = [{"cuda_graph": "npu_graph"}.get(p, p) for p in inspect.signature(cuda_fn).parameters
            if p not in CUDA_ONLY_GRAPH_PARAMETERS]
    assert list(inspect.signature(npu_fn).parameters) == cuda


def _captured_double(m: ModuleType, pool: object = None) -> None:
    """Captures y = x * 2 on a side stream and replays it for a new x."""
    x = torch.ones(8, device="npu")
    side = m.Stream()
    side.wait_stream(m.current_stream())
    g = m.NPUGraph()
    with m.stream(side):
        y = x * 2  # warm-up outside the capture, as torch.cuda.graph's docs ask
        with m.graph(g, pool=pool):
            y = x * 2
    m.current_stream().wait_stream(side)
    x.fill_(3.0)
    g.replay()
    assert torch.equal(y.cpu(), torch.full((8,), 6.0))


def _graph(m: ModuleType) -> None:
    assert isinstance(m.graph, type)
    _same_parameters(m.graph.__init__, torch.cuda.graph.__init__)
    _captured_double(m)


def _graph_pool_handle(m: ModuleType) -> None:
    handle = m.graph_pool_handle()
    assert isinstance(handle, tuple) and len(handle) == 2 and all(isinstance(v, int) for v in handle)
    assert m.graph_pool_handle() != handle  # each call makes a new pool, as torch.cuda's does
    _captured_double(m, pool=handle)
    _captured_double(m, pool=handle)  # two captures share it


def _is_capturing(m: ModuleType) -> None:
    assert m.is_current_stream_capturing() is False
    side, g, seen = m.Stream(), m.NPUGraph(), []
    with m.stream(side), m.graph(g):
        seen.append(m.is_current_stream_capturing())
    assert seen == [True] and m.is_current_stream_capturing() is False


def _make_graphed_callables(m: ModuleType) -> None:
    _same_parameters(m.make_graphed_callables, torch.cuda.make_graphed_callables)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("npu")
    eager = torch.nn.Linear(4, 3).to("npu")
    eager.load_state_dict(model.state_dict())
    graphed = m.make_graphed_callables(model, (torch.randn(2, 4, device="npu", requires_grad=True),))
    x = torch.randn(2, 4, device="npu", requires_grad=True)
    graphed(x).sum().backward()
    eager(x.detach()).sum().backward()
    torch.testing.assert_close(model.weight.grad.cpu(), eager.weight.grad.cpu())


def _graphs_module(m: ModuleType) -> None:
    """torch.npu.graphs holds what torch.cuda.graphs does (NPUGraph for CUDAGraph), the same objects as torch.npu."""
    shared = ("graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables")
    assert all(hasattr(torch.cuda.graphs, name) for name in (*shared, "CUDAGraph"))
    _submodule("graphs", "NPUGraph", *shared)(m)
    assert all(getattr(m.graphs, name) is getattr(m, name) for name in (*shared, "NPUGraph"))


CHECKS: dict[str, Callable[[ModuleType], None]] = {
    "graph": _graph,
    "graph_pool_handle": _graph_pool_handle,
    "graphs": _graphs_module,
    "is_current_stream_capturing": _is_capturing,
    "make_graphed_callables": _make_graphed_callables,
    "Event": lambda m: (isinstance(m.Event(enable_timing=True), m.Event) or None),
    "Stream": _stream_checks,
    "StreamContext": _stream_context,
    "stream": _stream_fn,
    "set_stream": _set_stream,
    "current_stream": _stream_query("current_stream"),
    "default_stream": _stream_query("default_stream"),
    "device": _device_ctx,
    "device_of": _device_ctx,
    "device_count": lambda m: (m.device_count() == 8 or None),
    "current_device": lambda m: (m.current_device() == 0 or None),
    "set_device": _set_device,
    "synchronize": _none_call("synchronize", 1),
    "init": lambda m: m.init(),
    "is_initialized": lambda m: (m.is_initialized() is True or None),
    "is_available": lambda m: (m.is_available() is True or None),
    "is_bf16_supported": lambda m: (isinstance(m.is_bf16_supported(), bool) or None),
    "get_device_name": _assert_query("get_device_name", lambda v: isinstance(v, str) and v.startswith("Ascend"), 0),
    "get_device_properties": _assert_query("get_device_properties", lambda v: v.total_memory > 0, 0),
    "get_device_capability": _assert_query("get_device_capability", lambda v: v is None or len(v) == 2, 0),
    "can_device_access_peer": _assert_query("can_device_access_peer", lambda v: v is True, 0, 1),
    "utilization": _assert_query("utilization", lambda v: isinstance(v, int) and 0 <= v <= 100, 0),
    "mem_get_info": _mem_get_info,
    "memory_allocated": _int_query("memory_allocated"),
    "max_memory_allocated": _int_query("max_memory_allocated"),
    "memory_reserved": _int_query("memory_reserved"),
    "max_memory_reserved": _int_query("max_memory_reserved"),
    "memory_cached": _int_query("memory_cached"),
    "max_memory_cached": _int_query("max_memory_cached"),
    "memory_stats": _memory_stats,
    "memory_stats_as_nested_dict": lambda m: (m.memory_stats_as_nested_dict(1)["reserved_bytes"]["all"]["current"]
                                              >= 0 or None),
    "memory_summary": lambda m: ("Allocated memory" in m.memory_summary(1) or None),
    "memory_snapshot": lambda m: (all("blocks" in s for s in m.memory_snapshot()) or None),
    "empty_cache": lambda m: m.empty_cache(),
    "reset_peak_memory_stats": _none_call("reset_peak_memory_stats", 0),
    "reset_accumulated_memory_stats": _none_call("reset_accumulated_memory_stats", 0),
    "reset_max_memory_allocated": _none_call("reset_max_memory_allocated", 0, warns=True),
    "reset_max_memory_cached": _none_call("reset_max_memory_cached", 0, warns=True),
    "set_per_process_memory_fraction": _fraction,
    "get_per_process_memory_fraction": _fraction,
    "MemPool": _mem_pool,
    "use_mem_pool": _mem_pool,
    "caching_allocator_alloc": _caching_allocator,
    "caching_allocator_delete": _caching_allocator,
    "get_allocator_backend": lambda m: (m.get_allocator_backend() == "native" or None),
    "host_memory_stats": lambda m: (torch.ones(8).pin_memory() is not None
                                    and m.host_memory_stats()["num_host_alloc"] >= 1 or None),
    "host_memory_stats_as_nested_dict": lambda m: (isinstance(m.host_memory_stats_as_nested_dict(), dict) or None),
    "reset_peak_host_memory_stats": _reset_peak_host_memory_stats,
    "reset_accumulated_host_memory_stats": _reset_accumulated_host_memory_stats,
    "ipc_collect": lambda m: m.ipc_collect(),
    "get_rng_state": _rng_state,
    "set_rng_state": _rng_state,
    "get_rng_state_all": _rng_state_all,
    "set_rng_state_all": _rng_state_all,
    "manual_seed": _seeding("manual_seed"),
    "manual_seed_all": _seeding("manual_seed_all"),
    "seed": _seeding("seed"),
    "seed_all": _seeding("seed_all"),
    "initial_seed": _seeding("seed"),
    "amp": _amp,
    "memory": _submodule("memory", "memory_stats", "_record_memory_history", "_snapshot", "_dump_snapshot"),
    "random": _submodule("random", "manual_seed", "get_rng_state"),
    "streams": _submodule("streams", "Stream", "Event"),
}
_LEGACY = {"BFloat16": torch.bfloat16, "Bool": torch.bool, "Byte": torch.uint8, "Char": torch.int8,
           "Double": torch.float64, "Float": torch.float32, "Half": torch.float16, "Int": torch.int32,
           "Long": torch.int64, "Short": torch.int16}
CHECKS.update({f"{p}Tensor": _legacy_tensor(p, d) for p, d in _LEGACY.items()})
CHECKS.update({f"{p}Storage": _legacy_storage(p, d) for p, d in _LEGACY.items()})


def test_every_shared_name_is_classified_once():
    """Each shared name is checked or not applicable (with a reason); the count adds up."""
    groups = [set(CHECKS), set(NOT_APPLICABLE)]
    assert sum(len(g) for g in groups) == len(set().union(*groups)), "a name is in two groups"
    assert set().union(*groups) == set(SHARED_WITH_CUDA)
    assert all(len(reason) > 20 for reason in NOT_APPLICABLE.values())
    assert (len(CHECKS), len(NOT_APPLICABLE), len(SHARED_WITH_CUDA)) == (88, 4, 92)


@pytest.mark.parametrize("name", SHARED_WITH_CUDA)
def test_name_exists_and_behaves_like_torch_cuda(name):
    """The name exists on torch.npu and behaves as torch.cuda's does (types, shapes, bad-index errors)."""
    if name in NOT_APPLICABLE:
        pytest.skip(f"not applicable: {NOT_APPLICABLE[name]}")
    assert hasattr(torch.npu, name), f"torch.npu.{name} is missing"
    assert hasattr(torch.cuda, name), f"torch.cuda.{name} is not in this torch: the list is stale"
    CHECKS[name](torch.npu)


def test_torch_npu_only_names():
    """set_compile_mode, set_option (with torch_npu's value checks), config, matmul/conv.allow_hf32 and the autocast
    helpers are present."""
    m = torch.npu
    m.set_compile_mode(jit_compile=True)
    assert not m.is_jit_compile_false()
    m.set_compile_mode(jit_compile=False)
    assert m.is_jit_compile_false()
    m.set_option({"ACL_OP_COMPILER_CACHE_MODE": "enable", "ACL_AICORE_NUM": 32, "ACL_DEBUG_DIR": "anything"})
    for option, message in ((("ACL_PRECISION_MODE", "500"), "ACL_PRECISION_MODE should be one of"),
                            (("ACL_OP_DEBUG_LEVEL", "300"), "ACL_OP_DEBUG_LEVEL should be one of"),
                            (("ACL_AICORE_NUM", "at"), "ACL_AICORE_NUM should be an integer from 1 to 32")):
        with pytest.raises(ValueError, match=message):  # torch_npu's checks of the compile options' values
            m.set_option(dict([option]))
    assert m.config.allow_internal_format is False and m.matmul.allow_hf32 is False and m.conv.allow_hf32 is True
    assert not m.is_autocast_enabled()
    with torch.autocast("npu", dtype=torch.bfloat16):
        assert m.is_autocast_enabled() and m.get_autocast_dtype() == torch.bfloat16


def test_npu_graph_has_cuda_graphs_methods():
    """NPUGraph has each CUDAGraph method this torch defines unless it is listed as not applicable (with why)."""
    cuda_methods = {n for n in dir(torch.cuda.CUDAGraph) if not n.startswith("_")}
    assert cuda_methods <= set(GRAPH_METHODS_SHARED_WITH_CUDA) | set(GRAPH_METHODS_NOT_APPLICABLE)
    assert not set(GRAPH_METHODS_SHARED_WITH_CUDA) & set(GRAPH_METHODS_NOT_APPLICABLE)
    missing = [n for n in GRAPH_METHODS_SHARED_WITH_CUDA if not callable(getattr(torch.npu.NPUGraph, n, None))]
    assert not missing
