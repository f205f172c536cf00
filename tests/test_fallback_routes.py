"""Structured ops reach the CPU fallback directly: the npu dispatch slot, the unboxed kernels of the
hottest ops, outputs from the caching allocator, the device rules and errors, reused CPU aliases."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (the usual name)

import npusim
from npusim.ops import FALLBACK_ROUTES
from npusim.ops.routes import CUDA_RUNS_THE_COMPOSITE

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
                ("normal", "bernoulli", "uniform", "convolution")]
    assert "random_ops.cpp" in _npu_slot("aten::normal.Tensor_float")
    assert npusim.ops.FALLBACK_ROUTES is FALLBACK_ROUTES
    assert npusim.runtime.acl.route_structured_ops_to_fallback([]) == FALLBACK_ROUTES  # routes once


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
    torch.npu.current_stream().wait_stream(side)  # the read below is on the default stream
    assert torch.allclose(out.cpu(), a.cpu().exp())


def test_out_of_memory_inside_the_cpu_kernel_names_the_npu():
    """An output the CPU kernel cannot get raises the npu's OutOfMemoryError; the device carries on."""
    a = torch.ones(3 << 20, device="npu")  # 12 MiB: the output needs a segment of its own
    torch.npu.synchronize()
    torch.npu.empty_cache()
    torch.npu.set_memory_capacity(torch.npu.memory_reserved() + (1 << 20))
    allocated = torch.npu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError, match=r"NPU out of memory\. Tried to allocate .*\(NPU 0; .*On npu:0"):
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


# ---- CPU's kernel, not the composite (Note [CPU's kernel, not the composite]) ----------------

def _native_functions() -> dict[str, dict[str, str]]:
    """PyTorch's native_functions.yaml (shipped in torchgen), read line by line: op name -> its
    dispatch keys (a structured_delegate's keys and "ufunc" when a ufunc codegen makes the kernels)."""
    import torchgen

    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    entries: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    section = ""
    for line in path.read_text().splitlines():
        if line.startswith("- func:"):
            current = entries.setdefault(line[len("- func:"):].strip().split("(")[0], {})
        elif m := re.match(r"^  (\w+):\s*(.*)$", line):
            section = m.group(1)
            if section == "structured_delegate":
                current["@delegate"] = m.group(2).strip()
            elif section == "ufunc_inner_loop":
                current["CPU"] = current["CUDA"] = "ufunc"
        elif section == "dispatch" and (m := re.match(r"^    ([\w, ]+):\s*(\S+)", line)):
            for key in m.group(1).split(","):
                current[key.strip()] = m.group(2)
    return entries


def _cuda_has_kernel(entries: dict[str, dict[str, str]], name: str) -> bool:
    dispatch = entries[name]
    return "CUDA" in dispatch or ("@delegate" in dispatch and _cuda_has_kernel(entries, dispatch["@delegate"]))


def test_composites_cuda_runs_are_listed_from_native_functions():
    """CUDA_RUNS_THE_COMPOSITE is exactly the aten ops with a CPU kernel and a composite but no CUDA kernel."""
    entries = _native_functions()
    derived = {f"aten::{name}" for name, d in entries.items()
               if "CPU" in d and any(k.startswith("Composite") for k in d) and not _cuda_has_kernel(entries, name)}
    assert derived == set(CUDA_RUNS_THE_COMPOSITE)
    assert not set(CUDA_RUNS_THE_COMPOSITE) & set(FALLBACK_ROUTES)
    for op in CUDA_RUNS_THE_COMPOSITE:  # npu runs the composite, as CUDA does
        assert re.search(r"\[(default backend|math) kernel\]", _npu_slot(op)), _npu_slot(op)


