"""torch's device-backend autoload: `import torch` alone brings up the npu where npusim is installed;
TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off; a real torch_npu in the same process is a clear conflict."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# What torch_npu's package does on import, as far as owning the device goes.
FAKE_TORCH_NPU = """
import types, torch
torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", types.ModuleType("torch_npu.npu"))

def _autoload():
    pass
"""


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})


@pytest.fixture
def real_torch_npu(tmp_path: Path) -> Path:
    """A directory holding a stand-in for an installed torch_npu (no entry point)."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(FAKE_TORCH_NPU)
    return tmp_path


@pytest.fixture
def autoloading_torch_npu(real_torch_npu: Path) -> Path:
    """The stand-in with torch_npu's autoload entry point registered, as its wheel does."""
    info = real_torch_npu / "torch_npu-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return real_torch_npu


def test_import_torch_alone_makes_the_npu_available():
    """`import torch` loads npusim through the torch.backends entry point: torch.npu, device="npu", hccl."""
    result = _python("""
        import sys, torch
        x = torch.ones(3, device="npu") * 2
        import torch.distributed as dist
        print(torch.npu.__name__, x.device, x.sum().item(), "npusim" in sys.modules,
              dist.Backend.default_device_backend_map.get("npu"))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["npusim.runtime.npu", "npu:0", "6.0", "True", "hccl"]


def test_autoload_off_leaves_torch_alone():
    """TORCH_DEVICE_BACKEND_AUTOLOAD=0: `import torch` imports no npusim; `import npusim` still registers the npu."""
    result = _python("""
        import sys, torch
        before = (hasattr(torch, "npu"), "npusim" in sys.modules)
        import npusim
        print(before, torch.ones(1, device="npu").device)
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "(False, False) npu:0"


def test_autoload_installs_no_torch_npu():
    """After autoload there is still no torch_npu to import (only `npusim run` provides one)."""
    result = _python("""
        import importlib.util, torch
        print(hasattr(torch, "npu"), importlib.util.find_spec("torch_npu"))
        import torch_npu
    """)
    assert result.returncode != 0 and result.stdout.strip() == "True None"
    assert "ModuleNotFoundError: No module named 'torch_npu'" in result.stderr


def test_real_torch_npu_after_autoload_is_a_clear_conflict(real_torch_npu):
    """A real torch_npu imported after `import torch` loaded npusim: BackendConflictError naming the way out."""
    result = _python("""
        import importlib.util, torch
        assert importlib.util.find_spec("torch_npu") is not None  # probes (accelerate's) still work
        try:
            import torch_npu
        except Exception as err:  # accelerate's is_npu_available catches this and reports no NPU
            print(type(err).__name__, torch._C._get_privateuse1_backend_name(), torch.npu.__name__)
        import torch_npu
    """, PYTHONPATH=str(real_torch_npu))
    assert result.returncode != 0 and result.stdout.strip() == "BackendConflictError npu npusim.runtime.npu"
    assert "torch_npu (" in result.stderr and "cannot be imported: npusim's simulated npu already owns" in result.stderr
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stderr


def test_both_backends_autoloaded_fail_import_torch_clearly(autoloading_torch_npu):
    """torch_npu and npusim both installed: `import torch` fails naming the conflict and the switch that avoids it."""
    result = _python("import torch", PYTHONPATH=str(autoloading_torch_npu))
    assert result.returncode != 0
    assert "Failed to load the backend extension" in result.stderr
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stderr
    assert "BackendConflictError" in result.stderr and "torch_npu" in result.stderr


def test_real_torch_npu_first_then_npusim_is_refused(real_torch_npu):
    """With autoload off, `import torch_npu` then `import npusim` raises BackendConflictError (torch_npu owns it)."""
    result = _python("import torch_npu, npusim", PYTHONPATH=str(real_torch_npu), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert result.returncode != 0
    assert "BackendConflictError" in result.stderr
    assert "torch_npu (a real NPU backend) is already loaded" in result.stderr
