"""The timing model's compute cost: roofline durations of ops on the profile's chip (Ascend910B2 and
Ascend310P3 figures of Note [Chip figures]), FLOPs from PyTorch's formula registry (npusim's fused
attention operators included), and the settings that turn it on."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import npusim
from npusim.runtime import cost_model
from npusim.runtime.profiles import PRESETS, make_profile, parse_overrides

# The roofline tests price at the peaks (roofline=True); the calibrated ones at the presets' efficiencies.
TRAINING, INFERENCE = (PRESETS[name].replace(roofline=True) for name in ("training_soc", "inference_soc"))


def _meta(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_chip_figures_follow_the_cores_and_clock():
    """Each profile's peaks are its cores x per-cycle FLOPs x clock (8192 per cube core, 256 per vector
    unit), float32 at half the 16-bit rates; the 910B2 and 310P3 figures are the Note's."""
    for profile, vector_units in ((TRAINING, 48), (INFERENCE, 8 + 7)):
        ghz = profile.clock_mhz / 1e3
        assert profile.cube_tflops == pytest.approx(profile.cube_core_num * 8192 * ghz / 1e3, rel=2e-3)
        assert profile.vector_tflops == pytest.approx(vector_units * 256 * ghz / 1e3, rel=5e-3)
        assert profile.cube_fp32_tflops == pytest.approx(profile.cube_tflops / 2, rel=2e-3)
        assert profile.vector_fp32_tflops == pytest.approx(profile.vector_tflops / 2, rel=5e-3)
    assert (TRAINING.soc_name, TRAINING.cube_tflops, TRAINING.hbm_gbps) == ("Ascend910B2", 353.9, 1843.2)
    assert (INFERENCE.soc_name, INFERENCE.cube_tflops, INFERENCE.hbm_gbps) == ("Ascend310P3", 70.0, 204.0)


@pytest.mark.parametrize("profile", [TRAINING, INFERENCE], ids=lambda p: p.soc_name)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matmul_is_bound_by_the_cube(profile, dtype):
    """A 2048^3 mm: 2*2048^3 FLOPs over the cube's peak for its dtype, plus the launch cost."""
    a = _meta(2048, 2048, dtype=dtype)
    cost = cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, torch.mm(a, a), profile=profile, launch_us=7.0)
    peak = profile.cube_fp32_tflops if dtype == torch.float32 else profile.cube_tflops
    assert (cost.flops, cost.bytes, cost.unit, cost.bound) == (2 * 2048 ** 3, 3 * 2048 * 2048 * a.element_size(),
                                                                "cube", "compute")
    assert cost.us == pytest.approx(7.0 + 2 * 2048 ** 3 / (peak * 1e6))
    # by hand: 17.18 GFLOP at 353.9 TFLOPS is 48.5 us; at 70 TFLOPS 245.4 us
    assert cost.us - 7.0 == pytest.approx({(353.9, 2): 48.54, (70.0, 2): 245.43, (176.9, 4): 97.12,
                                           (35.0, 4): 490.85}[(peak, a.element_size())], abs=0.01)


@pytest.mark.parametrize("profile", [TRAINING, INFERENCE], ids=lambda p: p.soc_name)
def test_elementwise_is_bound_by_memory(profile):
    """add of 2^20 float32: three 4 MiB tensors over the HBM bandwidth (910B2 6.83 us, 310P3 61.68 us);
    its 2^20 operations on the vector units take far less."""
    x = _meta(1 << 20, dtype=torch.float32)
    cost = cost_model.op_cost(torch.ops.aten.add.Tensor, (x, x), {}, x, profile=profile)
    assert (cost.unit, cost.bound, cost.flops, cost.bytes) == ("vector", "memory", 1 << 20, 12 << 20)
    assert cost.us == pytest.approx((12 << 20) / (profile.hbm_gbps * 1e3))
    assert cost.us == pytest.approx({"Ascend910B2": 6.827, "Ascend310P3": 61.681}[profile.soc_name], abs=1e-3)
    assert cost.compute_us == pytest.approx((1 << 20) / (profile.vector_fp32_tflops * 1e6))


