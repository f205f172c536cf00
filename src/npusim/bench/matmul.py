"""``python -m npusim bench matmul``: compute cost on the simulated npu vs CPU.

A matmul-heavy MLP forward/backward runs on ``npu`` and on CPU, interleaved
in one run so that machine noise hits both alike. Compute ops on npu run
PyTorch's CPU kernels in place on device memory, so the ratio shows the
device layer's own overhead (dispatch, stream checks, output adoption).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)


def _step_seconds(model: nn.Module, x: torch.Tensor) -> float:
    start = time.perf_counter()
    model(x).square().mean().backward()
    if x.device.type == "npu":
        torch.npu.synchronize()
    return time.perf_counter() - start


def measure(width: int, batch: int, layers: int, repeats: int) -> dict[str, float]:
    import npusim  # noqa: F401  (registers the npu device)

    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    cpu_model = nn.Sequential(*blocks)
    npu_model = copy.deepcopy(cpu_model).to("npu")
    x_cpu = torch.randn(batch, width)
    x_npu = x_cpu.to("npu")
    for _ in range(2):  # warm-up
        _step_seconds(cpu_model, x_cpu)
        _step_seconds(npu_model, x_npu)
    cpu, npu = [], []
    for _ in range(repeats):
        cpu.append(_step_seconds(cpu_model, x_cpu))
        npu.append(_step_seconds(npu_model, x_npu))
    grads_equal = all(torch.allclose(a.grad, b.grad.cpu(), rtol=1e-4, atol=1e-5)
                      for a, b in zip(cpu_model.parameters(), npu_model.parameters(), strict=True))
    return {"cpu_ms": statistics.median(cpu) * 1e3, "npu_ms": statistics.median(npu) * 1e3,
            "ratio": statistics.median(npu) / statistics.median(cpu), "grads_equal": grads_equal,
            "threads": torch.get_num_threads()}


def run(args: argparse.Namespace) -> int:
    result = measure(args.width, args.batch, args.layers, args.repeats)
    print(f"MLP {args.layers}x Linear({args.width}, {args.width}), batch {args.batch}, forward+backward, "
          f"median of {args.repeats}, {result['threads']} threads")
    print(f"{'device':<8}{'ms/step':>10}")
    print(f"{'cpu':<8}{result['cpu_ms']:>10.2f}")
    print(f"{'npu':<8}{result['npu_ms']:>10.2f}")
    print(f"npu/cpu ratio {result['ratio']:.3f}; gradients equal: {result['grads_equal']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matmul.json").write_text(json.dumps({**vars(args), **result}, default=str, indent=1))
    return 0 if result["grads_equal"] else 1
