"""The CI gate: does each plan fit its devices, and does it keep the limits a team sets?

`check_plans` budgets every plan (an invalid one does not stop the others) and holds each
report against `Limits`. Every failed limit becomes a `Reason` that names the stage, the
numbers and what dominates; renderers show the reasons and the CLI picks the exit code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, TypeVar

from budget.errors import BudgetError, Problem, UsageErrors, problem_lines
from budget.inference import passes_for
from budget.phases import pass_of
from budget.report import (
    Overlapping,
    PhaseRow,
    Report,
    StageRow,
    slow_link_notes,
    time_word,
    time_words,
)
from budget.units import (
    UnitError,
    decimals_apart,
    duration_unit,
    format_bytes,
    format_duration,
    parse_bytes,
    parse_duration,
    unit_left_out,
    unit_scale,
)

__all__ = [
    "CheckResult",
    "Limits",
    "Reason",
    "Verdict",
    "check_plans",
    "check_report",
    "check_to_dict",
    "parse_limits",
]

GIB = 2**30
T = TypeVar("T")
LimitName = Literal["memory", "headroom", "max_exposed", "max_step", "max_ttft", "max_tpot"]
# the unit of a reason's actual, required and excess, by its limit (an audit, m483: said
# nowhere in the JSON): bytes of a stage, a share of the step, seconds
LIMIT_UNITS: dict[str, str] = {
    "memory": "bytes",
    "headroom": "bytes",
    "max_exposed": "share",
    "max_step": "s",
    "max_ttft": "s",
    "max_tpot": "s",
}


@dataclass(frozen=True, slots=True)
class Limits:
    """What a plan must keep besides fitting. None means the limit is not set."""

    headroom_share: float | None = None  # free memory on the worst stage, share of capacity
    headroom_bytes: int | None = None  # ... or in bytes
    max_exposed_share: float | None = None  # exposed communication / step time
    max_step_s: float | None = None
    max_ttft_s: float | None = None  # serving: time to first token (the prefill)
    max_tpot_s: float | None = None  # serving: time per output token (a decode pass)

    def required_headroom(self, capacity_bytes: int) -> int | None:
        """Free bytes the worst stage must keep on a device of `capacity_bytes`: a share of
        it rounded up to a whole byte, as a size in bytes is (`units.parse_bytes`), from the
        share as it was written (`_written`; an audit: 5 % of an H100's 85,520,809,984 B,
        4,276,040,499.2 B, was rounded to the byte below, and a plan keeping it passed)."""
        if self.headroom_bytes is not None:
            return self.headroom_bytes
        if self.headroom_share is not None:
            return math.ceil(Fraction(_written(self.headroom_share)) * capacity_bytes)
        return None

    def shown_free(self, free_bytes: int, capacity_bytes: int) -> str:
        """The worst stage's free bytes (their size, a shortfall's too) as the check shows
        them: in GiB with as many decimals as tell them from the required headroom, where
        the usual three figures would print the two alike (an audit, m532: 29.27 GiB free
        read "29.3 GiB" beside the 29.3 GiB it failed to keep)."""
        required = self.required_headroom(capacity_bytes)
        shown = format_bytes(abs(free_bytes))
        if required is None or free_bytes < 0 or shown != format_bytes(required):
            return shown
        # in the unit the two print in (a review, m533: 514 MiB read "0.5022 GiB")
        unit = shown.partition(" ")[2]
        scale = unit_scale(unit) or 1.0
        digits = decimals_apart((free_bytes / scale, required / scale))
        return f"{free_bytes / scale:,.{digits}f} {unit}"

    def shown_step(self, time_s: float) -> str:
        """A step time as the check shows it: as many digits as tell it from the limit."""
        return _shown(time_s, self.max_step_s)

    def shown_ttft(self, time_s: float) -> str:
        return _shown(time_s, self.max_ttft_s)

    def shown_tpot(self, time_s: float) -> str:
        return _shown(time_s, self.max_tpot_s)

    def shown_exposed(self, share: float) -> str:
        """An exposed share as the check shows it: as many digits as tell it from the limit."""
        if self.max_exposed_share is None:
            return f"{share:.1%}"
        return _finer(share, self.max_exposed_share)

    def describe(self, modes: Iterable[str] = ("train",)) -> list[str]:
        """The limits in words, for renderers: ["headroom ≥ 5% of capacity", ...]. `modes`
        are the checked plans' modes, which say what their time is of: a training "step", a
        serving plan's "run", or "step or run" for both (a check of a decode plan had read
        "step time ≤ 10 s" over a verdict that said "the run takes 11.6 s")."""
        time = time_words(modes)
        out = ["every stage fits in device memory"]
        if self.headroom_bytes is not None:
            # in the unit that says it (an audit: 1 MiB read "0.00 GiB (1,048,576 B)")
            out.append(f"headroom ≥ {_amount(self.headroom_bytes)} on every stage")
        elif self.headroom_share is not None:
            out.append(f"headroom ≥ {_percent(self.headroom_share)} of capacity on every stage")
        if self.max_exposed_share is not None:
            out.append(f"exposed communication ≤ {_percent(self.max_exposed_share)} of the {time}")
        if self.max_step_s is not None:
            out.append(f"{time} time ≤ {_exact(self.max_step_s)}")
        if self.max_ttft_s is not None:
            out.append(f"time to first token ≤ {_exact(self.max_ttft_s)}")
        if self.max_tpot_s is not None:
            out.append(f"time per output token ≤ {_exact(self.max_tpot_s)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "headroom_share": self.headroom_share,
            "headroom_bytes": self.headroom_bytes,
            "max_exposed_share": self.max_exposed_share,
            "max_step_s": self.max_step_s,
            "max_ttft_s": self.max_ttft_s,
            "max_tpot_s": self.max_tpot_s,
        }


@dataclass(frozen=True, slots=True)
class Reason:
    """One failed limit of one plan, with the numbers behind it."""

    limit: LimitName
    message: str  # a full sentence with the numbers, for people
    stage: int | None
    actual: float | None  # bytes, seconds or a share, as the limit counts
    required: float | None
    excess: float | None  # how far past the limit, in the same unit
    contributors: tuple[Overlapping, ...] = ()
    # the time limits' largest phases, (phase, seconds per step or per output token), as
    # the message names them
    phases: tuple[tuple[str, float], ...] = ()
    # other stages past the same memory limit, (stage, excess bytes), largest excess first
    other_stages: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "message": self.message,
            "unit": LIMIT_UNITS[self.limit],
            "stage": self.stage,
            "actual": self.actual,
            "required": self.required,
            "excess": self.excess,
            "contributors": [
                {"tensor": o.tensor, "category": o.category, "count": o.count, "bytes": o.bytes}
                for o in self.contributors
            ],
            "other_stages": [{"stage": s, "excess_bytes": e} for s, e in self.other_stages],
            "phases": [{"phase": name, "seconds": s} for name, s in self.phases],
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """One plan's outcome: a report and its failed limits, or the problems that made it
    invalid."""

    file: str
    report: Report | None
    reasons: tuple[Reason, ...] = ()
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()  # limits that do not apply to the plan (a train plan's TTFT)

    @property
    def valid(self) -> bool:
        return self.report is not None

    @property
    def passed(self) -> bool:
        return self.valid and not self.reasons


@dataclass(frozen=True, slots=True)
class CheckResult:
    limits: Limits
    verdicts: tuple[Verdict, ...]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    @property
    def invalid(self) -> bool:
        return any(not v.valid for v in self.verdicts)

    @property
    def problems(self) -> list[Problem]:
        return [p for v in self.verdicts for p in v.problems]

    def describe_limits(self) -> list[str]:
        """The limits in words, their time named as the checked plans' is."""
        return self.limits.describe(v.report.mode for v in self.verdicts if v.report is not None)


