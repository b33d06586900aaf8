"""The report as GitHub-flavoured markdown, for pull requests and wikis.

The same figures as the terminal tables, with every column (a page has no width limit).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from budget.errors import one_line
from budget.render import stage_layers
from budget.report import (
    RAMP_HEADER,
    calls_scope,
    group_name,
    phase_scope,
    ramp_note,
    ramp_shares,
)
from budget.units import format_bytes, format_duration, format_rate

if TYPE_CHECKING:
    from budget.report import Report

__all__ = ["code", "fence", "markdown_table", "plain", "render_markdown"]


def code(text: str, cell: bool = False) -> str:
    """`text` as inline code whatever it holds (CommonMark: a run of backticks longer than
    any inside it, padded where it starts or ends with one); in a table cell its pipes are
    escaped, which GitHub's tables require even inside code."""
    text = one_line(" ".join(text.splitlines()))  # and a terminal's controls escaped
    if cell:
        text = text.replace("|", "\\|")
    ticks = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def plain(text: str) -> str:
    """`text` in a heading or a sentence, its markdown and HTML punctuation escaped (a plan
    name is whatever its author typed, and a CI summary renders it)."""
    return re.sub(r"([\\`*_\[\]<>|~&])", r"\\\1", one_line(" ".join(text.splitlines())))


def fence(lines: list[str]) -> list[str]:
    """`lines` in a code block whose fence is longer than any backtick run inside."""
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    ticks = "`" * max(3, longest + 1)
    return [ticks, *lines, ticks]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def markdown_table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """A GitHub-flavoured table, the columns numbered in `right` aligned right, then a blank
    line."""
    align = ["---:" if i in right else "---" for i in range(len(head))]
    return [_row(head), "| " + " | ".join(align) + " |", *(_row(r) for r in rows), ""]


def _t(seconds: float | None) -> str:
    return "–" if seconds is None else format_duration(seconds)


