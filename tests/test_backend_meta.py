"""Backend metadata of npu tensors: named integer fields kept through PyTorch's PrivateUse1
serialization hooks, shallow copies, an explicit copy and fake tensors."""

from __future__ import annotations

import io

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

import npusim  # noqa: F401
from npusim.runtime import backend_meta

TAG = 29


def _saved_and_loaded(obj: object, **load_kwargs: object) -> object:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_fields_are_the_tensor_metadata_torch_serializes():
    """Fields set on an npu tensor are what torch._utils.get_tensor_metadata reports, and
    set_tensor_metadata sets them back; keys that are not npusim fields are ignored."""
    t = torch.empty(3, 3, device="npu")
    assert torch._utils.get_tensor_metadata(t) == {} and backend_meta.get(t).get("tag") is None
    backend_meta.set_field(t, "tag", TAG)
    backend_meta.set_field(t, "version", 2)
    assert backend_meta.get(t) == {"tag": TAG, "version": 2} and backend_meta.get(t).get("tag") == TAG
    metadata = torch._utils.get_tensor_metadata(t)
    assert metadata == {"npusim/tag/29": True, "npusim/version/2": True}
    u = torch.empty(2, device="npu")
    torch._utils.set_tensor_metadata(u, {**metadata, "npu_format_/NCHW": True, "npusim/bad/x1": True})
    assert backend_meta.get(u) == {"tag": TAG, "version": 2}
    backend_meta.clear(u, "version")
    assert backend_meta.get(u) == {"tag": TAG}
    backend_meta.clear(u)
    assert backend_meta.get(u) == {} and torch._utils.get_tensor_metadata(u) == {}


def test_save_and_load_keep_the_fields():
    """torch.save / torch.load keep the fields of npu tensors (onto the same or another npu); loading
    onto the CPU drops them with the device."""
    t = torch.arange(6.0, device="npu").reshape(2, 3)
    backend_meta.set_field(t, "tag", TAG)
    plain = torch.ones(2, device="npu")
    loaded = _saved_and_loaded({"t": t, "plain": plain})
    assert loaded["t"].device.type == "npu" and backend_meta.get(loaded["t"]) == {"tag": TAG}
    assert torch.equal(loaded["t"].cpu(), t.cpu()) and backend_meta.get(loaded["plain"]) == {}
    moved = _saved_and_loaded(t, map_location="npu:1")
    assert moved.device == torch.device("npu", 1) and backend_meta.get(moved).get("tag") == TAG
    on_cpu = _saved_and_loaded(t, map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch._utils.get_tensor_metadata(on_cpu) == {}


def test_shallow_copies_carry_their_own_copy_and_copy_copies():
    """detach() and .data carry the fields, each its own copy; backend_meta.copy gives a tensor
    exactly another's fields; views and op results start without any."""
    t = torch.ones(4, device="npu", requires_grad=True)
    backend_meta.set_field(t, "tag", TAG)
    d, data = t.detach(), t.data
    assert backend_meta.get(d).get("tag") == TAG and backend_meta.get(data).get("tag") == TAG
    backend_meta.set_field(d, "tag", 2)
    assert backend_meta.get(t).get("tag") == TAG and backend_meta.get(data).get("tag") == TAG
    other = torch.zeros(4, device="npu")
    backend_meta.set_field(other, "stale", 1)
    backend_meta.copy(t, other)
    assert backend_meta.get(other) == {"tag": TAG}
    assert backend_meta.get(t[1:]) == {} and backend_meta.get(t * 2) == {}


def test_fake_tensors_carry_the_fields():
    """FakeTensorMode.from_tensor gives the fake of an npu tensor its fields, also through a
    FunctionalTensor (whose inner tensor holds them), and torch.save of a fake tensor saves them."""
    t = torch.empty(3, 3, device="npu")
    backend_meta.set_field(t, "tag", TAG)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(t)
    assert isinstance(fake, FakeTensor) and fake.device.type == "npu"
    assert backend_meta.get(fake) == {"tag": TAG}
    assert torch._utils.get_tensor_metadata(fake) == {"npusim/tag/29": True}
    with FunctionalTensorMode():
        functional = FunctionalTensor.to_functional(t)
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(functional)
    assert isinstance(fake, FakeTensor) and backend_meta.get(fake) == {"tag": TAG}


def test_bad_fields_and_devices_are_refused():
    """A field name with '/' or an empty one, a value that is not an int, and a CPU tensor are
    refused with errors naming what was expected."""
    t = torch.empty(1, device="npu")
    with pytest.raises(ValueError, match="field name is non-empty and has no '/', got 'a/b'"):
        backend_meta.set_field(t, "a/b", 1)
    with pytest.raises(TypeError, match="field 'fmt' takes an int, got float"):
        backend_meta.set_field(t, "fmt", 1.5)
    with pytest.raises(TypeError, match="takes an int, got bool"):
        backend_meta.set_field(t, "fmt", True)
    with pytest.raises(RuntimeError, match="backend_meta: backend metadata is kept on npu tensors only, got a "
                                           "tensor on cpu"):
        backend_meta.set_field(torch.empty(1), "tag", TAG)
    assert backend_meta.get(t) == {}
