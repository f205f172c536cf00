"""npu graph trees: what ``torch.compile(mode="reduce-overhead")`` replays on the npu.

Inductor's graph trees (``torch._inductor.cudagraph_trees``) drive ``torch.cuda``
and the CUDA caching allocator by name, so npusim keeps a tree of its own, as
torch_npu does (``torch_npu/npu/_graph_tree.py``): the same contract, written for
npu graphs. Inductor hands it each compiled forward and backward through the
policy of :mod:`npusim.compile.graph_policy`; ``python -m npusim run`` gives it to
scripts as ``torch_npu.npu._graph_tree``.

Note [npu graph trees]
----------------------
One tree per device (:class:`NPUGraphTreeManager`, in the thread-local state
that autograd carries to its worker threads, as CUDA's), whose graphs all
record into one memory pool. A compiled function's first call runs eagerly
(the warm-up run: lazy initialisation and the first allocations happen
outside any capture); its second records an npu graph on the tree's stream
(capture_error_mode ``thread_local``, as CUDA's trees) and replays it once
for that call's result; later calls replay it. Each recorded graph is a node
whose parent is the node run before it in the same step (a backward is its
forward's child), and a node is found again by its function, its inputs'
shapes and the integer inputs: new shapes record a new node (re-recording).
A new step, and so a walk back to the root, starts with each new
torch.compile invocation unless a forward's backward is still pending
(CUDA's generations; ``torch.compiler.cudagraph_mark_step_begin()`` forces
one); two forwards before their backwards therefore record two nodes, whose
outputs do not overwrite each other.

Inputs: parameters, buffers and constants (inductor's static inputs) and
outputs of the graphs on the path to the node (saved activations in the
backward) are read in place; every other tensor input is copied into the
node's static buffer before each replay, all of them with ONE
``torch._foreach_copy_`` (the fast route: the design review's section 5.4), on
the current stream, which the replay then follows. A node whose parameters
moved (a new address) records again. Outputs are new tensors over the node's
static output memory on each call (never the static tensors themselves), so a
replay overwrites what the previous replay of that node returned; when a new
step starts, the live outputs of the previous step's path are invalidated, and
reading one raises CUDA's "accessing tensor output of CUDAGraphs that has been
overwritten by a subsequent run" (clone what must outlive the step).

Not done, each runs eagerly with a logged reason, as CUDA's trees skip: a
graph that mutates a non-static input, an input that is neither dense nor
non-overlapping, more than ``cudagraph_unexpected_rerecord_limit`` recordings of
one function. Unlike CUDA's, the pool's blocks are not reused between the
tree's graphs (Note [NPU graph memory]), so no pool state is checkpointed.

The pool can be inspected as CUDA's trees inspect theirs: get_npugraph_segments
and get_block_addrs read the allocator's snapshot, check_memory_pool compares the
pool's allocated blocks with the storages expected live (the allocator's own
count first, the snapshot only to name the difference), and
_use_npu_memory_pool_manager routes a block of allocations into the pool. CUDA's
trees call the check only under their debug asserts; this tree does not call it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any

import torch
from torch._dynamo.mutation_guard import GenerationTracker
from torch._inductor import config
from torch._inductor.cudagraph_trees import (
    AliasesNewOutput,
    AliasesPriorGraphOutput,
    CompilationMode,
    ExecutionState,
    GraphID,
    MarkStepBox,
    OutputAliasInfo,
    StorageWeakRefWrapper,
    UnaliasedStorage,
    format_tb,
)
from torch._inductor.cudagraph_utils import FunctionID, WrappedFunction, log_cudagraph_skip_and_bump_counter
from torch._prims_common import is_non_overlapping_and_dense_or_false

from npusim.runtime import acl, graphs, memory
from npusim.runtime.streams import Stream, current_stream
from npusim.runtime.streams import stream as stream_context

__all__ = [
    "AliasesNewOutput", "AliasesPriorGraphOutput", "CompilationMode", "ExecutionState", "FunctionID", "GraphID",
    "NPUGraphNode", "NPUGraphTreeManager", "NPUWarmupNode", "OutputAliasInfo", "StorageWeakRefWrapper",
    "TreeManagerContainer", "UnaliasedStorage", "WrappedFunction", "check_memory_pool", "clear_cublas_manager",
    "clear_cublass_cache", "disable_conv_cache_emptying", "enable_history_recording", "format_tb", "get_block_addrs",
    "get_container", "get_history_recording", "get_manager", "get_npugraph_segments", "local", "npugraphified",
    "npugraphify", "npugraphify_impl", "reset_npugraph_trees",
]

log = logging.getLogger(__name__)

ModelType = Callable[[list[Any]], Sequence[Any]]

OVERWRITTEN = ("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run "
               "(an npu graph of torch.compile(mode='reduce-overhead') on {device} replayed over it). To prevent "
               "overwriting, clone the tensor outside of torch.compile() or call "
               "torch.compiler.cudagraph_mark_step_begin() before each model invocation.")


# ---- what CUDA's trees clear or record around a recording -------------------------------

def clear_cublass_cache() -> None:
    """CUDA's trees free cuBLAS workspaces before recording; npu matmuls run PyTorch's CPU kernels and keep none."""


@contextlib.contextmanager
def clear_cublas_manager() -> Generator[None, None, None]:
    """Around a recording, as CUDA's: nothing to clear on the npu (see :func:`clear_cublass_cache`)."""
    clear_cublass_cache()
    try:
        yield
    finally:
        clear_cublass_cache()