def render_markdown(report: Report) -> str:
    from budget.render.table import (
        LARGEST,
        _brief,
        _columns,
        _count,
        across_levels,
        fp8_memory_note,
        group_legend,
        header,
        inflight_note,
        link_groups,
        no_peak_note,
        pacing_note,
        shared_levels,
        shared_note,
        shown_placement,
        slowdown_note,
        step_cells,
        summary,
        unchunked_peak,
        unreserved,
    )

    b = format_bytes
    worst = report.worst
    timed = report.step["time_s"] is not None
    lines = [f"## budget: {plain(report.name)} · {report.mode}", ""]
    lines += [f"- {plain(line)}" for line in header(report)[1:]]
    lines.append(f"- world: {header(report)[0].split(' · ')[-1]}")
    lines.append("")
    status = "fits" if worst.fits else "**does not fit**"
    lines.append(
        f"**Verdict:** {status}: worst stage {worst.stage} peaks at {b(worst.peak_bytes)} of "
        f"{b(worst.capacity_bytes)} in `{worst.peak_phase}` ({plain(worst.peak_instant)})"
        f"{unchunked_peak(report)}; "
        f"headroom {b(worst.headroom_bytes)}." + (unreserved(report) if worst.fits else "")
    )
    lines.append("")
    from budget.report import slow_link_notes

    cautions = [f"> **Caution:** {plain(note)}." for note in slow_link_notes(report)]
    if cautions:  # one quote each: consecutive quote lines run into one paragraph
        lines += [*"\n>\n".join(cautions).split("\n"), ""]
    lines += [f"- {line}" for line in summary(report)]
    lines.append("")
    lines.append("### Memory per rank of each pipeline stage, at its peak")
    lines.append("")
    columns = _columns(report, wide=True)
    train = report.mode == "train"
    lines += markdown_table(
        [
            "stage",
            "layers",
            *(["in flight"] if train else []),
            *(name for name, _ in columns),
            "reserved",
            "peak",
            "headroom",
            "peak phase",
        ],
        [
            [
                str(s.stage),
                stage_layers(report, s.stage, s.layers),
                *([_count(s.inflight)] if train else []),
                *(b(value(s)) for _, value in columns),
                b(s.reserved_bytes),
                b(s.peak_bytes),
                b(s.headroom_bytes),
                f"`{s.peak_phase}`",
            ]
            for s in report.stages
        ],
        set(range(len(columns) + 5 + train)),
    )
    for note in (inflight_note(report), fp8_memory_note(report)):
        if note:  # markdown_table ends with a blank line
            lines += [plain(note) + ".", ""]
    lines.append(f"### Alive at the peak of stage {worst.stage}")
    lines.append("")
    lines += markdown_table(
        ["allocation", "placement", "kind", "copies", "bytes, all copies"],
        [
            [
                plain(o.tensor),
                shown_placement(o.placement, report.layout),
                o.category,
                f"{o.count:,}",
                b(o.bytes),
            ]
            for o in worst.peak_overlap
        ]
        + [["**total**", "", "", "", f"**{b(worst.peak_bytes)}**"]],
        {3, 4},
    )
    lines.append(f"### Phases ({phase_scope(report)})")
    lines.append("")
    lines += markdown_table(
        [
            "phase",
            "count",
            "compute",
            "communication",
            "exposed",
            "sent per rank",
            "peak live",
            "peak stage",
            LARGEST,
        ],
        [
            [
                f"`{p.name}`",
                f"{p.count:,}",
                _t(p.compute_s),
                _t(p.comm_s),
                _t(p.exposed_s),
                b(p.payload_bytes),
                "–" if p.peak_stage is None else b(p.peak_bytes),
                "" if p.peak_stage is None else str(p.peak_stage),
                plain(_brief(p.peak_overlap, 1)),
            ]
            for p in report.phases
        ]
        + (
            [[f"**{cell}**" if cell else "" for cell in step_cells(report)] + ["", "", ""]]
            if timed
            else []
        ),
        {1, 2, 3, 4, 5, 6, 7},
    )
    notes = (pacing_note(report), slowdown_note(report)) if timed else ()
    for note in (*notes, no_peak_note(report)):
        if note:  # markdown_table ends with a blank line
            lines += [plain(note) + ".", ""]
    lines.append(f"### Collectives (bytes per rank per call; times per call{calls_scope(report)})")
    lines.append("")
    lines += markdown_table(
        [
            "phase",
            "transition",
            "collective",
            "from → to",
            "group",
            "dtype",
            "algorithm",
            "link",
            "tensor S",
            "sent",
            "received",
            "steps",
            "n·α",
            "Q/B_eff",
            "time",
            "exposed",
            "calls",
            "overlap rule",
        ],
        [
            [
                f"`{p.name}`",
                plain(c.name),
                c.op,
                f"{c.src} → {c.dst}",
                # a send's two ranks are a stage and its neighbour, not a group of the pp
                # degree ("pp 2" in a pp 4 plan read as one: a user audit)
                "pp pair"
                if c.op == "send-recv"
                else f"{group_name(c.group, report.layout, c.ranks)} {c.ranks}",
                c.dtype,
                c.algorithm,
                plain(c.link or ""),
                b(c.bytes),
                b(c.sent_bytes),
                b(c.recv_bytes),
                str(c.steps),
                _t(c.latency_term_s),
                _t(c.bandwidth_term_s),
                _t(c.time_s),
                _t(c.exposed_s),
                f"{c.count:,}",
                c.overlap_rule or "",
            ]
            for p in report.phases
            for c in p.collectives
        ],
        set(range(8, 17)),
    )
    if legend := group_legend(report):
        lines += [plain("; ".join(legend)) + ".", ""]
    every = [c for p in report.phases for c in p.collectives]
    if across := across_levels(every, short=False):
        lines += [plain(across[0].upper() + across[1:]) + ".", ""]
    if any(c.algorithm == "double-tree" for p in report.phases for c in p.collectives):
        lines.append(
            "double-tree: NCCL's double binary tree, named or where faster than its ring "
            "(inside one node, its chain)."
        )
        lines.append("")
    lines.append("### Links (per GPU, one direction)")
    lines.append("")
    ramped = any(link.get("ramp") for link in report.links)
    lines += markdown_table(
        [
            "level",
            "GPUs per domain",
            "B_eff",
            "α per step",
            *([RAMP_HEADER] if ramped else []),
            "groups",  # whose collectives it carries, as the table heads it
        ],
        [
            [
                plain(link["name"]),
                "all" if link["size"] is None else str(link["size"]),
                format_rate(link["bandwidth_Bps"]),
                format_duration(link["latency_s"]),
                *([ramp_shares(link)] if ramped else []),
                link_groups(report, link["name"]),
            ]
            for link in report.links
        ],
        {1, 2, 3, 4},
    )
    if ramped:
        lines += [ramp_note(report, plain) + ".", ""]
    if shared := shared_levels(report):
        # its level names are the plan's (an audit: "<roce>" went out as an HTML tag)
        lines += [plain(shared_note(shared)) + ".", ""]
    if not timed:
        lines.append(
            "Times are not computed: the device section has no peak FLOP/s or memory bandwidth."
        )
    return "\n".join(lines)
