"""NPU graphs: capture and replay, the private pool, forbidden calls, and the
graph-tree replay input copy of the design review (section 5.4)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import npusim
from npusim.ops import trace_foreach_copy
from npusim.runtime import acl
from npusim.testing.ranks import run_ranks

NOT_PERMITTED = "operation not permitted when stream is capturing"
MIXED = "Expected all tensors to be on the same device, but found at least two devices"


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to("npu")


def _capture(fn, *args):  # noqa: ANN001, ANN202
    """Captures fn(*args) into a new graph; returns (graph, static output)."""
    g = torch.npu.NPUGraph()
    torch.npu.synchronize()
    with torch.npu.graph(g):
        out = fn(*args)
    return g, out


def test_mlp_forward_replay_equals_eager_with_changing_inputs() -> None:
    """Replaying a captured MLP forward after copying new inputs gives the eager output."""
    model = _mlp()
    static_x = torch.randn(4, 16, device="npu")
    with torch.no_grad():
        g, static_y = _capture(model, static_x)
        for step in range(3):
            x = torch.randn(4, 16, device="npu") + step
            static_x.copy_(x)
            g.replay()
            torch.npu.synchronize()
            torch.testing.assert_close(static_y.cpu(), model(x).cpu())
    assert g.num_tasks() > 0


def test_capture_records_instead_of_running() -> None:
    """Work issued during capture does not run until replay."""
    x = torch.ones(8, device="npu")
    g, y = _capture(lambda t: t.mul_(3).add(1), x)
    torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.ones(8))  # the in-place mul_ was recorded, not run
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.full((8,), 3.0))
    assert torch.equal(y.cpu(), torch.full((8,), 4.0))


@pytest.mark.asynchronous
def test_replay_is_asynchronous_to_the_host() -> None:
    """replay() returns while the captured work is still pending on the stream."""
    src = torch.randn(64 * 1024, device="npu")
    dst = torch.empty_like(src)
    with npusim.timing.model(copy_gbps=0.5, realtime=True):  # 256 KiB copy: about 0.5 ms of device time
        g, _ = _capture(lambda: dst.copy_(src))
        g.replay()
        assert torch.npu.current_stream().pending() == 1
        torch.npu.synchronize()
    assert torch.equal(dst.cpu(), src.cpu())


def test_pool_fixed_addresses_and_no_growth_over_100_replays() -> None:
    """Outputs keep their addresses and device memory does not grow across 100 replays."""
    model = _mlp()
    static_x = torch.randn(4, 16, device="npu")
    with torch.no_grad():
        g, static_y = _capture(model, static_x)
    ptr = static_y.data_ptr()
    g.replay()
    torch.npu.synchronize()
    allocated, reserved = torch.npu.memory_allocated(), torch.npu.memory_reserved()
    for _ in range(100):
        g.replay()
    torch.npu.synchronize()
    assert static_y.data_ptr() == ptr
    assert torch.npu.memory_allocated() == allocated
    assert torch.npu.memory_reserved() == reserved


def test_graphs_share_a_pool_by_handle() -> None:
    """Graphs captured with one pool handle report that pool; a graph's own pool is distinct."""
    handle = torch.npu.graph_pool_handle()
    x = torch.randn(8, device="npu")
    g1, g2, g3 = torch.npu.NPUGraph(), torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(g1, pool=handle):
        a = x * 2
    with torch.npu.graph(g2, pool=g1.pool()):
        b = a + 1
    with torch.npu.graph(g3):
        c = x - 1
    assert g1.pool() == g2.pool() == handle
    assert g3.pool() != handle
    for g in (g1, g2, g3):
        g.replay()
    torch.npu.synchronize()
    torch.testing.assert_close(b.cpu(), x.cpu() * 2 + 1)
    torch.testing.assert_close(c.cpu(), x.cpu() - 1)


