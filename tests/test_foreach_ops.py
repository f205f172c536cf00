"""The _foreach_* ops on npu: one stream task per call over one npu, CPU's results bit for bit, the
composite per tensor for lists on several npus, and scalar lists that do not re-run the Meta kernel
(Note [A foreach op is one launch], Note [Cached output metadata])."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)

import npusim
from npusim.ops import FALLBACK_ROUTES
from npusim.runtime import acl

# _foreach_copy has npusim's own kernels (test_foreach_copy*.py).
FOREACH_OPS = [op for op in (foreach_unary_op_db + foreach_binary_op_db + foreach_pointwise_op_db
                             + foreach_reduce_op_db + foreach_other_op_db) if op.name != "_foreach_copy"]


def _to(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _tasks(device: int = 0) -> int:
    stream = torch.npu.current_stream(device)
    return acl.stream_enqueued(stream.stream_id, stream.device_index)


def _hold_stream(device: int = 0, cycles: int = 10**7) -> None:
    """Keeps the stream busy for ``cycles`` (10**7: 5.6 ms at the default profile's 1800 MHz) so that what
    follows is queued as a task, not done by the host. A test that issues many calls behind one hold asks
    for more: on a loaded 2-core machine a call that found the stream idle again was done by the host,
    so it enqueued and cached nothing."""
    with torch.npu.device(device):
        torch.npu._sleep(cycles)


def _run(fn: Any, sample: Any, device: str) -> tuple[Any, Any]:
    """(inputs after the call, result) of fn on the sample moved to ``device``, or the exception."""
    inputs = _to([t.clone() for t in sample.input], device)
    args, kwargs = _to(sample.args, device), _to(sample.kwargs, device)
    try:
        out = fn(inputs, *args, **kwargs)
    except Exception as e:  # noqa: BLE001  (compared with CPU's below)
        return None, e
    return inputs, out


def _assert_same(npu: Any, cpu: Any, what: str) -> None:
    if isinstance(cpu, torch.Tensor):
        assert isinstance(npu, torch.Tensor) and npu.device.type == "npu", what
        assert npu.dtype == cpu.dtype and npu.shape == cpu.shape, (what, npu.dtype, cpu.dtype)
        assert torch.equal(npu.cpu(), cpu) or (cpu.isnan() == npu.cpu().isnan()).all() and torch.equal(
            npu.cpu().nan_to_num(), cpu.nan_to_num()), what
    elif isinstance(cpu, (list, tuple)):
        assert isinstance(npu, (list, tuple)) and len(npu) == len(cpu), what
        for i, (n, c) in enumerate(zip(npu, cpu, strict=True)):
            _assert_same(n, c, f"{what}[{i}]")
    else:
        assert npu == cpu, what


def test_every_foreach_op_but_copy_takes_the_one_launch_kernel():
    """All 200-odd _foreach_* overloads with a composite are routed to the one-launch kernel."""
    routed = {name for name, route in FALLBACK_ROUTES.items() if route == "foreach"}
    assert {"aten::_foreach_mul_.Scalar", "aten::_foreach_addcdiv_.ScalarList", "aten::_foreach_sqrt",
            "aten::_foreach_norm.Scalar", "aten::_foreach_lerp_.Scalar", "aten::_foreach_add.List_out"} <= routed
    assert len(routed) > 200
    assert not any(name.startswith("aten::_foreach_copy") for name in routed)


@pytest.mark.parametrize("op", FOREACH_OPS, ids=lambda op: op.name)
def test_a_foreach_op_is_one_task_with_cpus_results(op):
    """Each sample of PyTorch's foreach OpInfos (float32, 3 tensors): the functional and the in-place call
    on a busy stream enqueue one task each, and give CPU's values (or CPU's exception type). Under
    NPUSIM_LAUNCH_BLOCKING=1 the held stream is idle again when the call comes, so the host runs the call
    (Note [Work on an idle stream]): no task, the same values."""
    tasks_per_call = 0 if npusim.config.launch_blocking() else 1
    # Under NPUSIM_SMALL_OPS_ON_THE_HOST=0 the samples' own set-up ops are tasks too: the values are checked.
    counted = npusim.config.small_ops_on_the_host()
    variants = [("functional", op.op)] + ([("in-place", op.inplace_variant)] if op.inplace_variant else [])
    checked = 0
    for sample in op.sample_inputs("cpu", torch.float32, num_input_tensors=[3]):
        for kind, fn in variants:
            cpu_inputs, cpu_out = _run(fn, sample, "cpu")
            _hold_stream()
            before = _tasks()
            npu_inputs, npu_out = _run(fn, sample, "npu")
            launched = _tasks() - before
            torch.npu.synchronize()
            what = f"{op.name} {kind} args={sample.args!r:.60} kwargs={sample.kwargs}"
            if isinstance(cpu_out, Exception):
                assert isinstance(npu_out, type(cpu_out)), (what, cpu_out, npu_out)
                continue
            assert launched == tasks_per_call or not counted, (what, launched)
            _assert_same(npu_out, cpu_out, what)
            _assert_same(npu_inputs, cpu_inputs, what + " inputs")
            checked += 1
    assert checked > 0, op.name


@pytest.mark.asynchronous  # counts the tasks a call enqueues
def test_a_list_on_two_npus_runs_each_tensors_op_on_its_own_device():
    """Lists over npu:0 and npu:1 take the composite: a task on each device's stream, right values there."""
    cpu = [torch.randn(64), torch.randn(64)]
    lists = [cpu[0].to("npu:0"), cpu[1].to("npu:1")]
    # An op's first task launch in a process takes milliseconds of one-time set-up (mul: 2.8 ms here): run
    # alone, the call outlasted npu:1's hold and found npu:1's stream idle. A first call behind holds warms it.
    for _ in range(2):
        torch.npu.synchronize(0)
        torch.npu.synchronize(1)
        _hold_stream(0)
        _hold_stream(1)
        before = (_tasks(0), _tasks(1))
        out = torch._foreach_mul(lists, 3.0)
    assert (_tasks(0) - before[0], _tasks(1) - before[1]) == (1, 1)
    assert [t.device for t in out] == [torch.device("npu:0"), torch.device("npu:1")]
    for o, c in zip(out, cpu, strict=True):
        assert torch.equal(o.cpu(), c * 3.0)


