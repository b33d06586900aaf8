"""FLOPs and bytes touched by each op of a transformer step, per rank.

A `Work` is one kernel (or a fused group) with the floating-point operations it performs and
the device-memory bytes it reads and writes; `schedule.work_time` turns it into seconds by the
roofline. Counts follow the usual accounting:

- A GEMM of (M x K) by (K x N) is 2·M·K·N FLOPs and touches M·K + K·N + M·N elements
  (Narayanan et al., arXiv 2104.04473, section 5.1; Kaplan et al., arXiv 2001.08361,
  section 2.1). Its backward is two GEMMs of the same size (input and weight gradients).
- Attention scores and their product with V are 2·2·s_q·s_kv·head_dim FLOPs per head;
  a causal mask lets FlashAttention skip half the tiles (Dao, arXiv 2307.08691, section
  3.1), eager attention computes them all and masks. FlashAttention's backward does five
  such matmuls against the forward's two, 2.5 times the forward (Dao et al., arXiv
  2205.14135, section 3.2 and appendix B.4) where the query/key and value head dimensions
  are equal, (3·d_qk + 2·d_v) / (d_qk + d_v) where they differ (`fused_backward`).
- Norms, activation functions, dropout and residual additions are memory-bound: what counts
  is the bytes they read and write. Rotary position embeddings rotate Q and K after the QKV
  projection (Su et al., arXiv 2104.09864, section 3.4.2), one kernel that reads and writes
  both (Megatron-LM's ``apply_rope_fusion``, Transformer Engine's fused RoPE).
- Model FLOPs for utilisation (MFU) are 6·N per token plus 12·L·h·s for attention
  (Chowdhery et al., PaLM, arXiv 2204.02311, appendix B), whatever is recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from budget.plan.model import DTYPE_BYTES, FUSED_BACKWARD, MLP_NAMES, AttentionPass
from budget.vector import every, holds, lacks, ratio, vfloat, vmax, vmin, vround, vwhere

if TYPE_CHECKING:
    from budget.layers import Shapes
    from budget.plan.model import Model, Plan, Precision

Kind = Literal["matmul", "attention", "elementwise"]


@dataclass(frozen=True, slots=True)
class Work:
    name: str
    kind: Kind
    flops: int
    bytes: int  # read + written in device memory
    count: int = 1
    backward: float | None = None  # its backward over the forward; None: by kind (`backward_of`)
    keys: Any = None  # fused attention: keys each query meets in one call (`attention_keys`)
    # fused attention: the keys its unmasked calls loop over (`unmasked_keys`); None: keys
    unmasked_keys: Any = None
    # fused attention: the kernel's pass, each timed at its own measured rate (`backward_of`)
    attention_pass: AttentionPass = "forward"
    # fused attention: the keys its backward's calls loop over (`backward_keys`); None: its own
    backward_keys: Any = None
    causal: Any = 1.0  # fused attention: share of its FLOPs under the causal mask (`causal_share`)
    launches: Any = 1.0  # kernel launches it stands for (a share of one: `_sliding`)
    # the format a GEMM runs in where it is not precision.matmul: Megatron-LM's output layer
    # and MoE router are not Transformer Engine modules, so an FP8 recipe leaves them in the
    # activations' format (`outside_operands`)
    dtype: str | None = None
    # share of the device's streaming multiprocessors it runs on (below 1 where a collective
    # beside it holds the rest: `schedule.overlapped_gemms`); its FLOPs take 1/share longer
    sm_share: Any = 1.0
    # a GEMM's (m, k, n), and the inner dimension of each of the equal kernels it stands
    # for: (k,) forward, (n, m) for its backward's input- and weight-gradient GEMMs
    # (`backward_of`); `efficiency.inner_factor` prices them
    dims: tuple[Any, Any, Any] | None = None
    inner: tuple[Any, ...] = ()
    # kernels its backward launches where not by kind (`backward_of`): eager PyTorch's
    # several for one op (`activation`)
    backward_launches: Any = None  # a count, or its share of one (`_part`)

    def scaled(self, factor: float, name: str | None = None, launches: Any = None) -> Work:
        """The same kernel with `factor` times the FLOPs and bytes (every other field kept,
        or `launches` where given)."""
        return replace(
            self,
            name=name or self.name,
            flops=vround(self.flops * factor),
            bytes=vround(self.bytes * factor),
            launches=self.launches if launches is None else launches,
        )


class Operands(NamedTuple):
    """Bytes per element of a weight GEMM's operands: the activations and the output in
    ``precision.matmul``, the weights in the format the model keeps its working copy in.
    Memory-bound GEMMs (decode) read the weights as they are kept: fp8 weights under a bf16
    GEMM are read as fp8 (weight-only quantization dequantizes in the kernel), bf16 weights
    under an fp8 GEMM as bf16 (Transformer Engine casts them, reading every byte)."""

    activations: int
    weights: int


def operands(plan: Plan) -> Operands:
    """`Operands` of the plan's weight GEMMs. The working weights are ``precision.params``,
    or in training the narrower ``precision.param_gather`` when the model computes on
    gathered copies in it: FSDP's bf16 copies of fp32 shards (PyTorch FSDP
    ``MixedPrecision.param_dtype``), Megatron-LM's ``--fp8-param-gather`` fp8 weights."""
    prec = plan.precision
    weights = DTYPE_BYTES[prec.params]
    if plan.mode == "train":
        weights = min(weights, DTYPE_BYTES[prec.param_gather])
    return Operands(DTYPE_BYTES[prec.matmul], weights)


VOCAB_WEIGHT_BYTES = 2  # the least the embedding and output layer are kept in: bf16


def outside_fp8(plan: Plan) -> str | None:
    """The format a GEMM outside Transformer Engine's modules (Megatron-LM's output layer,
    the MoE router) runs in: the activations' under an FP8 recipe, which applies to TE's
    modules only; else None, `precision.matmul` like every GEMM (`Work.dtype`)."""
    return plan.precision.activations if plan.precision.matmul == "fp8" else None


def outside_operands(plan: Plan) -> Operands:
    """`Operands` of a GEMM outside Transformer Engine's modules, the output layer and the
    MoE router: its input and output in the format it runs in (`outside_fp8`: the
    activations', bf16, under an FP8 recipe, whose fp8 casts are TE's modules' own; where
    there is no FP8 recipe, ``precision.matmul`` as `operands` says), and its weights at
    least 16-bit. ``--fp8-param-gather`` (``fp8_model_init``) makes TE modules' weights fp8
    and gathers the rest, the router's among them, in bf16 (Megatron-LM
    ``megatron/core/transformer/moe/router.py``, ``Router.__init__``: the gate's weight is a
    plain ``torch.nn.Parameter`` in ``params_dtype``, not a TE module's; Megatron-LM's
    output layer and embedding are not TE modules either); fp8 checkpoints keep the output
    layer in bf16 (llm-compressor's FP8 recipes ``ignore=["lm_head"]``; ModelOpt's
    ``hf_quant_config.json`` excludes ``lm_head``; DeepSeek-V3's fp8 release quantizes only
    the blocks' linear layers) and the router too (vLLM builds the
    gate unquantized, ``ReplicatedLinear(hidden, n_routed_experts, quant_config=None)`` in
    ``vllm/model_executor/models/deepseek_v2.py``, as Mixtral's gate in ``mixtral.py``).
    An audit: under fp8 the output layer and router read their bf16 input at fp8's 1 byte
    an element, and the router its weights at 1 byte under fp8 gathers."""
    e = operands(plan)
    runs_in = outside_fp8(plan)
    activations = DTYPE_BYTES[runs_in] if runs_in is not None else e.activations
    return Operands(activations, max(e.weights, VOCAB_WEIGHT_BYTES))


def _split(elem: int | Operands) -> tuple[int, int]:
    return (elem.activations, elem.weights) if isinstance(elem, Operands) else (elem, elem)


def gemm(name: str, m: int, k: int, n: int, elem: int | Operands, dtype: str | None = None) -> Work:
    """(m x k) @ (k x n): 2mkn FLOPs; reads both operands and writes the result once (the
    k x n weights in their own format when `elem` says, `Operands`); `dtype`: `Work.dtype`."""
    a, w = _split(elem)
    return Work(
        name,
        "matmul",
        2 * m * k * n,
        a * (m * k + m * n) + w * k * n,
        dtype=dtype,
        dims=(m, k, n),
        inner=(k,),
    )


def most_reached(groups: Any, reach: Any, ranks: Any) -> Any:
    """Expected number of its `groups` local experts reached on the busiest of `ranks`
    ranks, each expert reached with chance `reach` on its own: the expected maximum of
    `ranks` binomial(groups, reach) counts, Σ_{x < groups} 1 − F(x)^ranks with F their
    distribution function (the ranks' counts taken as independent; they are slightly
    anticorrelated, one token's picks being distinct experts). One rank: groups · reach.
    Mixtral at ep 8 (one expert a rank) decoding 4 tokens of top-2: each expert is reached
    with chance 1 − (6/8)^4 = 0.684, and some rank of the 8 with 1 − 0.316^8 = 0.9999.
    Computed with numpy for one plan as for a sweep (equal bits either way); only where a
    rank can miss an expert and there is more than one rank. The sum runs over x one step at
    a time, so memory stays one vector of the layouts whatever the experts per rank (a
    table of x by layouts took 10.7 GB at 65,536 experts), and the binomial terms past
    `groups`, which are not terms at all, are never exponentiated (their exponent grew
    without bound and overflowed from about 192 experts)."""
    g, q, r = np.broadcast_arrays(
        np.asarray(groups, dtype=np.float64),
        np.asarray(reach, dtype=np.float64),
        np.asarray(ranks, dtype=np.float64),
    )
    out = np.array(g * q)
    busy = (r > 1) & (q > 0) & (q < 1) & (g > 0)
    if busy.any():
        gg, qq, rr = g[busy], q[busy], r[busy]
        log_q, log_miss = np.log(qq), np.log1p(-qq)
        log_choose = np.zeros_like(gg)  # log C(g, x), a running sum of log((g - x + 1) / x)
        cdf = np.zeros_like(gg)
        total = np.zeros_like(gg)
        for x in range(int(gg.max())):  # the terms x < g; F(x) needs pmf(0 ... x)
            if x:
                log_choose += np.log(np.maximum(gg - x + 1, 1.0)) - math.log(x)
            term = x < gg
            exponent = np.where(term, log_choose + x * log_q + (gg - x) * log_miss, -np.inf)
            cdf += np.exp(exponent)
            total += np.where(term, 1 - np.minimum(cdf, 1.0) ** rr, 0.0)
            if (cdf >= 1.0).all():  # every later term is 1 - 1^r = 0: the sum is done
                break
        out[busy] = total
    return out if isinstance(groups, np.ndarray) or isinstance(reach, np.ndarray) else float(out)


def grouped_gemm(
    name: str,
    rows: int,
    k: int,
    n: int,
    groups: int,
    elem: int | Operands,
    pick: float,
    ranks: int = 1,
    skew: Any = 1.0,
    mean_rows: Any = None,
) -> Work:
    """One GEMM per local expert over the rows routed to it, run as one grouped GEMM
    (Megatron-Core's ``GroupedMLP``; vLLM's fused MoE): the FLOPs of `rows` x `k` by `k` x
    `n`, but each expert that receives a row reads its own `k` x `n` weights.

    `pick` is the chance that one token's routing picks a given expert (top_k / experts,
    uniform routing). The `rows` then come from rows / (groups · pick) tokens, each picking
    distinct experts, so an expert is missed by one token with probability 1 − pick and by
    all of them with (1 − pick)^tokens; the expected number of the `groups` local experts
    reached is groups · (1 − (1 − pick)^tokens): every expert once the tokens are several
    times experts / top_k, fewer when they are few (5.47 of Mixtral's 8 experts for 4
    tokens of top-2: 8 · (1 − (6/8)^4)). Capacity padding counts as rows. Training barely
    notices (its GEMMs are compute-bound); decoding a few tokens pays for those reads.

    Where `ranks` ranks hold `groups` experts each (expert parallelism), the layer waits for
    the rank that reaches the most (`most_reached`): the mean holds on none of them. The
    rows are the busiest rank's, `skew` times a balanced router's (`routing_skew`),
    so the tokens they come from are rows / (groups · pick · skew). One rank's GEMM reads no
    more experts than it has rows; the busiest of several can reach more experts than the
    mean rank has rows (it has more rows too: an audit found DeepSeek-V3 decoding 8
    sequences a replica at ep 8 read as 8 of a rank's 32 experts, where the busiest rank
    reaches 10.64 by `most_reached` and 10.65 by a 20,000-trial Monte Carlo; time per
    output token 21.7 ms, now 25.0 ms). `mean_rows`, where given, are the rows unrounded, the
    tokens worked out from: a rank's share of rows it finds among tokens it already holds is
    rounded up to whole rows for the GEMM, but one token's two picks over four ranks are half
    a row a rank, not one (an audit, m467: Mixtral decoding one sequence at tp 4 = ep 4 read
    1.56 experts a rank where the busiest reads 1.14, its time per token 23 % long)."""
    tokens = (rows if mean_rows is None else mean_rows) / (groups * pick * skew)
    reached = most_reached(groups, 1 - (1 - pick) ** tokens, ranks)
    touched = vwhere(holds(ranks > 1), reached, vmin(reached, rows))
    weights = vround(touched * k * n)
    a, w = _split(elem)
    # each expert's GEMM: its share of the rows (its weight gradient's inner dimension)
    dims = (rows / groups, k, n)
    flops, moved = 2 * rows * k * n, a * (rows * k + rows * n) + w * weights
    return Work(name, "matmul", flops, moved, dims=dims, inner=(k,))


