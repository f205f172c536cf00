"""Inductor's backend for the npu: C++ kernels on npu memory, npu device semantics.

Imported once ``torch._inductor.compile_fx`` is (see Note [Registering with
dynamo and inductor lazily]); :func:`register_inductor_backend` hands inductor
the three things an out-of-tree device gives it (``register_backend_for_device``
and ``register_device_op_overrides``):

- the kernel scheduling: inductor's own ``CppScheduling``. npu memory is host
  memory, so its C++/OpenMP kernels compute on npu tensors' data pointers;
- the wrapper codegen, :class:`NpuPythonWrapperCodegen`: the host code that
  allocates buffers and launches kernels, with the npu's semantics added
  (Note [Compiled code in stream order]);
- the device op overrides, :class:`NpuDeviceOpOverrides`.

Note [Compiled code in stream order]
------------------------------------
Eager npu compute is a stream task (Note [Compute on the stream]), and so is a
compiled region's C++ kernel:

- each C++ kernel is called through ``launch(device, kernel, args, signature)``
  (:mod:`npusim.compile.generated_calls`), the signature being a letter per
  argument from the C types inductor declares (``r`` read, ``w`` written,
  ``i`` an integer). The kernel becomes a task of the current stream that
  calls its C entry point, without Python (Note [Compiled kernels without the
  GIL]): it runs after the stream's earlier work (a copy still queued, an
  extern kernel's output) and before its later work, asynchronously to the
  host, as a CUDA region's Triton kernels run. Its failure (inductor's integer
  division by zero check) is asynchronous too (Note [Errors of asynchronous
  work]);
- a kernel the signature does not cover (a float argument, a tensor not on the
  npu, a module compiled before signatures were written) runs on the host
  through its Python binding, after waiting for the current stream's earlier
  work, so that it never reads an input a queued copy has not written yet nor
  writes memory a queued task still reads. Before each such kernel, not once
  per call: the region's own eager calls may queue work between two kernels;
- extern kernels (``mm``, fallbacks) are npu ops: stream tasks like any eager op;
- buffers are allocated with ``empty_strided(..., device='npu:<i>')``: the npu
  allocator, counted in ``torch.npu.memory_allocated``, freed stream-ordered,
  on the inputs' device whatever the current device is. Inductor emits no
  device guard for devices outside its GPU list, so each allocation names its
  device index;
- the stream is the one current when the compiled function is called (as on
  CUDA); ``torch.npu.stream(s)`` inside the compiled function graph-breaks,
  see Note [npu streams inside a compiled region].

Note [Compiled code in an npu graph]
------------------------------------
While the current stream is captured into an npu graph (``torch.npu.graph``, the
graph trees of ``mode="reduce-overhead"``), each C++ kernel's stream task is
recorded, with what it reads and writes (Note [Replaying independent tasks at
once]), and calls the entry point on the same addresses at each replay; extern
kernels and fallbacks are npu ops, which the capture records itself (Note [NPU
graph capture]). A kernel the signature does not cover is recorded as a task
that calls its Python binding on the same tensors (the task holds them, so
their memory stays the graph's): the stream worker takes the GIL for it.

Note [Where inductor reads cpu as the C++ backend]
--------------------------------------------------
Inductor pairs "cpu" with its C++ backend and every other device with a SIMD
(Triton-like) one in a few places that are not behind the scheduling it is
given. Left alone, npu graphs crash in fusion (the scheduler's loop reordering
and reindexing take a C++ node's ``group`` for a SIMD one and fail with
"can't multiply sequence by non-int of type 'tuple'") and the C++ codegen's
dtype propagation follows Triton's rules. So :func:`register_inductor_backend`
widens exactly those two questions to the npu: ``BaseSchedulerNode.is_cpu``
(used only by the three fusion heuristics that skip C++ nodes) and
``get_current_backend`` (returns ``"cpp"`` for the npu). Other ``"cpu"``
tests in inductor pick heuristics (reduction splitting, pad-as-cat, the
cat kernel, small-mm decompositions) and stay as for a GPU: they change how
the work is split into kernels (and so rounding), not what is computed.
These are inductor internals, checked against torch 2.13.

Not supported, with an error naming it: inductor's C++ wrapper
(``cpp_wrapper=True``, AOTInductor) on the npu.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.virtualized import V

__all__ = [
    "NpuCodegenKey", "NpuDeviceOpOverrides", "NpuPythonWrapperCodegen", "UnsupportedCppWrapper",
    "register_inductor_backend",
]

_LAUNCH = "npusim_launch"
_RUNTIME_IMPORT = f"from npusim.compile.generated_calls import launch as {_LAUNCH}"


class NpuDeviceOpOverrides(DeviceOpOverrides):
    """The Python lines inductor's wrapper uses for npu device calls."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from npusim.compile.generated_calls import get_raw_stream as {name}"

    def set_device(self, device_idx: int) -> str:
        return f"torch.npu.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.npu.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.npu.device({device_idx})"

    def current_stream(self) -> str:
        return "torch.npu.current_stream()"

    def cpp_kernel_type(self) -> str:
        return "void*"


