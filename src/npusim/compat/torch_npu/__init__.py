"""The ``torch_npu`` that ``python -m npusim run`` gives a script, and how every process of the job gets it.

:func:`install` puts a finder at the front of ``sys.meta_path`` that answers the import
of ``torch_npu`` with the package in ``package/`` beside this file, executed as the
module ``torch_npu``: a real ``ModuleSpec`` with a source loader and a ``__path__``, so
``importlib.util.find_spec``, ``importlib.import_module`` and ``pkgutil`` see an
installed package, and its submodules (``torch_npu.testing``, ``torch_npu._C``, ...) are
found in that directory by Python's own path finder. ``torch_npu.npu`` is ``torch.npu``.
See Note [The torch_npu of npusim run] for what is provided and
Note [torch_npu in every process of the job] for spawned children.

Nothing is installed under the name ``torch_npu``: without the finder (any process not
started by ``npusim run``), ``import torch_npu`` finds only a real torch_npu, if any.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import npusim  # noqa: F401  (registers the device, its ops and the hccl backend)

__all__ = ["PACKAGE_DIR", "STARTUP_DIR", "NotSimulatedError", "NotSimulatedModuleError", "install",
           "install_finder", "uninstall"]

# The simulated torch_npu package (never imported under its npusim name).
PACKAGE_DIR = Path(__file__).parent / "package"
# What a job's processes find first on PYTHONPATH (Note [torch_npu in every process of the job]).
STARTUP_DIR = Path(__file__).parent / "startup"

# Note [The torch_npu of npusim run]
# The module is torch_npu's API as far as it means something on a simulator, and
# absent where it does not, so feature detection sees what npusim really does:
# - ``torch_npu.npu`` is ``torch.npu`` (``torch_npu.npu.amp`` etc. are its submodules), and
#   ``torch_npu.npu._graph_tree`` is npusim's npu graph trees (``npusim.compile.graph_trees``),
#   ``torch_npu.npu._memory_viz`` ``npusim.runtime.memory_viz``, each imported when a script
#   imports it (ALIASED_MODULES);
# - ``torch_npu.<op>`` is op-plugin's fused operator ``torch.ops.npu.<op>`` when npusim
#   simulates it (``npusim.ops.fused.OPS``, read at each attribute access);
# - every other attribute raises NotSimulatedError, an AttributeError, naming the call,
#   so ``hasattr(torch_npu, "npu_rms_norm")`` is False unless the operator is simulated;
# - torch_npu's custom dtype numbers (``torch_npu.hifloat8``, ...) are attributes of the package,
#   ``get_storage_size`` is an operator (``torch.ops.npu.get_storage_size``) as on torch_npu, and
#   ``torch_npu.__all__`` names the operators torch_npu exposes that npusim has
#   (``runtime/parity.py: TORCH_NPU_EXPOSED_OPS``);
# - ``torch_npu.testing``, ``torch_npu._C`` (raw streams, ``_cd``, ``_distributed_c10d``),
#   ``torch_npu.utils``, ``torch_npu.profiler`` (torch.profiler writing torch_npu's output:
#   Note [What npusim's torch_npu.profiler writes]), ``torch_npu.contrib.transfer_to_npu`` and ``.module``,
#   ``torch_npu._inductor`` and
#   ``torch_npu.dynamo.torchair`` (also ``import torchair``, as on Ascend: TORCHAIR_ALIAS;
#   Note [torchair in npusim]) are modules in package/; torch_npu's services npusim has no model of
#   (:data:`NOT_SIMULATED_MODULES`) fail to import with NotSimulatedModuleError, a
#   ModuleNotFoundError, naming them. runtime/parity.py lists what frameworks touch and
#   what of it is provided or refused.

# torch_npu subpackages npusim has no model of, with why.
NOT_SIMULATED_MODULES: dict[str, str] = {
    "optim": "torch_npu's fused optimizers are CANN kernels; use torch.optim (foreach / fused=False)",
    "onnx": "ONNX export of torch_npu's custom operators is not simulated",
    "op_plugin": "op-plugin's operators are torch.ops.npu.* (npusim.ops.fused), not a torch_npu submodule",
    "asd": "silent-data-corruption detection has no meaning on a simulator",
    "distributed": "npusim's hccl backend is torch.distributed's; torch_npu.distributed's extensions "
                   "(ParallelStore, reduce_scatter_tensor_uneven, rpc) are not simulated",
    "jit": "torch_npu's TorchScript passes are not simulated",
    "multiprocessing": "torch.multiprocessing works on the npu; torch_npu's IPC reductions are not simulated",
}


class NotSimulatedError(AttributeError, NotImplementedError):
    """A torch_npu entry point that npusim does not simulate (an AttributeError, so ``hasattr`` is False)."""


class NotSimulatedModuleError(ModuleNotFoundError):
    """A torch_npu submodule that npusim does not simulate."""


class _PackageLoader(importlib.machinery.SourceFileLoader):
    """Loads package/__init__.py as ``torch_npu``; marked so npusim's guard knows it (_device.py)."""

    npusim_compat = True


