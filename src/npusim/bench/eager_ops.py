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
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils import benchmark

from npusim.bench.report import OpCase, compare, measure_ops, plot_op_ratios, progress, report_op_rows

OUT_VARIANT = "functional's out= variant into the output"
COPIED = "functional kernel, result copied into the output"
WIDTH = 1024  # the input is [numel / WIDTH, WIDTH]


def _on(op: Callable[[torch.Tensor], object]) -> Callable[[str, int], Callable[[], object]]:
    """The call of ``op`` on a [numel / WIDTH, WIDTH] float32 tensor; on npu through to its completion."""
    def make(device: str, numel: int) -> Callable[[], object]:
        x = torch.randn(numel // WIDTH, WIDTH).to(device)
        if device == "cpu":
            return lambda: op(x)
        torch.npu.synchronize()
        return lambda: (op(x), torch.npu.synchronize())
    return make


CASES = [
    OpCase("add", "unboxed out= kernel", _on(lambda x: x + x)),
    OpCase("relu", "clamp_min.out into the output", _on(torch.relu)),
    OpCase("leaky_relu", OUT_VARIANT, _on(lambda x: F.leaky_relu(x, 0.1))),
    OpCase("elu", OUT_VARIANT, _on(F.elu)),
    OpCase("cat", OUT_VARIANT, _on(lambda x: torch.cat([x, x]))),
    OpCase("max.dim", OUT_VARIANT, _on(lambda x: x.max(1))),
    OpCase("softmax", "unboxed out= kernel", _on(lambda x: x.softmax(-1))),
    OpCase("hardtanh", OUT_VARIANT, _on(F.hardtanh)),
    OpCase("where", OUT_VARIANT, _on(lambda x: torch.where(x > 0, x, 0.0))),
    OpCase("hardtanh_backward", COPIED, _on(lambda x: torch.ops.aten.hardtanh_backward(x, x, -1.0, 1.0))),
    OpCase("layer_norm", COPIED + " (3 results)", _on(lambda x: F.layer_norm(x, (x.shape[-1],)))),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, nargs="+", default=[1024], help=f"rows of the [rows, {WIDTH}] input")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds per measurement")


LABEL = "eager op, launch to completion"


def measure(rows_per_input: list[int], min_run_time: float,
            measurements: list[benchmark.Measurement] | None = None) -> list[dict[str, object]]:
    """One row per op and size; appends the Measurements behind them to ``measurements``."""
    import npusim  # noqa: F401  (registers the npu device)

    kept = measurements if measurements is not None else []
    return measure_ops(CASES, [n * WIDTH for n in rows_per_input], label=LABEL, min_run_time=min_run_time,
                       kept=kept)


def run(args: argparse.Namespace) -> int:
    torch.npu.synchronize()
    measurements: list[benchmark.Measurement] = []
    rows = measure(args.rows, args.min_run_time, measurements)
    progress(len(CASES) + 1, len(CASES) + 1, "done")
    compare(measurements)
    out = report_op_rows(rows, args, "eager_ops", route_header="npu task writes its result by",
                         title=f"eager op, npu launch to completion vs CPU call, float32, blocked_autorange "
                               f"median ({args.min_run_time} s each), {torch.get_num_threads()} threads")
    plot_op_ratios(rows, xlabel="npu (launch to completion) / CPU time per call",
                   title="large eager ops: npu task vs CPU call", path=out / "eager_ops.png")
    return 0
