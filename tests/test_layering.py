"""The layering rule of docs/FOLDER_TREE.md: no import (Python) or include (C++) runs back up, and the
runtime floor of the C++ core compiles, links and runs without the floors above it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from torch.utils import cpp_extension

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "npusim"
CSRC = PACKAGE / "csrc"

# Python layers, lowest first; a module imports only from its own package and the layers below.
PY_LAYERS: list[set[str]] = [
    {"config", "_sources", "_after_import"}, {"_build"}, {"runtime"}, {"_device"},
    {"ops", "compile", "sanitizer", "distributed"}, {"compat", "testing", "conformance"},
    {"bench", "plan"}, {"tools"}, {"__init__", "__main__"},
]
# C++ floors of csrc/, lowest first; a file includes only its own floor and those below.
CXX_FLOORS: list[set[str]] = [{"runtime"}, {"aten", "distributed"}, {"graph"}, {"python"}, {"unity"}]
# What the runtime floor (streams, events, allocators) must never include: ops, graphs, the fallback.
FORBIDDEN_IN_RUNTIME = re.compile(r'#include [<"](ATen/ops/|ATen/native/|ATen/ATen\.h|torch/library\.h|'
                                  r'ATen/core/dispatch/|\.\./(aten|graph|python)/)')


def _rank(layers: list[set[str]], name: str) -> int:
    return next(i for i, names in enumerate(layers) if name in names)


def _python_imports() -> list[tuple[str, str, str]]:
    """(importing package, imported package, file) for every npusim import, lazy ones included."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        here = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [f"npusim.{a.name}" for a in node.names] if node.module == "npusim" else [node.module]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] == "npusim" and len(parts) > 1 and parts[1] != here:
                    found.append((here, parts[1], path.relative_to(PACKAGE).as_posix()))
    return found


def test_python_layers_import_only_downward():
    """No npusim module imports a package of its own layer or one above (bench and tools never each other)."""
    upward = [f"{file}: {here} -> {there}" for here, there, file in _python_imports()
              if _rank(PY_LAYERS, there) >= _rank(PY_LAYERS, here)]
    assert not upward


def _includes() -> dict[Path, list[Path]]:
    graph = {}
    for path in sorted(CSRC.rglob("*")):
        if path.suffix in (".h", ".cpp"):
            quoted = re.findall(r'^#include "([^"]+)"', path.read_text(), re.MULTILINE)
            graph[path] = [(path.parent / q).resolve() for q in quoted]
    return graph


def test_cxx_floors_include_only_downward_and_no_circle():
    """Each csrc/ file includes its own floor and those below; the include graph has no circle."""
    graph = _includes()
    upward = []
    for path, targets in graph.items():
        here = path.relative_to(CSRC).parts[0]
        for target in targets:
            assert target in graph, f"{path}: includes {target}, which does not exist"
            there = target.relative_to(CSRC).parts[0]
            if here != there and _rank(CXX_FLOORS, there) >= _rank(CXX_FLOORS, here):
                upward.append(f"{path.relative_to(CSRC)} -> {target.relative_to(CSRC)}")
    assert not upward
    state: dict[Path, int] = {}

    def visit(node: Path, trail: list[Path]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            assert state.get(nxt) != 1, "include circle: " + " -> ".join(str(p.relative_to(CSRC)) for p in trail)
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    runtime_files = [p for p in graph if p.relative_to(CSRC).parts[0] == "runtime"]
    assert len(runtime_files) >= 10
    offending = [f"{p.relative_to(CSRC)}: {m.group(0)}" for p in runtime_files
                 for m in FORBIDDEN_IN_RUNTIME.finditer(p.read_text())]
    assert not offending


# Streams, events and the allocators, alone: a stream task, an event, a stream-ordered free and reuse.
RUNTIME_SELF_TEST = r"""
#include "../runtime/device_allocator.h"
#include "../runtime/event.h"
#include "../runtime/host_allocator.h"
#include "../runtime/stream.h"

#include <atomic>

extern "C" int npusim_runtime_self_test() {
  using namespace npusim;
  NpuStream& side = stream_for(0, 1);
  std::atomic<bool> release{false};
  int result = 0;
  c10::DataPtr block = allocate_device(0, 1000);
  void* const address = block.get();
  side.enqueue([&] { while (!release.load()) {} }, 0.0, "gate");
  NpuEvent event;
  event_record(event, side);
  if (event_query(event)) result |= 1;                // recorded behind the gate
  block.clear();                                      // freed while the side stream is busy
  if (allocate_device(0, 1000).get() == address) result |= 2;  // not reused before the stream passes
  release = true;
  side.synchronize();
  if (!event_query(event)) result |= 4;
  if (allocate_device(0, 1000).get() != address) result |= 8;  // cached and reused once it passed
  c10::DataPtr pinned = allocate_pinned(64);
  if (!is_pinned_ptr(pinned.get())) result |= 16;
  return result;
}
"""


def test_runtime_floor_compiles_links_and_runs_alone(tmp_path):
    """csrc/runtime/*.cpp with no other floor build into a library with no undefined npusim symbol, and work."""
    unit = tmp_path / "runtime_alone.cpp"
    sources = sorted((CSRC / "runtime").glob("*.cpp"))
    unit.write_text("".join(f'#include "{s}"\n' for s in sources) + textwrap.dedent(RUNTIME_SELF_TEST).replace(
        '"../runtime/', f'"{CSRC / "runtime"}/'))
    library = tmp_path / "libnpusim_runtime_alone.so"
    lib_dir = Path(cpp_extension.library_paths()[0])
    command = ["c++", "-std=c++17", "-O0", "-g0", "-fPIC", "-shared", "-D_GLIBCXX_USE_CXX11_ABI=1",
               *[f"-I{p}" for p in cpp_extension.include_paths()], str(unit), "-o", str(library),
               f"-L{lib_dir}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib_dir}", "-Wl,--no-undefined", "-lpthread"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert built.returncode == 0, built.stderr[-4000:]
    # In a process of its own: the library registers a PrivateUse1 host allocator of its own.
    run = subprocess.run([sys.executable, "-c", f"import ctypes; print(ctypes.CDLL({str(library)!r})"
                          ".npusim_runtime_self_test())"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "0", run.stderr
