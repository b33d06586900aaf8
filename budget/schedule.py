"""Time: collectives priced on the topology, compute by the roofline, overlap, step time.

Every collective of the step gets its total time (T = n·α + Q/B_eff on the links its group
spans, `budget.topology`) and its exposed part: the share the step waits for once the overlap
its dependencies allow is taken (DESIGN.md rule 6). Overlap only happens inside a window
the step derivation names (`step.Move.window`), and only when the plan's `overlap:` flag for
it is on, or always for the overlaps Megatron-LM does by default:

    exposed = max(floor · T, T − share · W / (1 − s))

with W the window's compute time and s the overlap slowdown. A collective pipelined with its
GEMM in c chunks (`Move.chunks`, `overlap.tp`'s reduce-scatter) runs as c collectives of 1/c
of the size, each T_c = n·α + (Q/c)/B_eff at that size: T = c · T_c and exposed = max(T_c,
T − share · W / (1 − s)), the last chunk waiting with nothing beside it. The hidden part is
not free: compute runs slower while a collective runs beside it (its kernels take streaming
multiprocessors and memory bandwidth), by ``overlap.slowdown`` s (default 18.9 %, the
average Lee et al. measured, arXiv 2507.03114): it makes progress at 1 − s of its rate, so
an overlapped collective adds ``s · (T − exposed)`` of compute time to its phase, and W
seconds of compute last W / (1 − s) beside one, which is what a collective that outlasts
them hides (its phase then takes T in all, not T and the slowdown). That time is the
compute's, not the collective's: exposed communication stays the part of T the step waits
for, and the charge is reported on its own (``slowdown_s``).
Transformer Engine's comm-GEMM overlap (`overlap.tp`) also reshapes the GEMM it hides
behind (`overlapped_gemms`): the GEMM runs as ``num_splits`` kernels, each ramping as a
smaller GEMM, and beside its pipelined reduce-scatter on the device's SMs less the
``num_sm`` the collective holds for the GEMM's whole length (``set_sm_margin``); that margin
is the compute's slowdown there, in place of ``overlap.slowdown``.
Each collective is charged for its own hidden time. Two sharing a window run one after the
other beside it, so the second hides only behind what the first left of share · W / (1 − s).
A collective hidden behind a phase or more shares each link it uses with the collectives
hidden inside that window (DESIGN.md rule 5; `_link_loads`): they hold u of the link, their
bandwidth terms over W / (1 − s), and it moves its bytes at (1 − u) of B_eff, keeping the
pace p = T / (n·α + Σ (Q/B) / (1 − u)) of its time alone (`collectives.shared_pace`), and
hides behind p · share · W / (1 − s). A link carries its bandwidth at most: the work the two
do on it adds up (Velho et al. 2013's fluid model of flows sharing a link).
Compute is the roofline of each kernel
(`max(FLOPs / (peak · e_matmul), bytes / (bandwidth · e_memory))`, Williams et al. 2009).

Step time (Narayanan et al., arXiv 2104.04473, section 2.2): with m micro-batches, p stages
taking t_i per micro-batch (forward + backward + exposed communication) and v virtual
stages, the pipeline takes m·max(t) + (Σt − max(t))/v: for equal stages (m + (p − 1)/v)·t,
the bubble being (p − 1)/v of a micro-batch per stage. A 1F1B or interleaved split whose
model chunks differ in size is replayed in Megatron-LM's order instead (`pipeline_replay`):
a large chunk paces the stages waiting on it, and a slow first stage is not waited on by
the bubble. The closed form over stage totals misses the replay both ways: on Llama 3 70B's
and Gemma 2 9B's uneven layouts (a review) from −5 % to +12 % (Llama 3.1 405B at p 16, v 7,
chunks of one and two layers: 16.31 s against 17.39 s), and up to +51 % where a ZeRO-2
reduction after every backward is exposed. A sweep holds an uneven layout by a lower bound
on its replay (`Replay.bound`) and replays it once it could be shown (`search._Kept`), so a
ranked layout reads what its report reads.
A reduction after every backward (ZeRO-2) is priced with the gradient reduction but waits
in the fill and drain as part of each micro-batch, with the slowdown it puts on the backward
it hides behind (`StageTime.each_microbatch_s`).
Then each stage reduces its gradients, from the end of its own last backward: Megatron-LM's
``finalize_model_grads`` runs on each rank once its schedule returns, and a stage after the
first ends its last backward before the stages ahead of it run theirs (the drain: stage s at
least Σ_{j<s} b_j before the first, b_j stage j's backward of one micro-batch through its
first chunk, `StageTime.lead_s`; an audit found a step whose later stages held more layers
4–7 % long where every reduction started at the pipeline's end). The optimizer waits for
every stage's reduction (its gradient norm is all-reduced over the model-parallel group,
Megatron-LM's ``clip_grad_norm``), then each stage steps its own, which the next step's
first forward on that stage waits for; a later stage's comes after the fill, the forwards
of the stages ahead (`StageTime.fill_s`), and a later 1F1B stage gathers its parameters
only once that forward's input is in, so those gathers run one after another along the
fill (`StageTime.gather_s`). The step is the pipeline, then the latest reduction past its
end, then how long the optimizer steps put the next step's pipeline off (`put_off`,
`_tail`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from itertools import pairwise
from typing import Any, cast

import numpy as np

from budget.collectives import (
    Algorithm,
    CollectiveCost,
    link_terms,
    repeated,
    shared_pace,
    with_steps,
)
from budget.efficiency import gemm_efficiency
from budget.flops import (
    GRADIENT_PASSES,
    Work,
    attention_query_flops,
    model_flops_per_token,
    serving_params,
)
from budget.inference import decode_passes
from budget.layers import chunk_times_differ, interleaved_warmup, moe_layers, stage_chunk_ids
from budget.phases import (
    EMBEDDING_BACKWARD_WINDOW,
    HAND_WRITTEN,
    PHASE_ORDER,
    Move,
    MoveGroup,
    Phase,
    StageStep,
    Step,
    pass_of,
    pass_within,
)
from budget.plan.model import Parallel, Plan, Topology
from budget.topology import (
    GroupKind,
    GroupSpan,
    group_ranks,
    group_span,
    price_group,
    span_of_ranks,
)
from budget.units import format_share
from budget.vector import every, holds, largest, ratio, vfloat, vmax, vmin, vsum, vwhere

# the step's phases after the micro-batches begin with the deferred weight gradients
MICROBATCH_PHASES = PHASE_ORDER[: PHASE_ORDER.index("head.wgrad")]


def per_microbatch(name: str) -> bool:
    """A phase that runs within each micro-batch: a built-in one, or a hand-written
    transition on a whole pass ("forward: NAME", `step._with_transitions`)."""
    return name in MICROBATCH_PHASES or pass_of(name) in ("forward", "backward")


FORWARD_PHASES = (*(p for p in MICROBATCH_PHASES if p.startswith("forward.")), "mtp", "loss")
BACKWARD_PHASES = tuple(p for p in MICROBATCH_PHASES if p.startswith("backward."))


@dataclass(frozen=True, slots=True)
class TimedMove:
    move: Move
    cost: CollectiveCost
    time_s: float  # one call, total
    exposed_s: float  # one call, what the step waits for
    rule: str  # which overlap rule applied
    slowdown_s: float = 0.0  # one call: compute time added by running beside it
    chunks: int = 1  # run as this many collectives of 1/chunks of the size; `cost` is one
    # the share of its pace alone it keeps while hidden, on links the collectives hidden
    # inside its window share with it (`_link_loads`); 1 alone
    pace: float = 1.0


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """One instance of a phase on one stage (multiply by `count` for the step)."""

    name: str
    count: int
    compute_s: float  # kernels, plus the overlap slowdown below
    comm_s: float
    exposed_s: float
    moves: tuple[TimedMove, ...]
    slowdown_s: float = 0.0  # compute added by overlapped collectives (module docstring)


@dataclass(frozen=True, slots=True)
class StageTime:
    stage: int
    phases: tuple[PhaseTime, ...]
    microbatch_s: float  # forward + backward + exposed communication of one micro-batch
    after_s: float  # gradient reduction and optimizer step after the last backward
    # of after_s, what a reduction after every backward (ZeRO-2) exposes a micro-batch and
    # the compute it slows there
    each_microbatch_s: float = 0.0
    # of after_s, the optimizer step, which waits for every stage's reduction
    optimizer_s: float = 0.0
    # how long before the pipeline's end the stage's last backward ends, at the least: the
    # backwards of the stages ahead of it, which wait for its own (`_with_leads`)
    lead_s: float = 0.0
    # how long after the pipeline's start the stage's first forward begins, at the least:
    # the forwards of the stages ahead of it, which it waits for (`_with_leads`); its
    # optimizer step and parameter gather before the next step run that long off its path
    fill_s: float = 0.0
    # of optimizer_s, the exposed parameter gather its first forward waits for once its input
    # has arrived (`phases.Move.after_input`: a later 1F1B stage's, in one bucket), and the
    # same of the stages after it summed, which that forward's output waits for in turn
    gather_s: float = 0.0
    behind_s: float = 0.0

    @property
    def reduce_s(self) -> float:
        """What of `after_s` runs before the optimizer: the gradient reductions."""
        return self.after_s - self.optimizer_s


@dataclass(frozen=True, slots=True)
class StepTime:
    stages: tuple[StageTime, ...]
    time_s: float
    pipeline_s: float
    bubble_s: float
    tokens_per_s: float
    mfu: float
    model_flops: float  # per step, all GPUs
    ttft_s: float | None = None  # serving: prefill of the whole batch, time to first token
    decode_token_s: float | None = None  # serving: one decode pass (one token per sequence)


@dataclass(frozen=True, slots=True)
class Pacing:
    """What a training step waits for (`paced_by`)."""

    stage: int  # the stage with the most time per micro-batch
    reducing: int  # the stage whose gradient reduction ends latest past the pipeline's end
    optimizing: int  # the stage whose optimizer step takes longest
    # the first's micro-batch phases, the second's reductions, the third's optimizer
    groups: tuple[list[PhaseTime], list[PhaseTime], list[PhaseTime]]
    drained_s: float  # the reducing stage's lead: its reduction run while the others drain
    filled_s: float = 0.0  # the optimizing stage's fill: its optimizer run while others fill
    # the later stages' parameter gathers in series behind the optimizing stage's first
    # forward (`StageTime.behind_s`): exposed communication no phase of its own counts
    behind_s: float = 0.0

    @property
    def phases(self) -> list[PhaseTime]:
        return [p for group in self.groups for p in group]


def paced_by(times: StepTime) -> Pacing:
    """The phases a training step waits for (`_tail`): the micro-batch phases of the stage
    that paces the pipeline (the most forward, backward and exposed time per micro-batch),
    the gradient reduction of the stage whose ends latest past the pipeline's end (its
    reduction less its lead, `StageTime.lead_s`), then the optimizer of the stage that puts
    the next step's pipeline off longest (`put_off`); each the first of equals. Their
    compute plus exposed time, plus the later stages' gathers in series behind the last
    (`Pacing.behind_s`), plus the bubble, less the lead the reduction ran in
    (`Pacing.drained_s`) and the fill the optimizer ran in (`Pacing.filled_s`), is the
    step."""
    pacing = max(times.stages, key=lambda s: (s.microbatch_s, -s.stage))
    reducing = max(times.stages, key=lambda s: (s.reduce_s - s.lead_s, -s.stage))
    optimizing = max(times.stages, key=lambda s: (put_off(s), -s.stage))
    return Pacing(
        pacing.stage,
        reducing.stage,
        optimizing.stage,
        (
            [p for p in pacing.phases if phase_part(p.name) == "microbatch"],
            [p for p in reducing.phases if phase_part(p.name) == "reduction"],
            [p for p in optimizing.phases if phase_part(p.name) == "optimizer"],
        ),
        float(reducing.lead_s),
        float(optimizing.fill_s),
        float(optimizing.behind_s),
    )


def _optimizer(name: str) -> bool:
    """The optimizer's phase, or a hand-written transition in it ("optimizer: NAME")."""
    return pass_of(name) == "optimizer"


