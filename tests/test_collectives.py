"""Collective pricing: hand-computed references, a message-level replay of every flat
algorithm, and invariants (hypothesis).

References: DESIGN.md "Reference numbers"; issue 3 acceptance 1–3; the seed's engineering
example; Thakur, Rabenseifner & Gropp (IJHPCA 2005); nccl-tests doc/PERFORMANCE.md.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget.collectives import (
    ALGORITHMS,
    OPS,
    Algorithm,
    Link,
    Op,
    Tier,
    bus_bandwidth_factor,
    ceil_log2,
    collective_cost,
    flat_stage,
    floor_log2,
)

GIB = 2**30
NVLINK = Link("nvlink", 450e9, 1e-6)
IB = Link("ib", 50e9, 5e-6)


def _one(op: Op, ranks: int, size: int, link: Link, algorithm: Algorithm | None = None):  # type: ignore[no-untyped-def]
    return collective_cost(op, [Tier(ranks, link)], size, algorithm)


# ----------------------------------------------------------------------------- references


def test_ring_all_gather_design_reference() -> None:
    # DESIGN.md / issue 3 acceptance 1: P = 8, S = 1 GiB, α = 1 µs, B = 450 GB/s.
    # n = P−1 = 7; Q = 7/8 · 2^30 = 939,524,096 B;
    # T = 7 µs + 939,524,096 / 450e9 s = 7 µs + 2087.831 µs = 2094.831 µs.
    cost = _one("all-gather", 8, GIB, NVLINK)
    assert cost.algorithm == "ring"
    assert cost.steps == 7
    assert cost.sent_bytes == cost.recv_bytes == 939_524_096
    assert cost.time_s * 1e6 == pytest.approx(2094.831, abs=5e-4)


def test_ring_all_reduce_design_reference() -> None:
    # n = 2(P−1) = 14; Q = 2 · 939,524,096 B; T = 14 µs + 4175.663 µs = 4189.663 µs.
    cost = _one("all-reduce", 8, GIB, NVLINK)
    assert cost.steps == 14
    assert cost.sent_bytes == 2 * 939_524_096
    assert cost.time_s * 1e6 == pytest.approx(4189.663, abs=5e-4)


def test_seed_engineering_example() -> None:
    # The seed: "four latency-bearing phases at 5 μs plus 100 MB at 50 GB/s gives about
    # 2.02 ms" — a ring all-gather of 125 MB over 5 ranks: n = 4, Q = 4/5 · 125 MB = 100 MB,
    # T = 4 · 5 µs + 1e8 / 5e10 s = 20 µs + 2000 µs = 2.02 ms.
    cost = _one("all-gather", 5, 125_000_000, Link("ib", 50e9, 5e-6))
    assert cost.steps == 4
    assert cost.sent_bytes == 100_000_000
    assert cost.time_s == pytest.approx(2.02e-3, rel=1e-12)


def test_ring_all_reduce_four_nodes_of_eight() -> None:
    """Issue 3 acceptance 3's case, 1 GiB all-reduce over 4 nodes x 8 GPUs, as NCCL's ring
    runs it (the default across levels since the two-level sum proved 23 % slow against
    NCCL's measured 192 GB/s between DGX A100s: `_ring_across`). Each rank sends Q = 2 x 31
    x 2^30 / 32 = 2,080,374,784 B; a channel's ring crosses the 4 node boundaries in 4 of
    its 32 hops, so each rank's port takes Q / 8 = 260,046,848 B and NVLink the other
    1,820,327,936 B. Steps: 62, of which 2 x nNodes = 8 cross IB, as NCCL counts them
    (src/graph/tuning.cc at b647562: ``nInterSteps = ... (nNodes > 1 ? 2*nNodes : 0)`` for
    an all-reduce; this counted 2 x (4 - 1) = 6). T = 54 x 1 us + 8 x 5 us +
    max(1,820,327,936 / 450e9, 260,046,848 / 50e9) = 94 us + 5,200.937 us = 5,294.937 us."""
    cost = collective_cost("all-reduce", [Tier(8, NVLINK), Tier(4, IB)], GIB)
    assert cost.algorithm == "ring" and cost.pipelined
    assert [(s.link.name, s.steps, s.sent_bytes) for s in cost.stages] == [
        ("nvlink", 54, 1_820_327_936),
        ("ib", 8, 260_046_848),
    ]
    assert cost.sent_bytes == 2_080_374_784 == cost.recv_bytes
    assert cost.latency_s * 1e6 == pytest.approx(94.0)
    assert cost.time_s * 1e6 == pytest.approx(94.0 + 260_046_848 / 50e9 * 1e6)
    assert cost.time_s * 1e6 == pytest.approx(5294.937, abs=5e-4)
    assert cost.links == ("nvlink", "ib")


def test_nccls_double_binary_tree_over_two_nodes_has_no_inner_node() -> None:
    """Over two nodes of 8 neither tree has an inner node: in each, one node's chain sends
    its half up and the other's sends it back down, so a node puts S on the network, S/8
    through each of its 8 ports (an audit, m552: 2S/8, as an inner node's, and the ring
    chosen where the tree is faster; NCCL's tuner prices the tree at the intra-node rate at
    nNodes <= 2, and NVIDIA/nccl issue 946: "With Tree, on 2 nodes ... we have 2x less
    traffic on the network than on the intra-node connections"). DGX A100's links: NVLink
    231.6 GB/s and 3 us, InfiniBand 24 GB/s and 14 us. 1 GiB: the chains carry 2S − 2S/8 =
    1,879,048,192 B at 0.92 x 231.6 GB/s = 8,818.841 us, the port 134,217,728 B at 0.92 x 24
    GB/s = 6,078.7 us beside it, so NVLink paces the tree; 2 x 7 x 3 + 2 x 1 x 14 = 70 us of
    latency: 8,888.841 us, under the ring's 10,619.760 us, so an unnamed all-reduce runs the
    tree. The group's edges carry 2(P − 1)S = 30 GiB as on more nodes; a pair of ranks, one a
    node, moves S as before."""
    nvlink, ib = Link("nvlink", 231.6e9, 3e-6), Link("ib", 24e9, 14e-6)
    tiers = [Tier(8, nvlink), Tier(2, ib)]
    tree = collective_cost("all-reduce", tiers, GIB, "double-tree")
    assert [(s.link.name, s.steps, s.sent_bytes) for s in tree.stages] == [
        ("nvlink", 14, 2 * GIB - 2 * GIB // 8),
        ("ib", 2, GIB // 8),
    ]
    assert tree.time_s * 1e6 == pytest.approx(70 + 1_879_048_192 / (0.92 * 231.6e9) * 1e6)
    assert tree.time_s * 1e6 == pytest.approx(8888.841, abs=5e-4)
    ring = collective_cost("all-reduce", tiers, GIB, "ring")
    assert ring.time_s * 1e6 == pytest.approx(10619.760, abs=5e-4)
    assert collective_cost("all-reduce", tiers, GIB).algorithm == "double-tree"
    assert tree.aggregate_sent_bytes == 2 * 15 * GIB
    pair = collective_cost("all-reduce", [Tier(1, nvlink), Tier(2, ib)], GIB, "double-tree")
    assert [s.sent_bytes for s in pair.stages] == [0, GIB]
    # over four nodes a node is inside one tree: 2S/8 through each port (below)
    four = collective_cost("all-reduce", [Tier(8, nvlink), Tier(4, ib)], GIB, "double-tree")
    assert four.stages[1].sent_bytes == 2 * GIB // 8


def test_nccls_double_binary_tree_four_nodes_of_eight() -> None:
    """NCCL's tree all-reduce over 4 nodes x 8 (src/graph/tuning.cc: latency 2 x ((nRanks /
    nNodes - 1) x intraLat + log2(nNodes) x interLat), bandwidth S / (0.5 x 0.92 x busBw)):
    2 x 7 = 14 NVLink steps of 1 us and 2 x lg 4 = 4 IB steps of 5 us, 34 us; each rank
    moves 2 x 32 x c = 2 x 2^30 B, its port an eighth of it, 268,435,456 B at 0.92 x 50 GB/s
    = 5,835.553 us, and NVLink the rest at 0.92 x 450 GB/s = 4,538.764 us beside it. 1 GiB:
    5,869.553 us, slower than the ring's 5,294.937 us, so an unnamed all-reduce runs the
    ring; at 8 MiB the tree's 34 us of latency against the ring's 94 us (54 NVLink steps,
    8 IB steps) wins, its rate corrected by NCCL's factor at 8 MiB (entry lg(2^23 / 64) = 17
    of treeCorrectionFactor's Simple row: 0.8): 34 us + 2,097,152 / (0.92 x 0.8 x 50e9) s =
    90.988 us against 94 us + 2,031,616 / 50e9 s = 134.632 us. Named inside one node it is
    NCCL's chain: 14 steps and 2 GiB at 0.92 x 450 GB/s, 14 us + 5,187.159 us, slower than
    the ring."""
    tiers = [Tier(8, NVLINK), Tier(4, IB)]
    tree = collective_cost("all-reduce", tiers, GIB, "double-tree")
    assert tree.algorithm == "double-tree" and tree.pipelined
    assert [(s.link.name, s.steps, s.sent_bytes) for s in tree.stages] == [
        ("nvlink", 14, 2 * GIB - 268_435_456),
        ("ib", 4, 268_435_456),
    ]
    assert tree.latency_s * 1e6 == pytest.approx(34.0)
    assert tree.time_s * 1e6 == pytest.approx(34.0 + 268_435_456 / 46e9 * 1e6)
    assert collective_cost("all-reduce", tiers, GIB).algorithm == "ring"
    mid = collective_cost("all-reduce", tiers, 8 * 2**20)
    assert mid.algorithm == "double-tree"
    assert mid.time_s * 1e6 == pytest.approx(90.988, abs=5e-4)
    ring = collective_cost("all-reduce", tiers, 8 * 2**20, "ring")
    assert ring.time_s * 1e6 == pytest.approx(134.632, abs=5e-4)
    chain = collective_cost("all-reduce", [Tier(8, NVLINK)], GIB, "double-tree")
    assert (chain.algorithm, chain.steps, chain.sent_bytes) == ("double-tree", 14, 2 * GIB)
    assert chain.time_s * 1e6 == pytest.approx(5201.159, abs=5e-4)
    # a group of one rank moves nothing, as the ring's does (a search's tp 1 priced 2S)
    one = collective_cost("all-reduce", [Tier(1, NVLINK), Tier(1, IB)], GIB, "double-tree")
    assert (one.steps, one.sent_bytes, one.time_s) == (0, 0, 0.0)
    # one rank in each node: no chain, the trees alone (2 lg 4 = 4 steps on IB), where the
    # ring takes 2 x 3 = 6, all on IB (NCCL's 2 x nNodes = 8 network steps capped at the
    # ring's 6: its count would leave -2 inside the nodes), and moves 3/4 of the tree's 2S
    # at a rate 1/0.736 as high: ring
    alone = [Tier(1, NVLINK), Tier(4, IB)]
    assert collective_cost("all-reduce", alone, 8 * 2**20, "double-tree").steps == 4
    ring_alone = collective_cost("all-reduce", alone, 8 * 2**20)
    assert ring_alone.algorithm == "ring"
    assert [s.steps for s in ring_alone.stages] == [0, 6]


def test_the_tree_corrects_its_rate_by_nccls_factor_for_each_size() -> None:
    """NCCL's treeCorrectionFactor, Simple row (src/graph/tuning.cc at b647562): 0.9 up to
    4 KiB, 0.5 from 128 KiB to 2 MiB, 0.9 at 256 MiB, none from 512 MiB (lg(S / 64) >= 23);
    a sweep's array reads the same entries."""
    from budget.collectives import _tree_correction

    sizes = [64, 4096, 8192, 2**17, 2**21 - 1, 2**21, 2**28, 2**29, 2**40]
    expected = [0.9, 0.9, 0.8, 0.5, 0.5, 0.6, 0.9, 1.0, 1.0]
    assert [_tree_correction(s) for s in sizes] == expected
    assert list(_tree_correction(np.array(sizes))) == expected
    assert _tree_correction(63) == 1.0  # below 64 B, none, as NCCL's negative index
    assert list(_tree_correction(np.array([1, 63, 64]))) == [1.0, 1.0, 0.9]


