"""``torch_npu.contrib.transfer_to_npu``: code written for CUDA runs on the npu.

Importing it applies npusim's transfer_to_npu (:mod:`npusim.compat.transfer_to_npu`,
Note [transfer_to_npu in npusim]): CUDA devices in PyTorch's device-taking calls name
the npu, ``torch.cuda``'s names answer with ``torch.npu``'s, nccl is hccl.
``is_available`` is PyTorch's own ``torch.cuda.is_available``, as torch_npu keeps it.
"""

from npusim.compat.transfer_to_npu import install, pytorch_cuda_is_available

__all__: list[str] = []

is_available = pytorch_cuda_is_available

install()
