"""`budget plot`: a picture of the worst stage's memory over one step and of each phase's
communication, exposed versus hidden. matplotlib is an optional extra (``budget[plot]``);
without it `plot_report` raises `PlotUnavailable` and the CLI prints a one-line hint.

Top panel: the live bytes on one rank of the worst stage at every instant the step
describes, stacked by category, with the device capacity as a line and the peak annotated
with the largest allocations alive there. Bottom panel: per phase, communication time over
the step split into the exposed part (the step waits for it) and the hidden part.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budget.files import write_atomically
from budget.report import summed_over_stages, time_word
from budget.units import format_bytes, format_duration

if TYPE_CHECKING:
    from budget.report import Report

__all__ = ["FORMATS", "PlotUnavailable", "plot_report"]

FORMATS = ("png", "svg")
GIB = 2**30

# (category, legend label, colour): resident states at the bottom, then what comes and goes
_CATEGORIES = (
    ("reserved", "reserved (runtime, NCCL)", "#b8b8b8"),
    ("params", "parameters", "#4e79a7"),
    ("grads", "gradients", "#f28e2b"),
    ("optimizer", "optimizer states", "#59a14f"),
    ("kv_cache", "KV cache", "#9c755f"),
    ("activations", "saved activations", "#b07aa1"),
    ("transient", "transients", "#e15759"),
)
_EXPOSED, _HIDDEN = "#e15759", "#a0cbe8"


class PlotUnavailable(Exception):
    """matplotlib is not installed."""

    def __init__(self) -> None:
        super().__init__("budget plot needs matplotlib: pip install 'budget[plot]'")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable() from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def picture_format(path: Path) -> str:
    """The format of the picture `path` names by its suffix (png or svg); a ValueError for
    another, which `budget plot` says before it reads the plan."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"-o {path}: the picture must be a .png or .svg file")
    return fmt


def plot_report(report: Report, path: Path) -> None:
    """Draw `report` into `path`; the format (png or svg) follows the file's suffix."""
    fmt = picture_format(path)
    plt = _pyplot()
    # stable ids: same plan, same bytes; text kept as text, so that an SVG's labels can be
    # searched, selected and read aloud (an audit: every label was drawn as outlines); and
    # text as typed: a plan's name with two $ was read as mathtext, garbled or an error
    # (an audit: "8b for $5k or $10k" lost its $ signs, "$\\frac$" stopped the plot)
    settings = {"svg.hashsalt": "budget", "svg.fonttype": "none", "text.parse_math": False}
    with plt.rc_context(settings):
        fig, axes = panels(plt)
        try:
            draw(fig, axes, report)
            write_atomically(  # the picture whole, or the old file as it was
                path,
                lambda staged: fig.savefig(
                    staged, format=fmt, dpi=120, bbox_inches="tight", metadata=_metadata(fmt)
                ),
            )
        finally:
            plt.close(fig)


def panels(plt: Any) -> tuple[Any, tuple[Any, Any]]:
    """The figure and its two panels: memory over the step above, communication below."""
    fig, axes = plt.subplots(
        2, 1, figsize=(12, 9), gridspec_kw={"height_ratios": [3, 2], "hspace": 0.6}
    )
    return fig, (axes[0], axes[1])


def draw(fig: Any, axes: tuple[Any, Any], report: Report) -> None:
    """`report` drawn into the `panels`, laid out clear of each other."""
    top, bottom = axes
    hung = _memory(top, report)
    _communication(bottom, report)
    _separate(fig, top, bottom)
    if hung is not None:  # the panels' heights are settled: the peak's box against the legend
        _below_legend(top, *hung)
        _separate(fig, top, bottom)


# the least space between the memory panel's axis label and the communication panel's title,
# in pixels at the figure's own dpi
_GAP_PX = 12.0


def _separate(fig: Any, top: Any, bottom: Any) -> None:
    """Widen the space between the panels until the memory panel's rotated instant names
    and its axis label clear the communication panel's title: their height follows the
    plan's longest instant name, which a fixed space did not hold (an audit: Llama 3 8B's
    "embedding+head gradients' reduce-scatter" put the axis label through the title)."""
    spec = top.get_subplotspec().get_gridspec()
    hspace = spec.hspace
    for _ in range(8):
        renderer = fig.canvas.get_renderer()
        gap = top.get_tightbbox(renderer).y0 - bottom.get_tightbbox(renderer).y1
        if gap >= _GAP_PX:
            return
        # hspace is in mean axes heights: turn the missing pixels into that unit
        height = (top.get_window_extent().height + bottom.get_window_extent().height) / 2
        hspace += (_GAP_PX - gap) / height * 1.2
        spec.update(hspace=hspace)