class _NotSimulatedLoader(importlib.abc.Loader):
    def __init__(self, reason: str) -> None:
        self.reason = reason

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        raise NotSimulatedModuleError(f"{spec.name} is not simulated by npusim: {self.reason}", name=spec.name)

    def exec_module(self, module: ModuleType) -> None:
        raise AssertionError("unreachable: create_module raises")


# torch_npu's modules that are npusim modules under another name, imported when a script imports them.
ALIASED_MODULES: dict[str, str] = {
    "torch_npu.npu._graph_tree": "npusim.compile.graph_trees",  # torch.compile(mode="reduce-overhead")'s trees
    "torch_npu.npu._memory_viz": "npusim.runtime.memory_viz",  # flame graphs and plots of memory snapshots
}


# torch_npu ships torchair inside itself and makes it importable as ``torchair``: that name and its
# submodules are aliases of ``torch_npu.dynamo.torchair`` and its submodules (one module object each).
TORCHAIR_ALIAS = ("torchair", "torch_npu.dynamo.torchair")


def _alias_of(fullname: str) -> str | None:
    """The npusim module ``fullname`` is an alias of, if it is one."""
    if fullname in ALIASED_MODULES:
        return ALIASED_MODULES[fullname]
    name, target = TORCHAIR_ALIAS
    if fullname == name or fullname.startswith(name + "."):
        target += fullname[len(name):]
        # A name torchair has not is not found under either name (its parent is imported by now).
        return target if importlib.util.find_spec(target) is not None else None
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads an ALIASED_MODULES name as the npusim module itself (imported under its own name)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the module: it keeps its own.
        module.__spec__ = importlib.util.find_spec(self.target)


class _Finder(importlib.abc.MetaPathFinder):
    """Answers ``torch_npu`` (the package in package/), torch_npu's unsimulated subpackages, ALIASED_MODULES
    and ``torchair`` (TORCHAIR_ALIAS)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        alias = _alias_of(fullname)
        if alias is not None:
            return importlib.util.spec_from_loader(fullname, _AliasLoader(alias))
        if fullname == "torch_npu":
            init = PACKAGE_DIR / "__init__.py"
            return importlib.util.spec_from_file_location(
                "torch_npu", init, loader=_PackageLoader("torch_npu", str(init)),
                submodule_search_locations=[str(PACKAGE_DIR)])
        parts = fullname.split(".")
        if len(parts) == 2 and parts[0] == "torch_npu" and parts[1] in NOT_SIMULATED_MODULES:
            return importlib.util.spec_from_loader(fullname, _NotSimulatedLoader(NOT_SIMULATED_MODULES[parts[1]]))
        return None


_finder = _Finder()
_saved_pythonpath: list[str | None] = []


def install_finder() -> importlib.abc.MetaPathFinder:
    """Puts the torch_npu finder at the front of ``sys.meta_path`` (once); returns it."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return _finder


def _export_to_children() -> None:
    """Puts STARTUP_DIR first on PYTHONPATH. See Note [torch_npu in every process of the job]."""
    if _saved_pythonpath:
        return
    previous = os.environ.get("PYTHONPATH")
    _saved_pythonpath.append(previous)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR), *([previous] if previous else [])])


def install() -> ModuleType:
    """Makes ``import torch_npu`` give npusim's torch_npu in this process and in every Python
    process it starts; returns the module."""
    existing = sys.modules.get("torch_npu")
    if existing is not None and not getattr(existing, "__npusim_shim__", False):
        raise RuntimeError("npusim run: a real torch_npu is already imported in this process")
    install_finder()
    _export_to_children()
    return importlib.import_module("torch_npu")


def uninstall() -> None:
    """Removes npusim's torch_npu, its finder and the children's startup path, and undoes
    ``transfer_to_npu`` (tests)."""
    import torch

    from npusim.compat import transfer_to_npu

    transfer_to_npu.uninstall()
    for name in [n for n in sys.modules if n.split(".")[0] in ("torch_npu", TORCHAIR_ALIAS[0])]:
        del sys.modules[name]
    torch.npu.__dict__.pop("__path__", None)  # set by package/__init__.py for ALIASED_MODULES
    for alias in ALIASED_MODULES:  # the import system made them attributes of their parents
        torch.npu.__dict__.pop(alias.rsplit(".", 1)[1], None)
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    if _saved_pythonpath:
        previous = _saved_pythonpath.pop()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
