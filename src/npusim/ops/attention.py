"""The npu's fused attention: PyTorch's "overrideable" SDPA kernels, run as CPU's flash kernels.

``F.scaled_dot_product_attention`` on npu tensors takes the fused kernel where
CPU takes its flash kernel (the choice is CPU's, made in
``csrc/aten/attention.cpp``; see Note [Fused attention on the npu] there) and calls
``aten::_scaled_dot_product_fused_attention_overrideable``, PyTorch's slot for
a backend's own fused kernel, whose autograd formula calls the ``_backward``
op. Both are implemented here with CPU's flash kernels
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which the
fallback runs on device memory in stream order: the results are bit-equal to
CPU's, forward and backward, in the layouts the ops' contract gives (See Note
[Layouts of the overrideable attention ops]).
"""

from __future__ import annotations

import torch
from torch import Tensor

aten = torch.ops.aten
_lib: torch.library.Library | None = None  # made by register(); the registrations live as long as it does


# Note [Layouts of the overrideable attention ops]
# The overrideable ops' contract is their meta kernel (torch/_meta_registrations.py): the
# output laid out like the query, a contiguous (B, H, L) log-sum-exp, gradients laid out like
# their inputs. CPU's flash kernels return the log-sum-exp as a transposed (B, L, H) tensor and
# the gradients permuted, and torch.compile, which plans buffers from the meta kernel, checks
# the strides it gets. So a result whose strides differ is copied into the contract's layout:
# the same values (the log-sum-exp is B*H*L numbers; the gradients cost one copy each). The
# log-sum-exp keeps CPU's dtype (float64 for float64 input, where the meta kernel says float32),
# which the backward kernel needs for CPU's result.


def _on_meta(*tensors: Tensor | None) -> list[Tensor | None]:
    return [None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            for t in tensors]


def _laid_out_as(t: Tensor, like: Tensor) -> Tensor:
    """``t``, or a copy of it with ``like``'s strides (See Note [Layouts of the overrideable attention ops])."""
    if t.stride() == like.stride():
        return t
    return torch.empty_strided(like.shape, like.stride(), dtype=t.dtype, device=t.device).copy_(t)


def fused_attention(query: Tensor, key: Tensor, value: Tensor, attn_bias: Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, return_debug_mask: bool = False,
                    *, scale: float | None = None) -> tuple[Tensor | int | None, ...]:
    """``_scaled_dot_product_fused_attention_overrideable``: the output and its log-sum-exp from
    CPU's flash kernel; no cumulative sequence lengths (dense inputs), the sequence lengths, empty
    Philox seed and offset (the kernel draws no random numbers: SDPA with dropout takes math, as on
    CPU), and no debug mask."""
    if dropout_p > 0.0:
        raise NotImplementedError(
            f"_scaled_dot_product_fused_attention_overrideable on {query.device}: dropout_p must be 0 "
            f"(npu's fused kernel is CPU's flash kernel, which has no dropout), got {dropout_p}; "
            "F.scaled_dot_product_attention takes the math path for dropout, as on CPU")
    if return_debug_mask:
        raise NotImplementedError(
            f"_scaled_dot_product_fused_attention_overrideable on {query.device}: return_debug_mask=True is "
            "not supported (CPU's flash kernel has no debug mask)")
    out, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    meta_out, meta_lse = aten._scaled_dot_product_fused_attention_overrideable(
        *_on_meta(query, key, value, attn_bias), dropout_p, is_causal, scale=scale)[:2]
    no_rng = torch.empty((), dtype=torch.long)
    return (_laid_out_as(out, meta_out), _laid_out_as(logsumexp, meta_lse), None, None, query.size(-2),
            key.size(-2), no_rng, no_rng, None)


def fused_attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                             attn_bias: Tensor | None, grad_input_mask: list[bool], out: Tensor,
                             logsumexp: Tensor, cum_seq_q: Tensor | None, cum_seq_k: Tensor | None, max_q: int,
                             max_k: int, dropout_p: float, is_causal: bool, philox_seed: Tensor,
                             philox_offset: Tensor, *, scale: float | None = None) -> tuple[Tensor | None, ...]:
    """``_scaled_dot_product_fused_attention_overrideable_backward``: the query, key and value
    gradients from CPU's flash backward kernel. It gives no gradient for the mask: a mask that
    needs one makes F.scaled_dot_product_attention take math (CPU's choice), and asking this op
    for one directly is an error."""
    if grad_input_mask[3] and attn_bias is not None:
        raise NotImplementedError(
            f"_scaled_dot_product_fused_attention_overrideable_backward on {query.device}: no gradient for "
            "attn_bias (CPU's flash kernel has none); F.scaled_dot_product_attention takes the math path for a "
            "mask that requires grad")
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    # The op's contract: each gradient laid out like its input (CPU's kernel returns them permuted).
    return (*(_laid_out_as(g, t) for g, t in zip(grads, (query, key, value), strict=True)), None)


def register() -> None:
    """Registers the npu kernels of the overrideable fused-attention ops (idempotent)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_scaled_dot_product_fused_attention_overrideable", fused_attention, "PrivateUse1")
    _lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", fused_attention_backward, "PrivateUse1")
