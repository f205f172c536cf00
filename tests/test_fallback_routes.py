"""Structured ops reach the CPU fallback directly: the npu dispatch slot, the unboxed kernels of the
hottest ops, outputs from the caching allocator, the device rules and errors, reused CPU aliases."""

from __future__ import annotations

import gc

import pytest
import torch

import npusim
from npusim.ops import FALLBACK_ROUTES

MIXED = "Expected all tensors to be on the same device, but found at least two devices"


def _npu_slot(op: str) -> str:
    """The PrivateUse1 line of an op's computed dispatch table."""
    table = torch._C._dispatch_dump_table(op)  # noqa: SLF001  (the dispatcher's own view)
    return next(line for line in table.splitlines() if line.startswith("PrivateUse1:"))


def _segment(address: int) -> dict:
    """The snapshot segment holding ``address``."""
    return next(s for s in torch.npu.memory_snapshot()
                if s["device"] == 0 and s["address"] <= address < s["address"] + s["total_size"])


def _block(address: int) -> dict:
    return next(b for b in _segment(address)["blocks"] if b["address"] == address)


def test_functional_and_inplace_variants_route_to_the_fallback():
    """add.Tensor / add_.Tensor / lerp.Scalar have npusim's kernel in the npu slot, not the generated composite."""
    for op in ("aten::add.Tensor", "aten::add_.Tensor", "aten::lerp.Scalar"):
        slot = _npu_slot(op)
        assert "fallback_routes.cpp" in slot and "[kernel]" in slot, slot
        assert "CompositeExplicitAutogradNonFunctional" not in slot
    assert FALLBACK_ROUTES["aten::add.Tensor"] == "unboxed"
    assert FALLBACK_ROUTES["aten::add_.Tensor"] == "unboxed"
    assert FALLBACK_ROUTES["aten::mm"] == FALLBACK_ROUTES["aten::sum.dim_IntList"] == "unboxed"
    assert FALLBACK_ROUTES["aten::lerp.Scalar"] == "boxed"
    assert "aten::add.out" not in FALLBACK_ROUTES  # out= variants had the backend fallback all along
    assert len(FALLBACK_ROUTES) > 300


def test_ops_with_npu_kernels_keep_them():
    """An op sharing its name with one npusim has an npu kernel for is not routed (the random ops' Philox)."""
    assert not [op for op in FALLBACK_ROUTES if op.split("::")[1].split(".")[0].rstrip("_") in
                ("normal", "bernoulli", "uniform", "native_layer_norm", "mse_loss", "convolution")]
    assert "random_ops.cpp" in _npu_slot("aten::normal.Tensor_float")
    assert npusim.ops.FALLBACK_ROUTES is FALLBACK_ROUTES
    assert npusim.runtime.acl.route_structured_ops_to_fallback() == FALLBACK_ROUTES  # idempotent


def test_functional_output_comes_from_the_caching_allocator():
    """a + b allocates a rounded, cached npu block on the current stream, as a device kernel's output would."""
    gc.collect()  # earlier tests' tracebacks hold tensors in cycles; freeing them mid-test would skew the count
    a, b = torch.randn(64, device="npu"), torch.randn(64, device="npu")
    torch.npu.synchronize()
    torch.npu.empty_cache()  # no older cached block of this size to be handed out first
    before, segments = torch.npu.memory_allocated(), torch.npu.memory_stats()["num_device_alloc"]
    c = a + b
    assert torch.npu.memory_allocated() == before + 512  # 256 bytes rounded up, as CUDA's allocator does
    segment = _segment(c.data_ptr())
    assert not segment["adopted"] and _block(c.data_ptr())["state"] == "active_allocated"
    assert segment["stream"] == torch.npu.current_stream().stream_id
    address, reserved = c.data_ptr(), torch.npu.memory_reserved()
    del c
    assert torch.npu.memory_allocated() == before and torch.npu.memory_reserved() == reserved  # cached
    d = a * b
    assert d.data_ptr() == address  # the cached block serves the next output of its size and stream
    assert torch.npu.memory_stats()["num_device_alloc"] <= segments + 1
    assert torch.equal(d.cpu(), a.cpu() * b.cpu())


