"""The step-time model against published training runs (`budget validate-model`).

Each `Run` is a published measurement with the full layout its source states, written as a
plan from the catalogue's presets (`budget.catalog`) and budgeted by the same pipeline as
any plan. Nothing here is tuned: the device efficiencies come from microbenchmarks
(`budget.catalog.devices`), none from these runs.

Which runs are scored (`RUNS`), fixed before any of them was predicted:

- A100: the four GPT models of Korthikanti et al. (arXiv 2205.05198), each with sequence
  parallelism and selective recompute and with full recompute (see `_gpt_run`).
- H100: every row of the "H100 80GB BF16" table of mosaicml/llm-foundry's
  ``scripts/train/benchmarking/README.md`` run on 8 GPUs at sequence length 2048: one node,
  so NVLink only and no assumption about the inter-node fabric, and the sequence length the
  MPT yamls train at. That is MPT 30B, 13B, 7B, 1B and 760M; the table has no 8-GPU,
  2048-token row for 3B or 70B. Every selected row can be written in the plan language
  (see `_mpt_run`), so none is dropped.

- H100, Megatron stack (added later, after the two rules above had been scored, and fixed
  before any of its runs was predicted): NVIDIA's DGX Cloud benchmarking recipes
  (NVIDIA/dgxc-benchmarking at 8f5cbb37, collection 25.02), every BF16 pre-training table of
  a dense model on NeMo (Llama 3.1 8B, 70B and 405B, Nemotron-4 15B and 340B, GPT-3 175B), at
  the smallest and the largest GPU count at which the whole model runs (the 405B table's
  reduced-layer proxies are not the model). Each table prints TP, PP, CP, VP, micro-batch
  and global batch and the measured step time; the recipe's own scripts and configs give
  the rest (see `_nemo_run`).

Peak memory (`MEMORY_RUNS`, added after the step-time table, the rule fixed before any of its
runs was predicted): every NVIDIA/Megatron-LM functional test that is named for measuring
memory (``*_memory_speed``) and keeps H100 golden values, as found on 2026-12-02: three.
Each test's ``model_config.yaml`` gives every argument; its golden values give
``mem-max-allocated-bytes``, `torch.cuda.max_memory_allocated` on the last rank (the only one
that writes them: the last pipeline stage), which the engine's peak of its last stage
predicts (plans reserve nothing: the CUDA context and NCCL's buffers are outside PyTorch's
allocator). The steady peak is compared, from the first logged step after step 1 (step 2,
or step 5 where a test logs every fifth): step 1 peaks before Adam's moments exist.

Serving (`SERVING_RUNS`, added after the tables above, the rule fixed before any of its runs
was predicted): NVIDIA/FasterTransformer's ``docs/gpt_guide.md``, section "Performance",
which times one generate call of a static batch (FasterTransformer's latency column; its
Megatron columns are another stack) on A100 80GB SuperPod nodes (NVSwitch inside a node,
eight 200 Gb/s InfiniBand NICs between), FP16, top-p 0.9 sampling, one beam. From every
table, each layout without a pipeline (the Megatron-530B table's TP-8 PP-3 column does not
say into how many micro-batches FasterTransformer splits the batch), the cells at the
table's longest output length (and its longest input there): the smallest batch and the
largest that ran (not out of memory). That is 22 runs of seven models at TP 1 to 32. The
call runs the context (prefill) over the input, whose last position gives the first token,
then output − 1 decoder passes (``ParallelGpt.cc`` skips the decoder at the first step),
which is a decode plan's prefill and its generate − 1 passes: the prediction is the
report's time for the batch. They are scored on their own, apart from the training step
times.

`REFERENCE_RUNS` are measurements whose layout is not fully published (Llama 3 405B: the
pipeline is interleaved, but with how many virtual stages is not said). They are predicted
and shown below the table but count in neither the mean nor the maximum.

`DIAGNOSTIC_RUNS` were chosen after the scored runs were seen, so they are not scored
either: the H100 rows' five MPT models, GPUs, sequence length and FSDP recipe in the same
README's A100 80GB table (against the scored A100 rows, Megatron-LM, they separate what the
training stack costs from what the device does); and the step times the three peak-memory
tests' golden values log beside their memory (`_megatron_timed`), CI runs in
deterministic mode.

Measured quantities are compared as the source reports them: an iteration time in seconds,
model TFLOP/s per GPU (then the prediction is the report's MFU × the dense bf16 peak, so the
error is the relative error of the throughput), or tokens per second per GPU (the report's
tokens per second divided by the GPUs).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from budget.catalog import MODELS
from budget.errors import BudgetError
from budget.pipeline import build_report
from budget.plan.model import Plan
from budget.plan.resolve import resolve
from budget.plan.schema import validate_tree
from budget.plan.yaml_load import Marks
from budget.report import Report

__all__ = [
    "DIAGNOSTIC_RUNS",
    "MEMORY_RUNS",
    "REFERENCE_RUNS",
    "RUNS",
    "SERVING_RUNS",
    "Accuracy",
    "Row",
    "Run",
    "measured_text",
    "metric_of",
    "plan_file_name",
    "plan_of",
    "plan_text",
    "validate_model",
]

Metric = Literal["step_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_bytes", "latency_s"]

_KORTHIKANTI = (
    'Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" '
    "(arXiv 2205.05198), Table 3 (configurations) and the end-to-end iteration times of "
    "section 6, full recompute (the baseline) and sequence parallel + selective recompute; "
    "the Megatron-LM README reports the selective runs as MFU 41.5 % (22B), 51.4 % (175B), "
    "56.0 % (530B), 56.3 % (1T). Micro-batch and interleaving as recorded by Calculon's "
    "validation configs (calculon-ai/calculon, validation/*_seqsel.json, *_full.json)"
)
_LLAMA3 = (
    'Llama Team, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4 (405B, BF16, H100 80GB)'
)
_LLAMA3_INCOMPLETE = "interleaved pipeline, number of virtual stages unpublished; modelled as 1F1B"
_LLM_FOUNDRY = (
    "mosaicml/llm-foundry, scripts/train/benchmarking/README.md (commit 061f2c7), table "
    '"H100 80GB BF16", Throughput (T/s/GPU); model from scripts/train/yamls/pretrain/mpt-{}.yaml'
)
_DGXC = (
    "NVIDIA/dgxc-benchmarking (commit 8f5cbb37, collection 25.02), {}: BF16 table, training step "
    "time (seconds per step); recipe settings from the recipe's configure.sh and {}"
)
_LLAMA31_CONFIG = (
    "NeMo-Framework-Launcher (commit 1ab2c78) "
    "launcher_scripts/conf/training/llama/llama3_1_{}.yaml (the recipe copies its own "
    "llama3.1_*.yaml, not published; layout as the README prints it)"
)
_LLM_FOUNDRY_A100 = _LLM_FOUNDRY.replace(
    '"H100 80GB BF16"', '"A100 80GB with 1600 Gbps node-node interconnect (RoCE)"'
)


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    gpu: str
    tree: dict[str, Any]  # the plan, in the plan language
    metric: Metric
    measured: float
    source: str
    note: str = ""
    stack: str = ""  # the training software, as the summary groups runs


@dataclass(frozen=True, slots=True)
class Row:
    run: Run
    predicted: float
    # the engine's worst-stage peak and the device memory: a run that ran but whose plan
    # the memory model puts over its memory is a miss of that model, said beside the table
    peak_bytes: int = 0
    capacity_bytes: int = 0

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def error(self) -> float:
        """Signed relative error (predicted − measured) / measured."""
        return (self.predicted - self.run.measured) / self.run.measured


@dataclass(frozen=True, slots=True)
class Accuracy:
    rows: tuple[Row, ...]  # scored
    reference: tuple[Row, ...] = ()  # layout incomplete: shown, not scored
    diagnostic: tuple[Row, ...] = ()  # chosen after the scored runs were seen: not scored
    memory: tuple[Row, ...] = ()  # peak memory, scored on its own (`peak_memory`)
    serving: tuple[Row, ...] = ()  # a static batch's latency, scored on its own

    @property
    def mean_abs_error(self) -> float:
        return sum(abs(r.error) for r in self.rows) / len(self.rows)

    @property
    def max_abs_error(self) -> float:
        return max(abs(r.error) for r in self.rows)

    def peak_memory(self) -> Accuracy:
        """The peak-memory runs as an `Accuracy` of their own: their errors are not step
        times' and do not enter the step-time mean or maximum."""
        return Accuracy(self.memory)

    def serving_latency(self) -> Accuracy:
        """The serving runs as an `Accuracy` of their own: a batch's latency, not a training
        step, so outside the step-time mean and maximum."""
        return Accuracy(self.serving)

    def by_gpu(self) -> tuple[Accuracy, ...]:
        """One `Accuracy` per GPU generation of the scored runs, in the order they appear."""
        gpus = dict.fromkeys(r.run.gpu for r in self.rows)
        return tuple(Accuracy(tuple(r for r in self.rows if r.run.gpu == g)) for g in gpus)

    def by_stack(self) -> tuple[Accuracy, ...]:
        """One `Accuracy` per GPU generation and training stack, in the order they appear."""
        keys = dict.fromkeys((r.run.gpu, r.run.stack) for r in self.rows)
        return tuple(
            Accuracy(tuple(r for r in self.rows if (r.run.gpu, r.run.stack) == k)) for k in keys
        )


