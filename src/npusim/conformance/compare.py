"""Runs one OpInfo op's sample inputs on npu and on CPU, in this process, and compares them.

See Note [Differential conformance] for what one sample's check is. This module
knows nothing about subprocesses or expected failures: :mod:`npusim.conformance.sweep`
runs it crash-safely and :mod:`npusim.conformance.expected_failures` judges it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from npusim._device import clear_device_failures

__all__ = ["SampleResult", "dtype_from_name", "load_op_db", "ops_by_name", "run_op", "sample_count"]

# Note [Differential conformance]
# One sample of one OpInfo op, one dtype, is checked the way PyTorch's own
# test_ops.py `test_compare_cpu` checks a device against CPU, plus what that
# test leaves to others:
# - the sample is generated on CPU (seeded per sample by OpInfo) and copied to
#   npu with the same sizes, strides, storage offsets and aliasing, so both
#   runs see bit-identical inputs (generating on npu would draw different
#   random numbers);
# - forward: both results, after the sample's output_process_fn_grad (as
#   test_compare_cpu does), must agree by `torch.testing.assert_close` with its
#   default per-dtype tolerances (equal_nan), structure and dtype included, and
#   every npu result must be on npu;
# - inputs: afterwards the npu inputs must equal the CPU inputs: an op that
#   mutates nothing on CPU mutates nothing on npu, an in-place op mutates the
#   same way;
# - backward (op.supports_autograd and a backward dtype): gradients of every
#   differentiable output, with the same seeded cotangents, with respect to
#   every input that requires grad, must agree the same way;
# - a CPU exception makes the sample "skip" (the sample is not valid on CPU),
#   an npu-only exception "error";
# - OpInfo's random ops (wrapped in wrapper_set_seed) draw from npu's Philox
#   generator on npu and from mt19937 on CPU: their values are not compared
#   with CPU's, only sizes, dtypes and devices, and npu must give the same
#   values twice under the same seed;
# - other random ops: when the results differ, CPU is run again with another seed;
#   if CPU disagrees with itself the op is random and only sizes, dtypes and
#   devices are compared (seeded equality needs the Philox generator: see the
#   random numbers issue). Such samples pass with detail "random". So do
#   samples of ops whose OpInfo skips test_compare_cpu itself (empty_like and
#   other ops with uninitialized or non-deterministic outputs) when they differ.

# Note [Sample placement]
# A sample function may keep some tensors on CPU whatever the device (the
# sections of tensor_split, which CUDA requires on CPU too) and may name the
# device in its arguments (`to(device)`, factories' `device=`). So each sample
# is generated twice with the same seed: on CPU for its values and on npu for
# its placement. A tensor whose npu twin is on CPU stays on CPU; a device
# argument is taken from the twin. Where the twin cannot be generated or its
# structure differs, every tensor goes to npu and `device="cpu"` becomes npu.
# A sample with neither a tensor nor a device argument (a factory such as
# arange(2)) and one whose twin names cpu as a device (zeros_like(t,
# device="cpu"), randint(..., device="cpu")) make CPU tensors in both runs:
# their results are not required on npu, in the full comparison and in the
# sizes-only one of results whose values are not compared (uninitialized or
# random: empty_like(t, device="cpu")).

NPU = torch.device("npu", 0)
_MAX_DETAIL = 300
_COTANGENT_SEED = 1234
_RANDOM = "random: sizes/dtypes/devices only"


@dataclass
class SampleResult:
    """The outcome of one phase (forward or backward) of one sample."""

    op: str
    dtype: str
    index: int
    phase: str  # "forward" | "backward"
    status: str  # pass | fail | error | skip (crash is set by the sweep, xfail/xpass by the judge)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database (imports it on first use: about 5 s)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def ops_by_name() -> dict[str, Any]:
    """OpInfo entries keyed by full name (``name`` or ``name.variant``)."""
    return {op.full_name: op for op in load_op_db()}


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"conformance: {name!r} is not a torch dtype")
    return dtype


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    first = text[0] if text else type(exc).__name__
    # assert_close puts the useful line after its header
    extra = " | ".join(line.strip() for line in text[1:4] if line.strip())
    out = f"{first} | {extra}" if extra else first
    return out[:_MAX_DETAIL]


# ---- moving a sample to npu -------------------------------------------------

class _Mover:
    """Copies CPU tensors to npu exactly: same storage layout, shared storages stay shared."""

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}
        self._storages: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        if key not in self._tensors:
            view = self._view_of_moved_base(t)
            self._tensors[key] = view if view is not None else self._move(t)
        return self._tensors[key]

    def _view_of_moved_base(self, t: torch.Tensor) -> torch.Tensor | None:
        """A view of a base that requires grad stays a view of the moved base, made the same way.

        A view made under no_grad (OpInfo makes istft's window[:8] so) has no grad_fn and inherits
        requires_grad from its base, and autograd gives it no gradient; a fresh leaf would get one."""
        base = t._base
        if base is None or not base.requires_grad or t.layout != torch.strided or t.is_conj() or t.is_neg():
            return None
        moved_base = self(base)
        try:
            with torch.set_grad_enabled(t.grad_fn is not None):  # a view made under no_grad is a leaf view
                typed = moved_base
                if moved_base.is_complex() and not t.is_complex():
                    typed = torch.view_as_real(moved_base)  # .real / .imag of a complex base
                if typed.dtype != t.dtype:
                    return None  # not a view autograd follows: moved as a tensor of its own
                moved = typed.as_strided(t.size(), t.stride(), t.storage_offset())
        except RuntimeError:
            return None  # a layout view_as_real does not allow: moved as a tensor of its own
        return moved

    def _move(self, t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if t.layout != torch.strided or t.is_quantized or t.is_nested:
                moved = t.detach().to(NPU)
            elif t.is_conj():
                moved = self._move(t.conj()).conj()
            elif t.is_neg():
                moved = self._move(t._neg_view())._neg_view()
            else:
                storage = t.untyped_storage()
                skey = (storage.data_ptr(), t.dtype)
                flat = self._storages.get(skey)
                if flat is None or storage.data_ptr() == 0:
                    n = storage.nbytes() // t.element_size()
                    cpu_flat = torch.empty(0, dtype=t.dtype).set_(storage, 0, (n,), (1,))
                    flat = cpu_flat.to(NPU)
                    self._storages[skey] = flat
                moved = flat.as_strided(t.size(), t.stride(), t.storage_offset())
        moved = moved.detach()
        if t.requires_grad:
            moved.requires_grad_(True)
        return moved


class _Cloner:
    """Deep copy of a sample's tensors (identity preserved), keeping requires_grad."""

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        if key not in self._tensors:
            with torch.no_grad():
                c = t.detach().clone()
            self._tensors[key] = c.requires_grad_(t.requires_grad)
        return self._tensors[key]


def _is_device_like(value: Any) -> bool:
    return isinstance(value, torch.device) or (isinstance(value, str) and value.split(":")[0] in ("npu", "cpu"))


def _place_sample(sample: Any, twin: Any | None, move: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """The npu copy of the CPU ``sample``: see Note [Sample placement]."""
    from torch.testing._internal.opinfo.core import SampleInput

    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    twin_leaves: list[Any] | None = None
    if twin is not None:
        t_leaves, t_spec = tree_flatten((twin.input, twin.args, twin.kwargs))
        if t_spec == spec:
            twin_leaves = t_leaves
    placed = []
    for i, value in enumerate(leaves):
        other = twin_leaves[i] if twin_leaves is not None else None
        if isinstance(value, torch.Tensor):
            on_cpu = isinstance(other, torch.Tensor) and other.device.type == "cpu"
            placed.append(value if on_cpu else move(value))
        elif twin_leaves is not None and _is_device_like(other):
            placed.append(other)
        elif twin_leaves is None and _is_device_like(value) and torch.device(value).type == "cpu":
            placed.append(NPU)
        else:
            placed.append(value)
    inp, args, kwargs = tree_unflatten(placed, spec)
    return SampleInput(inp, args=tuple(args), kwargs=dict(kwargs), output_process_fn_grad=sample.output_process_fn_grad,
                       broadcasts_input=sample.broadcasts_input, name=sample.name)


def _clone_sample(sample: Any) -> Any:
    from torch.testing._internal.opinfo.core import SampleInput

    clone = _Cloner()
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    inp, args, kwargs = tree_unflatten([clone(v) if isinstance(v, torch.Tensor) else v for v in leaves], spec)
    return SampleInput(inp, args=tuple(args), kwargs=dict(kwargs), output_process_fn_grad=sample.output_process_fn_grad,
                       broadcasts_input=sample.broadcasts_input, name=sample.name)


def _results_belong_on_npu(sample: Any) -> bool:
    """Whether the placed sample's results must be on npu: it puts something on npu (a tensor or a
    device argument) and names no cpu device (zeros_like(t, device="cpu"), which OpInfo keeps so)."""
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    devices = [torch.device(v).type for v in leaves if not isinstance(v, torch.Tensor) and _is_device_like(v)]
    tensors = [v.device.type for v in leaves if isinstance(v, torch.Tensor)]
    return "cpu" not in devices and "npu" in devices + tensors


def _sample_tensors(sample: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [t for t in leaves if isinstance(t, torch.Tensor)]


# ---- comparing ----------------------------------------------------------------

def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values on CPU. Conjugate and negative bits are read back as bits
    (copying the plain data, then setting the bit on CPU): the sweep checks the
    ops, while npu's copy of such views is checked by its own tests."""
    t = t.detach()
    if t.device.type == "cpu":
        return t
    if t.is_conj():
        return _to_cpu(t.conj()).conj().resolve_conj()
    if t.is_neg():
        return _to_cpu(t._neg_view())._neg_view().resolve_neg()
    return t.cpu()


def _compare(npu_value: Any, cpu_value: Any, what: str, *, values: bool = True, devices: bool = True) -> str | None:
    """None when equal under assert_close's rules, else the first difference."""
    npu_leaves, npu_spec = tree_flatten(npu_value)
    cpu_leaves, cpu_spec = tree_flatten(cpu_value)
    if npu_spec != cpu_spec:
        return f"{what}: structure differs: npu {npu_spec} vs cpu {cpu_spec}"[:_MAX_DETAIL]
    for i, (n, c) in enumerate(zip(npu_leaves, cpu_leaves, strict=True)):
        where = f"{what}[{i}]"
        if isinstance(c, torch.Tensor):
            if not isinstance(n, torch.Tensor):
                return f"{where}: npu gave {type(n).__name__}, cpu a tensor"
            if devices and c.device.type == "cpu" and n.device.type != "npu":
                return f"{where}: result on {n.device}, expected npu"
            n_cpu = _to_cpu(n)
            if not values:
                if (n_cpu.shape, n_cpu.dtype, n_cpu.layout) != (c.shape, c.dtype, c.layout):
                    return f"{where}: npu {n_cpu.dtype}{list(n_cpu.shape)} vs cpu {c.dtype}{list(c.shape)}"
                continue
            try:
                torch.testing.assert_close(n_cpu, c.detach(), equal_nan=True)
            except AssertionError as exc:
                return f"{where}: " + _short(exc)
        elif isinstance(c, (int, float, complex, bool)) and values:
            try:
                torch.testing.assert_close(n, c, equal_nan=True)
            except (AssertionError, TypeError) as exc:
                return f"{where}: " + _short(exc)
        elif values and not isinstance(c, (torch.Tensor, float)) and n != c:
            return f"{where}: npu {n!r} vs cpu {c!r}"[:_MAX_DETAIL]
    return None


def _call(op: Any, sample: Any, seed: int) -> Any:
    torch.manual_seed(seed)
    return op(sample.input, *sample.args, **sample.kwargs)


def _differentiable(value: Any) -> list[int]:
    leaves, _ = tree_flatten(value)
    return [i for i, t in enumerate(leaves)
            if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _cotangents(cpu_outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(_COTANGENT_SEED)
    return [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in cpu_outputs]


# ---- one sample ---------------------------------------------------------------

def draws_random_numbers(op: Any) -> bool:
    """True for OpInfo's random ops: their callables seed the generator themselves (wrapper_set_seed)."""
    code = getattr(getattr(op, "op", None), "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def values_not_comparable(op: Any, dtype: torch.dtype) -> str | None:
    """OpInfo's own reason when it skips test_compare_cpu for this op and dtype (uninitialized
    or non-deterministic outputs), else None."""
    for info in op.decorators:
        if (getattr(info, "cls_name", None) == "TestCommon" and getattr(info, "test_name", None) == "test_compare_cpu"
                and info.device_type in (None, "npu", "privateuse1") and (info.dtypes is None or dtype in info.dtypes)):
            for deco in info.decorators:
                if getattr(deco, "__qualname__", "").startswith("skip."):
                    cells = [c.cell_contents for c in (deco.__closure__ or ())]
                    return next((c for c in cells if isinstance(c, str)), "skipped")
    return None


def _check_sample_on_working_devices(op: Any, sample: Any, twin: Any | None, dtype: torch.dtype, index: int,
                                     backward: bool) -> list[SampleResult]:
    """_check_sample, then the devices made working again: an asynchronous failure is sticky (Note [Sticky device
    errors]), and the next sample must not inherit it. A failure that no phase reported is this sample's error."""
    results = _check_sample(op, sample, twin, dtype, index, backward)
    failures = clear_device_failures()
    if failures and not any(r.status == "error" for r in results):
        detail = "an asynchronous failure no phase reported: " + "; ".join(failures.values())
        results.append(SampleResult(op.full_name, str(dtype).removeprefix("torch."), index, "forward", "error",
                                    detail[:_MAX_DETAIL]))
    return results


def _check_sample(op: Any, sample: Any, twin: Any | None, dtype: torch.dtype, index: int,
                  backward: bool) -> list[SampleResult]:
    name, dname = op.full_name, str(dtype).removeprefix("torch.")

    def result(phase: str, status: str, detail: str = "") -> SampleResult:
        return SampleResult(name, dname, index, phase, status, detail[:_MAX_DETAIL])

    pristine = _clone_sample(sample)  # for a second CPU run (random probe)
    try:
        npu_sample = _place_sample(sample, twin, _Mover())
    except Exception as exc:  # noqa: BLE001  (the op's inputs cannot reach npu: the op errs on npu)
        return [result("forward", "error", "moving the sample to npu: " + _short(exc))]
    try:
        cpu_out = _call(op, sample, 0)
    except Exception as exc:  # noqa: BLE001
        return [result("forward", "skip", "cpu raised: " + _short(exc))]
    try:
        npu_out = _call(op, npu_sample, 0)
        torch.npu.synchronize()
    except Exception as exc:  # noqa: BLE001
        return [result("forward", "error", _short(exc))]

    cpu_p = sample.output_process_fn_grad(cpu_out)
    npu_p = npu_sample.output_process_fn_grad(npu_out)
    random = False
    # A factory sample that names no device and has no tensor (arange(2)), or one that asks for cpu
    # (randint(..., device="cpu")), makes CPU tensors on npu's run too: Note [Sample placement].
    on_npu = _results_belong_on_npu(npu_sample)
    diff = _compare(npu_p, cpu_p, "output", devices=on_npu)
    uncomparable = values_not_comparable(op, dtype)
    # Sizes, dtypes and devices agree (the same placement rule as the full comparison above).
    same_shapes = diff is not None and _compare(npu_p, cpu_p, "output", values=False, devices=on_npu) is None
    if same_shapes and uncomparable is not None:
        random = True  # OpInfo itself does not compare these values with CPU's
    elif same_shapes and draws_random_numbers(op):
        # npu draws from its Philox generator, CPU from mt19937: the values differ by design.
        # What must hold is npu's own reproducibility under the same seed.
        def to_cpu(tree: Any) -> Any:
            return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, tree)

        npu_again = npu_sample.output_process_fn_grad(_call(op, npu_sample, 0))
        diff = _compare(to_cpu(npu_again), to_cpu(npu_p), "output (npu, same seed twice)", devices=False)
        random = diff is None
        if not random:
            return [result("forward", "fail", diff)]
    elif same_shapes:
        try:
            again = sample.output_process_fn_grad(_call(op, pristine, 1))
            random = _compare(again, cpu_p, "output", devices=False) is not None
        except Exception:  # noqa: BLE001
            random = False
    if random:
        diff = None
    if diff is None:
        diff = _compare(_sample_tensors(npu_sample),
                        _sample_tensors(sample), "input after the op", values=not random,
                        devices=False)
    out = [result("forward", "fail" if diff else "pass", diff or (_RANDOM if random else ""))]

    if not backward or diff:
        return out
    cpu_idx, npu_idx = _differentiable(cpu_p), _differentiable(npu_p)
    cpu_inputs = [t for t in _sample_tensors(sample) if t.requires_grad]
    npu_inputs = [t for t in _sample_tensors(npu_sample) if t.requires_grad]
    if not cpu_idx or not cpu_inputs:
        return out
    if cpu_idx != npu_idx:
        out.append(result("backward", "fail", f"differentiable outputs differ: npu {npu_idx} vs cpu {cpu_idx}"))
        return out
    cpu_leaves, npu_leaves = tree_flatten(cpu_p)[0], tree_flatten(npu_p)[0]
    cpu_outs = [cpu_leaves[i] for i in cpu_idx]
    npu_outs = [npu_leaves[i] for i in npu_idx]
    cots = _cotangents(cpu_outs)
    try:
        cpu_grads = torch.autograd.grad(cpu_outs, cpu_inputs, cots, allow_unused=True)
    except Exception as exc:  # noqa: BLE001
        out.append(result("backward", "skip", "cpu raised: " + _short(exc)))
        return out
    try:
        npu_grads = torch.autograd.grad(npu_outs, npu_inputs, [c.to(NPU) for c in cots], allow_unused=True)
        torch.npu.synchronize()
    except Exception as exc:  # noqa: BLE001
        out.append(result("backward", "error", _short(exc)))
        return out
    gdiff = _compare(list(npu_grads), list(cpu_grads), "grad", values=not random)
    out.append(result("backward", "fail" if gdiff else "pass", gdiff or (_RANDOM if random else "")))
    return out


def _samples(op: Any, dtype: torch.dtype, requires_grad: bool, device: str = "cpu") -> Iterator[Any]:
    return iter(op.sample_inputs(device, dtype, requires_grad=requires_grad))


def _twins(op: Any, dtype: torch.dtype, requires_grad: bool) -> Iterator[Any | None]:
    """The same samples generated for npu (for their placement only); None where that fails."""
    try:
        yield from _samples(op, dtype, requires_grad, "npu")
    except Exception:  # noqa: BLE001  (placement then falls back to "every tensor on npu")
        pass
    while True:
        yield None


def wants_backward(op: Any, dtype: torch.dtype) -> bool:
    """Whether the op's gradients are compared for this dtype (OpInfo's CPU backward dtypes)."""
    return bool(op.supports_autograd) and dtype in op.supported_backward_dtypes("cpu")


def sample_count(op: Any, dtype: torch.dtype) -> int:
    return sum(1 for _ in _samples(op, dtype, False))


def run_op(op: Any, dtype: torch.dtype, *, start: int = 0, max_samples: int | None = None,
           backward: bool = True, on_sample: Callable[[int], None] | None = None) -> Iterator[SampleResult]:
    """Checks samples ``start .. max_samples-1`` of ``op`` for ``dtype``; yields each phase's result.

    ``on_sample(i)`` is called before sample ``i`` runs (the sweep uses it to know
    which sample a crash killed).
    """
    grad = backward and wants_backward(op, dtype)
    try:
        samples = zip(_samples(op, dtype, grad), _twins(op, dtype, grad), strict=False)
        for index, (sample, twin) in enumerate(itertools.islice(samples, max_samples)):
            if index < start:
                continue
            if on_sample is not None:
                on_sample(index)
            yield from _check_sample_on_working_devices(op, sample, twin, dtype, index, grad)
    except Exception as exc:  # noqa: BLE001  (a sample generator that fails on CPU)
        yield SampleResult(op.full_name, str(dtype).removeprefix("torch."), -1, "forward", "skip",
                           "sample generation raised: " + _short(exc))
