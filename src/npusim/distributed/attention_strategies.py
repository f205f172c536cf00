"""DTensor sharding of op-plugin's fused attention (``npu_fusion_attention`` and its grad, v1 and v3), as
torch_npu registers it (``torch_npu/distributed/tensor/_attention.py``).

A model whose attention is ``npu_fusion_attention`` (torchtitan-npu's converter, MindSpeed) runs under data
or tensor parallelism with DTensor query / key / value; without a strategy DTensor raises "does not have a
sharding strategy registered" naming the op. The strategy alone is not enough where heads are split: the op
takes the head count as an argument, and on each rank it must be the rank's share, so these ops also get a
DTensor op handler that computes the local call. See Note [Sharding npu_fusion_attention].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
from torch.distributed.tensor._redistribute import redistribute_local_tensor

from npusim.distributed.placements import PlacementList

__all__ = ["ATTENTION_OPS", "attention_handler", "attention_schema_info", "attention_shardings"]

npu = torch.ops.npu

# Note [Sharding npu_fusion_attention]
# Attention mixes positions along the sequence and nothing across batch entries or heads, so on one mesh
# dimension there are three ways to run it, as torch_npu's strategies have:
# - replicate: every tensor replicated (always valid);
# - batch: the layout's B split (BSH, SBH, BSND, BNSD), query / key / value / dy / attention_in alike, the
#   row statistics softmax_max / softmax_sum (B, N, S, 8) on 0, a 4-D mask with a batch of its own on 0
#   (one that broadcasts over the batch, or a 2-D one, replicated);
# - head: the layout's N split (BSND, BNSD), the statistics on 1, a 4-D mask with heads of its own on 1.
#   The op's head_num argument counts the heads the kernel sees, so each rank's call takes its own
#   query's head count (attention_handler); grouped-query attention splits the key / value heads alike.
# Only plain attention is split: with pse, padding_mask, prefix, actual sequence lengths, sink or a given
# dropout mask (which index positions or heads globally), or dropout (keep_prob < 1: the mask is drawn per
# call, so a split run would draw different bits), the op runs replicated. The other outputs (softmax_out,
# the gradients of pse and sink, which are empty here; v3's seed and offset) are replicated.
# DTensor reshards only positional arguments before a call, while the grad ops take the masks, statistics
# and attention_in by keyword, so the handler reshards every tensor argument itself, to the placements the
# strategy function gives for the way the propagator chose (one function decides both).

# Arguments whose presence makes the op index positions or heads globally. See the Note.
_GLOBAL = ("pse", "padding_mask", "prefix", "actual_seq_qlen", "actual_seq_kvlen", "sink", "dropout_mask")
# Split along the layout's B or N like query; the statistics on their own dimension (B, N, S, 8); every other
# tensor argument but the mask (v3's seed / offset, softmax_in) replicated.
_SPLIT_LIKE_QUERY = ("query", "key", "value", "dy", "attention_in")
_STATISTICS = ("softmax_max", "softmax_sum")


def _splittable(call: dict[str, Any]) -> bool:
    return all(call.get(name) is None for name in _GLOBAL) and call.get("keep_prob", 1.0) >= 1.0


def _kinds(call: dict[str, Any]) -> list[str]:
    """The ways of running this call (Note [Sharding npu_fusion_attention])."""
    layout = call["input_layout"]
    kinds = ["replicate"]
    if _splittable(call) and layout != "TND":
        kinds += [kind for kind, letter in (("batch", "B"), ("head", "N")) if letter in layout]
    return kinds


def _input_placement(name: str, value: Any, kind: str, layout: str) -> Placement:
    if kind == "replicate":
        return Replicate()
    letter, stat_dim = ("B", 0) if kind == "batch" else ("N", 1)
    if name in _SPLIT_LIKE_QUERY:
        return Shard(layout.index(letter))
    if name in _STATISTICS:
        return Shard(stat_dim)
    if name == "atten_mask" and value.ndim == 4 and value.shape[stat_dim] != 1:
        return Shard(stat_dim)
    return Replicate()


def _bind(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults filled in."""
    call = {}
    for i, argument in enumerate(op._schema.arguments):
        if i < len(args):
            call[argument.name] = args[i]
        elif argument.name in kwargs:
            call[argument.name] = kwargs[argument.name]
        else:
            call[argument.name] = argument.default_value if argument.has_default_value() else None
    return call


