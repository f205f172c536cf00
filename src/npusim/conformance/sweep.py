"""The crash-safe sweep: OpInfo ops run in a pool of worker subprocesses.

Why subprocesses: an op that segfaults or hangs on npu must be recorded, not
take the sweep down. Each worker (forked by the zygote of :mod:`npusim.conformance.worker`) runs one
(op, dtype) task at a time and reports before each sample; when a worker dies
or a sample runs past ``sample_timeout_s``, that sample is recorded as
``crash``, the worker is replaced and the task resumes after the sample.
"""

from __future__ import annotations

import fnmatch
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from npusim.conformance.compare import SampleResult, load_op_db

__all__ = ["WORKER_ARGV", "Task", "plan", "results_json", "run_sweep"]

# A task that crashes this many times is not resumed again.
_MAX_CRASHES_PER_TASK = 4
_STARTUP_TIMEOUT_S = 600.0


@dataclass
class Task:
    """One op for one dtype: samples ``start`` up to ``samples`` (None: all)."""

    op: str
    dtype: str
    samples: int | None
    backward: bool = True
    start: int = 0
    crashes: int = 0

    def message(self) -> str:
        return json.dumps({"op": self.op, "dtype": self.dtype, "start": self.start, "samples": self.samples,
                           "backward": self.backward}) + "\n"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _pick_dtypes(supported: Iterable[torch.dtype], mode: str | list[str]) -> list[str]:
    names = sorted(_dtype_name(d) for d in supported)
    if not names:
        return []
    if mode == "all":
        return names
    if mode == "first":
        return ["float32"] if "float32" in names else names[:1]
    chosen = [d for d in mode if d in names]
    # An op supporting none of the requested dtypes still runs once, in its first dtype.
    return chosen or (["float32"] if "float32" in names else names[:1])


def plan(patterns: list[str] | None = None, dtypes: str | list[str] = "first", samples: int | None = None,
         backward: bool = True) -> tuple[list[Task], list[str]]:
    """Tasks for the ops whose full name matches one of ``patterns`` (fnmatch; None: all).

    Returns (tasks, ops without a CPU dtype). ``dtypes``: "first" (float32 where
    supported, else the first supported by name), "all", or a list of dtype names.
    """
    tasks: list[Task] = []
    no_dtype: list[str] = []
    for op in load_op_db():
        if patterns and not any(fnmatch.fnmatchcase(op.full_name, p) for p in patterns):
            continue
        chosen = _pick_dtypes(op.supported_dtypes("cpu"), dtypes)
        if not chosen:
            no_dtype.append(op.full_name)
        tasks.extend(Task(op.full_name, d, samples, backward) for d in chosen)
    return tasks, no_dtype


@dataclass
class _Worker:
    fd: int  # events from the worker
    tasks: Any  # binary file: tasks to the worker
    pid: int = 0  # known once it is ready
    buffer: bytes = b""
    task: Task | None = None
    sample: int = -1
    deadline: float = 0.0
    results: list[SampleResult] = field(default_factory=list)


WORKER_ARGV = (sys.executable, "-m", "npusim.conformance.worker")


