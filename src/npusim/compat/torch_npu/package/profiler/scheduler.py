"""``torch_npu.profiler.schedule`` and ``ProfilerAction``: torch.profiler's, with torch_npu's signature.

torch_npu's ``Schedule(wait, active, warmup=0, repeat=0, skip_first=0)`` takes positional arguments and
resets an invalid one with a warning where torch.profiler.schedule asserts; the actions it returns are
torch.profiler's, so ``torch.profiler.profile`` (which ``torch_npu.profiler.profile`` is) runs it as is.
"""

import warnings

import torch

__all__ = ["ProfilerAction", "Schedule"]

ProfilerAction = torch.profiler.ProfilerAction


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
        return self._actions(step)

    def __repr__(self) -> str:
        return (f"schedule(wait={self.wait}, active={self.active}, warmup={self.warmup}, repeat={self.repeat}, "
                f"skip_first={self.skip_first})")
