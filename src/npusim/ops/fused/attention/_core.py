"""The arithmetic every npu attention operator shares, on dense (B, N, S, D) blocks.

See Note [Attention precision]. Grouped-query attention (fewer key/value heads than
query heads) is computed by viewing the query heads as (kv_heads, group): query head
``h`` attends with key/value head ``h // group``, as op-plugin's GQA does, without
repeating the keys and values.

Note [Attention precision]
~~~~~~~~~~~~~~~~~~~~~~~~~~
The NPU's flash-attention kernels take float16 / bfloat16 / float32 inputs, multiply on
the cube unit with float32 accumulation and run the softmax in float32. npusim computes
the scores ``QK^T``, the softmax with its row max and row sum, the dropout and ``P V``
in float32 (float64 stays float64, which only the tests' gradchecks of these helpers
use), and casts the result to the input dtype once at the end. The backward recomputes
the probabilities from the forward's softmax_max / softmax_sum, as the NPU's does.

A row whose every key is masked has no softmax; npusim gives it probability 0 (output
0, gradients 0, softmax_max -inf, softmax_sum 0), which is what op-plugin's
"invalid row" computation (``inner_precise=2``) is for; npusim always computes it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, except float64 (see Note [Attention precision])."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    """(B, Nq, ...) -> (B, kv_heads, Nq // kv_heads, ...), a view."""
    return x.unflatten(1, (kv_heads, x.shape[1] // kv_heads))


def scores(q: Tensor, k: Tensor, scale: float, pse: Tensor | None = None, *, pse_before_scale: bool = True,
           ) -> Tensor:
    """The logits (B, Nq, Sq, Skv): ``scale * (q k^T + pse)`` when ``pse_before_scale``
    (npu_fusion_attention's formula), else ``scale * q k^T + pse`` (the inference ops' pse_shift)."""
    kv_heads = k.shape[1]
    s = torch.matmul(_grouped(q, kv_heads), k.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    if pse is None:
        return s * scale
    if pse_before_scale:
        return (s + pse) * scale
    return s * scale + pse


class Softmax(NamedTuple):
    """Probabilities (B, N, Sq, Skv) and the row statistics (B, N, Sq, 1) they came from."""

    probs: Tensor
    row_max: Tensor
    row_sum: Tensor
    sink_probs: Tensor | None  # (B, N, Sq, 1): the share of each head's sink logit


def _sink_logit(sink: Tensor, like: Tensor) -> Tensor:
    return sink.to(like.dtype).view(1, -1, 1, 1)


def softmax(s: Tensor, masked: Tensor | None, sink: Tensor | None = None) -> Softmax:
    """Softmax over the last axis, ``masked`` (True = not attended) excluded; a per-head
    ``sink`` logit joins every row's denominator and is dropped from the result."""
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    if s.shape[-1] == 0:  # no keys at all: every row is fully masked
        row_max = s.new_full((*s.shape[:-1], 1), float("-inf"))
    else:
        row_max = s.amax(-1, keepdim=True)
    if sink is not None:
        row_max = torch.maximum(row_max, _sink_logit(sink, s))
    return _normalize(s, row_max, None, sink)


def softmax_from_stats(s: Tensor, masked: Tensor | None, row_max: Tensor, row_sum: Tensor,
                       sink: Tensor | None = None) -> Softmax:
    """The probabilities the forward produced, recomputed from its row max and row sum."""
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    return _normalize(s, row_max.to(s.dtype), row_sum.to(s.dtype), sink)


def _normalize(s: Tensor, row_max: Tensor, row_sum: Tensor | None, sink: Tensor | None) -> Softmax:
    # Comparisons, not torch.isinf: isinf's composite writes an abs into a resized output, which an npu graph
    # capture refuses (npu_fusion_attention_v3 is op-plugin's graph-mode attention).
    infinite = (row_max == float("inf")) | (row_max == float("-inf"))
    finite_max = torch.where(infinite, torch.zeros_like(row_max), row_max)
    e = torch.exp(s - finite_max)
    sink_e = None if sink is None else torch.exp(_sink_logit(sink, s) - finite_max)
    if row_sum is None:
        row_sum = e.sum(-1, keepdim=True)
        if sink_e is not None:
            row_sum = row_sum + sink_e
    # Fully masked rows have row_sum 0 and e 0 everywhere: probability 0 (Note [Attention precision]).
    divisor = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    sink_probs = None if sink_e is None else sink_e / divisor
    return Softmax(e / divisor, row_max, row_sum, sink_probs)


def apply_dropout(probs: Tensor, keep: Tensor | None, keep_prob: float) -> Tensor:
    """``probs * keep / keep_prob``: the dropped probabilities P V uses."""
    if keep is None:
        return probs
    return probs * keep.to(probs.dtype) * (1.0 / keep_prob)


def weighted_values(probs: Tensor, v: Tensor) -> Tensor:
    """``probs @ v`` with grouped heads: (B, Nq, Sq, Skv) x (B, Nkv, Skv, Dv) -> (B, Nq, Sq, Dv)."""
    return torch.matmul(_grouped(probs, v.shape[1]), v.unsqueeze(2)).flatten(1, 2)


class Gradients(NamedTuple):
    dq: Tensor
    dk: Tensor
    dv: Tensor
    dlogits: Tensor  # (B, Nq, Sq, Skv): d loss / d (q k^T), which is also d loss / d pse before the scale
    dsink: Tensor | None  # (Nq,)


def backward(dy: Tensor, q: Tensor, k: Tensor, v: Tensor, sm: Softmax, *, scale: float,
             keep: Tensor | None, keep_prob: float) -> Gradients:
    """The gradients of ``out = dropout(softmax(scores)) @ v`` for ``dy``, all (B, N, S, D) blocks."""
    kv_heads = k.shape[1]
    dropped = apply_dropout(sm.probs, keep, keep_prob)
    dy_g = _grouped(dy, kv_heads)
    dv = torch.matmul(_grouped(dropped, kv_heads).transpose(-1, -2), dy_g).sum(2)
    dprobs = torch.matmul(dy_g, v.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    dprobs = apply_dropout(dprobs, keep, keep_prob)
    row = (dprobs * sm.probs).sum(-1, keepdim=True)
    dlogits = sm.probs * (dprobs - row) * scale
    dlogits_g = _grouped(dlogits, kv_heads)
    dq = torch.matmul(dlogits_g, k.unsqueeze(2)).flatten(1, 2)
    dk = torch.matmul(dlogits_g.transpose(-1, -2), _grouped(q, kv_heads)).sum(2)
    # The sink column has no value row: its gradient is its probability times (0 - row).
    dsink = None if sm.sink_probs is None else -(sm.sink_probs * row).sum((0, 2, 3))
    return Gradients(dq, dk, dv, dlogits, dsink)
