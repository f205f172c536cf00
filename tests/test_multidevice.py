"""Several devices per process: set_device, guards, cross-device copies."""

from __future__ import annotations

import torch

import npusim

MIB = 1 << 20


def test_set_device_and_device_context():
    """set_device and the device context pick where tensors are created."""
    torch.npu.set_device(1)
    assert torch.npu.current_device() == 1
    assert torch.empty(1, device="npu").device == torch.device("npu", 1)
    with torch.npu.device(0):
        assert torch.empty(1, device="npu").device == torch.device("npu", 0)
    assert torch.npu.current_device() == 1


def test_cross_device_copy_is_stream_ordered_on_both_devices():
    """npu:0 -> npu:1 copies wait for dst's stream and are visible to dst's later work."""
    src = torch.full((MIB,), 6.0, device="npu:0")
    mid = torch.zeros(MIB, device="npu:1")
    with npusim.timing.model(copy_gbps=0.05, link_gbps=0.05, realtime=True):
        mid.copy_(src)
        out = torch.zeros(MIB, device="npu:1")
        with torch.npu.device(1):
            out.copy_(mid)  # npu:1's stream waits for the cross-device copy
        torch.npu.synchronize(1)
    assert out.cpu().eq(6.0).all()


def test_ops_across_devices_are_rejected():
    """A compute op mixing npu:0 and npu:1 raises the usual same-device error."""
    a = torch.ones(2, device="npu:0")
    b = torch.ones(2, device="npu:1")
    try:
        a + b
    except RuntimeError as err:
        assert "Expected all tensors to be on the same device" in str(err) and "npu:1" in str(err)
    else:
        raise AssertionError("expected a device mismatch error")


def test_streams_are_per_device():
    """Each device has its own default stream and current stream."""
    s1 = torch.npu.Stream(device=1)
    with torch.npu.stream(s1):
        assert torch.npu.current_device() == 1
        assert torch.npu.current_stream(1) == s1
        assert torch.npu.current_stream(0) == torch.npu.default_stream(0)
    assert torch.npu.current_stream(1) == torch.npu.default_stream(1)
