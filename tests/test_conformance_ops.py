"""Differential conformance over PyTorch's OpInfo database: every op, npu against CPU.

A sample-limited sweep of all ops (one dtype per op: float32 where supported,
else the first; the first two samples; forward and backward) runs once, in the
crash-safe worker pool of :mod:`npusim.conformance.sweep`, and each op is then
its own test, so a failure names the op. PyTorch's ``instantiate_device_type_tests``
/ ``ops(op_db)`` is not used: it runs the ops in the pytest process, where one
segfault ends the whole run, and its tests compare against reference functions
rather than against CPU on identical inputs.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from npusim.conformance import compare, judge, sweep
from npusim.conformance.expected_failures import EXPECTED_FAILURES, XFail

SAMPLES = 2
JOBS = int(os.environ.get("NPUSIM_CONFORMANCE_JOBS", "2"))
OP_NAMES = sorted(op.full_name for op in compare.load_op_db())

# A worker whose comparison of `abs` segfaults, as a broken kernel would.
_CRASHING_WORKER = """
import ctypes, sys
from npusim.conformance import compare, worker
real = compare.run_op
def run_op(op, *args, **kwargs):
    for result in real(op, *args, **kwargs):
        if op.full_name == "abs":
            ctypes.string_at(0)
        yield result
