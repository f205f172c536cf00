"""Layout operators on npu: npu_confusion_transpose (+ backward) and the npu format calls (npu_format_cast,
npu_format_cast_, get_npu_format), whose format lives with the storage as torch_npu's does; and a dense block of
the fused operators that compiles with fullgraph=True."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.testing import assert_close

from _fused_util import assert_device_errors, gradcheck, opcheck, randn
from npusim.ops.fused.layout import Format

ops = torch.ops.npu


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int8])
@pytest.mark.parametrize("perm, shape, transpose_first, out_shape",
                         [([0, 2, 1, 3], [2, 4, 18], True, (2, 4, 18)), ([0, 2, 1], [2, 12, 6], False, (2, 6, 12))],
                         ids=["transpose-first", "reshape-first"])
def test_confusion_transpose_is_permute_and_reshape(dtype, perm, shape, transpose_first, out_shape):
    """The docs' examples: permute then reshape, or reshape then permute; the result is a new contiguous tensor."""
    x = (torch.arange(2 * 3 * 4 * 6) % 97).reshape(2, 3, 4, 6).to(dtype)
    y = ops.npu_confusion_transpose(x.npu(), perm, shape, transpose_first)
    ref = x.permute(perm).reshape(shape) if transpose_first else x.reshape(shape).permute(perm)
    assert y.shape == out_shape and y.is_contiguous() and y.dtype == dtype
    assert torch.equal(y.cpu(), ref)


def test_confusion_transpose_backward_and_gradcheck():
    """The backward op undoes the layout change (inverse perm, the input's shape); gradcheck passes in float64."""
    x = randn(2, 3, 4, 6)
    for perm, shape, first in (([0, 2, 1, 3], [2, 4, 18], True), ([0, 2, 1], [2, 12, 6], False)):
        xn = x.npu().requires_grad_()
        y = ops.npu_confusion_transpose(xn, perm, shape, first)
        grad = randn(*y.shape, seed=1)
        y.backward(grad.npu())
        xr = x.clone().requires_grad_()
        (xr.permute(perm).reshape(shape) if first else xr.reshape(shape).permute(perm)).backward(grad)
        assert torch.equal(xn.grad.cpu(), xr.grad)
        gradcheck(lambda t, p=perm, s=shape, f=first: ops.npu_confusion_transpose(t, p, s, f), x)


def test_confusion_transpose_output_does_not_alias_its_input():
    """Even an identity permutation writes a new tensor: the schema declares no alias."""
    x = randn(2, 3).npu()
    y = ops.npu_confusion_transpose(x, [0, 1], [2, 3], True)
    y.add_(1)
    assert torch.equal(x.cpu(), randn(2, 3))


def test_base_formats_follow_the_sizes():
    """A tensor never cast reports torch_npu's base format: NCHW for 4-D, NCDHW for 5-D, ND otherwise."""
    assert ops.get_npu_format(torch.ones(2, 3, 4, 5, device="npu")) == Format.NCHW == 0
    assert ops.get_npu_format(torch.ones(2, 3, 4, 5, 6, device="npu")) == Format.NCDHW
    assert ops.get_npu_format(torch.ones(7, device="npu")) == ops.get_npu_format(torch.ones(2, 3, device="npu")) == 2


def test_format_cast_records_the_format_on_a_new_storage():
    """npu_format_cast returns an equal new tensor whose storage has the format; views, .data and detach() see it,
    a copy_ into it keeps it, and a clone or a round trip through the CPU starts at the base format again."""
    x = torch.rand(2, 3, 4, 5, device="npu")
    nz = ops.npu_format_cast(x, Format.FRACTAL_NZ)
    assert torch.equal(nz, x) and nz.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert ops.get_npu_format(nz) == 29 and ops.get_npu_format(x) == 0
    assert {ops.get_npu_format(v) for v in (nz[0], nz.view(-1), nz.data, nz.detach(), nz.transpose(0, 1))} == {29}
    nz.copy_(torch.zeros_like(nz))
    assert ops.get_npu_format(nz) == 29
    assert ops.get_npu_format(nz.clone()) == 0 and ops.get_npu_format(nz.cpu().npu()) == 0
    assert ops.get_npu_format(ops.npu_format_cast(x, nz)) == 29  # the Tensor overload takes dst's format


