"""A host thread that waits for a stream runs part of the task that stream's worker is running, when that
task shares its work (a foreach copy's spans, a random fill's counter ranges, the element parts of an
arithmetic pointwise kernel): the results are those the worker alone writes, and the stream's count of
items its waiting hosts ran says the host took part."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import torch

from npusim.runtime import acl

T = TypeVar("T")

# About 1.5 ms of torch.npu._sleep before the shared tasks: the host is in its wait, still spinning, when
# they start. Each test queues tens of milliseconds of shared work, so a host that reaches its wait
# late, or sleeps in it and is woken, still finds claims left; garbage collection is off meanwhile (a
# full collection of a long test session's objects takes milliseconds).
HEAD_START_CYCLES = 2_700_000
CALLS = 16


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _items_helped() -> int:
    stream = torch.npu.current_stream()
    return acl.stream_items_helped(stream.stream_id, stream.device_index)


def test_a_synchronizing_host_copies_part_of_a_foreach_copy() -> None:
    torch.npu.synchronize()
    # 120 pairs of 256 KiB: three foreach-copy tasks of 48 pairs at most, milliseconds of memmove each.
    src = [torch.arange(i, i + 65536, dtype=torch.float32).to("npu") for i in range(120)]
    dst = [torch.zeros(65536, device="npu") for _ in range(120)]
    torch.npu.synchronize()
    before = _items_helped()
    with _no_gc():
        torch.npu._sleep(HEAD_START_CYCLES)
        for _ in range(CALLS):  # 48 tasks, tens of milliseconds of memmove
            torch._foreach_copy_(dst, src)
        torch.npu.synchronize()  # the host waits, and helps with the running tasks' spans
    helped = _items_helped() - before
    assert 0 < helped <= 120 * CALLS
    for i, d in enumerate(dst):
        assert torch.equal(d.cpu(), torch.arange(i, i + 65536, dtype=torch.float32)), f"pair {i}"


def test_a_few_large_pairs_are_shared_one_at_a_time() -> None:
    # Three pairs of 4 MiB make one task of three spans: each span is a claim of its own (enough bytes for
    # the claim's counter to cost nothing), so a waiting host takes some of them.
    src = [torch.arange(i, i + (1 << 20), dtype=torch.float32).to("npu") for i in range(3)]
    dst = [torch.zeros(1 << 20, device="npu") for _ in range(3)]
    torch.npu.synchronize()
    before = _items_helped()
    with _no_gc():
        torch.npu._sleep(HEAD_START_CYCLES)
        for _ in range(CALLS):
            torch._foreach_copy_(dst, src)
        torch.npu.synchronize()
    assert 0 < _items_helped() - before <= 3 * CALLS
    for i, d in enumerate(dst):
        assert torch.equal(d.cpu(), torch.arange(i, i + (1 << 20), dtype=torch.float32)), f"pair {i}"


def test_small_pairs_are_claimed_64_kib_at_a_time() -> None:
    # FSDP2's shards: 4 KiB pairs, 48 to a task, claimed 16 at a time (64 KiB), so a helping host runs
    # whole claims of 16 spans: the stream's count of helped items moves in sixteens.
    src = [torch.full((1024,), float(i), device="npu") for i in range(48)]
    dst = [torch.zeros(1024, device="npu") for _ in range(48)]
    torch.npu.synchronize()
    helped: list[int] = []  # per round in which the host helped (a host woken late may find no claim left)
    with _no_gc():
        for _ in range(60):
            before = _items_helped()
            torch.npu._sleep(HEAD_START_CYCLES)
            for _ in range(50):  # launched within the head start, so that the host still spins when they run
                torch._foreach_copy_(dst, src)
            torch.npu.synchronize()
            if _items_helped() > before:
                helped.append(_items_helped() - before)
            if len(helped) == 3:
                break
    assert len(helped) == 3 and all(h % 16 == 0 for h in helped), helped
    assert all(torch.equal(d.cpu(), torch.full((1024,), float(i))) for i, d in enumerate(dst))


def test_a_host_that_does_not_wait_never_helps() -> None:
    src = [torch.full((65536,), float(i), device="npu") for i in range(60)]
    dst = [torch.zeros(65536, device="npu") for _ in range(60)]
    torch.npu.synchronize()
    before = _items_helped()
    torch._foreach_copy_(dst, src)
    time.sleep(0.5)  # the worker finishes alone: the host is in no wait for the stream
    torch.npu.synchronize()
    assert _items_helped() == before
    assert all(torch.equal(d.cpu(), torch.full((65536,), float(i))) for i, d in enumerate(dst))


def _queued(issue: Callable[[], T], wait: bool, alone_s: float) -> tuple[T, int]:
    """issue()'s tasks queued behind a busy stream (so that they are stream tasks), then a synchronize, at
    once (``wait``: a host waits while they run) or after ``alone_s`` seconds (the worker finishes alone:
    the host is in no wait for the stream); its result and the items waiting hosts ran."""
    torch.npu.synchronize()
    before = _items_helped()
    with _no_gc():
        torch.npu._sleep(HEAD_START_CYCLES)
        # milliseconds of tasks: a host that slept in its wait is woken in time to help
        result = issue()
        if not wait:
            time.sleep(alone_s)
        torch.npu.synchronize()
    return result, _items_helped() - before


def _draw(op: str, wait: bool) -> tuple[list[torch.Tensor], int]:
    """CALLS fills of 2**20 elements each from one seeded generator, and the items waiting hosts ran."""
    gen = torch.Generator(device="npu")
    gen.manual_seed(1234)
    tensors = [torch.empty(1 << 20, device="npu") for _ in range(CALLS)]

    def fill() -> None:
        for t in tensors:
            getattr(t, op)(generator=gen)

    _, helped = _queued(fill, wait, alone_s=2.0)
    return [t.cpu() for t in tensors], helped


@pytest.mark.asynchronous  # NPUSIM_LAUNCH_BLOCKING=1 makes the host compute the fills itself
def test_random_fills_draw_the_same_numbers_whoever_writes_them() -> None:
    for op in ("normal_", "uniform_", "exponential_"):
        alone, not_helped = _draw(op, wait=False)
        shared, helped = _draw(op, wait=True)
        assert not_helped == 0, op
        # 256 ranges of 4096 elements per fill: the host ran some, so some fill below is partly its work
        assert helped > 0, op
        for i, (a, b) in enumerate(zip(alone, shared, strict=True)):
            assert torch.equal(a, b), f"{op}, fill {i}"


# Sizes with and without a tail after the last whole part of 16384 elements (Note [Pointwise work shared
# with a waiting host]); each holds many parts, so a host that waits takes some.
POINTWISE_SIZES = (1 << 20, (1 << 20) + 16384 * 3 + 7)

ARITHMETIC: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add_": lambda a, b: a.clone().add_(b, alpha=0.5),
    "mul": torch.mul,
    "div": torch.div,
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=2.0),
    "maximum": torch.maximum,
    "threshold_backward": lambda a, b: torch.ops.aten.threshold_backward(b, a, 0.0),
}


def _pointwise(fns: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], a: torch.Tensor,
               b: torch.Tensor, wait: bool) -> tuple[dict[str, torch.Tensor], int]:
    """Each fn(a, b), CALLS times, queued behind a busy stream (so that they are stream tasks), and the items
    waiting hosts ran."""
    out, helped = _queued(lambda: {name: [fn(a, b) for _ in range(CALLS)] for name, fn in fns.items()}, wait,
                          alone_s=0.5)
    for name, results in out.items():
        assert all(torch.equal(r, results[0]) for r in results), name
    return {name: results[0].cpu() for name, results in out.items()}, helped


@pytest.mark.asynchronous  # the kernels must run as stream tasks
@pytest.mark.parametrize("numel", POINTWISE_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_waiting_host_computes_parts_of_arithmetic_kernels(numel: int, dtype: torch.dtype) -> None:
    torch.manual_seed(numel)
    a, b = torch.randn(numel, dtype=dtype), torch.rand(numel, dtype=dtype) + 0.5
    an, bn = a.to("npu"), b.to("npu")
    alone, not_helped = _pointwise(ARITHMETIC, an, bn, wait=False)
    assert not_helped == 0
    for name, fn in ARITHMETIC.items():
        shared, helped = _pointwise({name: fn}, an, bn, wait=True)
        assert helped > 0, name
        # bit for bit CPU's, whichever thread computed each part
        assert torch.equal(alone[name], fn(a, b)), name
        assert torch.equal(shared[name], fn(a, b)), name


@pytest.mark.asynchronous
def test_transcendental_and_broadcasting_kernels_run_whole() -> None:
    """tanh calls MKL's vector math, whose first concurrent calls need not agree; a broadcast operand has
    another shape: neither is split, so no waiting host takes part in them."""
    a = torch.randn(1 << 20, device="npu")
    row = torch.randn(1024, device="npu")
    _, helped = _pointwise({"tanh": lambda x, _: torch.tanh(x),
                            "broadcast add": lambda x, r: x.view(1024, 1024) + r}, a, row, wait=True)
    assert helped == 0
