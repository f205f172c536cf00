"""``python -m npusim timeline``: one FSDP2 step per kernel mode drawn from the profiler's device
activities, with compute lanes under the chip's cost model, and its summary figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npusim.runtime.profiles import make_profile
from npusim.tools import cli
from npusim.tools.timeline import COMPUTE, Bar, exposed_us


def test_exposed_time_is_busy_time_nothing_covers():
    """Exposed communication: collective time minus what compute overlaps, overlaps merged."""
    busy = [Bar(0, 10, "a"), Bar(5, 10, "b"), Bar(30, 5, "c")]  # 0-15 and 30-35
    cover = [Bar(2, 3, "x"), Bar(12, 20, "y")]  # 2-5 and 12-32
    assert exposed_us(busy, cover) == 20 - 3 - 3 - 2
    assert exposed_us(busy, []) == 20 and exposed_us([], cover) == 0


def _host_calls_and_their_copies(trace: list[dict]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Each host ``_foreach_copy_`` range of device 0's rank paired, in order, with the copy task it
    launched, both as (start, end) in microseconds."""
    host = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace
                  if str(e.get("name", "")).startswith("npusim::foreach_copy["))
    copies = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace
                    if e.get("cat") == "kernel" and e.get("pid") == 0 and e.get("name") == "foreach_copy")
    assert len(host) == len(copies) > 0, (host, copies)
    return list(zip(host, copies, strict=True))


@pytest.mark.asynchronous
def test_timeline_has_compute_lanes_per_mode(tmp_path: Path):
    """A small model's step on 2 ranks under the 910B2 cost model, in chip time: per mode a trace, the
    picture and a summary; compute ops are on the default stream's lane, forward and backward, and the
    collectives on theirs; legacy mode's host waits in each _foreach_copy_ until its copy has finished
    (its range ends, on the chip's axis, where the copy ends), aligned mode's host only pays its launch.
    Nothing is slowed down to stay above this machine's noise: the chip clock has none. A 200 us launch
    latency per task makes this tiny model's device slower than its host, as a real model's is, so that
    the device has a backlog for legacy mode to wait for."""
    code = cli.main(["timeline", "--out", str(tmp_path), "--dim", "32", "--blocks", "1", "--launch-us", "200",
                     "--timeout", "180"])
    assert code == 0
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "timeline-summary.json").read_text())
    assert list(summary) == ["aligned", "legacy", "legacy + patch"]
    for figures in summary.values():
        assert 0 < figures["compute_ms"] < figures["step_ms"]
        assert 0 <= figures["exposed_communication_ms"] <= figures["collectives_ms"]
        assert figures["overlap_communication_not_overlapped_ms"] <= figures["overlap_communication_ms"]
        assert figures["overlap_free_ms"] >= 0
    assert summary["legacy"]["host_in_foreach_copy_ms"] > summary["aligned"]["host_in_foreach_copy_ms"]
    traces = {config: json.loads((tmp_path / f"timeline-{config}.json").read_text())["traceEvents"]
              for config in ("aligned", "legacy")}
    rounding_us = 0.002  # the trace's microseconds carry three decimals
    legacy = _host_calls_and_their_copies(traces["legacy"])
    aligned = _host_calls_and_their_copies(traces["aligned"])
    for (_, host_end), (_, copy_end) in legacy:
        assert host_end >= copy_end - rounding_us, "legacy _foreach_copy_ returned before its copy finished"
    launch_us = make_profile("training_soc").host_launch_us
    for ((host_start, host_end), _), ((legacy_start, legacy_end), _) in zip(aligned, legacy, strict=True):
        assert host_end - host_start <= launch_us + rounding_us, "aligned _foreach_copy_ waited for its copy"
        assert host_end - host_start < legacy_end - legacy_start
    compute = [e for e in traces["aligned"] if e.get("cat") == "kernel" and e.get("pid") == 0 and e.get("tid") == 0]
    assert any(e["name"] == "aten::mm" for e in compute), COMPUTE
