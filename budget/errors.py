"""Errors users can act on: one `Problem` per fault, all of a file's problems at once.

The CLI turns a `BudgetError` into lines of the form
``file:line:col: error: $.path: message`` on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

# A message quotes the input, and a hostile file's values can be megabytes (a 5,000,000-digit
# number was echoed whole); and a file can hold 100,000 faulty values. Past these, a reader
# learns nothing more.
# characters of a message (or a path) shown: room for budget's longest sentence, a refused
# model family's with the 22 it reads (~520), beside a Hugging Face cache path; a quoted
# value beyond it is cut
MAX_MESSAGE = 800
MAX_SHOWN = 200  # problems printed; a last line counts the rest
# how a problem that counts the rest of its source's begins: it sorts after them
REST = "…and "


# What ends a line for a reader of stderr (Python's str.splitlines, which a CI log parser may
# use, splits at all of them): a message quoting the input shows them escaped, so that every
# line stays one problem that begins with its file. So are the other control characters a
# terminal acts on (ESC starts a sequence that can clear the screen or retitle the window,
# BEL rings, BS overwrites: an audit's plan key and file name sent them raw) and the
# bidirectional overrides and isolates, which reorder the text shown after them; a tab stays.
_CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) != "\t"]
_BIDI = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in [*_CONTROLS, "\u2028", "\u2029", *_BIDI]})


FORMATS = ("table", "json", "markdown")  # what --format names, in any case


def format_refusal(value: str) -> list[str]:
    """Why `value` names no output format, as a line to say beside a command's other bad
    options (`UsageErrors`; an audit: `check -f xml --headroom banana` said the format alone,
    click's check refusing it before the command read the others); none if it names one."""
    if value.lower() in FORMATS:
        return []
    return [f"--format {value!r}: expected {', '.join(FORMATS[:-1])} or {FORMATS[-1]}"]


class UsageErrors(ValueError):
    """Every bad command-line option at once, one one-line message each, in the order the
    command lists its options (`check.parse_limits`, `search_cli.space`); str() joins them
    for a caller that shows one line. The CLI prints one ``budget: error:`` line each and
    exits 2."""

    def __init__(self, messages: Iterable[str]) -> None:
        self.messages = tuple(messages)
        super().__init__("; ".join(self.messages))


def close_matches(word: str, choices: list[str], n: int, cutoff: float = 0.6) -> list[str]:
    """`difflib.get_close_matches`, but none tried for a word too long to reach `cutoff`
    against any choice: similarity is 2·M / (len(a) + len(b)) with M ≤ len(b), so it needs
    len(a) ≤ (2 / cutoff − 1)·len(b). A 6 MiB string in an enum field spent 2-4 s and
    330 MB comparing itself with each option (an audit)."""
    if not choices:
        return []
    # a choice that differs in case alone first: difflib scores 'TP' against 'tp' at 0 and
    # 'GeGLU' below 'geglu''s cutoff (an audit: neither offered)
    folded = [c for c in choices if c.lower() == word.lower()]
    if folded:
        return folded[:n]
    if len(word) > (2 / cutoff - 1) * max(len(c) for c in choices):
        return []
    return difflib.get_close_matches(word, choices, n=n, cutoff=cutoff)


def one_line(text: str) -> str:
    """`text` with the characters a reader splits lines at, and those a terminal acts on,
    shown escaped (`_LINE_BREAKS`)."""
    return text.translate(_LINE_BREAKS)


def usage_line(message: str) -> str:
    """A fault of the command line rather than of a file (an option, an output that cannot
    be written): one line, as a file's problems are."""
    return f"budget: error: {one_line(message)}"


def note_line(message: str) -> str:
    """Something the command did not do, or did otherwise, said on stderr beside a
    successful output: one line, as `usage_line` writes an error."""
    return f"budget: note: {one_line(message)}"


def _clipped(text: str) -> str:
    text = one_line(text)
    if len(text) <= MAX_MESSAGE:
        return text
    return f"{text[: MAX_MESSAGE - 40]}... ({len(text) - MAX_MESSAGE + 40:,} characters more)"


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One fault in one input file, pointing at the node that caused it."""

    file: str
    line: int  # 1-based; 0 when no position is known
    col: int  # 1-based; 0 when no position is known
    path: str  # JSON path, e.g. "$.parallel.tp"
    message: str
    # how many problems the line stands for: a count of a source's problems not shown
    # (`REST`) stands for those it counts, so that a count of it counts them
    counted: int = field(default=1, compare=False)
    # the file was read no further than this problem (a cap, a syntax error): past the cap
    # on lines shown it is still shown, and the count of the rest says reading stopped
    ends: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        where = f"{one_line(self.file)}:{self.line}:{self.col}"
        return f"{where}: error: {_clipped(self.path)}: {_clipped(self.message)}"


def problem_lines(problems: Iterable[Problem]) -> list[str]:
    """The lines stderr shows for `problems`, file by file in the order the files come,
    each problem once (a plan named twice, ``validate a.yaml b.yaml a.yaml``, is one file):
    each file's first `MAX_SHOWN`, then a count of its rest at the first one left out, in the
    same ``file:line:col: error: $.path:`` shape, so that a reader parsing the lines by that
    shape meets no other, and each file's JSON ``problems`` are its lines here. A count line
    left out counts what it counted (`Problem.counted`). Audits: a plain ``budget: error:``
    count line; two plans' problems capped together, which put the second's under a count
    at the first's file; a config file's own count counted as one; a plan named twice
    counted twice, or printed twice. A problem the reading of its file stopped at
    (`Problem.ends`) is shown after the count, which says the file was read no further (an
    audit: 500,000 duplicate keys were counted as 9,798 more problems, and the cap on values
    read that stopped the count went unsaid)."""
    files: dict[str, dict[Problem, None]] = {}
    for problem in problems:
        files.setdefault(problem.file, {})[problem] = None
    lines = []
    for each in files.values():
        found = list(each)
        lines += [str(p) for p in found[:MAX_SHOWN]]
        if len(found) > MAX_SHOWN:
            ends = [p for p in found[MAX_SHOWN:] if p.ends]
            hidden = [p for p in found[MAX_SHOWN:] if not p.ends]
            more = sum(p.counted for p in hidden)
            if more:
                word = "problem" if more == 1 else "problems"
                where = "before reading stopped (below)" if ends else "from here on"
                rest = f"{REST}{more:,} more {word} {where}, not shown"
                rest += f" (the first {MAX_SHOWN} above)"
                lines.append(str(replace(hidden[0], message=rest, counted=more)))
            lines += [str(p) for p in ends]
    return lines


_DIGITS = re.compile(r"([0-9]+)")


def _natural(text: str) -> tuple[str | tuple[int, str], ...]:
    """`text` as a sort key whose runs of digits compare as numbers (x[2] before x[10]),
    each by its length and then its digits, whatever its length."""
    parts: list[str | tuple[int, str]] = list(_DIGITS.split(text))
    for i in range(1, len(parts), 2):
        digits = str(parts[i]).lstrip("0") or "0"
        parts[i] = (len(digits), digits)
    return tuple(parts)


class BudgetError(Exception):
    """Invalid input: carries every problem found, each file's sorted by position, the
    files in the order their problems came (the order the command was given them)."""

    def __init__(self, problems: list[Problem]) -> None:
        problems = list(dict.fromkeys(problems))  # one file given twice: its problems once
        order = {file: i for i, file in enumerate(dict.fromkeys(p.file for p in problems))}
        # by position, and where several share one (a config.json's, at the plan's
        # hf_config key) by their text with its numbers read as numbers: x[100000] came
        # second, and x[1] … x[199] went unshown under "the first 200" (an audit)
        # and a count of the rest (`REST`) after the problems it follows, whatever their text
        self.problems = sorted(
            problems,
            key=lambda p: (
                order[p.file],
                p.line,
                p.col,
                p.path,
                p.message.startswith(REST),
                _natural(p.message),
            ),
        )
        # the lines stderr shows, not every problem's (an audit: 260,000 problems of one
        # config.json took 3 s to join)
        super().__init__("\n".join(problem_lines(self.problems)))


def every_one(function: Callable[[In], Out], items: Iterable[In]) -> list[Out]:
    """`function` of each item, or a BudgetError with every item's problems together (two
    plans' problems in one run, not the second's after the first is fixed), each once: one
    file given twice (`budget diff a.yaml a.yaml`) printed its errors twice (an audit)."""
    results: list[Out] = []
    problems: dict[Problem, None] = {}
    for item in items:
        try:
            results.append(function(item))
        except BudgetError as error:
            problems.update(dict.fromkeys(error.problems))
    if problems:
        raise BudgetError(list(problems))
    return results
