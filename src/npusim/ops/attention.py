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
[Layouts of the overrideable attention ops]). The backward also gives the mask
its gradient, which CPU's flash kernel has not (See Note [The gradient of
attn_bias]).
"""

from __future__ import annotations

import torch
from torch import Tensor

aten = torch.ops.aten
_lib: torch.library.Library | None = None  # made by register(); the registrations live as long as it does


# Note [Layouts of the overrideable attention ops]
# The overrideable ops' contract is their meta kernel (torch/_meta_registrations.py): the
# output laid out like the query, a contiguous (B, H, L) log-sum-exp, each gradient
# ``empty_like`` its input: the input's strides when the input is dense, else dense strides
# in the input's dimension order (q, k, v split from one packed projection have gaps, so
# their gradients are denser than they are). CPU's flash kernels return the log-sum-exp as a
# transposed (B, L, H) tensor and the gradients permuted, and torch.compile, which plans
# buffers from the meta kernel, checks the strides it gets (assert_size_stride). So each
# result is compared with what the meta kernel itself returns for meta tensors of the same
# layouts, one decision in one place, and one whose strides differ is copied into that
# layout: the same values (the log-sum-exp is B*H*L numbers; the gradients cost one copy
# each). The log-sum-exp keeps CPU's dtype (float64 for float64 input, where the meta kernel
# says float32), which the backward kernel needs for CPU's result.


def _on_meta(*tensors: Tensor | None) -> list[Tensor | None]:
    return [None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            for t in tensors]


def _laid_out_as(t: Tensor, like: Tensor) -> Tensor:
    """``t``, or a copy of it with the strides of ``like`` (a meta tensor of the contract's layout;
    See Note [Layouts of the overrideable attention ops])."""
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
    gradients from CPU's flash backward kernel, and, when ``grad_input_mask[3]`` asks for it,
    the gradient of ``attn_bias`` (See Note [The gradient of attn_bias]), each laid out as the
    op's meta kernel promises (See Note [Layouts of the overrideable attention ops])."""
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    grad_bias = None
    if grad_input_mask[3] and attn_bias is not None:
        grad_bias = _attn_bias_grad(grad_out, query, key, value, attn_bias, is_causal, scale)
    metas = aten._scaled_dot_product_fused_attention_overrideable_backward(
        *_on_meta(grad_out, query, key, value, attn_bias), grad_input_mask,
        *_on_meta(out, logsumexp, cum_seq_q, cum_seq_k), max_q, max_k, dropout_p, is_causal,
        *_on_meta(philox_seed, philox_offset), scale=scale)
    return tuple(None if g is None else _laid_out_as(g, meta)
                 for g, meta in zip((*grads, grad_bias), metas, strict=True))


# Note [The gradient of attn_bias]
# CPU's flash backward gives no gradient for the additive mask, and CUDA's math path does (and
# PyTorch's backend tests ask the overrideable op for one). The mask enters as scores =
# q @ k^T * scale + attn_bias, so its gradient is the gradient of the scores, the softmax
# backward P * (dP - rowsum(P * dP)) with P = softmax(scores) and dP = grad_out @ v^T, summed
# over the dimensions the mask was broadcast along (as autograd reduces an expanded tensor's
# gradient). It is recomputed here as the math path computes it: in float32 for half and
# bfloat16 inputs (the math path's default precision), key and value heads repeated for grouped
# query heads, a causal mask as the top-left lower triangle, and a row masked everywhere giving
# zero gradient (the math path's _safe_softmax). The B*H*L*S scores are what math allocates too.


def _attn_bias_grad(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, attn_bias: Tensor,
                    is_causal: bool, scale: float | None) -> Tensor:
    """The gradient of ``attn_bias``, in its shape and dtype (See Note [The gradient of attn_bias])."""
    if query.size(-3) % key.size(-3) != 0:
        raise RuntimeError(
            f"_scaled_dot_product_fused_attention_overrideable_backward on {query.device}: the query's "
            f"{query.size(-3)} heads must be a multiple of the key's {key.size(-3)}")
    compute = torch.promote_types(query.dtype, torch.float32)
    groups = query.size(-3) // key.size(-3)
    q, k, v, d_out = (t.to(compute) for t in (query, key, value, grad_out))
    if groups > 1:
        k, v = (t.repeat_interleave(groups, dim=-3) for t in (k, v))
    scale = scale if scale is not None else query.size(-1) ** -0.5
    scores = (q @ k.transpose(-2, -1)).mul_(scale).add_(attn_bias.to(compute))
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril_()
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = aten._safe_softmax(scores, -1)
    d_probs = d_out @ v.transpose(-2, -1)
    d_scores = probs * (d_probs - (probs * d_probs).sum(-1, keepdim=True))
    return d_scores.sum_to_size(attn_bias.shape).to(attn_bias.dtype)


def register() -> None:
    """Registers the npu kernels of the overrideable fused-attention ops (idempotent)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_scaled_dot_product_fused_attention_overrideable", fused_attention, "PrivateUse1")
    _lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", fused_attention_backward, "PrivateUse1")
