"""The one place that touches FSDP2's (and torch's) private state.

The enhancement layer patches nothing, but the recompute rule must read and
set a few private attributes of FSDP2's per-module state, and the cache
subclasses FSDP2's default comm objects. A torch upgrade that renames any of
them would otherwise make the rule silently do nothing (a green audit over a
mistraining model), so this module checks at import that each one exists and
raises :class:`FSDPPrivateAPIError` naming it and the torch version.
:data:`WRITTEN` lists what is written; the auditor prints it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_common, _fsdp_param_group, _fsdp_state


class FSDPPrivateAPIError(RuntimeError):
    """A private FSDP2 name the enhancement layer relies on is missing in this torch."""


class PrivateName(NamedTuple):
    owner: str  # where it lives
    name: str
    access: str  # "read", "read/write" or "subclassed"


USED: tuple[PrivateName, ...] = (
    PrivateName("FSDPModule", "_get_fsdp_state", "read"),
    PrivateName("FSDPState", "_training_state", "read/write"),
    PrivateName("FSDPState", "_states_to_forward_prefetch", "read/write"),
    PrivateName("FSDPState", "_fsdp_param_groups", "read"),
    PrivateName("FSDPParamGroup", "_training_state", "read"),
    PrivateName("_fsdp_common", "TrainingState", "read"),
    PrivateName("_fsdp_collectives", "DefaultAllGather", "subclassed"),
    PrivateName("_fsdp_collectives", "DefaultReduceScatter", "subclassed"),
    PrivateName("torch._C", "_current_graph_task_id", "read"),
    PrivateName("torch._C", "_storage_Use_Count", "read"),
)
WRITTEN: tuple[PrivateName, ...] = tuple(p for p in USED if "write" in p.access)


def _assigned_in_init(cls: type) -> set[str]:
    # Instance attributes exist only on instances; the names __init__ uses
    # are the cheapest import-time evidence that they are still set there.
    return set(cls.__init__.__code__.co_names)


def _present(p: PrivateName) -> bool:
    if p.owner == "FSDPState":
        return p.name in _assigned_in_init(_fsdp_state.FSDPState)
    if p.owner == "FSDPParamGroup":
        return p.name in _assigned_in_init(_fsdp_param_group.FSDPParamGroup)
    owner = {"FSDPModule": FSDPModule, "_fsdp_common": _fsdp_common, "_fsdp_collectives": _fsdp_collectives,
             "torch._C": torch._C}[p.owner]
    return hasattr(owner, p.name)


def check() -> None:
    """Raises FSDPPrivateAPIError if any private name of :data:`USED` is missing."""
    missing = [f"{p.owner}.{p.name}" for p in USED if not _present(p)]
    if missing:
        raise FSDPPrivateAPIError(
            f"npusim's FSDP2 enhancement layer relies on private FSDP2 names that torch {torch.__version__} "
            f"does not have: {', '.join(missing)}. npusim is verified against torch 2.13.0; the recompute rule "
            "and the comm-buffer cache cannot run on this torch.")
    required = ("IDLE", "PRE_BACKWARD", "POST_BACKWARD")
    absent = [m for m in required if not hasattr(_fsdp_common.TrainingState, m)]
    if absent:
        raise FSDPPrivateAPIError(
            f"npusim's FSDP2 enhancement layer needs TrainingState.{'/'.join(absent)}, which torch "
            f"{torch.__version__} does not define")


check()

TrainingState = _fsdp_common.TrainingState
DefaultAllGather = _fsdp_collectives.DefaultAllGather
DefaultReduceScatter = _fsdp_collectives.DefaultReduceScatter


def fsdp_state(module: FSDPModule) -> Any:
    return module._get_fsdp_state()


def training_state(module: FSDPModule) -> Any:
    return fsdp_state(module)._training_state


def set_training_state(module: FSDPModule, value: Any) -> None:
    fsdp_state(module)._training_state = value


def any_group_in_post_backward(module: FSDPModule) -> bool:
    return any(g._training_state == TrainingState.POST_BACKWARD for g in fsdp_state(module)._fsdp_param_groups)


def forward_prefetch_states(module: FSDPModule) -> list[Any]:
    return fsdp_state(module)._states_to_forward_prefetch


def restore_forward_prefetch_states(module: FSDPModule, states: list[Any]) -> None:
    # The public setter takes modules and validates them; restoring the exact
    # list taken by forward_prefetch_states needs the private one.
    fsdp_state(module)._states_to_forward_prefetch = states


def in_backward() -> bool:
    """True while the autograd engine executes a backward graph on this thread."""
    return torch._C._current_graph_task_id() != -1


def storage_use_count(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)