def elementwise(name: str, nbytes: int) -> Work:
    """A memory-bound kernel, priced by the bytes it moves. Its FLOPs, one per two bytes
    (one per bf16 element moved), are a placeholder with no source: the roofline times such
    a kernel by its bytes (its FLOPs sit far under any device's ridge point), and MFU counts
    model FLOPs (`model_flops_per_token`), not these."""
    return Work(name, "elementwise", nbytes // 2, nbytes)


def norm_kernel(plan: Plan, name: str, nbytes: Any) -> Work:
    """A LayerNorm or RMSNorm moving `nbytes` in its forward, a read of its input and a
    write of its output. Its backward reads the saved input and the incoming gradient and
    writes the input gradient, 3 passes to the forward's 2 (Transformer Engine's
    ``layernorm_bwd`` and ``rmsnorm_bwd`` compute dx from dz, x and the saved statistics;
    the weight's gradient is a reduction over the tokens into partial sums of the hidden
    size). An audit: `backward_of`'s "about twice" priced 4.

    A PyTorch FSDP stack (`fsdp_mixed`) runs ATen's LayerNorm (``F.layer_norm``; llm-
    foundry's ``LPLayerNorm``), whose backward is two kernels (aten/src/ATen/native/cuda/
    layer_norm_kernel.cu, ``LayerNormBackwardKernelImplInternal``): the input gradient's,
    which reads dY and X and writes dX, then ``GammaBetaBackwardCUDAKernel``, which reads
    dY and X again for the weight's and bias's gradients: 5 passes to the forward's 2, in
    two launches (a review, m352, found 3 priced). Its RMSNorm is left at 3: which kernel
    an FSDP stack's RMSNorm runs (a composite of pointwise ops, a fused or compiled one) is
    not pinned here."""
    aten = (plan.model.norm == "layernorm") & fsdp_mixed(plan)
    if every(lacks(aten)):
        return replace(elementwise(name, nbytes), backward=1.5)
    return replace(
        elementwise(name, nbytes),
        backward=vwhere(aten, 2.5, 1.5),
        backward_launches=vwhere(aten, 2, 1),
    )


RESIDUAL_ADD = "residual add and dropout"
MLP_FC2 = "MLP fc2"


def residual_add(plan: Plan, s: Shapes) -> Work:
    """The residual add after a block over its [tokens, hidden] activation (the sequence-
    parallel shard where tp splits it), two reads and a write, with dropout's 1-byte mask
    where the model has dropout (Megatron-Core's bias-dropout-add). Its backward: the add
    passes its gradient on unchanged (PyTorch's derivatives.yaml, ``add.Tensor``: ``self:
    grad``, and ``other`` the gradient times alpha, 1), dropout scales it by the mask (a
    read of the gradient and the mask, a write), and autograd sums the block input's two
    gradients, its norm's and the residual's (two reads, a write): 3 passes, or 5 and the
    mask with dropout, against the forward's 3 and the mask. An audit: priced at twice the
    forward, 6 passes without dropout."""
    size = s.act * s.tokens_sp * s.hidden
    mask = size // s.act if plan.model.dropout else 0
    forward = 3 * size + mask
    backward = 3 * size + (2 * size + mask if plan.model.dropout else 0)
    return replace(elementwise(RESIDUAL_ADD, forward), backward=ratio(backward, forward))


def attention_core(plan: Plan, s: Shapes) -> list[Work]:
    """QKᵀ, softmax and the product with V for one micro-batch on one rank.

    FlashAttention fuses them into one kernel that reads Q, K, V once and writes O
    (Dao et al., arXiv 2205.14135, algorithm 1). Eager attention runs them as separate
    kernels: a batched GEMM writing the s x s scores, a fused softmax (with dropout, which
    also writes its mask and output) reading and writing them, and a batched GEMM reading
    them back (Megatron-LM's FusedScaleMaskSoftmax between two `torch.baddbmm`/`bmm`).

    QKᵀ runs over the query/key head dimension and the product with V over the value's;
    they differ only under latent attention (192 and 128 in DeepSeek-V3). Decoding with
    latent attention attends in the latent space instead (DeepSeek-V2, arXiv 2405.04434,
    section 2.1.3: the key and value up-projections are absorbed into the query and the
    output): every head's query meets the cached latent and rotary key (kv_rank + rope_dim)
    and the output is a kv_rank vector per head. The fused kernel reads the latent cache
    once for all heads (FlashMLA); eager attention reads it for the scores and its kv_rank
    part again for the product.

    A sliding window (``model.sliding_window``) changes the works of a stage whose layers
    slide (`_sliding`).
    """
    full = _core(plan, s) + ring_merges(plan, s)
    m = plan.model
    if not m.window or (m.attention == "eager" and s.causal):
        return full
    if every(s.seq_kv <= m.window) and not (s.window_kv and s.window_kv != s.seq_kv):
        return full
    return _sliding(plan, s, full)


ATTENTION_SOFTCAP = "attention soft-cap (divide, tanh, multiply)"
KV_REPEATED = "K and V repeated to the query heads"
FUSED_CORE = "attention core (flash)"  # the fused kernel's name; eager attention's last one:
EAGER_LAST = "attention × V"


def softcap(name: str, elements: Any, act: Any) -> Work:
    """cap·tanh(x / cap) over `elements` values of `act` bytes, as Gemma 2's eager code runs
    it (transformers' ``eager_attention_forward`` on the scores, Megatron-Bridge's
    ``logit_softcapping`` and transformers' ``Gemma2ForCausalLM`` on the logits): three
    kernels, a division, a tanh and a product, each reading and writing the values, one
    operation a value each (the bytes set its time); backward, the product's and the
    division's gradients read and write them and the tanh's reads its saved output too: 7
    passes against the forward's 6, in 3 launches each way."""
    return Work(
        name,
        "elementwise",
        3 * elements,
        6 * act * elements,
        launches=3,
        backward=7 / 6,
        backward_launches=3,
    )


def core_kernel(plan: Plan) -> str:
    """The attention kernel a context-parallel ring step overlaps (`step._cp_moves`): the
    fused core, or eager attention's last product (a window shorter than the sequence, which
    renames them, takes cp 1)."""
    return EAGER_LAST if plan.model.attention == "eager" else FUSED_CORE


def _core(plan: Plan, s: Shapes) -> list[Work]:
    """`attention_core` on a layer that attends to every key `s` holds."""
    m = plan.model
    q_rows = s.tokens // s.micro
    pairs = s.micro * s.heads * q_rows * s.seq_kv  # query-key pairs on this rank
    qk_dim, v_dim = m.qk_head_dim, m.head_dim
    q, out = s.act * s.tokens * s.q_cols, s.act * s.tokens * s.out_cols
    # bytes per column of K or V: decoding reads them from the cache, in its format
    cached = DTYPE_BYTES[plan.precision.cache] if not s.causal else s.act
    keys = cached * s.micro * s.seq_kv
    k, v = keys * s.k_cols, keys * s.v_cols
    if m.mla is not None and not s.causal:  # decoding against the latent cache
        qk_dim, v_dim = s.kv_latent, m.mla.kv_rank
        q, out = s.act * s.tokens * s.heads * qk_dim, s.act * s.tokens * s.heads * v_dim
        k, v = keys * s.kv_latent, keys * m.mla.kv_rank  # V is the latent K holds
    qk_mm, pv_mm = 2 * pairs * qk_dim, 2 * pairs * v_dim
    if m.attention != "eager":
        flops = qk_mm + pv_mm
        flops = flops // 2 if s.causal else flops  # causal: upper tiles skipped
        fused_kv = k if m.mla is not None and not s.causal else k + v
        core = Work(FUSED_CORE, "attention", flops, q + fused_kv + out)
        # a decode pass meets its rank's share of the cache in one call: `s.seq_kv` is
        # already that share (`inference.decode_keys`), split once over cp, not again
        if not s.causal:
            return [replace(core, keys=s.seq_kv, causal=0.0)]
        keys, unmasked = attention_keys(plan, s.seq_kv), unmasked_keys(plan, s.seq_kv)
        return [
            replace(
                core,
                keys=keys,
                unmasked_keys=unmasked,
                backward_keys=backward_keys(plan, s.seq_kv),
                causal=causal_share(plan),
                backward=fused_backward(qk_dim, v_dim),
            )
        ]
    scores = s.act * pairs
    # the softmax's FLOPs: the maximum, the shift, the exponent, the sum and the division,
    # 5 per score (a count of the operations; the kernel is timed by its bytes)
    softmax = 2 * scores + (2 * scores + scores // s.act if m.dropout else 0)
    # the two products carry no inner dimension (`Work.inner`): QKᵀ's is head_dim, 128 or
    # so, and they stay memory-bound on the s x s scores they write and read
    # Gemma 2's soft-cap, as transformers' eager_attention_forward runs it (`softcap`)
    capped = [softcap(ATTENTION_SOFTCAP, scores // s.act, s.act)]
    # under grouped-query attention the unfused core copies K and V up to the query heads
    # before its batched GEMMs (Megatron-Core's ``DotProductAttention``:
    # ``key.repeat_interleave(np // ng, dim=2)``, the same for the value; transformers'
    # ``repeat_kv``), which then read the copies; the copy's backward sums the repeated
    # gradients back, the same bytes (an audit: Llama 3 70B's eager decode, 8 query heads a
    # K head, read 17.9 ms a token where the copies add about 16.5)
    grouped = (s.q_cols > s.k_cols) & (m.mla is None)
    # the copies in the activations' format, whatever the cache's (a review: an fp8 cache's
    # copies had been timed at a byte an element, where the memory holds them at two)
    wide = s.act * s.micro * s.seq_kv
    wide_k, wide_v = vwhere(grouped, wide * s.q_cols, k), vwhere(grouped, wide * s.out_cols, v)
    repeat = replace(
        elementwise(KV_REPEATED, vwhere(grouped, k + v + wide_k + wide_v, 0)),
        launches=2,
        backward=1.0,
        backward_launches=2,
    )
    return [
        *([repeat] if not every(lacks(grouped)) else []),
        Work(
            "attention scores QKᵀ",
            "attention",
            qk_mm,
            q + wide_k + scores,
            backward=EAGER_BACKWARD,
        ),
        *(capped if m.attention_softcap else []),
        Work(
            "softmax" + (" and dropout" if m.dropout else ""),
            "elementwise",
            5 * scores // s.act,
            softmax,
            launches=2 if m.dropout else 1,
            # its backward moves the forward's bytes and one score-sized tensor more (an
            # audit, m456: the generic twice of a memory-bound kernel, 9S where 5.5S run).
            # Megatron-LM's fused softmax backward (``fused_softmax.py``,
            # ``ScaledUpperTriangMaskedSoftmax.backward``: the output gradient and the saved
            # softmax output) reads two score-sized tensors and writes one, 3S against the
            # forward's 2S (PyTorch's ``_softmax_backward_data`` alike); dropout, a kernel
            # of its own (``DotProductAttention.attention_dropout``), reads S and writes S
            # and a byte-per-score mask forward, and backward (``native_dropout_backward``)
            # reads the gradient and the mask and writes the gradient, the same bytes: 3/2
            # without dropout, (3 + 2.5)/(2 + 2.5) = 11/9 with it at 2-byte scores
            backward=(softmax + scores) / softmax,
            backward_launches=2 if m.dropout else 1,
        ),
        Work(EAGER_LAST, "attention", pv_mm, scores + wide_v + out, backward=EAGER_BACKWARD),
    ]


def fused_backward(qk_dim: int, v_dim: int) -> float | None:
    """The fused attention kernel's backward FLOPs over its forward's where the query/key
    and value head dimensions differ; None where they are equal (`backward_of` then takes
    `FUSED_BACKWARD`, 2.5). FlashAttention-2's backward (Dao, arXiv 2307.08691, section
    3.1.2, algorithm 2) recomputes S = QKᵀ and computes dV = PᵀdO, dP = dO·Vᵀ, dQ = dS·K and
    dK = dSᵀQ: three products over the query/key dimension (S, dQ, dK) and two over the
    value's (dV, dP), 2·(3·d_qk + 2·d_v) FLOPs per query-key pair against the forward's
    2·(d_qk + d_v) (S and P·V). Equal dimensions give 5/2; latent attention's 192 and 128
    (DeepSeek-V3) give (576 + 256) / 320 = 2.6. The measured backward rates stay at the
    benchmarks' 2.5 (`budget.catalog.devices`: equal head dimensions)."""
    if qk_dim == v_dim:
        return None
    return (3 * qk_dim + 2 * v_dim) / (qk_dim + v_dim)


def _sliding(plan: Plan, s: Shapes, full: list[Work]) -> list[Work]:
    """The attention works `full` split between the layers that attend to the whole context
    and those whose attention slides (``model.sliding_window``), in the share of the stage's
    layers that slide (`Shapes.sliding`): one layer's kernels are the average of the two
    kinds, and each part stands for its share of one kernel launch, so a layer still pays
    one startup per kernel.

    On a sliding layer a query meets only the last W keys, itself included. The fused
    kernel skips the tiles outside that band as it skips those above the diagonal
    (FlashAttention-2's ``window_size``; Dao, arXiv 2307.08691): over a causal sequence of
    S > W queries that is S·W − W²/2 query-key pairs, against S²/2 without the window (both
    counted as the area under min(x, W), as the causal half is), timed at the kernel's
    measured rate for W keys per call. Eager attention computes every score of the sequence
    and masks, so training and prefill cost the same (`attention_core` returns `full`).
    Decoding, a query meets the min(context, W) keys the layer's cache keeps, and only
    those are read, by either kernel. Context parallelism is refused beside a window
    shorter than the sequence (`resolve`), so the keys here are the whole sequence's."""
    w, share = plan.model.window, s.sliding
    seq = s.seq_kv
    if s.causal:  # the fused kernel over a band: pairs relative to the causal half, S²/2
        (core,) = full
        ratio = vwhere(seq > w, (2 * seq * w - w * w) / (seq * seq), 1.0)
        keys = vmin(seq, w)
        band = replace(
            core,
            flops=vround(core.flops * ratio),
            keys=keys,
            unmasked_keys=keys,
            backward_keys=None,
        )
        local = [band]
    else:  # decoding against the min(context, W) keys the cache keeps
        local = _core(plan, replace(s, seq_kv=s.window_kv or vmin(seq, w)))
    if isinstance(share, int | float) and share in (0, 1):  # one kind of layer on this stage
        return full if share == 0 else [_windowed(w) for w in local]
    return [_part(w, 1 - share) for w in full] + [_part(_windowed(w), share) for w in local]


def _part(work: Work, share: Any) -> Work:
    """`work` for the `share` of a stage's layers it runs on (`_sliding`): its FLOPs, bytes
    and kernel launches, forward and backward, in that share; a kernel of several launches
    (eager attention's soft-cap, the K/V copies) keeps them all (an audit: each part had
    counted one launch, Gemma 2's eager decode past its window 0.21 s short)."""
    back = work.backward_launches
    return replace(
        work.scaled(share),
        launches=work.launches * share,
        backward_launches=None if back is None else back * share,
    )


def ring_merges(plan: Plan, s: Shapes) -> list[Work]:
    """The memory passes ring context parallelism adds around its attention kernels (in
    training and prefill), on the rank that does the most of them: the next ring exchange
    waits for it.

    Transformer Engine's ``AttnFuncWithCPAndKVP2P`` (``transformer_engine/pytorch/
    attention/dot_product_attention/context_parallel.py``), rank r of cp holding sequence
    chunks r and 2·cp − 1 − r, on its local Q, output O (and output gradient, the same
    size) and K and V (KV), in bytes; a copy reads and writes a tensor (2 passes), an
    in-place add reads two and writes one (3):

    - forward (`_ring_forward_passes`): K and V concatenated into the first send buffer
      (2·KV); after the ring loop, each step's output merged into the result on the main
      stream (``flash_attn_fwd_out_correction``: the first step's scaled, 2·O; steps 1..r
      add a whole output, 3·O; later steps, on the second half of the queries, half of one):
      (0.5 + 1.5·cp + 1.5r)·O.
    - backward (`_ring_backward_most`): the received buffer refilled with K/V (2·KV);
      each step's dQ copied or added into dQ, half of it before the diagonal step
      (0.5 + 1.5·cp + 1.5r)·Q, and its dK/dV into the dK/dV that travels the ring (a copy
      on the first step, adds after, half-sized on the steps against the first half of the
      keys: ``combine_tensors`` is a view, no pass).

    The half inputs a step reads move nothing: Megatron-Core hands Transformer Engine its
    tensors as sbhd (``TEDotProductAttention``'s ``qkv_format``), which the ring views as
    [2, s/2, b, h, d], so ``q[1].contiguous()`` and ``k_part[0]`` are a contiguous half
    already (the bshd layout would copy them; an audit: a copy of each was priced under the
    cuDNN kernel, 0.1–0.5 % of a step at cp 2–8).

    The softmax statistics' corrections (fp32, one value per query and head) run on a side
    stream beside the next step and are left out. All-gather context parallelism merges no
    outputs; decoding attends to a sharded cache without a ring."""
    par = plan.parallel
    if not s.causal or par.cp_attention != "ring" or every(par.cp == 1):
        return []
    cp = par.cp
    q = s.act * s.tokens * s.q_cols
    out = s.act * s.tokens * s.out_cols
    kv = s.act * s.tokens * (s.k_cols + s.v_cols)
    # forward, linear in r: rank 0 or rank cp - 1 does the most
    forward = vmax(
        _ring_forward_passes(cp, 0, out, kv),
        _ring_forward_passes(cp, cp - 1, out, kv),
    )
    forward = vwhere(cp > 1, forward, 0.0)
    merge = elementwise("context-parallel ring merges", vround(forward))
    return [
        replace(
            merge,
            backward=ratio(_ring_backward_most(cp, q, kv), forward),
            launches=vfloat(cp),
        )
    ]


def _ring_forward_passes(cp: Any, r: Any, out: Any, kv: Any) -> Any:
    """Bytes rank r of a ring of cp moves in memory passes around a forward (`ring_merges`)."""
    return 2 * kv + (0.5 + 1.5 * cp + 1.5 * r) * out


def _ring_backward_most(cp: Any, q: Any, kv: Any) -> Any:
    """Bytes the busiest rank of a ring of cp moves in memory passes around a backward
    (`ring_merges`). Rank r's: 2·KV (the refill) + (0.5 + 1.5·cp + 1.5r)·Q (dQ) + d(r)·KV
    (dK/dV: 3·cp − 1.5 on rank 0, 1.5·cp + 1 on rank cp − 1, 3·cp − 1 − 1.5r between):
    linear in r between ranks 1 and cp − 2, so the most is on one of ranks 0, 1, cp − 2 and
    cp − 1."""
    first = (0.5 + 1.5 * cp) * q + (3 * cp - 1.5) * kv
    last = (3 * cp - 1) * q + (1.5 * cp + 1) * kv
    second = (2 + 1.5 * cp) * q + (3 * cp - 2.5) * kv
    before_last = (3 * cp - 2.5) * q + (1.5 * cp + 2) * kv
    inner = vwhere(cp >= 3, vmax(second, before_last), 0.0)  # ranks 1 and cp - 2, if between
    return 2 * kv + vmax(vmax(first, last), inner)


def _windowed(work: Work) -> Work:
    """`work` named as a sliding layer's: "attention core (flash, sliding window)"."""
    if work.name.endswith(")"):
        return replace(work, name=f"{work.name[:-1]}, sliding window)")
    return replace(work, name=f"{work.name} (sliding window)")


def attention_keys(plan: Plan, seq_kv: Any) -> Any:
    """Keys each query meets in one call of the fused attention kernel, the length its
    measured rate depends on: the whole sequence, or under ring context parallelism one
    step's block of it, seq / cp (each of the cp steps is its own kernel call on the keys the
    ring has just delivered; Liu et al., "Ring Attention", arXiv 2310.01889, section 3).
    All-gather context parallelism calls the kernel once on the gathered keys.

    These are the keys of the causal calls: the ring's diagonal step, on its rank's two
    chunks (seq/cp keys). Megatron-LM / Transformer Engine's load-balanced ring makes only
    that step causal; its other steps are unmasked and run on fewer keys or queries
    (`unmasked_keys`). Which share of the calls' work is masked is `causal_share`.
    All-gather CP calls the kernel per chunk, on up to seq keys; every forward call is read
    at seq keys here, a little fast for the earlier chunks, and its backward at the chunk's
    length (`backward_keys`)."""
    par = plan.parallel
    if par.cp_attention == "ring":
        return seq_kv // par.cp
    return seq_kv


def unmasked_keys(plan: Plan, seq_kv: Any) -> Any:
    """The length each unmasked call of the fused kernel runs at under ring context
    parallelism: seq / (2·cp), the one the slowest rank of each pass meets at every
    unmasked step, and the ring waits for it. Otherwise the keys of `attention_keys`.

    Transformer Engine's load-balanced ring (``context_parallel.py``) gives rank r chunks r
    and 2·cp − 1 − r of c = seq / (2·cp) tokens. At ring step i the keys come from rank
    r − i: for i ≤ r only their first chunk is unmasked, so all 2c local queries meet c keys;
    for i > r only the second local chunk attends, so c queries meet 2c keys. The forward
    kernel loops each block of queries over the keys, and the backward each block of keys
    over the queries (Dao, "FlashAttention-2", arXiv 2307.08691, section 3.2: it
    parallelises the backward over the key sequence), so a call's per-block work is c long
    in the forward for i ≤ r and in the backward for i > r. Rank cp − 1 has i ≤ r at every
    step, and rank 0 i > r: each pass has a rank whose every unmasked step is c long, and
    since the ring exchanges at every step and every layer, that rank sets the pace. The
    measured rates are read at the call's length for both passes, so both read c here."""
    if plan.parallel.cp_attention == "ring":
        return _chunk(plan, seq_kv)
    return seq_kv


def _chunk(plan: Plan, seq_kv: Any) -> Any:
    """c = seq / (2·cp), one of the 2·cp chunks of Megatron-LM's load-balanced split (the
    whole sequence at cp 1)."""
    cp = plan.parallel.cp
    return vwhere(cp == 1, seq_kv, seq_kv // (2 * cp))


def backward_keys(plan: Plan, seq_kv: Any) -> Any:
    """The length the backward's calls loop over where it is not its forward's: under
    all-gather context parallelism, c = seq / (2·cp), for the causal and the unmasked share
    alike; None otherwise.

    Transformer Engine's all-gather attention (``context_parallel.py``) calls the kernel for
    each of a rank's two chunks of c queries against the gathered keys up to that chunk's
    end. The forward loops each block of those c queries over up to seq keys; the backward
    loops each block of keys over the chunk's c queries (Dao, "FlashAttention-2", arXiv
    2307.08691, section 3.2), so each of its blocks does c's work, as in a call of length c.
    A ring's backward meets the forward's lengths (`unmasked_keys`)."""
    par = plan.parallel
    if par.cp_attention == "ring" or every(par.cp == 1):
        return None
    return _chunk(plan, seq_kv)


def causal_share(plan: Plan) -> Any:
    """The share of a causal sequence's fused-attention FLOPs that its kernel calls run under
    the causal mask, the rest in unmasked tiles (`AttentionRate.at` times each share at its
    own rate). 1 without context parallelism. Megatron-LM's load-balanced split gives each
    of the cp ranks two of 2·cp chunks of c tokens (Transformer Engine, context_parallel.py):
    the ring's cp steps do 2c² query-key pairs each, the diagonal step causal and the others
    unmasked, so 1/cp; all-gather calls each chunk j against the j + 1 chunks up to its end,
    c²/2 pairs under the mask of c²·(j + 1/2), so cp·c² of the 2cp·c²·cp in all: 1 / (2·cp).
    A decoding call (one new token against the cache) has no mask: `_core` gives it 0."""
    par = plan.parallel
    if every(par.cp == 1):
        return 1.0
    cp = vfloat(par.cp)
    return vwhere(par.cp == 1, 1.0, 1 / cp if par.cp_attention == "ring" else 1 / (2 * cp))


def rotary(plan: Plan, s: Shapes) -> list[Work]:
    """Rotary embeddings: one read and one write of this rank's Q and K (none for a learned
    position table, which is added once at the embedding). Latent attention rotates only
    each query head's rope_dim part and the one shared rotary key.

    In training Q and K are rotated by a kernel each, forward and backward: Megatron-Core's
    ``Attention.forward`` calls ``apply_rotary_pos_emb`` for the query and again for the
    key (one fused kernel each under ``apply_rope_fusion``), and the eager stacks rotate
    them apart too (torchtitan's ``apply_rotary_emb``, transformers' ``apply_rotary_pos_
    emb``, several kernels each, counted as one); a review (m351) found one launch priced.
    A serving engine rotates both in one kernel (vLLM's ``rotary_embedding`` op takes the
    query and the key; FasterTransformer applies it inside its QKV bias kernel)."""
    m = plan.model
    if m.position != "rope":
        return []
    if m.mla is not None:
        qk = 2 * s.act * s.tokens * (s.heads + 1) * m.mla.rope_dim
    else:
        qk = 2 * s.act * s.tokens * (s.q_cols + s.k_cols)
    # its backward rotates the incoming gradients back: the same bytes, nothing saved is read
    launches = 2 if plan.mode == "train" else 1
    return [
        replace(elementwise("rotary embedding of Q and K", qk), backward=1.0, launches=launches)
    ]


KV_CACHE_WRITE = "new keys and values written to the KV cache"


def kv_cache_write(plan: Plan, s: Shapes) -> list[Work]:
    """Serving: the pass's new keys and values stored in the KV cache, one kernel a layer
    (vLLM's ``reshape_and_cache_flash`` before its attention kernel, which reads K and V and
    writes them into the cache's blocks, quantizing into an fp8 cache; under latent
    attention ``concat_and_cache_mla``, the latent and the shared rotary key): a read in the
    activations' format and a write in the cache's (`inference.kv_cache_bytes`). An audit,
    m479, found it unpriced, 0.26 ms of a Llama 3 70B decode token at tp 8 and batch 32.
    TensorRT-LLM and FasterTransformer fold the write into their decode attention kernel;
    budget prices vLLM's kernels, as it does the rotary embedding (`rotary`). Training keeps
    no cache."""
    if plan.mode == "train":
        return []
    cols = s.kv_latent if plan.model.mla is not None else s.k_cols + s.v_cols
    nbytes = (s.act + DTYPE_BYTES[plan.precision.cache]) * s.tokens * cols
    return [replace(elementwise(KV_CACHE_WRITE, nbytes), backward=0.0)]


QUERY_COPY = "query copied out of the grouped QKV layout"
VALUE_COPY = "value made contiguous for Transformer Engine's attention"
QKV_JOINED = "Q, K and V gradients concatenated"


def _grouped(plan: Plan, s: Shapes) -> Any:
    """Whether a rank holds more than one key/value group and more than one query head a
    group (`query_copy`)."""
    return holds(s.k_cols > plan.model.qk_head_dim) & holds(s.q_cols > s.k_cols)


def query_copy(plan: Plan, s: Shapes) -> list[Work]:
    """Q copied out of the fused QKV GEMM's output in training under Megatron-Core. It views
    that output as [tokens, groups, (heads / groups + 2)·head_dim], one group's queries
    beside its key and value, and splits it into views (``SelfAttention.
    get_query_key_value_tensors``); ``query.reshape(..., heads, head_dim)`` then cannot be
    a view where a rank holds more than one group and a group more than one query head
    (the next group's queries lie a key and a value further on), so PyTorch copies Q: a
    read and a write. Its backward is a view of the incoming gradient. PyTorch FSDP's
    stacks (``parallel.fsdp``) and serving engines split by columns (views), and latent
    attention projects its queries apart; none copies."""
    if plan.mode != "train" or plan.model.mla is not None:
        return []
    copies = _grouped(plan, s) & lacks(fsdp_mixed(plan))
    if every(lacks(copies)):
        return []
    nbytes = vwhere(copies, 2 * s.act * s.tokens * s.q_cols, 0)
    return [replace(elementwise(QUERY_COPY, nbytes), backward=0.0)]


def value_copy(plan: Plan, s: Shapes) -> list[Work]:
    """V copied before Transformer Engine's fused attention in training under Megatron-Core,
    where rotary embeddings or Q/K norms wrote Q and K anew (TE's fused RoPE returns fresh
    tensors: ``fused_rope_forward`` allocates its output). V is still a view of the QKV
    GEMM's output, strided by a group's whole width (`query_copy`), beside two tensors of
    their own, a layout ``get_qkv_layout`` (``transformer_engine/pytorch/attention``) does
    not support, so ``DotProductAttention`` makes all three contiguous: Q and K already are,
    V is copied, a read and a write of the rank's [tokens, kv_heads · head_dim]. Its
    backward passes the gradient on. Where nothing rewrites K, Q and K and V stay views of
    one buffer in a layout TE takes (``sbh3d``, ``sbhd_sbh2d``), and no copy is made. Not
    under PyTorch FSDP's stacks (their own projections), eager attention (Megatron-Core's
    own batched GEMMs) or llm-foundry's Triton kernel. An audit (m358) read it on
    Nemotron-4 15B: a V of 8.4 MB read and written a layer pass, 1.15 ms a step."""
    m = plan.model
    fused = m.attention in ("flash", "flash2", "flash3", "cudnn")
    if plan.mode != "train" or m.mla is not None or not fused:
        return []
    if m.position != "rope" and m.qk_norm == "none":
        return []
    copies = lacks(fsdp_mixed(plan))
    if every(lacks(copies)):
        return []
    nbytes = vwhere(copies, 2 * s.act * s.tokens * s.v_cols, 0)
    return [replace(elementwise(VALUE_COPY, nbytes), backward=0.0)]


def qkv_gradients_joined(plan: Plan, s: Shapes) -> list[Work]:
    """The backward's concatenation of the Q, K and V gradients into the fused QKV GEMM's
    one output gradient (a read and a write of all three), where they reach the split as
    three tensors. Transformer Engine's ``SplitAlongDim`` (Megatron-Core's split) returns
    a view where the three are adjacent views of one buffer, as a fused kernel writes them
    for the packed layout of plain multi-head attention, and ``torch.cat`` otherwise;
    PyTorch's own split backward always concatenates. They come apart under Megatron-Core
    wherever something runs between the split and the kernel whose backward writes dQ and
    dK anew (rotary embeddings, Q/K norms, `query_copy`), or the kernel is eager (its
    batched GEMMs write dQ, dK and dV apart); and in llm-foundry's attention
    (``model.attention: triton``), whose ``Wqkv`` output is split and whose Triton kernel
    writes them apart. torchtitan's and Hugging Face's models project Q, K and V by three
    GEMMs and join nothing; latent attention is not split so."""
    if plan.mode != "train" or plan.model.mla is not None:
        return []
    m = plan.model
    fsdp = fsdp_mixed(plan)
    apart = m.position == "rope" or m.qk_norm != "none" or m.attention == "eager"
    joined = (lacks(fsdp) & (apart | _grouped(plan, s))) | (holds(fsdp) & (m.attention == "triton"))
    if every(lacks(joined)):
        return []
    nbytes = vwhere(joined, 2 * s.act * s.tokens * (s.q_cols + s.k_cols + s.v_cols), 0)
    return [elementwise(QKV_JOINED, nbytes)]


def qk_norms(plan: Plan, s: Shapes) -> list[Work]:
    """Q/K norms (``model.qk_norm``): one pass that reads and writes this rank's Q and K
    (Qwen3 and OLMo 2 norm them after the projection and before RoPE; Megatron-Core's
    ``qk_layernorm``); its backward reads the saved input and the incoming gradient and
    writes the input gradient, three passes to the forward's two, like the block's other
    norms (`norm_kernel`)."""
    if plan.model.qk_norm == "none":
        return []
    return [norm_kernel(plan, "Q/K norms", 2 * s.act * s.tokens * (s.q_cols + s.k_cols))]


UP_PROJECTIONS = "attention up-projections"  # latent attention's GEMMs after the gather


def qkv_projections(plan: Plan, s: Shapes) -> list[Work]:
    """The GEMMs from the normed hidden state to Q, K and V.

    Latent attention (DeepSeek-V2, arXiv 2405.04434, eqs. 9-19): one GEMM to the query
    latent and the key/value latent with the shared rotary key (the two down-projections
    read the same input and run fused, as SGLang's ``fused_qkv_a_proj_with_mqa``), an
    RMSNorm on each latent, and the up-projections to this rank's heads: queries (q_rank x
    heads·(nope + rope), or straight from the hidden state without a query latent) and keys
    and values (kv_rank x heads·(nope + head_dim)). The down-projection is replicated over
    tp (Megatron-Core's ``MLASelfAttention`` with duplicated down-projections): every rank
    projects the tokens it holds, its sequence shard under sequence parallelism, and the
    latents are then gathered (`step._attention_inward`). The GEMMs that read what was
    gathered share the name `UP_PROJECTIONS`, so that together they are the window the
    gather and, in backward, the gradient reduction overlap."""
    e = operands(plan)
    h, mla = s.hidden, plan.model.mla
    if mla is None:
        return [gemm("QKV projection", s.tokens, h, s.q_cols + s.k_cols + s.v_cols, e)]
    norms = norm_kernel(plan, "latent norms", 2 * s.act * s.tokens_sp * (s.q_latent + mla.kv_rank))
    if not mla.q_rank:  # queries straight from the (gathered) hidden state
        works = [
            gemm("latent down-projection", s.tokens_sp, h, s.kv_latent, e),
            norms,
            gemm(UP_PROJECTIONS, s.tokens, h, s.q_cols, e),
        ]
    else:
        works = [gemm("latent down-projection", s.tokens_sp, h, s.q_latent + s.kv_latent, e)]
        works += [norms, gemm(UP_PROJECTIONS, s.tokens, mla.q_rank, s.q_cols, e)]
    kv_cols = s.heads * (mla.nope_dim + plan.model.head_dim)
    up = gemm(UP_PROJECTIONS, s.tokens, mla.kv_rank, kv_cols, e)
    if not s.causal:
        # decoding absorbs the key and value up-projections (DeepSeek-V2, arXiv 2405.04434,
        # section 2.1.3; Megatron-Core's ``up_k_weight`` and ``up_v_weight``): q_nope [T, H,
        # nope] × W_UK [H, nope, kv_rank] before the core and its latent output [T, H,
        # kv_rank] × W_UV [H, kv_rank, head_dim] after it, two batched GEMMs of the same FLOPs
        # and weights moving T·H·(nope + 2·kv_rank + head_dim) activations (an audit: priced
        # as the latent's up-projection, 2,686,976 B where 4,718,592 B move on DeepSeek-V3 at
        # tp 8)
        a, w = _split(e)
        moved = s.tokens * s.heads * (mla.nope_dim + 2 * mla.kv_rank + plan.model.head_dim)
        up = replace(up, bytes=a * moved + w * mla.kv_rank * kv_cols, launches=2)
    works.append(up)
    return works


def attention_forward(plan: Plan, s: Shapes) -> list[Work]:
    """The attention block's forward kernels for one micro-batch on one rank. Its GEMMs are
    `qkv_projections` and the output projection; the memory-bound kernels move, over the
    [tokens, hidden] activation (its sequence-parallel shard where tp splits it): the norm a
    read and a write (2 passes), the residual add two reads and a write (3), and dropout
    its 1-byte mask where the model has dropout, the tensors of Korthikanti et al. (arXiv
    2205.05198, section 4.1) counted as traffic rather than as saved memory."""
    e = operands(plan)
    h = s.hidden
    norm = s.act * s.tokens_sp * s.hidden
    return [
        norm_kernel(plan, "attention norm", 2 * norm),
        *qkv_projections(plan, s),
        *query_copy(plan, s),
        *qk_norms(plan, s),
        *rotary(plan, s),
        *kv_cache_write(plan, s),
        *value_copy(plan, s),
        *attention_core(plan, s),
        *fp8_input_casts(plan, s, "attention"),
        gemm("attention output projection", s.tokens, s.out_cols, h, e),
        *post_norm(plan, s, "attention"),
        residual_add(plan, s),
    ]


def post_norm(plan: Plan, s: Shapes, block: str) -> list[Work]:
    """``model.sandwich_norm``: the norm after a block reads and writes its output, one
    more pass of the block's norm size (Gemma 2's ``post_attention_layernorm`` and
    ``post_feedforward_layernorm``)."""
    if not plan.model.sandwich_norm:
        return []
    return [norm_kernel(plan, f"{block} post-norm", 2 * s.act * s.tokens_sp * s.hidden)]


def mlp_forward(plan: Plan, s: Shapes) -> list[Work]:
    """The MLP block's forward kernels for one micro-batch on one rank: the norm, residual
    add and dropout as `attention_forward` counts them, the two GEMMs (fc1 ``gate`` times as
    wide under a gated unit), and the activation function (`activation`)."""
    e = operands(plan)
    gate = plan.model.gate
    norm = s.act * s.tokens_sp * s.hidden
    return [
        norm_kernel(plan, "MLP norm", 2 * norm),
        gemm("MLP fc1", s.tokens, s.hidden, gate * s.ffn_cols, e),
        *activation(plan, s.act * s.tokens * s.ffn_cols),
        *fp8_input_casts(plan, s, "mlp"),
        gemm(MLP_FC2, s.tokens, s.ffn_cols, s.hidden, e),
        *post_norm(plan, s, "MLP"),
        residual_add(plan, s),
    ]


def te_fp8(plan: Plan) -> bool:
    """Training with FP8 GEMMs, which a plan means as Transformer Engine's recipes under
    Megatron-Core run them (`fp8_input_casts`; `layers.fp8_weight_copies`,
    `layers.saved_gemm_input`)."""
    return plan.mode == "train" and plan.precision.matmul == "fp8"


def _fp8_cast(name: str, nbytes: Any, kernels: Any = 1.0) -> Work:
    """A cast kernel (or `kernels` of them) moving `nbytes`, with no backward of its own."""
    return replace(elementwise(name, nbytes), backward=0.0, launches=kernels)


def fp8_input_casts(plan: Plan, s: Shapes, block: str) -> list[Work]:
    """Transformer Engine's forward casts of the GEMM inputs no norm quantizes, under FP8
    training: the output projection's, fc2's, an MoE block's dispatched rows and its
    experts' fc2 input, the shared experts' fc2 input. ``Linear`` quantizes its input for
    the data GEMM and, for the weight gradient, its transpose where the device's FP8 GEMMs
    take K-major operands only (``input_quantizer.set_usage(rowwise=True,
    columnwise=backward_needs_input)``, one fused cast-transpose kernel: TransformerEngine
    2.5 ``linear.py``): the 16-bit input read, 1 B written and 1 B more on Hopper.
    ``LayerNormLinear``'s input (QKV's, fc1's) is quantized inside its norm
    (``with_quantized_norm``), priced as the norm."""
    if not te_fp8(plan):
        return []
    written = 1 + int(plan.device.fp8_transpose)
    inputs = {
        "attention": [("output projection", s.tokens * s.out_cols)],
        "mlp": [("fc2", s.tokens * s.ffn_cols)],
        "moe": [
            ("expert fc1", s.routed * s.hidden),
            ("expert fc2", s.routed * s.expert_cols),
            ("shared expert fc2", s.tokens * s.shared_cols),
        ],
    }[block]
    casts = [
        _fp8_cast(f"FP8 cast of the {gemm} input", n * (s.act + written))
        for gemm, n in inputs
        if not every(n == 0)
    ]
    if block == "moe" and not every(s.shared_cols == 0):
        # the shared experts' fc1 is a Linear after the block's own norm (Megatron-Core's
        # MoE spec), so its input is cast too: on the shard before the FP8 gather under
        # sequence parallelism (rowwise only, transposed when gathered again), else with
        # its transpose (a review found it left out)
        sp = s.tokens_sp < s.tokens
        n = (s.act + 1) * s.tokens_sp * s.hidden + vwhere(sp, 0, written - 1) * s.tokens * s.hidden
        casts.append(_fp8_cast("FP8 cast of the shared expert fc1 input", n))
    return casts


def fp8_gradient_casts(plan: Plan, s: Shapes, block: str) -> list[Work]:
    """Transformer Engine's backward casts under FP8 training: every GEMM's output
    gradient quantized for the data gradient and transposed for the weight gradient
    (``grad_output_preprocess`` with ``set_usage(rowwise=True, columnwise=True)``: the
    16-bit gradient read, 1 B written and its transpose 1 B more where the FP8 GEMMs take
    K-major operands only, one kernel). Under sequence parallelism a row-parallel layer's
    gradient is quantized on the rank's shard before the gather (1 B written) and
    transposed after it (1 B read, 1 B written), and a column-parallel layer's input,
    gathered again in FP8, is transposed before its weight gradient
    (``update_usage(columnwise_usage=True)``, ``layernorm_linear.py``). The experts'
    grouped GEMMs are not gathered (their rows are dispatched)."""
    if not te_fp8(plan):
        return []
    t = int(plan.device.fp8_transpose)
    sp = s.tokens_sp < s.tokens  # sequence parallelism over tp > 1
    whole = 1 + t  # bytes written a quantized element, the transpose too where needed

    def column(name: str, cols: Any, rows: Any = s.tokens) -> Work:
        return _fp8_cast(f"FP8 cast of the {name} output gradient", rows * cols * (s.act + whole))

    def row(name: str) -> list[Work]:
        # cast on the shard; its transpose after the gather (a kernel of its own, 1 B read
        # and written), or without sequence parallelism written by the cast itself (one
        # kernel: a review found it counted as two launches)
        cast = (s.act + 1) * s.tokens_sp * s.hidden + vwhere(sp, 2 * t, t) * s.tokens * s.hidden
        kernels = 1 + vwhere(sp, t, 0)
        return [_fp8_cast(f"FP8 cast of the {name} output gradient", cast, kernels)]

    def regather(name: str) -> list[Work]:
        n = vwhere(sp, s.tokens * s.hidden, 0) * t
        return [_fp8_cast(f"FP8 transpose of the {name} input, gathered again", 2 * n)]

    gate = plan.model.gate
    if block == "attention":
        qkv = s.q_cols + s.k_cols + s.v_cols
        works = [column("QKV", qkv), *row("output projection"), *regather("QKV")]
    elif block == "mlp":
        works = [column("fc1", gate * s.ffn_cols), *row("fc2"), *regather("fc1")]
    else:  # the experts' grouped GEMMs, and the shared experts as an MLP where there are some
        works = [
            column("expert fc1", gate * s.expert_cols, s.routed),
            column("expert fc2", s.hidden, s.routed),
        ]
        if not every(s.shared_cols == 0):
            works += [column("shared expert fc1", gate * s.shared_cols), *row("shared expert fc2")]
            works += regather("shared expert fc1")
    return [w for w in works if not every(w.bytes == 0)]


def fp8_weight_casts(plan: Plan, weights: Any) -> list[Work]:
    """Transformer Engine's casts of the GEMM weights under FP8 training, once a step, at
    its first micro-batch into the workspace it keeps (`layers.fp8_weight_copies`): each
    16-bit weight read, 1 B written and its transpose 1 B more where the FP8 GEMMs take
    K-major operands only; over FP8 parameters the transpose alone (1 B read, 1 B written);
    under ZeRO-3 not priced (the copies are not counted there)."""
    if not te_fp8(plan):
        return []
    t = int(plan.device.fp8_transpose)
    param = DTYPE_BYTES[plan.precision.params]
    read, written = (param, 1 + t) if param > 1 else (t, t)
    kept = weights * (plan.parallel.zero < 3)
    if not read + written or every(kept == 0):
        return []
    return [_fp8_cast("FP8 casts of the GEMM weights", kept * (read + written))]


def fp8_gathered_weight_casts(plan: Plan, block: str, weights: Any) -> list[Work]:
    """Under ZeRO-3 and FP8 training, Transformer Engine's cast of a block's `weights` as
    each forward gathers them (an FSDP unit's weights are gathered for every forward and
    freed after it, so no weight workspace is kept across micro-batches:
    ``is_first_microbatch`` is not passed and each ``Linear`` quantizes its weight in its
    forward, TransformerEngine 2.5 ``linear.py``, saving the quantized weight for its
    backward's data gradient, which memory does not count: `layers.fp8_weight_copies`),
    its recompute too: the gathered weight read in its gather format, 1 B written and its
    transpose 1 B more where the FP8 GEMMs take K-major operands only; over an FP8 gather
    the transpose alone. Below ZeRO-3 the casts run once a step
    (`fp8_weight_casts`). An audit (m508): Llama 3 8B under FSDP with fp8 GEMMs cast
    nothing, some 9.5 ms a step unpriced on an H100."""
    if not te_fp8(plan):
        return []
    t = int(plan.device.fp8_transpose)
    gathered = DTYPE_BYTES[plan.precision.param_gather]
    read, written = (gathered, 1 + t) if gathered > 1 else (t, t)
    cast = weights * (plan.parallel.zero >= 3)
    if not read + written or every(cast == 0):
        return []
    return [_fp8_cast(f"FP8 casts of the gathered {block} weights", cast * (read + written))]


def activation(plan: Plan, width: Any, prefix: str = "") -> list[Work]:
    """The MLP's activation function over fc1's outputs, `width` bytes being one tensor of
    its columns. Fused, one kernel reads fc1's ``gate`` outputs and writes one (GELU a read
    and a write, SwiGLU two reads and a write: Shazeer, arXiv 2002.05202, section 2), and
    its backward reads the incoming gradient and the saved input and writes the input's
    gradient, 1 + 2·gate widths: 3 for GELU (PyTorch's ``gelu_backward``, Megatron-Core's
    ``bias_gelu_back(g, bias, y)``), 5 for SwiGLU (``swiglu_back(g, y)``), where
    `backward_of`'s "about twice" had priced 4 and 6 (an audit).

    Squared ReLU (So et al., "Primer", arXiv 2109.08668, section 3) runs as eager PyTorch's
    ``torch.pow(relu(x), 2)`` where Nemotron-4 is trained and served: NeMo's
    ``squared_relu``, which its ``activation_to_func`` returns for ``activation:
    squared-relu`` and Megatron-Core's MLP calls when ``bias_activation_fusion`` is off, as
    NVIDIA's Nemotron-4 recipes set it (dgxc-benchmarking ``nemotron4-15b-synth.yaml``,
    8f5cbb37), and Hugging Face's ``ReLUSquaredActivation`` (``relu2``). That is two kernels
    each way: relu, a read and a write, whose backward (``threshold_backward(grad,
    result, 0)``) reads two and writes one; and the square, a read and a write, whose
    backward is ``pow_backward``'s ``grad * (2 * x.pow(1))`` (torch/csrc/autograd/
    FunctionsManual.cpp), three kernels: ``x.pow(1)`` a copy (``pow_Tensor_Scalar_out``
    copies for an exponent of 1), its product with 2, and the product with the gradient,
    two reads and a write. So 4 widths in 2 launches forward and 10 in 4 backward, where a
    fused kernel moves 2 in one and about 4 in one."""
    if plan.model.mlp != "squared_relu":
        name = MLP_NAMES[plan.model.mlp] if not prefix else f"{prefix}activation"
        gate = plan.model.gate
        return [
            replace(elementwise(name, width * (gate + 1)), backward=(2 * gate + 1) / (gate + 1))
        ]
    return [
        replace(elementwise(f"{prefix}ReLU", 2 * width), backward=1.5),
        replace(elementwise(f"{prefix}square", 2 * width), backward=3.5, backward_launches=3),
    ]


def routing_skew(plan: Plan, s: Shapes | None = None) -> Any:
    """The rows the busiest expert-parallel rank receives over a balanced router's, as the
    plan budgets them: ``experts.imbalance`` f, at most what a rank can take, min(ep, E/k)
    (each token sends it at most min(k, E/ep) rows, k/ep of them on average), and under a
    capacity factor c at most what the capacity lets through, the rows as
    `layers._expert_shapes` sizes them: dispatched / sent = min(⌈T·k·f⌉, E·C) / min(T·k,
    E·C), with T the rank's tokens and C = ⌈T·k·c/E⌉ each expert's capacity
    (`layers.expert_capacity`, Megatron-Core's per-expert ``get_capacity``), since no expert
    takes more than C rows from a rank. Where T·k·c/E is whole that is min(f, c) / min(c, 1);
    rounded up per expert it is more (an audit: Mixtral decoding 4 sequences at ep 8 inside
    tp 8, c 1.25, f 2 has C = ⌈1.25⌉ = 2, E·C = 16, rows sized at 16 dispatched over 8
    sent, a skew of 2, where min(f, c) read 1.25). `s`: the pass whose rows are meant
    (`Shapes.dispatched` and ``sent``); by default the pass the plan's figures are quoted
    for (`_quoted_shapes`: training's micro-batch, a prefill, or a decode pass). Padded to
    capacity every rank computes the same rows, so 1, as without experts or expert
    parallelism.

    Balanced routing is what an auxiliary load-balancing loss (Fedus et al., arXiv
    2101.03961, eq. 4) or DeepSeek-V3's bias adjustment (arXiv 2412.19437, section 2.1.2)
    aims at; a dropless router before it is balanced, or a skewed batch, sends more to some
    ranks, and that rank's tensors, expert GEMMs and all-to-alls set the step's peak and
    pace (a skew rather than a per-rank distribution: the plan names the worst rank it
    budgets for)."""
    e = plan.model.experts
    if e is None or e.pad_to_capacity:
        return 1.0
    if e.capacity_factor is None:
        return uncapped_skew(plan)
    sized = _quoted_shapes(plan) if s is None else s
    # the rows as sized (`layers._expert_shapes`); never below the even share
    return vmax(ratio(sized.dispatched, sized.sent), 1.0)


def uncapped_skew(plan: Plan) -> Any:
    """`routing_skew` before any capacity factor: ``experts.imbalance`` f, at most what one
    rank can take, min(f, ep, E/k); 1 without experts. `layers._expert_shapes` caps the
    rows it sizes at E·C itself. The bound is counting, not a published figure: top-k
    routing sends a token to k distinct experts (Shazeer et al., arXiv 1701.06538, eqs. 3-5;
    Fedus et al., arXiv 2101.03961, section 2.1), so a rank holding E/ep of them receives at
    most min(k, E/ep) of its k rows, min(ep, E/k) times the even k/ep; f above it cannot
    happen."""
    e = plan.model.experts
    if e is None:
        return 1.0
    return vmin(e.imbalance, vmin(plan.parallel.ep * 1.0, e.count / e.top_k))


def _quoted_shapes(plan: Plan) -> Shapes:
    """The shapes of the pass a plan's figures are quoted for: a training micro-batch, a
    prefill of ``batch.prompt`` tokens (``mode: prefill``), or a decode pass of one token a
    sequence (``mode: decode``; `inference.derive_inference` builds the same passes)."""
    from budget.layers import shapes

    b = plan.batch
    if plan.mode == "decode":
        return shapes(plan, 1, b.prompt + b.generate)
    if plan.mode == "prefill":
        return shapes(plan, b.prompt, b.prompt)
    return shapes(plan)


MOE_SORT = "sort by local expert"
MOE_UNSORT = "unsort by local expert"


def moe_forward(plan: Plan, s: Shapes) -> list[Work]:
    """Router GEMM, token permutation, the local experts' GEMMs on the rows the busiest rank
    receives (as many as it dispatches under balanced routing, `routing_skew` times
    more under skew), unpermute and weighted combine, and the shared experts as a dense MLP
    (Fedus et al., arXiv 2101.03961; DeepSeekMoE).

    The memory passes around the exchange follow Megatron-Core's
    ``MoEAlltoAllTokenDispatcher`` (``megatron/core/transformer/moe/token_dispatcher.py``):

    - ``dispatch_preprocess`` permutes the rank's own tokens into the all-to-all's send
      order before the exchange ("permutation 1", ``permute``), and ``combine_postprocess``
      unpermutes the rows that come back after it ("unpermutation 1", ``unpermute``): both
      on the rows the rank sends, `Shapes.sent` (tokens_sp·k, capped or padded to E·C), not
      on the rows its experts receive, which skew and the etp all-gather make more. Priced
      a read and a write (permute) and three passes (unpermute and combine) of those rows.
      Each one's backward is the other's kernel on the gradient (Transformer Engine's
      ``permutation.py``: ``_moe_permute_mask_map.backward`` unpermutes, and
      ``_moe_unpermute_mask_map.backward`` permutes, reading the saved rows too where it
      merged the routing probabilities, for their gradient:
      ``unpermute_with_mask_map_bwd_with_merging_probs``; PyTorch's ``index_select`` and
      ``scatter_add_`` likewise): the permute's backward the three passes, the weighted
      unpermute's three, where `backward_of`'s "about twice" had priced ten (an audit,
      m515, and its review, m520: some 120 ms of DeepSeek-MoE 16B's 6.43 s step).
    - where a rank holds more than one expert (``num_local_experts > 1``)
      ``dispatch_postprocess`` sorts the received rows, after the etp all-gather, by local
      expert ("permutation 2", ``sort_chunks_by_idxs``, or a transpose made contiguous when
      padded to capacity), and ``combine_preprocess`` unsorts the experts' output before
      the etp reduce-scatter ("unpermutation 2"): a read and a write each of the rows the
      experts compute, `Shapes.routed`. Each one's backward is the other's kernel on the
      gradient, the same bytes (``backward`` 1).

    Where every tp rank holds the same tokens (serving without sequence parallelism) there
    is no exchange: the rank permutes the rows its own experts take, `Shapes.routed`,
    straight into their order and back (`step.dispatch_buffers`), and sorts nothing more."""
    from budget.layers import experts_inside_tp, tokens_replicated

    e = operands(plan)
    gate = plan.model.gate
    norm = s.act * s.tokens_sp * s.hidden
    replicated = tokens_replicated(plan)
    # the rows the rank permutes before the dispatch and unpermutes after the combine
    own = s.act * vwhere(replicated, s.routed, s.sent) * s.hidden
    ex = plan.model.experts
    pick = ex.top_k / ex.count if ex is not None else 1.0
    ep = plan.parallel.ep  # ranks holding distinct experts, the busiest of which is waited for
    skew = routing_skew(plan, s)
    # the rank's rows unrounded where it finds its experts' among tokens it holds (`grouped_gemm`)
    mean = vwhere(experts_inside_tp(plan), s.dispatched / vmax(ep, 1), s.routed)
    fc2 = grouped_gemm(
        "expert fc2", s.routed, s.expert_cols, s.hidden, s.local_experts, e, pick, ep, skew, mean
    )
    # the sort and unsort by local expert: a read and a write of the received rows each,
    # zero bytes (no time) in a sweep's layouts with one expert a rank
    sorts = holds(holds(s.local_experts > 1) & lacks(replicated))
    received = vwhere(sorts, 2 * s.act * s.routed * s.hidden, 0)
    sort: list[Work] = []
    unsort: list[Work] = []
    if not every(lacks(sorts)):
        sort = [replace(elementwise(MOE_SORT, received), backward=1.0)]
        unsort = [replace(elementwise(MOE_UNSORT, received), backward=1.0)]
    works = [
        norm_kernel(plan, "MoE norm", 2 * norm),
        gemm("router", s.tokens_sp, s.hidden, s.experts, outside_operands(plan), outside_fp8(plan)),
        replace(elementwise("token permutation", 2 * own), backward=1.5),
        *sort,
        grouped_gemm(
            "expert fc1",
            s.routed,
            s.hidden,
            gate * s.expert_cols,
            s.local_experts,
            e,
            pick,
            ep,
            skew,
            mean,
        ),
        *activation(plan, s.act * s.routed * s.expert_cols, "expert "),
        fc2,
        *unsort,
        replace(elementwise("unpermute and combine", 3 * own), backward=1.0),
    ]
    if every(s.shared_cols > 0):
        works += [
            gemm("shared expert fc1", s.tokens, s.hidden, gate * s.shared_cols, e),
            # the shared experts are a dense MLP, their activation too (Megatron-Core's
            # SharedExpertMLP is its MLP; it had been left out: a review)
            *activation(plan, s.act * s.tokens * s.shared_cols, "shared expert "),
            gemm("shared expert fc2", s.tokens, s.shared_cols, s.hidden, e),
        ]
    works += post_norm(plan, s, "MoE")
    works.append(residual_add(plan, s))
    return works + fp8_input_casts(plan, s, "moe")


def bias_gradients(plan: Plan, s: Shapes, block: str) -> list[Work]:
    """One reduction over the tokens for each biased linear layer of `block` ("attention" or
    "mlp") in its backward: the bias gradient is the sum of the output gradient over every
    token, a pass that reads the whole output gradient and writes one row.

    The stacks of the validation runs run it on its own. PyTorch computes it as the gradient of a
    broadcast add, ``sum_to_size`` over the token dimensions (``nn.Linear``'s ``addmm``
    backward, and the autograd engine's reduction of a custom function's gradient to the
    shape of an input it broadcast); Megatron-LM's linear layers call
    ``grad_output.sum(dim=0)`` (``LinearWithGradAccumulationAndAsyncCommunication``), and
    the biases it adds outside the GEMM (``skip_bias_add``: the attention output
    projection's and fc2's in the fused bias-dropout-add, fc1's in the fused bias-GeLU) are
    reduced by autograd. Transformer Engine's bf16 linear layers fold a bias they own into
    the weight-gradient GEMM (cuBLASLt's BGRADB epilogue); that is Megatron-Core's QKV bias
    alone, priced here all the same (one pass over-counted).

    The output gradient: Q, K and V's columns on this rank; the output projection's and
    fc2's ``hidden`` on the tokens the rank holds after their reduction (its sequence shard
    under sequence parallelism, every token otherwise: each tp rank sums the same
    replicated gradient); fc1's ``gate``·ffn columns; latent attention's down-projection
    (``attention_bias``), the latents on the rank's tokens. Routed experts' biases
    (gpt-oss) are not counted."""
    m = plan.model
    parts: list[tuple[str, Any, Any]] = []
    if block == "attention" and m.mla is None:
        if m.bias or m.qkv_bias:
            parts.append(("QKV bias gradient", s.tokens, s.q_cols + s.k_cols + s.v_cols))
    elif block == "attention" and m.bias:
        parts.append(
            ("latent down-projection bias gradient", s.tokens_sp, s.q_latent + s.kv_latent)
        )
    if block == "attention" and m.bias:
        parts.append(("attention output bias gradient", s.tokens_sp, s.hidden))
    if block == "mlp" and m.mlp_biased:
        parts.append(("MLP fc1 bias gradient", s.tokens, m.gate * s.ffn_cols))
        parts.append(("MLP fc2 bias gradient", s.tokens_sp, s.hidden))
    return [elementwise(name, s.act * (rows + 1) * cols) for name, rows, cols in parts]


EAGER_BACKWARD = 2.0  # eager attention's two products: two batched GEMMs each in backward


def backward_of(works: list[Work]) -> list[Work]:
    """Input and weight gradients: GEMMs twice the forward, as two kernels of the forward's
    size (each ramps and starts on its own: one kernel of twice the size reached the
    efficiency curve further up and paid one start-up, an audit) whose inner dimensions are
    the forward's n (input gradient) and m (weight gradient), flash attention 2.5 times
    in one kernel (it computes QKᵀ again: Dao et al., arXiv 2307.08691, section 3.1.2; its
    `Work.backward`, `fused_backward`, where the head dimensions differ) and
    timed at the kernel's measured backward rate (`AttentionRate.at`),
    eager attention's products twice as two kernels each (`EAGER_BACKWARD`), memory-bound
    kernels about twice (they read the saved input and the incoming gradient)."""
    factor = {"matmul": 2.0, "attention": FUSED_BACKWARD, "elementwise": 2.0}
    out = []
    for w in works:
        two = w.kind == "matmul" or (w.kind == "attention" and w.backward == EAGER_BACKWARD)
        each = factor[w.kind] if w.backward is None else w.backward
        launches = w.launches * 2 if two else w.backward_launches
        back = w.scaled(each, f"{w.name} backward", launches)
        if w.dims is not None:  # dX = dY·Wᵀ runs over n, dW = Xᵀ·dY over m
            m, _, n = w.dims
            back = replace(back, inner=(n, m))
        if w.kind == "attention":  # a fused kernel's backward runs at its backward's rate
            back = replace(back, attention_pass="backward", backward_keys=None)
            if w.backward_keys is not None:  # on the lengths its calls loop over
                keys = w.backward_keys
                back = replace(back, keys=keys, unmasked_keys=keys)
        out.append(back)
    return out


def grad_accumulation(plan: Plan, params: int) -> list[Work]:
    """Adding one micro-batch's weight gradients into the main gradients: a read and a
    write of the gradient buffer (``precision.grads``, fp32 under Megatron-LM's bf16
    training) for every parameter the rank holds, once per micro-batch.

    Megatron-LM keeps a ``main_grad`` buffer in the gradient dtype and accumulates each
    micro-batch into it (``megatron/core/tensor_parallel/layers.py``,
    ``LinearWithGradAccumulationAndAsyncCommunication``: ``wgrad_gemm_accum_fp32`` when
    gradient-accumulation fusion is on, ``main_grad.add_(grad_weight)`` otherwise). Fused,
    the read and write happen in the weight-gradient GEMM's epilogue, which a threadblock runs
    after its main loop (CUTLASS, "Efficient GEMM in CUDA", section "Epilogue"), so the
    traffic is priced as its own memory-bound pass, not hidden under the GEMM's FLOPs.
    """
    return [elementwise("main-grad accumulation", 2 * DTYPE_BYTES[plan.precision.grads] * params)]


FSDP_FLAT = "gradient flattening, cast and pre-divide (FSDP)"
FSDP2_COPY = "gradients cast into the reduce-scatter buffer (FSDP2)"
FSDP_SHARD = "sharded gradient divide, cast and accumulation (FSDP)"
FSDP_SUMMED = "gradients of shared parameters summed (FSDP)"
FSDP_CAST = "parameter shard cast before its gather (FSDP)"
FSDP2_COPY_OUT = "gathered parameters copied out (FSDP2)"
# the kernels that follow a phase's weight gradients (`schedule._backward_kernel`)
GRADIENT_PASSES = ("main-grad accumulation", FSDP_FLAT, FSDP2_COPY, FSDP_SHARD, FSDP_SUMMED)


def fsdp_mixed(plan: Plan) -> Any:
    """PyTorch FSDP's mixed precision: ZeRO-3 with the sharded parameters kept in another
    format than the one they are gathered and computed in (fp32 shards, bf16 compute) and
    no separate master copy (the shards are the optimizer's; Megatron-LM's and DeepSpeed's
    ZeRO keep bf16 parameters beside an fp32 master). An array over a sweep's
    configurations (``parallel.zero`` may differ between them), or False where the formats
    rule it out for all of them (so callers skip building FSDP's kernels)."""
    if not fsdp_formats(plan.precision):
        return False
    return plan.parallel.zero == 3


def fsdp_grads(plan: Plan) -> Any:
    """ZeRO-3 whose gradient shards the backward makes, as PyTorch FSDP's: its optimizer
    drops them (``zero_grad(set_to_none=True)``) and a unit's reduce-scatter makes the
    unit's (``foreach_reduce``), with mixed precision (`fsdp_mixed`) or without it
    (parameters kept in the format they are gathered in, pure fp32 or bf16). Not where a
    master copy is kept (Megatron-LM's and DeepSpeed's fp32 master beside 16-bit
    parameters), nor beside DeepSpeed's contiguous buffer (`Parallel.reduce_bucket`), whose
    ZeRO 3 holds its gradient partition for the run (an audit: FSDP without mixed precision
    held its fp32 gradient shard, 3.74 GiB for Llama 3 8B over 8 GPUs, through its forward
    and loss). An array over a sweep's configurations, as `fsdp_mixed`."""
    prec = plan.precision
    if prec.master is not None or (plan.parallel.reduce_bucket and not fsdp_formats(prec)):
        return False
    return plan.parallel.zero == 3


def deepspeed_buffered(plan: Plan) -> Any:
    """Whether DeepSpeed's contiguous gradient buffer (`Parallel.reduce_bucket`) takes a
    rank's gradients as they are made: at ZeRO 2 and 3 where the plan names its size, but
    not under PyTorch FSDP's mixed precision. A bool, or an array over a sweep's
    configurations."""
    if not plan.parallel.reduce_bucket:
        return False
    return holds(deepspeed_zero(plan.parallel.zero, plan.precision))


def deepspeed_zero(zero: Any, prec: Precision) -> Any:
    """The ZeRO stages at which DeepSpeed's contiguous gradient buffer applies where a plan
    names it (`Parallel.reduce_bucket`): 2, and 3 outside PyTorch FSDP's mixed precision
    (`fsdp_formats`). One rule for a plan's memory (`deepspeed_buffered`), its
    refusal beside a pipeline (`resolve`) and a sweep's (`search`). A bool, or an array over
    a sweep's stages."""
    return (zero == 2) | ((zero == 3) & (not fsdp_formats(prec)))


def fsdp_formats(prec: Precision) -> bool:
    """Whether ZeRO-3 runs as FSDP's mixed precision under these formats (`fsdp_mixed`):
    parameters gathered in another format than they are kept in, and no master copy."""
    return prec.params != prec.param_gather and prec.master is None


def fsdp_gather_copies(plan: Plan, shard: Any, gathered: Any) -> list[Work]:
    """What FSDP's mixed precision does around each all-gather of a unit's parameters,
    `shard` of them this rank's and `gathered` in all, by ``parallel.fsdp``:

    - FSDP1 casts the shard to the compute format (``FlatParamHandle.
      _use_low_precision_shard``: ``_mp_shard.copy_(_local_shard)``, torch 2.1.0
      ``flat_param.py``) and gathers straight into the flat parameter: a read in
      ``precision.params`` and a write in ``precision.param_gather`` of the shard.
    - FSDP2 casts the shard the same way and copies it into the all-gather buffer (two
      ``_foreach_copy_`` passes, ``foreach_all_gather``), then copies the gathered
      parameters out of that buffer into each parameter's own tensor
      (``split_with_sizes_copy``, ``foreach_all_gather_copy_out``): a read and a write of
      every gathered parameter in the compute format (torch 2.5.1, the same through
      2.7.1, ``fsdp/_fully_shard/_fsdp_collectives.py``)."""
    prec = plan.precision
    kept, compute = DTYPE_BYTES[prec.params], DTYPE_BYTES[prec.param_gather]
    if plan.parallel.fsdp == 1:
        return [elementwise(FSDP_CAST, (kept + compute) * shard)]
    copy_in = replace(elementwise(FSDP_CAST, (kept + 3 * compute) * shard), launches=2)
    return [copy_in, elementwise(FSDP2_COPY_OUT, 2 * compute * gathered)]


def fsdp_gradient_passes(plan: Plan, params: Any, ranks: Any, microbatches: Any) -> list[Work]:
    """What PyTorch FSDP does to a unit's gradients after its backward, every micro-batch,
    under mixed precision, for `params` parameters of the unit sharded over `ranks` ranks;
    it has no main-gradient buffer that the weight-gradient GEMMs accumulate into
    (`grad_accumulation`). FSDP1 (``parallel.fsdp: 1``, read at torch 2.1.0,
    ``torch/distributed/fsdp``):

    - The module's parameters are views of the unit's flat parameter (``torch.split`` then
      ``view``, ``flat_param.py``), so autograd's split backward concatenates their
      gradients into one new flat gradient in the compute format: a read and a write of
      ``param_gather`` bytes per parameter.
    - ``_post_backward_hook`` casts it to the reduce format (``flat_param.grad.to(
      handle._reduce_dtype)``) where that differs: a read in the compute format and a write
      in ``precision.reduce``.
    - ``_reduce_grad`` divides the whole gradient in place by the pre-divide factor before
      the reduce-scatter (``_div_if_needed``; the factor is above 1 on 2 ranks or more) and
      the shard by the post-divide factor after it (above 1 on more than 2 ranks).
    - The shard is cast to the parameters' format where the reduce format differs
      (``_cast_grad_to_param_dtype``) and added into the shard kept from the earlier
      micro-batches (``_saved_grad_shard += sharded_grad``): a read of both and a write,
      on all but the first of a step's `microbatches` (priced as that share of each).

    FSDP2 (``parallel.fsdp: 2``, read at torch 2.5.1, the same through 2.7.1,
    ``foreach_reduce``) has no flat parameter: one ``chunk_cat`` copies the parameters'
    gradients into the reduce-scatter buffer in the reduce format (a read in the compute
    format, a write in ``precision.reduce``), NCCL averages fp32 and bf16 gradients itself
    (``ReduceOp.AVG``: no divide kernels; fp16 keeps FSDP1's two divides), and the shard is
    cast and added as under FSDP1 (``sharded_param.grad._local_tensor += ...``).

    FSDP1's casts, divides and accumulation run on its post-backward stream, FSDP2's
    accumulation on its reduce-scatter stream (its ``chunk_cat`` on the compute stream),
    beside the next unit's backward; all are priced as the stage's own kernels, as they
    take the same memory bandwidth and SMs."""
    prec = plan.precision
    gather, reduce, kept = (DTYPE_BYTES[d] for d in (prec.param_gather, prec.reduce, prec.params))
    shard = -(-params // vmax(ranks, 1))
    sharded = ranks > 1
    upcast = prec.reduce != prec.param_gather
    downcast = prec.reduce != prec.params
    added = 1 - 1 / vmax(microbatches, 1)  # the first micro-batch's shard is only kept
    v1 = plan.parallel.fsdp == 1
    divides = v1 or prec.reduce not in ("fp32", "bf16")
    post = vwhere(ranks > 2, 1, 0) * divides  # the post-divide factor is 1 on 2 ranks
    pre = vwhere(sharded, 1, 0) * divides
    if v1:
        whole = (2 * gather + (gather + reduce) * upcast + 2 * reduce * pre) * params
        flat = replace(elementwise(FSDP_FLAT, vround(whole)), launches=1 + upcast + pre)
    else:
        whole = ((gather + reduce) + 2 * reduce * pre) * params
        flat = replace(elementwise(FSDP2_COPY, vround(whole)), launches=1 + pre)
    part = 2 * reduce * post + (reduce + kept) * downcast + 3 * kept * added
    kept_shard = elementwise(FSDP_SHARD, vround(part * shard))
    return [flat, replace(kept_shard, launches=post + downcast + added)]


def fsdp_summed(plan: Plan, params: Any) -> list[Work]:
    """Autograd's sum of two gradients of one parameter before FSDP flattens it (a tied
    embedding's two uses, a shared output layer's): a read of both and a write in the
    compute format (``precision.param_gather``)."""
    return [elementwise(FSDP_SUMMED, 3 * DTYPE_BYTES[plan.precision.param_gather] * params)]


def output_layer(plan: Plan, s: Shapes) -> Work:
    """The training step's output-layer GEMM over the rank's vocabulary shard, in the
    activations' format (Megatron-Core's own ``ColumnParallelLinear``, `outside_operands`):
    the forward `loss_work` runs, and the kernel each of its backward's two GEMMs is the size
    of (`backward_of`; the deferred weight gradients, `step._drain`)."""
    from budget.layers import vocab_rows

    vocab = vocab_rows(plan)
    return gemm(
        "output layer", s.tokens, s.hidden, vocab, outside_operands(plan), outside_fp8(plan)
    )


def loss_work(plan: Plan, s: Shapes) -> list[Work]:
    """The final norm, output layer (vocab-parallel GEMM), fp32 cross-entropy, and their
    backward; the final norm's backward, like the blocks' norms', reads its saved input and
    the incoming gradient and writes the input gradient, 3 passes of [tokens_sp, hidden] to
    its forward's 2 (`norm_kernel`; an audit found it left out); with
    ``model.logit_softcap``, Gemma 2's cap · tanh(logits / cap) between them, one fused pass
    that reads and writes the logits (Gemma Team, arXiv 2408.00118, section 2).

    The fp32 cross-entropy over the rank's vocabulary shard moves 16 bytes per logit in the
    forward, four fp32 passes: a read for the maximum, a read and a write for the shifted
    logits' exponent, a read for its sum (Megatron-Core's ``VocabParallelCrossEntropy``:
    ``calculate_logits_max``, ``calculate_predicted_logits``, fused by ``jit_fuser``), and
    twice that in the backward (`backward_of`). A count from that code, not a published
    figure; read kernel by kernel, with its upcast and the softmax's division, both passes
    come to about 52 bytes per logit against these 48.

    ``loss: pytorch`` (`step._entropy_passes`) is counted kernel by kernel, each fp32 pass
    4 bytes a logit and the upcast and the cast back a read and a write of the logits
    (6 bytes with bf16 logits, none with fp32). On one rank of tp: ``log_softmax`` reads
    its input three times (maximum, sum of exponentials, output) and writes once, 16 B,
    ``nll_loss`` reads a logit per token; its backward zeroes the gradient (4 B), scatters
    one per token, and ``_log_softmax_backward_data`` reads the gradient twice and the
    output once and writes once (16 B): 22 and 26 with the casts, 48 as Megatron's. Under
    DTensor's ``loss_parallel`` the decomposition runs separate kernels: ``amax`` (4),
    ``x - x_max`` (8), ``exp`` (8), ``sum`` (4), ``- logsumexp`` (8), 32 B and the upcast
    forward; ``zeros_like`` (4), ``exp`` (8), the add (12), the product (8), 32 B and the
    cast back: 76 B with bf16 logits. Kernel launches: 3 and 4 on one rank (cast,
    ``log_softmax``, ``nll_loss``; zeros, scatter, ``_log_softmax_backward_data``, cast);
    under ``loss_parallel`` 25 and 21, the passes over the logits above and the per-token
    ops of ``_nll_loss_forward`` and ``_nll_loss_and_log_softmax_backward`` (the ignore
    index's ``ne`` and ``where``, ``_MaskPartial``'s mask of the targets outside the shard,
    ``lt``, ``ge``, ``or``, ``clone``, subtract, masked write, the gather and its masked
    write, negation, the total weight's count and the mean's division; 18 forward, 16
    backward with the arange and index put), counted from that code; one fewer each without
    the casts.

    ``loss: pytorch-gathered`` runs the one-rank kernels over the whole vocabulary on every
    tp rank (`layers.loss_rows`), the soft-capping too (transformers' Gemma 2 caps the
    gathered logits). Where tp > 1 its forward's gather is followed by a copy: NCCL gathers
    along dimension 0, so DTensor's ``all_gather_tensor`` of the vocabulary, the last
    dimension, concatenates the gathered chunks along it (``torch.cat(torch.chunk(res,
    group_size, dim=0), dim=gather_dim)``; no view, the sequence before it is not of size 1),
    a read and a write of the gathered logits, one launch more (a review, m344); and its
    backward slices the rank's shard out of the gradient and copies it (DTensor's
    ``Replicate -> Shard``, ``Shard._replicate_to_shard``: the chunk of ``_split_tensor``,
    then ``.clone()``; the last dimension's chunk is not dense, so the clone is laid out
    contiguous), a read and a write of the shard, one launch more. The copy's
    moment holds the shard and the logits twice, 2/tp + 4 B a logit, below the forward's 10
    B (`step._entropy_passes`)."""
    from budget.layers import loss_rows, vocab_rows

    vocab, rows = vocab_rows(plan), loss_rows(plan)
    logits = output_layer(plan, s)
    # the final soft-cap, as the attention's three kernels (`softcap`; an audit, m391: one
    # fused pass and one launch each way, 40 ms a step of Gemma 2 9B short)
    capped = softcap("logit soft-capping", s.tokens * rows, s.act)
    norm = norm_kernel(plan, "final norm", 2 * s.act * s.tokens_sp * s.hidden)
    forward = [norm, logits, capped] if plan.model.logit_softcap else [norm, logits]
    per_logit, launches = _entropy_bytes(plan, s.act)
    gathered = (plan.loss == "pytorch-gathered") & (plan.parallel.tp > 1)
    shard = 2 * s.act * s.tokens * vocab  # a read and a write of the rank's logits
    copies = vwhere(gathered, shard * plan.parallel.tp, 0), vwhere(gathered, shard, 0)
    more = vwhere(gathered, 1, 0)
    entropy = [
        replace(
            elementwise(f"cross-entropy (fp32){name}", b * s.tokens * rows + copy),
            launches=n + more,
        )
        for name, b, n, copy in zip(("", " backward"), per_logit, launches, copies, strict=True)
    ]
    return [*forward, entropy[0], *backward_of(forward), entropy[1]]


def _entropy_bytes(plan: Plan, act: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The cross-entropy's bytes per logit and its kernel launches, forward and backward
    (`loss_work`)."""
    if plan.loss == "megatron":
        return (16, 32), (1, 1)
    cast = vwhere(act < 4, act + 4, 0)
    casts = vwhere(act < 4, 1, 0)
    many = (plan.parallel.tp > 1) & (plan.loss != "pytorch-gathered")
    forward = cast + vwhere(many, 32, 16), casts + vwhere(many, 24, 2)
    backward = cast + vwhere(many, 32, 20), casts + vwhere(many, 20, 3)
    return (forward[0], backward[0]), (forward[1], backward[1])


MTP_PROJECTION = "multi-token prediction projection"


def mtp_forward(plan: Plan, s: Shapes) -> list[Work]:
    """One multi-token prediction module's own forward kernels for one micro-batch
    (DeepSeek-V3, arXiv 2412.19437, section 2.2, eq. 21; Megatron-Core's
    ``MultiTokenPredictionLayer``): the next tokens' embedding lookup, the two norms of the
    hidden state and of that embedding, and the projection of their 2·hidden concatenation
    to hidden, column-parallel over tp. Its transformer layer is priced as a layer of the
    stage (`layers.stage_classes`), its output layer and cross-entropy as the main head's
    (`loss_work`)."""
    e = operands(plan)
    hidden = s.hidden
    norms = norm_kernel(plan, "multi-token prediction norms", 2 * 2 * s.act * s.tokens_sp * hidden)
    proj = gemm(MTP_PROJECTION, s.tokens, 2 * hidden, -(-hidden // plan.parallel.tp), e)
    return [*embedding_work(plan, s), norms, proj]


POSITION_ADD = "position embedding addition"


def embedding_work(plan: Plan, s: Shapes) -> list[Work]:
    """The embedding lookup: a gather that reads one row per token and writes it, two
    passes of [tokens, hidden] in the activations' format, and no FLOPs that MFU counts
    (PaLM, arXiv 2204.02311, appendix B, leaves the embeddings out of 6·N).

    With ``model.position: learned`` the position table's rows are added to it, GPT-2's
    ``wte(idx) + wpe(pos)`` (llm-foundry's ``MPTModel.forward``: ``x = tok_emb + pos_emb``;
    Megatron-Core's ``LanguageModelEmbedding.forward``: ``embeddings = word_embeddings +
    position_embeddings``): one pass that reads the token embeddings and the micro-batch's
    seq / cp position rows, broadcast over its sequences, and writes the sum. Megatron-LM
    adds before it scatters the sum to the sequence-parallel region (the word embedding is
    then all-reduced over tp, not reduce-scattered: `step.embedding_moves`), so every tp
    rank adds the whole [tokens, hidden]. Its backward hands the incoming gradient on to the
    token embeddings as it is (no kernel) and sums it over the sequences into the position
    rows' gradient (autograd's reduction of the broadcast): a read of [tokens, hidden] and
    a write of [seq / cp, hidden] (`Work.backward`, not `backward_of`'s two passes). The
    lookup of the position rows themselves, seq / cp of them, is left out (Megatron-LM's
    position ids, [b, s], look one up for every token).

    In training, what follows the lookup (`embedding_output`): the other vocabulary shards'
    rows zeroed, the copy to [s, b, h], the sequence-parallel clone and dropout."""
    lookup = elementwise("embedding lookup", 2 * s.act * s.tokens * s.hidden)
    after = embedding_output(plan, s)
    if plan.model.position != "learned":
        return [lookup, *after]
    rows = s.tokens // s.micro  # positions of one sequence on this rank
    forward = s.act * (2 * s.tokens + rows) * s.hidden
    backward = s.act * (s.tokens + rows) * s.hidden
    added = replace(elementwise(POSITION_ADD, forward), backward=backward / forward)
    return [lookup, added, *after]


EMBEDDING_MASKED = "embedding rows of other vocabulary shards zeroed"
EMBEDDING_CLONE = "embedding output cloned (sequence parallel)"
EMBEDDING_TRANSPOSE = "embedding output transposed to [s, b, h]"
EMBEDDING_DROPOUT = "embedding dropout"


def embedding_output(plan: Plan, s: Shapes) -> list[Work]:
    """The kernels between a training step's embedding lookup and the first layer, as
    Megatron-Core runs them (two audits, m358 and m360, read them on Nemotron-4 15B and
    GPT-3):

    - over tp > 1, ``VocabParallelEmbedding.forward`` zeroes the rows of the tokens another
      rank's vocabulary shard holds (``output_parallel[input_mask, :] = 0.0``), which ATen
      runs as ``masked_fill_`` (``_index_put_impl_``: a one-element value and a boolean
      mask, ``canDispatchToMaskedFill``), reading and writing the whole [tokens, hidden]
      beside the 1-byte mask; its backward is ``index_put``'s (derivatives.yaml:
      ``grad.index_put(indices, zeros_like(values))``), a copy of the incoming gradient and
      the same fill over it: 4 passes and the mask. DTensor's vocabulary-split embedding
      (torchtitan's ``RowwiseParallel`` on the table, under PyTorch FSDP's stacks) fills the
      same way (``MaskBuffer.apply_mask``), inside the redistribution, whose backward is the
      gradient's redistribution alone: the forward's fill, no backward one (a review, m364);
    - under sequence parallelism ``LanguageModelEmbedding.forward`` clones the scattered
      output (``clone_scatter_output_in_embedding``, on by default), a read and a write of
      [tokens / tp, hidden], whose backward passes the gradient on;
    - above one sequence a micro-batch, the lookup's [b, s, h] output made [s, b, h]
      (``transpose(0, 1).contiguous()``, in ``VocabParallelEmbedding`` before the
      reduce-scatter or in ``LanguageModelEmbedding`` after the all-reduce): a read and a
      write of [tokens, hidden]; its backward hands the lookup's backward a transposed
      gradient, which ``embedding_dense_backward_cuda`` copies (``grad_.contiguous()``), as
      much again. At one sequence the swapped dimension has size one, and ``contiguous``
      copies nothing. Not under PyTorch FSDP's stacks, which keep [b, s, h];
    - with dropout (``model.dropout``) the embedding's dropout over that output: a read, a
      write and the 1-byte mask, and as much in its backward. At p = 0 ``F.dropout`` returns
      its input, no kernel."""
    if plan.mode != "train":
        return []
    par = plan.parallel
    full, shard = s.act * s.tokens * s.hidden, s.act * s.tokens_sp * s.hidden
    megatron = lacks(fsdp_mixed(plan))
    works = []
    if not every(par.tp == 1):
        nbytes = vwhere(par.tp > 1, 2 * full + s.tokens, 0)
        masked = elementwise(EMBEDDING_MASKED, nbytes)
        # 0 where nothing was filled, or where DTensor's redistribution filled it
        back = vwhere(megatron, ratio(4 * full + s.tokens, nbytes), 0.0)
        works.append(replace(masked, backward=back, backward_launches=2.0))
    transposed = (s.micro > 1) & megatron
    if not every(lacks(transposed)):
        copy = elementwise(EMBEDDING_TRANSPOSE, vwhere(transposed, 2 * full, 0))
        works.append(replace(copy, backward=1.0))
    cloned = holds(par.sequence_parallel) & (par.tp > 1) & megatron
    if not every(lacks(cloned)):
        clone = elementwise(EMBEDDING_CLONE, vwhere(cloned, 2 * shard, 0))
        works.append(replace(clone, backward=0.0))
    if plan.model.dropout:
        dropout = elementwise(EMBEDDING_DROPOUT, 2 * shard + shard // s.act)
        works.append(replace(dropout, backward=1.0))
    return works


EMBEDDING_GRADIENT = "embedding gradient, dense: zeroed, then read"


def embedding_gradient(plan: Plan, params: Any, fsdp: Any) -> list[Work]:
    """The input tables' weight gradient as PyTorch's embedding backward makes it: a dense
    tensor of the whole table in the weights' format, zero-filled before the looked-up rows
    are accumulated into it (``embedding_dense_backward_cuda``: ``at::zeros({num_weights,
    ...})``), a write of every element (the accumulation's reads and writes of the rows
    are the lookup's backward, `embedding_work`). Megatron-Core's gradient hook then adds
    it into the main gradient (``param.main_grad.add_(param.grad.data)``: the embedding is
    not a Transformer Engine module, so nothing fuses the addition), reading it again, the
    main gradient's own read and write being `grad_accumulation`'s; under FSDP the
    flattening reads it (`fsdp_gradient_passes`), so only the fill is added. `params`: the
    tables' parameters on this rank; `fsdp` as `fsdp_mixed` gives it (an array over a
    sweep's layouts) (an audit)."""
    passes: Any = 2 if fsdp is False else vwhere(fsdp, 1, 2)
    # the tables stay 16-bit under an fp8 parameter gather (`outside_operands`)
    return [elementwise(EMBEDDING_GRADIENT, passes * outside_operands(plan).weights * params)]


def grads_upcast(prec: Precision) -> bool:
    """Whether the optimizer step reads the gradients cast to the master copy's wider format
    (`Precision.upcast_grads`): the cast's pass here (`optimizer_work`) and its copy held
    through the step (`step._upcast_grads`) follow this one rule."""
    master = DTYPE_BYTES[prec.master] if prec.master else 0
    return prec.upcast_grads and master > DTYPE_BYTES[prec.grads]


UNSCALED = "gradients unscaled (fp16 loss scaling)"
OVERFLOW = "gradients checked for overflow (DeepSpeed fp16)"


def optimizer_work(
    plan: Plan, params_shard: int, wide_shard: Any = 0, grads_held: Any = None
) -> list[Work]:
    """The optimizer step over the parameters this rank updates, as Megatron-LM's
    mixed-precision optimizer runs it (``megatron/core/optimizer/optimizer.py``, ``step``):

    - where the gradients are narrower than the master copy and the step reads them in its
      format (`Precision.upcast_grads`), their cast to it first
      (``_copy_model_grads_to_main_grads``: ``.float()``, reading the gradient and writing
      its copy), which the norm and the step then read (an audit: it was not priced, the
      flag moved memory but never time);
    - under fp16 (parameters or activations), whose training takes a loss scaler (Megatron-LM
      asserts one: "None grad scaler is only supported for bf16"), the main gradients
      unscaled and checked for infinities first (``_unscale_main_grads_and_check_for_nan``:
      ``torch._amp_foreach_non_finite_check_and_unscale_``, a read and a write of each;
      PyTorch FSDP's ``ShardedGradScaler.unscale_`` alike; an audit, m436, found fp16 plans
      priced as bf16's, 6.4 ms short a step on gpt-1.3b at ZeRO 0). DeepSpeed unscales in
      the scaling below, which runs in either format, and under fp16 first scans its
      partition of 16-bit gradients for overflow (a review, m444): ZeRO 2 with
      ``check_overflow`` (stage_1_and_2.py, ``has_overflow_partitioned_grads_serial``: for
      each gradient of the partition ``_has_inf_or_nan``, ``x.float()``, ``isnan``,
      ``isinf``, ``logical_or``, ``.float()``, ``.max()``, then its count added: g + 4,
      4 + 1, 4 + 1, 2 + 1, 1 + 4 and 4 B an element, g + 26 in all, seven kernels a tensor,
      priced as seven); ZeRO 3 with ``isinf(...).any()`` and ``isnan(...).any()`` on its
      flat partition buffer (stage3.py, its ``inf_or_nan_tracker``: g + 1 + 1 B twice, 2g +
      4 in all, four kernels; a review, m445);
    - the gradient norm for clipping (``clip_grad_norm_fp32``): reads every main gradient;
    - the Adam (or SGD) step, by `Precision.optimizer_kernel`: fused (apex ``FusedAdam``,
      multi-tensor apply) it reads the gradient and reads and writes the master copy and
      the moments once; foreach (PyTorch's ``_multi_tensor_adam`` and ``_multi_tensor_sgd``)
      it makes a pass per operation (`_STEP_PASSES`); for-loop (``_single_tensor_adam`` and
      ``_single_tensor_sgd``, torch.optim's ``foreach=False``, and loops of that form such
      as Composer's ``DecoupledAdamW``) the same passes a tensor at a time;
    - the master copy cast back to the model parameters
      (``_copy_main_params_to_model_params``): reads the master copy, writes the parameter;
    - the main gradients zeroed for the next step (``zero_grad``): writes every gradient.

    Megatron-LM scales the gradients by the clipping coefficient only where it is below 1
    (``clip_grads``: ``if clip_coeff < 1.0``), a step that clips, priced as one that does
    not. The other stacks scale them every step (audit m347):

    - PyTorch FSDP (`fsdp_grads`; torchtitan's ``clip_grad_norm_``, ``max_norm`` 1.0):
      ``clip_grads_with_norm_`` multiplies every gradient by the clamped coefficient,
      ``torch._foreach_mul_(grads, clip_coef_clamped)``, "to avoid a CPU <=> device
      synchronization" a branch would make: a read and a write of the gradient shard;
    - DeepSpeed's ZeRO 2 and 3 (`deepspeed_zero` where the plan names its bucket): the norm
      of the 16-bit gradients before their upcast (stage_1_and_2.py's ``step``: "Calculate
      gradient norm using bit-16 grads", ``scaled_global_norm``; stage3.py's
      ``_get_norm_groups``), and after the upcast ``unscale_and_clip_grads``,
      ``grad.data.mul_(1. / combined_scale)`` on the fp32 partition whatever the norm;
      before the cast the gradients are flattened into one 16-bit tensor, a read and a
      write, which the cast then reads (ZeRO 2's ``flatten_dense_tensors_aligned(...)
      .to(fp32)``; ZeRO 3's ``_prepare_fp32_grad_for_sub_group``,
      ``self.flatten(self.averaged_gradients[i]).to(...)``, a ``torch.cat`` of each
      parameter's view into its partition buffer: a review, m349, found it unpriced there).

    Without a master copy the step updates the parameters in place (read and write). Of
    the shard, `wide_shard` parameters are kept 16-bit under fp8 weights (the vocabulary,
    `StageParams.beside_gemms_per_rank` and `expert_beside_per_rank`: norms, biases,
    routers; `outside_operands`). The gradients zeroed are the buffer the rank holds,
    `grads_held` (every parameter's under ZeRO-0/1, Megatron-LM's ``zero_grad_buffer``;
    the shard's by default).

    The step's FLOPs per parameter count the update as written, with decoupled weight
    decay (apex's ``multi_tensor_adam``, ``ADAM_MODE_1``): AdamW 16 (Loshchilov and Hutter,
    arXiv 1711.05101, algorithm 2: the moments 3 and 4, their bias corrections 2, the
    denominator √v̂ + ε 2, the ratio plus decay 3, the step 2), SGD with momentum 6 (the
    momentum 2, decay 2, step 2). They do not set its time, which the bytes do."""
    prec = plan.precision
    if prec.optimizer == "none":
        return []
    grad, param = DTYPE_BYTES[prec.grads], DTYPE_BYTES[prec.params]
    params = param * params_shard + (max(param, VOCAB_WEIGHT_BYTES) - param) * wide_shard
    master = DTYPE_BYTES[prec.master] if prec.master else 0
    upcast = grads_upcast(prec)
    read = master if upcast else grad  # the gradient the norm and the step read
    deepspeed = deepspeed_buffered(plan)
    flattened = deepspeed & upcast
    flat = vwhere(flattened, 2 * grad, 0)
    scaled = vwhere(deepspeed, 2 * read, vwhere(fsdp_grads(plan), 2 * grad, 0))
    weights, grads, state = _STEP_PASSES[prec.optimizer, prec.optimizer_kernel]
    fp16 = "fp16" in (prec.params, prec.activations)  # trained under a loss scaler
    zero3 = plan.parallel.zero == 3  # DeepSpeed's overflow scan, ZeRO 3's or ZeRO 2's
    scan = vwhere(zero3, 2 * grad + 4, grad + 26)
    states = grads * read + state * DTYPE_BYTES[prec.optimizer_state]
    # what the step updates (the master copy, else the parameters), touched `weights` times
    kept = weights * (master * params_shard if master else params)
    cast = f"gradients upcast to {prec.master}"
    clipping = elementwise("gradients scaled by the clipping coefficient", scaled * params_shard)
    works = [
        *(
            [elementwise("gradients flattened (DeepSpeed)", flat * params_shard)]
            if np.any(holds(flattened))
            else []
        ),
        *([elementwise(cast, (grad + master) * params_shard)] if upcast else []),
        *([elementwise(UNSCALED, vwhere(deepspeed, 0, 2 * read) * params_shard)] if fp16 else []),
        *(
            [
                replace(
                    elementwise(OVERFLOW, vwhere(deepspeed, scan, 0) * params_shard),
                    launches=vwhere(zero3, 4.0, 7.0),
                )
            ]
            if fp16 and np.any(holds(deepspeed))
            else []
        ),
        elementwise("gradient norm", vwhere(deepspeed, grad, read) * params_shard),
        *([clipping] if np.any(holds(scaled > 0)) else []),
        Work(
            f"{prec.optimizer} step"
            + ("" if prec.optimizer_kernel == "fused" else f", {prec.optimizer_kernel}"),
            "elementwise",
            {"adam": 16, "sgd": 6}[prec.optimizer] * params_shard,
            states * params_shard + kept,
        ),
    ]
    if master:
        works.append(elementwise("master weights to parameters", master * params_shard + params))
    held = params_shard if grads_held is None else grads_held
    works.append(elementwise("zero main gradients", grad * held))
    return works


# Per element of the shard, how many times the optimizer step touches (reads or writes) what
# it updates (the master copy, else the parameters), the gradient, and the moments or a
# temporary in their format. Fused (apex ``multi_tensor_adam`` / ``multi_tensor_sgd``): each
# read and written once, the gradient read. Foreach: the operations of PyTorch 2.13's
# ``torch/optim/adam.py`` (``_multi_tensor_adam``, decoupled weight decay, not capturable)
# and ``sgd.py`` (``_multi_tensor_sgd``, momentum, weight decay on), each a full pass:
#   Adam: _foreach_mul_(params) 2w; _foreach_lerp_(exp_avgs, grads) 2s + g;
#         _foreach_mul_(exp_avg_sqs) 2s; _foreach_addcmul_(exp_avg_sqs, grads, grads) 2s + g;
#         _foreach_sqrt 2s; _foreach_div_ 2s; _foreach_add_(eps) 2s;
#         _foreach_addcdiv_(params, exp_avgs, sqrt) 2w + 2s   -> 4w + 2g + 14s
#   SGD:  _foreach_add(grads, params) 2g + w; _foreach_mul_(bufs) 2s;
#         _foreach_add_(bufs, grads) 2s + g; _foreach_add_(params, bufs) 2w + s -> 3w + 3g + 5s
# (the gradient read twice by addcmul counted once: both operands are the same elements).
# For-loop: the same operations on one tensor at a time, ``_single_tensor_adam`` (lerp_,
# mul_ and addcmul_, sqrt, the division and add_ of ε, addcdiv_, after the decay's mul_) and
# ``_single_tensor_sgd``, pass for pass the foreach ones. Composer's ``DecoupledAdamW.adamw``
# (composer/optim/decoupled_weight_decay.py) moves the same bytes where the weights and
# moments share a format: it skips the decay at weight_decay 0 (2w fewer) and updates the
# first moment by mul_ then add_ where lerp_ makes one pass (2s more).
_STEP_PASSES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("adam", "fused"): (2, 1, 4),
    ("adam", "foreach"): (4, 2, 14),
    ("adam", "for-loop"): (4, 2, 14),
    ("sgd", "fused"): (2, 1, 2),
    ("sgd", "foreach"): (3, 3, 5),
    ("sgd", "for-loop"): (3, 3, 5),
}


def model_flops_per_token(plan: Plan, causal: bool = False) -> Any:
    """6N + 12·L·h·s: training FLOPs per token without recomputation (PaLM appendix B),
    with N the parameters a token uses (the top-k experts of an MoE layer, not all of them;
    Fedus et al., arXiv 2101.03961) less the embedding lookups, which do no GEMM, and
    12·L·h·s the non-causal attention score and value products (6·L·heads·(d_qk + d_v)·s
    when the query/key and value head dimensions differ, as under latent attention).

    `causal`: the attention products as the causal mask computes them, query i meeting
    keys 1 ... i ((s + 1)/2 on average, a sliding layer at most its window), as a serving
    plan's prefill counts them and as FlashAttention's benchmark counts a causal call (half
    an unmasked one's FLOPs, benchmarks/benchmark_flash_attention.py). PaLM's count can
    exceed what the GPUs computed: at a long enough context its MFU passes 100 % (an audit:
    104 % at 4.7M tokens on GB200s)."""
    m, s = plan.model, plan.batch.seq
    n = _gemm_params(plan)
    keys = 1 if causal else s
    mtp = _mtp_flops_per_token(plan, causal)
    return 6 * n + vround(3 * attention_query_flops(m, keys, s)) + mtp


def _dropped_expert_params(plan: Plan) -> Any:
    """Expert parameters a token's dropped assignments would have used: with a capacity
    factor c < 1 a rank keeps min(T·k, E·C) of its T·k assignments (`_kept_share`), so a
    token's top-k experts compute k·share on average and the rest, k·(1 − share) experts'
    worth, is no model FLOP (an audit: c = 0.5 read as 67 % MFU where top-1, the same
    expert work, read 40 %). Padding up to a capacity above 1 is work that no token needs,
    counted by neither. An array over a sweep's layouts, whose T differ."""
    from budget.layers import layer_params, moe_layers

    e = plan.model.experts
    if e is None or e.capacity_factor is None or e.capacity_factor >= 1:
        return 0
    per_expert = layer_params(plan, moe=True).expert_total // e.count
    return vround(sum(moe_layers(plan)) * e.top_k * per_expert * (1 - _kept_share(plan)))


def _kept_share(plan: Plan) -> Any:
    """The share of a rank's token-expert assignments a capacity factor keeps, as
    `layers._expert_shapes` sizes the rows it computes: min(T·k, E·C) / (T·k), with T the
    rank's tokens as `layers.expert_capacity` takes them (a micro-batch's sequence shard,
    `Shapes.tokens_sp`, of the pass the figures are quoted for: `_quoted_shapes`) and
    C = ⌈T·k·c/E⌉ each expert's capacity (Megatron-Core's ``get_capacity``, rounded up per
    expert). Under balanced routing each expert is sent T·k/E rows and keeps min(T·k/E, C):
    c, less what the rounding keeps beyond it, where c·T·k/E is not whole (an audit: the
    drop read (1 − c)·k whatever the rounding; Mixtral decoding one sequence at tp 8, c 0.5,
    has C = ⌈1·2·0.5/8⌉ = 1 and E·C = 8 ≥ 2 rows: nothing dropped). 1 without a capacity
    factor or at c ≥ 1 (E·C ≥ T·k). The rows kept are the rows the rank sends as
    `layers._expert_shapes` sizes them (`Shapes.sent`), so the two cannot disagree."""
    e = plan.model.experts
    if e is None or e.capacity_factor is None or e.capacity_factor >= 1:
        return 1.0
    s = _quoted_shapes(plan)
    return vmin(ratio(s.sent, s.tokens_sp * e.top_k), 1.0)


def _kept_assignments(plan: Plan) -> Any:
    """Expert assignments a token computes on average: its top k, less what a capacity
    factor c < 1 drops (`_kept_share`): k·min(T·k, E·C)/(T·k)."""
    e = plan.model.experts
    if e is None:
        return 0.0
    return e.top_k * _kept_share(plan)


def _gemm_params(plan: Plan) -> Any:
    """The active parameters less the embedding lookups (the input embedding, learned
    positions), which do no GEMM, and less the experts a capacity drops
    (`_dropped_expert_params`), for training and serving alike: the output layer stays
    (tied, the one matrix)."""
    from budget.layers import active_params

    m = plan.model
    n = active_params(plan) - (m.vocab * m.hidden if not m.tied_embeddings else 0)
    n -= _dropped_expert_params(plan)
    if m.position == "learned":
        n -= (m.max_positions or plan.batch.seq) * m.hidden
    return n


def serving_params(plan: Plan) -> Any:
    """Parameters a served token multiplies in GEMMs outside the output layer: the active
    ones (top-k experts) less the embedding lookups and the output layer (the same matrix
    when tied), which serving computes for the positions it samples only."""
    return _gemm_params(plan) - plan.model.vocab * plan.model.hidden


def _mtp_flops_per_token(plan: Plan, causal: bool = False) -> int:
    """Training FLOPs per token of the multi-token prediction modules, counted as model
    FLOPs the way NeMo Automodel's ``flops_utils`` counts them (per module: its layer, its
    2·hidden → hidden projection and one more output layer pass, each 6 FLOPs per weight and
    token), with the layer's top-k experts (less what a capacity factor drops) and its
    attention products as in the main model: every query against the whole sequence, or
    with `causal` against (s + 1)/2 keys on average, as `model_flops_per_token` counts the
    main model's (an audit: `mfu_causal` counted the module's unmasked)."""
    from budget.layers import mtp_layer_params, mtp_layers, mtp_params

    d = mtp_layers(plan)
    if not d:
        return 0
    m = plan.model
    x = mtp_layer_params(plan)
    # the module's MoE layer routes as the main model's do, capacity and all
    experts = vround(x.expert_total * _kept_assignments(plan) / m.experts.count) if m.experts else 0
    weights = x.total + experts + mtp_params(plan)[0] + m.vocab * m.hidden
    s = plan.batch.seq  # 2·heads·(d_qk + d_v) FLOPs a key, s keys or (s + 1)/2
    pairs = m.heads * (m.qk_head_dim + m.head_dim) * (s + 1 if causal else 2 * s)
    return d * (6 * weights + 3 * pairs)


def attention_query_flops(model: Model, first: float, last: float) -> float:
    """Forward model FLOPs of the attention products of one query over all layers, the
    query meeting `first` keys, `last` keys, or on average as many as its position between
    them does (`attention_pair_flops` per key): a layer whose attention slides
    (``model.sliding_window``) counts at most W keys per query, since that is what it
    computes as written. Training counts every query against the whole sequence (PaLM:
    `first` = `last` = s); a causal prefill averages 1 to s keys (query i meets its own
    key and the i − 1 before it, as decode counts pass k meeting P + k), decoding the
    context's length over the tokens generated."""
    per_layer = attention_pair_flops(model) / model.layers
    local = sum(model.sliding)
    mean = (first + last) / 2
    windowed = _mean_below(first, last, model.window) if local else 0.0
    return per_layer * ((model.layers - local) * mean + local * windowed)


def _mean_below(first: float, last: float, cap: float) -> float:
    """The mean of min(x, cap) for x from `first` to `last` (first ≤ last)."""
    if last <= cap:
        return (first + last) / 2
    if first >= cap:
        return cap
    area = (cap * cap - first * first) / 2 + cap * (last - cap)
    return area / (last - first)


def attention_pair_flops(model: Model) -> int:
    """Forward model FLOPs of one query meeting one key, over all layers: 2·L·heads·(d_qk +
    d_v), the score and the value products as written (causal masks and latent attention's
    absorbed decode do not change what MFU counts). With d_qk = d_v = Q it is PaLM's
    attention term per key (Chowdhery et al., arXiv 2204.02311, appendix B: 6N + 12·L·H·Q·T
    FLOPs a token over T keys, training's forward and backward): 4·L·H·Q forward, three
    times that trained, 12·L·H·Q."""
    return 2 * model.layers * model.heads * (model.qk_head_dim + model.head_dim)
