"""Every environment variable npusim reads, parsed in one place: the
``NPUSIM_*`` ones and the two of torch_npu it honours
(``ASCEND_RT_VISIBLE_DEVICES``, ``PYTORCH_NPU_ALLOC_CONF``).

Each variable has one typed accessor at the end of this module (``device_count``,
``alloc_conf``, ...), which every caller uses: no other module reads or bounds an
environment variable. The accessors read through :func:`env` (the raw text) and
one of the typed readers below, so that a bad value always gives a
:class:`ConfigError` that names the variable and what it accepts. Lists of settings (``NPUSIM_TIMING``,
``NPUSIM_PROFILE_OVERRIDES``) share one ``key=value,key=value`` parser. The C++
core reads no environment itself: Python hands it the parsed values through
setters (see ``npusim._device.apply_settings``).

This module imports nothing of npusim or torch: it sits below every layer.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """An environment variable of npusim has a value it cannot use."""


class Variable(NamedTuple):
    name: str
    default: str  # "" when unset means "off" or "the built-in default"
    doc: str


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("NPUSIM_DEVICE_COUNT", "", "simulated devices per process (an integer in [1, 16]; default 8)"),
    Variable("ASCEND_RT_VISIBLE_DEVICES", "", "torch_npu's device filter: ascending device ids, e.g. 0,1"),
    Variable("TORCH_NPU_DEVICE_CAPABILITY", "", "what torch.npu.get_device_capability reports, e.g. 8.0"),
    Variable("PYTORCH_NPU_ALLOC_CONF", "", "caching allocator settings, e.g. max_split_size_mb:128"),
    Variable("NPUSIM_MEMORY_CAPACITY", "", "per-device capacity such as 512MiB (default: the profile's HBM size)"),
    Variable("NPUSIM_PROFILE", "training_soc", "capability preset"),
    Variable("NPUSIM_PROFILE_OVERRIDES", "", "per-flag profile overrides, e.g. nd_out=0,batch=1"),
    Variable("NPUSIM_TIMING", "", "timing model, e.g. copy_gbps=2,launch_us=20,link_gbps=1,compute=1 (default off)"),
    Variable("NPUSIM_FOREACH_COPY_MODE", "aligned", "aligned or legacy (the _foreach_copy_ kernel before the change)"),
    Variable("NPUSIM_LAUNCH_BLOCKING", "0", "1: every device task completes before its launch returns"),
    Variable("NPUSIM_SANITIZER", "0", "1: report stream races (npusim.sanitizer), like TORCH_CUDA_SANITIZER"),
    Variable("NPUSIM_BUILD_DIR", "", "where the C++ core is built and cached"),
    Variable("NPUSIM_BUILD_VERBOSE", "0", "1: show the compiler's output while building"),
)}


def env(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The stripped text of a registered variable, or its default when unset or empty."""
    if name not in VARIABLES:
        raise KeyError(f"npusim config: {name} is not a registered variable")
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or VARIABLES[name].default


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The unstripped text of a registered variable, None when unset (where empty differs from unset)."""
    if name not in VARIABLES:
        raise KeyError(f"npusim config: {name} is not a registered variable")
    return (os.environ if environ is None else environ).get(name)


def fail(name: str, expected: str, got: str) -> ConfigError:
    return ConfigError(f"{name}: expected {expected}, got {got!r}")


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise fail(name, f"a boolean ({'/'.join(_TRUE)} or {'/'.join(_FALSE)})", text)


def parse_int(text: str, name: str, low: int | None = None, high: int | None = None) -> int:
    bounds = f" in [{low}, {high}]" if low is not None and high is not None else ""
    try:
        value = int(text.strip())
    except ValueError:
        raise fail(name, f"an integer{bounds}", text) from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise fail(name, f"an integer{bounds}", text)
    return value


def parse_float(text: str, name: str, low: float | None = None) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise fail(name, "a number", text) from None
    if low is not None and value < low:
        raise fail(name, f"a number >= {low}", text)
    return value


def parse_choice(text: str, name: str, choices: tuple[str, ...]) -> str:
    value = text.strip().lower()
    if value not in choices:
        raise fail(name, f"one of {', '.join(choices)}", text)
    return value


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_bytes(text: str, name: str = "npusim") -> int:
    """Parses ``"512MiB"``, ``"2g"`` or ``"1048576"``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise fail(name, "a byte size like '512MiB' or '1048576'", text)
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_settings(text: str, name: str, readers: Mapping[str, Callable[[str, str], T]],
                   assign: str = "=") -> dict[str, T]:
    """Parses ``"key=value,key=value"`` (``assign`` is the ``=``): each key must be one of
    ``readers``, whose reader turns the value's text into a setting (it is given
    ``"NAME key"`` for errors), and may appear once."""
    settings: dict[str, T] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition(assign)
        key = key.strip()
        if not sep or key not in readers:
            raise fail(name, f"comma-separated key{assign}value with keys {', '.join(sorted(readers))}", item)
        if key in settings:  # which of the two was meant is the user's to say, not ours
            raise ConfigError(f"{name}: key {key!r} is given more than once, in {text!r}; give it once")
        settings[key] = readers[key](value, f"{name} {key}")
    return settings


