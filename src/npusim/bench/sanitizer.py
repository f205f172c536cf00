"""``python -m npusim bench sanitizer``: what the stream race sanitizer costs on an FSDP2 step.

Two ranks train a TinyTransformer with PyTorch's ``fully_shard``; steps with
the sanitizer off and on (``npusim.sanitizer.enabled()``, reporting by
raising) take turns in one run, and the table gives the median step time of
each and their ratio, with the operations the sanitizer checked per step.
The ranks meet in collectives, so both run the same fixed number of steps
(``report.interleaved``), not an adaptive ``blocked_autorange``; a step ends
with a device synchronize inside the timed call.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from npusim.bench.report import compare, measurement, measurement_bars, progress, save_plot
from npusim.testing.ranks import run_ranks

SETTINGS = ("off", "on")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per setting")
    parser.add_argument("--timeout", type=float, default=240.0)


def _job(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    import npusim.sanitizer
    from npusim.bench.report import interleaved
    from npusim.testing.fsdp_harness import sharded_step

    _, train_step = sharded_step(rank, args.dim, args.blocks)
    checked = {"ops": 0, "reports": 0}

    def sanitized_step() -> None:
        with npusim.sanitizer.enabled() as san:
            train_step()
        checked["ops"] = san.ops
        checked["reports"] += len(san.reports)

    if rank == 0:
        progress(2, 3, f"{args.steps} steps per setting, sanitizer off and on taking turns, after 1 warm-up")
    times = interleaved({"off": train_step, "on": sanitized_step}, args.steps, warmup=1)
    return {"off": statistics.median(times["off"]), "on": statistics.median(times["on"]), "ops": checked["ops"],
            "reports": checked["reports"], "times_s": times}


def run(args: argparse.Namespace) -> int:
    progress(1, 3, f"2 ranks: FSDP2 TinyTransformer dim={args.dim} blocks={args.blocks}")
    ranks = run_ranks(_job, args, name="bench sanitizer", backend="hccl", bind_device=False,
                      timeout=args.timeout, pg_timeout=args.timeout)
    progress(3, 3, "done")
    ms = [measurement(ranks[0]["times_s"][s], label="FSDP2 step, rank 0 of 2", sub_label=f"sanitizer {s}",
                      description=f"dim {args.dim}, {args.blocks} blocks", num_threads=1) for s in SETTINGS]
    compare(ms)
    r = ranks[0]
    print(f"FSDP2 step under the stream race sanitizer, rank 0 of 2; TinyTransformer dim={args.dim} "
          f"blocks={args.blocks}, every block checkpointed; median of {args.steps} steps per setting, interleaved")
    print("| sanitizer | step ms | vs off | ops checked per step | races reported |")
    print("|---|---|---|---|---|")
    print(f"| off | {r['off'] * 1e3:.1f} | 1.00 | 0 | - |")
    print(f"| on | {r['on'] * 1e3:.1f} | {r['on'] / r['off']:.2f} | {r['ops']} | {r['reports']} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "ranks": ranks}
    (out / "sanitizer.json").write_text(json.dumps(raw, indent=2, default=str))

    def draw(fig: Any) -> None:
        measurement_bars(fig.subplots(), ms, scale=1e3, unit="ms per step (median, interquartile whiskers)",
                         title=f"FSDP2 step, stream race sanitizer on: {r['on'] / r['off']:.2f}x off")

    save_plot(out / "sanitizer.png", draw, size=(7, 2.4))
    return 0
