"""``python -m npusim report [--out DIR] [--step N] -- script.py ARGS``: one training step's memory and
chip time, per rank, for an unmodified script.

The script runs as ``npusim run`` runs it (``import torch_npu`` gives npusim; under ``torchrun ... -m
npusim report -- script.py`` every rank does the same), with the chip clock on, under the step report
of :mod:`npusim.plan` (Note [The step report] in plan/session.py): progress as steps end, then the
table of every rank, and in ``--out`` report.json, memory.png, snapshot.pickle and trace.json (per rank
in ``rank<r>/`` when the world has several). ``npusim plan`` (tools/plan.py) runs the same report without computing.
"""

from __future__ import annotations

import argparse

from npusim.tools import run as run_tool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="npusim-report",
                        help="directory for the report's files (default npusim-report)")
    parser.add_argument("--step", type=int, default=None,
                        help="the step to report, from 1 (default: the last that ended)")
    parser.add_argument("--timing", default=None, metavar="KEY=V,...",
                        help="the timing model, as NPUSIM_TIMING (default: NPUSIM_TIMING, else compute=1 with "
                             "copies at half the chip's HBM bandwidth)")
    parser.add_argument("--no-flops", dest="flops", action="store_false",
                        help="count no FLOPs (no MFU): no dispatch mode over the job")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds rank 0 waits for the other ranks' reports (default 120)")
    run_tool.add_arguments(parser)


def options_from(args: argparse.Namespace, mode: str = "report") -> object:
    from npusim.plan.session import ReportOptions

    if args.step is not None and args.step < 1:
        raise SystemExit(f"npusim {mode}: --step counts from 1, got {args.step}")
    command = (*(["-m"] if args.module else []), args.target, *args.args)
    return ReportOptions(out=args.out, step=args.step, timing=args.timing, flops=args.flops, wait_s=args.wait,
                         command=tuple(command), mode=mode)


def run(args: argparse.Namespace) -> int:
    from npusim.plan.session import run_with_report
    from npusim.tools import profile_options

    if args.args[:1] == ["--"]:
        args.args = args.args[1:]
    profile_options.select_for_job(args)  # before the chip clock reads the profile's HBM bandwidth
    return run_with_report(lambda: run_tool.run(args), options_from(args))
