"""``python -m npusim calibrate``: the timing model's figures beside public Ascend A2 training runs.

For each run in RUNS (a Megatron-backend configuration whose throughput ModelLink, now MindSpeed-LLM,
published for an Atlas 900 A2 PODc), it prices one training step with the cost models on the profile
(``--profile``, ``--profile-overrides``), and prints the published tokens/s per NPU and TFLOPS per NPU
beside the model's, and how far apart. docs/PLAN.md ("Calibration") holds its output for the default
profile; Note [Calibrated efficiencies] in runtime/profiles.py how the efficiencies came from it.

Note [A Megatron step, priced]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A run is priced op by op with runtime/cost_model.py's ``op_cost`` on meta tensors and
runtime/collective_cost.py's ``collective_cost``, for the busiest pipeline stage's NPU (the last: its
layers plus the output layer and the loss), with the run's tensor (TP, with sequence parallelism, as
every run here sets), pipeline (PP) and data (DP = NPUs / (TP x PP)) parallel sizes:
- a micro-batch of t = micro_batch x seq tokens through each layer: the QKV, output, gate/up and down
  projections (each a forward matmul and two backward ones, dgrad and wgrad, sharded by TP), flash
  attention forward and backward (aten's SDPA ops, dense FLOP count), and the vector work: two RMSNorms
  and two residual adds on the sequence-parallel [t / TP, h], SwiGLU on [t, ffn / TP], RoPE on q and
  k; backward vector work twice the forward's;
- TP collectives with sequence parallelism: forward two all-gathers of [t, h] and two reduce-scatters,
  backward the same again (Megatron overlaps its other backward all-gathers with matmuls, so they are
  left out); a pipeline send forward and one backward of [t / TP, h];
- the output layer (a [t, h] x [h, V / TP] matmul, forward and backward) and the float32 cross-entropy
  reading and writing the logits once each way;
- the step: (m + PP - 1) micro-batches of the stage (1F1B, m = global_batch / (DP x micro_batch), the
  PP - 1 the pipeline's bubble), then, unless the run overlaps it (--overlap-grad-reduce), the DP
  gradient reduction (an all-reduce of float32 gradients, or with the distributed optimizer a
  reduce-scatter of them and an all-gather of the bfloat16 parameters), then Adam: three float32
  passes over the NPU's parameters (its shard, with the distributed optimizer).
Ops run one after another: nothing overlaps but what the list says, and no launch cost is added (every
op here lasts tens of microseconds or more). The model's TFLOPS per NPU counts the matmul and attention
FLOPs every NPU runs in a step (the output layer's spread over the stages) over the step time;
the published TFLOPS are each README's own count, which the READMEs do not define (LLaMA2-7B's 122.4
is below what its 4241 tokens/s give by 6 x parameters alone), so the tokens/s are the figures to read.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from typing import NamedTuple

import torch

from npusim.runtime import collective_cost, cost_model
from npusim.runtime.profiles import Profile
from npusim.tools import profile_options

aten = torch.ops.aten
_SOURCE = ("Ascend/MindSpeed-LLM (ModelLink) @ ba10f5fdeded126ed95c79fbfdfadebcb46b7f7c, README_en.md performance "
           "table (Atlas 900 A2 PODc)")


class Run(NamedTuple):
    """One published training measurement and the configuration its pretrain script ran."""

    model: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    seq: int
    tp: int
    pp: int
    micro_batch: int
    global_batch: int
    distributed_optimizer: bool
    overlap_grad_reduce: bool
    tokens_per_s: float  # published, per NPU
    tflops: float | None  # published, per NPU (the README's own count), where given
    script: str  # the pretrain script at the source commit
    npus: int = 8


# The runs on one Atlas 900 A2 node (1x8) whose README gives tokens/s/p: the configuration is the
# pretrain script's at the same commit; vocabularies are the tokenizers' (LLaMA 32000, LLaMA3 128256,
# Qwen1.5 the scripts' --padded-vocab-size).
RUNS: tuple[Run, ...] = (
    Run("LLaMA-7B", 32, 4096, 11008, 32, 32, 32000, 2048, 1, 8, 4, 256, False, False, 3600, 159.9,
        "examples/llama/pretrain_llama_7b_ptd.sh"),
    Run("LLaMA-13B", 40, 5120, 13824, 40, 40, 32000, 2048, 1, 8, 1, 128, False, False, 1895, 200.57,
        "examples/llama/pretrain_llama_13b_ptd.sh"),
    Run("LLaMA2-7B", 32, 4096, 11008, 32, 32, 32000, 4096, 1, 2, 1, 256, True, True, 4241, 122.39,
        "examples/llama2/pretrain_llama2_7b_ptd.sh"),
    Run("LLaMA2-13B", 40, 5120, 13824, 40, 40, 32000, 4096, 8, 1, 4, 512, False, False, 1990, 133.77,
        "examples/llama2/pretrain_llama2_13B_ptd_8p.sh"),
    Run("LLaMA3-8B", 32, 4096, 14336, 32, 8, 128256, 8192, 8, 1, 2, 64, False, False, 2483, None,
        "examples/llama3/pretrain_llama3_8b_ptd.sh"),
    Run("Qwen1.5-0.5B", 24, 1024, 2816, 16, 16, 151936, 8192, 1, 1, 1, 64, True, False, 22834, None,
        "examples/qwen15/pretrain_qwen15_0point5b_ptd.sh"),
    Run("Qwen1.5-1.8B", 24, 2048, 5504, 16, 16, 151936, 8192, 1, 1, 1, 64, True, True, 13029, None,
        "examples/qwen15/pretrain_qwen15_1point8b_ptd.sh"),
    Run("Qwen1.5-4B", 40, 2560, 6912, 20, 20, 151936, 8192, 1, 2, 1, 64, True, False, 5033, None,
        "examples/qwen15/pretrain_qwen15_4b_ptd.sh"),
    Run("Qwen1.5-7B", 32, 4096, 11008, 32, 32, 151936, 8192, 8, 1, 2, 64, False, False, 2862, None,
        "examples/qwen15/pretrain_qwen15_7b_ptd.sh"),
    Run("Qwen1.5-14B", 40, 5120, 13696, 40, 40, 152064, 8192, 4, 2, 1, 256, False, False, 1717, None,
        "examples/qwen15/pretrain_qwen15_14b_ptd.sh"),
)


class Estimate(NamedTuple):
    """The model's figures for one run, and where its step time goes (microseconds by kernel class)."""

    tokens_per_s: float
    tflops: float
    step_us: float
    us_by_class: dict[str, float]


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _linear(t: int, k: int, n: int, profile: Profile) -> list[cost_model.OpCost]:
    """[t, k] x [k, n] forward, and backward's dgrad [t, n] x [n, k] and wgrad [k, t] x [t, n]."""
    return [cost_model.op_cost(aten.mm.default, (_meta(m, kk), _meta(kk, nn)), {}, _meta(m, nn), profile=profile)
            for m, kk, nn in ((t, k, n), (t, n, k), (k, t, n))]


