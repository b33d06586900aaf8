"""`budget diff` output: the plan keys that changed, then the budget's figures side by side
with absolute and relative deltas, green where B is better and red where it is worse, ✓ and
✗ beside them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, cast

from rich.table import Table
from rich.text import Text

from budget.diff import TRANSITION_KEY
from budget.errors import one_line
from budget.render import NBSP, Hanging, print_wrapped, utf
from budget.render.markdown import code, plain
from budget.render.table import printable, titled_table, whole
from budget.report import phase_scope, run_scope, time_word
from budget.units import (
    decimals_apart,
    format_amount,
    format_bytes,
    format_duration,
    format_flops,
    format_rate,
    format_share,
    plural,
    unit_scale,
)

if TYPE_CHECKING:
    from rich.console import Console

    from budget.diff import Change, Delta, PlanDiff, Row, Value
    from budget.report import Report

__all__ = ["diff_markdown", "render_diff"]

_STYLE = {"better": "green", "worse": "red", "same": "dim", "n/a": "dim"}
# the colour and the sign, as the terminal's table gives both (README: "✓ and ✗ as well")
_MARK = {"better": "🟢 ✓ ", "worse": "🔴 ✗ ", "same": "", "n/a": ""}
# beside the colour, not instead of it: a reader who does not see red from green, a CI log
# that keeps the colour codes (a user audit)
_PLAIN_MARK = {"better": " ✓", "worse": " ✗", "same": "  ", "n/a": "  "}
# on a stream that is not UTF the stand-ins of ✓ and ✗ (`budget.render.standins`), each as
# wide as the other, so that the percentages stay one under the other
_ASCII_MARK = {"better": "  ok", "worse": " bad", "same": "    ", "n/a": "    "}
_LABELS = {
    "states_bytes": "states",
    "activations_bytes": "activations",
    "transient_bytes": "transients",
    "kv_cache_bytes": "KV cache",
    "reserved_bytes": "reserved",
    "peak_bytes": "peak",
    "headroom_bytes": "headroom",
    "payload_bytes": "sent/rank",
    "comm_s": "communication",
    "exposed_s": "exposed",
    "time_s": "step time",
    "compute_s": "compute",
    "exposed_comm_s": "exposed comm",
    "overlap_slowdown_s": "overlap slowdown",
    "exposed_share": "exposed share",
    "bubble_s": "pipeline bubble",
    "after_s": "reduction + optimizer",
    # the times a phase runs, as the report's phase table heads it: not its collectives'
    # calls, which the collectives table counts (an audit: "calls" read as those)
    "count": "count",
    "layers": "layers",
    "mtp_layers": "MTP layers",
    "inflight": "in flight",
    "tokens_per_s": "tokens/s",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    "mfu": "MFU",
    "mfu_causal": "MFU, causal attention",
    "ttft_s": "time to first token",
    "decode_token_s": "decode, per token",
}
_SUMMARY_LABELS = {
    "peak_bytes": "worst-stage peak",
    "headroom_bytes": "worst-stage headroom",
    "decode_token_s": "time per output token",
}


def render_diff(console: Console, a: Report, b: Report, diff: PlanDiff, fmt: str) -> None:
    """Render the comparison of `a` and `b` on `console` in `fmt`."""
    if fmt == "json":
        from budget.diff import diff_to_dict
        from budget.render import dump_document

        console.file.write(dump_document(diff_to_dict(a, b, diff), console.file))
    elif fmt == "markdown":
        console.file.write(diff_markdown(a, b, diff))
    else:
        _render_table(console, a, b, diff)


# ------------------------------------------------------------------------------ values


def _value(unit: str, value: float | None) -> str:
    if value is None:
        return "–"
    if value < 0:  # a negative headroom: the minus sign the Δ column writes
        return "−" + _value(unit, -value)
    if unit == "bytes":
        return format_bytes(value)
    if unit == "seconds":
        return format_duration(value)
    if unit == "share":
        return format_share(value)
    if unit == "count" and value != int(value):  # micro-batches in flight: 4.5
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    if unit == "tokens/s":  # 0.494 a GPU, not "0", as the report writes it (an audit, m425)
        return format_amount(value)
    return f"{value:,.0f}"


def _pair(delta: Delta) -> tuple[str, str]:
    """A and B as a row shows them: `_value`'s figures, or, where those read alike for a
    time or a size that moved, in A's unit with as many decimals as tell the two apart (an
    audit, m529: "1.15 s → 1.15 s" beside a step time "+0.5%" worse)."""
    a, b = delta.a, delta.b
    shown = _value(delta.unit, a), _value(delta.unit, b)
    if a is None or b is None or a == b or shown[0] != shown[1]:
        return shown
    number, _, name = shown[0].lstrip("−").partition(" ")
    scale = unit_scale(name) if delta.unit in ("seconds", "bytes") else None
    if scale is None:
        return shown
    start = len(number.partition(".")[2]) + 1
    digits = decimals_apart((a / scale, b / scale), start=start)

    def finer(value: float) -> str:
        return ("−" if value < 0 else "") + f"{abs(value) / scale:,.{digits}f} {name}"

    return finer(a), finer(b)


def _change(delta: Delta) -> tuple[str, str]:
    """(absolute, relative) for people: ("+1.20 GiB", "+4.1%"); shares move in points."""
    change, rel = delta.absolute, delta.relative
    if change is None:
        return "–", "–"
    # a float's last bits (A's 277 ms against B's, summed in another order) are no change;
    # nought in the row's unit, and no percentage of a nought (an audit: "0" and "0%" beside
    # a JSON relative of null)
    if change == 0 or (rel is not None and abs(rel) < 1e-12):
        nought = "0 pt" if delta.unit == "share" else _value(delta.unit, 0)
        return nought, "–" if rel is None else "0%"
    sign = "+" if change > 0 else "−"
    if delta.unit == "share":
        points = abs(change) * 100  # a change under 0.05 pt keeps a digit: "+0.0 pt" in red
        text = f"{sign}{points:.1f} pt" if points >= 0.05 else f"{sign}{points:.1g} pt"
    else:
        text = sign + _value(delta.unit, abs(change))
    # a change under 0.05 % keeps its digits, as shares do ("−0.0%" said nothing)
    return text, "–" if rel is None else f"{'+' if rel > 0 else '−'}{format_share(abs(rel))}"


def _quantity(key: str) -> tuple[Callable[[float], str], str] | None:
    """How a plan key's number reads (its formatter) and the unit it is written in full
    in (`plan_values`): sizes, rates, FLOP/s and times; None for a plain number."""
    leaf = key.rsplit(".", 1)[-1]
    if key.startswith("device.flops."):
        return format_flops, " FLOP/s"
    if leaf in ("memory", "reserved"):
        return format_bytes, " B"
    if "bandwidth" in leaf:
        return format_rate, " B/s"
    if leaf in ("latency", "kernel_startup"):
        return format_duration, " s"
    return None


def plan_value(key: str, value: Value) -> str:
    """A plan value as its author would write it: sizes, rates and times with units."""
    if value is None or value == "":
        return "–"
    if isinstance(value, list):  # plain integers inside a list: [8192], not [8,192]
        items = (str(v) if type(v) is int else plan_value(key, v) for v in value)
        return "[" + ", ".join(items) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if quantity := _quantity(key):
            return quantity[0](value)
        if key.endswith("efficiency") and isinstance(value, float):
            return f"{value:.1%}"  # a fraction of a peak, as `budget presets` shows it
        return f"{value:,}" if isinstance(value, int) else f"{value:g}"
    return str(value)


def plan_values(key: str, a: Value, b: Value) -> tuple[str, str]:
    """A changed key's two values as `plan_value` writes them, or where that rounds them
    alike, exactly, in the unit of `_quantity` (an audit: 3 GiB against 3.001 GiB read
    "3.00 GiB → 3.00 GiB")."""
    shown = plan_value(key, a), plan_value(key, b)
    if shown[0] != shown[1] or not all(_number(v) for v in (a, b)):
        return shown
    unit = quantity[1] if (quantity := _quantity(key)) else ""
    return _in_full(cast(float, a)) + unit, _in_full(cast(float, b)) + unit


def _number(value: Value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _in_full(value: float) -> str:
    """Every digit of a number: an integer (or a float that is one) grouped by thousands,
    another float as Python writes it back exactly (`repr`)."""
    if isinstance(value, int) or (value.is_integer() and abs(value) < 1e21):
        return f"{int(value):,}"
    return repr(value)


def _phases_title(a: Report, b: Report) -> str:
    """The phase rows' scope: one step, or a serving plan's prefill or batch; and what a row
    of each plan stands for (`phase_scope`), as a report's title says it (an audit: a decode
    plan over a pipeline sums its calls and times over the stages a pass crosses, which the
    diff's title did not say beside one without)."""
    scope = run_scope(a) if run_scope(a) == run_scope(b) else "a run of each plan"
    rows_a, rows_b = phase_scope(a), phase_scope(b)
    if rows_a != rows_b:
        rows_a = f"per rank; A {_beyond_rank(rows_a)}; B {_beyond_rank(rows_b)}"
    return f"Phases of {scope} ({rows_a})"


