"""``npu_fused_infer_attention_score.out``: the fused inference attention into caller-owned outputs.

op-plugin's ``.out`` overload takes the functional op's arguments plus ``workspace`` (the
buffer ``_npu_fused_infer_attention_score_get_max_workspace`` sizes, a performance detail the
simulation needs no memory for: accepted, unused) and writes ``attention_out`` and
``softmax_lse``, which it returns. Values are the functional op's (:mod:`.inference`); the
outputs follow PyTorch's out= convention: an output of another shape is resized (with
PyTorch's warning when it held elements), one of another dtype or device is refused.
The op carries PyTorch's ``out`` tag (its outputs are written, never read), which lets
torch.compile functionalize it (``auto_functionalized``); a compiled call takes outputs of
the result's shape, since a traced custom op may not resize its inputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._prims_common.wrappers import _maybe_resize_out

from npusim.ops.fused._library import define
from npusim.ops.fused.attention import inference
from npusim.ops.fused.attention._checks import check, rejecting_cpu_kernel

OP = inference.FIAS

# op-plugin's schema: the functional one's arguments, then workspace and the two outputs.
_FUNCTIONAL = torch.ops.npu.npu_fused_infer_attention_score.default._schema
_ARGUMENTS = str(_FUNCTIONAL).split("(", 1)[1].rsplit(") ->", 1)[0]
OUT = define(f"npu_fused_infer_attention_score.out({_ARGUMENTS}, Tensor? workspace=None, Tensor(a!) attention_out, "
             "Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))", tags=(torch.Tag.out,))


def _into(name: str, out: Tensor, result: Tensor, query: Tensor) -> Tensor:
    """Writes result into out (PyTorch's out= rules: resize, same dtype and device)."""
    check(out.dtype == result.dtype, OP, f"{name} must be {str(result.dtype).removeprefix('torch.')} (the result's "
                                         f"dtype), got {str(out.dtype).removeprefix('torch.')}")
    check(out.device == query.device, OP, f"{name} must be on {query.device} (where query is), got {out.device}")
    _maybe_resize_out(out, result.shape)
    return out.copy_(result)


def _check_workspace(query: Tensor, workspace: Tensor | None) -> None:
    if workspace is not None:
        check(workspace.device == query.device, OP,
              f"workspace must be on {query.device} (where query is), got {workspace.device}")


def fused_infer_attention_score_out(query: Tensor, key: Tensor, value: Tensor, *, attention_out: Tensor,
                                    softmax_lse: Tensor, workspace: Tensor | None = None,
                                    **options: Any) -> tuple[Tensor, Tensor]:
    _check_workspace(query, workspace)
    out, lse = inference.fused_infer_attention_score(query, key, value, **options)
    return _into("attention_out", attention_out, out, query), _into("softmax_lse", softmax_lse, lse, query)


def _fused_infer_attention_score_out_fake(query: Tensor, key: Tensor, value: Tensor, *, attention_out: Tensor,
                                          softmax_lse: Tensor, workspace: Tensor | None = None,
                                          **options: Any) -> tuple[Tensor, Tensor]:
    _check_workspace(query, workspace)
    a = inference._fused_args(query, key, value, **options)
    out_shape, lse_shape = inference._shapes(inference._fused_call(a), query, value)
    results = (("attention_out", attention_out, query.new_empty(out_shape)),
               ("softmax_lse", softmax_lse, query.new_empty(lse_shape, dtype=torch.float32)))
    for name, out, result in results:
        check(out.dtype == result.dtype, OP, f"{name} must be {str(result.dtype).removeprefix('torch.')} (the "
                                             f"result's dtype), got {str(out.dtype).removeprefix('torch.')}")
        _maybe_resize_out(out, result.shape)
    return attention_out, softmax_lse


torch.library.register_kernel(OUT, "PrivateUse1", fused_infer_attention_score_out)
torch.library.register_kernel(OUT, "CPU", rejecting_cpu_kernel(OP))
torch.library.register_fake(OUT, _fused_infer_attention_score_out_fake)
