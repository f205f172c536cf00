"""Where a Python callable's code comes from, for the FSDP2 patch auditor.

Provenance is read from code objects, not from a snapshot taken at some
import: a snapshot cannot see a patch applied before it was taken, while a
function's ``__code__.co_filename`` and ``co_qualname`` always say where it was
written. What a module is *supposed* to bind is read from its source file
(its ``def``, ``class`` and ``from ... import`` statements).
"""

from __future__ import annotations

import ast
import functools
import os
import sysconfig
import types
from typing import Any, NamedTuple

import torch
import typing_extensions

TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
# torch's own decorators come from these too (typing_extensions.deprecated).
_LIBRARY_FILES = (os.path.realpath(typing_extensions.__file__),)
# Wrapper types from the standard library with no code of their own
# (functools.lru_cache, ...); they neither add nor hide behaviour of note.
_NEUTRAL_WRAPPER_MODULES = frozenset({"functools", "builtins", "_functools"})


class Layer(NamedTuple):
    """One layer of a (possibly decorated) callable."""

    file: str | None  # real path of its code, None when it has no Python code
    qualname: str  # co_qualname, or the type's name when it has no code
    origin: str  # "file:line (module.qualname)" for reports


def _real(filename: str) -> str:
    # "<string>" (dataclass and namedtuple methods) is a marker, not a path.
    return filename if filename.startswith("<") else os.path.realpath(filename)


def _layer(obj: Any) -> Layer | None:
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        module = getattr(obj, "__module__", None) or "?"
        origin = f"{code.co_filename}:{code.co_firstlineno} ({module}.{code.co_qualname})"
        return Layer(_real(code.co_filename), code.co_qualname, origin)
    kind = type(obj)
    if kind.__module__ in _NEUTRAL_WRAPPER_MODULES and hasattr(obj, "__wrapped__"):
        return None
    call_code = getattr(vars(kind).get("__call__"), "__code__", None)
    if isinstance(call_code, types.CodeType):
        # A callable object: its class's __call__ is the code that runs.
        origin = f"{call_code.co_filename}:{call_code.co_firstlineno} ({kind.__module__}.{kind.__qualname__})"
        return Layer(_real(call_code.co_filename), call_code.co_qualname, origin)
    return Layer(None, kind.__qualname__, f"<{kind.__module__}.{kind.__qualname__} object, no Python code>")


def layers(obj: Any) -> list[Layer]:
    """The code layers of ``obj``, outermost first, following ``__wrapped__`` and partials."""
    out: list[Layer] = []
    seen: set[int] = set()
    while obj is not None and id(obj) not in seen and len(seen) < 32:
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            obj = obj.func
            continue
        if (layer := _layer(obj)) is not None:
            out.append(layer)
        obj = getattr(obj, "__wrapped__", None)
    return out


def in_torch(path: str | None) -> bool:
    return path is not None and path.startswith(TORCH_DIR)


def is_library_code(path: str | None) -> bool:
    """True for code from torch, its decorator dependencies, the standard library, or generated ("<string>")."""
    return path is not None and (path.startswith((TORCH_DIR, _STDLIB_DIR, "<")) or path in _LIBRARY_FILES)


class Verdict(NamedTuple):
    change: str | None  # None: PyTorch's own; else "replaced" or "wrapped"
    origin: str  # where the replacing code lives


def check_definition(obj: Any, file: str, qualname: str) -> Verdict:
    """Is ``obj`` the function PyTorch defines as ``qualname`` in ``file``?

    The innermost layer must be ``qualname`` from ``file``, and every decorator
    layer around it code from torch or the standard library (``torch.no_grad``,
    ``contextlib.contextmanager``).
    """
    found = layers(obj)
    if not found:
        return Verdict("replaced", f"<{type(obj).__qualname__} object>")
    inner = found[-1]
    foreign = [layer for layer in found if not is_library_code(layer.file)]
    if inner.file == os.path.realpath(file) and inner.qualname == qualname:
        return Verdict("wrapped", foreign[0].origin) if foreign else Verdict(None, inner.origin)
    return Verdict("replaced", (foreign[0] if foreign else inner).origin)


class Bindings(NamedTuple):
    """What a module's source binds at top level."""

    functions: set[str]
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str]]  # local name -> (absolute module, attribute)


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements of a module body, looking inside ``if`` and ``try`` blocks."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            out += _top_level(stmt.body) + _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            out += _top_level(stmt.body) + _top_level(stmt.orelse) + _top_level(stmt.finalbody)
            for handler in stmt.handlers:
                out += _top_level(handler.body)
        else:
            out.append(stmt)
    return out


def module_bindings(module: types.ModuleType) -> Bindings:
    with open(module.__file__ or "", encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module.__package__ or ""
    bindings = Bindings(set(), {}, {})
    for stmt in _top_level(tree.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            bindings.functions.add(stmt.name)
        elif isinstance(stmt, ast.ClassDef):
            bindings.classes[stmt.name] = stmt
        elif isinstance(stmt, ast.ImportFrom) and stmt.module != "__future__":
            base = stmt.module or ""
            if stmt.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - stmt.level + 1] + ([base] if base else []))
            for alias in stmt.names:
                bindings.imports[alias.asname or alias.name] = (base, alias.name)
    return bindings


def class_members(node: ast.ClassDef) -> set[str]:
    """Names a class body defines with ``def`` (properties and their setters included)."""
    return {stmt.name for stmt in node.body if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)}


def descriptor_parts(attr: Any) -> list[tuple[str, Any]]:
    """The callables behind a class attribute: (label, callable) pairs."""
    if isinstance(attr, staticmethod | classmethod):
        return [("", attr.__func__)]
    if isinstance(attr, property):
        parts = [("getter", attr.fget), ("setter", attr.fset), ("deleter", attr.fdel)]
        return [(label, fn) for label, fn in parts if fn is not None]
    if isinstance(attr, functools.cached_property):
        return [("", attr.func)]
    return [("", attr)]
