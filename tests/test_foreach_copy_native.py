"""``torch._foreach_copy_``'s npu kernel decides every route from what it holds: the current profile's
routing fields, the mode and the trace sink (See Note [The _foreach_copy_ router] in
csrc/aten/foreach_copy.cpp)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import npusim
from _foreach_copy_util import aligned_mode, assert_equal_lists, expected, pairs, sync_all
from npusim.ops import foreach_copy_mode, set_foreach_copy_mode, trace_foreach_copy
from npusim.runtime import acl
from npusim.runtime.profiles import PRESETS, Profile

__all__ = ["aligned_mode"]  # the autouse fixture is active in this module

# foreach_copy_route_counts() deltas: dtype groups copied per route.
FAST = {"fast": 1}
SLOW = {"slow": 1}
BATCH = {"batch": 1}
COMPAT = {"compat": 1}


def _counted(fn: Callable[[], object]) -> dict[str, int]:
    """The routes (with their group counts) the kernel took while ``fn`` runs."""
    before = acl.foreach_copy_route_counts()
    fn()
    after = acl.foreach_copy_route_counts()
    return {route: after[route] - before[route] for route in after if after[route] != before[route]}


def _copy_counted(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> dict[str, int]:
    """Copies (checking the values against CPU) and returns the routes taken."""
    want = expected(dst, src)
    counts = _counted(lambda: torch._foreach_copy_(dst, src, non_blocking=non_blocking))
    sync_all()
    assert_equal_lists(dst, want)
    return counts


def _routing_fields(p: Profile) -> dict[str, object]:
    return {"kernel": p.foreach_copy_kernel, "nd_out": p.nd_out, "batch": p.batch, "memcpy_batch": p.memcpy_batch,
            "memcpy_batch_async": p.memcpy_batch_async, "fast_dtypes": set(p.fast_dtypes),
            "sync_timeout_s": p.sync_timeout_s}


def _assert_held(legacy: bool = False, traced: bool = False) -> None:
    """The kernel holds the current profile's routing fields, the mode and the trace state."""
    held = acl.foreach_copy_config()
    held["fast_dtypes"] = set(held["fast_dtypes"])
    assert held == _routing_fields(npusim.get_profile())
    assert (acl.foreach_copy_legacy(), acl.foreach_copy_traced()) == (legacy, traced)


def test_untraced_fast_call_takes_the_fast_route():
    """A same-dtype npu->npu list outside any trace takes the fast route, one version bump each."""
    dst, src = pairs(100, torch.float32)
    versions = [d._version for d in dst]
    assert _copy_counted(dst, src) == FAST
    assert [d._version - v for d, v in zip(dst, versions, strict=True)] == [1] * 100
    _assert_held()


def test_trace_records_the_kernels_routes_until_the_last_trace_exits():
    """An active trace (nested too) records each call's routes as the kernel took them; the sink goes with
    the last trace."""
    dst, src = pairs(3, torch.float32)
    with trace_foreach_copy() as outer:
        _assert_held(traced=True)
        with trace_foreach_copy() as inner:
            assert _copy_counted(dst, src) == FAST
        _assert_held(traced=True)
        assert _copy_counted(dst, src) == FAST
    _assert_held()
    assert _copy_counted(dst, src) == FAST
    assert [c.routes for c in inner] == [("fast",)] and [c.routes for c in outer] == [("fast",)] * 2


def test_trace_exit_on_error_restores_the_native_route():
    """A trace left by an exception still removes the kernel's sink."""
    dst, src = pairs(3, torch.float32)
    with pytest.raises(KeyError), trace_foreach_copy() as calls:
        raise KeyError("boom")
    _assert_held()
    assert _copy_counted(dst, src) == FAST and calls == []


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_handed_to_the_kernel(name: str):
    """Selecting a preset hands the kernel its routing fields; leaving it restores the default's."""
    with npusim.use_profile(name):
        _assert_held()
    assert npusim.get_profile() is PRESETS["training_soc"]
    _assert_held()