class _Zygote:
    """The process that forks the workers (see npusim.conformance.worker)."""

    def __init__(self, argv: tuple[str, ...], stream_tasks: bool) -> None:
        self.sock, child = socket.socketpair()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if stream_tasks:  # every op a stream task, small samples too (Note [Work on an idle stream])
            env["NPUSIM_SMALL_OPS_ON_THE_HOST"] = "0"
        self.proc = subprocess.Popen([*argv, "--socket", str(child.fileno())], pass_fds=(child.fileno(),),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env)
        child.close()
        self.sock.settimeout(_STARTUP_TIMEOUT_S)
        try:
            ready = self.sock.recv(1)
        except TimeoutError:
            ready = b""
        if ready != b"r":
            self.close()
            raise RuntimeError(f"conformance: the sweep's worker zygote did not start ({argv})")
        self.sock.settimeout(None)

    def fork(self, selector: selectors.BaseSelector) -> _Worker:
        tasks_r, tasks_w = os.pipe()
        events_r, events_w = os.pipe()
        socket.send_fds(self.sock, [b"f"], [tasks_r, events_w])
        os.close(tasks_r)
        os.close(events_w)
        worker = _Worker(events_r, os.fdopen(tasks_w, "wb"), deadline=time.monotonic() + _STARTUP_TIMEOUT_S)
        selector.register(events_r, selectors.EVENT_READ, worker)
        return worker

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _stop_worker(selector: selectors.BaseSelector, worker: _Worker) -> None:
    selector.unregister(worker.fd)
    os.close(worker.fd)
    try:
        worker.tasks.close()
    except OSError:
        pass  # the worker is gone: nothing to flush to
    if worker.pid:
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_sweep(tasks: list[Task], *, jobs: int = 2, sample_timeout_s: float = 120.0,
              progress: Callable[[Task, list[SampleResult], int, int], None] | None = None,
              worker_argv: tuple[str, ...] = WORKER_ARGV, stream_tasks: bool = False) -> list[SampleResult]:
    """Runs ``tasks`` on ``jobs`` workers; returns every sample phase's result (crashes included).

    ``progress(task, results, done, total)`` is called as each task finishes;
    ``worker_argv`` starts the zygote (``--socket FD`` is appended); ``stream_tasks``
    makes every op a stream task in the workers, as a large one is (small samples
    otherwise run on the host while the stream is idle).
    """
    pending = deque(tasks)
    total, done = len(tasks), 0
    out: list[SampleResult] = []
    selector = selectors.DefaultSelector()
    zygote = _Zygote(worker_argv, stream_tasks)
    workers = [zygote.fork(selector) for _ in range(max(1, min(jobs, len(tasks))))]

    def give(worker: _Worker) -> None:
        worker.task, worker.sample, worker.results = pending.popleft(), -1, []
        worker.deadline = time.monotonic() + sample_timeout_s
        worker.tasks.write(worker.task.message().encode())
        worker.tasks.flush()

    def finish(worker: _Worker) -> None:
        nonlocal done
        task, worker.task = worker.task, None
        assert task is not None
        out.extend(worker.results)
        done += 1
        if progress is not None:
            progress(task, worker.results, done, total)

    def crashed(worker: _Worker, why: str) -> None:
        task = worker.task
        _stop_worker(selector, worker)
        workers.remove(worker)
        if task is not None:
            worker.results.append(
                SampleResult(task.op, task.dtype, worker.sample, "forward", "crash",
                             f"{why} during sample {worker.sample}"))
            if worker.sample >= 0 and task.crashes + 1 < _MAX_CRASHES_PER_TASK:
                # resume after the sample that crashed, before anything else
                out.extend(worker.results)
                pending.appendleft(Task(task.op, task.dtype, task.samples, task.backward, worker.sample + 1,
                                        task.crashes + 1))
            else:
                finish(worker)
        elif not worker.pid:
            raise RuntimeError(f"conformance: a sweep worker failed to start ({why})")
        if pending or any(w.task for w in workers):
            workers.append(zygote.fork(selector))

    try:
        while pending or any(w.task is not None for w in workers):
            for worker in workers:
                if worker.pid and worker.task is None and pending:
                    give(worker)
            for key, _ in selector.select(timeout=0.5):
                worker = key.data
                chunk = os.read(worker.fd, 1 << 16)
                if not chunk:
                    crashed(worker, "worker died")
                    continue
                worker.buffer += chunk
                *lines, worker.buffer = worker.buffer.split(b"\n")
                for line in lines:
                    event = json.loads(line)
                    kind = event.pop("event")
                    if kind == "ready":
                        worker.pid = event["pid"]
                    elif kind == "sample":
                        worker.sample = event["index"]
                        worker.deadline = time.monotonic() + sample_timeout_s
                    elif kind == "result":
                        worker.results.append(SampleResult(**event))
                    elif kind == "done":
                        finish(worker)
            now = time.monotonic()
            for worker in list(workers):
                if (worker.task is not None or not worker.pid) and now > worker.deadline:
                    crashed(worker, f"timed out after {sample_timeout_s:.0f} s")
    finally:
        for worker in list(workers):
            _stop_worker(selector, worker)
        selector.close()
        zygote.close()
    return out


def results_json(results: list[SampleResult], **meta: Any) -> dict[str, Any]:
    return {**meta, "torch": torch.__version__, "results": [r.to_json() for r in results]}
