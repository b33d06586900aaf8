"""The model against published runs (`budget.accuracy`, `budget validate-model`).

Issue 7 asks for a mean absolute error of at most 5 % and no run worse than 10 %. The model
does not meet it today (README, "Accuracy against published runs": the A100 Megatron rows
are within 7.9 %, but the NeMo runs on H100 are predicted 3-14 % fast and the five
single-node FSDP MPT runs on H100 8-19 % fast), so that test is a strict expected failure:
it turns into a failure the day the time model meets the bar, and the marker must then go.
Short of the bar, `test_no_change_makes_the_table_worse_unseen` holds each group of rows
where it stands, so that a change which moves a prediction away from its measurement
fails here and must say so.
The Llama 3 405B rows are shown for reference only (their interleaving degree is
unpublished) and are not scored.
"""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from budget.accuracy import (
    DIAGNOSTIC_RUNS,
    MEMORY_RUNS,
    REFERENCE_RUNS,
    RUNS,
    SERVING_RUNS,
    Accuracy,
    Run,
    measured_text,
    plan_of,
    validate_model,
)
from budget.layers import params_total
from budget.pipeline import build_report
from budget.render.accuracy import accuracy_markdown, render_accuracy
from budget.report_schema import validation_errors


@pytest.fixture(scope="module")
def accuracy():
    return validate_model()


def test_at_least_six_runs_on_two_generations() -> None:
    assert len(RUNS) >= 6
    assert len({run.gpu for run in RUNS}) >= 2
    assert all(run.source for run in RUNS)


def test_peak_memory_runs_are_megatrons_memory_tests_scored_apart(accuracy) -> None:
    """The peak-memory rows are the three Megatron-LM functional tests named for measuring
    memory that keep H100 golden values (`budget.accuracy`), each citing its test and both
    commits; they are scored on their own and leave the step-time mean alone."""
    assert len(MEMORY_RUNS) == 3
    assert all(run.metric == "peak_bytes" and run.gpu == "H100 80GB" for run in MEMORY_RUNS)
    assert all(
        "_memory_speed: arguments from model_config.yaml" in run.source for run in MEMORY_RUNS
    )
    assert not [run for run in MEMORY_RUNS if run in RUNS]
    assert [r.run for r in accuracy.memory] == list(MEMORY_RUNS)
    memory = accuracy.peak_memory()
    assert memory.mean_abs_error == pytest.approx(
        sum(abs(r.predicted / r.run.measured - 1) for r in accuracy.memory) / 3
    )
    assert accuracy.mean_abs_error == pytest.approx(
        sum(abs(r.error) for r in accuracy.rows) / len(RUNS)
    )
    from budget.render.accuracy import accuracy_dict

    rows = accuracy_dict(accuracy)["memory"]["runs"]
    assert all(type(r["predicted"]) is int and type(r["measured"]) is int for r in rows)
    # the README's prose quotes each row's error as the command computes it, in its phrases
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    tp4, pp4, moe = (f"{abs(row.error):.1%}".replace("%", " %") for row in accuracy.memory)
    assert f"land {tp4} and {pp4} under the peak the run allocated" in readme
    assert f"a multi-token prediction layer, is {moe} under:" in readme


