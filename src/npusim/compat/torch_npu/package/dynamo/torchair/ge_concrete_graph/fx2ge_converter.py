"""``torchair.ge_concrete_graph.fx2ge_converter``: the registry of GE converters.

A converter turns one operator of an FX graph into GE operators. npusim records each
registration (:data:`CONVERTERS`) so frameworks that register theirs at import (MindSpeed's op
builders) import, and runs none: its torchair backend is inductor (See Note [torchair in npusim]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CONVERTERS", "declare_supported", "register_fx_node_ge_converter"]

# operator -> the GE converter registered for it (last registration wins, as in torchair).
CONVERTERS: dict[Any, Callable[..., Any]] = {}


def register_fx_node_ge_converter(aten_op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator recording ``converter`` as ``aten_op``'s GE converter; returns it unchanged."""
    if not isinstance(aten_op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator)):
        raise TypeError(f"torchair register_fx_node_ge_converter: expected a torch operator "
                        f"(torch.ops.<namespace>.<op>[.<overload>]), got {aten_op!r}")

    def register(converter: Callable[..., Any]) -> Callable[..., Any]:
        CONVERTERS[aten_op] = converter
        return converter

    return register


def declare_supported(supported_cases: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """torchair's decorator listing the inputs a converter's tests run; the converter unchanged."""

    def keep(converter: Callable[..., Any]) -> Callable[..., Any]:
        return converter

    return keep
