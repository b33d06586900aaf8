"""The resolved plan: frozen dataclasses built once from validated input.

Every size is already in base units here (bytes as ``int``, seconds, bytes/s, FLOP/s), every
default is filled in and every shape expression is evaluated. Nothing after `resolve` reads
the raw YAML tree.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
Mode = Literal["train", "prefill", "decode"]
Mlp = Literal["gelu", "swiglu", "geglu", "squared_relu"]
GATED_MLPS = ("swiglu", "geglu")  # fc1 is two matrices, the gate and the up projection
# as tables print them
MLP_NAMES = {"gelu": "GeLU", "swiglu": "SwiGLU", "geglu": "GeGLU", "squared_relu": "squared ReLU"}
Norm = Literal["layernorm", "rmsnorm"]
QkNorm = Literal["none", "per_head", "full_width"]
PositionKind = Literal["learned", "rope"]
Attention = Literal["flash", "flash2", "flash3", "cudnn", "triton", "eager"]
FUSED_KERNELS = ("flash2", "flash3", "cudnn", "triton")  # named fused-attention kernels
Optimizer = Literal["adam", "sgd", "none"]
OptimizerKernel = Literal["fused", "foreach", "for-loop"]
Schedule = Literal["1f1b", "gpipe", "interleaved"]
Recompute = Literal["none", "selective", "full"]
# the cross-entropy's kernels: Megatron-Core's vocab-parallel one, or PyTorch's, on the
# rank's vocabulary shard (DTensor's loss_parallel) or on logits gathered whole (`step._loss`)
Loss = Literal["megatron", "pytorch", "pytorch-gathered"]
GroupKind = Literal["tp", "cp", "ep", "dp", "pp"]
AttentionPass = Literal["forward", "backward"]
# a fused attention kernel's backward does 2.5 times its forward's FLOPs: it computes QKᵀ
# again (Dao, arXiv 2307.08691, section 3.1.2; the FLOPs FlashAttention's benchmark counts)
FUSED_BACKWARD = 2.5


def fused_rate(forward: Any, backward: Any) -> Any:
    """The rate of a fused attention kernel's forward and backward together, from each
    pass's (TFLOP/s or fractions of a peak; numbers or arrays): the backward does
    `FUSED_BACKWARD` times the forward's FLOPs, (1 + 2.5) / (1 / forward + 2.5 / backward)."""
    return (1 + FUSED_BACKWARD) / (1 / forward + FUSED_BACKWARD / backward)


# int64: what Megatron-Core gathers its routing counts in (`step._ep_moves`); no plan key
# takes it (the schema names the formats a plan may write)
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int64": 8}
# the most GPUs a plan, a search or a collective lays out: 16,777,216, where the largest
# clusters hold a few hundred thousand (the plan schema's topology.gpus says the same)
MAX_GPUS = 2**24


@dataclass(frozen=True, slots=True)
class Experts:
    """Mixture of experts (Switch / GShard style routing), every `every`-th layer."""

    count: int
    top_k: int
    ffn: int  # per expert
    shared_ffn: int = 0  # total width of the shared experts; 0 for none
    shared_gate: bool = False
    first_dense_layers: int = 0
    every: int = 1
    pattern: tuple[bool, ...] | None = None  # explicit per-layer MoE flags, overrides `every`
    capacity_factor: float | None = None  # None: dropless
    pad_to_capacity: bool = False  # every expert computes its whole capacity (GShard, Switch)
    imbalance: float = 1.0  # the busiest ep rank's rows over the even share (1: balanced)


@dataclass(frozen=True, slots=True)
class Mla:
    """Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", arXiv 2405.04434, section
    2.1, eqs. 9-19): a token's keys and values come from one latent of `kv_rank` (the KV
    cache keeps that latent and one shared rotary key of `rope_dim`), its queries from a
    latent of `q_rank` (0: projected directly). Each head's query and key have `nope_dim`
    + `rope_dim` dimensions; its value has the model's head_dim."""

    kv_rank: int
    nope_dim: int
    rope_dim: int
    q_rank: int = 0


