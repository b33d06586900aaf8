"""The report as GitHub-flavoured markdown, for pull requests and wikis."""

from __future__ import annotations

from typing import TYPE_CHECKING

from budget.units import format_bytes

if TYPE_CHECKING:
    from budget.report import Report


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(head))]
    return [_row(head), "| " + " | ".join(align) + " |", *(_row(r) for r in rows), ""]


def render_markdown(report: Report) -> str:
    from budget.render.table import header

    b = format_bytes
    worst = report.worst
    lines = [f"## budget: {report.name}", ""]
    lines += [f"- {line}" for line in header(report)[1:]]
    lines.append(f"- world: {header(report)[0].split(' · ')[-1]}")
    lines.append("")
    status = "fits" if worst.fits else "**does not fit**"
    lines.append(
        f"**Verdict:** {status}: worst stage {worst.stage} peaks at {b(worst.peak_bytes)} of "
        f"{b(worst.capacity_bytes)} in `{worst.peak_phase}` ({worst.peak_instant}); headroom "
        f"{b(worst.headroom_bytes)}."
    )
    lines.append("")
    lines.append("### Memory per rank of each pipeline stage, at its peak")
    lines.append("")
    lines += _table(
        [
            "stage",
            "layers",
            "params",
            "grads",
            "optimizer",
            "activations",
            "transient",
            "reserved",
            "peak",
            "headroom",
            "peak phase",
        ],
        [
            [
                str(s.stage),
                str(s.layers),
                b(s.params_bytes),
                b(s.grads_bytes),
                b(s.optimizer_bytes),
                b(s.activations_bytes),
                b(s.transient_bytes),
                b(s.reserved_bytes),
                b(s.peak_bytes),
                b(s.headroom_bytes),
                f"`{s.peak_phase}`",
            ]
            for s in report.stages
        ],
        set(range(10)),
    )
    lines.append(f"### Alive at the peak of stage {worst.stage}")
    lines.append("")
    lines += _table(
        ["allocation", "kind", "copies", "bytes"],
        [[o.tensor, o.category, f"{o.count:,}", b(o.bytes)] for o in worst.peak_overlap],
        {2, 3},
    )
    lines.append("### Phases (per rank; peak over all stages)")
    lines.append("")
    lines += _table(
        ["phase", "count", "sent per rank", "peak live", "stage"],
        [
            [
                f"`{p.name}`",
                f"{p.count:,}",
                b(p.payload_bytes),
                b(p.peak_bytes),
                "" if p.peak_stage is None else str(p.peak_stage),
            ]
            for p in report.phases
        ],
        {1, 2, 3, 4},
    )
    lines.append("### Layout transitions (ring; bytes per rank per call)")
    lines.append("")
    lines += _table(
        [
            "phase",
            "transition",
            "collective",
            "group",
            "dtype",
            "from → to",
            "tensor S",
            "sent",
            "received",
            "steps",
            "calls",
        ],
        [
            [
                f"`{p.name}`",
                c.name,
                c.op,
                f"{c.group} {c.ranks}",
                c.dtype,
                f"{c.src} → {c.dst}",
                b(c.bytes),
                b(c.sent_bytes),
                b(c.recv_bytes),
                str(c.steps),
                f"{c.count:,}",
            ]
            for p in report.phases
            for c in p.collectives
        ],
        {6, 7, 8, 9, 10},
    )
    return "\n".join(lines)
