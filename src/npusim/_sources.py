"""The C++ extensions' sources and the hash that names a build of them.

Imported by ``setup.py`` (by file path, before npusim is installed) and by
:mod:`npusim._build`, so it imports nothing of npusim.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"

# Note [Unity build]
# Each extension compiles as two unity translation units (csrc/unity/*.cpp),
# each of which #includes a share of the extension's .cpp files. Parsing
# PyTorch's headers, not npusim's own code, is most of a translation unit's
# compile time, so one unit per file (21 of them) spent most of a fresh
# install's build parsing the same headers again: 1 min 58 s of wall time and
# 3 min 25 s of CPU time on 2 cores. Two units per extension keep both cores
# of a CI machine busy (ninja builds one extension at a time) while parsing
# the headers four times in all. The price is an incremental rebuild of a
# whole unit after an edit. Files of one unit share anonymous namespaces, so
# their file-local names must differ (tests/test_build.py checks that every
# .cpp is in exactly one unit).

# Extension name -> its unity units under csrc/. Each extension is one Python
# module inside the npusim package (npusim.npusim_C, npusim.npusim_dist_C).
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "npusim_C": ("unity/core_1.cpp", "unity/core_2.cpp"),
    "npusim_dist_C": ("unity/dist_1.cpp", "unity/dist_2.cpp"),
}
_INCLUDE = re.compile(r'^#include "\.\./(\S+\.cpp)"$', re.MULTILINE)


def unit_members(unit: str) -> list[str]:
    """The .cpp files (relative to csrc/) that unity unit ``unit`` includes, in order."""
    return _INCLUDE.findall((CSRC / unit).read_text())


# -g0: no debug info (Python's own flags ask for -g), which makes the build faster and the libraries small.
# -ffp-contract=off: a product and a sum stay two roundings where code built
# for FMA (a target attribute) could fuse them; Note [Box-Muller bit for bit]
# reproduces libm's roundings operation by operation.
CFLAGS = ("-O2", "-g0", "-Wno-unused-parameter", "-ffp-contract=off")


def source_hash(sources: tuple[str, ...], torch_version: str) -> str:
    """Hash of the torch version, the compiler flags, the units, the files they include and every header."""
    digest = hashlib.sha256(torch_version.encode())
    digest.update(" ".join(CFLAGS).encode())
    headers = sorted(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.h"))
    members = [member for unit in sources for member in unit_members(unit)]
    for rel in sorted(set(sources)) + sorted(set(members)) + headers:
        digest.update(rel.encode())
        digest.update((CSRC / rel).read_bytes())
    return digest.hexdigest()[:16]
