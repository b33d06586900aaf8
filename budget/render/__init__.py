"""Renderers: they take a Console and plain report data, and do no other I/O."""

from __future__ import annotations

import codecs
import json
import re
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from budget.report import Report


NBSP = "\u00a0"  # a space a line does not break at: keeps a figure by its name or unit
# a word and the count after it ("micro 1", "tp 8"), or a count and its noun ("4 virtual"),
# held on one line by `print_wrapped`
_COUNTED = re.compile(r"\b([A-Za-z]+) (\d[\d,]*)\b")
_COUNT_OF = re.compile(r"(?<![\x00\d,])\b(\d[\d,]*) ([A-Za-z]+)\b")  # not one held already


def print_wrapped(console: Console, text: str, indent: str = "  ") -> None:
    """`text` wrapped to the console's width, its later lines indented by `indent`, never
    between a word and the count after it or a count and its noun: at 80 columns "micro"
    ended a line and "1" began the next (an audit), and "4" ended one before "virtual
    stages" (a review). Wrapped here rather than by rich, which breaks lines at a no-break
    space too."""
    from rich.text import Text

    glue = "\x00"
    held = _COUNT_OF.sub(rf"\1{glue}\2", _COUNTED.sub(rf"\1{glue}\2", text))
    lines = textwrap.wrap(
        held,
        max(console.width, 40),
        subsequent_indent=indent,
        break_on_hyphens=False,
    )
    for line in lines:
        console.print(Text(line.replace(glue, " ")), soft_wrap=True)


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
