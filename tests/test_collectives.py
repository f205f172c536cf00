"""The npu collective backend: values of every op and reduce op, NCCL-like stream
semantics, and failure when a peer dies. World size 2, each job bounded in time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing import assert_close

import npusim
from npusim.distributed import BACKEND_NAME
from npusim.testing.ranks import run_ranks

NPU = "npu"


def _full(value: float, n: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full((n,), value, dtype=dtype, device=NPU)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()  # a device->host copy waits for the current stream


def _check_reductions(rank: int, world: int) -> None:
    assert dist.group.WORLD._get_backend(torch.device(NPU)).name() == BACKEND_NAME
    # all_reduce: rank r contributes r + 1 (1 and 2). reduce_scatter_tensor:
    # rank r contributes arange(4) + r + 1; rank k keeps elements 2k, 2k+1.
    mine = torch.arange(4.0)[2 * rank:2 * rank + 2]
    expected = {
        dist.ReduceOp.SUM: (3.0, 2 * mine + 3),
        dist.ReduceOp.AVG: (1.5, mine + 1.5),
        dist.ReduceOp.MAX: (2.0, mine + 2),
        dist.ReduceOp.MIN: (1.0, mine + 1),
        dist.ReduceOp.PRODUCT: (2.0, (mine + 1) * (mine + 2)),
    }
    for op, (reduced, scattered) in expected.items():
        t = _full(rank + 1.0)
        dist.all_reduce(t, op=op)
        assert_close(_cpu(t), torch.full((4,), reduced), msg=f"all_reduce {op}")
        out = torch.empty(2, device=NPU)
        dist.reduce_scatter_tensor(out, torch.arange(4.0, device=NPU) + rank + 1, op=op)
        assert_close(_cpu(out), scattered, msg=f"reduce_scatter_tensor {op}")
    premul = dist._make_nccl_premul_sum(0.5)
    t = _full(rank + 1.0)
    dist.all_reduce(t, op=premul)
    assert_close(_cpu(t), torch.full((4,), 1.5))
    inp = torch.ones(4, device=NPU) * (rank + 1)
    out = torch.empty(2, device=NPU)
    dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(2.0))
    assert_close(_cpu(out), torch.full((2,), 6.0))
    assert_close(_cpu(inp), torch.full((4,), rank + 1.0), msg="PREMUL_SUM must not scale the caller's input")
    # integers average by truncation; bf16 sums in its own dtype
    t = _full(rank + 2.0, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert_close(_cpu(t), torch.full((4,), 2, dtype=torch.int64))
    t = _full(rank + 1.0, dtype=torch.bfloat16)
    dist.all_reduce(t)
    assert_close(_cpu(t), torch.full((4,), 3.0, dtype=torch.bfloat16))
    ts = [_full(rank + 1.0), _full(10.0 * (rank + 1), n=3)]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.AVG)
    assert_close(_cpu(ts[0]), torch.full((4,), 1.5))
    assert_close(_cpu(ts[1]), torch.full((3,), 15.0))


def _check_data_movement(rank: int, world: int) -> None:
    x = torch.arange(3.0, device=NPU) + 10 * rank
    both = torch.cat([torch.arange(3.0), torch.arange(3.0) + 10])
    outs = [torch.empty(3, device=NPU) for _ in range(world)]
    dist.all_gather(outs, x)
    assert_close(_cpu(torch.cat(outs)), both)
    flat = torch.empty(6, device=NPU)
    dist.all_gather_into_tensor(flat, x)
    assert_close(_cpu(flat), both)
    stacked = torch.empty(2, 3, device=NPU)
    dist.all_gather_into_tensor(stacked, x)
    assert_close(_cpu(stacked), both.view(2, 3))
    pg = dist.group.WORLD
    outs2 = [torch.empty(6, device=NPU), torch.empty(2, device=NPU, dtype=torch.int32)]
    ins2 = [x, torch.full((1,), rank, device=NPU, dtype=torch.int32)]
    pg.allgather_into_tensor_coalesced(outs2, ins2).wait()
    assert_close(_cpu(outs2[0]), both)
    assert_close(_cpu(outs2[1]), torch.tensor([0, 1], dtype=torch.int32))
    rs_out = [torch.empty(2, device=NPU), torch.empty(1, device=NPU)]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    pg.reduce_scatter_tensor_coalesced(rs_out, [torch.ones(4, device=NPU), torch.ones(2, device=NPU) * 5], opts).wait()
    assert_close(_cpu(rs_out[0]), torch.full((2,), 2.0))
    assert_close(_cpu(rs_out[1]), torch.full((1,), 10.0))
    got = torch.empty(3, device=NPU)
    dist.reduce_scatter(got, [torch.full((3,), 1.0 + r + rank, device=NPU) for r in range(world)])
    assert_close(_cpu(got), torch.full((3,), 2.0 * rank + 3))
    b = x.clone()
    dist.broadcast(b, src=1)
    assert_close(_cpu(b), torch.arange(3.0) + 10)
    r = _full(rank + 1.0)
    dist.reduce(r, dst=0, op=dist.ReduceOp.AVG)
    if rank == 0:
        assert_close(_cpu(r), torch.full((4,), 1.5))
    s = torch.empty(2, device=NPU)
    dist.scatter(s, [torch.full((2,), 7.0 + i, device=NPU) for i in range(world)] if rank == 1 else None, src=1)
    assert_close(_cpu(s), torch.full((2,), 7.0 + rank))
    g = [torch.empty(3, device=NPU) for _ in range(world)] if rank == 0 else None
    dist.gather(x, g, dst=0)
    if rank == 0:
        assert_close(_cpu(torch.cat(g)), both)
    a2a = torch.empty(4, device=NPU)
    dist.all_to_all_single(a2a, torch.arange(4.0, device=NPU) + 10 * rank)
    assert_close(_cpu(a2a), torch.tensor([0.0, 1.0, 10.0, 11.0]) + 2 * rank)
    # uneven splits: rank 0 sends 1 then 3 elements, rank 1 sends 2 then 2
    in_splits = [1, 3] if rank == 0 else [2, 2]
    out_splits = [1, 2] if rank == 0 else [3, 2]
    uneven = torch.empty(sum(out_splits), device=NPU)
    dist.all_to_all_single(uneven, torch.arange(4.0, device=NPU) + 10 * rank, out_splits, in_splits)
    want = torch.tensor([0.0, 10, 11]) if rank == 0 else torch.tensor([1.0, 2, 3, 12, 13])
    assert_close(_cpu(uneven), want)
    lists_out = [torch.empty(2, device=NPU) for _ in range(world)]
    dist.all_to_all(lists_out, [torch.full((2,), 10.0 * rank + i, device=NPU) for i in range(world)])
    assert_close(_cpu(torch.cat(lists_out)), torch.tensor([rank, rank, 10.0 + rank, 10.0 + rank]))


def _check_p2p_barrier_async_alloc(rank: int, world: int) -> None:
    peer = 1 - rank
    t = _full(5.0) if rank == 0 else torch.zeros(4, device=NPU)
    if rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    assert_close(_cpu(t), torch.full((4,), 5.0))
    # Both ranks send before they receive: must not deadlock.
    send, recv = _full(float(rank)), torch.empty(4, device=NPU)
    works = [dist.isend(send, dst=peer), dist.irecv(recv, src=peer)]
    for w in works:
        w.wait()
    assert_close(_cpu(recv), torch.full((4,), float(peer)))
    recv2 = torch.empty(4, device=NPU)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, _full(rank + 7.0), peer),
                                   dist.P2POp(dist.irecv, recv2, peer)])
    for req in reqs:
        req.wait()
    assert_close(_cpu(recv2), torch.full((4,), peer + 7.0))
    dist.barrier()
    dist.barrier(device_ids=[rank])
    work = dist.barrier(async_op=True)
    assert work.wait()
    t = _full(rank + 1.0)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert_close(fut.wait()[0].cpu(), torch.full((4,), 3.0))
    assert work.is_completed() and work.is_success()
    backend = dist.group.WORLD._get_backend(torch.device(NPU, rank))
    assert backend.supports_tensor_alloc(torch.device(NPU, rank))
    buf = backend.allocate_tensor(6, dtype=torch.float16, device=torch.device(NPU, rank))
    assert buf.device == torch.device(NPU, rank) and buf.dtype == torch.float16 and buf.numel() == 6
    mesh = init_device_mesh(NPU, (world,))
    dt = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)])
    assert dt.to_local().device == torch.device(NPU, rank)
    assert_close(dt.full_tensor().cpu(), torch.arange(8.0).view(4, 2))
    # Sub-groups: DeviceMesh splits the bound default group; new_group creates one.
    mesh2 = init_device_mesh(NPU, (world, 1), mesh_dim_names=("dp", "tp"))
    for dim, want in (("dp", 3.0), ("tp", rank + 1.0)):
        t = _full(rank + 1.0)
        dist.all_reduce(t, group=mesh2.get_group(dim))
        assert_close(_cpu(t), torch.full((4,), want), msg=f"all_reduce over mesh dim {dim}")
    t = _full(rank + 1.0)
    dist.all_reduce(t, group=dist.new_group([0, 1]))
    assert_close(_cpu(t), torch.full((4,), 3.0))
    chunks = funcol.all_gather_into_tensor_coalesced([_full(rank + 1.0, n=2)], mesh)
    assert_close(funcol.wait_tensor(chunks[0]).cpu(), torch.tensor([1.0, 1, 2, 2]))


def test_default_backend_for_npu():
    """npu maps to the npusim backend, which is registered under its name."""
    assert dist.Backend.default_device_backend_map["npu"] == BACKEND_NAME
    assert dist.Backend(BACKEND_NAME) == BACKEND_NAME
    assert dist.Backend.backend_capability[BACKEND_NAME] == ["npu"]


def test_values_of_every_reduce_op():
    """all_reduce / reduce_scatter give exact results for SUM, AVG, PREMUL_SUM, MAX, MIN, PRODUCT
    (the group made by a plain init_process_group(), which picks the npu backend)."""
    run_ranks(_check_reductions, bind_device=False)


def test_values_of_every_op():
    """Gathers, scatters, broadcast, reduce, all-to-all and coalesced variants move the right data."""
    run_ranks(_check_data_movement)


def _every_op_under_inference_mode(rank: int, world: int) -> None:
    with torch.inference_mode():
        _check_reductions(rank, world)
        _check_data_movement(rank, world)


def test_values_of_every_op_under_inference_mode():
    """The same collectives on inference tensors (torch.inference_mode, as inference with tensor parallelism runs
    them): a collective writes its outputs as a device does, so all_gather_into_tensor no longer raises "Inplace
    update to inference tensor outside InferenceMode" (Note [Collectives write as a device does])."""
    run_ranks(_every_op_under_inference_mode, bind_device=False)


