"""torch_npu's DTensor strategies for aten.matmul, aten.matmul_backward and op-plugin's fused operators, and
matmul_backward's npu kernel.

npusim.distributed.dtensor_strategies and .fused_strategies define them (npusim's torch_npu registers them on
import, as torch_npu does); npusim.ops.matmul_backward is the npu kernel of matmul_backward. On a 2-rank npu mesh, each
sharded case gives the unsharded values with the placements the strategy says, and without
communication where the inputs already sit where the strategy wants them.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from npusim.testing.ranks import run_ranks

# (a's shape, b's shape, a's placement, b's placement, expected output placement): each a strategy that
# takes the inputs where they are, so no collective runs. "S<d>" is Shard(d), "R" Replicate; "P" a Partial
# output. (A case that must redistribute is not here: npusim's hccl backend fails a collective issued under
# inference mode, which is where DTensor meets aten.matmul.default on npusim.)
MATMUL_CASES = [
    ((6, 4), (4, 8), "S0", "R", "S0"),  # m split
    ((6, 4), (4, 8), "R", "S1", "S1"),  # n split
    ((6, 4), (4, 8), "S1", "S0", "P"),  # k split: partial sums
    ((2, 6, 4), (4, 8), "S0", "R", "S0"),  # batch dimension b lacks
    ((4, 6, 4), (1, 4, 8), "S0", "R", "S0"),  # batch dimension b broadcasts
    ((4, 6, 4), (4, 4, 8), "S0", "S0", "S0"),  # shared batch dimension
    ((4,), (4, 8), "S0", "S0", "P"),  # 1-D row vector, k split
    ((6, 4), (4,), "S0", "R", "S0"),  # 1-D column vector, m split
    ((4,), (4,), "S0", "S0", "P"),  # dot product
]

# (grad's, a's and b's shapes, their placements, and the gradients' expected placements).
BACKWARD_CASES = [
    ((6, 8), (6, 4), (4, 8), ("S0", "S0", "R"), ("S0", "P")),  # m split: db sums over m
    ((6, 8), (6, 4), (4, 8), ("S1", "R", "S1"), ("P", "S1")),  # n split: da sums over n
    ((6, 8), (6, 4), (4, 8), ("R", "S1", "S0"), ("S1", "S0")),  # k split
    ((2, 6, 8), (2, 6, 4), (4, 8), ("S0", "S0", "R"), ("S0", "P")),  # batch dimension b lacks
    ((4, 6, 8), (4, 6, 4), (1, 4, 8), ("S0", "S0", "R"), ("S0", "P")),  # batch dimension b broadcasts
    ((8,), (4,), (4, 8), ("S0", "R", "S1"), ("P", "S1")),  # 1-D a
    ((6,), (6, 4), (4,), ("S0", "S0", "R"), ("S0", "P")),  # 1-D b
]


def _placement(name: str):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"R": Replicate(), "P": Partial()}.get(name) or Shard(int(name[1:]))


def _inputs(shapes: tuple[tuple[int, ...], ...], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def _check_strategies(rank: int, world_size: int) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    from npusim.distributed import dtensor_strategies

    dtensor_strategies.register()
    # Count the strategy's calls as torchtitan-npu's wrapper sees them: DTensor computed with it.
    registry = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    calls = []
    original = registry[torch.ops.aten.matmul.default]
    registry[torch.ops.aten.matmul.default] = lambda schema: calls.append(schema) or original(schema)
    mesh = init_device_mesh("npu", (world_size,))
    checked = 0
    for i, (shape_a, shape_b, place_a, place_b, place_out) in enumerate(MATMUL_CASES):
        what = f"matmul {shape_a} {place_a} @ {shape_b} {place_b}"
        a, b = _inputs((shape_a, shape_b), seed=i)
        da = distribute_tensor(a.npu(), mesh, [_placement(place_a)])
        db = distribute_tensor(b.npu(), mesh, [_placement(place_b)])
        # Under inference mode the composite reaches DTensor as aten.matmul.default, as torch_npu's does.
        with torch.inference_mode(), CommDebugMode() as comm:
            out = torch.matmul(da, db)
        assert isinstance(out, DTensor), what
        assert len(calls) == i + 1, f"{what}: the matmul strategy was not consulted"
        assert comm.get_total_counts() == 0, f"{what}: {comm.get_comm_counts()}"
        assert out.placements == (_placement(place_out),), f"{what}: {out.placements}"
        assert_close(out.full_tensor().cpu(), torch.matmul(a, b), rtol=1e-5, atol=1e-5, msg=what)
        checked += 1
    for i, (shapes, places, grad_places) in enumerate((c[:3], c[3], c[4]) for c in BACKWARD_CASES):
        what = f"matmul_backward {shapes} {places}"
        grad, a, b = _inputs(shapes, seed=100 + i)
        a_ref, b_ref = a.clone().requires_grad_(), b.clone().requires_grad_()
        expected = torch.autograd.grad(torch.matmul(a_ref, b_ref), (a_ref, b_ref), grad)
        dgrad, da, db = (distribute_tensor(t.npu(), mesh, [_placement(p)]) for t, p in zip((grad, a, b), places,
                                                                                           strict=True))
        with CommDebugMode() as comm:
            grads = torch.ops.aten.matmul_backward.default(dgrad, da, db, [True, True])
        assert comm.get_total_counts() == 0, f"{what}: {comm.get_comm_counts()}"
        for got, want, place in zip(grads, expected, grad_places, strict=True):
            assert got.placements == (_placement(place),), f"{what}: {got.placements}"
            assert_close(got.full_tensor().cpu(), want, rtol=1e-5, atol=1e-5, msg=what)
        # One gradient only: the other is undefined, as the mask asks.
        only_b = torch.ops.aten.matmul_backward.default(dgrad, da, db, [False, True])
        assert only_b[0] is None, what
        assert_close(only_b[1].full_tensor().cpu(), expected[1], rtol=1e-5, atol=1e-5, msg=what)
        checked += 1
    return checked


# op-plugin's fused operators: (name, the op's call on its tensors, the inputs' shapes, their placements, the
# outputs' expected placements). Each is checked against the same op on the unsharded tensors.
FUSED_CASES = [
    ("npu_rms_norm", lambda x, g: torch.ops.npu.npu_rms_norm(x, g, 1e-6), ((4, 6, 8), (8,)), ("S1", "R"),
     ("S1", "S1")),
    ("npu_rms_norm_backward", torch.ops.npu.npu_rms_norm_backward, ((4, 6, 8), (4, 6, 8), (8,), (4, 6, 1)),
     ("S0", "S0", "R", "S0"), ("S0", "P")),
    ("npu_add_rms_norm", torch.ops.npu.npu_add_rms_norm, ((4, 6, 8), (4, 6, 8), (8,)), ("S1", "S1", "R"),
     ("S1", "S1", "S1")),
    ("npu_rotary_mul", torch.ops.npu.npu_rotary_mul, ((2, 6, 4, 8), (1, 6, 1, 8), (1, 6, 1, 8)),
     ("S1", "S1", "S1"), ("S1",)),
    ("npu_rotary_mul_backward", torch.ops.npu.npu_rotary_mul_backward,
     ((2, 6, 4, 8), (2, 6, 4, 8), (1, 6, 1, 8), (1, 6, 1, 8)), ("S2", "S2", "R", "R"), ("S2", "P", "P")),
    ("npu_swiglu", torch.ops.npu.npu_swiglu, ((4, 6, 8),), ("S0",), ("S0",)),
    ("npu_swiglu_backward", torch.ops.npu.npu_swiglu_backward, ((4, 6, 4), (4, 6, 8)), ("S1", "S1"), ("S1",)),
]


def _routing(seed: int) -> dict[str, object]:
    """A small MoE routing: 4 tokens of hidden size 8, top-2 of 3 experts, and what permute gives for them."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randn(4, 8, generator=generator).npu()
    indices = torch.stack([torch.randperm(3, generator=generator)[:2] for _ in range(4)]).to(torch.int32).npu()
    probs = torch.rand(4, 2, generator=generator).npu()
    permuted, sorted_indices = torch.ops.npu.npu_moe_token_permute(tokens, indices)
    return {"tokens": tokens, "indices": indices, "probs": probs, "permuted": permuted, "sorted": sorted_indices,
            "grad_permuted": torch.randn(8, 8, generator=generator).npu(),
            "grad_tokens": torch.randn(4, 8, generator=generator).npu(),
            "x": torch.randn(4, 6, 8, generator=generator).npu()}


