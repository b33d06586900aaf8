"""Render the calculators' results as a rich table, JSON or markdown on a given Console.

Sizes show binary units and the exact byte count ("896 MiB (939,524,096 B)"); bandwidths
and FLOP rates decimal units as vendors quote them (GB = 1e9 B); times µs, ms or s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table
from rich.text import Text

from budget.calculators import CollectiveResult, RooflineResult, bus_factor_text
from budget.collectives import TREE_SHARE, CollectiveCost, exchange_loads
from budget.render import Hanging, held
from budget.units import (
    UnitError,
    format_duration,
    format_flops,
    format_rate,
    format_share,
    parse_flops,
    plural,
)

if TYPE_CHECKING:
    from rich.console import Console

    from budget.collectives import Stage
    from budget.plan.model import Level

__all__ = ["render_collective", "render_roofline"]

Rows = list[tuple[str, ...]]
_UNITS_NOTE = (
    "GB = 10^9 B, GiB = 2^30 B. Bandwidth is per GPU, one direction; sent and received "
    "bytes are per rank; T = n·α + Q/B_eff. S is bytes of any dtype, which moves no faster "
    "or slower for its format; chunks round to whole bytes (a plan's report names each "
    "collective's dtype)."
)
_ROOFLINE_NOTE = "GB = 10^9 B; FLOP/s and B/s decimal; intensity in FLOPs per byte moved."


def render_collective(console: Console, result: CollectiveResult, fmt: str) -> None:
    """One collective: what moves, over which link, and which term of T dominates."""
    if fmt == "json":
        _json(console, result.to_dict())
        return
    cost = result.cost
    title = f"{cost.op} · {cost.algorithm} · {plural(int(cost.ranks), 'rank')}"
    if result.asked:  # an alias (an audit: asked for ring, an all-to-all read pairwise unsaid)
        title += f" (what --algorithm {result.asked} means for {cost.op})"
    # over several levels each term sums the stages below, each at its own link's figures;
    # a ring's levels carry their hops at once, so its bandwidth term is the busier port's;
    # an all-to-all's levels so carry the blocks for the peers each reaches, NCCL's grouped
    # exchange with every peer (`collectives._exchange_across`), not a ring's hops
    staged = "summed over the stages below, each at its level's" if len(cost.stages) > 1 else ""
    shape = (
        "tree"
        if cost.algorithm == "double-tree"
        else "exchange"
        if cost.op == "all-to-all"
        else "ring"
    )
    carried = f"the {shape}'s " + ("blocks" if shape == "exchange" else "hops")
    share = (
        f"at {100 * float(cost.stages[0].efficiency):.0f} % of each link's rate (NCCL's tree "
        f"model: {100 * TREE_SHARE:.0f} % of the ring's, times its correction at this size)"
    )
    # the outer levels the bytes cross or leave through (`CollectiveCost.links`)
    crossed = {float(s.effective_bandwidth) for s in cost.stages[1:] if s.link.name in cost.links}
    # a ring's outer levels at the slowest one's rate (`CollectiveCost.bandwidth_s`); an
    # exchange's levels each carry the blocks for peers on it or past it at its own rate
    paced = (
        ""
        if len(crossed) < 2
        else ", each outer level the blocks for peers on it or past it, at its own rate"
        if shape == "exchange"
        else ", the outer ones at the slowest one's rate"
    )
    streamed = (
        "the longer of the innermost level's and the outer levels' together, which carry "
        f"{carried} at once" + (f", {share}" if shape == "tree" else "") + paced
    )
    if shape == "tree" and len(cost.stages) == 1:  # one level: the chain NCCL runs in a node
        streamed = f"NCCL's chain inside one node, {share.replace('each link', 'the link')}"
    if not float(cost.time_s):
        streamed = "nothing moves"
    summary: Rows = [
        ("size S", f"{_bytes(int(cost.size_bytes))}, the full logical tensor"),
        ("link", _links(result)),
        ("steps n", f"{int(cost.steps):,}"),
        ("sent per rank", _bytes(int(cost.sent_bytes)) + _who(cost, sent=True)),
        ("received per rank", _bytes(int(cost.recv_bytes)) + _who(cost, sent=False)),
        (  # DESIGN.md rule 4: summed over ranks, said so, and never over one link's rate
            "sent by all ranks",
            f"{_bytes(int(cost.aggregate_sent_bytes))}  (aggregate over "
            f"{_all_ranks(int(cost.ranks))}; no one link carries it)",
        ),
        ("latency term n·α", _time(float(cost.latency_s)) + (f"  ({staged} α)" if staged else "")),
        (
            "bandwidth term Q/B_eff",
            f"{_time(float(cost.bandwidth_s))}  (Q = {_pacing(cost)}"
            + (
                ", the busiest rank's bytes on the critical path, more than a typical rank sends"
                if int(cost.payload_bytes) > max(int(cost.sent_bytes), int(cost.recv_bytes))
                else ""
            )
            + (f"; {streamed})" if cost.pipelined else f"; {staged} B_eff)" if staged else ")"),
        ),
        (
            "time T",
            f"{_time(float(cost.time_s))}  ({_bound(cost.latency_s, cost.bandwidth_s)}"
            + _what_of_it(result)
            + ")",
        ),
        *_passed_over(result),
        *_beside(result),
        (
            "algorithm bandwidth",
            # an all-to-all's is of one rank's buffer (an audit: beside S = 1 GiB, 500.9 GB/s
            # read as a mistake for S / T = 4,007)
            f"{format_rate(float(cost.algorithm_bandwidth))}  "
            + (
                "(S / P over T: one rank's buffer, as nccl-tests counts an all-to-all)"
                if cost.op == "all-to-all"
                else "(S over T)"
            ),
        ),
        (
            "bus bandwidth",
            f"{format_rate(float(cost.bus_bandwidth))}  (algbw × {bus_factor_text(cost.op)}, "
            "nccl-tests)",
        ),
    ]
    sections: list[tuple[str, tuple[str, ...], Rows]] = [(title, ("quantity", "value"), summary)]
    if len(cost.stages) > 1:
        # received equals sent in every stage of the symmetric hierarchical forms; say so
        # once, and where it does not (a broadcast's node leader receives S once and sends
        # it on each level: an audit read 2 GiB received), that the rows are what is sent
        headers = ("stage", "link", "P", "n", "sent/rank", "n·α", "Q/B", "time")
        stages = [_stage_row(s, cost.pipelined) for s in cost.stages]
        equal = cost.sent_bytes == cost.recv_bytes and all(
            s.sent_bytes == s.recv_bytes for s in cost.stages
        )
        per_rank = "per rank: received = sent" if equal else "sent per rank; received, above"
        title = f"{carried} on each level" if cost.pipelined else "stages"
        # the levels run at once, the outer ones at the pace of the slowest they cross or
        # leave through (`CollectiveCost.bandwidth_s`): their rows are not T's parts (a
        # review, m506: a spine row of 21.5 ms beside T = 85.9 ms, unsaid)
        paced = "; each row at its own level's rate, T from them as above" if cost.pipelined else ""
        title = f"{title} ({per_rank}{paced})"
        sections.append((title, headers, stages))
    if cost.candidates:
        # one unit, the fastest's, right-aligned (an audit: "40,345.318 µs" above "171.879 ms"
        # read as the larger, left-aligned in two units)
        times = [time for _, time in cost.candidates]
        rows: Rows = [
            (name, "chosen" if name == cost.algorithm else "", _time(time, min(times)))
            for name, time in cost.candidates
        ]
        sections.append(("auto: candidates", ("algorithm", "", "time"), rows))
    _sections(console, sections, fmt, _UNITS_NOTE + _padded(cost))


def _padded(cost: CollectiveCost) -> str:
    """That the bytes shown are rounded up, where S does not split into the op's equal
    chunks (a ring's P, an all-to-all's P² blocks) of whole bytes (`collectives._chunk`):
    an audit read 63 B sent per rank, 4,032 B by all 64, for a 7 B all-to-all, unsaid."""
    p, size = int(cost.ranks), int(cost.size_bytes)
    parts = p * p if cost.op == "all-to-all" else p
    if p < 2 or cost.op in ("broadcast", "send-recv") or size % parts == 0:
        return ""
    return (
        f" S does not split into {parts:,} equal chunks of whole bytes: each is rounded up "
        f"to {-(-size // parts):,} B, so the bytes shown are an upper bound."
    )


def _all_ranks(ranks: int) -> str:
    """The group the aggregate bytes are summed over: "the 8 ranks", "its one rank"."""
    return "its one rank" if ranks == 1 else f"the {ranks:,} ranks"


def _who(cost: CollectiveCost, sent: bool) -> str:
    """Which ranks a one-way collective's per-rank bytes are of: a send-recv's sender sends
    and its receiver receives, a broadcast's root receives nothing and its last ranks send
    nothing (a user audit read "sent per rank 1 GiB" as every rank's, where the receiver
    sends none); "" for the collectives every rank sends and receives in."""
    if cost.op == "send-recv":
        if cost.ranks > 2:  # a chain, a pipeline's: each rank sends to the next (an audit)
            return (
                "  (each rank but the last, which sends none)"
                if sent
                else "  (each rank but the first, which receives none)"
            )
        return "  (the sender; the receiver sends none)" if sent else "  (the receiver)"
    if cost.op != "broadcast":
        # a tree's ranks move unequal bytes, its root the most: the per-rank figure is the
        # busiest rank's (`CollectiveCost`), which the group's total does not divide into
        # (a user audit read 192 KiB a rank beside 896 KiB by all 8)
        total = int(cost.aggregate_sent_bytes if sent else cost.aggregate_recv_bytes)
        each, ranks = int(cost.sent_bytes if sent else cost.recv_bytes), int(cost.ranks)
        if ranks < 2 or each * ranks == total:
            return ""
        return f"  (the busiest rank; {_binary(total // ranks)} a rank on average)"
    if not int(cost.sent_bytes):
        return ""
    if not sent:
        return "  (each rank but the root, which receives none)"
    idle = {"ring": "the chain's last rank sends", "tree": "the tree's leaves send"}.get(
        cost.algorithm, "the last ranks of each chain or tree send"
    )
    return f"  (the busiest rank; {idle} none)"


def render_roofline(console: Console, result: RooflineResult, fmt: str) -> None:
    """Attainable FLOP/s under the two ceilings and which one binds."""
    if fmt == "json":
        _json(console, result.to_dict())
        return
    r = result.roofline
    memory_ceiling = r.intensity * r.bandwidth_Bps
    relation = "<" if r.bound == "memory" else "≥"
    shown = f"I·B = {_flops_beside(memory_ceiling, r.peak_flops)} {relation} F"
    if r.bound == "compute" and memory_ceiling < r.peak_flops:  # on the ridge, to rounding
        shown = f"on the ridge: I·B = F = {format_flops(r.peak_flops)}"
    rows: Rows = [
        ("arithmetic intensity I", f"{r.intensity:g} FLOP/byte"),
        ("memory bandwidth B", format_rate(r.bandwidth_Bps)),
        ("compute ceiling F", format_flops(r.peak_flops)),
        ("attainable min(F, I·B)", _flops_beside(r.attainable_flops, r.peak_flops)),
        ("ridge F/B", f"{r.ridge_intensity:g} FLOP/byte"),
        (
            "bound",
            f"{r.bound}-bound ({shown})",
        ),
    ]
    _sections(
        console,
        [("roofline (Williams, Waterman & Patterson 2009)", ("quantity", "value"), rows)],
        fmt,
        _ROOFLINE_NOTE,
    )


# ----------------------------------------------------------------------------- pieces


def _flops_beside(value: float, ceiling: float) -> str:
    """`format_flops(value)`, unless it reads as the same rate as `ceiling` though the two
    differ: then in the ceiling's unit with the digits that part them (999.99 GFLOP/s under
    a 1 TFLOP/s ceiling read "1000 GFLOP/s"; it is "0.99999 TFLOP/s")."""
    plain, limit = format_flops(value), format_flops(ceiling)
    try:
        apart = parse_flops(plain) != parse_flops(limit)
    except UnitError:  # a rate past what a plan may write (1e-301 FLOP/s: an audit)
        apart = True
    if value == ceiling or apart:
        return plain
    number, unit = limit.split()
    scale = ceiling / float(number)
    for digits in range(5, 16):
        if f"{value / scale:.{digits}g}" != f"{ceiling / scale:.{digits}g}":
            return f"{value / scale:.{digits}g} {unit}"
    return f"{value / scale!r} {unit}"


def _stage_row(stage: Stage, pipelined: bool = False) -> tuple[str, ...]:
    # a ring's or a tree's hops, or an exchange's blocks, on each level: the section's
    # title says which
    same = pipelined or stage.algorithm in ("ring", "double-tree")
    name = stage.op if same else f"{stage.op} ({stage.algorithm})"
    return (
        name,
        stage.link.name,
        str(int(stage.ranks)),
        f"{int(stage.steps):,}",
        _binary(int(stage.sent_bytes)),
        _time(float(stage.latency_s)),
        _time(float(stage.bandwidth_s)),
        _time(float(stage.time_s)),
    )


def _passed_over(result: CollectiveResult) -> Rows:
    """The algorithm NCCL's choice passed over, where an unnamed all-reduce had two."""
    if result.passed_over is None:
        return []
    other, time = result.passed_over
    name = "NCCL's double binary tree" if other == "double-tree" else "NCCL's ring"
    return [
        (
            "algorithm",
            f"{result.cost.algorithm}: faster here than {name} ({_time(time)}), as NCCL's "
            "tuner chooses",
        )
    ]