def _gather_after_input(plan: Plan, phases: Sequence[PhaseTime]) -> Any:
    """The exposed time of a stage's optimizer phases that its next first forward waits
    for once its input has arrived (`phases.Move.after_input`), where the move's overlap
    flag is on: off, Megatron-LM gathers in the optimizer step itself, beside the fill."""
    waited: Any = 0.0
    for p in phases:
        if not _optimizer(p.name):
            continue
        for t in p.moves:
            after = t.move.after_input
            if np.any(holds(after)) and _flag(plan, t.move.flag):
                waited = waited + vwhere(after, t.exposed_s * t.move.count * p.count, 0.0)
    return waited


@lru_cache(maxsize=1024)  # a sweep asks it of every phase of every stage, again and again
def phase_part(name: str) -> str:
    """Which part of a training step a phase is in (`paced_by`): "microbatch",
    "reduction" or "optimizer"."""
    if per_microbatch(name):
        return "microbatch"
    return "optimizer" if _optimizer(name) else "reduction"


def _tail(stages: Sequence[StageTime], zero2: Any = None) -> Any:
    """What the step takes past the pipeline's end (module docstring): the latest end of a
    stage's gradient reduction, each from its own last backward (`StageTime.lead_s` before
    the end), then how long the optimizer steps put the next step's pipeline off
    (`put_off`). `zero2`: the micro-batches whose reduction
    after every backward the replay holds in the backwards already (ZeRO-2), which the
    closed form counts here (`replay_of`). Arrays over a sweep's layouts, or numbers."""
    m = 0 if zero2 is None else zero2
    reductions = largest([s.reduce_s - m * s.each_microbatch_s - s.lead_s for s in stages])
    return reductions + largest([put_off(s) for s in stages])


def put_off(stage: StageTime) -> Any:
    """How long `stage`'s optimizer step puts the next step's pipeline off: every stage
    steps once every reduction is done, then stage k's first forward waits for its own
    step and parameter gather and for stage k - 1's first forward, which comes F_k (its
    fill, `StageTime.fill_s`) after the pipeline's start; the gather a stage launches only
    once its input has arrived (S_k, `StageTime.gather_s`) comes after both. Stage k's
    first forward thus starts at max(O_k + E_k, start_{k-1} + f_{k-1}) + S_k, E_k the
    optimizer phase's exposed time other than S_k, and the last stage's, less the fill,
    at the largest over k of O_k + E_k + S_k - F_k + Σ_{j>k} S_j (`StageTime.behind_s`):
    this stage's term."""
    return stage.optimizer_s - stage.fill_s + stage.behind_s


def _one_chunk(stage: StageTime, m: Any, v: int, which: str) -> Any:
    """A stage's `which` pass ("forward" or "backward") of one micro-batch through one of
    its `v` model chunks: that pass's phases' compute and exposed time a micro-batch over
    v, below its first chunk's where that holds the embedding (stage 0's); the sends
    between stages left out. The last backward makes the drain (`StageTime.lead_s`), the
    first forward the next step's fill (`StageTime.fill_s`). Where a stage's chunks are
    alike the leads it makes are so at most the drain's (`_with_leads`); where they differ
    a first chunk can be below the mean, and the replay takes each stage's first chunk's
    own (`_chunk_leads`)."""
    busy = sum(
        (p.compute_s + p.exposed_s) * p.count
        for p in stage.phases
        if per_microbatch(p.name) and pass_of(p.name) == which
    )
    return busy / (m * v)


def _with_leads(
    stages: Sequence[StageTime], copies: Sequence[Any], m: Any, v: int
) -> list[StageTime]:
    """`stages` with their leads (`StageTime.lead_s`): stage s's last backward ends at least
    Σ_{j<s} b_j before the pipeline's, b_j stage j's (`_one_chunk`), since stage j's last
    op, chunk 0's backward of the last micro-batch, waits for stage j + 1's (Megatron-LM's
    1F1B and interleaved orders alike, `replay_order`). `copies`: how many alike stages each
    of `stages` stands for (a sweep's classes); a class takes its first stage's lead, the
    least of its stages', whose reduction ends latest. No leads where a stage reduces after
    every backward (`_drains`)."""
    backwards, forwards = (
        [count * _one_chunk(s, m, v, which) for s, count in zip(stages, copies, strict=True)]
        for which in ("backward", "forward")
    )
    return _led(stages, backwards, forwards, copies)


def _led(
    stages: Sequence[StageTime],
    backwards: Sequence[Any],
    forwards: Sequence[Any],
    copies: Sequence[Any] | None = None,
) -> list[StageTime]:
    """`stages`, each led by the `backwards` of the stages ahead of it summed (none under
    `_drains`), filled by their `forwards` summed, and with the gathers in series of the
    stages after its first (`StageTime.behind_s`; `copies`: how many alike stages each of
    `stages` stands for, one each where not given)."""
    counts = [1] * len(stages) if copies is None else list(copies)
    behind, later = [], 0.0
    for stage, count in zip(reversed(stages), reversed(counts), strict=True):
        behind.append(later + (count - 1) * stage.gather_s)
        later = later + count * stage.gather_s
    out, ahead, filled = [], 0.0, 0.0
    drains = _drains(stages)
    for stage, backward, forward, after in zip(
        stages, backwards, forwards, reversed(behind), strict=True
    ):
        lead = vwhere(drains, ahead, 0.0)
        out.append(replace(stage, lead_s=lead, fill_s=filled, behind_s=after))
        ahead = ahead + backward
        filled = filled + forward
    return out


def _drains(stages: Sequence[StageTime]) -> Any:
    """Whether a step's reductions are timed from each stage's own end (`_with_leads`): not
    where a stage exposes a reduction after every backward (ZeRO-2), whose m reductions the
    closed form counts past the pipeline (`StageTime.each_microbatch_s`), so that a later
    stage's lead would take back time its micro-batches' reductions hold the pipeline for."""
    return holds(vsum([s.each_microbatch_s for s in stages]) == 0)


def work_time(plan: Plan, work: Work) -> float:
    """Roofline seconds of one kernel on this device (Williams et al. 2009)."""
    device = plan.device
    # GEMMs run in precision.matmul; the attention core runs in the activations' format, as
    # Transformer Engine's FP8 recipes keep it (FP8 applies to the Linear layers' GEMMs), at
    # the rate (measured or derived) of the fused kernel the plan names where the device has
    # one (else, like eager attention's two products, on the GEMM curve); the few FLOPs of
    # memory-bound kernels are timed at the bf16 rate.
    dtype = work.dtype or {
        "matmul": plan.precision.matmul,
        "attention": plan.precision.activations,
    }.get(work.kind, "bf16")
    peak = device.peak_flops(dtype)
    if not peak:  # a Plan built without `resolve`, which refuses a format without a peak
        dtype, peak = "bf16", device.peak_flops("bf16")
    if not peak or not device.memory_bandwidth:
        return 0.0  # no roofline for this device: the report prints no times (`can_time`)
    fused = None  # a fraction, or an array of them in a sweep
    compute: float
    if work.kind == "attention" and plan.model.attention != "eager":
        if work.keys is None:  # a rebuilt Work lost them: refuse rather than misprice
            raise ValueError(f"fused attention kernel {work.name!r} has no keys per call")
        fused = device.attention_fraction(
            plan.model.attention, work.keys, work.causal, work.unmasked_keys, work.attention_pass
        )
    if fused is not None:
        # the kernels' rates were measured in bf16 and are fractions of the bf16 peak;
        # fp8 or fp32 activations do not make the measured kernel faster or slower
        compute = work.flops / ((device.peak_flops("bf16") or peak) * fused)
    else:
        compute = work.flops / (peak * gemm_efficiency(device, work, dtype))
    compute = compute / work.sm_share
    # a kernel takes its startup beyond its bytes (T = a + V / B, `budget.catalog.devices`)
    memory = work.bytes / (device.memory_bandwidth * device.memory_efficiency)
    if device.kernel_startup:
        memory = memory + vwhere(work.bytes > 0, device.kernel_startup * work.launches, 0.0)
    return vmax(compute, memory) * work.count


def mfu_format(plan: Plan) -> str:
    """The format whose dense peak MFU is a share of: the GEMMs' (precision.matmul), or the
    attention core's where that one's peak is higher, so that no FLOP of the model ran
    faster than the peak it is counted against (a fuzzing audit: fp32 GEMMs beside a bf16
    attention kernel read 112 % of the fp32 peak at 32K tokens). The attention core's
    format is the one `work_time` times it at: bf16 for a fused kernel with a rate (its
    fraction is of the bf16 peak, whatever the activations), the activations' for eager
    attention or a fused kernel priced on the GEMM curve (a review: a written-out device's
    fp32 plan read 4.4 % of the bf16 peak where it ran at 65 % of its own). An fp8 plan's
    GEMMs keep it at the fp8 peak."""
    device, matmul = plan.device, plan.precision.matmul
    # the format `work_time` times the attention products at: a fused kernel's measured
    # fraction is of the bf16 peak, eager attention's two GEMMs run in the activations'
    attention = plan.precision.activations
    rated = device.attention_source(plan.model.attention) in ("plan", "measured", "derived")
    if rated and device.peak_flops("bf16"):  # a fused kernel with a rate (`work_time`)
        attention = "bf16"
    if device.peak_flops(attention) > device.peak_flops(matmul):
        return attention
    return matmul


def can_time(plan: Plan) -> bool:
    """Timing needs a matmul peak and a memory bandwidth in the device section."""
    device = plan.device
    return bool(device.peak_flops(plan.precision.matmul) and device.memory_bandwidth)


def move_kind(plan: Plan, group: MoveGroup, ranks: int) -> GroupKind:
    """The group a move of `ranks` ranks on `group` runs over: gradients under context
    parallelism are reduced over dp x cp (`ranks` = dp·cp), and under hybrid sharding over
    its shard group's dp_shard x cp (`step._hybrid`), every other move over its own."""
    par = plan.parallel
    if group == "dp" and par.cp > 1 and ranks == par.dp * par.cp:
        return ("dp", "cp")
    if group == "dp_shard" and par.cp > 1:
        return ("dp_shard", "cp")
    # Megatron-Core's routing counts, gathered over the expert tensor- and expert-parallel
    # ranks together (`step._ep_moves`)
    etp = par.expert_tp
    if group == "ep" and etp > 1 and ranks == par.ep * etp:
        return ("etp", "ep")
    return group


def move_span(plan: Plan, move: Move) -> GroupSpan:
    """The ranks `move`'s group holds under `parallel.order`, and the levels they span.

    Send/recv runs between neighbouring stages (the tied-embedding all-reduce between the
    first and last), each stage's send on its own pair of stages' link (`Move.boundary`):
    in a serving pass the stages run one after another and every send is on the way (an
    audit: pp 8 over two nodes had priced its six NVLink sends at InfiniBand's, a time to
    first token 120 ms long); in training each stage exchanges with its own neighbours
    only (Megatron-LM's 1F1B ``send_forward_recv_backward`` with the next stage,
    ``send_backward_recv_forward`` with the previous), so a send across nodes lengthens the
    two stages beside it, and the replay carries it to the rest (an audit, m446: every
    stage priced at the slowest pair's link, 8.8 ms of a 234 ms step at tp 2, pp 8 over two
    nodes, where only stages 3 and 4 cross). Gradients under
    context parallelism are reduced over dp x cp. Expert layers' groups (etp, ep, edp) are
    the expert grid's (`topology`, Megatron-Core's parallel folding).
    """
    par, topo = plan.parallel, plan.topology
    # the stage sends and the embedding copies' all-reduce; a hand-written collective on pp
    # runs over the whole group (it was priced as one neighbouring pair: an audit), a
    # hand-written send (`step._with_transitions`) between neighbours as the built-in ones
    if move.op == "send-recv":
        if move.boundary is None:  # every stage send names its pair (`step.at_boundary`)
            raise AssertionError(f"{move.name}: a stage send without its boundary")
        return _boundary_span(par, topo, int(move.boundary))
    if move.group == "pp" and not move.rule.startswith(HAND_WRITTEN):
        return _ends_span(par, topo)
    span = group_span(move_kind(plan, move.group, move.ranks), par, topo)
    if span.size != move.ranks:
        raise AssertionError(f"{move.name}: {move.ranks} ranks on a {span.size}-rank group")
    return span


