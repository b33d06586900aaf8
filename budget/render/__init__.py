"""Renderers: they take a Console and plain report data, and do no other I/O."""

from __future__ import annotations

import codecs
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from budget.report import Report


NBSP = "\u00a0"  # a space a line does not break at: keeps a figure by its name or unit


def dump_json(data: Any, stream: Any = None) -> str:
    """JSON as the reports promise it: stable key order, no NaN, two-space indent. For a
    `stream` that is not UTF (``PYTHONIOENCODING=ascii``), what is not ASCII is escaped
    (``\\u00b5``): the same JSON, where the stream's ``?`` for it would change a value."""
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=not utf(stream)) + "\n"


def dump_document(data: dict[str, Any], stream: Any = None) -> str:
    """A command's whole JSON output (`dump_json`), its ``schema_version`` first: the version
    of ``schemas/report.schema.json`` it follows, which a reader checks before the rest."""
    from budget.report_schema import SCHEMA_VERSION

    return dump_json({"schema_version": SCHEMA_VERSION, **data}, stream)


def utf(stream: Any) -> bool:
    """Whether `stream` (None: a string) takes every character: its encoding is a UTF."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def render_report(console: Console, report: Report, fmt: str) -> None:
    """Render one plan's report as a table, markdown or JSON."""
    if fmt == "json":
        from budget.report import to_dict

        console.file.write(dump_json(to_dict(report), console.file))
    elif fmt == "markdown":
        from budget.render.markdown import render_markdown

        console.file.write(render_markdown(report))
    else:
        from budget.render.table import render_table

        render_table(console, report)
