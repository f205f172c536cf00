"""Runs a job under the step report and writes it: the code ``npusim report`` and ``npusim plan`` run.

Note [The step report]
~~~~~~~~~~~~~~~~~~~~~~
``python -m npusim report -- script.py ARGS`` runs the script as ``npusim run`` does, with the chip
clock on (Note [Chip clock]; the timing model of ``--timing`` / ``NPUSIM_TIMING``, else the compute cost
model with copies at half the chip's HBM bandwidth), and reports one step of each rank:

- Steps. A step ends when an ``optimizer.step`` returns (PyTorch's global optimizer post hook; several
  optimizers stepping one after another end one step) and the next begins with the next op or module
  call. ``--step N`` picks one (1-based); by default the last that ended, or the one a failed run (an
  OOM) stopped in, or, with no optimizer, the whole run. Step N's window runs from step N-1's end (the
  job's start for step 1, so the model's own allocation counts in step 1) to its own end.
- Phases and modules (plan/tracker.py): forward until the first op inside autograd's graph task (or the
  first gradient hook of a module's output), backward until the first ``optimizer.step`` begins
  (gradient clipping and unscaling count as backward), optimizer to the step's end; the module is the
  innermost module whose forward runs, in backward the one whose output gradient arrived last.
- Memory: torch.profiler records with ``profile_memory=True`` for the whole job. Each npu allocation
  and free is a memory event carrying the allocator's allocated and reserved bytes after it (the
  figures ``memory_stats`` reads), so the peak allocated / reserved of the step's window is the largest
  of them (with the figure the window starts at): ``torch.npu.max_memory_allocated()`` after
  ``torch.npu.reset_peak_memory_stats()`` at the window's start, byte for byte, without the report
  resetting anything. Each event falls between two of the tracker's marks (zero-length profiler
  ranges) on the profiler's clock, which give its phase and module. The largest allocations are the
  blocks live at the peak (the events replayed up to it; block sizes as the allocator counts them), each
  with the op, phase and module that allocated it. snapshot.pickle is ``torch.npu.memory._snapshot()``:
  the segments as the chosen step ended (the end of the job for an unfinished step) and the allocation
  history of the whole job (``_record_memory_history``), which ``torch.cuda._memory_viz`` reads.
- Time: the step's device tasks are those the host launched inside its window (and the collectives
  that start among them); the step time is their span on the chip clock, from the first task's start to
  the last one's end, split as the Overlap Analysis splits it (Note [Overlap Analysis figures]):
  computing + communication not overlapped + free = step time (time in copies alone is free).
  ``host_step_us`` is the host's chip clock over the window.
- MFU: the FLOPs of every op the step dispatches (torch.utils.flop_counter's formulas, those the cost
  model prices), each over the profile's peak cube rate for its dtype: sum(FLOPs / peak) / step time,
  the share of the step the cube units would need at their peak. The model's FLOPs: torch.utils.checkpoint
  recomputes below every dispatch mode (FlopCounterMode misses it too), and ops on DTensors are left out.
- Ranks: every rank writes its own files (``OUT/rank<r>/`` when the world has more than one rank);
  rank 0 waits up to ``--wait`` seconds for the others' report.json, prints the table of all it found
  and writes ``OUT/report.json`` with every rank's figures.

Limits: a script that runs torch.profiler itself cannot run under the report (one profiler at a time);
a GradScaler step skipped for inf gradients ends no step; the dispatch mode that counts FLOPs stays
active for the whole job (``--no-flops`` leaves it out, and MFU with it, but keeps the backward's start
at its first module gradient).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from npusim.plan import analysis, render
from npusim.plan.render import lead_rank
from npusim.plan.tracker import StepTracker

__all__ = ["ReportOptions", "run_with_report"]

FORMAT_VERSION = 1


class ReportOptions(NamedTuple):
    out: str = "npusim-report"
    step: int | None = None
    timing: str | None = None  # NPUSIM_TIMING's syntax; None: NPUSIM_TIMING, else the default below
    flops: bool = True
    wait_s: float = 120.0  # how long rank 0 waits for the other ranks' reports
    command: tuple[str, ...] = ()  # what ran, for the report's header
    mode: str = "report"  # "plan" when plan mode runs it
    # The ranks that run and write a report (None: every rank of WORLD_SIZE). Plan mode, where one rank
    # stands for the world, names the ranks it runs, so rank 0 waits for those only.
    ranks: tuple[int, ...] | None = None


def _rank_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def run_id() -> str:
    """What the ranks of one job share and no other job does: torchrun's run id, else its rendezvous
    address, else this process."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return os.environ["TORCHELASTIC_RUN_ID"]
    if os.environ.get("MASTER_PORT"):
        return f"{os.environ.get('MASTER_ADDR', '')}:{os.environ['MASTER_PORT']}"
    return f"{socket.gethostname()}:{os.getpid()}"


