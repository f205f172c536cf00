"""The FSDP2 part of ``python -m npusim demo``, one process per rank under torchrun::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m npusim.tools.fsdp_demo

PyTorch's own ``fully_shard``, unpatched, trains a small transformer on the
simulated npu over the "hccl" backend; rank 0 prints the losses, the route the
all-gather copy-ins took and the patch audit.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import npusim
from npusim.distributed.audit import audit_fsdp
from npusim.ops import trace_foreach_copy
from npusim.testing.models import SEQ, VOCAB, demo_model

STEPS = 5


def main() -> int:
    rank = int(os.environ["RANK"])
    device = torch.device("npu", int(os.environ.get("LOCAL_RANK", rank)) % torch.npu.device_count())
    torch.npu.set_device(device)
    dist.init_process_group(device_id=device)
    torch.manual_seed(0)
    model = demo_model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    with trace_foreach_copy() as calls:
        for step in range(STEPS):
            tokens = torch.randint(0, VOCAB, (8, SEQ), generator=gen).to(device)
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"  fsdp step {step}: mean loss over ranks {loss.item():.5f}")
    routes: dict[str, int] = {}
    for call in calls:
        for group in call.groups:
            routes[group.route] = routes.get(group.route, 0) + 1
    report = audit_fsdp()
    if rank == 0:
        print(f"  world size {dist.get_world_size()}, backend {dist.get_backend()}, profile "
              f"{npusim.get_profile().name}")
        print(f"  _foreach_copy_ calls by route during training (all-gather copy-in included): {routes}")
        print(f"  FSDP2 patch audit: {'clean' if report.ok else 'FORBIDDEN OVERRIDES FOUND'} "
              f"({len(report.findings)} findings)")
    dist.destroy_process_group()
    return 0 if report.ok and set(routes) <= {"fast", "slow", "batch"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
