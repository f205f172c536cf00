"""Device properties from the capability profile, device count and visibility, Event / Stream classes."""

from __future__ import annotations

import pytest
import torch

import npusim
from npusim import config
from test_device import run_python


def test_properties_come_from_the_profile():
    """get_device_properties / get_device_name report the profile's SoC, HBM size and core counts."""
    props = torch.npu.get_device_properties(0)
    assert (props.name, props.total_memory, props.cube_core_num, props.vector_core_num) == (
        "Ascend910B2", 64 << 30, 24, 48)
    assert props.L2_cache_size == 192 << 20 and "Ascend910B2" in repr(props)
    assert torch.npu.get_device_name() == "Ascend910B2" == torch.npu.get_device_name("npu:3")
    with npusim.use_profile("inference_soc"):
        assert torch.npu.get_device_name(1) == "Ascend310P3"
        assert torch.npu.get_device_properties(1).cube_core_num == 8


@pytest.mark.parametrize("query", ["get_device_name", "get_device_properties", "get_device_capability",
                                   "utilization"])
def test_bad_device_index_raises_like_cuda(query):
    """Device queries reject an index past device_count with torch.cuda's AssertionError."""
    with pytest.raises(AssertionError, match=r"Invalid device id 99: torch.npu.\w+ expects 0 <= id < "
                                             r"device_count\(\) = 8"):
        getattr(torch.npu, query)(99)


def test_device_capability(monkeypatch):
    """get_device_capability follows torch_npu (None unless TORCH_NPU_DEVICE_CAPABILITY); torch.accelerator's works."""
    with pytest.warns(UserWarning, match="TORCH_NPU_DEVICE_CAPABILITY"):
        assert torch.npu.get_device_capability() is None
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "8.0")
    assert torch.npu.get_device_capability(0) == (8, 0)
    caps = torch.accelerator.get_device_capability("npu:1")
    assert {torch.float32, torch.bfloat16, torch.int64} <= caps["supported_dtypes"]
    with pytest.raises(RuntimeError, match="invalid npu device index 12"):
        torch.accelerator.get_device_capability(12)


def test_event_and_stream_are_classes():
    """torch.npu.Event / Stream work with isinstance, and events time each other."""
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    assert isinstance(start, torch.npu.Event) and isinstance(start, torch.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.npu.Event)
    stream = torch.npu.Stream()
    assert isinstance(stream, torch.npu.Stream) and isinstance(torch.npu.current_stream(), torch.npu.Stream)
    start.record()
    (torch.ones(64, device="npu") * 2).sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    assert isinstance(stream.record_event(), torch.npu.Event)


def test_visible_devices_parsed_as_torch_npu_does():
    """ASCEND_RT_VISIBLE_DEVICES: digits and commas up to another character, ascending, below the node's count."""
    parse = config.parse_visible_devices
    assert parse(None, 8) == list(range(8))
    assert parse("0,2,5", 8) == [0, 2, 5]
    assert parse("1,3x,4", 8) == [1, 3]
    assert parse("6,7,9", 8) == [6, 7]
    with pytest.raises(config.ConfigError, match="ASCEND_RT_VISIBLE_DEVICES: expected ascending"):
        parse("3,1", 8)
    with pytest.raises(config.ConfigError, match="at least one device id below 8"):
        parse("", 8)


def test_visible_devices_and_count_in_a_fresh_process():
    """ASCEND_RT_VISIBLE_DEVICES narrows the node (8 by default, or NPUSIM_DEVICE_COUNT) to the listed devices."""
    code = "import torch, npusim; print(torch.npu.device_count(), torch.accelerator.device_count())"
    result = run_python(code, env={"ASCEND_RT_VISIBLE_DEVICES": "2,3,6"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3"]
    result = run_python(code, env={"ASCEND_RT_VISIBLE_DEVICES": "0,1,5", "NPUSIM_DEVICE_COUNT": "4"})
    assert result.stdout.split() == ["2", "2"], result.stderr