def _gpt_run(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    pp: int,
    batch: int,
    measured: float,
    micro: int = 1,
    virtual: int = 1,
    full: bool = False,
) -> Run:
    """A Korthikanti et al. run: GPT, TP 8, DP 1, sequence 2048 on DGX A100 80GB, either
    with sequence parallelism and selective recompute ("present work") or with tensor
    parallelism alone and full recompute (the paper's baseline). The 2022 runs predate
    FlashAttention in Megatron-LM: attention is eager, with dropout. Micro-batch size and
    interleaving degree as Calculon's validation of the same runs records them
    (calculon-ai/calculon, ``validation/{22B,175B,530B,1T}_{seqsel,full}.json``: micro-batch
    4 for 22B and 1 otherwise; 3 virtual stages for 175B and 530B, none for 22B and 1T).
    Stage-to-stage sends use Megatron-LM's scatter/gather optimisation, on by default in the
    Megatron-LM of the paper (``scatter_gather_tensors_in_pipeline``, Narayanan et al.,
    arXiv 2104.04473, section 4.1; Megatron-Core later dropped it): it only changes the
    full-recompute runs, whose activations are replicated over tp without sequence
    parallelism (added after the table was read; README)."""
    gpus = 8 * pp
    pipeline: dict[str, Any] = {"scatter_gather": True}
    if virtual > 1:
        pipeline.update(schedule="interleaved", virtual_stages=virtual)
    tree: dict[str, Any] = {
        "name": name + (", full recompute" if full else ""),
        "model": {
            "preset": "gpt3-175b",
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "attention": "eager",
            "dropout": True,
        },
        "batch": {"seq": 2048, "micro": micro, "global": batch},
        "parallel": {
            "tp": 8,
            "pp": pp,
            "dp": 1,
            "sequence_parallel": not full,
            "pipeline": pipeline,
        },
        "recompute": "full" if full else "selective",
        "device": {"preset": "a100-80gb"},
        "topology": {"preset": "dgx-a100", "nodes": gpus // 8},
    }
    note = f"TP8 PP{pp} DP1" + (f" VP{virtual}" if virtual > 1 else "")
    note += f", micro {micro}, global batch {batch}, " + (
        "full recompute, no sequence parallelism"
        if full
        else "sequence parallelism, selective recompute"
    )
    return Run(
        str(tree["name"]), "A100 80GB", tree, "step_s", measured, _KORTHIKANTI, note, "Megatron-LM"
    )


def _llama_run(
    name: str, gpus: int, cp: int, dp: int, seq: int, batch_per_dp: int, measured: float, note: str
) -> Run:
    """A Llama 3 405B run: TP 8, PP 16 with one layer fewer on the first and the last stage,
    all-gather context parallelism (section 3.3.2), bf16 with fp32 gradients and the
    distributed optimizer, no recompute, ranks in the order [TP, CP, PP, DP] (section
    3.3.2, "network-aware parallelism configuration"). Section 3.3.2 also says the pipeline
    is interleaved but not with how many virtual stages; the plan uses plain 1F1B (see the
    README)."""
    tree: dict[str, Any] = {
        "name": name,
        "model": {"preset": "llama3-405b"},
        "batch": {"seq": seq, "micro": 1, "global": batch_per_dp * dp},
        "parallel": {
            "tp": 8,
            "pp": 16,
            "cp": cp,
            "dp": dp,
            "sequence_parallel": True,
            "zero": 1,
            "cp_attention": "allgather",
            "pipeline": {"layers_per_stage": [7] + [8] * 14 + [7]},
            "order": ["tp", "cp", "ep", "pp", "dp"],
        },
        "recompute": "none",
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": gpus // 8},
    }
    return Run(
        name,
        "H100 80GB",
        tree,
        "tflops_per_gpu",
        measured,
        _LLAMA3,
        f"{note}; {_LLAMA3_INCOMPLETE}",
        "Meta",
    )


def _mpt_run(
    size: str,
    layers: int,
    hidden: int,
    heads: int,
    micro: int,
    batch: int,
    measured: float,
    checkpointing: bool,
    a100: bool = False,
) -> Run:
    """An MPT run of llm-foundry's "H100 80GB BF16" table (or, with `a100`, its "A100 80GB"
    table) on one 8-GPU node, sequence 2048.

    Model (``scripts/train/yamls/pretrain/mpt-<size>.yaml`` and the defaults of
    ``llmfoundry/models/mpt/configuration_mpt.py``): d_model, n_heads, n_layers from the
    yaml; expansion_ratio 4 (GELU MLP); vocab_size 50368; tie_word_embeddings true;
    no_bias false (biases on every linear layer and LayerNorm); learned_pos_emb true with
    max_seq_len 2048 rows, since the yamls set neither ``alibi`` nor ``rope``; dropout 0.
    With these the plan's parameter count equals the table's NumParams column exactly.

    Attention: ``attn_impl: triton`` for every size, llm-foundry's FlashAttention in Triton
    (``model.attention: triton``). The sweep's ``submit_benchmarks.py`` writes its
    ``--attn_impl`` into every model's config, overriding the yaml (so the 13B's ``flash``
    too), and every stored version of that period defaults it to ``triton``
    (scripts/train/benchmarking/submit_benchmarks.py at 431051c and at a7c7567, the one PR
    543 merged with these tables; ``sweep.sh`` never passes it). The H100 rows ran
    ``mosaicml/pytorch:2.1.0_cu121-nightly20230827`` (the Image column of
    scripts/train/benchmarking/h100new.md at beb8dee, whose rows are the table's). Until
    this was read the rows were timed as FlashAttention-2, a bound no slower than the
    kernel they ran.

    Layout (the table's columns): FULL_SHARD FSDP over the 8 GPUs (ZeRO 3, tp = pp = 1;
    Composer 0.16 wraps the model in PyTorch's FullyShardedDataParallel, ``fsdp: 1``),
    micro-batch and global batch as listed (grad accumulation = global / (micro × 8)),
    activation checkpointing → full recompute, stopping early: the yamls that checkpoint
    (mpt-30b.yaml) set ``activation_checkpointing_reentrant: false``, so Composer wraps each
    block in FSDP's ``checkpoint_wrapper`` with ``CheckpointImpl.NO_REENTRANT``, whose
    recompute stops before fc2 (``recompute_early_stop``, `step.early_stop`; until an audit
    of the rows' kernels, m359, read it, the 30B's recompute ran fc2 again, 3.5 s a step on
    the H100). FSDP's units are whole layers: llm-foundry's
    ``MPTForCausalLM.fsdp_wrap_fn`` wraps each ``MPTBlock`` (``fsdp_unit: layer``; until
    plans could say so, the rows were priced a block at a time). FSDP prefetches the next
    unit's all-gather and reduce-scatters each unit's gradients during the backward (Zhao
    et al., "PyTorch FSDP", arXiv 2304.11277, section 3.3), so overlap.param_gather and
    overlap.dp_grads.
    Composer's default ``backward_prefetch`` (the yamls set none) is BACKWARD_POST, whose
    backward gather is issued after the unit's gradient kernels are queued and so overlaps
    them only as far as the CPU runs ahead; priced prefetched, an assumption (README,
    "Where the model is weakest", says what exposing them would add).

    Precision: amp_bf16 with FSDP mixed_precision DEFAULT as Composer documents it since
    mosaicml/composer PR 2047 (March 2023): fp32 sharded parameters, which are the
    optimizer's master copy (so no separate master), bf16 parameter all-gather and compute,
    fp32 gradient reduce-scatter; decoupled AdamW with fp32 moments. Composer's code
    departed from that for a while: 0.15.1 to 0.16.3 (``get_mixed_precision``, read from
    their wheels, built 2023-07-07 to 2023-09-26) leave DEFAULT's ``reduce_dtype`` unset,
    which PyTorch 2.1 reads as ``param_dtype`` (bf16), and PR 2628 (merged 2023-10-10, in
    0.16.4) set fp32 again. The tables do not name the Composer that ran (their image is of
    2023-08-27 and PR 543 merged them after 2023-10-18), so the documented DEFAULT stays, as
    before FSDP's gradient passes were priced; ``precision.grad_reduce: bf16`` is the other
    reading (README, "Where the model is weakest").

    Optimizer: the yamls' ``decoupled_adamw`` (scripts/train/yamls/pretrain/mpt-*.yaml,
    weight_decay 0.0), Composer's ``DecoupledAdamW``, whose ``adamw`` steps one parameter at
    a time, an in-place op a pass (``exp_avg.mul_(beta1).add_(grad, ...)``, ...,
    ``param.addcdiv_(exp_avg, denom, ...)``; composer/optim/decoupled_weight_decay.py, the
    same loop in every stored version): ``optimizer_kernel: for-loop``, the bytes of
    PyTorch's single-tensor AdamW (`flops._STEP_PASSES`). Until a review of the rows' kernels
    (m352) read it, they were priced as a fused kernel, 28 B a parameter of the shard where
    the loop moves 80."""
    tree: dict[str, Any] = {
        "name": f"MPT {size.upper()}, 8 {'A100s' if a100 else 'GPUs'}",
        "model": {
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "ffn": 4 * hidden,
            "vocab": 50368,
            "mlp": "gelu",
            "norm": "layernorm",
            "bias": True,
            "tied_embeddings": True,
            "position": "learned",
            "max_positions": 2048,
            "attention": "triton",
            "dropout": False,
        },
        "batch": {"seq": 2048, "micro": micro, "global": batch},
        "precision": {
            "params": "fp32",
            "grads": "fp32",
            "master": "none",
            "optimizer": "adam",
            "optimizer_state": "fp32",
            "optimizer_kernel": "for-loop",
            "activations": "bf16",
            "matmul": "bf16",
            "param_gather": "bf16",
        },
        "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 3, "fsdp": 1, "fsdp_unit": "layer"},
        "recompute": "full" if checkpointing else "none",
        **({"recompute_early_stop": True} if checkpointing else {}),
        "overlap": {"dp_grads": True, "param_gather": True},
        "device": {"preset": "a100-80gb" if a100 else "h100-sxm"},
        "topology": {"preset": "dgx-a100" if a100 else "dgx-h100", "nodes": 1},
    }
    note = f"FSDP 8, micro {micro}, {batch // (8 * micro)} accumulation step(s)" + (
        ", activation checkpointing" if checkpointing else ""
    )
    gpu, table = ("A100 80GB", _LLM_FOUNDRY_A100) if a100 else ("H100 80GB", _LLM_FOUNDRY)
    return Run(
        str(tree["name"]),
        gpu,
        tree,
        "tokens_per_s_per_gpu",
        measured,
        table.format(size),
        note,
        "llm-foundry",
    )


def _nemo_run(
    name: str,
    model: dict[str, Any],
    gpus: int,
    seq: int,
    layout: tuple[int, int, int, int],
    micro: int,
    batch: int,
    measured: float,
    source: str,
    recompute: str,
    kernel: str,
    precision: dict[str, Any],
    comm_sms: dict[str, int] | None = None,
    deferred: int = 0,
    aggregate: tuple[str, ...] = (),
) -> Run:
    """A DGX Cloud benchmarking run: NeMo (Megatron-Core with Transformer Engine) on DGX
    H100 nodes, BF16, ``layout`` = (TP, PP, CP, VP) as the README's table prints it.

    What every one of these recipes sets (its ``configure.sh`` and training config): the
    distributed optimizer (``distributed_fused_adam`` or ``mcore_distributed_optim``: ZeRO 1)
    with gradient reduce-scatter and parameter all-gather overlapped with compute
    (``overlap_grad_sync``, ``overlap_param_sync``); sequence parallelism wherever TP > 1,
    with tensor-parallel communication overlapped through userbuffers
    (``ub_tp_comm_overlap``); pipeline sends overlapped (``overlap_p2p_comm``) where PP > 1;
    fused attention through Transformer Engine, ``kernel``: cuDNN's where the recipe leaves
    it on (``NVTE_FUSED_ATTN=1``; Transformer Engine prefers it on Hopper when FlashAttention
    is on too, NVIDIA/NeMo PR 9188), FlashAttention-2 where it turns it off; Megatron's ring
    context parallelism; bf16 parameters (``megatron_amp_O2``) with the gradient, master and
    Adam-state formats ``precision`` gives, as the recipe's optimizer keeps them (`_ADAM`).
    Ranks in Megatron's default order, TP fastest, then CP, DP, PP. ``comm_sms``: the SMs
    the recipe's userbuffers configuration gives the pipelined reduce-scatters
    (``proj_fprop``, ``fc2_fprop``; `overlap.tp_comm_sms`), where it names one. ``deferred``:
    the recipe's ``wgrad_deferral_limit`` where it sets ``defer_embedding_wgrad_compute``
    (`overlap.defer_embedding_wgrad`, `_DEFERRED`); ``aggregate``: the ring exchanges its
    userbuffers configuration aggregates (`overlap.tp_comm_aggregate`, `_AGGREGATED`). No
    activation recompute unless ``recompute`` says otherwise. Vocabularies are padded as
    Megatron pads them, to a multiple of 128 × TP."""
    tp, pp, cp, vp = layout
    parallel: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "dp": gpus // (tp * pp * cp),
        "sequence_parallel": tp > 1,
        "zero": 1,
        "cp_attention": "ring",
        **({"pipeline": {"schedule": "interleaved", "virtual_stages": vp}} if vp > 1 else {}),
    }
    tree: dict[str, Any] = {
        "name": f"{name}, {gpus:,} GPUs",
        "model": {**model, "attention": kernel},
        "batch": {"seq": seq, "micro": micro, "global": batch},
        "parallel": parallel,
        "precision": {"params": "bf16", **precision},
        "recompute": recompute,
        "overlap": {
            "dp_grads": True,
            "param_gather": True,
            "tp": tp > 1,
            "pp": pp > 1,
            **({"tp_comm_sms": comm_sms} if comm_sms and tp > 1 else {}),
            **({"defer_embedding_wgrad": deferred} if deferred and pp > 1 else {}),
            **({"tp_comm_aggregate": list(aggregate)} if aggregate and tp > 1 else {}),
        },
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": gpus // 8},
    }
    note = f"TP{tp} PP{pp} CP{cp} DP{gpus // (tp * pp * cp)}" + (f" VP{vp}" if vp > 1 else "")
    note += f", micro {micro}"
    note += f", global batch {batch}" + ("" if recompute == "none" else f", {recompute} recompute")
    return Run(str(tree["name"]), "H100 80GB", tree, "step_s", measured, source, note, "NeMo")


