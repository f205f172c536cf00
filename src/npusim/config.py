"""Every environment variable npusim reads, parsed in one place: the
``NPUSIM_*`` ones and those of torch_npu it honours
(``ASCEND_RT_VISIBLE_DEVICES``, ``PYTORCH_NPU_ALLOC_CONF`` or ``PYTORCH_ALLOC_CONF``).

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
    Variable("PYTORCH_ALLOC_CONF", "", "PyTorch's name for the same settings (torch_npu reads either, not both)"),
    Variable("NPUSIM_HOST_MEMORY_MARGIN", "", "host memory the allocator leaves free, e.g. 1GiB; 0: no check"),
    Variable("NPUSIM_MEMORY_CAPACITY", "", "per-device capacity such as 512MiB (default: the profile's HBM size)"),
    Variable("NPUSIM_PROFILE", "training_soc", "capability preset"),
    Variable("NPUSIM_PROFILE_OVERRIDES", "", "per-flag profile overrides, e.g. nd_out=0,batch=1"),
    Variable("NPUSIM_TIMING", "", "timing model (chip clock), e.g. launch_us=10,compute=1,host=measured (default off)"),
    Variable("NPUSIM_RANKS_PER_NODE", "",
             "ranks per node for pricing collectives (default: LOCAL_WORLD_SIZE, else the profile's)"),
    Variable("NPUSIM_FOREACH_COPY_MODE", "aligned", "aligned or legacy (the _foreach_copy_ kernel before the change)"),
    Variable("NPUSIM_COMPUTE", "real",
             "real, or plan: ops launch, allocate and take chip time but compute nothing (npusim plan)"),
    Variable("NPUSIM_PLANNED_WORLD", "0",
             "1: this process is the one rank of its world that runs (npusim plan); hccl groups move no data"),
    Variable("NPUSIM_LAUNCH_BLOCKING", "0", "1: every device task completes before its launch returns"),
    Variable("NPUSIM_SMALL_OPS_ON_THE_HOST", "1",
             "0: every compute op is a stream task, small ones on an idle stream too (checks the task path)"),
    Variable("NPUSIM_MAX_PENDING_LAUNCHES", "1024",
             "launches a stream may have pending before the next one waits (like CUDA's launch queue)"),
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
    # A comma inside brackets belongs to a list value (roundup_power2_divisions:[64:8,>:1]).
    for item in filter(None, (part.strip() for part in re.split(r",(?![^\[]*\])", text))):
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
    """``PYTORCH_NPU_ALLOC_CONF`` as the caching allocator holds it (see Note [Caching allocator] in
    ``csrc/runtime/device_allocator.cpp`` and Note [Allocator settings] below)."""

    max_split_size: int | None = None  # bytes; None: every block may be split
    max_non_split_rounding: int | None = None  # bytes; None: the large segment size
    garbage_collection_threshold: float = 0.0  # 0: off
    # Divisions per power-of-two interval of request sizes, from [1, 2) MiB up to >= 32 GiB; 0 or 1: off.
    roundup_power2_divisions: tuple[int, ...] = (0,) * 16
    large_segment_size: int = 20 << 20  # the segments requests between 1 and 10 MiB are carved from
    per_process_memory_fraction: float | None = None  # None: leave each device's fraction alone
    expandable_segments: bool = False  # accepted: segments are host allocations that never grow in place
    # The keys accepted without effect on host memory, as given (Note [Allocator settings]).
    without_effect: tuple[tuple[str, str], ...] = ()


# Note [Allocator settings]
# npusim accepts every key torch_npu's NPUAllocatorConfig accepts, with its value rules: the
# keys of PyTorch's AcceleratorAllocatorConfig that torch_npu supports and torch_npu's own. It
# reads the variable (or PYTORCH_ALLOC_CONF; both set is an error, as in torch_npu) when the
# allocator initialises, i.e. at the first allocation or allocator call of the process, not at
# import; torch.npu.memory._set_allocator_settings re-parses the keys torch_npu allows there at
# run time (the three keys PyTorch resets on every parse, max_split_size_mb,
# garbage_collection_threshold and roundup_power2_divisions, go back to their defaults unless
# given). Honoured: max_split_size_mb, max_non_split_rounding_mb, garbage_collection_threshold,
# roundup_power2_divisions, large_segment_size_mb, per_process_memory_fraction (every device's
# fraction, as set_per_process_memory_fraction). throw_on_npumalloc_oom is what npusim always
# does, whatever its value: an allocation over the device's share raises before any host memory
# is taken. Accepted without effect because they mean nothing for host memory: expandable_segments (a
# segment is one host allocation and does not grow in place), segment_size_mb (the expandable
# segments' size), page_size (NPU 1 GiB pages), base_addr_aligned_kb (the NPU's address
# alignment), multi_stream_lazy_reclaim (npusim releases cross-stream frees at every
# allocation at the cost of one load), release_lock_on_npumalloc (a host mmap is not worth
# dropping the lock for), and the pinned-memory keys (pinned_use_background_threads,
# pinned_max_round_threshold_mb, pinned_max_cached_size_mb, pin_memory_expandable_segments,
# pinned_mem_register, pinned_reserve_segment_size_mb): npusim's pinned host memory is not cached.

ALLOC_CONF_WITHOUT_EFFECT = (
    "throw_on_npumalloc_oom", "segment_size_mb", "page_size", "base_addr_aligned_kb", "multi_stream_lazy_reclaim",
    "release_lock_on_npumalloc", "pinned_use_background_threads", "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb", "pin_memory_expandable_segments", "pinned_mem_register",
    "pinned_reserve_segment_size_mb",
)
# What torch.npu.memory._set_allocator_settings accepts: torch_npu's setAllocatorSettings list, plus
# roundup_power2_divisions, which torch.cuda's accepts and torch_npu's own test_npu.py
# (test_allocator_settings) sets at run time; it is read per allocation, so a change applies to the next one.
ALLOC_CONF_RUNTIME_KEYS = frozenset((
    "expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb", "release_lock_on_npumalloc",
    "throw_on_npumalloc_oom", "per_process_memory_fraction", "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb", "roundup_power2_divisions",
))
_MIB = 1 << 20
_DIVISION_INTERVALS = 16  # [1, 2) MiB, [2, 4) MiB, ..., >= 32 GiB
# The allocator takes sizes in bytes as signed 64-bit integers: the most MiB a size key may give.
_MAX_SIZE_MB = ((1 << 63) - 1) // _MIB
_MAX_DIVISIONS = 1 << 62


def _true_false(value: str, label: str) -> bool:
    """torch_npu's booleans: exactly ``True`` or ``False``."""
    if value.strip() not in ("True", "False"):
        raise fail(label, "True or False", value)
    return value.strip() == "True"


