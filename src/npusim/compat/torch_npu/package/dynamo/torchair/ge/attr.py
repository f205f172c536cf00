"""``torchair.ge.attr``: typed attributes of GE operators (``ge.attr.Int(3)``), which exist only
in a GE graph being built: each raises GraphEngineNotSimulated naming it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import GraphEngineNotSimulated

KINDS = ("Int", "Float", "Bool", "Str", "DataType", "ListInt", "ListFloat", "ListBool", "ListStr",
         "ListDataType", "ListListInt", "ListListFloat")

__all__ = list(KINDS)


def _attribute(kind: str) -> Callable[..., Any]:
    def make(value: Any) -> Any:
        raise GraphEngineNotSimulated(f"torchair.ge.attr.{kind}({value!r})")

    make.__name__ = make.__qualname__ = kind
    make.__doc__ = f"A GE operator attribute of type {kind}."
    return make


for _kind in KINDS:
    globals()[_kind] = _attribute(_kind)