def _exact(seconds: float) -> str:
    """A limit as the user gave it: "5.336 s", "12 s", "5.4771070941137 s" (12 significant
    digits cut that last to 5.47710709411 s, which the figure over it then read as under;
    an audit), in the fewest digits from 12 that give it back within a rounding (17.3 ms,
    not the 17.299999999999997 of 0.0173 / 1e-3)."""
    scale, unit = duration_unit(seconds)
    value = seconds / scale
    return f"{value:.{_given_digits(value)}g} {unit}"


def _given_digits(value: float) -> int:
    """The fewest significant digits from 12 that give `value` back within a rounding."""
    return next(
        (d for d in range(12, 17) if abs(float(f"{value:.{d}g}") - value) <= 2 * math.ulp(value)),
        17,
    )


def _beside(value: float, limit: float, start: int) -> int:
    """Decimals from `start` at which `value` reads on its own side of `limit`: rounded,
    it neither equals the limit nor crosses it (5.004 against 5 is not "5.00"), never fewer
    than the limit's own (`start`; an audit: a 5.477107094113709 s step beside a limit of 14
    decimals had been cut to 12, 5.477107094114 s, over the 5.47710709411371 s it passed)."""
    last = max(start, 17)  # 17 decimals part any two doubles of the magnitudes shown here
    for digits in range(start, last + 1):
        shown = round(value, digits)
        if value == limit or (shown != limit and (shown > limit) == (value > limit)):
            return digits
    return last