def _metadata(fmt: str) -> dict[str, Any]:
    """No dates in the file, so the same plan draws the same bytes."""
    return {"Date": None} if fmt == "svg" else {"Software": None}


def _one(word: str) -> str:
    """ "one step" of a training plan, "the run" of a serving plan (`time_word`)."""
    return "one step" if word == "step" else f"the {word}"


def _memory(ax: Any, report: Report) -> tuple[Any, Any] | None:
    worst = report.worst
    points = worst.timeline
    capacity = worst.capacity_bytes / GIB
    xs = list(range(len(points)))
    bottoms = [0.0] * len(points)
    for category, label, colour in _CATEGORIES:
        heights = [p.by_category.get(category, 0) / GIB for p in points]
        if not any(heights):
            continue
        ax.bar(xs, heights, 0.8, bottom=bottoms, color=colour, label=label, edgecolor="white")
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.axhline(capacity, color="#c0392b", linestyle="--", linewidth=1.5)
    top = max(capacity, max(bottoms, default=0.0))
    ax.set_ylim(0, top * 1.15)
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.set_ylabel("live memory per rank (GiB)")
    verdict = "fits" if worst.fits else "does NOT fit"
    n = len(report.stages)
    which = "the only stage" if n == 1 else f"the worst of {n}"
    word = time_word(report.mode)  # a serving plan's time is its whole run (an audit)
    ax.set_title(
        f"{report.name}: stage {worst.stage} ({which}) over {_one(word)} "
        # in GiB to the tenth, as the axis and the peak's marker read it
        f"— peak {worst.peak_bytes / 2**30:.1f} GiB of {worst.capacity_bytes / 2**30:.1f} GiB, "
        f"{verdict}",
        loc="left",
        fontsize=11,
        pad=30,
    )
    ax.set_xticks(xs)
    ax.set_xticklabels([p.instant for p in points], rotation=30, ha="right", fontsize=8)
    if _phase_bands(ax, [p.phase for p in points]):  # names a row higher: the title too
        ax.set_title(ax.get_title(loc="left"), loc="left", fontsize=11, pad=50)
    ax.set_xlabel(
        f"instants of {_one(word)} on this stage, in order (each phase drawn once, at its "
        "fullest instance)",
        fontsize=8,
        color="#444444",
    )
    peak = max(xs, key=lambda i: (points[i].total_bytes, -i)) if points else -1
    for x, total in zip(xs, bottoms, strict=True):
        if x != peak:
            ax.text(x, total, f"{total:.1f}", ha="center", va="bottom", fontsize=7, color="#333")
    right = peak + 0.75  # where the headroom arrow and its label end
    box = None
    if points:
        right = _headroom(ax, peak, points[peak].total_bytes / GIB, capacity, bottoms)
        box = _annotate_peak(ax, report, peak, points[peak].total_bytes / GIB)
    _capacity_label(ax, worst.capacity_bytes, bottoms, peak, right)
    handles, labels = ax.get_legend_handles_labels()
    legend = ax.legend(  # top of the legend = top of the stack
        handles[::-1],
        labels[::-1],
        loc="upper left",
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return None if box is None else (legend, box)


def _capacity_label(
    ax: Any, capacity_bytes: int, tops: list[float], peak: int, right: float
) -> None:
    """The capacity line's label, at the leftmost place along the line where no bar, bar
    label, peak marker or headroom arrow stands behind it, else at the axis (a read of the
    picture: beside a stage near its memory it hid the first bars' labels). `tops` are the
    bars' heights in GiB, `peak` the peak bar's index, `right` where the headroom arrow and
    its label end."""
    capacity = capacity_bytes / GIB
    label = ax.text(
        -0.45,
        capacity,
        f"capacity {format_bytes(capacity_bytes)}",
        va="center",
        ha="left",
        color="#c0392b",
        fontsize=9,
        bbox={"boxstyle": "square,pad=0.2", "facecolor": "white", "edgecolor": "none"},
        zorder=5,
    )
    renderer = ax.figure.canvas.get_renderer()
    box = label.get_window_extent(renderer).transformed(ax.transData.inverted())
    per_point = _per_point(ax)
    width, half = box.width, box.height / 2
    for start in (k - 0.45 for k in range(len(tops))):
        if start + width > len(tops) - 0.4:
            break
        if start < right and start + width > peak + 0.4:  # the headroom arrow and label
            continue
        covered = [j for j in range(len(tops)) if j - 0.4 < start + width and j + 0.4 > start]
        # a bar's label stands 7 points tall above it, the peak's marker 12 points up
        if all(tops[j] + (26 if j == peak else 9) * per_point < capacity - half for j in covered):
            label.set_x(start)
            return


def _phase_bands(ax: Any, phases: list[str]) -> bool:
    """Alternating shaded spans, one per phase, named along the top edge of the panel; a
    name that would run into the one before it is lifted a row above it (`_lifted`).
    Returns whether any was."""
    start, band = 0, 0
    centres: list[float] = []
    names: list[str] = []
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            if band % 2 == 0:
                ax.axvspan(start - 0.5, i - 0.5, color="#f0f0f0", zorder=0)
            centres.append((start + i - 1) / 2)
            names.append(phases[start].replace(".", "\n", 1))
            band += 1
            start = i
    names = _lifted(ax, centres, names)
    top = ax.secondary_xaxis("top")
    top.set_xticks(centres)
    top.set_xticklabels(names, fontsize=8, color="#444444")
    top.tick_params(length=0)
    return any(name.endswith(_LIFT) for name in names)


_LIFT = "\n\n"  # a name's blank rows under it: drawn upward from the axis, it rises two rows


def _lifted(ax: Any, centres: list[float], names: list[str]) -> list[str]:
    """Each phase's name, with blank rows under it where it would otherwise overlap the name
    before it on the same row (an audit: a one-instant band is about a bar wide, and "dp
    grads" beside "optimizer" read "gradsoptimizer"). Names alternate between the two rows
    only as far as they must."""
    renderer = ax.figure.canvas.get_renderer()
    ends = [float("-inf"), float("-inf")]  # each row's last name's right edge, in pixels
    out = []
    for centre, name in zip(centres, names, strict=True):
        probe = ax.figure.text(0, 0, name, fontsize=8)
        half = probe.get_window_extent(renderer).width / 2 + 3  # a little space between
        probe.remove()
        x = float(ax.transData.transform((centre, 0))[0])
        row = 0 if x - half >= ends[0] else 1 if x - half >= ends[1] else 0
        ends[row] = x + half
        out.append(name + _LIFT if row else name)
    return out


def _per_point(ax: Any) -> float:
    """GiB of the memory axis a typographic point spans."""
    renderer = ax.figure.canvas.get_renderer()
    low, high = ax.get_ylim()
    return float((high - low) / (ax.get_window_extent(renderer).height * 72 / ax.figure.dpi))


def _headroom(ax: Any, x: int, peak: float, capacity: float, tops: list[float]) -> float:
    """A double arrow from the peak to the capacity line: free memory, or the excess,
    labelled along it, or level above the two (and the next bar's label) where the gap is
    shorter than the label (an audit: "9.0 GiB over", centred on a 9 GiB gap, ran across
    the capacity line). `tops` are the bars' heights. Returns where the arrow and its label
    end on the right (data units)."""
    fits = peak <= capacity
    colour = "#2e7d32" if fits else "#c0392b"
    ax.annotate(
        "",
        xy=(x + 0.45, capacity),
        xytext=(x + 0.45, peak),
        arrowprops={"arrowstyle": "<->", "color": colour, "linewidth": 1.2},
    )
    gap = abs(capacity - peak)
    label = ax.text(
        x + 0.5,
        (capacity + peak) / 2,
        f"{gap:.1f} GiB {'free' if fits else 'over'}",
        color=colour,
        fontsize=8,
        va="center",
        ha="left",
        rotation=90,
    )
    renderer = ax.figure.canvas.get_renderer()
    box = label.get_window_extent(renderer).transformed(ax.transData.inverted())
    if box.height > gap:  # a bar's label stands 9 points tall above it; 2 points clear
        per_point = _per_point(ax)
        beside = tops[x + 1] + 9 * per_point if x + 1 < len(tops) else 0.0
        label.set(rotation=0, va="bottom", y=max(capacity, peak, beside) + 2 * per_point)
        box = label.get_window_extent(renderer).transformed(ax.transData.inverted())
    return float(box.x1)


def _annotate_peak(ax: Any, report: Report, x: int, y: float) -> Any:
    """Mark the peak bar, and list what is alive there in the right margin (the list's
    text, returned)."""
    worst = report.worst
    ax.annotate(
        f"peak {y:.1f}",
        xy=(x, y),
        # ending at the bar's centre: the headroom arrow and its label stand to its right,
        # and a label centred above the bar ran into them where little was free (a read);
        # centred on the first bar, which has the axis to its left
        xytext=(2 if x else 0, 12),
        textcoords="offset points",
        ha="right" if x else "center",
        fontsize=8,
        fontweight="bold",
        arrowprops={"arrowstyle": "->", "color": "#333333"},
    )
    lines = [f"alive at the peak ({worst.peak_instant}):"]
    for o in worst.peak_overlap[:6]:
        copies = f" ×{o.count:,}" if o.count > 1 else ""
        # a long name wraps under itself: one line of it made the picture twice as wide
        # as its panels (Llama 3 8B FSDP's log-softmax, 120 characters)
        name = textwrap.wrap(f"{o.tensor}{copies}", _BOX_NAME) or [""]
        lines.append(f"  {format_bytes(o.bytes):>9}  {name[0]}")
        lines += [f"{'':13}{more}" for more in name[1:]]
    rest = worst.peak_overlap[6:]
    if rest:
        lines.append(f"  {format_bytes(sum(o.bytes for o in rest)):>9}  {len(rest)} more")
    lines.append(f"  {format_bytes(worst.peak_bytes):>9}  total")
    return ax.text(
        1.01,
        0.0,
        "\n".join(lines),
        transform=ax.transAxes,
        ha="left",
        va="bottom",
        fontsize=7.5,
        family="monospace",
        bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "#999999"},
    )


