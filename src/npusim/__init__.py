"""npusim: a simulated Ascend-style NPU for PyTorch, with CUDA-aligned
``torch._foreach_copy_`` and patch-free FSDP2.

``import npusim`` registers a PrivateUse1 device named ``npu`` (the C++ core
is compiled on first import) and the ``torch.npu`` module.
"""

from __future__ import annotations

import atexit
import os
import sys

import torch

__version__ = "0.1.0"


class BackendConflictError(RuntimeError):
    """Another backend already owns PrivateUse1."""


def _check_privateuse1_is_free() -> None:
    name = torch._C._get_privateuse1_backend_name()
    if "torch_npu" in sys.modules:
        raise BackendConflictError(
            "npusim cannot be imported: torch_npu (a real NPU backend) is already loaded and owns "
            "the PrivateUse1 device. Use one or the other in a process.")
    if name not in ("privateuseone", "npu"):
        raise BackendConflictError(
            f"npusim cannot be imported: the PrivateUse1 device is already registered as {name!r} "
            "by another backend; npusim needs it to register 'npu'.")
    if name == "npu" and not hasattr(torch, "npu"):
        raise BackendConflictError(
            "npusim cannot be imported: PrivateUse1 is already named 'npu' by another backend "
            "that did not provide torch.npu.")
    if hasattr(torch, "npu") and not getattr(torch.npu, "__name__", "").startswith("npusim"):
        raise BackendConflictError(
            f"npusim cannot be imported: torch.npu is already provided by {torch.npu.__name__!r}.")


def _register() -> None:
    _check_privateuse1_is_free()
    from npusim.runtime._core import C

    count = os.environ.get("NPUSIM_DEVICE_COUNT")
    if count:
        C.set_device_count(int(count))
    C.register_device()
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    from npusim.runtime import npu as npu_module

    torch._register_device_module("npu", npu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    atexit.register(_drain_at_exit)


def _drain_at_exit() -> None:
    """Lets background threads finish with Python objects before finalization.

    Device work must finish before the interpreter tears down what stream
    workers reference. And PyTorch's autograd thread for the npu device drops
    its last reference to a finished GraphTask (whose thread-local state holds
    Python objects) just after backward() has returned; if the interpreter is
    already finalizing then, taking the GIL aborts the process. A short wait
    with the GIL released closes that window.
    """
    import time

    from npusim.runtime._core import C

    C.synchronize_all()
    time.sleep(0.05)


_register()

from npusim.runtime import timing  # noqa: E402
from npusim.runtime.memory import parse_bytes  # noqa: E402
from npusim.runtime.profiles import PRESETS, Profile, get_profile, set_profile, use_profile  # noqa: E402

timing.apply_env()
if os.environ.get("NPUSIM_MEMORY_CAPACITY"):
    for _index in range(torch.npu.device_count()):
        torch.npu.set_memory_capacity(parse_bytes(os.environ["NPUSIM_MEMORY_CAPACITY"]), _index)

# npusim.ops registers the npu kernel of aten::_foreach_copy_; npusim.distributed
# registers the "hccl" collective backend for npu (its extension builds on the
# first process group), so NPU training scripts work with just `import npusim`.
import npusim.distributed  # noqa: E402, F401
import npusim.ops  # noqa: E402, F401

__all__ = ["PRESETS", "BackendConflictError", "Profile", "get_profile", "set_profile", "timing", "use_profile"]
