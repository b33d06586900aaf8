"""plan.yaml → Plan → Step → memory and collectives → Report. No I/O beyond reading the plan."""

from __future__ import annotations

from pathlib import Path

from budget.memory import Memory, StageMemory, memory
from budget.plan.model import Plan
from budget.report import CollectiveRow, Overlapping, PhaseRow, Report, StageRow
from budget.step import Alloc, Move, Phase, Step, derive


PHASE_ORDER = (
    "forward.embedding",
    "forward.attention",
    "forward.mlp",
    "pipeline.forward",
    "loss",
    "backward.mlp",
    "backward.attention",
    "backward.embedding",
    "pipeline.backward",
    "dp.grads",
    "embedding.grads",
    "optimizer",
)


def budget_plan(path: Path) -> Report:
    """Load, validate and budget the plan at `path` (raises BudgetError on bad input)."""
    from budget.plan.load import load_plan

    return build_report(load_plan(path))


def ring_bytes(op: str, ranks: int, size: int) -> tuple[int, int, int]:
    """(steps, sent, received) per rank for the default ring algorithm (DESIGN.md rule 3).

    Ring all-gather / reduce-scatter: P - 1 steps of S/P; all-reduce: 2(P - 1) steps;
    all-to-all (pairwise): P - 1 steps of S/P² each; send/recv: one step of S. Chunks are
    rounded up to whole bytes. Source: Thakur, Rabenseifner & Gropp (2005), section 4.
    """
    p = ranks
    chunk = -(-size // p)
    if op in ("all-gather", "reduce-scatter"):
        return p - 1, (p - 1) * chunk, (p - 1) * chunk
    if op == "all-reduce":
        return 2 * (p - 1), 2 * (p - 1) * chunk, 2 * (p - 1) * chunk
    if op == "all-to-all":
        piece = -(-size // (p * p))
        return p - 1, (p - 1) * piece, (p - 1) * piece
    if op == "broadcast":
        return p - 1, chunk * (p - 1), chunk * (p - 1)
    return 1, size, size


def _overlapping(allocs: tuple[Alloc, ...]) -> tuple[Overlapping, ...]:
    return tuple(
        Overlapping(a.name, a.total, a.category, a.count, a.placement) for a in allocs if a.total
    )


def _stage_row(mem: StageMemory, capacity: int) -> StageRow:
    c = mem.by_category
    return StageRow(
        stage=mem.stage,
        layers=mem.layers,
        inflight=mem.inflight,
        params_bytes=c["params"],
        grads_bytes=c["grads"],
        optimizer_bytes=c["optimizer"],
        activations_bytes=c["activations"],
        transient_bytes=c["transient"],
        kv_cache_bytes=c["kv_cache"],
        reserved_bytes=c["reserved"],
        peak_bytes=mem.peak_bytes,
        peak_phase=mem.peak_phase,
        peak_instant=mem.peak_instant,
        peak_overlap=_overlapping(mem.peak_overlap),
        capacity_bytes=capacity,
    )


def _collective(move: Move, phase: Phase) -> CollectiveRow:
    steps, sent, recv = ring_bytes(move.op, move.ranks, move.size_bytes)
    return CollectiveRow(
        name=move.name,
        phase=phase.name,
        op=move.op,
        group=move.group,
        ranks=move.ranks,
        dtype=move.dtype,
        bytes=move.size_bytes,
        sent_bytes=sent,
        recv_bytes=recv,
        algorithm="ring" if move.op != "send-recv" else "direct",
        steps=steps,
        count=move.count * phase.count,
        src=move.src,
        dst=move.dst,
    )


def _payload(rows: tuple[CollectiveRow, ...]) -> int:
    return sum(r.sent_bytes * r.count for r in rows)


def _phase_rows(step: Step, mem: Memory) -> tuple[PhaseRow, ...]:
    """One row per phase name, in step order; collectives from the busiest stage."""
    names: list[str] = []
    for stage in step.stages:
        for phase in stage.phases:
            if phase.name not in names:
                names.append(phase.name)
    names.sort(key=lambda n: PHASE_ORDER.index(n) if n in PHASE_ORDER else len(PHASE_ORDER))
    rows = []
    for name in names:
        candidates = []
        for stage in step.stages:
            for phase in stage.phases:
                if phase.name == name:
                    collectives = tuple(_collective(m, phase) for m in phase.moves)
                    candidates.append(
                        (_payload(collectives), phase.count, stage.stage, phase, collectives)
                    )
        payload, _, stage_index, phase, collectives = max(
            candidates, key=lambda c: (c[0], c[1], -c[2])
        )
        peaks = [(s.phase_peaks[name], s.stage, s) for s in mem.stages if name in s.phase_peaks]
        peak_bytes, peak_stage, overlap = 0, None, ()
        if peaks:
            peak_bytes, peak_stage, stage_mem = max(peaks, key=lambda p: (p[0], -p[1]))
            overlap = _phase_overlap(step, stage_mem.stage, name, peak_bytes)
        rows.append(
            PhaseRow(
                name=name,
                count=phase.count,
                stage=stage_index,
                payload_bytes=payload,
                peak_bytes=peak_bytes,
                peak_stage=peak_stage,
                peak_overlap=overlap,
                collectives=collectives,
            )
        )
    return tuple(rows)


def _phase_overlap(step: Step, stage: int, name: str, total: int) -> tuple[Overlapping, ...]:
    for phase in step.stages[stage].phases:
        if phase.name == name:
            for instant in phase.instants:
                if instant.total == total:
                    return _overlapping(tuple(sorted(instant.live, key=lambda a: -a.total)))
    return ()


def build_report(plan: Plan) -> Report:
    """Every number of the report for one resolved plan."""
    step = derive(plan)
    mem = memory(step, plan.device.memory)
    par, m = plan.parallel, plan.model
    layout = {
        "tp": par.tp,
        "pp": par.pp,
        "dp": par.dp,
        "cp": par.cp,
        "ep": par.ep,
        "sequence_parallel": par.sequence_parallel,
        "zero": par.zero,
        "schedule": par.pipeline.schedule,
        "virtual_stages": par.pipeline.virtual_stages,
        "recompute": plan.recompute,
        "order": list(par.order),
    }
    model = {
        "name": m.name or plan.name,
        "params_total": step.params_total,
        "params_per_layer": step.params_per_layer,
        "stage_params": [s.params for s in step.stages],
        "layers": m.layers,
        "hidden": m.hidden,
        "heads": m.heads,
        "kv_heads": m.kv_heads,
        "ffn": m.ffn,
        "vocab": m.vocab,
    }
    device = {
        "name": plan.device.name,
        "memory_bytes": plan.device.memory,
        "reserved_bytes": plan.device.reserved,
    }
    return Report(
        name=plan.name,
        file=plan.file,
        mode=plan.mode,
        world_size=plan.topology.gpus,
        layout=layout,
        model=model,
        device=device,
        microbatches=step.microbatches,
        capacity_bytes=plan.device.memory,
        stages=tuple(_stage_row(s, plan.device.memory) for s in mem.stages),
        phases=_phase_rows(step, mem),
        step={
            "time_s": None,
            "compute_s": None,
            "comm_s": None,
            "exposed_comm_s": None,
            "bubble_s": None,
            "tokens_per_s": None,
            "mfu": None,
        },
    )
