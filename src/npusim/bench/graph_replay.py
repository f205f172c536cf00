"""``python -m npusim bench graph-replay``: host time of an npu graph replay vs eager.

An MLP step is run eagerly and as a captured npu graph, side by side in one
run (``torch.utils.benchmark``). Host time is what the calling thread spends
issuing the step (eager compute runs on the host, a replay only enqueues one
task), as wall time and as the host thread's CPU time (robust when stream
workers compete with the host for cores); end-to-end time adds the wait for
the device. Four steps: a no-grad
forward captured with ``torch.npu.graph``, a whole forward+backward captured
with ``torch.npu.graph``, a forward+backward through
``torch.npu.make_graphed_callables``, and a forward+backward compiled with
``torch.compile(mode="reduce-overhead")`` (npu graph trees,
:mod:`npusim.compile.graph_trees`), which is also measured compiled with the
default mode (inductor without graphs) for comparison.

Wall times are ``blocked_autorange`` medians after a warm-up (the host-time
measurement drains the queue before and after); CPU time is fixed-size
batches timed with ``time.thread_time`` (``report.repeated``), drained in
between.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import benchmark

from npusim.bench.report import bars, compare, progress, repeated, save_plot, timed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds per measurement")


def _host_cpu(fn: Callable[[], object], sync: Callable[[], None], label: str, sub_label: str,
              calls: int = 50, repeats: int = 7) -> benchmark.Measurement:
    """The host thread's CPU time per call (time.thread_time), over batches of ``calls``.

    Fixed-size batches drained in between: a CPU-time budget would queue
    millions of replays, as a replay costs the host almost nothing.
    """
    m = repeated(fn, repeats=repeats, number=calls, setup=sync, clock=time.thread_time, warmup=False,
                 label=label, sub_label=sub_label, description="host cpu")
    sync()
    return m


def _model(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks).to("npu")


def measure(width: int, batch: int, layers: int, min_run_time: float,
            measurements: list[benchmark.Measurement] | None = None) -> list[dict[str, float | str | None]]:
    """One row per step (forward, fwd+bwd, compiled fwd+bwd); appends their Measurements to ``measurements``."""
    import npusim  # noqa: F401  (registers the npu device)

    kept = measurements if measurements is not None else []

    sync = torch.npu.synchronize
    rows: list[dict[str, float | str | None]] = []

    progress(1, 5, "forward captured with torch.npu.graph: eager vs replay, host / host cpu / end-to-end")
    model = _model(width, layers)
    x = torch.randn(batch, width, device="npu")
    with torch.no_grad():
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            static_y = model(x)
        g.replay()
        sync()
        equal = torch.allclose(static_y.cpu(), model(x).cpu())
        rows.append(_row("forward (torch.npu.graph)", g.num_tasks(), equal, min_run_time, kept,
                         eager=lambda: model(x), replay=g.replay, sync=sync))

    progress(2, 5, "fwd+bwd captured whole with torch.npu.graph (gradients in the graph's pool): eager vs replay")
    rows.append(_whole_step_row(x, width, layers, min_run_time, kept, sync))

    progress(3, 5, "fwd+bwd through torch.npu.make_graphed_callables: eager vs replay")

    eager_model = _model(width, layers)
    graphed_model = torch.npu.make_graphed_callables(copy.deepcopy(eager_model), (x.clone().requires_grad_(),))
    xg = x.clone().requires_grad_()

    def step(m: nn.Module) -> Callable[[], None]:
        return lambda: m(xg).square().mean().backward()

    step(eager_model)()
    step(graphed_model)()
    sync()
    equal = all(torch.allclose(a.grad.cpu(), b.grad.cpu(), rtol=1e-4, atol=1e-6)
                for a, b in zip(eager_model.parameters(), graphed_model.parameters(), strict=True))
    rows.append(_row("fwd+bwd (make_graphed_callables)", None, equal, min_run_time, kept,
                     eager=step(eager_model), replay=step(graphed_model), sync=sync))

    progress(4, 5, "fwd+bwd compiled: eager vs mode='reduce-overhead' (npu graph trees) vs default compile")
    rows.append(_reduce_overhead_row(eager_model, xg, min_run_time, kept, sync))
    return rows


def _whole_step_row(x: torch.Tensor, width: int, layers: int, min_run_time: float,
                    kept: list[benchmark.Measurement], sync: Callable[[], None]) -> dict[str, float | str | None]:
    """The whole fwd+bwd captured in one graph (the gradients are its outputs, allocated in its pool, as in
    PyTorch's whole-network capture); eager runs the same step from no gradients."""
    eager_model, graphed_model = _model(width, layers), _model(width, layers)

    def eager_step() -> None:
        for p in eager_model.parameters():
            p.grad = None
        eager_model(x).square().mean().backward()

    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):  # warm-up off the capture, as PyTorch's whole-network recipe
        for _ in range(3):
            graphed_model.zero_grad(set_to_none=True)
            graphed_model(x).square().mean().backward()
    torch.npu.current_stream().wait_stream(side)
    graphed_model.zero_grad(set_to_none=True)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        graphed_model(x).square().mean().backward()
    eager_step()
    g.replay()
    sync()
    equal = all(torch.allclose(a.grad.cpu(), b.grad.cpu(), rtol=1e-4, atol=1e-6)
                for a, b in zip(eager_model.parameters(), graphed_model.parameters(), strict=True))
    row = _row("fwd+bwd (torch.npu.graph)", g.num_tasks(), equal, min_run_time, kept,
               eager=eager_step, replay=g.replay, sync=sync)
    # The graph's tasks per depth of its DAG (Note [Replaying independent tasks at once]).
    row["replay_levels"] = str(g.replay_levels())
    return row


