"""npu_prompt_flash_attention, npu_incre_flash_attention, npu_fused_infer_attention_score.

op-plugin's inference attention (no backward): prefill, decode, and the fused operator
that is one or the other by the query's length, with their layouts, atten_mask and
sparse_mode 0-4, actual (valid) lengths, GQA (num_key_value_heads), pse_shift, left
padding, a paged key/value cache (block_table), a shared key/value prefix, the rope parts
of multi-head latent attention and softmax_lse. The computation is
:func:`npusim.ops.fused.attention._infer_call.attend`, at Note [Attention precision].
Quantized inputs and outputs (every quant / dequant / antiquant argument, int8 tensors)
stay out of scope and raise ArgumentNotSimulatedError naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from npusim.ops.fused._library import define
from npusim.ops.fused.attention import _masks
from npusim.ops.fused.attention._checks import (
    MASK_DTYPES,
    ArgumentNotSimulatedError,
    check,
    check_devices,
    check_dtype,
    check_same_dtype,
    refuse,
    rejecting_cpu_kernel,
)
from npusim.ops.fused.attention._core import compute_dtype
from npusim.ops.fused.attention._infer_call import (
    InferCall,
    attend,
    dense_heads,
    left_pad,
    output,
    paged,
    per_batch,
    split_layout,
    varlen,
)
from npusim.ops.fused.attention._layout import dense_dims, dense_shape

PFA, IFA, FIAS = "npu_prompt_flash_attention", "npu_incre_flash_attention", "npu_fused_infer_attention_score"
INFER_DTYPES = (torch.float16, torch.bfloat16)  # op-plugin: float16, bfloat16 (int8 only quantized)
_PACKED = ("TND", "NTD")
LAYOUTS = {
    PFA: ("BSH", "BSND", "BNSD", "BNSD_BSND", "TND"),
    IFA: ("BSH", "BSND", "BNSD"),
    FIAS: ("BSH", "BSND", "BNSD", "BNSD_BSND", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD", "TND", "TND_NTD", "NTD_TND",
           "NTD"),
}
_QUANTIZED = "quantized attention is out of scope"

PROMPT = define(
    "npu_prompt_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
    "Tensor? atten_mask=None, Tensor? pse_shift=None, int[]? actual_seq_lengths=None, Tensor? deq_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? deq_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
    "int num_heads=1, float scale_value=1.0, int pre_tokens=2147483647, int next_tokens=0, "
    "str input_layout=\"BSH\", int num_key_value_heads=0, int[]? actual_seq_lengths_kv=None, "
    "int sparse_mode=0) -> Tensor")
INCREMENTAL = define(
    "npu_incre_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
    "Tensor? atten_mask=None, Tensor? pse_shift=None, SymInt[]? actual_seq_lengths=None, "
    "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? block_table=None, "
    "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
    "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? kv_padding_size=None, int num_heads=1, "
    "float scale_value=1.0, str input_layout=\"BSH\", int num_key_value_heads=0, int block_size=0, "
    "int inner_precise=1) -> Tensor")
FUSED = define(
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
    "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
    "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
    "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
    "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
    "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
    "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
    "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
    "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, int antiquant_mode=0, "
    "int key_antiquant_mode=0, int value_antiquant_mode=0, bool softmax_lse_flag=False) -> (Tensor, Tensor)")


def _call(op: str, query: Tensor, key: Tensor, value: Tensor, a: dict[str, Any], *, decode: bool,
          lse: bool = False) -> InferCall:
    """Checks what every inference op shares and resolves its options."""
    for name in ("dequant_scale1", "deq_scale1", "quant_scale1", "dequant_scale2", "deq_scale2", "quant_scale2",
                 "quant_offset2", "antiquant_scale", "antiquant_offset", "key_antiquant_scale",
                 "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
                 "key_rope_antiquant_scale"):
        refuse(op, name, a.get(name), _QUANTIZED)
    refuse(op, "padding_mask", a.get("padding_mask"), "op-plugin reserves it, unused")
    tensors = {"query": query, "key": key, "value": value}
    optional = {name: a.get(name) for name in ("atten_mask", "pse_shift", "block_table", "key_shared_prefix",
                                               "value_shared_prefix", "query_rope", "key_rope")}
    check_devices(op, {**tensors, **optional})
    for name, tensor in tensors.items():
        if tensor.dtype in (torch.int8, torch.int32):
            raise ArgumentNotSimulatedError(f"{op}: {name} of dtype {tensor.dtype} (a quantized cache) is not "
                                            f"simulated by npusim ({_QUANTIZED})")
    check_dtype(op, "query", query, INFER_DTYPES)
    check_same_dtype(op, "query", query.dtype, {"key": key, "value": value, "pse_shift": optional["pse_shift"],
                                                "key_shared_prefix": optional["key_shared_prefix"],
                                                "value_shared_prefix": optional["value_shared_prefix"],
                                                "query_rope": optional["query_rope"], "key_rope": optional["key_rope"]})
    check_dtype(op, "atten_mask", optional["atten_mask"], (*MASK_DTYPES, torch.int8))
    in_layout, out_layout = split_layout(op, a["input_layout"], LAYOUTS[op])
    heads = a["num_heads"]
    kv_heads = a["num_key_value_heads"] or heads
    check(heads > 0 and kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64, op,
          f"num_heads ({heads}) must be a positive multiple of num_key_value_heads ({kv_heads}), at most 64 times it")
    requested = mode = a.get("sparse_mode", 0)
    if op == PFA and 10 <= mode <= 14:
        mode -= 10  # op-plugin: 10-14 are modes 0-4 in high precision, which npusim always computes
    check(0 <= mode <= 4, op, f"sparse_mode must be 0-4 (op-plugin does not support 5-8 here), got {requested}")
    mask = optional["atten_mask"]
    if mode >= 2 and not decode:
        check(mask is not None, op, f"sparse_mode {mode} needs its compressed atten_mask (2048x2048)")
        _masks.check_compressed(op, mask, mode)
    return InferCall(op, in_layout, out_layout, heads, kv_heads, a["scale"], mode, a.get("pre_tokens", 2147483647),
                     a.get("next_tokens", 2147483647), decode, a.get("actual_seq_lengths"),
                     a.get("actual_seq_lengths_kv"), a.get("block_size", 0), lse)


def _query_len(call: InferCall, query: Tensor) -> int:
    if call.in_layout in _PACKED:
        return 0
    return dense_dims(call.op, "query", query, call.in_layout, heads=call.num_heads).seq


def _run(call: InferCall, query: Tensor, key: Tensor, value: Tensor, a: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(attention_out, softmax_lse as (B, N, S, 1) / (T, N, 1), or a (1,) zero when not asked for)."""
    op, dtype = call.op, compute_dtype(query.dtype)
    if call.in_layout in _PACKED:
        for name in ("block_table", "query_padding_size", "kv_padding_size", "key_shared_prefix",
                     "value_shared_prefix", "pse_shift", "query_rope", "key_rope"):
            refuse(op, name, a.get(name), f"not simulated with input_layout {call.in_layout}")
        out, lse = varlen(call, query, key, value, atten_mask=a.get("atten_mask"), dtype=dtype)
        return output(call, out, query.dtype), _lse_output(call, lse)
    q = dense_heads(call, "query", query, call.num_heads)
    if a.get("query_rope") is not None:
        q = torch.cat([q, dense_heads(call, "query_rope", a["query_rope"], call.num_heads)], -1)
    batch, device = q.shape[0], q.device
    keys = [key, value] + ([a["key_rope"]] if a.get("key_rope") is not None else [])
    check((a.get("query_rope") is None) == (len(keys) == 2), op, "query_rope and key_rope come together")
    if a.get("block_table") is not None:
        check(call.block_size > 0 and call.actual_seq_lengths_kv is not None, op,
              "block_table (page attention) needs block_size > 0 and actual_seq_lengths_kv")
        k, v, *rope = (paged(op, n, t, a["block_table"], call.block_size, call.kv_heads)
                       for n, t in zip(("key", "value", "key_rope"), keys, strict=False))
    else:
        k, v, *rope = (dense_heads(call, n, t, call.kv_heads) for n, t in zip(("key", "value", "key_rope"), keys,
                                                                               strict=False))
    check(k.shape[0] == batch and k.shape[-1] + sum(r.shape[-1] for r in rope) == q.shape[-1]
          and k.shape[:3] == v.shape[:3], op,
          f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} do not match "
          f"in input_layout {call.in_layout} with num_heads {call.num_heads} / {call.kv_heads}")
    sq, skv = q.shape[2], k.shape[2]
    q_len = per_batch(op, "actual_seq_lengths", None if call.decode else call.actual_seq_lengths, batch, sq, device)
    kv_len = per_batch(op, "actual_seq_lengths_kv", call.actual_seq_lengths_kv, batch, skv, device)
    q_start = left_pad(op, "query_padding_size", a.get("query_padding_size"), q_len, sq, decode=False)
    kv_start = left_pad(op, "kv_padding_size", a.get("kv_padding_size"), kv_len, skv, decode=call.decode)
    if a.get("key_shared_prefix") is not None:
        check(not rope, op, "key_shared_prefix is not supported with query_rope / key_rope")
        k, v, kv_len = _with_prefix(call, a, k, v, kv_len)
    if rope:
        k = torch.cat([k, rope[0]], -1)
    out, lse = attend(call, q.to(dtype), k.to(dtype), v.to(dtype), atten_mask=a.get("atten_mask"),
                      pse=a.get("pse_shift"), q_start=q_start, q_len=q_len, kv_start=kv_start, kv_len=kv_len)
    return output(call, out, query.dtype), _lse_output(call, lse)


