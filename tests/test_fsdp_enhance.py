"""FSDP2 enhancement layer (npusim.distributed.fsdp): same training results as PyTorch's
FSDP2, zero communication-buffer allocations per step with the cache, and no
redundant all-gather when checkpointed blocks are recomputed in backward.

Two ranks on the npu; each spawned job runs many configurations to keep the
number of process launches (the dominant cost) small.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import fully_shard as upstream_fully_shard

from _fsdp_enhance_model import TinyTransformer, batch, full_params, loss_fn
from npusim.testing.fsdp_harness import (
    CommCounter,
    CountingAllGather,
    CountingReduceScatter,
    Setup,
    all_sharded,
    shard,
)
from npusim.testing.ranks import run_ranks

STEPS = 4
WARMUP = 1  # steps before the cache holds every buffer a step needs

CONFIGS = {
    "off": Setup(),
    "cache": Setup(mem_cache=True),
    "rule": Setup(recompute_rule=True),
    "both": Setup(mem_cache=True, recompute_rule=True),
}


def train(rank: int, setup: Setup, model_kw: dict[str, Any], *, steps: int = STEPS,
          forwards_per_step: int = 1, eval_every_step: bool = False) -> dict[str, Any]:
    """Trains a fresh model; returns losses, final parameters, and per-step counts."""
    from npusim.distributed.fsdp import CommBufferCache

    device = torch.device("npu", rank)
    torch.manual_seed(0)
    model = TinyTransformer(**model_kw).to(device)
    cache = CommBufferCache()
    modules = shard(model, setup, cache)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    counter = CommCounter()
    CountingAllGather.allocations = CountingReduceScatter.allocations = 0
    losses: list[float] = []
    eval_out: list[torch.Tensor] = []
    per_step: list[dict[str, Any]] = []
    with counter.active():
        for step in range(steps):
            before = counter.snapshot()
            alloc_before = _allocations(cache)
            loss = sum(loss_fn(model(x), y) for x, y in (batch(step * 10 + i, rank, device)
                                                        for i in range(forwards_per_step)))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            resharded = all_sharded(modules)
            if eval_every_step:
                model.eval()
                with torch.no_grad():
                    eval_out.append(model(batch(999, rank, device)[0]).cpu())
                model.train()
                # The root keeps its parameters after forward (reshard_after_forward
                # defaults to False for it) and no backward follows to reshard them.
                modules[-1].reshard()
                resharded = resharded and all_sharded(modules)
            after = counter.snapshot()
            per_step.append({"ag_fwd": after[0] - before[0], "ag_bwd": after[1] - before[1],
                             "rs": after[2] - before[2], "allocs": _allocations(cache) - alloc_before,
                             "resharded": resharded})
    torch.npu.synchronize()
    # Unsharded parameters after a step (an upstream bug, see test_edge_cases...) have no full_tensor.
    params = full_params(model) if all_sharded(modules) else None
    return {"losses": losses, "params": params, "steps": per_step, "eval": eval_out,
            "cache": cache.stats()._asdict() if setup.mem_cache else None}


def _allocations(cache: Any) -> int:
    stats = cache.stats()
    return stats.misses + stats.bypassed + CountingAllGather.allocations + CountingReduceScatter.allocations


def assert_same_training(ref: dict[str, Any], got: dict[str, Any], label: str, exact: bool = True) -> None:
    """Bit-identical losses, parameters and eval outputs; ``exact=False``: float rounding apart."""
    if not exact:
        torch.testing.assert_close(got["losses"], ref["losses"], rtol=1e-5, atol=1e-6, msg=label)
        torch.testing.assert_close(got["params"], ref["params"], rtol=1e-5, atol=1e-6, msg=label)
        return
    assert got["losses"] == ref["losses"], f"{label}: losses {got['losses']} != {ref['losses']}"
    for i, (a, b) in enumerate(zip(ref["params"], got["params"], strict=True)):
        assert torch.equal(a, b), f"{label}: parameter {i} differs by {(a - b).abs().max().item()}"
    for a, b in zip(ref["eval"], got["eval"], strict=True):
        assert torch.equal(a, b), f"{label}: eval output differs"


def audit_clean() -> list[str]:
    from npusim.distributed.audit import audit_fsdp

    report = audit_fsdp()
    return [f"{f.status} {f.target}" for f in report.findings]


def _parity_job(rank: int, world: int) -> dict[str, Any]:
    """Every enhancement configuration, both use_reentrant settings; counts per step."""
    out: dict[str, Any] = {}
    for reentrant in (False, True):
        runs = {name: train(rank, setup, {"use_reentrant": reentrant}) for name, setup in CONFIGS.items()}
        for name, run in runs.items():
            assert_same_training(runs["off"], run, f"{name} (use_reentrant={reentrant})")
            out[f"{name}/reentrant={reentrant}"] = {"steps": run["steps"], "cache": run["cache"]}
    out["audit"] = audit_clean()
    return out


# PyTorch 2.13 alone mistrains these under reentrant checkpointing (see Note
# [Reentrant recompute of a module run twice] in npusim.distributed.fsdp.recompute).
UPSTREAM_REENTRANT_BUGS = {"block called twice", "two forwards, one backward", "nested fsdp, block called twice",
                           "wide checkpoint, block called twice"}


def _edge_job(rank: int, world: int) -> dict[str, Any]:
    """Cases where "a forward already ran" is not "recompute": the enhanced layer must train like PyTorch's FSDP2."""
    cases: dict[str, tuple[Setup, dict[str, Any], dict[str, Any]]] = {
        "block called twice": (Setup(), {"order": (0, 1, 0), "n_blocks": 2}, {}),
        "two forwards, one backward": (Setup(), {}, {"forwards_per_step": 2}),
        "eval no_grad forward": (Setup(), {}, {"eval_every_step": True}),
        "nested fsdp in checkpoint": (Setup(nested=True), {}, {}),
        "nested fsdp, block called twice": (Setup(nested=True), {"order": (0, 1, 0), "n_blocks": 2}, {}),
        "wide checkpoint, block called twice": (Setup(), {"order": (0, 1, 0), "n_blocks": 2,
                                                          "wide_checkpoint": True}, {}),
        "reshard_after_forward=False": (Setup(reshard_after_forward=False), {}, {}),
        "reshard_after_forward=1": (Setup(reshard_after_forward=1), {}, {}),
        "reshard_after_forward=2": (Setup(reshard_after_forward=2), {}, {}),
        "bf16 params, fp32 reduce": (Setup(mixed_precision=True), {}, {}),
    }
    out: dict[str, Any] = {}
    for name, (setup, model_kw, train_kw) in cases.items():
        runs: dict[bool, dict[str, Any]] = {}
        for reentrant in (False, True):
            kw = {**model_kw, "use_reentrant": reentrant}
            ref = runs[reentrant] = train(rank, setup, kw, steps=3, **train_kw)
            got = train(rank, setup._replace(mem_cache=True, recompute_rule=True), kw, steps=3, **train_kw)
            label = f"{name} (use_reentrant={reentrant})"
            upstream_ok = ref["params"] is not None
            if not upstream_ok:
                assert reentrant, f"{label}: PyTorch's FSDP2 left parameters unsharded"
                # Non-reentrant recompute computes the same values (up to the order of
                # gradient accumulation): the correct reference.
                ref = runs[False]
                assert abs(got["losses"][-1] - runs[True]["losses"][-1]) > 1e-3, f"{label}: upstream bug not seen"
            assert_same_training(ref, got, label, exact=upstream_ok)
            out[label] = {"upstream": runs[reentrant]["steps"], "enhanced": got["steps"], "upstream_ok": upstream_ok}
    out["_use_mem_cache"] = _use_mem_cache_attribute(rank)
    out["audit"] = audit_clean()
    return out


