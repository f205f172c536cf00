"""``python -m npusim bench rng``: host cost per random op, npu generator vs CPU generator.

Each random op runs on an npu tensor (drawing from the npu Philox generator,
see Note [npu Philox stream] in ``csrc/aten/generator.h``) and on a CPU tensor of
the same size (PyTorch's CPU kernel and mt19937 generator), timed side by side
in one run with ``torch.utils.benchmark``'s ``blocked_autorange`` (after a
warm-up, at the process's thread count). The npu
figure is the host time of the call; random kernels run on the host after the
stream's earlier work, so the call's return means the numbers are written.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils import benchmark

from npusim.bench.report import OpCase, compare, measure_ops, plot_op_ratios, progress, report_op_rows


def _fill(fill: Callable[[torch.Tensor], object]) -> Callable[[str, int], Callable[[], object]]:
    def make(device: str, numel: int) -> Callable[[], object]:
        t = torch.empty(numel, device=device)
        return lambda: fill(t)
    return make


CASES = [
    OpCase("uniform_", "philox kernel", _fill(lambda t: t.uniform_())),
    OpCase("normal_", "philox kernel", _fill(lambda t: t.normal_())),
    OpCase("bernoulli_(0.5)", "philox kernel", _fill(lambda t: t.bernoulli_(0.5))),
    OpCase("exponential_", "philox kernel", _fill(lambda t: t.exponential_())),
    OpCase("random_(0, 100)", "philox kernel", _fill(lambda t: t.random_(0, 100))),
    OpCase("dropout(p=0.1)", "philox mask and output in one pass",
           lambda device, n: (lambda t: lambda: F.dropout(t, 0.1, training=True))(torch.ones(n, device=device))),
    OpCase("randperm", "CPU kernel, CPU generator from philox",
           lambda device, n: lambda: torch.randperm(n, device=device)),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 65536], help="elements per op")
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement")


LABEL = "host time per random op call"


def measure(sizes: list[int], min_run_time: float,
            measurements: list[benchmark.Measurement] | None = None) -> list[dict[str, object]]:
    """One row per op and size; appends the Measurements behind them to ``measurements``."""
    import npusim  # noqa: F401  (registers the npu device)

    kept = measurements if measurements is not None else []
    return measure_ops(CASES, sizes, label=LABEL, min_run_time=min_run_time, kept=kept)


def run(args: argparse.Namespace) -> int:
    torch.npu.synchronize()
    measurements: list[benchmark.Measurement] = []
    rows = measure(args.sizes, args.min_run_time, measurements)
    progress(len(CASES) + 1, len(CASES) + 1, "done")
    compare(measurements)
    out = report_op_rows(rows, args, "rng", route_header="npu route",
                         title=f"host time per random op call, float32, blocked_autorange median "
                               f"({args.min_run_time} s each), {torch.get_num_threads()} threads")
    plot_op_ratios(rows, xlabel="npu host time / CPU host time per call (log)",
                   title="random op host time, npu Philox vs CPU generator", path=out / "rng.png", log=True)
    return 0
