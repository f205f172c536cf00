"""Multi-stream capture: forked streams join the capture, must join back, and replay in parallel."""

from __future__ import annotations

import time

import pytest
import torch

import npusim
from npusim.testing.device_failures import clear_device_failures


def _fork_join(a: torch.Tensor, b: torch.Tensor, side: torch.Stream) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-expert pattern: a side-stream matmul forked from and joined back to the current stream."""
    main = torch.npu.current_stream()
    side.wait_stream(main)
    with torch.npu.stream(side):
        expert = a @ b
    shared = torch.tanh(a) * 2
    main.wait_stream(side)
    return expert + shared, expert


def _side_stream() -> torch.npu.Stream:
    """A high-priority stream: never the normal-priority one torch.npu.graph captures (the pools hand streams out
    round-robin, so after many streams a normal one may be the capture stream itself)."""
    return torch.npu.Stream(priority=-1)


def _two_lane_copies() -> tuple[torch.npu.NPUGraph, list[torch.Tensor], list[torch.Tensor]]:
    """(graph, sources, destinations): a graph of two 64 KiB copies, one on the capturing stream and one on a
    side stream forked from and joined back to it."""
    src = [torch.randn(16 * 1024, device="npu") for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]
    side = _side_stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        main = torch.npu.current_stream()
        side.wait_stream(main)
        with torch.npu.stream(side):
            dst[1].copy_(src[1])
        dst[0].copy_(src[0])
        main.wait_stream(side)
    return g, src, dst


def test_fork_join_capture_replays_equal_to_eager_with_both_streams_in_the_graph(tmp_path) -> None:  # noqa: ANN001
    """A side-stream matmul captured by fork/join replays equal to eager, the side stream's work in its own lane."""
    a, b = torch.randn(32, 32, device="npu"), torch.randn(32, 32, device="npu")
    side = _side_stream()
    g = torch.npu.NPUGraph()
    g.enable_debug_mode()
    torch.npu.synchronize()
    with torch.npu.graph(g):
        out, expert = _fork_join(a, b, side)
    assert not npusim.runtime.acl.stream_is_capturing(side.stream_id, side.device_index)  # left the capture
    for _ in range(2):
        a.copy_(torch.randn(32, 32, device="npu"))
        g.replay()
        torch.npu.synchronize()
        eager_out, eager_expert = _fork_join(a, b, side)
        torch.testing.assert_close(out.cpu(), eager_out.cpu())
        torch.testing.assert_close(expert.cpu(), eager_expert.cpu())
    dump = tmp_path / "graph.txt"
    g.debug_dump(str(dump))
    lines = dump.read_text().splitlines()
    assert "2 lanes" in lines[0]
    side_lane = [line for line in lines if line.startswith(f"lane 1 (npu:0 stream {side.stream_id})")]
    assert any("aten::mm" in line for line in side_lane)
    assert not any("aten::mm" in line for line in lines if line.startswith("lane 0"))


def test_captured_lanes_replay_in_parallel() -> None:
    """Two streams' slow copies captured in parallel overlap on replay (timing model): about one copy's time."""
    # ~130 ms per copy, modelled when the copies are captured, held in real time
    with npusim.timing.model(copy_gbps=0.0005, realtime=True):
        g, src, dst = _two_lane_copies()
        start = time.perf_counter()
        g.replay()
        torch.npu.synchronize()
        elapsed = time.perf_counter() - start
    one_copy = 64 * 1024 / 0.0005e9
    assert elapsed < 1.6 * one_copy, f"replay took {elapsed:.3f} s, a copy {one_copy:.3f} s: lanes ran in series"
    for d, s in zip(dst, src, strict=True):
        assert torch.equal(d.cpu(), s.cpu())


def test_under_launch_blocking_a_replay_is_one_blocking_launch_whose_lanes_still_overlap(set_launch_blocking) -> None:  # noqa: ANN001
    """NPUSIM_LAUNCH_BLOCKING=1 (set in process): replay() returns with the whole graph done, the side lane's
    copy included, in about one copy's time, as a blocking cudaGraphLaunch runs the graph's branches in parallel."""
    # ~130 ms per copy, modelled when the copies are captured, held in real time
    with npusim.timing.model(copy_gbps=0.0005, realtime=True):
        g, src, dst = _two_lane_copies()
        torch.npu.synchronize()
        set_launch_blocking(True)
        start = time.perf_counter()
        g.replay()
        elapsed = time.perf_counter() - start
        assert torch.npu.current_stream().query()
    one_copy = 64 * 1024 / 0.0005e9
    assert one_copy <= elapsed < 1.6 * one_copy, f"replay took {elapsed:.3f} s, a copy {one_copy:.3f} s"
    for d, s in zip(dst, src, strict=True):
        assert torch.equal(d.cpu(), s.cpu())


