"""a.set_(b) on npu shares b's storage, offset, sizes and strides, as FSDP1 needs."""

from __future__ import annotations

import pytest
import torch

import npusim  # noqa: F401


def test_set_source_tensor_shares_storage():
    """After a.set_(b), a reads and writes b's memory."""
    a = torch.zeros(2, device="npu")
    b = torch.arange(10.0, device="npu")
    a.set_(b)
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert a.shape == (10,) and a.cpu().tolist() == list(range(10))
    a[3] = -1.0
    assert b[3].item() == -1.0


def test_set_source_tensor_keeps_view_geometry():
    """A strided view with an offset is adopted with its offset, sizes and strides."""
    base = torch.arange(12.0, device="npu")
    view = base.view(3, 4)[1:, ::2]
    a = torch.empty(0, device="npu")
    a.set_(view)
    assert (a.storage_offset(), a.shape, a.stride()) == (view.storage_offset(), view.shape, view.stride())
    assert a.cpu().tolist() == view.cpu().tolist()


def test_set_source_tensor_rejects_other_dtype_or_device():
    """Another dtype or a CPU source raises naming both, and a keeps its storage."""
    a = torch.zeros(2, device="npu")
    ptr = a.untyped_storage().data_ptr()
    with pytest.raises(RuntimeError, match="(?i)set.*type double.*type float"):
        a.set_(torch.zeros(2, dtype=torch.float64, device="npu"))
    with pytest.raises(RuntimeError, match="npu:0.*cpu"):
        a.set_(torch.zeros(2))
    assert a.untyped_storage().data_ptr() == ptr and a.shape == (2,)
