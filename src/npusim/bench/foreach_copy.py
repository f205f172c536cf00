"""``python -m npusim bench foreach-copy``: host cost of ``torch._foreach_copy_`` on the npu.

Two figures, each a ratio of things measured side by side in one run (docs/SPEC.md section 6):

1. host time per call, per route and list size, against CPU-native
   ``torch._foreach_copy_`` on lists of the same sizes;
2. fast-path copy throughput (call + synchronize) against one copy of a flat
   tensor holding the same bytes.

Host time is what the calling thread spends inside the call: an asynchronous
route returns once its device work is enqueued. Each sample starts from idle
streams so that queued work of earlier samples is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

import npusim
from npusim.ops import foreach_copy_mode, trace_foreach_copy
from npusim.runtime import acl


class Row(NamedTuple):
    route: str  # route label as printed
    tensors: int
    npu_us: float  # median host time per npu call
    cpu_us: float  # median host time per CPU-native call on the same sizes

    @property
    def ratio(self) -> float:
        return self.npu_us / self.cpu_us


# label -> (expected route, profile overrides, mode, source device, non_blocking)
CASES: dict[str, tuple[str, dict[str, bool], str, str, bool]] = {
    "fast (D2D)": ("fast", {}, "aligned", "npu", False),
    "fast legacy (D2D, blocking)": ("fast", {}, "legacy", "npu", False),
    "batch (H2D, blocking)": ("batch", {}, "aligned", "cpu", False),
    "batch (H2D, non_blocking)": ("batch", {}, "aligned", "cpu", True),
    "slow (D2D, nd_out off)": ("slow", {"nd_out": False}, "aligned", "npu", False),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="10,100,1000", help="comma-separated list sizes (tensors per call)")
    parser.add_argument("--numel", type=int, default=1024, help="float32 elements per tensor (default: 4 KiB)")
    parser.add_argument("--reps", type=int, default=30, help="timed calls per route and size (median reported)")
    parser.add_argument("--throughput-mib", type=int, default=64, help="bytes per throughput sample, MiB")
    parser.add_argument("--copy-gbps", type=float, default=0.0,
                        help="timing model for the host-time table: device copy bandwidth, GB/s (default: off, "
                             "copies take their real time); makes the waits of blocking routes visible")


def _median_us(fn: Callable[[], None], reps: int) -> float:
    fn()  # warm up (allocations, first-call paths)
    samples = []
    for _ in range(reps):
        acl.synchronize_all()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    acl.synchronize_all()
    return statistics.median(samples) * 1e6


def _lists(n: int, numel: int, src_device: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return ([torch.empty(numel, device="npu") for _ in range(n)],
            [torch.rand(numel, device=src_device) for _ in range(n)])


def _check_route(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool, route: str) -> None:
    """Refuses to report a figure under the wrong route label."""
    with trace_foreach_copy() as calls:
        torch._foreach_copy_(dst, src, non_blocking=non_blocking)
    acl.synchronize_all()
    if calls[0].routes != (route,):
        raise RuntimeError(f"bench foreach-copy: expected route {route!r}, got {calls[0].routes}")


def measure_host_time(sizes: list[int], numel: int, reps: int) -> list[Row]:
    rows = []
    for n in sizes:
        cpu_dst, cpu_src = [torch.empty(numel) for _ in range(n)], [torch.rand(numel) for _ in range(n)]
        cpu_us = _median_us(lambda d=cpu_dst, s=cpu_src: torch._foreach_copy_(d, s), reps)
        for label, (route, overrides, mode, src_device, non_blocking) in CASES.items():
            dst, src = _lists(n, numel, src_device)
            with npusim.use_profile("training_soc", **overrides), foreach_copy_mode(mode):
                _check_route(dst, src, non_blocking, route)
                npu_us = _median_us(lambda d=dst, s=src, nb=non_blocking: torch._foreach_copy_(d, s, non_blocking=nb),
                                    reps)
            rows.append(Row(label, n, npu_us, cpu_us))
    return rows


class Throughput(NamedTuple):
    tensors: int
    nbytes: int
    foreach_gbps: float  # fast path, call + synchronize
    flat_gbps: float  # one copy_ of a flat tensor of the same bytes, call + synchronize


def measure_throughput(total_mib: int, reps: int) -> list[Throughput]:
    nbytes = total_mib << 20
    flat_dst, flat_src = torch.empty(nbytes // 4, device="npu"), torch.rand(nbytes // 4, device="npu")

    def flat() -> None:
        flat_dst.copy_(flat_src)
        torch.npu.synchronize()

    flat_us = _median_us(flat, reps)
    results = []
    for n in (16, 256, 1024):
        dst, src = _lists(n, nbytes // 4 // n, "npu")
        _check_route(dst, src, False, "fast")

        def foreach(d: list[torch.Tensor] = dst, s: list[torch.Tensor] = src) -> None:
            torch._foreach_copy_(d, s)
            torch.npu.synchronize()

        foreach_us = _median_us(foreach, reps)
        results.append(Throughput(n, nbytes, nbytes / foreach_us / 1e3, nbytes / flat_us / 1e3))
    return results


def _plot(rows: list[Row], out: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'npusim[plot]'): no plot written"
    fig, ax = plt.subplots(figsize=(7, 4))
    for label in CASES:
        points = [(r.tensors, r.ratio) for r in rows if r.route == label]
        ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="tensors per call", ylabel="host time / CPU-native",
           title="_foreach_copy_ host time on the simulated npu")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.legend(fontsize=8)
    path = os.path.join(out, "foreach_copy.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return f"plot written to {path}"


def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    torch.npu.set_device(0)
    with npusim.timing.model(copy_gbps=args.copy_gbps):
        rows = measure_host_time(sizes, args.numel, args.reps)
    npusim.timing.set()  # throughput of the real copies
    throughput = measure_throughput(args.throughput_mib, max(3, args.reps // 3))

    model = f"timing model copy_gbps={args.copy_gbps}" if args.copy_gbps else "timing model off"
    print(f"_foreach_copy_ host time per call, float32 tensors of {args.numel * 4} B, median of {args.reps}, "
          f"{model}")
    print(f"{'route':<30}{'tensors':>8}{'npu us':>11}{'cpu-native us':>15}{'npu/cpu':>9}")
    for r in rows:
        print(f"{r.route:<30}{r.tensors:>8}{r.npu_us:>11.1f}{r.cpu_us:>15.1f}{r.ratio:>9.2f}")
    print()
    print(f"fast-path throughput vs one flat copy of the same {args.throughput_mib} MiB (call + synchronize)")
    print(f"{'tensors':>8}{'foreach GB/s':>14}{'flat GB/s':>11}{'foreach/flat':>14}")
    for t in throughput:
        print(f"{t.tensors:>8}{t.foreach_gbps:>14.2f}{t.flat_gbps:>11.2f}{t.foreach_gbps / t.flat_gbps:>14.2f}")

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "foreach_copy.json"), "w") as f:
        json.dump({"host_time": [r._asdict() for r in rows], "throughput": [t._asdict() for t in throughput],
                   "numel": args.numel, "reps": args.reps,
                   "copy_gbps": args.copy_gbps}, f, indent=1)
    print()
    print(_plot(rows, args.out))
    return 0