def _size_t(value: str, label: str) -> int:
    if not value.strip().isdigit():
        raise fail(label, "a non-negative integer", value)
    return int(value)


def _divisions(value: str, label: str) -> tuple[int, ...]:
    """``4`` (every interval) or ``[64:8,256:4,>:1]`` (interval boundaries in MiB: divisions)."""
    def power_of_two(text: str, zero: bool) -> int:
        count = _size_t(text, label)
        if count & (count - 1) or (count == 0 and not zero):
            raise fail(label, "powers of two (0 turns an interval off)" if zero else "a power of two", value)
        if count > _MAX_DIVISIONS:  # the allocator takes signed 64-bit counts
            raise fail(label, f"powers of two up to {_MAX_DIVISIONS}", value)
        return count

    text = value.strip()
    if not text.startswith("["):
        return (power_of_two(text, zero=False),) * _DIVISION_INTERVALS
    if not text.endswith("]"):
        raise fail(label, "a list such as [64:8,256:4,>:1]", value)
    divisions = [0] * _DIVISION_INTERVALS
    first, last = True, 0
    for entry in filter(None, (part.strip() for part in text[1:-1].split(","))):
        boundary, sep, count_text = entry.partition(":")
        if not sep:
            raise fail(label, "boundary:divisions entries such as 64:8", value)
        count = power_of_two(count_text, zero=True)
        if boundary.strip() == ">":  # every interval above the last boundary
            divisions[last + 1:] = [count] * (_DIVISION_INTERVALS - last - 1)
            continue
        index = min(power_of_two(boundary, zero=False).bit_length() - 1, _DIVISION_INTERVALS - 1)
        if first:  # the first boundary also covers every interval below it
            divisions[:index] = [count] * index
            first = False
        divisions[index], last = count, index
    return tuple(divisions)


def _ranged_int(low: int, high: int) -> Callable[[str, str], int]:
    def read(value: str, label: str) -> int:
        number = _size_t(value, label)
        if not low <= number <= high:
            raise fail(label, f"an integer in [{low}, {high}]", value)
        return number
    return read


