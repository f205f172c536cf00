"""``python -m npusim bench fsdp-enhance``: what the FSDP2 enhancement layer saves.

Two ranks train a small transformer (tied weights, every block checkpointed,
explicit forward prefetch block i -> i + 1) with the enhancements off, the
communication-buffer cache, the recompute rule, and both, for
``use_reentrant`` False and True, side by side in one run. Per configuration,
averaged over the steps after ``--warmup``: communication-buffer allocations
per step, all-gathers per step (forward + backward), reduce-scatters per
step, peak device memory (``torch.npu.max_memory_allocated`` over those
steps, above what was allocated before the run) and median step time. Losses are checked identical across
configurations before anything is reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import queue
import statistics
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import torch

from npusim.bench._fsdp_harness import Setup

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

    from npusim.bench._fsdp_harness import CommCounter, CountingAllGather, CountingReduceScatter, shard
    from npusim.bench._tiny_transformer import TinyTransformer
    from npusim.distributed.fsdp import CommBufferCache

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
               statistics.median(times[args.warmup:]) * 1e3, losses)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, results: Any) -> None:
    try:
        import torch.distributed as dist

        import npusim.distributed  # noqa: F401  (npu device and its collective backend)

        torch.set_num_threads(1)
        torch.npu.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=args.timeout))
        dist.init_process_group(store=store, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
        rows = []
        for reentrant in (False, True):
            for name, setup in CONFIGS.items():
                rows.append(_train(rank, args, setup, reentrant)._replace(config=name))
        results.put((rank, rows))
        dist.destroy_process_group()
    except BaseException:  # noqa: B036  (reported to the parent)
        results.put((rank, traceback.format_exc()))


def _spawn(args: argparse.Namespace, world: int = 2) -> list[Row]:
    """Rank 0's rows; the ranks are killed on the first failure or at ``--timeout``."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=args.timeout))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_rank, args=(r, world, server.port, args, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + args.timeout
    try:
        while len(out) < world:
            try:
                rank, value = results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"bench fsdp-enhance: ranks did not finish within {args.timeout} s") from None
                continue
            if isinstance(value, str):
                raise RuntimeError(f"bench fsdp-enhance: rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return out[0]


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"bench fsdp-enhance: expected 0 <= --warmup < --steps, got {args.warmup} and {args.steps}")
    rows = _spawn(args)
    for reentrant in (False, True):
        same = [r.losses for r in rows if r.use_reentrant == reentrant]
        if any(losses != same[0] for losses in same):
            raise RuntimeError(f"bench fsdp-enhance: losses differ across configurations (use_reentrant={reentrant})")
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
    return 0