def test_nccl_takes_the_tree_at_scale_where_the_ring_is_all_latency() -> None:
    """16,384 GPUs in 2,048 DGX H100s (370 GB/s NVLink at 3 us, 47 GB/s per port at
    14 us), 100 MB: the ring's 2 x 16,383 = 32,766 steps are 2 x 2,048 = 4,096 IB ones (NCCL's
    2 x nNodes) and 28,670 NVLink ones, 28,670 x 3 us + 4,096 x 14 us = 143.354 ms of latency
    alone. NCCL's tree: 2 x (7 x 3 us + lg 2,048 x 14 us) = 350 us, and
    2 x 16,384 x 6,104 B (c = ceil(1e8 / 16,384)) with an eighth through each port at
    0.92 x 0.8 x 47 GB/s (the correction's entry lg(1e8 / 64) = 20): 200,015,872 / 8 /
    34.592e9 = 722.768 us; 1,072.768 us in all, the default. (NCCL's own formula, 2S /
    (0.92 x 0.8 x 8 x 47 GB/s), gives 722.71 us unpadded.)"""
    tiers = [Tier(8, Link("nvlink", 370e9, 3e-6)), Tier(2048, Link("ib", 47e9, 14e-6))]
    ring = collective_cost("all-reduce", tiers, 100_000_000, "ring")
    assert [s.steps for s in ring.stages] == [28_670, 4_096]
    assert ring.latency_s * 1e3 == pytest.approx(28_670 * 3e-3 + 4_096 * 14e-3)
    assert ring.latency_s * 1e3 == pytest.approx(143.354)
    cost = collective_cost("all-reduce", tiers, 100_000_000)
    assert cost.algorithm == "double-tree" and cost.steps == 2 * 7 + 2 * 11
    assert cost.latency_s * 1e6 == pytest.approx(350.0)
    assert cost.bandwidth_s * 1e6 == pytest.approx(200_015_872 / 8 / (0.92 * 0.8 * 47e9) * 1e6)
    assert cost.time_s * 1e6 == pytest.approx(1072.768, abs=5e-4)
    assert pytest.approx(float(cost.bandwidth_s), rel=2e-4) == 2e8 / (0.92 * 0.8 * 8 * 47e9)


