"""A transformers Trainer script as an Ascend user writes it: `import torch_npu` first, a tiny Llama built
from a config (no download), 4 steps. Prints one line `RESULT {json}` per rank: device, world size,
logged losses.

    python -m npusim run hf_trainer_llama.py OUT [cpu]                         (1 process)
    torchrun --nproc-per-node 2 -m npusim run hf_trainer_llama.py OUT [cpu]    (DDP over hccl)
"""

import torch_npu  # noqa: F401, I001  (first, as Ascend scripts start)
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

out, on_cpu = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "cpu"
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config)
ids = torch.randint(0, 128, (16, 16), generator=torch.Generator().manual_seed(1))
dataset = [{"input_ids": row, "labels": row} for row in ids]
args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3,
                         logging_steps=1, report_to=[], save_strategy="no", use_cpu=on_cpu,
                         dataloader_pin_memory=False, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()
result = {"device": str(next(model.parameters()).device), "world": int(os.environ.get("WORLD_SIZE", "1")),
          "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]}
# one write: the ranks share the pipe, and print() writes the newline apart
sys.stdout.write(f"RESULT {json.dumps(result)}\n")
sys.stdout.flush()
