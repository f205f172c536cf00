"""Distributed layer for npusim: the npu collective backend, the FSDP2 enhancement layer,
the historical collectives patch (comparison only) and the patch auditor."""