# More of op-plugin's fused operators, on arguments that are not all tensors: (name, the op, the arguments by
# the routing's names (other values as they are), each argument's placement (None: not a tensor), the
# outputs' expected placements).
MORE_FUSED_CASES = [
    ("npu_fast_gelu", torch.ops.npu.npu_fast_gelu, ["x"], ["S2"], ("S2",)),
    ("fast_gelu", torch.ops.npu.fast_gelu, ["x"], ["S0"], ("S0",)),
    ("npu_fast_gelu_backward", torch.ops.npu.npu_fast_gelu_backward, ["x", "x"], ["S1", "S1"], ("S1",)),
    ("npu_moe_token_permute", torch.ops.npu.npu_moe_token_permute, ["tokens", "indices"], ["S1", "R"],
     ("S1", "R")),
    ("npu_moe_token_permute_grad", torch.ops.npu.npu_moe_token_permute_grad,
     ["tokens", "grad_permuted", "indices", "sorted"], ["S1", "S1", "R", "R"], ("S1",)),
    ("npu_moe_token_permute_grad_v2", torch.ops.npu.npu_moe_token_permute_grad_v2,
     ["grad_permuted", "sorted", 4, torch.float32, 2], ["S1", "R", None, None, None], ("S1",)),
    ("npu_moe_token_unpermute", torch.ops.npu.npu_moe_token_unpermute, ["permuted", "sorted", "probs"],
     ["S1", "R", "R"], ("S1",)),
    ("npu_moe_token_unpermute_grad", torch.ops.npu.npu_moe_token_unpermute_grad,
     ["permuted", "grad_tokens", "sorted", "probs"], ["S1", "S1", "R", "R"], ("S1", "P")),
    ("npu_moe_token_unpermute_grad_v2", torch.ops.npu.npu_moe_token_unpermute_grad_v2,
     ["grad_tokens", "sorted", 8, torch.float32, "probs", False, None, "permuted"],
     ["S1", "R", None, None, "R", None, None, "S1"], ("S1", "P")),
]


