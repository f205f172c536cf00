"""npu_fusion_attention / npu_fusion_attention_grad on the npu against op-plugin's formula."""

from __future__ import annotations

import math

import pytest
import torch

import npusim  # noqa: F401
from _attention_reference import BIG, attention, compressed, from_bnsd, sparse_mask, to_bnsd, tolerance

fa = torch.ops.npu.npu_fusion_attention
fa_grad = torch.ops.npu.npu_fusion_attention_grad
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(shape_q, shape_kv, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda shape: torch.randn(shape, generator=gen, dtype=torch.float64)  # noqa: E731
    return make(shape_q), make(shape_kv), make(shape_kv)


def _npu(*tensors, dtype):
    return [t.to(dtype).to("npu").requires_grad_() for t in tensors]


def _check(out, grads, ref_out, ref_inputs, dy, dtype):
    """Forward and backward of the kernel (npu) against the float64 reference (CPU)."""
    ref_out.backward(dy)
    torch.testing.assert_close(out.detach().cpu().double(), ref_out.detach(), **tolerance(dtype))
    for got, ref in zip(grads, ref_inputs, strict=True):
        torch.testing.assert_close(got.cpu().double(), ref.grad, **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_dense_layouts_with_gqa_match_reference(layout, dtype):
    """Every dense layout, 4 query heads sharing 2 key/value heads, forward and backward."""
    b, n, nkv, sq, skv, d = 2, 4, 2, 5, 7, 8
    q, k, v = (torch.randn(b, n, s, d, dtype=torch.float64) for n, s in ((n, sq), (nkv, skv), (nkv, skv)))
    dy = torch.randn(b, n, sq, d, dtype=torch.float64)
    qn, kn, vn = _npu(*(from_bnsd(t, layout) for t in (q, k, v)), dtype=dtype)
    out = fa(qn, kn, vn, n, layout, scale=0.3)[0]
    assert out.dtype == dtype and out.shape == qn.shape
    out.backward(from_bnsd(dy, layout).to(dtype).to("npu"))
    refs = [from_bnsd(t, layout).clone().requires_grad_() for t in (q, k, v)]
    heads = (n, nkv, nkv)
    ref = from_bnsd(attention(*(to_bnsd(r, layout, n) for r, n in zip(refs, heads, strict=True)), scale=0.3), layout)
    _check(out, (qn.grad, kn.grad, vn.grad), ref, refs, from_bnsd(dy, layout), dtype)


@pytest.mark.parametrize("layout,causal", [("BNSD", False), ("BNSD", True), ("BSND", True), ("BSH", False)])
def test_matches_scaled_dot_product_attention(layout, causal):
    """npu_fusion_attention equals torch's scaled_dot_product_attention (GQA; causal via sparse_mode 2)."""
    b, n, nkv, s, d = 2, 4, 2, 6, 16
    q, k, v = (torch.randn(b, n, s, d) for n in (n, nkv, nkv))
    qn, kn, vn = (from_bnsd(t, layout).to("npu").requires_grad_() for t in (q, k, v))
    mask = compressed(2) if causal else None
    out = fa(qn, kn, vn, n, layout, scale=1 / math.sqrt(d), atten_mask=mask, sparse_mode=2 if causal else 0)[0]
    out.sum().backward()
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = from_bnsd(torch.nn.functional.scaled_dot_product_attention(*refs, is_causal=causal, enable_gqa=True), layout)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip((qn.grad, kn.grad, vn.grad), refs, strict=True):
        torch.testing.assert_close(got.cpu(), from_bnsd(want.grad, layout), atol=1e-5, rtol=1e-5)


MODE_CASES = [
    (0, dict(pre_tockens=2, next_tockens=1)),  # atten_mask plus the band
    (1, {}),
    (2, {}),
    (3, {}),
    (4, dict(pre_tockens=3, next_tockens=-1)),
    (5, dict(prefix=[2, 4])),
    (6, dict(prefix=[3, 1])),
]


@pytest.mark.parametrize("mode,options", MODE_CASES)
def test_sparse_modes_match_reference(mode, options):
    """sparse_mode 0-6 on an Sq != Skv block (top-left and bottom-right origins differ)."""
    b, n, sq, skv, d = 2, 2, 6, 9, 8
    q, k, v = _inputs((b, n, sq, d), (b, n, skv, d))
    user = torch.rand(b, 1, sq, skv, generator=torch.Generator().manual_seed(1)) < 0.2
    user[..., 0] = False  # keep every row alive under the user mask
    geometry = [sparse_mask(mode, sq, skv, pre=options.get("pre_tockens", BIG), nxt=options.get("next_tockens", BIG),
                            prefix=p) for p in options.get("prefix", [0] * b)]
    masked = torch.stack([g if g is not None else torch.zeros(sq, skv, dtype=torch.bool) for g in geometry])[:, None]
    if mode in (0, 1, 5):
        masked = masked | user
        atten_mask = user.to("npu")
    else:
        atten_mask = compressed(mode)
    qn, kn, vn = _npu(q, k, v, dtype=torch.float32)
    out = fa(qn, kn, vn, n, "BNSD", scale=0.5, atten_mask=atten_mask, sparse_mode=mode, **options)[0]
    dy = torch.randn(b, n, sq, d, dtype=torch.float64)
    out.backward(dy.float().to("npu"))
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    _check(out, (qn.grad, kn.grad, vn.grad), attention(*refs, scale=0.5, masked=masked), refs, dy, torch.float32)


def test_no_atten_mask_means_full_attention_in_every_mode():
    """op-plugin: without atten_mask, sparse_mode and pre/next tokens do not apply."""
    q, k, v = _inputs((1, 2, 4, 8), (1, 2, 6, 8))
    qn, kn, vn = (t.float().to("npu") for t in (q, k, v))
    full = fa(qn, kn, vn, 2, "BNSD")[0]
    for mode in (2, 3, 4):
        out = fa(qn, kn, vn, 2, "BNSD", sparse_mode=mode, pre_tockens=0, next_tockens=0)[0]
        assert torch.equal(out.cpu(), full.cpu())
    torch.testing.assert_close(full.cpu().double(), attention(q, k, v, scale=1.0), atol=2e-5, rtol=2e-5)


def _tnd_reference(q, k, v, seqs_q, seqs_kv, scale, modes=None, pre=BIG, nxt=BIG):
    """Per-sequence reference for a TND batch; ``modes[b]`` is sequence b's sparse mode."""
    out, pos_q, pos_kv = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype), 0, 0
    for b, (lq, lkv) in enumerate(zip(seqs_q, seqs_kv, strict=True)):
        qi, ki, vi = (x[p:p + n].transpose(0, 1)[None] for x, p, n in ((q, pos_q, lq), (k, pos_kv, lkv),
                                                                       (v, pos_kv, lkv)))
        masked = None if modes is None else sparse_mask(modes[b], lq, lkv, pre=pre, nxt=nxt)
        out[pos_q:pos_q + lq] = attention(qi, ki, vi, scale=scale, masked=masked)[0].transpose(0, 1)
        pos_q, pos_kv = pos_q + lq, pos_kv + lkv
    return out


@pytest.mark.parametrize("mode", [None, 3, 4, 7, 8])
def test_tnd_matches_per_sequence_reference(mode):
    """TND (GQA, an empty sequence, trailing non-participating entries); modes 7 / 8 band one sequence."""
    seqs_q, seqs_kv = [3, 0, 5, 4], [4, 2, 6, 4]
    n, nkv, d = 4, 2, 8
    q, k, v = _inputs((sum(seqs_q), n, d), (sum(seqs_kv), nkv, d))
    k, v = k[:, :nkv], v[:, :nkv]
    cum_q = list(torch.tensor(seqs_q).cumsum(0)) + [0]
    cum_kv = list(torch.tensor(seqs_kv).cumsum(0)) + [0]
    pre, nxt = 4, -1
    modes = None if mode is None else [{7: 4 if b == 3 else 3, 8: 4 if b == 0 else 2}.get(mode, mode)
                                       for b in range(4)]
    qn, kn, vn = _npu(q, k, v, dtype=torch.float32)
    out = fa(qn, kn, vn, n, "TND", scale=0.4, actual_seq_qlen=[int(c) for c in cum_q],
             actual_seq_kvlen=[int(c) for c in cum_kv], sparse_mode=mode or 0, pre_tockens=pre, next_tockens=nxt,
             atten_mask=None if mode is None else compressed(mode))[0]
    dy = torch.randn(out.shape, dtype=torch.float64)
    out.backward(dy.float().to("npu"))
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _tnd_reference(*refs, seqs_q, seqs_kv, 0.4, modes, pre=pre, nxt=nxt)
    _check(out, (qn.grad, kn.grad, vn.grad), ref, refs, dy, torch.float32)


def test_softmax_statistics_as_op_plugin_returns_them():
    """softmax_max / softmax_sum: the row max and sum repeated over 8; TND's default is n-major data."""
    q, k, v = _inputs((2, 3, 4, 8), (2, 3, 5, 8))
    outs = fa(*(t.float().to("npu") for t in (q, k, v)), 3, "BNSD", scale=0.5)
    s = q @ k.transpose(-1, -2) * 0.5
    row_max = s.amax(-1, keepdim=True)
    assert outs[1].shape == (2, 3, 4, 8) and outs[1].dtype == torch.float32
    torch.testing.assert_close(outs[1].cpu().double(), row_max.expand(2, 3, 4, 8), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[2].cpu().double(), torch.exp(s - row_max).sum(-1, keepdim=True).expand(2, 3, 4, 8),
                               atol=1e-5, rtol=1e-5)
    assert outs[3].numel() == 0 and outs[4:] == (0, 0, 2 * 3 * 4 * 5)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]  # batch 0 as one TND sequence
    tnd = [t.float().to("npu") for t in packed]
    default = fa(*tnd, 3, "TND", scale=0.5, actual_seq_qlen=[4], actual_seq_kvlen=[5])[1]
    same = fa(*tnd, 3, "TND", scale=0.5, actual_seq_qlen=[4], actual_seq_kvlen=[5], softmax_layout="TND")[1]
    assert default.shape == same.shape == (4, 3, 8)
    torch.testing.assert_close(same.cpu().double(), row_max[0, :, :, 0].T[..., None].expand(4, 3, 8),
                               atol=1e-5, rtol=1e-5)
    ntd = default.cpu().reshape(3, 4, 8)  # (T, n, 8) holding (n, T, 8) data
    torch.testing.assert_close(ntd.double(), row_max[0].expand(3, 4, 8), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 6), (2, 3, 1, 6), (1, 3, 4, 6)])