def test_a_tree_over_three_levels_splits_its_steps_by_the_domains_each_spans() -> None:
    """2,048 ranks on the rail-fat-tree's levels (8 per node, 32 nodes per rail unit, 8
    units): 2 x 7 = 14 NVLink steps, 2 x (lg 256 - lg 8) = 10 on the rails and 2 x lg 8 = 6
    on the spine, 2 x (7 + lg 256) = 30 in all, as NCCL counts them."""
    rail, spine = Link("rail", 50e9, 5e-6), Link("spine", 50e9, 7e-6)
    tiers = [Tier(8, NVLINK), Tier(32, rail), Tier(8, spine)]
    tree = collective_cost("all-reduce", tiers, GIB, "double-tree")
    assert [s.steps for s in tree.stages] == [14, 10, 6]
    assert tree.latency_s * 1e6 == pytest.approx(14 * 1 + 10 * 5 + 6 * 7)
    assert sum(s.sent_bytes for s in tree.stages) == 2 * GIB


def test_an_unnamed_all_reduce_over_arrays_takes_each_configurations_faster_algorithm() -> None:
    """A sweep prices many configurations at once: each takes the ring or the tree as it
    would alone, bytes and steps included."""
    sizes = np.array([8 * 2**20, GIB, 1024])
    nodes = np.array([4, 4, 64])
    swept = collective_cost("all-reduce", [Tier(8, NVLINK), Tier(nodes, IB)], sizes)
    for i, (size, n) in enumerate(zip(sizes, nodes, strict=True)):
        alone = collective_cost("all-reduce", [Tier(8, NVLINK), Tier(int(n), IB)], int(size))
        assert float(swept.time_s[i]) == pytest.approx(float(alone.time_s), rel=1e-12)
        assert int(swept.steps[i]) == int(alone.steps)
        assert int(swept.sent_bytes[i]) == int(alone.sent_bytes)
    assert swept.algorithm == "double-tree"  # the tree's name where any configuration takes it


def test_a_ring_across_nodes_reaches_what_nccl_measures_between_dgx_a100s() -> None:
    """NCCL's maintainers: "On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we
    measure 192GB/s AllReduce BusBW" (NVIDIA/nccl issue 812): 8 ports x 24 GB/s, the share
    of HDR the dgx-a100 preset takes (nccl-tests issue 119). Two nodes and sixteen, 1 GiB,
    on the preset's own levels: the ring's bus bandwidth within 2 % of 192 GB/s at two nodes
    (its latency steps take the rest), where the two-level sum gave 146 GB/s. Unnamed, two
    nodes run NCCL's tree, which puts half the ring's bytes on the network there and beats
    it (NVIDIA/nccl issue 946: "2 nodes is a special case ... NCCL should use Tree on 2
    nodes for large sizes"); sixteen run the ring."""
    from budget.catalog.topologies import TOPOLOGIES

    nvlink, ib = (
        Link(spec.name, spec.bandwidth, spec.latency, ramp=spec.ramp)
        for spec in TOPOLOGIES["dgx-a100"].levels
    )
    assert ib.bandwidth == 24e9
    ring = collective_cost("all-reduce", [Tier(8, nvlink), Tier(2, ib)], GIB, "ring")
    assert ring.bus_bandwidth / 1e9 == pytest.approx(192, rel=0.02)
    chosen = collective_cost("all-reduce", [Tier(8, nvlink), Tier(2, ib)], GIB)
    assert chosen.algorithm == "double-tree" and chosen.time_s < ring.time_s
    sixteen = collective_cost("all-reduce", [Tier(8, nvlink), Tier(16, ib)], GIB)
    assert sixteen.algorithm == "ring"
    summed = collective_cost("all-reduce", [Tier(8, nvlink), Tier(2, ib)], GIB, "hierarchical")
    assert summed.bus_bandwidth / 1e9 < 150


def test_hierarchical_all_reduce_four_nodes_of_eight() -> None:
    # Issue 3 acceptance 3: 1 GiB all-reduce over 4 nodes × 8 GPUs, named hierarchical.
    # reduce-scatter inside 8 on NVLink: 7 · 1 µs + 7/8 · 2^30 / 450e9 = 2094.831 µs
    # all-reduce across 4 on S/8 = 134,217,728 B over IB (ring): 6 · 5 µs
    #     + 2 · 3/4 · 134,217,728 / 50e9 = 30 µs + 4026.532 µs = 4056.532 µs
    # all-gather inside 8 on NVLink: 2094.831 µs
    # total 2 · 2094.831 + 4056.532 = 8246.194 µs
    cost = collective_cost("all-reduce", [Tier(8, NVLINK), Tier(4, IB)], GIB, "hierarchical")
    assert cost.algorithm == "hierarchical"
    assert [(s.op, s.ranks, s.steps, s.link.name) for s in cost.stages] == [
        ("reduce-scatter", 8, 7, "nvlink"),
        ("all-reduce", 4, 6, "ib"),
        ("all-gather", 8, 7, "nvlink"),
    ]
    assert cost.stages[1].size_bytes == GIB // 8
    assert cost.stages[1].sent_bytes == 201_326_592
    assert cost.stages[1].time_s * 1e6 == pytest.approx(4056.532, abs=5e-4)
    assert cost.time_s * 1e6 == pytest.approx(8246.194, abs=5e-4)
    assert cost.links == ("nvlink", "ib")
    assert cost.link == IB


