"""Search: sweep the parallel layouts of a plan's model on a cluster, with the plan engine.

Every configuration (tp, pp, virtual stages, dp, cp, ep, sequence parallelism, ZeRO stage,
recompute, micro-batch) that divides evenly is evaluated by the SAME functions that budget
one plan (`step.derive`, `memory`, `schedule.step_time`), so a configuration written out
with `--write` and budgeted again gives the same numbers.

Speed comes from evaluating configurations together: configurations that share a step's
structure (pipeline depth and schedule, recompute, ZeRO stage, which transitions exist)
produce the same phases, allocations and transitions, and differ only in sizes. Each such
group runs through the engine with numpy arrays in place of the numbers (DESIGN.md,
"One engine for one plan and for a million"), at most `CHUNK` configurations per pass.
A plan's hand-written transitions go with every layout, their shapes evaluated for it as
`budget PLAN` evaluates them for its own (`reshaped`); a layout where one cannot be formed,
as the plan loader would refuse it, is rejected (`_shaped`).
Configurations are enumerated a block at a time and only the best and the Pareto front
are held, so memory stays bounded on sweeps of millions of configurations.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cache, lru_cache
from typing import Any

import numpy as np

from budget import flops
from budget.check import Limits
from budget.collectives import (
    Algorithm,
    CollectiveCost,
    Known,
    Stage,
    Tier,
    collective_cost,
    repeated,
    spanned_link,
    with_steps,
)
from budget.errors import BudgetError
from budget.layers import (
    StageClass,
    chunk_times_differ,
    class_params,
    merge_classes,
    mtp_layers,
    params_total,
    shapes,
    stage_classes,
    stage_states,
)
from budget.phases import Alloc, Move, MoveGroup, Step
from budget.plan import expr
from budget.plan.model import (
    Overlap,
    Parallel,
    Pipeline,
    Plan,
    Recompute,
    Schedule,
    Topology,
    Transition,
    deepspeed_grads_mismatch,
    dp_before_cp,
    gather_overlap_alone,
    in_place_reduce_mismatch,
    unlaunchable_expert_grid,
)
from budget.plan.resolve import (
    MAX_ELEMENTS,
    divisors,
    fp8_gather_mismatch,
    fp8_params_unsharded,
    gather_rounds_master,
    parse_placement,
    ranks_beside_ep,
    shape_names,
    ties_apart,
)
from budget.plan.transitions import (
    check_chains,
    co_sharded,
    pipeline_phase,
    placed_beside_ep,
    shapes_differ,
)
from budget.schedule import (
    PhaseTime,
    Replay,
    StageTime,
    TimedMove,
    algorithm_of,
    cluster_peak,
    move_kind,
    move_span,
    phase_part,
    put_off,
    replay_of,
    step_rates,
    step_time,
)
from budget.step import STAGES_APART, derive
from budget.topology import (
    group_size,
    level_ranks,
    link_of,
    pp_stride,
    stride_levels,
    tp_overlap_problem,
    uneven_group,
)
from budget.vector import add_into, every, vsum

CHUNK = 16_384  # configurations evaluated together at most: ~200 MiB peak for any sweep size
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class Config:
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    zero: int
    sequence_parallel: bool
    recompute: Recompute
    micro: int
    virtual_stages: int
    # hybrid sharding's shard group (`Parallel.dp_shard`, `Space.hybrid`); 0: ZeRO over all
    # of dp, as without the key
    dp_shard: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in FIELDS}
        out["dp_shard"] = self.dp_shard or None
        return out


FIELDS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "zero",
    "sequence_parallel",
    "recompute",
    "micro",
    "virtual_stages",
    "dp_shard",
)


@dataclass(frozen=True, slots=True)
class Columns:
    """Configurations as one array per field (a sweep never makes an object per layout
    until it reports one)."""

    values: dict[str, Any]  # one numpy array per field

    def __len__(self) -> int:
        return len(self.values["tp"])

    def take(self, index: np.ndarray | slice) -> Columns:
        return Columns({k: v[index] for k, v in self.values.items()})

    def configs(self) -> list[Config]:
        lists = [self.values[f].tolist() for f in FIELDS]
        return [Config(*row) for row in zip(*lists, strict=True)]

    @classmethod
    def of(cls, configs: Sequence[Config]) -> Columns:
        def column(name: str) -> np.ndarray:
            kind: Any = (
                bool
                if name == "sequence_parallel"
                else (object if name == "recompute" else np.int64)
            )
            return np.array([getattr(c, name) for c in configs], dtype=kind)

        return cls({name: column(name) for name in FIELDS})


@dataclass(frozen=True, slots=True)
class Space:
    """The values each dimension may take; None means every value that divides."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[Recompute, ...] = RECOMPUTE
    micro: tuple[int, ...] | None = None
    virtual_stages: tuple[int, ...] = (1, 2, 4)
    # hybrid sharding's shard groups, in innermost domains (nodes): 0 ZeRO over all of dp;
    # n ≥ 1 (True is 1), each layout under ZeRO 1 to 3 also with a shard group of the dp
    # ranks n domains hold (`_shard_in_domain`)
    hybrid: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class Result:
    config: Config
    peak_bytes: int
    fits: bool
    step_time_s: float
    exposed_comm_s: float
    mfu: float
    tokens_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "peak_bytes": self.peak_bytes,
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "exposed_comm_s": self.exposed_comm_s,
            "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s,
        }


@dataclass(frozen=True, slots=True)
class Nearest:
    """How near a sweep's layouts came to what it asked, said where none ranks (a user
    audit, m419: an empty result named no layout and no limit to relax): the least peak of
    any layout evaluated, a lower bound where its model states alone ruled it out (no stage
    peaks below its states); of the layouts that fit, the least peak, the least step time
    (a lower bound where a replay was held pending: none steps in less) and the least of
    those priced exactly (a layout steps that fast: the least lies between the two; review
    m553: the bound alone, raised to as a limit, still ranked none), the least exposed
    share of the step; and how many that fit break each limit alone, whichever else they
    break (`Outcome.rejected` counts each under the first), with how many more a pending
    layout's bounds leave open on it (`_open_limits`: a layout an earlier limit rules out
    is not replayed for a later one; review m423 found those left out of the count)."""

    capacity: int  # the device's bytes, the peaks' measure
    least_peak: int | None = None
    fitting_peak: int | None = None
    fitting_step_s: float | None = None
    fitting_exposed_share: float | None = None
    over_each: dict[str, int] = field(default_factory=dict)
    undecided_each: dict[str, int] = field(default_factory=dict)
    fitting_exact_step_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity_bytes": self.capacity,
            "least_peak_bytes": self.least_peak,
            "fitting_least_peak_bytes": self.fitting_peak,
            "fitting_least_step_s": self.fitting_step_s,
            "fitting_least_exact_step_s": self.fitting_exact_step_s,
            "fitting_least_exposed_share": self.fitting_exposed_share,
            "over_each_limit": dict(self.over_each),
            "undecided_each_limit": dict(self.undecided_each),
        }


# fitting layouts held at a bound that `_Near` keeps to replay where none ranks: the least
# bounds of the sweep
NEAR_HELD = 16


class _Near:
    """`Nearest`, gathered as a sweep goes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # the fitting layouts held at the least bounds on their step (`NEAR_HELD`), to replay
        # once none ranks (`settle`): the nearest step is then a layout's own
        self.held: tuple[Columns, dict[str, np.ndarray]] | None = None
        self.least: int | None = None
        self.fit_peak: int | None = None
        self.fit_step: float | None = None
        self.fit_share: float | None = None
        self.fit_exact: float | None = None
        self.over: Counter[str] = Counter()
        self.open: Counter[str] = Counter()

    def bound(self, peaks: np.ndarray) -> None:
        """Layouts over the device by their model states, `peaks` their lower bounds."""
        if peaks.size:
            self.least = _least(self.least, int(peaks.min()))

    def measured(
        self,
        measured: dict[str, np.ndarray],
        breaks: list[tuple[str, Any]],
        opens: list[np.ndarray],
        cols: Columns | None = None,
    ) -> None:
        """A pass's layouts (`cols`, where those held at a bound are kept to replay), as
        `measure` (and `_settle_limits`) left them; `breaks` as `_breaks` gives them, `opens`
        as `_open_limits` does."""
        peak = measured["peak"]
        if not peak.size:
            return
        self.least = _least(self.least, int(peak.min()))
        fits = peak <= self.capacity
        if not fits.any():
            return
        _, share = _exposed_shares(measured)
        self.fit_peak = _least(self.fit_peak, int(peak[fits].min()))
        self.fit_step = _least(self.fit_step, float(measured["time"][fits].min()))
        exact = fits & ~measured["pending"]
        if exact.any():
            self.fit_exact = _least(self.fit_exact, float(measured["time"][exact].min()))
        if cols is not None and (fits & measured["pending"]).any():
            self._hold(cols, measured, np.flatnonzero(fits & measured["pending"]))
        self.fit_share = _least(self.fit_share, float(share[fits].min()))
        for (reason, over), open_ in zip(breaks, opens, strict=True):
            self.over[reason] += int((fits & over).sum())
            self.open[reason] += int((fits & open_).sum())

    def _hold(self, cols: Columns, measured: dict[str, np.ndarray], index: np.ndarray) -> None:
        """Keep the rows `index` among the `NEAR_HELD` least bounds held so far."""
        rows = {k: v[index] for k, v in measured.items()}
        part = cols.take(index)
        if self.held is not None:
            part = _join([self.held[0], part])
            rows = {k: np.concatenate([self.held[1][k], rows[k]]) for k in rows}
        least = np.argsort(rows["time"], kind="stable")[:NEAR_HELD]
        kept = {k: v[least] for k, v in rows.items()}
        _compact(kept)
        self.held = (part.take(least), kept)

    def settle(self, plan: Plan, gpus: int, spans: Spans | None) -> int:
        """Replay the fitting layouts held at the least bounds (`_replay_rows`), so that the
        least step priced exactly is, as likely as not, the fastest layout's (review m554:
        the fastest even layout's, 18.7 s, where a held one steps in 17.13 s). Returns how
        many it replayed."""
        if self.held is None:
            return 0
        cols, measured = self.held
        index = np.flatnonzero(measured["pending"])
        _replay_rows(plan, cols, gpus, spans, measured, index)
        self.fit_exact = _least(self.fit_exact, float(measured["time"].min()))
        self.held = None
        return int(index.size)

    def result(self) -> Nearest:
        return Nearest(
            self.capacity,
            self.least,
            self.fit_peak,
            self.fit_step,
            self.fit_share,
            dict(self.over),
            {reason: n for reason, n in self.open.items() if n},
            self.fit_exact,
        )


def _least(held: Any, value: Any) -> Any:
    return value if held is None else min(held, value)


@dataclass(frozen=True, slots=True)
class Outcome:
    gpus: int
    evaluated: int
    elapsed_s: float
    rejected: dict[str, int]  # layouts, by reason
    fitting: int  # how many layouts fit in device memory
    results: tuple[Result, ...]  # the ranked layouts (all, or the best `keep`), best first
    pareto: tuple[Result, ...]  # peak memory against step time, fastest first
    objective: str
    groups: int = 0  # passes of the engine (one per chunk of one structure)
    limits: Limits | None = None  # what a ranked layout must keep besides fitting
    within_limits: int | None = None  # how many fitting layouts keep them (with limits)
    hardware: dict[str, Any] = field(default_factory=dict)  # what the layouts were priced on
    # degrees none of whose layouts could be built ("tp 16"), by reason (`_Counts.ruled_out`)
    ruled_out: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # the plan's own layout as `budget PLAN` budgets it, to read the ranking against (a user
    # audit: nothing said how the best compared with the plan searched); None when the
    # search lays out another GPU count or the plan's layout is not a valid one
    written: Result | None = None
    # the `budget check` limits the plan as written breaks (their names), besides fitting
    written_breaks: tuple[str, ...] = ()
    # the model's layers and the multi-token prediction layers after them, which a ranked
    # layout's pipeline splits (`split`, `layers_per_stage`)
    layers: tuple[int, int] = (0, 0)
    # the plan's own split of its layers at its own depth (pp, v, layers per chunk), which
    # no ranked layout keeps: the sweep splits as `split` does; None where it has none
    own_split: tuple[int, int, tuple[int, ...]] | None = None
    # the values swept (to say which of the plan's own settings lie outside them)
    space: Space | None = None
    # layouts whose model chunks differ, priced again in Megatron-LM's order (`_Kept`)
    replayed: int = 0
    # of the layouts that do not fit, those their model states alone rule out, counted
    # without a pass of the engine (`_states_bound`)
    by_states: int = 0
    # how near the layouts came to fitting and keeping the limits (`Nearest`)
    nearest: Nearest | None = None

    @property
    def best(self) -> Result | None:
        return self.results[0] if self.results else None

    def layers_per_stage(self, config: Config) -> tuple[int, ...] | None:
        """The layers of each pipeline chunk a ranked layout was priced with where they do
        not split evenly (`split`), None where they do: 80 layers over pp 8 × 4 chunks are
        2 and 3 a chunk, which the table's "8×4" alone does not say and a plan of those
        degrees without the split is refused for (an audit)."""
        layers, tail = self.layers
        if not layers or config.pp * config.virtual_stages == 1:  # one chunk holds them all
            return None  # (a review: pp 1 with an MTP tail read as an uneven split)
        return split(layers, config.pp, config.virtual_stages, tail)

    def written_split(self) -> tuple[int, ...] | None:
        """The layers of each pipeline chunk of the plan as written where they split
        unevenly: its own ``layers_per_stage`` where the sweep leaves it out, else as a
        ranked layout's (`layers_per_stage`)."""
        if self.written is None:
            return None
        if self.own_split is not None:
            own = self.own_split[2]
            return own if len(set(own)) > 1 else None
        return self.layers_per_stage(self.written.config)


@cache
def _differ(plan: Plan, c: Config, gpus: int) -> bool:
    """Whether `budget PLAN` replays layout `c` of `plan` (`schedule.step_time`): it is not
    GPipe, and it is interleaved or its model chunks differ in size (`layers.
    chunk_times_differ` on the layout itself: 16 layers and one multi-token prediction
    layer over pp 8 × 2 split evenly, the last chunk then holding two, which a test of
    `split`'s sizes alone missed: a review)."""
    if _schedule(plan, c) == "gpipe":  # GPipe keeps the closed form
        return False
    if c.pp > 1 and c.virtual_stages > 1:  # interleaved: no need to build the layout
        return True
    return chunk_times_differ(apply(plan, c, gpus))