@contextlib.contextmanager
def disable_conv_cache_emptying() -> Generator[None, None, None]:
    """CUDA's trees stop cuDNN's benchmark from emptying the cache; the npu has no cuDNN benchmark."""
    yield


@contextlib.contextmanager
def enable_history_recording() -> Generator[None, None, None]:
    """Records the allocator's history (``torch.npu.memory._record_memory_history``) inside the block unless
    it already is, and stops it after only then, as CUDA's trees do around a recording."""
    enabled = memory._npu_isHistoryEnabled()
    try:
        if not enabled:
            torch.npu.memory._record_memory_history()
        yield
    finally:
        if not enabled:
            torch.npu.memory._record_memory_history(None)


def get_history_recording() -> contextlib.AbstractContextManager[None]:
    """:func:`enable_history_recording` when ``config.triton.cudagraph_trees_history_recording`` asks for it."""
    if not config.triton.cudagraph_trees_history_recording:
        return contextlib.nullcontext()
    return enable_history_recording()


@contextlib.contextmanager
def _use_npu_memory_pool_manager(device: int, mem_pool: tuple[int, int], stream: Stream
                                 ) -> Generator[None, None, None]:
    """Routes the calling thread's allocations on ``device`` to graph pool ``mem_pool`` on ``stream``, as
    CUDA's ``_use_cuda_memory_pool_manager``: the device is synchronized, ``stream`` follows the current
    stream in and the current stream follows it out. The pool must exist already (a graph captured into
    it holds it): this holds it only while the block runs."""
    torch.npu.synchronize()
    stream.wait_stream(current_stream())
    with stream_context(stream), torch.device("npu", device):
        acl.begin_allocate_current_thread_to_pool(device, tuple(mem_pool))
        try:
            yield
        finally:
            acl.end_allocate_to_pool(device, tuple(mem_pool))
            acl.release_pool(device, tuple(mem_pool))
    current_stream().wait_stream(stream)


# ---- what is allocated in a tree's pool -------------------------------------------------

def get_npugraph_segments(pool_id: tuple[int, int]) -> list[dict[str, Any]]:
    """The segments of ``torch.npu.memory_snapshot()`` that belong to graph pool ``pool_id``."""
    return [segment for segment in torch.npu.memory_snapshot() if segment["segment_pool_id"] == tuple(pool_id)]


