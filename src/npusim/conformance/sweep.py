"""The crash-safe sweep: OpInfo ops run in a pool of worker subprocesses.

Why subprocesses: an op that segfaults or hangs on npu must be recorded, not
take the sweep down. Each worker (:mod:`npusim.conformance.worker`) runs one
(op, dtype) task at a time and reports before each sample; when a worker dies
or a sample runs past ``sample_timeout_s``, that sample is recorded as
``crash``, the worker is replaced and the task resumes after the sample.
"""

from __future__ import annotations

import fnmatch
import json
import os
import selectors
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
    proc: subprocess.Popen
    fd: int
    buffer: bytes = b""
    ready: bool = False
    task: Task | None = None
    sample: int = -1
    deadline: float = 0.0
    results: list[SampleResult] = field(default_factory=list)


WORKER_ARGV = (sys.executable, "-m", "npusim.conformance.worker")


def _start_worker(selector: selectors.BaseSelector, argv: tuple[str, ...]) -> _Worker:
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [*argv, "--fd", str(write_fd)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(write_fd,), env=env)
    os.close(write_fd)
    worker = _Worker(proc, read_fd, deadline=time.monotonic() + _STARTUP_TIMEOUT_S)
    selector.register(read_fd, selectors.EVENT_READ, worker)
    return worker


def _stop_worker(selector: selectors.BaseSelector, worker: _Worker) -> int | None:
    selector.unregister(worker.fd)
    os.close(worker.fd)
    if worker.proc.poll() is None:
        worker.proc.kill()
    try:
        return worker.proc.wait(timeout=30)
    finally:
        if worker.proc.stdin:
            worker.proc.stdin.close()


def run_sweep(tasks: list[Task], *, jobs: int = 2, sample_timeout_s: float = 120.0,
              progress: Callable[[Task, list[SampleResult], int, int], None] | None = None,
              worker_argv: tuple[str, ...] = WORKER_ARGV) -> list[SampleResult]:
    """Runs ``tasks`` on ``jobs`` workers; returns every sample phase's result (crashes included).

    ``progress(task, results, done, total)`` is called as each task finishes;
    ``worker_argv`` starts a worker (``--fd N`` is appended).
    """
    pending = deque(tasks)
    total, done = len(tasks), 0
    out: list[SampleResult] = []
    selector = selectors.DefaultSelector()
    workers = [_start_worker(selector, worker_argv) for _ in range(max(1, min(jobs, len(tasks))))]

    def give(worker: _Worker) -> None:
        worker.task, worker.sample, worker.results = pending.popleft(), -1, []
        worker.deadline = time.monotonic() + sample_timeout_s
        assert worker.proc.stdin is not None
        worker.proc.stdin.write(worker.task.message().encode())
        worker.proc.stdin.flush()

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
        code = _stop_worker(selector, worker)
        workers.remove(worker)
        if task is not None:
            detail = f"{why} (exit code {code}) during sample {worker.sample}"
            worker.results.append(SampleResult(task.op, task.dtype, worker.sample, "forward", "crash", detail))
            if worker.sample >= 0 and task.crashes + 1 < _MAX_CRASHES_PER_TASK:
                # resume after the sample that crashed, before anything else
                rest = Task(task.op, task.dtype, task.samples, task.backward, worker.sample + 1, task.crashes + 1)
                out.extend(worker.results)
                pending.appendleft(rest)
            else:
                finish(worker)
        elif not worker.ready:
            raise RuntimeError(f"conformance: a sweep worker failed to start ({why}, exit code {code})")
        if pending or any(w.task for w in workers):
            workers.append(_start_worker(selector, worker_argv))

    try:
        while pending or any(w.task is not None for w in workers):
            for worker in workers:
                if worker.ready and worker.task is None and pending:
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
                        worker.ready = True
                    elif kind == "sample":
                        worker.sample = event["index"]
                        worker.deadline = time.monotonic() + sample_timeout_s
                    elif kind == "result":
                        worker.results.append(SampleResult(**event))
                    elif kind == "done":
                        finish(worker)
            now = time.monotonic()
            for worker in list(workers):
                if (worker.task is not None or not worker.ready) and now > worker.deadline:
                    crashed(worker, f"timed out after {sample_timeout_s:.0f} s")
    finally:
        for worker in list(workers):
            if worker.proc.stdin:
                worker.proc.stdin.close()
            _stop_worker(selector, worker)
        selector.close()
    return out


def results_json(results: list[SampleResult], **meta: Any) -> dict[str, Any]:
    return {**meta, "torch": torch.__version__, "results": [r.to_json() for r in results]}
