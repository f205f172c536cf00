"""Configuration: every NPUSIM_* variable parsed by npusim.config, errors that name the variable."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import npusim
from npusim import config


def test_readers_name_the_variable_and_accepted_values():
    """Typed readers return values and reject bad text with the variable's name and what it accepts."""
    assert config.parse_int(" 4 ", "NPUSIM_DEVICE_COUNT", 1, 16) == 4
    with pytest.raises(config.ConfigError, match=r"NPUSIM_DEVICE_COUNT: expected an integer in \[1, 16\], got 'abc'"):
        config.parse_int("abc", "NPUSIM_DEVICE_COUNT", 1, 16)
    with pytest.raises(config.ConfigError, match=r"NPUSIM_DEVICE_COUNT: expected an integer in \[1, 16\], got '99'"):
        config.parse_int("99", "NPUSIM_DEVICE_COUNT", 1, 16)
    assert config.parse_bool("On", "X") is True and config.parse_bool("0", "X") is False
    with pytest.raises(config.ConfigError, match="NPUSIM_LAUNCH_BLOCKING: expected a boolean"):
        config.parse_bool("maybe", "NPUSIM_LAUNCH_BLOCKING")
    assert config.parse_bytes("512MiB", "NPUSIM_MEMORY_CAPACITY") == 512 << 20
    with pytest.raises(config.ConfigError, match="NPUSIM_MEMORY_CAPACITY: expected a byte size"):
        config.parse_bytes("lots", "NPUSIM_MEMORY_CAPACITY")


def test_one_key_value_parser_for_every_list_setting():
    """NPUSIM_TIMING and NPUSIM_PROFILE_OVERRIDES share one k=v parser with the same errors."""
    assert npusim.timing.parse("copy_gbps=2, launch_us=15") == npusim.timing.TimingModel(2.0, 15.0, 0.0)
    keys = "compute, copy_gbps, host, launch_us, link_gbps, realtime"
    with pytest.raises(config.ConfigError, match=f"NPUSIM_TIMING: expected comma-separated key=value with keys {keys}, "
                                                 "got 'copy=2'"):
        npusim.timing.parse("copy=2")
    with pytest.raises(config.ConfigError, match="NPUSIM_TIMING copy_gbps: expected a number >= 0.0, got '-1'"):
        npusim.timing.parse("copy_gbps=-1")
    with pytest.raises(config.ConfigError, match="NPUSIM_PROFILE_OVERRIDES: expected comma-separated key=value"):
        from npusim.runtime.profiles import parse_overrides

        parse_overrides("nd_outt=0")


def test_duplicate_keys_are_refused_naming_variable_and_key():
    """A key given twice in a key=value / key:value setting is an error naming the variable and the key."""
    from npusim.runtime.profiles import parse_overrides

    cases = [
        (lambda: config.parse_alloc_conf("max_split_size_mb:128,max_split_size_mb:256"),
         "PYTORCH_NPU_ALLOC_CONF: key 'max_split_size_mb' is given more than once"),
        (lambda: config.parse_alloc_conf("page_size:1g, page_size:1g"),
         "PYTORCH_NPU_ALLOC_CONF: key 'page_size' is given more than once"),
        (lambda: npusim.timing.parse("copy_gbps=2,launch_us=1,copy_gbps=3"),
         "NPUSIM_TIMING: key 'copy_gbps' is given more than once"),
        (lambda: parse_overrides("nd_out=0,nd_out=1"),
         "NPUSIM_PROFILE_OVERRIDES: key 'nd_out' is given more than once"),
    ]
    for parse, message in cases:
        with pytest.raises(config.ConfigError, match=message):
            parse()
    assert config.parse_alloc_conf("max_split_size_mb:128").max_split_size == 128 << 20


def test_readme_lists_each_variable_once():
    """The README's configuration table has one row per variable."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = [name for line in rows for name in config.VARIABLES if f"`{name}`" in line.split("|")[1]]
    assert sorted(named) == sorted(config.VARIABLES)


def test_unregistered_variable_is_refused():
    """config.env only reads variables listed in VARIABLES (so the README table stays complete)."""
    with pytest.raises(KeyError, match="NPUSIM_NOPE is not a registered variable"):
        config.env("NPUSIM_NOPE")
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    assert all(f"`{name}`" in readme for name in config.VARIABLES)


def test_bad_device_count_at_import_names_the_variable():
    """NPUSIM_DEVICE_COUNT=abc stops the import with an error naming the variable."""
    result = subprocess.run([sys.executable, "-c", "import npusim"], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "NPUSIM_DEVICE_COUNT": "abc"})
    assert result.returncode != 0
    assert "ConfigError: NPUSIM_DEVICE_COUNT: expected an integer in [1, 16], got 'abc'" in result.stderr


def test_launch_blocking_is_set_in_process(set_launch_blocking):
    """With launch blocking on, a queued copy has completed when copy_ returns; off, it is still pending."""
    src = torch.randn(1 << 18, device="npu")
    dst = torch.empty_like(src)
    torch.npu.synchronize()
    with npusim.timing.model(copy_gbps=0.05, realtime=True):  # about 20 ms for 1 MiB, in real time
        set_launch_blocking(True)
        begin = time.perf_counter()
        dst.copy_(src)
        blocked_s = time.perf_counter() - begin
        assert torch.npu.current_stream().pending() == 0
        set_launch_blocking(False)
        dst.copy_(src)
        assert torch.npu.current_stream().pending() == 1
    assert blocked_s >= 0.015


def test_ranks_per_node_from_the_override_then_the_launcher(monkeypatch: pytest.MonkeyPatch):
    """Collectives are priced with NPUSIM_RANKS_PER_NODE, else torchrun's LOCAL_WORLD_SIZE, else the
    profile's server size; a value that is not a whole number >= 1 is refused naming the variable."""
    monkeypatch.delenv("NPUSIM_RANKS_PER_NODE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert config.ranks_per_node() is None
    assert npusim.timing.ranks_per_node() == npusim.get_profile().ranks_per_node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert npusim.timing.ranks_per_node() == 4
    monkeypatch.setenv("NPUSIM_RANKS_PER_NODE", "2")
    assert npusim.timing.ranks_per_node() == 2
    for bad in ("0", "2.5", "two"):
        monkeypatch.setenv("NPUSIM_RANKS_PER_NODE", bad)
        with pytest.raises(config.ConfigError,
                           match=f"NPUSIM_RANKS_PER_NODE: expected a whole number of ranks >= 1, got '{bad}'"):
            config.ranks_per_node()
