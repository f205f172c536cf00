"""``python -m npusim timeline``: one FSDP2 step per kernel mode drawn from the profiler's device
activities, with compute lanes under the chip's cost model, and its summary figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npusim.tools import cli
from npusim.tools.timeline import COMPUTE, Bar, exposed_us


def test_exposed_time_is_busy_time_nothing_covers():
    """Exposed communication: collective time minus what compute overlaps, overlaps merged."""
    busy = [Bar(0, 10, "a"), Bar(5, 10, "b"), Bar(30, 5, "c")]  # 0-15 and 30-35
    cover = [Bar(2, 3, "x"), Bar(12, 20, "y")]  # 2-5 and 12-32
    assert exposed_us(busy, cover) == 20 - 3 - 3 - 2
    assert exposed_us(busy, []) == 20 and exposed_us([], cover) == 0


@pytest.mark.asynchronous
def test_timeline_has_compute_lanes_per_mode(tmp_path: Path):
    """A small model's step on 2 ranks under the 910B2 cost model: per mode a trace, the picture and a
    summary; compute ops are on the default stream's lane, forward and backward, and the collectives
    on theirs; legacy mode's host waits in _foreach_copy_ longer than aligned mode's."""
    code = cli.main(["timeline", "--out", str(tmp_path), "--dim", "32", "--blocks", "1", "--timeout", "180"])
    assert code == 0
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "timeline-summary.json").read_text())
    assert list(summary) == ["aligned", "legacy", "legacy + patch"]
    for figures in summary.values():
        assert 0 < figures["compute_ms"] < figures["step_ms"]
        assert 0 <= figures["exposed_communication_ms"] <= figures["collectives_ms"]
    assert summary["legacy"]["host_in_foreach_copy_ms"] > summary["aligned"]["host_in_foreach_copy_ms"]
    trace = json.loads((tmp_path / "timeline-aligned.json").read_text())["traceEvents"]
    compute = [e for e in trace if e.get("cat") == "kernel" and e.get("pid") == 0 and e.get("tid") == 0]
    assert any(e["name"] == "aten::mm" for e in compute), COMPUTE
