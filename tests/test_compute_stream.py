"""Compute ops are stream tasks: the host runs ahead of the device, what it must see synchronizes, a failed
task fails its device for good (every later launch and synchronizing call raises its error, in every thread), and
NPUSIM_LAUNCH_BLOCKING=1 waits for each op."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import npusim
from npusim.runtime import acl
from npusim.testing.device_failures import clear_device_failures

pytestmark = pytest.mark.asynchronous

MIB = 1 << 20
STREAM0 = r"npu:0 stream 0 \(default\)"


def _hold_stream(ms: float = 150.0) -> None:
    """Keeps the current stream busy for about ``ms`` (a slow device copy), so that what follows queues."""
    src = torch.zeros(MIB, device="npu")
    dst = torch.empty_like(src)
    torch.npu.synchronize()
    previous = npusim.timing.get()
    # The copy's duration is fixed at its launch, and held in real time (Note [Chip clock]: realtime).
    npusim.timing.set(copy_gbps=4 * MIB / (ms * 1e3) / 1e3, realtime=True)
    dst.copy_(src)
    npusim.timing.set(*previous)
    assert not torch.npu.current_stream().query()


def _tasks() -> int:
    stream = torch.npu.current_stream()
    return acl.stream_enqueued(stream.stream_id, stream.device_index)


def test_matmul_returns_before_it_completes():
    """A 2048x2048 matmul returns to the host in under a third of its completed time, its stream busy."""
    x, w = torch.randn(2048, 2048, device="npu"), torch.randn(2048, 2048, device="npu")
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    start = time.perf_counter()
    y = x @ w
    host = time.perf_counter() - start
    assert not stream.query()
    torch.npu.synchronize()
    completed = time.perf_counter() - start
    assert host < completed / 3, (host, completed)
    torch.testing.assert_close(y.cpu(), x.cpu() @ w.cpu())


_TASKS_OF_A_SMALL_ADD = textwrap.dedent("""
    import torch, npusim
    from npusim.runtime import acl
    x = torch.ones(4, device="npu")
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    before = acl.stream_enqueued(stream.stream_id, stream.device_index)
    y = x + 1
    torch.npu.synchronize()
    print(acl.stream_enqueued(stream.stream_id, stream.device_index) - before, y.tolist())
""")


@pytest.mark.parametrize(("setting", "tasks"), [(None, 0), ("1", 0), ("0", 1)])
def test_small_ops_can_be_made_stream_tasks(setting, tasks):  # noqa: ANN001
    """NPUSIM_SMALL_OPS_ON_THE_HOST=0 makes a 4-element add on an idle stream a task, as a large one is; by default
    (and with 1) the host does it in place. In a process of its own, so that the setting stays the process's."""
    env = {k: v for k, v in os.environ.items() if k != "NPUSIM_SMALL_OPS_ON_THE_HOST"}
    if setting is not None:
        env["NPUSIM_SMALL_OPS_ON_THE_HOST"] = setting
    run = subprocess.run([sys.executable, "-c", _TASKS_OF_A_SMALL_ADD], capture_output=True, text=True,
                         timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-2] == f"{tasks} [2.0, 2.0, 2.0, 2.0]", run.stdout


