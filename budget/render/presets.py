"""Render the catalogue (`budget presets`) as rich tables, JSON or markdown.

One table per kind, one row per preset (per topology level), each row pointing at a
numbered source printed under its table; JSON carries the exact numbers and the sources in
full (`budget.presets`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budget.render import dump_json
from budget.render.markdown import markdown_table
from budget.render.table import titled_table
from budget.units import format_duration

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["presets_markdown", "render_presets"]


@dataclass(frozen=True, slots=True)
class Section:
    """One kind's table: its rows as text, the columns aligned right, what the columns
    mean, and the sources behind the rows."""

    title: str
    head: list[str]
    rows: list[list[str]]
    right: set[int]
    note: str
    sources: list[str]


# columns whose cells are text a narrow terminal may wrap (every other cell is kept whole)
_WRAP = {"attention", "heads", "experts"}

_TITLES = {
    "devices": "Device presets (device: {preset: NAME})",
    "topologies": "Topology presets (topology: {preset: NAME, nodes: N})",
    "models": "Model presets (model: {preset: NAME})",
}


class _Sources:
    """Each source once, after the names of the rows it stands behind."""

    def __init__(self) -> None:
        self.names: dict[str, list[str]] = {}

    def cite(self, name: str, text: str) -> None:
        self.names.setdefault(text, []).append(name)

    @property
    def texts(self) -> list[str]:
        return [f"{', '.join(names)}: {text}" for text, names in self.names.items()]


def _g(value: float, digits: int = 4) -> str:
    """A figure in its header's unit: '989', '1,979', '3.35', '1.555'."""
    return f"{value:,.{digits}g}" if value < 1000 else f"{value:,.0f}"


def _devices(devices: list[dict[str, Any]]) -> Section:
    head = ["device", "GiB", "bf16", "fp8", "HBM", "GEMM", "stream", "attention"]
    head += ["start"]
    rows, sources = [], _Sources()
    for d in devices:
        fp8 = d["flops"].get("fp8")
        attention = d["attention"][0] if d["attention"] else None
        rows.append(
            [
                d["name"],
                _g(d["memory_bytes"] / 2**30),
                _g(d["flops"]["bf16"] / 1e12),
                "–" if fp8 is None else _g(fp8 / 1e12),
                _g(d["memory_bandwidth_Bps"] / 1e12),
                f"{d['gemm']['ceiling']:.1%}",
                f"{d['memory_efficiency']:.1%}",
                "GEMM curve"
                if attention is None
                else f"{attention['kernel']} {attention['fraction_at_8k']:.1%}",
                "–" if not d["kernel_startup_s"] else format_duration(d["kernel_startup_s"]),
            ]
        )
        sources.cite(d["name"], f"{d['source']}; GEMM: {d['gemm']['source']}")
    right = {1, 2, 3, 4, 5, 6, 8}
    return Section(_TITLES["devices"], head, rows, right, _NOTES["devices"], sources.texts)


def _topologies(topologies: list[dict[str, Any]]) -> Section:
    head = ["topology", "level", "GPUs", "GB/s", "share", "B_eff GB/s", "α", "ramp"]
    rows, sources = [], _Sources()
    for t in topologies:
        for j, level in enumerate(t["levels"]):
            rows.append(
                [
                    t["name"] if j == 0 else "",
                    level["name"],
                    "all" if level["size"] is None else str(level["size"]),
                    _g(level["rate_Bps"] / 1e9),
                    f"{level['fraction']:.1%}",
                    _g(level["bandwidth_Bps"] / 1e9),
                    format_duration(level["latency_s"]),
                    "measured" if level["ramp"] else "–",
                ]
            )
            sources.cite(f"{t['name']} {level['name']}", level["source"])
    right = {2, 3, 4, 5, 6}
    return Section(_TITLES["topologies"], head, rows, right, _NOTES["topologies"], sources.texts)


