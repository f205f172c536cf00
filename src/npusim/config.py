"""Every ``NPUSIM_*`` environment variable, parsed in one place.

Each variable is read through :func:`env` (the raw text) and one of the typed
readers below, so that a bad value always gives a :class:`ConfigError` that
names the variable and what it accepts. Lists of settings (``NPUSIM_TIMING``,
``NPUSIM_PROFILE_OVERRIDES``) share one ``key=value,key=value`` parser. The C++
core reads no environment itself: Python hands it the parsed values through
setters (see ``npusim._device.apply_settings``).

This module imports nothing of npusim or torch: it sits below every layer.
"""

from __future__ import annotations

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
    Variable("NPUSIM_DEVICE_COUNT", "", "simulated devices per process (an integer in [1, 16])"),
    Variable("NPUSIM_MEMORY_CAPACITY", "", "per-device capacity, a byte size such as 512MiB (default unlimited)"),
    Variable("NPUSIM_PROFILE", "training_soc", "capability preset"),
    Variable("NPUSIM_PROFILE_OVERRIDES", "", "per-flag profile overrides, e.g. nd_out=0,batch=1"),
    Variable("NPUSIM_TIMING", "", "timing model, e.g. copy_gbps=2,launch_us=20,link_gbps=1 (default off)"),
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


def parse_settings(text: str, name: str, readers: Mapping[str, Callable[[str, str], T]]) -> dict[str, T]:
    """Parses ``"key=value,key=value"``: each key must be one of ``readers``, whose
    reader turns the value's text into a setting (it is given ``"NAME key"`` for errors)."""
    settings: dict[str, T] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in readers:
            raise fail(name, f"comma-separated key=value with keys {', '.join(sorted(readers))}", item)
        settings[key] = readers[key](value, f"{name} {key}")
    return settings
