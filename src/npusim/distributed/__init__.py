"""Distributed layer for npusim: the npu collective backend, the FSDP2 enhancement layer,
the historical collectives patch (comparison only) and the patch auditor.

Importing this package registers the collective backend (``"hccl"``, the
default for the ``npu`` device); see :mod:`npusim.distributed.backend`.
"""

from __future__ import annotations

import npusim._device  # noqa: F401  (registers the npu device first)
from npusim.distributed.backend import BACKEND_NAME, register

register()

__all__ = ["BACKEND_NAME"]