def test_the_tp4_tests_static_state_is_the_hand_count_and_near_its_log(accuracy) -> None:
    """gpt3_7b_tp4_pp1_memory_speed's golden values also log ``mem-allocated-bytes`` after
    each step, 20,663,519,232 B: parameters, gradients and optimizer state, no activation.
    By hand, per TP rank: a layer holds QKV 4096·(4096 + 2·1024)/4 + its bias 6144/4,
    the projection 4096²/4 + 4096 (a row-parallel bias is whole), fc1 4096·16384/4 +
    16384/4, fc2 16384/4·4096 + 4096, two LayerNorms 2·2·4096: 44,070,400; 32 layers, the
    word embedding and the output layer 131584/4 · 4096 each (NullTokenizer's 131,072 + 1
    tokens padded to 128 · TP), 8,192 learned positions · 4096 (whole on every rank) and the
    final LayerNorm 8,192: 1,713,299,456 parameters. Each takes 2 B (bf16) + 4 B (fp32
    gradient) + (4 B fp32 master + 8 B Adam) / DP 2 = 12 B: 20,559,593,472 B, 0.50 % under
    the log: 103,925,760 B, of which three 32 MiB cuBLAS workspaces the engine does not count
    (Transformer Engine's on Hopper, PyTorch's per handle under the test's
    CUBLAS_WORKSPACE_CONFIG=:4096:8) are 100,663,296 and Megatron's buffer padding the rest."""
    layer = 4096 * 6144 // 4 + 1536 + 4096**2 // 4 + 4096 + 2 * (4096 * 16384 // 4) + 4096
    layer += 16384 // 4 + 2 * 2 * 4096
    assert layer == 44_070_400
    params = 32 * layer + 2 * (131584 // 4 * 4096) + 8192 * 4096 + 2 * 4096
    assert params == 1_713_299_456
    stage = build_report(plan_of(MEMORY_RUNS[0])).stages[-1]
    static = stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert static == 12 * params == 20_559_593_472
    assert static / 20_663_519_232 - 1 == pytest.approx(-0.0050, abs=5e-5)
    assert 20_663_519_232 - static - 3 * 32 * 2**20 == 3_262_464
    # and the peak the table compares: within 1 % of max_memory_allocated (57,143,791,616 B)
    (row,) = [r for r in accuracy.memory if r.run is MEMORY_RUNS[0]]
    assert row.predicted == stage.peak_bytes
    assert abs(row.error) < 0.01


def test_every_run_is_predicted(accuracy) -> None:
    """A sanity bound, not the accuracy bar: no prediction is off by a factor of two."""
    for row in (*accuracy.rows, *accuracy.reference):
        assert 0.5 < row.predicted / row.run.measured < 2.0, row.run.name


@pytest.mark.xfail(strict=True, reason="H100 NeMo rows 3-14 % fast; MPT FSDP rows 8-19 % fast")
def test_mean_within_5_percent_and_max_within_10(accuracy) -> None:
    assert accuracy.mean_abs_error <= 0.05
    assert accuracy.max_abs_error <= 0.10


# Where each group of scored rows stands (README, "Accuracy against published runs"), to the
# next whole point: (training stack, GPU) -> (most any row may miss by, mean of the group).
_STANDING = {
    # 10.3 % at most, 4.2 % mean: unfused attention's softmax and dropout backward priced
    # from Megatron-LM's kernels, 5.5S where twice the forward's 9S had read (audit m456),
    # took 0.4 to 2.4 points (from 7.9 % and 3.3 %)
    ("Megatron-LM", "A100 80GB"): (0.11, 0.05),
    ("NeMo", "H100 80GB"): (0.14, 0.08),  # 13.8 %, 7.3 %
    # 19.9 %, 13.7 %: a norm's backward priced at 3 passes and the residual add's at 3 (5
    # and the mask with dropout) where both were twice the forward (an audit read
    # Transformer Engine's norm backward and PyTorch's add backward) took 1.0 to 1.9 points
    ("llm-foundry", "H100 80GB"): (0.20, 0.14),
}


def test_no_change_makes_the_table_worse_unseen(accuracy) -> None:
    """A ratchet, not the bar: no group of scored rows, nor the whole table (7.1 % mean,
    19.9 % at most) nor the peak-memory rows (each within 8 %, the TP 4 and PP 4 tests
    within 1 %), may get further from the measurements than it stands today without this
    test failing. A correction that honestly moves rows away (a model error that flattered
    the table is still an error) moves these bounds in its own commit and says why."""
    groups = {
        (group.rows[0].run.stack, group.rows[0].run.gpu): group for group in accuracy.by_stack()
    }
    assert set(groups) == set(_STANDING)
    for key, (worst, mean) in _STANDING.items():
        assert groups[key].max_abs_error < worst, key
        assert groups[key].mean_abs_error < mean, key
    assert accuracy.mean_abs_error < 0.08 and accuracy.max_abs_error < 0.20
    tp4, pp4, moe = (abs(row.error) for row in accuracy.memory)
    assert tp4 < 0.01 and pp4 < 0.01 and moe < 0.08


def test_the_pp4_tests_static_state_is_the_hand_count_and_its_gap_is_named(accuracy) -> None:
    """The interleaved PP 4 test's last rank holds 8 one-layer chunks of GPT 7B (GQA, 8 of
    32 heads' keys and values, biases, LayerNorm): QKV 4096·6144 + 6144, the projection
    4096² + 4096, fc1 4096·16384 + 16384, fc2 16384·4096 + 4096 and two LayerNorms
    2·2·4096, 176,207,872 a layer; then the output layer 131,200 · 4096 (131,073 padded to
    a multiple of 128) and the final LayerNorm 2 · 4096: 1,947,066,368 parameters at
    2 + 4 + 12 / 2 = 12 B (bf16, fp32 gradient, fp32 master and Adam over DP 2):
    23,364,796,416 B. Megatron-LM logs 24,540,168,192 B allocated after every step
    (golden_values_dev_dgx_h100.json, mem-allocated-bytes), 1,175,371,776 B (4.8 %) more:
    the README names that gap, less the same 96 MiB of cuBLAS workspace as TP 4's, as
    unexplained (1,074,708,480 B), and this holds it there."""
    layer = 4096 * 6144 + 6144 + 4096**2 + 4096 + 2 * 4096 * 16384 + 16384 + 4096 + 2 * 2 * 4096
    assert layer == 176_207_872
    params = 8 * layer + 131_200 * 4096 + 2 * 4096
    assert params == 1_947_066_368
    stage = build_report(plan_of(MEMORY_RUNS[1])).stages[-1]
    static = stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert static == 12 * params == 23_364_796_416
    assert 24_540_168_192 - static == 1_175_371_776
    assert 1_175_371_776 - 3 * 32 * 2**20 == 1_074_708_480
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    assert "three make 100,663,296 of TP 4's 103,925,760 B" in readme.replace("\n", " ")
    assert "other 1,074,708,480 B of PP 4 were not found" in readme.replace("\n", " ")
    assert static / 24_540_168_192 - 1 == pytest.approx(-0.0479, abs=5e-5)


# NumParams of the 8-GPU, 2048-token rows of llm-foundry's "H100 80GB BF16" table
# (scripts/train/benchmarking/README.md): the MPT plans must describe the same models.
_MPT_PARAMS = {
    "MPT 30B, 8 GPUs": 29_975_214_080,
    "MPT 13B, 8 GPUs": 12_853_954_560,
    "MPT 7B, 8 GPUs": 6_658_859_008,
    "MPT 1B, 8 GPUs": 1_315_950_592,
    "MPT 760M, 8 GPUs": 760_470_528,
}


def test_mpt_plans_resolve_to_the_published_models() -> None:
    mpt = {run.name: run for run in RUNS if run.name.startswith("MPT")}
    assert set(mpt) == set(_MPT_PARAMS)
    for name, run in mpt.items():
        plan = plan_of(run)
        assert params_total(plan) == _MPT_PARAMS[name]
        assert plan.topology.gpus == 8
        assert plan.parallel.dp == 8 and plan.parallel.zero == 3
        assert plan.batch.seq == 2048
        assert run.gpu == "H100 80GB" and run.metric == "tokens_per_s_per_gpu"
        assert "mosaicml/llm-foundry" in run.source and "mpt-" in run.source


def test_diagnostic_rows_are_the_same_models_on_a100_and_not_scored(accuracy) -> None:
    """The A100 80GB table of the same README lists the same NumParams for the same five
    models; those rows were picked after the scored ones were seen, so they are shown only.
    So are the memory tests timed, each the plan of its memory row, in seconds a step."""
    mpt = [run for run in DIAGNOSTIC_RUNS if run.stack == "llm-foundry"]
    timed = [run for run in DIAGNOSTIC_RUNS if run.stack == "Megatron-LM tests"]
    assert len(mpt) + len(timed) == len(DIAGNOSTIC_RUNS)

    # each the plan of its memory row, under its own row's name (an audit, m399)
    def unnamed(run: Run) -> dict[str, object]:
        return {k: v for k, v in run.tree.items() if k != "name"}

    assert [unnamed(run) for run in timed] == [unnamed(run) for run in MEMORY_RUNS]
    assert [run.tree["name"] for run in timed] == [run.name for run in timed]
    assert all(run.metric == "step_s" and "iteration-time" in run.source for run in timed)
    names = [run.name.replace("8 A100s", "8 GPUs") for run in mpt]
    assert names == list(_MPT_PARAMS)
    for name, run in zip(names, mpt, strict=True):
        plan = plan_of(run)
        assert params_total(plan) == _MPT_PARAMS[name]
        assert run.gpu == "A100 80GB" and plan.device.name == "a100-80gb"
        assert "A100 80GB" in run.source
    assert [r.run for r in accuracy.diagnostic] == list(DIAGNOSTIC_RUNS)
    assert not [run for run in DIAGNOSTIC_RUNS if run in RUNS]
    assert len(accuracy.rows) == len(RUNS)


def test_llama_3_paper_rows_are_reference_not_scored(accuracy) -> None:
    assert not [run for run in REFERENCE_RUNS if run in RUNS]
    assert not [run for run in RUNS if "Llama 3 Herd" in run.source]
    assert len(REFERENCE_RUNS) == 3
    assert all(run.name.startswith("Llama 3") for run in REFERENCE_RUNS)
    assert all("unpublished" in run.note for run in REFERENCE_RUNS)
    assert [r.run for r in accuracy.reference] == list(REFERENCE_RUNS)
    errors = [abs(r.error) for r in accuracy.rows]
    assert accuracy.mean_abs_error == pytest.approx(sum(errors) / len(RUNS))
    assert accuracy.max_abs_error == max(errors)


# (name, GPUs, TP, PP, CP, VP, micro, global batch, parameters the model card or report
# gives): Llama 3.1 8B 8.03 B and 70B 70.6 B (meta-llama model cards), 405B 405 B with
# the 128K-token vocabulary, so 405B with GPT-2's 51,200 is smaller by (128,256 − 51,200)
# × 16,384 × 2 = 2.5 B, and larger by the recipe's 16 query groups against the released
# model's 8 key/value heads, (16 − 8) × 128 × 2 (K, V) × 16,384 × 126 layers = 4.2 B;
# Nemotron-4 15B "3.2 billion embedding parameters and 12.5 billion
# non-embedding parameters" (arXiv 2402.16819, section 2); Nemotron-4 340B 341 B (arXiv
# 2406.11704, Table 1: 9.4 B embedding, 331.6 B non-embedding); GPT-3 175B.
_NEMO = {
    "Llama 3.1 8B": (8, 128, 1, 1, 2, 1, 1, (128, 2048), 8.03e9),
    "Llama 3.1 70B": (64, 2048, 4, 4, 2, 5, 1, (128, 4096), 70.6e9),
    "Llama 3.1 405B": (576, 2304, 8, 9, 2, 7, 1, (252, 1008), 405.9e9 - 2.52e9 + 4.23e9),
    "Nemotron-4 15B": (16, 2048, 4, 1, 1, 1, 4, (64, 8192), 15.7e9),
    "Nemotron-4 340B": (128, 2048, 8, 8, 1, 12, 1, (32, 512), 341.0e9),
    "GPT-3 175B": (128, 2048, 4, 8, 1, 6, 1, (256, 4096), 175e9),
}


def test_nemo_plans_have_the_published_layout_and_model() -> None:
    """Every DGX Cloud benchmark table gives two scored runs, its smallest and its largest
    GPU count, with the layout the table prints and a model of the published size."""
    nemo = [run for run in RUNS if "dgxc-benchmarking" in run.source]
    assert len(nemo) == 2 * len(_NEMO)
    for run in nemo:
        model, _, count = run.name.partition(", ")
        small, large, tp, pp, cp, vp, micro, batches, params = _NEMO[model]
        plan = plan_of(run)
        gpus = plan.topology.gpus
        assert count == f"{gpus:,} GPUs" and gpus in (small, large)
        assert (plan.parallel.tp, plan.parallel.pp, plan.parallel.cp) == (tp, pp, cp)
        assert plan.parallel.pipeline.virtual_stages == vp
        assert plan.batch.micro == micro
        assert plan.batch.global_batch == batches[gpus == large]
        assert plan.parallel.zero == 1 and plan.parallel.sequence_parallel == (tp > 1)
        assert plan.device.name == "h100-sxm" and run.metric == "step_s"
        assert params_total(plan) == pytest.approx(params, rel=0.01), run.name


def test_renderers(accuracy) -> None:
    out = io.StringIO()
    render_accuracy(Console(file=out, width=120, color_system=None), accuracy, "json")
    data = json.loads(out.getvalue())
    assert len(data["runs"]) == len(RUNS)
    assert len(data["reference"]) == len(REFERENCE_RUNS)
    assert data["max_abs_error"] == pytest.approx(accuracy.max_abs_error)
    assert validation_errors(data, "validate_model") == []
    assert sum(part["runs"] for part in data["by_stack"]) == len(RUNS)
    assert {part["stack"] for part in data["by_stack"]} == {run.stack for run in RUNS}
    by_gpu = {part["gpu"]: part for part in data["by_gpu"]}
    assert sum(part["runs"] for part in by_gpu.values()) == len(RUNS)
    for gpu, part in by_gpu.items():
        errors = [abs(r["error"]) for r in data["runs"] if r["gpu"] == gpu]
        assert part["runs"] == len(errors)
        assert part["mean_abs_error"] == pytest.approx(sum(errors) / len(errors))
        assert part["max_abs_error"] == max(errors)
    text = accuracy_markdown(accuracy)
    scored, _, rest = text.partition("Reference, layout incomplete")
    reference, _, diagnostic = rest.partition("Diagnostic, not counted")
    diagnostic, _, memory = diagnostic.partition("Peak memory per GPU")
    memory, _, serving = memory.partition("Serving: a static batch's latency")
    assert memory.count("\n| ") == len(MEMORY_RUNS) + 1
    assert serving.count("\n| ") == len(SERVING_RUNS) + 1
    assert scored.count("\n| ") == len(RUNS)  # one line per run after the header
    assert reference.count("\n| ") == len(REFERENCE_RUNS) + 1  # and the header
    assert diagnostic.count("\n| ") == len(DIAGNOSTIC_RUNS) + 1
    # every scored run's layout is said under its table, as the other tables' are (an
    # audit: they were in the JSON and plan files alone, the Korthikanti runs' nowhere)
    for row in accuracy.rows:
        assert row.run.note and f"- {row.run.name}: {row.run.note}." in scored, row.run.name
    narrow = Console(width=80, color_system=None, record=True)
    render_accuracy(narrow, accuracy, "table")
    titles = [line.strip() for line in narrow.export_text().splitlines()]
    assert "Diagnostic, not counted: chosen after the table was seen" in titles
    assert len(data["diagnostic"]) == len(DIAGNOSTIC_RUNS)
    table = Console(width=120, color_system=None, record=True)
    render_accuracy(table, accuracy, "table")
    out = table.export_text()
    assert "Mean absolute error" in out and "By GPU: A100 80GB" in out
    # one error column, two senses of fast: the table says which sign is which (review)
    assert "negative in s/step and positive in tokens/s or TFLOP/s" in " ".join(out.split())
    assert out.index("Mean absolute error") < out.index("Reference, layout incomplete")
    # each run names its GPU, training stack and metric: columns at 112 and in markdown;
    # narrower, a heading row opens each group (at 80 the groups were set apart by a blank
    # rule alone, and a run's name took two lines beside the GPU column, then the four of
    # full recompute beside the metric column)
    assert "| GPT 22B, 8 GPUs | A100 80GB | Megatron-LM | s/step |" in text
    assert " stack " in out.splitlines()[2] and "NeMo" in out
    narrow = Console(width=80, color_system=None, record=True)
    render_accuracy(narrow, accuracy, "table")
    lines = narrow.export_text().splitlines()
    assert all(f" {h} " not in lines[2] for h in ("GPU", "stack", "metric"))
    assert all(len(line) <= 80 for line in lines)
    first_mpt = next(i for i, line in enumerate(lines) if line.strip().startswith("MPT 30B"))
    assert lines[first_mpt - 1].strip() == "H100 80GB · llm-foundry · tokens/s/GPU"
    assert lines[first_mpt - 2].strip() == ""  # a section break before the next stack
    # every name keeps its line beside its figures, the longest (full recompute) too
    cells = [line.split() for line in lines]
    every = (*accuracy.rows, *accuracy.reference, *accuracy.diagnostic, *accuracy.memory)
    for row in (*every, *accuracy.serving):
        digits = {"step_s": 2, "peak_bytes": 2, "latency_s": 1}.get(row.run.metric, 0)
        # bytes read in GiB, a batch's seconds in milliseconds
        scale = {"peak_bytes": 2**30, "latency_s": 1e-3}.get(row.run.metric, 1)
        figures = [f"{x / scale:,.{digits}f}" for x in (row.predicted, row.run.measured)]
        assert [*row.run.name.split(), *figures, f"{row.error:+.1%}"] in cells, row.run.name
    # the memory table, its summary under it and a blank line before its notes
    title = next(i for i, line in enumerate(lines) if "Peak memory per GPU against" in line)
    end = next(i for i in range(title, len(lines)) if lines[i].rstrip().endswith("runs."))
    assert "Mean absolute error" in " ".join(lines[title : end + 1])
    assert lines[end + 1] == "" and lines[end + 2].startswith(accuracy.memory[0].run.name)
    # a layout note wraps with its later lines indented, never between a word and its count
    # (at 80 columns "micro" ended a line and "1" began the next: a read at 80 columns)
    notes = lines[end + 2 : lines.index("", end + 2)]
    assert any(line.startswith("  ") for line in notes)
    for above, below in itertools.pairwise(notes):
        assert not (re.search(r"[A-Za-z]$", above) and re.match(r"\s*\d", below)), above
        # nor between a count and its noun ("4" ending a line before "virtual stages")
        assert not (re.search(r"(^|\s)\d[\d,]*$", above) and re.match(r"\s*[a-z]", below)), above
    said = " ".join(" ".join(notes).split())
    assert all(f"{r.run.name}: {r.run.note}" in said for r in accuracy.memory)
    # then, last, the serving table with its own summary, apart from the step times'
    serving = next(i for i, line in enumerate(lines) if "Serving: a static batch's" in line)
    assert title < serving and "Mean absolute error" in " ".join(lines[serving:])
    assert f"over {len(SERVING_RUNS)} runs." in " ".join(" ".join(lines[serving:]).split())


# The FasterTransformer guide's models (head_num × size_per_head = hidden, num_layers): each
# plan's parameters within 2 % of the size its name gives (12·h² a layer and the 51,200 × h
# embedding, by hand: 175B 175.2 B, 89B 87.6 B, 20B 20.2 B, 6.7B 6.65 B, 1.3B 1.31 B, 350M
# 0.356 B, Megatron-530B 529.6 B)
_FT_SIZES = {
    "Megatron-530B": 530e9,
    "GPT-175B": 175e9,
    "GPT-89B": 89e9,
    "GPT-20B": 20e9,
    "GPT-6.7B": 6.7e9,
    "GPT-1.3B": 1.3e9,
    "GPT-350M": 350e6,
}


def test_serving_runs_follow_their_rule_and_are_scored_apart(accuracy) -> None:
    """FasterTransformer's GPT latency tables (the module docstring's rule, fixed before any
    was predicted): from every table, each layout without a pipeline, at the table's longest
    output length, the smallest batch and the largest that ran. 22 runs of seven models; a
    decode plan each whose generate is the table's output length (the context gives the
    first token, then output − 1 decoder passes, as a decode plan's prefill and generate − 1
    passes), measured in seconds, predicted as the report's time for the batch; scored on
    their own, outside the step-time mean."""
    assert len(SERVING_RUNS) == 22
    layouts = {(r.name.split(",")[0], r.tree["parallel"]["tp"]) for r in SERVING_RUNS}
    assert len(layouts) == 11  # 530B at TP 16 and 32, 175B and 89B at 8, 20B at 1-8, 3 at 1
    for run in SERVING_RUNS:
        plan = plan_of(run)
        model = run.name.split(",")[0]
        assert plan.mode == "decode" and run.metric == "latency_s" and run.gpu == "A100 80GB"
        assert plan.parallel.pp == 1 and plan.parallel.dp == 1
        assert plan.topology.gpus == plan.parallel.tp  # one node, or TP / 8 of them
        assert params_total(plan) == pytest.approx(_FT_SIZES[model], rel=0.02), model
        assert run.measured < 12  # seconds: the guide's milliseconds, converted
    # the two ends of each layout: batch 1, then the largest that ran
    batches = [r.tree["batch"]["sequences"] for r in SERVING_RUNS]
    assert batches[::2] == [1] * 11 and min(batches[1::2]) == 16
    assert [r.tree["batch"]["generate"] for r in SERVING_RUNS if "20B" in r.name] == [200] * 8
    rows = accuracy.serving
    assert [r.run for r in rows] == list(SERVING_RUNS)
    for row in rows:
        assert row.predicted == build_report(plan_of(row.run)).step["time_s"]
    assert all(r.run.metric != "latency_s" for r in accuracy.rows)  # not in the step mean
    apart = accuracy.serving_latency()
    assert apart.mean_abs_error == pytest.approx(sum(abs(r.error) for r in rows) / 22)


def test_readme_shows_the_table_the_command_prints(accuracy) -> None:
    """The README's accuracy table is `budget validate-model --format markdown`, verbatim."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert accuracy_markdown(accuracy).strip() in readme


def test_the_readmes_prose_quotes_the_tables_current_figures(accuracy) -> None:
    """Where the README says how far off the model is now (the summary under the table
    and "Where the model is weakest"), it quotes what the command computes, not what an
    earlier stop's table read (an audit found 7.5 % and 12.7 % beside a table of 7.4 % and
    12.9 %)."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    stacks = {a.rows[0].run.stack: a for a in accuracy.by_stack()}
    nemo, foundry = stacks["NeMo"], stacks["llm-foundry"]
    assert f"({nemo.mean_abs_error:.1%} mean) for NVIDIA's own NeMo runs".replace("%", " %") in (
        readme
    )
    assert f"({foundry.mean_abs_error:.1%} mean) for MosaicML's".replace("%", " %") in readme
    # each stack's range, as whole percents of the same errors (a final read: 8 to 18 %
    # beside rows of 9.1 % to 19.9 %)
    for stack in (nemo, foundry):
        errors = [abs(r.error) * 100 for r in stack.rows]
        span = f"by {min(errors):.0f} to {max(errors):.0f} % ({stack.mean_abs_error:.1%} mean)"
        assert span.replace("% mean", " % mean") in readme, span
    assert f"fast by {nemo.mean_abs_error:.1%} on average".replace("%", " %") in readme
    assert f"by {nemo.mean_abs_error:.1%} on average, at every".replace("%", " %") in readme
    closest = min(nemo.rows, key=lambda r: abs(r.error))
    furthest = max(nemo.rows, key=lambda r: abs(r.error))
    assert f"{closest.run.name.split(',')[0]} on one node is closest ({closest.error:.1%})" in (
        readme.replace(" %", "%").replace("−", "-")
    )
    assert f"furthest ({furthest.error:.1%} on 2,048 GPUs)" in (
        readme.replace(" %", "%").replace("−", "-")
    )
    # the A100 bullet's two ends (an audit found -7.9 % and +2.1 % beside -7.8 % and +2.2 %)
    megatron = stacks["Megatron-LM"].rows
    low, high = min(megatron, key=lambda r: r.error), max(megatron, key=lambda r: r.error)
    assert low.run.name.startswith("GPT 22B") and high.run.name.startswith("GPT 1T")
    assert (
        f"most optimistic ({low.error:.1%}), 1T the most pessimistic ({high.error:+.1%})"
        in readme.replace(" %", "%").replace("−", "-")
    )
    # the reference rows' errors the weak points quote (an audit: −9.3 % and 11.5 % beside
    # rows of −9.1 % and −11.4 %)
    plain = readme.replace(" %", "%").replace("−", "-")
    ref = {r.run.name: r.error for r in accuracy.reference}
    assert f"row's agreement ({ref['Llama 3 405B, 8,192 GPUs']:.1%}) leans" in plain
    long = ref["Llama 3 405B, 16,384 GPUs, 128K context"]
    assert f"the model is {abs(long):.1%} slow" in plain and f"({long:.1%} now:" in plain
    assert f"so the 16,384-GPU row is {abs(ref['Llama 3 405B, 16,384 GPUs']):.0%} slow" in plain


