"""The timing model's collective cost: how long one collective holds a rank's comm stream.

Note [Collective cost model]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A collective costs what HCCL's algorithm for its group's layout costs on the profile's links
(Note [Chip figures] in runtime/profiles.py). HCCL's algorithm guide (hiascend.com hcclug,
"Mesh" and "Ring"; cann/hccl docs/zh/user_guide/coll_algo_intro) prices each algorithm as
steps x (alpha + bytes x beta): alpha the latency of a step, beta the time of a byte on one link.
Here a step over a link costs

    step_us = latency_us + bytes / (gbps x 1e3)        (1 GB/s moves 1e3 bytes a microsecond)

and every rank runs its steps in parallel with the others, so the collective lasts as long as one
rank's steps. A link moves bytes at its peak times the profile's bus efficiency (bus_eff, Note
[Calibrated efficiencies] in runtime/profiles.py; 1.0 for a roofline profile, as in the worked
example below). The reduction's own arithmetic (HCCL's gamma term) is left out: the chip reduces at
HBM speed, some 65 times a link's (1843 against 28 GB/s), so it is within the model's error.

The group's layout. A global rank's node is rank // ranks_per_node; the group has p ranks on N
nodes, L on each (the most on any node, where nodes hold unequal counts: the busiest node sets the
pace, an approximation). Three layouts, as HCCL chooses (hcclug, "Algorithm Overview"):
- one node (N = 1): on a full mesh (HCCS, intra_node_mesh) HCCL's Mesh, each rank sending to all
  the others at once, each over its own link: one step of n/p bytes a link, on a link of
  min(intra_link_gbps, intra_node_gbps / (p - 1)). Without a mesh (PCIe cards) a Ring: p - 1
  steps of n/p over one link each.
- one rank a node (L = 1): a Ring over the inter-node links, p - 1 steps of n/p a phase.
- several nodes of several ranks: HCCL's hierarchical algorithm, an intra-node phase (Mesh or
  Ring among the L ranks of a node) and an inter-node phase (a Ring among the N ranks that share a
  local index, each over its own RoCE port, so the L rings run side by side).

The ops, with n the full buffer (all_reduce, broadcast, reduce: the tensor; all_gather*: the
gathered output; reduce_scatter*: the input; all_to_all*: the input; gather and scatter: nbytes is
one rank's piece, so n = p x nbytes), and c = n / p a rank's share:
- reduce_scatter, all_gather, gather, scatter: one phase, flat: Mesh 1 step, Ring p - 1 steps, of c.
  Hierarchical: reduce_scatter is an intra-node reduce-scatter of n (steps of n / L) then an
  inter-node reduce-scatter of n / L (N - 1 steps of c); all_gather the same in reverse; gather
  collects a node's L x c onto one rank (steps of c) then those blocks across nodes (N - 1 steps of
  L x c = n / N); scatter the reverse.
- all_reduce = reduce_scatter + all_gather; hierarchical: intra reduce-scatter of n, an inter-node
  all-reduce of n / L among the ranks of one local index (2(N - 1) steps of c), intra all-gather.
- broadcast = scatter + all_gather, reduce = reduce_scatter + gather (HCCL's own compositions).
- all_to_all: each rank sends c to every other. Mesh: 1 step; Ring (HCCL's pairwise): p - 1 steps.
  Hierarchical: the intra part (to the L - 1 local peers) then the inter part (N - 1 steps of L x c
  over the rank's RoCE port).
- send / recv: one step of nbytes over the link between the two ranks' nodes (group_ranks the pair;
  a larger group is priced over the slowest link it spans).
- barrier: latency only, 2 x ceil(log2 p) steps over the slowest link the group spans.
- a group of one rank: 0 us.

Worked example (training_soc with roofline=True: HCCS 28 GB/s per link, 196 GB/s per NPU, 0.5 us; RoCE 25 GB/s, 1.5 us),
one all_reduce of n = 64 MiB = 67108864 bytes over 8 ranks:
- one node (ranks_per_node=8): Mesh, link min(28, 196 / 7) = 28 GB/s, c = 8388608 bytes:
    reduce-scatter 0.5 + 8388608 / 28000 = 300.093143 us, all-gather the same:  600.186 us.
- two nodes of four (ranks_per_node=4): hierarchical, L = 4, N = 2:
    intra reduce-scatter of n / 4 = 16777216 bytes a link over min(28, 196 / 3) = 28 GB/s:
        0.5 + 16777216 / 28000 = 599.686286 us
    inter all-reduce of 16 MiB between 2 nodes: 2 steps of 8388608 bytes at 25 GB/s:
        2 x (1.5 + 8388608 / 25000) = 2 x 337.04432 = 674.088640 us
    intra all-gather, as the reduce-scatter: 599.686286 us
    total 1873.461 us: the RoCE ports carry a quarter of the data at an eighth of a node's HCCS rate.
A Ring over single HCCS links (intra_node_mesh off) would take 2 x 7 x 300.093143 = 4201.304 us
in one node: why HCCL runs Mesh there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from npusim.runtime.profiles import Profile, get_profile

# torch.distributed's names as npusim's backend passes them, each to the collective it prices as.
_PRICED_AS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "reduce": "reduce", "broadcast": "broadcast",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "gather": "gather", "scatter": "scatter",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "p2p", "recv": "p2p",
    "barrier": "barrier",
}
KNOWN_OPS = tuple(_PRICED_AS)
# HCCL's compositions (hcclug, "Mesh" and "Ring"): broadcast = scatter + all_gather, reduce =
# reduce_scatter + gather, all_reduce = reduce_scatter + all_gather.
_PRIMITIVES = {
    "all_reduce": ("reduce_scatter", "all_gather"), "reduce": ("reduce_scatter", "gather"),
    "broadcast": ("scatter", "all_gather"), "all_gather": ("all_gather",), "gather": ("gather",),
    "scatter": ("scatter",), "reduce_scatter": ("reduce_scatter",), "all_to_all": ("all_to_all",),
}


class Phase(NamedTuple):
    """One phase of a collective: its steps over one kind of link, each moving ``bytes`` a link."""

    name: str  # "reduce_scatter", "all_gather", "all_reduce", "gather", ...
    link: str  # "intra" or "inter"
    steps: int
    bytes: int
    us: float


class CollectiveCost(NamedTuple):
    """One collective's modelled cost: HCCL's algorithm for the group's layout, phase by phase."""

    op: str
    algorithm: str  # "none", "intra_mesh", "intra_ring", "inter_ring", "hierarchical", "p2p", "barrier"
    phases: tuple[Phase, ...]

    @property
    def us(self) -> float:
        return sum(phase.us for phase in self.phases)


