"""A ledger of attribute patches that can all be undone, last first.

``transfer_to_npu`` changes attributes of PyTorch's modules and classes (and of
modules imported later, through :func:`npusim._after_import.when_imported`);
``uninstall()`` must leave the process as it found it, so every change goes
through one :class:`Ledger`, which remembers what each attribute was: the owner's
own value, or none (then undoing deletes the attribute again, so an inherited one
shows through as before).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from npusim._after_import import when_imported

__all__ = ["Ledger"]

_ABSENT = object()


class Ledger:
    """Patches made so far, each with its undo."""

    def __init__(self) -> None:
        self._undos: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._undos)

    def set(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value``, remembering the owner's own previous value (if any)."""
        previous = vars(owner).get(name, _ABSENT)
        setattr(owner, name, value)

        def undo() -> None:
            if previous is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)

        self._undos.append(undo)

    def wrap(self, owner: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
        """``owner.name = wrapper(owner.name)`` (the attribute as seen, inherited or not)."""
        self.set(owner, name, wrapper(getattr(owner, name)))

    def record(self, undo: Callable[[], None]) -> None:
        """Remembers an undo for a change made by other means than an attribute."""
        self._undos.append(undo)

    def when_imported(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        """Runs ``patch(module)`` now or once ``name`` is imported; undo stops a wait still pending."""
        pending = when_imported(name, patch)
        if pending is not None:
            self.record(pending.cancel)

    def undo(self) -> None:
        """Undoes every patch, the last one first."""
        while self._undos:
            self._undos.pop()()
