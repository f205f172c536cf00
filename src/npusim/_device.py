"""Registers the simulated ``npu`` device with PyTorch: :func:`register`, the one
ordered registration step, which the package face ``npusim/__init__.py`` calls
once (importing this module registers nothing).

What registration does: checks that no other backend owns PrivateUse1, hands
the C++ core the environment's settings (see :mod:`npusim.config`), installs
the device guard, hooks and allocator, names PrivateUse1 ``npu``, registers
``torch.npu`` and generates the ``Tensor.npu()`` methods; then it runs the
layers' registrations it is handed, in their order (the op plugin's kernels,
the collective backend, torch.compile, the sanitizer). The layers are handed
in by the face because they sit above this module: it imports none of them.
"""

from __future__ import annotations

import atexit
import sys
import time
from collections.abc import Callable

import torch

from npusim import config


class BackendConflictError(RuntimeError):
    """Another backend already owns PrivateUse1."""


def _check_privateuse1_is_free() -> None:
    name = torch._C._get_privateuse1_backend_name()
    if "torch_npu" in sys.modules and not getattr(sys.modules["torch_npu"], "__npusim_shim__", False):
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


def apply_settings() -> None:
    """Hands the C++ core the settings it needs before the first device is used."""
    from npusim.runtime import acl

    physical = config.device_count(acl.DEFAULT_DEVICE_COUNT, acl.MAX_DEVICES)
    acl.set_device_count(len(config.visible_devices(physical)))
    acl.set_launch_blocking(config.launch_blocking())
    conf = config.alloc_conf()
    acl.set_allocator_settings(-1 if conf.max_split_size is None else conf.max_split_size,
                               conf.garbage_collection_threshold, conf.roundup_power2_divisions)


_registered = False


def register(*layers: Callable[[], None]) -> None:
    """Registers the npu device and ``torch.npu``, then calls each of ``layers`` in order; once."""
    global _registered
    if _registered:
        return
    _registered = True
    _register_device()
    for layer in layers:
        layer()


def _register_device() -> None:
    _check_privateuse1_is_free()
    apply_settings()
    from npusim.runtime import acl

    acl.register_device()
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    from npusim.runtime import npu as npu_module

    torch._register_device_module("npu", npu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    atexit.register(_drain_at_exit)

    from npusim.runtime import memory, timing

    timing.apply_env()
    # The device's total memory: the profile's HBM size unless NPUSIM_MEMORY_CAPACITY says otherwise.
    nbytes = config.memory_capacity()
    for index in range(acl.device_count()):
        memory.set_memory_capacity(nbytes, index)


def _drain_at_exit() -> None:
    """Lets background threads finish with Python objects before finalization.

    Device work must finish before the interpreter tears down what stream
    workers reference. And PyTorch's autograd thread for the npu device drops
    its last reference to a finished GraphTask (whose thread-local state holds
    Python objects) just after backward() has returned; if the interpreter is
    already finalizing then, taking the GIL aborts the process. A short wait
    with the GIL released closes that window.
    """
    from npusim.runtime import acl

    if acl.in_bad_fork():
        return  # a forked child: the parent's streams are not ours to drain
    acl.synchronize_all()
    time.sleep(0.05)

