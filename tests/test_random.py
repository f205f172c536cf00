"""The npu generator: a Philox (seed, offset) state with CUDA's contract, and every random op
on npu drawing from it (never from the CPU default generator), reproducibly.

See Note [npu Philox stream] in ``src/npusim/csrc/aten/generator.h`` for the stream, the offset
unit and its rounding.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import npusim

NPU = "npu"


def _offset() -> int:
    return int(torch.npu.get_rng_state()[8:].view(torch.int64).item())


def _seed_of(state: torch.Tensor) -> int:
    return int(state[:8].view(torch.uint64).item())


def _with_offset(seed: int, offset: int) -> torch.Tensor:
    """A 16-byte state (seed, offset), laid out as CUDA's and DTensor's _PhiloxState read it."""
    return torch.cat([torch.tensor([seed], dtype=torch.uint64).view(torch.uint8),
                      torch.tensor([offset], dtype=torch.int64).view(torch.uint8)])


# ---- the generator's state --------------------------------------------------------------

def test_state_is_seed_and_offset_advanced_by_numel_rounded_to_4():
    """get_rng_state is 16 bytes (seed, offset); an op on n elements advances the offset by n rounded up to 4."""
    torch.npu.manual_seed(1234)
    state = torch.npu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.shape == (16,)
    assert _seed_of(state) == 1234 and _offset() == 0
    torch.rand(10, device=NPU)
    assert _offset() == 12
    torch.empty(3, 4, device=NPU).normal_()
    assert _offset() == 24
    torch.empty(0, device=NPU).uniform_()  # empty: nothing drawn, as CUDA
    assert _offset() == 24
    assert torch.npu.initial_seed() == 1234


def test_set_rng_state_round_trips_and_rejects_bad_states():
    """A saved state replays the same numbers; wrong sizes and unaligned offsets are clear errors."""
    torch.npu.manual_seed(7)
    torch.rand(5, device=NPU)
    saved = torch.npu.get_rng_state()
    first = torch.randn(33, device=NPU).cpu()
    torch.npu.set_rng_state(saved)
    assert torch.equal(torch.randn(33, device=NPU).cpu(), first)
    with pytest.raises(RuntimeError, match=r"16-byte state .* got 5056 bytes"):
        torch.npu.set_rng_state(torch.get_rng_state())  # a CPU Mersenne-Twister state
    with pytest.raises(RuntimeError, match="multiple of 4, but got 6"):
        torch.npu.set_rng_state(_with_offset(7, 6))
    with pytest.raises(TypeError, match="torch.ByteTensor"):
        torch.npu.set_rng_state(torch.zeros(16, dtype=torch.int64))


def test_torch_generator_npu_is_a_philox_generator_per_device():
    """torch.Generator("npu:i") is an npu generator; drawing from it leaves the default one alone."""
    gen = torch.Generator(NPU)
    # A new generator starts from PyTorch's default seed, as a new CUDA generator does.
    assert gen.device == torch.device(NPU, 0) and gen.initial_seed() == 67280421310721
    assert torch.Generator("npu:1").device == torch.device(NPU, 1)
    torch.npu.manual_seed(3)
    before = torch.npu.get_rng_state()
    a = torch.rand(6, device=NPU, generator=gen.manual_seed(11)).cpu()
    b = torch.rand(6, device=NPU, generator=gen.manual_seed(11)).cpu()
    assert torch.equal(a, b) and gen.get_state().shape == (16,)
    assert torch.equal(torch.npu.get_rng_state(), before)
    torch.npu.manual_seed(11)
    assert torch.equal(torch.rand(6, device=NPU).cpu(), a)  # same (seed, offset), same numbers


def test_generator_of_the_wrong_device_type_is_cudas_error():
    """A CPU generator with npu tensors, or an npu generator with CPU tensors, raises CUDA's message."""
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator but found 'cpu'"):
        torch.rand(3, device=NPU, generator=torch.Generator())
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator but found 'cpu'"):
        torch.randperm(5, device=NPU, generator=torch.Generator())  # the CPU fallback's route
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'npu'"):
        torch.rand(3, generator=torch.Generator(NPU))
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'npu'"):
        torch.randperm(5, generator=torch.Generator(NPU))


