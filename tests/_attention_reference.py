"""Independent references for the attention operator tests, written from op-plugin's formulas.

Everything here runs on CPU in float64 and repeats the key/value heads explicitly, so it
shares no code path with the kernels under test (which group heads and normalize by hand).
Masks are True where a position is not attended, and are built with ``triu`` / ``tril``
from the docs' definitions of each sparse mode.
"""

from __future__ import annotations

import torch
from torch import Tensor

BIG = 2147483647


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, masked: Tensor | None = None,
              pse: Tensor | None = None, pse_before_scale: bool = True, keep: Tensor | None = None,
              keep_prob: float = 1.0, sink: Tensor | None = None) -> Tensor:
    """softmax(scale * (q k^T + pse) [or scale * q k^T + pse], masked) [dropout] @ v on (B, N, S, D)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2)
    if pse is not None:
        s = (s + pse) * scale if pse_before_scale else s * scale + pse
    else:
        s = s * scale
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1)
    p = torch.nan_to_num(p, nan=0.0)  # fully masked rows: probability 0
    if sink is not None:
        p = p[..., :-1]
    if keep is not None:
        p = p * keep.to(p.dtype) / keep_prob
    return p @ v


def logsumexp(q: Tensor, k: Tensor, *, scale: float, masked: Tensor | None = None) -> Tensor:
    """The rows' log-sum-exp of the masked scaled scores, (B, N, Sq, 1)."""
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * scale
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    return torch.logsumexp(s, -1, keepdim=True)


def band(sq: int, skv: int, pre: int, nxt: int, *, bottom_right: bool) -> Tensor:
    """Masked outside the band of pre tokens before and next tokens after the diagonal."""
    shift = skv - sq if bottom_right else 0
    ones = torch.ones(sq, skv, dtype=torch.bool)
    return torch.triu(ones, diagonal=nxt + 1 + shift) | torch.tril(ones, diagonal=-pre - 1 + shift)


def sparse_mask(mode: int, sq: int, skv: int, *, pre: int = BIG, nxt: int = BIG, prefix: int = 0) -> Tensor | None:
    """The (Sq, Skv) geometry of a sparse mode (the atten_mask of modes 0 / 1 comes on top)."""
    if mode == 0:
        return band(sq, skv, pre, nxt, bottom_right=False)
    if mode == 1:
        return None
    if mode == 2:
        return band(sq, skv, BIG, 0, bottom_right=False)
    if mode == 3:
        return band(sq, skv, BIG, 0, bottom_right=True)
    if mode == 4:
        return band(sq, skv, pre, nxt, bottom_right=True)
    if mode in (5, 6):
        causal = band(sq, skv, BIG, 0, bottom_right=True)
        causal[:, :prefix] = False
        return causal
    raise ValueError(mode)


def compressed(mode: int = 3, device: str = "npu") -> Tensor:
    """The compressed atten_mask op-plugin's docs prescribe (upper triangle = 1)."""
    rows = 3072 if mode == 6 else 2048
    mask = torch.triu(torch.ones(rows, 2048, dtype=torch.bool), diagonal=1)
    if mode == 6:
        mask[2048:, :1024] = False
        mask[2048:, 1024:] = True
    return mask.to(device)


def to_bnsd(x: Tensor, layout: str, heads: int) -> Tensor:
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], heads, -1).permute(0, 2, 1, 3)
    if layout == "SBH":
        return x.reshape(x.shape[0], x.shape[1], heads, -1).permute(1, 2, 0, 3)
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    return x


def from_bnsd(x: Tensor, layout: str) -> Tensor:
    if layout == "BSH":
        return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(x.shape[2], x.shape[0], -1)
    if layout == "BSND":
        return x.permute(0, 2, 1, 3)
    if layout == "NBSD":
        return x.permute(1, 0, 2, 3)
    return x


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances for a kernel run in ``dtype`` against the float64 reference."""
    return {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=3e-3, rtol=3e-3),
            torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}[dtype]
