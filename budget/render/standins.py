"""ASCII stand-ins for the characters budget prints that a stream cannot encode.

On a stream that is not UTF-8 (``PYTHONIOENCODING=ascii``, or latin-1) each such character
printed as ``?`` (an audit): a diff's ``−280 ms`` and ``+83.0% ✗`` read ``?280 ms`` and
``+83.0% ?``, so better could not be told from worse, check's ``step time ≤ 12 s`` lost its
direction and a report's ``267 µs`` its unit. Each character budget prints now has a stand-in
that keeps its meaning (``-``, ``ok``/``bad``, ``<=``, ``us``), and only a character budget does
not know of (a plan's own name, say) is ``?``.

Two places put them in. The error handlers of the standard streams (`register`, called by
`entry.py`) catch whatever is written to them. Rich lays tables out by the width of the
characters it is given, so a stand-in wider than its character, put in as the stream
encodes, would push its row past the others: `Standins`, a render hook on the console,
puts them in before rich measures anything, and `for_console` where budget measures or
wraps text itself.
"""

from __future__ import annotations

import codecs
import functools
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import RenderHook
from rich.text import Span, Text

from budget.render import NBSP, utf

if TYPE_CHECKING:
    from rich.console import Console, ConsoleRenderable

STANDIN = "budget.standin"  # the name standard error's handler is registered under

# what a space that holds two words together prints as: left to the stream's error handler,
# since budget's own wrapping (`held_lines`) reads it and it is one column either way
_HELD_SPACES = frozenset({NBSP, "\u202f"})

_CIRCLES = "\U0001f7e2\U0001f534"  # markdown's green and red, beside a ✓ or ✗ that says it
_STANDINS = {
    "\u2212": "-",  # minus sign: a diff's delta, a formula
    "\u2013": "-",  # en dash: "–" for no figure, "ids 1–4"
    "\u2014": "--",  # em dash
    "\u2010": "-",
    "\u2011": "-",
    "\u00d7": "x",  # tp 8 × pp 8
    "\u2192": "->",  # pp i→i+1, activations → next stage
    "\u2190": "<-",
    "\u2264": "<=",  # check's limits: step time ≤ 12 s
    "\u2265": ">=",
    "\u2260": "!=",
    "\u2248": "~",
    "\u00b1": "+/-",
    "\u2026": "...",
    "\u00b5": "u",  # µs
    "\u03bc": "u",  # μs, the Greek letter some keyboards give
    "\u03b1": "alpha",  # a link's latency per step, n·α
    "\u03b2": "beta",
    "\u03b3": "gamma",
    "\u03b5": "eps",
    "\u0394": "delta",  # a diff's Δ and Δ% columns
    "\u03a3": "sum",
    "\u03a8": "Psi",
    "\u2713": "ok",  # a diff's better, a check's pass
    "\u2714": "ok",
    "\u2705": "ok",
    "\u2717": "bad",  # a diff's worse, a check's failed limit
    "\u2718": "bad",
    "\u274c": "x",  # markdown's failed check
    "\u26a0": "!",  # markdown's invalid plan
    "\ufe0f": "",  # the variation selector after ⚠
    **dict.fromkeys(_CIRCLES, ""),
    "\u2588": "#",  # the fill bar
    "\u2020": "+",  # presets: an assumed figure
    "\u2032": "'",  # p′
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2022": "*",
    "\u00b2": "^2",
    "\u00b3": "^3",
    "\u2070": "^0",
    "\u2076": "^6",
    "\u1d40": "^T",
    "\u2080": "0",
    "\u2308": "ceil(",
    "\u2309": ")",
    "\u230a": "floor(",
    "\u230b": ")",
    "\u2009": " ",  # thin space
    "\u202f": " ",  # narrow no-break space
    NBSP: " ",
}


def standin(text: str, at: int) -> str:
    """What to print for ``text[at]`` where the stream cannot encode it. A middle dot
    between spaces separates ("gpt3-175b · train", "59 · 85 · 96 %"): ``/``; between two
    terms it multiplies ("n·α", "2·cp"): ``*``, where ``.`` made "n.alpha" a decimal."""
    char = text[at]
    if char == "\u00b7":
        spaced = 0 < at < len(text) - 1 and text[at - 1] == " " == text[at + 1]
        return "/" if spaced else "*"
    if char in _STANDINS:
        return _STANDINS[char]
    from rich.cells import cell_len

    # one a column: a wide character keeps its width, and a combining accent, of none, is
    # dropped from the letter it sat on
    return "?" * cell_len(char)


