"""The npu in AOTAutograd's recomputation of seeded ops: ``run_and_save_rng_state`` and
``run_with_rng_state`` for npu tensors.

Note [Recomputed seeded ops on the npu]
---------------------------------------
When a compiled region recomputes a seeded op in its backward (activation checkpointing,
or the partitioner choosing to recompute), AOTAutograd's partitioner
(``functionalize_rng_ops`` in ``torch/_functorch/partitioners.py``) wraps the forward call
in the higher-order op ``run_and_save_rng_state`` (returns the generator's state, then the
op's result) and the backward call in ``run_with_rng_state`` (sets that state, runs the op,
puts the old state back), so both draw the same numbers. SDPA's fused op is seeded (its
``dropout_p``), so any checkpointed block with attention takes this path. torch implements
the two ops for cpu, cuda, hpu and xpu only, in closures whose device table cannot be
extended, and asserts "Backend not supported" for any other device.

Its other route, ``graphsafe_run_with_rng_state`` (``register_graphsafe_rng_device_type``),
is not open to the npu: inductor's lowering of it asserts a cuda device (``ir.py``,
``process_kernel``). So :func:`register` adds the npu to the first route, the way torch
serves cuda: the state saved is the npu default generator's (seed, offset), the device's
own ``torch.npu.get_rng_state`` / ``set_rng_state``, of the device of the op's first
tensor. It wraps the three entry points that choose the device: the ``BackendSelect``
kernel (real tensors, what inductor's fallback kernel calls at run time), the fake kernel
(``registered_hop_fake_fns``, inductor's shape propagation) and the proxy-mode kernel
(tracing a graph that already holds the op); every other device goes on to torch's own.
Under ``torch._inductor.config.fallback_random`` and everywhere else the partitioner
takes this route, as cuda does when its graph-safe route is off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey

__all__ = ["register"]

_registered = False


def _npu_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """The npu device the op runs on, by torch's rule (``rng_prims.get_device``): the
    ``device`` keyword, else the first tensor argument; None when that is not an npu."""
    device = kwargs.get("device")
    if device is None:
        device = next((arg.device for arg in args if isinstance(arg, torch.Tensor)), None)
    device = None if device is None else torch.device(device)
    if device is None or device.type != torch._C._get_privateuse1_backend_name():
        return None
    return device


def run_and_save_rng_state(op: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The npu's ``run_and_save_rng_state``: the 16-byte state of the op's device's default
    generator before the op, and the op's result."""
    device = _npu_device(args, kwargs)
    return torch.npu.get_rng_state(device), op(*args, **kwargs)


def run_with_rng_state(rng_state: torch.Tensor, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The npu's ``run_with_rng_state``: the op run from ``rng_state`` (a state
    :func:`run_and_save_rng_state` saved); the generator's own state is restored after."""
    device = _npu_device(args, kwargs)
    if not isinstance(rng_state, torch.Tensor) or rng_state.dtype != torch.uint8 or rng_state.device.type != "cpu":
        raise RuntimeError(
            f"run_with_rng_state on {device}: expected the npu generator state saved by run_and_save_rng_state "
            f"(a cpu uint8 tensor), got {type(rng_state).__name__}"
            + (f" {rng_state.dtype} on {rng_state.device}" if isinstance(rng_state, torch.Tensor) else ""))
    current = torch.npu.get_rng_state(device)
    torch.npu.set_rng_state(rng_state, device)
    try:
        return op(*args, **kwargs)
    finally:
        torch.npu.set_rng_state(current, device)


def _or_torch(npu_impl: Callable[..., Any], torch_impl: Callable[..., Any], state_first: bool) -> Callable[..., Any]:
    """A kernel that runs ``npu_impl`` for an op on npu tensors and torch's own kernel otherwise."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        op_args = args[2:] if state_first else args[1:]
        if _npu_device(op_args, kwargs) is not None:
            return npu_impl(*args, **kwargs)
        return torch_impl(*args, **kwargs)

    return kernel


def _traced_run_and_save(mode: Any, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Proxy-mode kernel of ``run_and_save_rng_state`` on the npu: runs it and records the call
    (torch's cuda kernel does the same with the cuda state)."""
    from torch._prims.rng_prims import run_and_save_rng_state as hop
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    out = run_and_save_rng_state(op, *args, **kwargs)
    proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, (op, *args))
    proxy_kwargs = pytree.tree_map(mode.tracer.unwrap_proxy, kwargs)
    out_proxy = mode.tracer.create_proxy("call_function", hop, proxy_args, proxy_kwargs)
    return track_tensor_tree(out, out_proxy, constant=None, tracer=mode.tracer)


def register() -> None:
    """Adds the npu to ``run_and_save_rng_state`` and ``run_with_rng_state`` (idempotent).
    See Note [Recomputed seeded ops on the npu]."""
    global _registered
    if _registered:
        return
    from torch._higher_order_ops import utils as hop_utils
    from torch._prims import rng_prims
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

    save, run_with = rng_prims.run_and_save_rng_state, rng_prims.run_with_rng_state
    save.py_kernels[DispatchKey.BackendSelect] = _or_torch(
        run_and_save_rng_state, save.py_kernels[DispatchKey.BackendSelect], state_first=False)
    run_with.py_kernels[DispatchKey.BackendSelect] = _or_torch(
        run_with_rng_state, run_with.py_kernels[DispatchKey.BackendSelect], state_first=True)
    hop_utils.registered_hop_fake_fns[save] = _or_torch(
        run_and_save_rng_state, hop_utils.registered_hop_fake_fns[save], state_first=False)
    torch_proxy = save.python_key_table[ProxyTorchDispatchMode]

    def proxy_kernel(mode: Any, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _npu_device(args, kwargs) is not None:
            return _traced_run_and_save(mode, op, *args, **kwargs)
        return torch_proxy(mode, op, *args, **kwargs)

    save.python_key_table[ProxyTorchDispatchMode] = proxy_kernel
    for hop in (save, run_with):
        hop._dispatch_cache.clear()
    _registered = True