def _shown(seconds: float, limit: float | None) -> str:
    return format_duration(seconds) if limit is None else _distinct(seconds, limit)


def _distinct(seconds: float, limit: float) -> str:
    """`seconds` in the limit's unit, with `format_duration`'s digits or as many more as it
    takes to read on its side of `limit` (5.3366 s against a 5.336 s limit, not 5.34 s;
    999.6 ms against 1 s reads 0.9996 s), and three significant figures at least (17.3 ms
    against 1 s reads 0.0173 s, not 0.02 s)."""
    if seconds == limit:
        return _exact(limit)
    scale, unit = duration_unit(limit)
    value = seconds / scale
    start = max(2 if abs(value) < 9.995 else 1 if abs(value) < 99.95 else 0, _decimals(limit))
    if 0 < abs(value) < 1:
        start = max(start, 2 - math.floor(math.log10(abs(value))))
    shown_limit = float(_exact(limit).split()[0])  # the limit as the user reads it
    return f"{value:.{_beside(value, shown_limit, start)}f} {unit}"


def _decimals(limit: float, percent: bool = False) -> int:
    """Decimals the limit is shown with (`_exact`, `_percent`): a figure gets at least as
    many (0.561% beside 0.56%, 5.337 s beside 5.336 s)."""
    number = (_percent(limit) if percent else _exact(limit)).split()[0].rstrip("%")
    return len(number.partition(".")[2])


def _finer(actual: float, limit: float) -> str:
    """`actual` as a percentage with as many decimals as it takes to read on its side of
    `limit` (20.03% against a 20% limit, not 20.0% against 20.0%), both as written
    (`_written`) and compared in decimals: in floats, actual * 100 read a share of
    0.38995224558382824 as 38.99522455838282%, the very text of the 38.99522455838282% it
    was over, and as 38.995224558382823% when it equalled a limit of 38.995224558382824%
    (an audit)."""
    value, bound = _written(actual) * 100, _written(limit) * 100
    # the limit's decimals, or the figure's own where it has fewer: past them it reads as
    # itself, zeros after it (38.995224558382824000000000000% beside a limit of 1e-27%)
    own = -min(0, int(value.normalize().as_tuple().exponent))
    digits = max(1, min(_decimals(limit, percent=True), own))
    while value != bound:  # ends: at the value's own digits it reads as itself
        shown = _to_decimals(value, digits)
        if shown != bound and (shown > bound) == (value > bound):
            break
        digits += 1
    return f"{_to_decimals(value, digits):f}%"