def test_static_output_outlives_reset() -> None:
    """A static output stays valid after its graph is reset (the pool block is shared)."""
    x = torch.arange(6.0, device="npu")
    g, y = _capture(lambda t: t * 10, x)
    g.replay()
    g.reset()
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), torch.arange(6.0) * 10)
    with pytest.raises(RuntimeError, match="has not been captured"):
        g.replay()


def test_make_graphed_callables_training_step_equals_eager() -> None:
    """A training loop over a graphed MLP gives eager's losses and parameters."""
    eager = _mlp()
    graphed_model = copy.deepcopy(eager)
    sample = torch.randn(4, 16, device="npu", requires_grad=True)
    graphed = torch.npu.make_graphed_callables(graphed_model, (sample,))
    assert graphed is graphed_model
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(graphed_model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 16, device="npu") * (step + 1)
        target = torch.randn(4, 8, device="npu")
        losses = []
        for model, opt in ((eager, opt_e), (graphed, opt_g)):
            opt.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            loss = nn.functional.mse_loss(model(xi), target)
            loss.backward()
            opt.step()
            losses.append((loss.item(), xi.grad.cpu()))
        assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-5)
        torch.testing.assert_close(losses[0][1], losses[1][1])
    for pe, pg in zip(eager.parameters(), graphed_model.parameters(), strict=True):
        torch.testing.assert_close(pe.cpu(), pg.cpu())


def test_graphed_callable_refuses_other_arguments_than_its_samples() -> None:
    """A graphed callable takes as many tensors as its sample_args; another count is a clear error, and the
    graph's static input is left as it was."""
    sample = torch.randn(4, 16, device="npu", requires_grad=True)
    graphed = torch.npu.make_graphed_callables(_mlp(), (sample,))
    before = sample.detach().cpu()
    x = torch.randn(4, 16, device="npu")
    with pytest.raises(TypeError, match=r"make_graphed_callables takes the 1 tensors of its sample_args, got 2"):
        graphed(x, x)
    assert torch.equal(sample.detach().cpu(), before)
    assert torch.equal(graphed(x).cpu(), _mlp().cpu()(x.cpu()))  # later calls work


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


def test_graphed_callable_gives_an_unused_output_a_zero_gradient() -> None:
    """An output the loss leaves out gets a zero gradient in the backward replay, as autograd.Function's
    materialized zeros: not the gradient a previous step left in the static buffer."""
    eager = _TwoHeads().to("npu")
    graphed = torch.npu.make_graphed_callables(copy.deepcopy(eager), (torch.randn(4, 16, device="npu"),))
    x = torch.randn(4, 16, device="npu")
    for loss_of in (lambda a, b: (a * b).sum(), lambda a, b: a.square().sum()):
        grads = []
        for model in (eager, graphed):
            model.zero_grad(set_to_none=True)
            loss_of(*model(x)).backward()
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()])
        for e, g in zip(*grads, strict=True):
            torch.testing.assert_close(g.cpu(), e.cpu())


def test_graphed_callable_node_is_differentiable_once() -> None:
    """The step's node is GraphedBackward; its input gradients equal eager's, and differentiating them again
    raises @once_differentiable's error."""
    eager = _mlp()
    graphed = torch.npu.make_graphed_callables(copy.deepcopy(eager), (torch.randn(4, 16, device="npu",
                                                                                 requires_grad=True),))
    x = torch.randn(4, 16, device="npu", requires_grad=True)
    y = graphed(x)
    assert y.grad_fn.name() == "GraphedBackward"
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    (ex,) = torch.autograd.grad(eager(x).square().sum(), x)
    torch.testing.assert_close(gx.cpu(), ex.cpu())
    with pytest.raises(RuntimeError, match="trying to differentiate twice a function that was marked with "
                                           "@once_differentiable"):
        gx.sum().backward()


def test_an_error_in_a_graphed_backward_reaches_the_caller_as_itself() -> None:
    """The step's node runs the backward in Python on autograd's thread: its exception is backward()'s."""
    sample = torch.randn(4, 16, device="npu", requires_grad=True)
    graphed = torch.npu.make_graphed_callables(lambda t: t * 2, (sample,))
    captured = dict(zip(graphed.__code__.co_freevars, (c.cell_contents for c in graphed.__closure__),
                        strict=True))["captured"]
    y = graphed(torch.randn(4, 16, device="npu", requires_grad=True))
    captured.bwd.reset()
    with pytest.raises(RuntimeError, match="has not been captured"):
        y.sum().backward()


