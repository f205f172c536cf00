"""SoC / CANN capability profiles (docs/SPEC.md section 4.3).

A profile says what the simulated SoC, runtime and operator kernel can do,
and which SoC it models (name, HBM size, core counts, as torch_npu reports
them through ``torch.npu.get_device_properties``);
the ``_foreach_copy_`` routing reads it on every call. Select a preset by name
and override single flags, through the API or the environment::

    NPUSIM_PROFILE=inference_soc NPUSIM_PROFILE_OVERRIDES="batch=1" python ...
    npusim.set_profile("old_cann", memcpy_batch_async=False)

It also carries the chip's peak rates, its server's links and what real kernels reach of those peaks
(Note [Chip figures], Note [Calibrated efficiencies]), which the timing model prices work with;
``NPUSIM_PROFILE_OVERRIDES="roofline=1"`` prices at the peaks, ``cube_eff_large=0.7`` sets one figure.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from npusim import config
from npusim.runtime import acl

_BASE_FAST_DTYPES = frozenset({
    torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8,
})
_CANN_810_DTYPES = frozenset({torch.int64, torch.float64, torch.bool})
MIB = 1 << 20
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the SoC, the CANN runtime and the op kernel support."""

    name: str
    nd_out: bool = True  # SoC supports the ND foreach kernel (fast path)
    batch: bool = True  # SoC supports batched memcpy
    memcpy_batch: bool = True  # runtime has the blocking batched memcpy
    memcpy_batch_async: bool = True  # runtime has the asynchronous batched memcpy
    cann_ge_810rc1: bool = True  # kernel supports int64, float64, bool
    foreach_copy_kernel: bool = True  # operator kernel present (else DO_COMPATIBILITY)
    sync_timeout_s: float = 300.0  # stream synchronize timeout before a blocking batch
    # The SoC the profile models, as torch_npu's get_device_properties reports it.
    soc_name: str = "Ascend910B2"
    total_memory: int = 64 * GIB  # HBM bytes: the default device capacity
    cube_core_num: int = 24
    vector_core_num: int = 48
    l2_cache_size: int = 192 * MIB
    # The CANN release the profile models (torch_npu.npu.utils.get_cann_version); 9.1.0 pairs with
    # the torch_npu releases of torch 2.12 onwards. old_cann models one before 8.1.RC1.
    cann_version: str = "9.1.0"
    # The chip's clock and rates: torch.npu._sleep(cycles) holds the stream for cycles / clock_mhz
    # microseconds; the timing model's compute cost reads the rest (Note [Chip figures]).
    clock_mhz: float = 1800.0  # AI Core clock
    cube_tflops: float = 353.9  # float16 / bfloat16 matmul on the cube units
    cube_fp32_tflops: float = 176.9
    vector_tflops: float = 22.1  # 16-bit elementwise on the vector units
    vector_fp32_tflops: float = 11.1
    hbm_gbps: float = 1843.2  # device memory bandwidth, GB/s
    # The server around the chip: its links, which price a collective (runtime/collective_cost.py),
    # and its host, which prices a launch (Note [Chip figures]). GB/s are 1e9 bytes a second, one
    # direction.
    ranks_per_node: int = 8  # NPUs in one server (an Atlas 800T A2)
    intra_node_mesh: bool = True  # the server's NPUs are a full mesh (HCCS), so HCCL runs Mesh in it
    intra_link_gbps: float = 28.0  # one HCCS link between two NPUs
    intra_node_gbps: float = 196.0  # all of one NPU's links to the others in its server
    intra_latency_us: float = 0.5  # one step over an intra-node link
    inter_node_gbps: float = 25.0  # one NPU's RoCE port to other servers (200 Gbit/s)
    inter_latency_us: float = 1.5  # one step over the RoCE network
    host_launch_us: float = 22.5  # host CPU time of one eager operator launch through torch_npu
    host_cpu_factor: float = 1.5  # the target host's CPU time over a typical x86 dev machine's
    # What real kernels reach of the peaks above, by kernel class (Note [Calibrated efficiencies]):
    # the timing model scales each peak by its class's fraction. roofline=True prices every class
    # at its peak (all efficiencies 1.0), the model before calibration.
    cube_eff_small: float = 0.24  # matmuls of arithmetic intensity below 256 FLOP per byte
    cube_eff_medium: float = 0.39  # 256 to 1024 FLOP per byte
    cube_eff_large: float = 0.64  # 1024 FLOP per byte and over
    attention_eff: float = 0.48  # flash attention forward and backward, of their dense FLOP count
    vector_eff: float = 0.70  # the vector units' rate
    hbm_eff: float = 0.57  # device memory bandwidth
    bus_eff: float = 0.70  # HCCS, RoCE and PCIe links, for collectives
    roofline: bool = False  # True: every efficiency above is 1.0

    def efficiency(self, kernel: str) -> float:
        """The fraction of its peak a kernel of class ``kernel`` reaches ("cube_small", "cube_medium",
        "cube_large", "attention", "vector", or "hbm" / "bus" for memory and links): the profile's
        figure, or 1.0 for a roofline profile."""
        if kernel not in _EFFICIENCY_FIELDS:
            raise ValueError(f"npusim profile: unknown kernel class {kernel!r}; expected one of "
                             f"{sorted(_EFFICIENCY_FIELDS)}")
        return 1.0 if self.roofline else getattr(self, _EFFICIENCY_FIELDS[kernel])

    @property
    def fast_dtypes(self) -> frozenset[torch.dtype]:
        return _BASE_FAST_DTYPES | _CANN_810_DTYPES if self.cann_ge_810rc1 else _BASE_FAST_DTYPES

    def __post_init__(self) -> None:
        for field in EFFICIENCIES:
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise ValueError(f"npusim profile {self.name!r}: {field}={value}; expected a fraction of the "
                                 "peak in (0, 1] (1 is the roofline)")

    def replace(self, **overrides: object) -> Profile:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"npusim profile: unknown flag(s) {sorted(unknown)}; "
                             f"expected some of {FLAGS}")
        return dataclasses.replace(self, **overrides)