def _check_more_fused_strategies(rank: int, world_size: int) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from npusim.distributed import dtensor_strategies

    dtensor_strategies.register()
    mesh = init_device_mesh("npu", (world_size,))
    for i, (name, op, arguments, places, out_places) in enumerate(MORE_FUSED_CASES):
        values = _routing(seed=300 + i)
        args = [values[a] if isinstance(a, str) else a for a in arguments]
        expected = op(*args)
        expected = expected if isinstance(expected, tuple) else (expected,)
        sharded = [a if p is None else distribute_tensor(a, mesh, [_placement(p)])
                   for a, p in zip(args, places, strict=True)]
        _assert_sharded_run_equals(name, op, sharded, expected, out_places)
    return len(MORE_FUSED_CASES)



def _assert_sharded_run_equals(name: str, op: Any, sharded: list[Any], expected: tuple[torch.Tensor, ...],
                               out_places: Any) -> None:
    """``op`` on the DTensors runs without a collective and gives ``expected`` in ``out_places``."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        got = op(*sharded)
    got = got if isinstance(got, tuple) else (got,)
    assert comm.get_total_counts() == 0, f"{name}: {comm.get_comm_counts()}"
    for j, (g, e, p) in enumerate(zip(got, expected, out_places, strict=True)):
        assert g.placements == (_placement(p),), f"{name} output {j}: {g.placements}"
        assert_close(g.full_tensor().cpu(), e.cpu(), rtol=1e-5, atol=1e-5, msg=f"{name} output {j}")

def _check_fused_strategies(rank: int, world_size: int) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from npusim.distributed import dtensor_strategies

    dtensor_strategies.register()
    mesh = init_device_mesh("npu", (world_size,))
    for i, (name, op, shapes, places, out_places) in enumerate(FUSED_CASES):
        inputs = [t.npu() for t in _inputs(shapes, seed=200 + i)]
        if name == "npu_rms_norm_backward":
            inputs[3] = inputs[3].abs() + 0.5  # rstd is positive
        expected = op(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        sharded = [distribute_tensor(t, mesh, [_placement(p)]) for t, p in zip(inputs, places, strict=True)]
        _assert_sharded_run_equals(name, op, sharded, expected, out_places)
    return len(FUSED_CASES)


def test_fused_operator_strategies_give_unsharded_values_on_two_ranks():
    """op-plugin's norms, rotary embedding and SwiGLU on DTensors of a 2-rank npu mesh equal the unsharded ops."""
    assert run_ranks(_check_fused_strategies, timeout=180) == [len(FUSED_CASES)] * 2


