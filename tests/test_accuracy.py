"""The step-time model against a published Megatron-LM measurement on A100s.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198), end-to-end iteration table, and the Megatron-LM README table built from
the same runs ("measured on benchmark runs ... using a data parallel size of one"): GPT-3
175B (96 layers, hidden 12288, 96 heads, sequence 2048) with tensor parallel 8, pipeline
parallel 8, data parallel 1 (64 A100 80GB GPUs), global batch 64, micro-batch 1, sequence
parallelism and selective recompute: 13.75 s per iteration, model FLOPs utilisation 51.4 %.
The pipeline is interleaved with 3 virtual stages (as Calculon's validation of the same run
records it, calculon-ai/calculon ``validation/175B_seqsel.json``) and sends between stages
use Megatron-LM's scatter/gather (on by default in the Megatron-LM of the paper).

The two figures agree with each other: 64 x 2048 tokens x 72·l·h²·(1 + s/(6h) + V/(12·l·h))
FLOPs / (13.75 s x 64 x 312 TFLOP/s) = 51.4 %. The 2022 runs predate FlashAttention in
Megatron-LM, so attention is eager with dropout.

The run is `budget.accuracy`'s own (the row `budget validate-model` scores), so this test
and that table time one plan and cannot disagree about its layout.
"""

from __future__ import annotations

import pytest

from budget.accuracy import RUNS, plan_of
from budget.pipeline import build_report

PUBLISHED_ITERATION_S = 13.75
PUBLISHED_MFU = 0.514
TOLERANCE = 0.15  # issue 3, acceptance 6: 11.69 s to 15.81 s against the published 13.75 s


def _korthikanti_175b():
    """The accuracy module's GPT-3 175B selective-recompute run, checked against the layout
    the paper states (module docstring) before it is timed."""
    (run,) = [r for r in RUNS if r.name == "GPT-3 175B, 64 GPUs"]
    assert (run.metric, run.measured) == ("step_s", PUBLISHED_ITERATION_S)
    assert "arXiv 2205.05198" in run.source
    plan = plan_of(run)
    model, parallel, batch = plan.model, plan.parallel, plan.batch
    assert (model.layers, model.hidden, model.heads) == (96, 12288, 96)
    assert (model.attention, model.dropout) == ("eager", True)
    assert (batch.seq, batch.micro, batch.global_batch) == (2048, 1, 64)
    assert (parallel.tp, parallel.pp, parallel.dp, parallel.cp, parallel.ep) == (8, 8, 1, 1, 1)
    assert parallel.sequence_parallel and plan.recompute == "selective"
    pipeline = parallel.pipeline
    assert (pipeline.schedule, pipeline.virtual_stages) == ("interleaved", 3)
    assert pipeline.scatter_gather
    assert (plan.device.name, plan.topology.gpus) == ("a100-80gb", 64)
    return plan


def test_gpt3_175b_iteration_time_within_15_percent_of_megatron():
    """Within 15 % of the published 13.75 s: 11.69 s ≤ predicted ≤ 15.81 s."""
    report = build_report(_korthikanti_175b())
    time_s = report.step["time_s"]
    error = (time_s - PUBLISHED_ITERATION_S) / PUBLISHED_ITERATION_S
    assert abs(error) <= TOLERANCE, f"predicted {time_s:.2f} s, error {error:+.1%}"
    assert 0.85 * 13.75 <= time_s <= 1.15 * 13.75


def test_gpt3_175b_mfu_counts_the_model_flops_megatron_counts():
    """MFU's numerator is the paper's: the FLOPs budget's MFU stands for (MFU × its own
    step × 64 GPUs × 312 TFLOP/s) equal 51.4 % of 13.75 s on the same 64 GPUs, within the
    rounding of 51.4 (±0.05 points, ±0.1 %). MFU within a band of the published one would
    only restate the time test above (an audit)."""
    report = build_report(_korthikanti_175b())
    peak = 64 * 312e12  # A100 dense bf16 (datasheet)
    flops = report.step["mfu"] * report.step["time_s"] * peak
    assert flops == pytest.approx(PUBLISHED_MFU * PUBLISHED_ITERATION_S * peak, rel=1.5e-3)


def test_the_readmes_mfu_against_six_times_the_parameters_is_the_plans():
    """README (how MFU is counted): on a large vocabulary MFU reads a few percent under
    6·params_total, Llama 3 8B (plans/llama3-8b-fsdp.yaml) at its MFU against the same step
    counted with every parameter, the input embedding's 128,256 x 4,096 included, beside the
    same 12·L·h·s of attention (an audit found 45.5 % where this gives 45.6)."""
    from pathlib import Path

    from budget.plan.load import load_plan

    root = Path(__file__).resolve().parents[1]
    report = build_report(load_plan(root / "plans" / "llama3-8b-fsdp.yaml"))
    m, seq = report.model, report.layout["seq"]
    attention = 12 * m["layers"] * m["hidden"] * seq
    lookups = m["vocab"] * m["hidden"]  # the input embedding; the output layer is untied
    mfu = report.step["mfu"]
    whole = (
        mfu * (6 * m["params_total"] + attention) / (6 * (m["params_total"] - lookups) + attention)
    )
    readme = " ".join((root / "README.md").read_text("utf-8").split())
    assert f"(Llama 3 8B: {mfu:.1%} against {whole:.1%})".replace("%", " %") in readme
