"""``torch._foreach_copy_``'s native npu kernel: which calls it takes itself, and its mirror of the
Python routing state (See Note [Native _foreach_copy_ kernel] in csrc/foreach_copy.cpp)."""

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

NATIVE = (1, 0)  # foreach_copy_counts() deltas: the kernel took the fast route itself
ROUTED = (0, 1)  # ... handed the call to the Python routing


def _counted(fn: Callable[[], object]) -> tuple[int, int]:
    """(native, routed) calls of the kernel while ``fn`` runs."""
    before = acl.foreach_copy_counts()
    fn()
    after = acl.foreach_copy_counts()
    return after[0] - before[0], after[1] - before[1]


def _copy_counted(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> tuple[int, int]:
    """Copies (checking the values against CPU) and returns the kernel's call counts."""
    want = expected(dst, src)
    counts = _counted(lambda: torch._foreach_copy_(dst, src, non_blocking=non_blocking))
    sync_all()
    assert_equal_lists(dst, want)
    return counts


def _profile_mirror(p: Profile) -> dict[str, object]:
    return {"kernel": p.foreach_copy_kernel, "nd_out": p.nd_out, "fast_dtypes": p.fast_dtype_mask,
            "sync_timeout_s": p.sync_timeout_s}


def _assert_mirror(legacy: bool = False, traced: bool = False) -> None:
    """The kernel's mirror holds the current profile, mode and trace state."""
    want = {**_profile_mirror(npusim.get_profile()), "legacy": legacy, "traced": traced}
    assert acl.foreach_copy_mirror() == want


def test_untraced_fast_call_is_taken_natively():
    """A same-dtype npu->npu list outside any trace is copied by the native kernel, one version bump each."""
    dst, src = pairs(100, torch.float32)
    versions = [d._version for d in dst]
    assert _copy_counted(dst, src) == NATIVE
    assert [d._version - v for d, v in zip(dst, versions, strict=True)] == [1] * 100
    _assert_mirror()


def test_trace_hands_calls_to_python_until_the_last_trace_exits():
    """An active trace (nested too) routes every call through Python, which records it; then native again."""
    dst, src = pairs(3, torch.float32)
    with trace_foreach_copy() as outer:
        _assert_mirror(traced=True)
        with trace_foreach_copy() as inner:
            assert _copy_counted(dst, src) == ROUTED
        _assert_mirror(traced=True)
        assert _copy_counted(dst, src) == ROUTED
    _assert_mirror()
    assert _copy_counted(dst, src) == NATIVE
    assert [c.routes for c in inner] == [("fast",)] and [c.routes for c in outer] == [("fast",)] * 2


def test_trace_exit_on_error_restores_the_native_route():
    """A trace left by an exception still tells the kernel it is over."""
    dst, src = pairs(3, torch.float32)
    with pytest.raises(KeyError), trace_foreach_copy():
        raise KeyError("boom")
    _assert_mirror()
    assert _copy_counted(dst, src) == NATIVE


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_mirrored(name: str):
    """Selecting a preset pushes its kernel, nd_out, fast dtypes and timeout; leaving it restores the default."""
    with npusim.use_profile(name):
        _assert_mirror()
    assert npusim.get_profile() is PRESETS["training_soc"]
    _assert_mirror()


@pytest.mark.parametrize(("change", "dtype", "counts"), [
    (lambda: npusim.use_profile("inference_soc"), torch.float32, ROUTED),  # no nd_out: slow in Python
    (lambda: npusim.use_profile("no_foreach_kernel"), torch.float32, ROUTED),  # compat
    (lambda: npusim.use_profile(nd_out=False), torch.float32, ROUTED),  # a single override
    (lambda: npusim.use_profile("old_cann"), torch.int64, ROUTED),  # a dtype the kernel lacks
    (lambda: npusim.use_profile("old_cann"), torch.float32, NATIVE),
    (lambda: npusim.use_profile(sync_timeout_s=5.0), torch.float32, NATIVE),
], ids=["inference_soc", "no_foreach_kernel", "nd_out=0", "old_cann-int64", "old_cann-float32", "timeout"])
def test_profile_changes_route_and_are_undone(change: Callable[[], object], dtype: torch.dtype,
                                              counts: tuple[int, int]):
    """Inside use_profile the kernel routes by that profile; after it, by the default one again."""
    dst, src = pairs(5, dtype)
    with change():
        _assert_mirror()
        assert _copy_counted(dst, src) == counts
    _assert_mirror()
    assert _copy_counted(dst, src) == NATIVE


def test_set_profile_and_a_failing_use_profile_are_mirrored():
    """set_profile pushes at once; use_profile left by an exception restores what was current."""
    dst, src = pairs(5, torch.float32)
    npusim.set_profile("inference_soc")
    _assert_mirror()
    assert _copy_counted(dst, src) == ROUTED
    with pytest.raises(KeyError), npusim.use_profile("training_soc"):
        assert _copy_counted(dst, src) == NATIVE
        raise KeyError("boom")
    assert npusim.get_profile() is PRESETS["inference_soc"]
    _assert_mirror()
    assert _copy_counted(dst, src) == ROUTED
    with pytest.raises(ValueError, match="unknown flag"):
        npusim.set_profile("training_soc", nd_outt=True)  # refused: the mirror keeps the current profile
    _assert_mirror()
    npusim.set_profile()
    _assert_mirror()
    assert _copy_counted(dst, src) == NATIVE


def test_profile_and_mode_from_the_environment_are_mirrored_at_import():
    """NPUSIM_PROFILE and NPUSIM_FOREACH_COPY_MODE reach the kernel before the first call of a fresh process."""
    code = ("import torch, npusim; from npusim.runtime import acl; "
            "m = acl.foreach_copy_mirror(); "
            "d, s = [torch.empty(4, device='npu')], [torch.ones(4, device='npu')]; "
            "torch._foreach_copy_(d, s); torch.npu.synchronize(); "
            "print(m['nd_out'], m['legacy'], acl.foreach_copy_counts(), d[0].sum().item())")
    env = {**os.environ, "NPUSIM_PROFILE": "inference_soc", "NPUSIM_FOREACH_COPY_MODE": "legacy"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False True (0, 1) 4.0"


def _slow_pairs() -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """(dst, src, simulated seconds of their copy at 0.1 GB/s)."""
    n, numel = 8, 1 << 18
    dst, src = pairs(n, torch.float32, shape=(numel,))
    return dst, src, n * numel * 4 / 0.1e9


@contextmanager
def _slow_copies() -> Iterator[None]:
    with npusim.timing.model(copy_gbps=0.1):
        yield


def _timed_copy(dst: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False
                ) -> tuple[tuple[int, int], float, int]:
    """(kernel counts, host seconds, tasks still pending on return) of one copy."""
    start = time.perf_counter()
    counts = _counted(lambda: torch._foreach_copy_(dst, src, non_blocking=non_blocking))
    elapsed = time.perf_counter() - start
    return counts, elapsed, torch.npu.current_stream().pending()


def test_mode_is_mirrored_and_the_native_legacy_kernel_waits():
    """Legacy mode, set by API or context manager, makes the native kernel wait for a blocking copy;
    back in aligned mode it returns at once."""
    dst, src, copy_s = _slow_pairs()
    want = expected(dst, src)
    with _slow_copies():
        with foreach_copy_mode("legacy"):
            _assert_mirror(legacy=True)
            counts, elapsed, pending = _timed_copy(dst, src)
            assert counts == NATIVE and pending == 0 and elapsed >= copy_s * 0.9, (counts, elapsed, copy_s)
            counts, elapsed, pending = _timed_copy(dst, src, non_blocking=True)
            assert counts == NATIVE and pending >= 1 and elapsed < copy_s / 2, (counts, elapsed, copy_s)
        _assert_mirror()
        counts, elapsed, pending = _timed_copy(dst, src)
        assert counts == NATIVE and pending >= 1 and elapsed < copy_s / 2, (counts, elapsed, copy_s)
        torch.npu.synchronize()
    set_foreach_copy_mode("legacy")
    _assert_mirror(legacy=True)
    with pytest.raises(ValueError, match="expected one of"):
        set_foreach_copy_mode("fast")
    _assert_mirror(legacy=True)  # a refused mode changes nothing
    set_foreach_copy_mode("aligned")
    _assert_mirror()
    assert_equal_lists(dst, want)


def test_native_legacy_wait_uses_the_profile_timeout():
    """The blocking legacy copy waits at most the profile's sync_timeout_s, with the same error as Python's."""
    dst, src, _ = _slow_pairs()
    messages = []
    with _slow_copies(), foreach_copy_mode("legacy"), npusim.use_profile(sync_timeout_s=0.01):
        for traced in (False, True):
            before = acl.foreach_copy_counts()
            with pytest.raises(RuntimeError, match="within 0.01 s") as info:
                if traced:
                    with trace_foreach_copy():
                        torch._foreach_copy_(dst, src)
                else:
                    torch._foreach_copy_(dst, src)
            after = acl.foreach_copy_counts()
            # A failed native launch counts as neither; the traced one was handed to Python.
            assert (after[0] - before[0], after[1] - before[1]) == ((0, 0) if not traced else ROUTED)
            messages.append(str(info.value).split("\n")[0])
            torch.npu.synchronize()
    assert messages[0] == messages[1]


def test_profiler_hands_calls_to_python_for_the_route_range():
    """Under torch.profiler the Python routing runs and names the route; after it the kernel is native again."""
    dst, src = pairs(4, torch.float32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert _copy_counted(dst, src) == ROUTED
    names = [e.name for e in prof.events() if e.name.startswith("npusim::")]
    assert names == ["npusim::foreach_copy[fast]"]  # no range of the routed op itself
    assert _copy_counted(dst, src) == NATIVE


@pytest.mark.parametrize("case", ["mixed_dtypes", "cross_dtype", "device_to_host", "host_to_device", "strided"])
def test_lists_the_fast_route_does_not_take_are_routed(case: str):
    """Mixed dtypes, dtype changes, host<->device and non-dense lists go to the Python routing."""
    make = {
        "mixed_dtypes": lambda: ([*pairs(2, torch.float32)[0], *pairs(2, torch.int32)[0]],
                                 [*pairs(2, torch.float32)[1], *pairs(2, torch.int32)[1]]),
        "cross_dtype": lambda: pairs(3, torch.int32, dst_dtype=torch.float32),
        "device_to_host": lambda: pairs(3, torch.float32, dst_device="cpu"),
        "host_to_device": lambda: pairs(3, torch.float32, src_device="cpu"),
        "strided": lambda: pairs(3, torch.float32, shape=(8, 6)),
    }
    dst, src = make[case]()
    if case == "strided":
        dst, src = [d[:, ::2] for d in dst], [s[:, ::2] for s in src]
    assert _copy_counted(dst, src) == ROUTED


def test_bad_lists_are_rejected_by_the_native_kernel():
    """Unequal lists raise upstream's error in the native kernel itself: nothing copied, nothing handed on."""
    dst, src = pairs(3, torch.float32)
    versions = [d._version for d in dst]
    before = acl.foreach_copy_counts()
    with pytest.raises(RuntimeError, match="^Tensor lists must have the same number of tensors, got 3 and 2$"):
        torch._foreach_copy_(dst, src[:2])
    sync_all()
    assert acl.foreach_copy_counts() == before
    assert [d._version for d in dst] == versions and all(not d.cpu().any() for d in dst)