def test_the_readmes_prose_quotes_the_timed_ci_tests(accuracy) -> None:
    """The diagnostic rows timing Megatron-LM's memory tests: the README quotes their errors
    as the command computes them, and says they ran in deterministic mode."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    rows = {r.run.name: r for r in accuracy.diagnostic}
    tp, pp, moe = (
        f"{abs(rows[name].error):.1%}".replace("%", " %")
        for name in (
            "GPT 7B, TP 4, 8 GPUs, timed",
            "GPT 7B, PP 4 interleaved, timed",
            "MoE with MLA and MTP, timed",
        )
    )
    assert f"are predicted {tp} and {pp} faster than they ran" in readme
    assert f"unfused attention {moe}, but CI runs them in deterministic mode" in readme
    assert "Megatron-LM tests" in {r.run.stack for r in accuracy.diagnostic}
    assert all(rows[n].error < 0 for n in rows if n.endswith("timed"))


def test_the_readmes_serving_prose_quotes_what_the_command_computes(accuracy) -> None:
    """The serving paragraph's figures: the GPT-20B one-GPU and GPT-350M errors, and the
    350M batch-1 decoder pass, measured (the run less the engine's prefill, over its 31
    passes) against the engine's."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    rows = {r.run.name: r for r in accuracy.serving}

    def pct(name: str) -> str:
        return f"{abs(rows[name].error):.1%}".replace("%", " %")

    one_gpu = f"{pct('GPT-20B, TP 1, batch 1')} and {pct('GPT-20B, TP 1, batch 64')}"
    assert f"(GPT-20B on one GPU: {one_gpu})" in readme
    small = f"{pct('GPT-350M, TP 1, batch 1')} at batch 1, {pct('GPT-350M, TP 1, batch 64')}"
    assert f"(GPT-350M: {small} at batch 64)" in readme
    row = rows["GPT-350M, TP 1, batch 1"]
    report = build_report(plan_of(row.run))
    prefill, engine_pass = report.step["ttft_s"], report.step["decode_token_s"]
    passes = row.run.tree["batch"]["generate"] - 1
    measured_pass = (row.run.measured - prefill) / passes
    assert row.predicted == pytest.approx(prefill + passes * engine_pass)
    assert f"decoder pass in {measured_pass * 1e3:.2f} ms" in readme
    assert f"cache in {engine_pass * 1e3:.2f} ms" in readme
    startup = plan_of(row.run).device.kernel_startup
    assert f"the engine's {startup * 1e6:.2f} µs a kernel on the A100" in readme
    serving = accuracy.serving_latency()
    assert f"by {serving.mean_abs_error:.1%} on average".replace("%", " %") in readme
    least, most = (f(abs(r.error) for r in rows.values()) for f in (min, max))
    assert f"(FasterTransformer on A100, {least * 100:.1f}–{most * 100:.1f} % fast)" in readme


