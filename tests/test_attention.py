"""scaled_dot_product_attention on the npu: CPU's choice of kernel, CPU's flash kernel through PyTorch's
"overrideable" fused-attention ops, bit-equal to CPU forward and backward, math where CPU takes math."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import npusim  # noqa: F401

aten = torch.ops.aten
OVERRIDEABLE = aten._scaled_dot_product_fused_attention_overrideable.default
OVERRIDEABLE_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default


class OpLog(TorchDispatchMode):
    """The aten ops that reach the backend."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _qkv(b: int = 2, h: int = 3, lq: int = 12, lk: int = 12, e: int = 8, dtype: torch.dtype = torch.float32,
         heads_kv: int | None = None, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, lq, e), (b, heads_kv or h, lk, e), (b, heads_kv or h, lk, e)]
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# name -> (q, k, v keyword arguments of _qkv, sdpa keyword arguments)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "plain": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "causal_lq_ne_lk": ({"lq": 5, "lk": 12}, {"is_causal": True}),
    "bool_mask": ({}, {"attn_mask": _rand(12, 12, seed=1) > 0.3}),
    "float_mask_4d": ({}, {"attn_mask": _rand(2, 1, 12, 12, seed=2)}),
    "scale": ({}, {"scale": 0.7}),
    "bfloat16": ({"dtype": torch.bfloat16}, {}),
    "float16_causal": ({"dtype": torch.float16}, {"is_causal": True}),
    "float64": ({"dtype": torch.float64}, {}),
    "grouped_query_heads": ({"h": 4, "heads_kv": 2}, {"enable_gqa": True}),
}


def _on_npu(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to("npu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _forward_backward(tensors: list[torch.Tensor], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = F.scaled_dot_product_attention(*leaves, **kwargs)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(out.device)
    out.backward(grad)
    return [out, *(t.grad for t in leaves)]


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward_bit_equal_to_cpu_through_the_fused_kernel(case):
    """Where CPU takes its flash kernel, npu takes the overrideable fused ops (forward and backward);
    output and the three gradients equal CPU's bit for bit, strides included."""
    shape, kwargs = CASES[case]
    cpu = _qkv(**shape)
    assert torch._fused_sdp_choice(*cpu, **kwargs) == SDPBackend.FLASH_ATTENTION.value
    expected = _forward_backward(cpu, kwargs)
    with OpLog() as log:
        got = _forward_backward([t.to("npu") for t in cpu], _on_npu(kwargs))
    assert OVERRIDEABLE in log.ops and OVERRIDEABLE_BACKWARD in log.ops
    for e, g in zip(expected, got, strict=True):
        assert g.device.type == "npu" and g.stride() == e.stride()
        assert torch.equal(g.cpu(), e), case


# name -> (q, k, v keyword arguments, sdpa keyword arguments); CPU takes math for each.
MATH_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "dropout": ({}, {"dropout_p": 0.3}),
    "mask_requires_grad": ({}, {"attn_mask": torch.randn(12, 12).requires_grad_()}),
}


@pytest.mark.parametrize("case", list(MATH_CASES))
def test_math_where_cpu_takes_math(case):
    """Where CPU's choice is math, npu's is math too: the composite runs (no fused op), and equals
    PyTorch's math kernel run on the npu with the same random state."""
    shape, kwargs = MATH_CASES[case]
    cpu = _qkv(**shape)
    assert torch._fused_sdp_choice(*cpu, **kwargs) == SDPBackend.MATH.value
    npu, npu_kwargs = [t.to("npu") for t in cpu], _on_npu(kwargs)
    assert torch._fused_sdp_choice(*npu, **npu_kwargs) == SDPBackend.MATH.value
    torch.npu.manual_seed(7)
    with OpLog() as log:
        out = F.scaled_dot_product_attention(*npu, **npu_kwargs)
    assert OVERRIDEABLE not in log.ops
    if case == "dropout":
        assert aten.native_dropout.default in log.ops  # the npu generator's dropout
    torch.npu.manual_seed(7)
    math_kwargs = {k: v for k, v in npu_kwargs.items() if k != "attn_mask"}
    reference, _ = aten._scaled_dot_product_attention_math(*npu, npu_kwargs.get("attn_mask"), **math_kwargs)
    assert torch.equal(out.cpu(), reference.cpu())
    if case != "dropout":  # no random numbers: CPU's result exactly
        assert torch.equal(out.cpu(), F.scaled_dot_product_attention(*cpu, **kwargs))


def test_sdpa_kernel_switches_are_honoured():
    """sdpa_kernel(MATH) makes npu take math as CPU does (bit-equal to CPU forced to math); with
    every kernel off both raise; the choice operator answers as the stub does."""
    cpu = _qkv()
    npu = [t.to("npu") for t in cpu]
    assert torch._fused_sdp_choice(*npu) == SDPBackend.OVERRIDEABLE.value
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(*npu) == SDPBackend.MATH.value
        with OpLog() as log:
            out = F.scaled_dot_product_attention(*npu)
        assert OVERRIDEABLE not in log.ops
        assert torch.equal(out.cpu(), F.scaled_dot_product_attention(*cpu))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert torch._fused_sdp_choice(*npu) == SDPBackend.OVERRIDEABLE.value
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), pytest.raises(RuntimeError, match="No viable backend"):
        F.scaled_dot_product_attention(*npu)


