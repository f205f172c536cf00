"""Differential test: npu ``torch._foreach_copy_`` against CPU ``copy_`` over random lists."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import npusim
from _foreach_copy_util import aligned_mode, assert_equal_lists, sync_all, values
from npusim.ops import foreach_copy_mode, trace_foreach_copy

__all__ = ["aligned_mode"]  # the autouse fixture is active in this module

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int8,
          torch.uint8, torch.bool]
DEVICES = ["cpu", "npu:0", "npu:1"]
LAYOUTS = ["contiguous", "transposed", "sliced", "offset"]


def make_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: str, layout: str, seed: int) -> torch.Tensor:
    """A tensor of ``shape`` with the given memory layout, in its own storage."""
    if layout == "transposed" and len(shape) >= 2:
        return values((*shape[:-2], shape[-1], shape[-2]), dtype, device, seed).transpose(-1, -2)
    if layout == "sliced" and len(shape) >= 1:
        return values((*shape[:-1], shape[-1] * 2), dtype, device, seed)[..., ::2]
    if layout == "offset":
        numel = 1
        for size in shape:
            numel *= size
        return values((numel + 3,), dtype, device, seed)[3:].view(shape)
    return values(shape, dtype, device, seed)


@st.composite
def copy_lists(draw: st.DrawFn) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(dst, src) with at least one npu tensor; "uniform" lists hit the fast and batch routes."""
    n = draw(st.integers(1, 60))
    uniform = draw(st.booleans())
    if uniform:  # one dtype, one layout, one direction: fast / batch eligible
        dtype = draw(st.sampled_from(DTYPES))
        dst_device, src_device = draw(st.sampled_from([("npu:0", "npu:0"), ("npu:1", "npu:1"), ("npu:0", "cpu"),
                                                       ("cpu", "npu:0"), ("npu:1", "cpu")]))
    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []
    for i in range(n):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        if uniform:
            dst_dtype = src_dtype = dtype
            dst_layout = src_layout = "contiguous"
        else:
            dst_dtype, src_dtype = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))
            dst_device, src_device = draw(st.sampled_from(DEVICES)), draw(st.sampled_from(DEVICES))
            dst_layout, src_layout = draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(LAYOUTS))
        dst.append(torch.zeros(shape, dtype=dst_dtype, device=dst_device) if dst_layout == "contiguous"
                   else make_tensor(shape, dst_dtype, dst_device, dst_layout, seed=1000 + i).zero_())
        src.append(make_tensor(shape, src_dtype, src_device, src_layout, seed=i))
    if all(t.is_cpu for t in dst + src):  # the npu kernel sees only calls with an npu tensor
        dst[0] = dst[0].to("npu:1")
    return dst, src


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lists=copy_lists(), non_blocking=st.booleans(), preset=st.sampled_from(sorted(npusim.PRESETS)),
       mode=st.sampled_from(["aligned", "legacy"]))
def test_matches_cpu_copy(lists: tuple[list[torch.Tensor], list[torch.Tensor]], non_blocking: bool, preset: str,
                          mode: str):
    """Destinations equal CPU copy_'s results, sources are unchanged, and every pair is routed once."""
    dst, src = lists
    want = [d.cpu().clone().copy_(s.cpu()) for d, s in zip(dst, src, strict=True)]
    src_before = [s.cpu() for s in src]
    with npusim.use_profile(preset), foreach_copy_mode(mode), trace_foreach_copy() as calls:
        torch._foreach_copy_(dst, src, non_blocking=non_blocking)
    sync_all()
    assert_equal_lists(dst, want)
    assert_equal_lists(src, src_before)
    assert len(calls) == 1 and sum(g.pairs for g in calls[0].groups) == len(dst)
    for route in calls[0].routes:
        event(f"route {route}")  # shown by --hypothesis-show-statistics
