"""Builds npusim's C++ extensions at install time with PyTorch's BuildExtension.

``pip install --no-build-isolation -e .`` (what ``make`` runs) compiles both
extensions once, with ninja's progress visible, and records the hash of the
sources they were built from in ``npusim/_build_info.json``; ``import npusim``
then loads them without compiling (see npusim._build).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from setuptools import setup

# `import torch` would otherwise load an installed npusim through torch's device-backend
# autoload (the entry point in pyproject.toml): never the npusim being built here.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

try:
    from torch import __version__ as torch_version
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    raise SystemExit(
        "npusim builds its C++ extensions against the installed torch: install torch==2.13.0 (the CPU build) "
        "first, then `pip install --no-build-isolation -e .` (or run `make install`).") from None

ROOT = Path(__file__).parent
PACKAGE = ROOT / "src" / "npusim"


def _load_sources_module():
    spec = importlib.util.spec_from_file_location("_npusim_sources", PACKAGE / "_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sources = _load_sources_module()


class BuildWithInfo(BuildExtension):
    """BuildExtension, then the build info that tells npusim._build these binaries are current."""

    def run(self) -> None:
        # Both cores of a CI machine, whatever torch would pick.
        os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
        super().run()
        info = {name: sources.source_hash(srcs, torch_version) for name, srcs in sources.EXTENSIONS.items()}
        targets = [PACKAGE / "_build_info.json"]
        if not self.inplace:
            targets.append(Path(self.build_lib) / "npusim" / "_build_info.json")
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps({"torch": torch_version, "extensions": info}, indent=1) + "\n")


setup(
    ext_modules=[
        CppExtension(f"npusim.{name}", [f"src/npusim/csrc/{s}" for s in srcs],
                     extra_compile_args=list(sources.CFLAGS))
        for name, srcs in sources.EXTENSIONS.items()
    ],
    cmdclass={"build_ext": BuildWithInfo.with_options(use_ninja=True)},
)
