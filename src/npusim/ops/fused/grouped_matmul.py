"""``npu_grouped_matmul``: many matmuls in one call, ``y_i = x_i @ weight_i + bias_i`` (op-plugin's formula 1).

Both overloads of op-plugin's yaml: ``group_list`` as a Tensor (the default overload, with
``group_list_type`` 0: cumulative sizes, 1: sizes) or as ``int[]`` (``.List``: cumulative). The
forms of ``torch_npu-npu_grouped_matmul.md`` (x / weight / y, "single" or "multi"):

- group_type -1 (no grouping): multi / multi / multi, ``y_i = x_i @ weight_i``, x_i 2-6-D;
- group_type 0 (the m axis): x single (M, K) split into groups of rows by group_list (weight
  one (E, K, N) tensor or E (K, N) tensors), or x multi (each x_i one group); y is the
  groups' results concatenated (split_item 2/3) or a list (0/1);
- group_type 2 (the k axis, how a weight gradient is computed): x (M, K) with its columns split
  by group_list; with split_item 2/3 one weight (K, N), ``y[e] = x[:, k_e] @ weight[k_e, :]``
  stacked to (E, M, N); with split_item 0/1 one weight per group (K_e, N_e), or one (E, K_e, N),
  and a list of the E (M, N_e) results (op-plugin's meta function and kernel).

The default overload needs ``group_type`` (op-plugin's kernel: "Requires manual passing
group_type, current is None."); the ``.List`` overload infers it (0 with a group_list, else -1).
Argument errors carry op-plugin's own messages where its kernel has one
(GroupedMatmulKernelNpuOpApi.cpp), after the op's name.

Only the unquantized formula is simulated: scale, offset, antiquant_*, per_token_scale and
the activation / dtype arguments of the quantized forms must stay unset. Products accumulate
in float32 (bias too: bfloat16 pairs with a float32 bias). torch_npu has no derivative for
it (trainers wrap it in an autograd.Function that calls it again, group_type 2 for the
weight): a backward through it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from npusim.ops.fused._checks import check, check_dim, check_dtype, compute_dtype
from npusim.ops.fused._library import define, implement, no_derivative

_QUANT_ARGS = "Tensor[]? scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, " \
              "Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None"
_ACT_ARGS = "Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, " \
            "Tensor[]? activation_quant_offset=None"
GROUPED_MATMUL = define(
    f"npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, {_QUANT_ARGS}, "
    f"Tensor? group_list=None, {_ACT_ARGS}, int? split_item=0, int? group_type=None, int? group_list_type=0, "
    "int? act_type=0, int[]? tuning_config=None, int? output_dtype=None, int? x_dtype=None, int? weight_dtype=None, "
    "int? scale_dtype=None, int? per_token_scale_dtype=None) -> Tensor[]")
GROUPED_MATMUL_LIST = define(
    f"npu_grouped_matmul.List(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, {_QUANT_ARGS}, "
    f"int[]? group_list=None, {_ACT_ARGS}, int? split_item=0, int? group_type=None, int? group_list_type=0, "
    "int? act_type=0, ScalarType? output_dtype=None) -> Tensor[]")

_OP = "npu_grouped_matmul"
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BIAS_DTYPE = {torch.float16: torch.float16, torch.bfloat16: torch.float32, torch.float32: torch.float32,
               torch.float64: torch.float64}
# output_dtype of the Tensor overload is an int: PyTorch's ScalarType enum values of the float dtypes.
_SCALAR_TYPE_NUMBER = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}


def _experts(weight: list[Tensor]) -> list[Tensor]:
    """The (K, N) weight of each group: one (E, K, N) tensor or E tensors."""
    return list(weight[0].unbind(0)) if len(weight) == 1 and weight[0].dim() == 3 else list(weight)


def _check_common(x: list[Tensor], weight: list[Tensor], bias: list[Tensor] | None, split_item: int,
                  group_type: int, group_list_type: int, act_type: int, output_dtype: Any,
                  unquantized: dict[str, Any]) -> None:
    for name, value in unquantized.items():
        check(value is None, _OP, f"{name} belongs to a quantized form, which is not simulated; it must be None")
    check(len(x) > 0 and len(weight) > 0, _OP, f"Invalid inputs: neither x nor weight could be empty. Got {len(x)} x "
                                               f"and {len(weight)} weight tensors")
    check(len(x) <= 128 and len(weight) <= 128, _OP, "x and weight hold at most 128 tensors each")
    check(split_item in (0, 1, 2, 3), _OP, f"Invalid value of split_item [{split_item}], which should only be one of "
                                           "0/1/2/3 (0/1: a list out, 2/3: one tensor).")
    check(group_type in (-1, 0, 2), _OP, f"The group type must be -1, 0 or 2, but now is [{group_type}] "
                                         "(-1: no grouping, 0: the m axis, 2: the k axis)")
    check(group_type != 2 or bias is None, _OP, "bias is not supported with group_type 2 (k axis); it must be None")
    check(group_list_type in (0, 1), _OP,
          f"group_list_type must be 0 (cumulative sizes) or 1 (sizes) when unquantized, got {group_list_type}")
    check(act_type == 0, _OP, f"act_type {act_type} fuses an activation only into the quantized forms; it must be 0")
    dtype = x[0].dtype
    for i, t in enumerate(x):
        check_dtype(_OP, f"x[{i}]", t, _DTYPES)
        check(t.dtype == dtype, _OP, f"x[{i}] must have the dtype of x[0] ({dtype}), got {t.dtype}")
    for i, w in enumerate(weight):
        check(w.dtype == dtype, _OP, f"weight[{i}] must have the dtype of x ({dtype}) when unquantized, got {w.dtype}")
        check_dim(_OP, f"weight[{i}]", w, (2, 3))
    want = _SCALAR_TYPE_NUMBER[dtype]
    check(output_dtype is None or output_dtype in (dtype, want), _OP,
          f"output_dtype must be None or x's dtype ({dtype}) when unquantized, got {output_dtype}")
    if bias is not None:
        experts = _experts(weight)
        shapes = ([(len(experts), experts[0].shape[1])] if len(weight) == 1 and weight[0].dim() == 3
                  else [(w.shape[1],) for w in experts])
        check(len(bias) == len(shapes), _OP, f"bias must hold {len(shapes)} tensors (one per weight), got {len(bias)}")
        for i, (b, shape) in enumerate(zip(bias, shapes, strict=True)):
            check(tuple(b.shape) == shape, _OP, f"bias[{i}] must have shape {shape}, got {tuple(b.shape)}")
            check(b.dtype == _BIAS_DTYPE[dtype], _OP, f"bias[{i}] must be {_BIAS_DTYPE[dtype]} for {dtype} x, "
                                                      f"got {b.dtype}")


def _resolve_group_type(group_type: int | None, group_list: Any, int_list: bool) -> int:
    """The Tensor overload needs group_type (op-plugin's kernel refuses None); the int-list overload infers it."""
    if group_type is None:
        check(int_list, _OP, "Requires manual passing group_type, current is None. Pass -1 (no grouping), "
                             "0 (the m axis) or 2 (the k axis).")
        return -1 if group_list is None else 0
    return group_type


def _sizes(op_values: list[int], group_list_type: int, total: int, what: str) -> list[int]:
    """Group sizes from group_list's values, checked against the grouped axis' length."""
    if group_list_type == 0:  # cumulative: op-plugin's kernel checks each step
        sizes = [b - a for a, b in zip([0, *op_values], op_values, strict=False)]
        for i, size in enumerate(sizes):
            check(size >= 0, _OP, f"group_list[0] should be larger than or equal to 0, but now is {size}." if i == 0
                  else f"group_list[{i}] - group_list[{i - 1}] should be larger than or equal to 0, but now is {size}.")
    else:
        check(all(v >= 0 for v in op_values), _OP, f"group_list must be non-negative sizes, got {op_values}")
        sizes = list(op_values)
    check(sum(sizes) == total, _OP, f"group_list must cover the {total} {what} exactly, got sizes {sizes}")
    return sizes


def _matmul(x: Tensor, w: Tensor, b: Tensor | None, acc: torch.dtype) -> Tensor:
    y = x.to(acc) @ w.to(acc)
    return y + b.to(acc) if b is not None else y


def _grouped_matmul(x: list[Tensor], weight: list[Tensor], bias: list[Tensor] | None, group_values: list[int] | None,
                    split_item: int, group_type: int, group_list_type: int) -> list[Tensor]:
    dtype, acc = x[0].dtype, compute_dtype(x[0].dtype)
    experts = _experts(weight)
    if bias is not None and len(weight) == 1 and weight[0].dim() == 3:
        biases: list[Tensor | None] = list(bias[0].unbind(0))
    else:
        biases = list(bias) if bias is not None else [None] * len(experts)
    if group_type == 2:
        return _k_axis(x, weight, group_values, split_item, group_list_type, acc, dtype)
    if group_type == 0 and len(x) == 1:
        check(group_values is not None, _OP, "group_type 0 with one x needs group_list (the rows of each group)")
        check_dim(_OP, "x[0]", x[0], (2,))
        sizes = _sizes(group_values, group_list_type, x[0].shape[0], "rows of x")
        _check_groups_per_weight(len(x), len(experts), len(sizes), split_item)
        pieces = list(x[0].split(sizes, 0))
    else:
        _check_x_per_weight(len(x), len(experts))
        pieces = list(x)
        if group_values is not None and group_type == 0:
            sizes = _sizes(group_values, group_list_type, sum(t.shape[0] for t in x), "rows of x")
            check(sizes == [t.shape[0] for t in x], _OP, f"group_list must give the rows of each x, got sizes {sizes}")
    for i, (xi, w) in enumerate(zip(pieces, experts, strict=True)):
        check(xi.shape[-1] == w.shape[0], _OP, f"x's group {i} ({tuple(xi.shape)}) and weight {i} ({tuple(w.shape)}) "
                                               "must share K")
    out = [_matmul(xi, w, b, acc).to(dtype) for xi, w, b in zip(pieces, experts, biases, strict=True)]
    if split_item in (2, 3):
        check(all(y.dim() == 2 for y in out) and len({y.shape[1] for y in out}) == 1, _OP,
              "split_item 2/3 concatenates 2-D results with one N")
        return [torch.cat(out)]
    return out


def _check_groups_per_weight(num_x: int, num_weight: int, num_groups: int, split_item: int = 0) -> None:
    if split_item in (2, 3):  # one x split among the weights: op-plugin's message is for 0/1 only
        check(num_weight == num_groups, _OP, f"group_list must give one group per weight ({num_weight}), got "
                                             f"{num_groups}")
        return
    check(num_x == 1 and num_weight == num_groups, _OP,
          "Invalid inputs. When split_item = 0 or 1 and input group_list is not None, the following two conditions "
          "are supposed to be satisfied: (1) length of x equals 1; (2) length of weight equals that of group_list. "
          f"Actual lengths: x [{num_x}], weight [{num_weight}], group_list [{num_groups}].")


def _check_x_per_weight(num_x: int, num_weight: int) -> None:
    check(num_x == num_weight, _OP, "When split_item = 0 or 1 and input group_list is None, the num of x tensors must "
                                    f"equal the num of weight tensors. Actual lengths: x [{num_x}], "
                                    f"weight [{num_weight}].")


def _check_k_axis_forms(x: list[Tensor], weight: list[Tensor], split_item: int, num_groups: int | None) -> None:
    """The shapes of group_type 2 (checked by the kernel and the fake kernel alike)."""
    check(len(x) == 1, _OP, f"group_type 2 (k axis) takes one x (M, K), got {len(x)} tensors")
    check_dim(_OP, "x[0]", x[0], (2,))
    check(num_groups is not None, _OP, "group_type 2 (k axis) needs group_list (the k sizes of the groups)")
    if split_item in (2, 3):
        check(len(weight) == 1 and weight[0].dim() == 2, _OP,
              "When group_list is 2(K_SPLIT) and split_item is 2/3, the length of weight must equal x: one weight "
              f"(K, N), got {len(weight)} of shapes {[tuple(w.shape) for w in weight]}")
        check(x[0].shape[1] == weight[0].shape[0], _OP, f"x (M, K) and weight (K, N) must share K, got "
                                                        f"{tuple(x[0].shape)} and {tuple(weight[0].shape)}")
    else:
        _check_groups_per_weight(len(x), len(_experts(weight)), num_groups)


def _k_axis(x: list[Tensor], weight: list[Tensor], group_values: list[int] | None, split_item: int,
            group_list_type: int, acc: torch.dtype, dtype: torch.dtype) -> list[Tensor]:
    """group_type 2: ``y[e] = x[:, k_e] @ w_e``, w_e the rows k_e of one weight (split_item 2/3, stacked) or
    the e-th weight (split_item 0/1, a list: the N of each may differ)."""
    _check_k_axis_forms(x, weight, split_item, None if group_values is None else len(group_values))
    xs = x[0]
    sizes = _sizes(group_values, group_list_type, xs.shape[1], "columns of x (the k axis)")
    if split_item in (2, 3):
        ws = list(weight[0].split(sizes, 0))
    else:
        ws = _experts(weight)
        for e, (size, w) in enumerate(zip(sizes, ws, strict=True)):
            check(w.shape[0] == size, _OP, f"weight {e} ({tuple(w.shape)}) must have group {e}'s k size ({size} "
                                           "rows, from group_list)")
    out = [_matmul(xk, wk, None, acc).to(dtype) for xk, wk in zip(xs.split(sizes, 1), ws, strict=True)]
    return [torch.stack(out)] if split_item in (2, 3) else out


def _host_values(group_list: Tensor | list[int] | None) -> list[int] | None:
    if isinstance(group_list, Tensor):
        check(group_list.dim() == 1 and group_list.dtype == torch.int64, _OP,
              f"group_list must be a 1-D int64 tensor, got {group_list.dim()}-D {group_list.dtype}")
        return [int(v) for v in group_list.tolist()]  # the sizes shape the work: read on the host
    return None if group_list is None else list(group_list)


def _run(x, weight, bias, group_list, split_item, group_type, group_list_type, act_type, output_dtype,
         unquantized, int_list) -> list[Tensor]:
    group_type = _resolve_group_type(group_type, group_list, int_list)
    _check_common(x, weight, bias, split_item, group_type, group_list_type, act_type, output_dtype, unquantized)
    return _grouped_matmul(x, weight, bias, _host_values(group_list), split_item, group_type, group_list_type)


def _fake(x, weight, bias, group_list, split_item, group_type, group_list_type, act_type, output_dtype,
          unquantized, int_list) -> list[Tensor]:
    """Shapes without the group sizes: those of a Tensor group_list are unbacked sizes for split_item 0/1."""
    group_type = _resolve_group_type(group_type, group_list, int_list)
    _check_common(x, weight, bias, split_item, group_type, group_list_type, act_type, output_dtype, unquantized)
    experts = _experts(weight)
    n = experts[0].shape[1]
    if group_type == 2:
        groups = None if group_list is None else (group_list.shape[0] if isinstance(group_list, Tensor)
                                                  else len(group_list))
        _check_k_axis_forms(x, weight, split_item, groups)
        m = x[0].shape[0]
        if split_item in (2, 3):
            return [x[0].new_empty((groups, m, weight[0].shape[1]))]
        return [x[0].new_empty((m, w.shape[1])) for w in experts]  # op-plugin's meta: each weight's own N
    if split_item in (2, 3):
        return [x[0].new_empty((sum(t.shape[0] for t in x), n))]
    if group_type == 0 and len(x) == 1:
        check(group_list is not None, _OP, "group_type 0 with one x needs group_list (the rows of each group)")
        _check_groups_per_weight(len(x), len(experts), len(group_list))
        if isinstance(group_list, Tensor):
            ctx = torch.library.get_ctx()
            rows = [ctx.new_dynamic_size() for _ in experts]
        else:
            rows = _sizes(list(group_list), 0, x[0].shape[0], "rows of x")
        return [x[0].new_empty((r, w.shape[1])) for r, w in zip(rows, experts, strict=True)]
    _check_x_per_weight(len(x), len(experts))
    return [t.new_empty((*t.shape[:-1], w.shape[1])) for t, w in zip(x, experts, strict=True)]


# The keyword arguments of the quantized forms (of either overload): each must stay unset.
_QUANTIZED = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale", "activation_input",
              "activation_quant_scale", "activation_quant_offset", "x_dtype", "weight_dtype", "scale_dtype",
              "per_token_scale_dtype")


