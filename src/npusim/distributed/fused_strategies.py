"""DTensor sharding strategies of op-plugin's fused operators that npusim simulates, as torch_npu registers.

torch_npu gives DTensor a strategy for its fused operators (``torch_npu/distributed/tensor/``: ``_math_ops.py``,
``_pointwise_ops.py``, ``_moe_ops.py``),
so a model whose norms are ``npu_rms_norm`` (torchtitan-npu's converter) runs under tensor and sequence
parallelism, where the norm's input is a DTensor. Without one, DTensor raises "does not have a sharding
strategy registered" naming the op. The strategies are derived here from each operator's definition
(npusim.ops.fused), per mesh dimension; see Note [Sharding op-plugin's fused operators].
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec

from npusim.distributed.placements import PlacementList

__all__ = ["FUSED_STRATEGY_OPS"]

npu = torch.ops.npu

# Note [Sharding op-plugin's fused operators]
# Each operator is split along the dimensions its computation never mixes, and nowhere else:
# - npu_rms_norm / npu_add_rms_norm normalise over the trailing gamma.ndim dimensions of x: any leading
#   dimension can be split (x, y, the sum and rstd, whose trailing dimensions are 1, alike; gamma
#   replicated). npu_rms_norm_backward's dgamma sums over those leading dimensions, so it is Partial.
# - npu_rotary_mul rotates pairs within the last dimension: any other dimension can be split; r1 / r2
#   are split with x where they have x's size, and replicated where they broadcast. In its backward, the
#   gradients of r1 / r2 sum over the dimensions they broadcast along, so they are Partial there.
# - npu_swiglu halves ``dim``: any other dimension can be split.
# - npu_fast_gelu / fast_gelu and npu_fast_gelu_backward are elementwise: any dimension can be split, every
#   operand alike (the backward's grad and self have one shape).
# - npu_moe_token_permute / unpermute and their gradients move whole token rows (gather, scatter and the
#   probs-weighted sum over a token's slots): the hidden dimension (1) of the token rows can be split, the
#   routing (indices, sorted_indices, probs) replicated, as torch_npu's strategies split them. The gradient
#   of probs sums over the hidden dimension, so it is Partial there.
# Replicating everything is always acceptable. Splits of a dimension smaller than the mesh are dropped
# by register_sharding; uneven ones are valid.


def _norm_dims(x: DTensorSpec, gamma: DTensorSpec, op: str) -> range:
    if gamma.ndim == 0 or gamma.ndim > x.ndim or tuple(x.shape[-gamma.ndim:]) != tuple(gamma.shape):
        raise RuntimeError(f"{op} on DTensor ({x.mesh.device_type}): gamma's shape {tuple(gamma.shape)} must be "
                           f"the trailing dimensions of x's {tuple(x.shape)}")
    return range(x.ndim - gamma.ndim)


def rms_norm_shardings(x: DTensorSpec, gamma: DTensorSpec, epsilon: float = 1e-6) -> list[tuple[PlacementList,
                                                                                                 PlacementList]]:
    """(y, rstd) from (x, gamma, epsilon)."""
    shardings: list[tuple[PlacementList, PlacementList]] = [([Replicate(), Replicate()], [Replicate(), Replicate(),
                                                                                          None])]
    for d in _norm_dims(x, gamma, "npu.npu_rms_norm.default"):
        shardings.append(([Shard(d), Shard(d)], [Shard(d), Replicate(), None]))
    return shardings


def rms_norm_backward_shardings(dy: DTensorSpec, x: DTensorSpec, gamma: DTensorSpec,
                                rstd: DTensorSpec) -> list[tuple[PlacementList, PlacementList]]:
    """(dx, dgamma) from (dy, x, gamma, rstd)."""
    shardings: list[tuple[PlacementList, PlacementList]] = [([Replicate(), Replicate()], [Replicate()] * 4)]
    for d in _norm_dims(x, gamma, "npu.npu_rms_norm_backward.default"):
        shardings.append(([Shard(d), Partial()], [Shard(d), Shard(d), Replicate(), Shard(d)]))
    return shardings


def add_rms_norm_shardings(x1: DTensorSpec, x2: DTensorSpec, gamma: DTensorSpec,
                           epsilon: float = 1e-6) -> list[tuple[PlacementList, PlacementList]]:
    """(y, rstd, x1 + x2) from (x1, x2, gamma, epsilon); x1 and x2 split alike only where their shapes agree."""
    shardings: list[tuple[PlacementList, PlacementList]] = [([Replicate()] * 3, [Replicate()] * 3 + [None])]
    if tuple(x1.shape) == tuple(x2.shape):
        for d in _norm_dims(x1, gamma, "npu.npu_add_rms_norm.default"):
            shardings.append(([Shard(d)] * 3, [Shard(d), Shard(d), Replicate(), None]))
    return shardings


def _rotary_split(x: DTensorSpec, r: DTensorSpec, d: int) -> tuple[Shard | Replicate, bool]:
    """r's placement when x is split on d, and whether r broadcasts along d (its gradient then sums over it)."""
    own = d - (x.ndim - r.ndim)
    if own >= 0 and r.shape[own] == x.shape[d]:
        return Shard(own), False
    return Replicate(), True


