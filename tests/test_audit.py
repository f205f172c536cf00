"""The FSDP2 patch auditor and the historical collectives patch it is meant to catch.

Audits run in fresh subprocesses: what they inspect is process-wide state
(module attributes, dispatcher registrations) that one test must not leak
into another.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT_S = 300  # a first import may compile the device core

HISTORICAL = {
    "torch.distributed.fsdp._fully_shard._fsdp_collectives._get_param_all_gather_inputs",
    "fsdp::all_gather_copy_in[PrivateUse1]",
    "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup.finalize_backward",
}

# Prepended to every script: run the audit and the CLI in this process.
PRELUDE = """\
import json, sys
import torch
import torch.distributed.fsdp  # defines the fsdp:: ops
import npusim
from npusim.distributed import audit
from npusim.tools.cli import main as cli_main

def report():
    return audit.audit_fsdp().to_dict()

def cli(*args):
    return cli_main(["audit", "--import", "npusim", *args])

results = {}
"""


def run_script(tmp_path: Path, body: str) -> dict:
    """Runs PRELUDE + body in a fresh interpreter; returns the ``results`` dict it prints last."""
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body) + "\nprint('RESULTS=' + json.dumps(results))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"scenario failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULTS="))
    return json.loads(line.removeprefix("RESULTS="))


def targets(report: dict, status: str | None = None) -> set[str]:
    return {f["target"] for f in report["findings"] if status is None or f["status"] == status}


def test_clean_process_cli_exits_zero():
    """`python -m npusim audit` after importing npusim and npusim.distributed.* finds nothing."""
    proc = subprocess.run([sys.executable, "-m", "npusim", "audit", "--json"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["findings"] == []
    assert report["checked"] > 200  # functions, methods and kernels were actually inspected


def test_clean_process_table_says_clean():
    """The readable table of a clean process says so and names what was checked."""
    proc = subprocess.run([sys.executable, "-m", "npusim", "audit"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "clean" in proc.stdout and "checked" in proc.stdout


def test_historical_patch_is_flagged_then_removed(tmp_path):
    """The historical patch's three targets are forbidden, exit 1; removal (and the context manager) restore."""
    res = run_script(tmp_path, """
        from npusim.distributed import historical_patch as hp
        results["before"] = report()            # importing the module applies nothing
        hp.apply_historical_patch()
        results["applied"] = report()
        results["rc_applied"] = cli()
        hp.remove_historical_patch()
        results["removed"] = report()
        results["rc_removed"] = cli()
        with hp.historical_patch():
            results["in_ctx"] = report()
        results["after_ctx"] = report()
    """)
    assert res["before"]["findings"] == []
    applied = res["applied"]
    assert targets(applied) == HISTORICAL and targets(applied, "forbidden") == HISTORICAL
    for finding in applied["findings"]:
        assert "historical_patch.py:" in finding["replacement_origin"], finding
        assert finding["change"] == "replaced" and "collectives" in finding["reason"]
    assert res["rc_applied"] == 1
    assert res["removed"]["findings"] == [] and res["rc_removed"] == 0
    assert targets(res["in_ctx"]) == HISTORICAL
    assert res["after_ctx"]["findings"] == []


def test_external_kernel_registration_is_flagged_with_origin(tmp_path):
    """An fsdp::all_gather_copy_in PrivateUse1 kernel registered outside PyTorch is forbidden, with its file:line."""
    res = run_script(tmp_path, """
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C
        lib = torch.library.Library("fsdp", "IMPL")  # LIBRARY_LINE
        lib.impl("all_gather_copy_in", lambda *a: C.all_gather_copy_in_cuda(*a), "PrivateUse1")
        results["library"] = report()
        results["rc"] = cli()
        lib._destroy()
        results["destroyed"] = report()
        # Through the torch.library helper the dispatcher records torch/library.py: still not PyTorch's own.
        torch.library.impl("fsdp::chunk_cat", "npu", lambda *a, **k: None)
        results["helper"] = report()
    """)
    script = tmp_path / "scenario.py"
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "LIBRARY_LINE" in text)
    (finding,) = res["library"]["findings"]
    assert finding["target"] == "fsdp::all_gather_copy_in[PrivateUse1]"
    assert finding["kind"] == "kernel" and finding["change"] == "replaced" and finding["status"] == "forbidden"
    assert finding["replacement_origin"] == f"{script}:{line}"
    assert res["rc"] == 1
    assert res["destroyed"]["findings"] == []
    (helper,) = res["helper"]["findings"]
    assert helper["target"] == "fsdp::chunk_cat[PrivateUse1]" and helper["status"] == "forbidden"
    assert helper["replacement_origin"].split(":")[0].endswith("torch/library.py")


def test_op_attribute_rebinding_is_flagged(tmp_path):
    """Rebinding torch.ops.fsdp.all_gather_copy_in (the old torch-npu way) is caught, `.default` too."""
    res = run_script(tmp_path, """
        def fake_copy_in(*args):
            raise AssertionError("never called")
        packet = torch.ops.fsdp.all_gather_copy_in
        packet.default = fake_copy_in
        results["default"] = report()
        torch.ops.fsdp.all_gather_copy_in = fake_copy_in
        results["packet"] = report()
    """)
    assert targets(res["default"], "forbidden") == {"torch.ops.fsdp.all_gather_copy_in.default"}
    assert "fake_copy_in" in res["default"]["findings"][0]["replacement_origin"]
    assert "torch.ops.fsdp.all_gather_copy_in" in targets(res["packet"], "forbidden")


def test_allowlisted_enhancement_is_allowed(tmp_path):
    """A wrapper on an allowlisted hook is reported as allowed (exit 0); an unlisted one is forbidden (exit 1)."""
    res = run_script(tmp_path, """
        import functools
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        target = "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup.post_forward"
        audit.register_allowed_enhancement(target, "test: recompute-aware reshard")
        upstream = FSDPParamGroup.post_forward

        @functools.wraps(upstream)
        def post_forward(self, *args, **kwargs):
            return upstream(self, *args, **kwargs)

        FSDPParamGroup.post_forward = post_forward
        results["allowed"] = report()
        results["rc_allowed"] = cli()
        FSDPParamGroup.pre_forward = lambda self, *a, **k: None
        results["unlisted"] = report()
        results["rc_unlisted"] = cli("--json")
        try:
            audit.register_allowed_enhancement(
                "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup.finalize_backward", "no")
            results["collectives_refused"] = False
        except ValueError:
            results["collectives_refused"] = True
    """)
    (finding,) = res["allowed"]["findings"]
    assert finding["status"] == "allowed" and finding["change"] == "wrapped"
    assert finding["reason"] == "test: recompute-aware reshard"
    assert "scenario.py:" in finding["replacement_origin"]
    assert res["rc_allowed"] == 0
    assert targets(res["unlisted"], "forbidden") == {
        "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup.pre_forward"}
    assert res["rc_unlisted"] == 1
    assert res["collectives_refused"]


def test_register_allowed_enhancement_validates():
    """Collectives targets, names outside FSDP2 and empty reasons are refused."""
    from npusim.distributed import audit

    with pytest.raises(ValueError, match="collectives"):
        audit.register_allowed_enhancement("fsdp::all_gather_copy_in[PrivateUse1]", "faster")
    with pytest.raises(ValueError, match="expected a target"):
        audit.register_allowed_enhancement("torch.nn.Linear.forward", "why")
    with pytest.raises(ValueError, match="reason"):
        audit.register_allowed_enhancement("torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState._x", " ")
    assert audit.ALLOWED_ENHANCEMENTS == {}
