"""The ``npu`` operator namespace that every fused-operator family registers into.

torch_npu defines its operators in the ``npu`` namespace (``torch.ops.npu.npu_rms_norm``);
so does npusim, with one ``torch.library.Library`` for the whole namespace. A family module
calls :func:`define` with op-plugin's schema and registers its kernels on the returned
name with ``torch.library`` (``register_kernel`` / ``register_fake`` /
``register_autograd``), or with :data:`LIB`'s ``impl``.
"""

from __future__ import annotations

from typing import Any

import torch

# Module-level: the definitions live as long as this object does.
LIB = torch.library.Library("npu", "DEF")

# Public name -> torch.ops.npu.<name>: what ``torch_npu.<name>`` is under ``npusim run``.
OPS: dict[str, Any] = {}


def define(schema: str, *, public: bool = True, tags: tuple[torch.Tag, ...] = ()) -> str:
    """Defines ``npu::<schema>`` and returns its qualified name (``"npu::npu_rms_norm"``).

    ``public`` ops are what torch_npu exposes as ``torch_npu.<name>``; backward and helper
    ops that torch_npu keeps internal are defined with ``public=False``. ``tags`` are the
    op's tags in op-plugin's yaml (``nondeterministic_seeded`` for ops that draw random
    numbers, which torch.compile must neither deduplicate nor recompute).
    """
    name = schema.split("(", 1)[0].split(".", 1)[0].strip()
    LIB.define(schema, tags=tags)
    if public:
        OPS[name] = getattr(torch.ops.npu, name)
    return f"npu::{name}"
