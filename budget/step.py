"""Derive one training step as phases: tensors with placements, lifetimes and transitions.

This is the ONE representation the calculators read. The built-in transformer step and the
plan's hand-written `transitions:` both become `Move`s (a layout transition on a group) and
`Alloc`s (bytes alive at an instant), so both are priced and counted by the same code.

Memory at an instant is the sum of what is alive then (DESIGN.md rule 2). For each pipeline
stage the step is described by a few representative instants, one or more per phase, chosen
where that phase's live set is largest: e.g. the last forward layer of the last micro-batch
that a stage admits before its first backward, or the first backward layer, when every
micro-batch in flight is still saved. Each instant lists every allocation alive at it, so a
peak names what overlaps there.

Sources for what is saved: Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (arXiv 2205.05198), section 4 and Table 2; Megatron-LM's transformer
layer (tensor and sequence parallel linear layers, vocab-parallel embedding and
cross-entropy). Micro-batches in flight: Narayanan et al. (arXiv 2104.04473) section 2.2 and
Megatron-LM's `schedules.py` warm-up counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any, Literal

import numpy as np

from budget import flops
from budget.errors import BudgetError
from budget.flops import Work, deepspeed_buffered, te_fp8
from budget.layers import (
    ATTENTION_NORM_INPUT,
    FC2_INPUT,
    LATE,
    MLA_LATENTS,
    PROJECTION_INPUT,
    QKV_HELD_BY_V,
    QKV_OUTPUTS,
    SCORES_BUFFER,
    Shapes,
    StageClass,
    StageParams,
    activation_input,
    attention_params,
    attention_saved,
    class_params,
    column_input,
    core_attention,
    eager_scores,
    ep_alone,
    expert_data_parallel,
    experts_inside_tp,
    final_norm_params,
    fp8_block_weights,
    fp8_weight_copies,
    gemm_weights,
    interleaved_warmup,
    layer_params,
    layer_saved,
    loss_rows,
    mlp_saved,
    moe_layers,
    moe_saved,
    mtp_layers,
    mtp_params,
    params_total,
    post_norm_input,
    qk_norm_params,
    residual_placement,
    saved_gemm_input,
    sequence_parallel_params,
    shapes,
    stage_classes,
    stage_fp8_weights,
    stage_states,
    tokens_replicated,
    userbuffered,
    vocab_params,
    vocab_rows,
)
from budget.phases import (
    CARRIED_ACTIVATIONS,
    EMBEDDING_BACKWARD_WINDOW,
    HAND_WRITTEN,
    HELD_THROUGH,
    Alloc,
    Instant,
    Move,
    MoveGroup,
    Phase,
    StageStep,
    Step,
    hide,
    masking,
    pass_within,
    when,
)
from budget.placement import (
    PARTIAL,
    REPLICATE,
    Op,
    Placement,
    shard,
)
from budget.plan.model import DTYPE_BYTES, RING_EXCHANGES, Plan, Transition
from budget.plan.transitions import (
    WHOLE_PASSES,
    check_chains,
    no_stage_to_send_to,
    unknown_phase,
)
from budget.plan.transitions import problem as transition_problem
from budget.report import LAYER_PHASES
from budget.vector import (
    count_label,
    every,
    holds,
    lacks,
    largest,
    uniform,
    vceil,
    vfloat,
    vmax,
    vmin,
    vround,
    vwhere,
)


def inflight(plan: Plan, stage: int, microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at once, counted in whole-stage units.

    1F1B (PipeDream-Flush): stage i runs p - i warm-up forwards before its first backward,
    so it holds min(p - i, m) micro-batches. GPipe holds all m. Interleaved 1F1B with v
    chunks: Megatron-LM warms up (p - i - 1)·2 + (v - 1)·p chunks and holds one more, each
    chunk 1/v of the stage's layers; on stage 0 that is p·(1 + (p - 1)/(p·v)) stage units
    (Korthikanti section 4.2.3). Where a stage's chunks differ, `layers.flight_layers`
    replays the order instead (`_StageBuilder.in_flight`).
    """
    p, v = plan.parallel.pp, plan.parallel.pipeline.virtual_stages
    schedule = plan.parallel.pipeline.schedule
    chunks = vmin(interleaved_warmup(p, v, stage), microbatches * v)
    one_f_one_b = vfloat(vmin(p - stage, microbatches))
    interleaved = vwhere(holds(schedule == "interleaved"), chunks / v, one_f_one_b)
    return vwhere(holds(schedule == "gpipe"), vfloat(microbatches), interleaved)


# --------------------------------------------------------------------------------------------
# Transitions


RS_SPLITS = 4  # Transformer Engine's pipelined GEMM + reduce-scatter overlap (`_tp_moves`)
# The GEMMs Transformer Engine's userbuffers overlap runs beside their collective, reshaping
# them (`schedule.overlapped_gemms`): Megatron-LM's TE linears with the buffer names qkv,
# proj, fc1 and fc2; ``TELinear`` turns tp_comm_overlap off for any other name (latent
# attention's up-projections, the MTP projection), and the output layer is core
# ``ColumnParallelLinear``, with no userbuffers. Other overlapped GEMMs keep their shape.
USERBUFFER_GEMMS = ("QKV projection", "attention output projection", "MLP fc1", "MLP fc2")
# Transformer Engine's ring-exchange overlaps (its userbuffers names) and the GEMM beside each
RING_GEMMS = dict(
    zip(
        RING_EXCHANGES,
        ("QKV projection", "MLP fc1", "attention output projection backward", "MLP fc2 backward"),
        strict=True,
    )
)