# Note [Chip figures]
# ~~~~~~~~~~~~~~~~~~~~
# The timing model's compute cost (runtime/cost_model.py) needs each chip's peak rates. Public
# figures for the Ascend 910B disagree: FP16 256 TFLOPS (jishuzhan.net, which also gives FP32 128
# TFLOPS and 768 GB/s; 256 is the 2019 Ascend 910's launch figure, 32 cores), 280 TFLOPS
# (ai.gitee.com), 320 TFLOPS (boardor.com and borimooc.com, with "400 GB/s"), about 400 per die
# for the 910C, two 910B dies at 780-800 TFLOPS (dzcnc.com, besthub.dev); memory bandwidth 400
# GB/s, 768 GB/s, 1.2 TB/s (oryoy.com, for a 32 GB part). None names the 910B2 variant, whose
# core count the profile already carries (24 cube cores, 48 vector cores, from torch_npu's
# get_device_properties), and no page in reach gives its AI Core clock; the profile takes 1.8 GHz.
# So the rates are taken from the Da Vinci core's published structure at the profile's own core
# counts and clock, which places them inside the published range:
# - cube: 4096 float16 multiply-adds per AI Core per cycle (Huawei at Hot Chips 2019, reported
#   by elecfans.com and vengineer.hatenablog.com: "Cube: 4096 (16^3) FP16 MACs + 8192 INT8 MACs"):
#   24 cores x 8192 FLOP x 1.8 GHz = 353.9 TFLOPS float16 / bfloat16; int8 twice that; float32
#   half of it, the FP32:FP16 ratio of the one source that lists both (jishuzhan.net).
# - vector: a 2048-bit vector unit per vector core (same talk): 128 float16 lanes, a fused
#   multiply-add each, 48 x 256 FLOP x 1.8 GHz = 22.1 TFLOPS, 11.1 for float32.
# - memory: four HBM2E stacks (the package photos, lschixin.cn / vengineer) at the 3.6 Gbit/s
#   pin rate reported for them, 4 x 1024 bit x 3.6 Gbit/s = 1843.2 GB/s. The 400 and 768 GB/s
#   figures are below what four HBM2E stacks give at any speed grade, so they were not taken.
# The Ascend 310P3 (Atlas 300I Pro) is simpler: the Atlas 300I Duo, two 310P chips, is given as
# 280 TOPS INT8 and 408 GB/s over 96 GB LPDDR4X (avalanchenoticias.com.br, from Gamers Nexus and
# ComputerBase), so one chip is 140 TOPS INT8, 70 TFLOPS float16 (the cube's INT8:FP16 ratio of
# 2) and 204 GB/s. Its clock is what 8 AI Cores x 8192 FLOP need for 70 TFLOPS: 1068 MHz. Its
# vector units are the 8 AI Cores' own and the 7 vector cores': 15 x 256 FLOP x 1.068 GHz = 4.1
# TFLOPS (2.05 float32). Elementwise ops are bound by memory on both chips long before they are
# by the vector units, so the vector figures rarely decide a duration.
#
# The links and the host (the fields from ranks_per_node on) price collectives (Note [Collective
# cost model] in runtime/collective_cost.py) and launches. An Atlas 800T A2 holds 8 NPUs whose HCCS
# links form a full mesh: `npu-smi info -t topo` on such a server shows HCCS between every pair
# (meemx.com, an HCCL contest write-up on a single 8 x 910B server), and HCCL's own algorithm guide
# (hiascend.com hcclug "Mesh", also cann/hccl docs/zh/user_guide/coll_algo_intro/Mesh.md) says
# HCCL runs its Mesh algorithm inside such a server, every NPU using all its links at once.
# - HCCS: 56 GB/s per link, 392 GB/s per NPU, both directions together (meemx.com, from "民间资料",
#   i.e. unofficial); Huawei's own modelling tool gives the A2's full mesh 196 GB/s one way and 0.5
#   us latency (Ascend/msmodeling, tensor_cast/device.py, ATLAS_800.A2_INTERCONNECT, marked "TODO
#   double-confirm latency"). Both agree: 7 links x 28 GB/s one way = 196 GB/s, so a link is 28
#   GB/s, an NPU 196 GB/s, a step 0.5 us.
# - RoCE: one 200 Gbit/s port per NPU, 25 GB/s one way; msmodeling takes the same 25 GB/s and 1.5 us
#   a step for the A2's inter-server CLOS network.
# msmodeling also scales every link by a communication efficiency of 0.7 "to calibrate"; the
# profile keeps the peaks here and applies that efficiency apart (bus_eff, Note [Calibrated
# efficiencies]), as it does for compute.
# - host_launch_us: no page in reach publishes torch_npu's host time of one eager operator (the
#   Ascend guides on "Host Bound" runs and TASK_QUEUE_ENABLE describe the pipeline, with no
#   figure), so it is derived. PyTorch's eager path costs about 5-25 us of CPU per op before a kernel
#   runs on a CUDA host (jiahuanglin.xyz, "From PyTorch op to kernel launch": Python, binding,
#   autograd, dispatcher, backend, driver); torch_npu's path is the same up to its op adapter, then
#   queues the aclnn call (aclnnXxxGetWorkspaceSize, then aclnnXxx) to a second host thread
#   (TASK_QUEUE_ENABLE=1, the default), which hides part of it. The profile takes 15 us on an x86
#   host, the middle of that range, times the host's host_cpu_factor: 22.5 us on the A2's Kunpeng.
# - host_cpu_factor: an Atlas 800T A2's host CPUs are Kunpeng 920s (TaiShan V110 cores, a fixed 2.6
#   GHz: thefpsreview.com and elchapuzasinformatico.com on the desktop part). Its single-core speed
#   is not published; the next core, TaiShan V120 at 2.9 GHz, scores 1527 in Geekbench 6 single
#   core, level with a Zen 3 EPYC 7413 (1538; techpowerup.com, techradar.com), and current x86 dev
#   machines score about 1500-3000. A V110 at 2.6 GHz is below the V120, so Python-bound work runs
#   about 1.1-2.2 times as long as on a dev machine; the profile takes 1.5 (an assumption from
#   those figures, not a measurement). 1.0 means the target host is as fast as the one measured.
# The inference profile's 310P3 (Atlas 300I Pro) has no HCCS and no RoCE port of its own: the card
# is a PCIe endpoint of an x86 or ARM host (support.huawei.com, "Product Forms in Inference
# Scenario"), and the Atlas 300I Duo, two 310P chips, sits on PCIe 4.0 x16 (avalanchenoticias.com.br
# above), which the profile takes for the 300I Pro too. So its intra-node collectives are priced as
# HCCL's Ring over PCIe (intra_node_mesh off): 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s a
# card, one way, and 1.5 us a step (msmodeling's "PCIE/UPI interconnect RTT: 1.5us"; a ring step
# waits on its peer, a round trip). 8 cards a server is assumed, as in the A2. No source gives an
# inter-server path for these cards; a multi-server group is priced as one 25GE host port a card,
# 3.125 GB/s and 5 us a step (an assumption). Its host is taken to be x86: host_cpu_factor 1.0 and
# host_launch_us 15 us.

