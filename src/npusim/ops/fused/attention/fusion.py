"""npu_fusion_attention and npu_fusion_attention_grad: op-plugin's training flash attention.

    attention_out = Dropout(Softmax(Mask(scale * (pse + query @ key^T), atten_mask)), keep_prob) @ value

in every input_layout (BSH, SBH, BSND, BNSD, TND with actual_seq_qlen / actual_seq_kvlen),
sparse_mode 0-8 (Note [Sparse modes]), grouped-query attention, a per-head ``sink`` and
dropout from the npu Philox generator (Note [Attention dropout from (seed, offset)]), at the
precision of Note [Attention precision]. The outputs are op-plugin's: attention_out in the
query's layout, softmax_max and softmax_sum (float32, the row statistics repeated over a last
axis of 8: (B, N, Sq, 8), or (T, N, 8) for TND, holding N-major data unless
softmax_layout="TND"), an empty softmax_out (reserved), and the dropout's seed, offset and
mask length numels. Autograd runs npu_fusion_attention_grad with them.

Note [npu_fusion_attention under torch.compile]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The schema returns seed, offset and numels as ``int``, so a fake kernel must give their
values while tracing. numels is a function of the shapes, and without dropout (keep_prob 1),
with a caller's own ``seed`` or with a ``dropout_mask`` the seed and offset are the
arguments: the fake kernel returns them and a compiled graph (forward and backward) is exact.
A dropout drawn from the generator has a seed and offset known only when the kernel runs;
the fake kernel raises ``DataDependentOutputException`` for it, so dynamo breaks the graph at
the op and runs it eagerly (``fullgraph=True`` reports the op) rather than baking a traced
seed into the backward. (torch_npu's own meta kernel returns 0 there, and its docs say the op
does not support graph mode.) On the meta device the fake kernel returns 0 for both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

from npusim.ops.fused._library import define
from npusim.ops.fused.attention import _core, _dropout
from npusim.ops.fused.attention._checks import check, check_dtype, rejecting_cpu_kernel
from npusim.ops.fused.attention._fusion_call import Call, blocks, parse
from npusim.ops.fused.attention._layout import dense_shape, from_bnsd, to_bnsd

OP, GRAD = "npu_fusion_attention", "npu_fusion_attention_grad"
_SEEDED = (torch.Tag.nondeterministic_seeded,)

# op-plugin's schemas (op_plugin/config/op_plugin_functions.yaml, docs/FUSED_OPS.md gives the commit).
FORWARD = define(
    "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
    "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
    "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
    "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
    "bool sync=False, str softmax_layout=\"\", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, "
    "int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)", tags=_SEEDED)
BACKWARD = define(
    "npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, str input_layout, "
    "*, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? softmax_max=None, "
    "Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, float scale_value=1., "
    "float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
    "int seed=0, int offset=0, int numels=0, int[]? prefix=None, int[]? actual_seq_qlen=None, "
    "int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, "
    "str softmax_layout=\"\", Tensor? sink=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
STAT_WIDTH = 8  # op-plugin repeats each row statistic over a last axis of 8


def _parse(op: str, args: dict[str, Any], extra: dict[str, Tensor | None]) -> Call:
    return parse(op, args["query"], args["key"], args["value"], args["head_num"], args["input_layout"],
                 pse=args["pse"], padding_mask=args["padding_mask"], atten_mask=args["atten_mask"],
                 scale=args["scale"], keep_prob=args["keep_prob"], pre_tockens=args["pre_tockens"],
                 next_tockens=args["next_tockens"], inner_precise=args["inner_precise"], prefix=args["prefix"],
                 actual_seq_qlen=args["actual_seq_qlen"], actual_seq_kvlen=args["actual_seq_kvlen"],
                 sparse_mode=args["sparse_mode"], softmax_layout=args["softmax_layout"], sink=args["sink"],
                 extra=extra)


def _out_shape(call: Call) -> tuple[int, ...]:
    if call.segments is not None:
        return (call.q_len, call.q_heads, call.v_head_dim)
    return dense_shape(call.layout, call.batch, call.q_heads, call.q_len, call.v_head_dim)


def _stat_shape(call: Call) -> tuple[int, ...]:
    if call.segments is not None:
        return (call.q_len, call.q_heads, STAT_WIDTH)
    return (call.batch, call.q_heads, call.q_len, STAT_WIDTH)


def _forward_args(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                  pse: Tensor | None = None, padding_mask: Tensor | None = None, atten_mask: Tensor | None = None,
                  scale: float = 1.0, keep_prob: float = 1.0, pre_tockens: int = 2147483647,
                  next_tockens: int = 2147483647, inner_precise: int = 0, prefix: Sequence[int] | None = None,
                  actual_seq_qlen: Sequence[int] | None = None, actual_seq_kvlen: Sequence[int] | None = None,
                  sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False, softmax_layout: str = "",
                  sink: Tensor | None = None, dropout_mask: Tensor | None = None, seed: int = 0,
                  offset: int = 0) -> dict[str, Any]:
    """The forward's arguments by name (gen_mask_parallel and sync only choose NPU streams)."""
    return dict(locals())