def test_hierarchical_all_to_all_four_nodes_of_eight() -> None:
    """The all-to-all across nodes named ``hierarchical`` (the default until an audit; the
    default is now NCCL's exchange with every peer at once, tests/test_collectives_audit.py):
    the two-level exchange of `_hierarchical` (Tutel's 2DH), 8 GPUs x 4 nodes, S = 1 GiB,
    P = 32, so each block (what one rank sends one other) is b = S / 32² = 1 MiB.

    Inside the node, to local peer j go the d = 4 blocks bound for every rank of local
    index j: a pairwise exchange over g = 8 of 7 steps, 7 x 4 MiB = 29,360,128 B per rank.
    Across nodes, to remote peer go the g = 8 blocks gathered for it from this node: a
    pairwise exchange over d = 4 of 3 steps, 3 x 8 MiB = 25,165,824 B per rank, the same as
    the flat exchange sends off-node, (P − g)·b = 24 x 1 MiB (Thakur 2005 sec. 3.6; the
    docstring of `collective_cost`). With NVLink 450 GB/s at 1 µs and IB 50 GB/s at 5 µs:
    T = 7 x 1 µs + 29,360,128 / 450e9 s + 3 x 5 µs + 25,165,824 / 50e9 s
      = 7 + 65.2447 + 15 + 503.3165 µs = 590.561 µs."""
    tiers = [Tier(8, NVLINK), Tier(4, IB)]
    cost = collective_cost("all-to-all", tiers, GIB, "hierarchical")
    assert cost.algorithm == "hierarchical"
    assert [(s.link.name, s.ranks, s.steps, s.sent_bytes) for s in cost.stages] == [
        ("nvlink", 8, 7, 29_360_128),
        ("ib", 4, 3, 25_165_824),
    ]
    assert 29_360_128 == 7 * 4 * 2**20 and 25_165_824 == 3 * 8 * 2**20 == (32 - 8) * 2**20
    assert cost.stages[1].payload_bytes == 25_165_824
    # the bytes the whole group puts on InfiniBand: 32 ranks x (P − g)·b = 768 MiB, those of
    # the flat exchange's messages between nodes
    across = cost.stages[1]
    assert across.instances * across.group_sent_bytes == 32 * 24 * 2**20
    assert cost.time_s * 1e6 == pytest.approx(590.561, abs=5e-4)
    assert cost.time_s == pytest.approx(
        7e-6 + 29_360_128 / 450e9 + 3 * 5e-6 + 25_165_824 / 50e9, rel=1e-12
    )


def test_hierarchical_broadcast_time_four_nodes_of_eight() -> None:
    """The broadcast across nodes named ``hierarchical`` (the default until an audit; the
    default is now NCCL's ring, tests/test_collectives_audit.py): a chain across the 4
    nodes' leaders on IB, then a chain inside each node on NVLink (ring broadcast: P − 1
    fill steps, S through one link; nccl-tests doc/PERFORMANCE.md). S = 1 GiB:
    T = 3 x 5 µs + 2^30 / 50e9 s + 7 x 1 µs + 2^30 / 450e9 s
      = 15 + 21,474.836 + 7 + 2,386.093 µs = 23,882.929 µs."""
    cost = collective_cost("broadcast", [Tier(8, NVLINK), Tier(4, IB)], GIB, "hierarchical")
    assert cost.algorithm == "hierarchical"
    assert [(s.link.name, s.steps, s.payload_bytes) for s in cost.stages] == [
        ("ib", 3, GIB),
        ("nvlink", 7, GIB),
    ]
    assert cost.time_s * 1e6 == pytest.approx(23_882.93, abs=5e-3)
    assert cost.time_s == pytest.approx(15e-6 + GIB / 50e9 + 7e-6 + GIB / 450e9, rel=1e-12)


def test_a_neighbours_ring_across_levels_is_priced_at_the_slow_link() -> None:
    # One ring over 32 ranks with every step at IB (an exchange between neighbours, whose
    # node-crossing hop is one GPU's port: ring attention): n = 2 · 31 = 62 steps · 5 µs =
    # 310 µs, Q = 2 · 31/32 · 2^30 = 2,080,374,784 B / 50e9 = 41,607.496 µs → 41,917.496 µs.
    tiers = [Tier(8, NVLINK), Tier(4, IB)]
    cost = collective_cost("all-reduce", tiers, GIB, "ring", levelled=False)
    assert cost.algorithm == "ring"
    assert cost.steps == 62
    assert cost.sent_bytes == 2_080_374_784
    assert cost.time_s * 1e6 == pytest.approx(41_917.5, abs=0.01)
    assert cost.links == ("ib",)


def test_auto_picks_the_ring_for_big_and_a_log_algorithm_for_tiny_messages() -> None:
    tiers = [Tier(8, NVLINK), Tier(4, IB)]
    big = collective_cost("all-reduce", tiers, GIB, "auto")
    assert big.algorithm == "ring"
    names = {name for name, _ in big.candidates}
    assert names == {"hierarchical", "ring", "double-tree", "recursive", "tree"}
    assert big.time_s == min(t for _, t in big.candidates)
    # 1 KiB: latency dominates. NCCL's double binary tree: 2 · 7 NVLink steps · 1 µs + 2 ·
    # lg 4 IB steps · 5 µs = 34 µs beats the two-level form's 14 · 1 µs + 6 · 5 µs = 44 µs,
    # Rabenseifner's 2 lg 32 = 10 IB steps = 50 µs and the ring's 54 · 1 + 8 · 5 = 94 µs.
    tiny = collective_cost("all-reduce", tiers, 1024, "auto")
    assert tiny.algorithm == "double-tree"
    assert tiny.latency_s * 1e6 == pytest.approx(34.0)
    hierarchical = dict(tiny.candidates)["hierarchical"]
    assert hierarchical * 1e6 == pytest.approx(44.0, abs=0.1)
    # On one IB level, Rabenseifner's 10 steps beat the ring's 62 (and the binomial tree's
    # 10 steps, which move lg P · S instead of 2(P−1)/P · S through the root).
    flat = collective_cost("all-reduce", [Tier(32, IB)], 1024, "auto")
    assert (flat.algorithm, flat.steps) == ("recursive", 10)


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize(
    ("op", "algorithm", "steps", "sent", "payload"),
    [
        # P = 8, S = 8 MiB, chunk c = 1 MiB; Thakur 2005 sections 3 and 4. `sent` is the
        # busiest rank's bytes out, `payload` Q, the bytes on its critical path (MiB).
        ("all-gather", "recursive", 3, 7, 7),  # lg P steps, (P−1)·c
        ("all-gather", "bruck", 3, 7, 7),
        ("reduce-scatter", "recursive", 3, 7, 7),
        ("all-reduce", "recursive", 6, 14, 14),  # Rabenseifner: 2 lg P, 2(P−1)·c
        # binomial reduce + bcast: 2 lg P steps; the root receives lg P · S = 24 MiB in the
        # reduce, then sends lg P · S = 24 MiB in the broadcast: Q = 2 lg P · S = 48 MiB
        ("all-reduce", "tree", 6, 24, 48),
        ("broadcast", "tree", 3, 24, 24),  # root sends lg P · S
        ("broadcast", "ring", 7, 8, 8),  # pipelined chain: P−1 fill steps, S through one link
        ("all-to-all", "pairwise", 7, 7 / 8, 7 / 8),  # (P−1) blocks of S/P²
        ("all-to-all", "bruck", 3, 12 / 8, 12 / 8),  # lg P steps of P/2 blocks
        ("send-recv", "direct", 1, 8, 8),
    ],
)
def test_flat_formulas(
    op: Op, algorithm: Algorithm, steps: int, sent: float, payload: float
) -> None:
    cost = _one(op, 8, 8 * 2**20, NVLINK, algorithm)
    assert cost.steps == steps
    assert cost.sent_bytes == int(sent * 2**20)
    assert cost.payload_bytes == int(payload * 2**20)
    # T = n·α + Q/B with α = 1 µs, B = 450 GB/s (no ramp on NVLINK)
    assert cost.time_s == pytest.approx(steps * 1e-6 + payload * 2**20 / 450e9, rel=1e-12)


