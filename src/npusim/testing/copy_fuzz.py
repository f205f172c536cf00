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

import npusim
from npusim.ops import trace_foreach_copy

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
    status: str  # "ok", "ok-error" (both raised the same type) or "fail"
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
    pinned = rng.random() < 0.5

    def new_base(device: str, nbytes: int) -> int:
        g = torch.Generator().manual_seed(rng.getrandbits(31))
        data = torch.randint(0, 256, (max(nbytes, 1),), dtype=torch.uint8, generator=g)
        bases.append(Base(device, device == "cpu" and (pinned if uniform else rng.random() < 0.5), data))
        return len(bases) - 1

    def view_on(base: int | None, device: str, dtype: torch.dtype, size: tuple[int, ...], dense: bool) -> View:
        stride, offset = (_contiguous_stride(size), 0) if dense else _layout(rng, size)
        v = View(-1, dtype, size, stride, offset, conj=dtype.is_complex and rng.random() < 0.2)
        nbytes = _extent(v) * dtype.itemsize
        if base is None or bases[base].data.numel() < nbytes:
            base = new_base(device, nbytes + rng.choice((0, 0, 4, 16)))
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
        src = view_on(dst.base if share else None, dev_src, dt_src, src_size, dense)
        pairs.append((dst, src))
    return Case(index, op, tuple(bases), tuple(pairs), rng.random() < 0.5, rng.choice(sorted(npusim.PRESETS)),
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


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]


def check(case: Case) -> Outcome:
    """Runs ``case`` on the npu and on CPU and compares errors and every storage's bytes."""
    _, cpu_dsts, cpu_srcs = cpu_run = _materialize(case, on_npu=False)
    cpu_error = _run(case, cpu_dsts, cpu_srcs)
    routes: tuple[str, ...] = ()
    with ExitStack() as stack:
        stack.enter_context(npusim.use_profile(case.profile))
        stack.enter_context(npusim.ops.foreach_copy_mode(case.mode))
        calls = stack.enter_context(trace_foreach_copy())
        npu_storages, npu_dsts, npu_srcs = _materialize(case, on_npu=True)
        npu_error = _run(case, npu_dsts, npu_srcs)
        try:
            for index in range(torch.npu.device_count()):
                torch.npu.synchronize(index)
        except RuntimeError as exc:  # an asynchronous task failed: a failure of the npu run
            return Outcome(case, "fail", f"asynchronous error: {_first_line(exc)}", routes)
        routes = tuple(r for c in calls for r in c.routes)
    if (cpu_error is None) != (npu_error is None):
        which = "npu raised, cpu did not" if npu_error is not None else "cpu raised, npu did not"
        return Outcome(case, "fail", f"{which}: {_first_line(npu_error or cpu_error)}", routes)  # type: ignore[arg-type]
    if cpu_error is not None and not isinstance(npu_error, type(cpu_error)):
        return Outcome(case, "fail", f"error type: cpu {_first_line(cpu_error)} / npu {_first_line(npu_error)}",
                       routes)  # type: ignore[arg-type]
    for i, (cpu_storage, npu_storage) in enumerate(zip(cpu_run[0], npu_storages, strict=True)):
        if not torch.equal(cpu_storage, npu_storage.cpu()):
            what = "destination" if any(d.base == i for d, _ in case.pairs) else "source"
            state = "after the error" if cpu_error is not None else "after the copy"
            return Outcome(case, "fail", f"base{i} ({what}) bytes differ from cpu {state}", routes)
    if cpu_error is not None:
        return Outcome(case, "ok-error", _first_line(cpu_error), routes)
    return Outcome(case, "ok", "", routes)


# Failures npusim knows about, by the start of their detail line, with the reason (reported to the
# lead, who owns the copy code). The fuzz test fails on any failure not listed here.
KNOWN_FAILURES: dict[str, str] = {}


def known(outcome: Outcome) -> str | None:
    """The reason of a known failure, or None."""
    for prefix, reason in KNOWN_FAILURES.items():
        if outcome.detail.startswith(prefix):
            return reason
    return None


def campaign(seed: int, cases: int, start: int = 0, progress: Any = None) -> list[Outcome]:
    out = []
    for index in range(start, start + cases):
        out.append(check(generate(seed, index)))
        if progress is not None:
            progress(index - start + 1, out[-1])
    return out
