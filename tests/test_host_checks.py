"""Calls PyTorch's kernels refuse, on npu with every call a stream task (queued behind a busy stream): each
raises from the call, as CUDA's host checks raise it, and no call fails the device. PyTorch's OpInfo error inputs
(Note [Argument checks of CPU kernels] in csrc/aten/host_checks.cpp; where npusim makes a CPU kernel's check at
the launch, the message is CPU's own), out= tensors of another dtype than the op's result (Note [out= tensors
of another dtype] in csrc/aten/launch/op_launch.cpp) and written tensors that overlap (Note [Written tensors
that overlap]), over every op's first float32 sample: npusim.conformance.misuse's sweep, which
``python -m npusim conformance misuse`` runs over every sample and dtype."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from npusim.conformance.misuse import Report, queued_as_a_task, sweep

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
    return queued_as_a_task(lambda: _call(op, error_input))


def _no_findings(report: Report, kind: str) -> str:
    return "\n".join(f"{f.verdict}: {f.op} {f.case}: {f.detail}" for f in report.findings if f.kind == kind)


@pytest.fixture(scope="module")
def float32_sweep() -> Report:
    """One pass over op_db (its samples are made once) for the kinds judged at every op's first float32 sample."""
    return sweep(kinds=("error-inputs", "out-dtype", "overlap"))


def test_no_error_input_fails_the_device(float32_sweep: Report) -> None:
    """Every OpInfo error input, queued as a stream task, raises from the call (its own message) or runs."""
    report = float32_sweep
    assert _no_findings(report, "error-inputs") == ""
    # The sweep ran: PyTorch 2.13's op_db has about 670 error inputs.
    assert report.counts["error-inputs", "refused"] + report.counts["error-inputs", "ran"] > 500


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


def test_out_of_another_dtype_raises_or_casts_as_on_cpu(float32_sweep: Report) -> None:
    """Every out= op of op_db, its first float32 sample, with out= tensors of float64, float16 and int64,
    queued as a stream task: it raises CPU's error from the call or writes CPU's values, and never fails the
    device (before, 339 such calls over 60 ops failed it: softmax, cumsum, amax, sort, index_select, tril,
    linalg.solve, ...; Note [out= tensors of another dtype])."""
    report = float32_sweep
    assert _no_findings(report, "out-dtype") == ""
    assert report.counts["out-dtype", "refused"] > 300 and report.counts["out-dtype", "ran"] > 200, report.counts


def test_written_tensors_that_overlap_raise_from_the_call(float32_sweep: Report) -> None:
    """Overlapping written tensors (Note [Written tensors that overlap]): out= tensors that partially overlap
    the input or are expanded, in-place selves expanded or partially overlapping an argument, for op_db's
    first float32 samples, queued as stream tasks: each raises CPU's error from the call where CPU raises and
    runs where CPU runs, and none fails the device (before, 106 out= calls with a partially overlapping out=
    tensor and 89 in-place calls on an expanded self did)."""
    report = float32_sweep
    assert _no_findings(report, "overlap") == ""
    assert report.counts["overlap", "refused"] > 300, report.counts  # most of these calls are refused


def test_in_place_ops_on_integer_and_bool_selves_raise_or_run_as_on_cpu() -> None:
    """Every in-place variant of op_db on its first int64 and bool samples, queued as a stream task: it raises
    CPU's error from the call (a float op into an integer self: "result type Float can't be cast to the desired
    output type Long") or writes CPU's values (before, logit_ failed the device)."""
    report = sweep(kinds=("in-place",), dtypes=(torch.int64, torch.bool))
    assert _no_findings(report, "in-place") == ""
    assert report.counts["in-place", "refused"] > 50 and report.counts["in-place", "ran"] > 100, report.counts
