"""Layout operators: ``npu_confusion_transpose`` (+ backward) and the format calls
``npu_format_cast`` / ``npu_format_cast_`` / ``get_npu_format``.

npu_confusion_transpose fuses a reshape and a permute (op-plugin's yaml and
``ConfusionTransposeKernelNpu.cpp``: permute then reshape if ``transpose_first``, else reshape
then permute); its backward undoes it with the inverse permutation and the input's shape.

Note [Where the npu format lives]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
torch_npu stores a tensor's format (ND, NCHW, FRACTAL_NZ, ...) in its storage's descriptor
(``NPUStorageImpl::npu_desc_``), not in the tensor: views, ``.data``, ``detach()`` and a
``copy_`` into the tensor keep it; a new storage (``clone()``, a copy to another device and
back) starts at the base format torch_npu guesses from the sizes (``InferFormat::GuessBaseFormat``:
NCDHW for 5-D, NCHW for 4-D, ND otherwise). npusim keeps the same rule: :data:`_FORMATS` maps a
storage (its Python object, which PyTorch keeps alive exactly as long as the storage) to the
format cast onto it, weakly, so the entry dies with the storage and a reused address never
inherits a stale format. The data is always ND: a cast records a format and moves no bytes.
``copy.deepcopy`` of a tensor copies its storage (``UntypedStorage.__deepcopy__``), and torch_npu's
storage deepcopy casts the copy to the source's format, so the copy keeps it: npusim wraps that one
method to carry the entry to the new storage (:func:`_keep_format_through_deepcopy`). An
``nn.Parameter`` deep-copies through ``clone()`` instead (PyTorch's ``Parameter.__deepcopy__``),
which on torch_npu too gives the base format.
The format is not saved by ``torch.save`` (a loaded tensor has the base format of its sizes;
its data, always ND, is the same). Three more simplifications against torch_npu: the base
format of a storage never cast follows the queried tensor's own sizes (torch_npu's follows the
sizes it was allocated with); ``torch.empty_like`` of a cast tensor starts at the base format
(torch_npu's ``empty_like`` keeps a private format); and ``npu_format_cast`` always returns a
new tensor (torch_npu returns the input itself, re-labelled, when source and target are both
base formats).

Note [Format casts that land elsewhere]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Two casts do not record the format asked for, as torch_npu's own tests
(``test/test_base_ops/test_format_cast.py`` in Ascend/op-plugin) observe:

- a 4-D tensor in a private format of the NCHW group (NC1HWC0, FRACTAL_Z, NC1HWC0_C04) cast
  to ND comes back NCHW: torch_npu casts across groups through the source's base format
  (``FormatCastHelper::format_cast_between_group``), and the test checks NC1HWC0 -> ND gives
  NCHW. (The 5-D casts of that test, NDC1HWC0 / FRACTAL_Z_3D -> ND, do give ND.) npusim
  applies the rule to the three NCHW-group formats alike;
- a tensor of fewer than 2 dimensions cast to FRACTAL_NZ stays ND with a warning
  (``InferFormat::GuessStorageFormat``: "Cannot create tensor with NZ format while dim < 2").
"""

from __future__ import annotations

import enum
import warnings
import weakref

import torch
from torch import Tensor

from npusim.ops.fused._checks import check, fail
from npusim.ops.fused._library import LIB, define, implement, register_autograd

CONFUSION_TRANSPOSE = define("npu_confusion_transpose(Tensor self, int[] perm, int[] shape, bool transpose_first) "
                             "-> Tensor")
CONFUSION_TRANSPOSE_BACKWARD = define("npu_confusion_transpose_backward(Tensor grad, int[] perm, SymInt[] shape, "
                                      "bool transpose_first) -> Tensor")
# The format calls are torch_npu's own (torch_npu/csrc/aten/npu_native_functions.yaml), not op-plugin's.
GET_NPU_FORMAT = define("get_npu_format(Tensor self) -> int")
GET_STORAGE_SIZE = define("get_storage_size(Tensor self) -> int")
FORMAT_CAST = define("npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None, "
                     "int? input_dtype=None) -> Tensor")
FORMAT_CAST_TENSOR = define("npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, "
                            "int? input_dtype=None) -> Tensor")
FORMAT_CAST_INPLACE = define("npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, "
                             "int? customize_dtype=None, int? input_dtype=None) -> Tensor(a!)")
FORMAT_CAST_INPLACE_TENSOR = define("npu_format_cast_(Tensor(a!) self, Tensor src, *, int? customize_dtype=None, "
                                    "int? input_dtype=None) -> Tensor(a!)")