def get_block_addrs(pool_id: tuple[int, int], live_only: bool = True) -> list[int]:
    """The addresses of the pool's blocks (only the allocated ones when ``live_only``), segment by segment."""
    addrs = []
    for segment in get_npugraph_segments(pool_id):
        addr = segment["address"]
        for block in segment["blocks"]:
            if not live_only or block["state"] == "active_allocated":
                addrs.append(addr)
            addr += block["size"]
    return addrs


def check_memory_pool(device: int | str | torch.device, pool_id: tuple[int, int],
                      live_storages_ptrs: list[StorageWeakRefWrapper]) -> None:
    """Checks that the blocks allocated in graph pool ``pool_id`` are exactly the live storages given, as
    CUDA's trees do: raises naming the storages the pool does not hold, then the pool's allocated
    blocks nothing accounts for (with their allocation frames where history was recorded)."""
    if not all(isinstance(elem, StorageWeakRefWrapper) for elem in live_storages_ptrs):
        raise RuntimeError("check all(isinstance(elem, StorageWeakRefWrapper) for elem in live_storages_ptrs) fail: "
                           f"check_memory_pool on {device} expects StorageWeakRefWrapper elements, got "
                           f"{sorted({type(elem).__name__ for elem in live_storages_ptrs})}")
    unique_storages = {stor.data_ptr() for stor in live_storages_ptrs if stor()}
    if memory._npu_checkPoolLiveAllocations(device, pool_id, unique_storages):
        return  # the fast path: the allocator's view agrees, no snapshot needed
    # A dead tensor may not have been collected yet: it would show as an unaccounted block.
    gc.collect()
    unaccounted: dict[int, dict[str, Any]] = {}
    for segment in get_npugraph_segments(pool_id):
        addr = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                if addr in unique_storages:
                    unique_storages.remove(addr)
                else:
                    unaccounted[addr] = block
            addr += block["size"]
    torch._check(len(unique_storages) == 0,
                 lambda: f"These storage data ptrs are not allocated in pool {pool_id} but should be {unique_storages}")
    if unaccounted:
        formatted = "\n".join(f"Data Pointer: {ptr}, history: \n{format_tb(block.get('frames', []))}"
                               for ptr, block in unaccounted.items())
        raise RuntimeError("These live storage data ptrs are in the npugraph pool but not accounted for as an output "
                           f"of npugraph trees (pool {pool_id} on {device}): \n\n{formatted}")


# ---- the nodes --------------------------------------------------------------------------

