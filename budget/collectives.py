"""Collective algorithms priced on links: phases n, bytes per rank, T = n·α + Q/B_eff.

Every algorithm is reduced to the latency-bandwidth ("Hockney") model used by Thakur,
Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 19(1), 2005 (hereafter *Thakur 2005*): a step that moves m bytes between two ranks
costs α + m·β with β = 1/B. For one algorithm on one link::

    T = n·α + Q / B_eff

n is the number of latency-bearing steps, Q the bytes serialised through the busiest rank's
link on the critical path, and B_eff the per-GPU bandwidth of the link divided by how many
GPUs share it (`Link.shared_by`). The reduction arithmetic (Thakur's γ term) is not modelled.

Conventions (DESIGN.md rule 3):

* S (``size_bytes``) is always the full logical tensor: the gathered output of an
  all-gather, the input of a reduce-scatter / all-reduce, the root's buffer of a broadcast,
  the message of a send/recv, and for an all-to-all the whole tensor being redistributed,
  so each rank holds S/P and sends (P−1)/P² · S of it.
* Bytes are integers. A tensor that does not split evenly is split into equal chunks of
  ``ceil(S / (P·e))`` elements of e bytes (``element_bytes``) — the padded chunk every rank
  must be able to hold; the busiest rank moves whole padded chunks. So the byte counts are
  exact when S divides evenly and a tight upper bound (< one element per chunk) otherwise.
* ``sent_bytes`` / ``recv_bytes`` are per rank, for the busiest rank (identical on every rank
  for the symmetric algorithms). ``group_sent_bytes`` / ``group_recv_bytes`` sum one
  instance over all its ranks: aggregate bytes, which are never divided by a link's
  bandwidth.

Sizes and rank counts may be Python ``int`` or numpy integer arrays (one element per
configuration of a sweep); the arithmetic is branch-free on them so the same functions price
one plan or a million. Only ``auto`` needs scalars, because it chooses one algorithm.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Literal, TypeAlias, cast, get_args

import numpy as np
from numpy.typing import NDArray

from budget.plan.model import BandwidthRamp
from budget.vector import holds, largest, ratio, vmax, vmin, vwhere

__all__ = [
    "ALGORITHMS",
    "LEVELLED_RING_OPS",
    "OPS",
    "TREE_SHARE",
    "Algorithm",
    "CollectiveCost",
    "Count",
    "Known",
    "Link",
    "Op",
    "Seconds",
    "Stage",
    "Tier",
    "algorithm_bytes",
    "applicable_algorithms",
    "bus_bandwidth_factor",
    "collective_cost",
    "default_algorithm",
    "exchange_loads",
    "flat_stage",
    "link_terms",
    "repeated",
    "shared_pace",
    "slowness",
]

Op = Literal["all-gather", "reduce-scatter", "all-reduce", "all-to-all", "broadcast", "send-recv"]
Algorithm = Literal[
    "ring", "recursive", "tree", "pairwise", "bruck", "direct", "hierarchical", "double-tree"
]
Count: TypeAlias = int | NDArray[Any]  # bytes or ranks: an int, or an int array over configurations
Seconds: TypeAlias = float | NDArray[Any]

OPS: Final[tuple[Op, ...]] = get_args(Op)

# The flat (single-link) algorithms each op can use, default first.
ALGORITHMS: Final[dict[Op, tuple[Algorithm, ...]]] = {
    "all-gather": ("ring", "recursive", "bruck"),
    "reduce-scatter": ("ring", "recursive"),
    "all-reduce": ("ring", "recursive", "tree"),
    "all-to-all": ("pairwise", "bruck"),
    "broadcast": ("ring", "tree"),
    "send-recv": ("direct",),
}
# Ops NCCL runs as one ring through every rank of a group, whichever levels it spans: its
# tuning model prices such a ring at one bus bandwidth with each step at its own link's
# latency (`_ring_across`). NCCL runs a broadcast as a ring only (``ncclTopoTuneModel``,
# src/graph/tuning.cc of NVIDIA/nccl at b647562: ``if (coll == ncclFuncBroadcast && a !=
# NCCL_ALGO_RING) continue;``), a chain from the root streaming through every rank.
LEVELLED_RING_OPS: Final[tuple[Op, ...]] = (
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "broadcast",
)
# NCCL's double binary tree reaches this share of the bus bandwidth its ring reaches on the
# same channels: ``busBw = std::min(busBw*.92, nChannels*perChMaxTreeBw)`` for the tree in
# ``ncclTopoTuneModel`` (src/graph/tuning.cc of NVIDIA/nccl at b647562; the per-channel cap,
# 36-41 GB/s on Hopper, binds only above the network rates here).
TREE_SHARE: Final[float] = 0.92
# ...and NCCL corrects the tree's bandwidth at medium sizes by a measured factor: "Trees are
# not perfectly sticking to the model for medium sizes" (``treeCorrectionFactor``, same file,
# the Simple protocol's row, one entry per power of two of S from 64 B, the last for 256 to
# 512 MiB: index ⌊lg(S / 64)⌋; none below 64 B or from 512 MiB).
TREE_CORRECTION: Final[tuple[float, ...]] = (
    0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5,
    0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9,
)  # fmt: skip
# Names accepted for an op that mean one of its algorithms (rule 3's "ring" row).
ALIASES: Final[dict[tuple[Op, str], Algorithm]] = {
    ("all-to-all", "ring"): "pairwise",  # the ring-offset pairwise exchange: step k sends to i+k
    ("send-recv", "ring"): "direct",
}


@dataclass(frozen=True, slots=True)
class Link:
    """One kind of link, as seen by one GPU: bandwidth one direction, latency per step.

    ``shared_by`` GPUs share one such link (e.g. 2 GPUs per NIC); each then gets
    ``bandwidth / shared_by``. Bandwidth is per GPU already, so concurrent groups that each
    use their own GPU's link do not divide it further.
    """

    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    latency: float  # seconds per latency-bearing step (α)
    shared_by: int = 1
    ramp: BandwidthRamp | None = None  # measured share of B_eff by message size

    @property
    def effective_bandwidth(self) -> float:
        """B_eff = bandwidth / shared_by (the contention rule of DESIGN.md rule 5)."""
        return self.bandwidth / self.shared_by

    def bandwidth_at(self, op: Op, size_bytes: Count) -> Seconds:
        """B_eff reached by an ``op`` of ``size_bytes``: the plateau times the link's measured
        share at that size (`BandwidthRamp`); the plateau on a link without a ramp."""
        if self.ramp is None:
            return self.effective_bandwidth
        return cast(Seconds, self.effective_bandwidth * self.ramp.share(op, size_bytes))


@dataclass(frozen=True, slots=True)
class Tier:
    """``ranks`` members (or sub-groups) of a group talking over ``link``; innermost first."""

    ranks: Count
    link: Link


@dataclass(frozen=True, slots=True)
class Stage:
    """One flat algorithm on one link: the piece of a collective that T = n·α + Q/B prices.

    ``instances`` is how many copies of this stage run concurrently inside the collective
    (e.g. one intra-node reduce-scatter per node); it scales only the aggregate bytes.
    """

    op: Op
    algorithm: Algorithm
    ranks: Count
    size_bytes: Count
    steps: Count
    sent_bytes: Count
    recv_bytes: Count
    payload_bytes: Count  # Q: bytes through the busiest rank's link on the critical path
    group_sent_bytes: Count
    group_recv_bytes: Count
    link: Link
    instances: Count = 1
    # the share of the link's rate this algorithm reaches beside the ring's (NCCL's double
    # binary tree: `TREE_SHARE`); 1 for every other stage
    efficiency: Seconds = 1.0
    # the collective whose measured bandwidth ramp this stage reads: its own op, or the
    # collective it is one level of (NCCL runs a one-node all-reduce as one, not as a
    # reduce-scatter and an all-gather; a decomposition with one rank outside must agree)
    ramp_op: Op | None = None

    @property
    def latency_s(self) -> Seconds:
        """The latency term n·α."""
        return self.steps * self.link.latency

    @property
    def effective_bandwidth(self) -> Seconds:
        """B_eff this stage reaches: the link's plateau, ramped by the stage's size S, times
        the algorithm's share of it (`Stage.efficiency`)."""
        return self.link.bandwidth_at(self.ramp_op or self.op, self.size_bytes) * self.efficiency

    @property
    def bandwidth_s(self) -> Seconds:
        """The bandwidth term Q / B_eff, B_eff at this stage's size (`Link.bandwidth_at`)."""
        return self.payload_bytes / self.effective_bandwidth

    @property
    def time_s(self) -> Seconds:
        """T = n·α + Q / B_eff (Thakur 2005, section 2; the seed's communication model)."""
        return self.latency_s + self.bandwidth_s


