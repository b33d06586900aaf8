"""The blocks of a transformer layer: what they hold as parameters and saved activations.

Parameters follow Megatron-LM's tensor parallelism (Shoeybi et al., arXiv 1909.08053) and
expert parallelism (Megatron-Core MoE); saved activations follow Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198), section 4
and Table 2, generalised to GQA, SwiGLU, FlashAttention, context parallelism and experts.
All sizes are for one rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from budget.flops import VOCAB_WEIGHT_BYTES, routing_skew, te_fp8, uncapped_skew
from budget.phases import HELD_THROUGH, Alloc, Category, when
from budget.plan.model import DTYPE_BYTES, MLP_NAMES, Plan
from budget.topology import send_levels
from budget.vector import (
    count_label,
    every,
    holds,
    lacks,
    uniform,
    vceil,
    vmax,
    vmin,
    vwhere,
)

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one transformer layer: the full count and one rank's share, with the
    expert weights (sharded over ep x etp, reduced over the expert data-parallel group)
    kept apart from the rest (sharded over tp, reduced over dp x cp)."""

    total: int
    per_rank: int  # non-expert parameters on one rank
    expert_total: int = 0
    expert_per_rank: int = 0


def _norm_weights(plan: Plan) -> int:
    """Weights per normed element: LayerNorm's scale and bias, RMSNorm's scale."""
    return 2 if plan.model.norm == "layernorm" else 1


def _norms(plan: Plan) -> int:
    return _norm_weights(plan) * plan.model.hidden


def _block_norms(plan: Plan) -> int:
    """The norms of one attention or MLP block: the one before it, and with
    ``model.sandwich_norm`` one after it too (Gemma 2 and 3: ``post_attention_layernorm``
    and ``post_feedforward_layernorm`` beside the pre-norms; Gemma Team, arXiv 2408.00118,
    section 2)."""
    return _norms(plan) * (2 if plan.model.sandwich_norm else 1)


