"""Runs a function on several spawned ranks over the npu backend, in bounded time.

Why this module exists: the multi-rank tests and the FSDP2 benchmarks all need
the same launcher, and three private copies of it (a ``_multiprocess`` helper of the
tests, a ``_ranks`` module of the benchmarks and one inside the fsdp-enhance benchmark; all
removed since) had drifted
apart in how they treated dead ranks, timeouts and cleanup. This is the one
copy; its keyword options cover what each caller needs.

How a run goes: the parent hosts the TCPStore on a port the OS picks (no fixed
port, no free-port race). Each rank is a ``spawn``-ed process that imports
:mod:`npusim.distributed` (npu device and its collective backend), uses one
thread, binds ``npu:<rank>``, joins the process group and runs
``fn(rank, world_size, *args)``; it reports its result or its traceback to the
parent through a queue. The parent enforces the deadline and kills every rank
as soon as one fails, dies or the deadline passes, then raises
:class:`RanksError` with the failing rank's traceback.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["BASE_ENV", "RanksError", "run_ranks"]

# The machine's cores are shared by every rank; more threads per rank only contend.
# Children read OMP_NUM_THREADS at start-up, so it is set while they start.
BASE_ENV = {"OMP_NUM_THREADS": "1"}

# How often the parent looks for dead ranks and the deadline while it waits for results.
_POLL_S = 0.2


class RanksError(RuntimeError, AssertionError):
    """A rank failed, died, or the ranks did not finish in time.

    A RuntimeError for library callers (the benchmarks) and an AssertionError
    too, so that in a test it reads as a failed check rather than an error.
    """


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Sets ``env`` for the duration (the spawned children inherit it), then restores the parent's."""
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


def _to_bytes(value: Any) -> bytes:
    """A rank's result as plain bytes (see Note [Results cross as bytes])."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


# Note [Results cross as bytes]
# Once torch.multiprocessing is imported (torch.distributed imports it), a
# tensor put on a multiprocessing queue travels as a handle to shared memory
# that the receiver fetches from the sender's resource sharer when it
# unpickles the item. A rank that returns and exits right after its put can be
# gone by then, and the parent's get fails with FileNotFoundError (seen about
# once in two suite runs on a loaded machine). A rank's result is therefore
# serialized with torch.save into bytes, which carry their own data.


def _rank_main(rank: int, world_size: int, port: int, backend: str | None, bind_device: bool,
               pg_timeout_s: float, fn: Callable[..., Any], args: tuple[Any, ...], results: Any) -> None:
    try:
        import npusim.distributed  # noqa: F401  (npu device and its collective backend)

        torch.set_num_threads(1)
        torch.npu.set_device(rank)
        timeout = timedelta(seconds=pg_timeout_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        # Without device_id torch 2.13 records GLOO as the group's default
        # backend type for a non-CUDA accelerator (only a warning at destroy).
        # With backend None, init_process_group picks the npu's default backend
        # (or, unbound, the accelerator's).
        device_id = torch.device("npu", rank) if bind_device else None
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                                device_id=device_id)
        results.put((rank, True, _to_bytes(fn(rank, world_size, *args))))
    except BaseException:  # noqa: B036  (report everything to the parent, which kills the others)
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, backend: str | None = None,
              bind_device: bool = True, env: dict[str, str] | None = None, timeout: float = 60.0,
              pg_timeout: float = 20.0, name: str | None = None) -> list[Any]:
    """Runs ``fn(rank, world_size, *args)`` on each of ``world_size`` ranks; returns the results by rank.

    ``fn`` and ``args`` must be picklable (``fn`` at module level), since the
    ranks are spawned. ``backend`` is passed to ``init_process_group`` as is
    (e.g. ``"hccl"`` or ``"cpu:gloo,npu:hccl"``); None lets it pick the npu's
    default. ``bind_device`` passes ``device_id=npu:<rank>``. ``env`` is added
    to :data:`BASE_ENV` in the children's environment. ``timeout`` bounds the
    whole run (and the parent's store); ``pg_timeout`` is the ranks' store and
    process-group timeout, shorter so that a stuck collective fails inside the
    rank, with a traceback, before the parent's deadline. ``name`` prefixes the
    error messages (e.g. ``"bench fsdp-step"``).

    A rank that exits with status 0 without returning (``os._exit(0)``, a
    dead-peer test) yields ``None``. Raises :class:`RanksError` with the
    failing rank's traceback, when a rank dies with another status, or when
    the ranks do not finish within ``timeout``; every rank is killed first.
    """
    prefix = f"{name}: " if name else ""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, server.port, backend, bind_device, pg_timeout, fn, args, results))
             for r in range(world_size)]
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        with _environ({**BASE_ENV, **(env or {})}):
            for p in procs:
                p.start()
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=_POLL_S)
            except queue.Empty:
                for r, p in enumerate(procs):
                    # A result still in the queue may belong to this rank: only
                    # judge a dead rank once the queue has been drained.
                    if r not in out and not p.is_alive() and results.empty():
                        if p.exitcode != 0:
                            raise RanksError(f"{prefix}rank {r} died with exit code {p.exitcode}") from None
                        out[r] = None
                if time.monotonic() > deadline:
                    raise RanksError(f"{prefix}ranks {sorted(set(range(world_size)) - set(out))} did not "
                                      f"finish within {timeout} s") from None
                continue
            if not ok:
                raise RanksError(f"{prefix}rank {rank} failed:\n{value}")
            out[rank] = _from_bytes(value)
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        # On failure the other ranks may be blocked in a collective forever: kill them.
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [out[r] for r in range(world_size)]
