"""The stream race sanitizer: each kind of race is reported on a racy snippet and not once the
ordering is added; npu graphs' captured ops race at their replays, not at the capture; FSDP2 on the
npu runs clean under it; the threaded process group's all-gather pattern is reported."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import npusim
from npusim.sanitizer import RaceKind, StreamRaceError
from npusim.testing.ranks import run_ranks

N = 4096


def kinds(fn: Callable[[], Any]) -> list[RaceKind]:
    """Runs ``fn`` under the sanitizer (recording) and returns the kinds reported. What ``fn``
    returns is kept alive until the sanitizer is off, so that only the snippet's own frees count."""
    with npusim.sanitizer.enabled(on_race="record") as san:
        keep = fn()
    del keep
    torch.npu.synchronize()
    return [r.kind for r in san.reports]


def _stream_race(ordered: bool) -> Any:
    side = torch.npu.Stream()
    src = torch.randn(N, device="npu")
    x = torch.empty(N, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        x.copy_(src)  # written on the side stream
    if ordered:
        torch.npu.current_stream().wait_stream(side)
    return src, x, (x * 2).sum()  # read on the default stream


def test_stream_race_reported_then_clean_with_wait():
    """(1) A read on the default stream of memory a side stream writes is reported; wait_stream fixes it."""
    assert kinds(lambda: _stream_race(False)) == [RaceKind.STREAM]
    assert kinds(lambda: _stream_race(True)) == []


def test_stream_race_report_has_both_stacks_and_raises_by_default():
    """The default on_race raises StreamRaceError naming both streams, with both stack traces."""
    with pytest.raises(StreamRaceError) as info, npusim.sanitizer.enabled():
        _stream_race(False)
    text = str(info.value)
    assert "npu:0 stream 0 (default) reads" in text and "aten::copy_ on npu:0 stream" in text
    report = info.value.reports[0]
    assert any("_stream_race" in frame.name for frame in report.stack)
    assert any("_stream_race" in frame.name for frame in report.previous.stack)
    assert report.previous.write and report.previous.op == "aten::copy_"


def _event_ordered() -> Any:
    side = torch.npu.Stream()
    x = torch.empty(N, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        x.fill_(1.0)
        done = side.record_event()
    torch.npu.current_stream().wait_event(done)
    x.add_(1.0)
    return x


def test_event_wait_orders_streams():
    """An event recorded on the writer and waited on by the reader is an ordering."""
    assert kinds(_event_ordered) == []


def _host_read(ordered: bool) -> Any:
    side = torch.npu.Stream()
    x = torch.empty(N, device="npu")
    src = torch.randn(N, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        x.copy_(src)
    if ordered:
        side.synchronize()
    x[0].item()  # the host waits for the current stream only
    return x, src


def _pinned_read(ordered: bool) -> Any:
    x = torch.randn(N, device="npu")
    host = torch.empty(N, pin_memory=True)
    host.copy_(x, non_blocking=True)  # the stream writes the pinned buffer later
    if ordered:
        torch.npu.current_stream().synchronize()
    host.sum()
    return x, host


def test_host_access_reported_then_clean_with_synchronize():
    """(2) The host reading device memory (item()) or a pinned buffer a stream is still writing."""
    assert kinds(lambda: _host_read(False)) == [RaceKind.HOST]
    assert kinds(lambda: _host_read(True)) == []
    assert kinds(lambda: _pinned_read(False)) == [RaceKind.HOST]
    assert kinds(lambda: _pinned_read(True)) == []


def _pinned_reuse(ordered: bool) -> Any:
    host = torch.randn(N).pin_memory()
    x = torch.empty(N, device="npu")
    x.copy_(host, non_blocking=True)  # the stream reads the pinned buffer later
    if ordered:
        event = torch.npu.Event()
        event.record()
        event.synchronize()
    host.fill_(0.0)
    return x, host


def test_pinned_buffer_changed_while_copy_queued():
    """(3) Overwriting a pinned source before its non-blocking copy ran; an event synchronize fixes it."""
    assert kinds(lambda: _pinned_reuse(False)) == [RaceKind.PINNED]
    assert kinds(lambda: _pinned_reuse(True)) == []


def _pinned_h2d(route: str, ordered: bool) -> Any:
    """A pinned host buffer copied to the npu without blocking by ``route``, then changed."""
    host = torch.randn(N).pin_memory()
    if route == "to":
        x = host.to("npu", non_blocking=True)
    elif route == "to_dtype":
        x = host.to("npu", torch.float16, non_blocking=True)
    elif route == "npu":
        x = host.npu(non_blocking=True)
    elif route == "copy_":
        x = torch.empty(N, device="npu")
        x.copy_(host, non_blocking=True)
    else:  # the batched host->device route of _foreach_copy_
        x = [torch.empty(N, device="npu") for _ in range(2)]
        with npusim.ops.trace_foreach_copy() as calls:
            torch._foreach_copy_(x, [host, torch.randn(N).pin_memory()], non_blocking=True)
        assert calls[0].routes == ("batch",)
    if ordered:
        torch.npu.current_stream().synchronize()
    host.add_(1.0)  # the stream may not have read it yet
    return x, host


@pytest.mark.parametrize("route", ["to", "to_dtype", "npu", "copy_", "foreach_copy_batch"])
def test_pinned_source_changed_under_every_non_blocking_h2d_route(route):
    """(3) Every route of a non-blocking copy from pinned memory (.to, .npu(), copy_, the batched
    _foreach_copy_) leaves the buffer to the stream: changing it before a synchronize is reported."""
    assert kinds(lambda: _pinned_h2d(route, False)) == [RaceKind.PINNED]
    assert kinds(lambda: _pinned_h2d(route, True)) == []


def test_dataloader_pin_memory_idiom():
    """DataLoader(pin_memory=True) batches moved with .to(non_blocking=True): clean as written, and
    each batch changed after its copy was issued is reported."""
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(8, N)), batch_size=4, pin_memory=True)

    def run(change: bool) -> Any:
        kept = []
        for (batch,) in loader:
            assert batch.is_pinned()
            kept.append(batch.to("npu", non_blocking=True) * 2)
            if change:
                batch.mul_(2)
        return kept

    assert kinds(lambda: run(False)) == []
    assert kinds(lambda: run(True)) == [RaceKind.PINNED, RaceKind.PINNED]


def test_non_blocking_to_cpu_read_early_is_reported():
    """(2) .to("cpu", non_blocking=True) returns pinned memory the stream writes later: reading it
    before a synchronize is reported, after one it is not."""
    def fn(ordered: bool) -> Any:
        x = torch.randn(N, device="npu")
        y = x.to("cpu", non_blocking=True)
        assert y.is_pinned()
        if ordered:
            torch.npu.synchronize()
        return x, y.sum()

    assert kinds(lambda: fn(False)) == [RaceKind.HOST]
    assert kinds(lambda: fn(True)) == []


def test_pageable_source_is_staged_not_reported():
    """A pageable non-blocking source is staged at the call: changing it is no race."""
    def fn() -> Any:
        host = torch.randn(N)
        x = torch.empty(N, device="npu")
        x.copy_(host, non_blocking=True)
        host.fill_(0.0)
        return x

    assert kinds(fn) == []


def _free_in_use(fix: str) -> Any:
    side = torch.npu.Stream()
    x = torch.randn(N, device="npu")  # allocated on the default stream
    y = torch.empty(N, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        y.copy_(x)  # the side stream still reads x
    if fix == "wait":
        torch.npu.current_stream().wait_stream(side)
    elif fix == "record_stream":
        x.record_stream(side)
    del x
    z = torch.randn(N, device="npu")  # a new block on the default stream: the freed one, on a device
    return y, z, side


def _record_stream_supported() -> bool:
    try:
        torch.empty(1, device="npu").record_stream(torch.npu.current_stream())
    except (NotImplementedError, RuntimeError):
        return False
    return True


def test_free_while_in_use_reported_then_clean_with_wait():
    """(4) Freeing a tensor another stream still uses, without record_stream, is reported."""
    reported = kinds(lambda: _free_in_use("none"))
    assert reported == [RaceKind.FREE]
    assert kinds(lambda: _free_in_use("wait")) == []


@pytest.mark.skipif(not hasattr(torch.Tensor, "record_stream") or not _record_stream_supported(),
                    reason="Tensor.record_stream is not implemented for the npu in this build")
def test_free_with_record_stream_is_clean():
    """(4) record_stream(side) before the free makes it safe."""
    assert kinds(lambda: _free_in_use("record_stream")) == []


def test_foreach_copy_fast_route_is_a_stream_operation():
    """A same-device _foreach_copy_ (aligned fast route) writes on the current stream: reading the
    destinations from another stream without a wait is reported; with one it is clean."""
    def fn(ordered: bool) -> Any:
        src = [torch.randn(64, device="npu") for _ in range(3)]
        dst = [torch.empty(64, device="npu") for _ in range(3)]
        torch._foreach_copy_(dst, src)
        side = torch.npu.Stream()
        if ordered:
            side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            total = dst[1].sum()
        torch.npu.current_stream().wait_stream(side)
        return src, dst, total

    assert kinds(lambda: fn(False)) == [RaceKind.STREAM]
    assert kinds(lambda: fn(True)) == []


def test_off_by_default_and_no_observers():
    """Without NPUSIM_SANITIZER the sanitizer is off and reports nothing."""
    assert not npusim.sanitizer.is_enabled()
    _stream_race(False)  # would be reported if it were on
    assert npusim.sanitizer.current() is None


# ---- npu graphs (Note [Sanitizer and npu graphs]) ---------------------------------

def _graph_training_loop() -> Any:
    """PyTorch's whole-network capture example: warm-up on a side stream, capture forward, backward and
    optimizer step, then per step copy new data into the static inputs on the current stream and replay."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("npu")
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    static_input, static_target = torch.randn(8, 16, device="npu"), torch.randn(8, 1, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_input), static_target).backward()
            opt.step()
    torch.npu.current_stream().wait_stream(side)
    g = torch.npu.NPUGraph()
    opt.zero_grad(set_to_none=True)
    with torch.npu.graph(g):
        static_loss = loss_fn(model(static_input), static_target)
        static_loss.backward()
        opt.step()
    for _ in range(3):
        data, target = torch.randn(8, 16, device="npu"), torch.randn(8, 1, device="npu")
        with torch.no_grad():
            expected = loss_fn(model(data), target).item()  # the parameters before this step's update
        static_input.copy_(data)
        static_target.copy_(target)
        g.replay()
        assert static_loss.item() == pytest.approx(expected, rel=1e-5)
    return g, model, static_input, static_target, static_loss


def _joined_stream_capture() -> Any:
    """A capture that forks onto a side stream and joins back (Note [Multi-stream capture]), replayed
    after the static input is rewritten on the current stream."""
    x = torch.zeros(N, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        side = torch.npu.Stream()
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            y = x + 1
        torch.npu.current_stream().wait_stream(side)
        z = y * 2
    x.fill_(4.0)
    g.replay()
    assert torch.equal(z.cpu(), torch.full((N,), 10.0))
    return g, x, y, z


def test_graph_static_input_copy_then_replay_is_clean():
    """The ordinary graph pattern reports nothing: ops captured into a graph access memory at each replay
    on the replay's stream, not on the capture stream at capture time (PyTorch's training-loop example,
    a capture with a joined side stream, and make_graphed_callables); the replays compute the values."""
    assert kinds(_graph_training_loop) == []
    assert kinds(_joined_stream_capture) == []

    def graphed_callables() -> Any:
        module = torch.nn.Linear(16, 4).to("npu")
        graphed = torch.npu.make_graphed_callables(module, (torch.randn(2, 16, device="npu"),))
        x = torch.randn(2, 16, device="npu")
        out = graphed(x)
        assert torch.allclose(out.cpu(), module.weight.cpu().matmul(x.cpu().T).T + module.bias.cpu(), atol=1e-5)
        return graphed, x, out

    assert kinds(graphed_callables) == []


def _graph_and_static_tensors() -> tuple[torch.npu.NPUGraph, torch.Tensor, torch.Tensor]:
    static_in = torch.zeros(N, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        static_out = static_in * 2
    return g, static_in, static_out


def _input_written_during_replay(ordered: bool) -> Any:
    """A replay on a side stream reads the static input; the default stream then overwrites it."""
    g, static_in, static_out = _graph_and_static_tensors()
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        g.replay()
    if ordered:
        torch.npu.current_stream().wait_stream(side)
    static_in.fill_(1.0)
    return g, static_in, static_out


def _output_read_during_replay(ordered: bool) -> Any:
    """A replay on a side stream writes the static output; the host copies it out waiting only for the
    default stream."""
    g, static_in, static_out = _graph_and_static_tensors()
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        static_in.fill_(3.0)
        g.replay()
    if ordered:
        torch.npu.current_stream().wait_stream(side)
        assert torch.equal(static_out.cpu(), torch.full((N,), 6.0))
    else:
        static_out.cpu()
    return g, static_in, static_out


def test_graph_replay_races_are_reported():
    """A replay reads and writes at the replay, on its stream: another stream writing its input, or the
    host reading its output, without ordering is reported, naming the replayed op; the wait fixes both."""
    with npusim.sanitizer.enabled(on_race="record") as san:
        keep = _input_written_during_replay(False)
    del keep
    assert [r.kind for r in san.reports] == [RaceKind.STREAM]
    assert "aten::fill_ on npu:0 stream 0 (default) writes" in san.reports[0].message
    assert san.reports[0].previous.op == "aten::mul (replayed by an npu graph)"
    assert not san.reports[0].previous.write
    assert any("_input_written_during_replay" in frame.name for frame in san.reports[0].previous.stack)
    assert kinds(lambda: _input_written_during_replay(True)) == []

    with npusim.sanitizer.enabled(on_race="record") as san:
        keep = _output_read_during_replay(False)
    del keep
    torch.npu.synchronize()
    assert [r.kind for r in san.reports] == [RaceKind.HOST]
    assert "while aten::mul (replayed by an npu graph) on npu:0 stream" in san.reports[0].message
    assert kinds(lambda: _output_read_during_replay(True)) == []


# ---- the threaded process group's all-gather ---------------------------------

def _threaded_all_gather(ordered: bool) -> list[RaceKind]:
    """Two host threads (sub-ranks) each copy their shard into an all-gather input on their own
    copy-in stream and issue the all-gather on their own all-gather stream, which waits for the copy-in
    (FSDP2's pattern); the last to arrive copies every sub-rank's input into every output on its own
    current stream, as multi_threaded_pg's AllGather.work does."""
    world = 2
    inputs: list[torch.Tensor] = [torch.empty(0)] * world
    outputs: list[list[torch.Tensor]] = [[] for _ in range(world)]
    events: list[torch.Event] = [torch.npu.Event()] * world
    barrier = threading.Barrier(world)
    errors: list[BaseException] = []

    with npusim.sanitizer.enabled(on_race="record") as san:
        def rank(r: int) -> None:
            try:
                with san.thread():
                    shard = torch.full((N,), float(r), device="npu")
                    outputs[r] = [torch.empty(N, device="npu") for _ in range(world)]
                    copy_in, all_gather = torch.npu.Stream(), torch.npu.Stream()
                    copy_in.wait_stream(torch.npu.current_stream())
                    with torch.npu.stream(copy_in):
                        inputs[r] = torch.empty(N, device="npu")
                        inputs[r].copy_(shard)
                    all_gather.wait_stream(copy_in)
                    all_gather.wait_stream(torch.npu.current_stream())
                    with torch.npu.stream(all_gather):
                        events[r] = all_gather.record_event()
                        if barrier.wait() == 0:  # one thread does the collective's work for all
                            if ordered:  # what a real backend does: wait for every rank's stream
                                for e in events:
                                    all_gather.wait_event(e)
                            for src in range(world):
                                for dest in range(world):
                                    outputs[dest][src].copy_(inputs[src])
                        barrier.wait()
                    torch.npu.synchronize()
            except BaseException as exc:  # noqa: BLE001  (re-raised in the test thread)
                errors.append(exc)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    torch.npu.synchronize()
    for r in range(world):
        for src in range(world):
            assert torch.equal(outputs[r][src].cpu(), torch.full((N,), float(src)))
    return [r.kind for r in san.reports]


def test_threaded_process_group_all_gather_pattern_is_reported():
    """The collective's copies on one sub-rank's stream read the other sub-rank's copy-in unordered."""
    reported = _threaded_all_gather(ordered=False)
    assert RaceKind.STREAM in reported
    assert _threaded_all_gather(ordered=True) == []


# ---- FSDP2 under the sanitizer -------------------------------------------------

def _fsdp_job(rank: int, world: int) -> dict[str, int]:
    import torch.nn.functional as F  # noqa: N812

    import npusim.sanitizer
    from npusim.testing.fsdp_harness import Setup, shard
    from npusim.testing.models import TinyTransformer

    san = npusim.sanitizer.current()
    assert san is not None, "NPUSIM_SANITIZER=1 did not enable the sanitizer"
    out = {}
    for name, setup in (("upstream", Setup()), ("enhanced", Setup(mem_cache=True, recompute_rule=True))):
        torch.manual_seed(0)
        model = TinyTransformer(vocab=32, dim=16, heads=2, seq=8, n_blocks=2).to(f"npu:{rank}")
        shard(model, setup, None)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        before = san.ops
        for _ in range(2):
            idx = torch.randint(0, 32, (2, 9), generator=gen).to(f"npu:{rank}")
            loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
        torch.npu.synchronize()
        out[name] = san.ops - before
    out["reports"] = len(san.reports)
    return out


def test_fsdp2_runs_clean_under_sanitizer():
    """PyTorch's FSDP2, then the enhancement layer (mem_cache + recompute_rule), on 2 ranks with
    NPUSIM_SANITIZER=1: no race reported (on_race raises), and the sanitizer saw every step's ops."""
    results = run_ranks(_fsdp_job, env={"NPUSIM_SANITIZER": "1"}, timeout=150, pg_timeout=90,
                        name="fsdp2 under sanitizer")
    for r in results:
        assert r["reports"] == 0
        assert r["upstream"] > 200 and r["enhanced"] > 200
