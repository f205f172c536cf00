"""``torch._foreach_copy_`` on the npu: fast path, grouping, versions, modes, asynchrony, bad input."""

from __future__ import annotations

import time

import pytest
import torch

import npusim
from _foreach_copy_util import aligned_mode, assert_equal_lists, copy, expected, pairs, sync_all, values
from npusim.ops import foreach_copy, foreach_copy_mode, get_foreach_copy_mode, set_foreach_copy_mode

__all__ = ["aligned_mode"]  # the autouse fixture is active in this module

FAST_DTYPES = [torch.float16, torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.float64, torch.bool]


def test_review_case():
    """The design review's own test (docs/SPEC.md section 1), verbatim."""
    src = [torch.arange(1024, device="npu", dtype=torch.int32) for _ in range(8)]
    dst = [torch.empty(1024, device="npu", dtype=torch.float32) for _ in src]
    torch._foreach_copy_(dst, src)
    torch.npu.synchronize()
    assert torch.equal(dst[0].cpu(), src[0].cpu().to(torch.float32))


@pytest.mark.parametrize("n", [20, 50])
@pytest.mark.parametrize("dtype", FAST_DTYPES, ids=str)
def test_same_dtype_d2d_takes_fast_path(dtype: torch.dtype, n: int):
    """Same-dtype device-to-device lists take the fast path in chunks of 48, non_blocking forced True."""
    dst, src = pairs(n, dtype)
    want = expected(dst, src)
    call = copy(dst, src)
    assert call.routes == ("fast",) and call.non_blocking is False
    group = call.groups[0]
    assert (group.pairs, group.chunks, group.non_blocking, group.dtype) == (n, 1 if n <= 48 else 2, True, dtype)
    assert_equal_lists(dst, want)


@pytest.mark.parametrize(("n", "chunks"), [(47, 1), (48, 1), (49, 2), (96, 2), (97, 3)])
def test_chunk_counts(n: int, chunks: int):
    """A list of n pairs is launched as ceil(n / 48) device tasks."""
    dst, src = pairs(n, torch.float32, shape=(5,))
    want = expected(dst, src)
    call = copy(dst, src)
    assert call.groups[0][:3] == ("fast", n, chunks)
    assert_equal_lists(dst, want)


@pytest.mark.parametrize(("src_dtype", "dst_dtype"), [(torch.int32, torch.float64), (torch.float32, torch.bfloat16)],
                         ids=str)
def test_cross_dtype_d2d_is_not_fast_but_correct(src_dtype: torch.dtype, dst_dtype: torch.dtype):
    """Dtype-changing device-to-device pairs fail can_use_fast_route and convert like copy_."""
    dst, src = pairs(12, src_dtype, dst_dtype=dst_dtype)
    want = expected(dst, src)
    call = copy(dst, src)
    assert call.routes == ("slow",) and call.groups[0].non_blocking is False
    assert_equal_lists(dst, want)


def test_mixed_dtype_lists_grouped_in_order_of_first_appearance():
    """Pairs are grouped by source dtype in first-appearance order; each group is routed on its own."""
    f32 = pairs(3, torch.float32)  # D2D same dtype: fast
    i32 = pairs(2, torch.int32, dst_dtype=torch.float64)  # D2D dtype change: slow
    f16 = pairs(2, torch.float16, dst_device="cpu")  # D2H same dtype: batch
    order = [(i32, 0), (f32, 0), (f16, 0), (f32, 1), (i32, 1), (f32, 2), (f16, 1)]
    dst = [group[0][i] for group, i in order]
    src = [group[1][i] for group, i in order]
    want = expected(dst, src)
    call = copy(dst, src)
    got = [(g.dtype, g.route, g.pairs, g.chunks) for g in call.groups]
    assert got == [(torch.int32, "slow", 2, 0), (torch.float32, "fast", 3, 1), (torch.float16, "batch", 2, 1)]
    assert_equal_lists(dst, want)