def _experts(experts: dict[str, Any] | None) -> str:
    if experts is None:
        return "–"
    shared = f" +{experts['shared_ffn']}" if experts["shared_ffn"] else ""
    return f"{experts['count']}×{experts['ffn']} top {experts['top_k']}{shared}"


def _models(models: list[dict[str, Any]]) -> Section:
    head = ["model", "params", "active", "layers", "hidden", "heads", "ffn", "vocab"]
    head += ["experts"]
    rows, sources = [], _Sources()
    for m in models:
        heads = f"{m['heads']} MLA" if m["mla"] else f"{m['heads']}/{m['kv_heads']}"
        rows.append(
            [
                m["name"],
                f"{m['params'] / 1e9:,.2f}",
                f"{m['active_params'] / 1e9:,.2f}",
                str(m["layers"]),
                str(m["hidden"]),
                heads,
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
    right = {1, 2, 3, 4, 5, 6, 7}
    return Section(_TITLES["models"], head, rows, right, _NOTES["models"] + mtp, sources.texts)


_BUILDERS = {"devices": _devices, "topologies": _topologies, "models": _models}
_NOTES = {
    "devices": "GiB = 2^30 bytes of memory; bf16 and fp8: dense datasheet peaks in TFLOP/s; "
    "HBM: datasheet bandwidth in TB/s (10^12 B/s); GEMM: the share of the bf16 peak a large GEMM "
    "sustains; stream: the share of HBM bandwidth a streaming kernel reaches; attention: what "
    "`model.attention: flash` runs and its share of the bf16 peak at 8K keys; start: the "
    "fixed time a kernel takes beyond its bytes.",
    "topologies": "Per GPU, one direction. GB/s: the link's datasheet rate (10^9 B/s); share: "
    "what collectives reach of it; B_eff = rate × share, the plateau a plan prices at; α: "
    "latency per message step; ramp: smaller messages reach a measured, smaller share "
    "(nccl-tests sweeps).",
    "models": "params: billions of parameters, without multi-token prediction modules, as "
    "the report counts them; active: the billions one token uses (its top-k experts); heads: "
    "query / key-value heads; experts: routed count × width, top-k, +shared width.",
}


def _sections(data: dict[str, list[dict[str, Any]]]) -> list[Section]:
    return [_BUILDERS[kind](items) for kind, items in data.items()]


def presets_markdown(data: dict[str, list[dict[str, Any]]]) -> str:
    lines: list[str] = []
    for section in _sections(data):
        lines += [f"### {section.title}", ""]
        lines += markdown_table(section.head, section.rows, section.right)
        lines += [section.note, "", "Sources:", ""]
        lines += [f"- {source}" for source in section.sources]
        lines.append("")
    return "\n".join(lines)


def render_presets(console: Console, data: dict[str, list[dict[str, Any]]], fmt: str) -> None:
    if fmt == "json":
        console.file.write(dump_json(data))
        return
    if fmt == "markdown":
        console.file.write(presets_markdown(data))
        return
    for n, section in enumerate(_sections(data)):
        if n:
            console.print()
        table = titled_table(section.title)
        wrap = {i for i, name in enumerate(section.head) if name in _WRAP}
        for i, name in enumerate(section.head):
            # names are typed into plans and figures read whole: only text cells wrap
            table.add_column(
                name,
                justify="right" if i in section.right else "left",
                no_wrap=i not in wrap,
                overflow="fold",
                # a text cell wraps between words, never inside one
                min_width=max(len(word) for row in section.rows for word in row[i].split()),
            )
        for row in section.rows:
            table.add_row(*row)
        console.print(table)
        console.print(section.note, highlight=False)
        console.print("Sources:", highlight=False)
        for source in section.sources:
            text = textwrap.fill(
                source, max(40, console.width - 1), initial_indent="  ", subsequent_indent="    "
            )
            console.print(text, highlight=False, markup=False)