# Note [Calibrated efficiencies]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The peaks of Note [Chip figures] are what no kernel reaches: the timing model divides each by the
# fraction real kernels of its class reach (runtime/cost_model.py, Note [Compute cost model]; links in
# runtime/collective_cost.py). The fractions come from public figures for the Ascend 910B (A2):
# - hbm_eff 0.57, vector_eff 0.70, bus_eff 0.70: Huawei's own modelling tool (Ascend/msmodeling @
#   1e5a50b1a025a6658a277aa963c87691dc279f4f, tensor_cast/device.py, ATLAS_800.A2_376T_64G, the
#   353.9 TFLOPS part the profile models) gives memory_efficiency 0.6 of 1.6 TiB/s, i.e. 1055.5 GB/s
#   achieved, which is 0.573 of the profile's 1843.2 GB/s; compute_efficiency 0.7 over its cube and
#   vector ("gp") rates alike (its vector rate, 22 TFLOPS, is the profile's); comm_efficiency 0.7 on
#   the A2's HCCS mesh and its RoCE network. Its comment says the figures still need calibrating; no
#   measured HBM, vector or HCCL bus figure for the A2 was found in reach, so they are taken as given.
# - attention_eff 0.48: cann/pto-isa's README (gitcode.com/cann/pto-isa, "Flash Attention", the
#   "Ascend 910B2 (A2/A3) multi-core comparison" table, PR #885) measures torch_npu's flash attention
#   forward, one head of dimension 128, no mask, at 72.61 TFLOPS for sequence 4096 and 97.30 for 8192,
#   the training lengths of the runs below: 0.205 and 0.275 of 353.9, mean 0.240. A causal (training)
#   mask lets the kernel skip the masked half of the blocks, while the cost model counts the dense
#   FLOPs (PyTorch's formulas, npu_fusion_attention's the same), so per counted FLOP it reaches twice
#   that: 0.48. Backward is assumed as efficient as forward (no figure for it was found).
# - cube_eff_large 0.64 and cube_eff_medium 0.39: fitted to the end-to-end training throughput
#   ModelLink (now MindSpeed-LLM) published for one Atlas 900 A2 PODc node of 8 NPUs: the README_en.md
#   performance table and the model READMEs at Ascend/MindSpeed-LLM ba10f5fdeded126ed95c79fbfdfadebcb46b7f7c
#   (the parent of a27b45f0, which removed them), each run's configuration from its pretrain script at
#   that commit (npusim/tools/calibrate.py, RUNS). `python -m npusim calibrate` prices each run's step
#   with the cost models (Note [A Megatron step, priced] there). With the five figures above fixed, the
#   two cube figures minimise the squared log error of tokens/s per NPU over the six runs without tensor
#   parallelism (LLaMA-7B 3600, LLaMA-13B 1895, LLaMA2-7B 4241, Qwen1.5-0.5B 22834, 1.8B 13029, 4B
#   5033), searched in steps of 0.01: large 0.64, medium 0.39, an RMS error of 6.7 %. Their matmuls are
#   of hidden 1024 to 5120 and 2048 to 8192 tokens: large-class ones in the LLaMAs, medium-class ones
#   (hidden 1024) in Qwen1.5-0.5B, which alone pins the medium figure. The four runs with tensor
#   parallelism 4 or 8 are left out of the fit: three use MindSpeed's MC2, which overlaps TP's
#   all-gathers and reduce-scatters with the matmuls, and the step model runs them one after the other;
#   they come out 8 to 21 % slow (docs/PLAN.md, "Calibration", has every run beside its figure).
# - cube_eff_small 0.24: no run has a matmul below 256 FLOP per byte and no figure for one was found;
#   the figure assumes one class down loses the same share again (0.39 x 0.39 / 0.64).
# The inference profile's 310P3 takes the A2's figures (an assumption: no 310P figure was found).
# `roofline=1` in NPUSIM_PROFILE_OVERRIDES or --profile-overrides prices every class at its peak
# (the timing model before calibration); a user with measurements sets the fields one by one.