def _keep_from_dropout_mask(call: Call, dropout_mask: Tensor, seed: int, offset: int) -> Tensor:
    """A caller's packed mask, which must be the one (seed, offset) draws: the backward draws it again."""
    check_dtype(OP, "dropout_mask", dropout_mask, (torch.uint8,))
    need = _dropout.packed_length(call.numels)
    check(dropout_mask.numel() >= (call.numels + 7) // 8, OP,
          f"dropout_mask must hold the {call.numels} mask bits ({need} bytes), got {dropout_mask.numel()} bytes")
    keep = _dropout.unpack(dropout_mask, call.numels)
    check(torch.equal(keep, _dropout.keep_mask(seed, offset, call.numels, call.keep_prob, keep.device)), OP,
          f"dropout_mask is not _npu_dropout_gen_mask(..., p={1 - call.keep_prob:g}, seed={seed}, offset={offset}); "
          "pass the seed and offset it was generated with (npu_fusion_attention_grad regenerates the mask from them)")
    return keep


def _forward(*args: Any, op: str = OP, keep: Tensor | None = None,
             **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, int, int, int]:
    """The forward; ``op`` names the operator in errors (npu_fusion_attention_v3 runs this too, passing the
    ``keep`` mask it drew itself inside an npu graph capture)."""
    a = _forward_args(*args, **kwargs)
    call = _parse(op, a, {"dropout_mask": a["dropout_mask"]})
    query, seed, offset = a["query"], a["seed"], a["offset"]
    if call.keep_prob < 1 and keep is None:
        if a["dropout_mask"] is not None:
            keep = _keep_from_dropout_mask(call, a["dropout_mask"], seed, offset)
        else:
            if seed == 0:  # op-plugin: seed 0 draws from the default generator
                seed, offset = _dropout.take_philox(query.device, call.numels)
            keep = _dropout.keep_mask(seed, offset, call.numels, call.keep_prob, query.device)
    out = query.new_zeros(_out_shape(call))
    stats = [torch.zeros(_stat_shape(call)[:-1], dtype=torch.float32, device=query.device) for _ in range(2)]
    for block in blocks(call, query, a["key"], a["value"], a["atten_mask"], a["pse"], keep):
        s = _core.scores(block.q, block.k, call.scale, block.pse, pse_before_scale=True)
        sm = _core.softmax(s, block.masked, a["sink"])
        o = _core.weighted_values(_core.apply_dropout(sm.probs, block.keep, call.keep_prob), block.v)
        _write(call, out, stats, block.segment, o, sm)
    softmax_max, softmax_sum = (_stat_output(call, stat) for stat in stats)
    return out, softmax_max, softmax_sum, query.new_empty(0), seed, offset, call.numels


