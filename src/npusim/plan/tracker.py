"""Where an unmodified training script is: its step, its phase (forward, backward, optimizer) and its module.

The tracker installs global hooks only (no change to the script, its modules' hooks or their autograd
graph): module forward pre / post hooks (``register_module_forward_pre_hook``), gradient hooks on each
module's outputs and inputs for its backward (``torch.autograd.graph.register_multi_grad_hook``, no
backward hook that wraps the module), optimizer step pre / post hooks
(``register_optimizer_step_pre_hook``), and one dispatch mode that sees every op: it tells backward from
forward (an op runs inside autograd's graph task) and counts FLOPs with torch.utils.flop_counter's
formulas (the ones the cost model prices, Note [Compute cost model]).

Each change of step, phase or module is a :class:`Mark`, and a zero-length range ``npusim.plan#<seq>``
in torch.profiler's recording: the report puts the profiler's memory events between the marks on the
profiler's own clock (See Note [The step report] in plan/session.py). The hooks never synchronize and
launch nothing, so the chip clock runs as it runs without them.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._C._profiler import _RecordFunctionFast
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from npusim.runtime import timing

__all__ = ["MARK_PREFIX", "PHASES", "Mark", "StepTracker"]

PHASES = ("forward", "backward", "optimizer")
MARK_PREFIX = "npusim.plan#"
OUTSIDE = "-"  # the module of work outside every module (the loss, zero_grad, the optimizer's own ops)


class Mark(NamedTuple):
    """A change of where the script is, from this mark to the next."""

    seq: int
    step: int  # 1 for the first step
    phase: str  # one of PHASES
    module: str  # qualified name of the innermost module running, or OUTSIDE
    host_us: float  # the host's chip clock (npusim.timing.host_clock_us)
    kind: str  # what moved: "start", "step", "phase", "module", "step_end"


def _guarded(hook: Callable[..., None]) -> Callable[..., None]:
    """A hook of the tracker never breaks the job: its first error turns the tracker off, saying so."""
    @functools.wraps(hook)
    def run(self: StepTracker, *args: Any) -> None:
        if self.broken is not None:
            return
        try:
            hook(self, *args)
        except Exception as error:  # noqa: BLE001
            self.broken = f"{hook.__name__}: {type(error).__name__}: {error}"
            print(f"npusim report: the step tracker stopped ({self.broken}); the job goes on", file=sys.stderr)
    return run


def class_name(module: torch.nn.Module) -> str:
    """The module's class name; a module fully_shard made an FSDP<Name> gets its own class's name back."""
    cls = type(module)
    name = cls.__name__
    if name.startswith("FSDP") and any(base.__name__ == name[4:] for base in cls.__bases__):
        return name[4:]
    return name


class _Counter(TorchDispatchMode):
    """Counts FLOPs per dtype of every op (flop_counter's formulas) and tells the tracker of each op."""

    def __init__(self, tracker: StepTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace != "profiler":
            self.tracker._on_op()
        out = func(*args, **kwargs)
        formula = flop_counter.flop_registry.get(func._overloadpacket)
        # An op on a tensor subclass (a DTensor) is not counted: its shapes are global, not what this rank
        # runs, and its local ops run below this mode (FSDP2 computes on plain tensors; tensor parallelism's
        # DTensor matmuls are left out of the FLOPs).
        subclass = any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types)
        if formula is not None and self.tracker.count_flops and not subclass:
            try:
                flops = int(formula(*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001  (a formula that cannot read these arguments counts nothing)
                flops = 0
            dtype = next((leaf.dtype for leaf in tree_leaves((args, kwargs))
                          if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()), torch.float32)
            self.tracker._add_flops(str(dtype).removeprefix("torch."), flops)
        return out


class StepTracker:
    """Follows steps, phases and modules (See the module's docstring); ``on_step(step, host_us)`` is called
    when a step ends (its last optimizer.step returned)."""

    def __init__(self, on_step: Callable[[int, float], None] | None = None, on_mark: Callable[[Mark], None] |
                 None = None, count_flops: bool = True) -> None:
        self.on_step = on_step
        self.on_mark = on_mark
        self.count_flops = count_flops
        self.broken: str | None = None  # why the tracker stopped following the job (an error of its own)
        self.marks: list[Mark] = []
        self.step_ends: dict[int, int] = {}  # step -> seq of its end mark (the last optimizer.step's return)
        self.flops: dict[int, dict[str, int]] = {}  # step -> dtype -> FLOPs
        self.step = 1
        self.phase = "forward"
        self._stack: list[str] = []  # forward modules, innermost last
        self._backward_module = OUTSIDE
        self._after_optimizer = False  # an optimizer.step returned and nothing else ran since
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._parents: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._handles: list[Any] = []
        self._mode: _Counter | None = None
        self._lock = threading.RLock()
        self._busy = threading.local()  # set while the tracker itself runs (its marks dispatch nothing)

    # ---- installing -------------------------------------------------------------------------------------

    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post),
            optimizer.register_optimizer_step_pre_hook(self._optimizer_pre),
            optimizer.register_optimizer_step_post_hook(self._optimizer_post),
        ]
        if self.count_flops:  # without it the backward begins at the first module's gradient hook
            self._mode = _Counter(self)
            self._mode.__enter__()
        self._mark("start")

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001  (the script left a mode of its own above ours)
                pass
            self._mode = None

    # ---- what the report reads ----------------------------------------------------------------------------

    @property
    def steps_done(self) -> int:
        return len(self.step_ends)

    def module_name(self, module: torch.nn.Module) -> str:
        name = self._names.get(module)
        if name is None:
            parent = self._stack[-1] if self._stack else None
            if parent is None:  # a root: every module under it gets its qualified name
                root = class_name(module)
                for path, sub in module.named_modules():
                    self._names.setdefault(sub, f"{root}.{path}" if path else root)
                name = self._names[module]
            else:
                name = f"{parent}.{class_name(module)}"
                self._names[module] = name
        return name

    # ---- hooks --------------------------------------------------------------------------------------------

    def _current_module(self) -> str:
        if self._stack:
            return self._stack[-1]
        return self._backward_module if self.phase == "backward" else OUTSIDE

    def _mark(self, kind: str) -> None:
        with self._lock:
            self._busy.on = True
            try:
                mark = Mark(len(self.marks), self.step, self.phase, self._current_module(), timing.host_clock_us(),
                            kind)
                with _RecordFunctionFast(f"{MARK_PREFIX}{mark.seq}"):
                    pass
                self.marks.append(mark)
            finally:
                self._busy.on = False
        if self.on_mark is not None:
            self.on_mark(mark)

    def _new_step_if_due(self) -> None:
        if self._after_optimizer:
            self._after_optimizer = False
            self.step += 1
            self.phase = "forward"
            self._backward_module = OUTSIDE
            self._stack.clear()
            self._mark("step")

    @_guarded
    def _on_op(self) -> None:
        if getattr(self._busy, "on", False):
            return
        in_backward = torch._C._current_graph_task_id() != -1
        if not in_backward:
            self._new_step_if_due()
        elif self.phase == "forward":
            self.phase = "backward"
            self._mark("phase")

    @_guarded
    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if torch._C._current_graph_task_id() == -1:
            self._new_step_if_due()
        name = self.module_name(module)
        self._parents[module] = self._current_module()
        self._stack.append(name)
        self._mark("module")

    @_guarded
    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self._names.get(module)
        if self._stack and self._stack[-1] == name:
            self._stack.pop()
        elif name in self._stack:
            del self._stack[self._stack.index(name):]
        self._mark("module")
        if self.phase != "forward" or not torch.is_grad_enabled():
            return
        outputs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        inputs = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad]
        parent = self._parents.get(module, OUTSIDE)
        if outputs:
            torch.autograd.graph.register_multi_grad_hook(outputs, lambda grads, n=name: self._backward_enter(n),
                                                          mode="any")
        if inputs:
            torch.autograd.graph.register_multi_grad_hook(
                inputs, lambda grads, n=name, p=parent: self._backward_leave(n, p), mode="any")

    @_guarded
    def _backward_enter(self, name: str) -> None:
        """A module's backward begins: the gradient of one of its outputs is there."""
        if self.phase == "forward":
            self.phase = "backward"
        # A module and its last child share the output: both hooks fire, the child's first; the child's stays.
        if self.phase == "backward" and not self._backward_module.startswith(name + "."):
            self._backward_module = name
            self._mark("module")

    @_guarded
    def _backward_leave(self, name: str, parent: str) -> None:
        """A module's backward ends (its inputs' gradient is there): back to its parent, unless the next
        module's backward has begun already (its output is this module's input: the hooks fire together)."""
        if self.phase == "backward" and self._backward_module == name:
            self._backward_module = parent
            self._mark("module")

    @_guarded
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._after_optimizer = False
        if self.phase != "optimizer":
            self.phase = "optimizer"
            self._stack.clear()
            self._mark("phase")

    @_guarded
    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._after_optimizer = True
        first = self.step not in self.step_ends
        self._mark("step_end")
        self.step_ends[self.step] = self.marks[-1].seq
        if first and self.on_step is not None:
            self.on_step(self.step, self.marks[-1].host_us)

    def _add_flops(self, dtype: str, flops: int) -> None:
        if flops:
            by_dtype = self.flops.setdefault(self.step, {})
            by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
