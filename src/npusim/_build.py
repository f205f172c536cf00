"""Loads npusim's C++ extensions: the install-time build, or a compile on first use.

``pip install`` builds both extensions with PyTorch's BuildExtension
(``setup.py``) and records the hash of their sources in
``_build_info.json``; when that hash matches the sources on disk, loading is
a plain import. Otherwise (an install without the build, C++ sources edited
since, or ``NPUSIM_BUILD_DIR`` set) the extension is compiled with
``torch.utils.cpp_extension.load`` into a cache directory keyed by the torch
version and the source hash, saying so and showing ninja's progress on
stderr. A file lock makes concurrent first imports, e.g. two ``torchrun``
ranks, build once.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import torch

from npusim import config
from npusim._sources import CFLAGS, CSRC, EXTENSIONS, source_hash

BUILD_INFO = Path(__file__).parent / "_build_info.json"


class BuildError(RuntimeError):
    """The device core could not be compiled or loaded."""


def cache_dir() -> Path:
    root = config.build_dir() or os.path.join(
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


def _installed_build_hash(name: str) -> str | None:
    try:
        info = json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return None
    return info.get("extensions", {}).get(name)


def load_extension(name: str) -> ModuleType:
    """Imports extension ``name`` of :data:`EXTENSIONS`: the install-time build when current, else a JIT build."""
    sources = EXTENSIONS[name]
    expected = source_hash(sources, torch.__version__)
    installed = _installed_build_hash(name)
    if not config.build_dir() and installed == expected:
        return importlib.import_module(f"npusim.{name}")
    if config.build_dir():
        reason = "NPUSIM_BUILD_DIR is set"
    elif installed is None:
        reason = "this install has no build of it (`pip install --no-build-isolation -e .` builds it once)"
    else:
        reason = "its C++ sources changed since the install-time build"
    return jit_build(name, [CSRC / s for s in sources], cache_dir() / name / expected, reason=reason)


def load_core() -> ModuleType:
    """The device core extension (``npusim_C``)."""
    return load_extension("npusim_C")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    # cpp_extension writes ninja's progress to file descriptor 1; a program's
    # own output there must stay clean (``python -c "...print(x)"``).
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def jit_build(name: str, sources: Sequence[Path], build_dir: Path, *, reason: str,
              python_module: bool = True) -> ModuleType | str:
    """Builds (once, under a file lock) and loads ``sources`` as extension ``name`` in ``build_dir``.

    With ``python_module=False`` the library is loaded into the process and its path returned.
    """
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    lock_path = build_dir.parent / ".build.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            compiling = not any(build_dir.glob("*.so"))
            if compiling:
                _check_toolchain()
                print(f"npusim: compiling the C++ extension {name} ({reason}); about a minute, "
                      f"cached in {build_dir}", file=sys.stderr, flush=True)
            # torch's own build baton is a plain file that a killed build leaves
            # behind, making every later load wait forever. Holding our flock
            # (released by the kernel when a process dies) proves it is stale.
            (build_dir / "lock").unlink(missing_ok=True)
            verbose = compiling or config.build_verbose()
            with _stdout_to_stderr() if verbose else contextlib.nullcontext():
                return cpp_extension.load(
                    name=name,
                    sources=[str(s) for s in sources],
                    extra_cflags=list(CFLAGS),
                    build_directory=str(build_dir),
                    verbose=verbose,
                    is_python_module=python_module,
                )
        except BuildError:
            raise
        except Exception as exc:  # the compiler's output is in the message
            raise BuildError(f"npusim: failed to build or load {name} in {build_dir}: {exc}") from exc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
