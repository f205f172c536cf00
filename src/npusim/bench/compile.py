"""``python -m npusim bench compile``: torch.compile (inductor) on the npu against eager and CPU.

For one model and training step (forward + backward) it measures, on npu and on CPU:

- **first compile**: the first compiled step with empty inductor caches (in a
  fresh cache directory, in-memory caches cleared), minus one eager step; the
  process's one-time costs (imports, compile workers) are paid before;
- **cached compile**: the first step again after ``torch._dynamo.reset()``,
  served by inductor's FX graph cache from the directory above;
- **step time**: eager and compiled steps, median of ``torch.utils.benchmark``'s
  ``blocked_autorange`` after a warm-up, at the process's thread count; npu
  steps end with ``torch.npu.synchronize()`` inside the timed statement.

A compile happens once, so the two compile figures are single timed calls
(``time.perf_counter``), not Timer measurements.

Both devices run the same C++ kernels (npu memory is host memory), so
compiled npu / compiled CPU is the npu's own cost: the stream waits before each
kernel and the npu allocator. Compiled / eager on npu is what compiling buys.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils import benchmark

from npusim.bench.report import bars, compare, progress, save_plot, timed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--width", type=int, default=256, help="MLP width / transformer dim")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per step-time measurement")


class _ResidualMLP(nn.Module):
    def __init__(self, width: int, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def _build(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    if args.model == "mlp":
        x = torch.randn(args.batch, args.width)
        return _ResidualMLP(args.width), x, lambda out: out.square().mean()
    from npusim.testing.models import TinyTransformer

    model = TinyTransformer(vocab=128, dim=args.width, heads=4, seq=32, n_blocks=2, use_reentrant=None)
    tokens = torch.randint(0, 128, (args.batch, 32))
    return model, tokens, lambda logits: F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten().to(
        logits.device))


def _stepper(model: nn.Module, x: torch.Tensor, loss_fn: Callable[[torch.Tensor], torch.Tensor]
             ) -> Callable[[], None]:
    npu = x.device.type == "npu"

    def step() -> None:
        loss_fn(model(x)).backward()
        if npu:
            torch.npu.synchronize()

    return step


def _seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


STEPS = 8  # progress lines: the warm-up compile, three per device, done


def measure(args: argparse.Namespace, measurements: list[benchmark.Measurement] | None = None
            ) -> dict[str, dict[str, float]]:
    """Per device (cpu, npu): first_compile_s, cached_compile_s, eager_ms, compiled_ms; appends the
    step-time Measurements to ``measurements``."""
    from torch._inductor.utils import fresh_cache

    import npusim  # noqa: F401  (registers the npu device and torch.compile support)

    kept = measurements if measurements is not None else []
    base, x, loss_fn = _build(args)
    progress(1, STEPS, "warm-up compile (inductor imports, compile workers), not measured")
    # Pays the process's one-time costs (inductor's imports, its compile workers) before
    # either device is timed, so that the first device measured is not charged for them.
    with fresh_cache():
        torch.compile(lambda t: t + 1)(torch.ones(4))
    torch._dynamo.reset()
    results: dict[str, dict[str, float]] = {}
    sub = _shape(args)
    for i, device in enumerate(("cpu", "npu")):
        progress(2 + 3 * i, STEPS, f"{device}: eager step, first compile (fresh inductor cache), cached compile")
        eager_model = copy.deepcopy(base).to(device)
        compiled_model = copy.deepcopy(base).to(device)
        xd = x.to(device)
        eager = _stepper(eager_model, xd, loss_fn)
        eager()  # warm-up
        eager_once = _seconds(eager)
        compiled_model.compile()
        compiled = _stepper(compiled_model, xd, loss_fn)
        with fresh_cache():
            first = _seconds(compiled) - eager_once
            torch._dynamo.reset()
            cached = _seconds(compiled) - eager_once
        progress(3 + 3 * i, STEPS, f"{device}: eager step time, blocked_autorange {args.min_run_time:g} s")
        kept.append(timed(eager, label="forward+backward step", sub_label=f"{sub}, {device}", description="eager",
                          min_run_time=args.min_run_time))
        progress(4 + 3 * i, STEPS, f"{device}: compiled step time, blocked_autorange {args.min_run_time:g} s")
        kept.append(timed(compiled, label="forward+backward step", sub_label=f"{sub}, {device}",
                          description="compiled", min_run_time=args.min_run_time))
        results[device] = {
            "first_compile_s": first,
            "cached_compile_s": cached,
            "eager_ms": kept[-2].median * 1e3,
            "compiled_ms": kept[-1].median * 1e3,
        }
        torch._dynamo.reset()
    return results


def _shape(args: argparse.Namespace) -> str:
    shape = f"width {args.width}" if args.model == "mlp" else f"dim {args.width}, seq 32, 2 blocks"
    return f"{args.model} ({shape}), batch {args.batch}"


def _plot(results: dict[str, dict[str, float]], title: str, path: Path) -> None:
    devices = list(results)

    def draw(fig: Any) -> None:
        compile_ax, step_ax = fig.subplots(1, 2)
        bars(compile_ax, devices, {k: [results[d][f"{k}_compile_s"] for d in devices] for k in ("first", "cached")},
             xlabel="seconds", title="compile (first: fresh cache; cached: FX graph cache)")
        bars(step_ax, devices, {k: [results[d][f"{k}_ms"] for d in devices] for k in ("eager", "compiled")},
             xlabel="ms per step (median)", title="forward+backward step")
        fig.suptitle(title, fontsize=10)

    save_plot(path, draw, size=(10, 3.2))


def run(args: argparse.Namespace) -> int:
    measurements: list[benchmark.Measurement] = []
    results = measure(args, measurements)
    progress(STEPS, STEPS, "done")
    compare(measurements)
    title = f"torch.compile (inductor), {_shape(args)}, forward+backward, {torch.get_num_threads()} threads"
    print(title)
    print(f"{'device':<8}{'first compile s':>16}{'cached compile s':>18}{'eager ms':>10}{'compiled ms':>13}"
          f"{'compiled/eager':>16}")
    for device, r in results.items():
        print(f"{device:<8}{r['first_compile_s']:>16.1f}{r['cached_compile_s']:>18.1f}{r['eager_ms']:>10.2f}"
              f"{r['compiled_ms']:>13.2f}{r['compiled_ms'] / r['eager_ms']:>16.3f}")
    npu, cpu = results["npu"], results["cpu"]
    print(f"compiled npu / compiled cpu: {npu['compiled_ms'] / cpu['compiled_ms']:.3f}; "
          f"eager npu / eager cpu: {npu['eager_ms'] / cpu['eager_ms']:.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile.json").write_text(json.dumps({**vars(args), **results}, default=str, indent=1))
    _plot(results, title, out / "compile.png")
    return 0
