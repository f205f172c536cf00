"""The host runs add, sub, mul and div with CPU's TensorIterator kernel on the npu tensors themselves
(Note [TensorIterator kernels on npu tensors]): values, strides and errors as CPU's, the output from
the caching allocator, and the fallback for the calls this path does not serve."""

from __future__ import annotations

import pytest
import torch

from npusim.runtime import acl

pytestmark = pytest.mark.small_ops_on_the_host  # the path of small work on an idle stream

BINARY = {
    "add": lambda x, y: x.add(y, alpha=3),
    "sub": lambda x, y: torch.sub(x, y, alpha=2),
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
}
IN_PLACE = {
    "add_": lambda x, y: x.add_(y, alpha=3),
    "sub_": lambda x, y: x.sub_(y),
    "mul_": lambda x, y: x.mul_(y),
    "div_": lambda x, y: x.div_(y),
}


def _runs_of(fn):
    """fn's result and how many calls the iterator kernels ran for it."""
    torch.npu.synchronize()  # an idle stream: small work runs on the host
    before = acl.iterator_kernel_runs()
    out = fn()
    return out, acl.iterator_kernel_runs() - before


# True division of integers promotes to float: the fallback's case (tested below).
@pytest.mark.parametrize(("name", "dtype"), [
    (name, dtype) for name in BINARY
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.complex64)
    if not (name == "div" and dtype == torch.int64)
])
def test_functional_ops_run_cpus_kernel_on_the_npu_tensors(name, dtype):
    """Broadcast operands of one dtype: one iterator-kernel run, CPU's values, dtype and strides."""
    fn = BINARY[name]
    a = (torch.randn(6, 5) * 10).to(dtype)
    b = (torch.randn(5) * 10).to(dtype) + 1 if dtype != torch.int64 else torch.arange(1, 6)
    an, bn = a.to("npu"), b.to("npu")
    out, runs = _runs_of(lambda: fn(an.t(), bn.unsqueeze(1)))
    ref = fn(a.t(), b.unsqueeze(1))
    assert runs == 1
    assert out.device == an.device and out.dtype == ref.dtype and out.stride() == ref.stride()
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", list(IN_PLACE))
def test_in_place_ops_write_their_npu_argument(name):
    """x.op_(y) on a strided view writes the view through CPU's kernel and returns x itself."""
    fn = IN_PLACE[name]
    base = torch.randn(4, 6)
    ref = base.clone()
    xn = base.to("npu")
    y = torch.randn(3) + 2
    view, runs = _runs_of(lambda: fn(xn[:, 1::2], y.to("npu")))
    fn(ref[:, 1::2], y)
    assert runs == 1
    assert view.data_ptr() == xn[:, 1::2].data_ptr()
    torch.testing.assert_close(xn.cpu(), ref, rtol=0, atol=0)


def test_output_is_a_cached_block_of_the_current_stream():
    """The functional output comes from the npu caching allocator, on the current stream, as a kernel's would."""
    a, b = torch.randn(64, device="npu"), torch.randn(64, device="npu")
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        before = torch.npu.memory_allocated()
        out, runs = _runs_of(lambda: a + b)
        assert runs == 1
        assert torch.npu.memory_allocated() == before + 512  # 256 bytes rounded up, as CUDA's allocator does
    segment = next(s for s in torch.npu.memory_snapshot()
                   if s["address"] <= out.data_ptr() < s["address"] + s["total_size"])
    assert segment["stream"] == side.stream_id
    assert torch.equal(out.cpu(), a.cpu() + b.cpu())


@pytest.mark.skipif(torch.npu.device_count() < 2, reason="needs two npus")
def test_an_op_on_another_npu_allocates_there_and_keeps_the_current_device():
    a, b = torch.ones(8, device="npu:1"), torch.full((8,), 2.0, device="npu:1")
    torch.npu.set_device(0)
    out, runs = _runs_of(lambda: a * b)
    assert runs == 1 and out.device == torch.device("npu:1") and torch.npu.current_device() == 0
    assert out.cpu().tolist() == [2.0] * 8


@pytest.mark.parametrize(("fn", "why"), [
    (lambda x, i, d: i / i, "integer true division casts to float"),
    (lambda x, i, d: x + d, "two dtypes"),
    (lambda x, i, d: i * 0.5, "a Python float promotes an integer tensor"),
    (lambda x, i, d: x.add_(i), "an in-place op promoting its other operand"),
])
def test_calls_needing_a_cast_take_the_fallback_with_cpus_values(fn, why):
    x = torch.randn(5)
    i = torch.arange(1, 6)
    d = torch.randn(5, dtype=torch.float64)
    ref = fn(x.clone(), i, d)
    out, runs = _runs_of(lambda: fn(x.to("npu"), i.to("npu"), d.to("npu")))
    assert runs == 0, why
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)