def rotary_mul_shardings(x: DTensorSpec, r1: DTensorSpec, r2: DTensorSpec, rotary_mode: str = "half",
                         rotate: DTensorSpec | None = None) -> list[tuple[PlacementList, PlacementList]]:
    """y from (x, r1, r2, rotary_mode, rotate)."""
    extra: PlacementList = [None] if rotate is None else [None, Replicate()]
    shardings: list[tuple[PlacementList, PlacementList]] = [([Replicate()], [Replicate()] * 3 + extra)]
    if rotate is not None:  # the rotation matrix mixes the whole last dimension: x is split nowhere else either
        return shardings
    for d in range(x.ndim - 1):
        (p1, _), (p2, _) = _rotary_split(x, r1, d), _rotary_split(x, r2, d)
        shardings.append(([Shard(d)], [Shard(d), p1, p2, None]))
    return shardings


def rotary_mul_backward_shardings(grad: DTensorSpec, x: DTensorSpec, r1: DTensorSpec, r2: DTensorSpec,
                                  rotary_mode: str = "half") -> list[tuple[PlacementList, PlacementList]]:
    """(dx, dr1, dr2) from (grad, x, r1, r2, rotary_mode)."""
    shardings: list[tuple[PlacementList, PlacementList]] = [([Replicate()] * 3, [Replicate()] * 4 + [None])]
    for d in range(x.ndim - 1):
        (p1, sums1), (p2, sums2) = _rotary_split(x, r1, d), _rotary_split(x, r2, d)
        shardings.append(([Shard(d), Partial() if sums1 else p1, Partial() if sums2 else p2],
                          [Shard(d), Shard(d), p1, p2, None]))
    return shardings


def swiglu_shardings(x: DTensorSpec, dim: int = -1) -> list[tuple[PlacementList, PlacementList]]:
    """y from (x, dim)."""
    halved = dim % x.ndim
    return [([Replicate()], [Replicate(), None])] + [([Shard(d)], [Shard(d), None]) for d in range(x.ndim)
                                                     if d != halved]


def swiglu_backward_shardings(grad: DTensorSpec, x: DTensorSpec,
                              dim: int = -1) -> list[tuple[PlacementList, PlacementList]]:
    """dx from (grad, x, dim)."""
    halved = dim % x.ndim
    return [([Replicate()], [Replicate(), Replicate(), None])] + [
        ([Shard(d)], [Shard(d), Shard(d), None]) for d in range(x.ndim) if d != halved]


def pointwise_shardings(*operands: DTensorSpec) -> list[tuple[PlacementList, PlacementList]]:
    """The output from elementwise operands of one shape (fast_gelu's x; its backward's grad and self)."""
    shape = tuple(operands[0].shape)
    if any(tuple(o.shape) != shape for o in operands):
        return [([Replicate()], [Replicate()] * len(operands))]
    return [([Replicate()], [Replicate()] * len(operands))] + [
        ([Shard(d)], [Shard(d)] * len(operands)) for d in range(len(shape))]


def _routing(spec: DTensorSpec | None) -> Replicate | None:
    return None if spec is None else Replicate()


def token_permute_shardings(tokens: DTensorSpec, indices: DTensorSpec, num_out_tokens: int | None = None,
                            padded_mode: bool = False) -> list[tuple[PlacementList, PlacementList]]:
    """(permuted_tokens, sorted_indices) from (tokens, indices, num_out_tokens, padded_mode)."""
    return [([Replicate(), Replicate()], [Replicate(), Replicate(), None, None]),
            ([Shard(1), Replicate()], [Shard(1), Replicate(), None, None])]


def token_permute_grad_shardings(tokens: DTensorSpec, grad_permuted_tokens: DTensorSpec, indices: DTensorSpec,
                                 sorted_indices: DTensorSpec,
                                 padded_mode: bool = False) -> list[tuple[PlacementList, PlacementList]]:
    """grad of tokens from (tokens, grad_permuted_tokens, indices, sorted_indices, padded_mode)."""
    return [([Replicate()], [Replicate()] * 4 + [None]),
            ([Shard(1)], [Shard(1), Shard(1), Replicate(), Replicate(), None])]


