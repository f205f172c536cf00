"""Registers the simulated ``npu`` device with PyTorch: :func:`register`, the one
ordered registration step, which the package face ``npusim/__init__.py`` calls
once (importing this module registers nothing).

What registration does: checks that no other backend owns PrivateUse1, hands
the C++ core the environment's settings (see :mod:`npusim.config`), installs
the device guard, hooks and allocator, names PrivateUse1 ``npu``, registers
``torch.npu`` (its submodules importable as ``torch.npu.<name>``) and
``torch.backends.npu``, generates the ``Tensor.npu()`` methods, and keeps a real
torch_npu from loading on top (Note [One owner of the npu device]); then it runs the
layers' registrations it is handed, in their order (the op plugin's kernels,
the collective backend, torch.compile, the sanitizer). The layers are handed
in by the face because they sit above this module: it imports none of them.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

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


# What every plan-mode run says first (Note [Plan mode]; docs/PLAN.md).
PLAN_MODE_NOTICE = ("values are not computed: npu work over 1 MiB writes nothing and large tensors read as "
                    "zeros (plan mode; docs/PLAN.md says what that does to .item(), loss scaling, clipping and "
                    "routing)")


def apply_settings() -> None:
    """Hands the C++ core the settings it needs before the first device is used."""
    from npusim.runtime import acl

    physical = config.device_count(acl.DEFAULT_DEVICE_COUNT, acl.MAX_DEVICES)
    acl.set_device_count(len(config.visible_devices(physical)))
    acl.set_launch_blocking(config.launch_blocking())
    acl.set_small_ops_on_the_host(config.small_ops_on_the_host())
    acl.set_plan_mode(config.plan_mode())
    if config.plan_mode() and os.environ.get("RANK", "0") == "0":  # said once per job, not per rank
        print(f"npusim: NPUSIM_COMPUTE=plan: {PLAN_MODE_NOTICE}", file=sys.stderr, flush=True)
    acl.set_max_pending_launches(config.max_pending_launches())
    margin = config.host_memory_margin()
    acl.set_host_memory_margin(-1 if margin is None else margin)
    # PYTORCH_NPU_ALLOC_CONF is read when the allocator initialises, not now (Note [Allocator settings]).
    from npusim.runtime import memory

    acl.set_allocator_settings_reader(memory._read_alloc_conf)


# Note [One owner of the npu device]
# A process has one PrivateUse1 backend. Importing npusim after a real torch_npu raises
# BackendConflictError (_check_privateuse1_is_free). The other order, a real torch_npu
# imported after npusim, would fail somewhere inside torch_npu's C++ registration, so
# npusim puts a finder at the front of sys.meta_path that answers for the top-level name
# ``torch_npu`` only when some other finder would load a real one, with a loader that
# raises BackendConflictError instead. This is what a process gets whose ``import torch``
# autoloaded npusim through the ``torch.backends`` entry point (pyproject.toml) and then
# imports an installed torch_npu, or whose ``import torch`` runs both backends' entry
# points. Under ``python -m npusim run`` npusim's own torch_npu finder comes first, so the
# guard never sees the name there. It adds nothing importable: where no real torch_npu is
# installed, ``import torch_npu`` still fails as it would without npusim.


class _RefuseRealTorchNpu(importlib.abc.Loader):
    def __init__(self, origin: str | None) -> None:
        self.origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        raise BackendConflictError(
            f"torch_npu ({self.origin}) cannot be imported: npusim's simulated npu already owns the PrivateUse1 "
            "device in this process (npusim is loaded by `import torch` through the torch.backends entry point "
            "unless TORCH_DEVICE_BACKEND_AUTOLOAD=0, or by `import npusim`). Use one or the other in a process: "
            "set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to use the real torch_npu, or run the script with "
            "`python -m npusim run` to get npusim's torch_npu.")

    def exec_module(self, module: ModuleType) -> None:
        raise AssertionError("unreachable: create_module raises")


class _RealTorchNpuGuard(importlib.abc.MetaPathFinder):
    """See Note [One owner of the npu device]."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != "torch_npu":
            return None
        for finder in list(sys.meta_path):  # a finder may change the list (compat's startup hook does)
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if getattr(spec.loader, "npusim_compat", False):
                    return spec  # npusim's own torch_npu (npusim run): not a conflict
                return importlib.util.spec_from_loader(fullname, _RefuseRealTorchNpu(spec.origin))
        return None


