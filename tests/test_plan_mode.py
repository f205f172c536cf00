"""Plan mode (Note [Plan mode], Note [A planned world], docs/PLAN.md): the device allocates and prices
every op as a computing run does and writes only small work; one rank stands for its world; the plan of
a small FSDP2 Llama equals its real run byte for byte (peak allocated) and in chip time."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from npusim.testing.torchrun import run_bounded, torchrun_command

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "plan_llama8b.py"
# Two layers, FSDP2 over 8 ranks, bf16 mixed precision, checkpointing, AdamW. The logits (256 x 8192
# floats, 8 MiB) are large work, so the plan's loss reads 0.0; the rest is small enough to compute.
SMALL_LLAMA = ["--layers", "2", "--hidden", "256", "--intermediate", "512", "--heads", "4", "--kv-heads", "2",
               "--vocab", "8192", "--seq", "256", "--steps", "3"]


def _python(code: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> tuple[int, str, str]:
    result = run_bounded([sys.executable, "-c", textwrap.dedent(code)], timeout_s, env={**os.environ, **(env or {})})
    return result.returncode, result.stdout, result.stderr


DEVICE_CHECKS = """
    import json, os, resource, torch, npusim
    from npusim.runtime import acl
    out = {"computes": acl.device_computes()}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = torch.empty(int(os.environ["BIG_BYTES"]), dtype=torch.uint8, device="npu")  # 40 GiB in plan mode
    big.fill_(7)                                                   # large work: skipped in plan mode
    a = torch.ones(1024, 1024, device="npu")                       # 4 MiB: large
    b = a @ a
    out["large_values"] = [b[0, :3].cpu().tolist(), big[:2].cpu().tolist()]
    out["large_sum"] = b.sum().item()                              # reads b (4 MiB): skipped, cleared scalar
    small = torch.arange(6, device="npu").view(2, 3) * 2 + 1       # small work computes
    out["small"] = small.cpu().tolist()
    out["from_host"] = torch.tensor([3, 1, 2]).to("npu").sort().values.cpu().tolist()
    torch.manual_seed(0)
    out["draws"] = torch.rand(4, device="npu").cpu().tolist()
    out["allocated"] = torch.npu.memory_allocated()
    out["rss_growth_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) >> 10
    del big
    try:
        acl.set_plan_mode(acl.device_computes())  # the other mode
    except RuntimeError as error:
        out["switch_error"] = str(error).splitlines()[0]
    print(json.dumps(out))
"""


def _device_checks(env: dict[str, str]) -> dict:
    code, stdout, stderr = _python(DEVICE_CHECKS, env)
    assert code == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_plan_mode_allocates_as_a_computing_device_and_writes_only_small_work():
    """40 GiB of device memory costs the host nothing and reads as zeros; large ops write nothing and a
    skipped op's small result reads 0; small ops, host copies and random draws give a computing run's
    values; the allocator counts the same bytes; the mode cannot change once memory is mapped."""
    plan = _device_checks({"NPUSIM_COMPUTE": "plan", "BIG_BYTES": str(40 << 30)})
    assert plan["computes"] is False
    assert plan["large_values"] == [[0.0, 0.0, 0.0], [0, 0]]
    assert plan["large_sum"] == 0.0
    assert plan["small"] == [[1, 3, 5], [7, 9, 11]]
    assert plan["from_host"] == [1, 2, 3]
    assert plan["rss_growth_mib"] < 200
    assert "plan mode (NPUSIM_COMPUTE=plan) must be chosen before the first npu allocation" in plan["switch_error"]
    real = _device_checks({"NPUSIM_COMPUTE": "real", "BIG_BYTES": str(1 << 20)})  # a big the host can hold
    assert real["computes"] is True
    assert real["large_values"] == [[1024.0] * 3, [7, 7]] and real["large_sum"] == 1024.0 ** 3
    assert plan["small"] == real["small"] and plan["from_host"] == real["from_host"]
    assert plan["draws"] == real["draws"]
    assert plan["allocated"] - (40 << 30) == real["allocated"] - (1 << 20)  # the same blocks besides big


def test_plan_mode_settings_are_checked():
    code, _, stderr = _python("import npusim", {"NPUSIM_COMPUTE": "plan", "RANK": "0"})
    assert code == 0 and "npusim: NPUSIM_COMPUTE=plan: values are not computed" in stderr
    code, _, stderr = _python("import npusim", {"NPUSIM_COMPUTE": "plan", "RANK": "3"})
    assert code == 0 and "values are not computed" not in stderr  # once per job: rank 0 says it
    code, _, stderr = _python("import npusim", {"NPUSIM_COMPUTE": "fast"})
    assert code != 0 and "NPUSIM_COMPUTE: expected one of real, plan, got 'fast'" in stderr
    code, _, stderr = _python("import npusim, torch; torch.zeros(1, device='npu')",
                              {"NPUSIM_COMPUTE": "real", "NPUSIM_PLANNED_WORLD": "1"})
    assert code == 0  # read when a group is made, not at import
    code, _, stderr = _python("""
        import npusim.config as c
        c.planned_world()
    """, {"NPUSIM_COMPUTE": "real", "NPUSIM_PLANNED_WORLD": "1"})
    assert code != 0 and "NPUSIM_PLANNED_WORLD: expected 0 unless NPUSIM_COMPUTE=plan" in stderr


PLANNED_WORLD_SCRIPT = """
    import json, os, torch, torch_npu
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("hccl")
    mesh = init_device_mesh("npu", (4, 8), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"].get_group()
    x = torch.full((1 << 20,), 1.0, device="npu")                  # 4 MiB
    gathered = torch.empty(8 << 20, device="npu")
    dist.all_gather_into_tensor(gathered, x, group=tp)
    small = torch.ones(4, device="npu")
    dist.all_reduce(small)                                         # small: every rank holds ones
    pieces = torch.empty(8 * 3, device="npu")
    dist.all_gather_into_tensor(pieces, torch.arange(3.0, device="npu"), group=tp)
    cpu_group = dist.new_group(backend="gloo")                     # its peers are not there
    cpu = torch.full((2,), 3.0)
    dist.all_reduce(cpu, op=dist.ReduceOp.MAX, group=cpu_group)
    objects = [None] * 32
    dist.all_gather_object(objects, {"rank": dist.get_rank()})
    if os.environ.get("CKPT"):  # DCP's plan comes from rank 0 (scatter_object_list): rank 0 plans it
        import torch.distributed.checkpoint as dcp
        dcp.save({"w": torch.ones(4, device="npu")}, checkpoint_id=os.environ["CKPT"])
    dist.barrier()
    torch.npu.synchronize()
    print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "tp": dist.get_world_size(tp),
                      "tp_rank": dist.get_rank(tp), "local_rank": int(os.environ["LOCAL_RANK"]),
                      "device": torch.npu.current_device(), "gathered": gathered.numel(),
                      "large": gathered[:2].cpu().tolist(), "small": small.cpu().tolist(),
                      "pieces": pieces[:6].cpu().tolist(), "cpu": cpu.tolist(), "objects": objects[::31]}))
    dist.destroy_process_group()