def test_p2p_barrier_async_and_alloc():
    """send/recv (also crossing isends), barrier, async_op futures, allocate_tensor, DeviceMesh/DTensor,
    split and new groups."""
    run_ranks(_check_p2p_barrier_async_alloc)


# ---- stream semantics --------------------------------------------------------

SLOW_COPY_GBPS = 0.02  # 4 MB copy: ~200 ms
SLOW_LINK_GBPS = 0.01  # 4 MB collective: ~400 ms


def _check_stream_semantics(rank: int, world: int) -> dict[str, float]:
    n = 1 << 20  # 4 MB of float32
    src = torch.full((n,), rank + 1.0, device=NPU)
    dst = torch.zeros(n, device=NPU)
    timings: dict[str, float] = {}
    with npusim.timing.model(copy_gbps=SLOW_COPY_GBPS, realtime=True):
        dst.copy_(src)  # enqueued on the current stream; the host does not wait
        dist.all_reduce(dst)  # must start after the copy, not read zeros
        assert_close(dst[:8].cpu(), torch.full((8,), 3.0), msg="collective ran before the preceding copy")
        # Issue order within the group: the second collective, issued on an
        # idle stream, still completes after the first (queued behind a copy).
        side = torch.npu.Stream()
        a, b = torch.zeros(n, device=NPU), _full(1.0)
        with torch.npu.stream(side):
            a.copy_(src)
            work_a = dist.all_reduce(a, async_op=True)
        work_b = dist.all_reduce(b, async_op=True)
        work_b.wait(timeout=timedelta(seconds=30))  # with a timeout: blocks the host
        assert work_a.is_completed(), "collectives of one group must complete in issue order"
        torch.npu.synchronize()
    with npusim.timing.model(link_gbps=SLOW_LINK_GBPS, realtime=True):
        t = torch.full((n,), rank + 1.0, device=NPU)
        start = time.perf_counter()
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # the current stream waits; the host does not
        timings["host_wait_s"] = time.perf_counter() - start
        assert not work.is_completed(), "Work.wait() without a timeout must not block the host"
        doubled = t * 2  # stream-ordered after the collective
        assert_close(doubled[:8].cpu(), torch.full((8,), 6.0))
        timings["collective_s"] = time.perf_counter() - start
        assert work.is_completed()
        # Synchronous collectives are host-asynchronous too (as with NCCL).
        start = time.perf_counter()
        dist.all_reduce(t)
        timings["sync_op_host_s"] = time.perf_counter() - start
        assert_close(t[:8].cpu(), torch.full((8,), 6.0))
        # Dropping an input right after issue is safe: the job holds it. The
        # job then holds the last reference to a tensor Python created, while
        # a DTensor op waits for the stream holding the GIL: releasing that
        # tensor must not be what completes the collective (Note [Comm stream]).
        replicated = distribute_tensor(torch.ones(4), init_device_mesh(NPU, (world,)), [Replicate()])
        dist.all_reduce(torch.ones(n, device=NPU))
        assert_close((replicated + 1).full_tensor().cpu(), torch.full((4,), 2.0))
        torch.npu.synchronize()
    return timings


