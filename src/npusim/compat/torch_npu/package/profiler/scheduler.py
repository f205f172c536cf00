"""``torch_npu.profiler.schedule`` and ``ProfilerAction``: torch.profiler's steps, with torch_npu's signature.

torch_npu's ``Schedule(wait, active, warmup=0, repeat=0, skip_first=0)`` takes positional arguments and
resets an invalid one with a warning where torch.profiler.schedule asserts. Its actions are torch_npu's own
``ProfilerAction`` (an enum of torch.profiler's four names and values), which ``torch_npu.profiler.profile``
turns into torch.profiler's by name (:func:`_to_torch_action`) for the ``torch.profiler.profile`` it is.
"""

import enum
import warnings
from collections.abc import Callable

import torch

__all__ = ["ProfilerAction", "Schedule"]

class ProfilerAction(enum.Enum):
    """torch_npu's profiler actions (torch_npu.profiler.scheduler's own class, torch.profiler's names)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def _to_torch_action(schedule: Callable[[int], object]) -> Callable[[int], torch.profiler.ProfilerAction]:
    """``schedule`` giving torch.profiler's actions: torch_npu's by name, torch.profiler's own as they are."""

    def actions(step: int) -> torch.profiler.ProfilerAction:
        action = schedule(step)
        return torch.profiler.ProfilerAction[action.name] if isinstance(action, ProfilerAction) else action

    return actions


def _checked(name: str, value: object, minimum: int, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    warnings.warn(f"torch_npu.profiler.schedule: invalid parameter {name}={value!r}, reset it to {default}.",
                  stacklevel=3)
    return default


class Schedule:
    """Skips ``skip_first`` steps, then cycles wait / warmup / active steps, ``repeat`` times (0: until the
    profiler stops); the last active step of a cycle is RECORD_AND_SAVE, when on_trace_ready runs."""

    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0) -> None:
        self.wait = _checked("wait", wait, 0, 0)
        self.active = _checked("active", active, 1, 1)
        self.warmup = _checked("warmup", warmup, 0, 0)
        self.repeat = _checked("repeat", repeat, 0, 0)
        self.skip_first = _checked("skip_first", skip_first, 0, 0)
        self._actions = torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                                                repeat=self.repeat, skip_first=self.skip_first)

    def __call__(self, step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError(f"torch_npu.profiler.schedule: invalid parameter step={step}, which must be >= 0")
        return ProfilerAction[self._actions(step).name]

    def __repr__(self) -> str:
        return (f"schedule(wait={self.wait}, active={self.active}, warmup={self.warmup}, repeat={self.repeat}, "
                f"skip_first={self.skip_first})")
