"""torch.compile (default inductor backend) on the npu: compiled results equal eager ones,
compiled code runs in stream order, allocates npu memory, honours the device, and the
``_foreach_copy_`` of FSDP2's copy-in takes a stated path; SDPA (a seeded fused op) in a
compiled nanoGPT-style model and in a compiled checkpointed block gives eager's values forward
and backward, and a recomputed seeded op draws the npu generator state its forward saved.

Compiling is slow here (each C++ kernel is a g++ run), so the file keeps the number of
distinct graphs small: tests share compiled functions, and the FSDP2 ranks compile the same
transformer block (same shapes) as the single-process test, so inductor's on-disk cache serves
the C++ kernels they share. Cold-cache run: 315 s on the 2-core VM at load average 21 (80 s of CPU).
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812
from torch._inductor.utils import run_and_get_code
from torch.testing import assert_close

import npusim
from npusim.runtime import acl
from npusim.testing.models import TinyTransformer
from npusim.testing.ranks import run_ranks

MIB = 1 << 20
# Inductor's fused kernels sum in another order than eager's; fp32 losses agree to about 1e-6.
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}
PARAM_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _pointwise(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


# One compiled pointwise function for the stream-order and device tests.
_compiled_pointwise = torch.compile(_pointwise)


def test_import_does_not_load_dynamo():
    """``import npusim`` registers torch.compile support without importing torch._dynamo."""
    code = "import sys, npusim; print('torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_registered_with_dynamo_and_inductor():
    """The npu has a dynamo device interface and an inductor scheduling, wrapper and op overrides."""
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import get_device_op_overrides, get_wrapper_codegen_for_device

    from npusim.compile.device_interface import NpuInterface
    from npusim.compile.inductor import NpuDeviceOpOverrides, NpuPythonWrapperCodegen

    assert get_interface_for_device("npu") is NpuInterface
    assert get_interface_for_device("npu:1") is NpuInterface
    assert NpuInterface.current_stream() == torch.npu.current_stream()
    assert NpuInterface.Worker.get_device_properties(1).multi_processor_count >= 1
    assert get_wrapper_codegen_for_device("npu") is NpuPythonWrapperCodegen
    assert isinstance(get_device_op_overrides("npu"), NpuDeviceOpOverrides)


def test_mlp_forward_matches_eager_and_allocates_npu_memory():
    """A compiled MLP gives the eager output; its output and temporaries are npu memory, counted."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 32)).to("npu")
    x = torch.randn(128, 64, device="npu")
    compiled = torch.compile(mlp)
    with torch.no_grad():  # nothing saved for backward: only the output outlives the call
        compiled(x)  # compile outside the measurement
        torch.npu.synchronize()
        before = torch.npu.memory_allocated()
        torch.npu.reset_peak_memory_stats()
        out = compiled(x)
        torch.npu.synchronize()
    assert out.device == torch.device("npu", 0)
    assert torch.npu.memory_allocated() - before == out.untyped_storage().nbytes()
    hidden = 128 * 256 * 4  # the (128, 256) activation: a temporary buffer of the region
    assert torch.npu.max_memory_allocated() - before >= out.untyped_storage().nbytes() + hidden
    with torch.no_grad():
        assert_close(out.cpu(), mlp(x).cpu(), rtol=1e-5, atol=1e-5)


def _reductions_and_views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.t().reshape(4, -1)[:, 1:]
    return y.sum(0), y.amax(1), x.var(0), torch.cat([x, x * 2], 1).view(-1)[::3], x.cumsum(1).argmax(0)


def test_reductions_and_views_match_eager():
    """Transposes, reshapes, slices, cat and reductions give the eager results."""
    x = torch.randn(8, 6, device="npu")
    for got, want in zip(torch.compile(_reductions_and_views)(x), _reductions_and_views(x), strict=True):
        assert got.device.type == "npu"
        assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-5)


def _softmax_scaled(x: torch.Tensor) -> torch.Tensor:
    return (x.softmax(-1) * x.shape[0]).sum(0)


