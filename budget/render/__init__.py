"""Renderers: they take a Console and plain report data, and do no other I/O."""

from __future__ import annotations

import codecs
import json
import re
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement
    from rich.text import Text

    from budget.report import Report


NBSP = "\u00a0"  # a space a line does not break at: keeps a figure by its name or unit
# a word and the count after it ("micro 1", "tp 8"), or a count and its noun ("4 virtual"),
# held on one line by `held_lines`; a figure's decimals end at its unit ("8.46 GiB", "437 µs")
_COUNTED = re.compile(r"\b([A-Za-zα-ω]+) (\d[\d,]*)\b")  # "α 14 µs" too
# not one held already, nor a figure a comma ends ("405.85, active" held a row's figures
# into one word wider than 44 columns, `budget presets`)
_COUNT_OF = re.compile(r"(?<![\x00\d,])\b(\d(?:[\d,]*\d)?) ([A-Za-zµ]+)")
# a figure and its unit, held also where the figure is a word's count ("optimizer 277 ms":
# `_COUNT_OF` leaves a count `_COUNTED` held, and "277" ended a line, a review); "us" is
# "µs" on a stream that is not UTF (`standins`: "alpha 14" / "us" parted, a review)
_UNIT = re.compile(
    r"(\d) ((?:[kKMGTP]i?B|B|s|ms|µs|us|ns|[kMGTP]?FLOP/s|[kMGTP]?FLOPS|[kMGT]B/s|[GT]b/s|MHz|W|%)"
    r"(?![\w/]))"
)


_HELD_RUN = re.compile(r"\S*\x00\S*")  # a run of words `held` joined


def held(plain: str, room: int | None = None) -> str:
    """`plain` with the spaces `held_lines` does not break at made NUL, the same length;
    a held figure wider than `room` columns split at its spaces, not inside it ("over 1" /
    "28" read as another count, a review)."""
    glue = "\\1\x00\\2"
    kept = _UNIT.sub(glue, _COUNT_OF.sub(glue, _COUNTED.sub(glue, plain)))
    if room is None:
        return kept
    return _HELD_RUN.sub(lambda m: m[0] if len(m[0]) <= room else m[0].replace("\x00", " "), kept)


def held_lines(
    console: Console, text: Text, width: int, first: int = 0, rest: int = 2
) -> list[Text]:
    """`text` wrapped to `width` columns, its first line indented by `first` spaces and the
    others by `rest`, its styles kept, never between a word and the count after it or a
    count or figure and its noun or unit: at 80 columns "micro" ended a line and "1" began
    the next (an audit), "4" one before "virtual stages" (a review), and `check` ended
    lines on "8.46" and "(23,926,980,608" with "GiB" and "B)" on the next (an audit).
    Wrapped here rather than by rich, which breaks lines at a no-break space too; by rich
    where a character takes other than one column (CJK, emoji: `textwrap` counts characters,
    and a table cropped the lines it made too wide, a review)."""
    from rich.cells import cell_len
    from rich.text import Text

    width = max(width, first + 1, rest + 1)
    if cell_len(text.plain) != len(text.plain):
        head, *tail = text.wrap(console, width - first)
        lines = [Text(" " * first) + head]
        if tail:  # the rest, styles kept, rewrapped at the deeper indent
            after = text[len(head.plain) :]
            after = after[len(after.plain) - len(after.plain.lstrip()) :]
            lines += [Text(" " * rest) + line for line in after.wrap(console, width - rest)]
        return lines
    kept = held(text.plain, width - max(first, rest))
    wrapper = textwrap.TextWrapper(
        width,
        initial_indent=" " * first,
        subsequent_indent=" " * rest,
        expand_tabs=False,
        break_on_hyphens=False,
    )
    out, at = [], 0
    for n, line in enumerate(wrapper.wrap(kept)):
        body = line[first if n == 0 else rest :]
        start = kept.find(body, at)
        at = start + len(body)
        out.append(Text(line[: len(line) - len(body)]) + text[start:at])
    return out


def preset_said(name: str, overrides: Iterable[str]) -> str:
    """A device or topology preset as the plan takes it: "h100-sxm", or with the keys it
    writes over the preset's figures, "h100-sxm (the plan's flops)", "dgx-h100 (the plan's
    levels)" (`catalog.device_overrides`, `catalog.topology_overrides`)."""
    written = ", ".join(overrides)
    return f"{name} (the plan's {written})" if written else name


def stage_layers(report: Report, stage: int, layers: int) -> str:
    """A stage's layers for people: the multi-token prediction layers the last stage runs
    after its own (`layers._chunk_kinds`, `StageRow.mtp_layers`) apart, "2 + 1 MTP" (a user
    audit, m431: the stages' counts summed to 62 of DeepSeek-V3's 61 layers, and nothing
    said why)."""
    mtp = next((s.mtp_layers for s in report.stages if s.stage == stage), 0)
    if mtp:
        return f"{layers - mtp} + {mtp} MTP"
    return str(layers)


def print_wrapped(
    console: Console, text: str | Text, indent: str = "  ", first: str = "", style: str = ""
) -> None:
    """`text` (plain, or rich `Text` with its styles) printed by `held_lines` at the
    console's width: its first line indented by `first`, the others by `indent`."""
    from rich.text import Text

    from budget.render.standins import for_console

    # the stand-ins of a stream that is not UTF (`standins`) in before the lines are measured:
    # put in after, "≤" as "<=" made a line a column wider than the console
    text = for_console(console, Text(text, style=style) if isinstance(text, str) else text)
    for line in held_lines(console, text, max(console.width, 40), len(first), len(indent)):
        console.print(line, soft_wrap=True)


class Hanging:
    """A cell's text indented under its heading row, with a deeper hanging indent on the
    lines it wraps to, so that a wrapped name does not read as the next row; wrapped by
    `held_lines`, never between a figure and its unit ("7.83" / "MiB" ended and began two
    lines, and in `budget collective`'s value column "B 50" / "GB/s per GPU", an audit)."""

    def __init__(self, text: str | Text, first: int = 1, rest: int = 3) -> None:
        from rich.text import Text

        self.text = Text(text) if isinstance(text, str) else text
        self.first, self.rest = first, rest

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from held_lines(console, self.text, options.max_width, self.first, self.rest)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.cells import cell_len
        from rich.measure import Measurement

        words = held(self.text.plain).split() or [""]
        longest = max(map(cell_len, words))
        return Measurement(self.rest + longest, self.first + self.text.cell_len)


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
