"""Sweep workers, forked from a zygote: ``python -m npusim.conformance.worker --socket FD``.

Why a zygote: a worker killed by a crashing op must be replaced, and a fresh
interpreter spends seconds importing torch, npusim and the OpInfo database
(minutes on a loaded machine). The zygote imports all that once, never touches
the npu (fork after npu use is refused), and forks a worker per request.

Protocol. The sweep sends the zygote, over the Unix socket ``FD``, one byte
with two file descriptors attached: the read end of a task pipe and the write
end of an event pipe. The forked worker reads tasks, one JSON object a line:
``{"op": "add", "dtype": "float32", "start": 0, "samples": 2, "backward": true}``
and writes events, one JSON object a line: ``{"event": "ready", "pid": P}``
once, ``{"event": "sample", "index": i}`` before sample i runs, ``{"event":
"result", ...}`` for each phase's :class:`~npusim.conformance.compare.SampleResult`
and ``{"event": "done"}`` after each task. A worker that dies mid-task leaves
its last ``sample`` event as the sample that crashed it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import warnings


def serve(tasks_fd: int, events_fd: int) -> None:
    """The worker loop: runs tasks until the task pipe closes."""
    import torch

    from npusim.conformance.compare import dtype_from_name, ops_by_name, run_op

    events = os.fdopen(events_fd, "w", buffering=1)
    ops = ops_by_name()

    def emit(event: dict) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    emit({"event": "ready", "pid": os.getpid()})
    with os.fdopen(tasks_fd, "r") as tasks:
        for line in tasks:
            if not line.strip():
                continue
            task = json.loads(line)
            op, dtype = ops[task["op"]], dtype_from_name(task["dtype"])
            torch.set_num_threads(1)
            for res in run_op(op, dtype, start=task.get("start", 0), max_samples=task.get("samples"),
                              backward=task.get("backward", True),
                              on_sample=lambda i: emit({"event": "sample", "index": i})):
                emit({"event": "result", **res.to_json()})
            emit({"event": "done"})


def zygote(sock: socket.socket) -> None:
    """Forks a worker for each pair of descriptors received; returns when the socket closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    while True:
        _, fds, _, _ = socket.recv_fds(sock, 1, 2)
        if not fds:
            return
        tasks_fd, events_fd = fds
        if os.fork() == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                serve(tasks_fd, events_fd)
            finally:
                os._exit(0)
        os.close(tasks_fd)
        os.close(events_fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npusim.conformance.worker")
    parser.add_argument("--socket", type=int, required=True, help="the Unix socket the sweep sends pipes over")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    sock = socket.socket(fileno=args.socket)

    from npusim.conformance.compare import load_op_db

    load_op_db()  # imported before the fork, once
    sock.sendall(b"r")  # ready
    zygote(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