def _shape_key(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """What finds a node again: each tensor input's shape, strides and dtype, each int's value."""
    return tuple((tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else x
                 for x in inputs)


class NPUWarmupNode:
    """A function's warm-up run: eager, once per function and input shapes, outside any capture."""

    def __init__(self, wrapped_function: WrappedFunction, key: tuple[Any, ...]) -> None:
        self.wrapped_function = wrapped_function
        self.key = key

    def run(self, new_inputs: list[Any]) -> Any:
        return self.wrapped_function.model(new_inputs)


class NPUGraphNode:
    """One recorded npu graph of the tree: its static inputs and outputs, its parent and children.

    ``inputs`` are the recording call's; those at ``in_place_idxs`` are read where they are
    (their addresses must stay), the other tensors get static buffers the inputs of each
    replay are copied into. Recording replays the graph once for the recording call's outputs.
    """

    def __init__(self, wrapped_function: WrappedFunction, graph_id: GraphID, parent: NPUGraphNode | None,
                 inputs: list[Any], in_place_idxs: set[int], pool: tuple[int, int], device_index: int,
                 stream: Stream, key: tuple[Any, ...]) -> None:
        self.wrapped_function = wrapped_function
        self.id = graph_id
        self.parent = parent
        self.device = device_index
        self.key = key
        self.children: dict[FunctionID, list[NPUGraphNode]] = {}
        self.in_place = {i: inputs[i].data_ptr() for i in in_place_idxs}
        self.copy_idxs = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and i not in in_place_idxs]
        self.static_inputs: list[Any] = list(inputs)
        for i in self.copy_idxs:
            x = inputs[i]
            self.static_inputs[i] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        # Outputs of the graphs on the path (saved activations) are read in place, but the tensors handed
        # out for them are invalidated when a new step starts: the graph holds its own view of that memory.
        tree_outputs = set().union(*(n.output_ptrs() for n in parent.path_from_root)) if parent else set()
        for i in in_place_idxs:
            if inputs[i].data_ptr() in tree_outputs:
                self.static_inputs[i] = acl.in_new_storages([inputs[i]])[0]
        self.graph = graphs.NPUGraph()
        self.outputs_weakrefs: list[weakref.ref[torch.Tensor] | None] = []
        self.static_outputs = self._record(wrapped_function.model, inputs, pool, stream)
        # Outputs over memory the replays write (the pool, the copied inputs' buffers), not over
        # the inputs read in place (a parameter returned for the backward is never overwritten).
        kept = {inputs[i].untyped_storage().data_ptr() for i in in_place_idxs}
        self.overwritten = [isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in kept
                            for o in self.static_outputs]
        self.overwritten_idxs = [i for i, overwritten in enumerate(self.overwritten) if overwritten]

    def _record(self, model: ModelType, inputs: list[Any], pool: tuple[int, int], capture_stream: Stream
                ) -> list[Any]:
        self._copy_inputs(inputs)
        capture_stream.wait_stream(current_stream())
        with clear_cublas_manager(), graphs.graph(self.graph, pool=pool, stream=capture_stream,
                                                  capture_error_mode="thread_local"):
            outputs = model(list(self.static_inputs))  # the model clears the list it is given
        current_stream().wait_stream(capture_stream)
        return list(outputs)

    def matches(self, new_inputs: list[Any]) -> bool:
        """Whether the inputs read in place are where they were when the graph was recorded."""
        return all(new_inputs[i].data_ptr() == ptr for i, ptr in self.in_place.items())

    def _copy_inputs(self, new_inputs: list[Any]) -> None:
        dsts, srcs = [], []
        for i in self.copy_idxs:
            if new_inputs[i].data_ptr() != self.static_inputs[i].data_ptr():
                dsts.append(self.static_inputs[i])
                srcs.append(new_inputs[i])
        if dsts:
            torch._foreach_copy_(dsts, srcs)  # one call per replay: the fast route

    def run_graph(self) -> None:
        if self.graph is None:
            raise RuntimeError("NPUGraphNode.run_graph: the node's graph was released")
        self.graph.replay()

    def run(self, new_inputs: list[Any]) -> list[Any]:
        """Copies ``new_inputs`` into the static buffers, replays, returns new tensors over the outputs."""
        self._copy_inputs(new_inputs)
        new_inputs.clear()  # the boxed calling convention: the callee owns (and drops) the inputs
        self.run_graph()
        return self.reconstruct_outputs()

    def reconstruct_outputs(self) -> list[Any]:
        """The outputs handed out: over the static memory, in storages of their own where replays overwrite
        them (so invalidating them leaves the static outputs readable), outputs sharing a storage still do."""
        outputs = [o.detach() if isinstance(o, torch.Tensor) and not overwritten else o
                   for o, overwritten in zip(self.static_outputs, self.overwritten, strict=True)]
        # One C++ call for all: four Python-level ops per output were a third of a compiled training step's
        # host CPU (490 against 327 us per step, the MLP of `bench graph-replay`).
        for i, fresh in zip(self.overwritten_idxs, acl.in_new_storages([outputs[i] for i in self.overwritten_idxs]),
                            strict=True):
            outputs[i] = fresh
        self.outputs_weakrefs = [weakref.ref(o) if overwritten else None
                                 for o, overwritten in zip(outputs, self.overwritten, strict=True)]
        return outputs

    def add_child(self, function_id: FunctionID, node: NPUGraphNode) -> None:
        self.children.setdefault(function_id, []).append(node)

    def output_ptrs(self) -> set[int]:
        return {o.data_ptr() for o in self.static_outputs if isinstance(o, torch.Tensor)}

    def invalidate_outputs(self) -> None:
        """Makes the live tensors the last run returned raise on access (a new step overwrites them)."""
        for ref in self.outputs_weakrefs:
            tensor = ref() if ref is not None else None
            if tensor is not None:
                acl.set_storage_access_error(tensor, OVERWRITTEN.format(device=f"npu:{self.device}"))
        self.outputs_weakrefs = []

    @property
    def path_from_root(self) -> list[NPUGraphNode]:
        path: list[NPUGraphNode] = []
        node: NPUGraphNode | None = self
        while node is not None:
            path.append(node)
            node = node.parent
        return path[::-1]


# ---- the tree of one device -------------------------------------------------------------

class NPUGraphTreeManager:
    """The npu graph tree of one device. See Note [npu graph trees]."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        with torch.npu.device(device_index):
            self.stream = Stream()
            self.npu_graphs_pool = graphs.graph_pool_handle()
        self.roots: dict[FunctionID, list[NPUGraphNode]] = {}
        self.current_node: NPUGraphNode | None = None
        self.ids_to_funcs: dict[FunctionID, WrappedFunction] = {}
        self.id_to_mode: dict[FunctionID, CompilationMode] = {}
        self.warmed_up: set[tuple[FunctionID, tuple[Any, ...]]] = set()
        self.eager_reasons: dict[FunctionID, str] = {}
        self.recordings: dict[FunctionID, int] = {}
        self.graph_counter = 0
        self.current_gen = -1
        self.running_forwards_with_pending_backwards = False
        self.lock = threading.Lock()

    def add_function(self, model: ModelType, inputs: list[Any], static_input_idxs: Sequence[int],
                     stack_traces: Any, mode: CompilationMode, constants: tuple[torch.Tensor, ...],
                     placeholders: Sequence[Any], mutated_input_idxs: Sequence[int]
                     ) -> tuple[ModelType, Sequence[Any]]:
        """Adds a compiled function to the tree; returns its npu-graph callable and the first call's outputs."""
        function_id = FunctionID(len(self.ids_to_funcs))
        self.ids_to_funcs[function_id] = WrappedFunction(model, list(static_input_idxs), function_id,
                                                         tuple(constants), list(placeholders),
                                                         list(mutated_input_idxs))
        self.id_to_mode[function_id] = mode

        def run(new_inputs: list[Any]) -> Sequence[Any]:
            return self.run(new_inputs, function_id)

        return run, run(inputs)

    # -- steps (CUDA's generations) --

    @staticmethod
    def get_curr_generation() -> int:
        return MarkStepBox.mark_step_counter or GenerationTracker.generation

    def can_start_new_generation(self) -> bool:
        if self.current_gen == self.get_curr_generation():
            return False
        return MarkStepBox.mark_step_counter != 0 or not self.running_forwards_with_pending_backwards

    def start_new_generation(self) -> None:
        if self.current_node is not None:
            for node in self.current_node.path_from_root:
                node.invalidate_outputs()
        self.current_node = None
        self.current_gen = self.get_curr_generation()

    def set_to_running_backward(self) -> None:
        """A backward that runs outside the tree (not graphed) still ends its forward's pending state."""
        self.running_forwards_with_pending_backwards = False

    # -- running a function --

    def run(self, new_inputs: list[Any], function_id: FunctionID) -> Sequence[Any]:
        with self.lock, torch.npu.device(self.device_index):
            if self.can_start_new_generation():
                self.start_new_generation()
            out = self._run(new_inputs, function_id)
            mode = self.id_to_mode[function_id]
            if mode == CompilationMode.FORWARD:
                self.running_forwards_with_pending_backwards = True
            elif mode == CompilationMode.BACKWARD:
                self.running_forwards_with_pending_backwards = False
            return out

    def _run(self, new_inputs: list[Any], function_id: FunctionID) -> Sequence[Any]:
        wrapped = self.ids_to_funcs[function_id]
        if function_id in self.eager_reasons:
            return wrapped.model(new_inputs)
        key = _shape_key(new_inputs)
        siblings = (self.current_node.children if self.current_node is not None else self.roots).get(function_id, [])
        for node in siblings:
            if node.key == key and node.matches(new_inputs):
                self.current_node = node
                return node.run(new_inputs)
        if (function_id, key) not in self.warmed_up:
            self.warmed_up.add((function_id, key))
            return NPUWarmupNode(wrapped, key).run(new_inputs)
        reason = self._why_not_recorded(wrapped, new_inputs)
        if reason is not None:
            self.eager_reasons[function_id] = reason
            log_cudagraph_skip_and_bump_counter(f"skipping npu graphs due to {reason}")
            return wrapped.model(new_inputs)
        return self._record(wrapped, new_inputs, key)

    def _in_place_idxs(self, wrapped: WrappedFunction, inputs: list[Any]) -> set[int]:
        """Static inputs, constants and outputs of the graphs on the current path."""
        managed: set[int] = set()
        if self.current_node is not None:
            for node in self.current_node.path_from_root:
                managed |= node.output_ptrs()
        constants = {c.data_ptr() for c in wrapped.constants}
        return {i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                and (i in wrapped.static_input_idxs or x.data_ptr() in managed or x.data_ptr() in constants)}

    def _why_not_recorded(self, wrapped: WrappedFunction, inputs: list[Any]) -> str | None:
        in_place = self._in_place_idxs(wrapped, inputs)
        mutated = [i for i in wrapped.mutated_input_idxs if i not in in_place]
        if mutated:
            return f"mutated inputs ({len(mutated)} instances)"
        if any(isinstance(x, torch.Tensor) and i not in in_place and not is_non_overlapping_and_dense_or_false(x)
               for i, x in enumerate(inputs)):
            return "an input that is not dense and non-overlapping (it cannot be copied into a static buffer)"
        if self.recordings.get(wrapped.id, 0) >= config.triton.cudagraph_unexpected_rerecord_limit:
            return (f"more than {config.triton.cudagraph_unexpected_rerecord_limit} recordings of one function "
                    "(config.triton.cudagraph_unexpected_rerecord_limit)")
        return None

    def _record(self, wrapped: WrappedFunction, new_inputs: list[Any], key: tuple[Any, ...]) -> list[Any]:
        node = NPUGraphNode(wrapped, GraphID(self.graph_counter), self.current_node, new_inputs,
                            self._in_place_idxs(wrapped, new_inputs), self.npu_graphs_pool, self.device_index,
                            self.stream, key)
        self.graph_counter += 1
        self.recordings[wrapped.id] = self.recordings.get(wrapped.id, 0) + 1
        if self.current_node is None:
            self.roots.setdefault(wrapped.id, []).append(node)
        else:
            self.current_node.add_child(wrapped.id, node)
        self.current_node = node
        new_inputs.clear()
        node.run_graph()  # the capture ran nothing: this call's results come from a first replay
        return node.reconstruct_outputs()

    def nodes(self) -> list[NPUGraphNode]:
        """Every recorded node, parents before children."""
        found, todo = [], [n for nodes in self.roots.values() for n in nodes]
        while todo:
            node = todo.pop(0)
            found.append(node)
            todo.extend(n for nodes in node.children.values() for n in nodes)
        return found


# ---- one tree per device, shared with autograd's threads ---------------------------------

local = threading.local()  # tree_manager_containers: device -> TreeManagerContainer


class TreeManagerContainer:
    """Holds a device's tree while compiled functions that use it are alive."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self.tree_manager: NPUGraphTreeManager | None = None
        self.live_npugraphify_fns = 0
        self.lock = threading.Lock()

    def add_strong_reference(self, fn: Callable[..., Any]) -> None:
        with self.lock:
            self.live_npugraphify_fns += 1
        weakref.finalize(fn, self.finalize_npugraphify_fn)

    def finalize_npugraphify_fn(self) -> None:
        with self.lock:
            self.live_npugraphify_fns -= 1
            if self.live_npugraphify_fns == 0:
                self.tree_manager = None  # the last compiled function went: its graphs and pool go too

    def get_tree_manager(self) -> NPUGraphTreeManager:
        with self.lock:
            if self.tree_manager is None:
                self.tree_manager = NPUGraphTreeManager(self.device_index)
            return self.tree_manager


def _containers() -> dict[int, TreeManagerContainer]:
    if not hasattr(local, "tree_manager_containers"):
        # A thread autograd runs backward on sees the containers of the thread that ran forward.
        if torch._C._is_key_in_tls("npu_tree_manager_containers"):
            local.tree_manager_containers = torch._C._get_obj_in_tls("npu_tree_manager_containers")
        else:
            local.tree_manager_containers = {}
            torch._C._stash_obj_in_tls("npu_tree_manager_containers", local.tree_manager_containers)
    return local.tree_manager_containers


def get_container(device_index: int) -> TreeManagerContainer:
    containers = _containers()
    if device_index not in containers:
        containers[device_index] = TreeManagerContainer(device_index)
    return containers[device_index]


def get_manager(device_index: int, create_if_none_exists: bool = True) -> NPUGraphTreeManager | None:
    if create_if_none_exists:
        return get_container(device_index).get_tree_manager()
    container = _containers().get(device_index)
    return container.tree_manager if container is not None else None


def reset_npugraph_trees() -> None:
    """Drops every tree of this thread (their graphs and pools go with the last reference)."""
    _containers().clear()


# ---- what inductor's compiled functions are wrapped in --------------------------------------

def npugraphify_impl(model: ModelType, inputs: list[Any], static_input_idxs: Sequence[int], *args: Any,
                     **kwargs: Any) -> ModelType:
    """One tree function per value of the integer inputs (symbolic sizes), made on first use."""
    int_idxs = [i for i, x in enumerate(inputs) if isinstance(x, int)]
    fn_cache: dict[tuple[int, ...], ModelType] = {}

    def deferred(new_inputs: list[Any]) -> Sequence[Any]:
        int_key = tuple(new_inputs[i] for i in int_idxs)
        fn = fn_cache.get(int_key)
        if fn is not None:
            return fn(new_inputs)
        fn, out = npugraphify(model, new_inputs, static_input_idxs, *args, **kwargs)
        fn_cache[int_key] = fn
        return out

    return deferred


def npugraphify(model: ModelType, inputs: list[Any], static_input_idxs: Sequence[int] = (), *,
                device_index: int, is_backward: bool, is_inference: bool, stack_traces: Any = None,
                constants: tuple[torch.Tensor, ...] = (), placeholders: Sequence[Any] = (),
                mutated_input_idxs: Sequence[int] = ()) -> tuple[ModelType, Sequence[Any]]:
    """Adds ``model`` to the device's tree; returns (the callable that runs it, its first outputs)."""
    if is_backward and is_inference:
        raise RuntimeError("npugraphify: a graph is either a backward or an inference graph, not both")
    mode = (CompilationMode.BACKWARD if is_backward else
            CompilationMode.INFERENCE if is_inference else CompilationMode.FORWARD)
    manager = get_container(device_index).get_tree_manager()
    return manager.add_function(model, inputs, static_input_idxs, stack_traces, mode, constants, placeholders,
                                mutated_input_idxs)


def npugraphified(model: ModelType, static_input_idxs: Sequence[int], **kwargs: Any) -> ModelType:
    """``model`` run through the device's tree from its first call on (what the policy installs)."""
    container = get_container(kwargs["device_index"])
    compiled: list[ModelType] = []

    def run(new_inputs: list[Any]) -> Sequence[Any]:
        if compiled:
            return compiled[0](new_inputs)
        fn = npugraphify_impl(model, new_inputs, static_input_idxs, **kwargs)
        compiled.append(fn)
        return fn(new_inputs)

    container.add_strong_reference(run)
    return run