class Format(enum.IntEnum):
    """``torch_npu.Format``: the ACL data formats (values as in ``aclFormat``)."""

    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47


# See Note [Where the npu format lives].
_FORMATS: weakref.WeakKeyDictionary[torch.UntypedStorage, Format] = weakref.WeakKeyDictionary()


def _keep_format_through_deepcopy() -> None:
    """Wraps ``torch.UntypedStorage.__deepcopy__`` (which typed storages and tensors reach) so that the
    copy of a storage with a recorded format has it too (idempotent). See Note [Where the npu format lives]."""
    original = torch.UntypedStorage.__deepcopy__
    if getattr(original, "__npusim_format__", False):
        return

    def __deepcopy__(self: torch.UntypedStorage, memo: dict) -> torch.UntypedStorage:  # noqa: N807
        new = original(self, memo)
        recorded = _FORMATS.get(self) if self.device.type == "npu" else None
        if recorded is not None and new is not self:
            _FORMATS[new] = recorded
        return new

    __deepcopy__.__npusim_format__ = True  # type: ignore[attr-defined]
    torch.UntypedStorage.__deepcopy__ = __deepcopy__  # type: ignore[method-assign]


_keep_format_through_deepcopy()


def _base_format(t: Tensor) -> Format:
    return {5: Format.NCDHW, 4: Format.NCHW}.get(t.dim(), Format.ND)


def format_of(t: Tensor) -> Format:
    """The format recorded on t's storage, else the base format of its sizes."""
    return _FORMATS.get(t.untyped_storage(), _base_format(t))


def _target(op: str, t: Tensor, acl_format: int) -> Format:
    check(acl_format in Format._value2member_map_, op, f"acl_format must be one of torch_npu.Format's values "
                                                       f"{sorted(Format._value2member_map_)}, got {acl_format}")
    target = Format(acl_format)
    check(target != Format.UNDEFINED, op, "acl_format must name a format, got UNDEFINED (-1)")
    return _landing(t, target)


# The private formats of the NCHW group. See Note [Format casts that land elsewhere].
_NCHW_GROUP = (Format.NC1HWC0, Format.FRACTAL_Z, Format.NC1HWC0_C04)


def _landing(t: Tensor, target: Format) -> Format:
    """The format a cast of t to target records. See Note [Format casts that land elsewhere]."""
    if target == Format.FRACTAL_NZ and t.dim() < 2:
        warnings.warn("Cannot create tensor with NZ format while dim < 2, tensor will be created with ND format.",
                      stacklevel=3)
        return Format.ND
    if target == Format.ND and t.dim() == 4 and format_of(t) in _NCHW_GROUP:
        return Format.NCHW
    return target


# -- npu_confusion_transpose ---------------------------------------------------------------------------------------

def _check_perm(op: str, perm: list[int], rank: int) -> None:
    check(sorted(perm) == list(range(rank)), op, f"perm must be a permutation of range({rank}), got {list(perm)}")


def _fresh(t: Tensor) -> Tensor:
    """A contiguous copy: the NPU kernel writes a new tensor, never a view of self."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _confusion(op: str, x: Tensor, perm: list[int], shape: list[int], transpose_first: bool) -> Tensor:
    try:
        if transpose_first:
            _check_perm(op, perm, x.dim())
            return x.permute(perm).reshape(shape)
        _check_perm(op, perm, len(shape))
        return x.reshape(shape).permute(perm)
    except RuntimeError as error:
        if str(error).startswith(op):
            raise
        fail(op, f"cannot {'permute by' if transpose_first else 'reshape to'} the given perm / shape: {error}")


def confusion_transpose(x: Tensor, perm: list[int], shape: list[int], transpose_first: bool) -> Tensor:
    return _fresh(_confusion("npu_confusion_transpose", x, perm, shape, transpose_first))


def _confusion_transpose_fake(x: Tensor, perm: list[int], shape: list[int], transpose_first: bool) -> Tensor:
    return _confusion("npu_confusion_transpose", x, perm, shape, transpose_first).contiguous()


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def _unconfuse(grad: Tensor, perm: list[int], shape: list[int], transpose_first: bool) -> Tensor:
    """The backward's layout change: ``shape`` is the forward input's, ``transpose_first`` the forward's negation."""
    op = "npu_confusion_transpose_backward"
    _check_perm(op, perm, len(perm))
    if transpose_first:
        check(grad.dim() == len(perm), op, f"grad must have one dim per perm entry ({len(perm)}), got {grad.dim()}-D")
        return grad.permute(_inverse(perm)).reshape(shape)
    check(len(perm) == len(shape), op, f"perm ({list(perm)}) and shape ({list(shape)}) must have one entry per dim")
    return grad.reshape([shape[p] for p in perm]).permute(_inverse(perm))


