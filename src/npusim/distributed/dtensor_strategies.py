"""DTensor sharding strategies for ``aten.matmul`` and ``aten.matmul_backward``, as torch_npu registers.

:func:`register` also registers those of op-plugin's fused operators (npusim.distributed.fused_strategies,
npusim.distributed.attention_strategies).

torch_npu registers its own strategies for these two ops in DTensor's sharding propagator when it is
imported (``torch_npu/distributed/tensor/``), and frameworks written for Ascend build on them:
torchtitan-npu's ``patches/torch_npu/custom_shardings.py`` looks both ops up in
``DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs`` and wraps what it finds, failing at
import ("not found in original sharding registry") where they are missing. PyTorch registers
neither: ``matmul`` is a composite that DTensor decomposes, and ``matmul_backward`` has no strategy.
npusim's ``torch_npu`` calls :func:`register` on import (package/__init__.py).

The strategies are derived here from matmul's definition, per mesh dimension, through PyTorch's own
``register_sharding`` (which expands them over the mesh and prices the redistributions). See
Note [matmul's sharding strategies].

DTensor meets ``aten.matmul.default`` where the composite is not decomposed before it (under
``torch.inference_mode``, or where an autograd kernel of ``matmul`` is registered, as torch_npu's is),
and ``aten.matmul_backward.default`` where it is called (npusim.ops.matmul_backward is its npu kernel).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import Partial, Placement, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.experimental import register_sharding

from npusim.distributed.placements import PlacementList

__all__ = ["STRATEGY_OPS", "matmul_backward_shardings", "matmul_shardings", "register"]

aten = torch.ops.aten

# Note [matmul's sharding strategies]
# torch.matmul(a, b) is, with a 1-D ``a`` read as a row [1, k] and a 1-D ``b`` as a column [k, 1],
# out[..., m, n] = sum_k a[..., m, k] * b[..., k, n], batch dimensions broadcast from the right. On one
# mesh dimension each index can be the one split across ranks:
# - none: everything replicated;
# - k (contracted): a and b sharded on k, every rank holds a partial sum of out (Partial);
# - m (a's rows, a at least 2-D): a and out sharded on m, b replicated;
# - n (b's columns, b at least 2-D): b and out sharded on n, a replicated;
# - a batch dimension of out: each operand that has it at full size is sharded on it; one that lacks it
#   or broadcasts it (size 1) is replicated, as every rank needs all of it.
# matmul_backward(grad, a, b, mask) computes da = grad @ b^T and db = a^T @ grad, each summed back to its
# operand's shape. The same split of one index shards grad like out, a and b as above, and gives each
# gradient its operand's placement, except where that gradient sums over the split index: da sums over n
# (Partial when n is split), db over m (Partial when m is split), and an operand's gradient sums over a
# batch dimension the operand broadcasts or lacks (Partial when that dimension is split). Uneven splits
# are valid (DTensor pads them); register_sharding drops splits of a dimension smaller than the mesh.

def _batch_splits(a: DTensorSpec, b: DTensorSpec) -> list[tuple[int, Placement, Placement, bool, bool]]:
    """For each batch dimension of matmul's output: (out dim, a's placement, b's placement, whether a's
    gradient sums over it, whether b's does), splitting that dimension."""
    batch_a, batch_b = a.shape[:-2] if a.ndim > 1 else (), b.shape[:-2] if b.ndim > 1 else ()
    batch = torch.broadcast_shapes(batch_a, batch_b)
    splits = []
    for dim, size in enumerate(batch):
        placements, sums = [], []
        for operand_batch in (batch_a, batch_b):
            own = dim - (len(batch) - len(operand_batch))  # the operand's dimension aligned with it, if any
            holds = own >= 0 and operand_batch[own] == size
            placements.append(Shard(own) if holds else Replicate())
            sums.append(not holds)
        if size > 1:
            splits.append((dim, placements[0], placements[1], sums[0], sums[1]))
    return splits