def _use_mem_cache_attribute(rank: int) -> list[bool]:
    """torch-npu's switch: ``_use_mem_cache = True`` before wrapping, and set after wrapping."""
    from npusim.distributed.fsdp import CachedAllGather, CachedReduceScatter, fully_shard

    device = torch.device("npu", rank)
    model = TinyTransformer(use_reentrant=False).to(device)
    model.blocks[0]._use_mem_cache = True
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.blocks[1]._use_mem_cache = True  # after wrapping: honoured at the next forward
    model(batch(0, rank, device)[0]).sum().backward()

    def cached(m: Any) -> bool:
        group = m._get_fsdp_state()._fsdp_param_group
        return isinstance(group._all_gather_comm, CachedAllGather) and isinstance(
            group._reduce_scatter_comm, CachedReduceScatter)

    return [cached(model.blocks[0]), cached(model.blocks[1]), cached(model.blocks[2]), cached(model)]


def _slow_device_job(rank: int, world: int) -> list[list[int]]:
    """Device work lags the host by many steps' worth of tasks: buffers are released while still queued."""
    import npusim

    assert npusim.timing.get().enabled
    allocs = []
    for reentrant in (False, True):
        ref = train(rank, Setup(), {"use_reentrant": reentrant}, steps=3)
        got = train(rank, Setup(mem_cache=True, recompute_rule=True), {"use_reentrant": reentrant}, steps=3)
        assert_same_training(ref, got, f"slow device (use_reentrant={reentrant})")
        allocs.append([s["allocs"] for s in got["steps"]])
    return allocs


