"""What every benchmark shares: progress lines, ``torch.utils.benchmark`` measurements, the PNG.

Three ways to get a :class:`torch.utils.benchmark.Measurement`, by what the
benchmark needs:

- :func:`timed`: ``Timer`` with a warm-up and ``blocked_autorange``, for
  statements that can run any number of times in one process;
- :func:`repeated`: a fixed number of timed runs, each after an untimed
  ``setup`` (the standard library's ``timeit.Timer.repeat``, which the
  ``Timer`` wraps), for samples that must start from idle streams;
- :func:`measurement`: per-step times the benchmark took itself, for loops
  whose step count must be fixed: ranks that meet in collectives would
  deadlock if an adaptive loop ran a different number of steps on each, and
  configurations that take turns step by step share the machine's load.

:func:`interleaved` times several statements taking turns call by call (for
:func:`measurement`). :func:`compare` prints PyTorch's ``Compare`` table;
:func:`save_plot` writes the PNG (matplotlib, Agg backend) or says that
matplotlib is missing; :func:`bars`, :func:`measurement_bars` and
:func:`figure_legend` draw the grouped bar charts most benchmarks plot.
"""

from __future__ import annotations

import json
import statistics
import time
import timeit
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils import benchmark

PLOT_MISSING = "matplotlib is not installed (pip install 'npusim[plot]'): {name} not written"


def progress(step: int, total: int, what: str) -> None:
    """Prints ``[step/total] what`` at once, so that a long run shows where it is."""
    print(f"[{step}/{total}] {what}", flush=True)


def _spec(stmt: str, label: str, sub_label: str, description: str, num_threads: int | None) -> benchmark.TaskSpec:
    return benchmark.TaskSpec(stmt=stmt, setup="pass", label=label, sub_label=sub_label, description=description,
                              num_threads=torch.get_num_threads() if num_threads is None else num_threads)


def measurement(seconds: Sequence[float], *, label: str, sub_label: str, description: str, stmt: str = "step()",
                num_threads: int | None = None) -> benchmark.Measurement:
    """A Measurement of one run per entry of ``seconds`` (its median is the median of ``seconds``).

    ``num_threads`` is what the runs used; None means this process's current
    ``torch.get_num_threads()``.
    """
    if not seconds:
        raise ValueError(f"measurement {label!r} / {sub_label!r} / {description!r}: expected at least one time, "
                         f"got none")
    return benchmark.Measurement(number_per_run=1, raw_times=list(seconds),
                                 task_spec=_spec(stmt, label, sub_label, description, num_threads))


def timed(fn: Callable[[], object], *, label: str, sub_label: str, description: str, min_run_time: float,
          num_threads: int | None = None, warmup: int = 3) -> benchmark.Measurement:
    """``Timer(fn()).blocked_autorange(min_run_time)`` after ``warmup`` untimed calls (first-call paths,
    allocations). ``num_threads`` as in :func:`measurement`: unlike the Timer's default of 1, the
    threads the rest of the benchmark runs with."""
    threads = torch.get_num_threads() if num_threads is None else num_threads
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label, sub_label=sub_label,
                            description=description, num_threads=threads)
    if warmup:
        timer.timeit(warmup)
    return timer.blocked_autorange(min_run_time=min_run_time)


def repeated(fn: Callable[[], object], *, repeats: int, label: str, sub_label: str, description: str,
             number: int = 1, setup: Callable[[], object] | None = None,
             clock: Callable[[], float] = time.perf_counter, warmup: bool = True) -> benchmark.Measurement:
    """``repeats`` timed runs of ``number`` calls each, every run after an untimed ``setup()``
    (e.g. draining the streams); one warm-up call first unless ``warmup`` is False. ``clock``
    may be ``time.thread_time`` to count the calling thread's CPU time instead of wall time."""
    if warmup:
        fn()
    timer = timeit.Timer(fn, setup=setup or (lambda: None), timer=clock)
    runs = timer.repeat(repeat=repeats, number=number)
    return benchmark.Measurement(number_per_run=number, raw_times=runs,
                                 task_spec=_spec("fn()", label, sub_label, description, None))


def interleaved(fns: Mapping[str, Callable[[], object]], steps: int, warmup: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions taking turns call by call.

    Which goes first alternates from one round to the next, so that none always
    runs right after another; the first ``warmup`` rounds are not kept. Each
    function shares the cores with the threads the one before it left spinning
    (Note [Each device in a process of its own], bench/sim_cost.py), so this
    suits functions compared call by call, not the cost of a loop of one.
    """
    timers = {name: timeit.Timer(fn) for name, fn in fns.items()}
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + steps):
        for name in names if i % 2 == 0 else names[::-1]:
            seconds = timers[name].timeit(1)
            if i >= warmup:
                times[name].append(seconds)
    return times


def compare(measurements: Sequence[benchmark.Measurement]) -> None:
    """Prints PyTorch's Compare table: one table per label, a row per sub_label, a column per description."""
    print()
    benchmark.Compare(list(measurements)).print()


def quartiles(m: benchmark.Measurement) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile) of a measurement's per-run times, seconds."""
    times = m.times
    if len(times) < 2:
        return times[0], times[0], times[0]
    q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive")  # linear, as Measurement's quantiles
    return q1, q2, q3


