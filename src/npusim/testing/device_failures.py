"""Forgetting a device's sticky failure, for test harnesses only.

An error inside asynchronous npu work fails its device for the rest of the process, as a
device-side error fails a CUDA context (Note [Sticky device errors] in
``csrc/runtime/stream.cpp``): a user recovers by starting a new process. A harness that
checks many errors in one process (a test suite, the conformance sweep, the fuzzer) would
instead see every later check fail, so it forgets the failure here, which no real device
offers. Work skipped before the call stays skipped: the values it would have written are
not there.
"""

from __future__ import annotations

from npusim.runtime import acl


def device_failures() -> dict[int, str]:
    """The failed devices and their first errors (``"<stream>: <op> failed: <message>"``)."""
    failures = {device: acl.device_failure(device) for device in range(acl.device_count())}
    return {device: failure for device, failure in failures.items() if failure}


def clear_device_failures() -> dict[int, str]:
    """Forgets every device's failure, after waiting for the work queued so far; returns what was
    forgotten (empty when no device had failed)."""
    acl.drain_streams(-1.0)
    failures = device_failures()
    for device in failures:
        acl.clear_device_failure(device)
    return failures