# a stage's figures that a sweep holds an entry of for each configuration
_ARRAY_FIELDS = tuple(
    f for f in fields(Stage) if f.name not in ("op", "algorithm", "link", "ramp_op")
)


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """A priced collective: its stages (one for a flat algorithm, one per level otherwise).

    Per-rank quantities sum the stages (every rank takes part in each stage of the
    hierarchical forms, so this is the busiest rank's total); ``aggregate_*_bytes`` sum over
    every rank of the whole group. ``candidates`` lists (algorithm, time) when ``auto``
    chose among them. ``pipelined``: the stages are one ring's hops on each level
    (`_ring_across`), whose bytes stream through every level at once, so the bandwidth term
    is the busiest port's, not the stages' sum (the latency terms still add up).
    """

    op: Op
    algorithm: Algorithm
    ranks: Count
    size_bytes: Count
    stages: tuple[Stage, ...]
    candidates: tuple[tuple[Algorithm, float], ...] = ()
    pipelined: bool = False

    @property
    def steps(self) -> Count:
        return sum((s.steps for s in self.stages), start=0)

    @property
    def sent_bytes(self) -> Count:
        return sum((s.sent_bytes for s in self.stages), start=0)

    @property
    def recv_bytes(self) -> Count:
        """The busiest rank's received bytes, its stages' together; a hierarchical
        broadcast's ranks each receive the tensor once, in the across stage (the domains'
        leaders) or the inside one (the rest), not in both (it read 2S: an audit). A ring
        broadcast across levels splits the one copy each rank receives over its levels
        (`_ring_across`), so its stages add up."""
        if self.op == "broadcast" and not self.pipelined:
            return cast(Count, largest([cast(int, s.recv_bytes) for s in self.stages]))
        return sum((s.recv_bytes for s in self.stages), start=0)

    @property
    def payload_bytes(self) -> Count:
        return sum((s.payload_bytes for s in self.stages), start=0)

    @property
    def aggregate_sent_bytes(self) -> Count:
        return sum((s.instances * s.group_sent_bytes for s in self.stages), start=0)

    @property
    def aggregate_recv_bytes(self) -> Count:
        return sum((s.instances * s.group_recv_bytes for s in self.stages), start=0)

    @property
    def latency_s(self) -> Seconds:
        return sum((s.latency_s for s in self.stages), start=0.0)

    @property
    def bandwidth_s(self) -> Seconds:
        """The stages' Q/B_eff summed; for a ring across levels, the innermost level's (the
        GPUs' own fabric) or the outer levels' together, whichever is longer: every outer
        level is reached through the GPU's one network port, which serialises them, while
        the inner fabric carries its hops beside it (`_ring_across`). The outer levels'
        bytes are a rank's share of the ring's hops over each, averaged over the ranks; but a
        port whose node's hop out crosses level k carries all its port's bytes over level
        k, and the ring runs at its slowest hop's pace: the outer bytes together at the
        slowest outer level's rate (a review: 8 nodes in two rail groups of 4 behind a
        12.5 GB/s spine, a 1 GiB reduce-scatter averaged 672 MiB over the rails and 224 MiB
        over the spine, 32.9 ms, where the two ranks whose hop crosses the spine send their
        896 MiB over it, 75.2 ms). Where the outer levels run at one rate, as in every
        topology preset, this is their sum. An all-to-all has no ring to pace it: its blocks
        go to every peer at once (`_exchange_across`), so its port is `_exchange_ports`'."""
        if not self.pipelined:
            return sum((s.bandwidth_s for s in self.stages), start=0.0)
        inner, *outer = self.stages
        if self.op == "all-to-all":
            return cast(Seconds, vmax(cast(Any, inner.bandwidth_s), _exchange_ports(outer)))
        carried: Any = sum((s.payload_bytes for s in outer), start=0)
        # the slowest rate among the outer levels the ring's hops cross or pass through: a
        # hop over level k leaves through the GPU's port and each switch tier below k, as an
        # all-to-all's blocks do (`_exchange_ports`), so a leaf no hop stays inside still
        # paces the hops that climb past it (an audit, m502: a pair on two leaves shared by
        # 4 GPUs each took the spine's whole 50 GB/s, 4 times the leaf's 12.5, and all-reduced
        # faster than a pair inside one leaf); a level beyond every hop sets no pace
        rates: list[Any] = []
        reached: Any = False
        for stage in reversed(outer):
            reached = reached | holds(stage.payload_bytes > 0)
            rates.append(vwhere(reached, cast(Any, stage.effective_bandwidth), math.inf))
        ports = carried / functools.reduce(vmin, rates) if outer else 0.0
        return cast(Seconds, vmax(cast(Any, inner.bandwidth_s), ports))

    @property
    def time_s(self) -> Seconds:
        return self.latency_s + self.bandwidth_s

    @property
    def link(self) -> Link:
        """The slowest link the collective uses (lowest B_eff, then highest α): of the
        stages that take a step or move a byte (`used`), so that a level the group only
        passes through (a node's fabric under one rank, `topology.price_group`) is not
        named for it; the innermost stage's link when none does (a group of one rank). It
        took every stage's, and a report named PCIe for an all-reduce run on InfiniBand
        (an audit)."""
        return _slowest(s.link for s in self._used_stages)

    @property
    def reached_bandwidth(self) -> float:
        """B_eff the collective reaches on its slowest link at its size (the least of that
        link's used stages; the plateau on a link without a ramp). Scalar sizes only."""
        stages = self._used_stages  # once: a report asks each collective (review of m502's)
        link = _slowest(s.link for s in stages)
        return min(float(s.effective_bandwidth) for s in stages if s.link == link)

    @property
    def _used_stages(self) -> tuple[Stage, ...]:
        """The stages that take a step or move a byte, or the first when none does; of a ring
        across levels, a network level below the outermost one its hops cross too, which
        they leave through and which may pace them (`bandwidth_s`)."""
        return self._passed or self.stages[:1]

    @property
    def _passed(self) -> tuple[Stage, ...]:
        """`_used_stages` without the fallback: none where nothing moves."""
        stages = self.stages
        marks = [used(s) for s in stages]
        if self.pipelined and True in marks:  # the levels below the outermost one used
            last = len(marks) - 1 - marks[::-1].index(True)
            marks[1:last] = [True] * max(last - 1, 0)
        return tuple(s for s, mark in zip(stages, marks, strict=True) if mark)

    @property
    def links(self) -> tuple[str, ...]:
        """Names of the links used, innermost first, without repeats: a level a group only
        passes through (no step, no byte: a node's fabric under one rank) is not one, but a
        network level its hops leave through on their way out is (`_used_stages`)."""
        return tuple(dict.fromkeys(s.link.name for s in self._passed))

    @property
    def algorithm_bandwidth(self) -> Seconds:
        """algbw = size / time, size as nccl-tests counts it (`algorithm_bytes`)."""
        return _ratio(algorithm_bytes(self.op, self.size_bytes, self.ranks), self.time_s)

    @property
    def bus_bandwidth(self) -> Seconds:
        """busbw = algbw × `bus_bandwidth_factor` (nccl-tests doc/PERFORMANCE.md)."""
        return self.algorithm_bandwidth * bus_bandwidth_factor(self.op, self.ranks)


# ----------------------------------------------------------------------------- bandwidths


def bus_bandwidth_factor(op: Op, ranks: Count) -> Seconds:
    """nccl-tests' busbw / algbw: all-reduce 2(n−1)/n; all-gather, reduce-scatter and
    all-to-all (n−1)/n; broadcast and send/recv 1 (NVIDIA/nccl-tests, doc/PERFORMANCE.md).

    With these factors, busbw equals the per-rank bytes a ring moves divided by its time,
    i.e. the link bandwidth when α = 0.
    """
    p = ranks
    if op == "all-reduce":
        return 2 * (p - 1) / p
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (p - 1) / p
    if op in ("broadcast", "send-recv"):
        return p * 0 + 1.0
    raise ValueError(_unknown_op(op))


def algorithm_bytes(op: Op, size_bytes: Count, ranks: Count) -> Seconds:
    """The "size" nccl-tests divides by time for algbw: S for every op except all-to-all,
    whose size is one rank's buffer, S/P (nccl-tests alltoall_perf counts per-rank buffers).
    """
    if op == "all-to-all":
        return size_bytes / ranks
    return size_bytes * 1.0