def _say(rank: int, text: str, options: ReportOptions) -> None:
    if rank == lead_rank(options):
        print(f"npusim {options.mode}: {text}", file=sys.stderr, flush=True)


def start_chip_clock(spec: str | None) -> Any:
    """Turns the chip clock on: ``spec`` (NPUSIM_TIMING's syntax), else NPUSIM_TIMING, else the compute
    cost model with copies at half the profile's HBM bandwidth. Written back to NPUSIM_TIMING so the
    job's child processes run on the same clock."""
    from npusim.runtime import timing
    from npusim.runtime.profiles import get_profile

    text = spec if spec is not None else os.environ.get("NPUSIM_TIMING", "")
    model = timing.parse(text) if text.strip() else timing.TimingModel(copy_gbps=get_profile().hbm_gbps / 2,
                                                                         compute=True)
    if not model.enabled:
        model = model._replace(compute=True)
    os.environ["NPUSIM_TIMING"] = ",".join(
        f"{key}={int(value) if isinstance(value, bool) else value}" for key, value in model._asdict().items())
    return timing.set(**model._asdict())


def run_with_report(job: Callable[[], int], options: ReportOptions) -> int:
    """Runs ``job`` (returns an exit status) under the report, writes the report; the job's status."""
    from torch.profiler import ProfilerActivity, profile

    from npusim.runtime import acl, chip_clock
    from npusim.runtime.profiles import get_profile

    rank, world = _rank_world()
    (_out_dir(options, rank, world) / "report.json").unlink(missing_ok=True)  # a report of an earlier run
    model = start_chip_clock(options.timing)
    torch.npu.memory._record_memory_history("all")
    segments_at_end: dict[int, list[dict[str, Any]]] = {}

    def on_step(step: int, host_us: float) -> None:
        if options.step is None or options.step == step:
            segments_at_end[step] = acl.memory_snapshot()
            for older in [s for s in segments_at_end if s != step and s != options.step]:
                del segments_at_end[older]
        _say(rank, f"step {step} done (host at {host_us / 1e3:.3f} ms chip time, "
                   f"{torch.npu.memory_allocated() / 2**20:.1f} MiB allocated)", options)

    tracker = StepTracker(on_step=on_step, count_flops=options.flops)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True)
    _say(rank, f"running {' '.join(options.command)} with the chip clock on ({model}); world {world}", options)
    prof.start()
    tracker.install()
    failure: BaseException | None = None
    code = 1
    try:
        code = job()
    except BaseException as error:  # noqa: BLE001  (reported, then raised again)
        failure = error
    finally:
        tracker.uninstall()
    try:
        torch.npu.synchronize()
    except Exception:  # noqa: BLE001  (a failed device: the report shows what ran)
        pass
    prof.stop()
    try:
        report = _finish(prof, tracker, options, rank, world, segments_at_end, failure, code, model, get_profile(),
                         chip_clock)
        render.print_table(report, options, rank)
    except Exception as error:  # noqa: BLE001
        print(f"npusim report: rank {rank}: could not write the report: {type(error).__name__}: {error}",
              file=sys.stderr)
        if failure is None:
            raise
    finally:
        torch.npu.memory._record_memory_history(None)
    if failure is not None:
        raise failure
    return code


def _out_dir(options: ReportOptions, rank: int, world: int) -> Path:
    out = Path(options.out)
    return out / f"rank{rank}" if world > 1 else out