# Kernel class -> the Profile field holding its efficiency (Note [Calibrated efficiencies]).
_EFFICIENCY_FIELDS = {"cube_small": "cube_eff_small", "cube_medium": "cube_eff_medium",
                      "cube_large": "cube_eff_large", "attention": "attention_eff", "vector": "vector_eff",
                      "hbm": "hbm_eff", "bus": "bus_eff"}
EFFICIENCIES = tuple(_EFFICIENCY_FIELDS.values())

FLAGS = ("nd_out", "batch", "memcpy_batch", "memcpy_batch_async", "cann_ge_810rc1",
         "foreach_copy_kernel")

PRESETS: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("training_soc"),
        # An Atlas 300I Pro card: no ND foreach kernel, no batched memcpy.
        Profile("inference_soc", nd_out=False, batch=False, soc_name="Ascend310P3", total_memory=24 * GIB,
                cube_core_num=8, vector_core_num=7, l2_cache_size=96 * MIB, clock_mhz=1068.0, cube_tflops=70.0,
                cube_fp32_tflops=35.0, vector_tflops=4.1, vector_fp32_tflops=2.05, hbm_gbps=204.0,
                # PCIe 4.0 x16 cards in an x86 host, no HCCS mesh and no RoCE port of their own.
                intra_node_mesh=False, intra_link_gbps=31.5, intra_node_gbps=31.5, intra_latency_us=1.5,
                inter_node_gbps=3.125, inter_latency_us=5.0, host_launch_us=15.0, host_cpu_factor=1.0),
        Profile("old_cann", cann_ge_810rc1=False, cann_version="8.0.RC3"),
        Profile("no_memcpy_batch", memcpy_batch=False, memcpy_batch_async=False),
        Profile("no_foreach_kernel", foreach_copy_kernel=False),
    )
}
DEFAULT = "training_soc"