@lru_cache(maxsize=256)
def _boundary_span(par: Parallel, topo: Topology, stage: int) -> GroupSpan:
    """`move_span` of a send across boundary `stage` (`Move.boundary`): between that
    stage and the next, the last stage's with the first's."""
    members = group_ranks("pp", par, topo.gpus)
    return span_of_ranks((members[stage], members[(stage + 1) % len(members)]), topo, "pp")


@lru_cache(maxsize=64)
def _ends_span(par: Parallel, topo: Topology) -> GroupSpan:
    """`move_span` of the embedding copies' all-reduce between the first and last stage;
    once per layout, not per move."""
    members = group_ranks("pp", par, topo.gpus)
    return span_of_ranks((members[0], members[-1]), topo, "pp")


def price_move(plan: Plan, move: Move) -> CollectiveCost:
    """The collective of `move` priced on the levels its group spans (`move_span`), with
    the algorithm the move needs (ring attention's flat ring) or else the one the plan
    names for its op (`Plan.algorithm`), or else the default."""
    span = move_span(plan, move)
    algorithm = algorithm_of(plan, move)
    # the move's own algorithm is a neighbours' exchange (ring attention): its hop across a
    # node is one GPU's port, not NCCL's channels over all of them (`collective_cost`)
    levelled = move.algorithm is None
    several = not every(move.calls == 1)  # as several collectives, each of its own size
    size = move.size_bytes // move.calls if several else move.size_bytes
    cost = price_group(move.op, size, span, algorithm, dtype=move.dtype, levelled=levelled)
    if several:
        return repeated(cost, move.calls, move.size_bytes)
    # riding another move's messages (`Move.steps`)
    return cost if move.steps is None else with_steps(cost, move.steps)


def algorithm_of(plan: Plan, move: Move) -> Algorithm | None:
    """The algorithm `move` is priced with: its own (ring attention's flat ring), else the
    one the plan names for its op (`Plan.algorithm`), else None for the default."""
    return cast(Algorithm | None, move.algorithm or plan.algorithm(move.op))


def _flag(plan: Plan, flag: str) -> bool:
    return flag == "" or bool(getattr(plan.overlap, flag))


# Roofline seconds of kernels already timed in a step, by the kernel's id: the stages of
# a step share one layer's kernels (`step._Kernels`); the kernel is held so its id stays its own
Timed = dict[int, tuple[Work, float]]


def _kernels(plan: Plan, stage: StageStep, timed: Timed | None = None) -> list[dict[str, float]]:
    """Roofline seconds of every kernel of every phase of a stage, by name."""
    return [_by_name(plan, phase, timed) for phase in stage.phases]


def _by_name(plan: Plan, phase: Phase, timed: Timed | None = None) -> dict[str, float]:
    """Seconds per kernel name; kernels of one name add up (a sweep carries each recompute
    mode's kernels under the same names, all but one of them zeroed). A kernel in `timed`
    (the very object) keeps its time there; new ones are added to it."""
    kernels: dict[str, float] = {}
    reshaped = overlapped_gemms(plan, phase)
    for work in phase.works:
        if work.name in reshaped:
            seconds = work_time(plan, reshaped[work.name](work))
        elif timed is None:
            seconds = work_time(plan, work)
        else:
            known = timed.get(id(work))
            if known is None or known[0] is not work:
                known = timed[id(work)] = (work, work_time(plan, work))
            seconds = known[1]
        kernels[work.name] = kernels.get(work.name, 0.0) + seconds
    return kernels


def overlapped_gemms(plan: Plan, phase: Phase) -> dict[str, Callable[[Work], Work]]:
    """The GEMMs of `phase` that Transformer Engine's comm-GEMM overlap reshapes, by name:
    each kernel as it runs beside its collective (`Move.gemm_splits`, `Move.gemm_sms`).

    Transformer Engine (``transformer_engine/pytorch/module/base.py``, ``initialize_ub``,
    its 2.x default configuration per method) runs a ``ring_exchange`` overlap's GEMM in
    ``num_splits`` = tp chunks, one per step of the ring, and a ``pipeline`` overlap's in
    ``num_splits`` = 4, with ``num_sm`` = 16 SMs given to the reduce-scatter and
    ``set_sm_margin`` on, so the GEMM is launched on the rest
    (``transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp``: ``_math_sms =
    set_sm_margin ? sm_count - num_comm_sm : sm_count``). NeMo's H100 recipes
    (``tp_overlap_configs/userbuffers.py``) keep the pipelined reduce-scatter's margin (8 to
    24 SMs by model; ``overlap.tp_comm_sms`` sets it) and run the backward's ``bulk``
    overlaps without one, as here, where they keep ``overlap.slowdown``; TE 2.x's own
    default would narrow those too, and TE 1.x's ``add_ub`` set no margin at all. A GEMM of F
    FLOPs in c launches ramps as c GEMMs of F/c (`budget.efficiency`, ``Work.launches``); on s
    of S SMs its FLOPs take S/s as long, its tiles spread over fewer SMs in more waves. A
    weight-gradient kernel ("... backward") holds the input-gradient GEMM and the
    weight-gradient GEMM, two launches; only the first is split (Transformer Engine overlaps the
    output-gradient all-gather with the input-gradient GEMM). A sweep's configuration without
    the move (count 0, or one rank) keeps its GEMM whole.
    """
    sms = plan.device.sms
    reshaped: dict[str, Callable[[Work], Work]] = {}
    for move in phase.moves:
        if not move.window or move.window.startswith("@") or not _flag(plan, move.flag):
            continue
        margin = sm_margin(plan, move)
        if margin == 0 and every(move.gemm_splits == 1):
            continue
        on = (move.ranks > 1) & (move.count > 0)
        splits = vwhere(on, move.gemm_splits, 1)
        share = vwhere(on, (sms - margin) / sms, 1.0) if margin else 1.0

        def reshape(
            work: Work, splits: Any = splits, share: Any = share, before: Any = None
        ) -> Work:
            work = work if before is None else before(work)
            half = work.launches / 2 if work.name.endswith(" backward") else 0.0
            launches = (work.launches - half) * splits + half
            return replace(work, launches=launches, sm_share=work.sm_share * share)

        reshaped[move.window] = partial(reshape, before=reshaped.get(move.window))
    return reshaped


def sm_margin(plan: Plan, move: Move) -> int:
    """SMs `move` holds off the GEMM it overlaps (`Move.gemm_sms`), where the device says how
    many it has and leaves some to the GEMM; 0 otherwise (``overlap.slowdown`` applies)."""
    return move.gemm_sms if plan.device.sms > move.gemm_sms else 0


def _windows(
    stage: StageStep, kernels: list[dict[str, float]], microbatches: int
) -> dict[str, float]:
    """Compute seconds of one micro-batch's forward and backward on this stage (the
    windows of the bucketed dp overlaps). The loss and multi-token prediction phases run
    their forward and their backward kernels: only the forward ones are forward (the
    parameters gathered behind the forward are all in use before the output layer's
    backward, an audit); their backward ones come before any layer's gradients, so they
    are no part of the window the gradient reduction hides behind either.

    Also one MoE layer's forward and backward (its attention and its MoE block, one
    instance of each phase), which the other pass's expert all-to-alls hide behind
    (`step._ep_moves`); and one layer's, whichever its feed-forward block, which a
    whole-layer ZeRO-3 unit's gathers and reduce-scatter hide behind (`step._zero3_moves`;
    no stage with such units mixes dense and MoE layers); and the embedding's backward
    without FSDP's gradient passes, which FSDP's first layer's reduce-scatter hides behind
    (`EMBEDDING_BACKWARD_WINDOW`)."""
    forward = backward = 0.0
    layer = {"@forward-layer": 0.0, "@backward-layer": 0.0}
    unit = {"@forward-unit": 0.0, "@backward-unit": 0.0}
    embedding = 0.0
    for phase, seconds in zip(stage.phases, kernels, strict=True):
        if phase.name == "backward.embedding":  # its own kernels, not a unit's passes
            embedding += sum(t for name, t in seconds.items() if name not in GRADIENT_PASSES)
        per_mb = phase.count / microbatches
        if phase.name in FORWARD_PHASES:
            ahead = (t for name, t in seconds.items() if not _backward_kernel(name))
            forward += sum(ahead) * per_mb
        elif phase.name in BACKWARD_PHASES:
            backward += sum(seconds.values()) * per_mb
        window = f"@{pass_of(phase.name)}-layer"  # a training pass's (serving has none)
        block = phase.name.rpartition(".")[2]
        if window in layer and block in ("attention", "moe"):
            layer[window] += sum(seconds.values())
        if window in layer and block in ("attention", "mlp", "moe"):
            unit[f"@{pass_of(phase.name)}-unit"] += sum(seconds.values())
    return {
        "@forward-microbatch": forward,
        "@backward-microbatch": backward,
        **layer,
        **unit,
        EMBEDDING_BACKWARD_WINDOW: embedding,
    }


def _backward_kernel(name: str) -> bool:
    """A kernel of a phase's backward (`flops.backward_of` names them so; the main-gradient
    accumulation or FSDP's gradient passes follow the weight gradients)."""
    return name.endswith(" backward") or name in GRADIENT_PASSES


Pricer = Callable[[Plan, Move], CollectiveCost]

# a window's links others hold: window (`_load_key`) -> link -> (the share of the link the
# collectives hidden inside the window take, the groups they belong to)
Loads = dict[str, dict[str, tuple[Any, frozenset[str]]]]

# the least share of a link left to a collective: a link the others fill leaves it this, so
# that it all but stops there (its pace, `collectives.shared_pace`, is then about 0)
_LEAST_LEFT = 1e-9


def _reach(window: str) -> int:
    """How much of a stage's work a window spans: 0 one kernel of its phase (the window names
    it), 1 the whole phase ("@phase"), 2 a layer's, a unit's or the embedding's passes, 3 a
    micro-batch's pass. A collective shares its links with those hidden in smaller windows
    inside its own (`_link_loads`)."""
    if not window.startswith("@"):
        return 0
    if window == "@phase":
        return 1
    return 3 if window.endswith("-microbatch") else 2


def _load_key(window: str, phase: str, part: str = "") -> str:
    """`Loads`' key: the window a collective of `phase` hides behind and the part of it it
    draws on (`Move.part`): each phase its own, as another part's collectives of that phase
    run beside it."""
    return f"{window} ({phase}) [{part}]"


def _members(window: str, own: str, phase: PhaseTime, move: Move) -> bool:
    """Whether `move`, of `phase`, runs inside one instance of `window` (a window of phase
    `own`): the phases `_windows` adds up for it, and of a micro-batch's forward only the
    kernels of the forward (the loss's backward ones run before the layers' backward, and
    are no part of either window there)."""
    name = phase.name
    if window == "@phase":
        return name == own
    if window == EMBEDDING_BACKWARD_WINDOW:
        return name == "backward.embedding"
    if window == "@forward-microbatch":
        return name in FORWARD_PHASES and not _backward_kernel(move.window)
    if window == "@backward-microbatch":
        return name in BACKWARD_PHASES
    which, _, kind = window[1:].partition("-")
    blocks = ("attention", "moe") if kind == "layer" else ("attention", "mlp", "moe")
    return pass_of(name) == which and name.rpartition(".")[2] in blocks


