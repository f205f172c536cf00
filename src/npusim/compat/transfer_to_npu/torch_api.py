"""``transfer_to_npu`` on PyTorch's device-taking API: functions, methods, classes, contexts.

What is patched and why is in Note [transfer_to_npu in npusim] (``__init__.py``); the
lists below are torch_npu's transfer_to_npu's, with PyTorch's own device constructors
(``torch.utils._device._device_constructors``) added where torch_npu's list lacks one.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils import _device

from npusim.compat.transfer_to_npu.devices import npu_constructing, on_npu
from npusim.compat.transfer_to_npu.ledger import Ledger

__all__ = ["MODULE_METHODS", "TENSOR_METHODS", "TORCH_FUNCTIONS", "patch"]

# torch.<name> taking a device argument (dotted: under a torch submodule).
TORCH_FUNCTIONS: tuple[str, ...] = (
    # PyTorch's device constructors (what `with torch.device(...)` redirects)
    "arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty", "empty_permuted",
    "empty_quantized", "empty_strided", "eye", "fft.fftfreq", "fft.rfftfreq", "full", "hamming_window",
    "hann_window", "kaiser_window", "linspace", "logspace", "nested.nested_tensor", "ones", "rand", "randint",
    "randn", "randperm", "range", "scalar_tensor", "sparse_bsc_tensor", "sparse_bsr_tensor", "sparse_compressed_tensor",
    "sparse_coo_tensor", "sparse_csc_tensor", "sparse_csr_tensor", "tensor", "tril_indices", "triu_indices", "zeros",
    # the others of torch_npu's list (less _sparse_coo/csr_tensor_unsafe, which torch 2.13 no longer has)
    "_cudnn_init_dropout_state", "_empty_affine_quantized", "_empty_per_channel_affine_quantized", "_pin_memory",
    "empty_like", "from_file", "frombuffer", "full_like",
    "get_device_module", "load", "normal", "ones_like", "rand_like", "randint_like", "randn_like",
    "set_default_device", "zeros_like",
)
# torch.Tensor / torch.nn.Module methods taking a device; True where a positional int is a device index.
TENSOR_METHODS: dict[str, bool] = {
    "new_empty": False, "new_empty_strided": False, "new_full": False, "new_ones": False, "new_tensor": False,
    "new_zeros": False, "pin_memory": False, "to": True,
}
MODULE_METHODS: dict[str, bool] = {"to": True, "to_empty": True}


def _owner_and_name(dotted: str) -> tuple[Any, str]:
    owner: Any = torch
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _activities_on_npu(init: Any) -> Any:
    """``_KinetoProfile.__init__`` recording the npu where ``ProfilerActivity.CUDA`` is asked for."""
    activity = torch.profiler.ProfilerActivity

    def npu_activity(item: Any) -> Any:
        if item == activity.CUDA:
            return activity.PrivateUse1
        if isinstance(item, dict):
            return {npu_activity(key): value for key, value in item.items()}
        return item

    @functools.wraps(init)
    def init_recording_npu(self: Any, *args: Any, activities: Any = None, **kwargs: Any) -> None:
        if activities is not None:
            mapped: list[Any] = []
            for item in map(npu_activity, activities):
                if item not in mapped:  # CPU, CUDA and PrivateUse1 asked together: the npu once
                    mapped.append(item)
            activities = mapped
        init(self, *args, activities=activities, **kwargs)

    return init_recording_npu


_jit_warned: list[bool] = []


def _warn_jit_once() -> None:
    if not _jit_warned:
        _jit_warned.append(True)
        warnings.warn("transfer_to_npu: torch.jit.script and torch.jit.script_method return what they are given "
                      "(as torch_npu's transfer_to_npu does), so the code runs in Python with CUDA devices mapped "
                      "to the npu", RuntimeWarning, stacklevel=3)  # at the caller of script / script_method


def _script(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.jit.script`` under transfer_to_npu: the object itself, run by Python (as torch_npu's)."""
    _warn_jit_once()
    return obj


def _script_method(fn: Any) -> Any:
    """``torch.jit.script_method`` under transfer_to_npu: the function itself."""
    _warn_jit_once()
    return fn


def _available_device_type() -> str | None:
    """``torch._utils._get_available_device_type`` under transfer_to_npu: the npu, where
    PyTorch's would answer "cuda" (``torch.cuda.is_available()`` is the npu's)."""
    return "npu" if torch.npu.is_available() else None


def patch(ledger: Ledger) -> None:
    """Applies the patches of PyTorch's device-taking API to ``ledger``."""
    # DeviceContext (`with torch.device(...)`, set_default_device) matches calls by function
    # identity against this cached set: it must hold PyTorch's functions, not the wrappers.
    _device._device_constructors()
    for dotted in TORCH_FUNCTIONS:
        owner, name = _owner_and_name(dotted)
        ledger.wrap(owner, name, on_npu)
    for name, index_is_device in TENSOR_METHODS.items():
        ledger.wrap(torch.Tensor, name, functools.partial(on_npu, index_is_device=index_is_device))
    for name, index_is_device in MODULE_METHODS.items():
        ledger.wrap(torch.nn.Module, name, functools.partial(on_npu, index_is_device=index_is_device))
    ledger.set(torch.Tensor, "cuda", torch.Tensor.npu)
    ledger.set(torch.Tensor, "is_cuda", torch.Tensor.is_npu)
    ledger.set(torch.nn.Module, "cuda", torch.nn.Module.npu)
    ledger.set(torch.storage.TypedStorage, "is_cuda", torch.storage.TypedStorage.is_npu)
    ledger.wrap(torch.UntypedStorage, "__new__", on_npu)
    ledger.set(torch, "Generator", npu_constructing(torch.Generator))
    ledger.set(torch, "Event", npu_constructing(torch.Event))
    ledger.wrap(torch.amp.autocast_mode.autocast, "__init__", on_npu)
    ledger.wrap(_device.DeviceContext, "__init__", on_npu)
    ledger.wrap(torch.profiler.profiler._KinetoProfile, "__init__", _activities_on_npu)
    ledger.set(torch.jit, "script", _script)
    ledger.set(torch.jit, "script_method", _script_method)
    ledger.set(torch._utils, "_get_available_device_type", _available_device_type)
    ledger.when_imported("torch.distributed.checkpoint.filesystem", lambda module: ledger.set(
        module, "_get_available_device_type", _available_device_type))
    ledger.when_imported("torch.autograd.profiler_util", lambda module: ledger.wrap(module.Kernel, "__new__", on_npu))
    ledger.when_imported("torch.utils.cpp_extension", lambda module: ledger.wrap(module, "include_paths", on_npu))
    _allow_patched_methods_on_uninitialized(ledger)


def _allow_patched_methods_on_uninitialized(ledger: Ledger) -> None:
    # Lazy modules' uninitialized parameters allow a list of Tensor methods, matched by
    # identity against what __torch_function__ receives: the attribute of torch.Tensor
    # at call time, so the wrapped `to` must be on the list.
    allowed = UninitializedTensorMixin._allowed_methods
    for index, method in enumerate(allowed):
        if getattr(method, "__name__", None) == "to":
            original = allowed[index]
            allowed[index] = torch.Tensor.to

            def restore(index: int = index, original: Any = original) -> None:
                allowed[index] = original

            ledger.record(restore)

