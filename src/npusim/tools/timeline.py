"""``python -m npusim timeline``: one FSDP2 step per kernel mode as a stream timeline picture.

Two ranks train a TinyTransformer with PyTorch's own ``fully_shard`` under the
timing model. Rank 0 profiles one step with ``torch.profiler`` for each of the
aligned kernel, the legacy kernel, and the legacy kernel with the historical
patch, and writes each Chrome trace (``timeline-<config>.json``); the device
tasks are there as ranges on one thread per npu stream (see Note [Device tasks
in torch.profiler]). The picture (``timeline.png``) draws, per configuration,
one lane per stream (compute = default stream, all-gather copy-in, all-gather,
reduce-scatter, and the collectives' comm stream) and the host lane with the
time the host spends in the ``_foreach_copy_`` routes: in legacy mode the
host waits there for the copy, which the alignment removes.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from npusim.testing.ranks import run_ranks

CONFIGS = ("aligned", "legacy", "legacy + patch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-out", help="directory for timeline.png and the traces")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--copy-gbps", type=float, default=1.0, help="timing model: device copy bandwidth")
    parser.add_argument("--link-gbps", type=float, default=2.0, help="timing model: collective link bandwidth")
    parser.add_argument("--timeout", type=float, default=240.0)


def _job(rank: int, world: int, args: argparse.Namespace, out: str) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import npusim
    from npusim.distributed.historical_patch import historical_patch
    from npusim.testing.fsdp_harness import sharded_step

    model, step = sharded_step(rank, args.dim, args.blocks)

    with npusim.timing.model(copy_gbps=args.copy_gbps, link_gbps=args.link_gbps):
        step()  # warm-up: lazy initialization (FSDP2 creates its streams) out of the picture
        comm = model._get_fsdp_state()._comm_ctx
        lanes = {"compute": 0, "all-gather copy-in": comm.all_gather_copy_in_stream.stream_id,
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
                prof.export_chrome_trace(str(Path(out) / f"timeline-{config.replace(' + ', '+')}.json"))
    return lanes


Bars = dict[str, list[tuple[float, float, str]]]


def _lanes_of(trace: list[dict[str, Any]], stream_lanes: dict[str, int]) -> tuple[Bars, float]:
    """Bars (start us, duration us, name) per lane, and the time origin."""
    names: dict[int, str] = {}
    for e in trace:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
    by_stream = {f"npu0 stream {sid})": lane for lane, sid in stream_lanes.items()}
    lanes: Bars = {"host: _foreach_copy_": []}
    lanes.update({lane: [] for lane in stream_lanes})
    lanes["comm stream (collectives)"] = []
    spans = [e for e in trace if e.get("ph") == "X"]
    origin = min(e["ts"] for e in spans)
    for e in spans:
        row = names.get(e["tid"], "")
        bar = (e["ts"] - origin, e["dur"], e["name"])
        lane = next((name for key, name in by_stream.items() if row.endswith(key)), None)
        if lane is not None and ": " in e["name"] and not e["name"].endswith(("event_record", "wait_event")):
            lanes[lane].append(bar)
        elif e["name"].startswith("hccl "):
            lanes["comm stream (collectives)"].append(bar)
        elif e["name"].startswith("npusim::foreach_copy["):
            lanes["host: _foreach_copy_"].append(bar)
    return lanes, origin


def _plot(out: Path, traces: dict[str, list[dict[str, Any]]], stream_lanes: dict[str, int]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(traces), 1, figsize=(13, 2.2 * len(traces) + 0.8), sharex=True)
    colors = {"host: _foreach_copy_": "tab:red", "compute": "tab:blue", "all-gather copy-in": "tab:orange",
              "all-gather": "tab:green", "reduce-scatter": "tab:purple", "comm stream (collectives)": "tab:olive"}
    for ax, (config, trace) in zip(axes, traces.items(), strict=True):
        lanes, _ = _lanes_of(trace, stream_lanes)
        host_ms = sum(d for _, d, _ in lanes["host: _foreach_copy_"]) / 1e3
        end_ms = max((s + d for bars in lanes.values() for s, d, _ in bars), default=0) / 1e3
        for y, (lane, bars) in enumerate(reversed(list(lanes.items()))):
            ax.broken_barh([(s / 1e3, max(d / 1e3, 0.05)) for s, d, _ in bars], (y - 0.35, 0.7),
                           color=colors[lane])
        ax.set_yticks(range(len(lanes)), list(reversed(list(lanes))))
        ax.set_title(f"{config}: host in _foreach_copy_ {host_ms:.1f} ms, step {end_ms:.1f} ms (rank 0)",
                     fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms since the step's first event")
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=110)
    return path


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lanes = run_ranks(_job, args, str(out.resolve()), name="timeline", backend="hccl", bind_device=False,
                      timeout=args.timeout, pg_timeout=args.timeout)[0]
    traces = {c: json.loads((out / f"timeline-{c.replace(' + ', '+')}.json").read_text())["traceEvents"]
              for c in CONFIGS}
    for config, trace in traces.items():
        bars, _ = _lanes_of(trace, lanes)
        print(f"{config}: " + ", ".join(f"{lane} {len(b)} tasks / {sum(d for _, d, _ in b) / 1e3:.1f} ms"
                                        for lane, b in bars.items()))
    print(f"wrote {_plot(out, traces, lanes)} and the traces timeline-*.json")
    return 0
