"""torch_npu.contrib.transfer_to_npu: a CUDA-written script runs on the npu equal to CPU; nothing changes without it."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from pathlib import Path

import torch

from npusim.testing.torchrun import run_bounded

SCRIPT = Path(__file__).parent / "scripts" / "cuda_train.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(cmd: list[str], timeout: float) -> list[dict]:
    result = run_bounded(cmd, timeout, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads(line.removeprefix("RESULT ")) for line in result.stdout.splitlines()
            if line.startswith("RESULT ")]


def _python(tmp_path: Path, code: str, timeout: float = 120) -> dict:
    """Runs ``code`` under ``python -m npusim run`` (transfer_to_npu's install is process-wide) and
    returns the dict it prints as ``RESULT {json}``."""
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(code))
    (result,) = _run([sys.executable, "-m", "npusim", "run", str(script)], timeout)
    return result


def _close(actual: list[float], expected: list[float], **tolerance: float) -> None:
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), **tolerance)


def test_cuda_script_runs_on_npu_equal_to_cpu():
    """cuda devices, .cuda(), cuda:1, synchronize, GradScaler, both autocasts and torch.compile: npu equals CPU."""
    (out,) = _run([sys.executable, "-m", "npusim", "run", str(SCRIPT), "--case", "single"], 240)
    assert out["cuda_1"] == "npu:1" and out["is_cuda"] and out["param_device"] == "npu:0"
    assert [out["in_context"], out["generator"], out["loaded"]] == ["npu:1", "npu:0", "npu:1"] and out["loaded_equal"]
    assert out["device"] == "cuda"  # the device object is as written; what it makes lives on the npu
    assert out["available"] and out["count"] == 8 and out["current"] == 0 and out["name"] == "Ascend910B2"
    _close(out["losses"], out["reference_losses"])
    assert out["params_diff"] < 1e-5 and out["scale"] == 65536.0
    assert out["autocast_dtypes"] == ["torch.bfloat16", "torch.bfloat16"] and out["autocast_diff"] < 2e-2
    assert out["compiled_device"] == "npu:0" and out["compiled_diff"] < 1e-5


def test_ddp_over_nccl_on_two_ranks():
    """torchrun of DDP over "nccl" with device_ids=[local_rank] trains on hccl equal to CPU on the whole batch."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "npusim", "run", str(SCRIPT), "--case", "ddp"]
    ranks = sorted(_run(cmd, 240), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["backend"]) for r in ranks] == [(0, 2, "hccl"), (1, 2, "hccl")]
    assert [r["param_device"] for r in ranks] == ["npu:0", "npu:1"]
    assert all(r["params_diff"] < 1e-5 for r in ranks)
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank saw its own half


def test_nothing_changes_without_the_import(tmp_path):
    """With torch_npu alone, "cuda" stays PyTorch's CUDA (absent on this build) and nccl is not rewritten."""
    out = _python(tmp_path, """
        import json, torch, torch_npu
        import torch.distributed as dist
        try:
            torch.ones(1, device="cuda")
            made = "made"
        except (AssertionError, RuntimeError) as error:
            made = str(error)
        result = {"made": made, "available": torch.cuda.is_available(), "cuda_is_npu": torch.cuda is torch.npu,
                  "tensor_cuda": torch.Tensor.cuda is torch._C.TensorBase.cuda,
                  "is_cuda": torch.ones(1, device="npu").is_cuda, "nccl": dist.is_nccl_available(),
                  "transfer_loaded": "torch_npu.contrib.transfer_to_npu" in __import__("sys").modules}
        print("RESULT " + json.dumps(result))
    """)
    assert "Torch not compiled with CUDA enabled" in out["made"]
    assert out == {**out, "available": False, "cuda_is_npu": False, "tensor_cuda": True, "is_cuda": False,
                   "nccl": False, "transfer_loaded": False}


def test_uninstall_restores_every_patched_attribute(tmp_path):
    """install() then uninstall() leaves every patched owner as it was, a module patched at its later import too."""
    out = _python(tmp_path, """
        import json, sys, torch, torch_npu
        import torch.distributed as dist
        import torch._appdirs  # what importing cpp_extension below would bind in torch
        import torch.utils._triton
        from torch.nn.parameter import UninitializedTensorMixin
        from npusim.compat import transfer_to_npu

        def owners():
            return [torch, torch.Tensor, torch.nn.Module, torch.cuda, torch.cuda.amp, torch.cuda.random,
                    torch.cuda.memory, torch.npu.device, dist, dist.distributed_c10d, dist.ProcessGroup,
                    dist.device_mesh, dist.device_mesh.DeviceMesh, torch.nn.parallel.DistributedDataParallel,
                    torch.UntypedStorage, torch.storage.TypedStorage, torch.amp.autocast_mode.autocast,
                    torch.utils._device.DeviceContext, torch.profiler.profiler._KinetoProfile, torch.jit,
                    torch._utils, torch.utils._triton]

        def snapshot():
            return ([dict(vars(owner)) for owner in owners()], list(UninitializedTensorMixin._allowed_methods),
                    dict(dist.Backend.default_device_backend_map), list(sys.meta_path))

        def changed(before, after):
            names = [f"{owner.__name__}.{name}" for owner, old, new in zip(owners(), before[0], after[0])
                     for name in old.keys() | new.keys() if old.get(name) is not new.get(name)]
            return names + [what for what, old, new in zip(["allowed", "backends", "meta_path"], before[1:], after[1:])
                            if old != new]

        before = snapshot()
        transfer_to_npu.install()
        transfer_to_npu.install()  # idempotent
        import torch.utils.cpp_extension as cpp_extension  # patched when imported
        patched = [torch.ones(1, device="cuda").device.type, torch.cuda.synchronize is not torch.npu.synchronize,
                   getattr(cpp_extension.include_paths, "__npusim_transfer__", False),
                   "cuda" in dist.Backend.default_device_backend_map, len(changed(before, snapshot())) > 50]
        transfer_to_npu.uninstall()
        result = {"patched": patched, "changed": changed(before, snapshot()), "installed": transfer_to_npu.installed(),
                  "late_patched": getattr(cpp_extension.include_paths, "__npusim_transfer__", False)}
        transfer_to_npu.install()  # again after an undo
        result["again"] = torch.zeros(1, device="cuda:1").device.index
        print("RESULT " + json.dumps(result))
    """)
    assert out["patched"] == ["npu", True, True, False, True]
    assert out["changed"] == [] and not out["installed"] and not out["late_patched"]
    assert out["again"] == 1