def _what_of_it(result: CollectiveResult) -> str:
    """What of T the row is: the contract asks every time to say whether it is the total or
    the exposed part (an audit: "time T" said neither)."""
    if not result.cost.time_s:
        return ""  # nothing moves
    if result.beside_s is not None:
        return "; the total"  # its exposed part is the row below
    return "; the total, all of it exposed: no compute beside it, see --beside"


def _beside(result: CollectiveResult) -> Rows:
    """``--beside``'s rows: the compute beside T and what of T it leaves exposed."""
    if result.beside_s is None:
        return []
    exposed, time = result.exposed_s, float(result.cost.time_s)
    said = (
        "nothing moves"
        if time == 0
        else "nothing hidden"
        if exposed == time
        else "all of it hidden"
        if exposed == 0
        else f"{_time(time - exposed)} of T hidden"
    )
    s = result.slowdown
    rows: Rows = [
        ("compute beside it W", f"{_time(result.beside_s)}"),
        (
            "compute slowdown s",
            f"{format_share(s)} slower beside it (--slowdown)"
            if s
            else "none: ideal overlap (--slowdown 0)",
        ),
        (
            "exposed max(0, T − W/(1 − s))",
            f"{_time(exposed)}  ({said}"
            + (
                ", if an overlap schedule lets them run together; without one all of T)"
                if exposed < time
                else ")"
            ),
        ),
    ]
    if exposed < time and s:  # what the hidden part costs the compute instead
        rows.append(("compute slowed s·(T − exposed)", _time(result.slowed_s)))
    return rows


