"""Generated ``copy_`` and ``_foreach_copy_`` cases on the npu, checked against the same op on CPU.

A case is drawn from its own ``random.Random(f"{seed}:{index}")``, so any case
is reproduced from (seed, index) alone. It builds one or more base storages
(random bytes, a device each: npu:0, npu:1 or cpu, pinned or pageable) and
views into them with random sizes, strides and offsets (possibly overlapping,
possibly sharing a storage between source and destination), then runs the op
twice: on the npu layout and on an all-CPU copy of it. The results agree when
both raise the same type of error, or neither raises, and afterwards every
base storage holds the same bytes in both runs (destinations, sources and the
bytes around them; so a rejected call must leave the same state as on CPU).
"""

from __future__ import annotations

import random
import warnings
from contextlib import ExitStack
from typing import Any, NamedTuple

import torch

from npusim.ops import foreach_copy_mode, trace_foreach_copy
from npusim.runtime.profiles import PRESETS, use_profile
from npusim.testing.device_failures import clear_device_failures

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64)
DEVICES = ("npu:0", "npu:1", "cpu")
MODES = ("aligned", "legacy")


class Base(NamedTuple):
    device: str
    pinned: bool
    data: torch.Tensor  # the CPU bytes the storage starts with (uint8)


class View(NamedTuple):
    base: int  # index into the case's bases
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # in elements
    conj: bool = False


class Case(NamedTuple):
    index: int
    op: str  # "copy_" or "_foreach_copy_"
    bases: tuple[Base, ...]
    pairs: tuple[tuple[View, View], ...]  # (dst, src)
    non_blocking: bool
    profile: str
    mode: str

    def describe(self) -> str:
        def view(v: View) -> str:
            b = self.bases[v.base]
            where = b.device + (" pinned" if b.pinned else "") if b.device == "cpu" else b.device
            return (f"{str(v.dtype).removeprefix('torch.')}{list(v.size)} stride {list(v.stride)} +{v.offset}"
                    f"{' conj' if v.conj else ''} @base{v.base}({where})")

        pairs = "; ".join(f"{view(d)} <- {view(s)}" for d, s in self.pairs)
        return (f"case {self.index}: {self.op} non_blocking={self.non_blocking} profile={self.profile} "
                f"mode={self.mode}: {pairs}")


class Outcome(NamedTuple):
    case: Case
    status: str  # "ok", "ok-error" (both raised the same type), "fail", "skipped" (a known crash) or
    # "undefined" (an overlapping destination both accepted: its bytes depend on the write order)
    detail: str  # the failure, or the error both raised
    routes: tuple[str, ...]  # _foreach_copy_ routes the npu run took


def _shape(rng: random.Random) -> tuple[int, ...]:
    dims = rng.choice((0, 1, 1, 2, 2, 3))
    return tuple(rng.choice((0, 1, 1, 2, 3, 4, 5, 7)) if rng.random() < 0.9 else rng.randint(8, 40)
                 for _ in range(dims))


