"""Shared test setup: every test runs on the simulated npu with the default
profile, no timing model and no memory cap, and leaves no device work behind."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest
import torch

import npusim
from _allocator_util import DEVICE
from npusim import config as npusim_config
from npusim.testing.device_failures import clear_device_failures


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "asynchronous: asserts that device work outlives its launch (host runs ahead); "
                             "skipped under NPUSIM_LAUNCH_BLOCKING=1, which makes every launch wait for its task")
    config.addinivalue_line("markers", "small_ops_on_the_host: asserts that small work on an idle stream runs on the "
                             "host (Note [Work on an idle stream]); skipped under NPUSIM_SMALL_OPS_ON_THE_HOST=0, "
                             "which makes every compute op a stream task")


# The settings that change where work runs, and the marker of the tests that assert the default.
_SKIPPED_UNDER = (
    ("asynchronous", npusim_config.launch_blocking,
     "asserts that device work outlives its launch; NPUSIM_LAUNCH_BLOCKING=1 makes every launch wait for its task"),
    ("small_ops_on_the_host", lambda: not npusim_config.small_ops_on_the_host(),
     "asserts that small work on an idle stream runs on the host; NPUSIM_SMALL_OPS_ON_THE_HOST=0 makes every "
     "compute op a stream task"),
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, setting_on, reason in _SKIPPED_UNDER:
        if setting_on():
            skip = pytest.mark.skip(reason=reason)
            for item in items:
                if marker in item.keywords:
                    item.add_marker(skip)


@pytest.fixture
def set_launch_blocking() -> Iterator[Callable[[bool], None]]:
    """Switches launch blocking in this process for the test; the process's own setting comes back after it, so
    that under NPUSIM_LAUNCH_BLOCKING=1 the tests that follow still run blocking."""
    yield npusim.runtime.acl.set_launch_blocking
    npusim.runtime.acl.set_launch_blocking(npusim_config.launch_blocking())


@pytest.fixture
def device_failure() -> Iterator[None]:
    """For a test that fails a device on purpose (an error inside queued work): the failure is sticky for the
    process (Note [Sticky device errors]), so it is forgotten after the test, as a new process would start."""
    yield
    clear_device_failures()


@pytest.fixture(autouse=True)
def clean_device_state():
    npusim.set_profile()
    npusim.timing.set()
    yield
    left = clear_device_failures()
    if left:  # forgotten all the same, so that the tests after this one run on working devices
        pytest.fail(f"the test left a device failed without the device_failure fixture: {left}")
    for index in range(torch.npu.device_count()):
        torch.npu.synchronize(index)
        torch.npu.set_memory_capacity(None, index)
    torch.npu.set_device(0)
    npusim.set_profile()
    npusim.timing.set()


@pytest.fixture
def clean_npu() -> Iterator[int]:
    """The caching-allocator tests' device (npu:7), current, with no segment reserved and fresh statistics:
    what CUDA's allocator starts from in a fresh process."""
    gc.collect()  # earlier tests' tracebacks hold npu tensors in reference cycles
    torch.npu.synchronize()
    torch.npu.empty_cache()
    assert torch.npu.memory_stats(DEVICE)["segment.all.current"] == 0, "a tensor of an earlier test lives on npu:7"
    torch.npu.reset_peak_memory_stats(DEVICE)
    torch.npu.reset_accumulated_memory_stats(DEVICE)
    with torch.npu.device(DEVICE):
        yield DEVICE
    gc.collect()
    torch.npu.synchronize()
    torch.npu.empty_cache()
