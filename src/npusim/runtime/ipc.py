"""npu tensors through ``torch.multiprocessing``: shared between processes, as CUDA tensors are.

An npu tensor put on a ``torch.multiprocessing`` queue (or pipe, or sent to a pool worker) arrives
in the other process as an npu tensor of the same device index over the same memory: a write on
either side is seen by the other once its stream has run it. How: npu memory is host memory, so a
storage is moved into shared memory the first time it is sent and the receiver maps it (See Note
[Sharing npu tensors between processes] in csrc/aten/ipc.cpp). As for CPU tensors, the move happens
when the tensor is pickled, which a ``Queue`` does in its feeder thread after ``put`` returned:
don't change the tensor until the receiver has it (as with CPU tensors), or send one whose storage
is already shared. The receiving process must be able to use the npu: ``spawn`` it (``fork`` after
npu use is refused, as for CUDA), and it imports npusim when it unpickles the tensor.

PyTorch's reducers (``torch/multiprocessing/reductions.py``) handle the tensor itself (sizes,
strides, offset, ``requires_grad``) and hand its ``UntypedStorage`` to the storage reducer;
:func:`install` puts the npu case in front of PyTorch's, which handles every other device as
before.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef, fd_id, shared_cache, storage_from_cache

# The receiving process gets the npu device when it unpickles: importing this module imports the
# npusim package first, whose import registers the device.
from npusim.runtime import acl

__all__ = ["install", "rebuild_npu_storage", "reduce_npu_storage"]


def rebuild_npu_storage(df: Any, nbytes: int, device: int) -> torch.UntypedStorage:
    """The receiving side: the shared memory behind descriptor ``df`` as an npu storage of ``device``
    (one storage per shared segment in a process, as PyTorch's CPU rebuild keeps)."""
    fd = df.detach()
    try:
        key = fd_id(fd)
        storage = storage_from_cache(torch.UntypedStorage, key)
        if storage is not None:
            return storage
        storage = acl.open_shared_npu_storage(fd, nbytes, device).untyped_storage()
        shared_cache[key] = StorageWeakRef(storage)
        return storage
    finally:
        os.close(fd)


def rebuild_empty_npu_storage(device: int) -> torch.UntypedStorage:
    """An empty storage has no memory to share: a new one on ``device``."""
    return torch.UntypedStorage(0, device=torch.device("npu", device))


def reduce_npu_storage(storage: torch.UntypedStorage) -> tuple[Any, tuple[Any, ...]]:
    """The sending side: the storage's shared-memory descriptor (moving it there first), its size and device."""
    device = storage.device.index
    if storage.nbytes() == 0:
        return rebuild_empty_npu_storage, (device,)
    owner = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    fd = acl.share_npu_storage(owner)
    shared_cache[fd_id(fd)] = StorageWeakRef(storage)
    return rebuild_npu_storage, (DupFd(fd), storage.nbytes(), device)


def install() -> None:
    """Puts :func:`reduce_npu_storage` in front of PyTorch's storage reducer (idempotent)."""
    torch_reducer = ForkingPickler._extra_reducers.get(torch.UntypedStorage)  # noqa: SLF001  (the registry)
    if getattr(torch_reducer, "__npusim_ipc__", False):
        return

    def reduce_storage(storage: torch.UntypedStorage) -> tuple[Any, tuple[Any, ...]]:
        if storage.device.type == "npu":
            return reduce_npu_storage(storage)
        if torch_reducer is None:
            raise RuntimeError(f"torch.multiprocessing: no reducer for a storage on {storage.device}")
        return torch_reducer(storage)

    reduce_storage.__npusim_ipc__ = True  # type: ignore[attr-defined]
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