def _swapped(error: UnicodeError, cut: str) -> tuple[str, int]:
    """The stand-ins of the characters `error` says the encoding refused, an ellipsis as
    `cut`, and where to go on: past the space after markdown's green or red circle, which
    stands for nothing beside the ✓ or ✗ that follows it and else left two spaces."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text, end = error.object, error.end
    swapped = "".join(
        cut if text[i] == "\u2026" else standin(text, i) for i in range(error.start, end)
    )
    if text[end - 1] in _CIRCLES and text[end : end + 1] == " ":
        end += 1
    return swapped, end


def _handler(error: UnicodeError) -> tuple[str, int]:
    """The error handler of standard error: each character the encoding refused, by its
    stand-in."""
    return _swapped(error, "...")


def _output_handler(error: UnicodeError) -> tuple[str, int]:
    """The error handler of standard output, where what budget prints through rich has its
    stand-ins already (`Standins`), and an ellipsis left is rich's own mark of a cell cut
    short, one column wide: ``~``, where ``...`` pushed its row two columns past the others
    (the Links table at 80 columns, its last header cut)."""
    return _swapped(error, "~")


def register(output: bool = False) -> str:
    """Register the error handler of standard output (`output`) or of standard error, and
    return its name; registering again is harmless."""
    name = f"{STANDIN}.output" if output else STANDIN
    codecs.register_error(name, _output_handler if output else _handler)
    return name


@functools.lru_cache(maxsize=4096)
def _encodes(char: str, encoding: str) -> bool:
    try:
        char.encode(encoding)
    except (UnicodeEncodeError, LookupError):  # an encoding Python does not know: ASCII's
        return False
    return True


def _pieces(text: str, encoding: str, keep: frozenset[str]) -> list[str]:
    """Each character of `text`, or its stand-in where `encoding` cannot encode it and it is
    not in `keep`."""
    return [
        c if c in keep or _encodes(c, encoding) else standin(text, i) for i, c in enumerate(text)
    ]


def ascii_str(text: str, encoding: str, keep: frozenset[str] = _HELD_SPACES) -> str:
    """`text` with each character `encoding` cannot encode, but those in `keep`, swapped."""
    return text if text.isascii() else "".join(_pieces(text, encoding, keep))


def ascii_text(text: Text, encoding: str) -> Text:
    """`text` as `ascii_str` makes its characters, each span on the stand-ins of the
    characters it covered, so that its colours and weights stay where they were."""
    plain = text.plain
    if plain.isascii():
        return text
    pieces = _pieces(plain, encoding, _HELD_SPACES)
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece))
    spans = [Span(starts[s.start], starts[min(s.end, len(plain))], s.style) for s in text.spans]
    return Text(
        "".join(pieces),
        style=text.style,
        justify=text.justify,
        overflow=text.overflow,
        no_wrap=text.no_wrap,
        end=text.end,
        tab_size=text.tab_size,
        spans=spans,
    )


R = TypeVar("R")


def ascii_renderable(renderable: R, encoding: str) -> R:
    """`renderable` with the stand-ins in its text: a `str` or `Text`, a table's title,
    caption, headers and cells (in place), a cell that wraps its own `text` (`Hanging`).
    Anything else is left to the stream's error handler."""
    from rich.table import Table

    found: Any = renderable
    if isinstance(found, str):
        return ascii_str(found, encoding)  # type: ignore[return-value]
    if isinstance(found, Text):
        return ascii_text(found, encoding)  # type: ignore[return-value]
    if isinstance(found, Table):
        found.title = ascii_renderable(found.title, encoding)
        found.caption = ascii_renderable(found.caption, encoding)
        for column in found.columns:
            column.header = ascii_renderable(column.header, encoding)
            column.footer = ascii_renderable(column.footer, encoding)
            column._cells[:] = [ascii_renderable(cell, encoding) for cell in column._cells]
    elif isinstance(getattr(found, "text", None), Text):  # `budget.render.table.Hanging`
        found.text = ascii_text(found.text, encoding)
    return renderable


def encoding_short_of_utf(console: Console) -> str | None:
    """The encoding of the console's stream, where it is not a UTF; else None."""
    file = console.file
    return None if utf(file) else getattr(file, "encoding", None) or "ascii"


def for_console(console: Console, renderable: R) -> R:
    """`renderable` as `console` will print it: with the stand-ins where its stream is not
    UTF, for budget's own measuring and wrapping to see the widths rich will lay out."""
    encoding = encoding_short_of_utf(console)
    return renderable if encoding is None else ascii_renderable(renderable, encoding)


class Standins(RenderHook):
    """Puts the stand-ins into what a console prints before rich measures it."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [ascii_renderable(r, self.encoding) for r in renderables]
