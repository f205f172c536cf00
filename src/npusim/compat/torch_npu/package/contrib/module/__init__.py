"""``torch_npu.contrib.module``: torch_npu's drop-in modules, where PyTorch's operators compute them.

Simulated: ``Mish``, ``SiLU`` / ``Swish`` (torch_npu's deprecated activations), ``ChannelShuffle``,
``LabelSmoothingCrossEntropy`` and ``Focus``: each computes what torch_npu's computes, with
PyTorch's operators in place of the CANN kernels torch_npu calls (``npu_mish``, ``npu_one_hot``,
``npu_softmax_cross_entropy_with_logits``, ...), gradients by autograd. The others are fused
CANN kernels or quantized layers with no npu kernel here, and raise NotSimulatedError naming
them.
"""

import sys
from typing import Any

from torch_npu.contrib.module.activations import Mish, SiLU, Swish
from torch_npu.contrib.module.channel_shuffle import ChannelShuffle
from torch_npu.contrib.module.crossentropy import LabelSmoothingCrossEntropy
from torch_npu.contrib.module.focus import Focus

from npusim.compat.torch_npu import NotSimulatedError

__all__ = ["ChannelShuffle", "Focus", "LabelSmoothingCrossEntropy", "Mish", "SiLU", "Swish"]

# torch_npu's other modules, with what they would need.
_NOT_SIMULATED = {
    "Prefetcher": "it overlaps host-to-device copies with a side stream of torch_npu's data loaders",
    "ROIAlign": "op-plugin's npu_roi_align kernel",
    "ModulatedDeformConv": "op-plugin's npu_deformable_conv2d kernel",
    "DCNv2": "op-plugin's npu_deformable_conv2d kernel",
    "BiLSTM": "op-plugin's npu_lstm kernel",
    "PSROIPool": "op-plugin's npu_ps_roi_pooling kernel",
    "NpuFairseqDropout": "torch_npu's pre-generated dropout masks (npu_dropout_gen_mask)",
    "NpuCachedDropout": "torch_npu's pre-generated dropout masks (npu_dropout_gen_mask)",
    "NpuPreGenDropout": "torch_npu's pre-generated dropout masks (npu_dropout_gen_mask)",
    "MultiheadAttention": "op-plugin's npu_multi_head_attention kernel",
    "FusedColorJitter": "torch_npu's fused image kernels",
    "NpuDropPath": "torch_npu's asynchronous random tensors on a side stream",
    "FastBatchNorm1d": "op-plugin's int32-count batch-norm kernels",
    "FastBatchNorm2d": "op-plugin's int32-count batch-norm kernels",
    "FastBatchNorm3d": "op-plugin's int32-count batch-norm kernels",
    "FastSyncBatchNorm": "op-plugin's int32-count batch-norm kernels",
    "LinearA8W8Quant": "op-plugin's quantized matmul kernels",
    "LinearQuant": "op-plugin's quantized matmul kernels",
    "LinearWeightQuant": "op-plugin's quantized matmul kernels",
    "QuantConv2d": "op-plugin's quantized convolution kernels",
    "DropoutWithByteMask": "op-plugin's npu_dropout_with_add_softmax byte-mask kernels",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_SIMULATED:
        raise NotSimulatedError(f"torch_npu.contrib.module.{name} is not simulated by npusim: it needs "
                                f"{_NOT_SIMULATED[name]} (simulated modules: {', '.join(__all__)})",
                                name=name, obj=sys.modules[__name__])
    raise AttributeError(f"module 'torch_npu.contrib.module' has no attribute {name!r}")
