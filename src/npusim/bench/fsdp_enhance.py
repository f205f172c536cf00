"""``python -m npusim bench fsdp-enhance``: what the FSDP2 enhancement layer saves.

Two ranks train a small transformer (tied weights, every block checkpointed,
explicit forward prefetch block i -> i + 1) with the enhancements off, the
communication-buffer cache, the recompute rule, and both, for
``use_reentrant`` False and True, side by side in one run. Per configuration,
averaged over the steps after ``--warmup``: communication-buffer allocations
per step, all-gathers per step (forward + backward), reduce-scatters per
step, peak device memory (``torch.npu.max_memory_allocated`` over those
steps, above what was allocated before the run) and median step time. Losses are checked identical across
configurations before anything is reported. The ranks meet in collectives, so
both run the same fixed number of steps; the per-step times become
``torch.utils.benchmark`` Measurements afterwards for the Compare table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from npusim.bench.report import bars, compare, figure_legend, measurement, progress, save_plot
from npusim.testing.fsdp_harness import Setup
from npusim.testing.ranks import run_ranks

CONFIGS: dict[str, Setup] = {
    "off": Setup(),
    "cache": Setup(mem_cache=True),
    "recompute rule": Setup(recompute_rule=True),
    "both": Setup(mem_cache=True, recompute_rule=True),
}


class Row(NamedTuple):
    config: str
    use_reentrant: bool
    allocs_per_step: float
    all_gathers_per_step: float
    reduce_scatters_per_step: float
    peak_mib: float
    step_ms: float
    losses: list[float]
    step_times_s: list[float]  # the measured steps'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=256, help="model width")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="steps not measured (the cache fills up)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")


def _train(rank: int, args: argparse.Namespace, setup: Setup, reentrant: bool) -> Row:
    import torch.nn.functional as F  # noqa: N812

    from npusim.distributed.fsdp import CommBufferCache
    from npusim.testing.fsdp_harness import CommCounter, CountingAllGather, CountingReduceScatter, shard
    from npusim.testing.models import TinyTransformer

    device = torch.device("npu", rank)
    vocab = 64
    # FSDP's state holds reference cycles: collect the previous run's model first,
    # and report peak memory above what was allocated before this run.
    gc.collect()
    torch.npu.synchronize()
    base_bytes = torch.npu.memory_allocated(device)
    torch.manual_seed(0)
    model = TinyTransformer(vocab=vocab, dim=args.dim, heads=4, seq=args.seq, n_blocks=args.blocks,
                            use_reentrant=reentrant).to(device)
    cache = CommBufferCache()
    shard(model, setup, cache)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counter = CommCounter()
    CountingAllGather.allocations = CountingReduceScatter.allocations = 0
    gen = torch.Generator().manual_seed(rank)
    losses, times = [], []

    def allocations() -> int:
        s = cache.stats()
        return s.misses + s.bypassed + CountingAllGather.allocations + CountingReduceScatter.allocations

    with counter.active():
        for step in range(args.steps):
            if step == args.warmup:
                torch.npu.synchronize()
                torch.npu.reset_peak_memory_stats(device)
                base_allocs, base_counts = allocations(), counter.snapshot()
            idx = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=gen).to(device)
            start = time.perf_counter()
            loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())  # synchronizes: the step's device work is done
            times.append(time.perf_counter() - start)
    n = args.steps - args.warmup
    ag_fwd, ag_bwd, rs = (a - b for a, b in zip(counter.snapshot(), base_counts, strict=True))
    peak_mib = (torch.npu.max_memory_allocated(device) - base_bytes) / 2**20
    return Row("", reentrant, (allocations() - base_allocs) / n, (ag_fwd + ag_bwd) / n, rs / n, peak_mib,
               statistics.median(times[args.warmup:]) * 1e3, losses, times[args.warmup:])


def _job(rank: int, world: int, args: argparse.Namespace) -> list[Row]:
    """Every configuration, for use_reentrant False then True, in one process group."""
    rows = []
    for reentrant in (False, True):
        for name, setup in CONFIGS.items():
            if rank == 0:
                progress(len(rows) + 2, 2 * len(CONFIGS) + 2, f"use_reentrant={reentrant}, {name}: "
                         f"{args.warmup} warm-up + {args.steps - args.warmup} measured steps")
            rows.append(_train(rank, args, setup, reentrant)._replace(config=name))
    return rows


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"bench fsdp-enhance: expected 0 <= --warmup < --steps, got {args.warmup} and {args.steps}")
    total = 2 * len(CONFIGS) + 2
    progress(1, total, f"2 ranks: TinyTransformer dim={args.dim} blocks={args.blocks}, {len(CONFIGS)} "
             f"configurations x use_reentrant False / True")
    # No backend named and no device bound, as before: the npu's default backend.
    rows = run_ranks(_job, args, name="bench fsdp-enhance", bind_device=False, timeout=args.timeout,
                     pg_timeout=args.timeout)[0]
    progress(total, total, "done")
    for reentrant in (False, True):
        same = [r.losses for r in rows if r.use_reentrant == reentrant]
        if any(losses != same[0] for losses in same):
            raise RuntimeError(f"bench fsdp-enhance: losses differ across configurations (use_reentrant={reentrant})")
    compare([measurement(r.step_times_s, label="FSDP2 step with enhancements, rank 0 of 2",
                         sub_label=f"use_reentrant={r.use_reentrant}", description=r.config, num_threads=1)
             for r in rows])
    print(f"FSDP2 enhancements: 2 ranks, TinyTransformer dim={args.dim} blocks={args.blocks} seq={args.seq} "
          f"batch={args.batch}, every block checkpointed, forward prefetch i -> i+1; "
          f"{args.steps - args.warmup} measured steps after {args.warmup} warm-up; losses identical in all rows")
    header = ("use_reentrant", "config", "allocs/step", "all-gathers/step", "reduce-scatters/step", "peak MiB",
              "step ms")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print(f"| {r.use_reentrant} | {r.config} | {r.allocs_per_step:g} | {r.all_gathers_per_step:g} | "
              f"{r.reduce_scatters_per_step:g} | {r.peak_mib:.2f} | {r.step_ms:.1f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fsdp-enhance.json").write_text(json.dumps([r._asdict() for r in rows], indent=2))
    _plot(rows, out / "fsdp-enhance.png")
    return 0


def _plot(rows: list[Row], path: Path) -> None:
    configs = list(CONFIGS)
    panels = {"allocs_per_step": "communication buffers allocated / step", "all_gathers_per_step": "all-gathers / step",
              "peak_mib": "peak device memory, MiB", "step_ms": "step ms (median)"}

    def draw(fig: Any) -> None:
        axes = fig.subplots(1, len(panels))
        for ax, (key, xlabel) in zip(axes, panels.items(), strict=True):
            series = {f"use_reentrant={flag}": [getattr(next(r for r in rows if r.config == c and
                                                             r.use_reentrant == flag), key) for c in configs]
                      for flag in (False, True)}
            bars(ax, configs, series, xlabel=xlabel, legend=False)
        fig.suptitle("FSDP2 enhancement layer, 2 ranks (rank 0)", fontsize=10, x=0.02, ha="left")
        figure_legend(fig, axes[0])

    save_plot(path, draw, size=(13, 3.2))
