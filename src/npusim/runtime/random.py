"""Random number state of the ``torch.npu`` module (one generator per device)."""

from __future__ import annotations

import torch

from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index


def manual_seed(seed: int) -> None:
    acl.manual_seed(acl.current_device(), int(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(acl.device_count()):
        acl.manual_seed(index, int(seed))


def seed() -> None:
    acl.seed(acl.current_device())


def seed_all() -> None:
    for index in range(acl.device_count()):
        acl.seed(index)


def initial_seed() -> int:
    return acl.initial_seed(acl.current_device())


def get_rng_state(device: _device_t = "npu") -> torch.Tensor:
    return acl.get_rng_state(_get_device_index(device))


def set_rng_state(new_state: torch.Tensor, device: _device_t = "npu") -> None:
    acl.set_rng_state(_get_device_index(device), new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [acl.get_rng_state(i) for i in range(acl.device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        acl.set_rng_state(index, state)


def _is_in_bad_fork() -> bool:
    """True in a child forked after the npu was used, where device calls raise.

    torch.random asks this before seeding, and skips the npu there. See
    Note [Fork after npu use] in csrc/runtime.cpp.
    """
    return acl.in_bad_fork()
