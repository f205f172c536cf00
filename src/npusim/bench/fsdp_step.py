"""``python -m npusim bench fsdp-step``: FSDP2 step time on the simulated npu against CPU + gloo.

Two ranks join one process group with two backends, ``"cpu:gloo,npu:hccl"``,
and each builds the same small transformer twice from one seed (the model of
tests/test_fsdp2.py's transformer test: PyTorch's test ``Transformer``, tied
embedding and output weights, every block activation-checkpointed, no
dropout): one sharded with PyTorch's ``fully_shard`` over an npu mesh (the
hccl backend), one over a CPU mesh (gloo). Steps of the two alternate, and
which goes first alternates too, so both see the same machine load (docs/SPEC.md
section 6: a ratio of things measured side by side in one run). A step is
forward + backward + optimizer step, timed until its device work is done;
the median over the steps after warm-up is reported, with the ratio npu/cpu.
The losses of the two are compared every step, so both really train the same
model on the same data. The ranks meet in collectives, so both run the same
fixed number of steps and the per-step times become ``torch.utils.benchmark``
Measurements afterwards (an adaptive ``blocked_autorange`` would run a
different number of steps on each rank and deadlock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from npusim.bench.report import compare, measurement, measurement_bars, progress, save_plot
from npusim.testing.ranks import run_ranks

DEVICES = ("npu", "cpu")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (the test uses 2)")
    parser.add_argument("--batch", type=int, default=4, help="sequences of 16 tokens per rank and step")
    parser.add_argument("--steps", type=int, default=60, help="measured steps per device")
    parser.add_argument("--warmup", type=int, default=5, help="steps per device not measured")
    parser.add_argument("--copy-gbps", type=float, default=0.0,
                        help="npu timing model, device copy bandwidth in GB/s (default: off, device work "
                             "takes its real host time)")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds before the ranks are killed")


def _build(device: str, rank: int, world: int, args: argparse.Namespace) -> tuple[Any, torch.optim.Optimizer]:
    # Imported in the rank: at import it looks up the accelerator's default
    # backend, which npusim.distributed registers there.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    torch.manual_seed(0)  # same initial weights on both devices
    model = Transformer(ModelArgs(n_layers=args.layers, dropout_p=0.0, checkpoint_activations=True))
    model = model.to(torch.device(device, rank) if device == "npu" else device)
    # A world-sized mesh reuses the default group; its backend is picked by the tensors' device.
    mesh = init_device_mesh(device, (world,))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # As in the test: SGD with momentum (the update depends on the gradients' scale).
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)


def _step(model: Any, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> tuple[float, float]:
    """One training step; (seconds, loss). Timed until the npu's queued work is done."""
    from torch.nn.functional import cross_entropy

    start = time.perf_counter()
    out = model(tokens)
    loss = cross_entropy(out.flatten(0, 1).float(), tokens.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if tokens.device.type == "npu":
        torch.npu.synchronize()  # the comm and copy streams too, not only the current one
    elapsed = time.perf_counter() - start
    return elapsed, loss.item()


def _job(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    import npusim

    models = {d: _build(d, rank, world, args) for d in DEVICES}
    gen = torch.Generator().manual_seed(1 + rank)
    times: dict[str, list[float]] = {d: [] for d in DEVICES}
    losses: dict[str, list[float]] = {d: [] for d in DEVICES}
    with npusim.timing.model(copy_gbps=args.copy_gbps):
        for i in range(args.warmup + args.steps):
            if rank == 0 and i in (0, args.warmup):
                progress(2 if i == 0 else 3, 4, f"{args.warmup} warm-up steps per device" if i == 0 else
                         f"{args.steps} measured steps per device, npu and cpu taking turns")
            tokens = torch.randint(0, 8, (args.batch, 16), generator=gen)
            # Alternate which device goes first, so neither always runs right after the other.
            for d in DEVICES if i % 2 == 0 else DEVICES[::-1]:
                x = tokens.to(torch.device(d, rank) if d == "npu" else d)
                seconds, loss = _step(*models[d], x)
                losses[d].append(loss)
                if i >= args.warmup:
                    times[d].append(seconds)
    return {"times_s": times, "losses": losses}


def run(args: argparse.Namespace) -> int:
    if args.warmup < 0 or args.steps < 1:
        raise SystemExit(f"bench fsdp-step: expected --warmup >= 0 and --steps >= 1, got {args.warmup}, "
                         f"{args.steps}")
    progress(1, 4, f"2 ranks: test Transformer n_layers={args.layers}, sharded on an npu mesh and a CPU mesh")
    # Unbound (no device_id) as before: the group has a gloo side for the CPU mesh.
    ranks = run_ranks(_job, args, name="bench fsdp-step", backend="cpu:gloo,npu:hccl", bind_device=False,
                      timeout=args.timeout, pg_timeout=args.timeout)
    # Same model, data and optimizer: the two must train alike (float rounding aside).
    loss_diff = max(abs(a - b) for r in ranks for a, b in zip(r["losses"]["npu"], r["losses"]["cpu"], strict=True))
    if loss_diff > 1e-3:
        raise RuntimeError(f"bench fsdp-step: npu and cpu losses differ by {loss_diff:g}")
    progress(4, 4, "done")
    backends = {"npu": "npu + hccl", "cpu": "cpu + gloo"}
    ms = [measurement(r["times_s"][d], label="FSDP2 step (forward+backward+SGD step)", sub_label=f"rank {rank}",
                      description=backends[d], num_threads=1) for rank, r in enumerate(ranks) for d in DEVICES]
    compare(ms)
    med = [{d: statistics.median(r["times_s"][d]) * 1e3 for d in DEVICES} for r in ranks]
    timing = f"copy_gbps={args.copy_gbps:g}" if args.copy_gbps else "off"
    print(f"FSDP2 step (forward+backward+SGD step), 2 ranks, test Transformer n_layers={args.layers} dim=16 "
          f"seq=16 batch={args.batch}, every block checkpointed; median of {args.steps} steps after "
          f"{args.warmup} warm-up, npu and cpu steps interleaved; npu timing model {timing}; "
          f"max |loss npu - loss cpu| = {loss_diff:.1e}")
    print("| device | backend | rank 0 ms/step | rank 1 ms/step |")
    print("|---|---|---|---|")
    for d, backend in (("npu", "hccl"), ("cpu", "gloo")):
        print(f"| {d} | {backend} | {med[0][d]:.2f} | {med[1][d]:.2f} |")
    ratios = [m["npu"] / m["cpu"] for m in med]
    print(f"| npu/cpu | | {ratios[0]:.2f} | {ratios[1]:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
           "median_ms": med, "ratio_npu_cpu": ratios, "max_loss_diff": loss_diff, "ranks": ranks}
    (out / "fsdp-step.json").write_text(json.dumps(raw, indent=2, default=str))

    def draw(fig: Any) -> None:
        measurement_bars(fig.subplots(), ms, scale=1e3, unit="ms per step (median, interquartile whiskers)",
                         title=f"FSDP2 step, test Transformer n_layers={args.layers}: npu/cpu "
                               f"{ratios[0]:.2f} (rank 0), {ratios[1]:.2f} (rank 1)")

    save_plot(out / "fsdp-step.png", draw, size=(8, 2.8))
    return 0

