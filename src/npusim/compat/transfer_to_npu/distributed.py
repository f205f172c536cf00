"""``transfer_to_npu`` on ``torch.distributed``: nccl means hccl, CUDA devices the npu.

``init_process_group("nccl")`` (and ``"cuda:nccl,cpu:gloo"``, and ``new_group``'s
backend) uses npusim's hccl backend; ``is_nccl_available`` answers whether hccl is;
DDP's and FSDP's ``device_ids`` / ``device_id``, DeviceMesh's and
``init_device_mesh``'s device type, ``ProcessGroup._get_backend``'s device and
``init_process_group``'s ``device_id`` name the npu. ``ProcessGroupNCCL`` is the hccl
backend's class, and "cuda" leaves ``Backend.default_device_backend_map``, so a
backend chosen by device never picks nccl.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.distributed as dist

from npusim.compat.transfer_to_npu.devices import nccl_as_hccl, on_npu
from npusim.compat.transfer_to_npu.ledger import Ledger
from npusim.distributed import backend as hccl_backend

__all__ = ["is_hccl_available", "patch"]


def is_hccl_available() -> bool:
    """Whether npusim's hccl backend is registered with torch.distributed."""
    return hccl_backend.BACKEND_NAME in dist.Backend.backend_list


def _init_process_group_on_npu(init: object) -> object:
    return on_npu(nccl_as_hccl(init))  # type: ignore[arg-type]


def _drop_cuda_default_backend(ledger: Ledger) -> None:
    backends = dist.Backend.default_device_backend_map
    if "cuda" not in backends:
        return
    nccl = backends.pop("cuda")
    # A backend registered for "cuda" meanwhile (importing FSDP registers PyTorch's "fake")
    # took the entry as it would have without transfer_to_npu: it keeps it.
    ledger.record(lambda: backends.setdefault("cuda", nccl))


def _patch_fsdp(ledger: Ledger, module: ModuleType) -> None:
    ledger.wrap(module.FullyShardedDataParallel, "__init__", on_npu)


def _patch_pipelining(ledger: Ledger, module: ModuleType) -> None:
    ledger.wrap(module.PipelineStage, "__init__", on_npu)
    ledger.wrap(module, "build_stage", on_npu)


def patch(ledger: Ledger) -> None:
    """Applies the ``torch.distributed`` patches to ``ledger`` (nothing where it is not built)."""
    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    for owner in (dist, c10d):
        ledger.wrap(owner, "init_process_group", _init_process_group_on_npu)
        ledger.set(owner, "is_nccl_available", is_hccl_available)
        ledger.set(owner, "ProcessGroupNCCL", hccl_backend.load().ProcessGroupNpu)
    ledger.wrap(c10d, "_new_group_with_tag", nccl_as_hccl)
    ledger.wrap(dist.ProcessGroup, "_get_backend", on_npu)
    _drop_cuda_default_backend(ledger)
    ledger.wrap(torch.nn.parallel.DistributedDataParallel, "__init__", on_npu)
    ledger.wrap(dist.device_mesh.DeviceMesh, "__init__", on_npu)
    for owner in (dist, dist.device_mesh):
        ledger.wrap(owner, "init_device_mesh", on_npu)
    ledger.when_imported("torch.distributed.fsdp.fully_sharded_data_parallel",
                         lambda module: _patch_fsdp(ledger, module))
    ledger.when_imported("torch.distributed.pipelining.stage", lambda module: _patch_pipelining(ledger, module))
