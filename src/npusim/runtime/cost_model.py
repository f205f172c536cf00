"""The timing model's compute cost: how long an op's task lasts on the profile's chip.

Note [Compute cost model]
~~~~~~~~~~~~~~~~~~~~~~~~~
With the compute model on (``npusim.timing.set(compute=True)``, ``NPUSIM_TIMING="compute=1"``) a
compute task occupies its stream for the roofline time of its op on the current profile's chip
(Note [Chip figures] in runtime/profiles.py), plus the timing model's per-task ``launch_us``:

    us = launch_us + max(flops / (peak(unit, dtype) x efficiency(kernel class)),
                         bytes / (hbm_bandwidth x hbm_eff))

- flops: the op's formula in PyTorch's own registry, ``torch.utils.flop_counter.flop_registry``
  (matmuls, convolutions and their backward, scaled-dot-product attention and its backward;
  npusim adds the formulas of its fused attention operators and npu_grouped_matmul there).
  An op with a formula runs on the cube units; every other op on the vector units, counted as
  one operation per element of its largest tensor.
- peak: the cube's float16 / bfloat16 rate, its float32 rate, twice the 16-bit rate for int8;
  the vector units' 16-bit or 32-bit rate by element size (64-bit at half the 32-bit rate). A
  dtype the cube has no rate for (float64, complex, wide ints) runs on the vector units.
- bytes: every tensor the op reads or writes once, inputs and outputs (an in-place op's tensor
  is read and written), over the HBM bandwidth; caches are not modelled.
- efficiency: what real kernels reach of the peak, by the op's kernel class (Note [Calibrated
  efficiencies] in runtime/profiles.py): a cube op whose name has "attention" in it is class
  "attention"; any other cube op is "cube_small", "cube_medium" or "cube_large" by its arithmetic
  intensity, flops / bytes (below SMALL_INTENSITY, below LARGE_INTENSITY, or at least that); a
  vector op is "vector". A profile with roofline=True reaches every peak (efficiency 1.0).
The op's dtype is that of its first floating-point tensor argument (else its first tensor).
Intensity, not size, picks the class because it says how often a cube core reuses each byte it loads:
a matmul with a short side (a small M, N or K) moves a large share of its bytes per FLOP, however many
FLOPs it has, and reaches less of the cube's peak (the classes' figures are the Note's).
Short ops are dominated by the launch cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils import flop_counter
from torch.utils._pytree import tree_leaves

from npusim.runtime.profiles import Profile, get_profile

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)
# FLOP per byte bounds of the matmul shape classes (Note [Calibrated efficiencies]).
SMALL_INTENSITY = 256.0
LARGE_INTENSITY = 1024.0


class OpCost(NamedTuple):
    """One op's modelled cost: what bounds it, and its duration in microseconds."""

    flops: int
    bytes: int
    unit: str  # "cube" or "vector"
    peak_tflops: float
    compute_us: float
    memory_us: float
    launch_us: float
    kernel: str = "vector"  # the kernel class whose efficiency prices it: cube_small, ..., attention, vector
    efficiency: float = 1.0  # the fraction of peak_tflops it reaches

    @property
    def us(self) -> float:
        return self.launch_us + max(self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_us >= self.memory_us else "memory"


def _tensors(*trees: Any) -> Iterator[torch.Tensor]:
    for leaf in tree_leaves(trees):
        if isinstance(leaf, torch.Tensor):
            yield leaf


def _dtype(args: Any, kwargs: Any, out: Any) -> torch.dtype:
    tensors = list(_tensors(args, kwargs)) or list(_tensors(out))
    if not tensors:
        return torch.float32
    return next((t.dtype for t in tensors if t.is_floating_point()), tensors[0].dtype)


def peak_tflops(profile: Profile, unit: str, dtype: torch.dtype) -> tuple[str, float]:
    """The (unit, TFLOPS) an op of ``dtype`` meant for ``unit`` ("cube" / "vector") runs at."""
    if unit == "cube":
        if dtype in _SIXTEEN_BIT:
            return unit, profile.cube_tflops
        if dtype == torch.float32:
            return unit, profile.cube_fp32_tflops
        if dtype in (torch.int8, torch.uint8):
            return unit, 2 * profile.cube_tflops
        unit = "vector"  # the cube has no rate for this dtype
    size = dtype.itemsize
    if size <= 2:
        return unit, profile.vector_tflops
    if size == 4:
        return unit, profile.vector_fp32_tflops
    return unit, profile.vector_fp32_tflops / 2


def kernel_class(op: torch._ops.OpOverload, unit: str, flops: int, nbytes: int) -> str:
    """The class whose efficiency prices an op running on ``unit`` (See Note [Compute cost model])."""
    if unit != "cube":
        return "vector"
    if "attention" in op.overloadpacket.__name__:
        return "attention"
    intensity = flops / max(nbytes, 1)
    if intensity < SMALL_INTENSITY:
        return "cube_small"
    return "cube_medium" if intensity < LARGE_INTENSITY else "cube_large"


def split_arguments(op: torch._ops.OpOverload, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An op's arguments in schema order as the (args, kwargs) a call passes: keyword-only ones by name."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for argument, value in zip(op._schema.arguments, inputs, strict=False):
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


def op_cost(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
            out: Any = None, *, profile: Profile | None = None, launch_us: float = 0.0) -> OpCost:
    """The cost of ``op(*args, **kwargs) -> out`` (tensors real, fake or meta) on ``profile``: its roofline
    with each peak scaled by the profile's efficiency for the op's kernel class (Note [Compute cost model])."""
    kwargs = kwargs or {}
    profile = profile or get_profile()
    formula = flop_counter.flop_registry.get(op.overloadpacket)
    tensors = list(_tensors(args, kwargs, out))
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    if formula is not None:
        flops, unit = int(formula(*args, **kwargs, out_val=out)), "cube"
    else:
        flops, unit = max((t.numel() for t in tensors), default=0), "vector"
    unit, peak = peak_tflops(profile, unit, _dtype(args, kwargs, out))
    kernel = kernel_class(op, unit, flops, nbytes)
    efficiency = profile.efficiency(kernel)
    # 1 TFLOPS is 1e6 FLOP per microsecond; 1 GB/s is 1e3 bytes per microsecond.
    return OpCost(flops, nbytes, unit, peak, flops / (peak * efficiency * 1e6),
                  nbytes / (profile.hbm_gbps * profile.efficiency("hbm") * 1e3), launch_us, kernel, efficiency)
