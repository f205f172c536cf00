"""The one ordered registration step, and which file provides the npu kernel of each aten op."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from npusim.ops import FALLBACK_ROUTES
from npusim.tools.kernels import kernel_providers  # the table `python -m npusim kernels` prints


def test_each_aten_kernel_comes_from_one_known_file():
    """Every npu kernel of an aten op comes from the aten floor or the op plugin, as listed here."""
    providers = kernel_providers()
    by_file = Counter(providers.values())
    expected_files = {
        "csrc/aten/aten_ops.cpp", "csrc/aten/fallback.cpp", "csrc/aten/fallback_routes.cpp",
        "csrc/aten/random_ops.cpp", "csrc/aten/cuda_semantics.cpp", "csrc/aten/foreach_copy.cpp",
        "csrc/aten/zero_tensor.cpp", "csrc/aten/record_stream.cpp", "csrc/aten/attention.cpp",
        "ops/attention.py", "ops/foreach_copy.py", "ops/rnn_cells.py", "ops/sync_batch_norm.py",
        "ops/matmul_backward.py", "ops/chip_upcast.py",
        "torch",  # c10d's own functional collectives register PrivateUse1 kernels of their aten ops
    }
    assert set(by_file) <= expected_files, sorted(set(by_file) - expected_files)
    # The fallback routes' rule registers exactly the ops it reports.
    assert by_file["csrc/aten/fallback_routes.cpp"] == len(FALLBACK_ROUTES)
    assert all(providers[name] == "csrc/aten/fallback_routes.cpp" for name in FALLBACK_ROUTES)
    samples = {
        "aten::empty.memory_format": "csrc/aten/aten_ops.cpp",
        "aten::_copy_from": "csrc/aten/aten_ops.cpp",
        "aten::add.Tensor": "csrc/aten/fallback_routes.cpp",
        "aten::convolution": "csrc/aten/fallback.cpp",
        "aten::uniform_": "csrc/aten/random_ops.cpp",
        "aten::_foreach_copy_": "csrc/aten/foreach_copy.cpp",
        "aten::_foreach_copy": "ops/foreach_copy.py",
        "aten::_thnn_fused_lstm_cell": "ops/rnn_cells.py",
        "aten::batch_norm_stats": "ops/sync_batch_norm.py",
        "aten::matmul_backward": "ops/matmul_backward.py",
        "aten::binary_cross_entropy_with_logits": "ops/chip_upcast.py",
        "aten::_efficientzerotensor": "csrc/aten/zero_tensor.cpp",
        "aten::record_stream": "csrc/aten/record_stream.cpp",
        "aten::_fused_sdp_choice": "csrc/aten/attention.cpp",
        "aten::_scaled_dot_product_fused_attention_overrideable": "ops/attention.py",
    }
    assert {name: providers.get(name) for name in samples} == samples


def test_the_registration_step_runs_once():
    """import npusim runs the step (the op plugin's registrations are in place); a second call runs nothing."""
    code = (
        "import sys, torch\n"
        "import npusim._device as d\n"  # runs npusim/__init__, which calls the step once
        "assert d._registered\n"
        "from npusim import ops\n"
        "from npusim.ops import rnn_cells\n"
        "assert rnn_cells._lib is not None and ops.FALLBACK_ROUTES\n"
        "d.register(lambda: sys.exit('a second register() ran its layers again'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
