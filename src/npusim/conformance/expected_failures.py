"""The one list of OpInfo ops that are expected to fail on npu, each with its reason.

Keys are OpInfo full names (``name`` or ``name.variant``); a value is one
:class:`XFail` or a tuple of them (the first that covers a sample applies). An entry covers the
dtypes in ``dtypes`` (None: every dtype), the phase ``phase`` ("forward",
"backward"; None: both) and the sample indices in ``samples`` (None: every
sample, so every sample of a covered dtype and phase must fail). Covered
failures count as ``xfail``; covered samples that all pass make the entry
``xpass``, which fails the suite: remove the entry (see :mod:`npusim.conformance.judge`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXPECTED_FAILURES", "XFail"]


@dataclass(frozen=True)
class XFail:
    """Why an op fails on npu, and where exactly."""

    reason: str
    dtypes: frozenset[str] | None = None
    phase: str | None = None
    samples: frozenset[int] | None = None

    def covers(self, dtype: str, phase: str, index: int) -> bool:
        return ((self.dtypes is None or dtype in self.dtypes) and (self.phase is None or phase == self.phase)
                and (self.samples is None or index in self.samples))


def _x(reason: str, dtypes: str | None = None, phase: str | None = None, samples: str | None = None) -> XFail:
    """``dtypes`` and ``samples`` as space-separated words, to keep the table below readable."""
    return XFail(reason, frozenset(dtypes.split()) if dtypes else None, phase,
                 frozenset(int(s) for s in samples.split()) if samples else None)


# Reasons, one per family, so that a family can be pruned at once. Generated
# from the full sweep over every CPU dtype (docs/CONFORMANCE.md). Each is a
# difference where npusim is right; the conjugate-view crash (105 ops), the
# missing convolution kernel (6 ops) and the linalg.lu_solve left=False values
# were fixed and their entries removed; so were SDPA's math-path gradients once npu ran
# CPU's fused kernel (ops/attention.py).
RANDOMIZED = ("random: a randomized algorithm draws its Gaussian sketch from npu's Philox generator and CPU's "
              "from mt19937 (CUDA's Philox differs from CPU's too); the forward results agree, the gradients of "
              "the two approximations differ by up to about 3e-3")
SPARSE = ("sparse: npu tensors are strided only; the op raises an error naming the layout "
          "(SparseCsrnpu has no kernels, sparse CPU results are refused by the fallback), in every dtype")
CHUNKED_ACCUMULATION = (
    "device-type choice: PyTorch's chunked linear_cross_entropy picks its accumulation by device type "
    "(LinearCrossEntropyOptions._adjust): fp32 with acc_policy 'accurate' for fp16/bf16 on cpu, fp32 on cuda "
    "(SM 7.0+ / 8.0+), the input dtype with 'compact' on any other device type, npu (and torch_npu's) included; "
    "with CPU's choices passed explicitly npu equals CPU bit for bit (tests/test_conformance_ops.py); the samples "
    "named are those whose difference exceeds assert_close's tolerance, the others agree")

CHIP_PRECISION = (
    "chip precision: binary_cross_entropy_with_logits has no CPU kernel, so CPU runs PyTorch's composite and "
    "its backward formula, rounding every step to the 16-bit dtype; npu computes on float32 copies and rounds "
    "once, as the chip's aclnn kernel does and torch_npu's tests expect "
    "(Note [float16 losses computed in float32], ops/chip_upcast.py); the samples named are those whose "
    "difference exceeds assert_close's tolerance, the others agree")

EXPECTED_FAILURES: dict[str, XFail | tuple[XFail, ...]] = {
    # Failing samples named: a sample-limited sweep (CI's) must not find these entries stale.
    'pca_lowrank': _x(RANDOMIZED, 'complex64', phase='backward', samples='0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15'),
    'svd_lowrank': (_x(RANDOMIZED, 'complex64', phase='backward', samples='0 1 2 3 4 5 6 7 14'),
                    _x(RANDOMIZED, 'float32', phase='backward', samples='12')),
    'nn.functional.binary_cross_entropy_with_logits': (
        _x(CHIP_PRECISION, 'bfloat16 float16', phase='forward', samples='7 10 13 16 19 22 25'),
        _x(CHIP_PRECISION, 'bfloat16', phase='backward', samples='6 8 9 11 12 15 18 20 21 23 24'),
        _x(CHIP_PRECISION, 'float16', phase='backward', samples='12 15 18 21 23 24')),
    'nn.functional.linear_cross_entropy.chunked': (
        _x(CHUNKED_ACCUMULATION, 'bfloat16 float16', phase='forward', samples='115 126'),
        _x(CHUNKED_ACCUMULATION, 'bfloat16', phase='backward',
           samples='4 18 46 57 60 71 74 85 88 95 98 99 102 113 116 127 130'),
        _x(CHUNKED_ACCUMULATION, 'float16', phase='backward',
           samples='14 15 18 28 42 43 46 60 71 73 74 84 88 95 98 99 101 102 113 116 127 129 130 133 147 148 151')),
    'nn.functional.linear_cross_entropy.chunked_none': (
        _x(CHUNKED_ACCUMULATION, 'bfloat16 float16', phase='forward', samples='1 4 15 18 42 43 57 59 60 70 71'),
        _x(CHUNKED_ACCUMULATION, 'bfloat16', phase='backward', samples='3 17 29 32 46 74'),
        _x(CHUNKED_ACCUMULATION, 'float16', phase='backward', samples='29 32 45 46 73 74 77 78 81')),
    'sparse.mm.reduce': _x(SPARSE, phase='forward'),
    'sparse.sampled_addmm': _x(SPARSE, phase='forward'),
    'to_sparse': _x(SPARSE, phase='forward'),
}
