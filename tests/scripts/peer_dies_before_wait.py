"""One rank of tests/test_collectives.py::test_unwaited_failure_at_exit_is_one_line.

Usage: peer_dies_before_wait.py PORT RANK. Rank 0 issues an all-reduce (queued on its stream, never
waited for), then lets rank 1 go; rank 1 exits without joining it; rank 0 ends its script while the
failed collective is still unobserved, so the first synchronize to see the failure is the one at exit.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import npusim  # noqa: F401  (the npu device and its "hccl" backend)

port, rank = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))
dist.init_process_group("hccl", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=10),
                        device_id=torch.device("npu", rank))
t = torch.ones(4, device=f"npu:{rank}")
dist.all_reduce(t)
torch.npu.synchronize()  # both ranks are connected
if rank == 1:
    store.wait(["issued"])
    os._exit(0)  # dies without joining rank 0's second all-reduce
dist.all_reduce(t)  # enqueued: the failure can only surface at a later synchronize
store.set("issued", "1")
time.sleep(1.0)  # the peer's death reaches the collective
print("rank 0 done", flush=True)