def _kernel(body: Callable[..., list[Tensor]], int_list: bool) -> Callable[..., list[Tensor]]:
    """The kernel of one overload: ``body`` (:func:`_run` or :func:`_fake`) on the keyword arguments.

    The dispatcher may leave out keyword arguments equal to their defaults, hence ``get``;
    ``tuning_config`` is a tiling hint and has no effect here.
    """

    def grouped_matmul(x: list[Tensor], weight: list[Tensor], **options: Any) -> list[Tensor]:
        group_list_type = options.get("group_list_type") or 0
        if int_list:  # the .List overload: group_list is cumulative ints
            check(not group_list_type, _OP, f"group_list_type must be 0 with an int list group_list, got "
                                            f"{group_list_type}")
        unquantized = {name: options.get(name) for name in _QUANTIZED}
        split_item = options.get("split_item")
        return body(x, weight, options.get("bias"), options.get("group_list"), 0 if split_item is None else split_item,
                    options.get("group_type"), group_list_type, options.get("act_type") or 0,
                    options.get("output_dtype"), unquantized, int_list)

    return grouped_matmul


grouped_matmul = _kernel(_run, int_list=False)  # the default overload (group_list a Tensor)
implement(GROUPED_MATMUL, grouped_matmul, _kernel(_fake, int_list=False))
implement(GROUPED_MATMUL_LIST, _kernel(_run, int_list=True), _kernel(_fake, int_list=True))
no_derivative(GROUPED_MATMUL)
no_derivative(GROUPED_MATMUL_LIST)


@register_flop_formula(torch.ops.npu.npu_grouped_matmul, get_raw=True)
def _flop(x: list[Tensor], weight: list[Tensor], *, group_list: Any = None, group_type: int | None = None,
          **_: Any) -> int:
    """2 * M * K * N summed over the groups (PyTorch's mm formula per group), for FlopCounterMode and
    npusim's timing model (Note [Compute cost model])."""
    experts = _experts(weight)
    if group_type == 2:  # the k axis: y[e] = x[:, k_e] @ w_e, w_e (k_e, N_e) with sum(k_e) = K
        if len(experts) == 1 or len(weight) == 1 and weight[0].dim() == 2:
            return 2 * x[0].shape[0] * x[0].shape[1] * weight[0].shape[-1]
        return sum(2 * x[0].shape[0] * w.shape[0] * w.shape[1] for w in experts)
    if len(x) == 1 and len(experts) > 1:  # one x, its rows split among experts of one N
        return 2 * x[0].numel() * experts[0].shape[1]
    return sum(2 * xi.numel() * w.shape[1] for xi, w in zip(x, experts, strict=False))
