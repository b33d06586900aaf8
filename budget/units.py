"""Quantities with units at the edges: "80 GiB", "450 GB/s", "3 us", "989 TFLOP/s".

Inside budget, bytes are ``int``, times are seconds (``float``), bandwidths are bytes per
second and compute rates are FLOP per second. Decimal prefixes are powers of 1000 (GB = 1e9),
binary prefixes powers of 1024 (GiB = 2**30), as in IEC 80000-13; the two are never mixed.
Kilo is k (kB = 1000 B, KiB = 1024 B); "KB", 1024 B under JEDEC, is refused as ambiguous.
A bare number is a size in bytes; a bandwidth, a time or a compute rate must name its unit
(``bandwidth: 450`` means 450 GB/s to its author, not 450 B/s), 0 aside, the same in every
unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from fractions import Fraction

__all__ = [
    "MAX_INT",
    "UnitError",
    "ambiguous_prefix",
    "decimals_apart",
    "duration_unit",
    "format_bytes",
    "format_duration",
    "format_flop_count",
    "format_flops",
    "format_rate",
    "missing_unit",
    "parse_bandwidth",
    "parse_bytes",
    "parse_duration",
    "parse_flops",
    "plural",
    "unit_scale",
]


class UnitError(ValueError):
    """A quantity that cannot be read; the message says what was expected."""


# "K" is read as kilo in a compute rate only ("1 KFLOP/s"): a size or bandwidth in "KB"
# is refused, JEDEC's KB being 1024 B (`_prefix`)
_DECIMAL = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
# Exact fractions: Fraction(1e-6) would be the binary float's value, so "5 us" would not
# come out as the float 5e-06.
_TIME = {
    "s": Fraction(1),
    "ms": Fraction(1, 10**3),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "μs": Fraction(1, 10**6),
    "ns": Fraction(1, 10**9),
}
_NUMBER = r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE](?P<exp>[+-]?[0-9]+))?)"
_LONGEST = 64  # characters; exact arithmetic on "1e-9999999" would take seconds
_QUANTITY = re.compile(_NUMBER + r"\s*(?P<unit>[^\s\d].*)?$")
_LARGEST = 1e30  # anything above is a typo or an attack, not a real machine
# Integers beyond int64 are typos or attacks, not plan dimensions: the plan's YAML loader
# refuses them (`budget.plan.yaml_load`, which imports this), and `parse_bytes` a count of
# bytes as large ("1e30 B", "9223372036854775808 B"), which a bare integer could not be
MAX_INT = 2**63


def _split(text: str | int | float, what: str) -> tuple[Fraction, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected {what}, got a boolean")
    if isinstance(text, int):
        return Fraction(text), ""
    if isinstance(text, float):
        if not math.isfinite(text):
            raise UnitError(f"expected {what}, got {text}")
        return Fraction(text), ""
    if not isinstance(text, str):
        raise UnitError(f"expected {what}, got {type(text).__name__}")
    if len(text) > _LONGEST:
        raise UnitError(f"expected {what}, got {len(text)} characters")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise UnitError(f"expected {what}, got {text!r}")
    if match["exp"] is not None and abs(int(match["exp"])) > 300:
        raise UnitError(f"{text!r} is out of range for {what}")
    number = float(match["num"])
    if not math.isfinite(number) or abs(number) > _LARGEST:
        raise UnitError(f"{text!r} is too large to be {what}")
    return Fraction(match["num"]), (match["unit"] or "").strip()


def _prefix(unit: str, base: str, text: str, what: str) -> int:
    """The multiplier of a prefixed unit such as "GiB" or "GB" (base "B")."""
    if not unit.endswith(base):
        raise UnitError(f"expected {what}, got {text!r}")
    prefix = unit[: len(unit) - len(base)]
    if prefix == "K":  # IEC 80000-13's kilo is k; JEDEC's "KB" is 1024 B: which, the author knows
        raise UnitError(_jedec_kilo(text, base))
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    raise UnitError(
        f"unknown prefix {prefix!r} in {text!r} (use k, M, G, T, P or Ki, Mi, Gi, Ti, Pi)"
    )


def _nonnegative(value: Fraction, text: object, what: str) -> Fraction:
    if value < 0:
        raise UnitError(f"{text!r} is negative; expected {what}")
    if value > _LARGEST:
        raise UnitError(f"{text!r} is too large to be {what}")
    return value


def parse_bytes(text: str | int | float, whole: bool = False) -> int:
    """Bytes as an integer: "80 GiB" → 85899345920, "80GB" → 80000000000, 4096 → 4096.

    A fractional result is rounded up: memory is allocated in whole bytes. With `whole`
    it is refused instead (a tensor of 1.5 B).
    """
    what = "a size such as '80 GiB' or '80 GB'"
    value, unit = _split(text, what)
    if unit:
        value *= _prefix(unit, "B", str(text), what)
    value = _nonnegative(value, text, what)
    if whole and value.denominator != 1:
        raise UnitError(f"{text!r} is {float(value):g} bytes; bytes are whole")
    count = math.ceil(value)
    if count >= MAX_INT:  # as the bare integer 9223372036854775808 is refused
        raise UnitError(f"{text!r} is too large (sizes must be below 2**63 bytes)")
    return count


UNIT_LEFT_OUT = 2**20  # a bare size under 1 MiB is a unit left out, not a real size


def unit_left_out(value: object) -> float | None:
    """The number when ``value`` is a bare number (no unit: bytes) that is positive and under
    1 MiB, which no device memory or headroom means: ``80`` for 80 GiB. None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if 0 < number < UNIT_LEFT_OUT else None


