"""npu_prompt_flash_attention, npu_incre_flash_attention, npu_fused_infer_attention_score vs the formula."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import npusim  # noqa: F401
from _attention_reference import (
    BIG,
    attention,
    compressed,
    from_bnsd,
    logsumexp,
    sparse_mask,
    to_bnsd,
    tolerance,
)
from npusim.ops.fused.attention import ArgumentNotSimulatedError

pfa = torch.ops.npu.npu_prompt_flash_attention
ifa = torch.ops.npu.npu_incre_flash_attention
fias = torch.ops.npu.npu_fused_infer_attention_score
HALF = [torch.float16, torch.bfloat16]


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _windowed_reference(q, k, v, *, scale, q_lens, kv_lens, mode=0, user=None, pse=None, pre=BIG, nxt=BIG,
                        q_starts=None, kv_starts=None):
    """Batch by batch: the query rows [qs, qs+ql) attend keys [ks, ks+kl) under the mode's geometry."""
    out = torch.zeros(*q.shape[:3], v.shape[3], dtype=q.dtype)
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens, strict=True)):
        qs = 0 if q_starts is None else q_starts[b]
        ks = 0 if kv_starts is None else kv_starts[b]
        masked = sparse_mask(mode, ql, kl, pre=pre, nxt=nxt) if (user is not None or mode) else None
        if user is not None:
            cut = user[b if user.shape[0] > 1 else 0][..., qs:qs + ql, ks:ks + kl]
            masked = cut if masked is None else masked | cut
        bias = None if pse is None else pse[b if pse.shape[0] > 1 else 0][None, :, qs:qs + ql, ks:ks + kl]
        out[b:b + 1, :, qs:qs + ql] = attention(q[b:b + 1, :, qs:qs + ql], k[b:b + 1, :, ks:ks + kl],
                                                v[b:b + 1, :, ks:ks + kl], scale=scale, masked=masked, pse=bias,
                                                pse_before_scale=False)
    return out


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
def test_prompt_layouts_gqa_mask_and_pse(layout, dtype):
    """PFA: atten_mask with the default next_tokens=0 band, pse_shift after the scale, 4 heads on 2."""
    b, n, nkv, sq, skv, d = 2, 4, 2, 5, 7, 16
    q, k, v = _randn(b, n, sq, d), _randn(b, nkv, skv, d, seed=1), _randn(b, nkv, skv, d, seed=2)
    user = torch.rand(b, 1, sq, skv, generator=torch.Generator().manual_seed(3)) < 0.2
    user[..., 0] = False
    pse = _randn(b, n, sq, skv, seed=4)
    in_layout = layout.split("_")[0]
    args = [from_bnsd(t, in_layout).to(dtype).to("npu") for t in (q, k, v)]
    out = pfa(*args, atten_mask=user.to("npu"), pse_shift=pse.to(dtype).to("npu"), num_heads=n,
              num_key_value_heads=nkv, scale_value=0.25, input_layout=layout)
    ref = _windowed_reference(q, k, v, scale=0.25, q_lens=[sq] * b, kv_lens=[skv] * b, user=user, pse=pse, nxt=0)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), from_bnsd(ref, layout.split("_")[-1]), **tolerance(dtype))


@pytest.mark.parametrize("mode", [1, 2, 3, 4, 13])
def test_prompt_sparse_modes_with_actual_lengths(mode):
    """PFA sparse_mode 1-4 (13 = 3 in high precision) with per-batch actual lengths; invalid rows are 0."""
    b, n, sq, skv, d = 2, 2, 6, 8, 16
    q, k, v = _randn(b, n, sq, d), _randn(b, n, skv, d, seed=1), _randn(b, n, skv, d, seed=2)
    user = torch.rand(b, 1, sq, skv, generator=torch.Generator().manual_seed(3)) < 0.3
    user[..., 0] = False
    q_lens, kv_lens = [6, 4], [8, 5]
    mask = user.to("npu") if mode == 1 else compressed(mode % 10)
    out = pfa(*(t.half().to("npu") for t in (q, k, v)), atten_mask=mask, actual_seq_lengths=q_lens,
              actual_seq_lengths_kv=kv_lens, num_heads=n, scale_value=0.3, input_layout="BNSD", sparse_mode=mode,
              pre_tokens=2, next_tokens=1)
    ref = _windowed_reference(q, k, v, scale=0.3, q_lens=q_lens, kv_lens=kv_lens, mode=mode % 10,
                              user=user if mode == 1 else None, pre=2, nxt=1)
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(torch.float16))
    assert not out[1, :, 4:].any()