def _to_decimals(value: Decimal, digits: int) -> Decimal:
    """`value` rounded to `digits` decimals, in a context as precise as that takes (a
    review: 50 % to the 28 decimals of a 1e-27 % limit passed the default 28 digits, and
    `budget check` ended in a traceback)."""
    with localcontext() as context:
        context.prec = max(context.prec, digits + value.adjusted() + 2)
        return value.quantize(Decimal(1).scaleb(-digits))


# a plain decimal number, ASCII digits only (`_share`)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _share(text: str, option: str) -> float:
    """ "20%" → 0.2. A bare number is refused (0 aside): "0.2" reads as 20 % or as 0.2 %, a
    gate 100 times apart, and "1" as 1 % or all of it."""
    body = text.strip()
    percent = body.endswith("%")
    number = body.removesuffix("%").strip()
    # ASCII digits only, as sizes and durations are read: float() would take "1_0" as 10
    # and any script's digits (an audit: "2_0%" gated at 20 %, "٥%" at 5 %)
    if not _DECIMAL.fullmatch(number):
        raise ValueError(f"{option} {text!r}: expected a percentage such as 20%")
    value = float(number)
    if not percent and value != 0:
        # the readings a share can have (0 % to 100 %): a bare 5 can only mean 5 %
        readings = [f"{value:g}%"] if 0 <= value <= 100 else []
        if 0 <= value <= 1:
            readings.append("all of it" if value == 1 else f"{value * 100:g}%")
        if len(readings) == 2:
            hint = f"write a percentage, {' or '.join(readings)} (a bare number reads both ways)"
        elif readings:
            hint = f"write it as a percentage, {readings[0]}"
        else:
            hint = "write a percentage from 0% to 100%"
        raise ValueError(f"{option} {text!r}: {hint}")
    if percent and math.isfinite(value):
        # rounded once, as a size or a duration is, by shifting the decimal's exponent (an
        # exact fraction built 10^99999999 for 1e-99999999%): "1.4376202271069097%" is the
        # share a report gives as 0.014376202271069097, where value / 100 rounded twice and
        # read one unit in the last place below it (an audit)
        value = float(Decimal(body.removesuffix("%").strip()).scaleb(-2))
    if not 0 <= value <= 1:
        raise ValueError(f"{option} {text!r}: expected a share between 0% and 100%")
    return value


def _duration(text: str | None, option: str) -> float | None:
    """ "12s" → 12.0 for a time limit; more than 0 s."""
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except UnitError as error:
        raise ValueError(f"{option} {text!r}: {error}") from None
    if seconds <= 0:
        raise ValueError(f"{option} {text!r}: must be more than 0 s")
    return seconds


def _headroom(text: str) -> tuple[float | None, int | None]:
    """ "5%" → (0.05, None); "4GiB" → (None, 4 GiB in bytes)."""
    if text.strip().endswith("%"):
        return _share(text, "--headroom"), None
    if unit_left_out(text):  # "--headroom 5": 5 bytes, a gate that checks nothing
        # a bare share of one or less reads as a fraction too: 0.05 is likely 5 %, where
        # "0.05%" keeps 41 MiB of an H100 (an audit, m532), as --max-exposed offers both
        body = text.strip()
        value = float(body) if _DECIMAL.fullmatch(body) else None
        # each reading as a plain percentage ("1e-2" as 0.01 % or 1 %), the share's below
        # all of it (a review, m533: "1" was offered 100 %, which nothing passes)
        shares = [f"{body}%"] if value is None else []
        if value is not None and 0 <= value < 100:  # all of it is a limit nothing passes
            shares.append(f"{value:g}%")
        if value is not None and 0 < value < 1:
            shares.append(f"{value * 100:g}%")
        share = f"a percentage, {' or '.join(shares)}, or " if shares else ""
        raise ValueError(
            f"--headroom {text!r}: write {share}a size with its unit, such as {body}GiB "
            "(read as bytes, a bare number would gate nothing)"
        )
    try:
        return None, parse_bytes(text)
    except UnitError as error:
        raise ValueError(f"--headroom {text!r}: expected 5% or a size: {error}") from None


