"""The ``torch_npu`` that ``python -m npusim run`` gives a script.

Nothing is installed under the name ``torch_npu``: :func:`install` puts a module
object into ``sys.modules`` and an import hook onto ``sys.meta_path`` for the
lifetime of one ``npusim run`` process, so a real torch_npu stays importable
everywhere else. What the module offers:

- ``torch_npu.npu`` is ``torch.npu`` (npusim's device module), with its
  submodules (``torch_npu.npu.amp``, ``.memory``, ``.random``, ``.streams``);
- ``torch_npu.contrib.transfer_to_npu`` maps ``torch.cuda`` calls to the npu,
  as torch_npu's does;
- op-plugin's fused operators that npusim simulates (``torch_npu.npu_rms_norm``,
  ``npu_format_cast``, ...) are ``torch.ops.npu.<name>`` (:data:`npusim.ops.fused.OPS`),
  and ``torch_npu.Format`` is the format enum;
- the other torch_npu operators and services scripts commonly call
  (``npu_quant_matmul``, ``torch_npu.profiler``, ...) raise
  :class:`NotSimulatedError` naming the call; any other name is an
  AttributeError / ImportError that says npusim does not provide it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch

import npusim  # noqa: F401  (registers the device, its ops and the hccl backend)
from npusim.ops.fused import OPS
from npusim.ops.fused.layout import Format

__all__ = ["NotSimulatedError", "install", "uninstall"]

__npusim_shim__ = True


class NotSimulatedError(NotImplementedError):
    """A torch_npu entry point that npusim does not simulate."""


# torch_npu's custom operators and services that scripts commonly call; each raises.
NOT_SIMULATED = (
    "npu_format_cast", "npu_format_cast_", "get_npu_format", "npu_fusion_attention", "npu_rms_norm",
    "npu_rotary_mul", "npu_confusion_transpose", "npu_dropout_with_add_softmax", "npu_scaled_masked_softmax",
    "npu_incre_flash_attention", "npu_prompt_flash_attention", "npu_swiglu", "npu_geglu", "npu_moe_gating_top_k",
    "npu_grouped_matmul", "npu_quant_matmul", "npu_add_rms_norm", "npu_apply_adam", "npu_silu", "npu_gelu",
)
NOT_SIMULATED_MODULES = ("profiler", "optim", "onnx", "dynamo", "op_plugin", "_inductor", "utils")


def _not_simulated(qualname: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulatedError(f"{qualname} is not simulated by npusim (it is a torch_npu-specific entry point; "
                                "use the PyTorch operator it fuses, or run on a real NPU)")

    call.__name__ = qualname.rsplit(".", 1)[-1]
    call.__qualname__ = qualname
    return call


def _transfer_to_npu() -> types.ModuleType:
    """``torch_npu.contrib.transfer_to_npu``: code that says ``cuda`` runs on the npu."""
    module = types.ModuleType("torch_npu.contrib.transfer_to_npu")
    module.__doc__ = "Makes torch.cuda name torch.npu for device-generic scripts (installed on import)."
    torch.cuda = torch.npu  # type: ignore[assignment]
    return module


def _build() -> types.ModuleType:
    module = types.ModuleType("torch_npu", __doc__)
    module.__npusim_shim__ = True  # type: ignore[attr-defined]
    module.__version__ = f"{torch.__version__.split('+')[0]}+npusim{npusim.__version__}"  # type: ignore[attr-defined]
    module.__path__ = []  # type: ignore[attr-defined]  (a package: submodules come from the finder)
    module.npu = torch.npu  # type: ignore[attr-defined]
    module.NotSimulatedError = NotSimulatedError  # type: ignore[attr-defined]
    module.Format = Format  # type: ignore[attr-defined]
    for name in NOT_SIMULATED:
        if name not in OPS:
            setattr(module, name, _not_simulated(f"torch_npu.{name}"))
    for name, op in OPS.items():
        setattr(module, name, op)

    def missing(name: str) -> Any:
        if name in NOT_SIMULATED_MODULES:
            raise NotSimulatedError(f"torch_npu.{name} is not simulated by npusim")
        raise AttributeError(f"module 'torch_npu' (npusim's compatibility module) has no attribute {name!r}")

    module.__getattr__ = missing  # type: ignore[attr-defined]  (PEP 562)
    return module


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``torch_npu.*`` imports to npusim modules while installed."""

    MODULES = {
        "torch_npu.npu": lambda: torch.npu,
        "torch_npu.npu.amp": lambda: torch.npu.amp,
        "torch_npu.npu.memory": lambda: torch.npu.memory,
        "torch_npu.npu.random": lambda: torch.npu.random,
        "torch_npu.npu.streams": lambda: torch.npu.streams,
        "torch_npu.contrib": lambda: types.ModuleType("torch_npu.contrib"),
        "torch_npu.contrib.transfer_to_npu": _transfer_to_npu,
    }

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname == "torch_npu" or not fullname.startswith("torch_npu."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        make = self.MODULES.get(spec.name)
        if make is None:
            raise ImportError(f"{spec.name} is not simulated by npusim (npusim provides torch_npu.npu and "
                              "torch_npu.contrib.transfer_to_npu)", name=spec.name)
        module = make()
        if not hasattr(module, "__path__"):
            module.__path__ = []  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is complete when created."""


_finder = _Finder()


def install() -> types.ModuleType:
    """Makes ``import torch_npu`` give the compatibility module in this process."""
    existing = sys.modules.get("torch_npu")
    if existing is not None:
        if getattr(existing, "__npusim_shim__", False):
            return existing
        raise RuntimeError("npusim run: a real torch_npu is already imported in this process")
    module = _build()
    sys.modules["torch_npu"] = module
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return module


def uninstall() -> None:
    """Removes the compatibility module and its import hook (tests)."""
    if getattr(sys.modules.get("torch_npu"), "__npusim_shim__", False):
        for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
            if getattr(sys.modules[name], "__npusim_shim__", True):
                del sys.modules[name]
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
