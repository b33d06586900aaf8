"""Render the catalogue (`budget presets`) as rich tables, JSON or markdown.

One table per kind, one row per preset (per topology level); a figure that was assumed or
borrowed from another device or link carries a dagger, and the sources follow each table,
after the names of the rows they stand behind. A terminal too narrow for a table gets each
row as a wrapped line of labelled figures instead, so no figure is ever cut. JSON carries
the exact numbers and the sources in full (`budget.presets`).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console

from budget.plan.model import DTYPE_BYTES
from budget.render import dump_document, held, utf
from budget.render.markdown import markdown_table
from budget.render.standins import for_console
from budget.render.table import titled_table
from budget.units import format_duration

__all__ = ["presets_markdown", "render_presets"]

ASSUMED = "†"
_ASSUMED_NOTE = f"{ASSUMED} assumed, or borrowed from another device or link (see its source)."


@dataclass(frozen=True, slots=True)
class Section:
    """One kind's table: its rows as text, the columns aligned right and those whose text
    may wrap, what the columns mean, and the sources behind the rows."""

    title: str
    head: list[str]
    rows: list[list[str]]
    right: set[int]
    wrap: set[int]
    note: str
    sources: list[str]


class _Sources:
    """Each source once, after the names of the rows it stands behind."""

    def __init__(self) -> None:
        self.names: dict[str, list[str]] = {}

    def cite(self, name: str, text: str) -> None:
        self.names.setdefault(text, []).append(name)

    @property
    def texts(self) -> list[str]:
        return [f"{', '.join(names)}: {text}" for text, names in self.names.items()]


def _mark(text: str, assumed: bool) -> str:
    return f"{text}{ASSUMED}" if assumed else text


def _devices(devices: list[dict[str, Any]]) -> Section:
    head = ["device", "GiB", "bf16", "fp8", "HBM", "GEMM", "stream", "attention", "start"]
    rows, sources = [], _Sources()
    for d in devices:
        fp8, guess = d["flops"].get("fp8"), set(d["assumed"])
        attention = d["attention"][0] if d["attention"] else None
        start = d["kernel_startup_s"]
        rows.append(
            [
                d["name"],
                f"{d['memory_bytes'] / 2**30:.1f}",
                f"{d['flops']['bf16'] / 1e12:,.0f}",
                "–" if fp8 is None else f"{fp8 / 1e12:,.0f}",
                f"{d['memory_bandwidth_Bps'] / 1e12:.3f}",
                _mark(f"{d['gemm']['ceiling']:.1%}", "gemm" in guess),
                _mark(f"{d['memory_efficiency']:.1%}", "stream" in guess),
                "GEMM curve"
                if attention is None
                else _mark(
                    f"{attention['kernel']} {attention['fraction']:.1%}", "attention" in guess
                ),
                _mark(format_duration(start) if start else "0 s", "start" in guess),
            ]
        )
        cited = f"{d['source']}; GEMM: {d['gemm']['source']}"
        if attention is not None:
            cited += f"; attention ({attention['kernel']}): {attention['source']}"
        sources.cite(d["name"], cited)
    note = (
        "GiB: the card's memory as its driver reports it (2^30 B); bf16, fp8: dense "
        "datasheet peaks, TFLOP/s; HBM: datasheet bandwidth, TB/s (10^12 B/s); GEMM: the "
        "share of the bf16 peak a large GEMM sustains (on Hopper and Blackwell, less for "
        "an inner dimension under 8192: `inner_half` in --format json); stream: the share "
        "of HBM bandwidth a streaming kernel reaches; attention: the kernel "
        "`model.attention: flash` runs and its share of the bf16 peak in a causal call at 8K "
        "keys, forward and backward together (GEMM curve: none measured; each pass's own "
        "share, which it is timed at, and the device's other kernels, among them the derived "
        "triton, are in --format json); start: the fixed time a kernel takes beyond its "
        "bytes; streaming multiprocessors (`sms`) and whether FP8 GEMMs need transposed copies "
        "(`fp8_transpose`, Hopper's do) are in --format json. "
        f"{_ASSUMED_NOTE}"
    )
    return Section(
        "Device presets (device: {preset: NAME})",
        head,
        rows,
        {1, 2, 3, 4, 5, 6, 8},
        {7},
        note,
        sources.texts,
    )


def _topologies(topologies: list[dict[str, Any]]) -> Section:
    head = ["topology", "level", "GPUs", "GB/s", "share", "B_eff GB/s", "α", "ramp"]
    rows, sources = [], _Sources()
    for t in topologies:
        for j, level in enumerate(t["levels"]):
            guess = set(level["assumed"])
            rows.append(
                [
                    t["name"] if j == 0 else "",
                    level["name"],
                    "all" if level["size"] is None else str(level["size"]),
                    f"{level['rate_Bps'] / 1e9:,.0f}",
                    _mark(f"{level['fraction']:.1%}", "share" in guess),
                    f"{level['bandwidth_Bps'] / 1e9:,.1f}",
                    _mark(format_duration(level["latency_s"]), "latency" in guess),
                    _mark("measured", "ramp" in guess) if level["ramp"] else "none",
                ]
            )
            sources.cite(f"{t['name']} {level['name']}", level["source"])
    note = (
        "Per GPU, one direction. GPUs: per domain of the level (all: the outermost); GB/s: the "
        "link's datasheet rate (10^9 B/s); share: what collectives reach of it; B_eff = rate x "
        "share, the plateau a plan prices at; α: latency per message step; ramp: smaller "
        "messages reach a smaller share, from nccl-tests sweeps (none: the plateau at every "
        f"size). {_ASSUMED_NOTE}"
    )
    return Section(
        "Topology presets (topology: {preset: NAME, nodes: N})",
        head,
        rows,
        {2, 3, 4, 5, 6},
        set(),
        note,
        sources.texts,
    )


def _experts(experts: dict[str, Any] | None) -> str:
    if experts is None:
        return "–"
    shared = f" +{experts['shared_ffn']}" if experts["shared_ffn"] else ""
    return f"{experts['count']}×{experts['ffn']} top {experts['top_k']}{shared}"


def _models(models: list[dict[str, Any]]) -> Section:
    head = ["model", "params", "active", "layers", "hidden", "heads", "ffn", "vocab", "experts"]
    rows, sources = [], _Sources()
    for m in models:
        rows.append(
            [
                m["name"],
                f"{m['params'] / 1e9:,.2f}",
                f"{m['active_params'] / 1e9:,.2f}",
                str(m["layers"]),
                str(m["hidden"]),
                f"{m['heads']} MLA" if m["mla"] else f"{m['heads']}/{m['kv_heads']}",
                str(m["ffn"]),
                str(m["vocab"]),
                _experts(m["experts"]),
            ]
        )
        sources.cite(m["name"], m["source"])
    mtp = "".join(
        f" {m['name']} has {m['mtp_params'] / 1e9:,.2f} B more in multi-token prediction."
        for m in models
        if m["mtp_params"]
    )
    quantized = "".join(
        f" {m['name']} is served in its released {m['weights']} weights unless a plan writes "
        "precision.params."
        if m["weights"] in DTYPE_BYTES
        else f" {m['name']} is released in {m['weights']} weights, which budget does not "
        "price: a serving plan writes precision.params."
        for m in models
        if m["weights"]
    )
    note = (
        "params: billions of parameters, multi-token prediction modules apart, as the report "
        "counts them; active: the billions one token touches, both embeddings included; heads: "
        "query / key-value heads (MLA: latent attention); ffn: the dense layers' MLP width; "
        f"experts: routed count × width, top-k, +shared width.{mtp}{quantized}"
    )
    return Section(
        "Model presets (model: {preset: NAME})",
        head,
        rows,
        {1, 2, 3, 4, 6, 7},
        {8},
        note,
        sources.texts,
    )


_SECTIONS: dict[str, Callable[[list[dict[str, Any]]], Section]] = {
    "devices": _devices,
    "topologies": _topologies,
    "models": _models,
}


def _sections(data: dict[str, list[dict[str, Any]]]) -> list[Section]:
    return [_SECTIONS[kind](items) for kind, items in data.items()]


def presets_markdown(data: dict[str, list[dict[str, Any]]]) -> str:
    lines: list[str] = []
    for section in _sections(data):
        lines += [f"### {section.title}", ""]
        lines += markdown_table(section.head, section.rows, section.right)
        lines += [section.note, "", "Sources:", ""]
        lines += [f"- {source}" for source in section.sources]
        lines.append("")
    return "\n".join(lines)


def _wrapped(console: Console, text: str, indent: str = "") -> None:
    """`text` wrapped to the console, never inside a word, a hyphenated name or between a
    figure and its unit (`render.held`, whose units are every other renderer's; a long
    address stays whole, past the edge, where `held_lines` would break it); printed as
    wrapped, so the console does not wrap it again. Its stand-ins (`standins`) in first, on
    a stream that is not UTF: "alpha" for "α" made a wrapped line wider than the console (a
    review)."""
    text, width = for_console(console, text), max(20, console.width - 1)
    filled = textwrap.fill(
        held(text, width - len(indent) - 2),
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    console.print(filled.replace("\x00", " "), highlight=False, markup=False, soft_wrap=True)


def _needed_width(section: Section, ascii_only: bool = False) -> int:
    """Columns a terminal needs for `section`'s table: drawn without its title on an
    unbounded console, each wrapping cell cut to its longest word, the narrowest it can be
    without cutting a word or a figure. `ascii_only`: drawn as on a stream that is not UTF,
    where rich's ASCII box closes each row with a "|" that the house style's blank edge
    leaves out of the count (at 80 columns the model table lost its right border)."""
    narrowest = [
        [max(c.split(), key=len) if i in section.wrap and c.strip() else c for i, c in enumerate(r)]
        for r in section.rows
    ]
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii" if ascii_only else "utf-8")
    probe = Console(width=100_000, file=stream, color_system=None)
    with probe.capture() as captured:
        probe.print(_table(replace(section, title="", rows=narrowest)))
    return max(len(line.rstrip()) for line in captured.get().splitlines())


def _table(section: Section) -> Any:
    table = titled_table(section.title)  # the width probe draws it untitled ("")
    for i, name in enumerate(section.head):
        texts = [name, *(row[i] for row in section.rows)]
        wraps = i in section.wrap
        # a text cell wraps between words, never inside one; any other cell stays whole
        # (its width is its longest cell, so the table's measured minimum is what it needs)
        pieces = [word for text in texts for word in text.split()] if wraps else texts
        table.add_column(
            name,
            justify="right" if i in section.right else "left",
            no_wrap=not wraps,
            min_width=max(len(piece) for piece in pieces),
        )
    for row in section.rows:
        table.add_row(*row)
    return table


def _rows_as_lines(console: Console, section: Section) -> None:
    """The narrow form: one wrapped line per row, every figure after its column's name,
    the two held together (`render.held`'s mark) so a line never parts a figure from its
    name or unit."""
    _wrapped(console, section.title)
    label = ""
    for row in section.rows:
        label = row[0] or label
        pairs = zip(section.head[1:], row[1:], strict=True)
        figures = ", ".join(f"{h} {c}".replace(" ", "\x00") for h, c in pairs)
        _wrapped(console, f"{label}: {figures}", "  ")


def render_presets(console: Console, data: dict[str, list[dict[str, Any]]], fmt: str) -> None:
    if fmt == "json":
        console.file.write(dump_document(data, console.file))
        return
    if fmt == "markdown":
        console.file.write(presets_markdown(data))
        return
    for n, section in enumerate(_sections(data)):
        if n:
            console.print()
        if _needed_width(section, not utf(console.file)) > console.width:
            _rows_as_lines(console, section)
        else:
            console.print(_table(section))
        _wrapped(console, section.note)
        console.print("Sources:", highlight=False)
        for source in section.sources:
            _wrapped(console, source, "  ")