def test_fast_gelu_and_moe_token_permute_strategies_give_unsharded_values_on_two_ranks():
    """op-plugin's fast GELU (split anywhere) and MoE token permute / unpermute with their gradients (the hidden
    dimension split, the routing replicated, the gradient of probs Partial) on a 2-rank npu mesh equal the
    unsharded ops, with no collective."""
    assert run_ranks(_check_more_fused_strategies, timeout=180) == [len(MORE_FUSED_CASES)] * 2


def _attention_inputs(layout: str, seed: int) -> list[torch.Tensor]:
    """query, key, value and dy of 2 batch entries, 4 heads, 6 positions and head size 8, in ``layout``."""
    generator = torch.Generator().manual_seed(seed)
    bnsd = [torch.randn(2, 4, 6, 8, generator=generator) for _ in range(4)]
    order = {"BNSD": (0, 1, 2, 3), "BSND": (0, 2, 1, 3)}[layout]
    return [t.permute(order).contiguous().npu() for t in bnsd]


def _attention_forward_and_grad(q, k, v, dy, layout: str, v3: bool, **kwargs):
    """The forward and the grad op on its outputs (the grad takes masks and statistics by keyword)."""
    forward = torch.ops.npu.npu_fusion_attention_v3 if v3 else torch.ops.npu.npu_fusion_attention
    outs = forward(q, k, v, 4, layout, scale=0.35, **kwargs)
    extra = {"seed": outs[4], "offset": outs[5]} if v3 else {}
    grad = torch.ops.npu.npu_fusion_attention_grad_v3 if v3 else torch.ops.npu.npu_fusion_attention_grad
    grads = grad(q, k, v, dy, 4, layout, softmax_max=outs[1], softmax_sum=outs[2], attention_in=outs[0],
                 scale_value=0.35, **kwargs, **extra)
    return outs[:3], grads[:3]


# (layout, the split of query / key / value / dy, whether v3, extra arguments, expected placement of the
# attention output and the gradients, of the statistics).
ATTENTION_CASES = [
    ("BNSD", "S0", False, {}, "S0", "S0"),  # batch split
    ("BNSD", "S1", False, {}, "S1", "S1"),  # head split: each rank's call takes 2 heads
    ("BSND", "S2", False, {}, "S2", "S1"),  # head split in BSND
    ("BSND", "S0", True, {}, "S0", "S0"),  # v3, batch split
    ("BNSD", "S1", True, {}, "S1", "S1"),  # v3, head split
    ("BNSD", "S1", False, {"mask": (1, 1, 6, 6)}, "S1", "S1"),  # a mask shared by every head: replicated
    ("BNSD", "S0", False, {"mask": (2, 4, 6, 6)}, "S0", "S0"),  # a mask of its own per batch entry: split
    ("BNSD", "S0", False, {"pse": (1, 4, 6, 6)}, "R", "R"),  # pse: replicated, the inputs gathered
]


