"""torch_npu.testing: the assertion contracts torch_npu's test files rely on, the skips, and a torch_npu-style
test file collected and run unmodified under `python -m npusim run -m pytest`."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from pathlib import Path

import numpy as np
import pytest
import torch

import npusim
from npusim.compat import torch_npu as shim

STYLE_CASES = Path(__file__).parent / "scripts" / "torch_npu_style_cases.py"


@pytest.fixture(scope="module")
def testing():
    shim.install()
    try:
        import torch_npu.testing.common_utils as common_utils
        import torch_npu.testing.decorator as decorator
        import torch_npu.testing.testcase as testcase

        yield testcase, common_utils, decorator
    finally:
        shim.uninstall()


@pytest.fixture
def case(testing):
    return testing[0].TestCase()


def test_rtol_equal_tolerates_a_prec_fraction_of_misses(case):
    """assertRtolEqual: within rtol or atol passes; misses beyond a prec fraction of the elements fail."""
    x = np.ones(100_000, dtype=np.float32)
    case.assertRtolEqual(x, x * (1 + 5e-5))  # every element within rtol 1e-4
    y = x.copy()
    y[:10] = 2.0  # 10 misses: not more than 1e-4 of 100000
    case.assertRtolEqual(x, y)
    y[:11] = 2.0
    with pytest.raises(AssertionError, match="result error: 11 of 100000 elements exceed rtol"):
        case.assertRtolEqual(x, y)


def test_rtol_equal_dtype_rules(case):
    """float16 uses prec16, bfloat16 allclose, NaNs must line up, dtypes and shapes must match."""
    half = np.ones(8, dtype=np.float16)
    case.assertRtolEqual(half, half * np.float16(1.0005))  # within prec16 = 1e-3
    with pytest.raises(AssertionError, match="result error"):
        case.assertRtolEqual(half, half * np.float16(1.01))
    bf16 = torch.ones(4, dtype=torch.bfloat16)
    case.assertRtolEqual(bf16, bf16.to("npu"))
    with pytest.raises(AssertionError, match="bfloat16 values differ"):
        case.assertRtolEqual(bf16, (bf16 * 1.5).to("npu"))
    with pytest.raises(AssertionError, match="NaNs at different places"):
        case.assertRtolEqual(np.array([1.0, np.nan]), np.array([1.0, 1.0]))
    with pytest.raises(AssertionError, match="dtype error"):
        case.assertRtolEqual(np.ones(2, np.float32), np.ones(2, np.float64))
    with pytest.raises(AssertionError, match="shape error"):
        case.assertRtolEqual(torch.ones(2), torch.ones(3, device="npu"))
    case.assertRtolEqual([torch.ones(2), torch.zeros(1)], (torch.ones(2, device="npu"), torch.zeros(1, device="npu")))


def test_assert_equal_has_an_absolute_precision(case):
    """assertEqual: the largest absolute difference against the case's precision, on the first tensor's device."""
    a = torch.zeros(5)
    case.assertEqual(a, (a + 5e-6).to("npu"))
    with pytest.raises(AssertionError):
        case.assertEqual(a, (a + 1e-4).to("npu"))
    case.assertEqual(a, (a + 1e-4).to("npu"), prec=1e-3)
    case.assertEqual(torch.tensor([2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8), prec=1)
    with pytest.raises(AssertionError):
        case.assertEqual(torch.tensor([2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8))
    with pytest.raises(AssertionError, match="NaNs at different places"):
        case.assertEqual(torch.tensor([float("nan")]), torch.tensor([0.0]))
    case.assertEqual({"x": torch.ones(2), "n": 3}, {"n": 3, "x": torch.ones(2, device="npu")})
    with pytest.raises(AssertionError, match="Expected finite numeric values"):
        case.assertEqual(float("inf"), float("inf"))
    case.assertEqual(float("inf"), float("inf"), allow_inf=True)


def test_skips_read_the_simulated_soc_and_cann(testing):
    """SupportedDevices compares the profile's SoC family; SkipIfNotGteCANNVersion the profile's CANN version."""
    _, common_utils, _ = testing

    class Probe(unittest.TestCase):
        @common_utils.SupportedDevices(["Ascend310P"])
        def test_inference(self):
            pass

        @common_utils.SkipIfNotGteCANNVersion("8.1.RC1")
        def test_new_cann(self):
            pass

    def outcome(name: str) -> str:
        result = unittest.TestResult()
        Probe(name).run(result)
        return "skipped" if result.skipped else "passed"

    assert (outcome("test_inference"), outcome("test_new_cann")) == ("skipped", "passed")
    with npusim.use_profile("inference_soc"):
        assert common_utils.soc_family(torch.npu.get_device_name(0)) == "Ascend310P"
        assert outcome("test_inference") == "passed"
    with npusim.use_profile("old_cann"):
        assert outcome("test_new_cann") == "skipped"
    assert [common_utils.soc_family(n) for n in ("Ascend910B2", "Ascend910_9391", "Ascend950PR")] == [
        "Ascend910B", "Ascend910_93", "Ascend950"]


def test_instantiate_tests_names_one_test_per_combination(testing):
    """@Dtypes x @Formats with @instantiate_tests makes test_<name>_<dtype>_<format> methods, device='npu'."""
    _, _, decorator = testing
    seen = []

    @decorator.instantiate_tests
    class Cases(unittest.TestCase):
        @decorator.Dtypes(torch.float16, torch.float32)
        @decorator.Formats(0, 29)
        def test_op(self, device, dtype, npu_format):
            seen.append((device, dtype, npu_format))

    names = sorted(n for n in vars(Cases) if n.startswith("test_"))
    assert names == ["test_op_float16_0", "test_op_float16_29", "test_op_float32_0", "test_op_float32_29"]
    Cases("test_op_float32_29").test_op_float32_29()
    assert seen == [("npu", torch.float32, 29)]


def test_torch_npu_style_file_collects_and_runs_unmodified():
    """A torch_npu-style test file runs unmodified under `npusim run -m pytest`: 6 pass, 3 skip (with reasons)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "npusim", "run", "-m", "pytest", "-q", "-rs", "-p",
                             "no:cacheprovider", str(STYLE_CASES)], capture_output=True, text=True, timeout=300,
                            env=env, cwd=STYLE_CASES.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "6 passed, 3 skipped" in result.stdout
    assert "current device is Ascend910B" in result.stdout and "current cann version is 9.1.0" in result.stdout