# ----------------------------------------------------------------------------- algorithms


def default_algorithm(op: Op) -> Algorithm:
    """The documented default: ring (pairwise all-to-all, direct send/recv) as in DESIGN.md
    rule 3's table, on one level and across levels alike: across levels the ops NCCL runs
    as one ring over every rank of a group (`LEVELLED_RING_OPS`: the all-gather,
    reduce-scatter, all-reduce and broadcast) are
    that ring (`_ring_across`; an unnamed all-reduce takes NCCL's tree where faster,
    `_nccl_all_reduce`), and the all-to-all NCCL's grouped exchange with every peer at
    once (`_exchange_across`). Across levels the all-to-all and the broadcast took the
    two-level decomposition (`_hierarchical`), which NCCL does not run for either (an
    audit); a plan still names it as ``hierarchical``."""
    _check_op(op)
    return ALGORITHMS[op][0]


def applicable_algorithms(op: Op, tiers: int = 1) -> tuple[Algorithm, ...]:
    """Algorithms `collective_cost` accepts for ``op`` (``auto`` picks among these)."""
    _check_op(op)
    flat = ALGORITHMS[op]
    if tiers > 1 and op == "all-reduce":
        return (flat[0], "double-tree", "hierarchical", *flat[1:])
    if tiers > 1 and op != "send-recv":
        return (flat[0], "hierarchical", *flat[1:])
    return flat


def flat_stage(
    op: Op,
    algorithm: Algorithm,
    ranks: Count,
    size_bytes: Count,
    link: Link,
    *,
    element_bytes: int = 1,
    instances: Count = 1,
) -> Stage:
    """Price one flat algorithm of ``ranks`` ranks on one link. Formulas (P ranks, S bytes,
    c = ceil(S/(P·e))·e the padded chunk, L = ⌈lg P⌉), from Thakur 2005 unless noted:

    * all-gather ring: n = P−1, Q = (P−1)·c (sec. 3.1). Recursive doubling (P a power of
      two): n = lg P, same bytes (sec. 3.1). Bruck (any P): n = L, same bytes (sec. 3.1;
      Bruck et al. 1997).
    * reduce-scatter ring: n = P−1, Q = (P−1)·c. Recursive halving (P a power of two):
      n = lg P, same bytes (sec. 4.2).
    * all-reduce ring: n = 2(P−1), Q = 2(P−1)·c (reduce-scatter + all-gather; Patarasuk &
      Yuan 2009). Rabenseifner (recursive halving + doubling, sec. 4.4): n = 2 lg P,
      Q = 2(P−1)·c; for P not a power of two MPICH first folds the r = P − p′ extra ranks
      into partners (p′ = 2^⌊lg P⌋) and sends them the result at the end, MPICH's
      "(2⌊lg p⌋+2)·α + (2(p−1)/p + 2)·n·β", here with p′ and c′ = ceil(S/(p′·e))·e:
      n = 2⌊lg P⌋ + 2, Q = 2(p′−1)·c′ + 2S. Binomial tree (reduce then broadcast, sec. 4.1):
      n = 2L, Q = 2L·S.
    * all-to-all pairwise exchange: n = P−1, each step one block b = ceil(S/(P²·e))·e, so
      Q = (P−1)·b (sec. 3.6, DESIGN.md rule 3). Bruck: n = L, step k sends the blocks whose
      index has bit k set, Q = b·Σ_k #{j < P : bit k of j set} ≈ (S/P)/2·L (sec. 3.6).
    * broadcast ring: a pipelined chain as NCCL runs it, n = P−1 (pipeline fill), Q = S — the
      root's whole buffer leaves through one link, so busbw = algbw (nccl-tests
      doc/PERFORMANCE.md, "Broadcast"). Binomial tree: n = L, Q = L·S (sec. 3.2, short
      messages).
    * send/recv direct: n = 1, Q = S; in a chain of P ranks each interior rank sends S and
      receives S.
    """
    _check_op(op)
    p, s, e = ranks, size_bytes, element_bytes
    one = _indicator(p > 1)
    base = _Pricing(op, algorithm, p, s, link, instances)
    if op in ("all-gather", "reduce-scatter"):
        sent = (p - 1) * _chunk(s, p, e)
        if algorithm == "ring":
            steps = p - 1
        elif algorithm == "recursive":
            _require_power_of_two(op, p)
            steps = floor_log2(p)
        elif algorithm == "bruck" and op == "all-gather":
            steps = ceil_log2(p)
        else:
            raise ValueError(_not_applicable(op, algorithm))
        return base.symmetric(steps, sent)
    if op == "all-reduce":
        if algorithm == "ring":
            sent = 2 * (p - 1) * _chunk(s, p, e)
            return base.symmetric(2 * (p - 1), sent)
        if algorithm == "recursive":
            lg = floor_log2(p)
            p2 = 2**lg
            extra = _indicator(p > p2)
            core = 2 * (p2 - 1) * _chunk(s, p2, e)
            per_rank = core + extra * s
            group = p2 * core + 2 * (p - p2) * s
            return base.priced(
                steps=2 * lg + 2 * extra,
                sent=per_rank,
                recv=per_rank,
                payload=core + 2 * extra * s,  # the partner receives S first, sends S last
                group=group,
            )
        if algorithm == "tree":
            lg = ceil_log2(p)
            group = 2 * (p - 1) * s
            return base.priced(
                steps=2 * lg, sent=lg * s, recv=lg * s, payload=2 * lg * s, group=group
            )
        raise ValueError(_not_applicable(op, algorithm))
    if op == "all-to-all":
        block = _chunk(s, p * p, e)
        if algorithm == "pairwise":
            return base.symmetric(p - 1, (p - 1) * block)
        if algorithm == "bruck":
            blocks = _bruck_blocks(p)
            return base.symmetric(ceil_log2(p), blocks * block)
        raise ValueError(_not_applicable(op, algorithm))
    if op == "broadcast":
        group = (p - 1) * s
        if algorithm == "ring":
            return base.priced(
                steps=p - 1, sent=one * s, recv=one * s, payload=one * s, group=group
            )
        if algorithm == "tree":
            lg = ceil_log2(p)
            return base.priced(steps=lg, sent=lg * s, recv=one * s, payload=lg * s, group=group)
        raise ValueError(_not_applicable(op, algorithm))
    if algorithm == "direct":  # send-recv
        group = (p - 1) * s
        return base.priced(steps=one, sent=one * s, recv=one * s, payload=one * s, group=group)
    raise ValueError(_not_applicable(op, algorithm))


