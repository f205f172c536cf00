"""``python -m npusim conformance ops|misuse``: OpInfo sweeps, npu against CPU.

``ops``, the differential sweep, prints a line per (op, dtype) as it
finishes, then a table by status (ops, op-dtype pairs, forward and backward
samples), the failures and stale expected-failure entries, and writes every
sample's result as JSON. Exits 1 when any op fails, errs, crashes or xpasses.

``misuse`` runs :mod:`npusim.conformance.misuse` (calls PyTorch's kernels
refuse, each a stream task: error inputs, out= tensors of another dtype,
written tensors that overlap) in this process, prints the outcomes per kind
and every finding, and writes them as JSON. Exits 1 on any finding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

from npusim.conformance.compare import SampleResult
from npusim.conformance.judge import BAD, judge
from npusim.conformance.misuse import KINDS
from npusim.conformance.sweep import Task, plan, results_json, run_sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["ops", "misuse"],
                        help="what to check: ops = PyTorch's OpInfo database, npu against CPU; misuse = calls "
                             "PyTorch's kernels refuse (error inputs, out= dtypes, overlapping written tensors), "
                             "each a stream task")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="misuse: comma-separated kinds (default: %(default)s)")
    parser.add_argument("--ops", default=None,
                        help="comma-separated fnmatch patterns of OpInfo full names (default: all ops)")
    parser.add_argument("--dtypes", default="all",
                        help="'all' (every dtype the op supports on CPU), 'first' (float32 or the first "
                             "supported) or comma-separated dtype names (default: all)")
    parser.add_argument("--samples", type=int, default=None, help="at most N samples per op and dtype (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument("--no-backward", action="store_true", help="compare forward results only")
    parser.add_argument("--json", default=None,
                        help="where the results go (default: conformance-ops.json / conformance-misuse.json)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--stream-tasks", action="store_true",
                        help="every op a stream task, as a large one is (small samples otherwise run on the host "
                             "while the stream is idle): checks the outputs planned at launch and the task's kernel")


def _progress(task: Task, results: list[SampleResult], done: int, total: int) -> None:
    counts = Counter(r.status for r in results)
    text = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    print(f"[{done:>5}/{total}] {task.op} {task.dtype}: {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    return _misuse(args) if args.what == "misuse" else _ops(args)


def _misuse(args: argparse.Namespace) -> int:
    import torch

    import npusim  # noqa: F401  (registers the npu device)
    from npusim.conformance.misuse import sweep

    kinds = args.kinds.split(",")
    if args.dtypes == "first":
        dtypes = [torch.float32]
    elif args.dtypes == "all":
        dtypes = list(dict.fromkeys(d for d in vars(torch).values() if isinstance(d, torch.dtype)))
    else:
        dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    done = [0]

    def progress(op: str) -> None:
        done[0] += 1
        if not args.quiet:
            print(f"[{done[0]:>4}] {op}", flush=True)

    started = time.monotonic()
    report = sweep(kinds, args.ops.split(",") if args.ops else None, dtypes, args.samples, progress)
    elapsed = time.monotonic() - started
    outcomes = ("refused", "ran", "device failed", "mismatch")
    print(f"\n{'kind':<14}" + "".join(f"{o:>15}" for o in outcomes))
    for kind in kinds:
        print(f"{kind:<14}" + "".join(f"{report.counts[kind, o]:>15}" for o in outcomes))
    for f in report.findings:
        print(f"  {f.verdict:<13} {f.kind} {f.op} {f.case}: {f.detail}")
    print(f"{len(report.findings)} findings over {done[0]} ops in {elapsed:.0f} s")
    path = args.json or "conformance-misuse.json"
    with open(path, "w") as out:
        json.dump({"command": " ".join(sys.argv), "elapsed_s": round(elapsed, 1),
                   "counts": [{"kind": k, "outcome": o, "calls": n} for (k, o), n in sorted(report.counts.items())],
                   "findings": [vars(f) for f in report.findings]}, out, indent=0)
    print(f"results: {path}")
    return 1 if report.findings else 0


def _ops(args: argparse.Namespace) -> int:
    patterns = args.ops.split(",") if args.ops else None
    dtypes = args.dtypes if args.dtypes in ("all", "first") else args.dtypes.split(",")
    tasks, no_dtype = plan(patterns, dtypes, args.samples, not args.no_backward)
    if not tasks and not no_dtype:
        print(f"conformance: no OpInfo op matches {args.ops!r}", file=sys.stderr)
        return 2
    started = time.monotonic()
    results = run_sweep(tasks, jobs=args.jobs, progress=None if args.quiet else _progress,
                        stream_tasks=args.stream_tasks)
    elapsed = time.monotonic() - started
    summary = judge(results, no_dtype)
    print()
    print(summary.table())
    ran = sum(1 for s in summary.ops.values() if s != "skip")
    print(f"\n{sum(1 for s in summary.ops.values() if s == 'pass')}/{ran} ops that run on CPU pass on npu "
          f"({100 * summary.pass_rate():.1f}%); {len(tasks)} op-dtype tasks in {elapsed:.0f} s on {args.jobs} jobs")
    bad = [r for r in summary.results if r.status in BAD]
    for r in bad[:200]:
        print(f"  {r.status:<6} {r.op} {r.dtype} sample {r.index} {r.phase}: {r.detail}")
    for line in summary.xpass:
        print(f"  xpass  {line}")
    path = args.json or "conformance-ops.json"
    with open(path, "w") as f:
        json.dump(results_json(summary.results, command=" ".join(sys.argv), elapsed_s=round(elapsed, 1),
                               ops=summary.ops, xpass=summary.xpass), f, indent=0)
    print(f"results: {path}")
    return 1 if bad or summary.xpass else 0