def parse_overrides(text: str, name: str = "NPUSIM_PROFILE_OVERRIDES") -> dict[str, object]:
    """Parses ``"nd_out=0,batch=true,cube_eff_large=0.6"`` (``NPUSIM_PROFILE_OVERRIDES``, or the
    command line's ``--profile-overrides``, whose errors then name ``name``)."""
    return config.parse_settings(text, name, _override_readers())


def read_overrides(text: str, name: str = "--profile-overrides") -> dict[str, object]:
    """The command line's ``--profile-overrides``: ``KEY=V,...`` as :func:`parse_overrides` reads it,
    or the path of a JSON (or, with PyYAML installed, YAML) file holding one mapping of the same keys.
    A file's values are read as their text would be, so the two forms accept the same settings."""
    path = text.strip()
    if "=" in path or not path.endswith((".json", ".yaml", ".yml")):
        return parse_overrides(text, name)
    if not os.path.isfile(path):
        raise config.ConfigError(f"{name}: no such file {path!r}; expected KEY=V,... or a .json / .yaml file")
    with open(path, encoding="utf-8") as file:
        if path.endswith(".json"):
            mapping = json.load(file)
        else:
            try:
                import yaml
            except ImportError:
                raise config.ConfigError(f"{name}: reading {path!r} needs PyYAML; give a .json file or "
                                         "KEY=V,...") from None
            mapping = yaml.safe_load(file)
    if not isinstance(mapping, dict):
        raise config.ConfigError(f"{name}: {path!r} holds a {type(mapping).__name__}; expected one mapping "
                                 "of setting to value")
    # JSON's true / false read as the text a boolean reader takes.
    text = ",".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                    for key, value in mapping.items())
    return parse_overrides(text, f"{name} {path}")


