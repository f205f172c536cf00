"""Rotary position embedding: ``npu_rotary_mul`` (+ backward) and ``npu_apply_rotary_pos_emb``.

Both compute ``x * cos + rotate(x) * sin`` (op-plugin docs ``torch_npu-npu_rotary_mul.md``,
``torch_npu-apply_rotary_pos_emb.md``; aclnnApplyRotaryPosEmbV2 for "quarter"), where
``rotate`` pairs the last dimension's halves ("half": ``cat(-x2, x1)``), its quarters
("quarter": ``cat(-x2, x1, -x4, x3)``) or its even/odd elements ("interleave"); with
npu_rotary_mul's ``rotate`` matrix, ``rotate(x) = x @ rotate``.

Note [npu_apply_rotary_pos_emb updates query and key in place]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
op-plugin declares ``npu_apply_rotary_pos_emb`` functional (``-> (Tensor, Tensor)``), yet its
kernel (ApplyRotaryPosEmbNpuOpApi.cpp) writes the result into ``query`` and ``key`` and
returns them, and scripts rely on it: vLLM-Ascend calls it without using the results. npusim
keeps op-plugin's schema and gives the public op a CompositeImplicitAutograd kernel: the
functional ``_npu_apply_rotary_pos_emb`` computes the results, ``copy_`` writes them into
query and key, and query and key are returned. Eagerly that is torch_npu's behaviour to the
object; under ``torch.compile`` the decomposition is what gets traced, so functionalization
sees the writes (a functional schema alone would hide them). torch_npu registers no
derivative for it (AutogradErrorFallback.cpp): a backward through it raises.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, check_dim, check_dtype, check_same_dtype, compute_dtype, fail
from npusim.ops.fused._library import LIB, define, implement, no_derivative, register_autograd

ROTARY_MUL = define("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) "
                    "-> Tensor")
ROTARY_MUL_BACKWARD = define("npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, "
                             "str rotary_mode='half') -> (Tensor, Tensor, Tensor)")
APPLY_ROTARY = define("npu_apply_rotary_pos_emb(Tensor query, Tensor key, Tensor cos, Tensor sin, str layout='BSND', "
                      "str rotary_mode='half') -> (Tensor, Tensor)")
APPLY_ROTARY_FUNCTIONAL = define("_npu_apply_rotary_pos_emb(Tensor query, Tensor key, Tensor cos, Tensor sin, "
                                 "str layout='BSND', str rotary_mode='half') -> (Tensor, Tensor)", public=False)

# The even split of the last dimension each mode needs.
_SPLIT = {"half": 2, "interleave": 2, "quarter": 4}


def rotate(x: Tensor, mode: str) -> Tensor:
    """The rotation of ``mode`` applied to the last dimension. Its transpose is ``-rotate``."""
    if mode == "interleave":
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)
    parts = x.chunk(_SPLIT[mode], dim=-1)
    rotated = []
    for first, second in zip(parts[0::2], parts[1::2], strict=True):
        rotated += [-second, first]
    return torch.cat(rotated, dim=-1)


def _check_mode(op: str, mode: str, modes: tuple[str, ...], x: Tensor, name: str) -> None:
    check(mode in modes, op, f"rotary_mode must be one of {', '.join(modes)}, got {mode!r}")
    d = x.shape[-1]
    check(d % _SPLIT[mode] == 0, op, f"the last dimension of {name} ({d}) must be divisible by "
                                     f"{_SPLIT[mode]} in rotary_mode {mode!r}")


def _check_coefficient(op: str, name: str, r: Tensor, x: Tensor, x_name: str) -> None:
    check(r.dim() == x.dim(), op, f"{name} must have {x.dim()} dimensions like {x_name}, got {r.dim()}-D")
    ok = all(a in (1, b) for a, b in zip(r.shape, x.shape, strict=True))
    check(ok, op, f"{name} of shape {tuple(r.shape)} must broadcast to {x_name} of shape {tuple(x.shape)}")


# -- npu_rotary_mul ------------------------------------------------------------------------------------------------

def _check_rotary_mul(x: Tensor, r1: Tensor, r2: Tensor, mode: str, rotate_matrix: Tensor | None,
                      op: str = "npu_rotary_mul") -> None:
    """op-plugin's checks (RotaryMulKernelNpuOpApi.cpp), its rotary_mode message first.

    r1 and r2 may have another floating dtype than self: op-plugin casts them to self's dtype
    (its "mix dtype" path), and so does :func:`_coefficients`.
    """
    check(mode in ("half", "interleave"), op,
          f"The rotary_mode of {op} should be half or interleave, but got {mode}")
    check_dtype(op, "self", x)
    check_dim(op, "self", x, (3, 4))
    for name, r in (("r1", r1), ("r2", r2)):
        check_dtype(op, name, r)
    check_same_dtype(op, "self", {"self": x, "rotate": rotate_matrix})
    _check_coefficient(op, "r1", r1, x, "self")
    _check_coefficient(op, "r2", r2, x, "self")
    if rotate_matrix is None:
        _check_mode(op, mode, ("half", "interleave"), x, "self")
    else:
        d = x.shape[-1]
        check(tuple(rotate_matrix.shape) == (d, d), op,
              f"rotate must have shape ({d}, {d}) (the last dimension of self), got {tuple(rotate_matrix.shape)}")


def rotary_mul(x: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half",
               rotate_matrix: Tensor | None = None) -> Tensor:
    """x * r1 + rotate(x) * r2 in x's dtype."""
    _check_rotary_mul(x, r1, r2, rotary_mode, rotate_matrix)
    acc = x.to(compute_dtype(x.dtype))
    c, s = _coefficients(x, r1, r2, acc.dtype)
    turned = acc @ rotate_matrix.to(acc.dtype) if rotate_matrix is not None else rotate(acc, rotary_mode)
    return (acc * c + turned * s).to(x.dtype)