def test_unjoined_side_stream_raises_cudas_error_and_leaves_streams_uncaptured() -> None:
    """A forked stream with work the capturing stream never waits for fails capture_end with CUDA's error."""
    a = torch.randn(8, 8, device="npu")
    side = _side_stream()
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="capturing stream has unjoined work") as error, torch.npu.graph(g):
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            a.mul(3)
    assert f"npu:0 stream {side.stream_id} joined the capture" in str(error.value)
    assert not npusim.runtime.acl.stream_is_capturing(side.stream_id, side.device_index)
    with pytest.raises(RuntimeError, match="has not been captured"):
        g.replay()
    with torch.npu.stream(side):  # the side stream runs work again
        assert torch.equal((a * 2).cpu(), a.cpu() * 2)


@pytest.mark.asynchronous
def test_waiting_on_unfinished_uncaptured_work_raises_cudas_isolation_error() -> None:
    """A capturing stream waiting on an event of unfinished work outside the capture raises CUDA's error."""
    other, capturing = torch.npu.Stream(), torch.npu.Stream(priority=-1)
    src = torch.randn(16 * 1024, device="npu")
    g = torch.npu.NPUGraph()
    with npusim.timing.model(copy_gbps=0.0005, realtime=True):
        torch.npu.synchronize()
        with torch.npu.stream(capturing):
            g.capture_begin()
        with torch.npu.stream(other):  # not captured: a slow copy, still running when the capture waits on it
            src.clone()
            pending = torch.npu.Event()
            pending.record()
        with torch.npu.stream(capturing):
            with pytest.raises(RuntimeError, match="dependency created on uncaptured work in another stream"):
                capturing.wait_event(pending)
            with pytest.raises(RuntimeError, match="invalidated"):
                g.capture_end()
    torch.npu.synchronize()


def test_a_stream_of_one_capture_cannot_wait_on_another_capture() -> None:
    """Waiting on an event recorded in another graph's capture raises CUDA's merge error."""
    first, second = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    s1, s2 = torch.npu.Stream(), torch.npu.Stream()
    with torch.npu.stream(s1):
        first.capture_begin()
        torch.ones(1, device="npu").add_(1)
        event = torch.npu.Event()
        event.record()
    with torch.npu.stream(s2):
        second.capture_begin()
        with pytest.raises(RuntimeError, match="operation would result in a merge of separate capture sequences"):
            s2.wait_event(event)
        with pytest.raises(RuntimeError, match="invalidated"):
            second.capture_end()
    with torch.npu.stream(s1):
        first.capture_end()
    first.replay()
    torch.npu.synchronize()


def test_a_failing_lane_fails_the_replay_without_hanging(device_failure: None) -> None:
    """An error in a side lane's task stops the replay and is reported by the replay stream, not a hang; the
    device then stays failed (Note [Sticky device errors]) until the harness forgets it, and replays again."""
    p = torch.full((16,), 0.5, device="npu")
    side = _side_stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        main = torch.npu.current_stream()
        side.wait_stream(main)
        with torch.npu.stream(side):
            draws = torch.bernoulli(p)  # p is read (and checked) when the replay runs
        main.wait_stream(side)
        total = draws.sum()
    p.fill_(2.0)  # no longer a probability
    with pytest.raises(RuntimeError, match=r"expected every element of p in \[0, 1\]"):
        g.replay()  # under launch blocking the replay itself raises, as a blocking cudaGraphLaunch would
        torch.npu.synchronize()
    with pytest.raises(RuntimeError, match=r"expected every element of p in \[0, 1\].*stays failed.*graph_replay"):
        g.replay()  # a launch on the failed device
    clear_device_failures()
    p.fill_(0.5)
    g.replay()
    torch.npu.synchronize()
    assert 0 <= total.item() <= 16


@pytest.mark.asynchronous
def test_a_free_while_replayed_lanes_run_fences_the_lane_streams() -> None:
    """On the last device, a tensor freed while a replayed side lane still runs is fenced by that lane's stream
    (replay lane streams are outside the device's stream table), and the freed block is not handed out before the
    lane finishes."""
    device = torch.npu.device_count() - 1
    with torch.npu.device(device):
        a = torch.ones(64, 64, device="npu")
        side = _side_stream()
        g = torch.npu.NPUGraph()
        torch.npu.synchronize()
        with torch.npu.graph(g, stream=torch.npu.Stream()):  # the default capture stream is on the first device used
            main = torch.npu.current_stream()
            side.wait_stream(main)
            with torch.npu.stream(side):
                torch.npu._sleep(90_000_000)  # 50 ms at the profile's clock: the side lane outlives the frees below
                expert = a * 3
            main.wait_stream(side)
        torch.npu.synchronize()
        with torch.npu.stream(side):  # the lane's work is on a replay lane stream, not on `side`
            g.replay()
            scratch = torch.empty(1 << 16, device="npu")
            address = scratch.data_ptr()
            del scratch  # freed while the replayed lane sleeps
            again = torch.empty(1 << 16, device="npu")
            assert again.data_ptr() != address
        torch.npu.synchronize()
        assert expert.cpu().eq(3.0).all()
