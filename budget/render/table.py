"""The terminal report: a header, memory per stage, phases, collectives and a verdict.

Narrow terminals (under 110 columns) get fewer, wider columns rather than wrapped numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from budget.collectives import Op, default_algorithm
from budget.phases import CARRIED_ACTIVATIONS, HELD_THROUGH
from budget.render import NBSP, Hanging, preset_said, print_wrapped, stage_layers, utf
from budget.report import (
    RAMP_HEADER,
    calls_scope,
    group_name,
    phase_scope,
    ramp_note,
    ramp_shares,
    run_scope,
    slow_link_notes,
)
from budget.units import (
    format_amount,
    format_bytes,
    format_count,
    format_duration,
    format_flops,
    format_rate,
    format_share,
    plural,
)

if TYPE_CHECKING:
    from rich.console import ConsoleOptions, RenderableType
    from rich.style import StyleType

    from budget.report import CollectiveRow, Overlapping, Report, StageRow

WIDE = 110
NARROW_BAR = 80  # the narrow stage table is ~71 columns; a 5-cell fill bar fits from 80
_RESIDENT = {"params", "grads", "optimizer", "reserved"}


def _b(n: int) -> str:
    return format_bytes(n)


def _count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.2f}"


def header(report: Report) -> list[str]:
    lay, m = report.layout, report.model
    degrees = " × ".join(
        f"{k} {lay[k]}" for k in ("tp", "cp", "pp", "dp") if lay[k] > 1 or k == "dp"
    )
    etp = lay.get("etp")
    if lay["ep"] > 1 or (etp is not None and etp != lay["tp"]):
        split = f"ep {lay['ep']} × etp {etp}" if etp != lay["tp"] else f"ep {lay['ep']}"
        degrees += f" (experts over {split} within tp × cp × dp)"
    schedule = f"{lay['schedule']} schedule" if lay["pp"] > 1 else "no pipeline"
    fsdp = lay.get("fsdp")
    bucket = lay.get("reduce_bucket")
    how = [f"PyTorch FSDP{fsdp}"] if fsdp else []
    how += ["a unit per layer"] if lay.get("fsdp_unit") == "layer" else []
    how += (
        ["kept gathered from forward to backward"]
        if lay.get("reshard_after_forward") is False
        else []
    )
    how += ["embedding and head units apart"] if lay.get("fsdp_root") == "split" else []
    shard = lay.get("dp_shard")
    if shard:
        copies = lay["dp"] // shard
        # the shard group spans cp too, as the memory rows and the legend say (a review)
        over = f"dp_shard {shard} × cp {lay['cp']}" if lay["cp"] > 1 else f"dp_shard {shard}"
        how += [f"hybrid sharding over {over}, {copies} copies"]
    zero = f"ZeRO stage {lay['zero']}" + (f" ({', '.join(how)})" if how else "")
    zero += f" (DeepSpeed's gradient buffer of {bucket:,} elements)" if bucket else ""
    # ZeRO shards over dp x cp, and expert states over the expert data-parallel ranks
    expert_dp = 1 if etp is None else lay["tp"] * lay["cp"] * lay["dp"] // (lay["ep"] * etp)
    if lay["zero"] and lay["dp"] * lay["cp"] == 1 and expert_dp == 1:
        zero += " (one data-parallel rank: nothing to shard)"
    extras = [zero, schedule]
    if lay["virtual_stages"] > 1:
        extras.append(f"{lay['virtual_stages']} virtual stages")
    if lay.get("tp_style") == "dtensor" and lay["tp"] > 1:
        extras.append("tensor parallel as DTensor's styles")
    if lay["sequence_parallel"]:
        extras.append("sequence parallel")
    elif lay.get("scatter_gather") and lay["tp"] > 1 and lay["pp"] > 1:
        extras.append("scatter/gather stage sends")
    stops = " (non-reentrant, stopping early)" if lay.get("recompute_early_stop") else ""
    extras.append(f"recompute: {lay['recompute']}{stops}")
    if lay.get("defer_embedding_wgrad"):
        deferred = plural(lay["defer_embedding_wgrad"], "micro-batch", "micro-batches")
        extras.append(f"output-layer weight gradients of {deferred} deferred to the drain")
    if lay.get("loss") in ("pytorch", "pytorch-gathered"):
        kind = " (loss_parallel)" if lay["loss"] == "pytorch" else " (logits gathered)"
        extras.append("loss: PyTorch's cross-entropy" + (kind if lay["tp"] > 1 else ""))
    batches = report.microbatches
    work = f"{plural(batches, 'micro-batch', 'micro-batches')} per step"
    if report.mode != "train":
        extras = ["sequence parallel"] if lay["sequence_parallel"] else []
        work = (
            f"{plural(lay['sequences'], 'sequence')} × ({lay['prompt']:,} prompt + "
            f"{lay['generate']:,} generated tokens)"
        )
    return [
        f"{report.name} · {report.mode} · {plural(report.world_size, 'GPU')}"
        f"{topology_name(report)} = {degrees}",
        f"model: {format_count(m['params_total'])} parameters{_mtp(m)}{_active(m)} "
        f"({plural(m['layers'], 'layer')}, hidden {m['hidden']}, {_heads(m)}, {_ffn(m)}, "
        f"vocab {m['vocab']:,}{_window(m)})",
        f"layout: {'; '.join([*extras, work])}",
        f"device: {_device_name(report.device)}{_b(report.capacity_bytes)} per GPU, "
        f"{_b(report.device['reserved_bytes'])} of it reserved (1 GiB = 2^30 B); "
        + (f"{_derates(report)}; " if report.step["time_s"] is not None else "")
        + _attention_text(report.device, report.mode, _core_head_dim(report.model)),
    ]


def _device_name(device: dict[str, Any]) -> str:
    """ "h100-sxm, ", with the keys the plan writes over the preset's figures ("h100-sxm (the
    plan's flops), "); nothing for a device written out."""
    if not device.get("name"):
        return ""
    return f"{preset_said(device['name'], device.get('overrides') or ())}, "


def _derates(report: Report) -> str:
    """The roofline's derates: what share of the peak GEMMs reach and of the bandwidth
    streaming kernels reach (a preset's measured curve, or a written device's flat
    fractions, its 0.8 defaults included), and the peak and the bandwidth themselves, which
    a plan may write over its preset's (a user audit, m434: nothing said 835 TFLOP/s)."""
    device = report.device
    gemm, memory = device["matmul_ceiling"], device["memory_efficiency"]
    reach = "up to" if device["matmul_by_size"] else "at"
    fmt = report.matmul_format
    peak = (device.get("flops") or {}).get(fmt)
    of_peak = f"the {format_flops(peak)} {fmt} peak" if peak else "peak"
    bandwidth = device.get("memory_bandwidth_Bps")
    its = f"its {format_rate(bandwidth)}" if bandwidth else "its bandwidth"
    return f"GEMMs {reach} {gemm:.1%} of {of_peak}, memory at {memory:.1%} of {its}"


def _active(model: dict[str, Any]) -> str:
    """', 12.88 billion active per token' for an MoE model, or nothing."""
    if model.get("experts") is None:
        return ""
    return f", {format_count(model['params_active'])} active per token"


def _ffn(model: dict[str, Any]) -> str:
    """'ffn 28672'; for an MoE model 'ffn 10944 in 1 dense layer, 27 MoE layers of 64
    experts of ffn 1408 (top 6, shared ffn 2816)', the dense width only where a layer has it."""
    e = model.get("experts")
    if e is None:
        return f"ffn {model['ffn']}"
    dense = model["layers"] - e["moe_layers"]
    shared = f", shared ffn {e['shared_ffn']}" if e["shared_ffn"] else ""
    skew = e.get("imbalance", 1.0)
    busiest = f", busiest ep rank {skew:g}× the even share" if skew > 1 else ""
    capacity = e.get("capacity_factor")
    # grouped by thousands, as the header's other counts (not 1e+06)
    capped = (
        f", capacity factor {capacity:,.15g}{' padded' if e.get('pad_to_capacity') else ''}"
        if capacity is not None
        else ""
    )
    return (
        (f"ffn {model['ffn']} in {plural(dense, 'dense layer')}, " if dense else "")
        + f"{plural(e['moe_layers'], 'MoE layer')} of "
        + f"{e['count']} experts of ffn {e['ffn']} "
        + f"(top {e['top_k']}{shared}{capped}{busiest})"
    )


def _mtp(model: dict[str, Any]) -> str:
    """' + 11.61 billion in 1 multi-token prediction module', or nothing."""
    n = model.get("mtp_layers") or 0
    if not n:
        return ""
    modules = "module" if n == 1 else "modules"
    return f" + {format_count(model['mtp_params'])} in {n} multi-token prediction {modules}"


def _window(model: dict[str, Any]) -> str:
    """'; sliding window 4,096 on 21 of 42 layers', or nothing."""
    window = model.get("sliding_window")
    if not window:
        return ""
    layers = f"{window['sliding_layers']} of {model['layers']} layers"
    if window["sliding_layers"] == model["layers"]:
        layers = "every layer"
    return f"; sliding window {window['size']:,} on {layers}"