def parse_limits(
    headroom: str | None = None,
    max_exposed: str | None = None,
    max_step: str | None = None,
    max_ttft: str | None = None,
    max_tpot: str | None = None,
) -> Limits:
    """Limits from the command line: --headroom 5% or 4GiB, --max-exposed 20%, --max-step
    12s, and a serving plan's --max-ttft 2s and --max-tpot 20ms. Every option is read, and
    bad text in any of them raises one `UsageErrors` (a ValueError) with a one-line message
    for each (a `budget check --headroom lots --max-step soon` said only the first)."""
    errors: list[str] = []

    def read(parse: Callable[[str], T], text: str | None, empty: T) -> T:
        if text is None:
            return empty
        try:
            return parse(text)
        except ValueError as error:
            errors.append(str(error))
            return empty

    unset: tuple[float | None, int | None] = (None, None)
    share, size = read(_headroom, headroom, unset)
    exposed = read(lambda t: _share(t, "--max-exposed"), max_exposed, None)
    step = read(lambda t: _duration(t, "--max-step"), max_step, None)
    ttft = read(lambda t: _duration(t, "--max-ttft"), max_ttft, None)
    tpot = read(lambda t: _duration(t, "--max-tpot"), max_tpot, None)
    if errors:
        raise UsageErrors(errors)
    return Limits(share, size, exposed, step, ttft, tpot)


def _percent(share: float) -> str:
    """A limit as the user gave it: 0.05 → "5%"; 0.125 → "12.5%"; 0.00560512 → "0.560512%",
    in the digits it was given in (`_written`; audits: 0.5461493767899% read as
    0.54614937679%, the figure over it then printed alike, and 1.4376202271069097% as
    1.43762022710691%)."""
    return f"{format((_written(share) * 100).normalize(), 'f')}%"


def _written(share: float) -> Decimal:
    """A share as it was written: the shortest decimal that gives the float back (0.05, not
    0.05000000000000000277), which is the typed one for any share of up to 15 significant
    digits; times 100 it is the percentage typed, where share * 100 in floats read
    1.4376202271069097% as 1.43762022710691% (an audit)."""
    return Decimal(repr(float(share))).normalize()


def _gib(n: float, digits: int = 2) -> str:
    """Always in GiB with the exact bytes: "5.20 GiB (5,583,457,280 B)"."""
    return f"{n / GIB:,.{digits}f} GiB ({int(n):,} B)"


def _gib_pair(value: float, limit: float) -> tuple[str, str]:
    """`value` and its `limit` in GiB with the exact bytes, both with the fewest decimals
    (two at least) at which they read apart and on their own sides: 51.897 GiB free short
    of a required 51.900, not 51.90 beside 51.90, nor 53.781 beside a limit shown as 53.78
    that is really 53.7813."""
    digits = decimals_apart((value / GIB, limit / GIB))
    return _gib(value, digits), _gib(limit, digits)


def _amount(n: float) -> str:
    """A difference in its own unit with the exact bytes: "3.07 MiB (3,223,962 B)", or
    just "512 B"."""
    return format_bytes(n) if n < 1024 else f"{format_bytes(n)} ({int(n):,} B)"


def _largest(items: tuple[Overlapping, ...], limit: int = 3) -> str:
    return ", ".join(
        f"{o.tensor}{f' ×{o.count:,}' if o.count > 1 else ''} {format_bytes(o.bytes)}"
        for o in items[:limit]
    )