def _mlp(plan: Plan, width: int, shards: int) -> tuple[int, int, int]:
    """(total, per rank, replicated per rank) of a dense MLP of `width` split over `shards`:
    fc1 column-parallel (x2 for a gated MLP's gate, SwiGLU or GeGLU: Shazeer arXiv
    2002.05202), fc2 row-parallel with its bias replicated (Shoeybi et al. section 3)."""
    m = plan.model
    gate = m.gate
    sharded = (gate + 1) * m.hidden * width + gate * width * m.mlp_biased
    replicated = m.hidden * m.mlp_biased
    return sharded + replicated, -(-sharded // shards) + replicated, replicated


def layer_params(plan: Plan, moe: bool = False) -> LayerParams:
    """Parameters of one transformer layer, and the share of one rank.

    Megatron-LM's tensor parallelism (Shoeybi et al., arXiv 1909.08053, section 3): QKV and
    the first MLP projection are column-parallel (weights and biases split over tp), the
    attention output and second MLP projection are row-parallel (weights split, biases
    replicated), norms are replicated. GQA: K and V have kv_heads x head_dim columns each.
    An MoE layer (Fedus et al., arXiv 2101.03961; Megatron-Core MoE) replaces the MLP by a
    replicated router (hidden x experts), `count` experts of width `experts.ffn` of which a
    rank holds count/ep, each split over etp as a dense MLP over tp (fc2's bias whole on
    every etp rank: Megatron-Core's ``TERowParallelGroupedLinear`` shards its weights
    along axis 1 and not its bias), and optional shared experts split over tp with a
    replicated gate (DeepSeekMoE, arXiv 2401.06066; Qwen-MoE).
    """
    m, t = plan.model, plan.parallel.tp
    h = m.hidden
    total, per_rank = attention_params(plan)
    total += _block_norms(plan)
    per_rank += _block_norms(plan)
    if not moe or m.experts is None:
        mlp_total, mlp_rank, _ = _mlp(plan, m.ffn, t)
        return LayerParams(total + mlp_total, per_rank + mlp_rank)
    e, par = m.experts, plan.parallel
    router = (h + m.mlp_biased) * e.count  # with MLP biases, the router's too (gpt-oss)
    total += router
    per_rank += router
    if e.shared_ffn:
        shared_total, shared_rank, _ = _mlp(plan, e.shared_ffn, t)
        total += shared_total + h * e.shared_gate
        per_rank += shared_rank + h * e.shared_gate
    expert, _, _ = _mlp(plan, e.ffn, 1)
    # one expert's share of an etp rank: fc1 and fc2's weights and fc1's bias split, fc2's
    # bias whole (Megatron-Core's TERowParallelGroupedLinear, megatron/core/extensions/
    # transformer_engine.py: "sharding along axis 1, bias not sharded")
    _, expert_rank, _ = _mlp(plan, e.ffn, par.expert_tp)
    return LayerParams(
        total=total,
        per_rank=per_rank,
        expert_total=e.count * expert,
        expert_per_rank=(e.count // par.ep) * expert_rank,
    )


def attention_params(plan: Plan) -> tuple[int, int]:
    """(total, per rank) of the attention block with its norm: QKV and output projections
    split over tp, the output bias and the norm replicated.

    ``model.qkv_bias`` gives the Q, K and V projections biases (split with their columns)
    without ``model.bias``'s on the output projection and the MLP (Qwen2's ``Qwen2Attention``:
    q_proj, k_proj and v_proj with bias=True, o_proj without).

    Attention sinks (``model.attention_sinks``, gpt-oss's ``GptOssAttention.sinks``): one
    learned logit per head that joins the softmax's denominator, held with its head.

    Q/K norms (``model.qk_norm``): per head, one head_dim-wide norm for the queries and one
    for the keys, shared by every head and so held whole by every tp rank (Qwen3's
    ``Qwen3Attention``: ``q_norm = Qwen3RMSNorm(head_dim)``; Megatron-Core's
    ``qk_layernorm`` builds them at the head size); full width, one norm over the whole query
    projection and one over the keys, heads·head_dim and kv_heads·head_dim wide (OLMo 2's
    ``Olmo2Attention``), which needs every head on the rank (`resolve` refuses it at tp > 1).

    Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, eqs. 9-19) replaces QKV by
    down-projections to the query latent (hidden x q_rank) and to the key/value latent plus
    the shared rotary key (hidden x (kv_rank + rope_dim)), each with an RMSNorm, and
    up-projections to every head's query (q_rank x heads·(nope + rope)) and key and value
    (kv_rank x heads·(nope + head_dim)). The down-projections and their norms are
    replicated over tp, the up-projections split by heads (Megatron-Core's
    ``MLASelfAttention``)."""
    m, t = plan.model, plan.parallel.tp
    h = m.hidden
    out_width = m.heads * m.head_dim
    if m.mla is not None:
        mla = m.mla
        q_width = m.heads * m.qk_head_dim
        q_in = mla.q_rank or h
        down = _latent_down(plan)
        sharded = q_in * q_width + mla.kv_rank * m.heads * (mla.nope_dim + m.head_dim)
        sharded += out_width * h
        replicated = down + h * m.bias + _block_norms(plan)
        return sharded + replicated, -(-sharded // t) + replicated
    q_width, kv_width = out_width, m.kv_heads * m.head_dim
    qkv_bias = m.bias or m.qkv_bias
    sharded = h * q_width + q_width * h + q_width * qkv_bias
    sharded += m.heads * m.attention_sinks  # one logit per head, with its head on the tp rank
    kv = 2 * (h + qkv_bias) * kv_width  # the K and V projections
    kv_rank = 2 * (h + qkv_bias) * kv_heads_per_rank(plan) * m.head_dim
    replicated = h * m.bias + _block_norms(plan)
    replicated += qk_norm_params(plan)  # per head: held whole by every tp rank
    if m.qk_norm == "full_width":  # at tp 1 (`resolve`): every head's on the rank
        sharded += _norm_weights(plan) * (q_width + kv_width)
    return sharded + kv + replicated, -(-sharded // t) + kv_rank + replicated


def kv_heads_per_rank(plan: Plan) -> Any:
    """Key/value heads one tensor-parallel rank holds: kv_heads / tp, or one when tp is a
    multiple of kv_heads larger than it. A serving engine then holds each key/value head on
    tp / kv_heads ranks, with its projection weights and its KV cache (vLLM's
    ``QKVParallelLinear``: ``num_kv_heads = 1``, ``num_kv_head_replicas = tp_size /
    total_num_kv_heads``; ``ModelConfig.get_num_kv_heads``: ``max(1, total // tp)``).
    Megatron-LM trains only with whole groups per rank (``num_query_groups % tp == 0``), so a
    train plan never reaches the second case (`resolve`)."""
    return vmax(plan.model.kv_heads // plan.parallel.tp, 1)


def _latent_down(plan: Plan) -> int:
    """Latent attention's replicated down-projections (with biases when the model has them,
    as DeepSeek's ``attention_bias`` gives the down- and output projections, not the
    up-projections) and their RMSNorms."""
    m = plan.model
    if m.mla is None:
        return 0
    mla = m.mla
    down = mla.q_rank + mla.kv_rank + mla.rope_dim
    return (m.hidden + m.bias) * down + mla.q_rank + mla.kv_rank


def sequence_parallel_params(plan: Plan, moe: bool = False) -> int:
    """Parameters of one layer that every tp rank holds whole but, under sequence
    parallelism, applies to its own shard of the tokens, so their gradients are partial
    over tp and all-reduced there after the backward (Megatron-LM's
    ``finalize_model_grads``, which all-reduces the parameters marked
    ``sequence_parallel``): the norms, the row-parallel biases, latent attention's
    down-projections, and an MoE layer's router and shared-expert gate."""
    m = plan.model
    h = m.hidden
    n = 2 * _block_norms(plan) + h * m.bias + _latent_down(plan)
    mlp_bias = m.mlp_biased
    if not moe or m.experts is None:
        return n + h * mlp_bias
    e = m.experts
    return n + (h + mlp_bias) * e.count + h * e.shared_gate + h * mlp_bias * (e.shared_ffn > 0)


def qk_norm_params(plan: Plan) -> int:
    """Per-head Q/K norm weights of one layer: every tp rank holds them whole but applies
    them to its own heads only, so their gradients are partial over tp whether or not
    sequence parallelism is on (Megatron-LM's ``_allreduce_layernorm_grads`` all-reduces
    ``q_layernorm`` and ``k_layernorm`` when tp > 1 and either ``sequence_parallel`` or
    ``qk_layernorm`` is set)."""
    m = plan.model
    if m.qk_norm != "per_head":
        return 0
    return _norm_weights(plan) * 2 * m.head_dim


def final_norm_params(plan: Plan) -> int:
    """The norm after the last layer, replicated over tp like the layers' norms."""
    return _norms(plan)


def moe_layers(plan: Plan) -> list[bool]:
    """Which layers are MoE (`Model.moe_flags`)."""
    return list(plan.model.moe_flags)


def mtp_layers(plan: Plan) -> int:
    """Multi-token prediction modules a step runs (DeepSeek-V3, arXiv 2412.19437, section
    2.2): in training, on the last pipeline stage after the main model, as Megatron-Core
    places them without a custom layout (``mtp_on_this_rank``); each holds one transformer
    layer of the kind of the model's last layer (``get_gpt_mtp_block_spec`` takes the
    decoder's last layer spec). Serving runs none: they are draft heads for speculative
    decoding, which is not priced."""
    return plan.model.mtp_layers if plan.mode == "train" else 0


def mtp_params(plan: Plan) -> tuple[int, int]:
    """(total, per rank) parameters of one multi-token prediction module besides its
    transformer layer (Megatron-Core ``MultiTokenPredictionLayer``): the column-parallel
    projection ``eh_proj`` from 2·hidden to hidden without bias, split over tp, and three
    replicated norms (``enorm``, ``hnorm``, ``final_layernorm``). The embedding and the
    output layer are shared with the main model."""
    m = plan.model
    proj = 2 * m.hidden * m.hidden
    return proj + 3 * _norms(plan), -(-proj // plan.parallel.tp) + 3 * _norms(plan)


def mtp_layer_params(plan: Plan) -> LayerParams:
    """The transformer layer of one multi-token prediction module: the kind of the model's
    last layer (`mtp_layers`)."""
    return layer_params(plan, moe=moe_layers(plan)[-1])


def mtp_total(plan: Plan) -> int:
    """All parameters of the model's multi-token prediction modules (the main model's
    `params_total` leaves them out, as DeepSeek-V3's 671B does)."""
    d = plan.model.mtp_layers
    if not d:
        return 0
    x = mtp_layer_params(plan)
    return d * (x.total + x.expert_total + mtp_params(plan)[0])


def stage_layer_ids(plan: Plan) -> list[list[int]]:
    """Global indices of the layers each pipeline stage holds. With v virtual stages the
    model is cut into p·v chunks and stage i holds chunks i, i + p, ... (Narayanan et al.,
    arXiv 2104.04473, section 2.2.2)."""
    return [[i for chunk in chunks for i in chunk] for chunks in stage_chunk_ids(plan)]


def stage_chunk_ids(plan: Plan) -> list[list[list[int]]]:
    """`stage_layer_ids` by model chunk: stage i's chunks i, i + p, ... in order."""
    p, v = plan.parallel.pp, plan.parallel.pipeline.virtual_stages
    sizes = plan.parallel.pipeline.layers_per_stage
    if not isinstance(v, int):
        # A sweep over virtual stages with an even split and no experts: every stage holds
        # L/p layers of one kind whatever v is, which is all the step needs to know.
        if sizes is not None or plan.model.experts is not None:
            raise ValueError("a sweep over virtual stages needs an even split of dense layers")
        v = 1
    if sizes is not None and len(sizes) != p * v:
        # `resolve` refuses such a split; a plan built in code that reaches here would lose
        # layers if its per-stage counts were cut into v chunks, so it is refused too
        raise ValueError(
            f"layers_per_stage has {len(sizes)} entries but pp × virtual_stages = {p} × {v} "
            f"= {p * v} model chunks need one each"
        )
    chunks = list(sizes) if sizes is not None else [plan.model.layers // (p * v)] * (p * v)
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    out: list[list[list[int]]] = [[] for _ in range(p)]
    for index, (start, size) in enumerate(zip(starts, chunks, strict=True)):
        out[index % p].append(list(range(start, start + size)))
    return out


def stage_layers(plan: Plan) -> list[int]:
    """Transformer layers on each pipeline stage (virtual chunks of a stage added up)."""
    return [len(ids) for ids in stage_layer_ids(plan)]


@dataclass(frozen=True, slots=True)
class StageClass:
    """Pipeline stages that run the same kernels and moves: the same place in the pipeline
    (first, last), the same dense and MoE layer counts and, where an interleaved stage's dp
    reduction overlaps, the same counts in its first model chunk. `stage` is the first of them,
    which holds the most micro-batches in flight (`step.inflight`) and so peaks highest
    (where chunks differ, the class holds the most layer passes of any of its stages,
    `flight_layers`); `copies` counts them. A sweep carries the counts and indices as arrays over
    configurations whose stages fall into the same classes (`budget.search`)."""

    stage: int
    first: bool
    last: bool
    dense: int
    moe: int
    last_is_moe: bool
    copies: int = 1
    sliding: int = 0  # layers whose attention slides (`Model.sliding`)
    # model chunk 0's dense and MoE layers, the chunk an interleaved stage reduces last
    # (`step._reduce`); 0 where no overlap of the dp reduction or gather reads them, so that
    # stages that differ only in them still share one class
    head_dense: int = 0
    head_moe: int = 0
    # the dense and MoE layer passes an interleaved stage can hold saved at its peak
    # (`flight_layers`) where its model chunks differ, at m ≥ 2p micro-batches and at m = p
    # (``_short``); () where they are alike and the micro-batches in flight times its layers
    # say the same (`step.inflight`). Not in the key: merged stages take every state of
    # theirs (`merge_classes`)
    flight: Passes = ()
    flight_short: Passes = ()
    # the levels its forward and backward stage sends run on (`topology.send_levels`):
    # stages of one pipeline whose sends cross nodes and stages whose sends do not are
    # priced apart (an audit, m446)
    links: tuple[int, int] = (0, 0)
    # under overlap.ep, its chunk passes that run alone, warm-up and cool-down (`step.
    # _ep_moves`, which works them out from the stage index): stages that pair a different
    # share of their expert all-to-alls are timed apart (an audit, m457); 0 without it
    alone: int = 0

    @property
    def key(self) -> tuple[Any, ...]:
        """What the kernels and moves of a stage depend on (equal keys, equal times)."""
        return (
            self.first,
            self.last,
            self.dense,
            self.moe,
            self.last_is_moe,
            self.sliding,
            self.head_dense,
            self.head_moe,
            self.links,
            self.alone,
        )


def interleaved_warmup(p: int, v: int, stage: int) -> int:
    """Model-chunk forwards stage `stage` of an interleaved pipeline runs before its first
    backward, counting the one it runs then: Megatron-LM's ``(p - stage - 1)·2 + (v - 1)·p``
    warm-up forwards and one more (``forward_backward_pipelining_with_interleaving``;
    Narayanan et al., arXiv 2104.04473, section 2.2.2). The k-th runs model chunk
    ``(k // p) % v``: p micro-batches through one chunk, then the next."""
    return (p - stage - 1) * 2 + (v - 1) * p + 1


Passes = tuple[tuple[Any, Any], ...]  # (dense, MoE) layer passes held, state by state


def flight_layers(chunks: list[tuple[int, int]], p: int, stage: int, microbatches: int) -> Passes:
    """The dense and MoE layer passes whose activations stage `stage` of an interleaved
    pipeline holds at once, its model chunks holding `chunks` (dense, MoE) layers, at each
    state of Megatron-LM's order that no other state holds as many of both (`frontier`):
    the states where its saved bytes can peak, whichever a dense and an MoE pass keep,
    most dense first. Megatron-LM's order: `interleaved_warmup` forwards, then one forward
    and one backward in turn, forwards running chunk ``(k // p) % v`` and backwards chunk
    ``v - 1 - (k // p) % v``. With chunks alike the most is the warm-up's forwards over v
    times the stage's layers (`step.inflight`). Where they differ (a split of p·v chunks, or
    MoE layers from some layer on) it is not: a forward of a large chunk can follow a backward
    of a small one after the warm-up (GPT-3, p 8, v 2, stage 0 in chunks of 10 and 2 layers:
    166 passes when the first backward starts, 174 a period later). The order repeats every
    p·v steps once it is steady, so m = 2p micro-batches give the most of any m ≥ 2p;
    interleaving needs m a multiple of p, which leaves m = p to replay apart. Where a
    stage's chunks mix dense and MoE layers in different proportions the two counts peak at
    different states: an audit, m484, found their maxima added, (4, 15) on a stage of chunks
    (1, 1), (0, 2), (0, 2), (0, 2) at p 2 that holds (3, 15) or (4, 14) at most, 2.6 GiB
    over its peak."""
    v = len(chunks)
    total = microbatches * v
    warmup = min(interleaved_warmup(p, v, stage) - 1, total)
    if len(set(chunks)) == 1:
        # chunks alike: the most is at the first backward, the warm-up's forwards and the
        # one after them in flight (the replay below, in closed form: a sweep's stage
        # classes replay each stage of every depth it meets)
        d, e = chunks[0]
        most = min(warmup + 1, total)
        return ((most * d, most * e),)
    dense = moe = forward = backward = 0
    states = set()
    while backward < total:
        if forward < total and (forward < warmup or forward - warmup <= backward):
            d, e = chunks[(forward // p) % v]
            dense, moe = dense + d, moe + e
            states.add((dense, moe))
            forward += 1
        else:
            d, e = chunks[v - 1 - (backward // p) % v]
            dense, moe = dense - d, moe - e
            backward += 1
    return frontier(states)


def frontier(states: Iterable[tuple[int, int]]) -> Passes:
    """The (dense, MoE) pairs of `states` that no other holds as many of both, most dense
    first: a positive weighting of the two (the bytes a dense and an MoE pass keep) peaks
    at one of them."""
    kept: list[tuple[int, int]] = []
    for d, e in sorted(set(states), reverse=True):
        if not kept or e > kept[-1][1]:
            kept.append((d, e))
    return tuple(kept)


def chunks_differ(plan: Plan) -> bool:
    """Whether the plan's model chunks differ in size (multi-token prediction layers counted
    with the last chunk, as `search.split` counts them): a split by hand, or the search's of
    layers the chunks do not divide (`search.split`, one layer apart at most)."""
    if plan.parallel.pp == 1:
        return False
    kinds = _chunk_kinds(stage_chunk_ids(plan), moe_layers(plan), mtp_layers(plan))
    sizes = [d + e for chunks in kinds for d, e in chunks]
    return max(sizes) != min(sizes)


def chunk_times_differ(plan: Plan) -> bool:
    """Whether a stage's model chunks can take different times, so that its step is replayed
    in Megatron-LM's order (`schedule.replay_of`) rather than timed by the closed form over
    stage totals, which is exact only where every chunk takes the same time (Narayanan et
    al., arXiv 2104.04473, section 2.2): their layers differ (`chunks_differ`), or the
    pipeline is interleaved, where stage 0's first chunk also runs the embedding and the last
    stage's last chunk the output layer and the loss (`schedule._chunk_times`), and such a
    chunk paces the stages that wait on it. Nemotron-4 340B over 8 stages of 12 one-layer
    chunks, its 256,000-row output layer in the last, replays 17.7 ms (0.42 %) over the
    closed form (an audit, against a simulation of Megatron-LM's ``schedules.py``). Without
    interleaving the closed form m·max(t) + Σ others is exact where the last stage is the
    slowest (its output layer and loss make it so but for a small vocabulary); where an
    earlier one is, the stages after it fill and drain partly inside its own time, and the
    closed form overstates by at most that: 0.66 ms (0.07 %) of 8 stages of 4 layers at
    m 64 and a 128-token vocabulary, whose first stage is the slowest (an audit; kept, so
    that a sweep prices such layouts as their reports do without replaying them)."""
    if plan.parallel.pp == 1:
        return False
    return plan.parallel.pipeline.virtual_stages > 1 or chunks_differ(plan)


def _chunk_kinds(
    chunks_per_stage: list[list[list[int]]], flags: list[bool], mtp: int
) -> list[list[tuple[int, int]]]:
    """Each stage's model chunks as (dense, MoE) layer counts, the multi-token prediction
    layers counted in the last stage's last chunk, after which they run."""
    kinds = []
    for chunks in chunks_per_stage:
        kinds.append(
            [(len(c) - sum(flags[i] for i in c), sum(flags[i] for i in c)) for c in chunks]
        )
    if kinds and kinds[-1]:
        d, e = kinds[-1][-1]
        kinds[-1][-1] = (d, e + mtp) if flags[-1] else (d + mtp, e)
    return kinds


def ep_alone(stage: Any, pp: Any, v: Any) -> Any:
    """Chunk passes of `stage` that run alone under Megatron-Core's combined schedules
    (``overlap_moe_expert_parallel_comm``): the interleaved schedule's warm-up, 2(p − r − 1)
    + (v − 1)·p forwards (``get_pp_rank_microbatches``, its micro-batch group of p), and one
    more under the overlap; as many backwards in the cool-down. Without a pipeline, 1 (the
    combined 1F1B's first forward). Arrays where a sweep's are."""
    return 2 * (pp - stage - 1) + (v - 1) * pp + 1


def stage_classes(
    plan: Plan, merge: bool = True, levels: tuple[int, ...] | None = None
) -> list[StageClass]:
    """One class per distinct stage key in pipeline order (`merge`), or one per stage;
    `levels`: the level each stage boundary's sends run on (`topology.send_levels`, the
    plan's own where None)."""
    if levels is None:
        levels = send_levels(plan.parallel, plan.topology)
    flags = moe_layers(plan)
    chunks_per_stage = stage_chunk_ids(plan)
    v = plan.parallel.pipeline.virtual_stages
    overlap = plan.overlap.dp_grads or plan.overlap.param_gather
    chunked = isinstance(v, int) and v > 1 and overlap  # `step._reduce` reads chunk 0
    ids_per_stage = [[i for chunk in chunks for i in chunk] for chunks in chunks_per_stage]
    p = len(ids_per_stage)
    mtp = mtp_layers(plan)
    slides = plan.model.sliding
    kinds = _chunk_kinds(chunks_per_stage, flags, mtp)
    paired = bool(plan.overlap.ep) and plan.model.experts is not None
    # every stage replayed once any stage's chunks differ: a merged class takes the most of
    # its stages, and a stage of alike chunks beside one of unlike ones must count in it
    replay = any(len(set(chunks)) > 1 for chunks in kinds)
    stages = []
    for stage, ids in enumerate(ids_per_stage):
        # its chunks' layers, the multi-token prediction layers with the last (`_chunk_kinds`)
        dense, moe = (sum(counts) for counts in zip(*kinds[stage], strict=True))
        sliding = sum(slides[i] for i in ids)  # a multi-token prediction layer attends fully
        last_is_moe = bool(ids) and flags[ids[-1]]
        first, last = stage == 0, stage == p - 1
        head_dense, head_moe = kinds[stage][0] if chunked else (0, 0)
        flight = flight_layers(kinds[stage], p, stage, 2 * p) if replay else ()
        short = flight_layers(kinds[stage], p, stage, p) if replay else ()
        stages.append(
            StageClass(
                stage,
                first,
                last,
                dense,
                moe,
                last_is_moe,
                sliding=sliding,
                head_dense=head_dense,
                head_moe=head_moe,
                flight=flight,
                flight_short=short,
                links=(levels[stage], levels[(stage - 1) % p]),
                alone=ep_alone(stage, p, v) if paired else 0,
            )
        )
    return merge_classes(stages) if merge else stages


def merge_classes(stages: list[StageClass]) -> list[StageClass]:
    """One class per distinct stage key of `stages` (`stage_classes` unmerged), in pipeline
    order: how many stages each stands for, and the layer passes any of them can hold at
    its peak (`flight_layers`)."""
    members: dict[tuple[Any, ...], list[StageClass]] = {}
    for c in stages:
        members.setdefault(c.key, []).append(c)

    def held(c: StageClass, name: str) -> Passes:
        return frontier(state for other in members[c.key] for state in getattr(other, name))

    return [
        replace(
            c,
            copies=len(members[c.key]),
            flight=held(c, "flight"),
            flight_short=held(c, "flight_short"),
        )
        for c in stages
        if members[c.key][0] is c
    ]


@dataclass(frozen=True, slots=True)
class StageParams:
    total: int  # all parameters of the stage
    per_rank: int  # non-expert parameters on one rank
    expert_per_rank: int  # expert parameters on one rank
    parts: tuple[tuple[str, int], ...]  # itemised per-rank counts
    gemm_per_rank: Any = 0  # of per_rank, the layers' GEMM weights (`fp8_gemm_weights`)
    expert_gemm_per_rank: Any = 0  # of expert_per_rank, the experts' GEMM weights
    beside_label: str = "norm"  # what `beside_gemms_per_rank` holds (`_beside_label`)

    @property
    def lookup_per_rank(self) -> Any:
        """Of `per_rank`, the first stage's input embeddings (word and learned position
        tables, `EMBEDDING_PARTS`), whose gradients the backward produces last."""
        return sum(n for name, n in self.parts if name in EMBEDDING_PARTS)

    @property
    def vocab_per_rank(self) -> Any:
        """Of `per_rank`, the embeddings' and output layer's: kept in a 16-bit format
        where the blocks' weights are fp8 (`flops.outside_operands`)."""
        return sum(n for name, n in self.parts if "embedding" in name or "output layer" in name)

    @property
    def beside_gemms_per_rank(self) -> Any:
        """Of `per_rank`, what is neither a layer's GEMM weight nor the vocabulary's: norms,
        biases, routers and gates, attention sinks, multi-token prediction's projection.
        Kept 16-bit where the GEMM weights are fp8, as the vocabulary is: Transformer
        Engine's ``fp8_model_init`` makes only its modules' GEMM weights fp8 (their
        LayerNorm weights and biases stay in ``params_dtype``), Megatron-Core's router is a
        plain parameter (`flops.outside_operands`), and fp8 checkpoints quantize only the
        blocks' linear weights (DeepSeek-V3's release: norms and the MoE gate in bf16)."""
        return self.per_rank - self.vocab_per_rank - self.gemm_per_rank

    @property
    def expert_beside_per_rank(self) -> Any:
        """Of `expert_per_rank`, the experts' biases: 16-bit under fp8 weights, as
        `beside_gemms_per_rank`."""
        return self.expert_per_rank - self.expert_gemm_per_rank


# the first stage's input tables, as `class_params` itemises them
WORD_EMBEDDING, POSITION_EMBEDDING = "word embedding", "position embedding"
EMBEDDING_PARTS = (WORD_EMBEDDING, POSITION_EMBEDDING)


def stage_params(plan: Plan, stage: int) -> StageParams:
    """The parameters one rank of pipeline stage `stage` holds (`class_params`); for every
    stage, call `class_params` on one `stage_classes` instead (each call builds them all)."""
    return class_params(plan, stage_classes(plan, merge=False)[stage])


def vocab_rows(plan: Plan) -> int:
    """The vocabulary rows one tp rank holds of the word embedding or output layer, split by
    whole rows (Megatron-LM's ``VocabParallelEmbedding``): ceil(vocab / tp) of the plan's
    vocab. Megatron-LM first pads the vocabulary to a multiple of 128 · tp
    (``--make-vocab-size-divisible-by``; 128,256 → 129,024 at tp 8) and vLLM to a multiple of
    64; which padding a run used is the stack's, so a plan writes the padded size where it
    matters (the validation plans do, `budget.accuracy`)."""
    return -(-plan.model.vocab // plan.parallel.tp)


def loss_rows(plan: Plan) -> Any:
    """The vocabulary rows the cross-entropy runs over on one tp rank: the rank's shard
    (`vocab_rows`), or with ``loss: pytorch-gathered`` the whole vocabulary, which the
    output layer's ``ColwiseParallel(output_layouts=Replicate())`` all-gathers to every tp
    rank first (torchtitan's ``disable_loss_parallel``, transformers' ``colwise_rep``
    lm_head). DTensor pads an uneven shard for the gather and drops the padding after it
    (``Shard._to_replicate_tensor``): the plan's vocab whole."""
    if plan.loss == "pytorch-gathered":
        return plan.model.vocab
    return vocab_rows(plan)


def vocab_params(plan: Plan) -> int:
    """The rank's share of the word embedding or output layer, ceil(vocab / tp) x hidden."""
    return vocab_rows(plan) * plan.model.hidden


def class_params(plan: Plan, c: StageClass) -> StageParams:
    """The parameters one rank of a stage holds, itemised.

    The embedding sits on the first stage and the output layer on the last; with tied
    embeddings and more than one stage the last stage keeps its own copy of the embedding
    for the output layer, synchronised by an all-reduce (Megatron-LM's embedding group).
    The word embedding and output layer are vocab-parallel over tp; learned position
    embeddings and the final norm are replicated.
    """
    m = plan.model
    dense, moe = c.dense, c.moe
    d, x = layer_params(plan), layer_params(plan, moe=True)
    parts = [("transformer layers", dense * d.per_rank + moe * x.per_rank)]
    total = dense * d.total + moe * (x.total + x.expert_total)
    if uniform(moe > 0, "MoE layers"):
        parts.append(("experts", moe * x.expert_per_rank))
    word, word_rank = m.vocab * m.hidden, vocab_params(plan)
    if c.first:
        parts.append((WORD_EMBEDDING, word_rank))
        total += word
        if m.position == "learned":
            positions = (m.max_positions or plan.batch.seq) * m.hidden
            parts.append((POSITION_EMBEDDING, positions))
            total += positions
    if c.last:
        parts.append(("final norm", _norms(plan)))
        total += _norms(plan)
        if not m.tied_embeddings or not c.first:  # one stage (first and last) shares it
            name = "output layer" if not m.tied_embeddings else "output layer (tied copy)"
            parts.append((name, word_rank))
            total += word
        mtp = mtp_layers(plan)
        if mtp:
            whole, per_rank = mtp_params(plan)
            parts.append(("multi-token prediction projections and norms", mtp * per_rank))
            total += mtp * whole
            # the modules look up the next tokens' embeddings on this stage: a copy of the
            # first stage's, kept in step like a tied output layer, which already is the
            # word embedding (learned positions, which would need one too, are refused
            # with multi-token prediction, as Megatron-LM refuses them)
            if not c.first and not m.tied_embeddings:
                parts.append(("word embedding (copy for multi-token prediction)", word_rank))
                total += word
    experts = moe * x.expert_per_rank
    gemms, expert_gemms = stage_gemm_weights(plan, c)
    return StageParams(
        total,
        sum(n for _, n in parts) - experts,
        experts,
        tuple(parts),
        gemms,
        expert_gemms,
        _beside_label(plan, c),
    )


def stage_states(plan: Plan, params: StageParams) -> tuple[Alloc, ...]:
    """`resident_states` of a stage's `params`."""
    return resident_states(
        plan,
        params.per_rank,
        params.expert_per_rank,
        params.vocab_per_rank,
        params.beside_gemms_per_rank,
        params.beside_label,
        params.expert_beside_per_rank,
    )


def params_total(plan: Plan) -> int:
    """All distinct parameters of the model (a tied embedding counted once): its layers
    (`layer_params`, an MoE layer with all its experts), the word embedding (and an untied
    output layer), the final norm and learned positions.

    For a GPT with biases, LayerNorm, a 4h GeLU MLP, full multi-head attention, a tied
    embedding and learned positions this is the count of Narayanan et al., arXiv 2104.04473,
    section 5.1, P = 12·l·h²·(1 + 13/(12·h) + (V + s)/(12·l·h)) (per layer 12h² weights and
    13h biases and norms), plus the final LayerNorm's 2h, which that formula leaves out;
    other models count their own blocks (GQA, gated MLPs, experts, latent attention)
    layer by layer rather than by that closed form."""
    m = plan.model
    flags = moe_layers(plan)
    moe = sum(flags)
    x = layer_params(plan, moe=True)
    total = (m.layers - moe) * layer_params(plan).total + moe * (x.total + x.expert_total)
    total += m.vocab * m.hidden * (1 if m.tied_embeddings else 2) + _norms(plan)
    if m.position == "learned":
        total += (m.max_positions or plan.batch.seq) * m.hidden
    return total


def active_params(plan: Plan) -> int:
    """Parameters one token uses: the top-k experts of each MoE layer instead of all, every
    other parameter (attention, router, shared experts, embeddings) counted whole; the
    "active parameters" of Jiang et al., "Mixtral of Experts", arXiv 2401.04088, abstract
    (Mixtral 8x7B: 47B parameters, 13B active per token at top 2 of 8 experts)."""
    m = plan.model
    if m.experts is None:
        return params_total(plan)
    x = layer_params(plan, moe=True)
    unused = (m.experts.count - m.experts.top_k) * x.expert_total // m.experts.count
    return params_total(plan) - sum(moe_layers(plan)) * unused


def expert_data_parallel(plan: Plan) -> int:
    """Ranks that hold the same expert shard: tp·cp·dp / (ep·etp) (Megatron-Core's expert
    data-parallel group), over which expert gradients are reduced and optimizer states
    sharded. Under hybrid sharding (`Parallel.dp_shard`, priced only where the experts are
    not split apart, ep 1 and etp = tp, so that group is the dense dp x cp one) ZeRO's
    shard group: Megatron-Core splits the expert data-parallel group into its optimizer
    instances too (``intra_partial_expert_data_parallel_size``), and FSDP shards the experts
    of a unit over the mesh its other parameters use (`step._hybrid`)."""
    par = plan.parallel
    if par.dp_shard is not None:
        return vmax(1, par.zero_ranks)  # type: ignore[no-any-return]
    return vmax(1, par.tp * par.cp * par.dp // (par.ep * par.expert_tp))


def resident_states(
    plan: Plan,
    params: int,
    expert_params: int = 0,
    vocab: int = 0,
    beside: Any = 0,
    beside_label: str = "norm",
    expert_beside: Any = 0,
) -> tuple[Alloc, ...]:
    """Model states one rank keeps for the whole step, by precision and ZeRO stage.

    ZeRO (Rajbhandari et al., arXiv 1910.02054, section 5 and Table 1): with Ψ parameters,
    16-bit parameters and gradients (2Ψ + 2Ψ) and K·Ψ bytes of optimizer state (K = 12 for
    mixed-precision Adam: fp32 master copy, momentum and variance), stage 1 shards the K·Ψ
    over Nd data-parallel ranks, stage 2 also the gradients, stage 3 also the parameters.
    Non-expert states shard over dp x cp, expert states over the expert data-parallel group
    (Megatron-LM's distributed optimizer); under hybrid sharding the non-expert states shard
    over the shard group alone (`Parallel.zero_ranks`), each of the dp / dp_shard copies
    holding them whole between its ranks (PyTorch FSDP's HYBRID_SHARD, Megatron-LM's
    distributed-optimizer instances). Shards are rounded up to whole elements. Of
    `params`, the `vocab` embedding and output-layer parameters and the `beside` ones
    outside the layers' GEMMs (`StageParams.beside_gemms_per_rank`: norms, biases, routers,
    `beside_label` says which) stay 16-bit under fp8 weights (`flops.outside_operands`), as
    the `expert_beside` experts' biases of `expert_params` do: rows of their own.
    """
    prec, z, cp = plan.precision, plan.parallel.zero, plan.parallel.cp
    narrow = DTYPE_BYTES[prec.params] < VOCAB_WEIGHT_BYTES
    dense, edp = plan.parallel.zero_ranks, expert_data_parallel(plan)
    # (prefix, parameters, ranks sharding them, the parts of them kept 16-bit): the parts
    # are parameter rows of their own; their gradients and optimizer states, in the same
    # formats as the rest's, are counted with the rest's
    groups: list[tuple[str, Any, Any, list[tuple[str, Any]]]] = [
        ("", params, dense, [("embedding and output layer", vocab), (beside_label, beside)])
    ]
    if not every(expert_params == 0):  # an expert row for a sweep where any layout has one
        groups.append(("expert ", expert_params, edp, [("expert bias", expert_beside)]))
    moments = {"adam": 2, "sgd": 1, "none": 0}[prec.optimizer]
    label = "Adam moments" if prec.optimizer == "adam" else "SGD momentum"
    allocs = []
    copies = plan.parallel.replicas
    for prefix, whole, ranks, parts in groups:
        wide = [(f"{what} ", n) for what, n in parts if narrow and not every(n == 0)]
        rows: list[tuple[str, Category, int, int, Any]] = [
            (
                f"{prefix}parameters ({prec.params})",
                "params",
                DTYPE_BYTES[prec.params],
                3,
                whole - sum(n for _, n in wide),
            ),
            *((f"{what}parameters (bf16)", "params", 2, 3, n) for what, n in wide),
        ]
        if plan.mode == "train":
            grads = DTYPE_BYTES[prec.grads]
            rows.append((f"{prefix}gradients ({prec.grads})", "grads", grads, 2, whole))
            if prec.master is not None:
                master = DTYPE_BYTES[prec.master]
                rows.append(
                    (f"{prefix}master weights ({prec.master})", "optimizer", master, 1, whole)
                )
            if moments:
                state = moments * DTYPE_BYTES[prec.optimizer_state]
                rows.append(
                    (f"{prefix}{label} ({prec.optimizer_state})", "optimizer", state, 1, whole)
                )
        for name, category, per_param, stage, n in rows:
            on = z >= stage
            count = vwhere(on, -(-n // ranks), n)  # one rank: the shard is everything
            many = every(ranks > 1)
            expert = "expert " if prefix == "expert " else ""
            if isinstance(on, bool):
                # the non-expert group is dp × cp: say so when context parallelism is on
                spans = "data- and context-parallel" if not expert and _above_one(cp) else ""
                kind = spans or "data-parallel"
                # under hybrid sharding what is not sharded is held on every copy's ranks too
                every_rank = ranks * copies
                where = (
                    f"shard over {count_label(ranks)} {expert}{kind} ranks"
                    + (f", one of {copies} copies" if copies > 1 else "")
                    if on and many
                    else f"replicated over {count_label(every_rank)} {expert}{kind} ranks"
                    if every_rank > 1
                    else ""
                )
            else:
                where = f"by ZeRO stage over {expert}data-parallel ranks"
            allocs.append(Alloc(name, category, count * per_param, placement=where))
    if plan.device.reserved:
        allocs.append(
            Alloc("reserved (runtime, NCCL, allocator)", "reserved", plan.device.reserved)
        )
    return tuple(allocs) + tuple(te_userbuffers(plan))


# Transformer Engine 2.5's userbuffer communicators (``module/base.py``, ``initialize_ub``):
# the six that all-gather (ring exchanges and the bulk data-gradient ones), which hold 1 B an
# element under FP8 (``fp8_buf``), and the four that reduce-scatter
UB_GATHERING = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad", "qkv_dgrad", "fc1_dgrad")
UB_SCATTERING = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")


def te_userbuffers(plan: Plan) -> list[Alloc]:
    """Transformer Engine's comm-GEMM overlap buffers (`overlap.tp`), registered once a
    rank for the whole run: ``initialize_ub`` (TransformerEngine 2.5, ``module/base.py``)
    makes ten communicators, each with a buffer of the shape Megatron-LM passes it,
    [seq · micro / cp, hidden] (``_initialize_tp_communicators``): four ring exchanges
    (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad), two pipelined reduce-scatters
    (proj_fprop, fc2_fprop) and four bulk overlaps (qkv and fc1 dgrad and wgrad); the six
    that all-gather hold 1 B an element under FP8 training, the rest bf16, the format
    ``initialize_ub`` takes when Megatron-LM names none (a review: they were sized in the
    activations' format). Allocated outside PyTorch's allocator (``cuMemCreate``), like
    NCCL's buffers, and counted with what is reserved (an audit: 1.25 GiB on Llama 3 70B
    at tp 8, 8,192 tokens, counted nowhere). Training with sequence parallelism over
    tp > 1 only, where Megatron-LM runs the overlap."""
    par = plan.parallel
    if plan.mode != "train" or not plan.overlap.tp or every(par.tp == 1):
        return []
    elements = plan.batch.seq * plan.batch.micro // par.cp * plan.model.hidden
    bf16 = DTYPE_BYTES["bf16"]
    gathering = 1 if te_fp8(plan) else bf16
    size = elements * (len(UB_GATHERING) * gathering + len(UB_SCATTERING) * bf16)
    name = "Transformer Engine userbuffers (overlap.tp, 10 buffers)"
    return when([Alloc(name, "reserved", size)], userbuffered(plan))


def userbuffered(plan: Plan) -> Any:
    """Whether Transformer Engine's comm-GEMM overlap runs (`te_userbuffers`): training
    with `overlap.tp` and sequence parallelism over tp > 1. A bool, or a sweep's array."""
    par = plan.parallel
    if plan.mode != "train" or not plan.overlap.tp:
        return False
    return holds((par.tp > 1) & par.sequence_parallel)


def fp8_gemm_weights(plan: Plan, moe: bool = False) -> tuple[Any, Any]:
    """(non-expert, expert) weights of one layer's GEMMs on one rank: what Transformer Engine
    runs in FP8 (`layer_params` less the biases, norms, attention sinks and router, which
    Megatron-Core keeps 16-bit: its router is a ``torch.mm``, ``moe_utils.py``). QKV (or
    latent attention's down- and up-projections) and the output projection, the MLP's fc1
    (gate and up) and fc2, an MoE layer's shared experts and its rank's experts."""
    attention = fp8_block_weights(plan, "attention")
    if not moe or plan.model.experts is None:
        return attention + fp8_block_weights(plan, "mlp"), 0
    return attention + fp8_block_weights(plan, "shared"), fp8_block_weights(plan, "experts")


def fp8_block_weights(plan: Plan, block: str) -> Any:
    """The GEMM weights one rank holds of one layer's `block` (`fp8_gemm_weights`):
    "attention", "mlp", an MoE layer's "shared" experts or its rank's routed "experts"."""
    m, t = plan.model, plan.parallel.tp
    h, gate = m.hidden, m.gate

    def mlp(width: int, shards: Any) -> Any:
        return -(-((gate + 1) * h * width) // shards)

    if block == "mlp":
        return mlp(m.ffn, t)
    if block in ("shared", "experts"):
        e = m.experts
        if e is None:
            return 0
        if block == "shared":
            return mlp(e.shared_ffn, t) if e.shared_ffn else 0
        return (e.count // plan.parallel.ep) * mlp(e.ffn, plan.parallel.expert_tp)
    out_width = m.heads * m.head_dim
    if m.mla is not None:
        mla = m.mla
        sharded = (mla.q_rank or h) * m.heads * m.qk_head_dim
        sharded += mla.kv_rank * m.heads * (mla.nope_dim + m.head_dim) + out_width * h
        return -(-sharded // t) + h * (mla.q_rank + mla.kv_rank + mla.rope_dim)
    return -(-(2 * h * out_width) // t) + 2 * h * kv_heads_per_rank(plan) * m.head_dim


def gemm_weights(plan: Plan, dense: Any, moe: Any) -> tuple[Any, Any]:
    """(non-expert, expert) GEMM weights one rank holds of `dense` dense and `moe` MoE
    layers (`fp8_gemm_weights`)."""
    (one, _), (shared, experts) = fp8_gemm_weights(plan), fp8_gemm_weights(plan, moe=True)
    return dense * one + moe * shared, moe * experts


def stage_gemm_weights(plan: Plan, c: StageClass) -> tuple[Any, Any]:
    """`gemm_weights` of one rank of a stage's class: its layers', multi-token prediction's
    among them (`mtp_layers`)."""
    return gemm_weights(plan, c.dense, c.moe)


def stage_fp8_weights(plan: Plan, c: StageClass) -> Any:
    """The GEMM weights one rank of a stage's class runs in FP8 (`fp8_gemm_weights`)."""
    return sum(stage_gemm_weights(plan, c))


def fp8_weight_copies(plan: Plan, c: StageClass) -> list[Alloc]:
    """Transformer Engine's FP8 copies of a stage's GEMM weights, kept for the whole step:
    quantized at the step's first micro-batch into a workspace the module keeps
    (``get_weight_workspace`` with ``is_first_microbatch``, which Megatron-Core passes
    unless ``disable_parameter_transpose_cache``), 1 B a weight, and, where the device's
    FP8 GEMMs take K-major operands only (`Device.fp8_transpose`, Hopper), its transpose
    for the backward's data gradient, 1 B more (TransformerEngine 2.5, ``module/base.py``
    and ``linear.py``: ``update_usage(columnwise_usage=True)``, read by a research audit).
    FP8 parameters (``precision.params: fp8``, Megatron-LM's ``--fp8-param-gather``) are
    the FP8 copy themselves: only the transpose is added. Under ZeRO-3 the copies are made
    from each gathered block, and how long an FSDP stack keeps them was not read: not
    counted there."""
    if not te_fp8(plan):
        return []
    wide, transposed = DTYPE_BYTES[plan.precision.params] > 1, plan.device.fp8_transpose
    if not (wide or transposed):
        return []
    what = {
        (True, True): "FP8 copies of the layers' GEMM weights and their transposes",
        (True, False): "FP8 copies of the layers' GEMM weights",
        (False, True): "FP8 transposes of the layers' GEMM weights",
    }[(wide, transposed)]
    size = stage_fp8_weights(plan, c) * (int(wide) + int(transposed))
    copies = Alloc(f"{what} (Transformer Engine)", "params", size)
    return when([copies], plan.parallel.zero < 3)


def saved_gemm_input(plan: Plan, s: Shapes) -> Any:
    """Bytes an element of a GEMM input that a layer saves for its weight gradient takes:
    1 under FP8 training, where Transformer Engine's ``Linear`` and ``LayerNormLinear`` save
    the input they quantized (its FP8 transpose, or under sequence parallelism the local
    FP8 shard, re-gathered in the backward; ``linear.py`` and ``layernorm_linear.py``:
    ``update_usage``, TransformerEngine 2.5 as 1.x's ``inputmat_t``) and not the 16-bit
    one; otherwise the activations' format."""
    return 1 if te_fp8(plan) else s.act


# --------------------------------------------------------------------------------------------
# Activations


@dataclass(frozen=True, slots=True)
class Shapes:
    """Sizes of one micro-batch on one rank, in elements and bytes per element."""

    tokens: int  # b x s / cp: tokens of one micro-batch on one context-parallel rank
    tokens_sp: int  # tokens in sequence-parallel regions (tokens / tp with SP)
    act: int  # bytes per activation element
    hidden: int
    q_cols: int  # query heads x head_dim (the query/key head dimension) on one tp rank
    k_cols: int  # kv heads x the query/key head dimension on one tp rank
    v_cols: int  # kv heads x the value head dimension on one tp rank
    out_cols: int  # heads x the value head dimension on one tp rank (attention output)
    ffn_cols: int  # ffn width on one tp rank
    heads: int  # query heads on one tp rank
    seq_kv: int  # keys each local query attends to (the full sequence)
    micro: int
    sliding: Any = 0.0  # share of the layers whose attention slides (the stage's, in `step`)
    causal: bool = True  # queries attend to the same sequence (not decode's cache)
    # token-expert rows the busiest rank's experts receive (tokens_sp·k·c, times the
    # routing skew); `sent`: the rows a rank dispatches, the even share (tokens_sp·k·c)
    dispatched: int = 0
    sent: int = 0
    routed: int = 0  # rows one rank's experts compute: dispatched x etp, or dispatched when
    # every tp rank holds the same tokens (no sequence parallelism: nothing to gather)
    experts: int = 0  # routed experts in the model
    local_experts: int = 0  # routed experts one rank holds (experts / ep)
    expert_cols: int = 0  # one expert's ffn width on one expert-tensor-parallel rank
    shared_cols: int = 0  # shared experts' ffn width on one tp rank
    q_latent: int = 0  # latent attention: query latent width (replicated over tp)
    kv_latent: int = 0  # latent attention: key/value latent + shared rotary key width
    window_kv: int = 0  # decode: keys a sliding layer meets, the passes' mean (0: min(seq_kv, W))


def shapes(plan: Plan, query_len: int | None = None, kv_len: int | None = None) -> Shapes:
    """One micro-batch on one rank. Training and prefill process whole sequences (queries
    = keys = batch.seq, split over cp); decode passes one query per sequence (`query_len`
    1) against `kv_len` cached keys."""
    m, par, b = plan.model, plan.parallel, plan.batch
    t = par.tp
    rows = b.seq if query_len is None else query_len
    tokens = b.micro * vmax(1, rows // par.cp)
    return Shapes(
        tokens=tokens,
        tokens_sp=vwhere(par.sequence_parallel, -(-tokens // t), tokens),
        act=DTYPE_BYTES[plan.precision.activations],
        hidden=m.hidden,
        q_cols=m.heads * m.qk_head_dim // t,
        k_cols=kv_heads_per_rank(plan) * m.qk_head_dim,
        v_cols=kv_heads_per_rank(plan) * m.head_dim,
        out_cols=m.heads * m.head_dim // t,
        ffn_cols=-(-m.ffn // t),
        heads=m.heads // t,
        seq_kv=b.seq if kv_len is None else kv_len,
        micro=b.micro,
        sliding=m.sliding_share,
        causal=query_len is None or query_len == kv_len,
        **_expert_shapes(plan, vwhere(par.sequence_parallel, -(-tokens // t), tokens)),
        **_latent_shapes(plan),
    )


def _latent_shapes(plan: Plan) -> dict[str, int]:
    mla = plan.model.mla
    if mla is None:
        return {}
    return {"q_latent": mla.q_rank, "kv_latent": mla.kv_rank + mla.rope_dim}


def _expert_shapes(plan: Plan, tokens_sp: int) -> dict[str, int]:
    """Token-expert assignments per rank: each of the rank's tokens goes to top_k experts;
    with a capacity factor c each expert takes at most C = ⌈tokens·k/E·c⌉ of a rank's rows
    (`expert_capacity`: Megatron-Core's ``get_capacity``, after Fedus et al., arXiv
    2101.03961, eq. 3), so a rank sends at most E·C and, since each of the ep ranks sends
    each of its E/ep experts at most C, receives at most E·C. Routing is taken as balanced,
    so a factor of 1 or more drops nothing and a rank dispatches tokens·k rows, and a factor
    c < 1 drops down to E·C (Megatron-Core's default, ``--moe-expert-capacity-factor``
    alone). Padded to capacity (``experts.pad_to_capacity``: Megatron-Core's
    ``--moe-pad-expert-input-to-capacity``, GShard's and Switch's fixed expert batches)
    every expert computes, and the all-to-all moves, its whole capacity: E·C rows. Routing
    skew (``experts.imbalance``, `routing_skew`) sizes the rows the busiest rank receives
    instead of the mean's, f·tokens·k, at most E·C under a capacity factor, since the step
    waits for it and its memory peaks highest; the rows a rank sends stay the even share. An
    expert split over etp ranks needs every row on each of them: the rows are all-gathered
    over etp after the all-to-all (Megatron-Core's alltoall token dispatcher).

    Without sequence parallelism (serving; training refuses it, see `resolve`) every tp rank
    already holds all of the micro-batch's tokens, so nothing is gathered and the partial
    outputs are all-reduced over tp after the block, as a dense MLP's are. With the experts
    split over the tp ranks (etp = tp, vLLM's tensor-parallel ``FusedMoE``) each rank
    computes every row on its column shard; with them spread over the tp ranks (ep x etp =
    tp, e.g. etp 1 and ep = tp: vLLM's and SGLang's expert parallelism inside the tp group)
    each rank computes the rows of its own experts, 1/ep of them, and no all-to-all is
    needed (`experts_inside_tp`)."""
    e = plan.model.experts
    if e is None:
        return {}
    par = plan.parallel
    c = e.capacity_factor
    etp = par.expert_tp
    rows = tokens_sp * e.top_k
    if c is None:  # dropless
        sent, dispatched = rows, vceil(rows * routing_skew(plan))
    else:
        full = e.count * expert_capacity(tokens_sp, e.top_k, e.count, c)  # every expert's C
        if e.pad_to_capacity:  # every expert computes C rows whatever the skew
            sent = dispatched = full
        else:  # the skew before the capacity caps it: the cap is E·C, rounded per expert
            skew = uncapped_skew(plan)
            sent, dispatched = vmin(rows, full), vmin(vceil(rows * skew), full)
    own = -(-dispatched // vwhere(experts_inside_tp(plan), par.ep, 1))
    return {
        "dispatched": dispatched,
        "sent": sent,
        "routed": vwhere(tokens_replicated(plan), own, dispatched * etp),
        "experts": e.count,
        "local_experts": e.count // par.ep,
        "expert_cols": -(-e.ffn // plan.parallel.expert_tp),
        "shared_cols": -(-e.shared_ffn // plan.parallel.tp),
    }


def expert_capacity(tokens: Any, top_k: int, experts: int, factor: float) -> Any:
    """Rows one expert takes from one rank's `tokens` under capacity factor c: Megatron-Core's
    ``get_capacity(num_tokens=num_tokens * topk, num_experts, capacity_factor)`` =
    ⌈tokens·k/E·c⌉ (megatron/core/transformer/moe/moe_utils.py, called on the rank's own
    tokens by ``apply_router_token_dropping``, ``topk_softmax_with_capacity`` in earlier
    releases), rounded up per expert. Computed in integers with c as the fraction it is
    written as (1.1 = 11/10, to the nearest fraction of denominator at most 10⁶), so that a
    whole product stays whole: Mixtral's 3,000 tokens·2/8·1.1 = 825 rows, where floats give
    825.0000000000001 and a ceiling of 826 (Megatron-Core's own float expression does the
    same; the budget takes the exact ceiling). `tokens` may be an array (a sweep)."""
    q = Fraction(str(factor)).limit_denominator(10**6)
    return -(-(tokens * top_k * q.numerator) // (experts * q.denominator))


def experts_inside_tp(plan: Plan) -> bool | np.ndarray:
    """Every tp rank holds the same tokens and the expert grid (ep x etp, ep > 1) is the tp
    group itself: each rank finds its own experts' rows among the tokens it already has."""
    par = plan.parallel
    etp = par.expert_tp
    return holds(tokens_replicated(plan) & holds(par.ep > 1) & holds(par.ep * etp == par.tp))


def tokens_replicated(plan: Plan) -> bool | np.ndarray:
    """Every tp rank holds the same tokens: tp > 1 without sequence parallelism."""
    par = plan.parallel
    return holds(holds(par.tp > 1) & lacks(par.sequence_parallel))


def column_input(plan: Plan, s: Shapes) -> tuple[Any, str]:
    """Tokens of a column-parallel layer's saved input and their placement: the
    sequence-parallel shard Megatron-LM saves (and gathers again for the weight gradient),
    or under DTensor's parallel styles (`Parallel.tp_style` dtensor) the redistributed,
    replicated input the matmul itself saved (torch.nn.Linear's autograd keeps its input;
    an audit, m489: 64 MiB a layer at tp 2 on Llama 3 8B where 32 were counted)."""
    if plan.parallel.tp_style == "dtensor":
        return s.tokens, "replicate on tp"
    return s.tokens_sp, residual_placement(plan)


def residual_placement(plan: Plan) -> str:
    return (
        "shard(0) on tp"
        if every(holds(plan.parallel.sequence_parallel) & (plan.parallel.tp > 1))
        else ("replicate on tp")
    )


QKV_OUTPUTS = ("attention Q", "attention K", "attention V")  # the QKV projection's outputs
# under selective recompute, the QKV projection's output V's view keeps (`_qkv_held_by_v`)
QKV_HELD_BY_V = "attention QKV output, held by V (a view of it)"
ATTENTION_NORM_INPUT = "attention norm input"  # the layer's input, under pre-norm
MLA_LATENTS = "attention latents (MLA)"  # latent attention's down-projections' outputs


def attention_saved(plan: Plan, s: Shapes) -> list[Alloc]:
    """Tensors the attention block saves for backward, per layer and micro-batch.

    Korthikanti et al. section 4.1: norm input 2sbh, QKV input 2sbh, Q and K 4sbh, V 2sbh,
    softmax output 2as²b, its dropout mask as²b and output 2as²b, projection input 2sbh,
    output dropout mask sbh. Generalised: Q/K/V widths follow GQA; Q/K norms keep their
    input, the projected Q and K (RMSNorm's and LayerNorm's backward read it, as Transformer
    Engine's and Apex's kernels save it; their per-row statistics are not counted); flash
    attention stores no
    s² scores but fp32 softmax statistics (Dao et al., arXiv 2205.14135, section 3.1);
    selective recompute drops the core attention's saved tensors, the s² ones
    (Korthikanti section 5) or flash's statistics, since Megatron-LM checkpoints the whole
    core attention and runs it again in the backward. With sequence
    parallelism the tensors outside the tp region are sharded over tp (section 4.2.2).
    """
    a, res = s.act, residual_placement(plan)
    head = "shard(heads) on tp"
    # eager attention repeats K and V up to the query heads before its batched GEMMs, which
    # save the copies, and nothing keeps the narrow K and V (Megatron-LM's unfused
    # ``DotProductAttention``: ``key.repeat_interleave(np // ng, dim=2)``; transformers'
    # ``repeat_kv``); selective recompute's checkpoint keeps its narrow inputs instead (an
    # audit: Llama 3 70B eager read 2 MiB a K where 16 MiB are saved)
    repeated = (plan.model.attention == "eager") & lacks(plan.recompute == "selective")
    widths = (
        s.q_cols,
        vwhere(repeated, s.q_cols, s.k_cols),
        vwhere(repeated, s.out_cols, s.v_cols),
    )
    gemm_in = saved_gemm_input(plan, s)
    tokens, placed = column_input(plan, s)
    out = [
        Alloc(ATTENTION_NORM_INPUT, "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc("attention QKV input", "activations", gemm_in * tokens * s.hidden, placement=placed),
        *(
            Alloc(name, "activations", a * s.tokens * cols, placement=head)
            for name, cols in zip(QKV_OUTPUTS, widths, strict=True)
        ),
    ]
    if plan.model.qk_norm != "none":  # the norms keep their input, Q and K before them
        qk = a * s.tokens * (s.q_cols + s.k_cols)
        out.append(Alloc("attention Q/K norm input", "activations", qk, placement=head))
    if plan.model.mla is not None:
        # the latents feed the up-projections' backward and their RMSNorms keep their input
        # too (the rotary key is not normed); the sequence shard of them under SP, which the
        # backward gathers again, as for the QKV input
        latents = 2 * (s.q_latent + s.kv_latent) - plan.model.mla.rope_dim
        out.append(Alloc(MLA_LATENTS, "activations", a * s.tokens_sp * latents, placement=res))
    out.extend(core_attention(plan, s))
    out.append(
        Alloc(
            PROJECTION_INPUT,
            "activations",
            gemm_in * s.tokens * s.out_cols,
            placement=head,
        )
    )
    out += post_norm_input(plan, s, "attention")
    if plan.model.dropout:
        out.append(
            Alloc("attention dropout mask", "activations", s.tokens_sp * s.hidden, placement=res)
        )
    dropped = {a.name for a in core_attention(plan, s)}
    keep = lacks(plan.recompute == "selective")
    kept: list[Alloc] = []
    for x in out:
        kept += when([x], keep) if x.name in dropped else [x]
    return kept + _qkv_held_by_v(plan, s)


def _qkv_held_by_v(plan: Plan, s: Shapes) -> list[Alloc]:
    """Under selective recompute, Megatron-Core's checkpoint of the core attention saves
    its inputs (``_checkpointed_attention_forward``), V among them as ``torch.split`` cut it
    from the QKV projection's output (``get_query_key_value_tensors``), a view, which keeps
    that whole output alive (an audit: 18 MiB a layer on Llama 3 70B at tp 8, 1.41 GiB of
    stage 0's peak). Of the Q and K columns it holds, those no saved tensor views are bytes
    of their own beside the Q, K and V counted: Q's where a rank holds several key/value
    groups of several query heads each (its reshape to heads copies the interleaved
    columns; one group a rank reshapes as a view) or where the
    rotary embedding writes it anew with no Q norm keeping the split's view as its input;
    K's where the rotary embedding writes it anew with no K norm doing so (Megatron-Core
    0.13.1 ``attention.py``; ``apply_rotary_pos_emb`` returns a new tensor). Without
    recompute Transformer Engine's kernel copies V contiguous and saves the copy, and the
    output is freed; latent attention projects Q, K and V apart."""
    m = plan.model
    if m.mla is not None:
        return []
    rope, normed = m.position == "rope", m.qk_norm != "none"
    groups = kv_heads_per_rank(plan)
    copied = (groups > 1) & (s.q_cols // m.qk_head_dim > groups)
    q_new = copied | (rope and not normed)
    k_new = rope and not normed
    cols = s.q_cols * q_new + s.k_cols * k_new
    held = Alloc(
        QKV_HELD_BY_V,
        "activations",
        s.act * s.tokens * cols,
        placement="shard(heads) on tp",
    )
    return when([held], (plan.recompute == "selective") & (cols > 0))


PROJECTION_INPUT = "attention projection input"
FUSED_OUTPUT = "attention output (fused kernel's, 16-bit)"


def core_attention(plan: Plan, s: Shapes) -> list[Alloc]:
    """The s x s part of attention: eager stores scores, flash only row statistics.
    All-gathered context parallelism saves its two half-sequence outputs apart from the
    output it returns (Transformer Engine's ``AttnFuncWithCPAndKVAllGather.forward`` saves
    ``*out_per_step`` for its backward; the projection saves the returned one). A fused
    kernel saves its output for its backward, which is also the output projection's input;
    under FP8 training the projection saves its own FP8 copy instead (`saved_gemm_input`),
    so the kernel's 16-bit output is a tensor of its own."""
    score = score_elements(s)
    if plan.model.attention != "eager":
        rows = s.heads * s.tokens
        saved = [Alloc("attention softmax statistics (fp32)", "activations", 4 * rows)]
        if te_fp8(plan):  # the output the kernel keeps is not the projection's FP8 input
            size = s.act * s.tokens * s.out_cols
            saved.append(Alloc(FUSED_OUTPUT, "activations", size, placement="shard(heads) on tp"))
        if plan.parallel.cp_attention == "allgather":
            halves = Alloc(
                "attention output halves (all-gather cp)",
                "activations",
                s.act * s.tokens * s.out_cols,
                placement="shard(heads) on tp",
            )
            saved += when([halves], plan.parallel.cp > 1)
        return saved
    out = [Alloc("attention softmax output", "activations", s.act * score)]
    if plan.model.attention_softcap:
        # Gemma 2's cap · tanh(scores / cap): the tanh keeps its output for its backward
        # (transformers' eager_attention_forward; the division and product keep nothing)
        out.append(
            Alloc("attention scores soft-capped (tanh output)", "activations", s.act * score)
        )
    if plan.model.dropout:
        out.append(Alloc("attention softmax dropout mask", "activations", score))
        out.append(Alloc("attention softmax dropout output", "activations", s.act * score))
    return out


def score_elements(s: Shapes, keys: Any = None) -> Any:
    """Elements of one micro-batch's s x s attention scores on a rank: its heads' query rows
    against the keys each meets (`keys`, where not the sequence's: a decoding window)."""
    return s.micro * s.heads * (s.tokens // s.micro) * (s.seq_kv if keys is None else keys)


# Megatron-LM's unfused attention's scores input buffer, kept for the run (`eager_scores`)
SCORES_BUFFER = f"attention scores buffer (Megatron-LM's, {HELD_THROUGH} run)"


def eager_scores(plan: Plan, s: Shapes, name: str) -> list[Alloc]:
    """Eager attention's raw scores QKᵀ, one micro-batch's, in the activations' format.
    Megatron-LM's unfused ``DotProductAttention.forward`` writes them with
    ``torch.baddbmm(matmul_input_buffer, ...)``, which returns a tensor of its own, alive as
    the local ``matmul_result`` until the core returns (the softmax saves its output, not
    its input); its ``matmul_input_buffer`` comes from ``get_global_memory_buffer()``, a
    tensor of the same size made at the first call and kept for the run
    (``GlobalMemoryBuffer.get_tensor``, megatron/core/utils.py)."""
    if plan.model.attention != "eager":
        return []
    return [Alloc(name, "transient", s.act * score_elements(s), placement="shard(heads) on tp")]


# Made after a block's row-parallel reduction, so absent from the block's own instants: its
# bias-dropout-add's mask (Megatron-Core's ``TransformerLayer`` runs ``self_attn_bda`` and
# ``mlp_bda`` on the reduced output) and a sandwich norm's input, the reduced output itself
LATE = frozenset(
    f"{block} {what}"
    for block in ("attention", "MLP", "MoE")
    for what in ("dropout mask", "post-norm input")
)

FC2_INPUT = "MLP fc2 input"


def activation_input(plan: Plan) -> str:
    """The name of the tensor the MLP's activation function saves: its input, or under
    squared ReLU the relu's output, which relu (for its backward) and the square (its
    input) save, one tensor of the same bytes (`flops.activation`)."""
    if plan.model.gate == 2:
        return f"MLP {MLP_NAMES[plan.model.mlp]} input (gate, up)"
    return "MLP ReLU output" if plan.model.mlp == "squared_relu" else "MLP GeLU input"


def mlp_saved(plan: Plan, s: Shapes) -> list[Alloc]:
    """Tensors the MLP block saves: Korthikanti section 4.1 (norm input 2sbh, first linear
    input 2sbh, GeLU input 8sbh, GeLU output 8sbh, dropout mask sbh) with ffn = 4h; a gated
    MLP (SwiGLU, GeGLU) saves the gate and up projections (2 x ffn) and their product (ffn)."""
    a, res = s.act, residual_placement(plan)
    col = "shard(ffn) on tp"
    gemm_in = saved_gemm_input(plan, s)
    tokens, placed = column_input(plan, s)
    out = [
        Alloc("MLP norm input", "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc("MLP fc1 input", "activations", gemm_in * tokens * s.hidden, placement=placed),
    ]
    gate = plan.model.gate  # gated MLPs save the gate and up projections
    out.append(
        Alloc(
            activation_input(plan), "activations", gate * a * s.tokens * s.ffn_cols, placement=col
        )
    )
    out.append(Alloc(FC2_INPUT, "activations", gemm_in * s.tokens * s.ffn_cols, placement=col))
    out += post_norm_input(plan, s, "MLP")
    if plan.model.dropout:
        out.append(Alloc("MLP dropout mask", "activations", s.tokens_sp * s.hidden, placement=res))
    return out


def moe_saved(plan: Plan, s: Shapes) -> list[Alloc]:
    """Tensors an MoE block saves: the norm and router inputs, fp32 routing probabilities,
    the dispatched token rows (expert fc1 input), each expert's fc1 output and fc2 input,
    and the shared experts' tensors like a dense MLP, with their gate's where they have one.
    Megatron-Core's grouped experts weight each row by its routing probability inside the
    activation (``TEGroupedMLP``:
    ``weighted_bias_swiglu_impl(fc1_output, bias, permuted_probs)``, which saves the row's
    fp32 probability beside its input), so the combine only un-permutes and sums, and keeps
    nothing for backward (it kept the expert outputs when it weighted them itself)."""
    a, res = s.act, residual_placement(plan)
    gate = plan.model.gate
    rows = "shard(tokens) on ep"
    gemm_in = saved_gemm_input(plan, s)  # the experts' and shared experts' GEMM inputs
    out = [
        Alloc("MoE norm input", "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc("router input", "activations", a * s.tokens_sp * s.hidden, placement=res),
        Alloc(
            "router probabilities (fp32)", "activations", 4 * s.tokens_sp * s.experts, placement=res
        ),
        Alloc("dispatched tokens", "activations", gemm_in * s.routed * s.hidden, placement=rows),
        Alloc(
            "expert fc1 output", "activations", gate * a * s.routed * s.expert_cols, placement=rows
        ),
        Alloc(
            "expert fc2 input", "activations", gemm_in * s.routed * s.expert_cols, placement=rows
        ),
        Alloc("expert row probabilities (fp32)", "activations", 4 * s.routed, placement=rows),
    ]
    if every(s.shared_cols > 0):
        col = "shard(ffn) on tp"
        out.append(
            Alloc(
                "shared expert fc1 output",
                "activations",
                gate * a * s.tokens * s.shared_cols,
                placement=col,
            )
        )
        out.append(
            Alloc(
                "shared expert fc2 input",
                "activations",
                gemm_in * s.tokens * s.shared_cols,
                placement=col,
            )
        )
        experts = plan.model.experts
        if experts is not None and experts.shared_gate:
            # ``output * gate_score`` (Megatron-Core's ``SharedExpertMLP``; transformers'
            # Qwen2-MoE block alike) keeps both factors: the shared experts' output after
            # its reduction and the sigmoid's score a token (an audit: 0.375 GiB of Qwen1.5-MoE
            # at 4,096 tokens uncounted); the gate's input is the router's, counted
            out += [
                Alloc(
                    "shared expert output, kept for its gate",
                    "activations",
                    a * s.tokens_sp * s.hidden,
                    placement=res,
                ),
                Alloc("shared expert gate score", "activations", a * s.tokens_sp, placement=res),
            ]
    out += post_norm_input(plan, s, "MoE")
    if plan.model.dropout:
        out.append(Alloc("MoE dropout mask", "activations", s.tokens_sp * s.hidden, placement=res))
    return out


def post_norm_input(plan: Plan, s: Shapes, block: str) -> list[Alloc]:
    """With ``model.sandwich_norm`` the norm after a block keeps its input, the block's
    output (after the row-parallel reduction, so the sequence shard under SP)."""
    if not plan.model.sandwich_norm:
        return []
    size = s.act * s.tokens_sp * s.hidden
    return [
        Alloc(f"{block} post-norm input", "activations", size, placement=residual_placement(plan))
    ]


def layer_saved(plan: Plan, s: Shapes) -> tuple[list[Alloc], list[Alloc]]:
    """(attention, MLP) tensors saved per layer and micro-batch under the recompute mode.

    Full recompute keeps only each layer's input (Korthikanti Table 2: 2sbh; sharded over tp
    with sequence parallelism) and rebuilds the rest in backward.
    """
    full = plan.recompute == "full"
    checkpoint = Alloc(
        "layer input (checkpoint)",
        "activations",
        s.act * s.tokens_sp * s.hidden,
        placement=residual_placement(plan),
    )
    rest = lacks(full)
    return (
        when([checkpoint], full) + when(attention_saved(plan, s), rest),
        when(mlp_saved(plan, s), rest),
    )


def _beside_label(plan: Plan, c: StageClass) -> str:
    """What a stage of class `c` holds outside its layers' GEMMs and vocabulary
    (`StageParams.beside_gemms_per_rank`), as a row of the memory table names it (a review:
    named by the model, a first stage of dense layers read "router and multi-token
    projection")."""
    m = plan.model
    kinds = ["norm"]
    kinds += ["bias"] if m.bias or m.qkv_bias or m.mlp_biased else []
    kinds += ["router"] if m.experts is not None and not every(c.moe == 0) else []
    kinds += ["attention sink"] if m.attention_sinks else []
    kinds += ["multi-token projection"] if c.last and mtp_layers(plan) else []
    return ", ".join(kinds[:-1]) + (" and " if len(kinds) > 1 else "") + kinds[-1]


def _above_one(degree: Any) -> bool:
    """A degree above 1, for the labels of one plan (a sweep's array of degrees: False)."""
    return isinstance(degree, int) and degree > 1
