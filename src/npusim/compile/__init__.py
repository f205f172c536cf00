"""``torch.compile`` on the npu: dynamo's device interface and an inductor backend.

``import npusim`` calls :func:`register`, which costs nothing at import: see
Note [Registering with dynamo and inductor lazily]. What each piece does:

- :mod:`npusim.compile.device_interface`: ``NpuInterface``, the device
  runtime dynamo and inductor query (devices, streams, events, properties);
- :mod:`npusim.compile.inductor`: inductor's C++ kernels computing on npu
  memory, with the npu's device semantics added by the wrapper codegen
  (see Note [Compiled code in stream order]);
- :mod:`npusim.compile.generated_calls`: the helpers the generated code calls.

Note [Registering with dynamo and inductor lazily]
--------------------------------------------------
PyTorch's out-of-tree extension points live in ``torch._dynamo`` and
``torch._inductor``, and importing them costs seconds (about 2 s for dynamo,
3 s more for inductor's ``compile_fx`` on this kind of machine), against
about 0.3 s for all of ``import npusim``. Most npusim users (eager training,
FSDP2) never import either. So :func:`register` only asks to be told when
they are imported: a one-shot ``sys.meta_path`` finder wraps the loader of
``torch._dynamo`` (then registers the device interface) and of
``torch._inductor.compile_fx`` (then registers the backend). Every
``torch.compile`` imports both before it traces or generates code, so the
registrations are always in place in time; when a module is already imported,
its registration runs at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

__all__ = ["register"]


def _register_dynamo() -> None:
    from npusim.compile.device_interface import register_device_interface

    register_device_interface()


def _register_inductor() -> None:
    from npusim.compile.inductor import register_inductor_backend

    register_inductor_backend()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once, right after the module ``name`` has been executed."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; the lookup below must not find us again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        callback = self.callback

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            _run(callback)

        loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def _run(callback: Callable[[], None]) -> None:
    # A failed registration must not break torch.compile for other devices:
    # warn, and npu graphs then fail in inductor with its own error.
    try:
        callback()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"npusim: registering the npu with torch.compile failed: {error!r}", stacklevel=2)


def _when_imported(name: str, callback: Callable[[], None]) -> None:
    if name in sys.modules:
        _run(callback)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


_registered = False


def register() -> None:
    """Makes ``torch.compile`` (default inductor backend) work on the npu; idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    _when_imported("torch._dynamo", _register_dynamo)
    _when_imported("torch._inductor.compile_fx", _register_inductor)
