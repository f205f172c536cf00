"""Runs a benchmark job on 2 (or more) spawned ranks in bounded time; shared by the
fsdp-step and fsdp-copy-in benchmarks.

The parent hosts the TCPStore on a port the OS picks (no free-port race). Each
rank imports ``npusim.distributed`` (npu device and its "hccl" backend), pins
itself to ``npu:<rank>`` and one thread (two cores are shared by all ranks),
joins the group with the given backend string and runs ``fn(rank, world, args)``.
Every rank is killed when the deadline passes or when any rank fails.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any


def _rank_main(rank: int, world: int, port: int, backend: str, timeout_s: float,
               fn: Callable[[int, int, Any], Any], args: Any, results: Any) -> None:
    import torch.distributed as dist

    try:
        import torch

        import npusim.distributed  # noqa: F401  (npu device and its collective backend)

        torch.set_num_threads(1)
        torch.npu.set_device(rank)
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        results.put((rank, True, fn(rank, world, args)))
    except BaseException:  # noqa: B036  (reported to the parent, which kills the others)
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[[int, int, Any], Any], args: Any, *, name: str, backend: str = "hccl",
              world: int = 2, timeout_s: float = 120.0) -> list[Any]:
    """``fn(rank, world, args)`` on each rank (``fn`` must be importable); results by rank.

    Raises RuntimeError with the failing rank's traceback, or on timeout.
    """
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout_s))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world, server.port, backend, timeout_s, fn, args, results))
             for r in range(world)]
    # Children read OMP_NUM_THREADS at start-up; restore the parent's afterwards.
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        for p in procs:
            p.start()
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench {name}: ranks did not finish within {timeout_s} s") from None
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(f"bench {name}: rank {dead[0]} died, exit code "
                                       f"{procs[dead[0]].exitcode}") from None
                continue
            if not ok:
                raise RuntimeError(f"bench {name}: rank {rank} failed:\n{value}")
            out[rank] = value
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [out[r] for r in range(world)]
