"""A test file as torch_npu's and op-plugin's are written, against torch_npu.testing.

Run unmodified by tests/test_torch_npu_testing.py under `python -m npusim run -m pytest`
(`python -m npusim run torch_npu_style_cases.py` runs it with unittest). Expected: 6 pass, 3 skip.
"""

import numpy as np
import torch
import torch_npu  # noqa: F401
from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU
from torch_npu.testing.common_utils import (
    SkipIfNotGteCANNVersion,
    SupportedDevices,
    _create_scaling_case,
    create_common_tensor,
    freeze_rng_state,
)
from torch_npu.testing.decorator import Dtypes, Formats, instantiate_tests
from torch_npu.testing.testcase import TestCase, run_tests


class TestAdd(TestCase):
    def cpu_op_exec(self, input1, input2):
        return torch.add(input1, input2).numpy()

    def npu_op_exec(self, input1, input2):
        return torch.add(input1, input2).to("cpu").numpy()

    @SupportedDevices(["Ascend910B"])
    def test_add_float32_shape_format(self):
        for item in [[np.float32, 2, (4, 3)], [np.float32, 0, (2, 3, 4)], [np.float16, -1, (5,)]]:
            cpu_input1, npu_input1 = create_common_tensor(item, -10, 10)
            cpu_input2, npu_input2 = create_common_tensor(item, -10, 10)
            if cpu_input1.dtype == torch.float16:
                cpu_input1, cpu_input2 = cpu_input1.float(), cpu_input2.float()
            cpu_output = self.cpu_op_exec(cpu_input1, cpu_input2).astype(npu_input1.cpu().numpy().dtype)
            self.assertRtolEqual(cpu_output, self.npu_op_exec(npu_input1, npu_input2))

    def test_assert_equal_moves_to_the_first_device(self):
        self.assertEqual(torch.arange(6.0), torch.arange(6.0, device="npu"))
        self.assertEqual([1.0, {"a": torch.ones(2)}], [1.0 + 1e-7, {"a": torch.ones(2, device="npu")}])

    def test_freeze_rng_state(self):
        with freeze_rng_state():
            first = torch.rand(3, device="npu").cpu()
        self.assertEqual(first, torch.rand(3, device="npu").cpu())

    def test_grad_scaler_case_matches_control(self):
        mod_control, mod_scaling, opt_control, opt_scaling, data, loss_fn, skip_iter = _create_scaling_case()
        scaler = torch.npu.amp.GradScaler(init_scale=128.0, growth_factor=2.0)
        for i, (x, target) in enumerate(data):
            for model, optimizer, scaled in ((mod_control, opt_control, False), (mod_scaling, opt_scaling, True)):
                optimizer.zero_grad()
                loss = loss_fn(model(x), target)
                if scaled:
                    scaler.scale(loss).backward()
                    if i == skip_iter:
                        model[1].weight.grad.fill_(float("inf"))
                    scaler.step(optimizer)
                    scaler.update()
                elif i != skip_iter:
                    loss.backward()
                    optimizer.step()
        self.assertEqual(scaler.get_scale(), 64.0)  # one overflow: backed off once
        for control, scaling in zip(mod_control.parameters(), mod_scaling.parameters(), strict=True):
            self.assertRtolEqual(control.detach().cpu(), scaling.detach().cpu())

    @SupportedDevices(["Ascend310P"])
    def test_only_on_inference_soc(self):
        raise AssertionError("skipped on the simulated Ascend910B")

    @SkipIfNotGteCANNVersion("99.0.0")
    def test_needs_a_future_cann(self):
        raise AssertionError("skipped below CANN 99.0.0")

    @skipIfUnsupportMultiNPU(64)
    def test_needs_64_npus(self):
        raise AssertionError("skipped without 64 npus")


@instantiate_tests
class TestMulDtypes(TestCase):
    @Dtypes(torch.float16, torch.float32)
    @Formats(2)
    def test_mul(self, device, dtype, npu_format):
        cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        npu = cpu.to(device=device, dtype=dtype)
        self.assertRtolEqual((cpu * 3).to(dtype).numpy(), (npu * 3).cpu().numpy())


if __name__ == "__main__":
    run_tests()
