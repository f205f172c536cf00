"""torch.cuda's legacy typed constructors for the npu: ``torch.npu.FloatTensor(2, 3)``,
``torch.npu.FloatStorage(8)``.

PyTorch builds ``torch.cuda.FloatTensor`` in C++ for CUDA only; here each name is a
class whose call makes an npu tensor of its dtype (sizes: uninitialised; data:
a copy, as torch.cuda's do) and whose isinstance check accepts npu tensors of
that dtype. The storages are ``TypedStorage`` legacy classes bound to npu.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage

_DTYPES = {
    "Bool": torch.bool, "Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "Int": torch.int32,
    "Long": torch.int64, "Half": torch.float16, "Float": torch.float32, "Double": torch.float64,
    "BFloat16": torch.bfloat16,
}


class _LegacyTensorMeta(type):
    dtype: torch.dtype

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype

    def __call__(cls, *args: Any, device: Any = None) -> torch.Tensor:
        target = torch.device("npu") if device is None else torch.device(device)
        if len(args) == 1 and not isinstance(args[0], int):
            return torch.tensor(args[0], dtype=cls.dtype, device=target)
        return torch.empty(args, dtype=cls.dtype, device=target)


class _NPULegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("from_buffer: not available for npu storage")


def _make() -> dict[str, type]:
    made: dict[str, type] = {}
    for prefix, dtype in _DTYPES.items():
        tensor_type = _LegacyTensorMeta(f"{prefix}Tensor", (), {"dtype": dtype, "__module__": "torch.npu",
                                                                  "is_npu": True})
        storage_type = type(f"{prefix}Storage", (_NPULegacyStorage,), {
            "__module__": "torch.npu", "_dtype": classproperty(lambda self, d=dtype: d),
            "dtype": classproperty(lambda self, d=dtype: d)})
        made[tensor_type.__name__] = tensor_type
        made[storage_type.__name__] = storage_type
    return made


globals().update(_make())
__all__ = sorted(f"{p}{kind}" for p in _DTYPES for kind in ("Tensor", "Storage"))