# The server's figures NPUSIM_PROFILE_OVERRIDES may set, besides the flags (Note [Chip figures]).
LINK_FIGURES = ("intra_link_gbps", "intra_node_gbps", "intra_latency_us", "inter_node_gbps",
                "inter_latency_us", "host_launch_us", "host_cpu_factor")
# The chip's peaks, for a user with another part's figures (Note [Chip figures]).
CHIP_FIGURES = ("cube_tflops", "cube_fp32_tflops", "vector_tflops", "vector_fp32_tflops", "hbm_gbps")


def _positive(text: str, name: str) -> float:
    value = config.parse_float(text, name)
    if not value > 0:
        raise config.fail(name, "a number > 0", text)
    return value


def _efficiency(text: str, name: str) -> float:
    value = config.parse_float(text, name)
    if not 0 < value <= 1:
        raise config.fail(name, "a fraction of the peak in (0, 1] (1 is the roofline)", text)
    return value


def _override_readers() -> dict[str, object]:
    readers = {flag: config.parse_bool for flag in FLAGS}
    readers["sync_timeout_s"] = config.parse_float
    readers.update({figure: lambda text, name: config.parse_float(text, name, low=0.0) for figure in LINK_FIGURES})
    readers["ranks_per_node"] = lambda text, name: config.parse_int(text, name, low=1)
    readers["intra_node_mesh"] = config.parse_bool
    readers.update(dict.fromkeys(CHIP_FIGURES, _positive))
    readers.update(dict.fromkeys(EFFICIENCIES, _efficiency))
    readers["roofline"] = config.parse_bool
    return readers


def make_profile(name: str | Profile = DEFAULT, **overrides: object) -> Profile:
    if isinstance(name, Profile):
        base = name
    else:
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(f"npusim profile: unknown preset {name!r}; expected one of {sorted(PRESETS)}") from None
    return base.replace(**overrides) if overrides else base


def _from_env() -> Profile:
    return make_profile(config.profile_name(), **config.profile_overrides(_override_readers()))


def _activate(profile: Profile) -> Profile:
    """Makes ``profile`` current; the only place ``_current`` changes. The ``_foreach_copy_``
    kernel routes by the profile's flags, which it is handed here and which nothing in Python
    routes by (See Note [The _foreach_copy_ router] in csrc/aten/foreach_copy.cpp)."""
    global _current
    acl.set_foreach_copy_config(profile.foreach_copy_kernel, profile.nd_out, profile.batch, profile.memcpy_batch,
                                profile.memcpy_batch_async, sorted(profile.fast_dtypes, key=str),
                                profile.sync_timeout_s)
    # The chip clock's host figures are the profile's (Note [Chip clock]); the timing model's
    # own settings (on, realtime, the host mode) stay.
    acl.invalidate_compute_costs()  # a compute task's cost is the profile's chip's
    on, realtime, _, cpu_factor = acl.chip_clock()
    acl.set_chip_clock(on, realtime, profile.host_launch_us, profile.host_cpu_factor if cpu_factor > 0 else 0.0)
    _current = profile
    return profile


_current: Profile = _activate(_from_env())


def get_profile() -> Profile:
    return _current


def set_profile(name: str | Profile = DEFAULT, **overrides: object) -> Profile:
    """Selects a preset (or a Profile) with per-flag overrides; returns it."""
    return _activate(make_profile(name, **overrides))


@contextmanager
def use_profile(name: str | Profile = DEFAULT, **overrides: object) -> Iterator[Profile]:
    """Temporarily selects a profile."""
    previous = _current
    try:
        yield set_profile(name, **overrides)
    finally:
        _activate(previous)