def test_identical_with_a_slow_device():
    """With the timing model making every device task slow, the cache still trains bit-identically."""
    allocs = run_ranks(_slow_device_job, timeout=120,
                       env={"NPUSIM_TIMING": "copy_gbps=0.05,launch_us=1000,link_gbps=0.02,realtime=1"})[0]
    assert all(a[WARMUP:] == [0, 0] for a in allocs), allocs


def _reshard_to_int_job(rank: int, world: int) -> dict[bool, list[dict[str, Any]]]:
    """reshard_after_forward=2 of 4 ranks: parameters kept sharded over 2 ranks between forward and backward."""
    out = {}
    for reentrant in (False, True):
        setup = Setup(reshard_after_forward=2)
        ref = train(rank, setup, {"use_reentrant": reentrant}, steps=3)
        got = train(rank, setup._replace(mem_cache=True, recompute_rule=True), {"use_reentrant": reentrant}, steps=3)
        assert_same_training(ref, got, f"reshard_after_forward=2 of 4 (use_reentrant={reentrant})")
        out[reentrant] = got["steps"]
    return out


def test_reshard_after_forward_int_on_four_ranks():
    """The post-forward mesh path (an int smaller than the world): identical training, resharded, 0 allocations."""
    result = run_ranks(_reshard_to_int_job, world_size=4, timeout=150, env={"NPUSIM_DEVICE_COUNT": "4"})[0]
    for reentrant, steps in result.items():
        assert all(s["resharded"] for s in steps), reentrant
        assert [s["allocs"] for s in steps[WARMUP:]] == [0, 0], (reentrant, steps)
        assert [s["ag_bwd"] for s in steps] == [4, 4, 4], (reentrant, steps)  # 3 blocks + root


@pytest.fixture(scope="module")
def parity() -> dict[str, Any]:
    return run_ranks(_parity_job, timeout=150)[0]


@pytest.fixture(scope="module")
def edges() -> dict[str, Any]:
    return run_ranks(_edge_job, timeout=200)[0]


def test_signature_matches_pytorch():
    """Same parameters as PyTorch's fully_shard, plus keyword-only mem_cache and recompute_rule."""
    from npusim.distributed.fsdp import fully_shard

    ours, theirs = inspect.signature(fully_shard), inspect.signature(upstream_fully_shard)
    names = list(ours.parameters)
    assert names[: len(theirs.parameters)] == list(theirs.parameters)
    assert [ours.parameters[n] for n in theirs.parameters] == list(theirs.parameters.values())
    assert names[len(theirs.parameters):] == ["mem_cache", "recompute_rule"]
    assert all(ours.parameters[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ("mem_cache", "recompute_rule"))
    assert fully_shard.__doc__ == upstream_fully_shard.__doc__


def test_training_identical_in_every_configuration(parity):
    """Losses and parameters are bit-identical with enhancements off / cache / rule / both (checked in the ranks)."""
    assert set(parity) >= {f"{n}/reentrant={r}" for n in CONFIGS for r in (False, True)}


def test_cache_allocates_nothing_after_warmup(parity):
    """With the cache, no communication buffer is allocated after the first step; without it, every one is."""
    for reentrant in (False, True):
        for name in ("cache", "both"):
            steps = parity[f"{name}/reentrant={reentrant}"]["steps"]
            assert [s["allocs"] for s in steps[WARMUP:]] == [0] * (STEPS - WARMUP), (name, steps)
            assert steps[0]["allocs"] > 0
            stats = parity[f"{name}/reentrant={reentrant}"]["cache"]
            assert stats["hits"] > 0 and stats["bytes_held"] > 0 and stats["bypassed"] == 0
        off = parity[f"off/reentrant={reentrant}"]["steps"]
        # One buffer per all-gather, two (input, output) per reduce-scatter, every step.
        assert all(s["allocs"] == s["ag_fwd"] + s["ag_bwd"] + 2 * s["rs"] > 0 for s in off), off


def test_recompute_rule_all_gathers_each_block_once_in_backward(parity):
    """Backward all-gathers once per resharded block (3) under the rule, for both use_reentrant settings."""
    for reentrant in (False, True):
        for name in ("rule", "both"):
            steps = parity[f"{name}/reentrant={reentrant}"]["steps"]
            assert [s["ag_bwd"] for s in steps] == [3] * STEPS, (name, reentrant, steps)
            assert [s["ag_fwd"] for s in steps] == [4] * STEPS  # root + 3 blocks


def test_upstream_recompute_all_gather_counts(parity):
    """PyTorch alone: no extra all-gather with non-reentrant recompute, but the reentrant
    recompute runs the explicit forward prefetch again (one wasted all-gather per prefetching block)."""
    non_reentrant = parity["off/reentrant=False"]["steps"]
    reentrant = parity["off/reentrant=True"]["steps"]
    assert [s["ag_bwd"] for s in non_reentrant] == [3] * STEPS
    assert [s["ag_bwd"] for s in reentrant] == [5] * STEPS


def test_parameters_resharded_after_every_step(parity, edges):
    """Every FSDP parameter group is sharded at the end of every step, in every configuration and case."""
    for label, result in parity.items():
        if label != "audit":
            assert all(s["resharded"] for s in result["steps"]), label
    for label, result in _edge_results(edges):
        assert all(s["resharded"] for s in result["enhanced"]), label
        assert all(s["resharded"] for s in result["upstream"]) == result["upstream_ok"], label


def _edge_results(edges: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, v) for k, v in edges.items() if "(use_reentrant=" in k]