def _beyond_rank(scope: str) -> str:
    """`phase_scope` past its "per rank"."""
    return scope.removeprefix("per rank").lstrip(";, ")


def _title(report: Report) -> str:
    from budget.render.table import header

    return f"{one_line(report.file)}: {header(report)[0]}"


def _label(metric: str, summary: bool = False) -> str:
    if summary and metric in _SUMMARY_LABELS:
        return _SUMMARY_LABELS[metric]
    return _LABELS.get(metric, metric)


def _time_title(diff: PlanDiff) -> str:
    """What the summary's times are of: a training "Step", or two serving plans' "Run"."""
    return time_word("train" if "train" in diff.modes else "serving").capitalize()


def _summary_label(diff: PlanDiff, metric: str) -> str:
    """A step figure's label; MFU's names each side's peak where they differ, "MFU (bf16 →
    fp8 peak)" (an audit: 49.1 % → 32.6 % read as worse, of peaks a factor 2 apart); where
    the modes differ, the time, rate and MFU say what each side's are of (`_OF_MODE`)."""
    if metric == "tokens_per_s_per_gpu":  # the whole job's rate's label, per GPU, before
        # what each side's is of: "tokens/s per GPU (training → decoding)"
        rate, paren, rest = _summary_label(diff, "tokens_per_s").partition(" (")
        return f"{rate} per GPU{paren}{rest}"
    if metric == "mfu_causal":  # MFU's, counting the attention as the mask computes it:
        # "MFU, causal attention (bf16 → fp8 peak)"
        mfu, paren, rest = _summary_label(diff, "mfu").partition(" (")
        return f"{mfu}, causal attention{paren}{rest}"
    ma, mb = diff.modes
    words = _OF_MODE.get(metric, {})
    if words and words[ma] != words[mb]:  # each side's figure is of its own mode's work
        base = "time" if metric == "time_s" else _label(metric, summary=True)
        of = [f"{words[ma]} → {words[mb]}"]
        if metric == "mfu" and not diff.one_peak:
            of.append(_peaks(diff))
        return f"{base} ({'; '.join(of)})"
    # two decode plans' rate and MFU are of their decode passes, as their reports say, not
    # of the whole run the time beside them is (a user audit)
    decoding = diff.modes == ("decode", "decode")
    if metric == "mfu" and not diff.one_peak:
        return f"{'decode ' if decoding else ''}MFU ({_peaks(diff)})"
    if decoding and metric in ("tokens_per_s", "mfu"):
        return {"tokens_per_s": "tokens/s decoding", "mfu": "decode MFU"}[metric]
    if diff.modes == ("prefill", "prefill") and metric == "tokens_per_s":
        return "prompt tokens/s"
    if metric == "time_s" and "train" not in diff.modes:  # two serving plans' whole runs
        return f"{time_word('serving')} time"
    return _label(metric, summary=True)


