"""``python -m npusim bench sanitizer``: what the stream race sanitizer costs on an FSDP2 step.

Two ranks train a TinyTransformer with PyTorch's ``fully_shard``; steps with
the sanitizer off and on (``npusim.sanitizer.enabled()``, reporting by
raising) take turns in one run, and the table gives the median step time of
each and their ratio, with the operations the sanitizer checked per step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from npusim.testing.ranks import run_ranks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per setting")
    parser.add_argument("--timeout", type=float, default=240.0)


def _job(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:

    import npusim.sanitizer
    from npusim.testing.fsdp_harness import sharded_step

    _, train_step = sharded_step(rank, args.dim, args.blocks)

    def step() -> float:
        start = time.perf_counter()
        train_step()
        return time.perf_counter() - start

    step()  # warm-up
    times: dict[str, list[float]] = {"off": [], "on": []}
    ops, reports = 0, 0
    for _ in range(args.steps):
        times["off"].append(step())
        with npusim.sanitizer.enabled() as san:
            times["on"].append(step())
        ops, reports = san.ops, reports + len(san.reports)
    return {"off": statistics.median(times["off"]), "on": statistics.median(times["on"]), "ops": ops,
            "reports": reports}


def run(args: argparse.Namespace) -> int:
    ranks = run_ranks(_job, args, name="bench sanitizer", backend="hccl", bind_device=False,
                      timeout=args.timeout, pg_timeout=args.timeout)
    r = ranks[0]
    print(f"FSDP2 step under the stream race sanitizer, rank 0 of 2; TinyTransformer dim={args.dim} "
          f"blocks={args.blocks}, every block checkpointed; median of {args.steps} steps per setting, interleaved")
    print("| sanitizer | step ms | vs off | ops checked per step | races reported |")
    print("|---|---|---|---|---|")
    print(f"| off | {r['off'] * 1e3:.1f} | 1.00 | 0 | - |")
    print(f"| on | {r['on'] * 1e3:.1f} | {r['on'] / r['off']:.2f} | {r['ops']} | {r['reports']} |")
    return 0