def test_binomial_tree_all_reduce_time_by_hand() -> None:
    """Thakur 2005 sec. 4.1: a binomial reduce to the root, then a binomial broadcast from
    it. P = 8, S = 8 MiB: 2 lg 8 = 6 steps; the root receives S in each of the reduce's 3
    steps and sends S in each of the broadcast's 3, so Q = 2 · 3 · 8 MiB = 50,331,648 B.
    T = 6 · 1 µs + 50,331,648 / 450e9 s = 6 µs + 111.848 µs = 117.848 µs."""
    cost = _one("all-reduce", 8, 8 * 2**20, NVLINK, "tree")
    assert cost.payload_bytes == 50_331_648 == 48 * 2**20
    assert cost.time_s * 1e6 == pytest.approx(117.848, abs=5e-4)


def test_rabenseifner_on_six_ranks_uses_mpichs_extra_steps() -> None:
    # P = 6: p′ = 4, r = 2 ranks fold into partners first and get the result at the end.
    # MPICH allreduce.c: (2⌊lg p⌋ + 2)·α + (2(p′−1)/p′ + 2)·n·β, here with S = 4 MiB:
    # n = 2·2 + 2 = 6; busiest rank sends 2·3·1 MiB + 4 MiB = 10 MiB; Q = 6 + 8 = 14 MiB.
    cost = _one("all-reduce", 6, 4 * 2**20, NVLINK, "recursive")
    assert cost.steps == 6
    assert cost.sent_bytes == 10 * 2**20
    assert cost.payload_bytes == 14 * 2**20


@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter"])
def test_recursive_refuses_groups_that_are_not_a_power_of_two(op: Op) -> None:
    with pytest.raises(ValueError, match="power-of-two group, and 6 ranks is not"):
        _one(op, 6, GIB, NVLINK, "recursive")


def test_uneven_split_rounds_each_chunk_up() -> None:
    # S = 10 B over P = 4: chunks of ceil(10/4) = 3 B, so the ring moves 3 chunks = 9 B.
    assert _one("all-gather", 4, 10, NVLINK).sent_bytes == 9
    assert _one("all-reduce", 4, 10, NVLINK).sent_bytes == 18
    # bf16 elements: 10 B = 5 elements → ceil(5/4) = 2 elements = 4 B per chunk → 12 B.
    cost = collective_cost("all-gather", [Tier(4, NVLINK)], 10, element_bytes=2)
    assert cost.sent_bytes == 12
    # All-to-all: blocks of ceil(S / P²) = ceil(10/16) = 1 B, P−1 = 3 of them.
    assert _one("all-to-all", 4, 10, NVLINK).sent_bytes == 3


def test_one_rank_costs_nothing() -> None:
    for op in OPS:
        for algorithm in ALGORITHMS[op]:
            cost = _one(op, 1, GIB, NVLINK, algorithm)
            assert (cost.steps, cost.sent_bytes, cost.recv_bytes, cost.time_s) == (0, 0, 0, 0)


def test_a_collective_of_0_bytes_takes_no_step_as_nccl_discards_it() -> None:
    """NCCL's taskAppend returns before queueing a collective whose count is 0 ("Empty
    collectives can be discarded", src/enqueue.cc of NVIDIA/nccl): `budget collective
    all-reduce --ranks 8 --size 0` priced the ring's 14 steps, 14 µs. A send or receive is
    queued whatever its bytes: one step still. In a sweep only the 0-byte entries lose
    their steps."""
    for op in OPS:
        for algorithm in ALGORITHMS[op]:
            if algorithm == "recursive" or op == "send-recv":
                continue
            for tiers in ([Tier(8, NVLINK)], [Tier(8, NVLINK), Tier(4, IB)]):
                cost = collective_cost(op, tiers, 0, algorithm)
                assert (cost.steps, cost.sent_bytes, cost.time_s) == (0, 0, 0), (op, algorithm)
    assert collective_cost("all-reduce", [Tier(8, NVLINK), Tier(4, IB)], 0).time_s == 0
    assert _one("all-reduce", 8, 0, NVLINK, "recursive").steps == 0
    assert _one("send-recv", 2, 0, NVLINK).steps == 1
    swept = _one("all-reduce", 8, np.array([0, GIB]), NVLINK)  # type: ignore[arg-type]
    assert list(swept.steps) == [0, 14]


def test_contention_divides_the_link() -> None:
    shared = Link("nic", 50e9, 5e-6, shared_by=2)
    alone = _one("all-gather", 4, GIB, IB)
    contended = _one("all-gather", 4, GIB, shared)
    assert contended.bandwidth_s == pytest.approx(2 * alone.bandwidth_s)
    assert contended.latency_s == alone.latency_s


@pytest.mark.parametrize(
    ("op", "algorithm", "message"),
    [
        ("all-gather", "tree", "all-gather has no 'tree' algorithm"),
        ("send-recv", "hierarchical", "send-recv has no 'hierarchical' algorithm"),
        ("gather", None, "unknown collective 'gather'"),
    ],
)
def test_bad_requests_say_what_is_allowed(op: str, algorithm: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        collective_cost(op, [Tier(4, NVLINK)], 1, algorithm)  # type: ignore[arg-type]


def test_negative_sizes_and_empty_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        _one("all-gather", 4, -1, NVLINK)
    with pytest.raises(ValueError, match="at least 1 rank"):
        _one("all-gather", 0, 1, NVLINK)


# ----------------------------------------------------------------------------- bus bandwidth


@pytest.mark.parametrize(
    ("op", "factor"),
    [
        ("all-reduce", 2 * 7 / 8),
        ("all-gather", 7 / 8),
        ("reduce-scatter", 7 / 8),
        ("all-to-all", 7 / 8),
        ("broadcast", 1.0),
    ],
)
def test_bus_bandwidth_factors_match_nccl_tests(op: Op, factor: float) -> None:
    # nccl-tests doc/PERFORMANCE.md, "Summary".
    assert bus_bandwidth_factor(op, 8) == pytest.approx(factor)


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast"]),
    p=st.integers(2, 64),
    blocks=st.integers(1, 1000),
)
def test_ring_moves_bytes_at_exactly_the_bus_bandwidth(op: Op, p: int, blocks: int) -> None:
    # With α = 0 and S divisible by P², the busiest rank's bytes / time is the link's
    # bandwidth, and algbw × factor (nccl-tests' busbw) is that same number.
    link = Link("x", 100e9, 0.0)
    cost = _one(op, p, blocks * p * p, link)
    assert cost.sent_bytes / cost.time_s == pytest.approx(link.bandwidth, rel=1e-12)
    assert cost.bus_bandwidth == pytest.approx(link.bandwidth, rel=1e-12)


# ----------------------------------------------------------------------------- message replay