# what a plan's step time, tokens/s and MFU are of, by mode, where two plans' modes differ
# (an audit: a decode plan's rate of its decode passes sat beside a training step's tokens/s
# as "tokens/s", and its run as "step time")
_OF_MODE = {
    "time_s": {"train": "step", "prefill": "run", "decode": "run"},
    "tokens_per_s": {"train": "training", "prefill": "prompt", "decode": "decoding"},
    "mfu": {"train": "step", "prefill": "prefill", "decode": "decoding"},
}


def _peaks(diff: PlanDiff) -> str:
    """Whose peak each side's MFU is a share of: "bf16 → fp8 peak", or between devices of
    other rates "989.4 TFLOP/s → 312 TFLOP/s peak"."""
    (fa, fb), (pa, pb) = diff.mfu_formats, diff.mfu_peaks
    if fa != fb:
        return f"{fa} → {fb} peak"
    return f"{format_flops(pa)} → {format_flops(pb)} peak"


def _shown(rows: tuple[Row, ...], metric: str) -> bool:
    """KV cache and reserved rows only when a side has one; a stage's layers and
    micro-batches in flight and a phase's calls only when they change somewhere (they
    explain the figures under them); every other metric always."""
    if metric in ("layers", "mtp_layers", "inflight", "count"):
        return any(d.metric == metric and d.changed for r in rows for d in r.deltas)
    if metric not in ("kv_cache_bytes", "reserved_bytes"):
        return True
    return any(d.metric == metric and (d.a or d.b) for r in rows for d in r.deltas)