def _reduce_overhead_row(eager_model: nn.Module, xg: torch.Tensor, min_run_time: float,
                         kept: list[benchmark.Measurement], sync: Callable[[], None]) -> dict[str, float | str | None]:
    """The compiled fwd+bwd step: eager, reduce-overhead (the "replay" columns), default compile."""
    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).square().mean()

    torch._dynamo.reset()
    models = {mode: copy.deepcopy(eager_model) for mode in ("reduce-overhead", "default")}
    steps = {}
    for mode, model in models.items():
        compiled = torch.compile(loss, mode=mode)
        steps[mode] = (lambda m, c: lambda: c(m, xg).backward())(model, compiled)
        for _ in range(3):  # compile, warm-up run, recording
            steps[mode]()
    eager_step = lambda: loss(eager_model, xg).backward()  # noqa: E731
    for p in (*eager_model.parameters(), *(q for m in models.values() for q in m.parameters())):
        p.grad = None
    for fn in (eager_step, *steps.values()):
        fn()  # one step each from zero gradients: the gradients compared below
    sync()
    equal = all(torch.allclose(a.grad.cpu(), b.grad.cpu(), rtol=1e-4, atol=1e-6)
                for a, b in zip(eager_model.parameters(), models["reduce-overhead"].parameters(), strict=True))
    row = _row("fwd+bwd (reduce-overhead)", None, equal, min_run_time, kept,
               eager=eager_step, replay=steps["reduce-overhead"], sync=sync)
    _measure_kind(row, "compiled", "fwd+bwd (default compile)", steps["default"], min_run_time, kept, sync)
    return row


