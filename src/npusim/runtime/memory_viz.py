"""Flame graphs and plots of npu memory snapshots: torch_npu's ``torch_npu.npu._memory_viz``.

npusim's snapshots (``torch.npu.memory._snapshot()``, ``_dump_snapshot``) are in the format
``torch.cuda._memory_viz`` reads, so this module is PyTorch's, with torch_npu's spelling of the
two flame graph functions (their formatter argument is ``format_flamegraph_func``).
``python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o out.html`` works on an npu
snapshot as well.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from torch.cuda._memory_viz import (  # noqa: F401  (the private helpers torch_npu's tests import)
    _block_extra,
    _block_extra_legacy,
    _frame_filter,
    _frame_fmt,
    _frames_fmt,
    _write_blocks,
    compare,
    format_flamegraph,
    profile_plot,
    segment_plot,
    segsum,
    trace,
    trace_plot,
)

__all__ = ["compare", "format_flamegraph", "memory", "profile_plot", "segment_plot", "segments", "segsum", "trace",
           "trace_plot"]


def _flamegraph(snapshot: dict[str, Any], per_segment: bool, format_flamegraph_func: Callable[[str], Any]) -> Any:
    if "segments" not in snapshot:
        raise ValueError("npu memory flame graph: expected a snapshot of torch.npu.memory._snapshot() (a dict with "
                         f"'segments'), got keys {sorted(snapshot)}")
    lines = io.StringIO()
    for seg in snapshot["segments"]:
        prefix = f"stream_{seg['stream']}" + (f";seg_{seg['address']}" if per_segment else "")
        _write_blocks(lines, prefix, seg["blocks"])
    return format_flamegraph_func(lines.getvalue())


def segments(snapshot: dict[str, Any], format_flamegraph_func: Callable[[str], Any] = format_flamegraph) -> Any:
    """A flame graph of the snapshot's blocks, grouped by stream and segment."""
    return _flamegraph(snapshot, True, format_flamegraph_func)


def memory(snapshot: dict[str, Any], format_flamegraph_func: Callable[[str], Any] = format_flamegraph) -> Any:
    """A flame graph of the snapshot's blocks, grouped by stream."""
    return _flamegraph(snapshot, False, format_flamegraph_func)