def test_deepcopy_keeps_the_format_as_torch_npus_storage_deepcopy_does():
    """copy.deepcopy of a cast tensor (alone, as a view, as a module's buffer, twice in one memo) gives equal values
    in new memory with the source's format, also after the copy's storage object is dropped by Python; a storage
    deep-copies the same way, and one never cast keeps its base format. An nn.Parameter deep-copies through clone()
    (PyTorch's Parameter.__deepcopy__) and, as on torch_npu, comes back in the base format."""
    import copy

    nz = ops.npu_format_cast(torch.rand(3, 3, device="npu"), Format.FRACTAL_NZ)
    twin = copy.deepcopy(nz)
    assert torch.equal(twin, nz) and twin.untyped_storage().data_ptr() != nz.untyped_storage().data_ptr()
    gc.collect()
    assert ops.get_npu_format(twin) == 29
    view, again = copy.deepcopy([nz[1:], nz])  # one memo: the view and the tensor share the copied storage
    assert view.untyped_storage().data_ptr() == again.untyped_storage().data_ptr()
    assert ops.get_npu_format(view) == ops.get_npu_format(again) == 29
    module = torch.nn.Module()
    module.register_buffer("nz", nz)
    assert ops.get_npu_format(copy.deepcopy(module).nz) == 29
    storage = copy.deepcopy(nz.untyped_storage())
    assert ops.get_npu_format(torch.empty(0, device="npu").set_(storage).view(3, 3)) == 29
    assert ops.get_npu_format(copy.deepcopy(torch.ones(2, 3, 4, 5, device="npu"))) == Format.NCHW
    weight = torch.nn.Parameter(ops.npu_format_cast(torch.rand(4, 4, device="npu"), Format.FRACTAL_NZ))
    copied = copy.deepcopy(weight)
    assert type(copied) is torch.nn.Parameter and torch.equal(copied, weight)
    assert ops.get_npu_format(weight) == 29 and ops.get_npu_format(copied) == Format.ND


def test_format_cast_in_place_relabels_every_view():
    """npu_format_cast_ returns self and records the format on its storage, for a parameter too."""
    weight = torch.nn.Parameter(torch.randn(8, 8, device="npu"))
    view = weight.data[2:]
    assert ops.npu_format_cast_(weight, Format.FRACTAL_NZ) is weight
    assert ops.get_npu_format(weight) == ops.get_npu_format(view) == 29
    ops.npu_format_cast_(weight, torch.ones(3, device="npu"))  # the Tensor overload: like src (ND)
    assert ops.get_npu_format(weight) == 2


def test_a_recorded_format_dies_with_its_storage(clean_npu):
    """A freed storage's format is forgotten: new memory at the same address starts at the base format (on a device
    with an empty cache, so that best fit hands the freed block out again rather than an older hole)."""
    x = ops.npu_format_cast(torch.ones(64, 64, device="npu"), Format.FRACTAL_NZ)
    address = x.data_ptr()
    del x
    gc.collect()
    torch.npu.synchronize()  # frees are stream-ordered
    fresh = [torch.empty(64, 64, device="npu") for _ in range(4)]  # the caching allocator hands the block out again
    reused = [t for t in fresh if t.data_ptr() == address]
    assert reused and ops.get_npu_format(reused[0]) == 2


@pytest.mark.parametrize("in_place", [False, True], ids=["npu_format_cast", "npu_format_cast_"])
def test_format_casts_that_land_elsewhere(in_place):
    """torch_npu's test_format_cast sequences: a 4-D NC1HWC0 tensor cast to ND comes back NCHW, other casts record
    the format asked for (5-D NDC1HWC0 -> ND gives ND); a 1-D or 0-D tensor cast to FRACTAL_NZ stays ND with
    torch_npu's warning, for both calls; the Tensor overload follows the same rule."""
    cast = ops.npu_format_cast_ if in_place else ops.npu_format_cast
    t = torch.rand(2, 2, 4, 4, device="npu")
    steps = [(2, 2), (3, 3), (0, 0), (3, 3), (2, 0)] + [(f, f) for f in (0, 2, 0, 4, 0, 29, 0, 2, 4, 0, 2, 29, 0)]
    for target, landed in steps:
        t = cast(t, target)
        assert ops.get_npu_format(t) == landed, (target, landed)
    t = t.view(2, 2, 2, 2, 4).clone()
    for target in (30, 33, 30, 2, 33, 2, 30, 32, 30, 2, 32, 2):
        t = cast(t, target)
        assert ops.get_npu_format(t) == target
    for shape in ((4,), ()):
        with pytest.warns(UserWarning, match="Cannot create tensor with NZ format while dim < 2, tensor will be "
                                             "created with ND format"):
            assert ops.get_npu_format(cast(torch.ones(shape, device="npu"), Format.FRACTAL_NZ)) == Format.ND
    nc1hwc0 = ops.npu_format_cast(torch.rand(2, 2, 4, 4, device="npu"), Format.NC1HWC0)
    assert ops.get_npu_format(ops.npu_format_cast(nc1hwc0, torch.ones(3, device="npu"))) == Format.NCHW


