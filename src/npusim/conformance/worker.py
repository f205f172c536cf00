"""One sweep worker: ``python -m npusim.conformance.worker --fd N``.

Reads tasks, one JSON object a line, from stdin:
``{"op": "add", "dtype": "float32", "start": 0, "samples": 2, "backward": true}``
and writes events, one JSON object a line, to file descriptor N (stdout and
stderr stay free for whatever the ops print):
``{"event": "sample", "index": i}`` before sample i runs, ``{"event": "result", ...}``
for each phase's :class:`~npusim.conformance.compare.SampleResult`, and
``{"event": "done"}`` after the task. A worker that dies mid-task leaves its
last ``sample`` event as the sample that crashed it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npusim.conformance.worker")
    parser.add_argument("--fd", type=int, required=True, help="file descriptor the events are written to")
    args = parser.parse_args(argv)
    events = os.fdopen(args.fd, "w", buffering=1)
    warnings.simplefilter("ignore")

    import torch

    from npusim.conformance.compare import dtype_from_name, ops_by_name, run_op

    torch.set_num_threads(1)
    ops = ops_by_name()

    def emit(event: dict) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    emit({"event": "ready"})
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        op, dtype = ops[task["op"]], dtype_from_name(task["dtype"])
        for res in run_op(op, dtype, start=task.get("start", 0), max_samples=task.get("samples"),
                          backward=task.get("backward", True),
                          on_sample=lambda i: emit({"event": "sample", "index": i})):
            emit({"event": "result", **res.to_json()})
        emit({"event": "done"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
