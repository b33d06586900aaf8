"""The search's answer: the best layouts, the Pareto front, and why the rest were dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from budget.units import format_bytes, format_duration

if TYPE_CHECKING:
    from rich.console import Console

    from budget.search import Outcome, Result


def _layout(r: Result) -> list[str]:
    c = r.config
    v = f"×{c.virtual_stages}" if c.virtual_stages > 1 else ""
    return [
        str(c.tp),
        f"{c.pp}{v}",
        str(c.dp),
        str(c.cp),
        str(c.ep),
        "sp" if c.sequence_parallel else "–",
        str(c.zero),
        c.recompute,
        str(c.micro),
    ]


_HEAD = ["tp", "pp", "dp", "cp", "ep", "sp", "zero", "recompute", "micro"]


def _table(title: str, rows: tuple[Result, ...]) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for name in _HEAD:
        table.add_column(
            name, justify="right" if name not in ("sp", "recompute") else "left", no_wrap=True
        )
    for name in ("peak", "step", "exposed", "MFU"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(
            *_layout(r),
            format_bytes(r.peak_bytes),
            format_duration(r.step_time_s),
            format_duration(r.exposed_comm_s),
            f"{r.mfu:.1%}",
        )
    return table


def render_search_table(console: Console, outcome: Outcome, top: int) -> None:
    rate = outcome.evaluated / outcome.elapsed_s if outcome.elapsed_s else 0.0
    console.print(
        f"Evaluated {outcome.evaluated:,} layouts on {outcome.gpus:,} GPUs in "
        f"{outcome.elapsed_s:.2f} s ({rate:,.0f} per second, {outcome.groups:,} groups); "
        f"{len(outcome.results):,} fit.",
        markup=False,
    )
    console.print()
    console.print(
        _table(
            f"Best {min(top, len(outcome.results))} by {outcome.objective}", outcome.results[:top]
        )
    )
    console.print(_table("Pareto front: peak memory against step time", outcome.pareto))
    table = Table(
        title="Not ranked",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("reason")
    table.add_column("layouts", justify="right")
    for reason, count in outcome.rejected.items():
        table.add_row(reason, f"{count:,}")
    console.print(table)


def render_search_markdown(outcome: Outcome, top: int) -> str:
    def rows(results: tuple[Result, ...]) -> list[str]:
        head = [*_HEAD, "peak", "step", "exposed", "MFU"]
        out = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for r in results:
            cells = [
                *_layout(r),
                format_bytes(r.peak_bytes),
                format_duration(r.step_time_s),
                format_duration(r.exposed_comm_s),
                f"{r.mfu:.1%}",
            ]
            out.append("| " + " | ".join(cells) + " |")
        return [*out, ""]

    lines = [
        f"## budget search: {outcome.gpus:,} GPUs",
        "",
        f"{outcome.evaluated:,} layouts evaluated in {outcome.elapsed_s:.2f} s; "
        f"{len(outcome.results):,} fit.",
        "",
        f"### Best by {outcome.objective}",
        "",
    ]
    lines += rows(outcome.results[:top])
    lines += ["### Pareto front: peak memory against step time", ""]
    lines += rows(outcome.pareto)
    lines += ["### Not ranked", "", "| reason | layouts |", "|---|---:|"]
    lines += [f"| {reason} | {count:,} |" for reason, count in outcome.rejected.items()]
    return "\n".join(lines) + "\n"
