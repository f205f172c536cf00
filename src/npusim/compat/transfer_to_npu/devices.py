"""What ``transfer_to_npu`` does to a call's arguments: CUDA devices become npu devices.

:func:`on_npu` wraps a PyTorch callable so that the devices it is given in CUDA's
spelling name the npu: ``"cuda"`` / ``"cuda:N"``, ``torch.device("cuda", N)``, a
``map_location`` dict of such strings, and a bare device index where the callable
takes one as a device. :func:`nccl_as_hccl` wraps the callables that take a
collective backend name. The contract follows torch_npu's transfer_to_npu, with one
difference said in Note [Which strings are devices].
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DEVICE_KEYWORDS", "nccl_as_hccl", "npu_constructing", "npu_device", "npu_location", "on_npu"]

# The keyword arguments that name a device, as torch_npu's transfer_to_npu reads them;
# ``device_ids`` (a list or tuple of devices) besides.
DEVICE_KEYWORDS = ("device", "device_type", "map_location", "device_id")

# Note [Which strings are devices]
# torch_npu rewrites every string argument that contains "cuda" (``str.replace``), so
# ``torch.load("ckpt_cuda.pt")`` opens ``ckpt_npu.pt`` there. npusim rewrites only the
# strings that are devices or device types, "cuda" and "cuda:N" (and, in a backend
# name, the "cuda:" of "cuda:nccl,cpu:gloo"), which every call torch_npu's rewrite
# serves still gets, while file names, module names and messages stay as written.
_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")


def npu_device(value: Any, *, index_is_device: bool = False) -> Any:
    """``value`` with a CUDA device in it named as the npu's; anything else unchanged.

    A string ``"cuda"`` / ``"cuda:N"`` becomes ``"npu"`` / ``"npu:N"``, a CUDA ``torch.device``
    the npu device of the same index, a dict (a ``map_location``) has its device strings
    rewritten, and with ``index_is_device`` an int (not a bool) N becomes ``"npu:N"``.
    """
    if isinstance(value, str):
        return "npu" + value[4:] if _CUDA_DEVICE.fullmatch(value) else value
    if isinstance(value, torch.device):
        return value if value.type != "cuda" else torch.device("npu", value.index)
    if isinstance(value, dict):
        return {npu_device(key): npu_device(item) for key, item in value.items()}
    if index_is_device and isinstance(value, int) and not isinstance(value, bool):
        return f"npu:{value}"
    return value


def npu_location(value: Any) -> Any:
    """A device keyword's value: as :func:`npu_device`, an int always being a device index."""
    return npu_device(value, index_is_device=True)


def _npu_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], index_is_device: bool
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = tuple(npu_device(arg, index_is_device=index_is_device) for arg in args)
    for key in DEVICE_KEYWORDS:
        if kwargs.get(key) is not None:
            kwargs[key] = npu_location(kwargs[key])
    device_ids = kwargs.get("device_ids")
    if isinstance(device_ids, (list, tuple)):
        kwargs["device_ids"] = type(device_ids)(npu_device(d, index_is_device=index_is_device) for d in device_ids)
    return args, kwargs


def on_npu(fn: Callable[..., Any], *, index_is_device: bool = False) -> Callable[..., Any]:
    """``fn`` taking CUDA devices as npu devices (see :func:`npu_device`).

    Positional ints are device indices only with ``index_is_device`` (``Tensor.to(0)``,
    ``Module.to(0)``: elsewhere a positional int is a size or a value); an int given as a
    device keyword always is one.
    """

    @functools.wraps(fn)
    def call_on_npu(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _npu_arguments(args, kwargs, index_is_device)
        return fn(*args, **kwargs)

    call_on_npu.__npusim_transfer__ = True  # type: ignore[attr-defined]
    return call_on_npu


# A backend name: "nccl", or per device "cuda:nccl,cpu:gloo".
_BACKEND = re.compile(r"\w+|\w+:\w+(,\w+:\w+)*")


def _hccl_backend(value: Any) -> Any:
    if not isinstance(value, str) or not _BACKEND.fullmatch(value):
        return value
    if ":" not in value:
        return "hccl" if value.lower() == "nccl" else value
    pairs = (pair.split(":") for pair in value.split(","))
    return ",".join(f"{npu_device(device)}:{_hccl_backend(backend)}" for device, backend in pairs)


def nccl_as_hccl(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (``init_process_group``, ``new_group``) with backend "nccl" meaning "hccl"."""

    @functools.wraps(fn)
    def call_with_hccl(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_hccl_backend(arg) for arg in args)
        if "backend" in kwargs:
            kwargs["backend"] = _hccl_backend(kwargs["backend"])
        return fn(*args, **kwargs)

    call_with_hccl.__npusim_transfer__ = True  # type: ignore[attr-defined]
    return call_with_hccl


def npu_constructing(cls: type) -> type:
    """A stand-in for the class ``cls`` (``torch.Generator``, ``torch.Event``) whose calls take
    CUDA devices as npu devices and build a ``cls``.

    Calling it returns an instance of ``cls`` itself (so ``type(g) is torch._C.Generator``
    and pickling stay as they were); it subclasses ``cls`` (class attributes and
    ``issubclass`` see ``cls``), and ``isinstance(x, stand_in)`` is ``isinstance(x, cls)``,
    so code that checks against the name ``torch.Generator`` keeps accepting generators
    made before the patch or by PyTorch itself.
    """

    class StandInMeta(type(cls)):  # type: ignore[misc]  (the class's own metaclass, e.g. OpaqueBaseMeta)
        def __instancecheck__(self, instance: Any) -> bool:
            return isinstance(instance, cls)

        def __subclasscheck__(self, subclass: type) -> bool:
            return issubclass(subclass, cls)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = _npu_arguments(args, kwargs, index_is_device=False)
            return cls(*args, **kwargs)

    return StandInMeta(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                              "__doc__": cls.__doc__, "__npusim_transfer__": True})