@dataclass(frozen=True, slots=True)
class Model:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    mlp: Mlp = "gelu"
    norm: Norm = "layernorm"
    bias: bool = False
    qkv_bias: bool = False  # biases on the Q, K and V projections only (Qwen2)
    mlp_bias: bool | None = None  # the MLP's and router's biases; None: as `bias` says
    tied_embeddings: bool = True
    position: PositionKind = "rope"
    max_positions: int = 0  # learned position table rows; 0 means batch.seq
    attention: Attention = "flash"
    dropout: bool = False
    logit_softcap: bool = False  # cap · tanh(logits / cap) before the loss (Gemma 2)
    # cap · tanh(scores / cap) on the attention scores before the softmax (Gemma 2)
    attention_softcap: bool = False
    qk_norm: QkNorm = "none"  # a norm on the queries and keys before RoPE (`layers`)
    sandwich_norm: bool = False  # a norm after each block too, not only before (Gemma 2)
    attention_sinks: bool = False  # a learned softmax logit per head and layer (gpt-oss)
    experts: Experts | None = None
    name: str = ""  # preset or config the dimensions came from, for the header
    hf_config: str = ""  # the Hugging Face config.json the plan read, as it wrote the path
    mla: Mla | None = None  # multi-head latent attention; head_dim is then the value's
    mtp_layers: int = 0  # multi-token prediction modules, trained on the last stage
    window: int = 0  # sliding-window attention: keys a query meets on a sliding layer; 0: none
    window_layers: tuple[bool, ...] | None = None  # which layers slide; None: all of them

    @property
    def gate(self) -> int:
        """Matrices in fc1: 2 for a gated MLP (SwiGLU, GeGLU: Shazeer, arXiv 2002.05202,
        gate and up projections of the same width), 1 for a plain GeLU MLP."""
        return 2 if self.mlp in GATED_MLPS else 1

    @property
    def mlp_biased(self) -> bool:
        """Whether the MLP's projections (an MoE layer's experts, shared experts and
        router too) have biases: ``model.mlp_bias``, or ``model.bias`` when it is not set.
        Llama's ``attention_bias`` and ``mlp_bias`` are separate switches
        (``LlamaAttention``, ``LlamaMLP``), as are InternLM2's attention ``bias`` and its
        bias-free MLP."""
        return self.bias if self.mlp_bias is None else self.mlp_bias

    def uncut_widths(self, tp: int, etp: int | None) -> list[tuple[str, int]]:
        """The MLP widths tensor parallelism of degree `tp` would not split into whole
        columns, by their plan keys: the dense layers' ffn (when some layer is dense), the
        shared experts' and, when `etp` is not set, the experts' own (Megatron-LM's
        ``divide(ffn, tp)``; `resolve`'s width rule)."""
        e = self.experts
        widths = [("model.ffn", 0 if all(self.moe_flags) else self.ffn)]
        if e is not None:
            widths.append(("model.experts.shared_ffn", e.shared_ffn))
            if etp is None:
                widths.append(("model.experts.ffn", e.ffn))
        return [(name, width) for name, width in widths if width % tp]

    @property
    def moe_flags(self) -> tuple[bool, ...]:
        """Per layer, whether it is MoE: an explicit pattern, or every `every`-th layer after
        the first `first_dense_layers` (Megatron-LM's moe_layer_freq; DeepSeek's
        first_k_dense_replace); the first `first_dense_layers` are dense under a pattern too
        (an audit, m492: a pattern beside them made them MoE, unsaid; a preset's
        first_dense_layers stays in force under a pattern written over it, 0 lifts it)."""
        e = self.experts
        if e is None:
            return (False,) * self.layers
        if e.pattern is not None:
            first = e.first_dense_layers
            return tuple(flag and i >= first for i, flag in enumerate(e.pattern))
        return tuple(
            i >= e.first_dense_layers and (i - e.first_dense_layers) % e.every == 0
            for i in range(self.layers)
        )

    @property
    def sliding(self) -> tuple[bool, ...]:
        """Per layer, whether its attention is a sliding window of `window` keys (Beltagy
        et al., "Longformer", arXiv 2004.05150, section 3.1; Mistral 7B, arXiv 2310.06825,
        section 2): every layer when `window_layers` is not given, none without a window."""
        if not self.window:
            return (False,) * self.layers
        return self.window_layers or (True,) * self.layers

    @property
    def sliding_share(self) -> float:
        """The fraction of the layers whose attention slides."""
        return sum(self.sliding) / self.layers if self.window else 0.0

    @property
    def qk_head_dim(self) -> int:
        """Dimension of one head's query and key (the value's is `head_dim`)."""
        return self.head_dim if self.mla is None else self.mla.nope_dim + self.mla.rope_dim


@dataclass(frozen=True, slots=True)
class Batch:
    """Training: seq/micro/global. Inference: sequences, prompt and generated tokens."""

    seq: int  # tokens per sequence processed in one pass (prompt + generate for decode)
    micro: int  # sequences per micro-batch per data-parallel rank
    global_batch: int  # sequences per optimizer step (training) or concurrent (inference)
    prompt: int = 0
    generate: int = 0