def test_foreach_sub_of_bools_is_refused_at_the_call_as_cudas():
    """CUDA's foreach sub kernels check torch.sub's bool rule on the host before they launch: on a busy stream,
    where the call is a task, every variant raises sub's error from the call, and the device stays usable."""
    a = [torch.tensor([True, False], device="npu") for _ in range(3)]
    variants = {
        "Scalar": lambda: torch._foreach_sub(a, 1),
        "Scalar_": lambda: torch._foreach_sub_(a, 1),
        "List": lambda: torch._foreach_sub(a, a),
        "ScalarList": lambda: torch._foreach_sub(a, [1.0, 2.0, 3.0]),
    }
    for name, call in variants.items():
        _hold_stream()
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with .*bool"):
            call()
        torch.npu.synchronize()  # nothing failed on the device
        assert all(t.cpu().tolist() == [True, False] for t in a), name


def test_a_cpu_tensor_in_a_list_is_refused_and_nothing_is_written():
    """A list mixing npu and CPU tensors runs each tensor's op, whose device rule refuses the CPU one."""
    a = [torch.ones(4, device="npu"), torch.ones(4)]
    b = [torch.ones(4, device="npu"), torch.ones(4, device="npu")]
    with pytest.raises(RuntimeError, match="npu|device"):
        torch._foreach_add_(a, b)
    assert torch.equal(a[1], torch.ones(4))


@pytest.mark.asynchronous  # counts the tasks a call enqueues
def test_scalar_lists_of_new_values_reuse_the_cached_output_metadata():
    """An optimizer hands _foreach_addcdiv_ new floats each step: one cached answer serves them all; new
    integer values each get their own."""
    params = [torch.randn(32, device="npu") for _ in range(3)]
    num, den = [torch.randn(32, device="npu") for _ in range(3)], [torch.rand(32, device="npu") + 1 for _ in range(3)]
    # a shape and dtype no other test gives pow, so that no earlier test has cached its plans
    ints = [torch.arange(1, 14, dtype=torch.int32, device="npu").reshape(1, 13) for _ in range(3)]
    expected = [p.cpu() for p in params]
    cpu_num, cpu_den = [t.cpu() for t in num], [t.cpu() for t in den]
    _hold_stream(cycles=10**8)  # every call below is a launch (an idle stream's small work is done by the host)
    before = _tasks()
    torch._foreach_addcdiv_(params, num, den, [0.5, 0.25, 0.125])
    torch._foreach_addcdiv_(expected, cpu_num, cpu_den, [0.5, 0.25, 0.125])
    cached = acl.cached_meta_plans()
    for step in range(5):
        torch._foreach_addcdiv_(params, num, den, [0.1 / (step + 1)] * 3)
        torch._foreach_addcdiv_(expected, cpu_num, cpu_den, [0.1 / (step + 1)] * 3)
    assert acl.cached_meta_plans() == cached
    for exponent in range(1, 4):
        torch._foreach_pow(ints, [exponent] * 3)
    assert acl.cached_meta_plans() == cached + 3
    assert _tasks() - before == 9
    torch.npu.synchronize()
    assert all(torch.equal(p.cpu(), e) for p, e in zip(params, expected, strict=True))


