"""Real clients under `python -m npusim run`: a transformers Trainer (1 process, 2 ranks under torchrun) and
accelerate (DDP, FSDP2) train a tiny Llama on npu with losses equal to the same run on CPU."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from npusim.ops.fused import OPS
from npusim.testing.torchrun import run_bounded, torchrun_command

SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate")
                       is None, reason="the integration extra is not installed (`make install` installs it)"),
    pytest.mark.skipif("npu_fusion_attention" not in OPS,
                       reason="transformers imports torch_npu.npu_fusion_attention whenever torch_npu is present; "
                              "npusim.ops.fused's attention family provides it"),
]


def _launch(script: str, *args: str, ranks: int, tmp_path: Path, timeout: float = 240) -> list[dict]:
    """`npusim run` of a script (under torchrun with ``ranks`` > 1); the results it printed, in rank order."""
    target = ["-m", "npusim", "run", str(SCRIPTS / script), *args]
    cmd = torchrun_command(target, ranks) if ranks > 1 else [sys.executable, *target]
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    result = run_bounded(cmd, timeout, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    decoder = json.JSONDecoder()
    lines = [decoder.raw_decode(result.stdout, found.end())[0] for found in re.finditer("RESULT ", result.stdout)]
    assert len(lines) == ranks, result.stdout[-2000:]
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
