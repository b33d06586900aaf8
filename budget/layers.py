"""The blocks of a transformer layer: what they hold as parameters and saved activations.

Parameters follow Megatron-LM's tensor parallelism (Shoeybi et al., arXiv 1909.08053) and
expert parallelism (Megatron-Core MoE); saved activations follow Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198), section 4
and Table 2, generalised to GQA, SwiGLU, FlashAttention, context parallelism and experts.
All sizes are for one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from budget.phases import Alloc
from budget.plan.model import DTYPE_BYTES, Plan


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one transformer layer: the full count and what one tp rank holds."""

    total: int
    per_rank: int


def layer_params(plan: Plan) -> LayerParams:
    """Parameters of one dense transformer layer, and the share of one tensor-parallel rank.

    Megatron-LM's tensor parallelism (Shoeybi et al., arXiv 1909.08053, section 3): QKV and
    the first MLP projection are column-parallel (weights and biases split over tp), the
    attention output and second MLP projection are row-parallel (weights split, biases
    replicated), norms are replicated. GQA: K and V have kv_heads x head_dim columns each.
    SwiGLU has three projections of width ffn (Shazeer, arXiv 2002.05202).
    """
    m, t = plan.model, plan.parallel.tp
    h, q_width, kv_width = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim
    qkv = h * (q_width + 2 * kv_width)
    proj = q_width * h
    up = (2 if m.mlp == "swiglu" else 1) * h * m.ffn
    down = m.ffn * h
    norm = (2 if m.norm == "layernorm" else 1) * h
    column_bias = (q_width + 2 * kv_width + (2 if m.mlp == "swiglu" else 1) * m.ffn) * m.bias
    row_bias = 2 * h * m.bias
    sharded = qkv + proj + up + down + column_bias
    replicated = 2 * norm + row_bias
    return LayerParams(total=sharded + replicated, per_rank=-(-sharded // t) + replicated)


def stage_layers(plan: Plan) -> list[int]:
    """Transformer layers on each pipeline stage (virtual chunks of a stage added up)."""
    p = plan.parallel.pp
    explicit = plan.parallel.pipeline.layers_per_stage
    if explicit is not None:
        return [sum(explicit[i::p]) for i in range(p)]
    return [plan.model.layers // p] * p


def stage_params(plan: Plan, stage: int, layers: int) -> tuple[int, int, list[tuple[str, int]]]:
    """(total, per tp rank, itemised per-rank parts) of the parameters a stage holds.

    The embedding sits on the first stage and the output layer on the last; with tied
    embeddings and more than one stage the last stage keeps its own copy of the embedding
    for the output layer, synchronised by an all-reduce (Megatron-LM's embedding group).
    The word embedding and output layer are vocab-parallel over tp; learned position
    embeddings and the final norm are replicated.
    """
    m, t, p = plan.model, plan.parallel.tp, plan.parallel.pp
    layer = layer_params(plan)
    parts = [("transformer layers", layers * layer.per_rank)]
    total = layers * layer.total
    word = m.vocab * m.hidden
    if stage == 0:
        parts.append(("word embedding", -(-word // t)))
        total += word
        if m.position == "learned":
            positions = (m.max_positions or plan.batch.seq) * m.hidden
            parts.append(("position embedding", positions))
            total += positions
    if stage == p - 1:
        norm = (2 if m.norm == "layernorm" else 1) * m.hidden
        parts.append(("final norm", norm))
        total += norm
        if not m.tied_embeddings or p > 1:
            name = "output layer" if not m.tied_embeddings else "output layer (tied copy)"
            parts.append((name, -(-word // t)))
            total += word
    return total, sum(b for _, b in parts), parts


def params_total(plan: Plan) -> int:
    """All distinct parameters of the model (a tied embedding counted once)."""
    m = plan.model
    total = m.layers * layer_params(plan).total + m.vocab * m.hidden
    total += (2 if m.norm == "layernorm" else 1) * m.hidden
    if not m.tied_embeddings:
        total += m.vocab * m.hidden
    if m.position == "learned":
        total += (m.max_positions or plan.batch.seq) * m.hidden
    return total


def resident_states(plan: Plan, params_rank: int) -> tuple[Alloc, ...]:
    """Model states one rank keeps for the whole step, by precision and ZeRO stage.

    ZeRO (Rajbhandari et al., arXiv 1910.02054, section 5 and Table 1): with Ψ parameters,
    16-bit parameters and gradients (2Ψ + 2Ψ) and K·Ψ bytes of optimizer state (K = 12 for
    mixed-precision Adam: fp32 master copy, momentum and variance), stage 1 shards the K·Ψ
    over Nd data-parallel ranks, stage 2 also the gradients, stage 3 also the parameters.
    Shards are rounded up to whole elements on the most loaded rank.
    """
    prec, z, dp = plan.precision, plan.parallel.zero, plan.parallel.dp

    def sharded(n: int, on: bool) -> int:
        return -(-n // dp) if on else n

    where = f"shard over dp={dp}"
    allocs = [
        Alloc(
            f"parameters ({prec.params})",
            "params",
            sharded(params_rank, z >= 3) * DTYPE_BYTES[prec.params],
            placement=where if z >= 3 else "replicate over dp",
        )
    ]
    if plan.mode == "train":
        allocs.append(
            Alloc(
                f"gradients ({prec.grads})",
                "grads",
                sharded(params_rank, z >= 2) * DTYPE_BYTES[prec.grads],
                placement=where if z >= 2 else "replicate over dp",
            )
        )
        opt_place = where if z >= 1 else "replicate over dp"
        if prec.master is not None:
            allocs.append(
                Alloc(
                    f"master weights ({prec.master})",
                    "optimizer",
                    sharded(params_rank, z >= 1) * DTYPE_BYTES[prec.master],
                    placement=opt_place,
                )
            )
        moments = {"adam": 2, "sgd": 1, "none": 0}[prec.optimizer]
        if moments:
            label = "Adam moments" if prec.optimizer == "adam" else "SGD momentum"
            allocs.append(
                Alloc(
                    f"{label} ({prec.optimizer_state})",
                    "optimizer",
                    sharded(params_rank, z >= 1) * DTYPE_BYTES[prec.optimizer_state] * moments,
                    placement=opt_place,
                )
            )
    if plan.device.reserved:
        allocs.append(
            Alloc("reserved (runtime, NCCL, allocator)", "reserved", plan.device.reserved)
        )
    return tuple(allocs)


# --------------------------------------------------------------------------------------------
# Activations


@dataclass(frozen=True, slots=True)
class Shapes:
    """Sizes of one micro-batch on one rank, in elements and bytes per element."""

    tokens: int  # b x s / cp: tokens of one micro-batch on one context-parallel rank
    tokens_sp: int  # tokens in sequence-parallel regions (tokens / tp with SP)
    act: int  # bytes per activation element
    hidden: int
    q_cols: int  # query heads x head_dim on one tp rank
    kv_cols: int  # kv heads x head_dim on one tp rank
    ffn_cols: int  # ffn width on one tp rank
    heads: int  # query heads on one tp rank
    seq_kv: int  # keys each local query attends to (the full sequence)
    micro: int


def shapes(plan: Plan) -> Shapes:
    m, par, b = plan.model, plan.parallel, plan.batch
    t = par.tp
    tokens = b.micro * b.seq // par.cp
    return Shapes(
        tokens=tokens,
        tokens_sp=-(-tokens // t) if par.sequence_parallel else tokens,
        act=DTYPE_BYTES[plan.precision.activations],
        hidden=m.hidden,
        q_cols=m.heads * m.head_dim // t,
        kv_cols=m.kv_heads * m.head_dim // t,
        ffn_cols=-(-m.ffn // t),
        heads=m.heads // t,
        seq_kv=b.seq,
        micro=b.micro,
    )


def residual_placement(plan: Plan) -> str:
    return (
        "shard(0) on tp"
        if plan.parallel.sequence_parallel and plan.parallel.tp > 1
        else ("replicate on tp")
    )


def attention_saved(plan: Plan, s: Shapes) -> list[Alloc]:
    """Tensors the attention block saves for backward, per layer and micro-batch.

    Korthikanti et al. section 4.1: norm input 2sbh, QKV input 2sbh, Q and K 4sbh, V 2sbh,
    softmax output 2as²b, its dropout mask as²b and output 2as²b, projection input 2sbh,
    output dropout mask sbh. Generalised: Q/K/V widths follow GQA; flash attention stores no
    s² scores but fp32 softmax statistics (Dao et al., arXiv 2205.14135, section 3.1);
    selective recompute drops the s² tensors (Korthikanti section 5). With sequence
    parallelism the tensors outside the tp region are sharded over tp (section 4.2.2).
    """
    a, res = s.act, residual_placement(plan)
    head = "shard(heads) on tp"
    out = [
        Alloc("attention norm input", "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc("attention QKV input", "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc("attention Q", "activations", a * s.tokens * s.q_cols, placement=head),
        Alloc("attention K", "activations", a * s.tokens * s.kv_cols, placement=head),
        Alloc("attention V", "activations", a * s.tokens * s.kv_cols, placement=head),
    ]
    out.extend(core_attention(plan, s))
    out.append(
        Alloc("attention projection input", "activations", a * s.tokens * s.q_cols, placement=head)
    )
    if plan.model.dropout:
        out.append(
            Alloc("attention dropout mask", "activations", s.tokens_sp * s.hidden, placement=res)
        )
    if plan.recompute == "selective":
        scores = {
            a.name for a in core_attention(plan, s) if "score" in a.name or "softmax" in a.name
        }
        out = [x for x in out if x.name not in scores or x.name.endswith("statistics")]
    return out


def core_attention(plan: Plan, s: Shapes) -> list[Alloc]:
    """The s x s part of attention: eager stores scores, flash only row statistics."""
    score = s.micro * s.heads * (s.tokens // s.micro) * s.seq_kv
    if plan.model.attention == "flash":
        rows = s.heads * s.tokens
        return [Alloc("attention softmax statistics (fp32)", "activations", 4 * rows)]
    out = [Alloc("attention softmax output", "activations", s.act * score)]
    if plan.model.dropout:
        out.append(Alloc("attention softmax dropout mask", "activations", score))
        out.append(Alloc("attention softmax dropout output", "activations", s.act * score))
    return out


def mlp_saved(plan: Plan, s: Shapes) -> list[Alloc]:
    """Tensors the MLP block saves: Korthikanti section 4.1 (norm input 2sbh, first linear
    input 2sbh, GeLU input 8sbh, GeLU output 8sbh, dropout mask sbh) with ffn = 4h; SwiGLU
    saves the gate and up projections (2 x ffn) and their product (ffn)."""
    a, res = s.act, residual_placement(plan)
    col = "shard(ffn) on tp"
    out = [
        Alloc("MLP norm input", "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc("MLP fc1 input", "activations", a * s.tokens_sp * s.hidden, placement=res),
    ]
    if plan.model.mlp == "swiglu":
        out.append(
            Alloc(
                "MLP SwiGLU input (gate, up)",
                "activations",
                2 * a * s.tokens * s.ffn_cols,
                placement=col,
            )
        )
    else:
        out.append(Alloc("MLP GeLU input", "activations", a * s.tokens * s.ffn_cols, placement=col))
    out.append(Alloc("MLP fc2 input", "activations", a * s.tokens * s.ffn_cols, placement=col))
    if plan.model.dropout:
        out.append(Alloc("MLP dropout mask", "activations", s.tokens_sp * s.hidden, placement=res))
    return out


def layer_saved(plan: Plan, s: Shapes) -> tuple[list[Alloc], list[Alloc]]:
    """(attention, MLP) tensors saved per layer and micro-batch under the recompute mode.

    Full recompute keeps only each layer's input (Korthikanti Table 2: 2sbh; sharded over tp
    with sequence parallelism) and rebuilds the rest in backward.
    """
    if plan.recompute == "full":
        return [
            Alloc(
                "layer input (checkpoint)",
                "activations",
                s.act * s.tokens_sp * s.hidden,
                placement=residual_placement(plan),
            )
        ], []
    return attention_saved(plan, s), mlp_saved(plan, s)