def _coefficients(x: Tensor, r1: Tensor, r2: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """r1 and r2 rounded to self's dtype first, as op-plugin casts mixed-dtype coefficients, then in ``acc``."""
    return r1.to(x.dtype).to(acc), r2.to(x.dtype).to(acc)


def _rotary_mul_fake(x: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half",
                     rotate_matrix: Tensor | None = None) -> Tensor:
    _check_rotary_mul(x, r1, r2, rotary_mode, rotate_matrix)
    return torch.empty_like(x)


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    dims = [i for i, (a, b) in enumerate(zip(shape, t.shape, strict=True)) if a == 1 and b != 1]
    return t.sum(dims, keepdim=True) if dims else t


def rotary_mul_backward(grad: Tensor, x: Tensor, r1: Tensor, r2: Tensor,
                        rotary_mode: str = "half") -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dr1, dr2) in x's dtype; dr1 / dr2 summed over the dimensions r1 / r2 broadcast."""
    _check_rotary_mul(x, r1, r2, rotary_mode, None, op="npu_rotary_mul_backward")
    acc = compute_dtype(x.dtype)
    g, xa = grad.to(x.dtype).to(acc), x.to(acc)
    c, s = _coefficients(x, r1, r2, acc)
    dx = g * c - rotate(g * s, rotary_mode)
    dr1 = _sum_to(g * xa, r1.shape)
    dr2 = _sum_to(g * rotate(xa, rotary_mode), r2.shape)
    return dx.to(x.dtype), dr1.to(x.dtype), dr2.to(x.dtype)


def _rotary_mul_backward_fake(grad: Tensor, x: Tensor, r1: Tensor, r2: Tensor,
                              rotary_mode: str = "half") -> tuple[Tensor, Tensor, Tensor]:
    _check_rotary_mul(x, r1, r2, rotary_mode, None, op="npu_rotary_mul_backward")
    return torch.empty_like(x), torch.empty_like(r1, dtype=x.dtype), torch.empty_like(r2, dtype=x.dtype)


def _rotary_mul_setup(ctx, inputs, output) -> None:
    x, r1, r2, mode, rotate_matrix = inputs
    ctx.mode, ctx.has_rotate = mode, rotate_matrix is not None
    ctx.save_for_backward(x, r1, r2)


