"""torch.compile(mode="reduce-overhead") on the npu: npu graph trees record and replay the compiled graphs."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.profiler import ProfilerActivity, profile

import npusim
from npusim.compat import torch_npu as shim
from npusim.ops import trace_foreach_copy

# What a replayed call may still dispatch on the host: the input copy and the new output tensors.
NOT_COMPUTE = {"aten::_foreach_copy_", "aten::detach", "aten::empty", "aten::set_", "aten::alias"}


def _tree() -> object:
    from npusim.compile import graph_trees

    return graph_trees.get_manager(0, create_if_none_exists=False)


@pytest.fixture(autouse=True)
def _fresh_trees() -> Iterator[None]:
    from npusim.compile import graph_trees

    torch._dynamo.reset()
    graph_trees.reset_npugraph_trees()
    yield
    torch._dynamo.reset()
    graph_trees.reset_npugraph_trees()


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.drop, self.out = nn.Linear(16, 32), nn.Dropout(0.25), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.relu(self.hidden(x))))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def _in_replay(event: object) -> bool:
    """Whether ``event`` ran inside a graph replay (the replay's own kernels on the stream worker)."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.endswith("graph_replay"):
        parent = parent.cpu_parent
    return parent is not None


def _ops_and_replays(prof: profile) -> tuple[set[str], int]:
    """The aten ops the call dispatched itself (not those its replays run) and the number of graph replays."""
    events = prof.events()
    ops = {e.name for e in events if e.name.startswith("aten::") and not _in_replay(e)}
    return ops, sum(1 for e in events if e.name.endswith("graph_replay"))


def test_reduce_overhead_mlp_training_step_replays_graphs_and_equals_eager() -> None:
    """A compiled MLP step (dropout, backward, SGD): warm-up, record, then replays that dispatch no aten compute op,
    one graph replay per forward and per backward; losses, masks' effect and parameters equal eager's."""
    torch.manual_seed(0)
    model = _Mlp().to("npu")
    eager = copy.deepcopy(model)
    compiled = torch.compile(_loss, mode="reduce-overhead")
    opt_c, opt_e = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager))
    with torch._inductor.config.patch(fallback_random=True):  # eager's dropout draws, so eager is comparable
        for step in range(4):
            x, y = torch.randn(4, 16, device="npu"), torch.randn(4, 8, device="npu")
            torch.npu.manual_seed(10 + step)
            if step == 2:
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as fwd:
                    loss = compiled(model, x, y)
                seed = torch.ones((), device="npu")  # autograd's own seed gradient would be an ones_like
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as bwd:
                    loss.backward(seed)
            else:
                loss = compiled(model, x, y)
                loss.backward()
            opt_c.step()
            opt_c.zero_grad()
            torch.npu.manual_seed(10 + step)
            eager_loss = _loss(eager, x, y)
            eager_loss.backward()
            opt_e.step()
            opt_e.zero_grad()
            assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-5), step
    for prof in (fwd, bwd):
        ops, replays = _ops_and_replays(prof)
        assert ops <= NOT_COMPUTE, ops - NOT_COMPUTE
        assert replays == 1
    for pc, pe in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(pc.cpu(), pe.cpu())
    nodes = _tree().nodes()
    assert len(nodes) == 2  # the forward and, as its child, the backward
    assert nodes[1].parent is nodes[0]
    assert torch._dynamo.utils.counters["inductor"]["npugraph_wrapped"] == 2


def test_input_copy_takes_the_fast_route_once_per_replay() -> None:
    """Each replay copies the new inputs into the static buffers with one _foreach_copy_ on the fast route."""
    model = _Mlp().to("npu").eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(2):  # warm-up, record
            compiled(torch.randn(4, 16, device="npu"))
        for _ in range(2):
            x = torch.randn(4, 16, device="npu")
            with trace_foreach_copy() as calls:
                out = compiled(x)
            assert len(calls) == 1
            assert [g.route for g in calls[0].groups] == ["fast"]
            torch.testing.assert_close(out.cpu(), model(x).cpu())


def test_new_shapes_record_new_graphs_in_the_trees_one_pool() -> None:
    """A new input shape warms up and records a new graph; the first shape still replays its own; one pool."""
    model = _Mlp().to("npu").eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for batch in (4, 8):
            for _ in range(3):
                x = torch.randn(batch, 16, device="npu")
                torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
        recorded = len(_tree().nodes())
        x = torch.randn(4, 16, device="npu")
        torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
    nodes = _tree().nodes()
    assert recorded == len(nodes) == 2
    batches = [{tuple(k[0]) for k in n.key if isinstance(k, tuple)} & {(4, 16), (8, 16)} for n in nodes]
    assert sorted(b.pop() for b in batches) == [(4, 16), (8, 16)]
    assert {n.graph.pool() for n in nodes} == {_tree().npu_graphs_pool}


