"""``torchair.ge_concrete_graph.ge_graph``: the GE graph's tensors and dtypes (``torchair.ge``'s),
and its graph-building helpers, which raise GraphEngineNotSimulated naming them."""

from __future__ import annotations

from typing import Any

from .._errors import GraphEngineNotSimulated
from ..ge import DataType, Format, Tensor, TensorSpec

__all__ = ["DataType", "Format", "Tensor", "TensorSpec", "compat_as_bytes", "get_default_ge_graph",
           "get_invalid_desc", "next_unique_name"]


def get_default_ge_graph() -> Any:
    """The GE graph being built."""
    raise GraphEngineNotSimulated("torchair.ge_concrete_graph.ge_graph.get_default_ge_graph()")


def next_unique_name(name: str, op: str) -> str:
    """A fresh node name in the GE graph being built."""
    raise GraphEngineNotSimulated(f"torchair.ge_concrete_graph.ge_graph.next_unique_name({name!r}, {op!r})")


def compat_as_bytes(value: Any) -> bytes:
    """A GE attribute string as bytes."""
    raise GraphEngineNotSimulated("torchair.ge_concrete_graph.ge_graph.compat_as_bytes")


def get_invalid_desc() -> Any:
    """GE's placeholder tensor description."""
    raise GraphEngineNotSimulated("torchair.ge_concrete_graph.ge_graph.get_invalid_desc()")
