"""MoE token permutation: ``npu_moe_token_permute`` / ``npu_moe_token_unpermute`` and their grad ops.

CANN's aclnnMoeTokenPermute (and op-plugin's ``test_npu_moe_token_permute_and_unpermute.py``):
the (token, choice) slots ``i * topk + j`` are sorted stably by expert, ``first = argsort(indices)``,
``permuted[p] = tokens[first[p] // topk]`` and ``sorted_indices = argsort(first)``: slot s went to
row ``sorted_indices[s]``. ``num_out_tokens`` keeps the first rows (0 / None: all; negative:
that many fewer); unpermute sums each token's slots back, weighted by ``probs``, skipping
slots past the kept rows. Only ``padded_mode=False`` exists (CANN: "目前仅支持paddedMode为false").
Both are differentiable in torch_npu, through the ``*_grad_v2`` ops (derivatives.yaml).
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused._checks import FLOATING, check, check_dim, check_dtype, check_shape, compute_dtype
from npusim.ops.fused._library import define, implement, register_autograd

PERMUTE = define("npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens=None, "
                 "bool padded_mode=False) -> (Tensor, Tensor)")
PERMUTE_GRAD = define("npu_moe_token_permute_grad(Tensor tokens, Tensor grad_permuted_tokens, Tensor indices, "
                      "Tensor sorted_indices, bool padded_mode=False) -> Tensor")
PERMUTE_GRAD_V2 = define("npu_moe_token_permute_grad_v2(Tensor grad_permuted_tokens, Tensor sorted_indices, "
                         "int tokens_size_0, ScalarType tokens_dtype, int num_topK, bool padded_mode=False) -> Tensor")
UNPERMUTE = define("npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, "
                   "bool padded_mode=False, int[]? restore_shape=None) -> Tensor")
UNPERMUTE_GRAD = define("npu_moe_token_unpermute_grad(Tensor permuted_tokens, Tensor grad_unpermuted_tokens, "
                        "Tensor sorted_indices, Tensor? probs=None, bool padded_mode=False, "
                        "int[]? restore_shape=None) -> (Tensor, Tensor)")
UNPERMUTE_GRAD_V2 = define("npu_moe_token_unpermute_grad_v2(Tensor grad_unpermuted_tokens, Tensor sorted_indices, "
                           "int permuted_tokens_size_0, ScalarType permuted_tokens_dtype, Tensor? probs=None, "
                           "bool padded_mode=False, int[]? restore_shape=None, Tensor? permuted_tokens=None) "
                           "-> (Tensor, Tensor)")

_INDEX = (torch.int32, torch.int64)


def _no_padded_mode(op: str, padded_mode: bool) -> None:
    check(not padded_mode, op, "padded_mode=True is not supported (CANN's MoeTokenPermute supports only False)")


def _kept_rows(num_out_tokens: int | None, slots: int) -> int:
    wanted = num_out_tokens or 0
    return min(wanted, slots) if wanted > 0 else max(slots + wanted, 0)


def _gather_slots(rows: Tensor, sorted_indices: Tensor) -> tuple[Tensor, Tensor]:
    """(rows[sorted_indices] with zeros where a slot's row was not kept, the kept mask)."""
    kept = sorted_indices.long() < rows.shape[0]
    if rows.shape[0] == 0:
        return rows.new_zeros((sorted_indices.numel(), rows.shape[1])), kept
    index = sorted_indices.long().clamp(max=rows.shape[0] - 1)
    return rows.index_select(0, index).masked_fill(~kept.unsqueeze(1), 0), kept


# -- npu_moe_token_permute -----------------------------------------------------------------------------------------

def _check_permute(tokens: Tensor, indices: Tensor, padded_mode: bool) -> None:
    op = "npu_moe_token_permute"
    _no_padded_mode(op, padded_mode)
    check_dtype(op, "tokens", tokens, (*FLOATING, torch.int8))
    check_dim(op, "tokens", tokens, (2,))
    check_dtype(op, "indices", indices, _INDEX)
    check_dim(op, "indices", indices, (1, 2))
    check(indices.shape[0] == tokens.shape[0], op,
          f"indices must have one row per token ({tokens.shape[0]}), got shape {tuple(indices.shape)}")


def token_permute(tokens: Tensor, indices: Tensor, num_out_tokens: int | None = None,
                  padded_mode: bool = False) -> tuple[Tensor, Tensor]:
    _check_permute(tokens, indices, padded_mode)
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    first = torch.sort(indices.reshape(-1), stable=True).indices
    sorted_indices = torch.empty_like(first).scatter_(0, first, torch.arange(first.numel(), device=first.device))
    rows = _kept_rows(num_out_tokens, first.numel())
    return tokens.index_select(0, first[:rows] // topk), sorted_indices.to(torch.int32)


def _token_permute_fake(tokens: Tensor, indices: Tensor, num_out_tokens: int | None = None,
                        padded_mode: bool = False) -> tuple[Tensor, Tensor]:
    _check_permute(tokens, indices, padded_mode)
    rows = _kept_rows(num_out_tokens, indices.numel())
    return tokens.new_empty((rows, tokens.shape[1])), tokens.new_empty((indices.numel(),), dtype=torch.int32)


def _permute_grad(grad: Tensor, sorted_indices: Tensor, tokens: int, dtype: torch.dtype, topk: int) -> Tensor:
    """grad_tokens[i] = sum_j grad[sorted_indices[i * topk + j]] over kept slots, in float32."""
    picked, _ = _gather_slots(grad.to(compute_dtype(grad.dtype)), sorted_indices)
    return picked.reshape(tokens, topk, grad.shape[1]).sum(1).to(dtype)


def _check_permute_grad(op: str, grad: Tensor, sorted_indices: Tensor, tokens: int, topk: int,
                        padded_mode: bool) -> None:
    _no_padded_mode(op, padded_mode)
    check_dim(op, "grad_permuted_tokens", grad, (2,))
    check_dtype(op, "sorted_indices", sorted_indices, _INDEX)
    check(topk > 0 and sorted_indices.numel() == tokens * topk, op,
          f"sorted_indices must have tokens_size_0 * num_topK ({tokens} * {topk}) entries, got "
          f"{sorted_indices.numel()}")


def token_permute_grad_v2(grad_permuted_tokens: Tensor, sorted_indices: Tensor, tokens_size_0: int,
                          tokens_dtype: torch.dtype, num_topk: int, padded_mode: bool = False) -> Tensor:
    _check_permute_grad("npu_moe_token_permute_grad_v2", grad_permuted_tokens, sorted_indices, tokens_size_0,
                        num_topk, padded_mode)
    return _permute_grad(grad_permuted_tokens, sorted_indices, tokens_size_0, tokens_dtype, num_topk)


def _token_permute_grad_v2_fake(grad_permuted_tokens: Tensor, sorted_indices: Tensor, tokens_size_0: int,
                                tokens_dtype: torch.dtype, num_topk: int, padded_mode: bool = False) -> Tensor:
    _check_permute_grad("npu_moe_token_permute_grad_v2", grad_permuted_tokens, sorted_indices, tokens_size_0,
                        num_topk, padded_mode)
    return grad_permuted_tokens.new_empty((tokens_size_0, grad_permuted_tokens.shape[1]), dtype=tokens_dtype)


def token_permute_grad(tokens: Tensor, grad_permuted_tokens: Tensor, indices: Tensor, sorted_indices: Tensor,
                       padded_mode: bool = False) -> Tensor:
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    _check_permute_grad("npu_moe_token_permute_grad", grad_permuted_tokens, sorted_indices, tokens.shape[0], topk,
                        padded_mode)
    return _permute_grad(grad_permuted_tokens, sorted_indices, tokens.shape[0], tokens.dtype, topk)


def _token_permute_grad_fake(tokens: Tensor, grad_permuted_tokens: Tensor, indices: Tensor, sorted_indices: Tensor,
                             padded_mode: bool = False) -> Tensor:
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    _check_permute_grad("npu_moe_token_permute_grad", grad_permuted_tokens, sorted_indices, tokens.shape[0], topk,
                        padded_mode)
    return torch.empty_like(tokens)


def _permute_setup(ctx, inputs, output) -> None:
    tokens, indices, _, ctx.padded_mode = inputs
    ctx.tokens, ctx.dtype = tokens.shape[0], tokens.dtype
    ctx.topk = 1 if indices.dim() == 1 else indices.shape[1]
    ctx.save_for_backward(output[1])


def _permute_autograd(ctx, grad: Tensor, _dsorted: Tensor | None) -> tuple[Tensor, None, None, None]:
    (sorted_indices,) = ctx.saved_tensors
    dtokens = torch.ops.npu.npu_moe_token_permute_grad_v2(grad, sorted_indices, ctx.tokens, ctx.dtype, ctx.topk,
                                                          ctx.padded_mode)
    return dtokens, None, None, None


implement(PERMUTE, token_permute, _token_permute_fake)
implement(PERMUTE_GRAD, token_permute_grad, _token_permute_grad_fake)
implement(PERMUTE_GRAD_V2, token_permute_grad_v2, _token_permute_grad_v2_fake)
register_autograd(PERMUTE, _permute_autograd, setup_context=_permute_setup)


# -- npu_moe_token_unpermute ---------------------------------------------------------------------------------------

def _check_unpermute(op: str, permuted: Tensor | None, sorted_indices: Tensor, probs: Tensor | None,
                     padded_mode: bool) -> int:
    """The number of tokens (slots / topk)."""
    _no_padded_mode(op, padded_mode)
    if permuted is not None:
        check_dtype(op, "permuted_tokens", permuted, (*FLOATING, torch.int8))
        check_dim(op, "permuted_tokens", permuted, (2,))
    check_dtype(op, "sorted_indices", sorted_indices, _INDEX)
    check_dim(op, "sorted_indices", sorted_indices, (1,))
    topk = 1
    if probs is not None:
        check_dtype(op, "probs", probs)
        check_dim(op, "probs", probs, (2,))
        topk = probs.shape[1]
        check(probs.numel() == sorted_indices.numel(), op,
              f"probs must have one weight per slot ({sorted_indices.numel()}), got shape {tuple(probs.shape)}")
    return sorted_indices.numel() // topk


def token_unpermute(permuted_tokens: Tensor, sorted_indices: Tensor, probs: Tensor | None = None,
                    padded_mode: bool = False, restore_shape: list[int] | None = None) -> Tensor:
    """out[i] = sum_j probs[i, j] * permuted_tokens[sorted_indices[i * topk + j]], in float32."""
    tokens = _check_unpermute("npu_moe_token_unpermute", permuted_tokens, sorted_indices, probs, padded_mode)
    acc = compute_dtype(permuted_tokens.dtype)
    picked, _ = _gather_slots(permuted_tokens.to(acc), sorted_indices)
    picked = picked.reshape(tokens, -1, permuted_tokens.shape[1])
    if probs is not None:
        picked = picked * probs.to(acc).unsqueeze(-1)
    return picked.sum(1).to(permuted_tokens.dtype)


def _token_unpermute_fake(permuted_tokens: Tensor, sorted_indices: Tensor, probs: Tensor | None = None,
                          padded_mode: bool = False, restore_shape: list[int] | None = None) -> Tensor:
    tokens = _check_unpermute("npu_moe_token_unpermute", permuted_tokens, sorted_indices, probs, padded_mode)
    return permuted_tokens.new_empty((tokens, permuted_tokens.shape[1]))


def _unpermute_grad(op: str, grad_unpermuted_tokens: Tensor, sorted_indices: Tensor, permuted_tokens_size_0: int,
                    permuted_tokens_dtype: torch.dtype, probs: Tensor | None, padded_mode: bool,
                    permuted_tokens: Tensor | None) -> tuple[Tensor, Tensor]:
    """(grad of permuted_tokens, grad of probs); the second is empty without probs (the NPU's is undefined)."""
    tokens = _check_unpermute(op, permuted_tokens, sorted_indices, probs, padded_mode)
    check_shape(op, "grad_unpermuted_tokens", grad_unpermuted_tokens, (tokens, grad_unpermuted_tokens.shape[-1]),
                "(tokens, hidden)")
    check(probs is None or permuted_tokens is not None, op, "permuted_tokens is needed for the gradient of probs")
    acc = compute_dtype(grad_unpermuted_tokens.dtype)
    hidden = grad_unpermuted_tokens.shape[1]
    topk = sorted_indices.numel() // tokens if tokens else 1
    slot_grads = grad_unpermuted_tokens.to(acc).unsqueeze(1).expand(tokens, topk, hidden)
    if probs is not None:
        slot_grads = slot_grads * probs.to(acc).unsqueeze(-1)
    kept = sorted_indices.long() < permuted_tokens_size_0
    destination = torch.where(kept, sorted_indices.long(), permuted_tokens_size_0)  # the last row is a spare
    grad_permuted = torch.zeros(permuted_tokens_size_0 + 1, hidden, dtype=acc, device=grad_unpermuted_tokens.device)
    grad_permuted.index_copy_(0, destination, slot_grads.reshape(-1, hidden))
    grad_permuted = grad_permuted[:-1].to(permuted_tokens_dtype)
    if probs is None or permuted_tokens is None:
        return grad_permuted, grad_unpermuted_tokens.new_empty((0,))
    picked, _ = _gather_slots(permuted_tokens.to(acc), sorted_indices)
    grad_probs = (picked.reshape(tokens, topk, hidden) * grad_unpermuted_tokens.to(acc).unsqueeze(1)).sum(-1)
    return grad_permuted, grad_probs.to(probs.dtype)


def token_unpermute_grad_v2(grad_unpermuted_tokens: Tensor, sorted_indices: Tensor, permuted_tokens_size_0: int,
                            permuted_tokens_dtype: torch.dtype, probs: Tensor | None = None,
                            padded_mode: bool = False, restore_shape: list[int] | None = None,
                            permuted_tokens: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _unpermute_grad("npu_moe_token_unpermute_grad_v2", grad_unpermuted_tokens, sorted_indices,
                           permuted_tokens_size_0, permuted_tokens_dtype, probs, padded_mode, permuted_tokens)


def _token_unpermute_grad_v2_fake(grad_unpermuted_tokens: Tensor, sorted_indices: Tensor,
                                  permuted_tokens_size_0: int, permuted_tokens_dtype: torch.dtype,
                                  probs: Tensor | None = None, padded_mode: bool = False,
                                  restore_shape: list[int] | None = None,
                                  permuted_tokens: Tensor | None = None) -> tuple[Tensor, Tensor]:
    _check_unpermute("npu_moe_token_unpermute_grad_v2", permuted_tokens, sorted_indices, probs, padded_mode)
    grad = grad_unpermuted_tokens.new_empty((permuted_tokens_size_0, grad_unpermuted_tokens.shape[1]),
                                            dtype=permuted_tokens_dtype)
    return grad, (torch.empty_like(probs) if probs is not None else grad_unpermuted_tokens.new_empty((0,)))


def token_unpermute_grad(permuted_tokens: Tensor, grad_unpermuted_tokens: Tensor, sorted_indices: Tensor,
                         probs: Tensor | None = None, padded_mode: bool = False,
                         restore_shape: list[int] | None = None) -> tuple[Tensor, Tensor]:
    return _unpermute_grad("npu_moe_token_unpermute_grad", grad_unpermuted_tokens, sorted_indices,
                           permuted_tokens.shape[0], permuted_tokens.dtype, probs, padded_mode, permuted_tokens)


def _token_unpermute_grad_fake(permuted_tokens: Tensor, grad_unpermuted_tokens: Tensor, sorted_indices: Tensor,
                               probs: Tensor | None = None, padded_mode: bool = False,
                               restore_shape: list[int] | None = None) -> tuple[Tensor, Tensor]:
    return _token_unpermute_grad_v2_fake(grad_unpermuted_tokens, sorted_indices, permuted_tokens.shape[0],
                                         permuted_tokens.dtype, probs, padded_mode, restore_shape, permuted_tokens)


def _unpermute_setup(ctx, inputs, output) -> None:
    permuted, sorted_indices, probs, ctx.padded_mode, ctx.restore_shape = inputs
    ctx.rows, ctx.dtype, ctx.has_probs = permuted.shape[0], permuted.dtype, probs is not None
    # torch_npu keeps permuted_tokens only when probs needs it (MoeTokenUnpermuteKernelNpuOpApi.cpp).
    ctx.save_for_backward(sorted_indices, probs, permuted if probs is not None else None)


def _unpermute_autograd(ctx, grad: Tensor) -> tuple[Tensor, None, Tensor | None, None, None]:
    sorted_indices, probs, permuted = ctx.saved_tensors
    grad_permuted, grad_probs = torch.ops.npu.npu_moe_token_unpermute_grad_v2(
        grad, sorted_indices, ctx.rows, ctx.dtype, probs, ctx.padded_mode, ctx.restore_shape, permuted)
    return grad_permuted, None, grad_probs if ctx.has_probs else None, None, None


implement(UNPERMUTE, token_unpermute, _token_unpermute_fake)
implement(UNPERMUTE_GRAD, token_unpermute_grad, _token_unpermute_grad_fake)
implement(UNPERMUTE_GRAD_V2, token_unpermute_grad_v2, _token_unpermute_grad_v2_fake)
register_autograd(UNPERMUTE, _unpermute_autograd, setup_context=_unpermute_setup)
