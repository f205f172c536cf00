"""The C++ extensions' sources and the hash that names a build of them.

Imported by ``setup.py`` (by file path, before npusim is installed) and by
:mod:`npusim._build`, so it imports nothing of npusim.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"

# Extension name -> its sources under csrc/. Each is one Python module inside
# the npusim package (npusim.npusim_C, npusim.npusim_dist_C).
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "npusim_C": ("runtime.cpp", "memory.cpp", "device_hooks.cpp", "host_transfer.cpp", "aten_ops.cpp",
                 "fallback.cpp", "fallback_routes.cpp", "primitives.cpp", "autocast.cpp", "graph.cpp",
                 "host_allocator.cpp", "generator.cpp", "random_ops.cpp", "cuda_semantics.cpp",
                 "record_stream.cpp", "trace.cpp", "zero_tensor.cpp", "module.cpp"),
    "npusim_dist_C": ("distributed/comm_stream.cpp", "distributed/work.cpp", "distributed/backend.cpp",
                      "distributed/module.cpp"),
}
# -g0: no debug info (Python's own flags ask for -g), which makes the build faster and the libraries small.
CFLAGS = ("-O2", "-g0", "-Wno-unused-parameter")


def source_hash(sources: tuple[str, ...], torch_version: str) -> str:
    """Hash of the torch version, the sources and every header they may include."""
    digest = hashlib.sha256(torch_version.encode())
    headers = sorted(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.h"))
    for rel in sorted(set(sources)) + headers:
        digest.update(rel.encode())
        digest.update((CSRC / rel).read_bytes())
    return digest.hexdigest()[:16]
