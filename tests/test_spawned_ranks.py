"""Every process of an `npusim run` job gets npusim's torch_npu: ranks started by mp.spawn and forkserver
children (module starting with `import torch_npu`), MultiProcessTestCase (FSDPNPUTest), and none outside a job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from npusim.compat import torch_npu as shim
from npusim.testing.torchrun import run_bounded

SCRIPTS = Path(__file__).parent / "scripts"


def _run(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_bounded(cmd, timeout, env={"NPUSIM_DEVICE_COUNT": "2"}, cwd=None if cwd is None else str(cwd))


def _ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_mp_spawn_ranks_get_npusims_torch_npu(tmp_path):
    """mp.spawn under npusim run: both ranks import torch_npu (npusim's) and all_reduce over hccl."""
    result = _run([sys.executable, "-m", "npusim", "run", str(SCRIPTS / "spawn_job.py"), "spawn", str(tmp_path)], 180)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = _ranks(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["sum"] == [3.0, 3.0] for r in ranks)
    assert all(r["npu_is_torch_npu"] and r["torch_npu_file"] == str(shim.PACKAGE_DIR / "__init__.py") for r in ranks)
    assert len({r["pid"] for r in ranks}) == 2 and ranks[0]["start_method"] == "spawn"


def test_forkserver_child_gets_npusims_torch_npu(tmp_path):
    """A forkserver child (the server preloads the script, which starts with import torch_npu) runs its rank."""
    result = _run([sys.executable, "-m", "npusim", "run", str(SCRIPTS / "spawn_job.py"), "forkserver",
                   str(tmp_path)], 180)
    assert result.returncode == 0, result.stderr[-3000:]
    (rank,) = _ranks(tmp_path)
    assert rank["sum"] == [1.0, 1.0] and rank["npu_is_torch_npu"] and rank["start_method"] == "forkserver"


def test_spawned_children_outside_a_job_see_no_torch_npu(tmp_path):
    """Outside npusim run a spawned child finds no torch_npu: nothing is installed under the name."""
    script = tmp_path / "outside.py"
    script.write_text(textwrap.dedent("""
        import importlib.util, multiprocessing, torch

        def probe(queue):
            queue.put((importlib.util.find_spec("torch_npu") is None, hasattr(torch, "npu")))

        if __name__ == "__main__":
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            child = ctx.Process(target=probe, args=(queue,))
            child.start()
            print(queue.get(timeout=120))
            child.join()
    """))
    result = _run([sys.executable, str(script)], 180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "(True, True)"  # no torch_npu; the npu itself is there (autoload)


def test_fsdp_npu_test_case_runs_its_ranks(tmp_path):
    """FSDPNPUTest (MultiProcessTestCase, spawned ranks) runs a 2-rank FSDP2 test file under npusim run -m pytest."""
    result = _run([sys.executable, "-m", "npusim", "run", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   str(SCRIPTS / "torch_npu_fsdp_cases.py")], 240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
