"""``python -m npusim bench eager-ops``: one large eager op on npu (launch to completion) vs the same op on CPU.

A large op is a stream task (Note [Compute on the stream]): the host plans its outputs from the Meta kernel
and allocates them, and the stream's worker runs the CPU kernel on device memory. What the task costs beyond
CPU's own call is the device layer's overhead per op, which for a large op should be nothing: a task that
runs the functional kernel and copies its fresh result into the output allocated at launch pays an
allocation, the first touch of its pages and a copy (Note [A functional op's results in place]). Each row
is ``op(x); torch.npu.synchronize()`` on npu beside ``op(x)`` on CPU, timed side by side in one run with
``torch.utils.benchmark``'s ``blocked_autorange`` at the process's thread count; the route column says how
the task writes its result.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils import benchmark

from npusim.bench.report import bars, compare, progress, save_plot, timed

OUT_VARIANT = "functional's out= variant into the output"
COPIED = "functional kernel, result copied into the output"


class Case(NamedTuple):
    name: str
    route: str  # how the npu task writes its result
    op: Callable[[torch.Tensor], object]  # of a [rows, 1024] float32 tensor


CASES = [
    Case("add", "unboxed out= kernel", lambda x: x + x),
    Case("relu", "clamp_min.out into the output", torch.relu),
    Case("leaky_relu", OUT_VARIANT, lambda x: F.leaky_relu(x, 0.1)),
    Case("elu", OUT_VARIANT, F.elu),
    Case("cat", OUT_VARIANT, lambda x: torch.cat([x, x])),
    Case("max.dim", OUT_VARIANT, lambda x: x.max(1)),
    Case("softmax", "unboxed out= kernel", lambda x: x.softmax(-1)),
    Case("hardtanh", OUT_VARIANT, F.hardtanh),
    Case("where", OUT_VARIANT, lambda x: torch.where(x > 0, x, 0.0)),
    Case("hardtanh_backward", COPIED, lambda x: torch.ops.aten.hardtanh_backward(x, x, -1.0, 1.0)),
    Case("layer_norm", COPIED + " (3 results)", lambda x: F.layer_norm(x, (x.shape[-1],))),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, nargs="+", default=[1024], help="rows of the [rows, 1024] input")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds per measurement")


LABEL = "eager op, launch to completion"


def measure(rows_per_input: list[int], min_run_time: float,
            measurements: list[benchmark.Measurement] | None = None) -> list[dict[str, object]]:
    """One row per op and size; appends the Measurements behind them to ``measurements``."""
    import npusim  # noqa: F401  (registers the npu device)

    kept = measurements if measurements is not None else []
    rows = []
    for step, case in enumerate(CASES, start=1):
        progress(step, len(CASES) + 1, f"{case.name} on [{rows_per_input}, 1024] floats, npu then CPU")
        for n in rows_per_input:
            x = torch.randn(n, 1024)
            xn = x.to("npu")
            torch.npu.synchronize()
            sub = f"{case.name}, {n}x1024"

            def on_npu(op: Callable[[torch.Tensor], object] = case.op, t: torch.Tensor = xn) -> None:
                op(t)
                torch.npu.synchronize()

            npu = timed(on_npu, label=LABEL, sub_label=sub, description="npu", min_run_time=min_run_time)
            cpu = timed(lambda op=case.op, t=x: op(t), label=LABEL, sub_label=sub, description="cpu",
                        min_run_time=min_run_time)
            kept += [npu, cpu]
            rows.append({"op": case.name, "numel": n * 1024, "npu_us": npu.median * 1e6,
                         "cpu_us": cpu.median * 1e6, "ratio": npu.median / cpu.median, "route": case.route})
    return rows


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    ops = list(dict.fromkeys(r["op"] for r in rows))
    sizes = list(dict.fromkeys(r["numel"] for r in rows))
    ratio = {(r["op"], r["numel"]): r["ratio"] for r in rows}

    def draw(fig: Any) -> None:
        bars(fig.subplots(), ops, {f"{n} elements": [ratio[(op, n)] for op in ops] for n in sizes},
             xlabel="npu (launch to completion) / CPU time per call", title=title, ref=1.0)

    save_plot(path, draw, size=(8, 0.5 * len(ops) * max(1, len(sizes)) + 1.2))


def run(args: argparse.Namespace) -> int:
    torch.npu.synchronize()
    measurements: list[benchmark.Measurement] = []
    rows = measure(args.rows, args.min_run_time, measurements)
    progress(len(CASES) + 1, len(CASES) + 1, "done")
    compare(measurements)
    print(f"eager op, npu launch to completion vs CPU call, float32, blocked_autorange median "
          f"({args.min_run_time} s each), {torch.get_num_threads()} threads")
    print(f"{'op':<18}{'numel':>9}{'npu us':>10}{'cpu us':>10}{'npu/cpu':>9}  npu task writes its result by")
    for r in rows:
        print(f"{r['op']:<18}{r['numel']:>9}{r['npu_us']:>10.1f}{r['cpu_us']:>10.1f}{r['ratio']:>9.2f}  {r['route']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eager_ops.json").write_text(json.dumps({**vars(args), "rows": rows}, default=str, indent=1))
    _plot(rows, "large eager ops: npu task vs CPU call", out / "eager_ops.png")
    return 0
