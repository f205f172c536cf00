"""torchair as npusim simulates it (``torch_npu.dynamo.torchair``, also ``import torchair``).

Note [torchair in npusim]
-------------------------
torchair is torch_npu's torch.compile backend: it converts the FX graph to an Ascend
graph-engine (GE) graph, one registered converter per operator, or (``mode="reduce-overhead"``)
captures it into an NPU graph. npusim has no graph engine, so the backend is mapped to
npusim's inductor backend, which compiles the same graphs to C++ kernels on npu memory:
``get_npu_backend(compiler_config=...)`` returns a dynamo backend that runs
``torch._inductor.compile_fx.compile_fx`` with inductor's decompositions plus the
``custom_decompositions`` given, its mode taken from ``CompilerConfig.mode``: torchair's
default ``"max-autotune"`` (GE graph mode, not inductor's autotuning) is inductor's default
mode, and ``"reduce-overhead"`` / ``"npugraph_ex"`` (NPU graphs) turn on ``triton.cudagraphs``,
so the compiled graphs replay through npusim's npu graph trees (Note [What npusim hooks for
reduce-overhead]). Compiled values are inductor's, not GE's.

What frameworks import at module level works: MindSpeed's op builders register GE converters
(``register_fx_node_ge_converter``) and annotate them with ``torchair.ge.Tensor`` /
``TensorSpec`` / ``DataType``; the converters are recorded and never run (inductor compiles the
operators' own npu kernels), and the GE graph builders they would call
(``torchair.ge.custom_op``, ``ge.Const``, ``ge.attr.Int``...) raise
:class:`GraphEngineNotSimulated` naming the call. ``CompilerConfig``'s graph-engine option
groups (``debug``, ``ge_config``, ``experimental_config``...) keep what a script sets and change
nothing. ``patch_for_hcom`` does what torchair does on torch >= 2.3.1, where dynamo traces
torch.distributed's collectives itself: it logs that it is not needed. Other torchair names
(``dynamo_export``, ``inference``, ``llm_datadist``, ``scope``...) raise NotSimulatedError, an
AttributeError, naming them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from npusim.compat.torch_npu import NotSimulatedError

from . import configs, ge, ge_concrete_graph  # noqa: F401  (torchair.ge, torchair.configs, ... as torchair's)
from ._errors import GraphEngineNotSimulated
from .configs.compiler_config import CompilerConfig
from .ge_concrete_graph.fx2ge_converter import register_fx_node_ge_converter

__all__ = ["CompilerConfig", "GraphEngineNotSimulated", "get_npu_backend", "logger", "patch_for_hcom",
           "register_fx_node_ge_converter"]

logger = logging.getLogger("torchair")

# CompilerConfig.mode -> the inductor config patches of its npusim backend.
_INDUCTOR_PATCHES: dict[str, dict[str, Any]] = {
    "max-autotune": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "npugraph_ex": {"triton.cudagraphs": True},
}


def get_npu_backend(*, compiler_config: CompilerConfig | None = None,
                    custom_decompositions: dict[Any, Callable[..., Any]] | None = None
                    ) -> Callable[[torch.fx.GraphModule, list[Any]], Any]:
    """torchair's npu backend, a ``torch.compile`` backend: npusim's inductor backend in the
    config's mode, with ``custom_decompositions`` over inductor's (See Note [torchair in npusim])."""
    config = CompilerConfig() if compiler_config is None else compiler_config
    if not isinstance(config, CompilerConfig):
        raise TypeError(f"torchair.get_npu_backend: compiler_config must be a torchair.CompilerConfig, got "
                        f"{type(config).__name__}")
    decompositions = dict(custom_decompositions or {})
    for op in decompositions:
        if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(f"torchair.get_npu_backend: custom_decompositions keys must be torch operators "
                            f"(torch.ops.aten.<op>.<overload>), got {op!r}")
    patches = dict(_INDUCTOR_PATCHES[config.mode.value])

    def npu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.decomposition import select_decomp_table

        if not decompositions:
            return compile_fx(gm, example_inputs, config_patches=patches)
        # AOTAutograd's cache keys a graph without its decompositions: it would hand back a graph
        # compiled with other ones, so a compile with custom decompositions neither reads nor fills it.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, config_patches=patches,
                              decompositions={**select_decomp_table(), **decompositions})

    npu_backend.compiler_config = config  # type: ignore[attr-defined]
    return npu_backend


def patch_for_hcom() -> None:
    """torchair's patch of torch.distributed's collectives for graph mode: on torch >= 2.3.1
    dynamo traces them itself, so, as torchair does there, it only says so."""
    logger.warning("For versions 2.3.1 and above of PyTorch, there is no need to call patch_for_hcom anymore "
                   "(torch %s; npusim's torchair changes nothing).", torch.__version__)


# torchair's other public names, and why npusim has none of them.
_NOT_SIMULATED: dict[str, str] = {
    "get_compiler": "torchair's GE FX compiler; use get_npu_backend (inductor)",
    "dynamo_export": "exporting GE models (.air / .om) needs Ascend's graph engine",
    "use_internal_format_weight": "NPU internal weight formats are a GE inference feature",
    "npu_format_cast_via_cpu": "NPU internal weight formats are a GE inference feature",
    "register_replacement": "torchair's GE pattern passes",
    "inference": "torchair's GE inference helpers (cache_compile)",
    "llm_datadist": "LLM-DataDist KV-cache transfer needs Ascend's runtime",
    "ops": "torchair's GE-only operators",
    "scope": "GE graph scopes (super_kernel, npu_stream_switch)",
}


def __getattr__(name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module 'torchair' has no attribute {name!r}")
    why = _NOT_SIMULATED.get(name, "npusim's torchair provides get_npu_backend (inductor), CompilerConfig, "
                                   "register_fx_node_ge_converter, patch_for_hcom, logger, ge and ge_concrete_graph")
    raise NotSimulatedError(f"torchair.{name} is not simulated by npusim: {why}", name=name,
                            obj=sys.modules[__name__])