def _pacing(cost: CollectiveCost) -> str:
    """Q of the bandwidth term: the busiest rank's bytes, or, for a ring across levels
    (`CollectiveCost.bandwidth_s`), the bytes that pace it at the rate they cross at, the
    innermost level's or the outer levels' together (an audit: 1.97 GiB beside a 5.28 ms
    term, which the 252 MiB over the network gives at 50 GB/s, and no link the whole)."""
    whole = _bytes(int(cost.payload_bytes))
    if not cost.pipelined or len(cost.stages) < 2 or not float(cost.bandwidth_s):
        return whole
    inner, *outer = cost.stages
    if float(inner.bandwidth_s) >= float(cost.bandwidth_s):
        q, where = int(inner.payload_bytes), f"over {inner.link.name}"
    elif cost.op == "all-to-all":  # the busiest level (`collectives._exchange_ports`)
        carried, busiest = max(
            exchange_loads(outer), key=lambda load: float(load[0] / load[1].effective_bandwidth)
        )
        q, where = int(carried), f"over {busiest.link.name}"
    else:
        q = sum(int(s.payload_bytes) for s in outer)
        names = sorted({s.link.name for s in outer if int(s.payload_bytes)})
        # a level below them that the hops leave through paces them too (an audit, m502)
        through = [s.link.name for s in outer if s.link.name in cost.links]
        through = [name for name in dict.fromkeys(through) if name not in names]
        where = f"over {' and '.join(names)}" + (
            f", leaving through {' and '.join(through)}" if through else ""
        )
    rate = format_rate(q / float(cost.bandwidth_s))
    return f"{_bytes(q)} {where} at {rate} of the {whole} a rank sends"


