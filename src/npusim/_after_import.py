"""Running a callback right after a module is imported, without importing it.

npusim has two users of this: the lazy torch.compile registration
(Note [Registering with dynamo and inductor lazily]) and ``transfer_to_npu``'s
patches of modules a script may never import (Note [transfer_to_npu in npusim]).
Both want a module patched the moment it exists and never want to pay for importing
it themselves (``torch._inductor`` alone costs seconds).

:func:`when_imported` runs the callback at once when the module is already in
``sys.modules``; otherwise it puts a one-shot finder at the front of ``sys.meta_path``
that, when the module is looked up, removes itself, lets the other finders find the
module's spec and wraps that spec's loader so the callback runs right after the
module's code has executed, before the importing statement gets the module (so a
``from module import name`` elsewhere already sees what the callback changed).

This module imports nothing of npusim or torch: it sits below every layer.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["Pending", "when_imported"]


class Pending(importlib.abc.MetaPathFinder):
    """A callback waiting for the import of ``name``; :meth:`cancel` stops the wait."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback: Callable[[ModuleType], None] | None = callback

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        self.cancel()  # one shot; the lookup below must not find us again
        spec = importlib.util.find_spec(fullname)
        callback = self.callback
        if callback is None or spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call_back(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        # On the loader instance (one per module), so its class and other modules are untouched.
        spec.loader.exec_module = exec_then_call_back  # type: ignore[method-assign]
        return spec

    def cancel(self) -> None:
        """Stops waiting (idempotent); a callback already run is not undone."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> Pending | None:
    """Calls ``callback(module)`` once the module ``name`` is imported: now if it already is
    (returns None), else right after its import executes it (returns the wait, cancellable)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return None
    pending = Pending(name, callback)
    sys.meta_path.insert(0, pending)
    return pending