@pytest.mark.asynchronous
def test_stream_semantics():
    """Collectives start after the current stream's work, complete in issue order, and
    Work.wait() makes the current stream (not the host) wait."""
    results = run_ranks(_check_stream_semantics)
    for timings in results:
        # 4 MB over a 0.01 GB/s link: ~400 ms on the comm stream.
        assert timings["collective_s"] > 0.3
        assert timings["host_wait_s"] < timings["collective_s"] / 2
        assert timings["sync_op_host_s"] < 0.2


def _free_under_running_collective(rank: int, world: int) -> dict[str, int]:
    n = 1 << 20  # 4 MB of float32
    with npusim.timing.model(link_gbps=SLOW_LINK_GBPS, realtime=True):
        t = torch.full((n,), rank + 1.0, device=NPU)
        torch.npu.synchronize()
        torch.npu.empty_cache()  # only t's block is to be given back below
        reserved = torch.npu.memory_reserved()
        work = dist.all_reduce(t, async_op=True)
        time.sleep(0.05)  # the collective is running on the comm stream
        t.untyped_storage().resize_(0)  # swaps the bytes out from under it
        during = torch.npu.memory_reserved()
        work.wait()
        torch.npu.synchronize()
    # The comm thread counts a job finished just after completing it, so the
    # block may still be pending for a moment: empty_cache returns it once cached.
    deadline = time.monotonic() + 5.0
    torch.npu.empty_cache()
    while torch.npu.memory_reserved() == reserved and time.monotonic() < deadline:
        time.sleep(0.01)
        torch.npu.empty_cache()
    return {"reserved": reserved, "during": during, "after": torch.npu.memory_reserved()}