def _name(row: Row) -> str:
    """A row's first cell: the phase or stage, the side it exists on alone, and for stages
    paired by role the stage of each plan: ``last (A 7, B 15)``."""
    if row.key in ("first", "last"):
        a, b = row.stages
        return f"{row.key} ({a})" if a == b else f"{row.key} (A {a}, B {b})"
    return row.key + ("" if row.in_a and row.in_b else " (A only)" if row.in_a else " (B only)")


# what the headline names: the peak, the step, and a serving plan's latencies
_HEADLINE = ("peak_bytes", "time_s", "ttft_s", "decode_token_s")


def headline(diff: PlanDiff) -> str:
    """The comparison in one sentence, for a reviewer who reads no further: B's worst-stage
    peak, step and (serving) first-token and per-token latencies against A's, and whether
    each fits ("B against A: worst-stage peak unchanged at 38.4 GiB, step time −3.3%
    (9.16 s → 8.86 s); both fit")."""
    said = []
    by_metric = {d.metric: d for d in diff.summary}
    # steps that do different work: their times do not compare, their throughput does
    timed = "time_s" in by_metric and by_metric["time_s"].verdict != "n/a"
    # (the whole job's rate, or per GPU where the plans' GPUs differ: the one with a verdict)
    rates = ("tokens_per_s", "tokens_per_s_per_gpu")
    headline_metrics = _HEADLINE if timed else (*_HEADLINE, *rates)
    # on devices of other sizes the headroom moves apart from the peak (an audit: "peak
    # unchanged at 38.4 GiB; both fit" where the headroom fell from 41.2 to 1.56 GiB)
    peak, room = by_metric["peak_bytes"], by_metric["headroom_bytes"]
    if (peak.a or 0) + (room.a or 0) != (peak.b or 0) + (room.b or 0):
        headline_metrics = ("peak_bytes", "headroom_bytes", *headline_metrics[1:])
    for delta in diff.summary:
        if delta.metric not in headline_metrics or delta.verdict == "n/a":
            continue
        label, (_, relative) = _summary_label(diff, delta.metric), _change(delta)
        # a figure and its unit stay on one line where the sentence wraps; a move is
        # shown with the digits that tell A from B, a figure about the same by its change
        if delta.verdict != "same":
            a, b = (v.replace(" ", NBSP) for v in _pair(delta))
            said.append(f"{label} {relative} ({a} → {b})")
            continue
        b = _value(delta.unit, delta.b).replace(" ", NBSP)
        if delta.a == delta.b:
            said.append(f"{label} unchanged at {b}")
        else:  # under `NEGLIGIBLE`, yet moved: said, not called unchanged (an audit: +1 MiB)
            moved = _change(delta)[0].replace(" ", NBSP)
            said.append(f"{label} about the same at {b} ({moved})")
    return "B against A: " + ", ".join(said) + f"; {_fits(diff)}" if said else _fits(diff)


def _fits(diff: PlanDiff) -> str:
    a, b = diff.fits
    if a == b:
        return "both fit" if a else "neither fits"
    return "A fits, B does not" if a else "A does not fit, B fits"


# ------------------------------------------------------------------------------- table


def _table(title: str, first: str, second: str | None) -> Table:
    table = titled_table(title)
    # the name wraps (dots and spaces break "pipeline.forward (B only)") so that on a
    # narrow terminal the numbers keep their width instead of being cut short
    table.add_column(first, overflow="fold")
    if second is not None:
        table.add_column(second, no_wrap=True)
    for name in ("A", "B", "Δ", "Δ%"):
        table.add_column(name, justify="right", no_wrap=True)
    return table


