"""A host thread that waits for a stream runs part of the task that stream's worker is running, when that
task shares its work (a foreach copy's spans, a random fill's counter ranges): the results are those the
worker alone writes, and the stream's count of items its waiting hosts ran says the host took part."""

from __future__ import annotations

import time

import torch

from npusim.runtime import acl

# About 20 ms of torch.npu._sleep: the worker starts the shared task after the host is in its wait, even
# when the host reaches it late (a full garbage collection of the test session's objects, another thread
# holding the GIL); a host asleep in its wait is woken to help.
HEAD_START_CYCLES = 36_000_000


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
    torch.npu._sleep(HEAD_START_CYCLES)
    torch._foreach_copy_(dst, src)
    torch.npu.synchronize()  # the host waits, and helps with the running task's spans
    helped = _items_helped() - before
    assert 0 < helped <= 120
    for i, d in enumerate(dst):
        assert torch.equal(d.cpu(), torch.arange(i, i + 65536, dtype=torch.float32)), f"pair {i}"


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


def _draw(op: str, wait: bool) -> tuple[torch.Tensor, int]:
    gen = torch.Generator(device="npu")
    gen.manual_seed(1234)
    t = torch.empty(1 << 20, device="npu")
    torch.npu.synchronize()
    before = _items_helped()
    torch.npu._sleep(HEAD_START_CYCLES)
    if op == "normal_":
        t.normal_(generator=gen)
    elif op == "uniform_":
        t.uniform_(generator=gen)
    else:
        t.exponential_(generator=gen)
    if not wait:
        time.sleep(0.5)
    torch.npu.synchronize()
    return t.cpu(), _items_helped() - before


def test_random_fills_draw_the_same_numbers_whoever_writes_them() -> None:
    for op in ("normal_", "uniform_", "exponential_"):
        alone, not_helped = _draw(op, wait=False)
        shared, helped = _draw(op, wait=True)
        assert not_helped == 0, op
        assert helped > 0, op  # 2**20 elements: 256 ranges of 4096, the host ran some of them
        assert torch.equal(alone, shared), op
