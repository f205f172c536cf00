"""``torch_npu._C._cd``: torch_npu's custom data types, as the integers its operators take.

torch_npu numbers the data types CANN has and PyTorch has not (hifloat8, the 6- and 4-bit
floats) as ACL's ``aclDataType`` plus 256, and exports every name of ``DType`` on
``torch_npu`` itself (``torch_npu.hifloat8 == 290``): op-plugin's quantized operators take
them where they take an output or input dtype. npusim gives the same numbers; the
operators that would compute in those types are not simulated, so the names are values to
pass and compare, never tensor dtypes.
"""

_ACL_OFFSET = 256  # torch_npu's g_toAclOffset: a custom dtype is ACL's number plus this

# ACL's aclDataType numbers (CANN's acl_base.h).
_ACL_DATA_TYPES = {
    "float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "uint16": 7, "uint32": 8,
    "int64": 9, "uint64": 10, "float64": 11, "bool": 12, "string": 13, "complex64": 16, "complex128": 17,
    "bfloat16": 27, "int4": 29, "uint1": 30, "complex32": 33, "hifloat8": 34, "float8_e5m2": 35,
    "float8_e4m3fn": 36, "float8_e8m0fnu": 37, "float6_e3m2": 38, "float6_e2m3": 39, "float4_e2m1fn_x2": 40,
    "float4_e1m2fn_x2": 41,
}


class DType:
    """torch_npu's ``_cd.DType``: one read-only integer per data type (ACL's number + 256)."""

    __slots__ = ()


for _name, _acl in _ACL_DATA_TYPES.items():
    setattr(DType, _name, _acl + _ACL_OFFSET)

NAMES: tuple[str, ...] = tuple(_ACL_DATA_TYPES)


def is_custom_dtype(value: int) -> bool:
    """torch_npu's ``IsCustomDType``: an int at or above the offset names a ``DType``, below it a ScalarType."""
    return value >= _ACL_OFFSET
