"""The collective cost model: HCCL's algorithms on the profile's links, and the link and host figures."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from npusim.config import ConfigError
from npusim.runtime.collective_cost import KNOWN_OPS, collective_cost, collective_us
from npusim.runtime.profiles import LINK_FIGURES, PRESETS, Profile, make_profile, parse_overrides

# The Note's worked examples are the links' peaks: the roofline profile (Note [Calibrated efficiencies]).
TRAINING = PRESETS["training_soc"].replace(roofline=True)
MIB = 1 << 20
_NEW_FIELDS = ("ranks_per_node", "intra_node_mesh", *LINK_FIGURES)


def test_worked_example_two_nodes_of_four():
    """The Note's all_reduce of 64 MiB over 8 ranks on 2 nodes of 4: 1873.461 us, phase by phase."""
    cost = collective_cost("all_reduce", 64 * MIB, range(8), ranks_per_node=4, profile=TRAINING)
    assert cost.algorithm == "hierarchical"
    assert [(p.name, p.link, p.steps, p.bytes) for p in cost.phases] == [
        ("reduce_scatter", "intra", 1, 16 * MIB), ("all_reduce", "inter", 2, 8 * MIB),
        ("all_gather", "intra", 1, 16 * MIB)]
    assert [p.us for p in cost.phases] == pytest.approx([599.686286, 674.088640, 599.686286], abs=1e-6)
    assert collective_us("all_reduce", 64 * MIB, range(8), ranks_per_node=4, profile=TRAINING) == pytest.approx(
        1873.461, abs=1e-3)


def test_worked_example_one_node():
    """The Note's all_reduce of 64 MiB over 8 ranks in one node: Mesh, 600.186 us; a Ring 4201.304 us."""
    cost = collective_cost("all_reduce", 64 * MIB, range(8), ranks_per_node=8, profile=TRAINING)
    assert cost.algorithm == "intra_mesh"
    assert [(p.name, p.steps, p.bytes) for p in cost.phases] == [("reduce_scatter", 1, 8 * MIB),
                                                                 ("all_gather", 1, 8 * MIB)]
    assert cost.us == pytest.approx(600.186, abs=1e-3)
    no_mesh = TRAINING.replace(intra_node_mesh=False)
    ring = collective_cost("all_reduce", 64 * MIB, range(8), ranks_per_node=8, profile=no_mesh)
    assert (ring.algorithm, [p.steps for p in ring.phases]) == ("intra_ring", [7, 7])
    assert ring.us == pytest.approx(4201.304, abs=1e-3)


def test_layout_chooses_the_algorithm():
    """One node: Mesh (Ring on PCIe cards); one rank a node: a RoCE ring; several of several: hierarchical."""
    def algorithm(ranks, profile=TRAINING):
        return collective_cost("all_reduce", MIB, ranks, ranks_per_node=8, profile=profile).algorithm

    assert algorithm([0, 3, 5]) == "intra_mesh"
    assert algorithm([0, 3, 5], PRESETS["inference_soc"]) == "intra_ring"
    assert algorithm([0, 8, 16, 24]) == "inter_ring"
    assert algorithm([0, 1, 8, 9]) == "hierarchical"
    inter = collective_cost("all_reduce", 64 * MIB, [0, 8, 16, 24], ranks_per_node=8, profile=TRAINING)
    # Ring over RoCE: 2 x 3 steps of 16 MiB at 25 GB/s, 1.5 us each.
    assert [(p.link, p.steps, p.bytes) for p in inter.phases] == [("inter", 3, 16 * MIB), ("inter", 3, 16 * MIB)]
    assert inter.us == pytest.approx(6 * (1.5 + 16 * MIB / 25e3))


def test_two_level_forms_of_all_gather_reduce_scatter_and_all_to_all():
    """all_gather: RoCE then HCCS; reduce_scatter: HCCS then RoCE; all_to_all: local peers, then a node's block."""
    def phases(op):
        cost = collective_cost(op, 64 * MIB, range(16), ranks_per_node=8, profile=TRAINING)
        assert cost.algorithm == "hierarchical"
        return [(p.name, p.link, p.steps, p.bytes) for p in cost.phases]

    assert phases("all_gather_into_tensor") == [("all_gather", "inter", 1, 4 * MIB),
                                                ("all_gather", "intra", 1, 8 * MIB)]
    assert phases("reduce_scatter_tensor") == [("reduce_scatter", "intra", 1, 8 * MIB),
                                               ("reduce_scatter", "inter", 1, 4 * MIB)]
    assert phases("all_to_all_single") == [("all_to_all", "intra", 1, 4 * MIB), ("all_to_all", "inter", 1, 32 * MIB)]
    # gather: nbytes is one rank's piece; the root's RoCE port takes the other node's 8 pieces.
    assert phases("gather") == [("gather", "intra", 1, 64 * MIB), ("gather", "inter", 1, 512 * MIB)]


