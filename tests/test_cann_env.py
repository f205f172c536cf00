"""`python -m npusim run` gives a job a simulated CANN toolkit environment (ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME,
ASCEND_OPP_PATH and version files of the profile's CANN release), inherited by its children, and never stands in
for a CANN environment that is set or a real toolkit that is installed; DeepSpeed's NPU accelerator, which needs it,
initialises ZeRO-3 on 2 ranks and trains as one CPU process."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from npusim.testing.torchrun import run_bounded
from npusim.tools.cann_env import CANN_VARIABLES, MARKER, cann_environment

SCRIPTS = Path(__file__).parent / "scripts"


def _deepspeed_cann_version(home: str) -> str:
    """The release as DeepSpeed's NPU op builder (and torch_npu's get_cann_version) reads it: the
    ``version`` line of the first ``ascend_*_install.info`` under the toolkit."""
    for dirpath, _, filenames in os.walk(os.path.realpath(home)):
        for name in filenames:
            if re.match(r"ascend_.*_install\.info", name):
                for line in Path(dirpath, name).read_text().splitlines():
                    if "version" in line:
                        return line.strip().split("=")[-1]
    return ""


def test_simulated_toolkit_reports_the_version_and_holds_no_library(tmp_path):
    """The three variables point into one tree whose version files give the requested release (read as
    DeepSpeed reads it); it says it is npusim's and holds no library; a second job reuses it."""
    added, why = cann_environment({}, "8.0.RC3", arch="x86_64", cache_root=tmp_path / "cache",
                                  real_toolkit=tmp_path / "no_real_toolkit")
    assert why == "" and set(added) == set(CANN_VARIABLES)
    home = Path(added["ASCEND_HOME_PATH"])
    assert added["ASCEND_TOOLKIT_HOME"] == str(home) and added["ASCEND_OPP_PATH"] == str(home / "opp")
    assert home == tmp_path / "cache" / "8.0.RC3-x86_64"
    assert _deepspeed_cann_version(str(home)) == "8.0.RC3"
    assert (home / "compiler" / "version.info").read_text() == "Version=8.0.RC3\n"
    assert (home / "opp" / "version.info").read_text() == "Version=8.0.RC3\n"
    assert "simulated CANN 8.0.RC3" in (home / MARKER).read_text()
    assert not [p for p in home.rglob("*") if p.suffix in (".so", ".h", ".a")]
    stamp = (home / MARKER).stat().st_mtime_ns
    again, _ = cann_environment({}, "8.0.RC3", arch="x86_64", cache_root=tmp_path / "cache",
                                real_toolkit=tmp_path / "no_real_toolkit")
    assert again == added and (home / MARKER).stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["8.0.RC3-x86_64"]  # no staging left behind


@pytest.mark.parametrize("name", CANN_VARIABLES)
def test_a_set_cann_environment_is_kept(tmp_path, name):
    """Any of the three variables set: nothing is added, and the reason names it."""
    added, why = cann_environment({name: "/opt/cann"}, "9.1.0", cache_root=tmp_path,
                                  real_toolkit=tmp_path / "no_real_toolkit")
    assert added == {} and why == f"{name} set: the environment's CANN is kept"
    assert not any(tmp_path.iterdir())


def test_a_real_toolkit_not_sourced_is_not_simulated(tmp_path):
    """A real toolkit at CANN's default place without its environment: nothing is simulated, and the
    reason says which set_env.sh to source."""
    real = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    real.mkdir(parents=True)
    added, why = cann_environment({}, "9.1.0", cache_root=tmp_path / "cache", real_toolkit=real)
    assert added == {} and not (tmp_path / "cache").exists()
    assert why == (f"a real CANN toolkit is installed at {real} but its environment is not set; source "
                   f"{tmp_path / 'Ascend' / 'ascend-toolkit' / 'set_env.sh'} to use it")


SCRIPT = """
    import os, subprocess, sys
    import torch_npu
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['ASCEND_OPP_PATH'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    print("HOME", os.environ["ASCEND_HOME_PATH"])
    print("TOOLKIT", os.environ["ASCEND_TOOLKIT_HOME"])
    print("OPP", os.environ["ASCEND_OPP_PATH"], child)
    print("TORCH_NPU", torch_npu.utils.get_cann_version())
"""


def _lines(stdout: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.split()}


def test_npusim_run_gives_the_job_and_its_children_the_profiles_cann(tmp_path, monkeypatch):
    """Under `npusim run` with the old_cann profile the script and its child see a CANN 8.0.RC3 toolkit
    environment, the release torch_npu's get_cann_version reports; a job whose ASCEND_HOME_PATH is set
    keeps its own."""
    for name in CANN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "show_cann.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "NPUSIM_PROFILE": "old_cann"}
    done = run_bounded([sys.executable, "-m", "npusim", "run", str(script)], 180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = _lines(done.stdout)
    home = seen["HOME"][0]
    assert home == str(tmp_path / "cache" / "npusim" / "cann" / f"8.0.RC3-{os.uname().machine}")
    assert seen["TOOLKIT"] == [home] and seen["OPP"] == [f"{home}/opp"] * 2
    assert _deepspeed_cann_version(home) == "8.0.RC3" == seen["TORCH_NPU"][0]
    own = tmp_path / "own_cann"
    done = run_bounded([sys.executable, "-m", "npusim", "run", str(script)], 180,
                       env={**env, "ASCEND_HOME_PATH": str(own), "ASCEND_TOOLKIT_HOME": str(own),
                            "ASCEND_OPP_PATH": str(own / "opp")})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = _lines(done.stdout)
    assert seen["HOME"] == [str(own)] and seen["OPP"] == [str(own / "opp")] * 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _reference_losses() -> list[list[float]]:
    """Each rank's losses of the script's two steps, from one CPU process: Adam on the ranks' mean gradient."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from deepspeed_zero3 import LR, model_and_batches
    finally:
        sys.path.remove(str(SCRIPTS))
    model, _ = model_and_batches(0)
    batches = [model_and_batches(rank)[1] for rank in (0, 1)]
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses: list[list[float]] = [[], []]
    for step in range(2):
        opt.zero_grad()
        for rank in (0, 1):
            x, y = batches[rank][step]
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss / 2).backward()
            losses[rank].append(loss.item())
        opt.step()
    return losses


def test_deepspeed_zero3_initialises_under_npusim_run(tmp_path, monkeypatch):
    """DeepSpeed's NPU accelerator (DS_ACCELERATOR=npu), which reads ASCEND_HOME_PATH in init_distributed:
    ZeRO-3 on 2 ranks under `torchrun -m npusim run`, no variable set by hand, trains two Adam steps with
    one CPU process's losses."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8 runs it)")
    for name in CANN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "npusim", "run", str(SCRIPTS / "deepspeed_zero3.py"),
           str(tmp_path)]
    done = run_bounded(cmd, 400, env={"DS_ACCELERATOR": "npu", "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["rank"], r["accelerator"], r["device"]) for r in ranks] == [(0, "npu", "npu:0"), (1, "npu", "npu:1")]
    assert all(r["ascend_home_path"].startswith(str(tmp_path / "cache" / "npusim" / "cann")) for r in ranks)
    for rank, want in zip(ranks, _reference_losses(), strict=True):
        torch.testing.assert_close(rank["losses"], want, rtol=1e-5, atol=1e-6)