def _attention(batch: int, heads: int, seq: int, dim: int, profile: Profile) -> list[cost_model.OpCost]:
    q = _meta(batch, heads, seq, dim)
    forward = cost_model.op_cost(aten._scaled_dot_product_flash_attention.default, (q, q, q), {}, (q,),
                                 profile=profile)
    backward = cost_model.op_cost(aten._scaled_dot_product_flash_attention_backward.default, (q, q, q, q, q), {},
                                  (q, q, q), profile=profile)
    return [forward, backward]


def _elementwise(numel: int, inputs: int, profile: Profile, dtype: torch.dtype = torch.bfloat16) -> cost_model.OpCost:
    """A vector op reading ``inputs`` tensors of ``numel`` elements and writing one."""
    x = _meta(numel, dtype=dtype)
    op, args = (aten.neg.default, (x,)) if inputs == 1 else (aten.add.Tensor, (x, x))
    return cost_model.op_cost(op, args, {}, x, profile=profile)


def _collective(op: str, nbytes: float, ranks: Iterable[int], profile: Profile) -> float:
    ranks = list(ranks)
    if len(ranks) < 2 or nbytes <= 0:
        return 0.0
    return collective_cost.collective_us(op, int(nbytes), ranks, ranks_per_node=profile.ranks_per_node,
                                         profile=profile)


