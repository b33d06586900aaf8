"""The two calculators behind `budget collective` and `budget roofline`.

They parse the command line's unit strings, call the same engine the plan report uses
(`budget.collectives`, `budget.topology`, `budget.compute`) and return plain results whose
``to_dict`` is the JSON contract of DESIGN.md. Bad input raises ValueError with a one-line
message, or `UsageErrors` with one for every bad option; the CLI prints each as
``budget: error: ...`` and exits 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar, cast

from budget.collectives import ALIASES, OPS, Algorithm, CollectiveCost, Op, Stage, default_algorithm
from budget.compute import Roofline
from budget.compute import roofline as compute_roofline
from budget.errors import UsageErrors
from budget.plan.model import OVERLAP_SLOWDOWN, Level, Topology
from budget.topology import MAX_GPUS, price_group, span_of_ranks
from budget.units import UnitError, parse_bandwidth, parse_bytes, parse_duration, parse_flops

__all__ = [
    "CollectiveResult",
    "RooflineResult",
    "bus_factor_text",
    "collective",
    "parse_level",
    "roofline",
]

_ALGORITHM_NAMES = (
    "ring",
    "recursive",
    "tree",
    "pairwise",
    "bruck",
    "direct",
    "hierarchical",
    "double-tree",
    "auto",
)


@dataclass(frozen=True, slots=True)
class CollectiveResult:
    """One priced collective, with scalar sizes (plain int / float throughout)."""

    cost: CollectiveCost
    levels: tuple[Level, ...]
    # compute the collective runs beside (``--beside``): what of T it hides, when a valid
    # overlap schedule exists; None: nothing beside it, all of T exposed
    beside_s: float | None = None
    # an unnamed all-reduce across levels takes NCCL's ring or its tree, whichever is faster
    # (`collectives._nccl_all_reduce`): the one it passed over and its time
    passed_over: tuple[str, float] | None = None
    # the name asked for where it means another algorithm (`collectives.ALIASES`: an
    # all-to-all's ring is its pairwise exchange), said beside the one priced
    asked: str | None = None
    # how much slower the compute beside it runs while it overlaps (a plan's
    # ``overlap.slowdown``, whose default it takes: `schedule.time_phase`)
    slowdown: float = OVERLAP_SLOWDOWN

    @property
    def exposed_s(self) -> float:
        """The part of T the step waits for beside W seconds of compute it does not depend
        on, by `budget.schedule.time_phase`'s rule with no floor and all of W shared: the
        compute progresses at 1 − s of its rate beside it, so its W seconds last W / (1 − s)
        and hide that long a collective, max(0, T − W / (1 − s)); all of T without W. It had
        been T − W, where a plan's report of the same pair read less (an audit: 130.8 µs
        against the plan's 81.8 µs)."""
        time = float(self.cost.time_s)
        if self.beside_s is None:
            return time
        return max(0.0, time - self.beside_s / (1 - self.slowdown))

    @property
    def slowed_s(self) -> float:
        """What the hidden part adds to the compute beside it, s · (T − exposed)
        (`time_phase`'s slowdown); 0 without W."""
        if self.beside_s is None:
            return 0.0
        return self.slowdown * (float(self.cost.time_s) - self.exposed_s)

    def to_dict(self) -> dict[str, Any]:
        """`{op, algorithm, ranks, size_bytes, steps, sent_bytes, recv_bytes, latency_s,
        bandwidth_Bps, time_s}` plus bus/algorithm bandwidth; ``levels`` (per-stage pieces)
        for a multi-stage algorithm and ``candidates`` when ``auto`` chose.

        latency_s and bandwidth_Bps are α and B_eff of the link the collective is priced at
        (for a multi-level algorithm, the slowest link it uses; each stage gives its own),
        B_eff as reached at this size on a link with a bandwidth ramp.
        """
        cost = self.cost
        out: dict[str, Any] = {
            "op": cost.op,
            "algorithm": cost.algorithm,
            "ranks": int(cost.ranks),
            "size_bytes": int(cost.size_bytes),
            "steps": int(cost.steps),
            "sent_bytes": int(cost.sent_bytes),
            "recv_bytes": int(cost.recv_bytes),
            # summed over every rank of the group (DESIGN.md rule 4: aggregate bytes are
            # reported as such, never divided by one link's bandwidth)
            "aggregate_sent_bytes": int(cost.aggregate_sent_bytes),
            "aggregate_recv_bytes": int(cost.aggregate_recv_bytes),
            # the bytes on the critical path, the busiest rank's: Q of T = n·α + Q/B on one
            # level; across levels each level's bytes and rate are under "levels"
            "payload_bytes": int(cost.payload_bytes),
            "latency_s": float(cost.link.latency),
            "bandwidth_Bps": cost.reached_bandwidth,
            "time_s": float(cost.time_s),
            # T's two terms, over the levels where there are levels (each level's α and B
            # are its own, so steps · latency_s is not the latency term there)
            "latency_term_s": float(cost.latency_s),
            "bandwidth_term_s": float(cost.bandwidth_s),
            "bus_bandwidth_Bps": float(cost.bus_bandwidth),
            "algorithm_bandwidth_Bps": float(cost.algorithm_bandwidth),
        }
        if len(cost.stages) > 1:
            out["levels"] = [_stage_dict(stage) for stage in cost.stages]
        if cost.candidates:
            out["candidates"] = [
                {"algorithm": name, "time_s": time} for name, time in cost.candidates
            ]
        if self.beside_s is not None:
            out["beside_s"] = self.beside_s
            out["slowdown"] = self.slowdown
            out["exposed_s"] = self.exposed_s
            out["slowdown_s"] = self.slowed_s
        if self.passed_over is not None:  # the table's "faster here than ..." (an audit)
            other, time = self.passed_over
            out["passed_over"] = {"algorithm": other, "time_s": time}
        return out


