"""`python -m npusim run`: torch_npu scripts run unmodified, alone, under torchrun, and on two simulated nodes."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from npusim.compat import torch_npu as shim
from npusim.testing.torchrun import run_bounded

SCRIPT = Path(__file__).parent / "scripts" / "torch_npu_train.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return run_bounded(cmd, timeout, env={"OMP_NUM_THREADS": "1"})


def _results(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_shim_exists_only_while_installed():
    """install() makes `import torch_npu` give torch.npu as torch_npu.npu; nothing is left behind after uninstall()."""
    assert importlib.util.find_spec("torch_npu") is None  # nothing is installed under the name
    module = shim.install()
    try:
        import torch_npu
        import torch_npu.npu.amp

        assert torch_npu is module and torch_npu.npu is torch.npu and torch_npu.npu.amp is torch.npu.amp
        with pytest.raises(shim.NotSimulatedError, match=r"torch_npu.npu_quant_matmul is not simulated by npusim"):
            torch_npu.npu_quant_matmul(torch.ones(2, device="npu"), torch.ones(2, device="npu"))
        assert torch_npu.npu_rms_norm is torch.ops.npu.npu_rms_norm  # a simulated fused operator
        with pytest.raises(ImportError, match=r"torch_npu.asd is not simulated by npusim"):
            import torch_npu.asd  # noqa: F401
        with pytest.raises(AttributeError, match=r"torch_npu.no_such_name is not simulated by npusim"):
            torch_npu.no_such_name  # noqa: B018
    finally:
        shim.uninstall()
    assert "torch_npu" not in sys.modules and importlib.util.find_spec("torch_npu") is None


def test_run_trains_a_torch_npu_script(tmp_path):
    """AMP (torch.npu.amp), a pinned DataLoader, non_blocking copies, memory stats and a checkpoint all work."""
    result = _run([sys.executable, "-m", "npusim", "run", str(SCRIPT), "--checkpoint", str(tmp_path / "c.pt")], 240)
    assert result.returncode == 0, result.stderr[-3000:]
    (out,) = _results(result.stdout)
    assert out["torch_npu_npu_is_torch_npu"] and out["pinned"] and out["restored_equal"] and out["summary_ok"]
    losses = out["losses"]
    assert len(losses) == 12 and sum(losses[-4:]) < sum(losses[:4])  # 3 epochs of 4 batches: it learns
    assert out["reserved"] >= out["allocated"] > 0 and out["peak"] >= out["allocated"]
    assert out["device_name"] == "Ascend910B2" and out["scale"] > 0
    assert (tmp_path / "c.pt").exists()


def test_run_names_an_unsimulated_call(tmp_path):
    """transfer_to_npu runs "cuda" on the npu; a simulated fused operator runs and an unsimulated torch_npu
    operator stops the script naming the call."""
    script = tmp_path / "fused.py"
    script.write_text(textwrap.dedent("""
        import torch, torch_npu
        from torch_npu.contrib import transfer_to_npu  # noqa: F401
        print("cuda is npu:", torch.ones(1, device="cuda").device, torch.cuda.device_count())
        q = torch.ones(1, 2, 4, 8, device="npu")
        print("rms_norm:", tuple(torch_npu.npu_rms_norm(q, torch.ones(8, device="npu"))[0].shape))
        torch_npu.npu_dropout_with_add_softmax(q, q, 1.0, 0.1, -1)
    """))
    result = _run([sys.executable, "-m", "npusim", "run", str(script)], 120)
    assert result.returncode != 0 and "cuda is npu: npu:0 8" in result.stdout
    assert "rms_norm: (1, 2, 4, 8)" in result.stdout
    assert "torch_npu.npu_dropout_with_add_softmax is not simulated by npusim" in result.stderr


def _torchrun(*launch: str, timeout: float = 300) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "-m", "npusim", "run", str(SCRIPT)]
    result = _run(cmd, timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return sorted(_results(result.stdout), key=lambda r: r["rank"])


def test_fsdp2_under_torchrun():
    """`torchrun --nproc-per-node 2 -m npusim run script.py` trains with FSDP2 over hccl on both ranks."""
    ranks = _torchrun("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port()))
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    losses = ranks[0]["losses"]
    assert ranks[1]["losses"] == losses and sum(losses[-4:]) < sum(losses[:4])
    assert ranks[0]["param_sums"] == ranks[1]["param_sums"]


def test_fsdp2_on_two_nodes_matches_one_node():
    """Two simulated nodes of 2 ranks (torchrun --nnodes 2, c10d rendezvous on loopback) train as one node of 4."""
    single = _torchrun("--nproc-per-node", "4", "--master-addr", "127.0.0.1", "--master-port", str(_free_port()))
    port = _free_port()
    launch = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
              f"127.0.0.1:{port}", "--rdzv-id", f"npusim-{port}", "--local-addr", "127.0.0.1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "-m", "npusim", "run", str(SCRIPT)]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                              start_new_session=True) for _ in range(2)]
    outputs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=300)
            assert node.returncode == 0, err[-4000:]
            outputs.extend(_results(out))
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    two_nodes = sorted(outputs, key=lambda r: r["rank"])
    assert [r["rank"] for r in two_nodes] == [0, 1, 2, 3] and all(r["world"] == 4 for r in two_nodes)
    for got, want in zip(two_nodes, single, strict=True):
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
        assert got["param_sums"] == pytest.approx(want["param_sums"], rel=1e-6)
