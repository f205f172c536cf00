"""Convolutions and recurrent layers run on npu with CPU's forward values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

import npusim  # noqa: F401


def _compare(module: nn.Module, *inputs: torch.Tensor) -> None:
    """Forward and backward on npu equal CPU's, for the output, the inputs' and the parameters' gradients."""
    cpu_in = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    npu_in = [x.npu().requires_grad_(x.is_floating_point()) for x in inputs]
    cpu_mod, npu_mod = module, copy.deepcopy(module).npu()
    outs = [cpu_mod(*cpu_in), npu_mod(*npu_in)]
    flat = [o[0] if isinstance(o, tuple) else o for o in outs]
    assert flat[1].device.type == "npu"
    assert_close(flat[1].cpu(), flat[0], atol=1e-5, rtol=1e-4)
    grad = torch.randn_like(flat[0])
    flat[0].backward(grad)
    flat[1].backward(grad.npu())
    for a, b in zip(cpu_in, npu_in, strict=True):
        assert_close(b.grad.cpu(), a.grad, atol=1e-5, rtol=1e-4)
    for (name, p), q in zip(cpu_mod.named_parameters(), npu_mod.parameters(), strict=True):
        assert q.grad is not None, name
        assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("module, shape", [
    (nn.Conv1d(3, 4, 3, padding=1), (2, 3, 9)),
    (nn.Conv2d(3, 4, 3, stride=2, dilation=1), (2, 3, 8, 8)),
    (nn.Conv2d(4, 4, 3, groups=2, bias=False), (1, 4, 6, 6)),
    (nn.Conv3d(2, 3, 2), (1, 2, 4, 4, 4)),
    (nn.ConvTranspose1d(3, 2, 3, stride=2), (2, 3, 5)),
    (nn.ConvTranspose2d(3, 2, 3, stride=2, output_padding=1), (1, 3, 4, 4)),
    (nn.ConvTranspose3d(2, 2, 2), (1, 2, 3, 3, 3)),
], ids=["conv1d", "conv2d-stride", "conv2d-groups", "conv3d", "convT1d", "convT2d", "convT3d"])
def test_convolution_matches_cpu(module, shape):
    """Every convolution kind (it used to raise 'convolution_overrideable not implemented')."""
    torch.manual_seed(0)
    _compare(module, torch.randn(shape))


@pytest.mark.parametrize("module, shape", [
    (nn.LSTM(4, 5, num_layers=2), (3, 2, 4)),
    (nn.LSTM(4, 5, bidirectional=True, batch_first=True), (2, 3, 4)),
    (nn.LSTM(4, 6, proj_size=3), (3, 2, 4)),
    (nn.GRU(4, 5, num_layers=2), (3, 2, 4)),
    (nn.GRU(4, 5, bias=False), (3, 2, 4)),
    (nn.RNN(4, 5), (3, 2, 4)),
], ids=["lstm", "lstm-bidir", "lstm-proj", "gru", "gru-nobias", "rnn"])
def test_recurrent_layer_matches_cpu(module, shape):
    """LSTM / GRU route npu through the fused cells; values and gradients equal CPU's."""
    torch.manual_seed(0)
    _compare(module, torch.randn(shape))


@pytest.mark.parametrize("cell", [nn.LSTMCell(4, 5), nn.GRUCell(4, 5), nn.LSTMCell(4, 5, bias=False)],
                         ids=["lstmcell", "grucell", "lstmcell-nobias"])
def test_cells_match_cpu(cell):
    """LSTMCell and GRUCell on npu equal CPU's."""
    torch.manual_seed(0)
    _compare(cell, torch.randn(3, 4))


def test_lstm_cell_with_state_matches_cpu():
    """An explicit (h, c) state gets its gradient too."""
    torch.manual_seed(0)
    cell = nn.LSTMCell(4, 5)
    x, h, c = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5)
    outs = []
    grads = []
    for dev in ("cpu", "npu"):
        m = copy.deepcopy(cell).to(dev)
        args = [t.detach().to(dev).requires_grad_() for t in (x, h, c)]
        hy, cy = m(args[0], (args[1], args[2]))
        (hy.sum() + 2 * cy.sum()).backward()
        outs.append((hy.cpu(), cy.cpu()))
        grads.append([a.grad.cpu() for a in args])
    assert_close(outs[1], outs[0])
    assert_close(grads[1], grads[0])
