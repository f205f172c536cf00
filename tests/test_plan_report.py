"""`python -m npusim report`: one step's memory and chip time per rank for an unmodified script (Note [The
step report]): the peaks equal torch.npu's own counters for the step, byte for byte, and fall where the
model puts them; phases in order; step time, Overlap split and MFU; the files; two ranks under torchrun."""

from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path

import pytest

from npusim.plan.analysis import choose_step, step_time
from npusim.plan.tracker import Mark
from npusim.testing.torchrun import run_bounded, torchrun_command

SCRIPT = Path(__file__).parent / "scripts" / "plan_mlp.py"
PHASES = ["forward", "backward", "optimizer"]
# plan_mlp.py: x (64 x 256) through Linear(256, 1024) and Linear(1024, 256): 2 matmuls forward, 3 backward
# (x needs no gradient), 2 * 64 * 256 * 1024 FLOPs each.
STEP_FLOPS = 5 * 2 * 64 * 256 * 1024


def _script_steps(stdout: str) -> dict[tuple[int, int], dict]:
    # Two ranks' lines share torchrun's stdout and may run into each other: each step is one flat object.
    lines = [json.loads(text) for text in re.findall(r'\{"rank": [^{}]*\}', stdout)]
    return {(line["rank"], line["step"]): line for line in lines}


def _report(out: Path, *flags: str) -> tuple[dict, dict, str]:
    result = run_bounded([sys.executable, "-m", "npusim", "report", "--out", str(out), *flags, "--", str(SCRIPT)],
                         300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((out / "report.json").read_text()), _script_steps(result.stdout), result.stdout + result.stderr


def _phase_order(report: dict) -> list[str]:
    phases: list[str] = []
    for sample in report["memory"]["timeline"]:
        if sample["kind"] == "step_end" and not phases:
            continue  # the window opens on the previous step's end
        if not phases or phases[-1] != sample["phase"]:
            phases.append(sample["phase"])
    return phases


def test_step_one_peaks_in_adamw_state_creation(tmp_path: Path):
    """Step 1: the peak is AdamW creating its state in the optimizer phase, equal to the script's
    max_memory_allocated / max_memory_reserved; phases in order; the FLOPs of the model; the files."""
    report, script, output = _report(tmp_path, "--step", "1")
    assert report["step"] == 1 and report["step_complete"] and report["steps_run"] == 3
    mem = report["memory"]
    assert mem["peak_allocated"] == script[0, 1]["max_allocated"]
    assert mem["peak_reserved"] == script[0, 1]["max_reserved"]
    assert mem["peak_allocated_at"]["phase"] == "optimizer"
    assert _phase_order(report) == PHASES
    assert list(mem["by_phase"]) == PHASES
    assert mem["by_phase"]["optimizer"]["peak_allocated"] == mem["peak_allocated"]
    # the forward's modules are named and in the order they ran
    forward = [s["module"] for s in mem["timeline"] if s["phase"] == "forward" and s["module"].startswith("MLP.")]
    assert forward == ["MLP.up", "MLP.act", "MLP.down"]
    backward = {s["module"] for s in mem["timeline"] if s["phase"] == "backward"}
    assert {"MLP.down", "MLP.up"} <= backward
    # the live allocations at the peak: AdamW's state (4 MiB-sized tensors of 1 MiB) among the largest
    largest = mem["largest_allocations"]
    assert largest and largest[0]["bytes"] >= largest[-1]["bytes"]
    assert sum(a["phase"] == "optimizer" for a in largest) >= 4
    t = report["time"]
    assert t["step_us"] > 0 and t["computing_us"] > 0
    assert t["computing_us"] + t["communication_not_overlapped_us"] + t["free_us"] == pytest.approx(t["step_us"],
                                                                                                    abs=0.01)
    assert report["flops"]["total"] == STEP_FLOPS and 0 < report["mfu"] <= 1
    assert "peak allocated" in output and "optimizer / -" in output


def test_last_step_by_default_and_the_files(tmp_path: Path):
    """By default the last step; its peak equals the script's after a reset at the step's top; the plot,
    the snapshot (torch.cuda._memory_viz reads it) and the chip-time trace are written."""
    from torch.cuda import _memory_viz

    report, script, _ = _report(tmp_path)
    assert report["step"] == 3
    assert report["memory"]["peak_allocated"] == script[0, 3]["max_allocated"]
    assert _phase_order(report) == PHASES
    assert report["flops"]["total"] == STEP_FLOPS and 0 < report["mfu"] <= 1
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    snapshot = pickle.loads((tmp_path / "snapshot.pickle").read_bytes())
    assert snapshot["segments"] and any(e["action"] == "alloc" for e in snapshot["device_traces"][0])
    assert "total_allocated: 8.1MiB" in _memory_viz.segsum(snapshot)  # the segments as step 3 ended
    assert sum(s["allocated_size"] for s in snapshot["segments"]) == report["memory"]["end_allocated"]
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in trace) and any(e.get("cat") == "cpu_op" for e in trace)