def _check_attention_strategies(rank: int, world_size: int) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    from npusim.distributed import dtensor_strategies

    dtensor_strategies.register()
    mesh = init_device_mesh("npu", (world_size,))
    for i, (layout, split, v3, extra, out_place, stat_place) in enumerate(ATTENTION_CASES):
        what = f"attention {layout} {split} v3={v3} {extra}"
        q, k, v, dy = _attention_inputs(layout, seed=400 + i)
        generator = torch.Generator().manual_seed(500 + i)
        kwargs = {}
        if "mask" in extra:  # a causal mask with a random extra hole, as bool
            mask = torch.ones(6, 6).triu(1).bool() | (torch.rand(extra["mask"], generator=generator) > 0.8)
            kwargs["atten_mask"] = mask.npu()
        if "pse" in extra:
            kwargs["pse"] = torch.randn(extra["pse"], generator=generator).npu()
        expected_outs, expected_grads = _attention_forward_and_grad(q, k, v, dy, layout, v3, **kwargs)
        sharded = [distribute_tensor(t, mesh, [_placement(split)]) for t in (q, k, v, dy)]
        # A mask or pse passed as a plain tensor: the same on every rank, taken as replicated.
        with CommDebugMode() as comm:
            outs, grads = _attention_forward_and_grad(*sharded, layout, v3, **kwargs)
        assert (comm.get_total_counts() == 0) == (out_place != "R"), f"{what}: {comm.get_comm_counts()}"
        for j, (got, want) in enumerate(zip((*outs, *grads), (*expected_outs, *expected_grads), strict=True)):
            place = stat_place if j in (1, 2) else out_place
            assert isinstance(got, DTensor), f"{what} [{j}]"
            assert got.placements == (_placement(place),), f"{what} [{j}]: {got.placements}"
            assert_close(got.full_tensor().cpu(), want.cpu(), rtol=1e-5, atol=1e-5, msg=f"{what} [{j}]")
    # The grad op given replicated statistics and attention_in by keyword, its q / k / v / dy split on the batch:
    # the handler splits the keyword arguments too (DTensor reshards only positional ones).
    q, k, v, dy = _attention_inputs("BNSD", seed=440)
    outs = torch.ops.npu.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.35)
    stats = {"softmax_max": outs[1], "softmax_sum": outs[2], "attention_in": outs[0]}
    expected = torch.ops.npu.npu_fusion_attention_grad(q, k, v, dy, 4, "BNSD", scale_value=0.35, **stats)
    replicated = {name: distribute_tensor(t, mesh, [_placement("R")]) for name, t in stats.items()}
    sharded = [distribute_tensor(t, mesh, [_placement("S0")]) for t in (q, k, v, dy)]
    grads = torch.ops.npu.npu_fusion_attention_grad(*sharded, 4, "BNSD", scale_value=0.35, **replicated)
    for got, want in zip(grads[:3], expected[:3], strict=True):
        assert got.placements == (_placement("S0"),), got.placements
        assert_close(got.full_tensor().cpu(), want.cpu(), rtol=1e-5, atol=1e-5)
    # Autograd through DTensors, as tensor parallelism runs it: the forward's backward calls the grad op.
    q, k, v, dy = _attention_inputs("BNSD", seed=450)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.ops.npu.npu_fusion_attention(*leaves, 4, "BNSD", scale=0.35)[0].backward(dy)
    sharded = [distribute_tensor(t, mesh, [_placement("S1")]).requires_grad_() for t in (q, k, v)]
    out = torch.ops.npu.npu_fusion_attention(*sharded, 4, "BNSD", scale=0.35)[0]
    out.backward(distribute_tensor(dy, mesh, [_placement("S1")]))
    for leaf, dleaf in zip(leaves, sharded, strict=True):
        assert dleaf.grad.placements == (_placement("S1"),)
        assert_close(dleaf.grad.full_tensor().cpu(), leaf.grad.cpu(), rtol=1e-5, atol=1e-5)
    return len(ATTENTION_CASES) + 2


def test_fusion_attention_strategies_give_unsharded_values_on_two_ranks():
    """npu_fusion_attention(_v3) and its grad on DTensors of a 2-rank npu mesh: split along the batch or the heads
    (each rank's call taking its share of head_num), masks split with them where they have a batch or heads of
    their own, replicated with pse; forward, grad op with keyword statistics (resharded by the handler) and
    autograd equal the unsharded, with no collective where the inputs sit where the strategy wants them."""
    assert run_ranks(_check_attention_strategies, timeout=240) == [len(ATTENTION_CASES) + 2] * 2