def test_a_dtype_the_cube_lacks_runs_on_the_vector_units():
    """A float64 matmul keeps its FLOPs but runs at half the vector units' float32 rate."""
    a = _meta(256, 256, dtype=torch.float64)
    cost = cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, torch.mm(a, a), profile=TRAINING)
    assert (cost.unit, cost.peak_tflops, cost.flops) == ("vector", TRAINING.vector_fp32_tflops / 2, 2 * 256 ** 3)


@pytest.mark.parametrize("profile", [TRAINING, INFERENCE], ids=lambda p: p.soc_name)
def test_sdpa_uses_pytorch_formula(profile):
    """_scaled_dot_product_flash_attention (B 2, heads 8, S 1024, D 64): 4*B*N*S^2*D FLOPs on the cube."""
    q = _meta(2, 8, 1024, 64)
    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    cost = cost_model.op_cost(op, (q, q, q), {}, None, profile=profile)
    assert cost.flops == 4 * 2 * 8 * 1024 ** 2 * 64
    assert cost.us == pytest.approx(max(cost.flops / (profile.cube_tflops * 1e6), cost.memory_us))


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "TND"])
def test_npu_fusion_attention_flops_and_cost(layout):
    """npu_fusion_attention and its grad have PyTorch flop formulas (FlopCounterMode counts them on npu):
    the dense SDPA count, per sequence for TND, GQA included; the cost model takes them."""
    b, n, n_kv, s, d = 2, 8, 2, 128, 64
    shapes = {"BSH": ((b, s, n * d), (b, s, n_kv * d)), "BNSD": ((b, n, s, d), (b, n_kv, s, d)),
              "TND": ((b * s, n, d), (b * s, n_kv, d))}[layout]
    query = torch.randn(*shapes[0], device="npu", dtype=torch.float16)
    key = torch.randn(*shapes[1], device="npu", dtype=torch.float16)
    extra = {"actual_seq_qlen": [s, 2 * s], "actual_seq_kvlen": [s, 2 * s]} if layout == "TND" else {}
    with FlopCounterMode(display=False) as counter:
        out = torch.ops.npu.npu_fusion_attention(query, key, key, n, layout, scale=d ** -0.5, **extra)
    forward = 4 * b * n * s * s * d
    assert counter.get_total_flops() == forward
    op = torch.ops.npu.npu_fusion_attention.default
    cost = cost_model.op_cost(op, (query, key, key, n, layout), {"scale": d ** -0.5, **extra}, out, profile=TRAINING)
    assert (cost.flops, cost.unit) == (forward, "cube")
    assert cost.us == pytest.approx(max(forward / (TRAINING.cube_tflops * 1e6), cost.memory_us))
    grad_args = (query, key, key, out[0], n, layout)
    grad_kwargs = {"softmax_max": out[1], "softmax_sum": out[2], "attention_in": out[0], "scale_value": d ** -0.5,
                   **extra}
    with FlopCounterMode(display=False) as counter:
        torch.ops.npu.npu_fusion_attention_grad(*grad_args, **grad_kwargs)
    assert counter.get_total_flops() == 10 * b * n * s * s * d  # recompute, dV, dP, dQ, dK


def test_npu_grouped_matmul_counts_each_group():
    """npu_grouped_matmul's FLOPs are 2*M*K*N per group: rows split among experts (group_type 0), one
    matmul per pair (-1), and the k axis of a weight gradient (2); FlopCounterMode counts them on npu."""
    x = torch.randn(12, 16, device="npu")
    experts = torch.randn(3, 16, 8, device="npu")
    pairs = ([torch.randn(4, 16, device="npu"), torch.randn(2, 16, device="npu")],
             [torch.randn(16, 8, device="npu"), torch.randn(16, 5, device="npu")])
    calls = [((([x], [experts]), {"group_list": [2, 7, 12], "split_item": 2}), 2 * 12 * 16 * 8),
             ((pairs, {}), 2 * (4 * 16 * 8 + 2 * 16 * 5)),
             ((([torch.randn(6, 16, device="npu")], [torch.randn(16, 8, device="npu")]),
               {"group_list": [4, 16], "group_type": 2, "split_item": 2}), 2 * 6 * 16 * 8)]
    op = torch.ops.npu.npu_grouped_matmul.List
    for (args, kwargs), flops in calls:
        with FlopCounterMode(display=False) as counter:
            out = op(*args, **kwargs)
        assert counter.get_total_flops() == flops
        cost = cost_model.op_cost(op, args, kwargs, out, profile=TRAINING)
        assert (cost.flops, cost.unit, cost.peak_tflops) == (flops, "cube", TRAINING.cube_fp32_tflops)


