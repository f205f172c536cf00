"""A torch_npu training script for `npusim report`: a 2-layer MLP with AdamW, 3 steps (FSDP2 over hccl
under torchrun). Prints one JSON line per step with what torch.npu's own counters read: the peak
allocated / reserved of the step (the peak since the job's start for step 1, since a reset at the
step's top after that)."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401

STEPS = 3


class MLP(torch.nn.Module):
    def __init__(self, dim: int = 256, hidden: int = 1024) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def main() -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("npu", int(os.environ.get("LOCAL_RANK", "0")))
    torch.npu.set_device(device)
    torch.manual_seed(0)
    model = MLP().to(device)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("hccl", device_id=device)
        fully_shard(model.up)
        fully_shard(model.down)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    for step in range(1, STEPS + 1):
        if step > 1:
            torch.npu.reset_peak_memory_stats()
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        line = json.dumps({"rank": rank, "step": step, "max_allocated": torch.npu.max_memory_allocated(),
                           "max_reserved": torch.npu.max_memory_reserved(), "loss": loss.item()})
        sys.stdout.write(line + "\n")  # one write: the ranks share torchrun's stdout
        sys.stdout.flush()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