def test_two_ranks_under_torchrun(tmp_path: Path):
    """torchrun of 2 ranks (FSDP2 over hccl): each rank's report equals its own counters, the collectives
    are timed, and rank 0 prints one table of both ranks and writes their combined report."""
    target = ["-m", "npusim", "report", "--out", str(tmp_path), "--", str(SCRIPT)]
    result = run_bounded(torchrun_command(target, 2), 400)
    assert result.returncode == 0, result.stderr[-4000:]
    script = _script_steps(result.stdout)
    combined = json.loads((tmp_path / "report.json").read_text())
    assert combined["world_size"] == 2 and [r["rank"] for r in combined["ranks"]] == [0, 1]
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}" / "report.json").read_text())
        assert report["step"] == 3 and report["world_size"] == 2 and report["device"] == rank
        assert report["memory"]["peak_allocated"] == script[rank, 3]["max_allocated"]
        assert report["time"]["communication_us"] > 0 and report["time"]["step_us"] > 0
        assert 0 < report["mfu"] <= 1
        assert _phase_order(report) == PHASES
        assert (tmp_path / f"rank{rank}" / "memory.png").exists()
    assert result.stdout.count("rank  peak allocated") == 1  # one table, of both ranks
    table = result.stdout[result.stdout.index("rank  peak allocated"):]
    assert "\n   0 " in table and "\n   1 " in table


def _mark(seq: int, step: int, phase: str, kind: str = "module") -> Mark:
    return Mark(seq, step, phase, "-", float(seq), kind)


def test_choose_step():
    """--step N, else the last step that ended; a failed run's step; no optimizer: the whole run."""
    marks = [_mark(0, 1, "forward", "start"), _mark(1, 1, "optimizer", "step_end"), _mark(2, 2, "forward", "step"),
             _mark(3, 2, "optimizer", "step_end"), _mark(4, 3, "forward", "step")]
    ends = {1: 1, 2: 3}
    assert choose_step(marks, ends, None, False)[:4] == (2, 1, 3, True)
    assert choose_step(marks, ends, 1, False)[:4] == (1, -1, 1, True)
    assert choose_step(marks, ends, None, True)[:4] == (3, 3, -1, False)
    assert "not run" in choose_step(marks, ends, 9, False).note
    assert choose_step(marks[:1], {}, None, False)[:4] == (1, -1, -1, False)


def test_step_time_splits_the_span():
    """Computing + unhidden communication + free = the span; copies count in the span only."""
    tasks = [{"name": "mm", "cat": "kernel", "ts": 0.0, "dur": 10.0},
             {"name": "hccl all_gather on npu:0", "cat": "kernel", "ts": 5.0, "dur": 10.0},
             {"name": "copy", "cat": "gpu_memcpy", "ts": 20.0, "dur": 5.0}]
    t = step_time(tasks)
    assert t["step_us"] == 25.0 and t["computing_us"] == 10.0 and t["communication_not_overlapped_us"] == 5.0
    assert t["free_us"] == 10.0


