"""Renderers: they take a Console and plain report data, and do no other I/O."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from budget.report import Report


def dump_json(data: Any) -> str:
    """JSON as the reports promise it: stable key order, no NaN, two-space indent."""
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def render_report(console: Console, report: Report, fmt: str) -> None:
    """Render one plan's report as a table, markdown or JSON."""
    if fmt == "json":
        from budget.report import to_dict

        console.file.write(dump_json(to_dict(report)))
    elif fmt == "markdown":
        from budget.render.markdown import render_markdown

        console.file.write(render_markdown(report))
    else:
        from budget.render.table import render_table

        render_table(console, report)