def test_arguments_in_schema_order_split_as_a_call_passes_them():
    """The device core hands the hook arguments in schema order; keyword-only ones become keywords."""
    op = torch.ops.npu.npu_fusion_attention_grad.default
    names = [a.name for a in op._schema.arguments]
    values = [f"<{name}>" for name in names]
    args, kwargs = cost_model.split_arguments(op, values)
    assert args == tuple(values[:6]) and list(kwargs) == names[6:]
    assert kwargs["softmax_max"] == "<softmax_max>"


def test_compute_task_us_adds_the_launch_cost():
    """The hook's duration: the roofline time plus the timing model's launch_us; a convolution's single
    result is handed to its formula as the tensor it returns (its output size decides the count)."""
    a = _meta(1024, 1024)
    with npusim.use_profile("training_soc", roofline=True):  # the current profile prices the hook's tasks
        base = cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, torch.mm(a, a)).us
        assert npusim.timing.compute_task_us(torch.ops.aten.mm.default, [a, a], [torch.mm(a, a)],
                                             launch_us=12.5) == pytest.approx(base + 12.5)
        assert math.isclose(base, 2 * 1024 ** 3 / (TRAINING.cube_tflops * 1e6))
        x, w = _meta(8, 16, 32, 32), _meta(32, 16, 3, 3)
        conv = torch.ops.aten.convolution.default
        inputs = [x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]
        y = conv(*inputs)
        flops = 2 * 8 * 32 * 32 * 32 * 16 * 9  # 2 * N * H * W * C_out * C_in * k^2
        assert npusim.timing.compute_task_us(conv, inputs, [y], launch_us=0.0) == pytest.approx(
            max(flops / (TRAINING.cube_tflops * 1e6), (x.nbytes + w.nbytes + y.nbytes) / (TRAINING.hbm_gbps * 1e3)))
    calibrated = npusim.timing.compute_task_us(torch.ops.aten.mm.default, [a, a], [torch.mm(a, a)], launch_us=0.0)
    assert calibrated == pytest.approx(base / PRESETS["training_soc"].cube_eff_medium)  # 341 FLOP/B: medium


def test_timing_settings_turn_the_compute_model_on():
    """NPUSIM_TIMING's compute flag parses as a boolean next to the numbers; a bad value names it."""
    assert npusim.timing.parse("launch_us=5,compute=1") == npusim.timing.TimingModel(launch_us=5.0, compute=True)
    assert npusim.timing.parse("copy_gbps=2") == npusim.timing.TimingModel(copy_gbps=2.0, compute=False)
    with pytest.raises(ValueError, match="NPUSIM_TIMING compute"):
        npusim.timing.parse("compute=maybe")


CALIBRATED = PRESETS["training_soc"]  # the preset's own efficiencies (Note [Calibrated efficiencies])


@pytest.mark.parametrize(("n", "kernel", "by_hand_us"), [(256, "cube_small", 0.395), (1024, "cube_medium", 15.559),
                                                         (4096, "cube_large", 606.805)])
