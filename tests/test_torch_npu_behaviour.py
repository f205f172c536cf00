"""torch.npu where torch_npu's behaviour differs from torch.cuda's: the GradScaler overflow rule, the overflow
checks of INF_NAN mode, float32 autocast, _sleep, the CANN version, torch.npu.utils, torch.backends.npu and the
small memory calls."""

from __future__ import annotations

import time

import pytest
import torch

import npusim
from npusim.config import ConfigError


def _two_models_with_overflow(scaler: torch.amp.GradScaler) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One scaled step of two models, each with its optimizer; the first model's gradient overflows.

    The overflowing optimizer steps first, the finite one after it; returns the parameters before and after."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 4).to("npu") for _ in range(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in models]
    before = [m.weight.detach().cpu().clone() for m in models]
    x = torch.randn(2, 4, device="npu")
    for model in models:
        scaler.scale(model(x).sum()).backward()
    models[0].weight.grad.fill_(float("inf"))
    for optimizer in optimizers:
        scaler.step(optimizer)
    scaler.update()
    return before, [m.weight.detach().cpu() for m in models]


def test_npu_amp_grad_scaler_skips_every_step_after_an_overflow():
    """torch.npu.amp.GradScaler: once one optimizer's gradients overflow, no optimizer steps (torch_npu's flag)."""
    scaler = torch.npu.amp.GradScaler(init_scale=4.0)
    before, after = _two_models_with_overflow(scaler)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    assert scaler.get_scale() == 2.0 and not scaler._has_overflow  # backed off, flag cleared by update()


def test_torch_amp_grad_scaler_keeps_pytorchs_rule():
    """torch.amp.GradScaler("npu") skips only the optimizer whose own gradients overflowed."""
    scaler = torch.amp.GradScaler("npu", init_scale=4.0)
    before, after = _two_models_with_overflow(scaler)
    assert torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])
    assert scaler.get_scale() == 2.0


def test_overflow_checks_follow_torch_npus_inf_nan_mode():
    """npu_check_overflow: True for an fp16 sum past 65504, inf or NaN (tensor or float), False for finite values,
    a RuntimeError for another type; the float-status flag calls of saturation mode are refused (get) and warn
    (clear), as torch_npu's are on an INF_NAN SoC, also as torch.npu's re-exports."""
    from npusim.runtime import utils

    assert utils.is_support_inf_nan()
    overflowed = torch.tensor([65535.0], device="npu").half()
    assert utils.npu_check_overflow(overflowed + overflowed) is True  # torch_npu's test_check_over_flow
    assert utils.npu_check_overflow(torch.tensor([1.0, float("nan")], device="npu")) is True
    assert utils.npu_check_overflow(torch.ones(3, 3, device="npu", dtype=torch.bfloat16)) is False
    assert utils.npu_check_overflow(float("-inf")) is True and utils.npu_check_overflow(3.5) is False
    with pytest.raises(RuntimeError, match=r"npu_check_overflow: Unsupported type.*got int"):
        utils.npu_check_overflow(3)
    assert torch.npu.get_npu_overflow_flag is utils.get_npu_overflow_flag
    with pytest.raises(RuntimeError, match=r"Unsupported api when soc_version >= Ascend910B1, please use "
                                           r"npu_check_overflow \(the simulated Ascend910B2"):
        torch.npu.get_npu_overflow_flag()
    with pytest.warns(UserWarning, match="clear_npu_overflow_flag is useless"):
        assert torch.npu.clear_npu_overflow_flag() is None