def confusion_transpose_backward(grad: Tensor, perm: list[int], shape: list[int], transpose_first: bool) -> Tensor:
    return _fresh(_unconfuse(grad, perm, shape, transpose_first))


def _confusion_transpose_backward_fake(grad: Tensor, perm: list[int], shape: list[int],
                                       transpose_first: bool) -> Tensor:
    return _unconfuse(grad, perm, shape, transpose_first).contiguous()


def _confusion_setup(ctx, inputs, output) -> None:
    x, ctx.perm, _, ctx.transpose_first = inputs
    ctx.input_shape = list(x.shape)


def _confusion_autograd(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
    # derivatives.yaml: npu_confusion_transpose_backward(grad, perm, self.sym_sizes(), !transpose_first)
    dx = torch.ops.npu.npu_confusion_transpose_backward(grad, ctx.perm, ctx.input_shape, not ctx.transpose_first)
    return dx, None, None, None


implement(CONFUSION_TRANSPOSE, confusion_transpose, _confusion_transpose_fake)
implement(CONFUSION_TRANSPOSE_BACKWARD, confusion_transpose_backward, _confusion_transpose_backward_fake)
register_autograd(CONFUSION_TRANSPOSE, _confusion_autograd, setup_context=_confusion_setup)


# -- formats -------------------------------------------------------------------------------------------------------

def get_npu_format(t: Tensor) -> int:
    return int(format_of(t))


def _get_npu_format_fake(t: Tensor) -> int:
    return int(_base_format(t))  # a traced tensor's storage is not the one the program will run on


def get_storage_size(t: Tensor) -> int:
    """The element count of t's storage (torch_npu: the product of its storage descriptor's sizes); every
    format's data is ND here (Note [Where the npu format lives]), so the storage's bytes over the element size."""
    return t.untyped_storage().nbytes() // t.element_size()


def _cast(t: Tensor, target: Format) -> Tensor:
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    _FORMATS[out.untyped_storage()] = target
    return out


def format_cast(t: Tensor, acl_format: int, *, customize_dtype: int | None = None,
                input_dtype: int | None = None) -> Tensor:
    """A copy of t whose storage has format acl_format. customize_dtype picks the NZ C0 size: no effect here."""
    return _cast(t, _target("npu_format_cast", t, acl_format))


def format_cast_tensor(t: Tensor, dst: Tensor, *, customize_dtype: int | None = None,
                       input_dtype: int | None = None) -> Tensor:
    """A copy of t in dst's format."""
    return _cast(t, _landing(t, format_of(dst)))


def format_cast_(t: Tensor, acl_format: int, *, customize_dtype: int | None = None,
                 input_dtype: int | None = None) -> Tensor:
    """Records acl_format on t's storage (every view of it sees it) and returns t."""
    _FORMATS[t.untyped_storage()] = _target("npu_format_cast_", t, acl_format)
    return t


def format_cast_like_(t: Tensor, src: Tensor, *, customize_dtype: int | None = None,
                      input_dtype: int | None = None) -> Tensor:
    _FORMATS[t.untyped_storage()] = _landing(t, format_of(src))
    return t


def _format_cast_fake(t: Tensor, *args, **kwargs) -> Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def _format_cast_inplace_fake(t: Tensor, *args, **kwargs) -> Tensor:
    return t


def _identity_autograd(ctx, grad: Tensor) -> tuple[Tensor, None]:
    # npu_format_cast changes the layout only: the gradient passes through (torch_npu's autograd does the same).
    return grad, None


implement(GET_NPU_FORMAT, get_npu_format, _get_npu_format_fake)
implement(GET_STORAGE_SIZE, get_storage_size, get_storage_size)  # sizes only: a fake storage has them too
implement(FORMAT_CAST, format_cast, _format_cast_fake)
implement(FORMAT_CAST_TENSOR, format_cast_tensor, _format_cast_fake)
implement(FORMAT_CAST_INPLACE, format_cast_, _format_cast_inplace_fake)
implement(FORMAT_CAST_INPLACE_TENSOR, format_cast_like_, _format_cast_inplace_fake)
register_autograd(FORMAT_CAST, _identity_autograd)
register_autograd(FORMAT_CAST_TENSOR, _identity_autograd)
# The in-place casts change no value: below autograd they record the format, nothing else.
for _name in ("npu_format_cast_.acl_format", "npu_format_cast_"):
    LIB.impl(_name, torch.library.fallthrough_kernel, "Autograd")
