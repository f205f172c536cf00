"""``python -m npusim audit``: which FSDP2 functions, methods and kernels are replaced in this
process (see :func:`npusim.distributed.audit.audit_fsdp`), as a table or JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys

from npusim.distributed.audit import FSDP2_PACKAGE, OP_NAMESPACE, AuditReport, audit_fsdp

_SHORT_PREFIX = FSDP2_PACKAGE + "."


def _private_state_line(report: AuditReport) -> str:
    return ("Private FSDP2 state the npusim enhancement layer writes (no function is replaced): "
            + ", ".join(report.private_state_written) + ".")


def format_report(report: AuditReport) -> str:
    """A readable table of the findings (or one line when there are none), then the private state written."""
    if not report.findings:
        return (f"FSDP2 audit: clean. No PyTorch FSDP2 function, method or {OP_NAMESPACE}:: kernel is replaced "
                f"({report.checked} checked, torch at {report.torch_dir}).\n{_private_state_line(report)}")
    n_bad = len(report.forbidden)
    head = (f"FSDP2 audit: {len(report.findings)} replacement(s), {n_bad} forbidden, "
            f"{len(report.findings) - n_bad} allowed ({report.checked} checked, torch at {report.torch_dir}).")
    rows = [("STATUS", "KIND", "CHANGE", "TARGET", "REPLACED BY", "REASON")]
    rows += [(f.status, f.kind, f.change, f.target.removeprefix(_SHORT_PREFIX), f.replacement_origin, f.reason)
             for f in report.findings]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows]
    return "\n".join([head, *lines, _private_state_line(report)])


def _default_imports() -> list[str]:
    """npusim and every npusim.distributed module: importing them must not patch FSDP2."""
    import npusim.distributed as package

    names = [f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__)]
    return ["npusim", package.__name__, *sorted(names)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=None,
                        help="import MODULE before auditing (repeatable; default: npusim and npusim.distributed.*)")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 when nothing forbidden is found, 1 otherwise, 2 when a requested import fails."""
    for name in args.imports if args.imports is not None else _default_imports():
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported, then the audit fails loudly
            print(f"npusim audit: importing {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    report = audit_fsdp()
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1
