"""The terminal report: a header, memory per stage, phases, collectives and a verdict.

Narrow terminals (under 110 columns) get fewer, wider columns rather than wrapped numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table
from rich.text import Text

from budget.units import format_bytes, format_duration

if TYPE_CHECKING:
    from rich.console import Console

    from budget.report import Overlapping, PhaseRow, Report, StageRow

WIDE = 110
_RESIDENT = {"params", "grads", "optimizer", "reserved"}


def _b(n: int) -> str:
    return format_bytes(n)


def _count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.2f}"


def header(report: Report) -> list[str]:
    lay, m = report.layout, report.model
    degrees = " × ".join(
        f"{k} {lay[k]}" for k in ("tp", "cp", "ep", "pp", "dp") if lay[k] > 1 or k == "dp"
    )
    extras = [f"zero {lay['zero']}", f"{lay['schedule']} schedule"]
    if lay["virtual_stages"] > 1:
        extras.append(f"{lay['virtual_stages']} virtual stages")
    if lay["sequence_parallel"]:
        extras.append("sequence parallel")
    extras.append(f"{lay['recompute']} recompute")
    return [
        f"{report.name} · {report.mode} · {report.world_size:,} GPUs = {degrees}",
        f"model: {m['params_total'] / 1e9:,.2f} B parameters ({m['layers']} layers, hidden "
        f"{m['hidden']}, {m['heads']} heads / {m['kv_heads']} kv, ffn {m['ffn']}, vocab "
        f"{m['vocab']:,})",
        f"layout: {', '.join(extras)}; {report.microbatches} micro-batches per step",
        f"device: {_b(report.capacity_bytes)} per GPU, "
        f"{_b(report.device['reserved_bytes'])} of it reserved (1 GiB = 2^30 B)",
    ]


def _bar(row: StageRow, width: int = 8) -> Text:
    fill = row.peak_bytes / row.capacity_bytes if row.capacity_bytes else 1.0
    cells = min(width, round(fill * width))
    style = "green" if fill <= 0.9 else "yellow" if fill <= 1.0 else "red"
    return Text("█" * cells + "·" * (width - cells), style=style)


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def _num(table: Table, header: str, **kw: object) -> None:
    table.add_column(header, justify="right", no_wrap=True, **kw)  # type: ignore[arg-type]


def stage_table(report: Report, wide: bool) -> Table:
    table = _table("Memory per rank of each pipeline stage, at its peak")
    _num(table, "stage")
    if wide:
        _num(table, "layers")
    _num(table, "in flight")
    if wide:
        for name in ("params", "grads", "optimizer", "activations", "transient"):
            _num(table, name)
    else:
        for name in ("states", "activations", "other"):
            _num(table, name)
    _num(table, "peak", style="bold")
    _num(table, "headroom")
    if wide:
        table.add_column("fill", no_wrap=True)
    for row in report.stages:
        cells = [str(row.stage)]
        if wide:
            cells.append(str(row.layers))
        cells.append(_count(row.inflight))
        if wide:
            cells += [_b(row.params_bytes), _b(row.grads_bytes), _b(row.optimizer_bytes)]
            cells += [_b(row.activations_bytes), _b(row.transient_bytes)]
        else:
            states = row.params_bytes + row.grads_bytes + row.optimizer_bytes
            cells += [_b(states), _b(row.activations_bytes)]
            cells.append(_b(row.transient_bytes + row.reserved_bytes))
        headroom = _b(row.headroom_bytes) if row.fits else f"[red]{_b(row.headroom_bytes)}[/]"
        cells += [_b(row.peak_bytes), headroom]
        table.add_row(*cells, *([_bar(row)] if wide else []))
    reserved = _b(report.device["reserved_bytes"])
    table.caption = (
        f"peak includes {reserved} reserved per GPU"
        if wide
        else f"states = params + grads + optimizer; other = transient + {reserved} reserved"
    )
    table.caption_justify = "left"
    return table


def _brief(items: tuple[Overlapping, ...], limit: int = 2) -> str:
    """What a phase adds at its peak: its largest transients, else its largest activations."""
    transient = [o for o in items if o.category == "transient"]
    shown = (transient or [o for o in items if o.category not in _RESIDENT])[:limit]
    return "; ".join(
        f"{o.tensor}{f' ×{o.count}' if o.count > 1 else ''} {_b(o.bytes)}" for o in shown
    )


def phase_table(report: Report, wide: bool) -> Table:
    table = _table("Phases of one step (per rank; peak over all stages)")
    table.add_column("phase", no_wrap=True)
    _num(table, "count")
    _num(table, "sent/rank")
    timed = any(p.comm_s is not None for p in report.phases)
    if timed:
        _num(table, "comm")
        _num(table, "exposed")
    _num(table, "peak live")
    if wide:
        _num(table, "stage")
    table.add_column("largest transients at that peak", ratio=1)
    for p in report.phases:
        cells = [p.name, f"{p.count:,}", _b(p.payload_bytes) if p.payload_bytes else "–"]
        if timed:
            cells += [_t(p.comm_s), _t(p.exposed_s)]
        cells.append("–" if p.peak_stage is None else _b(p.peak_bytes))
        if wide:
            cells.append("" if p.peak_stage is None else str(p.peak_stage))
        cells.append(_brief(p.peak_overlap, 2 if wide else 1))
        table.add_row(*cells)
    return table


def _t(seconds: float | None) -> str:
    return "–" if seconds is None else format_duration(seconds)


_SHORT = {"replicate": "R", "partial": "P"}


def _placement(text: str) -> str:
    """DTensor's short notation: S(0), R, P."""
    return _SHORT.get(text, text.replace("shard", "S"))


