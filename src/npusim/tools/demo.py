"""``python -m npusim demo``: npusim's main job, end to end on the simulated npu.

Trains a small transformer on ``npu`` next to the same model on CPU (steps taking
turns), and shows what npusim adds: the route each ``_foreach_copy_`` call took
(the aligned fast path is asynchronous whatever ``non_blocking`` says), stream
asynchrony under the timing model, and device memory accounting.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from npusim.bench.report import interleaved
from npusim.testing.models import SEQ, VOCAB, demo_model

WARMUP_STEPS = 2  # left out of the step-time ratio: first-call paths, allocations, autograd's device thread


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--no-fsdp", action="store_true", help="skip the 2-rank FSDP2 part (torchrun)")


def _run_fsdp_ranks(timeout_s: float = 300) -> int:
    """Runs npusim.tools.fsdp_demo on 2 ranks with torchrun; returns its exit code."""
    from npusim.testing.torchrun import TorchrunTimeoutError, run_torchrun

    try:
        return run_torchrun(["-m", "npusim.tools.fsdp_demo"], nproc=2, timeout_s=timeout_s).returncode
    except TorchrunTimeoutError as exc:
        print(exc)
        return 1


def _trainer(model: nn.Module, device: str) -> tuple[Callable[[], None], list[float]]:
    """One training step of ``model`` on ``device`` per call, and the list its losses go to; a step
    ends with ``loss.item()``, which waits for the device."""
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    losses: list[float] = []

    def step() -> None:
        tokens = torch.randint(0, VOCAB, (8, SEQ), generator=gen)
        logits = model(tokens.to(device))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten().to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())

    return step, losses


def _step_time_ratio(npu: list[float], cpu: list[float]) -> str:
    """npu/cpu of the median step time after the warm-up steps (all steps when there are too few)."""
    skip = WARMUP_STEPS if len(npu) > WARMUP_STEPS else 0
    ratio = statistics.median(npu[skip:]) / statistics.median(cpu[skip:])
    which = f"after {skip} warm-up steps" if skip else "no warm-up step left out (too few steps)"
    return f"step time npu/cpu {ratio:.2f} (median of {len(npu) - skip} steps, {which})"


def run(args: argparse.Namespace) -> int:
    import npusim
    from npusim.ops import trace_foreach_copy

    print(f"npusim {npusim.__version__}: {torch.npu.device_count()} simulated npu devices, "
          f"profile {npusim.get_profile().name}")
    torch.manual_seed(0)
    model = demo_model()
    cpu_step, cpu_losses = _trainer(copy.deepcopy(model), "cpu")
    npu_step, npu_losses = _trainer(copy.deepcopy(model), "npu")
    # Steps taking turns, so that the process's cold start and the machine's load hit both alike.
    times = interleaved({"cpu": cpu_step, "npu": npu_step}, args.steps)
    print("\nstep  loss(cpu)   loss(npu)")
    for step, (a, b) in enumerate(zip(cpu_losses, npu_losses, strict=True)):
        print(f"{step:>4}  {a:9.5f}   {b:9.5f}")
    max_diff = max(abs(a - b) for a, b in zip(cpu_losses, npu_losses, strict=True))
    print(f"max |loss difference| {max_diff:.2e}; {_step_time_ratio(times['npu'], times['cpu'])}")

    print("\n_foreach_copy_ routes (the call FSDP2 makes: default non_blocking=False)")
    srcs = [torch.randn(4096, device="npu") for _ in range(100)]
    dsts = [torch.empty(4096, device="npu") for _ in srcs]
    host_srcs = [s.cpu() for s in srcs]
    torch.npu.synchronize()
    with npusim.timing.model(copy_gbps=1.0), trace_foreach_copy() as calls:
        begin = time.perf_counter()
        torch._foreach_copy_(dsts, srcs)
        returned_ms = (time.perf_counter() - begin) * 1e3
        pending = torch.npu.current_stream().pending()
        torch.npu.synchronize()
        done_ms = (time.perf_counter() - begin) * 1e3
        torch._foreach_copy_(dsts, host_srcs, non_blocking=True)
        torch.npu.synchronize()
    for call in calls:
        for group in call.groups:
            print(f"  {group.route:<6} pairs={group.pairs:<4} chunks={group.chunks} "
                  f"non_blocking passed down={group.non_blocking}")
    print(f"  D2D fast path with timing model (1 GB/s): returned after {returned_ms:.2f} ms with "
          f"{pending} device tasks pending; done after {done_ms:.2f} ms")
    ok = all(torch.equal(d.cpu(), s) for d, s in zip(dsts, host_srcs, strict=True))
    print(f"  destinations equal sources: {ok}")

    print(f"\ndevice memory: {torch.npu.memory_allocated() / 2**20:.1f} MiB allocated, "
          f"peak {torch.npu.max_memory_allocated() / 2**20:.1f} MiB")
    fsdp_rc = 0
    if not args.no_fsdp:
        print("\nFSDP2 (PyTorch's fully_shard, unpatched) on 2 ranks x npu, under torchrun:")
        sys.stdout.flush()
        fsdp_rc = _run_fsdp_ranks()
    return 0 if ok and max_diff < 1e-3 and fsdp_rc == 0 else 1