def test_npu_grad_scaler_static_scale():
    """dynamic=False (torch_npu's static loss scale): gradients are unscaled, the step runs, the scale stays."""
    scaler = torch.npu.amp.GradScaler(init_scale=8.0, dynamic=False)
    param = torch.nn.Parameter(torch.zeros(3, device="npu"))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scaler.scale((param * torch.tensor([1.0, 2.0, 3.0], device="npu")).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(param.detach().cpu(), torch.tensor([-1.0, -2.0, -3.0]))
    assert scaler.get_scale() == 8.0 and scaler.state_dict()["dynamic"] is False


def test_float32_autocast_is_honoured():
    """float32 is in get_amp_supported_dtype, so torch.autocast("npu", dtype=float32) is enabled, not dropped."""
    assert torch.float32 in torch.npu.get_amp_supported_dtype()
    a = torch.ones(4, 4, device="npu", dtype=torch.float16)
    with torch.autocast("npu", dtype=torch.float32):
        assert torch.is_autocast_enabled("npu") and torch.get_autocast_dtype("npu") == torch.float32
        assert (a @ a).dtype == torch.float32  # matmul runs in the autocast dtype


@pytest.mark.asynchronous
def test_sleep_is_a_delay_task_on_the_current_stream():
    """_sleep(cycles) returns at once and holds the current stream cycles / clock_mhz microseconds."""
    stream = torch.npu.Stream()
    cycles = int(npusim.get_profile().clock_mhz * 100_000)  # 100 ms
    with torch.npu.stream(stream):
        begin = time.perf_counter()
        torch.npu._sleep(cycles)
        launched = time.perf_counter() - begin
        done = torch.npu.Event()
        done.record()
    assert launched < 0.05 and stream.pending() >= 1 and not done.query()
    stream.synchronize()
    assert time.perf_counter() - begin >= 0.1 and done.query()
    with pytest.raises(RuntimeError, match=r"torch.npu._sleep: expected a non-negative integer number of cycles"):
        torch.npu._sleep(-1)


def test_cann_version_follows_the_profile():
    """get_cann_version / _is_gte_cann_version read the profile's CANN release, ordered as CANN releases are."""
    utils = torch.npu.utils
    assert utils.get_cann_version() == "9.1.0" and utils.get_cann_version("DRIVER") == ""
    assert utils._is_gte_cann_version("8.1.RC1") and utils._is_gte_cann_version("9.1.0")
    assert not utils._is_gte_cann_version("9.1.1")
    with npusim.use_profile("old_cann"):
        assert utils.get_cann_version() == "8.0.RC3"
        assert utils._is_gte_cann_version("8.0.RC2") and not utils._is_gte_cann_version("8.0.0")
    with pytest.raises(ValueError, match="expected a CANN version"):
        utils._is_gte_cann_version("latest")
    with pytest.raises(ValueError, match="module must be one of"):
        utils.get_cann_version("CUDA")


def test_get_device_index_follows_torch_npu():
    """torch.npu.utils._get_device_index: ints as they are, npu devices, cpu only with allow_cpu."""
    get = torch.npu.utils._get_device_index
    assert get(3) == 3 and get("npu:2") == 2 and get(torch.device("npu", 1)) == 1
    assert get(None, optional=True) == torch.npu.current_device() and get("cpu", allow_cpu=True) == -1
    with pytest.raises(ValueError, match="expected an npu device, got cpu"):
        get("cpu")


def test_submodules_import_as_torch_npu_packages_do():
    """import torch.npu.amp / .utils / .graphs works; torch.backends.npu.matmul follows the matmul precision."""
    import torch.backends.npu
    import torch.npu.amp
    import torch.npu.graphs
    from torch.npu.utils import get_cann_version

    assert torch.npu.graphs.NPUGraph is torch.npu.NPUGraph and get_cann_version() == "9.1.0"
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert torch.backends.npu.matmul.allow_tf32
        torch.set_float32_matmul_precision("highest")
        assert not torch.backends.npu.matmul.allow_tf32
    finally:
        torch.set_float32_matmul_precision(previous)


def test_torch_npus_backend_switches_on_torch_npu():
    """torch_npu's torch.npu carries the SDP switches (PyTorch's global flags), preferred_linalg_library (always
    Default: no npu linalg library), torch.npu.aclnn (allow_hf32 is conv's flag; flags() sets it for a block),
    get_soc_version and the deterministic-region marks, whose backward switches determinism back."""
    import torch.npu.aclnn

    previous = torch.npu.flash_sdp_enabled()
    try:
        torch.npu.enable_flash_sdp(not previous)
        assert torch.backends.cuda.flash_sdp_enabled() is (not previous)
    finally:
        torch.npu.enable_flash_sdp(previous)
    assert torch.npu.preferred_linalg_library("cusolver") == torch._C._LinalgBackend.Default
    assert torch.npu.get_soc_version() == 221
    conv = torch.npu.conv.allow_hf32
    try:
        torch.npu.aclnn.allow_hf32 = False
        assert not torch.npu.conv.allow_hf32
        with torch.npu.aclnn.flags(allow_hf32=True):
            assert torch.npu.conv.allow_hf32 and torch.npu.aclnn.allow_hf32
        assert not torch.npu.aclnn.allow_hf32
    finally:
        torch.npu.conv.allow_hf32 = conv
    seen = []
    x = torch.ones(3, device="npu", requires_grad=True)
    y = torch.npu.enable_deterministic_with_backward(x * 2)
    assert torch.are_deterministic_algorithms_enabled()
    y.register_hook(lambda grad: seen.append(torch.are_deterministic_algorithms_enabled()))
    z = torch.npu.disable_deterministic_with_backward(y * 3)
    assert not torch.are_deterministic_algorithms_enabled()
    z.sum().backward()
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 6.0))


def test_small_memory_and_arch_calls():
    """host_empty_cache keeps live pinned memory; _set_allocator_settings takes torch_npu's run-time keys only,
    with its value rules (test_allocator_settings.py has the rest)."""
    pinned = torch.ones(1024).pin_memory()
    live = torch.npu.host_memory_stats()["num_host_alloc"]
    torch.npu.host_empty_cache()
    assert pinned.is_pinned() and torch.npu.host_memory_stats()["num_host_alloc"] == live
    try:
        torch.npu.memory._set_allocator_settings("expandable_segments:True")
        with pytest.raises(ConfigError, match="cannot be enabled with expandable_segments"):
            torch.npu.memory._set_allocator_settings("max_split_size_mb:64")
        with pytest.raises(ConfigError, match="unsupported setting 'garbage_collection_threshold'"):
            torch.npu.memory._set_allocator_settings("garbage_collection_threshold:0.5")
        with pytest.raises(ConfigError, match="expandable_segments: expected True or False"):
            torch.npu.memory._set_allocator_settings("expandable_segments:maybe")
    finally:
        torch.npu.memory._set_allocator_settings("expandable_segments:False")
    assert torch.npu.get_arch_list() == ["Ascend910B2"]
    calls = []
    torch.npu._lazy_call(lambda: calls.append(1))
    assert calls == [1]