@dataclass(frozen=True, slots=True)
class Precision:
    params: DType = "bf16"
    grads: DType = "fp32"
    master: DType | None = "fp32"
    optimizer: Optimizer = "adam"
    optimizer_state: DType = "fp32"  # dtype of Adam's moments / SGD's momentum
    # fused: one kernel, nothing allocated (Apex, Transformer Engine, DeepSpeed); foreach:
    # PyTorch's multi-tensor passes (`flops.optimizer_work`) and their temporary as large as
    # what is stepped at once (`step._stepped_at_once`: the shard, or a DeepSpeed sub-group);
    # for-loop: the same passes a tensor at a time, temporaries of one tensor
    # (`step._step_temporary`)
    optimizer_kernel: OptimizerKernel = "fused"
    activations: DType = "bf16"
    matmul: DType = "bf16"  # fp8 halves the bytes GEMM inputs touch
    param_gather: DType = "bf16"  # dtype of ZeRO/FSDP parameter all-gathers
    # dtype of the data-parallel gradient reduction; None: the gradients' own
    grad_reduce: DType | None = None
    kv_cache: DType | None = None  # serving: the KV cache's format; None: the activations'
    # the optimizer step copies gradients narrower than the master into its format first
    # (Megatron-LM, DeepSpeed); False: its fused kernel reads them as they are (Apex's
    # DistributedFusedAdam)
    upcast_grads: bool = True

    @property
    def cache(self) -> DType:
        """The format the serving KV cache is kept and read in."""
        return self.kv_cache or self.activations

    @property
    def reduce(self) -> DType:
        """The format gradients cross the data-parallel group in: ``grad_reduce`` where the
        plan names one (PyTorch FSDP's ``MixedPrecision.reduce_dtype``, DeepSpeed's
        ``communication_data_type``), else the gradients' own."""
        return self.grad_reduce or self.grads


@dataclass(frozen=True, slots=True)
class Pipeline:
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    layers_per_stage: tuple[int, ...] | None = None  # uneven split; sums to model.layers
    # Send 1/tp of a tp-replicated activation between stages and all-gather it over tp on
    # arrival (Megatron-LM's scatter/gather optimisation, `budget.step.pipeline_moves`)
    scatter_gather: bool = False


# the keys of `parallel` that say how ZeRO 3 (PyTorch FSDP) wraps and keeps its units, which
# a plan below ZeRO 3 may not write (`resolve._check_fsdp_keys`; `write.layout_yaml` drops
# them from a searched layout below it)
FSDP_KEYS = ("fsdp", "fsdp_unit", "reshard_after_forward", "fsdp_root")


