"""A Llama decoder block built from op-plugin's fused operators (npu_rms_norm, npu_rotary_mul,
npu_fusion_attention, npu_swiglu) trains on npu as the same block written with plain PyTorch ops does."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from _fused_util import randn

ops = torch.ops.npu

BATCH, SEQ, HEADS, HEAD_DIM, FFN = 2, 8, 2, 8, 32
HIDDEN = HEADS * HEAD_DIM
NAMES = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w13", "w2")


def _parameters() -> dict[str, torch.Tensor]:
    shapes = {"attn_norm": (HIDDEN,), "wq": (HIDDEN, HIDDEN), "wk": (HIDDEN, HIDDEN), "wv": (HIDDEN, HIDDEN),
              "wo": (HIDDEN, HIDDEN), "ffn_norm": (HIDDEN,), "w13": (HIDDEN, 2 * FFN), "w2": (FFN, HIDDEN)}
    return {name: (randn(*shape, seed=i) * (0.1 if name.endswith("norm") else 1 / math.sqrt(shape[0]))
                   + (1 if name.endswith("norm") else 0)).npu().requires_grad_()
            for i, (name, shape) in enumerate(shapes.items())}


def _rotary_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of Llama's rotary embedding, [1, S, 1, D] (the BSND layout's broadcast shape)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    angles = torch.outer(torch.arange(SEQ).float(), inv_freq)
    angles = torch.cat([angles, angles], -1).reshape(1, SEQ, 1, HEAD_DIM)
    return angles.cos().npu(), angles.sin().npu()


def fused_block(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Pre-norm attention with rotary embedding and a causal mask, then a pre-norm SwiGLU MLP, both residual."""
    cos, sin = _rotary_tables()
    h = ops.npu_rms_norm(x, p["attn_norm"], 1e-6)[0]
    q, k, v = ((h @ p[w]).reshape(BATCH, SEQ, HEADS, HEAD_DIM) for w in ("wq", "wk", "wv"))
    q, k = ops.npu_rotary_mul(q, cos, sin), ops.npu_rotary_mul(k, cos, sin)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).triu(1)  # True: masked out
    attn = ops.npu_fusion_attention(q, k, v, HEADS, "BSND", atten_mask=causal, scale=HEAD_DIM ** -0.5)[0]
    x = x + attn.reshape(BATCH, SEQ, HIDDEN) @ p["wo"]
    h = ops.npu_rms_norm(x, p["ffn_norm"], 1e-6)[0]
    return x + ops.npu_swiglu(h @ p["w13"], -1) @ p["w2"]


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    first, second = t.chunk(2, -1)
    return torch.cat([-second, first], -1)


def plain_block(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same block in plain PyTorch ops (HF Llama's formulas)."""
    cos, sin = _rotary_tables()

    def rms_norm(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    h = rms_norm(x, p["attn_norm"])
    q, k, v = ((h @ p[w]).reshape(BATCH, SEQ, HEADS, HEAD_DIM) for w in ("wq", "wk", "wv"))
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    scores = (q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) * HEAD_DIM ** -0.5
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool, device=x.device).triu(1)
    attn = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v.transpose(1, 2)
    x = x + attn.transpose(1, 2).reshape(BATCH, SEQ, HIDDEN) @ p["wo"]
    gate, up = (rms_norm(x, p["ffn_norm"]) @ p["w13"]).chunk(2, -1)
    return x + (torch.nn.functional.silu(gate) * up) @ p["w2"]


def _train(block, steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    params = _parameters()
    x, target = randn(BATCH, SEQ, HIDDEN, seed=20).npu(), randn(BATCH, SEQ, HIDDEN, seed=21).npu()
    losses = []
    for _ in range(steps):
        loss = (block(x, params) - target).square().mean()
        grads = torch.autograd.grad(loss, [params[n] for n in NAMES])
        with torch.no_grad():
            for name, grad in zip(NAMES, grads, strict=True):
                params[name] -= 0.1 * grad
        losses.append(loss.item())
    return losses, params


def test_llama_block_trains_as_plain_pytorch():
    """3 SGD steps of the fused Llama block give the losses and parameters of the plain-PyTorch block
    (fp32, rtol 1e-5), and every parameter moved."""
    fused_losses, fused = _train(fused_block)
    plain_losses, plain = _train(plain_block)
    assert_close(torch.tensor(fused_losses), torch.tensor(plain_losses), rtol=1e-5, atol=0)
    assert fused_losses[-1] < fused_losses[0]
    start = _parameters()
    for name in NAMES:
        assert_close(fused[name].cpu(), plain[name].cpu(), rtol=1e-5, atol=1e-6)
        assert not torch.equal(fused[name].cpu(), start[name].cpu()), name


def test_llama_block_dispatches_each_fused_op():
    """The fused block's forward and backward reach each fused operator and its backward (no silent fallback
    to a plain path)."""
    from torch.profiler import ProfilerActivity, profile

    params = _parameters()
    x = randn(BATCH, SEQ, HIDDEN, seed=20).npu()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fused_block(x, params).sum().backward()
    names = {event.key for event in prof.key_averages() if event.key.startswith("npu::")}
    assert {"npu::npu_rms_norm", "npu::npu_rotary_mul", "npu::npu_fusion_attention", "npu::npu_swiglu",
            "npu::npu_fusion_attention_grad"} <= names, sorted(names)