# the units a bare number of each quantity is likeliest meant in, for the error's suggestion
_LIKELY_UNITS = {
    "bandwidth": ("GB/s", "Gb/s"),
    "time": ("us", "ms", "s"),
    "compute rate": ("TFLOP/s",),
}
# A number this far from those units' range reads as the base unit (DESIGN: bare numbers are
# bytes/s, seconds and FLOP/s): the suggestion then says it with the prefix that makes it
# 1 to 999, powers of 1000 from the first, exactly (`format_rate` and its siblings round to
# three figures, which would suggest another value); a time of 10 ms or more keeps the
# plain suggestion (`_SECONDS_BELOW`).
_BASE_UNITS: dict[str, tuple[Fraction, tuple[str, ...]]] = {
    "bandwidth": (Fraction(10**6), ("MB/s", "GB/s", "TB/s")),
    "compute rate": (Fraction(10**6), ("MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s")),
    "time": (Fraction(1, 10**9), ("ns", "us", "ms")),
}
# a time at or above this reads as a value in the likely units ("0.5" is 0.5 us or ms
# as likely as 0.5 s): only a smaller one is taken for seconds ("0.0015" as 1.5 ms)
_SECONDS_BELOW = Fraction(1, 100)


def _in_base_unit(number: str, quantity: str) -> str | None:
    """`number` said with the prefix that makes it 1 to 999 when it is past the
    `_LIKELY_UNITS` range (450e9 as '450 GB/s', 3e-06 as '3 us'); None within it."""
    value = abs(Fraction(number))
    first, units = _BASE_UNITS[quantity]
    small = quantity == "time"
    if (value >= _SECONDS_BELOW) if small else (value < first):
        return None
    scaled, unit = Fraction(number) / first, units[0]
    for bigger in units[1:]:
        if abs(scaled) < 1000:
            break
        scaled, unit = scaled / 1000, bigger
    if abs(scaled) < 1:  # under the first prefix's range (a time under 1 ns)
        return None
    shown = str(scaled.numerator) if scaled.denominator == 1 else f"{float(scaled):.15g}"
    return f"'{shown} {unit}'"