@dataclass(frozen=True, slots=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel degree; None means tp
    sequence_parallel: bool = False
    zero: int = 0
    # ZeRO's shard group within dp (its fastest-varying dp ranks), None: all of dp; below dp,
    # hybrid sharding: dp / dp_shard copies, each sharded over its group (`step._hybrid`)
    dp_shard: int | None = None
    pipeline: Pipeline = field(default_factory=Pipeline)
    order: tuple[GroupKind, ...] = ("tp", "cp", "ep", "dp", "pp")
    cp_attention: Literal["ring", "allgather"] = "ring"
    # how tensor parallelism runs its collectives (`step._tp_moves`): "megatron", Megatron-LM's
    # and Transformer Engine's layers; "dtensor", PyTorch's DTensor parallel styles as
    # torchtitan applies them (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``)
    tp_style: Literal["megatron", "dtensor"] = "megatron"
    # PyTorch FSDP's generation where its mixed precision applies (`flops.fsdp_mixed`):
    # 1 FullyShardedDataParallel's flat parameters, 2 fully_shard's per-parameter DTensors
    fsdp: Literal[1, 2] = 2
    # what ZeRO 3 gathers and reduce-scatters at once (`step._zero3_moves`): "block", a
    # layer's attention, then its MLP or MoE block; "layer", the whole layer, as PyTorch FSDP
    # runs a unit wrapped around each transformer layer (torchtitan, Composer)
    fsdp_unit: Literal["block", "layer"] = "block"
    # ZeRO 3's parameters freed once a unit's forward is done (FSDP's FULL_SHARD); False keeps
    # them gathered until its backward, which gathers none (FSDP1's SHARD_GRAD_OP, FSDP2's
    # reshard_after_forward=False)
    reshard_after_forward: bool = True
    # what ZeRO 3 makes of the parameters outside the layers (`step._zero3_root_moves`):
    # "whole", one root unit gathered through each micro-batch (FullyShardedDataParallel
    # around the model); "split", the embedding and the head units of their own (torchtitan)
    fsdp_root: Literal["whole", "split"] = "whole"
    # DeepSpeed's reduce_bucket_size: elements of the contiguous gradient buffer its ZeRO 2
    # and 3 copy gradients into before reducing them (`step.deepspeed_buffers`); 0, none
    reduce_bucket: int = 0

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree: etp, else tp."""
        return self.etp or self.tp

    @property
    def zero_ranks(self) -> Any:
        """Ranks ZeRO shards the non-expert states over: its shard group, dp_shard x cp
        under hybrid sharding, else dp x cp (Megatron-LM's distributed optimizer shards over
        the data-parallel group with the context-parallel ranks; torchtitan's FSDP mesh is
        ``dp_shard_cp``). An array in a sweep, where dp is one."""
        return (self.dp if self.dp_shard is None else self.dp_shard) * self.cp

    @property
    def replicas(self) -> Any:
        """Copies of ZeRO's shards under hybrid sharding, dp / dp_shard (1 without); an
        array in a sweep's hybrid layouts (`search.Space.hybrid`)."""
        return 1 if self.dp_shard is None else self.dp // self.dp_shard


def unlaunchable_expert_grid(
    order: tuple[str, ...], tp: Any, cp: Any, dp: Any, pp: Any, ep: Any, etp: Any
) -> Any:
    """Whether Megatron-Core refuses to build the expert grid of an MoE model under `order`
    (a bool, or an array over a sweep's layouts). ``parallel_state.initialize_model_parallel``
    numbers the dense ranks with tp, cp, dp, pp (ep 1) and the expert ranks with etp, ep,
    edp, pp (cp 1) over the same order, edp = tp·cp·dp / (ep·etp), and raises unless (a) the
    order ends with pp, or pp = 1, or edp = dp ("When not using pp-last rank ordering, the
    data parallel size of the attention and moe layers must be the same") and (b) the two
    grids' pp groups are the same ("Pipeline parallel groups are expected to be the same for
    Non-Expert and Expert part"). A pp group is every rank a stride apart, the stride the
    product of the sizes before pp in the order, so (b) holds where the two strides agree.
    Under ``--use-tp-pp-dp-mapping`` (order tp, cp, ep, pp, dp) Mixtral's tp 2, ep 8, etp 2,
    pp 4, dp 8 has strides 2 and 16 and edp 1 against dp 8: refused, where budget had folded
    the expert grid inside each stage and priced a run that cannot start (an audit)."""
    groups, sizes = expert_grid_conflicts(order, tp, cp, dp, pp, ep, etp)
    return groups | sizes


def deepspeed_grads_mismatch(zero: Any, reduce_bucket: int, precision: Precision) -> Any:
    """Whether a layout names DeepSpeed's ZeRO 2 (`Parallel.reduce_bucket`) with gradients
    in another format than the parameters, which DeepSpeed does not run: its ZeRO 2 keeps
    the gradient partition in the parameters' format (``grads_in_partition``,
    stage_1_and_2.py; ``gradient_accumulation_dtype`` is read at ZeRO 1 only; an audit: fp32
    gradients were priced, 0.6 GiB under GPT 1.3B's optimizer step). A bool, or an array over
    a sweep's stages."""
    return (zero == 2) & bool(reduce_bucket) & (precision.grads != precision.params)


def in_place_reduce_mismatch(zero: Any, precision: Precision) -> Any:
    """Whether a ZeRO 0 or 1 layout (Megatron-LM's data-parallel wrapper, without or with
    its distributed optimizer, which budget prices DeepSpeed's ZeRO 0 and 1 as) names a
    reduction format unlike its gradients': Megatron-Core all-reduces or reduce-scatters
    its gradient buffer in place, in the buffer's format (param_and_grad_buffer.py
    ``start_grad_sync``; the buffer is fp32 with ``grad_reduce_in_fp32``, else the
    parameters' format), so no run keeps fp32 gradients and reduces them in bf16 (audits:
    priced at half the bytes and with no bf16 copy, at ZeRO 1 and then, m528, at ZeRO 0).
    A bool, or an array over a sweep's stages."""
    return (zero <= 1) & (precision.reduce != precision.grads)


def gather_overlap_alone(zero: Any, param_gather: bool, dp_grads: bool) -> Any:
    """Whether a ZeRO 1 layout overlaps its parameter gather without its gradient reduction,
    which Megatron-LM refuses (``assert args.overlap_grad_reduce, 'Must use
    --overlap-param-gather with --overlap-grad-reduce'``, megatron/training/arguments.py;
    without it one bucket is gathered whole before the first forward: an audit)."""
    return (zero == 1) & param_gather & (not dp_grads)


def dp_before_cp(order: tuple[str, ...]) -> bool:
    """Whether `order` numbers dp faster than cp: Megatron-LM's distributed-optimizer
    instances, consecutive ranks of the dp × cp group, are then not hybrid sharding's
    dp_shard × cp (`Parallel.dp_shard`; an audit: priced so, its shard group and copies
    swapped their links)."""
    return {"dp", "cp"} <= set(order) and order.index("dp") < order.index("cp")


def expert_grid_conflicts(
    order: tuple[str, ...], tp: Any, cp: Any, dp: Any, pp: Any, ep: Any, etp: Any
) -> tuple[Any, Any]:
    """Megatron-Core's two refusals of an expert grid (`unlaunchable_expert_grid`): (b) its
    pp groups are not the dense ones, (a) pp not last and edp ≠ dp; each where pp > 1."""
    edp = tp * cp * dp // (ep * etp)
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    expert = {"tp": etp, "cp": 1, "ep": ep, "dp": edp, "pp": pp}
    ahead = order[: order.index("pp")]
    strides = math.prod(dense[g] for g in ahead), math.prod(expert[g] for g in ahead)
    piped = pp > 1
    return piped & (strides[0] != strides[1]), piped & (order[-1] != "pp") & (edp != dp)


# Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
# Deep Learning" (arXiv 2507.03114), abstract: overlapping computation and communication
# slows the computation by 18.9 % on average (40.0 % at most) against the same computation
# alone, over GPT and LLaMA training on 4 x A100, H100, MI250 and MI210.
OVERLAP_SLOWDOWN = 0.189
# Transformer Engine 2.x's ``initialize_ub`` default ``num_sm`` for its ``pipeline`` overlap
# method (``transformer_engine/pytorch/module/base.py``), with ``set_sm_margin`` on (1.x
# left the margin off).
TP_COMM_SMS = 16


@dataclass(frozen=True, slots=True)
class CommSms:
    """SMs the pipelined reduce-scatter of `tp` overlap holds off its GEMM for the GEMM's
    whole length (Transformer Engine's ``num_sm`` with ``set_sm_margin``), beside the
    attention output projection (``proj_fprop``) and beside MLP fc2 (``fc2_fprop``):
    Transformer Engine 2.x's ``initialize_ub`` default for the ``pipeline`` method, 16,
    unless the plan gives them (NeMo's H100 recipes set 8 to 24;
    `schedule.overlapped_gemms`)."""

    attention: int = TP_COMM_SMS
    mlp: int = TP_COMM_SMS

    def of(self, block: str) -> int:
        """The SMs held beside the row-parallel GEMM of ``block`` ("attention" or an MLP)."""
        return self.attention if block == "attention" else self.mlp


# Transformer Engine's ring-exchange overlaps by its userbuffers names, in its order: the
# ones ``overlap.tp_comm_aggregate`` may name (true: all of them; `budget.step.RING_GEMMS`)
RING_EXCHANGES = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")


@dataclass(frozen=True, slots=True)
class Overlap:
    dp_grads: bool = False
    param_gather: bool = False
    tp: bool = False
    pp: bool = False
    ep: bool = False
    # Compute runs this much slower while a collective runs beside it (`budget.schedule`).
    slowdown: float = OVERLAP_SLOWDOWN
    tp_comm_sms: CommSms = CommSms()
    # Megatron-Core's defer_embedding_wgrad_compute: the last stage runs the output layer's
    # weight-gradient GEMMs of every micro-batch (true) or of the step's first N (its
    # wgrad_deferral_limit) in the pipeline's drain (`budget.step.deferred_wgrads`)
    defer_embedding_wgrad: bool | int = False
    # Transformer Engine's ring-exchange overlaps (by its names: qkv_fprop, fc1_fprop,
    # proj_dgrad, fc2_dgrad) whose userbuffers configuration sets ``aggregate``: their GEMM
    # runs in tp / 2 chunks of two (`budget.step.RING_GEMMS`)
    tp_comm_aggregate: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.slowdown < 1.0:
            raise ValueError(f"overlap.slowdown must be in [0, 1), got {self.slowdown}")
        deferred = self.defer_embedding_wgrad
        if not isinstance(deferred, bool) and deferred < 1:
            raise ValueError(
                f"overlap.defer_embedding_wgrad must be a boolean or at least 1, got {deferred}"
            )


# The inner dimension of the GEMMs a device's ceiling was measured on (`GemmCurve`):
# gpu-fryer's 8192³ for the H100; the MSMF figures of the H200 and B200, the best of a sweep
# of large shapes whose K is not given, are taken as such. A shallower K than the sweeps'
# shallowest (OpenXLA's table: 256) is priced at it, not extrapolated.
INNER_REF = 8192
INNER_MIN = 256


@dataclass(frozen=True, slots=True)
class GemmCurve:
    """Achieved fraction of the dense peak a GEMM reaches, by its size (`budget.efficiency`).

    ``fraction(F) = peak_fraction · F / (F + half_flops)``: a large GEMM approaches
    ``peak_fraction``; one of ``half_flops`` FLOPs reaches half of it. Calibrated once per
    device from public microbenchmarks (`budget.catalog.devices`), never per plan.
    ``inner_half``: the inner dimension K₀ of the factor K / (K + K₀) by which a GEMM's
    inner dimension K slows it beside its size (`budget.efficiency.inner_factor`); 0 where
    no sweep over K was measured.
    """

    peak_fraction: float
    half_flops: float
    source: str = ""
    # Other number formats measured on their own: (dtype, peak_fraction, half_flops), each
    # a fraction of that dtype's own dense peak.
    by_dtype: tuple[tuple[str, float, float], ...] = ()
    inner_half: float = 0.0

    def for_dtype(self, dtype: str, peak_ratio: float = 1.0) -> GemmCurve:
        """The curve GEMMs read in `dtype` follow: its own measurement if there is one (at
        the same inner-dimension factor: only the bf16 sweeps measured one); else the bf16
        curve's ceiling and ramp time (`budget.catalog.devices`: the ramp time, not the size,
        carries over), its half size scaled by `peak_ratio`, the format's dense peak over
        bf16's (a tf32 GEMM on an H100 ramps in the bf16 curve's 6.5 µs, not twice that)."""
        for name, fraction, half in self.by_dtype:
            if name == dtype:
                return GemmCurve(fraction, half, self.source, inner_half=self.inner_half)
        if peak_ratio == 1.0:
            return self
        half = self.half_flops * peak_ratio
        return GemmCurve(self.peak_fraction, half, self.source, self.by_dtype, self.inner_half)


@dataclass(frozen=True, slots=True)
class Device:
    memory: int  # bytes of device memory
    reserved: int = 0  # bytes lost to CUDA context, communicator buffers, allocator slack
    flops: tuple[tuple[str, float], ...] = ()  # (dtype, dense peak FLOP/s)
    memory_bandwidth: float = 0.0  # bytes/s
    name: str = ""
    # Fractions of the peaks that kernels reach (roofline derating) on a device written out
    # by hand: 0.8 for both, round figures near the burst GEMM ceilings (H. He's "H100 peak
    # matmul FLOPS", 780 of 989 TFLOP/s) and the streaming bandwidths that device presets
    # measure instead (`budget.catalog.devices`: sustained GEMM 0.64-0.87, BabelStream
    # 0.78-0.88).
    matmul_efficiency: float = 0.8
    memory_efficiency: float = 0.8
    # A size-dependent GEMM efficiency (device presets); None: the flat matmul_efficiency.
    gemm: GemmCurve | None = None
    # Fused attention (forward and backward together) per kernel measured on the device, as
    # a fraction of the dense bf16 peak (the format it was measured in) by the keys a kernel
    # call meets; the first is what ``model.attention: flash`` means there
    # (`budget.catalog.devices`).
    attention: tuple[AttentionRate, ...] = ()
    attention_efficiency: float | None = None  # written in the plan: every fused kernel
    # Seconds a kernel takes beyond its bytes at the streaming bandwidth (launch gap, first
    # bytes' latency, last wave's tail): T = startup + V / B (`budget.catalog.devices`).
    kernel_startup: float = 0.0
    # Streaming multiprocessors (AMD: compute units) a kernel can run on; 0: not given, and a
    # GEMM beside a collective that would hold some (`Overlap.tp_comm_sms`) is not narrowed,
    # ``overlap.slowdown`` pricing the overlap instead (`schedule.sm_margin`).
    sms: int = 0
    # FP8 GEMMs take only K-major operands (Hopper): Transformer Engine keeps transposed FP8
    # copies for the backward (`budget.catalog.devices`; `layers.fp8_weight_copies`)
    fp8_transpose: bool = True

    def peak_flops(self, dtype: str) -> float:
        return dict(self.flops).get(dtype, 0.0)

    def attention_kernel(self, kernel: str) -> str:
        """The kernel ``kernel`` runs as here: ``flash`` is the device's default one."""
        if kernel == "flash" and self.attention:
            return self.attention[0].kernel
        return kernel

    def attention_rate(self, kernel: str) -> AttentionRate | None:
        """The rate of ``kernel`` (``flash``: the device's default), measured or derived, if
        the device has one."""
        runs = self.attention_kernel(kernel)
        return next((rate for rate in self.attention if rate.kernel == runs), None)

    def attention_source(self, kernel: str) -> str:
        """Where the attention core's rate comes from: ``eager`` (two GEMMs and a softmax
        on the GEMM curve), ``plan`` (``attention_efficiency``), ``measured`` (the preset's
        rate for the kernel), ``derived`` (the preset's rate, computed from another kernel's)
        or ``gemm`` (a fused kernel with no measurement here)."""
        if kernel == "eager":
            return "eager"
        if self.attention_efficiency is not None:
            return "plan"
        rate = self.attention_rate(kernel)
        if rate is None:
            return "gemm"
        return "derived" if rate.derived else "measured"

    def attention_fraction(
        self,
        kernel: str,
        keys: Any,
        causal: Any = 1.0,
        unmasked_keys: Any = None,
        part: AttentionPass | None = None,
        backward_keys: Any = None,
    ) -> Any:
        """The fraction of the peak fused attention ``kernel`` reaches here when each query
        meets ``keys`` keys per kernel call (a number, or an array), ``causal`` of the
        calls' FLOPs under the causal mask and the rest in calls on ``unmasked_keys``
        (default ``keys``), in its forward or backward ``part`` or both together (None,
        the backward on ``backward_keys`` where given; `AttentionRate.at`): the plan's
        ``attention_efficiency`` if given, else the measured one, else None (no
        measurement: the GEMM curve prices it)."""
        if self.attention_efficiency is not None:
            return self.attention_efficiency
        rate = self.attention_rate(kernel)
        return None if rate is None else rate.at(keys, causal, unmasked_keys, part, backward_keys)


def interp_log(x: Any, xs: tuple[float, ...], ys: tuple[float, ...]) -> Any:
    """`np.interp` in log2 of x (a number, or an array), holding the end values outside
    ``xs``; a number takes a bisect path without numpy's per-call cost (a plan prices each
    kernel and collective one at a time)."""
    if isinstance(x, np.ndarray):
        return np.interp(np.log2(np.maximum(x.astype(float), 1.0)), np.log2(xs), ys)
    size = float(x)
    if size <= xs[0]:
        return ys[0]
    if size >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, size)
    lo, hi = math.log2(xs[i - 1]), math.log2(xs[i])
    t = (math.log2(size) - lo) / (hi - lo)
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


