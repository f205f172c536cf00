"""``python -m npusim bench allocator``: what the caching allocator holds for the patterns that made the old
exact-size cache grow without bound (issue 24), and its host cost next to CPU's allocator.

Each pattern (``npusim.testing.alloc_patterns``) runs in a fresh process so that its peak resident set is its
own: a loop over shrinking sizes, and PyTorch's ``test_cudnn_multiple_threads_same_device`` at PyTorch's sizes
(2 threads x 1000 conv2d calls on a 2048x2048 image shrinking a row per call, 3 trials). The figures are the
allocator's statistics at the end (allocated, reserved, peak reserved, segments) and the process's peak RSS.
The host-cost rows time ``torch.empty`` + free of one size and of a cycle of 16 sizes, npu vs CPU
(``torch.utils.benchmark``, medians).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark

from npusim.bench.report import bars, compare, progress, save_plot, timed

MIB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", type=int, default=2048, help="conv2d pattern: image side")
    parser.add_argument("--iters", type=int, default=1000, help="conv2d pattern: calls per thread and trial")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000, help="shrinking pattern: sizes")
    parser.add_argument("--top-mib", type=int, default=16, help="shrinking pattern: the first size")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds per host-cost measurement")


def _child(pattern: str, params: list[int]) -> dict[str, Any]:
    """Runs one pattern in this (fresh) process and returns its figures."""
    import npusim  # noqa: F401  (registers the npu device)
    from npusim.testing import alloc_patterns

    start = time.perf_counter()
    if pattern == "shrinking":
        alloc_patterns.shrinking_sizes(params[0], params[1] * MIB, device=0)
    else:
        alloc_patterns.conv2d_threads(*params, device=0)
    seconds = time.perf_counter() - start
    s = torch.npu.memory_stats(0)
    return {"pattern": pattern, "params": params, "seconds": seconds,
            "allocated_mib": s["allocated_bytes.all.current"] / MIB,
            "reserved_mib": s["reserved_bytes.all.current"] / MIB,
            "peak_reserved_mib": s["reserved_bytes.all.peak"] / MIB, "segments": s["segment.all.current"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _run_pattern(pattern: str, params: list[int]) -> dict[str, Any]:
    command = [sys.executable, "-m", "npusim.bench.allocator", pattern, *map(str, params)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"bench allocator: {pattern} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _host_cost(min_run_time: float, measurements: list[benchmark.Measurement]) -> list[dict[str, Any]]:
    import npusim  # noqa: F401

    sizes = [(1 << k) + 100 * k for k in range(10, 26)]  # 1 KiB .. 32 MiB, none a power of two
    cases = {"empty + free, 64 KiB": lambda device: lambda: torch.empty(65536, dtype=torch.uint8, device=device),
             "empty + free, 16 sizes 1 KiB-32 MiB": lambda device: lambda: [
                 torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]}
    rows = []
    for name, make in cases.items():
        npu, cpu = (timed(make(device), label="host time of an allocation", sub_label=name, description=device,
                          min_run_time=min_run_time) for device in ("npu", "cpu"))
        measurements += [npu, cpu]
        rows.append({"case": name, "npu_us": npu.median * 1e6, "cpu_us": cpu.median * 1e6,
                     "ratio": npu.median / cpu.median})
    return rows


def run(args: argparse.Namespace) -> int:
    patterns = [("shrinking", [args.steps, args.top_mib]),
                ("conv2d-threads", [args.image, args.iters, args.threads, args.trials])]
    results = []
    for step, (pattern, params) in enumerate(patterns, start=1):
        progress(step, len(patterns) + 2, f"{pattern} {params} in a fresh process")
        results.append(_run_pattern(pattern, params))
    progress(len(patterns) + 1, len(patterns) + 2, "host cost of allocations, npu then CPU")
    measurements: list[benchmark.Measurement] = []
    costs = _host_cost(args.min_run_time, measurements)
    progress(len(patterns) + 2, len(patterns) + 2, "done")
    compare(measurements)
    print(f"{'pattern':<20}{'params':<24}{'allocated':>11}{'reserved':>11}{'peak res.':>11}{'segments':>10}"
          f"{'peak RSS':>11}{'seconds':>9}")
    for r in results:
        print(f"{r['pattern']:<20}{str(r['params']):<24}{r['allocated_mib']:>7.1f} MiB{r['reserved_mib']:>7.1f} MiB"
              f"{r['peak_reserved_mib']:>7.1f} MiB{r['segments']:>10}{r['peak_rss_mib']:>7.0f} MiB{r['seconds']:>9.1f}")
    for c in costs:
        print(f"{c['case']:<40}npu {c['npu_us']:8.2f} us  CPU {c['cpu_us']:8.2f} us  npu/CPU {c['ratio']:.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "allocator.json").write_text(json.dumps({**vars(args), "patterns": results, "host_cost": costs},
                                                   default=str, indent=1))
    save_plot(out / "allocator.png", lambda fig: bars(
        fig.add_subplot(), [r["pattern"] for r in results],
        {"peak reserved": [r["peak_reserved_mib"] for r in results], "peak RSS": [r["peak_rss_mib"] for r in results]},
        xlabel="MiB", title="caching allocator: what the patterns hold"))
    return 0


if __name__ == "__main__":  # a pattern's fresh process (see _run_pattern)
    print(json.dumps(_child(sys.argv[1], [int(a) for a in sys.argv[2:]])))
