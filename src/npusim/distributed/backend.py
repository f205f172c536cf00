"""The c10d collective backend for npu tensors, registered as ``"hccl"``.

``import npusim.distributed`` registers it for the ``npu`` device, so
``dist.init_process_group()`` (no backend: the accelerator's default),
``init_process_group("hccl")`` and ``init_device_mesh("npu", ...)`` route npu
tensors to it. The backend itself is C++ (``csrc/distributed``, extension
``npusim_dist_C``, built at install): a ``c10d::Backend`` that moves data
through an internal ``ProcessGroupGloo`` over CPU views of device memory and
orders collectives like NCCL (see Note [Comm stream] in comm_stream.cpp).
The options it takes are :class:`HcclOptions`, torch_npu's
``ProcessGroupHCCL.Options`` (Note [hccl options]).
"""

from __future__ import annotations

import atexit
import copy
from types import ModuleType
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend

from npusim import config
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
        ext.ProcessGroupNpu.Options = HcclOptions  # as torch_npu's ProcessGroupHCCL.Options
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


# Note [hccl options]
# torch_npu's ProcessGroupHCCL.Options is a c10d Backend.Options, so frameworks pass it
# as pg_options to new_group / init_process_group and as a DeviceMesh backend_override
# (torchtitan-npu gives one to force a separate expert-parallel group; MindSpeed sets
# hccl_config["hccl_buffer_size"] per group). The backend is registered with torch's
# extended creator API so that it receives them. What it honours, as torch_npu's
# creator does: the group's timeout is the timeout argument (it overwrites _timeout),
# is_high_priority_stream is forced False, global_ranks_in_group and group_id are
# filled in, and hccl_config's known keys must have the types torch_npu accepts (a
# TypeError names the key otherwise; unknown keys are ignored, as torch_npu ignores
# them). The values change nothing here: there are no HCCL buffers, QoS classes or
# algorithms to select. hccl_config reads as a copy, as torch_npu's binding returns one.

# hccl_config keys torch_npu's ProcessGroupHCCL reads, and the value type it accepts.
HCCL_CONFIG_TYPES: dict[str, type] = {
    "hccl_buffer_size": int, "qos_traffic_class": int, "qos_service_level": int, "hccl_sdma_qos": int,
    "hccl_op_expansion_mode": int, "hccl_world_rank_id": int, "hccl_job_id": int, "hccl_exec_timeout": int,
    "group_name": str, "hccl_algo": str, "hccl_retry_enable": str, "hccl_retry_params": str,
    "hccl_buffer_name": str,
}


class HcclOptions(C10dBackend.Options):
    """torch_npu's ``ProcessGroupHCCL.Options`` for npusim's hccl backend. See Note [hccl options]."""

    def __init__(self) -> None:
        super().__init__(BACKEND_NAME)
        self._hccl_config: dict[str, int | str] = {}
        self.is_high_priority_stream = False
        self.global_ranks_in_group: list[int] = []
        self.group_id = ""
        self.op_timeout = 0

    @property
    def hccl_config(self) -> dict[str, int | str]:
        return dict(self._hccl_config)

    @hccl_config.setter
    def hccl_config(self, config: dict[str, int | str]) -> None:
        if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
            raise TypeError(f"ProcessGroupHCCL.Options.hccl_config: expected a dict with str keys, got {config!r}")
        self._hccl_config = dict(config)

    def check_hccl_config(self) -> None:
        """Raises TypeError for a known hccl_config key whose value has a type torch_npu refuses."""
        for key, value in self._hccl_config.items():
            expected = HCCL_CONFIG_TYPES.get(key)
            if expected is not None and (not isinstance(value, expected) or isinstance(value, bool)):
                raise TypeError(f"hccl backend: hccl_config[{key!r}] must be {expected.__name__}, "
                                f"got {type(value).__name__} {value!r}")

    def __deepcopy__(self, memo: dict[int, Any]) -> HcclOptions:
        clone = HcclOptions()
        clone._timeout = self._timeout
        for name in ("_hccl_config", "is_high_priority_stream", "global_ranks_in_group", "group_id", "op_timeout"):
            setattr(clone, name, copy.deepcopy(getattr(self, name), memo))
        return clone


def create_backend(dist_options: Any, pg_options: C10dBackend.Options | None) -> dist.Backend:
    """The creator ``init_process_group`` and ``new_group`` call for npu (torch's extended API:
    ``_DistributedBackendOptions`` and the caller's ``pg_options``). See Note [hccl options]."""
    if pg_options is not None and not isinstance(pg_options, C10dBackend.Options):
        raise TypeError(f"hccl backend: pg_options must be ProcessGroupHCCL.Options, got {type(pg_options).__name__}")
    if isinstance(pg_options, HcclOptions):
        pg_options.check_hccl_config()
        pg_options.is_high_priority_stream = False
        pg_options._timeout = dist_options.timeout
        pg_options.global_ranks_in_group = list(dist_options.global_ranks_in_group)
        pg_options.group_id = dist_options.group_id
    store, rank, size, timeout = (dist_options.store, dist_options.group_rank, dist_options.group_size,
                                  dist_options.timeout)
    global_ranks = list(dist_options.global_ranks_in_group) or list(range(size))
    if config.planned_world():  # one rank stands for the world: Note [A planned world] in backend.cpp
        return load().create_planned_backend(rank, size, int(timeout.total_seconds() * 1000), BACKEND_NAME,
                                             global_ranks)
    # A prefix of its own keeps the inner gloo group's rendezvous keys apart
    # from those of a "cpu:gloo" backend created on the same store.
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("npusim_gloo/", store), rank, size, timeout)
    return load().create_backend(gloo, rank, size, int(timeout.total_seconds() * 1000), BACKEND_NAME, global_ranks)


def register() -> None:
    """Registers the backend for the npu device (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=[DEVICE_TYPE])
