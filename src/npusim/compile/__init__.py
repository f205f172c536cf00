"""``torch.compile`` on the npu: dynamo's device interface and an inductor backend.

``import npusim`` calls :func:`register`, which costs nothing at import: see
Note [Registering with dynamo and inductor lazily]. What each piece does:

- :mod:`npusim.compile.device_interface`: ``NpuInterface``, the device
  runtime dynamo and inductor query (devices, streams, events, properties);
- :mod:`npusim.compile.inductor`: inductor's C++ kernels computing on npu
  memory, with the npu's device semantics added by the wrapper codegen
  (see Note [Compiled code in stream order]);
- :mod:`npusim.compile.generated_calls`: the helpers the generated code calls;
- :mod:`npusim.compile.rng_state`: the npu in AOTAutograd's recomputation of seeded ops
  (see Note [Recomputed seeded ops on the npu]);
- :mod:`npusim.compile.graph_policy` and :mod:`npusim.compile.graph_trees`: npu graph
  trees for ``mode="reduce-overhead"`` (see Note [What npusim hooks for reduce-overhead]).

Note [Registering with dynamo and inductor lazily]
--------------------------------------------------
PyTorch's out-of-tree extension points live in ``torch._dynamo`` and
``torch._inductor``, and importing them costs seconds (about 2 s for dynamo,
3 s more for inductor's ``compile_fx`` on this kind of machine), against
about 0.3 s for all of ``import npusim``. Most npusim users (eager training,
FSDP2) never import either. So :func:`register` only asks to be told when
they are imported (:func:`npusim._after_import.when_imported`): right after
``torch._dynamo`` is executed it registers the device interface, and after
``torch._inductor.compile_fx`` the backend. Every
``torch.compile`` imports both before it traces or generates code, so the
registrations are always in place in time; when a module is already imported,
its registration runs at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from npusim._after_import import when_imported

__all__ = ["register"]


def _register_dynamo() -> None:
    from npusim.compile.device_interface import register_device_interface

    register_device_interface()


def _register_inductor() -> None:
    from npusim.compile.inductor import register_inductor_backend

    register_inductor_backend()
    from npusim.compile.graph_policy import install_graph_policy  # after: the backend must not depend on it

    install_graph_policy()


def _register_rng_state() -> None:
    from npusim.compile.rng_state import register as register_rng_state

    register_rng_state()


def _run(callback: Callable[[], None]) -> None:
    # A failed registration must not break torch.compile for other devices:
    # warn, and npu graphs then fail in inductor with its own error.
    try:
        callback()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"npusim: registering the npu with torch.compile failed: {error!r}", stacklevel=2)


def _when_imported(name: str, callback: Callable[[], None]) -> None:
    when_imported(name, lambda module: _run(callback))


_registered = False


def register() -> None:
    """Makes ``torch.compile`` (default inductor backend) work on the npu; idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    _when_imported("torch._dynamo", _register_dynamo)
    _when_imported("torch._inductor.compile_fx", _register_inductor)
    _when_imported("torch._prims.rng_prims", _register_rng_state)