def token_permute_grad_v2_shardings(grad_permuted_tokens: DTensorSpec, sorted_indices: DTensorSpec,
                                    tokens_size_0: int, tokens_dtype: torch.dtype, num_topk: int,
                                    padded_mode: bool = False) -> list[tuple[PlacementList, PlacementList]]:
    """grad of tokens from (grad_permuted_tokens, sorted_indices, tokens_size_0, tokens_dtype, num_topK, ...)."""
    return [([Replicate()], [Replicate(), Replicate()] + [None] * 4),
            ([Shard(1)], [Shard(1), Replicate()] + [None] * 4)]


def token_unpermute_shardings(permuted_tokens: DTensorSpec, sorted_indices: DTensorSpec,
                              probs: DTensorSpec | None = None, padded_mode: bool = False,
                              restore_shape: list[int] | None = None) -> list[tuple[PlacementList, PlacementList]]:
    """unpermuted tokens from (permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)."""
    return [([Replicate()], [Replicate(), Replicate(), _routing(probs), None, None]),
            ([Shard(1)], [Shard(1), Replicate(), _routing(probs), None, None])]


def token_unpermute_grad_shardings(permuted_tokens: DTensorSpec, grad_unpermuted_tokens: DTensorSpec,
                                   sorted_indices: DTensorSpec, probs: DTensorSpec | None = None,
                                   padded_mode: bool = False, restore_shape: list[int] | None = None
                                   ) -> list[tuple[PlacementList, PlacementList]]:
    """(grad of permuted_tokens, grad of probs) from (permuted_tokens, grad_unpermuted_tokens, sorted_indices,
    probs, ...); without probs the second is empty, replicated."""
    probs_grad = Replicate() if probs is None else Partial()
    return [([Replicate(), Replicate()], [Replicate()] * 3 + [_routing(probs), None, None]),
            ([Shard(1), probs_grad], [Shard(1), Shard(1), Replicate(), _routing(probs), None, None])]


def token_unpermute_grad_v2_shardings(grad_unpermuted_tokens: DTensorSpec, sorted_indices: DTensorSpec,
                                      permuted_tokens_size_0: int, permuted_tokens_dtype: torch.dtype,
                                      probs: DTensorSpec | None = None, padded_mode: bool = False,
                                      restore_shape: list[int] | None = None,
                                      permuted_tokens: DTensorSpec | None = None
                                      ) -> list[tuple[PlacementList, PlacementList]]:
    """(grad of permuted_tokens, grad of probs) from (grad_unpermuted_tokens, sorted_indices, its size and dtype,
    probs, padded_mode, restore_shape, permuted_tokens)."""
    probs_grad = Replicate() if probs is None else Partial()
    rows = None if permuted_tokens is None else Shard(1)
    return [([Replicate(), Replicate()], [Replicate(), Replicate(), None, None, _routing(probs), None, None,
                                          _routing(permuted_tokens)]),
            ([Shard(1), probs_grad], [Shard(1), Replicate(), None, None, _routing(probs), None, None, rows])]


# The fused operators given strategies, each with the function that derives them.
FUSED_STRATEGY_OPS = {
    npu.npu_rms_norm.default: rms_norm_shardings,
    npu.npu_rms_norm_backward.default: rms_norm_backward_shardings,
    npu.npu_add_rms_norm.default: add_rms_norm_shardings,
    npu.npu_rotary_mul.default: rotary_mul_shardings,
    npu.npu_rotary_mul_backward.default: rotary_mul_backward_shardings,
    npu.npu_swiglu.default: swiglu_shardings,
    npu.npu_swiglu_backward.default: swiglu_backward_shardings,
    npu.npu_fast_gelu.default: pointwise_shardings,
    npu.fast_gelu.default: pointwise_shardings,
    npu.npu_fast_gelu_backward.default: pointwise_shardings,
    npu.npu_moe_token_permute.default: token_permute_shardings,
    npu.npu_moe_token_permute_grad.default: token_permute_grad_shardings,
    npu.npu_moe_token_permute_grad_v2.default: token_permute_grad_v2_shardings,
    npu.npu_moe_token_unpermute.default: token_unpermute_shardings,
    npu.npu_moe_token_unpermute_grad.default: token_unpermute_grad_shardings,
    npu.npu_moe_token_unpermute_grad_v2.default: token_unpermute_grad_v2_shardings,
}
