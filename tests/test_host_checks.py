"""PyTorch's OpInfo error inputs on npu with every call a stream task (queued behind a busy stream): each error
raises from the call, as CUDA's host checks raise it, and no call fails the device (Note [Argument checks of CPU
kernels] in csrc/aten/host_checks.cpp). Where npusim makes a CPU kernel's check at the launch, the message is
CPU's own. So for out= tensors of another dtype than the op's result (Note [out= tensors of another dtype] in
csrc/aten/launch/op_launch.cpp)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

from npusim.testing.device_failures import clear_device_failures

# About 0.1 ms of device work ahead of each call: the op is queued behind it, so it is a stream task.
BUSY_CYCLES = 200_000


# The ops whose CPU kernels check what their Meta kernels let through: checked at the launch.
CHECKED_AT_LAUNCH = ("nn.functional.gelu", "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
                     "kthvalue", "multinomial", "masked_fill", "take", "bucketize", "masked_scatter", "index_select",
                     "cat", "complex", "aminmax")


def _error_inputs(op, device: str) -> Iterator:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from op.error_inputs(device)


def _call(op, error_input) -> Exception | None:  # noqa: ANN001
    sample = error_input.sample_input
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            op(sample.input, *sample.args, **sample.kwargs)
        except Exception as e:  # noqa: BLE001  (the error under test, whatever its type)
            return e
    return None


def _as_a_task(op, error_input) -> tuple[Exception | None, str]:  # noqa: ANN001
    """The call's error with the op queued behind device work, and how the device came out of it ("" when
    well)."""
    torch.npu._sleep(BUSY_CYCLES)
    raised = _call(op, error_input)
    failed = ""
    try:
        torch.npu.synchronize()
    except RuntimeError as e:
        failed = str(e)
    left = clear_device_failures()
    return raised, failed or (str(left) if left else "")


def test_no_error_input_fails_the_device() -> None:
    device_failures = []
    checked = 0
    for op in op_db:
        if op.error_inputs_func is None:
            continue
        for error_input in _error_inputs(op, "npu"):
            raised, failed = _as_a_task(op, error_input)
            checked += 1
            if failed:
                device_failures.append(f"{op.name}: {failed[:200]}")
            if raised is not None and error_input.error_regex:
                assert re.search(error_input.error_regex, str(raised)), (op.name, str(raised))
    assert checked > 500  # the sweep ran: PyTorch 2.13's op_db has about 670 error inputs
    assert device_failures == [], "\n".join(device_failures)


@pytest.mark.parametrize("name", CHECKED_AT_LAUNCH)
def test_launch_checks_raise_cpus_errors(name: str) -> None:
    op = next(o for o in op_db if o.name == name)
    compared = 0
    for error_input in _error_inputs(op, "npu"):
        # The same arguments on CPU (an output that aliases an input becomes a tensor of its own there, so
        # CPU may not refuse it: then the error input's own regex is the reference).
        on_cpu = error_input.sample_input.transform(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t)
        want = _call(op, type(error_input)(on_cpu, error_type=error_input.error_type,
                                           error_regex=error_input.error_regex))
        raised, failed = _as_a_task(op, error_input)
        assert failed == "", failed
        if raised is None:
            assert want is None, f"{name}: the call did not raise CPU's {want!r}"
            continue
        if want is None:
            assert re.search(error_input.error_regex, str(raised)), (name, str(raised))
        else:
            assert (type(raised), str(raised).splitlines()[0]) == (type(want), str(want).splitlines()[0])
        compared += 1
    assert compared > 0
    assert torch.equal((torch.ones(4, device="npu") * 2).cpu(), torch.full((4,), 2.0))  # the device works on


# out= tensors of these dtypes for float32 samples: wider, narrower, and of another kind.
OUT_DTYPES = (torch.float64, torch.float16, torch.int64)
# Random ops draw other numbers on npu (Philox) than on CPU, and their errors name npu's kernels.
RANDOM = ("normal", "bernoulli", "multinomial")


def _outs_like(result: Any, dtype: torch.dtype) -> Any:
    """Zeroed out= tensors for `result`: floating ones of `dtype`, integer ones (indices) of their own."""
    def one(t: torch.Tensor) -> torch.Tensor:
        floating = t.dtype.is_floating_point or t.dtype.is_complex
        return torch.zeros(t.shape, dtype=dtype if floating else t.dtype)
    if isinstance(result, torch.Tensor):
        return one(result)
    if isinstance(result, tuple) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(one(t) for t in result)
    return None


def _call_out(op, sample, out: Any) -> Exception | None:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            op(sample.input, *sample.args, out=out, **sample.kwargs)
        except Exception as e:  # noqa: BLE001  (CPU's error, whatever its type)
            return e
    return None


def test_out_of_another_dtype_raises_or_casts_as_on_cpu() -> None:
    """Every out= op of op_db, its first float32 sample, with out= tensors of another dtype, queued as a stream
    task: it raises CPU's error from the call or writes CPU's values, and never fails the device (before, 339
    such calls over 60 ops failed it: softmax, cumsum, amax, sort, index_select, tril, linalg.solve, ...)."""
    to_npu = lambda t: t.to("npu") if isinstance(t, torch.Tensor) else t  # noqa: E731
    device_failures, mismatches = [], []
    refused = written = 0
    for op in op_db:
        if not op.supports_out:
            continue
        sample = next(iter(op.sample_inputs("cpu", torch.float32)), None)
        if sample is None or not isinstance(sample.input, torch.Tensor) or sample.input.layout != torch.strided:
            continue  # sparse samples: npu tensors are strided
        try:
            result = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001, S112  (a sample CPU itself refuses without out=)
            continue
        for dtype in OUT_DTYPES:
            cpu_out = _outs_like(result, dtype)
            if cpu_out is None:
                continue
            want = _call_out(op, sample, cpu_out)
            npu_out = tree_map(to_npu, cpu_out)
            torch.npu._sleep(BUSY_CYCLES)
            got = _call_out(op, sample.transform(to_npu), npu_out)
            failed = ""
            try:
                torch.npu.synchronize()
            except RuntimeError as e:
                failed = str(e)
            left = clear_device_failures()
            where = f"{op.name} {op.variant_test_name} out={dtype}"
            if failed or left:
                device_failures.append(f"{where}: {(failed or str(left))[:200]}")
            elif (want is None) != (got is None):
                mismatches.append(f"{where}: CPU {want!r}, npu {got!r}")
            elif want is not None:
                refused += 1
                if type(want) is not type(got) or (op.name not in RANDOM and
                                                   str(want).splitlines()[0] != str(got).splitlines()[0]):
                    mismatches.append(f"{where}: CPU {want!r}, npu {got!r}")
            else:
                written += 1
                if op.name not in RANDOM:
                    torch.testing.assert_close(tree_map(lambda t: t.cpu(), npu_out), cpu_out, equal_nan=True,
                                               atol=1e-3, rtol=1e-3, msg=lambda m, w=where: f"{w}: {m}")
    assert refused > 300 and written > 200, (refused, written)  # the sweep ran over op_db's out= ops
    assert device_failures == [], "\n".join(device_failures)
    assert mismatches == [], "\n".join(mismatches)


def _overlapping_cases() -> Iterator[tuple[str, Any, dict[str, tuple]]]:
    """(what, fn, {device: (written tensors, args, kwargs)}) for op_db's float32 first samples: an out= tensor
    that partially overlaps the input or is expanded (over a buffer of its full size, so a kernel that ignores
    its strides writes inside it), and an in-place op's self expanded or partially overlapping a tensor
    argument; the same tensors on CPU and on npu."""
    for op in op_db:
        sample = next(iter(op.sample_inputs("cpu", torch.float32)), None)
        if sample is None or not isinstance(sample.input, torch.Tensor) or sample.input.layout != torch.strided:
            continue
        shape, n = sample.input.shape, sample.input.numel()
        if n < 2:
            continue
        result = None
        if op.supports_out:
            try:
                result = op(sample.input, *sample.args, **sample.kwargs)
            except Exception:  # noqa: BLE001  (a sample CPU refuses without out=)
                result = None
            if not (isinstance(result, torch.Tensor) and result.dtype == torch.float32 and 2 <= result.numel() <= n):
                result = None
        other = next((i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor) and a.shape == shape
                      and a.dtype == torch.float32), None)
        cases: dict[str, tuple[Any, dict[str, tuple]]] = {}
        for dev in ("cpu", "npu"):
            def moved(v: Any, dev: str = dev) -> Any:
                return tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, v)
            args, kwargs = tuple(moved(sample.args)), moved(sample.kwargs)
            base = torch.zeros(2 * n, device=dev)
            base[:n] = sample.input.reshape(-1).to(dev)
            if result is not None:
                cases.setdefault("out= partial", (op, {}))[1][dev] = (
                    (base[:n].view(shape), base[n // 2:n // 2 + result.numel()].view(result.shape)), args, kwargs)
                expanded = torch.zeros(result.numel(), device=dev)[:1].expand(result.shape)
                cases.setdefault("out= expanded", (op, {}))[1][dev] = ((moved(sample.input), expanded), args, kwargs)
            if op.inplace_variant is not None:
                cases.setdefault("in-place expanded", (op.inplace_variant, {}))[1][dev] = (
                    (torch.zeros(n, device=dev)[:1].expand(shape), None), args, kwargs)
                if other is not None:
                    partial = list(args)
                    partial[other] = base[:n].view(shape)
                    cases.setdefault("in-place partial", (op.inplace_variant, {}))[1][dev] = (
                        (base[n // 2:n // 2 + n].view(shape), None), tuple(partial), kwargs)
        for what, (fn, per_device) in cases.items():
            yield f"{op.name} {op.variant_test_name} {what}", fn, per_device


def _call_written(fn, tensors: tuple, args: tuple, kwargs: dict) -> Exception | None:  # noqa: ANN001
    first, out = tensors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(first, *args, **kwargs) if out is None else fn(first, *args, out=out, **kwargs)
        except Exception as e:  # noqa: BLE001  (CPU's error, whatever its type)
            return e
    return None


def test_written_tensors_that_overlap_raise_from_the_call() -> None:
    """Overlapping written tensors (Note [Written tensors that overlap]): every such call of op_db's first
    float32 samples, queued as a stream task, raises CPU's error from the call where CPU raises and runs where
    CPU runs, and none fails the device (before, 106 out= calls with a partially overlapping out= tensor and 89
    in-place calls on an expanded self did)."""
    device_failures, mismatches = [], []
    refused = 0
    for what, fn, per_device in _overlapping_cases():
        want = _call_written(fn, *per_device["cpu"])
        torch.npu._sleep(BUSY_CYCLES)
        got = _call_written(fn, *per_device["npu"])
        failed = ""
        try:
            torch.npu.synchronize()
        except RuntimeError as e:
            failed = str(e)
        left = clear_device_failures()
        if failed or left:
            device_failures.append(f"{what}: {(failed or str(left))[:200]}")
        elif (want is None) != (got is None) or (want is not None and (
                type(want) is not type(got) or str(want).splitlines()[0] != str(got).splitlines()[0])):
            mismatches.append(f"{what}: CPU {want!r}, npu {got!r}")
        refused += want is not None
    assert refused > 300, refused  # the sweep ran: most of these calls are refused
    assert device_failures == [], "\n".join(device_failures)
    assert mismatches == [], "\n".join(mismatches)
