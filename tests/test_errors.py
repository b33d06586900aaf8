"""Problems as users read them: clipped quotes, and a count past the first 200."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app
from budget.errors import BudgetError
from budget.plan.load import load_plan

runner = CliRunner()


def test_a_problem_quotes_a_hostile_value_clipped() -> None:
    """A 5,000,000-digit number or a 900 KB model_type was echoed whole on stderr."""
    from budget.errors import MAX_MESSAGE, Problem

    problem = Problem("p.yaml", 3, 5, "$.model.hf_config", "model_type = " + "x" * 900_000)
    line = str(problem)
    assert line.startswith("p.yaml:3:5: error: $.model.hf_config: model_type = xxx")
    assert line.endswith("... (899,653 characters more)")
    assert len(line) < MAX_MESSAGE + 60
    assert str(Problem("p.yaml", 1, 1, "$", "short")) == "p.yaml:1:1: error: $: short"


def test_hundreds_of_problems_print_the_first_two_hundred_and_a_count(tmp_path: Path) -> None:
    """Every problem is found; stderr shows the first 200 by position and counts the rest
    (30,000 faulty transitions printed 210,000 lines)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("".join(f"k{i}: 1\n" for i in range(500)), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(plan)])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 201
    assert lines[0].startswith(f"{plan}:1:1: error: $: ")
    with pytest.raises(BudgetError) as caught:
        load_plan(plan)
    found = caught.value.problems  # 500 unknown keys and the required ones missing
    assert len(found) > 500 and lines[:-1] == [str(p) for p in found[:200]]
    assert lines[-1] == f"budget: error: {len(found) - 200} more problems (the first 200 are above)"