@pytest.mark.parametrize(("change", "dtype", "counts"), [
    (lambda: npusim.use_profile("inference_soc"), torch.float32, SLOW),  # no nd_out
    (lambda: npusim.use_profile("no_foreach_kernel"), torch.float32, COMPAT),
    (lambda: npusim.use_profile(nd_out=False), torch.float32, SLOW),  # a single override
    (lambda: npusim.use_profile("old_cann"), torch.int64, SLOW),  # a dtype the kernel lacks
    (lambda: npusim.use_profile("old_cann"), torch.float32, FAST),
    (lambda: npusim.use_profile(sync_timeout_s=5.0), torch.float32, FAST),
], ids=["inference_soc", "no_foreach_kernel", "nd_out=0", "old_cann-int64", "old_cann-float32", "timeout"])
def test_profile_changes_route_and_are_undone(change: Callable[[], object], dtype: torch.dtype,
                                              counts: dict[str, int]):
    """Inside use_profile the kernel routes by that profile; after it, by the default one again."""
    dst, src = pairs(5, dtype)
    with change():
        _assert_held()
        assert _copy_counted(dst, src) == counts
    _assert_held()
    assert _copy_counted(dst, src) == FAST


def test_set_profile_and_a_failing_use_profile_reach_the_kernel():
    """set_profile hands over at once; use_profile left by an exception restores what was current."""
    dst, src = pairs(5, torch.float32)
    npusim.set_profile("inference_soc")
    _assert_held()
    assert _copy_counted(dst, src) == SLOW
    with pytest.raises(KeyError), npusim.use_profile("training_soc"):
        assert _copy_counted(dst, src) == FAST
        raise KeyError("boom")
    assert npusim.get_profile() is PRESETS["inference_soc"]
    _assert_held()
    assert _copy_counted(dst, src) == SLOW
    with pytest.raises(ValueError, match="unknown flag"):
        npusim.set_profile("training_soc", nd_outt=True)  # refused: the kernel keeps the current profile
    _assert_held()
    npusim.set_profile()
    _assert_held()
    assert _copy_counted(dst, src) == FAST


