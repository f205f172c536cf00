"""MoE gating: ``npu_moe_gating_top_k_softmax`` and ``npu_moe_gating_top_k`` (+ backward).

Formulas and the equivalent reference code from op-plugin's docs
(``torch_npu-npu_moe_gating_top_k_softmax.md``, ``torch_npu-npu_moe_gating_top_k.md``) and
tests (``test_npu_moe_gating_top_k_softmax.py``, ``test_npu_moe_gating_top_k_backward.py``).
Scores are computed in float32; ties between equal scores go to the lower expert index, as
the references' stable argsort does. torch_npu marks npu_moe_gating_top_k_softmax not
differentiable (AutogradErrorFallback.cpp); npu_moe_gating_top_k differentiates its routing
weights ``y`` through ``npu_moe_gating_top_k_backward`` (derivatives.yaml).
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, check_dim, check_dtype, check_same_dtype, check_shape, compute_dtype, upcast
from npusim.ops.fused._library import define, implement, no_derivative, register_autograd

TOP_K_SOFTMAX = define("npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) "
                       "-> (Tensor, Tensor, Tensor)")
TOP_K = define("npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, "
               "Tensor? tid2eid=None, int k_group=1, int group_count=1, int group_select_mode=0, int renorm=0, "
               "int norm_type=0, bool out_flag=False, float routed_scaling_factor=1.0, float eps=1e-20) "
               "-> (Tensor, Tensor, Tensor)")
TOP_K_BACKWARD = define("npu_moe_gating_top_k_backward(Tensor x_norm, Tensor grad_y, Tensor expertIdx, *, "
                        "int renorm=0, int norm_type=0, float routed_scaling_factor=1.0, float eps=1e-20) -> Tensor")

_INDEX = (torch.int32, torch.int64)


def _top_k(scores: Tensor, k: int) -> Tensor:
    """The indices of the k largest scores along the last dimension, ties to the lower index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


# -- npu_moe_gating_top_k_softmax ----------------------------------------------------------------------------------

def _check_top_k_softmax(x: Tensor, finished: Tensor | None, k: int) -> None:
    op = "npu_moe_gating_top_k_softmax"
    check_dtype(op, "x", x)
    check_dim(op, "x", x, (2, 3))
    check(0 < k <= min(x.shape[-1], 1024), op, f"k must be in [1, min(experts {x.shape[-1]}, 1024)], got {k}")
    if finished is not None:
        check_dtype(op, "finished", finished, (torch.bool,))
        check_shape(op, "finished", finished, x.shape[:-1], "x's shape without the experts")