OOM_SCRIPT = """
import torch, torch_npu
torch.npu.set_per_process_memory_fraction(64 * 2**20 / torch.npu.get_device_properties(0).total_memory)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).npu()
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randn(2048, 1024, device="npu")
for _ in range(2):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
"""


def test_a_job_that_does_not_fit(tmp_path: Path):
    """A script that runs out of its 64 MiB stops with the allocator's OutOfMemoryError, and the report of the
    step it stopped in names where (module and phase), the figures and the largest live allocations."""
    script = tmp_path / "oom.py"
    script.write_text(OOM_SCRIPT)
    out = tmp_path / "out"
    result = run_bounded([sys.executable, "-m", "npusim", "report", "--out", str(out), "--", str(script)], 300)
    assert result.returncode != 0 and "OutOfMemoryError" in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["error"].startswith("OutOfMemoryError") and not report["step_complete"]
    assert report["stopped_at"] == {"step": 1, "phase": "forward", "module": "Sequential.0"}
    sizes = [a["bytes"] for a in report["memory"]["largest_allocations"]]
    assert sizes[:2] == [16 * 2**20, 16 * 2**20]  # the input and the first weight
    assert report["memory"]["peak_allocated"] >= sum(sizes)
    assert "stopped in step 1 forward / Sequential.0: OutOfMemoryError" in result.stdout


def test_tracker_follows_steps_phases_and_recompute():
    """In process: two steps of a checkpointed model with two optimizers; each step's marks run forward,
    backward, optimizer; the two optimizers end one step; recomputed modules count in backward; the
    model's FLOPs counted per step (checkpoint's recomputation, which no dispatch mode sees, left out, as
    FlopCounterMode leaves it out) and the tracker leaves no hook behind."""
    import torch
    from torch.nn.modules import module as nn_module
    from torch.utils.checkpoint import checkpoint

    from npusim.plan.tracker import StepTracker

    torch.manual_seed(0)
    first, second = torch.nn.Linear(32, 64).npu(), torch.nn.Linear(64, 32).npu()
    optimizers = [torch.optim.AdamW(first.parameters()), torch.optim.SGD(second.parameters(), lr=0.1)]
    x = torch.randn(8, 32, device="npu")
    ended: list[int] = []
    tracker = StepTracker(on_step=lambda step, _: ended.append(step))
    hooks_before = len(nn_module._global_forward_pre_hooks)
    tracker.install()
    try:
        for _ in range(2):
            for optimizer in optimizers:
                optimizer.zero_grad()
            second(checkpoint(first, x, use_reentrant=False)).sum().backward()
            for optimizer in optimizers:
                optimizer.step()
    finally:
        tracker.uninstall()
    assert len(nn_module._global_forward_pre_hooks) == hooks_before
    assert ended == [1, 2] and sorted(tracker.step_ends) == [1, 2]
    for step in (1, 2):
        phases = []
        for mark in tracker.marks:
            if mark.step == step and (not phases or phases[-1] != mark.phase):
                phases.append(mark.phase)
        assert phases == PHASES
        recomputed = [m for m in tracker.marks if m.step == step and m.phase == "backward" and m.module == "Linear"]
        assert recomputed  # the checkpointed Linear runs again inside the backward
    # forward 2 matmuls, backward: second 2 (input and weight), first 1 (weight): 5 of 2*8*32*64
    assert tracker.flops[1] == tracker.flops[2] == {"float32": 5 * 2 * 8 * 32 * 64}


def test_no_flops_and_another_profile(tmp_path: Path):
    """--no-flops runs the job without the dispatch mode (no MFU; the backward begins at the first module
    gradient) with the same peaks; --profile picks the chip the report prices and names."""
    report, script, _ = _report(tmp_path, "--no-flops", "--profile", "inference_soc")
    assert report["mfu"] is None and report["flops"] is None
    assert report["profile"]["soc_name"] == "Ascend310P3"
    assert report["memory"]["peak_allocated"] == script[0, 3]["max_allocated"]
    assert _phase_order(report) == PHASES and report["time"]["step_us"] > 0