def _link_loads(
    plan: Plan, phases: Sequence[PhaseTime], windows: dict[str, float], m: int
) -> Loads:
    """Each window a collective hides behind that spans a phase or more, and the share of each
    link the collectives hidden inside it (behind smaller windows: a GEMM's, an attention
    kernel's, a layer's) take over one instance of it: their bandwidth terms while hidden on
    that link over the window's compute, W / (1 − s) beside them (`time_phase`). DESIGN.md
    rule 5: collectives that run at once on one link share it, of several groups or of one
    (FSDP's head gradients beside the layers' reduce-scatters: on one communicator NCCL may
    run them one after the other instead, which leaves the link's work the same). A link
    carries its bandwidth at most, so what the smaller windows' collectives send through it
    during the window is link time the wider one's does not have there (`time_phase`).
    Collectives exposed on the critical path run outside the compute a collective hides
    behind, and are not counted; nor are those of windows as wide as its own (a micro-batch's
    pipeline sends beside its gradient reduction) or wider, but for those of another part of
    its own window in its phase launched before it, which run beside it on their own stream
    (below)."""
    stretch = 1 / (1 - plan.overlap.slowdown)
    wide = {
        _load_key(t.move.window, p.name, t.move.part): (t.move.window, p, t.move.part)
        for p in phases
        for t in p.moves
        if _reach(t.move.window) > 0 and _flag(plan, t.move.flag)
    }
    inside: dict[tuple[str, str], _Held] = {}  # each window's (a whole phase's by its name)
    loads: Loads = {}
    for key, (window, own, part) in wide.items():
        whose = (window, own.name if window == "@phase" else "")
        if whose not in inside:
            inside[whose] = _held_inside(window, own, phases, m)
        held, groups = dict(inside[whose][0]), {k: set(v) for k, v in inside[whose][1].items()}
        # a collective of another part of the same window, launched before, runs beside it
        # on a stream of its own and draws on the link first (FSDP's all-reduce across
        # hybrid copies beside the unit's reduce-scatter: review m555, both hidden whole on
        # one NIC); the one launched first keeps its pace, so that the link's work is
        # counted once (each slowed by the other's hidden time alone counted it twice)
        first = next(
            i
            for i, t in enumerate(own.moves)
            if _load_key(t.move.window, own.name, t.move.part) == key
        )
        for t in own.moves[:first]:
            if t.move.window == window and t.move.part != part:
                _add_held(held, groups, t, 1.0)
        compute = own.compute_s - own.slowdown_s if window == "@phase" else windows[window]
        span = compute * stretch
        shares = {
            link: (vmin(ratio(seconds, span), 1.0), frozenset(groups[link]))
            for link, seconds in held.items()
        }
        if shares:
            loads[key] = shares
    return loads


# link -> link seconds held, and link -> the groups holding them
_Held = tuple[dict[str, Any], dict[str, set[str]]]


def _held_inside(window: str, own: PhaseTime, phases: Sequence[PhaseTime], m: int) -> _Held:
    """The link seconds the collectives hidden inside one instance of `window` (a window of
    phase `own`) hold while hidden (`_link_loads`)."""
    held: dict[str, Any] = {}
    groups: dict[str, set[str]] = {}
    for phase in phases:
        # instances of the phase inside one of the window: a micro-batch's share of its
        # count, or one (a layer's, a unit's, the embedding's or the phase's own)
        weight = phase.count / m if window.endswith("-microbatch") else 1.0
        for t in phase.moves:
            if _reach(t.move.window) >= _reach(window) or not t.move.window:
                continue
            # an expert all-to-all hides behind another micro-batch's layer (`overlap.ep`,
            # combined 1F1B), which the step's last backward and first forward, the windows
            # of the gradient reduction and the parameter gather, pair with none (review
            # m551: they were counted there at their hidden share)
            if window.endswith("-microbatch") and t.move.window.endswith("-layer"):
                continue
            if _members(window, own.name, phase, t.move):
                _add_held(held, groups, t, weight)
    return held, groups


def _add_held(
    held: dict[str, Any], groups: dict[str, set[str]], t: TimedMove, weight: float
) -> None:
    """Add `t`'s link seconds while hidden, `weight` instances of its phase, by link."""
    hidden = ratio(t.time_s - t.exposed_s, t.time_s) * t.move.count * weight
    for link, term in link_terms(t.cost):
        seconds = term * t.chunks * hidden
        if every(seconds == 0):
            continue
        held[link] = held.get(link, 0.0) + seconds
        groups.setdefault(link, set()).add(t.move.group)


def _wide(phase: PhaseTime, loads: Loads) -> bool:
    """Whether a collective of `phase` hides behind a window `loads` names, on a link the
    collectives hidden inside it use (as timed alone)."""
    return any(
        not shares.keys().isdisjoint(s.link.name for s in t.cost.stages)
        for t in phase.moves
        if t.move.window
        and (shares := loads.get(_load_key(t.move.window, phase.name, t.move.part)))
    )


def _sharing(
    plan: Plan, cost: CollectiveCost, shares: dict[str, tuple[Any, frozenset[str]]]
) -> tuple[Any, str]:
    """The pace a collective keeps on the links the ones hidden inside its window share with
    it (`collectives.shared_pace`), and the rule's words for it: which links, whose
    collectives and (one plan) how much of the link they hold."""
    used = {s.link.name for s in cost.stages if not every(s.payload_bytes == 0)}
    mine = {link: shares[link] for link in sorted(used) if link in shares}
    if not mine:
        return 1.0, ""
    left = {link: vmax(1.0 - u, _LEAST_LEFT) for link, (u, _) in mine.items()}
    pace = shared_pace(cost, left)
    if isinstance(pace, float) and pace >= 1.0:  # on links that do not pace it (a ring
        return pace, ""  # across levels paced by its port, beside an inner fabric's load)
    said = []
    for link, (u, groups) in mine.items():
        held = f", which hold {format_share(u)} of it" if isinstance(u, float) else ""
        said.append(f"{link} with the {', '.join(sorted(groups))} collectives hidden there{held}")
    # the time shown is its time alone (review m551: read as how long it ran)
    at = (
        f", so it runs at {format_share(pace)} of its pace alone while hidden (its time is "
        "its time alone)"
        if isinstance(pace, float) and pace >= 0.0005
        else ", so it all but stops while hidden, and runs once they are done"
        if isinstance(pace, float)
        else ""
    )
    return pace, f"shares {'; '.join(said)}{at}"


