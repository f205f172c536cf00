"""Startup hook of the Python processes a ``python -m npusim run`` job starts.

Note [torch_npu in every process of the job]
A child started with multiprocessing's "spawn" or "forkserver" method (``mp.spawn``,
``torch.multiprocessing.spawn``, ``MultiProcessTestCase``, a DataLoader worker with that
context) is a fresh interpreter: it inherits none of its parent's ``sys.meta_path``, and
it re-imports the parent's ``__main__`` (the forkserver process preloads it too) and the
modules of the functions it runs, each of which may start with ``import torch_npu``.
What it does inherit is the environment, so ``npusim run`` (compat/torch_npu's
``install``) puts this directory first on ``PYTHONPATH``. Python's ``site`` imports the
first ``sitecustomize`` on ``sys.path`` at every start, which is this file: it only puts
a small finder on ``sys.meta_path`` (no torch import), then runs the ``sitecustomize``
it shadows, if the installation has one. The first ``import torch_npu`` of the child makes
that finder import npusim and install npusim's torch_npu finder, which answers the import.
The variable reaches only processes started from the job (children, and their children),
so nothing is installed under the name torch_npu and processes elsewhere are unaffected;
torchrun's ranks under ``torchrun -m npusim run`` each install it themselves, and a job
started as ``npusim run -m torch.distributed.run ... script.py`` reaches its ranks this way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any


class _FirstTorchNpuImport(importlib.abc.MetaPathFinder):
    """On the first ``import torch_npu`` (or ``import torchair``, torch_npu's): installs npusim's
    finder and lets it answer."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname not in ("torch_npu", "torchair"):
            return None
        sys.meta_path.remove(self)
        from npusim.compat.torch_npu import install_finder

        return install_finder().find_spec(fullname, path, target)


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


sys.meta_path.insert(0, _FirstTorchNpuImport())
_run_shadowed_sitecustomize()