def _nemo_table(
    name: str,
    smallest: tuple[int, int, float],
    largest: tuple[int, int, float],
    model: dict[str, Any],
    seq: int,
    layout: tuple[int, int, int, int],
    micro: int,
    source: str,
    recompute: str,
    kernel: str,
    precision: dict[str, Any],
    comm_sms: dict[str, int] | None = None,
    deferred: int = 0,
    aggregate: tuple[str, ...] = (),
) -> tuple[Run, ...]:
    """The two scored runs of one DGX Cloud table: (GPUs, global batch, measured s/step) at
    its smallest and its largest whole-model GPU count, the rest shared (`_nemo_run`)."""
    return tuple(
        _nemo_run(
            name,
            model,
            gpus,
            seq,
            layout,
            micro,
            batch,
            step,
            source,
            recompute,
            kernel,
            precision,
            comm_sms,
            deferred,
            aggregate,
        )
        for gpus, batch, step in (smallest, largest)
    )


_NEMOTRON4 = {
    "hidden": 6144,
    "heads": 48,
    "kv_heads": 8,
    "vocab": 256000,  # nemotron_2_256k sentencepiece; a multiple of 128 × TP already
    "mlp": "squared_relu",  # activation: squared-relu, bias_activation_fusion: false
    "norm": "layernorm",
    "bias": False,
    "tied_embeddings": False,
    "position": "rope",
    "dropout": False,
}
_NEMOTRON4_340B = {**_NEMOTRON4, "hidden": 18432, "heads": 96, "layers": 96, "ffn": 73728}
_NEMOTRON4_15B = {**_NEMOTRON4, "layers": 32, "ffn": 24576}
_NEMOTRON_15B_SOURCE = _DGXC.format(
    "nemotron/README_15b.md (NeMo 24.12)", "nemotron/nemotron4-15b-synth.yaml"
)
_NEMOTRON_340B_SOURCE = _DGXC.format(
    "nemotron/README_340b.md (NeMo 24.09; CP 1, which the table's GA 16 at global batch 32 "
    "on 128 GPUs implies, where this commit's configure.sh would set CP 2 for BF16)",
    "nemotron/nemotron4-340b-synth.yaml (selective recompute)",
)
_LLAMA31_8B = _DGXC.format("llama3.1/README_8b.md (NeMo 24.12)", _LLAMA31_CONFIG.format("8b"))
_LLAMA31_70B = _DGXC.format("llama3.1/README_70b.md (NeMo 24.12)", _LLAMA31_CONFIG.format("70b"))
_LLAMA31_405B = _DGXC.format(
    "llama3.1/README_405b.md (NeMo 24.12; GPT-2 BPE tokenizer as a proxy)",
    _LLAMA31_CONFIG.format("405b"),
)
_GPT3_NEMO = _DGXC.format(
    "nemo_megatron/README_175b.md (NeMo 24.12; VP 6 as its recipe config and the 25.04 "
    "layout table give it, where the table header still says 12)",
    "nemo_megatron/gpt3_175b_hydra.yaml (dropout 0.1)",
)
_LLAMA31_70B_MODEL = {"preset": "llama3-70b", "vocab": 128512}  # 128,256 padded for TP 4
# GPT-2's 50,257 padded for TP 8; 16 query groups where the released 405B has 8 key/value
# heads: the recipe's num_query_groups (NeMo-Framework-Launcher llama3_1_405b.yaml at
# 125df21 and 072ecc4) and the README's attention FLOPs, 12·126·16384²·(1 + 16/128 + ...)
_LLAMA31_405B_MODEL = {"preset": "llama3-405b", "vocab": 51200, "kv_heads": 16}
_GPT3_NEMO_MODEL = {"preset": "gpt3-175b", "vocab": 50688, "dropout": True}  # padded, TP 4