def missing_unit(value: object, quantity: str) -> str | None:
    """What to say of a `quantity` ("bandwidth", "time", "compute rate") written as a bare
    number other than 0, which no unit is assumed for: ``450`` → "450 has no unit; write a
    bandwidth with its unit, such as '450 GB/s' or '450 Gb/s'"; a number past those units'
    range is said in the base unit it would be (``450e9`` → "such as '450 GB/s'",
    ``3e-06`` → "'3 us'", `_in_base_unit`). None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = str(value)
    elif isinstance(value, float) and math.isfinite(value):
        number = f"{value:.15g}"
    elif isinstance(value, str) and len(value) <= _LONGEST and re.fullmatch(_NUMBER, value.strip()):
        number = value.strip()
    else:
        return None
    if float(number) == 0:
        return None
    if number.startswith("-"):  # no unit makes it one: say so, and suggest none (an audit:
        # "such as '-450 GB/s'", which is refused as negative)
        return f"{number} has no unit and is negative; write a {quantity} above 0 with its unit"
    if based := _in_base_unit(number, quantity):
        return f"{number} has no unit; write a {quantity} with its unit, such as {based}"
    shown = [f"'{number} {unit}'" for unit in _LIKELY_UNITS[quantity]]
    such = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
    return f"{number} has no unit; write a {quantity} with its unit, such as {such}"


def ambiguous_prefix(value: object) -> str | None:
    """The parser's refusal of JEDEC's "K" (`_prefix`) in a size or bandwidth such as "80 KB"
    or "3 Kb/s", for the schema to say when its pattern refuses one (`budget.plan.schema`);
    None for any other value."""
    if not isinstance(value, str):
        return None
    try:
        _, unit = _split(value, "a size")
    except UnitError:
        return None
    base = unit.removesuffix("/s")
    return _jedec_kilo(value, base[1:]) if base in ("KB", "Kb", "Kbit") else None


def _jedec_kilo(text: str, base: str) -> str:
    """Why "K" + `base` in `text` is refused, and what to write instead."""
    what_unit = "bytes" if base == "B" else "bits"
    return (
        f"ambiguous prefix 'K' in {text!r}: write k{base} for 1000 {what_unit} or Ki{base} for 1024"
    )


def _unit_given(value: Fraction, unit: str, text: object, quantity: str) -> None:
    if not unit and value != 0:
        raise UnitError(missing_unit(text, quantity) or f"write a {quantity} with its unit")


def parse_bandwidth(text: str | int | float) -> float:
    """Bytes per second: "450 GB/s" → 4.5e11, "25 GiB/s" → 26843545600.0; a bare number
    other than 0 is refused (`missing_unit`).

    Network links are quoted in bits: "200 Gb/s" or "200 Gbit/s" (a lower-case b) is read
    as 25 GB/s, eight bits to the byte.
    """
    what = "a bandwidth such as '450 GB/s' or '200 Gb/s'"
    value, unit = _split(text, what)
    _unit_given(value, unit, text, "bandwidth")
    if unit:
        if not unit.endswith("/s"):
            raise UnitError(f"expected {what}, got {text!r}")
        rate = unit[:-2]
        if rate.endswith("bit") or rate.endswith("b"):
            bits = rate.removesuffix("it") if rate.endswith("bit") else rate
            value *= Fraction(_prefix(bits, "b", str(text), what), 8)
        else:
            value *= _prefix(rate, "B", str(text), what)
    return float(_nonnegative(value, text, what))


def parse_duration(text: str | int | float) -> float:
    """Seconds: "3 us" → 3e-06, "1.5 ms" → 0.0015, "12s" → 12.0; a bare number other than
    0 is refused (`missing_unit`)."""
    what = "a time such as '3 us', '2 ms' or '12 s'"
    value, unit = _split(text, what)
    _unit_given(value, unit, text, "time")
    if unit:
        if unit not in _TIME:
            raise UnitError(f"expected {what}, got {text!r}")
        value *= _TIME[unit]
    return float(_nonnegative(value, text, what))


def parse_flops(text: str | int | float) -> float:
    """FLOP per second: "989 TFLOP/s" → 9.89e14; "312 TFLOPS" is read the same way; a bare
    number other than 0 is refused (`missing_unit`)."""
    what = "a compute rate such as '989 TFLOP/s'"
    value, unit = _split(text, what)
    _unit_given(value, unit, text, "compute rate")
    if unit:
        for suffix in ("FLOP/s", "FLOPS", "FLOPs/s"):
            if unit.endswith(suffix):
                prefix = unit[: len(unit) - len(suffix)]
                if prefix not in _DECIMAL:
                    raise UnitError(f"unknown prefix {prefix!r} in {text!r}")
                value *= _DECIMAL[prefix]
                break
        else:
            raise UnitError(f"expected {what}, got {text!r}")
    return float(_nonnegative(value, text, what))


def decimals_apart(values: Iterable[float], start: int = 2, most: int = 12) -> int:
    """The fewest decimals from `start` at which every two different `values` print apart
    (rounding keeps their order, so they also print on their own sides), or `most`."""
    distinct = set(values)
    return next(
        (d for d in range(start, most) if len({round(v, d) for v in distinct}) == len(distinct)),
        most,
    )


def plural(n: int, word: str, many: str = "") -> str:
    """A count and its noun, singular for one: "1 layer", "80 layers", "1 micro-batch"."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def format_share(share: float) -> str:
    """A share as a percentage to one decimal, "55.4%", or to two significant figures where
    one decimal reads as nought: "0.049%" (an audit: a 171,136-parameter model's MFU of
    0.049 % printed "0.0%")."""
    percent = share * 100
    if percent == 0 or abs(percent) >= 0.05:
        return f"{share:.1%}"
    return f"{percent:.{1 - math.floor(math.log10(abs(percent)))}f}%"