def graph_replays_per_call(fn: Callable[[], object], sync: Callable[[], None]) -> int:
    """How many npu graph replays one call of ``fn`` runs: its "graph_replay" device activities under
    torch.profiler (a step that replays no graph counts 0, so a row that silently ran eager shows it)."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        fn()
        sync()
    return sum(1 for e in prof.events() if e.name == "graph_replay" and e.device_type != torch.autograd.DeviceType.CPU)


def _row(name: str, tasks: int | None, equal: bool, min_run_time: float, kept: list[benchmark.Measurement], *,
         eager: Callable[[], object], replay: Callable[[], object], sync: Callable[[], None]
         ) -> dict[str, float | str | None]:
    # graph_tasks: the captured graph's tasks where the bench holds the graph (None where the graphs are inside
    # make_graphed_callables or the graph trees); graph_replays_per_step: replays one replayed step runs.
    row: dict[str, float | str | None] = {"step": name, "graph_tasks": tasks, "equal": str(equal),
                                          "graph_replays_per_step": graph_replays_per_call(replay, sync)}
    for kind, fn in (("eager", eager), ("replay", replay)):
        _measure_kind(row, kind, f"{name}, {kind}", fn, min_run_time, kept, sync)
    row["host_cpu_ratio"] = row["replay_host_cpu_us"] / row["eager_host_cpu_us"]  # type: ignore[operator]
    return row


def _measure_kind(row: dict[str, float | str | None], kind: str, sub_label: str, fn: Callable[[], object],
                  min_run_time: float, kept: list[benchmark.Measurement], sync: Callable[[], None]) -> None:
    """Adds ``<kind>_host_us``, ``<kind>_host_cpu_us`` and ``<kind>_e2e_us`` of ``fn`` to ``row``."""
    def with_sync() -> None:
        fn()
        sync()  # inside the timed statement: the device work is done

    # Host time: drain between measurements so that the queue does not grow without bound.
    kept.append(timed(fn, label="host time", sub_label=sub_label, description="host", min_run_time=min_run_time))
    sync()
    row[f"{kind}_host_us"] = kept[-1].median * 1e6
    kept.append(_host_cpu(fn, sync, "host time", sub_label))
    row[f"{kind}_host_cpu_us"] = kept[-1].median * 1e6
    kept.append(timed(with_sync, label="host time", sub_label=sub_label, description="end-to-end",
                      min_run_time=min_run_time))
    row[f"{kind}_e2e_us"] = kept[-1].median * 1e6


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    def draw(fig: Any) -> None:
        axes = fig.subplots(1, len(rows), squeeze=False)[0]
        for ax, r in zip(axes, rows, strict=True):
            kinds = {"host": "host", "host cpu": "host_cpu", "end-to-end": "e2e"}
            bars(ax, list(kinds), {k: [r[f"{k}_{v}_us"] for v in kinds.values()] for k in ("eager", "replay")},
                 xlabel="us per step (median)", title=f"{r['step']}: host cpu ratio {r['host_cpu_ratio']:.3f}")
        fig.suptitle(title, fontsize=10)

    save_plot(path, draw, size=(11, 3.2))


def run(args: argparse.Namespace) -> int:
    measurements: list[benchmark.Measurement] = []
    rows = measure(args.width, args.batch, args.layers, args.min_run_time, measurements)
    progress(5, 5, "done")
    compare(measurements)
    title = (f"MLP {args.layers}x Linear({args.width}, {args.width}) + ReLU, batch {args.batch}; "
             f"medians, {torch.get_num_threads()} threads")
    print(title)
    print(f"{'step':<34}{'host us':>16}{'host cpu us':>16}{'cpu ratio':>10}{'end-to-end us':>16}  equal")
    print(f"{'':<34}{'eager / replay':>16}{'eager / replay':>16}{'':>10}{'eager / replay':>16}")
    for r in rows:
        print(f"{r['step']:<34}{r['eager_host_us']:>8.0f}{r['replay_host_us']:>8.0f}"
              f"{r['eager_host_cpu_us']:>8.0f}{r['replay_host_cpu_us']:>8.0f}{r['host_cpu_ratio']:>10.3f}"
              f"{r['eager_e2e_us']:>8.0f}{r['replay_e2e_us']:>8.0f}  {r['equal']}"
              f"  ({r['graph_replays_per_step']} graph replays per replayed step)")
        if "compiled_host_us" in r:  # the same step compiled in the default mode (no graphs)
            print(f"{'  default compile (no graphs)':<34}{r['compiled_host_us']:>16.0f}"
                  f"{r['compiled_host_cpu_us']:>16.0f}"
                  f"{'':>10}{r['compiled_e2e_us']:>16.0f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph_replay.json").write_text(json.dumps({**vars(args), "rows": rows}, default=str, indent=1))
    _plot(rows, title, out / "graph_replay.png")
    return 0 if all(r["equal"] == "True" for r in rows) else 1