def test_direct_calls_reject_what_the_cpu_kernel_cannot_do():
    """The overrideable forward refuses dropout and the debug mask, each with an error naming the
    op and the device."""
    q, k, v = (t.to("npu") for t in _qkv())
    with pytest.raises(NotImplementedError, match="overrideable on npu:0: dropout_p must be 0"):
        OVERRIDEABLE(q, k, v, dropout_p=0.5)
    with pytest.raises(NotImplementedError, match="return_debug_mask=True is not supported"):
        OVERRIDEABLE(q, k, v, return_debug_mask=True)


# name -> (q, k, v keyword arguments of _qkv, mask shape, dtype); the mask broadcasts to (B, H, Lq, Lk).
BIAS_CASES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "full": ({"lk": 10}, (2, 3, 12, 10)),
    "broadcast_2d": ({"lk": 10}, (12, 10)),
    "broadcast_heads": ({"lk": 10}, (2, 1, 12, 10)),
    "broadcast_batch": ({"lk": 10}, (1, 3, 12, 10)),
    "bfloat16": ({"lk": 10, "dtype": torch.bfloat16}, (2, 3, 12, 10)),
    "grouped_query_heads": ({"h": 4, "heads_kv": 2}, (12, 12)),
}


@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_attn_bias_gradient_equals_cpu_math(case):
    """The overrideable op's backward gives the mask a gradient, as CUDA's math path does: the four
    gradients equal CPU's math SDPA (the mask's reduced to its broadcast shape, in its dtype)."""
    shape, mask_shape = BIAS_CASES[case]
    q, k, v = _qkv(**shape)
    mask = _rand(*mask_shape, seed=4).to(q.dtype)
    grad = _rand(*q.shape, seed=5).to(q.dtype)
    cpu = [t.clone().requires_grad_() for t in (q, k, v, mask)]
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3], enable_gqa=k.size(1) != q.size(1)).backward(grad)
    npu = [t.to("npu").requires_grad_() for t in (q, k, v, mask)]
    with OpLog() as log:
        OVERRIDEABLE(*npu)[0].backward(grad.to("npu"))
    assert OVERRIDEABLE_BACKWARD in log.ops
    tol = {"rtol": 2e-2, "atol": 2e-2} if q.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    for name, want, got in zip("qkvm", cpu, npu, strict=True):
        assert got.grad.shape == want.grad.shape and got.grad.dtype == want.grad.dtype, name
        torch.testing.assert_close(got.grad.cpu(), want.grad, **tol, msg=lambda m, name=name: f"{case} d{name}: {m}")


