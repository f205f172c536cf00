"""``python -m npusim timeline``: one FSDP2 step per kernel mode as a stream timeline picture, in chip time.

Two ranks train a TinyTransformer with PyTorch's own ``fully_shard`` under the timing model on the
chip clock (Note [Chip clock] in csrc/runtime/chip_clock.cpp): compute tasks last their ops'
modelled time on the profile's chip (the Ascend910B2 of ``training_soc`` by default; Note [Compute
cost model]), copies their bytes at the chip's copy bandwidth, collectives HCCL's algorithm over
the profile's links (Note [Collective cost model]), and the host pays the profile's cost per launch.
Rank 0 profiles one step for each of the aligned kernel, the legacy kernel, and the legacy kernel
with the historical patch, and writes each Chrome trace (``timeline-<config>.json``, host and device
on the chip's time axis), where every device task is an activity on its stream's row (Note [Device
tasks in torch.profiler]). The picture (``timeline.png``) draws, per configuration, one lane per
stream of device 0: compute (the default stream; forward, backward and optimizer work coloured apart
by the op that launched it), FSDP2's all-gather copy-in, all-gather and reduce-scatter streams, the
collectives' row, and the host lane with the time the host spends in the ``_foreach_copy_`` routes
(in legacy mode it waits there for the copy, which the alignment removes). ``timeline-summary.json``
holds, per configuration, the step time, the host time in ``_foreach_copy_``, the exposed
communication time (collective time during which the compute stream is idle) and the step's
Overlap Analysis as MindStudio Insight shows it (Note [Overlap Analysis figures]). The figures are
the chip's and the same in every run.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import torch

from npusim.runtime import overlap
from npusim.testing.ranks import run_ranks
from npusim.tools import profile_options

CONFIGS = ("aligned", "legacy", "legacy + patch")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy")  # device work; syncs (event records, waits) are not drawn
COLLECTIVES_ROW = 17  # the row after a device's 17 streams (csrc/runtime/trace.h: kCommLane)
HOST, COMPUTE, COLLECTIVES = "host: _foreach_copy_", "compute (default stream)", "collectives"
PHASE_COLORS = {"forward": "tab:blue", "backward": "navy", "optimizer": "tab:gray"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-out", help="directory for timeline.png and the traces")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=3)
    profile_options.add_arguments(parser, default="training_soc")  # the chip the cost models price
    parser.add_argument("--copy-gbps", type=float, default=None,
                        help="timing model: device copy bandwidth (default: half the chip's HBM bandwidth, "
                             "as a copy reads and writes each byte)")
    parser.add_argument("--link-gbps", type=float, default=0.0,
                        help="timing model: collective link bandwidth (default 0: the profile's HCCS and RoCE links)")
    parser.add_argument("--launch-us", type=float, default=10.0, help="timing model: latency of each task")
    parser.add_argument("--no-compute", dest="compute", action="store_false",
                        help="compute tasks take no chip time (only copies, collectives and launches are timed)")
    parser.add_argument("--timeout", type=float, default=240.0)


def _job(rank: int, world: int, args: argparse.Namespace, out: str) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import npusim
    from npusim.distributed.historical_patch import historical_patch
    from npusim.runtime.chip_clock import map_chrome_trace
    from npusim.testing.fsdp_harness import sharded_step

    chip = npusim.set_profile(profile_options.make(args))
    copy_gbps = args.copy_gbps if args.copy_gbps is not None else chip.hbm_gbps / 2
    model, step = sharded_step(rank, args.dim, args.blocks)
    with npusim.timing.model(copy_gbps=copy_gbps, launch_us=args.launch_us, link_gbps=args.link_gbps,
                             compute=args.compute):
        step()  # warm-up: lazy initialization (FSDP2 creates its streams) out of the picture
        comm = model._get_fsdp_state()._comm_ctx
        streams = {COMPUTE: 0, "all-gather copy-in": comm.all_gather_copy_in_stream.stream_id,
                   "all-gather": comm.all_gather_stream.stream_id,
                   "reduce-scatter": comm.reduce_scatter_stream.stream_id}
        for config in CONFIGS:
            with ExitStack() as stack:
                if config != "aligned":
                    stack.enter_context(npusim.ops.foreach_copy_mode("legacy"))
                if config == "legacy + patch":
                    stack.enter_context(historical_patch())
                dist.barrier()  # both ranks start the profiled step together
                torch.npu.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
                    step()
            if rank == 0:
                path = Path(out) / f"timeline-{config.replace(' + ', '+')}.json"
                prof.export_chrome_trace(str(path))
                path.write_text(json.dumps(map_chrome_trace(json.loads(path.read_text()))))  # host on chip time
    return streams


class Bar(NamedTuple):
    start_us: float
    duration_us: float
    name: str
    phase: str = ""  # compute bars: forward, backward or optimizer
    category: str = ""  # device bars: the profiler's category (kernel, gpu_memcpy)


def _phases(trace: list[dict[str, Any]]) -> dict[int, str]:
    """Correlation id -> phase of the CPU op with that id: backward on autograd's thread, optimizer
    inside an ``Optimizer.step`` range, forward otherwise."""
    ops = [e for e in trace if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    if not ops:
        return {}
    main = min(ops, key=lambda e: e["ts"])["tid"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in trace
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("Optimizer.step")]
    phases = {}
    for e in ops:
        if e["tid"] != main:
            phase = "backward"
        elif any(start <= e["ts"] <= end for start, end in steps):
            phase = "optimizer"
        else:
            phase = "forward"
        phases[e["args"].get("External id", -1)] = phase
    return phases


def lanes_of(trace: list[dict[str, Any]], streams: dict[str, int]) -> dict[str, list[Bar]]:
    """The bars of device 0's streams, its collectives row and the host's ``_foreach_copy_`` ranges,
    in microseconds from the trace's first event."""
    by_row = {sid: lane for lane, sid in streams.items()}
    by_row[COLLECTIVES_ROW] = COLLECTIVES
    lanes: dict[str, list[Bar]] = {HOST: [], **{lane: [] for lane in streams}, COLLECTIVES: []}
    spans = [e for e in trace if e.get("ph") == "X"]
    if not spans:
        return lanes
    origin = min(e["ts"] for e in spans)
    phases = _phases(trace)
    for e in spans:
        start = e["ts"] - origin
        if e.get("cat") in DEVICE_CATEGORIES and e.get("pid") == 0 and e.get("tid") in by_row:
            lane = by_row[e["tid"]]
            phase = phases.get(e["args"].get("External id", -1), "forward") if lane == COMPUTE else ""
            lanes[lane].append(Bar(start, e["dur"], e["name"], phase, e["cat"]))
        elif str(e.get("name", "")).startswith("npusim::foreach_copy["):
            lanes[HOST].append(Bar(start, e["dur"], e["name"]))
    return lanes