def test_seed_all_gives_every_device_one_seed_and_seed_changes_the_current_one():
    """seed_all: one non-deterministic seed on every device (as torch.cuda); seed() only the current device."""
    torch.npu.seed_all()
    seeds = {g.initial_seed() for g in torch.npu.default_generators}
    assert len(torch.npu.default_generators) == torch.npu.device_count() >= 2 and len(seeds) == 1
    torch.npu.manual_seed_all(5)
    torch.npu.set_device(1)
    torch.npu.seed()
    assert torch.npu.initial_seed() != 5 and torch.npu.default_generators[0].initial_seed() == 5
    torch.manual_seed(9)  # torch's global seed reaches every npu device too
    assert [g.initial_seed() for g in torch.npu.default_generators] == [9] * torch.npu.device_count()


def test_fork_rng_restores_the_npu_state():
    """torch.random.fork_rng(device_type="npu") restores the (seed, offset) state on exit."""
    torch.npu.manual_seed(21)
    before = torch.npu.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type=NPU):
        torch.npu.manual_seed(99)
        torch.rand(100, device=NPU)
    assert torch.equal(torch.npu.get_rng_state(), before)


# ---- element i at offset o depends only on (seed, o + i) ---------------------------------

FILLS: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("uniform_", lambda t: t.uniform_(-2, 3)),
    ("normal_", lambda t: t.normal_(1, 2)),
    ("bernoulli_", lambda t: t.bernoulli_(0.3)),
    ("exponential_", lambda t: t.exponential_(2.0)),
    ("random_", lambda t: t.random_(0, 1000)),
]


@pytest.mark.parametrize(("name", "fill"), FILLS, ids=[n for n, _ in FILLS])
def test_whole_equals_chunks_at_matching_offsets(name: str, fill: Callable[[torch.Tensor], torch.Tensor]):
    """A tensor generated whole equals it generated in chunks, each at offset start + chunk start."""
    torch.npu.manual_seed(5)
    start = _offset()
    whole = fill(torch.empty(1000, device=NPU)).cpu()
    chunks = torch.empty(1000, device=NPU)
    for begin in range(0, 1000, 200):
        torch.npu.set_rng_state(_with_offset(5, start + begin))
        fill(chunks[begin:begin + 200])
    assert torch.equal(chunks.cpu(), whole)
    # Element order is the logical (row-major) one, whatever the strides.
    torch.npu.manual_seed(5)
    transposed = fill(torch.empty(40, 25, device=NPU).t()).cpu()
    torch.npu.manual_seed(5)
    assert torch.equal(transposed.reshape(-1), fill(torch.empty(25, 40, device=NPU)).cpu().reshape(-1))


# ---- distributions ----------------------------------------------------------------------

