"""plan.yaml → Plan → Step → memory and collectives → Report. No I/O beyond reading the plan."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from budget.collectives import used
from budget.flops import (
    attention_keys,
    backward_keys,
    causal_share,
    deepspeed_buffered,
    fsdp_mixed,
    model_flops_per_token,
    routing_skew,
    unmasked_keys,
)
from budget.layers import active_params, moe_layers, mtp_layers, mtp_total
from budget.memory import Memory, StageMemory, memory
from budget.phases import CATEGORIES, PHASE_ORDER, Alloc, StageStep, Step, pass_of
from budget.plan.model import AttentionPass, AttentionRate, Plan
from budget.report import (
    LAYER_PHASES,
    CollectiveRow,
    Overlapping,
    PhaseRow,
    Report,
    StageRow,
    TimelinePoint,
)
from budget.schedule import (
    PhaseTime,
    StepTime,
    TimedMove,
    can_time,
    mfu_format,
    paced_by,
    step_time,
)
from budget.step import deferred_wgrads, derive


def budget_plan(path: Path) -> Report:
    """Load, validate and budget the plan at `path` (raises BudgetError on bad input)."""
    from budget.plan.load import load_plan

    return build_report(load_plan(path))


def _overlapping(allocs: tuple[Alloc, ...]) -> tuple[Overlapping, ...]:
    return tuple(
        Overlapping(a.name, a.total, a.category, a.count, a.placement) for a in allocs if a.total
    )


def _timeline(stage: StageStep) -> tuple[TimelinePoint, ...]:
    """The stage's live bytes at every instant the step describes, in step order."""
    points = []
    for phase in stage.phases:
        for instant in phase.instants:
            totals: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
            for alloc in instant.live:
                totals[alloc.category] += alloc.total
            points.append(TimelinePoint(phase.name, instant.label, totals, sum(totals.values())))
    return tuple(points)


def _stage_row(mem: StageMemory, capacity: int, stage: StageStep | None = None) -> StageRow:
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
        timeline=_timeline(stage) if stage is not None else (),
    )


def _collective(timed: TimedMove, phase: PhaseTime, timing: bool) -> CollectiveRow:
    move, cost = timed.move, timed.cost
    link = cost.link
    chunks = timed.chunks  # pipelined (`schedule.time_phase`): `cost` is one chunk's
    # a group of one rank moves nothing over no link: no link, α or B (an audit: a
    # hand-written transition on tp 1 read link "" beside NVLink's α and B)
    links = " + ".join(cost.links) or None
    return CollectiveRow(
        name=move.name,
        phase=phase.name,
        op=move.op,
        group=move.group,
        ranks=move.ranks,
        dtype=move.dtype,
        bytes=move.size_bytes,
        sent_bytes=_share(cost.sent_bytes, move.sent_share) * chunks,
        recv_bytes=_share(cost.recv_bytes, move.recv_share) * chunks,
        algorithm=cost.algorithm,
        steps=int(cost.steps) * chunks,
        # a whole number of calls where a move runs on a share of the phase's instances (the
        # loss's re-gathers beside deferred weight gradients: review m369 read 13.000000000000004)
        count=round(move.count * phase.count),
        src=move.src,
        dst=move.dst,
        link=links,
        alpha_s=link.latency if links else None,
        bandwidth_Bps=cost.reached_bandwidth if links else None,
        latency_term_s=float(cost.latency_s) * chunks if timing else None,
        bandwidth_term_s=float(cost.bandwidth_s) * chunks if timing else None,
        time_s=timed.time_s if timing else None,
        exposed_s=timed.exposed_s if timing else None,
        slowdown_s=float(timed.slowdown_s) if timing else None,
        pace=float(timed.pace) if timing else None,
        overlap_rule=timed.rule,
        overlaps_with=move.window or None,
        chunks=chunks,
        levels=tuple(
            {
                "link": stage.link.name,
                "op": stage.op,
                "algorithm": stage.algorithm,
                "ranks": int(stage.ranks),
                "steps": int(stage.steps),
                "sent_bytes": _share(stage.sent_bytes, move.sent_share),
                "recv_bytes": _share(stage.recv_bytes, move.recv_share),
                "alpha_s": stage.link.latency,
                "bandwidth_Bps": float(stage.effective_bandwidth),
                "time_s": float(stage.time_s) if timing else None,
            }
            for stage in cost.stages
            if used(stage)  # not a level the group passes through (`CollectiveCost.links`)
        ),
    )


