"""The README's example output is what the command prints today."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from budget.cli import app, route
from tests.plan_files import ROOT


def test_the_readme_example_is_the_commands_output() -> None:
    """Every line the README shows under `$ budget plans/gpt3-175b.yaml` (after its `...`)
    appears in the report, words and figures alike; the console's wrapping aside."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ budget plans/gpt3-175b\.yaml[^\n]*\n\.\.\.\n(.*?)```", readme, re.S)
    assert block is not None
    shown = " ".join(block.group(1).split())
    result = CliRunner().invoke(
        app, route([str(ROOT / "plans" / "gpt3-175b.yaml")]), env={"COLUMNS": "200"}
    )
    printed = " ".join(result.stdout.split())
    for sentence in re.split(r" (?=Exposed communication|Fits\.|Does not fit)", shown):
        assert sentence.strip() in printed, sentence


def test_the_readme_ci_gate_passes_on_the_shipped_plans() -> None:
    """The GitHub Actions job the README shows runs `budget check` on plans/*.yaml with
    limits; on this repository's own plans it passes."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"budget check plans/\*\.yaml ([^\n\\]*)", readme)
    assert command is not None
    args = command.group(1).split()
    plans = sorted(str(p) for p in (ROOT / "plans").glob("*.yaml"))
    result = CliRunner().invoke(app, route(["check", *plans, *args]))
    assert result.exit_code == 0, result.stdout
