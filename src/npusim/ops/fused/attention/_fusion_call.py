"""npu_fusion_attention's arguments, checked, and the dense blocks its kernels compute.

Both directions (npu_fusion_attention and npu_fusion_attention_grad) and the fake kernels
parse their arguments with :func:`parse`, so they accept and refuse the same calls. A dense
layout is one (B, N, S, D) block; input_layout TND is one block per sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from npusim.ops.fused.attention import _masks
from npusim.ops.fused.attention._checks import (
    FLOAT_DTYPES,
    MASK_DTYPES,
    check,
    check_devices,
    check_dim,
    check_dtype,
    check_same_dtype,
    refuse,
)
from npusim.ops.fused.attention._core import compute_dtype
from npusim.ops.fused.attention._layout import DENSE_LAYOUTS, Segment, dense_dims, segments, to_bnsd

LAYOUTS = (*DENSE_LAYOUTS, "TND")


@dataclass(frozen=True)
class Call:
    """A checked npu_fusion_attention call: its geometry and the options the kernels use."""

    op: str
    layout: str
    q_heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    batch: int  # dense: B; TND: the number of sequences
    q_len: int  # dense: Sq; TND: T of the query
    kv_len: int  # dense: Skv; TND: T of the keys and values
    segments: tuple[Segment, ...] | None  # TND only
    sparse_mode: int
    pre_tockens: int
    next_tockens: int
    prefix: tuple[int, ...] | None
    scale: float
    keep_prob: float
    softmax_layout: str

    @property
    def numels(self) -> int | torch.SymInt:
        """The dropout mask's length: B * N * Sq * Skv, or N * sum(Sq_i * Skv_i) for TND."""
        if self.segments is None:
            return self.batch * self.q_heads * self.q_len * self.kv_len
        return self.q_heads * sum((s.q_end - s.q_start) * (s.kv_end - s.kv_start) for s in self.segments)


