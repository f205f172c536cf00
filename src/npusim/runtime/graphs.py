"""NPU graphs of the ``torch.npu`` module: capture and replay of device work.

The names and contracts are torch.cuda's (``CUDAGraph``, ``graph``,
``graph_pool_handle``, ``is_current_stream_capturing``,
``make_graphed_callables``); the machinery is the device core's (see Note [NPU
graph capture] and Note [NPU graph memory] in ``csrc/graph/graph.cpp``). What can
be captured: device copies, ``_foreach_copy_`` (every route that does not wait on
the host), batched async memcpy, compute (the stream tasks of the compute ops
and of inductor's compiled kernels; ops whose output shape depends on data
cannot be captured), random ops (Note
[Graph-safe Philox state]), and work on other streams that wait on the capturing
one (Note [Multi-stream capture]). Host waits, host reads and queries of
captured streams and events raise CUDA's errors (Note [Capture-time
refusals]); collectives raise.

Note [Replay input copy ordering]
The graph-tree pattern (torch-npu's ``_graph_tree.py``) copies new inputs into
a graph's static buffers with one ``torch._foreach_copy_`` and then replays.
The copy takes the asynchronous fast route, so it is ordered before the replay
only by the stream: issue both on one stream (the usual case), or make the
replay stream wait for the copy stream (``replay_stream.wait_stream(copy_stream)``)
when they differ; without the wait the replay may read the old inputs.
``tests/test_graphs.py`` shows both.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._functorch import utils as _functorch_utils
from torch.utils import _pytree as pytree

from npusim.runtime import acl
from npusim.runtime.device import synchronize
from npusim.runtime.memory import empty_cache
from npusim.runtime.streams import Stream, current_stream
from npusim.runtime.streams import stream as stream_context

PoolHandle = tuple[int, int]
_CAPTURE_MODES = ("default", "global", "thread_local", "relaxed")

# fn(what, graph) on the calling thread after an NPUGraph's "capture_begin", "capture_end" (also one
# that raised), "reset" and "replay"; the sanitizer's (Note [Sanitizer and npu graphs] in
# sanitizer/graph_record.py). None: no observer.
_observer: Callable[[str, NPUGraph], None] | None = None


def set_graph_observer(fn: Callable[[str, NPUGraph], None] | None) -> None:
    global _observer
    _observer = fn


def _notify(what: str, graph: NPUGraph) -> None:
    if _observer is not None:
        _observer(what, graph)


def is_current_stream_capturing() -> bool:
    """True while an npu graph captures the current stream of the current device."""
    s = current_stream()
    return acl.stream_is_capturing(s.stream_id, s.device_index)


def graph_pool_handle() -> PoolHandle:
    """An opaque id of a graph memory pool that several captures may share."""
    return acl.graph_pool_handle()


class NPUGraph(acl.NpuGraph):
    """A captured sequence of npu work that ``replay()`` runs again.

    ``capture_begin`` starts recording the current stream (which must not be
    the default stream); streams that wait on it join the capture and must be
    joined back before ``capture_end`` (see Note [Multi-stream capture]).
    ``replay`` enqueues the graph on the current stream and returns at once.
    Outputs and temporaries of the capture live in the graph's pool at fixed
    addresses; random ops draw fresh numbers on every replay (Note [Graph-safe
    Philox state]). ``keep_graph`` is accepted for torch.cuda parity: the graph
    is always kept and ``instantiate`` has nothing to do.
    """

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__()
        self.keep_graph = keep_graph

    def capture_begin(self, pool: PoolHandle | None = None, capture_error_mode: str = "global") -> None:
        """Begins capturing the current stream into this graph (sharing ``pool`` when given).

        ``capture_error_mode`` is CUDA's: which threads' host queries and waits on other
        streams and events the capture refuses ("global": every thread's, "thread_local":
        this thread's, "relaxed": none). See Note [Capture-time refusals].
        """
        if capture_error_mode not in _CAPTURE_MODES:
            raise ValueError(f"NPUGraph.capture_begin: capture_error_mode must be one of {_CAPTURE_MODES}, "
                             f"got {capture_error_mode!r}")
        super().capture_begin(tuple(pool) if pool is not None else (0, 0), capture_error_mode)
        _notify("capture_begin", self)

    def capture_end(self) -> None:
        """Ends the capture; raises if a forbidden call invalidated it or a joined stream has unjoined work."""
        try:
            super().capture_end()
        finally:
            _notify("capture_end", self)

    def instantiate(self) -> None:
        if not self.captured():
            raise RuntimeError("NPUGraph.instantiate: the graph has not been captured")

    def replay(self) -> None:
        """Enqueues the captured work on the current stream (asynchronous to the host)."""
        super().replay()
        _notify("replay", self)

    def reset(self) -> None:
        """Drops the captured work and this graph's hold on its pool."""
        super().reset()
        _notify("reset", self)

    def pool(self) -> PoolHandle:
        """The id of this graph's pool, for another graph's ``capture_begin(pool=...)``."""
        return super().pool()

    def num_tasks(self) -> int:
        """How many recorded nodes (ops, copies, event records and waits) the graph's lanes hold."""
        return super().num_tasks()

    def replay_levels(self) -> list[int]:
        """npusim's own: how many of the graph's tasks sit at each depth of the DAG of what they read and
        write (tasks of one depth are independent; a replay may run them at once), or ``[]`` when a replay
        runs the tasks in capture order (Note [Replaying independent tasks at once])."""
        return super().replay_levels()

    def enable_debug_mode(self) -> None:
        """Makes :meth:`debug_dump` write the captured lanes."""
        super().enable_debug_mode()

    def debug_dump(self, debug_path: str) -> None:
        """Writes the captured tasks, one line each with its lane and stream; as CUDA, only warns
        without :meth:`enable_debug_mode`."""
        super().debug_dump(debug_path)

    def register_generator_state(self, generator: torch.Generator) -> None:
        """Makes each replay prepare ``generator``'s Philox state (an npu generator, or the state
        ``graphsafe_get_state`` returned), as torch.cuda.CUDAGraph's. A generator used during the
        capture registers itself anyway."""
        super().register_generator_state(generator)

    @staticmethod
    def get_currently_capturing_graph() -> NPUGraph:
        """The graph capturing the current stream; raises when none is (torch.cuda's errors), and, as
        torch_npu, when the capture is a ``torch.accelerator.Graph``'s (that graph is no NPUGraph)."""
        graph = acl.NpuGraph.get_currently_capturing_graph()
        # Every NPUGraph is this class; the device core's own graph behind torch.accelerator.Graph is not.
        if not isinstance(graph, NPUGraph):
            raise RuntimeError("torch.npu.NPUGraph.get_currently_capturing_graph() is not supported during "
                               f"torch.accelerator.Graph capture (the current stream of npu:{acl.current_device()} "
                               "is captured by a torch.accelerator.Graph, not by a torch.npu.NPUGraph)")
        return graph


class graph:  # noqa: N801  (mirrors torch.cuda.graph)
    """Context manager that captures the npu work of its block into ``npu_graph``.

    As torch.cuda.graph: synchronizes the device and empties the cache on
    entry, makes ``stream`` (by default one side stream shared by all
    captures) current for the block, and ends the capture on exit.
    """

    default_capture_stream: Stream | None = None

    def __init__(self, npu_graph: NPUGraph, pool: PoolHandle | None = None, stream: Stream | None = None,
                 capture_error_mode: str = "global") -> None:
        if stream is None and graph.default_capture_stream is None:
            graph.default_capture_stream = Stream()
        self.capture_stream = stream if stream is not None else graph.default_capture_stream
        self.pool = pool
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = stream_context(self.capture_stream)

    def __enter__(self) -> None:
        synchronize()
        if torch.compiler.config.force_cudagraph_gc:  # as torch.cuda.graph: collecting is costly
            gc.collect()
        empty_cache()
        self._stream_ctx.__enter__()
        try:
            self.npu_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.npu_graph.capture_end()
            else:
                self.npu_graph.reset()  # the block raised: leave the stream uncaptured
        finally:
            self._stream_ctx.__exit__(None, None, None)


# ---- make_graphed_callables -------------------------------------------------

_Callable = torch.nn.Module | Callable[..., Any]


class _Captured:
    """One callable's forward and backward graphs and their static tensors."""

    def __init__(self, func: _Callable, sample_args: tuple[Any, ...]) -> None:
        self.func = func
        self.sample_args = sample_args
        self.user_inputs = tuple(pytree.arg_tree_leaves(*sample_args))
        if not all(isinstance(a, torch.Tensor) for a in self.user_inputs):
            raise TypeError("make_graphed_callables: sample_args must contain only Tensors")
        self.params = tuple(func.parameters()) if isinstance(func, torch.nn.Module) else ()
        self.inputs = self.user_inputs + self.params  # everything the graphs read
        self.fwd = NPUGraph()
        self.bwd = NPUGraph()
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.out_spec: pytree.TreeSpec | None = None
        self.grad_outputs: tuple[torch.Tensor | None, ...] = ()
        self.grad_inputs: tuple[torch.Tensor | None, ...] = ()

    def grads(self, outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor],
              allow_unused: bool) -> tuple[torch.Tensor | None, ...]:
        wanted = tuple(i for i in self.inputs if i.requires_grad)
        differentiable = tuple(o for o in outputs if o.requires_grad)
        if not differentiable or not wanted:
            return ()
        return torch.autograd.grad(differentiable, wanted, grad_outputs=tuple(grad_outputs), only_inputs=True,
                                   allow_unused=allow_unused)

    def capture_forward(self, pool: PoolHandle) -> None:
        with graph(self.fwd, pool=pool):
            out = self.func(*self.sample_args)
        flat, self.out_spec = pytree.tree_flatten(out)
        self.outputs = tuple(flat)

    def capture_backward(self, pool: PoolHandle, allow_unused: bool) -> None:
        self.grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in self.outputs)
        grads: tuple[torch.Tensor | None, ...] = ()
        if any(o.requires_grad for o in self.outputs):
            with graph(self.bwd, pool=pool):
                grads = self.grads(self.outputs, [g for g in self.grad_outputs if g is not None], allow_unused)
        it = iter(grads)
        # One slot per input: None where the input needs no gradient.
        self.grad_inputs = tuple(next(it, None) if i.requires_grad else None for i in self.inputs)
        # Drop the captured autograd graph: it holds the parameters' AccumulateGrad
        # nodes, created on the capture stream, which eager backward would reuse.
        self.outputs = tuple(o.detach() for o in self.outputs)

    def backward(self, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """One gradient (or None) per input for the outputs' ``grads``: the step's node calls it on autograd's
        thread with grad mode off (Note [A graphed step without autograd.Function])."""
        for static, grad in zip(self.grad_outputs, grads, strict=True):
            if static is None:
                continue
            if grad is None:
                static.zero_()  # autograd.Function materializes a missing gradient as zeros
            elif static.data_ptr() != grad.data_ptr():
                static.copy_(grad)
        self.bwd.replay()
        return tuple(g.detach() if g is not None else None for g in self.grad_inputs)

    def function(self) -> Callable[..., Any]:
        captured = self
        # The copies, the forward replay and the autograd node in one call: Note [A graphed step without
        # autograd.Function]. Only user arguments can be new tensors; parameters are the captured ones.
        step = acl.GraphedStep(self.fwd, list(self.user_inputs), list(self.params), list(self.outputs),
                               self.backward)
        one_output = self.out_spec is not None and self.out_spec.is_leaf()
        user_count = len(self.user_inputs)

        def graphed(*user_args: Any) -> Any:
            # Tensors only (the common call) are their own leaves: no pytree walk per step.
            flat = user_args if all(type(a) is torch.Tensor for a in user_args) else tuple(
                pytree.arg_tree_leaves(*user_args))
            if len(flat) != user_count:
                raise TypeError(f"a callable of make_graphed_callables takes the {user_count} "
                                f"tensors of its sample_args, got {len(flat)}")
            if torch._C._are_functorch_transforms_active():
                raise RuntimeError("make_graphed_callables: a graphed callable cannot run inside a functorch "
                                   "transform (vmap, grad, jvp, ...): its graphs replay fixed tensors")
            outputs = step(_functorch_utils.unwrap_dead_wrappers(flat))
            _notify("replay", captured.fwd)
            return outputs[0] if one_output else pytree.tree_unflatten(outputs, captured.out_spec)

        return graphed


def _check_callable(func: _Callable) -> None:
    if isinstance(func, torch.nn.Module):
        if func._forward_hooks or func._forward_pre_hooks or func._backward_hooks:
            raise ValueError("make_graphed_callables: modules must not have hooks registered when they are "
                             "passed (hooks may be added afterwards)")
        if any(b.requires_grad for b in func.buffers()):
            raise ValueError("make_graphed_callables: only parameters may require grad; found a buffer with "
                             "requires_grad=True")


def make_graphed_callables(callables: _Callable | tuple[_Callable, ...], sample_args: tuple[Any, ...],
                           num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool: PoolHandle | None = None) -> Any:
    """Graphed versions of ``callables``, with torch.cuda.make_graphed_callables' contract.

    Each returned callable replays its forward graph inside one autograd node
    whose backward replays the backward graph. Captures share one pool, forward
    graphs in the order given and backward graphs in reverse, so call them in
    that order. Modules keep their parameters; user arguments are copied into
    the static inputs when they are other tensors.
    """
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast cache; "
                           "use autocast(cache_enabled=False)")
    single = not isinstance(callables, tuple)
    funcs = (callables,) if single else callables
    args_per_func = (sample_args,) if single else sample_args
    if len(funcs) != len(args_per_func):
        raise ValueError(f"make_graphed_callables: {len(funcs)} callables but {len(args_per_func)} sample_args")
    for func in funcs:
        _check_callable(func)
    captured = [_Captured(f, tuple(a)) for f, a in zip(funcs, args_per_func, strict=True)]
    mempool = graph_pool_handle() if pool is None else pool

    # Warm up on a side stream so that lazy initialisation is not captured.
    synchronize()
    with stream_context(Stream()):
        for c in captured:
            for _ in range(num_warmup_iters):
                outs = pytree.tree_leaves(c.func(*c.sample_args))
                c.grads(outs, [torch.empty_like(o) for o in outs if o.requires_grad], allow_unused_input)
            del outs
    synchronize()

    for c in captured:
        c.capture_forward(mempool)
    for c in reversed(captured):
        c.capture_backward(mempool, allow_unused_input)

    graphed = []
    for c in captured:
        fn = c.function()
        if isinstance(c.func, torch.nn.Module):
            module = c.func

            def forward(*args: Any, _fn: Callable[..., Any] = fn, _module: torch.nn.Module = module,
                        _eager: Callable[..., Any] = module.forward, _training: bool = module.training) -> Any:
                # As torch.cuda: the graphs stand for the captured mode's forward; the other runs eagerly.
                return _fn(*args) if _module.training == _training else _eager(*args)

            module.forward = forward  # type: ignore[method-assign]
            graphed.append(module)
        else:
            graphed.append(fn)
    return graphed[0] if single else tuple(graphed)

