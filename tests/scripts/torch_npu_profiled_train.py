"""A torch_npu user's profiled training loop, unmodified: torch_npu.profiler with a schedule and
tensorboard_trace_handler, as torch_npu's documentation writes it; under torchrun each rank averages
its gradients over hccl. Run as ``npusim run SCRIPT OUT`` (or under torchrun); prints one JSON line per
step: the rank, the step and its time by NPU events."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch_npu

out = sys.argv[1]
distributed = "WORLD_SIZE" in os.environ
if distributed:
    torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("hccl")
rank = dist.get_rank() if distributed else 0
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).npu()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(32, 64)
target = torch.randint(0, 10, (32,))
experimental_config = torch_npu.profiler._ExperimentalConfig(
    profiler_level=torch_npu.profiler.ProfilerLevel.Level1, aic_metrics=torch_npu.profiler.AiCMetrics.AiCoreNone)
with torch_npu.profiler.profile(
        activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
        schedule=torch_npu.profiler.schedule(wait=0, warmup=1, active=2, repeat=1, skip_first=1),
        on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(out),
        experimental_config=experimental_config) as prof:
    for step in range(4):
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        loss = torch.nn.functional.cross_entropy(model(data.npu()), target.npu())
        loss.backward()
        if distributed:
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        optimizer.step()
        optimizer.zero_grad()
        end.record()
        end.synchronize()
        print(json.dumps({"rank": rank, "step": step, "ms": start.elapsed_time(end)}), flush=True)
        prof.step()
if distributed:
    dist.destroy_process_group()
