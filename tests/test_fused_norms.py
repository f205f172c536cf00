"""op-plugin's RMSNorm operators on npu (npu_rms_norm, npu_gemma_rms_norm, npu_add_rms_norm) against their
documented formulas, and torchtitan-npu's npu_rms_norm converter pattern under `npusim run`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.testing import assert_close

from _fused_util import DTYPES, assert_device_errors, assert_matches, gradcheck, opcheck, randn

ops = torch.ops.npu


def _reference_rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float, gemma: bool = False):
    """The docs' formula in float32: x / sqrt(mean(x^2) + eps) * g (Gemma: * (1 + g)), rstd with kept dims."""
    x, gamma = x.float(), gamma.float()
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = 1 / torch.sqrt((x * x).mean(dims, keepdim=True) + eps)
    return x * rstd * ((1 + gamma) if gemma else gamma), rstd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma_dims", [1, 2])
def test_rms_norm_matches_formula(dtype, gamma_dims):
    """y and rstd (float32, size 1 over the normalized dims) equal the formula; gamma may span the last 2 dims."""
    x, gamma = randn(3, 4, 16, dtype=dtype), randn(*(4, 16)[2 - gamma_dims:], dtype=dtype, seed=1)
    y, rstd = ops.npu_rms_norm(x.npu(), gamma.npu(), 1e-5)
    ref_y, ref_rstd = _reference_rms_norm(x, gamma, 1e-5)
    assert y.dtype == dtype and rstd.dtype == torch.float32
    assert rstd.shape == ((3, 4, 1) if gamma_dims == 1 else (3, 1, 1))
    assert_matches(y, ref_y)
    assert_matches(rstd, ref_rstd, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_takes_a_float32_gamma_with_16_bit_input(dtype):
    """The A2/A3 dtype table pairs float16 / bfloat16 self with a float32 gamma; y keeps self's dtype."""
    x, gamma = randn(4, 32, dtype=dtype), randn(32, seed=1)
    y, _ = ops.npu_rms_norm(x.npu(), gamma.npu())
    assert y.dtype == dtype
    assert_matches(y, _reference_rms_norm(x, gamma, 1e-6)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward_matches_autograd_of_the_formula(dtype):
    """dx and dgamma through autograd (npu_rms_norm_backward) equal autograd of the float32 formula."""
    x, gamma, dy = randn(6, 24, dtype=dtype), randn(24, dtype=dtype, seed=1), randn(6, 24, dtype=dtype, seed=2)
    xn, gn = x.npu().requires_grad_(), gamma.npu().requires_grad_()
    ops.npu_rms_norm(xn, gn)[0].backward(dy.npu())
    xr, gr = x.float().requires_grad_(), gamma.float().requires_grad_()
    _reference_rms_norm(xr, gr, 1e-6)[0].backward(dy.float())
    assert xn.grad.dtype == dtype and gn.grad.dtype == dtype
    assert_matches(xn.grad, xr.grad)
    assert_matches(gn.grad, gr.grad, torch.float32 if dtype == torch.float32 else torch.bfloat16)


def test_rms_norm_gradcheck():
    """npu_rms_norm's backward passes gradcheck in float64, with a 1-D and a 2-D gamma."""
    x = randn(3, 4, 5)
    gradcheck(lambda a, g: ops.npu_rms_norm(a, g, 1e-3)[0], x, randn(5, seed=1))
    gradcheck(lambda a, g: ops.npu_rms_norm(a, g, 1e-3)[0], x, randn(4, 5, seed=1))


def test_rms_norm_backward_op_gives_float32_dgamma():
    """npu_rms_norm_backward is an op of its own: (dx in self's dtype, dgamma in float32), as op-plugin's meta says."""
    x, gamma = randn(4, 8, dtype=torch.bfloat16).npu(), randn(8, dtype=torch.bfloat16, seed=1).npu()
    _, rstd = ops.npu_rms_norm(x, gamma)
    dx, dgamma = ops.npu_rms_norm_backward(torch.ones_like(x), x, gamma, rstd)
    assert dx.dtype == torch.bfloat16 and dgamma.dtype == torch.float32 and dgamma.shape == (8,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_rms_norm_scales_by_one_plus_gamma(dtype):
    """npu_gemma_rms_norm is x * rstd * (1 + gamma) (op-plugin's test reference); it has no backward."""
    x, gamma = randn(5, 16, dtype=dtype), randn(16, dtype=dtype, seed=1)
    y, rstd = ops.npu_gemma_rms_norm(x.npu(), gamma.npu())
    ref_y, ref_rstd = _reference_rms_norm(x, gamma, 1e-6, gemma=True)
    assert_matches(y, ref_y)
    assert_matches(rstd, ref_rstd, torch.float32)
    out = ops.npu_gemma_rms_norm(x.npu().requires_grad_(), gamma.npu())[0]
    with pytest.raises(RuntimeError, match="derivative for npu::npu_gemma_rms_norm is not implemented"):
        out.float().sum().backward()


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_returns_norm_rstd_and_sum(dtype):
    """(RMSNorm(x1 + x2) * gamma, rstd, x1 + x2); torch_npu marks it not differentiable, so backward raises."""
    x1, x2 = randn(2, 3, 16, dtype=dtype), randn(2, 3, 16, dtype=dtype, seed=1)
    gamma = randn(16, dtype=dtype, seed=2)
    y, rstd, total = ops.npu_add_rms_norm(x1.npu(), x2.npu(), gamma.npu(), 1e-6)
    ref_y, ref_rstd = _reference_rms_norm(x1.float() + x2.float(), gamma, 1e-6)
    assert_matches(y, ref_y)
    assert_matches(rstd, ref_rstd, torch.float32)
    assert_matches(total, x1.float() + x2.float())
    out = ops.npu_add_rms_norm(x1.npu().requires_grad_(), x2.npu(), gamma.npu())[0]
    with pytest.raises(RuntimeError, match="derivative for npu::npu_add_rms_norm is not implemented"):
        out.float().sum().backward()


def test_norm_errors_name_the_op_and_argument():
    """Bad shapes, dtypes and devices raise naming the op and the argument; no kernel runs on CPU tensors."""
    x, gamma = randn(4, 8).npu(), randn(8).npu()
    with pytest.raises(RuntimeError, match=r"npu_rms_norm: gamma must have the trailing shape of self \(8,\)"):
        ops.npu_rms_norm(x, gamma[:4])
    with pytest.raises(RuntimeError, match="npu_rms_norm: self must be float16, .* or float64, got int64"):
        ops.npu_rms_norm(x.long(), gamma)
    with pytest.raises(RuntimeError, match=r"npu_gemma_rms_norm: gamma must have the dtype of self \(float32\)"):
        ops.npu_gemma_rms_norm(x, gamma.half())
    with pytest.raises(RuntimeError, match=r"npu_add_rms_norm: x2 must have the shape of x1"):
        ops.npu_add_rms_norm(x, x[:2], gamma)
    with pytest.raises(RuntimeError, match="npu_rms_norm: self must be on an npu device, got cpu"):
        ops.npu_rms_norm(x.cpu(), gamma.cpu())
    assert_device_errors(ops.npu_rms_norm, [x, gamma], 1, "gamma", "npu_rms_norm")
    assert_device_errors(ops.npu_add_rms_norm, [x, x, gamma], 2, "gamma", "npu_add_rms_norm")


def test_norms_on_the_meta_device():
    """Meta tensors get op-plugin's output shapes and dtypes (meta-device model init)."""
    with torch.device("meta"):
        x, gamma = torch.empty(2, 3, 8, dtype=torch.bfloat16), torch.empty(8)
        y, rstd = ops.npu_rms_norm(x, gamma)
        y2, rstd2, total = ops.npu_add_rms_norm(x, x, gamma.bfloat16())
    assert y.dtype == torch.bfloat16 and rstd.dtype == torch.float32 and rstd.shape == (2, 3, 1)
    assert total.shape == x.shape and rstd2.shape == (2, 3, 1)


_CONVERTER_SCRIPT = textwrap.dedent("""
    import json, torch, torch.nn as nn, torch_npu

    class NPURMSNorm(nn.Module):  # torchtitan-npu's converters/kernels/rms_norm.py pattern
        def __init__(self, dim, eps):
            super().__init__()
            self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))
        def forward(self, x):
            return torch_npu.npu_rms_norm(x, self.weight, self.eps)[0]

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32, eps=1e-6), nn.Linear(32, 4)).to("npu")

    def replace_rms_norms(module):
        for name, child in module.named_children():
            if type(child).__name__ == "RMSNorm":
                new = NPURMSNorm(child.weight.shape[-1], child.eps).to("npu")
                new.weight.data.copy_(child.weight.data)
                setattr(module, name, new)
            else:
                replace_rms_norms(child)
        return module

    def train(net):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).npu()
        for _ in range(3):
            opt.zero_grad()
            loss = net(x).square().mean()
            loss.backward()
            opt.step()
        return [p.detach().cpu().tolist() for p in net.parameters()], loss.item()

    converted = replace_rms_norms(model())
    print(json.dumps({"kinds": [type(m).__name__ for m in converted],
                      "fused": train(converted), "plain": train(model())}))
""")


def test_torchtitan_npu_rms_norm_converter_under_npusim_run(tmp_path):
    """A model whose RMSNorms are swapped for torch_npu.npu_rms_norm (torchtitan-npu's converter) trains, under
    `npusim run`, as the same model with nn.RMSNorm does."""
    script = tmp_path / "converted.py"
    script.write_text(_CONVERTER_SCRIPT)
    result = subprocess.run([sys.executable, "-m", "npusim", "run", str(script)], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["kinds"] == ["Linear", "NPURMSNorm", "Linear"]
    (fused, fused_loss), (plain, plain_loss) = out["fused"], out["plain"]
    for a, b in zip(fused, plain, strict=True):
        assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    assert fused_loss == pytest.approx(plain_loss, rel=1e-5)


def test_norm_ops_pass_opcheck():
    """PyTorch's opcheck (schema, fake kernel, AOT tracing) of every norm operator and backward op."""
    x, gamma = randn(3, 8).npu().requires_grad_(), randn(8, seed=1).npu().requires_grad_()
    opcheck(ops.npu_rms_norm, x, gamma, 1e-5)
    opcheck(ops.npu_gemma_rms_norm, x.detach(), gamma.detach())  # no backward: no inputs requiring grad
    opcheck(ops.npu_add_rms_norm, x.detach(), x.detach(), gamma.detach())
    _, rstd = ops.npu_rms_norm(x, gamma)
    opcheck(ops.npu_rms_norm_backward, torch.ones_like(x), x.detach(), gamma.detach(), rstd.detach())