def _table_with(change) -> Accuracy:
    """The scored table with each run's plan tree changed by `change(tree, run)`."""
    import copy
    from dataclasses import replace

    runs = []
    for run in RUNS:
        tree = copy.deepcopy(run.tree)
        change(tree, run)
        runs.append(replace(run, tree=tree))
    return validate_model(tuple(runs), (), (), ())


def test_the_readmes_what_ifs_are_computed_now() -> None:
    """The README says what three choices are worth by what the table would read without
    them (the overlap slowdown, the recipes' fp32 reduction, NVLink's bandwidth ramp);
    those figures drifted from 9.7 % and 16.9 % to a stale 13.2 % and 23.0 % as the
    model moved under them (an audit), so they are computed here."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())

    def pct(x: float) -> str:
        return f"{x:.1%}".replace("%", " %")

    def no_slowdown(tree: dict, run) -> None:
        tree.setdefault("overlap", {})["slowdown"] = 0

    table = _table_with(no_slowdown)
    stacks = {a.rows[0].run.stack: a for a in table.by_stack()}
    a100, nemo, foundry = stacks["Megatron-LM"], stacks["NeMo"], stacks["llm-foundry"]
    said = (
        f"`slowdown: 0` the mean would be {pct(table.mean_abs_error)} (A100 "
        f"{pct(a100.mean_abs_error)} and {pct(a100.max_abs_error)} at most, H100 NeMo "
        f"{pct(nemo.mean_abs_error)} and {pct(nemo.max_abs_error)}, llm-foundry "
        f"{pct(foundry.mean_abs_error)} and {pct(foundry.max_abs_error)})"
    )
    assert said in readme

    def bf16_reduce(tree: dict, run) -> None:
        if run.stack == "llm-foundry":
            tree["precision"]["grad_reduce"] = "bf16"

    def flat_nvlink(tree: dict, run) -> None:
        # the DGX A100 preset's levels written out without the NVLink ramp (its plateau,
        # latency and InfiniBand level kept): the A100 rows without the ramp
        from budget.catalog import TOPOLOGIES

        if tree["topology"].get("preset") != "dgx-a100":
            return
        nvlink, infiniband = TOPOLOGIES["dgx-a100"].levels
        tree["topology"] = {
            "gpus": 8 * tree["topology"]["nodes"],
            "levels": [
                {
                    "name": "nvlink",
                    "size": 8,
                    "bandwidth": f"{nvlink.rate * nvlink.fraction} B/s",
                    "latency": f"{nvlink.latency} s",
                },
                {
                    "name": "infiniband",
                    "bandwidth": f"{infiniband.rate * infiniband.fraction} B/s",
                    "latency": f"{infiniband.latency} s",
                },
            ],
        }

    flat = {a.rows[0].run.stack: a for a in _table_with(flat_nvlink).by_stack()}["Megatron-LM"]
    said = f"the A100 rows would be {pct(flat.mean_abs_error)} mean and {pct(flat.max_abs_error)}"
    assert said + " at most" in readme

    foundry = {a.rows[0].run.stack: a for a in _table_with(bf16_reduce).by_stack()}
    mean = pct(foundry["llm-foundry"].mean_abs_error)
    assert f"they would be {mean} mean now" in readme
    before = {r.run.name: r.error for r in _table_with(lambda tree, run: None).rows}
    moved = [r.error - before[r.run.name] for r in foundry["llm-foundry"].rows]
    span = f"{min(moved) * 100:.0f} to {max(moved) * 100:.0f}"
    assert f"predicted {span} points faster ({mean} mean)" in readme


def test_every_run_is_written_as_a_plan_that_budgets_to_its_row(tmp_path, accuracy) -> None:
    """`--write-plans DIR` writes each scored, reference and diagnostic run as a plan file
    whose `budget` report gives that row's prediction, so one row can be rerun alone."""
    from typer.testing import CliRunner

    from budget.accuracy import metric_of
    from budget.cli import app, route
    from budget.plan.load import load_plan

    target = tmp_path / "runs"
    result = CliRunner().invoke(
        app, route(["validate-model", "--write-plans", str(target), "--format", "json"])
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mean_abs_error"] == pytest.approx(accuracy.mean_abs_error)
    rows = (
        accuracy.rows + accuracy.reference + accuracy.diagnostic + accuracy.memory
    ) + accuracy.serving
    files = sorted(target.glob("*.yaml"))
    runs = (RUNS, REFERENCE_RUNS, DIAGNOSTIC_RUNS, MEMORY_RUNS, SERVING_RUNS)
    assert len(files) == len(rows) == sum(map(len, runs))
    from budget.accuracy import plan_file_name

    for row in rows:
        path = target / plan_file_name(row.run)
        text = path.read_text(encoding="utf-8")
        schema = text.partition("\n")[0].split("$schema=", 1)[1]
        assert (target / schema).resolve().name == "plan.schema.json"
        assert (target / schema).resolve().exists()
        assert f"# Measured: {measured_text(row.run)}" in text
        plan = load_plan(path)
        predicted = metric_of(plan, row.run.metric)
        assert predicted == pytest.approx(row.predicted, rel=1e-12), row.run.name
        # named as its row: a timed diagnostic kept its memory row's name (an audit, m399)
        assert plan.name == row.run.name


def test_write_plans_into_a_file_is_a_usage_error(tmp_path) -> None:
    from typer.testing import CliRunner

    from budget.cli import app, route

    blocker = tmp_path / "taken"
    blocker.write_text("", encoding="utf-8")
    result = CliRunner().invoke(app, route(["validate-model", "--write-plans", str(blocker)]))
    assert result.exit_code == 2
    assert "--write-plans" in result.output and "Traceback" not in result.output
    assert "is a file; name a folder to write the plans in" in result.output  # not "File exists"
    # a name with a line break stays on the error's one line (review)
    odd = tmp_path / "a\nb"
    odd.write_text("", encoding="utf-8")
    result = CliRunner().invoke(app, route(["validate-model", "--write-plans", str(odd)]))
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"budget: error: --write-plans {tmp_path}/a\\nb")