def _links(result: CollectiveResult) -> str:
    used = set(result.cost.links)
    parts = [
        f"B {format_rate(level.bandwidth / level.shared_by)} per GPU, "
        + _alpha_text(result, level)
        + _ramp_text(result, level)
        for level in result.levels
        if level.name in used
    ]
    if not parts and int(result.cost.ranks) > 1:  # 0 bytes (`collectives._Pricing.priced`)
        return "none: NCCL discards a collective of 0 B before launching it"
    if not parts:  # one rank: nothing crosses a link
        return "none: a group of one rank sends nothing"
    if len(result.levels) == 1:
        return parts[0]
    names = [level.name for level in result.levels if level.name in used]
    return "; ".join(f"{name}: {part}" for name, part in zip(names, parts, strict=True))


def _alpha_text(result: CollectiveResult, level: Level) -> str:
    """ "α 5 µs", the level's own; a flat algorithm across levels takes each step at the
    largest α its group spans (`collectives._flat_across`), and says so: the row read "ib:
    α 5 µs" over a latency term of 10 steps × 20 µs (an audit)."""
    taken = {float(s.link.latency) for s in result.cost.stages if s.link.name == level.name}
    if not taken or taken == {level.latency}:
        return f"α {format_duration(level.latency)}"
    steps = " and ".join(format_duration(a) for a in sorted(taken))
    return (
        f"α {steps} a step (the largest α the group spans; {level.name}'s own "
        f"{format_duration(level.latency)})"
    )