def _schedule(op: Op, algorithm: Algorithm, p: int, s: int) -> list[tuple[int, int, int, int]]:
    """Every message (step, src, dst, bytes) of the algorithm, written from the papers'
    descriptions independently of the closed forms in budget.collectives."""
    c = -(-s // p)
    b = -(-s // (p * p))
    lg = max(p - 1, 0).bit_length()
    out: list[tuple[int, int, int, int]] = []
    if op in ("all-gather", "reduce-scatter") and algorithm == "ring":
        out = [(k, i, (i + 1) % p, c) for k in range(p - 1) for i in range(p)]
    elif op == "all-gather" and algorithm == "recursive":
        out = [(k, i, i ^ (1 << k), (1 << k) * c) for k in range(lg) for i in range(p)]
    elif op == "reduce-scatter" and algorithm == "recursive":
        out = [(k, i, i ^ (p >> (k + 1)), (p >> (k + 1)) * c) for k in range(lg) for i in range(p)]
    elif op == "all-gather" and algorithm == "bruck":
        full = p.bit_length() - 1
        out = [(k, i, (i - (1 << k)) % p, (1 << k) * c) for k in range(full) for i in range(p)]
        if p != 1 << full:
            out += [(full, i, (i - (1 << full)) % p, (p - (1 << full)) * c) for i in range(p)]
    elif op == "all-reduce" and algorithm == "ring":
        out = [(k, i, (i + 1) % p, c) for k in range(2 * (p - 1)) for i in range(p)]
    elif op == "all-reduce" and algorithm == "recursive":
        p2 = 1 << (p.bit_length() - 1)
        r, k2, c2 = p - p2, p2.bit_length() - 1, -(-s // p2)

        def real(n: int) -> int:
            return 2 * n + 1 if n < r else n + r

        pre = 1 if r else 0  # the folding step exists only when P is not a power of two
        out = [(0, i, i + 1, s) for i in range(0, 2 * r, 2)]
        for k in range(k2):  # recursive halving
            half = p2 >> (k + 1)
            out += [(pre + k, real(n), real(n ^ half), half * c2) for n in range(p2)]
        for k in range(k2):  # recursive doubling
            bit = 1 << k
            out += [(pre + k2 + k, real(n), real(n ^ bit), bit * c2) for n in range(p2)]
        out += [(pre + 2 * k2, i, i - 1, s) for i in range(1, 2 * r, 2)]
    elif op in ("all-reduce", "broadcast") and algorithm == "tree":
        if op == "all-reduce":  # binomial reduce to rank 0
            for k in range(lg):
                out += [(k, i, i - (1 << k), s) for i in range(p) if i % (2 << k) == 1 << k]
        base = lg if op == "all-reduce" else 0
        for step, k in enumerate(reversed(range(lg))):  # binomial broadcast from rank 0
            out += [
                (base + step, i, i + (1 << k), s) for i in range(0, p, 2 << k) if i + (1 << k) < p
            ]
    elif op == "broadcast" and algorithm == "ring":
        out = [(i, i, i + 1, s) for i in range(p - 1)]
    elif op == "all-to-all" and algorithm == "pairwise":
        out = [(k, i, (i + k) % p, b) for k in range(1, p) for i in range(p)]
    elif op == "all-to-all" and algorithm == "bruck":
        for k in range(lg):
            count = sum(1 for j in range(p) if j >> k & 1)
            out += [(k, i, (i + (1 << k)) % p, count * b) for i in range(p)]
    elif op == "send-recv":
        out = [(0, i, i + 1, s) for i in range(p - 1)]
    else:
        raise AssertionError(f"no replay for {op} {algorithm}")
    return [m for m in out if m[1] != m[2]]


def _flat_cases() -> list[tuple[Op, Algorithm]]:
    return [(op, algorithm) for op in OPS for algorithm in ALGORITHMS[op]]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(_flat_cases()), p=st.integers(1, 40), s=st.integers(0, 10**7))
def test_closed_forms_match_a_message_level_replay(
    case: tuple[Op, Algorithm], p: int, s: int
) -> None:
    op, algorithm = case
    if algorithm == "recursive" and op != "all-reduce" and p & (p - 1):
        return  # refused (tested above)
    # NCCL discards a collective of 0 bytes before it sends anything; a send still goes
    messages = _schedule(op, algorithm, p, s) if s or op == "send-recv" else []
    sent: dict[int, int] = defaultdict(int)
    recv: dict[int, int] = defaultdict(int)
    for _, src, dst, nbytes in messages:
        sent[src] += nbytes
        recv[dst] += nbytes
    stage = flat_stage(op, algorithm, p, s, NVLINK)
    active_steps = {step for step, *_ in messages}
    assert stage.steps == len(active_steps)
    assert stage.sent_bytes == max(sent.values(), default=0)
    assert stage.recv_bytes == max(recv.values(), default=0)
    assert stage.group_sent_bytes == sum(sent.values())
    assert stage.group_recv_bytes == sum(recv.values())
    # Q, which sets the bandwidth term: the busiest rank's bytes along the schedule, a step
    # costing the larger of what the rank sends and receives in it (links are full duplex).
    # The tree all-reduce's root receives lg P · S, then sends lg P · S: 2 lg P · S; a folded
    # Rabenseifner partner receives S first and sends S last besides the core exchange.
    # The broadcast chain is pipelined (NCCL's ring broadcast streams the buffer in small
    # pieces, a rank forwarding one piece while it receives the next), so there Q is the
    # most one rank's link carries in one direction: S.
    per_step: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for step, src, dst, nbytes in messages:
        per_step[step, src][0] += nbytes
        per_step[step, dst][1] += nbytes
    if (op, algorithm) == ("broadcast", "ring"):
        payload = max([*sent.values(), *recv.values()], default=0)
    else:
        path: dict[int, int] = defaultdict(int)
        for (_, rank), (out, into) in per_step.items():
            path[rank] += max(out, into)
        payload = max(path.values(), default=0)
    assert stage.payload_bytes == payload


# ----------------------------------------------------------------------------- invariants

tiers_strategy = st.lists(
    st.tuples(st.integers(1, 9), st.sampled_from([NVLINK, IB, Link("pod", 25e9, 20e-6)])),
    min_size=1,
    max_size=3,
).map(lambda ts: [Tier(r, link) for r, link in ts])
any_algorithm = st.sampled_from(
    [None, "ring", "recursive", "tree", "pairwise", "bruck", "direct", "hierarchical"]
)


def _price(op: Op, tiers: list[Tier], size: int, algorithm: str | None):  # type: ignore[no-untyped-def]
    try:
        return collective_cost(op, tiers, size, algorithm)  # type: ignore[arg-type]
    except ValueError:
        return None  # not applicable to this op or group


@settings(max_examples=300, deadline=None)
@given(
    op=st.sampled_from(OPS),
    tiers=tiers_strategy,
    size=st.integers(0, 10**9),
    algorithm=any_algorithm,
)
def test_bytes_sent_over_the_group_equal_bytes_received(
    op: Op, tiers: list[Tier], size: int, algorithm: str | None
) -> None:
    cost = _price(op, tiers, size, algorithm)
    if cost is not None:
        assert cost.aggregate_sent_bytes == cost.aggregate_recv_bytes
        assert isinstance(cost.sent_bytes, int) and isinstance(cost.aggregate_sent_bytes, int)


@settings(max_examples=200, deadline=None)
@given(
    op=st.sampled_from(OPS),
    tiers=tiers_strategy,
    a=st.integers(0, 10**9),
    b=st.integers(0, 10**9),
    algorithm=any_algorithm,
)
def test_time_is_monotone_in_size(
    op: Op, tiers: list[Tier], a: int, b: int, algorithm: str | None
) -> None:
    small, large = sorted((a, b))
    lo, hi = _price(op, tiers, small, algorithm), _price(op, tiers, large, algorithm)
    if lo is not None and hi is not None:
        assert lo.time_s <= hi.time_s


@settings(max_examples=200, deadline=None)
@given(
    op=st.sampled_from(OPS),
    p=st.integers(1, 64),
    size=st.integers(0, 10**9),
    a=st.floats(0, 1e-3),
    b=st.floats(0, 1e-3),
    algorithm=any_algorithm,
)
def test_time_is_monotone_in_latency(
    op: Op, p: int, size: int, a: float, b: float, algorithm: str | None
) -> None:
    small, large = sorted((a, b))
    lo = _price(op, [Tier(p, Link("x", 1e10, small))], size, algorithm)
    hi = _price(op, [Tier(p, Link("x", 1e10, large))], size, algorithm)
    if lo is not None and hi is not None:
        assert lo.time_s <= hi.time_s


# ----------------------------------------------------------------------------- vectorised


@pytest.mark.parametrize("case", _flat_cases())
def test_arrays_of_sizes_and_ranks_give_the_scalar_answers(case: tuple[Op, Algorithm]) -> None:
    op, algorithm = case
    if algorithm == "recursive" and op != "all-reduce":
        ranks = np.array([1, 2, 4, 8, 16, 32, 64], dtype=np.int64)  # powers of two only
    else:
        ranks = np.array([1, 3, 5, 6, 8, 12, 33], dtype=np.int64)
    sizes = np.array([0, 7, 1000, 2**20, 3 * 10**6, GIB, 10**10], dtype=np.int64)
    vector = flat_stage(op, algorithm, ranks, sizes, IB, element_bytes=2)
    for i, (p, s) in enumerate(zip(ranks.tolist(), sizes.tolist(), strict=True)):
        scalar = flat_stage(op, algorithm, p, s, IB, element_bytes=2)
        assert vector.steps[i] == scalar.steps  # type: ignore[index]
        assert vector.sent_bytes[i] == scalar.sent_bytes  # type: ignore[index]
        assert vector.recv_bytes[i] == scalar.recv_bytes  # type: ignore[index]
        assert vector.time_s[i] == pytest.approx(scalar.time_s)  # type: ignore[index]


def test_hierarchical_pricing_takes_arrays_of_sizes() -> None:
    sizes = np.array([2**20, GIB], dtype=np.int64)
    tiers = [Tier(8, NVLINK), Tier(4, IB)]
    cost = collective_cost("all-reduce", tiers, sizes, "hierarchical")
    assert cost.time_s[1] * 1e6 == pytest.approx(8246.194, abs=5e-4)  # type: ignore[index]
    assert cost.bus_bandwidth.shape == (2,)  # type: ignore[union-attr]


def test_a_ring_across_levels_takes_arrays_of_ranks_and_sizes() -> None:
    """A sweep prices many layouts at once: each element as the scalar call prices it,
    a group inside one node (1 rank outside) as the flat ring on NVLink."""
    inner = np.array([8, 4, 8, 2], dtype=np.int64)
    outer = np.array([4, 1, 2, 16], dtype=np.int64)
    sizes = np.array([GIB, 2**20, 3 * 2**20 + 7, GIB], dtype=np.int64)
    for op in ("all-reduce", "reduce-scatter", "all-gather"):
        vector = collective_cost(op, [Tier(inner, NVLINK), Tier(outer, IB)], sizes)
        for i in range(4):
            one = collective_cost(
                op, [Tier(int(inner[i]), NVLINK), Tier(int(outer[i]), IB)], int(sizes[i])
            )
            assert vector.time_s[i] == pytest.approx(one.time_s)  # type: ignore[index]
            assert vector.sent_bytes[i] == one.sent_bytes  # type: ignore[index]
            assert vector.steps[i] == one.steps  # type: ignore[index]
        flat = collective_cost(op, [Tier(4, NVLINK)], 2**20)
        assert vector.time_s[1] == pytest.approx(flat.time_s)  # type: ignore[index]
        assert vector.sent_bytes[1] == flat.sent_bytes  # type: ignore[index]


def test_exact_integer_logarithms() -> None:
    values = [*range(1, 70), 2**40 - 1, 2**40, 2**40 + 1]
    array = np.array(values, dtype=np.int64)
    assert ceil_log2(array).tolist() == [ceil_log2(v) for v in values]  # type: ignore[union-attr]
    assert floor_log2(array).tolist() == [floor_log2(v) for v in values]  # type: ignore[union-attr]
    assert [ceil_log2(v) for v in (1, 2, 3, 4, 5)] == [0, 1, 2, 2, 3]
    assert [floor_log2(v) for v in (1, 2, 3, 4, 5)] == [0, 1, 1, 2, 2]


def test_a_hierarchical_broadcast_delivers_the_tensor_once_to_each_rank():
    """Across the domains' leaders, then inside each domain: every rank receives S once,
    a leader in the first stage and the others in the second (it read 2S received: an
    audit); a leader forwards it in both, so the busiest rank sends 2S."""
    from budget.collectives import Link, Tier, collective_cost

    nvlink, ib = Link("nvlink", 450e9, 3e-6), Link("ib", 50e9, 14e-6)
    cost = collective_cost("broadcast", (Tier(8, nvlink), Tier(4, ib)), 2**30, "hierarchical")
    assert (cost.recv_bytes, cost.sent_bytes) == (2**30, 2 * 2**30)


def test_a_plan_that_names_hierarchical_gets_it_across_nodes(tmp_path) -> None:
    """`collectives: {reduce-scatter: hierarchical}` was dropped at resolve when it was the
    default across levels; now that the ring is, gemma2-9b's dp group (2 ranks in each of
    8 nodes) runs the two-level decomposition it names, the report and search
    alike (a review)."""
    from budget.pipeline import budget_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gemma2-9b.yaml"
    named = variant(
        tmp_path,
        "h.yaml",
        (
            "topology: {preset: dgx-h100, nodes: 8}",
            "collectives: {reduce-scatter: hierarchical, all-gather: hierarchical}\n"
            "topology: {preset: dgx-h100, nodes: 8}",
        ),
        base=base,
    )
    rows = {
        path.name: [c for p in budget_plan(path).phases for c in p.collectives if c.group == "dp"]
        for path in (base, named)
    }
    assert {c.algorithm for c in rows["gemma2-9b.yaml"]} == {"ring"}
    assert {c.algorithm for c in rows["h.yaml"]} == {"hierarchical"}


def test_a_flat_algorithm_across_levels_never_slows_with_a_faster_link():
    """A binomial tree over 16 ranks on two 8-GPU PCIe nodes (32 GB/s, 10 µs) joined by
    InfiniBand (5 µs): 2·⌈lg 16⌉ = 8 steps of the whole tensor, Q = 8 · S. Every step is
    priced at the lowest bandwidth and the highest α spanned, 8·10 µs + Q / min(B), so a
    faster InfiniBand never makes it slower. Priced at the slowest link's own α, InfiniBand
    at 25 GB/s took 8·5 µs + Q/25 GB/s = 60.97 µs and at 50 GB/s, no longer the slowest,
    8·10 µs + Q/32 GB/s = 96.38 µs (an audit)."""
    pcie, size = Link("pcie", 32e9, 10e-6), 65_536
    times = []
    for rate in (10e9, 25e9, 50e9, 400e9):
        ib = Link("infiniband", rate, 5e-6)
        cost = collective_cost("all-reduce", [Tier(8, pcie), Tier(2, ib)], size, "tree")
        assert cost.steps == 8 and cost.payload_bytes == 8 * size
        assert float(cost.time_s) == pytest.approx(8 * 10e-6 + 8 * size / min(rate, 32e9))
        times.append(float(cost.time_s))
    assert times == sorted(times, reverse=True)
    # a sweep prices each configuration as it would alone: one node (PCIe alone, its own
    # α), two nodes (both levels: PCIe's α, the lower rate), one rank a node (InfiniBand)
    ib = Link("infiniband", 25e9, 5e-6)
    inner, outer = np.array([8, 8, 1]), np.array([1, 2, 16])
    swept = collective_cost("all-reduce", [Tier(inner, pcie), Tier(outer, ib)], size, "tree")
    for i in range(3):
        alone = collective_cost(
            "all-reduce", [Tier(int(inner[i]), pcie), Tier(int(outer[i]), ib)], size, "tree"
        )
        assert float(np.asarray(swept.time_s)[i]) == pytest.approx(float(alone.time_s))


def test_a_double_tree_of_two_ranks_moves_the_tensor_once() -> None:
    """Two ranks in a double binary tree are each the root of one tree and the leaf of the
    other: a rank sends its half up one tree (S/2) and the other half down the other (S/2),
    S in all, as each end of a chain does; only a rank inside a tree or a chain moves 2S.
    1 GiB over two nodes on IB: 2 steps (2 lg 2) at 5 us, S / (0.92 x 50 GB/s) =
    1,073,741,824 / 46e9 s = 23,342.214 us; in one node on NVLink, 2 steps at 1 us and
    1,073,741,824 / (0.92 x 450e9) s = 2,593.579 us."""
    across = collective_cost("all-reduce", [Tier(1, NVLINK), Tier(2, IB)], GIB, "double-tree")
    assert (across.steps, across.sent_bytes, across.recv_bytes) == (2, GIB, GIB)
    assert across.time_s * 1e6 == pytest.approx(10.0 + 23_342.214, abs=5e-4)
    chain = collective_cost("all-reduce", [Tier(2, NVLINK)], GIB, "double-tree")
    assert (chain.steps, chain.sent_bytes) == (2, GIB)
    assert chain.time_s * 1e6 == pytest.approx(2.0 + 2_593.579, abs=5e-4)
    three = collective_cost("all-reduce", [Tier(3, NVLINK)], 3 * GIB, "double-tree")
    assert three.sent_bytes == 6 * GIB  # the middle of a chain of three sends 2S


def test_a_ring_across_levels_of_different_rates_runs_at_its_slowest_hop() -> None:
    """A review: 8 nodes of one rank, in two rail groups of 4 at 50 GB/s behind a 12.5 GB/s
    spine. A ring through the 8 crosses the spine at 2 of its 8 hops and the rails alone at
    6, so a rank's 7/8 GiB = 939,524,096 B averages 704,643,072 B over the rails and
    234,881,024 B over the spine; but the two ranks whose hop crosses the spine send all of
    theirs over it, and a pipelined ring runs at its slowest hop's pace: 939,524,096 B /
    12.5e9 B/s = 75,161.928 us. The averages summed read 14,092.861 + 18,790.482 =
    32,883.343 us, and the ring looked faster than the two-level form (26.9 ms), which it is
    not. Latency: 6 steps at 5 us and 1 at 10 us."""
    tiers = [
        Tier(1, NVLINK),
        Tier(4, Link("rail", 50e9, 5e-6)),
        Tier(2, Link("spine", 12.5e9, 1e-5)),
    ]
    ring = collective_cost("reduce-scatter", tiers, GIB)
    assert [s.sent_bytes for s in ring.stages] == [0, 704_643_072, 234_881_024]
    assert ring.bandwidth_s * 1e6 == pytest.approx(939_524_096 / 12.5e9 * 1e6)
    assert ring.time_s * 1e6 == pytest.approx(40.0 + 75_161.928, abs=5e-4)
    # at one rate the outer levels' bytes add up as before: a sum at that rate
    even = [Tier(1, NVLINK), Tier(4, Link("rail", 50e9, 5e-6)), Tier(2, Link("spine", 50e9, 1e-5))]
    assert collective_cost("reduce-scatter", even, GIB).bandwidth_s == pytest.approx(
        939_524_096 / 50e9
    )


def test_hierarchical_over_one_level_and_one_it_passes_through_is_a_ring() -> None:
    """Four ranks, one in each of four nodes, span NVLink only to leave through it: the
    two-level decomposition is the InfiniBand ring, priced so, and now said so (an audit,
    m535: "hierarchical" in the JSON where the table and `budget collective` said ring).
    Two ranks a node keep the name, in a sweep too where every layout has two levels."""
    nvlink, ib = Link("nvlink", 450e9, 3e-6), Link("infiniband", 47e9, 14e-6)
    size = 96 * 2**20
    passed = collective_cost("reduce-scatter", [Tier(1, nvlink), Tier(4, ib)], size, "hierarchical")
    ring = collective_cost("reduce-scatter", [Tier(1, nvlink), Tier(4, ib)], size, "ring")
    assert passed.algorithm == "ring" and passed.steps == 3
    assert float(passed.time_s) == pytest.approx(float(ring.time_s))
    assert float(passed.time_s) == pytest.approx(3 * 14e-6 + 3 / 4 * size / 47e9, rel=1e-3)
    two = collective_cost("reduce-scatter", [Tier(2, nvlink), Tier(4, ib)], size, "hierarchical")
    assert two.algorithm == "hierarchical"
    swept = [Tier(np.array([2, 4]), nvlink), Tier(np.array([4, 2]), ib)]
    assert collective_cost("reduce-scatter", swept, size, "hierarchical").algorithm == (
        "hierarchical"
    )