def test_a_run_the_memory_model_puts_over_its_memory_is_named(accuracy) -> None:
    """Every run ran; one whose plan the engine puts over the device's memory is a miss of
    the memory model, named in the summary with its worst stage and in the JSON."""
    from budget.render.accuracy import accuracy_dict, accuracy_markdown

    over = [r for r in (*accuracy.rows, *accuracy.reference, *accuracy.diagnostic) if not r.fits]
    text = accuracy_markdown(accuracy)
    rows = {r["name"]: r for r in accuracy_dict(accuracy)["runs"]}
    for r in over:
        assert r.peak_bytes > r.capacity_bytes
        assert f"{r.run.name} (worst stage {r.peak_bytes / 2**30:.1f} GiB" in text
        if r in accuracy.rows:
            assert rows[r.run.name]["fits"] is False
    assert all(rows[r.run.name]["fits"] for r in accuracy.rows if r.fits)
    # the same words for a run made to miss, whatever the table holds today
    from dataclasses import replace

    first = accuracy.rows[0]
    missed = replace(first, peak_bytes=90 * 2**30, capacity_bytes=80 * 2**30)
    text = accuracy_markdown(Accuracy((missed, *accuracy.rows[1:])))
    assert f"puts it over its GPUs' memory: {first.run.name} (worst stage 90.0 GiB of 80.0)" in text
    assert "This run ran, where" in text
    two = accuracy_markdown(Accuracy((missed, missed, *accuracy.rows[1:])))
    assert "These runs ran, where the memory model puts them over their GPUs' memory:" in two
    # said under the table that holds the run, not under the scored one (an audit): a
    # reference run made to miss is named after the reference table, never before it
    from budget.render.accuracy import _REFERENCE

    ref = replace(first, peak_bytes=90 * 2**30, capacity_bytes=80 * 2**30)
    text = accuracy_markdown(Accuracy(accuracy.rows, reference=(ref,)))
    said = text.index(f"puts it over its GPUs' memory: {first.run.name}")
    assert text.index(_REFERENCE) < said
    assert "GPUs' memory" not in text[: text.index(_REFERENCE)]