def collective_cost(
    op: Op,
    tiers: Sequence[Tier],
    size_bytes: Count,
    algorithm: Algorithm | Literal["auto"] | None = None,
    *,
    element_bytes: int = 1,
    levelled: bool = True,
) -> CollectiveCost:
    """Price ``op`` over a group laid out as ``tiers`` (innermost first; ranks multiply).
    ``levelled=False`` prices a ring (or an all-to-all) across levels at its slowest link
    instead: an exchange between neighbours, step by step, whose one hop across a node goes
    through one GPU's port (ring attention's K/V), not NCCL's channels spread over every
    port.

    * One tier: the flat algorithm (default ring; pairwise all-to-all) on that tier's link.
    * Several tiers, ``ring`` for an all-gather, reduce-scatter, all-reduce or broadcast
      (the default for all but the all-reduce): one ring through every rank, as NCCL runs
      it (`_ring_across`).
    * Several tiers, ``double-tree`` for an all-reduce: NCCL's double binary tree
      (`_tree_across`). An all-reduce across levels takes by default whichever of the ring
      and the tree is faster at its size, as NCCL's tuner chooses between them
      (`_nccl_all_reduce`).
    * Several tiers, ``pairwise`` (the default) for an all-to-all: NCCL's grouped exchange
      with every peer at once, each level carrying the blocks for the peers it reaches
      (`_exchange_across`).
    * Several tiers, ``hierarchical`` when named: the two-level decomposition, applied
      recursively per level with ring inside each level — NCCL's and MPICH's SMP-aware
      collectives (Thakur 2005, sec. 5; NCCL's tuning model). With G ranks per inner
      domain and D = P/G domains:

      - all-reduce: reduce-scatter inside (G, S) → all-reduce across the D domains on
        S/G → all-gather inside (G, S);
      - reduce-scatter: reduce-scatter inside (G, S) → reduce-scatter across on S/G;
      - all-gather: all-gather across on S/G → all-gather inside (G, S);
      - all-to-all: all-to-all inside on the blocks bound for each peer's local index,
        then across between ranks of equal local index (Tutel's 2DH exchange: same
        slow-link bytes as the flat exchange, D−1 instead of P−1 slow steps);
      - broadcast: across the domains from the root, then inside each domain.
      send/recv has no hierarchical form: it is priced flat on the slowest link.
    * Several tiers and another flat algorithm: that algorithm over all P ranks, every step
      priced at the slowest link spanned, of the tiers holding more than one rank, and at
      the largest α among them (`_flat_across`).
    * ``auto``: every applicable algorithm, the fastest wins; ``candidates`` keeps them all.
      Needs scalar sizes and ranks.
    """
    _check_op(op)
    if not tiers:
        raise ValueError("a collective needs at least one level")
    _check_sizes(size_bytes, [t.ranks for t in tiers], element_bytes)
    if algorithm == "auto":
        return _auto(op, tiers, size_bytes, element_bytes)
    if algorithm is None and op == "all-reduce" and len(tiers) > 1 and levelled:
        return _nccl_all_reduce(tuple(tiers), size_bytes, element_bytes)
    algo = _resolve(op, algorithm)
    ranks = _product([t.ranks for t in tiers])
    if algo == "double-tree":  # inside one node, the chain NCCL runs there (`_tree_across`)
        tree = _tree_across(tuple(tiers), size_bytes, element_bytes)
        return CollectiveCost(op, algo, ranks, size_bytes, tree, pipelined=True)
    if algo == "hierarchical":
        # on one level (others it passes through hold one rank of it) it is that level's
        # ring, and says so (an audit, m535: tp over 4 nodes, one rank each, read
        # "hierarchical" in the JSON where the table and `budget collective` said ring)
        # (a sweep's tiers hold arrays: the label is one, so every layout must agree)
        if np.all(sum(np.asarray(t.ranks) > 1 for t in tiers) <= 1):
            algo = default_algorithm(op)
        else:
            pieces = _hierarchical(op, tuple(tiers), size_bytes, element_bytes, 1)
            stages = [replace(stage, ramp_op=op) for stage in pieces]
            return CollectiveCost(op, "hierarchical", ranks, size_bytes, tuple(stages))
    if len(tiers) > 1 and levelled:
        if algo == "ring" and op in LEVELLED_RING_OPS:
            hops = _ring_across(op, tuple(tiers), size_bytes, element_bytes)
            return CollectiveCost(op, "ring", ranks, size_bytes, hops, pipelined=True)
        if algo == "pairwise" and op == "all-to-all":
            sends = _exchange_across(tuple(tiers), size_bytes, element_bytes)
            return CollectiveCost(op, "pairwise", ranks, size_bytes, sends, pipelined=True)
    flat = _flat_across(op, algo, tuple(tiers), size_bytes, element_bytes)
    return CollectiveCost(op, algo, ranks, size_bytes, flat)


def _flat_across(
    op: Op, algorithm: Algorithm, tiers: tuple[Tier, ...], size: Count, e: int
) -> tuple[Stage, ...]:
    """A flat algorithm over all P ranks of a group, every step at the slowest link it
    spans (Thakur 2005's formulas, `flat_stage`, on that link), and at the largest α of the
    links it spans: the slowest of the tiers holding more than one rank, the innermost where
    none does (a group of one rank). A step of a flat algorithm may cross any level the
    group spans, so pricing each at the lowest bandwidth and the highest α bounds it, and a
    faster link can only make it faster; priced at the slowest link's own α, a 16-rank tree
    over 8-GPU PCIe nodes (10 µs) and InfiniBand (5 µs) took 61 µs and, with InfiniBand
    twice as fast and so no longer the slowest, 96 µs (an audit). The innermost tier of
    one rank is a fabric the group does not use (a node's, under an all-reduce of one rank
    per node, `topology.price_group`) and sets no step's price: it did, and a tree
    all-reduce of 8 nodes over 20 GB/s PCIe fabrics and 24 GB/s InfiniBand was priced at
    PCIe's rate and α (an audit). A network tier of one rank below one the group spans is
    spanned all the same: a step to a peer across the spine leaves through the GPU's port
    and its leaf (`_exchange_ports`; an audit, m502: a pair on two leaves shared by 4 GPUs
    each was priced at the spine's 50 GB/s). With ranks that differ between the
    configurations of a sweep, each takes its own slowest level and its own largest α: one
    stage per pair of levels, counted where that pair is the one spanned (the sweep's
    `search._Pricer`)."""
    p = _product([t.ranks for t in tiers])
    if not any(isinstance(t.ranks, np.ndarray) for t in tiers):
        reach = max((k for k, t in enumerate(tiers) if t.ranks > 1), default=0)
        spanned = [t.link for k, t in enumerate(tiers) if t.ranks > 1 or 0 < k < reach]
        link = spanned_link(spanned or [tiers[0].link])
        return (flat_stage(op, algorithm, p, size, link, element_bytes=e),)
    spans: list[Any] = [None] * len(tiers)  # whether each configuration spans each level
    beyond: Any = np.zeros(np.shape(p), dtype=bool)  # a level past this one is spanned
    for level in reversed(range(len(tiers))):
        own = np.asarray(tiers[level].ranks) > 1
        spans[level] = own | beyond if level > 0 else own
        beyond = beyond | own
    slowest = np.zeros(np.shape(p), dtype=np.int64)  # one rank: the innermost level, no step
    by_speed = sorted(range(len(tiers)), key=lambda i: slowness(tiers[i].link))
    for level in reversed(by_speed):  # fastest first: a slower level spanned overrides
        slowest = np.where(spans[level], level, slowest)
    latest = np.zeros(np.shape(p), dtype=np.int64)  # the level of the largest α spanned
    by_latency = sorted(range(len(tiers)), key=lambda i: tiers[i].link.latency)
    for level in by_latency:  # the lowest α first: a larger α spanned overrides
        latest = np.where(spans[level], level, latest)
    stages = []
    for (level, tier), (other, alpha) in itertools.product(enumerate(tiers), repeat=2):
        mask = ((slowest == level) & (latest == other)).astype(np.int64)
        if not mask.any():
            continue
        link = _with_latency(tier.link, max(tier.link.latency, alpha.link.latency))
        stages.append(_times(flat_stage(op, algorithm, p, size, link, element_bytes=e), mask))
    return tuple(stages)


def _times(stage: Stage, factor: Count) -> Stage:
    """`stage` `factor` times over: its steps and bytes multiplied, its size (which its
    bandwidth ramp reads) as it is; 0 where a sweep's configuration lacks it."""
    return replace(
        stage,
        steps=stage.steps * factor,
        sent_bytes=stage.sent_bytes * factor,
        recv_bytes=stage.recv_bytes * factor,
        payload_bytes=stage.payload_bytes * factor,
        group_sent_bytes=stage.group_sent_bytes * factor,
        group_recv_bytes=stage.group_recv_bytes * factor,
    )


