"""``python -m npusim bench rng``: host cost per random op, npu generator vs CPU generator.

Each random op runs on an npu tensor (drawing from the npu Philox generator,
see Note [npu Philox stream] in ``csrc/generator.h``) and on a CPU tensor of
the same size (PyTorch's CPU kernel and mt19937 generator), timed side by side
in one run with ``torch.utils.benchmark``'s ``blocked_autorange``. The npu
figure is the host time of the call; random kernels run on the host after the
stream's earlier work, so the call's return means the numbers are written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.benchmark import Timer


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
    Case("dropout(p=0.1)", "philox mask + 2 fallback muls",
         lambda device, n: (lambda t: lambda: F.dropout(t, 0.1, training=True))(torch.ones(n, device=device))),
    Case("randperm", "CPU kernel, CPU generator from philox",
         lambda device, n: lambda: torch.randperm(n, device=device)),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 65536], help="elements per op")
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement")


def _us_per_call(call: Callable[[], object], min_run_time: float) -> float:
    call()  # warm-up
    return Timer(stmt="call()", globals={"call": call}).blocked_autorange(min_run_time=min_run_time).median * 1e6


def measure(sizes: list[int], min_run_time: float) -> list[dict[str, object]]:
    import npusim  # noqa: F401  (registers the npu device)

    rows = []
    for case in CASES:
        for numel in sizes:
            npu_us = _us_per_call(case.make("npu", numel), min_run_time)
            cpu_us = _us_per_call(case.make("cpu", numel), min_run_time)
            rows.append({"op": case.name, "numel": numel, "npu_us": npu_us, "cpu_us": cpu_us,
                         "ratio": npu_us / cpu_us, "route": case.route})
    return rows


def run(args: argparse.Namespace) -> int:
    torch.npu.synchronize()
    rows = measure(args.sizes, args.min_run_time)
    print(f"host time per random op call, float32, blocked_autorange median ({args.min_run_time} s each), "
          f"{torch.get_num_threads()} threads")
    print(f"{'op':<18}{'numel':>8}{'npu us':>10}{'cpu us':>10}{'npu/cpu':>9}  npu route")
    for r in rows:
        print(f"{r['op']:<18}{r['numel']:>8}{r['npu_us']:>10.1f}{r['cpu_us']:>10.1f}{r['ratio']:>9.2f}  {r['route']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rng.json").write_text(json.dumps({**vars(args), "rows": rows}, default=str, indent=1))
    return 0
