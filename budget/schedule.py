"""Time: collectives priced on the topology, compute by the roofline, overlap, step time.

Every collective of the step gets its total time (T = n·α + Q/B_eff on the links its group
spans, `budget.topology`) and its exposed part: the share the step waits for once the overlap
its dependencies allow is taken (DESIGN.md rule 6). Overlap only happens inside a window
the step derivation names (`step.Move.window`), and only when the plan's `overlap:` flag for
it is on, or always for the overlaps Megatron-LM does by default:

    exposed = max(floor · T, T − share · W)

with W the window's compute time. Compute is the roofline of each kernel
(`max(FLOPs / (peak · e_matmul), bytes / (bandwidth · e_memory))`, Williams et al. 2009).

Step time (Narayanan et al., arXiv 2104.04473, section 2.2): with m micro-batches, p stages
taking t_i per micro-batch (forward + backward + exposed communication) and v virtual
stages, the pipeline takes m·max(t) + (Σt − max(t))/v: for equal stages (m + (p − 1)/v)·t,
the bubble being (p − 1)/v of a micro-batch per stage. Then each stage reduces gradients and
steps its optimizer; the slowest of those ends the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from budget.collectives import CollectiveCost
from budget.flops import Work, model_flops_per_token
from budget.phases import Move, Phase, StageStep, Step
from budget.plan.model import GroupKind, Plan
from budget.topology import group_ranks, group_span, price_group, span_of_ranks

MICROBATCH_PHASES = (
    "forward.embedding",
    "forward.attention",
    "forward.mlp",
    "pipeline.forward",
    "loss",
    "backward.mlp",
    "backward.attention",
    "backward.embedding",
    "pipeline.backward",
)
FORWARD_PHASES = ("forward.embedding", "forward.attention", "forward.mlp", "loss")
BACKWARD_PHASES = ("backward.mlp", "backward.attention", "backward.embedding")


@dataclass(frozen=True, slots=True)
class TimedMove:
    move: Move
    cost: CollectiveCost
    time_s: float  # one call, total
    exposed_s: float  # one call, what the step waits for
    rule: str  # which overlap rule applied


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """One instance of a phase on one stage (multiply by `count` for the step)."""

    name: str
    count: int
    compute_s: float
    comm_s: float
    exposed_s: float
    moves: tuple[TimedMove, ...]


@dataclass(frozen=True, slots=True)
class StageTime:
    stage: int
    phases: tuple[PhaseTime, ...]
    microbatch_s: float  # forward + backward + exposed communication of one micro-batch
    after_s: float  # gradient reduction and optimizer step after the last backward


@dataclass(frozen=True, slots=True)
class StepTime:
    stages: tuple[StageTime, ...]
    time_s: float
    pipeline_s: float
    bubble_s: float
    tokens_per_s: float
    mfu: float
    model_flops: float  # per step, all GPUs


def work_time(plan: Plan, work: Work) -> float:
    """Roofline seconds of one kernel on this device (Williams et al. 2009)."""
    device = plan.device
    peak = device.peak_flops(plan.precision.matmul if work.kind != "elementwise" else "bf16")
    peak = peak or device.peak_flops("bf16")
    compute = work.flops / (peak * device.matmul_efficiency)
    memory = work.bytes / (device.memory_bandwidth * device.memory_efficiency)
    return max(compute, memory) * work.count


def can_time(plan: Plan) -> bool:
    """Timing needs a matmul peak and a memory bandwidth in the device section."""
    device = plan.device
    return bool(device.peak_flops(plan.precision.matmul) and device.memory_bandwidth)


def price_move(plan: Plan, move: Move) -> CollectiveCost:
    """The collective of `move` on the ranks its group holds under `parallel.order`."""
    par, topo = plan.parallel, plan.topology
    if move.group == "pp":
        members = group_ranks("pp", par, topo.gpus)
        pair = (members[0], members[-1]) if "embedding" in move.name else members[:2]
        span = span_of_ranks(pair, topo, "pp")
    else:
        kind: GroupKind | tuple[GroupKind, ...] = move.group
        if move.group == "dp" and par.cp > 1 and move.ranks == par.dp * par.cp:
            kind = ("dp", "cp")
        span = group_span(kind, par, topo)
    return price_group(move.op, move.size_bytes, span, dtype=move.dtype)


def _flag(plan: Plan, flag: str) -> bool:
    return flag == "" or bool(getattr(plan.overlap, flag))


def _windows(plan: Plan, stage: StageStep, microbatches: int) -> dict[str, float]:
    """Compute seconds of each named kernel per phase, and of one micro-batch's forward
    and backward on this stage (for the bucketed dp overlaps)."""
    forward = backward = 0.0
    for phase in stage.phases:
        per_mb = phase.count / microbatches
        seconds = sum(work_time(plan, w) for w in phase.works)
        if phase.name in FORWARD_PHASES:
            forward += seconds * per_mb
        elif phase.name in BACKWARD_PHASES:
            backward += seconds * per_mb
    return {"@forward-microbatch": forward, "@backward-microbatch": backward}


def time_phase(plan: Plan, phase: Phase, windows: dict[str, float]) -> PhaseTime:
    kernels = {w.name: work_time(plan, w) for w in phase.works}
    compute = sum(kernels.values())
    timed = []
    for move in phase.moves:
        cost = price_move(plan, move)
        total = float(cost.time_s)
        exposed, rule = total, move.rule
        allowed = bool(move.window) and _flag(plan, move.flag)
        if allowed:
            window = kernels.get(move.window, windows.get(move.window, compute))
            exposed = max(move.floor * total, total - move.share * window)
        if move.flag:
            rule = f"{rule} [overlap.{move.flag} {'on' if allowed else 'off'}]"
        timed.append(TimedMove(move, cost, total, exposed, rule))
    return PhaseTime(
        name=phase.name,
        count=phase.count,
        compute_s=compute,
        comm_s=sum(t.time_s * t.move.count for t in timed),
        exposed_s=sum(t.exposed_s * t.move.count for t in timed),
        moves=tuple(timed),
    )


def step_time(plan: Plan, step: Step) -> StepTime:
    """Price every phase of every stage and assemble the step (module docstring)."""
    m = step.microbatches
    stages = []
    for stage in step.stages:
        windows = _windows(plan, stage, m)
        phases = tuple(time_phase(plan, p, windows) for p in stage.phases)
        per_mb = sum(
            (p.compute_s + p.exposed_s) * p.count / m for p in phases if p.name in MICROBATCH_PHASES
        )
        after = sum(
            (p.compute_s + p.exposed_s) * p.count for p in phases if p.name not in MICROBATCH_PHASES
        )
        stages.append(StageTime(stage.stage, phases, per_mb, after))
    v = plan.parallel.pipeline.virtual_stages
    slowest = max(s.microbatch_s for s in stages)
    bubble = (sum(s.microbatch_s for s in stages) - slowest) / v
    pipeline = m * slowest + bubble
    total = pipeline + max(s.after_s for s in stages)
    tokens = plan.batch.global_batch * plan.batch.seq
    model_flops = float(model_flops_per_token(plan, step.params_total) * tokens)
    peak = plan.device.peak_flops(plan.precision.matmul) * plan.topology.gpus
    return StepTime(
        stages=tuple(stages),
        time_s=total,
        pipeline_s=pipeline,
        bubble_s=bubble,
        tokens_per_s=tokens / total,
        mfu=model_flops / (total * peak),
        model_flops=model_flops,
    )
