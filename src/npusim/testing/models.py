"""A small decoder-only transformer for FSDP2 runs: tied embedding and output
weights, every block call checkpointed (either ``use_reentrant``), and an
``order`` of block calls that may repeat a block. Shared by the fsdp-enhance
benchmark and tests/test_fsdp_enhance.py; :func:`demo_model` is the one the
demo (``npusim.tools.demo``) and the sim-cost benchmark train."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        # Written out rather than scaled_dot_product_attention: no fused kernel choice on the npu.
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 2, seq: int = 8, n_blocks: int = 3,
                 order: tuple[int, ...] | None = None, use_reentrant: bool | None = False,
                 wide_checkpoint: bool = False) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.order = order if order is not None else tuple(range(n_blocks))
        self.use_reentrant = use_reentrant  # None: no checkpointing
        # Checkpoint ops around the block call too, so that the recompute starts
        # before the block's output gradient (and FSDP's pre-backward hook) exists.
        self.wide_checkpoint = wide_checkpoint

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        for i in self.order:
            fn = self._wide if self.wide_checkpoint else self.blocks[i]
            args = (self.blocks[i], h) if self.wide_checkpoint else (h,)
            h = fn(*args) if self.use_reentrant is None else checkpoint(fn, *args, use_reentrant=self.use_reentrant)
        return self.head(self.norm(h))

    @staticmethod
    def _wide(block: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return block(torch.tanh(h)) * 1.5


# The demo model's vocabulary and sequence length (its training step draws tokens of them).
VOCAB, SEQ = 64, 32


def demo_model() -> nn.Module:
    """The demo's model: the shared test transformer at dim 64, without checkpointing."""
    return TinyTransformer(vocab=VOCAB, dim=64, heads=4, seq=SEQ, n_blocks=2, use_reentrant=None)