def _fraction(low_open: bool) -> Callable[[str, str], float]:
    def read(value: str, label: str) -> float:
        number = parse_float(value, label)
        if not (0.0 < number < 1.0 if low_open else 0.0 <= number <= 1.0):
            raise fail(label, "a number in (0, 1)" if low_open else "a number in [0, 1]", value)
        return number
    return read


def _page_size(value: str, label: str) -> str:
    if value.strip() != "1g":
        raise fail(label, "1g", value)
    return "1g"


_ALLOC_CONF_READERS: dict[str, Callable[[str, str], object]] = {
    "max_split_size_mb": _size_t,
    "max_non_split_rounding_mb": _size_t,
    "garbage_collection_threshold": _fraction(low_open=True),
    "roundup_power2_divisions": _divisions,
    "large_segment_size_mb": _size_t,
    "per_process_memory_fraction": _fraction(low_open=False),
    "expandable_segments": _true_false,
    "throw_on_npumalloc_oom": _true_false,
    "segment_size_mb": _ranged_int(20, 512),
    "page_size": _page_size,
    "base_addr_aligned_kb": _ranged_int(0, 16),
    "multi_stream_lazy_reclaim": _true_false,
    "release_lock_on_npumalloc": _true_false,
    "pinned_use_background_threads": _true_false,
    "pinned_max_round_threshold_mb": _size_t,
    "pinned_max_cached_size_mb": _size_t,
    "pin_memory_expandable_segments": _true_false,
    "pinned_mem_register": _true_false,
    "pinned_reserve_segment_size_mb": _size_t,
}


def parse_alloc_conf(text: str, base: AllocConf | None = None, name: str = "PYTORCH_NPU_ALLOC_CONF",
                     allowed: frozenset[str] | None = None) -> AllocConf:
    """Parses ``"max_split_size_mb:128,roundup_power2_divisions:[64:8,>:4]"`` with torch_npu's value rules
    (Note [Allocator settings]). ``base``: the settings the keys change (the defaults when None;
    max_split_size, garbage_collection_threshold and roundup_power2_divisions always start from
    their defaults, as PyTorch's parser resets them; per_process_memory_fraction is None unless given,
    since it is applied once). ``allowed``: the only keys accepted."""
    settings = parse_settings(text, name, _ALLOC_CONF_READERS, assign=":")
    if allowed is not None:
        refused = sorted(set(settings) - allowed)
        if refused:
            raise ConfigError(f"{name}: unsupported setting {refused[0]!r}; accepted: {', '.join(sorted(allowed))}")
    conf = (base or AllocConf())._replace(max_split_size=None, garbage_collection_threshold=0.0,
                                         roundup_power2_divisions=AllocConf().roundup_power2_divisions,
                                         per_process_memory_fraction=None)  # applied when given, then left alone
    # The large segment size first: the two split sizes may not be below it.
    if "large_segment_size_mb" in settings:
        mb = settings["large_segment_size_mb"]
        if not 10 < mb <= _MAX_SIZE_MB:
            raise fail(f"{name} large_segment_size_mb", f"more than 10 and at most {_MAX_SIZE_MB} (MiB)", str(mb))
        conf = conf._replace(large_segment_size=mb * _MIB, max_non_split_rounding=None)
    for key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        if key in settings:
            mb = settings[key]
            if mb * _MIB < conf.large_segment_size:
                raise fail(f"{name} {key}", f"at least {conf.large_segment_size // _MIB} (MiB, the large segment "
                           "size)", str(mb))
            if mb > _MAX_SIZE_MB:
                raise fail(f"{name} {key}", f"an integer in [{conf.large_segment_size // _MIB}, {_MAX_SIZE_MB}] "
                           "(MiB; the most whose byte count fits in 64 bits)", str(mb))
            field = "max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding"
            conf = conf._replace(**{field: mb * _MIB})
    for key, field in (("garbage_collection_threshold", "garbage_collection_threshold"),
                       ("roundup_power2_divisions", "roundup_power2_divisions"),
                       ("per_process_memory_fraction", "per_process_memory_fraction"),
                       ("expandable_segments", "expandable_segments")):
        if key in settings:
            conf = conf._replace(**{field: settings[key]})
    if conf.expandable_segments and (conf.max_split_size is not None or conf.garbage_collection_threshold > 0):
        raise ConfigError(f"{name}: max_split_size_mb or garbage_collection_threshold cannot be enabled with "
                          "expandable_segments (as in torch_npu); set expandable_segments:False")
    kept = dict(conf.without_effect)
    kept.update({key: str(settings[key]) for key in ALLOC_CONF_WITHOUT_EFFECT if key in settings})
    return conf._replace(without_effect=tuple(sorted(kept.items())))


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


