"""The npu random kernels' numbers: Philox-4x32-10 blocks drawn many at a time, split across threads.

The batched kernels (Note [Philox blocks in batches] in ``csrc/aten/philox_blocks.h``) must draw
exactly the numbers the one-block-at-a-time kernels drew, whatever the thread count and however a
tensor is split into chunks: the words are checked against an independent Philox reference written
here with numpy, the libm-free ops against digests stored from the kernels before the change, and
the transforms that called libm (normal_) against the reference with the same libm functions. The
float normal_ now runs glibc's log1pf and cosf operation by operation over vectors (Note [Box-Muller
bit for bit] in ``csrc/aten/box_muller.h``): every input those take is checked, form against form
and against this machine's libm, and the outputs against digests stored while normal_ called libm.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from npusim.runtime import acl

NPU = "npu"
SEED = 123
# more elements than one parallel chunk (kGrain, 2^14), and not a multiple of a batch (32)
LARGE = 70000


def philox_words(seed: int, offset: int, n: int) -> np.ndarray:
    """Words [n, 4] of Philox-4x32-10 blocks with key ``seed`` at 128-bit counters offset .. offset + n - 1."""
    counter = (np.arange(n, dtype=np.uint64) + np.uint64(offset % 2**64))
    carry = (counter < np.uint64(offset % 2**64)).astype(np.uint64)  # the sum wrapped 2^64
    mask = np.uint64(0xFFFFFFFF)
    c = [counter & mask, counter >> np.uint64(32), carry, np.zeros(n, dtype=np.uint64)]
    key = [seed & 0xFFFFFFFF, seed >> 32]
    for _ in range(10):
        p0 = c[0] * np.uint64(0xD2511F53)
        p1 = c[2] * np.uint64(0xCD9E8D57)
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(key[0])) & mask, p1 & mask,
             ((p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(key[1])) & mask, p0 & mask]
        key = [(key[0] + 0x9E3779B9) & 0xFFFFFFFF, (key[1] + 0xBB67AE85) & 0xFFFFFFFF]
    return np.stack(c, axis=1).astype(np.uint32)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        torch.set_num_threads(before)


def _set_state(seed: int, offset: int) -> None:
    torch.npu.set_rng_state(torch.cat([torch.tensor([seed], dtype=torch.uint64).view(torch.uint8),
                                       torch.tensor([offset], dtype=torch.uint64).view(torch.uint8)]))


@pytest.mark.parametrize("numel", [16, 33, LARGE])
@pytest.mark.parametrize("offset", [0, 2**32 - 20, 2**64 - 40], ids=["offset-0", "low-word-wrap", "2^64-wrap"])
def test_full_range_random_is_the_low_half_of_each_philox_block(threads: int, numel: int, offset: int):
    """random_() over int64's whole range returns each element's block words 0-1, across counter carries."""
    _set_state(SEED, offset)
    got = torch.empty(numel, dtype=torch.int64, device=NPU).random_(-(2**63), None).cpu().numpy()
    words = philox_words(SEED, offset, numel).astype(np.uint64)
    expected = (words[:, 0] | (words[:, 1] << np.uint64(32))).view(np.int64)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("form", ["auto", "portable", "avx2", "avx512"])
@pytest.mark.parametrize("offset", [0, 2**32 - 20, 2**64 - 40], ids=["offset-0", "low-word-wrap", "2^64-wrap"])
def test_every_form_of_the_kernel_draws_philox_words(form: str, offset: int):
    """Each form of the batched kernel this machine has (the others are skipped) gives the reference's words,
    whole batches and a partial one, across counter carries: the form picked at run time differs by machine."""
    n = 3 * 32 + 5
    got = acl.philox_words(form, SEED, offset, n)
    if got is None:
        pytest.skip(f"this machine has no {form} form")
    np.testing.assert_array_equal(got.numpy().astype(np.uint32), philox_words(SEED, offset, n))


def _digest(t: torch.Tensor) -> str:
    flat = t.contiguous().reshape(-1)
    raw = flat.to(torch.uint8) if flat.dtype == torch.bool else flat.view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]


def _transposed(dtype: torch.dtype) -> torch.Tensor:
    """A non-contiguous npu tensor (element order differs from memory order)."""
    return torch.empty(41, 37, dtype=dtype, device=NPU).t()


_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "uniform": lambda t: t.uniform_(-2, 3),
    "bernoulli": lambda t: t.bernoulli_(0.3),
    "random": lambda t: t.random_(0, 100),
    "dropout": lambda t: F.dropout(t.fill_(1.5), 0.3, training=True),
    "dropout_mask": lambda t: torch.ops.aten.native_dropout(t.fill_(-2.0), 0.4, True)[1].to(t.dtype),
    "normal": lambda t: t.normal_(1.5, 2.0),
    "log_normal": lambda t: t.log_normal_(0.25, 0.5),
}

# sha256[:16] of the outputs' bytes, drawn with seed 123 by the one-block-at-a-time kernels of
# 6732f71 (before the batched kernels), over LARGE elements.
_STORED = {
    ("uniform", torch.float32): "24c5f672eb74a5f7",
    ("bernoulli", torch.float32): "9af7505ca3b81aeb",
    ("random", torch.float32): "707213428831e4eb",
    ("dropout", torch.float32): "e16fc5580bc12d12",
    ("dropout_mask", torch.float32): "e7bdc45aa6a66851",
    ("uniform", torch.float16): "fd47dedf6782dcd1",
    ("bernoulli", torch.float16): "2e137e8cf936b262",
    ("dropout", torch.float16): "846fb844e0417cc2",
    ("uniform", torch.bfloat16): "51b3b9df55818bff",
    ("bernoulli", torch.bfloat16): "3c10125338bd8dd2",
    ("dropout", torch.bfloat16): "62b7f4f3464bf51d",
    ("uniform", torch.float64): "f153fa3519810024",
    ("bernoulli", torch.float64): "8d159668e7cab9f6",
    ("dropout", torch.float64): "13810d61c1c20d75",
    # normal_ and log_normal_ as they were drawn at 6212a27, calling libm's log1pf and cosf one
    # element at a time (float, half, bfloat16) and log1p and cos (double)
    ("normal", torch.float32): "6008f97c2459ab8c",
    ("log_normal", torch.float32): "ace117ee5523a575",
    ("normal", torch.float16): "166d3e28bab4f035",
    ("log_normal", torch.float16): "df49d5fedca88909",
    ("normal", torch.bfloat16): "04438b8bfd8742e5",
    ("log_normal", torch.bfloat16): "e1c18bda83040b45",
    ("normal", torch.float64): "253934a037ae6f5a",
    ("log_normal", torch.float64): "a291e048df6f5156",
}


@pytest.mark.parametrize(("name", "dtype"), list(_STORED), ids=[f"{n}-{d}" for n, d in _STORED])
def test_random_ops_draw_the_stored_numbers(threads: int, name: str, dtype: torch.dtype):
    """Each op's output over LARGE elements has the digest the earlier kernels' output had."""
    torch.manual_seed(SEED)
    out = _OPS[name](torch.empty(LARGE, dtype=dtype, device=NPU))
    assert _digest(out.cpu()) == _STORED[(name, dtype)]


def _libm() -> ctypes.CDLL:
    path = ctypes.util.find_library("m")
    if path is None:
        pytest.skip("no libm to call log1pf / cosf from")
    libm = ctypes.CDLL(path)
    for name in ("log1pf", "cosf"):
        getattr(libm, name).restype = ctypes.c_float
        getattr(libm, name).argtypes = [ctypes.c_float]
    return libm


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "transposed"])
def test_normal_is_box_muller_over_each_block_in_float(threads: int, contiguous: bool):
    """normal_ on float32: sqrt(-2 log1p(-u1)) cos(2 pi u2) * std + mean, u1 from word 0, u2 from word 2, in float."""
    libm = _libm()
    t = torch.empty(LARGE, device=NPU) if contiguous else _transposed(torch.float32)
    n = t.numel()
    torch.manual_seed(SEED)
    got = t.normal_(1.5, 2.0).cpu().reshape(-1).numpy()
    words = philox_words(SEED, 0, n)
    u1 = (words[:, 0] >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    u2 = (words[:, 2] >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    log1p = np.array([libm.log1pf(float(-u)) for u in u1], dtype=np.float32)
    angle = np.float32(2) * np.float32(np.pi) * u2
    cos = np.array([libm.cosf(float(a)) for a in angle], dtype=np.float32)
    expected = np.sqrt(np.float32(-2) * log1p) * cos * np.float32(2.0) + np.float32(1.5)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_dropout_in_one_pass_equals_mask_times_input_times_scale(dtype: torch.dtype):
    """native_dropout's one pass gives bernoulli_(1 - p)'s mask and (x * mask) * scale, NaN and inf kept as CUDA."""
    p = 0.25
    x = torch.randn(3, 1000, dtype=torch.float64).to(dtype)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=dtype)
    torch.manual_seed(SEED)
    out, mask = torch.ops.aten.native_dropout(x.to(NPU), p, True)
    offset_after = torch.npu.get_rng_state()[8:].view(torch.int64).item()
    torch.manual_seed(SEED)
    expected_mask = torch.empty(x.shape, dtype=torch.bool, device=NPU).bernoulli_(1 - p).cpu()
    assert mask.dtype == torch.bool and torch.equal(mask.cpu(), expected_mask)
    expected = (x * expected_mask).mul_(1 / (1 - p))
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    assert offset_after == 3000  # numel, as bernoulli_ on the mask advances it


def test_dropout_of_a_strided_input_takes_the_three_ops():
    """A non-contiguous input keeps the composite route (mask, mul, mul_) with the same numbers."""
    x = torch.randn(50, 40).t()
    torch.manual_seed(SEED)
    out, mask = torch.ops.aten.native_dropout(x.to(NPU), 0.5, True)
    torch.manual_seed(SEED)
    expected_mask = torch.empty(x.shape, dtype=torch.bool, device=NPU).bernoulli_(0.5).cpu()
    assert torch.equal(mask.cpu(), expected_mask)
    assert torch.equal(out.cpu(), x * expected_mask * 2.0)


def _tasks(stream: torch.npu.Stream) -> int:
    return acl.stream_enqueued(stream.stream_id, stream.device_index)


@pytest.mark.small_ops_on_the_host
def test_small_random_op_on_an_idle_stream_runs_on_the_host_and_a_large_one_is_a_task():
    """Note [Work on an idle stream]: a 16-element uniform_ enqueues nothing; a LARGE one is one stream task."""
    stream = torch.npu.current_stream()
    small, large = torch.empty(16, device=NPU), torch.empty(LARGE, device=NPU)
    torch.npu.synchronize()
    before = _tasks(stream)
    small.uniform_()
    assert _tasks(stream) == before
    large.uniform_()
    assert _tasks(stream) == before + 1
    torch.npu.synchronize()
    assert 0 <= small.min().item() and small.max().item() < 1


def test_a_small_random_op_behind_pending_work_is_a_task_in_stream_order():
    """Behind a pending task the small op is a task too, so it overwrites what the earlier fill wrote."""
    stream = torch.npu.current_stream()
    t = torch.zeros(16, device=NPU)
    torch.npu._sleep(10**7)  # the stream is busy for 10 ms
    before = _tasks(stream)
    t.fill_(5.0)
    t.uniform_()
    assert _tasks(stream) == before + 2
    torch.npu.synchronize()
    assert t.max().item() < 1


def test_transposed_normal_draws_the_stored_numbers():
    """A non-contiguous float normal_ (a dense temporary copied into it) has the digest it had at 6212a27."""
    torch.manual_seed(SEED)
    assert _digest(_transposed(torch.float32).normal_(1.5, 2.0).cpu()) == "a6b33c48617cc1a3"


@pytest.mark.parametrize("form", ["auto", "avx2", "avx512"])
def test_every_form_of_box_muller_equals_the_portable_form_on_every_input(form: str):
    """The vector forms' log1pf and cosf agree bit for bit with the scalar one on all 2^24 inputs of each."""
    counts = acl.box_muller_mismatches(form, "portable")
    if counts is None:
        pytest.skip(f"this machine has no {form} form")
    assert counts == (0, 0)


def _glibc_picks_its_fma_cosf() -> bool:
    """glibc >= 2.28 (ARM's cosf) on an x86-64 CPU with FMA, where its ifunc takes s_cosf-fma."""
    name, version = platform.libc_ver()
    if name != "glibc" or platform.machine() != "x86_64" or not version:
        return False
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    return tuple(int(part) for part in version.split(".")[:2]) >= (2, 28) and "fma" in flags


@pytest.mark.parametrize("form", ["auto", "portable"])
def test_box_muller_equals_glibc_on_every_input(form: str):
    """On every input, log1pf and cosf give what glibc's do where it takes its FMA cosf: the numbers
    normal_ drew while it called libm."""
    if not _glibc_picks_its_fma_cosf():
        pytest.skip("this machine's libm is not glibc >= 2.28 with its x86-64 FMA cosf")
    assert acl.box_muller_mismatches(form, "libm") == (0, 0)


def test_box_muller_rejects_unknown_forms_and_references():
    assert acl.box_muller_mismatches("avx1024", "portable") is None
    assert acl.box_muller_mismatches("portable", "musl") is None
