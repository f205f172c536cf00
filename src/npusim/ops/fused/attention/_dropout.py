"""The attention dropout mask, drawn from the npu Philox generator at a given (seed, offset).

Note [Attention dropout from (seed, offset)]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
npu_fusion_attention returns the Philox ``seed`` and ``offset`` its dropout mask was drawn
at and the mask's length ``numels``; npu_fusion_attention_grad takes them back and draws the
same mask again instead of storing it, as the NPU does (op-plugin's
FlashAttentionKernelNpuOpApi.cpp: ``philox_engine_inputs`` in the forward, a stateless
``DropoutGenMask(seed, offset)`` in both directions).

npusim's npu generator is counter-based (Note [npu Philox stream] in csrc/generator.h):
element ``i`` of an elementwise random op that starts at offset ``o`` takes Philox block
``o + i``. So the mask is a pure function of (seed, offset, numels): a fresh
``torch.Generator("npu")`` seeded with ``seed`` and set to the offset draws
``uniform[i] < keep_prob`` for mask element i (1 = kept), and drawing it again in the
backward, or in ``_npu_dropout_gen_mask``, gives the same bits. The user's generator is only
read and advanced, once, by the forward: it hands out its current (seed, offset) and moves
the offset past the ``numels`` blocks the mask uses (rounded up to a multiple of 4, as every
npu random op does), so a random op after the attention never reuses the mask's numbers and
``torch.npu.manual_seed`` makes the whole sequence reproducible. The backward never touches
the user's generator. (torch_npu advances its generator by a fixed 10 here; npusim advances
by what the mask consumes, which keeps its generator's one-block-per-element rule.)

The mask's element order is op-plugin's: (B, N, Sq, Skv) row-major, and for input_layout TND
the sequences one after the other, each (N, Sq_i, Skv_i). ``dropout_mask`` tensors are
op-plugin's packed form: bit ``i % 8`` (little-endian bit order) of byte ``i // 8``, the
byte count rounded up to whole 128-bit words.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npusim.runtime.random import default_generator

_U64 = (1 << 64) - 1


def _as_int64(value: int) -> int:
    """The unsigned 64-bit seed as the signed int64 the op's schema returns (C++'s static_cast)."""
    value &= _U64
    return value - (1 << 64) if value >= 1 << 63 else value


def take_philox(device: torch.device, numels: int) -> tuple[int, int]:
    """The (seed, offset) the next ``numels`` random elements of ``device`` use; advances past them."""
    gen = default_generator(device)
    seed, offset = gen.initial_seed(), gen.get_offset()
    gen.set_offset(offset + (numels + 3) // 4 * 4)
    return _as_int64(seed), offset


def keep_mask(seed: int, offset: int, numels: int, keep_prob: float, device: torch.device) -> Tensor:
    """The (numels,) bool mask drawn at (seed, offset): True = kept (see the Note above)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed & _U64)
    start = offset - offset % 4  # the generator takes offsets in steps of 4; skip to `offset` in the draw
    gen.set_offset(start)
    uniform = torch.rand(numels + offset - start, generator=gen, device=device)
    return uniform[offset - start:] < keep_prob


def packed_length(numels: int) -> int:
    """Bytes of op-plugin's packed dropout mask of ``numels`` elements (whole 128-bit words)."""
    return (numels + 127) // 128 * 128 // 8


def pack(keep: Tensor) -> Tensor:
    """Bits little-endian into uint8 bytes, padded with zero bits to whole 128-bit words."""
    bits = torch.zeros(packed_length(keep.numel()) * 8, dtype=torch.uint8, device=keep.device)
    bits[:keep.numel()] = keep.reshape(-1).to(torch.uint8)
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8, device=keep.device)
    return (bits.view(-1, 8) * weights).sum(-1, dtype=torch.uint8)


def unpack(packed: Tensor, numels: int) -> Tensor:
    """The first ``numels`` bits of a packed mask, as bool."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = packed.reshape(-1, 1).bitwise_right_shift(shifts).bitwise_and(1)
    return bits.reshape(-1)[:numels].bool()