@pytest.mark.asynchronous  # counts the tasks a call enqueues
def test_a_failing_foreach_task_is_reported_at_the_next_synchronize(device_failure):
    """pow's Meta kernel does not check a negative integer exponent, so the launch succeeds and CPU's
    kernel raises on the stream: the next synchronize names the op and the stream, as CUDA reports a
    failed kernel."""
    ints = [torch.arange(1, 5, device="npu") for _ in range(2)]
    _hold_stream()
    torch._foreach_pow(ints, [-1, -1])
    with pytest.raises(RuntimeError, match=r"npu:0 stream 0 \(default\): aten::_foreach_pow.ScalarList failed: "
                                           r"Integers to negative integer powers are not allowed"):
        torch.npu.synchronize()
    with pytest.raises(RuntimeError, match=r"aten::_foreach_pow.ScalarList failed: .*stays failed"):
        torch.npu.synchronize()  # sticky: Note [Sticky device errors]


def test_foreach_adamw_step_is_cpus_bit_for_bit():
    """torch.optim.AdamW (foreach, npu's default) updates the parameters exactly as CPU's foreach step."""
    torch.manual_seed(0)
    cpu_params = [torch.nn.Parameter(torch.randn(s)) for s in ((16, 8), (8,), (4, 16))]
    npu_params = [torch.nn.Parameter(p.detach().to("npu")) for p in cpu_params]
    opts = [torch.optim.AdamW(ps, lr=1e-2, foreach=True) for ps in (cpu_params, npu_params)]
    for _step in range(3):
        grads = [torch.randn_like(p) for p in cpu_params]
        for p, q, g in zip(cpu_params, npu_params, grads, strict=True):
            p.grad, q.grad = g, g.to("npu")
        for opt in opts:
            opt.step()
    for p, q in zip(cpu_params, npu_params, strict=True):
        assert torch.equal(p.detach(), q.detach().cpu())


UNARY_FOREACH_OPS = [op for op in foreach_unary_op_db if op.op is not None and op.name != "_foreach_zero"]


def _has_unary_out(op: Any) -> bool:
    """Whether aten::X.out(Tensor self, *, Tensor(a!) out) exists for _foreach_X."""
    packet = getattr(torch.ops.aten, op.name.removeprefix("_foreach_"), None)
    return packet is not None and "out" in packet.overloads() and len(packet.out._schema.arguments) == 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.int64],
                         ids=str)
def test_a_unary_foreach_op_computes_into_its_outputs_with_cpus_values(dtype):
    """Each unary foreach OpInfo in `dtype` (contiguous and transposed tensors, on a busy stream): a call
    whose results keep their inputs' dtype runs the per-tensor out= op into the outputs allocated at
    launch (Note [A foreach op's results in place]; the route's counter moves once per call); a call that
    changes the dtype (sqrt of integers) takes the composite; both give CPU's values, dtypes and shapes."""
    in_place = 0 if npusim.config.launch_blocking() else 1  # launch blocking: the host runs the call itself
    checked = converted = in_place_ops = 0
    for op in UNARY_FOREACH_OPS:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        for sample in op.sample_inputs("cpu", dtype, num_input_tensors=[3]):
            for layout, inputs in (("contiguous", sample.input),
                                   ("transposed", [t.t() if t.dim() == 2 else t for t in sample.input])):
                try:
                    cpu_out = op.op(inputs)
                except RuntimeError:
                    continue  # an op CPU refuses in this dtype
                npu_inputs = [t.to("npu") for t in inputs]
                _hold_stream()
                runs = acl.foreach_results_in_place_runs()
                npu_out = op.op(npu_inputs)
                torch.npu.synchronize()
                what = f"{op.name} {dtype} {layout}"
                same_dtype = all(c.dtype == t.dtype for c, t in zip(cpu_out, inputs, strict=True))
                expected = in_place if same_dtype and _has_unary_out(op) else 0
                assert acl.foreach_results_in_place_runs() - runs == expected, what
                _assert_same(npu_out, cpu_out, what)
                checked += 1
                converted += not same_dtype
                in_place_ops += expected
    assert checked > 0 and (in_place_ops > 0 or not in_place)
    if dtype == torch.int64:
        assert converted > 0  # sqrt, exp, ... of integers give floats: the composite route was checked too


def test_a_foreach_sqrt_task_reads_inputs_as_they_were_at_launch():
    """The per-tensor route reads the inputs in stream order: inputs the host overwrites after the call do not
    change the results."""
    src = [torch.arange(1, 9, dtype=torch.float32, device="npu") for _ in range(2)]
    _hold_stream()
    out = torch._foreach_sqrt(src)
    for t in src:
        t.fill_(4.0)  # stream-ordered after the sqrt
    torch.npu.synchronize()
    expected = torch.arange(1, 9, dtype=torch.float32).sqrt()
    assert all(torch.equal(o.cpu(), expected) for o in out)
    assert all(torch.equal(t.cpu(), torch.full((8,), 4.0)) for t in src)