def _ramp_text(result: CollectiveResult, level: Level) -> str:
    """ ", 86 % of B at this size (measured ramp)" for a ramped level, "" otherwise."""
    stages = [s for s in result.cost.stages if s.link.name == level.name and s.link.ramp]
    if not stages:
        return ""
    # the ramp's share alone: a tree's own share of the rate is said beside its bandwidth term
    shares = {
        round(100 * float(s.effective_bandwidth / s.efficiency) / s.link.effective_bandwidth)
        for s in stages
    }
    reached = " and ".join(f"{v} %" for v in sorted(shares))
    op = result.cost.op
    article = "an" if op[0] == "a" else "a"
    if not all(s.link.ramp is not None and s.link.ramp.measures(op) for s in stages):
        # the plateau: `BandwidthRamp.share`
        return f", {reached} of B: no sweep measured {article} {op} here"
    if any(s.link.ramp is not None and op in s.link.ramp.borrowed for s in stages):
        # a copy of the all-reduce sweep's shares (a review, m514: read "measured")
        return (
            f", {reached} of B at this size (the all-reduce sweep's ramp: no sweep measured "
            f"{article} {op} here)"
        )
    return f", {reached} of B at this size (measured ramp)"


def _bound(latency_s: Any, bandwidth_s: Any) -> str:
    if float(latency_s) == float(bandwidth_s) == 0:
        return "nothing moves"  # one rank or 0 bytes: no step, no byte
    return "latency-bound" if float(latency_s) > float(bandwidth_s) else "bandwidth-bound"


def _binary(n: int) -> str:
    """1073741824 → "1 GiB"; 939524096 → "896 MiB"; 1500 → "1.46 KiB"."""
    value, unit = float(n), "B"
    for prefix in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, prefix
    if unit == "B":
        return f"{n:,} B"
    return f"{f'{value:.2f}'.rstrip('0').rstrip('.')} {unit}"


