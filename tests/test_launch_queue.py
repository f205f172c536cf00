"""The launch queue and exit, as on CUDA: a host thread never runs more than the queue's bound of launches ahead
of a stream, Ctrl-C ends a runaway loop within a second, and an exit with a daemon thread still launching
finishes the work queued before it and returns at once, never aborting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import torch

from npusim import config
from npusim.runtime import acl

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
SLEEP_CYCLES = 2_000_000  # about 1.1 ms of torch.npu._sleep on the default profile's clock


@pytest.fixture
def launch_bound() -> Iterator[int]:
    bound = 16
    acl.set_max_pending_launches(bound)
    yield bound
    torch.npu.synchronize()
    acl.set_max_pending_launches(config.max_pending_launches())


def test_the_default_bound_is_cudas_and_the_variable_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config.max_pending_launches() == 1024
    monkeypatch.setenv("NPUSIM_MAX_PENDING_LAUNCHES", "64")
    assert config.max_pending_launches() == 64
    monkeypatch.setenv("NPUSIM_MAX_PENDING_LAUNCHES", "0")
    with pytest.raises(ValueError, match="NPUSIM_MAX_PENDING_LAUNCHES"):
        config.max_pending_launches()


@pytest.mark.asynchronous
def test_the_host_never_runs_more_than_the_bound_ahead(launch_bound: int) -> None:
    """200 launches of 1 ms each: the host reaches the bound and waits there; pending never passes it."""
    stream = torch.npu.current_stream()
    pending = []
    for _ in range(200):
        torch.npu._sleep(SLEEP_CYCLES)
        pending.append(acl.stream_pending(stream.stream_id, stream.device_index))
    assert max(pending) == launch_bound, pending  # reached, never passed
    assert pending.count(launch_bound) > 100  # the host waited at the bound for most launches
    torch.npu.synchronize()
    assert acl.stream_pending(stream.stream_id, stream.device_index) == 0


@pytest.mark.asynchronous
def test_ctrl_c_ends_a_runaway_loop_within_a_second() -> None:
    """A loop launching far faster than the device runs is held at the bound; SIGINT ends it with
    KeyboardInterrupt out of the launch's wait, and npusim's exit work is over within a second: the last exit
    handler (registered before torch, so run after npusim's) runs less than a second after the signal. The
    interpreter's own teardown after that is torch's (on a loaded 2-core machine CPU torch alone took 1.6 s)."""
    script = textwrap.dedent(f"""
        import atexit, sys, time
        atexit.register(lambda: print("exit handlers done", time.monotonic(), file=sys.stderr, flush=True))
        import torch, npusim
        print("launching", flush=True)
        while True:
            torch.npu._sleep({SLEEP_CYCLES})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert proc.stdout.readline().strip() == "launching"
        time.sleep(2.0)  # 1024 launches queue in about 0.1 s: the loop now waits at the bound
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err and "_sleep" in err, err
    done = float(next(line for line in err.splitlines() if line.startswith("exit handlers done")).split()[-1])
    assert done - sent < 1.0, (done - sent, err)
    assert "interrupted; not waiting for the work still queued on the npu" in err  # over a second of work was left


def test_exit_with_a_daemon_thread_launching_drains_and_returns() -> None:
    """The work queued before exit began completes (an exit handler sees its copy's values); the daemon thread's
    later launch is dropped with one line; the process exits 0 at once, without aborting."""
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "exit_with_daemon_launcher.py")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    exits = float(next(line for line in lines if line.startswith("main exits")).split()[2])
    _, value, reported = next(line for line in lines if line.startswith("delivered")).split()
    assert float(value) == 200.0  # the main thread's queued work all ran before the exit handlers after it
    assert float(reported) - exits < 5.0  # a bounded drain: at most one queue of 64x64 matmuls
    # One line when the daemon thread reached a launch or wait after exit began (it nearly always does); none when
    # finalization found it inside a CPU kernel (Note [Daemon threads at finalization]).
    stopped = [line for line in proc.stderr.splitlines() if "the process is exiting" in line]
    assert len(stopped) <= 1 and all("stopped at its next launch or wait" in line for line in stopped), proc.stderr
    assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
