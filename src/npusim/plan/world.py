"""One rank standing for its world: the launcher's environment of a rank of an N-rank job, without the
other N-1 processes (what ``npusim plan --world-size N`` runs).

Note [Launching a planned world]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
An SPMD script finds its world in torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR / MASTER_PORT) and forms it with
``init_process_group``. :func:`enter` gives the process that environment for rank ``rank`` of
``world_size`` ranks placed ``ranks_per_node`` to a node, as torchrun gives it, and hosts the
rendezvous store as torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE``: every rank is a client of
a store the launcher holds, so no rank waits in the store for the others to join; PyTorch's own
init_process_group then runs unchanged; its store-based barrier, which would wait for every rank, is
off unless ``TORCH_DIST_INIT_BARRIER=1``, which :func:`enter` refuses). With
``NPUSIM_PLANNED_WORLD=1`` the hccl backend's groups are planned groups (Note [A planned world] in
csrc/distributed/backend.cpp): collectives are priced for the world's group sizes and node
placement and move nothing, and DeviceMesh, FSDP2, TP and DTensor see the real world size.

A ``gloo`` CPU group would wait for its peers to rendezvous, and they are not there: in a planned world
torch.distributed makes its gloo groups as the planned groups' inner one (a MirrorBackend of
csrc/distributed/mirror_backend.h, in ProcessGroupGloo's place in ``torch.distributed.distributed_c10d``,
for this process only), so CPU collectives complete at once and compute as if every rank held this
rank's data. A program whose ranks differ (pipeline stages, uneven experts) needs every rank:
``npusim plan --all-ranks`` runs them as processes.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any, NamedTuple

__all__ = ["PlannedWorld", "enter", "leave_launcher"]

# What torchrun tells a rank about its world (and its rendezvous), which enter() writes for a planned one.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


class PlannedWorld(NamedTuple):
    world_size: int
    ranks_per_node: int
    rank: int = 0

    def check(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"npusim plan: --world-size must be at least 1, got {self.world_size}")
        if self.ranks_per_node < 1:
            raise ValueError(f"npusim plan: --ranks-per-node must be at least 1, got {self.ranks_per_node}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"npusim plan: --rank must be in [0, {self.world_size}), got {self.rank}")


def leave_launcher(environ: MutableMapping[str, str] = os.environ) -> None:
    """Forgets a one-process launcher's world (torchrun --nproc-per-node 1), so that enter() can plan one."""
    for name in LAUNCHER_VARIABLES:
        environ.pop(name, None)


def enter(world: PlannedWorld, environ: MutableMapping[str, str] = os.environ) -> Any:
    """Makes this process rank ``world.rank`` of a planned world (Note [Launching a planned world]);
    returns the rendezvous store it hosts, which must stay alive while the job runs."""
    from torch.distributed import TCPStore, distributed_c10d

    from npusim.distributed import backend
    from npusim.runtime import acl

    world.check()
    for name in ("RANK", "WORLD_SIZE"):
        if name in environ:
            raise ValueError(f"npusim plan: {name} is set ({environ[name]!r}): under torchrun the world is "
                             "torchrun's; --world-size plans a world without a launcher")
    if environ.get("TORCH_DIST_INIT_BARRIER", "0") == "1":
        raise ValueError("npusim plan: TORCH_DIST_INIT_BARRIER=1 makes init_process_group wait for every rank, "
                         "and a planned world runs one; unset it")
    local_ranks = min(world.ranks_per_node, world.world_size)
    if local_ranks > acl.MAX_DEVICES:
        raise ValueError(f"npusim plan: --ranks-per-node {world.ranks_per_node} is more than the {acl.MAX_DEVICES} "
                         "devices a simulated node has")
    if local_ranks > acl.device_count():
        acl.set_device_count(local_ranks)
        environ["NPUSIM_DEVICE_COUNT"] = str(local_ranks)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    distributed_c10d.ProcessGroupGloo = backend.load().PlannedGloo  # gloo groups of a planned world
    environ.update({
        "RANK": str(world.rank), "WORLD_SIZE": str(world.world_size),
        "LOCAL_RANK": str(world.rank % world.ranks_per_node), "LOCAL_WORLD_SIZE": str(local_ranks),
        "GROUP_RANK": str(world.rank // world.ranks_per_node), "ROLE_RANK": str(world.rank),
        "ROLE_WORLD_SIZE": str(world.world_size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
        "NPUSIM_RANKS_PER_NODE": str(world.ranks_per_node), "NPUSIM_PLANNED_WORLD": "1",
    })
    return store