def _heads(model: dict[str, Any]) -> str:
    """'64 heads / 8 kv' ('32 heads of 128 / 8 kv' where a head is not hidden / heads
    wide), or the latent attention's ranks."""
    mla = model.get("mla")
    if not mla:
        wide = model["head_dim"] * model["heads"] != model["hidden"]
        width = f" of {model['head_dim']}" if wide else ""
        return f"{model['heads']} heads{width} / {model['kv_heads']} kv"
    query = f" and query latent {mla['q_rank']}" if mla["q_rank"] else ""
    return (
        f"{model['heads']} heads, MLA with kv latent {mla['kv_rank']} + {mla['rope_dim']} "
        f"rotary{query}"
    )


def _core_head_dim(model: dict[str, Any]) -> int:
    """The head dimension the attention core's query and key run at: latent attention's
    nope + rope, else the model's head_dim."""
    mla = model.get("mla")
    return int(mla["nope_dim"] + mla["rope_dim"]) if mla else int(model["head_dim"])


def _attention_text(device: dict[str, Any], mode: str, head_dim: int) -> str:
    """How the attention core is timed: the kernel and its share of the peak, and the head
    dimension it was measured at where the model's differs (an audit, m536: a head dim of 64
    read "(measured)" at the rate measured at 128, which the FlashAttention-3 paper puts
    0.69 as fast for cuDNN's forward)."""
    rate = ""
    if device.get("attention_fraction") is not None:
        keys = device.get("attention_keys")
        call = "call" if mode == "train" else "prefill call"
        rate = f"{device['attention_fraction']:.1%} of peak"
        # where the backward meets other lengths (`flops.backward_keys`), the keys are the
        # forward's, and the backward's are said after the causal share
        forward = ", its forward" if device.get("attention_backward_keys") else ""
        rate += f"{forward} at {plural(keys, 'key')} per {call}" if keys else ""
    kernel = device["attention"]
    text = attention_text(
        kernel,
        device.get("attention_kernel", kernel),
        device["attention_rate"],
        rate,
        written=not device.get("name"),
        held_at=device.get("attention_held_at"),
        keys=device.get("attention_keys"),
    )
    causal = device.get("attention_causal")
    if causal is not None and 0 < causal < 1:  # context parallelism (`flops.causal_share`)
        parts = round(1 / causal)
        share = f"1/{parts:,}" if math.isclose(parts * causal, 1) else f"{causal:.1%}"
        text += f"; {share} of the calls' work under the causal mask, the rest unmasked"
        unmasked = device.get("attention_unmasked_keys")
        if unmasked and unmasked != device.get("attention_keys"):
            text += f" at {plural(unmasked, 'key')}"
    backward = device.get("attention_backward_keys")
    if backward:
        text += f"; its backward at {plural(backward, 'key')} a call"
    measured = device.get("attention_head_dim")
    if measured and measured != head_dim:
        text += f"; measured at head dim {measured}, where this model's is {head_dim}"
    if device.get("attention_window_fraction") is None:
        return text
    window = f"; sliding layers at {device['attention_window_fraction']:.1%}"
    window += f" at {plural(device['attention_window_keys'], 'key')}"
    held = device.get("attention_window_held_at")
    return text + window + (f" (the rate at {plural(held, 'key')}, held there)" if held else "")


def attention_text(
    kernel: str,
    runs: str,
    source: str,
    rate: str,
    written: bool = False,
    held_at: int | None = None,
    keys: int | None = None,
) -> str:
    """``attention: …`` as the report header and `budget search` say it: the kernel the plan
    names (and what it runs as here), then ``rate`` and where it comes from (``source``:
    eager, gemm, plan, measured or derived, `Device.attention_source`). ``written``: the
    plan writes its device out, so nothing about it was measured; ``held_at``: the
    measured length the rate is carried from to the plan's ``keys`` per call, which says
    which way it leans (a shorter call runs a kernel at a lower share of its peak: a user
    audit read "held there" as exact)."""
    name = kernel if runs == kernel else f"{kernel} = {runs}"
    held = f" at {plural(held_at, 'key')} and held there" if held_at else ""
    if held_at and keys and keys != held_at:
        lean = (
            "a shorter call likely runs slower" if keys < held_at else "a longer one likely faster"
        )
        held += f"; {lean}"
    gemm = (
        "like a GEMM at the written device's matmul efficiency (no rate given: set "
        "device.attention_efficiency, or name a device preset for measured rates)"
        if written
        else "on the GEMM curve (not measured on this device)"
    )
    return {
        "eager": "attention: eager (two GEMMs and a softmax)",
        "gemm": f"attention: {name} {gemm}",
        "plan": f"attention: {name} at {rate} (device.attention_efficiency)",
        "measured": f"attention: {name} at {rate} (measured{held})",
        "derived": f"attention: {name} at {rate} (derived from another kernel's measurement{held})",
    }[source]


# the fill bar's full and empty cells; a console that is not UTF-8 takes the ASCII pair, where
# it would show ? for both
BAR_MARKS, ASCII_BAR_MARKS = "█·", "#."


