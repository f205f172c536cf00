"""Runs a function on several ranks (spawned processes) over the npu backend, in bounded time.

The parent hosts the TCPStore on a port the OS picks (no fixed port, no
free-port race); each rank uses ``npu:<rank>`` and never names a backend:
``init_process_group(device_id=npu:<rank>)`` picks the npu's default one, and
with ``bind_device=False`` plain ``init_process_group()`` picks the
accelerator's. Every rank is killed when the deadline passes or another rank
fails.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# Two cores are shared by every rank; more threads per rank only contend.
BASE_ENV = {"OMP_NUM_THREADS": "1"}


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rank_main(rank: int, world_size: int, port: int, pg_timeout_s: float, bind_device: bool,
               fn: Callable[..., Any], args: tuple[Any, ...], results: Any) -> None:
    try:
        import torch

        import npusim.distributed  # noqa: F401  (npu device and its collective backend)

        torch.set_num_threads(1)
        torch.npu.set_device(rank)
        timeout = timedelta(seconds=pg_timeout_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        # Without device_id torch 2.13 records GLOO as the group's default
        # backend type for a non-CUDA accelerator (only a warning at destroy).
        device_id = torch.device("npu", rank) if bind_device else None
        dist.init_process_group(store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id)
        results.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # noqa: B036  (report everything to the parent)
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 60.0,
              pg_timeout: float = 20.0, env: dict[str, str] | None = None, bind_device: bool = True) -> list[Any]:
    """Runs ``fn(rank, world_size, *args)`` on each rank; returns the results by rank.

    ``fn`` must be importable (module level). A rank that exits with status 0
    without returning (``os._exit(0)``, a dead-peer test) yields ``None``.
    Raises AssertionError with the failing rank's traceback, or on timeout.
    """
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, server.port, pg_timeout, bind_device, fn, args, results))
             for r in range(world_size)]
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        with _environ({**BASE_ENV, **(env or {})}):
            for p in procs:
                p.start()
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in out and not p.is_alive() and results.empty():
                        if p.exitcode != 0:
                            raise AssertionError(f"rank {r} died with exit code {p.exitcode}") from None
                        out[r] = None
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(out))} did not finish "
                                         f"within {timeout} s") from None
                continue
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [out[r] for r in range(world_size)]
