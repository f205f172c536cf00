"""Calls an npu graph capture refuses as CUDA's does: raising (never hanging), by capture_error_mode.

A wait on the capture's own work is rejected and the capture goes on, as on the NPU (torch_npu's
test_aclgraph_pin_memory); CUDA's potentially unsafe calls invalidate it (Note [Capture-time refusals]).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import pytest
import torch

NOT_PERMITTED = "operation not permitted when stream is capturing"
CAPTURED_EVENT = "operation not permitted on an event last recorded in a capturing stream"
TIMEOUT_S = 20.0


def _within_timeout(fn: Callable[[], object]) -> object:
    """Runs fn on a thread; fails the test if it has not returned within TIMEOUT_S (a hang)."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as error:  # noqa: BLE001  (handed back to the test)
            result.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive(), f"the call did not return within {TIMEOUT_S} s"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _capture_with(call: Callable[[], object], mode: str = "global"
                  ) -> tuple[BaseException | None, str | None, torch.Tensor | None]:
    """Begins a capture (on the calling thread) of one add_, makes the call, ends; (the call's error,
    capture_end's error, the captured tensor after one replay, if the capture ended)."""
    g = torch.npu.NPUGraph()
    torch.npu.synchronize()
    call_error = end_error = None
    captured = torch.zeros(1, device="npu")
    # A high-priority stream: never one of the normal-priority "other" streams the tests query.
    with torch.npu.stream(torch.npu.Stream(priority=-1)):
        g.capture_begin(capture_error_mode=mode)
        captured.add_(1)  # something to capture
        try:
            call()
        except RuntimeError as error:
            call_error = error
        try:
            g.capture_end()
        except RuntimeError as error:
            end_error = str(error)
    if end_error is not None:
        return call_error, end_error, None
    g.replay()
    torch.npu.synchronize()
    return call_error, end_error, captured.cpu()


def _event_recorded_in_capture(enable_timing: bool = False) -> torch.Event:
    e = torch.npu.Event(enable_timing=enable_timing)
    e.record()
    return e


@pytest.mark.parametrize(("name", "call", "message"), [
    ("Event.synchronize", lambda: _event_recorded_in_capture().synchronize(), CAPTURED_EVENT),
    ("Event.query", lambda: _event_recorded_in_capture().query(), CAPTURED_EVENT),
    ("Event.elapsed_time", lambda: _event_recorded_in_capture(True).elapsed_time(_event_recorded_in_capture(True)),
     CAPTURED_EVENT),
    ("Stream.query", lambda: torch.npu.current_stream().query(), NOT_PERMITTED),
    ("Stream.synchronize", lambda: torch.npu.current_stream().synchronize(), NOT_PERMITTED),
    ("torch.npu.synchronize", lambda: torch.npu.synchronize(), NOT_PERMITTED),
    ("torch.accelerator.synchronize", lambda: torch.accelerator.synchronize(), NOT_PERMITTED),
    ("item", lambda: torch.ones(2, device="npu").sum().item(), NOT_PERMITTED),
])
def test_host_queries_and_waits_of_the_capture_raise_and_leave_it_valid(name: str, call: Callable[[], object],
                                                                         message: str) -> None:
    """A host query or wait on the captured stream or a captured event raises CUDA's error; as on the NPU the
    capture goes on: capture_end succeeds and the replay runs what was captured (the refused call added nothing)."""
    call_error, end_error, replayed = _within_timeout(lambda: _capture_with(call))
    assert call_error is not None and message in str(call_error), (name, call_error)
    assert end_error is None, (name, end_error)
    assert replayed is not None and replayed.tolist() == [1.0]
    assert not torch.npu.is_current_stream_capturing()


@pytest.mark.parametrize(("mode", "refused"), [("global", True), ("thread_local", True), ("relaxed", False)])
def test_queries_of_other_streams_follow_capture_error_mode(mode: str, refused: bool) -> None:
    """Stream/Event query and synchronize outside the capture: refused in 'global' and 'thread_local' only."""
    other = torch.npu.Stream()
    recorded = torch.npu.Event()
    recorded.record(other)  # an event never recorded is not waited for at all (CUDA's is not created)
    for call in (other.query, other.synchronize, recorded.synchronize, recorded.query):
        call_error, end_error, _ = _within_timeout(lambda c=call: _capture_with(c, mode))
        if refused:
            assert call_error is not None and "potentially unsafe call" in str(call_error)
            assert f"capture_error_mode='{mode}'" in str(call_error)
            assert end_error is not None and "invalidated" in end_error
        else:
            assert call_error is None and end_error is None


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_a_device_synchronize_is_refused_in_every_mode_and_says_so(mode: str) -> None:
    """A device-wide synchronize waits on the captured stream itself: every capture_error_mode refuses it, so the
    refusal must not send the user to 'relaxed' (it did), while a query of another stream still points there. It
    is a rejected synchronization of the capture's own stream: the capture stays valid."""
    for call in (torch.npu.synchronize, torch.accelerator.synchronize):
        call_error, end_error, replayed = _within_timeout(lambda c=call: _capture_with(c, mode))
        assert call_error is not None and NOT_PERMITTED in str(call_error), (mode, call_error)
        assert "'relaxed' allows it" not in str(call_error)
        if mode != "relaxed":  # refused as a potentially unsafe call first, naming why no mode allows it
            assert "no capture_error_mode allows it: it waits on npu:0, whose stream is captured" in str(call_error)
        assert end_error is None and replayed is not None and replayed.tolist() == [1.0]
    other = torch.npu.Stream()
    other.record_event()
    call_error, _, _ = _within_timeout(lambda: _capture_with(other.query, "global"))
    assert call_error is not None and "'relaxed' allows it" in str(call_error)


