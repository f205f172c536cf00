"""The attention dropout mask, drawn from the npu Philox generator at a given (seed, offset).

Note [Attention dropout from (seed, offset)]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
npu_fusion_attention returns the Philox ``seed`` and ``offset`` its dropout mask was drawn
at and the mask's length ``numels``; npu_fusion_attention_grad takes them back and draws the
same mask again instead of storing it, as the NPU does (op-plugin's
FlashAttentionKernelNpuOpApi.cpp: ``philox_engine_inputs`` in the forward, a stateless
``DropoutGenMask(seed, offset)`` in both directions).

npusim's npu generator is counter-based (Note [npu Philox stream] in csrc/aten/generator.h):
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
from torch.multiprocessing.reductions import StorageWeakRef

from npusim.runtime.random import default_generator

_U64 = (1 << 64) - 1

# The offset a forward captured in an npu graph returns: the replay picks the real one.
CAPTURED_OFFSET = -1
# Masks of captured forwards by their offset tensor's storage (Note [Dropout inside an npu graph]).
_captured_masks: dict[StorageWeakRef, Tensor] = {}


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


# Note [Dropout inside an npu graph]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Inside an npu graph capture the generator's offset cannot be read on the host (each replay
# draws at the generator's state at replay time), so npu_fusion_attention_v3 draws its mask
# as ``torch.rand(numels) < keep_prob`` on the default generator, which the graph replays
# graph-safely. As eager offsets are multiples of 4, that is the very mask keep_mask(seed,
# offset) gives for the (seed, offset) the eager forward would take, so a replay after
# set_rng_state reproduces the eager results (op-plugin's dropout-in-aclgraph tests). The
# captured forward's offset tensor holds CAPTURED_OFFSET, not a real offset; the mask itself
# (a tensor of the graph, rewritten by every replay) is remembered by that tensor's storage,
# and npu_fusion_attention_grad_v3 given it (inside the capture, or after a replay) uses the
# mask instead of drawing one. The table holds a weak reference to the storage: an entry
# lives as long as the offset tensor does.


def draw_in_capture(device: torch.device, numels: int, keep_prob: float) -> Tensor:
    """The (numels,) keep mask from the default generator, graph-safe (see the Note above)."""
    return torch.rand(numels, device=device) < keep_prob


def remember_captured(offset: Tensor, keep: Tensor) -> None:
    """Records ``keep`` as the mask of the captured forward that returned ``offset``."""
    for ref in [ref for ref in _captured_masks if ref.expired()]:
        del _captured_masks[ref]
    _captured_masks[StorageWeakRef(offset.untyped_storage())] = keep


def captured_mask(offset: Tensor) -> Tensor | None:
    """The mask of the captured forward whose offset tensor shares ``offset``'s storage, else None."""
    return _captured_masks.get(StorageWeakRef(offset.untyped_storage()))
