"""op-plugin's rotary position embedding operators on npu (npu_rotary_mul, npu_apply_rotary_pos_emb) against the
documented formula x * cos + rotate(x) * sin, in every rotary mode and layout."""

from __future__ import annotations

import pytest
import torch

from _fused_util import DTYPES, assert_device_errors, assert_matches, gradcheck, opcheck, randn

ops = torch.ops.npu


def _rotate(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The docs' rotations: half cat(-x2, x1), quarter cat(-x2, x1, -x4, x3), interleave pairs (x0, x1) -> (-x1, x0)."""
    d = x.shape[-1]
    if mode == "half":
        return torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    if mode == "quarter":
        q = d // 4
        return torch.cat((-x[..., q:2 * q], x[..., :q], -x[..., 3 * q:], x[..., 2 * q:3 * q]), -1)
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return out


def _reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str) -> torch.Tensor:
    x, cos, sin = x.float(), cos.float(), sin.float()
    return x * cos + _rotate(x, mode) * sin


# (x shape, r1/r2 shape): BNSD with 11SD, B1SD, BNSD coefficients; BSND with 1S1D, BS1D; SBND S11D; TND T1D.
_BROADCASTS = [((2, 3, 5, 8), (1, 1, 5, 8)), ((2, 3, 5, 8), (2, 1, 5, 8)), ((2, 3, 5, 8), (2, 3, 5, 8)),
               ((2, 5, 3, 8), (1, 5, 1, 8)), ((2, 5, 3, 8), (2, 5, 1, 8)), ((5, 2, 3, 8), (5, 1, 1, 8)),
               ((7, 3, 8), (7, 1, 8))]


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("shapes", _BROADCASTS, ids=[f"{len(s)}d-{c}" for s, c in _BROADCASTS])
def test_rotary_mul_matches_formula(mode, shapes):
    """npu_rotary_mul equals x * r1 + rotate(x) * r2 for each documented coefficient broadcast, both modes."""
    shape, coeff = shapes
    x, r1, r2 = randn(*shape), randn(*coeff, seed=1), randn(*coeff, seed=2)
    assert_matches(ops.npu_rotary_mul(x.npu(), r1.npu(), r2.npu(), mode), _reference(x, r1, r2, mode))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_forward_and_backward_in_each_dtype(dtype, mode):
    """Forward in x's dtype and (dx, dr1, dr2) through npu_rotary_mul_backward equal autograd of the formula."""
    x, r1, r2 = randn(2, 4, 3, 16, dtype=dtype), randn(1, 4, 1, 16, dtype=dtype, seed=1), randn(1, 4, 1, 16,
                                                                                                  dtype=dtype, seed=2)
    grad = randn(2, 4, 3, 16, dtype=dtype, seed=3)
    npu_in = [t.npu().requires_grad_() for t in (x, r1, r2)]
    out = ops.npu_rotary_mul(*npu_in, mode)
    out.backward(grad.npu())
    ref_in = [t.float().requires_grad_() for t in (x, r1, r2)]
    ref = _reference(*ref_in, mode)
    ref.backward(grad.float())
    assert out.dtype == dtype
    assert_matches(out, ref)
    for got, want in zip(npu_in, ref_in, strict=True):
        assert got.grad.dtype == dtype and got.grad.shape == want.shape
        assert_matches(got.grad, want.grad, dtype if dtype == torch.float32 else torch.bfloat16)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_gradcheck(mode):
    """npu_rotary_mul's backward passes gradcheck in float64 for x, r1 and r2."""
    gradcheck(lambda x, c, s: ops.npu_rotary_mul(x, c, s, mode), randn(2, 3, 2, 4), randn(1, 3, 1, 4, seed=1),
              randn(1, 3, 1, 4, seed=2))


