"""The report as people read it: the table of every rank, the memory plot, the combined report.json."""

from __future__ import annotations

import json
import time as time_module
from pathlib import Path
from typing import Any

__all__ = ["format_table", "lead_rank", "plot_memory", "print_table", "read_rank_reports"]

PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:,.1f} MiB"


def _at(where: dict[str, Any]) -> str:
    text = f"{where.get('phase', '?')} / {where.get('module', '-')}"
    if where.get("at_step_start"):
        text += " (step start)"
    return text


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


def format_table(reports: list[dict[str, Any]]) -> str:
    """The table of every rank's step (one line each), then rank 0's (or the first's) peaks by phase and
    largest allocations."""
    if not reports:
        return "npusim report: no rank's report"
    first = reports[0]
    head = (f"npusim {first.get('mode', 'report')}: step {first['step']}"
            f"{'' if first['step_complete'] else ' (unfinished)'} of {first['steps_run']} run"
            f"{' (' + first['step_note'] + ')' if first.get('step_note') else ''}; "
            f"{first['world_size']} rank(s); profile {first['profile']['name']} ({first['profile']['soc_name']}, "
            f"{first['profile']['total_memory'] / 2**30:.0f} GiB); chip time")
    columns = ("rank", "peak allocated", "at (phase / module)", "peak reserved", "at (phase / module)", "step ms",
               "computing", "unhidden comm", "free", "MFU")
    rows = []
    for r in reports:
        mem, t = r["memory"], r["time"]
        step = t["step_us"]
        rows.append((str(r["rank"]), _mib(mem["peak_allocated"]), _at(mem["peak_allocated_at"]),
                     _mib(mem["peak_reserved"]), _at(mem["peak_reserved_at"]), f"{step / 1e3:.3f}",
                     _pct(t["computing_us"], step), _pct(t["communication_not_overlapped_us"], step),
                     _pct(t["free_us"], step), "-" if r.get("mfu") is None else f"{100 * r['mfu']:.2f} %"))
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i not in (2, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                                      strict=True)))

    out = [head, line(columns), line(tuple("-" * w for w in widths)), *(line(row) for row in rows)]
    for r in reports:
        if r.get("error"):
            at = r.get("stopped_at") or {}
            out.append(f"rank {r['rank']} stopped in step {at.get('step', '?')} {_at(at)}: {r['error']}")
    mem = first["memory"]
    phases = ", ".join(f"{phase} {_mib(v['peak_allocated'])} ({v['module']})" for phase, v in mem["by_phase"].items())
    out.append(f"rank {first['rank']} peak allocated by phase: {phases or '-'}")
    if mem["largest_allocations"]:
        out.append(f"rank {first['rank']} largest of the {mem['live_at_peak']} allocations live at its peak:")
        for a in mem["largest_allocations"]:
            out.append(f"  {_mib(a['bytes']):>12}  step {a['step']} {a['phase']} / {a['module']}  {a['op'] or '-'}")
    return "\n".join(out)


def lead_rank(options: Any) -> int:
    """The rank that prints progress and the table (``options``: a ReportOptions): 0, or the first rank
    plan mode runs."""
    return options.ranks[0] if options.ranks else 0


def read_rank_reports(out: str, ranks: list[int], wait_s: float, job: str) -> list[dict[str, Any]]:
    """The report.json of run ``job`` of each of ``ranks`` under ``out`` that appears within ``wait_s``
    seconds, in rank order."""
    deadline = time_module.monotonic() + wait_s
    found: dict[int, dict[str, Any]] = {}
    while True:
        for rank in ranks:
            path = Path(out) / f"rank{rank}" / "report.json"
            if rank not in found and path.exists():
                try:
                    report = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if report.get("run_id") == job:
                    found[rank] = report
        if len(found) == len(ranks) or time_module.monotonic() >= deadline:
            return [found[r] for r in sorted(found)]
        time_module.sleep(0.2)


def print_table(report: dict[str, Any], options: Any, rank: int) -> None:
    """Rank 0 prints the table of all ranks it can read (its own if none other) and writes OUT/report.json
    with all of them when the world has several ranks; other ranks print nothing."""
    if rank != lead_rank(options):
        return

    reports = [report]
    world = report["world_size"]
    if world > 1:
        ranks = list(options.ranks) if options.ranks is not None else list(range(world))
        reports = read_rank_reports(options.out, ranks, options.wait_s, report["run_id"]) or [report]
        combined = Path(options.out) / "report.json"
        combined.write_text(json.dumps({"world_size": world, "ranks": reports}, indent=1, default=str))
        if len(reports) < len(ranks):
            print(f"npusim report: {len(reports)} of {len(ranks)} ranks' reports found in {options.out} "
                  f"within {options.wait_s:g} s", flush=True)
    print(format_table(reports), flush=True)
    print(f"npusim report: wrote {report['out']}/ (report.json, memory.png, snapshot.pickle, trace.json)"
          + (f" and {options.out}/report.json" if world > 1 else ""), flush=True)


def plot_memory(path: Path, report: dict[str, Any], series: list[tuple[float, int, int]],
                phase_spans: list[tuple[str, float, float]]) -> None:
    """Allocated and reserved over the step (chip time), the phases shaded, the peak marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.2))
    origin = series[0][0] if series else 0.0
    if series:
        xs = [(c - origin) / 1e3 for c, _, _ in series]
        ax.step(xs, [a / 2**20 for _, a, _ in series], where="post", label="allocated", color="black")
        ax.step(xs, [r / 2**20 for _, _, r in series], where="post", label="reserved", color="tab:red", alpha=0.7)
    seen = set()
    for phase, start, end in phase_spans:
        ax.axvspan((start - origin) / 1e3, (end - origin) / 1e3, color=PHASE_COLORS.get(phase, "tab:gray"), alpha=0.12,
                   label=phase if phase not in seen else None)
        seen.add(phase)
    mem = report["memory"]
    at = mem["peak_allocated_at"]
    ax.scatter([(at["chip_us"] - origin) / 1e3 if at.get("chip_us") else 0.0], [mem["peak_allocated"] / 2**20],
               color="black", zorder=5, marker="v")
    ax.annotate(f"peak {_mib(mem['peak_allocated'])}\n{_at(at)}", ((at["chip_us"] - origin) / 1e3 if at.get("chip_us")
                else 0.0, mem["peak_allocated"] / 2**20), textcoords="offset points", xytext=(8, -24), fontsize=8)
    ax.set_xlabel("ms of chip time (host clock) since the step's start")
    ax.set_ylabel("MiB")
    ax.set_title(f"npu:{report['device']} rank {report['rank']}, step {report['step']}: peak allocated "
                 f"{_mib(mem['peak_allocated'])}, peak reserved {_mib(mem['peak_reserved'])}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