@dataclass(frozen=True, slots=True)
class AttentionRate:
    """A fused attention kernel's rates on one device, its forward and its backward apart:
    the fraction of the dense bf16 peak each reaches when each query meets ``keys[i]`` keys
    in one kernel call (the sequence, or one ring step's share of it under context
    parallelism), interpolated in log keys and held outside the measured lengths. One
    point: the same at every length (`budget.catalog.devices`). ``forward`` and
    ``backward`` are a causal call's; ``unmasked_forward`` and ``unmasked_backward``, at the
    same lengths, a call without a mask (empty: the causal ones). ``derived``: computed from
    another kernel's measurement by published ratios, not measured itself; ``source``: where
    the rate is from; ``head_dim``: the head dimension its measurements ran at (None: not
    stated), which a model of another runs at an unmeasured rate (an audit, m536: the
    FlashAttention-3 paper's bars at head dim 64 are 0.69 of those at 128 for cuDNN's
    forward, and the report said "measured" of both)."""

    kernel: str
    keys: tuple[float, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    derived: bool = False
    source: str = ""
    unmasked_forward: tuple[float, ...] = ()
    unmasked_backward: tuple[float, ...] = ()
    head_dim: int | None = 128

    def at(
        self,
        keys: Any,
        causal: Any = 1.0,
        unmasked_keys: Any = None,
        part: AttentionPass | None = None,
        backward_keys: Any = None,
    ) -> Any:
        """The fraction of ``part`` (forward or backward) at ``keys`` keys per call (a
        number, or an array) for calls with ``causal`` of their FLOPs under the causal mask
        and the rest in unmasked calls on ``unmasked_keys`` keys (default ``keys``;
        `budget.flops.causal_share`, `budget.flops.unmasked_keys`): each share takes its own
        time, 1 / (c / r_causal + (1 − c) / r_unmasked). Without a ``part``, forward and
        backward together, the backward doing `FUSED_BACKWARD` times the forward's FLOPs:
        (1 + 2.5) / (1 / r_forward + 2.5 / r_backward), the backward's calls on
        ``backward_keys`` keys where given (`budget.flops.backward_keys`)."""
        if part is None:
            forward = self.at(keys, causal, unmasked_keys, "forward")
            if backward_keys is not None:
                keys = unmasked_keys = backward_keys
            return fused_rate(forward, self.at(keys, causal, unmasked_keys, "backward"))
        masked, unmasked = (
            (self.forward, self.unmasked_forward)
            if part == "forward"
            else (self.backward, self.unmasked_backward)
        )
        rate = interp_log(keys, self.keys, masked)
        if not unmasked or (not isinstance(causal, np.ndarray) and causal == 1):
            return rate
        length = keys if unmasked_keys is None else unmasked_keys
        return 1 / (causal / rate + (1 - causal) / interp_log(length, self.keys, unmasked))

    def held_at(self, keys: int) -> int | None:
        """The measured length whose rate `at` holds for ``keys`` when they lie outside the
        lengths measured; None when ``keys`` is within them."""
        low, high = min(self.keys), max(self.keys)
        if low <= keys <= high:
            return None
        return int(low if keys < low else high)


@dataclass(frozen=True, slots=True)
class BandwidthRamp:
    """The share of a link's plateau bandwidth a collective of S bytes reaches, by operation.

    ``points`` holds, per operation, sizes S (bytes, as nccl-tests counts them: the whole
    buffer) and the measured share at each; between points the share is interpolated in
    log S, but never so high that S / share, the time of the bytes, falls below the point's
    under S (`share`); outside them it holds the nearest. Operations without points run at
    the plateau. ``borrowed`` names the operations whose points are another's, no sweep of
    their own having been found (the A100's and GB200's all-gather and reduce-scatter take
    the all-reduce's).
    Built from published nccl-tests runs (`budget.catalog.nccl_tests`).
    """

    points: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]
    source: str = ""
    borrowed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A report's ``ramp`` of a topology level."""
        points = [
            {"op": op, "sizes_bytes": [int(x) for x in sizes], "shares": list(shares)}
            for op, sizes, shares in self.points
        ]
        out: dict[str, Any] = {"source": self.source, "points": points}
        if self.borrowed:
            out["borrowed"] = list(self.borrowed)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BandwidthRamp:
        """The inverse of `to_json`."""
        points = tuple(
            (p["op"], tuple(p["sizes_bytes"]), tuple(p["shares"])) for p in data["points"]
        )
        return cls(points, data["source"], tuple(data.get("borrowed", ())))

    def measures(self, op: str) -> bool:
        """Whether a sweep measured `op` (else it runs at the plateau: `share`)."""
        return any(name == op for name, _, _ in self.points)

    def share(self, op: str, size: Any) -> Any:
        """Share of the plateau at ``size`` bytes (a float, or an array for an array)."""
        for name, sizes, shares in self.points:
            if name != op:
                continue
            share = interp_log(size, sizes, shares)
            # where a share grows about as fast as S (an all-gather from 1 to 4 MiB on H100:
            # 41 µs at each), its interpolation in log S sags S / share below both ends (a
            # review: 2.83 MiB priced 3.5 % under 1 MiB); the point below bounds it, so a
            # collective's time never falls as it grows (the catalogue's points rise in
            # S / share, `nccl_tests._rising`)
            if isinstance(size, np.ndarray):
                under = np.searchsorted(sizes, size, side="right") - 1
                least = np.array([s / f for s, f in zip(sizes, shares, strict=True)])
                bound = size / least[np.maximum(under, 0)]
                return np.where(under >= 0, np.minimum(share, bound), share)
            below = bisect.bisect_right(sizes, float(size)) - 1
            if below < 0:
                return share
            return min(share, float(size) * shares[below] / sizes[below])
        return 1.0


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the interconnect, innermost first."""

    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    latency: float  # seconds per message step
    size: int | None = None  # GPUs per domain of this level; None for the outermost
    shared_by: int = 1  # GPUs that share one link of this level (contention)
    ramp: BandwidthRamp | None = None  # None: every collective at the plateau bandwidth


@dataclass(frozen=True, slots=True)
class Topology:
    gpus: int
    levels: tuple[Level, ...]
    name: str = ""


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a value sat in the input file, for error messages after resolution."""

    line: int
    col: int
    path: str
    keys: tuple[tuple[str, int, int], ...] = ()  # (".phase", line, col) of its own keys

    def of(self, key: str) -> tuple[int, int]:
        """Where the item's `key` (".phase", ".to") sat, or the item itself."""
        return next(((line, col) for k, line, col in self.keys if k == key), (self.line, self.col))