def matmul_shardings(a: DTensorSpec, b: DTensorSpec) -> list[tuple[PlacementList, PlacementList]]:
    """The acceptable (output, inputs) placements of ``aten.matmul.default`` on one mesh dimension."""
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"aten.matmul.default on DTensor ({a.mesh.device_type}): both operands must be at "
                           f"least 1-D, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    out_ndim = len(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])) + (a.ndim > 1) + (b.ndim > 1)
    k_b = 0 if b.ndim == 1 else b.ndim - 2
    shardings: list[tuple[PlacementList, PlacementList]] = [
        ([Replicate()], [Replicate(), Replicate()]),
        ([Partial()], [Shard(a.ndim - 1), Shard(k_b)]),
    ]
    if a.ndim > 1:  # m: the second-to-last output dimension, or the last where b is 1-D
        shardings.append(([Shard(out_ndim - 1 - (b.ndim > 1))], [Shard(a.ndim - 2), Replicate()]))
    if b.ndim > 1:
        shardings.append(([Shard(out_ndim - 1)], [Replicate(), Shard(b.ndim - 1)]))
    for dim, place_a, place_b, _, _ in _batch_splits(a, b):
        shardings.append(([Shard(dim)], [place_a, place_b]))
    return shardings


def matmul_backward_shardings(grad: DTensorSpec, a: DTensorSpec, b: DTensorSpec,
                              mask: Sequence[bool]) -> list[tuple[PlacementList, PlacementList]]:
    """The acceptable ((grad_a, grad_b), (grad, a, b, mask)) placements of ``aten.matmul_backward.default``
    on one mesh dimension."""
    del mask  # which gradients are computed does not change where they live
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"aten.matmul_backward.default on DTensor ({a.mesh.device_type}): both operands must "
                           f"be at least 1-D, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    k_b = 0 if b.ndim == 1 else b.ndim - 2
    shardings: list[tuple[PlacementList, PlacementList]] = [
        ([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate(), None]),
        ([Shard(a.ndim - 1), Shard(k_b)], [Replicate(), Shard(a.ndim - 1), Shard(k_b), None]),
    ]
    if a.ndim > 1:  # m: db sums over it
        m_out = grad.ndim - 1 - (b.ndim > 1)
        shardings.append(([Shard(a.ndim - 2), Partial()], [Shard(m_out), Shard(a.ndim - 2), Replicate(), None]))
    if b.ndim > 1:  # n: da sums over it
        shardings.append(([Partial(), Shard(b.ndim - 1)], [Shard(grad.ndim - 1), Replicate(), Shard(b.ndim - 1),
                                                           None]))
    for dim, place_a, place_b, sums_a, sums_b in _batch_splits(a, b):
        shardings.append(([Partial() if sums_a else place_a, Partial() if sums_b else place_b],
                          [Shard(dim), place_a, place_b, None]))
    return shardings


# The ops given strategies, each with the function that derives them.
STRATEGY_OPS = {
    aten.matmul.default: matmul_shardings,
    aten.matmul_backward.default: matmul_backward_shardings,
}

_registered = False


def register() -> None:
    """Registers these strategies and op-plugin's fused operators' (npusim.distributed.fused_strategies and
    attention_strategies) in DTensor's sharding propagator (idempotent; a framework may wrap them afterwards,
    as torchtitan-npu does, and a second call does not undo that)."""
    global _registered
    if _registered:
        return
    # Both import this module's PlacementList.
    from npusim.distributed.attention_strategies import (
        ATTENTION_OPS,
        attention_handler,
        attention_schema_info,
        attention_shardings,
    )
    from npusim.distributed.fused_strategies import FUSED_STRATEGY_OPS
    from npusim.distributed.grouped_matmul_sharding import GROUPED_MATMUL_OPS, grouped_matmul_handler

    for op, shardings in {**STRATEGY_OPS, **FUSED_STRATEGY_OPS}.items():
        register_sharding(op)(shardings)
    # The attention ops' local call takes the rank's head count: a handler of DTensor's dispatcher computes it
    # (PyTorch's loss_parallel adds its handlers the same way). See Note [Sharding npu_fusion_attention].
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    for op in ATTENTION_OPS:
        register_sharding(op)(attention_shardings(op))
        propagator.op_to_schema_info[op] = attention_schema_info(op)
        DTensor._op_dispatcher._custom_op_handlers[op] = attention_handler
    # npu_grouped_matmul takes tensor lists, which DTensor's propagation leaves unsplit: a handler decides
    # (Note [Sharding npu_grouped_matmul]).
    for op in GROUPED_MATMUL_OPS:
        DTensor._op_dispatcher._custom_op_handlers[op] = grouped_matmul_handler
    _registered = True