def test_format_cast_passes_gradients_through():
    """npu_format_cast is differentiable (identity gradient), as in torch_npu."""
    x = randn(4, 4).npu().requires_grad_()
    (ops.npu_format_cast(x, Format.FRACTAL_NZ) * 3).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((4, 4), 3.0))


def test_layout_errors_name_the_op_and_argument():
    """Unknown formats, bad perms and devices are refused naming the op."""
    x = randn(2, 3, 4).npu()
    with pytest.raises(RuntimeError, match=r"npu_format_cast: acl_format must be one of torch_npu.Format's values"):
        ops.npu_format_cast(x, 5)
    with pytest.raises(RuntimeError, match=r"npu_confusion_transpose: perm must be a permutation of range\(3\)"):
        ops.npu_confusion_transpose(x, [0, 0, 1], [2, 12], True)
    with pytest.raises(RuntimeError, match="npu_confusion_transpose: cannot reshape to the given perm / shape"):
        ops.npu_confusion_transpose(x, [1, 0], [5, 5], False)
    with pytest.raises(RuntimeError, match="get_npu_format: self must be on an npu device, got cpu"):
        ops.get_npu_format(x.cpu())
    assert_device_errors(ops.npu_format_cast, [x, x], 1, "dst", "npu_format_cast")


def _dense_block(x, norm, cos, sin, mask, w_qkv, w_up, w_out):
    """RMSNorm, rotary embedding, scaled masked softmax attention, a confusion transpose, SwiGLU and GELU."""
    b, s, d = x.shape
    h = ops.npu_rms_norm(x, norm)[0]
    q, k, v = (h @ w_qkv).reshape(b, s, 3, 2, d // 2).unbind(2)  # (B, S, N, D)
    q, k = ops.npu_rotary_mul(q, cos, sin), ops.npu_rotary_mul(k, cos, sin, "interleave")
    scores = torch.einsum("bsnd,btnd->bnst", q, k)
    attn = ops.npu_scaled_masked_softmax(scores, mask, 0.5)
    ctx = ops.npu_confusion_transpose(torch.einsum("bnst,btnd->bnsd", attn, v), [0, 2, 1, 3], [b, s, d], True)
    total = x + ctx
    y = ops.npu_rms_norm(total, norm)[0]
    return total + ops.npu_gelu(ops.npu_swiglu(y @ w_up), approximate="tanh") @ w_out


def test_dense_block_compiles_fullgraph():
    """torch.compile(fullgraph=True) of a block of the norm, rotary, softmax, layout and activation operators equals
    eager, forward and backward (backend aot_eager: the fake kernels and autograd formulas are what it traces)."""
    b, s, d = 2, 32, 8
    inputs = [randn(b, s, d), torch.ones(d), randn(1, s, 1, d // 2, seed=1), randn(1, s, 1, d // 2, seed=2),
              torch.ones(s, s, dtype=torch.bool).triu(1), randn(d, 3 * d, seed=3), randn(d, 4 * d, seed=4),
              randn(2 * d, d, seed=5)]

    def run(block):
        args = [t.npu().requires_grad_() if t.is_floating_point() and i in (0, 5, 6, 7) else t.npu()
                for i, t in enumerate(inputs)]
        out = block(*args)
        out.square().sum().backward()
        return out.detach(), [args[i].grad for i in (0, 5, 6, 7)]

    eager_out, eager_grads = run(_dense_block)
    torch._dynamo.reset()
    compiled_out, compiled_grads = run(torch.compile(_dense_block, fullgraph=True, backend="aot_eager"))
    assert_close(compiled_out, eager_out)
    for got, want in zip(compiled_grads, eager_grads, strict=True):
        assert_close(got, want)


def test_layout_ops_pass_opcheck():
    """PyTorch's opcheck (schema, fake kernel, AOT tracing) of the confusion transpose and the format casts."""
    x = randn(2, 3, 4, 6).npu().requires_grad_()
    opcheck(ops.npu_confusion_transpose, x, [0, 2, 1, 3], [2, 4, 18], True)
    opcheck(ops.npu_confusion_transpose_backward, randn(2, 4, 18).npu(), [0, 2, 1, 3], [2, 3, 4, 6], False)
    opcheck(ops.npu_format_cast.default, x, 29)
    opcheck(ops.npu_format_cast.Tensor, x, x.detach())
    torch.library.opcheck(ops.npu_format_cast_.acl_format, (x.detach().clone(), 29), test_utils=("test_schema",
                                                                                                  "test_faketensor"))