@pytest.mark.small_ops_on_the_host
def test_small_work_on_an_idle_stream_is_done_by_the_host_except_under_the_profiler():
    """Note [Work on an idle stream]: a small op on an idle stream is no task, a large one or one under
    torch.profiler is, named after the op."""
    small, large = torch.ones(64, device="npu"), torch.ones(1 << 15, device="npu")
    torch.npu.synchronize()
    before = _tasks()
    torch.testing.assert_close((small + small).cpu(), torch.full((64,), 2.0))
    assert _tasks() == before
    large.mul(3)
    assert _tasks() == before + 1
    torch.npu.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    with torch.profiler.profile(activities=activities) as prof:
        (small + small).cpu()
    device = [(e.name, e.device_index, e.device_resource_id) for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert device == [("aten::add.Tensor", 0, 0), ("copy_d2h", 0, 0)]


def test_profiler_reports_device_time_for_a_matmul():
    """A 2048x2048 matmul is a device activity of its stream; key_averages gives aten::mm its device time
    (Self NPU); the task ends after the host's aten::mm returned."""
    x, w = torch.randn(2048, 2048, device="npu"), torch.randn(2048, 2048, device="npu")
    torch.npu.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    with torch.profiler.profile(activities=activities) as prof:
        x @ w
        torch.npu.synchronize()
    mm = {row.key: row for row in prof.key_averages()}["aten::mm"]
    task = next(e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1)
    host = next(e for e in prof.events() if e.name == "aten::mm" and e.device_type == torch.autograd.DeviceType.CPU)
    assert task.name == "aten::mm" and (task.device_index, task.device_resource_id) == (0, 0)
    assert mm.self_device_time_total == pytest.approx(task.device_time_total) and task.device_time_total > 0
    assert host.time_range.end < task.time_range.end


def test_queued_ops_run_in_order_and_host_reads_wait_for_them():
    """Ops launched behind a busy stream run in stream order; item, tolist, printing and cpu() see them."""
    _hold_stream()
    a = torch.ones(1000, device="npu")
    b = a * 2
    c = b + a
    c.add_(1)
    assert not torch.npu.current_stream().query()
    assert c.sum().item() == 4000.0
    assert c.tolist()[:2] == [4.0, 4.0]
    assert "4., 4." in str(c[:2])
    assert c.cpu().eq(4).all()


@pytest.mark.parametrize("op", [
    pytest.param(lambda t: torch.nonzero(t > 1), id="nonzero"),
    pytest.param(lambda t: torch.unique(t), id="unique"),
    pytest.param(lambda t: torch.masked_select(t, t > 1), id="masked_select"),
    pytest.param(lambda t: t[t > 1], id="boolean-index"),
])
def test_data_dependent_shapes_wait_for_queued_work(op):
    """Ops whose output shape depends on the data run after the queued work that writes it."""
    ref = torch.arange(6.0) % 3
    _hold_stream()
    t = torch.zeros(6, device="npu")
    t.add_(ref.to("npu"))
    torch.testing.assert_close(op(t).cpu(), op(ref))


def test_host_values_wait_for_queued_work():
    """Ops returning host values (equal, bool of a tensor) see the queued writes."""
    _hold_stream()
    a, b = torch.zeros(8, device="npu"), torch.zeros(8, device="npu")
    a.add_(1)
    assert not torch.equal(a, b)
    assert bool(a[0])


def test_what_the_host_changes_after_a_launch_is_not_seen_by_the_task():
    """A queued op reads its CPU scalar and its tensors' geometry as they were at launch; an out= argument is
    resized on the host at launch; freed inputs stay valid until the task ran."""
    _hold_stream()
    x = torch.arange(8.0, device="npu").reshape(2, 4)
    scale = torch.tensor(2.0)
    y = x * scale
    scale.fill_(100.0)  # after the launch: the task still multiplies by 2
    view = x.t()
    z = view + 1
    view.t_()  # restrided on the host after the launch
    out = torch.empty(0, device="npu")
    torch.add(x, x, out=out)
    assert out.shape == (2, 4)  # resized at the launch, before the task ran
    w = x.exp()
    del x  # freed while the task that reads it is queued
    assert not torch.npu.current_stream().query()
    ref = torch.arange(8.0).reshape(2, 4)
    torch.testing.assert_close(y.cpu(), ref * 2)
    torch.testing.assert_close(z.cpu(), ref.t() + 1)
    torch.testing.assert_close(out.cpu(), ref + ref)
    torch.testing.assert_close(w.cpu(), ref.exp())


def test_a_failed_task_fails_its_device_for_every_later_call(device_failure):
    """An error inside a queued op surfaces at the next synchronize naming the op and the stream; the device's
    later work is skipped (nothing runs on bad data), and the failure is sticky as on CUDA: a second synchronize,
    a launch, a host read, Stream.query and Event.query all raise the same first error."""
    x, z = torch.ones(10, device="npu"), torch.zeros(10, device="npu")
    bad = torch.tensor([0, 20], device="npu")
    event = torch.npu.Event()
    _hold_stream()
    x.index_select(0, bad)  # index 20 is out of range: fails on the stream
    z.add_(1)  # later work of the stream
    z.mul_(5)
    first = rf"npusim: asynchronous work on {STREAM0}: aten::index_select failed: .*out of range.*"
    with pytest.raises(RuntimeError, match=first + r" \(2 later task\(s\) on npu:0 were skipped\)"):
        torch.npu.synchronize()
    with pytest.raises(RuntimeError, match=first + r"stays failed.*\(this call: synchronize\)"):
        torch.npu.synchronize()  # the second caller gets the same error
    with pytest.raises(RuntimeError, match=first + r".*\(this call: aten::add_.Tensor\)"):
        z.add_(1)  # a launch
    with pytest.raises(RuntimeError, match=first):
        z.sum().item()
    with pytest.raises(RuntimeError, match=first + r".*\(this call: Stream.query\)"):
        torch.npu.current_stream().query()
    with pytest.raises(RuntimeError, match=first + r".*\(this call: event_record\)"):
        event.record()
    with torch.npu.device(1):  # other devices work on
        assert torch.ones(3, device="npu:1").add(1).sum().item() == 6
    forgotten = clear_device_failures()  # a test harness's reset; a user starts a new process
    assert list(forgotten) == [0] and "aten::index_select failed" in forgotten[0]
    assert z.cpu().eq(0).all()  # nothing after the failure ran, and skipped work stays skipped
    z.add_(1)
    assert z.cpu().eq(1).all()


def test_a_failure_is_raised_in_every_thread_and_no_skipped_value_is_read(device_failure):
    """Two threads share npu:0's default stream: thread A's queued gather fails, thread B's later sum is skipped.
    A's synchronize raises; B's .item() must raise the same error, not return what the skipped sum never wrote
    (it returned 0.0 while the error was cleared once raised)."""
    x = torch.randn(64, device="npu")
    index = torch.tensor([100], device="npu")
    a_launched, b_launched, a_synchronized = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, str | float] = {}

    def thread_a() -> None:
        _hold_stream()
        torch.gather(x, 0, index)  # out of bounds: fails on the stream
        a_launched.set()
        b_launched.wait(10)
        try:
            torch.npu.synchronize()
        except RuntimeError as error:
            seen["a"] = str(error)
        a_synchronized.set()

    def thread_b() -> None:
        a_launched.wait(10)
        total = (x * 2).sum()  # queued behind the failing gather: skipped
        b_launched.set()
        a_synchronized.wait(10)
        try:
            seen["b"] = total.item()
        except RuntimeError as error:
            seen["b"] = str(error)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert "aten::gather failed: index 100 is out of bounds" in str(seen.get("a")), seen
    assert "aten::gather failed: index 100 is out of bounds" in str(seen.get("b")), seen


