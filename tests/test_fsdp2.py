"""PyTorch's own FSDP2 (``fully_shard``, unpatched) trains on the npu over the npusim
backend and matches a single-process CPU reference step by step."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.functional import cross_entropy, mse_loss
from torch.testing import assert_close
from torch.testing._internal.common_fsdp import MLP

import npusim
from npusim.testing.ranks import run_ranks

NPU = "npu"
STEPS = 3
BATCH = 4  # per rank and micro-batch


class Config(NamedTuple):
    name: str
    reshard_after_forward: bool | int = True
    prefetch: bool = False  # explicit forward and backward prefetch
    mixed_precision: bool = False  # bf16 parameters, fp32 gradient reduction
    micro_batches: int = 1  # > 1: accumulate without gradient sync, sync on the last
    clip: float | None = None  # clip_grad_norm_ on the DTensor gradients
    comm_alloc: bool = False  # comm buffers from the backend's allocate_tensor


def _mlp() -> nn.Module:
    return nn.Sequential(MLP(16), MLP(16, dim_multiplier=3), MLP(16))


def _mlp_inputs(gen: torch.Generator, world: int, micro: int) -> torch.Tensor:
    return torch.randn(micro, world, BATCH, 16, generator=gen)


def _transformer() -> nn.Module:
    # Imported here: at import it looks up the accelerator's (npu) default
    # backend, which npusim.distributed registers in the ranks.
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    # No dropout so that the reference is deterministic; tied embedding and
    # output weights, and activation checkpointing of every block.
    return Transformer(ModelArgs(n_layers=2, dropout_p=0.0, checkpoint_activations=True))


def _transformer_inputs(gen: torch.Generator, world: int, micro: int) -> torch.Tensor:
    return torch.randint(0, 8, (micro, world, BATCH, 16), generator=gen)


def _loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A loss that cannot reach zero, so gradients stay informative every step."""
    if x.is_floating_point():  # MLP: regress onto the reversed input
        return mse_loss(out.float(), x.float().flip(-1))
    return cross_entropy(out.flatten(0, 1).float(), x.flatten())  # Transformer: predict the tokens


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    # SGD, not Adam: Adam's update barely depends on the gradient's scale, so
    # it would hide a wrong average (SUM for AVG).
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)


def _shard(model: nn.Module, cfg: Config) -> FSDPModule:
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cfg.mixed_precision \
        else MixedPrecisionPolicy()
    blocks = list(model.layers) if hasattr(model, "layers") else list(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=cfg.reshard_after_forward, mp_policy=mp)
    fully_shard(model, reshard_after_forward=cfg.reshard_after_forward, mp_policy=mp)
    if cfg.prefetch:
        for prev, nxt in zip(blocks, blocks[1:], strict=False):
            prev.set_modules_to_forward_prefetch([nxt])
            nxt.set_modules_to_backward_prefetch([prev])
    if cfg.comm_alloc:
        model.set_allocate_memory_from_process_group_for_comm(True)
    return model


