"""``torch_npu.profiler.ProfilerActivity`` and ``supported_activities``, and their torch.profiler activities."""

import enum

import torch

__all__ = ["ProfilerActivity", "as_activity", "supported_activities", "to_torch"]


class ProfilerActivity(enum.Enum):
    """What to record: host ops (CPU) or the npu's device tasks (NPU, torch.profiler's PrivateUse1)."""

    CPU = "CPU"
    NPU = "NPU"

    def __str__(self) -> str:
        return f"ProfilerActivity.{self.name}"  # as profiler_info.json names them


def supported_activities() -> set[ProfilerActivity]:
    """Both activities: npusim's device tasks are always profiled."""
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


_TORCH = {ProfilerActivity.CPU: torch.profiler.ProfilerActivity.CPU,
          ProfilerActivity.NPU: torch.profiler.ProfilerActivity.PrivateUse1}


def as_activity(activity: object) -> ProfilerActivity:
    """The torch_npu activity of ``activity``, given as torch_npu's or as torch.profiler's CPU / PrivateUse1."""
    if isinstance(activity, ProfilerActivity):
        return activity
    for ours, theirs in _TORCH.items():
        if activity == theirs:
            return ours
    raise ValueError(f"torch_npu.profiler.profile: activity {activity!r} is not supported; expected "
                     "ProfilerActivity.CPU or ProfilerActivity.NPU")


def to_torch(activity: ProfilerActivity) -> torch.profiler.ProfilerActivity:
    """torch.profiler's activity for ``activity``."""
    return _TORCH[activity]
