"""Applies the expected-failures list to a sweep's sample results and sums them up.

An entry of :data:`~npusim.conformance.expected_failures.EXPECTED_FAILURES`
turns the failing samples it covers into ``xfail``; an entry that covers samples
which ran and none of them failed is ``xpass``: stale, and a failure of the suite,
as PyTorch's ``xfail`` lists are.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from npusim.conformance.compare import SampleResult
from npusim.conformance.expected_failures import EXPECTED_FAILURES, XFail

__all__ = ["BAD", "STATUSES", "Summary", "expected_failure", "judge", "worst"]

STATUSES = ("pass", "fail", "error", "crash", "skip", "xfail", "xpass")
# The statuses that fail the suite.
BAD = frozenset({"fail", "error", "crash", "xpass"})
_RANK = {s: r for r, s in enumerate(("skip", "pass", "xfail", "xpass", "fail", "error", "crash"))}
_FAILED = frozenset({"fail", "error", "crash"})


def worst(statuses: Iterable[str]) -> str:
    """The status that speaks for a group: crash > error > fail > xpass > xfail > pass > skip."""
    return max(statuses, key=_RANK.__getitem__, default="skip")


class Summary(NamedTuple):
    """A judged sweep: results per sample phase, status per (op, dtype) and per op."""

    results: list[SampleResult]
    pairs: dict[tuple[str, str], str]
    ops: dict[str, str]
    xpass: list[str]  # one line per stale expected-failure entry

    def counts(self) -> dict[str, Counter]:
        return {
            "ops": Counter(self.ops.values()),
            "op-dtype pairs": Counter(self.pairs.values()),
            "forward samples": Counter(r.status for r in self.results if r.phase == "forward"),
            "backward samples": Counter(r.status for r in self.results if r.phase == "backward"),
        }

    def pass_rate(self) -> float:
        """Share of the ops that run on CPU (status other than skip) that pass everywhere."""
        ran = [s for s in self.ops.values() if s != "skip"]
        return sum(s == "pass" for s in ran) / len(ran) if ran else 1.0

    def table(self) -> str:
        counts = self.counts()
        head = f"{'status':<8}" + "".join(f"{k:>18}" for k in counts)
        rows = [head]
        for status in STATUSES:
            rows.append(f"{status:<8}" + "".join(f"{c[status]:>18}" for c in counts.values()))
        rows.append(f"{'total':<8}" + "".join(f"{sum(c.values()):>18}" for c in counts.values()))
        return "\n".join(rows)


def expected_failure(op: str, dtype: str, phase: str, index: int) -> XFail | None:
    """The entry of the expected-failures list that covers this sample phase, if any."""
    entries = EXPECTED_FAILURES.get(op, ())
    for entry in (entries,) if isinstance(entries, XFail) else entries:
        if entry.covers(dtype, phase, index):
            return entry
    return None


def judge(results: Iterable[SampleResult], ops: Iterable[str] = ()) -> Summary:
    """Judges ``results`` against the expected-failures list.

    ``ops`` names ops that were planned but produced no result (no CPU dtype):
    they count as skip.
    """
    judged: list[SampleResult] = []
    covered: dict[tuple[str, str, str, XFail], list[str]] = defaultdict(list)
    for r in results:
        entry = expected_failure(r.op, r.dtype, r.phase, r.index)
        if entry is not None and r.status != "skip":
            covered[(r.op, r.dtype, r.phase, entry)].append(r.status)
            if r.status in _FAILED:
                r = SampleResult(r.op, r.dtype, r.index, r.phase, "xfail", f"{entry.reason} [{r.status}: {r.detail}]")
        judged.append(r)

    pair_statuses: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in judged:
        pair_statuses[(r.op, r.dtype)].append(r.status)
    xpass: list[str] = []
    for (op, dtype, phase, entry), statuses in covered.items():
        stale = (not any(s in _FAILED for s in statuses)) if entry.samples is None else ("pass" in statuses)
        if stale:
            pair_statuses[(op, dtype)].append("xpass")
            xpass.append(f"{op} {dtype} {phase}: expected to fail ({entry.reason}) but passed")
    pairs = {k: worst(v) for k, v in pair_statuses.items()}
    op_statuses: dict[str, list[str]] = defaultdict(list)
    for (op, _), status in pairs.items():
        op_statuses[op].append(status)
    for op in ops:
        op_statuses.setdefault(op, [])
    return Summary(judged, pairs, {op: worst(v) for op, v in op_statuses.items()}, sorted(xpass))
