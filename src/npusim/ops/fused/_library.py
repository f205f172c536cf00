"""The ``npu`` operator namespace that every fused-operator family registers into.

torch_npu defines its operators in the ``npu`` namespace (``torch.ops.npu.npu_rms_norm``);
so does npusim, with one ``torch.library.Library`` for the whole namespace. A family module
calls :func:`define` with op-plugin's schema and registers its kernels on the returned
name with ``torch.library`` (``register_kernel`` / ``register_fake`` /
``register_autograd``), or with :data:`LIB`'s ``impl``; :func:`implement` and
:func:`no_derivative` do the registrations every operator needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from npusim.ops.fused._checks import check_devices

# Module-level: the definitions live as long as this object does.
LIB = torch.library.Library("npu", "DEF")

# Public name -> torch.ops.npu.<name>: what ``torch_npu.<name>`` is under ``npusim run``.
OPS: dict[str, Any] = {}


def define(schema: str, *, public: bool = True, tags: tuple[torch.Tag, ...] = ()) -> str:
    """Defines ``npu::<schema>`` and returns its qualified name (``"npu::npu_rms_norm"``,
    ``"npu::npu_grouped_matmul.List"`` for an overload).

    ``public`` ops are what torch_npu exposes as ``torch_npu.<name>``: every op of op-plugin's
    yaml, backward ops included (torch_npu binds them all); npusim's own helper ops, which
    op-plugin does not have, are defined with ``public=False``. ``tags`` are the
    op's tags in op-plugin's yaml (``nondeterministic_seeded`` for ops that draw random
    numbers, which torch.compile must neither deduplicate nor recompute).
    """
    head = schema.split("(", 1)[0].strip()
    name = head.split(".", 1)[0]
    LIB.define(schema, tags=tags)
    if public:
        OPS[name] = getattr(torch.ops.npu, name)
    return f"npu::{head}"


def _overload(qualname: str) -> torch._ops.OpOverload:
    name, _, overload = qualname.split("::", 1)[1].partition(".")
    return getattr(getattr(torch.ops.npu, name), overload or "default")


def _name(qualname: str) -> str:
    """``"npu::npu_grouped_matmul.List"`` -> ``"npu_grouped_matmul"``."""
    return qualname.split("::", 1)[1].split(".", 1)[0]


def implement(qualname: str, kernel: Callable[..., Any], fake: Callable[..., Any], *,
              shown: str | None = None) -> None:
    """Registers ``kernel`` as the npu (PrivateUse1) kernel of ``qualname`` and ``fake`` as its fake kernel.

    The npu kernel first checks that every tensor argument is on one npu device; the same
    check is the CPU kernel, so a call with CPU tensors fails naming the argument instead of
    finding no kernel. ``fake`` serves FakeTensor, the meta device and ``torch.compile``.
    Errors name ``shown`` (the public op a private one implements) when given.
    """
    op = _overload(qualname)
    names = [argument.name for argument in op._schema.arguments]
    label = shown or _name(qualname)

    def on_device(*args: Any, **kwargs: Any) -> Any:
        check_devices(label, {**dict(zip(names, args, strict=False)), **kwargs})
        return kernel(*args, **kwargs)

    on_device.__name__ = getattr(kernel, "__name__", label)
    entry = qualname.split("::", 1)[1]
    LIB.impl(entry, on_device, "PrivateUse1")
    LIB.impl(entry, on_device, "CPU")  # raises: see check_devices
    torch.library.register_fake(qualname, fake, lib=LIB)


def register_autograd(qualname: str, backward: Callable[..., Any], *,
                      setup_context: Callable[..., Any] | None = None) -> None:
    """``torch.library.register_autograd``, also for op-plugin's keyword-only tensor arguments.

    ``register_autograd`` refuses schemas with keyword-only tensors (``*, Tensor? bias=None``)
    because they cannot receive gradients; in op-plugin's derivatives they never do, so such an
    operator gets the same autograd kernel PyTorch builds (``make_autograd_impl``), with
    ``backward`` returning gradients for the positional arguments only.
    """
    op = _overload(qualname)
    if not torch._library.utils.has_kwarg_only_tensors(op._schema):
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=LIB)
        return
    kernel = torch._library.autograd.make_autograd_impl(op, torch._library.autograd.Info(backward, setup_context))
    LIB.impl(qualname.split("::", 1)[1], kernel, "Autograd", with_keyset=True)


def no_derivative(qualname: str, *, shown: str | None = None) -> None:
    """``qualname`` runs forward under autograd; a backward through it raises, as torch_npu's does.

    torch_npu registers no derivative for it (op-plugin's ``AutogradErrorFallback.cpp`` names the
    ones it marks explicitly): gradients never silently stop at it. The message names ``shown``
    (the public op a private one implements) when given.
    """
    name = f"npu::{shown or _name(qualname)}"

    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"derivative for {name} is not implemented (torch_npu has no backward for it)")

    register_autograd(qualname, backward)
