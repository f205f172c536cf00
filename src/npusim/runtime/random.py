"""Random number state of the ``torch.npu`` module, with torch.cuda's contract.

Each device has one default generator, a Philox (seed, offset) counter whose
state is 16 bytes: the seed, then the offset (see Note [npu Philox stream] in
``csrc/aten/generator.h``). Every random op on an npu tensor draws from it (or
from a ``torch.Generator("npu")`` passed in) and advances the offset.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from npusim.runtime import acl
from npusim.runtime.device import _device_t, _get_device_index

__all__ = [
    "default_generator", "get_rng_state", "get_rng_state_all", "initial_seed",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all",
]


def default_generator(device: _device_t = None) -> torch.Generator:
    """The default generator of ``device`` (the current device by default)."""
    index = _get_device_index(device)
    if not 0 <= index < acl.device_count():
        raise ValueError(f"npu generator: device index {index} is out of range "
                         f"(the simulated npu has {acl.device_count()} devices)")
    return acl.default_generator(index)


def _default_generators() -> tuple[torch.Generator, ...]:
    """The default generator of every device, by index (``torch.npu.default_generators``)."""
    return tuple(acl.default_generator(i) for i in range(acl.device_count()))


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator (offset 0)."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's generator with ``seed``."""
    for gen in _default_generators():
        gen.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic random number."""
    default_generator().seed()


def seed_all() -> None:
    """Seeds every device with one non-deterministic random number, as torch.cuda.seed_all."""
    gens = _default_generators()
    if gens:
        chosen = gens[0].seed()
        for gen in gens[1:]:
            gen.manual_seed(chosen)


def initial_seed() -> int:
    """The seed of the current device's generator."""
    return default_generator().initial_seed()


def get_rng_state(device: _device_t = "npu") -> torch.Tensor:
    """The 16-byte (seed, offset) state of ``device``'s generator, a CPU uint8 tensor."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _device_t = "npu") -> None:
    """Restores a state from :func:`get_rng_state`; the offset must be a multiple of 4, as on CUDA."""
    default_generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def get_rng_state_all() -> list[torch.Tensor]:
    return [gen.get_state() for gen in _default_generators()]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def _is_in_bad_fork() -> bool:
    """True in a child forked after the npu was used, where device calls raise.

    torch.random asks this before seeding, and skips the npu there. See
    Note [Fork after npu use] in csrc/runtime/device.cpp.
    """
    return acl.in_bad_fork()
