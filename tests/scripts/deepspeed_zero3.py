"""DeepSpeed ZeRO-3 on the npu through DeepSpeed's own NPU accelerator (DS_ACCELERATOR=npu), as a user runs it:
``torchrun --nproc-per-node 2 -m npusim run deepspeed_zero3.py OUT_DIR``, with no CANN variable set by hand.
Each rank writes OUT_DIR/rank<r>.json: its accelerator, device, ASCEND_HOME_PATH and the losses of two Adam
steps."""

import json
import os
import sys
from pathlib import Path

import torch


def model_and_batches(rank: int) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The model (seed 0) and rank ``rank``'s two batches; tests/test_cann_env.py rebuilds them on CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    batches = []
    for step in range(2):
        g = torch.Generator().manual_seed(step * 2 + rank)
        batches.append((torch.randn(2, 16, generator=g), torch.randn(2, 4, generator=g)))
    return model, batches


LR = 0.01

if __name__ == "__main__":
    import deepspeed
    import torch_npu  # noqa: F401  (npusim run's)
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend="hccl")
    rank = int(os.environ["RANK"])
    model, batches = model_and_batches(rank)
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "Adam", "params": {"lr": LR, "torch_adam": True, "adam_w_mode": False}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result = {"rank": rank, "accelerator": get_accelerator()._name, "device": str(engine.device),
              "ascend_home_path": os.environ.get("ASCEND_HOME_PATH"), "losses": losses}
    (Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps(result))
