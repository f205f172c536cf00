"""A training script as a torch_npu user writes it; `python -m npusim run` runs it unmodified.

Single process: AMP with torch.npu.amp, a pinned DataLoader with non_blocking copies, memory
stats, checkpoint save / load. Under torchrun (WORLD_SIZE > 1): FSDP2 over hccl.
Prints one JSON line with what it observed.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = x[:, :4].argmax(dim=1)  # learnable labels
    return DataLoader(TensorDataset(x, y), batch_size=16, pin_memory=True)


def train_single(checkpoint: str) -> dict:
    device = torch.device("npu:0")
    torch.npu.set_device(device)
    model = build_model().npu()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.npu.amp.GradScaler()
    losses, pinned = [], True
    batches = [batch for _ in range(EPOCHS) for batch in data()]
    for x, y in batches:
        pinned = pinned and x.is_pinned()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        with torch.npu.amp.autocast():
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    torch.npu.synchronize()
    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, checkpoint)
    restored = build_model().npu()
    state = torch.load(checkpoint, map_location="npu:0")
    restored.load_state_dict(state["model"])
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.state_dict().values(),
                                                             restored.state_dict().values(), strict=True))
    return {"losses": losses, "pinned": pinned, "restored_equal": same, "scale": scaler.get_scale(),
            "allocated": torch.npu.memory_allocated(), "reserved": torch.npu.memory_reserved(),
            "peak": torch.npu.max_memory_allocated(), "summary_ok": "Allocated memory" in torch.npu.memory_summary(),
            "device_name": torch.npu.get_device_name(), "torch_npu_npu_is_torch_npu": torch_npu.npu is torch.npu}


def train_fsdp() -> dict:
    from torch.distributed.fsdp import fully_shard

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("npu", local_rank % torch.npu.device_count())
    torch.npu.set_device(device)
    dist.init_process_group("hccl", device_id=device)
    model = build_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    rank, world = dist.get_rank(), dist.get_world_size()
    for x, y in [batch for _ in range(EPOCHS) for batch in data()]:
        shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        x, y = x[shard].to(device, non_blocking=True), y[shard].to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    full = {k: v.full_tensor().cpu().sum().item() for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "losses": losses, "param_sums": full}


def _emit(result: dict) -> None:
    # One write of one line: the ranks share the test's stdout pipe, and a line
    # written in pieces could interleave with another rank's.
    os.write(1, (json.dumps(result) + "\n").encode())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="ckpt.pt")
    args = parser.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _emit(train_fsdp())
    else:
        _emit(train_single(args.checkpoint))