@dataclass
class _Counts:
    rejected: Counter[str] = field(default_factory=Counter)  # layouts, by reason
    # degrees whose every layout is ruled out before any is built ("tp 16"), by reason: a
    # count of them beside counts of layouts would read as layouts (an audit)
    ruled_out: dict[str, list[str]] = field(default_factory=dict)
    # in the blocks that build no layout (`blocking_rules`): their layouts, those each rule
    # rejects, and those no rule but it rejects
    unbuilt: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    alone: Counter[str] = field(default_factory=Counter)

    def rule_out(self, reason: str, degrees: str) -> None:
        self.ruled_out.setdefault(reason, []).append(degrees)


def candidates(plan: Plan, gpus: int, space: Space, counts: _Counts) -> Columns:
    """Every configuration that divides evenly, as one set of columns (`blocks`, joined)."""
    parts = list(blocks(plan, gpus, space, counts))
    if not parts:
        return Columns({name: np.zeros(0, dtype=np.int64) for name in FIELDS})
    return _join(parts)


def blocks(plan: Plan, gpus: int, space: Space, counts: _Counts) -> Iterator[Columns]:
    """Every configuration that divides evenly, one block per (tp, pp), counting the
    layouts that do not by reason.

    The rules are those the plan loader enforces (`budget.plan.resolve`): heads, kv heads
    and the MLP's widths divide by tp, layers by pp x virtual stages, the global batch by
    micro x dp, the sequence by 2·cp (either cp_attention), experts by ep and ep x etp by
    tp x dp x cp; sequence
    parallelism needs tp > 1; virtual stages need pp > 1 and micro-batches divisible by pp;
    full-width Q/K norms need tp 1, and a sliding window shorter than the sequence cp 1, as
    does eager attention.
    Micro-batches whose sizes would pass the engine's int64 margin are rejected too
    (`unsafe_micros`).
    tp and pp are enumerated one by one; the rest of the space is a grid of arrays. Blocks
    are yielded as they are made, so a sweep never holds all its configurations at once.
    """
    unsafe = np.asarray(
        unsafe_micros(plan, sweep_micros(plan, space), largest_ep(plan, gpus, space)),
        dtype=np.int64,
    )
    for tp, pp, cps, rest in _degrees(plan, gpus, space, counts):
        grid = _grid(plan, space, counts, tp, pp, cps, rest, unsafe)
        block = _shaped(plan, counts, _spread(plan, gpus, counts, grid))
        if len(block):
            yield block


