"""``torch_npu.contrib.module.crossentropy``: cross entropy with label smoothing."""

import torch
from torch import nn

__all__ = ["LabelSmoothingCrossEntropy"]


class LabelSmoothingCrossEntropy(nn.Module):
    """torch_npu's label-smoothed cross entropy: the target class weighs ``1 - smooth_factor``, every other
    ``smooth_factor / (num_classes - 1)``; the loss is the float32 mean over the batch of
    ``-sum(weights * log_softmax(pred))`` (torch_npu: ``npu_one_hot`` and
    ``npu_softmax_cross_entropy_with_logits``). ``target`` holds class indices, of any real dtype."""

    def __init__(self, num_classes: int = 1000, smooth_factor: float = 0.0) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"LabelSmoothingCrossEntropy: num_classes must be at least 2, got {num_classes}")
        self.num_classes = num_classes
        self.on_value = 1.0 - smooth_factor
        self.off_value = 1.0 * smooth_factor / (num_classes - 1)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.dim() != 2 or pred.shape[1] != self.num_classes or target.shape != pred.shape[:1]:
            raise ValueError(f"LabelSmoothingCrossEntropy on {pred.device}: expected pred (N, {self.num_classes}) "
                             f"and target (N,), got {tuple(pred.shape)} and {tuple(target.shape)}")
        weights = torch.full_like(pred, self.off_value)
        weights.scatter_(1, target.long().unsqueeze(1), self.on_value)
        loss = -(weights * torch.log_softmax(pred, dim=1)).sum(dim=1)
        return torch.mean(loss, [0], keepdim=False, dtype=torch.float32)