def test_prompt_and_fused_tnd_per_sequence():
    """TND: sequences packed with cumulative lengths, rightDownCausal per sequence; FIAS's TND_NTD too."""
    seqs_q, seqs_kv, n, d = [3, 5], [4, 7], 4, 16
    q, k, v = _randn(8, n, d), _randn(11, 2, d, seed=1), _randn(11, 2, d, seed=2)
    cum = dict(actual_seq_lengths=[3, 8], actual_seq_lengths_kv=[4, 11])
    args = [t.half().to("npu") for t in (q, k, v)]
    out = pfa(*args, atten_mask=compressed(3), sparse_mode=3, num_heads=n, num_key_value_heads=2, scale_value=0.5,
              input_layout="TND", **cum)
    fused, lse = fias(*args, atten_mask=compressed(3), sparse_mode=3, num_heads=n, num_key_value_heads=2, scale=0.5,
                      input_layout="TND_NTD", softmax_lse_flag=True, **cum)
    ref, ref_lse, pq, pk = torch.zeros(8, n, d, dtype=torch.float64), torch.zeros(8, n, 1, dtype=torch.float64), 0, 0
    for lq, lk in zip(seqs_q, seqs_kv, strict=True):
        qi, ki, vi = (x[p:p + m].transpose(0, 1)[None] for x, p, m in ((q, pq, lq), (k, pk, lk), (v, pk, lk)))
        masked = sparse_mask(3, lq, lk)
        ref[pq:pq + lq] = attention(qi, ki, vi, scale=0.5, masked=masked)[0].transpose(0, 1)
        ref_lse[pq:pq + lq] = logsumexp(qi, ki, scale=0.5, masked=masked)[0].transpose(0, 1)
        pq, pk = pq + lq, pk + lk
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(torch.float16))
    torch.testing.assert_close(fused.cpu().double(), ref.transpose(0, 1), **tolerance(torch.float16))
    assert lse.shape == (8, n, 1) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", HALF)
def test_incremental_decode_with_lengths_mask_pse_and_left_padding(dtype):
    """IFA: one token per batch; actual_seq_lengths are the keys' lengths; (B, KV_S) mask; left padding."""
    b, n, nkv, skv, d = 2, 4, 1, 9, 16
    q, k, v = _randn(b, n, 1, d), _randn(b, nkv, skv, d, seed=1), _randn(b, nkv, skv, d, seed=2)
    user = torch.zeros(b, skv, dtype=torch.bool)
    user[0, 1] = user[1, 6] = True
    pse = _randn(b, n, 1, skv, seed=5)
    args = [from_bnsd(t, "BSH").to(dtype).to("npu") for t in (q, k, v)]
    common = dict(num_heads=n, num_key_value_heads=nkv, scale_value=0.25, input_layout="BSH",
                  actual_seq_lengths=[5, 9])
    out = ifa(*args, atten_mask=user.to("npu"), pse_shift=pse.to(dtype).to("npu"), **common)
    ref = _windowed_reference(q, k, v, scale=0.25, q_lens=[1, 1], kv_lens=[5, 9], user=user[:, None, None],
                              pse=pse)
    torch.testing.assert_close(out.cpu().double(), from_bnsd(ref, "BSH"), **tolerance(dtype))
    padded = ifa(*args, kv_padding_size=torch.tensor([2, 0], device="npu"), **common)
    ref = _windowed_reference(q, k, v, scale=0.25, q_lens=[1, 1], kv_lens=[5, 9], kv_starts=[2, 0])
    torch.testing.assert_close(padded.cpu().double(), from_bnsd(ref, "BSH"), **tolerance(dtype))
    before_row_0 = ifa(*args, kv_padding_size=torch.tensor([6, 0], device="npu"), **common)  # start 9 - 6 - 5 < 0
    assert not before_row_0[0].any()  # op-plugin: that batch's output is 0
    torch.testing.assert_close(before_row_0[1].cpu(), padded[1].cpu())


