"""Capability profiles and the timing model switches (API and environment)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import npusim
from npusim.runtime.profiles import PRESETS, parse_overrides


def test_presets_and_overrides():
    """Named presets carry the flags of docs/SPEC.md 4.3; overrides change single flags."""
    assert set(PRESETS) >= {"training_soc", "inference_soc", "old_cann", "no_memcpy_batch", "no_foreach_kernel"}
    assert not PRESETS["inference_soc"].nd_out and not PRESETS["inference_soc"].batch
    assert torch.int64 not in PRESETS["old_cann"].fast_dtypes and torch.int32 in PRESETS["old_cann"].fast_dtypes
    assert torch.bool in PRESETS["training_soc"].fast_dtypes
    p = npusim.set_profile("inference_soc", batch=True)
    assert npusim.get_profile() is p and p.batch and not p.nd_out
    with npusim.use_profile("no_foreach_kernel"):
        assert not npusim.get_profile().foreach_copy_kernel
    assert npusim.get_profile() is p
    with pytest.raises(ValueError, match="unknown flag"):
        npusim.set_profile("training_soc", nd_outt=False)
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        npusim.set_profile("nope")
    assert parse_overrides("nd_out=0, batch=true,sync_timeout_s=2") == {"nd_out": False, "batch": True,
                                                                         "sync_timeout_s": 2.0}


def test_profile_and_timing_from_environment():
    """NPUSIM_PROFILE, NPUSIM_PROFILE_OVERRIDES and NPUSIM_TIMING configure a fresh process."""
    env = {**os.environ, "NPUSIM_PROFILE": "old_cann", "NPUSIM_PROFILE_OVERRIDES": "batch=0",
           "NPUSIM_TIMING": "copy_gbps=2,launch_us=15"}
    code = "import npusim; p = npusim.get_profile(); print(p.name, p.batch, p.cann_ge_810rc1, npusim.timing.get())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("old_cann False False TimingModel(copy_gbps=2.0, launch_us=15.0, link_gbps=0.0, "
                                  "compute=False, realtime=False, host='launch')")


def test_timing_model_switch():
    """The timing model is off by default and set/unset by API."""
    assert not npusim.timing.get().enabled
    with npusim.timing.model(launch_us=500) as model:
        assert model.enabled and npusim.timing.get().launch_us == 500
    assert not npusim.timing.get().enabled
    with pytest.raises(ValueError, match="copy_gbps must be >= 0"):
        npusim.timing.set(copy_gbps=-1)
