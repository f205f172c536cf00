"""``python -m npusim plan [--world-size N --ranks-per-node M] [--rank R | --all-ranks] -- script.py ARGS``:
runs an unmodified training script without computing it and reports each rank's memory and chip-time
step (docs/PLAN.md).

The device runs in plan mode (Note [Plan mode] in csrc/runtime/plan_mode.cpp: every op launches,
allocates through the caching allocator and takes its chip time, no kernel runs, device memory reads as
zeros and costs the host nothing), under the step report of ``npusim report`` (Note [The step report]).

- ``--world-size N`` (no launcher): rank ``--rank`` (default 0) runs alone and stands for a world of N
  ranks, ``--ranks-per-node`` to a node (Note [Launching a planned world] in plan/world.py).
- ``--all-ranks``: every rank of the world runs as a process (torchrun on this machine), for programs
  whose ranks differ (pipeline stages, uneven experts).
- Under torchrun (``torchrun ... -m npusim plan -- script.py``) every rank of torchrun's world plans; a
  single torchrun process given ``--world-size N`` stands for a world of N as above.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from npusim.tools import report as report_tool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks in the planned world (default: torchrun's WORLD_SIZE, else 1)")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="ranks per node, for DeviceMesh and collective prices (default 8, or the world size "
                             "if smaller)")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--rank", type=int, default=0, help="the rank that runs and stands for the world (default 0)")
    who.add_argument("--all-ranks", action="store_true",
                     help="run every rank as a process (for programs whose ranks differ)")
    report_tool.add_arguments(parser)
    parser.set_defaults(out="npusim-plan")


def _argv_without(argv: list[str], options: dict[str, bool]) -> list[str]:
    """``argv`` (the subcommand's own, before its script) without ``options`` (name -> takes a value)."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if token == "--" or not token.startswith("-"):
            return out + argv[i:]
        if name in options:
            i += 1 if ("=" in token or not options[name]) else 2
            continue
        out.append(token)
        i += 1
    return out


def _run_all_ranks(args: argparse.Namespace, world: int, per_node: int) -> int:
    """Every rank as a process: this command again under torchrun, without the world options."""
    from npusim.runtime import acl

    if world > acl.MAX_DEVICES:
        print(f"npusim plan: --all-ranks runs every rank on this machine, at most {acl.MAX_DEVICES} (one node's "
              f"simulated devices); got --world-size {world}. Plan a larger SPMD world with one rank "
              "(leave out --all-ranks)", file=sys.stderr)
        return 2
    own = sys.argv[sys.argv.index("plan") + 1:] if "plan" in sys.argv else []
    rest = _argv_without(own, {"--world-size": True, "--ranks-per-node": True, "--rank": True, "--all-ranks": False})
    env = {**os.environ, "NPUSIM_RANKS_PER_NODE": str(per_node), "NPUSIM_DEVICE_COUNT": str(max(world, 1)),
           "NPUSIM_COMPUTE": "plan"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "-m", "npusim", "plan", *rest]
    return subprocess.run(command, env=env, check=False).returncode


def run(args: argparse.Namespace) -> int:
    from npusim.plan import world as planned
    from npusim.plan.session import run_with_report
    from npusim.runtime import acl
    from npusim.tools import profile_options
    from npusim.tools import run as run_tool

    if args.args[:1] == ["--"]:
        args.args = args.args[1:]
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launched and os.environ["WORLD_SIZE"] == "1" and args.world_size is not None and not args.all_ranks:
        planned.leave_launcher()  # torchrun --nproc-per-node 1 -m npusim plan --world-size N: it plans the world
        launched = False
    if launched and (args.world_size is not None or args.all_ranks or args.rank != 0):
        print("npusim plan: under torchrun the world is torchrun's: leave out --world-size, --rank and "
              "--all-ranks (or run one process: torchrun --nproc-per-node 1 -m npusim plan --world-size N)",
              file=sys.stderr)
        return 2
    world = args.world_size if args.world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    per_node = args.ranks_per_node if args.ranks_per_node is not None else min(8, max(world, 1))
    if args.all_ranks:
        return _run_all_ranks(args, world, per_node)
    from npusim._device import PLAN_MODE_NOTICE

    said = acl.device_computes() is False  # NPUSIM_COMPUTE=plan was set at import, which said so
    acl.set_plan_mode(True)  # before anything is allocated on the device (Note [Plan mode])
    os.environ["NPUSIM_COMPUTE"] = "plan"  # and so in the job's child processes
    store = None
    ranks = None
    if not launched and world > 1:
        try:
            store = planned.enter(planned.PlannedWorld(world, per_node, args.rank))
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        ranks = (args.rank,)
    elif not launched:
        os.environ.setdefault("NPUSIM_RANKS_PER_NODE", str(per_node))
    profile_options.select_for_job(args)  # before the chip clock reads the profile's HBM bandwidth
    if not said and int(os.environ.get("RANK", "0")) == (ranks[0] if ranks else 0):
        print(f"npusim plan: {PLAN_MODE_NOTICE}", file=sys.stderr, flush=True)
    options = report_tool.options_from(args, mode="plan")._replace(ranks=ranks)
    import torch

    try:
        return run_with_report(lambda: run_tool.run(args), options)
    except torch.OutOfMemoryError as error:  # the table above names the step, the phase and the allocations
        print(f"npusim plan: rank {os.environ.get('RANK', '0')} does not fit its npu "
              f"({torch.npu.get_device_properties().total_memory / 2**30:.1f} GiB): {str(error).splitlines()[0]}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        del store
