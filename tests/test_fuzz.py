"""The copy_ / _foreach_copy_ fuzz campaign: a short seeded run agrees with CPU except for the
listed known failures, cases are reproducible, and each known crash still crashes."""

from __future__ import annotations

import collections
import subprocess
import sys
import time

import pytest
import torch

from npusim.testing import copy_fuzz

SHORT = 400  # cases of the CI run (the full campaign is `python -m npusim fuzz`, docs/BENCHMARKS.md)


def test_short_campaign_agrees_with_cpu_except_known_failures():
    """400 generated cases (well under 30 s): every failure is a listed known failure, and the run
    covers both ops and every route."""
    start = time.perf_counter()
    outcomes = copy_fuzz.campaign(seed=1, cases=SHORT)
    assert time.perf_counter() - start < 60
    unknown = [f"{o.detail}\n  {o.case.describe()}" for o in outcomes
               if o.status == "fail" and copy_fuzz.known(o) is None]
    assert not unknown, "\n".join(unknown)
    statuses = collections.Counter(o.status for o in outcomes)
    assert statuses["ok"] > SHORT // 2 and statuses["ok-error"] > 10  # both outcomes are exercised
    routes = {r for o in outcomes for r in o.routes}
    assert routes == {"fast", "batch", "slow", "compat"}
    ops = {o.case.op for o in outcomes}
    assert ops == {"copy_", "_foreach_copy_"}


def test_cases_are_reproducible_from_seed_and_index():
    """A case is the same whenever it is generated, and checking it twice gives the same outcome."""
    a, b, other = copy_fuzz.generate(3, 17), copy_fuzz.generate(3, 17), copy_fuzz.generate(3, 18)
    assert a.describe() == b.describe() and a.describe() != other.describe()
    assert all(torch.equal(x.data, y.data) for x, y in zip(a.bases, b.bases, strict=True))
    first, again = copy_fuzz.check(copy_fuzz.generate(3, 17)), copy_fuzz.check(copy_fuzz.generate(3, 17))
    assert (first.status, first.detail, first.routes) == (again.status, again.detail, again.routes)


def test_known_crashes_still_crash():
    """Each known crash's reproducer still kills the process (remove it from the list once fixed); the list
    is empty today, so the campaign skips no case."""
    for name, (_, script, _) in sorted(copy_fuzz.KNOWN_CRASHES.items()):
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
        assert result.returncode < 0 or result.returncode > 1, (
            f"{name} no longer crashes (rc {result.returncode}); remove it from KNOWN_CRASHES")


def test_copy_onto_an_identical_stride0_view_returns_as_on_cpu():
    """Seed 424242 case 2883: a _foreach_copy_ of a stride-0 view onto an identical view of the same
    memory returns (nothing to copy) in both modes, as CPU and CUDA do; a different source still raises."""
    case = copy_fuzz.generate(424242, 2883)
    assert case.pairs[0][0] == case.pairs[0][1] and case.pairs[0][0].stride == (0,)
    for mode in copy_fuzz.MODES:
        outcome = copy_fuzz.check(case._replace(mode=mode))
        assert (outcome.status, outcome.detail) == ("ok", ""), outcome.detail
    base = torch.arange(4, dtype=torch.uint8, device="npu")
    expanded = base.as_strided((3,), (0,))
    assert expanded.copy_(base.as_strided((3,), (0,))) is expanded
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        expanded.copy_(base[1:])
    assert torch.equal(base.cpu(), torch.arange(4, dtype=torch.uint8))


def test_failure_classifier_excuses_only_where_npusim_is_right():
    """Bytes left after a failed _foreach_copy_ are excused for a mixed-source-dtype list (the op-plugin's
    grouping, SPEC 4.1), never for a one-dtype list; no excuse names a fixed bug."""
    mixed, uniform = copy_fuzz.generate(424242, 172), copy_fuzz.generate(424242, 2883)
    assert copy_fuzz._mixed_source_dtypes(mixed) and not copy_fuzz._mixed_source_dtypes(uniform)
    detail = "base0 (destination) bytes differ from cpu after the error"
    assert copy_fuzz.known(copy_fuzz.Outcome(mixed, "fail", detail, ())) == "error-leaves-other-pairs-written"
    assert copy_fuzz.known(copy_fuzz.Outcome(uniform, "fail", detail, ())) is None
    assert set(copy_fuzz.KNOWN_FAILURES) == {"error-leaves-other-pairs-written", "fast-route-skips-partial-overlap"}