@pytest.mark.parametrize("cache_layout", ["BnBsH", "BnNBsD"])
def test_paged_kv_cache_equals_the_dense_cache(cache_layout):
    """block_table maps each sequence's logical blocks onto a shuffled cache; the result is the dense one."""
    b, n, nkv, d, block, blocks_per_seq = 2, 4, 2, 16, 4, 3
    k, v = _randn(b, nkv, block * blocks_per_seq, d, seed=1), _randn(b, nkv, block * blocks_per_seq, d, seed=2)
    q = _randn(b, n, 1, d)
    order = torch.tensor([4, 0, 5, 2, 3, 1])  # physical slot of logical block i (batch-major)
    table = order.view(b, blocks_per_seq).to(torch.int32)

    def cache(x):  # (B, N, S, D) -> physical blocks in the cache layout
        logical = x.view(b, nkv, blocks_per_seq, block, d).permute(0, 2, 1, 3, 4).reshape(-1, nkv, block, d)
        physical = torch.empty_like(logical)
        physical[order] = logical
        return physical.transpose(1, 2).flatten(2) if cache_layout == "BnBsH" else physical

    lengths = [10, 7]
    dense = fias(*(from_bnsd(t, "BNSD").half().to("npu") for t in (q, k, v)), actual_seq_lengths_kv=lengths,
                 num_heads=n, num_key_value_heads=nkv, scale=0.3, input_layout="BNSD")[0]
    paged, _ = fias(q.half().to("npu"), cache(k).half().to("npu"), cache(v).half().to("npu"),
                    block_table=table.to("npu"), block_size=block, actual_seq_lengths_kv=lengths, num_heads=n,
                    num_key_value_heads=nkv, scale=0.3, input_layout="BNSD")
    ref = _windowed_reference(q, k, v, scale=0.3, q_lens=[1, 1], kv_lens=lengths)
    torch.testing.assert_close(paged.cpu(), dense.cpu())
    torch.testing.assert_close(paged.cpu().double(), ref, **tolerance(torch.float16))


@pytest.mark.parametrize("layout", ["BSH", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD"])
def test_fused_prefill_and_decode_branches_and_lse(layout):
    """FIAS is PFA for Q_S > 1 and IFA for Q_S == 1; softmax_lse is the rows' log-sum-exp."""
    b, n, sq, skv, d = 2, 4, 5, 6, 16
    in_layout, out_layout = layout.split("_")[0], layout.split("_")[-1]
    q, k, v = _randn(b, n, sq, d), _randn(b, n, skv, d, seed=1), _randn(b, n, skv, d, seed=2)
    args = [from_bnsd(t, in_layout).half().to("npu") for t in (q, k, v)]
    out, lse = fias(*args, num_heads=n, scale=0.2, input_layout=layout, softmax_lse_flag=True)
    prompt = pfa(*args, num_heads=n, scale_value=0.2, input_layout=in_layout, next_tokens=BIG)
    torch.testing.assert_close(out.cpu(), from_bnsd(to_bnsd(prompt.cpu(), in_layout, n), out_layout))
    assert lse.shape == (b, n, sq, 1)
    torch.testing.assert_close(lse.cpu().double(), logsumexp(q, k, scale=0.2), atol=2e-3, rtol=2e-3)
    q1 = [from_bnsd(q[:, :, :1], in_layout).half().to("npu")] + args[1:]
    decode, no_lse = fias(*q1, num_heads=n, scale=0.2, input_layout=layout, actual_seq_lengths_kv=[4, 6])
    incremental = ifa(*q1, num_heads=n, scale_value=0.2, input_layout=in_layout, actual_seq_lengths=[4, 6])
    assert no_lse.shape == (1,) and not no_lse.any()
    torch.testing.assert_close(decode.cpu(), from_bnsd(to_bnsd(incremental.cpu(), in_layout, n), out_layout))


def test_fused_shared_prefix_rope_and_query_left_padding():
    """A shared prefix is keys in front of every batch; rope parts join the dot product; left padding."""
    b, n, sq, skv, d, p = 2, 2, 4, 5, 16, 3
    q, k, v = _randn(b, n, sq, d), _randn(b, n, skv, d, seed=1), _randn(b, n, skv, d, seed=2)
    kp, vp = _randn(1, n, p, d, seed=3), _randn(1, n, p, d, seed=4)
    half = lambda *ts: [t.half().to("npu") for t in ts]  # noqa: E731
    out = fias(*half(q, k, v), key_shared_prefix=half(kp)[0], value_shared_prefix=half(vp)[0],
               actual_shared_prefix_len=[2], actual_seq_lengths_kv=[5, 3], num_heads=n, scale=0.3,
               input_layout="BNSD")[0]
    joined_k = torch.cat([kp[:, :, :2].expand(b, -1, -1, -1), k], 2)
    joined_v = torch.cat([vp[:, :, :2].expand(b, -1, -1, -1), v], 2)
    ref = _windowed_reference(q, joined_k, joined_v, scale=0.3, q_lens=[sq] * b, kv_lens=[7, 5])
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(torch.float16))

    q_rope, k_rope = _randn(b, n, sq, 8, seed=5), _randn(b, n, skv, 8, seed=6)
    out = fias(*half(q, k, v), query_rope=half(q_rope)[0], key_rope=half(k_rope)[0], num_heads=n, scale=0.3,
               input_layout="BNSD")[0]
    ref = attention(torch.cat([q, q_rope], -1), torch.cat([k, k_rope], -1), v, scale=0.3)
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(torch.float16))

    out = fias(*half(q, k, v), query_padding_size=torch.tensor([1, 0], device="npu"), actual_seq_lengths=[3, 2],
               kv_padding_size=torch.tensor([0, 2], device="npu"), actual_seq_lengths_kv=[5, 3], num_heads=n,
               scale=0.3, input_layout="BNSD")[0]
    ref = _windowed_reference(q, k, v, scale=0.3, q_lens=[3, 2], kv_lens=[5, 3], q_starts=[0, 2], kv_starts=[0, 0])
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(torch.float16))