def test_distributions_have_the_right_support_and_moments():
    """Samples of 20000 elements: ranges, means and deviations as the distributions require."""
    torch.npu.manual_seed(0)
    n = 20000

    def draw(fill: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return fill(torch.empty(n, device=NPU, dtype=dtype)).cpu().double()

    u = draw(lambda t: t.uniform_(-1, 3))
    assert u.min() >= -1 and u.max() < 3 and abs(u.mean() - 1) < 0.05
    h = draw(lambda t: t.uniform_(0, 1), torch.float16)
    assert h.max() < 1 and h.min() >= 0
    z = draw(lambda t: t.normal_(2, 3), torch.float64)
    assert abs(z.mean() - 2) < 0.1 and abs(z.std() - 3) < 0.1
    b = draw(lambda t: t.bernoulli_(0.25), torch.bool)
    assert set(b.unique().tolist()) == {0.0, 1.0} and abs(b.mean() - 0.25) < 0.02
    e = draw(lambda t: t.exponential_(4.0))
    assert e.min() > 0 and abs(e.mean() - 0.25) < 0.02
    g = draw(lambda t: t.geometric_(0.5), torch.int64)
    assert g.min() >= 1 and abs(g.mean() - 2) < 0.1
    ln = draw(lambda t: t.log_normal_(0, 0.5))
    assert ln.min() > 0 and abs(ln.log().mean()) < 0.05
    c = draw(lambda t: t.cauchy_(1, 2))
    assert abs(c.median() - 1) < 0.1
    r = draw(lambda t: t.random_(3, 9), torch.int32)
    assert set(r.unique().tolist()) == set(range(3, 9))
    r8 = draw(lambda t: t.random_(), torch.uint8)
    assert r8.min() == 0 and r8.max() == 255
    p = torch.linspace(0, 1, n, device=NPU)
    bt = torch.bernoulli(p).cpu()
    assert bt[0] == 0 and bt[-1] == 1 and abs(bt.mean() - 0.5) < 0.02


def test_argument_errors_match_cpu_and_cuda():
    """Bad arguments get PyTorch's own messages (from its DistributionTemplates checks)."""
    t = torch.empty(4, device=NPU)
    with pytest.raises(RuntimeError, match="uniform_ expects to return a \\[from, to\\) range"):
        t.uniform_(2, 1)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        t.normal_(0, -1)
    with pytest.raises(RuntimeError, match="bernoulli_ expects p to be in \\[0, 1\\]"):
        t.bernoulli_(1.5)
    with pytest.raises(RuntimeError, match="expected every element of p in \\[0, 1\\], but got p=2"):
        t.bernoulli_(torch.tensor([0.5, 2.0, 0.1, 0.1], device=NPU))
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
        t.random_(5, 2)
    with pytest.raises(RuntimeError, match="dtype must be a floating point"):
        torch.empty(4, device=NPU, dtype=torch.int64).exponential_()
    with pytest.raises(NotImplementedError, match="normal_kernel_npu"):
        torch.empty(4, device=NPU, dtype=torch.int64).normal_()
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.empty(1, device=NPU).expand(4).uniform_()


def test_native_dropout_mask_is_bool_like_cuda():
    """native_dropout on npu returns CUDA's bool mask and input * mask / (1 - p); eval and p=1 shortcuts."""
    torch.npu.manual_seed(2)
    x = torch.full((4000,), 3.0, device=NPU)
    out, mask = torch.native_dropout(x, 0.25, True)
    assert mask.dtype == torch.bool and _offset() == 4000
    assert torch.equal(out.cpu(), mask.cpu().float() * 4.0)
    assert abs(mask.cpu().float().mean() - 0.75) < 0.03
    out, mask = torch.native_dropout(x, 0.25, False)
    assert torch.equal(out.cpu(), x.cpu()) and mask.cpu().all()
    out, mask = torch.native_dropout(x, 1.0, True)
    assert not out.cpu().any() and not mask.cpu().any()


def test_random_ops_run_after_the_streams_earlier_work():
    """A random op reads and writes device memory only after the current stream's queued copies."""
    mib = 1 << 20
    probs = torch.zeros(mib, device=NPU)
    ones = torch.ones(mib, device=NPU)
    target = torch.zeros(mib, device=NPU)
    sevens = torch.full((mib,), 7.0, device=NPU)
    torch.npu.synchronize()
    with npusim.timing.model(copy_gbps=0.05, realtime=True):  # a 4 MiB copy takes about 84 ms of stream time
        probs.copy_(ones)
        drawn = torch.bernoulli(probs)  # must read p = 1 everywhere
        target.copy_(sevens)
        target.uniform_()  # must overwrite the copy, not be overwritten by it
        torch.npu.synchronize()
    assert drawn.cpu().all()
    assert target.cpu().lt(1).all()


# ---- every random op reaches the npu generator, never the CPU default one ---------------

def _outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach().cpu()]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _outputs(v)]
    return []


def _check_draws_from_npu(what: str, call: Callable[[], Any], must_draw: bool = True) -> None:
    """Runs ``call`` twice under one npu seed: equal outputs, the CPU default generator untouched,
    and (for a random op) the npu generator advanced."""
    cpu_state = torch.get_rng_state()
    runs = []
    for _ in range(2):
        torch.npu.manual_seed(17)
        runs.append(_outputs(call()))
        advanced = _offset() != 0
    assert torch.equal(torch.get_rng_state(), cpu_state), f"{what}: reached the CPU default generator"
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b) or torch.allclose(a, b, equal_nan=True), f"{what}: not reproducible under manual_seed"
    if must_draw:
        assert advanced, f"{what}: did not draw from the npu generator"