def _tensor_names(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any],
                  is_tensor: Callable[[Any], bool]) -> list[str]:
    """The names of the tensor arguments in the order DTensor lists them: positional, then keyword as given."""
    names = [a.name for a in op._schema.arguments[:len(args)]]
    return [n for n, v in zip(names, args, strict=True) if is_tensor(v)] + [k for k, v in kwargs.items()
                                                                               if is_tensor(v)]


def _output_placements(op: torch._ops.OpOverload, kind: str, layout: str) -> PlacementList:
    """The main outputs (attention_out with softmax_max / softmax_sum, or the three gradients) split like their
    inputs; the others replicated, the forward's integers without a placement."""
    placements: PlacementList = []
    for i, ret in enumerate(op._schema.returns):
        if not isinstance(ret.type, torch._C.TensorType):
            placements.append(None)
        elif kind == "replicate":
            placements.append(Replicate())
        elif op in _FORWARDS and i in (1, 2):
            placements.append(Shard(0 if kind == "batch" else 1))
        elif i < 3:
            placements.append(Shard(layout.index("B" if kind == "batch" else "N")))
        else:
            placements.append(Replicate())
    return placements


def attention_shardings(op: torch._ops.OpOverload) -> Callable[..., list[tuple[PlacementList, PlacementList]]]:
    """The register_sharding function of one of the attention ops."""

    def shardings(*args: DTensorSpec | Any, **kwargs: DTensorSpec | Any) -> list[tuple[PlacementList,
                                                                                     PlacementList]]:
        call = _bind(op, args, kwargs)
        names = _tensor_names(op, args, kwargs, lambda v: isinstance(v, DTensorSpec))
        layout = call["input_layout"]
        return [(_output_placements(op, kind, layout), [_input_placement(n, call[n], kind, layout) for n in names])
                for kind in _kinds(call)]

    return shardings


def attention_schema_info(op: torch._ops.OpOverload) -> RuntimeSchemaInfo:
    """What DTensor's sharding cache keys a call on: every argument from head_num on, by value, however
    passed. register_sharding's default keys only integer keyword arguments, so a call with pse or a mask
    given by keyword (the grad ops take them so) would reuse the strategies of a call without."""
    names = [a.name for a in op._schema.arguments]
    first = names.index("head_num")
    return RuntimeSchemaInfo(first, names[first:], needs_pytree=True)


def _kind_of(placement: Placement, layout: str) -> str:
    """Which way the propagator chose on one mesh dimension, read from the first output's placement."""
    if isinstance(placement, Shard):
        return "batch" if "B" in layout and placement.dim == layout.index("B") else "head"
    return "replicate"


def attention_handler(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """DTensor's call of an attention op: propagate, reshard every tensor argument to the chosen way, call the
    op on the local tensors with the rank's head count, wrap the results."""
    dispatcher = DTensor._op_dispatcher
    mesh = next(a.device_mesh for a in (*args, *kwargs.values()) if isinstance(a, DTensor))

    def as_dtensor(value: Any) -> Any:  # a plain tensor argument is the same on every rank
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
        return value

    args = tuple(as_dtensor(a) for a in args)
    kwargs = {k: as_dtensor(v) for k, v in kwargs.items()}
    op_info = dispatcher.unwrap_to_op_info(op, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    output_spec = op_info.output_sharding.output_spec
    call = _bind(op, args, kwargs)
    layout = call["input_layout"]
    kinds = [_kind_of(p, layout) for p in output_spec[0].placements]
    local = {}
    for name, value in call.items():
        if not isinstance(value, DTensor):
            local[name] = value
            continue
        target = DTensorSpec(mesh, tuple(_input_placement(name, value, kind, layout) for kind in kinds),
                             tensor_meta=value._spec.tensor_meta)
        local[name] = (value._local_tensor if target.placements == value._spec.placements
                       else redistribute_local_tensor(value._local_tensor, value._spec, target))
    if "head" in kinds:
        local["head_num"] = local["query"].size(layout.index("N"))
    return dispatcher.wrap(op(**local), output_spec)


_FORWARDS = (npu.npu_fusion_attention.default, npu.npu_fusion_attention_v3.default)
# The attention ops given a strategy and a handler.
ATTENTION_OPS = (*_FORWARDS, npu.npu_fusion_attention_grad.default, npu.npu_fusion_attention_grad_v3.default)
