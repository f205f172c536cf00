"""The CANN toolkit environment ``python -m npusim run`` gives a job: a simulated one, never over a real one.

Note [A simulated CANN environment]
-----------------------------------
On an Ascend machine the CANN toolkit's ``set_env.sh`` exports ``ASCEND_HOME_PATH``,
``ASCEND_TOOLKIT_HOME`` (both ``<install>/ascend-toolkit/latest``) and ``ASCEND_OPP_PATH``
(its ``opp``), and frameworks read them: DeepSpeed's NPU op builders index
``os.environ["ASCEND_HOME_PATH"]`` at construction (a KeyError without it, in
``init_distributed``) and read the release from the ``version=`` line of an
``ascend_*_install.info`` file under it, as ``torch_npu.utils.get_cann_version`` does.
So ``npusim run`` exports the three variables (its children inherit them, torchrun's
ranks and spawned workers included) pointing to a small tree that says which CANN
release the profile models and nothing more:

- ``<root>/<arch>-linux/ascend_toolkit_install.info``, ``<root>/compiler/version.info``
  and ``<root>/opp/version.info``, with the profile's ``cann_version``;
- ``<root>/NPUSIM_SIMULATED_CANN``, saying what the tree is. It holds no library, header
  or operator package: a framework that tries to compile against CANN fails there, naming
  the missing file.

It never stands in for a real toolkit: when any of the three variables is set, the
environment is left as it is; when a real toolkit is installed at CANN's default place
(``/usr/local/Ascend/ascend-toolkit/latest``) but its environment is not set, nothing is
exported and ``npusim run`` says to source its ``set_env.sh``. The tree lives in npusim's
cache directory (``$XDG_CACHE_HOME/npusim/cann/<version>-<arch>``), written once, atomically
(ranks starting together may race to write it).
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Mapping, MutableMapping
from pathlib import Path

__all__ = ["CANN_VARIABLES", "REAL_TOOLKIT", "apply_cann_environment", "cann_environment", "simulated_cann_home"]

CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
# Where CANN's installer puts the toolkit (set_env.sh's default ASCEND_TOOLKIT_HOME).
REAL_TOOLKIT = Path("/usr/local/Ascend/ascend-toolkit/latest")
MARKER = "NPUSIM_SIMULATED_CANN"


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))) / "npusim" / "cann"


def _files(version: str, arch: str, root: Path) -> dict[str, str]:
    """The tree's files, by path relative to its root."""
    return {
        f"{arch}-linux/ascend_toolkit_install.info": (
            f"package_name=Ascend-cann-toolkit\nversion={version}\ninnerversion={version}\narch={arch}\nos=linux\n"
            f"path={root / f'{arch}-linux'}\n"),
        "compiler/version.info": f"Version={version}\n",
        "opp/version.info": f"Version={version}\n",
        MARKER: (f"npusim's simulated CANN {version} environment (`python -m npusim run`): version files only, no "
                 "libraries, headers or operator packages. See Note [A simulated CANN environment] in "
                 "npusim/tools/cann_env.py.\n"),
    }


def simulated_cann_home(version: str, arch: str | None = None, cache_root: Path | None = None) -> Path:
    """The simulated toolkit directory of CANN ``version`` (created once, atomically)."""
    arch = arch or platform.machine()
    cache_root = cache_root or _cache_root()
    home = cache_root / f"{version}-{arch}"
    if (home / MARKER).is_file():
        return home
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-{arch}-", dir=cache_root))
    for relative, text in _files(version, arch, home).items():
        path = staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    try:
        staging.rename(home)
    except OSError:  # another process of the job made it first
        shutil.rmtree(staging, ignore_errors=True)
        if not (home / MARKER).is_file():
            raise RuntimeError(f"npusim run: could not create the simulated CANN environment in {home}") from None
    return home


def cann_environment(environ: Mapping[str, str], version: str, *, arch: str | None = None,
                     cache_root: Path | None = None, real_toolkit: Path = REAL_TOOLKIT) -> tuple[dict[str, str], str]:
    """The CANN variables to add to ``environ`` for CANN ``version``, and why when none are
    (See Note [A simulated CANN environment])."""
    already = [name for name in CANN_VARIABLES if environ.get(name)]
    if already:
        return {}, f"{', '.join(already)} set: the environment's CANN is kept"
    if real_toolkit.is_dir():
        return {}, (f"a real CANN toolkit is installed at {real_toolkit} but its environment is not set; "
                    f"source {real_toolkit.parent / 'set_env.sh'} to use it")
    home = simulated_cann_home(version, arch, cache_root)
    return {"ASCEND_HOME_PATH": str(home), "ASCEND_TOOLKIT_HOME": str(home), "ASCEND_OPP_PATH": str(home / "opp")}, ""


def apply_cann_environment(environ: MutableMapping[str, str], version: str, **kwargs: object) -> str:
    """Adds the simulated CANN variables to ``environ`` (``os.environ``: this process and its
    children) unless a CANN environment is there; returns why nothing was added, or ``""``."""
    added, why = cann_environment(environ, version, **kwargs)  # type: ignore[arg-type]
    environ.update(added)
    return why
