"""Errors users can act on: one `Problem` per fault, all of a file's problems at once.

The CLI turns a `BudgetError` into lines of the form
``file:line:col: error: $.path: message`` on stderr and exit code 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One fault in one input file, pointing at the node that caused it."""

    file: str
    line: int  # 1-based; 0 when no position is known
    col: int  # 1-based; 0 when no position is known
    path: str  # JSON path, e.g. "$.parallel.tp"
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: error: {self.path}: {self.message}"


class BudgetError(Exception):
    """Invalid input: carries every problem found, sorted by position."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def every_one(function: Callable[[In], Out], items: Iterable[In]) -> list[Out]:
    """`function` of each item, or a BudgetError with every item's problems together (two
    plans' problems in one run, not the second's after the first is fixed)."""
    results: list[Out] = []
    problems: list[Problem] = []
    for item in items:
        try:
            results.append(function(item))
        except BudgetError as error:
            problems.extend(error.problems)
    if problems:
        raise BudgetError(problems)
    return results
