"""Shared test setup: every test runs on the simulated npu with the default
profile, no timing model and no memory cap, and leaves no device work behind."""

from __future__ import annotations

import pytest
import torch

import npusim


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
