"""``torch_npu.contrib.module.activations``: torch_npu's deprecated Mish and SiLU (Swish) modules."""

import warnings

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

__all__ = ["Mish", "SiLU", "Swish"]


class Mish(nn.Module):
    """``x * tanh(softplus(x))``, as torch_npu's (which calls ``npu_mish``); deprecated there for ``nn.Mish``."""

    def __init__(self) -> None:
        super().__init__()
        warnings.warn("torch_npu.contrib.module.Mish is deprecated. Please use torch.nn.Mish as a replacement.",
                      FutureWarning, stacklevel=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.mish(x)


class SiLU(nn.Module):
    """``x * sigmoid(x)``, as torch_npu's (which calls ``npu_silu``); deprecated there for ``nn.SiLU``."""

    def __init__(self) -> None:
        super().__init__()
        warnings.warn("torch_npu.contrib.module.SiLU is deprecated. Please use torch.nn.SiLU as a replacement.",
                      FutureWarning, stacklevel=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


Swish = SiLU
