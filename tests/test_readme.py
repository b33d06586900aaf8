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


def test_the_readmes_plan_from_scratch_budgets_as_it_says(tmp_path) -> None:
    """The README's minimal plan is valid and prices at the figures the sentence after it
    gives (a user audit: the README had no complete plan to start from)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(
        r"A plan from scratch.*?```yaml\n(.*?)```\n\nIt prices at ([^\n]*)", readme, re.S
    )
    assert block is not None
    plan = tmp_path / "plan.yaml"
    plan.write_text(block.group(1), encoding="utf-8")
    from budget.pipeline import budget_plan
    from budget.units import format_bytes, format_duration

    report = budget_plan(plan)
    said = block.group(2)
    assert f"{format_duration(report.step['time_s'])} a step" in said
    assert f"MFU {report.step['mfu']:.1%}".replace("%", " %") in said
    assert f"{format_bytes(report.worst.peak_bytes)} peak" in said


def test_the_readme_names_the_schema_version_the_commands_write() -> None:
    """The README said 1.11 while every document said 1.14 (an audit)."""
    from budget.report_schema import SCHEMA_VERSION

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"first key is `schema_version` ({SCHEMA_VERSION})" in readme


def test_the_readmes_nearest_peak_is_what_the_search_says() -> None:
    """The least peak the README quotes for GPT-3's search on 8 GPUs is the search's own
    sentence (an audit, m449: the README said 369 GiB where the search says 368)."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    quoted = re.search(r'\("(No layout peaks under [^"]*)" for GPT-3 on 8 GPUs\)', readme)
    assert quoted is not None
    plan = str(ROOT / "plans" / "gpt3-175b.yaml")
    result = CliRunner().invoke(app, route(["search", plan, "--gpus", "8"]))
    assert result.exit_code == 1
    assert quoted.group(1) in " ".join(result.stdout.split())


def test_the_readmes_mixed_link_pipeline_steps_as_it_says(tmp_path) -> None:
    """The README's gpt-1.3b at tp 2 x pp 8 over two DGX A100 nodes, each stage's sends on
    its own pair's link: the step it quotes is the report's."""
    from budget.pipeline import budget_plan
    from budget.units import format_duration

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = re.search(r"only the two stages beside that one pay for it \(([^ ]+ ms) a step", readme)
    assert said is not None
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    for old, new in (
        ("  tp: 1\n  pp: 1\n  dp: 8\n", "  tp: 2\n  pp: 8\n  dp: 1\n"),
        ("  micro: 4\n  global: 512\n", "  micro: 1\n  global: 16\n"),
        ("nodes: 1}", "nodes: 2}"),
    ):
        assert text.count(old) == 1
        text = text.replace(old, new)
    plan = tmp_path / "mixed.yaml"
    plan.write_text(text, encoding="utf-8")
    assert format_duration(budget_plan(plan).step["time_s"]) == said.group(1)
