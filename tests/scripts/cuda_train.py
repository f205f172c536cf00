"""A training script written for CUDA, run on the npu by ``torch_npu.contrib.transfer_to_npu``.

Nothing below names the npu: after the two torch_npu imports it is a plain CUDA script.
Single process (``--case single``): ``torch.device("cuda")``, ``.cuda()``, ``device="cuda:1"``,
``torch.cuda.synchronize()``, ``with torch.device("cuda:1")``, a "cuda" generator, ``torch.load``'s
``map_location="cuda:1"``, ``torch.cuda.amp.autocast`` / ``torch.amp.autocast("cuda")``,
``torch.cuda.amp.GradScaler`` and ``torch.compile`` of a module moved to "cuda"; each result is
computed again on CPU. Under torchrun (``--case ddp``): DDP over "nccl" with
``device_ids=[local_rank]``, each rank training on its half of every batch, against the same
steps on the whole batch on CPU. Prints one line ``RESULT {json}`` per process.
"""

import argparse
import copy
import io
import json
import os
import sys

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401
from torch_npu.contrib import transfer_to_npu  # noqa: F401

STEPS = 3


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 16, generator=g)
    return x, x[:, :4].argmax(dim=1)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()


def params_diff(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    return max(max_diff(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))


def sgd_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def single() -> dict:
    device = torch.device("cuda")
    on_one = torch.randn(4, 16, device="cuda:1")
    reference = build_model()
    model = copy.deepcopy(reference).cuda()
    result = {
        "device": str(device), "cuda_1": str(on_one.device), "is_cuda": on_one.is_cuda,
        "param_device": str(next(model.parameters()).device), "available": torch.cuda.is_available(),
        "count": torch.cuda.device_count(), "current": torch.cuda.current_device(),
        "name": torch.cuda.get_device_name(0),
    }
    torch.cuda.synchronize()
    torch.cuda.synchronize("cuda:1")
    with torch.device("cuda:1"):
        in_context = torch.zeros(2)
    generator = torch.Generator(device="cuda").manual_seed(0)
    buffer = io.BytesIO()
    torch.save(on_one.cpu(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cuda:1")
    result.update(in_context=str(in_context.device), generator=str(generator.device), loaded=str(loaded.device),
                  loaded_equal=torch.equal(loaded.cpu(), on_one.cpu()))

    # Eager SGD with torch.cuda.amp.GradScaler (its power-of-two scale unscales exactly).
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    losses, reference_losses = [], []
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.cuda())
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
        reference_losses.append(sgd_step(reference, reference_optimizer, x, y))
    result.update(losses=losses, reference_losses=reference_losses, params_diff=params_diff(model, reference),
                  scale=scaler.get_scale())

    # Autocast, both spellings, against CPU autocast at the same dtype.
    x, _ = batch(STEPS)
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):
        legacy = model(x.cuda())
    with torch.amp.autocast("cuda", dtype=torch.bfloat16):
        current = model(x.cuda())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(x)
    result.update(autocast_dtypes=[str(legacy.dtype), str(current.dtype)],
                  autocast_diff=max(max_diff(legacy, expected), max_diff(current, expected)))

    # torch.compile of a module moved with .to("cuda"), forward and backward.
    compiled = torch.compile(copy.deepcopy(reference).to("cuda"))
    out = compiled(x.to("cuda"))
    out.sum().backward()
    expected = reference(x)
    result.update(compiled_device=str(out.device), compiled_diff=max_diff(out, expected))
    return result


def ddp() -> dict:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    reference = build_model()
    model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(reference).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        half = len(x) // world
        mine = slice(rank * half, (rank + 1) * half)
        losses.append(sgd_step(model, optimizer, x[mine].cuda(), y[mine].cuda()))
        sgd_step(reference, reference_optimizer, x, y)  # the mean over the halves is the whole batch's mean
    result = {"rank": rank, "world": world, "backend": dist.get_backend(), "losses": losses,
              "param_device": str(next(model.parameters()).device), "params_diff": params_diff(model.module, reference)}
    dist.destroy_process_group()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=["single", "ddp"], required=True)
    result = single() if parser.parse_args().case == "single" else ddp()
    sys.stdout.write(f"RESULT {json.dumps(result)}\n")  # one write: ranks share the pipe


if __name__ == "__main__":
    main()
