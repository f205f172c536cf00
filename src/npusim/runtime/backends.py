"""``torch.backends.npu``: the backend switches scripts written for torch_npu set and read.

The switches are PyTorch's own global flags, the ones ``torch.backends.cuda`` reads and
writes, so ``torch.backends.npu.matmul.allow_tf32`` follows
``torch.set_float32_matmul_precision`` exactly as on CUDA. They are stored, with no effect
on results: npu compute runs PyTorch's CPU kernels, which use neither TF32 nor the fused
attention kernels these switches select.
"""

from __future__ import annotations

import torch
import torch.backends.cuda as _cuda

__all__ = [
    "enable_flash_sdp", "enable_math_sdp", "enable_mem_efficient_sdp", "flash_sdp_enabled", "math_sdp_enabled",
    "matmul", "mem_efficient_sdp_enabled", "preferred_linalg_library", "sdp_kernel",
]

# PyTorch's objects over the global flags (allow_tf32, allow_fp16/bf16_reduced_precision_reduction).
matmul = _cuda.matmul
flash_sdp_enabled = _cuda.flash_sdp_enabled
enable_flash_sdp = _cuda.enable_flash_sdp
mem_efficient_sdp_enabled = _cuda.mem_efficient_sdp_enabled
enable_mem_efficient_sdp = _cuda.enable_mem_efficient_sdp
math_sdp_enabled = _cuda.math_sdp_enabled
enable_math_sdp = _cuda.enable_math_sdp
sdp_kernel = _cuda.sdp_kernel


def preferred_linalg_library(backend: None | str | torch._C._LinalgBackend = None) -> torch._C._LinalgBackend:
    """torch_npu's: there is no npu linear-algebra library to choose, so every ``backend`` is accepted and
    the answer is ``Default`` (torch.cuda's would switch CPU-visible global state to cusolver / magma)."""
    return torch._C._LinalgBackend.Default
