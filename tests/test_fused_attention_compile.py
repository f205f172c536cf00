"""npu_fusion_attention under torch.compile, FakeTensor and the meta device."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import npusim  # noqa: F401
from _attention_reference import compressed

fa = torch.ops.npu.npu_fusion_attention


class AttentionBlock(torch.nn.Module):
    """A GQA self-attention block written with the fused op (BSH, rightDownCausal)."""

    def __init__(self, hidden=32, heads=4, kv_heads=2, keep_prob=1.0, seed=0):
        super().__init__()
        self.heads, self.kv_dim, self.keep_prob, self.seed = heads, hidden // heads * kv_heads, keep_prob, seed
        self.qkv = torch.nn.Linear(hidden, hidden + 2 * self.kv_dim)
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).split([x.shape[-1], self.kv_dim, self.kv_dim], -1)
        out = fa(q, k, v, self.heads, "BSH", atten_mask=mask, sparse_mode=3, scale=0.35, keep_prob=self.keep_prob,
                 seed=self.seed)[0]
        return self.proj(out)


def _run(block, compiled, x, mask, seed=0):
    torch.npu.manual_seed(seed)
    out = compiled(x, mask)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    return out.detach(), grads


@pytest.mark.parametrize("keep_prob,seed", [(1.0, 0), (0.8, 4321)])
def test_compiled_block_fullgraph_equals_eager(keep_prob, seed):
    """fullgraph=True compiles the block; forward and parameter gradients equal eager (dropout with a seed too)."""
    torch.manual_seed(0)
    block = AttentionBlock(keep_prob=keep_prob, seed=seed).to("npu")
    x, mask = torch.randn(2, 6, 32, device="npu"), compressed(3)
    eager = _run(block, block, x, mask)
    compiled = _run(block, torch.compile(block, fullgraph=True), x, mask)
    torch.testing.assert_close(compiled[0].cpu(), eager[0].cpu(), atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-5, rtol=1e-5)


def test_generator_dropout_breaks_the_graph_instead_of_tracing_a_seed():
    """Note [npu_fusion_attention under torch.compile]: fullgraph names the op; a graph break stays exact."""
    torch.manual_seed(0)
    block = AttentionBlock(keep_prob=0.7).to("npu")
    x, mask = torch.randn(2, 6, 32, device="npu"), compressed(3)
    with pytest.raises(Exception, match="npu_fusion_attention") as info:
        torch.compile(block, fullgraph=True)(x, mask)
    assert "Data dependent operator" in str(info.value)
    torch._dynamo.reset()
    eager = _run(block, block, x, mask, seed=9)
    compiled = _run(block, torch.compile(block), x, mask, seed=9)
    torch.testing.assert_close(compiled[0].cpu(), eager[0].cpu(), atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-5, rtol=1e-5)


def test_fake_and_meta_tensors_give_op_plugin_shapes():
    """FakeTensor and meta-device calls return the shapes the kernels return, with numels."""
    with FakeTensorMode():
        q, kv = torch.empty(2, 8, 64, device="npu"), torch.empty(2, 10, 32, device="npu")
        out, smax, ssum, sout, seed, offset, numels = fa(q, kv, kv, 4, "BSH")
        assert (out.shape, smax.shape, sout.shape, seed, offset, numels) == (
            (2, 8, 64), (2, 4, 8, 8), (0,), 0, 0, 2 * 4 * 8 * 10)
        grads = torch.ops.npu.npu_fusion_attention_grad(q, kv, kv, out, 4, "BSH", softmax_max=smax, softmax_sum=ssum)
        assert [g.shape for g in grads] == [(2, 8, 64), (2, 10, 32), (2, 10, 32), (0,), (0,)]
    t = torch.empty(7, 4, 16, device="meta")
    out, smax, *_, numels = fa(t, t, t, 4, "TND", keep_prob=0.5, actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7])
    assert out.device.type == "meta" and out.shape == (7, 4, 16) and smax.shape == (7, 4, 8)
    assert numels == 4 * (9 + 16)


class AttentionBlockV3(AttentionBlock):
    """The block with npu_fusion_attention_v3 and dropout drawn from the generator."""

    def forward(self, x, mask):
        q, k, v = self.qkv(x).split([x.shape[-1], self.kv_dim, self.kv_dim], -1)
        out = torch.ops.npu.npu_fusion_attention_v3(q, k, v, self.heads, "BSH", atten_mask=mask, sparse_mode=3,
                                                    scale=0.35, keep_prob=self.keep_prob)[0]
        return self.proj(out)


def test_v3_generator_dropout_compiles_fullgraph_and_equals_eager():
    """Note [npu_fusion_attention_v3 under torch.compile]: with seed / offset as tensors, dropout drawn from the
    generator compiles with fullgraph=True; forward and gradients equal eager under the same manual_seed."""
    torch.manual_seed(0)
    block = AttentionBlockV3(keep_prob=0.7).to("npu")
    x, mask = torch.randn(2, 6, 32, device="npu"), compressed(3)
    eager = _run(block, block, x, mask, seed=9)
    compiled = _run(block, torch.compile(block, fullgraph=True), x, mask, seed=9)
    torch.testing.assert_close(compiled[0].cpu(), eager[0].cpu(), atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-5, rtol=1e-5)


def test_v3_fake_tensors_give_op_plugin_shapes_with_unknown_lengths():
    """v3's fake kernel gives op-plugin's shapes (seed / offset (1,) int64) for TND with length tensors whose
    values it cannot read, and grad_v3's the inputs' shapes."""
    q, k = torch.randn(9, 4, 8, device="npu"), torch.randn(11, 2, 8, device="npu")
    lengths_q, lengths_kv = torch.tensor([4, 9]), torch.tensor([5, 11])
    mask = torch.ones(5, 6, dtype=torch.bool, device="npu")  # (maxSq, maxSkv): checked when the lengths are known
    with FakeTensorMode() as mode:
        fq, fk = mode.from_tensor(q), mode.from_tensor(k)
        fl_q, fl_kv = mode.from_tensor(lengths_q), mode.from_tensor(lengths_kv)
        out = torch.ops.npu.npu_fusion_attention_v3(fq, fk, fk, 4, "TND", actual_seq_qlen=fl_q,
                                                    actual_seq_kvlen=fl_kv, atten_mask=mode.from_tensor(mask))
        assert [tuple(t.shape) for t in out] == [(9, 4, 8), (9, 4, 8), (9, 4, 8), (0,), (1,), (1,)]
        assert out[4].dtype == torch.int64 and out[4].device == q.device
        grads = torch.ops.npu.npu_fusion_attention_grad_v3(fq, fk, fk, out[0], 4, "TND", actual_seq_qlen=fl_q,
                                                           actual_seq_kvlen=fl_kv, softmax_max=out[1],
                                                           softmax_sum=out[2], seed=out[4], offset=out[5])
        assert [tuple(t.shape) for t in grads[:3]] == [(9, 4, 8), (11, 2, 8), (11, 2, 8)]
