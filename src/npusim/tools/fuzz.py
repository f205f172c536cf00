"""``python -m npusim fuzz``: a campaign of generated ``copy_`` / ``_foreach_copy_`` cases on the
npu against CPU (see :mod:`npusim.testing.copy_fuzz`), with progress lines and a summary table.

Every case is reproducible from ``--seed`` and its index (``--start I --cases 1 -v`` reruns
case I and prints it). Exit status 1 when a failure is not in ``KNOWN_FAILURES``.
"""

from __future__ import annotations

import argparse
import collections
import time

from npusim.testing import copy_fuzz


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", type=int, default=10_000, help="number of cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="index of the first case")
    parser.add_argument("--every", type=int, default=1000, help="cases between progress lines")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every failing case in full")


def run(args: argparse.Namespace) -> int:
    if args.cases < 1:
        raise SystemExit(f"fuzz: expected --cases >= 1, got {args.cases}")
    start = time.perf_counter()
    failures = 0

    def progress(done: int, outcome: copy_fuzz.Outcome) -> None:
        nonlocal failures
        if outcome.status == "fail":
            failures += 1
            if args.verbose or copy_fuzz.known(outcome) is None:
                name = copy_fuzz.known(outcome) or "unknown"
                print(f"FAIL [{name}] {outcome.detail}\n  {outcome.case.describe()}")
        if done % args.every == 0 or done == args.cases:
            print(f"fuzz: {done}/{args.cases} cases, {failures} failures, {time.perf_counter() - start:.1f} s",
                  flush=True)

    outcomes = copy_fuzz.campaign(args.seed, args.cases, args.start, progress)
    elapsed = time.perf_counter() - start
    table: collections.Counter[tuple[str, str, str]] = collections.Counter()
    routes: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        label = o.status if o.status != "fail" else f"fail: {copy_fuzz.known(o) or 'UNKNOWN'}"
        if o.status == "skipped":
            label = f"skipped: known crash {o.detail}"
        table[(o.case.op, label, o.case.mode)] += 1
        routes.update(o.routes)
    last = args.start + args.cases - 1
    print(f"\n_foreach_copy_ / copy_ fuzz campaign: seed {args.seed}, cases {args.start}..{last}, {elapsed:.1f} s")
    print("| op | result | mode | cases |")
    print("|---|---|---|---|")
    for (op, label, mode), n in sorted(table.items()):
        print(f"| {op} | {label} | {mode} | {n} |")
    print(f"_foreach_copy_ routes taken (per dtype group): {dict(sorted(routes.items()))}")
    unknown = [o for o in outcomes if o.status == "fail" and copy_fuzz.known(o) is None]
    print(f"{len(outcomes)} cases: {sum(o.status.startswith('ok') for o in outcomes)} agree with CPU, "
          f"{failures} fail ({failures - len(unknown)} known, {len(unknown)} unknown), "
          f"{sum(o.status == 'skipped' for o in outcomes)} skipped (known crashes)")
    return 1 if unknown else 0