def test_profile_and_mode_from_the_environment_reach_the_kernel_at_import():
    """NPUSIM_PROFILE and NPUSIM_FOREACH_COPY_MODE reach the kernel before the first call of a fresh process."""
    code = ("import torch, npusim; from npusim.runtime import acl; "
            "m = acl.foreach_copy_config(); "
            "d, s = [torch.empty(4, device='npu')], [torch.ones(4, device='npu')]; "
            "torch._foreach_copy_(d, s); torch.npu.synchronize(); "
            "print(m['nd_out'], acl.foreach_copy_legacy(), acl.foreach_copy_route_counts()['slow'], "
            "d[0].sum().item())")
    env = {**os.environ, "NPUSIM_PROFILE": "inference_soc", "NPUSIM_FOREACH_COPY_MODE": "legacy"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False True 1 4.0"


def _slow_pairs() -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """(dst, src, simulated seconds of their copy at 0.1 GB/s)."""
    n, numel = 8, 1 << 18
    dst, src = pairs(n, torch.float32, shape=(numel,))
    return dst, src, n * numel * 4 / 0.1e9


@contextmanager
def _slow_copies() -> Iterator[None]:
    with npusim.timing.model(copy_gbps=0.1, realtime=True):
        yield


def _timed_copy(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False
                ) -> tuple[dict[str, int], float, int]:
    """(routes taken, host seconds, tasks still pending on return) of one copy."""
    start = time.perf_counter()
    counts = _counted(lambda: torch._foreach_copy_(dst, src, non_blocking=non_blocking))
    elapsed = time.perf_counter() - start
    return counts, elapsed, torch.npu.current_stream().pending()


@pytest.mark.asynchronous
def test_mode_is_the_kernels_and_the_legacy_fast_route_waits():
    """Legacy mode, set by API or context manager, makes the fast route wait for a blocking copy;
    back in aligned mode it returns at once."""
    dst, src, copy_s = _slow_pairs()
    want = expected(dst, src)
    with _slow_copies():
        with foreach_copy_mode("legacy"):
            _assert_held(legacy=True)
            counts, elapsed, pending = _timed_copy(dst, src)
            assert counts == FAST and pending == 0 and elapsed >= copy_s * 0.9, (counts, elapsed, copy_s)
            counts, elapsed, pending = _timed_copy(dst, src, non_blocking=True)
            assert counts == FAST and pending >= 1 and elapsed < copy_s / 2, (counts, elapsed, copy_s)
        _assert_held()
        counts, elapsed, pending = _timed_copy(dst, src)
        assert counts == FAST and pending >= 1 and elapsed < copy_s / 2, (counts, elapsed, copy_s)
        torch.npu.synchronize()
    set_foreach_copy_mode("legacy")
    _assert_held(legacy=True)
    with pytest.raises(ValueError, match="expected one of"):
        set_foreach_copy_mode("fast")
    _assert_held(legacy=True)  # a refused mode changes nothing
    set_foreach_copy_mode("aligned")
    _assert_held()
    assert_equal_lists(dst, want)


@pytest.mark.asynchronous
def test_legacy_wait_uses_the_profile_timeout():
    """The blocking legacy copy waits at most the profile's sync_timeout_s, traced or not, with one error."""
    dst, src, _ = _slow_pairs()
    messages = []
    with _slow_copies(), foreach_copy_mode("legacy"), npusim.use_profile(sync_timeout_s=0.01):
        for traced in (False, True):
            calls: list[object] = []

            def copy_all(traced: bool = traced, calls: list[object] = calls) -> None:
                if traced:
                    with trace_foreach_copy() as records:
                        try:
                            torch._foreach_copy_(dst, src)
                        finally:
                            calls.extend(records)
                else:
                    torch._foreach_copy_(dst, src)

            before = acl.foreach_copy_route_counts()
            with pytest.raises(RuntimeError, match="within 0.01 s") as info:
                copy_all()
            # A failed launch is neither counted nor recorded.
            assert acl.foreach_copy_route_counts() == before and calls == []
            messages.append(str(info.value).split("\n")[0])
            torch.npu.synchronize()
    assert messages[0] == messages[1]


def test_profiler_sees_the_route_as_a_range():
    """Under torch.profiler the kernel names each group's route in a user-scope range."""
    dst, src = pairs(4, torch.float32)
    # A float32 group the fast way, an int32 group into float32 the slow way.
    cast_dst, cast_src = pairs(2, torch.int32, dst_dtype=torch.float32)
    mixed_dst, mixed_src = [*pairs(2, torch.float32)[0], *cast_dst], [*pairs(2, torch.float32)[1], *cast_src]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert _copy_counted(dst, src) == FAST
        assert _copy_counted(mixed_dst, mixed_src) == {"fast": 1, "slow": 1}
    names = [e.name for e in prof.events() if e.name.startswith("npusim::")]
    assert names == ["npusim::foreach_copy[fast]", "npusim::foreach_copy[fast]", "npusim::foreach_copy[slow]"]
    assert _copy_counted(dst, src) == FAST


@pytest.mark.parametrize("case", ["mixed_dtypes", "cross_dtype", "device_to_host", "host_to_device", "strided"])
def test_lists_the_fast_route_does_not_take(case: str):
    """Mixed dtypes go group by group, dtype changes and non-dense lists the slow way, host<->device by batch."""
    make = {
        "mixed_dtypes": lambda: ([*pairs(2, torch.float32)[0], *pairs(2, torch.int32)[0]],
                                 [*pairs(2, torch.float32)[1], *pairs(2, torch.int32)[1]]),
        "cross_dtype": lambda: pairs(3, torch.int32, dst_dtype=torch.float32),
        "device_to_host": lambda: pairs(3, torch.float32, dst_device="cpu"),
        "host_to_device": lambda: pairs(3, torch.float32, src_device="cpu"),
        "strided": lambda: pairs(3, torch.float32, shape=(8, 6)),
    }
    want = {"mixed_dtypes": {"fast": 2}, "cross_dtype": SLOW, "device_to_host": BATCH, "host_to_device": BATCH,
            "strided": SLOW}
    dst, src = make[case]()
    if case == "strided":
        dst, src = [d[:, ::2] for d in dst], [s[:, ::2] for s in src]
    assert _copy_counted(dst, src) == want[case]


def test_bad_lists_are_rejected_by_the_kernel():
    """Unequal lists raise upstream's error before any route: nothing copied, nothing counted."""
    dst, src = pairs(3, torch.float32)
    versions = [d._version for d in dst]
    before = acl.foreach_copy_route_counts()
    with pytest.raises(RuntimeError, match="^Tensor lists must have the same number of tensors, got 3 and 2$"):
        torch._foreach_copy_(dst, src[:2])
    sync_all()
    assert acl.foreach_copy_route_counts() == before
    assert [d._version for d in dst] == versions and all(not d.cpu().any() for d in dst)