# How each recipe's optimizer keeps its states, beside bf16 parameters. NeMo's
# `MegatronBaseModel.setup_optimization` (NeMo 24.x) builds Apex's DistributedFusedAdam
# (``distributed_fused_adam``) with its state in ``optim.dtype`` (fp32 unless the config
# says otherwise) and its contiguous gradient buffer in ``optim.grad_sync_dtype`` (the state
# dtype unless set); with fp32 state and bf16 parameters it sets ``store_param_remainders``,
# keeping the fp32 master as the bf16 parameter plus a 16-bit remainder, 2 B per parameter,
# priced here as a bf16 master, unless the config sets ``fp8_params`` (then a whole fp32
# master, ``store_params``); with bf16 state it stores no master (NVIDIA/NeMo,
# nemo/collections/nlp/models/language_modeling/megatron_base_model.py; Apex,
# apex/contrib/optimizers/distributed_fused_adam.py, its arguments' docstring).
# Megatron-Core's optimizer (``mcore_distributed_optim``) reduces in fp32
# (``grad_reduce_in_fp32`` unless ``grad_sync_dtype`` says otherwise) and keeps fp32 masters.
# Apex's fused step reads the gradients in their own format (``upcast_grads: false``: its
# multi-tensor Adam kernel takes bf16 gradients beside fp32 state, no fp32 copy).
_APEX = {"upcast_grads": False}
_ADAM: dict[str, dict[str, Any]] = {
    "mcore": {"grads": "fp32", "master": "fp32", "optimizer_state": "fp32"},
    "apex": {"grads": "fp32", "master": "bf16", "optimizer_state": "fp32", **_APEX},
    "apex, bf16 grads, fp8_params": {
        "grads": "bf16",
        "master": "fp32",
        "optimizer_state": "fp32",
        **_APEX,
    },
    "apex, bf16": {"grads": "bf16", "master": "none", "optimizer_state": "bf16", **_APEX},
}

