"""npu_fusion_attention_v3 and npu_fusion_attention_grad_v3: npu_fusion_attention for graph mode.

op-plugin's docs (``torch_npu-npu_fusion_attention_v3.md``, Atlas A2 training) describe v3 as
the version of npu_fusion_attention that supports graph mode: the same formula, arguments and
outputs, except that

- ``actual_seq_qlen`` / ``actual_seq_kvlen`` are 1-D int64 tensors of cumulative lengths (a CPU
  tensor in op-plugin's docs; an npu tensor is read too), not int lists;
- the dropout's seed and offset come back as (1,) int64 tensors, not ints, and there is no
  ``numels`` output, no ``dropout_mask`` / ``seed`` / ``offset`` argument: with keep_prob < 1
  the mask is always drawn from the default npu generator;
- npu_fusion_attention_grad_v3 takes ``seed`` / ``offset`` as those tensors and no numels.

The arithmetic is npu_fusion_attention's (:mod:`.fusion`), so the two give the same numbers.
Autograd follows op-plugin's derivatives.yaml: v3's backward is grad_v3 with the forward's
statistics, output, seed and offset.

Note [npu_fusion_attention_v3 under torch.compile]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
With seed and offset as tensors the fake kernel needs no value it cannot know: it returns
(1,) int64 tensors on the query's device (as op-plugin's fake kernel does), and the seed
drawn at run time flows into the backward as a tensor, so dropout compiles with
``fullgraph=True`` (npu_fusion_attention graph-breaks there: its seed is an ``int``). The
seed and offset live on the npu in eager mode too (op-plugin's docs: a CPU tensor outside
aclgraph), so eager and compiled code see one device. The fake kernel cannot read the
cumulative lengths of TND (their values are data): it checks what the shapes decide and
leaves the lengths, and the atten_mask size they bound, to the kernel. npusim tags v3
``nondeterministic_seeded`` (op-plugin's yaml does not) so that torch.compile never
recomputes the forward in the backward with a fresh seed.

Note [npu_fusion_attention_v3 in an npu graph]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
op-plugin's docs: "aclgraph supports input_layout BNSD". Without dropout v3 and grad_v3
capture into an NPUGraph and replay (they read no device value on the host: the seed and
offset are filled on the device, and grad_v3 reads them only with dropout). With dropout the
captured forward cannot take its (seed, offset) on the host, as the generator's offset is the
replay's; it draws the mask graph-safely from the default generator (the same bits the eager
forward draws at the same generator state), returns offset -1 and leaves the mask for
grad_v3, which finds it by the forward's offset tensor (Note [Dropout inside an npu graph] in
_dropout.py). op-plugin's kernel writes the replay's real seed and offset into those tensors;
npusim's seed tensor holds the generator's seed and its offset tensor -1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from npusim.ops.fused._library import define
from npusim.ops.fused.attention import _dropout, _masks, fusion
from npusim.ops.fused.attention._checks import check, rejecting_cpu_kernel

OP, GRAD = "npu_fusion_attention_v3", "npu_fusion_attention_grad_v3"

# op-plugin's schemas (op_plugin/config/op_plugin_functions.yaml, docs/FUSED_OPS.md gives the commit).
FORWARD = define(
    "npu_fusion_attention_v3(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
    "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
    "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, SymInt[]? prefix=None, "
    "Tensor? actual_seq_qlen=None, Tensor? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
    "bool sync=False, str softmax_layout=\"\", Tensor? sink=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    tags=(torch.Tag.nondeterministic_seeded,))
BACKWARD = define(
    "npu_fusion_attention_grad_v3(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
    "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
    "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, "
    "float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, "
    "int inner_precise=0, Tensor? seed=None, Tensor? offset=None, SymInt[]? prefix=None, "
    "Tensor? actual_seq_qlen=None, Tensor? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
    "bool sync=False, str softmax_layout=\"\", Tensor? sink=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")

_LENGTHS = ("actual_seq_qlen", "actual_seq_kvlen")


def _forward_args(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                  pse: Tensor | None = None, padding_mask: Tensor | None = None, atten_mask: Tensor | None = None,
                  scale: float = 1.0, keep_prob: float = 1.0, pre_tockens: int = 2147483647,
                  next_tockens: int = 2147483647, inner_precise: int = 0, prefix: Sequence[int] | None = None,
                  actual_seq_qlen: Tensor | None = None, actual_seq_kvlen: Tensor | None = None,
                  sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False, softmax_layout: str = "",
                  sink: Tensor | None = None) -> dict[str, Any]:
    return dict(locals())


def _check_lengths(op: str, name: str, lengths: Tensor | None) -> None:
    check(lengths is None or (lengths.dim() == 1 and lengths.dtype in (torch.int64, torch.int32)), op,
          f"{name} must be a 1-D int64 tensor of cumulative sequence lengths, got "
          f"{lengths.dim() if lengths is not None else 0}-D {lengths.dtype if lengths is not None else ''}")


def _host_lengths(op: str, a: dict[str, Any]) -> dict[str, Any]:
    """a with the cumulative-length tensors as the int lists npu_fusion_attention takes (read on the host)."""
    out = dict(a)
    for name in _LENGTHS:
        _check_lengths(op, name, a[name])
        out[name] = None if a[name] is None else [int(v) for v in a[name].tolist()]
    return out


def _fake_lengths(op: str, a: dict[str, Any]) -> dict[str, Any]:
    """The lengths for the fake kernel: their values when known, else one sequence of all the tokens (the
    outputs' shapes do not depend on them), with the atten_mask check they bound left to the kernel.
    See Note [npu_fusion_attention_v3 under torch.compile]."""
    if all(a[name] is None or not (is_fake(a[name]) or a[name].device.type == "meta") for name in _LENGTHS):
        return _host_lengths(op, a)
    out = dict(a)
    for name, tensor in zip(_LENGTHS, (a["query"], a["key"]), strict=True):
        _check_lengths(op, name, a[name])
        out[name] = None if a[name] is None else [tensor.shape[0]]
    if a["sparse_mode"] not in _masks.COMPRESSED_MODES:
        out["atten_mask"] = None
    return out


def _philox_tensor(value: int, device: torch.device) -> Tensor:
    """A (1,) int64 tensor filled on the device (a fill, not a host copy: an npu graph may be capturing)."""
    return torch.full((1,), value, dtype=torch.int64, device=device)


def _forward(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    a = _host_lengths(OP, _forward_args(*args, **kwargs))
    device = a["query"].device
    if a["keep_prob"] < 1 and torch.npu.is_current_stream_capturing():
        return _forward_captured(a, device)
    out, softmax_max, softmax_sum, softmax_out, seed, offset, _ = fusion._forward(**a, op=OP)
    return out, softmax_max, softmax_sum, softmax_out, _philox_tensor(seed, device), _philox_tensor(offset, device)


def _forward_captured(a: dict[str, Any], device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Dropout inside an npu graph capture: a graph-safe mask, remembered for grad_v3 by the offset tensor
    (Note [Dropout inside an npu graph] in _dropout.py)."""
    keep = _dropout.draw_in_capture(device, fusion._parse(OP, a, {}).numels, a["keep_prob"])
    out, softmax_max, softmax_sum, softmax_out, _, _, _ = fusion._forward(**a, op=OP, keep=keep)
    seed = _philox_tensor(torch.npu.default_generators[device.index].initial_seed(), device)
    offset = _philox_tensor(_dropout.CAPTURED_OFFSET, device)
    _dropout.remember_captured(offset, keep)
    return out, softmax_max, softmax_sum, softmax_out, seed, offset


def _forward_fake(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    a = _fake_lengths(OP, _forward_args(*args, **kwargs))
    call = fusion._parse(OP, a, {})
    query = a["query"]
    stat = query.new_empty(fusion._stat_shape(call), dtype=torch.float32)
    philox = query.new_empty((1,), dtype=torch.int64)
    return (query.new_empty(fusion._out_shape(call)), stat, torch.empty_like(stat), query.new_empty(0), philox,
            torch.empty_like(philox))


def _grad_args(query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int, input_layout: str, *,
               pse: Tensor | None = None, padding_mask: Tensor | None = None, atten_mask: Tensor | None = None,
               softmax_max: Tensor | None = None, softmax_sum: Tensor | None = None,
               softmax_in: Tensor | None = None, attention_in: Tensor | None = None, scale_value: float = 1.0,
               keep_prob: float = 1.0, pre_tockens: int = 2147483647, next_tockens: int = 2147483647,
               inner_precise: int = 0, seed: Tensor | None = None, offset: Tensor | None = None,
               prefix: Sequence[int] | None = None, actual_seq_qlen: Tensor | None = None,
               actual_seq_kvlen: Tensor | None = None, sparse_mode: int = 0, gen_mask_parallel: bool = True,
               sync: bool = False, softmax_layout: str = "", sink: Tensor | None = None) -> dict[str, Any]:
    return dict(locals())


def _philox_value(name: str, value: Tensor | None, keep_prob: float) -> int:
    """The forward's seed / offset from its one-element tensor. Read only with dropout: without it the value is
    unused, and reading an npu tensor would synchronize (refused while an npu graph captures)."""
    if value is not None:
        check(value.numel() == 1 and not value.is_floating_point() and not value.is_complex(), GRAD,
              f"{name} must be the forward's one-element int64 tensor, got {value.dtype} of shape "
              f"{tuple(value.shape)}")
    if keep_prob == 1:
        return 0
    check(value is not None, GRAD, f"{name} (the forward's) is needed when keep_prob < 1, got None")
    return int(value.item())


def _backward(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    a = _host_lengths(GRAD, _grad_args(*args, **kwargs))
    keep = None
    if a["keep_prob"] < 1 and a["offset"] is not None:
        keep = _dropout.captured_mask(a["offset"])
    if keep is None:
        a["seed"], a["offset"] = (_philox_value(name, a[name], a["keep_prob"]) for name in ("seed", "offset"))
        check(a["offset"] != _dropout.CAPTURED_OFFSET, GRAD,
              f"offset {_dropout.CAPTURED_OFFSET} marks a forward captured in an npu graph: pass that forward's own "
              "offset tensor, by which its dropout mask is found (a copy of it does not carry the mask)")
    else:
        a["seed"] = a["offset"] = 0
    return fusion._backward(**a, numels=None, op=GRAD, keep=keep)


def _backward_fake(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    a = _fake_lengths(GRAD, _grad_args(*args, **kwargs))
    a["seed"] = a["offset"] = 0
    fusion._parse_grad(fusion._grad_args(**a, numels=None), GRAD)
    return fusion._empty_gradients(a)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    a = _forward_args(*inputs)
    out, softmax_max, softmax_sum, _, seed, offset = output
    ctx.save_for_backward(a["query"], a["key"], a["value"], a["pse"], a["atten_mask"], a["sink"], softmax_max,
                          softmax_sum, out, seed, offset, a["actual_seq_qlen"], a["actual_seq_kvlen"])
    ctx.options = {name: a[name] for name in (
        "head_num", "input_layout", "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "prefix",
        "sparse_mode", "gen_mask_parallel", "sync", "softmax_layout")}
    ctx.options["scale_value"] = a["scale"]
    ctx.has = (a["pse"] is not None, a["sink"] is not None)


def _autograd_backward(ctx: Any, dout: Tensor | None, *unused: Any) -> tuple[Tensor | None, ...]:
    """op-plugin's derivatives.yaml: query, key, value, pse, sink from npu_fusion_attention_grad_v3."""
    (query, key, value, pse, atten_mask, sink, softmax_max, softmax_sum, out, seed, offset, qlen,
     kvlen) = ctx.saved_tensors
    options = dict(ctx.options)
    dq, dk, dv, dpse, dsink = torch.ops.npu.npu_fusion_attention_grad_v3(
        query, key, value, torch.zeros_like(out) if dout is None else dout, options.pop("head_num"),
        options.pop("input_layout"), pse=pse, atten_mask=atten_mask, softmax_max=softmax_max,
        softmax_sum=softmax_sum, attention_in=out, seed=seed, offset=offset, actual_seq_qlen=qlen,
        actual_seq_kvlen=kvlen, sink=sink, **options)
    return fusion._gradients_by_argument(21, (dq, dk, dv, dpse, dsink), ctx.has)


for _qualname, _kernel, _fake in ((FORWARD, _forward, _forward_fake), (BACKWARD, _backward, _backward_fake)):
    torch.library.register_kernel(_qualname, "PrivateUse1", _kernel)
    torch.library.register_kernel(_qualname, "CPU", rejecting_cpu_kernel(_qualname.split("::")[1]))
    torch.library.register_fake(_qualname, _fake)
torch.library.register_autograd(FORWARD, _autograd_backward, setup_context=_setup_context)
