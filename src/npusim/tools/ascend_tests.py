"""``python -m npusim ascend-tests``: Ascend's own test files, unmodified, on npusim.

Runs each test file of op-plugin's fused operators and of torch_npu's ``test/npu``
as its own ``python -m npusim run -m pytest FILE`` (a fresh process, as a user
would run it, bounded by ``--timeout``), then prints a line per file and the
totals: tests passed of those that ran (skips apart), and the files whose every
test passed. The sources are the public repositories (Ascend/op-plugin,
Ascend/pytorch) as a checkout or a bare git directory, so the figures can be
rerun at any commit of theirs and of npusim.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

# Operators whose use does not make a file a fused-operator test: op-plugin's base
# op tests cast to private formats around the op under test.
_FORMAT_OPS = frozenset({"npu_format_cast", "npu_format_cast_", "get_npu_format"})
_OP_CALL = re.compile(r"\b(?:torch_npu|torch\.ops\.npu)\.(\w+)")


@dataclass
class FileResult:
    """One test file's outcome; ``status`` is ran, timeout or crashed (no report)."""

    suite: str
    file: str
    status: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    tail: str = ""

    @property
    def ran(self) -> int:
        return self.passed + self.failed + self.errors

    @property
    def all_passed(self) -> bool:
        return self.status == "ran" and self.failed == 0 and self.errors == 0 and self.passed > 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op-plugin", type=Path, default=None,
                        help="Ascend/op-plugin: a checkout or a (bare) git directory")
    parser.add_argument("--torch-npu", type=Path, default=None,
                        help="Ascend/pytorch (torch_npu): a checkout or a (bare) git directory")
    parser.add_argument("--rev", default="HEAD", help="commit to take from git directories (default: HEAD)")
    parser.add_argument("--files", default=None,
                        help="comma-separated fnmatch patterns of file paths to keep (default: all selected)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per file (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=2, help="files run at once (default: %(default)s)")
    parser.add_argument("--json", default="ascend-tests.json", help="where the results go (default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the selected files and exit")


def fused_operator_files(test_root: Path, implemented: set[str]) -> list[Path]:
    """op-plugin's per-operator test files (test_*_ops/) that call one of npusim's fused
    operators beyond format casts, and the format-cast tests themselves. core_tests/ is left
    out: its test_fake_tensor checks the fake kernel of every op in op-plugin's yaml, most
    of which npusim does not define."""
    chosen = []
    for path in sorted(test_root.glob("test_*_ops/**/test_*.py")):
        called = set(_OP_CALL.findall(path.read_text(errors="replace")))
        if (called & implemented) - _FORMAT_OPS or "format_cast" in path.name:
            chosen.append(path)
    return chosen


def torch_npu_files(test_root: Path) -> list[Path]:
    """torch_npu's test/npu files (its helper scripts, not named test_*, are not tests)."""
    return sorted(test_root.glob("test_*.py"))


def _tree(source: Path, subdir: str, rev: str, scratch: Path) -> Path:
    """``subdir`` of a checkout, or extracted from a git directory at ``rev``."""
    if (source / subdir).is_dir():
        return source / subdir
    into = scratch / source.name
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", f"--git-dir={source}", "archive", rev, subdir],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / subdir


def _counts(report: Path) -> dict[str, int] | None:
    try:
        root = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in total:
            total[key] += int(suite.get(key, 0))
    return total


def run_file(suite: str, path: Path, timeout: float, scratch: Path) -> FileResult:
    """``npusim run -m pytest`` on one file in its own directory (its imports of
    sibling helpers resolve as in the repository), killed with its children at timeout."""
    report = scratch / f"{suite}-{path.stem}-{os.getpid()}-{time.monotonic_ns()}.xml"
    command = [sys.executable, "-m", "npusim", "run", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={report}", path.name]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=path.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        status = "ran"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        status = "timeout"
    seconds = time.monotonic() - started
    counts = _counts(report) if status == "ran" else None
    if status == "ran" and counts is None:
        status = "crashed"
    result = FileResult(suite, str(path), status, seconds=round(seconds, 1),
                        tail="\n".join(output.strip().splitlines()[-3:]))
    if counts:
        result.failed, result.errors, result.skipped = counts["failures"], counts["errors"], counts["skipped"]
        result.passed = counts["tests"] - result.failed - result.errors - result.skipped
    return result


def summary(results: list[FileResult], suite: str) -> str:
    mine = [r for r in results if r.suite == suite]
    passed, ran = sum(r.passed for r in mine), sum(r.ran for r in mine)
    skipped = sum(r.skipped for r in mine)
    clean = sum(r.all_passed for r in mine)
    stuck = sum(r.status != "ran" for r in mine)
    return (f"{suite}: {passed} of {ran} tests pass ({skipped} skipped); "
            f"{clean} of {len(mine)} files pass whole; {stuck} files timed out or crashed")


def _line(result: FileResult) -> str:
    if result.status != "ran":
        mark = result.status
    elif result.failed or result.errors:
        mark = "FAIL"
    else:
        mark = "ok" if result.passed else "skip"
    return (f"{mark:<8} {result.passed:>4} pass {result.failed:>3} fail {result.errors:>3} err "
            f"{result.skipped:>3} skip {result.seconds:>6.1f}s  {result.suite}: {result.file}")


def place_op_plugin_allowlist(torch_npu_repo: Path, op_plugin_test: Path) -> bool:
    """Puts op-plugin's test/allowlist_for_publicAPI.json where torch_npu's test_public_bindings reads it, in
    torch_npu's op-plugin submodule (third_party/op-plugin/test/), as in a torch_npu checkout with its
    submodules; without it the test counts op-plugin's exposed operators as unexpected public names. Only into
    a tree extracted here (True when placed): a checkout's own submodule is left as it is."""
    source = op_plugin_test / "allowlist_for_publicAPI.json"
    target = torch_npu_repo / "third_party" / "op-plugin" / "test" / source.name
    if not source.is_file() or target.exists():
        return False
    target.parent.mkdir(parents=True)
    target.write_bytes(source.read_bytes())
    return True


def _selected(args: argparse.Namespace, scratch: Path) -> list[tuple[str, Path, Path]]:
    """(suite, file, suite root) for every file to run."""
    chosen: list[tuple[str, Path, Path]] = []
    op_plugin_test = None
    if args.op_plugin is not None:
        from npusim.ops.fused import OPS

        op_plugin_test = root = _tree(args.op_plugin, "test", args.rev, scratch)
        chosen += [("op-plugin", f, root) for f in fused_operator_files(root, set(OPS))]
    if args.torch_npu is not None:
        # All of test/: some test/npu files read their sibling data (allowlist_for_publicAPI.json, the schema).
        test = _tree(args.torch_npu, "test", args.rev, scratch)
        if op_plugin_test is not None and test.is_relative_to(scratch):
            place_op_plugin_allowlist(test.parent, op_plugin_test)
        root = test / "npu"
        chosen += [("torch_npu", f, root) for f in torch_npu_files(root)]
    patterns = args.files.split(",") if args.files else None
    return [(suite, f, root) for suite, f, root in chosen
            if patterns is None or any(fnmatch.fnmatch(str(f.relative_to(root)), p) for p in patterns)]


def run(args: argparse.Namespace) -> int:
    if args.op_plugin is None and args.torch_npu is None:
        print("ascend-tests: give --op-plugin and/or --torch-npu", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="npusim-ascend-tests-") as scratch_name:
        scratch = Path(scratch_name)
        chosen = _selected(args, scratch)
        if args.list:
            for suite, f, root in chosen:
                print(f"{suite}: {f.relative_to(root)}")
            return 0
        results = _run_all(chosen, args.timeout, args.jobs, scratch)
    print()
    for suite in dict.fromkeys(r.suite for r in results):
        print(summary(results, suite))
    Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


def _run_all(chosen: list[tuple[str, Path, Path]], timeout: float, jobs: int, scratch: Path) -> list[FileResult]:
    def one(item: tuple[str, Path, Path]) -> FileResult:
        suite, path, root = item
        result = run_file(suite, path, timeout, scratch)
        result.file = str(path.relative_to(root))
        print(_line(result), flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, chosen))