def test_calibrated_matmul_takes_its_shape_class_efficiency(n, kernel, by_hand_us):
    """A bfloat16 n^3 mm's arithmetic intensity, 2n^3 FLOPs over 6n^2 bytes (85, 341, 1365 FLOP/B), picks
    its class; its compute time is the roofline's over the class's efficiency (0.24, 0.39, 0.64): 4096^3 is
    137.4 GFLOP at 353.9 x 0.64 TFLOPS, 606.8 us. Its memory time is over 0.57 of the HBM bandwidth."""
    a = _meta(n, n, dtype=torch.bfloat16)
    roofline = cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, torch.mm(a, a), profile=TRAINING)
    cost = cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, torch.mm(a, a), profile=CALIBRATED)
    efficiency = getattr(CALIBRATED, kernel.replace("cube_", "cube_eff_"))
    assert (cost.kernel, cost.efficiency, roofline.kernel, roofline.efficiency) == (kernel, efficiency, kernel, 1.0)
    assert cost.compute_us == pytest.approx(roofline.compute_us / efficiency)
    assert cost.compute_us == pytest.approx(by_hand_us, abs=1e-3)
    assert cost.memory_us == pytest.approx(roofline.memory_us / CALIBRATED.hbm_eff)


def test_calibrated_attention_vector_and_memory_bound_ops():
    """Flash attention takes attention_eff (B 2, heads 8, S 1024, D 64: 25.28 us at 353.9 x 0.48); an add of
    2^20 float32 stays bound by memory, 12 MiB at 0.57 x 1843.2 GB/s = 11.98 us; a float64 matmul, run by
    the vector units, takes vector_eff."""
    q = _meta(2, 8, 1024, 64)
    attention = cost_model.op_cost(torch.ops.aten._scaled_dot_product_flash_attention.default, (q, q, q), {}, None,
                                   profile=CALIBRATED)
    assert (attention.kernel, attention.efficiency) == ("attention", CALIBRATED.attention_eff)
    assert attention.compute_us == pytest.approx(25.284, abs=1e-3)
    x = _meta(1 << 20, dtype=torch.float32)
    add = cost_model.op_cost(torch.ops.aten.add.Tensor, (x, x), {}, x, profile=CALIBRATED)
    assert (add.kernel, add.bound) == ("vector", "memory") and add.us == pytest.approx(11.977, abs=1e-3)
    assert add.compute_us == pytest.approx((1 << 20) / (CALIBRATED.vector_fp32_tflops * CALIBRATED.vector_eff * 1e6))
    d = _meta(256, 256, dtype=torch.float64)
    wide = cost_model.op_cost(torch.ops.aten.mm.default, (d, d), {}, torch.mm(d, d), profile=CALIBRATED)
    assert (wide.unit, wide.kernel, wide.efficiency) == ("vector", "vector", CALIBRATED.vector_eff)


def test_roofline_override_gives_the_peaks_back():
    """NPUSIM_PROFILE_OVERRIDES' roofline=1 prices every class at its peak, exactly the uncalibrated model;
    one efficiency set alone changes only its class."""
    roofline = make_profile("training_soc", **parse_overrides("roofline=1"))
    assert all(roofline.efficiency(kernel) == 1.0 for kernel in ("cube_small", "cube_large", "attention", "vector",
                                                                  "hbm", "bus"))
    a = _meta(4096, 4096)
    assert cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, a, profile=roofline) == \
        cost_model.op_cost(torch.ops.aten.mm.default, (a, a), {}, a, profile=TRAINING)
    mine = make_profile("training_soc", **parse_overrides("cube_eff_large=0.5"))
    assert (mine.efficiency("cube_large"), mine.efficiency("cube_medium")) == (0.5, CALIBRATED.cube_eff_medium)


def test_efficiencies_out_of_range_are_refused():
    """An efficiency must be a fraction of the peak in (0, 1]; the error names the field and the range."""
    with pytest.raises(ValueError, match=r"cube_eff_large=0.0; expected a fraction of the peak in \(0, 1\]"):
        make_profile("training_soc", cube_eff_large=0.0)
    with pytest.raises(ValueError, match=r"NPUSIM_PROFILE_OVERRIDES hbm_eff: expected a fraction"):
        parse_overrides("hbm_eff=1.2")
    with pytest.raises(ValueError, match="unknown kernel class 'tensor'"):
        CALIBRATED.efficiency("tensor")