# The SMs each recipe's userbuffers configuration gives its pipelined reduce-scatters, beside
# the attention projection (proj_fprop) and fc2 (fc2_fprop), both with set_sm_margin:
# dgxc-benchmarking nemo_megatron/gpt3_175b_hydra.yaml (ub_tp_comm_overlap_cfg: 24 and 20);
# NeMo-Framework-Launcher conf/training/tp_overlap/ub_cfg_h100_h8192_tp4_mbs1_seqlen8192.yaml
# (24 and 16), which llama3_1_70b.yaml at 1ab2c78 names, and
# ub_cfg_h100_bf16_h16384_tp8_cp2_mbs1_seqlen8192.yaml (24 and 8), which llama3_1_405b.yaml
# at 072ecc4 names. The Nemotron-4 recipes name none (nemotron4-*-synth.yaml and configure.sh
# set ub_tp_comm_overlap alone), so Transformer Engine's own default applies, and the NeMo
# 24.09 and 24.12 containers they name carry Transformer Engine 1.x, whose ``initialize_ub``
# sets no margin (``add_ub(..., set_sm_margin: int = 0)``, default config "set_sm_margin":
# False): 0.
_UB_SMS: dict[str, dict[str, int]] = {
    "gpt3 175b": {"attention": 24, "mlp": 20},
    "llama3.1 70b": {"attention": 24, "mlp": 16},
    "llama3.1 405b": {"attention": 24, "mlp": 8},
    "nemotron-4": {"attention": 0, "mlp": 0},
}

# The recipes that defer the output layer's weight gradients to the pipeline's drain
# (``defer_embedding_wgrad_compute: true``), with their ``wgrad_deferral_limit``:
# NeMo-Framework-Launcher llama3_1_70b.yaml at 1ab2c78 (22) and llama3_1_405b.yaml at 072ecc4
# (50), dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml (22); GPT-3's hydra config and
# the 15B's set none (the 8B has no pipeline). Until plans could say so (an audit, m354 and
# m355, read them) these GEMMs ran in line.
_DEFERRED: dict[str, int] = {"llama3.1 70b": 22, "llama3.1 405b": 50, "nemotron-4 340b": 22}

# The ring-exchange overlaps each recipe's userbuffers configuration aggregates (``aggregate:
# 1``; Transformer Engine's default is 0): the 405B's ub_cfg_h100_bf16_h16384_tp8_cp2_mbs1_
# seqlen8192.yaml all four, GPT-3's gpt3_175b_hydra.yaml fc2_dgrad; the 70B's
# ub_cfg_h100_h8192_tp4_mbs1_seqlen8192.yaml none, and the Nemotron-4 recipes name no
# configuration. Until plans could say so (an audit, m355, read the 405B's) every ring
# exchange ran tp chunks.
_AGGREGATED: dict[str, tuple[str, ...]] = {
    "llama3.1 405b": ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"),
    "gpt3 175b": ("fc2_dgrad",),
}

# Each DGX Cloud table: its smallest and largest whole-model GPU count as (GPUs, global
# batch, measured s/step), then model, sequence, (TP, PP, CP, VP), micro-batch, source,
# recompute, attention kernel (the 340B recipe sets NVTE_FUSED_ATTN=0: FlashAttention-2) and
# optimizer formats (`_ADAM`: the Llama 3.1 configs name distributed_fused_adam with no
# dtype; GPT-3's adds grad_sync_dtype bf16 and keeps fp8_params true, which its configure.sh
# leaves as it is for the BF16 run; the 340B's sets grad_sync_dtype and dtype bf16; the
# 15B's names mcore_distributed_optim), and the SMs of the pipelined reduce-scatters where
# the recipe's userbuffers configuration names them (`_UB_SMS`).
# fmt: off
_NEMO_TABLES: tuple[tuple[Any, ...], ...] = (
    ("Llama 3.1 8B", (8, 128, 12.78), (128, 2048, 13.16),
     {"preset": "llama3-8b"}, 8192, (1, 1, 2, 1), 1, _LLAMA31_8B, "none", "cudnn",
     _ADAM["apex"]),
    ("Llama 3.1 70B", (64, 128, 14.61), (2048, 4096, 14.84),
     _LLAMA31_70B_MODEL, 8192, (4, 4, 2, 5), 1, _LLAMA31_70B, "none", "cudnn",
     _ADAM["apex"], _UB_SMS["llama3.1 70b"], _DEFERRED["llama3.1 70b"]),
    ("Llama 3.1 405B", (576, 252, 17.50), (2304, 1008, 17.70),
     _LLAMA31_405B_MODEL, 8192, (8, 9, 2, 7), 1, _LLAMA31_405B, "none", "cudnn",
     _ADAM["apex"], _UB_SMS["llama3.1 405b"], _DEFERRED["llama3.1 405b"],
     _AGGREGATED["llama3.1 405b"]),
    ("Nemotron-4 15B", (16, 64, 2.812), (2048, 8192, 2.887),
     _NEMOTRON4_15B, 4096, (4, 1, 1, 1), 4, _NEMOTRON_15B_SOURCE, "none", "cudnn",
     _ADAM["mcore"], _UB_SMS["nemotron-4"]),
    ("Nemotron-4 340B", (128, 32, 4.61), (2048, 512, 4.84),
     _NEMOTRON4_340B, 4096, (8, 8, 1, 12), 1, _NEMOTRON_340B_SOURCE, "selective",
     "flash2", _ADAM["apex, bf16"], _UB_SMS["nemotron-4"], _DEFERRED["nemotron-4 340b"]),
    ("GPT-3 175B", (128, 256, 8.309), (2048, 4096, 8.49),
     _GPT3_NEMO_MODEL, 2048, (4, 8, 1, 6), 1, _GPT3_NEMO, "none", "cudnn",
     _ADAM["apex, bf16 grads, fp8_params"], _UB_SMS["gpt3 175b"], 0, _AGGREGATED["gpt3 175b"]),
)
# fmt: on