@dataclass(frozen=True, slots=True)
class RooflineResult:
    roofline: Roofline

    def to_dict(self) -> dict[str, Any]:
        """`{intensity, bandwidth_Bps, peak_flops, attainable_flops, ridge_intensity, bound}`."""
        r = self.roofline
        return {
            "intensity": r.intensity,
            "bandwidth_Bps": r.bandwidth_Bps,
            "peak_flops": r.peak_flops,
            "attainable_flops": r.attainable_flops,
            "ridge_intensity": r.ridge_intensity,
            "bound": r.bound,
        }


def collective(
    op: str,
    ranks: int | str | None,
    size: str,
    bandwidth: str | None,
    latency: str | None,
    levels: list[str],
    algorithm: str | None,
    ramp: str | None = None,
    beside: str | None = None,
    slowdown: str | None = None,
) -> CollectiveResult:
    """Price one collective from command-line strings.

    Either ``ranks`` with one ``bandwidth`` and ``latency``, or ``levels``
    ("SIZE:BANDWIDTH:LATENCY[:NAME]", innermost first; SIZE counts the units of the level
    below, so 8:450GB/s:1us then 4:50GB/s:5us is 4 nodes of 8 GPUs = 32 ranks, and
    ``ranks``, if given, must equal the product). Across several levels the default
    algorithm is the ring as NCCL runs it for an all-gather or reduce-scatter
    (`collectives._ring_across`), for an all-reduce that ring or NCCL's double binary tree,
    whichever is faster (`collectives._nccl_all_reduce`), for a broadcast NCCL's ring, for
    an all-to-all NCCL's grouped exchange with every peer (`collectives._exchange_across`);
    hierarchical when named; another flat algorithm is priced at the slowest link spanned
    and the largest α spanned.
    ``ramp`` names a measured bandwidth ramp (`budget.catalog.topologies.RAMPS`) for the
    single link or the innermost level, as a plan's ``topology.levels[].ramp`` does.
    ``beside`` is compute the collective may hide behind (`CollectiveResult.exposed_s`),
    which runs ``slowdown`` (a fraction from 0 to below 1) slower beside it.
    """
    from budget.catalog.topologies import RAMPS

    # every option read, every bad one said at once, in the order --help lists them
    errors: list[str] = []
    if op not in OPS:
        errors.append(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
    unread = False  # a --ranks that is no whole number, said here and not again below
    if isinstance(ranks, str):
        try:
            ranks = int(ranks.strip())
        except ValueError:
            errors.append(f"--ranks must be a whole number of ranks, such as 8, got {ranks!r}")
            ranks, unread = None, True
    if ranks is not None and not 1 <= ranks <= MAX_GPUS:
        errors.append(f"--ranks must be from 1 to {MAX_GPUS:,}, got {ranks:,}")
    size_bytes = _read(errors, partial(_size, size))
    link_bandwidth = link_latency = None
    if bandwidth is not None:
        link_bandwidth = _read(errors, partial(_bandwidth, bandwidth, f"--bandwidth {bandwidth!r}"))
    if latency is not None:
        where = f"--latency {latency!r}"
        link_latency = _read(errors, partial(_quantity, parse_duration, latency, where))
    parsed = [
        _read(errors, partial(parse_level, text, i, len(levels))) for i, text in enumerate(levels)
    ]
    if algorithm is not None and algorithm not in _ALGORITHM_NAMES:
        names = ", ".join(_ALGORITHM_NAMES)
        errors.append(f"--algorithm {algorithm!r}: unknown algorithm; expected one of {names}")
    if ramp is not None and ramp != "none" and ramp not in RAMPS:
        ramps = ", ".join(["none", *RAMPS])
        errors.append(f"--ramp {ramp!r}: unknown ramp; expected one of {ramps}")
    beside_s = None
    if beside is not None:
        where = f"--beside {beside!r}"
        beside_s = _read(errors, partial(_quantity, parse_duration, beside, where))
    share = OVERLAP_SLOWDOWN
    if slowdown is not None:
        read = _read(errors, partial(_slowdown, slowdown))
        share = OVERLAP_SLOWDOWN if read is None else read
        if beside is None:
            errors.append("--slowdown is of the compute beside the collective: give --beside")
    # and how they fit together: the group, on one link or on levels
    group: tuple[int, list[Level]] | None = None
    whole = [level for level in parsed if level is not None]
    if levels and (bandwidth is not None or latency is not None):
        errors.append("give either --bandwidth and --latency or --level, not both")
    elif levels and len(whole) == len(parsed):
        said = ranks is not None and not 1 <= ranks <= MAX_GPUS  # out of range, said above
        errors.extend(_levels_fit(whole, None if said else ranks))
        group = _levelled(whole)
    elif unread:
        pass
    elif not levels and (ranks is None or bandwidth is None or latency is None):
        errors.append("give --ranks, --bandwidth and --latency, or one --level per level")
    elif ranks is not None and link_bandwidth is not None and link_latency is not None:
        group = ranks, [Level("link", link_bandwidth, link_latency)]
    if errors or group is None or size_bytes is None:  # a None was said in `errors`
        raise UsageErrors(errors)
    world, topo_levels = group
    kind = cast(Op, op)  # one of OPS, read above
    if ramp is not None and ramp != "none":
        topo_levels[0] = replace(topo_levels[0], ramp=RAMPS[ramp])
    topology = Topology(gpus=world, levels=tuple(topo_levels))
    span = span_of_ranks(range(world), topology, "dp")
    try:
        cost = price_group(kind, size_bytes, span, cast(Algorithm | None, algorithm))
    except ValueError as error:  # one this collective has not (a user audit, m421: unnamed)
        if algorithm is None:
            raise
        raise ValueError(f"--algorithm {algorithm!r}: {error}") from None
    if not math.isfinite(cost.time_s):
        raise ValueError(
            f"the time of {size} over these links is past a float's range; give a latency and "
            "bandwidth one link has, such as 1us and 450GB/s"
        )
    spread = sum(units > 1 for units, _ in whole) >= 2  # a level of one unit adds no stage
    if algorithm == "hierarchical" and (cost.algorithm != algorithm or not spread):
        # a plan's group within one level falls back quietly; asked for here, it is said
        raise ValueError(
            f"--algorithm {algorithm} needs ranks on two or more levels (--level, each "
            f"over 1); on one link it would be {default_algorithm(kind)}: ask for that, or "
            "give levels"
        )
    passed_over = None
    if algorithm is None and op == "all-reduce" and len(cost.stages) > 1:
        other: Algorithm = "ring" if cost.algorithm == "double-tree" else "double-tree"
        time = float(price_group(kind, size_bytes, span, other).time_s)
        # a group of one rank moves nothing either way: nothing was faster
        passed_over = (other, time) if time != float(cost.time_s) else None
    asked = algorithm if (kind, algorithm) in ALIASES else None
    return CollectiveResult(cost, topology.levels, beside_s, passed_over, asked, share)


def _slowdown(text: str) -> float:
    """--slowdown: a fraction from 0 to below 1, as a plan's ``overlap.slowdown``."""
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise ValueError(
            f"--slowdown {text!r}: give a fraction from 0 to below 1, such as 0.189 (the "
            "default, a plan's overlap.slowdown) or 0 for ideal overlap"
        )
    return value


def parse_level(text: str, index: int = 0, count: int = 1) -> tuple[int, Level]:
    """ "8:450GB/s:1us" or "8:450GB/s:1us:nvlink" → (8, Level(...)). Unnamed levels are
    called "level 1", "level 2", ... innermost first. A bad SIZE, BANDWIDTH and LATENCY
    are each said (`UsageErrors`)."""
    parts = text.split(":")
    where = f"--level {text!r}"
    if len(parts) not in (3, 4):
        raise ValueError(f"{where}: expected SIZE:BANDWIDTH:LATENCY[:NAME], e.g. 8:450GB/s:1us")
    errors: list[str] = []
    units = _read(errors, partial(_units, parts[0], where))
    bandwidth = _read(errors, partial(_bandwidth, parts[1], where))
    latency = _read(errors, partial(_quantity, parse_duration, parts[2], where))
    if units is None or bandwidth is None or latency is None:
        raise UsageErrors(errors)
    name = parts[3].strip() if len(parts) == 4 and parts[3].strip() else f"level {index + 1}"
    if " + " in name:  # as a plan's level name (the schema): reports join levels with it
        raise ValueError(
            f"{where}: NAME {name!r} contains ' + ', which reports put between the levels a "
            "collective spans"
        )
    return units, Level(name, bandwidth, latency)


def _levelled(levels: Sequence[tuple[int, Level]]) -> tuple[int, list[Level]]:
    """The ranks the levels hold and each as a topology's level: SIZE counts the units of
    the level below, so 8 then 4 is 4 nodes of 8 GPUs, 32 ranks, the inner level 8 GPUs
    wide; the outermost takes every GPU (no size)."""
    domain, topology = 1, []
    for i, (count, level) in enumerate(levels):
        domain *= count
        size_gpus = None if i == len(levels) - 1 else domain
        topology.append(Level(level.name, level.bandwidth, level.latency, size_gpus))
    return domain, topology


def _units(text: str, where: str) -> int:
    """A level's SIZE: how many units of the level below it holds, at least 1."""
    try:
        units = int(text)
    except ValueError:
        raise ValueError(f"{where}: SIZE {text!r} is not a whole number") from None
    if units < 1:
        raise ValueError(f"{where}: SIZE must be at least 1")
    return units


def _levels_fit(levels: Sequence[tuple[int, Level]], ranks: int | None) -> list[str]:
    """What is wrong with the levels together: a name twice, more ranks than a topology
    holds, or not the ``ranks`` given (None: not given, or itself bad)."""
    errors = []
    named = [level.name for _, level in levels]
    twice = list(dict.fromkeys(n for n in named if named.count(n) > 1))
    if twice:  # a report naming each level's share could not tell them apart
        shown = ", ".join(map(repr, twice))
        errors.append(f"--level names must differ, as a plan's levels must: {shown} twice")
    counts = [count for count, _ in levels]
    world = math.prod(counts)
    if world > MAX_GPUS:
        shown = " × ".join(map(str, counts))
        errors.append(f"the levels hold {shown} = {world:,} ranks; at most {MAX_GPUS:,}")
    elif ranks is not None and ranks != world:
        shown = " × ".join(map(str, counts)) + (f" = {world:,}" if len(counts) > 1 else "")
        held = "rank" if world == 1 else "ranks"
        errors.append(f"--ranks {ranks} does not match the levels, which hold {shown} {held}")
    return errors


def roofline(
    intensity: float | str | None, bandwidth: str | None, peak: str | None
) -> RooflineResult:
    """Attainable FLOP/s under a memory bandwidth and a compute ceiling given with units; the
    intensity a number of FLOP per byte, its unit written or not ("4", "4FLOP/byte",
    "4 FLOP/B": a DESIGN audit found every quantity but this one took its unit). Every bad
    option is said at once (`UsageErrors`), each by its flag."""
    errors: list[str] = []
    # a missing one is said beside the others (the command line's own check named only the
    # first, an audit)
    value = memory = compute = None
    if intensity is None:
        errors.append("missing option --intensity, the FLOP per byte, e.g. 4")
    else:
        value = _read(errors, partial(_intensity, intensity))
    where = f"--bandwidth {bandwidth!r}"
    if bandwidth is None:
        errors.append("missing option --bandwidth, the memory bandwidth, e.g. 80GB/s")
    else:
        memory = _read(
            errors, partial(_ceiling, parse_bandwidth, bandwidth, where, "memory bandwidth", "B/s")
        )
    where = f"--peak {peak!r}"
    if peak is None:
        errors.append("missing option --peak, the compute ceiling, e.g. 1000GFLOP/s")
    else:
        compute = _read(
            errors, partial(_ceiling, parse_flops, peak, where, "compute ceiling", "FLOP/s")
        )
    if value is None or memory is None or compute is None:
        raise UsageErrors(errors)
    return RooflineResult(compute_roofline(value, memory, compute))


def _intensity(text: float | str) -> float:
    """FLOP per byte, its unit written or not; finite and 0 or more, as
    `compute.roofline` takes it."""
    if _PER_BIT.search(str(text)):
        raise ValueError(
            f"--intensity {str(text)!r}: b is a bit, as in Gb/s; an intensity is FLOP per byte, "
            "written 4FLOP/B or 4FLOP/byte"
        )
    number = _PER_BYTE.sub("", str(text).strip())
    try:
        value = float(number) + 0.0  # -0 is 0 (it printed "-0 FLOP/s", an audit)
    except ValueError:
        raise ValueError(
            f"--intensity must be a number of FLOP/byte, such as 4 or 4FLOP/byte, got {text!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"--intensity {str(text)!r}: the intensity must be a finite number ≥ 0 FLOP/byte, "
            "such as 4"
        )
    return value


def _ceiling(parse: Callable[[str], float], text: str, where: str, name: str, unit: str) -> float:
    """A roofline's memory bandwidth or compute peak (`name`, in `unit`): above 0, as
    `compute.roofline` takes them (its error named its parameters, bandwidth_Bps and
    peak_flops, not the flags)."""
    value = _quantity(parse, text, where)
    if value <= 0:
        example = {"B/s": "80GB/s", "FLOP/s": "1000GFLOP/s"}[unit]
        raise ValueError(f"{where}: the {name} must be more than 0 {unit}, such as {example!r}")
    return value


# the unit an intensity may carry: FLOP (or FLOPs) per byte (or B); a lowercase b is a bit,
# as everywhere else budget reads a unit (4FLOP/b read as 4 FLOP a byte, an audit)
_PER_BYTE = re.compile(r"\s*(?i:flops?)\s*/\s*(?:(?i:byte)|B)\s*$")
_PER_BIT = re.compile(r"/\s*(?:b|(?i:bits?))\s*$")


def bus_factor_text(op: Op) -> str:
    """The nccl-tests bus-bandwidth factor of ``op`` as a formula, for renderers."""
    if op == "all-reduce":
        return "2(P−1)/P"
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return "(P−1)/P"
    return "1"


def _quantity(parse: Callable[[str], float], text: str, where: str) -> float:
    """`parse(text)`, its error saying `where` the text was given: "--latency '3': 3 has no
    unit; ..."."""
    try:
        return parse(text)
    except UnitError as error:
        said = str(error)  # "'-1us' is negative; ...": the text once, after its option
        if said.startswith(f"{text!r} "):
            raise ValueError(f"{where} {said.removeprefix(f'{text!r} ')}") from None
        raise ValueError(f"{where}: {said}") from None


def _bandwidth(text: str, where: str) -> float:
    """A link's bandwidth, at least 1 B/s as a plan's levels must be (below it every
    collective would take forever, and a time past a float's range is no figure)."""
    value = _quantity(parse_bandwidth, text, where)
    if value < 1:
        raise ValueError(f"{where}: a link's bandwidth is at least 1 B/s, such as '450GB/s'")
    return value


T = TypeVar("T")


def _read(errors: list[str], parse: Callable[[], T]) -> T | None:
    """`parse()`, or None with its messages kept in `errors`, so that every bad option is
    said at once (`UsageErrors`), as `budget check` and `budget search` say theirs."""
    try:
        return parse()
    except UsageErrors as error:
        errors.extend(error.messages)
    except ValueError as error:
        errors.append(str(error))
    return None


def _size(text: str) -> int:
    """--size: whole bytes, required."""
    if not text:
        raise ValueError("--size is required, e.g. --size 1GiB")
    try:
        return parse_bytes(text, whole=True)
    except ValueError as error:
        raise ValueError(f"--size {text!r}: {error}") from None


def _stage_dict(stage: Stage) -> dict[str, Any]:
    return {
        "op": stage.op,
        "algorithm": stage.algorithm,
        "link": stage.link.name,
        "ranks": int(stage.ranks),
        "size_bytes": int(stage.size_bytes),
        "steps": int(stage.steps),
        "sent_bytes": int(stage.sent_bytes),
        "recv_bytes": int(stage.recv_bytes),
        "latency_s": float(stage.link.latency),
        "bandwidth_Bps": float(stage.effective_bandwidth),
        "time_s": float(stage.time_s),
    }
