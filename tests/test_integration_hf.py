"""Real clients under `python -m npusim run`: a transformers Trainer (1 process, 2 ranks under torchrun) and
accelerate (DDP, FSDP2) train a tiny Llama on npu with losses equal to the same run on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from npusim.ops.fused import OPS

SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate")
                       is None, reason="the integration extra is not installed (`make install` installs it)"),
    pytest.mark.skipif("npu_fusion_attention" not in OPS,
                       reason="transformers imports torch_npu.npu_fusion_attention whenever torch_npu is present; "
                              "npusim.ops.fused's attention family provides it"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(script: str, *args: str, ranks: int, tmp_path: Path, timeout: float = 240) -> list[dict]:
    """`npusim run` of a script (under torchrun with ``ranks`` > 1); the results it printed, in rank order."""
    target = ["-m", "npusim", "run", str(SCRIPTS / script), *args]
    if ranks > 1:
        target = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
                  "--master-port", str(_free_port()), *target]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "TOKENIZERS_PARALLELISM": "false"}
    with subprocess.Popen([sys.executable, *target], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=tmp_path, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{script} {args} did not finish within {timeout} s:\n{err[-3000:]}") from None
    assert proc.returncode == 0, err[-4000:]
    lines = [json.loads(found) for found in re.findall(r"RESULT (\{[^\n]*\})", out)]
    assert len(lines) == ranks, out[-2000:]
    return sorted(lines, key=lambda line: line.get("rank", line["device"]))


def test_trainer_one_process_matches_cpu(tmp_path):
    """Trainer on npu:0 under npusim run logs the CPU run's losses."""
    (npu,) = _launch("hf_trainer_llama.py", str(tmp_path / "npu"), ranks=1, tmp_path=tmp_path)
    (cpu,) = _launch("hf_trainer_llama.py", str(tmp_path / "cpu"), "cpu", ranks=1, tmp_path=tmp_path)
    assert (npu["device"], cpu["device"]) == ("npu:0", "cpu") and len(npu["losses"]) == 4
    assert npu["losses"] == pytest.approx(cpu["losses"], rel=1e-5)


def test_trainer_two_ranks_match_cpu(tmp_path):
    """Trainer under torchrun: DDP over hccl on npu:0 / npu:1 logs gloo-on-CPU's losses."""
    npu = _launch("hf_trainer_llama.py", str(tmp_path / "npu"), ranks=2, tmp_path=tmp_path)
    cpu = _launch("hf_trainer_llama.py", str(tmp_path / "cpu"), "cpu", ranks=2, tmp_path=tmp_path)
    assert [r["device"] for r in npu] == ["npu:0", "npu:1"] and all(r["world"] == 2 for r in npu)
    for rank in npu:
        assert rank["losses"] == pytest.approx(cpu[0]["losses"], rel=1e-5)


def test_accelerate_ddp_and_fsdp2_match_cpu(tmp_path):
    """accelerate detects the NPU (MULTI_NPU, FSDP with fsdp_version=2) and both train as the CPU run does."""
    ddp = _launch("hf_accelerate_llama.py", "ddp", ranks=2, tmp_path=tmp_path)
    fsdp2 = _launch("hf_accelerate_llama.py", "fsdp2", ranks=2, tmp_path=tmp_path)
    cpu = _launch("hf_accelerate_llama.py", "ddp", "cpu", ranks=2, tmp_path=tmp_path)
    assert [(r["device"], r["type"]) for r in ddp] == [("npu:0", "DistributedType.MULTI_NPU"),
                                                      ("npu:1", "DistributedType.MULTI_NPU")]
    assert [r["type"] for r in fsdp2] == ["DistributedType.FSDP"] * 2 and all(r["fsdp2"] for r in fsdp2)
    assert cpu[0]["type"] == "DistributedType.MULTI_CPU"
    for run in (ddp, fsdp2):
        for rank in run:
            assert rank["losses"] == pytest.approx(cpu[0]["losses"], rel=1e-5)