def test_output_on_a_side_stream_is_allocated_on_it():
    """A functional op under torch.npu.stream(s) allocates its output on s."""
    a = torch.randn(1000, device="npu")
    side = torch.npu.Stream()
    torch.npu.synchronize()
    with torch.npu.stream(side):
        out = a.exp()
    assert _segment(out.data_ptr())["stream"] == side.stream_id
    assert torch.allclose(out.cpu(), a.cpu().exp())


def test_out_of_memory_inside_the_cpu_kernel_names_the_npu():
    """An output the CPU kernel cannot get raises the npu's OutOfMemoryError; the device carries on."""
    a = torch.ones(3 << 20, device="npu")  # 12 MiB: the output needs a segment of its own
    torch.npu.synchronize()
    torch.npu.empty_cache()
    torch.npu.set_memory_capacity(torch.npu.memory_reserved() + (1 << 20))
    allocated = torch.npu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory on npu:0"):
        a + 1
    assert torch.npu.memory_allocated() == allocated
    torch.npu.set_memory_capacity(None)
    assert (a + 1).sum().item() == 2 * (3 << 20)


@pytest.mark.parametrize(("call", "op"), [
    (lambda n, c: n + c, "aten::add.Tensor"),
    (lambda n, c: n.add_(c), "aten::add_.Tensor"),
    (lambda n, c: torch.lerp(n, c, 0.5), "aten::lerp.Scalar"),
], ids=["unboxed", "unboxed-inplace", "boxed"])
def test_mixed_devices_raise_cuda_error_naming_the_op(call, op):
    """A CPU tensor with dimensions in a routed op raises before the kernel runs, naming devices and op."""
    n, c = torch.ones(3, device="npu"), torch.ones(3)
    with pytest.raises(RuntimeError, match=f"{MIXED}, npu:0 and cpu! \\(when running {op}\\)"):
        call(n, c)
    assert n.cpu().eq(1).all() and c.eq(1).all()


def test_shape_errors_are_cpu_kernels_own():
    """Broadcast failures keep PyTorch's message (the CPU meta function's, as the composite kernel ran)."""
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(3\) must match the size of tensor b \(4\)"):
        torch.ones(3, device="npu") + torch.ones(4, device="npu")


def test_reused_cpu_aliases_follow_each_argument():
    """One thread's run of ops over changing shapes, dtypes, views, conj bits and shared storages matches CPU."""
    base = torch.arange(24.0).reshape(4, 6)
    x = base.to("npu")
    checks = [
        (lambda t: t + t, base),                          # one storage, two arguments
        (lambda t: t[:, ::2] * t[:, 1::2], base),           # two strided views of one storage
        (lambda t: t.t().sum(dim=0), base),                 # transposed
        (lambda t: t[1:3].exp(), base),                     # offset
        (lambda t: t.to(torch.int64) + 1, base),            # another dtype
        (lambda t: (t[0] + 1j * t[1]).conj() * 2, base),    # conjugate view of a complex result
        (lambda t: t.sum() + t[0, 0], base),                # 0-dim npu tensors
        (lambda t: torch.mm(t.to(torch.bfloat16), t.t().to(torch.bfloat16)).float(), base),  # oneDNN bf16
    ]
    for _ in range(2):  # the second round runs on reused aliases
        for fn, ref in checks:
            assert torch.equal(fn(x).cpu(), fn(ref)), fn
    y = x.clone()
    y[:, 1::2].mul_(10)  # in place on a view
    ref = base.clone()
    ref[:, 1::2].mul_(10)
    assert torch.equal(y.cpu(), ref)


def test_routed_ops_are_captured_by_npu_graphs():
    """Under capture an unboxed routed op is recorded, not run, and replays on new input values."""
    a, b = torch.ones(8, device="npu"), torch.ones(8, device="npu")
    graph = torch.npu.NPUGraph()
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        graph.capture_begin()
        out = a.add(b, alpha=2)
        graph.capture_end()
    assert out.device.type == "npu"
    a.fill_(5.0)
    graph.replay()
    torch.npu.synchronize()
    assert out.cpu().tolist() == [7.0] * 8