def test_events_carry_a_failure_to_another_device(device_failure):
    """An event recorded behind a failed op carries the failure: a stream of another device that waits for it
    fails its own device in turn (its later work skipped), and Event.synchronize raises."""
    x, w = torch.ones(10, device="npu"), torch.zeros(10, device="npu:1")
    bad = torch.tensor([30], device="npu")
    _hold_stream()
    x.index_select(0, bad)
    event = torch.npu.Event()
    event.record()  # queued behind the failing op: completes, carrying the failure
    other = torch.npu.Stream(device=1)
    other.wait_event(event)
    with torch.npu.stream(other):
        w.add_(1)
    with pytest.raises(RuntimeError, match=r"aten::index_select failed.*\(this call: Event.synchronize\)"):
        event.synchronize()
    with pytest.raises(RuntimeError, match=r"npu:1 stream \d+: wait_event failed: .*aten::index_select failed"):
        other.synchronize()
    assert set(clear_device_failures()) == {0, 1}
    assert w.cpu().eq(0).all()


def test_random_ops_draw_in_launch_order():
    """Random ops launched behind a busy stream take their Philox offsets at launch: the same values as on an
    idle stream, and the generator has moved on before they ran."""
    torch.manual_seed(7)
    idle = [torch.randn(4096, device="npu").cpu(), torch.randperm(100, device="npu").cpu()]
    torch.manual_seed(7)
    offset = torch.npu.default_generators[0].get_offset()
    _hold_stream()
    busy = [torch.randn(4096, device="npu"), torch.randperm(100, device="npu")]
    assert torch.npu.default_generators[0].get_offset() > offset
    assert not torch.npu.current_stream().query()
    for a, b in zip(idle, busy, strict=True):
        assert torch.equal(a, b.cpu())