def _others(
    report: Report, row: StageRow, excess: Callable[[StageRow], int]
) -> tuple[tuple[int, int], ...]:
    """Stages other than `row` with a positive `excess`, (stage, excess), largest first."""
    over = ((s.stage, excess(s)) for s in report.stages if s.stage != row.stage)
    return tuple(sorted(((s, e) for s, e in over if e > 0), key=lambda p: (-p[1], p[0])))


def _also(others: tuple[tuple[int, int], ...], past: str, says: tuple[str, str]) -> str:
    """ "; stages 3 (1.20 GiB over), 1 (512 MiB over) and 2 more do not fit either": the
    first four other stages with their excess `past` the limit, then what `says` of one
    stage or of several; "" without others."""
    if not others:
        return ""
    shown = 4
    listed = ", ".join(f"{s} ({format_bytes(e)} {past})" for s, e in others[:shown])
    more = f" and {len(others) - shown} more" if len(others) > shown else ""
    noun, verb = ("stage", says[0]) if len(others) == 1 else ("stages", says[1])
    return f"; {noun} {listed}{more} {verb}"


def _memory_reason(report: Report, row: StageRow) -> Reason:
    over = row.peak_bytes - row.capacity_bytes
    peak, capacity = _gib_pair(row.peak_bytes, row.capacity_bytes)
    others = _others(report, row, lambda s: s.peak_bytes - s.capacity_bytes)
    return Reason(
        limit="memory",
        message=(
            f"stage {row.stage} does not fit: it peaks at {peak} in {row.peak_phase} "
            f"({row.peak_instant}), {_amount(over)} over the {capacity} "
            "device; largest at that peak: "
            f"{_largest(row.peak_overlap)}"
            f"{_also(others, 'over', ('does not fit either', 'do not fit either'))}"
        ),
        stage=row.stage,
        actual=row.peak_bytes,
        required=row.capacity_bytes,
        excess=over,
        contributors=row.peak_overlap[:3],
        other_stages=others,
    )


def _headroom_reason(report: Report, row: StageRow, required: int, limits: Limits) -> Reason | None:
    short = required - row.headroom_bytes
    if short <= 0:
        return None
    others = _others(report, row, lambda s: required - s.headroom_bytes)
    free, needed = _gib_pair(row.headroom_bytes, required)
    asked = (
        "" if limits.headroom_share is None else f" ({_percent(limits.headroom_share)} of capacity)"
    )
    if required >= row.capacity_bytes - report.device["reserved_bytes"]:  # a review
        asked += ", more than the device could leave free with nothing allocated"
    return Reason(
        limit="headroom",
        message=(
            f"stage {row.stage} leaves {free} free at its peak "
            f"in {row.peak_phase} ({row.peak_instant}), {_amount(short)} short of the "
            f"required {needed}{asked}; largest at that peak: "
            f"{_largest(row.peak_overlap)}"
            f"{_also(others, 'short', ('is short of it too', 'are short of it too'))}"
        ),
        stage=row.stage,
        actual=row.headroom_bytes,
        required=required,
        excess=short,
        contributors=row.peak_overlap[:3],
        other_stages=others,
    )


def _untimed(limit: LimitName, option: str) -> Reason:
    return Reason(
        limit=limit,
        message=(
            f"{option} cannot be checked: the step time was not computed (the device section "
            "has no peak FLOP/s or memory bandwidth)"
        ),
        stage=None,
        actual=None,
        required=None,
        excess=None,
    )


def _phases(
    report: Report, key: str, limit: int = 3, only: list[PhaseRow] | None = None, per: int = 1
) -> tuple[tuple[str, float], ...]:
    """The `limit` phases (of `only`, if given) with the most exposed or busy time, each
    divided by `per` (a decode phase's passes), as (phase, seconds)."""
    values = []
    for p in report.phases if only is None else only:
        value = (
            (p.exposed_s or 0.0)
            if key == "exposed"
            else (p.compute_s or 0.0) + (p.exposed_s or 0.0)
        )
        if value > 0:
            values.append((p.name, value / per))
    values.sort(key=lambda v: -v[1])
    return tuple(values[:limit])


