"""Compiles and loads the C++ device core (``npusim._C``) on first import.

The build goes to a cache directory keyed by the torch version and a hash of
the sources, so later imports (and other ranks) reuse it. A file lock makes
concurrent first imports, e.g. two ``torchrun`` ranks, build once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).parent / "csrc"
CORE_SOURCES = ("runtime.cpp", "memory.cpp", "device_hooks.cpp", "tensor_alias.cpp", "aten_ops.cpp", "fallback.cpp",
                "primitives.cpp", "autocast.cpp", "zero_tensor.cpp", "module.cpp")


class BuildError(RuntimeError):
    """The device core could not be compiled or loaded."""


def _source_hash(sources: tuple[str, ...]) -> str:
    """Hash of the sources and every header they may include."""
    digest = hashlib.sha256(torch.__version__.encode())
    headers = sorted(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.h"))
    for rel in sorted(set(sources)) + headers:
        digest.update(rel.encode())
        digest.update((CSRC / rel).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("NPUSIM_BUILD_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "npusim")
    return Path(root) / f"torch-{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}"


def _check_toolchain() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        raise BuildError(
            "npusim: building the device core needs a C++ compiler (g++), and none was found "
            f"on PATH (looked for {compiler!r} and 'g++'). Install one, e.g. "
            "`apt-get install g++`, then import npusim again.")
    try:
        import ninja  # noqa: F401
    except ImportError:
        if shutil.which("ninja") is None:
            raise BuildError(
                "npusim: building the device core needs ninja; `pip install ninja` "
                "and import npusim again.") from None


def load_core() -> ModuleType:
    """Builds (once) and imports the device core extension."""
    return load_extension("npusim_C", CORE_SOURCES)


def load_extension(name: str, sources: tuple[str, ...], extra_ldflags: tuple[str, ...] = ()) -> ModuleType:
    """Builds (once, under a file lock) and imports an extension from csrc/."""
    from torch.utils import cpp_extension

    build_dir = cache_dir() / name / _source_hash(sources)
    build_dir.mkdir(parents=True, exist_ok=True)
    lock_path = build_dir.parent / ".build.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not any(build_dir.glob("*.so")):
                _check_toolchain()
            # torch's own build baton is a plain file that a killed build leaves
            # behind, making every later load wait forever. Holding our flock
            # (released by the kernel when a process dies) proves it is stale.
            (build_dir / "lock").unlink(missing_ok=True)
            return cpp_extension.load(
                name=name,
                sources=[str(CSRC / s) for s in sources],
                extra_cflags=["-O2", "-Wno-unused-parameter"],
                extra_ldflags=list(extra_ldflags),
                build_directory=str(build_dir),
                verbose=os.environ.get("NPUSIM_BUILD_VERBOSE") == "1",
            )
        except BuildError:
            raise
        except Exception as exc:  # the compiler's output is in the message
            raise BuildError(f"npusim: failed to build or load the device core in {build_dir}: {exc}") from exc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