def collective_table(phases: tuple[PhaseRow, ...], wide: bool) -> Table:
    table = _table("Layout transitions (ring algorithm; bytes per rank per call)")
    table.add_column("transition", ratio=1)
    table.add_column("collective", no_wrap=True)
    _num(table, "group")
    if wide:
        table.add_column("layout", no_wrap=True)
        table.add_column("dtype", no_wrap=True)
    _num(table, "tensor S")
    _num(table, "sent/rank")
    if wide:
        _num(table, "steps")
    _num(table, "calls")
    for p in phases:
        if not p.collectives:
            continue
        table.add_row(f"[bold]{p.name}[/]")
        for c in p.collectives:
            cells = [c.name, c.op, f"{c.group} {c.ranks}"]
            if wide:
                cells += [f"{_placement(c.src)}→{_placement(c.dst)}", c.dtype]
            cells += [_b(c.bytes), _b(c.sent_bytes)]
            if wide:
                cells.append(str(c.steps))
            cells.append(f"{c.count:,}")
            table.add_row(*cells)
    table.caption = (
        "S(d) = shard on dim d, R = replicate, P = sum-partial; received = sent per rank"
        if wide
        else "received = sent per rank"
    )
    table.caption_justify = "left"
    return table


def verdict(report: Report) -> str:
    worst = report.worst
    where = f"in {worst.peak_phase} ({worst.peak_instant})"
    if worst.fits:
        return (
            f"[green]Fits.[/] The worst stage ({worst.stage}) peaks at {_b(worst.peak_bytes)} "
            f"of {_b(worst.capacity_bytes)} {where}, leaving {_b(worst.headroom_bytes)}."
        )
    over = -worst.headroom_bytes
    top = _brief(worst.peak_overlap, 3)
    return (
        f"[red]Does not fit.[/] Stage {worst.stage} peaks at {_b(worst.peak_bytes)} {where}: "
        f"{_b(over)} ({over:,} B) over {_b(worst.capacity_bytes)}. Largest besides model "
        f"states: {top}."
    )


def overlap_table(row: StageRow) -> Table:
    table = Table(
        title=f"What is alive at the peak of stage {row.stage} "
        f"({row.peak_phase}: {row.peak_instant})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("allocation", ratio=1)
    table.add_column("kind")
    table.add_column("copies", justify="right")
    table.add_column("bytes", justify="right")
    for o in row.peak_overlap:
        name = f"{o.tensor} [dim]({o.placement})[/]" if o.placement else o.tensor
        table.add_row(name, o.category, f"{o.count:,}", _b(o.bytes))
    table.add_row("[bold]total[/]", "", "", f"[bold]{_b(row.peak_bytes)}[/]")
    return table


def render_table(console: Console, report: Report) -> None:
    wide = console.width >= WIDE
    for line in header(report):
        console.print(line, markup=False)
    for table in (
        stage_table(report, wide),
        overlap_table(report.worst),
        phase_table(report, wide),
        collective_table(report.phases, wide),
    ):
        console.print()
        console.print(table)
    console.print()
    console.print(verdict(report))
