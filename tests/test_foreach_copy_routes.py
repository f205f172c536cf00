"""``torch._foreach_copy_`` on the npu: batch and slow routes, the raw-byte regression, profiles."""

from __future__ import annotations

import pytest
import torch

import npusim
from _foreach_copy_util import aligned_mode, assert_equal_lists, copy, expected, pairs, values
from npusim.ops import original_batch_eligibility

__all__ = ["aligned_mode"]  # the autouse fixture is active in this module


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("pinned", [False, True])
def test_host_device_lists_take_batch_with_callers_flag(direction: str, non_blocking: bool, pinned: bool):
    """H2D and D2H lists take one batched memcpy that keeps the caller's non_blocking."""
    src_device, dst_device = ("cpu", "npu") if direction == "h2d" else ("npu", "cpu")
    dst, src = pairs(5, torch.float32, src_device, dst_device)
    if pinned:
        dst, src = ([t.pin_memory() if t.is_cpu else t for t in ts] for ts in (dst, src))
    want = expected(dst, src)
    call = copy(dst, src, non_blocking)
    assert call.groups == (npusim.ops.GroupRecord("batch", 5, 1, non_blocking, torch.float32),)
    assert_equal_lists(dst, want)


@pytest.mark.asynchronous
def test_blocking_batch_synchronizes_the_stream_with_the_profile_timeout():
    """A blocking batch first waits for the current stream; past sync_timeout_s it raises, copying nothing."""
    big_dst, big_src = pairs(1, torch.float32, shape=(1 << 20,))
    dst, src = pairs(3, torch.float32, src_device="cpu")
    with npusim.timing.model(copy_gbps=0.02, realtime=True), npusim.use_profile(sync_timeout_s=0.01):
        torch._foreach_copy_(big_dst, big_src)  # ~0.2 s of simulated copy on the current stream
        with pytest.raises(RuntimeError, match=r"synchronize_stream: npu:0 stream 0 .*within 0.01 s"):
            torch._foreach_copy_(dst, src)
        torch.npu.synchronize()
        assert all(torch.equal(d.cpu(), torch.zeros(33)) for d in dst)
        torch._foreach_copy_(dst, src)  # stream idle now: the batch goes through
    assert_equal_lists(dst, src)
    assert_equal_lists(big_dst, big_src)


def _mixed_directions():
    h2d_dst, h2d_src = pairs(2, torch.float32, "cpu", "npu")
    d2h_dst, d2h_src = pairs(2, torch.float32, "npu", "cpu")
    return [h2d_dst[0], d2h_dst[0], h2d_dst[1], d2h_dst[1]], [h2d_src[0], d2h_src[0], h2d_src[1], d2h_src[1]]


def _cross_device():
    return pairs(3, torch.float32, "npu:0", "npu:1")


def _non_contiguous_d2d():
    dst, src = pairs(3, torch.float32, shape=(6, 4))
    return dst, [s.t().contiguous().t() for s in src]  # same shape, column-major strides


def _non_contiguous_h2d():
    dst, src = pairs(3, torch.float32, "cpu", "npu", shape=(6, 4))
    return dst, [values((4, 6), torch.float32, "cpu", seed=i).t() for i in range(3)]


def _sliced_d2h():
    dst, src = pairs(3, torch.float32, "npu", "cpu", shape=(8,))
    return dst, [values((16,), torch.float32, seed=i)[::2] for i in range(3)]


def _dtype_changing_h2d():
    return pairs(3, torch.int32, "cpu", "npu", dst_dtype=torch.float32)


def _size_mismatched_h2d():
    dst = [torch.zeros(8, device="npu") for _ in range(3)]
    return dst, [values((1,), torch.float32, "cpu", seed=i) for i in range(3)]  # broadcast like copy_


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("make", [_mixed_directions, _cross_device, _non_contiguous_d2d, _non_contiguous_h2d,
                                  _sliced_d2h, _dtype_changing_h2d, _size_mismatched_h2d],
                         ids=lambda f: f.__name__.strip("_"))
def test_ineligible_lists_take_slow_path_and_stay_correct(make, non_blocking: bool):
    """Mixed directions, cross-device, non-contiguous, dtype-changing and size-mismatched pairs copy pair by pair."""
    dst, src = make()
    want = expected(dst, src)
    call = copy(dst, src, non_blocking)
    assert [(g.route, g.non_blocking) for g in call.groups] == [("slow", non_blocking)]
    assert_equal_lists(dst, want)