def _version_deltas(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> list[int]:
    before = [d._version for d in dst]
    torch._foreach_copy_(dst, src, non_blocking=non_blocking)
    sync_all()
    return [d._version - b for d, b in zip(dst, before, strict=True)]


@pytest.mark.parametrize("case", ["fast", "batch", "slow", "compat", "mixed"])
def test_version_counters_bumped_like_cpu(case: str):
    """Every route bumps each destination's version counter by what CPU-native _foreach_copy_ does."""
    cpu_dst, cpu_src = pairs(4, torch.float32, "cpu", "cpu")
    cpu_delta = _version_deltas(cpu_dst, cpu_src)
    assert cpu_delta == [1] * 4
    dst, src = {
        "fast": lambda: pairs(4, torch.float32),
        "batch": lambda: pairs(4, torch.float32, src_device="cpu"),
        "slow": lambda: pairs(4, torch.int32, dst_dtype=torch.float32),
        "compat": lambda: pairs(4, torch.float32),
        "mixed": lambda: ([*pairs(2, torch.float32)[0], *pairs(2, torch.int32, dst_dtype=torch.float32)[0]],
                          [*pairs(2, torch.float32)[1], *pairs(2, torch.int32)[1]]),
    }[case]()
    with npusim.use_profile("no_foreach_kernel" if case == "compat" else "training_soc"):
        assert _version_deltas(dst, src) == cpu_delta


def _slow_copy_setup(n: int = 8, numel: int = 1 << 18) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """(dst, src, simulated seconds of the copy) with float32 pairs of numel elements."""
    dst, src = pairs(n, torch.float32, shape=(numel,))
    gbps = 0.1
    return dst, src, n * numel * 4 / (gbps * 1e9)


@pytest.mark.asynchronous
@pytest.mark.parametrize("non_blocking", [False, True])
def test_aligned_fast_path_returns_before_copies_complete(non_blocking: bool):
    """With copies slowed down, the aligned fast path returns at once, its tasks still pending."""
    dst, src, copy_s = _slow_copy_setup()
    want = expected(dst, src)
    with npusim.timing.model(copy_gbps=0.1, realtime=True):
        start = time.perf_counter()
        torch._foreach_copy_(dst, src, non_blocking=non_blocking)
        elapsed = time.perf_counter() - start
        pending = torch.npu.current_stream().pending()
        torch.npu.synchronize()
    assert pending >= 1 and elapsed < copy_s / 2, (pending, elapsed, copy_s)
    assert_equal_lists(dst, want)


@pytest.mark.asynchronous
def test_fast_path_runs_on_the_current_stream():
    """The fast path's tasks go to the current stream of the destinations' device, not the default one."""
    dst, src, _ = _slow_copy_setup()
    want = expected(dst, src)
    side = torch.npu.Stream()
    with npusim.timing.model(copy_gbps=0.1, realtime=True), torch.npu.stream(side):
        torch._foreach_copy_(dst, src)
        pending = (side.pending(), torch.npu.default_stream().pending())
        side.synchronize()
    assert pending == (1, 0)
    assert_equal_lists(dst, want)


def test_legacy_mode_blocking_waits_for_the_copy():
    """Legacy mode with non_blocking=False passes False down and the host waits for the copy."""
    dst, src, copy_s = _slow_copy_setup()
    want = expected(dst, src)
    with (foreach_copy_mode("legacy"), npusim.ops.trace_foreach_copy() as calls,
          npusim.timing.model(copy_gbps=0.1, realtime=True)):
        start = time.perf_counter()
        torch._foreach_copy_(dst, src)
        elapsed = time.perf_counter() - start
        pending = torch.npu.current_stream().pending()
    assert pending == 0 and elapsed >= copy_s * 0.9, (pending, elapsed, copy_s)
    assert calls[0].mode == "legacy" and calls[0].groups[0][:4] == ("fast", 8, 1, False)
    assert_equal_lists(dst, want)


@pytest.mark.asynchronous
def test_legacy_mode_non_blocking_true_stays_async():
    """Legacy mode passes the caller's non_blocking=True down: the fast path stays asynchronous."""
    dst, src, _ = _slow_copy_setup()
    want = expected(dst, src)
    with (foreach_copy_mode("legacy"), npusim.ops.trace_foreach_copy() as calls,
          npusim.timing.model(copy_gbps=0.1, realtime=True)):
        torch._foreach_copy_(dst, src, non_blocking=True)
        pending = torch.npu.current_stream().pending()
    assert pending >= 1 and calls[0].groups[0].non_blocking is True
    assert_equal_lists(dst, want)


def test_mode_api_and_environment(monkeypatch: pytest.MonkeyPatch):
    """The mode is set by API, context manager or NPUSIM_FOREACH_COPY_MODE; unknown names are rejected."""
    assert get_foreach_copy_mode() == "aligned"
    with foreach_copy_mode("legacy"):
        assert get_foreach_copy_mode() == "legacy"
    assert set_foreach_copy_mode("legacy") == "aligned" and get_foreach_copy_mode() == "legacy"
    with pytest.raises(ValueError, match="expected one of .*'aligned', 'legacy'.*got 'fast'"):
        set_foreach_copy_mode("fast")
    monkeypatch.setenv(foreach_copy.MODE_ENV, "Legacy")
    assert foreach_copy._mode_from_env() == "legacy"
    monkeypatch.setenv(foreach_copy.MODE_ENV, "")
    assert foreach_copy._mode_from_env() == "aligned"
    monkeypatch.setenv(foreach_copy.MODE_ENV, "cuda")
    with pytest.raises(ValueError, match="NPUSIM_FOREACH_COPY_MODE: expected one of"):
        foreach_copy._mode_from_env()


def _cpu_error(dst_len: int, src_len: int) -> str:
    with pytest.raises(RuntimeError) as info:
        torch._foreach_copy_([torch.zeros(2) for _ in range(dst_len)], [torch.ones(2) for _ in range(src_len)])
    return str(info.value)


@pytest.mark.parametrize("profile", ["training_soc", "no_foreach_kernel"])
@pytest.mark.parametrize(("dst_len", "src_len"), [(2, 3), (3, 2), (0, 1), (1, 0), (0, 0)])
def test_bad_lists_rejected_like_cpu_and_destinations_untouched(profile: str, dst_len: int, src_len: int):
    """Unequal or empty lists raise CPU-native's error; no destination is written or version-bumped."""
    dst = [torch.zeros(2, device="npu") for _ in range(dst_len)]
    src = [torch.ones(2, device="npu") for _ in range(src_len)]
    versions = [d._version for d in dst]
    with npusim.use_profile(profile), pytest.raises(RuntimeError) as info:
        torch._foreach_copy_(dst, src)
    sync_all()
    assert str(info.value) == _cpu_error(dst_len, src_len)
    assert all(torch.equal(d.cpu(), torch.zeros(2)) for d in dst)
    assert [d._version for d in dst] == versions


@pytest.mark.parametrize("profile", ["training_soc", "inference_soc"])
def test_destination_overlapping_its_source(profile: str):
    """An overlapping pair: the fast path copies the source's values from before the call; the
    slow path raises copy_'s overlap error, as CPU does, and leaves the destination untouched."""
    x = values((64,), torch.float32)
    before = x.cpu()
    with npusim.use_profile(profile):
        if profile != "training_soc":
            with pytest.raises(RuntimeError, match="refer to a single memory location"):
                torch._foreach_copy_([x, x[1:]], [x, x[:-1]])
            assert torch.equal(x.cpu(), before)
            return
        call = copy([x, x[1:]], [x, x[:-1]])
    assert call.routes == ("fast",)
    want = before.clone()
    want[1:] = before[:-1]
    assert torch.equal(x.cpu(), want)


def test_pairs_chained_through_a_shared_tensor_match_cpu():
    """When one pair's destination is a later pair's source, the result is CPU's (pairs in order)."""
    a, b, c = (values((16,), torch.float32, seed=i) for i in range(3))
    cpu = [a.cpu(), b.cpu(), c.cpu()]
    torch._foreach_copy_([cpu[1], cpu[2]], [cpu[0], cpu[1]])
    call = copy([b, c], [a, b])
    assert call.routes == ("fast",)
    assert_equal_lists([a, b, c], cpu)


def test_trace_is_empty_outside_and_nested_traces_both_record():
    """Calls outside a trace are not recorded; nested traces each see the calls made inside them."""
    dst, src = pairs(2, torch.float32)
    torch._foreach_copy_(dst, src)
    with npusim.ops.trace_foreach_copy() as outer:
        with npusim.ops.trace_foreach_copy() as inner:
            torch._foreach_copy_(dst, src)
        torch._foreach_copy_(dst, src)
    torch._foreach_copy_(dst, src)
    sync_all()
    assert len(inner) == 1 and len(outer) == 2 and not npusim.ops.trace.enabled()