def test_graphed_callable_outputs_without_grad_mode_and_of_integer_dtype() -> None:
    """Under no_grad a graphed callable's outputs have no node; an integer output never requires grad, while
    the floating one beside it does and its gradient reaches the input."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 8).to("npu")

    def scores_and_best(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = lin(t)
        return y, y.argmax(dim=1)

    graphed = torch.npu.make_graphed_callables(scores_and_best, (torch.randn(4, 16, device="npu",
                                                                             requires_grad=True),))
    x = torch.randn(4, 16, device="npu", requires_grad=True)
    with torch.no_grad():
        y, best = graphed(x)
    assert y.grad_fn is None and not y.requires_grad
    y, best = graphed(x)
    assert y.requires_grad and not best.requires_grad and best.dtype == torch.int64
    assert torch.equal(best.cpu(), lin(x).argmax(dim=1).cpu())
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), lin.weight.sum(0).expand(4, 16).detach().cpu())


def test_graphed_callable_refuses_tangents_and_functorch_transforms() -> None:
    """A graphed callable has no jvp and replays fixed tensors: a dual input and a call inside vmap are
    clear errors, and the graph's static input is left as it was."""
    sample = torch.randn(4, 16, device="npu", requires_grad=True)
    graphed = torch.npu.make_graphed_callables(_mlp(), (sample,))
    before = sample.detach().cpu()
    x = torch.randn(4, 16, device="npu")
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = fwad.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match="has no forward-mode AD formula, but input 0 has a tangent"):
            graphed(dual)
    with pytest.raises(RuntimeError, match="cannot run inside a functorch transform"):
        torch.func.vmap(graphed)(torch.randn(2, 4, 16, device="npu"))
    torch.npu.synchronize()
    assert torch.equal(sample.detach().cpu(), before)


@pytest.mark.parametrize("call", [
    pytest.param(lambda t: torch.npu.synchronize(), id="synchronize"),
    pytest.param(lambda t: torch.npu.current_stream().synchronize(), id="stream-synchronize"),
    pytest.param(lambda t: t.sum().item(), id="item"),
    pytest.param(lambda t: t.cpu(), id="cpu"),
    pytest.param(lambda t: t.copy_(torch.ones(4)), id="blocking-h2d"),
])
def test_host_waits_during_capture_raise_and_leave_it_valid(call) -> None:  # noqa: ANN001
    """Host synchronization and host reads during capture raise CUDA's error and, as on the NPU (torch_npu's
    test_aclgraph_pin_memory), the capture goes on: it ends and replays what was captured around the call."""
    x = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        g.capture_begin()
        assert torch.npu.is_current_stream_capturing()
        x.add_(1)
        with pytest.raises(RuntimeError, match=NOT_PERMITTED):
            call(x)
        x.mul_(3)
        g.capture_end()
    assert not torch.npu.is_current_stream_capturing()
    torch.npu.current_stream().wait_stream(s)
    g.replay()
    torch.npu.synchronize()
    assert x.tolist() == [6.0] * 4  # (1 + 1) * 3: the refused call captured nothing


def test_capture_errors_name_the_problem() -> None:
    """Default-stream capture and data-dependent shapes are rejected with clear errors."""
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    x = torch.tensor([0.0, 1.0, 2.0], device="npu")
    with pytest.raises(RuntimeError, match="nonzero cannot be captured"), torch.npu.graph(g):
        torch.nonzero(x)
    assert not torch.npu.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="has not been captured"):
        g.replay()