def _register_submodules(npu_module: ModuleType) -> None:
    """``import torch.npu.amp`` and ``torch.backends.npu`` work as with torch_npu's package."""
    for name in npu_module.SUBMODULES:
        sys.modules[f"torch.npu.{name}"] = getattr(npu_module, name)
    from npusim.runtime import backends

    torch.backends.npu = backends  # type: ignore[attr-defined]
    sys.modules["torch.backends.npu"] = backends


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
    _register_submodules(npu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    sys.meta_path.insert(0, _RealTorchNpuGuard())
    atexit.register(_drain_at_exit)
    from npusim.runtime import backend_meta, ipc

    backend_meta.install_fake_tensor_hook()  # Note [Backend metadata of fake tensors]
    ipc.install()  # npu tensors through torch.multiprocessing

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
    synchronize_all_at_exit()
    time.sleep(0.05)


# Note [Failures found at exit]
# Asynchronous work that failed surfaces at the device's next synchronize. When
# nothing synchronized after it (a rank issues a collective, its peer dies, the
# script ends), the first synchronize is the one at exit, and its error used to
# end the run with "Exception ignored in atexit callback" and a traceback of
# npusim's exit handler, which says nothing about the failure's cause. No caller
# is left to handle it then, so the wait at exit never raises: it waits for the
# work queued before exit began (Note [Launches at exit] in
# csrc/runtime/stream.cpp), then reports each failed device on one line (a
# failure is sticky, Note [Sticky device errors]: once per device, however many
# exit handlers drain), and the exit goes on.
#
# An exit because of Ctrl-C (KeyboardInterrupt, possibly out of an interrupted
# host wait: Note [Interruptible host waits] in csrc/runtime/host_wait.h) waits for the
# streams at most INTERRUPTED_EXIT_WAIT_S: the user asked to stop, and the work
# the wait was for may take minutes (a stalled collective). What is still
# queued then is left to the stream workers, which the process's exit ends.
INTERRUPTED_EXIT_WAIT_S = 0.25
_reported_at_exit: set[int] = set()  # devices whose failure was reported at exit


def exiting_on_interrupt() -> bool:
    """True when the interpreter is exiting because of an uncaught KeyboardInterrupt."""
    return isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)


def synchronize_all_at_exit() -> None:
    """Waits at interpreter exit for the work every stream had queued when exit began, never raising;
    a failed device is reported on stderr, one line each, and after a Ctrl-C the wait is bounded. From
    then on another Python thread stops at its next launch or host wait (Note [Launches at exit]). See
    Note [Failures found at exit]."""
    from npusim.runtime import acl

    if acl.in_bad_fork():
        return  # a forked child: the parent's streams are not ours to drain
    acl.begin_exit()
    try:
        drained = acl.drain_streams(INTERRUPTED_EXIT_WAIT_S if exiting_on_interrupt() else -1.0)
    except KeyboardInterrupt:  # a Ctrl-C during the wait at exit: stop waiting
        drained = False
    if not drained:
        print("npusim: interrupted; not waiting for the work still queued on the npu", file=sys.stderr, flush=True)
    for device in range(acl.device_count()):
        failure = acl.device_failure(device)
        if failure and device not in _reported_at_exit:
            _reported_at_exit.add(device)
            print(f"npusim: at exit, npu:{device} had failed: asynchronous work on {failure}", file=sys.stderr,
                  flush=True)


def device_failures() -> dict[int, str]:
    """The failed devices and their first errors (``"<stream>: <op> failed: <message>"``): Note [Sticky device
    errors] in ``csrc/runtime/stream.cpp``."""
    from npusim.runtime import acl

    failures = {device: acl.device_failure(device) for device in range(acl.device_count())}
    return {device: failure for device, failure in failures.items() if failure}


def clear_device_failures() -> dict[int, str]:
    """For test harnesses only (npusim.testing.device_failures): forgets every device's failure, after waiting
    for the work queued so far, as a new process would start without it; returns what was forgotten."""
    from npusim.runtime import acl

    acl.drain_streams(-1.0)
    failures = device_failures()
    for device in failures:
        acl.clear_device_failure(device)
    return failures
