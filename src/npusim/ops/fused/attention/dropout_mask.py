"""``_npu_dropout_gen_mask``: op-plugin's packed dropout mask at a given Philox (seed, offset).

npu_fusion_attention's ``dropout_mask`` argument is documented as this op's output: the
mask of ``prod(size)`` elements, each kept with probability ``1 - p``, packed 8 to a byte
(see Note [Attention dropout from (seed, offset)]). It is a pure function of (seed, offset):
the same call gives the same bytes, and npu_fusion_attention given the same (seed, offset)
draws the same mask, so a forward with a dropout_mask and the backward that regenerates it
agree. ``parallel`` and ``sync`` only choose NPU streams.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from npusim.ops.fused._library import define
from npusim.ops.fused.attention import _dropout
from npusim.ops.fused.attention._checks import check, check_devices, rejecting_cpu_kernel

OP = "_npu_dropout_gen_mask"
# The op's only overload is "Tensor": define returns npu::_npu_dropout_gen_mask.Tensor, where kernels register.
_SCHEMA = ("_npu_dropout_gen_mask.Tensor(Tensor self, int[] size, float p, int seed, int offset, *, "
           "bool? parallel=True, bool? sync=None) -> Tensor")
GEN_MASK = define(_SCHEMA, tags=(torch.Tag.nondeterministic_seeded,))


def _check(self: Tensor, size: Sequence[int], p: float) -> int:
    check_devices(OP, {"self": self})
    check(0 <= p <= 1, OP, f"dropout probability has to be between 0 and 1, but got {p}")
    check(all(s >= 0 for s in size), OP, f"size must be non-negative, got {list(size)}")
    return math.prod(size)


def gen_mask(self: Tensor, size: Sequence[int], p: float, seed: int, offset: int, *, parallel: bool | None = True,
             sync: bool | None = None) -> Tensor:
    numels = _check(self, size, p)
    return _dropout.pack(_dropout.keep_mask(seed, offset, numels, 1.0 - p, self.device))


def gen_mask_fake(self: Tensor, size: Sequence[int], p: float, seed: int, offset: int, *,
                  parallel: bool | None = True, sync: bool | None = None) -> Tensor:
    return self.new_empty(_dropout.packed_length(_check(self, size, p)), dtype=torch.uint8)


torch.library.register_kernel(GEN_MASK, "PrivateUse1", gen_mask)
torch.library.register_kernel(GEN_MASK, "CPU", rejecting_cpu_kernel(OP))
torch.library.register_fake(GEN_MASK, gen_mask_fake)