def estimate(run: Run, profile: Profile) -> Estimate:
    """The model's step for ``run`` on ``profile`` (See Note [A Megatron step, priced])."""
    tp, pp = run.tp, run.pp
    dp = run.npus // (tp * pp)
    t, h, dim = run.micro_batch * run.seq, run.hidden, run.hidden // run.heads
    qkv = (run.heads + 2 * run.kv_heads) * dim
    costs: list[cost_model.OpCost] = []
    for k, n in ((h, qkv // tp), (h // tp, h), (h, 2 * run.ffn // tp), (run.ffn // tp, h)):
        costs += _linear(t, k, n, profile)
    costs += _attention(run.micro_batch, run.heads // tp, run.seq, dim, profile)
    vector = [_elementwise(t // tp * h, 1, profile)] * 2 + [_elementwise(t // tp * h, 2, profile)] * 2
    vector += [_elementwise(t * run.ffn // tp, 2, profile), _elementwise(t * (run.heads + run.kv_heads) * dim // tp, 1,
                                                                          profile)]
    costs += vector * 3  # forward, and backward at twice the bytes
    layer = costs
    activation = t * h * 2  # a [t, h] bfloat16 tensor
    tp_ranks = range(tp)
    layer_comm = 4 * (_collective("all_gather_into_tensor", activation, tp_ranks, profile)
                      + _collective("reduce_scatter_tensor", activation, tp_ranks, profile))
    head = _linear(t, h, run.vocab // tp, profile)
    head += [_elementwise(t * run.vocab // tp, 1, profile, torch.float32),
             _elementwise(t * run.vocab // tp, 2, profile, torch.float32)]
    p2p = 2 * _collective("send", activation // tp, (0, tp * dp), profile) if pp > 1 else 0.0
    layers_per_stage = run.layers // pp
    micro_batch_us = (layers_per_stage * (sum(c.us for c in layer) + layer_comm) + sum(c.us for c in head) + p2p)
    micro_batches = run.global_batch // (dp * run.micro_batch)
    # The busiest stage's parameters: its layers and the output layer (untied from the embedding).
    layer_params = h * qkv + h * h + 3 * h * run.ffn
    params = (layers_per_stage * layer_params + run.vocab * h) / tp
    dp_ranks = range(0, tp * dp, tp)
    if run.overlap_grad_reduce:
        dp_us = 0.0
    elif run.distributed_optimizer:
        dp_us = (_collective("reduce_scatter_tensor", 4 * params, dp_ranks, profile)
                 + _collective("all_gather_into_tensor", 2 * params, dp_ranks, profile))
    else:
        dp_us = _collective("all_reduce", 4 * params, dp_ranks, profile)
    shard = params / dp if run.distributed_optimizer else params
    optimizer_us = 3 * _elementwise(math.ceil(shard), 2, profile, torch.float32).us
    step_us = (micro_batches + pp - 1) * micro_batch_us + dp_us + optimizer_us
    by_class: dict[str, float] = {}
    for cost, count in [(c, layers_per_stage) for c in layer] + [(c, 1) for c in head]:
        by_class[cost.kernel] = by_class.get(cost.kernel, 0.0) + count * cost.us * (micro_batches + pp - 1)
    by_class["communication"] = (layers_per_stage * layer_comm + p2p) * (micro_batches + pp - 1) + dp_us
    by_class["optimizer"] = optimizer_us
    cube_flops = layers_per_stage * sum(c.flops for c in layer if c.unit == "cube") + sum(
        c.flops for c in head if c.unit == "cube") / pp
    tokens_per_s = run.global_batch * run.seq / (step_us / 1e6) / run.npus
    return Estimate(tokens_per_s, micro_batches * cube_flops / step_us / 1e6, step_us, by_class)


def table(profile: Profile, runs: Iterable[Run] = RUNS) -> list[tuple[Run, Estimate]]:
    return [(run, estimate(run, profile)) for run in runs]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    profile_options.add_arguments(parser, default="training_soc")


def run(args: argparse.Namespace) -> int:
    profile = profile_options.make(args)
    print(f"profile {profile.name}{' (roofline)' if profile.roofline else ''}; published: {_SOURCE}")
    print(f"{'model':<13} {'TPxPPxDP':>9} {'seq':>5} {'tokens/s/NPU':>13} {'model':>7} {'model/pub':>9} "
          f"{'TFLOPS/NPU':>10} {'model':>6}  step share: cube / attention / vector / comm")
    for run_, est in table(profile):
        dp = run_.npus // (run_.tp * run_.pp)
        share = {key: value / est.step_us for key, value in est.us_by_class.items()}
        cube = sum(value for key, value in share.items() if key.startswith("cube"))
        vector = share.get("vector", 0.0) + share.get("optimizer", 0.0)
        published_tflops = f"{run_.tflops:.1f}" if run_.tflops is not None else "-"
        print(f"{run_.model:<13} {f'{run_.tp}x{run_.pp}x{dp}':>9} {run_.seq:>5} {run_.tokens_per_s:>13.0f} "
              f"{est.tokens_per_s:>7.0f} {est.tokens_per_s / run_.tokens_per_s:>9.2f} {published_tflops:>10} "
              f"{est.tflops:>6.1f}  {cube:.2f} / {share.get('attention', 0.0):.2f} / {vector:.2f} / "
              f"{share.get('communication', 0.0):.2f}")
    return 0