def _kernel_signature(arg_types: Any, num_args: int) -> str:
    """The letters ``launch`` takes for a C++ kernel's arguments, from the C types inductor declares
    them with (``cpp_argdefs``): ``w`` for ``T*`` (written), ``r`` for ``const T*`` (read), ``i`` for
    ``const int64_t``; "" when a type is another (the kernel keeps its Python call: Note [Compiled
    kernels without the GIL])."""
    if not isinstance(arg_types, (list, tuple)) or len(arg_types) != num_args:
        return ""
    letters = []
    for arg_type in arg_types:
        text = str(arg_type).strip()
        if text.endswith("*"):
            letters.append("r" if text.startswith("const ") else "w")
        elif text in ("const int64_t", "int64_t"):
            letters.append("i")
        else:
            return ""
    return "".join(letters)


class _NpuWrapperMixin:
    """The npu's additions to the Python wrapper; see Note [Compiled code in stream order]."""

    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     triton: bool = True, **kwargs: Any) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != "npu":
            super()._generate_kernel_call_helper(  # type: ignore[misc]
                kernel_name, call_args, device=device, triton=triton, **kwargs)
            return
        args = "".join(f"{arg}, " for arg in call_args)
        signature = _kernel_signature(kwargs.get("arg_types"), len(call_args))
        self.writeline(f"{_LAUNCH}({device.index}, {kernel_name}, ({args}), {signature!r})")  # type: ignore[attr-defined]

    def make_allocation(self, name: str, device: torch.device, dtype: torch.dtype, shape: Any, stride: Any,
                        allocation_shape: Any = None, is_pinned: bool = False) -> str:
        if device.type != "npu" or torch._inductor.config.test_configs.track_memory_lifecycle:
            return super().make_allocation(  # type: ignore[misc]
                name, device, dtype, shape, stride, allocation_shape, is_pinned)
        allocation_shape = shape if allocation_shape is None else allocation_shape
        shape_code = self.codegen_python_shape_tuple(shape)  # type: ignore[attr-defined]
        allocation_code = self.codegen_python_shape_tuple(allocation_shape)  # type: ignore[attr-defined]
        stride_code = self.codegen_python_shape_tuple(stride)  # type: ignore[attr-defined]
        index = device.index if device.index is not None else torch.npu.current_device()
        line = f"{name} = empty_strided({allocation_code}, {stride_code}, device='npu:{index}', dtype={dtype})"
        if shape_code != allocation_code:
            line += f".as_strided({shape_code}, {stride_code})"
        return line


class NpuSubgraphWrapperCodegen(_NpuWrapperMixin, SubgraphPythonWrapperCodegen):
    """A subgraph (control flow, invoke_subgraph) of an npu graph; imports come from the root."""


class NpuPythonWrapperCodegen(_NpuWrapperMixin, PythonWrapperCodegen):
    """Inductor's Python wrapper with the npu's device semantics."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: PythonWrapperCodegen | None,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return NpuSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NpuPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(_RUNTIME_IMPORT)


class UnsupportedCppWrapper:
    """Stands in for a C++ wrapper, which the npu does not have: a clear error instead of a KeyError."""

    supports_caching = True

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "torch.compile on the npu: inductor's C++ wrapper (torch._inductor.config.cpp_wrapper=True, "
            "AOTInductor) is not supported on device 'npu'; npusim generates the Python wrapper only. "
            "Set cpp_wrapper=False for npu graphs.")


class NpuCodegenKey(CustomGraphModulePass):
    """Changes no graph; its ``uuid`` keys inductor's FX graph cache on npusim's codegen sources.

    A cached compiled module embeds the wrapper lines this package generates,
    so an edit of it must not reuse modules generated before the edit.
    """

    def __init__(self) -> None:
        self._uuid = get_hash_for_files(tuple(str(p) for p in sorted(Path(__file__).parent.glob("*.py"))))

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        return None

    def uuid(self) -> Any:
        return self._uuid


def register_inductor_backend() -> None:
    """Registers the npu's scheduling, wrapper codegen and device op overrides with inductor."""
    register_backend_for_device("npu", CppScheduling, NpuPythonWrapperCodegen, UnsupportedCppWrapper,
                                device_custom_pass=NpuCodegenKey())
    register_device_op_overrides("npu", NpuDeviceOpOverrides())
    _treat_npu_as_cpp_device()


# ---- where inductor reads "cpu" as "the C++ backend" ------------------------

_CPP_DEVICES = frozenset({"cpu", "npu"})


def _is_cpp_node(self: Any) -> bool:
    device = self.get_device()
    return device is not None and device.type in _CPP_DEVICES


def _cpp_aware(get_current_backend: Any) -> Any:
    def get_current_backend_npu(device_type: str | None = None) -> str:
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == "npu" else get_current_backend(device_type)

    get_current_backend_npu.__wrapped__ = get_current_backend  # type: ignore[attr-defined]
    return get_current_backend_npu


def _treat_npu_as_cpp_device() -> None:
    """See Note [Where inductor reads cpu as the C++ backend]."""
    import sys

    from torch._inductor import scheduler

    scheduler.BaseSchedulerNode.is_cpu = _is_cpp_node  # type: ignore[method-assign]
    # Modules that imported the function by name hold their own reference; later importers get the wrapper.
    for name in ("torch._inductor.utils", "torch._inductor.codegen.common", "torch._inductor.kernel.mm_common"):
        module = sys.modules.get(name)
        current = getattr(module, "get_current_backend", None)
        if current is not None and not hasattr(current, "__wrapped__"):
            module.get_current_backend = _cpp_aware(current)  # type: ignore[union-attr]