NOT_SIMULATED = [
    (pfa, "deq_scale1"), (pfa, "quant_scale2"), (ifa, "antiquant_scale"), (ifa, "dequant_scale2"),
    (fias, "key_antiquant_scale"), (fias, "quant_offset2"), (fias, "key_rope_antiquant_scale"), (pfa, "padding_mask"),
]


@pytest.mark.parametrize("op,argument", NOT_SIMULATED, ids=[f"{o.__name__}-{a}" for o, a in NOT_SIMULATED])
def test_quantization_arguments_are_refused_by_name(op, argument):
    """Quantized attention stays out of scope: ArgumentNotSimulatedError names the op and the argument."""
    q = torch.randn(1, 1, 32, dtype=torch.float16, device="npu")
    with pytest.raises(ArgumentNotSimulatedError, match=f"{op.__name__}: argument {argument} is not "
                                                        "simulated by npusim"):
        op(q, q, q, num_heads=2, **{argument: torch.ones(1, device="npu")})


INFER_ERRORS = [
    (pfa, dict(dtype=torch.float32), "npu_prompt_flash_attention: query must be one of float16, bfloat16"),
    (pfa, dict(sparse_mode=5), r"sparse_mode must be 0-4 \(op-plugin does not support 5-8 here\), got 5"),
    (pfa, dict(sparse_mode=3), r"sparse_mode 3 needs its compressed atten_mask \(2048x2048\)"),
    (pfa, dict(input_layout="SBH"), "input_layout must be one of BSH, BSND, BNSD, BNSD_BSND, TND, got 'SBH'"),
    (pfa, dict(num_key_value_heads=3), r"num_heads \(2\) must be a positive multiple of num_key_value_heads \(3\)"),
    (ifa, dict(seq=2), r"the query must have one token per batch \(decode\)"),
    (fias, dict(input_layout="BNSD_BSND", seq=1, layout4=True), "input_layout BNSD_BSND needs more than one query"),
    (fias, dict(actual_seq_lengths=[9], seq=4), r"actual_seq_lengths must be within 0..4, got \[9\]"),
    (fias, dict(block_table=torch.zeros(1, 2, dtype=torch.int32)), "block_table .page attention. needs block_size"),
    (fias, dict(device="cpu"), "npu_fused_infer_attention_score: expected npu tensors, got query on cpu"),
]


@pytest.mark.parametrize("op,change,message", INFER_ERRORS, ids=[str(i) for i in range(len(INFER_ERRORS))])
def test_inference_bad_arguments(op, change, message):
    """Bad layouts, dtypes, modes, lengths and devices raise errors naming the op and the argument."""
    change = dict(change)
    dtype, device, seq = change.pop("dtype", torch.float16), change.pop("device", "npu"), change.pop("seq", 3)
    shape = (1, 2, seq, 16) if change.pop("layout4", False) else (1, seq, 32)
    q = torch.randn(shape, dtype=dtype, device=device)
    if "block_table" in change:
        change["block_table"] = change["block_table"].to(device)
    with pytest.raises(RuntimeError, match=message):
        op(q, q, q, num_heads=2, **change)
    int8 = torch.zeros(1, 3, 32, dtype=torch.int8, device="npu")
    with pytest.raises(ArgumentNotSimulatedError, match="key of dtype torch.int8 .a quantized cache."):
        fias(torch.zeros(1, 3, 32, dtype=torch.float16, device="npu"), int8, int8, num_heads=2)


