"""The enhancement layer's private FSDP2 names: each one checked at import, each accessor tested."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from npusim.distributed.fsdp import fsdp_private as private
from npusim.tools.audit import format_report


@pytest.fixture
def sharded() -> nn.Module:
    """A two-layer model under PyTorch's fully_shard on a one-rank npu process group."""
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("npu", 0))
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to("npu")
        fully_shard(model[0])
        fully_shard(model[1])
        fully_shard(model)
        yield model
    finally:
        dist.destroy_process_group()


def test_every_private_name_exists_in_this_torch():
    """check() passes on the pinned torch and every used name is present."""
    private.check()
    assert all(private._present(p) for p in private.USED)
    assert {f"{p.owner}.{p.name}" for p in private.WRITTEN} == {
        "FSDPState._training_state", "FSDPState._states_to_forward_prefetch"}


def test_a_missing_name_raises_naming_it_and_the_torch_version(monkeypatch):
    """A renamed private attribute gives FSDPPrivateAPIError with the name and the torch version."""
    renamed = private.PrivateName("FSDPState", "_states_to_forward_prefetch_renamed", "read/write")
    monkeypatch.setattr(private, "USED", (*private.USED, renamed))
    with pytest.raises(private.FSDPPrivateAPIError) as info:
        private.check()
    assert f"torch {torch.__version__} does not have: FSDPState._states_to_forward_prefetch_renamed" in str(info.value)


def test_accessors_read_and_write_fsdp_state(sharded):
    """training_state / set_training_state / forward prefetch states / post-backward groups act on FSDPState."""
    inner = sharded[0]
    assert private.training_state(inner) == private.TrainingState.IDLE
    private.set_training_state(inner, private.TrainingState.PRE_BACKWARD)
    assert private.fsdp_state(inner)._training_state == private.TrainingState.PRE_BACKWARD
    private.set_training_state(inner, private.TrainingState.IDLE)
    assert not private.any_group_in_post_backward(inner)
    inner.set_modules_to_forward_prefetch([sharded[1]])
    states = private.forward_prefetch_states(inner)
    assert states == [sharded[1]._get_fsdp_state()]
    inner.set_modules_to_forward_prefetch([])
    private.restore_forward_prefetch_states(inner, states)
    assert private.forward_prefetch_states(inner) == states


def test_in_backward_and_storage_use_count():
    """in_backward is True only inside backward; storage_use_count counts the storage's holders."""
    seen = []
    x = torch.ones(3, device="npu", requires_grad=True)
    x.register_hook(lambda g: seen.append(private.in_backward()) or g)
    (x * 2).sum().backward()
    assert seen == [True] and not private.in_backward()
    t = torch.ones(4, device="npu")
    before = private.storage_use_count(t)
    view = t[1:]
    assert private.storage_use_count(t) == before + 1
    del view


def test_audit_report_lists_the_private_state_written():
    """The audit's text and JSON name what the enhancement layer writes."""
    from npusim.distributed.audit import audit_fsdp

    report = audit_fsdp()
    assert report.private_state_written == ("FSDPState._training_state", "FSDPState._states_to_forward_prefetch")
    assert "FSDPState._states_to_forward_prefetch" in format_report(report)
    assert report.to_dict()["private_state_written"] == list(report.private_state_written)
