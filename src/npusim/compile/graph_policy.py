"""How ``torch.compile(mode="reduce-overhead")`` reaches the npu graph trees.

Note [What npusim hooks for reduce-overhead]
--------------------------------------------
Inductor wraps a compiled graph in its CUDA graph trees only when all its nodes
are on one "cuda" device (``cudagraph_utils.check_multiple_devices_or_any_cpu_nodes``);
for an npu graph it records "multiple devices: npu" as the reason and runs it
without graphs. npusim changes none of that code. It sets one extension point,
``torch._inductor.config.cudagraph_policy`` (inductor's pluggable
``CUDAGraphPolicy``), to :class:`NpuGraphPolicy` when inductor is imported, unless
a policy is set already, and overrides only ``wrap_output``, which inductor calls
on every compiled graph after its post-compile steps (fresh compiles and FX graph
cache hits alike). A graph whose devices are one npu, compiled while
``triton.cudagraphs`` is on (``mode="reduce-overhead"``) and whose only reason
not to be graphed was that device check, gets a compiled callable that runs
through the npu graph tree (:func:`npusim.compile.graph_trees.npugraphified`),
with the static input indices, mutated inputs and constants inductor computed.
Inductor's ``counters["inductor"]["cudagraph_skips"]`` still counts the device
check where inductor counts it (once per compiled region, before any policy
sees the graph, and not for a backward compiled after its forward was counted):
the policy cannot tell how often it was counted, so it leaves the counter alone;
``counters["inductor"]["npugraph_wrapped"]`` counts the graphs it hands to the
trees. A backward that is not graphed still tells its device's tree
that the backward ran (as inductor's ``maybe_handle_backward_generation``).
Every other graph (cuda, cpu, one with another reason not to be graphed, which
is logged as inductor logs its skips) is returned unchanged; ``cudagraphify``
and ``should_wrap`` stay inductor's. As for any policy, inductor then routes
graph-partitioned CUDA graphs through ``cudagraph_post_compile``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.cudagraph_utils import (
    CUDAGraphPolicy,
    check_multiple_devices_or_any_cpu_nodes,
    log_cudagraph_skip_and_bump_counter,
)
from torch._inductor.output_code import CompiledFxGraph, OutputCode

from npusim.compile import graph_trees

__all__ = ["NpuGraphPolicy", "install_graph_policy"]

_OC = TypeVar("_OC", bound=OutputCode)


def _reason_not_graphed(graph: CompiledFxGraph) -> str | None:
    """Why inductor's checks, read for the npu, keep ``graph`` out of npu graphs (None: nothing)."""
    if set(graph.device_types) != {"npu"} or len(graph.device_idxs) != 1:
        devices = ", ".join(sorted(graph.device_types))
        return f"skipping cudagraphs due to devices {devices} (npu graphs take the graphs of one npu)"
    device = torch.device("npu", next(iter(graph.device_idxs)))
    device_check = check_multiple_devices_or_any_cpu_nodes({device: None})  # what inductor said of the npu
    reason = graph.disabled_cudagraphs_reason
    return None if reason in (None, device_check) else reason


class NpuGraphPolicy(CUDAGraphPolicy):
    """Inductor's default policy, plus npu graph trees for npu graphs. See Note [What npusim hooks for
    reduce-overhead]."""

    def wrap_output(self, output_code: _OC) -> _OC:
        if not isinstance(output_code, CompiledFxGraph) or not config.triton.cudagraphs:
            return output_code
        if "npu" not in output_code.device_types or output_code.current_callable is None:
            return output_code
        fx_kwargs = output_code.fx_kwargs
        device_index = next(iter(output_code.device_idxs))
        reason = _reason_not_graphed(output_code)
        if reason is not None:
            log_cudagraph_skip_and_bump_counter(reason)
            if fx_kwargs.get("is_backward"):
                output_code.current_callable = _tells_tree_backward_ran(output_code.current_callable, device_index)
            return output_code
        counters["inductor"]["npugraph_wrapped"] += 1
        constants = tuple(v for v in (output_code.constants or {}).values() if isinstance(v, torch.Tensor))
        output_code.current_callable = graph_trees.npugraphified(
            output_code.current_callable, tuple(fx_kwargs.get("static_input_idxs") or ()),
            device_index=device_index, is_backward=bool(fx_kwargs.get("is_backward")),
            is_inference=bool(fx_kwargs.get("is_inference")), constants=constants,
            mutated_input_idxs=tuple(output_code.mutated_input_idxs))
        return output_code


def _tells_tree_backward_ran(callable_: Callable[[list[Any]], Sequence[Any]], device_index: int
                             ) -> Callable[[list[Any]], Sequence[Any]]:
    def run(inputs: list[Any]) -> Sequence[Any]:
        manager = graph_trees.get_manager(device_index, create_if_none_exists=False)
        if manager is not None:
            manager.set_to_running_backward()
        return callable_(inputs)

    return run


def install_graph_policy() -> None:
    """Sets inductor's graph policy to :class:`NpuGraphPolicy`, unless one is set already."""
    if config.cudagraph_policy is None:
        config.cudagraph_policy = NpuGraphPolicy()