def test_aliases_price_as_their_collective():
    """The coalesced and tensor forms cost what their collective does."""
    def us(op):
        return collective_us(op, 8 * MIB, range(16), ranks_per_node=8, profile=TRAINING)

    assert us("all_reduce_coalesced") == us("all_reduce")
    assert us("all_gather") == us("all_gather_into_tensor") == us("all_gather_into_tensor_coalesced")
    assert us("all_gather_coalesced") == us("all_gather")
    assert us("reduce_scatter") == us("reduce_scatter_tensor") == us("reduce_scatter_tensor_coalesced")
    assert us("all_to_all") == us("all_to_all_single")
    assert us("send") == us("recv")


@pytest.mark.parametrize("op", [op for op in KNOWN_OPS if op != "barrier"])
@pytest.mark.parametrize("ranks", [range(8), range(16), [0, 8, 16], [0, 1, 8, 9, 10]])
def test_monotonic_in_bytes(op, ranks):
    """More bytes never cost less, and a non-empty buffer costs more than an empty one."""
    sizes = [0, 1, 4096, MIB, 64 * MIB, 1 << 30]
    costs = [collective_us(op, n, ranks, ranks_per_node=8, profile=TRAINING) for n in sizes]
    assert costs == sorted(costs)
    assert costs[-1] > costs[0] > 0


@pytest.mark.parametrize("op", KNOWN_OPS)
def test_group_of_one_costs_nothing(op):
    """A group of one rank: no phases, 0 us."""
    cost = collective_cost(op, 64 * MIB, [5], ranks_per_node=8, profile=TRAINING)
    assert (cost.algorithm, cost.phases, cost.us) == ("none", (), 0)


def test_barrier_is_latency_only():
    """barrier: 2 ceil(log2 p) steps of the slowest link's latency, whatever nbytes says."""
    one_node = collective_cost("barrier", 64 * MIB, range(8), ranks_per_node=8, profile=TRAINING)
    assert [(p.link, p.steps, p.bytes) for p in one_node.phases] == [("intra", 6, 0)]
    assert one_node.us == pytest.approx(6 * TRAINING.intra_latency_us)
    spread = collective_us("barrier", 0, range(24), ranks_per_node=8, profile=TRAINING)
    assert spread == pytest.approx(2 * math.ceil(math.log2(24)) * TRAINING.inter_latency_us)


def test_p2p_crosses_the_link_between_the_two_nodes():
    """send/recv: one step of the message over HCCS within a node, over RoCE across nodes."""
    within = collective_cost("send", 28_000, [0, 7], ranks_per_node=8, profile=TRAINING)
    assert [(p.link, p.steps) for p in within.phases] == [("intra", 1)]
    assert within.us == pytest.approx(0.5 + 1.0)  # 28000 bytes at 28 GB/s
    across = collective_us("recv", 25_000, [7, 8], ranks_per_node=8, profile=TRAINING)
    assert across == pytest.approx(1.5 + 1.0)  # 25000 bytes at 25 GB/s


def test_unknown_op_names_it_and_the_known_ones():
    """An op the model does not know raises ValueError naming it and listing the known ones."""
    with pytest.raises(ValueError, match=re.escape("unknown op 'allreduce'; expected one of all_reduce, ")) as info:
        collective_us("allreduce", MIB, range(2), ranks_per_node=8, profile=TRAINING)
    assert all(op in str(info.value) for op in KNOWN_OPS)