def _rotary_mul_autograd(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
    if ctx.has_rotate:
        # op-plugin: "输入rotate参数时不支持反向传播"; npu_rotary_mul_backward takes no rotate.
        fail("npu_rotary_mul", "backward is not supported when rotate is given (op-plugin documents none)")
    x, r1, r2 = ctx.saved_tensors
    dx, dr1, dr2 = torch.ops.npu.npu_rotary_mul_backward(grad, x, r1, r2, ctx.mode)
    return dx, dr1, dr2, None, None


implement(ROTARY_MUL, rotary_mul, _rotary_mul_fake)
implement(ROTARY_MUL_BACKWARD, rotary_mul_backward, _rotary_mul_backward_fake)
register_autograd(ROTARY_MUL, _rotary_mul_autograd, setup_context=_rotary_mul_setup)


# -- npu_apply_rotary_pos_emb --------------------------------------------------------------------------------------

# The dimension of the heads (N) in each layout: cos and sin have size 1 there.
_HEAD_DIM = {"BSND": 2, "SBND": 2, "BNSD": 1, "TND": 1}


def _check_apply(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str, mode: str) -> None:
    op = "npu_apply_rotary_pos_emb"
    check(layout in _HEAD_DIM, op, f"layout must be one of {', '.join(_HEAD_DIM)}, got {layout!r}")
    rank = 3 if layout == "TND" else 4
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        check_dtype(op, name, t)
        check_dim(op, name, t, (rank,))
    check_same_dtype(op, "query", {"query": query, "key": key, "cos": cos, "sin": sin})
    _check_mode(op, mode, tuple(_SPLIT), query, "query")
    heads = _HEAD_DIM[layout]
    others = [i for i in range(rank) if i != heads]
    check(all(key.shape[i] == query.shape[i] for i in others), op,
          f"key of shape {tuple(key.shape)} must match query {tuple(query.shape)} outside the head dimension "
          f"({heads}) of layout {layout}")
    check(cos.shape == sin.shape, op, f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    check(cos.shape[heads] == 1 and all(cos.shape[i] in (1, query.shape[i]) for i in others), op,
          f"cos and sin of shape {tuple(cos.shape)} must have size 1 in the head dimension ({heads}) of layout "
          f"{layout} and broadcast to query {tuple(query.shape)}")
    check(cos.shape[-1] == query.shape[-1], op,
          f"cos and sin must have the last dimension of query ({query.shape[-1]}), got {cos.shape[-1]}")


def _apply_functional(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str = "BSND",
                      rotary_mode: str = "half") -> tuple[Tensor, Tensor]:
    _check_apply(query, key, cos, sin, layout, rotary_mode)
    acc = compute_dtype(query.dtype)
    c, s = cos.to(acc), sin.to(acc)

    def embed(t: Tensor) -> Tensor:
        a = t.to(acc)
        return (a * c + rotate(a, rotary_mode) * s).to(t.dtype)

    return embed(query), embed(key)


def _apply_functional_fake(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str = "BSND",
                           rotary_mode: str = "half") -> tuple[Tensor, Tensor]:
    _check_apply(query, key, cos, sin, layout, rotary_mode)
    return torch.empty_like(query), torch.empty_like(key)


def apply_rotary_pos_emb(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str = "BSND",
                         rotary_mode: str = "half") -> tuple[Tensor, Tensor]:
    """Embeds query and key in place and returns them. See Note [npu_apply_rotary_pos_emb updates query and key in
    place]."""
    q_out, k_out = torch.ops.npu._npu_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    query.copy_(q_out)
    key.copy_(k_out)
    return query, key


implement(APPLY_ROTARY_FUNCTIONAL, _apply_functional, _apply_functional_fake, shown="npu_apply_rotary_pos_emb")
no_derivative(APPLY_ROTARY_FUNCTIONAL, shown="npu_apply_rotary_pos_emb")
LIB.impl("npu_apply_rotary_pos_emb", apply_rotary_pos_emb, "CompositeImplicitAutograd")
