"""DTensor random ops and FSDP2 meta-device initialisation on npu meshes.

DTensor's OffsetBasedRNGTracker gives each shard the npu generator's state at
offset start + (shard index * local numel) and leaves every rank at start +
numel (rounded to 4). With the npu Philox stream (Note [npu Philox stream]),
a Shard(0) DTensor's random values therefore equal the slice of the unsharded
tensor drawn with the same seed, and the generator ends where the unsharded
op leaves it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812
from torch.testing import assert_close

from npusim.testing.ranks import run_ranks

SHAPE = (8, 12)  # local shards of 2x12 .. 4x12 elements: multiples of 4, as the tracker's rounding needs

OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "uniform_": lambda t: t.uniform_(-1, 1),
    "normal_": lambda t: t.normal_(0, 2),
    "dropout": lambda t: F.dropout(t, 0.4, training=True),
    "bernoulli_": lambda t: t.bernoulli_(0.3),
}


# (placements, None when the full tensor must equal the unsharded one, else the (row, column) block
# grid of its shards). Shards that are not one contiguous run of the flat tensor (a Shard(1), or
# Shard(0) twice, where 2.13's tracker sizes the shards by the first mesh dim only) get distinct
# blocks of the stream, not the unsharded values: DTensor's own behaviour, the same on CUDA.
Case = tuple[list[str], tuple[int, int] | None]


def _sharded_equals_unsharded(rank: int, mesh_shape: tuple[int, ...], cases: list[Case]) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    device = torch.device("npu", rank)
    mesh = init_device_mesh("npu", mesh_shape)
    make = {"S0": lambda: Shard(0), "S1": lambda: Shard(1), "R": Replicate}
    checked = 0
    for names, blocks in cases:
        placements = [make[n]() for n in names]
        for op_name, op in OPS.items():
            what = f"{op_name} on mesh {mesh_shape} {names}"
            torch.manual_seed(7)
            torch.rand(3, device=device)  # start at a non-zero offset
            expected = op(torch.ones(SHAPE, device=device)).cpu()
            expected_state = torch.npu.get_rng_state()
            torch.manual_seed(7)
            torch.rand(3, device=device)
            dtensor = op(distribute_tensor(torch.ones(SHAPE, device=device), mesh, placements))
            assert torch.equal(torch.npu.get_rng_state(), expected_state), f"{what}: offset after the op"
            full = dtensor.full_tensor().cpu()
            if blocks is None:
                assert torch.equal(full, expected), f"{what}: sharded result differs from the unsharded one"
            else:
                parts = [b for rows in full.chunk(blocks[0], 0) for b in rows.chunk(blocks[1], 1)]
                for i, a in enumerate(parts):
                    assert all(not torch.equal(a, b) for b in parts[i + 1:]), f"{what}: two shards drew alike"
            checked += 1
    return checked


def _one_d_job(rank: int, world: int) -> int:
    return _sharded_equals_unsharded(rank, (world,), [(["S0"], None), (["R"], None), (["S1"], (1, world))])


def _two_d_job(rank: int, world: int) -> int:
    cases: list[Case] = [(["S0", "R"], None), (["R", "S0"], None), (["S0", "S0"], (4, 1)), (["S0", "S1"], (2, 2))]
    return _sharded_equals_unsharded(rank, (2, world // 2), cases)


def _two_rank_job(rank: int, world: int) -> tuple[int, list[float]]:
    return _one_d_job(rank, world), _fsdp_meta_init_job(rank, world)


@pytest.fixture(scope="module")
def two_rank_results() -> list[tuple[int, list[float]]]:
    """One 2-rank run for the 1-D mesh and the FSDP2 checks (rank start-up dominates their cost)."""
    return run_ranks(_two_rank_job, timeout=180)


def test_dtensor_random_ops_on_a_1d_mesh_equal_the_unsharded_result(two_rank_results):
    """uniform_/normal_/dropout/bernoulli_ on Shard(0) and Replicate DTensors equal the unsharded tensor
    drawn with the same seed and leave the generator where the unsharded op does; Shard(1) shards differ."""
    assert [checked for checked, _ in two_rank_results] == [12, 12]


def test_dtensor_random_ops_on_a_2d_mesh_equal_the_unsharded_result():
    """The same on a 2x2 mesh of 4 ranks: (Shard(0), Replicate()) and (Replicate(), Shard(0)) equal the
    unsharded tensor; (Shard(0), Shard(0)) and (Shard(0), Shard(1)) give four distinct shards."""
    assert run_ranks(_two_d_job, world_size=4, timeout=150, env={"NPUSIM_DEVICE_COUNT": "4"}) == [16] * 4


# ---- FSDP2: meta device -> fully_shard -> to_empty -> random init -> train ----------------

def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))


def _init(model: nn.Module) -> None:
    """reset_parameters() of every layer, then a truncated normal for one weight (the call that
    used to stop with an AssertionError in DTensor's _random.py)."""
    torch.manual_seed(0)  # reaches every npu device, as on CUDA
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.reset_parameters()
    nn.init.trunc_normal_(model[2].weight, std=0.05)


def _fsdp_meta_init_job(rank: int, world: int) -> list[float]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    device = torch.device("npu", rank)
    with torch.device("meta"):
        model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=device)
    _init(model)
    # The reference: the same model unsharded on this rank's npu, initialised by the same calls
    # from the same seed. Each call draws numel (rounded to 4) from the Philox stream either way,
    # so the initial values are equal bit for bit.
    ref = _model().to(device)
    _init(ref)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert isinstance(p, DTensor) and p.device == device, f"{name}: {type(p).__name__} on {p.device}"
        assert torch.equal(p.full_tensor(), q.detach()), f"{name}: sharded init differs from the unsharded one"
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    x = torch.randn(world, 4, 16, generator=torch.Generator().manual_seed(1))  # one batch: the loss must fall
    losses = []
    for step in range(3):
        loss = (model(x[rank].to(device)) - x[rank].to(device).flip(-1)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        # The reference sees every rank's batch: FSDP2 averages the ranks' mean-loss gradients.
        full = x.flatten(0, 1).to(device)
        ref_loss = (ref(full) - full.flip(-1)).square().mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_close(p.full_tensor().cpu(), q.detach().cpu(), msg=lambda m, n=name, s=step: f"step {s}, {n}: {m}")
        losses.append(ref_loss.item())
    return losses


def test_fsdp2_meta_device_init_trains_like_the_unsharded_reference(two_rank_results):
    """meta -> fully_shard -> to_empty("npu") -> reset_parameters/trunc_normal_ gives the unsharded
    model's initial values exactly; three SGD steps then match it (checked in the ranks)."""
    losses = [rank_losses for _, rank_losses in two_rank_results]
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0]
