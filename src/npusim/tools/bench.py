"""``python -m npusim bench NAME``: benchmarks. Each lives in ``npusim.bench.NAME``
with ``add_arguments(parser)`` and ``run(args) -> int``; results are printed as
a table and, where a plot makes sense, written as a PNG under ``--out``."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, str] = {
    "matmul": "npusim.bench.matmul",  # compute on npu vs CPU
    "sim-cost": "npusim.bench.sim_cost",  # every row of the simulation-cost table, npu vs CPU
    "chip-clock": "npusim.bench.chip_clock",  # a training step with the chip clock on vs off
    "foreach-copy": "npusim.bench.foreach_copy",  # _foreach_copy_ host time per route vs CPU native
    "fsdp-copy-in": "npusim.bench.fsdp_copy_in",  # host time blocked in all-gather copy-in
    "fsdp-step": "npusim.bench.fsdp_step",  # FSDP2 step time npu vs CPU+gloo
    "fsdp-enhance": "npusim.bench.fsdp_enhance",  # all-gathers / allocations with and without enhancements
    "compile": "npusim.bench.compile",  # torch.compile: first/cached compile, compiled vs eager, npu vs CPU
    "graph-replay": "npusim.bench.graph_replay",  # npu graph replay host time vs eager
    "rng": "npusim.bench.rng",  # host cost per random op, npu Philox generator vs CPU generator
    "eager-ops": "npusim.bench.eager_ops",  # one large eager op on npu, launch to completion, vs CPU
    "sanitizer": "npusim.bench.sanitizer",  # FSDP2 step time with the stream race sanitizer off / on
    "allocator": "npusim.bench.allocator",  # what the caching allocator holds for varying sizes; its host cost
    "plan": "npusim.bench.plan_scale",  # npusim plan of 8B over 64 ranks and 70B over 512: wall time, host RSS
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module_name in BENCHMARKS.items():
        bench_parser = sub.add_parser(name)
        bench_parser.add_argument("--out", default="bench-out", help="directory for plots and raw results")
        bench_parser.set_defaults(_bench_module=module_name)
        importlib.import_module(module_name).add_arguments(bench_parser)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._bench_module).run(args) or 0)