def _union(bars: list[Bar]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted((b.start_us, b.start_us + b.duration_us) for b in bars):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def exposed_us(busy: list[Bar], cover: list[Bar]) -> float:
    """Time within ``busy`` bars not covered by any ``cover`` bar."""
    covered = _union(cover)
    total = 0.0
    for start, end in _union(busy):
        total += end - start
        for c_start, c_end in covered:
            total -= max(0.0, min(end, c_end) - max(start, c_start))
    return total


def summarize(lanes: dict[str, list[Bar]]) -> dict[str, float]:
    """Step, host-in-_foreach_copy_, compute and exposed communication times of one trace, and its
    Overlap Analysis (computing: kernels on any stream; Note [Overlap Analysis figures]), in ms."""
    end = max((b.start_us + b.duration_us for bars in lanes.values() for b in bars), default=0.0)
    kernels = [(b.start_us, b.start_us + b.duration_us) for lane, bars in lanes.items()
               if lane not in (HOST, COLLECTIVES) for b in bars if b.category == "kernel"]
    figures = overlap.step_figures(kernels, [(b.start_us, b.start_us + b.duration_us) for b in lanes[COLLECTIVES]])
    return {
        "step_ms": end / 1e3,
        "host_in_foreach_copy_ms": sum(b.duration_us for b in lanes[HOST]) / 1e3,
        "compute_ms": sum(e - s for s, e in _union(lanes[COMPUTE])) / 1e3,
        "collectives_ms": sum(e - s for s, e in _union(lanes[COLLECTIVES])) / 1e3,
        "exposed_communication_ms": exposed_us(lanes[COLLECTIVES], lanes[COMPUTE]) / 1e3,
        "overlap_computing_ms": figures.computing / 1e3,
        "overlap_communication_ms": figures.communication / 1e3,
        "overlap_communication_not_overlapped_ms": figures.communication_not_overlapped / 1e3,
        "overlap_free_ms": figures.free / 1e3,
    }


def _plot(out: Path, lanes_by_config: dict[str, dict[str, list[Bar]]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(lanes_by_config), 1, figsize=(13, 2.4 * len(lanes_by_config) + 1.0), sharex=True)
    colors = {HOST: "tab:red", "all-gather copy-in": "tab:orange", "all-gather": "tab:green",
              "reduce-scatter": "tab:purple", COLLECTIVES: "tab:olive"}
    for ax, (config, lanes) in zip(axes, lanes_by_config.items(), strict=True):
        figures = summarize(lanes)
        for y, (lane, bars) in enumerate(reversed(list(lanes.items()))):
            ax.broken_barh([(b.start_us / 1e3, max(b.duration_us / 1e3, 0.0005)) for b in bars], (y - 0.35, 0.7),
                           facecolors=[PHASE_COLORS[b.phase] if b.phase else colors[lane] for b in bars])
        ax.set_yticks(range(len(lanes)), list(reversed(list(lanes))))
        ax.set_title(f"{config}: step {figures['step_ms']:.3f} ms; computing {figures['overlap_computing_ms']:.3f}, "
                     f"communication {figures['overlap_communication_ms']:.3f} (not overlapped "
                     f"{figures['overlap_communication_not_overlapped_ms']:.3f}), free "
                     f"{figures['overlap_free_ms']:.3f}; host in _foreach_copy_ "
                     f"{figures['host_in_foreach_copy_ms']:.3f} ms (rank 0, chip time)", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[0].legend(handles=[Patch(color=c, label=f"compute: {p}") for p, c in PHASE_COLORS.items()],
                   loc="upper right", fontsize=8, ncol=3)
    axes[-1].set_xlabel("ms since the step's first event")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    streams = run_ranks(_job, args, str(out.resolve()), name="timeline", backend="hccl", bind_device=False,
                        timeout=args.timeout, pg_timeout=args.timeout)[0]
    lanes_by_config = {}
    for config in CONFIGS:
        trace = json.loads((out / f"timeline-{config.replace(' + ', '+')}.json").read_text())["traceEvents"]
        lanes_by_config[config] = lanes_of(trace, streams)
    summary = {config: summarize(lanes) for config, lanes in lanes_by_config.items()}
    for config, lanes in lanes_by_config.items():
        print(f"{config}: " + ", ".join(f"{lane} {len(bars)} tasks / {sum(b.duration_us for b in bars) / 1e3:.1f} ms"
                                        for lane, bars in lanes.items()))
        print("  " + ", ".join(f"{key} {value:.2f}" for key, value in summary[config].items()))
    (out / "timeline-summary.json").write_text(json.dumps(summary, indent=2))
    profile = profile_options.make(args)
    cost = f"{profile.soc_name} compute cost model" if args.compute else "compute untimed"
    copy_gbps = args.copy_gbps if args.copy_gbps is not None else profile.hbm_gbps / 2
    link = f"link {args.link_gbps:g} GB/s" if args.link_gbps > 0 else "the profile's HCCS links"
    roofline = " roofline" if profile.roofline else ""
    title = (f"One FSDP2 step in chip time, 2 ranks, TinyTransformer dim {args.dim} x {args.blocks} blocks;\n{cost} "
             f"(profile {args.profile}{roofline}), launch {args.launch_us:g} us, "
             f"host {profile.host_launch_us:g} us a launch, copy {copy_gbps:g} GB/s, {link}")
    print(f"wrote {_plot(out, lanes_by_config, title)}, the traces timeline-*.json and timeline-summary.json")
    return 0
