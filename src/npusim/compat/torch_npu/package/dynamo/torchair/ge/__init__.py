"""``torchair.ge``: the GE graph API torchair's converters build with. Under npusim the names
exist for the converters frameworks register at import (annotations, dtype constants), and
building a GE graph raises GraphEngineNotSimulated (See Note [torchair in npusim])."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from .._errors import GraphEngineNotSimulated
from . import attr  # noqa: F401  (torchair.ge.attr)

__all__ = ["Cast", "Clone", "Const", "DataType", "Format", "Tensor", "TensorSpec", "custom_op"]


class DataType(IntEnum):
    """GE's data types, with graph engine's numbering (ge::DataType)."""

    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_STRING = 13
    DT_COMPLEX64 = 16
    DT_COMPLEX128 = 17
    DT_BF16 = 27
    DT_UNDEFINED = 28
    DT_INT4 = 29
    DT_HIFLOAT8 = 34
    DT_FLOAT8_E5M2 = 35
    DT_FLOAT8_E4M3FN = 36
    DT_FLOAT8_E8M0 = 37
    DT_FLOAT4_E2M1 = 40


class Format(IntEnum):
    """GE's tensor formats (the ACL formats of torch_npu.Format)."""

    FORMAT_NCHW = 0
    FORMAT_NHWC = 1
    FORMAT_ND = 2
    FORMAT_NC1HWC0 = 3
    FORMAT_FRACTAL_Z = 4
    FORMAT_FRACTAL_NZ = 29


class Tensor:
    """A tensor of a GE graph (what converters take and return); none exists under npusim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise GraphEngineNotSimulated("torchair.ge.Tensor(...)")


class TensorSpec:
    """The meta description of a converter's outputs; none exists under npusim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise GraphEngineNotSimulated("torchair.ge.TensorSpec(...)")


def custom_op(op_type: str, *args: Any, **kwargs: Any) -> Any:
    """Adds an Ascend operator to the GE graph being built."""
    raise GraphEngineNotSimulated(f"torchair.ge.custom_op({op_type!r})")


def Const(v: Any, dtype: int | None = None, node_name: str | None = None, readable: bool = True) -> Any:  # noqa: N802
    """A constant of the GE graph being built."""
    raise GraphEngineNotSimulated("torchair.ge.Const")


def Cast(x: Any, *, dst_type: int, dependencies: Any = None, node_name: str | None = None) -> Any:  # noqa: N802
    """A cast in the GE graph being built."""
    raise GraphEngineNotSimulated("torchair.ge.Cast")


def Clone(x: Any, *, dependencies: Any = None, node_name: str | None = None) -> Any:  # noqa: N802
    """A copy in the GE graph being built."""
    raise GraphEngineNotSimulated("torchair.ge.Clone")
