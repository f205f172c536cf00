"""``python -m npusim bench fsdp-copy-in``: host time blocked in FSDP2's all-gather copy-in.

FSDP2 prepares each all-gather on the host in two calls, both ending in a
same-device ``torch._foreach_copy_`` with non_blocking=False:
``_get_param_all_gather_inputs`` (the cast to the parameter dtype; only with a
mixed-precision ``param_dtype``) and ``torch.ops.fsdp.all_gather_copy_in`` (the
copy into the all-gather buffer). Whatever the host spends inside them is time
it cannot spend enqueueing the next work. Three configurations:

- ``aligned``: npusim's kernel (default); the fast path never waits.
- ``legacy``: the kernel before the change, which honours non_blocking=False by
  waiting for the copy (``foreach_copy_mode("legacy")``).
- ``legacy + patch``: legacy kernel with the old torch-npu patch, which forces
  non_blocking=True in the two calls (``historical_patch()``).

Two ranks train a TinyTransformer (every block checkpointed, one
``fully_shard`` per block plus the root) with the timing model on, so that a
device copy takes simulated time and a host wait for it shows up. The
configurations take turns step by step in one run, for fp32 and for bf16
parameters (fp32 reduction). The two calls are timed by wrapping them in the
rank processes for the duration of a step only; the wrappers and the patch are
removed before the next step. The ranks meet in collectives, so both run the
same fixed number of steps; the per-step times become ``torch.utils.benchmark``
Measurements afterwards for the Compare tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from npusim.bench.report import bars, compare, figure_legend, measurement, progress, save_plot
from npusim.testing.ranks import run_ranks

CONFIGS = ("aligned", "legacy", "legacy + patch")
DTYPES = ("fp32", "bf16")  # parameter dtype for compute (and thus for the all-gather)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=256, help="model width")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    parser.add_argument("--steps", type=int, default=15, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="steps per configuration not measured")
    parser.add_argument("--copy-gbps", type=float, default=2.0, help="timing model: device copy bandwidth, GB/s")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds before the ranks are killed")


@contextmanager
def _timed_copy_in(acc: dict[str, float]) -> Iterator[None]:
    """Adds the host seconds spent in the two copy-in calls to ``acc``; restores both on exit.

    Wraps whatever is installed (upstream or the historical patch), so it must
    be entered after the patch and left before it.
    """
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - start
                acc[key + " calls"] += 1

        return wrapper

    real_inputs = _fsdp_collectives._get_param_all_gather_inputs
    # foreach_all_gather looks both up at call time: the module global and the
    # op namespace attribute (an OpOverloadPacket, dispatching to the kernel).
    real_copy_in = torch.ops.fsdp.all_gather_copy_in
    _fsdp_collectives._get_param_all_gather_inputs = timed("inputs", real_inputs)
    torch.ops.fsdp.all_gather_copy_in = timed("copy_in", real_copy_in)
    try:
        yield
    finally:
        _fsdp_collectives._get_param_all_gather_inputs = real_inputs
        torch.ops.fsdp.all_gather_copy_in = real_copy_in


def _configure(stack: ExitStack, config: str) -> None:
    import npusim
    from npusim.distributed.historical_patch import historical_patch

    if config != "aligned":
        stack.enter_context(npusim.ops.foreach_copy_mode("legacy"))
    if config == "legacy + patch":
        stack.enter_context(historical_patch())


def _job(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch.nn.functional as F  # noqa: N812

    import npusim
    from npusim.testing.fsdp_harness import Setup, shard
    from npusim.testing.models import TinyTransformer

    device = torch.device("npu", rank)
    vocab = 64
    models = {}
    for dtype in DTYPES:
        torch.manual_seed(0)
        model = TinyTransformer(vocab=vocab, dim=args.dim, heads=4, seq=args.seq, n_blocks=args.blocks).to(device)
        # PyTorch's own fully_shard (no enhancement layer); no explicit prefetch.
        shard(model, Setup(prefetch=False, mixed_precision=dtype == "bf16"), None)
        models[dtype] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(rank)
    samples: dict[str, list[dict[str, Any]]] = {f"{d}|{c}": [] for d in DTYPES for c in CONFIGS}
    with npusim.timing.model(copy_gbps=args.copy_gbps):
        for i in range(args.warmup + args.steps):
            if rank == 0 and i in (0, args.warmup):
                progress(2 if i == 0 else 3, 4, f"{args.warmup} warm-up steps" if i == 0 else
                         f"{args.steps} measured steps, each: {' / '.join(DTYPES)} x {' / '.join(CONFIGS)}")
            for dtype in DTYPES:
                model, opt = models[dtype]
                for config in CONFIGS:
                    idx = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=gen).to(device)
                    acc = {"inputs": 0.0, "inputs calls": 0, "copy_in": 0.0, "copy_in calls": 0}
                    with ExitStack() as stack, npusim.ops.trace_foreach_copy() as calls:
                        _configure(stack, config)
                        stack.enter_context(_timed_copy_in(acc))
                        start = time.perf_counter()
                        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
                        loss.backward()
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                        torch.npu.synchronize()  # every stream idle: the next step starts clean
                        acc["step"] = time.perf_counter() - start
                    acc["non_blocking"] = sorted({c.non_blocking for c in calls})
                    acc["routes"] = sorted({r for c in calls for r in c.routes})
                    if i >= args.warmup:
                        samples[f"{dtype}|{config}"].append(acc)
    return samples


def _median_ms(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(s[key] for s in samples) * 1e3


def run(args: argparse.Namespace) -> int:
    if args.warmup < 0 or args.steps < 1:
        raise SystemExit(f"bench fsdp-copy-in: expected --warmup >= 0 and --steps >= 1, got {args.warmup}, "
                         f"{args.steps}")
    progress(1, 4, f"2 ranks: TinyTransformer dim={args.dim} blocks={args.blocks}, timing model "
             f"copy_gbps={args.copy_gbps:g}")
    ranks = run_ranks(_job, args, name="bench fsdp-copy-in", backend="hccl", bind_device=False,
                      timeout=args.timeout, pg_timeout=args.timeout)
    rows = []
    for dtype in DTYPES:
        base = None
        for config in CONFIGS:
            s = ranks[0][f"{dtype}|{config}"]
            for one in s:
                one["total"] = one["inputs"] + one["copy_in"]
            row = {"param dtype": dtype, "config": config,
                   "inputs ms": _median_ms(s, "inputs"), "copy_in ms": _median_ms(s, "copy_in"),
                   "total ms": _median_ms(s, "total"), "step ms": _median_ms(s, "step"),
                   "calls/step": (s[0]["inputs calls"], s[0]["copy_in calls"]),
                   "non_blocking": sorted({nb for one in s for nb in one["non_blocking"]}),
                   "routes": sorted({r for one in s for r in one["routes"]})}
            if base is None:
                base = row["total ms"]
            row["vs aligned"] = row["total ms"] / base
            rows.append(row)
    progress(4, 4, "done")
    compare([measurement([one[key] for one in ranks[0][f"{dtype}|{config}"]], label=label,
                         sub_label=f"{dtype} parameters", description=config, num_threads=1)
             for key, label in (("total", "all-gather copy-in host time per step, rank 0 of 2"),
                                ("step", "step time, rank 0 of 2"))
             for dtype in DTYPES for config in CONFIGS])
    print(f"FSDP2 all-gather copy-in host time per step, rank 0 of 2; TinyTransformer dim={args.dim} "
          f"blocks={args.blocks} seq={args.seq} batch={args.batch}, every block checkpointed; timing model "
          f"copy_gbps={args.copy_gbps:g}; median of {args.steps} steps after {args.warmup} warm-up, "
          f"configurations interleaved step by step")
    header = ("param dtype", "config", "_get_param_all_gather_inputs ms", "all_gather_copy_in ms", "copy-in ms",
              "vs aligned", "step ms", "calls/step", "_foreach_copy_ non_blocking", "routes")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print(f"| {r['param dtype']} | {r['config']} | {r['inputs ms']:.2f} | {r['copy_in ms']:.2f} | "
              f"{r['total ms']:.2f} | {r['vs aligned']:.2f} | {r['step ms']:.1f} | "
              f"{r['calls/step'][0]} + {r['calls/step'][1]} | {', '.join(map(str, r['non_blocking']))} | "
              f"{', '.join(r['routes'])} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "rows": rows, "ranks": ranks}
    (out / "fsdp-copy-in.json").write_text(json.dumps(raw, indent=2, default=str))
    _plot(rows, f"FSDP2 all-gather copy-in, rank 0 of 2, timing model copy_gbps={args.copy_gbps:g}",
          out / "fsdp-copy-in.png")
    return 0


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    def value(dtype: str, config: str, key: str) -> float:
        return next(r[key] for r in rows if r["param dtype"] == dtype and r["config"] == config)

    def draw(fig: Any) -> None:
        copy_ax, step_ax = fig.subplots(1, 2)
        for ax, key, xlabel in ((copy_ax, "total ms", "host ms per step in the two copy-in calls (median)"),
                                (step_ax, "step ms", "step ms (median)")):
            bars(ax, list(CONFIGS), {f"{d} parameters": [value(d, c, key) for c in CONFIGS] for d in DTYPES},
                 xlabel=xlabel, legend=False)
        fig.suptitle(title, fontsize=10, x=0.02, ha="left")
        figure_legend(fig, copy_ax)

    save_plot(path, draw, size=(11, 3))