# OpInfo entries that the name pattern finds but that draw no random numbers.
NOT_RANDOM = {
    "__rand__": "bitwise and (reversed), not random",
    "native_dropout_backward": "applies a given mask",
    "nn.functional.feature_alpha_dropout.without_train": "training=False: identity",
    "signal.windows.exponential": "a deterministic window",
}
_RANDOM_NAME = re.compile(r"(^|[._])(rand\w*|\w*dropout\w*|bernoulli|normal|uniform|multinomial|poisson|exponential"
                          r"|geometric|cauchy|log_normal|rrelu|fractional_max_pool\dd|\w*gamma|dirichlet|binomial)$")


def _seeded_aten_names() -> set[str]:
    """Base names of the aten ops tagged nondeterministic_seeded."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        base, _, overload = qualified[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None and torch.Tag.nondeterministic_seeded in op.tags:
            names.add(base)
    return names


def _random_opinfos() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    seeded = _seeded_aten_names()
    special = {"lgamma", "digamma", "polygamma", "mvlgamma", "igamma", "igammac"}  # gamma functions, not samplers
    return [op for op in op_db
            if (op.aten_name in seeded
                or any(_RANDOM_NAME.search(n) for n in [op.name, *(a.name for a in op.aliases)]))
            and op.name not in special and not op.name.startswith("special.")]


@pytest.mark.filterwarnings("ignore:dropout2d. Received a 3D input:UserWarning")  # OpInfo's own sample
def test_every_random_opinfo_op_draws_from_the_npu_generator(monkeypatch: pytest.MonkeyPatch):
    """Every random op of OpInfo, on npu: reproducible under torch.npu.manual_seed, advances the npu
    generator, and leaves the CPU default generator untouched."""
    from torch.testing._internal import common_methods_invocations

    # OpInfo runs random ops inside wrapper_set_seed, which reseeds and then
    # restores both the CPU and the accelerator state: that would hide a use
    # of the CPU default generator. Run the op itself.
    monkeypatch.setattr(common_methods_invocations, "wrapper_set_seed", lambda op, *a, **k: op(*a, **k))
    ops = _random_opinfos()
    names = {f"{op.name}.{op.variant_test_name}".rstrip(".") for op in ops}
    assert {"uniform", "bernoulli", "nn.functional.dropout", "nn.functional.rrelu", "multinomial",
            "randint_like", "nn.functional.fractional_max_pool2d"} <= names, sorted(names)
    for op in ops:
        name = f"{op.name}.{op.variant_test_name}".rstrip(".")
        dtypes = op.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in dtypes else sorted(dtypes, key=str)[0]
        samples = list(op.sample_inputs(NPU, dtype))[:4]
        assert samples, f"{name}: no sample inputs"
        drew = 0
        for i, sample in enumerate(samples):
            cpu_state = torch.get_rng_state()
            runs = []
            for _ in range(2):
                torch.npu.manual_seed(17)
                runs.append(_outputs(op(sample.input, *sample.args, **sample.kwargs)))
                drew += _offset() != 0
            assert torch.equal(torch.get_rng_state(), cpu_state), \
                f"{name} sample {i}: reached the CPU default generator"
            for a, b in zip(*runs, strict=True):
                assert torch.equal(a, b) or torch.allclose(a, b, equal_nan=True), f"{name} sample {i}: not reproducible"
        assert drew or name in NOT_RANDOM, f"{name}: no sample drew from the npu generator"


# Random ops that OpInfo has no entry for (or whose samples do not train): each one's route.
DIRECT: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("randperm", lambda x: torch.randperm(50, device=NPU)),
    ("poisson", lambda x: torch.poisson(x.abs())),
    ("binomial", lambda x: torch.binomial(x.abs().mul(5).round(), x.sigmoid())),
    ("_standard_gamma", lambda x: torch._standard_gamma(x.abs() + 0.5)),
    ("_sample_dirichlet", lambda x: torch._sample_dirichlet(x.abs() + 0.5)),
    ("dirichlet.rsample", lambda x: torch.distributions.Dirichlet(x.abs() + 0.5).rsample()),
    ("rrelu_with_noise", lambda x: F.rrelu(x, training=True)),
    ("native_dropout", lambda x: torch.native_dropout(x, 0.3, True)),
    ("dropout.train", lambda x: F.dropout(x, 0.3, training=True)),
    ("feature_dropout", lambda x: F.dropout2d(x[None, None], 0.3, training=True)),
    ("sdpa.dropout", lambda x: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None],
                                                               dropout_p=0.5)),
    ("gumbel_softmax", lambda x: F.gumbel_softmax(x)),
    ("bernoulli_.Tensor", lambda x: torch.empty_like(x).bernoulli_(x.sigmoid())),
    ("bernoulli.p", lambda x: torch.bernoulli(x, 0.4)),
    ("normal.Tensor_Tensor", lambda x: torch.normal(x, x.abs())),
    ("normal.float_Tensor_out", lambda x: torch.normal(0.5, x.abs(), out=torch.empty_like(x))),
    ("random_.from_full", lambda x: torch.empty(8, device=NPU, dtype=torch.int64).random_(-2 ** 63, None)),
    ("randn.complex", lambda x: torch.randn(6, device=NPU, dtype=torch.complex64)),
    ("rand.bfloat16", lambda x: torch.rand(6, device=NPU, dtype=torch.bfloat16)),
    ("multinomial.replacement", lambda x: torch.multinomial(x.abs() + 0.1, 20, replacement=True)),
    ("nn.init.trunc_normal_", lambda x: torch.nn.init.trunc_normal_(torch.empty(8, 8, device=NPU))),
    ("nn.init.orthogonal_", lambda x: torch.nn.init.orthogonal_(torch.empty(8, 8, device=NPU))),
]


@pytest.mark.parametrize(("name", "call"), DIRECT, ids=[n for n, _ in DIRECT])
def test_random_op_draws_from_the_npu_generator(name: str, call: Callable[[torch.Tensor], Any]):
    """Each random op outside OpInfo's samples: reproducible, npu generator advanced, CPU default untouched."""
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)).to(NPU)
    _check_draws_from_npu(name, lambda: call(x))