def _ring_across(op: Op, tiers: tuple[Tier, ...], size: Count, e: int) -> tuple[Stage, ...]:
    """One ring through all P ranks of a group that spans levels, as NCCL runs an
    all-gather, reduce-scatter, all-reduce or broadcast across nodes: one stage per level,
    holding the ring's hops on that level.

    NCCL's tuning model (``ncclTopoTuneModel``, src/graph/tuning.cc of NVIDIA/nccl at
    b647562) prices such a ring at one bus bandwidth, its channels' inter-node rate, and its
    latency as ``(nsteps - nInterSteps) · intraLat + nInterSteps · interLat`` with
    ``nInterSteps = coll == ncclFuncAllReduce ? (nNodes > 1 ? 2*nNodes : 0) : ... nNodes-1``
    for the all-gather and reduce-scatter: 2·nNodes network steps of an all-reduce's
    2(nRanks - 1), nNodes - 1 of the others' nRanks - 1. Here, with G ranks of the group in
    each innermost domain (a node) and N_k the domains of level k - 1 it spans (N_1 = P / G
    nodes):

    * every rank sends the flat ring's Q (2(P-1)·c for an all-reduce, (P-1)·c for the
      all-gather and reduce-scatter, c the padded chunk: `flat_stage`; S for a broadcast,
      whose chain relays the root's whole buffer through every rank);
    * each channel's ring crosses a level-k boundary N_k times in its P hops, and NCCL
      spreads its channels over the node's network ports, so a rank's port carries Q·x_k/P,
      x_k the hops whose outermost boundary is level k, and its own fabric the rest;
    * the latency-bearing steps split the same way: of an all-reduce's 2(P - 1), 2·N_k
      cross level k or beyond, as NCCL counts them (it counted 2(nNodes - 1) in earlier
      versions, as this did: an audit), but never more than all 2(P - 1): with one rank
      in each node NCCL's count leaves -2 steps inside the nodes, here 0; of the others'
      P - 1 (a broadcast's P - 1 pipeline-fill steps, `flat_stage`), N_k - 1. The rest stay
      on the innermost link.

    The bytes stream through every level at once (`CollectiveCost.bandwidth_s`), so a ring
    across nodes reaches G times one port's rate when the ports bind: 8 x 24 = 192 GB/s of
    bus bandwidth between DGX A100s, which NCCL's maintainers measure ("On an Nvidia
    DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW",
    NVIDIA/nccl issue 812), and 4 x 24 = 96 GB/s with four HDR NICs to eight A100s
    (NVIDIA/nccl-tests issue 119: "peak performance reaches about 96GB/s"). The two-level
    decomposition (`_hierarchical`) summed one after the other read 146 GB/s for two DGX
    A100s. A broadcast so reaches G times one port's rate too (nccl-tests counts its bus
    bandwidth as S / t, doc/PERFORMANCE.md); as the two-level chain, node leaders first and
    then inside each node, it was priced at one port's rate, the two chains one after the
    other (an audit: NCCL runs no other broadcast).
    """
    per = 2 if op == "all-reduce" else 1
    p = _product([t.ranks for t in tiers])
    # each rank's bytes: the flat ring's, or a broadcast's whole buffer, which every rank relays
    q = size * _indicator(p > 1) if op == "broadcast" else per * (p - 1) * _chunk(size, p, e)
    spans = _spans(tiers)

    def crossing(k: int) -> Count:  # the steps crossing level k's boundary or beyond
        if k == 0:
            return per * (p - 1)
        if k >= len(tiers):
            return 0
        if op == "all-reduce":
            return _minimum(2 * spans[k] * _indicator(spans[k] > 1), 2 * (p - 1))
        return spans[k] - 1

    steps = [crossing(k) - crossing(k + 1) for k in range(len(tiers))]
    stages = _across(op, "ring", tiers, size, q, steps)
    if op != "broadcast":
        return stages
    # P − 1 ranks receive the tensor, as the flat chain counts them: each level's share of
    # it on P − 1 ranks, which sums to (P − 1)·S over the levels
    return tuple(
        replace(s, group_sent_bytes=(p - 1) * s.sent_bytes, group_recv_bytes=(p - 1) * s.sent_bytes)
        for s in stages
    )


def _exchange_across(tiers: tuple[Tier, ...], size: Count, e: int) -> tuple[Stage, ...]:
    """An all-to-all over a group that spans levels, as NCCL runs it: one grouped send and
    receive with every peer (``ncclGroupStart``; ``ncclSend`` and ``ncclRecv`` to each rank;
    ``ncclGroupEnd``: NVIDIA/nccl-tests src/alltoall.cu, and PyTorch's
    ``all_to_all_single``, torch/csrc/cuda/nccl.cpp ``all2all_single_equal_split``, which
    Megatron-Core's MoE token dispatcher calls through megatron/core/tensor_parallel/
    mappings.py ``_AllToAll``). NCCL orders the peers as the ring-offset pairwise exchange
    does (``comm->p2pSchedule``, src/init.cc: round k sends to rank + k and receives from
    rank − k) but schedules every round of the group into one plan over its channels ("Try
    to use all channels, but one channel per operation", src/enqueue.cc
    ``scheduleP2pTasksToPlan``), so the rounds' bytes are in flight together. With P
    ranks, b = ceil(S/(P²·e))·e the block a rank sends each peer (`flat_stage`'s pairwise
    exchange) and N_k the domains of level k − 1 the group spans (`_spans`), a rank reaches
    P − P/N_k of its peers over level k or beyond, so level k carries

        peers_k = (P − P/N_k) − (P − P/N_(k+1)),  Q_k = peers_k · b,  n_k = peers_k

    (level 0, the node's fabric: the P/N_1 − 1 peers in its node). The fabric carries its
    blocks beside the network, where the outer levels' blocks share the GPU's one port and
    each switch tier on their way (`_exchange_ports`): the busier of the two sets the time.
    The latency keeps the flat exchange's P − 1 steps (`flat_stage`: DESIGN.md rule 3's
    pairwise default), each at the α of the link its peer is reached over, so that a group
    on one level is the flat exchange, as a sweep prices it with every level; NCCL
    overlaps the rounds' latencies too, which the flat exchange does not model either.
    This replaces the two-level exchange (Tutel's 2DH, `_hierarchical`), which relays the
    blocks inside the node first and so moves (G − 1)·D blocks over the fabric where NCCL
    moves G − 1, in series with the network's (an audit)."""
    p = _product([t.ranks for t in tiers])
    spans = _spans(tiers)
    block = _chunk(size, p * p, e)

    def beyond(k: int) -> Count:  # the peers reached over level k or beyond
        if k >= len(tiers):
            return 0
        return p - p // spans[k]

    stages = []
    for k, tier in enumerate(tiers):
        peers = beyond(k) - beyond(k + 1)
        stage = _Pricing("all-to-all", "pairwise", p, size, tier.link, 1).symmetric(
            peers, peers * block
        )
        stages.append(replace(stage, ramp_op="all-to-all"))
    return tuple(stages)


def _exchange_ports(outer: list[Stage]) -> Any:
    """Seconds the network takes to carry an all-to-all's blocks beyond a rank's node
    (`_exchange_across`'s outer stages, level 1 outward). Its blocks to peers on every
    level are in flight together (NCCL schedules all the rounds of a grouped send/recv at
    once), so no level waits on another's pace, as a ring's hops do; but a block bound for
    a peer beyond level k crosses level k too (the GPU's one port, then each switch tier up
    to where the peer is reached), and a level's rate is what one GPU gets through it. So
    level k carries Q_k + Q_(k+1) + ... at its rate, and the busiest level sets the time:

        max over k ≥ 1 of (Σ_(j ≥ k) Q_j) / B_k

    (an audit: one rank on each of 8 nodes, 4 to a 50 GB/s leaf behind a 25 GB/s spine,
    64 MiB in bf16: 3 blocks of 1 MiB to leaf peers and 4 over the spine, 7 MiB through
    the port at 50 GB/s, 146.8 µs, and 4 MiB over the spine at 25, 167.8 µs; the ring's
    rule, every outer byte at the slowest rate, read 293.6 µs). Where the outer levels run
    at one rate it is their bytes together at that rate, as before."""
    time: Any = 0.0
    for carried, stage in exchange_loads(outer):
        time = vmax(time, carried / stage.effective_bandwidth)
    return time


def exchange_loads(outer: Sequence[Stage]) -> list[tuple[Any, Stage]]:
    """(bytes, stage) for each outer level of an all-to-all across levels: the bytes it
    carries, the blocks bound for peers on it or past it (`_exchange_ports`)."""
    loads, beyond = [], cast(Any, 0)
    for stage in reversed(outer):
        beyond = beyond + stage.payload_bytes
        loads.append((beyond, stage))
    return loads[::-1]