def test_backward_enqueues_on_the_stream():
    """autograd's npu thread launches the backward's ops as tasks on its current stream; gradients equal CPU's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 4))
    ref = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(128, 256)
    model.to("npu")
    loss = model(x.to("npu")).square().mean()
    torch.npu.synchronize()
    before = _tasks()
    loss.backward()
    assert _tasks() > before
    cpu_model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 4))
    with torch.no_grad():
        for p, r in zip(cpu_model.parameters(), ref, strict=True):
            p.copy_(r)
    cpu_model(x).square().mean().backward()
    for p, q in zip(model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad)


def test_an_op_with_a_python_cpu_kernel_runs_on_the_host_after_queued_work():
    """An op whose CPU kernel is a Python function is no stream task: it runs on the host after the queue."""
    lib = torch.library.Library("npusim_test_compute", "DEF")  # noqa: TOR901
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    try:
        _hold_stream()
        t = torch.zeros(4, device="npu")
        t.add_(3)
        out = torch.ops.npusim_test_compute.twice(t)
        assert out.device.type == "npu" and out.cpu().eq(6).all()
    finally:
        lib._destroy()


def test_compute_cost_hook_is_given_meta_tensors_and_sets_the_duration():
    """The timing model's hook is called at each launch with the op and Meta tensors; its microseconds hold
    the stream before the kernel runs, and every op is a task while it is installed."""
    calls = []

    def cost(name: str, overload: str, inputs: list, outputs: list) -> float:
        calls.append((name, overload, [getattr(i, "device", None) for i in inputs], [o.shape for o in outputs]))
        return 200_000.0 if name == "aten::mm" else 0.0

    a = torch.ones(8, 16, device="npu")
    b = torch.ones(16, 4, device="npu")
    torch.npu.synchronize()
    acl.set_compute_cost(cost)
    try:
        start = time.perf_counter()
        c = a @ b
        assert time.perf_counter() - start < 0.1 and not torch.npu.current_stream().query()
        torch.npu.synchronize()
        assert time.perf_counter() - start >= 0.2
    finally:
        acl.set_compute_cost(None)
    assert ("aten::mm", "", [torch.device("meta")] * 2, [torch.Size([8, 4])]) in calls
    assert c.cpu().eq(16).all()


def test_launch_blocking_runs_each_op_before_its_call_returns():
    """NPUSIM_LAUNCH_BLOCKING=1: a matmul has completed when it returns; a kernel's error raises at its call."""
    code = textwrap.dedent("""
        import torch, npusim
        x = torch.randn(1024, 1024, device="npu")
        y = x @ x
        assert torch.npu.current_stream().query()
        try:
            torch.ones(4, device="npu").index_select(0, torch.tensor([9], device="npu"))
        except (RuntimeError, IndexError) as e:
            print("raised:", str(e).splitlines()[0])
    """)
    env = {**os.environ, "NPUSIM_LAUNCH_BLOCKING": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "raised:" in run.stdout and "out of range" in run.stdout


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_norm_statistics_take_the_cpu_kernels_dtype(weight_dtype):
    """Note [Statistics dtypes of CPU norms]: a queued bf16 layer norm saves its mean and rstd in the dtype
    CPU's kernel gives them, so that its backward (a CPU kernel too) runs; values and gradients equal CPU's."""
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, dtype=weight_dtype)
    expected = torch.ops.aten.native_layer_norm(x, [8], w, None, 1e-5)
    _hold_stream()
    got = torch.ops.aten.native_layer_norm(x.npu(), [8], w.npu(), None, 1e-5)
    for a, b in zip(expected, got, strict=True):
        assert b.dtype == a.dtype
        torch.testing.assert_close(b.cpu(), a, rtol=0, atol=0)
    xn = x.npu().requires_grad_()
    torch.nn.functional.layer_norm(xn, [8], w.npu()).sum().backward()
    xc = x.clone().requires_grad_()
    torch.nn.functional.layer_norm(xc, [8], w).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)