def _named(phases: tuple[tuple[str, float], ...]) -> str:
    """`_phases` as the messages name them: "forward.mlp 496 ms, ..."."""
    return ", ".join(f"{name} {format_duration(value)}" for name, value in phases)


def _exposed_reason(report: Report, share: float) -> Reason | None:
    time_s, exposed_s = report.step["time_s"], report.step["exposed_comm_s"]
    if time_s is None or exposed_s is None:
        return _untimed("max_exposed", "--max-exposed")
    actual = exposed_s / time_s if time_s else 0.0
    if actual <= share:
        return None
    over = exposed_s - share * time_s
    pacing = report.step.get("pacing_stage")
    phases = _phases(report, "exposed")
    return Reason(
        limit="max_exposed",
        message=(
            f"exposed communication takes {_finer(actual, share)} of the {time_word(report.mode)} "
            f"({format_duration(exposed_s)} of {format_duration(time_s)}), over the "
            f"{_percent(share)} limit by "
            f"{format_duration(over)}; most exposed phases: {_named(phases)}"
        ),
        stage=None if pacing is None else int(pacing),  # the share is the pacing stage's
        actual=actual,
        required=share,
        excess=actual - share,
        phases=phases,
    )


def _step_reason(report: Report, max_step: float) -> Reason | None:
    time_s = report.step["time_s"]
    if time_s is None:
        return _untimed("max_step", "--max-step")
    if time_s <= max_step:
        return None
    bubble = report.step.get("bubble_s") or 0.0
    phases = _phases(report, "busy")
    return Reason(
        limit="max_step",
        message=(
            f"the {time_word(report.mode)} takes {_distinct(time_s, max_step)}, "
            f"{format_duration(time_s - max_step)} "
            f"over the {_exact(max_step)} limit; largest phases (compute + exposed "
            f"communication): {_named(phases)}"
            # a serving plan's batch crosses its stages one after the other: no bubble
            + (
                f"; pipeline bubble {format_duration(bubble)}"
                if report.layout["pp"] > 1 and report.mode == "train"
                else ""
            )
        ),
        stage=None,
        actual=time_s,
        required=max_step,
        excess=time_s - max_step,
        phases=phases,
    )


# Serving latency limits: the report's figure, the option, the figure in words, and the
# plans that have it (vLLM's and TensorRT-LLM's TTFT and TPOT, `inference.decode_passes`)
_LATENCY: dict[LimitName, tuple[str, str, str, str, tuple[str, ...]]] = {
    "max_ttft": (
        "ttft_s",
        "--max-ttft",
        "the time to first token",
        "prefill",
        ("prefill", "decode"),
    ),
    "max_tpot": (
        "decode_token_s",
        "--max-tpot",
        "the time per output token",
        "decode pass",
        ("decode",),
    ),
}


def _latency_limit(limits: Limits, name: LimitName) -> float | None:
    return limits.max_ttft_s if name == "max_ttft" else limits.max_tpot_s


def latency_notes(report: Report, limits: Limits) -> tuple[str, ...]:
    """The serving latency limits set that `report` has no figure for (a train plan has no
    first token, a prefill plan no decode pass): said, not failed, so one `budget check`
    can gate a directory of training and serving plans."""
    return tuple(
        f"{option} does not apply to a {report.mode} plan, which runs no {phase}"
        for name, (_, option, _, phase, modes) in _LATENCY.items()
        if _latency_limit(limits, name) is not None and report.mode not in modes
    )


