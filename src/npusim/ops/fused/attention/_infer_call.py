"""The inference attention operators' common computation (prompt, incremental, fused).

op-plugin's npu_fused_infer_attention_score is npu_incre_flash_attention when the query
has one token per batch (decode) and npu_prompt_flash_attention otherwise (prefill); all
three reduce here to :func:`attend` on an :class:`InferCall`:

    attention_out = softmax(scale * query @ key^T + pse_shift, masked) @ value

with the query and the key/value sequences cut to their valid windows (actual lengths,
left padding), an optional shared key/value prefix in front of every batch, key/value
heads shared by groups of query heads, the rope parts of multi-head latent attention
(query_rope, key_rope) joining the dot product, and a paged key/value cache (block_table)
read into sequence order. Rows of the query outside its valid window are 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from npusim.ops.fused.attention import _core, _masks
from npusim.ops.fused.attention._checks import check, check_dim, fail
from npusim.ops.fused.attention._layout import Segment, dense_dims, from_bnsd, segments, to_bnsd, to_tnd


@dataclass(frozen=True)
class InferCall:
    """A checked inference call; tensors in their given layouts, options resolved."""

    op: str
    in_layout: str  # BSH, BSND, BNSD, TND or NTD
    out_layout: str  # the same, or BSND / NBSD / TND / NTD
    num_heads: int
    kv_heads: int
    scale: float
    sparse_mode: int  # 0-4
    pre_tokens: int
    next_tokens: int
    decode: bool  # one query token per batch: sparse_mode, pre/next tokens do not apply
    actual_seq_lengths: Sequence[int] | None
    actual_seq_lengths_kv: Sequence[int] | None
    block_size: int = 0
    lse: bool = False
    mask_needed: bool = False  # sparse modes 2-4 require their compressed atten_mask


def split_layout(op: str, input_layout: str, allowed: Sequence[str]) -> tuple[str, str]:
    """(input layout, output layout) of "BSH" or "BNSD_BSND" (input_output)."""
    check(input_layout in allowed, op, f"input_layout must be one of {', '.join(allowed)}, got {input_layout!r}")
    parts = input_layout.split("_")
    return parts[0], parts[-1]


def per_batch(op: str, name: str, lengths: Sequence[int] | None, batch: int, full: int, device: torch.device,
               ) -> Tensor:
    """A (B,) tensor of valid lengths: one length for all, or the first B (op-plugin's rule)."""
    if lengths is None:
        return torch.full((batch,), full, device=device)
    values = [int(x) for x in lengths]
    check(len(values) == 1 or len(values) >= batch, op,
          f"{name} must have 1 or at least {batch} (the batch size) entries, got {len(values)}")
    values = values * batch if len(values) == 1 else values[:batch]
    check(all(0 <= x <= full for x in values), op, f"{name} must be within 0..{full}, got {values}")
    return torch.tensor(values, device=device)


def left_pad(op: str, name: str, pad: Tensor | None, length: Tensor, full: int, *, decode: bool) -> Tensor:
    """First valid row per batch: ``full - pad - length`` with left padding (pad < 0 counts as 0), else 0.

    A window that starts before row 0 is an error, except for the keys of a decode step, where
    op-plugin returns zeros for that batch: its length becomes 0 (``length`` is updated).
    """
    if pad is None:
        return torch.zeros_like(length)
    check(pad.numel() == 1 or pad.numel() == length.numel(), op,
          f"{name} must have 1 or {length.numel()} entries, got {pad.numel()}")
    start = full - pad.reshape(-1).to(length.device, torch.long).clamp(min=0) - length
    outside = start < 0
    if decode:
        length.masked_fill_(outside, 0)
        return start.clamp(min=0)
    check(not bool(outside.any()), op, f"{name} leaves no room for the actual lengths: start rows {start.tolist()}")
    return start


def paged(op: str, name: str, cache: Tensor, block_table: Tensor, block_size: int, kv_heads: int) -> Tensor:
    """A paged cache, (blocks, block_size, H) or (blocks, N, block_size, D), read as (B, N, L, D)."""
    check(block_table.dim() == 2 and block_table.dtype == torch.int32, op,
          f"block_table must be a 2-D int32 tensor (batch, blocks per sequence), got "
          f"{str(block_table.dtype).removeprefix('torch.')} {tuple(block_table.shape)}")
    if cache.dim() == 3:
        check(cache.shape[1] == block_size, op, f"{name} must be (blocks, block_size={block_size}, H) with "
                                                f"block_table, got {tuple(cache.shape)}")
        blocks = cache.unflatten(2, (kv_heads, -1))
    elif cache.dim() == 4:
        check(cache.shape[2] == block_size and cache.shape[1] == kv_heads, op,
              f"{name} must be (blocks, {kv_heads}, block_size={block_size}, D) with block_table, "
              f"got {tuple(cache.shape)}")
        blocks = cache.transpose(1, 2)
    else:
        fail(op, f"{name} with block_table must be 3-D or 4-D (the NZ cache format is not simulated), "
                 f"got {tuple(cache.shape)}")
    # Entries past a sequence's blocks are masked by its length; clamping keeps them in range.
    index = block_table.to(torch.long).clamp(0, blocks.shape[0] - 1)
    return blocks[index].flatten(1, 2).transpose(1, 2)


def attend(call: InferCall, q: Tensor, k: Tensor, v: Tensor, *, atten_mask: Tensor | None, pse: Tensor | None,
           q_start: Tensor, q_len: Tensor, kv_start: Tensor, kv_len: Tensor) -> tuple[Tensor, Tensor]:
    """Attention of dense (B, N, S, D) blocks with per-batch windows; returns (out, lse) in BNSD."""
    batch, _, sq, _ = q.shape
    skv = k.shape[2]
    device = q.device
    i = torch.arange(sq, device=device).view(1, 1, -1, 1) - q_start.view(-1, 1, 1, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, -1) - kv_start.view(-1, 1, 1, 1)
    ql, kl = q_len.view(-1, 1, 1, 1), kv_len.view(-1, 1, 1, 1)
    masked = (j < 0) | (j >= kl)
    geometry = None
    if not call.decode and (atten_mask is not None or call.sparse_mode != 0):
        geometry = _masks.geometry(call.sparse_mode, i, j, ql, kl, pre=call.pre_tokens, nxt=call.next_tokens)
    user = None  # modes 2-4 take a compressed mask: their geometry is the mask
    if atten_mask is not None and call.sparse_mode in (0, 1):
        user = _masks.full_mask(call.op, atten_mask, batch=batch, heads=call.num_heads, sq=sq, skv=skv,
                                exact=False, batch_rows=call.decode)
    masked = _masks.combine(masked, geometry, user)
    if pse is not None:
        check(pse.dim() == 4 and pse.shape[0] in (1, batch) and pse.shape[1] == call.num_heads
              and pse.shape[2] >= sq and pse.shape[3] >= skv, call.op,
              f"pse_shift must be (B or 1, {call.num_heads}, >= {sq}, >= {skv}), got {tuple(pse.shape)}")
        pse = pse[..., :sq, :skv].to(q.dtype)
    s = _core.scores(q, k, call.scale, pse, pse_before_scale=False)
    sm = _core.softmax(s, masked)
    out = _core.weighted_values(sm.probs, v)
    valid_rows = (i >= 0) & (i < ql)
    out = out * valid_rows.to(out.dtype)
    lse = torch.where(valid_rows, sm.row_max + torch.log(sm.row_sum), float("-inf"))
    return out, lse


def dense_heads(call: InferCall, name: str, x: Tensor, heads: int) -> Tensor:
    """A dense input as (B, N, S, D), checked against the expected number of heads."""
    batch, n, _, _ = dense_dims(call.op, name, x, call.in_layout, heads=heads if x.dim() == 3 else None)
    check(n == heads, call.op, f"{name} {tuple(x.shape)} must have {heads} heads in input_layout {call.in_layout}")
    return to_bnsd(x, call.in_layout, heads)


def varlen(call: InferCall, query: Tensor, key: Tensor, value: Tensor, *, atten_mask: Tensor | None,
           dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """A packed batch (TND / NTD), one block per sequence; returns (out, lse) as (T, N, Dv), (T, N, 1)."""
    q, k, v = (to_tnd(x, call.in_layout) for x in (query, key, value))
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_dim(call.op, name, x, 3, call.in_layout)
    check(call.actual_seq_lengths is not None and call.actual_seq_lengths_kv is not None, call.op,
          f"input_layout {call.in_layout} needs actual_seq_lengths and actual_seq_lengths_kv")
    segs: list[Segment] = segments(call.op, call.actual_seq_lengths, call.actual_seq_lengths_kv, q.shape[0],
                                   k.shape[0], names=("actual_seq_lengths", "actual_seq_lengths_kv"))
    out = q.new_zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=dtype)
    lse = torch.full((q.shape[0], q.shape[1], 1), float("-inf"), device=q.device)
    for seg in segs:
        sq, skv = seg.q_end - seg.q_start, seg.kv_end - seg.kv_start
        if sq == 0:
            continue
        blocks = [x[a:b].transpose(0, 1).unsqueeze(0).to(dtype) for x, a, b in
                  ((q, seg.q_start, seg.q_end), (k, seg.kv_start, seg.kv_end), (v, seg.kv_start, seg.kv_end))]
        zero = torch.zeros(1, dtype=torch.long, device=q.device)
        mask = None if atten_mask is None or call.sparse_mode not in (0, 1) else atten_mask[..., :sq, :skv]
        o, m = attend(call, *blocks, atten_mask=mask, pse=None, q_start=zero, q_len=zero + sq, kv_start=zero,
                      kv_len=zero + skv)
        out[seg.q_start:seg.q_end] = o[0].transpose(0, 1)
        lse[seg.q_start:seg.q_end] = m[0].transpose(0, 1)
    return out, lse


def output(call: InferCall, out: Tensor, dtype: torch.dtype) -> Tensor:
    """attention_out in the call's output layout from BNSD (dense) or TND (packed)."""
    if call.in_layout in ("TND", "NTD"):
        return (out if call.out_layout == "TND" else out.transpose(0, 1)).contiguous().to(dtype)
    return from_bnsd(out, call.out_layout).to(dtype)
