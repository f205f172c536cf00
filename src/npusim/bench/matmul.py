"""``python -m npusim bench matmul``: compute cost on the simulated npu vs CPU.

A matmul-heavy MLP forward/backward runs on ``npu`` and on CPU, taking turns
step by step in one run (which goes first alternates) so that machine noise
hits both alike; a fixed number of steps each, timed with ``timeit``'s timer
as ``torch.utils.benchmark`` does, npu steps until ``torch.npu.synchronize()``
returns. Compute ops on npu run PyTorch's CPU kernels in place on device
memory, so the ratio shows the device layer's own overhead (dispatch, stream
checks, output adoption).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npusim.bench.report import compare, interleaved, measurement, measurement_bars, progress, save_plot

WARMUP = 2  # steps per device not measured (first-call paths, allocations)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20, help="measured steps per device (median reported)")


def _step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    npu = x.device.type == "npu"

    def step() -> None:
        model(x).square().mean().backward()
        if npu:
            torch.npu.synchronize()  # inside the timed statement: the step's device work is done

    return step


def measure(width: int, batch: int, layers: int, repeats: int) -> dict[str, Any]:
    """Medians (``cpu_ms``, ``npu_ms``, ``ratio``), ``grads_equal``, ``threads`` and the per-step
    seconds (``cpu_times_s``, ``npu_times_s``)."""
    import npusim  # noqa: F401  (registers the npu device)

    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    cpu_model = nn.Sequential(*blocks)
    npu_model = copy.deepcopy(cpu_model).to("npu")
    x_cpu = torch.randn(batch, width)
    x_npu = x_cpu.to("npu")
    times = interleaved({"cpu": _step(cpu_model, x_cpu), "npu": _step(npu_model, x_npu)}, repeats, warmup=WARMUP)
    grads_equal = all(torch.allclose(a.grad, b.grad.cpu(), rtol=1e-4, atol=1e-5)
                      for a, b in zip(cpu_model.parameters(), npu_model.parameters(), strict=True))
    cpu, npu = statistics.median(times["cpu"]), statistics.median(times["npu"])
    return {"cpu_ms": cpu * 1e3, "npu_ms": npu * 1e3, "ratio": npu / cpu, "grads_equal": grads_equal,
            "threads": torch.get_num_threads(), "cpu_times_s": times["cpu"], "npu_times_s": times["npu"]}


def run(args: argparse.Namespace) -> int:
    progress(1, 2, f"MLP forward+backward, cpu and npu taking turns: {WARMUP} warm-up + {args.repeats} "
             f"measured steps each")
    result = measure(args.width, args.batch, args.layers, args.repeats)
    progress(2, 2, "done")
    shape = f"{args.layers}x Linear({args.width}, {args.width}), batch {args.batch}"
    ms = [measurement(result[f"{d}_times_s"], label="MLP forward+backward", sub_label=shape, description=d)
          for d in ("cpu", "npu")]
    compare(ms)
    print(f"MLP {shape}, forward+backward, median of {args.repeats}, {result['threads']} threads")
    print(f"{'device':<8}{'ms/step':>10}")
    print(f"{'cpu':<8}{result['cpu_ms']:>10.2f}")
    print(f"{'npu':<8}{result['npu_ms']:>10.2f}")
    print(f"npu/cpu ratio {result['ratio']:.3f}; gradients equal: {result['grads_equal']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matmul.json").write_text(json.dumps({**vars(args), **result}, default=str, indent=1))

    def draw(fig: Any) -> None:
        measurement_bars(fig.subplots(), ms, scale=1e3, unit="ms per step (median, interquartile whiskers)",
                         title=f"MLP {shape}: npu/cpu {result['ratio']:.2f}")

    save_plot(out / "matmul.png", draw, size=(7, 2.6))
    return 0 if result["grads_equal"] else 1