def _share(priced: Any, share: Any) -> int:
    """Bytes the busiest rank moves one way: the `priced` per-rank bytes, or their share
    where that way carries less (`Move.sent_share`, an all-to-all under routing skew)."""
    return int(priced) if share == 1 else round(int(priced) * float(share))


Rows = dict[tuple[int, str], tuple[CollectiveRow, ...]]


def _stage_collectives(times: StepTime, timing: bool) -> Rows:
    """Each stage's collectives of each of its phases, by (stage, phase name)."""
    return {
        (stage.stage, phase.name): tuple(_collective(t, phase, timing) for t in phase.moves)
        for stage in times.stages
        for phase in stage.phases
    }


def _phase_rows(
    step: Step, mem: Memory, times: StepTime, timing: bool, rows_of: Rows
) -> tuple[PhaseRow, ...]:
    """One row per phase name, in step order, from the stage where it takes longest.

    In training the stages work side by side, so a row is its costliest stage's. A serving
    pass crosses the stages one after another (`schedule.serving_time`), so there a row's
    times and its collectives' calls are summed over the stages (each stage's ranks making
    their own), and its payload and per-call figures stay the costliest stage's; a
    collective some stages run on another link (a stage send within a node and another
    across, `Move.boundary`) has a row for each link, with its own calls and per-call
    figures (a review: seven sends read as seven InfiniBand ones, six of them NVLink's)."""
    serving = times.ttft_s is not None
    names = list(dict.fromkeys(p.name for s in step.stages for p in s.phases))
    # training phases in step order; serving ones prefill first, each in pass order (the
    # sort is stable: the last stage's output stays after the first stage's layers)
    names.sort(
        key=lambda n: (
            (0, PHASE_ORDER.index(n)) if n in PHASE_ORDER else (1, pass_of(n) != "prefill")
        )
    )
    rows = []
    for name in names:
        candidates = []
        for stage in times.stages:
            for phase in stage.phases:
                if phase.name == name:
                    collectives = rows_of[stage.stage, name]
                    payload = sum(c.sent_bytes * c.count for c in collectives)
                    busy = (phase.compute_s + phase.exposed_s) * phase.count
                    candidates.append((busy, payload, -stage.stage, phase, collectives))
        # the stage where the phase takes longest (then sends most): the rows then add up
        # to at least the step's compute and exposed time, which takes the pacing stage's
        # micro-batch phases and the slowest stage's reduction and optimizer
        _, payload, neg_stage, phase, collectives = max(candidates, key=lambda c: c[:3])
        same = [c[3] for c in candidates] if serving else [phase]
        if serving and len(candidates) > 1:
            calls = Counter[tuple[str, str, str, str | None]]()
            shown: dict[tuple[str, str, str, str | None], Any] = {}
            for *_, others in sorted(candidates, key=lambda c: c[:3], reverse=True):
                for c in others:  # the costliest stage's first
                    key = (c.name, c.op, c.group, c.link)
                    calls[key] += c.count
                    shown.setdefault(key, c)
            collectives = tuple(replace(c, count=calls[key]) for key, c in shown.items())

        def total(field: str, same: list[PhaseTime] = same) -> float | None:
            # seconds as floats in JSON, 0.0 where no collective or kernel added to it (an
            # audit: a phase without collectives read comm_s 0, an integer)
            return float(sum(getattr(p, field) * p.count for p in same)) if timing else None

        peaks = [(s.phase_peaks[name], -s.stage) for s in mem.stages if name in s.phase_peaks]
        peak_bytes, peak_stage = 0, None
        overlap: tuple[Overlapping, ...] = ()
        if peaks:
            peak_bytes, neg_peak = max(peaks)
            peak_stage = -neg_peak
            overlap = _phase_overlap(step, peak_stage, name, peak_bytes)
        rows.append(
            PhaseRow(
                name=name,
                count=sum(p.count for p in same),  # serving: over the stages
                stage=-neg_stage,
                payload_bytes=payload,
                peak_bytes=peak_bytes,
                peak_stage=peak_stage,
                peak_overlap=overlap,
                collectives=collectives,
                compute_s=total("compute_s"),
                comm_s=total("comm_s"),
                exposed_s=total("exposed_s"),
                slowdown_s=total("slowdown_s"),
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


def _summary(
    plan: Plan, phases: tuple[PhaseRow, ...], times: StepTime, timing: bool
) -> dict[str, float | None]:
    """The step's figures. Serving: compute, communication and exposure are the sums of the
    rows (each over the stages a pass crosses). Training: those of the phases the step
    waits for (`schedule.paced_by`) with the later stages' parameter gathers in series
    behind the last (exposed), so compute + exposed + bubble − drained − filled is the
    step; the rows, each at its costliest stage, may come from different stages and add up
    to more.

    ``mfu_causal``: the MFU of the attention products the causal mask computes
    (`flops.model_flops_per_token`), beside PaLM's, which counts them unmasked; a serving
    plan's MFU counts them so already."""
    if not timing:
        keys = (
            "time_s",
            "compute_s",
            "comm_s",
            "exposed_comm_s",
            "exposed_share",
            "overlap_slowdown_s",
            "bubble_s",
            "after_s",
            "drained_s",
            "filled_s",
            "fill_gathers_s",
            "ttft_s",
            "decode_token_s",
            "tokens_per_s",
            "mfu",
            "mfu_causal",
            "pacing_stage",
            "after_stage",
            "optimizer_stage",
        )
        return dict.fromkeys(keys)
    pacing: int | None = None
    after_stage: int | None = None
    optimizer_stage: int | None = None
    drained: float | None = None
    filled: float | None = None
    behind = 0.0
    if times.ttft_s is None:
        paced = paced_by(times)
        pacing, after_stage, optimizer_stage = paced.stage, paced.reducing, paced.optimizing
        drained, filled, behind = paced.drained_s, paced.filled_s, paced.behind_s

        def total(field: str) -> float:  # in the order the search sums (`_critical_exposed`)
            parts = (sum(getattr(p, field) * p.count for p in ps) for ps in paced.groups)
            return float(sum(parts))

    else:

        def total(field: str) -> float:
            return float(sum(getattr(p, field) or 0.0 for p in phases))

    exposed = total("exposed_s") + behind
    causal = times.mfu
    if plan.mode == "train" and times.mfu:
        causal *= model_flops_per_token(plan, causal=True) / model_flops_per_token(plan)
    return {
        "time_s": times.time_s,
        "compute_s": total("compute_s"),
        "comm_s": total("comm_s") + behind,  # the gathers behind: all exposed
        "exposed_comm_s": exposed,
        "exposed_share": exposed / times.time_s,
        "overlap_slowdown_s": total("slowdown_s"),
        "bubble_s": times.bubble_s,
        "after_s": times.time_s - times.pipeline_s,
        # the part of the reduction the step ends with that ran while the stages ahead of
        # its own drained the pipeline (`schedule.paced_by`)
        "drained_s": drained,
        # the part of the optimizer step the step ends with that ran while the stages ahead
        # of its own filled the next step's pipeline (`schedule.put_off`)
        "filled_s": filled,
        # the later stages' parameter gathers in series along the fill behind it
        "fill_gathers_s": behind if filled is not None else None,
        "ttft_s": times.ttft_s,
        "decode_token_s": times.decode_token_s,
        "tokens_per_s": times.tokens_per_s,
        "mfu": times.mfu,
        "mfu_causal": causal,
        "pacing_stage": pacing,
        # the stage whose gradient reduction ends latest, then the one whose optimizer step
        # takes longest (`paced_by`)
        "after_stage": after_stage,
        "optimizer_stage": optimizer_stage,
    }


def _held_at(rate: AttentionRate | None, *lengths: int | None) -> int | None:
    """The measured length `rate` is held at for the first of the calls' ``lengths`` (the
    causal calls' keys, the unmasked ones', the backward's) that lies outside the lengths
    measured (`AttentionRate.held_at`); None when every one lies within them."""
    if rate is None:
        return None
    held = (rate.held_at(n) for n in lengths if n is not None)
    return next((n for n in held if n is not None), None)


def build_report(plan: Plan) -> Report:
    """Every number of the report for one resolved plan."""
    step = derive(plan)
    mem = memory(step, plan.device.memory)
    timing = can_time(plan)
    times = step_time(plan, step)
    par, m = plan.parallel, plan.model
    layout = {
        "tp": par.tp,
        "pp": par.pp,
        "dp": par.dp,
        "cp": par.cp,
        "ep": par.ep,
        "etp": par.expert_tp if m.experts is not None else None,
        "sequence_parallel": par.sequence_parallel,
        "zero": par.zero,
        "dp_shard": par.dp_shard,
        "fsdp": par.fsdp if fsdp_mixed(plan) else None,
        "tp_style": par.tp_style if plan.mode == "train" else None,
        "fsdp_unit": par.fsdp_unit if par.zero == 3 else None,
        "reshard_after_forward": par.reshard_after_forward if par.zero == 3 else None,
        "fsdp_root": par.fsdp_root if par.zero == 3 else None,
        "reduce_bucket": par.reduce_bucket if deepspeed_buffered(plan) else None,
        "schedule": par.pipeline.schedule,
        "virtual_stages": par.pipeline.virtual_stages,
        # stage sends split over tp and gathered on arrival (in effect only without SP)
        "scatter_gather": par.pipeline.scatter_gather,
        "recompute": plan.recompute,
        "recompute_early_stop": plan.recompute_early_stop if plan.mode == "train" else None,
        "defer_embedding_wgrad": deferred_wgrads(plan) or None,
        "loss": plan.loss if plan.mode == "train" else None,
        "seq": plan.batch.seq,
        "micro": plan.batch.micro,
        "global": plan.batch.global_batch,
        "sequences": plan.batch.global_batch,
        "prompt": plan.batch.prompt,
        "generate": plan.batch.generate,
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
        "head_dim": m.head_dim,
        # multi-head latent attention ranks and head dimensions, or None
        "mla": None
        if m.mla is None
        else {
            "q_rank": m.mla.q_rank,
            "kv_rank": m.mla.kv_rank,
            "nope_dim": m.mla.nope_dim,
            "rope_dim": m.mla.rope_dim,
            "v_dim": m.head_dim,
        },
        "ffn": m.ffn,
        "vocab": m.vocab,
        # routed experts: how many, how many a token takes and their widths, or None
        "experts": None
        if m.experts is None
        else {
            "count": m.experts.count,
            "top_k": m.experts.top_k,
            "ffn": m.experts.ffn,
            "shared_ffn": m.experts.shared_ffn,
            "moe_layers": sum(moe_layers(plan)),
            "imbalance": float(routing_skew(plan)),
            # a capacity caps the rows an expert takes (None: dropless), and with padding
            # every expert computes all of them (an audit: neither was said anywhere)
            "capacity_factor": m.experts.capacity_factor,
            "pad_to_capacity": m.experts.pad_to_capacity,
        },
        "params_active": active_params(plan),
        # multi-token prediction modules priced (training only) and their parameters, which
        # params_total leaves out
        "mtp_layers": mtp_layers(plan),
        "mtp_params": mtp_total(plan) if mtp_layers(plan) else 0,
        # sliding-window attention: its length and how many layers slide, or None
        "sliding_window": {"size": m.window, "sliding_layers": sum(m.sliding)}
        if m.window
        else None,
    }
    # serving: the prefill's calls, where the kernel's rate matters (decode is memory-bound)
    seq = plan.batch.seq if plan.mode == "train" else plan.batch.prompt
    keys, unmasked = int(attention_keys(plan, seq)), int(unmasked_keys(plan, seq))
    gathered = backward_keys(plan, seq) if plan.mode == "train" else None
    backward = None if gathered is None else int(gathered)
    # a serving plan's calls that matter are its prefill's, forward only
    part: AttentionPass | None = None if plan.mode == "train" else "forward"
    causal = float(causal_share(plan))
    source = plan.device.attention_source(m.attention)
    measured = source in ("measured", "derived")
    # sliding layers' calls on fewer keys than the others': their own rate (None: no window
    # shorter than the calls, or eager attention)
    windowed = m.attention != "eager" and 0 < m.window < keys
    rate = plan.device.attention_rate(m.attention) if measured else None
    device = {
        "name": plan.device.name,
        # the keys the plan writes over its preset's figures (`catalog.device_overrides`)
        "overrides": list(device_preset_overrides(plan)),
        "memory_bytes": plan.device.memory,
        "reserved_bytes": plan.device.reserved,
        # the dense peaks MFU and the GEMMs are read against, by format, and the memory
        # bandwidth streaming kernels are (a user audit, m434: an override of either moved
        # the step, and the report named neither)
        "flops": dict(plan.device.flops),
        "memory_bandwidth_Bps": plan.device.memory_bandwidth,
        # the fused-attention kernel and the fraction of peak it is timed at (None: eager, or
        # no measurement on this device, so the GEMM curve)
        "attention": m.attention,
        "attention_kernel": plan.device.attention_kernel(m.attention),
        # where the rate comes from: measured (the preset's, read at attention_keys), derived
        # (likewise, computed from another kernel's), plan (attention_efficiency), gemm (no
        # measurement: the GEMM curve) or eager
        "attention_rate": source,
        # keys each query meets in one kernel call, the length a preset's rate is read at
        "attention_keys": keys if measured else None,
        # share of those calls' work under the causal mask, the rest unmasked (context
        # parallelism: `budget.flops.causal_share`); null where no measurement is read
        "attention_causal": causal if measured else None,
        # keys each unmasked call loops over (a ring's, `budget.flops.unmasked_keys`); null
        # without an unmasked share or where no measurement is read
        "attention_unmasked_keys": unmasked if measured and causal < 1 else None,
        # keys the backward's calls loop over where not the forward's (all-gather context
        # parallelism's chunk, `budget.flops.backward_keys`); null otherwise
        "attention_backward_keys": backward if measured else None,
        # one call's forward and backward together (a serving plan: its prefill's forward)
        "attention_fraction": plan.device.attention_fraction(
            m.attention, keys, causal, unmasked, part, backward
        )
        if m.attention != "eager"
        else None,
        # the measured length the rate is held at when the calls' keys fall outside the
        # lengths measured (the A100's one length, 8,192, stands for every length), or None
        "attention_held_at": _held_at(rate, keys, unmasked if causal < 1 else None, backward),
        # the head dimension the rate was measured at (None: not stated, or no measurement
        # read), which the model's own may differ from (an audit, m536)
        "attention_head_dim": rate.head_dim if rate is not None else None,
        # the sliding layers' keys per call and fraction of peak, and the measured length
        # that rate is held at when the window is shorter than any measured (gpt-oss's 128
        # keys against the H100's shortest, 512); None without such layers
        "attention_window_keys": m.window if windowed else None,
        "attention_window_fraction": plan.device.attention_fraction(
            m.attention, m.window, part=part
        )
        if windowed
        else None,
        "attention_window_held_at": rate.held_at(m.window) if windowed and rate else None,
        # what every kernel takes beyond its bytes at the streaming bandwidth
        "kernel_startup_s": plan.device.kernel_startup,
        # streaming multiprocessors, which overlap.tp's pipelined reduce-scatter narrows its
        # GEMM by; 0: not given
        "sms": plan.device.sms,
        # whether the device's FP8 GEMMs take K-major operands only, so FP8 training keeps a
        # transpose of each FP8 copy (Hopper); the plan may write it (a catalogue audit,
        # m513: named among the overrides, its value said nowhere)
        "fp8_transpose": plan.device.fp8_transpose,
        # the roofline's derates (DESIGN.md rule 9 times these; an audit: a written device's
        # 0.8 went unsaid): the share of the peak the largest GEMMs reach in the format they
        # run in (a preset's measured curve, which smaller GEMMs fall below, fp8's 68.4 % on
        # an H100 where bf16's is 74.1 %; or a written device's flat matmul_efficiency), and
        # of the memory bandwidth streaming kernels reach
        "matmul_ceiling": plan.device.gemm.for_dtype(plan.precision.matmul).peak_fraction
        if plan.device.gemm is not None
        else plan.device.matmul_efficiency,
        "matmul_by_size": plan.device.gemm is not None,
        "memory_efficiency": plan.device.memory_efficiency,
    }
    rows_of = _stage_collectives(times, timing)
    phases = _phase_rows(step, mem, times, timing, rows_of)
    peak_format = mfu_format(plan)  # the format whose dense peak MFU is a share of
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
        stages=tuple(
            replace(
                _stage_row(s, plan.device.memory, st),
                mtp_layers=mtp_layers(plan) if s.stage == plan.parallel.pp - 1 else 0,
            )
            for s, st in zip(mem.stages, step.stages, strict=True)
        ),
        phases=phases,
        step=_summary(plan, phases, times, timing),
        # training: each stage's per-layer collectives, which its phase rows (each from the
        # stage where the phase costs most) may mix with other stages' (`slow_link_notes`)
        layer_collectives=()
        if plan.mode != "train"
        else tuple(
            (stage, c)
            for (stage, name), rows in rows_of.items()
            if name.rpartition(".")[2] in LAYER_PHASES
            for c in rows
        ),
        send_collectives=()
        if plan.mode != "train"
        else tuple(
            c for (_, name), rows in rows_of.items() if name.startswith("pipeline.") for c in rows
        ),
        mfu_format=peak_format,
        mfu_peak=plan.device.peak_flops(peak_format),
        matmul_format=plan.precision.matmul,
        topology_name=plan.topology.name or None,
        topology_overrides=topology_preset_overrides(plan),
        links=tuple(
            {
                "name": lv.name,
                "size": lv.size,
                "bandwidth_Bps": lv.bandwidth / lv.shared_by,
                "latency_s": lv.latency,
                "shared_by": lv.shared_by,
                "ramp": None if lv.ramp is None else lv.ramp.to_json(),
            }
            for lv in plan.topology.levels
        ),
    )


def device_preset_overrides(plan: Plan) -> tuple[str, ...]:
    """`catalog.device_overrides`, the catalogue read only for a preset (a device written
    out imports none of it)."""
    if not plan.device.name:
        return ()
    from budget.catalog import device_overrides

    return device_overrides(plan.device)


def topology_preset_overrides(plan: Plan) -> tuple[str, ...]:
    """`catalog.topology_overrides`, the catalogue read only for a preset."""
    if not plan.topology.name:
        return ()
    from budget.catalog import topology_overrides

    return topology_overrides(plan.topology)