compare.run_op = run_op
sys.exit(worker.main(sys.argv[1:]))
"""


def _expectation_tasks() -> list[sweep.Task]:
    """Issue 24's stale or missing expectations, on all their samples: the sparse ops in every CPU dtype,
    linalg.lu_solve complex64, fp16 mish, and chunked linear_cross_entropy in bf16 and fp16 (issue 39: the
    entries name their failing samples); bf16 and fp16 binary_cross_entropy_with_logits, computed in float32 as
    on the chip (issue 43)."""
    ops = compare.ops_by_name()
    tasks = [sweep.Task(name, str(d).removeprefix("torch."), None)
             for name in ("to_sparse", "sparse.mm.reduce", "sparse.sampled_addmm") for d in ops[name].dtypes]
    tasks += [sweep.Task(f"nn.functional.linear_cross_entropy.{variant}", dtype, None)
              for variant in ("chunked", "chunked_none") for dtype in ("bfloat16", "float16")]
    tasks += [sweep.Task("nn.functional.binary_cross_entropy_with_logits", dtype, None)
              for dtype in ("bfloat16", "float16")]
    return [*tasks, sweep.Task("linalg.lu_solve", "complex64", None), sweep.Task("nn.functional.mish", "float16", None)]


@pytest.fixture(scope="module")
def swept() -> judge.Summary:
    """The judged sample-limited sweep of every OpInfo op (about 1-3 minutes on 2 cores), with the tasks of
    _expectation_tasks in the same worker pool."""
    tasks, no_dtype = sweep.plan(None, "first", SAMPLES, backward=True)
    tasks += _expectation_tasks()
    started = time.monotonic()
    results = sweep.run_sweep(tasks, jobs=JOBS)
    summary = judge.judge(results, no_dtype)
    print(f"\nconformance sweep: {len(tasks)} tasks in {time.monotonic() - started:.0f} s on {JOBS} jobs\n"
          + summary.table())
    return summary


@pytest.mark.parametrize("name", OP_NAMES)
def test_op_matches_cpu(swept: judge.Summary, name: str) -> None:
    """The op's first samples give CPU's results, devices, input mutations and gradients on npu."""
    status = swept.ops.get(name, "skip")
    bad = [f"{r.dtype} sample {r.index} {r.phase}: {r.status}: {r.detail}"
           for r in swept.results if r.op == name and r.status in judge.BAD]
    bad += [line for line in swept.xpass if line.startswith(f"{name} ")]
    assert status not in judge.BAD, "\n".join(bad)


def test_every_op_matches_cpu_as_a_stream_task() -> None:
    """With every op a stream task (small samples otherwise run on the host while the stream is idle), each op's
    first sample in its first dtype still gives CPU's results: the outputs planned at launch from the Meta kernel
    fit what the task's CPU kernel returns (batch norm in eval, nn.EmbeddingBag failed their tasks before), and
    the functional ops that run their out= variant compute what their functional kernel does."""
    tasks, no_dtype = sweep.plan(None, "first", 1, backward=True)
    tasks += [sweep.Task("nn.functional.embedding_bag", "float32", None),
              sweep.Task("_native_batch_norm_legit", "bfloat16", None),
              sweep.Task("_batch_norm_with_update", "bfloat16", None),
              sweep.Task("nn.functional.mse_loss", "float32", None),
              sweep.Task("linalg.lu_solve", "complex128", None)]
    summary = judge.judge(sweep.run_sweep(tasks, jobs=JOBS, stream_tasks=True), no_dtype)
    bad = [f"{r.op} {r.dtype} sample {r.index} {r.phase}: {r.status}: {r.detail}"
           for r in summary.results if r.status in judge.BAD]
    assert not bad and not summary.xpass, "\n".join(bad + summary.xpass)


def test_every_expected_failure_names_an_op_and_a_reason() -> None:
    """Each expected-failures entry names an OpInfo op and gives a reason."""
    unknown = sorted(set(EXPECTED_FAILURES) - set(OP_NAMES))
    assert not unknown, f"entries for ops not in op_db: {unknown}"
    entries = [e for v in EXPECTED_FAILURES.values() for e in ((v,) if isinstance(v, XFail) else v)]
    assert entries and all(entry.reason.strip() for entry in entries)


def test_sweep_records_a_crash_and_goes_on() -> None:
    """A worker killed by a signal mid-sample is recorded as crash, and the next task still runs."""
    tasks = [sweep.Task("abs", "float32", 1), sweep.Task("add", "float32", 1)]
    results = sweep.run_sweep(tasks, jobs=1, worker_argv=(sys.executable, "-c", _CRASHING_WORKER))
    by_op = {(r.op, r.phase): r.status for r in results}
    assert by_op[("abs", "forward")] == "crash"
    assert by_op[("add", "forward")] == "pass"


def test_judge_turns_covered_failures_into_xfail_and_stale_entries_into_xpass(monkeypatch) -> None:
    """A covered failure is xfail; a covered op whose samples all pass is xpass, which is bad."""
    monkeypatch.setitem(EXPECTED_FAILURES, "abs", XFail("test entry"))
    fail = compare.SampleResult("abs", "float32", 0, "forward", "error", "boom")
    ok = compare.SampleResult("abs", "float32", 0, "forward", "pass")
    assert judge.judge([fail]).ops["abs"] == "xfail"
    stale = judge.judge([ok])
    assert stale.ops["abs"] == "xpass" and stale.xpass


def test_compare_catches_a_wrong_result_and_an_input_mutation(monkeypatch) -> None:
    """The comparison fails an op whose npu result differs, and one that mutates an input only on npu."""
    op = compare.ops_by_name()["add"]

    def wrong(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return torch.add(x, *args, **kwargs) + (1 if x.device.type == "npu" else 0)

    def mutating(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = torch.add(x, *args, **kwargs)
        if x.device.type == "npu":
            with torch.no_grad():
                x.add_(1)
        return out

    monkeypatch.setattr(op, "op", wrong)
    first = next(compare.run_op(op, torch.float32, max_samples=1))
    assert first.status == "fail" and "output" in first.detail
    monkeypatch.setattr(op, "op", mutating)
    first = next(compare.run_op(op, torch.float32, max_samples=1))
    assert first.status == "fail" and "input after the op" in first.detail


def test_zero_gradient_reads_as_zeros_on_npu() -> None:
    """sgn's gradient on real input (an _efficientzerotensor) is a zero npu tensor, not a null pointer."""
    x = torch.randn(4, 5, device="npu", requires_grad=True)
    (grad,) = torch.autograd.grad(torch.sgn(x), x, torch.ones(4, 5, device="npu"))
    assert grad.device.type == "npu" and grad._is_zerotensor()
    assert torch.equal(grad.cpu(), torch.zeros(4, 5))
    assert torch.equal((grad + 1).cpu(), torch.ones(4, 5))


def test_sparse_result_raises_an_error_naming_the_layout() -> None:
    """An op whose CPU kernel returns a sparse tensor fails on npu with an error naming the op and layout."""
    with pytest.raises(RuntimeError, match=r"aten::_to_sparse.*only the strided layout.*Sparse"):
        torch.randn(3, 3, device="npu").to_sparse()


def test_expected_failures_hold_in_every_dtype(swept: judge.Summary) -> None:
    """Issue 24's stale or missing expectations (_expectation_tasks): the sparse ops error (xfail) in every
    CPU dtype, linalg.lu_solve complex64 and fp16 mish (gradients included) pass, bf16 and fp16 chunked
    linear_cross_entropy and binary_cross_entropy_with_logits differ on exactly the samples their entries name;
    nothing fails, errs or xpasses."""
    tasks = _expectation_tasks()
    pairs = {(t.op, t.dtype) for t in tasks}
    bad = [f"{r.op} {r.dtype} sample {r.index} {r.phase}: {r.status}: {r.detail}"
           for r in swept.results if (r.op, r.dtype) in pairs and r.status in judge.BAD]
    bad += [line for line in swept.xpass if tuple(line.split()[:2]) in pairs]
    assert not bad, "\n".join(bad)
    assert {pair for pair in pairs if swept.pairs[pair] == "xfail"} == {
        (t.op, t.dtype) for t in tasks if t.op not in ("linalg.lu_solve", "nn.functional.mish")}
    assert swept.pairs[("linalg.lu_solve", "complex64")] == swept.pairs[("nn.functional.mish", "float16")] == "pass"
    assert any(r.phase == "backward" and r.status == "pass" for r in swept.results
               if (r.op, r.dtype) == ("nn.functional.mish", "float16"))


