"""The historical collectives patch computes exactly what PyTorch's FSDP2 computes.

Only its ``non_blocking=True`` differs; these tests check both halves: same
values as upstream, and the patched copies really run with ``non_blocking=True``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives
from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

import _historical_patch_worker as worker
from npusim.distributed import historical_patch as hp
from npusim.testing.ranks import run_ranks

TIMEOUT_S = 240  # two ranks, two short trainings; a first run may also build the backend


@pytest.fixture
def foreach_copies(monkeypatch) -> list[bool]:
    """The ``non_blocking`` argument of every ``torch._foreach_copy_`` call, in order.

    Wraps the ``torch`` attribute that FSDP2 (and the patch) call; a torch
    function mode would miss calls made from inside a dispatcher kernel.
    """
    calls: list[bool] = []
    real = torch._foreach_copy_

    def recording(self, src, non_blocking=False):
        calls.append(bool(non_blocking))
        return real(self, src, non_blocking=non_blocking)

    monkeypatch.setattr(torch, "_foreach_copy_", recording)
    return calls


def fake_fsdp_params(device: str) -> list[SimpleNamespace]:
    """Stand-ins for FSDPParam with just what _get_param_all_gather_inputs reads."""
    gen = torch.Generator().manual_seed(0)

    def foreach_param(numel: int, state: ShardedState) -> SimpleNamespace:
        data = torch.randn(numel, generator=gen).to(device)
        return SimpleNamespace(
            param_dtype=torch.bfloat16, offload_to_cpu=False, _sharded_local_tensor=data, sharded_state=state,
            _sharded_param_data=data, _sharded_post_forward_param_data=data, device=torch.device(device))

    # param_dtype None: not the foreach path, FSDP asks the parameter itself.
    plain = SimpleNamespace(param_dtype=None, offload_to_cpu=False, _sharded_local_tensor=None,
                            all_gather_inputs=[torch.randn(5, generator=gen).to(device)])
    return [foreach_param(7, ShardedState.SHARDED), plain, foreach_param(3, ShardedState.SHARDED_POST_FORWARD),
            foreach_param(16, ShardedState.SHARDED)]


def as_cpu(nested: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    torch.npu.synchronize()
    return [[t.cpu() for t in ts] for ts in nested]


def test_not_applied_on_import():
    """Importing the module leaves PyTorch's FSDP2 untouched."""
    assert not hp.is_historical_patch_applied()
    assert _fsdp_collectives._get_param_all_gather_inputs.__wrapped__.__module__ == _fsdp_collectives.__name__
    assert FSDPParamGroup.finalize_backward.__module__ == FSDPParamGroup.__module__


def test_get_param_all_gather_inputs_matches_upstream(foreach_copies):
    """Same all-gather inputs (values, dtypes, split sizes) as upstream, with a non_blocking=True copy."""
    params = fake_fsdp_params("npu")
    upstream = _fsdp_collectives._get_param_all_gather_inputs
    expected = as_cpu(upstream(params))
    with hp.historical_patch():
        assert _fsdp_collectives._get_param_all_gather_inputs is not upstream
        got = as_cpu(_fsdp_collectives._get_param_all_gather_inputs(params))
    assert _fsdp_collectives._get_param_all_gather_inputs is upstream
    assert foreach_copies == [False, True]
    assert [[t.dtype for t in ts] for ts in got] == [[torch.bfloat16], [torch.float32], [torch.bfloat16],
                                                     [torch.bfloat16]]
    for exp, res in zip(expected, got, strict=True):
        assert all(torch.equal(e, r) for e, r in zip(exp, res, strict=True))


def test_get_param_all_gather_inputs_cross_device_keeps_default(foreach_copies):
    """Shards on the CPU with an npu target: the old patch kept the default non_blocking=False."""
    params = fake_fsdp_params("cpu")
    for p in params:
        p.device = torch.device("npu")
    expected = as_cpu(_fsdp_collectives._get_param_all_gather_inputs(params))
    with hp.historical_patch():
        got = as_cpu(_fsdp_collectives._get_param_all_gather_inputs(params))
    assert foreach_copies == [False, False]
    for exp, res in zip(expected, got, strict=True):
        assert all(torch.equal(e, r) for e, r in zip(exp, res, strict=True))


@pytest.mark.parametrize("rank", [0, 1])
def test_all_gather_copy_in_matches_upstream(rank, foreach_copies):
    """torch.ops.fsdp.all_gather_copy_in on npu: same slice and buffer as upstream, copy with non_blocking=True."""
    sizes = [7, 1, 24]
    inputs = [torch.randn(n).to("npu") for n in sizes]
    numel, world = sum(sizes), 2

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros(numel * world, device="npu")
        ag_input, ag_output = torch.ops.fsdp.all_gather_copy_in(inputs, out, sizes, numel, rank)
        assert ag_output.data_ptr() == out.data_ptr()  # same contract: the caller's buffer comes back
        assert ag_input.data_ptr() == out.data_ptr() + rank * numel * out.element_size()
        torch.npu.synchronize()
        return ag_input.cpu(), ag_output.cpu()

    exp_in, exp_out = call()
    with hp.historical_patch():
        got_in, got_out = call()
    assert foreach_copies == [False, True]
    assert torch.equal(got_in, exp_in) and torch.equal(got_out, exp_out)
    assert torch.equal(exp_in, torch.cat([t.cpu() for t in inputs]))


def test_remove_refuses_to_drop_a_later_patch():
    """If something patched a target after the historical patch, removal says so instead of discarding it."""
    hp.apply_historical_patch()
    later = _fsdp_collectives._get_param_all_gather_inputs
    try:
        _fsdp_collectives._get_param_all_gather_inputs = lambda params: later(params)
        with pytest.raises(RuntimeError, match="_get_param_all_gather_inputs"):
            hp.remove_historical_patch()
    finally:
        _fsdp_collectives._get_param_all_gather_inputs = later
        hp.remove_historical_patch()
    assert not hp.is_historical_patch_applied()


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_fsdp2_training_identical_with_patch(device):
    """World size 2: FSDP2 training gives bit-identical losses and parameters with the patch, which really ran."""
    result = run_ranks(worker.job, device, backend=worker.backend_for(device), bind_device=False,
                       timeout=TIMEOUT_S, name=f"historical patch on {device}")[0]
    assert result["upstream"]["losses"] == result["patched"]["losses"]
    assert result["upstream"]["params"] == result["patched"]["params"]
    # Upstream never forces non_blocking. The patch forces it in both copies of
    # each all-gather on npu; on the CPU only in the input cast, since its
    # all_gather_copy_in override is the PrivateUse1 kernel.
    upstream, patched = result["upstream"], result["patched"]
    assert upstream["copies"] > 0 and upstream["non_blocking_copies"] == 0
    assert patched["copies"] == upstream["copies"]
    assert patched["non_blocking_copies"] == (patched["copies"] if device == "npu" else patched["copies"] // 2)
    assert patched["finalize_calls"] > 0
