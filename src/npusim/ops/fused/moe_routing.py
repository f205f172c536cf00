"""MoE routing: ``npu_moe_init_routing`` (v1, v2) and ``npu_moe_finalize_routing``.

From op-plugin's docs and their equivalent reference code (``torch_npu-npu_moe_init_routing.md``,
``torch_npu-npu_moe_init_routing_v2.md``, ``torch_npu-npu_moe_finalize_routing.md``). init
routing sorts the (token, k) slots by expert (stably) and gathers each slot's token row into
``expanded_x``; finalize routing sums each token's k expert outputs back, weighted by
``scales``. An index is "column" ordered (slot j of token i at ``j * rows + i``, what
npu_moe_gating_top_k_softmax's row_idx gives) or "row" ordered (``i * k + j``, v2's).
Only the unquantized modes are simulated (quant_mode -1). torch_npu has no derivative for
any of the three: a backward through them raises.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, check_dim, check_dtype, check_same_dtype, check_shape, compute_dtype
from npusim.ops.fused._library import define, implement, no_derivative

INIT_ROUTING = define("npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) "
                      "-> (Tensor, Tensor, Tensor)")
INIT_ROUTING_V2 = define(
    "npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, "
    "int active_num=-1, int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, "
    "int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, int quant_mode=-1, "
    "int[2] active_expert_range=[], int row_idx_type=0, int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)")
FINALIZE_ROUTING = define(
    "npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, "
    "Tensor? scales, Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0, "
    "int? k=1) -> Tensor")

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT32 = (torch.int32,)


def _stable_sort(keys: Tensor) -> tuple[Tensor, Tensor]:
    return torch.sort(keys, stable=True)


# -- npu_moe_init_routing ------------------------------------------------------------------------------------------

def _check_init_routing(x: Tensor, row_idx: Tensor, expert_idx: Tensor) -> None:
    op = "npu_moe_init_routing"
    check_dtype(op, "x", x, _FLOAT)
    check_dim(op, "x", x, (2,))
    check_dtype(op, "expert_idx", expert_idx, _INT32)
    check_dtype(op, "row_idx", row_idx, _INT32)
    check(expert_idx.dim() == 2 and expert_idx.shape[0] == x.shape[0], op,
          f"expert_idx must be (rows of x {x.shape[0]}, k), got {tuple(expert_idx.shape)}")
    check_shape(op, "row_idx", row_idx, expert_idx.shape, "the shape of expert_idx")


def init_routing(x: Tensor, row_idx: Tensor, expert_idx: Tensor, active_num: int) -> tuple[Tensor, Tensor, Tensor]:
    """(expanded_x, expanded_row_idx, expanded_expert_idx).

    The slots sorted by expert give dst_to_src = row_idx[order]; expanded_row_idx[dst_to_src[i]] = i,
    and expanded_x[i] = x[dst_to_src[i] % rows] for the first min(active_num, rows) * k slots.
    """
    _check_init_routing(x, row_idx, expert_idx)
    rows, k = expert_idx.shape
    expanded_expert_idx, order = _stable_sort(expert_idx.reshape(-1))
    dst_to_src = row_idx.reshape(-1).long()[order]
    expanded_row_idx = torch.empty_like(dst_to_src).scatter_(0, dst_to_src, torch.arange(rows * k, device=x.device))
    active = min(active_num, rows) * k
    expanded_x = x.index_select(0, dst_to_src[:active] % rows)
    return expanded_x, expanded_row_idx.to(torch.int32), expanded_expert_idx


def _init_routing_fake(x: Tensor, row_idx: Tensor, expert_idx: Tensor, active_num: int) -> tuple[Tensor, Tensor,
                                                                                                   Tensor]:
    _check_init_routing(x, row_idx, expert_idx)
    rows, k = expert_idx.shape
    slots = (rows * k,)
    return (x.new_empty((min(active_num, rows) * k, x.shape[1])), x.new_empty(slots, dtype=torch.int32),
            x.new_empty(slots, dtype=torch.int32))


implement(INIT_ROUTING, init_routing, _init_routing_fake)
no_derivative(INIT_ROUTING)


# -- npu_moe_init_routing_v2 ---------------------------------------------------------------------------------------

def _expert_range(expert_num: int, active_expert_range: list[int]) -> tuple[int, int | None]:
    if active_expert_range:
        return active_expert_range[0], active_expert_range[1]
    return 0, expert_num if expert_num > 0 else None


def _check_init_routing_v2(x: Tensor, expert_idx: Tensor, scale: Tensor | None, offset: Tensor | None,
                           active_num: int, expert_capacity: int, expert_num: int, drop_pad_mode: int,
                           expert_tokens_num_type: int, expert_tokens_num_flag: bool, quant_mode: int,
                           active_expert_range: list[int], row_idx_type: int, x_dtype: int | None) -> None:
    op = "npu_moe_init_routing_v2"
    check(quant_mode == -1 and x_dtype is None, op,
          f"only the unquantized mode is simulated (quant_mode=-1, x_dtype=None), got quant_mode={quant_mode}, "
          f"x_dtype={x_dtype}")
    check(offset is None, op, "offset is for the quantized modes; it must be None with quant_mode=-1")
    # op-plugin's docs: x is float16, bfloat16, float32 or int8 (unquantized, expanded_x keeps it: routing copies).
    check_dtype(op, "x", x, (*_FLOAT, torch.int8))
    check_dim(op, "x", x, (2,))
    check_dtype(op, "expert_idx", expert_idx, _INT32)
    check(expert_idx.dim() == 2 and expert_idx.shape[0] == x.shape[0], op,
          f"expert_idx must be (rows of x {x.shape[0]}, k), got {tuple(expert_idx.shape)}")
    if scale is not None:
        check_dtype(op, "scale", scale, (torch.float32,))
        check_shape(op, "scale", scale, (x.shape[0],), "one value per row of x when unquantized")
    check(drop_pad_mode in (0, 1), op, f"drop_pad_mode must be 0 (dropless) or 1 (drop/pad), got {drop_pad_mode}")
    check(expert_tokens_num_type in (0, 1, 2), op,
          f"expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 (key-value), got {expert_tokens_num_type}")
    check(row_idx_type in (0, 1), op, f"row_idx_type must be 0 (gather) or 1 (scatter), got {row_idx_type}")
    check(active_num >= -1, op, f"active_num must be -1, 0 or positive, got {active_num}")
    if active_expert_range:
        start, end = active_expert_range
        check(0 <= start < end <= 10240, op,
              f"active_expert_range must be [start, end) with 0 <= start < end <= 10240, got {active_expert_range}")
        check(expert_num <= 0 or end <= expert_num, op,
              f"active_expert_range's end must not exceed expert_num ({expert_num}), got {active_expert_range}")
    _, end = _expert_range(expert_num, active_expert_range)
    if expert_tokens_num_flag or drop_pad_mode == 1:
        check(end is not None, op, "expert_num (or active_expert_range) is needed to count tokens per expert")
    if expert_tokens_num_flag and expert_tokens_num_type == 2:
        check(expert_num > 0, op, "expert_num is needed for the key-value counts (expert_tokens_num_type=2)")
    if drop_pad_mode == 1:
        check(expert_num > 0 and expert_capacity > 0, op,
              f"drop_pad_mode=1 needs expert_num and expert_capacity > 0, got {expert_num} and {expert_capacity}")
        check(_expert_range(expert_num, active_expert_range) == (0, expert_num), op,
              "drop_pad_mode=1 routes to every expert: active_expert_range must be [] or [0, expert_num]")
        check(row_idx_type == 0, op, "drop_pad_mode=1 gives gather indices: row_idx_type must be 0")


def _v2_rows(x: Tensor, expert_idx: Tensor, active_num: int, expert_capacity: int, expert_num: int,
             drop_pad_mode: int) -> int:
    """Rows of expanded_x (and of expanded_scale): E * C with drop/pad, else N * K or active_num."""
    if drop_pad_mode == 1:
        return expert_num * expert_capacity
    slots = expert_idx.numel()
    return slots if active_num <= 0 else min(active_num, slots)


def _count_tokens(sorted_experts: Tensor, available: Tensor, start: int, end: int) -> Tensor:
    """Tokens per expert of [start, end) (int64), from the sorted experts whose first ``available`` are in range."""
    slot = torch.arange(sorted_experts.numel(), device=sorted_experts.device)
    bucket = torch.where(slot < available, sorted_experts - start, end - start)  # out of range: a spare bucket
    counts = torch.zeros(end - start + 1, dtype=torch.int64, device=sorted_experts.device)
    return counts.scatter_add_(0, bucket, torch.ones_like(bucket))[:-1]


def _token_counts(counts: Tensor, start: int, expert_num: int, kind: int) -> Tensor:
    if kind == 0:
        return counts.cumsum(0)
    if kind == 1:
        return counts
    # key-value: (expert, count) of the experts with tokens first, in expert order; zero rows after.
    order = torch.sort((counts == 0).to(torch.int8), stable=True).indices
    experts = torch.arange(start, start + counts.numel(), device=counts.device)[order]
    pairs = torch.stack((experts, counts[order]), dim=1) * (counts[order] > 0).unsqueeze(1)
    table = torch.zeros(expert_num, 2, dtype=torch.int64, device=counts.device)
    table[: min(expert_num, pairs.shape[0])] = pairs[:expert_num]
    return table


def init_routing_v2(x: Tensor, expert_idx: Tensor, *, scale: Tensor | None = None, offset: Tensor | None = None,
                    active_num: int = -1, expert_capacity: int = -1, expert_num: int = -1, drop_pad_mode: int = 0,
                    expert_tokens_num_type: int = 0, expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                    active_expert_range: list[int] = (), row_idx_type: int = 0,
                    x_dtype: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(expanded_x, expanded_row_idx, expert_token_cumsum_or_count, expanded_scale), op-plugin's reference.

    Slots (token i, choice j) at i * k + j are sorted stably by expert, experts below the active
    range last; the ``available`` slots with an expert in range are routed. Rows of expanded_x and
    expanded_scale past the routed ones, and dropped or padding rows, are zero (the NPU leaves them
    undefined); gather indices of unrouted slots are -1.
    """
    active_expert_range = list(active_expert_range)
    _check_init_routing_v2(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                           expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range,
                           row_idx_type, x_dtype)
    device, k = x.device, expert_idx.shape[1]
    start, end = _expert_range(expert_num, active_expert_range)
    flat = expert_idx.reshape(-1).long()
    in_range = (flat >= start) & (flat < end) if end is not None else flat >= start
    available = in_range.sum()
    keys = torch.where(flat < start, torch.iinfo(torch.int32).max, flat)
    sorted_experts, order = _stable_sort(keys)
    slot = torch.arange(flat.numel(), device=device)
    rows = _v2_rows(x, expert_idx, active_num, expert_capacity, expert_num, drop_pad_mode)

    if drop_pad_mode == 1:
        counts = _count_tokens(sorted_experts, available, start, end)
        first = counts.cumsum(0) - counts  # sorted position of each expert's first slot
        rank = slot - first[sorted_experts.clamp(max=end - 1)]
        kept = (slot < available) & (rank < expert_capacity)
        destination = torch.where(kept, sorted_experts * expert_capacity + rank, rows)  # rows: a spare row
        expanded_row_idx = torch.full_like(flat, -1).scatter_(0, order, torch.where(kept, destination, -1))
        source = torch.zeros(rows + 1, dtype=torch.int64, device=device).scatter_(0, destination, order // k)
        valid = torch.zeros(rows + 1, dtype=torch.bool, device=device).scatter_(0, destination, kept)
        source, valid = source[:rows], valid[:rows]
    else:
        routed = slot < available
        if row_idx_type == 1:
            expanded_row_idx = order
        else:
            expanded_row_idx = torch.full_like(flat, -1).scatter_(0, order, torch.where(routed, slot, -1))
        source, valid = order[:rows] // k, routed[:rows]
    expanded_x = x.index_select(0, source).masked_fill(~valid.unsqueeze(1), 0)
    if scale is not None:
        expanded_scale = scale.index_select(0, source).masked_fill(~valid, 0)
    else:
        expanded_scale = torch.zeros(rows, dtype=torch.float32, device=device)
    if expert_tokens_num_flag:
        counts = _count_tokens(sorted_experts, available, start, end)
        tokens = _token_counts(counts, start, expert_num, 1 if drop_pad_mode == 1 else expert_tokens_num_type)
    else:
        tokens = torch.zeros(0, dtype=torch.int64, device=device)
    if drop_pad_mode == 1:
        expanded_x = expanded_x.reshape(expert_num, expert_capacity, x.shape[1])
    return expanded_x, expanded_row_idx.to(torch.int32), tokens, expanded_scale


def _init_routing_v2_fake(x: Tensor, expert_idx: Tensor, *, scale: Tensor | None = None,
                          offset: Tensor | None = None, active_num: int = -1, expert_capacity: int = -1,
                          expert_num: int = -1, drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                          expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                          active_expert_range: list[int] = (), row_idx_type: int = 0,
                          x_dtype: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    active_expert_range = list(active_expert_range)
    _check_init_routing_v2(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                           expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range,
                           row_idx_type, x_dtype)
    rows = _v2_rows(x, expert_idx, active_num, expert_capacity, expert_num, drop_pad_mode)
    shape = (expert_num, expert_capacity, x.shape[1]) if drop_pad_mode == 1 else (rows, x.shape[1])
    start, end = _expert_range(expert_num, active_expert_range)
    if not expert_tokens_num_flag:
        tokens: tuple[int, ...] = (0,)
    elif expert_tokens_num_type == 2 and drop_pad_mode == 0:
        tokens = (expert_num, 2)
    else:
        tokens = (end - start,)
    return (x.new_empty(shape), x.new_empty((expert_idx.numel(),), dtype=torch.int32),
            x.new_empty(tokens, dtype=torch.int64), x.new_empty((rows,), dtype=torch.float32))


implement(INIT_ROUTING_V2, init_routing_v2, _init_routing_v2_fake)
no_derivative(INIT_ROUTING_V2)


# -- npu_moe_finalize_routing --------------------------------------------------------------------------------------

def _finalize_shape(rows: Tensor, scales: Tensor | None, dst: Tensor, k: int | None) -> tuple[int, int, int]:
    """(tokens N, choices K, hidden H)."""
    choices = scales.shape[1] if scales is not None else (k or 1)
    return dst.numel() // choices, choices, rows.shape[-1]


def _check_finalize(rows: Tensor, skip1: Tensor | None, skip2: Tensor | None, bias: Tensor | None,
                    scales: Tensor | None, dst: Tensor, experts: Tensor | None, drop_pad_mode: int | None,
                    k: int | None) -> None:
    op = "npu_moe_finalize_routing"
    mode = 0 if drop_pad_mode is None else drop_pad_mode
    check(mode in (0, 1, 2, 3), op, f"drop_pad_mode must be in [0, 3], got {drop_pad_mode}")
    check_dtype(op, "expanded_permuted_rows", rows, _FLOAT)
    check_dim(op, "expanded_permuted_rows", rows, (3,) if mode in (1, 3) else (2,))
    check_dtype(op, "expanded_src_to_dst_row", dst, _INT32)
    check_dim(op, "expanded_src_to_dst_row", dst, (1,))
    check_same_dtype(op, "expanded_permuted_rows", {"expanded_permuted_rows": rows, "skip1": skip1,
                                                    "skip2": skip2, "bias": bias, "scales": scales})
    check(scales is not None or (k or 1) > 0, op, f"k must be positive when scales is None, got {k}")
    tokens, choices, hidden = _finalize_shape(rows, scales, dst, k)
    check(dst.numel() == tokens * choices, op,
          f"expanded_src_to_dst_row must have tokens * k ({tokens} * {choices}) entries, got {dst.numel()}")
    if mode in (0, 2):
        check(rows.shape[0] == dst.numel(), op, f"expanded_permuted_rows must have {dst.numel()} rows "
                                                f"(one per routed slot), got {rows.shape[0]}")
    if scales is not None:
        check_dim(op, "scales", scales, (2,))
    for name, skip in (("skip1", skip1), ("skip2", skip2)):
        if skip is not None:
            check_shape(op, name, skip, (tokens, hidden), "the output's shape (tokens, hidden)")
    check(skip1 is not None or skip2 is None, op, "skip2 must be None when skip1 is None")
    if bias is not None:
        check(experts is not None, op, "export_for_source_row (each slot's expert) is needed to add bias")
        check(bias.dim() == 2 and bias.shape[1] == hidden, op,
              f"bias must be (experts, hidden {hidden}), got {tuple(bias.shape)}")
    if experts is not None:
        check_dtype(op, "export_for_source_row", experts, _INT32)
        check_shape(op, "export_for_source_row", experts, (tokens, choices), "(tokens, k)")


def finalize_routing(rows: Tensor, skip1: Tensor | None, skip2: Tensor | None, bias: Tensor | None,
                     scales: Tensor | None, dst: Tensor, experts: Tensor | None, drop_pad_mode: int | None = 0,
                     k: int | None = 1) -> Tensor:
    """out[i] = skip1[i] + skip2[i] + sum_j scales[i, j] * (rows[dst(i, j)] + bias[experts[i, j]]).

    dst(i, j) is expanded_src_to_dst_row[j * N + i] in the column modes (0, 1) and [i * K + j] in
    the row modes (2, 3); in the drop/pad modes (1, 3) rows is (E, C, H) and a dropped slot (-1)
    contributes its bias only, as op-plugin's reference does. Sums in float32.
    """
    _check_finalize(rows, skip1, skip2, bias, scales, dst, experts, drop_pad_mode, k)
    mode = 0 if drop_pad_mode is None else drop_pad_mode
    tokens, choices, hidden = _finalize_shape(rows, scales, dst, k)
    acc = compute_dtype(rows.dtype)
    flat_rows = rows.reshape(-1, hidden).to(acc)
    index = dst.long().reshape(choices, tokens).t() if mode in (0, 1) else dst.long().reshape(tokens, choices)
    picked = flat_rows.index_select(0, index.clamp(min=0).reshape(-1)).reshape(tokens, choices, hidden)
    picked = picked * (index >= 0).unsqueeze(-1)
    if bias is not None and experts is not None:
        picked = picked + bias.to(acc).index_select(0, experts.long().reshape(-1)).reshape(tokens, choices, hidden)
    if scales is not None:
        picked = picked * scales.to(acc).unsqueeze(-1)
    out = picked.sum(1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.to(acc)
    return out.to(rows.dtype)


def _finalize_routing_fake(rows: Tensor, skip1: Tensor | None, skip2: Tensor | None, bias: Tensor | None,
                           scales: Tensor | None, dst: Tensor, experts: Tensor | None, drop_pad_mode: int | None = 0,
                           k: int | None = 1) -> Tensor:
    _check_finalize(rows, skip1, skip2, bias, scales, dst, experts, drop_pad_mode, k)
    tokens, _, hidden = _finalize_shape(rows, scales, dst, k)
    return rows.new_empty((tokens, hidden))


implement(FINALIZE_ROUTING, finalize_routing, _finalize_routing_fake)
no_derivative(FINALIZE_ROUTING)
