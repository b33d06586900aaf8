"""Arithmetic that works the same on one number and on an array of them.

The engine computes one plan with Python numbers and a sweep of configurations with numpy
arrays (one element per configuration, `budget.search`), through the same functions. Where
a formula needs a minimum, a rounding or a test, it calls these instead of the builtins,
which refuse arrays. Bytes stay integers: ``int`` for one plan, ``int64`` for a sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import Any, TypeVar, cast

import numpy as np

# At the type level the engine computes with int and float, as for one plan; at run time a
# sweep passes numpy arrays through the same code, element by element.
N = TypeVar("N", int, float)


def _scalar(*values: Any) -> bool:
    return not any(isinstance(v, np.ndarray) for v in values)


def vmin(a: N, b: N) -> N:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return cast(N, np.minimum(a, b))
    return min(a, b)


def vmax(a: N, b: N) -> N:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return cast(N, np.maximum(a, b))
    return max(a, b)


def vround(x: float) -> int:
    """Round half to even to an integer, as Python's round() and numpy's round() both do."""
    return round(x) if _scalar(x) else cast(int, np.round(x).astype(np.int64))


def vceil(x: float) -> int:
    return int(np.ceil(x)) if _scalar(x) else cast(int, np.ceil(x).astype(np.int64))


def vfloat(x: Any) -> float:
    return float(x) if _scalar(x) else cast(float, np.asarray(x, dtype=np.float64))


def vsum(terms: Iterable[N]) -> N:
    """The builtin ``sum`` (from 0, left to right: the same numbers), adding a sweep's
    arrays into one array the sum made itself instead of making a new array per term: a
    sweep's memory instant adds some 26 allocations of one number per configuration, and
    a new array cost about half as much again as the addition. A term of another shape or
    type is added as ``sum`` adds it."""
    total: Any = 0
    owned = False  # `total` is an array made here, which nothing else holds
    for term in terms:
        total, owned = add_into(total, owned, term)
    return cast(N, total)


def add_into(total: Any, owned: bool, term: Any) -> tuple[Any, bool]:
    """``total + term``, added in place where `total` is an array of the same shape and type
    that the caller made (`owned`, which nothing else holds); with whether the result is
    such an array (`vsum`)."""
    # `owned` first: a total not yet an array (the sum's 0) has no dtype
    arrays = owned and type(term) is np.ndarray
    if arrays and term.dtype == total.dtype and term.shape == total.shape:
        np.add(total, term, out=total)
        return total, True
    total = total + term
    return total, type(total) is np.ndarray and total is not term


def largest(values: list[N]) -> N:
    """The element-wise maximum of a non-empty list."""
    return reduce(vmax, values)


def every(condition: Any) -> bool:
    """A condition that decides the structure of a step: the same for every configuration
    a sweep evaluates together (`budget.search` groups them so)."""
    if not isinstance(condition, np.ndarray):
        return bool(condition)  # one plan's bool: no array to build (a sweep asks often)
    return bool(condition.all())


def uniform(condition: Any, what: str) -> bool:
    """A condition that decides the structure of a step and must hold for all of a sweep's
    configurations evaluated together or for none (`budget.search` groups them so); an
    error if they differ, rather than a step right for some and wrong for others."""
    if isinstance(condition, np.ndarray):
        if condition.all():
            return True
        if condition.any():
            raise ValueError(f"configurations evaluated together differ in their {what}")
        return False
    return bool(condition)


def ratio(a: float, b: float) -> float:
    """a / b, and 0 where b is 0 (a step with no time has no rate)."""
    if _scalar(a, b):
        return a / b if b else 0.0
    den = np.asarray(b, dtype=np.float64)
    out = np.zeros(np.broadcast(a, den).shape)
    return cast(float, np.divide(a, den, out=out, where=den != 0))


def count_label(n: int) -> str:
    """ "1,234" for one plan; nothing for a sweep (labels are read only in single reports)."""
    return f"{n:,}" if _scalar(n) else "N"


def vwhere(condition: Any, a: N, b: N) -> N:
    """`a` where the condition holds, else `b`."""
    if isinstance(condition, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return cast(N, np.where(condition, a, b))
    return a if condition else b


def holds(condition: Any) -> bool | np.ndarray:
    """A condition that may differ between the configurations of a sweep: a bool for one
    plan, a boolean array for a sweep (see `step.when`)."""
    return bool(condition) if _scalar(condition) else np.asarray(condition, dtype=bool)


def lacks(condition: Any) -> bool | np.ndarray:
    """The negation of `holds(condition)`."""
    cond = holds(condition)
    return not cond if isinstance(cond, bool) else ~cond
