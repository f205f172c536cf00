"""Distributed layer for npusim: the npu collective backend, the FSDP2 enhancement layer,
the historical collectives patch (comparison only) and the patch auditor.

:func:`register` (run by ``npusim``'s one ordered registration step) registers the
collective backend (``"hccl"``, the default for the ``npu`` device); see
:mod:`npusim.distributed.backend`.
"""

from __future__ import annotations

from npusim.distributed.backend import BACKEND_NAME, register

__all__ = ["BACKEND_NAME", "register"]