@pytest.mark.parametrize(("dtype", "fn", "runs"), [
    (torch.float32, lambda x: x * 0.1, 1),
    (torch.float32, lambda x: x.mul_(0.1), 1),
    (torch.float64, lambda x: x / 3, 1),
    (torch.int32, lambda x: x + 2, 1),                     # the int64 number cast to int32, as CPU casts it
    (torch.int64, lambda x: x.sub(torch.tensor(3)), 1),    # a 0-dim CPU tensor of the same dtype
    (torch.complex64, lambda x: x * 0.5, 1),
    (torch.float32, lambda x: x + torch.tensor(1.5, dtype=torch.float64), 1),  # a 0-dim double tensor
    # CPU's fp16/bf16 kernels read a scalar operand in float from its uncast original: the fallback's case
    (torch.bfloat16, lambda x: x * 0.1, 0),
    (torch.float16, lambda x: x.add_(0.1), 0),
], ids=["f32-mul", "f32-mul_", "f64-div", "i32-add", "i64-sub-0dim", "c64-mul", "f32-add-0dim-f64",
        "bf16-mul", "f16-add_"])
def test_cpu_scalars_are_cast_as_cpus_iterator_casts_them(dtype, fn, runs):
    """A Python number or 0-dim CPU tensor of the result's dtype runs here after the cast CPU's iterator makes."""
    x = (torch.randn(7) * 5).to(dtype)
    ref = fn(x.clone())
    out, n = _runs_of(lambda: fn(x.to("npu")))
    assert n == runs
    assert out.dtype == ref.dtype and out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)


def test_errors_are_cpus_and_leave_the_destination_untouched():
    """Meta raises before the kernel: broadcast, in-place shape, overlap and bool subtraction errors."""
    x = torch.arange(6.0, device="npu")
    small = torch.ones(3, device="npu")
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        small.add_(x.view(2, 3))
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(6\) must match the size of tensor b \(3\)"):
        x * small
    with pytest.raises(RuntimeError, match="unsupported operation: some elements of the input tensor and the "
                                           "written-to tensor refer to a single memory location"):
        x[1:].add_(x[:-1])
    flags = torch.ones(3, dtype=torch.bool, device="npu")
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with two bool tensors is not supported"):
        flags - flags
    assert small.cpu().tolist() == [1.0] * 3 and x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_conjugate_views_keep_cpus_values():
    """A conjugate bit is resolved before the npu kernel or leaves the call to the fallback: values are CPU's."""
    z = torch.randn(4, dtype=torch.complex64)
    zn = z.to("npu")
    torch.testing.assert_close((zn.conj() * zn).cpu(), z.conj() * z, rtol=0, atol=0)
    torch.testing.assert_close((zn + zn.conj()).cpu(), z + z.conj(), rtol=0, atol=0)


@pytest.mark.asynchronous
def test_on_a_busy_stream_the_op_is_a_stream_task():
    """With work queued the op is enqueued (Note [Compute on the stream]), not run on the host."""
    a, b = torch.randn(64, device="npu"), torch.randn(64, device="npu")
    torch.npu.synchronize()
    torch.npu._sleep(2_000_000)
    before = acl.iterator_kernel_runs()
    out = a + b
    assert acl.iterator_kernel_runs() == before
    assert not torch.npu.current_stream().query()
    assert torch.equal(out.cpu(), a.cpu() + b.cpu())


@pytest.mark.asynchronous
def test_inside_a_backward_pass_small_compute_is_a_stream_task():
    """Autograd's npu thread only launches (Note [No compute on the host in a backward pass]): an add of
    a few elements on an idle stream runs on the host in the forward but is a stream task in the
    backward, with the same values."""
    seen: dict[str, int] = {}

    class AddInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            torch.npu.synchronize()  # an idle stream, as in the forward below
            stream = torch.npu.current_stream()
            runs, tasks = acl.iterator_kernel_runs(), acl.stream_enqueued(stream.stream_id, stream.device_index)
            out = grad + grad
            seen["runs"] = acl.iterator_kernel_runs() - runs
            seen["tasks"] = acl.stream_enqueued(stream.stream_id, stream.device_index) - tasks
            return out

    x = torch.ones(8, device="npu", requires_grad=True)
    _, forward_runs = _runs_of(lambda: x.detach() + x.detach())
    assert forward_runs == 1
    AddInBackward.apply(x).sum().backward()
    assert seen == {"runs": 0, "tasks": 1}
    assert torch.equal(x.grad.cpu(), torch.full((8,), 2.0))
