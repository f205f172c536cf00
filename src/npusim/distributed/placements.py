"""The placement lists npusim's DTensor sharding rules return, shared by every rule module.

A rule (``torch.distributed.tensor.experimental.register_sharding``) returns, per acceptable sharding,
the input placements and the output placements; ``None`` stands for a non-tensor argument or output.
"""

from __future__ import annotations

from torch.distributed.tensor import Placement

PlacementList = list[Placement | None]