def test_every_seeded_cpu_kernel_reached_from_npu_gets_an_npu_generator():
    """Audit: each aten op tagged nondeterministic_seeded whose CPU kernel the fallback would run takes
    a Generator argument (the fallback passes one seeded from the npu generator) or has an npu kernel."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    # CPU kernels that take a dropout_p but draw nothing: CPU's flash attention rejects dropout
    # (the math path's dropout, an npu kernel, runs instead) and the choice op only picks a backend.
    draws_nothing = {"aten::_fused_sdp_choice", "aten::_scaled_dot_product_flash_attention_for_cpu"}
    unrouted = []
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::") or qualified in draws_nothing:
            continue
        base, _, overload = qualified[len("aten::"):].partition(".")
        op = getattr(getattr(torch.ops.aten, base, None), overload or "default", None)
        if op is None or torch.Tag.nondeterministic_seeded not in op.tags:
            continue
        takes_generator = any("Generator" in str(a.type) for a in op._schema.arguments)
        if has_kernel(qualified, "CPU") and not has_kernel(qualified, "PrivateUse1") and not takes_generator:
            unrouted.append(qualified)
    assert not unrouted, f"random CPU kernels that would draw from the CPU default generator on npu: {unrouted}"


def test_flash_attention_for_cpu_rejects_dropout(device_failure):  # noqa: ANN001
    """The audit's exemption holds: CPU's flash attention kernel refuses dropout, so it draws nothing. (A stream
    task's refusal fails the device: under NPUSIM_SMALL_OPS_ON_THE_HOST=0 this small call is one.)"""
    q = torch.randn(1, 1, 4, 8, device=NPU)
    cpu_state = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="(?i)dropout"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, dropout_p=0.5)
        torch.npu.synchronize()  # a stream task: its error surfaces at the next synchronize, as on CUDA
    assert torch.equal(torch.get_rng_state(), cpu_state)