def _latency_reason(report: Report, name: LimitName, limit: float) -> Reason | None:
    """`name`'s figure over `limit`, with the phases that take the most of it: the prefill's
    for the first token, the decode pass's for an output token."""
    key, option, what, _, modes = _LATENCY[name]
    if report.mode not in modes:  # said in `latency_notes`, not failed
        return None
    if report.step["time_s"] is None:
        return _untimed(name, option)
    actual = report.step.get(key)
    if actual is None or actual <= limit:
        return None
    # the pass's own phases and the transitions written on it ("decode: NAME")
    wanted = "prefill" if name == "max_ttft" else "decode"
    busy = [p for p in report.phases if pass_of(p.name) == wanted]
    # a decode phase's row sums its passes
    passes = 1 if name == "max_ttft" else passes_for(report.layout["generate"])
    per = "" if passes == 1 else " per output token"
    phases = _phases(report, "busy", only=busy, per=passes)
    return Reason(
        limit=name,
        message=(
            f"{what} is {_distinct(actual, limit)}, {format_duration(actual - limit)} over "
            f"the {_exact(limit)} limit; largest phases{per} (compute + exposed "
            f"communication): {_named(phases)}"
        ),
        stage=None,
        actual=actual,
        required=limit,
        excess=actual - limit,
        phases=phases,
    )


def check_report(report: Report, limits: Limits) -> tuple[Reason, ...]:
    """Every limit `report` breaks, memory first; an empty tuple when it passes."""
    worst = report.worst
    reasons: list[Reason | None] = []
    if not worst.fits:
        reasons.append(_memory_reason(report, worst))
    else:
        required = limits.required_headroom(worst.capacity_bytes)
        if required is not None:
            reasons.append(_headroom_reason(report, worst, required, limits))
    if limits.max_exposed_share is not None:
        reasons.append(_exposed_reason(report, limits.max_exposed_share))
    if limits.max_step_s is not None:
        reasons.append(_step_reason(report, limits.max_step_s))
    for name in _LATENCY:
        limit = _latency_limit(limits, name)
        if limit is not None:
            reasons.append(_latency_reason(report, name, limit))
    return tuple(r for r in reasons if r is not None)


def check_plans(paths: Iterable[Path], limits: Limits) -> CheckResult:
    """Budget and check every plan; an invalid plan is recorded and the rest still run."""
    from budget.pipeline import budget_plan
    from budget.plan.load import plan_name

    verdicts = []
    for path in paths:
        try:
            report = budget_plan(path)
        except BudgetError as error:
            verdicts.append(Verdict(plan_name(path), None, problems=tuple(error.problems)))
            continue
        reasons, notes = check_report(report, limits), latency_notes(report, limits)
        notes += slow_link_notes(report)  # said, not failed
        if not report.device["reserved_bytes"]:  # said beside the figures, not failed
            notes += (
                "device.reserved is 0, so the headroom counts nothing for the CUDA context, "
                "NCCL's buffers or the allocator's slack",
            )
        verdicts.append(Verdict(plan_name(path), report, reasons, notes=notes))
    return CheckResult(limits, tuple(verdicts))


def _plan_dict(verdict: Verdict) -> dict[str, Any]:
    report = verdict.report
    out: dict[str, Any] = {
        "file": verdict.file,
        "passed": verdict.passed,
        "valid": verdict.valid,
        "reasons": [r.to_dict() for r in verdict.reasons],
        "problems": problem_lines(verdict.problems),
        "notes": list(verdict.notes),
    }
    if report is not None:
        worst = report.worst
        out |= {
            "name": report.name,
            "fits": report.fits,
            "worst_stage": worst.stage,
            "peak_bytes": worst.peak_bytes,
            "capacity_bytes": worst.capacity_bytes,
            "headroom_bytes": worst.headroom_bytes,
            "step_time_s": report.step["time_s"],
            "exposed_share": report.step.get("exposed_share"),
            "ttft_s": report.step.get("ttft_s"),
            "tpot_s": report.step.get("decode_token_s"),
        }
    return out


def check_to_dict(result: CheckResult) -> dict[str, Any]:
    """`{passed, plans[{file, passed, reasons[]}]}` (DESIGN.md) plus the limits and figures."""
    return {
        "passed": result.passed,
        "limits": result.limits.to_dict(),
        "plans": [_plan_dict(v) for v in result.verdicts],
    }
