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

    message = "model_type = " + "x" * 900_000
    problem = Problem("p.yaml", 3, 5, "$.model.hf_config", message)
    line = str(problem)
    assert line.startswith("p.yaml:3:5: error: $.model.hf_config: model_type = xxx")
    # the first MAX_MESSAGE − 40 characters are shown (room for the count), and the count
    # is the rest: 900,013 − 760 = 899,253
    shown = MAX_MESSAGE - 40
    more = len(message) - shown
    assert more == 899_253
    assert (
        line
        == f"p.yaml:3:5: error: $.model.hf_config: {message[:shown]}... ({more:,} characters more)"
    )
    assert len(line) < MAX_MESSAGE + 60
    assert str(Problem("p.yaml", 1, 1, "$", "short")) == "p.yaml:1:1: error: $: short"


def test_a_quoted_line_break_stays_on_its_problem_s_line(tmp_path: Path) -> None:
    """``model: "\\x1E"`` (a record separator, a line boundary to str.splitlines) was quoted
    raw in the preset hint, so stderr had a line that did not begin with the file (found by
    the fuzz test in test_invalid_corpus). Every line break a reader may split on is shown
    escaped, and the hint is offered only for a printable name."""
    from budget.errors import Problem

    breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    line = str(Problem("p.yaml", 1, 1, "$.a" + breaks, "x" + breaks))
    assert line.splitlines() == [line]
    assert line.endswith(r"x\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    named = str(Problem("a\nb.yaml", 2, 3, "$", "m"))  # a file name too (review)
    assert named == r"a\nb.yaml:2:3: error: $: m"
    plan = tmp_path / "plan.yaml"
    plan.write_text('model: "\\x1E"\n', encoding="utf-8")
    result = runner.invoke(app, ["validate", str(plan)])
    assert result.exit_code == 2
    assert all(line.startswith(f"{plan}:") for line in result.stderr.splitlines())
    assert f"{plan}:1:8: error: $.model: '\\x1e' is not a mapping\n" in result.stderr


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
