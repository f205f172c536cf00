"""The npu device itself: registration, tensors, the review's own test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

import npusim


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_tensor_creation_and_compute_match_cpu():
    """Factories, views and compute ops on npu give CPU's values."""
    torch.manual_seed(3)
    a = torch.randn(6, 5)
    b = torch.randn(5, 4)
    an, bn = a.to("npu"), b.to("npu")
    assert an.device == torch.device("npu", 0)
    torch.testing.assert_close((an @ bn).cpu(), a @ b)
    torch.testing.assert_close(an.t().contiguous().cpu(), a.t().contiguous())
    torch.testing.assert_close(an[1:4, ::2].sum(dim=0).cpu(), a[1:4, ::2].sum(dim=0))
    assert torch.equal(torch.arange(7, device="npu").cpu(), torch.arange(7))
    assert torch.full((2, 2), 3.5, device="npu").cpu().eq(3.5).all()
    assert torch.zeros(3, device="npu").add_(2).sum().item() == 6.0


def test_out_variant_resize_moves_to_device():
    """An out= op that must grow its output leaves the result in npu memory, accounted."""
    out = torch.empty(0, device="npu")
    before = torch.npu.memory_allocated()
    torch.add(torch.ones(1000, device="npu"), 1, out=out)
    assert out.shape == (1000,) and out.device.type == "npu"
    assert out.cpu().eq(2).all()
    assert torch.npu.memory_allocated() >= before + 4000


def test_random_ops_follow_npu_seed():
    """torch.npu.manual_seed makes npu random ops reproducible; rng state round-trips."""
    torch.npu.manual_seed(1234)
    first = torch.randn(8, device="npu").cpu()
    torch.npu.manual_seed(1234)
    state = torch.npu.get_rng_state()
    second = torch.randn(8, device="npu").cpu()
    third = torch.randn(8, device="npu").cpu()
    torch.npu.set_rng_state(state)
    again = torch.randn(8, device="npu").cpu()
    assert torch.equal(first, second) and torch.equal(second, again) and not torch.equal(second, third)


def test_module_surface():
    """torch.npu offers what PyTorch's device-generic code asks of a device module."""
    assert torch.npu.is_available() and torch.npu.is_initialized()
    assert torch.npu.device_count() == 8  # one Atlas training node
    assert torch.accelerator.current_accelerator() == torch.device("npu")
    assert torch.accelerator.device_count() == 8
    assert torch.float16 in torch.npu.get_amp_supported_dtype()
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.randn(2, device="npu").is_npu


def test_pinned_memory():
    """pin_memory()/is_pinned() work for the npu device."""
    pageable = torch.randn(16)
    pinned = pageable.pin_memory()
    assert pinned.is_pinned() and not pageable.is_pinned()
    assert torch.equal(pinned, pageable)
    assert torch.npu.memory_allocated() >= 0


def test_second_backend_on_privateuse1_is_refused():
    """Importing npusim when another backend owns PrivateUse1 fails with a clear message."""
    # Autoload off: otherwise `import torch` has already given PrivateUse1 to npusim (tests/test_autoload.py).
    result = run_python("""
        import torch
        torch.utils.rename_privateuse1_backend("otherdev")
        import npusim
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode != 0
    assert "BackendConflictError" in result.stderr and "'otherdev'" in result.stderr


def test_fresh_process_import_and_tensor():
    """`import npusim` then torch.randn(4, device="npu") works in a fresh process."""
    result = run_python("""
        import torch, npusim
        x = torch.randn(4, device="npu")
        print(x.device, x.cpu().shape)
    """)
    assert result.returncode == 0, result.stderr
    assert "npu:0 torch.Size([4])" in result.stdout


def test_device_count_from_environment():
    """NPUSIM_DEVICE_COUNT sets the number of simulated devices."""
    result = run_python("import torch, npusim; print(torch.npu.device_count())", env={"NPUSIM_DEVICE_COUNT": "4"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4"


def test_invalid_device_index_error():
    """A device index past device_count names the operation and the valid range."""
    try:
        torch.empty(2, device="npu:9")
    except RuntimeError as err:
        assert "invalid npu device index 9" in str(err) and "device_count() = 8" in str(err)
    else:
        raise AssertionError("expected an error for npu:9")
    assert npusim.get_profile().name == "training_soc"


def test_losses_and_norms_run_cpu_kernels_without_warnings():
    """mse_loss and layer_norm on npu match CPU and raise no warning (no composite detour)."""
    import warnings

    torch.manual_seed(5)
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    w, b = torch.randn(8), torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for reduction in ("mean", "sum", "none"):
            got = torch.nn.functional.mse_loss(x.to("npu"), y.to("npu"), reduction=reduction)
            torch.testing.assert_close(got.cpu(), torch.nn.functional.mse_loss(x, y, reduction=reduction))
        got = torch.nn.functional.layer_norm(x.to("npu"), (8,), w.to("npu"), b.to("npu"))
        torch.testing.assert_close(got.cpu(), torch.nn.functional.layer_norm(x, (8,), w, b))