class _Link(NamedTuple):
    name: str  # "intra" or "inter"
    gbps: float
    latency_us: float

    def phase(self, name: str, steps: int, nbytes: float) -> Phase:
        return Phase(name, self.name, steps, round(nbytes), steps * (self.latency_us + nbytes / (self.gbps * 1e3)))


class _Level(NamedTuple):
    """One level of the group: ``size`` ranks joined by ``link``, in one step (Mesh) or a Ring."""

    link: _Link
    size: int
    mesh: bool

    def phase(self, name: str, nbytes_per_step: float, ring_steps: int | None = None) -> Phase:
        steps = 1 if self.mesh else (self.size - 1 if ring_steps is None else ring_steps)
        return self.link.phase(name, steps, nbytes_per_step)


def _intra_level(profile: Profile, size: int) -> _Level:
    if profile.intra_node_mesh:
        # Mesh: every peer over its own link, all links sharing the NPU's aggregate.
        gbps = min(profile.intra_link_gbps, profile.intra_node_gbps / max(size - 1, 1))
    else:
        gbps = min(profile.intra_link_gbps, profile.intra_node_gbps)
    gbps *= profile.efficiency("bus")  # what HCCL reaches of a link (Note [Calibrated efficiencies])
    return _Level(_Link("intra", gbps, profile.intra_latency_us), size, profile.intra_node_mesh)


def _inter_level(profile: Profile, size: int) -> _Level:
    gbps = profile.inter_node_gbps * profile.efficiency("bus")
    return _Level(_Link("inter", gbps, profile.inter_latency_us), size, mesh=False)