def test_no_composite_stands_in_for_a_cpu_kernel():
    """Every aten op with a CPU kernel whose npu slot holds a composite is one CUDA runs the composite for;
    every other such op (addr, native_group_norm, native_layer_norm, mish_backward, ...) has CPU's kernel."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key  # noqa: SLF001  (the dispatcher's registrations)
    composite = []
    for op in torch._C._dispatch_get_all_op_names():  # noqa: SLF001
        if op.startswith("aten::") and has(op, "CPU") and not has(op, "PrivateUse1"):
            slot = _npu_slot(op)
            if "[default backend kernel]" in slot or "[math kernel]" in slot:
                composite.append(op)
    # A CompositeImplicitAutograd op without an autograd formula keeps its decomposition (it would lose
    # its gradient with a kernel); torch 2.13 has no such op with a CPU kernel.
    no_formula = [op for op in composite if "[math kernel]" in _npu_slot(op) and not has(op, "Autograd")]
    assert sorted(set(composite) - set(no_formula)) == sorted(CUDA_RUNS_THE_COMPOSITE)
    for op in ("aten::addr", "aten::addr.out", "aten::native_group_norm", "aten::native_layer_norm",
               "aten::mse_loss", "aten::mish_backward", "aten::all.dims_out", "aten::linalg__powsum"):
        assert FALLBACK_ROUTES[op] == "boxed" and "fallback_routes.cpp" in _npu_slot(op), op


def test_addr_and_group_norm_in_reduced_precision_are_cpu_kernels():
    """fp16 addr and bf16 group_norm (functional and nn.GroupNorm, forward and backward) equal CPU bit for bit."""
    torch.manual_seed(0)
    m, v1, v2 = (torch.randn(*s, dtype=torch.float16) for s in ((5, 6), (5,), (6,)))
    assert torch.equal(torch.addr(m.npu(), v1.npu(), v2.npu(), beta=0.5, alpha=2).cpu(),
                       torch.addr(m, v1, v2, beta=0.5, alpha=2))
    x = torch.randn(4, 8, 5, 5, dtype=torch.bfloat16)
    norm = torch.nn.GroupNorm(4, 8).to(torch.bfloat16)
    ref = norm(x.requires_grad_())
    ref.float().square().sum().backward()
    xn = x.detach().npu().requires_grad_()
    out = norm.npu()(xn)
    out.float().square().sum().backward()
    assert torch.equal(out.cpu(), ref) and torch.equal(xn.grad.cpu(), x.grad)
    reference = F.group_norm(x.detach().float(), 4)  # fp32: what both approximate
    assert (F.group_norm(xn.detach(), 4).cpu().float() - reference).abs().max() == \
        (F.group_norm(x.detach(), 4).float() - reference).abs().max()


def test_mish_backward_is_cpu_kernel_with_its_autograd_formula():
    """fp16 mish's gradient is CPU's mish_backward kernel; its double backward still works (the formula)."""
    torch.manual_seed(0)
    x = torch.randn(100, dtype=torch.float16, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    assert torch.equal(torch.autograd.grad(F.mish(xn).sum(), xn)[0].cpu(),
                       torch.autograd.grad(F.mish(x).sum(), x)[0])
    y = torch.randn(10, dtype=torch.float64, requires_grad=True)
    yn = y.detach().npu().requires_grad_()
    grads = []
    for t in (y, yn):
        (g,) = torch.autograd.grad(F.mish(t).sum(), t, create_graph=True)
        grads.append(torch.autograd.grad(g.sum(), t)[0].cpu())
    torch.testing.assert_close(grads[1], grads[0])


def test_pixel_shuffle_is_cudas_composite():
    """pixel_shuffle, which CUDA computes with its composite, gives the composite's contiguous result on npu
    (CPU's own kernel keeps channels_last); native_channel_shuffle's decomposition stays differentiable."""
    x = torch.randn(2, 8, 3, 3).to(memory_format=torch.channels_last)
    out = F.pixel_shuffle(x.npu(), 2)
    assert torch.equal(out.cpu(), F.pixel_shuffle(x, 2))
    assert out.is_contiguous() and not F.pixel_shuffle(x, 2).is_contiguous()
    c = torch.randn(1, 4, 2, 2, device="npu", requires_grad=True)
    torch.nn.functional.native_channel_shuffle(c, 2).sum().backward()
    assert torch.equal(c.grad.cpu(), torch.ones(1, 4, 2, 2))


@pytest.mark.parametrize("op", [
    pytest.param(torch.relu, id="relu"),
    pytest.param(lambda x: F.leaky_relu(x, 0.1), id="leaky_relu"),
    pytest.param(lambda x: torch.cat([x, x.neg()]), id="cat"),
    pytest.param(lambda x: x.max(1), id="max.dim"),
    pytest.param(lambda x: x.topk(3), id="topk"),
    pytest.param(lambda x: x.cumsum(0), id="cumsum"),
    pytest.param(torch.nn.functional.hardtanh, id="hardtanh"),
    pytest.param(lambda x: torch.where(x > 0, x, 0.5), id="where"),
    # nn.Embedding's forward: rows of a table by index
    pytest.param(lambda x: x.index_select(0, torch.tensor([5, 0, 255, 5] * 64, device=x.device)), id="index_select"),
])
def test_functional_ops_run_their_out_variant_into_the_outputs(op):  # noqa: ANN001
    """A structured op's functional task (and relu's, hardtanh's, where's, index_select's) runs the op's out=
    variant into the outputs the host allocated, so no result is copied into place, and the values are CPU's
    (Note [A functional op's results in place])."""
    x_cpu = torch.randn(256, 128)  # 32768 elements: above the host-run size, so a stream task
    x = x_cpu.to("npu")
    torch.npu.synchronize()
    copied = npusim.runtime.acl.results_copied_into_place()
    got = op(x)
    torch.npu.synchronize()
    assert npusim.runtime.acl.results_copied_into_place() - copied == 0
    want = op(x_cpu)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                    strict=True):
        assert torch.equal(g.cpu(), w)


def test_out_variants_that_resize_their_output_keep_the_functional_kernel(capfd):  # noqa: ANN001
    """mse_loss.out resizes the output it is given (and warns that this is deprecated): its task keeps the
    functional kernel and copies the result, with no warning and CPU's value."""
    a, b = torch.randn(256, 128), torch.randn(256, 128)
    torch.npu.synchronize()
    copied = npusim.runtime.acl.results_copied_into_place()
    got = F.mse_loss(a.to("npu"), b.to("npu"))
    torch.npu.synchronize()
    assert npusim.runtime.acl.results_copied_into_place() - copied == 1
    assert torch.equal(got.cpu(), F.mse_loss(a, b))
    assert "was resized" not in capfd.readouterr().err


def test_relu_of_bools_keeps_relus_error(device_failure):  # noqa: ANN001
    """relu's task runs clamp_min.out(self, 0), except for a Bool input, which keeps relu's own kernel and so its
    error (clamp_min of Bools would give ones)."""
    x = torch.zeros(1 << 15, dtype=torch.bool, device="npu")
    torch.npu.synchronize()
    torch.relu(x)
    with pytest.raises(RuntimeError, match="aten::relu failed: Boolean inputs not supported for relu"):
        torch.npu.synchronize()
