"""An audit of collective pricing across levels, each finding checked by hand.

1. A flat algorithm named for a group across levels (``all-reduce: tree``) is priced at the
   slowest level holding more than one of its ranks, not at a node's fabric the group only
   passes through, and the collective's link, α and B_eff are its used levels' (the sweep
   counted only levels of more than one rank already: search and budget disagreed).
2. An all-to-all across levels is NCCL's grouped send/recv with every peer at once
   (nccl-tests src/alltoall.cu; torch ``all2all_single_equal_split``), not Tutel's
   two-level exchange.
3. Two levels of one name: the sweep places a group's ranks by level, not by name.
4. NCCL's ring all-reduce counts 2·nNodes network steps (src/graph/tuning.cc at b647562).
5. A broadcast across levels is NCCL's ring, the only algorithm NCCL runs it with.
"""

from __future__ import annotations

import numpy as np
import pytest

from budget.catalog.topologies import TOPOLOGIES
from budget.collectives import Link, Tier, collective_cost
from budget.errors import BudgetError
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Level, Parallel, Topology
from budget.search import Config, apply, evaluate
from budget.topology import group_span, price_group
from tests.plan_files import ROOT, variant

MIB = 2**20
GIB = 2**30


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def _preset_links(name: str) -> tuple[Link, ...]:
    return tuple(
        Link(spec.name, spec.bandwidth, spec.latency, ramp=spec.ramp)
        for spec in TOPOLOGIES[name].levels
    )


def _budgets_as_searched(plan_path, configs: list[Config]) -> None:  # type: ignore[no-untyped-def]
    """Each configuration's step time from one pass of the sweep (`evaluate`, every
    configuration's ranks as arrays) equals `budget`'s for the same layout."""
    plan = load_plan(plan_path)
    gpus = plan.topology.gpus
    for result in evaluate(plan, configs, gpus):
        report = build_report(apply(plan, result.config, gpus))
        assert report.worst.peak_bytes == result.peak_bytes, result.config
        assert _relative(report.step["time_s"], result.step_time_s) < 1e-9, result.config
        assert _relative(report.step["exposed_comm_s"], result.exposed_comm_s) < 1e-9


# ----------------------------------------------------------------------------- finding 1

PCIE_IB = """topology:
  gpus: 1024
  levels:
    - {name: pcie, size: 8, bandwidth: 20 GB/s, latency: 5 us}
    - {name: ib, bandwidth: 24 GB/s, latency: 14 us}
collectives: {all-reduce: tree}"""


def _pcie_ib(tmp_path):  # type: ignore[no-untyped-def]
    return variant(
        tmp_path,
        "pcie-ib.yaml",
        ("topology: {preset: dgx-a100, nodes: 128}", PCIE_IB),
        ("  pp: 8\n", "  pp: 16\n"),
        ("  dp: 16\n", "  dp: 8\n"),
        ("  zero: 1\n", "  zero: 0\n"),
    )


def test_a_named_tree_over_one_rank_per_node_is_priced_on_the_network(tmp_path) -> None:
    """GPT-3 175B at tp 8, pp 16, dp 8, ZeRO 0 on 8-GPU nodes of PCIe (20 GB/s, 5 us) and
    InfiniBand (24 GB/s, 14 us), ``all-reduce: tree``: the dp group holds one rank in each
    of 8 nodes, and reduces the fp32 gradients of one stage, S = 5,853,081,600 B. The
    binomial tree (Thakur 2005 sec. 4.1): n = 2·lg 8 = 6 steps, Q = 2·lg 8·S = 6S, all on
    InfiniBand:

        T = 6 x 14 us + 6 x 5,853,081,600 / 24e9 s = 84 us + 1.4632704 s = 1.4633544 s

    where PCIe's 6 x 5 us + 6S / 20e9 = 1.7559545 s was priced (the fabric the all-reduce
    adds under a group of one rank per node, `price_group`, carries none of it)."""
    plan = load_plan(_pcie_ib(tmp_path))
    report = build_report(plan)
    grads = next(
        c for p in report.phases for c in p.collectives if c.name == "gradients" and c.group == "dp"
    )
    assert grads.bytes == 5_853_081_600
    assert (grads.algorithm, grads.steps, grads.link) == ("tree", 6, "ib")
    assert (grads.alpha_s, grads.bandwidth_Bps) == (14e-6, 24e9)
    assert grads.time_s == pytest.approx(6 * 14e-6 + 6 * 5_853_081_600 / 24e9, rel=1e-12)
    assert grads.time_s == pytest.approx(1.4633544, rel=1e-9)


