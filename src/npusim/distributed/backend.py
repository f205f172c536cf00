"""The c10d collective backend for npu tensors, registered as ``"hccl"``.

``import npusim.distributed`` registers it for the ``npu`` device, so
``dist.init_process_group()`` (no backend: the accelerator's default),
``init_process_group("hccl")`` and ``init_device_mesh("npu", ...)`` route npu
tensors to it. The backend itself is C++ (``csrc/distributed``, extension
``npusim_dist_C``, built at install): a ``c10d::Backend`` that moves data
through an internal ``ProcessGroupGloo`` over CPU views of device memory and
orders collectives like NCCL (see Note [Comm stream] in comm_stream.cpp).
"""

from __future__ import annotations

import atexit
from datetime import timedelta
from types import ModuleType

import torch.distributed as dist

from npusim._build import load_extension
from npusim._device import INTERRUPTED_EXIT_WAIT_S, exiting_on_interrupt, synchronize_all_at_exit
from npusim.runtime import acl

BACKEND_NAME = "hccl"
DEVICE_TYPE = "npu"

# At exit, wait this long for comm streams to drop the tensors of finished
# collectives (that takes the GIL, which aborts a finalizing interpreter).
DRAIN_AT_EXIT_S = 5.0

_extension: ModuleType | None = None


def load() -> ModuleType:
    """Builds (once) and loads the backend extension, wired to the device core."""
    global _extension
    if _extension is None:
        ext = load_extension("npusim_dist_C")
        # Extensions are loaded RTLD_LOCAL: the backend reaches the core's
        # runtime through this table, not through linked symbols.
        ext.set_core_api(acl.core_api_capsule())
        atexit.register(_drain_at_exit)
        _extension = ext
    return _extension


def _drain_at_exit() -> None:
    """Lets comm streams drop the tensors of finished collectives before finalization."""
    try:
        synchronize_all_at_exit()  # device tasks waiting for collectives let them finish first
    finally:
        if _extension is not None:  # after a Ctrl-C, a stalled collective is not waited for
            _extension.drain_releases(INTERRUPTED_EXIT_WAIT_S if exiting_on_interrupt() else DRAIN_AT_EXIT_S)


def wait_idle(timeout_s: float) -> bool:
    """Waits until every collective this process's npu backend has issued so far has
    finished on its comm stream and dropped its tensors (the backend holds them while a
    collective runs, as NCCL does). Returns False if that did not happen within
    ``timeout_s``; True at once when no process group uses the backend yet. Call it
    without holding locks that collectives' completion may need."""
    return True if _extension is None else bool(_extension.wait_idle(timeout_s))


def create_backend(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.Backend:
    """The creator ``init_process_group`` and ``new_group`` call for npu."""
    # A prefix of its own keeps the inner gloo group's rendezvous keys apart
    # from those of a "cpu:gloo" backend created on the same store.
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("npusim_gloo/", store), rank, size, timeout)
    return load().create_backend(gloo, rank, size, int(timeout.total_seconds() * 1000), BACKEND_NAME)


def register() -> None:
    """Registers the backend for the npu device (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=[DEVICE_TYPE])