def ring_splits(plan: Plan, gemm: str) -> Any:
    """The chunks a ring exchange runs the GEMM `gemm` in beside it: one a step of the ring,
    tp, or with its userbuffers configuration's ``aggregate`` (`Overlap.tp_comm_aggregate`)
    tp / 2 of two chunks each (Transformer Engine's ``CommOverlapP2PBase::split_overlap_ag``:
    "Aggregate 2X GEMM chunks", ``num_steps = tp_size / 2``), at least one."""
    tp = plan.parallel.tp
    return vmax(tp // 2, 1) if aggregated(plan, gemm) else tp


def aggregated(plan: Plan, gemm: str) -> bool:
    """Whether the ring exchange beside `gemm` aggregates its chunks two by two
    (`Overlap.tp_comm_aggregate`). Transformer Engine's aggregated exchange first swaps one
    chunk with a neighbour and waits for it (``split_overlap_ag``: "Initial 1X input chunk
    exchange between neighboring peers", then the compute stream waits on the receive), so
    its first GEMM, of two chunks, starts only once 1 / (tp - 1) of the all-gather has
    arrived, and the other transfers run beside the first tp / 2 - 1 of its tp / 2 GEMMs:
    exposed max(T / (tp - 1), T - (tp - 2) / tp · W), every byte at tp = 2; without it the
    first GEMM runs on the chunk the rank holds and waits for nothing."""
    return any(RING_GEMMS[name] == gemm for name in plan.overlap.tp_comm_aggregate)


def _tp_moves(
    plan: Plan,
    s: Shapes,
    block: str,
    backward: bool,
    column: str,
    row: str = "",
    inward: tuple[str, Any, Any] | None = None,
    engine: bool = True,
    comm_gemm: bool = True,
) -> list[Move]:
    """Tensor-parallel transitions around one attention or MLP block.

    Megatron-LM (Shoeybi et al. section 3, Korthikanti section 4.2.2): without sequence
    parallelism the forward all-reduces the row-parallel output (g) and the backward
    all-reduces the column-parallel input gradient (f). With it, the forward all-gathers the
    sharded input (g) and reduce-scatters the output (ḡ); the backward all-gathers the output
    gradient, reduces-scatters the input gradient and all-gathers the saved input shard again
    for the weight gradient.

    Overlap (Megatron-LM defaults): forward collectives sit between GEMMs that need their
    result, so they are exposed unless `overlap.tp` (comm-GEMM overlap, Wang et al., arXiv
    2105.05720) splits them into chunks hidden behind the adjacent GEMM. Transformer Engine,
    which runs Megatron-LM's ``--tp-comm-overlap`` (only with sequence parallelism, which
    Megatron-LM asserts: without it the forward all-reduce stays exposed), overlaps the
    column-parallel input's all-gather by ring exchange (each step's GEMM runs on the chunk
    already held while the next arrives: exposed only where the GEMM is shorter) and the
    row-parallel output's reduce-scatter by pipelining: the GEMM in `RS_SPLITS` chunks, each
    chunk's reduce-scatter, a collective of its own with its own n·α, behind the next
    chunk's GEMM, so the first GEMM chunk hides nothing and the last reduce-scatter waits
    with nothing beside it: exposed max(α + B/`RS_SPLITS`, `RS_SPLITS`·α + B − 3/4 of the
    GEMM), for a reduce-scatter of latency term α and bandwidth term B (``initialize_ub``
    in transformer_engine/pytorch/module/base.py: methods ``ring_exchange`` for qkv_fprop
    and fc1_fprop, ``pipeline`` with ``num_splits`` 4 for proj_fprop and fc2_fprop; NeMo's
    H100 recipes keep both, ``PipelineOverlapCfg`` with ``num_splits=4`` in
    nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py). In backward the
    column-parallel layer's input-gradient reduction runs while its weight-gradient GEMM
    computes, and the re-gather of its input while the input-gradient GEMM computes (half of
    the layer's backward GEMM time each); the output-gradient gather is needed first and
    stays exposed unless `overlap.tp`.

    `inward` (name, columns, columns the weight gradients read) replaces the hidden state on
    the column-parallel side when the column-parallel layers read something else: latent
    attention's up-projections read the latents, gathered with the rotary key, which only
    the forward reads (`_attention_inward`).

    Under FP8 training Transformer Engine gathers the column-parallel input in FP8, forward
    and again for the weight gradient (``layernorm_linear.py``: the norm writes FP8 and
    ``gather_along_first_dim(ln_out, tp_group, quantizer=...)``, TransformerEngine 2.5),
    and the row-parallel layer's output gradient in the backward (``grad_output_preprocess``
    quantizes it first): those all-gathers move 1 B an element; the reduce-scatters and
    all-reduces of gradients stay 16-bit. Not where the layer is not a Transformer Engine
    module (`engine` false: Megatron-Core's output layer).

    `row` empty: the column-parallel layer alone, whose forward output stays split over tp
    (an output layer's, a projection whose output is gathered apart, an MLP whose recompute
    stops before fc2): no output collective.

    `comm_gemm` false: a layer that comm-GEMM overlap never reaches, whose forward gather
    stays exposed whatever `overlap.tp` says: Megatron-Core's output layer, a
    ``tensor_parallel.ColumnParallelLinear`` whose forward all-gathers its input and then
    multiplies (``LinearWithGradAccumulationAndAsyncCommunication``; its
    ``tp_comm_buffer_name`` "is not used in non-Transformer-Engine modules"). Its backward's
    re-gather and reduce-scatter overlap its GEMMs there as anywhere (async handles).
    """
    par = plan.parallel
    if every(par.tp == 1):
        return []
    dtype = plan.precision.activations
    full = s.act * s.tokens * s.hidden
    into, cols, wgrad_cols = ("input", s.hidden, s.hidden) if inward is None else inward
    into_size = s.act * s.tokens * cols
    # the column-parallel input's all-gathers, in the format the layer quantized it to
    quantized = engine and te_fp8(plan)
    gather_dtype, each = ("fp8", 1) if quantized else (dtype, s.act)
    gathered_size = each * s.tokens * cols

    def move(
        name: str, op: Op, src: Placement, dst: Placement, size: Any = full, fmt: str = dtype
    ) -> Move:
        return Move(f"{block} {name}", op, "tp", par.tp, fmt, size, str(src), str(dst))

    ring = (par.tp - 1) / par.tp

    def forward(m: Move, gemm: str, chunks: int = 0, portion: float = 1.0) -> Move:
        if not gemm:
            return replace(m, rule="tp forward: exposed, no GEMM to overlap with")
        if chunks:  # pipelined: GEMM chunk i+1 hides chunk i's collective; the last waits
            rule = (
                f"tp: exposed unless overlap.tp pipelines it with its GEMM in {chunks} chunks, "
                "each its own collective (the last one exposed)"
            )
            if gemm in USERBUFFER_GEMMS:
                m = replace(m, gemm_splits=chunks, gemm_sms=plan.overlap.tp_comm_sms.of(block))
            return hide(m, gemm, "tp", rule, share=(chunks - 1) / chunks, chunks=chunks)
        # ring exchange: tp - 1 transfers beside tp GEMM chunks, the last chunk's GEMM with
        # nothing left to receive (it was given the whole GEMM: an audit); the transfers run
        # on copy engines (``use_ce``), holding no SMs off the GEMM
        rule = "tp: exposed unless overlap.tp hides it behind its GEMM by ring exchange"
        if gemm.removesuffix(" backward") in USERBUFFER_GEMMS:
            m = replace(m, gemm_splits=ring_splits(plan, gemm))
        if aggregated(plan, gemm) and plan.overlap.tp:
            # the first GEMM of two chunks waits for the neighbour's first chunk, the rest
            # of the exchange beside all but the last of the tp / 2 GEMMs (review m370);
            # without overlap.tp nothing is exchanged by ring, aggregated or not (an audit,
            # m538: its rule said "aggregated" of an all-gather exposed whole)
            rule = f"{rule}, aggregated: its first chunk's transfer waited for"
            share = (par.tp - 2) / par.tp * portion
            return hide(m, gemm, "tp", rule, share=share, floor=1 / vmax(par.tp - 1, 1))
        return hide(m, gemm, "tp", rule, share=ring * portion)

    wgrad = f"{column} backward"
    sp = holds(par.sequence_parallel)
    if par.tp_style == "dtensor":
        return _dtensor_moves(move, into, into_size, gathered_size, gather_dtype, row, backward, sp)
    if backward:
        ar = move(f"{into} gradient", "all-reduce", PARTIAL, REPLICATE, into_size)
        rs = move(f"{into} gradient", "reduce-scatter", PARTIAL, shard(0), into_size)
        wg = "tp backward: overlaps the weight-gradient GEMM"
        again = move(
            f"{into} again, for weight grad",
            "all-gather",
            shard(0),
            REPLICATE,
            each * s.tokens * wgrad_cols,
            gather_dtype,
        )
        sp_moves = []
        if row:  # Transformer Engine's ub_overlap_ag_dgrad: beside the dgrad GEMM only, as
            # the wgrad GEMM reads what it gathers; under FP8 quantized first and gathered
            # in FP8 (``grad_output_preprocess``, TransformerEngine 2.5 ``module/base.py``)
            size = each * s.tokens * s.hidden
            gathered = move(
                "output gradient", "all-gather", shard(0), REPLICATE, size, gather_dtype
            )
            sp_moves.append(
                replace(forward(gathered, f"{row} backward", portion=0.5), part="input gradient")
            )
        regather = hide(again, wgrad, "", "tp backward: overlaps the input-gradient GEMM", 0.5)
        sp_moves += [replace(regather, part="input gradient"), hide(rs, wgrad, "", wg, share=0.5)]
        return when(sp_moves, sp) + when([hide(ar, wgrad, "", wg, share=0.5)], lacks(sp))
    gather = move(into, "all-gather", shard(0), REPLICATE, gathered_size, gather_dtype)
    outside = "tp forward: exposed, its GEMM is outside Transformer Engine's comm-GEMM overlap"
    sp_moves = [forward(gather, column) if comm_gemm else replace(gather, rule=outside)]
    if row:
        rs = move("output", "reduce-scatter", PARTIAL, shard(0))
        sp_moves.append(forward(rs, row, RS_SPLITS))
    # Megatron-LM overlaps tensor-parallel communication with GEMMs only under sequence
    # parallelism (--tp-comm-overlap asserts it): without, the all-reduce is exposed
    no_overlap = "tp forward: exposed (overlap.tp needs sequence parallelism)"
    reduced = replace(move("output", "all-reduce", PARTIAL, REPLICATE), rule=no_overlap)
    plain = [reduced] if row else []  # no row-parallel layer: the output stays split
    return when(sp_moves, sp) + when(plain, lacks(sp))


def _attention_inward(plan: Plan, s: Shapes) -> tuple[str, Any, Any] | None:
    """What latent attention's column-parallel layers read (`_tp_moves`' `inward`): the
    query and key/value latents with the shared rotary key (the hidden state instead of
    the query latent when queries are projected directly), and for their weight gradients
    the latents alone. The down-projections are replicated, so under sequence parallelism
    each rank projects its own shard and the latents are gathered (Megatron-Core's
    ``MLASelfAttention`` with duplicated down-projections); without it the input-gradient
    all-reduce carries the latents' gradients. The rotary key is gathered by
    ``gather_from_sequence_parallel_region``, whose backward only reduce-scatters, for RoPE
    and a concatenation, no GEMM: the up-projections gather their saved inputs again, not
    it (an audit: 2,112 columns gathered again for DeepSeek-V3's weight gradients, not
    2,048)."""
    mla = plan.model.mla
    if mla is None:
        return None
    latents = (s.q_latent if mla.q_rank else s.hidden) + s.kv_latent - mla.rope_dim
    return "latents", latents + mla.rope_dim, latents


def attention_tp_moves(plan: Plan, s: Shapes, backward: bool) -> list[Move]:
    """`_tp_moves` of the attention block: the column-parallel side overlaps the QKV
    projection, or latent attention's up-projections, which read what is gathered (the
    down-projection makes it and cannot). Latent attention's latents are gathered and saved
    16-bit under FP8 too (how Megatron-Core gathers them then was not read)."""
    column = "QKV projection" if plan.model.mla is None else flops.UP_PROJECTIONS
    return _tp_moves(
        plan,
        s,
        "attention",
        backward,
        column,
        "attention output projection",
        _attention_inward(plan, s),
        engine=plan.model.mla is None,
    )


def _cp_moves(plan: Plan, s: Shapes, backward: bool) -> list[Move]:
    """Context parallel attention: every rank needs K and V of the whole sequence.

    Ring attention (Liu et al., arXiv 2310.01889) passes K/V chunks around the cp ring in
    cp - 1 send/recv steps, which moves exactly the bytes of a ring all-gather of K and V,
    each step hidden behind attention on the chunk already received ((cp - 1)/cp of the
    attention core). The ring is flat whatever links it spans (Transformer Engine's
    ``AttnFuncWithCPAndKVP2P`` sends each chunk to the next cp rank), so with cp ranks in
    several nodes every one of the cp - 1 steps waits for its slowest hop: a flat ring at
    the slowest link spanned, not NCCL's all-gather, whose channels spread the node's hops
    over every port. Backward re-circulates K/V and passes dK/dV around the same ring, in
    cp steps each overlapping its own step's attention backward (``AttnFuncWithCPAndKVP2P
    .backward``: K/V at the first, K/V with the previous step's dK/dV as one tensor at each
    middle one, dK/dV at the last, each sent before the step's kernels and waited for after
    them), so both hide behind the whole backward core (an audit: behind (cp - 1)/cp of the
    core, 52 µs of a cp-4 call exposed where Transformer Engine exposes about 7). Its cp
    sends are cp latencies: K/V's ring its cp - 1, and dK/dV, whose chunks ride them but the
    last, one (`Move.steps`; an audit: priced as two rings of cp - 1 steps each, 70B at cp
    16 paid 14 latencies of 14 µs more a layer). Llama 3 (arXiv 2407.21783, section 3.3.2)
    all-gathers K/V before attention instead, which leaves the gather exposed (NCCL's
    all-gather, its ring across nodes); as Transformer Engine runs it
    (``AttnFuncWithCPAndKVAllGather``), K and V in two all-gathers, again before the
    backward, and dK and dV in two reduce-scatters after it.
    """
    par = plan.parallel
    if every(par.cp == 1):
        return []
    dtype = plan.precision.activations
    ring = par.cp_attention == "ring"
    core = flops.core_kernel(plan) + (" backward" if backward else "")
    # forward: cp steps, the last sending nothing; backward: every one of its cp steps sends
    share = 1.0 if backward else (par.cp - 1) / par.cp
    ring_rule = (
        "cp ring: each of its cp steps overlaps its own attention backward"
        if backward
        else "cp ring: each step overlaps attention on the previous chunk"
    )

    def exchange(name: str, op: Op, cols: Any, src: str, dst: str, exposed: str) -> Move:
        m = Move(name, op, "cp", par.cp, dtype, s.act * s.micro * s.seq_kv * cols, src, dst)
        if not ring:
            return replace(m, rule=f"cp {exposed}")
        return hide(replace(m, algorithm="ring"), core, "", ring_rule, share)

    # all-gathered, Transformer Engine gathers (and reduce-scatters) K and V apart
    cols = [("K/V", s.k_cols + s.v_cols)] if ring else [("K", s.k_cols), ("V", s.v_cols)]
    suffix = " (ring exchange)" if ring else ""
    moves = [
        exchange(
            f"attention {what}{suffix}",
            "all-gather",
            n,
            "shard(0)",
            "replicate",
            f"all-gather of {what}: exposed before attention",
        )
        for what, n in cols
    ]
    if backward:
        # the ring's dK/dV rides its point-to-point messages, named so as K/V's are (an
        # audit, m524: a bare "dK/dV", a reduce-scatter of one step, read as NCCL's)
        moves += [
            exchange(
                f"attention d{what.replace('/', '/d')}{suffix}",
                "reduce-scatter",
                n,
                "partial",
                "shard(0)",
                f"reduce-scatter of d{what.replace('/', '/d')}: exposed after attention",
            )
            for what, n in cols
        ]
        if ring:  # dK/dV rides K/V's messages but the last (docstring)
            moves[-1] = replace(moves[-1], steps=1)
    return moves


# --------------------------------------------------------------------------------------------
# The step


@dataclass
class _StageBuilder:
    plan: Plan
    kind: StageClass
    microbatches: int
    shapes: Shapes
    params: StageParams
    resident: tuple[Alloc, ...]
    layer: _Layer
    phases: list[Phase] = field(default_factory=list)

    @property
    def stage(self) -> int:
        return self.kind.stage

    @cached_property
    def in_flight(self) -> float:
        """Micro-batches in flight on this stage, in whole-stage units (`inflight`); where
        its model chunks differ, the layer passes held at its peak over the stage's layers."""
        units = inflight(self.plan, self.stage, self.microbatches)
        dense, moe = self.flight_passes
        held: float = vwhere(self.chunks_differ, (dense + moe) / vmax(self.layers, 1), units)
        return held

    @property
    def chunks_differ(self) -> Any:
        """Some stage's model chunks hold different layers (`StageClass.flight`; a sweep's
        configurations whose chunks are alike hold none there)."""
        if not self.kind.flight:
            return False
        dense, moe = self.kind.flight[0]
        return (dense + moe) > 0

    @cached_property
    def flight_passes(self) -> tuple[Any, Any]:
        """Dense and MoE layer passes held saved at the stage's peak where chunks differ:
        of the states the replay at m = p or at m ≥ 2p can peak at (`layers.flight_layers`;
        interleaving needs m a multiple of p), the one whose passes keep the most bytes."""
        k = self.kind
        short = self.microbatches < 2 * self.plan.parallel.pp
        (dense, moe), (dense_short, moe_short) = (
            self._heaviest(k.flight),
            self._heaviest(k.flight_short),
        )
        return vwhere(short, dense_short, dense), vwhere(short, moe_short, moe)

    def _heaviest(self, states: tuple[tuple[Any, Any], ...]) -> tuple[Any, Any]:
        """Of `states` (dense, MoE passes), the one that keeps the most bytes (`_saved_by`)."""
        if not states:
            return 0, 0
        (dense, moe), rest = states[0], states[1:]
        most = _saved_by(self.layer, dense, moe)
        for d, e in rest:
            saved = _saved_by(self.layer, d, e)
            more = saved > most
            dense, moe, most = vwhere(more, d, dense), vwhere(more, e, moe), vmax(most, saved)
        return dense, moe

    @cached_property
    def saved_per_microbatch(self) -> int:
        return _saved_per_microbatch(self)

    @cached_property
    def saved_in_flight(self) -> int:
        """Activation bytes the micro-batches in flight leave saved on this stage (less what
        its multi-token prediction layers do not keep, `_mtp_checkpoints`)."""
        by_chunk = vround(_saved_by(self.layer, *self.flight_passes))
        by_stage = vround(self.in_flight * self.saved_per_microbatch)
        saved: int = vwhere(self.chunks_differ, by_chunk, by_stage)
        return saved - _mtp_checkpoints(self)

    @cached_property
    def current_layer(self) -> list[Alloc]:
        return _current_layer(self)

    @cached_property
    def earlier(self) -> Alloc:
        return _earlier(self)

    @property
    def first(self) -> bool:
        return self.kind.first

    @property
    def last(self) -> bool:
        return self.kind.last

    @property
    def dense(self) -> int:
        """Dense layers on this stage."""
        return self.kind.dense

    @property
    def moe(self) -> int:
        """MoE layers on this stage."""
        return self.kind.moe

    @property
    def last_is_moe(self) -> bool:
        return self.kind.last_is_moe

    @property
    def layers(self) -> int:
        return self.dense + self.moe

    @property
    def pipelined(self) -> bool:
        """More than one pipeline stage (only then is a stage not both first and last)."""
        return not (self.first and self.last)

    @property
    def has_dense(self) -> bool:
        return uniform(self.dense > 0, "dense layers")

    @property
    def has_moe(self) -> bool:
        return uniform(self.moe > 0, "MoE layers")

    @property
    def ffn_blocks(self) -> list[str]:
        """The feed-forward blocks the stage's layers have: "mlp", "moe" or both."""
        return ["mlp"] * self.has_dense + ["moe"] * self.has_moe

    @cached_property
    def root_grads(self) -> list[Alloc]:
        """`_zero3_root_grads`, once a stage (the layers' backward instants hold them)."""
        return _zero3_root_grads(self)

    @cached_property
    def kept_gathered(self) -> list[Alloc]:
        """`_kept_gathered`, once a stage."""
        return _kept_gathered(self)

    @cached_property
    def first_backward(self) -> Any:
        """`_first_backward`, once a stage."""
        return _first_backward(self)

    @property
    def ffn(self) -> str:
        """The feed-forward block of the stage's layers, which a whole-layer ZeRO-3 unit
        holds (`_unit_groups`; no plan with such units mixes the two,
        `resolve._check_fsdp_unit`)."""
        return self.ffn_blocks[-1] if self.ffn_blocks else "mlp"

    def add(
        self,
        name: str,
        count: int,
        moves: list[Move],
        instants: list[Instant],
        works: list[Work] | None = None,
    ) -> None:
        if every(count <= 0):
            return
        if name.startswith("pipeline."):
            moves = [_pipeline_overlap(self.plan, m) for m in moves]
        if self.plan.parallel.dp_shard is not None:
            moves = [h for m in moves for h in _hybrid(self.plan, m)]
        self.phases.append(Phase(name, count, tuple(moves), tuple(instants), tuple(works or ())))


def embedding_moves(plan: Plan, s: Shapes) -> list[Move]:
    """The vocab-parallel embedding's output: each tp rank looks up the tokens its vocab
    rows hold and zeros the rest, so the output is sum-partial over tp and reduced before
    the first layer (Megatron-LM's ``VocabParallelEmbedding``; vLLM's ends in the same
    all-reduce): reduce-scattered into sequence-parallel shards, or all-reduced.
    Megatron-Core reduce-scatters only where no learned position table is added
    (``LanguageModelEmbedding.reduce_scatter_embeddings``: not ``add_position_embedding``,
    and sequence parallel): with one, as the legacy ``language_model.Embedding`` did, the
    output is all-reduced, the positions added, and each rank keeps its sequence shard
    (``scatter_to_sequence_parallel_region``: a split, with no communication)."""
    par = plan.parallel
    size = s.act * s.tokens * s.hidden
    rule = "tp: exposed, the first layer needs it"
    learned = plan.model.position == "learned"
    if learned and not every(lacks(_sp(plan))):
        rule += "; where sequence parallel, each rank then keeps its shard (learned positions)"
    moves = []
    scatter = _sp(plan) & (not learned)
    kinds: tuple[tuple[Op, str, Any], ...] = (
        ("reduce-scatter", "shard(0)", scatter),
        ("all-reduce", "replicate", lacks(scatter) & (par.tp > 1)),
    )
    for op, dst, where in kinds:
        move = Move(
            "embedding output",
            op,
            "tp",
            par.tp,
            plan.precision.activations,
            size,
            "partial",
            dst,
            rule=rule,
        )
        moves += when([move], where)
    return moves


DTENSOR_WAIT = "tp (DTensor): exposed, the op after the redistribute waits for it"


def _dtensor_moves(
    move: Callable[..., Move],
    into: str,
    into_size: Any,
    gathered_size: Any,
    gather_dtype: str,
    row: str,
    backward: bool,
    sp: Any,
) -> list[Move]:
    """`_tp_moves` under PyTorch's DTensor parallel styles (`Parallel.tp_style` dtensor), as
    torchtitan applies them (``apply_tp``: ``SequenceParallel`` norms, ``PrepareModuleInput``
    and ``ColwiseParallel`` inputs Shard(1) → Replicate, ``RowwiseParallel`` outputs Partial
    → Shard(1); without sequence parallelism Replicate in and Partial → Replicate out). Each
    redistribute runs where the op after it needs its result (``redistribute(...,
    async_op=True)`` waited for at first use), with no GEMM of its own beside it, and its
    backward is one redistribute of the gradient back (``Redistribute.backward``,
    torch/distributed/tensor/_redistribute.py): the input's all-gather becomes the input
    gradient's reduce-scatter (all-reduce), the output's reduce-scatter the output
    gradient's all-gather; the gathered input is the matmul's own, saved for its weight
    gradient (`layers.column_input` saves it whole), so nothing is gathered again (an
    audit, m489: the backward had Megatron-LM's re-gather and its reduction hidden behind
    the weight-gradient GEMM, 4 GiB a step of phantom gathers on Llama 3 8B at tp 2)."""
    if backward:
        sp_moves = []
        if row:
            sp_moves.append(move("output gradient", "all-gather", shard(0), REPLICATE))
        sp_moves.append(move(f"{into} gradient", "reduce-scatter", PARTIAL, shard(0), into_size))
        plain = [move(f"{into} gradient", "all-reduce", PARTIAL, REPLICATE, into_size)]
    else:
        sp_moves = [move(into, "all-gather", shard(0), REPLICATE, gathered_size, gather_dtype)]
        if row:
            sp_moves.append(move("output", "reduce-scatter", PARTIAL, shard(0)))
        plain = [move("output", "all-reduce", PARTIAL, REPLICATE)] if row else []
    waited = [replace(m, rule=DTENSOR_WAIT) for m in sp_moves]
    return when(waited, sp) + when([replace(m, rule=DTENSOR_WAIT) for m in plain], lacks(sp))


def _sp(plan: Plan) -> bool | np.ndarray:
    """Where sequence parallelism is in effect: asked for, with more than one tp rank."""
    par = plan.parallel
    return holds(holds(par.sequence_parallel) & (par.tp > 1))


def _redistributed(plan: Plan, s: Shapes, block: str) -> list[Alloc]:
    """Under DTensor's parallel styles with sequence parallelism, the block's normed input
    shard its redistribute gathered, alive as the block's call argument until the block
    returns (torchtitan's ``TransformerBlock.forward``: ``self.attention(self.attention_norm(
    x), ...)``; ``PrepareModuleInput`` hands the module a new tensor and nothing frees the
    old); Megatron-LM's layers save that shard as the column-parallel input, counted there
    (review m490: 32 MiB a block at tp 2 on Llama 3 8B uncounted)."""
    if plan.parallel.tp_style != "dtensor":
        return []
    shard = Alloc(
        f"{block} input shard (before its redistribute)",
        "transient",
        s.act * s.tokens_sp * s.hidden,
        placement="shard(0) on tp",
    )
    return when([shard], _sp(plan))


def _gathered_apart(plan: Plan) -> bool | np.ndarray:
    """Where sequence parallelism's gathered column-parallel input is a tensor apart from
    the saved shard (Megatron-LM's layers, which gather it again for the weight gradient);
    under DTensor's parallel styles (`Parallel.tp_style` dtensor) the gathered input is the
    one saved (`layers.column_input`), counted there."""
    return holds(_sp(plan) & (plan.parallel.tp_style != "dtensor"))


def _hybrid(plan: Plan, move: Move) -> list[Move]:
    """A ZeRO collective on the data-parallel group under hybrid sharding
    (`Parallel.dp_shard`): its shard group's instead (what ZeRO gathers and reduce-scatters,
    `Parallel.zero_ranks` ranks), and after each reduce-scatter of gradients the all-reduce
    of the shard across the dp / dp_shard copies, behind the same window (it waits for the
    reduce-scatter's output, so the two run one after the other): PyTorch FSDP's
    HYBRID_SHARD (torch 2.1's ``_reduce_grad``: ``reduce_scatter_tensor`` over the shard
    process group, then ``all_reduce`` of the sharded gradient, in place, over the
    inter-node group), FSDP2's ``foreach_reduce`` (the reduce-scatter's output all-reduced
    in place over the mesh's replicate dimension, every micro-batch unless a loop calls
    ``set_requires_all_reduce(False)``, which torchtitan's does not), and Megatron-LM's
    distributed optimizer with ``num_distributed_optimizer_instances`` > 1 (reduce-scatter
    within an instance, then all-reduce across instances, ``param_and_grad_buffer.py``).
    Each copy keeps its own shards, so memory is sharded over the shard group alone; a
    parameter gather runs within it. Every data-parallel move the engine makes is ZeRO's
    (ZeRO 0 is refused beside dp_shard), and a plan's written transitions keep the group
    they name. The experts' moves (on "edp") are ZeRO's too: hybrid sharding is priced only
    where experts are not split apart (`resolve._check_hybrid`), so their group is this one
    (`layers.expert_data_parallel`).

    PyTorch's FSDP (ZeRO 3, `Parallel.fsdp`) runs the all-reduce on a stream of its own, which waits
    for that unit's reduce-scatter alone (FSDP2's ``foreach_reduce`` on
    ``all_reduce_stream``, FSDP1's ``_all_reduce_stream.wait_stream(_post_backward_stream)``),
    so a unit's all-reduce across the copies runs beside the next unit's reduce-scatter and
    gathers, each hidden on its own (its own `Move.part` of the window): an audit (m430) found
    a Qwen-MoE plan's expert all-reduces over InfiniBand waiting behind the reduce-scatters
    over NVLink, 130 ms a step exposed that hides. Megatron-LM's instances issue both on one
    communication stream (``start_grad_sync``), one after the other, as priced."""
    if move.group not in ("dp", "edp"):
        return [move]
    par = plan.parallel
    shard = replace(move, group="dp_shard")
    if move.op != "reduce-scatter":
        return [shard]
    element = DTYPE_BYTES[move.dtype]
    elements = -(-(move.size_bytes // element) // par.zero_ranks)  # padded to whole shards
    across = replace(
        shard,
        name=move.name.removesuffix("gradients") + "gradient shards",
        op="all-reduce",
        group="dp_replicate",
        ranks=par.replicas,
        size_bytes=elements * element,
        src="partial",
        dst="replicate",
        # the copies counted for one plan (a sweep's are an array, its rules not read)
        rule=f"hybrid sharding: the reduce-scatter's shard, all-reduced across the "
        f"{count_label(par.replicas)} copies right after it, hidden or exposed as the "
        f"reduce-scatter is ({move.rule})",
    )
    # ZeRO 3 is PyTorch FSDP's (a sweep keeps it apart where it holds, `search.structure`)
    if np.all(par.zero == 3) and move.window == EMBEDDING_BACKWARD_WINDOW:
        # the stage's first layer's, the backward's last (`_first_layer_reduction`): after
        # its reduce-scatter, beside what the embedding's backward leaves, and beside the
        # root unit's reduce-scatter, which starts as it does (an audit, m472: the two were
        # added, 1.8 ms a step on Llama 3 8B over two nodes)
        copies = count_label(par.replicas)
        across = replace(
            across,
            beside="reduce-scatter",
            rule=f"hybrid sharding: the stage's first layer's reduce-scatter's shard, "
            f"all-reduced across the {copies} copies on FSDP's all-reduce stream once it is "
            "done: in what the embedding's backward leaves, and beside the next "
            "reduce-scatter, which hides it too; exposed beyond both unless overlap.dp_grads "
            "runs it there",
        )
    elif np.all(par.zero == 3) and move.window:  # its own stream, beside the next unit's RS
        across = replace(
            across,
            part=f"{move.part} across copies",
            rule=f"{across.rule}; on FSDP's all-reduce stream, beside the next reduce-scatter",
        )
    return [shard, across]


def _pipeline_overlap(plan: Plan, move: Move) -> Move:
    """Send/recv between stages: 1F1B and GPipe wait for it; the interleaved schedule can
    run it behind another chunk's compute when `overlap.pp` is on (Megatron-LM's
    `--overlap-p2p-communication`, Narayanan et al. section 2.2.2)."""
    interleaved = holds(plan.parallel.pipeline.schedule == "interleaved")
    if not isinstance(interleaved, bool):
        if plan.overlap.pp:
            raise ValueError("a sweep with overlap.pp keeps its schedules apart")
        interleaved = False  # without overlap.pp the send is exposed on every schedule
    if not interleaved:
        # Megatron-LM turns --overlap-p2p-communication off without virtual stages (and
        # Megatron-Core's 1F1B schedule raises on it): said where the flag is set
        why = " (overlap.pp needs the interleaved schedule)" if plan.overlap.pp else ""
        return replace(move, rule=f"pp send/recv: exposed, the receiving stage waits for it{why}")
    window = "@forward-microbatch" if move.dst == "i+1" else "@backward-microbatch"
    return hide(
        move,
        window,
        "pp",
        "pp send/recv: exposed unless overlap.pp hides it from its sender behind another "
        "chunk (interleaved schedule); the receiving stage still waits for it to arrive, "
        "in the bubble",
        1 / plan.parallel.pipeline.virtual_stages,
    )


def pipeline_send(plan: Plan, s: Shapes, forward: bool) -> Move:
    """A stage's output to the next stage in forward, its gradient back in backward: one
    send/recv of tokens x hidden per rank, each rank's own sequence shard under sequence
    parallelism and the whole tp-replicated tensor without it (`pipeline_moves` splits
    that one with the scatter/gather optimisation)."""
    name = "activations → next stage" if forward else "gradients → previous stage"
    size = s.act * s.tokens_sp * s.hidden
    return Move(
        name,
        "send-recv",
        "pp",
        2,
        plan.precision.activations,
        size,
        "i",
        "i+1" if forward else "i-1",
    )


def pipeline_moves(plan: Plan, s: Shapes, forward: bool) -> list[Move]:
    """The stage-boundary transfer as Megatron-LM runs it.

    Without sequence parallelism a stage's output (and, going back, its input gradient) is
    replicated over the stage's tp ranks. With ``pipeline.scatter_gather`` each of them sends
    only its 1/tp share, over its own inter-node link, and the receiving ranks all-gather
    the tensor over tp before the first layer uses it (Narayanan et al., arXiv 2104.04473,
    section 4.1: the scatter/gather optimisation; Megatron-LM's
    ``scatter_gather_tensors_in_pipeline``, on by default before Megatron-Core). With
    sequence parallelism the tensor is already sharded and `pipeline_send` sends the shard."""
    send = pipeline_send(plan, s, forward)
    par = plan.parallel
    if not par.pipeline.scatter_gather:
        return [send]
    split = holds(holds(par.tp > 1) & lacks(_sp(plan)))
    if not isinstance(split, np.ndarray) and not split:
        return [send]
    full = s.act * s.tokens * s.hidden
    what = "activations" if forward else "gradients"
    gather = Move(
        f"{what} gathered over tp on arrival",
        "all-gather",
        "tp",
        par.tp,
        plan.precision.activations,
        full,
        "shard(0)",
        "replicate",
    )
    return [
        replace(send, size_bytes=vwhere(split, full // par.tp, send.size_bytes)),
        *when([gather], split),
    ]


def send_boundary(stage: Any, back: bool, pp: Any) -> Any:
    """The boundary a stage's sends cross (`Move.boundary`): forward, its own, to the next
    stage (the last stage's to the first, an interleaved schedule's next chunk); backward,
    the one before it, to the previous stage (the first stage's to the last)."""
    return (stage - 1) % pp if back else stage


def at_boundary(moves: list[Move], boundary: Any) -> list[Move]:
    """`moves` with their stage sends priced on `boundary`'s pair of stages."""
    return [replace(m, boundary=boundary) if m.op == "send-recv" else m for m in moves]


def _sends(plan: Plan, end: bool) -> int:
    """Sends per micro-batch from a stage to its neighbour: one per model chunk it holds,
    less one at the end of the model (the last stage forward, the first backward). With v
    virtual stages a micro-batch crosses p·v - 1 boundaries (Narayanan et al. section 2.2.2)."""
    v = plan.parallel.pipeline.virtual_stages
    return v - 1 if end else v


def _full(s: Shapes, name: str, placement: str = "replicate on tp", each: Any = None) -> Alloc:
    """A [tokens, hidden] transient, `each` bytes an element (the activations' format)."""
    size = (s.act if each is None else each) * s.tokens * s.hidden
    return Alloc(name, "transient", size, placement=placement)


QKV_AGAIN = "QKV input (re-gathered for weight grad)"


def _gathered(
    plan: Plan, s: Shapes, name: str, engine: bool = True, for_wgrad: bool = False
) -> Alloc:
    """A GEMM operand as sequence parallelism gathers it: in FP8 under Transformer Engine's
    recipes (`layers.saved_gemm_input`, `_tp_moves`), unless not by an `engine` module.
    Gathered `for_wgrad` (a layer's input again, a row-parallel layer's output gradient),
    its transpose is made beside it before the weight-gradient GEMM where the device's FP8
    GEMMs take K-major operands only (``update_usage(columnwise_usage=True)`` on the
    gathered data, held until that GEMM ends: TransformerEngine 2.5 ``layernorm_linear.py``
    and ``linear.py``; a review): 2 B an element on Hopper."""
    if not engine:
        return _full(s, name)
    transposed = for_wgrad and te_fp8(plan) and plan.device.fp8_transpose
    # under comm-GEMM overlap the module gathers into its userbuffer and reads a view of it
    # (``fill_userbuffers_buffer_for_all_gather``, TransformerEngine 2.5 ``module/base.py``),
    # counted with the buffers (`layers.te_userbuffers`): only an FP8 transpose is made apart
    # (an audit: both were counted, 256 MiB at Llama 3 70B's peak)
    data = vwhere(userbuffered(plan), 0, saved_gemm_input(plan, s))
    return _full(s, name, each=data + int(transposed))


def _fp8_output_gradient(
    plan: Plan, s: Shapes, name: str, cols: Any, placement: str
) -> list[Alloc]:
    """Under FP8 training a column-parallel layer's output gradient (fc1's, QKV's) quantized
    for its two backward GEMMs and held through both, beside the 16-bit one autograd hands
    it (TransformerEngine 2.x ``_LayerNormLinear.backward``: ``grad_output_preprocess``
    with ``set_usage(rowwise=True, columnwise=True)``, read by the data- and then the
    weight-gradient GEMM): 1 B an element, and its transpose where the device's FP8 GEMMs
    take K-major operands only (`Device.fp8_transpose`, Hopper), as `_gathered`'s are (an
    audit: 117 MB missing at Llama 3 70B's fc1 backward, its peak)."""
    if not te_fp8(plan):
        return []
    transposed = plan.device.fp8_transpose
    label = f"{name} (FP8{', and its transpose' if transposed else ''})"
    return [Alloc(label, "transient", (1 + int(transposed)) * s.tokens * cols, placement=placement)]


def _squared(plan: Plan, name: str, nbytes: Any, placement: str) -> list[Alloc]:
    """The one more tensor of one width that eager squared ReLU (`flops.activation`) holds
    beside what a fused activation would: fc1's output while the square runs, which the
    caller still holds as the function's argument, or ``2·x.pow(1)`` beside the gradients
    its backward multiplies; none for a fused activation."""
    if plan.model.mlp != "squared_relu":
        return []
    return [Alloc(name, "transient", nbytes, placement=placement)]


def _squared_relu(plan: Plan, s: Shapes, held: list[Alloc]) -> list[Instant]:
    """Under eager squared ReLU the instant its square runs: `held` (what the block saves,
    the relu's output and the square's among it) and fc1's output (`_squared`); a fused
    activation reads it and writes one, both saved, so it has no instant of its own."""
    width = s.act * s.tokens * s.ffn_cols
    fc1 = _squared(plan, "MLP fc1 output", width, "shard(ffn) on tp")
    if fc1 and te_fp8(plan):  # the square writes fc2's 16-bit input; its FP8 copy comes later
        # (review m478: the instant counted the 1-B copy in its place)
        held = [x for x in held if not x.name.startswith(FC2_INPUT)]
        held += _fp8_source(plan, FC2_INPUT, width, "shard(ffn) on tp")
    return [Instant("squared ReLU", tuple([*held, *fc1]))] if fc1 else []


def _before_reduction(plan: Plan, s: Shapes, name: str, engine: bool = True) -> list[Alloc]:
    """A row-parallel output or a column-parallel input gradient: partial on tp before its
    reduction, or, at tp 1, the whole tensor, held all the same. Under sequence
    parallelism the reduce-scatter writes its 1/tp shard into a buffer of its own while the
    partial is alive (Megatron-LM's ``_reduce_scatter_along_first_dim`` and the SP branch of
    ``LinearWithGradAccumulationAndAsyncCommunication.backward`` allocate it with
    ``torch.empty``): full + shard at that instant, as a hand-written partial → shard counts
    it (the seed's lifetimes; a seeds audit). Without it the all-reduce sums in place. Under
    comm-GEMM overlap a Transformer Engine module (`engine`) writes the partial into its
    userbuffer (``get_buffer`` of its reduce-scatter's communicator: the output
    projection's and fc2's pipelined forward, QKV's and fc1's bulk data gradient), counted
    with the buffers (`layers.te_userbuffers`; an audit)."""
    tp = plan.parallel.tp
    partial = _full(s, f"{name} (partial, before reduction)", "partial on tp")
    if engine:
        partial = replace(partial, bytes=vwhere(userbuffered(plan), 0, partial.bytes))
    shard = Alloc(
        f"{name} (reduce-scattered)",
        "transient",
        s.act * s.tokens_sp * s.hidden,
        placement="shard(0) on tp",
    )
    return when([partial], tp > 1) + when([shard], _sp(plan)) + when([_full(s, name)], tp == 1)


def _fp8_source(
    plan: Plan, name: str, nbytes: Any, placement: str, cond: Any = True
) -> list[Alloc]:
    """Under FP8 training, the 16-bit tensor a Transformer Engine GEMM quantizes its input
    from, alive while the GEMM and its reduction run: the caller keeps it as a local
    through the call (Megatron-Core's ``MLP.forward`` holds ``intermediate_parallel`` over
    ``self.linear_fc2(...)``, ``SelfAttention.forward`` its core's output over
    ``self.linear_proj(...)``, ``TEGroupedMLP.forward`` the experts' over their fc2), and
    TE's ``_Linear.forward`` holds ``inp`` beside the FP8 ``inputmat`` it saves
    (`layers.saved_gemm_input`) through its row-parallel reduction. In the activations'
    format the saved input is that tensor itself; an audit (m471) found the FP8 instants
    without it, smaller than the bf16 ones. `cond`: where no saved tensor already is it
    (a fused attention kernel keeps its 16-bit output, `layers.FUSED_OUTPUT`)."""
    if not te_fp8(plan):
        return []
    return when(
        [Alloc(f"{name} (16-bit, before its FP8 cast)", "transient", nbytes, placement=placement)],
        cond,
    )


def _gathered_input(plan: Plan, s: Shapes) -> Alloc:
    """What the attention block's sequence-parallel all-gather leaves on every rank: the
    hidden state, or latent attention's latents (`_attention_inward`)."""
    inward = _attention_inward(plan, s)
    if inward is None:
        return _gathered(plan, s, "attention input (all-gathered)")
    return Alloc(
        "attention latents (all-gathered)",
        "transient",
        s.act * s.tokens * inward[1],
        placement="replicate on tp",
    )


def _regathered_input(plan: Plan, s: Shapes) -> Alloc:
    """What the attention block's column-parallel layers gather again for their weight
    gradients under sequence parallelism: the hidden state (`_gathered`), or latent
    attention's latents without the rotary key (`_attention_inward`)."""
    inward = _attention_inward(plan, s)
    if inward is None:
        return _gathered(plan, s, QKV_AGAIN, for_wgrad=True)
    return Alloc(
        "attention latents (re-gathered for weight grad)",
        "transient",
        s.act * s.tokens * inward[2],
        placement="replicate on tp",
    )


def _working(allocs: list[Alloc], suffix: str = "working, not saved") -> list[Alloc]:
    """Tensors computed but not kept (full recompute's forward, recompute in backward)."""
    return [replace(a, name=f"{a.name} ({suffix})", category="transient") for a in allocs]


def _recomputed(saved: list[Alloc]) -> list[Alloc]:
    """What full recompute's forward, run again in the backward, saves for the layer's
    backward (`_working`), but for the attention norm's input: that is the layer's input,
    which Megatron-LM's ``CheckpointFunction.backward`` hands the forward detached from the
    checkpoint (``detach_variable``, sharing its storage), so the norm saves the checkpoint
    itself (an audit: it was counted beside it, 2sbh more at GPT-3's peak)."""
    return _working([a for a in saved if a.name != ATTENTION_NORM_INPUT], "recomputed")


def _either(saved: list[Alloc], full: Any) -> list[Alloc]:
    """Each tensor as saved, or, where full recompute holds, as a working tensor that the
    forward computes and frees (`_working`)."""
    out: list[Alloc] = []
    for alloc in saved:
        out += when([alloc], lacks(full)) + when(_working([alloc]), full)
    return out


def _attention_spent(plan: Plan, s: Shapes) -> list[str]:
    """The attention block's saved tensors its backward has used by the QKV projection's:
    the output projection's input, the core's (Q, K, V and its statistics or scores, and
    the QKV output V's view held, which the recompute checkpoint's backward releases with
    its saved tensors: an audit counted it at the QKV gradients, 18,874,368 B at Llama 3
    70B), the Q/K norms' input and a sandwich norm's."""
    names = [*QKV_OUTPUTS, QKV_HELD_BY_V, "attention Q/K norm input"]
    names += [PROJECTION_INPUT, "attention dropout mask", "attention scores gradient"]
    return names + [a.name for a in core_attention(plan, s) + post_norm_input(plan, s, "attention")]


def _spent(allocs: list[Alloc], names: list[str]) -> list[Alloc]:
    """`allocs` without the saved tensors `names` (or their recomputed copies), which a
    backward has consumed and freed."""
    return [a for a in allocs if a.name.removesuffix(" (recomputed)") not in names]


def _total(allocs: list[Alloc]) -> int:
    return sum(a.total for a in allocs)


def derive(
    plan: Plan, representatives: bool = False, classes: Sequence[StageClass] | None = None
) -> Step:
    """The step of `plan`, stage by stage: training here, prefill and decode in
    `budget.inference`.

    With `representatives`, stages that run the same kernels and moves (the same
    `StageClass`) are derived once, as the first of them, which has the most micro-batches
    in flight and therefore the highest peak; `copies` says how many it stands for. The
    step time and the worst peak are unchanged; a sweep uses this to skip identical work,
    and passes `classes` whose counts are arrays over its configurations (their pipeline
    depths may differ when their stages fall into the same classes).
    """
    with masking():  # a sweep's masks and masked sizes, made once each (`phases.Masks`)
        if plan.mode != "train":
            from budget.inference import derive_inference

            return _with_transitions(plan, derive_inference(plan))
        return _derive_training(plan, representatives, classes)


def _derive_training(
    plan: Plan, representatives: bool, classes: Sequence[StageClass] | None
) -> Step:
    """`derive` of a training step."""
    m = plan.microbatches
    s = shapes(plan)
    if classes is None:
        classes = stage_classes(plan, merge=representatives)
    layer = _Layer.of(plan, s)
    stages = []
    for kind in classes:
        params = class_params(plan, kind)
        stage_shapes = _stage_shapes(plan, s, kind.sliding, kind.dense + kind.moe)
        b = _StageBuilder(
            plan,
            kind,
            m,
            stage_shapes,
            params,
            stage_states(plan, params)
            + tuple(fp8_weight_copies(plan, kind))
            + _scores_buffer(plan, stage_shapes, kind.dense + kind.moe)
            + tuple(_reduce_buffer(plan, 3)),
            layer,
        )
        states = b.resident
        # held from the micro-batches' passes to the drain, which frees them
        b.resident = full = (*states, *_deferred_buffers(b))
        b.resident = _before_any_gradient(b)  # what the forward's and the loss's hold
        _forward(b)
        b.resident = full
        _backward(b)
        _drain(b)
        b.resident = states
        _reduce(b)
        _hold_reduce_buffers(b)
        stages.append(
            StageStep(
                kind.stage,
                b.layers,
                b.in_flight,
                params.per_rank + params.expert_per_rank,
                b.resident,
                tuple(b.phases),
                timing_key=kind.key if isinstance(kind.dense, int) else (),
                copies=kind.copies,
            )
        )
    step = Step(m, tuple(stages), params_total(plan), layer_params(plan).total)
    return _with_transitions(plan, step)


def _reduce_buffer(plan: Plan, zero: int) -> list[Alloc]:
    """DeepSpeed's contiguous gradient buffer at ZeRO stage `zero` (2 or 3), where the plan
    names its size (`Parallel.reduce_bucket`, DeepSpeed's ``reduce_bucket_size``), in the
    parameters' format (the optimizer's ``self.dtype``). ZeRO 3 allocates one when its
    optimizer is set up and keeps it for the run (``_setup_for_real_optimizer``, stage3.py:
    ``self.__ipg_bucket_flat_buffer = torch.empty(self.reduce_bucket_size, ...)``); ZeRO 2
    allocates one at every ``backward`` and a second under ``overlap_comm``
    (`overlap.dp_grads`), released once that backward's gradients are reduced
    (``independent_gradient_partition_epilogue`` ends in ``_release_ipg_buffers``, run
    after every backward; stage_1_and_2.py; `_hold_reduce_buffers`). An audit: a DeepSpeed
    ZeRO 3 plan read 1.0 GB under its run at the optimizer step, none counted."""
    n = plan.parallel.reduce_bucket
    if not n or plan.mode != "train":
        return []
    two = zero == 2 and plan.overlap.dp_grads
    what = f"{n:,} elements" + (" each, a second for overlap_comm" if two else "")
    name = f"DeepSpeed's contiguous gradient buffer{'s' if two else ''} ({what})"
    held = Alloc(name, "transient", n * DTYPE_BYTES[plan.precision.params], 2 if two else 1)
    return when([held], holds(plan.parallel.zero == zero) & deepspeed_buffered(plan))


def _hold_reduce_buffers(b: _StageBuilder) -> None:
    """ZeRO 2's DeepSpeed buffers (`_reduce_buffer`) in every instant of each backward: the loss
    (its backward's bytes are its instant's), the layers' and the embedding's backward and
    the reduction that ends it, which releases them; not a forward, nor the optimizer step
    (a review: they had been held into the next micro-batch's forward). Where a bucket is
    reduced, under ZeRO 2 or 3, the copies DeepSpeed makes to reduce it beside them
    (`_flattened_bucket`): at the backward's end those of the last bucket, which the
    epilogue reduces (what the full ones leave, `_last_bucket_share`; it had been taken
    whole), and in the layers' and the embedding's backward a full one's, only where the
    rank's gradients overflow a bucket, which DeepSpeed reduces only when the next gradient
    would not fit (an audit: at 2e9 elements GPT 1.3B's 1.3e9 all wait for the epilogue,
    where its top layer's backward had held a flattened copy and its fp32 cast, 7.35 GiB,
    5.6 GiB over its peak). Where they do, the layers' instants, each the stage's top
    layer's, hold it though the first bucket fills some layers lower, with fewer activations
    saved: an upper bound by those layers' activations."""
    plan = b.plan
    size = plan.parallel.reduce_bucket
    if not size or plan.mode != "train":
        return
    buffers = _reduce_buffer(plan, 2)
    n = b.params.per_rank + b.params.expert_per_rank
    flattened = _flattened_bucket(b, vmin(size, n))
    if not buffers and not flattened:
        return
    # the epilogue's bucket, what the full ones leave (`_last_bucket_share`)
    last = _flattened_bucket(b, n - size * (-(-n // size) - 1))
    overflows = n > size
    for k, phase in enumerate(b.phases):
        forward = pass_within(phase.name) == "forward" and phase.name not in ("loss", "mtp")
        if forward or phase.name == "optimizer":
            continue
        # the loss's backward (its pass is the forward's) fills no bucket
        backward = pass_within(phase.name) == "backward"
        reduced = last if phase.name == "dp.grads" else []
        held = (*buffers, *reduced, *(when(flattened, overflows) if backward else []))
        instants = tuple(Instant(i.label, (*i.live, *held)) for i in phase.instants)
        b.phases[k] = replace(phase, instants=instants)


def _deepspeed_buckets(plan: Plan, n: Any) -> Any:
    """How many collectives DeepSpeed's ZeRO 2 and 3 reduce a rank's `n` gradients in, a
    backward's: one a bucket of ``reduce_bucket_size`` = B elements, flushed when the next
    gradient would overflow it, and a gradient larger than B alone
    (``reduce_independent_p_g_buckets_and_remove_grads``, stage_1_and_2.py and stage3.py),
    about ⌈n / B⌉ of them (near DeepSpeed's count, which its flushes at gradients' edges
    and its larger gradients alone move either way), each priced at its own size
    (`collectives.repeated`). An audit (m548): priced as one collective, Llama 3 8B over 64
    GPUs at B = 5e7 paid 0.55 ms of n·α a micro-batch, where its 161 buckets pay theirs
    each. 1 where the plan names no bucket."""
    size = plan.parallel.reduce_bucket
    if not size:
        return 1
    return vmax(-(-n // size), 1)


def _last_bucket_share(plan: Plan, n: Any) -> Any:
    """The share of a rank's `n` gradients in DeepSpeed's last bucket of a backward, which
    its epilogue reduces once the backward is done, exposed (``reduce_ipg_grads`` in
    ``independent_gradient_partition_epilogue``, then a ``torch.cuda.synchronize()`` under
    ``overlap_comm``, stage_1_and_2.py): a bucket is reduced only when the next gradient
    would overflow ``reduce_bucket_size`` = B (``reduce_independent_p_g_buckets_and_remove_
    grads``), so after ⌈n / B⌉ − 1 full ones the last holds n − B·(⌈n / B⌉ − 1), to a
    parameter's size (an audit: GPT 1.3B at B = 5e8 leaves a quarter of its gradients to the
    epilogue, and B ≥ n all of them, where one layer's share was exposed whatever B). 0
    where the plan names no bucket (`Parallel.reduce_bucket`)."""
    size = plan.parallel.reduce_bucket
    if not size:
        return 0.0
    full = -(-n // size) - 1
    return (n - size * full) / vmax(n, 1)


def _flattened_bucket(b: _StageBuilder, n: Any) -> list[Alloc]:
    """The copies DeepSpeed makes of a bucket of `n` gradients to reduce it. ZeRO 2
    flattens them into one tensor and all-reduces that (``allreduce_bucket``: ``tensor =
    self.flatten(bucket)``, a ``torch.cat`` copy in the parameters' format, the buffer's,
    stage_1_and_2.py; an audit: none counted, 1.0 GB at 5e8 bf16 elements), cast to the
    reduction's format where it differs (``communication_data_type``: ``tensor.to(...)``,
    both alive through the all-reduce; a review: 2.0 GB at 5e8 fp32). ZeRO 3 casts each
    gradient to that format where it differs, then ``reduce_scatter_coalesced``
    (deepspeed/runtime/comm/coalesced_collectives.py) lays every rank's chunks side by side
    with ``torch.cat``, one copy of the bucket in the reduction's format, whose chunk is
    the reduce-scatter's output, alive until the shard is copied into the partition
    (stage3.py ``__avg_scatter_grads``; an audit, m455: none counted, 1.29 GB under GPT
    1.3B's epilogue at a 2e9 bucket). (One tensor that divides the ranks is reduced in
    place; a bucket is many.)"""
    plan = b.plan
    prec, zero = plan.precision, plan.parallel.zero
    differs = prec.reduce != prec.params
    flattened = Alloc(
        "a gradient bucket flattened for its all-reduce (DeepSpeed's allreduce_bucket)",
        "transient",
        n * DTYPE_BYTES[prec.params],
    )
    cast = Alloc(
        f"the flattened bucket cast to {prec.reduce} for its all-reduce",
        "transient",
        n * DTYPE_BYTES[prec.reduce],
    )
    gradients_cast = Alloc(
        f"a gradient bucket cast to {prec.reduce} for its reduce-scatter", "transient", cast.total
    )
    interleaved = Alloc(
        "a gradient bucket laid out by rank for its reduce-scatter (DeepSpeed's "
        "reduce_scatter_coalesced)",
        "transient",
        cast.total,
    )
    held = when([flattened, *([cast] if differs else [])], holds(zero == 2)) + when(
        [*([gradients_cast] if differs else []), interleaved], holds(zero == 3)
    )
    return when(held, deepspeed_buffered(plan))


def _scores_buffer(plan: Plan, s: Shapes, layers: Any) -> tuple[Alloc, ...]:
    """Under eager attention, the scores' input buffer Megatron-LM keeps for the run
    (`layers.eager_scores`), on a stage that runs attention."""
    # held, as a tensor made before a phase and kept through it is named, so that no phase
    # reads as adding it (the phases table's "largest it adds": every phase named it)
    return tuple(when(eager_scores(plan, s, SCORES_BUFFER), layers > 0))


def _stage_shapes(plan: Plan, s: Shapes, sliding: Any, layers: Any) -> Shapes:
    """`s` with the share of a stage's layers whose attention slides (`flops._sliding`), so
    that a stage of full-attention layers is priced as one, however the model's others
    slide (Qwen's first layers attend fully, the rest slide)."""
    if not plan.model.window:
        return s
    return replace(s, sliding=sliding / vmax(layers, 1))


@dataclass(frozen=True, slots=True)
class _Layer:
    """What one transformer layer saves, the same on every stage: worked out once a step."""

    blocks: dict[str, list[Alloc]]  # per block, before recompute is applied
    attention: list[Alloc]  # `layers.layer_saved`: the attention block, recompute applied
    mlp: list[Alloc]  # the MLP block, recompute applied
    moe: list[Alloc]  # the MoE block, recompute applied
    # what the core attention computes and saves (`layers.core_attention`): eager's scores,
    # a fused kernel's statistics (and output halves), which selective recompute drops
    core: list[Alloc]
    params: dict[str, int]  # per block: parameters a rank holds (`_block_params`)
    zero3: dict[str, list[tuple[MoveGroup, int, int]]]  # per block: `_zero3_groups`
    # per kind of layer ("mlp", "moe"): its whole-layer ZeRO-3 unit's groups (`_layer_units`)
    units: dict[str, list[tuple[MoveGroup, int, int]]]
    per_rank: dict[str, int]  # per block: its whole layer's parameters per rank (a bucket)
    experts: int  # an MoE layer's expert parameters per rank
    kernels: _Kernels  # per block: its kernels, forward and backward
    # per block, under DeepSpeed's gradient buffer: its largest weight's elements a rank
    # (`_largest_weights`); empty without one
    largest: dict[str, Any]

    @classmethod
    def of(cls, plan: Plan, s: Shapes) -> _Layer:
        blocks = {
            "attention": attention_saved(plan, s),
            "mlp": mlp_saved(plan, s),
            "moe": moe_saved(plan, s) if plan.model.experts else [],
        }
        attention, mlp = layer_saved(plan, s)
        moe = when(blocks["moe"], lacks(plan.recompute == "full"))
        core = core_attention(plan, s)
        kinds = ("attention", "mlp", "moe") if plan.model.experts else ("attention", "mlp")
        kernels = _Kernels(plan)
        zero3 = {k: _zero3_groups(plan, k) for k in kinds}
        return cls(
            blocks,
            attention,
            mlp,
            moe,
            core,
            {k: _block_params(plan, k) for k in kinds},
            zero3,
            _layer_units(zero3),
            {k: layer_params(plan, moe=k == "moe").per_rank for k in kinds},
            layer_params(plan, moe=True).expert_per_rank,
            kernels,
            _largest_weights(plan, s, kernels, kinds),
        )


def _largest_weights(
    plan: Plan, s: Shapes, kernels: _Kernels, kinds: Sequence[str]
) -> dict[str, Any]:
    """Per block, the elements of its largest weight on one rank (k × n of its widest GEMM,
    `flops.gemm`'s dims; an expert's own), where DeepSpeed's gradient buffer holds the
    block's gradients (`_reduce_buffer`): autograd makes a weight's gradient whole and
    DeepSpeed's hook copies it into the buffer and frees it
    (``__add_grad_to_ipg_bucket``, stage3.py; ``copy_grads_in_partition``, stage_1_and_2.py),
    one weight at a time. Empty without a buffer."""
    if not plan.parallel.reduce_bucket:
        return {}
    return {
        k: largest([w.dims[1] * w.dims[2] for w in kernels.forward(k, s) if w.dims]) for k in kinds
    }


_FORWARD = {
    "attention": flops.attention_forward,
    "mlp": flops.mlp_forward,
    "moe": flops.moe_forward,
}


@dataclass(frozen=True, slots=True)
class _Kernels:
    """The kernels of one layer's blocks, forward and backward, the same on every stage of
    a step that has the block and its shapes: worked out once a step, as `_Layer` is. A
    sweep derives a stage per class, and counted (and `schedule.step_time` timed) each
    stage's own copy of the same kernels again."""

    plan: Plan
    # (block, pass) -> the shapes they were made for (held, so its id stays its own), works
    made: dict[tuple[str, str], list[tuple[Shapes, list[Work]]]] = field(default_factory=dict)

    def forward(self, block: str, s: Shapes) -> list[Work]:
        """`block`'s forward kernels (`flops.attention_forward`, `mlp_forward`,
        `moe_forward`) at shapes `s`."""
        return self._memo(block, "forward", s, lambda: _forward_kernels(self.plan, block, s))

    def backward(self, block: str, s: Shapes) -> list[Work]:
        """`block`'s backward kernels at shapes `s`: its forward again under full recompute
        (the attention core again under selective), then the gradients (`flops.backward_of`)."""
        return self._memo(block, "backward", s, lambda: _backward_kernels(self, block, s))

    def _memo(self, block: str, kind: str, s: Shapes, make: Callable[[], list[Work]]) -> list[Work]:
        """The works `make` makes for `block`'s `kind` pass at shapes `s`, made once; a copy
        of the list, as the callers add to theirs."""
        seen = self.made.setdefault((block, kind), [])
        for shapes_, works in seen:
            if shapes_ is s:
                return list(works)
        works = make()
        seen.append((s, works))
        return list(works)


def _forward_kernels(plan: Plan, block: str, s: Shapes) -> list[Work]:
    """`_Kernels.forward`: under ZeRO-3 and FP8 GEMMs the casts of the block's gathered
    weights first (`flops.fp8_gathered_weight_casts`), then its kernels."""
    works = _FORWARD[block](plan, s)
    if not flops.te_fp8(plan) or every(plan.parallel.zero < 3):  # no casts to weigh
        return works
    parts = ("shared", "experts") if block == "moe" else (block,)
    weights = sum(fp8_block_weights(plan, part) for part in parts)
    return [*flops.fp8_gathered_weight_casts(plan, block, weights), *works]


def _backward_kernels(kernels: _Kernels, block: str, s: Shapes) -> list[Work]:
    """`_Kernels.backward`: the recomputed forward of `block` under full recompute (and the
    attention core under selective recompute), then its input and weight gradients."""
    plan = kernels.plan
    work = kernels.forward(block, s)
    skipped = early_stop(plan, block)
    again = [w.scaled(1, f"{w.name} (recomputed)") for w in work if w.name not in skipped]
    redo = when(again, plan.recompute == "full")
    if block == "attention":
        core = flops.attention_core(plan, s)
        redo += when(
            [w.scaled(1, f"{w.name} (recomputed)") for w in core],
            plan.recompute == "selective",
        )
    joined = flops.qkv_gradients_joined(plan, s) if block == "attention" else []
    return redo + flops.backward_of(work) + joined + flops.fp8_gradient_casts(plan, s, block)


def early_stop(plan: Plan, block: str) -> frozenset[str]:
    """The forward kernels of `block` that a full recompute stopping early does not run
    again (``recompute_early_stop``: PyTorch's non-reentrant checkpoint, whose saved-tensor
    hook stops the recompute once every tensor the original forward saved is made again,
    ``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default from PyTorch 2.1).

    A layer is checkpointed whole, so its MLP (or MoE) block ends the recompute. fc2 calls
    ATen's linear, whose autograd node records its saved input and weight before the GEMM
    runs (``VariableType``'s generated code saves inputs before it redispatches), and that
    input, the activation's output, is already made; the residual add saves nothing. So
    neither runs again, nor, under tp, fc2's output collective (`_mlp_again`), unless
    something after fc2 saves what it makes: dropout's mask (``model.dropout``; the engine
    fuses it with the add, so the block runs again whole) or a post-norm's input
    (``model.sandwich_norm``: the add alone is skipped). An fp8 GEMM is Transformer Engine's
    module (`flops.te_fp8`), a ``torch.autograd.Function`` whose ``save_for_backward`` is
    packed once its forward has returned, after the GEMM and the reduce-scatter or
    all-reduce its forward runs inside (``_Linear.forward``): those run again, the add alone
    is skipped. (torchao's ``Float8Linear`` would differ: its tp collective runs in a module
    hook, which the stopped recompute never reaches; a review, m361.) An MoE block's combine
    saves the experts' outputs, so there the add alone is skipped too. An audit (m359)
    logged the ops PyTorch dispatches in the recompute of an MPT-shaped block under FSDP's
    ``checkpoint_wrapper`` (non-reentrant): no ``addmm`` for fc2, where the reentrant
    checkpoint runs it. Under tensor parallelism in Megatron-LM's and Transformer Engine's
    layers (`Parallel.tp_style` megatron) fc2 is such a Function whatever the format, and
    runs again (an audit, m511, logged it under ``torch.utils.checkpoint``: the Function's
    GEMM ran again where ``nn.Linear``'s did not), with its collective as Transformer
    Engine's ``_Linear`` runs it inside, Megatron-Core's default layers (Megatron-LM's local
    ``RowParallelLinear`` reduces after its GEMM's Function returns, which the stop would
    skip: a review, m514, and not priced apart); at tp 1 a
    plan stopping early is read as a PyTorch stack's, ``nn.Linear``, as under DTensor's
    styles. A sweep evaluates layouts at tp 1 and above apart (`search.structure`)."""
    if not plan.recompute_early_stop or plan.model.dropout or block == "attention":
        return frozenset()
    function = flops.te_fp8(plan) or _function_layers(plan)
    if block == "mlp" and not plan.model.sandwich_norm and not function:
        return frozenset({flops.MLP_FC2, flops.RESIDUAL_ADD})
    return frozenset({flops.RESIDUAL_ADD})


def _function_layers(plan: Plan) -> bool:
    """Whether the layers' GEMMs are ``torch.autograd.Function``s that save their inputs
    after they run (`early_stop`): Megatron-LM's and Transformer Engine's tensor-parallel
    layers, tp > 1 in their style."""
    return plan.parallel.tp_style == "megatron" and every(plan.parallel.tp > 1)


def _mlp_again(plan: Plan, s: Shapes) -> list[Move]:
    """The MLP block's tensor-parallel moves that its full recompute runs again (`_again`):
    all of its forward's, less fc2's output all-reduce or reduce-scatter where the recompute
    stops before fc2 (`early_stop`)."""
    row = "" if flops.MLP_FC2 in early_stop(plan, "mlp") else flops.MLP_FC2
    return _again(_tp_moves(plan, s, "MLP", False, "MLP fc1", row))


def _saved_per_microbatch(b: _StageBuilder) -> int:
    """Activation bytes one micro-batch leaves saved on this stage after its forward."""
    return _saved_by(b.layer, b.dense, b.moe)


def _saved_by(layer: _Layer, dense: int, moe: int) -> int:
    """Activation bytes `dense` dense and `moe` MoE layer passes leave saved."""
    attention = (dense + moe) * _total(layer.attention)
    return attention + dense * _total(layer.mlp) + moe * _total(layer.moe)


def _mtp_checkpoints(b: _StageBuilder) -> int:
    """Under full recompute, the layer-input checkpoints that a last stage's multi-token
    prediction layers, counted among its layers, do not keep: Megatron-Core checkpoints
    each whole module from its two inputs (``MultiTokenPredictionLayer`` runs
    ``_proj_and_transformer_layer`` under ``_checkpointed_forward``), which `_extra_saved`
    counts, so the input of its transformer layer is never saved: one for each micro-batch
    whose head's inputs are held (`outside_counts`). An audit: DeepSeek-V3 at tp 4 and
    4,096 tokens read 14,680,064 B a micro-batch high."""
    plan, mtp = b.plan, mtp_layers(b.plan)
    if not mtp:
        return 0
    _, headed = outside_counts(plan, b.in_flight, b.microbatches)
    unit = b.shapes.act * b.shapes.tokens_sp * b.shapes.hidden
    held: int = vwhere(holds(b.last & (plan.recompute == "full")), mtp * headed * unit, 0)
    return held


def _current_layer(b: _StageBuilder) -> list[Alloc]:
    """The saved tensors of the stage's last layer, itemised (the one being worked on)."""
    layer = b.layer
    return layer.attention + (layer.moe if b.last_is_moe else layer.mlp)


def _earlier(b: _StageBuilder, freed: int = 0) -> Alloc:
    """Everything saved on this stage except the current layer: the micro-batches in
    flight (`inflight`) times what one leaves saved, less the layer being worked on and
    the `freed` layer passes whose backward has run."""
    passes = vmax(0, vround(b.in_flight * b.layers) - 1 - freed)
    saved = b.saved_in_flight - (1 + freed) * _total(b.current_layer)
    return Alloc(
        f"{CARRIED_ACTIVATIONS}, {count_label(passes)} earlier layer passes",
        "activations",
        vmax(0, saved),
    )


def outside_counts(plan: Plan, in_flight: Any, microbatches: int) -> tuple[Any, Any]:
    """Micro-batches whose tensors outside the layers are alive at once: the embedding's on
    the first stage, the head's on the last. 1F1B and GPipe: those in flight (`inflight`).
    Interleaved (v > 1 chunks): the embedding sits in stage 0's first chunk, whose first
    backward comes after the other chunks' backwards of p micro-batches, (v - 1)·p of them,
    by when 2(v - 1)p + 2p - 1 forwards have run, holding 2p micro-batches' first chunk:
    min(m, 2p) (Megatron-LM's interleaved warm-up, `inflight`); the head sits in the last
    stage's last chunk, whose every forward is followed by its backward: one."""
    par = plan.parallel
    count = vmax(1, vround(in_flight))
    interleaved = holds(par.pipeline.schedule == "interleaved") & (par.pipeline.virtual_stages > 1)
    first = vwhere(interleaved, vmin(microbatches, 2 * par.pp), count)
    return first, vwhere(interleaved, 1, count)


def _root_held(b: _StageBuilder, at: Outside = "forward") -> list[Alloc]:
    """Under ZeRO-3 the gathered parameters outside the layers (`_zero3_root_moves`), held
    through the micro-batch; under a split root (`Parallel.fsdp_root`) the head's from its
    forward to its backward (the loss, `at` "head") and the embedding's in its backward
    (`at` "embedding"), each unit freed between."""
    par = b.plan.parallel
    n, name = _root_params(b), f"{_root_name(b)} parameters (ZeRO-3, {HELD_THROUGH} micro-batch)"
    if par.fsdp_root == "split":
        # kept from its forward (`Parallel.reshard_after_forward` off, which torchtitan
        # passes to the embedding's unit as to the layers'), the embedding is held on
        kept = not par.reshard_after_forward and b.first
        embedding = _outside_params(b, "embedding")
        if at == "head":
            n = _outside_params(b, "head") + embedding * kept
            name = "head parameters (an FSDP unit, forward to backward)"
            if kept:
                name = "head and embedding parameters (FSDP units, forward to backward)"
        elif at == "embedding" or kept:
            n = embedding
            name = "embedding parameters (an FSDP unit, gathered again for its backward)"
            if kept:
                name = "embedding parameters (an FSDP unit, kept to its backward)"
        else:
            n = 0  # each unit freed between its passes
    gathered = n * DTYPE_BYTES[outside_gather(b.plan)]
    held = Alloc(f"gathered {name}", "transient", gathered)
    return when([held], (par.zero == 3) & (par.zero_ranks > 1) & (gathered > 0))


def outside_gather(plan: Plan) -> str:
    """The format ZeRO-3 gathers the parameters outside the layers in (the embedding, the
    output layer, the final norm): ``precision.param_gather``, but never narrower than the
    16-bit copy a rank keeps of them under fp8 weights (`layers.resident_states`,
    `flops.VOCAB_WEIGHT_BYTES`): an fp8 gather is of the GEMM weights alone (torchao's
    ``enable_fsdp_float8_all_gather`` is of its ``Float8Linear`` modules, which leave the
    output layer out; Megatron-LM's ``--fp8-param-gather`` of Transformer Engine's), so
    these gather, and make their gradients, in bf16 (an audit, m501: the embedding and
    output layer of Llama 3 70B gathered at 1 byte a parameter, 1.96 GiB for 3.91)."""
    gathered = plan.precision.param_gather
    return gathered if DTYPE_BYTES[gathered] >= flops.VOCAB_WEIGHT_BYTES else "bf16"


def _outside_params(b: _StageBuilder, unit: str) -> Any:
    """Parameters a rank of the stage holds outside its layers (`unit` "root",
    `_root_params`), or under a split root (`Parallel.fsdp_root`) of one of its units: the
    "embedding", the first stage's input tables (`StageParams.lookup_per_rank`), and the
    "head", the rest."""
    embedding = b.params.lookup_per_rank if b.first else 0
    if unit == "embedding":
        return embedding
    root = _root_params(b)
    return root if unit == "root" else root - embedding


def _group_bytes(groups: Sequence[tuple[MoveGroup, Any, Any]], size: Any) -> Any:
    """`size` bytes for each parameter a rank gathers of ZeRO-3's `groups` (group, ranks,
    parameters per rank): none on a group of one rank, which gathers nothing."""
    return sum(n * size * (ranks > 1) for _, ranks, n in groups)


def _kept_gathered(b: _StageBuilder, fewer: int = 0) -> list[Alloc]:
    """ZeRO 3 with `Parallel.reshard_after_forward` off (FSDP1's SHARD_GRAD_OP, FSDP2's
    ``reshard_after_forward=False``): each unit stays gathered from its forward to its
    backward, after which FSDP frees it (``_post_backward`` reshards), so every layer of the
    stage is held gathered through the layers' forward (the last layer's, which the
    instants price), the loss and the first backward; `fewer` layers less once their
    backward is done (`_zero3_layer_below`). It holds what the gathered and prefetched
    units would (`_zero3_transients`), which it replaces. ZeRO 3 has no pipeline here
    (`resolve._check_pipeline_zero3`)."""
    plan, layer = b.plan, b.layer
    if plan.parallel.reshard_after_forward:
        return []
    size = DTYPE_BYTES[plan.precision.param_gather]

    def gathered(block: str) -> Any:
        return _group_bytes(layer.zero3.get(block, []), size)

    n = b.layers * gathered("attention") + b.dense * gathered("mlp") + b.moe * gathered("moe")
    n = n - fewer * gathered("attention") - fewer * gathered(b.ffn)
    kept = Alloc(
        "gathered parameters of the stage's layers (kept until their backward)", "transient", n
    )
    return when([kept], (plan.parallel.zero == 3) & (n > 0))


Outside = Literal["forward", "head", "backward", "embedding"]


def _extra_saved(b: _StageBuilder, at: Outside, root: bool = True) -> list[Alloc]:
    """Per micro-batch tensors outside the layers (Korthikanti section 4.3): the embedding
    dropout mask on the first stage; the final norm and output-layer inputs on the last,
    each for the micro-batches `outside_counts` finds alive, and the cross-entropy's saved
    fp32 softmax (4sbv/t, section 4.3) of each of them but the one `_loss` works on (under
    GPipe every forward, its loss too, runs before the first backward: m - 1 of them; 1F1B
    runs each loss's backward at once: none); under ZeRO-3 the gathered parameters
    outside the layers (`_root_held`), unless `root` is false.

    The micro-batch being worked on holds its own only while they exist (`at`, where in
    its pass): its head's inputs from the head's forward to its backward (``head``: the
    loss and the multi-token prediction phases; in the layers' forward they are not made
    yet, in their backward autograd has freed them), its embedding dropout mask from the
    embedding's forward until the dropout's backward, which runs before the embedding's
    weight gradient (``embedding``). An audit: both were counted for it everywhere, on
    Llama 3 405B at 128K tokens the last stage's peak 64 MiB high."""
    s, plan = b.shapes, b.plan
    embedded, all_headed = outside_counts(plan, b.in_flight, b.microbatches)
    # with multi-token prediction the last stage's last layer pass is a module's own layer,
    # run once the head's inputs are made, and its first backward, before they are freed
    # (an audit): there they are held in the layer phases too, counted whole (a few
    # hidden-size tensors over the moment's own, as its norms' outputs are gone)
    module_layer = holds(b.last & (mtp_layers(plan) > 0)) & (at in ("forward", "backward"))
    headed = all_headed - ((at != "head") & lacks(module_layer))
    embedded = embedded - (at == "embedding")
    res = residual_placement(plan)
    out = _root_held(b, at) if root else []
    # the layers' parameters, kept gathered from their forward to their backward (none
    # once the layers' backward is done, at the embedding's)
    out += b.kept_gathered if at != "embedding" else []
    if b.first and plan.model.dropout:
        mask = Alloc(
            "embedding dropout mask",
            "activations",
            s.tokens_sp * s.hidden,
            count=embedded,
            placement=res,
        )
        out += when([mask], embedded > 0)
    if b.last:
        size = s.act * s.tokens_sp * s.hidden
        tokens, placed = column_input(plan, s)  # whole under DTensor's styles
        head = [
            Alloc("final norm input", "activations", size, count=headed, placement=res),
            Alloc(
                "output layer input",
                "activations",
                s.act * tokens * s.hidden,
                count=headed,
                placement=placed,
            ),
        ]
        mtp = mtp_layers(plan)
        if mtp:
            # per module: the inputs of its two norms, of its 2·hidden projection, of its
            # final norm and of the output layer (sequence-sharded under sequence
            # parallelism, as the projection re-gathers its input for the weight gradient).
            # Under sequence parallelism the module's layer input (its first norm's, counted
            # with the layer's) is a slice of the projection's output all-gathered over tp:
            # Megatron-Core's ``_concat_embeddings`` gathers it whole
            # (``gather_from_tensor_model_parallel_region``) and splits it along the sequence
            # (``scatter_to_sequence_parallel_region``, whose ``.contiguous()`` on a slice of
            # the first dimension returns the view), so the norm saving the slice keeps the
            # whole tensor, tp − 1 shards more (an audit, m466: 42 MiB a micro-batch on
            # DeepSeek-V3 at tp 4, 4,096 tokens; the embedding's split is cloned,
            # ``clone_scatter_output_in_embedding``, the module's is not)
            gathered = vwhere(holds(_sp(plan)), plan.parallel.tp - 1, 0)
            head.append(
                Alloc(
                    "multi-token prediction inputs (norms, projection, output layer)",
                    "activations",
                    # full recompute keeps only the hidden state, the next tokens'
                    # embedding and the output layer input (`_checkpointed_forward`)
                    vwhere(
                        holds(plan.recompute == "full"),
                        mtp * 3 * size,
                        mtp * (6 + gathered) * size,
                    ),
                    count=headed,
                    placement=res,
                )
            )
        out += when(head, headed > 0)
        others = all_headed - 1
        logits = s.tokens * loss_rows(plan)
        # what `_loss` keeps of each cross-entropy for its backward, main head and MTP's:
        # the fp32 softmax, and the soft-capped logits for the tanh backward; PyTorch's
        # pipeline schedule keeps each one's logits too, the last stage's output
        # (`_entropy_passes`), gathered whole on every tp rank where the loss gathers them
        pytorch = plan.loss != "megatron"
        kept = (4 + (s.act if plan.model.logit_softcap else 0) + (s.act if pytorch else 0)) * logits
        out += when(
            [
                Alloc(
                    "cross-entropy softmax (fp32)"
                    + (" and logits" if pytorch else "")
                    + " of the other micro-batches in flight, kept for their backward",
                    "activations",
                    kept * (1 + mtp),
                    count=others,
                    placement=_loss_placement(plan),
                )
            ],
            others > 0,
        )
    return out


def _cp_buffers(plan: Plan, s: Shapes, backward: bool = False) -> list[Alloc]:
    """K/V of other context-parallel ranks while attention runs. On the ring, Transformer
    Engine's ``AttnFuncWithCPAndKVP2P.forward`` keeps every chunk it receives (a list of
    cp buffers, the first a copy of its own K/V) and each step's partial output and fp32
    softmax statistics until the correction after the last step, all alive at the end of
    the forward: cp of each, every step's output whole on the rank that sees the most keys
    under the causal split (the last); its backward holds two K/V chunks and two dK/dV
    chunks in flight (one computed on, one arriving) and the step's own dQ, dK and dV
    until they are added into the totals. All-gathered, the whole sequence's
    K/V, and in backward its dK/dV before the reduce-scatter
    (``AttnFuncWithCPAndKVAllGather``)."""
    if every(plan.parallel.cp == 1):
        return []
    return when(_cp_held(plan, s, backward), plan.parallel.cp > 1)


def _cp_reorder(plan: Plan, s: Shapes) -> list[Alloc]:
    """All-gathered context parallelism's reorder of the gathered K and V into sequence
    order before the core: Transformer Engine's ``AttnFuncWithCPAndKVAllGather.forward``
    runs ``torch.index_select`` on the gathered K, then on V, each a copy beside both
    gathered (an audit: 32 MiB of the 128K plan's forward uncounted). None on the ring,
    whose chunks arrive in the order they are used."""
    if every(plan.parallel.cp == 1) or plan.parallel.cp_attention != "allgather":
        return []
    copy = Alloc(
        "K or V reordered (index_select's copy)",
        "transient",
        s.act * s.micro * s.seq_kv * vmax(s.k_cols, s.v_cols),
        placement="replicate on cp",
    )
    return when([copy], plan.parallel.cp > 1)


def _cp_held(plan: Plan, s: Shapes, backward: bool) -> list[Alloc]:
    """`cp_held`'s buffers for cp > 1, sized as its docstring reads Transformer Engine."""
    ring = plan.parallel.cp_attention == "ring"
    if ring and not backward:
        cp, place = plan.parallel.cp, "shard(0) on cp"
        return [
            Alloc(
                "K/V ring buffers (one per cp rank)",
                "transient",
                cp * s.act * s.tokens * (s.k_cols + s.v_cols),
                placement=place,
            ),
            Alloc(
                "ring step outputs (one per cp rank)",
                "transient",
                cp * s.act * s.tokens * s.out_cols,
                placement="shard(heads) on tp",
            ),
            Alloc(
                "ring step softmax statistics (fp32)",
                "transient",
                cp * 4 * s.tokens * s.heads,
                placement="shard(heads) on tp",
            ),
        ]
    if ring:
        chunk = 2 * s.act * s.tokens * (s.k_cols + s.v_cols)
        name, placement = "K/V ring buffers (2 chunks)", "shard(0) on cp"
    else:
        chunk = s.act * s.micro * s.seq_kv * (s.k_cols + s.v_cols)
        name, placement = "K/V all-gathered", "replicate on cp"
    held = [Alloc(name, "transient", chunk, placement=placement)]
    if backward:  # on the ring, each chunk's gradient; gathered, every rank's partial sum
        grads = "dK/dV ring buffers (2 chunks)" if ring else "dK/dV before reduce-scatter"
        held.append(
            Alloc(grads, "transient", chunk, placement=placement if ring else "partial on cp")
        )
    if backward and ring:
        # each step's kernel returns its own dQ, dK and dV (``dq_, dk_, dv_``), added into the
        # totals (``dq_buffer``, the dK/dV chunk) after it: at the last, diagonal step all
        # three over the rank's whole chunk (an audit: none counted, where the all-gathered
        # mode's ``dq_per_step`` was)
        held.append(
            Alloc(
                "one ring step's dQ, dK and dV (before they are added in)",
                "transient",
                s.act * s.tokens * (s.q_cols + s.k_cols + s.v_cols),
                placement="shard(heads) on tp",
            )
        )
    if backward and not ring:
        # Transformer Engine's two steps (one per local query chunk of the load-balanced
        # split) each return dK/dV over the keys they see, added into the whole after both:
        # chunks r + 1 and 2·cp - r of the 2·cp, the whole sequence and one chunk more (an
        # audit; ``dk_per_step``)
        cp = plan.parallel.cp
        steps = Alloc(
            "dK/dV of the two steps (their keys' range)",
            "transient",
            chunk * (2 * cp + 1) // (2 * cp),
            placement="partial on cp",
        )
        # and each step's dQ, kept in a list until the backward returns (``dq_per_step``),
        # and the reordered copy ``torch.index_select`` makes of the whole dV beside it
        # before the reduce-scatter, the dK's made before it (an audit: neither counted)
        per_step = Alloc(
            "dQ of the two steps (dq_per_step)",
            "transient",
            s.act * s.tokens * s.q_cols,
            placement="shard(heads) on tp",
        )
        reordered = Alloc(
            "dV reordered (index_select's copy)",
            "transient",
            s.act * s.micro * s.seq_kv * s.v_cols,
            placement="partial on cp",
        )
        held += [steps, per_step, reordered]
    return held


def dispatch_buffers(plan: Plan, s: Shapes, training: bool = False) -> Alloc:
    """The all-to-all's send and receive buffers, as Megatron-Core's
    ``MoEAlltoAllTokenDispatcher`` permutes and exchanges them, before the etp all-gather
    (whose rows the experts' own activations count): the token rows one rank dispatches
    (tokens·k·capacity) and the rows it receives, as many under balanced routing and the
    routing skew times more on the busiest rank (`flops.routing_skew`). When every tp
    rank holds the same tokens nothing is exchanged or gathered and the buffers hold the
    rows the rank's experts take, permuted in and out of their order. In `training`, where
    the experts save their input, the received rows are that input when nothing gathers or
    sorts them (etp 1, one expert a rank: ``dispatch_postprocess`` hands them on) and the
    experts save them as they are, not Transformer Engine's FP8 copy (`saved_gemm_input`),
    counted there (an audit: counted twice; a review: under FP8 they are two tensors)."""
    replicated = tokens_replicated(plan)
    handed_on = (plan.parallel.expert_tp == 1) & (s.local_experts == 1) & lacks(replicated)
    handed_on = handed_on & (not te_fp8(plan))
    received: Any = vwhere(holds(training & handed_on), 0, s.dispatched)
    rows = s.act * vwhere(replicated, 2 * s.routed, s.sent + received) * s.hidden
    # on one expert-parallel rank the all-to-all hands its input back (Megatron-Core's
    # `_AllToAll` on a group of one); the rows are permuted, then sorted by local expert (an
    # audit: they were called send and receive buffers beside no all-to-all)
    alone = every(plan.parallel.ep == 1)
    # held within the tp group, or on one expert-parallel rank; an ep group across the dp
    # replicas exchanges them still (an audit, m467: "no exchange" beside its all-to-all)
    kept = every(holds(replicated) & holds(experts_inside_tp(plan) | (plan.parallel.ep == 1)))
    return Alloc(
        "routed token rows, permuted for the rank's experts and back (no exchange)"
        if kept
        else "routed token rows, permuted and sorted by expert (ep 1: no exchange)"
        if alone
        else "dispatch send and receive buffers",
        "transient",
        rows,
        placement="shard(tokens) on ep",
    )


def _combined(plan: Plan, s: Shapes, held: list[Alloc]) -> list[tuple[str, list[Alloc]]]:
    """The moments of the experts' output on its way back to its tokens, each with what it
    holds beside `held` (Megatron-Core's ``MoELayer`` and ``MoEAlltoAllTokenDispatcher``;
    audits: the forward had no instant past the experts' GEMMs). ``combine_preprocess``
    sorts the output's rows back to their ranks' order (a copy, where a rank holds more than
    one expert: ``sort_chunks_by_idxs``) and reduce-scatters them over the
    expert-tensor-parallel group into a buffer of its own, ``expert_output`` alive
    throughout; then the combine all-to-all writes the rows this rank sent into a fresh
    buffer, and the un-permute scatters them into its tokens, its input (the all-to-all's
    input, which the caller still holds) alive beside both; on one expert-parallel rank
    the all-to-all hands its input back."""
    rows = "shard(tokens) on ep"
    a, hidden = s.act, s.hidden
    output = Alloc("expert output (fc2)", "transient", a * s.routed * hidden, placement=rows)
    local = s.local_experts > 1
    etp = (plan.parallel.expert_tp > 1) & lacks(tokens_replicated(plan))
    ordered = replace(output, name="expert output, sorted back to its ranks' order")
    scattered = Alloc(
        "expert output (reduce-scattered over etp)",
        "transient",
        a * s.dispatched * hidden,
        placement=rows,
    )
    # what the all-to-all reads: the reduce-scattered rows, or the sorted ones, or the output
    sent = when([scattered], etp) + when([ordered], local & lacks(etp))
    sent += when([output], lacks(local) & lacks(etp))
    back = Alloc("combine all-to-all output", "transient", a * s.sent * hidden, placement=rows)
    # on one expert-parallel rank the all-to-all hands its input back (`dispatch_buffers`; a
    # review: a buffer that never exists was counted beside it)
    back_rows = when([back], plan.parallel.ep > 1)
    tokens = Alloc(
        "expert output, un-permuted to its tokens", "transient", a * s.tokens_sp * hidden
    )
    return [
        (
            "expert output combine",
            [output, *when([ordered], local), *when([scattered], etp), *held],
        ),
        ("combine un-permute", [*sent, *back_rows, tokens, *held]),
    ]


def shared_output(s: Shapes) -> list[Alloc]:
    """The shared experts' output, made before the routed experts run and alive until the
    combine adds it to theirs (Megatron-Core's ``MoELayer``; vLLM's ``DeepseekMoE.forward``
    computes ``shared_output`` first and adds it after ``fused_moe``; an audit: no instant
    held it)."""
    output = Alloc("shared experts' output", "transient", s.act * s.tokens_sp * s.hidden)
    return when([output], s.shared_cols > 0)


def _expert_backward(plan: Plan, s: Shapes) -> list[tuple[str, list[str], list[Alloc]]]:
    """The moments of an MoE block's backward, as autograd runs the forward's operations in
    reverse: each a label, the block's saved tensors its backward has consumed and freed by
    then, and the gradients alive beside the output gradient. The un-permute's backward
    gathers the output gradient into the rows this rank sent, the combine all-to-all's
    returns them to the experts' ranks, the reduce-scatter's (an all-gather) and the sort's
    (a copy) widen and reorder them; fc2's backward writes its input's gradient, the
    activation's its input's (the fp32 row probabilities' beside it), fc1's the token rows'
    (Megatron-Core's ``TEGroupedMLP``), which the dispatch's all-to-all and permute send
    back. The dispatch buffers of the forward are not saved for it (an audit: one instant
    held every one of these gradients and those buffers at once, over and under the true
    peak by turns)."""
    rows, a = "shard(tokens) on ep", s.act
    etp = (plan.parallel.expert_tp > 1) & lacks(tokens_replicated(plan))
    local = s.local_experts > 1
    width = a * s.routed * s.expert_cols

    def grad(name: str, size: Any) -> Alloc:
        return Alloc(name, "transient", size, placement=rows)

    sent = grad("output gradient rows (un-permuted's backward)", a * s.sent * s.hidden)
    scattered = grad(
        "expert output gradients (before the etp all-gather)", a * s.dispatched * s.hidden
    )
    output = grad("expert output gradients", a * s.routed * s.hidden)
    ordered = grad("expert output gradients, sorted by expert", a * s.routed * s.hidden)
    fc2_in = grad("expert fc2 input gradient", width)
    activation = grad("expert activation gradient", plan.model.gate * width)
    weights = grad("expert row probabilities' gradient (fp32)", 4 * s.routed)
    doubled = _squared(plan, "expert squared ReLU's 2·x", width, rows)
    tokens = grad("dispatched token gradients", a * s.routed * s.hidden)
    mask = ["MoE dropout mask"]
    fc2_saved = [*mask, "expert fc2 input"]
    fc1_saved = [*fc2_saved, "expert fc1 output", "expert row probabilities (fp32)"]
    returned = when([scattered], etp) + when([output], lacks(etp))
    widened = when(
        [output, *when([ordered], local), *when([scattered], etp & lacks(local))], local | etp
    )
    moments = [
        ("combine gradients", mask, [sent, *returned]),
        ("expert output gradients", mask, widened),
        ("expert fc2 gradients", mask, [output, fc2_in]),
        ("expert activation gradients", fc2_saved, [fc2_in, activation, weights, *doubled]),
        ("expert fc1 gradients", fc1_saved, [activation, tokens]),
        ("dispatch gradients", [*fc1_saved, "dispatched tokens"], [tokens, sent]),
    ]
    return [(label, spent, live) for label, spent, live in moments if live]


def _shared_expert_moves(plan: Plan, s: Shapes, backward: bool) -> list[Move]:
    """Shared experts are a dense MLP beside the routed ones: its tensor-parallel moves."""
    if not every(s.shared_cols > 0):
        return []
    return _tp_moves(plan, s, "shared expert", backward, "shared expert fc1", "shared expert fc2")


def _ep_moves(plan: Plan, s: Shapes, backward: bool, stage: Any = 0) -> list[Move]:
    """Expert parallelism: the router's token rows go to the ranks that hold their experts
    and come back (GShard, Lepikhin et al., arXiv 2006.16668, section 3.2): an all-to-all on
    the ep group for dispatch and one for combine, and their mirror images in backward.
    Each rank holds tokens·k·capacity rows of `hidden`, so S, the whole redistributed
    tensor, is ep times that; under routing skew (`flops.routing_skew`) the busiest rank
    receives more, and the exchange, which ends when it has, is priced at its rows. Exposed
    unless `overlap.ep` hides them behind another micro-batch's compute: Megatron-Core's
    combined 1F1B runs one micro-batch's forward of a layer beside another's backward, "EP
    A2A in forward step is hidden by the attention/mlp computation in the backward step,
    and vice versa", as DeepSeek-V3's DualPipe pairs them (its Figure 4): the forward's
    dispatch and combine behind one MoE layer's backward (its attention and its MoE block),
    the backward's behind one layer's forward (an audit: they hid behind their own phase's
    expert GEMMs, 25.7 ms of DeepSeek-V3's 38.2 ms a layer exposed against about 12). Only
    a forward with a backward beside it does, and the warm-up's forwards and the cool-down's
    backwards run alone: of stage r's m·v chunk passes (v virtual stages, the interleaved
    schedule, which a pipeline needs for the overlap), W = 2(p − r − 1) + (v − 1)·p + 1
    (Megatron-Core's ``get_pp_rank_microbatches``, its micro-batch group of p, and one more
    under ``overlap_moe_expert_parallel_comm``), without a pipeline 1 of m (the combined
    1F1B's first forward): a share q = 1 − W/(m·v) pairs (an audit, m457: plain 1F1B's
    (m − p)/m had been taken for every stage, stage 3 of 4 at v 2 exposing 8 of 64 passes
    where 5 run alone). The others wait for all of theirs, so a pass's all-to-alls T beside a window
    W expose q·max(0, T − W) + (1 − q)·T = max((1 − q)·T, T − q·W), the window's share q and
    the floor 1 − q (a review: the share alone read 0 wherever W passed T).

    An expert split over etp > 1 ranks needs every row on each: an all-gather over etp
    after dispatch and a reduce-scatter before combine, with or without ep. When every tp
    rank already holds all the tokens (no sequence parallelism, serving only) nothing is
    gathered and one all-reduce over tp sums the block's output
    (`layers.tokens_replicated`); nor is anything sent to experts inside the tp group
    (`layers.experts_inside_tp`).

    In training, Megatron-Core 0.13.1's all-to-all dispatcher (``MoEAlltoAllTokenDispatcher``)
    moves the routing probabilities beside the rows (an audit): a second all-to-all over ep
    of one value a row (``token_dispatch``), its gradient's back in the backward, and over
    etp > 1 their all-gather (``dispatch_postprocess``), a reduce-scatter in the backward;
    and unless every expert takes its whole capacity it first all-gathers each rank's
    count of rows per expert (int64) over the expert tensor- and expert-parallel ranks
    together (``preprocess``, ``tp_ep_group``), which the all-to-all's splits wait for."""
    par = plan.parallel
    if plan.model.experts is None:
        return []
    size = s.act * s.dispatched * s.hidden * par.ep
    dtype = plan.precision.activations
    # the busiest rank receives its experts' rows and sends the even share (dispatch, and
    # the combine's gradient), or sends those rows back and receives its own (combine, and
    # the dispatch's gradient)
    even = vwhere(s.dispatched > 0, s.sent / vmax(s.dispatched, 1), 1.0)
    names = ("combine gradient", "dispatch gradient") if backward else ("dispatch", "combine")
    beside = "forward" if backward else "backward"
    # the chunk passes whose forward has another's backward beside it (docstring)
    v = par.pipeline.virtual_stages
    passes = plan.microbatches * v
    paired = 1 - vmin(ep_alone(stage, par.pp, v), passes) / passes
    rule = (
        f"ep all-to-all: exposed unless overlap.ep hides it behind another micro-batch's "
        f"{beside} of a layer (combined 1F1B), in the micro-batches that pair them"
    )

    def exchange(name: str, nbytes: Any, received: bool) -> Move:
        move = Move(
            name,
            "all-to-all",
            "ep",
            par.ep,
            dtype,
            nbytes,
            "shard(1)",
            "shard(0)",
            sent_share=even if received else 1.0,
            recv_share=1.0 if received else even,
        )
        return hide(move, f"@{beside}-layer", "ep", rule, share=paired, floor=1 - paired)

    exchanged = holds(par.ep > 1) & lacks(experts_inside_tp(plan))
    training = plan.mode == "train"
    moves = when(
        [
            exchange(f"MoE {name}", size, got)
            for name, got in zip(names, (True, False), strict=True)
        ],
        exchanged,
    )
    # Megatron-Core's routing probabilities: out with the dispatch, back with its gradient
    prob = exchange(
        "MoE probabilities" + (" gradient" if backward else ""),
        s.act * s.dispatched * par.ep,
        not backward,
    )
    probs = when([prob], exchanged & training)
    etp = par.expert_tp
    replicated = tokens_replicated(plan)
    rows = s.act * s.routed * s.hidden
    # backward: the output rows' gradient is gathered, the input rows' gradient scattered
    gathered, scattered = (
        ("expert output rows gradient", "expert input rows gradient")
        if backward
        else ("expert input rows", "expert output rows")
    )
    gather = Move(
        gathered,
        "all-gather",
        "etp",
        etp,
        dtype,
        rows,
        "shard(0)",
        "replicate",
        rule="etp: exposed, the experts need it",
    )
    scatter = Move(
        scattered,
        "reduce-scatter",
        "etp",
        etp,
        dtype,
        rows,
        "partial",
        "shard(0)",
        # forward: before the combine; backward: before the dispatch's gradient exchange
        # (it read "before combine" there too: an audit)
        rule="etp: exposed before " + ("the dispatch's gradient" if backward else "combine"),
    )
    reduce = Move(
        "MoE output",
        "all-reduce",
        "tp",
        par.tp,
        dtype,
        s.act * s.tokens * s.hidden,
        "partial",
        "replicate",
        rule="tp: exposed, the next layer needs it",
    )
    gathered_probs = Move(
        "MoE probabilities" + (" gradient" if backward else "") + " (etp)",
        "reduce-scatter" if backward else "all-gather",
        "etp",
        etp,
        dtype,
        s.act * s.routed,
        "partial" if backward else "shard(0)",
        "shard(0)" if backward else "replicate",
        rule=scatter.rule if backward else gather.rule,
    )
    split = lacks(replicated) & (etp > 1)
    gathers = when([gather], split) + when([gathered_probs], split & training)
    experts = plan.model.experts
    counted = (par.ep * etp > 1) & training & (not experts.pad_to_capacity)
    # each rank's rows per routed expert (int64), which the all-to-all's splits wait for,
    # over the expert tensor- and expert-parallel ranks, named as the report names that group
    # (`report.group_name`: tp_ep, or ep where etp is 1; an audit read "tp_ep" beside "ep 8")
    over = "ep" if isinstance(etp, int) and etp == 1 else "tp_ep"
    counts = Move(
        "MoE routing counts",
        "all-gather",
        "ep",
        par.ep * etp,
        "int64",
        8 * experts.count * par.ep * etp,
        "shard(0)",
        "replicate",
        rule=f"{over}: exposed, the all-to-all's splits wait for it",
    )
    head = when([counts], counted) if not backward else []
    if backward:  # the combine's gradient first, the dispatch's (and the probabilities') last
        scatters = when([scatter], split) + gathers[1:]
        return [
            *moves[:1],
            *gathers[:1],
            *scatters,
            *moves[1:],
            *probs,
            *when([reduce], replicated),
        ]
    scatters = when([scatter], split)
    return [*head, *moves[:1], *probs, *gathers, *scatters, *moves[1:], *when([reduce], replicated)]


def _zero3_groups(plan: Plan, block: str) -> list[tuple[MoveGroup, int, int]]:
    """(group, ranks, parameters per rank) a block's ZeRO-3 gathers run over: the
    non-expert weights over dp x cp, expert weights over the expert data-parallel group."""
    par = plan.parallel
    attention = attention_params(plan)[1]
    layer = layer_params(plan, moe=block == "moe")
    own = attention if block == "attention" else layer.per_rank - attention
    groups: list[tuple[MoveGroup, int, int]] = [("dp", par.zero_ranks, own)]
    if block == "moe":
        groups.append(("edp", expert_data_parallel(plan), layer.expert_per_rank))
    return [(g, r, n) for g, r, n in groups if not every(r == 1) and not every(n == 0)]


def _layer_units(
    zero3: dict[str, list[tuple[MoveGroup, int, int]]],
) -> dict[str, list[tuple[MoveGroup, int, int]]]:
    """Per kind of layer (dense "mlp", "moe"), what a whole-layer ZeRO-3 unit
    (`Parallel.fsdp_unit` layer) gathers: the attention's groups and the feed-forward
    block's together, group by group (an MoE layer's experts on their own group, as FSDP
    shards them over another mesh)."""
    units: dict[str, list[tuple[MoveGroup, int, int]]] = {}
    for ffn in [k for k in ("mlp", "moe") if k in zero3]:
        merged: dict[MoveGroup, tuple[int, int]] = {}
        for group, ranks, n in zero3["attention"] + zero3[ffn]:
            merged[group] = (ranks, merged.get(group, (ranks, 0))[1] + n)
        units[ffn] = [(group, ranks, n) for group, (ranks, n) in merged.items()]
    return units


def _unit_groups(
    plan: Plan, layer: _Layer, block: str, backward: bool, ffn: str
) -> list[tuple[MoveGroup, int, int]]:
    """The ZeRO-3 groups `block`'s phase gathers (and in the backward reduce-scatters):
    the block's own (`Parallel.fsdp_unit` block), or under whole-layer units the layer's
    (`_layer_units`, a layer of feed-forward block `ffn`) at its first block of each pass,
    the attention's forward and the feed-forward block's backward, and none at the other."""
    if plan.parallel.fsdp_unit != "layer":
        return layer.zero3[block]
    if backward:
        return layer.units[block] if block != "attention" else []
    return layer.units[ffn] if block == "attention" else []


def _block_params(plan: Plan, block: str) -> int:
    """Parameters of one block (attention, mlp or moe with its experts) a rank holds."""
    attention = attention_params(plan)[1]
    if block == "attention":
        return attention
    layer = layer_params(plan, moe=block == "moe")
    return layer.per_rank - attention + (layer.expert_per_rank if block == "moe" else 0)


def _accumulate(b: _StageBuilder, block: str) -> list[Work]:
    """What the block's weight gradients go through after their GEMMs (`_gradient_passes`,
    under FSDP on each group that shards them: the experts' on the expert data-parallel
    group), and under FSDP the copies around the backward's gather of it again
    (`_gather_copies`)."""
    layer, par = b.layer, b.plan.parallel
    n = layer.params[block]
    groups = [(par.zero_ranks, n)]
    if block == "moe":
        groups = [
            (par.zero_ranks, n - layer.experts),
            (expert_data_parallel(b.plan), layer.experts),
        ]
    copies = _gather_copies(b.plan, layer, block, True, b.ffn)
    return copies + _gradient_passes(b, n, groups)


def _gather_copies(
    plan: Plan, layer: _Layer, block: str, backward: bool = False, ffn: str = "mlp"
) -> list[Work]:
    """Under FSDP's mixed precision, the copies around each all-gather `block`'s phase runs
    (`_unit_groups`; `flops.fsdp_gather_copies`), on each group that shards them (the
    experts' on the expert data-parallel group)."""
    fsdp = flops.fsdp_mixed(plan)
    if fsdp is False or (backward and not plan.parallel.reshard_after_forward):
        return []  # (a unit kept gathered since its forward gathers nothing again)
    groups = _unit_groups(plan, layer, block, backward, ffn)
    shard = sum(-(-n // ranks) * (ranks > 1) for _, ranks, n in groups)
    gathered = _group_bytes(groups, 1)
    return when(flops.fsdp_gather_copies(plan, shard, gathered), fsdp)


def _root_gather_copies(b: _StageBuilder, unit: str = "root") -> list[Work]:
    """`_gather_copies` of the root unit (`_root_params`), gathered once per micro-batch,
    or under a split root (`Parallel.fsdp_root`) of its `unit`, "embedding" or "head"."""
    fsdp = flops.fsdp_mixed(b.plan)
    if fsdp is False:
        return []
    par = b.plan.parallel
    ranks = par.zero_ranks
    n = _outside_params(b, unit) * (ranks > 1)
    return when(flops.fsdp_gather_copies(b.plan, -(-n // ranks), n), fsdp)


def _gradient_passes(
    b: _StageBuilder, params: Any, groups: Sequence[tuple[Any, Any]] | None = None
) -> list[Work]:
    """Every micro-batch's weight gradients of `params` parameters after their GEMMs:
    PyTorch FSDP's flattening, casts and divides under its mixed precision
    (`flops.fsdp_gradient_passes`, for each (ranks, parameters) of `groups` that shards
    them, by default all of them over dp x cp), else the addition into the main gradients
    (`flops.grad_accumulation`)."""
    plan = b.plan
    par = plan.parallel
    fsdp = flops.fsdp_mixed(plan)
    if fsdp is False:
        return flops.grad_accumulation(plan, params)
    passes = [
        work
        for ranks, n in groups or [(par.zero_ranks, params)]
        for work in flops.fsdp_gradient_passes(plan, n, ranks, b.microbatches)
    ]
    return when(passes, fsdp) + when(flops.grad_accumulation(plan, params), lacks(fsdp))


def _head_params(b: _StageBuilder) -> Any:
    """The parameters of the last stage's root unit whose gradient passes follow the loss
    (`_gradient_passes`): the output layer (or the tied embedding it is) and the final norm.
    With the first stage's input tables (`_embedding_gradients`) and the multi-token
    prediction modules' own (priced with them) they are the root unit's `_root_params`,
    whose reduce-scatter the passes feed: FSDP flattens, casts and divides the gradient of
    the unit's whole flat parameter (`flops.fsdp_gradient_passes`). An audit: the loss
    passed the output layer's alone, and MPT 760M's root unit of 80,514,048 parameters
    (a tied embedding of 50,368 x 1,536, learned positions of 2,048 x 1,536 and the final
    LayerNorm's 2 x 1,536) was passed as its 77,365,248 embedding parameters."""
    return vocab_params(b.plan) + final_norm_params(b.plan)


def _embedding_gradients(b: _StageBuilder) -> list[Work]:
    """The input tables' weight gradients after their backward (`_gradient_passes`): the
    word embedding's and a learned position table's (`StageParams.lookup_per_rank`). On a
    stage whose output layer is tied to the embedding, under FSDP's mixed precision, the one
    parameter is one slice of the root unit's flat parameter, flattened, cast and divided
    once (priced in the loss, `_head_params`), and autograd only sums the two uses'
    gradients before that (`flops.fsdp_summed`); without FSDP each use adds into the main
    gradients. The position table is used here alone: its passes are this phase's either
    way."""
    n, word = b.params.lookup_per_rank, vocab_params(b.plan)
    fsdp = flops.fsdp_mixed(b.plan)
    dense = flops.embedding_gradient(b.plan, n, fsdp)  # the tables' whole gradients
    if fsdp is False:
        return dense + _gradient_passes(b, n)
    once = fsdp & holds(b.last & b.plan.model.tied_embeddings)
    positions = n - word
    shared = when(_gradient_passes(b, positions), positions > 0) + flops.fsdp_summed(b.plan, word)
    return dense + when(_gradient_passes(b, n), lacks(once)) + when(shared, once)


def _zero3_moves(
    plan: Plan,
    layer: _Layer,
    block: str,
    backward: bool,
    last_of: Any = 0,
    ffn: str = "mlp",
    behind_root: bool = False,
) -> list[Move]:
    """ZeRO-3 / FSDP: gather each block's parameters before use, forward and backward;
    reduce-scatter its gradients after backward (Rajbhandari et al. section 7.2.3); expert
    weights over the expert data-parallel group. With `overlap.param_gather` the next
    block's gather is prefetched during this one's compute; with `overlap.dp_grads` the
    reduce-scatter runs during the next block's backward (PyTorch FSDP's prefetch, Zhao et
    al., arXiv 2304.11277). `last_of`: the layers of the stage, whose first layer's
    reduce-scatter is the backward's last, exposed; or, with `behind_root` (FSDP's stage
    with the embedding, whose root unit's backward comes after), left out of the layers'
    phase for the embedding's (`_first_layer_reduction`).

    Under whole-layer units (`Parallel.fsdp_unit` layer; `_unit_groups`) the layer (of
    feed-forward block `ffn`) is gathered with its attention's forward and its feed-forward
    block's backward, and its gradients reduce-scattered with the latter's phase: the
    reduction of the layer above runs beside the gather of this one, both behind one
    layer's backward (the window "@backward-unit", `schedule._windows`), as the forward's
    prefetch runs behind one layer's forward."""
    prec = plan.precision
    whole = plan.parallel.fsdp_unit == "layer"
    what = "layer" if whole else "block"
    forward_window, backward_window = (
        ("@forward-unit", "@backward-unit") if whole else 2 * ("@phase",)
    )
    # the backward ends with the reduce-scatter of the stage's first layer: its attention
    # block's, or under whole-layer units the layer's, which its feed-forward phase carries
    last_of = last_of if whole or block == "attention" else 0
    moves = []
    for group, ranks, n in _unit_groups(plan, layer, block, backward, ffn):
        label = f"{'layer' if whole else block} {'expert ' if group == 'edp' else ''}"
        gather = Move(
            f"{label}parameters",
            "all-gather",
            group,
            ranks,
            prec.param_gather,
            n * DTYPE_BYTES[prec.param_gather],
            "shard(0)",
            "replicate",
        )
        # kept gathered since its forward (`Parallel.reshard_after_forward` off), a unit's
        # backward gathers nothing
        if not backward or plan.parallel.reshard_after_forward:
            moves.append(
                hide(
                    gather,
                    backward_window if backward else forward_window,
                    "param_gather",
                    "ZeRO-3 gather: exposed unless "
                    f"overlap.param_gather prefetches it behind the previous {what}",
                )
            )
        if backward:
            grads = Move(
                f"{label}gradients",
                "reduce-scatter",
                group,
                ranks,
                prec.reduce,
                n * DTYPE_BYTES[prec.reduce],
                "partial",
                "shard(0)",
            )
            # the stage's first block (of `last_of` such blocks) is the backward's last:
            # its reduce-scatter has no block behind it, and FSDP waits for it as the
            # micro-batch's backward ends (DESIGN rule 6: the last bucket is exposed)
            floor = vwhere(last_of > 0, 1 / vmax(last_of, 1), 0.0)
            hidden = hide(
                grads,
                backward_window,
                "dp_grads",
                "ZeRO-3 gradient reduce-scatter: "
                f"exposed unless overlap.dp_grads runs it behind the next {what}",
                floor=0.0 if behind_root else floor,
            )
            rest: Any = 1.0
            if behind_root:  # all but the first layer's, which the embedding's phase runs
                rest = vwhere(last_of > 0, (last_of - 1) / vmax(last_of, 1), 1.0)
                hidden = replace(hidden, count=rest)
            # DeepSpeed's ZeRO 3 reduce-scatters its buckets instead (`_reduce`); a stage of
            # one layer has none left here (a review, m465: a row of 0 calls)
            moves += when([hidden], lacks(deepspeed_buffered(plan)) & (rest > 0))
    return when(moves, plan.parallel.zero == 3)


def _first_layer_reduction(b: _StageBuilder) -> list[Move]:
    """Under FSDP, the stage's first layer's reduce-scatter, the backward's last of a
    layer's (`_zero3_moves` leaves it out of the layers' phases): its post-backward hook
    issues it once the layer's gradients are made, before autograd reaches the embedding
    (FSDP2's hook on the unit's forward inputs, ``post_backward`` → ``foreach_reduce``;
    FSDP1's ``_post_backward_hook``), so it runs beside the embedding's backward, and the
    root unit's reduce-scatter, on the same stream, starts once both are done (an audit,
    m454: it had been counted exposed beside the root's, 2.2 ms a step on Llama 3 8B whose
    embedding's backward runs 3.0 ms). The unit is the layer's attention block, or the
    layer under whole-layer units."""
    plan = b.plan
    if plan.parallel.fsdp_unit == "layer":
        block = "moe" if moe_layers(plan)[0] else "mlp"
    else:
        block = "attention"
    rule = (
        "ZeRO-3 gradient reduce-scatter of the stage's first layer: beside the embedding's "
        "backward, exposed beyond it unless overlap.dp_grads runs it there"
    )
    # beside the embedding's own backward kernels, not the root unit's gradient passes,
    # which wait for it: FSDP2's ``post_backward`` makes the compute stream wait on the last
    # reduce-scatter before its copy-in, and FSDP1 casts and pre-divides on the one
    # post-backward stream (a review, m465: 1.1 to 1.4 ms short under a whole root)
    return [
        replace(m, window=EMBEDDING_BACKWARD_WINDOW, floor=0.0, rule=rule)
        for m in _zero3_moves(plan, b.layer, block, True)
        if m.op == "reduce-scatter"
    ]


def _root_params(b: _StageBuilder) -> Any:
    """Parameters a rank of the stage holds outside its transformer layers: the embedding
    on the first stage; the final norm, the output layer and the multi-token prediction
    projections on the last (`layers.class_params`)."""
    whole = b.layer.per_rank  # a whole layer's non-expert parameters on one rank, by kind
    layers = b.dense * whole["mlp"]
    if b.has_moe:
        layers = layers + b.moe * whole["moe"]
    return b.params.per_rank - layers


def _root_name(b: _StageBuilder) -> str:
    """What the stage holds outside its layers, for labels: the embedding, the head (final
    norm, output layer and any multi-token prediction projections and embedding copy), or
    both."""
    return "embedding+head" if b.first and b.last else ("embedding" if b.first else "head")


def _zero3_root_moves(b: _StageBuilder, backward: bool) -> list[Move]:
    """ZeRO-3 of the parameters outside the layers (`_root_params`) as PyTorch FSDP runs
    them: the root unit around the per-layer units (Zhao et al., arXiv 2304.11277, section
    3.2), gathered once at the start of each micro-batch's forward and kept through its
    backward (FSDP does not reshard the root after forward), its gradients reduce-scattered
    when that unit's backward is done. On a stage with the embedding that is at the very
    end of the backward, where FSDP waits for it (exposed); on a last-only stage the head's
    gradients are ready after the loss and reduce behind the layers' backward (hidden under
    `overlap.dp_grads`). The gather is exposed: the stage's first kernel needs it. DeepSpeed
    ZeRO-3 differs: it fetches and prefetches on use and keeps small parameters such as
    norms whole, so for it the gather is pessimistic, and it reduce-scatters these gradients
    in its buckets with the layers' (`_reduce`), so none is priced here."""
    plan = b.plan
    par = plan.parallel
    n = _root_params(b)
    ranks = par.zero_ranks
    name = _root_name(b)
    if backward:
        move = _outside_move(
            plan,
            name,
            False,
            n,
            "ZeRO-3, FSDP's root unit (the layers' outside): exposed, FSDP waits for its "
            "gradients as the backward ends",
        )
        if not b.first:
            move = hide(
                move,
                "@backward-microbatch",
                "dp_grads",
                "ZeRO-3, FSDP's root unit (the layers' outside): reduced once the loss's "
                "backward is done; exposed unless overlap.dp_grads runs it behind the "
                "layers' backward",
            )
    else:
        move = _outside_move(
            plan,
            name,
            True,
            n,
            "ZeRO-3, FSDP's root unit (the layers' outside): gathered as the micro-batch "
            "starts on this stage, exposed: its first kernel needs it",
        )
    # DeepSpeed's ZeRO 3 reduce-scatters these gradients in its buckets (`_reduce`)
    own = lacks(deepspeed_buffered(plan)) if backward else True
    return when([move], (par.zero == 3) & (ranks > 1) & (n > 0) & own)


def _outside_move(plan: Plan, what: str, gather: bool, n: Any, rule: str) -> Move:
    """ZeRO-3's all-gather of `n` parameters outside the layers (`what`: the root unit's,
    or a split root's embedding or head) over dp x cp, or with `gather` false the
    reduce-scatter of their gradients."""
    par, prec = plan.parallel, plan.precision
    dtype = outside_gather(plan) if gather else prec.reduce
    return Move(
        f"{what} {'weights' if gather else 'gradients'}",
        "all-gather" if gather else "reduce-scatter",
        "dp",
        par.zero_ranks,
        dtype,
        n * DTYPE_BYTES[dtype],
        "shard(0)" if gather else "partial",
        "replicate" if gather else "shard(0)",
        rule=rule,
    )


def _split_root_moves(b: _StageBuilder, unit: str, backward: bool) -> list[Move]:
    """`_zero3_root_moves` under a split root (`Parallel.fsdp_root`), as torchtitan wraps
    it: the embedding (`unit` "embedding") gathered for its forward, exposed (its first
    kernel needs it), and again for its backward behind the first layer's under
    `overlap.param_gather`, its gradients reduce-scattered as the backward ends, exposed;
    the head ("head": final norm and output layer) gathered behind the stage's last layer's
    forward and kept to its backward, its gradients reduce-scattered once the loss's
    backward is done, behind the layers' under `overlap.dp_grads`."""
    plan = b.plan
    par = plan.parallel
    ranks = par.zero_ranks
    n = _outside_params(b, unit)
    moves = []
    # kept gathered since its forward (`Parallel.reshard_after_forward` off), the
    # embedding's backward gathers nothing
    again = not backward or par.reshard_after_forward
    if (unit == "embedding" and again) or (unit == "head" and not backward):
        gather = _outside_move(
            plan,
            unit,
            True,
            n,
            f"ZeRO-3, the {unit}'s own FSDP unit: gathered as its forward starts, exposed: "
            "its first kernel needs it",
        )
        window = "@backward-unit" if backward else "@forward-unit"
        if unit == "head" or backward:
            gather = hide(
                gather,
                window,
                "param_gather",
                f"ZeRO-3, the {unit}'s own FSDP unit: exposed unless overlap.param_gather "
                f"prefetches it behind the {'first' if backward else 'last'} layer",
            )
        moves.append(gather)
    if backward or unit == "head":
        grads = _outside_move(
            plan,
            unit,
            False,
            n,
            f"ZeRO-3, the {unit}'s own FSDP unit: exposed, FSDP waits for its gradients as "
            "the backward ends",
        )
        if unit == "head":
            grads = hide(
                grads,
                "@backward-microbatch",
                "dp_grads",
                "ZeRO-3, the head's own FSDP unit: reduced once the loss's backward is done; "
                "exposed unless overlap.dp_grads runs it behind the layers' backward",
            )
        moves.append(grads)
    return when(moves, (par.zero == 3) & (ranks > 1) & (n > 0))


def _root_moves(b: _StageBuilder, where: str) -> list[Move]:
    """ZeRO-3's moves of the parameters outside the layers in the phase `where`:
    "embedding forward", "loss" or "embedding backward" (`_zero3_root_moves`, or under a
    split root `_split_root_moves`)."""
    if b.plan.parallel.fsdp_root == "split":
        if where == "loss":
            return _split_root_moves(b, "head", False)
        return _split_root_moves(b, "embedding", where == "embedding backward")
    if where == "loss":
        return [] if b.first else _zero3_root_moves(b, False) + _zero3_root_moves(b, True)
    return _zero3_root_moves(b, backward=where == "embedding backward")


def _root_copies(b: _StageBuilder, where: str) -> list[Work]:
    """FSDP's copies around the root's gathers in the phase `where` (`_root_moves`)."""
    par = b.plan.parallel
    if par.fsdp_root == "split":
        if where == "embedding backward" and not par.reshard_after_forward:
            return []  # kept gathered since its forward
        return _root_gather_copies(b, "head" if where == "loss" else "embedding")
    if where == "embedding backward" or (where == "loss" and b.first):
        return []
    return _root_gather_copies(b)


# made by the loss and held through the backward until the root unit's reduce-scatter
HEAD_GRADIENTS = f"head gradients (ZeRO-3, unsharded until reduced, {HELD_THROUGH} backward)"
# under a split root, the head's own unit's reduce-scatter input, freed at the next unit's
# post-backward (fully_shard keeps one)
SPLIT_HEAD_GRADIENTS = "head gradients (its own FSDP unit's reduce-scatter input)"


def _zero3_root_grads(b: _StageBuilder) -> list[Alloc]:
    """The head's unsharded gradient under ZeRO-3 (the output layer's, or the tied
    embedding's), which exists from the loss's backward until the root unit's
    reduce-scatter (`_zero3_root_moves`), in the compute dtype of the gathered weights
    (with FSDP's cast to the reduce format beside it: `_unsharded_gradient_bytes`). Under
    DeepSpeed's gradient buffer (`deepspeed_buffered`) an output layer of its own has its
    gradient copied in, or reduced, as it is made (``__add_grad_to_ipg_bucket``), and holds
    none through the layers' backward (a review: 1.05 GB held so on Llama 3 8B); a tied
    one's first part waits in autograd for the embedding's, as under FSDP."""
    plan = b.plan
    par = plan.parallel
    copied = deepspeed_buffered(plan) & (not plan.model.tied_embeddings)
    # FSDP casts the head's gradient once the root unit's backward is done: right after
    # the loss on a last stage alone, only at the backward's end beside the embedding
    gathered = DTYPE_BYTES[outside_gather(plan)]
    # under a split root its own unit's, right after the loss on every stage
    cast = not b.first or par.fsdp_root == "split"
    size = vocab_params(plan) * _unsharded_gradient_bytes(plan, cast, gathered)
    label = HEAD_GRADIENTS if par.fsdp_root != "split" else SPLIT_HEAD_GRADIENTS
    grads = Alloc(label, "transient", size)
    # a split root's head reduces them before the layers' backward unless it overlaps it
    overlapped = par.fsdp_root != "split" or plan.overlap.dp_grads
    held = b.last & (par.zero == 3) & (par.zero_ranks > 1) & lacks(copied) & overlapped
    return when([grads], held)


def _zero2_head_grads(b: _StageBuilder, tied_only: bool) -> list[Alloc]:
    """Under ZeRO-2 the output layer's weight gradient, made in the loss's backward, whole
    in ``precision.grads`` until its bucket is reduce-scattered, as a layer's is (`bucket`):
    at once where the output layer has its own weights; where it shares the embedding's
    (tied), not before the embedding's backward has added its part, autograd holding the
    first of the two in its input buffer, or on a last stage of its own until the
    embedding group's all-reduce after the backward (an audit: no instant held it; Llama 3
    405B's last stage at 128K tokens makes 1,050,673,152 B of it). `tied_only`: the one
    held through the layers' backward."""
    plan = b.plan
    par = plan.parallel
    tied = plan.model.tied_embeddings
    if tied_only and not tied:
        return []
    size = vocab_params(plan) * DTYPE_BYTES[plan.precision.grads]
    name = "head gradients (ZeRO-2, whole until reduced" + (
        f", {HELD_THROUGH} backward)" if tied else ")"
    )
    grads = Alloc(name, "transient", size)
    return when([grads], b.last & (par.zero == 2) & (par.zero_ranks > 1))


def _unsharded_gradient_bytes(plan: Plan, cast: bool, otherwise: int | None = None) -> Any:
    """Bytes per parameter of a ZeRO-3 block's whole gradients before their reduce-scatter:
    in ``precision.grads`` (or `otherwise`), or under FSDP's mixed precision the gradients
    autograd computes in the gathered format and, once the block's backward is done
    (`cast`) and where the reduce format differs, their cast beside them until the
    reduce-scatter is done
    (`flops.fsdp_gradient_passes`: FullyShardedDataParallel keeps the computed gradient
    alive on its post-backward stream, ``_no_dispatch_record_stream``); ``fully_shard``
    frees it once copied into the reduce-scatter's input (``foreach_reduce``: "Only after
    the copy-in finishes can we free the gradients", ``unsharded_grads.clear()``), so
    under `parallel.fsdp` 2 the cast alone is held (an audit: 2 B a parameter too many)."""
    prec = plan.precision
    recast = cast and prec.reduce != prec.param_gather
    fsdp = DTYPE_BYTES[prec.param_gather] * (not recast or plan.parallel.fsdp == 1) + (
        DTYPE_BYTES[prec.reduce] * recast
    )
    return vwhere(flops.fsdp_mixed(plan), fsdp, otherwise or DTYPE_BYTES[prec.grads])


def _ffn_freed(b: _StageBuilder, instants: list[Instant]) -> list[Instant]:
    """The attention's backward `instants` under block units, once the layer's MLP or MoE
    block has run its backward and its post-backward: under units kept gathered from their
    forward (`Parallel.reshard_after_forward` off, `_kept_gathered`) FSDP has freed its
    parameters (its post-backward reshards before it reduces: FSDP2's
    ``FSDPParamGroup.post_backward``, FSDP1's ``_should_free_in_backward``; a review, m205:
    Llama 3 8B's MLP, 0.33 GiB, counted there); and under a split root (`Parallel.fsdp_root`)
    with its reduce-scatter overlapped, fully_shard has dropped the head's reduce-scatter
    input before keeping the block's own (one buffer; a review, m206: both were held,
    0.81 GiB high). Under whole-layer units the layer's one unit is done after the
    attention."""
    plan = b.plan
    if plan.parallel.fsdp_unit == "layer":
        return instants
    swap: dict[int, Alloc | None] = {}
    if plan.parallel.fsdp_root == "split" and plan.overlap.dp_grads:
        swap.update((id(a), None) for a in b.root_grads)
    if b.kept_gathered:
        size = DTYPE_BYTES[plan.precision.param_gather]
        block = "moe" if b.last_is_moe else "mlp"
        ffn = _group_bytes(b.layer.zero3.get(block, []), size)
        (kept,) = b.kept_gathered
        swap[id(kept)] = replace(kept, bytes=kept.bytes - ffn)
    # and its reduce-scatter has made its gradient shard (`_with_shards`)
    shards = _shards_made(b, 0, _ffn_unit(b))
    return [Instant(i.label, tuple(shards(_swapped(i.live, swap)))) for i in instants]


def _zero3_layer_below(
    b: _StageBuilder, instants: list[Instant], block: str = "mlp"
) -> list[Instant]:
    """A dense MLP's backward `instants` (those of the stage's last layer) and, under
    ZeRO-3 with `overlap.dp_grads`, the same of the layer below it: the attention above
    still holds its whole gradients while their reduce-scatter runs behind this block
    (`_zero3_moves`), where the last layer's MLP had the head's behind it, held already
    (`_zero3_transients`), and the last layer's saved tensors are freed (an audit: under
    full recompute a layer saves its input alone, 64 MiB for Llama 3 8B at 8,192 tokens,
    and the attention's gradients, 240 MiB with their fp32 cast, were in no instant). A
    stage with MoE layers is left as it is, its layers' saved sizes differing; where a
    sweep's configuration has no layer below, its copies' bytes are zeroed (`when`).

    Under whole-layer units (`Parallel.fsdp_unit` layer) the same for each of a layer's
    backward phases (`block`), of an MoE layer too, with the whole layer above reducing
    (`_unit_transients`): no stage of such a plan mixes dense and MoE layers. Under FSDP1's
    mixed precision only its feed-forward block's: the attention's come after the reduction
    is done and its tensors freed."""
    plan = b.plan
    on, reducing = _reducing_above(b, block)
    if not np.any(holds(on)):
        return instants
    # a layer lower, the layer above has freed its saved tensors and, where its parameters
    # were kept from its forward, those too (`_kept_gathered`); under a split root the
    # head's own unit's reduce-scatter input, freed as the last layer's backward ends
    # (fully_shard keeps it to the next unit's post-backward)
    swap: dict[int, Alloc | None] = {id(b.earlier): _earlier(b, 1)}
    swap.update(zip(map(id, b.kept_gathered), _kept_gathered(b, 1), strict=False))
    if plan.parallel.fsdp_root == "split":
        swap.update((id(a), None) for a in b.root_grads)
    shards = _shards_made(b, 1)
    below = [
        Instant(
            f"{i.label}, a layer lower",
            tuple(when([*shards(_swapped(i.live, swap)), reducing], on)),
        )
        for i in instants
    ]
    return instants + below


def _reducing_above(b: _StageBuilder, block: str) -> tuple[Any, Alloc]:
    """Under ZeRO-3 with `overlap.dp_grads`, where a layer's `block` backward runs beside the
    reduce-scatter of the unit above it (`_zero3_layer_below`): where it does, and that
    unit's whole gradients."""
    plan, layer = b.plan, b.layer
    grads = _unsharded_gradient_bytes(plan, True)
    if plan.parallel.fsdp_unit == "layer":
        above, what = layer.units[b.ffn], "layer"
        on: Any = plan.overlap.dp_grads & (b.layers > 1)
        if block == "attention" and plan.parallel.fsdp == 1:
            # FullyShardedDataParallel frees them once their reduce-scatter is done, within
            # the feed-forward block's backward (its cast a local of ``_post_backward_hook``,
            # the computed gradient dropped by ``_reduce_grad``); fully_shard keeps its
            # reduce-scatter input until the next unit's post-backward (a review, m204)
            on = on & lacks(flops.fsdp_mixed(plan))
    elif block == "mlp" and not b.has_moe:
        above, what = layer.zero3["attention"], "attention"
        on = plan.overlap.dp_grads & (b.dense > 1)
    else:
        return False, Alloc("gradients of the unit above (reduce-scattering)", "transient", 0)
    n = _group_bytes(above, grads)
    on = on & (plan.parallel.zero == 3) & (n > 0)
    n = vwhere(deepspeed_buffered(plan), 0, n)  # under DeepSpeed, in its buffer already
    return on, Alloc(f"gradients of the {what} above (reduce-scattering)", "transient", n)


PREFETCHED = "gathered parameters (prefetched"  # ZeRO-3's next unit, gathered ahead


def _zero3_transients(
    plan: Plan, layer: _Layer, block: str, after: Sequence[str], backward: bool = False
) -> list[Alloc]:
    """ZeRO-3: the gathered parameters of the block computing and, with
    `overlap.param_gather`, of the block whose gather is prefetched behind it (`_zero3_moves`;
    PyTorch FSDP's forward and backward prefetch, Zhao et al., arXiv 2304.11277, section
    3.3): the next one, `after` (the larger where the stage has dense and MoE layers):
    the layer's MLP behind its attention, the next layer's attention behind an MLP, and in
    the backward the reverse. In the backward the block's gradients are whole until their
    reduce-scatter (DeepSpeed's ZeRO-3 estimate reserves the largest layer's gathered
    parameters and gradients, ``estimate_zero3_model_states_mem_needs``); with
    `overlap.dp_grads` the block computed just before still holds its whole gradients while
    their reduce-scatter runs behind this one (`_zero3_moves`): behind the attention, its
    layer's MLP or MoE block, `after` (behind the stage's last MLP it is the head, whose
    gradients `_zero3_root_grads` holds already). Under whole-layer units, `_unit_transients`."""
    if plan.parallel.fsdp_unit == "layer":
        ffn = block if block != "attention" else (after[0] if after else "mlp")
        return _unit_transients(plan, layer, block, ffn, backward)
    size = DTYPE_BYTES[plan.precision.param_gather]

    def gathered(name: str, size: int = size) -> Any:
        return _group_bytes(layer.zero3[name], size)

    n = gathered(block)
    current = Alloc("gathered parameters (this block)", "transient", n)
    grad = _unsharded_gradient_bytes(plan, False)
    whole = Alloc("gradients before reduce-scatter", "transient", gathered(block, grad))
    deepspeed = deepspeed_buffered(plan)
    if np.any(deepspeed):  # one weight's gradient at a time, copied into its buffer
        one = layer.largest[block] * grad * (whole.bytes > 0)
        name = DEEPSPEED_GRADIENT if every(deepspeed) else whole.name
        whole = Alloc(name, "transient", vwhere(deepspeed, one, whole.bytes))
    ahead = behind = 0
    for name in after:  # what the prefetch gathers and what the overlapped reduction holds
        ahead = vmax(ahead, gathered(name))
        behind = vmax(behind, gathered(name, _unsharded_gradient_bytes(plan, True)))
    prefetched = Alloc(f"{PREFETCHED} {' or '.join(after)})", "transient", ahead)
    reducing = Alloc(  # under DeepSpeed, in its buffer already
        f"gradients of the previous {' or '.join(after)} block (reduce-scattering)",
        "transient",
        vwhere(deepspeed, 0, behind),
    )
    resharded = plan.parallel.reshard_after_forward  # else all of them held, `_kept_gathered`
    allocs = [
        *when([current], resharded),
        *when([prefetched], resharded and plan.overlap.param_gather and bool(after)),
        *when([whole], backward),
        *when([reducing], backward and block == "attention" and plan.overlap.dp_grads),
    ]
    return when(allocs, (plan.parallel.zero == 3) & (n > 0))


def _unit_transients(
    plan: Plan, layer: _Layer, block: str, ffn: str, backward: bool
) -> list[Alloc]:
    """`_zero3_transients` under whole-layer units (`Parallel.fsdp_unit` layer, a layer of
    feed-forward block `ffn`): the layer's gathered parameters through both its blocks and,
    with `overlap.param_gather`, a whole layer's more beside them, the next one's in the
    forward and the one below's in the backward (PyTorch FSDP's prefetch, Zhao et al.,
    arXiv 2304.11277, section 3.3: FullyShardedDataParallel's rate limiter lets two units'
    all-gathers be in flight, ``limit_all_gathers``, as fully_shard's prefetch does). In the
    backward the gradients autograd has made before the unit's reduce-scatter: the
    feed-forward block's through its own backward, the whole layer's through the
    attention's, the unit's last. The layer above's, reduce-scattering behind this one's
    backward, are held in the instants a layer lower (`_zero3_layer_below`): above the
    stage's last layer is the head, whose gradients `_zero3_root_grads` holds already."""
    grad = _unsharded_gradient_bytes(plan, False)
    n = _group_bytes(layer.units[ffn], DTYPE_BYTES[plan.precision.param_gather])
    made = layer.units[ffn] if block == "attention" else layer.zero3[ffn]
    resharded = plan.parallel.reshard_after_forward  # else all of them held, `_kept_gathered`
    allocs = [
        *when([Alloc("gathered parameters (this layer)", "transient", n)], resharded),
        *when(
            [Alloc(f"{PREFETCHED} layer)", "transient", n)],
            resharded and plan.overlap.param_gather,
        ),
        *when(
            [Alloc("gradients before reduce-scatter", "transient", _group_bytes(made, grad))],
            backward,
        ),
    ]
    return when(allocs, (plan.parallel.zero == 3) & (n > 0))


def _forward(b: _StageBuilder) -> None:
    """Forward of the last layer of the last micro-batch a stage admits before its first
    backward: every earlier layer and micro-batch in flight is saved."""
    plan, s, m = b.plan, b.shapes, b.microbatches
    full = plan.recompute == "full"
    base = [*b.resident, *_extra_saved(b, "forward"), b.earlier]
    checkpoint = [x for x in b.layer.attention if x.name == "layer input (checkpoint)"]
    blocks = b.layer.blocks
    # selective recompute runs the core attention inside a checkpoint that keeps only its
    # inputs: what it computes (the s² scores, flash's statistics) is alive while it runs
    # and freed when it returns, before the output projection (Megatron-LM's
    # ``CheckpointFunction.forward`` runs it under ``torch.no_grad``; an audit found them
    # carried through the output projection and the MLP)
    core = when(_working(b.layer.core), plan.recompute == "selective")
    core += eager_scores(plan, s, "attention scores QKᵀ (working, freed as the core returns)")
    # full recompute's forward runs under ``torch.no_grad``, so a tensor goes with its last
    # reference (an audit: all were held to the block's end): the checkpoint is the norm's
    # input; the norm's output with the QKV GEMM that reads it; the core's tensors as it
    # returns; Q, K and V, locals of the attention, and the core's output through the
    # output projection
    early = [x for x in blocks["attention"] if x.name not in LATE]
    ran = {*QKV_OUTPUTS, PROJECTION_INPUT}
    projecting = [x for x in early if x.name in ran]
    cored = [x for x in early if x.name in ran | {a.name for a in b.layer.core}]
    after = when(early, lacks(full)) + when(_working(cored), full)
    attn = when(early, lacks(full)) + when(_working(projecting), full)
    first_two = when(early[:1], lacks(full)) + _either(early[1:2], full)
    # what the QKV GEMM writes while its all-gathered input is alive (a seeds audit), and
    # under latent attention the latents the up-projections read (a review)
    made = (*QKV_OUTPUTS, MLA_LATENTS)
    qkv_out = _either([x for x in blocks["attention"] if x.name in made], full)
    mla = plan.model.mla
    if mla is not None:
        # the KV up-projection's output, [tokens, heads, nope + v], alive while K and V are
        # built from it as new tensors (Megatron-Core's MLASelfAttention, fused rotary or
        # not: an audit, m332, found it uncounted)
        kv = s.act * s.tokens * (s.heads * mla.nope_dim + s.out_cols)
        placed = "shard(heads) on tp"
        qkv_out = [
            *qkv_out,
            Alloc("KV up-projection output (MLA)", "transient", kv, placement=placed),
        ]

    if b.first:
        moves = _root_moves(b, "embedding forward") + embedding_moves(plan, s)
        work = flops.embedding_work(plan, s) + _root_copies(b, "embedding forward")
        b.add("forward.embedding", m, moves, [], work)

    def last(instants: list[Instant], block: str) -> list[Instant]:
        """The instants are the stage's last layer's (a feed-forward block's where the last
        layer has one of that kind: a stage mixing dense and MoE layers prices its dense
        MLP at an earlier layer, a review): ahead of its last unit (the layer, or under
        block units its feed-forward block) ZeRO-3 gathers the head's."""
        if not b.last or (block == "attention" and plan.parallel.fsdp_unit != "layer"):
            return instants
        if block != "attention" and (block == "moe") != bool(b.last_is_moe):
            return instants
        return _root_prefetched(b, instants, "head")

    gathered = when([_gathered_input(plan, s)], _gathered_apart(plan))
    # a fused kernel's output, saved but under recompute, is the projection's 16-bit input
    saved_out = (plan.recompute == "none") & (plan.model.attention != "eager")
    projected = _fp8_source(
        plan,
        PROJECTION_INPUT,
        s.act * s.tokens * s.out_cols,
        "shard(heads) on tp",
        lacks(saved_out),
    )
    z3 = _zero3_transients(plan, b.layer, "attention", b.ffn_blocks)
    z3 += _redistributed(plan, s, "attention")  # held through the block's instants
    # an all-gathered cp's K/V reordered before the core has made anything (`_cp_reorder`):
    # Q, K and V made, not the core's statistics, output halves or output
    reordered = []
    if copy := _cp_reorder(plan, s):
        core_made = {a.name for a in b.layer.core} | {PROJECTION_INPUT}
        before_core = when([x for x in early if x.name not in core_made], lacks(full))
        before_core += when(_working([x for x in projecting if x.name not in core_made]), full)
        held = (*base, *checkpoint, *before_core, *_cp_buffers(plan, s), *copy, *z3)
        reordered.append(Instant("K/V reordered for the core", held))
    b.add(
        "forward.attention",
        b.layers * m,
        attention_tp_moves(plan, s, False)
        + _cp_moves(plan, s, False)
        + _zero3_moves(plan, b.layer, "attention", False, ffn=b.ffn),
        last(
            [
                Instant(
                    "QKV projection" if plan.model.mla is None else flops.UP_PROJECTIONS,
                    tuple(base + checkpoint + first_two + qkv_out + gathered + z3),
                ),
                *reordered,
                Instant(
                    "after attention",
                    tuple(base + checkpoint + after + core + _cp_buffers(plan, s) + z3),
                ),
                # the row-parallel output projection's output, whole on each rank before its
                # reduce-scatter (all-reduce), as the MLP's fc2 output is
                Instant(
                    "output projection reduction",
                    tuple(
                        base
                        + checkpoint
                        + attn
                        + projected
                        + _before_reduction(plan, s, "attention output")
                        + z3
                    ),
                ),
            ],
            "attention",
        ),
        b.layer.kernels.forward("attention", s)
        + _gather_copies(plan, b.layer, "attention", ffn=b.ffn),
    )
    kept = when(blocks["attention"], lacks(full))
    if b.has_dense:
        # as the attention's under full recompute: fc1's input goes with fc1, its output
        # with the activation, which fc2 reads; the norm's input is the residual
        early = [x for x in blocks["mlp"] if x.name not in LATE]
        reduced = [x for x in early if x.name in ("MLP norm input", FC2_INPUT)]
        activated = [x for x in early if x.name != "MLP fc1 input"]
        mlp = when(early, lacks(full)) + when(_working(activated), full)
        fc2 = when(early, lacks(full)) + when(_working(reduced), full)
        fc2 += _fp8_source(plan, FC2_INPUT, s.act * s.tokens * s.ffn_cols, "shard(ffn) on tp")
        partial = _before_reduction(plan, s, "MLP output")  # before the residual add
        z3 = _zero3_transients(plan, b.layer, "mlp", ["attention"])
        z3 += _redistributed(plan, s, "MLP")  # held through the block's instants
        b.add(
            "forward.mlp",
            b.dense * m,
            _tp_moves(plan, s, "MLP", False, "MLP fc1", "MLP fc2")
            + _zero3_moves(plan, b.layer, "mlp", False),
            last(
                [
                    Instant(
                        "fc1",
                        tuple(
                            base
                            + checkpoint
                            + kept
                            + _either(blocks["mlp"][:3], full)  # and the fc1 output it writes
                            + when(
                                [_gathered(plan, s, "MLP input (all-gathered)")],
                                _gathered_apart(plan),
                            )
                            + z3
                        ),
                    ),
                    *_squared_relu(plan, s, base + checkpoint + kept + mlp + z3),
                    Instant(
                        "fc2 output reduction", tuple(base + checkpoint + kept + fc2 + partial + z3)
                    ),
                ],
                "mlp",
            ),
            b.layer.kernels.forward("mlp", s) + _gather_copies(plan, b.layer, "mlp"),
        )
    if b.has_moe:
        moe = _either([x for x in blocks["moe"] if x.name not in LATE], full)
        buffers = [dispatch_buffers(plan, s, training=True), *shared_output(s)]
        # eager squared ReLU holds the experts' fc1 output while its square runs
        experts = s.act * s.routed * s.expert_cols
        buffers += _squared(plan, "expert ReLU input", experts, "shard(tokens) on ep")
        source = _fp8_source(plan, "expert fc2 input", experts, "shard(tokens) on ep")
        gathered_moe = _zero3_transients(plan, b.layer, "moe", ["attention"])
        b.add(
            "forward.moe",
            b.moe * m,
            _ep_moves(plan, s, False, b.stage)
            + _shared_expert_moves(plan, s, False)
            + _zero3_moves(plan, b.layer, "moe", False),
            last(
                [
                    Instant(
                        "expert computation",
                        tuple(base + checkpoint + kept + moe + buffers + source + gathered_moe),
                    ),
                    *(
                        Instant(label, tuple(base + checkpoint + kept + moe + buffers + held))
                        for label, held in _combined(plan, s, gathered_moe)
                    ),
                ],
                "moe",
            ),
            b.layer.kernels.forward("moe", s) + _gather_copies(plan, b.layer, "moe"),
        )
    if b.last:
        _loss(b)
    if b.pipelined:
        b.add(
            "pipeline.forward",
            m * _sends(plan, b.last),
            at_boundary(pipeline_moves(plan, s, forward=True), b.stage),
            [],
        )


def _head_moves(plan: Plan, s: Shapes) -> list[Move]:
    """The transitions of one output layer and vocab-parallel cross-entropy, forward and
    backward: three small all-reduces of statistics (max, sum of exponentials, target logit)
    and, under sequence parallelism, the gathers and scatters of the layer's input.

    With ``loss: pytorch-gathered`` an all-gather of the logits over tp in the statistics'
    place (``ColwiseParallel(output_layouts=Replicate())``: DTensor's ``Shard ->
    Replicate`` redistribute, each rank's [tokens, vocab / tp] shard, padded where tp does
    not divide the vocabulary), which the cross-entropy waits for; its backward,
    ``Replicate -> Shard``, slices the rank's shard out and moves nothing."""
    t = plan.parallel.tp
    if every(t == 1):
        return []
    if plan.loss == "pytorch-gathered":
        gather = Move(
            "logits all-gathered (loss parallel off)",
            "all-gather",
            "tp",
            t,
            plan.precision.activations,
            s.act * s.tokens * vocab_rows(plan) * t,
            "shard(vocab)",
            "replicate",
            rule="exposed: the loss needs it",
        )
        stats = when([gather], t > 1)
    else:
        stats = when([_entropy_statistics(plan, s)], t > 1)
    # not a Transformer Engine module: its input gathered in the activations' format
    head = partial(
        _tp_moves, plan, s, "output layer", column="output layer", engine=False, comm_gemm=False
    )
    moves = stats + when(head(backward=False)[:1], _sp(plan))
    return moves + head(backward=True)


def _entropy_statistics(plan: Plan, s: Shapes) -> Move:
    """The vocab-parallel cross-entropy's three all-reduces over tp of a per-token fp32
    statistic each (max, sum of exponentials, target logit; Megatron-Core's
    ``_VocabParallelCrossEntropy``, DTensor's ``loss_parallel``)."""
    return Move(
        "cross-entropy statistics",
        "all-reduce",
        "tp",
        plan.parallel.tp,
        "fp32",
        4 * s.tokens,
        "partial",
        "replicate",
        count=3,
        rule="exposed: the loss needs it",
    )


def _loss_placement(plan: Plan) -> str:
    """Where the cross-entropy's buffers lie over tp (`layers.loss_rows`)."""
    return "replicate on tp" if plan.loss == "pytorch-gathered" else "shard(vocab) on tp"


def _loss(b: _StageBuilder) -> None:
    """Output layer and vocab-parallel cross-entropy on the last stage (Megatron-LM's
    `vocab_parallel_cross_entropy`): logits sharded over vocab on tp, upcast to fp32; three
    small all-reduces (max, sum of exponentials, target logit). The fp32 copy is turned into
    the softmax in place and saved; the backward writes the logits' gradient into that same
    buffer (``grad_input = softmax``, then in-place updates) and casts it to the logits'
    format, so the peak holds the logits plus one fp32 buffer in the forward and one fp32
    buffer plus the cast gradient in the backward, the same bytes: 6·s·b·v/t with bf16
    logits (Korthikanti et al., arXiv 2205.05198, section 4.3, count 4sbv/t for the fp32
    logits). With fp32 activations the upcast (``.float()``) returns the logits themselves
    and no cast follows the backward: one fp32 buffer, 4·s·b·v/t (an audit: counted twice).

    With ``loss: pytorch`` the forward and the backward hold different buffers, each an
    instant of its own (`_entropy_passes`); with ``loss: pytorch-gathered`` they are over the
    whole vocabulary, gathered first (`layers.loss_rows`, `_head_moves`), and the logits'
    gradient the output layer's backward reads is the rank's shard of it again.

    With multi-token prediction (`layers.mtp_layers`) each module has its own output layer
    pass and cross-entropy (phase ``mtp``), run before the main head (Megatron-Core's
    ``process_mtp_loss``); each cross-entropy keeps its fp32 softmax for the backward
    (``_VocabParallelCrossEntropy`` saves it), so the main head's peak holds theirs too."""
    plan, s = b.plan, b.shapes
    logits = s.tokens * loss_rows(plan)
    vocab = _loss_placement(plan)
    moments = _entropy_passes(plan, s.act, logits)
    everything = Alloc(
        f"{CARRIED_ACTIVATIONS} of the micro-batches in flight",
        "activations",
        b.saved_in_flight,
    )

    gathered = when([_full(s, "output layer input (all-gathered)")], _gathered_apart(plan))
    # the output layer's input gradient, which waits for the multi-token prediction heads'
    # share (their losses' backward runs after the main one's; an audit: uncounted there)
    input_grad = Alloc("output layer input gradient", "transient", s.act * s.tokens_sp * s.hidden)

    def head(earlier: int, entropy: list[Alloc]) -> list[Alloc]:
        live = [
            *b.resident,
            *_extra_saved(b, "head"),
            everything,
            *when(
                [
                    Alloc(
                        "soft-capped logits, kept for the tanh backward",
                        "transient",
                        s.act * logits,
                        placement=vocab,
                    )
                ],
                plan.model.logit_softcap,
            ),
            *entropy,
        ]
        return live + kept_for(earlier) + gathered

    def kept_for(earlier: int) -> list[Alloc]:
        """What the multi-token prediction heads' cross-entropies, `earlier` of them, keep
        for their backward, which runs after the main head's."""
        if not earlier:
            return []
        kept = [
            Alloc(
                "softmax (fp32) of the multi-token prediction heads, kept for backward",
                "transient",
                4 * logits,
                count=earlier,
                placement=vocab,
            )
        ]
        softcap = Alloc(
            "soft-capped logits of the multi-token prediction heads, kept for the tanh backward",
            "transient",
            s.act * logits,
            count=earlier,
            placement=vocab,
        )
        return kept + when([softcap], plan.model.logit_softcap)

    # the output layer's weight gradient is made once the cross-entropy's fp32 gradient
    # has been cast back to the logits' format and freed: under ZeRO-2 its whole gradient
    # (`_zero2_head_grads`) stands beside that, not beside the fp32 buffer (an audit)
    weights = [
        *b.resident,
        *_extra_saved(b, "head"),
        everything,
        # the rank's shard again (`_head_moves`), whatever the loss ran over
        Alloc(
            "logits gradient",
            "transient",
            s.act * s.tokens * vocab_rows(plan),
            placement="shard(vocab) on tp",
        ),
        # its input gradient whole, beside its reduce-scatter's shard under sequence
        # parallelism, while the weight gradient's GEMM runs (a review: the shard alone)
        *_before_reduction(plan, s, "output layer input gradient", engine=False),
        *_zero2_head_grads(b, tied_only=False),
        *kept_for(mtp_layers(plan)),
        *gathered,
    ]
    z2 = holds((plan.parallel.zero == 2) & b.last)
    weight_instant = [Instant("output layer weight gradient", tuple(when(weights, z2)))]
    weight_instant = weight_instant if np.any(z2) else []
    mtp = mtp_layers(plan)
    if mtp:
        forward = flops.mtp_forward(plan, s)
        # full recompute checkpoints the module from its norms to its final norm
        # (Megatron-Core's `_checkpointed_forward`): the norms and projection run again, not
        # the embedding's kernels before them (`flops.mtp_forward` ends with those two)
        redo = [w.scaled(1, f"{w.name} (recomputed)") for w in forward[-2:]]
        # the output layer, the embedding lookup and the projection with its norms each
        # add a gradient into the main gradients; under FSDP the first two are another use
        # of the main head's and the embedding's parameters, summed into their gradients
        shared, own = 2 * vocab_params(plan), mtp_params(plan)[1]
        fsdp = flops.fsdp_mixed(plan)
        par = plan.parallel
        passes = flops.fsdp_summed(plan, shared) + flops.fsdp_gradient_passes(
            plan, own, par.zero_ranks, b.microbatches
        )
        grads = when(passes, fsdp) + when(flops.grad_accumulation(plan, shared + own), lacks(fsdp))
        b.add(
            "mtp",
            b.microbatches * mtp,
            _mtp_moves(plan, s) + _head_moves(plan, s),
            [
                Instant(
                    f"multi-token prediction cross-entropy{label}",
                    (
                        *head(mtp - 1, entropy),
                        *when([input_grad], backward),
                        *_zero2_head_grads(b, tied_only=False),
                    ),
                )
                for label, entropy, backward in moments
            ],
            forward
            + when(redo, plan.recompute == "full")
            + flops.backward_of(forward)
            + flops.loss_work(plan, s)
            + grads,
        )
    root = _root_moves(b, "loss")
    moves, works = _head_moves(plan, s), flops.loss_work(plan, s)
    passes = _gradient_passes(b, _head_params(b))
    deferred = _deferred_wgrads(b)
    if np.any(holds(deferred > 0)):  # the rest of the micro-batches' in line
        moves, works, passes = _in_line(b, deferred / b.microbatches, moves, works, passes)
    b.add(
        "loss",
        b.microbatches,
        root + moves,
        [
            *(Instant(f"cross-entropy{label}", tuple(head(mtp, e))) for label, e, _ in moments),
            *weight_instant,
            *_split_head_reduce(b, [everything, input_grad]),
        ],
        works + passes + _root_copies(b, "loss"),
    )


# the deferred kernels' names (`_in_line`, `_drain`)
HEAD_BACKWARD = "output layer backward"
HEAD_REGATHER = "output layer input again, for weight grad"
HEAD_INPUT_GRADIENT = "output layer input gradient"


def _deferred_wgrads(b: _StageBuilder) -> Any:
    """How many micro-batches' output-layer weight gradients `b` defers to the pipeline's
    drain (``overlap.defer_embedding_wgrad``): Megatron-Core's last pipeline stage keeps the
    first ``wgrad_deferral_limit`` of them (every one at 0) and computes the rest in line
    (``LinearWithGradAccumulationAndAsyncCommunication.backward``: ``wgrad_compute`` is
    false while ``len(grad_output_buffer) < wgrad_deferral_limit``); 0 on any other stage,
    without a pipeline (a search's layouts of one stage) or with the switch off."""
    return deferred_wgrads(b.plan, b.microbatches) if b.last and b.pipelined else 0


def deferred_wgrads(plan: Plan, microbatches: Any = None) -> Any:
    """How many micro-batches' output-layer weight gradients `plan`'s last pipeline stage
    defers (`_deferred_wgrads`), of `microbatches` (the plan's own by default); 0 for a
    serving plan, one stage or the switch off."""
    deferred = plan.overlap.defer_embedding_wgrad
    if plan.mode != "train" or deferred is False or every(plan.parallel.pp == 1):
        return 0
    m = plan.microbatches if microbatches is None else microbatches
    return m if deferred is True else vmin(deferred, m)


def _in_line(
    b: _StageBuilder, share: Any, moves: list[Move], works: list[Work], passes: list[Work]
) -> tuple[list[Move], list[Work], list[Work]]:
    """The loss phase's head moves, kernels and gradient passes where a `share` of the
    micro-batches defers the output layer's weight gradient (`_deferred_wgrads`), averaged
    over the micro-batches as the phase is. Megatron-Core's backward of a deferred one runs
    the input-gradient GEMM alone: no re-gather of its input for the weight gradient (the
    all-gather runs only ``if ctx.sequence_parallel and wgrad_compute``), and the input
    gradient's reduce-scatter (all-reduce without sequence parallelism), launched before the
    weight-gradient GEMM to hide behind it, is waited for with nothing beside it. So the
    backward kernel (`flops.backward_of`: the input- and the weight-gradient GEMM, two
    launches of equal size) keeps 1 + (1 - f) of its two, the re-gather runs on 1 - f of
    the micro-batches behind the input-gradient GEMM, 1 / (2 - f) of the kernel, and the
    input gradient's reduction hides behind a weight-gradient GEMM, 1 / (2 - f) of it, on
    1 - f of them and is waited for whole on the rest (review m369: averaged, the in-line
    micro-batches' GEMMs had hidden the deferred ones' reductions, 14 ms a step on Llama 3.1
    405B); at f = 0 the halves of `_tp_moves`. The head's main-gradient accumulation (fused
    into the weight-gradient GEMM, priced as its own pass) follows its GEMM; the final
    norm's stays."""
    plan = b.plan
    kept = 2 - share

    def line(move: Move) -> list[Move]:
        if move.name == HEAD_REGATHER:
            return [replace(move, count=move.count * (1 - share), share=1 / kept)]
        if move.name == HEAD_INPUT_GRADIENT:
            waited = replace(
                move,
                name=f"{move.name} (weight gradient deferred)",
                count=move.count * share,
                window="",
                flag="",
                rule="tp backward: exposed, its micro-batch's weight-gradient GEMM deferred",
            )
            hidden = replace(move, count=move.count * (1 - share), share=1 / kept)
            return [*when([hidden], share < 1), waited]
        return [move]

    def gemms(work: Work) -> Work:
        if work.name != HEAD_BACKWARD:
            return work
        return work.scaled(kept / 2, launches=work.launches * kept / 2)

    norm, vocab = final_norm_params(plan), vocab_params(plan)
    rest = (norm + (1 - share) * vocab) / (norm + vocab)
    return (
        [each for m in moves for each in line(m)],
        [gemms(w) for w in works],
        [w.scaled(rest) for w in passes],
    )


def _drain(b: _StageBuilder) -> None:
    """The output layer's deferred weight gradients (`_deferred_wgrads`), once the last
    stage's last backward is done and before the step's gradients are finalized, while the
    stages ahead of it run their last backwards (its lead, `schedule._with_leads`): Megatron-
    Core's ``finish_embedding_wgrad_compute`` at the end of the pipeline schedule, then
    ``finalize_model_grads_func``. ``drain_embedding_wgrad_compute`` runs one weight-gradient
    GEMM a micro-batch (``wgrad_gemm_accum_fp32``, accumulated into the main gradient) and,
    under sequence parallelism, all-gathers each kept input [tokens / tp, hidden] into one of
    two global buffers while the GEMM before it runs, so the first waits whole: (d - 1) / d
    of the gathers hide, on average. The phase runs once a deferred micro-batch; what its
    kept inputs and logits gradients hold is `_deferred_buffers`."""
    d = _deferred_wgrads(b)
    if not np.any(holds(d > 0)):
        return
    plan, s = b.plan, b.shapes
    # one of the backward's two GEMMs, each the forward's size, over the forward's rows
    # (`flops.backward_of`: dW = Xᵀ·dY runs over the tokens)
    forward = flops.output_layer(plan, s)
    rows = forward.dims[0] if forward.dims is not None else s.tokens
    wgrad = replace(forward, name="output layer weight gradient (deferred)", inner=(rows,))
    par = plan.parallel
    gather = Move(
        "output layer input, gathered for its deferred weight gradient",
        "all-gather",
        "tp",
        par.tp,
        plan.precision.activations,
        s.act * s.tokens * s.hidden,
        str(shard(0)),
        str(REPLICATE),
    )
    rule = (
        "tp: the drain gathers each kept input behind the weight-gradient GEMM before it, "
        "the first with nothing beside it"
    )
    gathers = when([hide(gather, wgrad.name, "", rule, floor=1 / vmax(d, 1))], _sp(plan))
    two = replace(_full(s, "deferred output-layer inputs, gathered (two buffers)"), count=2)
    buffers = when([two], _sp(plan))
    b.add(
        "head.wgrad",
        d,
        gathers,
        [Instant("deferred output-layer weight gradient", (*b.resident, *buffers))],
        [wgrad, *flops.grad_accumulation(plan, vocab_params(plan))],
    )


def _deferred_buffers(b: _StageBuilder) -> list[Alloc]:
    """What the last stage keeps for its deferred weight gradients (`_deferred_wgrads`): a
    micro-batch's output-layer input as the layer reads it (the [tokens / tp, hidden] shard
    under sequence parallelism, `ColumnParallelLinear.forward` appending ``input_parallel``
    to ``embedding_activation_buffer``) and its logits gradient over the rank's vocabulary
    shard (``grad_output_buffer``), both in the activations' format, each held from the
    micro-batch's pass to the drain. Counted for all of them at every moment of the stage,
    an upper bound close to the peak: a 1F1B last stage holds one micro-batch in flight
    throughout, so its peak at its last micro-batch holds all but one logits gradient, and an
    interleaved one holds its most in flight until its forwards end, by when all but its
    warm-up's backwards are done."""
    d = _deferred_wgrads(b)
    if not np.any(holds(d > 0)):
        return []
    plan, s = b.plan, b.shapes
    each = s.act * (s.tokens_sp * s.hidden + s.tokens * vocab_rows(plan))
    name = "output-layer inputs and logits gradients kept for the deferred weight gradients"
    return [Alloc(name, "activations", each, count=d)]


def _entropy_passes(plan: Plan, act: Any, logits: Any) -> list[tuple[str, list[Alloc], bool]]:
    """The cross-entropy's own buffers over the rank's `logits` (tokens × vocabulary shard),
    a label, the buffers and whether the backward has begun for each moment whose buffers
    differ; `act` is the logits' bytes per element.

    ``loss: megatron`` (`_loss`): the logits and the one fp32 buffer that is the softmax and
    then its gradient, forward and backward alike: one moment.

    ``loss: pytorch``: ``F.cross_entropy(logits.float(), labels)`` (torchtitan's
    ``cross_entropy_loss``; transformers' ``ForCausalLMLoss`` upcasts the same way). Counted
    from PyTorch's kernels, per logit with bf16 logits. On one rank of tp (``log_softmax``
    then ``nll_loss``, ATen's own kernels): the forward holds the logits (2 B), their fp32
    copy (4) and the log-softmax it writes (4), 10 B; the copy is freed as the loss
    returns (the log-softmax saves its output, not its input) and the caller drops the
    logits before the backward (torchtitan's ``del pred``), where ``nll_loss_backward``
    writes a dense fp32 gradient (4) and ``_log_softmax_backward_data`` another (4) beside
    the saved log-softmax (4), 12 B, before the cast back to bf16. On tp > 1, DTensor's
    ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py, torchtitan's default
    there) runs the decomposition of ``_log_softmax``: the fp32 copy, ``x - x_max`` and
    its ``exp`` beside the logits, 14 B, and a backward of ``(grad_input +
    torch.exp(x)) * grad_output`` beside the saved log-softmax and the zeroed
    ``grad_input``: exp, sum and then product, two at a time, 16 B. With fp32 logits
    ``.float()`` copies nothing (2 B less in each forward). Under a pipeline (pp > 1)
    ``torch.distributed.pipelining`` keeps the last stage's output, the logits, from its
    forward (``fwd_cache``) to its backward, which holds them too (a review: 2 B a logit
    low).

    ``loss: pytorch-gathered``: the same call on logits gathered whole on every tp rank
    (`layers.loss_rows`), a plain tensor there (``use_local_output``), so ATen's own
    kernels, 10 B and 12 B a logit of the whole vocabulary, on any tp."""
    vocab = _loss_placement(plan)

    def buffer(name: str, nbytes: Any) -> Alloc:
        return Alloc(name, "transient", nbytes * logits, placement=vocab)

    typed = when([buffer("logits", act)], act < 4)
    if plan.loss == "megatron":
        return [("", [*typed, buffer("logits (fp32), the softmax and then its gradient", 4)], True)]
    gathered, piped = plan.loss == "pytorch-gathered", plan.parallel.pp > 1
    one, many = (True, False) if gathered else (plan.parallel.tp == 1, plan.parallel.tp > 1)
    forward = [
        buffer("logits", act),
        *when([buffer("logits upcast to fp32 (.float())", 4)], act < 4),
        *when([buffer("log-softmax (fp32), kept for the backward", 4)], one),
        *when(
            [
                buffer("shifted logits (fp32, loss_parallel's x - x_max)", 4),
                buffer("their exponent (fp32, loss_parallel)", 4),
            ],
            many,
        ),
    ]
    backward = [
        buffer("log-softmax (fp32), saved", 4),
        buffer("nll_loss gradient (fp32)", 4),
        *when([buffer("log-softmax input gradient (fp32)", 4)], one),
        *when([buffer("logits, the stage's output, held to its backward", act)], piped),
        *when(
            [
                buffer("exp of the log-softmax (fp32, loss_parallel)", 4),
                buffer("its sum with the nll_loss gradient (fp32, loss_parallel)", 4),
            ],
            many,
        ),
    ]
    return [(" forward", forward, False), (" backward", backward, True)]


def _split_head_reduce(b: _StageBuilder, held: list[Alloc]) -> list[Instant]:
    """Under a split root (`Parallel.fsdp_root`), the head's own unit's post-backward once
    the loss's backward is done: fully_shard copies the head's gradients into its
    reduce-scatter's input, in the reduce format, and frees them only after the copy
    (``foreach_reduce``: "Only after the copy-in finishes can we free the gradients"), so both
    are alive beside what the layers' backward has yet to use (`held`: the activations saved
    and the gradient into the last layer), whatever `overlap.dp_grads` says (a review, m207:
    no instant held them with it off, a 2,048-token Llama 3 8B plan 0.47 GiB low); the
    buffer stays through the last layer's backward where the reduction overlaps it
    (`_zero3_root_grads`). FullyShardedDataParallel keeps the computed gradient with its
    cast until the reduction is done: the same bytes here."""
    plan = b.plan
    par, prec = plan.parallel, plan.precision
    if par.fsdp_root != "split" or not b.last:
        return []
    n = _outside_params(b, "head")
    # fully_shard copies into a reduce-scatter input it allocates whatever the formats
    # (``foreach_reduce``: ``torch.empty`` of the reduce dtype, then the copy-in; an audit,
    # m454: none held at a bf16 reduce of bf16 gradients, 1.0 GB low on Llama 3 8B's loss)
    recast = (prec.reduce != prec.param_gather) | (par.fsdp == 2)
    size = n * (DTYPE_BYTES[prec.param_gather] + DTYPE_BYTES[prec.reduce] * recast)
    grads = Alloc("head gradients and their cast (copy-in)", "transient", size)
    on = (par.zero == 3) & (par.zero_ranks > 1) & (n > 0)
    if not np.any(holds(on)):
        return []
    live = [*b.resident, *_extra_saved(b, "backward"), *held, grads]
    return [Instant("head gradients' copy-in", tuple(when(live, on)))]


def _mtp_moves(plan: Plan, s: Shapes) -> list[Move]:
    """Tensor-parallel transitions of one multi-token prediction module besides its layer
    and output layer (Megatron-Core ``MultiTokenPredictionLayer._concat_embeddings``):

    - the vocab-parallel embedding of the next tokens, reduced over tp (reduce-scattered
      under sequence parallelism, whose backward all-gathers its gradient; a plan with
      learned positions has no modules, as in Megatron-LM, so the main embedding's
      all-reduce for them, `embedding_moves`, does not arise);
    - the column-parallel projection ``eh_proj`` of the concatenated 2·hidden input
      (gathered first under sequence parallelism; its input gradient reduced in backward,
      as around any column-parallel layer, `_tp_moves`);
    - its hidden-sharded output all-gathered over tp (``gather_from_tensor_model_parallel_
      region``), then split along the sequence under sequence parallelism, whose backward
      all-gathers the gradient along the sequence."""
    par = plan.parallel
    if every(par.tp == 1):
        return []
    sp = _sp(plan)
    dtype = plan.precision.activations
    size = s.act * s.tokens * s.hidden
    name = "multi-token prediction"

    def move(what: str, op: Op, src: Placement, dst: Placement, rule: str) -> Move:
        return Move(f"{name} {what}", op, "tp", par.tp, dtype, size, str(src), str(dst), rule=rule)

    needed = "tp: exposed, the next kernel needs it"
    embedding = [
        *when([move("embedding output", "reduce-scatter", PARTIAL, shard(0), needed)], sp),
        *when([move("embedding output", "all-reduce", PARTIAL, REPLICATE, needed)], lacks(sp)),
        *when([move("embedding output gradient", "all-gather", shard(0), REPLICATE, needed)], sp),
    ]
    proj, inward = flops.MTP_PROJECTION, ("input", 2 * s.hidden, 2 * s.hidden)
    forward = _tp_moves(plan, s, proj, False, proj, inward=inward)
    redo = _again(forward)
    backward = _tp_moves(plan, s, proj, True, proj, inward=inward)
    output = move("projection output", "all-gather", shard(1), REPLICATE, needed)
    gather = [
        output,
        *when([replace(output, name=f"{output.name} (recomputed)")], plan.recompute == "full"),
        *when([move("projection output gradient", "all-gather", shard(0), REPLICATE, needed)], sp),
    ]
    full = plan.recompute == "full"
    inputs = when(forward, sp) + when(redo, sp & full)
    return when(embedding + inputs + gather + backward, par.tp > 1)


def _again(moves: list[Move]) -> list[Move]:
    """`moves` of a forward that runs again before its backward (recompute; Megatron-LM's
    ``CheckpointFunction.backward`` re-runs the checkpointed forward, its collectives
    included): named so, and hidden behind the recomputed kernels (`_backward`'s
    ``(recomputed)`` copies) where they hid behind a kernel (`overlap.ep` beside full
    recompute is refused: `resolve._check_expert_overlap`)."""
    return [
        replace(
            m,
            name=f"{m.name} (recomputed forward)",
            window=m.window if m.window[:1] in ("", "@") else f"{m.window} (recomputed)",
        )
        for m in moves
    ]


def _backward(b: _StageBuilder) -> None:
    """Backward of the first micro-batch's last layer, when every micro-batch in flight is
    still saved: the stage's activation peak under 1F1B (Korthikanti section 4.2.3).
    Recompute repeats the whole layer's forward (full) or the attention core (selective).
    Under full recompute the layer's forward runs again before its backward (Megatron-LM's
    ``CheckpointFunction.backward``), so while the MLP's gradients are computed the
    attention's recomputed tensors wait for theirs."""
    plan, s, m = b.plan, b.shapes, b.microbatches
    par = plan.parallel
    sp = _sp(plan)
    full = plan.recompute == "full"
    # the layer's output the recompute makes again: Megatron-LM's (reentrant)
    # ``CheckpointFunction.backward`` keeps it in a local (``outputs``) until the layer's
    # backward returns, as Transformer Engine's and DeepSpeed's checkpoints do; PyTorch's
    # non-reentrant one, which stops early (`early_stop`), drops it (an audit, m459: not
    # counted, 48 MiB at GPT-3's peak without sequence parallelism)
    kept = Alloc(
        "layer output (recomputed, kept by the checkpoint's backward)",
        "transient",
        s.act * s.tokens_sp * s.hidden,
        placement=residual_placement(plan),
    )
    saved = [
        *_with_shards(b, 0),  # the head's gradient shard alone where the backward makes them
        *_extra_saved(b, "backward"),
        *b.root_grads,
        *_zero2_head_grads(b, tied_only=True),
        b.earlier,
        *b.current_layer,
        *when([kept], full & (not plan.recompute_early_stop)),
    ]
    blocks = b.layer.blocks
    grad_out = Alloc(
        "output gradient",
        "transient",
        s.act * s.tokens_sp * s.hidden,
        placement=residual_placement(plan),
    )
    col = "shard(ffn) on tp"
    gate = plan.model.gate
    partial_in = _before_reduction(plan, s, "fc1 input gradient")

    def bucket(block: str, after: Sequence[str]) -> list[Alloc]:
        """ZeRO-2's gradient bucket before its reduce-scatter, the whole layer's gradients
        (an MoE layer's for its MoE block, and for the attention of a stage whose last layer
        is MoE; its experts' where the expert data-parallel group shards them), or ZeRO-3's
        gathered block with its gradients (`_zero3_transients`)."""
        moe = block == "moe" or (block == "attention" and b.last_is_moe)
        layer = b.layer.per_rank["moe" if moe else "mlp"] * (par.zero_ranks > 1)
        experts = b.layer.experts * (expert_data_parallel(plan) > 1) if moe else 0
        n = (layer + experts) * DTYPE_BYTES[plan.precision.grads]
        grads = Alloc("gradient bucket before reduce-scatter", "transient", n)
        if par.reduce_bucket:  # DeepSpeed: one weight's at a time, into its buffer
            one = b.layer.largest[block] * DTYPE_BYTES[plan.precision.grads] * (n > 0)
            grads = Alloc(DEEPSPEED_GRADIENT, "transient", one)
        return _zero3_transients(plan, b.layer, block, after, backward=True) + when(
            [grads], (par.zero == 2) & (n > 0)
        )

    if b.has_moe:
        recomputed = when(_recomputed(blocks["attention"] + blocks["moe"]), full)
        held = [*saved, *recomputed]
        moe_bucket = bucket("moe", ["attention"])
        # the layer's forward again: its dispatch and combine, etp and shared-expert moves too
        forward = _ep_moves(plan, s, False, b.stage) + _shared_expert_moves(plan, s, False)
        moe_instants = [
            Instant(label, (*_spent(held, spent), grad_out, *live, *moe_bucket))
            for label, spent, live in _expert_backward(plan, s)
        ]
        b.add(
            "backward.moe",
            b.moe * m,
            when(_again(forward), full)
            + _ep_moves(plan, s, True, b.stage)
            + _shared_expert_moves(plan, s, True)
            + _zero3_moves(plan, b.layer, "moe", True, last_of=b.layers, behind_root=b.first),
            _zero3_layer_below(b, moe_instants, "moe") + _first_layer(b, moe_instants, "moe"),
            b.layer.kernels.backward("moe", s) + _accumulate(b, "moe"),
        )
    if b.has_dense:
        recomputed = when(_recomputed(blocks["attention"] + blocks["mlp"]), full)
        ffn_grad = Alloc(
            "fc2 input gradient", "transient", s.act * s.tokens * s.ffn_cols, placement=col
        )
        act_grad = Alloc(
            "activation-function input gradient",
            "transient",
            gate * s.act * s.tokens * s.ffn_cols,
            placement=col,
        )
        doubled = _squared(plan, "squared ReLU's 2·x", s.act * s.tokens * s.ffn_cols, col)
        gradient = _gathered(plan, s, "output gradient (all-gathered)", for_wgrad=True)
        # without sequence parallelism fc2 quantizes the whole output gradient it is handed,
        # as a column-parallel layer does (TransformerEngine 2.x ``_Linear.backward``), where
        # with it the gathered one is that (an audit, m429: 48 MiB missing at GPT-3's fc2)
        fc2_fp8 = _fp8_output_gradient(plan, s, "fc2 output gradient", s.hidden, "replicate on tp")
        out_gather = when([gradient], sp) + when(fc2_fp8, np.logical_not(sp))
        # PyTorch frees a node's saved tensors once its backward has run: the dropout mask
        # after the bias-dropout-add's, the block's first (an audit), fc2's input after
        # fc2's backward, the activation's input after the activation's
        mask = ["MLP dropout mask"]
        fc2_in, act_in = [FC2_INPUT, *mask], [activation_input(plan)]
        mlp_bucket = bucket("mlp", ["attention"])  # held through the block's three instants
        fc1_again = _gathered(plan, s, "fc1 input (re-gathered for weight grad)", for_wgrad=True)
        regather = when([fc1_again], _gathered_apart(plan))
        again = when(_mlp_again(plan, s), full)
        mlp_instants = [
            Instant(
                "fc2 gradients",
                (
                    *_spent(saved + recomputed, mask),
                    grad_out,
                    ffn_grad,
                    *out_gather,
                    *mlp_bucket,
                ),
            ),
            Instant(
                "activation gradients",
                (
                    *_spent(saved + recomputed, fc2_in),
                    grad_out,
                    ffn_grad,
                    act_grad,
                    *doubled,
                    *mlp_bucket,
                ),
            ),
            Instant(
                "fc1 weight and input gradients",
                (
                    *_spent(saved + recomputed, fc2_in + act_in),
                    grad_out,
                    act_grad,
                    *_fp8_output_gradient(plan, s, "fc1 output gradient", gate * s.ffn_cols, col),
                    *regather,
                    *partial_in,
                    *mlp_bucket,
                ),
            ),
        ]
        b.add(
            "backward.mlp",
            b.dense * m,
            again
            + _tp_moves(plan, s, "MLP", True, "MLP fc1", "MLP fc2")
            + _zero3_moves(plan, b.layer, "mlp", True, last_of=b.layers, behind_root=b.first),
            _zero3_layer_below(b, mlp_instants) + _first_layer(b, mlp_instants, "mlp"),
            b.layer.kernels.backward("mlp", s)
            + flops.bias_gradients(plan, s, "mlp")
            + _accumulate(b, "mlp"),
        )
    recomputed = when(_recomputed(blocks["attention"]), full)
    recomputed += eager_scores(plan, s, "attention scores gradient")
    # selective recompute runs the core's forward again with grad on, whatever its kernel:
    # what it saves is alive until the core's backward (an audit: a fused kernel's
    # statistics and all-gather attention's output halves were counted under full
    # recompute alone)
    recomputed += when(_working(b.layer.core, "recomputed"), plan.recompute == "selective")
    # the layer's MLP or MoE block has run its backward: its saved tensors are freed (the
    # rule of the MLP's instants; they were held through the attention's: a review)
    ffn_spent = [a.name for a in b.layer.mlp + b.layer.moe]
    # and before the core's backward the bias-dropout-add's and the output projection's have
    # run: the dropout mask is freed, and under eager attention the projection's input,
    # which only the projection saves (flash's kernel saves its output too; an audit), as
    # under FP8 training, where the projection saves an FP8 copy of its own
    alone = plan.model.attention == "eager" or te_fp8(plan)
    ffn_spent += ["attention dropout mask"] + ([PROJECTION_INPUT] if alone else [])
    attention_bucket = bucket("attention", b.ffn_blocks)
    qkv_grad = Alloc(
        "Q/K/V gradients",
        "transient",
        s.act * s.tokens * (s.q_cols + s.k_cols + s.v_cols),
        placement="shard(heads) on tp",
    )
    # all-gathered context parallelism makes a rank's own dK/dV only by the reduce-scatters
    # after the core's backward, by when its whole dK/dV have gone (an audit)
    gathered_cp = holds((plan.parallel.cp_attention == "allgather") & (par.cp > 1))
    core_grad = replace(
        qkv_grad, bytes=vwhere(gathered_cp, s.act * s.tokens * s.q_cols, qkv_grad.bytes)
    )
    # a fused kernel's backward reads the gradient of its output (dO, the output
    # projection's input gradient) while it writes dQ, dK and dV, as fc1's instant holds
    # the gradient it reads beside the one it makes (an audit, m386: left out, 16 MiB a
    # layer of Llama 3 70B at tp 8); eager attention's first product frees dO before its
    # dQ and dK exist, and its instant holds the scores' gradient instead
    out_grad = Alloc(
        "attention output gradient",
        "transient",
        s.act * s.tokens * s.out_cols,
        placement="shard(heads) on tp",
    )
    fused_grads = when([out_grad], plan.model.attention != "eager")
    # selective recompute checkpoints the core reentrantly (Megatron-LM's
    # ``_checkpointed_attention_forward``, ``tensor_parallel.checkpoint``): the core's
    # output made again is kept by ``CheckpointFunction.backward`` until the core's backward
    # returns. Under eager attention it is a tensor of its own (the context's
    # ``.contiguous()``), apart from what the freed projection saved (an audit, m459); a
    # fused kernel's is the output it saves itself (Transformer Engine's ``FusedAttnFunc``
    # saves ``out`` and returns it, viewed), counted already (a review, m461: FP8 counted
    # it twice)
    # the core's output is the shape of its gradient (`out_grad`)
    core_out = replace(
        out_grad, name="attention core output (recomputed, kept by the checkpoint's backward)"
    )
    kept_core = when(
        [core_out], (plan.recompute == "selective") & (plan.model.attention == "eager")
    )
    again = when(_again(attention_tp_moves(plan, s, False)), full)
    # the attention core runs again under either recompute, and under context parallelism
    # its K/V exchange with it (Transformer Engine's CP attention communicates inside the
    # core that Megatron-LM's selective recompute checkpoints)
    again += when(_again(_cp_moves(plan, s, False)), plan.recompute != "none")
    # under recompute with context parallelism the core's forward runs again first, holding
    # what its forward held (the ring's K/V chunks, step outputs and statistics, or the
    # gathered K/V) beside the output gradient, before any of the core's gradients exist
    rerun = []
    if not every(par.cp == 1) and not every(plan.recompute == "none"):
        held = when(_cp_buffers(plan, s), plan.recompute != "none")
        before = _spent(saved + recomputed, ffn_spent)
        live = (*before, grad_out, *held, *attention_bucket)
        rerun.append(Instant("attention core (recomputed)", live))
        # and before it an all-gathered K/V reordered again (`_cp_reorder`), the core's
        # recomputed outputs not yet made (a review: they were counted beside the copy)
        if copy := _cp_reorder(plan, s):
            core_made = {f"{a.name} (recomputed)" for a in b.layer.core}
            core_made.add(f"{PROJECTION_INPUT} (recomputed)")
            unmade = [a for a in before if a.name not in core_made]
            again_held = when([*_cp_buffers(plan, s), *copy], plan.recompute != "none")
            reorder = (*unmade, grad_out, *again_held, *attention_bucket)
            rerun.insert(0, Instant("K/V reordered for the core (recomputed)", reorder))
    attention_instants = _ffn_freed(
        b,
        [
            *rerun,
            Instant(
                "attention core gradients",
                (
                    *_spent(saved + recomputed, ffn_spent),
                    grad_out,
                    *fused_grads,
                    *kept_core,
                    core_grad,
                    *_cp_buffers(plan, s, backward=True),
                    *attention_bucket,
                ),
            ),
            # the QKV projection's backward, as fc1's: the core's and the output
            # projection's saved tensors spent, its input gathered again under sequence
            # parallelism beside its input gradient, partial on tp before the reduction
            Instant(
                "QKV weight and input gradients",
                (
                    *_spent(saved + recomputed, ffn_spent + _attention_spent(plan, s)),
                    grad_out,
                    qkv_grad,
                    *_fp8_output_gradient(
                        plan,
                        s,
                        "QKV output gradient",
                        s.q_cols + s.k_cols + s.v_cols,
                        "shard(heads) on tp",
                    ),
                    *when([_regathered_input(plan, s)], _gathered_apart(plan)),
                    *_before_reduction(plan, s, "QKV input gradient"),
                    *attention_bucket,
                ),
            ),
        ],
    )
    b.add(
        "backward.attention",
        b.layers * m,
        again
        + attention_tp_moves(plan, s, True)
        + _cp_moves(plan, s, True)
        + _zero3_moves(plan, b.layer, "attention", True, last_of=b.layers, behind_root=b.first),
        _zero3_layer_below(b, attention_instants, "attention")
        + _first_layer(b, attention_instants, "attention"),
        b.layer.kernels.backward("attention", s)
        + flops.bias_gradients(plan, s, "attention")
        + _accumulate(b, "attention"),
    )
    if b.first:
        gather = Move(
            "embedding output gradient",
            "all-gather",
            "tp",
            par.tp,
            plan.precision.activations,
            s.act * s.tokens * s.hidden,
            "shard(0)",
            "replicate",
            rule="tp: exposed, the embedding gradient needs it",
        )
        moves = (
            when([gather], sp) + _first_layer_reduction(b) + _root_moves(b, "embedding backward")
        )
        work = flops.backward_of(flops.embedding_work(plan, s))
        work += _embedding_gradients(b) + _root_copies(b, "embedding backward")
        b.add("backward.embedding", m, moves, _embedding_backward(b), work)
    if b.pipelined:
        boundary = send_boundary(b.stage, True, plan.parallel.pp)
        b.add(
            "pipeline.backward",
            m * _sends(plan, b.first),
            at_boundary(pipeline_moves(plan, s, forward=False), boundary),
            [],
        )


def _embedding_backward(b: _StageBuilder) -> list[Instant]:
    """What the first stage holds once a micro-batch's layers have all run their backward:
    the states, the other micro-batches in flight and the tensors outside the layers, then

    - the embedding's backward: its output gradient (all-gathered over tp under sequence
      parallelism) and the dense weight gradient ``F.embedding``'s backward makes, in the
      weights' format (at least 16-bit: fp8 recipes keep the embedding bf16), or under
      ZeRO-3 the gathered one (`_unsharded_gradient_bytes`), beside the head's gradient
      on a stage that also holds the head (`_zero3_root_grads`); Megatron-LM adds it into
      the main gradients and frees it, and autograd sums a tied embedding's two;
    - under ZeRO-3, the root unit's reduce-scatter: every parameter outside the layers with
      its whole gradient and, under FSDP's mixed precision, its cast to the reduce format
      (`_unsharded_gradient_bytes`), the gathered parameters freed before it (FSDP reshards
      a unit in its post-backward hook before reducing its gradients:
      ``_post_backward_hook`` in torch 2.1's ``_runtime_utils.py``, FSDP2's
      ``FSDPParamGroup.post_backward``).

    An audit: nothing was counted here, and a single-stage FSDP plan's peak, its root
    unit's 1.05 billion parameters' gradients at 6 B each, read 0.83 GiB low."""
    plan, s = b.plan, b.shapes
    par = plan.parallel
    zero3 = (par.zero == 3) & (par.zero_ranks > 1)
    # under a split root (`Parallel.fsdp_root`) the embedding's own unit, the head's reduced
    # long before, right after the loss
    split = par.fsdp_root == "split"
    unit = _outside_params(b, "embedding" if split else "root")
    name = "embedding" if split else _root_name(b)
    others = _earlier(b, b.layers - 1)  # this micro-batch's layer passes are all done
    # every layer's gradient shard made, the embedding's (a root unit's) not yet
    made = _with_shards(b, b.layers)
    extra = _extra_saved(b, "embedding", root=False)  # the gathered parameters freed
    grad_out = Alloc(
        "embedding output gradient",
        "transient",
        s.act * s.tokens_sp * s.hidden,
        placement=residual_placement(plan),
    )
    computed = vwhere(
        zero3, _unsharded_gradient_bytes(plan, False), max(2, DTYPE_BYTES[plan.precision.params])
    )
    weight = Alloc("embedding weight gradient", "transient", vocab_params(plan) * computed)
    # under ZeRO-2 its bucket in precision.grads beside it, as a layer's (`bucket`; an audit:
    # none), or where the stage holds the tied head, the head's gradient it adds into
    z2 = (par.zero == 2) & (par.zero_ranks > 1)
    tied_head = _zero2_head_grads(b, tied_only=True)
    bucketed = Alloc(
        "embedding gradient bucket before reduce-scatter (ZeRO-2)",
        "transient",
        vocab_params(plan) * DTYPE_BYTES[plan.precision.grads],
    )
    # none under DeepSpeed: the gradient computed is copied into its buffer
    bucketed_too = z2 & lacks(b.last & plan.model.tied_embeddings) & (not par.reduce_bucket)
    embedding_bucket = tied_head + when([bucketed], bucketed_too)
    backward = Instant(
        "embedding weight gradient",
        (
            *made,
            *_extra_saved(b, "embedding"),
            *([] if split else _zero3_root_grads(b)),
            *embedding_bucket,
            others,
            grad_out,
            *when([_full(s, "embedding output gradient (all-gathered)")], _sp(plan)),
            weight,
        ),
    )
    reducing = Alloc(
        f"{name} gradients (ZeRO-3, whole until reduce-scattered)",
        "transient",
        unit * _unsharded_gradient_bytes(plan, True),
    )
    reduce = Instant(
        f"{name} gradients' reduce-scatter",
        tuple(when([*b.resident, *extra, others, reducing], zero3)),
    )
    # fully_shard frees the computed gradients once copied into the reduce-scatter's input,
    # so during the copy both are alive (``foreach_reduce``; an audit: 2 B a parameter
    # missing there, as FullyShardedDataParallel holds them throughout)
    prec = plan.precision
    copy = unit * (DTYPE_BYTES[prec.param_gather] + DTYPE_BYTES[prec.reduce])
    copying = Alloc(f"{name} gradients and their cast (copy-in)", "transient", copy)
    # whatever the formats: ``foreach_reduce`` allocates the input and copies into it (m454)
    recast = flops.fsdp_mixed(plan) & (par.fsdp == 2)
    copy_in = Instant(
        f"{name} gradients' copy-in",
        tuple(when([*made, *extra, others, copying], zero3 & recast)),
    )
    return [
        backward,
        *([copy_in] if np.any(holds(zero3 & recast)) else []),
        *([reduce] if np.any(holds(zero3)) else []),
    ]


def _reduce(b: _StageBuilder) -> None:
    """Data-parallel gradient reduction and the optimizer step, per ZeRO stage.

    ZeRO-0: all-reduce the gradients. ZeRO-1/2: reduce-scatter the gradients, step on the
    shard, all-gather the updated parameters (Megatron-LM's distributed optimizer; ZeRO
    section 7: the same volume as one all-reduce). ZeRO-1 reduces once per step, from the
    full gradient buffer the micro-batches accumulate in; ZeRO-2 keeps only its shard, so
    it reduce-scatters after every micro-batch's backward ("gradient reduction is required
    after every backward because of gradient partitioning": DeepSpeed issue 2252, and
    ``stage_1_and_2.py``, which communicates off the accumulation boundary too). ZeRO-3
    reduces per block in backward (`_zero3_moves`), but DeepSpeed's bucket by bucket after
    every micro-batch's backward, here, its last bucket exposed.
    Non-expert gradients are reduced over dp x cp (Megatron-LM), expert gradients over the
    expert data-parallel group. Under sequence parallelism the parameters every tp rank
    applies to its own token shard (`layers.sequence_parallel_params`) are all-reduced over
    tp first.

    Overlap (Megatron-LM `--overlap-grad-reduce` / `--overlap-param-gather`, off by default):
    gradients are reduced bucket by bucket (one layer per bucket here) while the last
    micro-batch's backward goes on, and the last bucket is exposed, a call of its own: its
    own n·α and its share of the bytes' time (`Move.bucket`; an audit, m148, found it
    charged its share of the whole call's n·α, 0.51 ms of 4.95 ms short for GPT 1.3B at dp
    64 over 8 nodes); the parameter gather of
    the next step runs behind its first forward the same way. An interleaved stage of v
    model chunks launches each chunk's reduction as that chunk finishes its last
    micro-batch (``backward_step_helper_postprocess`` calls ``grad_sync_func[chunk]``;
    the gather likewise per chunk, ``forward_step_helper_preprocess``), so only the last
    chunk's part waits at the end (`Move.rounds`, priced in `schedule.time_phase`): model
    chunk 0's, the layers the split gives it (`StageClass.head_dense`, `head_moe`; for the
    expert groups its share of the stage's MoE layers) and, on the first stage, the
    embedding (`Move.last_part`); the last stage's head is in its last chunk, reduced early.
    Without interleaving, the first stage's last bucket is no smaller than its word and
    position embeddings: Megatron-LM fills its buckets in reverse parameter order, the
    order the backward produces gradients (``param_and_grad_buffer.py``), and the
    embedding's gradient is the backward's last, so the bucket holding it waits for the
    embedding's backward; the next step's first forward needs it first. The exposed floor
    of the data-parallel reduction and gather is then the larger of one layer's share and
    the embedding's (a tied output layer on the same stage is the same tensor).

    Megatron-Core buckets only the first pipeline stage's parameters: a later stage keeps
    each model chunk's in one bucket (``distributed_data_parallel.py`` sets ``bucket_size``
    to None where the pipeline rank is above 0, that stage's reduction being "not on the
    critical path"). Under 1F1B such a stage reduces once its last backward is done
    (``schedules.py``: "other pipeline stages do grad reduction during pipeline bubble"),
    so none of it hides behind that backward: it runs in the drain, the stage's lead
    (`schedule._with_leads`). Its gather is launched by the forward pre-hook of its first
    forward of the next step (``finish_param_sync``) once that forward's input has arrived
    (the receive is on the stream before it) and waited for whole, so the later stages'
    gathers run one after another along the fill (`Move.after_input`,
    `schedule.StageTime.gather_s`); Megatron-LM aligns gathers only where the schedule is
    interleaved (``align_param_gather``, which ``validate_args`` turns off otherwise). An
    interleaved stage reduces and gathers chunk by chunk as above, bucketed or not, and its
    first chunks' gathers are launched as its schedule starts (``param_sync_func``), beside
    the fill (`schedule.StageTime.fill_s`).
    """
    plan = b.plan
    par, prec = plan.parallel, plan.precision
    buckets = vmax(1, b.layers)
    share, floor = (buckets - 1) / buckets, 1 / buckets
    groups: list[tuple[str, MoveGroup, int, int]] = [("", "dp", par.zero_ranks, b.params.per_rank)]
    if not every(b.params.expert_per_rank == 0):
        groups.append(("expert ", "edp", expert_data_parallel(plan), b.params.expert_per_rank))
    grads: list[Move] = []
    gathers: list[Move] = []
    zero = par.zero
    v = par.pipeline.virtual_stages  # an interleaved stage reduces chunk by chunk
    chunked = "; interleaved: per model chunk, the last one's exposed" if every(v > 1) else ""
    # a later stage of a 1F1B pipeline: one bucket, none of it behind its own pass (docstring;
    # ZeRO-2, DeepSpeed's, keeps its buckets, and Megatron-LM runs no GPipe)
    gpipe = plan.parallel.pipeline.schedule == "gpipe"
    one_bucket = (v == 1) & (not b.first) & (zero != 2) & np.logical_not(gpipe)
    later = vwhere(one_bucket, 0.0, share)
    if np.any(holds(one_bucket)):
        chunked = "; a later pipeline stage's: one bucket, run in the pipeline's drain or fill"
    # model chunk 0, reduced last and gathered first: its layers, and on the first stage the
    # embedding (the last stage's head is in its last chunk, reduced early)
    whole, k = b.layer.per_rank, b.kind
    head = k.head_dense * whole["mlp"] + (k.head_moe * whole["moe"] if b.has_moe else 0)
    n_dense = b.params.per_rank
    first_chunk = vwhere(v > 1, (head + _root_params(b) * b.first) / vmax(n_dense, 1), 1.0)
    head_experts = vwhere(v > 1, k.head_moe / vmax(b.moe, 1), 1.0)
    embedding = b.params.lookup_per_rank
    embedding_floor = vwhere(v > 1, floor, vmax(floor, embedding * b.first / vmax(n_dense, 1)))
    for prefix, group, ranks, n in groups:
        if every(ranks == 1):
            continue
        reduce = [
            Move(
                f"{prefix}gradients",
                "all-reduce",
                group,
                ranks,
                prec.reduce,
                n * DTYPE_BYTES[prec.reduce],
                "partial",
                "replicate",
            ),
            Move(
                f"{prefix}gradients",
                "reduce-scatter",
                group,
                ranks,
                prec.reduce,
                n * DTYPE_BYTES[prec.reduce],
                "partial",
                "shard(0)",
            ),
        ]
        rule = (
            "dp gradients: exposed unless overlap.dp_grads reduces them bucket by "
            "bucket behind the last micro-batch's backward (last bucket exposed)"
        )
        last_part = first_chunk if group == "dp" else head_experts
        least = embedding_floor if group == "dp" else floor
        reduce = [
            replace(
                hide(
                    m, "@backward-microbatch", "dp_grads", rule + chunked, later, least, bucket=True
                ),
                rounds=v,
                last_part=last_part,
            )
            for m in reduce
        ]
        # ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters after every
        # micro-batch's backward, each behind its own backward (see the docstring)
        every_backward = replace(
            reduce[1],  # the same window, overlap flag, share and floor, once per micro-batch
            count=b.microbatches,
            share=share,  # ZeRO-2 (DeepSpeed's) keeps its buckets on every stage
            rounds=1,
            last_part=None,
            each_microbatch=True,
            rule="ZeRO-2 gradients: reduce-scattered after every micro-batch's backward (only "
            "the shard is kept), exposed unless overlap.dp_grads reduces them bucket by bucket "
            "behind it (last bucket exposed)",
        )
        # DeepSpeed's ZeRO 2 all-reduces each bucket instead, each rank keeping its shard of
        # the result (``average_tensor`` under ``use_multi_rank_bucket_allreduce``, its
        # default: "an All-Reduce instead of multiple Reduce ops"; an audit: priced as a
        # reduce-scatter, half the bytes)
        deepspeed = holds(zero == 2) & deepspeed_buffered(plan)
        exposed = vmax(least, _last_bucket_share(plan, n))  # at least a layer's share
        all_reduced = replace(
            reduce[0],
            count=b.microbatches,
            calls=_deepspeed_buckets(plan, n),
            share=vmin(share, 1 - exposed),
            floor=exposed,
            rounds=1,
            last_part=None,
            each_microbatch=True,
            rule="ZeRO-2 gradients, DeepSpeed's: all-reduced bucket by bucket after every "
            "micro-batch's backward (use_multi_rank_bucket_allreduce, its default), each rank "
            "keeping its shard, a collective a bucket (its steps all the buckets'), exposed "
            "unless overlap.dp_grads (overlap_comm) reduces them behind it (last bucket "
            "exposed)",
        )
        # DeepSpeed's ZeRO 3 reduce-scatters the gradients bucket by bucket as every
        # micro-batch's backward makes them, each a coalesced call of ``reduce_bucket_size``
        # elements (``reduce_independent_p_g_buckets_and_remove_grads``, then
        # ``__reduce_and_partition_ipg_grads``, stage3.py), and the last bucket in its
        # epilogue, which waits on it (``independent_gradient_partition_epilogue``): priced
        # as the buckets, not per block (an audit, m382: GPT 1.3B's block by block exposed
        # one block's share whatever the bucket, 17.8 ms a step where the epilogue's last
        # bucket takes 38.5 ms at 5e8 elements and 159 ms at 2e9)
        deepspeed3 = holds(zero == 3) & deepspeed_buffered(plan)
        scattered = replace(
            all_reduced,  # its window, floor and count, a reduce-scatter (reduce[1]'s op)
            op="reduce-scatter",
            dst="shard(0)",
            rule="ZeRO-3 gradients, DeepSpeed's: reduce-scattered bucket by bucket as every "
            "micro-batch's backward makes them (reduce_bucket_size), a collective a bucket "
            "(its steps all the buckets'), exposed unless "
            "overlap.dp_grads (overlap_comm) runs them behind it; the last bucket, reduced "
            "by the epilogue, exposed",
        )
        grads += (
            when(reduce[:1], zero == 0)
            + when(reduce[1:], zero == 1)
            + when([every_backward], (zero == 2) & lacks(deepspeed))
            + when([all_reduced], deepspeed)
            + when([scattered], deepspeed3)
        )
        rule = (
            "parameter gather: exposed unless overlap.param_gather runs it bucket by "
            "bucket behind the next step's first forward (first bucket exposed)"
        )
        for name, dtype, count, part in _gathered_formats(b, prefix, n):
            gather = Move(
                name,
                "all-gather",
                group,
                ranks,
                dtype,
                count * DTYPE_BYTES[dtype],
                "shard(0)",
                "replicate",
            )
            # split by format (`_gathered_formats`), the 16-bit part is gathered with the first
            # bucket group, which the first forward waits for (interleaved: each chunk's
            # with the chunk's, chunk 0's waited for), and the fp8 part's first bucket holds
            # no embedding; each part's chunk 0 is its own share of it (a review: the fp8
            # part's counted the embedding, which it does not hold)
            exposed, first = least, last_part
            if part != "all" and group == "dp":
                # chunk 0's GEMM weights are its part of the fp8 gather, the rest (norms,
                # biases, routers, the embedding) its part of the 16-bit one
                head_gemm, _ = gemm_weights(plan, k.head_dense, k.head_moe if b.has_moe else 0)
                head_wide = head - head_gemm + _root_params(b) * b.first
                first = (head_gemm if part == "gemm" else head_wide) / vmax(count, 1)
            if part == "gemm":
                exposed = floor
            elif part == "wide":
                exposed = vwhere(v > 1, floor, 1.0)
            hidden = hide(
                gather,
                "@forward-microbatch",
                "param_gather",
                (_WITH_FIRST_BUCKET if part == "wide" else rule) + chunked,
                later,
                exposed,
                bucket=True,
            )
            first = vwhere(v > 1, first, 1.0)
            # interleaved, chunk 0's part is waited for whole before its first forward, on
            # the first stage too, whose buckets arrive embedding last (`schedule.time_phase`)
            gathers += when(
                [replace(hidden, rounds=v, last_part=first, after_input=one_bucket)],
                (zero == 1) | (zero == 2),
            )
    replicated = b.dense * sequence_parallel_params(plan) + b.moe * sequence_parallel_params(
        plan, moe=True
    )
    # the norm before the head, and the three norms of each multi-token prediction module
    replicated += (1 + 3 * mtp_layers(plan)) * final_norm_params(plan) if b.last else 0
    # per-head Q/K norms are partial over tp with or without sequence parallelism
    qk = (b.dense + b.moe) * qk_norm_params(plan)
    sp = _sp(plan)
    # what the all-reduce holds, as the model has it (an audit: Q/K norms were named for
    # models without any)
    held = ["sequence-parallel weights"] if not every(lacks(sp)) else []
    held += ["per-head Q/K norms"] if qk_norm_params(plan) else []
    partial_over_tp = Move(
        "weight gradients partial over tp",
        "all-reduce",
        "tp",
        par.tp,
        prec.grads,
        vwhere(sp, replicated + qk, qk) * DTYPE_BYTES[prec.grads],
        "partial",
        "replicate",
        rule=(
            "tp: exposed, after the last backward (Megatron-LM's finalize_model_grads: "
            f"{', '.join(held)})"
        ),
    )
    partial = sp | ((qk > 0) & (par.tp > 1))
    if par.tp_style == "dtensor":
        # FSDP2's post-backward redistributes each replicated DTensor weight's partial
        # gradient over tp before its unit's reduce-scatter (``_get_grad_inner_tensor`` in
        # torch/distributed/fsdp/_fully_shard/_fsdp_param.py): one all-reduce a tensor, in
        # the gathered format, on the compute stream, exposed; the hidden-wide ones (norms,
        # row-parallel biases) under sequence parallelism, the per-head Q/K norms' with or
        # without (review m499: priced as Megatron-LM's one fp32 call, 67 µs where 161 calls
        # wait 6.8 ms on Llama 3 70B; review m500: a layernorm's weight and bias apart)
        gathered = DTYPE_BYTES[prec.param_gather]
        rule = (
            "tp (DTensor): exposed, one all-reduce a weight as FSDP2's post-backward "
            "redistributes its partial gradient, before its unit's reduce-scatter (counted "
            "here, after the last backward)"
        )
        h, d = plan.model.hidden, plan.model.head_dim
        wide = replace(
            partial_over_tp,
            dtype=prec.param_gather,
            size_bytes=h * gathered,
            count=replicated // h,
            rule=rule,
        )
        fsdp2 = when([wide], sp)
        if qk_norm_params(plan):
            fsdp2.append(
                replace(
                    wide,
                    name="Q/K norm gradients partial over tp",
                    size_bytes=d * gathered,
                    count=qk // d,
                )
            )
        # a sweep's ZeRO 3 layouts beside its others (under ZeRO 0 to 2 the one call)
        grads += when(fsdp2, partial & (par.zero == 3))
        partial = partial & (par.zero != 3)
    grads += when([partial_over_tp], partial)
    b.add("dp.grads", 1, grads, [Instant("gradient reduction", b.resident)])
    m = plan.model
    # The first stage's embedding has a copy on the last stage when the output layer is
    # tied to it or multi-token prediction looks the next tokens up there; Megatron-LM's
    # embedding group all-reduces the two copies' gradients.
    shared = m.tied_embeddings or mtp_layers(plan) > 0
    if shared and b.pipelined and (b.first or b.last):
        word = vocab_params(plan) * DTYPE_BYTES[prec.grads]
        # under ZeRO-2 and 3 each copy's gradient is already reduce-scattered: a shard each
        word = vwhere(holds(par.zero >= 2), -(-word // (par.zero_ranks)), word)
        b.add(
            "embedding.grads",
            1,
            [
                Move(
                    "tied embedding grads" if m.tied_embeddings else "shared embedding grads",
                    "all-reduce",
                    "pp",
                    2,
                    prec.grads,
                    word,
                    "partial",
                    "replicate",
                    rule="shared embedding: exposed, after the last backward",
                )
            ],
            [],
        )

    def updated(n: Any, ranks: Any) -> Any:
        """The share of `n` parameters this rank's optimizer updates: a 1/ranks shard
        under ZeRO, else all of them."""
        return vwhere(par.zero >= 1, -(-n // ranks), n)

    p = b.params
    shard = updated(p.per_rank, par.zero_ranks)
    shard += updated(p.expert_per_rank, expert_data_parallel(plan))
    # kept 16-bit under fp8 weights (`layers.resident_states`)
    wide = updated(p.vocab_per_rank + p.beside_gemms_per_rank, par.zero_ranks)
    wide += updated(p.expert_beside_per_rank, expert_data_parallel(plan))
    # the gradient buffer zeroed for the next step: whole under ZeRO-0/1, a shard above;
    # none under FSDP, whose optimizer drops its gradients (``zero_grad(set_to_none=True)``,
    # PyTorch 2's default) and whose next backward writes fresh ones (`_gradient_passes`),
    # with or without mixed precision (`flops.fsdp_grads`; an audit, m389: pure fp32 and
    # bf16 FSDP were charged the zeroing their memory model says they never hold)
    held = vwhere(par.zero >= 2, shard, p.per_rank + p.expert_per_rank)
    held = vwhere(flops.fsdp_grads(plan), 0, held)
    # nor under DeepSpeed's ZeRO 3, whose first micro-batch copies into its partition
    # buffer instead of adding ("don't accumulate", stage3.py ``__partition_grads``) and
    # whose ``zero_grad`` sets the gradients to None (an audit, m436)
    held = vwhere(flops.deepspeed_buffered(plan) & (par.zero == 3), 0, held)
    upcast = _upcast_grads(plan, shard)
    b.add(
        "optimizer",
        1,
        gathers,
        [
            *_flattened_upcast(b, upcast, shard),
            Instant("optimizer step", (*b.resident, *upcast, *_step_temporary(b, shard))),
        ],
        flops.optimizer_work(plan, shard, wide, held)
        + flops.fp8_weight_casts(plan, stage_fp8_weights(plan, b.kind)),
    )


# DeepSpeed ZeRO-3 steps its shard by sub-groups of this many elements (``sub_group_size``,
# 1e9 by default), upcasting one sub-group's gradients at a time
_SUB_GROUP = 10**9
# what DeepSpeed's gradient buffer leaves of a block's gradients (`_largest_weights`)
DEEPSPEED_GRADIENT = "largest weight gradient, before DeepSpeed copies it into its buffer"


_WITH_FIRST_BUCKET = (
    "parameter gather: the 16-bit parameters gathered with the first bucket group, which "
    "the next step's first forward waits for: exposed (interleaved: model chunk 0's)"
)


def _before_any_gradient(b: _StageBuilder) -> tuple[Alloc, ...]:
    """The stage's resident states as its forward and loss hold them: without the gradient
    shard where PyTorch FSDP has made none yet. Its optimizer drops the gradients
    (``zero_grad(set_to_none=True)``, PyTorch 2's default, which torchtitan's train step
    calls first) and the backward makes each block's (``foreach_reduce``:
    ``sharded_param.grad = new_sharded_dtensor_grad`` where it is None), so before a
    stage's first backward none exists, and every forward of the step comes before it where
    the stage holds all its micro-batches in flight at once (`inflight`; an audit: Llama 3
    8B under FSDP over 8 GPUs peaked 4.0 GB high at its loss, a plan that fits read over).
    ZeRO 3 is priced without a pipeline only (`resolve._check_pipeline_zero3`), so that is
    a step of one micro-batch; the rule is `inflight`'s, whose pipelines (GPipe, a warm-up
    as long as the step) FSDP does not reach here. A later forward comes after a backward
    and keeps the shard; that first backward makes it unit by unit (`_with_shards`)."""
    return tuple(_with_shards(b, 0, before=True))


def _first_backward(b: _StageBuilder) -> Any:
    """Where the stage's first backward makes its gradient shards (`_before_any_gradient`):
    PyTorch FSDP's, with or without mixed precision (`flops.fsdp_grads`), with every
    micro-batch's forward before it."""
    plan = b.plan
    # a sweep's class of several middle stages (`layers.merge_classes`) stands for the one
    # holding the fewest in flight too, at most the last middle stage's: without a gradient
    # shard only where that one is
    stage = vwhere(b.kind.copies > 1, plan.parallel.pp - 2, b.kind.stage)
    held = inflight(plan, stage, b.microbatches)
    return flops.fsdp_grads(plan) & (held >= b.microbatches)


def _with_shards(
    b: _StageBuilder, done: Any, ffn: tuple[Any, Any] = (0, 0), before: bool = False
) -> list[Alloc]:
    """The stage's resident states with the gradient shards its first backward has made
    (`_first_backward`; elsewhere every shard, as the states hold them) once `done` of its
    layers have run their backward, and `ffn` parameters of the next one's feed-forward
    unit (block units, `Parallel.fsdp_unit`), or none `before` the backward.

    FSDP makes a unit's shard as it reduce-scatters the unit's gradients, in the unit's
    post-backward (``foreach_reduce`` allocates the reduce-scatter's output and sets
    ``sharded_param.grad`` to a view of it where it is None): under a split root
    (`Parallel.fsdp_root`) the head's unit (the output layer and the final norm) right after
    the loss, then each layer's from the stage's last down, the embedding's last; a root unit
    holding the embedding and the head only after every layer. So a layer's backward holds
    the head's shard and those of the layers after it, not the whole shard (an audit: Llama
    3 8B over 8 GPUs with one micro-batch a step counted 3.49 GiB of shards at its last
    layer's backward, where 0.24 GiB exist, and read its peak 1.4 GiB high in the backward
    where it is at the loss). A stage's layers are priced as alike, each a share of the
    layers' parameters (those of a stage of dense and MoE layers differ). `ffn` is (dense,
    expert) parameters: the experts' shards are a state of their own, over the expert
    data-parallel group (`layers.resident_states`, named "expert ..."), made as their
    layers' are (a review: counted against the dense parameters alone, Mixtral's experts'
    shards were all made a layer below the last)."""
    early = b.first_backward
    if not np.any(holds(early)):
        return list(b.resident)
    par, parts = b.plan.parallel, dict(b.params.parts)
    dense: Any = 0
    experts: Any = 0
    if not before:
        own_head = b.last & (par.fsdp_root == "split")
        head = (parts.get("output layer", 0) + parts.get("final norm", 0)) * own_head
        per_layer = done / vmax(b.layers, 1)
        dense = head + parts.get("transformer layers", 0) * per_layer + ffn[0]
        experts = parts.get("experts", 0) * per_layer + ffn[1]
    shares = (
        vmin(1, dense / vmax(b.params.per_rank, 1)),
        vmin(1, experts / vmax(b.params.expert_per_rank, 1)),
    )

    def made(a: Alloc) -> Alloc:
        share = shares[a.name.startswith("expert ")]
        return replace(a, bytes=vwhere(early, vround(a.bytes * share), a.bytes))

    return [made(a) if a.category == "grads" else a for a in b.resident]


def _shards_made(
    b: _StageBuilder, done: Any, ffn: tuple[Any, Any] = (0, 0)
) -> Callable[[Iterable[Alloc]], list[Alloc]]:
    """A function giving live allocations with their gradient shards as `_with_shards`
    makes them, worked out once for every instant it is applied to; where no first
    backward makes them, the allocations as they are."""
    if not np.any(holds(b.first_backward)):
        return list
    made = {a.name: a for a in _with_shards(b, done, ffn) if a.category == "grads"}
    return lambda live: [made.get(a.name, a) if a.category == "grads" else a for a in live]


def _first_layer(b: _StageBuilder, instants: list[Instant], block: str) -> list[Instant]:
    """The stage's first layer's backward `instants`, where its first backward makes the
    gradient shards (`_with_shards`): every later layer's shard made, their saved tensors
    and kept parameters freed, the head's reduce-scatter input under a split root long
    gone, the layer above reducing behind it where `overlap.dp_grads` says so
    (`_zero3_layer_below`). The shards grow by a layer's as its saved tensors go, so a
    layer's backward peaks at the last layer's or the first's."""
    early = b.first_backward & (b.layers > 1)
    if not np.any(holds(early)):
        return []
    rest = b.layers - 1
    ffn = _ffn_unit(b) if block == "attention" else (0, 0)
    swap: dict[int, Alloc | None] = {id(b.earlier): _earlier(b, rest)}
    if b.plan.parallel.fsdp_root == "split":
        swap.update((id(a), None) for a in b.root_grads)
    # the layers kept gathered (`_kept_gathered`), less the feed-forward block that the
    # attention's instants have freed already (`_ffn_freed`): by name, that copy's own
    fewer = _kept_gathered(b, rest)
    freed = {k.name: k.bytes - f.bytes for k, f in zip(b.kept_gathered, fewer, strict=True)}

    shards = _shards_made(b, rest, ffn)

    def first(live: Iterable[Alloc]) -> list[Alloc]:
        kept = [replace(a, bytes=a.bytes - freed[a.name]) if a.name in freed else a for a in live]
        return shards(_swapped(kept, swap))

    on, reducing = _reducing_above(b, block)
    firsts = [
        Instant(
            f"{i.label}, the stage's first layer",
            tuple(when(first(i.live) + when([reducing], on), early)),
        )
        for i in instants
    ]
    # below the first layer (its attention, under block units) is the embedding's unit
    if b.plan.parallel.fsdp_unit == "layer" or block == "attention":
        return _root_prefetched(b, firsts, "embedding")
    return firsts


def _root_prefetched(b: _StageBuilder, instants: list[Instant], unit: str) -> list[Instant]:
    """`instants` of a stage's boundary layer, the last in its forward (`unit` "head") or
    the first in its backward ("embedding"), where the unit ZeRO-3 gathers ahead of the
    layer is outside the layers, not another layer (an audit: a layer's parameters were
    counted there, Llama 3 8B's first layer's backward 0.61 GB under): under a split root
    (`Parallel.fsdp_root`) that unit's, the head gathered behind the last layer's forward
    (`_zero3_root_moves`) and the embedding behind the first layer's backward (FSDP2's
    ``FSDPParamGroup._backward_prefetch`` gathers the unit before it in the forward's
    order); under a whole root none, the root gathered already and held through the
    micro-batch (`_root_held`). With the layers kept gathered from their forward
    (`Parallel.reshard_after_forward` off, `_kept_gathered`) nothing is prefetched but the
    head, gathered behind the last layer's forward all the same (the embedding is kept
    from its forward, `_root_held`)."""
    plan = b.plan
    par = plan.parallel
    if not plan.overlap.param_gather or every(lacks(par.zero == 3)):
        return instants
    n = _outside_params(b, unit) * DTYPE_BYTES[outside_gather(plan)]
    gathered = Alloc(f"gathered {unit} parameters (prefetched, an FSDP unit)", "transient", n)
    # under a split root, beside the instants whose layer had a unit gathered ahead
    root = when([gathered], (par.zero == 3) & (par.zero_ranks > 1) & (n > 0))
    root = root if par.fsdp_root == "split" else []
    always = unit == "head" and not par.reshard_after_forward  # the head, gathered all the same
    out = []
    for i in instants:
        live = [a for a in i.live if not a.name.startswith(PREFETCHED)]
        ahead = always or len(live) < len(i.live)
        out.append(Instant(i.label, tuple(live + root if ahead else live)))
    return out


def _swapped(live: Iterable[Alloc], swap: dict[int, Alloc | None]) -> list[Alloc]:
    """`live` with each allocation `swap` names by id replaced, or dropped where it says
    None."""
    return [x for a in live for x in [swap.get(id(a), a)] if x is not None]


def _ffn_unit(b: _StageBuilder) -> tuple[Any, Any]:
    """(dense, expert) parameters of a layer's feed-forward unit, reduced before its
    attention's backward under block units (`Parallel.fsdp_unit`); none under whole-layer
    units. The experts are the unit's expert data-parallel group's (`_zero3_groups`)."""
    if b.plan.parallel.fsdp_unit == "layer":
        return 0, 0
    groups = b.layer.zero3.get("moe" if b.last_is_moe else "mlp", [])
    expert = sum(n for group, _, n in groups if group == "edp")
    return sum(n for group, _, n in groups if group != "edp"), expert


def _gathered_formats(b: _StageBuilder, prefix: str, n: Any) -> list[tuple[str, str, Any, str]]:
    """The all-gathers of the `n` updated parameters of a group (`prefix` "expert " for the
    experts'): (name, format, parameters, part). In ``precision.param_gather`` where it is
    16-bit or wider ("all"); under an fp8 gather, in fp8 for the layers' GEMM weights
    ("gemm") and in bf16 for the rest ("wide", `layers.resident_states`: the vocabulary,
    norms, biases, routers), which Megatron-LM keeps in buffers of their own format
    (``--fp8-param-gather``: only Transformer Engine's modules' weights are fp8) and merges
    into the last fp8 bucket group, the model's beginning, gathered first and waited for by
    the first forward (``param_and_grad_buffer.partition_buckets``, its third case; a review:
    each part's first bucket was priced exposed apart, and most of the 16-bit part hidden)."""
    gathered = b.plan.precision.param_gather
    p = b.params
    wide = p.expert_beside_per_rank if prefix else p.vocab_per_rank + p.beside_gemms_per_rank
    if DTYPE_BYTES[gathered] >= flops.VOCAB_WEIGHT_BYTES or every(wide == 0):
        return [(f"updated {prefix}parameters", gathered, n, "all")]
    return [
        (f"updated {prefix}parameters", gathered, n - wide, "gemm"),
        (f"updated {prefix}16-bit parameters", "bf16", wide, "wide"),
    ]


def _stepped_at_once(plan: Plan, shard: Any) -> Any:
    """The elements of its `shard` a rank's optimizer steps at once: all of them, but one
    sub-group of at most `_SUB_GROUP` under DeepSpeed's ZeRO-3, which keeps a master copy
    (``_optimizer_step`` per sub-group); PyTorch FSDP, with none, steps its whole shard."""
    if plan.precision.master is None:
        return shard
    return vwhere(holds(plan.parallel.zero >= 3), vmin(shard, _SUB_GROUP), shard)


def _upcast_grads(plan: Plan, shard: Any) -> list[Alloc]:
    """The copy of the gradients a rank steps on in the master weights' format, where they
    are narrower, held through the optimizer step (`Precision.upcast_grads`): Megatron-LM's
    ``_copy_model_grads_to_main_grads`` sets each master parameter's gradient to the bf16
    gradient's ``.float()``, a new fp32 tensor beside the bf16 buffer (the distributed
    optimizer its shard's, the non-distributed one every parameter's), as DeepSpeed ZeRO 1
    and 2 step on an fp32 copy of their partition (the 4 bytes a parameter beside Adam's 12
    in ``estimate_zero2_model_states_mem_needs``) and ZeRO-3 on one sub-group's at a time.
    Nothing where the optimizer's kernel reads them as they are (``upcast_grads: false``,
    Apex's DistributedFusedAdam) or they are as wide as the master (a peers audit: 4.9 GiB
    left out of a bf16-gradient GPT 1.3B at ZeRO 0, its true peak)."""
    prec = plan.precision
    master = prec.master
    if master is None or not flops.grads_upcast(prec):
        return []
    name = f"gradients upcast to {master} for the step"
    return [Alloc(name, "transient", _stepped_at_once(plan, shard) * DTYPE_BYTES[master])]


def _flattened_upcast(b: _StageBuilder, upcast: list[Alloc], shard: Any) -> list[Instant]:
    """Where the plan names DeepSpeed (`deepspeed_buffered`), the moment its ZeRO 2 and 3
    cast the gradients they step on: each flattens them into one 16-bit tensor first and
    casts that (``flatten_dense_tensors_aligned(...).to(fp32)`` in stage_1_and_2.py's
    ``step``; ``self.flatten(self.averaged_gradients[i]).to(...)`` in stage3.py's
    ``_prepare_fp32_grad_for_sub_group``), the flat copy alive beside the cast until the
    statement ends (an audit: a ZeRO 3 plan at dp 2 read 2.0 GB under the run there). None
    where nothing is upcast (`_upcast_grads`)."""
    plan = b.plan
    deepspeed = deepspeed_buffered(plan)
    if not upcast or not np.any(holds(deepspeed)):
        return []
    flat = Alloc(
        "gradients flattened before their upcast (DeepSpeed)",
        "transient",
        _stepped_at_once(plan, shard) * DTYPE_BYTES[plan.precision.grads],
    )
    live = (*b.resident, *upcast, *when([flat], deepspeed))
    return [Instant("gradients upcast for the step", live)]


def _step_temporary(b: _StageBuilder, shard: Any) -> list[Alloc]:
    """What PyTorch's foreach optimizer allocates for the whole shard a rank updates
    (`Precision.optimizer_kernel`), alive together beside every state and the upcast
    gradients (``_group_tensors_by_device_and_dtype`` puts every parameter of a device and
    format in one list). PyTorch 2.13, ``torch/optim/adam.py``, ``_multi_tensor_adam``:
    ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``, a tensor per parameter
    in the moments' format, divided, shifted by ε and read by the update's ``addcdiv_``
    (AdamW's decoupled decay scales the parameters in place). ``sgd.py``,
    ``_multi_tensor_sgd``: ``device_grads = torch._foreach_add(device_grads, device_params,
    alpha=weight_decay)``, new tensors in the gradients' format, alive while the momentum
    adds them (weight decay on, as training sets it). The gradients are in the stepped
    tensors' format, as torch requires (`resolve` refuses other plans). DeepSpeed's ZeRO-3,
    with its master copy, steps one sub-group of its shard at a time (``_optimizer_step``
    per ``sub_group_size``, as `_upcast_grads`). Nothing for a fused kernel (Apex's and
    Transformer Engine's FusedAdam: one kernel over chunks of every tensor, writing in
    place).

    The for-loop kernel (``_single_tensor_adam``, Composer's ``DecoupledAdamW``) makes them
    a tensor at a time, for the largest tensor it steps (`_largest_stepped`; DeepSpeed hands
    the optimizer its flat partition, one tensor, or ZeRO-3's sub-group: review m356): Adam's
    ``(exp_avg_sq.sqrt() / bias_correction2_sqrt)`` holds the square root and the quotient
    at once, two tensors; SGD's ``d_p.add(param, alpha=weight_decay)`` one."""
    plan = b.plan
    prec = plan.precision
    kernel = prec.optimizer_kernel
    if kernel == "fused" or prec.optimizer == "none":
        return []
    if prec.optimizer == "adam":
        name, dtype = "square root of Adam's second moment", prec.optimizer_state
    else:
        dtype = prec.master if flops.grads_upcast(prec) and prec.master else prec.grads
        name = "gradients plus weight decay"
    if kernel == "foreach":
        n = _stepped_at_once(plan, shard)
        return [
            Alloc(
                f"{name} (foreach{' SGD' * (prec.optimizer == 'sgd')})",
                "transient",
                n * DTYPE_BYTES[dtype],
            )
        ]
    name += ", and its quotient" if prec.optimizer == "adam" else ""
    count = 2 if prec.optimizer == "adam" else 1
    flat = holds(deepspeed_buffered(plan))
    one = vwhere(flat, _stepped_at_once(plan, shard), _largest_stepped(b)) * DTYPE_BYTES[dtype]
    return [Alloc(f"{name} (for-loop, its largest tensor)", "transient", one, count)]


def _largest_stepped(b: _StageBuilder) -> Any:
    """The elements of the largest tensor a rank's optimizer steps, under ZeRO its shard of
    the tensor (each rank steps its range of every parameter: Megatron-LM's distributed
    optimizer, FSDP2's per-parameter DTensors; not DeepSpeed, which steps one flat
    partition, `_step_temporary`).

    The tensors are the parameters: the largest of a layer's weights (`flops.gemm`'s dims,
    an expert's own; a gated MLP's fc1 counted whole, as Megatron-Core fuses it, an upper
    bound where a stack keeps the gate apart) and a vocabulary table on a stage that holds
    one (`vocab_params`). Under PyTorch's FullyShardedDataParallel (``parallel.fsdp`` 1)
    they are its flat parameters, one a unit (a layer, or a block, `Parallel.fsdp_unit`)
    and the root's, which holds the vocabulary tables (and the final norm, a hidden's
    width, left out)."""
    plan, par = b.plan, b.plan.parallel
    layer, s = b.layer, b.shapes
    dims = [
        w.dims[1] * w.dims[2]
        for k in ["attention", *b.ffn_blocks]
        for w in layer.kernels.forward(k, s)
        if w.dims
    ]
    weight = largest(dims) if dims else 0
    table = vwhere(b.params.vocab_per_rank > 0, vocab_params(plan), 0)
    kind = "moe" if b.last_is_moe else "mlp"
    unit = vwhere(
        holds(par.fsdp_unit == "layer"), layer.per_rank[kind], largest(list(layer.params.values()))
    )
    root = b.params.vocab_per_rank
    flat = holds((par.zero >= 3) & (par.fsdp == 1))
    n = vwhere(flat, vmax(unit, root), vmax(weight, table))
    return vwhere(par.zero >= 1, -(-n // par.zero_ranks), n)


# --------------------------------------------------------------------------------------------
# Hand-written transitions


def _target(phases: list[Phase], name: str) -> int | None:
    """The phase a transition names: exactly, or the first of that prefix that holds
    tensors ("forward" → forward.attention)."""
    for i, phase in enumerate(phases):
        if phase.name == name:
            return i
    for i, phase in enumerate(phases):
        if phase.name.startswith(name + ".") and phase.instants:
            return i
    return None


def _beside(phases: list[Phase], target: int) -> tuple[Instant, ...]:
    """For a phase that holds no tensors of its own (an embedding lookup, a stage send: no
    more than the phase beside it), what is alive there, bounded from above by the nearest
    phase that has instants: the next one's first, else the previous one's last, under
    the target's name. A hand-written transition's tensors are added to it, so they count
    in the stage's peak (an audit: on such a phase they were priced and never held)."""
    after = [(p.name, p.instants[0]) for p in phases[target + 1 :] if p.instants]
    before = [(p.name, p.instants[-1]) for p in reversed(phases[:target]) if p.instants]
    nearest = [*after, *before]
    if not nearest:
        return (Instant("the transition alone", ()),)
    name, bound = nearest[0]
    return (Instant(f"at most what {name} holds at its {bound.label}", bound.live),)


def _held_between(
    phases: list[Phase],
    made: int,
    used: int,
    output: Alloc,
    tr: Transition,
    st: Any,
    per_microbatch: Any,
) -> None:
    """A chain's tensor from the phase its transition `made` it in to the later one whose
    transition `used` it (`tr`): held in every instant between them (DESIGN.md rule 2; a
    seeds audit: a tensor gathered in forward.embedding and sliced back in
    backward.embedding was counted in those two phases alone, its 1 GiB missing from the
    loss's peak). From a forward pass into its backward it is a saved activation: a copy
    for each instance of its phase in flight (`StageStep.inflight` micro-batches, times the
    layers of a per-layer phase), all of them between the two phases, and, as the
    engine's own instants count the last layer of the last micro-batch a stage admits
    (`_forward`), the earlier copies in the forward up to the one its transition makes,
    and in the backward from the phase that uses it on, those its transition has not read
    yet: the others, and once the micro-batch's layers are done (backward.embedding, its
    stage send) the other micro-batches'. `per_microbatch`: how many times a micro-batch
    makes it (a per-layer phase's layers; 1 where it names a whole pass, whose first phase
    with instants `made` may be a per-layer one: a review found its copies counted a
    layer each)."""
    crosses = pass_within(phases[made].name) == "forward" and pass_within(tr.phase) == "backward"
    copies = vceil(st.inflight * per_microbatch) if crosses else 1
    held = replace(
        output,
        name=f"{tr.name} (held from {phases[made].name} until {tr.phase})",
        count=copies,
    )
    earlier = replace(held, name=f"{held.name}, earlier copies", count=copies - 1)
    adds = [(k, [held]) for k in range(made + 1, used)]
    if crosses:
        forward = [k for k in range(made + 1) if pass_within(phases[k].name) == "forward"]
        adds += [(k, when([earlier], copies > 1)) for k in forward]
        for k in range(used, len(phases)):  # the backward from the phase that uses it
            if pass_within(phases[k].name) != "backward":
                continue
            layer = phases[k].name.rpartition(".")[2] in LAYER_PHASES
            read = 1 if layer else vround(per_microbatch)
            rest = replace(earlier, name=f"{held.name}, copies not read yet", count=copies - read)
            adds.append((k, when([rest], copies > read)))
    for k, extra in adds:
        if extra:
            phase = phases[k]
            instants = tuple(Instant(i.label, (*i.live, *extra)) for i in phase.instants)
            phases[k] = replace(phase, instants=instants)


def _dim0_copy(
    tr: Transition,
    src: Placement,
    dst: Placement,
    op: Op | None,
    others: list[tuple[str, Placement]],
    degrees: dict[str, Any],
    ranks: Any,
    full: Any,
) -> tuple[str, Any, Any, Placement] | None:
    """The copies a transition of a dimension other than 0 over `ranks` makes beside its
    output while it runs: (their label, where they are made, a bool or a sweep's array,
    their bytes, the placement they are in), or None. Over one rank DTensor runs no
    collective and copies nothing (``redistribute_local_tensor``: "only one shard"; a
    review).

    NCCL gathers and scatters along dimension 0 only, so DTensor's collectives rearrange
    (PyTorch, ``torch/distributed/_functional_collectives.py``): ``all_gather_tensor`` with
    ``gather_dim`` k > 0 gathers the shards one after the other and then concatenates their
    chunks along k (``torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)``), a
    second full tensor beside the gathered one until it is freed; where PyTorch has
    ``_maybe_view_chunk_cat`` that is a view, and no copy, if every dimension before k is of
    size 1 on the rank, which is taken as no copy. ``reduce_scatter_tensor`` with
    ``scatter_dim`` k > 0 first concatenates the input's chunks along k into a new tensor
    along dimension 0 (``torch.cat(torch.chunk(self, group_size, dim=scatter_dim))``),
    always a full copy, which the reduce-scatter then reads. So a rank holds the source,
    that copy and the output at once (an audit: the logits' shard(1) → replicate read
    4.5 GiB where DTensor holds 8.5 GiB). Its bytes are the rank's full piece (`full`),
    what the other groups' shards leave it.

    A shard(i) → shard(j) all-to-all (``Shard._to_new_shard_dim``: ``shard_dim_alltoall``,
    torch/csrc/distributed/c10d/Functional.cpp) moves the source's chunks along j to
    dimension 0 (``movedim(shard_dim, 0).contiguous()``, a copy unless j is 0), receives
    into a buffer of that size (``at::empty_like``) and moves the received chunks from
    dimension 0 to i (``recv_tensor.movedim(0, gather_dim).contiguous()``, the output, a
    copy beside the buffer unless i is 0): beside the source and the output, one shard's
    bytes for each of the two moves that copies (an audit, m340: none were counted, 512 MiB
    low on a shard(0) → shard(1) of 2 GiB over tp 4). As ``contiguous()`` passes over
    dimensions of size 1, a move copies only where the dimensions before j (on the source)
    or before i (on the buffer) hold more than one element on the rank (a review, m346: a
    [1, seq, hidden] shard(1) → shard(2) was counted a shard high)."""

    def before(dim: int, split_here: int | None) -> Any:
        """The rank's elements across the dimensions before `dim`, this group splitting
        dimension `split_here` too."""
        n: Any = 1
        for k in range(dim):
            split = math.prod(degrees[g] for g, at in others if at == Placement("shard", k))
            size = tr.shape[k] // split
            n = n * (size // ranks if k == split_here else size)
        return n

    if op == "all-gather" and src.dim:
        label = f"gathered along dimension 0, then copied along dimension {src.dim}"
        needed = (before(src.dim, None) > 1) & (ranks > 1)
        return f"{label}: DTensor's all_gather_tensor", needed, full, dst
    if op == "reduce-scatter" and dst.dim:
        label = f"its chunks along dimension {dst.dim} copied to dimension 0"
        label = f"{label} for the reduce-scatter: DTensor's reduce_scatter_tensor"
        return label, ranks > 1, full, src
    if op == "all-to-all" and src.dim is not None and dst.dim is not None:
        sent = holds(before(dst.dim, src.dim) > 1)  # the source's chunks along j moved to 0
        received = holds(before(src.dim, dst.dim) > 1)  # the buffer's dimension 0 moved to i
        steps = []
        if np.any(sent):
            steps.append(f"its chunks along dimension {dst.dim} moved to dimension 0")
        if np.any(received):
            steps.append(f"the buffer it receives into, then moved to dimension {src.dim}")
        if not steps:
            return None
        copies = 1 * sent + 1 * received
        label = f"{' and '.join(steps)}: DTensor's shard_dim_alltoall"
        return label, (copies > 0) & (ranks > 1), copies * -(-full // ranks), dst
    return None


def _with_transitions(plan: Plan, step: Step) -> Step:
    """Add the plan's `transitions:` to the phases they name, on every stage; a stage send
    on each stage that has the neighbour it goes to (`_sends`).

    Each becomes a Move priced like the built-in ones: where it names a whole pass
    (`WHOLE_PASSES`: forward, backward; serving's prefill, decode), `count` times per
    micro-batch or pass, in a phase of the pass and the tensor's name (it ran once per layer
    of the pass's first phase: an audit); else `count` times per instance of the phase it
    names, whole or by a prefix (per layer in forward.attention, per micro-batch in loss,
    once in dp.grads).
    Its output is alive during the phase it names, or the pass's first, and with
    `source_alive` its source too (DESIGN.md rule 2), a local slice's as a collective's,
    unless the source is the result of the tensor's transition before it in that phase,
    already held: a chain is one tensor, held from one transition to the next across the
    phases between them (`_held_between`).

    A tensor has a placement on each group it moves on, as a DTensor has one per mesh
    dimension (`check_chains`), and its shape is the full logical one: a transition on one
    group moves the piece the tensor's shards on the others leave each rank (its placement
    there when the transition runs, in step order), as DTensor's redistribution of one mesh
    dimension does. A tensor shard(0) on dp 4 and gathered over tp moves a quarter of its
    bytes (an audit: every group's transition moved and held the whole tensor).
    """
    if not plan.transitions:
        return step
    parsed, problems = check_chains(plan.file, plan.mode, plan.transitions)
    if problems:  # a plan `load_plan` resolved has none (nor, as a sweep's, `search._shaped`)
        raise BudgetError(problems)
    degrees = {
        "tp": plan.parallel.tp,
        "cp": plan.parallel.cp,
        "dp": plan.parallel.dp,
        "pp": plan.parallel.pp,
        "ep": plan.parallel.ep,
    }
    stages = []
    sent: set[int] = set()  # the transitions some stage holds
    from budget.inference import decode_passes  # inference builds on this module

    # a training pass runs once per micro-batch; serving runs one prefill, then its passes
    decodes = decode_passes(plan) if plan.mode == "decode" else 1
    m = step.microbatches
    pass_runs = {"forward": m, "backward": m, "prefill": 1, "decode": decodes}
    # each tensor's placement on each group before its first transition there
    starts: dict[tuple[str, str], Placement] = {}
    for tr, src, _, _ in parsed:
        starts.setdefault((tr.name, tr.group), src)
    for st in step.stages:
        phases = list(st.phases)
        passes: list[Phase] = []
        placed = dict(starts)  # where this stage's transitions have left each tensor
        made: dict[str, int] = {}  # the phase each tensor's last transition left it in
        named: dict[str, str] = {}  # the phase that transition names (a whole pass's too)
        outputs: dict[str, Alloc] = {}  # what each tensor's last transition made
        # a phase's instants before this index are moments past: before a transition's
        # output replaced its freed source; what later transitions (of any tensor: they run
        # in the file's order) hold is not in them
        past: dict[int, int] = {}
        # in step order (the file's within a phase), as `check_chains` walks and returns
        # them: which phase a tensor's last transition left it in decides whether the next
        # holds its source again (a review: listed A, B, C for a step running A, C, B, the
        # peak counted one replicated tensor more than listed A, C, B)
        for i, (tr, src, dst, op) in enumerate(parsed):
            # the piece its shards on the other groups leave a rank (the docstring); every
            # stage follows the whole chain, also where its phase is not on that stage (a
            # review: stages without the loss kept a placement the chain had left)
            others = [
                (group, at)
                for (name, group), at in placed.items()
                if name == tr.name and group != tr.group
            ]
            placed[tr.name, tr.group] = dst
            target = _target(phases, tr.phase)
            if target is None:
                continue
            send = op is None and tr.group == "pp" and src == dst
            back = pass_within(tr.phase) == "backward"  # its stage sends go to i - 1
            # a sweep's stage indices, depths and virtual stages are arrays, whose layouts
            # agree on both tests (a class is at the model's end in all or none; a stage
            # send keeps v 1 and v > 1 apart: `search.structure`)
            end = bool(np.all(st.stage == (0 if back else plan.parallel.pp - 1)))
            if send and not np.all(_sends(plan, end)):
                continue  # no stage after the last (forward) or before the first (backward)
            sent.add(i)
            prior = made.get(tr.name)
            held_already = prior == target
            made[tr.name] = target
            if prior is not None and prior < target and tr.name in outputs:
                # made once a micro-batch where it names a whole pass, else once an
                # instance of its phase (a layer's, in a per-layer one)
                once = named[tr.name] in WHOLE_PASSES
                instances = 1 if once else phases[prior].count / m
                _held_between(phases, prior, target, outputs[tr.name], tr, st, instances)
            named[tr.name] = tr.phase
            # a source freed while its output is made, where the transition before it in
            # this phase made that source: from then on its bytes are gone (an audit: they
            # stayed, beside a label saying they were counted freed)
            gone = outputs.get(tr.name) if held_already and not tr.source_alive else None
            ranks = degrees[tr.group]
            split = math.prod(degrees[g] for g, at in others if at.kind == "shard")
            full = -(-math.prod(tr.shape) * DTYPE_BYTES[tr.dtype] // split)
            local = {"shard": -(-full // ranks)}
            elsewhere = "".join(f", {at} on {g}" for g, at in others)
            # a source not counted beside the output says so where the bytes are read (see
            # the rule below): freed where the transition before it made it, otherwise left to
            # what holds it (an audit: "counted freed" beside the built-in logits it gathered)
            freed = ""
            if gone is not None:
                freed = "; its source freed, source_alive: false"
            elif not tr.source_alive:
                freed = "; its source not counted beside it, source_alive: false"
            made_bytes, source_bytes = local.get(dst.kind, full), local.get(src.kind, full)
            # but not before it is read: a reduce-scatter or a slice reads its whole source,
            # and in place (NCCL's reduce-scatter writes its output into its input's buffer)
            # the output lives in those bytes (an audit: a freed partial of 524 MB counted
            # as its 65.5 MB shard, below the all-reduce of the same tensor)
            # (a sweep's sizes are arrays, one a layout)
            shrinks = (not tr.source_alive) & (source_bytes > made_bytes)
            if np.any(shrinks):
                freed = f"; made in its {src} source's buffer, freed with it, source_alive: false"
            extra = [
                Alloc(
                    f"{tr.name} ({dst}{freed})",
                    "transient",
                    vwhere(shrinks, source_bytes, made_bytes),
                    placement=f"{dst} on {tr.group}{elsewhere}",
                )
            ]
            if tr.source_alive and src != dst and not held_already:
                # over one rank DTensor hands the source on as the output, one buffer
                # (`_dim0_copy`; an audit, m340: a gather over tp 1 held two)
                source = Alloc(
                    f"{tr.name} ({src}, source alive)",
                    "transient",
                    source_bytes,
                    placement=f"{src} on {tr.group}{elsewhere}",
                )
                extra += when([source], ranks > 1)
            if send and held_already and gone is None:
                # a stage send reads the tensor the transition before it in this phase made,
                # in place (``isend`` of that tensor; NCCL's send copies nothing), so the
                # sender holds no buffer more (an audit, m385: the tensor counted twice)
                extra = []
            copies: list[Alloc] = []  # alive while the collective runs, freed after it
            rearranged = _dim0_copy(tr, src, dst, op, others, degrees, ranks, full)
            if rearranged is not None:
                label, needed, nbytes, whole = rearranged
                placed_so = f"{whole} on {tr.group}{elsewhere}"
                copy = Alloc(f"{tr.name} ({label})", "transient", nbytes, placement=placed_so)
                copies = when([copy], needed)
            if extra:  # else the tensor stays the output that transition made
                outputs[tr.name] = extra[0]
            if held_already and gone is None:
                # over one rank the output is the held source itself, one buffer, as the
                # schema says (DTensor hands the local tensor on; an audit, m527: a chain's
                # replicate → shard(0) over cp 1 held its 1 GiB twice); later phases hold it
                extra = when(extra, ranks > 1)
            phase = phases[target]
            held = phase.instants or _beside(phases, target)
            start = past.get(target, 0)
            before: tuple[Instant, ...]
            if gone is None:  # in every instant where the tensor is as this one finds it
                before = tuple(held[:start])
                moment = [Instant(i.label, i.live + tuple(extra)) for i in held[start:]]
            else:  # those instants with the source, then each with the output instead of it
                before = tuple(held)
                moment = [
                    Instant(
                        f"{i.label}, {tr.name} {src} → {dst}",
                        tuple(a for a in i.live if a is not gone) + tuple(extra),
                    )
                    for i in held[start:]
                ]
                # a chain of three: its first output stayed beside its third, and beside
                # another tensor's later output where that freed a source between (reviews)
                past[target] = len(before)
            if copies:  # those moments with the copy, then the ones after it is freed,
                # which the later transitions of the phase find (they run after this one)
                during = tuple(
                    Instant(f"{i.label}, {tr.name} {src} → {dst}", (*i.live, *copies))
                    for i in moment
                )
                before, past[target] = (*before, *during), len(before) + len(during)
            phases[target] = replace(phase, instants=(*before, *moment))
            ends = str(src), str(dst)
            if send:
                # a stage boundary: one send/recv of S to the next stage, or in the backward
                # to the previous one (DESIGN.md rule 3), as the built-in stage sends are
                # (`pipeline_send`), on the stages that have that neighbour (`_sends`)
                op, ranks, ends = "send-recv", 2, ("i", "i-1" if back else "i+1")
            # on its own pair of stages' link, as the built-in ones (`schedule.move_span`;
            # audits: a serving pass's and a training step's all priced at the slowest link)
            boundary = send_boundary(st.stage, back, plan.parallel.pp) if send else None
            if op is None:
                continue
            rule = f"{HAND_WRITTEN}: exposed"
            if not tr.source_alive:
                # the seed: a fused kernel or allocator reuse can shorten a lifetime, "but
                # such a reduction needs implementation evidence"; the report says it rests
                # on one (a seeds audit)
                rule += (
                    "; its source not counted beside its output (source_alive: false), which "
                    "takes a fused or in-place kernel unless the source is held elsewhere"
                )
            move = Move(
                tr.name, op, tr.group, ranks, tr.dtype, full, *ends, rule=rule, boundary=boundary
            )
            if tr.phase in WHOLE_PASSES:  # once per micro-batch or pass, in its own phase
                # one a tensor: its chain on one group, or its reductions on dp and on tp, are
                # that phase's moves, as a named phase's are (an audit: a second transition of
                # "X" in the backward made a second phase of the same name, and the report's
                # one row per name showed one collective while the step counted both)
                name, move = f"{tr.phase}: {tr.name}", replace(move, count=tr.count)
                at = next((k for k, p in enumerate(passes) if p.name == name), len(passes))
                if at == len(passes):
                    passes.append(Phase(name, pass_runs[tr.phase]))
                passes[at] = replace(passes[at], moves=(*passes[at].moves, move))
            else:  # a phase, named whole or by a prefix of its name (dp → dp.grads)
                phases[target] = replace(
                    phases[target], moves=(*phase.moves, replace(move, count=tr.count))
                )
                _rerun_under_full_recompute(plan, phases, target, replace(move, count=tr.count))
        stages.append(replace(st, phases=(*phases, *passes)))
    known = tuple(dict.fromkeys(p.name for st in step.stages for p in st.phases))
    for i, (tr, _, _, op) in enumerate(parsed):  # a phase this plan's step lacks (pp 1)
        if all(_target(list(st.phases), tr.phase) is None for st in step.stages):
            message = unknown_phase(plan.mode, tr.phase, known)
            problems.append(transition_problem(plan.file, tr, message, ".phase"))
        elif i not in sent:  # a stage send where only the stage at the model's end runs
            # a sweep's depths are an array, all of them 1 or none (`search.structure`)
            pp = int(np.max(plan.parallel.pp))
            message = no_stage_to_send_to(tr.name, tr.phase, pp)
            problems.append(transition_problem(plan.file, tr, message, ".phase"))
        elif tr.group == "pp" and op is not None:
            apart = _stages_apart(tr, op, step)
            if apart is not None:
                problems.append(transition_problem(plan.file, tr, apart, ".phase"))
    if problems:
        raise BudgetError(problems)
    return replace(step, stages=tuple(stages))


def _rerun_under_full_recompute(plan: Plan, phases: list[Phase], target: int, move: Move) -> None:
    """A hand-written collective of a layer's forward (forward.attention, .mlp, .moe) runs
    again before that block's backward under full recompute, as the built-in ones do
    (`_again`: Megatron-LM's ``CheckpointFunction.backward`` re-runs the layer's forward,
    its collectives included; an audit, m527: a tensor-parallel gather in forward.attention
    was priced 256 times where the step ran it 512). Its output is counted where the
    forward made it, as before; the rerun adds its time and bytes. A stage send is the
    pipeline's, outside the layer, and runs once."""
    name = phases[target].name
    if move.op == "send-recv" or not name.startswith("forward.") or name not in LAYER_FORWARDS:
        return
    backward = "backward." + name.removeprefix("forward.")
    at = next((k for k, p in enumerate(phases) if p.name == backward), None)
    if at is None:
        return
    again = when(_again([move]), plan.recompute == "full")
    phases[at] = replace(phases[at], moves=(*phases[at].moves, *again))


# the phases a layer's forward runs in, which full recompute runs again before their backward
LAYER_FORWARDS = ("forward.attention", "forward.mlp", "forward.moe")


STAGES_APART = "which every pipeline stage must join"  # `_stages_apart`'s, which a sweep reads


def _stages_apart(tr: Transition, op: Op, step: Step) -> str | None:
    """Why a collective over pp in `tr`'s phase cannot run: every stage of the pipeline is
    a member of it, but the phase runs on some of them only (the loss on the last, the
    embedding's passes on the first), and the others never call it; NCCL's collective
    waits for every rank of its communicator. It was priced over the whole group and
    charged to the stages that run the phase alone (an audit, m426). A stage send is the
    pipeline's own exchange (`no_stage_to_send_to`)."""
    running = [
        k for k, st in enumerate(step.stages) if _target(list(st.phases), tr.phase) is not None
    ]
    if len(running) == len(step.stages):
        return None
    named = ", ".join(map(str, running))
    return (
        f"{tr.name!r} is {_AN_OP[op]} over pp, {STAGES_APART}, but "
        f"{tr.phase} runs only on stage{'s' if len(running) > 1 else ''} {named} of "
        f"{len(step.stages)}: the others never call it; move it in a phase every stage "
        "runs, or on a group within a stage"
    )


_AN_OP: dict[Op, str] = {
    "all-gather": "an all-gather",
    "reduce-scatter": "a reduce-scatter",
    "all-reduce": "an all-reduce",
    "all-to-all": "an all-to-all",
    "broadcast": "a broadcast",
    "send-recv": "a send-recv",
}