def test_ops_that_resize_an_empty_result_are_captured() -> None:
    """abs and angle hand an empty result to their out= form, which resizes it: captured from the graph's pool,
    replayed over new inputs as eager computes them."""
    x = torch.randn(16, device="npu")
    g, (a, b) = _capture(lambda t: (t.abs(), torch.angle(t)), x)
    for step in range(2):
        x.copy_(torch.randn(16) - step)
        g.replay()
        torch.npu.synchronize()
        assert torch.equal(a.cpu(), x.cpu().abs())
        assert torch.equal(b.cpu(), torch.angle(x.cpu()))


def test_replays_write_matmul_and_reduction_results_in_place() -> None:
    """A captured op with an out= form replays into the graph's output as its eager task does, no fresh result
    copied there (Note [Unboxed fallback kernels]), and so does relu (Note [A functional op's results in place]);
    native_layer_norm, whose CPU kernel is no out= kernel's, still copies its three results."""
    torch.manual_seed(0)
    a, w, b = torch.randn(8, 16, device="npu"), torch.randn(16, 16, device="npu"), torch.randn(16, device="npu")

    def step(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.addmm(b, a, w.t())
        z = y.mm(w)
        return y, z, z.sum(0), y.relu(), torch.nn.functional.layer_norm(y, (16,))

    g, outs = _capture(step, a, w, b)
    a.copy_(torch.randn(8, 16))
    copied = acl.results_copied_into_place()
    g.replay()
    torch.npu.synchronize()
    assert acl.results_copied_into_place() - copied == 3  # native_layer_norm's output, mean and rstd
    for got, want in zip(outs, step(a.cpu(), w.cpu(), b.cpu()), strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_capture_refuses_growing_an_output_that_holds_bytes() -> None:
    """Growing a non-empty out= argument would record a copy of freed bytes: refused, the output untouched."""
    x = torch.randn(16, device="npu")
    out = torch.full((4,), 7.0, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=r"aten::abs.out grows its output argument from \[4\] to \[16\]"), \
            torch.npu.graph(g):
        torch.abs(x, out=out)
    assert not torch.npu.is_current_stream_capturing()
    torch.npu.synchronize()
    assert out.tolist() == [7.0] * 4


@pytest.mark.parametrize("op", [
    pytest.param(lambda a, b: a.add(b), id="unboxed-add"),
    pytest.param(lambda a, b: torch.cat([a, b]), id="boxed-cat"),
])
def test_capture_keeps_the_device_rules_of_eager(op) -> None:  # noqa: ANN001
    """An op mixing npu:0 and npu:1 (or a CPU tensor that is no scalar) raises in a capture as it does eagerly."""
    a = torch.ones(4, device="npu:0")
    for other in (torch.ones(4, device="npu:1"), torch.ones(4)):
        with pytest.raises(RuntimeError, match=MIXED) as eager:
            op(a, other)
        g = torch.npu.NPUGraph()
        torch.npu.synchronize()
        with pytest.raises(RuntimeError, match=MIXED) as captured, torch.npu.graph(g):
            op(a, other)
        assert str(captured.value).split("\n")[0] == str(eager.value).split("\n")[0]
    a.add_(1)  # the device still works after the refused captures
    assert torch.equal(a.cpu(), torch.full((4,), 2.0))


def test_accelerator_graph_routes_to_npu() -> None:
    """torch.accelerator.Graph captures and replays npu work."""
    x = torch.arange(4.0, device="npu")
    g = torch.accelerator.Graph()
    with torch.npu.stream(torch.npu.Stream()), g:
        y = x + 5
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), torch.arange(4.0) + 5)
    assert isinstance(g.pool(), tuple)


def _capture_all_reduce(rank: int, world: int) -> str:
    import torch.distributed as dist

    t = torch.full((4,), rank + 1.0, device="npu")
    g = torch.npu.NPUGraph()
    try:
        with torch.npu.graph(g):
            dist.all_reduce(t)
    except RuntimeError as e:
        message = str(e)
    else:
        message = "captured"
    dist.all_reduce(t)  # the group still works after the refused capture
    assert torch.equal(t.cpu(), torch.full((4,), 3.0))
    return message