def _with_prefix(call: InferCall, a: dict[str, Any], k: Tensor, v: Tensor, kv_len: Tensor,
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """The shared prefix's valid part in front of every batch's keys and values."""
    op = call.op
    check(a.get("value_shared_prefix") is not None, op, "key_shared_prefix and value_shared_prefix come together")
    for name in ("block_table", "query_padding_size", "kv_padding_size"):
        check(a.get(name) is None, op, f"key_shared_prefix is not supported with {name}")
    kp, vp = (dense_heads(call, n, a[n], call.kv_heads) for n in ("key_shared_prefix", "value_shared_prefix"))
    check(kp.shape[0] == 1 and kp.shape[1:] == (*k.shape[1:2], kp.shape[2], k.shape[3]) and kp.shape == vp.shape, op,
          f"the shared prefix must be one batch matching key / value, got key_shared_prefix {tuple(kp.shape)}")
    length = kp.shape[2] if a.get("actual_shared_prefix_len") is None else int(a["actual_shared_prefix_len"][0])
    check(0 <= length <= kp.shape[2], op, f"actual_shared_prefix_len must be within 0..{kp.shape[2]}, got {length}")
    expand = (k.shape[0], -1, -1, -1)
    return (torch.cat([kp[:, :, :length].expand(expand), k], 2), torch.cat([vp[:, :, :length].expand(expand), v], 2),
            kv_len + length)


def _lse_output(call: InferCall, lse: Tensor) -> Tensor:
    if not call.lse:
        return torch.zeros(1, dtype=torch.float32, device=lse.device)
    return lse.contiguous()


def _shapes(call: InferCall, query: Tensor, value: Tensor) -> tuple[tuple[int, ...], ...]:
    """(attention_out, softmax_lse) shapes, for the fake kernels."""
    if call.in_layout in _PACKED:
        t, n = (query.shape[0], query.shape[1]) if call.in_layout == "TND" else (query.shape[1], query.shape[0])
        dv = value.shape[-1]
        out = (t, n, dv) if call.out_layout == "TND" else (n, t, dv)
        return out, ((t, n, 1) if call.lse else (1,))
    b, n, s, _ = dense_dims(call.op, "query", query, call.in_layout, heads=call.num_heads)
    dv = value.shape[-1] if value.dim() == 4 else value.shape[-1] // call.kv_heads
    return dense_shape(call.out_layout, b, n, s, dv), ((b, n, s, 1) if call.lse else (1,))


def _prompt_args(query: Tensor, key: Tensor, value: Tensor, *, padding_mask: Tensor | None = None,
                 atten_mask: Tensor | None = None, pse_shift: Tensor | None = None,
                 actual_seq_lengths: Sequence[int] | None = None, deq_scale1: Tensor | None = None,
                 quant_scale1: Tensor | None = None, deq_scale2: Tensor | None = None,
                 quant_scale2: Tensor | None = None, quant_offset2: Tensor | None = None, num_heads: int = 1,
                 scale_value: float = 1.0, pre_tokens: int = 2147483647, next_tokens: int = 0,
                 input_layout: str = "BSH", num_key_value_heads: int = 0,
                 actual_seq_lengths_kv: Sequence[int] | None = None, sparse_mode: int = 0) -> dict[str, Any]:
    args = dict(locals())
    args["scale"] = scale_value
    return args


def _incremental_args(query: Tensor, key: Tensor, value: Tensor, *, padding_mask: Tensor | None = None,
                      atten_mask: Tensor | None = None, pse_shift: Tensor | None = None,
                      actual_seq_lengths: Sequence[int] | None = None, antiquant_scale: Tensor | None = None,
                      antiquant_offset: Tensor | None = None, block_table: Tensor | None = None,
                      dequant_scale1: Tensor | None = None, quant_scale1: Tensor | None = None,
                      dequant_scale2: Tensor | None = None, quant_scale2: Tensor | None = None,
                      quant_offset2: Tensor | None = None, kv_padding_size: Tensor | None = None,
                      num_heads: int = 1, scale_value: float = 1.0, input_layout: str = "BSH",
                      num_key_value_heads: int = 0, block_size: int = 0, inner_precise: int = 1) -> dict[str, Any]:
    """IFA's actual_seq_lengths are the keys' valid lengths (the query has one token)."""
    args = dict(locals())
    args.update(scale=scale_value, actual_seq_lengths_kv=actual_seq_lengths, actual_seq_lengths=None)
    check(inner_precise in (0, 1), IFA, f"inner_precise must be 0 or 1, got {inner_precise}")
    return args


def _fused_args(query: Tensor, key: Tensor, value: Tensor, *, pse_shift: Tensor | None = None,
                atten_mask: Tensor | None = None, actual_seq_lengths: Sequence[int] | None = None,
                actual_seq_lengths_kv: Sequence[int] | None = None, dequant_scale1: Tensor | None = None,
                quant_scale1: Tensor | None = None, dequant_scale2: Tensor | None = None,
                quant_scale2: Tensor | None = None, quant_offset2: Tensor | None = None,
                antiquant_scale: Tensor | None = None, antiquant_offset: Tensor | None = None,
                key_antiquant_scale: Tensor | None = None, key_antiquant_offset: Tensor | None = None,
                value_antiquant_scale: Tensor | None = None, value_antiquant_offset: Tensor | None = None,
                block_table: Tensor | None = None, query_padding_size: Tensor | None = None,
                kv_padding_size: Tensor | None = None, key_shared_prefix: Tensor | None = None,
                value_shared_prefix: Tensor | None = None, actual_shared_prefix_len: Sequence[int] | None = None,
                query_rope: Tensor | None = None, key_rope: Tensor | None = None,
                key_rope_antiquant_scale: Tensor | None = None, num_heads: int = 1, scale: float = 1.0,
                pre_tokens: int = 2147483647, next_tokens: int = 2147483647, input_layout: str = "BSH",
                num_key_value_heads: int = 0, sparse_mode: int = 0, inner_precise: int = 0, block_size: int = 0,
                antiquant_mode: int = 0, key_antiquant_mode: int = 0, value_antiquant_mode: int = 0,
                softmax_lse_flag: bool = False) -> dict[str, Any]:
    check(inner_precise in (0, 1, 2, 3), FIAS, f"inner_precise must be 0-3, got {inner_precise}")
    return dict(locals())


def _fused_decode(query: Tensor, a: dict[str, Any]) -> bool:
    """FIAS decodes (IFA's branch) when the query has one token per batch."""
    layout = a["input_layout"].split("_")[0]
    if layout in _PACKED or layout not in ("BSH", "BSND", "BNSD"):
        return False
    return dense_dims(FIAS, "query", query, layout, heads=max(a["num_heads"], 1)).seq == 1


def _prompt_call(a: dict[str, Any]) -> InferCall:
    return _call(PFA, a["query"], a["key"], a["value"], a, decode=False)


def _incremental_call(a: dict[str, Any]) -> InferCall:
    call = _call(IFA, a["query"], a["key"], a["value"], a, decode=True)
    check(_query_len(call, a["query"]) == 1, IFA, f"the query must have one token per batch (decode), got "
                                                   f"{tuple(a['query'].shape)} in input_layout {call.in_layout}")
    return call


def _fused_call(a: dict[str, Any]) -> InferCall:
    decode = _fused_decode(a["query"], a)
    call = _call(FIAS, a["query"], a["key"], a["value"], a, decode=decode, lse=a["softmax_lse_flag"])
    check(not (decode and call.in_layout == "BNSD" and call.out_layout == "BSND"), FIAS,
          "input_layout BNSD_BSND needs more than one query token")
    return call


def prompt_flash_attention(*args: Any, **kwargs: Any) -> Tensor:
    a = _prompt_args(*args, **kwargs)
    return _run(_prompt_call(a), a["query"], a["key"], a["value"], a)[0]


def incre_flash_attention(*args: Any, **kwargs: Any) -> Tensor:
    a = _incremental_args(*args, **kwargs)
    return _run(_incremental_call(a), a["query"], a["key"], a["value"], a)[0]


def fused_infer_attention_score(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    a = _fused_args(*args, **kwargs)
    return _run(_fused_call(a), a["query"], a["key"], a["value"], a)


def _fake(parse_args: Any, make_call: Any, both: bool) -> Any:
    def fake(*args: Any, **kwargs: Any) -> Any:
        a = parse_args(*args, **kwargs)
        call = make_call(a)
        out_shape, lse_shape = _shapes(call, a["query"], a["value"])
        out = a["query"].new_empty(out_shape)
        return (out, a["query"].new_empty(lse_shape, dtype=torch.float32)) if both else out
    return fake


for _qualname, _kernel, _args, _make, _both in (
    (PROMPT, prompt_flash_attention, _prompt_args, _prompt_call, False),
    (INCREMENTAL, incre_flash_attention, _incremental_args, _incremental_call, False),
    (FUSED, fused_infer_attention_score, _fused_args, _fused_call, True),
):
    torch.library.register_kernel(_qualname, "PrivateUse1", _kernel)
    torch.library.register_kernel(_qualname, "CPU", rejecting_cpu_kernel(_qualname.split("::")[1]))
    torch.library.register_fake(_qualname, _fake(_args, _make, _both))
