"""PyTorch's OpInfo error inputs on npu with every call a stream task (queued behind a busy stream): each error
raises from the call, as CUDA's host checks raise it, and no call fails the device (Note [Argument checks of CPU
kernels] in csrc/aten/host_checks.cpp). Where npusim makes a CPU kernel's check at the launch, the message is
CPU's own."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

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
