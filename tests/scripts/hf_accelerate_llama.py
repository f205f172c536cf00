"""An accelerate training loop as an Ascend user writes it: `import torch_npu` first, a tiny Llama from a
config, DDP or FSDP2 (FullyShardedDataParallelPlugin(fsdp_version=2)), 4 steps on 2 ranks, each rank
training on its half of every batch. Prints one line `RESULT {json}` per rank.

    torchrun --nproc-per-node 2 -m npusim run hf_accelerate_llama.py ddp|fsdp2 [cpu]
"""

import torch_npu  # noqa: F401, I001  (first, as Ascend scripts start)
import json
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from transformers import LlamaConfig, LlamaForCausalLM

mode, on_cpu = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "cpu"
plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if mode == "fsdp2" else None
accelerator = Accelerator(cpu=on_cpu, fsdp_plugin=plugin)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = accelerator.prepare(model, optimizer)
batches = torch.randint(0, 128, (4, 4, 16), generator=torch.Generator().manual_seed(1))
half = batches.shape[1] // accelerator.num_processes
losses = []
for batch in batches:
    ids = batch[accelerator.process_index * half:(accelerator.process_index + 1) * half].to(accelerator.device)
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(accelerator.reduce(loss.detach(), "mean").item())
result = {"device": str(accelerator.device), "type": str(accelerator.distributed_type),
          "rank": accelerator.process_index, "fsdp2": mode == "fsdp2" and hasattr(model, "reshard"), "losses": losses}
# one write: the ranks share the pipe, and print() writes the newline apart
sys.stdout.write(f"RESULT {json.dumps(result)}\n")
sys.stdout.flush()
