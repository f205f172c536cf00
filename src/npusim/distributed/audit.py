"""Audit of PyTorch FSDP2 in the running process: what has been replaced, and is it allowed?

Lists every function, method and ``fsdp::`` dispatcher kernel of PyTorch's
FSDP2 (``torch.distributed.fsdp._fully_shard``) that is not PyTorch's own, with
the file and line of the code that replaced it, and classifies each one:

- **allowed**: an enhancement hook listed in :data:`ALLOWED_ENHANCEMENTS`
  (npusim's enhancement layer adds its own via :func:`register_allowed_enhancement`);
- **forbidden**: anything else, and always anything touching the collectives
  path (:data:`COLLECTIVES_NAMES`), which docs/SPEC.md section 5 keeps upstream.

See Note [How the audit tells PyTorch's own] below. ``python -m npusim audit``
runs it and exits non-zero on a forbidden finding.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
from typing import Any, NamedTuple

import torch

from npusim.distributed import _provenance as prov

# Note [How the audit tells PyTorch's own]
# A Python function is PyTorch's own when its code object (and that of every
# decorator layer reached through ``__wrapped__``) lives under torch's install
# directory and its innermost layer is the ``def`` the module's source file
# names. Code locations are used rather than a snapshot of identities taken at
# import: a patch applied before the snapshot would pass as original.
# A dispatcher kernel is PyTorch's own when the dispatcher records it as
# registered from a torch file other than the generic ``torch.library`` helpers
# (``torch.library.impl("fsdp::...", ...)`` without a Library records
# torch/library.py as its site, so that site proves nothing).

FSDP2_PACKAGE = "torch.distributed.fsdp._fully_shard"
FSDP2_MODULES: tuple[str, ...] = tuple(
    f"{FSDP2_PACKAGE}.{name}"
    for name in (
        "_fsdp_collectives", "_fsdp_param_group", "_fsdp_state", "_fsdp_param",
        "_fully_shard", "_fsdp_common", "_fsdp_init", "_fsdp_api",
    )
) + (FSDP2_PACKAGE, "torch.distributed.fsdp")
OP_NAMESPACE = "fsdp"

# Targets containing any of these names are collectives overrides: never allowed.
COLLECTIVES_NAMES: frozenset[str] = frozenset(
    {"_get_param_all_gather_inputs", "all_gather_copy_in", "foreach_all_gather", "foreach_reduce", "finalize_backward"}
)

# target -> reason; filled by the enhancement layer through register_allowed_enhancement.
ALLOWED_ENHANCEMENTS: dict[str, str] = {}

_GENERIC_LIBRARY_SITES = (os.path.join("torch", "library.py"), os.path.join("torch", "_library") + os.sep)


class Finding(NamedTuple):
    target: str  # e.g. "torch...._fsdp_param_group.FSDPParamGroup.finalize_backward", "fsdp::x[PrivateUse1]"
    kind: str  # function, method, property, class, kernel, python-kernel, op-attribute, op
    change: str  # replaced, wrapped or added
    replacement_origin: str  # file:line of the replacing code
    status: str  # allowed or forbidden
    reason: str


class AuditReport(NamedTuple):
    findings: tuple[Finding, ...]
    checked: int  # functions, methods and kernels inspected
    torch_dir: str
    # Private FSDP2 state npusim's enhancement layer writes (never a function
    # replacement, so not a finding; see npusim.distributed.fsdp.fsdp_private).
    private_state_written: tuple[str, ...] = ()

    @property
    def forbidden(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "forbidden")

    @property
    def ok(self) -> bool:
        return not self.forbidden

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "torch_dir": self.torch_dir,
            "findings": [f._asdict() for f in self.findings],
            "private_state_written": list(self.private_state_written),
        }


def touches_collectives(target: str) -> bool:
    tokens = re.split(r"[.:\[\]]+", target)
    return any(name in token for token in tokens for name in COLLECTIVES_NAMES)


def register_allowed_enhancement(target: str, reason: str) -> None:
    """Allow the enhancement layer to replace ``target`` (named as findings name it).

    Raises ``ValueError`` for a collectives target, an empty reason, or a name
    outside FSDP2, so a typo cannot silently allow nothing.
    """
    if not reason.strip():
        raise ValueError(f"register_allowed_enhancement({target!r}): a reason is required")
    if touches_collectives(target):
        raise ValueError(
            f"register_allowed_enhancement: {target!r} is a collectives override "
            f"(touches one of {sorted(COLLECTIVES_NAMES)}); FSDP2 collectives must stay PyTorch's own")
    if not target.startswith((*FSDP2_MODULES, f"{OP_NAMESPACE}::", f"torch.ops.{OP_NAMESPACE}.")):
        raise ValueError(
            f"register_allowed_enhancement: expected a target in {FSDP2_PACKAGE}, {OP_NAMESPACE}:: or "
            f"torch.ops.{OP_NAMESPACE} but got {target!r}")
    ALLOWED_ENHANCEMENTS[target] = reason


def _classify(target: str, kind: str, change: str, origin: str) -> Finding:
    if touches_collectives(target):
        status, reason = "forbidden", "collectives override (never allowed)"
    elif target in ALLOWED_ENHANCEMENTS:
        status, reason = "allowed", ALLOWED_ENHANCEMENTS[target]
    else:
        status, reason = "forbidden", "not in ALLOWED_ENHANCEMENTS"
    return Finding(target, kind, change, origin, status, reason)


class _Collector:
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.checked = 0

    def add(self, target: str, kind: str, change: str, origin: str) -> None:
        self.findings.append(_classify(target, kind, change, origin))

    def check_function(self, target: str, kind: str, obj: Any, file: str, qualname: str) -> None:
        self.checked += 1
        verdict = prov.check_definition(obj, file, qualname)
        if verdict.change is not None:
            self.add(target, kind, verdict.change, verdict.origin)

    def check_added(self, target: str, kind: str, obj: Any) -> None:
        """An attribute the source does not bind: report it when it is Python code from outside torch."""
        if isinstance(obj, type):
            if not obj.__module__.startswith(("torch", "builtins")):
                self.add(target, "class", "added", _class_origin(obj))
            return
        if not callable(obj) or isinstance(obj, types.ModuleType):
            return
        for label, fn in prov.descriptor_parts(obj):
            foreign = [layer for layer in prov.layers(fn) if layer.file and not prov.is_library_code(layer.file)]
            if foreign:
                self.add(target + (f" ({label})" if label else ""), kind, "added", foreign[0].origin)


def _opaque(obj: Any) -> prov.Layer:
    return prov.Layer(None, "", f"<{type(obj).__qualname__} object>")


def _class_origin(cls: type) -> str:
    file = getattr(sys.modules.get(cls.__module__), "__file__", None) or "?"
    return f"{file} ({cls.__module__}.{cls.__qualname__})"


def _audit_class(col: _Collector, target: str, cls: type, node: Any, file: str) -> None:
    members = prov.class_members(node)
    for name, attr in vars(cls).items():
        member = f"{target}.{name}"
        if name not in members:
            col.check_added(member, "method", attr)
            continue
        for label, fn in prov.descriptor_parts(attr):
            kind = "property" if isinstance(attr, property) else "method"
            col.check_function(member + (f" ({label})" if label else ""), kind, fn, file, f"{cls.__qualname__}.{name}")


def _audit_module(col: _Collector, module: types.ModuleType, sources: dict[str, prov.Bindings]) -> None:
    bindings = sources[module.__name__]
    file = module.__file__ or ""
    for name, obj in vars(module).items():
        target = f"{module.__name__}.{name}"
        if name in bindings.functions:
            col.check_function(target, "function", obj, file, name)
        elif name in bindings.classes:
            col.checked += 1
            # __module__ may name a public re-export (torch.distributed.fsdp);
            # a look-alike class is caught by its members' code locations.
            if not isinstance(obj, type):
                col.add(target, "class", "replaced", (prov.layers(obj) or [_opaque(obj)])[0].origin)
            elif obj.__qualname__ != name or not obj.__module__.startswith("torch"):
                col.add(target, "class", "replaced", _class_origin(obj))
            else:
                _audit_class(col, target, obj, bindings.classes[name], file)
        elif name in bindings.imports:
            _audit_import(col, target, obj, *bindings.imports[name], sources)
        elif not name.startswith("__"):
            col.check_added(target, "function", obj)


def _audit_import(
    col: _Collector, target: str, obj: Any, source: str, attr: str, sources: dict[str, prov.Bindings]
) -> None:
    """A name imported into an FSDP2 module must still be what its source module defines."""
    if source in sources and attr in sources[source].functions:
        # Defined in FSDP2 itself: check against the defining file directly, so
        # rebinding only the importer's copy is caught too.
        col.check_function(target, "function", obj, sys.modules[source].__file__ or "", attr)
        return
    expected = getattr(sys.modules.get(source), attr, obj)
    if obj is expected or isinstance(obj, types.ModuleType):
        return
    col.checked += 1
    foreign = [layer for layer in prov.layers(obj) if not prov.in_torch(layer.file)]
    if foreign or (isinstance(obj, type) and not obj.__module__.startswith("torch")):
        origin = foreign[0].origin if foreign else _class_origin(obj)
        col.add(target, "function" if not isinstance(obj, type) else "class", "replaced", origin)


_SITE = re.compile(
    r"^(?P<key>\w+)(?P<inactive> \(inactive\))?: (?:fallthrough )?registered at (?P<site>.+?)(?: :: .*)?$")


def _is_torch_site(site: str) -> bool:
    path = os.path.realpath(site.rsplit(":", 1)[0])
    return prov.in_torch(path) and not any(part in path for part in _GENERIC_LIBRARY_SITES)


def _audit_kernels(col: _Collector) -> None:
    """Every kernel of every ``fsdp::`` op must have been registered from torch."""
    ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(f"{OP_NAMESPACE}::"))
    for op in ops:
        dump = torch._C._dispatch_dump(op)
        debug = re.search(r"^debug: registered at (.+)$", dump, re.M)
        if debug and not _is_torch_site(debug.group(1)):
            col.add(op, "op", "added", debug.group(1))
        active: dict[str, str] = {}
        torch_keys: set[str] = set()
        for line in dump.splitlines():
            if not (m := _SITE.match(line)) or m["key"] == "debug":
                continue
            if _is_torch_site(m["site"]):
                torch_keys.add(m["key"])
            if not m["inactive"]:
                active[m["key"]] = m["site"]
        for key, site in sorted(active.items()):
            col.checked += 1
            if not _is_torch_site(site):
                col.add(f"{op}[{key}]", "kernel", "replaced" if key in torch_keys else "added", site)
        _audit_op_attribute(col, op)


def _audit_op_attribute(col: _Collector, op: str) -> None:
    """``torch.ops.fsdp.<op>`` must be the op itself, and its Python kernels torch's."""
    short = op.split("::", 1)[1]
    target = f"torch.ops.{OP_NAMESPACE}.{short}"
    packet = getattr(getattr(torch.ops, OP_NAMESPACE), short)
    col.checked += 1
    if not isinstance(packet, torch._ops.OpOverloadPacket) or packet._qualified_op_name != op:
        col.add(target, "op-attribute", "replaced", (prov.layers(packet) or [_opaque(packet)])[0].origin)
        return
    for overload in packet.overloads():
        item = getattr(packet, overload)
        col.checked += 1
        if not isinstance(item, torch._ops.OpOverload) or item._schema.name != op:
            origin = (prov.layers(item) or [_opaque(item)])[0].origin
            col.add(f"{target}.{overload}", "op-attribute", "replaced", origin)
            continue
        for key, fn in item.py_kernels.items():
            foreign = [layer for layer in prov.layers(fn) if not prov.in_torch(layer.file)]
            if foreign:
                col.add(f"{target}.{overload}[py:{key}]", "python-kernel", "added", foreign[0].origin)


def audit_fsdp() -> AuditReport:
    """Inspect the running process. Imports the FSDP2 modules; changes nothing."""
    modules = [importlib.import_module(name) for name in FSDP2_MODULES]
    sources = {m.__name__: prov.module_bindings(m) for m in modules}
    col = _Collector()
    for module in modules:
        _audit_module(col, module, sources)
    _audit_kernels(col)
    from npusim.distributed.fsdp.fsdp_private import WRITTEN

    written = tuple(f"{p.owner}.{p.name}" for p in WRITTEN)
    return AuditReport(tuple(col.findings), col.checked, prov.TORCH_DIR, written)
