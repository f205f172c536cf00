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
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils import benchmark

from npusim.bench.report import bars, compare, progress, save_plot, timed


class Case(NamedTuple):
    name: str
    route: str  # how the npu op gets its numbers
    make: Callable[[str, int], Callable[[], object]]  # (device, numel) -> the call to time


def _fill(fill: Callable[[torch.Tensor], object]) -> Callable[[str, int], Callable[[], object]]:
    def make(device: str, numel: int) -> Callable[[], object]:
        t = torch.empty(numel, device=device)
        return lambda: fill(t)
    return make


CASES = [
    Case("uniform_", "philox kernel", _fill(lambda t: t.uniform_())),
    Case("normal_", "philox kernel", _fill(lambda t: t.normal_())),
    Case("bernoulli_(0.5)", "philox kernel", _fill(lambda t: t.bernoulli_(0.5))),
    Case("exponential_", "philox kernel", _fill(lambda t: t.exponential_())),
    Case("random_(0, 100)", "philox kernel", _fill(lambda t: t.random_(0, 100))),
    Case("dropout(p=0.1)", "philox mask and output in one pass",
         lambda device, n: (lambda t: lambda: F.dropout(t, 0.1, training=True))(torch.ones(n, device=device))),
    Case("randperm", "CPU kernel, CPU generator from philox",
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
    rows = []
    for step, case in enumerate(CASES, start=1):
        progress(step, len(CASES) + 1, f"{case.name} on sizes {sizes}, npu then CPU")
        for numel in sizes:
            sub = f"{case.name}, {numel}"
            npu, cpu = (timed(case.make(device, numel), label=LABEL, sub_label=sub, description=device,
                              min_run_time=min_run_time) for device in ("npu", "cpu"))
            kept += [npu, cpu]
            rows.append({"op": case.name, "numel": numel, "npu_us": npu.median * 1e6, "cpu_us": cpu.median * 1e6,
                         "ratio": npu.median / cpu.median, "route": case.route})
    return rows


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    ops = list(dict.fromkeys(r["op"] for r in rows))
    sizes = list(dict.fromkeys(r["numel"] for r in rows))
    ratio = {(r["op"], r["numel"]): r["ratio"] for r in rows}

    def draw(fig: Any) -> None:
        bars(fig.subplots(), ops, {f"{n} elements": [ratio[(op, n)] for op in ops] for n in sizes},
             xlabel="npu host time / CPU host time per call (log)", title=title, ref=1.0, log=True)

    save_plot(path, draw, size=(8, 0.5 * len(ops) * max(1, len(sizes)) + 1.2))


def run(args: argparse.Namespace) -> int:
    torch.npu.synchronize()
    measurements: list[benchmark.Measurement] = []
    rows = measure(args.sizes, args.min_run_time, measurements)
    progress(len(CASES) + 1, len(CASES) + 1, "done")
    compare(measurements)
    title = (f"host time per random op call, float32, blocked_autorange median ({args.min_run_time} s each), "
             f"{torch.get_num_threads()} threads")
    print(title)
    print(f"{'op':<18}{'numel':>8}{'npu us':>10}{'cpu us':>10}{'npu/cpu':>9}  npu route")
    for r in rows:
        print(f"{r['op']:<18}{r['numel']:>8}{r['npu_us']:>10.1f}{r['cpu_us']:>10.1f}{r['ratio']:>9.2f}  {r['route']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rng.json").write_text(json.dumps({**vars(args), "rows": rows}, default=str, indent=1))
    _plot(rows, "random op host time, npu Philox vs CPU generator", out / "rng.png")
    return 0