def _gmm_operands(seed: int) -> dict[str, object]:
    """Operands of npu_grouped_matmul's forms: two independent pairs (x up to 3-D), and one x of 6 rows grouped
    2 + 4 over an (E=2, K=6, N=8) weight, with biases."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).npu()

    return {"xs": [randn(2, 4, 6), randn(3, 6)], "ws": [randn(6, 8), randn(6, 8)], "bs": [randn(8), randn(8)],
            "x": [randn(6, 6)], "w": [randn(2, 6, 8)], "b": [randn(2, 8)],
            "group_list": torch.tensor([2, 6]).npu()}


# (what, the operand lists by name, their placements, keyword arguments (bias by operand name), the outputs'
# expected placements, whether it runs without a collective).
GMM_CASES = [
    ("pairs, n split", ("xs", "ws"), ("R", "S1"), {"group_type": -1}, ("S2", "S1"), True),
    ("pairs, n split with bias", ("xs", "ws"), ("R", "S1"), {"group_type": -1, "bias": "bs"}, ("S2", "S1"), True),
    ("pairs, k split", ("xs", "ws"), ("S-1", "S0"), {"group_type": -1}, ("P", "P"), True),
    ("pairs, rows split", ("xs", "ws"), ("S0", "R"), {"group_type": -1}, ("S0", "S0"), True),
    ("grouped rows, n split", ("x", "w"), ("R", "S2"),
     {"group_type": 0, "split_item": 2, "group_list": True, "bias": "b"}, ("S1",), True),
    ("grouped rows, k split", ("x", "w"), ("S1", "S1"), {"group_type": 0, "split_item": 3, "group_list": True},
     ("P",), True),
    ("grouped rows, .List overload, n split", ("x", "w"), ("R", "S2"), {"split_item": 3, "group_list": [2, 6]},
     ("S1",), True),
    ("no way fits: gathered, replicated", ("x", "w"), ("S0", "S1"),
     {"group_type": 0, "split_item": 3, "group_list": True}, ("R",), False),
]


def _check_grouped_matmul(rank: int, world_size: int) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    from npusim.distributed import dtensor_strategies

    dtensor_strategies.register()
    mesh = init_device_mesh("npu", (world_size,))

    def place(name: str, t: torch.Tensor):
        return _placement(f"S{t.ndim - 1}" if name == "S-1" else name)

    for i, (what, (x_name, w_name), (x_place, w_place), options, out_places, local) in enumerate(GMM_CASES):
        operands = _gmm_operands(seed=600 + i)
        kwargs = dict(options)
        if kwargs.get("group_list") is True:
            kwargs["group_list"] = operands["group_list"]
        op = torch.ops.npu.npu_grouped_matmul.List if isinstance(kwargs.get("group_list"), list) else \
            torch.ops.npu.npu_grouped_matmul.default
        bias_name = kwargs.pop("bias", None)
        bias = operands[bias_name] if bias_name else None
        expected = op(operands[x_name], operands[w_name], bias=bias, **kwargs)
        xs = [distribute_tensor(t, mesh, [place(x_place, t)]) for t in operands[x_name]]
        ws = [distribute_tensor(t, mesh, [place(w_place, t)]) for t in operands[w_name]]
        # The bias is split with the weights' n (its last dimension) where they are split, else replicated.
        bias_place = "S-1" if w_place != "R" else "R"
        bs = None if bias is None else [distribute_tensor(t, mesh, [place(bias_place, t)]) for t in bias]
        with CommDebugMode() as comm:
            got = op(xs, ws, bias=bs, **kwargs)
        assert (comm.get_total_counts() == 0) == local, f"{what}: {comm.get_comm_counts()}"
        assert len(got) == len(expected) == len(out_places), what
        for j, (g, e, p) in enumerate(zip(got, expected, out_places, strict=True)):
            assert isinstance(g, DTensor) and g.placements == (_placement(p),), f"{what} [{j}]: {g.placements}"
            assert g.shape == e.shape, f"{what} [{j}]: {g.shape} vs {e.shape}"
            assert_close(g.full_tensor().cpu(), e.cpu(), rtol=1e-5, atol=1e-5, msg=f"{what} [{j}]")
    operands = _gmm_operands(seed=700)
    try:
        torch.ops.npu.npu_grouped_matmul([distribute_tensor(operands["x"][0], mesh, [_placement("R")])],
                                         [distribute_tensor(operands["ws"][0], mesh, [_placement("R")])],
                                         group_list=operands["group_list"], split_item=3, group_type=2)
    except NotImplementedError as error:
        assert "group_type=2 is not supported" in str(error)
    else:
        raise AssertionError("group_type 2 on DTensors ran")
    return len(GMM_CASES) + 1


def test_grouped_matmul_sharding_gives_unsharded_values_on_two_ranks():
    """npu_grouped_matmul on DTensors of a 2-rank npu mesh: independent pairs split on n, k (Partial) or rows, grouped
    rows over an (E, K, N) weight split on n or k, both overloads, biases with the weights' n; operands that fit no
    way are gathered and run replicated; group_type 2 is refused as torch_npu refuses it."""
    assert run_ranks(_check_grouped_matmul, timeout=240) == [len(GMM_CASES) + 1] * 2


def test_matmul_strategies_give_unsharded_values_on_two_ranks():
    """DTensor matmul and matmul_backward on a 2-rank npu mesh equal the unsharded ops, placed as derived."""
    results = run_ranks(_check_strategies, timeout=180)
    assert results == [len(MATMUL_CASES) + len(BACKWARD_CASES)] * 2


@pytest.mark.parametrize(("shape_a", "shape_b"), [((6, 4), (4, 8)), ((4,), (4,)), ((3, 1, 6, 4), (5, 4, 2)),
                                                  ((2, 3, 4), (4,)), ((4,), (2, 4, 3))])
def test_matmul_backward_kernel_matches_autograd(shape_a, shape_b):
    """aten::matmul_backward on the npu gives autograd's gradients of torch.matmul, broadcasts summed back."""
    a, b = (t.double().requires_grad_() for t in _inputs((shape_a, shape_b), seed=3))
    out = torch.matmul(a, b)
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, (a, b), grad)
    got = torch.ops.aten.matmul_backward(grad.npu(), a.detach().npu(), b.detach().npu(), [True, True])
    for g, e in zip(got, expected, strict=True):
        assert g.device.type == "npu"
        assert_close(g.cpu(), e)