def test_dynamic_shapes_compile_once():
    """``dynamic=True``: three batch sizes, one compiled frame, eager results."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(_softmax_scaled, dynamic=True, backend=counter)
    for rows in (3, 5, 9):
        x = torch.randn(rows, 4, device="npu")
        assert_close(compiled(x).cpu(), _softmax_scaled(x).cpu(), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1


def _autocast_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    with torch.autocast("npu", dtype=torch.bfloat16):
        return F.linear(F.linear(x, w1).relu(), w2)


def test_autocast_bf16_matches_eager():
    """Under ``torch.autocast("npu", bfloat16)`` the compiled region computes in bf16 as eager does."""
    torch.manual_seed(0)
    x, w1, w2 = (torch.randn(*s, device="npu") for s in ((16, 32), (64, 32), (8, 64)))
    got = torch.compile(_autocast_mlp)(x, w1, w2)
    want = _autocast_mlp(x, w1, w2)
    assert got.dtype == want.dtype == torch.bfloat16
    assert_close(got.float().cpu(), want.float().cpu(), rtol=2e-2, atol=2e-2)


def _queue_slow_h2d(x: torch.Tensor, host: torch.Tensor) -> None:
    x.copy_(host, non_blocking=True)  # pinned source: the stream reads it later, slowly
    assert torch.npu.current_stream().pending() >= 1, "the copy should still be queued"


@pytest.mark.asynchronous
def test_compiled_region_waits_for_queued_copies(monkeypatch):
    """A compiled region reads its input only after a slow H2D (and D2D) copy queued before it lands;
    with the wait removed it would read the old bytes (the check is meaningful)."""
    host = torch.arange(MIB, dtype=torch.float32).pin_memory()
    expected = _pointwise(host)
    x = torch.zeros(MIB, device="npu")
    _compiled_pointwise(x)  # compile outside the timing model
    torch.npu.synchronize()
    # 0.05 GB/s: the 4 MiB copy occupies the stream for about 84 ms.
    with npusim.timing.model(copy_gbps=0.05, realtime=True):
        _queue_slow_h2d(x, host)
        out = _compiled_pointwise(x)
        torch.npu.synchronize()
        assert torch.equal(out.cpu(), expected)

        src = torch.full((MIB,), 3.0, device="npu")
        torch.npu.synchronize()
        x.copy_(src)  # same-device D2D: always enqueued
        out = _compiled_pointwise(x)
        torch.npu.synchronize()
        assert torch.equal(out.cpu(), torch.full((MIB,), 7.0))

        x.zero_()
        torch.npu.synchronize()
        monkeypatch.setattr(acl, "launch_host_kernel", lambda device, kernel, args, *_: kernel(*args))  # no wait
        _queue_slow_h2d(x, host)
        stale = _compiled_pointwise(x)
        torch.npu.synchronize()
    assert not torch.equal(stale.cpu(), expected), "without the wait the kernel should have read the zeros"


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 5 - 2


@pytest.mark.asynchronous
def test_compiled_kernel_is_a_stream_task():
    """The generated code gives each C++ kernel its arguments' signature (read, written), and the
    kernel is then a task of the current stream: the call returns with a slow copy queued before it
    and the kernel still pending (a host run would have waited about 84 ms for the copy), and the
    result, after both, is right (Note [Compiled kernels without the GIL])."""
    host = torch.arange(MIB, dtype=torch.float32).pin_memory()
    x = torch.zeros(MIB, device="npu")
    compiled = torch.compile(_scaled)
    _, (code,) = run_and_get_code(compiled, x)
    assert re.search(r"npusim_launch\(\d+, \w+, \(\w+, \w+, \), 'rw'\)", code), code
    torch.npu.synchronize()
    with npusim.timing.model(copy_gbps=0.05, realtime=True):
        _queue_slow_h2d(x, host)
        out = compiled(x)
        assert torch.npu.current_stream().pending() >= 2, "the copy and the kernel should both be queued"
        torch.npu.synchronize()
    assert torch.equal(out.cpu(), _scaled(host))


def _done_while_holding_the_gil(graph: torch.npu.NPUGraph, seconds: float = 0.5) -> bool:
    """Replays ``graph`` and, without releasing the GIL (a switch interval longer than the wait),
    watches the stream: whether the replay completed within ``seconds``."""
    stream = torch.npu.current_stream()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        graph.replay()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if stream.query():
                return True
        return False
    finally:
        sys.setswitchinterval(interval)
        torch.npu.synchronize()


@pytest.mark.asynchronous
def test_replayed_compiled_kernel_runs_while_the_host_holds_the_gil(monkeypatch):
    """A compiled kernel captured into an npu graph is replayed without Python: the replay completes
    while the host thread holds the GIL. The same kernel captured through its Python binding (no
    entry point: a float argument's route) does not, until the host lets go of the GIL."""
    x = torch.arange(4096, dtype=torch.float32, device="npu")
    compiled = torch.compile(_scaled)
    compiled(x)  # compiled outside the captures
    torch.npu.synchronize()

    def capture() -> tuple[torch.npu.NPUGraph, torch.Tensor]:
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            out = compiled(x)
        return g, out

    graph, out = capture()
    assert _done_while_holding_the_gil(graph)
    assert torch.equal(out.cpu(), _scaled(x.cpu()))

    launch = acl.launch_host_kernel
    monkeypatch.setattr(acl, "launch_host_kernel", lambda device, kernel, args, *_: launch(device, kernel, args))
    python_graph, python_out = capture()
    assert not _done_while_holding_the_gil(python_graph), "a kernel called through Python should wait for the GIL"
    assert torch.equal(python_out.cpu(), _scaled(x.cpu()))


@pytest.mark.asynchronous
def test_compiled_kernel_error_is_asynchronous_and_names_it(device_failure):
    """Inductor's integer division by zero check, raised inside a kernel that is a stream task: the call
    returns, and the next synchronize raises the failure, naming the compiled kernel and the error (Note
    [Errors of asynchronous work]); the earlier result stays right."""
    compiled = torch.compile(lambda a, b: a // b + 1)
    a = torch.arange(8, device="npu")
    b = torch.ones(8, dtype=torch.int64, device="npu")
    assert torch.equal(compiled(a, b).cpu(), torch.arange(1, 9))
    b[3] = 0
    compiled(a, b)
    with pytest.raises(RuntimeError, match="compiled_kernel failed: .*ZeroDivisionError"):
        torch.npu.synchronize()


def test_kernel_signature_from_inductor_arg_types():
    """The letters of a C++ kernel's launch: written, read, integer; none for a type it cannot pass."""
    from npusim.compile.inductor import _kernel_signature

    assert _kernel_signature(["float*", "const float*", "const bfloat16*", "const int64_t"], 4) == "wrri"
    assert _kernel_signature(["const float*", "const float"], 2) == ""  # an unbacked float size
    assert _kernel_signature(["float*"], 2) == ""  # arg_types that do not match the call
    assert _kernel_signature(None, 1) == ""


def test_honours_input_device_not_current_device():
    """Inputs on npu:1 with npu:0 current: outputs are allocated and counted on npu:1."""
    x = torch.randn(1024, device="npu:1")
    before = [torch.npu.memory_allocated(i) for i in (0, 1)]
    out = _compiled_pointwise(x)
    torch.npu.synchronize(1)
    assert out.device == torch.device("npu", 1)
    assert torch.npu.current_device() == 0
    assert torch.npu.memory_allocated(0) == before[0]
    assert torch.npu.memory_allocated(1) - before[1] == out.untyped_storage().nbytes()
    assert torch.equal(out.cpu(), _pointwise(x.cpu()))


def test_out_of_memory_in_compiled_region_is_the_npu_error():
    """A compiled region's allocation over the device's capacity raises torch.OutOfMemoryError naming
    the npu, and the process goes on."""
    x = torch.zeros(3 * MIB, device="npu")  # 12 MiB: from 10 MiB on, each block is a segment of its own
    _compiled_pointwise(x)  # compiled outside the cap
    torch.npu.synchronize()
    torch.npu.empty_cache()  # the first output's cached block would serve the next one
    torch.npu.set_memory_capacity(torch.npu.memory_reserved() + MIB)  # less than the 12 MiB output
    with pytest.raises(torch.OutOfMemoryError, match="npu"):
        _compiled_pointwise(x)
    torch.npu.set_memory_capacity(None)
    assert torch.equal(_compiled_pointwise(x).cpu(), torch.ones(3 * MIB))


@pytest.mark.asynchronous
def test_waits_on_the_current_stream_of_the_call():
    """Called under ``torch.npu.stream(s)``, the compiled region waits for work queued on ``s``."""
    host = torch.arange(MIB, dtype=torch.float32).pin_memory()
    x = torch.zeros(MIB, device="npu")
    side = torch.npu.Stream()
    torch.npu.synchronize()
    with npusim.timing.model(copy_gbps=0.05, realtime=True), torch.npu.stream(side):
        _queue_slow_h2d(x, host)
        out = _compiled_pointwise(x)
        side.synchronize()
    assert torch.equal(out.cpu(), _pointwise(host))


def _with_side_stream(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    y = x + 1
    with torch.npu.stream(side):
        z = y * 2
    return z


def test_stream_context_inside_compiled_function():
    """``torch.npu.stream(s)`` inside a compiled function runs eagerly (graph break) with eager results;
    ``fullgraph=True`` rejects it with an error naming torch.npu.stream."""
    side = torch.npu.Stream()
    x = torch.randn(16, device="npu")
    out = torch.compile(_with_side_stream)(x, side)
    side.synchronize()
    assert torch.equal(out.cpu(), (x.cpu() + 1) * 2)

    def fullgraph_copy(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
        return _with_side_stream(x, side)

    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"torch\.npu\.stream\(s\) block is not traced"):
        torch.compile(fullgraph_copy, fullgraph=True)(x, side)


def test_cpp_wrapper_is_rejected_clearly():
    """Inductor's C++ wrapper is not supported on the npu: the error says so."""
    x = torch.randn(8, device="npu")
    with torch._inductor.config.patch(cpp_wrapper=True), \
            pytest.raises(Exception, match="C\\+\\+ wrapper .* not supported on device 'npu'"):
        torch.compile(lambda t: t.cos() + 1)(x)


# ---- _foreach_copy_ (FSDP2's all-gather copy-in shape) ----------------------

SIZES = [3, 5, 8]


def _copy_in(flat: torch.Tensor, srcs: list[torch.Tensor]) -> torch.Tensor:
    """As FSDP2's copy-in: split views of one flat buffer are the destinations."""
    torch._foreach_copy_(list(torch.split(flat, SIZES)), srcs)
    return flat.sum()


def _copy_in_inputs(dtypes: tuple[torch.dtype, ...]) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    flat = torch.zeros(sum(SIZES), device="npu")
    srcs = [(torch.arange(n, device="npu") + 10 * i).to(d) for i, (n, d) in enumerate(zip(SIZES, dtypes, strict=True))]
    expected = torch.cat([s.cpu().float() for s in srcs])
    return flat, srcs, expected


def test_foreach_copy_is_lowered_by_inductor():
    """Default backend: inductor lowers ``_foreach_copy_`` (mixed src dtypes) into its C++ kernel,
    the eager npu kernel never runs, and the flat buffer holds the eager result."""
    flat, srcs, expected = _copy_in_inputs((torch.float32, torch.int32, torch.bfloat16))
    with npusim.ops.trace_foreach_copy() as calls:
        total, (code,) = run_and_get_code(torch.compile(_copy_in), flat, srcs)
    torch.npu.synchronize()
    assert calls == []
    body = code.split("def call(")[1]
    assert "cpp_fused__foreach_copy" in body, "the copy should be a generated C++ kernel"
    assert "aten._foreach_copy" not in body, "no fallback to the eager op"
    assert torch.equal(flat.cpu(), expected)
    assert total.item() == expected.sum().item()


def test_foreach_copy_under_aot_eager_reaches_npu_kernel():
    """Not lowered (``aot_eager``): the functionalized ``_foreach_copy`` runs the npu kernel's fast route."""
    flat, srcs, expected = _copy_in_inputs((torch.float32,) * 3)
    with npusim.ops.trace_foreach_copy() as calls:
        torch.compile(_copy_in, backend="aot_eager")(flat, srcs)
    torch.npu.synchronize()
    assert [c.routes for c in calls] == [("fast",)]
    assert torch.equal(flat.cpu(), expected)


# ---- a small transformer, and FSDP2 + compile per block ---------------------

def _transformer(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(n_blocks=2, use_reentrant=None)


def _compile_blocks(model: TinyTransformer) -> None:
    for block in model.blocks:
        block.compile()


def _tokens(step: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 32, (batch, 8), generator=torch.Generator().manual_seed(100 + step))


def _lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def test_transformer_forward_backward_matches_eager():
    """TinyTransformer with compiled blocks: losses and gradients equal eager's (tolerance LOSS_TOL / PARAM_TOL)."""
    eager = _transformer().to("npu")
    compiled = copy.deepcopy(eager)
    _compile_blocks(compiled)
    for model in (eager, compiled):
        _lm_loss(model, _tokens(0).to("npu")).backward()
    loss_e, loss_c = (_lm_loss(m, _tokens(1).to("npu")) for m in (eager, compiled))
    assert_close(loss_c.cpu(), loss_e.cpu(), **LOSS_TOL)
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        assert p.grad is not None and p.grad.device.type == "npu", name
        assert_close(p.grad.cpu(), q.grad.cpu(), **PARAM_TOL, msg=lambda m, name=name: f"grad {name}: {m}")


STEPS = 3


def _fsdp_compile_job(rank: int, world: int) -> list[tuple[float, float]]:
    from torch.distributed.fsdp import fully_shard

    models = []
    for compile_blocks in (False, True):
        model = _transformer()
        for block in model.blocks:
            fully_shard(block)
            if compile_blocks:
                block.compile()  # FSDP2's hooks stay eager (dynamo skips them)
        fully_shard(model)
        models.append((model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)))
    losses = []
    for step in range(STEPS):
        tokens = _tokens(step * world + rank).to(f"npu:{rank}")
        step_losses = []
        for model, opt in models:
            loss = _lm_loss(model, tokens)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_losses.append(loss.item())
        losses.append(tuple(step_losses))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, "no block was compiled"
    (eager, _), (compiled, _) = models
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        assert_close(p.to_local().cpu(), q.to_local().cpu(), **PARAM_TOL, msg=lambda m, name=name: f"{name}: {m}")
    return losses


def test_fsdp2_with_compiled_blocks_trains_like_eager():
    """2 ranks, FSDP2 with each block compiled: 3 SGD steps give eager FSDP2's losses (LOSS_TOL) and parameters."""
    for rank_losses in run_ranks(_fsdp_compile_job, timeout=400):
        for step, (eager, compiled) in enumerate(rank_losses):
            assert_close(compiled, eager, **LOSS_TOL, msg=lambda m, step=step: f"step {step} loss: {m}")


# ---- SDPA and recomputed seeded ops ------------------------------------------
# F.scaled_dot_product_attention on npu tensors is the seeded fused op
# aten._scaled_dot_product_fused_attention_overrideable (npusim/ops/attention.py).

class _PackedQkvAttention(nn.Module):
    """nanoGPT's attention: q, k, v are strided views of one packed projection."""

    def __init__(self, n_embd: int = 32, n_head: int = 4) -> None:
        super().__init__()
        self.n_embd, self.n_head = n_embd, n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _NanoGpt(nn.Module):
    def __init__(self, vocab: int = 64, n_embd: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.ln = nn.LayerNorm(n_embd)
        self.attn = _PackedQkvAttention(n_embd)
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        return self.head(x + self.attn(self.ln(x)))


def _train_step(model: nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _assert_same_step(got: tuple[torch.Tensor, list[torch.Tensor]],
                      want: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    assert_close(got[0].cpu(), want[0].cpu(), **LOSS_TOL)
    for i, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
        assert g is not None and g.device.type == "npu", i
        assert_close(g.cpu(), w.cpu(), **PARAM_TOL, msg=lambda m, i=i: f"grad {i}: {m}")


def test_compiled_nanogpt_with_packed_qkv_matches_eager():
    """A compiled nanoGPT-style model (q, k, v views of one packed projection): two training steps
    give eager's losses and gradients, through the fused attention backward, whose gradients have
    the strides its meta kernel promises (inductor asserts them)."""
    torch.manual_seed(0)
    eager = _NanoGpt().to("npu")
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model)
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1)).to("npu")
    want = _train_step(eager, idx)
    got, codes = run_and_get_code(_train_step, compiled, idx)
    _assert_same_step(got, want)
    assert any("_scaled_dot_product_fused_attention_overrideable_backward" in c for c in codes)
    _assert_same_step(_train_step(compiled, idx * 2 % 64), _train_step(eager, idx * 2 % 64))


def _checkpointed(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).square().mean()


def test_compiled_checkpointed_sdpa_matches_eager():
    """A compiled activation-checkpointed block with SDPA: the forward saves the npu generator's
    state around the seeded attention op (run_and_save_rng_state), the backward recomputes it
    from that state (run_with_rng_state); loss and gradients equal eager's."""
    torch.manual_seed(0)
    eager = _PackedQkvAttention().to("npu")
    compiled_block = copy.deepcopy(eager)
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(2)).to("npu")

    def step(block: nn.Module, fn) -> tuple[torch.Tensor, list[torch.Tensor]]:
        block.zero_grad(set_to_none=True)
        xi = x.detach().requires_grad_()
        loss = fn(block, xi)
        loss.backward()
        return loss.detach(), [xi.grad, *(p.grad for p in block.parameters())]

    want = step(eager, _checkpointed)
    got, (forward, backward) = run_and_get_code(step, compiled_block, torch.compile(_checkpointed))
    _assert_same_step(got, want)
    assert "run_and_save_rng_state" in forward and "run_with_rng_state" in backward
    assert "_scaled_dot_product_fused_attention_overrideable" in backward


def test_recomputed_dropout_draws_what_the_forward_drew():
    """Under fallback_random a checkpointed dropout runs the npu generator's kernel: the backward's
    recomputation restores the saved npu state, so the gradient keeps exactly the forward's mask."""

    def region(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x.sin(), 0.5, training=True)

    def dropped(x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(region, x, use_reentrant=False)

    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3)).to("npu").requires_grad_()

    def step(fn) -> tuple[torch.Tensor, torch.Tensor]:
        torch.npu.manual_seed(3)
        y = fn(x)
        y.backward(torch.ones_like(y))
        return y.detach(), x.grad

    with torch._inductor.config.patch(fallback_random=True):
        (y, grad), (forward, backward) = run_and_get_code(step, torch.compile(dropped))
    assert "run_and_save_rng_state" in forward and "run_with_rng_state" in backward
    kept = y != 0
    assert 0.4 < kept.float().mean().item() < 0.6
    assert_close(grad.cpu(), torch.where(kept, 2 * x.detach().cos(), 0).cpu())


def test_rng_state_ops_on_npu_tensors():
    """run_and_save_rng_state returns the npu generator's state before the op; run_with_rng_state
    redraws the same numbers from it and leaves the generator where it was; a state that is not
    the npu's is refused naming the op and device; cpu tensors still take torch's cpu kernel."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    rand = torch.ops.aten.rand.default
    torch.npu.manual_seed(5)
    before = torch.npu.get_rng_state()
    state, drawn = run_and_save_rng_state(rand, [16], device=torch.device("npu:0"))
    assert torch.equal(state, before) and drawn.device.type == "npu"
    after = torch.npu.get_rng_state()
    assert not torch.equal(after, before)
    again = run_with_rng_state(state, rand, [16], device=torch.device("npu:0"))
    assert torch.equal(again.cpu(), drawn.cpu())
    assert torch.equal(torch.npu.get_rng_state(), after)
    with pytest.raises(RuntimeError, match=r"run_with_rng_state on npu:0: expected the npu generator state"):
        run_with_rng_state(state.float(), rand, [16], device=torch.device("npu:0"))
    cpu_before = torch.get_rng_state()
    cpu_state, _ = run_and_save_rng_state(rand, [4], device=torch.device("cpu"))
    assert torch.equal(cpu_state, cpu_before) and not torch.equal(torch.get_rng_state(), cpu_before)
