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
    """The ranks (or the command) did not finish within the timeout (they were killed)."""


def torchrun_command(target: Sequence[str], nproc: int) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N <target...>``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *target]


def run_bounded(cmd: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None,
                capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in a session of its own with one OpenMP thread per process (unless
    ``OMP_NUM_THREADS`` is set); after ``timeout_s`` kills every process of the session and raises
    :class:`TorchrunTimeoutError` with the end of its stderr."""
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(list(cmd), env=full_env, cwd=cwd, start_new_session=True, text=True, stdout=pipe,
                          stderr=pipe) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            raise TorchrunTimeoutError(f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s; killed it"
                                       + (f"\n{err[-3000:]}" if err else "")) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_torchrun(target: Sequence[str], nproc: int = 2, timeout_s: float = 300.0,
                 env: Mapping[str, str] | None = None, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs ``target`` (e.g. ``["-m", "npusim.tools.fsdp_demo"]``) on ``nproc`` local ranks, as
    :func:`run_bounded` runs a command."""
    return run_bounded(torchrun_command(target, nproc), timeout_s, env=env, capture=capture)
