"""Training on npu matches CPU: autograd, autocast, activation checkpointing."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from npusim.runtime import acl


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8))


def train(model: nn.Module, device: str, steps: int = 4, ckpt: bool | None = None, amp: bool = False):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32).to(device)
        y = torch.randn(16, 8).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            if ckpt is not None:
                x.requires_grad_()
            out = checkpoint(model, x, use_reentrant=ckpt) if ckpt is not None else model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("ckpt", [None, True, False], ids=["plain", "ckpt-reentrant", "ckpt-nonreentrant"])
def test_mlp_training_matches_cpu(ckpt):
    """An MLP trained on npu gives CPU's losses and parameters (also with checkpointing)."""
    model = make_mlp()
    cpu_losses, cpu_params = train(copy.deepcopy(model), "cpu", ckpt=ckpt)
    npu_losses, npu_params = train(copy.deepcopy(model), "npu", ckpt=ckpt)
    assert npu_losses == pytest.approx(cpu_losses, rel=1e-5)
    for a, b in zip(cpu_params, npu_params, strict=True):
        torch.testing.assert_close(a, b)


def test_autocast_bf16_matches_cpu_autocast():
    """torch.autocast("npu", bfloat16) casts matmuls like CPU autocast and trains the same."""
    model = make_mlp().to("npu")
    with torch.autocast("npu", dtype=torch.bfloat16):
        out = model(torch.randn(4, 32, device="npu"))
        assert out.dtype == torch.bfloat16
        assert torch.exp(out).dtype == torch.float32  # fp32 policy
    cpu_losses, _ = train(make_mlp(), "cpu", amp=True)
    npu_losses, _ = train(make_mlp(), "npu", amp=True)
    assert npu_losses == pytest.approx(cpu_losses, rel=1e-3)


def test_grad_lands_on_npu():
    """Gradients of npu leaves are npu tensors with the right values."""
    x = torch.arange(4.0, device="npu", requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.device.type == "npu"
    assert torch.equal(x.grad.cpu(), 2 * torch.arange(4.0))


class _ThreadProbe(torch.autograd.Function):
    """Records, in its backward, the thread it runs on and that thread's intra-op thread count."""

    seen: list[tuple[int, int]] = []

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x * 1

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        out = grad * 2  # an npu op through the fallback on this thread
        _ThreadProbe.seen.append((threading.get_ident(), torch.get_num_threads()))
        return out


def test_backward_on_autograd_npu_thread_follows_torch_set_num_threads():
    """Note [Intra-op threads of autograd's npu thread]: autograd's npu thread keeps the count it started
    with unless npusim applies the user's; each backward must use what torch.set_num_threads last asked."""
    default = torch.get_num_threads()
    try:
        for threads in (1, 2, 1, 3):
            torch.set_num_threads(threads)
            x = torch.ones(4, device="npu", requires_grad=True)
            _ThreadProbe.apply(x * 3).sum().backward()
            ident, seen_threads = _ThreadProbe.seen[-1]
            assert ident != threading.get_ident()  # autograd's device thread ran it
            assert seen_threads == threads
            assert torch.equal(x.grad.cpu(), torch.full((4,), 6.0))
    finally:
        torch.set_num_threads(default)


def test_a_stream_worker_leaves_a_core_to_the_host_for_small_pointwise_kernels():
    """Note [A core for the host]: when the user's count takes every usable core, a small pointwise kernel
    runs on the worker with one thread fewer (the host runs ahead on the core left); a large one, any
    kernel that is not pointwise (its result may depend on the team), or a count that leaves cores free
    keeps the user's count."""
    cores = acl.usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    small, large = 1 << 16, 1 << 22
    assert acl.worker_intraop_threads(1, small, True) == 1
    assert acl.worker_intraop_threads(cores + 1, small, True) == cores
    assert acl.worker_intraop_threads(cores + 1, small, False) == cores + 1
    assert acl.worker_intraop_threads(cores + 1, large, True) == cores + 1
    if cores > 1:
        assert acl.worker_intraop_threads(cores, small, True) == cores - 1
        assert acl.worker_intraop_threads(cores, small, False) == cores
        assert acl.worker_intraop_threads(cores, large, True) == cores
    if cores > 2:
        assert acl.worker_intraop_threads(cores - 1, small, True) == cores - 1


def test_results_equal_cpu_bit_for_bit_whatever_team_the_worker_takes():
    """A small pointwise op, a foreach op, a reduction and batch norm on a busy stream (so they are tasks)
    give CPU's bits at the default thread count and at one thread."""
    default = torch.get_num_threads()
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    xs = [torch.randn(300, 100) for _ in range(3)]
    bn = nn.BatchNorm1d(4)
    y = torch.randn(8, 4)
    try:
        for threads in {1, default}:
            torch.set_num_threads(threads)
            expected = [torch.sigmoid(x) * 3, torch._foreach_mul(xs, 0.5)[2], x.sum(0), bn(y)]
            torch.npu._sleep(10**8)  # a busy stream for tens of ms: every op below is a stream task
            xn, xsn, yn = x.npu(), [t.npu() for t in xs], y.npu()
            got = [torch.sigmoid(xn) * 3, torch._foreach_mul(xsn, 0.5)[2], xn.sum(0), copy.deepcopy(bn).npu()(yn)]
            for e, g in zip(expected, got, strict=True):
                assert torch.equal(g.cpu(), e.detach()), threads
    finally:
        torch.set_num_threads(default)


_TEAM_PROBE = """
import os, sys, torch
import npusim  # noqa: F401

def team() -> int:  # threads named as the user's thread: the OpenMP team threads it made take its name
    def name(tid): return open(f"/proc/self/task/{tid}/comm").read()
    mine = name(os.getpid())
    return sum(name(tid) == mine for tid in os.listdir("/proc/self/task"))

torch.set_num_threads(int(sys.argv[1]))
before = team()
x = torch.ones(8, device="npu")
assert (x * 2).sum().item() == 16.0
print(before, team())
"""


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_users_thread_gets_the_openmp_team_of_its_count_at_its_first_npu_op(threads: int):
    """Note [OpenMP's count of busy threads]: an npu program's parallel regions run on the stream workers,
    so npusim gives the user's thread the team a CPU program's thread would have (libgomp then counts the
    busy threads), of the user's count, once its first npu op records that count."""
    out = subprocess.run([sys.executable, "-c", _TEAM_PROBE, str(threads)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split())
    assert after - before == threads - 1