def test_free_waits_for_a_running_collective():
    """A block freed while a collective still uses it stays reserved until the collective is done."""
    for result in run_ranks(_free_under_running_collective):
        assert result["during"] == result["reserved"], result
        assert result["after"] == result["reserved"] - 20 * (1 << 20), result  # t's segment (large pool: 20 MiB)


# ---- failures ------------------------------------------------------------------

PG_TIMEOUT_S = 5.0


def _peer_dies(rank: int, world: int) -> dict[str, object]:
    t = _full(1.0)
    dist.all_reduce(t)  # connections are up
    torch.npu.synchronize()
    if rank == 1:
        os._exit(0)
    time.sleep(0.5)
    start = time.perf_counter()
    # The failure surfaces at wait() when the collective has already failed by
    # then, else at the stream's next synchronize (here: the copy to host).
    with pytest.raises(RuntimeError) as stream_error:
        dist.all_reduce(t)
        t.cpu()
    elapsed = time.perf_counter() - start
    with pytest.raises(dist.DistBackendError) as barrier_error:
        dist.barrier()
    return {"elapsed": elapsed, "stream": str(stream_error.value), "barrier": str(barrier_error.value)}


def test_dead_peer_fails_within_timeout():
    """When a peer exits, the survivor's collective fails with a clear error instead of hanging."""
    survivor, _ = run_ranks(_peer_dies, pg_timeout=PG_TIMEOUT_S, timeout=45)
    assert survivor["elapsed"] < PG_TIMEOUT_S + 2
    assert "hccl all_reduce on npu:0 (rank 0 of 2) failed" in survivor["stream"]
    assert "hccl barrier on npu:0 (rank 0 of 2) failed" in survivor["barrier"]


