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
# from the full sweep (docs/CONFORMANCE.md). The conjugate-view crash (105 ops)
# and the missing convolution kernel (6 ops) were fixed and their entries removed.
CONJ_VALUES = ("conj: left=False solves through conjugate-transposed (.mH) views and the result differs from "
               "CPU's on npu; recheck once the crash-fix half's conj/neg view fix lands")
RANDOMIZED = ("random: a randomized algorithm draws its Gaussian sketch from npu's Philox generator and CPU's "
              "from mt19937; the complex64 gradients of the two approximations differ by about 1e-4")
SPARSE = ("sparse: npu tensors are strided only; the op raises an error naming the layout "
          "(SparseCsrnpu has no kernels, sparse CPU results are refused by the fallback)")

EXPECTED_FAILURES: dict[str, XFail | tuple[XFail, ...]] = {
    'pca_lowrank': _x(RANDOMIZED, 'complex64', phase='backward', samples='0 1 3'),
    'svd_lowrank': _x(RANDOMIZED, 'complex64', phase='backward', samples='0 1 3'),
    'linalg.lu_solve': _x(CONJ_VALUES, 'complex64', phase='forward', samples='1 3'),
    'sparse.mm.reduce': _x(SPARSE, 'float32', phase='forward'),
    'sparse.sampled_addmm': _x(SPARSE, 'complex64 float32', phase='forward'),
    'to_sparse': _x(SPARSE, 'complex64 float32 int64', phase='forward'),
}
