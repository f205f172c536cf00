"""``python -m npusim bench chip-clock``: what the chip clock costs a training step.

Issue 38's goal: with the timing model on (the chip clock, Note [Chip clock]), a training step
costs at most 1.15x the same step with it off. Each row times the same steps of one model on npu
in fresh processes (Note [Each device in a process of its own] in bench/sim_cost.py), the model off
and on taking turns, with ``NPUSIM_TIMING="launch_us=10,compute=1"`` for "on" (every op a stream
task placed on the chip clock, compute priced by the cost model); the medians over all processes
become Measurements for Compare.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils import benchmark

from npusim.bench import report
from npusim.bench.report import compare, progress, save_plot
from npusim.bench.sim_cost import steps_in_a_fresh_process

TIMING = "launch_us=10,compute=1"
GOAL = 1.15


class Workload(NamedTuple):
    what: str
    step: str  # a step of bench/sim_cost.py's _STEP_FNS
    untimed: int
    timed: int


WORKLOADS = (
    Workload("demo model training step (TinyTransformer dim 64)", "demo", 75, 100),
    Workload("dispatch-bound training step (MLP 3x256, batch 8)", "mlp", 250, 350),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per setting and workload (default 3)")


def run(args: argparse.Namespace) -> int:
    import npusim  # noqa: F401  (registers the npu device)

    threads = torch.get_num_threads()
    rows: list[dict[str, float | str]] = []
    measurements: list[benchmark.Measurement] = []
    for i, work in enumerate(WORKLOADS, start=1):
        progress(i, len(WORKLOADS) + 1, work.what)
        times: dict[str, list[float]] = {"timing off": [], "chip clock": []}
        for r in range(args.rounds):
            order = ("timing off", "chip clock") if r % 2 == 0 else ("chip clock", "timing off")
            for setting in order:
                print(f"      {setting}, process {r + 1} of {args.rounds}", flush=True)
                env = {"NPUSIM_TIMING": TIMING if setting == "chip clock" else ""}
                times[setting] += steps_in_a_fresh_process(work.step, "npu", threads, work.untimed, work.timed, env)
        off, on = (report.measurement(times[s], label="training step on npu", sub_label=work.what, description=s,
                                      num_threads=threads) for s in ("timing off", "chip clock"))
        measurements += [off, on]
        rows.append({"what": work.what, "off_ms": off.median * 1e3, "on_ms": on.median * 1e3,
                     "ratio": on.median / off.median, "goal": GOAL})
    progress(len(WORKLOADS) + 1, len(WORKLOADS) + 1, "done")
    compare(measurements)
    width = max(len(str(r["what"])) for r in rows) + 2
    print(f"\n{'what':<{width}}{'off ms':>9}{'on ms':>9}{'on/off':>8}{'goal':>7}")
    for r in rows:
        print(f"{r['what']:<{width}}{r['off_ms']:>9.3f}{r['on_ms']:>9.3f}{r['ratio']:>8.2f}{'<=' + str(GOAL):>7}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chip_clock.json").write_text(json.dumps({"timing": TIMING, "threads": threads, "rows": rows}, indent=1))

    def draw(fig) -> None:  # noqa: ANN001
        ax = fig.add_subplot(1, 1, 1)
        names = [str(r["what"]).split(" (")[0] for r in rows]
        ax.barh(names, [float(r["ratio"]) for r in rows], color="tab:blue")
        ax.axvline(GOAL, color="tab:red", linestyle="--", label=f"goal {GOAL}")
        ax.set_xlabel(f"step time with NPUSIM_TIMING={TIMING} / without (median, fresh processes)")
        ax.legend()

    save_plot(out / "chip_clock.png", draw, size=(9.0, 2.6))
    return 0