@pytest.mark.parametrize(("mode", "refused"), [("global", True), ("thread_local", False)])
def test_another_threads_query_is_refused_only_in_global_mode(mode: str, refused: bool) -> None:
    """A query from another thread invalidates a 'global' capture and is allowed by a 'thread_local' one."""
    other = torch.npu.Stream()

    def query_on_another_thread() -> None:
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(_call_or_error(other.query)))
        thread.start()
        thread.join(TIMEOUT_S)
        if isinstance(outcome[0], BaseException):
            raise outcome[0]

    call_error, end_error, _ = _within_timeout(lambda: _capture_with(query_on_another_thread, mode))
    assert (call_error is not None) == refused and (end_error is not None) == refused
    if refused:
        assert "from every thread" in str(call_error)


def _call_or_error(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except RuntimeError as error:
        return error


def test_empty_cache_during_capture_raises_and_keeps_the_capture() -> None:
    """empty_cache raises while a capture is underway (CUDA's allocator asserts); the capture stays valid."""
    call_error, end_error, _ = _within_timeout(lambda: _capture_with(torch.npu.empty_cache))
    assert call_error is not None and "empty_cache: not permitted while an npu graph capture is underway" in str(
        call_error)
    assert end_error is None
    torch.npu.empty_cache()  # allowed again after the capture


def test_event_recorded_in_capture_stays_refused_after_it_ends() -> None:
    """An event last recorded during a capture that has ended cannot be waited for on the host (it never completes)."""
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.ones(1, device="npu").add_(1)
        event = _event_recorded_in_capture()
    with pytest.raises(RuntimeError, match=CAPTURED_EVENT):
        _within_timeout(event.synchronize)
    event.record()  # recorded again outside the capture: an ordinary event
    _within_timeout(event.synchronize)
    assert event.query()


def test_debug_dump_warns_without_debug_mode(tmp_path) -> None:  # noqa: ANN001
    """debug_dump without enable_debug_mode() warns and writes nothing, as torch.cuda.CUDAGraph's does."""
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.ones(1, device="npu").add_(1)
    path = tmp_path / "graph.txt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g.debug_dump(str(path))
    assert len(caught) == 1 and str(caught[0].message).startswith(
        "NPU Graphs debug not enabled, set with [graph].enable_debug_mode()")  # and where, as CUDA's warning
    assert not path.exists()


def test_get_currently_capturing_graph() -> None:
    """get_currently_capturing_graph returns the capturing NPUGraph itself; outside a capture, CUDA's error."""
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.ones(1, device="npu").add_(1)
        assert torch.npu.NPUGraph.get_currently_capturing_graph() is g
    with pytest.raises(RuntimeError, match="The current stream is not currently capturing."):
        torch.npu.NPUGraph.get_currently_capturing_graph()


def test_get_currently_capturing_graph_refuses_an_accelerator_graph_capture() -> None:
    """Inside a torch.accelerator.Graph capture, NPUGraph.get_currently_capturing_graph raises torch_npu's error
    naming the device (there is no NPUGraph to return); the capture stays valid and replays."""
    x = torch.ones(4, device="npu")
    y = torch.empty_like(x)
    g = torch.accelerator.Graph()
    with torch.Stream(device="npu"), g:
        y.copy_(x * 3)
        with pytest.raises(RuntimeError, match=r"torch.npu.NPUGraph.get_currently_capturing_graph\(\) is not "
                                               r"supported during torch.accelerator.Graph capture \(the current "
                                               r"stream of npu:0 is captured"):
            torch.npu.NPUGraph.get_currently_capturing_graph()
    x.fill_(2)
    g.replay()
    torch.accelerator.synchronize()
    assert y.tolist() == [6.0] * 4