def _finish(prof: Any, tracker: StepTracker, options: ReportOptions, rank: int, world: int,
            segments_at_end: dict[int, list[dict[str, Any]]], failure: BaseException | None, code: int,
            model: Any, profile: Any, chip_clock: Any) -> dict[str, Any]:
    from npusim.runtime import acl, cost_model

    out = _out_dir(options, rank, world)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
    events = trace.get("traceEvents", [])
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    anchor_ns, anchor_us = acl.profiler_axis_anchor()
    chip_clock.refresh()

    def device_to_chip(ts_us: float) -> float:
        return (base_ns + round(ts_us * 1e3) - anchor_ns) / 1e3 + anchor_us

    def host_to_chip(ts_us: float) -> float:
        return (chip_clock.host_ns_to_chip_ns(base_ns + round(ts_us * 1e3)) - anchor_ns) / 1e3 + anchor_us

    device = torch.npu.current_device()
    choice = analysis.choose_step(tracker.marks, tracker.step_ends, options.step, failure is not None)
    figures = analysis.analyse(events, tracker.marks, choice, device, host_to_chip, device_to_chip)

    flops = tracker.flops.get(choice.step, {}) if options.flops else {}
    step_s = figures["time"]["step_us"] / 1e6
    cube_s = sum(count / (cost_model.peak_tflops(profile, "cube", getattr(torch, dtype))[1] * 1e12)
                 for dtype, count in flops.items())
    mfu = cube_s / step_s if step_s > 0 and options.flops else None

    files = {"report": "report.json", "memory_plot": "memory.png", "snapshot": "snapshot.pickle",
             "trace": "trace.json"}
    report: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "mode": options.mode,
        "rank": rank,
        "world_size": world,
        "run_id": run_id(),
        "hostname": socket.gethostname(),
        "device": device,
        "command": list(options.command),
        "exit_status": code if failure is None else None,
        "error": _error_line(failure),
        "tracker_error": tracker.broken,
        "stopped_at": ({"step": tracker.step, "phase": tracker.phase, "module": tracker._current_module()}
                       if failure is not None else None),
        "values_computed": acl.device_computes(),  # False in plan mode (Note [Plan mode])
        "profile": {"name": profile.name, "soc_name": profile.soc_name, "cube_tflops": profile.cube_tflops,
                    "cube_fp32_tflops": profile.cube_fp32_tflops,
                    # the device's, which NPUSIM_MEMORY_CAPACITY may set below the profile's HBM
                    "total_memory": torch.npu.get_device_properties(device).total_memory},
        "timing": model._asdict(),
        "steps_run": tracker.steps_done,
        "step": choice.step,
        "step_complete": choice.complete,
        "step_note": choice.note,
        "memory": {key: figures[key] for key in (
            "peak_allocated", "peak_allocated_at", "peak_reserved", "peak_reserved_at", "end_allocated",
            "end_reserved", "by_phase", "by_module", "largest_allocations", "live_at_peak", "timeline")},
        "time": figures["time"],
        "flops": {"total": sum(flops.values()), "by_dtype": flops} if options.flops else None,
        "mfu": mfu,
        "device_tasks": figures["device_tasks"],
        "files": files,
    }
    # the memory plot, the snapshot and the step's trace on the chip clock
    render.plot_memory(out / files["memory_plot"], report, figures["series"], figures["phase_spans"])
    snapshot = torch.npu.memory._snapshot()
    if choice.step in segments_at_end:
        snapshot["segments"] = [s for s in segments_at_end[choice.step]]
    with open(out / files["snapshot"], "wb") as handle:
        pickle.dump(snapshot, handle)
    _write_step_trace(out / files["trace"], trace, figures, chip_clock, choice)
    _write_json(out / files["report"], report)
    report["out"] = str(out)
    return report


def _error_line(failure: BaseException | None) -> str | None:
    if failure is None:
        return None
    text = str(failure).strip()
    return f"{type(failure).__name__}: {text.splitlines()[0] if text else ''}"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)  # whole or absent for a rank reading it


def _write_step_trace(path: Path, trace: dict[str, Any], figures: dict[str, Any], chip_clock: Any,
                      choice: analysis.StepChoice) -> None:
    """The step's events of the profiler's Chrome trace, host ones on the chip clock (map_chrome_trace)."""
    mapped = chip_clock.map_chrome_trace(trace)
    base_ns = int(mapped.get("baseTimeNanoseconds", 0))
    anchor_ns, anchor_us = _anchor()
    start_us, end_us = figures["time"]["start_us"], figures["time"]["end_us"]
    if end_us <= start_us:
        path.write_text(json.dumps(mapped))
        return
    spans = figures["phase_spans"]
    lo = min([start_us, *(s for _, s, _ in spans)])
    hi = max([end_us, *(e for _, _, e in spans)])

    def chip(ts_us: float) -> float:
        return (base_ns + round(ts_us * 1e3) - anchor_ns) / 1e3 + anchor_us

    kept = [e for e in mapped.get("traceEvents", []) if e.get("ph") == "M" or "ts" not in e
            or lo <= chip(float(e["ts"])) <= hi]

    def axis(chip_us: float) -> float:  # the trace's own time of a chip time
        return (round((chip_us - anchor_us) * 1e3) + anchor_ns - base_ns) / 1e3

    # The step and its phases, on a row of their own above the host's.
    row = {"pid": "npusim report", "tid": "phases"}
    kept.append({"ph": "M", "name": "process_name", **row, "args": {"name": "npusim report: phases"}})
    kept.append({"ph": "X", "cat": "npusim_step", "name": f"step {choice.step}", **row, "ts": axis(lo),
                 "dur": (hi - lo)})
    kept += [{"ph": "X", "cat": "npusim_phase", "name": phase, **row, "ts": axis(start), "dur": max(end - start, 0.0)}
             for phase, start, end in spans]
    mapped["traceEvents"] = kept
    path.write_text(json.dumps(mapped))


def _anchor() -> tuple[int, float]:
    from npusim.runtime import acl

    return acl.profiler_axis_anchor()


def mib(nbytes: float) -> str:
    return "-" if nbytes is None or (isinstance(nbytes, float) and math.isnan(nbytes)) else f"{nbytes / 2**20:,.1f} MiB"