def _node_sizes(group_ranks: Sequence[int], ranks_per_node: int) -> list[int]:
    """How many of the group's ranks each node it spans holds, in the order the group meets them."""
    sizes: dict[int, int] = {}
    for rank in group_ranks:
        sizes[rank // ranks_per_node] = sizes.get(rank // ranks_per_node, 0) + 1
    return list(sizes.values())


def _flat(primitive: str, n: float, level: _Level) -> list[Phase]:
    """One primitive among the ranks of one level, n the full buffer: steps of a rank's share."""
    return [level.phase(primitive, n / level.size)]


def _hierarchical(primitive: str, n: float, intra: _Level, inter: _Level) -> list[Phase]:
    """One primitive over N nodes of L ranks: HCCL's two-level form, n the full buffer."""
    local, nodes = intra.size, inter.size
    share = n / (local * nodes)
    if primitive == "reduce_scatter":
        return [intra.phase("reduce_scatter", n / local), inter.phase("reduce_scatter", share)]
    if primitive == "all_gather":
        return [inter.phase("all_gather", share), intra.phase("all_gather", n / local)]
    if primitive == "all_reduce":
        return [intra.phase("reduce_scatter", n / local),
                inter.phase("all_reduce", share, ring_steps=2 * (nodes - 1)),
                intra.phase("all_gather", n / local)]
    if primitive == "gather":
        return [intra.phase("gather", share), inter.phase("gather", local * share)]
    if primitive == "scatter":
        return [inter.phase("scatter", local * share), intra.phase("scatter", share)]
    assert primitive == "all_to_all", primitive
    return [intra.phase("all_to_all", share), inter.phase("all_to_all", local * share)]


def _check_links(profile: Profile) -> None:
    for field in ("intra_link_gbps", "intra_node_gbps", "inter_node_gbps"):
        if getattr(profile, field) <= 0:
            raise ValueError(f"npusim collective cost: profile {profile.name!r} has {field}="
                             f"{getattr(profile, field)}; expected a bandwidth > 0 GB/s")


def collective_cost(op: str, nbytes: int, group_ranks: Sequence[int], *, ranks_per_node: int,
                    profile: Profile | None = None) -> CollectiveCost:
    """The cost of collective ``op`` over ``nbytes`` (the buffer as npusim's backend counts it) in
    the group of global ranks ``group_ranks`` (group-rank order), phase by phase, on ``profile``'s
    links (the current profile by default). See Note [Collective cost model]."""
    try:
        priced_as = _PRICED_AS[op]
    except KeyError:
        raise ValueError(f"npusim collective cost: unknown op {op!r}; expected one of {', '.join(KNOWN_OPS)}") from None
    if nbytes < 0:
        raise ValueError(f"npusim collective cost: {op} of {nbytes} bytes; expected nbytes >= 0")
    if ranks_per_node < 1:
        raise ValueError(f"npusim collective cost: ranks_per_node={ranks_per_node}; expected >= 1")
    if not group_ranks:
        raise ValueError(f"npusim collective cost: {op} over an empty group; expected at least one rank")
    profile = get_profile() if profile is None else profile
    _check_links(profile)
    p = len(group_ranks)
    if p == 1:
        return CollectiveCost(op, "none", ())
    sizes = _node_sizes(group_ranks, ranks_per_node)
    nodes, local = len(sizes), max(sizes)
    # The slowest link the group spans: a barrier's and a message's.
    link = _inter_level(profile, nodes).link if nodes > 1 else _intra_level(profile, 2).link
    if priced_as == "barrier":
        return CollectiveCost(op, "barrier", (link.phase("barrier", 2 * math.ceil(math.log2(p)), 0),))
    if priced_as == "p2p":
        return CollectiveCost(op, "p2p", (link.phase(op, 1, nbytes),))
    n = nbytes * p if priced_as in ("gather", "scatter") else nbytes
    if nodes == 1:
        level = _intra_level(profile, p)
        algorithm = "intra_mesh" if level.mesh else "intra_ring"
        phases = [phase for primitive in _PRIMITIVES[priced_as] for phase in _flat(primitive, n, level)]
    elif local == 1:
        level, algorithm = _inter_level(profile, p), "inter_ring"
        phases = [phase for primitive in _PRIMITIVES[priced_as] for phase in _flat(primitive, n, level)]
    else:
        intra, inter = _intra_level(profile, local), _inter_level(profile, nodes)
        algorithm = "hierarchical"
        primitives = ("all_reduce",) if priced_as == "all_reduce" else _PRIMITIVES[priced_as]
        phases = [phase for primitive in primitives for phase in _hierarchical(primitive, n, intra, inter)]
    return CollectiveCost(op, algorithm, tuple(phases))


def collective_us(op: str, nbytes: int, group_ranks: Sequence[int], *, ranks_per_node: int,
                  profile: Profile | None = None) -> float:
    """Microseconds collective ``op`` holds a rank's comm stream: ``collective_cost(...).us``."""
    return collective_cost(op, nbytes, group_ranks, ranks_per_node=ranks_per_node, profile=profile).us