def _tree_across(tiers: tuple[Tier, ...], size: Count, e: int) -> tuple[Stage, ...]:
    """NCCL's double binary tree all-reduce over a group that spans levels (Sanders, Speck
    & Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and scan",
    Parallel Computing 35(12), 2009; NCCL 2.4): inside each innermost domain (a node) the
    G ranks form a chain, and the nodes two binary trees, each reducing and then
    broadcasting half of the tensor. NCCL's tuning model (``ncclTopoTuneModel``,
    src/graph/tuning.cc of NVIDIA/nccl at b647562) prices it as

        latency  2 · ((nRanks/nNodes − 1) · intraLat + log2i(nNodes) · interLat)
        time     latency + S / (0.5 · busBw_tree),  busBw_tree = 0.92 · busBw

    with busBw the channels' rate its ring also reaches, and then (``ncclTopoGetAlgoTime``)
    the tree's bandwidth times a measured correction for medium sizes (`TREE_CORRECTION`:
    0.5 from 128 KiB to 2 MiB). Here: 2(G − 1) steps at the innermost link's α, and
    2·⌊lg N_k⌋ − 2·⌊lg N_(k+1)⌋ at level k's (N_k the domains of the level inside it that
    the group spans: a tree's hops between nearby nodes stay inside their rail group, the
    upper ones cross the spine); the busiest rank moves 2·P·c ≈ 2S (the reduction up and
    the broadcast down, a half through each tree: an inner node of one tree takes two
    halves from its children and sends one up, then one down to each child), but of two
    ranks each only S, a half up and a half down in each tree, as a chain's end does;
    split over the levels as the ring's bytes are (`_across`; where the outer levels differ
    in rate they go at the slowest one's, as a ring's do: a tree's top node puts more of
    them on the outermost, `CollectiveCost.bandwidth_s`), at `TREE_SHARE` times the
    correction of each link's rate. Inside one node (one level, or a group that spans one
    node) it is the chain NCCL runs there: 2(G − 1) steps, 2S at that share, always slower
    than the ring. Each step takes its link's α as the ring's do: NCCL's own table charges a
    tree step more under its Simple protocol (the latency of a 256 kB chunk), and a ring
    all-reduce across nodes 1.4 times its latency at its plateau, neither of which this
    does."""
    p = _product([t.ranks for t in tiers])
    # a group of one rank moves nothing; of two, no rank is inside a tree or a chain
    q = (2 - _indicator(p == 2)) * p * _chunk(size, p, e) * _indicator(p > 1)
    spans = _spans(tiers)
    steps = [2 * (tiers[0].ranks - 1)] + [
        2 * (floor_log2(spans[k]) - floor_log2(spans[k + 1])) for k in range(1, len(tiers))
    ]
    share = TREE_SHARE * _tree_correction(size)
    # over two nodes neither tree has an inner node: each node sends a half up and a half
    # down in each, S through its G ports, where an inner node sends 2S (an audit, m552: 2S
    # over two DGX A100s, the ring picked where the tree is 19 % faster; NCCL's tuner prices
    # the tree at the intra-node rate there, ``nNodes <= 2``, and Jeaugey, nccl-tests issue
    # 196: "On two nodes, NCCL uses the tree ... which can indeed go beyond the network
    # bottleneck"); a pair of ranks, one a node, moves S already
    halved = _indicator((spans[1] == 2) & (p > 2)) if len(tiers) > 1 else 0
    ported = q // (1 + halved)
    stages = _across("all-reduce", "double-tree", tiers, size, q, steps, share, ported)
    # all ranks together: each tree's P − 1 edges carry a half up and a half down, 2(P − 1)S
    # in all, where P times the busiest rank's 2S counted the leaves' as an inner node's (an
    # audit: 8 GiB for 6 at P = 4); of two ranks each moves S, 2S in all
    moving = p - 1 + _indicator(p == 2)
    # over two nodes the ports' half the busiest rank does not send is still each tree's
    # edges' (the chains' inside the nodes): the fabric's, so the group's 2(P − 1)S stays
    kept = q - sum((s.sent_bytes for s in stages), start=0)
    return tuple(
        replace(
            s,
            group_sent_bytes=(s.sent_bytes + kept * (k == 0)) * moving,
            group_recv_bytes=(s.sent_bytes + kept * (k == 0)) * moving,
        )
        for k, s in enumerate(stages)
    )