def save_plot(path: Path, draw: Callable[[Any], None], size: tuple[float, float] = (8.0, 4.5)) -> bool:
    """Writes the figure that ``draw(figure)`` fills as a PNG at ``path``; says where, or that
    matplotlib is missing (then writes nothing and returns False)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: benchmarks run on headless machines
        import matplotlib.pyplot as plt
    except ImportError:
        print(PLOT_MISSING.format(name=path.name), flush=True)
        return False
    fig = plt.figure(figsize=size)
    try:
        draw(fig)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    print(f"plot: {path}", flush=True)
    return True


def bars(ax: Any, groups: Sequence[str], series: Mapping[str, Sequence[float]], *, xlabel: str, title: str = "",
         errors: Mapping[str, Sequence[tuple[float, float]]] | None = None, ref: float | None = None,
         log: bool = False, legend: bool = True) -> None:
    """Horizontal grouped bars: one group per entry of ``groups`` (top to bottom), one bar per
    series in each. ``errors`` gives (low, high) whiskers per bar; ``ref`` draws a vertical line;
    ``legend=False`` leaves the legend to the caller (one for several panels)."""
    height = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ys = [g + (i - (len(series) - 1) / 2) * height for g in range(len(groups))]
        xerr = None
        if errors and name in errors:
            xerr = [[max(0.0, v - lo) for v, (lo, _) in zip(values, errors[name], strict=True)],
                    [max(0.0, hi - v) for v, (_, hi) in zip(values, errors[name], strict=True)]]
        ax.barh(ys, values, height=height, xerr=xerr, capsize=2, label=name)
    ax.set_yticks(range(len(groups)), groups, fontsize=8)
    ax.invert_yaxis()
    if ref is not None:
        ax.axvline(ref, color="grey", linewidth=0.8)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title, fontsize=10)
    if legend and len(series) > 1:
        ax.legend(fontsize=8)


def figure_legend(fig: Any, ax: Any) -> None:
    """One legend for all panels, in the figure's top right corner (the panels share their series)."""
    fig.legend(*ax.get_legend_handles_labels(), loc="upper right", ncol=4, fontsize=8, frameon=False)


def measurement_bars(ax: Any, measurements: Sequence[benchmark.Measurement], *, scale: float, unit: str,
                     title: str = "") -> None:
    """:func:`bars` of measurements' medians (times ``scale``) with interquartile whiskers: a group
    per sub_label, a series per description (the layout of the Compare table); every
    (sub_label, description) pair must be there."""
    groups = list(dict.fromkeys(m.task_spec.sub_label or "" for m in measurements))
    names = list(dict.fromkeys(m.task_spec.description or "" for m in measurements))
    q = {(m.task_spec.sub_label or "", m.task_spec.description or ""): [v * scale for v in quartiles(m)]
         for m in measurements}
    series = {n: [q[(g, n)][1] for g in groups] for n in names}
    errors = {n: [(q[(g, n)][0], q[(g, n)][2]) for g in groups] for n in names}
    bars(ax, groups, series, xlabel=unit, title=title, errors=errors)


class OpCase(NamedTuple):
    """One op of a per-op benchmark: ``make(device, numel)`` gives the call to time on that device."""

    name: str
    route: str  # how the npu op does its work, for the table
    make: Callable[[str, int], Callable[[], object]]


def measure_ops(cases: Sequence[OpCase], sizes: Sequence[int], *, label: str, min_run_time: float,
                kept: list[benchmark.Measurement]) -> list[dict[str, object]]:
    """Each case's call on npu beside the same call on CPU, per size, timed with :func:`timed`; one row per
    case and size ({op, numel, npu_us, cpu_us, ratio, route}); the Measurements go to ``kept``."""
    rows: list[dict[str, object]] = []
    for step, case in enumerate(cases, start=1):
        progress(step, len(cases) + 1, f"{case.name} on sizes {list(sizes)}, npu then CPU")
        for numel in sizes:
            sub = f"{case.name}, {numel}"
            npu, cpu = (timed(case.make(device, numel), label=label, sub_label=sub, description=device,
                              min_run_time=min_run_time) for device in ("npu", "cpu"))
            kept += [npu, cpu]
            rows.append({"op": case.name, "numel": numel, "npu_us": npu.median * 1e6, "cpu_us": cpu.median * 1e6,
                         "ratio": npu.median / cpu.median, "route": case.route})
    return rows


def plot_op_ratios(rows: Sequence[Mapping[str, Any]], *, xlabel: str, title: str, path: Path,
                   log: bool = False) -> None:
    """The rows of :func:`measure_ops` as bars of npu / CPU per op, one bar per size."""
    ops = list(dict.fromkeys(r["op"] for r in rows))
    sizes = list(dict.fromkeys(r["numel"] for r in rows))
    ratio = {(r["op"], r["numel"]): r["ratio"] for r in rows}

    def draw(fig: Any) -> None:
        bars(fig.subplots(), ops, {f"{n} elements": [ratio[(op, n)] for op in ops] for n in sizes},
             xlabel=xlabel, title=title, ref=1.0, log=log)

    save_plot(path, draw, size=(8, 0.5 * len(ops) * max(1, len(sizes)) + 1.2))


def report_op_rows(rows: Sequence[Mapping[str, Any]], args: Any, name: str, *, title: str, route_header: str) -> Path:
    """Prints the rows of :func:`measure_ops` under ``title`` and writes them with ``args`` to
    ``args.out/NAME.json``; returns the directory (for the plot)."""
    print(title)
    print(f"{'op':<18}{'numel':>9}{'npu us':>10}{'cpu us':>10}{'npu/cpu':>9}  {route_header}")
    for r in rows:
        print(f"{r['op']:<18}{r['numel']:>9}{r['npu_us']:>10.1f}{r['cpu_us']:>10.1f}{r['ratio']:>9.2f}  {r['route']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({**vars(args), "rows": list(rows)}, default=str, indent=1))
    return out