@pytest.mark.parametrize("make", [_dtype_changing_h2d, _non_contiguous_h2d, _sliced_d2h],
                         ids=lambda f: f.__name__.strip("_"))
def test_original_batch_eligibility_corrupts_and_npusims_does_not(make):
    """Regression: the original eligibility batches these pairs as raw bytes and corrupts them; npusim's does not."""
    dst, src = make()
    want = expected(dst, src)
    with original_batch_eligibility():
        call = copy(dst, src)
    assert call.routes == ("batch",)
    assert any(not torch.equal(d.cpu(), w) for d, w in zip(dst, want, strict=True)), "expected corrupted values"
    dst, src = make()
    call = copy(dst, src)
    assert call.routes == ("slow",)
    assert_equal_lists(dst, want)


def test_non_blocking_batch_off_the_current_device_falls_back():
    """A non_blocking batch whose npu tensors are not on the current device takes the slow path, correctly."""
    dst, src = pairs(3, torch.float32, "cpu", "npu:1")
    want = expected(dst, src)
    assert torch.npu.current_device() == 0
    assert copy(dst, src, non_blocking=True).groups[0][:4] == ("slow", 3, 0, True)
    assert_equal_lists(dst, want)
    assert copy(dst, src, non_blocking=False).routes == ("batch",)  # blocking batch has no such rule
    dst, src = pairs(3, torch.float32, "npu:1", "cpu")
    with torch.npu.device(1):
        assert copy(dst, src, non_blocking=True).routes == ("batch",)
    assert_equal_lists(dst, src)


# Expected routes per preset for: D2D float32, D2D int64, H2D float32 blocking, H2D float32 non_blocking.
PRESET_ROUTES = {
    "training_soc": ("fast", "fast", "batch", "batch"),
    "inference_soc": ("slow", "slow", "slow", "slow"),  # no nd_out, no batch
    "old_cann": ("fast", "slow", "batch", "batch"),  # int64 not supported by the old kernel
    "no_memcpy_batch": ("fast", "fast", "slow", "slow"),
    "no_foreach_kernel": ("compat", "compat", "compat", "compat"),
}


@pytest.mark.parametrize("preset", sorted(PRESET_ROUTES))
def test_profile_presets_change_routes_as_their_flags_say(preset: str):
    """Each capability preset routes the same four lists as its flags say, with correct values."""
    cases = [(pairs(4, torch.float32), False), (pairs(4, torch.int64), False),
             (pairs(4, torch.float32, "cpu"), False), (pairs(4, torch.float32, "cpu"), True)]
    with npusim.use_profile(preset):
        for ((dst, src), non_blocking), route in zip(cases, PRESET_ROUTES[preset], strict=True):
            want = expected(dst, src)
            call = copy(dst, src, non_blocking)
            assert call.routes == (route,), (preset, non_blocking, call)
            passed = call.groups[0].non_blocking
            assert passed is (True if route == "fast" else non_blocking)
            assert_equal_lists(dst, want)


@pytest.mark.parametrize(("memcpy_batch", "memcpy_batch_async"), [(True, False), (False, True)])
def test_batch_needs_the_memcpy_matching_non_blocking(memcpy_batch: bool, memcpy_batch_async: bool):
    """Only the batched memcpy for the caller's non_blocking enables the batch route."""
    with npusim.use_profile(memcpy_batch=memcpy_batch, memcpy_batch_async=memcpy_batch_async):
        for non_blocking, available in ((False, memcpy_batch), (True, memcpy_batch_async)):
            dst, src = pairs(3, torch.float32, "cpu")
            assert copy(dst, src, non_blocking).routes == ("batch" if available else "slow",)
            assert_equal_lists(dst, src)


def test_compat_route_ignores_grouping_and_keeps_non_blocking():
    """Without the kernel the whole mixed list is copied pair by pair with the caller's flag."""
    dst, src = pairs(3, torch.float32)
    dst2, src2 = pairs(2, torch.int32, "cpu")
    dst, src = dst + dst2, src + src2
    want = expected(dst, src)
    with npusim.use_profile("no_foreach_kernel"):
        call = copy(dst, src, non_blocking=True)
    assert call.groups == (npusim.ops.GroupRecord("compat", 5, 0, True, None),)
    assert_equal_lists(dst, want)