def _write(call: Call, out: Tensor, stats: list[Tensor], segment: Any, o: Tensor, sm: _core.Softmax) -> None:
    """Stores a block's output and row statistics into the call's outputs."""
    if segment is None:
        out.copy_(from_bnsd(o, call.layout))
        stats[0].copy_(sm.row_max[..., 0])
        stats[1].copy_(sm.row_sum[..., 0])
        return
    rows = slice(segment.q_start, segment.q_end)
    out[rows] = o[0].transpose(0, 1)
    # A TND call keeps its statistics as (T, N) here; _stat_output arranges them.
    stats[0][rows] = sm.row_max[0, :, :, 0].transpose(0, 1)
    stats[1][rows] = sm.row_sum[0, :, :, 0].transpose(0, 1)


def _stat_output(call: Call, stat: Tensor) -> Tensor:
    """op-plugin's arrangement of a row statistic: repeated over 8; TND's default is N-major data."""
    if call.segments is not None and call.softmax_layout != "TND":
        stat = stat.transpose(0, 1).contiguous().view(call.q_len, call.q_heads)  # NTD data, (T, N) shape
    return stat.unsqueeze(-1).expand(*stat.shape, STAT_WIDTH).contiguous()


def _stat_input(call: Call, name: str, stat: Tensor, segment: Any, op: str = GRAD) -> Tensor:
    """A block's (B, N, Sq, 1) statistic from softmax_max / softmax_sum as the forward returned it."""
    check(tuple(stat.shape) == _stat_shape(call) and stat.dtype == torch.float32, op,
          f"{name} must be float32 of shape {_stat_shape(call)}, got {str(stat.dtype).removeprefix('torch.')} "
          f"{tuple(stat.shape)}")
    if segment is None:
        return stat[..., :1]
    per_row = stat[..., 0]
    if call.softmax_layout != "TND":
        per_row = per_row.contiguous().view(call.q_heads, call.q_len).transpose(0, 1)
    return per_row[segment.q_start:segment.q_end].transpose(0, 1).unsqueeze(0).unsqueeze(-1)


def _grad_args(query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int, input_layout: str, *,
               pse: Tensor | None = None, padding_mask: Tensor | None = None, atten_mask: Tensor | None = None,
               softmax_max: Tensor | None = None, softmax_sum: Tensor | None = None,
               softmax_in: Tensor | None = None, attention_in: Tensor | None = None, scale_value: float = 1.0,
               keep_prob: float = 1.0, pre_tockens: int = 2147483647, next_tockens: int = 2147483647,
               inner_precise: int = 0, seed: int = 0, offset: int = 0, numels: int = 0,
               prefix: Sequence[int] | None = None, actual_seq_qlen: Sequence[int] | None = None,
               actual_seq_kvlen: Sequence[int] | None = None, sparse_mode: int = 0, gen_mask_parallel: bool = True,
               sync: bool = False, softmax_layout: str = "", sink: Tensor | None = None) -> dict[str, Any]:
    """The backward's arguments by name; ``scale`` is ``scale_value`` (softmax_in is reserved, unused)."""
    args = dict(locals())
    args["scale"] = scale_value
    return args


def _parse_grad(a: dict[str, Any], op: str = GRAD) -> Call:
    call = _parse(op, a, {name: a[name] for name in ("dy", "softmax_max", "softmax_sum", "attention_in")})
    check(tuple(a["dy"].shape) == _out_shape(call), op,
          f"dy must have attention_out's shape {_out_shape(call)}, got {tuple(a['dy'].shape)}")
    check((a["softmax_max"] is None) == (a["softmax_sum"] is None), op,
          "softmax_max and softmax_sum come together (the forward's row statistics), or neither")
    return call