def test_pse_gradient_and_formula(shape):
    """pse (BNSS, BN1S, 1NSS) is added before the scale; its gradient is reduced to its shape."""
    q, k, v = _inputs((2, 3, 4, 8), (2, 3, 6, 8))
    pse = torch.randn(shape, dtype=torch.float64)
    qn, kn, vn, pn = _npu(q, k, v, pse, dtype=torch.float32)
    out = fa(qn, kn, vn, 3, "BNSD", pse=pn, scale=0.7)[0]
    dy = torch.randn(out.shape, dtype=torch.float64)
    out.backward(dy.float().to("npu"))
    refs = [t.clone().requires_grad_() for t in (q, k, v, pse)]
    ref = attention(*refs[:3], scale=0.7, pse=refs[3])
    _check(out, (qn.grad, kn.grad, vn.grad, pn.grad), ref, refs, dy, torch.float32)


def test_sink_joins_the_denominator_and_gets_a_gradient():
    """sink: one extra logit per head in the softmax, dropped from the output (op-plugin's example)."""
    q, k, v = _inputs((2, 4, 5, 8), (2, 4, 5, 8))
    sink = torch.linspace(-0.5, 0.8, 4, dtype=torch.float64)
    qn, kn, vn = _npu(q, k, v, dtype=torch.float32)
    sn = sink.float().to("npu").requires_grad_()
    out = fa(qn, kn, vn, 4, "BNSD", scale=0.3, sink=sn)[0]
    dy = torch.randn(out.shape, dtype=torch.float64)
    out.backward(dy.float().to("npu"))
    refs = [t.clone().requires_grad_() for t in (q, k, v, sink)]
    _check(out, (qn.grad, kn.grad, vn.grad, sn.grad), attention(*refs[:3], scale=0.3, sink=refs[3]), refs, dy,
           torch.float32)