def _tree_correction(size: Count) -> Seconds:
    """`TREE_CORRECTION` at S bytes: entry ⌊lg(S / 64)⌋; 1 below 64 B and from 512 MiB."""
    index = floor_log2(size // 64 if isinstance(size, np.ndarray) else max(int(size) // 64, 1))
    table = TREE_CORRECTION
    if isinstance(index, np.ndarray):
        inside = (index < len(table)) & (size >= 64)
        return np.where(inside, np.asarray(table)[np.minimum(index, len(table) - 1)], 1.0)
    return table[index] if index < len(table) and size >= 64 else 1.0


def _nccl_all_reduce(tiers: tuple[Tier, ...], size: Count, e: int) -> CollectiveCost:
    """An all-reduce across levels as NCCL's tuner runs it: the ring (`_ring_across`) or the
    double binary tree (`_tree_across`), whichever its model finds faster at this size
    (``ncclTopoGetAlgoTime`` takes the least time over algorithms). The tree wins where the
    ring's 2(P − 1) latency-bearing steps outweigh the tree's lower rate (0.92 of the
    ring's, half that again at medium sizes by NCCL's correction) and its 2S against the
    ring's 2S(P − 1)/P: small tensors, and large groups. In a sweep each configuration takes
    its own; the name is the tree's where any does."""
    ranks = _product([t.ranks for t in tiers])
    ring = CollectiveCost(
        "all-reduce", "ring", ranks, size, _ring_across("all-reduce", tiers, size, e), (), True
    )
    tree = CollectiveCost(
        "all-reduce", "double-tree", ranks, size, _tree_across(tiers, size, e), (), True
    )
    ring_s, tree_s = ring.time_s, tree.time_s
    faster = tree_s < ring_s
    if not isinstance(faster, np.ndarray):
        return tree if faster else ring
    if not faster.any():
        return Known.of(ring, ring_s)
    stages = tuple(_choose(faster, t, r) for t, r in zip(tree.stages, ring.stages, strict=True))
    chosen = replace(tree, stages=stages)
    return Known.of(chosen, np.where(faster, tree_s, ring_s))


@dataclass(frozen=True, slots=True)
class Known(CollectiveCost):
    """A priced collective whose time, and bytes sent where given, are known already, for
    callers that read them again and again: a sweep's all-reduce keeps the time its choice
    of ring or tree compared (`_nccl_all_reduce`: the chosen stages' sum is the same
    number, element by element, and summing it again, its bandwidth ramps read once more,
    cost a sweep as much as the comparison), and a sweep's pass reuses one cost for many
    moves, spread from the configurations it was priced on to every one
    (`search._Pricer`)."""

    known_time: Any = 0.0
    known_sent: Any = None  # None: the stages' sum
    known_latency: Any = None  # None: the stages' sum
    # which of the stages' entries each configuration takes, where a sweep priced the stages
    # on some configurations only (`search._Pricer`); None: every configuration its own
    spread: Any = None

    @classmethod
    def of(
        cls,
        cost: CollectiveCost,
        time_s: Any,
        sent_bytes: Any = None,
        latency_s: Any = None,
        spread: Any = None,
    ) -> Known:
        """`cost`, whose time is `time_s` and bytes sent `sent_bytes` (its own where None);
        `spread` as the field says."""
        return cls(
            cost.op,
            cost.algorithm,
            cost.ranks,
            cost.size_bytes,
            cost.stages,
            cost.candidates,
            cost.pipelined,
            known_time=time_s,
            known_sent=cost.sent_bytes if sent_bytes is None else sent_bytes,
            known_latency=cost.latency_s if latency_s is None else latency_s,
            spread=spread,
        )

    @property
    def time_s(self) -> Seconds:
        return cast(Seconds, self.known_time)

    @property
    def latency_s(self) -> Seconds:
        return cast(Seconds, self.known_latency)

    @property
    def sent_bytes(self) -> Count:
        return cast(Count, self.known_sent)


def repeated(one: CollectiveCost, calls: Count, size_bytes: Count) -> CollectiveCost:
    """`calls` collectives of `one`'s size, together `size_bytes`: DeepSpeed's gradient
    reduction, a collective a bucket (`Move.calls`). Each is priced at its own size, its
    algorithm chosen and its bandwidth ramped there (a review, m550: priced at the whole,
    the buckets took the ring the whole tensor picks and the plateau a 20 MB bucket does not
    reach), and every figure of it, steps, bytes and time, is `calls` times one's."""
    whole = replace(one, size_bytes=size_bytes, stages=tuple(_times(s, calls) for s in one.stages))
    return Known.of(whole, one.time_s * calls, one.sent_bytes * calls, one.latency_s * calls)


def _spread(cost: CollectiveCost, values: Any) -> Any:
    """A stage's figure for every configuration: as it is, or taken where a sweep's cost
    spread its stages (`Known.spread`)."""
    which = cost.spread if isinstance(cost, Known) else None
    return values if which is None or np.ndim(values) == 0 else np.take(values, which)


def link_terms(cost: CollectiveCost) -> list[tuple[str, Seconds]]:
    """Each stage's link and bandwidth term Q / B_eff, for every configuration of a sweep."""
    return [(s.link.name, _spread(cost, s.bandwidth_s)) for s in cost.stages]


def shared_pace(cost: CollectiveCost, left: Mapping[str, Any]) -> Seconds:
    """The pace `cost` keeps where each link named in `left` is left to it at that share of its
    B_eff (other collectives hold the rest): its time alone over its time so, each stage's
    bandwidth term Q / (B_eff · share) on a link it shares and n·α as alone, a ring across
    levels paced by its busiest port at those rates as alone (`CollectiveCost.bandwidth_s`).
    A link's bandwidth is shared, not its latency: the fluid model of links carrying several
    flows, whose rates sum to at most the link's (max-min sharing; Velho et al., "On the
    validity of flow-level TCP network models for grid and cloud simulations", ACM TOMACS 23(4),
    2013, section 2). A share must be above 0; a collective that moves nothing keeps pace 1."""
    own = cost.stages
    if isinstance(cost, Known) and cost.spread is not None:  # every configuration's entries
        own = tuple(
            replace(s, **{f.name: _spread(cost, getattr(s, f.name)) for f in _ARRAY_FIELDS})
            for s in own
        )
    stages = tuple(
        replace(s, efficiency=s.efficiency * left[s.link.name]) if s.link.name in left else s
        for s in own
    )
    # the stages' own sums, not a `Known` cost's time: the two paces must be alike
    alone = CollectiveCost(
        cost.op,
        cost.algorithm,
        _spread(cost, cost.ranks),
        _spread(cost, cost.size_bytes),
        own,
        pipelined=cost.pipelined,
    )
    slowed: Any = replace(alone, stages=stages).time_s
    return cast(Seconds, vwhere(holds(slowed > 0), ratio(cast(Any, alone.time_s), slowed), 1.0))


def with_steps(cost: CollectiveCost, steps: Count) -> CollectiveCost:
    """`cost` taking `steps` latency steps (n of T = n·α + Q/B) in place of its algorithm's,
    its bytes and bandwidth term as they are: a transfer whose chunks ride another's
    messages pays only for the messages it sends alone. The steps go to the stages that had
    them, in proportion (one, for a flat ring)."""
    total = cost.steps
    least = vmax(cast(Any, total), 1)
    stages = tuple(replace(s, steps=(s.steps * steps) // least) for s in cost.stages)
    latency = sum((s.latency_s for s in stages), start=0.0)
    time = cost.time_s - cost.latency_s + latency
    return Known.of(replace(cost, stages=stages), time, cost.sent_bytes, latency)


def _choose(which: NDArray[Any], a: Stage, b: Stage) -> Stage:
    """`a`'s figures where `which` holds, `b`'s elsewhere: two stages on the same link."""
    pick = {
        name: np.where(which, getattr(a, name), getattr(b, name))
        for name in (
            "steps",
            "sent_bytes",
            "recv_bytes",
            "payload_bytes",
            "group_sent_bytes",
            "group_recv_bytes",
            "efficiency",
        )
    }
    return replace(a, **pick)


def _spans(tiers: tuple[Tier, ...]) -> list[Count]:
    """N_k: the domains of the level inside tier k that a group spans (N_0 its P ranks),
    and a closing 1."""
    return [_product([t.ranks for t in tiers[k:]]) for k in range(len(tiers))] + [1]


def _across(
    op: Op,
    algorithm: Algorithm,
    tiers: tuple[Tier, ...],
    size: Count,
    q: Count,
    steps: Sequence[Count],
    efficiency: Seconds = 1.0,
    ported: Count | None = None,
) -> tuple[Stage, ...]:
    """The stages of one collective through every rank of a group that spans levels, each
    rank moving `q` bytes and taking ``steps[k]`` latency-bearing steps on level k: a
    channel crosses a level-k boundary N_k times in its P hops, spread over the node's
    ports, so a rank's port carries q·x_k/P, x_k the hops whose outermost boundary is level
    k, and its own fabric the rest (`_ring_across`). `ported`, where given, is the q whose
    share the ports carry, where fewer of a rank's bytes leave its node than q's share,
    its fabric's as q's (`_tree_across`)."""
    p = _product([t.ranks for t in tiers])
    spans = _spans(tiers)

    def beyond(k: int, through: Count = q) -> Count:  # bytes over level k's boundary or past
        if k >= len(tiers):
            return 0
        hops = spans[k] * _indicator(spans[k] > 1)  # a channel's hops crossing it
        return (through * hops + p - 1) // _maximum(p, 1)

    out = q if ported is None else ported

    stages = []
    for k, tier in enumerate(tiers):
        # the level's own share; the shares are differences of rounded totals, so they add
        # up to Q exactly (the fabric, k = 0, takes what no port takes), or with `ported` to
        # the fabric's share of q and the ports' of `ported`
        sent = q - beyond(1) if k == 0 else beyond(k, out) - beyond(k + 1, out)
        stage = _Pricing(op, algorithm, p, size, tier.link, 1).symmetric(steps[k], sent)
        stages.append(replace(stage, ramp_op=op, efficiency=efficiency))
    return tuple(stages)


def _hierarchical(
    op: Op,
    tiers: tuple[Tier, ...],
    size: Count,
    e: int,
    instances: Count,
    below: tuple[Link, ...] | None = None,
) -> list[Stage]:
    """The two-level decomposition `collective_cost` lists, stage by stage (Thakur et al.
    2005, section 5; the all-to-all as Tutel's two-dimensional hierarchical exchange, Hwang
    et al., arXiv 2206.03382): `tiers[0]` is the inner domain of G ranks, ring inside it,
    and the outer levels, D = P/G domains, are decomposed again the same way. `instances`
    counts the groups of one stage that share its links: the D inner domains inside, the G
    groups of equal local index across. `below`: the network levels inside `tiers[0]`
    (None: it is the node's own fabric), which a step over it leaves through, so it runs at
    the slowest of them and the largest α (`spanned_link`, as a ring's and a flat
    algorithm's do: a review, m506, found a pair on two leaves shared by 4 GPUs priced at the
    spine's rate here alone)."""
    inner, rest = tiers[0], tiers[1:]
    g = inner.ranks
    link = inner.link if below is None else spanned_link((*below, inner.link))
    outward = () if below is None else (*below, inner.link)
    if not rest:
        return [
            flat_stage(
                op, default_algorithm(op), g, size, link, element_bytes=e, instances=instances
            )
        ]
    d = _product([t.ranks for t in rest])
    ring: Algorithm = "ring"

    def inside(kind: Op, logical: Count, algorithm: Algorithm = ring) -> Stage:
        return flat_stage(
            kind, algorithm, g, logical, link, element_bytes=e, instances=instances * d
        )

    def across(kind: Op, logical: Count) -> list[Stage]:
        return _hierarchical(kind, rest, logical, e, instances * g, outward)

    shard = _chunk(size, g, e)  # what each rank holds after the inner reduce-scatter
    if op == "all-reduce":
        return [
            inside("reduce-scatter", size),
            *across("all-reduce", shard),
            inside("all-gather", size),
        ]
    if op == "reduce-scatter":
        return [inside("reduce-scatter", size), *across("reduce-scatter", shard)]
    if op == "all-gather":
        return [*across("all-gather", shard), inside("all-gather", size)]
    if op == "all-to-all":
        block = _chunk(size, (g * d) ** 2, e)
        # inside: to local peer j go the d blocks bound for every rank of local index j
        # across: to remote peer go the g blocks gathered for it from this domain
        return [
            inside("all-to-all", g * g * d * block, "pairwise"),
            *across("all-to-all", d * d * g * block),
        ]
    if op == "broadcast":
        return [*_hierarchical(op, rest, size, e, instances, outward), inside("broadcast", size)]
    raise ValueError(_not_applicable(op, "hierarchical"))


def _auto(op: Op, tiers: Sequence[Tier], size: Count, e: int) -> CollectiveCost:
    if isinstance(size, np.ndarray) or any(isinstance(t.ranks, np.ndarray) for t in tiers):
        raise ValueError("'auto' chooses one algorithm per collective: give scalar sizes")
    priced: list[CollectiveCost] = []
    for algorithm in applicable_algorithms(op, len(tiers)):
        try:
            priced.append(collective_cost(op, tiers, size, algorithm, element_bytes=e))
        except ValueError:
            continue  # e.g. recursive halving on a group that is not a power of two
    best = min(priced, key=lambda c: float(c.time_s))
    candidates = tuple((c.algorithm, float(c.time_s)) for c in priced)
    return replace(best, candidates=candidates)


# ----------------------------------------------------------------------------- arithmetic


def ceil_log2(p: Count) -> Count:
    """⌈lg p⌉ exactly, for an int or an int array: the number of k ≥ 0 with 2^k < p, that
    is ⌊lg (p − 1)⌋ + 1 from p = 2 on (0 below)."""
    if isinstance(p, np.ndarray):
        return cast(Count, floor_log2(np.maximum(p - 1, 1)) + (p > 1))
    return max(int(p) - 1, 0).bit_length()


def floor_log2(p: Count) -> Count:
    """⌊lg p⌋ exactly for p ≥ 1 (0 below), for an int or an int array: the number of k ≥ 1
    with 2^k ≤ p. An array's is its float's binary exponent, one less where the float
    rounded up to the next power of two (past 2^53, p = 2^k − 1 reads as 2^k); one test of
    2^k per element, not one pass over the array per power of two (a sweep's sizes run to
    2^40 and past, `_tree_correction`; int64 ends below 2^63, so at most 62)."""
    if isinstance(p, np.ndarray):
        at_least_one = np.maximum(p, 1).astype(np.int64)
        exponent = np.frexp(at_least_one.astype(np.float64))[1].astype(np.int64) - 1
        exponent = np.minimum(exponent, 62)
        return cast(Count, exponent - (np.left_shift(1, exponent) > at_least_one))
    return max(int(p), 1).bit_length() - 1


def _chunk(size: Count, parts: Count, element_bytes: int) -> Count:
    """ceil(S / (parts·e)) elements of e bytes, in bytes: the padded equal chunk."""
    elements = -(-size // element_bytes)
    return -(-elements // parts) * element_bytes


def _bruck_blocks(p: Count) -> Count:
    """Σ_k #{j < p : bit k of j set}: blocks one rank sends over Bruck's ⌈lg p⌉ steps."""
    total: Count = p * 0
    steps = ceil_log2(p)
    for k in range(int(np.max(steps)) if isinstance(steps, np.ndarray) else steps):
        low, high = 2**k, 2 ** (k + 1)
        total = total + (p // high) * low + _maximum(p % high - low, 0)
    return total


@dataclass(frozen=True, slots=True)
class _Pricing:
    """What every stage of one `flat_stage` call shares; builds the `Stage`."""

    op: Op
    algorithm: Algorithm
    ranks: Count
    size: Count
    link: Link
    instances: Count

    def priced(
        self, *, steps: Count, sent: Count, recv: Count, payload: Count, group: Count
    ) -> Stage:
        """A stage whose ranks differ: busiest sender, busiest receiver, critical path Q,
        and ``group`` bytes sent (= received) summed over the ranks of one instance.

        A collective of 0 bytes takes no step: NCCL discards it before launching anything
        ("Empty collectives can be discarded": ``if (info->count == 0) return
        ncclSuccess;``, src/enqueue.cc ``taskAppend`` of NVIDIA/nccl), as it does a group
        of one rank's. A send or receive is queued whatever its bytes (the same
        function's point-to-point branch), so one of 0 bytes still takes its step."""
        if self.op != "send-recv":
            steps = steps * _indicator(self.size > 0)
        return Stage(
            op=self.op,
            algorithm=self.algorithm,
            ranks=self.ranks,
            size_bytes=self.size,
            steps=steps,
            sent_bytes=sent,
            recv_bytes=recv,
            payload_bytes=payload,
            group_sent_bytes=group,
            group_recv_bytes=group,
            link=self.link,
            instances=self.instances,
        )

    def symmetric(self, steps: Count, sent: Count) -> Stage:
        """Every rank sends and receives ``sent`` bytes, all of them on the critical path."""
        return self.priced(steps=steps, sent=sent, recv=sent, payload=sent, group=self.ranks * sent)


def used(stage: Stage) -> bool:
    """Whether `stage` takes a step or moves a byte in any configuration."""
    steps, sent = stage.steps, stage.sent_bytes
    if not isinstance(steps, np.ndarray) and not isinstance(sent, np.ndarray):
        return bool(steps > 0 or sent > 0)  # one plan's numbers: no arrays to build
    return bool(np.any(np.asarray(steps) > 0) or np.any(np.asarray(sent) > 0))


def _indicator(condition: bool | NDArray[Any]) -> Count:
    if isinstance(condition, np.ndarray):
        return condition.astype(np.int64)
    return int(bool(condition))


def _maximum(a: Count, b: int) -> Count:
    if isinstance(a, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def _minimum(a: Count, b: Count) -> Count:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)


def _product(values: Sequence[Count]) -> Count:
    out: Count = 1
    for value in values:
        out = out * value
    return out


def _ratio(num: Seconds, den: Seconds) -> Seconds:
    """num / den, 0 where den is 0 (a free collective has no meaningful bandwidth)."""
    if isinstance(num, np.ndarray) or isinstance(den, np.ndarray):
        num_a, den_a = np.broadcast_arrays(np.asarray(num, float), np.asarray(den, float))
        out: NDArray[Any] = np.divide(num_a, den_a, out=np.zeros(num_a.shape), where=den_a > 0)
        return out
    return float(num) / float(den) if den > 0 else 0.0


def slowness(link: Link) -> tuple[float, float]:
    """Orders links slowest first: the lowest B_eff, then the highest α."""
    return (link.effective_bandwidth, -link.latency)


def _slowest(links: Any) -> Link:
    """The slowest of `links` (innermost first), the outermost of those alike: a step over a
    rail group and the spine above it at one rate crosses the spine, which it names (an
    audit, m552: the rail's name, as if the step never left it)."""
    return cast(Link, min(reversed(list(links)), key=slowness))


def spanned_link(links: Sequence[Link]) -> Link:
    """The link a step over all of `links` takes: the slowest of them, at the largest α among
    them (`_flat_across`)."""
    return _with_latency(_slowest(links), max(link.latency for link in links))


def _with_latency(link: Link, latency: float) -> Link:
    """`link` whose steps take `latency` each (`_flat_across`: the largest α spanned)."""
    return link if link.latency == latency else replace(link, latency=latency)


# ----------------------------------------------------------------------------- validation


def _check_op(op: str) -> None:
    if op not in ALGORITHMS:
        raise ValueError(_unknown_op(op))


def _unknown_op(op: str) -> str:
    return f"unknown collective {op!r}; expected one of {', '.join(OPS)}"


def _resolve(op: Op, algorithm: str | None) -> Algorithm:
    if algorithm is None:
        return default_algorithm(op)
    alias = ALIASES.get((op, algorithm))
    if alias is not None:
        return alias
    if algorithm == "hierarchical" and op != "send-recv":
        return "hierarchical"
    if algorithm == "double-tree" and op == "all-reduce":
        return "double-tree"
    if algorithm in ALGORITHMS[op]:
        return algorithm
    raise ValueError(_not_applicable(op, algorithm))


def _alias_of(op: str, algorithm: str) -> str | None:
    """The other name `ALIASES` gives `op`'s `algorithm`, or None."""
    return next((name for (o, name), a in ALIASES.items() if o == op and a == algorithm), None)


def _not_applicable(op: str, algorithm: str) -> str:
    across = ("double-tree",) if op == "all-reduce" else ()
    choices = (*ALGORITHMS.get(cast(Op, op), ()), *across, "hierarchical", "auto")
    if op == "send-recv":
        choices = ("direct", "auto")
    # a name that means one of them (`ALIASES`) is accepted too, and said so (an audit: the
    # list of an all-to-all's left out the ring it takes, as its pairwise exchange)
    choices = tuple(f"{c} (also named {a})" if (a := _alias_of(op, c)) else c for c in choices)
    return f"{op} has no {algorithm!r} algorithm; choose one of {', '.join(choices)}"


def _require_power_of_two(op: Op, p: Count) -> None:
    bad = np.asarray(p)
    bad = bad[(bad & (bad - 1)) != 0]
    if bad.size:
        name = "doubling" if op == "all-gather" else "halving"
        other = "ring or bruck" if op == "all-gather" else "ring"
        raise ValueError(
            f"recursive {name} {op} needs a power-of-two group, and {int(bad.flat[0])} ranks "
            f"is not; use {other}"
        )


class SizeError(ValueError):
    """A collective of negative size: in a sweep, an int64 product that wrapped around."""


def _check_sizes(size: Count, ranks: Sequence[Count], element_bytes: int) -> None:
    if element_bytes < 1:
        raise ValueError(f"element size must be at least 1 byte, got {element_bytes}")
    if np.any(np.asarray(size) < 0):
        raise SizeError(f"a collective's size must not be negative, got {np.min(size)}")
    for r in ranks:
        if np.any(np.asarray(r) < 1):
            raise ValueError(f"a group needs at least 1 rank, got {np.min(r)}")
