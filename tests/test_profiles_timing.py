"""Capability profiles and the timing model switches (API and environment)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import npusim
from npusim.config import ConfigError
from npusim.runtime.profiles import PRESETS, parse_overrides, read_overrides


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
    env = {**os.environ, "NPUSIM_PROFILE": "old_cann", "NPUSIM_PROFILE_OVERRIDES": "batch=0,hbm_eff=0.5,roofline=1",
           "NPUSIM_TIMING": "copy_gbps=2,launch_us=15"}
    code = ("import npusim; p = npusim.get_profile(); "
            "print(p.name, p.batch, p.cann_ge_810rc1, p.hbm_eff, p.efficiency('hbm'), npusim.timing.get())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("old_cann False False 0.5 1.0 TimingModel(copy_gbps=2.0, launch_us=15.0, "
                                  "link_gbps=0.0, compute=False, realtime=False, host='launch')")


def test_timing_model_switch():
    """The timing model is off by default and set/unset by API."""
    assert not npusim.timing.get().enabled
    with npusim.timing.model(launch_us=500) as model:
        assert model.enabled and npusim.timing.get().launch_us == 500
    assert not npusim.timing.get().enabled
    with pytest.raises(ValueError, match="copy_gbps must be >= 0"):
        npusim.timing.set(copy_gbps=-1)


def test_profile_overrides_option_reads_settings_or_a_file(tmp_path):
    """--profile-overrides takes NPUSIM_PROFILE_OVERRIDES' KEY=V,... or a JSON file of the same keys (a JSON
    boolean reads as one); a bad key, value, file or content is refused naming the option and what it takes."""
    assert read_overrides("cube_eff_large=0.6, roofline=0") == {"cube_eff_large": 0.6, "roofline": False}
    settings = tmp_path / "a2.json"
    settings.write_text(json.dumps({"cube_eff_large": 0.5, "bus_eff": 0.8, "roofline": False, "hbm_gbps": 1600}))
    assert read_overrides(str(settings)) == {"cube_eff_large": 0.5, "bus_eff": 0.8, "roofline": False,
                                             "hbm_gbps": 1600.0}
    with pytest.raises(ConfigError, match="--profile-overrides: expected comma-separated key=value with keys "
                                          "attention_eff, batch, bus_eff"):
        read_overrides("cube_eff=0.5")
    with pytest.raises(ConfigError, match=r"--profile-overrides vector_eff: expected a fraction of the peak in "
                                          r"\(0, 1\]"):
        read_overrides("vector_eff=0")
    with pytest.raises(ConfigError, match="--profile-overrides hbm_gbps: expected a number > 0"):
        read_overrides("hbm_gbps=-1")
    with pytest.raises(ConfigError, match="--profile-overrides: no such file"):
        read_overrides(str(tmp_path / "missing.json"))
    settings.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds a list; expected one mapping"):
        read_overrides(str(settings))
    settings.write_text(json.dumps({"cube_eff_small": 3}))
    with pytest.raises(ConfigError, match=f"--profile-overrides {re.escape(str(settings))} cube_eff_small: expected "
                                          "a fraction"):
        read_overrides(str(settings))
