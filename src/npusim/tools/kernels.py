"""``python -m npusim kernels [OP]``: which file registers the npu kernel of each aten op, and how it runs.

Read from what the process registers, not from a list: the dispatcher's PrivateUse1 table names the
file of every kernel npusim registers, and the rules of the launch path (Note [Compute on the stream]
in csrc/aten/launch/op_launch.cpp; ``op_traits.cpp``'s ``host_only``) say how an op given to the fallback
runs. Without OP it lists every aten op with its own npu kernel; with OP (``add``, ``add.Tensor`` or
``aten::add.Tensor``) it also covers the ops that reach the boxed fallback or decompose. What it cannot
see without running the op: a Meta kernel that fails for one signature (its calls then run on the
host), and the idle-stream rule that runs short work on the host (Note [Work on an idle stream]).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import NamedTuple

import torch

import npusim
from npusim.ops import FALLBACK_ROUTES

PACKAGE = Path(npusim.__file__).resolve().parent
_REGISTERED_AT = re.compile(r"^PrivateUse1: registered at (\S+?):\d+ ", re.MULTILINE)
_CPU_ENTRY = re.compile(r"^CPU: (.*)$", re.MULTILINE)
_META_ENTRY = re.compile(r"^Meta: (.*)$", re.MULTILINE)
_FALLBACK = "csrc/aten/fallback.cpp"
# Files whose kernels run CPU's kernel through the launch path (a stream task unless op_traits says host).
_LAUNCHED = {_FALLBACK, "csrc/aten/fallback_routes.cpp"}

# Kernels that are no compute: how each runs, by file (and by op where a file's kernels differ).
_KERNEL_KIND = {
    "csrc/aten/foreach_copy.cpp": ("router: fast / batch stream tasks, slow per pair, compat "
                                   "(Note [The _foreach_copy_ router])"),
    "csrc/aten/random_ops.cpp": "stream task: Philox kernel (Note [npu Philox stream])",
    "csrc/aten/zero_tensor.cpp": "host: metadata only (a zero tensor owns no memory)",
    "csrc/aten/record_stream.cpp": "host: allocator bookkeeping (the block's streams)",
    "csrc/aten/attention.cpp": "host: returns a host value (the SDPA backend choice)",
    "torch": "PyTorch's own kernel (c10d functional collectives)",
}
_PYTHON_KERNEL = "python kernel: launches npu ops (each a stream task)"
_ATEN_OPS = {
    "aten::_copy_from": "stream task: copy (copy rules, docs/SPEC.md section 3)",
    "aten::_copy_from_and_resize": "stream task: copy (copy rules, docs/SPEC.md section 3)",
    "aten::_local_scalar_dense": "host: waits for the stream, reads the value",
}
_ATEN_OPS_DEFAULT = "host: allocation or metadata, no device work"


class Kernel(NamedTuple):
    op: str
    file: str
    how: str


def kernel_providers() -> dict[str, str]:
    """aten op -> the file that registered its PrivateUse1 kernel (npusim's relative to the package)."""
    providers = {}
    for name in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"):
        if not name.startswith("aten::"):
            continue
        match = _REGISTERED_AT.search(torch._C._dispatch_dump(name))
        if match is None:
            raise RuntimeError(f"{name}: no PrivateUse1 kernel in its dispatch table")
        path = Path(match.group(1)).resolve()
        providers[name] = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else "torch"
    return providers


def _schema(name: str) -> torch.FunctionSchema:
    base, overload = _split(name.removeprefix("aten::"))
    return getattr(getattr(torch.ops.aten, base), overload or "default")._schema


def _is_tensor(type_: torch._C.Type) -> bool:
    if isinstance(type_, torch._C.ListType | torch._C.OptionalType):
        return isinstance(type_.getElementType(), torch._C.TensorType)
    return isinstance(type_, torch._C.TensorType)


def _returns_only_tensors(name: str) -> bool:
    return all(_is_tensor(ret.type) for ret in _schema(name).returns)


def _cpu_kernel(name: str) -> str | None:
    """The CPU entry of the op's computed dispatch table, None when CPU has no kernel."""
    match = _CPU_ENTRY.search(torch._C._dispatch_dump_table(name))
    if match is None or "fallthrough" in match.group(1) or "[missing]" in match.group(1):
        return None
    return match.group(1)


def _launched(name: str) -> str:
    """How the launch path runs an op it gives CPU's kernel (op_traits.cpp's host_only rule)."""
    cpu = _cpu_kernel(name)
    if cpu is None:
        return "refusal: CPU has no kernel (PyTorch's NotImplementedError, as on CPU)"
    if not _returns_only_tensors(name):
        return "host: returns a host value computed from device data"
    if not any(ext in cpu for ext in (".cpp:", ".cc:", ".h:", ".hpp:", ".cu:")):
        return "host: its CPU kernel is a Python function"
    base, overload = _split(name.removeprefix("aten::"))
    if torch.Tag.dynamic_output_shape in getattr(getattr(torch.ops.aten, base), overload or "default").tags:
        return "host: data-dependent output shape (its Meta kernel cannot size the outputs)"
    meta = _META_ENTRY.search(torch._C._dispatch_dump_table(name))
    if meta is None or "MetaFallbackKernel" in meta.group(1):
        return "host: no Meta kernel (output shapes unknown before the data)"
    route = FALLBACK_ROUTES.get(name)
    return f"stream task ({route} fallback route)" if route else "stream task (boxed fallback)"


def _cuda_rule_then_launched(name: str) -> str:
    return _launched(name).replace("stream task (", "stream task (CUDA's rule, then ", 1)


def how_it_runs(name: str, file: str) -> str:
    if file in _LAUNCHED:
        return _launched(name)
    if file == "csrc/aten/cuda_semantics.cpp":  # Note [npu follows CUDA where CPU differs]
        return _cuda_rule_then_launched(name)
    if file == "csrc/aten/aten_ops.cpp":
        return _ATEN_OPS.get(name, _ATEN_OPS_DEFAULT)
    if file.endswith(".py"):
        return _PYTHON_KERNEL
    return _KERNEL_KIND.get(file, "unknown")


def _split(name: str) -> tuple[str, str]:
    base, _, overload = name.partition(".")
    return base, overload


def registered_kernels() -> list[Kernel]:
    """Every aten op with an npu kernel of its own, sorted by op name."""
    return [Kernel(name, file, how_it_runs(name, file)) for name, file in sorted(kernel_providers().items())]


def lookup(op: str) -> list[Kernel]:
    """The kernels of ``op`` ("add", "add.Tensor" or "aten::add.Tensor"; without an overload, all of them)."""
    name = op if op.startswith("aten::") else f"aten::{op}"
    providers = kernel_providers()
    if "." in name.removeprefix("aten::"):
        names = [name]
    else:
        names = [n for n in torch._C._dispatch_get_all_op_names() if n == name or n.startswith(name + ".")]
    found = []
    for n in sorted(names):
        if n in providers:
            found.append(Kernel(n, providers[n], how_it_runs(n, providers[n])))
        elif torch._C._dispatch_has_kernel_for_dispatch_key(n, "CompositeImplicitAutograd"):
            found.append(Kernel(n, "(none)", "composite: decomposes into the ops it calls, each as listed"))
        else:
            found.append(Kernel(n, _FALLBACK, _launched(n)))
    return found


def format_table(kernels: list[Kernel]) -> str:
    rows = [("OP", "FILE", "HOW IT RUNS"), *kernels]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}" for row in rows)


def file_counts(kernels: list[Kernel]) -> dict[str, int]:
    """Kernels per registering file, most first."""
    counts: dict[str, int] = {}
    for kernel in kernels:
        counts[kernel.file] = counts.get(kernel.file, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", nargs="?", help="an aten op: add, add.Tensor or aten::add.Tensor (default: all)")


def run(args: argparse.Namespace) -> int:
    kernels = lookup(args.op) if args.op else registered_kernels()
    if not kernels:
        print(f"no aten op named {args.op}")
        return 1
    print(format_table(kernels))
    if not args.op:
        print(f"\n{len(kernels)} aten ops have an npu kernel of their own; every other aten op reaches "
              f"{_FALLBACK}'s boxed fallback (or decomposes). Per file: "
              + ", ".join(f"{file} {n}" for file, n in file_counts(kernels).items()))
    return 0
