"""``python -m npusim bench foreach-copy``: host cost of ``torch._foreach_copy_`` on the npu.

Two figures, each a ratio of things measured side by side in one run (docs/SPEC.md section 6):

1. host time per call, per route and list size, against CPU-native
   ``torch._foreach_copy_`` on lists of the same sizes;
2. fast-path copy throughput (call + synchronize) against one copy of a flat
   tensor holding the same bytes.

Host time is what the calling thread spends inside the call: an asynchronous
route returns once its device work is enqueued. Each sample is one call that
starts from idle streams, so that queued work of earlier samples is not
counted: a fixed number of samples, each after an untimed drain
(``report.repeated``), where ``blocked_autorange`` would time blocks of calls
over a growing queue. Throughput samples include the synchronize and are
timed with ``blocked_autorange``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils import benchmark

import npusim
from npusim.bench.report import compare, progress, repeated, save_plot, timed
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
    parser.add_argument("--min-run-time", type=float, default=0.3,
                        help="seconds of blocked_autorange per throughput measurement (default 0.3)")
    parser.add_argument("--copy-gbps", type=float, default=0.0,
                        help="timing model for the host-time table: device copy bandwidth, GB/s (default: off, "
                             "copies take their real time); makes the waits of blocking routes visible")


HOST_LABEL = "_foreach_copy_ host time per call"
CPU_NATIVE = "CPU native"


def _host_time(fn: Callable[[], None], reps: int, route: str, n: int) -> benchmark.Measurement:
    m = repeated(fn, repeats=reps, setup=acl.synchronize_all, label=HOST_LABEL, sub_label=route,
                 description=f"{n} tensors")
    acl.synchronize_all()
    return m


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


def measure_host_time(sizes: list[int], numel: int, reps: int,
                      measurements: list[benchmark.Measurement] | None = None) -> list[Row]:
    """One Row per route and size; appends the Measurements behind them to ``measurements``."""
    rows, kept = [], measurements if measurements is not None else []
    for step, n in enumerate(sizes, start=1):
        progress(step, len(sizes) + 1, f"host time per call, {n} tensors: CPU native, then {len(CASES)} npu routes")
        cpu_dst, cpu_src = [torch.empty(numel) for _ in range(n)], [torch.rand(numel) for _ in range(n)]
        cpu = _host_time(lambda d=cpu_dst, s=cpu_src: torch._foreach_copy_(d, s), reps, CPU_NATIVE, n)
        kept.append(cpu)
        for label, (route, overrides, mode, src_device, non_blocking) in CASES.items():
            dst, src = _lists(n, numel, src_device)
            with npusim.use_profile("training_soc", **overrides), foreach_copy_mode(mode):
                _check_route(dst, src, non_blocking, route)
                npu = _host_time(lambda d=dst, s=src, nb=non_blocking: torch._foreach_copy_(d, s, non_blocking=nb),
                                 reps, label, n)
            kept.append(npu)
            rows.append(Row(label, n, npu.median * 1e6, cpu.median * 1e6))
    return rows


class Throughput(NamedTuple):
    tensors: int
    nbytes: int
    foreach_gbps: float  # fast path, call + synchronize
    flat_gbps: float  # one copy_ of a flat tensor of the same bytes, call + synchronize


THROUGHPUT_LABEL = "fast-path copy, call + synchronize"


def measure_throughput(total_mib: int, min_run_time: float,
                       measurements: list[benchmark.Measurement] | None = None) -> list[Throughput]:
    """Fast path on 16 / 256 / 1024 tensors against one flat copy of ``total_mib``; appends the
    Measurements behind them to ``measurements``."""
    nbytes = total_mib << 20
    kept = measurements if measurements is not None else []
    flat_dst, flat_src = torch.empty(nbytes // 4, device="npu"), torch.rand(nbytes // 4, device="npu")

    def flat() -> None:
        flat_dst.copy_(flat_src)
        torch.npu.synchronize()  # inside the timed statement: the copy is done

    sub = f"{total_mib} MiB"
    kept.append(timed(flat, label=THROUGHPUT_LABEL, sub_label=sub, description="1 flat tensor",
                      min_run_time=min_run_time))
    flat_s = kept[-1].median
    results = []
    for n in (16, 256, 1024):
        dst, src = _lists(n, nbytes // 4 // n, "npu")
        _check_route(dst, src, False, "fast")

        def foreach(d: list[torch.Tensor] = dst, s: list[torch.Tensor] = src) -> None:
            torch._foreach_copy_(d, s)
            torch.npu.synchronize()

        kept.append(timed(foreach, label=THROUGHPUT_LABEL, sub_label=sub, description=f"{n} tensors",
                          min_run_time=min_run_time))
        results.append(Throughput(n, nbytes, nbytes / kept[-1].median / 1e9, nbytes / flat_s / 1e9))
    return results


def _plot(rows: list[Row], throughput: list[Throughput], path: Path) -> None:
    def draw(fig: Any) -> None:
        ax, tx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        for label in CASES:
            points = [(r.tensors, r.ratio) for r in rows if r.route == label]
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="tensors per call", ylabel="host time / CPU-native",
               title="_foreach_copy_ host time on the simulated npu")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.legend(fontsize=8)
        tx.bar([str(t.tensors) for t in throughput], [t.foreach_gbps for t in throughput], color="#4c72b0",
               label="fast path")
        tx.axhline(throughput[0].flat_gbps, color="#c44e52", linewidth=1.2, label="one flat copy")
        tx.set(xlabel="tensors per call", ylabel="GB/s (call + synchronize)",
               title=f"fast-path throughput, {throughput[0].nbytes >> 20} MiB")
        tx.legend(fontsize=8)

    save_plot(path, draw, size=(11, 4))


def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    torch.npu.set_device(0)
    host: list[benchmark.Measurement] = []
    with npusim.timing.model(copy_gbps=args.copy_gbps):
        rows = measure_host_time(sizes, args.numel, args.reps, host)
    npusim.timing.set()  # throughput of the real copies
    progress(len(sizes) + 1, len(sizes) + 1, f"fast-path throughput, {args.throughput_mib} MiB, "
             f"blocked_autorange {args.min_run_time:g} s each")
    copies: list[benchmark.Measurement] = []
    throughput = measure_throughput(args.throughput_mib, args.min_run_time, copies)
    compare(host + copies)

    model = f"timing model copy_gbps={args.copy_gbps}" if args.copy_gbps else "timing model off"
    print(f"_foreach_copy_ host time per call, float32 tensors of {args.numel * 4} B, median of {args.reps}, "
          f"{model}")
    print(f"{'route':<30}{'tensors':>8}{'npu us':>11}{'cpu-native us':>15}{'npu/cpu':>9}")
    for r in rows:
        print(f"{r.route:<30}{r.tensors:>8}{r.npu_us:>11.1f}{r.cpu_us:>15.1f}{r.ratio:>9.2f}")
    print()
    print(f"fast-path throughput vs one flat copy of the same {args.throughput_mib} MiB (call + synchronize, "
          f"blocked_autorange medians)")
    print(f"{'tensors':>8}{'foreach GB/s':>14}{'flat GB/s':>11}{'foreach/flat':>14}")
    for t in throughput:
        print(f"{t.tensors:>8}{t.foreach_gbps:>14.2f}{t.flat_gbps:>11.2f}{t.foreach_gbps / t.flat_gbps:>14.2f}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "foreach_copy.json").write_text(json.dumps(
        {"host_time": [r._asdict() for r in rows], "throughput": [t._asdict() for t in throughput],
         "numel": args.numel, "reps": args.reps, "copy_gbps": args.copy_gbps, "min_run_time": args.min_run_time},
        indent=1))
    print()
    _plot(rows, throughput, out / "foreach_copy.png")
    return 0
