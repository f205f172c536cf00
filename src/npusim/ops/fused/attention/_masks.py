"""Which keys each query attends: op-plugin's sparse modes, pre/next tokens and atten_mask.

Masks here are boolean with op-plugin's convention: True (1) = the position is masked, not
attended. See Note [Sparse modes].

Note [Sparse modes]
~~~~~~~~~~~~~~~~~~~
op-plugin's docs (torch_npu-npu_fusion_attention.md, "参考资源") define, for query row i and
key column j of an Sq x Skv block:

- 0 defaultMask: the atten_mask as given, and only the band ``i - pre <= j <= i + next``
  (origin top left) is computed. Without an atten_mask nothing is masked and pre/next are
  ignored.
- 1 allMask: the atten_mask as given; pre/next ignored.
- 2 leftUpCausal: ``j <= i``.
- 3 rightDownCausal: ``j <= i + (Skv - Sq)``, the causal triangle anchored at the bottom
  right corner.
- 4 band: ``i + d - pre <= j <= i + d + next`` with ``d = Skv - Sq`` (origin bottom right).
- 5 prefix: rightDownCausal, plus the first ``prefix[b]`` columns of every row of batch b;
  the atten_mask is the full (B, 1 or N, Sq, Skv) mask of that shape.
- 6 prefix compressed: the same geometry, from a compressed (3072, 2048) atten_mask.
- 7 (varlen only) the split of a rightDownCausal sequence across devices: the last sequence
  of the batch is a band (mode 4 with the given pre/next), every other one rightDownCausal.
- 8 (varlen only) the split of a leftUpCausal sequence: the first sequence is a band (mode 4),
  every other one leftUpCausal.

Modes 2, 3, 4, 6, 7 and 8 take a compressed atten_mask (2048 x 2048; 3072 x 2048 for mode 6)
that only tells the NPU kernel where the triangle is; its shape is checked, the geometry above
decides (the docs make a mask that disagrees with its mode the caller's error). Where the
atten_mask is the full mask (modes 0, 1, 5) it is combined with the mode's geometry, which the
docs require to agree with it. For npu_fusion_attention an absent atten_mask turns every mode
into full attention, as its docs say; the inference operators require one for modes 2-4.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.ops.fused.attention._checks import INT_MAX, check, fail

COMPRESSED_SHAPE = (2048, 2048)
PREFIX_COMPRESSED_SHAPE = (3072, 2048)
# Modes whose atten_mask is compressed, with the shape it must have.
COMPRESSED_MODES = {2: COMPRESSED_SHAPE, 3: COMPRESSED_SHAPE, 4: COMPRESSED_SHAPE, 6: PREFIX_COMPRESSED_SHAPE,
                    7: COMPRESSED_SHAPE, 8: COMPRESSED_SHAPE}

Length = int | Tensor  # a block's length, or per batch a (B, 1, 1, 1) tensor


def _band(i: Tensor, j: Tensor, shift: Length, pre: int, nxt: int) -> Tensor:
    """Masked outside ``i + shift - pre <= j <= i + shift + nxt``."""
    offset = j - i - shift
    return (offset > nxt) | (-offset > pre)


def geometry(mode: int, i: Tensor, j: Tensor, q_len: Length, kv_len: Length, *, pre: int = INT_MAX,
             nxt: int = INT_MAX, prefix: Length = 0) -> Tensor | None:
    """The mask of ``mode`` (0, 2-6; modes 7 and 8 resolve per sequence to 3/4 or 2/4) at rows
    ``i`` and columns ``j`` of blocks of ``q_len`` x ``kv_len`` valid positions."""
    if mode == 0:
        return None if pre >= INT_MAX and nxt >= INT_MAX else _band(i, j, 0, pre, nxt)
    if mode == 1:
        return None
    if mode == 2:
        return j > i
    if mode == 3:
        return j > i + (kv_len - q_len)
    if mode == 4:
        return _band(i, j, kv_len - q_len, pre, nxt)
    if mode in (5, 6):
        return (j > i + (kv_len - q_len)) & (j >= prefix)
    raise AssertionError(f"sparse_mode {mode} has no single geometry")


def varlen_mode(mode: int, index: int, count: int) -> int:
    """The mode sequence ``index`` of ``count`` takes under modes 7 and 8 (Note [Sparse modes])."""
    if mode == 7:
        return 4 if index == count - 1 else 3
    if mode == 8:
        return 4 if index == 0 else 2
    return mode


def combine(*masks: Tensor | None) -> Tensor | None:
    """The union of the given masks (None: nothing masked)."""
    result = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else result | mask
    return result


def check_compressed(op: str, mask: Tensor, mode: int) -> None:
    """A compressed atten_mask: (R, C), (1, R, C) or (1, 1, R, C) with (R, C) the mode's shape."""
    shape = COMPRESSED_MODES[mode]
    ok = 2 <= mask.dim() <= 4 and tuple(mask.shape[-2:]) == shape and all(d == 1 for d in mask.shape[:-2])
    check(ok, op, f"atten_mask for sparse_mode {mode} must be the compressed {shape[0]}x{shape[1]} mask "
                  f"(shape {shape}, (1, ...) or (1, 1, ...)), got shape {tuple(mask.shape)}")


def full_mask(op: str, mask: Tensor, *, batch: int, heads: int, sq: int, skv: int, exact: bool,
              batch_rows: bool = False) -> Tensor:
    """A full atten_mask as a bool (B or 1, N or 1, Sq, Skv) tensor.

    Accepted: (Sq, Skv), (B or 1, Sq, Skv) and (B or 1, N or 1, Sq, Skv); with
    ``batch_rows`` (one query row per batch: the decode operators) also (B, Skv).
    Unless ``exact``, the last two axes may be longer than (Sq, Skv) (the inference
    operators' padded masks) and are cut to it.
    """
    shape = tuple(mask.shape)
    if batch_rows and mask.dim() == 2 and sq == 1:
        mask = mask.unsqueeze(1)  # (B, Skv) -> (B, 1, Skv)
    if mask.dim() == 2:
        mask = mask.view(1, 1, *mask.shape)
    elif mask.dim() == 3:
        mask = mask.unsqueeze(1)
    elif mask.dim() != 4:
        fail(op, f"atten_mask must be 2-D, 3-D or 4-D, got shape {shape}")
    rows, cols = mask.shape[-2:]
    fits = (rows, cols) == (sq, skv) if exact else rows >= sq and cols >= skv
    check(fits and mask.shape[0] in (1, batch) and mask.shape[1] in (1, heads), op,
          f"atten_mask of shape {shape} does not fit batch {batch}, heads {heads}, "
          f"query length {sq} and key length {skv}")
    mask = mask[..., :sq, :skv]
    return mask if mask.dtype == torch.bool else mask != 0
