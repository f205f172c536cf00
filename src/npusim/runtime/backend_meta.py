"""Backend metadata of npu tensors: named integer fields that torch.save / torch.load, shallow
copies and fake tensors carry (See Note [npu backend metadata] in csrc/aten/backend_meta.cpp).

PyTorch gives a backend one slot per tensor for metadata of its own, which torch_npu uses to
carry its storage descriptor through serialization; npusim keeps a map of named integer fields
there::

    from npusim.runtime import backend_meta

    backend_meta.set_field(t, "version", 2)
    backend_meta.get(t)                      # {"version": 2}
    torch._utils.get_tensor_metadata(t)      # {"npusim/version/2": True}, what torch.save writes

(The npu storage format of ``torch_npu.npu_format_cast`` is a property of the storage, not of the
tensor, and lives with the storage: Note [Where the npu format lives] in ops/fused/layout.py.)

What carries the fields: ``torch.save`` / ``torch.load`` (also with ``map_location`` to another
npu; loading onto the CPU drops them), ``detach()``, ``.data`` and other shallow copies (each gets
its own copy), :func:`copy` (PyTorch's ``_copy_backend_meta``, which torch 2.13 lacks), and
``FakeTensorMode.from_tensor`` (See Note [Backend metadata of fake tensors]). What does not: views
and the results of ops, which are new tensors (set the field on them where it applies).
"""

from __future__ import annotations

import torch

from npusim.runtime import acl

__all__ = ["clear", "copy", "get", "install_fake_tensor_hook", "set_field"]


def get(t: torch.Tensor) -> dict[str, int]:
    """The fields of npu tensor ``t`` (a new dict; empty when none is set)."""
    return dict(acl.get_backend_meta(t))


def set_field(t: torch.Tensor, name: str, value: int) -> None:
    """Sets field ``name`` of npu tensor ``t`` to ``value`` (an integer; names may not contain '/')."""
    if not name or "/" in name:
        raise ValueError(f"npusim backend metadata: a field name is non-empty and has no '/', got {name!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"npusim backend metadata: field {name!r} takes an int, got {type(value).__name__}")
    acl.set_backend_meta(t, {**acl.get_backend_meta(t), name: value})


def clear(t: torch.Tensor, name: str | None = None) -> None:
    """Removes field ``name`` of ``t`` (every field when None)."""
    fields = {} if name is None else {k: v for k, v in acl.get_backend_meta(t).items() if k != name}
    acl.set_backend_meta(t, fields)


def copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Gives npu tensor ``dst`` the fields of ``src`` (and no others), as PyTorch's later
    ``torch._C._copy_backend_meta`` does."""
    acl.set_backend_meta(dst, acl.get_backend_meta(src))


# Note [Backend metadata of fake tensors]
# torch.compile and torch.export turn real tensors into fake ones with
# FakeTensorConverter.from_real_tensor, which in torch 2.13 copies no backend
# metadata (later PyTorch copies it, with _copy_backend_meta, for the reference
# PrivateUse1 backend's fields). A compiled region that reads the fields
# of its inputs would see none. So npusim wraps that one method: a fake of an
# npu tensor gets the real tensor's fields (of the tensor inside a
# FunctionalTensor, which is what holds them). The wrapper adds nothing else.
def install_fake_tensor_hook() -> None:
    """Wraps FakeTensorConverter.from_real_tensor to carry npu fields (idempotent)."""
    from torch._subclasses import fake_tensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    converter = fake_tensor.FakeTensorConverter
    original = converter.from_real_tensor
    if getattr(original, "__npusim_backend_meta__", False):
        return

    def from_real_tensor(self, fake_mode, t, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = original(self, fake_mode, t, *args, **kwargs)
        if t.device.type == "npu" and not isinstance(out, FunctionalTensor):
            real = torch._from_functional_tensor(t.elem) if isinstance(t, FunctionalTensor) else t
            fields = acl.get_backend_meta(real)
            if fields:
                acl.set_backend_meta(out, fields)
        return out

    from_real_tensor.__npusim_backend_meta__ = True  # type: ignore[attr-defined]
    from_real_tensor.__wrapped__ = original  # type: ignore[attr-defined]
    converter.from_real_tensor = from_real_tensor  # type: ignore[method-assign]

