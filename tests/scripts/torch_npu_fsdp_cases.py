"""FSDP2 tests as torch_npu's test/distributed/fsdp2 files are written (FSDPNPUTest, 2 ranks); run
unmodified by tests/test_spawned_ranks.py under `python -m npusim run -m pytest`. Expected: 1 passes."""

import copy

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.common_fsdp import MLP
from torch.testing._internal.common_utils import run_tests
from torch_npu.testing._internal.common_fsdp import FSDPNPUTest
from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU


class TestFullyShardOnNpu(FSDPNPUTest):
    @property
    def world_size(self) -> int:
        return 2

    @skipIfUnsupportMultiNPU(2)
    def test_train_parity_with_replicated_reference(self):
        torch.manual_seed(42)
        model = MLP(8, torch.device("cpu"))
        ref_model = copy.deepcopy(model).npu()
        fully_shard(model)
        optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        ref_optim = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
        torch.manual_seed(self.rank + 1)
        for _ in range(3):
            inp = torch.randn((2, 8), device="npu")
            losses = []
            for m, o in ((ref_model, ref_optim), (model, optim)):
                o.zero_grad()
                loss = m(inp).sum()
                loss.backward()
                losses.append(loss)
                if m is ref_model:
                    for param in m.parameters():
                        dist.all_reduce(param.grad, op=dist.ReduceOp.AVG)
                o.step()
            self.assertEqual(losses[0], losses[1])
        # Each rank: its own npu, the hccl group, npusim's torch_npu.
        self.assertEqual(torch.npu.current_device(), self.rank)
        self.assertEqual(dist.get_backend(), "hccl")
        self.assertIs(torch_npu.npu, torch.npu)


if __name__ == "__main__":
    run_tests()