def _cells(delta: Delta, marks: dict[str, str]) -> list[Text]:
    """A, B, Δ and Δ% in the verdict's colour, a ✓ or ✗ (`marks`) after Δ%."""
    absolute, relative = _change(delta)
    style = _STYLE[delta.verdict]
    mark = marks[delta.verdict]
    a, b = _pair(delta)
    return [
        Text(a),
        Text(b),
        Text(absolute, style=style),
        Text(relative + mark, style=style),
    ]


def _row_table(title: str, first: str, rows: tuple[Row, ...], marks: dict[str, str]) -> Table:
    """The rows that moved; the others are named after the table (`_unchanged`)."""
    table = _table(title, first, "")
    for i, row in enumerate(row for row in rows if row.changed):
        if i:
            table.add_section()
        name = _name(row)
        shown = [d for d in row.deltas if _shown(rows, d.metric)]
        for j, delta in enumerate(shown):
            label = Text(_label(delta.metric))
            table.add_row(Text(name if j == 0 else ""), label, *_cells(delta, marks))
    return table


def _words_whole(console: Console, table: Table, changes: list[tuple[str, str, str]]) -> bool:
    """Whether the plan changes' value columns, as rich lays them out, are each at least as
    wide as their longest word: at 52 columns they were given 7, and "gpt3-175b" read
    "gpt3-1" over "75b", "layernorm" "layern" over "orm" (a user audit). A word is
    counted at most as wide as the list's lines hold, past which it is broken in a table or
    a list alike (a capped 20 characters broke "llama3-8b-tp-loss-gathered" at 80 columns,
    which the list holds: a review). A rich without the private layout methods (`whole`)
    has the table listed instead."""
    from budget.render.table import laid_out

    try:
        given = laid_out(console, table)[2]
    except (AttributeError, TypeError):
        return False
    line = max(console.width - 5, 1)  # a listed value's lines, under their indent
    longest = [
        max(min(len(word), line) for row in changes for word in row[i].split() or [""])
        for i in (1, 2)
    ]
    return given[1] >= longest[0] and given[3] >= longest[1]


def _unchanged(rows: tuple[Row, ...], first: str, quote: Callable[[str], str]) -> str:
    """ "Unchanged phases: forward.embedding, loss." for the rows that did not move, or ""."""
    unchanged = [quote(_name(row)) for row in rows if not row.changed]
    if not unchanged:
        return ""
    what = plural(len(unchanged), first).split(" ", 1)[1]  # "stages", "phase"
    return f"Unchanged {what}: {', '.join(unchanged)}."


# the plan changes are of resolved values (`budget.diff.plan_changes`): a default that follows
# another key moves with it, which a reader took for a key neither file had (an audit:
# zero 1 → 3 listed parallel.fsdp – → 2 too)
RESOLVED = (
    "Values as budget resolves them: a key neither file writes is listed where its default "
    "follows a key that changed."
)


