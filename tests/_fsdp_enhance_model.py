"""The model (npusim.testing.models at test size) and training helpers for
tests/test_fsdp_enhance.py."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812

from npusim.testing.models import TinyTransformer as _TinyTransformer

VOCAB, DIM, HEADS, SEQ = 32, 16, 2, 8


def TinyTransformer(**kw: Any) -> nn.Module:  # noqa: N802  (a class in spirit)
    return _TinyTransformer(vocab=VOCAB, dim=DIM, heads=HEADS, seq=SEQ, **kw)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, VOCAB, (2, SEQ + 1), generator=gen)
    return idx[:, :-1].to(device), idx[:, 1:].to(device)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def full_params(model: nn.Module) -> list[torch.Tensor]:
    return [p.full_tensor().detach().cpu() for p in model.parameters()]
