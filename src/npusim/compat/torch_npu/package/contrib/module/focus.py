"""``torch_npu.contrib.module.focus``: YOLOv5's Focus layer as torch_npu writes it."""

import torch
from torch import nn

__all__ = ["Conv", "Focus", "autopad", "fast_slice"]  # every name public, as torch_npu's module has them


def autopad(k: int | list[int], p: int | list[int] | None = None) -> int | list[int]:
    """'same' padding for an odd kernel, unless ``p`` is given."""
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


class Conv(nn.Module):
    """Convolution (no bias), batch norm, LeakyReLU(0.1) (or none when ``act`` is False)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1,
                 act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.LeakyReLU(0.1, inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    def fuseforward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


def fast_slice(x: torch.Tensor) -> list[torch.Tensor]:
    """The four pixel phases of ``x`` (even / odd rows times even / odd columns), in torch_npu's order."""
    return [x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]]


class Focus(nn.Module):
    """Space to depth: the four pixel phases of a (N, c1, H, W) input stacked as 4 * c1 channels, then
    :class:`Conv` to ``c2`` channels."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1,
                 act: bool = True) -> None:
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat(fast_slice(x), 1))