def test_bad_arguments_are_refused():
    """Negative sizes, an empty group, ranks_per_node < 1 and a zero bandwidth raise ValueError."""
    with pytest.raises(ValueError, match="expected nbytes >= 0"):
        collective_us("all_reduce", -1, range(2), ranks_per_node=8, profile=TRAINING)
    with pytest.raises(ValueError, match="empty group"):
        collective_us("all_reduce", 1, [], ranks_per_node=8, profile=TRAINING)
    with pytest.raises(ValueError, match="ranks_per_node=0"):
        collective_us("all_reduce", 1, range(2), ranks_per_node=0, profile=TRAINING)
    with pytest.raises(ValueError, match="inter_node_gbps=0"):
        collective_us("all_reduce", 1, range(2), ranks_per_node=8, profile=TRAINING.replace(inter_node_gbps=0.0))


def test_profile_overrides_change_the_figures():
    """Link figures set through make_profile or NPUSIM_PROFILE_OVERRIDES' syntax change the cost."""
    overrides = parse_overrides("inter_node_gbps=50,inter_latency_us=3,ranks_per_node=4,intra_node_mesh=0,"
                                "host_launch_us=10,host_cpu_factor=2")
    assert overrides == {"inter_node_gbps": 50.0, "inter_latency_us": 3.0, "ranks_per_node": 4,
                         "intra_node_mesh": False, "host_launch_us": 10.0, "host_cpu_factor": 2.0}
    faster = make_profile(TRAINING, **overrides)
    ranks = [0, 8]  # one rank a node: only the RoCE figures count
    base = collective_us("all_gather", 64 * MIB, ranks, ranks_per_node=8, profile=TRAINING)
    assert base == pytest.approx(1.5 + 32 * MIB / 25e3)
    assert collective_us("all_gather", 64 * MIB, ranks, ranks_per_node=8, profile=faster) == pytest.approx(
        3 + 32 * MIB / 50e3)
    with pytest.raises(ConfigError, match="NPUSIM_PROFILE_OVERRIDES ranks_per_node"):
        parse_overrides("ranks_per_node=0")


def test_default_profile_is_the_current_one():
    """Without a profile the current one prices the collective."""
    from npusim.runtime.profiles import use_profile

    with use_profile("inference_soc"):
        assert collective_us("all_reduce", MIB, range(4), ranks_per_node=8) == collective_us(
            "all_reduce", MIB, range(4), ranks_per_node=8, profile=PRESETS["inference_soc"])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_the_server_figures(name):
    """Every preset carries positive link and host figures; the 910B2 ones an 8-NPU HCCS mesh, the 310P3 PCIe."""
    profile = PRESETS[name]
    assert {f.name for f in dataclasses.fields(Profile)} >= set(_NEW_FIELDS)
    assert all(getattr(profile, figure) > 0 for figure in LINK_FIGURES)
    assert profile.ranks_per_node >= 1
    if profile.soc_name == "Ascend910B2":
        assert (profile.ranks_per_node, profile.intra_node_mesh) == (8, True)
        assert profile.intra_node_gbps == pytest.approx(7 * profile.intra_link_gbps)  # a full mesh of 8
        assert (profile.inter_node_gbps, profile.host_cpu_factor) == (25.0, 1.5)
    else:
        assert profile.soc_name == "Ascend310P3"
        assert profile.intra_node_mesh is False
        assert profile.intra_link_gbps == profile.intra_node_gbps == 31.5  # one PCIe 4.0 x16 link
        assert profile.host_cpu_factor == 1.0


def test_calibrated_links_move_bytes_at_the_bus_efficiency():
    """The preset's bus_eff (0.7, Note [Calibrated efficiencies]) scales every link: the worked one-node
    all_reduce of 64 MiB takes 2 x (0.5 + 8388608 / (28 x 0.7 x 1e3)) = 856.98 us, not 600.19; a
    link_gbps the user gives the timing model is taken as the rate reached."""
    from npusim.runtime import timing

    calibrated = PRESETS["training_soc"]
    cost = collective_cost("all_reduce", 64 * MIB, range(8), ranks_per_node=8, profile=calibrated)
    assert cost.us == pytest.approx(856.980, abs=1e-3)
    ranks = [0, 8]  # one rank a node: the RoCE port
    assert collective_us("all_gather", 64 * MIB, ranks, ranks_per_node=8, profile=calibrated) == pytest.approx(
        1.5 + 32 * MIB / (25e3 * calibrated.bus_eff))
    hook = timing._collective_cost(0.0, 5.0)  # what NPUSIM_TIMING="link_gbps=5" installs
    assert hook("all_gather", 64 * MIB, ranks) == pytest.approx(1.5 + 32 * MIB / 5e3)