def test_the_default_ring_row_names_the_alpha_and_rate_of_the_link_it_runs_on() -> None:
    """The same dp group (one rank in each of 8 nodes) under the default all-reduce: the
    fabric's stage takes no step and moves no byte, so the collective's link is
    InfiniBand, with its α and rate (the row said ib beside PCIe's 5 us and 20 GB/s). NCCL's
    ring: 2 x 7 = 14 steps, all on IB (2 x nNodes = 16 capped at 14), 2 x 7/8 x S."""
    topology = Topology(
        1024,
        (
            Level("pcie", 20e9, 5e-6, 8),
            Level("ib", 24e9, 14e-6),
        ),
    )
    span = group_span("dp", Parallel(tp=8, pp=16, dp=8), topology)
    assert [(t.ranks, t.link.name) for t in span.tiers] == [(8, "ib")]
    assert span.counts == (1, 8)
    size = 5_853_081_600
    ring = price_group("all-reduce", size, span, dtype="fp32")
    assert ring.algorithm == "ring"
    assert [(s.link.name, s.steps) for s in ring.stages] == [("pcie", 0), ("ib", 14)]
    assert (ring.link.name, ring.link.latency, ring.reached_bandwidth) == ("ib", 14e-6, 24e9)
    assert ring.time_s == pytest.approx(14 * 14e-6 + 2 * 7 * (size // 8) / 24e9, rel=1e-12)
    tree = price_group("all-reduce", size, span, "tree", dtype="fp32")
    assert (tree.link.name, tree.steps) == ("ib", 6)
    assert tree.time_s == pytest.approx(1.4633544, rel=1e-9)


def test_the_sweep_prices_the_pcie_and_infiniband_plan_as_budget_does(tmp_path) -> None:
    """The plan of the finding and the layouts the sweep ranks beside it (dp x cp = 8), in
    one pass: each as `budget` prices it (60.090 s against 60.388 s before, in the audit's
    tree of the code)."""
    path = _pcie_ib(tmp_path)
    configs = [
        Config(8, 16, dp, 8 // dp, 1, 0, True, "selective", 1, 1)  # type: ignore[arg-type]
        for dp in (8, 4, 2, 1)
    ]
    _budgets_as_searched(path, configs)


def test_a_flat_algorithm_over_arrays_takes_each_configurations_slowest_spanned_level() -> None:
    """In a sweep, each configuration's group spans its own levels: the flat algorithm is
    priced on the slowest of them with more than one rank, as one configuration alone is
    (`collectives._flat_across`); a group of one rank moves nothing."""
    pcie, ib = Link("pcie", 20e9, 5e-6), Link("ib", 24e9, 14e-6)
    inner, outer = np.array([8, 1, 2, 1]), np.array([1, 8, 4, 1])
    swept = collective_cost("all-reduce", [Tier(inner, pcie), Tier(outer, ib)], GIB, "tree")
    for i, (a, b) in enumerate(zip(inner.tolist(), outer.tolist(), strict=True)):
        alone = collective_cost("all-reduce", [Tier(a, pcie), Tier(b, ib)], GIB, "tree")
        assert float(swept.time_s[i]) == pytest.approx(float(alone.time_s), rel=1e-12)
        assert int(swept.steps[i]) == int(alone.steps)
    # by hand: 8 ranks on PCIe alone: 6 x 5 us + 6 x 2^30 / 20e9; 8 on IB: 6 x 14 us +
    # 6 x 2^30 / 24e9; 2 x 4 on both: PCIe's rate, the lower of the two, and IB's α, the
    # higher (each step may cross either); one rank: nothing
    expected = [
        30e-6 + 6 * GIB / 20e9,
        84e-6 + 6 * GIB / 24e9,
        84e-6 + 6 * GIB / 20e9,
        0.0,
    ]
    assert swept.time_s == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- finding 2


def test_mixtrals_dispatch_sends_to_every_peer_at_once() -> None:
    """Mixtral 8x7B's MoE dispatch (plans/mixtral-8x7b.yaml): ep 8 as 4 + 4 ranks on two
    DGX H100s (NVLink 370 GB/s at 3 us, InfiniBand 47 GB/s per GPU at 14 us), S = 256 MiB,
    so each rank holds 32 MiB and sends b = S / 8² = 4 MiB to each of its 7 peers, all at
    once (one ncclGroupStart/End of ncclSend and ncclRecv: nccl-tests src/alltoall.cu):
    3 peers in its node over NVLink, 12 MiB, and 4 in the other over its InfiniBand port,
    16 MiB, beside each other. The latency keeps the flat exchange's 7 steps, each at its
    peer's link's α:

        T = 3 x 3 us + 4 x 14 us + max(12 MiB / 370e9, 16 MiB / 47e9)
          = 65 us + max(34.008 us, 356.962 us) = 421.962 us

    The two-level exchange (Tutel's 2DH), now only when named ``hierarchical``, relays
    24 MiB inside the node first: 3 x 3 us + 24 MiB / 370e9 + 14 us + 16 MiB / 47e9 =
    447.978 us. (The audit proposed one α, 14 us + 356.962 us = 370.962 us; that would price
    a group on one level, which keeps the flat exchange's 7 steps, on another footing.)"""
    nvlink, ib = _preset_links("dgx-h100")
    assert (nvlink.bandwidth, nvlink.latency, ib.bandwidth, ib.latency) == (
        370e9,
        3e-6,
        47e9,
        14e-6,
    )
    tiers = [Tier(4, nvlink), Tier(2, ib)]
    cost = collective_cost("all-to-all", tiers, 256 * MIB, element_bytes=2)
    assert (cost.algorithm, cost.pipelined) == ("pairwise", True)
    assert [(s.link.name, s.steps, s.sent_bytes) for s in cost.stages] == [
        ("nvlink", 3, 12 * MIB),
        ("infiniband", 4, 16 * MIB),
    ]
    assert cost.sent_bytes == cost.recv_bytes == 7 * 4 * MIB
    assert cost.aggregate_sent_bytes == 8 * 7 * 4 * MIB  # every rank's 7 blocks
    assert cost.latency_s == pytest.approx(3 * 3e-6 + 4 * 14e-6, rel=1e-12)
    assert cost.bandwidth_s == pytest.approx(16 * MIB / 47e9, rel=1e-12)
    assert cost.time_s * 1e6 == pytest.approx(421.962, abs=5e-4)
    named = collective_cost("all-to-all", tiers, 256 * MIB, "hierarchical", element_bytes=2)
    assert named.algorithm == "hierarchical"
    assert named.time_s * 1e6 == pytest.approx(447.978, abs=5e-4)
    assert named.time_s == pytest.approx(
        9e-6 + 24 * MIB / 370e9 + 14e-6 + 16 * MIB / 47e9, rel=1e-12
    )


def test_mixtrals_report_and_sweep_price_the_dispatch_so() -> None:
    """The shipped plan's dispatch row is the hand figure above, and the sweep prices the
    plan's layout and its neighbours (ep 8 inside one node at tp 1, across two at tp 2) as
    `budget` does: a group on one level is the flat exchange there, 7 steps."""
    path = ROOT / "plans" / "mixtral-8x7b.yaml"
    report = build_report(load_plan(path))
    dispatch = next(c for p in report.phases for c in p.collectives if c.name == "MoE dispatch")
    assert (dispatch.algorithm, dispatch.steps, dispatch.bytes) == ("pairwise", 7, 256 * MIB)
    assert dispatch.time_s * 1e6 == pytest.approx(421.962, abs=5e-4)
    configs = [
        Config(tp, 4, 64 // (4 * tp), 1, 8, 1, True, "selective", 1, 1)  # type: ignore[arg-type]
        for tp in (1, 2)
    ]
    _budgets_as_searched(path, configs)


def test_an_all_to_all_on_one_level_is_the_flat_pairwise_exchange() -> None:
    """With every level in (a sweep's form), a group on one level is the flat exchange on
    it (Thakur 2005 sec. 3.6: P − 1 steps of one block): 8 ranks in a node, 7 x 1 us +
    7 x 2^30/64 / 450e9; one rank in each of 8 nodes, 7 x 5 us + 7 x 2^30/64 / 50e9."""
    nvlink, ib = Link("nvlink", 450e9, 1e-6), Link("ib", 50e9, 5e-6)
    block = GIB // 64
    inside = collective_cost("all-to-all", [Tier(8, nvlink), Tier(1, ib)], GIB)
    assert inside.time_s == pytest.approx(7e-6 + 7 * block / 450e9, rel=1e-12)
    assert inside.time_s == pytest.approx(
        float(collective_cost("all-to-all", [Tier(8, nvlink)], GIB).time_s), rel=1e-12
    )
    spread = collective_cost("all-to-all", [Tier(1, nvlink), Tier(8, ib)], GIB)
    assert spread.time_s == pytest.approx(35e-6 + 7 * block / 50e9, rel=1e-12)
    assert spread.link == ib
    ranks = (np.array([8, 1, 4]), np.array([1, 8, 2]))
    swept = collective_cost("all-to-all", [Tier(ranks[0], nvlink), Tier(ranks[1], ib)], GIB)
    for i in range(3):
        alone = [Tier(int(ranks[0][i]), nvlink), Tier(int(ranks[1][i]), ib)]
        expected = float(collective_cost("all-to-all", alone, GIB).time_s)
        assert float(swept.time_s[i]) == pytest.approx(expected, rel=1e-12)


def test_an_all_to_all_over_three_levels_puts_each_peer_on_its_own_level() -> None:
    """64 ranks: 8 per node, 2 nodes per rail unit, 4 units (b = S / 64²): a rank has 7
    peers in its node, 8 in the other node of its unit (16 − 8) and 48 in other units
    (64 − 16). The rail's and the spine's blocks share the GPU's port: 56 blocks at 50 GB/s,
    beside 7 on NVLink."""
    nvlink = Link("nvlink", 450e9, 1e-6)
    rail, spine = Link("rail", 50e9, 5e-6), Link("spine", 50e9, 7e-6)
    cost = collective_cost("all-to-all", [Tier(8, nvlink), Tier(2, rail), Tier(4, spine)], GIB)
    block = GIB // 64**2
    assert [(s.steps, s.sent_bytes) for s in cost.stages] == [
        (7, 7 * block),
        (8, 8 * block),
        (48, 48 * block),
    ]
    assert cost.time_s == pytest.approx(7e-6 + 8 * 5e-6 + 48 * 7e-6 + 56 * block / 50e9, rel=1e-12)


def test_an_all_to_all_behind_a_slower_spine_waits_for_its_busiest_level_not_the_ring_pace():
    """One rank on each of 8 nodes, 4 nodes to a 50 GB/s leaf, 2 leaves behind a 25 GB/s
    spine; 64 MiB in bf16, so a block of 64 MiB / 8² = 1 MiB to each peer: 3 peers on the
    leaf and 4 over the spine, all in flight at once (NCCL's grouped send/recv). The port
    carries all 7 MiB at 50 GB/s, 146.8 µs; the spine its 4 MiB at 25 GB/s, 167.8 µs; the
    busier sets the time, beside 3 x 10 + 4 x 20 = 110 µs of latency: 277.8 µs. The ring's
    rule (every outer byte at the slowest outer rate, a ring's lockstep) read 7 MiB at
    25 GB/s, 293.6 µs, 403.6 µs in all (an audit). Raising the spine's rate leaves the port:
    7 MiB at 50 GB/s."""
    nvlink = Link("nvlink", 450e9, 3e-6)
    leaf, spine = Link("leaf", 50e9, 10e-6), Link("spine", 25e9, 20e-6)
    size = 64 * MIB
    cost = collective_cost("all-to-all", [Tier(1, nvlink), Tier(4, leaf), Tier(2, spine)], size)
    assert [(s.steps, s.sent_bytes) for s in cost.stages] == [(0, 0), (3, 3 * MIB), (4, 4 * MIB)]
    assert cost.latency_s == pytest.approx(110e-6, rel=1e-12)
    assert cost.bandwidth_s == pytest.approx(4 * MIB / 25e9, rel=1e-12)
    assert cost.time_s == pytest.approx(110e-6 + 4 * MIB / 25e9, rel=1e-12)
    fast = Link("spine", 1000e9, 20e-6)
    quick = collective_cost("all-to-all", [Tier(1, nvlink), Tier(4, leaf), Tier(2, fast)], size)
    assert quick.bandwidth_s == pytest.approx(7 * MIB / 50e9, rel=1e-12)
    # the same fabric in a sweep's arrays, priced one layout at a time alike
    swept = collective_cost(
        "all-to-all",
        [Tier(np.array([1, 1]), nvlink), Tier(np.array([4, 4]), leaf), Tier(2, spine)],
        np.array([size, 2 * size]),
    )
    assert swept.time_s[0] == pytest.approx(float(cost.time_s), rel=1e-12)
    assert swept.time_s[1] == pytest.approx(110e-6 + 8 * MIB / 25e9, rel=1e-12)


# ----------------------------------------------------------------------------- finding 3

DUPLICATE = """topology:
  gpus: 1024
  levels:
    - {name: nvlink, size: 8, bandwidth: 300 GB/s, latency: 3 us}
    - {name: ib, size: 64, bandwidth: 25 GB/s, latency: 10 us}
    - {name: ib, bandwidth: 12 GB/s, latency: 20 us}"""


def test_two_levels_of_one_name_are_refused_and_levels_are_placed_by_index(tmp_path) -> None:
    """Levels nvlink/8, ib/64 and ib: a pp group of GPT-3 at tp 8, pp 8 (stride 128) is
    one rank in each of 8 units of the outer ib; the sweep put it on the first level called
    ib (18.363 s against budget's 18.408 s at the code's revision before this audit). Two
    levels of one name are now refused where a plan's levels are resolved, and the sweep
    places a group's ranks by the level's index (`GroupSpan.counts`), not its name: with
    the outer level renamed, it is priced where budget prices it."""
    dup = variant(tmp_path, "dup.yaml", ("topology: {preset: dgx-a100, nodes: 128}", DUPLICATE))
    with pytest.raises(BudgetError) as refused:
        load_plan(dup)
    (problem,) = refused.value.problems
    assert problem.path == "$.topology.levels[2].name"
    assert "already levels[1]" in problem.message
    spine = DUPLICATE.replace("{name: ib, bandwidth: 12", "{name: spine, bandwidth: 12")
    path = variant(tmp_path, "spine.yaml", ("topology: {preset: dgx-a100, nodes: 128}", spine))
    plan = load_plan(path)
    span = group_span("pp", plan.parallel, plan.topology)
    assert span.counts == (1, 1, 8)
    assert [(t.ranks, t.link.bandwidth) for t in span.tiers] == [(8, 12e9)]
    configs = [
        Config(8, 8, dp, 16 // dp, 1, 1, True, "selective", 1, 1)  # type: ignore[arg-type]
        for dp in (16, 8)
    ]
    _budgets_as_searched(path, configs)


# ----------------------------------------------------------------------------- finding 4


def test_nccls_ring_all_reduce_crosses_the_network_twice_per_node() -> None:
    """Two DGX H100s (16 ranks; NVLink 3 us, InfiniBand 14 us): NCCL's tuning model
    (src/graph/tuning.cc at b647562) counts nsteps = 2(nRanks − 1) = 30, nInterSteps =
    2·nNodes = 4, so its ring's latency is 26 x 3 us + 4 x 14 us = 134 us (this counted
    2(nNodes − 1) = 2: 28 x 3 + 2 x 14 = 112 us). The bytes are unchanged: 2 x 15 x 2^30/16
    per rank, an eighth of it through the port."""
    nvlink, ib = Link("nvlink", 370e9, 3e-6), Link("ib", 47e9, 14e-6)
    ring = collective_cost("all-reduce", [Tier(8, nvlink), Tier(2, ib)], GIB, "ring")
    assert [(s.link.name, s.steps) for s in ring.stages] == [("nvlink", 26), ("ib", 4)]
    assert ring.latency_s * 1e6 == pytest.approx(134.0)
    q = 2 * 15 * GIB // 16
    assert [s.sent_bytes for s in ring.stages] == [q - q * 2 // 16, q * 2 // 16]


def test_the_ring_counts_2_n_at_every_level_and_never_more_than_its_steps() -> None:
    """2,048 ranks on three levels (8 per node, 32 nodes per rail unit, 8 units): of the
    2 x 2,047 = 4,094 steps, 2 x 256 = 512 leave a node and 2 x 8 = 16 of them a unit:
    3,582 on NVLink, 496 on the rails, 16 on the spine. One rank in each of 4 nodes: NCCL's
    2 x 4 = 8 exceeds the ring's 6 steps, all of which cross the network (NCCL's own count
    would leave −2 inside the nodes). The all-gather keeps nNodes − 1."""
    nvlink = Link("nvlink", 450e9, 1e-6)
    rail, spine = Link("rail", 50e9, 5e-6), Link("spine", 50e9, 7e-6)
    three = [Tier(8, nvlink), Tier(32, rail), Tier(8, spine)]
    ring = collective_cost("all-reduce", three, GIB, "ring")
    assert [s.steps for s in ring.stages] == [3582, 496, 16]
    alone = collective_cost("all-reduce", [Tier(1, nvlink), Tier(4, rail)], GIB, "ring")
    assert [s.steps for s in alone.stages] == [0, 6]
    gather = collective_cost("all-gather", three, GIB)
    assert [s.steps for s in gather.stages] == [2047 - 255, 255 - 7, 7]
    swept = collective_cost(
        "all-reduce", [Tier(np.array([8, 1]), nvlink), Tier(np.array([2, 4]), rail)], GIB, "ring"
    )
    assert [s.steps.tolist() for s in swept.stages] == [[26, 0], [4, 6]]


# ----------------------------------------------------------------------------- finding 5


def test_a_broadcast_across_nodes_is_nccls_ring() -> None:
    """NCCL runs a broadcast as a ring only (tuning.cc at b647562 skips every other
    algorithm for it): a chain from the root through all 32 ranks of 4 nodes x 8, the
    root's S = 1 GiB streaming through every rank. Its 31 pipeline-fill steps cross nodes
    3 times (nNodes − 1), and the channels spread the node crossings over the node's 8
    ports, so each rank's port carries S x 4/32 = 134,217,728 B and NVLink the other
    939,524,096 B, beside it:

        T = 28 x 1 us + 3 x 5 us + max(939,524,096 / 450e9, 134,217,728 / 50e9)
          = 43 us + max(2,087.831 us, 2,684.355 us) = 2,727.355 us

    where the two chains one after the other (named ``hierarchical``) take 23,882.929 us.
    Each rank receives the tensor once; P − 1 = 31 of them do."""
    nvlink, ib = Link("nvlink", 450e9, 1e-6), Link("ib", 50e9, 5e-6)
    tiers = [Tier(8, nvlink), Tier(4, ib)]
    cost = collective_cost("broadcast", tiers, GIB)
    assert (cost.algorithm, cost.pipelined) == ("ring", True)
    assert [(s.link.name, s.steps, s.sent_bytes) for s in cost.stages] == [
        ("nvlink", 28, 939_524_096),
        ("ib", 3, 134_217_728),
    ]
    assert cost.recv_bytes == GIB and cost.aggregate_recv_bytes == 31 * GIB
    assert cost.time_s * 1e6 == pytest.approx(2727.355, abs=5e-4)
    assert cost.time_s == pytest.approx(43e-6 + 134_217_728 / 50e9, rel=1e-12)
    # on one level (every level in, as a sweep has them), the flat chain: 7 steps, S
    flat = collective_cost("broadcast", [Tier(8, nvlink)], GIB)
    both = collective_cost("broadcast", [Tier(8, nvlink), Tier(1, ib)], GIB)
    assert both.time_s == pytest.approx(float(flat.time_s), rel=1e-12)
    assert both.time_s == pytest.approx(7e-6 + GIB / 450e9, rel=1e-12)
    swept = collective_cost(
        "broadcast", [Tier(np.array([8, 8, 1]), nvlink), Tier(np.array([4, 1, 4]), ib)], GIB
    )
    for i, (a, b) in enumerate([(8, 4), (8, 1), (1, 4)]):
        alone = collective_cost("broadcast", [Tier(a, nvlink), Tier(b, ib)], GIB)
        assert float(swept.time_s[i]) == pytest.approx(float(alone.time_s), rel=1e-12)


# ----------------------------------------------------------------------------- audit m502


def test_a_pair_on_two_leaves_leaves_through_its_leaf_as_a_pair_inside_one_does() -> None:
    """Two ranks, one on each of two leaves shared by 4 GPUs (12.5 GB/s a GPU) behind a
    50 GB/s spine, all-reduce 1 GiB: the ring's one hop each way climbs from the GPU's
    port through its leaf, so it runs at 12.5 GB/s as it would inside one leaf: 2 steps of
    5 µs and 1 GiB at 12.5 GB/s, 85,909.346 µs. The leaf had been skipped for carrying no
    hop of its own, and the pair ran at the spine's 50 GB/s, 21,484.8 µs (an audit, m502).
    The flat algorithms and a send/recv take the same path."""
    nvlink = Link("nvlink", 450e9, 3e-6)
    leaf, spine = Link("leaf", 12.5e9, 5e-6), Link("spine", 50e9, 5e-6)
    apart = [Tier(1, nvlink), Tier(1, leaf), Tier(2, spine)]
    together = [Tier(1, nvlink), Tier(2, leaf), Tier(1, spine)]
    hand = 2 * 5e-6 + GIB / 12.5e9
    # the two-level sum too: its step across the spine leaves through the leaf (a review, m506)
    for algorithm in (None, "ring", "recursive", "hierarchical"):
        cost = collective_cost("all-reduce", apart, GIB, algorithm)
        assert float(cost.time_s) == pytest.approx(hand, rel=1e-12), algorithm
        inside = collective_cost("all-reduce", together, GIB, algorithm)
        assert float(inside.time_s) == pytest.approx(hand, rel=1e-12), algorithm
    ring = collective_cost("all-reduce", apart, GIB, "ring")
    assert ring.links == ("leaf", "spine")  # named: the leaf paces it
    assert ring.link.name == "leaf"
    sent = collective_cost("send-recv", apart, GIB)
    assert float(sent.time_s) == pytest.approx(5e-6 + GIB / 12.5e9, rel=1e-12)
    # a spine slower than the leaf paces the pair instead; a level past the pair does not
    slow = collective_cost("all-reduce", [Tier(1, nvlink), Tier(1, leaf), Tier(2, spine)], GIB)
    assert float(slow.bandwidth_s) == pytest.approx(GIB / 12.5e9, rel=1e-12)
    beyond = [Tier(1, nvlink), Tier(2, Link("leaf", 50e9, 5e-6)), Tier(1, Link("s", 1e9, 9e-6))]
    assert float(collective_cost("all-reduce", beyond, GIB).bandwidth_s) == pytest.approx(
        GIB / 50e9, rel=1e-12
    )
    # in a sweep's arrays, each configuration alike
    swept = collective_cost(
        "all-reduce",
        [
            Tier(np.array([1, 1]), nvlink),
            Tier(np.array([1, 2]), leaf),
            Tier(np.array([2, 1]), spine),
        ],
        GIB,
        "recursive",
    )
    assert swept.time_s == pytest.approx([hand, hand], rel=1e-12)


LEAVES = """name: leaves
mode: train
model: {preset: llama3-8b, attention: flash2}
batch: {seq: 4096, micro: 1, global: 4}
parallel: {tp: 8, dp: 2, pp: 2, order: [tp, cp, ep, pp, dp]}
device: {preset: h100-sxm}
topology:
  gpus: 32
  levels:
    - {name: nvlink, size: 8, bandwidth: 450 GB/s, latency: 3 us}
    - {name: leaf, size: LEAF, bandwidth: 50 GB/s, latency: 5 us, shared_by: 4}
    - {name: spine, bandwidth: 50 GB/s, latency: 5 us}
"""


def _leaves(tmp_path, leaf: int):  # type: ignore[no-untyped-def]
    path = tmp_path / f"leaves-{leaf}.yaml"
    path.write_text(LEAVES.replace("LEAF", str(leaf)), encoding="utf-8")
    return path


def _rows(report, op: str, group: str):  # type: ignore[no-untyped-def]
    return [
        c
        for phase in report.phases
        for c in phase.collectives
        if c.op == op and c.group.startswith(group)
    ]


def test_a_plans_data_parallel_pair_across_two_leaves_runs_at_the_leafs_rate(tmp_path) -> None:
    """Llama 3 8B at tp 8, pp 2, dp 2 on 32 GPUs, dp outermost: the two data-parallel ranks
    of a stage sit 16 ranks apart, so on two leaves of 16 GPUs, and on one leaf of 32.
    Either way a rank's gradients leave through its leaf port, 12.5 GB/s a GPU (50 shared
    by 4), and the all-reduce takes as long (it took a quarter of it across the spine: an
    audit, m502). The sweep prices the layout as `budget` does."""
    apart = build_report(load_plan(_leaves(tmp_path, 16)))
    inside = build_report(load_plan(_leaves(tmp_path, 32)))
    (far,), (near,) = _rows(apart, "all-reduce", "dp"), _rows(inside, "all-reduce", "dp")
    assert far.link == "leaf + spine" and near.link == "leaf"
    assert far.time_s == pytest.approx(near.time_s, rel=1e-12)
    # a ring of two: each rank sends S once, 2 steps
    assert far.time_s == pytest.approx(2 * 5e-6 + far.sent_bytes / 12.5e9, rel=1e-12)
    configs = [Config(8, 2, 2, 1, 1, 1, False, "none", 1, 1)]  # type: ignore[arg-type]
    _budgets_as_searched(_leaves(tmp_path, 16), configs)


def test_a_stages_send_across_the_spine_leaves_through_its_leaf(tmp_path) -> None:
    """The same cluster with pp outermost: the stages' activations go 16 ranks on, across
    the spine, one step of S through the leaf port at 12.5 GB/s (it read the spine's 50)."""
    text = LEAVES.replace("LEAF", "16").replace("[tp, cp, ep, pp, dp]", "[tp, cp, ep, dp, pp]")
    path = tmp_path / "sends.yaml"
    path.write_text(text, encoding="utf-8")
    report = build_report(load_plan(path))
    sends = _rows(report, "send-recv", "pp")
    assert sends
    for row in sends:
        assert row.link == "leaf"  # a flat step's one link: the slowest it passes through
        assert row.time_s == pytest.approx(5e-6 + row.bytes / 12.5e9, rel=1e-12)
    configs = [Config(8, 2, 2, 1, 1, 1, False, "none", 1, 1)]  # type: ignore[arg-type]
    _budgets_as_searched(path, configs)