def top_k_softmax(x: Tensor, finished: Tensor | None = None, k: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """(top-k softmax weights in x's dtype, their experts, row_idx) with row_idx[i, j] = j * rows + i.

    A finished row's experts are the expert count (no expert), as op-plugin's reference sets them.
    """
    _check_top_k_softmax(x, finished, k)
    probs = torch.softmax(upcast(x), dim=-1)
    experts = _top_k(probs, k)
    y = probs.gather(-1, experts).to(x.dtype)
    if finished is not None:
        experts = experts.masked_fill(finished.unsqueeze(-1), x.shape[-1])
    rows = x.numel() // x.shape[-1]
    row_idx = (torch.arange(k, device=x.device).unsqueeze(0) * rows
               + torch.arange(rows, device=x.device).unsqueeze(1)).reshape(*x.shape[:-1], k)
    return y, experts.to(torch.int32), row_idx.to(torch.int32)


def _top_k_softmax_fake(x: Tensor, finished: Tensor | None = None, k: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    _check_top_k_softmax(x, finished, k)
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


implement(TOP_K_SOFTMAX, top_k_softmax, _top_k_softmax_fake)
no_derivative(TOP_K_SOFTMAX)


# -- npu_moe_gating_top_k ------------------------------------------------------------------------------------------

def _check_top_k(x: Tensor, k: int, bias: Tensor | None, input_ids: Tensor | None, tid2eid: Tensor | None,
                 k_group: int, group_count: int, group_select_mode: int, renorm: int, norm_type: int) -> None:
    op = "npu_moe_gating_top_k"
    check_dtype(op, "x", x)
    check_dim(op, "x", x, (2,))
    experts = x.shape[1]
    check(experts <= 2048, op, f"x's last dimension (experts) must be at most 2048, got {experts}")
    if bias is not None:
        check_shape(op, "bias", bias, (experts,), "one value per expert")
        check_same_dtype(op, "x", {"x": x, "bias": bias})
    check((input_ids is None) == (tid2eid is None), op, "input_ids and tid2eid must be given together or not at all")
    if input_ids is not None and tid2eid is not None:
        check_dtype(op, "input_ids", input_ids, _INDEX)
        check_dtype(op, "tid2eid", tid2eid, _INDEX)
        check_shape(op, "input_ids", input_ids, (x.shape[0],), "one id per row of x")
        check(tid2eid.dim() == 2 and tid2eid.shape[1] == k, op,
              f"tid2eid must be 2-D with k ({k}) columns, got shape {tuple(tid2eid.shape)}")
    check(renorm == 0, op, f"renorm must be 0 (norm before top-k, the only mode op-plugin supports), got {renorm}")
    check(norm_type in (0, 1), op, f"norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")
    check(group_select_mode in (0, 1), op, f"group_select_mode must be 0 (max) or 1 (top-2 sum), got "
                                           f"{group_select_mode}")
    check(group_count > 0 and experts % group_count == 0 and experts // group_count > 2, op,
          f"group_count must divide the {experts} experts into groups of more than 2, got {group_count}")
    check(1 <= k_group <= group_count, op, f"k_group must be in [1, group_count ({group_count})], got {k_group}")
    most = experts // group_count * k_group
    check(1 <= k <= most, op, f"k must be in [1, experts / group_count * k_group ({most})], got {k}")


def _norm(x: Tensor, norm_type: int) -> Tensor:
    acc = upcast(x)
    return torch.softmax(acc, dim=-1) if norm_type == 0 else torch.sigmoid(acc)


def _select(scores: Tensor, k: int, k_group: int, group_count: int, group_select_mode: int) -> Tensor:
    """The k experts of each row, chosen among the k_group best of group_count expert groups."""
    if group_count > 1:
        grouped = scores.reshape(scores.shape[0], group_count, -1)
        if group_select_mode == 0:
            group_scores = grouped.amax(-1)
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, _top_k(group_scores, k_group), True)
        scores = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).reshape(scores.shape)
    return _top_k(scores, k)


def _weights(norm: Tensor, experts: Tensor, norm_type: int, routed_scaling_factor: float, eps: float) -> Tensor:
    y = norm.gather(1, experts)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    return y * routed_scaling_factor


def top_k(x: Tensor, k: int, *, bias: Tensor | None = None, input_ids: Tensor | None = None,
          tid2eid: Tensor | None = None, k_group: int = 1, group_count: int = 1, group_select_mode: int = 0,
          renorm: int = 0, norm_type: int = 0, out_flag: bool = False, routed_scaling_factor: float = 1.0,
          eps: float = 1e-20) -> tuple[Tensor, Tensor, Tensor]:
    """(routing weights y in x's dtype, experts (int32), norm(x) in float32).

    norm is softmax (norm_type 0) or sigmoid (1); experts are chosen by norm + bias, within
    the k_group best groups, or read from tid2eid[input_ids] (hash mode); y is norm at the
    chosen experts, renormalized to sum 1 for sigmoid, times routed_scaling_factor. The norm
    output is always computed (the backward needs it); out_flag only says the caller wants it.
    """
    _check_top_k(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm, norm_type)
    norm = _norm(x, norm_type)
    if input_ids is not None and tid2eid is not None:
        experts = tid2eid.index_select(0, input_ids.long()).long()
    else:
        scores = norm + bias.to(norm.dtype) if bias is not None else norm
        experts = _select(scores, k, k_group, group_count, group_select_mode)
    y = _weights(norm, experts, norm_type, routed_scaling_factor, eps)
    return y.to(x.dtype), experts.to(torch.int32), norm