def _degrees(
    plan: Plan, gpus: int, space: Space, counts: _Counts
) -> Iterator[tuple[int, int, list[int], int]]:
    """Each (tp, pp) of `blocks` that divides, with the cps that do and the GPUs tp x pp
    leaves (dp x cp); the degrees ruled out whole are counted."""
    m, b = plan.model, plan.batch
    ring_window = plan.parallel.cp_attention == "ring" and any(m.sliding)
    for tp in space.tp or divisors(gpus):
        if gpus % tp:
            counts.rule_out("does not divide: tp into the GPUs", f"tp {tp}")
            continue
        if m.heads % tp or m.kv_heads % tp:
            counts.rule_out("does not divide: heads or kv heads by tp", f"tp {tp}")
            continue
        if m.uncut_widths(tp, plan.parallel.etp):
            counts.rule_out("does not divide: MLP width by tp", f"tp {tp}")
            continue
        if m.qk_norm == "full_width" and tp > 1:
            counts.rule_out("full-width Q/K norms need tp 1", f"tp {tp}")
            continue
        for pp in space.pp or divisors(gpus // tp):
            if (gpus // tp) % pp:
                counts.rule_out("does not divide: pp into the GPUs left", f"tp {tp} × pp {pp}")
                continue
            rest = gpus // (tp * pp)
            cps = []
            for cp in space.cp or divisors(rest):
                degrees = f"tp {tp} × pp {pp} × cp {cp}"
                if rest % cp:
                    counts.rule_out("does not divide: cp into the GPUs left", degrees)
                elif cp > 1 and b.seq % (2 * cp):  # resolve's `context` rule
                    counts.rule_out("does not divide: sequence by 2·cp", f"cp {cp}")
                elif cp > 1 and 0 < m.window < b.seq:
                    counts.rule_out("a window shorter than the sequence needs cp 1", f"cp {cp}")
                elif cp > 1 and ring_window and plan.mode == "train":  # resolve's rule
                    counts.rule_out("a sliding window on the cp ring needs cp 1", f"cp {cp}")
                elif cp > 1 and m.attention == "eager":
                    counts.rule_out("eager attention needs cp 1", f"cp {cp}")
                else:
                    cps.append(cp)
            if cps:
                yield tp, pp, cps, rest


# The layouts a sweep may consider before its rules reject any (`grid_size`): the shipped
# plans' default sweeps consider 1.5 million on 98,304 GPUs (DeepSeek-MoE 16B; 2.9 million
# on 11,531,520), and GPT-3 on 1,024 GPUs with --micro 1..1024 18.5 million, made in 6.2 s;
# past this a sweep would take minutes (an audit: --micro 1..1024 --virtual-stages 1..1024,
# 503 million, took 77 s and 10 GB; five ranges of 1,024 values were killed for memory at
# 24 GB)
MAX_GRID = 2**25
GRID_PIECE = 2**18  # grid points made at once: a few tens of MiB however large the grid


def buildable(plan: Plan, gpus: int, space: Space) -> int:
    """How many layouts of `space` its rules build (`blocks`), none priced; 0 where the
    sweep would consider more than `MAX_GRID`."""
    if grid_size(plan, gpus, space) > MAX_GRID:
        return 0
    return sum(len(block) for block in blocks(plan, gpus, space, _Counts()))


def blocking_rules(plan: Plan, gpus: int, space: Space) -> list[str]:
    """Of a sweep that builds no layout, the rules in its way: each that rejects every
    layout (`--sp true --tp 1`: sequence parallelism needs tp > 1), else each that alone
    rejects some, most first; where the first rule a layout breaks, which
    `Outcome.rejected` counts, may be one that only rejects it beside them."""
    counts = _Counts()
    for _ in blocks(plan, gpus, space, counts):
        pass
    total = counts.unbuilt
    every = [f"{r}: all {total:,} layouts" for r, n in counts.failed.items() if n == total > 0]
    alone = sorted(((r, n) for r, n in counts.alone.items() if n), key=lambda x: -x[1])
    return every or [f"{r}: {n:,} layouts, and no other rule rejects them" for r, n in alone]


def grid_size(plan: Plan, gpus: int, space: Space) -> int:
    """How many layouts the sweep of `space` considers, valid or not: the grids' points
    over every (tp, pp) that divides (`_axes`), each cp with its own micro-batch sizes
    unless `--micro` gives them all (`_grid`), the count `MAX_GRID` bounds."""
    size = 0
    for tp, _, cps, rest in _degrees(plan, gpus, space, _Counts()):
        axes, _, own = _axes(plan, space, tp, cps, rest)
        size += math.prod(len(axis) for axis in axes[1:-1]) * int(own.sum())
    return size


def _axes(
    plan: Plan, space: Space, tp: int, cps: list[int], dp_cp: int
) -> tuple[list[np.ndarray], list[int], np.ndarray]:
    """The axes of one (tp, pp)'s grid (`_grid`): indices into `cps`, ep, virtual stages,
    sequence parallelism, ZeRO, indices into the recompute modes and into the micro-batch
    sizes; with those sizes, and which of them each cp keeps (a cp by micro-batch size
    matrix: each its own, the sizes that divide the batch of one of its replicas, unless
    --micro gives them all)."""
    b, experts = plan.batch, plan.model.experts
    etp = plan.parallel.etp or tp  # tp is this block's, not the plan's
    stage = tp * dp_cp
    fold = stage // etp if stage % etp == 0 else 1
    eps = space.ep or ([e for e in divisors(fold) if experts.count % e == 0] if experts else [1])
    own_micros = {
        cp: space.micro
        or divisors(b.global_batch // (dp_cp // cp) if b.global_batch % (dp_cp // cp) == 0 else 1)
        for cp in cps
    }
    micros = sorted(set().union(*own_micros.values()))
    axes = [
        np.arange(len(cps)),
        np.asarray(eps),
        np.asarray(space.virtual_stages),
        np.asarray(space.sequence_parallel, dtype=bool),
        np.asarray(space.zero),
        np.arange(len(space.recompute)),
        np.asarray(space.hybrid, dtype=np.int64),
        np.arange(len(micros)),
    ]
    own = np.array([[size in own_micros[c] for size in micros] for c in cps], dtype=bool)
    return axes, micros, own


@lru_cache(maxsize=4096)
def _uneven(parallel: Parallel, topology: Topology, experts: bool) -> bool:
    """`uneven_group` once per layout of degrees (a sweep meets each twice with a progress
    bar: counting, then evaluating)."""
    return uneven_group(parallel, topology, experts) is not None


@lru_cache(maxsize=4096)
def _tp_unoverlapped(parallel: Parallel, topology: Topology) -> bool:
    """`topology.tp_overlap_problem` once per layout of degrees."""
    return tp_overlap_problem(parallel, topology) is not None


# why `run` drops a layout whose hand-written collective over pp some stages would not join
PP_APART = "a hand-written transition's collective over pp runs in a phase some stages skip"
# why `_spread` drops a layout
UNEVEN = "a group spreads over the topology's domains unevenly or unlike rank 0's"
# resolve's `_check_tp_overlap`
TP_OVERLAP = "overlap.tp over a tp group wider than one NVLink domain"

# the degrees that place a layout's groups (`_spread`, `_Pricer`)
_DEGREES = ("tp", "pp", "dp", "cp", "ep", "dp_shard")


def _parallel(plan: Plan, degrees: tuple[int, ...]) -> Parallel:
    """`plan`'s parallel section with one layout's `_DEGREES` (dp_shard 0: none)."""
    tp, pp, dp, cp, ep, shard = degrees
    return replace(plan.parallel, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, dp_shard=shard or None)


def _spread(plan: Plan, gpus: int, counts: _Counts, block: Columns) -> Columns:
    """`block` without the layouts whose groups a single plan refuses: a group must hold
    the same number of ranks in each domain it touches, and span the levels as rank 0's
    group of its kind does (`topology.uneven_group`); under overlap.tp, the tp group must
    stay in one domain of the innermost level (`topology.tp_overlap_problem`)."""
    if not len(block):
        return block
    topology = replace(plan.topology, gpus=gpus)
    values = block.values
    degrees = np.stack([values[k] for k in _DEGREES], axis=1)
    first, which = _distinct_rows(degrees)
    keep = np.ones(len(block), dtype=bool)
    overlapped = np.ones(len(block), dtype=bool)  # kept by all but the tp overlap's rule
    for row, i in enumerate(first.tolist()):
        parallel = _parallel(plan, tuple(int(x) for x in degrees[i]))
        if _uneven(parallel, topology, plan.model.experts is not None):
            keep &= which != row
        elif plan.overlap.tp and _tp_unoverlapped(parallel, topology):
            overlapped &= which != row
    for reason, kept in ((UNEVEN, keep), (TP_OVERLAP, overlapped)):
        if not kept.all():
            counts.rejected[reason] += len(block) - int(kept.sum())
    keep &= overlapped
    return block if keep.all() else block.take(np.flatnonzero(keep))


def _names(plan: Plan, values: dict[str, Any]) -> dict[str, Any]:
    """The names a transition's shape may use (`resolve.shape_names`), with a sweep's
    degrees and micro-batch sizes (`values`: arrays over its layouts, or one layout's ints)."""
    names = shape_names(plan.model, plan.batch, plan.parallel, plan.mode != "train")
    names.update({k: values[k] for k in ("micro", "tp", "pp", "dp", "cp", "ep")})
    return names


def _shape_of(tr: Transition, names: dict[str, Any]) -> tuple[tuple[Any, ...], list[np.ndarray]]:
    """`tr`'s shape under `names` (ints or arrays), and where it cannot be formed as the
    plan loader forms it (`resolve`), by reason (`SHAPE_REASONS`): a dimension that divides
    by zero or unevenly (`expr.evaluate_each`), one below 1, more than `MAX_ELEMENTS` in
    all. Counted in Python's integers, as the loader counts (in int64 a product past 2^63
    wrapped to a small one, and a review's 2^65 + 1 elements were ranked); the shape comes
    back as int64 arrays, 1 where it cannot be formed, or one layout's as ints."""
    exact = {k: np.asarray(v, dtype=object) for k, v in names.items()}  # ints as Python's
    dims: list[Any] = []
    defined, even, positive = np.array(True), np.array(True), np.array(True)
    for dim in tr.dims or tr.shape:
        if isinstance(dim, str):
            value, by_nonzero, evenly = expr.evaluate_each(_parsed(dim), exact)
            defined, even = defined & by_nonzero, even & evenly
            positive = positive & (np.asarray(value) >= 1)
            dims.append(value)
        else:
            dims.append(dim)
    formed = defined & even & positive
    small = formed & (math.prod(dims) <= MAX_ELEMENTS)
    # int64 where it can be formed (then within 2^48), 1 elsewhere; one layout's as ints
    held = [np.where(small, np.asarray(d, dtype=object), 1).astype(np.int64) for d in dims]
    shape = tuple(int(d) if d.ndim == 0 else d for d in held)
    return shape, [
        ~defined,
        defined & ~even,
        defined & even & ~positive,
        formed & ~small,
    ]


SHAPE_REASONS = (
    "a hand-written transition's shape divides by zero",
    "a hand-written transition's shape does not divide evenly",
    "a hand-written transition's dimension is below 1",
    "a hand-written transition's tensor holds more than 2^48 elements",
)


@lru_cache(maxsize=256)
def _parsed(text: str) -> expr.Expr:
    return expr.parse(text)


def reshaped(plan: Plan, values: dict[str, Any]) -> tuple[Transition, ...]:
    """The plan's hand-written transitions with their shapes evaluated for a sweep's
    layouts (`values`, as `_names` takes them), which `_shaped` has kept to those where
    every shape can be formed; one layout's as ints."""
    names = _names(plan, values)
    out = []
    for tr in plan.transitions:
        shape, _ = _shape_of(tr, names)
        out.append(replace(tr, shape=shape))
    return tuple(out)


def _shaped(plan: Plan, counts: _Counts, block: Columns) -> Columns:
    """`block` without the layouts where `budget PLAN` would refuse a hand-written transition
    of the plan: a shape that cannot be formed (`_shape_of`), a shard that does not divide
    over its group or, sharded on two at once, over theirs (`co_sharded`), or without a
    pipeline (pp 1) a stage send or a phase of one (`transitions.pipeline_phase`)."""
    if not plan.transitions or not len(block):
        return block
    names = _names(plan, block.values)
    keep = np.ones(len(block), dtype=bool)
    reasons = (
        *SHAPE_REASONS,
        "a hand-written transition's shard does not divide over its group",
        "a hand-written transition sends between stages, and pp 1 has none",
        "a hand-written transition gives its tensor another shape",
        "a hand-written transition splits or sums on ep and on a group sharing its ranks",
    )
    broken = {reason: np.zeros(len(block), dtype=bool) for reason in reasons}

    def drop(reason: str, out: Any) -> None:
        nonlocal keep
        broken[reason] |= keep & out
        keep &= ~np.asarray(out)

    shapes = {}
    for tr in plan.transitions:
        shape, outs = shapes[id(tr)] = _shape_of(tr, names)
        for reason, out in zip(SHAPE_REASONS, outs, strict=True):
            drop(reason, out)
        for text in (tr.src, tr.dst):
            kind, dim = parse_placement(text)
            if kind == "shard" and dim is not None:  # a dimension the tensor has (resolve)
                drop(reasons[4], np.asarray(shape[dim] % names[tr.group]) != 0)
        sends = tr.group == "pp" and tr.src == tr.dst
        if sends or pipeline_phase(plan.mode, tr.phase) is not None:
            drop(reasons[5], block.values["pp"] == 1)
    first: dict[str, tuple[int, ...]] = {}  # a name is one tensor (`transitions._unlike`)
    for tr in plan.transitions:
        shape = shapes[id(tr)][0]
        drop(reasons[6], shapes_differ(first.setdefault(tr.name, shape), shape))
    parsed = check_chains(plan.file, plan.mode, plan.transitions)[0]
    for placing, dim, on in co_sharded(plan.mode, parsed):
        ranks = math.prod(names[group] for group in on)
        for tr in placing:  # each placing transition's own shape (`co_sharded`)
            drop(reasons[4], np.asarray(shapes[id(tr)][0][dim] % ranks) != 0)
    beside = {group for _, group in placed_beside_ep(plan.mode, parsed)}
    if beside:  # the layouts whose ep group shares ranks with one of those groups
        degrees = np.stack([block.values[k] for k in _DEGREES], axis=1)
        rows, which = _distinct_rows(degrees)
        for row, i in enumerate(rows.tolist()):
            parallel = _parallel(plan, tuple(int(x) for x in degrees[i]))
            if any(len(ranks_beside_ep(parallel, group)) > 1 for group in beside):
                drop(reasons[7], which == row)
    for reason, mask in broken.items():
        if mask.any():
            counts.rejected[reason] += int(mask.sum())
    return block if keep.all() else block.take(np.flatnonzero(keep))


def _grid(
    plan: Plan,
    space: Space,
    counts: _Counts,
    tp: int,
    pp: int,
    cps: list[int],
    dp_cp: int,
    unsafe: np.ndarray,
) -> Columns:
    """The grid of cp (of `cps`, with dp = `dp_cp` / cp), ep, virtual stages, sequence
    parallelism, ZeRO stage, recompute and micro-batch for one (tp, pp), less the layouts
    the rules reject (counted).
    dp x cp is the same for every cp here, so the ep values are (those ep x etp fits in
    tp x dp x cp, Megatron-Core's parallel folding); the micro-batch sizes
    that divide the batch of one replica are not, and each cp keeps only its own (as if
    its grid were made alone: those left out are not candidates, not rejected ones)."""
    axes, micros, own = _axes(plan, space, tp, cps, dp_cp)
    shape = tuple(len(axis) for axis in axes)
    size = math.prod(shape)
    # the grid's points in meshgrid's order, `GRID_PIECE` at a time: made whole, its arrays
    # took ~100 bytes a point (an audit's five ranges of 1,024 values: 24 GB)
    starts = range(0, size, GRID_PIECE) if size else range(1)
    return _join(
        [
            _grid_piece(
                plan,
                space,
                counts,
                (tp, pp, dp_cp),
                cps,
                unsafe,
                (axes, micros, own),
                np.unravel_index(np.arange(start, min(size, start + GRID_PIECE)), shape),
            )
            for start in starts
        ]
    )


def _grid_piece(
    plan: Plan,
    space: Space,
    counts: _Counts,
    degrees: tuple[int, int, int],
    cps: list[int],
    unsafe: np.ndarray,
    grid: tuple[list[np.ndarray], list[int], np.ndarray],
    points: tuple[np.ndarray, ...],
) -> Columns:
    """The layouts of `_grid` at `points` (an index into each of its axes), less those the
    rules reject (counted). `degrees` are (tp, pp, dp x cp), `grid` the axes, micro-batch
    sizes and which of them each cp keeps (`_grid`)."""
    (tp, pp, dp_cp), (axes, micros, own) = degrees, grid
    m, b = plan.model, plan.batch
    experts = m.experts
    etp = plan.parallel.etp or tp
    ci, ep, v, sp, zero, rc, hy, mi = (axis[i] for axis, i in zip(axes, points, strict=True))
    if not own.all():  # each cp keeps only its own micro-batch sizes
        keep = np.flatnonzero(own[ci, mi])
        ci, ep, v, sp, zero, rc, hy, mi = (a[keep] for a in (ci, ep, v, sp, zero, rc, hy, mi))
    cp, micro = np.asarray(cps)[ci], np.asarray(micros)[mi]
    dp = dp_cp // cp
    # hybrid sharding's shard group, worked out only where the sweep asks for it
    nodes, hy = hy, hy > 0
    shard = _shard_in_domain(plan, tp, cp, pp, dp, nodes) if hy.any() else 0 * dp
    count = np.asarray(experts.count if experts else 1)
    deepspeed_piped = (
        bool(plan.parallel.reduce_bucket) & (pp > 1) & flops.deepspeed_zero(zero, plan.precision)
    )
    # a sweep's full-recompute layouts, worked out only where a rule reads them
    full = np.asarray(space.recompute, dtype=object)[rc] == "full" if plan.overlap.ep else np.False_
    rules = [
        (
            "does not divide: experts by ep",
            ((ep > 1) & (experts is None)) | (count % ep != 0),
        ),
        ("fewer layers than pipeline chunks", m.layers < pp * v),
        ("virtual stages need pp > 1", (v > 1) & (pp == 1)),
        ("sequence parallelism needs tp > 1", sp & (tp == 1)),
        (
            "does not divide: sequence by cp x tp (sequence parallelism)",
            sp & (tp > 1) & (b.seq % (cp * tp) != 0),
        ),
        (
            "does not divide: ep x etp into tp x cp x dp",
            (tp * cp * dp) % (ep * etp) != 0,
        ),
        ("MoE under tp > 1 needs sequence parallelism", (experts is not None) & (tp > 1) & ~sp),
        (
            # resolve's `experts`: Megatron-Core's refusal under a plan's parallel.order
            "expert grid Megatron-Core does not build under parallel.order",
            (experts is not None)
            & (plan.mode == "train")
            & unlaunchable_expert_grid(plan.parallel.order, tp, cp, dp, pp, ep, etp),
        ),
        (
            "same as ZeRO 0: one data-parallel rank shards nothing",
            # and no expert states sharded over an expert data-parallel group > 1; ZeRO 3
            # under FSDP's mixed precision still casts and copies what it gathers, on one
            # rank too (`flops.fsdp_gather_copies`; an audit: 23 ms a step slower)
            (zero > 0)
            & ((zero != 3) | (not flops.fsdp_formats(plan.precision)))
            & (dp * cp == 1)
            & (0 in space.zero)
            & ((experts is None) | (tp == ep * etp)),
        ),
        (
            "ZeRO 1 or 2 gathering parameters narrower than their own master copy",
            # one data-parallel rank gathers only experts over an expert data-parallel group
            np.isin(zero, (1, 2))
            & ((dp * cp > 1) | ((experts is not None) & (tp != ep * etp)))
            & gather_rounds_master(plan.precision),
        ),
        (
            "ZeRO 1 or 2 gathering fp8 beside wider parameters, or fp8 parameters wider",
            np.isin(zero, (1, 2))
            & ((dp * cp > 1) | ((experts is not None) & (tp != ep * etp)))
            & fp8_gather_mismatch(plan.precision),
        ),
        (
            "fp8 parameters need ZeRO (--fp8-param-gather needs the distributed optimizer)",
            fp8_params_unsharded(plan.precision, zero, plan.mode),
        ),
        # resolve's `_check_deepspeed_pipeline`
        ("DeepSpeed's ZeRO 2 and 3 run without a pipeline", deepspeed_piped),
        (
            "DeepSpeed's ZeRO 3 runs no experts",
            bool(plan.parallel.reduce_bucket and experts is not None)
            & (zero == 3)
            & flops.deepspeed_zero(3, plan.precision),
        ),
        # resolve's `_check_pipeline_zero3`, which leaves a DeepSpeed plan to the rule above
        # (a review: a DeepSpeed plan was told of PyTorch's pipeline schedules too)
        ("ZeRO 3 is priced without a pipeline only", (zero == 3) & (pp > 1) & ~deepspeed_piped),
        # resolve's `_check_tied_pipeline`
        (
            "PyTorch's pipeline ties no weights across stages",
            np.asarray(pp > 1) & ties_apart(m.tied_embeddings, plan.loss, plan.parallel.tp_style),
        ),
        ("does not divide: global batch by micro x dp", b.global_batch % (micro * dp) != 0),
        ("micro-batch past the search's 64-bit margin (sizes of 2^59)", np.isin(micro, unsafe)),
        (
            # Megatron-LM's rule (`resolve._check_interleaved_sends`)
            "interleaved over pp 2 needs overlap.pp",
            (v > 1) & (pp == 2) & (not plan.overlap.pp),
        ),
        (
            # Megatron-Core's rule (`resolve._check_expert_overlap`)
            "overlap.ep over a pipeline needs virtual stages",
            (v == 1) & (pp > 1) & plan.overlap.ep,
        ),
        (
            # `resolve._check_expert_overlap` too: the chunk's whole recompute is not priced
            "overlap.ep beside full recompute",
            full,
        ),
        (
            "does not divide: micro-batches by pp (interleaved)",
            (v > 1) & ((b.global_batch // (micro * dp)) % pp != 0),
        ),
        # hybrid sharding (`Space.hybrid`) where the plan loader takes it (`_check_hybrid`)
        ("hybrid sharding needs ZeRO 1 to 3", hy & (zero == 0)),
        (
            "hybrid sharding: no shard group of whole dp ranks in its nodes, short of dp",
            hy & ((shard < 1) | (shard >= dp) | (shard * cp < 2)),
        ),
        (
            "hybrid sharding is priced for experts not split apart (ep 1, etp = tp)",
            hy & ((ep > 1) | (etp != tp)),
        ),
        (
            "hybrid sharding beside DeepSpeed's reduce_bucket",
            hy & bool(plan.parallel.reduce_bucket),
        ),
        (
            "DeepSpeed's ZeRO 2 with gradients not in the parameters' format",
            deepspeed_grads_mismatch(zero, plan.parallel.reduce_bucket, plan.precision),
        ),
        (
            "ZeRO 0 or 1 reducing its gradients in another format than it keeps them",
            in_place_reduce_mismatch(zero, plan.precision),
        ),
        (
            "ZeRO 1 overlapping its parameter gather without its gradient reduction",
            gather_overlap_alone(zero, plan.overlap.param_gather, plan.overlap.dp_grads),
        ),
        (
            "hybrid sharding beside cp with dp before cp in parallel.order",
            hy & (cp > 1) & dp_before_cp(plan.parallel.order),
        ),
    ]
    valid = np.ones(len(ep), dtype=bool)
    for reason, fails in rules:
        bad = valid & fails
        if bad.any():
            counts.rejected[reason] += int(bad.sum())
        valid &= ~fails
    n = int(valid.sum())
    if n == 0 and len(valid):  # which rules stand in the way (`blocking_rules`)
        masks = [np.broadcast_to(fails, valid.shape) for _, fails in rules]
        failing = np.sum(masks, axis=0)
        counts.unbuilt += len(valid)
        for (reason, _), mask in zip(rules, masks, strict=True):
            counts.failed[reason] += int(mask.sum())
            counts.alone[reason] += int((mask & (failing == 1)).sum())
    recompute = np.asarray(space.recompute, dtype=object)[rc[valid]]
    return Columns(
        {
            "tp": np.full(n, tp, dtype=np.int64),
            "pp": np.full(n, pp, dtype=np.int64),
            "dp": dp[valid].astype(np.int64),
            "cp": cp[valid].astype(np.int64),
            "ep": ep[valid].astype(np.int64),
            "zero": zero[valid].astype(np.int64),
            "sequence_parallel": sp[valid],
            "recompute": recompute,
            "micro": micro[valid].astype(np.int64),
            "virtual_stages": v[valid].astype(np.int64),
            "dp_shard": shard[valid].astype(np.int64),
        }
    )


def _shard_in_domain(plan: Plan, tp: int, cp: Any, pp: int, dp: Any, nodes: Any = 1) -> Any:
    """Hybrid sharding's shard group for a sweep (`Space.hybrid`): the dp ranks `nodes`
    domains of the topology's innermost level hold (a node's GPUs; 0: none), as PyTorch
    FSDP's HYBRID_SHARD shards within a node by default and larger models shard over a few
    (torchtitan's data_parallel_shard_degree), given the degrees `parallel.order` lists
    before dp (whose ranks vary faster, so that the next node holds the next dp ranks); 0
    where that is not a whole number of dp ranks dividing dp. Arrays over a grid's layouts
    (cp, dp and nodes), or ints."""
    domain = plan.topology.levels[0].size or 0
    degrees = {"tp": tp, "cp": cp, "pp": pp}
    before = 1
    for kind in plan.parallel.order[: plan.parallel.order.index("dp")]:
        before = before * degrees.get(kind, 1)  # ep is no dense dimension
    # the ranks of the nodes together: a dp rank may span nodes (tp x cp above a node's
    # GPUs, a review: tp 8 x cp 2 on 8-GPU nodes had no shard group of 2 or 4 nodes)
    span = domain * nodes
    shard = np.where(span % before == 0, span // before, 0)
    return np.where((shard > 0) & (dp % np.maximum(shard, 1) == 0), shard, 0)


def apply(plan: Plan, c: Config, gpus: int) -> Plan:
    """`plan` with configuration `c` (the model, batch, precision, device and topology kept)."""
    schedule = _schedule(plan, c)
    parallel = replace(
        plan.parallel,
        tp=c.tp,
        pp=c.pp,
        dp=c.dp,
        cp=c.cp,
        ep=c.ep,
        sequence_parallel=c.sequence_parallel,
        zero=c.zero,
        dp_shard=c.dp_shard or None,
        pipeline=_pipeline(plan, schedule, c.pp, c.virtual_stages),
    )
    return replace(
        plan,
        parallel=parallel,
        batch=replace(plan.batch, micro=c.micro),
        recompute=c.recompute,
        topology=replace(plan.topology, gpus=gpus),
        transitions=reshaped(
            plan,
            {"micro": c.micro, "tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "ep": c.ep},
        ),
    )


def _schedule(plan: Plan, c: Config) -> Schedule:
    """Interleaved with virtual stages; otherwise the plan's schedule (1F1B for a plan
    that interleaved)."""
    return "interleaved" if c.virtual_stages > 1 else _flat(plan)


def _flat(plan: Plan) -> Schedule:
    """The plan's schedule without virtual stages: its own, 1F1B for one that interleaved."""
    own = plan.parallel.pipeline.schedule
    return "1f1b" if own == "interleaved" else own


@cache
def split(layers: int, pp: int, v: int, tail: int = 0) -> tuple[int, ...] | None:
    """Layers per pipeline chunk: even when they divide (None), otherwise as even as
    possible with the extra layers on the middle chunks, since the first and last stages
    also hold the embedding and the loss (Llama 3, arXiv 2407.21783, section 3.3.2).

    `tail` layers run after the last chunk on its stage (multi-token prediction modules,
    `layers.mtp_layers`): they are split as layers of the last chunk, which then holds
    that many fewer of the model's (Megatron-LM's ``--decoder-last-pipeline-num-layers``
    is how such a split is asked for), as long as it keeps one."""
    chunks = pp * v
    total = layers + tail
    if total % chunks == 0 and tail == 0:
        return None
    base, extra = divmod(total, chunks)
    middle = sorted(range(chunks), key=lambda i: (abs(2 * i - (chunks - 1)), i))[:extra]
    sizes = [base + (i in middle) for i in range(chunks)]
    sizes[-1] -= tail
    if sizes[-1] < 1:
        return split(layers, pp, v)
    return tuple(sizes)


def structure(plan: Plan, cols: Columns) -> np.ndarray:
    """A key per configuration for what decides the phases, allocations and transitions
    its step has; configurations with one key are evaluated together. Everything else
    (degrees, ZeRO stage, recompute, sequence parallelism, micro-batch) is carried as
    arrays. So are the pipeline depth and virtual stages of layouts whose stages fall into
    the same classes (`layers.StageClass`: the first stage, the middle ones, the last, in
    order, each with dense layers, MoE layers or both) when pipeline sends are not
    overlapped: then only the layer counts (and first model chunks' counts), stage indices
    and copies differ, as arrays too."""
    pp, v = cols.values["pp"], cols.values["virtual_stages"]
    links = _send_links(plan, cols)
    shape = np.zeros(len(cols), dtype=np.int64)
    first, which = _distinct_rows(np.stack([pp, v, links], axis=1))
    for row, i in enumerate(first.tolist()):
        shape[which == row] = _shape_id(plan, int(pp[i]), int(v[i]), _LINK_LEVELS[links[i]])
    # a hand-written stage send leaves the stage at the model's end only without virtual
    # stages (`step._with_transitions`): that stage's phases differ between the two
    sends = any(tr.group == "pp" and tr.src == tr.dst for tr in plan.transitions)
    chunked = (v > 1) if sends else np.zeros(len(cols), dtype=bool)
    # hybrid sharding moves the data-parallel collectives to other groups (`step._hybrid`),
    # under ZeRO 3 (PyTorch FSDP's) each all-reduce across the copies on a stream of its own
    hybrid = (cols.values["dp_shard"] > 0) * (1 + (cols.values["zero"] == 3))
    # a full recompute stopping early skips fc2 in PyTorch's layers, not in Megatron-LM's
    # tensor-parallel ones (`step.early_stop`): tp 1 and above apart
    stops = plan.recompute_early_stop and plan.parallel.tp_style == "megatron"
    layers = (cols.values["tp"] > 1) if stops else np.zeros(len(cols), dtype=bool)
    return np.stack([shape, cols.values["ep"] > 1, chunked, hybrid, layers], axis=1).astype(
        np.int64
    )


# One number per distinct sequence of stage classes, for the life of the process (a sweep
# meets a few dozen); numbers, not the tuples, go into the arrays of keys.
_SHAPES: dict[tuple[Any, ...], int] = {}


def _shape_id(plan: Plan, pp: int, v: int, links: tuple[int, ...]) -> int:
    """A number for the sequence of stage classes of `plan` cut into `pp` stages of `v`
    chunks whose boundaries' sends run on `links`' levels: their places (`_place`), and
    with overlapped pipeline sends (whose exposure depends on the schedule) the depth and
    chunks themselves."""
    if plan.overlap.pp:
        key: tuple[Any, ...] = ("apart", pp, v, links)
    else:
        key = tuple(_place(c) for c in _stage_classes(plan, pp, v, links))
    return _SHAPES.setdefault(key, len(_SHAPES))


# The levels a layout's stage boundaries send on (`topology.send_levels`), numbered for the
# life of the process as `_SHAPES` are: a sweep meets a few patterns (every boundary across
# nodes, or every n-th where n stages share a node)
_LINK_IDS: dict[tuple[int, ...], int] = {}
_LINK_LEVELS: list[tuple[int, ...]] = []


def _send_links(plan: Plan, cols: Columns) -> np.ndarray:
    """For each configuration, the number of the levels its stage sends run on, boundary
    by boundary (`_LINK_LEVELS` holds them): they follow from the depth and the distance
    between stages (`topology.pp_stride`), worked out once per distinct pair of them."""
    values = cols.values
    parallel = replace(plan.parallel, tp=values["tp"], cp=values["cp"], dp=values["dp"])
    pp = values["pp"]
    stride = np.asarray(pp_stride(parallel)) * np.ones_like(pp)
    first, which = _distinct_rows(np.stack([pp, stride], axis=1))
    sizes = tuple(lv.size for lv in plan.topology.levels)
    ids = np.empty(len(first), dtype=np.int64)
    for row, i in enumerate(first.tolist()):
        levels = stride_levels(int(pp[i]), int(stride[i]), sizes)
        if levels not in _LINK_IDS:
            _LINK_IDS[levels] = len(_LINK_LEVELS)
            _LINK_LEVELS.append(levels)
        ids[row] = _LINK_IDS[levels]
    out: np.ndarray = ids[which]
    return out


def _place(c: StageClass) -> tuple[bool, bool, bool, bool, bool, tuple[int, int]]:
    """What of a stage class decides the structure of its step: first, last, whether it
    holds dense and MoE layers, whether its last layer is MoE (not the counts), and the
    levels its sends run on."""
    return (c.first, c.last, bool(c.dense > 0), bool(c.moe > 0), c.last_is_moe, c.links)


@lru_cache(maxsize=1024)
def _stage_classes(
    plan: Plan, pp: int, v: int, links: tuple[int, ...], merge: bool = True
) -> list[StageClass]:
    """The stage classes of `plan` cut into `pp` stages of `v` chunks each, split as
    `apply` splits them (once per sweep: every block meets them again), its boundaries'
    sends on `links`' levels; with `merge` off, one per stage (`stage_classes`). The merged
    are made of the unmerged, which a replay reads too (`_stage_rows`): each stage's layers
    in flight are replayed once, not twice."""
    if merge:
        return merge_classes(_stage_classes(plan, pp, v, links, merge=False))
    schedule: Schedule = "interleaved" if v > 1 else "1f1b"
    parallel = replace(
        plan.parallel,
        pp=pp,
        pipeline=_pipeline(plan, schedule, pp, v),
    )
    return stage_classes(replace(plan, parallel=parallel), merge=False, levels=links)


def _pipeline(plan: Plan, schedule: Schedule, pp: int, v: int) -> Pipeline:
    """The plan's pipeline settings with a sweep's schedule and an even split of its layers
    into `pp` stages of `v` chunks (what else the plan says, such as scatter/gather stage
    sends, is kept; its own ``layers_per_stage`` is not, `own_split`)."""
    return replace(
        plan.parallel.pipeline,
        schedule=schedule,
        virtual_stages=v,
        layers_per_stage=split(plan.model.layers, pp, v, mtp_layers(plan)),
    )


def own_split(plan: Plan) -> tuple[int, int, tuple[int, ...]] | None:
    """(pp, virtual stages, layers per chunk) of the plan's own ``layers_per_stage`` where
    it splits the layers otherwise than `split` would at its depth, which the sweep leaves
    out (an audit: a plan's 16, 24, 24, 16 over pp 4 was priced as 20 a stage, and the
    plan as written read 1.12× slower than the "same" layout, unsaid); None where it gives
    none, or one that does not fit its pipeline (a seed's layout is not checked).

    Not priced in the sweep: the engine's stage classes match `budget PLAN` for `split`'s
    splits, not for any (16, 24, 24, 16 read 10.34 s against its 10.25 s)."""
    pipeline, pp = plan.parallel.pipeline, plan.parallel.pp
    own, v = pipeline.layers_per_stage, pipeline.virtual_stages
    if own is None or len(own) != pp * v or min(own) < 1 or sum(own) != plan.model.layers:
        return None
    even = split(plan.model.layers, pp, v, mtp_layers(plan))
    if own == (even or (plan.model.layers // (pp * v),) * (pp * v)):
        return None
    return pp, v, own


def _classes(plan: Plan, cols: Columns) -> list[StageClass]:
    """The stage classes of a group of configurations of one structure: counts, stage
    indices and copies as arrays when their pipelines differ."""
    pp, v = cols.values["pp"], cols.values["virtual_stages"]
    links = _send_links(plan, cols)
    first, which = _distinct_rows(np.stack([pp, v, links], axis=1))
    per_pair = [
        _stage_classes(plan, int(pp[i]), int(v[i]), _LINK_LEVELS[links[i]]) for i in first.tolist()
    ]
    if len(per_pair) == 1:
        return per_pair[0]
    places = {tuple(_place(c) for c in classes) for classes in per_pair}
    if len(places) > 1:
        raise ValueError("configurations evaluated together differ in their stage classes")

    def column(k: int, name: str) -> Any:  # an int per configuration, typed as one int
        values: Any = np.array([getattr(classes[k], name) for classes in per_pair])
        return values[which]

    def passes(k: int, name: str) -> Any:
        """`StageClass.flight` of each configuration as as many arrays of (dense, MoE) as
        the longest has states, each shorter one's last repeated (no state of its own is
        lost, none is added); (0, 0) where its chunks are alike (none replayed)."""
        states = [getattr(classes[k], name) for classes in per_pair]
        width = max(len(s) for s in states)
        if not width:
            return ()
        padded = [s + s[-1:] * (width - len(s)) if s else ((0, 0),) * width for s in states]
        table = np.array(padded)[which]  # configurations x states x (dense, MoE)
        return tuple((table[:, j, 0], table[:, j, 1]) for j in range(width))

    return [
        StageClass(
            column(k, "stage"),
            c.first,
            c.last,
            column(k, "dense"),
            column(k, "moe"),
            c.last_is_moe,
            column(k, "copies"),
            column(k, "sliding"),
            column(k, "head_dense"),
            column(k, "head_moe"),
            passes(k, "flight"),
            passes(k, "flight_short"),
            c.links,
        )
        for k, c in enumerate(per_pair[0])
    ]


def _batched(plan: Plan, cols: Columns, gpus: int) -> Plan:
    """One plan whose varying numbers are arrays over `cols` (all of one structure)."""
    values = cols.values
    first = apply(plan, cols.take(np.arange(1)).configs()[0], gpus)
    pipeline = first.parallel.pipeline
    v = values["virtual_stages"]
    if (v != v[0]).any():
        # fixed-width strings: compared with == in C (object arrays compare in Python)
        schedules: Any = np.where(v > 1, "interleaved", _flat(plan))
        pipeline = replace(pipeline, schedule=schedules, virtual_stages=v)
    parallel = replace(
        first.parallel,
        pipeline=pipeline,
        pp=values["pp"],
        tp=values["tp"],
        dp=values["dp"],
        cp=values["cp"],
        ep=values["ep"],
        zero=values["zero"],
        sequence_parallel=values["sequence_parallel"],
        # one structure: all of them hybrid or none (`structure`)
        dp_shard=values["dp_shard"] if first.parallel.dp_shard is not None else None,
    )
    return replace(
        first,
        parallel=parallel,
        batch=replace(first.batch, micro=values["micro"]),
        recompute=values["recompute"].astype(str),
        transitions=reshaped(plan, values),
    )


# Ranks per topology level of a move's group (`_Pricer._tiers`), by the group, whether it
# joins the pipeline's ends, the degrees (tp, pp, dp, cp, ep) and the group's size: the
# same in every pass of a sweep of one plan on one GPU count, which meets them again in
# pass after pass (a pass per pipeline depth and schedule)
Spans = dict[tuple[Any, ...], tuple[int, ...]]


class _Pricer:
    """Prices a move for every configuration of a group at once.

    Each configuration's group of ranks is laid out on the topology by the same function a
    single plan uses (`topology.group_span`, once per distinct set of degrees); the ranks
    at each level become arrays (`GroupSpan.counts`). A level a group does not use holds
    one rank, which costs no step and no byte, so every configuration can take the same form
    across levels (the ring's, the all-to-all's exchange with every peer, or the two-level
    one's), and a group on one level comes out as the flat algorithm on it.
    """

    def __init__(self, plan: Plan, cols: Columns, gpus: int, spans: Spans | None = None) -> None:
        plan = replace(plan, topology=replace(plan.topology, gpus=gpus))
        self.plan, self.gpus = plan, gpus
        self.levels = plan.topology.levels
        degrees = np.stack([cols.values[k] for k in _DEGREES], axis=1)
        first, which = _distinct_rows(degrees)
        self.unique = [tuple(int(x) for x in degrees[i]) for i in first.tolist()]
        self.which = which
        self.first_index = first
        self.first = first.tolist()
        self.cols = cols
        self.shaped: tuple[np.ndarray, np.ndarray] | None = None  # `_by_shape`, once
        self.plans = [replace(plan, parallel=_parallel(plan, row)) for row in self.unique]
        self.cache: dict[tuple[Any, ...], np.ndarray] = {}
        self.spans: Spans = {} if spans is None else spans
        self.priced: dict[tuple[Any, ...], list[tuple[Any, Any, Any, Any, CollectiveCost]]] = {}

    def _tiers(self, move: Move) -> np.ndarray:
        """Ranks per level of `move`'s group, a row per distinct set of degrees (`which`
        says each configuration's). The layout depends only on the group kind (and, for
        send/recv, which pair) and the group's size, so it is worked out once per set."""
        ranks = np.asarray(move.ranks)
        pair = _pair(move)
        sizes = tuple(int(ranks[i]) if ranks.ndim else int(ranks) for i in self.first)
        # a stage send's boundary, a class's stage index (an array where it differs): every
        # configuration of a pass's class sends on the same levels (`structure`), so each
        # set of degrees takes its first configuration's
        ends = np.asarray(move.boundary if move.boundary is not None else -1)
        boundaries = tuple(int(ends[i]) if ends.ndim else int(ends) for i in self.first)
        key = (move.group, pair, sizes, boundaries)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        per_level = np.ones((len(self.unique), len(self.levels)), dtype=np.int64)
        for row, config in enumerate(self.plans):
            layout = (move.group, pair, self.unique[row], sizes[row], boundaries[row])
            counts = self.spans.get(layout)
            if counts is None:
                counts = _dense_levels(config, move.group, sizes[row])
            if counts is None:
                # by level index (`GroupSpan.counts`), not by name (an audit: with levels
                # nvlink, ib, ib the first ib took every tier of that name; now refused too)
                boundary = None if move.boundary is None else boundaries[row]
                scalar = replace(move, ranks=sizes[row], boundary=boundary)
                counts = move_span(config, scalar).counts
            per_level[row] = self.spans[layout] = counts
        self.cache[key] = per_level
        return per_level

    def __call__(self, plan: Plan, move: Move) -> CollectiveCost:
        """The move's cost; a move with the same collective, group and sizes as one already
        priced in this pass (the same tensor moved again, or the same sizes under another
        ZeRO stage or recompute mode) reuses that cost: pricing is a pure function of them.
        Candidates are found by a cheap fingerprint and confirmed element by element."""
        fingerprint = (
            move.op,
            move.algorithm,
            move.group,
            _pair(move),
            None if move.boundary is None else int(np.sum(move.boundary)),
            move.dtype,
            int(np.sum(move.ranks)),
            int(np.sum(move.size_bytes)),
            move.steps,
        )
        seen = self.priced.setdefault(fingerprint, [])
        for ranks, size, boundary, calls, cost in seen:
            same = np.array_equal(ranks, move.ranks) and np.array_equal(size, move.size_bytes)
            if (
                same
                and np.array_equal(boundary, move.boundary)
                and np.array_equal(calls, move.calls)
            ):
                return cost
        size = np.broadcast_to(np.asarray(move.size_bytes), self.which.shape)
        calls = np.broadcast_to(np.asarray(move.calls), self.which.shape)
        several = not every(calls == 1)  # as several collectives (`Move.calls`)
        # (a move's calls follow from its size: DeepSpeed's ⌈n / B⌉ of the n its bytes are)
        some, each = self._distinct(size)
        one = size[some] // calls[some] if several else size[some]
        few = self._price(replace(move, size_bytes=one), algorithm_of(plan, move), some)
        if several:  # each collective priced at its own size (`collectives.repeated`)
            few = repeated(few, calls[some], size[some])
        elif move.steps is not None:  # riding another move's messages (`Move.steps`)
            few = with_steps(few, move.steps)
        cost = Known.of(
            few,
            np.take(few.time_s, each),
            np.take(few.sent_bytes, each),
            np.take(few.latency_s, each),
            spread=each,
        )
        seen.append((move.ranks, move.size_bytes, move.boundary, move.calls, cost))
        return cost

    def _distinct(self, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A configuration for each distinct (set of degrees, size) pair, and which of
        them each configuration's is. A collective's price is a function of its group's
        layout (one per set of degrees) and its size, element by element, and a pass of
        16,384 configurations holds a few dozen pairs (650 at most in the default sweeps):
        pricing them and spreading the time is cheaper than pricing every configuration.
        Where the degrees decide the size (a gradient reduction), the sets are the pairs;
        where they and the micro-batch and sequence parallelism do (`_by_shape`), theirs
        serve (a few more than the pairs, priced as cheaply); only other sizes are sorted."""
        if np.array_equal(size[self.first_index][self.which], size):
            return self.first_index, self.which
        some, each = self._by_shape()
        if np.array_equal(size[some][each], size):
            return some, each
        _, codes = np.unique(size, return_inverse=True)
        return _codes(codes.reshape(-1) * len(self.unique) + self.which)

    def _by_shape(self) -> tuple[np.ndarray, np.ndarray]:
        """A configuration for each distinct set of degrees, micro-batch and sequence
        parallelism, and which of them each configuration's is: what decides most moves'
        sizes (a tensor-parallel collective's), so a move's pairs are found without sorting
        its sizes (`_distinct`), whose sort cost more than pricing the pairs."""
        if self.shaped is None:
            micro = self.cols.values["micro"]
            values, codes = np.unique(micro, return_inverse=True)
            sp = self.cols.values["sequence_parallel"].astype(np.int64)
            self.shaped = _codes((self.which * len(values) + codes.reshape(-1)) * 2 + sp)
        return self.shaped

    def _price(self, move: Move, algorithm: Algorithm | None, some: np.ndarray) -> CollectiveCost:
        """As `schedule.price_move`, for the configurations `some` (their sizes are
        `move.size_bytes`): `algorithm` is the move's own or the plan's
        (`Plan.algorithm`), None for the default."""
        rows = self._tiers(move)[self.which[some]]
        ranks = tuple(rows[:, level] for level in range(len(self.levels)))
        links = [link_of(level) for level in self.levels]
        if move.op == "send-recv":
            return _send_recv(move, ranks, links)
        # NCCL's ring (its all-to-all: every peer at once) across levels, but not a
        # neighbours' exchange (`schedule.price_move`); a flat algorithm at the slowest
        # level each configuration spans (`collectives._flat_across`)
        tiers = [Tier(r, link) for r, link in zip(ranks, links, strict=True)]
        return collective_cost(
            move.op,
            tiers,
            move.size_bytes,
            algorithm,
            element_bytes=_element(move.dtype),
            levelled=move.algorithm is None,
        )


def _codes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For non-negative integer keys: an index holding each distinct key, and which of them
    each element's is, by a table of the keys where they are small, else by a sort (a pass
    whose every size differs keys up to 16,384 sizes x 650 sets of degrees: a table of 10
    million entries)."""
    if int(key.max()) >= 1 << 20:
        _, first, which = np.unique(key, return_index=True, return_inverse=True)
        return first, which.reshape(-1)
    present = np.zeros(int(key.max()) + 1, dtype=bool)
    present[key] = True
    some = np.empty(len(present), dtype=np.int64)
    some[key] = np.arange(len(key))
    return some[present], (np.cumsum(present) - 1)[key]


def _pair(move: Move) -> bool:
    """Whether a pp move joins the pipeline's ends (the embedding copies' all-reduce), not
    neighbouring stages."""
    return move.group == "pp" and "embedding" in move.name


def _dense_levels(config: Plan, group: MoveGroup, ranks: int) -> tuple[int, ...] | None:
    """Ranks per level of a tp, cp or dp group (dp x cp for gradients under context
    parallelism), or of hybrid sharding's shard group and copies (dp_shard, dp_replicate),
    as `move_span` lays it out, in closed form (`topology.level_ranks`); None for the other
    groups and layouts, which `move_span` lists."""
    if group not in ("tp", "cp", "dp", "dp_shard", "dp_replicate"):
        return None
    kind = move_kind(config, group, ranks)
    if group_size(kind, config.parallel) != ranks:
        return None  # not its group's size: `move_span` refuses such a move
    return level_ranks(kind, config.parallel, config.topology)


def _distinct_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first index of each distinct row of `matrix` (in row order) and, for every row,
    which distinct row it is. As ``np.unique(axis=0)`` but some 50x faster on a sweep's
    columns, which hold few distinct values each: every column becomes small codes, the
    codes one mixed-radix integer per row. Small non-negative integers (degrees, micro-batch
    sizes, the mixed-radix keys) are coded by a table of the values met, not a sort."""
    key = np.zeros(len(matrix), dtype=np.int64)
    for column in matrix.T:
        if len(column) and (column == column[0]).all():
            continue  # one value: no code to add (cheaper to test than to sort)
        count, codes = _small_codes(column)
        key = key * count + codes
    n = len(key)
    if n and int(key.max()) < 1 << 20:
        # each key's first row: the least row index written to its entry
        first_of = np.full(int(key.max()) + 1, n, dtype=np.int64)
        np.minimum.at(first_of, key, np.arange(n))
        keys = np.flatnonzero(first_of < n)
        firsts = first_of[keys]
        order = np.argsort(firsts, kind="stable")
        rank = np.empty(len(first_of), dtype=np.int64)
        rank[keys[order]] = np.arange(len(order))
        return firsts[order], rank[key]
    _, first, which = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[which.reshape(-1)]


def _small_codes(column: np.ndarray) -> tuple[int, np.ndarray]:
    """How many distinct values `column` holds and each element's rank among them (as
    ``np.unique(return_inverse=True)``): by a table of the values met where they are small
    non-negative integers, by a sort otherwise."""
    if column.dtype.kind in "iu" and int(column.min()) >= 0:
        some, codes = _codes(column)
        return len(some), codes
    values, codes = np.unique(column, return_inverse=True)
    return len(values), codes.reshape(-1)


def _element(dtype: str) -> int:
    from budget.plan.model import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def _send_recv(move: Move, ranks: tuple[np.ndarray, ...], links: list[Any]) -> CollectiveCost:
    """A send/recv crosses the innermost level both ranks share: one step of S there, through
    every network level up to it, at the slowest of them and the largest α
    (`collectives._flat_across`, as `topology.price_group` prices a plan's)."""
    size = np.asarray(move.size_bytes, dtype=np.int64) * np.ones_like(ranks[0])
    stages = []
    outer_used = np.zeros_like(ranks[0], dtype=bool)
    for level in range(len(links) - 1, -1, -1):
        use = (ranks[level] > 1) & ~outer_used
        outer_used |= use
        mask = use.astype(np.int64)
        stages.append(
            Stage(
                "send-recv",
                "direct",
                2,
                size,
                mask,
                size * mask,
                size * mask,
                size * mask,
                size * mask,
                size * mask,
                links[0] if level == 0 else spanned_link(links[1 : level + 1]),
            )
        )
    return CollectiveCost("send-recv", "direct", 2, size, tuple(reversed(stages)))


def _peaks(step: Step) -> np.ndarray:
    """The worst stage's peak: the largest sum of what is alive together (`memory`), kept
    as a running maximum in one array (the Llama 3 405B sweep's 40 instants a pass were
    stacked into one block of 40 arrays first, only to be reduced).

    An instant's sum is `Instant.total`'s, added left to right, but the instants of a stage
    list the same allocations first (its resident states, the activations saved, a
    phase's tensors before the one each instant adds), and what they share is added once:
    the sum up to where their lists part is kept (`_shared_sums`) and the rest added to
    it, the same additions in the same order. GPT-3 175B's pass of 16,384 layouts added
    1,049 arrays for 42 instants, 534 so."""
    lives = [i.live for stage in step.stages for phase in stage.phases for i in phase.instants]
    if not lives:
        raise ValueError("a step with no memory instant has no peak")
    paths, kept = _shared_sums(lives)
    sums: dict[int, Any] = {}  # the sum of a shared front of allocations, by its last node
    peak: np.ndarray | None = None
    for live, path in zip(lives, paths, strict=True):
        start = next((k + 1 for k in range(len(path) - 1, -1, -1) if path[k] in sums), 0)
        total: Any = sums[path[start - 1]] if start else 0
        owned = False  # `total` is an array made here, which nothing else holds (`vsum`)
        for k in range(start, len(live)):
            total, owned = add_into(total, owned, live[k].total)
            if path[k] in kept:
                sums[path[k]], owned = total, False  # kept: added to in a copy from here
        total = np.asarray(total)
        if peak is None:
            peak = np.array(total)  # its own copy: the maximum is kept in place
        elif total.dtype == peak.dtype and total.shape == peak.shape:
            np.maximum(peak, total, out=peak)
        else:
            peak = np.maximum(peak, total)
    assert peak is not None
    return peak


def _shared_sums(lives: list[tuple[Alloc, ...]]) -> tuple[list[list[int]], set[int]]:
    """Each front of the allocations `lives` list (by the allocations' identities) as a
    node, each list as its path of nodes, and the nodes where lists sharing a front part
    (or one of them ends), whose sums `_peaks` keeps: a few per phase."""
    nodes: dict[tuple[int, int], int] = {}
    through: list[int] = []  # how many lists run through each node
    paths = []
    for live in lives:
        node, path = -1, []
        for alloc in live:
            node = nodes.setdefault((node, id(alloc)), len(nodes))
            if node == len(through):
                through.append(0)
            through[node] += 1
            path.append(node)
        paths.append(path)
    kept = {
        node
        for path in paths
        for node, after in zip(path, [*path[1:], None], strict=True)
        if through[node] > 1 and (after is None or through[after] < through[node])
    }
    return paths, kept


def _untimed_memory(step: Step) -> Step:
    """`step` without its memory instants, once its peak is read (`_peaks`): the timing
    reads its phases' moves and works alone (`schedule.step_time`), and the instants'
    arrays, most of a step's (some 60 MiB of Llama 3 405B's step of 16,384 layouts), held
    through it made the pass's peak, each page of which a search faults in fresh."""
    stages = tuple(
        replace(stage, phases=tuple(replace(p, instants=()) for p in stage.phases))
        for stage in step.stages
    )
    return replace(step, stages=stages)


def measure(
    plan: Plan, cols: Columns, gpus: int, spans: Spans | None = None, exact: bool = False
) -> dict[str, np.ndarray]:
    """Peak memory, step time, exposed communication, MFU and tokens/s of `cols` (one
    structure), as arrays, in one pass of the engine; `spans` keeps the groups' layouts
    between the passes of one sweep (`Spans`). The layouts whose model chunks differ
    (`_differ`), which `budget PLAN` replays in Megatron-LM's order and the pass prices by
    the closed form over stage totals, are `pending`: their step time is a lower bound on
    the replay (`schedule.Replay.bound`), MFU and tokens/s upper bounds, until `_Kept`
    replays them; with `exact`, they are replayed here, layout by layout, and none is."""
    batch = _batched(plan, cols, gpus)
    step = derive(batch, representatives=True, classes=_classes(plan, cols))
    n = len(cols)
    peak = _peaks(step)
    step = _untimed_memory(step)
    times = step_time(batch, step, _Pricer(plan, cols, gpus, spans))
    measured = {
        "peak": peak * np.ones(n, dtype=np.int64),
        "time": np.asarray(times.time_s) * np.ones(n),
        "exposed": np.asarray(_critical_exposed(times.stages)) * np.ones(n),
        "mfu": np.asarray(times.mfu) * np.ones(n),
        "rate": np.asarray(times.tokens_per_s) * np.ones(n),
        "pending": np.zeros(n, dtype=bool),
        # what MFU and tokens/s are worked out of once a replay times the step (`_rated`)
        "flops": np.asarray(times.model_flops) * np.ones(n),
        "flops_peak": cluster_peak(batch) * np.ones(n),
        "tokens": batch.batch.global_batch * batch.batch.seq * np.ones(n, dtype=np.int64),
    }
    measured["upper"] = measured["time"].copy()  # a pending layout's upper bound
    # the replay a pending layout is held with and its column there (`_replay_rows`)
    measured["replay"] = np.full(n, None, dtype=object)
    measured["column"] = np.zeros(n, dtype=np.int64)
    # a sweep bounds only the layouts that fit: the others are not ranked
    wanted = np.ones(n, dtype=bool) if exact else measured["peak"] <= plan.device.memory
    for index, replay in _replays(plan, cols, gpus, times, step.microbatches, wanted):
        if exact:
            total = replay.steps()
        else:
            total = np.asarray(replay.bound()) * np.ones(len(index))
            measured["upper"][index] = replay.ceiling() * (1 + 1e-9)  # past its roundings
            measured["pending"][index] = True
            measured["replay"][index] = replace(replay, stages=())  # not the stages' arrays
            measured["column"][index] = np.arange(index.size)
        measured["time"][index] = total
        # the reduction ending latest by the replay's leads, its stages' first chunks' (a
        # review: the pass's, over v chunks, passed a layout whose report then failed
        # --max-exposed)
        measured["exposed"][index] = np.asarray(_critical_exposed(replay.stages))
        if exact:
            measured["upper"][index] = total
        _rated(measured, index)
    return measured


def _states_bound(plan: Plan, classes: Sequence[StageClass]) -> Any:
    """The most bytes of model states (parameters, gradients, master weights and moments:
    `layers.stage_states`, as `step.derive` makes them for these `classes`) any stage of
    `plan` keeps. The instants of a stage's gradient reduction and optimizer step hold all
    of them (`step._derive_training` sets them resident before `_reduce`), so no stage
    peaks below its own."""
    most: Any = 0
    for kind in classes:
        states = stage_states(plan, class_params(plan, kind))
        most = np.maximum(most, vsum(a.total for a in states))
    return most


def _rated(measured: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """MFU and tokens/s of `rows` at their step time, worked out as `schedule.step_time`
    does, operation for operation (an audit: scaled by the ratio of two times, an MFU
    differed from its report's in the last bit)."""
    measured["mfu"][rows], measured["rate"][rows] = step_rates(
        measured["flops"][rows],
        measured["tokens"][rows],
        measured["time"][rows],
        measured["flops_peak"][rows],
    )


def _replays(
    plan: Plan, cols: Columns, gpus: int, times: Any, m: Any, wanted: np.ndarray
) -> Iterator[tuple[np.ndarray, Replay]]:
    """For each pipeline depth and schedule of `cols` whose model chunks differ
    (`_differ`), the indices of its `wanted` layouts and the `Replay` of their steps (arrays
    over those), which `budget PLAN` prices them by and the closed form of the pass does
    not. The pass's stage classes (`_classes`, one row of numbers per layout) are laid out
    stage by stage (`stage_classes` unmerged: a class's stages differ in how their chunks
    split)."""
    links = _send_links(plan, cols)
    pairs = np.stack([cols.values["pp"], cols.values["virtual_stages"], links], axis=1)
    first, which = _distinct_rows(pairs)
    configs = cols.take(first).configs()
    for row, c in enumerate(configs):
        index = np.flatnonzero((which == row) & wanted)
        if not index.size or not _differ(plan, c, gpus):
            continue
        rows = _stage_rows(plan, c.pp, c.virtual_stages, _LINK_LEVELS[links[first[row]]])
        picked = {row: _picked(times.stages[row], index) for row in set(rows)}
        stages = [picked[row] for row in rows]
        yield index, replay_of(apply(plan, c, gpus), stages, _pick(m, index))


@lru_cache(maxsize=256)
def _stage_rows(plan: Plan, pp: int, v: int, links: tuple[int, ...]) -> tuple[int, ...]:
    """For each of the `pp` stages, which of `_stage_classes(plan, pp, v, links)` (a pass's
    `StageTime` rows) it is: the classes unmerged (`stage_classes`), each stage's own."""
    classes = _stage_classes(plan, pp, v, links)
    keys = [k.key for k in classes]
    return tuple(keys.index(k.key) for k in _stage_classes(plan, pp, v, links, merge=False))


def _pick(x: Any, index: np.ndarray) -> Any:
    return x[index] if np.ndim(x) else x


def _picked(stage: StageTime, index: np.ndarray) -> StageTime:
    """`stage`'s times (arrays over a pass's layouts) at `index` alone: what a replay reads,
    of its moves its stage sends' (`schedule._send_wait`)."""

    def sends(p: PhaseTime) -> tuple[TimedMove, ...]:
        if not p.name.startswith("pipeline."):
            return ()
        return tuple(
            replace(
                t,
                move=replace(t.move, count=_pick(t.move.count, index)),
                time_s=_pick(t.time_s, index),
                exposed_s=_pick(t.exposed_s, index),
            )
            for t in p.moves
        )

    phases = tuple(
        replace(
            p,
            count=_pick(p.count, index),
            compute_s=_pick(p.compute_s, index),
            exposed_s=_pick(p.exposed_s, index),
            moves=sends(p),
        )
        for p in stage.phases
    )
    return StageTime(
        stage.stage,
        phases,
        _pick(stage.microbatch_s, index),
        _pick(stage.after_s, index),
        _pick(stage.each_microbatch_s, index),
        _pick(stage.optimizer_s, index),
        _pick(stage.lead_s, index),  # a class's; `replay_of` takes each stage's own
        gather_s=_pick(stage.gather_s, index),
    )


def _results(configs: Sequence[Config], m: dict[str, np.ndarray], capacity: int) -> list[Result]:
    columns = (
        m["peak"].tolist(),
        m["time"].tolist(),
        m["exposed"].tolist(),
        m["mfu"].tolist(),
        m["rate"].tolist(),
    )
    return [
        Result(c, peak, peak <= capacity, time_s, exposed, mfu, rate)
        for c, peak, time_s, exposed, mfu, rate in zip(configs, *columns, strict=True)
    ]


def evaluate(plan: Plan, configs: Sequence[Config], gpus: int) -> list[Result]:
    """Peak memory and step time of `configs` (one structure), in one pass of the engine,
    those whose model chunks differ replayed (`measure`)."""
    measured = measure(plan, Columns.of(configs), gpus, exact=True)
    return _results(configs, measured, plan.device.memory)


def _critical_exposed(stages: Sequence[StageTime]) -> Any:
    """Exposed communication as the report counts it (`schedule.paced_by`): the micro-batch
    phases of the stage with the most time per micro-batch (the first of equals), the
    gradient reduction of the stage whose ends latest past the pipeline's end, and the
    optimizer of the stage that puts the next step off longest with the later stages'
    gathers in series behind it (`schedule.put_off`), per configuration."""

    def exposed(stage: Any) -> dict[str, Any]:
        """Each part's exposed time, its phases summed in their order, as the report sums
        them (one pass over the phases: three took a 405B search 11 % longer)."""
        sums: dict[str, Any] = dict.fromkeys(("microbatch", "reduction", "optimizer"), 0.0)
        for p in stage.phases:
            part = phase_part(p.name)
            sums[part] = sums[part] + np.asarray(p.exposed_s) * p.count
        return sums

    first = stages[0]
    parts = exposed(first)
    pace, pacing = np.asarray(first.microbatch_s), parts["microbatch"]
    late, reducing = np.asarray(first.reduce_s - first.lead_s), parts["reduction"]
    most = np.asarray(put_off(first))
    optimizing = parts["optimizer"] + np.asarray(first.behind_s)
    for stage in stages[1:]:
        parts = exposed(stage)
        slower = np.asarray(stage.microbatch_s) > pace
        pace = np.where(slower, stage.microbatch_s, pace)
        pacing = np.where(slower, parts["microbatch"], pacing)
        later = np.asarray(stage.reduce_s - stage.lead_s) > late
        late = np.where(later, stage.reduce_s - stage.lead_s, late)
        reducing = np.where(later, parts["reduction"], reducing)
        off = np.asarray(put_off(stage))
        longer = off > most
        most = np.where(longer, off, most)
        optimizing = np.where(longer, parts["optimizer"] + stage.behind_s, optimizing)
    return pacing + reducing + optimizing


OBJECTIVES: dict[str, Callable[[Result], Any]] = {
    "time": lambda r: (r.step_time_s, r.peak_bytes),
    "memory": lambda r: (r.peak_bytes, r.step_time_s),
    "tokens-per-s": lambda r: (-r.tokens_per_s, r.peak_bytes),
}


def pareto(results: Sequence[Result]) -> tuple[Result, ...]:
    """Configurations no other beats on both peak memory and step time, fastest first."""
    front: list[Result] = []
    for r in sorted(results, key=lambda r: (r.step_time_s, r.peak_bytes)):
        if not front or r.peak_bytes < front[-1].peak_bytes:
            front.append(r)
    return tuple(front)


_ORDER_KEYS = {
    "time": ("time", "peak"),
    "memory": ("peak", "time"),
    "tokens-per-s": ("-rate", "peak"),
}


@cache
def _keep_heap() -> None:
    """Stop glibc's allocator from handing memory back to the kernel between a sweep's
    numpy temporaries (arrays of one number per configuration, about 130 KB at 16,384
    configurations: right at malloc's default 128 KiB mmap and trim thresholds, so each
    one was mapped or the heap trimmed and its pages faulted back in). Measured on the
    GPT-3 sweep of `make bench` (one search in a fresh process): 250,000 minor page faults
    and 98,000 layouts/s with the defaults, 53,000 and 132,000–145,000 with these, at the
    same peak RSS (222 MiB). `mallopt` is glibc's (M_TRIM_THRESHOLD -1, M_TOP_PAD -2,
    M_MMAP_THRESHOLD -3, malloc.h); elsewhere this does nothing."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, libc's among them
    except (OSError, AttributeError, TypeError):
        return  # musl and other C libraries without it
    mallopt(-3, 4 * 2**20)  # allocations under 4 MiB come from the heap
    mallopt(-1, 256 * 2**20)  # keep up to 256 MiB free at its top
    mallopt(-2, 64 * 2**20)  # and grow it 64 MiB at a time


def search(
    plan: Plan,
    gpus: int,
    space: Space = Space(),
    objective: str = "time",
    progress: Callable[[int, int], None] | None = None,
    keep: int | None = None,
    limits: Limits | None = None,
) -> Outcome:
    """Sweep `space` for `plan`'s model on `gpus` GPUs; rank the layouts that fit (and,
    with `limits`, keep them as `budget check` counts them: `_breaks`).

    Memory stays bounded however large the sweep: configurations are enumerated a block at
    a time, gathered by structure and evaluated at most `CHUNK` together; with `keep`,
    only the best `keep` ranked layouts and the Pareto front are held between chunks
    (the report shows no more). `progress(done, total)` counts configurations.

    Only the layouts that fit are ranked, so the others are priced no further than it takes
    to know they do not: a layout one of whose stages keeps more bytes of model states than
    the device holds (`_states_bound`, no more than that stage's peak) is counted as not
    fitting as it is enumerated, without a pass of the engine (`Outcome.by_states`). It
    rules out 26,298 of the 87,300 layouts of the GPT-3 sweep on 1,024 GPUs (49,631 do not
    fit), 11,502 of Llama 3 405B's 22,716 on 16,384 (18,183), and the passes left are full
    ones: 6 where there were 7, and 3 where there were 4. A plan with hand-written
    transitions is not bounded so (`roomy`).
    """
    start = time.perf_counter()
    _keep_heap()
    # The progress bar needs the total first: a counting pass (cheap: the grids, no engine).
    total = sum(len(b) for b in blocks(plan, gpus, space, _Counts())) if progress else 0
    counts = _Counts()
    capacity = plan.device.memory
    spans: Spans = {}
    kept = _Kept(plan, gpus, objective, keep, spans)
    near = _Near(capacity)
    done = groups = fitting = bounded = 0

    def run(part: Columns) -> None:
        nonlocal done, groups, fitting
        # a float past int64 (or inf) cast to a size raises here instead of warning and
        # wrapping; integer products that would wrap are kept out by `unsafe_micros`
        with np.errstate(over="raise", invalid="raise"):
            try:
                measured = measure(plan, part, gpus, spans)
            except BudgetError as error:
                if not all(p.path.startswith("$.transitions[") for p in error.problems):
                    raise
                # a hand-written transition's (`step._with_transitions`): a phase, or a
                # stage send, that layouts of this structure do not have (not priced:
                # skipped, as the layouts that cannot be built are)
                reason = "a hand-written transition names a phase or stage send its step lacks"
                if all(STAGES_APART in p.message for p in error.problems):
                    # the phase is there, on some stages (`step._stages_apart`; a review, m432)
                    reason = PP_APART
                counts.rejected[reason] += len(part)
                groups += 1
                return
        ranked = measured["peak"] <= capacity
        if limits is not None:
            kept.replayed += _settle_limits(plan, part, gpus, spans, limits, measured)
        fitting += int(ranked.sum())
        counts.rejected["does not fit in device memory"] += len(part) - int(ranked.sum())
        broken = _breaks(limits, capacity, measured)
        # the held layouts at the least bounds, replayed where a step limit ranks none
        stepped = limits is not None and limits.max_step_s is not None
        held = part if stepped else None
        near.measured(measured, broken, _open_limits(limits, capacity, measured), held)
        for reason, breaks in broken:
            over = ranked & breaks
            if over.any():
                counts.rejected[reason] += int(over.sum())
            ranked &= ~breaks
        index = np.flatnonzero(ranked)
        kept.add(part.take(index), {k: v[index] for k, v in measured.items()})
        done, groups = done + len(part), groups + 1
        if progress is not None:
            progress(done, total)

    def roomy(part: Columns) -> Columns:
        """`part` less the layouts one of whose stages keeps more model states than the
        device holds (`_states_bound`), counted as not fitting without a pass of the engine;
        all of it under hand-written transitions, which the engine may find its layouts
        cannot have (`run` rejects those by that reason, the first a report would give)."""
        nonlocal done, bounded
        if plan.transitions:
            return part
        bound = _states_bound(_batched(plan, part, gpus), _classes(plan, part))
        over = np.asarray(bound > capacity) & np.ones(len(part), dtype=bool)
        if not over.any():
            return part
        counts.rejected["does not fit in device memory"] += int(over.sum())
        near.bound(np.broadcast_to(bound, over.shape)[over])
        done += int(over.sum())
        bounded += int(over.sum())
        if progress is not None:
            progress(done, total)
        return part.take(np.flatnonzero(~over))

    pending: dict[tuple[int, ...], list[Columns]] = {}
    for block in blocks(plan, gpus, space, counts):
        keys = structure(plan, block)
        first, which = _distinct_rows(keys)
        for group, key in enumerate(map(tuple, keys[first].tolist())):
            queue = pending.setdefault(key, [])
            part = roomy(block.take(np.flatnonzero(which == group)))
            if not len(part):
                continue
            queue.append(part)
            if sum(len(part) for part in queue) >= CHUNK:
                joined = _join(queue)
                full = len(joined) - len(joined) % CHUNK
                for i in range(0, full, CHUNK):
                    run(joined.take(slice(i, i + CHUNK)))
                queue[:] = [joined.take(slice(full, None))] if full < len(joined) else []
    for key in sorted(pending):
        if pending[key]:
            run(_join(pending[key]))
    if kept.parts:
        kept.settle()
    results, front = kept.ranked(capacity)
    nearest = _nearest(near, limits, kept, plan, gpus)
    return Outcome(
        gpus=gpus,
        evaluated=done,
        elapsed_s=time.perf_counter() - start,
        rejected=dict(sorted((k, n) for k, n in counts.rejected.items() if n)),  # no 0 rows
        ruled_out={k: tuple(dict.fromkeys(v)) for k, v in sorted(counts.ruled_out.items())},
        fitting=fitting,
        results=results,
        pareto=front,
        objective=objective,
        groups=groups,
        limits=limits,
        within_limits=None if limits is None else kept.count,
        hardware=hardware(plan),
        layers=(plan.model.layers, mtp_layers(plan)),
        own_split=own_split(plan),
        space=space,
        replayed=kept.replayed,
        by_states=bounded,
        nearest=nearest,
    )


def _nearest(near: _Near, limits: Limits | None, kept: _Kept, plan: Plan, gpus: int) -> Nearest:
    """`near`'s figures, its held layouts replayed where a step limit ranks none."""
    if limits is not None and limits.max_step_s is not None and kept.count == 0:
        kept.replayed += near.settle(plan, gpus, kept.spans)
    return near.result()


SAFE = 2**59  # sizes `unsafe_micros` keeps the sweep below: 16 times below int64's 2^63


def _corner_sizes(plan: Plan, micro: int, ep: int) -> tuple[int, int]:
    """(the largest FLOPs or bytes one kernel or collective of a micro-batch forms, a bound
    on one rank's memory) for micro-batches of `micro` sequences on one rank holding every
    layer whole (tp and cp 1), counted in Python integers.

    Tensor and context parallelism split a kernel and pipelining splits the layers, so a
    layout of the sweep forms no larger kernel than these. The experts' all-to-all is the
    exception: its whole tensor is ep times one rank's rows (`step._ep_moves`), so it is
    sized at `ep`, the largest expert-parallel degree the sweep may take, and at the routing
    skew it budgets for (which an ep-1 rank does not see). The memory bound
    is every layer's forward bytes (what its kernels read and write, which includes
    everything a layer saves), times the micro-batches in flight (at most 2 stages' worth of
    layers under 1F1B and interleaving; every micro-batch of a replica under GPipe), plus 20
    bytes per parameter (bf16 or fp32 weights, fp32 gradients, master copy and two Adam
    moments), the most any precision keeps; the layers' part times the routing skew."""
    par = replace(plan.parallel, tp=1, cp=1, ep=1, sequence_parallel=False)
    corner = replace(plan, parallel=par, batch=replace(plan.batch, micro=micro))
    s = shapes(corner)
    layer = flops.attention_forward(corner, s) + flops.mlp_forward(corner, s)
    largest, skew = 0, 1
    if corner.model.experts is not None:
        layer += flops.moe_forward(corner, s)
        # the busiest rank takes up to `skew` times the rows at the largest ep, which a rank
        # of this corner (ep 1) does not (`flops.routing_skew`)
        experts = corner.model.experts
        skew = math.ceil(min(experts.imbalance, ep, experts.count / experts.top_k))
        largest = s.act * s.dispatched * s.hidden * ep * skew
    works = layer + flops.loss_work(corner, s) + flops.embedding_work(corner, s)
    largest = max(largest, *(max(w.flops, w.bytes) * w.count for w in works))
    gpipe = plan.parallel.pipeline.schedule == "gpipe"
    in_flight = max(1, plan.batch.global_batch // micro) if gpipe else 2
    per_layer = sum(w.bytes * w.count for w in layer)
    memory = per_layer * plan.model.layers * in_flight * skew + 20 * params_total(plan)
    return int(largest), int(memory)


def unsafe_micros(plan: Plan, micros: Sequence[int], ep: int) -> tuple[int, ...]:
    """Those of `micros` whose sizes (`_corner_sizes`) reach `SAFE`, ascending.

    The engine evaluates thousands of layouts at once in int64 numpy arrays, whose products
    wrap around silently past 2^63 (a float past it raises, see `search`). The sweep
    rejects these micro-batches, counted (`_grid`); the margin below 2^63 is the room a
    backward pass (2.5 times its forward), a recomputation and the engine's sums need. Each
    is tested on its own: under GPipe the memory bound falls as the micro-batch grows (fewer
    of them in flight) while the kernels grow, so the sizes are not monotone in it."""
    return tuple(m for m in sorted(set(micros)) if max(_corner_sizes(plan, m, ep)) >= SAFE)


def sweep_micros(plan: Plan, space: Space) -> tuple[int, ...]:
    """Every micro-batch size the sweep may take: the listed ones, or the global batch's
    divisors (`_grid` keeps those that divide one replica's share)."""
    return space.micro or tuple(divisors(plan.batch.global_batch))


def largest_ep(plan: Plan, gpus: int, space: Space) -> int:
    """The largest expert-parallel degree the sweep may take (1 without experts)."""
    experts = plan.model.experts
    if experts is None:
        return 1
    return max(space.ep) if space.ep else min(experts.count, gpus)


def magnitude(plan: Plan, gpus: int, space: Space) -> str | None:
    """Why the search cannot size `plan` at all in 64-bit integers (even its smallest
    micro-batch is past `SAFE`), or None. Larger micro-batches past it are rejected one by
    one in the sweep instead."""
    micros = sweep_micros(plan, space)
    ep = largest_ep(plan, gpus, space)
    if len(unsafe_micros(plan, micros, ep)) < len(set(micros)):
        return None
    largest, memory = _corner_sizes(plan, min(micros), ep)
    what = (
        f"one kernel or collective of {largest:.2e} FLOPs or bytes"
        if largest >= memory
        else f"{memory:.2e} bytes of memory on one rank"
    )
    sequences = f"{min(micros):,} sequence{'' if min(micros) == 1 else 's'}"
    every = [m for m in divisors(plan.batch.global_batch) if m < min(micros)]
    unsafe = set(unsafe_micros(plan, every, ep))
    safe = [m for m in every if m not in unsafe]
    return (
        f"micro-batches of {sequences} of {plan.batch.seq:,} tokens form {what}, "
        f"past the {SAFE:.2e} (2^59) the search's 64-bit arithmetic keeps below (int64 ends "
        "at 9.22e+18; backward passes and sums need the margin); "
        + (f"micro-batches of {safe[-1]:,} sequences are within it, or " if safe else "")
        + "budget the plan alone with `budget PLAN`, which counts in Python integers"
    )


# the overlap switches (the booleans of `Overlap`)
OVERLAP_FLAGS = tuple(f.name for f in fields(Overlap) if f.type in (bool, "bool"))


def hardware(plan: Plan) -> dict[str, Any]:
    """What every layout of a search was priced on: the device and topology (preset names,
    or None where the plan writes them out), the kernel attention is timed as and where its
    rate comes from, the levels whose collectives follow a measured bandwidth ramp, and how
    many hand-written transitions of the plan every layout carries."""
    from budget.pipeline import device_preset_overrides, topology_preset_overrides

    device, m = plan.device, plan.model
    measured = device.attention_rate(m.attention)
    return {
        "device": device.name or None,
        "topology": plan.topology.name or None,
        # what the plan writes over those presets' figures (`catalog.device_overrides`; a
        # user audit, m434: "Priced on h100-sxm in dgx-h100" of other flops and links)
        "device_overrides": list(device_preset_overrides(plan)),
        "topology_overrides": list(topology_preset_overrides(plan)),
        "attention": m.attention,
        "attention_kernel": device.attention_kernel(m.attention),
        "attention_rate": device.attention_source(m.attention),
        # the measured rate depends on the keys per call (more than one length measured)
        "attention_by_keys": measured is not None and len(measured.keys) > 1,
        # the head dimension that rate was measured at, and the model core's (a review,
        # m537: the report named them where they differ, the search did not)
        "attention_head_dim": measured.head_dim
        if measured is not None and device.attention_source(m.attention) in ("measured", "derived")
        else None,
        "head_dim": m.qk_head_dim,
        "ramped_levels": [level.name for level in plan.topology.levels if level.ramp],
        # every layout carries them, their shapes evaluated for it (`reshaped`)
        "transitions": len(plan.transitions),
        # what a layout's peak is held to: the device's memory (what the plan reserves is
        # counted in each peak)
        "capacity_bytes": plan.device.memory,
        # the algorithms the plan names for its collectives (`collectives:`), by op
        "collectives": dict(plan.collectives),
        # the overlaps every layout keeps as the plan sets them: the sweep does not turn
        # them (a user audit: the ranking moved with them, and nothing said so)
        "overlap": {flag: getattr(plan.overlap, flag) for flag in OVERLAP_FLAGS},
        # and the recipe's own pipeline and userbuffers settings, kept likewise (a layout of
        # one stage defers nothing)
        "defer_embedding_wgrad": plan.overlap.defer_embedding_wgrad,
        "tp_comm_aggregate": list(plan.overlap.tp_comm_aggregate),
        # what a ZeRO 3 layout gathers at once (`Parallel.fsdp_unit`), as the plan says
        "tp_style": plan.parallel.tp_style,
        "fsdp_unit": plan.parallel.fsdp_unit,
        "reshard_after_forward": plan.parallel.reshard_after_forward,
        "fsdp_root": plan.parallel.fsdp_root,
        # the expert layers' tensor parallelism, which the sweep does not turn either (a user
        # audit, m431: etp 1 beat the best layout by 8 %, and nothing said it was held):
        # "tp" where the plan leaves it to each layout's tp; none without experts
        "etp": None if m.experts is None else plan.parallel.etp or "tp",
    }


def _breaks(
    limits: Limits | None, capacity: int, measured: dict[str, np.ndarray]
) -> list[tuple[str, np.ndarray]]:
    """(reason, which layouts break it) for each limit set, in the order `budget check`
    reports them: headroom (free bytes at the worst stage's peak), exposed communication
    as a share of the step, step time. A layout that breaks several is counted under the
    first. A pending layout (`measure`) is judged on its bounds: over the step limit on its
    lower bound, or over the exposed share on its upper one, it is over for good; what its
    bounds leave open waits for its replay (`_unsure`)."""
    if limits is None:
        return []
    words = iter(limits.describe()[1:])  # the first is "every stage fits in device memory"
    out = []
    required = limits.required_headroom(capacity)
    if required is not None:
        out.append((next(words), capacity - measured["peak"] < required))
    if limits.max_exposed_share is not None:
        _, least = _exposed_shares(measured)
        out.append((next(words), least > limits.max_exposed_share))
    if limits.max_step_s is not None:
        out.append((next(words), measured["time"] > limits.max_step_s))
    return [(f"over a limit: {text}", breaks) for text, breaks in out]


def _exposed_shares(measured: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each layout's exposed communication as a share of its step, (most, least): over the
    step's lower bound and over its upper one (`measure`; both the step where it is exact),
    0 for a step of 0 s."""
    exposed, time_s, upper = measured["exposed"], measured["time"], measured["upper"]
    most = np.divide(exposed, time_s, out=np.zeros_like(time_s), where=time_s != 0)
    least = np.divide(exposed, upper, out=np.zeros_like(upper), where=upper != 0)
    return most, least


def _open_limits(
    limits: Limits | None, capacity: int, measured: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """For each limit `_breaks` judges, in its order, the pending layouts whose bounds leave
    it open, each limit on its own: none for headroom (a peak is exact); an exposed share
    over the limit on the lower bound of the step and not on the upper; a step limit between
    the bounds. Those `_settle_limits` replays are no longer pending."""
    if limits is None:
        return []
    pending = measured["pending"]
    out = []
    if limits.required_headroom(capacity) is not None:
        out.append(np.zeros(len(pending), dtype=bool))
    time_s, upper = measured["time"], measured["upper"]
    if limits.max_exposed_share is not None:
        most, least = _exposed_shares(measured)
        cap = limits.max_exposed_share
        out.append(pending & (most > cap) & (least <= cap))
    if limits.max_step_s is not None:
        out.append(pending & (time_s <= limits.max_step_s) & (upper > limits.max_step_s))
    return out


def _settle_limits(
    plan: Plan,
    cols: Columns,
    gpus: int,
    spans: Spans,
    limits: Limits,
    measured: dict[str, np.ndarray],
) -> int:
    """Replay (`measure`) the pass's fitting layouts whose time limits their bounds cannot
    settle (`_unsure`) and no other limit rejects, so that every limit is judged, and
    `within_limits` counted, on the times their reports give. Replaying them here, a pass
    at a time, costs less than holding them: held by their bounds, layouts that then break
    a limit crowd the ranking and are replayed a few at a time. On the GPT-3 sweep (1,024
    GPUs) with an exposed-communication limit of 5 %: 55 s so, 3.3 s here (121 replays,
    the upper bound settling the rest); with a step limit of 40 s, 902 replays and 6.6 s,
    against 2.3 s for the closed form, whose count was 12,180 against 11,960 replayed
    (and at 18 s, 32 against 23). Returns how many it replayed."""
    capacity = plan.device.memory
    index = np.flatnonzero((measured["peak"] <= capacity) & _unsure(limits, capacity, measured))
    _replay_rows(plan, cols, gpus, spans, measured, index)
    return int(index.size)


def _replay_rows(
    plan: Plan,
    cols: Columns,
    gpus: int,
    spans: Spans | None,
    measured: dict[str, np.ndarray],
    index: np.ndarray,
) -> None:
    """Replace the bounds of the pending layouts of `cols` at `index` by their replays, in
    `measured` itself: from the replay each is held with (`measure`), its time and the
    closed form's MFU and tokens/s scaled to it as `measure` scales them; a layout held
    without one (`_Kept` holding every layout) is run through the engine again, a pass per
    structure among them. The GPT-3 sweep (1,024 GPUs, keep 10) settles in 0.20 s so, 0.26 s
    by a pass of the engine a round and structure, and the sweep of Llama 3 405B at 128K
    (16,384 GPUs), which settled in one round then (two now), ran in 0.40 s rather than
    0.44 s (medians of 7, each the first search of a process)."""
    if not index.size:
        return
    held, again = _by_replay(measured["replay"], index)
    # those of one pipeline depth and virtual stages replayed together, whichever pass
    # held them (`Replay.steps`: each as alone, bit for bit)
    shaped: dict[tuple[int, ...], list[tuple[np.ndarray, Replay]]] = {}
    for rows in held:
        part = measured["replay"][rows[0]].columns(measured["column"][rows])
        shaped.setdefault(part.chunks.shape[:3], []).append((rows, part))
    for parts in shaped.values():
        rows = np.concatenate([r for r, _ in parts])
        total = Replay.joined([p for _, p in parts]).steps()
        measured["time"][rows] = measured["upper"][rows] = total
        _rated(measured, rows)
    if again.size:
        cut = cols.take(again)
        distinct, group = _distinct_rows(structure(plan, cut))
        for row in range(len(distinct)):
            rows = np.flatnonzero(group == row)
            timed = measure(plan, cut.take(rows), gpus, spans, exact=True)
            for name in ("time", "upper", "mfu", "rate"):
                measured[name][again[rows]] = timed[name]
    measured["pending"][index] = False
    measured["replay"][index] = None


def _unsure(limits: Limits | None, capacity: int, measured: dict[str, np.ndarray]) -> np.ndarray:
    """The pending layouts (`measure`) whose bounds leave open whether they keep the limits,
    or under which `_breaks` counts them (the first they break, in `budget check`'s order):
    a headroom it breaks settles both; an exposed share over the limit on the lower bound
    and not on the upper leaves it open, whatever the step limit says (a review: 20 of
    Llama 3 70B's layouts over both were counted under the step limit); over it on the
    upper bound settles it; then a step limit between the bounds leaves it open."""
    pending = measured["pending"]
    unsure = np.zeros(len(pending), dtype=bool)
    if limits is None or not pending.any():
        return unsure
    undecided = pending.copy()
    required = limits.required_headroom(capacity)
    if required is not None:
        undecided &= capacity - measured["peak"] >= required
    time_s, upper = measured["time"], measured["upper"]
    if limits.max_exposed_share is not None:
        most, least = _exposed_shares(measured)
        over = least > limits.max_exposed_share
        unsure |= undecided & (most > limits.max_exposed_share) & ~over
        undecided &= ~over
    if limits.max_step_s is not None:
        unsure |= undecided & (time_s <= limits.max_step_s) & (upper > limits.max_step_s)
    return unsure


def _distinct_values(values: np.ndarray) -> np.ndarray:
    """The distinct integers of `values`, ascending, as ``np.unique`` gives them: whose
    first call without an inverse or counts imports numpy.ma (to ask whether the array is
    masked), 17 ms of a sweep in a fresh process that uses nothing of it."""
    return np.array(sorted(set(values.tolist())), dtype=np.int64)


def _join(parts: Sequence[Columns]) -> Columns:
    if len(parts) == 1:
        return parts[0]
    return Columns({k: np.concatenate([p.values[k] for p in parts]) for k in FIELDS})


def _compact(measured: dict[str, np.ndarray]) -> None:
    """Each pending layout's replay (`measure`) cut to its own columns, in `measured`
    itself, so that the layouts a sweep keeps hold no more of a pass's replays than
    their own: 2·p·v chunk times each, some 1.5 KB on GPT-3."""
    replays, columns, pending = measured["replay"], measured["column"], measured["pending"]
    replays[~pending] = None
    for index in _by_replay(replays, np.flatnonzero(pending))[0]:
        replays[index] = replays[index[0]].columns(columns[index])
        columns[index] = np.arange(index.size)


def _by_replay(replays: np.ndarray, rows: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """`rows` grouped by the replay each is held with (`measure`), and those held with none."""
    groups: dict[int, list[int]] = {}
    none = []
    for row, replay in zip(rows.tolist(), replays[rows].tolist(), strict=True):
        if replay is None:
            none.append(row)
        else:
            groups.setdefault(id(replay), []).append(row)
    return [np.array(g) for g in groups.values()], np.array(none, dtype=np.int64)


class _Kept:
    """The ranked layouts held between chunks: all of them, or with `keep` only the best
    `keep` by the objective and those on the Pareto front, each read as a report of it
    reads (`settle`). A layout whose model chunks differ is `pending` until replayed: it
    is held by a lower bound on its step time (`schedule.Replay.bound`), so a replay only
    ever moves it down the ranking and off the front. Pruning keeps what can still be
    shown (`_undecided`): a layout dropped is beaten by `keep` replayed or even layouts
    at their true times, or dominated on the front by one, its own time being at least its
    bound (where few are replayed or even, the shown are replayed first); the best `keep`
    of the whole sweep and its front are then the held ones'. With limits, `count` holds the
    layouts within them."""

    def __init__(
        self, plan: Plan, gpus: int, objective: str, keep: int | None, spans: Spans | None
    ) -> None:
        self.plan, self.gpus, self.objective, self.keep = plan, gpus, objective, keep
        self.spans = spans
        self.parts: list[tuple[Columns, dict[str, np.ndarray]]] = []
        self.held = self.count = self.replayed = 0

    def add(self, cols: Columns, measured: dict[str, np.ndarray]) -> None:
        if self.keep is None:  # every layout is held: none with its replay (`_replay_rows`)
            measured["replay"][:] = None
        self.parts.append((cols, measured))
        self.held += len(cols)
        self.count += len(cols)
        if self.keep is not None and self.held > max(4 * self.keep, CHUNK):
            cols, measured = self._joined()
            chosen = self._undecided(measured)
            if chosen.sum() > self.held // 2:  # few replayed or even: replay the shown first
                cols, measured = self.settle()
                chosen = np.zeros(len(cols), dtype=bool)
                chosen[self._shown(measured)] = True
            index = np.flatnonzero(chosen)
            kept = {k: v[index] for k, v in measured.items()}
            _compact(kept)
            self.parts = [(cols.take(index), kept)]
            self.held = len(index)

    def _undecided(self, measured: dict[str, np.ndarray]) -> np.ndarray:
        """The held layouts that may still be shown: those ranked before the `keep`-th
        replayed or even one (all, while there are fewer), and those no replayed or even
        layout beats on both step time and peak memory. Any other is beaten by `keep`
        layouts, or on the front by one, at their true times and its own bound."""
        assert self.keep is not None
        pending = measured["pending"]
        order = self._order(measured)
        known = np.flatnonzero(~pending[order])
        chosen = np.zeros(len(pending), dtype=bool)
        chosen[order[: known[self.keep - 1] + 1] if len(known) >= self.keep else order] = True
        index = np.flatnonzero(~pending)
        front = index[_front({k: v[index] for k, v in measured.items()})]  # fastest first
        chosen[front] = True
        if front.size:
            # the fastest front layout at or under each one's time has the least peak there
            before = np.searchsorted(measured["time"][front], measured["time"], side="right")
            least = measured["peak"][front][np.maximum(before - 1, 0)]
            chosen |= (before == 0) | (least > measured["peak"])
        else:
            chosen[:] = True
        return chosen

    def _shown(self, measured: dict[str, np.ndarray], top: int | None = None) -> np.ndarray:
        """The best `keep` (or `top`) and the front."""
        best = self._order(measured)[: top or self.keep]
        return np.concatenate([best, _front(measured)])

    def settle(self) -> tuple[Columns, dict[str, np.ndarray]]:
        """Replay the pending layouts among the best `keep` and the front, and again among
        those that take their places, until all shown are replayed or even, each from the
        replay it is held with (`_replay_rows`). A round replays the pending among the best
        2·`keep`, the next in line too: the GPT-3 sweep (1,024 GPUs, keep 10) settles in 3
        rounds of 51, 16 and 9 replays (by the best `keep` alone, 7 rounds of 63 in all, no
        faster; when each round was a pass of the engine, 3 rounds of 2·`keep` took 0.35 s
        against 0.39 s for 6 of `keep`). No replay here can break a limit: a pending layout
        is held only where its bounds keep it within every limit (`_settle_limits` replayed
        the others). Returns the held layouts, joined."""
        cols, measured = self._joined()
        while True:
            if not measured["pending"][self._shown(measured)].any():
                break
            ahead = self._shown(measured, None if self.keep is None else 2 * self.keep)
            # sorted and distinct (`_distinct_values`)
            todo = _distinct_values(ahead[measured["pending"][ahead]])
            _replay_rows(self.plan, cols, self.gpus, self.spans, measured, todo)
            self.replayed += todo.size
        self.parts = [(cols, measured)]
        self.held = len(cols)
        return cols, measured

    def _joined(self) -> tuple[Columns, dict[str, np.ndarray]]:
        cols = _join([c for c, _ in self.parts])
        names = self.parts[0][1]
        return cols, {k: np.concatenate([m[k] for _, m in self.parts]) for k in names}

    def _order(self, measured: dict[str, np.ndarray]) -> np.ndarray:
        first, second = _ORDER_KEYS[self.objective]

        def key(name: str) -> np.ndarray:
            return -measured[name[1:]] if name.startswith("-") else measured[name]

        return np.lexsort((key(second), key(first)))

    def ranked(self, capacity: int) -> tuple[tuple[Result, ...], tuple[Result, ...]]:
        """The best fitting layouts, best first (all, or the best `keep`), and the front."""
        if not self.parts:
            return (), ()
        cols, measured = self._joined()

        def results(index: np.ndarray) -> tuple[Result, ...]:
            picked = {k: v[index] for k, v in measured.items()}
            return tuple(_results(cols.take(index).configs(), picked, capacity))

        return results(self._order(measured)[: self.keep]), results(_front(measured))


def _front(measured: dict[str, np.ndarray]) -> np.ndarray:
    """Indices of the layouts no other beats on both peak memory and step time, fastest
    first (as `pareto`, on arrays)."""
    peak, step = measured["peak"], measured["time"]
    order = np.lexsort((peak, step))
    ordered = peak[order]
    best_before = np.minimum.accumulate(ordered)
    before = np.concatenate(([np.iinfo(np.int64).max], best_before[:-1]))
    front: np.ndarray = order[ordered < before]
    return front


MAX_VALUES = 1024  # values one option may list or span


def parse_values(text: str, option: str) -> tuple[int, ...]:
    """ "4,8" → (4, 8); "1..8" → (1, ..., 8); "1..3,8" → (1, 2, 3, 8)."""
    values: list[int] = []
    for part in text.split(","):
        low, dots, high = part.strip().partition("..")
        try:
            span = range(int(low), int(high or low) + 1)
        except ValueError:
            raise ValueError(f"{option} {text!r}: expected values such as 4,8 or 1..8") from None
        if dots and not high.strip():  # "2.." swept 2 alone, unsaid (an audit)
            raise ValueError(
                f"{option} {text!r}: the range {part.strip()} has no end; write its last "
                f"value too, as {int(low)}..N"
            )
        if not span:  # "1,8..4" swept 1 alone: the empty range was dropped unsaid (an audit)
            raise ValueError(
                f"{option} {text!r}: the range {part.strip()} runs backwards; write "
                f"{int(high)}..{int(low)}"
            )
        if len(values) + len(span) > MAX_VALUES:
            raise ValueError(
                f"{option} {text!r}: at most {MAX_VALUES:,} values; a wider range would take "
                "longer to sweep than to think about"
            )
        values += span
    if not values or min(values) < 0:
        raise ValueError(f"{option} {text!r}: expected values such as 4,8 or 1..8")
    return tuple(dict.fromkeys(values))


def to_dict(outcome: Outcome, top: int) -> dict[str, Any]:
    return {
        "gpus": outcome.gpus,
        "evaluated": outcome.evaluated,
        "elapsed_s": outcome.elapsed_s,
        "configs_per_s": outcome.evaluated / outcome.elapsed_s if outcome.elapsed_s else None,
        "objective": outcome.objective,
        "rejected": outcome.rejected,
        "ruled_out": {reason: list(degrees) for reason, degrees in outcome.ruled_out.items()},
        "fitting": outcome.fitting,
        "rejected_by_states": outcome.by_states,
        "limits": None if outcome.limits is None else outcome.limits.to_dict(),
        "within_limits": outcome.within_limits,
        "replayed": outcome.replayed,
        "hardware": outcome.hardware,
        "pareto": [_ranked_dict(outcome, r) for r in outcome.pareto],
        "results": [_ranked_dict(outcome, r) for r in outcome.results[:top]],
        "written": _written_dict(outcome),
        "written_breaks": list(outcome.written_breaks),
        "nearest": None if outcome.nearest is None else outcome.nearest.to_dict(),
    }


def _written_dict(outcome: Outcome) -> dict[str, Any] | None:
    """The plan as written's record, with its own split (`Outcome.written_split`)."""
    if outcome.written is None:
        return None
    record = outcome.written.to_dict()
    split_ = outcome.written_split()
    record["config"]["layers_per_stage"] = None if split_ is None else list(split_)
    return record


def _ranked_dict(outcome: Outcome, result: Result) -> dict[str, Any]:
    """A ranked layout's record, its config with the pipeline's split where it is uneven
    (``layers_per_stage``, null where the layers divide evenly)."""
    record = result.to_dict()
    split_ = outcome.layers_per_stage(result.config)
    record["config"]["layers_per_stage"] = None if split_ is None else list(split_)
    return record


def as_written(plan: Plan, limits: Limits | None = None) -> tuple[Result, tuple[str, ...]]:
    """The plan's own layout budgeted as `budget PLAN` does, in a ranked row's terms
    (`Outcome.written`), and the limits it breaks, as `budget check` names them (fitting aside)."""
    from budget.check import check_report
    from budget.pipeline import build_report

    report, p = build_report(plan), plan.parallel
    breaks = () if limits is None else check_report(report, limits)
    step = report.step
    config = Config(
        p.tp,
        p.pp,
        p.dp,
        p.cp,
        p.ep,
        p.zero,
        p.sequence_parallel,
        plan.recompute,
        plan.batch.micro,
        p.pipeline.virtual_stages,
        p.dp_shard or 0,
    )
    row = Result(
        config,
        report.worst.peak_bytes,
        report.fits,
        float(step["time_s"] or 0.0),
        float(step["exposed_comm_s"] or 0.0),
        float(step["mfu"] or 0.0),
        float(step["tokens_per_s"] or 0.0),
    )
    return row, tuple(dict.fromkeys(r.limit for r in breaks if r.limit != "memory"))


__all__ = [
    "Config",
    "Outcome",
    "Parallel",
    "Result",
    "Space",
    "apply",
    "candidates",
    "evaluate",
    "pareto",
    "parse_values",
    "search",
    "to_dict",
]
