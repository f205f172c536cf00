"""``torchair.ge_concrete_graph.ge_apis``: one builder per Ascend operator (``ge_apis.Fill``...),
all of which add to a GE graph: each name raises GraphEngineNotSimulated when called."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import GraphEngineNotSimulated


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("_"):
        raise AttributeError(f"module 'torchair.ge_concrete_graph.ge_apis' has no attribute {name!r}")

    def build(*args: Any, **kwargs: Any) -> Any:
        raise GraphEngineNotSimulated(f"torchair.ge_concrete_graph.ge_apis.{name}")

    build.__name__ = build.__qualname__ = name
    return build
