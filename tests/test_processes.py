"""npu across processes: tensors shared through torch.multiprocessing (same memory, lifetime kept), a
child forked after npu use refused as CUDA's is, and Ctrl-C during a host wait arriving at once."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import npusim  # noqa: F401

TIMEOUT_S = 90


def _consumer(inbox: Any, outbox: Any) -> None:
    """The receiving process: reports what arrived, writes to it, sends a tensor back, and reads a
    tensor the sender has dropped since (spawned: unpickling the tensors imports npusim)."""
    t, view, same, empty = inbox.get(timeout=TIMEOUT_S)
    report = {
        "device": str(t.device), "values": t.cpu().tolist(), "view": (view.cpu().tolist(), view.stride(),
                                                                      view.storage_offset()),
        "one_storage": view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and same is t,
        "empty": (str(empty.device), tuple(empty.shape)), "allocated": torch.npu.memory_allocated(1),
    }
    t.add_(10)  # seen by the sender: the same memory
    torch.npu.synchronize()
    outbox.put((report, torch.arange(3.0, device="npu:1") * 7))
    dropped = inbox.get(timeout=TIMEOUT_S)
    outbox.put("got it")
    assert inbox.get(timeout=TIMEOUT_S) == "read it now"
    outbox.put(dropped.cpu().tolist())
    assert inbox.get(timeout=TIMEOUT_S) == "done"


def test_tensors_put_on_a_queue_are_shared():
    """An npu tensor (a strided view, one storage twice, an empty one) put on a torch.multiprocessing
    queue arrives as an npu tensor of the same device over the same memory: the receiver's write is
    seen by the sender, a tensor comes back the other way, and a tensor the sender dropped after
    sending stays readable; the receiver's statistics do not count shared memory."""
    from npusim.runtime import backend_meta

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_consumer, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        t = torch.arange(8.0, device="npu:1")
        backend_meta.set_field(t, "tag", 2)
        inbox.put((t, t[2::2], t, torch.empty(0, device="npu:1")))
        report, made = outbox.get(timeout=TIMEOUT_S)
        assert report == {"device": "npu:1", "values": [float(i) for i in range(8)],
                          "view": ([2.0, 4.0, 6.0], (2,), 2), "one_storage": True, "empty": ("npu:1", (0,)),
                          "allocated": 0}
        torch.npu.synchronize()
        assert torch.equal(t.cpu(), torch.arange(8.0) + 10)
        assert made.device == torch.device("npu", 1) and made.cpu().tolist() == [0.0, 7.0, 14.0]
        assert backend_meta.get(t) == {"tag": 2}  # sharing moved the memory, not the tensor's fields

        dropped = torch.full((1000,), 3.0, device="npu:1")
        inbox.put(dropped)
        assert outbox.get(timeout=TIMEOUT_S) == "got it"
        del dropped
        gc.collect()
        reuse = [torch.zeros(1000, device="npu:1") for _ in range(4)]  # memory the freed block may come back as
        inbox.put("read it now")
        assert outbox.get(timeout=TIMEOUT_S) == [3.0] * 1000
        assert all(r.sum().item() == 0 for r in reuse)
        inbox.put("done")
        child.join(timeout=TIMEOUT_S)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()


def _forked_child(results: Any) -> None:
    out: dict[str, object] = {"is_initialized": torch.npu.is_initialized()}
    for name, use in (("init", torch.npu.init), ("empty", lambda: torch.empty(1, device="npu")),
                      ("to", lambda: torch.ones(1).npu())):
        try:
            use()
            out[name] = "accepted"
        except RuntimeError as error:
            out[name] = str(error)
    results.put(out)


def test_child_forked_after_npu_use_is_refused():
    """In a child forked after the parent used the npu, torch.npu.init() and device use raise CUDA's
    'Cannot re-initialize ... in forked subprocess' error, and is_initialized() is False."""
    torch.ones(1, device="npu").cpu()  # the parent has used the npu
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(results,))
    child.start()
    try:
        out = results.get(timeout=TIMEOUT_S)
        child.join(timeout=TIMEOUT_S)
    finally:
        if child.is_alive():
            child.kill()
    assert out.pop("is_initialized") is False
    for name, message in out.items():
        assert "Cannot re-initialize npu in forked subprocess" in message and "'spawn' start method" in message, name


def _interrupted(code: str, ready: str = "waiting", extra: list[subprocess.Popen[str]] | None = None,
                 env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Runs ``code``, sends SIGINT once it printed ``ready``; returns (seconds to exit, status, stderr)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == ready, (line, proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(0.5)  # well inside the wait
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT_S)
        return time.monotonic() - sent, proc.returncode, err
    finally:
        for p in [proc, *(extra or [])]:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.asynchronous
def test_ctrl_c_interrupts_a_synchronize():
    """SIGINT while the host waits in torch.npu.synchronize() for a minute-long stream task ends the
    process within a couple of seconds with KeyboardInterrupt (it used to wait for the task)."""
    elapsed, status, err = _interrupted("""
        import torch, npusim
        x = torch.randn(1 << 18, device="npu")
        y = torch.empty_like(x)
        npusim.timing.set(launch_us=60e6, realtime=True)
        y.copy_(x)  # one task of a minute on the current stream
        npusim.timing.set()
        print("waiting", flush=True)
        torch.npu.synchronize()
        print("not interrupted", flush=True)
    """)
    assert "KeyboardInterrupt" in err and "not interrupted" not in err, err
    assert status != 0 and elapsed < 5.0, (elapsed, err)


def test_ctrl_c_interrupts_a_blocking_launch():
    """Under NPUSIM_LAUNCH_BLOCKING=1 the launch itself waits for its task; SIGINT during that wait ends
    the process within a couple of seconds with KeyboardInterrupt, as in a synchronize."""
    elapsed, status, err = _interrupted("""
        import torch, npusim
        x = torch.randn(1 << 18, device="npu")
        y = torch.empty_like(x)
        npusim.timing.set(launch_us=60e6, realtime=True)
        print("waiting", flush=True)
        y.copy_(x)  # one task of a minute: the launch returns only when it has run
        print("not interrupted", flush=True)
    """, env={"NPUSIM_LAUNCH_BLOCKING": "1"})
    assert "KeyboardInterrupt" in err and "not interrupted" not in err, err
    assert status != 0 and elapsed < 5.0, (elapsed, err)


def test_ctrl_c_interrupts_a_wait_on_a_collective():
    """SIGINT while rank 0 waits in a barrier its peer never joins ends rank 0 within a couple of
    seconds with KeyboardInterrupt (it used to wait for the group's timeout)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    rank_code = """
        import sys, time, torch, torch.distributed as dist
        from datetime import timedelta
        import npusim
        port, rank = int(sys.argv[1]), int(sys.argv[2])
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("hccl", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=120),
                                device_id=torch.device("npu", rank))
        dist.all_reduce(torch.ones(1, device=f"npu:{rank}"))
        torch.npu.synchronize()
        if rank == 1:
            time.sleep(120)  # never joins the barrier
        print("waiting", flush=True)
        dist.barrier()
        print("not interrupted", flush=True)
    """
    peer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(rank_code), str(server.port), "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    elapsed, status, err = _interrupted(rank_code.replace("int(sys.argv[1]), int(sys.argv[2])",
                                                          f"{server.port}, 0"), extra=[peer])
    assert "KeyboardInterrupt" in err and "not interrupted" not in err, err
    assert status != 0 and elapsed < 5.0, (elapsed, err)