def _render_table(console: Console, a: Report, b: Report, diff: PlanDiff) -> None:
    # a degree and its count held together: at 80 columns "tp 8 × dp" ended a line and
    # "1" began the next (an audit)
    for side, report in (("A", a), ("B", b)):
        print_wrapped(console, f"{side}  {_title(report)}", "   ")
    if diff.identical:
        console.print()
        console.print("No differences: the plans resolve to the same configuration and budget.")
        return
    # held as every wrapped text is: rich breaks at a no-break space too, and "(1.11" ended
    # one line and "s → 1.21 s)" began the next at 80 columns (an audit)
    print_wrapped(console, headline(diff) + ".", indent="")
    console.print()
    if diff.changes:
        table = titled_table("Plan changes")
        table.add_column("key", no_wrap=True)
        table.add_column("A", justify="right")
        table.add_column("", no_wrap=True)
        table.add_column("B", justify="left")
        changes = shown_changes(diff.changes)
        for key, was, now in changes:
            # as text, not markup: [tp, cp, dp] and names with brackets; each wrapped between
            # words, a key's lines under its first (rich cut a transition's key to
            # "transitions[log-softmax (fp32) kept for the backward, beside the .float(…" at
            # 80 columns and a source to "(togethercomputer/tog…", an audit), a figure by its
            # unit, and a word wider than its cell broken, not cut
            table.add_row(Hanging(key, 0, 2), Hanging(was, 0, 0), "→", Hanging(now, 0, 0))
        if not whole(console, table):  # the keys as narrow as their longest word, no more
            keys = [key for key, _, _ in changes]
            table.columns[0].width = 2 + max(len(word) for key in keys for word in key.split())
        if _words_whole(console, table, changes):
            console.print(table)
        else:  # too narrow for three columns: a line a key, its values after it
            console.print("Plan changes", style="table.title")
            console.print()
            for key, was, now in changes:
                print_wrapped(
                    console, Text.assemble((key, "bold"), f"  {was} → {now}"), "     ", " "
                )
            console.print()
        console.print(RESOLVED, highlight=False)  # at the terminal's width, not the table's
    else:
        console.print("Plan changes: none (the budgets differ only through defaults or files).")
    console.print()
    marks = _PLAIN_MARK if utf(console.file) else _ASCII_MARK
    summary = _table(f"{_time_title(diff)} and worst stage ({_fits(diff)})", "figure", None)
    for delta in diff.summary:
        summary.add_row(Text(_summary_label(diff, delta.metric)), *_cells(delta, marks))
    console.print(printable(console, summary))  # figures whole: one blank apart, or records
    if diff.note:
        console.print()
        console.print(Text(diff.note, style="yellow"))
    for title, first, rows in (
        ("Memory per rank of each pipeline stage, at its peak", "stage", diff.stages),
        (_phases_title(a, b), "phase", diff.phases),
    ):
        console.print()
        # what moved, as in markdown: rows of zeros buried the few that changed (a user
        # audit: one overlap flag gave 60 phase rows, 5 of them not zero), and a table of
        # nothing but zeros wrapped its title to its own width
        if not any(row.changed for row in rows):
            console.print(Text(f"{title}: no {first} changed."))
            console.print()  # the space a table leaves under its last row
            continue
        console.print(printable(console, _row_table(title, first, rows, marks)))
        if unchanged := _unchanged(rows, first, str):
            console.print(Text(unchanged))
            console.print()
    console.print(
        Text.assemble(
            "Δ = B − A; ",
            ("✓", "green"),
            " is better, ",
            ("✗", "red"),
            f" is worse ({BETTER})",
        )
    )


# which way is better, said under the table and the markdown alike (a markdown audit, m517:
# the markdown's legend left it out)
BETTER = "less memory and time, more headroom, tokens/s and MFU are better"


def shown_changes(changes: Sequence[Change]) -> list[tuple[str, str, str]]:
    """(key, A, B) rows of the plan changes, as a plan spells them; a transition one side
    has whole and the other lacks is one row under its name that reads as the plan's line
    would ("transitions[logits-gather]", "–", "tp shard(1) → replicate, [8192, 128256]
    bf16, in loss, ..."), not a row per key (a user audit: three added transitions took 27
    rows). Keys group by the name parsed whole: "a" is no "a].b"."""
    whole: dict[str, dict[str, Change]] = {}
    prefixes = []
    for c in changes:
        match = TRANSITION_KEY.fullmatch(c.key)
        prefixes.append(f"transitions[{match[1]}]" if match else "")
        if match:
            whole.setdefault(prefixes[-1], {})[match[2]] = c
    one_sided = {
        prefix
        for prefix, keys in whole.items()
        if "name" in keys
        and (all(c.a is None for c in keys.values()) or all(c.b is None for c in keys.values()))
    }
    rows: list[tuple[str, str, str]] = []
    for c, prefix in zip(changes, prefixes, strict=True):
        if prefix not in one_sided:
            rows.append((c.key, *plan_values(c.key, c.a, c.b)))
            continue
        if not c.key.endswith(".name"):
            continue  # said in the transition's one row
        added = c.a is None
        line = _transition_line(prefix, whole[prefix], added)
        rows.append((prefix, "–" if added else line, line if added else "–"))
    return rows


