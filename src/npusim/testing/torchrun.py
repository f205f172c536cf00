"""Runs a module on several ranks under ``torchrun``, in bounded time.

The launcher of the demo and of tests that need torchrun itself (scripts run
the way users run them). ``--standalone`` makes torchrun's own rendezvous
store bind a free port (``localhost:0``), so there is no pick-a-port-then-bind
race; the ranks run in a session of their own so that a timeout kills every
process torchrun started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence


class TorchrunTimeoutError(RuntimeError):
    """The ranks did not finish within the timeout (they were killed)."""


def torchrun_command(target: Sequence[str], nproc: int) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N <target...>``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *target]


def run_torchrun(target: Sequence[str], nproc: int = 2, timeout_s: float = 300.0,
                 env: Mapping[str, str] | None = None, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs ``target`` (e.g. ``["-m", "npusim.tools.fsdp_demo"]``) on ``nproc`` local ranks.

    Each rank uses one OpenMP thread unless ``OMP_NUM_THREADS`` is set. Raises
    :class:`TorchrunTimeoutError` after killing the whole process group when the
    ranks take longer than ``timeout_s``.
    """
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(torchrun_command(target, nproc), env=full_env, start_new_session=True, text=True,
                          stdout=pipe, stderr=pipe) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise TorchrunTimeoutError(f"torchrun {' '.join(target)} on {nproc} ranks did not finish within "
                                  f"{timeout_s:.0f} s; killed it") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
