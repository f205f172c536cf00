"""``python -m npusim bench plan``: what `npusim plan` costs this machine for jobs far bigger than it:
examples/plan_llama8b.py shaped as Llama-3-8B over 64 ranks and as a 70B model over 512 ranks (8 per node,
sequence 4096, batch 1 per rank, bf16 mixed precision, full checkpointing, AdamW), one rank standing for
the world. Each plan runs in its own process; the table gives its wall time and peak host RSS (the
process's own, from wait4) beside the plan's figures for the chip (peak allocated / reserved per rank,
step time, MFU), and the issue's limits. Each plan's report (memory.png, trace, snapshot) is kept under
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from npusim.bench.report import progress


class Job(NamedTuple):
    name: str
    world: int
    model_args: tuple[str, ...]
    wall_limit_s: float  # the limits
    rss_limit_gib: float | None


JOBS = {
    "8b": Job("Llama-3-8B", 64, (), 600.0, 4.0),
    "70b": Job("70B (Llama-3-70B shape)", 512, ("--layers", "80", "--hidden", "8192", "--intermediate", "28672",
                                                "--heads", "64", "--kv-heads", "8"), 1800.0, None),
}
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "plan_llama8b.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", default="8b,70b", help=f"which plans, of {', '.join(JOBS)} (default all)")
    parser.add_argument("--steps", type=int, default=2, help="training steps each plan runs (default 2)")
    parser.add_argument("--script", default=str(EXAMPLE), help="the job's script (default examples/plan_llama8b.py)")


def _plan(job: Job, args: argparse.Namespace, out: Path) -> dict:
    command = [sys.executable, "-m", "npusim", "plan", "--world-size", str(job.world), "--ranks-per-node", "8",
               "--out", str(out), "--", args.script, *job.model_args, "--steps", str(args.steps)]
    start = time.monotonic()
    with open(out.with_suffix(".log"), "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"bench plan: {' '.join(command)} failed; see {out.with_suffix('.log')}")
    (rank,) = json.loads((out / "report.json").read_text())["ranks"]
    return {"job": job.name, "world": job.world, "wall_s": wall, "rss_gib": usage.ru_maxrss / 2**20,
            "peak_allocated_gib": rank["memory"]["peak_allocated"] / 2**30,
            "peak_reserved_gib": rank["memory"]["peak_reserved"] / 2**30, "step_ms": rank["time"]["step_us"] / 1e3,
            "mfu": rank["mfu"], "wall_limit_s": job.wall_limit_s, "rss_limit_gib": job.rss_limit_gib,
            "command": " ".join(["python", *command[1:]])}


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.jobs.split(",") if n.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        print(f"bench plan: unknown jobs {unknown}; expected some of {', '.join(JOBS)}", file=sys.stderr)
        return 2
    out = Path(args.out) / "plan"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, name in enumerate(names, 1):
        job = JOBS[name]
        progress(i, len(names), f"npusim plan of {job.name} over {job.world} ranks")
        rows.append(_plan(job, args, out / name))
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    head = ("job", "ranks", "wall s (limit)", "host RSS GiB (limit)", "peak alloc GiB", "peak reserved GiB",
            "step ms", "MFU")
    lines = [(r["job"], str(r["world"]), f"{r['wall_s']:.1f} ({r['wall_limit_s']:.0f})",
              f"{r['rss_gib']:.2f} ({r['rss_limit_gib'] if r['rss_limit_gib'] else '-'})",
              f"{r['peak_allocated_gib']:.2f}", f"{r['peak_reserved_gib']:.2f}", f"{r['step_ms']:.1f}",
              "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %") for r in rows]
    widths = [max(len(h), *(len(line[k]) for line in lines)) for k, h in enumerate(head)]
    for line in (head, tuple("-" * w for w in widths), *lines):
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))
    print(f"reports and logs under {out}/")
    within = all(r["wall_s"] <= r["wall_limit_s"] and (r["rss_limit_gib"] is None or r["rss_gib"] <= r["rss_limit_gib"])
                 for r in rows)
    return 0 if within else 1
