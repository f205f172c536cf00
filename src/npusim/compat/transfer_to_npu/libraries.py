"""``transfer_to_npu`` and the frameworks' CUDA checks: they keep PyTorch's answer.

Once ``torch.cuda.is_available()`` answers for the npu, framework code that asks it to
decide "is there an NVIDIA GPU" (bitsandbytes, flash-attn, NUMA affinity, nccl in
accelerate's backend choice) would take CUDA-only paths. torch_npu's transfer_to_npu
runs a list of such framework functions with PyTorch's own ``torch.cuda.is_available``
in place; npusim runs the same list (the framework versions from which it applies are
torch_npu's). Each function is wrapped right after its module is imported (never
importing a framework itself), so a ``from module import function`` made later, inside
the framework too, gets the wrapped one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from npusim.compat.transfer_to_npu.ledger import Ledger

__all__ = ["CUDA_CHECKS", "patch", "with_cuda_names", "with_pytorch_cuda_check"]

# package: (the first version it applies to, {module: [function or Class.method, ...]})
CUDA_CHECKS: dict[str, tuple[tuple[int, ...], dict[str, list[str]]]] = {
    "transformers": ((4, 32, 0), {
        "transformers.training_args": ["TrainingArguments.__post_init__"],
        "transformers.trainer": ["Trainer._load_rng_state", "Trainer._save_rng_state"],
        "transformers.trainer_utils": ["TrainerMemoryTracker.start"],
        "transformers.utils.import_utils": [
            "is_torch_cuda_available", "is_mamba_ssm_available", "is_causal_conv1d_available",
            "is_torch_bf16_gpu_available", "is_torch_tf32_available", "is_bitsandbytes_available",
            "is_flash_attn_2_available"],
    }),
    "trl": ((0, 7, 1), {
        "trl.import_utils": ["is_bitsandbytes_available"],
        "trl.trainer.utils": ["get_kbit_device_map"],
    }),
    "peft": ((0, 5, 0), {"peft.utils.other": ["infer_device"]}),
    "accelerate": ((0, 22, 0), {
        "accelerate.commands.env": ["env_command"],
        "accelerate.launchers": ["notebook_launcher"],
        "accelerate.commands.config.default": ["write_basic_config"],
        "accelerate.utils.environment": ["override_numa_affinity"],
        "accelerate.utils.modeling": ["get_max_memory"],
        "accelerate.utils.megatron_lm": ["initialize"],
        "accelerate.utils.bnb": ["load_and_quantize_model", "get_quantized_model_device_map"],
        "accelerate.utils.imports": ["is_cuda_available"],
        "accelerate.test_utils.scripts.test_script": ["training_check"],
        "accelerate.test_utils.scripts.test_cli": ["main"],
        "accelerate.test_utils.scripts.external_deps.test_peak_memory_usage": [
            "TorchTracemalloc.__enter__", "TorchTracemalloc.__exit__"],
        "accelerate.state": ["PartialState._prepare_backend"],
    }),
}


def with_cuda_names(fn: Callable[..., Any], names: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """``fn`` run with ``torch.cuda``'s names set as in ``names`` (and set back after)."""

    @functools.wraps(fn)
    def call_with_cuda_names(*args: Any, **kwargs: Any) -> Any:
        answering = {name: getattr(torch.cuda, name) for name in names}
        for name, value in names.items():
            setattr(torch.cuda, name, value)
        try:
            return fn(*args, **kwargs)
        finally:
            for name, patched in answering.items():
                setattr(torch.cuda, name, patched)

    return call_with_cuda_names


def with_pytorch_cuda_check(fn: Callable[..., Any], is_available: Callable[[], bool]) -> Callable[..., Any]:
    """``fn`` run with ``torch.cuda.is_available`` set to ``is_available`` (PyTorch's own)."""
    return with_cuda_names(fn, {"is_available": is_available})


def _version(package: str) -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _wrap_checks(ledger: Ledger, module: ModuleType, names: list[str], is_available: Callable[[], bool]) -> None:
    for name in names:
        owner: Any = module
        *classes, attribute = name.split(".")
        for class_name in classes:
            owner = getattr(owner, class_name, None)
        if owner is not None and callable(getattr(owner, attribute, None)):  # gone in this version: nothing
            ledger.wrap(owner, attribute, lambda fn: with_pytorch_cuda_check(fn, is_available))


def patch(ledger: Ledger, is_available: Callable[[], bool]) -> None:
    """Wraps the installed frameworks' CUDA checks (``is_available``: PyTorch's own)."""
    for package, (first, modules) in CUDA_CHECKS.items():
        version = _version(package)
        if version is None or version < first:
            continue
        for module_name, names in modules.items():
            ledger.when_imported(module_name, functools.partial(_wrap_checks, ledger, names=names,
                                                                is_available=is_available))
