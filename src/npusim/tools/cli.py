"""The npusim command line. Each subcommand lives in its own module, imported
only when it runs, and offers ``add_arguments(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("npusim.tools.demo", "train a small model on the simulated npu"),
    "bench": ("npusim.tools.bench", "run a benchmark (prints a table, writes a plot)"),
    "audit": ("npusim.tools.audit", "list FSDP2 functions and kernels replaced in this process"),
    "run": ("npusim.tools.run", "run a torch_npu script unmodified (import torch_npu gives npusim)"),
    "report": ("npusim.tools.report", "one step's memory and chip time per rank, for a script run as by run"),
    "plan": ("npusim.tools.plan", "the report of run without computing: N ranks' memory and chip-time step, any size"),
    "fuzz": ("npusim.tools.fuzz", "copy_ / _foreach_copy_ on the npu against CPU, generated cases"),
    "timeline": ("npusim.tools.timeline", "one FSDP2 step per kernel mode as a stream timeline picture"),
    "conformance": ("npusim.tools.conformance", "run PyTorch's OpInfo ops on npu and on CPU and compare"),
    "kernels": ("npusim.tools.kernels", "which file registers each aten op's npu kernel, and how it runs"),
    "calibrate": ("npusim.tools.calibrate", "the timing model's step figures beside public Ascend A2 training runs"),
    "ascend-tests": ("npusim.tools.ascend_tests", "run op-plugin's and torch_npu's own test files, count passes"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npusim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        sub_parser.set_defaults(_module=module_name)
        if name in (sys.argv[1:2] if argv is None else argv[:1]):
            importlib.import_module(module_name).add_arguments(sub_parser)
    args = parser.parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)
