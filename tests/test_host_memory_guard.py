"""The caching allocator never pushes the host into swap: a segment the host cannot give makes it release
cached blocks and retry, and the OutOfMemoryError then names the host, with the host's and the device's figures.
The host's shortage is simulated through the allocator's test hook, not by exhausting the machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from _allocator_util import MIB, blob, stats
from npusim import config
from npusim.runtime import acl


@pytest.fixture
def host_hooks() -> Iterator[None]:
    yield
    acl.fail_host_mappings(0)
    acl.simulate_host_memory(-1)
    acl.set_host_memory_margin(-1)


def test_host_shortage_frees_the_cache_retries_then_names_the_host(clean_npu, host_hooks):
    """With 30 MiB above the margin: a 24 MiB segment fits once the 20 MiB cached one is released; 40 MiB raises."""
    acl.set_host_memory_margin(64 * MIB)
    acl.simulate_host_memory(64 * MIB + 30 * MIB)
    x = blob(20 * MIB)
    del x  # cached: its pages still count against the host
    y = blob(24 * MIB)
    assert stats("num_alloc_retries", "num_device_free", "reserved_bytes.all.current") == (1, 1, 24 * MIB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        blob(40 * MIB)
    message = str(info.value)
    assert message.startswith("NPU out of memory. Tried to allocate 40.00 MiB (NPU 7; 64.00 GiB total capacity; "
                              "24.00 MiB already allocated; 24.00 MiB current active; ")  # torch_npu's sentence
    assert "On npu:7, 40.00 MiB (41943040 bytes" in message
    assert "the host ran out of memory, not the simulated device" in message
    assert ("the host has 70.00 MiB available and npusim leaves it at least 64.00 MiB "
            "(NPUSIM_HOST_MEMORY_MARGIN)") in message
    assert "The simulated device has capacity 64.00 GiB, 24.00 MiB allocated, 24.00 MiB reserved" in message
    assert stats("num_ooms", "num_alloc_retries") == (1, 2)
    assert y.numel() == 24 * MIB  # the process carries on
    acl.simulate_host_memory(-1)
    assert blob(40 * MIB).numel() == 40 * MIB


def test_a_refused_host_mapping_frees_the_cache_and_retries(clean_npu, host_hooks):
    """An mmap the host refuses (injected, once): the cached segments go back and the mapping is retried; refused
    every time, the OutOfMemoryError says the host refused the mapping, not that the device is full."""
    cached = blob(20 * MIB)
    del cached
    acl.fail_host_mappings(1)
    x = blob(30 * MIB)
    assert stats("num_alloc_retries", "num_device_free", "reserved_bytes.all.current") == (1, 1, 30 * MIB)
    acl.fail_host_mappings(1000)
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 12\.00 MiB .*the host ran out of memory, "
                                                     r"not the simulated device: mapping 12\.00 MiB of host memory "
                                                     r"failed\. The simulated device has capacity 64\.00 GiB"):
        blob(12 * MIB)
    assert stats("num_ooms", "num_alloc_retries", "reserved_bytes.all.current") == (1, 2, 30 * MIB)
    acl.fail_host_mappings(0)
    assert blob(12 * MIB).numel() == x.numel() - 18 * MIB


def test_the_real_host_is_read_when_a_segment_is_mapped(clean_npu, host_hooks):
    """Without the hook the allocator reads the host's available memory; a margin no host has refuses any segment."""
    acl.set_host_memory_margin(1 << 60)
    with pytest.raises(torch.OutOfMemoryError, match=r"the host has \d+\.\d\d [GMT]iB available and npusim leaves it "
                                                     r"at least 1048576\.00 TiB"):
        blob(1000)
    acl.set_host_memory_margin(0)  # no check
    assert blob(1000).numel() == 1000


def test_host_memory_margin_variable():
    """NPUSIM_HOST_MEMORY_MARGIN takes a byte size (0 turns the check off); unset, the core's default."""
    assert config.parse_bytes("512MiB", "NPUSIM_HOST_MEMORY_MARGIN") == 512 * MIB
    assert "NPUSIM_HOST_MEMORY_MARGIN" in config.VARIABLES
    with pytest.raises(config.ConfigError, match="NPUSIM_HOST_MEMORY_MARGIN: expected a byte size"):
        config.parse_bytes("lots", "NPUSIM_HOST_MEMORY_MARGIN")
