"""Conjugate and negative views copy to, from and within the npu as on CPU, and the
torch.fft functions that build such views run."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import npusim  # noqa: F401


def _z() -> torch.Tensor:
    return torch.randn(5, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))


def test_conj_view_to_cpu():
    """z.conj().cpu() materialises the conjugate (it used to recurse until the stack overflowed)."""
    z = _z()
    out = z.npu().conj().cpu()
    assert_close(out.resolve_conj(), z.conj())


def test_neg_view_to_cpu():
    """A negative view (conj of an imaginary view) copies out with its sign."""
    z = _z()
    view = z.npu().conj().imag
    assert view.is_neg()
    assert_close(view.cpu(), -z.imag)


def test_copy_into_cpu_conj_view_writes_through():
    """d.conj().copy_(npu_z) writes conj(z) into d, as CPU's copy_ does."""
    z = _z()
    d = torch.zeros(5, dtype=torch.complex64)
    d.conj().copy_(z.npu())
    assert_close(d, z.conj())
    e = torch.zeros(5, dtype=torch.complex64)
    e.conj().copy_(z)
    assert_close(d, e)


def test_copy_into_npu_conj_view_writes_through():
    """The same into an npu destination, from CPU and from npu."""
    z = _z()
    for src in (z, z.npu()):
        d = torch.zeros(5, dtype=torch.complex64, device="npu")
        d.conj().copy_(src)
        assert_close(d.cpu(), z.conj())


def test_conj_view_compute():
    """Compute on a conj view (resolved by PyTorch's Conjugate fallback) gives CPU's values."""
    z = _z()
    assert_close((z.npu().conj() * 2).cpu(), z.conj() * 2)
    assert_close(z.npu().conj().resolve_conj().cpu(), z.conj())


@pytest.mark.parametrize("name", ["fft", "ifft", "hfft", "ihfft", "hfft2", "hfftn", "irfft", "ifftn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_fft_matches_cpu(name, dtype):
    """torch.fft functions (several build conj views) give CPU's values on npu."""
    fn = getattr(torch.fft, name)
    x = torch.randn(4, 6, dtype=dtype, generator=torch.Generator().manual_seed(1))
    try:
        expected = fn(x)
    except RuntimeError as err:  # the dtype is not accepted: npu must say the same
        with pytest.raises(RuntimeError, match=str(err).split("\n")[0][:40]):
            fn(x.npu())
        return
    out = fn(x.npu())
    assert out.device.type == "npu"
    assert_close(out.cpu(), expected)
