"""Calls that PyTorch's kernels refuse, on npu as stream tasks, against CPU.

A call that CPU's kernel refuses (and CUDA's launch refuses from the call) must raise from the call on npu,
with CPU's message, and leave the device usable; a call CPU runs must give CPU's values. A stream task that
refuses when it runs fails the device for the rest of the process instead (Note [Errors of asynchronous
work]), so every call here is queued behind device work (``torch.npu._sleep``) to be a task. Three kinds, over
PyTorch's OpInfo database:

- ``error-inputs``: each op's OpInfo error inputs, which must raise their own message (Note [Argument checks
  of CPU kernels]);
- ``out-dtype``: out= tensors of float64, float16 and int64 for each sample's result (floating results; index
  results keep their dtype), which CPU refuses or casts into (Note [out= tensors of another dtype]);
- ``in-place``: each op's in-place variant on each sample, which CPU refuses where the result's dtype cannot
  be cast into self's (an integer self of a float op: logit_) or runs;
- ``overlap``: an out= tensor that partially overlaps the input or is expanded, and an in-place op's self
  expanded or partially overlapping a tensor argument (Note [Written tensors that overlap]). An expanded
  tensor is a view of a buffer of its full size, so that a kernel that ignores its strides (avg_pool3d's
  CPU kernel writes an expanded out= tensor element by element) writes inside memory it owns.

``tests/test_host_checks.py`` runs each kind over every op's first float32 sample; the CLI
``python -m npusim conformance misuse`` runs them over every sample and dtype.
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from npusim._device import clear_device_failures

__all__ = ["KINDS", "Finding", "Report", "queued_as_a_task", "sweep"]

KINDS = ("error-inputs", "out-dtype", "in-place", "overlap")
# About 0.1 ms of device work ahead of each call: the op is queued behind it, so it is a stream task.
BUSY_CYCLES = 200_000
# The out= dtypes of the out-dtype kind: wider, narrower and of another kind than a float32 result.
OUT_DTYPES = (torch.float64, torch.float16, torch.int64)
# Random ops draw other numbers on npu (Philox) than on CPU, and their errors name npu's kernels.
RANDOM_OPS = ("normal", "bernoulli", "multinomial", "uniform", "cauchy", "exponential", "geometric", "log_normal",
              "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
              "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu")


@dataclass
class Finding:
    """A call npu handles otherwise than CPU: ``device failed`` or ``mismatch``."""

    kind: str
    op: str
    case: str
    verdict: str
    detail: str


@dataclass
class Report:
    """Outcomes per (kind, outcome): ``refused`` (raised from the call as CPU does), ``ran`` (as CPU, values
    equal), ``device failed``, ``mismatch``; and the findings."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    def add(self, kind: str, outcome: str, finding: Finding | None = None) -> None:
        self.counts[(kind, outcome)] += 1
        if finding is not None:
            self.findings.append(finding)


@dataclass
class _Call:
    """fn(first, *args, out=out (when given), **kwargs) on one device."""

    fn: Callable[..., Any]
    first: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any = None

    @property
    def written(self) -> Any:
        """What the call writes: its out= tensors, else its first argument (an in-place op's self)."""
        return self.first if self.out is None else self.out

    def __call__(self) -> Exception | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if self.out is None:
                    self.fn(self.first, *self.args, **self.kwargs)
                else:
                    self.fn(self.first, *self.args, out=self.out, **self.kwargs)
            except Exception as e:  # noqa: BLE001  (the refusal under test, whatever its type)
                return e
        return None


@dataclass
class _Case:
    op: str
    what: str
    npu: _Call
    cpu: _Call | None = None  # None: judged by the error input's regex alone
    regex: str | None = None
    compare_values: bool = False


def _moved(value: Any, device: str) -> Any:
    """``value``'s tensors on ``device``; in a dict of keyword arguments, a ``device`` too (factory ops:
    linspace's samples are made for CPU)."""
    if isinstance(value, dict) and "device" in value:
        value = {**value, "device": torch.device(device)}
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)


