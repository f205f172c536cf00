"""A multi-card job as Ascend examples launch it: `mp.spawn` (or a forkserver Process) of ranks whose
module starts with `import torch_npu`; run under `python -m npusim run` by tests/test_spawned_ranks.py.

    spawn_job.py spawn OUT        2 ranks by torch.multiprocessing.spawn, hccl all_reduce
    spawn_job.py forkserver OUT   1 rank in a multiprocessing forkserver child
Each rank writes OUT/rank<r>.json with what it saw.
"""

import torch_npu  # noqa: I001  (first, as Ascend's multi-card examples start)
import json
import multiprocessing
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, out: str) -> None:
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", init_method=f"file://{os.path.join(out, 'rendezvous')}", rank=rank,
                            world_size=world)
    tensor = torch.full((2,), float(rank + 1), device=f"npu:{rank}")
    dist.all_reduce(tensor)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "sum": tensor.cpu().tolist(), "torch_npu_file": torch_npu.__file__,
                   "npu_is_torch_npu": torch_npu.npu is torch.npu, "pid": os.getpid(),
                   "start_method": multiprocessing.get_start_method()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "spawn":
        mp.spawn(rank_main, args=(2, out), nprocs=2, join=True)
    else:
        child = multiprocessing.get_context("forkserver").Process(target=rank_main, args=(0, 1, out))
        child.start()
        child.join(120)
        sys.exit(child.exitcode)