def test_collectives_during_capture_are_refused() -> None:
    """A collective on a capturing stream raises before anything is issued; the group stays usable."""
    messages = run_ranks(_capture_all_reduce, timeout=90.0)
    assert all("collectives cannot be captured" in m for m in messages), messages


# ---- the graph-tree replay input copy (review section 5.4) -------------------

class _GraphTreeStep:
    """A captured f(a, b) with static input buffers, run the way torch-npu's graph
    tree does: copy the new inputs in with one _foreach_copy_, then replay."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.static = [torch.zeros(shape, device="npu"), torch.zeros(shape, device="npu")]
        self.graph = torch.npu.NPUGraph()
        torch.npu.synchronize()
        with torch.npu.graph(self.graph):
            self.out = self.fn(*self.static)

    @staticmethod
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a) * b + a

    def copy_inputs(self, inputs: list[torch.Tensor]) -> None:
        torch._foreach_copy_(self.static, inputs)


def _new_inputs(shape: tuple[int, ...], step: int) -> list[torch.Tensor]:
    torch.manual_seed(step)
    return [torch.randn(shape, device="npu") + step, torch.randn(shape, device="npu")]


def test_graph_tree_input_copy_fast_route_equals_eager() -> None:
    """The batched input copy takes the fast route (non_blocking passed down True) and replays match eager."""
    tree = _GraphTreeStep((8, 8))
    for step in range(4):
        inputs = _new_inputs((8, 8), step)
        with trace_foreach_copy() as calls:
            tree.copy_inputs(inputs)
        assert [g.route for g in calls[0].groups] == ["fast"]
        assert calls[0].groups[0].non_blocking is True and calls[0].non_blocking is False
        tree.graph.replay()
        torch.npu.synchronize()
        torch.testing.assert_close(tree.out.cpu(), tree.fn(*inputs).cpu())


@pytest.mark.asynchronous
def test_graph_tree_slow_copy_same_stream_is_ordered() -> None:
    """With copies slowed by the timing model, a replay on the copy's stream reads the new inputs."""
    shape = (64, 64)  # 16 KiB per input
    tree = _GraphTreeStep(shape)
    with npusim.timing.model(copy_gbps=0.0002, realtime=True):  # ~80 ms per input copy
        for step in range(2):
            inputs = _new_inputs(shape, step + 1)
            tree.copy_inputs(inputs)
            assert torch.npu.current_stream().pending() > 0  # the copy is still in flight
            tree.graph.replay()
            torch.npu.synchronize()
            torch.testing.assert_close(tree.out.cpu(), tree.fn(*inputs).cpu())


@pytest.mark.asynchronous
def test_graph_tree_copy_on_other_stream_races_without_wait() -> None:
    """A copy on another stream without a wait is raced by the replay (stale inputs); wait_stream fixes it."""
    shape = (64, 64)
    tree = _GraphTreeStep(shape)
    old = _new_inputs(shape, 1)
    tree.copy_inputs(old)
    torch.npu.synchronize()
    copy_stream = torch.npu.Stream()
    replay_stream = torch.npu.current_stream()
    with npusim.timing.model(copy_gbps=0.0002, realtime=True):
        new = _new_inputs(shape, 2)
        copy_stream.wait_stream(replay_stream)  # the new inputs were written on the replay stream
        with torch.npu.stream(copy_stream):
            tree.copy_inputs(new)
        tree.graph.replay()  # no wait: the replay runs before the slow copy lands
        torch.npu.synchronize()
        torch.testing.assert_close(tree.out.cpu(), tree.fn(*old).cpu())
        assert not torch.allclose(tree.out.cpu(), tree.fn(*new).cpu())

        newer = _new_inputs(shape, 3)
        copy_stream.wait_stream(replay_stream)
        with torch.npu.stream(copy_stream):
            tree.copy_inputs(newer)
        replay_stream.wait_stream(copy_stream)  # the documented wait
        tree.graph.replay()
        torch.npu.synchronize()
        torch.testing.assert_close(tree.out.cpu(), tree.fn(*newer).cpu())
