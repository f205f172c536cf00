"""Shared test setup: every test runs on the simulated npu with the default
profile, no timing model and no memory cap, and leaves no device work behind."""

from __future__ import annotations

import pytest
import torch

import npusim
from npusim import config as npusim_config


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "asynchronous: asserts that device work outlives its launch (host runs ahead); "
                             "skipped under NPUSIM_LAUNCH_BLOCKING=1, which makes every launch wait for its task")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not npusim_config.launch_blocking():
        return
    skip = pytest.mark.skip(reason="asserts that device work outlives its launch; NPUSIM_LAUNCH_BLOCKING=1 makes "
                                   "every launch wait for its task")
    for item in items:
        if "asynchronous" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def clean_device_state():
    npusim.set_profile()
    npusim.timing.set()
    yield
    for index in range(torch.npu.device_count()):
        torch.npu.synchronize(index)
        torch.npu.set_memory_capacity(None, index)
    torch.npu.set_device(0)
    npusim.set_profile()
    npusim.timing.set()