def test_fake_shapes_and_compiled_decode_step():
    """Fake kernels give the kernels' shapes; a decode step traced with fullgraph=True (aot_eager) equals eager."""
    with FakeTensorMode():
        q, kv = torch.empty(2, 3, 4, 16, dtype=torch.float16, device="npu"), torch.empty(2, 1, 7, 16,
                                                                                          dtype=torch.float16,
                                                                                          device="npu")
        out, lse = fias(q, kv, kv, num_heads=3, num_key_value_heads=1, input_layout="BNSD_NBSD",
                        softmax_lse_flag=True)
        assert out.shape == (3, 2, 4, 16) and lse.shape == (2, 3, 4, 1)
        assert pfa(q, kv, kv, num_heads=3, num_key_value_heads=1, input_layout="BNSD_BSND").shape == (2, 4, 3, 16)
        assert ifa(q[:, :, :1], kv, kv, num_heads=3, num_key_value_heads=1, input_layout="BNSD").shape == (2, 3, 1, 16)
    q = torch.randn(2, 1, 64, dtype=torch.float16, device="npu")
    cache_k, cache_v = (torch.randn(2, 6, 32, dtype=torch.float16, device="npu") for _ in range(2))

    def decode(q, cache_k, cache_v):
        return fias(q, cache_k, cache_v, num_heads=4, num_key_value_heads=2, scale=0.25, input_layout="BSH",
                    actual_seq_lengths_kv=[6, 4])[0] * 2

    torch.testing.assert_close(torch.compile(decode, fullgraph=True, backend="aot_eager")(q, cache_k, cache_v).cpu(),
                               decode(q, cache_k, cache_v).cpu())


def test_fused_out_overload_writes_caller_outputs():
    """npu_fused_infer_attention_score.out writes the functional op's values into attention_out / softmax_lse and
    returns them (an empty output is resized; workspace is accepted); a wrong dtype is refused naming the output;
    a compiled call (fullgraph, functionalized) writes the same values."""
    b, n, sq, skv, d = 2, 4, 5, 6, 16
    q, k, v = (_randn(b, sq if i == 0 else skv, n * d, seed=i).half().to("npu") for i in range(3))
    options = {"num_heads": n, "scale": 0.2, "input_layout": "BSH", "softmax_lse_flag": True,
               "actual_seq_lengths_kv": [6, 3]}
    want_out, want_lse = fias(q, k, v, **options)
    attention_out = torch.empty(0, dtype=torch.float16, device="npu")
    softmax_lse = torch.empty(b, n, sq, 1, device="npu")
    result = fias.out(q, k, v, **options, workspace=torch.empty(64, dtype=torch.uint8, device="npu"),
                      attention_out=attention_out, softmax_lse=softmax_lse)
    assert result[0] is attention_out and result[1] is softmax_lse
    assert torch.equal(attention_out.cpu(), want_out.cpu()) and torch.equal(softmax_lse.cpu(), want_lse.cpu())
    ref = attention(*(to_bnsd(t.cpu().double(), "BSH", n) for t in (q, k, v)), scale=0.2,
                    masked=torch.arange(skv).view(1, 1, 1, skv) >= torch.tensor([6, 3]).view(b, 1, 1, 1))
    torch.testing.assert_close(attention_out.cpu().double(), from_bnsd(ref, "BSH"), **tolerance(torch.float16))
    with pytest.raises(RuntimeError, match="npu_fused_infer_attention_score: softmax_lse must be float32 .the "
                                           "result's dtype., got float16"):
        fias.out(q, k, v, **options, attention_out=attention_out, softmax_lse=softmax_lse.half())

    def step(q, k, v, attention_out, softmax_lse):
        fias.out(q, k, v, **options, attention_out=attention_out, softmax_lse=softmax_lse)
        return attention_out * 2

    outputs = [torch.zeros_like(want_out), torch.zeros_like(want_lse)]
    doubled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, *outputs)
    assert torch.equal(doubled.cpu(), (want_out * 2).cpu()) and torch.equal(outputs[1].cpu(), want_lse.cpu())
