"""SoC / CANN capability profiles (docs/SPEC.md section 4.3).

A profile says what the simulated SoC, runtime and operator kernel can do,
and which SoC it models (name, HBM size, core counts, as torch_npu reports
them through ``torch.npu.get_device_properties``);
the ``_foreach_copy_`` routing reads it on every call. Select a preset by name
and override single flags, through the API or the environment::

    NPUSIM_PROFILE=inference_soc NPUSIM_PROFILE_OVERRIDES="batch=1" python ...
    npusim.set_profile("old_cann", memcpy_batch_async=False)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from npusim import config
from npusim.runtime import acl

_BASE_FAST_DTYPES = frozenset({
    torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8,
})
_CANN_810_DTYPES = frozenset({torch.int64, torch.float64, torch.bool})
MIB = 1 << 20
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the SoC, the CANN runtime and the op kernel support."""

    name: str
    nd_out: bool = True  # SoC supports the ND foreach kernel (fast path)
    batch: bool = True  # SoC supports batched memcpy
    memcpy_batch: bool = True  # runtime has the blocking batched memcpy
    memcpy_batch_async: bool = True  # runtime has the asynchronous batched memcpy
    cann_ge_810rc1: bool = True  # kernel supports int64, float64, bool
    foreach_copy_kernel: bool = True  # operator kernel present (else DO_COMPATIBILITY)
    sync_timeout_s: float = 300.0  # stream synchronize timeout before a blocking batch
    # The SoC the profile models, as torch_npu's get_device_properties reports it.
    soc_name: str = "Ascend910B2"
    total_memory: int = 64 * GIB  # HBM bytes: the default device capacity
    cube_core_num: int = 24
    vector_core_num: int = 48
    l2_cache_size: int = 192 * MIB

    @property
    def fast_dtypes(self) -> frozenset[torch.dtype]:
        return _BASE_FAST_DTYPES | _CANN_810_DTYPES if self.cann_ge_810rc1 else _BASE_FAST_DTYPES

    @functools.cached_property
    def fast_dtype_mask(self) -> int:
        """``fast_dtypes`` as the bit mask the native kernel takes (computed once per profile)."""
        return acl.dtype_mask(sorted(self.fast_dtypes, key=str))

    def memcpy_batch_available(self, non_blocking: bool) -> bool:
        return self.memcpy_batch_async if non_blocking else self.memcpy_batch

    def replace(self, **overrides: object) -> Profile:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"npusim profile: unknown flag(s) {sorted(unknown)}; "
                             f"expected some of {FLAGS}")
        return dataclasses.replace(self, **overrides)


FLAGS = ("nd_out", "batch", "memcpy_batch", "memcpy_batch_async", "cann_ge_810rc1",
         "foreach_copy_kernel")

PRESETS: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("training_soc"),
        # An Atlas 300I Pro card: no ND foreach kernel, no batched memcpy.
        Profile("inference_soc", nd_out=False, batch=False, soc_name="Ascend310P3", total_memory=24 * GIB,
                cube_core_num=8, vector_core_num=7, l2_cache_size=96 * MIB),
        Profile("old_cann", cann_ge_810rc1=False),
        Profile("no_memcpy_batch", memcpy_batch=False, memcpy_batch_async=False),
        Profile("no_foreach_kernel", foreach_copy_kernel=False),
    )
}
DEFAULT = "training_soc"


def parse_overrides(text: str) -> dict[str, object]:
    """Parses ``"nd_out=0,batch=true,sync_timeout_s=5"`` (``NPUSIM_PROFILE_OVERRIDES``)."""
    return config.parse_settings(text, "NPUSIM_PROFILE_OVERRIDES", _override_readers())


def _override_readers() -> dict[str, object]:
    readers = {flag: config.parse_bool for flag in FLAGS}
    readers["sync_timeout_s"] = config.parse_float
    return readers


def make_profile(name: str | Profile = DEFAULT, **overrides: object) -> Profile:
    if isinstance(name, Profile):
        base = name
    else:
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(f"npusim profile: unknown preset {name!r}; expected one of {sorted(PRESETS)}") from None
    return base.replace(**overrides) if overrides else base


def _from_env() -> Profile:
    return make_profile(config.profile_name(), **config.profile_overrides(_override_readers()))


def _activate(profile: Profile) -> Profile:
    """Makes ``profile`` current; the only place ``_current`` changes, so the native
    ``_foreach_copy_`` kernel's mirror of it never goes stale
    (See Note [Native _foreach_copy_ kernel] in csrc/foreach_copy.cpp)."""
    global _current
    acl.set_foreach_copy_profile(profile.foreach_copy_kernel, profile.nd_out, profile.fast_dtype_mask,
                                 profile.sync_timeout_s)
    _current = profile
    return profile


_current: Profile = _activate(_from_env())


def get_profile() -> Profile:
    return _current


def set_profile(name: str | Profile = DEFAULT, **overrides: object) -> Profile:
    """Selects a preset (or a Profile) with per-flag overrides; returns it."""
    return _activate(make_profile(name, **overrides))


@contextmanager
def use_profile(name: str | Profile = DEFAULT, **overrides: object) -> Iterator[Profile]:
    """Temporarily selects a profile."""
    previous = _current
    try:
        yield set_profile(name, **overrides)
    finally:
        _activate(previous)