@pytest.mark.asynchronous
def test_unwaited_failure_at_exit_is_one_line():
    """A collective that failed (its peer died) and was never waited for is reported at exit on one
    line naming the collective and the cause, with no atexit traceback; the exit is clean."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "peer_dies_before_wait.py")
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, script, str(server.port), str(r)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    out, err = outs[0]
    assert ranks[0].returncode == 0 and "rank 0 done" in out, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("npusim: at exit")]
    assert len(lines) == 1, err
    # gloo names the peer's death as it saw it: the socket closed, or reset while it read
    assert "hccl all_reduce on npu:0 (rank 0 of 2) failed" in lines[0]
    assert re.search(r"Connection (closed|reset) by peer", lines[0]), lines[0]


def _peer_stalls(rank: int, world: int) -> dict[str, object]:
    store = dist.distributed_c10d._get_default_store()
    t = _full(1.0)
    dist.all_reduce(t)
    torch.npu.synchronize()
    if rank == 1:
        store.wait(["rank0_done"], timedelta(seconds=30))  # alive, but joins no collective
        return {}
    start = time.perf_counter()
    work = dist.all_reduce(t, async_op=True)
    with pytest.raises(dist.DistBackendError, match="hccl all_reduce on npu:0"):
        work.wait(timeout=timedelta(seconds=30))
    elapsed = time.perf_counter() - start
    store.set("rank0_done", "1")
    return {"elapsed": elapsed}


def test_stalled_peer_times_out():
    """A peer that never joins makes the collective fail after the group's timeout."""
    waiter, _ = run_ranks(_peer_stalls, pg_timeout=2.0, timeout=45)
    assert 1.5 < waiter["elapsed"] < 2.0 + 3


# ---- memory figures --------------------------------------------------------------


def _fsdp_memory_figures(rank: int, world: int) -> tuple[int, int]:
    from npusim.testing.fsdp_harness import sharded_step

    _, step = sharded_step(rank, 256, 2)
    for _ in range(3):
        step()
    return torch.npu.max_memory_allocated(), torch.npu.memory_allocated()


@pytest.mark.asynchronous
def test_allocated_bytes_of_fsdp_steps_are_a_function_of_the_program():
    """Note [Collectives hold no tensors]: the peak allocated bytes of three FSDP2 steps on 2 ranks are the
    same in every run (they read 12.7 to 18.8 MB when collectives dropped their tensors on the release thread)."""
    runs = [run_ranks(_fsdp_memory_figures) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2], runs
    assert runs[0][0] == runs[0][1], runs


def _future_of_an_output(rank: int, world: int) -> list[float]:
    t = torch.full((4,), rank + 1.0, device=NPU)
    future = dist.all_reduce(t, async_op=True).get_future()
    (value,) = future.wait()
    return value.cpu().tolist() + [float(value.data_ptr() == t.data_ptr())]


def test_a_works_future_gives_its_outputs():
    """A Work's future, whose outputs it holds weakly, completes with the outputs the caller still holds."""
    for result in run_ranks(_future_of_an_output):
        assert result == [3.0, 3.0, 3.0, 3.0, 1.0], result