@dataclass(frozen=True, slots=True)
class Transition:
    """A hand-written layout transition, priced with the same engine as the built-in ones."""

    name: str
    phase: str
    shape: tuple[int, ...]  # evaluated from the shape expressions
    dtype: DType
    group: GroupKind
    src: str  # placement text: "shard(0)", "replicate", "partial"
    dst: str
    source_alive: bool = True
    count: int = 1  # times per step
    where: Mark | None = None
    # the shape as the file writes it, numbers and expressions over `resolve.SHAPE_NAMES`:
    # a sweep evaluates it again for each layout (`search.reshaped`)
    dims: tuple[int | str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    file: str
    mode: Mode
    model: Model
    batch: Batch
    precision: Precision
    parallel: Parallel
    device: Device
    topology: Topology
    recompute: Recompute = "none"
    # PyTorch's non-reentrant checkpoint, which stops a full recompute once every tensor the
    # backward reads is made again (`step.early_stop`); false: the whole layer runs again
    recompute_early_stop: bool = False
    loss: Loss = "megatron"
    overlap: Overlap = field(default_factory=Overlap)
    transitions: tuple[Transition, ...] = ()
    # `collectives:`: the algorithm a plan names for an op, where it names one (DESIGN rule
    # 3); the others take the default: ring, across levels too for the all-gather,
    # reduce-scatter and broadcast (NCCL's ring over every rank), for the all-reduce that
    # ring or NCCL's double binary tree, whichever is faster; pairwise for the all-to-all,
    # across levels NCCL's grouped send/recv with every peer at once. `hierarchical` names
    # the two-level decomposition across levels
    collectives: tuple[tuple[str, str], ...] = ()

    def algorithm(self, op: str) -> str | None:
        """The algorithm the plan names for `op`, or None for the default."""
        return next((name for o, name in self.collectives if o == op), None)

    @property
    def microbatches(self) -> int:
        """Micro-batches per step on each data-parallel rank: global / (micro x dp)."""
        return self.batch.global_batch // (self.batch.micro * self.parallel.dp)
