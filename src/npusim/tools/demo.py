"""``python -m npusim demo``: npusim's main job, end to end on the simulated npu.

Trains a small transformer on ``npu`` next to the same model on CPU, and shows
what npusim adds: the route each ``_foreach_copy_`` call took (the aligned fast
path is asynchronous whatever ``non_blocking`` says), stream asynchrony under
the timing model, and device memory accounting.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import socket
import subprocess
import sys
import time

import torch
from torch import nn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--no-fsdp", action="store_true", help="skip the 2-rank FSDP2 part (torchrun)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_fsdp_ranks(timeout_s: float = 300) -> int:
    """Runs npusim.tools.fsdp_demo on 2 ranks with torchrun; returns its exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "npusim.tools.fsdp_demo"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with subprocess.Popen(cmd, env=env, start_new_session=True) as proc:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            print(f"FSDP2 demo did not finish within {timeout_s:.0f} s; stopped it")
            return 1


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch * seq, vocab): a fresh tensor, not a view (FSDP2 warns on views)."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(0, 1))


def _train(model: nn.Module, device: str, steps: int) -> tuple[list[float], float]:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        tokens = torch.randint(0, 64, (8, 32), generator=gen)
        logits = model(tokens.to(device))
        loss = nn.functional.cross_entropy(logits, tokens.roll(-1, 1).flatten().to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    import npusim
    from npusim.ops import trace_foreach_copy

    print(f"npusim {npusim.__version__}: {torch.npu.device_count()} simulated npu devices, "
          f"profile {npusim.get_profile().name}")
    torch.manual_seed(0)
    model = TinyTransformer()
    cpu_losses, cpu_s = _train(copy.deepcopy(model), "cpu", args.steps)
    npu_losses, npu_s = _train(copy.deepcopy(model), "npu", args.steps)
    print("\nstep  loss(cpu)   loss(npu)")
    for step, (a, b) in enumerate(zip(cpu_losses, npu_losses, strict=True)):
        print(f"{step:>4}  {a:9.5f}   {b:9.5f}")
    max_diff = max(abs(a - b) for a, b in zip(cpu_losses, npu_losses, strict=True))
    print(f"max |loss difference| {max_diff:.2e}; step time npu/cpu {npu_s / cpu_s:.2f}")

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
