"""``torch_npu.contrib.module.channel_shuffle``: torch_npu's ChannelShuffle of two inputs."""

import torch
from torch import nn

__all__ = ["ChannelShuffle"]


class ChannelShuffle(nn.Module):
    """Shuffles the channels of ``cat([x1, x2], dim=1)`` as torch_npu's does, with ``index_select`` in place of a
    transpose: channel ``c`` of group ``g`` (``groups`` groups of ``in_channels // groups``) moves next to channel
    ``c`` of the other groups. With ``split_shuffle`` (the default) the result is returned in two halves.
    Gradients are autograd's of the same selection (torch_npu's hand-written backward for two groups)."""

    def __init__(self, in_channels: int, groups: int = 2, split_shuffle: bool = True) -> None:
        super().__init__()
        if groups <= 0 or in_channels % groups:
            raise ValueError(f"ChannelShuffle: in_channels ({in_channels}) must be a positive multiple of groups "
                             f"({groups})")
        self.split_shuffle = split_shuffle
        self.group_len = in_channels // groups
        order = torch.arange(in_channels).reshape(groups, self.group_len).t().flatten()
        self.register_buffer("out_channels", order, persistent=False)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([x1, x2], dim=1)
        order = self.out_channels.to(x.device)
        if x.shape[1] < order.numel():
            raise ValueError(f"ChannelShuffle on {x.device}: expected at least {order.numel()} channels in "
                             f"cat([x1, x2], dim=1), got {x.shape[1]}")
        if not self.split_shuffle:
            return x.index_select(1, order)
        return x.index_select(1, order[:self.group_len]), x.index_select(1, order[self.group_len:])