def _top_k_fake(x: Tensor, k: int, *, bias: Tensor | None = None, input_ids: Tensor | None = None,
                tid2eid: Tensor | None = None, k_group: int = 1, group_count: int = 1, group_select_mode: int = 0,
                renorm: int = 0, norm_type: int = 0, out_flag: bool = False, routed_scaling_factor: float = 1.0,
                eps: float = 1e-20) -> tuple[Tensor, Tensor, Tensor]:
    _check_top_k(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm, norm_type)
    return (x.new_empty((x.shape[0], k)), x.new_empty((x.shape[0], k), dtype=torch.int32),
            x.new_empty(x.shape, dtype=compute_dtype(x.dtype)))


def _check_top_k_backward(x_norm: Tensor, grad_y: Tensor, expert_idx: Tensor, renorm: int, norm_type: int) -> None:
    op = "npu_moe_gating_top_k_backward"
    check_dim(op, "x_norm", x_norm, (2,))
    check_dtype(op, "grad_y", grad_y)
    check_dtype(op, "expertIdx", expert_idx, _INDEX)
    check_shape(op, "expertIdx", expert_idx, grad_y.shape, "the shape of grad_y")
    check(grad_y.dim() == 2 and grad_y.shape[0] == x_norm.shape[0], op,
          f"grad_y must be (rows of x_norm {x_norm.shape[0]}, k), got {tuple(grad_y.shape)}")
    check(renorm == 0, op, f"renorm must be 0, got {renorm}")
    check(norm_type in (0, 1), op, f"norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")


def top_k_backward(x_norm: Tensor, grad_y: Tensor, expert_idx: Tensor, *, renorm: int = 0, norm_type: int = 0,
                   routed_scaling_factor: float = 1.0, eps: float = 1e-20) -> Tensor:
    """The gradient of x from that of y, through the renormalization (sigmoid) and the norm."""
    _check_top_k_backward(x_norm, grad_y, expert_idx, renorm, norm_type)
    norm = x_norm.to(compute_dtype(grad_y.dtype))
    g = grad_y.to(norm.dtype) * routed_scaling_factor
    experts = expert_idx.long()
    if norm_type == 1:
        s = norm.gather(1, experts)
        total = s.sum(-1, keepdim=True) + eps
        g = g / total - (g * s).sum(-1, keepdim=True) / (total * total)
    d_norm = torch.zeros_like(norm).scatter_add_(1, experts, g)
    if norm_type == 0:
        dx = norm * (d_norm - (d_norm * norm).sum(-1, keepdim=True))
    else:
        dx = d_norm * norm * (1 - norm)
    return dx.to(grad_y.dtype)


def _top_k_backward_fake(x_norm: Tensor, grad_y: Tensor, expert_idx: Tensor, *, renorm: int = 0,
                         norm_type: int = 0, routed_scaling_factor: float = 1.0, eps: float = 1e-20) -> Tensor:
    _check_top_k_backward(x_norm, grad_y, expert_idx, renorm, norm_type)
    return x_norm.new_empty(x_norm.shape, dtype=grad_y.dtype)


def _top_k_setup(ctx, inputs, keyword_only_inputs, output) -> None:
    ctx.options = {name: keyword_only_inputs[name] for name in ("renorm", "norm_type", "routed_scaling_factor", "eps")}
    ctx.save_for_backward(output[2], output[1])


def _top_k_autograd(ctx, grad_y: Tensor, _dexperts: Tensor | None, _dnorm: Tensor | None) -> tuple[Tensor, None]:
    # Only y is differentiable (derivatives.yaml: output_differentiability [true, false, false]).
    norm, experts = ctx.saved_tensors
    return torch.ops.npu.npu_moe_gating_top_k_backward(norm, grad_y, experts, **ctx.options), None


implement(TOP_K, top_k, _top_k_fake)
implement(TOP_K_BACKWARD, top_k_backward, _top_k_backward_fake)
register_autograd(TOP_K, _top_k_autograd, setup_context=_top_k_setup)
