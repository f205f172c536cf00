"""``python -m npusim kernels [OP]``: which file registers each aten op's npu kernel and how it runs,
read from what the process registers."""

from __future__ import annotations

import subprocess
import sys

from npusim.tools import kernels


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npusim", "kernels", *args], capture_output=True, text=True,
                          timeout=300)


def test_every_registered_kernel_is_listed_with_how_it_runs():
    """Without OP: one row per aten op with an npu kernel of its own, each with its file and a known way to run."""
    result = _run()
    assert result.returncode == 0, result.stderr
    providers = kernels.kernel_providers()
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("aten::")]
    assert sorted(rows) == sorted(providers)
    listed = kernels.registered_kernels()
    assert [k for k in listed if k.how == "unknown"] == [], "a file registers kernels the tool cannot describe"
    assert "aten::add.Tensor" in result.stdout
    assert f"{len(providers)} aten ops have an npu kernel of their own" in result.stdout


def test_one_op_says_where_and_how():
    """With OP: stream task, host, refusal, router and composite, also for ops without a kernel of their own."""
    expected = {
        "add.Tensor": ("csrc/aten/fallback_routes.cpp", "stream task (unboxed fallback route)"),
        "aten::nonzero": ("csrc/aten/fallback.cpp", "host: data-dependent output shape"),
        "_local_scalar_dense": ("csrc/aten/aten_ops.cpp", "host: waits for the stream"),
        "uniform_": ("csrc/aten/random_ops.cpp", "stream task: Philox kernel"),
        "_foreach_copy_": ("csrc/aten/foreach_copy.cpp", "router: fast / batch"),
        "_thnn_fused_lstm_cell": ("ops/rnn_cells.py", "python kernel"),
        "linear": ("(none)", "composite"),
        "_cudnn_rnn": ("csrc/aten/fallback.cpp", "refusal: CPU has no kernel"),
        "equal": (None, "host: returns a host value"),
    }
    for op, (file, how) in expected.items():
        name = op if op.startswith("aten::") else f"aten::{op}"
        found = {k.op: k for k in kernels.lookup(op)}
        assert name in found, f"{op}: not found"
        assert file is None or found[name].file == file, found[name]
        assert found[name].how.startswith(how), found[name]
    result = _run("add")
    assert result.returncode == 0 and "aten::add.Tensor" in result.stdout and "aten::add.out" in result.stdout
    missing = _run("no_such_op")
    assert missing.returncode == 1 and "no aten op named no_such_op" in missing.stdout