def _bar(row: StageRow, width: int = 8, marks: str = BAR_MARKS) -> Text:
    """A stage's peak as a share of its memory in `width` cells: each full cell a whole
    1/width of it (rounded down, so only a stage at its capacity fills the bar), and a "!"
    after them where the peak is over capacity. An audit: rounded to the nearest cell, a
    stage 2.25 GiB over its memory and one with 7.86 GiB free drew the same full bar, told
    apart only by a colour that a log or a pipe does not keep."""
    peak, capacity = row.peak_bytes, row.capacity_bytes
    over = peak > capacity
    cells = min(width, peak * width // capacity) if capacity > 0 else width
    style = "red" if over else "yellow" if 10 * peak > 9 * capacity else "green"
    return Text(marks[0] * cells + marks[1] * (width - cells) + "!" * over, style=style)


class ParsedTable(Table):
    """rich's table with each text cell's markup parsed once, as it is added: rich parses a
    `str` cell again each time it measures or prints it (three or four times a report, as
    `fitted` tries its columns), a tenth of what printing GPT-3 175B's tables cost. A cell
    reads as the console would read it (markup and emoji codes, as `Console.render_str`)."""

    def add_row(
        self,
        *renderables: RenderableType | None,
        style: StyleType | None = None,
        end_section: bool = False,
    ) -> None:
        parsed = (Text.from_markup(r) if isinstance(r, str) else r for r in renderables)
        super().add_row(*parsed, style=style, end_section=end_section)

    _laid: tuple[tuple[object, ...], list[int]] | None = None

    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        """rich's widths for the columns at `options`' width, kept for the next call with the
        same table, console and width: `whole` lays a table out before it is printed, and
        printing laid it out again, measuring every cell a second time (a fifth of what
        rendering GPT-3 175B's report cost). What lays a table out is in the key: its
        settings, and its columns' with their headings and cells, each cell the object it
        holds (a row added, a cell or a heading replaced; a review, m506: a heading renamed
        after `whole` printed cut). A cell's text changed in place is not: no renderer here
        edits a cell once it is laid out."""
        key = (
            console,
            options.max_width,
            self.padding,
            self.collapse_padding,
            self.pad_edge,
            self.show_edge,
            self.show_header,
            self.show_footer,
            self.box,
            self.expand,
            self.min_width,
            tuple(
                (c.width, c.min_width, c.max_width, c.ratio, c.no_wrap, c.header, c.footer)
                for c in self.columns
            ),
            tuple(tuple(c._cells) for c in self.columns),
        )
        if self._laid is not None and self._laid[0] == key:
            return list(self._laid[1])
        widths = super()._calculate_column_widths(console, options)
        self._laid = (key, list(widths))
        return widths


def titled_table(title: str, compact: bool = False) -> Table:
    """The house style of every table: title on the left, a rule under the head, no outer
    padding; `compact`, no padding at all, the columns one blank apart (`BROKEN`)."""
    return ParsedTable(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        padding=(0, 0) if compact else (0, 1),
    )


def fitted(
    console: Console,
    build: Callable[[list[str]], Table],
    columns: list[str],
    droppable: list[str],
    squeeze_first: tuple[str, ...] = (),
) -> list[str]:
    """`columns` less the fewest of `droppable`, dropped in its order, that the terminal must
    lose for the table `build` makes of them to print whole: where a table is wider than
    the terminal, rich cuts a column that does not wrap to "…", or to nothing (an audit, at
    80 columns: a serving plan's decode compute "712,039…", its rule column "[1"), `whole`
    says; where even every droppable column gone leaves it too wide, the fewest again with
    no padding between the columns (`squeezed`: at 44 columns the phases table cut its
    exposed times to "51.2 …", an audit), else all of them; a column of `squeeze_first` is
    kept squeezed before it is dropped (`fitted_table`)."""
    return fitted_table(console, build, columns, droppable, squeeze_first)[0]


def fitted_table(
    console: Console,
    build: Callable[[list[str]], Table],
    columns: list[str],
    droppable: list[str],
    squeeze_first: tuple[str, ...] = (),
) -> tuple[list[str], Table]:
    """`fitted`'s columns and the table `build` makes of them, squeezed where it must be:
    the table measured last, not built and measured again (measuring a table's cells is
    most of what printing a report costs: the collectives table of GPT-3 175B, 34 rows,
    took 45 ms a measure). Every column set of the squeezed round was measured whole, and
    cut, in the first: its tables lose their padding unmeasured. A column of
    `squeeze_first` is dropped only once the columns before it, squeezed, do not fit
    either (the collectives' exposed time: a hybrid-sharded plan's "dp_replicate 16" left
    it out at 80 columns, two columns short, where its padding was nine)."""
    for squeeze in (False, True):
        kept = list(columns)
        for name in [None, *droppable]:
            if not squeeze and name in squeeze_first and name in kept:
                table = build(kept)
                table.padding = (0, 0)
                if whole(console, table):
                    return kept, table
            if name in kept:
                kept.remove(name)
            table = build(kept)
            if squeeze:
                table.padding = (0, 0)
            if whole(console, table):
                return kept, table
    return list(columns), stacked(build(list(columns)))  # no column set prints whole


def squeezed(console: Console, table: Table) -> Table:
    """`table` with no padding between its columns, one blank of its box apart, where it does
    not print whole (`whole`) with it."""
    if not whole(console, table):
        table.padding = (0, 0)
    return table


def printable(console: Console, table: Table) -> Table:
    """`table` as it prints whole at the terminal's width: as it is, squeezed, or else as
    records (`stacked`)."""
    table = squeezed(console, table)
    return table if whole(console, table) else stacked(table)


def _plain(cell: object) -> Text:
    """A cell's text with its styles, less the blanks it ends with."""
    if isinstance(cell, Hanging):
        cell = cell.text
    text = cell.copy() if isinstance(cell, Text) else Text.from_markup(str(cell or ""))
    text.rstrip()
    return text


def stacked(table: Table) -> Table:
    """`table` as records, one a row, where no set of its columns prints whole at the
    terminal's width (an audit: from 40 to 58 columns the collectives table was cropped at
    its right edge, "1,152 calls" read "1", and the phases' and a diff's figures were cut to
    "51.2 …" and "1.71 …"): each row's first cell, and under it every other column's header
    and cell, side by side where they fit, wrapped between them and never inside one. A row
    of its first cell alone (a phase's heading) stays a heading."""
    from rich.console import Group

    out = Table(
        title=table.title,
        title_justify=table.title_justify,
        caption=table.caption,
        caption_justify=table.caption_justify,
        box=None,
        show_header=False,
        pad_edge=False,
        padding=(0, 0),
    )
    out.add_column()
    heads = [_plain(c.header).plain.replace("\n", " ") for c in table.columns]
    for cells in zip(*(list(c.cells) for c in table.columns), strict=True):
        texts = [_plain(cell) for cell in cells]
        fields = [
            Text(f"{head} ".replace(" ", NBSP) if head else "") + text  # a label column's
            for head, text in zip(heads[1:], texts[1:], strict=True)  # own text alone
            if text.plain.strip()
        ]
        for field in fields:  # a figure and its unit, a name's words: one piece
            field.plain = field.plain.replace(" ", NBSP).replace("\n", NBSP)
        if not fields:
            out.add_row(texts[0])
            continue
        record = Hanging(Text("   ").join(fields), 2, 2)  # wrapped at its blanks alone
        # a row that continues the one above it (a diff's next figure) has no heading; a
        # number alone is named by its column ("stage 0")
        lead = texts[0]
        if lead.plain.isdigit():
            lead = Text(f"{heads[0]} ") + lead
        # folded, not cut: rich ended a wrapped line of wide characters (CJK, emoji) that
        # filled the column with "…" (a review)
        lead.overflow = "fold"
        out.add_row(Group(lead, record) if lead.plain.strip() else record)
    return out


def whole(console: Console, table: Table) -> bool:
    """Whether `table` prints at the terminal's width with no cell cut, as rich lays it out
    (`Table._calculate_column_widths`): each column at least as wide as its widest cell if
    it does not wrap, else as its longest word (`Table._measure_column`), and the table no
    wider than the terminal, less a right edge of blanks, which the console crops where a
    column's min_width holds the table one cell too wide (every plan's collectives table at
    110 columns: cropped, nothing is lost). These are rich's own private methods (13 to 15):
    should a later rich lack them, the table's unbounded width against the terminal's,
    which rich's public `Measurement` gives, decides instead."""
    from budget.render.standins import for_console

    table = for_console(console, table)  # as it prints: "α" as "alpha" is 4 columns wider
    free = console.options.update_width(2**16)
    try:
        extra, needs, given = laid_out(console, table)
    except (AttributeError, TypeError):  # a rich without these internals
        from rich.measure import Measurement

        return Measurement.get(console, free, table).maximum <= console.width
    rights = "".join(getattr(table.box, n) for n in dir(table.box) if n.endswith("right"))
    blank = table.box is not None and table.show_edge and not rights.strip()
    fits = sum(given) + extra - (1 if blank else 0) <= console.width
    return fits and all(g >= n for g, n in zip(given, needs, strict=True))


def laid_out(console: Console, table: Table) -> tuple[int, list[int], list[int]]:
    """The table's edges and padding, the width each column needs whole (its widest cell if
    it does not wrap, else its longest word) and the widths rich gives them at the
    terminal's width, from rich's private layout methods.

    The columns are measured once, as rich lays them out: a column's measure at the
    terminal's width is its measure unbounded unless the width cut it (rich's cells measure
    alike at any width and are then held to it, `Measurement.with_maximum`), and only such a
    column is measured again unbounded. Measuring is most of what printing costs, and every
    printed table was measured three times (the GPT-3 report: 68 ms to render warm)."""
    extra: int = table._extra_width
    width = console.width - extra
    seen: dict[int, Any] = {}
    measure = table._measure_column

    def remembered(console: Console, options: Any, column: Any) -> Any:
        measured = measure(console, options, column)
        # the first, at the terminal's width; rich measures a table too wide again at the
        # narrower widths it gives each column
        seen.setdefault(column._index, measured)
        return measured

    table._measure_column = remembered  # type: ignore[method-assign]
    try:
        given = table._calculate_column_widths(console, console.options.update_width(width))
    finally:
        del table._measure_column  # the class's own again
    free = console.options.update_width(2**16)
    needs = []
    for column in table.columns:
        m = seen.get(column._index)
        if m is None or m.maximum >= width:  # cut to the terminal, or not measured
            m = measure(console, free, column)
        needs.append(m.maximum if column.no_wrap else m.minimum)
    return extra, needs, list(given)


def left_out(names: list[str]) -> str:
    """The note under a table that `fitted` dropped `names` from."""
    listed = " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} left out at this width (see -f json)"


def _num(table: Table, header: str, **kw: object) -> None:
    table.add_column(header, justify="right", no_wrap=True, **kw)  # type: ignore[arg-type]


def _columns(report: Report, wide: bool) -> list[tuple[str, Callable[[StageRow], int]]]:
    """The memory columns of the stage table. Categories no stage holds (gradients when
    serving, a KV cache when training) are left out; narrow tables fold model states and
    the runtime's memory into one column each."""

    def held(key: str) -> bool:
        return any(getattr(r, key) for r in report.stages)

    def field(key: str) -> Callable[[StageRow], int]:
        return lambda r: int(getattr(r, key))

    if wide:
        keys = ("params", "grads", "optimizer", "activations", "kv_cache", "transient")
        return [
            (k.replace("kv_cache", "KV cache"), field(f"{k}_bytes"))
            for k in keys
            if k in ("params", "transient") or held(f"{k}_bytes")
        ]
    columns: list[tuple[str, Callable[[StageRow], int]]] = [
        ("states", lambda r: r.params_bytes + r.grads_bytes + r.optimizer_bytes)
    ]
    columns += [
        (name, field(key))
        for name, key in (("activations", "activations_bytes"), ("KV cache", "kv_cache_bytes"))
        if held(key)
    ]
    columns.append(("other", lambda r: r.transient_bytes + r.reserved_bytes))
    return columns


# the stage and links tables' headers broken onto two lines where a narrow terminal would cut
# a figure under them (`compact`): at 64 columns the stage table printed "17.7 G…" under
# "sta…" and "in flig…", the links table "231.6 GB…" under "share at 16 · 64 · 256 M…" (an
# audit); a header no wider than its figures lets every figure print whole
BROKEN = {
    "in flight": "in\nflight",
    "activations": "activ-\nations",
    "KV cache": "KV\ncache",
    "optimizer": "opti-\nmizer",
    "transient": "tran-\nsient",
    "headroom": "head-\nroom",
    "α per step": "α per\nstep",
    RAMP_HEADER: RAMP_HEADER.replace(" 16", "\n16"),
}
# the parts a stage table too wide for the terminal even compact is split into (`stage_tables`):
# its peak and headroom, and what the peak holds
STAGE_PARTS = ("peak", "held")


def stage_tables(console: Console, report: Report, wide: bool, marks: str) -> list[Table]:
    """The stage table at the console's width: the longest fill bar it has room for (at
    110 columns a plan's 8 cells were cut to "███···…"); where it is too wide, its headers
    on two lines (`BROKEN`), then no padding either; where it is too wide even so (44
    columns), split in two tables (`STAGE_PARTS`), each stage on a row of each: never a
    figure cut, which rich does to a column that does not wrap (an audit: at 64 columns
    every byte figure read "17.7 G…")."""
    most = 8 if wide else 5 if console.width >= NARROW_BAR else 0
    bars = [n for n in (8, 5) if n <= most] + [0]
    one: tuple[str | None, ...] = (None,)
    for parts, compact in ((one, 0), (one, 1), (one, 2), (STAGE_PARTS, 1), (STAGE_PARTS, 2)):
        for bar in bars:
            tables = [stage_table(report, wide, bar, marks, compact, part) for part in parts]
            if all(whole(console, table) for table in tables):
                return tables
    return [stage_table(report, wide, 0, marks, 2, part) for part in STAGE_PARTS]


def stage_table(
    report: Report,
    wide: bool,
    bar: int | None = None,
    marks: str = BAR_MARKS,
    compact: int = 0,
    part: str | None = None,
) -> Table:
    """Memory per stage; `bar` cells of fill gauge (default 8 when wide, none when narrow);
    `compact` 1, its headers on two lines (`BROKEN`), 2, with no padding either; `part`, one of
    `STAGE_PARTS` alone (the other's columns left out), the caption its columns' notes."""
    bar = (8 if wide else 0) if bar is None else bar
    peak, held = part in (None, "peak"), part in (None, "held")
    title = "Memory per rank of each pipeline stage, at its peak"
    table = titled_table(title + (": what it holds" if part == "held" else ""), compact > 1)

    def num(name: str, **kw: object) -> None:
        _num(table, BROKEN.get(name, name) if compact else name, **kw)

    num("stage")
    if wide and held:
        num("layers")
    train = report.mode == "train"
    if train and peak:
        num("in flight")
    columns = _columns(report, wide) if held else []
    for name, _ in columns:
        num(name)
    if peak:
        num("peak", style="bold")
        num("headroom")
    bar = bar if peak else 0
    if bar:
        table.add_column("fill", no_wrap=True)
    for row in report.stages:
        cells = [str(row.stage)] + (
            [stage_layers(report, row.stage, row.layers)] if wide and held else []
        )
        cells += [_count(row.inflight)] if train and peak else []
        cells += [_b(value(row)) for _, value in columns]
        headroom = _b(row.headroom_bytes) if row.fits else f"[red]{_b(row.headroom_bytes)}[/]"
        cells += [_b(row.peak_bytes), headroom] if peak else []
        table.add_row(*cells, *([_bar(row, bar, marks)] if bar else []))
    # the plan's reserve, and Transformer Engine's userbuffers where overlap.tp has them
    # (`layers.te_userbuffers`), alike on every stage
    held_back = report.stages[0].reserved_bytes if report.stages else 0
    buffers = held_back - int(report.device["reserved_bytes"] or 0)
    reserved = _b(held_back).replace(" ", NBSP) + " reserved"  # kept by its unit
    if buffers > 0:
        plans = _b(held_back - buffers).replace(" ", NBSP)
        reserved += f" ({plans} the plan's, {_b(buffers).replace(' ', NBSP)} userbuffers)"
    states = "params + grads + optimizer" if train else "params"
    notes = []
    if held:
        notes.append(
            f"peak = the columns + {reserved} per GPU"
            if wide
            else f"states = {states}; other = transient + {reserved}"
        )
    layers = [row.layers for row in report.stages]
    if held and not wide and len(set(layers)) > 1:  # the layers column is left out: say it
        each = (stage_layers(report, row.stage, row.layers) for row in report.stages)
        notes.append(f"layers per stage: {', '.join(each)}")
    caption = "; ".join(notes)
    inflight = inflight_note(report) if peak else ""  # the count has no unit of its own
    if inflight:  # (an audit); the longer one on a line of its own
        caption += ("\n" if "whole stages" in inflight else "; " * bool(caption)) + inflight
    if held and fp8_memory_note(report):
        caption += "\n" + fp8_memory_note(report)
    table.caption = caption.lstrip("\n") or None
    table.caption_justify = "left"
    return table


def _largest(items: tuple[Overlapping, ...], limit: int) -> str:
    """The largest allocations at a peak besides the model states, whatever their kind: the
    memory a plan reserves is listed too (it is not a model state, and can be the largest)."""
    states = _RESIDENT - {"reserved"}
    shown = sorted((o for o in items if o.category not in states), key=lambda o: -o.bytes)
    return _listed(shown[:limit])


def _listed(items: list[Overlapping]) -> str:
    return "; ".join(
        f"{o.tensor}{f' ×{o.count}' if o.count > 1 else ''} {_b(o.bytes)}" for o in items
    )


def _brief(items: tuple[Overlapping, ...], limit: int = 2) -> str:
    """What a phase adds at its peak: its largest transients, else the largest activations
    it saves (not the activations earlier layers and micro-batches carried into it, which
    the step's `saved activations …` rows hold, nor a transient gathered before the phase
    and held through it: an audit read ZeRO-3's gathered embedding, a review its head
    gradients, as what every layer's phase added)."""
    transient = [o for o in items if o.category == "transient" and HELD_THROUGH not in o.tensor]
    added = [
        o
        for o in items
        if o.category not in _RESIDENT
        and not o.tensor.startswith(CARRIED_ACTIVATIONS)
        and HELD_THROUGH not in o.tensor
    ]
    return _listed((transient or added)[:limit])


# the phases table's columns a terminal too narrow for them loses first (`fitted`): the bytes
# and the communication time each phase's rows in the collectives table add up to, then
# the peak, which the stage table holds at its worst
PHASE_DROPPABLE = ["sent/rank", "comm", "peak live"]
PEAK_STAGE = "peak\nstage"
LARGEST = "largest it adds at that peak"


def phase_table(report: Report, wide: bool, console: Console | None = None) -> Table:
    """The phases of the step, each where it costs most; with a `console`, less the
    columns it has no room for (`PHASE_DROPPABLE`), which the caption names."""
    timed = report.step["time_s"] is not None
    columns = ["phase", "count"] + (["compute", "comm", "exposed"] if timed else [])
    columns += ["sent/rank", "peak live"] + ([PEAK_STAGE, LARGEST] if wide else [])
    rows: list[dict[str, Any]] = []
    for p in report.phases:
        cells: dict[str, Any] = {"phase": p.name, "count": f"{p.count:,}"}
        if timed:
            cells |= {"compute": _t(p.compute_s), "comm": _t(p.comm_s), "exposed": _t(p.exposed_s)}
        cells["sent/rank"] = _b(p.payload_bytes) if p.payload_bytes else "–"
        cells["peak live"] = "–" if p.peak_stage is None else _b(p.peak_bytes)
        if wide:
            cells[PEAK_STAGE] = "" if p.peak_stage is None else str(p.peak_stage)
            cells[LARGEST] = Hanging(_brief(p.peak_overlap, 1), 0, 0)
        rows.append(cells)
    total = (
        dict(
            zip(
                ["phase", "count", "compute", "comm", "exposed", "sent/rank"],
                step_cells(report),
                strict=True,
            )
        )
        if timed
        else None
    )

    def build(kept: list[str]) -> Table:
        return _phase_columns(report, kept, rows, total)

    kept, table = (
        (columns, build(columns))
        if console is None
        else fitted_table(console, build, columns, PHASE_DROPPABLE)
    )
    notes = [left_out([c for c in columns if c not in kept])] if kept != columns else []
    if not wide:  # a review: the column went without a word below 110 columns
        notes.append(f"{LARGEST}: each phase's at 110 columns or more, and in -f markdown")
    if not wide and len(report.stages) > 1 and "peak live" in kept:
        notes.append(_peak_stages(report))
    notes += [pacing_note(report), slowdown_note(report)]
    if "peak live" in kept:
        notes.append(no_peak_note(report))
    if any(notes):
        table.caption, table.caption_justify = "\n".join(n for n in notes if n), "left"
    return table


def no_peak_note(report: Report) -> str:
    """What a "–" in a phase's peak live means, where a phase shows one; "" where none does."""
    if not any(p.peak_stage is None for p in report.phases):
        return ""
    return (
        "– in peak live: the phase (an embedding lookup, a stage send) holds no more than "
        "the phase after it, so it has no peak of its own"
    )


def _phase_columns(
    report: Report, kept: list[str], rows: list[dict[str, Any]], total: dict[str, str] | None
) -> Table:
    """The phases table of the columns `kept`, its total row last where the step is timed."""
    table = titled_table(f"Phases of {run_scope(report)} ({phase_scope(report)})")
    for name in kept:
        if name == "phase":
            table.add_column(name, no_wrap=True)
        elif name == LARGEST:
            table.add_column(name, ratio=1)
        else:
            _num(table, name)
    for cells in rows:
        table.add_row(*(cells[name] for name in kept))
    if total is not None:
        table.add_section()
        table.add_row(*(total.get(name, "") for name in kept), style="bold")
    return table


def step_cells(report: Report) -> list[str]:
    """The phases table's total row up to its bytes: label, count, compute, communication,
    exposed and the bytes sent (summed only where the rows are one stage's)."""
    step, label = report.step, step_label(report)
    summed = label == "sum of rows"
    return [
        label,
        "",
        _t(step["compute_s"]),
        _t(step["comm_s"]),
        _t(step["exposed_comm_s"]),
        _b(sum(p.payload_bytes for p in report.phases)) if summed else "",
    ]


def slowdown_note(report: Report) -> str:
    """Where a phase after the micro-batches (the gradient reduction, the optimizer) hides
    collectives behind them, its compute holds the slowdown they cause there, not kernels
    of its own (an audit: ZeRO 2's dp.grads read 673 ms of compute it does not run); a
    sentence naming it, "" where none does."""
    from budget.schedule import per_microbatch

    parts = []
    for p in report.phases:
        slowed = p.slowdown_s or 0.0
        if per_microbatch(p.name) or slowed <= 0 or p.compute_s is None:
            continue
        whole = p.compute_s - slowed <= 1e-12 * p.compute_s
        parts.append(f"{p.name} {_t(slowed)}" + ("" if whole else f" of {_t(p.compute_s)}"))
    if not parts:
        return ""
    return (
        "compute of the phases after the micro-batches holds the slowdown their hidden "
        f"collectives cause in the compute beside them (overlap.slowdown): {', '.join(parts)}"
    )


def pacing_note(report: Report) -> str:
    """Where the phases table's last row is a pacing stage's (a plan of several stages), a
    sentence saying the rows above need not add up to it, and where it takes its reduction
    and optimizer from another stage than its micro-batches (an audit: "pacing stage 7"
    held stage 0's dp.grads), whose; "" for one stage."""
    step = report.step
    pacing, after = step.get("pacing_stage"), step.get("after_stage")
    optimizer = step.get("optimizer_stage", after)
    if pacing is None or len(report.stages) < 2:
        return ""
    # an audit: the rows above the pacing stage's totals were summed, 2.01 s of exposed
    # communication against the row's 1.97 s, with nothing saying they are not its phases
    whose = "that stage's phases"
    if after is not None and (after, optimizer) != (pacing, pacing):
        both = _deferred_on(report, after)
        reduction = f"the {_reduction(report, after, ' and ')} of stage {after}, which "
        reduction += "end latest" if both else "ends latest"
        if optimizer == after:
            reduction = (
                f"the {_reduction(report, after)} and optimizer of stage {after}, whose "
                f"{'weight gradients and reduction end' if both else 'reduction ends'} latest"
            )
        whose = f"that stage's micro-batches, then {reduction}"
        if optimizer != after:
            whose += (
                f", and the optimizer of stage {optimizer}, which puts the next step off longest"
            )
    gathers = float(step.get("fill_gathers_s") or 0)
    if gathers > 0:  # exposed communication none of the named phases holds (a review)
        later = _gathering_stages(report)
        whose += f", then the parameter gathers of {later} one after another ({_t(gathers)})"
    return (
        f"pacing stage {pacing}: the step's totals, from {whose}; each row above is its "
        "phase on the stage where it costs most, so the rows need not add up to them"
    )


def _deferred_on(report: Report, stage: object) -> bool:
    """Whether `stage` is the last of a step whose output-layer weight gradients it defers to
    the drain (phase head.wgrad), which runs before its gradient reduction."""
    deferred = report.mode == "train" and report.layout.get("defer_embedding_wgrad")
    return bool(deferred) and stage == report.layout["pp"] - 1


def _reduction(report: Report, stage: object, joined: str = ", ") -> str:
    """What runs after the last backward on `stage` before its optimizer: its gradient
    reduction, after its deferred weight gradients where it has them (review m371: two
    thirds of what the step line called the 340B's reduction were those GEMMs)."""
    if _deferred_on(report, stage):
        return f"deferred output-layer weight gradients{joined}gradient reduction"
    return "gradient reduction"


def _reduced(report: Report) -> str:
    """The after-stage's `_reduction` as the step line names it again, with its verbs: what
    ends latest and when it starts."""
    if _deferred_on(report, report.step.get("after_stage")):
        return "weight gradients and reduction, which end latest, start"
    return "reduction, which ends latest, starts"


def step_label(report: Report) -> str:
    """The phases table's total row: training with stages takes its rows from their
    costliest stages, and the step's totals are the pacing stage's (`pipeline._summary`),
    whose bytes are not summed, so the row names that stage (a user audit: "step, paced by
    stage 7" read as the sum of the rows above it, 110 ms of exposed time apart); otherwise
    the rows' sum."""
    pacing = report.step.get("pacing_stage")
    mixed = pacing is not None and len(report.stages) > 1
    return f"pacing stage {pacing}" if mixed else "sum of rows"


def _peak_stages(report: Report) -> str:
    """The stage column a narrow terminal leaves out, as a sentence: the stage most phases
    peak on, then the phases that peak elsewhere."""
    stages = [(p.name, p.peak_stage) for p in report.phases if p.peak_stage is not None]
    if not stages:
        return ""
    usual = Counter(stage for _, stage in stages).most_common(1)[0][0]
    others = ", ".join(f"{name} on {stage}" for name, stage in stages if stage != usual)
    return f"peak live is on stage {usual}" + (f", except {others}" if others else "")


def _t(seconds: float | None) -> str:
    return "–" if seconds is None else format_duration(seconds)


_SHORT = {"replicate": "R", "partial": "P"}
_OPS = {
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-reduce": "AR",
    "all-to-all": "A2A",
    "broadcast": "BC",
    "send-recv": "P2P",
}


def _placement(text: str) -> str:
    """DTensor's short notation: S(0), R, P."""
    return _SHORT.get(text, text.replace("shard", "S"))


FULL = 140  # from here the collective table also shows the tensor size S and the steps


# the collectives table's columns a terminal too narrow for them loses first (`fitted`): the
# steps and tensor size (at 140 columns), the link (the Links table says which groups each
# carries), the exposed time (the phases table sums it), then the rule
COLLECTIVE_DROPPABLE = ["steps", "tensor S", "link", "exposed", "rule"]


def group_legend(report: Report) -> list[str]:
    """What the group names of the step's collectives beyond tp, pp and dp mean, a line
    each (the terminal's collectives legend and the markdown's, which lacked them: an
    audit)."""
    every = [c for p in report.phases for c in p.collectives]
    groups = {c.group for c in every}
    legend = []
    if "etp" in groups:
        legend.append("etp = expert tensor-parallel group: ranks splitting each expert's matrices")
    if "edp" in groups:
        legend.append("edp = expert data-parallel group: ranks holding the same experts")
    if "dp" in groups and report.layout.get("cp", 1) > 1:
        legend.append("dp×cp = the data-parallel group, which spans the context-parallel ranks")
    if "dp_shard" in groups:
        cp = "×cp" if report.layout.get("cp", 1) > 1 else ""
        legend.append(
            f"dp_shard{cp} = ZeRO's shard group (hybrid sharding): the ranks one copy of the "
            "sharded states is split over"
        )
    if "dp_replicate" in groups:
        legend.append(
            "dp_replicate = the copies' group: a rank of each shard group, holding the same shard"
        )
    if any(group_name(c.group, report.layout, c.ranks) == "tp_ep" for c in every):
        legend.append(
            "tp_ep = the expert tensor- and expert-parallel ranks together (Megatron-Core's "
            "group of that name)"
        )
    return legend


def inflight_note(report: Report) -> str:
    """What a training plan's "in flight" count of a stage means ("" for serving), beside
    the stage table in the terminal and in markdown (which lacked the column: an audit)."""
    if report.mode != "train":
        return ""
    if any(row.inflight != int(row.inflight) for row in report.stages):
        return (
            "in flight: micro-batches' activations held, in whole stages (interleaving "
            "holds some micro-batches for only some of the stage's chunks)"
        )
    return "in flight: micro-batches whose activations the stage holds"


def fp8_memory_note(report: Report) -> str:
    """How a training plan's fp8 memory is counted (`FP8_MEMORY`), "" for any other."""
    if report.mode != "train" or report.matmul_format != "fp8":
        return ""
    return FP8_MEMORY + (FP8_ZERO3 if report.layout["zero"] == 3 else "")


def collective_table(
    report: Report, wide: bool, full: bool = False, console: Console | None = None
) -> tuple[Table, list[str]]:
    """The transitions of the step, and the overlap rules their last column points to; with
    a `console`, less the columns it has no room for (`COLLECTIVE_DROPPABLE`), which the
    legend names."""
    timed = report.step["time_s"] is not None
    every = [c for p in report.phases for c in p.collectives]
    # an all-to-all under routing skew receives more than it sends, or sends more (dispatch,
    # combine): then a column for each wide, and narrow the received bytes under the sent
    # where they differ; else one column, and the title says they are equal
    lopsided = any(c.recv_bytes != c.sent_bytes for c in every)
    equal = "; received = sent"
    if lopsided:
        equal = "" if wide else "; received = sent, or under it where it differs"
    title = f"Collectives (per rank, per call{equal}{calls_scope(report)})"
    columns = ["transition", "op", "group"] + (["link"] if wide else [])
    columns += (["tensor S"] if full else []) + ["sent"]
    columns += (["received"] if lopsided and wide else []) + (["steps"] if full else [])
    columns += (["time", "exposed"] if timed else []) + ["calls", "rule"]
    rows: list[dict[str, Any]] = []
    rules: list[str] = []
    # the format most payloads travel in goes in the legend; an op in another names its own
    usual = Counter(c.dtype for c in every).most_common(1)[0][0] if every else ""
    for p in report.phases:
        if not p.collectives:
            continue
        rows.append({"transition": f"[bold]{p.name}[/]"})
        for c in p.collectives:
            rule = c.overlap_rule or ""
            if rule not in rules:
                rules.append(rule)
            shown = "i64" if c.dtype == "int64" else c.dtype  # Megatron-Core's routing counts
            op = _OPS[c.op] + (f" {shown}" if c.dtype != usual else "")
            # the levels, where no link column names them: narrow, or the link left out
            levels = f" {_levels(c)}L" if _levels(c) > 1 else ""
            rest = (
                f" {_placement(c.src)}→{_placement(c.dst)}" if wide and c.op != "send-recv" else ""
            )
            if c.algorithm in _NAMED:  # not the default: one the plan names
                rest += f" {_NAMED[c.algorithm]}"
            if c.algorithm == "double-tree":  # the ring's alternative across levels
                rest += " dbt"
            group = (
                f"pp {c.src}→{c.dst}"
                if c.op == "send-recv"
                else f"{group_name(c.group, report.layout, c.ranks)} {c.ranks}"
            )
            cells: dict[str, Any] = {"transition": Hanging(c.name), "group": group}
            cells |= {"op": op + ("" if wide else levels) + rest, "op levels": op + levels + rest}
            cells |= {"link": Text(c.link or ""), "tensor S": _b(c.bytes)}
            if lopsided and wide:
                cells |= {"sent": _b(c.sent_bytes), "received": _b(c.recv_bytes)}
            elif c.recv_bytes != c.sent_bytes:
                cells["sent"] = f"{_b(c.sent_bytes)}\n{_b(c.recv_bytes)}"
            else:
                cells["sent"] = _b(c.sent_bytes)
            bound = (c.latency_term_s or 0) > (c.bandwidth_term_s or 0)
            cells |= {"steps": str(c.steps), "time": _t(c.time_s) + ("*" if bound else " ")}
            cells |= {"exposed": _t(c.exposed_s), "calls": f"{c.count:,}"}
            cells["rule"] = f"[{rules.index(rule) + 1}]"
            rows.append(cells)

    def build(kept: list[str]) -> Table:
        return _collective_columns(title, wide, kept, rows)

    kept, table = (
        (columns, build(columns))
        if console is None
        else fitted_table(console, build, columns, COLLECTIVE_DROPPABLE, ("exposed",))
    )
    hidden = [c for c in columns if c not in kept]
    legend = [left_out(hidden)] if hidden else []
    legend += ["AG all-gather, RS reduce-scatter, AR all-reduce, A2A all-to-all, P2P send/recv"]
    if every:
        legend.append(_algorithms(every, usual, "link" in kept))
    if wide:
        legend.append("S(d) = shard on dim d, R = replicate, P = sum-partial")
    else:
        legend.append(
            "each row's link and placements: at 110 columns or more, and in -f markdown (the "
            "Links table below says which groups each link carries)"
        )
    legend += group_legend(report)
    if any(c.dtype == "int64" for c in every):  # the terminal's own short name
        legend.append("i64 = int64")
    if timed:
        legend.append("* latency-bound: the n·α term exceeds Q/B_eff")
    if any(c.algorithm == "double-tree" for c in every):
        legend.append(
            "dbt = NCCL's double binary tree, named or where faster than its ring (inside one "
            "node, its chain)"
        )
    named = sorted({c.algorithm for p in report.phases for c in p.collectives} & set(_NAMED))
    if named:
        legend.append(
            ", ".join(f"{_NAMED[a]} = {_NAMED_LONG[a]}" for a in named)
            + ", as the plan's collectives: names it; the others take the default"
        )
    legend += [f"[{i}] {rule}" for i, rule in enumerate(rules, 1)]
    return table, legend


def _collective_columns(
    title: str, wide: bool, kept: list[str], rows: list[dict[str, Any]]
) -> Table:
    """The collectives table of the columns `kept`: narrow, the transition wraps sooner and
    the op (format, 2L) may take two lines, so that the rule column stays whole at 80
    columns."""
    table = titled_table(title)
    # without the link column, the op marks the levels it spans (2L), as narrow
    op = "op" if "link" in kept or not wide else "op levels"
    for name in kept:
        if name == "transition":
            table.add_column(name, ratio=1, min_width=20 if wide else 18)
        elif name == "op":
            table.add_column(name, no_wrap=wide, max_width=None if wide else 5)
        elif name == "link":
            table.add_column(name, no_wrap=True)
        else:
            _num(table, name)
    for cells in rows:
        table.add_row(*(cells.get(op if name == "op" else name, "") for name in kept))
    return table


def _levels(row: CollectiveRow) -> int:
    """The topology levels a collective runs on (a hierarchical all-reduce's three stages
    are two levels: a review read "3L")."""
    return len({level["link"] for level in row.levels})


def _algorithms(every: list[CollectiveRow], usual: str, linked: bool) -> str:
    """The payload format and the algorithms of the unmarked ops (`budget.collectives`);
    `linked`: the table has its link column, which names the levels an op spans."""
    # the tree's rows are marked and explained apart (`collective_table`): not the ring
    present = {c.op for c in every if c.algorithm not in (*_NAMED, "double-tree")}
    default = {op: default_algorithm(cast(Op, op)) for op in _OPS if op in present}
    flat = [
        f"{name} ({', '.join(_OPS[op] for op, its in default.items() if its == name)})"
        for name in dict.fromkeys(default.values())
    ]
    said = [f"payloads in {usual} unless the op names another"]
    if flat:
        said.append(f"algorithms {', '.join(flat)}")
    across = across_levels(every, linked)
    if across:
        said.append(across)
    return "; ".join(said)


def across_levels(every: list[CollectiveRow], linked: bool = True, short: bool = True) -> str:
    """What an op across levels runs as, by algorithm ("" where none spans two links):
    `linked`, the table names the levels in its link column, else it marks the op "2L"
    (the markdown's table has the column; a markdown audit, m517, found it unsaid there);
    `short`, the ops by the table's abbreviations, else by their names (the markdown's)."""
    across = [c for c in every if _levels(c) > 1]
    marks = ", ".join(f"{n}L" for n in sorted({_levels(c) for c in across}))
    named = "two links or more in the link column" if linked else marks

    def ops(algorithm: str) -> str:
        return ", ".join(
            _OPS[op] if short else op
            for op in _OPS
            if any(c.op == op and c.algorithm == algorithm for c in across)
        )

    kinds = [
        *([f"{ops('ring')} one ring through every link"] if ops("ring") else []),
        *(
            [f"{ops('double-tree')} NCCL's double binary tree" + (" (dbt)" if short else "")]
            if ops("double-tree")
            else []
        ),
        *([f"{ops('pairwise')} {_EXCHANGE}"] if ops("pairwise") else []),
        *([f"{ops('hierarchical')} one collective on each"] if ops("hierarchical") else []),
    ]
    return f"{named} = across levels: {'; '.join(kinds)}" if kinds else ""


# the all-to-all across levels: NCCL's grouped send/recv with every peer at once, each level
# carrying the blocks for the peers it reaches (`collectives._exchange_across`)
_EXCHANGE = "one exchange with every peer, each link carrying its peers' blocks"
# algorithms a plan may name (`collectives:`) over the defaults, as the op column marks them
_NAMED = {"recursive": "rec", "tree": "tree", "bruck": "brk"}
_NAMED_LONG = {
    "recursive": "recursive halving-doubling",
    "tree": "binomial tree",
    "bruck": "Bruck's algorithm",
}


def link_table(report: Report, console: Console | None = None) -> Table:
    """Each level's per-GPU bandwidth and latency, and the groups priced on it; with a
    `console` too narrow for that, its headers on two lines (`BROKEN`), then no padding,
    then each level's shares of B_eff said under the table, not in a column: never a figure
    or a header cut (an audit: at 72 columns "colle…", at 64 "231.6 GB…" under "share at
    16 · 64 · 256 M…")."""
    if console is None:
        return _link_table(report, 0)
    ramped = any(link.get("ramp") for link in report.links)
    for compact in range(4 if ramped else 3):
        table = _link_table(report, compact)
        if whole(console, table):
            return table
    return stacked(table)  # the headers of two lines still cut ("α per collectiv…" at 40)


def _link_table(report: Report, compact: int) -> Table:
    """The links table: `compact` 1, its headers on two lines; 2, no padding either; 3, the
    shares of B_eff in the caption."""
    table = titled_table("Links (per GPU, one direction)", compact > 1)

    def header(name: str) -> str:
        return BROKEN.get(name, name) if compact else name

    table.add_column("level", no_wrap=True)
    _num(table, "B_eff")
    _num(table, header("α per step"))
    ramped = any(link.get("ramp") for link in report.links)
    notes = [ramp_note(report)] if ramped else []
    if ramped and compact > 2:  # each level's shares on a line of their own
        shares = [
            f"{link['name']} {ramp_shares(link).replace(' ', NBSP)}"  # one figure, held whole
            for link in report.links
            if link.get("ramp")
        ]
        notes[:0] = [f"B_eff's {RAMP_HEADER}: {'; '.join(shares)}"]
    elif ramped:
        _num(table, header(RAMP_HEADER))
    # the groups whose collectives it carries: "collectives on it" wrapped to "collectives
    # on" over "it" at 80 columns (an audit, m427)
    table.add_column("groups", ratio=1)
    for link in report.links:
        table.add_row(
            Text(link["name"]),
            format_rate(link["bandwidth_Bps"]),
            format_duration(link["latency_s"]),
            *([ramp_shares(link)] if ramped and compact < 3 else []),
            link_groups(report, link["name"]),
        )
    if shared := shared_levels(report):
        notes.append(shared_note(shared))
    table.caption, table.caption_justify = "\n".join(notes) or None, "left"
    return table


def topology_name(report: Report) -> str:
    """The topology preset the plan names, after the GPU count: "in dgx-h100", and "(the
    plan's levels)" where it writes them over the preset's; nothing for a topology written
    out (a user audit, m434: no output named the topology)."""
    if not report.topology_name:
        return ""
    return f" in {preset_said(report.topology_name, report.topology_overrides)}"


def shared_levels(report: Report) -> list[str]:
    """The levels several groups' collectives are priced on, "cp, dp×cp on infiniband"."""
    return [
        f"{groups} on {link['name']}"
        for link in report.links
        if ", " in (groups := link_groups(report, link["name"]))
    ]


def shared_note(shared: list[str]) -> str:
    """How groups meeting on one level ("cp, dp×cp on infiniband") share it (DESIGN.md rule
    5): a collective hidden behind a phase or more shares it with those hidden inside that
    window (`schedule._link_loads`, its ``pace``); the rest each take the level's whole
    bandwidth, which only its ``shared_by`` divides (`budget.topology`), a topology audit
    having found that unsaid."""
    return (
        f"Where collectives of different groups run at once on one GPU's link "
        f"({'; '.join(shared)}), one hidden behind a phase or more shares the link with "
        "those hidden inside it (its rule says how much); the others are each priced at "
        "the level's whole B_eff (a level's shared_by divides it)"
    )


def link_groups(report: Report, level: str) -> str:
    """The groups whose collectives are priced on `level`, in the order they first appear
    ("tp, dp"), or "–": a training step's stage sends on every level one is priced on,
    not only the costliest stage's (an audit, m452: pp 8 over two nodes, six of whose seven
    sends are on NVLink, listed pp on InfiniBand alone)."""
    rows = [c for p in report.phases for c in p.collectives] + list(report.send_collectives)
    names = [
        group_name(c.group, report.layout, c.ranks)
        for c in rows
        if level in (c.link or "").split(" + ")
    ]
    return ", ".join(dict.fromkeys(names)) or "–"


def _decode_lines(report: Report) -> list[str]:
    """A generating run's whole time, and its throughput both ways: the decode passes'
    rate (``tokens_per_s``, the prefill apart) beside the run's, first tokens and prefill
    included (an audit: "1,851 generated tokens/s" sat beside a 39.1 % share of an 11.6 s
    run the table never printed, over which the rate is 1,411)."""
    from budget.inference import passes_for  # as `report.run_scope`: serving plans only

    step, layout = report.step, report.layout
    per_token, ttft, total = (float(step[k] or 0) for k in ("decode_token_s", "ttft_s", "time_s"))
    rate = float(step["tokens_per_s"] or 0)
    passes = passes_for(layout["generate"])  # the prefill yields each sequence's first token
    whole = layout["sequences"] * layout["generate"] / total if total else 0.0
    return [
        f"Run: {_t(total)} = prefill {_t(ttft)} + {plural(passes, 'decode pass', 'decode passes')} "
        f"of {_t(per_token)} ({_t(total - ttft)})",
        f"Decode: {_t(per_token)} per output token of each sequence; {format_amount(rate)} "
        f"generated tokens/s over all sequences while decoding, {format_amount(whole)} over "
        "the whole run",
    ]


def summary(report: Report) -> list[str]:
    step = report.step
    if step["time_s"] is None:
        return [
            "Step time: not computed (the device section has no peak FLOP/s or memory bandwidth)."
        ]
    time_s = float(step["time_s"])
    exposed = (
        f"Exposed communication {_t(step['exposed_comm_s'])} of {_t(step['comm_s'])} total "
        f"({float(step['exposed_share'] or 0):.1%} of the run){_slowed(step)}"
    )
    if step.get("ttft_s") is not None:
        # one prefill of every prompt at once (a user audit, m505: unsaid, where vLLM chunks)
        lines = [
            f"Prefill (time to first token; every prompt at once, unchunked): {_t(step['ttft_s'])}"
        ]
        if step.get("decode_token_s") is not None:
            lines += _decode_lines(report)
        else:
            lines.append(f"{format_amount(float(step['tokens_per_s'] or 0))} prompt tokens/s")
        pp = int(report.layout.get("pp") or 1)
        if pp > 1:  # (an audit, m546: the output never said what a serving pipeline adds)
            lines.append(
                f"Pipeline: the batch crosses the {pp} stages in turn, each idle while the "
                "others run, so pp spreads the weights and the cache over more GPUs but does "
                "not raise tokens/s (an engine that keeps every stage busy with other "
                "batches, as vLLM does, is not priced)"
            )
        # decode MFU is over the decode steps alone, the exposure over the whole run
        scope = "decode MFU" if step.get("decode_token_s") is not None else "MFU"
        lines.append(f"{exposed}; {scope} {_mfu(report)}")
        return lines
    body = _t(time_s - float(step["after_s"] or 0))
    reduction = _reduction(report, step.get("after_stage"))
    if report.layout["zero"] == 2 and report.microbatches > 1:  # one after every backward
        reduction = (
            f"gradient reductions after each of the {report.microbatches:,} micro-batches' "
            "backward (ZeRO 2)"
        )
    tail = f" + {reduction} and optimizer {_t(step['after_s'])}"
    drained = float(step.get("drained_s") or 0)
    if drained > 0:  # a later stage's reduction ends latest, from its own last backward
        tail += (
            f" past its end (stage {step['after_stage']}'s {_reduced(report)} "
            f"{_t(drained)} before it, while the stages ahead of it drain)"
        )
    gathers = float(step.get("fill_gathers_s") or 0)
    if gathers > 0:  # later 1F1B stages gather their one bucket once their input is in
        tail += (
            f", of which {_t(gathers)} the later stages' parameter gathers one after another "
            "as the next step's pipeline fills (each launched once its stage's input is in)"
        )
    filled = float(step.get("filled_s") or 0)
    if filled > 0:  # a later stage's optimizer step and gather run beside the fill
        tail += (
            f" (stage {step['optimizer_stage']}'s optimizer, which puts the next step off "
            f"longest, runs {_t(filled)} of its step while the stages ahead of it fill the "
            "next step's pipeline)"
        )
    first = (
        f"Step: {_t(time_s)} = pipeline {body} (of which bubble {_t(step['bubble_s'])}){tail}; "
        "the bubble is what the pipeline takes beyond its slowest stage's micro-batches"
        if report.layout["pp"] > 1
        else f"Step: {_t(time_s)} = micro-batches {body}{tail}"
    )
    return [
        first,
        f"Exposed communication {_t(step['exposed_comm_s'])} of {_t(step['comm_s'])} total "
        f"({float(step['exposed_share'] or 0):.1%} of the step){_slowed(step)}; "
        f"{format_amount(float(step['tokens_per_s'] or 0))} tokens/s; MFU {_mfu(report)}",
        *_bubble_note(report),
        *_fill_gathers_note(report),
    ]


# how an fp8 plan's memory is counted (Transformer Engine: a GEMM weight's FP8 copy and its
# transpose cached from the first micro-batch, `layers.fp8_weight_copies`; a Linear's input
# kept for the weight gradient in FP8, `layers.saved_gemm_input`)
FP8_MEMORY = (
    "fp8 GEMMs as Transformer Engine runs them: its FP8 copies of the layers' GEMM weights "
    "are counted with the params, the GEMM inputs the layers save in FP8 (1 B), the other "
    "activations in precision.activations"
)
# ZeRO-3 makes the copies from each gathered block; how long a stack keeps them was not read
# (`layers.fp8_weight_copies`: not counted there; a review found the note said they were)
FP8_ZERO3 = "; under ZeRO-3 its FP8 weight copies are not counted"
BUBBLE_NOTE = 0.2  # the share of the step past which the bubble is explained
GATHERS_NOTE = 0.02  # the share past which the later stages' gathers in series are explained


def _gathering_stages(report: Report) -> str:
    """The stages whose parameter gathers run in series behind the optimizer's stage
    (`schedule.put_off`): "stage 7" or "stages 1 to 7"."""
    first, last = int(report.step["optimizer_stage"] or 0) + 1, len(report.stages) - 1
    return f"stage {last}" if first == last else f"stages {first} to {last}"


def _fill_gathers_note(report: Report) -> list[str]:
    """Where the later 1F1B stages' parameter gathers in series along the fill take a
    fiftieth of the step or more (`schedule.put_off`), what keeps them beside the fill: the
    interleaved schedule, whose stages launch their first chunks' gathers as the step
    starts (Megatron-LM aligns them there, ``align_param_gather``), or the gather in the
    optimizer step (``overlap.param_gather: false``), which every stage runs at once."""
    step = report.step
    gathers = float(step.get("fill_gathers_s") or 0)
    time_s = float(step["time_s"] or 0)
    if not gathers or gathers < GATHERS_NOTE * time_s:
        return []
    return [
        f"The parameter gathers of {_gathering_stages(report)} take {_t(gathers)} "
        f"({gathers / time_s:.0%} of the step) one after another: under 1F1B "
        "Megatron-Core gathers a later stage's parameters in one bucket once its first "
        "forward's input is in; virtual stages (the interleaved schedule) launch every "
        "stage's first gathers as the step starts, and overlap.param_gather: false gathers "
        "in the optimizer step, both beside the pipeline's fill"
    ]


def _bubble_note(report: Report) -> list[str]:
    """Where the bubble is a fifth of the step or more, why, and what shrinks it (a user
    audit: 2 micro-batches through 4 stages left a 1.01 s bubble in a 1.78 s step, unsaid):
    each stage idles (p − 1)/m of its micro-batches' time under GPipe and 1F1B, (p − 1)/(v·m)
    under the interleaved schedule (Narayanan et al. 2021, arXiv 2104.04473, section 2.2)."""
    step, layout = report.step, report.layout
    share = float(step["bubble_s"] or 0) / float(step["time_s"] or 1)
    if layout["pp"] < 2 or share < BUBBLE_NOTE:
        return []
    p, v, m = layout["pp"], layout["virtual_stages"], report.microbatches
    stages = plural(p, "stage") + (f" of {v} model chunks each" if v > 1 else "")
    ratio = f"{p - 1}/{v * m}" if v * m > 1 else f"{p - 1}"
    idle = f"(p − 1)/(v·m) = {ratio}" if v > 1 else f"(p − 1)/m = {ratio}"
    chunks = "more virtual stages" if v > 1 else "virtual stages (the interleaved schedule)"
    if v == 1 and m % p:  # the advice alone was refused by `validate` (an audit)
        chunks = (
            "virtual stages (the interleaved schedule, which needs the micro-batches a step "
            f"to be a multiple of pp = {p})"
        )
    # the ideal's ratio, of equal stages: a review's uneven stages idled 0.54 of their time
    # where (p − 1)/m read 3, so the note says whose ratio it is
    return [
        f"The bubble is {share:.0%} of the step: {plural(m, 'micro-batch', 'micro-batches')} "
        f"a step through {stages}, where equal stages would each idle {idle} times their "
        "micro-batches' work (Narayanan et al. 2021, section 2.2); "
        f"{chunks} and more micro-batches a step ("
        + ("a smaller batch.micro or " if layout["micro"] > 1 else "")
        + "a larger batch.global) shrink it"
    ]


def _mfu(report: Report) -> str:
    """MFU and the peak it is a share of: the dense peak of the GEMMs' format (an fp8 plan's
    MFU is of the fp8 peak, twice the bf16 one), "55.4% of the bf16 peak"; and where the
    attention products counted as the causal mask computes them make it a tenth or more
    smaller, that share too (`step.mfu_causal`: PaLM's count passes 100 % of the peak at a
    long enough context, an audit's 104.4 % at 4.7M tokens, where the GPUs ran at 52 %)."""
    mfu = float(report.step["mfu"] or 0)
    text = f"{format_share(mfu)} of the {report.mfu_format} peak"
    causal = report.causal_mfu
    if causal is not None:
        text += (
            f" (PaLM's count, attention unmasked; {format_share(causal)} counting "
            "it as the causal mask computes it)"
        )
    return text


def _slowed(step: dict[str, Any]) -> str:
    """The compute the hidden communication cost, when it cost any (`budget.schedule`)."""
    slowed = float(step.get("overlap_slowdown_s") or 0.0)
    return f"; hiding the rest slowed compute by {_t(slowed)}" if slowed > 0 else ""


def unreserved(report: Report) -> str:
    """A fitting plan's caution when it reserves nothing: the CUDA context, NCCL's buffers
    and the allocator's slack take GiBs that no allocation here counts (a user audit: a plan
    "fit" with 75 MiB free and nothing reserved)."""
    if report.device["reserved_bytes"]:
        return ""
    return (
        " Nothing is reserved for the CUDA context, NCCL's buffers and the allocator's "
        "slack, which take a few GiB: set device.reserved to count them."
    )


def unchunked_peak(report: Report) -> str:
    """What a serving plan's peak in its prefill is of: a serving stack chunks its prefill
    (vLLM V1 always does), where the peak here is of a whole batch's prompts at once, which
    the reader must know (a user audit, m505; the markdown's too, a review, m510)."""
    if report.mode != "train" and report.worst.peak_phase.startswith("prefill"):
        return ", every prompt's prefill at once, unchunked"
    return ""


def verdict(report: Report) -> str:
    worst = report.worst
    # names a plan writes (transitions) are text, not markup: "gather[/b]" must not parse
    where = escape(f"in {worst.peak_phase} ({worst.peak_instant})") + unchunked_peak(report)
    if worst.fits:
        return (
            f"[green]Fits.[/] The worst stage ({worst.stage}) peaks at {_b(worst.peak_bytes)} "
            f"of {_b(worst.capacity_bytes)} {where}, leaving {_b(worst.headroom_bytes)}."
            + unreserved(report)
        )
    over = -worst.headroom_bytes
    top = escape(_largest(worst.peak_overlap, 3))
    return (
        f"[red]Does not fit.[/] Stage {worst.stage} peaks at {_b(worst.peak_bytes)} {where}: "
        f"{_b(over)} ({over:,} B) over {_b(worst.capacity_bytes)}. Largest besides model "
        f"states: {top}."
    )


def shown_placement(placement: str, layout: dict[str, Any]) -> str:
    """An allocation's placement as the reader needs it: none for a group of one rank
    ("shard(vocab) on tp" in a tp 1 plan says nothing true; a user audit)."""
    group = placement.rsplit(" on ", 1)[-1] if " on " in placement else ""
    return "" if group in ("tp", "cp", "ep", "etp") and layout.get(group) == 1 else placement


def overlap_table(
    row: StageRow, layout: dict[str, Any] | None = None, console: Console | None = None
) -> Table:
    """What is alive at a stage's peak; with a `console` too narrow for its kind column,
    each allocation's kind after its name instead (an audit, at 44 columns: "activati…",
    and names wrapped a few letters a line)."""
    table = _overlap_table(row, layout, kinds=True)
    if console is not None and not whole(console, table):
        table = _overlap_table(row, layout, kinds=False)
    return table


def _overlap_table(row: StageRow, layout: dict[str, Any] | None, kinds: bool) -> Table:
    """The alive table, `kinds` in a column of their own or after each name."""
    table = ParsedTable(
        # the instant can name a hand-written transition, whose name is text, not markup
        title=escape(
            f"What is alive at the peak of stage {row.stage} ({row.peak_phase}: {row.peak_instant})"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("allocation", ratio=1)
    if kinds:
        table.add_column("kind")
    table.add_column("copies", justify="right")
    table.add_column("bytes", justify="right", no_wrap=True)
    for o in row.peak_overlap:
        name = Text(o.tensor)
        placement = shown_placement(o.placement, layout or {})
        if placement:
            name.append(f" · {placement}", style="dim")
        if not kinds:
            name.append(f" · {o.category}", style="dim")
        kind = [o.category] if kinds else []
        table.add_row(Hanging(name, 0, 2), *kind, f"{o.count:,}", _b(o.bytes))
    table.add_row("[bold]total[/]", *[""] * kinds, "", f"[bold]{_b(row.peak_bytes)}[/]")
    notes = [] if kinds else ["allocation · placement · kind"]
    if any(o.count > 1 for o in row.peak_overlap):
        notes.append("bytes: all the copies together")
    table.caption, table.caption_justify = "; ".join(notes) or None, "left"
    return table


def print_table(console: Console, table: Table) -> None:
    """`table`, then its caption's lines wrapped by `print_wrapped` at the console's width:
    rich wraps a caption at any space, and "3.00" ended a line before "GiB reserved" (a
    review)."""
    caption, table.caption = table.caption, None
    console.print(table)
    for line in str(caption or "").splitlines():
        print_wrapped(console, line, "", style="table.caption")


def render_table(console: Console, report: Report) -> None:
    wide = console.width >= WIDE
    for line in header(report):
        print_wrapped(console, line)
    marks = BAR_MARKS if utf(console.file) else ASCII_BAR_MARKS
    for table in (
        *stage_tables(console, report, wide, marks),
        overlap_table(report.worst, report.layout, console),
        phase_table(report, wide, console),
    ):
        console.print()
        print_table(console, table)
    collectives, legend = collective_table(report, wide, console.width >= FULL, console)
    console.print()
    print_table(console, collectives)
    for line in legend:
        print_wrapped(console, line)
    console.print()
    print_table(console, link_table(report, console))
    console.print()
    # the sentences after the tables, wrapped between words, never inside a figure
    for line in summary(report):
        print_wrapped(console, line)
    print_wrapped(console, Text.from_markup(verdict(report)))
    for note in slow_link_notes(report):
        print_wrapped(console, f"Caution: {note}.", style="yellow")