def test_rotary_mul_with_a_rotate_matrix():
    """With `rotate`, rotate(x) = x @ rotate (the docs' block-diagonal use); its backward is refused."""
    d = 8
    half = torch.zeros(d, d)  # x @ half == cat(-x2, x1)
    half[d // 2:, :d // 2] = -torch.eye(d // 2)
    half[:d // 2, d // 2:] = torch.eye(d // 2)
    x, r1, r2 = randn(2, 3, 4, d), randn(1, 3, 1, d, seed=1), randn(1, 3, 1, d, seed=2)
    out = ops.npu_rotary_mul(x.npu(), r1.npu(), r2.npu(), "half", half.npu())
    assert_matches(out, _reference(x, r1, r2, "half"))
    out = ops.npu_rotary_mul(x.npu().requires_grad_(), r1.npu(), r2.npu(), "half", half.npu())
    with pytest.raises(RuntimeError, match="npu_rotary_mul: backward is not supported when rotate is given"):
        out.sum().backward()


_LAYOUTS = {"BSND": ((2, 6, 3, 8), (2, 6, 2, 8), (2, 6, 1, 8)), "SBND": ((6, 2, 3, 8), (6, 2, 2, 8), (6, 2, 1, 8)),
            "BNSD": ((2, 3, 6, 8), (2, 2, 6, 8), (2, 1, 6, 8)), "TND": ((9, 3, 8), (9, 2, 8), (9, 1, 8))}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("mode", ["half", "quarter", "interleave"])
def test_apply_rotary_pos_emb_updates_query_and_key_in_place(layout, mode):
    """query and key are embedded in place and returned themselves (op-plugin's kernel), in each layout and mode."""
    q_shape, k_shape, c_shape = _LAYOUTS[layout]
    q, k, cos, sin = randn(*q_shape), randn(*k_shape, seed=1), randn(*c_shape, seed=2), randn(*c_shape, seed=3)
    qn, kn = q.npu(), k.npu()
    q_out, k_out = ops.npu_apply_rotary_pos_emb(qn, kn, cos.npu(), sin.npu(), layout, mode)
    assert q_out is qn and k_out is kn
    assert_matches(qn, _reference(q, cos, sin, mode))
    assert_matches(kn, _reference(k, cos, sin, mode))


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rotary_pos_emb_in_each_dtype(dtype):
    """The embedding is computed in float32 and stored in the inputs' dtype; a backward through it raises."""
    q, k = randn(1, 4, 2, 16, dtype=dtype), randn(1, 4, 2, 16, dtype=dtype, seed=1)
    cos, sin = randn(1, 4, 1, 16, dtype=dtype, seed=2), randn(1, 4, 1, 16, dtype=dtype, seed=3)
    q_out, _ = ops.npu_apply_rotary_pos_emb(q.npu(), k.npu(), cos.npu(), sin.npu())
    assert q_out.dtype == dtype
    assert_matches(q_out, _reference(q, cos, sin, "half"))
    leaf = q.npu().requires_grad_()
    q_out, _ = ops.npu_apply_rotary_pos_emb(leaf * 1, k.npu(), cos.npu(), sin.npu())
    with pytest.raises(RuntimeError, match="derivative for npu::npu_apply_rotary_pos_emb is not implemented"):
        q_out.float().sum().backward()


def test_rotary_errors_name_the_op_and_argument():
    """Modes, layouts, shapes, dtypes and devices are checked, naming the op and the argument."""
    x, c = randn(2, 3, 4, 8).npu(), randn(1, 3, 1, 8).npu()
    with pytest.raises(RuntimeError, match="npu_rotary_mul: The rotary_mode of npu_rotary_mul should be half or "
                                           "interleave, but got quarter"):
        ops.npu_rotary_mul(x, c, c, "quarter")
    with pytest.raises(RuntimeError, match="The rotary_mode of npu_rotary_mul_backward should be half or "
                                           "interleave, but got quarter"):
        ops.npu_rotary_mul_backward(x, x, c, c, "quarter")
    with pytest.raises(RuntimeError, match=r"npu_rotary_mul: r1 of shape \(1, 2, 1, 8\) must broadcast to self"):
        ops.npu_rotary_mul(x, c[:, :2], c, "half")
    with pytest.raises(RuntimeError, match=r"npu_rotary_mul: r2 must be float16, bfloat16, float32 or float64, got "
                                           "int64"):
        ops.npu_rotary_mul(x, c, c.long())
    assert_device_errors(ops.npu_rotary_mul, [x, c, c], 2, "r2", "npu_rotary_mul")
    q = randn(2, 6, 3, 8).npu()
    cos = randn(2, 6, 1, 8).npu()
    with pytest.raises(RuntimeError, match="npu_apply_rotary_pos_emb: layout must be one of BSND, SBND, BNSD, TND"):
        ops.npu_apply_rotary_pos_emb(q, q, cos, cos, "BSH")
    with pytest.raises(RuntimeError, match="npu_apply_rotary_pos_emb: cos and sin of shape .* size 1 in the head"):
        ops.npu_apply_rotary_pos_emb(q, q, q, q)
    with pytest.raises(RuntimeError, match="npu_apply_rotary_pos_emb: the last dimension of query .* divisible by 4"):
        ops.npu_apply_rotary_pos_emb(q[..., :6], q[..., :6], cos[..., :6], cos[..., :6], "BSND", "quarter")
    assert_device_errors(ops.npu_apply_rotary_pos_emb, [q, q, cos, cos], 3, "sin", "npu_apply_rotary_pos_emb")


@pytest.mark.parametrize("x_dtype, r_dtype", [(torch.float16, torch.float32), (torch.float32, torch.bfloat16)])
def test_rotary_mul_mixed_dtypes_round_the_coefficients_to_self(x_dtype, r_dtype):
    """r1 / r2 of another dtype are cast to self's first (op-plugin's mixed-dtype path); gradients keep each dtype."""
    x, r1, r2 = randn(2, 3, 4, 8), randn(1, 3, 1, 8, seed=1), randn(1, 3, 1, 8, seed=2)
    x, r1, r2 = x.to(x_dtype), r1.to(r_dtype), r2.to(r_dtype)
    rounded = [r.to(x_dtype) for r in (r1, r2)]
    out = ops.npu_rotary_mul(x.npu(), r1.npu(), r2.npu())
    assert out.dtype == x_dtype
    assert_matches(out, _reference(x, *rounded, "half").to(x_dtype))
    leaves = [t.npu().requires_grad_() for t in (x, r1, r2)]
    ops.npu_rotary_mul(*leaves).float().sum().backward()
    assert [t.grad.dtype for t in leaves] == [x_dtype, r_dtype, r_dtype]
    g = torch.ones(2, 3, 4, 8)
    assert_matches(leaves[1].grad, (g * x.float()).sum((0, 2), keepdim=True).to(x_dtype).to(r_dtype))


def test_apply_rotary_pos_emb_in_place_under_torch_compile():
    """Compiled with fullgraph=True, the in-place writes are traced (Note [npu_apply_rotary_pos_emb updates query and
    key in place]): a caller that ignores the results reads embedded query and key, as eagerly."""

    def embed(q, k, cos, sin):
        q = q * 1  # an intermediate: functionalization must see the write into it
        ops.npu_apply_rotary_pos_emb(q, k, cos, sin)
        return q + 0

    q, k, cos, sin = randn(1, 4, 2, 8), randn(1, 4, 2, 8, seed=1), randn(1, 4, 1, 8, seed=2), randn(1, 4, 1, 8, seed=3)
    torch._dynamo.reset()
    kn = k.npu()
    out = torch.compile(embed, fullgraph=True, backend="aot_eager")(q.npu(), kn, cos.npu(), sin.npu())
    assert_matches(out, _reference(q, cos, sin, "half"))
    assert_matches(kn, _reference(k, cos, sin, "half"))  # a graph input mutated in place, as eagerly


def test_rotary_ops_pass_opcheck():
    """PyTorch's opcheck (schema, fake kernel, AOT tracing) of the rotary operators and backward op."""
    x, c, s = randn(2, 3, 4, 8).npu(), randn(1, 3, 1, 8, seed=1).npu(), randn(1, 3, 1, 8, seed=2).npu()
    opcheck(ops.npu_rotary_mul, x.requires_grad_(), c, s, "interleave")
    opcheck(ops.npu_rotary_mul_backward, torch.ones_like(x), x.detach(), c, s, "half")
    opcheck(ops._npu_apply_rotary_pos_emb, x.detach(), x.detach()[:, :, :2], c, s, "BSND", "quarter")