RUNS: tuple[Run, ...] = (
    _gpt_run("GPT 22B, 8 GPUs", 48, 6144, 64, 1, 4, 1.10, micro=4),
    _gpt_run("GPT-3 175B, 64 GPUs", 96, 12288, 96, 8, 64, 13.75, virtual=3),
    _gpt_run("GPT 530B, 280 GPUs", 105, 20480, 128, 35, 280, 37.83, virtual=3),
    _gpt_run("GPT 1T, 512 GPUs", 128, 25600, 160, 64, 512, 71.49),
    _gpt_run("GPT 22B, 8 GPUs", 48, 6144, 64, 1, 4, 1.42, micro=4, full=True),
    _gpt_run("GPT-3 175B, 64 GPUs", 96, 12288, 96, 8, 64, 18.13, virtual=3, full=True),
    _gpt_run("GPT 530B, 280 GPUs", 105, 20480, 128, 35, 280, 49.05, virtual=3, full=True),
    _gpt_run("GPT 1T, 512 GPUs", 128, 25600, 160, 64, 512, 94.42, full=True),
    # size, layers, d_model, heads, micro, global batch, measured T/s/GPU, checkpointing
    _mpt_run("30b", 48, 7168, 56, 3, 504, 2002.0, checkpointing=True),
    _mpt_run("13b", 40, 5120, 40, 2, 16, 4792.0, checkpointing=False),
    _mpt_run("7b", 32, 4096, 32, 6, 48, 10643.0, checkpointing=False),
    _mpt_run("1b", 24, 2048, 16, 14, 112, 45455.0, checkpointing=False),
    _mpt_run("760m", 24, 1536, 12, 24, 384, 63147.0, checkpointing=False),
    *(run for table in _NEMO_TABLES for run in _nemo_table(*table)),
)

# Diagnostic, not scored: the same five models, GPUs and sequence length from the same
# README's A100 80GB table (amp_bf16, DEFAULT, FULL_SHARD like the H100 rows), chosen after
# the H100 rows were seen to separate the training stack from the device. Columns: size,
# layers, d_model, heads, micro, global batch, measured T/s/GPU, activation checkpointing.
_MPT_ON_A100: tuple[Run, ...] = (
    _mpt_run("30b", 48, 7168, 56, 3, 504, 916.0, checkpointing=True, a100=True),
    _mpt_run("13b", 40, 5120, 40, 2, 48, 2262.0, checkpointing=False, a100=True),
    _mpt_run("7b", 32, 4096, 32, 6, 96, 4641.0, checkpointing=False, a100=True),
    _mpt_run("1b", 24, 2048, 16, 14, 448, 20513.0, checkpointing=False, a100=True),
    _mpt_run("760m", 24, 1536, 12, 24, 384, 32434.0, checkpointing=False, a100=True),
)

REFERENCE_RUNS: tuple[Run, ...] = (
    _llama_run(
        "Llama 3 405B, 8,192 GPUs", 8192, 1, 64, 8192, 32, 430.0, "TP8 CP1 PP16 DP64, seq 8K"
    ),
    _llama_run("Llama 3 405B, 16,384 GPUs", 16384, 1, 128, 8192, 16, 400.0, "TP8 CP1 PP16 DP128"),
    _llama_run(
        "Llama 3 405B, 16,384 GPUs, 128K context",
        16384,
        16,
        8,
        131072,
        16,
        380.0,
        "TP8 CP16 PP16; DP 8 (the table's DP 4 does not multiply to 16,384 GPUs)",
    ),
)


# fmt: off
_MEGATRON_CI = (
    "NVIDIA/Megatron-LM tests/functional_tests/test_cases/{0}: arguments from "
    "model_config.yaml (commit {1}), mem-max-allocated-bytes from "
    "golden_values_dev_dgx_h100.json (commit {2}), steps {3} onward"
)
# fmt: on


