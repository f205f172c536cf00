"""Random numbers in npu graphs: fresh on every replay, reproducible after manual_seed, CUDA's refusals."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

SEED = 7


def _capture(fn: Callable[[], torch.Tensor]) -> tuple[torch.npu.NPUGraph, torch.Tensor]:
    g = torch.npu.NPUGraph()
    torch.npu.synchronize()
    with torch.npu.graph(g):
        out = fn()
    return g, out


def _replayed(g: torch.npu.NPUGraph, out: torch.Tensor) -> torch.Tensor:
    g.replay()
    torch.npu.synchronize()
    return out.cpu().clone()


RANDOM_OPS: dict[str, Callable[[], torch.Tensor]] = {
    "rand": lambda: torch.rand(64, device="npu"),
    "randn": lambda: torch.randn(8, 8, device="npu"),
    "randint": lambda: torch.randint(0, 1000, (64,), device="npu"),
    "rand_like": lambda: torch.rand_like(torch.empty(64, device="npu")),
    "normal_": lambda: torch.empty(64, device="npu").normal_(2.0, 3.0),
    "normal.Tensor_float": lambda: torch.normal(torch.full((64,), 5.0, device="npu"), 2.0),
    "uniform_": lambda: torch.empty(64, device="npu").uniform_(-1, 1),
    "bernoulli_": lambda: torch.empty(64, device="npu").bernoulli_(0.5),
    "bernoulli(p tensor)": lambda: torch.bernoulli(torch.full((64,), 0.3, device="npu")),
    "exponential_": lambda: torch.empty(64, device="npu").exponential_(),
    "geometric_": lambda: torch.empty(64, device="npu").geometric_(0.3),
    "log_normal_": lambda: torch.empty(64, device="npu").log_normal_(),
    "cauchy_": lambda: torch.empty(64, device="npu").cauchy_(),
    "random_": lambda: torch.empty(64, device="npu", dtype=torch.int64).random_(),
    "random_(to)": lambda: torch.empty(64, device="npu", dtype=torch.int64).random_(100),
    "dropout": lambda: F.dropout(torch.ones(64, device="npu"), 0.5),
    # the fallback's non-elementwise ops: a CPU kernel with a CPU generator seeded from the npu one
    "randperm": lambda: torch.randperm(64, device="npu"),
    "multinomial": lambda: torch.multinomial(torch.ones(64, device="npu"), 16),
    "poisson": lambda: torch.poisson(torch.full((64,), 4.0, device="npu")),
}


@pytest.mark.parametrize("name", list(RANDOM_OPS))
def test_random_op_replays_fresh_numbers_equal_to_eager_after_manual_seed(name: str) -> None:
    """Each replay draws new numbers; after manual_seed a replay draws what the op run eagerly draws, and both
    leave the generator at the same offset."""
    op = RANDOM_OPS[name]
    g, out = _capture(op)
    torch.npu.manual_seed(SEED)
    first, second = _replayed(g, out), _replayed(g, out)
    state_after_replays = torch.npu.get_rng_state()
    assert not torch.equal(first, second), "a replay repeated the previous replay's numbers"
    torch.npu.manual_seed(SEED)
    eager_first, eager_second = op().cpu(), op().cpu()
    assert torch.equal(first, eager_first) and torch.equal(second, eager_second)
    assert torch.equal(state_after_replays, torch.npu.get_rng_state())


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.drop, self.out = nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.relu(self.hidden(x))))


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def test_captured_training_step_with_dropout_replays_fresh_masks_equal_to_eager() -> None:
    """A whole captured training step (dropout, backward, SGD) draws a new mask per replay and, seeded alike,
    gives eager's masks, losses and parameters."""
    torch.manual_seed(0)
    graphed = _Mlp().to("npu")
    eager = copy.deepcopy(graphed)
    opt_g, opt_e = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (graphed, eager))
    masks: dict[str, list[torch.Tensor]] = {"graph": [], "eager": []}
    graphed.drop.register_forward_hook(lambda m, i, o: masks["graph"].append(o))
    eager.drop.register_forward_hook(lambda m, i, o: masks["eager"].append((o != 0).cpu()))
    static_x, static_y = torch.randn(4, 16, device="npu"), torch.randn(4, 8, device="npu")

    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):  # warm-up, mirrored on the eager model
        for seed in (1, 2):
            for model, opt in ((graphed, opt_g), (eager, opt_e)):
                torch.npu.manual_seed(seed)
                _step(model, opt, static_x, static_y)
    torch.npu.current_stream().wait_stream(side)
    masks["graph"].clear()
    masks["eager"].clear()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        static_loss = _step(graphed, opt_g, static_x, static_y)
    (static_hidden,) = masks["graph"]

    graph_masks = []
    for k in range(3):
        x, y = torch.randn(4, 16, device="npu"), torch.randn(4, 8, device="npu")
        static_x.copy_(x)
        static_y.copy_(y)
        torch.npu.manual_seed(100 + k)
        g.replay()
        torch.npu.synchronize()
        graph_masks.append((static_hidden != 0).cpu())
        torch.npu.manual_seed(100 + k)
        eager_loss = _step(eager, opt_e, x, y)
        assert static_loss.item() == pytest.approx(eager_loss.item(), rel=1e-5)
        assert torch.equal(graph_masks[-1], masks["eager"][-1])
    assert not torch.equal(graph_masks[0], graph_masks[1]) and not torch.equal(graph_masks[1], graph_masks[2])
    for pg, pe in zip(graphed.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(pg.cpu(), pe.cpu())


def test_dropout_of_an_intermediate_freed_during_capture_draws_fresh_masks() -> None:
    """dropout((x @ w).relu()) with no autograd: the matmul's output is freed during the capture before
    dropout draws, and its block of the graph's pool is reused. Each replay still draws a new mask,
    equal to eager's under the same seed (the graph-safe seed and offset live outside the pool: a replayed
    matmul once overwrote them, and every replay drew the same mask)."""
    torch.manual_seed(0)
    x, w = torch.randn(16, 128, device="npu"), torch.randn(128, 128, device="npu")

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.native_dropout((x @ w).relu(), 0.1, True)

    g = torch.npu.NPUGraph()
    torch.npu.synchronize()
    with torch.npu.graph(g):
        _, static_mask = step()
    masks = []
    for k in range(3):
        torch.npu.manual_seed(200 + k)
        g.replay()
        torch.npu.synchronize()
        masks.append(static_mask.cpu().clone())
        torch.npu.manual_seed(200 + k)
        assert torch.equal(masks[-1], step()[1].cpu())
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


def test_rng_state_saved_and_restored_inside_a_capture() -> None:
    """get_rng_state / set_rng_state inside a capture work on the graph's own offset (as checkpointing needs)."""

    def draw_twice() -> torch.Tensor:
        state = torch.npu.get_rng_state()
        a = torch.rand(16, device="npu")
        torch.npu.set_rng_state(state)
        b = torch.rand(16, device="npu")
        return torch.stack([a, b])

    g, out = _capture(draw_twice)
    pair = _replayed(g, out)
    assert torch.equal(pair[0], pair[1])
    assert not torch.equal(_replayed(g, out)[0], pair[0])


@pytest.mark.parametrize(("call", "message"), [
    (lambda: torch.npu.manual_seed(torch.npu.initial_seed() + 1),
     "NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed is the same as the "
     "original seed."),
    (lambda: torch.npu.seed(), "Cannot call NPUGeneratorImpl::seed during NPU graph capture"),
    (lambda: torch.npu.default_generators[0].get_offset(), "Cannot call NPUGeneratorImpl::get_offset"),
    (lambda: torch.npu.default_generators[0].set_offset(0), "Cannot call NPUGeneratorImpl::set_offset"),
    (lambda: torch.npu.default_generators[0].clone_state(), "Cannot call NPUGeneratorImpl::clone_impl"),
])
def test_generator_calls_cuda_refuses_during_capture(call: Callable[[], object], message: str) -> None:
    """Re-seeding with another seed, seed(), get_offset / set_offset and cloning raise during capture, as CUDA's."""
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.rand(4, device="npu")
        with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()
        torch.npu.manual_seed(torch.npu.initial_seed())  # the same seed: allowed, changes nothing
    g.replay()
    torch.npu.synchronize()


def test_normal_with_a_std_tensor_is_refused_as_cudas() -> None:
    """normal(mean, std) with a tensor std reads std's minimum on the host (PyTorch's CHECK_NORMAL_TENSOR_STD, on
    CUDA too): during capture that host read raises and invalidates the capture, it does not hang."""
    mean, std = torch.zeros(64, device="npu"), torch.ones(64, device="npu")
    torch.npu.synchronize()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):  # noqa: PT012
        with torch.npu.graph(torch.npu.NPUGraph()):
            torch.normal(mean, std)


def test_explicit_generator_registered_with_the_graph() -> None:
    """A torch.Generator('npu') registered with register_generator_state replays fresh numbers, reproducible after
    its manual_seed; a generator sharing its state (graphsafe_set_state) draws from the same stream."""
    gen = torch.Generator("npu")
    gen.manual_seed(3)
    g = torch.npu.NPUGraph()
    g.register_generator_state(gen)
    torch.npu.synchronize()
    with torch.npu.graph(g):
        out = torch.rand(32, device="npu", generator=gen)
    gen.manual_seed(3)
    first, second = _replayed(g, out), _replayed(g, out)
    assert not torch.equal(first, second)
    gen.manual_seed(3)
    assert torch.equal(first, torch.rand(32, device="npu", generator=gen).cpu())
    shared = torch.Generator("npu")
    shared.graphsafe_set_state(gen.graphsafe_get_state())
    offset = gen.get_offset()
    torch.rand(8, device="npu", generator=shared)
    assert gen.get_offset() == offset + 8
    with pytest.raises(RuntimeError, match="register_generator_state: expected an npu generator"):
        torch.npu.NPUGraph().register_generator_state(torch.Generator())
