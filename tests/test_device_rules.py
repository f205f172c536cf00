"""CUDA's device rules on npu ops: one npu per op, CPU 0-dim scalars and CPU indices
accepted, anything else raises CUDA's error before anything is written."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812  (the usual name)

import npusim  # noqa: F401

MIXED = "Expected all tensors to be on the same device, but found at least two devices"


def test_model_on_npu_with_cpu_input_raises():
    """The most common mistake (input left on CPU) raises CUDA's error instead of crashing."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU()).to("npu")
    with pytest.raises(RuntimeError, match=MIXED) as err:
        model(torch.randn(8, 16))
    assert "npu:0" in str(err.value) and "cpu" in str(err.value)


@pytest.mark.parametrize("call", [
    lambda a, b: torch.mm(a, b.npu()),
    lambda a, b: torch.mm(a.npu(), b),
    lambda a, b: F.linear(a, b.npu(), torch.zeros(4, device="npu")),
    lambda a, b: torch.cat([a.npu(), b]),
    lambda a, b: a.npu().add_(b),
], ids=["mm-cpu-npu", "mm-npu-cpu", "linear", "cat", "add_"])
def test_cpu_tensor_in_npu_op_raises(call):
    """A CPU tensor with dimensions in an npu op raises, naming both devices, CPU first when it comes first."""
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(RuntimeError, match=MIXED):
        call(a, b)


def test_error_names_devices_in_argument_order():
    """As CUDA: the first tensor's device first, then the one that differs."""
    with pytest.raises(RuntimeError, match=f"{MIXED}, cpu and npu:0!"):
        torch.mm(torch.randn(2, 2), torch.randn(2, 2, device="npu"))
    with pytest.raises(RuntimeError, match=f"{MIXED}, npu:0 and cpu!"):
        torch.mm(torch.randn(2, 2, device="npu"), torch.randn(2, 2))


def test_out_on_cpu_is_rejected_before_writing():
    """mm(npu, cpu, out=cpu_c) raises and leaves the caller's tensor and its memory untouched."""
    c = torch.full((3, 3), 7.0)
    ptr = c.data_ptr()
    with pytest.raises(RuntimeError, match=MIXED):
        torch.mm(torch.randn(3, 3, device="npu"), torch.randn(3, 3, device="npu"), out=c)
    with pytest.raises(RuntimeError, match=MIXED):
        torch.mm(torch.randn(3, 3, device="npu"), torch.randn(3, 3), out=c)
    assert c.data_ptr() == ptr and c.eq(7.0).all()


def test_cpu_scalar_out_is_rejected():
    """A written-to CPU 0-dim tensor is not a scalar input: CUDA rejects it too."""
    s = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match=MIXED):
        torch.sum(torch.ones(3, device="npu"), dim=0, out=s)
    assert s.item() == 1.0


def test_cpu_zero_dim_scalars_are_accepted():
    """npu_t * torch.tensor(2.0) works as on CUDA, and the CPU scalar keeps its memory."""
    two = torch.tensor(2.0)
    ptr = two.data_ptr()
    out = torch.arange(3.0, device="npu") * two
    assert out.device.type == "npu"
    assert out.cpu().tolist() == [0.0, 2.0, 4.0]
    assert two.data_ptr() == ptr and two.item() == 2.0
    w = torch.where(torch.tensor([True, False], device="npu"), torch.ones(2, device="npu"), torch.tensor(5.0))
    assert w.cpu().tolist() == [1.0, 5.0]


def test_cpu_indices_are_accepted():
    """Indexing an npu tensor with CPU indices works, as CUDA moves them."""
    x = torch.arange(5.0, device="npu")
    assert x[torch.tensor([4, 0])].cpu().tolist() == [4.0, 0.0]
    x[torch.tensor([1])] = torch.tensor(9.0)
    assert x.cpu().tolist() == [0.0, 9.0, 2.0, 3.0, 4.0]


def test_cpu_masks_of_one_shape_size_each_result_by_their_values():
    """x[cpu_mask] has one row per true element: two masks of the same shape and dtype give results of different
    sizes. The output-metadata cache recorded host tensors by shape only, so the second call reused the first
    mask's plan and failed on the stream (found by the conformance sweep's index_put backward, issue 39)."""
    x = torch.arange(25.0, device="npu").reshape(5, 5)
    for mask in ([True, False, True, True, False], [False] * 5, [False, True, False, False, False]):
        cpu_mask = torch.tensor(mask)
        assert torch.equal(x[cpu_mask].cpu(), x.cpu()[cpu_mask])
        y = x.clone()
        y[cpu_mask] = -1.0
        expected = x.cpu().clone()
        expected[cpu_mask] = -1.0
        assert torch.equal(y.cpu(), expected)
    torch.npu.synchronize()


def test_two_npus_in_one_op_raise():
    """npu:0 and npu:1 in one op raise the same error, naming both."""
    if torch.npu.device_count() < 2:
        pytest.skip("needs two npu devices (NPUSIM_DEVICE_COUNT >= 2)")
    with pytest.raises(RuntimeError, match=f"{MIXED}, npu:0 and npu:1!"):
        torch.ones(2, device="npu:0") + torch.ones(2, device="npu:1")
