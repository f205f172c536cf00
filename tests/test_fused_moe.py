"""op-plugin's MoE operators on npu (gating top-k, init / finalize routing, token permute / unpermute, grouped matmul)
against their documented reference code, and a deepseek-style MoE block built from them that trains as the same
block written with plain PyTorch ops."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing import assert_close

from _fused_util import DTYPES, assert_device_errors, assert_matches, gradcheck, opcheck, randn
from npusim.compat import torch_npu as torch_npu_shim

ops = torch.ops.npu


def _experts(rows: int, k: int, experts: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, experts, (rows, k), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


# -- gating --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 8), (2, 3, 8)])
def test_moe_gating_top_k_softmax(dtype, shape):
    """Top-k of softmax(x); finished rows get the expert count; row_idx[i, j] = j * rows + i (op-plugin's test)."""
    x = randn(*shape, dtype=dtype)
    finished = torch.rand(shape[:-1], generator=torch.Generator().manual_seed(1)) > 0.5
    y, experts, row_idx = ops.npu_moe_gating_top_k_softmax(x.npu(), finished.npu(), 3)
    probs = torch.softmax(x.float(), -1)
    order = torch.from_numpy(np.argsort(-probs.numpy(), axis=-1, kind="stable")[..., :3].copy())
    rows = x.numel() // shape[-1]
    ref_rows = torch.arange(rows * 3).reshape(3, rows).t().reshape(*shape[:-1], 3)
    assert_matches(y, probs.gather(-1, order))
    assert torch.equal(experts.cpu(), torch.where(finished.unsqueeze(-1), shape[-1], order).int())
    assert torch.equal(row_idx.cpu(), ref_rows.int())
    with pytest.raises(RuntimeError, match="derivative for npu::npu_moe_gating_top_k_softmax is not implemented"):
        ops.npu_moe_gating_top_k_softmax(x.npu().requires_grad_(), None, 2)[0].float().sum().backward()


def _reference_top_k(x, k, bias, k_group, group_count, group_select_mode, norm_type, scale, eps=1e-20):
    """torch_npu-npu_moe_gating_top_k.md's equivalent logic (numpy stable argsort), differentiable in x."""
    norm = torch.softmax(x.double(), -1) if norm_type == 0 else torch.sigmoid(x.double())
    scores = (norm + bias.double() if bias is not None else norm).detach().numpy()
    if group_count > 1:
        grouped = scores.reshape(scores.shape[0], group_count, -1)
        group_x = grouped.max(-1) if group_select_mode == 0 else np.sort(grouped, -1)[..., -2:].sum(-1)
        keep = np.argsort(-group_x, axis=-1, kind="stable")[:, :k_group]
        mask = np.ones(group_x.shape, bool)
        mask[np.arange(scores.shape[0])[:, None], keep] = False
        scores = np.where(mask[..., None], -np.inf, grouped).reshape(scores.shape[0], -1)
    experts = torch.from_numpy(np.argsort(-scores, axis=-1, kind="stable")[:, :k].copy())
    y = norm.gather(1, experts)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    return y * scale, experts, norm


_GATING = list(itertools.product((0, 1), (0, 1), (1, 4)))  # norm_type, group_select_mode, group_count


@pytest.mark.parametrize("norm_type, group_select_mode, group_count", _GATING)
def test_moe_gating_top_k_modes_forward_and_backward(norm_type, group_select_mode, group_count):
    """Softmax / sigmoid, max / top-2-sum group scores, grouped or not: y, experts, norm and dx (through
    npu_moe_gating_top_k_backward) equal the documented logic and its autograd."""
    x, bias, grad = randn(6, 16, scale=2), randn(16, seed=1), randn(6, 3, seed=2)
    k_group = 2 if group_count > 1 else 1
    xn = x.npu().requires_grad_()
    y, experts, norm = ops.npu_moe_gating_top_k(xn, 3, bias=bias.npu(), k_group=k_group, group_count=group_count,
                                                group_select_mode=group_select_mode, norm_type=norm_type,
                                                routed_scaling_factor=2.5)
    y.backward(grad.npu())
    xr = x.double().requires_grad_()
    ref_y, ref_experts, ref_norm = _reference_top_k(xr, 3, bias, k_group, group_count, group_select_mode, norm_type,
                                                    2.5)
    ref_y.backward(grad.double())
    assert torch.equal(experts.cpu(), ref_experts.int()) and experts.dtype == torch.int32
    assert_matches(y, ref_y.float())
    assert_matches(norm, ref_norm.float())
    assert_matches(xn.grad, xr.grad.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_moe_gating_top_k_16_bit(dtype):
    """16-bit x: scores in float32, y in x's dtype, norm in float32."""
    x, bias = randn(5, 12, dtype=dtype), randn(12, dtype=dtype, seed=1)
    y, experts, norm = ops.npu_moe_gating_top_k(x.npu(), 2, bias=bias.npu(), norm_type=1)
    ref_y, ref_experts, ref_norm = _reference_top_k(x.float(), 2, bias.float(), 1, 1, 0, 1, 1.0)
    assert y.dtype == dtype and norm.dtype == torch.float32
    assert torch.equal(experts.cpu(), ref_experts.int())
    assert_matches(y, ref_y.float())
    assert_matches(norm, ref_norm.float(), torch.float32)


def test_moe_gating_top_k_hash_mode_and_gradcheck():
    """input_ids / tid2eid give the experts directly; the backward passes gradcheck in float64 (both norms)."""
    x = randn(4, 9)
    tid2eid = torch.tensor([[1, 4], [7, 0], [2, 8]], dtype=torch.int32)
    input_ids = torch.tensor([2, 0, 0, 1], dtype=torch.int32)
    y, experts, norm = ops.npu_moe_gating_top_k(x.npu(), 2, input_ids=input_ids.npu(), tid2eid=tid2eid.npu(),
                                                norm_type=1)
    assert torch.equal(experts.cpu(), tid2eid[input_ids.long()])
    chosen = torch.sigmoid(x).gather(1, tid2eid[input_ids.long()].long())
    assert_matches(y, chosen / chosen.sum(-1, keepdim=True))
    bias = randn(9, seed=4).npu().double()
    for norm_type in (0, 1):
        gradcheck(lambda t, n=norm_type: ops.npu_moe_gating_top_k(t, 3, bias=bias, norm_type=n,
                                                                  routed_scaling_factor=1.5)[0], x)


# -- init / finalize routing ---------------------------------------------------------------------------------------

def test_moe_init_routing_v1():
    """expanded_x / expanded_row_idx / expanded_expert_idx of torch_npu-npu_moe_init_routing.md's reference."""
    n, k = 10, 2
    x = randn(n, 6).numpy()
    row_idx = np.arange(n * k).reshape([k, n]).transpose(1, 0).astype(np.int32)
    expert_idx = _experts(n, k, 5).numpy()
    order = np.argsort(expert_idx.reshape(-1), kind="stable")
    dst_to_src = row_idx.reshape(-1)[order]
    expanded_row_idx = np.zeros(dst_to_src.shape, np.int32)
    expanded_row_idx[dst_to_src] = np.arange(dst_to_src.shape[-1])
    out = ops.npu_moe_init_routing(*(torch.from_numpy(a).npu() for a in (x, row_idx, expert_idx)), 4)
    for got, want in zip(out, (x[dst_to_src[:4 * k] % n], expanded_row_idx, np.sort(expert_idx.reshape(-1))),
                         strict=True):
        assert torch.equal(got.cpu(), torch.from_numpy(want))


def _reference_init_routing_v2(x, expert_idx, scale, expert_range, row_idx_type, kind, drop_pad, active_num,
                               capacity, expert_num):
    """torch_npu-npu_moe_init_routing_v2.md's MoeInitRoutingV2CPU.cpu_op_exec, unquantized (zeros where undefined)."""
    start, end = expert_range
    rows, k = expert_idx.shape
    flat = expert_idx.copy().reshape(-1)
    total = int(np.sum((expert_idx >= start) & (expert_idx < end)))
    flat[flat < start] = np.iinfo(np.int32).max
    order = np.argsort(flat, kind="stable")
    sorted_experts = flat[order]
    if row_idx_type == 1:
        row_idx = order.astype(np.int32)
    else:
        row_idx = np.full(rows * k, -1, np.int32)
        row_idx[order[:total]] = np.arange(total)
    counts = np.bincount(sorted_experts[:total] - start, minlength=end - start).astype(np.int64)
    if kind == 0 and not drop_pad:
        counts = np.cumsum(counts)
    elif kind == 2 and not drop_pad:
        ids, cnt = np.unique(sorted_experts[:total], return_counts=True)
        counts = np.zeros((expert_num, 2), np.int64)
        counts[:len(ids), 0], counts[:len(ids), 1] = ids, cnt
    if not drop_pad:
        active = total if active_num in (0, -1) else min(active_num, total)
        out_rows = rows * k if active_num <= 0 else min(active_num, rows * k)
        expanded, expanded_scale = np.zeros((out_rows, x.shape[1]), x.dtype), np.zeros(out_rows, np.float32)
        expanded[:active], expanded_scale[:active] = x[order[:active] // k], scale[order[:active] // k]
        return expanded, row_idx, counts, expanded_scale
    slot_of = np.full(expert_num * capacity, -1)
    filled = np.zeros(expert_num, int)
    for position in range(total):
        expert = sorted_experts[position]
        if filled[expert] < capacity:
            slot_of[expert * capacity + filled[expert]] = order[position]
            filled[expert] += 1
    row_idx = np.full(rows * k, -1, np.int32)
    expanded = np.zeros((expert_num * capacity, x.shape[1]), x.dtype)
    expanded_scale = np.zeros(expert_num * capacity, np.float32)
    for i, source in enumerate(slot_of):
        if source != -1:
            row_idx[source], expanded[i], expanded_scale[i] = i, x[source // k], scale[source // k]
    return expanded.reshape(expert_num, capacity, -1), row_idx, counts, expanded_scale


_V2_MODES = [(0, 0, 0, [0, 8], -1), (0, 1, 1, [0, 8], -1), (0, 0, 2, [0, 8], 7), (0, 0, 1, [2, 6], -1),
             (0, 1, 0, [2, 6], 7), (0, 0, 2, [3, 5], 5), (1, 0, 1, [0, 8], -1)]


@pytest.mark.parametrize("drop_pad, row_idx_type, kind, expert_range, active_num", _V2_MODES)
def test_moe_init_routing_v2_modes(drop_pad, row_idx_type, kind, expert_range, active_num):
    """Dropless and drop/pad, gather and scatter indices, cumsum / count / key-value counts, active ranges and
    active_num against the documented reference."""
    n, k, experts, capacity = 6, 3, 8, 2
    x, scale = randn(n, 4).numpy(), randn(n, seed=1).numpy()
    expert_idx = _experts(n, k, experts).numpy()
    want = _reference_init_routing_v2(x, expert_idx, scale, expert_range, row_idx_type, kind, drop_pad, active_num,
                                      capacity, experts)
    got = ops.npu_moe_init_routing_v2(
        torch.from_numpy(x).npu(), torch.from_numpy(expert_idx).npu(), scale=torch.from_numpy(scale).npu(),
        active_num=active_num, expert_capacity=capacity, expert_num=experts, drop_pad_mode=drop_pad,
        expert_tokens_num_type=kind, expert_tokens_num_flag=True, active_expert_range=expert_range,
        row_idx_type=row_idx_type)
    for name, g, w in zip(("expanded_x", "expanded_row_idx", "counts", "expanded_scale"), got, want, strict=True):
        assert torch.equal(g.cpu(), torch.from_numpy(np.asarray(w)).to(g.dtype)), name


@pytest.mark.parametrize("dtype", [*DTYPES, torch.int8])
def test_moe_init_routing_v2_keeps_x_dtype(dtype):
    """expanded_x has x's dtype and exactly x's rows (routing copies, no arithmetic); int8 x too, as op-plugin's
    docs and its test_npu_moe_init_routing_no_quant have it."""
    x = torch.randint(-128, 128, (5, 8), dtype=dtype) if dtype == torch.int8 else randn(5, 8, dtype=dtype)
    expert_idx = _experts(5, 2, 4)
    expanded, row_idx, _, _ = ops.npu_moe_init_routing_v2(x.npu(), expert_idx.npu(), expert_num=4)
    order = torch.from_numpy(np.argsort(expert_idx.reshape(-1).numpy(), kind="stable"))
    assert expanded.dtype == dtype and torch.equal(expanded.cpu(), x[order // 2])
    assert torch.equal(row_idx.cpu().long()[order], torch.arange(10))


def _reference_finalize(rows, skip1, skip2, bias, scales, dst, experts, drop_pad_mode, k):
    """torch_npu-npu_moe_finalize_routing.md's moe_finalize_routing_np (row arrangement for modes 2 and 3)."""
    nk = dst.shape[0]
    choices = scales.shape[1] if scales is not None else k
    tokens, hidden = nk // choices, rows.shape[-1]
    flat = rows.reshape(-1, hidden)
    out = (skip1 if skip1 is not None else 0) + (skip2 if skip2 is not None else 0) + np.zeros((tokens, hidden))
    for i in range(tokens):
        for j in range(choices):
            value = dst[j * tokens + i] if drop_pad_mode in (0, 1) else dst[i * choices + j]
            row = 0 if value == -1 else flat[value]
            weight = scales[i, j] if scales is not None else 1.0
            out[i] += weight * (row + (bias[experts[i, j]] if bias is not None else 0))
    return out


@pytest.mark.parametrize("drop_pad_mode", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_finalize_routing(drop_pad_mode, dtype):
    """skip1 + skip2 + sum_k scales * (rows[dst] + bias[expert]) in column / row order, dropless and drop/pad."""
    n, k, e, c, h = 5, 2, 4, 3, 6
    gen = np.random.default_rng(drop_pad_mode)
    if drop_pad_mode in (1, 3):
        rows = randn(e, c, h, dtype=dtype)
        dst = gen.choice(np.arange(-1, e * c), n * k, replace=False).astype(np.int32)
    else:
        rows = randn(n * k, h, dtype=dtype)
        dst = gen.permutation(n * k).astype(np.int32)
    skip1, skip2, bias = randn(n, h, dtype=dtype, seed=1), randn(n, h, dtype=dtype, seed=2), randn(e, h, dtype=dtype,
                                                                                                    seed=3)
    scales, experts = randn(n, k, dtype=dtype, seed=4), _experts(n, k, e)
    out = ops.npu_moe_finalize_routing(rows.npu(), skip1.npu(), skip2.npu(), bias.npu(), scales.npu(),
                                       torch.from_numpy(dst).npu(), experts.npu(), drop_pad_mode)
    want = _reference_finalize(*(t.double().numpy() for t in (rows, skip1, skip2, bias, scales)), dst,
                               experts.numpy(), drop_pad_mode, k)
    assert out.dtype == dtype and out.shape == (n, h)
    assert_matches(out, torch.from_numpy(want).float())


def test_moe_finalize_routing_without_scales_uses_k():
    """With scales None the choices come from k and each slot counts once; init routing v1 then finalize is x."""
    n, k = 7, 3
    x, expert_idx = randn(n, 4), _experts(n, k, 5)
    row_idx = torch.arange(n * k, dtype=torch.int32).reshape(k, n).t().contiguous()
    expanded, expanded_row_idx, _ = ops.npu_moe_init_routing(x.npu(), row_idx.npu(), expert_idx.npu(), n)
    summed = ops.npu_moe_finalize_routing(expanded, None, None, None, None, expanded_row_idx, None, 0, k)
    assert_matches(summed, x * k)


def test_routing_ops_have_no_derivative():
    """init routing (v1, v2) and finalize routing run under autograd; a backward through them raises."""
    x, expert_idx = randn(4, 3).npu().requires_grad_(), _experts(4, 2, 3).npu()
    out = ops.npu_moe_init_routing_v2(x, expert_idx, expert_num=3)[0]
    with pytest.raises(RuntimeError, match="derivative for npu::npu_moe_init_routing_v2 is not implemented"):
        out.sum().backward()
    rows = randn(8, 3).npu().requires_grad_()
    out = ops.npu_moe_finalize_routing(rows, None, None, None, None, torch.arange(8, dtype=torch.int32).npu(), None,
                                       0, 2)
    with pytest.raises(RuntimeError, match="derivative for npu::npu_moe_finalize_routing is not implemented"):
        out.sum().backward()


# -- token permute / unpermute -------------------------------------------------------------------------------------

def _reference_permute(tokens, indices, num_out_tokens):
    """op-plugin's test: permute by the stable argsort; npu's sorted_indices is the argsort of that argsort."""
    topk = 1 if indices.dim() == 1 else indices.size(1)
    first = torch.argsort(indices.reshape(-1), stable=True)
    if num_out_tokens:
        first = first[:num_out_tokens]
    return tokens.index_select(0, first // topk), torch.argsort(torch.argsort(indices.reshape(-1), stable=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("topk, num_out_tokens", [(1, None), (3, None), (3, 11)])
def test_moe_token_permute_and_unpermute(dtype, topk, num_out_tokens):
    """permute / unpermute against op-plugin's reference, with their gradients (the *_grad_v2 ops)."""
    n, h = 6, 5
    tokens = randn(n, h, dtype=dtype)
    indices = _experts(n, topk, 4).long().squeeze(1) if topk == 1 else _experts(n, topk, 4).long()
    probs = randn(n, topk, dtype=dtype, seed=1) if topk > 1 else None
    tn = tokens.npu().requires_grad_()
    permuted, sorted_indices = ops.npu_moe_token_permute(tn, indices.npu(), num_out_tokens)
    ref_permuted, ref_sorted = _reference_permute(tokens.float(), indices, num_out_tokens)
    assert torch.equal(sorted_indices.cpu().long(), ref_sorted) and sorted_indices.dtype == torch.int32
    assert_matches(permuted, ref_permuted)
    pn = probs.npu().requires_grad_() if probs is not None else None
    out = ops.npu_moe_token_unpermute(permuted, sorted_indices, pn)
    grad = randn(n, h, dtype=dtype, seed=2)
    out.backward(grad.npu())
    tr = tokens.float().requires_grad_()
    pr = probs.float().requires_grad_() if probs is not None else None
    kept = torch.cat([_reference_permute(tr, indices, num_out_tokens)[0],
                      torch.zeros(n * topk - ref_permuted.shape[0], h)])  # dropped slots contribute nothing
    ref = kept[ref_sorted].reshape(n, topk, h)
    ref = (ref * pr.unsqueeze(-1) if pr is not None else ref).sum(1)
    ref.backward(grad.float())
    assert_matches(out, ref)
    assert_matches(tn.grad, tr.grad)
    if probs is not None:
        assert_matches(pn.grad, pr.grad, dtype if dtype == torch.float32 else torch.bfloat16)


def test_moe_token_permute_gradcheck():
    """permute and unpermute pass gradcheck in float64 (tokens, permuted tokens and probs)."""
    indices = _experts(5, 2, 3).long().npu()
    gradcheck(lambda t: ops.npu_moe_token_permute(t, indices, 8)[0], randn(5, 3))
    sorted_indices = ops.npu_moe_token_permute(randn(5, 3).npu(), indices)[1]
    gradcheck(lambda p, w: ops.npu_moe_token_unpermute(p, sorted_indices, w), randn(10, 3), randn(5, 2, seed=1))


def test_backward_ops_are_torch_npu_names():
    """op-plugin's backward ops are torch_npu.<op> (torch_npu binds every op of op-plugin's yaml), npusim's own
    helpers are not; called directly, the permute / unpermute / RMSNorm grads equal autograd's gradients."""
    shim = torch_npu_shim.install()
    try:
        for name in ("npu_rms_norm_backward", "npu_moe_token_permute_grad", "npu_moe_token_permute_grad_v2",
                     "npu_moe_token_unpermute_grad", "npu_moe_token_unpermute_grad_v2", "npu_rotary_mul_backward",
                     "npu_swiglu_backward", "npu_moe_gating_top_k_backward", "npu_fusion_attention_grad"):
            assert getattr(shim, name) is getattr(ops, name), name
        assert not hasattr(shim, "_npu_apply_rotary_pos_emb")
        tokens, indices = randn(6, 5).npu(), _experts(6, 2, 4).long().npu()
        permuted, sorted_indices = ops.npu_moe_token_permute(tokens, indices)
        grad = randn(*permuted.shape, seed=7).npu()
        leaf = tokens.clone().requires_grad_()
        ops.npu_moe_token_permute(leaf, indices)[0].backward(grad)
        dtokens = shim.npu_moe_token_permute_grad(tokens, grad, indices, sorted_indices)
        assert_matches(dtokens, leaf.grad.cpu())
        probs, dout = randn(6, 2, seed=8).npu(), randn(6, 5, seed=9).npu()
        leaves = [permuted.clone().requires_grad_(), probs.clone().requires_grad_()]
        ops.npu_moe_token_unpermute(leaves[0], sorted_indices, leaves[1]).backward(dout)
        dpermuted, dprobs = shim.npu_moe_token_unpermute_grad(permuted, dout, sorted_indices, probs)
        assert_matches(dpermuted, leaves[0].grad.cpu())
        assert_matches(dprobs, leaves[1].grad.cpu())
        x, gamma = randn(4, 8).npu(), randn(8, seed=1).npu()
        rstd = ops.npu_rms_norm(x, gamma)[1]
        leaves = [x.clone().requires_grad_(), gamma.clone().requires_grad_()]
        ops.npu_rms_norm(*leaves)[0].backward(dout[:4, :1].expand(4, 8).contiguous())
        dx, dgamma = shim.npu_rms_norm_backward(dout[:4, :1].expand(4, 8).contiguous(), x, gamma, rstd)
        assert_matches(dx, leaves[0].grad.cpu())
        assert_matches(dgamma, leaves[1].grad.cpu())
    finally:
        torch_npu_shim.uninstall()


# -- grouped matmul ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_matmul_single_x_grouped_by_rows(dtype):
    """group_type 0, one x and an (E, K, N) weight: cumulative and count group_lists, with a bias; the int-list
    overload with E weights; split_item 0 gives one output per group."""
    sizes, k, n = [3, 0, 5], 6, 4
    x, w = randn(8, k, dtype=dtype), randn(3, k, n, dtype=dtype, seed=1)
    bias = randn(3, n, dtype=torch.float16 if dtype == torch.float16 else torch.float32, seed=2)
    ref = torch.cat([xi.float() @ w[e].float() + bias[e].float() for e, xi in enumerate(x.split(sizes))])
    cumulative = torch.tensor(sizes).cumsum(0).npu()
    y = ops.npu_grouped_matmul([x.npu()], [w.npu()], bias=[bias.npu()], group_list=cumulative, split_item=2,
                               group_type=0)
    assert len(y) == 1 and y[0].dtype == dtype
    assert_matches(y[0], ref)
    y = ops.npu_grouped_matmul([x.npu()], [w.npu()], bias=[bias.npu()], group_list=torch.tensor(sizes).npu(),
                               split_item=3, group_type=0, group_list_type=1)
    assert_matches(y[0], ref)
    parts = ops.npu_grouped_matmul([x.npu()], [t.npu() for t in w.unbind(0)], bias=[b.npu() for b in bias.unbind(0)],
                                   group_list=[3, 3, 8], split_item=0)
    assert [p.shape[0] for p in parts] == sizes
    assert_matches(torch.cat(parts), ref)


def test_grouped_matmul_multi_tensor_and_k_axis_forms():
    """group_type -1 (independent matmuls, x up to 6-D), multi x into one y, and group_type 2 (the weight gradient
    form: y[e] = x[:, k_e] @ w[k_e, :])."""
    x1, x2, w1, w2 = randn(2, 3, 4), randn(5, 4, seed=1), randn(4, 6, seed=2), randn(4, 6, seed=3)
    y1, y2 = ops.npu_grouped_matmul([x1.npu(), x2.npu()], [w1.npu(), w2.npu()], group_type=-1)
    assert_matches(y1, x1 @ w1)
    assert_matches(y2, x2 @ w2)
    (y,) = ops.npu_grouped_matmul([x2.npu(), x2[:2].npu()], [w1.npu(), w2.npu()], split_item=2, group_type=0)
    assert_matches(y, torch.cat([x2 @ w1, x2[:2] @ w2]))
    a, g, sizes = randn(4, 9, seed=4), randn(9, 6, seed=5), [2, 0, 7]
    (dw,) = ops.npu_grouped_matmul([a.npu()], [g.npu()], group_list=torch.tensor(sizes).npu(), split_item=3,
                                   group_type=2, group_list_type=1)
    assert dw.shape == (3, 4, 6)
    assert_matches(dw, torch.stack([ai @ gi for ai, gi in zip(a.split(sizes, 1), g.split(sizes), strict=True)]))


@pytest.mark.parametrize("stacked", [False, True], ids=["weight-list", "one-3d-weight"])
def test_grouped_matmul_k_axis_with_one_weight_per_group(stacked):
    """group_type 2 with split_item 0/1 takes one weight per group (op-plugin's meta function): y[e] = x[:, k_e] @ w_e,
    each (M, N_e); the fake kernel gives the same shapes, N_e differing from weight to weight."""
    a = randn(4, 9, seed=4)
    if stacked:  # one (E, K_e, N) weight: every group has the same k size
        sizes, weights = [3, 3, 3], [randn(3, 3, 5, seed=5)]
        experts = list(weights[0].unbind(0))
    else:
        sizes = [2, 0, 7]
        weights = experts = [randn(k, n, seed=10 + n) for k, n in zip(sizes, [3, 6, 2], strict=True)]
    refs = [ai @ w for ai, w in zip(a.split(sizes, 1), experts, strict=True)]
    group_list = torch.tensor(sizes).cumsum(0).npu()
    ys = ops.npu_grouped_matmul([a.npu()], [w.npu() for w in weights], group_list=group_list, split_item=0,
                                group_type=2)
    assert [tuple(y.shape) for y in ys] == [tuple(r.shape) for r in refs]
    for y, ref in zip(ys, refs, strict=True):
        assert_matches(y, ref)
    a_npu, weights_npu = a.npu(), [w.npu() for w in weights]
    with FakeTensorMode() as mode:
        fake = ops.npu_grouped_matmul([mode.from_tensor(a_npu)], [mode.from_tensor(w) for w in weights_npu],
                                      group_list=mode.from_tensor(group_list), split_item=0, group_type=2)
    assert [tuple(y.shape) for y in fake] == [tuple(r.shape) for r in refs]


def test_grouped_matmul_errors_carry_op_plugins_messages():
    """group_type None on the Tensor overload, a bad group_type or split_item, empty lists, a decreasing group_list
    and mismatched group counts raise op-plugin's messages after the op's name, eagerly and in the fake kernel."""
    x, w, gl = randn(6, 4).npu(), randn(2, 4, 3).npu(), torch.tensor([2, 6]).npu()
    calls = [({"group_list": gl, "split_item": 2}, r"npu_grouped_matmul: Requires manual passing group_type, current "
                                                   "is None"),
             ({"group_list": gl, "split_item": 2, "group_type": 1},
              r"The group type must be -1, 0 or 2, but now is \[1\]"),
             ({"group_list": gl, "split_item": 5, "group_type": 0},
              r"Invalid value of split_item \[5\], which should only be one of 0/1/2/3"),
             ({"group_list": torch.tensor([4, 3]).npu(), "split_item": 2, "group_type": 0},
              r"group_list\[1\] - group_list\[0\] should be larger than or equal to 0, but now is -1\."),
             ({"group_list": torch.tensor([2, 4, 6]).npu(), "split_item": 0, "group_type": 0},
              r"Invalid inputs\. When split_item = 0 or 1 and input group_list is not None.*Actual lengths: x \[1\], "
              r"weight \[2\], group_list \[3\]")]
    for kwargs, message in calls:
        with pytest.raises(RuntimeError, match=message):
            ops.npu_grouped_matmul([x], [w], **kwargs)
        if "should be larger" in message:
            continue  # a Tensor group_list's values are unknown to the fake kernel
        with FakeTensorMode() as mode, pytest.raises(RuntimeError, match=message):
            fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            ops.npu_grouped_matmul([mode.from_tensor(x)], [mode.from_tensor(w)], **fake)
    with pytest.raises(RuntimeError, match="npu_grouped_matmul: Invalid inputs: neither x nor weight could be empty"):
        ops.npu_grouped_matmul([], [w], group_type=-1)
    with pytest.raises(RuntimeError, match=r"When split_item = 0 or 1 and input group_list is None, the num of x "
                                           r"tensors must equal the num of weight tensors\. Actual lengths: x \[1\]"):
        ops.npu_grouped_matmul([x], [w[0], w[1]], group_type=-1)
    a, g = randn(4, 9).npu(), randn(9, 6).npu()
    with pytest.raises(RuntimeError, match=r"When group_list is 2\(K_SPLIT\) and split_item is 2/3, the length of "
                                           "weight must equal x"):
        ops.npu_grouped_matmul([a], [g[:4], g[4:]], group_list=torch.tensor([4, 9]).npu(), split_item=3,
                               group_type=2)
    with pytest.raises(RuntimeError, match=r"npu_grouped_matmul: weight 1 \(\(5, 6\)\) must have group 1's k size "
                                           r"\(3 rows"):
        ops.npu_grouped_matmul([a], [g[:6], g[4:]], group_list=torch.tensor([6, 9]).npu(), split_item=0,
                               group_type=2)
    with pytest.raises(RuntimeError, match=r"npu_grouped_matmul: group_list must give one group per weight \(2\), "
                                           r"got 3"):
        ops.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 4, 6]).npu(), split_item=2, group_type=0)
    # the int-list overload infers group_type (op-plugin's meta function accepts None with a list)
    (y,) = ops.npu_grouped_matmul([x], [w], group_list=[2, 6], split_item=2)
    assert_matches(y, torch.cat([x[:2].cpu() @ w[0].cpu(), x[2:].cpu() @ w[1].cpu()]))


def test_grouped_matmul_errors_name_the_op_and_argument():
    """Quantized arguments, a group_list that does not cover x, mismatched dtypes and devices are refused."""
    x, w, gl = randn(6, 4).npu(), randn(2, 4, 3).npu(), torch.tensor([2, 6]).npu()
    with pytest.raises(RuntimeError, match="npu_grouped_matmul: scale belongs to a quantized form"):
        ops.npu_grouped_matmul([x], [w], scale=[gl], group_list=gl, split_item=2, group_type=0)
    with pytest.raises(RuntimeError, match=r"npu_grouped_matmul: group_list must cover the 6 rows of x exactly"):
        ops.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 5]).npu(), split_item=2, group_type=0)
    with pytest.raises(RuntimeError, match=r"npu_grouped_matmul: weight\[0\] must have the dtype of x"):
        ops.npu_grouped_matmul([x], [w.half()], group_list=gl, split_item=2, group_type=0)
    with pytest.raises(RuntimeError, match="npu_grouped_matmul: act_type 1 fuses an activation only into"):
        ops.npu_grouped_matmul([x], [w], group_list=gl, split_item=2, group_type=0, act_type=1)
    with pytest.raises(RuntimeError, match="npu_grouped_matmul: group_list must be on npu:0 .*, got cpu"):
        ops.npu_grouped_matmul([x], [w], group_list=gl.cpu(), split_item=2, group_type=0)
    with pytest.raises(RuntimeError, match=r"npu_grouped_matmul: weight\[0\] must be on npu:0 .*, got npu:1"):
        ops.npu_grouped_matmul([x], [w.to("npu:1")], group_list=gl, split_item=2, group_type=0)
    y = ops.npu_grouped_matmul([x.requires_grad_()], [w], group_list=gl, split_item=2, group_type=0)[0]
    with pytest.raises(RuntimeError, match="derivative for npu::npu_grouped_matmul is not implemented"):
        y.sum().backward()


def test_moe_errors_name_the_op_and_argument():
    """Routing and gating arguments are checked by name."""
    x, experts = randn(4, 8).npu(), _experts(4, 2, 8).npu()
    with pytest.raises(RuntimeError, match="npu_moe_gating_top_k: group_count must divide the 8 experts"):
        ops.npu_moe_gating_top_k(x, 2, group_count=3)
    with pytest.raises(RuntimeError, match="npu_moe_gating_top_k: renorm must be 0"):
        ops.npu_moe_gating_top_k(x, 2, renorm=1)
    with pytest.raises(RuntimeError, match="npu_moe_init_routing_v2: only the unquantized mode is simulated"):
        ops.npu_moe_init_routing_v2(x, experts, quant_mode=1, expert_num=8)
    with pytest.raises(RuntimeError, match="npu_moe_init_routing_v2: expert_idx must be int32, got int64"):
        ops.npu_moe_init_routing_v2(x, experts.long(), expert_num=8)
    with pytest.raises(RuntimeError, match="npu_moe_finalize_routing: skip2 must be None when skip1 is None"):
        ops.npu_moe_finalize_routing(x, None, x, None, None, torch.arange(4, dtype=torch.int32).npu(), None)
    with pytest.raises(RuntimeError, match="npu_moe_token_permute: padded_mode=True is not supported"):
        ops.npu_moe_token_permute(x, experts, None, True)
    assert_device_errors(ops.npu_moe_init_routing_v2, [x, experts], 1, "expert_idx", "npu_moe_init_routing_v2")
    assert_device_errors(ops.npu_moe_token_permute, [x, experts], 1, "indices", "npu_moe_token_permute")


# -- a deepseek-style MoE block ------------------------------------------------------------------------------------

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K, GROUPS, TOP_GROUPS = 12, 8, 6, 12, 3, 4, 2


class GroupedMatmul(torch.autograd.Function):
    """torchtitan-npu's GMMFunction: npu_grouped_matmul forward, and again (transposed, group_type 2) backward."""

    @staticmethod
    def forward(ctx, x, weight, counts):
        ctx.save_for_backward(x, weight, counts)
        return ops.npu_grouped_matmul([x], [weight], group_list=counts, split_item=2, group_type=0,
                                      group_list_type=1)[0]

    @staticmethod
    def backward(ctx, grad):
        x, weight, counts = ctx.saved_tensors
        dx = ops.npu_grouped_matmul([grad], [weight.transpose(1, 2)], group_list=counts, split_item=2, group_type=0,
                                    group_list_type=1)[0]
        dw = ops.npu_grouped_matmul([x.t()], [grad], group_list=counts, split_item=3, group_type=2,
                                    group_list_type=1)[0]
        return dx, dw, None


class InitRouting(torch.autograd.Function):
    """npu_moe_init_routing_v2 (no torch_npu derivative); its backward sums each token's slots with finalize."""

    @staticmethod
    def forward(ctx, h, experts):
        expanded, row_idx, counts, _ = ops.npu_moe_init_routing_v2(h, experts, expert_num=EXPERTS,
                                                                   expert_tokens_num_type=1,
                                                                   expert_tokens_num_flag=True)
        ctx.save_for_backward(row_idx)
        ctx.mark_non_differentiable(row_idx, counts)
        return expanded, row_idx, counts

    @staticmethod
    def backward(ctx, grad, _drow, _dcounts):
        (row_idx,) = ctx.saved_tensors
        return ops.npu_moe_finalize_routing(grad, None, None, None, None, row_idx, None, 2, TOP_K), None


class FinalizeRouting(torch.autograd.Function):
    """npu_moe_finalize_routing with the residual as skip1 (no torch_npu derivative); backward by hand."""

    @staticmethod
    def forward(ctx, rows, residual, weights, row_idx):
        ctx.save_for_backward(rows, weights, row_idx)
        return ops.npu_moe_finalize_routing(rows, residual, None, None, weights, row_idx, None, 2, TOP_K)

    @staticmethod
    def backward(ctx, grad):
        rows, weights, row_idx = ctx.saved_tensors
        slot_grads = grad.repeat_interleave(TOP_K, 0)  # slot i * k + j belongs to token i
        d_rows = torch.zeros_like(rows).index_copy_(0, row_idx.long(), slot_grads * weights.reshape(-1, 1))
        d_weights = (slot_grads * rows.index_select(0, row_idx.long())).sum(-1).reshape(weights.shape)
        return d_rows, grad, d_weights, None


def _parameters(device: str = "npu") -> dict[str, torch.Tensor]:
    shapes = {"norm": (HIDDEN,), "router": (EXPERTS, HIDDEN), "w13": (EXPERTS, HIDDEN, 2 * FFN),
              "w2": (EXPERTS, FFN, HIDDEN)}
    params = {name: (randn(*shape, seed=i) * 0.5 + (1 if name == "norm" else 0)).to(device).requires_grad_()
              for i, (name, shape) in enumerate(shapes.items())}
    params["bias"] = randn(EXPERTS, seed=9).to(device) * 0.1  # deepseek's expert bias: selection only
    return params


def _route(h: torch.Tensor, p: dict[str, torch.Tensor]):
    return ops.npu_moe_gating_top_k(h @ p["router"].t(), TOP_K, bias=p["bias"], k_group=TOP_GROUPS,
                                    group_count=GROUPS, group_select_mode=1, norm_type=1, routed_scaling_factor=2.5)


def fused_block(x: torch.Tensor, p: dict[str, torch.Tensor], routing: str) -> torch.Tensor:
    """RMSNorm, sigmoid group-limited top-k gating, grouped-matmul SwiGLU experts, weighted combine plus residual."""
    h = ops.npu_rms_norm(x, p["norm"], 1e-6)[0]
    weights, experts, _ = _route(h, p)
    if routing == "init_finalize":
        expanded, row_idx, counts = InitRouting.apply(h, experts)
    else:  # torchtitan-npu's path: token permute / unpermute, which torch_npu differentiates
        expanded, sorted_indices = ops.npu_moe_token_permute(h, experts)
        counts = torch.bincount(experts.reshape(-1), minlength=EXPERTS)
    act = ops.npu_swiglu(GroupedMatmul.apply(expanded, p["w13"], counts), -1)
    down = GroupedMatmul.apply(act, p["w2"], counts)
    if routing == "init_finalize":
        return FinalizeRouting.apply(down, x, weights, row_idx)
    return x + ops.npu_moe_token_unpermute(down, sorted_indices, weights)


def plain_block(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same block in plain PyTorch ops: a loop over experts."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * p["norm"]
    scores = torch.sigmoid(h @ p["router"].t())
    biased = (scores + p["bias"]).detach().reshape(TOKENS, GROUPS, -1)
    groups = biased.topk(2, dim=-1).values.sum(-1).topk(TOP_GROUPS, dim=-1).indices
    keep = torch.zeros(TOKENS, GROUPS, dtype=torch.bool, device=x.device).scatter_(1, groups, True)
    experts = biased.masked_fill(~keep.unsqueeze(-1), float("-inf")).reshape(TOKENS, -1).topk(TOP_K, -1).indices
    weights = scores.gather(1, experts)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * 2.5
    out = x
    for e in range(EXPERTS):
        token, slot = (experts == e).nonzero(as_tuple=True)
        gate, up = (h[token] @ p["w13"][e]).chunk(2, -1)
        y = (torch.nn.functional.silu(gate) * up) @ p["w2"][e]
        out = out.index_add(0, token, y * weights[token, slot].unsqueeze(-1))
    return out


def _train(block, steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    params = _parameters()
    x, target = randn(TOKENS, HIDDEN, seed=20).npu(), randn(TOKENS, HIDDEN, seed=21).npu()
    losses = []
    for _ in range(steps):
        loss = (block(x, params) - target).square().mean()
        grads = torch.autograd.grad(loss, [params[n] for n in ("norm", "router", "w13", "w2")])
        with torch.no_grad():
            for name, grad in zip(("norm", "router", "w13", "w2"), grads, strict=True):
                params[name] -= 0.05 * grad
        losses.append(loss.item())
    return losses, params


@pytest.mark.parametrize("routing", ["init_finalize", "permute"])
def test_deepseek_moe_block_trains_as_plain_pytorch(routing):
    """3 SGD steps of the fused block (routing via init / finalize routing, or via token permute / unpermute)
    give the losses and parameters of the plain-PyTorch block (fp32, rtol 1e-5)."""
    fused_losses, fused = _train(lambda x, p: fused_block(x, p, routing))
    plain_losses, plain = _train(plain_block)
    assert_close(torch.tensor(fused_losses), torch.tensor(plain_losses), rtol=1e-5, atol=0)
    assert fused_losses[-1] < fused_losses[0]
    for name in ("norm", "router", "w13", "w2"):
        assert_close(fused[name].cpu(), plain[name].cpu(), rtol=1e-5, atol=1e-6)


def test_deepseek_moe_block_compiles_fullgraph():
    """torch.compile(fullgraph=True, inductor) of the fused block equals eager, forward and backward: every op in it
    has a fake kernel and traces with its autograd."""
    x = randn(TOKENS, HIDDEN, seed=20).npu()

    def run(block) -> tuple[torch.Tensor, list[torch.Tensor]]:
        params = _parameters()
        out = block(x, params, "init_finalize")
        out.square().sum().backward()
        return out.detach(), [params[n].grad for n in ("norm", "router", "w13", "w2")]

    eager_out, eager_grads = run(fused_block)
    torch._dynamo.reset()
    compiled_out, compiled_grads = run(torch.compile(fused_block, fullgraph=True))
    assert_close(compiled_out, eager_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(compiled_grads, eager_grads, strict=True):
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_moe_ops_pass_opcheck():
    """PyTorch's opcheck (schema, fake kernel, AOT tracing) of every MoE operator and backward op."""
    x, experts = randn(6, 12).npu().requires_grad_(), _experts(6, 2, 4).npu()
    opcheck(ops.npu_moe_gating_top_k_softmax, x.detach(), None, 3)  # no backward: no inputs requiring grad
    opcheck(ops.npu_moe_gating_top_k, x, 3, bias=randn(12).npu(), k_group=2, group_count=4, norm_type=1)
    y, chosen, norm = ops.npu_moe_gating_top_k(x.detach(), 3, norm_type=1)
    opcheck(ops.npu_moe_gating_top_k_backward, norm, torch.ones_like(y), chosen, norm_type=1)
    h = randn(6, 5).npu()
    row_idx = torch.arange(12, dtype=torch.int32).reshape(2, 6).t().contiguous().npu()
    opcheck(ops.npu_moe_init_routing, h, row_idx, experts, 4)
    opcheck(ops.npu_moe_init_routing_v2, h, experts, expert_num=4, expert_tokens_num_flag=True, drop_pad_mode=1,
            expert_capacity=2)
    expanded, expanded_row_idx, _, _ = ops.npu_moe_init_routing_v2(h, experts, expert_num=4)
    opcheck(ops.npu_moe_finalize_routing, expanded, h, None, None, randn(6, 2).npu(), expanded_row_idx, None, 2)
    tokens = h.requires_grad_()
    opcheck(ops.npu_moe_token_permute, tokens, experts.long(), 9)
    permuted, sorted_indices = ops.npu_moe_token_permute(tokens.detach(), experts.long())
    opcheck(ops.npu_moe_token_unpermute, permuted.requires_grad_(), sorted_indices, randn(6, 2).npu())
    opcheck(ops.npu_moe_token_permute_grad_v2, permuted.detach(), sorted_indices, 6, torch.float32, 2)
    opcheck(ops.npu_moe_token_unpermute_grad_v2, h.detach(), sorted_indices, 12, torch.float32, randn(6, 2).npu(),
            permuted_tokens=permuted.detach())
    opcheck(ops.npu_grouped_matmul.default, [randn(6, 4).npu()], [randn(2, 4, 3).npu()],
            group_list=torch.tensor([2, 6]).npu(), split_item=2, group_type=0)
    opcheck(ops.npu_grouped_matmul.List, [randn(6, 4).npu()], [randn(4, 3).npu(), randn(4, 3).npu()],
            group_list=[2, 6], split_item=0)