def parse_visible_devices(text: str | None, physical: int) -> list[int]:
    """``ASCEND_RT_VISIBLE_DEVICES`` read as torch_npu reads it: the digits and commas up to the
    first other character; ids must ascend; ids at or past ``physical`` end the list.
    None (unset) shows every device."""
    if text is None:
        return list(range(physical))
    prefix = re.match(r"[\d,]*", text).group(0)
    ids: list[int] = []
    for part in prefix.split(","):
        if not part:
            break
        value = int(part)
        if ids and value <= ids[-1]:
            raise fail("ASCEND_RT_VISIBLE_DEVICES", "ascending device ids such as '0,1,2'", text)
        if value >= physical:
            break
        ids.append(value)
    if not ids:
        raise fail("ASCEND_RT_VISIBLE_DEVICES", f"at least one device id below {physical} (the simulated node's "
                   "NPUs; NPUSIM_DEVICE_COUNT sets how many)", text)
    return ids


class AllocConf(NamedTuple):
    """``PYTORCH_NPU_ALLOC_CONF``; see Note [Caching allocator] in csrc/memory.cpp."""

    max_split_size: int | None = None  # bytes; None: no limit
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: int = 0
    expandable_segments: bool = False  # accepted; every block is its own host allocation


# torch_npu keys that have no meaning for host memory: accepted so that scripts run, no effect.
ALLOC_CONF_IGNORED = ("base_addr_aligned_kb", "page_size", "pinned_mem_register", "segment_size_mb")


def parse_alloc_conf(text: str) -> AllocConf:
    """Parses ``"max_split_size_mb:128,garbage_collection_threshold:0.6"``."""
    name = "PYTORCH_NPU_ALLOC_CONF"

    def megabytes(value: str, label: str) -> int:
        mb = parse_int(value, label, 20, 1 << 30)  # CUDA's minimum split size is 20 MB
        return mb << 20

    def threshold(value: str, label: str) -> float:
        fraction = parse_float(value, label, 0.0)
        if not 0.0 < fraction < 1.0:
            raise fail(label, "a number in (0, 1)", value)
        return fraction

    def divisions(value: str, label: str) -> int:
        count = parse_int(value, label, 1, 64)
        if count & (count - 1):
            raise fail(label, "a power of two in [1, 64]", value)
        return count

    readers: dict[str, Callable[[str, str], object]] = {
        "max_split_size_mb": megabytes,
        "garbage_collection_threshold": threshold,
        "roundup_power2_divisions": divisions,
        "expandable_segments": parse_bool,
    }
    readers.update({key: (lambda value, label: value) for key in ALLOC_CONF_IGNORED})
    settings = parse_settings(text, name, readers, assign=":")
    return AllocConf(
        max_split_size=settings.get("max_split_size_mb"),  # type: ignore[arg-type]
        garbage_collection_threshold=settings.get("garbage_collection_threshold", 0.0),  # type: ignore[arg-type]
        roundup_power2_divisions=settings.get("roundup_power2_divisions", 0),  # type: ignore[arg-type]
        expandable_segments=settings.get("expandable_segments", False),  # type: ignore[arg-type]
    )


# ---- one typed accessor per variable ----------------------------------------------
# Bounds that the C++ core defines (the device count's) are handed in by the
# caller, which reads them from the core (runtime/acl.py): this module imports
# nothing of npusim.


