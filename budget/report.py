"""The report: plain data built from the calculators, and its JSON form (DESIGN.md contract).

Bytes are integers, times seconds. Renderers read these dataclasses and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from budget.plan.model import BandwidthRamp
from budget.report_schema import SCHEMA_VERSION
from budget.units import format_duration, plural

# Message sizes at which the Links table shows a ramped link's share of its bandwidth.
RAMP_SIZES = (16 * 2**20, 64 * 2**20, 256 * 2**20)
RAMP_HEADER = "share at 16 · 64 · 256 MiB"
RAMP_NOTE = (
    "B_eff is the plateau; a collective of that size reaches the share shown (the least of "
    "all-reduce, all-gather and reduce-scatter; nccl-tests sweeps, see `ramp` in the JSON)"
)
# no published sweep measures an all-to-all or a send-recv on these links, so they run at
# the plateau (an audit: a report said every collective reached the shares shown, and
# `budget collective` called an all-to-all's 100 % "measured")
UNRAMPED_NOTE = "; {}, which no sweep measured, run{} at the plateau"
BORROWED_NOTE = "; {} take the all-reduce sweep's shares (no sweep of them was found)"
# a level no sweep measured shows "–" for its shares (an audit: read as "not used")
UNMEASURED_LEVEL_NOTE = "; – on {}, which no sweep measured: {} collectives run at the plateau"


def ramp_note(report: Report, shown: Callable[[str], str] = str) -> str:
    """`RAMP_NOTE`, `UNRAMPED_NOTE` naming the operations the ramps do not measure (an
    all-to-all, a pipeline's send-recv) that run on a ramped level, and
    `UNMEASURED_LEVEL_NOTE` the levels without a ramp, each name as `shown` writes it (the
    markdown escapes the plan's names)."""
    ramped = {
        link["name"]: BandwidthRamp.from_json(link["ramp"])
        for link in report.links
        if link.get("ramp")
    }
    unmeasured = dict.fromkeys(
        c.op
        for p in report.phases
        for c in p.collectives
        for level in (c.link or "").split(" + ")
        if level in ramped and not ramped[level].measures(c.op)
    )
    # the ops that run on a level whose ramp borrows their shares (a review, m520: named
    # where they ran on InfiniBand alone)
    found = {
        c.op
        for p in report.phases
        for c in p.collectives
        for level in (c.link or "").split(" + ")
        if level in ramped and c.op in ramped[level].borrowed
    }
    # in the ramps' own order (all-gather, then reduce-scatter)
    borrowed = dict.fromkeys(op for ramp in ramped.values() for op in ramp.borrowed if op in found)
    note = RAMP_NOTE
    if borrowed:  # a copy of the all-reduce sweep's shares (a review, m514: read as measured)
        note += BORROWED_NOTE.format(" and ".join(borrowed))
    if unmeasured:
        ops = " and ".join(unmeasured)
        note += UNRAMPED_NOTE.format(ops, "" if len(unmeasured) > 1 else "s")
    flat = [link["name"] for link in report.links if not link.get("ramp")]
    if flat:
        its = "their" if len(flat) > 1 else "its"
        note += UNMEASURED_LEVEL_NOTE.format(" and ".join(map(shown, flat)), its)
    return note


def ramp_shares(link: dict[str, Any]) -> str:
    """The least share of a report level's B_eff any ramped operation reaches at each of
    `RAMP_SIZES` (e.g. "59 · 84 · 95 %"), "–" for a level without a ramp."""
    if not link.get("ramp"):
        return "–"
    ramp = BandwidthRamp.from_json(link["ramp"])
    least = [min(ramp.share(op, size) for op, _, _ in ramp.points) for size in RAMP_SIZES]
    return " · ".join(f"{100 * v:.0f}" for v in least) + " %"


@dataclass(frozen=True, slots=True)
class Overlapping:
    """One allocation alive at a peak."""

    tensor: str
    bytes: int  # total of all copies
    category: str
    count: int = 1
    placement: str = ""


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Live bytes on one rank of a stage at one instant of the step, by category."""

    phase: str
    instant: str
    by_category: dict[str, int]  # every category, in the step's category order
    total_bytes: int


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    name: str
    phase: str
    op: str
    group: str
    ranks: int
    dtype: str
    bytes: int  # S: the full logical tensor
    sent_bytes: int  # per rank, per call
    recv_bytes: int  # per rank, per call
    algorithm: str
    steps: int  # latency-bearing phases per call
    count: int  # calls per step on one rank (serving with pp > 1: on each stage's, summed)
    src: str
    dst: str
    link: str | None = None  # level names the group spans, innermost first
    alpha_s: float | None = None  # latency per step of the slowest link
    bandwidth_Bps: float | None = None  # B_eff reached on the slowest link at this size, per GPU
    latency_term_s: float | None = None  # n·α, per call (every chunk's, when chunked)
    bandwidth_term_s: float | None = None  # Q/B_eff, per call
    time_s: float | None = None  # per call, total
    exposed_s: float | None = None  # per call, not hidden behind compute
    slowdown_s: float | None = None  # per call, compute time added by running beside it
    # the share of its pace alone it keeps while hidden, where collectives hidden inside its
    # window share its links (1: alone)
    pace: float | None = None
    overlap_rule: str | None = None
    overlaps_with: str | None = None  # the kernel or window the rule may hide it behind
    # pipelined as this many collectives of 1/chunks of the size (the terms, steps and bytes
    # above sum them; `levels` are one chunk's)
    chunks: int = 1
    levels: tuple[dict[str, Any], ...] = ()  # per link: the pieces of a two-level algorithm


@dataclass(frozen=True, slots=True)
class PhaseRow:
    name: str
    count: int  # instances per step on the stage shown
    stage: int  # the stage whose collectives are listed (the busiest)
    payload_bytes: int  # bytes sent per rank over the step in this phase
    peak_bytes: int  # largest live bytes in this phase over all stages
    peak_stage: int | None
    peak_overlap: tuple[Overlapping, ...]
    collectives: tuple[CollectiveRow, ...]
    compute_s: float | None = None  # kernels plus slowdown_s
    comm_s: float | None = None
    exposed_s: float | None = None
    slowdown_s: float | None = None  # compute added by overlapped collectives


@dataclass(frozen=True, slots=True)
class StageRow:
    stage: int
    layers: int
    inflight: float
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    transient_bytes: int
    kv_cache_bytes: int
    reserved_bytes: int
    peak_bytes: int
    peak_phase: str
    peak_instant: str
    peak_overlap: tuple[Overlapping, ...]
    capacity_bytes: int
    timeline: tuple[TimelinePoint, ...] = ()  # every instant of the step, in step order
    # of `layers`, the multi-token prediction modules the last stage runs after its own
    # (a user audit, m488: the JSON's and diff's counts summed to 62 of a 61-layer model)
    mtp_layers: int = 0

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


@dataclass(frozen=True, slots=True)
class Report:
    name: str
    file: str
    mode: str
    world_size: int
    layout: dict[str, Any]
    model: dict[str, Any]
    device: dict[str, Any]
    microbatches: int
    capacity_bytes: int
    stages: tuple[StageRow, ...]
    phases: tuple[PhaseRow, ...]
    step: dict[str, float | None]
    links: tuple[dict[str, Any], ...] = ()
    # the topology preset the plan names (None: written out) and what it writes over it
    # (`catalog.topology_overrides`: its levels)
    topology_name: str | None = None
    topology_overrides: tuple[str, ...] = ()
    mfu_format: str = "bf16"  # whose dense peak MFU is of (`schedule.mfu_format`)
    mfu_peak: float = 0.0  # that peak, FLOP/s per GPU
    matmul_format: str = "bf16"  # the GEMMs' (precision.matmul), which fp8 prices for time
    # training: (stage, collective) of every stage's per-layer phases (`LAYER_PHASES`)
    layer_collectives: tuple[tuple[int, CollectiveRow], ...] = ()
    # training: every stage's stage sends, each on its own pair of stages' link, where the
    # phase rows hold the costliest stage's (`render.table.link_groups`)
    send_collectives: tuple[CollectiveRow, ...] = ()

    @property
    def worst(self) -> StageRow:
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.stage))

    @property
    def fits(self) -> bool:
        return self.worst.fits

    @property
    def causal_mfu(self) -> float | None:
        """`step.mfu_causal` where it is a tenth or more below MFU, as the report then prints
        it beside MFU (PaLM's count passes 100 % of the peak at a long enough context, an
        audit's 104.4 % at 4.7M tokens, where the GPUs ran at 52 %); else None."""
        mfu, causal = self.step.get("mfu"), self.step.get("mfu_causal")
        if causal is None or not mfu or float(causal) > 0.9 * float(mfu):
            return None
        return float(causal)


def _overlap(items: tuple[Overlapping, ...]) -> list[dict[str, Any]]:
    return [
        {"tensor": o.tensor, "bytes": o.bytes, "category": o.category, "count": o.count}
        for o in items
    ]


def _collective(c: CollectiveRow) -> dict[str, Any]:
    return {
        "name": c.name,
        "op": c.op,
        "group": c.group,
        "ranks": c.ranks,
        "dtype": c.dtype,
        "bytes": c.bytes,
        "sent_bytes": c.sent_bytes,
        "recv_bytes": c.recv_bytes,
        "algorithm": c.algorithm,
        "steps": c.steps,
        "link": c.link,
        "alpha_s": c.alpha_s,
        "bandwidth_Bps": c.bandwidth_Bps,
        "latency_term_s": c.latency_term_s,
        "bandwidth_term_s": c.bandwidth_term_s,
        "time_s": c.time_s,
        "exposed_s": c.exposed_s,
        "slowdown_s": c.slowdown_s,
        "pace": c.pace,
        "count": c.count,
        "from": c.src,
        "to": c.dst,
        "overlap_rule": c.overlap_rule,
        "overlaps_with": c.overlaps_with,
        "chunks": c.chunks,
        "levels": list(c.levels),
    }


def to_dict(report: Report) -> dict[str, Any]:
    """The JSON report (DESIGN.md "Report contract"); keys in a stable order."""
    worst = report.worst
    return {
        "schema_version": SCHEMA_VERSION,
        "plan": {"name": report.name, "file": report.file},
        "mode": report.mode,
        "world_size": report.world_size,
        "layout": report.layout,
        "model": report.model,
        "device": report.device,
        "microbatches": report.microbatches,
        "topology": {
            "name": report.topology_name,
            "overrides": list(report.topology_overrides),
            "levels": list(report.links),
        },
        "memory": {
            "capacity_bytes": report.capacity_bytes,
            "peak_bytes": worst.peak_bytes,
            "fits": report.fits,
            "worst_stage": worst.stage,
            "headroom_bytes": worst.headroom_bytes,
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "mtp_layers": s.mtp_layers,
                    "microbatches_in_flight": s.inflight,
                    "params_bytes": s.params_bytes,
                    "grads_bytes": s.grads_bytes,
                    "optimizer_bytes": s.optimizer_bytes,
                    "activations_bytes": s.activations_bytes,
                    "transient_bytes": s.transient_bytes,
                    "kv_cache_bytes": s.kv_cache_bytes,
                    "reserved_bytes": s.reserved_bytes,
                    "peak_bytes": s.peak_bytes,
                    "headroom_bytes": s.headroom_bytes,
                    "fits": s.fits,
                    "peak_phase": s.peak_phase,
                    "peak_instant": s.peak_instant,
                    "peak_overlap": _overlap(s.peak_overlap),
                    "timeline": [
                        {
                            "phase": t.phase,
                            "instant": t.instant,
                            "total_bytes": t.total_bytes,
                            "by_category": t.by_category,
                        }
                        for t in s.timeline
                    ],
                }
                for s in report.stages
            ],
        },
        "phases": [
            {
                "name": p.name,
                "count": p.count,
                "stage": p.stage,
                "payload_bytes": p.payload_bytes,
                "compute_s": p.compute_s,
                "comm_s": p.comm_s,
                "exposed_s": p.exposed_s,
                "slowdown_s": p.slowdown_s,
                "peak_bytes": p.peak_bytes if p.peak_stage is not None else None,
                "peak_stage": p.peak_stage,
                "peak_overlap": _overlap(p.peak_overlap),
                "collectives": [_collective(c) for c in p.collectives],
            }
            for p in report.phases
        ],
        "step": {**report.step, "mfu_format": report.mfu_format},
    }


def group_name(group: str, layout: dict[str, Any], ranks: int | None = None) -> str:
    """A collective's group as the reader knows it: the data-parallel group spans the
    context-parallel ranks too (gradients are reduced and optimizer states sharded over
    dp × cp), so with cp > 1 it is written dp×cp, not dp beside a count larger than dp;
    likewise an ep collective of more `ranks` than ep, Megatron-Core's routing counts over
    the expert tensor- and expert-parallel ranks together, is tp_ep, Megatron-Core's name
    for that group."""
    if group == "ep" and ranks is not None and ranks > (layout.get("ep") or 1):
        return "tp_ep"
    # under hybrid sharding ZeRO's shard group spans the context-parallel ranks too
    return f"{group}×cp" if group in ("dp", "dp_shard") and layout.get("cp", 1) > 1 else group


def summed_over_stages(report: Report) -> bool:
    """Whether a row sums its stages (`pipeline._phase_rows`): a serving pass crosses the
    stages one after another; in training they work side by side."""
    return report.mode != "train" and report.layout.get("pp", 1) > 1


def calls_scope(report: Report) -> str:
    """What a collective's calls count: one rank's in a step, or in serving with a
    pipeline, every stage's ranks' along the pass."""
    return "; calls summed over the stages a pass crosses" if summed_over_stages(report) else ""


def time_word(mode: str) -> str:
    """What a `mode` plan's time is of, in a sentence: a training "step", or a serving
    plan's whole "run" (an audit: `budget check` said a decode plan's "step takes 11.6 s", a
    caution counted its calls "a step")."""
    return "step" if mode == "train" else "run"


def time_words(modes: Iterable[str]) -> str:
    """What the times of plans of `modes` are of, together: "step", "run", or "step or run"
    for both ("step" for none)."""
    return " or ".join(sorted({time_word(mode) for mode in modes}, reverse=True)) or "step"


def run_scope(report: Report) -> str:
    """What the phase rows add up to: a training step, or a serving plan's whole batch."""
    from budget.inference import passes_for

    if report.mode == "train":
        return "one step"
    if report.mode == "prefill":
        return "the prefill"
    passes = passes_for(report.layout["generate"])
    return f"the batch: its prefill and {plural(passes, 'decode pass', 'decode passes')}"


def phase_scope(report: Report) -> str:
    """What a phase row stands for: the stage where it costs most, or in serving with a
    pipeline the sum over the stages a pass crosses."""
    if summed_over_stages(report):
        return "per rank; times summed over the stages a pass crosses, payloads of the costliest"
    return "per rank, on the stage where each costs most"


# the groups whose collectives run in every layer of every micro-batch, in these phases
_PER_LAYER = ("tp", "cp", "ep", "etp")
LAYER_PHASES = ("attention", "mlp", "moe")


def slow_link_notes(report: Report) -> tuple[str, ...]:
    """A caution for each per-layer group (tp, cp, ep, etp) whose collectives leave the
    topology's innermost level: frequent exchanges belong on the fastest links (DESIGN.md's
    seed, "map frequent communication onto topology regions with sufficient latency and
    bandwidth"), and a rank order that strides them across nodes passes every limit unsaid
    (a seeds audit: tp 8 over InfiniBand, 63 % of the step exposed, and no word).

    A training plan's figures are one stage's, named where there are several: the stage
    that paces the step where the group exposes time there, whose exposure the step's own
    exposed time holds, else the stage where it exposes most, said not to pace the step.
    The phase rows come each from the stage where its phase costs most, and their sum could
    belong to no stage (an audit); a stage that does not pace the step can expose more than
    the step's exposed time, which is the pacing stage's (a review: 405 ms of tp on stage 0
    beside a step that exposed 62.4 ms in all, unexplained). A serving pass crosses every
    stage, so there the rows, summed over the stages, are the figures. Last, a caution where
    ZeRO 3's per-layer collectives are latency-bound (`_latency_note`)."""
    tagged: tuple[tuple[int | None, CollectiveRow], ...] = report.layer_collectives or tuple(
        (None, c)
        for p in report.phases
        if p.name.rpartition(".")[2] in LAYER_PHASES  # not the embedding, loss or dp
        for c in p.collectives
    )
    latency = _latency_note(report, tagged)
    if len(report.links) < 2:
        return latency
    inner = report.links[0]
    found: dict[str, dict[int | None, list[CollectiveRow]]] = {}
    for stage, c in tagged:
        if c.group in _PER_LAYER and c.link and c.link != inner["name"]:
            # by the name the collectives table gives the group: Megatron-Core's routing
            # counts over etp x ep are tp_ep's, not ep's (a review)
            group = group_name(c.group, report.layout, c.ranks)
            found.setdefault(group, {}).setdefault(stage, []).append(c)

    def exposed(rows: list[CollectiveRow]) -> float:
        return sum((c.exposed_s or 0.0) * c.count for c in rows)

    notes = []
    paced = report.step.get("pacing_stage")
    pacing = None if paced is None else int(paced)
    for group, by_stage in found.items():
        stage, rows = max(by_stage.items(), key=lambda kv: (exposed(kv[1]), -(kv[0] or 0)))
        if exposed(rows) <= 0:  # hidden behind compute: the step does not wait for the slow link
            continue
        if pacing in by_stage and exposed(by_stage[pacing]) > 0:
            stage, rows = pacing, by_stage[pacing]
        links = " and ".join(dict.fromkeys(n for c in rows for n in str(c.link).split(" + ")))
        calls = sum(c.count for c in rows)
        paces = "paces" if stage == pacing else "does not pace"
        named = stage is not None and report.layout["pp"] > 1  # a serving pass: every stage
        where = f" on stage {stage}, which {paces} the step" if named else ""
        hint = _closer(report, group, rows[0].ranks, inner["name"], inner.get("size"))
        notes.append(
            f"{group}'s per-layer collectives ({calls:,} calls a {time_word(report.mode)}{where}, "
            f"{format_duration(exposed(rows))} of them exposed) cross {links}: {hint}"
        )
    return (*notes, *latency)


def _latency_note(
    report: Report, tagged: tuple[tuple[int | None, CollectiveRow], ...]
) -> tuple[str, ...]:
    """A caution where ZeRO 3's per-layer gathers and reduce-scatters over the whole
    data-parallel group are latency-bound (their n·α above their bytes' time) and the step
    waits for some of them: a ring over P ranks takes P − 1 steps of α (DESIGN.md rule 4),
    so over thousands of ranks a layer's gather is mostly latency, which hybrid sharding
    (`Parallel.dp_shard`) cuts to a shard group's steps and an all-reduce across the copies
    (the README's Llama 3 8B on 4,096 GPUs: 17.9 ms of n·α a gather, its step 2.18 s
    against 1.17 s). The figures are the pacing stage's where it has such collectives,
    else the stage's that exposes most of them, as `slow_link_notes` reads its groups';
    only the latency-bound ones' exposure counts (a review: a bandwidth-bound
    reduce-scatter's exposure beside hidden latency-bound gathers raised it over 48 nodes,
    where a shard group per node is slower). Not said where the plan could not take the
    key: experts split apart over ep or etp (`resolve._check_hybrid`)."""
    layout = report.layout
    if layout["ep"] > 1 or layout.get("etp") not in (None, layout["tp"]):
        return ()
    by_stage: dict[int | None, list[CollectiveRow]] = {}
    for stage, c in tagged:
        if c.group == "dp" and c.op in ("all-gather", "reduce-scatter"):
            by_stage.setdefault(stage, []).append(c)
    if not by_stage:
        return ()

    def exposed(rows: list[CollectiveRow]) -> float:
        return sum((c.exposed_s or 0.0) * c.count for c in rows)

    paced = report.step.get("pacing_stage")
    stage = None if paced is None else int(paced)
    rows = by_stage.get(stage) or max(by_stage.values(), key=exposed)
    bound = [c for c in rows if (c.latency_term_s or 0.0) > (c.bandwidth_term_s or 0.0)]
    if exposed(bound) <= 0:
        return ()
    worst = max(bound, key=lambda c: c.latency_term_s or 0.0)
    group = group_name(worst.group, layout, worst.ranks)
    return (
        f"ZeRO 3's per-layer collectives over {group} {worst.ranks:,} are latency-bound "
        f"(n·α {format_duration(worst.latency_term_s or 0.0)} of the "
        f"{format_duration(worst.time_s or 0.0)} a call of {worst.name} takes; "
        f"{format_duration(exposed(bound))} of them exposed a step): hybrid sharding "
        "(parallel.dp_shard) gathers and reduce-scatters within a shard group and all-reduces "
        "the gradients' shard across the copies, in fewer steps",
    )


def _closer(report: Report, group: str, ranks: int, level: str, size: int | None) -> str:
    """Why `group` leaves `level`: wider than a domain; an expert group spaced etp apart
    (the expert layers' tp inside it, Megatron-Core's expert rank order) wider than one; or
    the groups parallel.order lists before it taking the domain's ranks (the first groups
    take the closest ranks), naming those that run no per-layer collective, which could
    move out instead."""
    domain = f"one {level} domain of {size}"
    if not size or ranks > size:
        return f"{group} {ranks} is wider than {domain}"
    layout = report.layout
    order = [g for g in layout.get("order") or [] if (layout.get(g) or 1) > 1]
    etp = layout.get("etp") or layout["tp"]
    written = list(layout.get("order") or [])
    if "ep" not in written and "dp" in written:  # ep before dp (`topology._expert_order`)
        written.insert(written.index("dp"), "ep")
    # etp varies faster than ep only where the order lists tp first (an audit: ep first
    # puts an ep group on consecutive ranks)
    spaced = {"tp", "ep"} <= set(written) and written.index("tp") < written.index("ep")
    if group == "ep" and etp > 1 and spaced and ranks * etp > size:
        # the way out, where ep alone fits the domain (a user audit, m505: Mixtral 8x22B's
        # ep 8 at etp 2 went 600 µs a dispatch where etp 1 keeps it in the node, 140 µs)
        fix = f": parallel.etp 1 keeps ep {ranks} inside it" if size % ranks == 0 else ""
        return (
            f"ep {ranks} spaced etp {etp} apart (the expert layers' tp inside each ep group) "
            f"spans {ranks * etp} ranks, more than {domain}{fix}"
        )
    degrees, names = layout, {g: g for g in order}
    if group == "ep":
        # the expert layers split the stage's tp × cp × dp ranks into etp × ep × edp over
        # the same order, tp read as etp and dp as edp (`topology._expert_coords`; an audit:
        # "tp 2 × dp 8 × ep 8 = 128 ranks" for an ep group of 16)
        edp = layout["tp"] * layout["cp"] * layout["dp"] // (ranks * etp)
        degrees = {"etp": etp, "ep": ranks, "edp": edp, "pp": layout["pp"]}
        names = {"tp": "etp", "dp": "edp", "ep": "ep", "pp": "pp"}
        order = [g for g in layout.get("order") or [] if g in names and degrees[names[g]] > 1]
        if "ep" not in order:  # no order names it: ep before dp (`topology._expert_order`)
            order.insert(order.index("dp") if "dp" in order else len(order), "ep")
    if group in order:
        before = order[: order.index(group)]
        extent = math.prod(degrees[names[g]] for g in before) * ranks
        if before and extent > size:
            spans = " × ".join(f"{names[g]} {degrees[names[g]]}" for g in (*before, group))
            rarer = [g for g in before if names[g] not in _PER_LAYER]
            move = f": list {group} before {' and '.join(rarer)}" if rarer else ""
            return (
                f"parallel.order puts {', '.join(before)} closer ({spans} = {extent} ranks, "
                f"more than {domain}){move}"
            )
    return f"{group} {ranks} would fit in {domain}; parallel.order strides its ranks across them"