def test_warm_up_runs_eagerly_before_the_recording() -> None:
    """The first call runs eagerly (no graph), the second records, the outputs of a past step raise when read."""
    model = _Mlp().to("npu").eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        x = torch.randn(4, 16, device="npu")
        compiled(x)
        assert _tree() is None or not _tree().nodes()
        recorded = compiled(x)
        assert len(_tree().nodes()) == 1
        replayed = compiled(x)
        torch.testing.assert_close(replayed.cpu(), model(x).cpu())
    with pytest.raises(RuntimeError, match="accessing tensor output of CUDAGraphs that has been overwritten"):
        recorded.sum()


def _cycles(seconds: float) -> int:
    """torch.npu._sleep's cycles for ``seconds`` at the current profile's clock."""
    from npusim.runtime.profiles import get_profile

    return int(seconds * 1e6 * get_profile().clock_mhz)


@pytest.mark.asynchronous
def test_replay_sees_inputs_written_on_its_stream_and_not_those_of_another_without_a_wait() -> None:
    """The review's replay smoke: input written by a slow copy on the calling stream is read by the replay; written
    on another stream without a wait, the replay reads the old values; with the wait, the new ones."""
    model = _Mlp().to("npu").eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.zeros(64, 16, device="npu")
    side = torch.npu.Stream(priority=-1)  # never the tree's own (normal-priority) stream
    with torch.no_grad():
        compiled(x)
        compiled(x)  # warm-up and record done
        with npusim.timing.model(copy_gbps=0.0002, realtime=True):  # ~20 ms per 4 KiB copy
            new = torch.randn(64, 16, device="npu")
            x.copy_(new)  # on the calling stream
            torch.testing.assert_close(compiled(x).cpu(), model(new).cpu())

            newer = torch.randn(64, 16, device="npu")
            side.wait_stream(torch.npu.current_stream())
            with torch.npu.stream(side):
                torch.npu._sleep(_cycles(0.2))  # the side stream is busy: its copy lands well after the replay's
                x.copy_(newer)  # no wait: the replay's input copy runs first
            stale = compiled(x)
            torch.npu.synchronize()
            torch.testing.assert_close(stale.cpu(), model(new).cpu())
            side.wait_stream(torch.npu.current_stream())
            with torch.npu.stream(side):
                x.copy_(newer * 2)
            torch.npu.current_stream().wait_stream(side)
            torch.testing.assert_close(compiled(x).cpu(), model(newer * 2).cpu())


def test_torch_npu_graph_tree_is_npusims_under_npusim_run() -> None:
    """Under npusim's torch_npu, torch_npu.npu._graph_tree is npusim.compile.graph_trees with torch_npu's names."""
    shim.install()
    try:
        import torch_npu  # noqa: F401
        from torch_npu.npu._graph_tree import (  # the names torch_npu's test/npu/test_graph_tree.py imports
            CompilationMode,
            FunctionID,
            NPUGraphNode,
            NPUGraphTreeManager,
            NPUWarmupNode,
            TreeManagerContainer,
            _use_npu_memory_pool_manager,
            check_memory_pool,
            enable_history_recording,
            get_block_addrs,
            get_container,
            get_manager,
            get_npugraph_segments,
            npugraphify,
            npugraphify_impl,
            reset_npugraph_trees,
        )

        from npusim.compile import graph_trees

        assert torch.npu._graph_tree is graph_trees
        assert get_container(0) is get_container(0) and get_container(0) is not get_container(1)
        assert NPUGraphTreeManager is graph_trees.NPUGraphTreeManager and NPUGraphNode is graph_trees.NPUGraphNode
        imported = (CompilationMode, FunctionID, NPUWarmupNode, TreeManagerContainer, get_manager, npugraphify,
                    npugraphify_impl, reset_npugraph_trees, _use_npu_memory_pool_manager, check_memory_pool,
                    enable_history_recording, get_block_addrs, get_npugraph_segments)
        names = ("CompilationMode", "FunctionID", "NPUWarmupNode", "TreeManagerContainer", "get_manager",
                 "npugraphify", "npugraphify_impl", "reset_npugraph_trees", "_use_npu_memory_pool_manager",
                 "check_memory_pool", "enable_history_recording", "get_block_addrs", "get_npugraph_segments")
        for name, obj in zip(names, imported, strict=True):
            assert obj is getattr(graph_trees, name), name
    finally:
        shim.uninstall()
    assert "_graph_tree" not in vars(torch.npu) and "__path__" not in vars(torch.npu)


def _pool_with_two_live_outputs() -> tuple[torch.npu.NPUGraph, tuple[int, int], torch.Tensor, torch.Tensor]:
    """A graph captured into a fresh pool whose two outputs are the pool's only live blocks."""
    pool = torch.npu.graph_pool_handle()
    graph = torch.npu.NPUGraph()
    x = torch.ones(1024, device="npu")
    with torch.npu.graph(graph, pool=pool):
        y = x * 2
        z = y + 1
    return graph, pool, y, z


