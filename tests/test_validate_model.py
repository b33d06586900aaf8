"""The model against published runs (`budget.accuracy`, `budget validate-model`).

Issue 7 asks for a mean absolute error of at most 5 % and no run worse than 10 %. The model
does not meet it today (README, "Accuracy against published runs": the A100 selective-
recompute rows are 3-14 % fast, and Llama 3's interleaving degree is not published, so its
16,384-GPU row is 20 % slow under plain 1F1B), so that test is a strict expected failure: it
turns into a failure the day the time model meets the bar, and the marker must then go.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from budget.accuracy import RUNS, validate_model
from budget.render.accuracy import accuracy_markdown, render_accuracy


@pytest.fixture(scope="module")
def accuracy():
    return validate_model()


def test_at_least_six_runs_on_two_generations() -> None:
    assert len(RUNS) >= 6
    assert len({run.gpu for run in RUNS}) >= 2
    assert all(run.source for run in RUNS)


def test_every_run_is_predicted(accuracy) -> None:
    for row in accuracy.rows:
        assert row.predicted > 0
        assert abs(row.error) < 0.5, row.run.name


@pytest.mark.xfail(strict=True, reason="A100 rows up to 14 % fast; Llama 3 VP unpublished")
def test_mean_within_5_percent_and_max_within_10(accuracy) -> None:
    assert accuracy.mean_abs_error <= 0.05
    assert accuracy.max_abs_error <= 0.10


def test_renderers(accuracy) -> None:
    console = Console(width=120, color_system=None, record=True)
    render_accuracy(console, accuracy, "json")
    data = json.loads(console.export_text())
    assert len(data["runs"]) == len(RUNS)
    assert data["max_abs_error"] == pytest.approx(accuracy.max_abs_error)
    text = accuracy_markdown(accuracy)
    assert text.count("\n| ") == len(RUNS)  # one line per run after the header
    table = Console(width=120, color_system=None, record=True)
    render_accuracy(table, accuracy, "table")
    assert "mean absolute error" in table.export_text()