def _reference_step(ref: nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor, cfg: Config,
                    world: int) -> torch.Tensor:
    """One step as FSDP computes it, in one process: each rank's gradient in the
    compute dtype (accumulated over micro-batches), averaged in fp32. Returns the
    losses, [micro, rank]."""
    compute = copy.deepcopy(ref).to(torch.bfloat16) if cfg.mixed_precision else ref
    losses = torch.empty(inputs.shape[:2])
    total: list[torch.Tensor] | None = None
    for r in range(world):
        compute.zero_grad(set_to_none=True)
        for m in range(inputs.shape[0]):
            x = inputs[m, r]
            loss = _loss(compute(x.to(torch.bfloat16) if cfg.mixed_precision and x.is_floating_point() else x), x)
            loss.backward()
            losses[m, r] = loss.detach().float()
        grads = [p.grad.float() for p in compute.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
    for p, g in zip(ref.parameters(), total, strict=True):
        p.grad = g / world
    if cfg.clip is not None:
        torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return losses


def _fsdp_step(model: FSDPModule, opt: torch.optim.Optimizer, inputs: torch.Tensor, cfg: Config,
               rank: int) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    losses = []
    for m in range(inputs.shape[0]):
        model.set_requires_gradient_sync(m == inputs.shape[0] - 1)
        x = inputs[m, rank].to(NPU)
        loss = _loss(model(x), x)
        loss.backward()
        losses.append(loss.detach())
    norm = None
    if cfg.clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        assert isinstance(norm, DTensor), f"clip_grad_norm_ over DTensor grads should return a DTensor, got {norm!r}"
    opt.step()
    opt.zero_grad(set_to_none=True)
    return [loss.float().cpu() for loss in losses], norm


def _assert_params_equal(model: nn.Module, ref: nn.Module, what: str) -> None:
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert isinstance(p, DTensor) and p.device.type == NPU, f"{name}: expected an npu DTensor, got {type(p)}"
        assert_close(p.full_tensor().cpu(), q.detach(), msg=lambda m, name=name: f"{what}, {name}: {m}")


def _train(rank: int, world: int, cfg: Config, build: Callable[[], nn.Module],
           make_inputs: Callable[[torch.Generator, int, int], torch.Tensor]) -> tuple[FSDPModule, Any, nn.Module]:
    torch.manual_seed(0)
    ref = build()
    model = _shard(copy.deepcopy(ref), cfg)
    ref_opt = _optimizer(ref)
    opt = _optimizer(model)
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        inputs = make_inputs(gen, world, cfg.micro_batches)
        ref_losses = _reference_step(ref, ref_opt, inputs, cfg, world)
        losses, _ = _fsdp_step(model, opt, inputs, cfg, rank)
        what = f"{cfg.name}, step {step}"
        assert_close(torch.stack(losses), ref_losses[:, rank], msg=lambda m, what=what: f"{what} loss: {m}")
        _assert_params_equal(model, ref, what)
    return model, opt, ref


MLP_CONFIGS = [
    Config("reshard"),
    Config("no reshard", reshard_after_forward=False),
    Config("prefetch", prefetch=True, comm_alloc=True),
    Config("bf16 params, fp32 reduce", mixed_precision=True),
    Config("accumulate without sync", micro_batches=2),
    Config("clip", clip=0.05),
]


def _mlp_job(rank: int, world: int) -> dict[str, Any]:
    counts: dict[str, Any] = {}
    for cfg in MLP_CONFIGS:
        with npusim.ops.trace_foreach_copy() as calls:
            model, opt, ref = _train(rank, world, cfg, _mlp, _mlp_inputs)
        # all_gather_copy_in copies same-dtype shards into the all-gather
        # input: PyTorch's call (non_blocking=False) must reach the fast path.
        copy_in = [c for c in calls if c.groups[0].dtype == (torch.bfloat16 if cfg.mixed_precision else torch.float32)]
        counts[cfg.name] = ([c.routes for c in copy_in], [c.non_blocking for c in copy_in])
        if cfg.name == "reshard":
            _check_state_dict(rank, world, cfg, model, opt, ref)
    return counts


def _check_state_dict(rank: int, world: int, cfg: Config, model: FSDPModule, opt: torch.optim.Optimizer,
                      ref: nn.Module) -> None:
    # A full state dict offloaded to CPU is gathered on rank 0 only.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert set(full) == (set(ref.state_dict()) if rank == 0 else set())
    for name, value in full.items():
        assert_close(value, ref.state_dict()[name], msg=lambda m, name=name: f"full state dict, {name}: {m}")
    torch.manual_seed(123)  # different initial values, overwritten by the load
    other = _shard(_mlp(), cfg)
    other.load_state_dict(model.state_dict())
    other_opt = _optimizer(other)
    # A copy, as a saved checkpoint would be: load_state_dict keeps the given
    # state tensors, which opt.step() below updates in place.
    other_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    x = torch.randn(world, BATCH, 16, generator=torch.Generator().manual_seed(7))[rank].to(NPU)
    for m, o in ((model, opt), (other, other_opt)):
        _loss(m(x), x).backward()
        o.step()
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert_close(p.to_local().cpu(), q.to_local().cpu(), atol=0, rtol=0)


def test_fsdp2_mlp_matches_reference():
    """MLP: reshard True/False, explicit prefetch, bf16 params with fp32 reduce, accumulation
    without sync, clip_grad_norm_, backend-allocated comm buffers, state dict round trip;
    the all-gather copy-in takes the npu _foreach_copy_ fast path."""
    results = run_ranks(_mlp_job, timeout=150)
    for counts in results:
        for name, (routes, non_blocking) in counts.items():
            assert routes, f"{name}: no all-gather copy-in reached the npu _foreach_copy_"
            assert all(r == ("fast",) for r in routes), f"{name}: copy-in routes {routes}"
            assert not any(non_blocking), f"{name}: FSDP2 itself passes non_blocking=False"


def _transformer_job(rank: int, world: int) -> None:
    _train(rank, world, Config("transformer, activation checkpointing"), _transformer, _transformer_inputs)


def test_fsdp2_transformer_with_activation_checkpointing():
    """Transformer (tied embeddings, checkpointed blocks) trains like the reference."""
    run_ranks(_transformer_job, timeout=120)


def _reshard_to_int_job(rank: int, world: int) -> None:
    # 4 ranks resharding to groups of 2 after forward: a real sub-mesh.
    _train(rank, world, Config("reshard to 2", reshard_after_forward=2), _mlp, _mlp_inputs)


def test_fsdp2_reshard_after_forward_int():
    """reshard_after_forward=2 on 4 ranks (post-forward groups of 2) trains like the reference."""
    run_ranks(_reshard_to_int_job, world_size=4, timeout=150, env={"NPUSIM_DEVICE_COUNT": "4"})
