"""Exit while a daemon thread still launches npu work (tests/test_launch_queue.py).

The main thread queues a chain of work that ends in a non-blocking copy to pinned memory, then
returns; an exit handler registered before torch (so run after npusim's drain: atexit runs in
reverse order) prints what the copy delivered, which it sees only if the work queued before
exit began has completed."""

from __future__ import annotations

import atexit
import sys
import threading
import time

delivered: list[object] = []


def report() -> None:
    print(f"delivered {float(delivered[0][0])} {time.monotonic():.3f}", flush=True)


atexit.register(report)

import torch  # noqa: E402

import npusim  # noqa: E402, F401

launches = [0]


def launch_forever() -> None:
    x = torch.randn(64, 64, device="npu")
    while True:
        x = (x @ x).tanh()
        launches[0] += 1


threading.Thread(target=launch_forever, daemon=True).start()
while launches[0] < 1100:  # the daemon thread is well into its loop (past the launch queue's bound)
    time.sleep(0.01)
y = torch.zeros(1 << 16, device="npu")
for _ in range(200):
    y.add_(1)
pinned = torch.empty(1 << 16, pin_memory=True)
pinned.copy_(y, non_blocking=True)
delivered.append(pinned)
print(f"main exits {time.monotonic():.3f}", flush=True)
sys.exit(0)
