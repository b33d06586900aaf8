"""The search's answer: the best layouts, the Pareto front, and why the rest were dropped."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from rich.cells import cell_len
from rich.table import Table

from budget.render import preset_said, print_wrapped
from budget.render.table import (
    attention_text,
    fitted,
    left_out,
    printable,
    squeezed,
    titled_table,
    whole,
)
from budget.units import (
    decimals_apart,
    duration_unit,
    format_amount,
    format_bytes,
    format_duration,
    format_share,
    plural,
)

if TYPE_CHECKING:
    from rich.console import Console

    from budget.check import Limits
    from budget.search import Outcome, Result

HEAD = ["tp", "pp", "dp", "cp", "ep", "sp", "zero", "dp_shard", "recompute", "micro"]
PARETO_ROWS = 15
TEXT_COLUMNS = ("sp", "recompute")  # a layout's columns of words, set left


UNEVEN = "*"  # beside pp: the layers split unevenly over the pipeline's chunks


def _layout(r: Result, uneven: bool = False) -> dict[str, str]:
    c = r.config
    v = f"×{c.virtual_stages}" if c.virtual_stages > 1 else ""
    return {
        "tp": str(c.tp),
        "pp": f"{c.pp}{v}{UNEVEN if uneven else ''}",
        "dp": str(c.dp),
        "cp": str(c.cp),
        "ep": str(c.ep),
        "sp": "sp" if c.sequence_parallel else "–",
        "zero": str(c.zero),
        "dp_shard": str(c.dp_shard) if c.dp_shard else "–",  # hybrid sharding's shard group
        "recompute": c.recompute,
        "micro": str(c.micro),
    }


def peak_digits(rows: tuple[Result, ...]) -> int | None:
    """Decimals of GiB at which the peaks of `rows` that differ read apart, where
    `format_bytes`' three figures show two different peaks alike (26.6 GiB for 28,514,424,832
    and 28,527,007,744 B, which made a Pareto point read as dominated); None when they
    already read apart."""
    peaks = {r.peak_bytes for r in rows}
    if len({format_bytes(p) for p in peaks}) == len(peaks):
        return None
    return decimals_apart((p / 2**30 for p in peaks), most=6)


def step_digits(rows: tuple[Result, ...]) -> int | None:
    """Decimals of seconds at which the step times of `rows` that differ read apart, where
    `format_duration`'s three figures show two different times alike (173 s for 173.021 and
    173.306 s, which made Pareto points read as dominated: an audit); None when they
    already read apart. Times within 1e-9 of each other are one time: the plan as written,
    priced on its own, agrees with its ranked row to that, not to the last bit (an audit,
    m387: 19.386703317764983 s against 19.38670331776498 printed every row to 9 decimals)."""
    times = _distinct_times(r.step_time_s for r in rows)
    if len({format_duration(t) for t in times}) == len(times):
        return None
    return decimals_apart(times, start=1, most=9)


def _distinct_times(times: Iterable[float]) -> set[float]:
    """`times` less those within a relative 1e-9 of a smaller one kept (the bar a search's
    figures meet against `budget PLAN`'s)."""
    kept: list[float] = []
    for t in sorted(set(times)):
        if not kept or t - kept[-1] > 1e-9 * abs(t):
            kept.append(t)
    return set(kept)


class Digits(NamedTuple):
    """Decimals that tell the figures of the rows shown together apart (`figure_digits`):
    None where the usual three figures do."""

    peak: int | None = None  # of GiB
    step: int | None = None  # of seconds


THREE_FIGURES = Digits()  # the usual figures for every column


def figure_digits(rows: tuple[Result, ...]) -> Digits:
    """The `Digits` that read the peaks and step times of `rows` apart where they differ."""
    return Digits(peak_digits(rows), step_digits(rows))


def _figures(
    r: Result, digits: Digits = THREE_FIGURES, limits: Limits | None = None
) -> dict[str, str]:
    """A layout's figures as shown; its step time as `budget check` shows it against a
    step limit, with the digits that tell it from the limit (an audit: 17.95 s and 17.97 s
    read "18.0 s" in a search limited to 18 s), and from the other rows' (`Digits`)."""
    peak = (
        format_bytes(r.peak_bytes)
        if digits.peak is None
        else f"{r.peak_bytes / 2**30:.{digits.peak}f} GiB"
    )
    limit = limits.max_step_s if limits is not None else None
    step = format_duration(r.step_time_s)
    if digits.step is not None:
        apart = decimals_apart((r.step_time_s, limit), start=1, most=9) if limit else 0
        step = f"{r.step_time_s:,.{max(digits.step, apart)}f} s"
    elif limits is not None and limit is not None:
        step = limits.shown_step(r.step_time_s)
    return {
        "peak": peak,
        "step": step,
        "exposed": format_duration(r.exposed_comm_s),
        "tokens/s": format_amount(r.tokens_per_s),
        "MFU": format_share(r.mfu),
    }


def _shown(rows: tuple[Result, ...]) -> list[str]:
    """Layout columns worth showing: cp, ep and dp_shard only when some row uses them."""
    unused = {"cp": "1", "ep": "1", "dp_shard": "–"}
    return [h for h in HEAD if h not in unused or any(_layout(r)[h] != unused[h] for r in rows)]


def _table(
    console: Console,
    title: str,
    rows: tuple[Result, ...],
    exposed: bool = False,
    tokens: bool = False,
    digits: Digits = THREE_FIGURES,
    outcome: Outcome | None = None,
) -> tuple[Table, list[str]]:
    """The layouts and their figures, and the notes to print under them (at the
    terminal's width: as the table's caption they wrapped to its own, 16 characters a line
    under a one-row table, an audit). Ranked by tokens per second (``tokens``), that
    figure is shown too. Figures go, as few as make the table fit the terminal
    (`_fitted`: MFU first, then exposed communication unless the search is limited on it,
    ``exposed``); narrower still, the layout columns every row shares go to a note under
    it, and then a limited exposure too. With the `outcome` they were ranked in, a layout
    whose layers split unevenly is marked (`UNEVEN_NOTE`)."""
    heads = _shown(rows)
    # every figure the terminal has room for (an audit: under 100 columns exposed was
    # left out of a 79-column table); `_fitted` drops MFU first, then exposed
    figures = ["peak", "step", "exposed", "MFU"]
    if tokens:
        figures.insert(2, "tokens/s")
    marked = [_uneven(outcome, r) for r in rows]
    cells = [
        {**_layout(r, uneven), **_figures(r, digits, outcome.limits if outcome else None)}
        for r, uneven in zip(rows, marked, strict=True)
    ]

    def fits(heads: list[str], figures: list[str]) -> bool:  # as `fitted` fits, squeezed
        built = _built(title, heads, figures, _widest(cells, [*heads, *figures]))
        return whole(console, squeezed(console, built))

    every = figures
    figures = _fitted(console, title, heads, every, cells, exposed, tokens)
    shared: list[str] = []
    if not fits(heads, figures):
        # narrower than the layouts: what every row shares is said under the table, and
        # then a limited exposure goes too (an audit: at 60 columns a search limited on
        # exposure cut cp and sp to "…", pp 4×4 to "4…" and its peaks' units)
        shared = [h for h in heads if len({c[h] for c in cells}) == 1]
        heads = [h for h in heads if h not in shared]
        figures = _fitted(console, title, heads, every, cells, exposed, tokens)
        if exposed and not fits(heads, figures):
            figures = _fitted(console, title, heads, every, cells, False, tokens)
    table = printable(console, _built(title, heads, figures, cells))
    hidden = [f for f in ("step", "exposed", "MFU") if f not in figures]
    notes = [left_out(hidden)] if hidden else []
    if shared:
        which = "every layout above has" if len(cells) > 1 else "the layout above has"
        said = [f"{h} {cells[0][h]}" for h in shared]
        said = [{"sp sp": "sp", "sp –": "no sp"}.get(s, s) for s in said]  # not "sp sp"
        notes.append(f"{which} " + ", ".join(said))
    legend = virtual_note(rows)
    notes += [legend] if legend else []
    return table, notes + ([_uneven_note(outcome, rows)] if any(marked) else [])


def _built(title: str, heads: list[str], figures: list[str], cells: list[dict[str, str]]) -> Table:
    table = titled_table(title)
    for name in heads:
        justify = "left" if name in TEXT_COLUMNS else "right"
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for name in figures:
        table.add_column(name, justify="right", no_wrap=True)
    for row in cells:
        table.add_row(*(row[h] for h in (*heads, *figures)))
    return table


def _fitted(
    console: Console,
    title: str,
    heads: list[str],
    figures: list[str],
    cells: list[dict[str, str]],
    exposed: bool,
    tokens: bool,
) -> list[str]:
    """`figures` less those the terminal has no room for (`fitted`): MFU, then exposed
    communication (unless the search is limited on it), then the step time where tokens per
    second, which it is proportional to, is shown. At 80 columns a Mixtral ranking by tokens
    per second limited on exposure needed 85, and rich cut tp, dp and the step time to "…"
    (an audit)."""
    droppable = ["MFU", *([] if exposed else ["exposed"]), *(["step"] if tokens else [])]
    sample = _widest(cells, [*heads, *figures])
    build = lambda kept: _built(title, heads, kept, sample)  # noqa: E731
    return fitted(console, build, figures, droppable, ("exposed",))


def _widest(cells: list[dict[str, str]], names: list[str]) -> list[dict[str, str]]:
    """The rows that hold each column's widest cell, in their order: every column is
    no_wrap, so a table of them is as wide as the whole one, and fitting it lays out a few
    rows rather than every one (`fitted` lays a table out once for each column it tries:
    --top 5000, 3,759 rows, took 17 s)."""
    if not cells:
        return cells
    widest = {max(range(len(cells)), key=lambda i: cell_len(cells[i][name])) for name in names}
    return [cells[i] for i in sorted(widest)]


UNEVEN_NOTE = (
    f"{UNEVEN} the layers split unevenly over the pipeline's chunks (`budget.search.split`), "
    "its step timed in Megatron-LM's order as `budget PLAN` times it: -f json gives each "
    "split, --write writes it"
)


def _uneven(outcome: Outcome | None, r: Result) -> bool:
    if outcome is None:
        return False
    if r is outcome.written:
        return outcome.written_split() is not None
    return outcome.layers_per_stage(r.config) is not None


def _uneven_note(outcome: Outcome | None, rows: tuple[Result, ...]) -> str:
    """The marker's note: for the plan as written, its own split where the sweep left
    it out."""
    if outcome is not None and outcome.own_split is not None and rows == (outcome.written,):
        own = ", ".join(map(str, outcome.own_split[2]))
        return f"{UNEVEN} the layers split unevenly, as the plan's layers_per_stage: {own}"
    return UNEVEN_NOTE


def virtual_note(rows: tuple[Result, ...]) -> str:
    """The legend of pp's "4×2" (pipeline stages × virtual stages), read from the first
    row that shows it, "" where none does (an audit: the notation was never explained)."""
    for r in rows:
        pp, v = r.config.pp, r.config.virtual_stages
        if v > 1:
            return (
                f"pp {pp}×{v}: {pp} pipeline stages, each holding {v} virtual stages (model "
                "chunks) of the interleaved schedule"
            )
    return ""


TIE = 0.01  # front points within 1 % of the last one kept save too little memory to show


def thin(front: tuple[Result, ...]) -> tuple[Result, ...]:
    """At most PARETO_ROWS points of the front (fastest first), both ends kept. A point
    that saves less than `TIE` of the memory of the last point kept is a near-tie that only
    costs time, and is shown only if the front is short (evenly spaced points alone once
    kept the slower of two points 0.01 GiB apart; UX audit). Of the rest, the points spread
    along the front's length (`_spread`), not by their index: a front whose tail creeps
    from 7.4 to 6.3 GiB over 22 to 500 s took half the rows, and the row after the fastest,
    as fast (7.69 s against 7.68) with 22.5 GiB less, was left out (a user audit)."""
    if len(front) <= PARETO_ROWS:
        return front
    kept = _without_near_ties(front)
    if len(kept) <= PARETO_ROWS:
        return tuple(kept)
    return tuple(kept[i] for i in _spread(kept, PARETO_ROWS))


def _without_near_ties(front: tuple[Result, ...]) -> list[Result]:
    """The front less each point that saves under `TIE` of the last kept point's memory
    (the last point stays)."""
    kept = [front[0]]
    for r in front[1:]:
        if r.peak_bytes < kept[-1].peak_bytes * (1 - TIE) or r is front[-1]:
            kept.append(r)
    return kept


def _spread(front: list[Result], rows: int) -> list[int]:
    """`rows` indices of `front` (both ends among them) spread along its length: each point
    at (log step time, peak), both scaled to [0, 1] over the front, so that a step twice as
    long weighs the same at 8 s as at 200 s, and the length between neighbours the sum of
    the two moves. Then the longest stretch between two chosen points is split at the
    point nearest its middle, until `rows` are chosen."""
    times = [max(r.step_time_s, 1e-12) for r in front]
    peaks = [r.peak_bytes for r in front]
    span_t = math.log(times[-1] / times[0]) or 1.0
    span_m = (peaks[0] - peaks[-1]) or 1
    length = [0.0]
    for i in range(1, len(front)):
        dt = abs(math.log(times[i] / times[i - 1])) / span_t
        length.append(length[-1] + dt + abs(peaks[i - 1] - peaks[i]) / span_m)
    chosen = [0, len(front) - 1]
    while len(chosen) < rows:
        # the longest stretch that has a point inside it (ties: the fastest)
        a, b = max(
            ((a, b) for a, b in itertools.pairwise(chosen) if b - a > 1),
            key=lambda ab: length[ab[1]] - length[ab[0]],
        )
        middle = (length[a] + length[b]) / 2
        chosen = sorted([*chosen, min(range(a + 1, b), key=lambda i: abs(length[i] - middle))])
    return chosen


def _slack_note(outcome: Outcome) -> str | None:
    """A word where the best layout leaves under 5 % of the device free at its peak and no
    headroom was asked for: it ranks first, yet fails `budget check --headroom 5%`."""
    best, capacity = outcome.best, outcome.hardware.get("capacity_bytes")
    asked = outcome.limits is not None and outcome.limits.required_headroom(capacity or 0)
    if best is None or not capacity or asked:
        return None
    free = capacity - best.peak_bytes
    if free >= 0.05 * capacity:
        return None
    return (
        f"The best layout leaves {format_bytes(free)} ({free / capacity:.1%}) of the device "
        "free at its peak; --headroom 5% ranks only layouts that keep more."
    )


NONE_FITS = "No layout fits: every one was rejected, for the reasons below."
NONE_KEEPS = "No layout fits and keeps the limits: every one was rejected, for the reasons below."


def _counts(outcome: Outcome) -> str:
    """ "65,239 fit" or, with limits, "65,239 fit; 1,204 of them keep the limits (...)"."""
    text = f"{outcome.fitting:,} fit"
    if outcome.limits is not None:
        words = ", ".join(outcome.limits.describe()[1:])
        text += f"; {outcome.within_limits or 0:,} of them keep the limits ({words})"
    return text


def _skipped_note(outcome: Outcome) -> str:
    """How the rejections split between layouts never priced (they do not divide, or cannot
    be built) and priced ones (over memory or a limit), so that the table's total and the
    count evaluated reconcile."""
    kept = outcome.fitting if outcome.limits is None else outcome.within_limits or 0
    priced = outcome.evaluated - kept
    skipped = sum(outcome.rejected.values()) - priced
    degrees = ", and every layout of the degrees ruled out" if outcome.ruled_out else ""
    # those no pass of the engine priced: their model states alone exceed the device
    states = f", {outcome.by_states:,} of them by their model states alone" * (
        outcome.by_states > 0
    )
    return (
        f"{outcome.evaluated:,} evaluated ({kept:,} ranked, {priced:,} rejected after "
        f"pricing{states}); {skipped:,} more skipped before pricing (they do not divide or "
        f"cannot be built){degrees}"
    )


def ruled_out_rows(outcome: Outcome) -> list[tuple[str, str]]:
    """(reason, "all at tp 16, 32") for the degrees a sweep ruled out whole, the first few
    named ("all at tp 5, 10, 20 and 9 more"; "all at tp 4 × pp 3, tp 8 × pp 3"; a bare "+9"
    read as nothing, an audit)."""
    rows = []
    for reason, degrees in outcome.ruled_out.items():
        dims = {d.split(" ", 1)[0] for d in degrees}
        if len(dims) == 1 and "×" not in degrees[0]:  # one degree: "tp 5, 10, 20"
            shown = f"{dims.pop()} " + ", ".join(d.split(" ", 1)[1] for d in degrees[:3])
        else:
            shown = ", ".join(degrees[:3])
        more = f" and {len(degrees) - 3:,} more" if len(degrees) > 3 else ""
        rows.append((reason, f"all at {shown}{more}"))
    return rows


NONE_BUILT = (
    "No layout can be built on {gpus}: every one was skipped before pricing, for the "
    "reasons below (none of them was priced, so none was rejected for memory)."
)


def _none(outcome: Outcome) -> str:
    if outcome.evaluated == 0:  # a review: "no layout fits" read as if memory had ruled
        return NONE_BUILT.format(gpus=plural(outcome.gpus, "GPU"))
    said = NONE_FITS if outcome.limits is None else NONE_KEEPS
    near = nearest_note(outcome)
    return f"{said} {near}" if near else said


def _floor(x: float, digits: int = 3, up: bool = False) -> float:
    """`x` cut, not rounded, to `digits` significant digits: a lower bound shown stays one;
    raised to them where `up` (a figure a layout reaches stays reached, as a limit)."""
    if x <= 0:
        return x
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return (math.ceil(x / unit) if up else math.floor(x / unit)) * unit


def _bytes_down(n: int) -> str:
    """`format_bytes`'s figure of `n`, cut at the digit it prints rather than rounded (review
    m423: 368.90 GiB cut in decimal printed "369 GiB", above the bound it stood for)."""
    number, unit = format_bytes(n).split(" ")
    scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB", "PiB").index(unit)
    decimals = len(number.partition(".")[2])
    value = math.floor(n / scale * 10**decimals) / 10**decimals
    return f"{value:.{decimals}f} {unit}"


def _share_down(share: float, digits: int = 2) -> str:
    """A share as a percentage to `digits` significant digits, cut rather than rounded
    (review m423: 0.0507 % printed "0.1%", which a fitting layout did expose under)."""
    percent = _floor(share * 100, digits)
    if percent <= 0:
        return "0%"
    decimals = max(0, digits - 1 - math.floor(math.log10(percent)))
    return f"{percent:.{decimals}f}%"


def _duration_down(seconds: float, digits: int, up: bool = False) -> str:
    """A time cut to `digits` significant digits (`_floor`; raised to them where `up`), in
    `format_duration`'s unit; at 3 digits `format_duration`'s own figure of the cut time."""
    cut = _floor(seconds, digits, up)
    if digits <= 3 or cut <= 0:
        return format_duration(cut)
    scale, unit = duration_unit(cut)
    value = cut / scale
    decimals = max(0, digits - 1 - math.floor(math.log10(value)))
    return f"{value:.{decimals}f} {unit}"


def _past(value: float, limit: float, digits: int) -> int:
    """The fewest significant digits from `digits` (at most 12) at which `value` cut
    (`_floor`) reads above `limit`, where it lies above it."""
    while digits < 12 and value > limit and _floor(value, digits) <= limit:
        digits += 1
    return digits


def nearest_note(outcome: Outcome) -> str | None:
    """How near the layouts came, where none ranks (`budget.search.Nearest`; a user audit,
    m419: an empty result named no layout and no limit to relax): the least any peaks at
    where none fits; where some fit and none keeps the limits, how many each limit alone
    rules out and how near a fitting layout comes to each."""
    near = outcome.nearest
    if near is None or outcome.results or outcome.evaluated == 0:
        return None
    capacity = format_bytes(near.capacity)
    if outcome.fitting == 0:
        if near.least_peak is None:
            return None
        least = _bytes_down(near.least_peak)
        return (
            f"No layout peaks under {least} on its worst stage, against the {capacity} a "
            "GPU holds: more GPUs (--gpus) split the model further."
        )
    limits = outcome.limits
    if limits is None or near.fitting_peak is None:
        return None
    # a range where pending layouts' bounds leave a limit open (`Nearest.undecided_each`)
    alone = "; ".join(
        f"{reason.removeprefix('over a limit: ')} rules out {n:,}"
        + (f" to {n + near.undecided_each[reason]:,}" if near.undecided_each.get(reason) else "")
        for reason, n in near.over_each.items()
    )
    nearest = []
    if limits.required_headroom(near.capacity) is not None:
        free = near.capacity - near.fitting_peak
        nearest.append(
            f"the most headroom a fitting layout leaves is {format_bytes(free)} "
            f"({format_share(free / near.capacity)} of capacity)"
        )
    # cut to as many digits as it takes to read above the limit it misses (a search audit,
    # m507: "under 18.1 s" beside --max-step 18.13s, and "under 10%" beside 10%)
    share, step = near.fitting_exposed_share, near.fitting_step_s
    if limits.max_exposed_share is not None and share is not None:
        digits = _past(share, limits.max_exposed_share, 2)
        nearest.append(f"none exposes under {_share_down(share, digits)} of its step")
    if limits.max_step_s is not None and step is not None:
        digits = _past(step, limits.max_step_s, 3)
        said = f"none steps in under {_duration_down(step, digits)}"
        # a layout held at a lower bound until replayed (review m553: the bound alone read
        # as a layout's time, and raised to as a limit still ranked none)
        exact = near.fitting_exact_step_s
        if exact is not None and exact > step:
            # raised at its last digit: as a limit, the figure keeps that layout (review m554:
            # 18.7207 s read 18.7 s)
            took = _duration_down(exact, max(digits, 4), up=True)
            said += (
                " (a bound: a layout whose model chunks differ is not replayed once its "
                f"bound rules it out; the fastest priced exactly takes {took})"
            )
        nearest.append(said)
    return (
        f"Of the {outcome.fitting:,} that fit, each limit alone: {alone}. Nearest: "
        f"{', '.join(nearest)}."
    )


def hardware_text(hardware: dict[str, Any]) -> str:
    """One sentence on what the layouts were priced on (`budget.search.hardware`)."""
    device, topology = hardware["device"], hardware["topology"]
    if device:
        device = preset_said(device, hardware.get("device_overrides") or ())
    if topology:
        topology = preset_said(topology, hardware.get("topology_overrides") or ())
    if device is None and topology is None:
        where = "the device and topology the plan writes out"
    else:
        where = f"{device or 'the device the plan writes out'} in "
        where += topology or "the topology the plan writes out"
    source = hardware["attention_rate"]
    rate = "the plan's rate" if source == "plan" else "its rate"
    if source in ("measured", "derived"):  # each pass's, and each layout's causal share (cp)
        keys = "keys per call and " if hardware.get("attention_by_keys") else ""
        rate = f"its forward and backward rates for each layout's {keys}causal share"
    attention = attention_text(
        hardware["attention"], hardware["attention_kernel"], source, rate, written=device is None
    )
    measured = hardware.get("attention_head_dim")
    if measured and measured != hardware.get("head_dim"):
        attention += (
            f", measured at head dim {measured}, where this model's is {hardware['head_dim']}"
        )
    levels = hardware["ramped_levels"]
    bandwidth = (
        f"collectives on {', '.join(levels)} at the share of B_eff their size reaches (nccl-tests)"
        if levels
        else "every collective at its level's plateau B_eff"
    )
    named = hardware.get("collectives") or {}
    if named:
        bandwidth += "; " + ", ".join(f"{op} by {name}" for op, name in sorted(named.items()))
    carried = hardware.get("transitions", 0)
    written = (
        f" Every layout carries the plan's {plural(carried, 'hand-written transition')}, "
        "shaped for its degrees and micro-batch size."
        if carried
        else ""
    )
    overlap = hardware.get("overlap")
    kept = ""
    if overlap is not None:
        on = [flag for flag, value in overlap.items() if value]
        off = [flag for flag, value in overlap.items() if not value]
        parts = [f"{', '.join(on)} on" if on else "", f"{', '.join(off)} off" if off else ""]
        kept = f" Every layout keeps the plan's overlap: {'; '.join(p for p in parts if p)}."
    deferred = hardware.get("defer_embedding_wgrad")
    if deferred:
        which = (
            "every micro-batch's"
            if deferred is True
            else "the first micro-batch's"
            if deferred == 1
            else f"up to {deferred} micro-batches'"
        )
        kept += (
            f" Layouts of more than one stage defer {which} output-layer weight gradients to "
            "the drain (the plan's defer_embedding_wgrad)."
        )
    if hardware.get("tp_comm_aggregate"):
        named = ", ".join(hardware["tp_comm_aggregate"])
        kept += f" Ring exchanges aggregated (the plan's tp_comm_aggregate): {named}."
    etp = hardware.get("etp")
    if etp is not None:
        kept += (
            " Expert layers split over each layout's tp (the plan sets no etp; write "
            "parallel.etp to search with another)."
            if etp == "tp"
            else f" Every layout keeps the plan's etp {etp} for its expert layers."
        )
    if hardware.get("tp_style") == "dtensor":
        kept += " Tensor parallelism runs as DTensor's styles (the plan's tp_style)."
    if hardware.get("fsdp_unit") == "layer":
        kept += " ZeRO 3 layouts gather and reduce-scatter whole layers (the plan's fsdp_unit)."
    if hardware.get("fsdp_root") == "split":
        kept += " ZeRO 3 layouts wrap the embedding and the head apart (the plan's fsdp_root)."
    if hardware.get("reshard_after_forward") is False:
        kept += (
            " ZeRO 3 layouts keep their layers gathered from forward to backward (the plan's "
            "reshard_after_forward)."
        )
    return f"Priced on {where}; {attention}; {bandwidth}.{kept}{written}"


WRITTEN = "The plan as written (as `budget PLAN` budgets it)"


def own_split_note(outcome: Outcome) -> str:
    """Where the plan splits its layers itself (``layers_per_stage``), that layouts of its
    depth keep that split and the others do not (an audit: the sweep priced the plan's
    16, 24, 24, 16 over pp 4 as 20 a stage, and nothing said it)."""
    if outcome.own_split is None:
        return ""
    pp, v, own = outcome.own_split
    depth = f"pp {pp}" + (f" × {v}" if v > 1 else "")
    return (
        f"The plan's layers_per_stage ({', '.join(map(str, own))}) is left out of every "
        f"layout (and of --write): at {depth} too, the layers split as evenly as they go, "
        "the extra ones on the middle chunks; the plan as written keeps it."
    )


def _outside(outcome: Outcome) -> list[str]:
    """The plan's own settings the sweep did not take, each with the option that takes it
    ("its 12 virtual stages are outside the sweep's 1, 2, 4: --virtual-stages 1,2,4,12")."""
    mine, space = outcome.written, outcome.space
    if mine is None or space is None:
        return []
    c, out = mine.config, []
    # (option, what the plan has, the values swept); None sweeps every value that divides
    dims: list[tuple[str, Any, tuple[Any, ...] | None]] = [
        ("tp", c.tp, space.tp),
        ("pp", c.pp, space.pp),
        ("cp", c.cp, space.cp),
        ("ep", c.ep, space.ep),
        ("virtual-stages", c.virtual_stages, space.virtual_stages),
        ("sp", c.sequence_parallel, space.sequence_parallel),
        ("zero", c.zero, space.zero),
        ("recompute", c.recompute, space.recompute),
        ("micro", c.micro, space.micro),
    ]

    def text(x: Any) -> str:
        return str(x).lower()  # sp's True reads as --sp takes it

    for option, value, swept in dims:
        if swept is None or value in swept:
            continue
        values = ",".join(map(text, (*swept, value)))
        mine_ = (
            f"{value} virtual stages are"
            if option == "virtual-stages"
            else f"{option} {text(value)} is"
        )
        out.append(
            f"its {mine_} outside the sweep's {', '.join(map(text, swept))} "
            f"(--{option} {values} takes it)"
        )
    return out


def _ratio(r: float) -> str:
    """`r` to two decimals, or as many more as it takes not to read 1.00 where it is not 1
    (a search audit, m507: a plan as written 0.997× the best's step time read "1.00×")."""
    for decimals in range(2, 7):
        text = f"{r:.{decimals}f}"
        if r == 1 or float(text) != 1:
            return text
    return text


def _figure(outcome: Outcome) -> tuple[str, str]:
    """The objective's figure of a layout: its attribute and its name."""
    return {
        "memory": ("peak_bytes", "peak"),
        "tokens-per-s": ("tokens_per_s", "tokens per second"),
    }.get(outcome.objective, ("step_time_s", "step time"))


def _written_ahead(outcome: Outcome) -> bool:
    """Whether the plan as written beats the best layout ranked in the objective's figure
    (higher tokens per second, else lower), whether or not it fits and keeps the limits."""
    mine, best = outcome.written, outcome.best
    if mine is None or best is None:
        return False
    name = _figure(outcome)[0]
    ours, theirs = getattr(mine, name), getattr(best, name)
    higher = outcome.objective == "tokens-per-s"  # the figure the ranking wants high
    return bool(ours and theirs) and ours != theirs and (ours > theirs) == higher


def written_beats_best(outcome: Outcome) -> bool:
    """`_written_ahead`, fitting and keeping the limits as the ranked layouts do: a setting
    of its own the sweep never took (its layers_per_stage, a degree outside the space). A
    plan that breaks a limit does not (a review, m510: "does better" beside a plan over the
    --headroom asked for)."""
    mine = outcome.written
    return mine is not None and mine.fits and not outcome.written_breaks and _written_ahead(outcome)


def written_note(outcome: Outcome) -> str:
    """How the plan searched compares with the best layout, in the objective's figure, and
    whether it fits and keeps the limits (a user audit: nothing said)."""
    mine, best = outcome.written, outcome.best
    if mine is None:
        return ""
    figure = _figure(outcome)
    mine_value = getattr(mine, figure[0])
    best_value = getattr(best, figure[0]) if best is not None else 0
    parts = []
    if best_value and mine_value:
        parts.append(f"has {_ratio(mine_value / best_value)}× the best layout's {figure[1]}")
        if _written_ahead(outcome):
            # it beats the best: a setting of its own the sweep never took (an audit: v 12
            # beat the "best" at 0.98× the step time, and nothing said the sweep's v was
            # 1, 2, 4)
            parts[-1] += "".join(f"; {o}" for o in _outside(outcome))
    if not mine.fits:
        parts.append("does not fit")
    elif outcome.written_breaks:  # as the command line sets them: --max-exposed
        *most, last = [f"--{name.replace('_', '-')}" for name in outcome.written_breaks]
        limits = f"{', '.join(most)} and {last} limits" if most else f"{last} limit"
        parts.append(f"does not keep the {limits}")
    said = f"The plan as written {', and '.join(parts)}." if parts else ""
    if outcome.own_split is not None:
        said += " Its figures are at its own layers_per_stage, which no ranked layout has."
    return said.strip()


def _show(console: Console, table: Table, notes: list[str]) -> None:
    """A table, then its notes at the terminal's width, a figure kept with its name or unit
    (`print_wrapped`: at 40 columns "ep" ended a line and "8," began the next)."""
    console.print(table)
    for note in notes:
        print_wrapped(console, note, "")


def render_search_table(console: Console, outcome: Outcome, top: int) -> None:
    # what the ranked tables and the plan-as-written row show alike
    limited = outcome.limits is not None and outcome.limits.max_exposed_share is not None
    tokens = outcome.objective == "tokens-per-s"
    rate = outcome.evaluated / outcome.elapsed_s if outcome.elapsed_s else 0.0
    console.print(
        f"Evaluated {plural(outcome.evaluated, 'layout')} on {plural(outcome.gpus, 'GPU')} in "
        f"{outcome.elapsed_s:.2f} s ({rate:,.0f} per second, "
        f"{plural(outcome.groups, 'engine pass', 'engine passes')}); "
        f"{_counts(outcome)}.",
        markup=False,
    )
    if outcome.hardware:
        console.print(hardware_text(outcome.hardware), markup=False)
    own = own_split_note(outcome)
    if own:
        console.print(own, markup=False)
    console.print()
    if outcome.results:
        best = outcome.results[:top]
        title = f"Best {len(best)} by {outcome.objective}"
        front = thin(outcome.pareto)
        # the tables read against each other, the plan as written among them (a review)
        digits = figure_digits((*best, *front, *_written(outcome)))
        ranked, notes = _table(console, title, best, limited, tokens, digits, outcome)
        _show(console, ranked, notes)
        slack = _slack_note(outcome)
        if slack:
            console.print(slack, style="yellow", markup=False)
        if notes or slack:  # the notes end the table: a line before the next title
            console.print()
        shown = (
            ""
            if len(front) == len(outcome.pareto)
            else (f" ({len(front)} of {len(outcome.pareto)} points)")
        )
        title = f"Pareto front: peak memory against step time{shown}"
        pareto, notes = _table(console, title, front, limited, digits=digits, outcome=outcome)
        if shown:  # which points, and where the rest are (a user audit)
            spread = len(_without_near_ties(outcome.pareto)) > PARETO_ROWS
            how = "spread along the front, near-ties dropped" if spread else "near-ties dropped"
            notes.append(
                f"{len(front)} points, {how}; -f markdown or -f json lists all "
                f"{len(outcome.pareto)}"
            )
        _show(console, pareto, notes)
        if notes:
            console.print()
    else:
        console.print(f"{_none(outcome)}\n", markup=False)
    if outcome.written is not None:  # beside the ranking, or alone where none ranks
        digits = figure_digits((*_written(outcome), *outcome.results[:top], *thin(outcome.pareto)))
        mine = (outcome.written,)
        _show(console, *_table(console, WRITTEN, mine, limited, tokens, digits, outcome))
        console.print(written_note(outcome), markup=False)
        console.print()
    unranked = [*((r, f"{n:,}") for r, n in outcome.rejected.items()), *ruled_out_rows(outcome)]
    if not unranked:  # a heading over no rows read as a table lost (an audit)
        print_wrapped(console, _skipped_note(outcome), "")
        return
    table = titled_table("Not ranked")
    table.add_column("reason")
    table.add_column("layouts", justify="right")
    for reason, count in unranked:
        table.add_row(reason, count)
    _show(console, table, [_skipped_note(outcome)])


def _written(outcome: Outcome) -> tuple[Result, ...]:
    """The plan as written's row, where it has one."""
    return (outcome.written,) if outcome.written is not None else ()


def render_search_markdown(outcome: Outcome, top: int) -> str:
    best = outcome.results[:top]
    # as the table: peaks and times that differ read apart, the plan as written's too
    digits = figure_digits((*best, *outcome.pareto, *_written(outcome)))

    def rows(results: tuple[Result, ...]) -> list[str]:
        # every layout column, but hybrid sharding's where no row has it
        shown = [h for h in HEAD if h != "dp_shard" or any(r.config.dp_shard for r in results)]
        head = [*shown, "peak", "step", "exposed", "tokens/s", "MFU"]
        # aligned as the table's columns: the words left, the numbers right (an audit, m394)
        align = ["---" if h in TEXT_COLUMNS else "---:" for h in head]
        out = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
        marked = [_uneven(outcome, r) for r in results]
        for r, uneven in zip(results, marked, strict=True):
            # the marker escaped: a bare * opens emphasis in GitHub's markdown
            layout = {**_layout(r), "pp": _layout(r, uneven)["pp"].replace(UNEVEN, "\\*")}
            cells = [*(layout[h] for h in shown), *_figures(r, digits, outcome.limits).values()]
            out.append("| " + " | ".join(cells) + " |")
        legend = virtual_note(results)
        note = [legend] if legend else []
        note += [_uneven_note(outcome, results).replace(UNEVEN, "\\*", 1)] if any(marked) else []
        # a blank line between notes: one paragraph each
        return [*out, *(line for n in note for line in ("", n)), ""]

    lines = [
        f"## budget search: {outcome.gpus:,} GPUs",
        "",
        f"{plural(outcome.evaluated, 'layout')} evaluated in {outcome.elapsed_s:.2f} s; "
        f"{_counts(outcome)}.",
        "",
    ]
    if outcome.hardware:
        lines += [hardware_text(outcome.hardware), ""]
    own = own_split_note(outcome)
    lines += [own, ""] if own else []
    if outcome.results:
        lines += [f"### Best by {outcome.objective}", "", *rows(best)]
        slack = _slack_note(outcome)
        lines += [f"> {slack}", ""] if slack else []
        lines += ["### Pareto front: peak memory against step time", ""]
        lines += rows(outcome.pareto)
    else:
        lines += [_none(outcome), ""]
    if outcome.written is not None:
        lines += [f"### {WRITTEN}", "", *rows((outcome.written,)), written_note(outcome), ""]
    unranked = [*((r, f"{n:,}") for r, n in outcome.rejected.items()), *ruled_out_rows(outcome)]
    if unranked:
        lines += ["### Not ranked", "", "| reason | layouts |", "|---|---:|"]
        lines += [f"| {reason} | {count} |" for reason, count in unranked]
        lines += [""]
    lines += [_skipped_note(outcome) + "."]
    return "\n".join(lines) + "\n"