def test_an_entry_that_names_no_samples_fails_on_every_sample(swept: judge.Summary) -> None:
    """An expected failure without sample indices covers every sample of its dtypes and phase, so every one
    that ran fails: one that passes would make a sample-limited sweep (`--samples 2`) find the entry stale,
    as the chunked linear_cross_entropy entries were (issue 39). Checked on every sample the sweep ran."""
    passing = [f"{r.op} {r.dtype} sample {r.index} {r.phase}" for r in swept.results if r.status == "pass"
               and (entry := judge.expected_failure(r.op, r.dtype, r.phase, r.index)) is not None
               and entry.samples is None]
    assert not passing, "entries that name no samples, with samples that pass:\n" + "\n".join(passing)
    covered = [r for r in swept.results if r.status == "xfail"
               and judge.expected_failure(r.op, r.dtype, r.phase, r.index).samples is None]
    assert {r.op for r in covered} >= {"to_sparse", "sparse.mm.reduce", "sparse.sampled_addmm"}


def test_chunked_linear_cross_entropy_differs_only_by_pytorchs_device_type_choice() -> None:
    """The chunked linear_cross_entropy's expected failure: PyTorch picks fp32 accumulation for fp16 / bf16
    on cpu and the input dtype on an npu; with CPU's choices given explicitly npu equals CPU bit for bit."""
    import torch.nn.functional as F  # noqa: N812  (the usual name)

    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)
    for dtype in (torch.float16, torch.bfloat16):
        cpu_choice = options._adjust(8, 16, 40, dtype, torch.device("cpu"))
        npu_choice = options._adjust(8, 16, 40, dtype, torch.device("npu"))
        assert (cpu_choice.acc_dtype, cpu_choice.acc_policy) == (torch.float32, "accurate")
        assert (npu_choice.acc_dtype, npu_choice.acc_policy) == (dtype, "compact")
        torch.manual_seed(0)
        x, w, t = torch.randn(8, 16, dtype=dtype), torch.randn(40, 16, dtype=dtype), torch.randint(0, 40, (8,))
        explicit = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2, acc_dtype=torch.float32,
                                                      acc_policy="accurate")
        assert torch.equal(F.linear_cross_entropy(x.npu(), w.npu(), t.npu(), reduction="none", options=explicit).cpu(),
                           F.linear_cross_entropy(x, w, t, reduction="none", options=explicit))


def test_samples_that_keep_their_results_on_cpu_pass() -> None:
    """arange(2) names no device and has no tensor, zeros_like(t, device="cpu"), randint(..., device="cpu") and
    empty_like(t, device="cpu") (uninitialized: sizes compared, not values) ask for cpu even on npu: CPU results
    in both runs pass."""
    ops = compare.ops_by_name()
    for name, start, stop in (("arange", 25, 27), ("zeros_like", 5, 7), ("randint", 10, 14), ("empty_like", 5, 7)):
        results = list(compare.run_op(ops[name], torch.float32, start=start, max_samples=stop, backward=False))
        assert [(r.index, r.status) for r in results] == [(i, "pass") for i in range(start, stop)], name


def test_a_view_of_a_requires_grad_base_is_moved_as_such() -> None:
    """A sample's view made under no_grad of a base that requires grad (istft's window[:8], window.real)
    stays such a view on npu: autograd gives it no gradient there either, as on CPU."""
    base = torch.rand(10, dtype=torch.complex64, requires_grad=True)
    with torch.no_grad():
        views = (base[:8], base.real[:8])
    for view in views:
        moved = compare._Mover()(view)
        assert moved.device.type == "npu" and moved._base is not None and moved.requires_grad and moved.is_leaf
        grads = []
        for w in (view, moved):
            x = torch.ones(8, dtype=w.dtype, device=w.device, requires_grad=True)
            grads.append(torch.autograd.grad((w * x).abs().sum(), [x, w], allow_unused=True))
        assert grads[0][1] is None and grads[1][1] is None
        assert torch.equal(grads[1][0].cpu(), grads[0][0])
