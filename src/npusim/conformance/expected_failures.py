"""The one list of OpInfo ops that are expected to fail on npu, each with its reason.

Keys are OpInfo full names (``name`` or ``name.variant``). An entry covers the
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


# Reasons, one per family, so that the lead can prune a family at once.
CONV = "conv: convolution_overrideable has no npu kernel; being fixed in the crash-fix half"

EXPECTED_FAILURES: dict[str, XFail] = {
}