@pytest.mark.parametrize(
    ("prefix", "grads", "master", "state"),
    [
        # Llama 3.1 launcher configs: distributed_fused_adam, no dtype -> fp32 state, fp32
        # gradients, and the fp32 master as a 16-bit remainder (2 B, priced as bf16)
        ("Llama 3.1", "fp32", "bf16", "fp32"),
        # nemotron4-15b-synth.yaml: mcore_distributed_optim -> fp32 throughout
        ("Nemotron-4 15B", "fp32", "fp32", "fp32"),
        # nemotron4-340b-synth.yaml: grad_sync_dtype bf16, dtype bf16 -> no master
        ("Nemotron-4 340B", "bf16", None, "bf16"),
        # gpt3_175b_hydra.yaml: grad_sync_dtype bf16, fp8_params true -> fp32 master
        ("GPT-3 175B, 1", "bf16", "fp32", "fp32"),
        ("GPT-3 175B, 2", "bf16", "fp32", "fp32"),
    ],
)
def test_nemo_plans_keep_the_formats_their_recipe_configures(prefix, grads, master, state):
    runs = [r for r in RUNS if r.stack == "NeMo" and r.name.startswith(prefix)]
    assert runs
    for run in runs:
        p = plan_of(run).precision
        assert (p.grads, p.master, p.optimizer_state) == (grads, master, state), run.name


