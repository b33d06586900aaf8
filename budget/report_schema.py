"""The JSON Schema (Draft 2020-12) of every JSON document budget prints.

Shipped inside the package (``budget/schemas/report.schema.json``); the repository's
``schemas/report.schema.json`` links to the same file. Each output has a definition under
``$defs``: ``report`` (a plan), ``check``, ``validate``, ``diff``, ``collective``, ``roofline``,
``search``, ``validate_model`` and ``presets``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any, Literal, get_args

__all__ = ["KINDS", "SCHEMA_VERSION", "Kind", "report_schema", "validation_errors"]

# 1.1: `budget diff` pairs the stages of plans of different depths by role (a row's
# ``stage`` is then "first" or "last", with ``a_stage`` and ``b_stage``); search's
# ``hardware.capacity_bytes``; the report's ``layout.fsdp``
# 1.2: `budget presets` gives each device's ``gemm.inner_half`` (K₀), and its JSON carries
# ``schema_version``
# 1.3: `budget collective` gives ``latency_term_s`` and ``bandwidth_term_s``
# 1.4: `budget presets` gives each fused-attention rate's ``source``, and the rates are of a
# causal call; the report's ``device.attention_causal``
# 1.5: the report's ``device.attention_unmasked_keys`` and ``attention_backward_keys``: a
# ring's unmasked calls and an all-gather's backward are read at seq / (2·cp) keys;
# `budget presets` gives each attention rate's ``forward`` and ``backward``
# 1.6: every command's JSON document starts with ``schema_version`` (check, diff, collective,
# roofline, search and validate-model had none); the report's ``step.mfu_format``, the format
# whose dense peak MFU is a share of (precision.matmul); search's ``ruled_out``, the degrees
# none of whose layouts could be built (its ``rejected`` had counted each as one layout)
# 1.7: the report's ``model.head_dim``, which a model read from a config can set apart from
# hidden / heads (Mistral-Nemo's 128 where 5120 / 32 is 160); `budget validate --format json`
# (``validate``)
# 1.8: `budget check`'s time limits give their largest phases (``phases``), which their
# message names (``contributors`` holds memory allocations, empty for them); `budget diff`'s
# stage rows give ``reserved_bytes``, so that they add up to the peak; `budget collective
# --beside` gives ``beside_s`` and ``exposed_s``; diff's plan keys name a hand-written
# transition (``transitions[NAME].FIELD``, by index before)
# 1.9: a collective's ``algorithm`` may be ``double-tree``, NCCL's double binary tree, which
# an all-reduce across levels runs where it is faster than the ring or where a plan names it
# 1.10: `budget validate-model`'s ``memory``, peak memory per GPU against published
# measurements (metric ``peak_bytes``), scored apart from the step times; the report's
# ``model.experts.imbalance``, the routing skew its expert tensors are sized at
# 1.11: `budget collective`'s ``aggregate_sent_bytes`` and ``aggregate_recv_bytes``; the
# report's ``step.after_stage``, whose reduction and optimizer end the step, and
# ``device.matmul_ceiling``, ``matmul_by_size`` and
# ``memory_efficiency``, the roofline's derates; `budget search`'s ranked layouts give
# ``config.layers_per_stage``, the uneven split of the layers they were priced with (null
# where even); `budget diff`'s deltas may have
# unit ``count`` and better ``neither`` (a phase's ``count``, a stage's ``layers`` and
# ``inflight``: they explain the figures, no verdict), the
# step's ``after_s``; the step's and the phases' times and bytes of two steps that do
# different work (other tokens a training step, other sequences, prompt or generated tokens
# a serving run) have verdict n/a; a preset topology's size is the plan key
# ``topology.nodes``
# 1.12: the report's ``step.mfu_causal``, MFU with the attention products the causal mask
# computes (``mfu`` counts them unmasked, PaLM's, and can pass 1 at a long context)
# 1.13: `budget search`'s ``replayed``, the held layouts whose model chunks differ that it
# priced again in Megatron-LM's order, as their reports do
# 1.14: `budget search`'s ``replayed`` counts every layout the search replayed, to rank it
# or to judge it against a time limit
# 1.15: `budget validate-model`'s ``serving``, a static batch's latency against published
# measurements (metric ``latency_s``), scored apart from the training step times; the
# report's ``model.experts.capacity_factor`` and ``pad_to_capacity``
# 1.16: `budget collective`'s ``passed_over``, the all-reduce across levels the default did
# not pick and its time, which the table said and the JSON did not
# 1.17: the report's ``step.drained_s``, the reduction a later stage ran while the stages
# ahead of it drained, and ``step.optimizer_stage``; ``after_stage`` is the stage whose
# reduction ends latest past the pipeline's end, each from its own last backward
# 1.18: the report's ``step.filled_s``, the optimizer step a later stage ran while the
# stages ahead of it filled the next step's pipeline, and ``step.fill_gathers_s``, the later
# 1F1B stages' parameter gathers in series along it; ``optimizer_stage`` puts it off longest
# 1.19: diff's summary gives tokens_per_s_per_gpu where the plans' GPU counts differ, and
# then the whole job's tokens_per_s (and a training step's and phases' times) verdict n/a
# 1.20: the report's ``layout.fsdp_unit``, what ZeRO 3 gathers and reduce-scatters at once
# (block or layer), and ``layout.reshard_after_forward``, whether it frees them after their
# forward, and ``layout.fsdp_root``, whether the embedding and the head are units apart (all
# null below ZeRO 3), and search's ``hardware`` all three, which every ZeRO 3 layout keeps;
# ``layout.reduce_bucket``, DeepSpeed's gradient buffer in elements, came under 1.19 without
# a version of its own
# 1.21: the report's ``layout.dp_shard``, ZeRO's shard group under hybrid sharding (null
# without), and collectives on its groups ``dp_shard`` and ``dp_replicate``
# 1.22: search's ``config.dp_shard``, hybrid sharding's shard group where ``--hybrid true``
# priced one (null otherwise)
# 1.23: `budget collective --beside`'s ``slowdown`` (--slowdown, a plan's default 0.189) and
# ``slowdown_s``; its ``exposed_s`` is max(0, T − W / (1 − s)), as a plan reads the pair
# 1.24: the report's ``layout.loss``, the cross-entropy's kernels (plan key ``loss``), null
# for a serving plan
# 1.25: ``layout.loss`` may be ``pytorch-gathered``, PyTorch's cross-entropy on logits
# all-gathered over tp (loss parallelism off)
# 1.26: the report's ``layout.recompute_early_stop``, whether the full recompute stops once
# the backward's tensors are made again (PyTorch's non-reentrant checkpoint), null for a
# serving plan
# 1.27: the report's ``layout.defer_embedding_wgrad``, how many micro-batches' output-layer
# weight gradients the last stage defers to the pipeline's drain (null where none), and the
# phase ``head.wgrad`` that runs them
# 1.28: diff's summary gives ``mfu_causal``, each plan's MFU counting the attention as the
# causal mask computes it, where either report prints it beside MFU (a tenth or more below)
# 1.29: search gives ``rejected_by_states``, the layouts counted as not fitting by their model
# states alone, without a pass of the engine
# 1.30: search gives ``nearest``, how near the layouts came to fitting and keeping the limits
# 1.31: search's hardware gives ``etp``, the expert layers' tensor parallelism every layout
# keeps ("tp": each layout's own; null without experts)
# 1.32: the report's device gives ``overrides``, ``flops`` and ``memory_bandwidth_Bps``, its
# topology ``name`` and ``overrides``; search's hardware ``device_overrides`` and
# ``topology_overrides``
# 1.33: the report's layout gives ``tp_style``; a stage ``mtp_layers``; check's reasons and
# validate-model's rows ``unit``
# 1.34: the report's device gives ``fp8_transpose``; a level's ramp ``borrowed``
# 1.35: the report's device gives ``attention_head_dim``, presets' attention rates ``head_dim``
# 1.36: a report's collective gives ``pace``, the share of its pace alone it keeps while
# hidden, where collectives hidden inside its window share its links; search's nearest
# ``fitting_least_exact_step_s``, the least step of the fitting layouts priced exactly
SCHEMA_VERSION = "1.36"

Kind = Literal[
    "report",
    "check",
    "validate",
    "diff",
    "collective",
    "roofline",
    "search",
    "validate_model",
    "presets",
]
KINDS: tuple[Kind, ...] = get_args(Kind)


@cache
def report_schema() -> dict[str, Any]:
    """The schema as shipped."""
    text = files("budget").joinpath("schemas/report.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _validator(kind: Kind | None) -> Any:
    from jsonschema import Draft202012Validator

    schema = dict(report_schema())
    if kind is not None:
        schema.pop("anyOf")
        schema["$ref"] = f"#/$defs/{kind}"
    return Draft202012Validator(schema)


def validation_errors(data: Any, kind: Kind | None = None) -> list[str]:
    """Why `data` is not a valid `kind` output (any output when None); empty when it is."""
    return sorted(
        f"$.{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in _validator(kind).iter_errors(data)
    )