def parse(op: str, query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str, *,
          pse: Tensor | None, padding_mask: Tensor | None, atten_mask: Tensor | None, scale: float,
          keep_prob: float, pre_tockens: int, next_tockens: int, inner_precise: int,
          prefix: Sequence[int] | None, actual_seq_qlen: Sequence[int] | None,
          actual_seq_kvlen: Sequence[int] | None, sparse_mode: int, softmax_layout: str,
          sink: Tensor | None, extra: dict[str, Tensor | None]) -> Call:
    """Checks a call as op-plugin documents it; ``extra`` names the direction's other tensors."""
    refuse(op, "padding_mask", padding_mask, "op-plugin documents it as not supported")
    check_devices(op, {"query": query, "key": key, "value": value, "pse": pse, "atten_mask": atten_mask,
                       "sink": sink, **extra})
    check_dtype(op, "query", query, FLOAT_DTYPES)
    check_same_dtype(op, "query", query.dtype, {"key": key, "value": value, "pse": pse,
                                                **{n: t for n, t in extra.items() if n in ("dy", "attention_in")}})
    check_dtype(op, "atten_mask", atten_mask, MASK_DTYPES)
    check_dtype(op, "sink", sink, (torch.float32,))
    check(head_num > 0, op, f"head_num must be positive, got {head_num}")
    check(0 < keep_prob <= 1, op, f"keep_prob must be in (0, 1], got {keep_prob}")
    check(inner_precise in (0, 1, 2), op, f"inner_precise must be 0, 1 or 2, got {inner_precise}")
    layout = input_layout.upper()
    check(layout in LAYOUTS, op, f"input_layout must be BSH, SBH, BSND, BNSD or TND, got {input_layout!r}")
    varlen = layout == "TND"
    modes = (0, 1, 2, 3, 4, 6, 7, 8) if varlen else (0, 1, 2, 3, 4, 5, 6)
    check(sparse_mode in modes, op, f"sparse_mode must be one of {modes} for input_layout {layout}, "
                                    f"got {sparse_mode}")
    check(softmax_layout in ("", "TND") and (softmax_layout == "" or varlen), op,
          f"softmax_layout must be '' or, with input_layout TND, 'TND'; got {softmax_layout!r}")

    if varlen:
        for name, x in (("query", query), ("key", key), ("value", value)):
            check_dim(op, name, x, 3, layout)
        (tq, nq, d), (tk, nk, dk), (tv, nv, dv) = query.shape, key.shape, value.shape
        check(head_num == nq, op, f"head_num {head_num} must equal the N of query {tuple(query.shape)}")
        check(actual_seq_qlen is not None and actual_seq_kvlen is not None, op,
              "input_layout TND needs actual_seq_qlen and actual_seq_kvlen")
        segs = tuple(segments(op, actual_seq_qlen, actual_seq_kvlen, tq, tk))
        batch, q_len, kv_len = len(segs), tq, tk
    else:
        check(actual_seq_qlen is None and actual_seq_kvlen is None, op,
              f"actual_seq_qlen / actual_seq_kvlen are for input_layout TND, not {layout}")
        b, nq, q_len, d = dense_dims(op, "query", query, layout, heads=head_num)
        bk, nk, kv_len, dk = dense_dims(op, "key", key, layout, head_dim=d)
        bv, nv, tv, dv = dense_dims(op, "value", value, layout, heads=nk)
        check(head_num == nq, op, f"head_num {head_num} must equal the N of query {tuple(query.shape)}")
        check(b == bk == bv, op, f"query, key and value must have one batch size, got {b}, {bk} and {bv}")
        tk, segs, batch = kv_len, None, b
    check(d == dk and dv <= dk and nk == nv and tk == tv, op,
          f"key and value must match (Dq = Dk >= Dv, one N and S), got query {tuple(query.shape)}, "
          f"key {tuple(key.shape)}, value {tuple(value.shape)}")
    check(nk > 0 and nq % nk == 0, op, f"the query heads ({nq}) must be a multiple of the key/value heads ({nk})")

    if sparse_mode in (5, 6):
        check(prefix is not None and len(prefix) == batch, op,
              f"sparse_mode {sparse_mode} needs prefix, one length per batch ({batch}), got {prefix}")
    if sparse_mode in (7, 8):
        check(pse is None, op, f"pse is not supported with sparse_mode {sparse_mode}")
    if atten_mask is not None:
        if sparse_mode in _masks.COMPRESSED_MODES:
            _masks.check_compressed(op, atten_mask, sparse_mode)
        elif varlen:
            longest_q = max((s.q_end - s.q_start for s in segs), default=0)
            longest_kv = max((s.kv_end - s.kv_start for s in segs), default=0)
            check(atten_mask.dim() == 2 and atten_mask.shape[0] >= longest_q and atten_mask.shape[1] >= longest_kv,
                  op, f"with input_layout TND atten_mask must be (maxSq, maxSkv) = at least "
                      f"({longest_q}, {longest_kv}), got shape {tuple(atten_mask.shape)}")
        else:
            if sparse_mode == 5:
                check(atten_mask.dim() == 4 and atten_mask.shape[0] == batch, op,
                      f"sparse_mode 5 needs a BNSS or B1SS atten_mask, got shape {tuple(atten_mask.shape)}")
            _masks.full_mask(op, atten_mask, batch=batch, heads=nq, sq=q_len, skv=kv_len, exact=True)
    if pse is not None:
        check(not varlen, op, "pse with input_layout TND (its alibi compression) is not simulated by npusim")
        ok = (pse.dim() == 4 and pse.shape[0] in (1, batch) and pse.shape[1] == nq and pse.shape[2] in (1, q_len)
              and pse.shape[3] == kv_len)
        check(ok, op, f"pse must be BNSS, BN1S or 1NSS ({batch}, {nq}, {q_len} or 1, {kv_len}), "
                      f"got shape {tuple(pse.shape)}")
    if sink is not None:
        check(tuple(sink.shape) == (nq,), op, f"sink must have shape ({nq},) (one per head), got {tuple(sink.shape)}")
    return Call(op, layout, nq, nk, d, dv, batch, q_len, kv_len, segs, sparse_mode, pre_tockens, next_tockens,
                None if prefix is None else tuple(int(p) for p in prefix), scale, keep_prob, softmax_layout)


