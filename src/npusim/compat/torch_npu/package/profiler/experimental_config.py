"""``torch_npu.profiler._ExperimentalConfig`` with ``ProfilerLevel``, ``AiCMetrics`` and ``ExportType``.

The values are torch_npu's strings (they land in profiler_info.json). What npusim cannot collect,
because it comes from the chip's counters or CANN's tools, is refused by name when asked for (Note
[What npusim's torch_npu.profiler writes] in npusim/compat/ascend_profiler/__init__.py); an invalid value
is reset with a warning, as torch_npu does.
"""

import warnings
from typing import Any

__all__ = ["AiCMetrics", "ExperimentalConfig", "ExportType", "NotSimulatedProfilerConfigError", "ProfilerLevel",
           "_ExperimentalConfig", "supported_ai_core_metrics", "supported_export_type", "supported_profiler_level"]


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Text = "text"
    Db = "db"


class NotSimulatedProfilerConfigError(NotImplementedError):
    """A torch_npu.profiler setting whose data npusim cannot produce."""


LEVELS = (ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2, ProfilerLevel.Level_none)
_METRIC_NAMES = {value: f"AiCMetrics.{name}" for name, value in vars(AiCMetrics).items() if not name.startswith("_")}


def supported_profiler_level() -> set[str]:
    """torch_npu's collection levels (Level_none is accepted too, as torch_npu accepts it)."""
    return {ProfilerLevel.Level0, ProfilerLevel.Level1, ProfilerLevel.Level2}


def supported_ai_core_metrics() -> set[str]:
    """The AI Core metrics npusim collects: none (a simulator has no PMU counters)."""
    return set()


def supported_export_type() -> set[str]:
    """The export types npusim writes: text."""
    return {ExportType.Text}


def _refuse(asked: str, why: str, supported: str) -> None:
    raise NotSimulatedProfilerConfigError(
        f"torch_npu.profiler._ExperimentalConfig({asked}) is not simulated by npusim: {why}; supported: {supported}")


class _ExperimentalConfig:
    """torch_npu's experimental profiler settings; npusim keeps them for profiler_info.json and refuses what it
    cannot collect."""

    def __init__(self, profiler_level: str = ProfilerLevel.Level0, aic_metrics: str | None = None,
                 l2_cache: bool = False, msprof_tx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False, gc_detect_threshold: float | None = None,
                 export_type: str | list[str] = ExportType.Text, host_sys: list[str] | None = None,
                 mstx_domain_include: list[str] | None = None, mstx_domain_exclude: list[str] | None = None,
                 sys_io: bool = False, sys_interconnection: bool = False, mstx: bool = False) -> None:
        if profiler_level not in LEVELS:
            warnings.warn(f"torch_npu.profiler: invalid parameter profiler_level={profiler_level!r}, reset it to "
                          "ProfilerLevel.Level0.", stacklevel=2)
            profiler_level = ProfilerLevel.Level0
        self._profiler_level = profiler_level
        # torch_npu turns on PipeUtilization by itself from Level1 on; npusim reads no counters unless asked,
        # and asked it refuses.
        if aic_metrics not in (None, AiCMetrics.AiCoreNone):
            _refuse(f"aic_metrics={_METRIC_NAMES.get(aic_metrics, repr(aic_metrics))}",
                    "AI Core PMU metrics are read from the chip's performance counters, which a simulator has not",
                    "aic_metrics=AiCMetrics.AiCoreNone (kernel_details.csv without PMU columns)")
        self._aic_metrics = AiCMetrics.AiCoreNone
        for name, given, why in (
                ("l2_cache", l2_cache, "L2 cache hit rates come from the chip's counters"),
                ("msprof_tx", msprof_tx, "msprof_tx ranges are CANN's mstx, which npusim does not run; use "
                                         "torch.profiler.record_function"),
                ("mstx", mstx, "mstx ranges are CANN's, which npusim does not run; use torch.profiler.record_function"),
                ("record_op_args", record_op_args, "operator arguments are dumped by CANN for its tuning tools"),
                ("sys_io", sys_io, "NIC and RoCE counters are the server's"),
                ("sys_interconnection", sys_interconnection, "HCCS and PCIe counters are the server's"),
                ("host_sys", host_sys, "host system sampling is msprof's"),
                ("gc_detect_threshold", gc_detect_threshold, "the Python GC lane is not recorded")):
            if given is not None and given is not False and given != []:
                _refuse(f"{name}={given!r}", why, f"{name} left at its default")
        types = [export_type] if isinstance(export_type, str) else list(export_type)
        if ExportType.Db in types:
            _refuse("export_type=ExportType.Db", "the db export (ascend_pytorch_profiler.db, analysis.db) is built "
                    "by CANN's msprof", "export_type=ExportType.Text (trace_view.json and the csv / json views)")
        if any(t != ExportType.Text for t in types):
            warnings.warn(f"torch_npu.profiler: invalid parameter export_type={export_type!r}, reset it to text.",
                          stacklevel=2)
        self._export_type = [ExportType.Text]
        if op_attr:
            warnings.warn("torch_npu.profiler: op_attr switch is invalid with export type set as text.", stacklevel=2)
        self._op_attr = False
        self._data_simplification = bool(data_simplification)
        self._l2_cache = self._msprof_tx = self.record_op_args = self._sys_io = self._sys_interconnection = False
        self._mstx_domain_include = list(mstx_domain_include or [])
        self._mstx_domain_exclude = list(mstx_domain_exclude or [])

    @property
    def export_type(self) -> list[str]:
        return self._export_type

    @property
    def with_gc(self) -> bool:
        return False

    def to_info(self) -> dict[str, Any]:
        """The experimental_config section of profiler_info.json, in torch_npu's keys."""
        return {"_profiler_level": self._profiler_level, "_aic_metrics": self._aic_metrics, "_l2_cache": self._l2_cache,
                "_msprof_tx": self._msprof_tx, "_op_attr": self._op_attr,
                "_data_simplification": self._data_simplification, "record_op_args": self.record_op_args,
                "_export_type": self._export_type, "_sys_io": self._sys_io,
                "_sys_interconnection": self._sys_interconnection}


ExperimentalConfig = _ExperimentalConfig
