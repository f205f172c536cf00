"""torch_npu-only names of ``torch.npu`` that scripts call unconditionally.

Each does here what can be meant on a simulator, stated in its docstring:
settings of the real op compiler and formats are stored and read back but
change nothing (compute runs PyTorch's CPU kernels); the autocast helpers are
PyTorch's own for the npu device.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "are_compatible_impl_enabled", "config", "conv", "get_autocast_dtype", "is_autocast_enabled",
    "is_jit_compile_false", "matmul", "set_autocast_dtype", "set_autocast_enabled", "set_compile_mode", "set_option",
    "use_compatible_impl",
]

_options: dict[str, str] = {}


def set_compile_mode(jit_compile: bool = False) -> None:
    """Stored only: npusim has no op compiler (torch_npu: compile ops with CANN's JIT or not)."""
    _options["jitCompile"] = "enable" if jit_compile else "disable"


def is_jit_compile_false() -> bool:
    """What :func:`set_compile_mode` last stored (torch_npu's default: JIT off)."""
    return _options.get("jitCompile", "disable") == "disable"


# torch_npu's checks of the ACL compile options' values (npu_config._option_map); other options take any value.
_OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "ACL_PRECISION_MODE": ("allow_fp32_to_fp16", "must_keep_origin_dtype"),
    "ACL_OP_SELECT_IMPL_MODE": ("high_performance", "high_precision"),
    "ACL_OP_DEBUG_LEVEL": ("0", "1", "2", "3", "4"),
    "ACL_OP_COMPILER_CACHE_MODE": ("disable", "enable", "force"),
}


def _valid_option(name: str, value: str) -> bool:
    if name == "ACL_AICORE_NUM":
        return value.isdigit() and 1 <= int(value) <= 32
    return name not in _OPTION_VALUES or value in _OPTION_VALUES[name]


def set_option(option: dict[str, Any]) -> None:
    """Stored only (torch_npu: ACL options such as ``ACL_OP_COMPILER_CACHE_MODE``); a value torch_npu
    refuses for an option it checks (precision and impl modes, debug level, cache mode, AI core count
    1-32) is a ValueError, as there, and nothing of the dict is stored then."""
    if not isinstance(option, dict):
        raise TypeError(f"torch.npu.set_option: expected a dict of options, got {type(option).__name__}")
    values = {str(k): str(v) for k, v in option.items()}
    for name, value in values.items():
        if not _valid_option(name, value):
            expected = "an integer from 1 to 32" if name == "ACL_AICORE_NUM" else f"one of {_OPTION_VALUES[name]}"
            raise ValueError(f"torch.npu.set_option: value of {name} should be {expected}, got {value!r}")
    _options.update(values)


def use_compatible_impl(is_enable: bool) -> None:
    """Stored as torch_npu's option ``TORCH_NPU_USE_COMPATIBLE_IMPL`` ("1" / "0"), which
    :func:`are_compatible_impl_enabled` reads back. torch_npu picks the HCCL collectives' compatible
    implementations on some SoCs with it; npusim's hccl backend has one implementation of each."""
    set_option({"TORCH_NPU_USE_COMPATIBLE_IMPL": "1" if is_enable else "0"})


def are_compatible_impl_enabled() -> bool:
    """Whether :func:`use_compatible_impl` last enabled the compatible implementations (default: no)."""
    return _options.get("TORCH_NPU_USE_COMPATIBLE_IMPL") == "1"


class _Config:
    """``torch.npu.config.allow_internal_format``: stored; npusim keeps every tensor in ND format."""

    allow_internal_format: bool = False


class _AllowHF32:
    """``torch.npu.matmul.allow_hf32`` / ``torch.npu.conv.allow_hf32``: stored; CPU kernels compute in fp32."""

    def __init__(self, default: bool) -> None:
        self.allow_hf32 = default


config = _Config()
matmul = _AllowHF32(False)
conv = _AllowHF32(True)


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("npu", enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("npu", dtype)
