"""The fused LSTM / GRU cells that PyTorch's RNNs call on an npu tensor.

PyTorch's LSTM and GRU (``aten/src/ATen/native/RNN.cpp``) send a CUDA, XPU or
PrivateUse1 input through the fused cell kernels ``_thnn_fused_lstm_cell`` and
``_thnn_fused_gru_cell``, which only CUDA implements; CPU computes the same
cells from their definitions. These kernels compute them for the npu from the
same definitions (see Note [npu follows CUDA where CPU differs] in
csrc/aten/cuda_semantics.cpp), with the workspace layouts CUDA's kernels save for
backward: the LSTM's activated gates ``[i, f, g, o]``; the GRU's
``[r, z, n, hx, hn]`` with ``hn`` the hidden part of the new gate.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The registrations live as long as this library object (made by register()).
_lib: torch.library.Library | None = None


def _gates(input_gates: Tensor, hidden_gates: Tensor, input_bias: Tensor | None,
           hidden_bias: Tensor | None) -> Tensor:
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    return gates


def lstm_cell(input_gates: Tensor, hidden_gates: Tensor, cx: Tensor, input_bias: Tensor | None = None,
              hidden_bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``_thnn_fused_lstm_cell``: returns (hy, cy, workspace)."""
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy: Tensor | None, grad_cy: Tensor | None, cx: Tensor, cy: Tensor,
                       workspace: Tensor, has_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``_thnn_fused_lstm_cell_backward_impl``: returns (grad_gates, grad_cx, grad_bias)."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy.clone()
    grad_o = torch.zeros_like(o)
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy
    grad_gates = torch.cat([
        grad_c * g * i * (1 - i),
        grad_c * cx * f * (1 - f),
        grad_c * i * (1 - g * g),
        grad_o * o * (1 - o),
    ], 1)
    # Without a bias CUDA returns an undefined tensor, which autograd drops;
    # a Python kernel cannot, and the sum is dropped just the same.
    return grad_gates, grad_c * f, grad_gates.sum(0)


def gru_cell(input_gates: Tensor, hidden_gates: Tensor, hx: Tensor, input_bias: Tensor | None = None,
             hidden_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``_thnn_fused_gru_cell``: returns (hy, workspace)."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = (hx - n) * z + n
    return hy, torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(grad_hy: Tensor, workspace: Tensor,
                      has_bias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``_thnn_fused_gru_cell_backward``: gradients of the gates, hx and the two biases."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    return (grad_input_gates, grad_hidden_gates, grad_hy * z,
            grad_input_gates.sum(0), grad_hidden_gates.sum(0))


def register() -> None:
    """Registers the fused cells as the npu kernels of PyTorch's CUDA-only ops (idempotent)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_thnn_fused_lstm_cell", lstm_cell, "PrivateUse1")
    _lib.impl("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward, "PrivateUse1")
    _lib.impl("_thnn_fused_gru_cell", gru_cell, "PrivateUse1")
    _lib.impl("_thnn_fused_gru_cell_backward", gru_cell_backward, "PrivateUse1")
