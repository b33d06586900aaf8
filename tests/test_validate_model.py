"""The model against published runs (`budget.accuracy`, `budget validate-model`).

Issue 7 asks for a mean absolute error of at most 5 % and no run worse than 10 %. The model
does not meet it today (README, "Accuracy against published runs": the A100 selective-
recompute rows are predicted 3-13 % fast, and the five single-node FSDP MPT runs on H100
33-75 % fast), so that test is a strict expected failure: it turns into a failure the day
the time model meets the bar, and the marker must then go. The Llama 3 405B rows are shown
for reference only (their interleaving degree is unpublished) and are not scored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from budget.accuracy import DIAGNOSTIC_RUNS, REFERENCE_RUNS, RUNS, plan_of, validate_model
from budget.layers import params_total
from budget.render.accuracy import accuracy_markdown, render_accuracy
from budget.report_schema import validation_errors


@pytest.fixture(scope="module")
def accuracy():
    return validate_model()


def test_at_least_six_runs_on_two_generations() -> None:
    assert len(RUNS) >= 6
    assert len({run.gpu for run in RUNS}) >= 2
    assert all(run.source for run in RUNS)


def test_every_run_is_predicted(accuracy) -> None:
    """A sanity bound, not the accuracy bar: no prediction is off by a factor of two."""
    for row in (*accuracy.rows, *accuracy.reference):
        assert row.predicted > 0
        assert abs(row.error) < 1.0, row.run.name


@pytest.mark.xfail(strict=True, reason="A100 rows up to 13 % fast; MPT FSDP rows 33-75 % fast")
def test_mean_within_5_percent_and_max_within_10(accuracy) -> None:
    assert accuracy.mean_abs_error <= 0.05
    assert accuracy.max_abs_error <= 0.10


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
    models; those rows were picked after the scored ones were seen, so they are shown only."""
    names = [run.name.replace("8 A100s", "8 GPUs") for run in DIAGNOSTIC_RUNS]
    assert names == list(_MPT_PARAMS)
    for name, run in zip(names, DIAGNOSTIC_RUNS, strict=True):
        plan = plan_of(run)
        assert params_total(plan) == _MPT_PARAMS[name]
        assert run.gpu == "A100 80GB" and plan.device.name == "a100-80gb"
        assert "A100 80GB" in run.source
    assert [r.run for r in accuracy.diagnostic] == list(DIAGNOSTIC_RUNS)
    assert not [run for run in DIAGNOSTIC_RUNS if run in RUNS]
    assert len(accuracy.rows) == len(RUNS)


def test_llama_rows_are_reference_not_scored(accuracy) -> None:
    assert not [run for run in RUNS if run.name.startswith("Llama")]
    assert len(REFERENCE_RUNS) == 3
    assert all(run.name.startswith("Llama 3") for run in REFERENCE_RUNS)
    assert all("unpublished" in run.note for run in REFERENCE_RUNS)
    assert [r.run for r in accuracy.reference] == list(REFERENCE_RUNS)
    errors = [abs(r.error) for r in accuracy.rows]
    assert accuracy.mean_abs_error == pytest.approx(sum(errors) / len(RUNS))
    assert accuracy.max_abs_error == max(errors)


def test_renderers(accuracy) -> None:
    console = Console(width=120, color_system=None, record=True)
    render_accuracy(console, accuracy, "json")
    data = json.loads(console.export_text())
    assert len(data["runs"]) == len(RUNS)
    assert len(data["reference"]) == len(REFERENCE_RUNS)
    assert data["max_abs_error"] == pytest.approx(accuracy.max_abs_error)
    assert validation_errors(data, "validate_model") == []
    by_gpu = {part["gpu"]: part for part in data["by_gpu"]}
    assert sum(part["runs"] for part in by_gpu.values()) == len(RUNS)
    for gpu, part in by_gpu.items():
        errors = [abs(r["error"]) for r in data["runs"] if r["gpu"] == gpu]
        assert part["runs"] == len(errors)
        assert part["mean_abs_error"] == pytest.approx(sum(errors) / len(errors))
        assert part["max_abs_error"] == max(errors)
    text = accuracy_markdown(accuracy)
    scored, _, rest = text.partition("Reference, layout incomplete")
    reference, _, diagnostic = rest.partition("Diagnostic, chosen after")
    assert scored.count("\n| ") == len(RUNS)  # one line per run after the header
    assert reference.count("\n| ") == len(REFERENCE_RUNS) + 1  # and the header
    assert diagnostic.count("\n| ") == len(DIAGNOSTIC_RUNS) + 1
    assert len(data["diagnostic"]) == len(DIAGNOSTIC_RUNS)
    table = Console(width=120, color_system=None, record=True)
    render_accuracy(table, accuracy, "table")
    out = table.export_text()
    assert "Mean absolute error" in out and "By GPU: A100 80GB" in out
    assert out.index("Mean absolute error") < out.index("Reference, layout incomplete")


def test_readme_shows_the_table_the_command_prints(accuracy) -> None:
    """The README's accuracy table is `budget validate-model --format markdown`, verbatim."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert accuracy_markdown(accuracy).strip() in readme