def test_the_readmes_data_parallel_figures_for_llama_8b_are_the_plans() -> None:
    """ "Where the model is weakest" argues that scale is not the NeMo gap: Llama 3.1 8B
    measures 0.38 s more a step on 128 GPUs than on 8, and its data-parallel collectives
    take 0.13 s there, 8 ms of it exposed, 12 ms more than on 8 (it said 0.24 s, the two
    counts summed: an audit)."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    runs = {r.name: r for r in RUNS}
    small, large = runs["Llama 3.1 8B, 8 GPUs"], runs["Llama 3.1 8B, 128 GPUs"]

    def dp(run: Run) -> tuple[float, float]:
        report = build_report(plan_of(run))
        moves = [
            (c.time_s * c.count * p.count, c.exposed_s * c.count * p.count)
            for p in report.phases
            for c in p.collectives
            if c.group.startswith("dp")
        ]
        return sum(t for t, _ in moves), sum(e for _, e in moves)

    (total, exposed), (before, _) = dp(large), dp(small)
    said = (
        f"{large.measured - small.measured:.2f} s more a step on 128 GPUs than on 8, where all "
        f"its data-parallel collectives together take {total:.2f} s ({exposed * 1e3:.0f} ms of "
        f"it exposed), {(total - before) * 1e3:.0f} ms more than on 8 GPUs"
    )
    assert said in readme


def test_the_readmes_backward_gather_figures_for_mpt_are_the_plans() -> None:
    """ "Where the model is weakest" says what pricing the MPT runs' backward all-gathers
    exposed would add to their steps (Composer's BACKWARD_POST default): each H100 run's
    backward gathers, every call of every instance, less the slowdown each already adds to
    the compute beside it while hidden (a review: 9.1 % where 7.4 % is added), over its
    step, the least and the most."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    shares = {}
    for run in RUNS:
        if run.stack != "llm-foundry" or run.gpu != "H100 80GB":
            continue
        report = build_report(plan_of(run))
        gathers = sum(  # a collective's count is its calls in the step, every instance's
            (c.time_s - c.slowdown_s) * c.count
            for p in report.phases
            if p.name.startswith("backward.")
            for c in p.collectives
            if c.op == "all-gather"
        )
        shares[run.name.split(",")[0].removeprefix("MPT ")] = gathers / report.step["time_s"]
    least, most = min(shares, key=shares.__getitem__), max(shares, key=shares.__getitem__)
    said = (
        f"they would add {shares[least]:.1%} ({least}) to {shares[most]:.1%} ({most}) to these "
        "steps"
    ).replace("%", " %")
    assert said in readme, (said, shares)


def test_the_readmes_a100_to_h100_speedups_for_mpt_are_the_tables(accuracy) -> None:
    """ "Where the model is weakest" parts the MPT gap between the stack and the H100 by
    the speed-up of each model from its A100 diagnostic row to its scored H100 row (same
    model, micro-batch and 8 GPUs), measured against predicted: the ranges of both, the
    model whose two agree best (within a point: 0.6 of one once the stack's optimizer loop
    and LayerNorm were priced, m352) and the one the engine puts furthest over."""
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    h100 = {r.run.name.split(",")[0]: r for r in accuracy.rows if r.run.stack == "llm-foundry"}
    a100 = {
        r.run.name.split(",")[0]: r for r in accuracy.diagnostic if r.run.stack == "llm-foundry"
    }
    assert set(h100) == set(a100) and len(h100) == 5
    measured = {k: h100[k].run.measured / a100[k].run.measured for k in h100}
    predicted = {k: h100[k].predicted / a100[k].predicted for k in h100}
    over = {k: predicted[k] / measured[k] - 1 for k in h100}
    alike, furthest = min(over, key=lambda k: abs(over[k])), max(over, key=over.__getitem__)
    said = (
        f"ran {min(measured.values()):.2f} to {max(measured.values()):.2f} times as fast, where "
        f"the engine puts it {min(predicted.values()):.2f} to {max(predicted.values()):.2f} "
        f"times (the {alike.removeprefix('MPT ')} within {abs(over[alike]):.0%}, the "
        f"{furthest.removeprefix('MPT ')} "
        f"{over[furthest]:.0%} further)"
    ).replace("%", " %")
    assert abs(over[alike]) < 0.01, over
    assert said in readme, said


def test_each_row_in_json_names_its_unit(accuracy) -> None:
    """An audit, m483: Meta's rows are in TFLOP/s (as published), where every other FLOP
    rate of the JSON is in FLOP/s, and no row said its unit."""
    from budget.render.accuracy import accuracy_dict

    tree = accuracy_dict(accuracy)
    tables = [tree["runs"], tree["reference"], tree["diagnostic"]]
    tables += [tree["memory"]["runs"], tree["serving"]["runs"]]
    units = {(r["metric"], r["unit"]) for rows in tables for r in rows}
    assert ("tflops_per_gpu", "TFLOP/s") in units and ("step_s", "s") in units
    assert ("peak_bytes", "bytes") in units and ("latency_s", "s") in units
    assert ("tokens_per_s_per_gpu", "tokens/s") in units and len(units) == 5