def test_attn_bias_gradient_of_a_causal_call_and_a_masked_row():
    """Called directly with a mask and is_causal, the mask's gradient is zero where the causal mask
    hides a score; a row the mask hides everywhere gets zero gradient (math's safe softmax)."""
    q, k, v = (t.to("npu") for t in _qkv())
    mask = _rand(12, 12, seed=6)
    mask[3] = float("-inf")
    bias = mask.to("npu").requires_grad_()
    out = OVERRIDEABLE(q, k, v, bias, is_causal=True)[0]
    out.backward(torch.ones_like(out))
    g = bias.grad.cpu()
    assert torch.equal(g.triu(1), torch.zeros(12, 12)) and torch.equal(g[3], torch.zeros(12))
    assert g.tril().abs().sum() > 0


def _meta(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.mark.parametrize("layout", ["contiguous", "heads_inner", "packed_qkv"])
def test_results_have_the_layouts_of_the_meta_kernels(layout):
    """The forward's output and log-sum-exp and the backward's gradients (the mask's too) have the
    sizes and strides of PyTorch's meta kernels for these ops (what torch.compile plans with and
    checks), also for q, k, v views of one packed projection, whose strides have gaps."""
    q, k, v = (t.to("npu") for t in _qkv())
    if layout == "heads_inner":  # (B, L, H, E) memory seen as (B, H, L, E), as attention layers make it
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    if layout == "packed_qkv":  # nanoGPT: (B, L, 3*H*E).split(H*E, dim=2), then (B, H, L, E) views
        b, h, lq, e = q.shape
        packed = torch.cat([t.transpose(1, 2).reshape(b, lq, h * e) for t in (q, k, v)], dim=2)
        q, k, v = (t.view(b, lq, h, e).transpose(1, 2) for t in packed.split(h * e, dim=2))
        assert q.stride() == (lq * 3 * h * e, e, 3 * h * e, 1)
    real = OVERRIDEABLE(q, k, v, is_causal=True)
    meta = OVERRIDEABLE(*map(_meta, (q, k, v)), is_causal=True)
    for r, m in zip(real[:2], meta[:2], strict=True):
        assert (r.shape, r.stride(), r.device.type) == (m.shape, m.stride(), "npu")
    out, lse, cq, ck, mq, mk, seed, offset, _ = real
    grad = torch.randn_like(out)
    args = [grad, q, k, v, None, [True, True, True, False], out, lse, cq, ck, mq, mk, 0.0, True, seed, offset]
    real_grads = OVERRIDEABLE_BACKWARD(*args)
    meta_grads = OVERRIDEABLE_BACKWARD(*[_meta(a) if isinstance(a, torch.Tensor) else a for a in args])
    for r, m in zip(real_grads[:3], meta_grads[:3], strict=True):
        assert (r.shape, r.stride()) == (m.shape, m.stride())
    assert real_grads[3] is None
    mask = torch.zeros(1, 3, 12, 12, device="npu").transpose(2, 3)  # broadcast over the batch, transposed
    args[4], args[5], args[13] = mask, [True, True, True, True], False
    real_grads = OVERRIDEABLE_BACKWARD(*args)
    meta_grads = OVERRIDEABLE_BACKWARD(*[_meta(a) if isinstance(a, torch.Tensor) else a for a in args])
    for r, m in zip(real_grads, meta_grads, strict=True):
        assert (r.shape, r.stride()) == (m.shape, m.stride())


class _Block(torch.nn.Module):
    """One causal self-attention block with an MLP, attention through F.scaled_dot_product_attention."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.GELU(), torch.nn.Linear(64, dim))
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm(x))


def test_training_run_does_not_drift_from_cpu():
    """40 Adam steps of an attention block on npu keep every parameter bit-equal to the same run on
    CPU (before the fused kernel the npu took math and drifted)."""
    torch.manual_seed(0)
    cpu_model = _Block()
    npu_model = _Block().to("npu")
    npu_model.load_state_dict(cpu_model.state_dict())
    runs = []
    for model in (cpu_model, npu_model):
        device = next(model.parameters()).device
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(40):
            x = torch.randn(4, 16, 32, generator=g).to(device)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        runs.append([p.detach().cpu() for p in model.parameters()])
    assert all(torch.equal(c, n) for c, n in zip(*runs, strict=True))
