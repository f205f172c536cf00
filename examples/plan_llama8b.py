"""A torch_npu training script shaped like Llama-3-8B pretraining: transformers' LlamaForCausalLM built
from a LlamaConfig on the meta device (no weights, no network), full activation checkpointing of every
decoder layer (non-reentrant, as torchtitan does), FSDP2 `fully_shard` per decoder layer and on the root
(bf16 params, fp32 reduce) over a 1-D DeviceMesh, AdamW on random tokens. Rank 0 prints the loss,
`torch.npu.max_memory_allocated()` and the step's wall time each step.

What it is for: planning a 64-rank job's memory and step time without computing it,

    python -m npusim plan --world-size 64 --ranks-per-node 8 -- examples/plan_llama8b.py

and, shrunk, it runs for real (the `--tiny` preset is for tests):

    torchrun --nproc-per-node 2 -m npusim run examples/plan_llama8b.py --tiny
    python -m npusim report --out /tmp/rep_tiny -- examples/plan_llama8b.py --tiny   # one rank
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

TINY = dict(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=1024, seq=128)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1, help="sequences per rank")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model for tests: " + str(TINY))
    args = p.parse_args()
    if args.tiny:
        vars(args).update(TINY)
    return args


def init_distributed() -> tuple[int, int, torch.device]:
    if "RANK" not in os.environ:  # plain `python`: a group of one rank
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    device = torch.device("npu", int(os.environ.get("LOCAL_RANK", "0")))
    torch.npu.set_device(device)
    dist.init_process_group(backend="hccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def build_model(args: argparse.Namespace, world: int, device: torch.device) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(8192, args.seq), rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    layers = model.model.layers
    for i, layer in enumerate(layers):  # full activation checkpointing, as torchtitan's "full" AC
        layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                       preserve_rng_state=False)
    mesh = init_device_mesh("npu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    with torch.no_grad():  # initialise on the device (each rank its own shards)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                torch.nn.init.ones_(p)
            else:
                torch.nn.init.normal_(p, mean=0.0, std=0.02)
        rotary = model.model.rotary_emb  # LlamaRotaryEmbedding: inv_freq, original_inv_freq (non-persistent)
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        theta = config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
        rotary.inv_freq.copy_(inv_freq)
        rotary.original_inv_freq.copy_(inv_freq)
    return model


def main() -> None:
    args = parse_args()
    rank, world, device = init_distributed()
    torch.manual_seed(0)
    model = build_model(args, world, device)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())  # DTensor numel: the global count
        print(f"llama: {args.layers} layers, hidden {args.hidden}, {n / 1e9:.3f} B params, world {world}, "
              f"batch {args.batch} x seq {args.seq} per rank", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device)
    gen.manual_seed(1234 + rank)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device, generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        loss_value = loss.item()  # waits for the step's device work
        torch.npu.synchronize()
        if rank == 0:
            print(f"step {step}: loss {loss_value:.4f}  max_memory_allocated "
                  f"{torch.npu.max_memory_allocated() / 2**20:.1f} MiB  "
                  f"wall {time.perf_counter() - t0:.3f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
