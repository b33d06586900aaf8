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
from dataclasses import dataclass, field, replace

from budget import flops
from budget.errors import BudgetError, Problem
from budget.flops import Work
from budget.layers import (
    Shapes,
    attention_saved,
    core_attention,
    layer_params,
    layer_saved,
    mlp_saved,
    params_total,
    resident_states,
    residual_placement,
    shapes,
    stage_layers,
    stage_params,
)
from budget.phases import Alloc, Instant, Move, Phase, StageStep, Step, hide
from budget.placement import (
    PARTIAL,
    REPLICATE,
    IllegalTransition,
    Op,
    Placement,
    collective_for,
    shard,
)
from budget.plan.model import DTYPE_BYTES, Plan, Transition


def inflight(plan: Plan, stage: int, microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at once, counted in whole-stage units.

    1F1B (PipeDream-Flush): stage i runs p - i warm-up forwards before its first backward,
    so it holds min(p - i, m) micro-batches. GPipe holds all m. Interleaved 1F1B with v
    chunks: Megatron-LM warms up (p - i - 1)·2 + (v - 1)·p chunks and holds one more, each
    chunk 1/v of the stage's layers; on stage 0 that is p·(1 + (p - 1)/(p·v)) stage units
    (Korthikanti section 4.2.3).
    """
    p, v = plan.parallel.pp, plan.parallel.pipeline.virtual_stages
    schedule = plan.parallel.pipeline.schedule
    if schedule == "gpipe":
        return float(microbatches)
    if schedule == "interleaved":
        chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, microbatches * v)
        return chunks / v
    return float(min(p - stage, microbatches))


# --------------------------------------------------------------------------------------------
# Transitions


def _tp_moves(
    plan: Plan, s: Shapes, block: str, backward: bool, column: str, row: str = ""
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
    2105.05720) splits them into chunks hidden behind the adjacent GEMM. In backward the
    column-parallel layer's input-gradient reduction runs while its weight-gradient GEMM
    computes, and the re-gather of its input while the input-gradient GEMM computes (half of
    the layer's backward GEMM time each); the output-gradient gather is needed first and
    stays exposed unless `overlap.tp`.
    """
    par = plan.parallel
    if par.tp == 1:
        return []
    dtype = plan.precision.activations
    full = s.act * s.tokens * s.hidden

    def move(name: str, op: Op, src: Placement, dst: Placement) -> Move:
        return Move(f"{block} {name}", op, "tp", par.tp, dtype, full, str(src), str(dst))

    def forward(m: Move, gemm: str) -> Move:
        if not gemm:
            return replace(m, rule="tp forward: exposed, no GEMM to overlap with")
        return hide(m, gemm, "tp", "tp: exposed unless overlap.tp hides it behind its GEMM")

    wgrad = f"{column} backward"
    if backward:
        reduce_op: Op = "reduce-scatter" if par.sequence_parallel else "all-reduce"
        grad = move(
            "input gradient", reduce_op, PARTIAL, shard(0) if par.sequence_parallel else REPLICATE
        )
        out = [
            hide(
                grad,
                wgrad,
                "",
                "tp backward: overlaps the weight-gradient GEMM",
                share=0.5,
            )
        ]
        if par.sequence_parallel:
            again = move("input again, for weight grad", "all-gather", shard(0), REPLICATE)
            out.insert(
                0,
                hide(
                    again,
                    wgrad,
                    "",
                    "tp backward: overlaps the input-gradient GEMM",
                    share=0.5,
                ),
            )
            if row:
                out.insert(
                    0,
                    forward(
                        move("output gradient", "all-gather", shard(0), REPLICATE),
                        f"{row} backward",
                    ),
                )
        return out
    if not par.sequence_parallel:
        return [forward(move("output", "all-reduce", PARTIAL, REPLICATE), row)]
    moves = [forward(move("input", "all-gather", shard(0), REPLICATE), column)]
    if row:
        moves.append(forward(move("output", "reduce-scatter", PARTIAL, shard(0)), row))
    return moves


def _cp_moves(plan: Plan, s: Shapes, backward: bool) -> list[Move]:
    """Context parallel attention: every rank needs K and V of the whole sequence.

    Ring attention (Liu et al., arXiv 2310.01889) passes K/V chunks around the cp ring in
    cp - 1 send/recv steps, which moves exactly the bytes of a ring all-gather of K and V,
    each step hidden behind attention on the chunk already received ((cp - 1)/cp of the
    attention core). Llama 3 (arXiv 2407.21783, section 3.3.2) all-gathers K/V before
    attention instead, which leaves the gather exposed. Backward re-circulates K/V and
    reduce-scatters dK/dV the same way.
    """
    par = plan.parallel
    if par.cp == 1:
        return []
    kv = s.act * s.micro * s.seq_kv * 2 * s.kv_cols
    dtype = plan.precision.activations
    ring = par.cp_attention == "ring"
    core = flops.attention_core(plan, s).name + (" backward" if backward else "")
    share = (par.cp - 1) / par.cp

    def placed(m: Move) -> Move:
        if not ring:
            return replace(m, rule="cp all-gather of K/V: exposed before attention")
        return hide(
            m, core, "", "cp ring: each step overlaps attention on the previous chunk", share
        )

    moves = [
        placed(
            Move(
                "attention K/V" + (" (ring exchange)" if ring else ""),
                "all-gather",
                "cp",
                par.cp,
                dtype,
                kv,
                "shard(0)",
                "replicate",
            )
        )
    ]
    if backward:
        moves.append(
            placed(
                Move(
                    "attention dK/dV",
                    "reduce-scatter",
                    "cp",
                    par.cp,
                    dtype,
                    kv,
                    "partial",
                    "shard(0)",
                )
            )
        )
    return moves


def _zero3_moves(plan: Plan, backward: bool) -> list[Move]:
    """ZeRO-3 / FSDP: gather each layer's parameters before use, forward and backward;
    reduce-scatter its gradients after backward (Rajbhandari et al. section 7.2.3). With
    `overlap.param_gather` the next layer's gather is prefetched during this layer's compute;
    with `overlap.dp_grads` the gradient reduce-scatter runs during the next layer's
    backward (PyTorch FSDP's forward/backward prefetch, Zhao et al., arXiv 2304.11277)."""
    par = plan.parallel
    if par.zero < 3 or par.dp == 1:
        return []
    n = layer_params(plan).per_rank
    gather = Move(
        "layer parameters",
        "all-gather",
        "dp",
        par.dp,
        plan.precision.param_gather,
        n * DTYPE_BYTES[plan.precision.param_gather],
        "shard(0)",
        "replicate",
    )
    moves = [
        hide(
            gather,
            "@phase",
            "param_gather",
            "ZeRO-3 gather: exposed unless overlap.param_gather prefetches it behind "
            "the previous layer",
        )
    ]
    if backward:
        grads = Move(
            "layer gradients",
            "reduce-scatter",
            "dp",
            par.dp,
            plan.precision.grads,
            n * DTYPE_BYTES[plan.precision.grads],
            "partial",
            "shard(0)",
        )
        moves.append(
            hide(
                grads,
                "@phase",
                "dp_grads",
                "ZeRO-3 gradient reduce-scatter: exposed unless overlap.dp_grads "
                "runs it behind the next layer's backward",
            )
        )
    return moves


# --------------------------------------------------------------------------------------------
# The step


@dataclass
class _StageBuilder:
    plan: Plan
    stage: int
    layers: int
    microbatches: int
    shapes: Shapes
    resident: tuple[Alloc, ...]
    phases: list[Phase] = field(default_factory=list)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.plan.parallel.pp - 1

    def add(self, name: str, count: int, moves: list[Move], instants: list[Instant]) -> None:
        if name.startswith("pipeline."):
            moves = [_pipeline_overlap(self.plan, m) for m in moves]
        self.phases.append(Phase(name, count, tuple(moves), tuple(instants)))


def _pipeline_overlap(plan: Plan, move: Move) -> Move:
    """Send/recv between stages: 1F1B and GPipe wait for it; the interleaved schedule can
    run it behind another chunk's compute when `overlap.pp` is on (Megatron-LM's
    `--overlap-p2p-communication`, Narayanan et al. section 2.2.2)."""
    if plan.parallel.pipeline.schedule != "interleaved":
        return replace(move, rule="pp send/recv: exposed, the next stage waits for it")
    window = "@forward-microbatch" if move.dst == "i+1" else "@backward-microbatch"
    return hide(
        move,
        window,
        "pp",
        "pp send/recv: exposed unless overlap.pp hides it behind "
        "another chunk (interleaved schedule)",
        1 / plan.parallel.pipeline.virtual_stages,
    )


def _full(s: Shapes, name: str, placement: str = "replicate on tp") -> Alloc:
    return Alloc(name, "transient", s.act * s.tokens * s.hidden, placement=placement)


def _zero3_transients(plan: Plan) -> list[Alloc]:
    if plan.parallel.zero < 3 or plan.parallel.dp == 1:
        return []
    n = layer_params(plan).per_rank * DTYPE_BYTES[plan.precision.param_gather]
    return [Alloc("gathered layer parameters (current + prefetched)", "transient", n, count=2)]


def derive(plan: Plan) -> Step:
    """The training step of `plan`, stage by stage. Inference modes are not derived yet."""
    if plan.mode != "train":
        raise BudgetError(
            [
                Problem(
                    plan.file, 0, 0, "$.mode", f"mode {plan.mode!r} is not supported yet; use train"
                )
            ]
        )
    m = plan.microbatches
    s = shapes(plan)
    stages = []
    for stage, layers in enumerate(stage_layers(plan)):
        _, per_rank, _ = stage_params(plan, stage, layers)
        builder = _StageBuilder(plan, stage, layers, m, s, resident_states(plan, per_rank))
        _forward(builder)
        _backward(builder)
        _reduce(builder, per_rank)
        stages.append(
            StageStep(
                stage,
                layers,
                inflight(plan, stage, m),
                per_rank,
                builder.resident,
                tuple(builder.phases),
            )
        )
    step = Step(m, tuple(stages), params_total(plan), layer_params(plan).total)
    return _with_transitions(plan, _with_work(plan, step))


def phase_work(plan: Plan, name: str, params_rank: int) -> list[Work]:
    """The kernels one instance of phase `name` runs on one rank (see `budget.flops`).

    Backward phases include what recompute repeats: the whole layer's forward under full
    recompute, the attention core under selective recompute (Korthikanti section 5).
    """
    s = shapes(plan)
    attention, mlp = flops.attention_forward(plan, s), flops.mlp_forward(plan, s)
    recompute = plan.recompute
    if name == "forward.embedding":
        return flops.embedding_work(plan, s)
    if name == "forward.attention":
        return attention
    if name == "forward.mlp":
        return mlp
    if name == "loss":
        return flops.loss_work(plan, s)
    if name == "backward.mlp":
        again = [w.scaled(1, f"{w.name} (recomputed)") for w in mlp] if recompute == "full" else []
        return again + flops.backward_of(mlp)
    if name == "backward.attention":
        again = []
        if recompute == "full":
            again = [w.scaled(1, f"{w.name} (recomputed)") for w in attention]
        elif recompute == "selective":
            core = flops.attention_core(plan, s)
            again = [core.scaled(1, f"{core.name} (recomputed)")]
        return again + flops.backward_of(attention)
    if name == "backward.embedding":
        return flops.backward_of(flops.embedding_work(plan, s))
    if name == "optimizer":
        shard = -(-params_rank // plan.parallel.dp) if plan.parallel.zero >= 1 else params_rank
        return flops.optimizer_work(plan, shard)
    return []


def _with_work(plan: Plan, step: Step) -> Step:
    stages = []
    for st in step.stages:
        phases = tuple(
            replace(p, works=tuple(phase_work(plan, p.name, st.params))) for p in st.phases
        )
        stages.append(replace(st, phases=phases))
    return replace(step, stages=tuple(stages))


def _saved(b: _StageBuilder, units: float) -> Alloc:
    """Saved activations of `units` whole layers x micro-batches, as one allocation."""
    attn, mlp = layer_saved(b.plan, b.shapes)
    per_layer = sum(a.total for a in attn + mlp)
    return Alloc(
        "saved activations, earlier layers",
        "activations",
        per_layer,
        count=max(0, round(units)),
    )


def _extra_saved(b: _StageBuilder) -> list[Alloc]:
    """Per micro-batch tensors outside the layers (Korthikanti section 4.3): the embedding
    dropout mask on the first stage; the final norm and output-layer inputs on the last."""
    s, plan = b.shapes, b.plan
    inflight_mb = max(1, round(inflight(plan, b.stage, b.microbatches)))
    out = []
    if b.first and plan.model.dropout:
        out.append(
            Alloc(
                "embedding dropout mask",
                "activations",
                s.tokens_sp * s.hidden,
                count=inflight_mb,
                placement=residual_placement(plan),
            )
        )
    if b.last:
        out.append(
            Alloc(
                "final norm input",
                "activations",
                s.act * s.tokens_sp * s.hidden,
                count=inflight_mb,
                placement=residual_placement(plan),
            )
        )
        out.append(
            Alloc(
                "output layer input",
                "activations",
                s.act * s.tokens_sp * s.hidden,
                count=inflight_mb,
                placement=residual_placement(plan),
            )
        )
    return out


def _working(allocs: list[Alloc]) -> list[Alloc]:
    """Tensors that full recompute computes in forward but does not keep."""
    return [replace(a, name=f"{a.name} (working, not saved)", category="transient") for a in allocs]


def _forward(b: _StageBuilder) -> None:
    """Forward of the last layer of the last micro-batch a stage admits before its first
    backward: every earlier layer and micro-batch in flight is saved."""
    plan, s, m = b.plan, b.shapes, b.microbatches
    par = plan.parallel
    units = inflight(plan, b.stage, m) * b.layers
    sp = par.sequence_parallel and par.tp > 1
    z3 = _zero3_transients(plan)
    base = [*b.resident, *_extra_saved(b), _saved(b, units - 1)]
    full = plan.recompute == "full"
    checkpoint = layer_saved(plan, s)[0] if full else []
    attn, mlp = attention_saved(plan, s), mlp_saved(plan, s)
    if full:
        attn, mlp = _working(attn), _working(mlp)
    elif plan.recompute == "selective" and plan.model.attention == "eager":
        attn = attn + _working(core_attention(plan, s))

    if b.first:
        moves = []
        if par.tp > 1:
            op: Op = "reduce-scatter" if sp else "all-reduce"
            moves.append(
                Move(
                    "embedding output",
                    op,
                    "tp",
                    par.tp,
                    plan.precision.activations,
                    s.act * s.tokens * s.hidden,
                    "partial",
                    "shard(0)" if sp else "replicate",
                )
            )
        b.add("forward.embedding", m, moves, [])

    ag_attn = [_full(s, "attention input (all-gathered)")] if sp else []
    b.add(
        "forward.attention",
        b.layers * m,
        _tp_moves(plan, s, "attention", False, "QKV projection", "attention output projection")
        + _cp_moves(plan, s, False)
        + _zero3_moves(plan, False),
        [
            Instant("QKV projection", tuple(base + checkpoint + attn[:2] + ag_attn + z3)),
            Instant("after attention", tuple(base + checkpoint + attn + z3)),
        ],
    )
    ag_mlp = [_full(s, "MLP input (all-gathered)")] if sp else []
    partial_out = (
        [_full(s, "MLP output (partial, before reduction)", "partial on tp")] if par.tp > 1 else []
    )
    kept_attn = [] if full else attn
    b.add(
        "forward.mlp",
        b.layers * m,
        _tp_moves(plan, s, "MLP", False, "MLP fc1", "MLP fc2") + _zero3_moves(plan, False),
        [
            Instant("fc1", tuple(base + checkpoint + kept_attn + mlp[:2] + ag_mlp + z3)),
            Instant(
                "fc2 output reduction",
                tuple(base + checkpoint + kept_attn + mlp + partial_out + z3),
            ),
        ],
    )
    if b.last:
        _loss(b, units)
    if par.pp > 1 and not b.last:
        b.add(
            "pipeline.forward",
            m,
            [
                Move(
                    "activations → next stage",
                    "send-recv",
                    "pp",
                    2,
                    plan.precision.activations,
                    s.act * s.tokens_sp * s.hidden,
                    "i",
                    "i+1",
                )
            ],
            [],
        )


def _loss(b: _StageBuilder, units: float) -> None:
    """Output layer and vocab-parallel cross-entropy on the last stage (Megatron-LM's
    `vocab_parallel_cross_entropy`): logits sharded over vocab on tp, upcast to fp32, with
    their fp32 gradient; three small all-reduces (max, sum of exponentials, target logit)."""
    plan, s = b.plan, b.shapes
    t = plan.parallel.tp
    vocab_cols = -(-plan.model.vocab // t)
    logits = s.tokens * vocab_cols
    vocab_place = "shard(vocab) on tp"
    live = [
        *b.resident,
        *_extra_saved(b),
        _saved(b, units),
        Alloc("logits", "transient", s.act * logits, placement=vocab_place),
        Alloc("logits (fp32)", "transient", 4 * logits, placement=vocab_place),
        Alloc("logits gradient (fp32)", "transient", 4 * logits, placement=vocab_place),
    ]
    if plan.parallel.sequence_parallel and t > 1:
        live.append(_full(s, "output layer input (all-gathered)"))
    moves = []
    if t > 1:
        moves.append(
            Move(
                "cross-entropy statistics",
                "all-reduce",
                "tp",
                t,
                "fp32",
                4 * s.tokens,
                "partial",
                "replicate",
                count=3,
            )
        )
        if plan.parallel.sequence_parallel:
            moves.extend(_tp_moves(plan, s, "output layer", False, "output layer")[:1])
        moves.extend(_tp_moves(plan, s, "output layer", True, "output layer"))
    b.add("loss", b.microbatches, moves, [Instant("cross-entropy", tuple(live))])


def _backward(b: _StageBuilder) -> None:
    """Backward of the first micro-batch's last layer, when every micro-batch in flight is
    still saved: the stage's activation peak under 1F1B (Korthikanti section 4.2.3)."""
    plan, s, m = b.plan, b.shapes, b.microbatches
    par = plan.parallel
    units = inflight(plan, b.stage, m) * b.layers
    sp = par.sequence_parallel and par.tp > 1
    current = [*layer_saved(plan, s)[0], *layer_saved(plan, s)[1]]
    all_saved = [*b.resident, *_extra_saved(b), _saved(b, units - 1), *current]
    z3 = _zero3_transients(plan)
    if par.zero >= 2 and par.dp > 1:
        z3 = [
            *z3,
            Alloc(
                "layer gradient bucket before reduce-scatter",
                "transient",
                layer_params(plan).per_rank * DTYPE_BYTES[plan.precision.grads],
            ),
        ]
    grad_out = Alloc(
        "output gradient",
        "transient",
        s.act * s.tokens_sp * s.hidden,
        placement=residual_placement(plan),
    )
    attn_full, mlp_full = attention_saved(plan, s), mlp_saved(plan, s)
    recomputed: list[Alloc] = []
    if plan.recompute == "full":
        recomputed = [
            replace(a, name=f"{a.name} (recomputed)", category="transient")
            for a in attn_full + mlp_full
        ]
    col = "shard(ffn) on tp"
    ffn_grad = Alloc(
        "fc2 input gradient", "transient", s.act * s.tokens * s.ffn_cols, placement=col
    )
    gate = 2 if plan.model.mlp == "swiglu" else 1
    act_grad = Alloc(
        "activation-function input gradient",
        "transient",
        gate * s.act * s.tokens * s.ffn_cols,
        placement=col,
    )
    gathered = []
    if sp:
        gathered = [
            _full(s, "output gradient (all-gathered)"),
            _full(s, "fc1 input (re-gathered for weight grad)"),
        ]
    partial_in = (
        [_full(s, "fc1 input gradient (partial, before reduction)", "partial on tp")]
        if par.tp > 1
        else []
    )
    recompute_moves = (
        _tp_moves(
            plan,
            s,
            "MLP (recomputed forward)",
            False,
            "MLP fc1 (recomputed)",
            "MLP fc2 (recomputed)",
        )
        if plan.recompute == "full"
        else []
    )
    b.add(
        "backward.mlp",
        b.layers * m,
        recompute_moves
        + _tp_moves(plan, s, "MLP", True, "MLP fc1", "MLP fc2")
        + _zero3_moves(plan, True),
        [
            Instant(
                "fc2 and activation gradients",
                tuple(all_saved + recomputed + [grad_out, ffn_grad, act_grad] + gathered[:1] + z3),
            ),
            Instant(
                "fc1 weight and input gradients",
                tuple(
                    all_saved + recomputed + [grad_out, act_grad] + gathered[1:] + partial_in + z3
                ),
            ),
        ],
    )
    score_grad: list[Alloc] = []
    if plan.model.attention == "eager":
        score = s.micro * s.heads * (s.tokens // s.micro) * s.seq_kv
        score_grad = [Alloc("attention scores gradient", "transient", s.act * score)]
        if plan.recompute == "selective":
            score_grad += [
                replace(a, name=f"{a.name} (recomputed)", category="transient")
                for a in core_attention(plan, s)
            ]
    qkv_grad = Alloc(
        "Q/K/V gradients",
        "transient",
        s.act * s.tokens * (s.q_cols + 2 * s.kv_cols),
        placement="shard(heads) on tp",
    )
    recompute_moves = (
        _tp_moves(
            plan,
            s,
            "attention (recomputed forward)",
            False,
            "QKV projection (recomputed)",
            "attention output projection (recomputed)",
        )
        if plan.recompute == "full"
        else []
    )
    b.add(
        "backward.attention",
        b.layers * m,
        recompute_moves
        + _tp_moves(plan, s, "attention", True, "QKV projection", "attention output projection")
        + _cp_moves(plan, s, True)
        + _zero3_moves(plan, True),
        [
            Instant(
                "attention core gradients",
                tuple(all_saved + recomputed + [grad_out, qkv_grad] + score_grad + z3),
            )
        ],
    )
    if b.first and par.tp > 1 and sp:
        b.add(
            "backward.embedding",
            m,
            [
                Move(
                    "embedding output gradient",
                    "all-gather",
                    "tp",
                    par.tp,
                    plan.precision.activations,
                    s.act * s.tokens * s.hidden,
                    "shard(0)",
                    "replicate",
                )
            ],
            [],
        )
    if par.pp > 1 and not b.first:
        b.add(
            "pipeline.backward",
            m,
            [
                Move(
                    "gradients → previous stage",
                    "send-recv",
                    "pp",
                    2,
                    plan.precision.activations,
                    s.act * s.tokens_sp * s.hidden,
                    "i",
                    "i-1",
                )
            ],
            [],
        )


def _reduce(b: _StageBuilder, params_rank: int) -> None:
    """Data-parallel gradient reduction and the optimizer step, per ZeRO stage.

    ZeRO-0: all-reduce the gradients. ZeRO-1/2: reduce-scatter the gradients, step on the
    shard, all-gather the updated parameters (Megatron-LM's distributed optimizer; ZeRO
    section 7: the same volume as one all-reduce). ZeRO-3 reduces per layer in backward.
    With context parallelism, gradients are reduced over dp x cp (Megatron-LM).

    Overlap (Megatron-LM `--overlap-grad-reduce` / `--overlap-param-gather`, off by default):
    gradients are reduced bucket by bucket (one layer per bucket here) while the last
    micro-batch's backward goes on, and the last bucket is exposed; the parameter gather of
    the next step runs behind its first forward the same way.
    """
    plan = b.plan
    par, prec = plan.parallel, plan.precision
    ranks = par.dp * par.cp
    buckets = max(1, b.layers)
    share, floor = (buckets - 1) / buckets, 1 / buckets
    grads = params_rank * DTYPE_BYTES[prec.grads]
    moves: list[Move] = []
    if ranks > 1 and par.zero < 3:
        op: Op = "all-reduce" if par.zero == 0 else "reduce-scatter"
        dst = "replicate" if par.zero == 0 else "shard(0)"
        move = Move("gradients", op, "dp", ranks, prec.grads, grads, "partial", dst)
        rule = (
            "dp gradients: exposed unless overlap.dp_grads reduces them bucket by bucket "
            "behind the last micro-batch's backward (last bucket exposed)"
        )
        moves.append(hide(move, "@backward-microbatch", "dp_grads", rule, share, floor))
    b.add("dp.grads", 1, moves, [Instant("gradient reduction", b.resident)])
    m = plan.model
    if m.tied_embeddings and par.pp > 1 and (b.first or b.last):
        word = -(-m.vocab * m.hidden // par.tp) * DTYPE_BYTES[prec.grads]
        tied = Move(
            "tied embedding grads",
            "all-reduce",
            "pp",
            2,
            prec.grads,
            word,
            "partial",
            "replicate",
            rule="tied embedding: exposed, after the last backward",
        )
        b.add("embedding.grads", 1, [tied], [])
    opt_moves = []
    if ranks > 1 and par.zero in (1, 2):
        gather = Move(
            "updated parameters",
            "all-gather",
            "dp",
            ranks,
            prec.param_gather,
            params_rank * DTYPE_BYTES[prec.param_gather],
            "shard(0)",
            "replicate",
        )
        rule = (
            "parameter gather: exposed unless overlap.param_gather runs it bucket by "
            "bucket behind the next step's first forward (first bucket exposed)"
        )
        opt_moves.append(hide(gather, "@forward-microbatch", "param_gather", rule, share, floor))
    b.add("optimizer", 1, opt_moves, [Instant("optimizer step", b.resident)])


# --------------------------------------------------------------------------------------------
# Hand-written transitions


def _problem(plan: Plan, tr: Transition, message: str, key: str = "") -> Problem:
    where = tr.where
    line, col, path = (where.line, where.col, where.path) if where else (0, 0, "$.transitions")
    return Problem(plan.file, line, col, path + key, message)


def check_transitions(plan: Plan) -> list[tuple[Transition, Placement, Placement, Op | None]]:
    """Parse the hand-written transitions and refuse the ones that would make a budget
    cheaper by being wrong (DESIGN.md rule 7).

    Transitions that share a name form one tensor's chain, in plan order: each must start
    where the previous one left the tensor, and a sum-partial tensor must be reduced before
    the chain ends, since whatever consumes it next takes it as complete. A gradient that
    reaches the optimizer step still partial has skipped its data-parallel reduction.
    """
    problems: list[Problem] = []
    parsed = []
    last: dict[str, tuple[Transition, Placement]] = {}
    for tr in plan.transitions:
        try:
            src, dst = Placement.parse(tr.src), Placement.parse(tr.dst)
            op = collective_for(src, dst)
        except (ValueError, IllegalTransition) as error:
            problems.append(_problem(plan, tr, str(error)))
            continue
        before = last.get(tr.name)
        if before is not None and before[1] != src:
            problems.append(
                _problem(
                    plan,
                    tr,
                    f"{tr.name!r} starts from {src}, but the "
                    f"transition before it left it {before[1]}",
                    ".from",
                )
            )
        if dst.kind == "partial" and tr.phase.startswith("optimizer"):
            problems.append(
                _problem(
                    plan,
                    tr,
                    f"{tr.name!r} reaches the optimizer step "
                    f"sum-partial on {tr.group}: the gradient reduction is "
                    "missing; reduce it with partial → replicate (all-reduce) "
                    "or partial → shard(0) (reduce-scatter)",
                    ".to",
                )
            )
        last[tr.name] = (tr, dst)
        parsed.append((tr, src, dst, op))
    for name, (tr, dst) in last.items():
        if dst.kind == "partial" and not tr.phase.startswith("optimizer"):
            problems.append(
                _problem(
                    plan,
                    tr,
                    f"{name!r} is left sum-partial on {tr.group} "
                    "and would be consumed as if complete: add its reduction "
                    "(partial → replicate or partial → shard)",
                    ".to",
                )
            )
    if problems:
        raise BudgetError(problems)
    return parsed


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


def _with_transitions(plan: Plan, step: Step) -> Step:
    """Add the plan's `transitions:` to the phases they name, on every stage.

    Each becomes a Move priced like the built-in ones; its output is alive during that
    phase and, with `source_alive`, its source too (DESIGN.md rule 2).
    """
    if not plan.transitions:
        return step
    parsed = check_transitions(plan)
    degrees = {
        "tp": plan.parallel.tp,
        "cp": plan.parallel.cp,
        "dp": plan.parallel.dp,
        "pp": plan.parallel.pp,
        "ep": plan.parallel.ep,
    }
    problems: list[Problem] = []
    stages = []
    for st in step.stages:
        phases = list(st.phases)
        for tr, src, dst, op in parsed:
            target = _target(phases, tr.phase)
            if target is None:
                if st.stage == 0:
                    known = ", ".join(dict.fromkeys(p.name for p in phases))
                    problems.append(
                        _problem(
                            plan,
                            tr,
                            f"unknown phase {tr.phase!r}; use one of forward, backward, {known}",
                            ".phase",
                        )
                    )
                continue
            ranks = degrees[tr.group]
            full = math.prod(tr.shape) * DTYPE_BYTES[tr.dtype]
            local = {"shard": -(-full // ranks)}
            extra = [
                Alloc(
                    f"{tr.name} ({dst})",
                    "transient",
                    local.get(dst.kind, full),
                    placement=f"{dst} on {tr.group}",
                )
            ]
            if tr.source_alive and op is not None:
                extra.append(
                    Alloc(
                        f"{tr.name} ({src}, source alive)",
                        "transient",
                        local.get(src.kind, full),
                        placement=f"{src} on {tr.group}",
                    )
                )
            phase = phases[target]
            moves = phase.moves
            if op is not None:
                moves = (
                    *moves,
                    Move(
                        tr.name,
                        op,
                        tr.group,
                        ranks,
                        tr.dtype,
                        full,
                        str(src),
                        str(dst),
                        count=tr.count,
                        rule="hand-written transition: exposed",
                    ),
                )
            instants = tuple(Instant(i.label, i.live + tuple(extra)) for i in phase.instants)
            phases[target] = replace(phase, moves=moves, instants=instants)
        stages.append(replace(st, phases=tuple(phases)))
    if problems:
        raise BudgetError(problems)
    return replace(step, stages=tuple(stages))
