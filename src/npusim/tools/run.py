"""``python -m npusim run script.py [args]``: runs a torch_npu script unmodified.

The script's ``import torch_npu`` gets npusim's compatibility module
(:mod:`npusim.compat.torch_npu`), installed in this process only; the script
then runs as ``__main__`` with ``sys.argv = [script, *args]``, exactly as
``python script.py args`` would run it. Under torchrun
(``torchrun --nproc-per-node 2 -m npusim run train.py``) every rank does the
same, and ``hccl`` process groups use npusim's collective backend. The job gets a
simulated CANN toolkit environment of the profile's CANN release unless it has one
(See Note [A simulated CANN environment] in ``npusim/tools/cann_env.py``).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from npusim.tools import profile_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    profile_options.add_arguments(parser, default=None)
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run TARGET as a module (like python -m TARGET)")
    parser.add_argument("target", help="the script (or, with -m, the module) to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def run(args: argparse.Namespace) -> int:
    from npusim.compat import torch_npu
    from npusim.runtime.profiles import get_profile
    from npusim.tools.cann_env import CANN_VARIABLES, apply_cann_environment

    profile_options.select_for_job(args)  # before the job reads the profile (its CANN release, its chip)
    torch_npu.install()
    why = apply_cann_environment(os.environ, get_profile().cann_version)
    if why and not any(os.environ.get(name) for name in CANN_VARIABLES):  # a real toolkit, not sourced
        print(f"npusim run: no simulated CANN environment: {why}", file=sys.stderr)
    sys.argv = [args.target, *args.args]
    try:
        if args.module:
            runpy.run_module(args.target, run_name="__main__", alter_sys=True)
        else:
            if not os.path.isfile(args.target):
                print(f"npusim run: no such script: {args.target}", file=sys.stderr)
                return 2
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.target)))
            runpy.run_path(args.target, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