"""


def _plan_world_script(tmp_path: Path, rank: int, checkpoint: str = "", launcher: list[str] | None = None) -> dict:
    script = tmp_path / "world.py"
    script.write_text(textwrap.dedent(PLANNED_WORLD_SCRIPT))
    out = tmp_path / f"out{rank}"
    result = run_bounded([*(launcher or [sys.executable]), "-m", "npusim", "plan", "--world-size", "32",
                          "--ranks-per-node", "8",
                          "--rank", str(rank), "--no-flops", "--out", str(out), "--", str(script)], 180,
                         env={**os.environ, "CKPT": checkpoint})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "values are not computed" in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [rank] and report["world_size"] == 32
    assert report["ranks"][0]["mode"] == "plan" and report["ranks"][0]["time"]["communication_us"] > 0
    return json.loads(re.search(r'\{"rank".*\}', result.stdout).group(0))


def test_one_rank_stands_for_a_world_of_32(tmp_path: Path):
    """--world-size 32 --ranks-per-node 8 --rank 13: the script sees torchrun's environment of rank 13
    (node 1, local rank 5), a 2-D DeviceMesh and a gloo group form, collectives complete: a large one
    moves nothing, small ones (npu and CPU, object collectives) give what they give when every rank holds
    this rank's data; nothing else runs. Rank 0, planned from a one-process torchrun, also saves a DCP
    checkpoint (its planning collectives)."""
    line = _plan_world_script(tmp_path, 13)
    assert line == {"rank": 13, "world": 32, "tp": 8, "tp_rank": 5, "local_rank": 5, "device": 5,
                    "gathered": 8 << 20, "large": [0.0, 0.0], "small": [32.0] * 4,
                    "pieces": [0.0, 1.0, 2.0] * 2, "cpu": [3.0, 3.0], "objects": [{"rank": 13}] * 2}
    line = _plan_world_script(tmp_path, 0, str(tmp_path / "ckpt"), launcher=torchrun_command([], 1))
    assert line["rank"] == 0 and line["tp_rank"] == 0 and line["objects"] == [{"rank": 0}] * 2
    assert (tmp_path / "ckpt" / ".metadata").exists()


@pytest.mark.parametrize("flags, message", [
    (["--world-size", "4", "--rank", "4"], "--rank must be in [0, 4), got 4"),
    (["--world-size", "64", "--all-ranks"], "--all-ranks runs every rank on this machine, at most 16"),
    (["--world-size", "64", "--ranks-per-node", "32"], "more than the 16 devices a simulated node has"),
])
def test_plan_refuses_worlds_it_cannot_run(tmp_path: Path, flags: list[str], message: str):
    result = run_bounded([sys.executable, "-m", "npusim", "plan", *flags, "--out", str(tmp_path), "--",
                          str(LLAMA), "--tiny"], 60)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]


def test_plan_names_the_rank_that_does_not_fit(tmp_path: Path):
    """A job over its npu's memory: the allocator's OOM, the report of the step it stopped in (phase,
    module, largest allocations) and one line naming the rank and the capacity; exit status 1."""
    result = run_bounded([sys.executable, "-m", "npusim", "plan", "--world-size", "64", "--out", str(tmp_path), "--",
                          str(LLAMA), "--layers", "2", "--steps", "1"], 300,
                         env={**os.environ, "NPUSIM_MEMORY_CAPACITY": "3GiB"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(r"rank 0 stopped in step 1 forward / \S+: OutOfMemoryError: NPU out of memory", result.stdout)
    assert "largest of the" in result.stdout
    assert "64 rank(s); profile training_soc (Ascend910B2, 3 GiB)" in result.stdout  # the device's capacity
    assert re.search(r"npusim plan: rank 0 does not fit its npu \(3\.0 GiB\): NPU out of memory\. Tried to "
                     r"allocate [\d.]+ MiB", result.stderr)
    report = json.loads((tmp_path / "rank0" / "report.json").read_text())
    assert report["error"].startswith("OutOfMemoryError") and report["memory"]["largest_allocations"]


def test_plan_of_a_small_fsdp2_llama_equals_its_real_run(tmp_path: Path):
    """The self-check: 8 ranks run the 2-layer Llama for real under the report; rank 0 alone plans it in a
    world of 8. The plan's peak allocated is every real rank's, byte for byte, and so are its peak reserved
    (Note [Stream-ordered free]: under the chip clock the blocks chosen do not depend on the workers' pace)
    and its chip-time step; the plan computed no large work (its loss reads 0.0)."""
    real = run_bounded([*torchrun_command(["-m", "npusim", "report", "--out", str(tmp_path / "real"), "--",
                                           str(LLAMA), *SMALL_LLAMA], 8)], 600)
    assert real.returncode == 0, real.stderr[-4000:]
    plan = run_bounded([sys.executable, "-m", "npusim", "plan", "--world-size", "8", "--out", str(tmp_path / "plan"),
                        "--", str(LLAMA), *SMALL_LLAMA], 300)
    assert plan.returncode == 0, plan.stderr[-4000:]
    real_ranks = json.loads((tmp_path / "real" / "report.json").read_text())["ranks"]
    (planned,) = json.loads((tmp_path / "plan" / "report.json").read_text())["ranks"]
    assert len(real_ranks) == 8 and planned["step"] == 3 and planned["step_complete"]
    assert planned["values_computed"] is False and all(r["values_computed"] for r in real_ranks)
    for rank in real_ranks:
        assert rank["step"] == planned["step"]
        assert rank["memory"]["peak_allocated"] == planned["memory"]["peak_allocated"], rank["rank"]
        assert rank["memory"]["peak_reserved"] == planned["memory"]["peak_reserved"], rank["rank"]
        assert rank["time"]["step_us"] == planned["time"]["step_us"], rank["rank"]
        assert rank["device_tasks"] == planned["device_tasks"]
    real_loss = float(re.search(r"step 3: loss (\S+)", real.stdout).group(1))
    plan_loss = float(re.search(r"step 3: loss (\S+)", plan.stdout).group(1))
    assert real_loss > 1.0 and plan_loss == 0.0


def test_all_ranks_plans_every_rank_as_a_process(tmp_path: Path):
    """--all-ranks --world-size 2: torchrun runs both ranks in plan mode; each writes its report, rank 0
    prints the table of both, and the symmetric job gives both ranks the same peak and step."""
    result = run_bounded([sys.executable, "-m", "npusim", "plan", "--all-ranks", "--world-size", "2", "--out",
                          str(tmp_path), "--", str(LLAMA), *SMALL_LLAMA[:-1], "2"], 300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = json.loads((tmp_path / "report.json").read_text())["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["mode"] == "plan" for r in ranks)
    assert ranks[0]["memory"]["peak_allocated"] == ranks[1]["memory"]["peak_allocated"]
    assert ranks[0]["memory"]["peak_reserved"] == ranks[1]["memory"]["peak_reserved"]
    assert ranks[0]["time"]["step_us"] == ranks[1]["time"]["step_us"]
    assert re.search(r"step 2: loss 0\.0000", result.stdout)