class Block(NamedTuple):
    """One dense attention problem of a call, in the compute dtype (see Note [Attention precision])."""

    q: Tensor  # (B, Nq, Sq, D); B = 1 for a sequence of a TND batch
    k: Tensor
    v: Tensor
    masked: Tensor | None
    pse: Tensor | None
    keep: Tensor | None  # the dropout mask, True = kept
    segment: Segment | None  # where the block's rows are in a TND batch


def _sequence(x: Tensor, start: int, end: int, dtype: torch.dtype) -> Tensor:
    return x[start:end].transpose(0, 1).unsqueeze(0).to(dtype)


def blocks(call: Call, query: Tensor, key: Tensor, value: Tensor, atten_mask: Tensor | None,
           pse: Tensor | None, keep: Tensor | None) -> Iterator[Block]:
    """The blocks of a call; ``keep`` is the whole (numels,) dropout mask or None."""
    dtype = compute_dtype(query.dtype)
    device = query.device
    mode = call.sparse_mode
    if call.segments is None:
        q = to_bnsd(query, call.layout, call.q_heads).to(dtype)
        k = to_bnsd(key, call.layout, call.kv_heads).to(dtype)
        v = to_bnsd(value, call.layout, call.kv_heads).to(dtype)
        masked = None
        if atten_mask is not None:
            user = None if mode in _masks.COMPRESSED_MODES else _masks.full_mask(
                call.op, atten_mask, batch=call.batch, heads=call.q_heads, sq=call.q_len, skv=call.kv_len, exact=True)
            i = torch.arange(call.q_len, device=device).view(-1, 1)
            j = torch.arange(call.kv_len, device=device).view(1, -1)
            prefix = 0 if call.prefix is None else torch.tensor(call.prefix, device=device).view(-1, 1, 1, 1)
            masked = _masks.combine(user, _masks.geometry(mode, i, j, call.q_len, call.kv_len, pre=call.pre_tockens,
                                                          nxt=call.next_tockens, prefix=prefix))
        shape = (call.batch, call.q_heads, call.q_len, call.kv_len)
        yield Block(q, k, v, masked, None if pse is None else pse.to(dtype),
                    None if keep is None else keep.view(shape), None)
        return
    position = 0
    for index, seg in enumerate(call.segments):
        sq, skv = seg.q_end - seg.q_start, seg.kv_end - seg.kv_start
        size = call.q_heads * sq * skv
        if sq == 0:
            continue
        masked = None
        if atten_mask is not None:
            seq_mode = _masks.varlen_mode(mode, index, len(call.segments))
            user = None if mode in _masks.COMPRESSED_MODES else _masks.full_mask(
                call.op, atten_mask[:sq, :skv], batch=1, heads=call.q_heads, sq=sq, skv=skv, exact=True)
            i = torch.arange(sq, device=device).view(-1, 1)
            j = torch.arange(skv, device=device).view(1, -1)
            prefix = 0 if call.prefix is None else call.prefix[index]
            masked = _masks.combine(user, _masks.geometry(seq_mode, i, j, sq, skv, pre=call.pre_tockens,
                                                          nxt=call.next_tockens, prefix=prefix))
        seq_keep = None if keep is None else keep[position:position + size].view(1, call.q_heads, sq, skv)
        position += size
        yield Block(_sequence(query, seg.q_start, seg.q_end, dtype), _sequence(key, seg.kv_start, seg.kv_end, dtype),
                    _sequence(value, seg.kv_start, seg.kv_end, dtype), masked, None, seq_keep, seg)