def _below_legend(ax: Any, legend: Any, box: Any) -> None:
    """The peak's box, set on the panel's floor and growing up, hung from under the legend
    instead where it would reach into it (an audit: the tensor-parallel loss-gathered
    plan's long names wrapped it to 11 lines, its first through "parameters" and
    "reserved"); it may then reach below the panel, beside the instants' names, and
    `_separate` keeps the panel under it clear."""
    renderer = ax.figure.canvas.get_renderer()
    floor = legend.get_window_extent(renderer).y0
    pad = 8.0  # the box's frame around its text, in pixels, and a little space
    if box.get_window_extent(renderer).y1 + pad <= floor:
        return
    x = box.get_position()[0]
    box.set_position((x, float(ax.transAxes.inverted().transform((0, floor - pad))[1])))
    box.set_va("top")


# the characters of an allocation's name on one line of the peak's box
_BOX_NAME = 60


def _communication(ax: Any, report: Report) -> None:
    phases = [p for p in report.phases if p.comm_s is not None]
    if report.step["time_s"] is None or not any(p.comm_s for p in phases):
        # computed and nothing to move (one GPU) is not "not computed" (an audit)
        said = (
            "communication time not computed"
            if report.step["time_s"] is None
            else f"no communication: 0 s of the {format_duration(report.step['time_s'])} "
            f"{time_word(report.mode)}"
        )
        ax.text(0.5, 0.5, said, ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    names = [p.name for p in phases]
    exposed = [(p.exposed_s or 0.0) for p in phases]
    hidden = [(p.comm_s or 0.0) - e for p, e in zip(phases, exposed, strict=True)]
    # the axis in the unit its bars' labels take (`format_duration`; an audit, m494: "ms"
    # ticks of 0.00 to 0.05 beside bars labelled 49.2 µs)
    most = max(p.comm_s or 0.0 for p in phases)
    scale, unit = (1.0, "s") if most >= 1 else (1e3, "ms") if most >= 1e-3 else (1e6, "µs")
    xs = list(range(len(phases)))
    word = time_word(report.mode)
    ax.bar(xs, [e * scale for e in exposed], 0.7, color=_EXPOSED, label=f"exposed ({word} waits)")
    ax.bar(
        xs,
        [h * scale for h in hidden],
        0.7,
        bottom=[e * scale for e in exposed],
        color=_HIDDEN,
        label="hidden behind compute",
    )
    tallest = max((p.comm_s or 0.0) * scale for p in phases)
    for x, p in zip(xs, phases, strict=True):
        if p.comm_s:
            label = format_duration(p.comm_s)
            ax.text(x, p.comm_s * scale, label, ha="center", va="bottom", fontsize=7, color="#333")
    ax.set_ylim(0, tallest * 1.15)
    ax.set_xlim(-0.6, len(phases) - 0.4)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"communication per {word} ({unit})")
    step = report.step
    exposed_s, comm_s = float(step["exposed_comm_s"] or 0), float(step["comm_s"] or 0)
    share, time_s = float(step["exposed_share"] or 0), float(step["time_s"] or 0)
    totals = (
        f"{format_duration(exposed_s)} exposed of {format_duration(comm_s)} "
        f"({share:.1%} of the {format_duration(time_s)} {word})"
    )
    pacing = step.get("pacing_stage")
    if pacing is not None and len(report.stages) > 1:
        # the bars are each phase on its costliest stage (the report's rows), which no one
        # rank runs all of; the totals are the phases the step waits for (an audit: the
        # title read as the bars' sum, which is more)
        title = (
            f"communication per phase, each on the stage where it costs most\n"
            f"the {word}, paced by stage {pacing}: {totals}"
        )
    elif summed_over_stages(report):  # a serving pass crosses the stages one by one: each
        # bar is a phase over all of them, as the report's rows (an audit: "on one rank")
        title = f"communication per phase, summed over the stages a pass crosses: {totals}"
    else:
        title = f"communication per phase on one rank: {totals}"
    ax.set_title(title, loc="left", fontsize=11)
    ax.legend(loc="upper left", fontsize=8, frameon=False, bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
