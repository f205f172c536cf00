"""op-plugin's fused operators on the npu: ``torch.ops.npu.npu_*``.

Code written for Ascend calls op-plugin's fused operators directly
(``torch_npu.npu_rms_norm``, ``npu_fusion_attention``, the MoE routing ops).
Each one here is defined with op-plugin's own schema
(``op_plugin/config/op_plugin_functions.yaml`` in Ascend/op-plugin) in the
``npu`` namespace, as torch_npu defines it, and gets a PrivateUse1 kernel
(PyTorch ops on device memory, at the precision the op documents), a Meta /
fake kernel, and autograd where torch_npu has a backward. docs/FUSED_OPS.md
lists them.

Each family lives in a module of its own and registers through
:mod:`npusim.ops.fused._library`; :data:`OPS` maps each public name to
``torch.ops.npu.<name>``, which is what ``torch_npu.<name>`` is under
``npusim run`` (:mod:`npusim.compat.torch_npu`).
"""

from __future__ import annotations

import importlib
from typing import Any

from npusim.ops.fused._library import OPS

__all__ = ["FAMILIES", "OPS", "register"]

# The family modules, each registering its operators when imported.
FAMILIES: tuple[str, ...] = ("norms", "rotary", "activations", "softmax", "attention", "moe_gating", "moe_routing",
                             "moe_permute", "grouped_matmul", "layout")


def register() -> None:
    """Defines every family's operators in the ``npu`` namespace (idempotent: imports run once)."""
    for family in FAMILIES:
        importlib.import_module(f"npusim.ops.fused.{family}")


def __getattr__(name: str) -> Any:
    """``npusim.ops.fused.npu_rms_norm`` is ``torch.ops.npu.npu_rms_norm``."""
    try:
        return OPS[name]
    except KeyError:
        raise AttributeError(f"module 'npusim.ops.fused' has no fused operator {name!r}") from None