def _backward(*args: Any, op: str = GRAD, keep: Tensor | None = None,
              **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The backward; ``op`` names the operator in errors, and ``numels=None`` (npu_fusion_attention_grad_v3, which
    has no numels argument) takes the call's own mask length. ``keep``: the mask of a forward captured in an npu
    graph (npu_fusion_attention_grad_v3), instead of the one drawn at (seed, offset)."""
    a = _grad_args(*args, **kwargs)
    call = _parse_grad(a, op)
    query, key, value, dy, pse, sink = a["query"], a["key"], a["value"], a["dy"], a["pse"], a["sink"]
    if call.keep_prob < 1:
        check(a["numels"] is None or a["numels"] == call.numels, op,
              f"numels must be the forward's dropout mask length {call.numels}, got {a['numels']}")
        if keep is None:
            keep = _dropout.keep_mask(a["seed"], a["offset"], call.numels, call.keep_prob, query.device)
        check(keep.numel() == call.numels, op,
              f"seed and offset belong to a forward whose dropout mask has {keep.numel()} elements, "
              f"this call's has {call.numels}")
    else:
        keep = None
    grads = [torch.zeros_like(t) for t in (query, key, value)]
    dlogits, dsink = [], []
    dtype = _core.compute_dtype(query.dtype)
    for block in blocks(call, query, key, value, a["atten_mask"], pse, keep):
        s = _core.scores(block.q, block.k, call.scale, block.pse, pse_before_scale=True)
        if a["softmax_max"] is None:
            sm = _core.softmax(s, block.masked, sink)
        else:
            row_max, row_sum = (_stat_input(call, name, a[name], block.segment, op)
                                for name in ("softmax_max", "softmax_sum"))
            sm = _core.softmax_from_stats(s, block.masked, row_max, row_sum, sink)
        seg = block.segment
        block_dy = (to_bnsd(dy, call.layout, call.q_heads) if seg is None
                    else dy[seg.q_start:seg.q_end].transpose(0, 1).unsqueeze(0)).to(dtype)
        g = _core.backward(block_dy, block.q, block.k, block.v, sm, scale=call.scale, keep=block.keep,
                           keep_prob=call.keep_prob)
        parts = (g.dq, g.dk, g.dv)
        if seg is None:
            for grad, part in zip(grads, parts, strict=True):
                grad.copy_(from_bnsd(part, call.layout))
        else:
            rows = (slice(seg.q_start, seg.q_end), slice(seg.kv_start, seg.kv_end), slice(seg.kv_start, seg.kv_end))
            for grad, part, row in zip(grads, parts, rows, strict=True):
                grad[row] = part[0].transpose(0, 1)
        dlogits.append(g.dlogits)
        if g.dsink is not None:
            dsink.append(g.dsink)
    dpse = query.new_empty(0) if pse is None else dlogits[0].sum_to_size(pse.shape).to(pse.dtype)
    dsink_out = (torch.zeros(0, dtype=torch.float32, device=query.device) if sink is None
                 else torch.stack(dsink).sum(0).float() if dsink else torch.zeros_like(sink))
    return grads[0], grads[1], grads[2], dpse, dsink_out


def _forward_fake(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, int, int, int]:
    a = _forward_args(*args, **kwargs)
    call = _parse(OP, a, {"dropout_mask": a["dropout_mask"]})
    query, seed, offset = a["query"], a["seed"], a["offset"]
    if call.keep_prob < 1 and a["dropout_mask"] is None and seed == 0:
        if query.device.type != "meta":  # See Note [npu_fusion_attention under torch.compile]
            raise DataDependentOutputException(torch.ops.npu.npu_fusion_attention.default)
        seed, offset = 0, 0
    stat = query.new_empty(_stat_shape(call), dtype=torch.float32)
    return query.new_empty(_out_shape(call)), stat, torch.empty_like(stat), query.new_empty(0), seed, offset, \
        call.numels


def _empty_gradients(a: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The grad op's outputs, empty: dq, dk, dv like their inputs, dpse like pse (else empty), dsink in fp32."""
    query, pse, sink = a["query"], a["pse"], a["sink"]
    dpse = query.new_empty(0) if pse is None else torch.empty_like(pse)
    dsink = query.new_empty(0, dtype=torch.float32) if sink is None else torch.empty_like(sink)
    return torch.empty_like(query), torch.empty_like(a["key"]), torch.empty_like(a["value"]), dpse, dsink


def _backward_fake(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    a = _grad_args(*args, **kwargs)
    _parse_grad(a)
    return _empty_gradients(a)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    a = _forward_args(*inputs)
    out, softmax_max, softmax_sum, _, seed, offset, numels = output
    ctx.save_for_backward(a["query"], a["key"], a["value"], a["pse"], a["atten_mask"], a["sink"],
                          softmax_max, softmax_sum, out)
    ctx.options = {name: a[name] for name in (
        "head_num", "input_layout", "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "prefix",
        "actual_seq_qlen", "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync", "softmax_layout")}
    ctx.options.update(scale_value=a["scale"], seed=seed, offset=offset, numels=numels)
    ctx.has = (a["pse"] is not None, a["sink"] is not None)


def _autograd_backward(ctx: Any, dout: Tensor | None, *unused: Any) -> tuple[Tensor | None, ...]:
    query, key, value, pse, atten_mask, sink, softmax_max, softmax_sum, out = ctx.saved_tensors
    options = dict(ctx.options)
    dq, dk, dv, dpse, dsink = torch.ops.npu.npu_fusion_attention_grad(
        query, key, value, torch.zeros_like(out) if dout is None else dout, options.pop("head_num"),
        options.pop("input_layout"), pse=pse, atten_mask=atten_mask, softmax_max=softmax_max,
        softmax_sum=softmax_sum, attention_in=out, sink=sink, **options)
    return _gradients_by_argument(24, (dq, dk, dv, dpse, dsink), ctx.has)


def _gradients_by_argument(arguments: int, grads: tuple[Tensor, ...],
                           has: tuple[bool, bool]) -> tuple[Tensor | None, ...]:
    """One gradient per argument of a forward schema of ``arguments`` arguments: dq, dk, dv for query, key and
    value (0-2), dpse for pse (5) and dsink for sink (20) where the call gave them, None elsewhere."""
    dq, dk, dv, dpse, dsink = grads
    has_pse, has_sink = has
    out: list[Tensor | None] = [None] * arguments
    out[0:3] = dq, dk, dv
    out[5] = dpse if has_pse else None
    out[20] = dsink if has_sink else None
    return tuple(out)


def _block_shapes(call: Call) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(query, key, value) as (B, N, S, D) shapes for each dense block of the call."""
    if call.segments is None:
        yield ((call.batch, call.q_heads, call.q_len, call.head_dim),
               (call.batch, call.kv_heads, call.kv_len, call.head_dim),
               (call.batch, call.kv_heads, call.kv_len, call.v_head_dim))
        return
    for seg in call.segments:
        sq, skv = seg.q_end - seg.q_start, seg.kv_end - seg.kv_start
        yield (1, call.q_heads, sq, call.head_dim), (1, call.kv_heads, skv, call.head_dim), \
            (1, call.kv_heads, skv, call.v_head_dim)


# PyTorch's FLOP formulas for attention (torch.utils.flop_counter), block by block: what
# FlopCounterMode and npusim's timing model (Note [Compute cost model]) count. As for SDPA,
# masked-out blocks of a sparse mode are counted: the formula is the dense one.
@register_flop_formula(torch.ops.npu.npu_fusion_attention, get_raw=True)
def _forward_flop(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
    a = _forward_args(*args, **kwargs)
    call = _parse(OP, a, {"dropout_mask": a["dropout_mask"]})
    return sum(sdpa_flop_count(q, k, v) for q, k, v in _block_shapes(call))


@register_flop_formula(torch.ops.npu.npu_fusion_attention_grad, get_raw=True)
def _backward_flop(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
    call = _parse_grad(_grad_args(*args, **kwargs))
    return sum(sdpa_backward_flop_count((*q[:3], v[3]), q, k, v) for q, k, v in _block_shapes(call))


LIB_KERNELS = (
    (FORWARD, _forward, _forward_fake),
    (BACKWARD, _backward, _backward_fake),
)
for qualname, kernel, fake in LIB_KERNELS:
    torch.library.register_kernel(qualname, "PrivateUse1", kernel)
    torch.library.register_kernel(qualname, "CPU", rejecting_cpu_kernel(qualname.split("::")[1]))
    torch.library.register_fake(qualname, fake)
torch.library.register_autograd(FORWARD, _autograd_backward, setup_context=_setup_context)
