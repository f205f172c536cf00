"""``torch_npu.contrib.transfer_to_npu``: code that says ``cuda`` runs on the npu.

Importing it makes ``torch.cuda`` name ``torch.npu``, as torch_npu's does, so
device-generic scripts written for CUDA (``torch.cuda.synchronize()``,
``torch.cuda.device_count()``) drive the simulated npu.
"""

import torch

torch.cuda = torch.npu  # type: ignore[assignment]