def test_grad_op_called_directly_with_and_without_statistics():
    """npu_fusion_attention_grad gives autograd's gradients, from the forward's statistics or recomputed."""
    q, k, v = (t.float().to("npu") for t in _inputs((2, 6, 32), (2, 6, 16)))
    out, smax, ssum, *_ = fa(q, k, v, 4, "BSH", scale=0.5, atten_mask=compressed(3), sparse_mode=3)
    dy = torch.randn_like(out)
    with_stats = fa_grad(q, k, v, dy, 4, "BSH", atten_mask=compressed(3), softmax_max=smax, softmax_sum=ssum,
                         attention_in=out, scale_value=0.5, sparse_mode=3)
    recomputed = fa_grad(q, k, v, dy, 4, "BSH", atten_mask=compressed(3), scale_value=0.5, sparse_mode=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fa(*leaves, 4, "BSH", scale=0.5, atten_mask=compressed(3), sparse_mode=3)[0].backward(dy)
    assert with_stats[3].numel() == 0 and with_stats[4].numel() == 0  # no pse, no sink
    for a, b, leaf in zip(with_stats[:3], recomputed[:3], leaves, strict=True):
        torch.testing.assert_close(a.cpu(), leaf.grad.cpu())
        torch.testing.assert_close(b.cpu(), leaf.grad.cpu(), atol=1e-6, rtol=1e-5)


def _bnsd(*shape, dtype=torch.float32, device="npu"):
    return torch.randn(shape, dtype=dtype, device=device)


ERROR_CASES = [
    ("layout", dict(input_layout="BHSD"), r"input_layout must be BSH, SBH, BSND, BNSD or TND, got 'BHSD'"),
    ("heads", dict(head_num=3), r"head_num 3 must equal the N of query \(2, 4, 6, 8\)"),
    ("float64", dict(dtype=torch.float64), r"query must be one of float16, bfloat16, float32, got float64"),
    ("mask dtype", dict(atten_mask=torch.zeros(6, 6, device="npu")), r"atten_mask must be one of bool, uint8"),
    ("mask shape", dict(atten_mask=torch.zeros(5, 6, dtype=torch.bool, device="npu")),
     r"atten_mask of shape \(5, 6\) does not fit batch 2, heads 4, query length 6 and key length 6"),
    ("compressed", dict(atten_mask=torch.zeros(6, 6, dtype=torch.bool, device="npu"), sparse_mode=3),
     r"atten_mask for sparse_mode 3 must be the compressed 2048x2048 mask"),
    ("mode", dict(sparse_mode=7), r"sparse_mode must be one of \(0, 1, 2, 3, 4, 5, 6\) for input_layout BNSD, got 7"),
    ("prefix", dict(sparse_mode=5, atten_mask=torch.zeros(2, 1, 6, 6, dtype=torch.bool, device="npu")),
     r"sparse_mode 5 needs prefix, one length per batch \(2\), got None"),
    ("varlen args", dict(actual_seq_qlen=[6, 12]), r"actual_seq_qlen / actual_seq_kvlen are for input_layout TND"),
    ("gqa", dict(kv_heads=3), r"the query heads \(4\) must be a multiple of the key/value heads \(3\)"),
    ("pse", dict(pse=torch.zeros(2, 4, 6, 5, device="npu")), r"pse must be BNSS, BN1S or 1NSS"),
    ("sink", dict(sink=torch.zeros(3, device="npu")), r"sink must have shape \(4,\) \(one per head\)"),
    ("device", dict(key_device="cpu"), r"expected key on the npu, got a tensor on cpu"),
    ("cpu", dict(device="cpu"), r"npu_fusion_attention: expected npu tensors, got query on cpu"),
    ("softmax_layout", dict(softmax_layout="TND"), r"softmax_layout must be '' or, with input_layout TND, 'TND'"),
]


@pytest.mark.parametrize("case,change,message", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_bad_arguments_raise_errors_naming_the_op_and_argument(case, change, message):
    """Each bad argument gets a RuntimeError that starts with the op's name."""
    change = dict(change)
    dtype, device = change.pop("dtype", torch.float32), change.pop("device", "npu")
    kv_heads = change.pop("kv_heads", 4)
    q = _bnsd(2, 4, 6, 8, dtype=dtype, device=device)
    k = _bnsd(2, kv_heads, 6, 8, dtype=dtype, device=change.pop("key_device", device))
    v = _bnsd(2, kv_heads, 6, 8, dtype=dtype, device=device)
    args = dict(head_num=4, input_layout="BNSD")
    args.update(change)
    with pytest.raises(RuntimeError, match=r"npu_fusion_attention: " + message if case != "cpu" else message):
        fa(q, k, v, args.pop("head_num"), args.pop("input_layout"), **args)


def test_padding_mask_is_reported_as_not_simulated():
    """padding_mask, which op-plugin documents as unsupported, raises ArgumentNotSimulatedError naming it."""
    from npusim.ops.fused.attention import ArgumentNotSimulatedError

    q = _bnsd(1, 2, 4, 8)
    with pytest.raises(ArgumentNotSimulatedError, match="npu_fusion_attention: argument padding_mask"):
        fa(q, q, q, 2, "BNSD", padding_mask=torch.zeros(1, 2, 4, 4, device="npu"))
    with pytest.raises(RuntimeError, match=r"pse with input_layout TND \(its alibi compression\) is not simulated"):
        t = torch.randn(4, 2, 8, device="npu")
        fa(t, t, t, 2, "TND", actual_seq_qlen=[4], actual_seq_kvlen=[4], pse=torch.zeros(1, 2, 4, 4, device="npu"))


def test_grad_op_checks_dy_and_numels():
    """The grad op names dy's expected shape and the dropout mask length it regenerates."""
    q = _bnsd(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match=r"npu_fusion_attention_grad: dy must have attention_out's shape"):
        fa_grad(q, q, q, _bnsd(1, 2, 4, 7), 2, "BNSD")
    with pytest.raises(RuntimeError, match=r"npu_fusion_attention_grad: numels must be the forward's dropout mask "
                                           r"length 32, got 5"):
        fa_grad(q, q, q, q, 2, "BNSD", keep_prob=0.5, seed=3, numels=5)


# -- npu_fusion_attention_v3 / npu_fusion_attention_grad_v3 -----------------------------------------------------------

fa_v3 = torch.ops.npu.npu_fusion_attention_v3
fa_grad_v3 = torch.ops.npu.npu_fusion_attention_grad_v3


@pytest.mark.parametrize("mode", [None, 3])
def test_v3_tnd_with_length_tensors_matches_per_sequence_reference(mode):
    """v3 takes TND's cumulative lengths as int64 CPU tensors; forward and backward equal the per-sequence reference
    and npu_fusion_attention; grad_v3 called directly gives autograd's gradients."""
    seqs_q, seqs_kv = [3, 0, 5, 4], [4, 2, 6, 4]
    n, nkv, d = 4, 2, 8
    q, k, v = _inputs((sum(seqs_q), n, d), (sum(seqs_kv), nkv, d))
    k, v = k[:, :nkv], v[:, :nkv]
    cum_q, cum_kv = torch.tensor(seqs_q).cumsum(0), torch.tensor(seqs_kv).cumsum(0)
    options = {"scale": 0.4, "sparse_mode": mode or 0, "atten_mask": None if mode is None else compressed(mode)}
    qn, kn, vn = _npu(q, k, v, dtype=torch.float32)
    out, softmax_max, softmax_sum, softmax_out, seed, offset = fa_v3(qn, kn, vn, n, "TND", actual_seq_qlen=cum_q,
                                                                     actual_seq_kvlen=cum_kv, **options)
    assert softmax_max.shape == (sum(seqs_q), n, 8) and softmax_out.numel() == 0
    assert seed.shape == offset.shape == (1,) and seed.dtype == torch.int64 and seed.device == qn.device
    v1 = fa(qn, kn, vn, n, "TND", actual_seq_qlen=cum_q.tolist(), actual_seq_kvlen=cum_kv.tolist(), **options)
    assert torch.equal(out.cpu(), v1[0].cpu()) and torch.equal(softmax_sum.cpu(), v1[2].cpu())
    dy = torch.randn(out.shape, dtype=torch.float64)
    out.backward(dy.float().to("npu"))
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _tnd_reference(*refs, seqs_q, seqs_kv, 0.4, None if mode is None else [3] * 4)
    _check(out, (qn.grad, kn.grad, vn.grad), ref, refs, dy, torch.float32)
    grads = fa_grad_v3(qn.detach(), kn.detach(), vn.detach(), dy.float().to("npu"), n, "TND",
                       softmax_max=softmax_max, softmax_sum=softmax_sum, attention_in=out.detach(),
                       scale_value=0.4, seed=seed, offset=offset, actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv,
                       sparse_mode=options["sparse_mode"], atten_mask=options["atten_mask"])
    for got, want in zip(grads[:3], (qn.grad, kn.grad, vn.grad), strict=True):
        torch.testing.assert_close(got.cpu(), want.cpu())


def test_v3_dense_pse_and_sink_gradients_equal_the_first_version():
    """BSH with pse and sink: v3's outputs and every gradient (query, key, value, pse, sink) equal
    npu_fusion_attention's, which the tests above check against the reference."""
    b, n, s, d = 2, 2, 5, 8
    q, k, v = _inputs((b, s, n * d), (b, s, n * d), seed=3)
    pse, sink = torch.randn(1, n, s, s), torch.randn(n)
    results = []
    for op in (fa, fa_v3):
        leaves = _npu(q, k, v, pse, sink, dtype=torch.float32)
        out = op(*leaves[:3], n, "BSH", pse=leaves[3], sink=leaves[4], scale=0.3)[0]
        out.square().sum().backward()
        results.append([out.detach().cpu()] + [t.grad.cpu() for t in leaves])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_v3_errors_name_the_op_and_argument():
    """Errors name v3 (not npu_fusion_attention); lengths must be 1-D int tensors; grad_v3 needs the seed with
    dropout; CPU inputs are refused naming the op."""
    q = torch.randn(6, 2, 8, device="npu")
    lengths = torch.tensor([2, 6])
    with pytest.raises(RuntimeError, match="npu_fusion_attention_v3: actual_seq_qlen must be a 1-D int64 tensor"):
        fa_v3(q, q, q, 2, "TND", actual_seq_qlen=lengths.float(), actual_seq_kvlen=lengths)
    with pytest.raises(RuntimeError, match="npu_fusion_attention_v3: input_layout must be BSH, SBH, BSND, BNSD or TND"):
        fa_v3(q, q, q, 2, "XYZ")
    with pytest.raises(RuntimeError, match="npu_fusion_attention_grad_v3: seed .* is needed when keep_prob < 1"):
        fa_grad_v3(q, q, q, q, 2, "TND", actual_seq_qlen=lengths, actual_seq_kvlen=lengths, keep_prob=0.5)
    with pytest.raises(RuntimeError, match="npu_fusion_attention_v3: expected npu tensors, got query on cpu"):
        fa_v3(q.cpu(), q.cpu(), q.cpu(), 2, "TND", actual_seq_qlen=lengths, actual_seq_kvlen=lengths)


def test_v3_and_grad_v3_capture_into_an_npu_graph_without_dropout():
    """Note [npu_fusion_attention_v3 in an npu graph]: v3 and grad_v3 (BNSD) captured into an NPUGraph replay to the
    eager results on new inputs (dropout inside a capture: test_fused_attention_dropout.py)."""
    b, n, s, d = 1, 2, 6, 8
    static = [torch.randn(b, n, s, d, device="npu") for _ in range(4)]  # query, key, value, dy

    def step():
        out = fa_v3(*static[:3], n, "BNSD", scale=0.3)
        return fa_grad_v3(*static, n, "BNSD", softmax_max=out[1], softmax_sum=out[2], attention_in=out[0],
                          scale_value=0.3, seed=out[4], offset=out[5])[:3] + (out[0],)

    step()  # warm-up outside the capture, as CUDA graphs want
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        captured = step()
    fresh = [torch.randn(b, n, s, d) for _ in range(4)]
    for buffer, value in zip(static, fresh, strict=True):
        buffer.copy_(value)
    graph.replay()
    eager = step()
    for got, want in zip(captured, eager, strict=True):
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=0, rtol=0)
    refs = [t.double().requires_grad_() for t in fresh[:3]]
    ref = attention(*refs, scale=0.3)
    ref.backward(fresh[3].double())
    torch.testing.assert_close(captured[3].cpu().double(), ref.detach(), **tolerance(torch.float32))
    torch.testing.assert_close(captured[0].cpu().double(), refs[0].grad, **tolerance(torch.float32))
