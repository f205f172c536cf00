"""``torch_npu.profiler``: torch_npu's profiler API over torch.profiler, writing torch_npu's output.

``profile`` (context manager, or start / step / stop), ``schedule``, ``tensorboard_trace_handler``,
``analyse``, ``ProfilerActivity`` (CPU, NPU), ``ProfilerAction``, ``_ExperimentalConfig`` (also
``ExperimentalConfig``) with ``ProfilerLevel``, ``AiCMetrics`` and ``ExportType``, and the ``supported_*``
queries. What it writes, and what it refuses: Note [What npusim's torch_npu.profiler writes] in
npusim/compat/ascend_profiler/__init__.py.
"""

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

__all__ = ["AiCMetrics", "ExperimentalConfig", "ExportType", "NotSimulatedProfilerConfigError", "ProfilerAction",
           "ProfilerActivity", "ProfilerLevel", "_ExperimentalConfig", "analyse", "profile", "schedule",
           "supported_activities", "supported_ai_core_metrics", "supported_export_type", "supported_profiler_level",
           "tensorboard_trace_handler"]