def time_phase(
    plan: Plan,
    phase: Phase,
    windows: dict[str, float],
    price: Pricer = price_move,
    kernels: dict[str, float] | None = None,
    loads: Loads | None = None,
) -> PhaseTime:
    """One phase's compute and each of its collectives' total and exposed time, by the module's
    rule: exposed = max(floor · T, T − share · W / (1 − s)) inside the window W a move names and
    its overlap flag allows, s the overlap slowdown; a pipelined move's last chunk waits alone;
    moves sharing a window draw one after the other on what it leaves; an interleaved stage's
    gradient and parameter parts hide chunk by chunk (Megatron-LM's per-chunk ``grad_sync_func``
    and ``param_sync_func``: chunk 0's part within its own last step, all parts within the later
    chunks' steps); a hidden move slows the compute beside it by ``overlap.slowdown`` (Lee et
    al., arXiv 2507.03114) or, under comm-GEMM overlap, narrows its GEMM (`sm_margin`)."""
    if kernels is None:
        kernels = _by_name(plan, phase)
    compute = sum(kernels.values())
    timed = []
    # (window, part) -> what the moves before hid in its last chunk's step and in all of it
    used: dict[tuple[str, str], tuple[Any, Any]] = {}
    parts = Counter((m.window, m.part) for m in phase.moves if m.window)
    for move in phase.moves:
        allowed = bool(move.window) and _flag(plan, move.flag)
        # pipelined (overlap on): chunks priced at their own size, n·α and ramp
        chunks = move.chunks if allowed else 1
        one = replace(move, size_bytes=move.size_bytes // chunks) if chunks > 1 else move
        cost = price(plan, one)
        # the cost's own array where it runs whole (a copy of it per move cost a 405B pass
        # 96 arrays of 16,384 layouts: moves priced alike share a cost, `search._Pricer`)
        total = vfloat(cost.time_s) if chunks == 1 else chunks * vfloat(cost.time_s)
        exposed, rule, slowed, pace = total, move.rule, 0.0, 1.0
        if allowed:
            window = kernels.get(move.window, windows.get(move.window, compute))
            # the last chunk waits with nothing beside it; unchunked, `floor` stays exposed
            if chunks > 1:
                least = vfloat(cost.time_s)
            elif move.bucket:  # a bucket of its own: its own n·α, its bytes' share of the rest
                # (one call's n·α where the move runs as several, `Move.calls`)
                latency = vfloat(cost.latency_s)
                own = latency / move.calls
                least = vwhere(move.floor > 0, own + move.floor * (total - latency), 0.0)
            else:
                least = move.floor * total
            # moves sharing a window run one after the other beside it: each hides only
            # behind what the ones before left (ring attention's K/V and dK/dV, EP dispatch
            # and combine); a move of several calls hides each behind its own instance, and
            # one a sweep's configuration lacks (its count zeroed by `when`) hides nothing
            part = (move.window, move.part)
            spent = used.get(part)
            # the compute beside a running collective makes progress at 1 − s of its rate
            # (s `overlap.slowdown`; comm-GEMM overlap narrows its GEMM instead, `sm_margin`),
            # so its W seconds last W / (1 − s) beside it and hide that long a collective:
            # a collective hidden whole for T adds s·T (the slowdown below), and one that
            # outlasts its compute waits T − W / (1 − s), its phase taking T in all (an
            # audit: it waited T − W, and the slowdown added beside it, T + s·W / (1 − s))
            margin, sms = sm_margin(plan, move), plan.device.sms
            stretch = 1.0 if margin else 1 / (1 - plan.overlap.slowdown)
            room = move.share * stretch * window  # one array product where W is one
            # the links it shares with the collectives hidden inside its window, which take
            # their link time there: it runs at its pace on what they leave of each
            # (`_link_loads`), so a second of the window hides `pace` seconds of it alone
            key = _load_key(move.window, phase.name, move.part)
            shares = loads.get(key) if loads else None
            if shares:
                pace, said = _sharing(plan, cost, shares)
                if said:
                    rule = f"{rule}; {said}"
            # an interleaved stage reduces (gathers) model chunk by chunk, each part as its
            # chunk finishes the last micro-batch (Megatron-LM's per-chunk grad_sync_func and
            # param_sync_func), one after the other on one communicator: all of them within
            # the later chunks' p steps each (1/v of the window a step), and chunk 0's part
            # (the share f) whole: its grad_sync_func is called once its last backward, the
            # stage's last, has ended (``backward_step_helper_postprocess``, or with the
            # chunks not yet synchronized after the schedule), and its param_sync_func
            # before its first forward, which waits for all of it (an audit: priced within
            # chunk 0's own last step, 13 ms a step short on Nemotron-4 340B), on the first
            # stage too, whose chunk 0 alone is bucketed: ``start_param_sync`` launches every
            # bucket group at once in the buckets' order, the reverse of the model's
            # (``_ParamAndGradBuffer`` fills them over ``params[::-1]``: "all-gathers happen
            # in reverse order of buckets"), so the embedding's, which the first forward waits
            # for, is the last to arrive on the one communicator (audit m345: priced bucket
            # by bucket behind that forward, 26 ms of it hidden and the step 21 ms short on
            # GPT-3 at v 2). At v = 1 one part and one window, Megatron-LM's buckets launched
            # as the backward fills them. Both bounds draw on pools less what moves before
            # drew.
            v, p = move.rounds, plan.parallel.pp
            if isinstance(v, int) and v == 1:
                last_room, whole_room, f = room, room, 1.0
            else:  # each later chunk's p steps, 1/v of W each; a sweep's v = 1
                # configurations keep the one window
                last_room = vwhere(v > 1, 0.0, room)
                whole_room = vwhere(v > 1, room * (v - 1) * p / v, room)
                f = 1 / v if move.last_part is None else move.last_part
            if spent is not None:
                last_room = vmax(last_room - spent[0], 0.0)
                whole_room = vmax(whole_room - spent[1], 0.0)
            last = vmax(least, total * f - last_room * pace)
            exposed = vmax(last, total - whole_room * pace)
            if parts[part] > 1:  # a move after this one hides in what it leaves
                mask = vmin(move.count, 1) / pace  # the window's seconds its hidden part took
                hidden = total - exposed
                hid = (vmin(total * f - last, hidden) * mask, hidden * mask)
                used[part] = hid if spent is None else (spent[0] + hid[0], spent[1] + hid[1])
            if margin:  # its GEMM runs narrowed instead
                rule = f"{rule}; its GEMM runs on {sms - margin} of {sms} SMs"
            else:
                # its kernels hold the SMs for as long as they run hidden: its hidden time
                # alone over the pace it keeps on a shared link (review m551: its time alone
                # was charged, and sharing a link lowered the slowdown it puts on the compute)
                slowed = plan.overlap.slowdown * (total - exposed) / pace
                # a ring exchange (a pipelined one names its chunks already)
                if isinstance(move.gemm_splits, int) and move.gemm_splits > 1 and chunks == 1:
                    # beside the exchange it names, before what the rule says of it (an
                    # aggregated one's wait: review m371 read "waited for in 4 GEMM chunks")
                    chunked = f"in {move.gemm_splits} GEMM chunks"
                    if "by ring exchange" in rule:
                        rule = rule.replace("by ring exchange", f"by ring exchange {chunked}", 1)
                    else:
                        rule = f"{rule} {chunked}"
            if plan.overlap.slowdown and (isinstance(slowed, np.ndarray) or slowed > 0):
                rule = f"{rule}; slows the compute beside it {plan.overlap.slowdown:.1%}"
        if move.flag:
            rule = f"{rule} [overlap.{move.flag} {'on' if allowed else 'off'}]"
        timed.append(TimedMove(move, cost, total, exposed, rule, slowed, chunks, pace))
    timed = _beside(plan, timed)
    slowdown, comm, exposed = _per_instance(timed)
    return PhaseTime(
        name=phase.name,
        count=phase.count,
        compute_s=compute + slowdown,
        comm_s=comm,
        exposed_s=exposed,
        moves=tuple(timed),
        slowdown_s=slowdown,
    )


def _beside(plan: Plan, timed: list[TimedMove]) -> list[TimedMove]:
    """Each move that runs on a stream of its own beside the next move of its phase of the
    op it names (`Move.beside`) hidden behind that one's time as well: it waits for nothing
    of it and the phase ends with both (FSDP's all-reduce of the first layer's shard across
    hybrid copies, on its all-reduce stream, beside the root unit's reduce-scatter; the
    root's all-reduce, on the same stream, follows both), where its overlap flag allows it
    to hide at all (review m478: under overlap.dp_grads off it was hidden still). A sweep's
    configuration without that move (its count zeroed) hides nothing behind it."""
    out = list(timed)
    for i, t in enumerate(timed):
        if not t.move.beside or not _flag(plan, t.move.flag):
            continue
        after = next((u for u in timed[i + 1 :] if u.move.op == t.move.beside), None)
        if after is None:
            continue
        # less the link time it holds on the links this one uses: the two run at once, and a
        # link carries its bandwidth at most (review m555: both on one NIC, the all-reduce
        # was hidden whole beside a reduce-scatter that filled it)
        mine = {link for link, term in link_terms(t.cost) if not every(term == 0)}
        theirs = [(link, term) for link, term in link_terms(after.cost) if link in mine]
        held: Any = vsum(cast(Any, term) for _, term in theirs)
        room: Any = vmax(cast(Any, after.time_s) - held * after.chunks, 0.0)
        exposed = vmax(cast(Any, t.exposed_s) - room * vmin(after.move.count, 1), 0.0)
        shared = sorted({link for link, term in theirs if not every(term == 0)})
        rule = t.rule
        if shared:  # before its overlap flag's tag, which ends a rule
            said, tag, flag = rule.rpartition(" [overlap.")
            words = (
                f"; shares {', '.join(shared)} with that reduce-scatter, hiding only in the "
                "link time it leaves"
            )
            rule = f"{said}{words}{tag}{flag}" if tag else f"{rule}{words}"
        out[i] = replace(t, exposed_s=exposed, rule=rule)
    return out


def _per_instance(timed: list[TimedMove]) -> tuple[Any, Any, Any]:
    """Compute added, communication time and exposed communication of one instance of a
    phase: each move's figure for one call times its calls, summed in the moves' order
    (`vsum`: the builtin sum's numbers, a sweep's arrays added in place). A sweep's calls
    (an integer array) are cast to float once per move, not by numpy once per product, and
    a move that slows nothing (0.0 beside every configuration) adds no array of zeros."""
    counts = [
        t.move.count.astype(np.float64)
        if isinstance(t.move.count, np.ndarray) and t.move.count.dtype.kind in "iu"
        else t.move.count
        for t in timed
    ]
    pairs = list(zip(timed, counts, strict=True))
    slowed = [
        (t, c)
        for t, c in pairs
        if not (isinstance(c, np.ndarray) and type(t.slowdown_s) is float and t.slowdown_s == 0)
    ]
    return (
        vsum(t.slowdown_s * c for t, c in slowed),
        vsum(t.time_s * c for t, c in pairs),
        vsum(t.exposed_s * c for t, c in pairs),
    )


def _busy(p: PhaseTime) -> float:
    return (p.compute_s + p.exposed_s) * p.count


def serving_time(plan: Plan, step: Step) -> StepTime:
    """Prefill and decode latency: one batch passes the stages one after the other, so a
    pass takes the sum of its stages; decode runs generate - 1 passes. Throughput counts the
    tokens every data-parallel replica produces (prompt tokens for prefill, generated
    tokens for decode); model FLOPs are 2·N per token (Kaplan et al., arXiv 2001.08361,
    Table 1, whose N leaves out the embeddings) plus the attention products against the
    context, the score and the value products, 4·L·h per key (PaLM, arXiv 2204.02311,
    appendix B, a third of its 12·L·h·s, which counts forward and backward; Kaplan's
    2·n_layer·n_ctx·d_attn counts the scores alone), N the
    active non-embedding parameters, and 2·vocab·hidden for the output layer where logits
    are computed: once per sequence in a prefill (the last position, what sampling needs,
    as `inference` prices it), for every decoded token. Keys are counted causally and
    inclusively, a query meeting every key up to its own: in a prefill of P tokens query i
    meets i, (P + 1)/2 on average (the causal half of PaLM's s keys per query, its diagonal
    counted whole); decode's pass k meets P + k. Decode runs G - 1 passes for G
    generated tokens, the first coming from the prefill, and its time per token is theirs."""
    stages = []
    for stage in step.stages:
        kernels = _kernels(plan, stage)
        windows = _windows(stage, kernels, 1)
        phases = tuple(
            time_phase(plan, p, windows, price_move, k)
            for p, k in zip(stage.phases, kernels, strict=True)
        )
        stages.append(StageTime(stage.stage, phases, sum(_busy(p) for p in phases), 0.0))
    b, m = plan.batch, plan.model
    ttft = sum(_busy(p) for s in stages for p in s.phases if pass_of(p.name) == "prefill")
    decode = sum(_busy(p) for s in stages for p in s.phases if pass_of(p.name) == "decode")
    passes = decode_passes(plan)
    per_token = decode / passes if plan.mode == "decode" and passes > 0 else None
    n, logits = 2 * serving_params(plan), 2 * m.vocab * m.hidden
    # the attention products as written, also where decode runs them absorbed
    if per_token is None:
        tokens, total = b.global_batch * b.prompt, ttft
        # query i of a prompt meets keys 1 ... i, itself included (as decode's pass k meets
        # P + k): (P + 1)/2 keys on average
        work = tokens * (n + attention_query_flops(m, 1, b.prompt)) + b.global_batch * logits
        rate = tokens / ttft if ttft else 0.0
    else:
        # the decoded tokens: pass k meets prompt + k keys, k = 1 ... G - 1
        tokens, total = b.global_batch * passes, ttft + decode
        attention = attention_query_flops(m, b.prompt + 1, b.prompt + passes)
        work = tokens * (n + logits + attention)
        rate = b.global_batch / per_token if per_token else 0.0
    peak = cluster_peak(plan)
    busy = decode if per_token is not None else ttft
    mfu = work / (busy * peak) if busy and peak else 0.0
    return StepTime(
        tuple(stages),
        total,
        total,
        0.0,
        rate,
        mfu,
        float(work),
        ttft_s=ttft,
        decode_token_s=per_token,
    )


def step_time(plan: Plan, step: Step, price: Pricer = price_move) -> StepTime:
    """Price every phase of every stage and assemble the step (module docstring).
    `price` prices one move; a sweep passes one that takes arrays of group layouts."""
    if plan.mode != "train":
        return serving_time(plan, step)
    m = step.microbatches
    stages = []
    shared: dict[tuple[Any, ...], StageTime] = {}
    timed: Timed = {}
    for stage in step.stages:
        same = shared.get(stage.timing_key) if stage.timing_key else None
        if same is not None:
            stages.append(replace(same, stage=stage.stage))
            continue
        kernels = _kernels(plan, stage, timed)
        windows = _windows(stage, kernels, m)
        phases = tuple(
            time_phase(plan, p, windows, price, k)
            for p, k in zip(stage.phases, kernels, strict=True)
        )
        # a collective hidden behind a phase or more shares its links with those hidden
        # inside it (`_link_loads`): its phase is timed again with them
        loads = _link_loads(plan, phases, windows, m)
        if loads:
            phases = tuple(
                time_phase(plan, p, windows, price, k, loads) if _wide(t, loads) else t
                for p, k, t in zip(stage.phases, kernels, phases, strict=True)
            )
        per_mb = sum(
            (p.compute_s + p.exposed_s) * p.count / m for p in phases if per_microbatch(p.name)
        )
        after = sum(
            (p.compute_s + p.exposed_s) * p.count for p in phases if not per_microbatch(p.name)
        )
        # a reduction after every backward waits in the micro-batch it follows, and the
        # backward it hides behind runs slowed by it (`time_phase`): both lengthen the
        # micro-batches the fill and drain cross (audit m401: the slowdown stayed past the
        # pipeline, the shipped 128K plan 0.66 s short)
        each = sum(
            (t.exposed_s + t.slowdown_s) * t.move.count * p.count / m
            for p in phases
            if not per_microbatch(p.name)
            for t in p.moves
            if t.move.each_microbatch
        )
        optimizer = sum((p.compute_s + p.exposed_s) * p.count for p in phases if _optimizer(p.name))
        gather = _gather_after_input(plan, phases)
        stages.append(
            StageTime(stage.stage, phases, per_mb, after, each, optimizer, gather_s=gather)
        )
        if stage.timing_key:
            shared[stage.timing_key] = stages[-1]
    v = plan.parallel.pipeline.virtual_stages
    slowest = largest([s.microbatch_s for s in stages])
    copies = [stage.copies for stage in step.stages]
    stages = _with_leads(stages, copies, m, v)
    # a reduction after every backward (ZeRO-2) is counted once a micro-batch in after_s,
    # and the pipeline's fill and drain wait for it on each stage they cross
    waits = [s.microbatch_s + s.each_microbatch_s for s in stages]
    bubble = (sum(w * c for w, c in zip(waits, copies, strict=True)) - largest(waits)) / v
    pipeline = m * slowest + bubble
    one_plan = isinstance(pipeline, float) and len(stages) == plan.parallel.pp  # not a sweep
    if one_plan and plan.parallel.pipeline.schedule != "gpipe" and chunk_times_differ(plan):
        replay = replay_of(plan, stages, m)
        stages = list(replay.stages)  # their leads by their first chunks' backwards
        pipeline = replay.pipeline()
        bubble = pipeline - m * slowest
    total = pipeline + _tail(stages)
    tokens = plan.batch.global_batch * plan.batch.seq
    # an array in a sweep whose layouts' capacity factor keeps different shares
    # (`flops._kept_share`): in floats, as int64 products of this size overflow
    per_token = model_flops_per_token(plan)
    model_flops = (
        float(per_token * tokens) if isinstance(per_token, int) else vfloat(per_token) * tokens
    )
    mfu, rate = step_rates(model_flops, tokens, total, cluster_peak(plan))
    return StepTime(
        stages=tuple(stages),
        time_s=total,
        pipeline_s=pipeline,
        bubble_s=bubble,
        tokens_per_s=rate,
        mfu=mfu,
        model_flops=model_flops,
    )


def cluster_peak(plan: Plan) -> float:
    """The FLOP/s MFU is a share of: the device's peak in the MFU's format (`mfu_format`)
    on every GPU."""
    return plan.device.peak_flops(mfu_format(plan)) * plan.topology.gpus


def step_rates(model_flops: Any, tokens: Any, time_s: Any, peak: Any) -> tuple[Any, Any]:
    """(MFU, tokens/s) of a training step of `time_s` seconds: the model's FLOPs over the
    `peak` FLOP/s of the time, and its tokens over the time. One computation for a report and
    a sweep, so that they agree to the bit (`search._rated`)."""
    return ratio(model_flops, time_s * peak), ratio(tokens, time_s)


@dataclass(frozen=True, slots=True)
class Replay:
    """What a step's pipeline is replayed from in Megatron-LM's order (`pipeline_replay`):
    each stage's forward and backward time of one micro-batch through each of its model
    chunks, a stage's reduction after every backward (ZeRO-2) in its micro-batches'
    backward, where the fill and drain wait for it; the micro-batches; what the reduction
    after the pipeline adds beyond those (`rest`), and what the closed form adds past the
    pipeline (`after`, `_tail`); and the slowest stage's m micro-batches (`floor`). Arrays
    over a sweep's layouts (`take` picks one), or numbers; and the stages it was replayed
    from, with their leads (`_chunk_leads`), which a layout taken alone does not keep."""

    chunks: np.ndarray  # forward and backward by stage and chunk: (2, p, v), or (2, p, v, n)
    microbatches: Any
    rest: Any
    after: Any
    floor: Any
    stages: tuple[StageTime, ...] = ()
    # what a stage's send keeps its receiver waiting past its own op's end, by the sending
    # stage's forward sends, then its backward sends: (2p,), or (2p, n) (`replay_of`)
    delays: np.ndarray | None = None
    # interleaved without overlapped sends: Megatron-LM's order of its batched calls
    # (`late_waits`)
    late: bool = False

    def take(self, i: int) -> Replay:
        """Layout `i`'s numbers, where the fields are arrays over a sweep's layouts."""

        def at(x: Any) -> Any:
            return float(x) if np.ndim(x) == 0 else float(x[i])

        return Replay(
            self.chunks[..., i].copy() if self.chunks.ndim == 4 else self.chunks,
            int(self.microbatches if np.ndim(self.microbatches) == 0 else self.microbatches[i]),
            at(self.rest),
            at(self.after),
            at(self.floor),
            delays=None if self.delays is None else _layout_delays(self.delays, i),
            late=self.late,
        )

    def columns(self, index: np.ndarray) -> Replay:
        """The layouts at `index` of a sweep's replay (its fields arrays over layouts, or
        numbers all share), without the stages it was made from: what `steps` reads."""

        def at(x: Any) -> Any:
            return x[index] if np.ndim(x) else x

        chunks = self.chunks
        if chunks.ndim == 3:  # alike for every layout
            chunks = np.repeat(chunks[..., None], len(index), axis=-1)
        else:
            chunks = chunks[..., index]
        delays = self.delays
        if delays is not None:
            picked = delays.ndim == 2
            delays = delays[:, index] if picked else _delay_columns(delays, chunks, len(index))
        numbers = (at(self.microbatches), at(self.rest), at(self.after), at(self.floor))
        return Replay(chunks, *numbers, delays=delays, late=self.late)

    @staticmethod
    def joined(parts: Sequence[Replay]) -> Replay:
        """The layouts of `parts` (sweeps' replays of one pipeline depth and virtual
        stages, without stages, and one order: `late`) as one replay, in order."""
        if len(parts) == 1:
            return parts[0]
        (late,) = {p.late for p in parts}
        n = [p.chunks.shape[-1] for p in parts]

        def cat(name: str) -> np.ndarray:  # a field of every part, one per layout
            return np.concatenate(
                [np.broadcast_to(getattr(p, name), (k,)) for p, k in zip(parts, n, strict=True)]
            )

        chunks = np.concatenate([p.chunks for p in parts], axis=-1)
        delays = None
        if any(p.delays is not None for p in parts):
            delays = np.concatenate(
                [_delay_columns(p.delays, p.chunks, k) for p, k in zip(parts, n, strict=True)],
                axis=-1,
            )
        numbers = (cat("microbatches"), cat("rest"), cat("after"), cat("floor"))
        return Replay(chunks, *numbers, delays=delays, late=late)

    def pipeline(self) -> float:
        """The pipeline's time to the end of its last stage's reduction after it, less the
        longest such reduction (the closed form's `after`, which `step_time` adds back)."""
        raw = pipeline_replay(
            self.chunks[0], self.chunks[1], self.microbatches, self.delays, self.late
        )
        return float(_floored(raw + self.rest - self.after, self.floor))

    def steps(self) -> np.ndarray:
        """Each layout's replayed step, `pipeline` + `after` (arrays over a sweep's layouts,
        or one number as an array of one), its layouts of one count of micro-batches
        replayed together (`pipeline_replays`)."""
        chunks = self.chunks if self.chunks.ndim == 4 else self.chunks[..., None]
        n = chunks.shape[-1]
        delays = None if self.delays is None else _delay_columns(self.delays, chunks, n)
        numbers = (self.microbatches, self.rest, self.after, self.floor)
        m, rest, after, floor = (np.broadcast_to(x, (n,)) for x in numbers)
        raw = np.empty(n)
        # ascending, as np.unique, which would import numpy.ma (`search._distinct_values`)
        for count in sorted(set(m.tolist())):
            index = np.flatnonzero(m == count)
            raw[index] = pipeline_replays(
                chunks[..., index],
                count,
                None if delays is None else delays[:, index],
                self.late,
            )
        out: np.ndarray = _floored(raw + rest - after, floor) + after
        return out

    def ceiling(self) -> Any:
        """An upper bound on the replayed step (`pipeline` + `after`), without replaying:
        the replay with every forward taking the longest forward of any stage and chunk,
        and every backward the longest backward. A replay only lengthens as an op does (an
        op starts at the latest end of what it waits for), and on alike chunks it is the
        closed form (m·v + p − 1)·(f + b). Loose where chunks differ (a chunk of two layers
        among chunks of one reads about twice the step), it settles the limits a layout is
        far from (`search._breaks`). A send's wait (`delays`) delays an op by at most the
        longest, so each op is bounded as if it took that much longer."""
        _, p, v = self.chunks.shape[:3]
        forward = self.chunks[0].max(axis=(0, 1))
        backward = self.chunks[1].max(axis=(0, 1))
        if self.delays is not None:
            most = self.delays.max(axis=0)
            forward, backward = forward + most, backward + most
        return (self.microbatches * v + p - 1) * (forward + backward) + self.rest

    def bound(self) -> Any:
        """A lower bound on the replayed step (`pipeline` + `after`), without replaying:
        for each stage s, its first op (chunk 0's forward of the first micro-batch) waits
        for that forward on every stage before it, its last (chunk 0's backward of the
        last micro-batch: the interleaved schedule needs m % p == 0) is waited for by that
        backward on every stage before it, and between them it runs m micro-batches
        through all its chunks one op at a time; the largest over the stages. On equal
        stages and chunks it is the closed form (m·v + p − 1)·(f + b), so it is tight where
        the chunks differ little; where they differ it does not see a large chunk pacing
        the stages after it. Below the replay, over samples of the default sweeps' fitting
        uneven layouts: GPT-3 175B on 1,024 GPUs 7.9 % on average and 33 % at most (330
        layouts), Llama 3 405B at 128K on 16,384 GPUs 0.8 % and 18 % (780), Gemma 2 9B on
        64 GPUs 0.8 % and 11 % (330). Arrays over a sweep's layouts, or a number; a sweep
        holds an uneven layout by it until it could be shown (`search._Kept`)."""
        forward, backward = self.chunks[0], self.chunks[1]
        first = forward[:, 0] + backward[:, 0]
        before = np.cumsum(first, axis=0) - first
        work = forward.sum(axis=1) + backward.sum(axis=1)
        return (before + self.microbatches * work).max(axis=0) + self.rest


def _layout_delays(delays: np.ndarray, i: int) -> np.ndarray:
    """Layout `i`'s sends' waits (`Replay.delays`), where they are a sweep's columns."""
    return delays[:, i].copy() if delays.ndim == 2 else delays


def _delay_columns(delays: np.ndarray | None, chunks: np.ndarray, n: int) -> np.ndarray:
    """`Replay.delays` as a column per layout, n of them: none waits where they are not
    given."""
    if delays is None:
        return np.zeros((2 * chunks.shape[1], n))
    return delays if delays.ndim == 2 else np.repeat(delays[:, None], n, axis=-1)


def _floored(pipeline: Any, floor: Any) -> Any:
    """No schedule beats the slowest stage's m micro-batches (`floor`): a replay a rounding
    below them (-1e-14 s) reads as no bubble, not a negative one; a real shortfall is a chunk
    time left out (`_chunk_times`) and stays in sight. Numbers or arrays."""
    return np.where((floor * (1 - 1e-9) <= pipeline) & (pipeline < floor), floor, pipeline)


def replay_of(plan: Plan, stages: list[StageTime], m: Any) -> Replay:
    """The `Replay` of `plan`'s step, its stages timed as `stages` (one per pipeline stage;
    a sweep's numbers as arrays), their leads taken from their first chunks' backwards."""
    forward, backward = _chunk_times(plan, stages, m)
    stages = _chunk_leads(stages, forward, backward)
    for chunks, ids, s in zip(backward, stage_chunk_ids(plan), stages, strict=True):
        # each model chunk's gradients are reduced after its own backward of the micro-batch
        # (Megatron-Core wraps each chunk in a DDP of its own buffers): its share of the
        # stage's reduction, by its layers. Lumped on chunk 0, whose backward ends the
        # micro-batch, equal chunks replayed 3.7 % over the closed form (an audit: Llama 3
        # 70B, interleaved over 5 virtual stages, ZeRO 2), which they must equal.
        layers = sum(len(chunk) for chunk in ids)
        for c, chunk in enumerate(ids):
            chunks[c] += s.each_microbatch_s * len(chunk) / layers
    rest = _tail(stages, m)
    after = _tail(stages)
    floor = m * largest([s.microbatch_s for s in stages])
    waits = [_send_wait(s, "forward") for s in stages] + [_send_wait(s, "backward") for s in stages]
    cells = np.broadcast_arrays(*(t for row in (*forward, *backward) for t in row), *waits)
    p, v = len(forward), len(forward[0])
    times = np.array(cells[: 2 * p * v])
    shaped = times.reshape((2, p, v, *times.shape[1:]))
    delays = np.array(cells[2 * p * v :])
    # none waits where every send is exposed (its sender's op holds it): the plain replay
    kept = delays if delays.any() else None
    # interleaved without overlapped sends, Megatron-LM's batched calls (`late_waits`),
    # whose sends are exposed, so that none waits past its op's end
    late = v > 1 and not plan.overlap.pp and kept is None
    return Replay(shaped, m, rest, after, floor, tuple(stages), delays=kept, late=late)


def _send_wait(stage: StageTime, which: str) -> Any:
    """How long one of `stage`'s stage sends of pass `which` keeps the receiving stage
    waiting past the end of the op that made it: the transfer's time less what of it the
    sender already waits for (its exposed part, in its own op's time). Overlapped (the
    interleaved schedule under `overlap.pp`), a send is posted as its op ends and runs
    beside the sender's next op, but the receiver's next op waits for it to arrive
    (Megatron-Core's ``forward_backward_pipelining_with_interleaving`` waits on
    ``recv_prev_wait_handle`` and ``recv_next_wait_handle`` before each forward and
    backward step); exposed, the sender's op ends with it and the receiver waits no more.
    A review (m354): the replay had let a receiver start as the sender's op ended, 72 ms a
    step short on Nemotron-4 340B at p 8, v 12, where the rounds of p micro-batches leave
    no slack on the edges from the last stage back to the first."""
    phase = next((ph for ph in stage.phases if ph.name == f"pipeline.{which}"), None)
    if phase is None:
        return 0.0
    return sum((t.time_s - t.exposed_s) * t.move.count for t in phase.moves)


def _chunk_leads(
    stages: Sequence[StageTime], forward: list[list[Any]], backward: list[list[Any]]
) -> list[StageTime]:
    """`stages` with their leads and fills (`_with_leads`) from each stage's backward and
    forward through its first model chunk (`_chunk_times`), the ops its last and first are
    (where a stage's chunks differ, its pass over v could read a first chunk of one layer as
    one of two)."""
    return _led(stages, [chunks[0] for chunks in backward], [chunks[0] for chunks in forward])


def pipeline_replay(
    forward: Sequence[Sequence[float]] | np.ndarray,
    backward: Sequence[Sequence[float]] | np.ndarray,
    m: int,
    delays: Sequence[float] | np.ndarray | None = None,
    late: bool = False,
) -> float:
    """The pipeline's makespan, replaying Megatron-LM's order op by op, where stage s runs
    model chunk c of a micro-batch forward in ``forward[s][c]`` seconds and backward in
    ``backward[s][c]`` (exposed communication included); `replay_order` gives the order and
    what each op waits for. Each op starts once the op before it on its stage and the op
    it waits for have ended. For stages and chunks alike this is the closed form
    m·t + (p − 1)·t/v (Narayanan et al., arXiv 2104.04473, section 2.2); where a stage's
    chunks differ it is what the closed form over stage totals misses: a large chunk paces
    every stage that waits on it. A long replay runs fewer micro-batches and adds the
    steady rounds it left out (`shortened_count`, `_extrapolated`): at p 32, v 2 and m
    1,536 a replay of 256 (5.5 ms for the GPT-3 sweep's layout, against 49 ms).

    `delays`: how long each stage's send keeps its receiver waiting past the sending op's
    end (`_send_wait`), the p stages' forward sends then their backward sends; an op waiting
    on another stage's op starts no sooner than that op's end and its send's wait. `late`:
    the interleaved schedule without overlapped sends, whose steady forwards' outputs leave
    after the backward that follows them (`late_waits`; no delays)."""
    p, v = len(forward), len(forward[0])
    times = np.concatenate([np.ravel(forward), np.ravel(backward)]).tolist()
    waits = None if delays is None else [*np.ravel(delays).tolist(), 0.0]
    short = shortened_count(p, v, m)
    if short is not None:
        ends = np.array(_replay_ends(times, p, v, short, waits, late))[:, None]
        (step,) = _extrapolated(ends, p, v, short, m)
        if not np.isnan(step):
            return float(step)
    return max(_replay_ends(times, p, v, m, waits, late))


def _replay_ends(
    times: list[float],
    p: int,
    v: int,
    m: int,
    delays: list[float] | None = None,
    late: bool = False,
) -> list[float]:
    """The end of every op of `pipeline_replay`, by op number (0, the step's start, ends at 0);
    `delays` the sends' waits by `replay_senders`' index (the last, none, 0); `late`, the
    interleaved order without overlapped sends (`late_waits`), which has none."""
    ops, before, waits, runs = (column.tolist() for column in replay_order(p, v, m))
    ends = [0.0] * (len(ops) + 1)
    if late:
        if delays is not None:
            raise ValueError("sends waited for after their op end with it: no delays")
        first, second = (column.tolist() for column in late_waits(p, v, m))
        for op, a, b, c, t in zip(ops, before, first, second, runs, strict=True):
            after, wait, gradient = ends[a], ends[b], ends[c]  # ifs: max() costs a call
            if wait > after:
                after = wait
            ends[op] = (after if after > gradient else gradient) + times[t]
        return ends
    if delays is None:  # every send exposed (`replay_of`): no wait to look up per op
        for op, a, b, t in zip(ops, before, waits, runs, strict=True):
            after, wait = ends[a], ends[b]
            ends[op] = (after if after > wait else wait) + times[t]
        return ends
    senders = replay_senders(p, v, m).tolist()
    for op, a, b, t, s in zip(ops, before, waits, runs, senders, strict=True):
        after, wait = ends[a], ends[b] + delays[s]
        ends[op] = (after if after > wait else wait) + times[t]
    return ends


# how far apart a steady round's shifts may be and still be read as one (`_extrapolated`),
# against the step: rounding, which adds up along the ~2·p·v·m ops of a replay to under
# 1e-13 of the step on the shipped plans' sweeps, where a transient's shifts differ by
# chunk times, a share of the step of 1e-6 and more
STEADY = 1e-11
# model-chunk forwards per stage (m·v) times stages below which a replay is run whole: the
# 2·p·v·m ops of one take under a millisecond, and it ends exactly where the op-by-op oracle
# of the tests does (an extended one, to rounding)
SHORTEN = 1024


def _warmup(p: int, v: int, stage: int, total: int) -> int:
    """Forwards stage `stage` runs before its first backward in `replay_order`, of its
    `total` model-chunk forwards: p − s − 1 with one chunk, else `interleaved_warmup`'s
    (the first stage's the most)."""
    return min(p - stage - 1 if v == 1 else interleaved_warmup(p, v, stage) - 1, total)


def shortened_count(p: int, v: int, m: int) -> int | None:
    """The micro-batch count whose replay `pipeline_replay` extends to m, where that saves
    a round or more: the fewest micro-batches m − j·p (j ≥ 1) whose replay holds, past
    the first stage's warm-up w twice and a round of p·v model-chunk forwards per stage to
    settle in, three rounds of the steady 1F1B alternation and one more before any stage's
    cool-down (`_extrapolated`); None where m has no such count, or the replay is small
    (`SHORTEN`)."""
    rounds = p * v
    warm = _warmup(p, v, 0, m * v)
    needed = -(-(2 * warm + 5 * rounds) // v)  # micro-batches, rounded up
    short = m - (m - needed) // p * p
    return short if m * rounds > SHORTEN and short < m else None


def _extrapolated(ends: np.ndarray, p: int, v: int, short: int, m: int) -> np.ndarray:
    """The replay of m micro-batches from the ends (op number by layout, `_replay_ends`) of
    the replay of `short` (`shortened_count`), or NaN for a layout whose replay is not yet
    steady. Past the warm-up every stage repeats its order every p micro-batches (p·v model
    chunks: `replay_order`, each op waiting on ops at most two rounds back), so once every
    op of two whole rounds ends a constant d after the same op a round earlier, every later
    round does (by induction over the ops, each waiting on ops that did), and m micro-batches
    run the ops of `short` with (m − short)/p more rounds spliced in there: every op after
    them, the last ones too, ends (m − short)/p·d later. A max-plus linear system reaches a
    periodic regime after a transient (the cyclicity theorem: Baccelli et al.,
    *Synchronization and Linearity*, 1992, chapter 3), which may take longer than `short`
    or repeat over more than one round: checked on the numbers here, a layout not yet
    steady is replayed whole."""
    total, rounds = short * v, p * v
    warm = _warmup(p, v, 0, total)
    start = total - warm - 4 * rounds  # the window: three rounds, one before the cool-downs
    ops = ends[1:].reshape(2, p, total, -1)[:, :, start : start + 3 * rounds]
    shifts = (ops[:, :, rounds:] - ops[:, :, : 2 * rounds]).reshape(-1, ends.shape[-1])
    shift = shifts[-1]
    step = ends.max(axis=0)
    steady = (np.abs(shifts - shift) <= STEADY * step).all(axis=0)
    return np.where(steady, step + (m - short) // p * shift, np.nan)


def pipeline_replays(
    chunks: np.ndarray, m: int, delays: np.ndarray | None = None, late: bool = False
) -> np.ndarray:
    """`pipeline_replay` of many layouts at once, bit for bit: chunk times (2, p, v, n) of n
    layouts sharing p, v and m, each shortened as it would be alone where that count is
    steady for it (`shortened_count`). Ops run a level at a time (`replay_levels`), each level's
    ops together for every layout: about 2·m·v + p levels (6,174 at p 16, v 4, m 768,
    which for 64 layouts take 0.14–0.2 s against 2.7–3.2 s one by one). The end of every
    op is held for a batch of layouts at a time, 32 MiB at most. One layout is replayed op
    by op: finding the levels walks every op as its replay does (at p 32, v 2, m 1,536:
    76 ms to find them and 55 ms to run them, against 62 ms op by op), and a search
    replays most of its shown layouts one at a time. `delays`: the sends' waits
    (`pipeline_replay`), (2p, n); `late`, the interleaved order without overlapped sends
    (`late_waits`)."""
    _, p, v, n = chunks.shape
    if n == 1 or n * p < 32:  # a level costs more than the ops it runs: one by one
        return np.array(
            [
                pipeline_replay(
                    chunks[0, ..., i],
                    chunks[1, ..., i],
                    m,
                    None if delays is None else delays[:, i],
                    late,
                )
                for i in range(n)
            ]
        )
    times = chunks.reshape(2 * p * v, n)
    waits = np.zeros((2 * p + 1, n))
    if delays is not None:
        waits[:-1] = delays
    short = shortened_count(p, v, m)
    out = np.full(n, np.nan)
    if short is not None:
        for start, ends in _level_ends(times, p, v, short, waits, late):
            out[start : start + ends.shape[1]] = _extrapolated(ends, p, v, short, m)
    whole = np.flatnonzero(np.isnan(out))  # not shortened, or not yet steady
    # (none: the levels of all m, which take as long to find as a replay, go unmade)
    if whole.size:
        for start, ends in _level_ends(times[:, whole], p, v, m, waits[:, whole], late):
            out[whole[start : start + ends.shape[1]]] = ends.max(axis=0)
    return out


def _level_ends(
    times: np.ndarray, p: int, v: int, m: int, delays: np.ndarray, late: bool = False
) -> Iterator[tuple[int, np.ndarray]]:
    """The end of every op (by op number) of the replays of `times`' layouts (a column
    each), a level at a time (`replay_levels`), as (first layout, ends) for a batch of
    layouts at a time: 32 MiB of ends at most. `delays`: the sends' waits by
    `replay_senders`' index, (2p + 1, n), the last row 0 (all 0 where `late`: the
    interleaved order without overlapped sends, `late_waits`)."""
    levels, ops = replay_levels(p, v, m, late)
    batch = max(1, 2**22 // (ops + 1))
    for start in range(0, times.shape[1], batch):
        run = times[:, start : start + batch]
        wait = delays[:, start : start + batch]
        ends = np.zeros((ops + 1, run.shape[1]))  # by op number; 0 is the step's start
        if late:  # two waits an op, neither delayed (`late_waits`)
            for op, before, waits, index, second in levels:
                waited = np.maximum(ends[before], ends[waits])
                ends[op] = np.maximum(waited, ends[second]) + run[index]
            yield start, ends
            continue
        for op, before, waits, index, sender in levels:
            ends[op] = np.maximum(ends[before], ends[waits] + wait[sender]) + run[index]
        yield start, ends


Level = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@lru_cache(maxsize=64)  # 100k ops take ~6 MB: a GPT-3 sweep's 41 orders, ~60 MB
def replay_levels(p: int, v: int, m: int, late: bool = False) -> tuple[tuple[Level, ...], int]:
    """`replay_order`'s ops by level (an op's level is one more than the highest of what it
    waits for, the step's start being 0), each level as the four columns of its ops (views
    of one sorted copy): no op waits for another of its level, so a level runs at once.
    And the count of ops. A fifth column: whose send each op waits for (`replay_senders`);
    where `late` (`late_waits`), the waits are those of the interleaved order without
    overlapped sends and the fifth column the second op each waits for."""
    ops, before, waits, runs = replay_order(p, v, m)
    if late:
        waits, fifth = late_waits(p, v, m)
    else:
        fifth = replay_senders(p, v, m)
    depth = [0] * (ops.size + 1)
    seconds = fifth.tolist() if late else [0] * ops.size
    for op, a, b, c in zip(ops.tolist(), before.tolist(), waits.tolist(), seconds, strict=True):
        x, y, z = depth[a], depth[b], depth[c]  # ifs: max() costs a call
        if y > x:
            x = y
        depth[op] = (x if x > z else z) + 1
    level = np.array(depth)[ops]
    order = np.argsort(level, kind="stable")
    cuts = [0, *(np.flatnonzero(np.diff(level[order])) + 1).tolist(), ops.size]
    op, prior, awaited, run, other = (x[order] for x in (ops, before, waits, runs, fifth))
    levels = tuple(
        (op[a:b], prior[a:b], awaited[a:b], run[a:b], other[a:b]) for a, b in pairwise(cuts)
    )
    return levels, int(ops.size)


@lru_cache(maxsize=16)
def replay_senders(p: int, v: int, m: int) -> np.ndarray:
    """For each op of `replay_order`, in its order, whose send it waits for, as an index into
    `pipeline_replay`'s delays: s for stage s's forward send, p + s for its backward send,
    2p for none (an op waiting for the step's start, or the last stage's backward for its
    own forward)."""
    ops, _, waits, _ = replay_order(p, v, m)
    total = m * v

    def stage(op: np.ndarray) -> np.ndarray:
        out: np.ndarray = ((op - 1) % (p * total)) // total
        return out

    sender = np.where(waits > p * total, p + stage(waits), stage(waits))
    none = (waits == 0) | (stage(waits) == stage(ops))
    out: np.ndarray = np.where(none, 2 * p, sender)
    return out


@lru_cache(maxsize=16)  # 100k ops (GPT-3 at p 16, v 4, m 768) take 3.2 MB as arrays
def replay_order(p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Megatron-LM's 1F1B order on p stages of v model chunks with m micro-batches
    (``forward_backward_pipelining_without_interleaving`` and ``_with_interleaving``), as
    four arrays in an order where every op comes after the ops it waits for: each op's
    number (1 to 2·p·m·v), the op before it on its stage, the op it waits for on another
    stage (0: the step's start) and its time's index (forward s·v + c, backward
    p·v + s·v + c).

    Stage s runs its warm-up forwards (p − s − 1 with one chunk, `layers.interleaved_warmup`'s
    with v), then one forward and one backward in turn, then the remaining backwards; the
    k-th forward runs chunk (k // p) % v and the k-th backward chunk v − 1 − (k // p) % v,
    of micro-batch (k // pv)·p + k % p. A forward waits for the previous stage's forward of
    the same chunk (stage 0 for the last stage's previous chunk, its (k − p)-th), a backward
    for the next stage's backward (the last stage for stage 0's next chunk, its (k − p)-th;
    the last chunk on the last stage for its own forward). Sorted by place on the stage,
    forwards before backwards and then forwards from the first stage and backwards from
    the last, every op comes after what it waits for (checked here, on the numbers)."""
    total = m * v
    k = np.arange(total)
    stage = np.arange(p)[:, None]
    warm = np.array([[_warmup(p, v, s, total)] for s in range(p)])
    forward = 1 + stage * total + k  # op numbers, stage by stage
    backward = forward + p * total
    chunk = (k // p) % v
    forward_waits = np.zeros((p, total), dtype=np.int64)
    forward_waits[1:] = forward[:-1]
    forward_waits[0] = np.where(chunk > 0, forward[-1] - p, 0)
    backward_waits = np.zeros((p, total), dtype=np.int64)
    backward_waits[:-1] = backward[1:]
    own = (k // (p * v)) * p * v + (v - 1) * p + k % p  # its micro-batch's last forward
    backward_waits[-1] = np.where(chunk == 0, forward[-1, own], backward[0] - p)
    places = np.concatenate(
        [
            np.where(k < warm, k, 2 * k - warm),
            np.where(k < total - warm, warm + 2 * k + 1, total + k),
        ]
    )
    ops = np.concatenate([forward, backward])
    stages = np.concatenate([np.broadcast_to(stage, (p, total))] * 2)
    at = np.zeros((p, 2 * total), dtype=np.int64)
    at[stages, places] = ops
    before = np.where(places > 0, at[stages, np.maximum(places - 1, 0)], 0)
    runs = np.concatenate([stage * v + chunk, p * v + stage * v + (v - 1 - chunk)])
    waits = np.concatenate([forward_waits, backward_waits])
    backs = np.concatenate([np.zeros((p, total), bool), np.ones((p, total), bool)])
    # by place, forwards before backwards, forwards from the first stage and backwards from
    # the last: a stage holds one op at each place, so these keys are distinct and a table
    # of them orders the ops (a lexsort took 30 ms of a replay of 196,608 ops)
    key = (places * 2 + backs) * p + np.where(backs, p - 1 - stages, stages)
    slots = np.full(4 * total * p, -1)
    slots[key.ravel()] = np.arange(key.size)
    order = slots[slots >= 0]
    if order.size != key.size:
        raise RuntimeError(f"no replay order for p {p}, v {v}, m {m}")
    ops, before, waits, runs = (x.ravel()[order] for x in (ops, before, waits, runs))
    rank = np.empty(ops.size + 1, dtype=np.int64)
    rank[0] = -1
    rank[ops] = np.arange(ops.size)
    # the order above never runs an op before what it waits for; kept as a guard
    if (rank[before] >= rank[ops]).any() or (rank[waits] >= rank[ops]).any():
        raise RuntimeError(f"no replay order for p {p}, v {v}, m {m}")
    return ops, before, waits, runs


@lru_cache(maxsize=16)
def late_waits(p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """What each op of `replay_order` waits for on other stages in Megatron-LM's interleaved
    schedule without overlapped sends (``overlap_p2p_comm`` off: the ``else`` branch of
    ``forward_backward_pipelining_with_interleaving``, apex's and Megatron-LM's 2022
    schedule alike where m > p; at m = p those ran every forward first,
    ``all_warmup_microbatches``, where the warm-up counts here are current Megatron-Core's,
    as `replay_order`'s are), as two columns in `replay_order`'s order. Past its warm-up a stage
    runs a forward, then a backward, and only then one batched call
    (``send_forward_backward_recv_forward_backward``) that sends both their outputs and
    receives the next forward's input and the next backward's output gradient, waiting for
    both. So (first column) an op waiting on another stage's forward past that stage's
    warm-up waits for the backward after it, which its output leaves with; and (second) a
    forward past its own warm-up also waits for the gradient of the backward after it, the
    op that backward waits for on another stage (0, the step's start, where it waits on its
    own stage's forward: the last stage's last chunk). Warm-up forwards send as they end
    (``send_forward_recv_forward``), the last of them receiving the first backward's
    gradient with it, and backwards send as they end in every phase, as `replay_order`
    has them. With one chunk (``forward_backward_pipelining_without_interleaving``) every
    output is sent as its op ends, and the order is `replay_order`'s. A review (m379): the
    replay let forwards start on outputs sent a backward earlier, 214 ms (2.5 %) short of
    Megatron's order on Llama 3 70B at p 4, v 2 with 9 to 11 layers a chunk."""
    ops, before, waits, _ = replay_order(p, v, m)
    if v == 1:  # every output sent as its op ends: `replay_order`'s waits, none more
        return waits, np.zeros_like(waits)
    total = m * v
    stage = (ops - 1) % (p * total) // total
    forward = ops <= p * total
    warm = np.array([_warmup(p, v, s, total) for s in range(p)])
    steady = forward & ((ops - 1) % total >= warm[stage])  # a forward a backward follows
    size = ops.size + 1  # by op number, 0 the step's start
    after, by_stage, steady_op, waited = (np.zeros(size, dtype=np.int64) for _ in range(4))
    after[before] = ops  # the op after each on its stage (after[0] is never read)
    by_stage[ops], steady_op[ops], waited[ops] = stage, steady, waits
    late = forward & (waits > 0) & (steady_op[waits] == 1)
    first = np.where(late, after[waits], waits)
    gradient = waited[after[ops]]  # what the backward after each op waits for
    crossing = (gradient > 0) & (by_stage[gradient] != stage)
    second = np.where(steady & crossing, gradient, 0)
    rank = np.empty(size, dtype=np.int64)
    rank[0] = -1
    rank[ops] = np.arange(ops.size)
    if (rank[first] >= rank[ops]).any() or (rank[second] >= rank[ops]).any():
        raise RuntimeError(f"no replay order for p {p}, v {v}, m {m} without overlapped sends")
    return first, second


_LAYER_PHASES = {
    "forward": ("forward.attention", "forward.mlp", "forward.moe"),
    "backward": ("backward.attention", "backward.mlp", "backward.moe"),
}


# one layer's attention, MLP and MoE time of a pass; all its layer phases' time per
# micro-batch; and each other phase of the pass with its time per micro-batch (`_chunk_times`)
_PassTimes = tuple[tuple[Any, Any, Any], Any, list[tuple[str, Any]]]


def _pass_times(stage: StageTime, which: str, names: tuple[str, str, str], m: int) -> _PassTimes:
    """What `_chunk_times` reads of `stage`'s phases of one pass (`which`, its layer phases
    `names`), which its chunks then share out."""
    attention, mlp, moe = names
    phases = [p for p in stage.phases if per_microbatch(p.name) and pass_within(p.name) == which]
    one = {p.name: p.compute_s + p.exposed_s for p in phases}  # one layer's
    layers = sum(one[p.name] * p.count / m for p in phases if p.name in names)
    others = [
        (p.name, (p.compute_s + p.exposed_s) * p.count / m) for p in phases if p.name not in names
    ]
    return (one.get(attention, 0.0), one.get(mlp, 0.0), one.get(moe, 0.0)), layers, others


def _chunk_times(
    plan: Plan, stages: list[StageTime], m: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Each stage's forward and backward time of one micro-batch through each of its model
    chunks: its layer phases by the chunk's dense and MoE layers, the embedding in its first
    chunk, the loss and multi-token prediction in its last chunk's forward (their backward
    with them: the phases do not split it), the rest (stage sends, hand-written transitions)
    spread evenly; they add up to the stage's `microbatch_s`."""
    flags = moe_layers(plan)
    out: dict[str, list[list[float]]] = {"forward": [], "backward": []}
    # a pass's stages of one class share their times (`search._replays`): what of them
    # does not depend on the stage's chunks is read once per class and pass
    passes: dict[tuple[int, str], _PassTimes] = {}
    for stage, chunks in zip(stages, stage_chunk_ids(plan), strict=True):
        for which, names in _LAYER_PHASES.items():
            key = (id(stage), which)
            if key not in passes:
                passes[key] = _pass_times(stage, which, names, m)
            (a, d_mlp, e_moe), layers, others = passes[key]
            times = []
            for chunk in chunks:
                e = sum(flags[i] for i in chunk)
                times.append((len(chunk) - e) * (a + d_mlp) + e * (a + e_moe))
            # the layer phases also count the multi-token prediction modules' layers, which
            # run after the model's last layer, in the last chunk (a fuzzing audit: left out,
            # the replayed step came out shorter than its own compute, its bubble negative)
            times[-1] += vmax(layers - sum(times), 0.0)
            for name, per_mb in others:
                if name.endswith(".embedding"):
                    times[0] += per_mb
                elif name in ("loss", "mtp"):
                    times[-1] += per_mb
                else:
                    times = [t + per_mb / len(times) for t in times]
            out[which].append(times)
    return out["forward"], out["backward"]
