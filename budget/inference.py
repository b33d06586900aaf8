"""Derive a serving step: prefill of the prompts, then decode one token at a time.

A serving rank keeps its weights, its share of the KV cache and nothing for backward: no
gradients, no optimizer state, no saved activations, only the working set of the block it
is computing. The KV cache is held for the whole context (prompt + generated tokens) from
the prefill on: the engines reserve it before the first token, FasterTransformer and
TensorRT-LLM's static batches a cache of the longest sequence, vLLM a block pool sized
before serving (``gpu_memory_utilization``, what a profiling pass leaves), which runs the
batch without preempting a sequence only where it holds every sequence's whole context
(vLLM hands a request its blocks as it grows, so a pool holding only the prompts beside
the prefill runs out at the end; an audit, m525, read the prefill's cache as the prompts'
alone). Per rank it holds (a layer whose attention slides keeps only its window's tokens,
`kv_cache_bytes`)

    layers on the stage x kv_heads / tp x head_dim x 2 (K and V) x context / cp
    x sequences per data-parallel replica x bytes per element,

with one key/value head per rank when tp exceeds kv_heads: each is replicated on
tp / kv_heads ranks (`layers.kv_heads_per_rank`),

the element in ``precision.kv_cache``, or the activations' format when the plan names none.
An fp8 cache (vLLM's ``--kv-cache-dtype fp8``, TensorRT-LLM's FP8 KV cache) halves the cache
and decode's reads of it, and nothing else: activations and the tensor-parallel
all-reduces stay in ``precision.activations``.

Under latent attention the cache keeps, per token and layer, the key/value latent and the
one shared rotary key, kv_rank + rope_dim elements (DeepSeek-V2, arXiv 2405.04434, section
2.1.2: 4.5 head dimensions' worth for DeepSeek-V2), and every tp rank keeps all of it: the
latent is not split by heads (vLLM's and SGLang's MLA backends; hence data-parallel
attention for DeepSeek serving).

Prefill processes every prompt token once (phases `prefill.*`); decode then runs the whole
model once per generated token with one query per sequence against the cached keys
(`decode.*`, counted generate - 1 times: the prefill yields the first token,
`decode_passes`). Pass k attends to prompt + k keys, so the passes'
attention is priced once at their mean context (`decode_keys`): its reads and FLOPs grow
linearly with the context, so G passes at the mean cost what the G passes cost; the memory
is held at the last pass, the longest. Under context parallelism each rank attends the
slice of the context its cache holds and the ranks combine their partial outputs
(`_decode_combine`). Decode moves tiny tensors, so its tensor-parallel
all-reduces are latency-bound: n·α dominates Q/B_eff (the seeds' "small messages can be
latency-limited"). Time per token and time to first token are assembled in `schedule`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from budget import flops
from budget.flops import Work
from budget.layers import (
    SCORES_BUFFER,
    Shapes,
    class_params,
    kv_heads_per_rank,
    layer_params,
    moe_layers,
    params_total,
    score_elements,
    shapes,
    stage_classes,
    stage_layer_ids,
    stage_states,
    tokens_replicated,
    vocab_rows,
)
from budget.phases import Alloc, Instant, Move, Phase, StageStep, Step, when
from budget.plan.model import DTYPE_BYTES, Plan
from budget.step import (
    _before_reduction,
    _combined,
    _cp_buffers,
    _cp_moves,
    _cp_reorder,
    _ep_moves,
    _full,
    _pipeline_overlap,
    _shared_expert_moves,
    _sp,
    _stage_shapes,
    _tp_moves,
    at_boundary,
    attention_tp_moves,
    dispatch_buffers,
    embedding_moves,
    pipeline_moves,
    shared_output,
)
from budget.vector import every, vmax, vmin


def kv_cache_bytes(plan: Plan, layers: int, sliding: int = 0, prefill: bool = False) -> int:
    """The KV cache one rank of a stage holds (module docstring): `layers` layers, of which
    `sliding` slide (``model.sliding_window``) and keep only the last W tokens, the ones
    their next query can meet (the rolling cache of Mistral 7B, arXiv 2310.06825, section
    2; vLLM and transformers keep a sliding layer's cache at the window). Through the
    `prefill` a sliding layer holds every prompt token: vLLM allocates a new request's
    prompt blocks whole (``get_num_blocks_to_allocate``: none skipped before any token is
    computed) and frees those behind the window only once they are
    (``remove_skipped_blocks``); an audit (m438) found a 6,000-token prompt's sliding
    layers held at the 4,096-token window there, 0.61 GiB low at Gemma 2's prefill peak."""
    m, par, b = plan.model, plan.parallel, plan.batch
    context = -(-(b.prompt + b.generate) // par.cp)
    elements = 2 * int(kv_heads_per_rank(plan)) * m.head_dim  # serving: one tp
    if m.mla is not None:
        elements = m.mla.kv_rank + m.mla.rope_dim
    per_token = elements * DTYPE_BYTES[plan.precision.cache]
    window = min(context, m.window)
    if prefill:
        window = max(window, -(-b.prompt // par.cp))
    tokens = (layers - sliding) * context + sliding * window
    return per_token * tokens * b.micro


def _working_set(plan: Plan, s: Shapes, block: str) -> list[Alloc]:
    """What one block holds while it computes, with nothing kept for backward: the block's
    normed input beside the residual stream it is added back to (vLLM's decoder layers carry
    both, ``hidden_states, residual = self.input_layernorm(hidden_states, residual)``; the
    residual sequence-sharded under sequence parallelism); in the attention block, the QKV
    projection's one output beside the attention kernel's (vLLM's ``LlamaAttention``:
    ``qkv, _ = self.qkv_proj(...)``, split into views, then ``attn_output = self.attn(q, k,
    v)`` before ``o_proj``), the rank's heads' columns each; in the MLP, at its activation
    function, the first projection's output beside the activation's; in an MoE block the
    same for the routed rows (vLLM's ``fused_experts``: ``intermediate_cache1`` of M·topk x
    N, N the gated fc1's columns, and ``intermediate_cache2`` of M·topk x N/2) beside the
    rows as Megatron-Core's dispatcher permutes them in and out of the experts' order
    (`step.dispatch_buffers`). vLLM holds less there: its fused kernel reads its input rows
    by index, and its M·topk x K output (``intermediate_cache3``) reuses cache1's memory
    (``cache13``, M·topk x max(N, K)), so budget's count is the dispatcher's, the larger."""
    a = s.act
    gate = plan.model.gate
    if block == "attention":
        return [*_layer_input(s), *_attention_held(s), *_eager_core(plan, s)]
    if block == "moe":
        return [
            *_moe_held(plan, s),
            Alloc("expert fc1 output", "transient", gate * a * s.routed * s.expert_cols),
            Alloc("expert activation output", "transient", a * s.routed * s.expert_cols),
        ]
    return [
        *_layer_input(s),
        Alloc("MLP fc1 output", "transient", gate * a * s.tokens * s.ffn_cols),
        _activated(s),
    ]


def _eager_keys(plan: Plan, s: Shapes) -> Any:
    """Keys a query of one pass meets on a rank: the context, or a decoding layer's window
    where every layer of the stage slides (against the cache's last W tokens)."""
    if not s.causal and every(s.sliding == 1):
        return vmin(s.seq_kv, plan.model.window)
    return s.seq_kv


def _eager_scores(plan: Plan, s: Shapes) -> Any:
    """Bytes of one pass's attention scores on a rank: its heads' query rows against the
    keys each meets (`_eager_keys`), in the activations' format."""
    return s.act * score_elements(s, _eager_keys(plan, s))


def _eager_core(plan: Plan, s: Shapes) -> list[Alloc]:
    """Eager attention's core at its softmax, as Megatron-Core's unfused
    ``DotProductAttention.forward`` runs it (its training side: `layers.eager_scores`): the
    raw scores ``torch.baddbmm`` returns (``matmul_result``, a local until the core returns)
    beside the softmax's output, the probabilities the second GEMM reads; under grouped-query
    attention the keys and values ``repeat_interleave`` copies to the query heads, in decode
    over the whole cached context. The scores' input buffer it keeps for the run is resident
    (`_scores_buffer`). An audit: one copy of the scores was counted, 4.25 GiB short of the
    shipped decode plan's prefill under eager attention."""
    if plan.model.attention != "eager":
        return []
    scores = _eager_scores(plan, s)
    rows = s.act * s.micro * _eager_keys(plan, s)
    repeated = [
        Alloc("keys repeated to the query heads", "transient", rows * s.q_cols),
        Alloc("values repeated to the query heads", "transient", rows * s.out_cols),
    ]
    return [
        Alloc("attention scores QKᵀ (working)", "transient", scores),
        Alloc("attention probabilities", "transient", scores),
        *when(repeated, s.q_cols > s.k_cols),
    ]


def _scores_buffer(plan: Plan, passes: list[Shapes]) -> list[Alloc]:
    """Under eager attention, the scores' input buffer (``matmul_input_buffer``) Megatron-Core
    takes from ``get_global_memory_buffer()``: made at the first call, grown to the largest
    call's scores and kept for the run (``GlobalMemoryBuffer.get_tensor``,
    megatron/core/utils.py), so sized to the largest of the `passes`, the prefill's unless
    the prompt is shorter than the context it decodes against."""
    if plan.model.attention != "eager":
        return []
    largest = _eager_scores(plan, passes[0])
    for s in passes[1:]:
        largest = vmax(largest, _eager_scores(plan, s))
    return [Alloc(SCORES_BUFFER, "transient", largest)]


def _moe_held(plan: Plan, s: Shapes) -> list[Alloc]:
    """What an MoE block holds from its dispatch to its combine: its input and residual,
    the rows permuted in and out of the experts' order, the shared experts' output."""
    return [*_layer_input(s), dispatch_buffers(plan, s), *shared_output(s)]


def _layer_input(s: Shapes) -> list[Alloc]:
    """A block's normed input beside the residual stream (`_working_set`)."""
    residual = Alloc("residual stream", "transient", s.act * s.tokens_sp * s.hidden)
    return [Alloc("layer input", "transient", s.act * s.tokens * s.hidden), residual]


def _attention_held(s: Shapes) -> list[Alloc]:
    """The QKV projection's output and the attention kernel's (`_working_set`)."""
    qkv = s.act * s.tokens * (s.q_cols + s.k_cols + s.v_cols)
    out = s.act * s.tokens * s.out_cols
    return [Alloc("Q/K/V", "transient", qkv), Alloc("attention output", "transient", out)]


def _activated(s: Shapes) -> Alloc:
    return Alloc("MLP activation output", "transient", s.act * s.tokens * s.ffn_cols)


def _reduction(plan: Plan, s: Shapes, block: str, base: list[Alloc]) -> Instant:
    """A block's row-parallel projection (the attention's output projection, the MLP's fc2)
    as its output is reduced over tp: the output whole on each rank, partial before its
    all-reduce (in place; its reduce-scatter's shard beside it under sequence
    parallelism), as a training step counts it (`step._before_reduction`), beside the
    stage's resident `base` and what the block still holds: its input and residual, and
    the projection's input; in the attention the QKV projection's output too, a local
    until the block returns (vLLM's ``LlamaAttention.forward``), in the MLP not fc1's,
    which the activation's replaced (``x = self.act_fn(x)``). An audit: serving had no
    instant here, and the shipped decode plan's prefill peaked 134,217,728 B under it."""
    if block == "attention":
        held, label, name = _attention_held(s), "output projection reduction", "attention output"
    else:
        held, label, name = [_activated(s)], "fc2 output reduction", "MLP output"
    return Instant(label, (*base, *_layer_input(s), *held, *_before_reduction(plan, s, name)))


def _decode_combine(plan: Plan, s: Shapes) -> Move:
    """Decoding with the cache sharded along the sequence over cp: each rank attends its
    shard and holds a partial output and the log-sum-exp of its scores per head, which the
    ranks exchange and rescale into the whole (Flash-Decoding's split-KV reduction, Dao et
    al. 2023, across GPUs as in Helix parallelism's KV parallelism, arXiv 2507.07120). Priced
    as an all-gather of the fp32 partial outputs and log-sum-exps, exposed: the output
    projection needs it. Under latent attention a head's partial output is a kv_rank latent,
    which the value up-projection widens only after the combine (`flops.attention_core`'s
    decode in the latent space; FlashMLA's split-KV combine works on the latent output)."""
    cp, mla = plan.parallel.cp, plan.model.mla
    width = s.heads * mla.kv_rank if mla is not None else s.out_cols
    part = 4 * s.tokens * (width + s.heads)  # one rank's partial, fp32
    return Move(
        "split-KV attention combine",
        "all-gather",
        "cp",
        cp,
        "fp32",
        cp * part,
        "shard(0)",
        "replicate",
        rule="cp decode: exposed, the output projection needs the combined attention",
    )


def _output(plan: Plan, s: Shapes) -> tuple[list[Alloc], list[Work], list[Move]]:
    """The final norm over every token of the pass (vLLM's models end ``self.norm(hidden,
    residual)`` before ``compute_logits`` picks positions), then the logits of the last
    position of each sequence (what sampling needs), this rank's ⌈vocab / tp⌉ rows of them
    held in fp32 whatever the model's format: FasterTransformer's ParallelGpt
    (NVIDIA/FasterTransformer, src/fastertransformer/models/multi_gpu_gpt/ParallelGpt.cc)
    writes the output GEMM in ``CUDA_R_32F`` into ``logits_buf_`` / ``nccl_logits_buf_``,
    allocated as ``sizeof(float) * batchxbeam * vocab_size_padded_``, and vLLM's sampler
    (vllm-project/vllm, vllm/v1/sample/sampler.py) casts the logits
    ``logits.to(torch.float32)`` before sampling. Under sequence parallelism each tp
    rank holds 1/tp of the tokens until the norm's output is all-gathered for the output
    layer, as in training (`step._tp_moves`). Each tp rank computes its vocabulary rows'
    logits, which are gathered for the sampler (vLLM's ``LogitsProcessor._gather_logits``,
    in the model's format, to one rank): priced as an all-gather, whose bytes into each rank
    are the gather's into its root, exposed, since sampling waits for it.

    Held at the output GEMM (an audit): the final norm's output over every position, which
    the positions are picked from, and the logits the sampler reads, fp32 over the whole
    vocabulary (the sampler's cast of the gathered logits, beside them; at tp 1 the GEMM's
    own fp32 output, as FasterTransformer writes it); they were counted over this rank's
    vocabulary rows alone."""
    e = flops.outside_operands(plan)
    vocab, tp = vocab_rows(plan), plan.parallel.tp
    normed = Alloc("final norm output, every position", "transient", s.act * s.tokens_sp * s.hidden)
    whole = Alloc(
        "logits (fp32) for sampling, whole vocabulary", "transient", 4 * s.micro * vocab * tp
    )
    logits = [normed, whole]
    gather = Move(
        "logits for sampling",
        "all-gather",
        "tp",
        tp,
        plan.precision.activations,
        s.act * s.micro * vocab * tp,
        "shard(1)",
        "replicate",
        rule="tp: exposed, sampling needs every logit",
    )
    # the gathered logits beside this rank's rows (DESIGN rule 2: full + shard)
    logits += when([Alloc("logits gathered for sampling", "transient", gather.size_bytes)], tp > 1)
    work = [
        flops.elementwise("final norm", 2 * s.act * s.tokens_sp * s.hidden),
        flops.gemm("output layer", s.micro, s.hidden, vocab, e, flops.outside_fp8(plan)),
    ]
    regather = when(_tp_moves(plan, s, "output layer", False, "output layer"), _sp(plan))
    logits += when([_full(s, "output layer input (all-gathered)")], _sp(plan))
    return logits, work, regather + when([gather], tp > 1)


def _pass(
    plan: Plan,
    stage: int,
    prefix: str,
    s: Shapes,
    count: int,
    resident: tuple[Alloc, ...],
    dense: int,
    moe: int,
    timed: Shapes | None = None,
) -> list[Phase]:
    """One forward pass of a stage over micro-batch shapes `s`, repeated `count` times;
    the attention's works over `timed` where they differ (decode's mean context)."""
    par = plan.parallel
    last = stage == par.pp - 1
    phases = []
    base = list(resident)
    if stage == 0:
        moves = tuple(embedding_moves(plan, s))
        phases.append(
            Phase(f"{prefix}.embedding", count, moves, (), tuple(flops.embedding_work(plan, s)))
        )
    attention = attention_tp_moves(plan, s, False)
    # a prefill's context-parallel attention holds what training's forward does around its
    # kernel (`step._cp_buffers`, `step._cp_reorder`: Transformer Engine's forward keeps
    # them whatever its is_training says); an audit, m491: 4.6 GiB of a 1M-token prefill
    # at cp 16 uncounted, its peak 2.3 GiB low
    held, reorder = [], []
    if prefix == "prefill":
        attention += _cp_moves(plan, s, False)
        held = _cp_buffers(plan, s)
        if copy := _cp_reorder(plan, s):
            qkv = _attention_held(s)[:1]
            before = (*base, *_layer_input(s), *qkv, *held, *copy)
            reorder = [Instant("K/V reordered for the core", before)]
    elif plan.parallel.cp > 1:
        attention.append(_decode_combine(plan, s))
    phases.append(
        Phase(
            f"{prefix}.attention",
            (dense + moe) * count,
            tuple(attention),
            (
                *reorder,
                Instant("attention", tuple(base + _working_set(plan, s, "attention") + held)),
                _reduction(plan, s, "attention", base),
            ),
            tuple(flops.attention_forward(plan, timed or s)),
        )
    )
    if dense:
        phases.append(
            Phase(
                f"{prefix}.mlp",
                dense * count,
                tuple(_tp_moves(plan, s, "MLP", False, "MLP fc1", "MLP fc2")),
                (
                    Instant("MLP", tuple(base + _working_set(plan, s, "mlp"))),
                    _reduction(plan, s, "mlp", base),
                ),
                tuple(flops.mlp_forward(plan, s)),
            )
        )
    if moe:
        phases.append(
            Phase(
                f"{prefix}.moe",
                moe * count,
                # shared experts: their own sequence-parallel gather and scatter; with the
                # tokens replicated over tp the block's one all-reduce sums them with the rest
                tuple(
                    _ep_moves(plan, s, False)
                    + when(_shared_expert_moves(plan, s, False), plan.parallel.sequence_parallel)
                ),
                (
                    Instant("experts", tuple(base + _working_set(plan, s, "moe"))),
                    # the experts' output on its way back to its tokens, as in training, where
                    # the rows are exchanged (with the tokens replicated over tp the buffers
                    # hold them permuted back already: `dispatch_buffers`)
                    *(
                        Instant(label, tuple(base + _moe_held(plan, s) + combined))
                        for label, combined in _combined(plan, s, [])
                        if not every(tokens_replicated(plan))
                    ),
                ),
                tuple(flops.moe_forward(plan, s)),
            )
        )
    if last:
        logits, work, gather = _output(plan, s)
        phases.append(
            Phase(
                f"{prefix}.output",
                count,
                tuple(gather),
                (Instant("logits", tuple(base + logits)),),
                tuple(work),
            )
        )
    elif par.pp > 1:
        # each on its own pair of stages' link: the stages run one after another
        sends = at_boundary(pipeline_moves(plan, s, forward=True), stage)
        phases.append(
            Phase(f"{prefix}.pipeline", count, tuple(_pipeline_overlap(plan, m) for m in sends))
        )
    return phases


def decode_passes(plan: Plan) -> int:
    """Decode passes for `generate` tokens (`passes_for`)."""
    return passes_for(plan.batch.generate)


def passes_for(generate: int) -> int:
    """Decode passes for G generated tokens: the prefill's last position yields the first
    token, so G - 1 passes yield the rest (vLLM's and TensorRT-LLM's time per output token
    counts them so: the first token is the time to first token)."""
    return generate - 1


def decode_keys(plan: Plan) -> tuple[int, int]:
    """Keys one decode pass's query meets on one rank, averaged over the passes (pass k
    feeds generated token k and attends to prompt + k keys; kipply, "Transformer Inference
    Arithmetic", and vLLM's paged attention read each sequence's current length): for G - 1
    passes the mean context P + G/2, split over cp (the rank holding the larger share), and
    for a layer with a window W the mean of min(context, W) over the passes. Both rounded
    up to whole keys."""
    b, w, cp = plan.batch, plan.model.window, plan.parallel.cp
    passes = max(1, decode_passes(plan))
    first, last = b.prompt + 1, b.prompt + passes
    full = -(-(first + last) // (2 * cp))
    if not w or cp > 1:  # cp beside a window the context outgrows is refused (`resolve`)
        return full, 0
    below = max(0, min(last, w) - first + 1)  # passes whose whole context fits the window
    fitting = below * (first + first + below - 1) / 2
    return full, math.ceil((fitting + (passes - below) * w) / passes)


def derive_inference(plan: Plan) -> Step:
    """Prefill (both modes) and, for `mode: decode`, `generate` decode passes."""
    b = plan.batch
    flags, slides = moe_layers(plan), plan.model.sliding
    prefill = shapes(plan, b.prompt, b.prompt)
    # decode: each cp rank attends the slice of the context its cache holds (`_decode_combine`);
    # held in memory at the last pass, priced at the passes' mean context (`decode_keys`)
    decode = shapes(plan, 1, -(-(b.prompt + b.generate) // plan.parallel.cp))
    full, window = decode_keys(plan)
    timed = replace(shapes(plan, 1, full), window_kv=window)
    stages = []
    classes = stage_classes(plan, merge=False)  # once: per stage, it was quadratic in pp
    for stage, ids in enumerate(stage_layer_ids(plan)):
        params = class_params(plan, classes[stage])
        moe = sum(flags[i] for i in ids)
        sliding = sum(slides[i] for i in ids)
        heads = "replicate" if plan.model.mla is not None else "shard(kv heads)"
        where = [f"{heads} on tp"] if plan.parallel.tp > 1 else []
        if plan.model.mla is None and plan.model.kv_heads < plan.parallel.tp:
            where[0] += f", each head on {plan.parallel.tp // plan.model.kv_heads} ranks"
        where += ["shard(sequence) on cp"] if plan.parallel.cp > 1 else []
        cache, filled = (
            Alloc(
                # in its format, which a plan may narrow (`precision.kv_cache`), said (a
                # user audit, m439: an fp8 cache was told from a bf16 one by its size alone)
                f"KV cache ({plan.precision.cache})",
                "kv_cache",
                kv_cache_bytes(plan, len(ids), sliding, prefill=filling),
                placement=", ".join(where) or "local",
            )
            for filling in (False, True)
        )
        states = stage_states(plan, params)
        first = _stage_shapes(plan, prefill, sliding, len(ids))
        each = _stage_shapes(plan, decode, sliding, len(ids))
        calls = [first, each] if plan.mode == "decode" else [first]
        held = tuple(_scores_buffer(plan, calls))
        # the prefill's cache, a sliding layer's whole prompt, above the decode's
        resident = (*states, filled, *held)
        phases = _pass(plan, stage, "prefill", first, 1, resident, len(ids) - moe, moe)
        if plan.mode == "decode":
            mean = _stage_shapes(plan, timed, sliding, len(ids))
            passes = decode_passes(plan)
            decoding = (*states, cache, *held)
            phases += _pass(
                plan, stage, "decode", each, passes, decoding, len(ids) - moe, moe, mean
            )
        stages.append(
            StageStep(
                stage,
                len(ids),
                1.0,
                params.per_rank + params.expert_per_rank,
                resident,
                tuple(phases),
            )
        )
    return Step(1, tuple(stages), params_total(plan), layer_params(plan).total)