def _first_line(e: Exception) -> str:
    """The message's first line, with a tensor type's device left out ("CPUBoolType" and "npuBoolType" are
    "BoolType": an expand error names the tensor's type, and so its device)."""
    lines = str(e).splitlines()
    return re.sub(r"\b(?:CPU|npu)(\w+Type)\b", r"\1", lines[0]) if lines else ""


def _samples(op: Any, dtype: torch.dtype, samples: int | None) -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for i, sample in enumerate(op.sample_inputs("cpu", dtype)):
                if samples is not None and i >= samples:
                    return
                if isinstance(sample.input, torch.Tensor) and sample.input.layout == torch.strided:
                    yield sample  # npu tensors are strided
        except Exception:  # noqa: BLE001  (an op whose sample generator fails on this dtype)
            return


def _error_input_cases(op: Any) -> Iterator[_Case]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        error_inputs = list(op.error_inputs("npu"))
    for error_input in error_inputs:
        s = error_input.sample_input
        yield _Case(op.name, "error input", _Call(op, s.input, tuple(s.args), dict(s.kwargs)),
                    regex=error_input.error_regex or None)


def _outs_like(result: Any, dtype: torch.dtype) -> Any:
    """Zeroed out= tensors for ``result``: floating ones of ``dtype``, integer ones (indices) of their own."""
    def one(t: torch.Tensor) -> torch.Tensor:
        floating = t.dtype.is_floating_point or t.dtype.is_complex
        return torch.zeros(t.shape, dtype=dtype if floating else t.dtype)
    if isinstance(result, torch.Tensor):
        return one(result)
    if isinstance(result, tuple) and result and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(one(t) for t in result)
    return None