def _contiguous_stride(size: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(size):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


def _layout(rng: random.Random, size: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Random strides and offset for ``size``: contiguous, transposed, stepped, expanded or overlapping."""
    stride = list(_contiguous_stride(size))
    kind = rng.random()
    if kind < 0.45:
        pass
    elif kind < 0.6 and len(size) >= 2:
        order = list(range(len(size)))
        rng.shuffle(order)
        acc = 1
        for d in reversed(order):
            stride[d] = acc
            acc *= max(size[d], 1)
    elif kind < 0.75:
        stride = [s * rng.choice((1, 2, 3)) for s in stride]
    elif kind < 0.85 and size:
        stride[rng.randrange(len(size))] = 0  # expanded (a written tensor with it overlaps itself)
    elif size:
        stride = [rng.randint(0, 3) for _ in size]  # anything, overlaps included
    return tuple(stride), rng.choice((0, 0, 0, 1, 3, 8))


def _extent(v: View) -> int:
    if any(n == 0 for n in v.size):
        return v.offset
    return v.offset + 1 + sum((n - 1) * s for n, s in zip(v.size, v.stride, strict=True))


def _broadcastable_to(rng: random.Random, size: tuple[int, ...]) -> tuple[int, ...]:
    """A source shape copy_ accepts for destination ``size`` (and sometimes one it rejects)."""
    r = rng.random()
    if r < 0.7:
        return size
    if r < 0.85:
        cut = rng.randint(0, len(size))
        return tuple(1 if rng.random() < 0.5 else n for n in size[cut:])
    return _shape(rng)  # usually not broadcastable: an error case


def generate(seed: int, index: int) -> Case:
    rng = random.Random(f"{seed}:{index}")
    op = "copy_" if rng.random() < 0.4 else "_foreach_copy_"
    n_pairs = 1 if op == "copy_" else rng.choice((1, 2, 3, 4, 6, 8) if rng.random() < 0.97 else (49, 50, 97))
    bases: list[Base] = []
    pairs: list[tuple[View, View]] = []
    uniform = rng.random() < 0.6  # foreach lists with one shape / dtype / device pattern (fast route candidates)
    dtypes = (rng.choice(DTYPES), rng.choice(DTYPES))
    devices = (rng.choice(DEVICES), rng.choice(DEVICES))
    if uniform and rng.random() < 0.4:  # one dtype on one npu: what the fast route takes
        dtypes, devices = (dtypes[0], dtypes[0]), (rng.choice(DEVICES[:2]),) * 2
    pinned = rng.random() < 0.5

    def new_base(device: str, nbytes: int, dtype: torch.dtype) -> int:
        # Values valid for the dtype (a bool byte is 0 or 1, floats are no NaN payloads), as bytes.
        g = torch.Generator().manual_seed(rng.getrandbits(31))
        count = max(nbytes, 1) // dtype.itemsize + 1
        if dtype == torch.bool:
            values = torch.randint(0, 2, (count,), generator=g).to(torch.bool)
        elif dtype.is_floating_point or dtype.is_complex:
            values = (torch.randn(count, generator=g, dtype=torch.float64) * 50).to(dtype)
        else:
            values = torch.randint(0 if dtype == torch.uint8 else -100, 101, (count,), generator=g).to(dtype)
        data = values.view(torch.uint8)[: max(nbytes, 1)].clone()
        bases.append(Base(device, device == "cpu" and (pinned if uniform else rng.random() < 0.5), data))
        return len(bases) - 1

    def view_on(base: int | None, device: str, dtype: torch.dtype, size: tuple[int, ...], dense: bool) -> View:
        stride, offset = (_contiguous_stride(size), 0) if dense else _layout(rng, size)
        v = View(-1, dtype, size, stride, offset, conj=dtype.is_complex and rng.random() < 0.2)
        nbytes = _extent(v) * dtype.itemsize
        if base is None or bases[base].data.numel() < nbytes:
            base = new_base(device, nbytes + rng.choice((0, 0, 4, 16)), dtype)
        return v._replace(base=base)

    shape = _shape(rng)
    for _ in range(n_pairs):
        size = shape if uniform else _shape(rng)
        dt_dst, dt_src = dtypes if uniform else (rng.choice(DTYPES), rng.choice(DTYPES))
        dev_dst, dev_src = devices if uniform else (rng.choice(DEVICES), rng.choice(DEVICES))
        dense = uniform and rng.random() < 0.7
        dst = view_on(None, dev_dst, dt_dst, size, dense)
        src_size = size if (op == "_foreach_copy_" and uniform) else _broadcastable_to(rng, size)
        share = dev_src == dev_dst and rng.random() < 0.1  # source and destination in one storage
        src = view_on(dst.base if share else None, dev_src, dt_dst if share else dt_src, src_size, dense)
        pairs.append((dst, src))
    return Case(index, op, tuple(bases), tuple(pairs), rng.random() < 0.5, rng.choice(sorted(PRESETS)),
                rng.choice(MODES))


def _materialize(case: Case, on_npu: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    storages = []
    for b in case.bases:
        t = b.data.clone()
        if on_npu and b.device != "cpu":
            t = t.to(b.device)
        elif on_npu and b.pinned:
            t = t.pin_memory()
        storages.append(t)

    def make(v: View) -> torch.Tensor:
        flat = storages[v.base]
        usable = flat.numel() // v.dtype.itemsize
        typed = flat[: usable * v.dtype.itemsize].view(v.dtype)
        t = typed.as_strided(v.size, v.stride, v.offset)
        return t.conj() if v.conj else t

    dsts = [make(d) for d, _ in case.pairs]
    srcs = [make(s) for _, s in case.pairs]
    return storages, dsts, srcs


def _run(case: Case, dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> BaseException | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex -> real copies warn on both sides alike
            if case.op == "copy_":
                dsts[0].copy_(srcs[0], non_blocking=case.non_blocking)
            else:
                torch._foreach_copy_(dsts, srcs, non_blocking=case.non_blocking)
    except Exception as exc:  # noqa: BLE001  (compared with the CPU run's error)
        return exc
    return None


def _synchronize_all() -> BaseException | None:
    """Waits for every npu; the first asynchronous error. A failed device stays failed (Note [Sticky device
    errors]): it is forgotten here, so that the next case starts on working devices, as in a new process."""
    first = None
    for index in range(torch.npu.device_count()):
        try:
            torch.npu.synchronize(index)
        except RuntimeError as exc:
            first = first or exc
    clear_device_failures()
    return first


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:240]


def known_crash(case: Case) -> str | None:
    """Why ``case`` would crash the process (it is then not run), or None. See KNOWN_CRASHES."""
    for name, (_, _, matches) in KNOWN_CRASHES.items():
        if matches(case):
            return name
    return None


# Cases that crash the process, so the campaign skips them (status "skipped"): name -> (reason,
# reproducer, test on the case). The fuzz test checks that each reproducer still crashes, so that
# a fix shows up. Empty since copies from and into conjugate npu views no longer recurse (the copy
# ops fall through the Conjugate and Negative keys).
KNOWN_CRASHES: dict[str, tuple[str, str, Any]] = {}


def _writes_overlap(case: Case) -> bool:
    """Some destination writes one element twice, which copy_ does not always detect: the bytes
    left there then depend on the write order, which no backend defines."""
    for d, _ in case.pairs:
        numel = 1
        for n in d.size:
            numel *= n
        if numel > 1:
            offsets = torch.arange(_extent(d) + 1).as_strided(d.size, d.stride, d.offset)
            if offsets.unique().numel() < numel:
                return True
    return False


def check(case: Case) -> Outcome:
    """Runs ``case`` on the npu and on CPU and compares errors and every storage's bytes."""
    crash = known_crash(case)
    if crash is not None:
        return Outcome(case, "skipped", crash, ())
    _, cpu_dsts, cpu_srcs = cpu_run = _materialize(case, on_npu=False)
    cpu_error = _run(case, cpu_dsts, cpu_srcs)
    routes: tuple[str, ...] = ()
    with ExitStack() as stack:
        stack.enter_context(use_profile(case.profile))
        stack.enter_context(foreach_copy_mode(case.mode))
        calls = stack.enter_context(trace_foreach_copy())
        npu_storages, npu_dsts, npu_srcs = _materialize(case, on_npu=True)
        npu_error = _run(case, npu_dsts, npu_srcs)
        routes = tuple(r for c in calls for r in c.routes)
        late = _synchronize_all()
        if late is not None:  # an asynchronous task failed: a failure of the npu run
            return Outcome(case, "fail", f"asynchronous error: {_first_line(late)}", routes)
    if (cpu_error is None) != (npu_error is None):
        which = "npu raised, cpu did not" if npu_error is not None else "cpu raised, npu did not"
        return Outcome(case, "fail", f"{which}: {_first_line(npu_error or cpu_error)}", routes)  # type: ignore[arg-type]
    if cpu_error is not None and not isinstance(npu_error, type(cpu_error)):
        return Outcome(case, "fail", f"error type: cpu {_first_line(cpu_error)} / npu {_first_line(npu_error)}",
                       routes)  # type: ignore[arg-type]
    for i, (cpu_storage, npu_storage) in enumerate(zip(cpu_run[0], npu_storages, strict=True)):
        if not torch.equal(cpu_storage, npu_storage.cpu()):
            if cpu_error is None and _writes_overlap(case):
                return Outcome(case, "undefined", "a destination writes an element twice (order undefined)", routes)
            what = "destination" if any(d.base == i for d, _ in case.pairs) else "source"
            state = "after the error" if cpu_error is not None else "after the copy"
            return Outcome(case, "fail", f"base{i} ({what}) bytes differ from cpu {state}", routes)
    if cpu_error is not None:
        return Outcome(case, "ok-error", _first_line(cpu_error), routes)
    return Outcome(case, "ok", "", routes)


def _mixed_source_dtypes(case: Case) -> bool:
    return len({s.dtype for _, s in case.pairs}) > 1


# Differences from CPU where npusim is right, each with why: name -> (reason, test on the outcome).
# The fuzz test and `python -m npusim fuzz` fail on any failure not matched here; a bug of npusim is
# fixed, never listed (the late internal-overlap error and the dropped write into a conjugate host
# view, listed here before, were fixed in copy_from).
KNOWN_FAILURES: dict[str, tuple[str, Any]] = {
    "error-leaves-other-pairs-written": (
        "when a _foreach_copy_ call with sources of several dtypes fails, CPU (and CUDA, whose mixed-dtype "
        "lists take the pair-by-pair slow path) have written exactly the pairs before the failing one; "
        "npusim routes as the op-plugin does (docs/SPEC.md 4.1), copying the list group by group by source "
        "dtype, so pairs of an earlier group that come after the failing pair are already written.",
        lambda o: "differ from cpu after the error" in o.detail and o.case.op == "_foreach_copy_"
        and _mixed_source_dtypes(o.case)),
    "fast-route-skips-partial-overlap": (
        "the fast route (launch_foreach_copy, either mode) does not check a destination against a source "
        "that partially overlaps it and copies with memmove, where CPU's _foreach_copy_ raises 'some "
        "elements of the input tensor and the written-to tensor refer to a single memory location'. "
        "CUDA's fast path (multi_tensor_apply) does not check either, and npu follows CUDA.",
        lambda o: o.detail.startswith("cpu raised, npu did not") and "some elements of the input tensor" in o.detail
        and "fast" in o.routes),
}


def known(outcome: Outcome) -> str | None:
    """The name of the known failure ``outcome`` is, or None."""
    for name, (_, matches) in KNOWN_FAILURES.items():
        if matches(outcome):
            return name
    return None


def campaign(seed: int, cases: int, start: int = 0, progress: Any = None) -> list[Outcome]:
    out = []
    for index in range(start, start + cases):
        out.append(check(generate(seed, index)))
        if progress is not None:
            progress(index - start + 1, out[-1])
    return out