def small_ops_on_the_host() -> bool:
    """``NPUSIM_SMALL_OPS_ON_THE_HOST``."""
    return parse_bool(env("NPUSIM_SMALL_OPS_ON_THE_HOST"), "NPUSIM_SMALL_OPS_ON_THE_HOST")


def plan_mode() -> bool:
    """``NPUSIM_COMPUTE`` is ``plan``: the device computes nothing (Note [Plan mode])."""
    return parse_choice(env("NPUSIM_COMPUTE"), "NPUSIM_COMPUTE", ("real", "plan")) == "plan"


def planned_world() -> bool:
    """``NPUSIM_PLANNED_WORLD``: one rank stands for its world (Note [A planned world]); plan mode only."""
    planned = parse_bool(env("NPUSIM_PLANNED_WORLD"), "NPUSIM_PLANNED_WORLD")
    if planned and not plan_mode():
        raise fail("NPUSIM_PLANNED_WORLD", "0 unless NPUSIM_COMPUTE=plan (a rank alone cannot compute a "
                   "collective's result)", env("NPUSIM_PLANNED_WORLD"))
    return planned


def max_pending_launches() -> int:
    """``NPUSIM_MAX_PENDING_LAUNCHES``: the launch queue's bound (Note [Bounded launch queue])."""
    return parse_int(env("NPUSIM_MAX_PENDING_LAUNCHES"), "NPUSIM_MAX_PENDING_LAUNCHES", low=1, high=1 << 30)


def alloc_conf() -> AllocConf:
    """``PYTORCH_NPU_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``; not both, as in torch_npu), read now: the
    allocator calls this when it initialises (Note [Allocator settings])."""
    npu, common = env("PYTORCH_NPU_ALLOC_CONF"), env("PYTORCH_ALLOC_CONF")
    if npu and common:
        raise ConfigError("PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF are both set; set only one of them")
    return parse_alloc_conf(npu or common, name="PYTORCH_NPU_ALLOC_CONF" if npu or not common else "PYTORCH_ALLOC_CONF")


def host_memory_margin() -> int | None:
    """``NPUSIM_HOST_MEMORY_MARGIN`` in bytes; None when unset (the core's default, Note [Host memory
    behind the device])."""
    text = env("NPUSIM_HOST_MEMORY_MARGIN")
    return parse_bytes(text, "NPUSIM_HOST_MEMORY_MARGIN") if text else None


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


def timing(fields: tuple[str, ...], flags: tuple[str, ...] = (),
           choices: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, float | bool | str] | None:
    """``NPUSIM_TIMING`` as {field: value >= 0, flag: bool, choice: one of its names} over the
    timing model's ``fields``, ``flags`` and ``choices``; None when unset."""
    text = env("NPUSIM_TIMING")
    if not text:
        return None
    return parse_timing(text, fields, flags, choices)


def parse_timing(text: str, fields: tuple[str, ...], flags: tuple[str, ...] = (),
                 choices: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, float | bool | str]:
    """Parses ``"copy_gbps=2,launch_us=20,compute=1,host=measured"``: numbers for ``fields``,
    booleans for ``flags``, one of its names for each of ``choices``."""
    readers: dict[str, Callable[[str, str], float | bool | str]] = {
        key: lambda value, name: parse_float(value, name, low=0.0) for key in fields}
    readers.update({key: parse_bool for key in flags})
    for key, names in (choices or {}).items():
        readers[key] = lambda value, name, names=names: parse_choice(value.strip(), name, names)
    return parse_settings(text, "NPUSIM_TIMING", readers)


def ranks_per_node() -> int | None:
    """``NPUSIM_RANKS_PER_NODE``, else the launcher's ``LOCAL_WORLD_SIZE``; None when neither is set."""
    for name in ("NPUSIM_RANKS_PER_NODE", "LOCAL_WORLD_SIZE"):
        text = env(name) if name in VARIABLES else os.environ.get(name, "").strip()
        if text:
            try:
                count = int(text.strip())
            except ValueError:
                raise fail(name, "a whole number of ranks >= 1", text) from None
            if count < 1:
                raise fail(name, "a whole number of ranks >= 1", text)
            return count
    return None


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
