"""Rank order → which links a parallel group spans → how its collectives are priced.

Ranks are numbered like Megatron-LM's `RankGenerator`: ``parallel.order`` lists the group
kinds fastest-varying first, so with ``order = [tp, cp, ep, dp, pp]`` rank
``r = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i))`` (ep is not a dimension of the dense layout).
Rank r runs on GPU r, and topology level i groups GPUs into domains of ``level.size``
consecutive GPUs (innermost first; the outermost level is the whole machine).

Expert layers re-split the tp × cp × dp ranks of each pipeline stage into etp × ep × edp
(expert tensor, expert and expert data parallel), as Megatron-Core's "parallel folding" does
(``parallel_state.initialize_model_parallel`` builds the expert `RankGenerator` with tp =
etp, cp = 1 and dp = edp over the same order, and asserts its pp groups are the dense ones).
The stage's ranks are linearised as b over tp, cp and dp in ``order``'s turn (with pp last,
b is the rank within the stage), and the expert grid reads the same b over etp, ep and edp
in the order's turn (tp read as etp, dp as edp; ep before dp where the order does not name
it), as the expert `RankGenerator` numbers them. Under ``[tp, cp, ep, dp, pp]``
``b = etp_i + etp·(ep_i + ep·edp_i)``: an etp group is ``etp`` consecutive b, an ep group
etp apart; under ``[ep, tp, cp, dp, pp]`` an ep group is ``ep`` consecutive b and an etp
group ep apart (an audit: that order was read as the first, its ep all-to-all priced across
nodes and its etp gathers within one, where Megatron-Core puts them the other way). With
etp = tp (the default) and tp first the expert tp group is the dense one and ep lies within
cp × dp.

How a group is laid out for pricing (DESIGN.md rule 5):

* all its ranks in one innermost domain → flat on that level's link;
* spread over several domains with k > 1 ranks in each → two tiers (or, on deeper
  topologies, more): the inner tier has the k ranks sharing a domain, the outer tier the
  number of domains touched. By default the collective runs across them as NCCL does, one
  ring through every rank (an all-reduce NCCL's double binary tree where faster, an
  all-to-all NCCL's exchange with every peer: `collectives.collective_cost`); the two-level
  decomposition DESIGN.md names is what ``hierarchical`` prices, where a plan asks for it,
  since NCCL runs it on none of these ops (and it is the slower of the two where a DESIGN
  audit compared them: 1 GiB all-reduced over 4 nodes of 8, 8.2 ms against 5.3 ms);
* exactly one rank per domain → flat on the outer link.

Contention: a level's bandwidth is per GPU, so concurrent groups that each drive their own
GPU's link (e.g. 8 dp groups, one rank per node each, on a node with one NIC per GPU) do not
slow each other; where ``Level.shared_by`` GPUs share one link, each gets bandwidth / shared_by.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, TypeAlias

import numpy as np

from budget.collectives import (
    Algorithm,
    CollectiveCost,
    Count,
    Link,
    Op,
    Tier,
    collective_cost,
)
from budget.plan.model import DTYPE_BYTES, MAX_GPUS, Level, Parallel, Topology

__all__ = [
    "MAX_GPUS",
    "GroupKind",
    "GroupSpan",
    "expert_grid",
    "group_ranks",
    "group_size",
    "group_span",
    "level_ranks",
    "link_of",
    "price",
    "price_group",
    "span_of_ranks",
    "tp_overlap_problem",
    "uneven_group",
]

Dimension = Literal["tp", "cp", "ep", "dp", "pp", "etp", "edp", "dp_shard", "dp_replicate"]
# One kind ("dp") or several varied together (("dp", "cp") for gradients under context
# parallelism). "etp" and "edp" are the expert tensor- and data-parallel dimensions of
# expert layers; "dp_shard" and "dp_replicate" the two digits hybrid sharding splits dp into
# (`Parallel.dp_shard`), the shard group's the faster: dp_i = shard_i + dp_shard·replica_i.
GroupKind: TypeAlias = Dimension | tuple[Dimension, ...]

_DENSE = ("tp", "cp", "dp", "pp")
_HYBRID = ("dp_shard", "dp_replicate")
_EXPERT = ("etp", "ep", "edp", "pp")


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """The group of ``kind`` containing ``rank``, and the tiers it is priced on.

    ``tiers`` are innermost first; a tier of one rank is dropped, so one tier means flat.
    ``stride`` is the constant rank distance between members, None when irregular.
    """

    kind: GroupKind
    rank: int
    members: Sequence[int]  # sorted; a `range` when they are a progression (not listed)
    stride: int | None
    tiers: tuple[Tier, ...]
    domains: int = 1  # innermost-level domains the group touches
    # the topology's innermost link (a node's own fabric), which a ring across levels sets
    # apart from the network ports even where the group has one rank in each node
    fabric: Link | None = None
    # ranks of the group at each level of the topology, innermost first, 1 where it uses
    # none (`tiers` without the levels of one rank): a sweep places each tier by the
    # level's index (`search._Pricer`); names are unique (`resolve` refuses a repeated one)
    counts: tuple[int, ...] = ()
    # every level's link, innermost first, as `counts` counts them (`price_group`)
    links: tuple[Link, ...] = ()

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self.members)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def levels(self) -> tuple[str, ...]:
        """Names of the levels whose links the group uses, innermost first."""
        return tuple(t.link.name for t in self.tiers)

    @property
    def two_level(self) -> bool:
        return len(self.tiers) > 1

    @property
    def inner_size(self) -> int:
        """Ranks of the group that share one innermost domain (1: one rank per domain)."""
        return self.size // self.domains

    @property
    def outer_size(self) -> int:
        """Innermost domains the group touches (1 when it sits inside one)."""
        return self.domains


def link_of(level: Level) -> Link:
    """The `Link` a topology level offers one GPU."""
    return Link(level.name, level.bandwidth, level.latency, level.shared_by, level.ramp)


@lru_cache(maxsize=4096)
def group_span(kind: GroupKind, parallel: Parallel, topology: Topology, rank: int = 0) -> GroupSpan:
    """The group of ``kind`` that holds ``rank``, with the levels it spans."""
    members = _members(kind, parallel, topology.gpus, rank)  # sorted and distinct
    return _span_of_members(members, topology, kind, rank)


def tp_overlap_problem(parallel: Parallel, topology: Topology) -> str | None:
    """Why Transformer Engine's comm-GEMM overlap (``overlap.tp``, userbuffers) cannot run
    over `parallel`'s tp group on `topology`, or None: its ring exchanges and reduce-scatters
    move through CUDA IPC or multicast handles within one NVLink domain ("the comm+GEMM
    overlap is currently only possible with single-node tensor-parallelism ... Userbuffers
    relies on CUDA Multicast handles": NVIDIA/TransformerEngine issue 1071; ``initialize_ub``
    builds its communicators per "TP model on single NVLink domain"), here one domain of the
    topology's innermost level (a multi-node NVLink rack, GB200 NVL72's 72 GPUs, is one).
    An audit (m387): tp 16 over two DGX A100 nodes hid its all-gathers behind its GEMMs,
    0.6 s a step of GPT-3 175B."""
    if parallel.tp == 1 or len(topology.levels) < 2:
        return None
    level = topology.levels[0]
    span = group_span("tp", parallel, topology)
    if span.domains <= 1:
        return None
    return (
        f"tp {parallel.tp} spans {span.domains} {level.name} domains of {level.size}, where "
        "Transformer Engine's comm-GEMM overlap (userbuffers) runs within one NVLink domain"
    )


class UnevenGroup(ValueError):
    """A group holds different numbers of ranks in the domains of one level."""


def uneven_group(parallel: Parallel, topology: Topology, experts: bool = False) -> str | None:
    """Why a plan's groups cannot be priced, or None: every group (tp, cp, dp, pp, dp x cp,
    and the expert grid's etp, ep and expert data-parallel groups) must hold the same
    number of ranks in each domain it touches, which the two-level algorithms assume
    (`span_of_ranks`), and span the levels as rank 0's group of its kind does, which is
    the one priced. Checked on the groups holding rank 0 and the last rank of the first
    domain of each level (tp = 6 on 8-GPU nodes: ranks 0..5 fit a node, ranks 6..11
    straddle two), then on the group a level's domains cut otherwise (`_misplaced`,
    `_expert_misplaced`). The expert grid's groups are checked where the model has
    `experts` and they fold into the stage, whether or not they are split apart: with
    ep 1 and etp = tp its etp group is still the stage's first digits in the expert
    order, not the dense tp group where cp or dp comes before tp (a review: cp 3 before
    tp 2 on 3-GPU domains put etp [2, 3] across two, validated and then a traceback).
    Other problems with the degrees or the order raise ValueError (the plan loader
    reports them by their own checks)."""
    kinds: tuple[GroupKind, ...] = ()
    if not all(_aligned(parallel, lv.size) for lv in topology.levels if lv.size):
        kinds = ("tp", "cp", "dp", "pp", ("dp", "cp"))
        if parallel.dp_shard is not None:
            kinds += ("dp_shard", "dp_replicate", ("dp_shard", "cp"))
    grid = expert_grid(parallel) or (experts and _degrees(parallel)["edp"] > 0)
    if grid:
        kinds += ("etp", "ep", "edp")
    ranks = sorted(
        {0, *(lv.size - 1 for lv in topology.levels if lv.size and lv.size < topology.gpus)}
    )
    degrees = _degrees(parallel)
    for kind in kinds:
        if isinstance(kind, str) and degrees[kind] == 1:
            continue
        for rank in ranks:
            try:
                group_span(kind, parallel, topology, rank)
            except UnevenGroup as error:
                name = kind if isinstance(kind, str) else " x ".join(kind)
                return f"the {name} group: {error}"
    for level in topology.levels[:-1]:
        if level.size and level.size < topology.gpus and not _aligned(parallel, level.size):
            misplaced = _misplaced(parallel, topology, level)
            if misplaced:
                return misplaced
    return _expert_misplaced(parallel, topology) if grid else None


# ranks past which the expert groups are checked at `uneven_group`'s ranks alone
EXPERT_CHECK = 2**20


def _expert_misplaced(parallel: Parallel, topology: Topology) -> str | None:
    """Why an expert group (etp, ep, edp) spreads unevenly over a level, or otherwise than
    rank 0's group of its kind, or None. Under a Megatron order (tp first, pp last) a
    stage's ranks are one block, whose ranks b are the expert grid's b = etp_i + etp·k
    (module docstring): where every level's domains cut that grid at a digit (`_per_domain`
    over etp, then ep and edp in the order's turn, then pp) no group can. Otherwise every
    rank's groups are worked out at once, up to `EXPERT_CHECK` ranks: each group's ranks in
    each domain it touches, and the domains it touches (a review: tp 6, cp 8, pp 4, ep 6,
    etp 4 on levels of 2 and 6 GPUs put rank 0's etp group, ranks 0..3, in one 6-GPU
    domain, and ranks 4..7 across two, priced as rank 0's)."""
    degrees = _degrees(parallel)
    order = _dense_order(parallel)
    levels = [lv for lv in topology.levels[:-1] if lv.size and lv.size < topology.gpus]
    grid = (*_expert_order(parallel), "pp")
    cut = all(_per_domain(set(), grid, degrees, int(lv.size or 0)) is not None for lv in levels)
    if (order[0] == "tp" and order[-1] == "pp" and cut) or topology.gpus > EXPERT_CHECK:
        return None
    ranks = np.arange(topology.gpus, dtype=np.int64)
    coords: dict[str, Any] = {}
    rest = ranks
    for d in order:
        rest, coords[d] = np.divmod(rest, degrees[d])
    grid_coords: dict[str, Any] = {**_expert_coords(coords, parallel, degrees), "pp": coords["pp"]}
    for kind in ("etp", "ep", "edp"):
        if degrees[kind] == 1:
            continue
        group: Any = np.zeros_like(ranks)
        for d in grid:
            if d != kind:
                group = group * degrees[d] + grid_coords[d]
        for level in levels:
            domains = topology.gpus // int(level.size or 1)
            pairs, held = np.unique(
                group * domains + ranks // int(level.size or 1), return_counts=True
            )
            owner = pairs // domains
            touched = np.bincount(owner)
            odd = (held * touched[owner] != degrees[kind]) | (touched[owner] != touched[group[0]])
            if np.any(odd):
                rank = int(ranks[np.isin(group, owner[odd])][0])  # the lowest such rank
                try:
                    theirs = group_span(kind, parallel, topology, rank)
                except UnevenGroup as error:
                    return f"the {kind} group: {error}"
                ours = group_span(kind, parallel, topology)
                return (
                    f"the {kind} group: group {_show(theirs.members)} puts {theirs.counts} "
                    f"ranks on the levels where rank 0's group {_show(ours.members)} puts "
                    f"{ours.counts}; budget prices every {kind} group as rank 0's, so each must "
                    "sit alike"
                )
    return None


def _misplaced(parallel: Parallel, topology: Topology, level: Level) -> str | None:
    """Why domains of `level` that do not cut the dense layout at a digit (`_aligned`)
    leave a group that sits otherwise than rank 0's, or None. budget prices one group of
    each dimension, rank 0's (`group_span`), for every rank; where the groups of a
    dimension cross different levels, the others would be priced on links they do not use
    (an audit: tp 16 on 8-GPU nodes in 24-GPU leaves, the group of ranks 16..31 crossing
    the spine where ranks 0..15 stay in a leaf, and its dp groups of ranks 8 and 24 across
    the spine too, priced at the leaf's rate: the step 2.17 s where it is at least 0.09 s
    longer).

    Take the first digit of the order (the dimension d, of degree D, with T ranks inside
    it) whose block T·D does not divide the domain's S ranks: S = T·m, T dividing S as
    every block inside did, and D not dividing m. Where m < D, rank 0's group of d already
    spreads unevenly (`uneven_group`'s checks say so). Where m > D, rank 0's group sits in
    one domain, and the group whose d digit is 0 at position c·T straddles two domains
    where c mod m > m − D: c = q·D with q·D ≡ m − g (mod m), g = gcd(D, m) < D, solved
    by the inverse of D/g modulo m/g; c·T < lcm(S, T·D), which divides the GPUs."""
    order = _split_order(_dense_order(parallel))
    degrees = _degrees(parallel)
    size, inner = int(level.size or 0), 1
    for dim in order:
        d = degrees[dim]
        if size % (inner * d) == 0:
            inner *= d
            continue
        m = size // inner  # inner divides size: every block inside it did
        if m < d:
            return None  # an uneven group, which the checks above report
        g = math.gcd(d, m)
        q = (m // g - 1) * pow(d // g, -1, m // g) % (m // g)
        rank = q * d * inner
        if rank >= topology.gpus:
            return None
        try:
            theirs = group_span(dim, parallel, topology, rank)
        except UnevenGroup as error:
            return f"the {dim} group: {error}"
        ours = group_span(dim, parallel, topology)
        if theirs.counts == ours.counts:
            return None
        return (
            f"the {dim} group: group {_show(theirs.members)} crosses {level.name} domains "
            f"({level.size} GPUs each) where rank 0's group {_show(ours.members)} sits "
            f"inside one; budget prices every {dim} group as rank 0's, so each must sit "
            "alike"
        )
    return None


def group_size(kind: GroupKind, parallel: Parallel) -> int:
    """Ranks in a group of `kind`: the product of its dimensions' degrees."""
    degrees = _degrees(parallel)
    return math.prod(degrees[d] for d in ((kind,) if isinstance(kind, str) else kind))


def level_ranks(kind: GroupKind, parallel: Parallel, topology: Topology) -> tuple[int, ...] | None:
    """Ranks of a dense group (tp, cp, dp, pp or several together) at each level of the
    topology, innermost first, as `group_span` tiers it (a level it does not use holds
    1), without listing a rank; None unless every level's domains cut the dense layout at
    a digit (`_aligned`), for which the count is closed-form: a domain then holds every
    value of the digits inside the cut digit, f values of that one and one of each
    outside, so the group has the same number g of ranks in each domain it touches and
    touches P / g of them. A sweep prices thousands of layouts' groups this way."""
    dims = _split_dims((kind,) if isinstance(kind, str) else kind)
    if not dims <= {*_DENSE, *_HYBRID}:
        return None
    degrees = _degrees(parallel)
    order = _split_order(_dense_order(parallel))
    size = group_size(kind, parallel)
    levels = topology.levels
    touched: list[int] = []
    for i, level in enumerate(levels):
        if i == len(levels) - 1 or level.size is None:
            touched.append(1)
            break
        if topology.gpus % level.size:
            return None
        per_domain = _per_domain(dims, order, degrees, level.size)
        if per_domain is None:
            return None
        touched.append(size // per_domain)
    counts = [size // touched[0], *(touched[i - 1] // touched[i] for i in range(1, len(touched)))]
    return tuple(counts) + (1,) * (len(levels) - len(counts))


def _per_domain(
    dims: set[str], order: Sequence[str], degrees: dict[str, int], size: int
) -> int | None:
    """Ranks of a `dims` group in one domain of `size` ranks, when the domains cut the
    layout at a digit (`_aligned`); None otherwise."""
    inner = held = 1
    for dim in order:
        if size % inner == 0 and degrees[dim] % (size // inner) == 0:
            return held * (size // inner if dim in dims else 1)
        held *= degrees[dim] if dim in dims else 1
        inner *= degrees[dim]
    return held if size % inner == 0 else None


def _aligned(parallel: Parallel, size: int) -> bool:
    """Whether domains of `size` ranks cut the dense layout at a digit: size = (product of
    the degrees inside some dimension of `parallel.order`) x f with f dividing that
    dimension's degree. Then a domain is a block of whole values of the inner digits and
    f values of that one, so every dense group holds the same number of ranks in each
    domain it touches, without enumerating a rank."""
    order = _split_order(_dense_order(parallel))
    return _per_domain(set(), order, _degrees(parallel), size) is not None


def span_of_ranks(
    ranks: Iterable[int], topology: Topology, kind: GroupKind = "dp", rank: int | None = None
) -> GroupSpan:
    """Tiers for an explicit set of ranks (GPU ids): see the module docstring.

    Raises ValueError when the group is not spread evenly over the domains it touches
    (the two-level algorithms need the same number of ranks in each).
    """
    members: Sequence[int] = (
        ranks  # sorted and distinct already, and left unlisted
        if isinstance(ranks, range) and ranks.step > 0
        else tuple(sorted(set(ranks)))
    )
    if not members:
        raise ValueError("a group needs at least one rank")
    return _span_of_members(members, topology, kind, rank)


@lru_cache(maxsize=4096)
def _span_of_members(
    members: Sequence[int], topology: Topology, kind: GroupKind, rank: int | None
) -> GroupSpan:
    """`span_of_ranks` of sorted, distinct ranks; once per group (a sweep meets the same
    group under many layouts: the tp group of 8 ranks whatever dp is)."""
    if members[0] < 0 or members[-1] >= topology.gpus:
        raise ValueError(f"ranks {members[0]}..{members[-1]} do not fit {topology.gpus} GPUs")
    levels = topology.levels
    if not levels:
        raise ValueError("the topology has no levels")
    # touched[i]: how many level-i domains the group occupies; the outermost is one domain.
    touched: list[int] = []
    step = members[1] - members[0] if len(members) > 1 else 0
    regular = step > 0 and (
        isinstance(members, range) or members == tuple(range(members[0], members[-1] + 1, step))
    )
    for i, level in enumerate(levels):
        if i == len(levels) - 1 or level.size is None:
            touched.append(1)
            break
        domains = (
            _progression_domains(members[0], step, len(members), level.size) if (regular) else None
        )
        if domains is not None:
            touched.append(domains)
            continue
        per_domain = _tally(members, level.size)
        if len(set(per_domain)) > 1:
            raise UnevenGroup(
                f"group {_show(members)} puts {sorted(set(per_domain))} ranks in "
                f"different {level.name} domains; a group must be spread evenly to be priced"
            )
        touched.append(len(per_domain))
    counts = [
        len(members) // touched[0],
        *(touched[i - 1] // touched[i] for i in range(1, len(touched))),
    ]
    tiers = tuple(
        Tier(count, link_of(level))
        for count, level in zip(counts, levels, strict=False)
        if count > 1
    )
    if not tiers:
        tiers = (Tier(1, link_of(levels[0])),)
    if regular or len(members) == 1:
        stride: int | None = step or 1
    else:
        gaps = set(np.diff(members).tolist())
        stride = gaps.pop() if len(gaps) == 1 else None
    first = members[0] if rank is None else rank
    every = (*counts, *(1,) * (len(levels) - len(counts)))
    return GroupSpan(
        kind,
        first,
        members,
        stride,
        tiers,
        touched[0],
        link_of(levels[0]),
        tuple(every),
        tuple(link_of(level) for level in levels),
    )


def _tally(members: Sequence[int], size: int) -> list[int]:
    """How many of `members` (sorted) fall in each domain of `size` consecutive ranks that
    holds any; with numpy for large groups (a dp x cp group of thousands of ranks)."""
    if len(members) < 64:
        return list(Counter(r // size for r in members).values())
    if isinstance(members, range):
        ranks = np.arange(members.start, members.stop, members.step)
    else:
        ranks = np.asarray(members)
    domains = ranks // size  # sorted, so each domain's ranks are a run
    edges = np.flatnonzero(np.diff(domains)) + 1
    counts: list[int] = np.diff(edges, prepend=0, append=len(domains)).tolist()
    return counts


def _progression_domains(first: int, step: int, n: int, size: int) -> int | None:
    """Domains of `size` consecutive ranks that the ranks first, first + step, ... (n of them)
    occupy, when each holds the same number of them; None when that needs a tally."""
    if step >= size:
        return n if step % size == 0 else None
    if size % step or first % size >= step:
        return None
    span = n * step
    if span <= size:
        return 1 if first % size + (n - 1) * step < size else None
    return span // size if span % size == 0 and first % size == first % step else None


def _pair_level(a: int, b: int, sizes: tuple[int | None, ...]) -> int:
    """The index of the level a transfer between ranks `a` and `b` runs on, of levels of
    domain `sizes`: the innermost whose domain (a block of `size` consecutive ranks; the
    outermost, the whole job) holds both."""
    return next(
        (j for j, size in enumerate(sizes[:-1]) if size is None or a // size == b // size),
        len(sizes) - 1,
    )


def pp_stride(parallel: Parallel) -> Any:
    """The distance in ranks between neighbouring pipeline stages: the product of the dense
    degrees placed before pp in `parallel.order` (a pp group is one coordinate's ranks, an
    arithmetic progression); an array where the degrees are."""
    order = _dense_order(parallel)
    return math.prod((getattr(parallel, d) for d in order[: order.index("pp")]), start=1)


def send_levels(parallel: Parallel, topology: Topology) -> tuple[int, ...]:
    """For each stage boundary b of rank 0's pipeline (stage b to stage b + 1, the last to
    the first: an interleaved schedule's chunk k on the last stage sends to chunk k + 1 on
    the first), the level its stage sends run on (`_pair_level`): under the default order
    [tp, cp, ep, dp, pp] at tp 2 and dp 1, pp 8 over two 8-GPU nodes puts one boundary
    across the nodes and six within them. Every pipeline of the job spans the levels alike
    (a layout where they do not is refused, `uneven_group`)."""
    sizes = tuple(lv.size for lv in topology.levels)
    return stride_levels(parallel.pp, pp_stride(parallel), sizes)


@lru_cache(maxsize=4096)
def stride_levels(pp: int, stride: int, sizes: tuple[int | None, ...]) -> tuple[int, ...]:
    """`send_levels` of `pp` stages `stride` ranks apart, on levels of domain `sizes`."""
    return tuple(_pair_level(b * stride, (b + 1) % pp * stride, sizes) for b in range(pp))


def group_ranks(kind: GroupKind, parallel: Parallel, gpus: int, rank: int = 0) -> tuple[int, ...]:
    """Ranks of the ``kind`` group containing ``rank`` under ``parallel.order``, sorted."""
    return tuple(_members(kind, parallel, gpus, rank))


def _members(kind: GroupKind, parallel: Parallel, gpus: int, rank: int = 0) -> Sequence[int]:
    """`group_ranks`, as a `range` when they are a progression (a dp group of thousands of
    ranks is then described, not listed)."""
    dims = (kind,) if isinstance(kind, str) else tuple(kind)
    degrees = _degrees(parallel)
    world = parallel.tp * parallel.cp * parallel.dp * parallel.pp
    if world != gpus:
        raise ValueError(
            f"tp × cp × dp × pp = {parallel.tp} × {parallel.cp} × {parallel.dp} × "
            f"{parallel.pp} = {world} but the topology has {gpus} GPUs"
        )
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside 0..{world - 1}")
    unknown = [d for d in dims if d not in (*_DENSE, *_HYBRID, *_EXPERT)]
    if unknown:
        raise ValueError(
            f"unknown group kind {unknown[0]!r}; expected tp, cp, dp, pp, dp_shard, "
            "dp_replicate, etp, ep or edp"
        )
    order = _dense_order(parallel)
    if all(d in (*_DENSE, *_HYBRID) for d in dims):
        # dp as its two digits, the shard group's the faster (one of them 1 without hybrid
        # sharding, which leaves every group as it was)
        order = _split_order(order)
        split = _split_dims(dims)
        coords = _dense_coords(rank, order, degrees)
        positions = sorted(order.index(d) for d in split)
        if positions == list(range(positions[0], positions[-1] + 1)):
            # Dimensions adjacent in the order vary together as one block: an arithmetic
            # progression of ranks, listed without enumerating coordinates.
            stride = math.prod(degrees[d] for d in order[: positions[0]])
            size = math.prod(degrees[order[i]] for i in positions)
            base = rank - sum(
                coords[order[i]] * math.prod(degrees[d] for d in order[:i]) for i in positions
            )
            return range(base, base + size * stride, stride)
        # Otherwise a lattice of progressions: the base rank plus every combination of
        # each dimension's index times its stride.
        strides = {d: math.prod(degrees[e] for e in order[: order.index(d)]) for d in order}
        lattice = np.zeros(1, dtype=np.int64)
        for d in split:
            lattice = np.add.outer(lattice, np.arange(degrees[d]) * strides[d]).ravel()
        base = rank - sum(coords[d] * strides[d] for d in split)
        return tuple(np.sort(lattice + base).tolist())
    if not all(d in _EXPERT for d in dims):
        raise ValueError(f"group {'×'.join(dims)} mixes dense and expert dimensions")
    coords = _dense_coords(rank, order, degrees)
    if not degrees["edp"]:
        raise ValueError(
            f"ep × etp = {parallel.ep} × {degrees['etp']} must divide tp × cp × dp = "
            f"{parallel.tp * parallel.cp * parallel.dp} for an expert group to be placed"
        )
    fixed = {"pp": coords["pp"], **_expert_coords(coords, parallel, degrees)}
    # every member's indices at once, as arrays (`_from_expert` and `_dense_rank` are
    # arithmetic): a Python loop over them took Mixtral's sweep on 8,192 GPUs 1.2 s of its
    # 2.1 s, edp groups of up to 1,024 ranks met once per layout of degrees
    axes = [np.arange(degrees[d]) if d in dims else np.array([fixed[d]]) for d in _EXPERT]
    e_tp, ep_i, edp_i, pp_i = (a.ravel() for a in np.meshgrid(*axes, indexing="ij"))
    dense = _from_expert({"etp": e_tp, "ep": ep_i, "edp": edp_i}, parallel, degrees)
    ranks = _dense_rank({**dense, "pp": pp_i}, order, degrees)
    return tuple(np.sort(ranks).tolist())


def price_group(
    op: Op,
    size_bytes: Count,
    span: GroupSpan,
    algorithm: Algorithm | Literal["auto"] | None = None,
    dtype: str | None = None,
    levelled: bool = True,
) -> CollectiveCost:
    """Price ``op`` on a tensor of ``size_bytes`` (full logical size) over ``span``.

    ``dtype`` sets the element size chunks are rounded to (bf16: 2 bytes). The default
    algorithm is ring, across levels too for the ops NCCL runs as one ring (an all-reduce
    there takes NCCL's double binary tree where that is faster), pairwise for the
    all-to-all, across levels NCCL's exchange with every peer at once
    (`collective_cost`, which ``levelled`` goes to). A flat algorithm named for a group
    across levels is priced at the slowest level holding more than one of its ranks and the
    largest α among them, not at the fabric added below it (`collectives._flat_across`).
    """
    element = 1 if dtype is None else DTYPE_BYTES[dtype]
    tiers = span.tiers
    # up to the outermost level the group reaches: the levels beyond carry nothing
    reach = max((i for i, count in enumerate(span.counts) if count > 1), default=0)
    if reach > 0 and span.links:
        # every level, a level of one rank too, as a sweep prices them (`search._Pricer`):
        # the node's fabric carrying none of it where the group has one rank in each node,
        # so that an all-reduce chooses between NCCL's ring and its tree, which it can only
        # do across levels (`collectives._nccl_all_reduce`; a review: the search took the
        # tree for such a data-parallel group where `budget` kept the ring; another: rail
        # units across a spine priced the rail's share as the fabric's),
        # and a network level the group has one rank in each domain of still carrying what
        # leaves for the levels beyond it, its port the first on the way (an audit, m460: an
        # all-to-all to a peer across the spine skipped a leaf shared by 4 GPUs, 103 µs where
        # the sweep read 371; m502: a ring's, a flat algorithm's and a send/recv's too)
        counts = span.counts[: reach + 1]
        tiers = tuple(Tier(c, link) for c, link in zip(counts, span.links, strict=False))
    return collective_cost(
        op, tiers, size_bytes, algorithm, element_bytes=element, levelled=levelled
    )


def price(
    op: Op,
    kind: GroupKind,
    size_bytes: Count,
    parallel: Parallel,
    topology: Topology,
    dtype: str | None = None,
    algorithm: Algorithm | Literal["auto"] | None = None,
) -> CollectiveCost:
    """One call for the plan engine: the ``kind`` group holding rank 0, priced for ``op``."""
    return price_group(op, size_bytes, group_span(kind, parallel, topology), algorithm, dtype)


# ----------------------------------------------------------------------------- rank maths


def expert_grid(parallel: Parallel) -> bool:
    """Whether expert layers split the stage's ranks apart from the dense groups (ep > 1 or
    etp ≠ tp) into a grid that fits them: ep × etp divides tp × cp × dp. (Serving may put
    ep inside the tp group, `layers.experts_inside_tp`, and then prices no collective over
    an ep or edp group.)"""
    etp = parallel.expert_tp
    return (parallel.ep > 1 or etp != parallel.tp) and _degrees(parallel)["edp"] > 0


def _degrees(parallel: Parallel) -> dict[str, int]:
    ep = parallel.ep
    if ep < 1:
        raise ValueError(f"ep = {ep} must be at least 1")
    etp = parallel.expert_tp
    stage = parallel.tp * parallel.cp * parallel.dp
    # hybrid sharding's two digits of dp; one that does not divide dp is refused by the plan
    # loader, so is not split here (a group of such a plan is then only dp's)
    shard = parallel.dp_shard
    if shard is None or parallel.dp % shard:
        shard = parallel.dp
    return {
        "tp": parallel.tp,
        "cp": parallel.cp,
        "dp": parallel.dp,
        "dp_shard": shard,
        "dp_replicate": parallel.dp // shard,
        "pp": parallel.pp,
        "ep": ep,
        "etp": etp,
        "edp": stage // (ep * etp) if etp >= 1 and stage % (ep * etp) == 0 else 0,
    }


def _split_order(order: Sequence[str]) -> tuple[str, ...]:
    """A dense order with dp written as its two digits under hybrid sharding, the shard
    group's fastest (`Parallel.dp_shard`; Megatron-LM's distributed-optimizer instances are
    consecutive blocks of the data-parallel ranks, torchtitan's mesh puts dp_shard inside
    dp_replicate)."""
    return tuple(d for dim in order for d in (_HYBRID if dim == "dp" else (dim,)))


def _split_dims(dims: Iterable[str]) -> set[str]:
    """A group's dimensions over `_split_order`'s digits: dp is both."""
    return {d for dim in dims for d in (_HYBRID if dim == "dp" else (dim,))}


def _dense_order(parallel: Parallel) -> tuple[str, ...]:
    order = tuple(k for k in parallel.order if k != "ep")
    if sorted(order) != sorted(_DENSE):
        raise ValueError(
            f"parallel.order {list(parallel.order)} must list tp, cp, dp and pp once each"
        )
    return order


def _dense_coords(rank: int, order: Sequence[str], degrees: dict[str, int]) -> dict[str, int]:
    coords = {}
    for d in order:
        rank, coords[d] = divmod(rank, degrees[d])
    return coords


def _dense_rank(
    coords: dict[str, np.ndarray], order: Sequence[str], degrees: dict[str, int]
) -> np.ndarray:
    """The ranks whose indices in each dense dimension are `coords` (arrays, one element
    per rank)."""
    rank, scale = np.zeros_like(coords[order[0]]), 1
    for d in order:
        rank += coords[d] * scale
        scale *= degrees[d]
    return rank


_EXPERT_DIGITS = {"tp": "etp", "ep": "ep", "dp": "edp"}


def _expert_order(parallel: Parallel) -> tuple[str, ...]:
    """The expert grid's digits within a stage, fastest first, in ``parallel.order``'s turn:
    tp read as etp, dp as edp, cp (of degree 1 there) and pp left out, ep before dp where
    the order does not name it (module docstring)."""
    order = [d for d in parallel.order if d in _EXPERT_DIGITS]
    if "ep" not in order:
        order.insert(order.index("dp"), "ep")
    return tuple(_EXPERT_DIGITS[d] for d in order)


def _stage_order(parallel: Parallel) -> tuple[str, ...]:
    """The dense digits within a stage, fastest first: tp, cp and dp in the order's turn."""
    return tuple(d for d in _dense_order(parallel) if d != "pp")


def _reread(
    digits: dict[str, Any], source: Sequence[str], target: Sequence[str], degrees: dict[str, int]
) -> dict[str, Any]:
    """A place within a stage written over the `source` digits (fastest first; ints, or
    arrays with one element per rank), read over the `target` digits."""
    b: Any = 0
    for d in reversed(source):
        b = b * degrees[d] + digits[d]
    out = {}
    for d in target:
        b, out[d] = divmod(b, degrees[d])
    return out


def _expert_coords(coords: dict[str, Any], parallel: Parallel, degrees: dict[str, int]) -> Any:
    """A rank's etp, ep and edp indices from its tp, cp and dp ones: its place b within its
    stage over the dense digits, read over the expert grid's (module docstring)."""
    return _reread(coords, _stage_order(parallel), _expert_order(parallel), degrees)


def _from_expert(expert: dict[str, Any], parallel: Parallel, degrees: dict[str, int]) -> Any:
    """Ranks' tp, cp and dp indices from their etp, ep and edp ones: the inverse of
    `_expert_coords`."""
    return _reread(expert, _expert_order(parallel), _stage_order(parallel), degrees)


def _show(ranks: Sequence[int]) -> str:
    return f"[{', '.join(map(str, ranks[:6]))}{', …' if len(ranks) > 6 else ''}]"
