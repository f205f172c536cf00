"""The attention operators' tensor layouts and their (B, N, S, D) views.

op-plugin names axes B (batch), S (sequence), N (heads), D (head dim), H = N * D and, for
packed variable-length batches, T (all sequences' tokens one after another). A layout
string names the axes of a tensor in order: "BSH", "SBH", "BSND", "BNSD", "TND", "NTD";
"NBSD" is an output layout of the inference operators.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from torch import Tensor

from npusim.ops.fused.attention._checks import check, check_dim, check_divisible, fail

DENSE_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD")
VARLEN_LAYOUTS = ("TND", "NTD")


class Dims(NamedTuple):
    """A dense tensor's (B, N, S, D)."""

    batch: int
    heads: int
    seq: int
    head_dim: int


def dense_dims(op: str, name: str, x: Tensor, layout: str, *, heads: int | None = None,
               head_dim: int | None = None) -> Dims:
    """(B, N, S, D) of ``x`` in a dense layout; a 3-D layout's H splits by ``heads`` or ``head_dim``."""
    if layout in ("BSH", "SBH"):
        check_dim(op, name, x, 3, layout)
        batch, seq = (x.shape[0], x.shape[1]) if layout == "BSH" else (x.shape[1], x.shape[0])
        hidden = x.shape[2]
        if heads is not None:
            check_divisible(op, f"the hidden size of {name} by the number of heads {heads}", hidden, heads)
            return Dims(batch, heads, seq, hidden // heads)
        assert head_dim is not None
        check_divisible(op, f"the hidden size of {name} by the head dim {head_dim} of query", hidden, head_dim)
        return Dims(batch, hidden // head_dim, seq, head_dim)
    check_dim(op, name, x, 4, layout)
    if layout == "BSND":
        return Dims(x.shape[0], x.shape[2], x.shape[1], x.shape[3])
    if layout == "BNSD":
        return Dims(*x.shape)
    fail(op, f"unsupported input_layout {layout!r}")


def to_bnsd(x: Tensor, layout: str, heads: int) -> Tensor:
    """A (B, N, S, D) view of a dense tensor."""
    if layout == "BSH":
        return x.unflatten(2, (heads, -1)).transpose(1, 2)
    if layout == "SBH":
        return x.unflatten(2, (heads, -1)).permute(1, 2, 0, 3)
    if layout == "BSND":
        return x.transpose(1, 2)
    assert layout == "BNSD", layout
    return x


def from_bnsd(x: Tensor, layout: str) -> Tensor:
    """A contiguous tensor in ``layout`` (a dense layout or "NBSD") from (B, N, S, D)."""
    if layout == "BSH":
        return x.transpose(1, 2).flatten(2).contiguous()
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).flatten(2).contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "NBSD":
        return x.transpose(0, 1).contiguous()
    assert layout == "BNSD", layout
    return x.contiguous()


def dense_shape(layout: str, batch: int, heads: int, seq: int, head_dim: int) -> tuple[int, ...]:
    """The shape of a (B, N, S, D) tensor in ``layout`` (what :func:`from_bnsd` returns)."""
    return {
        "BSH": (batch, seq, heads * head_dim),
        "SBH": (seq, batch, heads * head_dim),
        "BSND": (batch, seq, heads, head_dim),
        "BNSD": (batch, heads, seq, head_dim),
        "NBSD": (heads, batch, seq, head_dim),
    }[layout]


def to_tnd(x: Tensor, layout: str) -> Tensor:
    """A (T, N, D) view of a packed tensor in "TND" or "NTD"."""
    return x if layout == "TND" else x.transpose(0, 1)


class Segment(NamedTuple):
    """One sequence of a packed batch: its rows of the query and of the keys/values."""

    q_start: int
    q_end: int
    kv_start: int
    kv_end: int


def segments(op: str, cum_q: Sequence[int], cum_kv: Sequence[int], total_q: int, total_kv: int,
             names: tuple[str, str] = ("actual_seq_qlen", "actual_seq_kvlen")) -> list[Segment]:
    """The sequences of a packed batch from op-plugin's cumulative lengths.

    ``cum_q[b]`` is the end row of sequence b (the sum of the lengths up to b); trailing
    zeros after the last sequence mark batch entries that take no part, as op-plugin allows.
    """
    check(len(cum_q) > 0 and len(cum_q) == len(cum_kv), op,
          f"{names[0]} and {names[1]} must be non-empty and of one length, got {len(cum_q)} and {len(cum_kv)}")
    result = []
    for cum, total, name in ((cum_q, total_q, names[0]), (cum_kv, total_kv, names[1])):
        ends = [int(c) for c in cum]
        while len(ends) > 1 and ends[-1] == 0 and max(ends) > 0:
            ends.pop()  # non-participating tail entries
        starts = [0, *ends[:-1]]
        check(all(s <= e for s, e in zip(starts, ends, strict=True)) and ends[-1] <= total and starts[0] >= 0, op,
              f"{name} must be non-decreasing cumulative lengths within the packed length {total}, "
              f"got {list(cum)}")
        result.append(list(zip(starts, ends, strict=True)))
    count = min(len(result[0]), len(result[1]))
    return [Segment(*result[0][b], *result[1][b]) for b in range(count)]