def _bytes(n: int) -> str:
    """Binary size and exact bytes: "896 MiB (939,524,096 B)"."""
    human = _binary(n)
    return human if abs(n) < 1024 else f"{human} ({n:,} B)"


def _time(seconds: float, scale: float | None = None) -> str:
    """µs below 0.1 s, ms below 100 s, else s; three decimals: "2,094.831 µs". In the unit
    `scale` would take, where given (a column of times in one unit)."""
    unit = seconds if scale is None else scale
    if unit < 0.1:
        return f"{seconds * 1e6:,.3f} µs"
    if unit < 100:
        return f"{seconds * 1e3:,.3f} ms"
    return f"{seconds:,.3f} s"


def _json(console: Console, data: dict[str, Any]) -> None:
    from budget.render import dump_document

    console.file.write(dump_document(data, console.file))


def _sections(
    console: Console,
    sections: list[tuple[str, tuple[str, ...], Rows]],
    fmt: str,
    note: str = _UNITS_NOTE,
) -> None:
    if fmt == "markdown":
        lines: list[str] = []
        for title, headers, rows in sections:
            # aligned as the table's columns (`_table`): a wider table's figures from its third
            # column on right, its names and a quantity's value left (an audit, m394)
            align = [
                "---:" if len(headers) > 2 and any(headers) and i >= 2 else "---"
                for i in range(len(headers))
            ]
            lines += [f"### {title}", "", _md_row(headers), _md_row(tuple(align))]
            lines += [_md_row(row) for row in rows]
            lines.append("")
        lines.append(note)
        console.out("\n".join(lines), highlight=False)
        return
    from budget.render import print_wrapped

    for title, headers, rows in sections:
        # the title and note wrapped by `print_wrapped`, the values by `Hanging`: between
        # words, never inside a figure ("B 50" / "GB/s per GPU" and "α 14" / "µs" ended and
        # began two lines, an audit)
        print_wrapped(console, title, "", style="table.title")
        table = _table(headers, rows, console.width)
        if len(headers) > 2 and not _whole(console, table):
            # too narrow for its columns, rich cut its figures ("161.6…" at 44 columns): each
            # row a two-column table of its own, a header beside each cell
            for row in rows:
                console.print()
                console.print(_table(("", ""), list(zip(headers, row, strict=True))))
            console.print()
            continue
        console.print(table, highlight=False)
    print_wrapped(console, note, "")


def _table(headers: tuple[str, ...], rows: Rows, width: int = 0) -> Table:
    """A section's rows under `headers` (none: all empty): a two-column table's quantity and
    value wrap at their words (`Hanging`), the quantity first where the console's `width` is
    too narrow for the value's widest figure beside it; every number of a wider table
    stays whole."""
    show_header = any(headers)
    table = Table(
        box=box.SIMPLE_HEAD if show_header else None,
        show_header=show_header,
        pad_edge=False,
        padding=(0, 1) if len(headers) <= 3 else (0, 0),
    )
    pair = len(headers) == 2
    # a narrow terminal wraps the quantity's words too, and the value keeps the room of its
    # widest figure: `Hanging` breaks inside a word wider than its cell, and at 44 columns
    # "(2,048,001,048,576 B)" lost its "B)" to the next line
    widest = max((len(w) for row in rows for w in held(row[-1]).split()), default=0)
    words = max((len(w) for row in rows for w in row[0].split()), default=0)
    for i, header in enumerate(headers):
        numeric = show_header and i >= 2
        table.add_column(
            header,
            justify="right" if numeric else "left",
            no_wrap=not pair,
            max_width=max(words, width - widest - 5) if pair and i == 0 and width else None,
        )
    for row in rows:
        table.add_row(
            *(Hanging(c, 0, 0) if pair and i == 1 else Text(c) for i, c in enumerate(row))
        )
    return table


def _whole(console: Console, table: Table) -> bool:
    """`render.table.whole`, imported here only where a table has more than two columns."""
    from budget.render.table import whole

    return whole(console, table)


def _md_row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