def _cpu_result(op: Any, sample: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001  (a sample CPU refuses without out=: nothing to misuse)
            return None


# Each kind's cases for one sample; ``result`` is the op's CPU result for it (None: no out= variant, or CPU
# refused the sample), computed once for the kinds that size out= tensors by it.
def _out_dtype_cases(op: Any, sample: Any, result: Any) -> Iterator[_Case]:
    for dtype in OUT_DTYPES:
        cpu_out = _outs_like(result, dtype)
        if cpu_out is None:
            continue
        yield _Case(op.name, f"out={str(dtype).removeprefix('torch.')}",
                    _Call(op, _moved(sample.input, "npu"), _moved(tuple(sample.args), "npu"),
                          _moved(dict(sample.kwargs), "npu"), _moved(cpu_out, "npu")),
                    _Call(op, sample.input, tuple(sample.args), dict(sample.kwargs), cpu_out),
                    compare_values=op.name not in RANDOM_OPS)


def _in_place_cases(op: Any, sample: Any, result: Any) -> Iterator[_Case]:
    if op.inplace_variant is None:
        return
    cpu = _Call(op.inplace_variant, sample.input.clone(), tuple(sample.args), dict(sample.kwargs))
    npu = _Call(op.inplace_variant, _moved(sample.input, "npu"), _moved(tuple(sample.args), "npu"),
                _moved(dict(sample.kwargs), "npu"))
    yield _Case(op.name, f"in-place {str(sample.input.dtype).removeprefix('torch.')}", npu, cpu,
                compare_values=op.name not in RANDOM_OPS)


def _overlap_cases(op: Any, sample: Any, result: Any) -> Iterator[_Case]:
    shape, n = sample.input.shape, sample.input.numel()
    if n < 2 or sample.input.dtype != torch.float32:
        return
    if not (isinstance(result, torch.Tensor) and result.dtype == torch.float32 and 2 <= result.numel() <= n):
        result = None
    other = next((i for i, a in enumerate(sample.args)
                  if isinstance(a, torch.Tensor) and a.shape == shape and a.dtype == torch.float32), None)
    calls: dict[str, dict[str, _Call]] = {}
    for device in ("cpu", "npu"):
        args, kwargs = _moved(tuple(sample.args), device), _moved(dict(sample.kwargs), device)
        base = torch.zeros(2 * n, device=device)
        base[:n] = sample.input.reshape(-1).to(device)
        if result is not None:
            m = result.numel()
            calls.setdefault("out= partial", {})[device] = _Call(
                op, base[:n].view(shape), args, kwargs, base[n // 2:n // 2 + m].view(result.shape))
            calls.setdefault("out= expanded", {})[device] = _Call(
                op, _moved(sample.input, device), args, kwargs, torch.zeros(m, device=device)[:1].expand(result.shape))
        if op.inplace_variant is not None:
            calls.setdefault("in-place expanded", {})[device] = _Call(
                op.inplace_variant, torch.zeros(n, device=device)[:1].expand(shape), args, kwargs)
            if other is not None:
                partial = list(args)
                partial[other] = base[:n].view(shape)
                calls.setdefault("in-place partial", {})[device] = _Call(
                    op.inplace_variant, base[n // 2:n // 2 + n].view(shape), tuple(partial), kwargs)
    for what, per_device in calls.items():
        yield _Case(op.name, what, per_device["npu"], per_device["cpu"])  # values: undefined where they overlap


def queued_as_a_task(call: Callable[[], Exception | None]) -> tuple[Exception | None, str]:
    """``call()``'s error (it returns it) with the call queued behind device work, so that its op is a stream
    task, and how the device came out of it ("" when well; a failure is cleared)."""
    torch.npu._sleep(BUSY_CYCLES)
    raised = call()
    failed = ""
    try:
        torch.npu.synchronize()
    except RuntimeError as e:
        failed = str(e)
    left = clear_device_failures()
    return raised, failed or (str(left) if left else "")


def _judge(kind: str, case: _Case, report: Report) -> None:
    want = case.cpu() if case.cpu is not None else None
    got, failed = queued_as_a_task(case.npu)
    where = (kind, case.op, case.what)
    if failed:
        report.add(kind, "device failed", Finding(*where, "device failed", failed[:300]))
        return
    if case.cpu is None:  # an error input: its own regex
        if got is not None and case.regex and not re.search(case.regex, str(got)):
            report.add(kind, "mismatch", Finding(*where, "mismatch", f"{got!r} does not match {case.regex!r}"))
        else:
            report.add(kind, "refused" if got is not None else "ran")
        return
    if (want is None) != (got is None) or (want is not None and (
            type(want) is not type(got) or (case.op not in RANDOM_OPS and _first_line(want) != _first_line(got)))):
        report.add(kind, "mismatch", Finding(*where, "mismatch", f"CPU {want!r}, npu {got!r}"[:300]))
        return
    if want is None and case.compare_values:
        try:
            torch.testing.assert_close(_moved(case.npu.written, "cpu"), case.cpu.written, equal_nan=True,
                                       atol=1e-3, rtol=1e-3)
        except AssertionError as e:
            report.add(kind, "mismatch", Finding(*where, "mismatch", _first_line(e)))
            return
    report.add(kind, "refused" if want is not None else "ran")


def sweep(kinds: Sequence[str] = KINDS, ops: Sequence[str] | None = None,
          dtypes: Sequence[torch.dtype] = (torch.float32,), samples: int | None = 1,
          progress: Callable[[str], None] | None = None) -> Report:
    """Runs ``kinds`` over the OpInfo ops whose name matches one of ``ops`` (fnmatch; None: all), ``samples``
    samples (None: all) of each of ``dtypes`` an op supports on CPU (out-dtype and overlap; error inputs have
    their own)."""
    from torch.testing._internal.common_methods_invocations import op_db

    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"misuse sweep: unknown kinds {sorted(unknown)}; expected some of {KINDS}")
    report = Report()
    for op in op_db:
        if ops is not None and not any(fnmatch.fnmatchcase(op.name, p) for p in ops):
            continue
        if "error-inputs" in kinds and op.error_inputs_func is not None:
            for case in _error_input_cases(op):
                _judge("error-inputs", case, report)
        supported = op.supported_dtypes("cpu")
        sizes_outs = op.supports_out and ("out-dtype" in kinds or "overlap" in kinds)
        for dtype in (d for d in dtypes if d in supported):
            for sample in _samples(op, dtype, samples):
                result = _cpu_result(op, sample) if sizes_outs else None
                for kind, cases in (("out-dtype", _out_dtype_cases), ("in-place", _in_place_cases),
                                    ("overlap", _overlap_cases)):
                    if kind in kinds:
                        for case in cases(op, sample, result):
                            _judge(kind, case, report)
        if progress is not None:
            progress(op.name)
    return report
