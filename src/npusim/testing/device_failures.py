"""Forgetting a device's sticky failure, for test harnesses only.

An error inside asynchronous npu work fails its device for the rest of the process, as a
device-side error fails a CUDA context (Note [Sticky device errors] in
``csrc/runtime/stream.cpp``): a user recovers by starting a new process. A harness that
checks many errors in one process (a test suite, the conformance sweep, the fuzzer) would
instead see every later check fail, so it forgets the failure with
:func:`clear_device_failures`, which no real device offers. Work skipped before the call
stays skipped: the values it would have written are not there.
"""

from __future__ import annotations

from npusim._device import clear_device_failures, device_failures

__all__ = ["clear_device_failures", "device_failures"]