def format_amount(x: float) -> str:
    """A rate or amount for people: whole from 10 ("410,957", "44"), three significant
    figures under it ("0.396", "4.20"; an audit: 0.396 generated tokens/s printed "0")."""
    if x == 0 or abs(x) >= 9.995:
        return f"{x:,.0f}"
    return f"{x:.{2 - math.floor(math.log10(abs(x)))}f}"


def format_count(n: float) -> str:
    """A count of parameters for people: "70.55 billion", "494.03 million", and under a
    million the count itself, "171,136" (an audit: a 171,136-parameter model read "0.00
    billion")."""
    if abs(n) >= 999_995_000:
        return f"{n / 1e9:,.2f} billion"
    if abs(n) >= 1e6:
        return f"{n / 1e6:,.2f} million"
    return f"{n:,.0f}"


def format_bytes(n: float, binary: bool = True) -> str:
    """A size for people, three significant digits: "1.50 GiB", "17.6 GiB", "126 MiB".

    Binary prefixes by default; decimal ("GB") on request. Exact bytes belong in JSON.
    """
    step, prefixes = (
        (1024, _BINARY_SIZES)
        if binary
        else (
            1000,
            ("B", "kB", "MB", "GB", "TB", "PB"),
        )
    )
    value = float(n)
    for prefix in prefixes:
        if abs(value) < step or prefix == prefixes[-1]:
            break
        value /= step
    if prefix == "B":
        return f"{value:.0f} B"
    # three significant digits of the value as it rounds: 9.996 GiB is "10.0 GiB", and
    # 1,023.8 MiB, which would round to "1024 MiB", is "1.00 GiB"; from 1,000 of a binary
    # unit, four digits where every other size has three, the next unit's ("1002 MiB" is
    # "0.979 GiB": an audit, m427)
    if round(abs(value)) >= 1000 and prefix != prefixes[-1]:
        value, prefix = value / step, prefixes[prefixes.index(prefix) + 1]
    size = abs(value)
    digits = (
        3 if round(size, 3) < 1 else 2 if round(size, 2) < 10 else 1 if round(size, 1) < 100 else 0
    )
    return f"{value:.{digits}f} {prefix}"


def format_duration(seconds: float) -> str:
    """A time for people, three significant digits kept: "2.09 ms", "4.20 µs", "12.3 s";
    whole numbers stay whole ("3 µs", "10 s")."""
    if seconds == 0:
        return "0 s"
    scale, unit = duration_unit(seconds)
    if abs(seconds / scale) >= 999.5 and unit != "s":  # 999.6 ms is written 1.00 s
        scale, unit = duration_unit(seconds / abs(seconds) * scale * 1e3)
    value = seconds / scale
    if abs(value) >= 999.5 and unit == "s":
        return f"{value:,.0f} s"
    if unit == "ns" and abs(value) < 0.005:  # not "0.00 ns": `check`'s excess of 9 fs (an audit)
        return f"{value:.2g} ns"
    if abs(value - round(value)) < 1e-9 * max(1.0, abs(value)):
        return f"{value:.0f} {unit}"  # a round figure, such as a limit or a latency
    digits = 2 if abs(value) < 9.995 else 1 if abs(value) < 99.95 else 0
    return f"{value:.{digits}f} {unit}"


def duration_unit(seconds: float) -> tuple[float, str]:
    """The scale and unit a time is written in: s, ms, µs or ns, the largest it reaches."""
    return next((s, u) for s, u in _DURATIONS if abs(seconds) >= s or u == "ns")


# the units `format_bytes` (binary) and `format_duration` write, with what one of each is
_BINARY_SIZES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_DURATIONS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def unit_scale(unit: str) -> float | None:
    """What one `unit` that `format_bytes` or `format_duration` writes is, in bytes or
    seconds ("GiB": 2^30, "ms": 1e-3), for a figure written again with more decimals in the
    same unit; None for any other."""
    if unit in _BINARY_SIZES:
        return float(1024 ** _BINARY_SIZES.index(unit))
    return next((scale for scale, name in _DURATIONS if name == unit), None)


def _decimal(value: float, unit: str) -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def format_rate(bytes_per_second: float) -> str:
    """A bandwidth for people, in decimal units as vendors quote them: "450 GB/s"."""
    return _decimal(bytes_per_second, "B/s")


def format_flops(flops: float) -> str:
    """A compute rate for people: "989 TFLOP/s"."""
    return _decimal(flops, "FLOP/s")


def format_flop_count(flops: float) -> str:
    """An amount of work for people: "2.411 GFLOP"."""
    return _decimal(flops, "FLOP")
