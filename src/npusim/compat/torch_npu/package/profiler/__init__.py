"""``torch_npu.profiler``: torch_npu's profiler API over torch.profiler, writing torch_npu's output.

``profile`` (context manager, or start / step / stop), ``schedule``, ``tensorboard_trace_handler``,
``analyse``, ``ProfilerActivity`` (CPU, NPU), ``ProfilerAction``, ``_ExperimentalConfig`` (also
``ExperimentalConfig``) with ``ProfilerLevel``, ``AiCMetrics`` and ``ExportType``, and the ``supported_*``
queries. What it writes, and what it refuses: Note [What npusim's torch_npu.profiler writes] in
npusim/compat/ascend_profiler/__init__.py. Any other name (``dynamic_profile``, ...) raises
NotSimulatedError naming it.
"""

import sys
from typing import Any

from torch_npu.profiler.experimental_config import (
    AiCMetrics,
    ExperimentalConfig,
    ExportType,
    NotSimulatedProfilerConfigError,
    ProfilerLevel,
    _ExperimentalConfig,
    supported_ai_core_metrics,
    supported_export_type,
    supported_profiler_level,
)
from torch_npu.profiler.profiler import analyse, profile, tensorboard_trace_handler
from torch_npu.profiler.profiler_interface import ProfilerActivity, supported_activities
from torch_npu.profiler.scheduler import ProfilerAction
from torch_npu.profiler.scheduler import Schedule as schedule  # noqa: N813  (torch_npu's name)

from npusim.compat.torch_npu import NotSimulatedError

__all__ = ["AiCMetrics", "ExperimentalConfig", "ExportType", "NotSimulatedProfilerConfigError", "ProfilerAction",
           "ProfilerActivity", "ProfilerLevel", "_ExperimentalConfig", "analyse", "profile", "schedule",
           "supported_activities", "supported_ai_core_metrics", "supported_export_type", "supported_profiler_level",
           "tensorboard_trace_handler"]


def __getattr__(name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module 'torch_npu.profiler' has no attribute {name!r}")
    raise NotSimulatedError(f"torch_npu.profiler.{name} is not simulated by npusim (it provides {', '.join(__all__)})",
                            name=name, obj=sys.modules[__name__])
