"""DTensor sharding of op-plugin's ``npu_grouped_matmul`` (both overloads), as torch_npu gives it
(``torch_npu/distributed/tensor/_matrix_ops.py``): an MoE layer's experts as one call under tensor parallelism.

The op takes its operands as tensor lists (``x``, ``weight``, the keyword ``bias``), which DTensor's sharding
propagation does not reshard (it leaves keyword arguments alone, and lists in them unwrapped), so torch_npu
runs the op through a DTensor op handler of its own. npusim's handler decides the split directly from where
the operands sit, by one rule (:func:`split_of`), reshards what that rule asks for, and calls the op on the
local tensors. See Note [Sharding npu_grouped_matmul].
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._redistribute import redistribute_local_tensor

__all__ = ["GROUPED_MATMUL_OPS", "grouped_matmul_handler", "split_of"]

npu = torch.ops.npu

# Note [Sharding npu_grouped_matmul]
# Each pair computes y_i = x_i @ weight_i (+ bias_i): x's last dimension is the contracted k, weight's k is its
# first matrix dimension (0 of a (K, N) weight, 1 of an (E, K, N) one) and its n the last, bias's n its last.
# On one mesh dimension the call runs one of these ways, the same for every pair (torch_npu's strategies):
# - replicate: everything replicated;
# - n: weights (and biases) split on n, x replicated: y split on its last dimension;
# - k (no bias, which would be added once per rank): x split on k, weights on k: y Partial (sums);
# - linear (no bias): x Partial with weights replicated, or x replicated with weights Partial: y Partial;
# - rows (group_type -1, one weight per x): x split on a leading dimension, weights replicated: y split there.
# group_list (which rows or columns form each group) is replicated. The way is read from x[0] and weight[0]:
# the first way whose placements they hold, all operands alike, runs without moving anything; operands that
# match no way are gathered and the call runs replicated. group_type 2 (groups along k, the weight
# gradient's form) and the quantized arguments are not split: torch_npu raises NotImplementedError for the
# first, and so does npusim.

_QUANT = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale", "activation_input",
          "activation_quant_scale", "activation_quant_offset")


def _k_dim(weight: Any) -> int:
    return weight.ndim - 2


def operand_placements(way: str, x: Any, weight: Any, bias: Any | None, row: int = 0) -> tuple[Placement, ...]:
    """(x's, weight's, bias's) placement for ``way`` on one mesh dimension (bias's None without a bias)."""
    bias_place = None if bias is None else Replicate()
    if way == "n":
        return Replicate(), Shard(weight.ndim - 1), None if bias is None else Shard(bias.ndim - 1)
    if way == "k":
        return Shard(x.ndim - 1), Shard(_k_dim(weight)), bias_place
    if way == "x_partial":
        return Partial(), Replicate(), bias_place
    if way == "weight_partial":
        return Replicate(), Partial(), bias_place
    if way == "rows":
        return Shard(row), Replicate(), bias_place
    return Replicate(), Replicate(), bias_place


def _output_placement(way: str, y: torch.Tensor, row: int) -> Placement:
    if way == "n":
        return Shard(y.ndim - 1)
    if way == "rows":
        return Shard(row)
    return Partial() if way in ("k", "x_partial", "weight_partial") else Replicate()


def split_of(x: DTensor, weight: DTensor, *, has_bias: bool, one_weight_per_x: bool,
             mesh_dim: int) -> tuple[str, int]:
    """The way a call runs on ``mesh_dim`` (Note [Sharding npu_grouped_matmul]) and the row dimension split."""
    held = (x.placements[mesh_dim], weight.placements[mesh_dim])
    ways = ["n"] + ([] if has_bias else ["k", "x_partial", "weight_partial"])
    for way in ways:
        if held == operand_placements(way, x, weight, None)[:2]:
            return way, 0
    place_x = held[0]
    if (one_weight_per_x and isinstance(place_x, Shard) and place_x.dim < x.ndim - 1
            and held[1] == Replicate()):
        return "rows", place_x.dim
    return "replicate", 0


def _local(value: DTensor, placements: tuple[Placement, ...]) -> torch.Tensor:
    if tuple(value.placements) == placements:
        return value._local_tensor
    target = DTensorSpec(value.device_mesh, placements, tensor_meta=value._spec.tensor_meta)
    return redistribute_local_tensor(value._local_tensor, value._spec, target)


def grouped_matmul_handler(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """DTensor's call of npu_grouped_matmul: the way per mesh dimension, the operands resharded to it, the op on
    the local tensors, each y wrapped with its placements and global shape."""
    x_list, weight_list = list(args[0]), list(args[1])
    mesh = next(t.device_mesh for t in (*x_list, *weight_list) if isinstance(t, DTensor))

    def as_dtensor(value: Any) -> Any:  # a plain tensor is the same on every rank
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
        return value

    x_list, weight_list = [as_dtensor(t) for t in x_list], [as_dtensor(t) for t in weight_list]
    bias_list = [as_dtensor(t) for t in kwargs.get("bias") or []]
    group_type = kwargs.get("group_type")
    if group_type is not None and group_type > 0:
        raise NotImplementedError(f"npu_grouped_matmul on DTensor ({mesh.device_type}): group_type={group_type} "
                                  "is not supported (torch_npu's strategies split group_type -1 and 0 only)")
    quantized = any(kwargs.get(name) for name in _QUANT)
    one_weight_per_x = (len(x_list) == len(weight_list) > 1 and kwargs.get("group_list") is None
                        and kwargs.get("split_item") in (None, 0, 1))  # one y per x: a row split stays one
    ways = [("replicate", 0) if quantized else
            split_of(x_list[0], weight_list[0], has_bias=bool(bias_list), one_weight_per_x=one_weight_per_x,
                     mesh_dim=d) for d in range(mesh.ndim)]

    def placements_of(which: int, operand: DTensor) -> tuple[Placement, ...]:
        """The placements of operand (0: an x, 1: a weight, 2: a bias) on every mesh dimension."""
        pair = [x_list[0], weight_list[0], bias_list[0] if bias_list else None]
        pair[which] = operand
        return tuple(operand_placements(way, *pair, row)[which] for way, row in ways)

    local_kwargs = {}
    for name, value in kwargs.items():
        if name == "bias" and value:
            local_kwargs[name] = [_local(b, placements_of(2, b)) for b in bias_list]
        elif isinstance(value, torch.Tensor):  # group_list
            local_kwargs[name] = _local(as_dtensor(value), (Replicate(),) * mesh.ndim)
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            local_kwargs[name] = [_local(as_dtensor(t), (Replicate(),) * mesh.ndim) for t in value]
        else:
            local_kwargs[name] = value
    local_x = [_local(t, placements_of(0, t)) for t in x_list]
    local_weight = [_local(t, placements_of(1, t)) for t in weight_list]
    local_y = op(local_x, local_weight, *args[2:], **local_kwargs)
    results = []
    for i, y in enumerate(local_y):
        placements = tuple(_output_placement(way, y, row) for way, row in ways)
        # y_i's global size: its pair's n where n is split (one y per weight, or one y of a common n), x_i's rows
        # where rows are.
        weight, x = weight_list[min(i, len(weight_list) - 1)], x_list[min(i, len(x_list) - 1)]
        shape = list(y.shape)
        for way, row in ways:
            if way == "n":
                shape[-1] = weight.shape[-1]
            elif way == "rows":
                shape[row] = x.shape[row]
        results.append(DTensor.from_local(y, mesh, placements, run_check=False, shape=torch.Size(shape),
                                          stride=torch.empty(shape, device="meta").stride()))
    return results


# The overloads given the handler.
GROUPED_MATMUL_OPS = (npu.npu_grouped_matmul.default, npu.npu_grouped_matmul.List)