def _megatron_memory_run(
    name: str,
    test: str,
    versions: tuple[str, str, int],
    model: dict[str, Any],
    batch: dict[str, int],
    parallel: dict[str, Any],
    measured: int,
    note: str,
) -> Run:
    """A Megatron-LM functional test that measures memory (module docstring): one DGX H100
    node (the test recipes' ``nodes: 1, gpus: 8``), bf16 with what Megatron-LM's arguments
    imply for it (fp32 gradient accumulation and reduction, fp32 master and Adam states)
    and the distributed optimizer (ZeRO 1) with gradient reduction and parameter gathers
    overlapped (``--overlap-grad-reduce``, ``--overlap-param-gather``, which all three set),
    and under virtual stages the pipeline's sends overlapped too, Megatron-LM's default there
    (``overlap_p2p_comm``, which ``--no-overlap-p2p-communication`` turns off, and which it
    needs over pp 2); no recompute (none sets one); the vocabulary padded as Megatron pads it
    (``--make-vocab-size-divisible-by``, 128 unless set, times TP), from the tokenizer's
    size (Megatron's NullTokenizer adds an end-of-document token to ``--vocab-size``).
    ``versions``: the commits of the config and of the golden values read, and the first
    step compared. Megatron's defaults stand where a test does not set them: learned
    absolute positions, LayerNorm, GeLU with a 4h FFN, biases, dropout 0.1. Under
    ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` which fused attention kernel runs is not pinned;
    both Transformer Engine's keep the same tensors (the output and the softmax
    statistics), so the plan names cuDNN's."""
    tree: dict[str, Any] = {
        "name": name,
        "model": model,
        "batch": batch,
        "parallel": {"zero": 1, **parallel},
        "precision": {
            "params": "bf16",
            "grads": "fp32",
            "master": "fp32",
            "optimizer_state": "fp32",
        },
        "recompute": "none",
        "overlap": {
            "dp_grads": True,
            "param_gather": True,
            "pp": parallel.get("pipeline", {}).get("schedule") == "interleaved",
        },
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    source = _MEGATRON_CI.format(test, *versions)
    return Run(name, "H100 80GB", tree, "peak_bytes", measured, source, note, "Megatron-LM")


# Megatron's defaults for a GPT built from arguments that name none of these (module
# docstring, `_megatron_memory_run`)
_MEGATRON_GPT = {
    "mlp": "gelu",
    "norm": "layernorm",
    "bias": True,
    "position": "learned",
    "dropout": True,
    "tied_embeddings": False,
    "attention": "cudnn",
}
# --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8
# --seq-length 8192 --max-position-embeddings 8192 --untie-embeddings-and-output-weights
_MEGATRON_7B = {
    **_MEGATRON_GPT,
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "ffn": 16384,
    "max_positions": 8192,
}

MEMORY_RUNS: tuple[Run, ...] = (
    _megatron_memory_run(
        "GPT 7B, TP 4, 8 GPUs",
        "gpt/gpt3_7b_tp4_pp1_memory_speed",
        ("1739859b", "09eb91e5", 2),
        {**_MEGATRON_7B, "vocab": 131584},  # NullTokenizer's 131,073 padded to 128 x TP 4
        {"seq": 8192, "micro": 2, "global": 8},
        {"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": False},
        57_143_791_616,
        "TP4 DP2, micro 2, no sequence parallelism",
    ),
    _megatron_memory_run(
        "GPT 7B, PP 4 interleaved, 8 GPUs",
        "gpt/gpt3_7b_tp1_pp4_memory_speed",
        ("000a7170", "070712a0", 2),
        {**_MEGATRON_7B, "vocab": 131200},  # NullTokenizer's 131,074 padded to 128
        {"seq": 8192, "micro": 1, "global": 8},
        {
            "tp": 1,
            "pp": 4,
            "dp": 2,
            "pipeline": {"schedule": "interleaved", "virtual_stages": 8},
        },
        60_518_293_504,
        "PP4 DP2, 8 virtual stages of one layer, micro 1",
    ),
    _megatron_memory_run(
        "MoE with MLA and MTP, TP 2 PP 2 EP 4, 8 GPUs",
        "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed",
        ("2afeef84", "10852d73", 5),
        {
            # --num-layers 16 --hidden-size 1024 --num-attention-heads 32 --kv-channels 128,
            # --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512
            # --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
            "layers": 16,
            "hidden": 1024,
            "heads": 32,
            "head_dim": 128,
            "mla": {"q_rank": 1536, "kv_rank": 512, "nope_dim": 128, "rope_dim": 64},
            # --num-experts 32 --moe-router-topk 4 --moe-ffn-hidden-size 1024
            # --moe-shared-expert-intermediate-size 1024 --moe-layer-freq ([0]*1+[1]*15)
            "ffn": 4096,
            "experts": {
                "count": 32,
                "top_k": 4,
                "ffn": 1024,
                "shared_ffn": 1024,
                "first_dense_layers": 1,
            },
            "mtp_layers": 1,
            # GPT-2's BPE, 50,257 tokens, padded to --make-vocab-size-divisible-by 3232 x TP 2
            "vocab": 51712,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "bias": False,
            "tied_embeddings": False,
            "position": "rope",
            "dropout": False,
            "attention": "eager",  # --attention-backend unfused
        },
        {"seq": 4096, "micro": 4, "global": 32},
        {
            "tp": 2,
            "pp": 2,
            "dp": 2,
            "ep": 4,
            "etp": 1,
            "sequence_parallel": True,
            "pipeline": {"schedule": "interleaved", "virtual_stages": 4},
        },
        59_017_916_416,
        "TP2 PP2 DP2, experts EP4 ETP1, 4 virtual stages, micro 4; unfused attention",
    ),
)


def _megatron_timed(run: Run, name: str, steps: str, times: tuple[float, ...]) -> Run:
    """A `MEMORY_RUNS` test timed: the mean of the ``iteration-time`` its golden values
    (the same file and commit) log at the steady `steps`, Megatron-LM's elapsed time per
    iteration averaged over its log interval. Diagnostic, not scored: read after the
    step-time table was scored, and these are CI runs in deterministic mode
    (``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``, which selects the fused attention's
    deterministic backward; the GPT tests also ``--deterministic-mode``,
    ``--no-gradient-accumulation-fusion`` and 16 SMs held off the LayerNorm kernels), which
    log the parameters' norm and the gradients' zeros every step; no plan can say these."""
    source = re.sub(r"steps \d+ onward", f"the mean of steps {steps}", run.source)
    return Run(
        name,
        run.gpu,
        # named as its row, as every other run's plan is (an audit, m399: its written plan
        # kept the memory row's name, and a diff of the two read "No differences" between
        # two plans of one name)
        {**run.tree, "name": name},
        "step_s",
        sum(times) / len(times),
        source.replace("mem-max-allocated-bytes", "iteration-time"),
        f"{run.note}; CI's deterministic mode",
        "Megatron-LM tests",
    )


_TIMED_TESTS: tuple[Run, ...] = (
    # steps 4 to 24, every second step (log interval 2; the odd steps log nan)
    _megatron_timed(
        MEMORY_RUNS[0],
        "GPT 7B, TP 4, 8 GPUs, timed",
        "4-24",
        (
            1.1044,
            1.09374,
            1.09724,
            1.09511,
            1.09777,
            1.09756,
            1.09624,
            1.09505,
            1.09743,
            1.09698,
            1.09519,
        ),
    ),
    _megatron_timed(
        MEMORY_RUNS[1],
        "GPT 7B, PP 4 interleaved, timed",
        "4-24",
        (
            1.0651472806930542,
            1.0554732084274292,
            1.0575685501098633,
            1.0632253885269165,
            1.0605608224868774,
            1.0918465852737427,
            1.0609685182571411,
            1.059203028678894,
            1.060057520866394,
            1.0580178499221802,
            1.0608563423156738,
        ),
    ),
    # steps 5 to 50, every fifth (log interval 1): from 1.25 to 1.51 s, the noisiest
    _megatron_timed(
        MEMORY_RUNS[2],
        "MoE with MLA and MTP, timed",
        "5-50",
        (1.40744, 1.25155, 1.26148, 1.51273, 1.30203, 1.34227, 1.30273, 1.33922, 1.26374, 1.28751),
    ),
)

# Diagnostic, not scored (module docstring): the MPT recipe on A100, and the memory tests'
# logged step times
DIAGNOSTIC_RUNS: tuple[Run, ...] = _MPT_ON_A100 + _TIMED_TESTS


_FT = (
    "NVIDIA/FasterTransformer docs/gpt_guide.md (commit 07fdd2fc), section Performance, "
    "{} table: FasterTransformer's latency (ms) of one generate call in the layout's column "
    "(the Megatron columns are another stack), {} input and {} output tokens"
)


def _ft_run(
    model: str,
    layers: int,
    heads: int,
    head_dim: int,
    tp: int,
    batch: int,
    lengths: tuple[int, int],
    measured_ms: float,
) -> Run:
    """A FasterTransformer GPT run (module docstring): the guide's model (``head_num``,
    ``size_per_head``, ``num_layers``, vocabulary 51,200) as FasterTransformer's GPT builds
    it from a Megatron GPT checkpoint, the ``gpt3-175b`` preset's architecture at the
    guide's sizes: learned positions (2,048 of them, Megatron's GPT
    default; the guide gives none, and they only add parameters), LayerNorm, a 4h GeLU MLP,
    biases on every linear layer, the output layer sharing the embedding's table; FP16
    weights, activations and KV cache; tensor parallel ``tp`` (``tensor_para_size``), no
    pipeline; one node, or TP / 8 of them above 8 GPUs. Attention is the device's fused
    kernel: FasterTransformer's decoder attention is one kernel that reads the cache
    (masked multi-head attention), and its context attention, at most 8 % of the prefill's
    FLOPs at these lengths (4·s²·h against 24·s·h² a layer, 350M at 512 tokens), takes that
    kernel's rate too, an assumption. Sampling (top-p 0.9) is not priced."""
    prompt, generate = lengths
    tree: dict[str, Any] = {
        "name": f"{model}, TP {tp}, batch {batch}",
        "mode": "decode",
        # GPT-3's preset is GPT-2's architecture at 51,200 tokens (`budget presets`), the
        # guide's vocabulary; its fused attention is the device's. Written out, not named:
        # a plan naming the preset reports its model as "gpt3-175b" (a review: GPT-350M's)
        "model": {
            **MODELS["gpt3-175b"].tree,
            "layers": layers,
            "hidden": heads * head_dim,
            "heads": heads,
            "dropout": False,
        },
        "batch": {"sequences": batch, "prompt": prompt, "generate": generate},
        "precision": {"params": "fp16", "activations": "fp16"},
        "parallel": {"tp": tp, "pp": 1, "dp": 1},
        "device": {"preset": "a100-80gb"},
        "topology": {"preset": "dgx-a100", **({"nodes": tp // 8} if tp >= 8 else {"gpus": tp})},
    }
    note = f"{prompt} input and {generate} output tokens"
    source = _FT.format(model, prompt, generate)
    return Run(
        str(tree["name"]),
        "A100 80GB",
        tree,
        "latency_s",
        measured_ms / 1e3,
        source,
        note,
        "FasterTransformer",
    )


# The cells the rule selects (module docstring), as the guide prints them (milliseconds).
SERVING_RUNS: tuple[Run, ...] = (
    # Megatron-530B: 128 heads of 160, 105 layers; input 60, output 20; TP-16 ran to batch
    # 128 (256: OOM), TP-32 to 256
    _ft_run("Megatron-530B", 105, 128, 160, 16, 1, (60, 20), 1379),
    _ft_run("Megatron-530B", 105, 128, 160, 16, 128, (60, 20), 5406),
    _ft_run("Megatron-530B", 105, 128, 160, 32, 1, (60, 20), 1037),
    _ft_run("Megatron-530B", 105, 128, 160, 32, 256, (60, 20), 7203),
    # GPT-175B: 96 heads of 128, 96 layers, TP 8; input 512, output 32, batch 1 to 16
    _ft_run("GPT-175B", 96, 96, 128, 8, 1, (512, 32), 1719.96),
    _ft_run("GPT-175B", 96, 96, 128, 8, 16, (512, 32), 3706.23),
    # GPT-89B: 96 heads of 128, 48 layers, TP 8; input 512, output 32, batch 1 to 16
    _ft_run("GPT-89B", 48, 96, 128, 8, 1, (512, 32), 887.52),
    _ft_run("GPT-89B", 48, 96, 128, 8, 16, (512, 32), 1952.2),
    # GPT-20B: 48 heads of 128, 44 layers; input 200, output 200; one GPU ran to batch 64,
    # 2-way TP to 128, 4- and 8-way to 256
    _ft_run("GPT-20B", 44, 48, 128, 1, 1, (200, 200), 5648),
    _ft_run("GPT-20B", 44, 48, 128, 1, 64, (200, 200), 10766),
    _ft_run("GPT-20B", 44, 48, 128, 2, 1, (200, 200), 3544),
    _ft_run("GPT-20B", 44, 48, 128, 2, 128, (200, 200), 10538),
    _ft_run("GPT-20B", 44, 48, 128, 4, 1, (200, 200), 2481),
    _ft_run("GPT-20B", 44, 48, 128, 4, 256, (200, 200), 10447),
    _ft_run("GPT-20B", 44, 48, 128, 8, 1, (200, 200), 2080),
    _ft_run("GPT-20B", 44, 48, 128, 8, 256, (200, 200), 7895),
    # GPT-6.7B (32 heads of 128, 32 layers), 1.3B (32 of 64, 24) and 350M (16 of 64, 24), one
    # GPU; input 512, output 32, batch 1 to 64
    _ft_run("GPT-6.7B", 32, 32, 128, 1, 1, (512, 32), 384.70),
    _ft_run("GPT-6.7B", 32, 32, 128, 1, 64, (512, 32), 3306.41),
    _ft_run("GPT-1.3B", 24, 32, 64, 1, 1, (512, 32), 135.85),
    _ft_run("GPT-1.3B", 24, 32, 64, 1, 64, (512, 32), 1036.21),
    _ft_run("GPT-350M", 24, 16, 64, 1, 1, (512, 32), 92.01),
    _ft_run("GPT-350M", 24, 16, 64, 1, 64, (512, 32), 529.18),
)


def plan_of(run: Run) -> Plan:
    """The run's plan, validated and resolved like a plan file (`BudgetError` if not)."""
    file = f"<accuracy: {run.name}>"
    marks = Marks()
    problems = validate_tree(run.tree, marks, file)
    if problems:
        raise BudgetError(problems)
    return resolve(run.tree, marks, file)


def predict(run: Run) -> Row:
    """The run budgeted: its metric as the source reports it, and the worst stage's peak."""
    plan = plan_of(run)
    report = build_report(plan)
    worst = report.worst
    return Row(run, metric_of(plan, run.metric, report), worst.peak_bytes, worst.capacity_bytes)


def metric_of(plan: Plan, metric: Metric, report: Report | None = None) -> float:
    """The prediction for a plan in the unit its source reports (module docstring)."""
    report = report or build_report(plan)
    step = report.step
    if metric in ("step_s", "latency_s"):  # a serving plan's time is its whole batch's
        return float(step["time_s"] or 0.0)
    if metric == "tokens_per_s_per_gpu":
        return float(step["tokens_per_s"] or 0.0) / plan.topology.gpus
    if metric == "peak_bytes":  # the last rank's, where Megatron-LM writes its memory logs
        # less what is held outside PyTorch's allocator (the plan's reserve, Transformer
        # Engine's userbuffers), which torch.cuda.max_memory_allocated does not see
        last = report.stages[-1]
        return float(last.peak_bytes - last.reserved_bytes)
    peak = plan.device.peak_flops(report.mfu_format)
    return float(step["mfu"] or 0.0) * peak / 1e12


def plan_file_name(run: Run) -> str:
    """``Llama 3.1 8B, 8 GPUs`` → ``llama-3.1-8b-8-gpus.yaml``."""
    words = re.findall(r"[a-z0-9.]+", run.name.lower().replace(",", ""))
    return "-".join(words) + ".yaml"


def measured_text(run: Run) -> str:
    """The measurement as its source gives it: bytes whole, the rest to six digits."""
    return f"{run.measured:,.0f}" if run.metric == "peak_bytes" else f"{run.measured:,g}"


def plan_text(run: Run, kind: str, schema_ref: str) -> str:
    """The run as a plan file `budget` reads: its tree, under comments saying where the
    measurement comes from, so one row of the table can be rerun and inspected alone."""
    unit = {
        "step_s": "seconds per step",
        "tflops_per_gpu": "model TFLOP/s per GPU",
        "tokens_per_s_per_gpu": "tokens per second per GPU",
        "peak_bytes": "bytes at the last pipeline stage's peak (torch.cuda.max_memory_allocated)",
        "latency_s": "seconds for the batch: its prefill and decode passes",
    }[run.metric]
    lines = [
        f"# yaml-language-server: $schema={schema_ref}",
        f"# {run.name}: a {kind} run of `budget validate-model` ({run.gpu}, {run.stack}).",
        *textwrap.wrap(
            f"Measured: {measured_text(run)} {unit}.",
            90,
            initial_indent="# ",
            subsequent_indent="# ",
        ),
        *textwrap.wrap(f"Source: {run.source}.", 90, initial_indent="# ", subsequent_indent="# "),
    ]
    if run.note:
        lines += textwrap.wrap(
            f"Layout: {run.note}.", 90, initial_indent="# ", subsequent_indent="# "
        )
    body = yaml.safe_dump(run.tree, sort_keys=False, allow_unicode=True, default_flow_style=None)
    return "\n".join(lines) + "\n" + body


def validate_model(
    runs: tuple[Run, ...] = RUNS,
    reference: tuple[Run, ...] = REFERENCE_RUNS,
    diagnostic: tuple[Run, ...] = DIAGNOSTIC_RUNS,
    memory: tuple[Run, ...] = MEMORY_RUNS,
    serving: tuple[Run, ...] = SERVING_RUNS,
) -> Accuracy:
    """Predicted against measured for every scored, reference, diagnostic, memory and
    serving run."""
    return Accuracy(
        tuple(predict(run) for run in runs),
        tuple(predict(run) for run in reference),
        tuple(predict(run) for run in diagnostic),
        tuple(predict(run) for run in memory),
        tuple(predict(run) for run in serving),
    )