def _transition_line(prefix: str, keys: dict[str, Change], added: bool) -> str:
    """One transition's keys on the side that has it, as one line (`shown_changes`); its
    name is the row's key."""

    def value(key: str) -> str:
        change = keys.get(key)
        side = None if change is None else (change.b if added else change.a)
        return plan_value(f"{prefix}.{key}", side)

    said = ("name", "group", "from", "to", "tensor.shape", "tensor.dtype", "phase")
    rest = "".join(f", {key} {value(key)}" for key in keys if key not in said)
    # in words, not an arrow, which read as the table's own A → B (an audit, m529:
    # "tp shard(1) →  →  –" where the line wrapped)
    return (
        f"{value('group')} from {value('from')} to {value('to')}, "
        f"{value('tensor.shape')} {value('tensor.dtype')}, in {value('phase')}{rest}"
    )


# ---------------------------------------------------------------------------- markdown


def _md(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _md_cells(delta: Delta) -> list[str]:
    absolute, relative = _change(delta)
    mark = _MARK[delta.verdict]
    return [*_pair(delta), mark + absolute, relative]


def _file_names(a: str, b: str) -> tuple[str, str]:
    """Two plans of one name told apart by their files: the base names where they differ,
    else the paths (a variant copied from a plan keeps its ``name:``, an audit)."""
    short = (PurePath(a).name, PurePath(b).name)
    return short if short[0] != short[1] else (a, b)


def diff_markdown(a: Report, b: Report, diff: PlanDiff) -> str:
    """The comparison as GitHub-flavoured markdown tables (🟢 ✓ better, 🔴 ✗ worse)."""
    names = (a.name, b.name) if a.name != b.name else _file_names(a.file, b.file)
    lines = [
        f"## budget diff: {plain(names[0])} → {plain(names[1])}",
        "",
        f"- A: {code(_title(a))}",
        f"- B: {code(_title(b))}",
    ]
    lines.append("")
    if not diff.identical:
        lines += [f"**{plain(headline(diff).replace(NBSP, ' '))}.**", ""]
    if diff.identical:
        lines += ["No differences: the plans resolve to the same configuration and budget.", ""]
        return "\n".join(lines)
    lines += ["### Plan changes", ""]
    if diff.changes:
        lines += [_md(["key", "A", "B"]), "| --- | --- | --- |"]
        lines += [
            # a key names a transition as its author typed it, backticks and all (an audit)
            _md([code(key), plain(was), plain(now)])
            for key, was, now in shown_changes(diff.changes)
        ]
        lines += ["", RESOLVED]
    else:
        lines.append("None (the budgets differ only through defaults or files).")
    lines += ["", f"### {_time_title(diff)} and worst stage ({_fits(diff)})", ""]
    lines += [_md(["figure", "A", "B", "Δ", "Δ%"]), "| --- | ---: | ---: | ---: | ---: |"]
    lines += [_md([_summary_label(diff, d.metric), *_md_cells(d)]) for d in diff.summary]
    lines.append("")
    if diff.note:
        # its collectives' names are the plan's, escaped as the report's tables escape them
        # (an audit: a transition named "<bos> logits *fp32*" lost a word and turned italic)
        lines += [f"> {plain(diff.note)}.", ""]
    for title, first, rows in (
        ("Memory per rank of each pipeline stage, at its peak", "stage", diff.stages),
        (_phases_title(a, b), "phase", diff.phases),
    ):
        lines += [f"### {title}", ""]
        # a pull request's comment keeps what moved, as the terminal does; JSON keeps every row
        changed = [row for row in rows if row.changed]
        if not changed:
            lines += [f"No {first} changed.", ""]
            continue
        lines += [_md([first, "figure", "A", "B", "Δ", "Δ%"])]
        lines.append("| --- | --- | ---: | ---: | ---: | ---: |")
        for row in changed:
            name = _name(row)
            shown = [d for d in row.deltas if _shown(rows, d.metric)]
            for j, delta in enumerate(shown):
                # the phase's name as code, the side it exists on alone after it (an audit:
                # "`forward.embedding (A only)`" read as a phase of that name)
                side = name[len(row.key) :]
                label = f"`{row.key}`{side}" if first == "phase" else name
                label = label if j == 0 else ""
                lines.append(_md([label, _label(delta.metric), *_md_cells(delta)]))
        lines.append("")
        if unchanged := _unchanged(rows, first, code if first == "phase" else plain):
            lines += [unchanged, ""]
    lines.append(f"Δ = B − A; 🟢 ✓ better, 🔴 ✗ worse ({BETTER}).")
    return "\n".join(lines) + "\n"