def test_edge_cases_match_pytorch_and_never_gather_more(edges):
    """Block called twice (and tied weights), two forwards per backward, eval+no_grad, nested FSDP,
    reshard_after_forward False and int, mixed precision: identical training (checked in the
    ranks), never more all-gathers."""
    for label, result in _edge_results(edges):
        if not result["upstream_ok"]:
            continue
        for up, en in zip(result["upstream"], result["enhanced"], strict=True):
            assert en["ag_fwd"] + en["ag_bwd"] <= up["ag_fwd"] + up["ag_bwd"], (label, up, en)
            assert en["rs"] == up["rs"], label
    # No all-gather in backward at all when parameters stay unsharded after forward.
    for reentrant in (False, True):
        assert all(s["ag_bwd"] == 0 for s in edges[f"reshard_after_forward=False (use_reentrant={reentrant})"]
                   ["enhanced"])


def test_upstream_reentrant_bug_is_fixed(edges):
    """PyTorch alone mistrains a module run twice per backward under reentrant checkpointing
    (gradients of one call never reduce-scattered, parameters left unsharded); the rule trains it
    like non-reentrant checkpointing (values checked in the ranks), with the same all-gathers."""
    broken = {label for label, result in _edge_results(edges) if not result["upstream_ok"]}
    assert broken == {f"{name} (use_reentrant=True)" for name in UPSTREAM_REENTRANT_BUGS}
    for name in UPSTREAM_REENTRANT_BUGS:
        fixed = edges[f"{name} (use_reentrant=True)"]["enhanced"]
        reference = edges[f"{name} (use_reentrant=False)"]["upstream"]
        assert [(s["ag_fwd"], s["ag_bwd"]) for s in fixed] == [(s["ag_fwd"], s["ag_bwd"]) for s in reference]
        # Non-reentrant reduces the two calls' gradients together; here each call is reduced.
        assert all(f["rs"] > r["rs"] for f, r in zip(fixed, reference, strict=True))


def test_cache_allocates_nothing_after_warmup_in_edge_cases(edges):
    """Also with tied/reused blocks, several forwards, eval forwards, nested FSDP and every reshard setting."""
    for label, result in _edge_results(edges):
        assert [s["allocs"] for s in result["enhanced"][WARMUP:]] == [0, 0], label


def test_use_mem_cache_attribute(edges):
    """``module._use_mem_cache = True`` turns the cache on, set before wrapping or before the next forward."""
    assert edges["_use_mem_cache"] == [True, True, False, False]


def test_audit_reports_no_override(parity, edges):
    """The enhancement layer replaces no PyTorch FSDP2 function: the audit finds nothing at all."""
    assert parity["audit"] == [] and edges["audit"] == []