def test_pool_segments_and_block_addresses_are_the_allocators() -> None:
    """get_npugraph_segments / get_block_addrs read torch.npu.memory_snapshot(): the pool's live blocks are the
    graph's two outputs; with live_only=False the free remainder of the segment is listed too."""
    from npusim.compile import graph_trees

    graph, pool, y, z = _pool_with_two_live_outputs()
    segments = graph_trees.get_npugraph_segments(pool)
    assert segments and {s["segment_pool_id"] for s in segments} == {pool}
    assert sorted(graph_trees.get_block_addrs(pool)) == sorted([y.data_ptr(), z.data_ptr()])
    every = graph_trees.get_block_addrs(pool, live_only=False)
    assert set(every) > {y.data_ptr(), z.data_ptr()}
    assert graph_trees.get_block_addrs(torch.npu.graph_pool_handle()) == []  # a pool nothing allocated in
    del graph


def test_check_memory_pool_accepts_exactly_the_live_storages() -> None:
    """check_memory_pool passes when the live storages are the pool's allocated blocks; a storage outside the pool
    and a pool block no storage accounts for raise CUDA's messages; a freed output leaves the check."""
    from npusim.compile.graph_trees import StorageWeakRefWrapper, check_memory_pool

    graph, pool, y, z = _pool_with_two_live_outputs()
    check_memory_pool(0, pool, [StorageWeakRefWrapper(y), StorageWeakRefWrapper(z)])
    outside = torch.empty(8, device="npu")
    with pytest.raises(RuntimeError, match=rf"not allocated in pool \({pool[0]}, {pool[1]}\) but should be "
                                           rf"\{{{outside.data_ptr()}\}}"):
        check_memory_pool(0, pool, [StorageWeakRefWrapper(t) for t in (y, z, outside)])
    with pytest.raises(RuntimeError, match=f"Data Pointer: {y.data_ptr()}, history"):
        check_memory_pool("npu:0", pool, [StorageWeakRefWrapper(z)])
    with pytest.raises(RuntimeError, match=r"check all\(isinstance\(elem, StorageWeakRefWrapper\).*got \['int'\]"):
        check_memory_pool(0, pool, [1, 2])
    del y
    check_memory_pool(0, pool, [StorageWeakRefWrapper(z)])
    del graph


def test_memory_pool_manager_allocates_in_the_graph_pool_on_its_stream() -> None:
    """_use_npu_memory_pool_manager routes the thread's allocations to the pool on the given stream, and only
    inside the block; the current stream is restored."""
    from npusim.compile.graph_trees import _use_npu_memory_pool_manager, get_block_addrs

    graph, pool, _, _ = _pool_with_two_live_outputs()
    side = torch.npu.Stream()
    before = torch.npu.current_stream()
    with _use_npu_memory_pool_manager(0, pool, side):
        assert torch.npu.current_stream() == side
        inside = torch.empty(4096, device="npu")
    outside = torch.empty(4096, device="npu")
    assert torch.npu.current_stream() == before
    assert inside.data_ptr() in get_block_addrs(pool) and outside.data_ptr() not in get_block_addrs(pool)
    del graph


def test_enable_history_recording_records_only_inside_unless_already_on() -> None:
    """enable_history_recording turns the allocator's history on for its block and off after, and leaves a
    recording someone else started running."""
    from npusim.compile.graph_trees import enable_history_recording

    memory = torch.npu.memory
    assert not memory._npu_isHistoryEnabled()
    with enable_history_recording():
        assert memory._npu_isHistoryEnabled()
        t = torch.empty(1000, device="npu")
        traced = [e for e in memory._snapshot()["device_traces"][0] if e["action"] == "alloc"]
        assert traced and traced[-1]["addr"] == t.data_ptr()
    assert not memory._npu_isHistoryEnabled()
    memory._record_memory_history()
    try:
        with enable_history_recording():
            pass
        assert memory._npu_isHistoryEnabled()
    finally:
        memory._record_memory_history(None)
    assert not memory._npu_isHistoryEnabled()


def test_outputs_that_share_memory_still_share_it_and_are_invalidated_by_the_next_step() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x * 2
        return y, y[1:], x + 1  # two views of one buffer, and another buffer

    compiled = torch.compile(f, mode="reduce-overhead")
    x = torch.arange(6.0, device="npu")
    for _ in range(3):  # warm-up, recording, then a replay
        torch.compiler.cudagraph_mark_step_begin()
        whole, tail, other = compiled(x)
    torch.npu.synchronize()
    assert torch.equal(whole.cpu(), torch.arange(6.0) * 2) and torch.equal(other.cpu(), torch.arange(6.0) + 1)
    assert tail.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    assert other.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
    assert (tail.storage_offset(), tail.shape, tail.stride()) == (1, (5,), (1,))
    whole[1] = -1.0  # a view's writes show through the other: one storage, as the static outputs
    assert tail[0].item() == -1.0
    torch.compiler.cudagraph_mark_step_begin()
    compiled(x)  # a new step overwrites the memory: last step's outputs raise on access
    for old in (whole, tail, other):
        with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
            old.cpu()