def device_count(default: int, maximum: int) -> int:
    """``NPUSIM_DEVICE_COUNT``: the simulated node's physical NPUs (``default`` when unset)."""
    text = env("NPUSIM_DEVICE_COUNT")
    return parse_int(text, "NPUSIM_DEVICE_COUNT", 1, maximum) if text else default


def visible_devices(physical: int) -> list[int]:
    """``ASCEND_RT_VISIBLE_DEVICES`` over ``physical`` NPUs (see :func:`parse_visible_devices`)."""
    return parse_visible_devices(raw("ASCEND_RT_VISIBLE_DEVICES"), physical)


def launch_blocking() -> bool:
    """``NPUSIM_LAUNCH_BLOCKING``."""
    return parse_bool(env("NPUSIM_LAUNCH_BLOCKING"), "NPUSIM_LAUNCH_BLOCKING")


@functools.cache
def alloc_conf() -> AllocConf:
    """``PYTORCH_NPU_ALLOC_CONF``, parsed once per process (the allocator holds what it says)."""
    return parse_alloc_conf(env("PYTORCH_NPU_ALLOC_CONF"))


def memory_capacity() -> int | None:
    """``NPUSIM_MEMORY_CAPACITY`` in bytes; None when unset (the profile's HBM size applies)."""
    text = env("NPUSIM_MEMORY_CAPACITY")
    return parse_bytes(text, "NPUSIM_MEMORY_CAPACITY") if text else None


def device_capability() -> tuple[int, int] | None:
    """``TORCH_NPU_DEVICE_CAPABILITY`` as (major, minor); None when unset or empty."""
    text = raw("TORCH_NPU_DEVICE_CAPABILITY")
    if not text:
        return None
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if not match:
        raise fail("TORCH_NPU_DEVICE_CAPABILITY", "'major.minor' such as '8.0'", text)
    return int(match.group(1)), int(match.group(2))


def profile_name() -> str:
    """``NPUSIM_PROFILE``: the capability preset's name."""
    return env("NPUSIM_PROFILE")


def profile_overrides(readers: Mapping[str, Callable[[str, str], T]]) -> dict[str, T]:
    """``NPUSIM_PROFILE_OVERRIDES``, with one reader per flag (the profiles module's)."""
    return parse_settings(env("NPUSIM_PROFILE_OVERRIDES"), "NPUSIM_PROFILE_OVERRIDES", readers)


def timing(fields: tuple[str, ...], flags: tuple[str, ...] = ()) -> dict[str, float | bool] | None:
    """``NPUSIM_TIMING`` as {field: value >= 0, flag: bool} over the timing model's ``fields`` and
    ``flags``; None when unset."""
    text = env("NPUSIM_TIMING")
    if not text:
        return None
    return parse_timing(text, fields, flags)


def parse_timing(text: str, fields: tuple[str, ...], flags: tuple[str, ...] = ()) -> dict[str, float | bool]:
    """Parses ``"copy_gbps=2,launch_us=20,compute=1"``: numbers for ``fields``, booleans for ``flags``."""
    readers: dict[str, Callable[[str, str], float | bool]] = {
        key: lambda value, name: parse_float(value, name, low=0.0) for key in fields}
    readers.update({key: parse_bool for key in flags})
    return parse_settings(text, "NPUSIM_TIMING", readers)


FOREACH_COPY_MODES = ("aligned", "legacy")


def foreach_copy_mode() -> str:
    """``NPUSIM_FOREACH_COPY_MODE``: "aligned" or "legacy"."""
    return parse_choice(env("NPUSIM_FOREACH_COPY_MODE"), "NPUSIM_FOREACH_COPY_MODE", FOREACH_COPY_MODES)


def sanitizer() -> bool:
    """``NPUSIM_SANITIZER``."""
    return parse_bool(env("NPUSIM_SANITIZER"), "NPUSIM_SANITIZER")


def build_dir() -> str:
    """``NPUSIM_BUILD_DIR``; "" when unset (the install-time build or the user cache)."""
    return env("NPUSIM_BUILD_DIR")


def build_verbose() -> bool:
    """``NPUSIM_BUILD_VERBOSE``."""
    return parse_bool(env("NPUSIM_BUILD_VERBOSE"), "NPUSIM_BUILD_VERBOSE")