def test_matmul_backward_kernel_names_the_op_on_bad_shapes():
    """Mismatched contracted sizes or a wrong grad shape raise naming the op, the device and the shapes."""
    x = torch.randn(3, 4, device="npu")
    with pytest.raises(RuntimeError, match=r"aten::matmul_backward on npu:0: the contracted sizes differ.*"
                                           r"\(3, 4\) has 4.*\(5, 2\) has 5"):
        torch.ops.aten.matmul_backward(torch.randn(3, 2, device="npu"), x, torch.randn(5, 2, device="npu"),
                                       [True, True])
    with pytest.raises(RuntimeError, match=r"grad must have matmul's output shape \(3, 2\).*got \(2, 3\)"):
        torch.ops.aten.matmul_backward(torch.randn(2, 3, device="npu"), x, torch.randn(4, 2, device="npu"),
                                       [True, True])


_REGISTRY_SCRIPT = """
import torch
import torch_npu  # registers torch_npu's DTensor strategies, as on Ascend
from torch.distributed.tensor import DTensor

registry = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
aten = torch.ops.aten
# torchtitan-npu's custom_shardings pattern: find the op's strategy, wrap it, put the wrapper back.
for op in (aten.matmul.default, aten.matmul_backward.default):
    original = registry[op]
    registry[op] = lambda schema, original=original: original(schema)
print("ok")
"""


def test_torch_npu_import_registers_the_strategies_under_npusim_run(tmp_path):
    """`import torch_npu` under npusim run puts both ops in DTensor's registry, where torchtitan-npu wraps them."""
    script = tmp_path / "registry.py"
    script.write_text(_REGISTRY_SCRIPT)
    result = subprocess.run([sys.executable, "-m", "npusim", "run", str(script)], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"
