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


@pytest.mark.parametrize("as_a_task", [False, True], ids=["on the host", "as a task"])
def test_addr_in_place_refuses_a_self_it_would_have_to_resize(as_a_task: bool) -> None:
    """addr_ is in place by the identity of addr_out's two arguments (Note [addr_ is in place by identity] in
    csrc/aten/fallback_routes.cpp): a self that is not 2-D or not of the outer product's shape raises CPU's own error
    and is left as it was, shape and values (before, npu expanded a 0-dim self and resized it to [3, 4] with
    PyTorch's resize warning); a self of the right shape gets CPU's values."""
    vec1, vec2 = torch.arange(1.0, 4.0), torch.arange(1.0, 5.0)
    selves = {"0-dim": torch.tensor(2.0), "1-D": torch.ones(4), "[1, 4]": torch.ones(1, 4),
              "[3, 1]": torch.ones(3, 1), "[2, 4]": torch.ones(2, 4), "[3, 4]": torch.full((3, 4), 0.5)}
    for what, self in selves.items():
        cpu_self = self.clone()
        try:
            cpu_self.addr_(vec1, vec2, beta=2.0)
            want = None
        except RuntimeError as e:
            want = str(e)
        npu_self = self.to("npu")

        def call(npu_self: torch.Tensor = npu_self) -> Exception | None:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a resize warning fails the test
                try:
                    npu_self.addr_(vec1.to("npu"), vec2.to("npu"), beta=2.0)
                except RuntimeError as e:
                    return e
            return None

        if as_a_task:
            got, failed = queued_as_a_task(call)
            assert failed == "", (what, failed)
        else:
            got = call()
        assert (None if got is None else str(got)) == want, what
        expected = self if want is not None else cpu_self
        assert npu_self.shape == expected.shape and torch.equal(npu_self.cpu(), expected), what
    assert want is None  # the last self, of the right shape, ran


def test_addr_runs_cpus_kernel_in_every_variant() -> None:
    """addr_'s kernel leaves addr and addr.out routed to CPU's kernel (Note [CPU's kernel, not the composite]):
    all three variants give CPU's float16 and bfloat16 values bit for bit, where the composite rounds otherwise
    (a first version of the addr_ kernel, registered before the routes, unrouted both)."""
    from npusim.ops import FALLBACK_ROUTES

    assert {"aten::addr", "aten::addr.out"} <= FALLBACK_ROUTES.keys()
    for dtype in (torch.float16, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        self, vec1, vec2 = (torch.randn(*shape, generator=gen).to(dtype) for shape in ((5, 10), (5,), (10,)))
        kwargs = {"beta": 0.6, "alpha": 0.2}
        want = torch.addr(self, vec1, vec2, **kwargs)
        on_npu = [t.to("npu") for t in (self, vec1, vec2)]
        out = torch.empty_like(on_npu[0])
        in_place = on_npu[0].clone()
        results = {"addr": torch.addr(*on_npu, **kwargs), "addr.out": torch.addr(*on_npu, **kwargs, out=out),
                   "addr_": in_place.addr_(*on_npu[1:], **kwargs)}
        for variant, got in results.items():
            assert torch.equal(got.cpu(), want), (dtype, variant)
