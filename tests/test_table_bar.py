"""The stage table's fill bar: 8 cells at 110+ columns, 5 at 80, and no line wider than
the terminal."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from budget.pipeline import budget_plan
from budget.render.table import collective_table, stage_table
from tests.plan_files import GPT3, PLANS, ROOT


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
@pytest.mark.parametrize(("width", "cells"), [(80, 5), (120, 8)])
def test_fill_bar_per_stage(plan: Path, width: int, cells: int) -> None:
    report = budget_plan(plan)
    console = Console(width=width, color_system=None, record=True)
    console.print(stage_table(report, width >= 110, cells))
    lines = console.export_text().splitlines()
    rows = [line for line in lines if line.strip()[:1].isdigit()]
    assert len(rows) == len(report.stages)
    for stage, line in zip(report.stages, rows, strict=True):
        gauge = line.split()[-1]
        assert len(gauge) == cells
        assert stage.peak_bytes <= stage.capacity_bytes  # every shipped plan fits
        # a cell for each whole 1/cells of the capacity the peak reaches
        full = sum(
            k * stage.capacity_bytes <= cells * stage.peak_bytes for k in range(1, cells + 1)
        )
        assert gauge == "█" * full + "·" * (cells - full)
    assert all(len(line.rstrip()) <= width for line in lines)


@pytest.mark.parametrize(
    ("peak_gib", "gauge"),
    [
        (0.0, "·····"),
        (15.9, "·····"),  # under a fifth of 80 GiB
        (16.0, "█····"),
        (79.9, "████·"),  # nearly full is not full: a cell is a whole fifth
        (80.0, "█████"),  # at capacity, and it fits
        (80.5, "█████!"),  # over capacity, said without colour
        (200.0, "█████!"),
    ],
)
def test_a_full_bar_is_a_stage_at_its_memory_and_one_over_says_so(
    peak_gib: float, gauge: str
) -> None:
    """An audit: rounded to the nearest cell, a stage 2.25 GiB over its memory and a stage
    with 7.86 GiB free drew the same full bar, told apart only by colour."""
    from budget.render.table import _bar
    from budget.report import StageRow

    row = next(iter(budget_plan(GPT3).stages))
    row = replace(row, peak_bytes=round(peak_gib * 2**30), capacity_bytes=80 * 2**30)
    assert isinstance(row, StageRow)
    assert _bar(row, 5).plain == gauge


def test_the_default_report_shows_the_bar_at_80_columns() -> None:
    from budget.render.table import render_table

    report = budget_plan(PLANS[0])
    console = Console(width=80, color_system=None, record=True)
    render_table(console, report)
    assert " fill" in console.export_text()


def test_phases_show_what_they_add_and_a_miss_names_what_fills_the_memory(
    tmp_path: Path,
) -> None:
    """The phases table shows what each phase adds at its peak, not the activations earlier
    layers carried into it; a plan that does not fit names its largest allocations besides
    the model states whatever their kind, so an activation-bound miss names the saved
    activations rather than a buffer a thousandth their size."""
    from budget.render.table import phase_table, verdict

    plan = next(p for p in PLANS if p.name == "mixtral-8x7b.yaml")
    report = budget_plan(plan)
    console = Console(width=140, color_system=None, record=True)
    console.print(phase_table(report, True))
    text = console.export_text()
    assert "largest it adds at that peak" in text
    assert "earlier layer" not in text
    small = tmp_path / "small.yaml"
    small.write_text(
        plan.read_text(encoding="utf-8").replace(
            "reserved: 4 GiB}", "reserved: 4 GiB, memory: 24 GiB}"
        ),
        encoding="utf-8",
    )
    over = budget_plan(small)
    saved = max(
        (o for o in over.worst.peak_overlap if o.tensor.startswith("saved activations")),
        key=lambda o: o.bytes,
    )
    line = verdict(over)
    assert "Largest besides model states: saved activations" in line
    assert saved.bytes > max(o.bytes for o in over.worst.peak_overlap if o.category == "transient")
    # the memory a plan reserves is not a model state: where it is the largest, it is named
    # (it was left out of the list, which then led with a smaller transient; review)
    hoarding = tmp_path / "hoarding.yaml"
    hoarding.write_text(
        small.read_text(encoding="utf-8").replace("reserved: 4 GiB", "reserved: 20 GiB"),
        encoding="utf-8",
    )
    line = verdict(budget_plan(hoarding))
    assert "Largest besides model states: reserved (runtime, NCCL, allocator) 20.0 GiB" in line


def test_the_data_parallel_group_says_it_spans_context_parallel_ranks() -> None:
    """With cp 16 and dp 8 the gradients are reduced over 128 ranks: the group reads dp×cp
    (not "dp 128" under a header saying dp 8) and the states say what they shard over;
    the expert group's abbreviation is defined where it appears."""
    from budget.render.table import render_table

    def text(name: str) -> str:
        console = Console(width=140, color_system=None, record=True)
        render_table(console, budget_plan(next(p for p in PLANS if p.name == name)))
        return " ".join(console.export_text().split())

    long = text("llama3-405b-128k.yaml")
    assert "dp×cp 128" in long and " dp 128" not in long
    assert "shard over 128 data- and context-parallel ranks" in long
    assert "dp×cp = the data-parallel group, which spans the context-parallel ranks" in long
    moe = text("deepseek-moe-16b.yaml")
    assert "edp 2" in moe and "edp = expert data-parallel group" in moe
    assert "dp×cp" not in moe and "shard over 16 data-parallel ranks" in moe


def test_a_plan_without_a_pipeline_does_not_describe_one() -> None:
    """pp 1: no schedule, no bubble, no 'pace of the slowest stage'."""
    from budget.render.table import header, summary

    report = budget_plan(next(p for p in PLANS if p.name == "gpt-1.3b.yaml"))
    assert "no pipeline" in " ".join(header(report))
    step = summary(report)[0]
    assert step.startswith("Step: ") and " = micro-batches " in step
    assert "bubble" not in step and "slowest stage" not in step


def test_the_header_gives_a_head_width_that_is_not_hidden_over_heads() -> None:
    """Gemma 2 9B's heads are 256 wide where 3584 / 16 is 224: the header and the JSON
    say so (an audit: Mistral-Nemo read from its config showed no sign of its 128 where
    5120 / 32 is 160); GPT-3's 128 = 12288 / 96 goes unsaid."""
    from budget.render.table import header

    gemma = budget_plan(next(p for p in PLANS if p.name == "gemma2-9b.yaml"))
    assert "16 heads of 256 / 8 kv" in header(gemma)[1]
    assert gemma.model["head_dim"] == 256
    gpt3 = budget_plan(GPT3)
    assert "96 heads / 96 kv" in header(gpt3)[1] and gpt3.model["head_dim"] == 128


def test_a_narrow_phases_table_still_says_which_stage_each_peak_is_on() -> None:
    """At 80 columns the stage column is left out; a caption carries it."""
    from budget.render.table import phase_table

    report = budget_plan(next(p for p in PLANS if p.name == "mixtral-8x7b.yaml"))
    console = Console(width=80, color_system=None, record=True)
    console.print(phase_table(report, False))
    text = " ".join(console.export_text().split())
    elsewhere = [p for p in report.phases if p.peak_stage not in (None, 0)]
    assert elsewhere  # the loss and the step's end peak on the last stage
    named = ", ".join(f"{p.name} on {p.peak_stage}" for p in elsewhere)
    assert f"peak live is on stage 0, except {named}" in text
    # and a phase without a peak of its own says why its cell is "–" (review)
    assert [p for p in report.phases if p.peak_stage is None]
    assert "– in peak live: the phase (an embedding lookup, a stage send) holds no more" in text


def test_a_wide_phases_table_says_its_stage_column_is_the_peaks() -> None:
    """The title's stage is where each phase costs most; the column beside peak live is
    the stage of that peak. Headed "stage", it read as the first (review: Llama 3 405B's
    dp.grads costs 4.15 s on stage 15 and peaks on stage 1)."""
    from budget.render.markdown import render_markdown
    from budget.render.table import phase_table

    report = budget_plan(next(p for p in PLANS if p.name == "llama3-405b-128k.yaml"))
    (grads,) = [p for p in report.phases if p.name == "dp.grads"]
    assert (grads.stage, grads.peak_stage) == (15, 1)
    console = Console(width=120, color_system=None, record=True)
    console.print(phase_table(report, True))
    header = [line.split() for line in console.export_text().splitlines()[2:4]]
    assert header[0] == ["peak"] and header[1][-7:] == [
        "stage",
        *["largest", "it", "adds", "at", "that", "peak"],
    ]
    assert "| peak live | peak stage |" in render_markdown(report)


def test_the_markdown_report_carries_what_the_terminal_tables_do() -> None:
    """The markdown had dropped the phases' total row, the groups each link carries and the
    outermost level's "all", and called a stage's send "pp 2" in a pp 4 plan (a user
    audit): now the same figures as the terminal's."""
    from budget.render.markdown import render_markdown
    from budget.units import format_bytes

    report = budget_plan(next(p for p in PLANS if p.name == "llama3-70b.yaml"))
    text = render_markdown(report)
    step = report.step
    total = f"| **pacing stage {step['pacing_stage']}** |  | **"
    assert total in text
    assert "| infiniband | all | 47 GB/s | 14 µs | – | pp, dp |" in text
    assert "| nvlink | 8 | 370 GB/s | 3 µs |" in text and text.count("| pp pair |") == 2
    assert "| pp 2 |" not in text
    # what the terminal's alive table and phase notes say too (an audit, m394): the total
    # at the peak, and what a phase's "–" in peak live means
    assert f"| **total** |  |  |  | **{format_bytes(report.worst.peak_bytes)}** |" in text
    assert any(p.peak_stage is None for p in report.phases)
    assert "– in peak live: the phase (an embedding lookup, a stage send) holds no more" in text
    # what an op over two links runs as, which the terminal's legend says (a markdown
    # audit, m517: the markdown left it out, and Mixtral's all-to-all read as pairwise steps)
    mixtral = render_markdown(budget_plan(next(p for p in PLANS if p.name == "mixtral-8x7b.yaml")))
    assert (
        "Two links or more in the link column = across levels: all-gather, reduce-scatter one "
        "ring through every link; all-to-all one exchange with every peer, each link carrying "
        "its peers' blocks." in mixtral
    )
    assert "across levels" not in text  # Llama 3 70B's ops each run on one link


def test_a_narrow_memory_table_says_an_uneven_layer_split() -> None:
    """At 80 columns the layers column is left out; an uneven split is said in the caption,
    an even one needs no words."""
    uneven = budget_plan(next(p for p in PLANS if p.name == "llama3-405b-128k.yaml"))
    even = budget_plan(GPT3)

    def caption(report) -> str:
        console = Console(width=80, color_system=None, record=True)
        console.print(stage_table(report, False))
        return " ".join(console.export_text().split())

    split = ", ".join(str(row.layers) for row in uneven.stages)
    assert split.startswith("7, 8") and f"layers per stage: {split}" in caption(uneven)
    assert "layers per stage" not in caption(even)


def test_a_wrapped_transition_name_hangs_under_its_first_line() -> None:
    """At 80 columns "cross-entropy statistics" wraps; its second line used to start where
    a phase heading starts, so it read as a new group. Rows sit one space in from their
    phase, and the lines a name wraps to three."""
    console = Console(width=80, record=True, force_terminal=False)
    table, _ = collective_table(budget_plan(ROOT / "plans" / "llama3-70b.yaml"), wide=False)
    console.print(table)
    lines = console.export_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith(" loss ")))
    assert lines[start + 1].startswith("  cross-entropy ")
    assert lines[start + 2].split() == ["statistics", "fp32"]  # the op's format wraps too
    assert lines[start + 2].startswith("    statistics")


def test_a_transition_name_that_fits_is_not_wrapped() -> None:
    """The hanging indent must not cost a name its own width: at 200 columns every name
    of the GPT 1.3B plan is on one line (the first cut wrapped "updated parameters")."""
    console = Console(width=200, record=True, force_terminal=False)
    table, _ = collective_table(budget_plan(PLANS[2]), wide=True)
    console.print(table)
    text = console.export_text()
    assert "  updated parameters " in text
    rows = [line for line in text.splitlines()[3:] if line.strip()]
    assert all(line.startswith((" ", "─")) for line in rows)
    assert not [line for line in rows if line.startswith("    ")]  # no continuation line


def test_names_a_plan_writes_are_text_not_markup(tmp_path: Path) -> None:
    """A transition named "gather[/b]" and a level named "nv[/b]" crashed the tables with
    rich's MarkupError; in markdown the same names are escaped, so "<b>" stays text."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan
    from budget.render.markdown import render_markdown
    from budget.render.table import render_table

    text = GPT3.read_text(encoding="utf-8")
    text = text.replace("reserved: 3 GiB}", "reserved: 3 GiB, memory: 20 GiB}")
    text = text.replace(
        "topology: {preset: dgx-a100, nodes: 128}",
        "topology:\n  gpus: 1024\n  levels:\n"
        '    - {name: "nv[/b]<b>", size: 8, bandwidth: 300 GB/s, latency: 3 us}\n'
        "    - {name: ib, bandwidth: 25 GB/s, latency: 10 us}",
    )
    text += (
        "transitions:\n"
        '  - name: "gather[/b] <i>x</i>"\n'
        "    phase: loss\n"
        "    tensor: {shape: [micro * seq * 64, vocab], dtype: fp32}\n"
        "    group: tp\n"
        "    from: shard(1)\n"
        "    to: replicate\n"
        "    source_alive: true\n"
    )
    plan = tmp_path / "markup.yaml"
    plan.write_text(text, encoding="utf-8")
    report = build_report(load_plan(plan))
    console = Console(width=160, record=True, force_terminal=False)
    render_table(console, report)
    shown = console.export_text()
    assert "gather[/b] <i>x</i>" in shown and "nv[/b]<b>" in shown
    markdown = render_markdown(report)
    assert "gather\\[/b\\] \\<i\\>x\\</i\\>" in markdown
    assert "| nv\\[/b\\]\\<b\\> |" in markdown
    assert "<i>" not in markdown


def test_a_wrapped_allocation_name_hangs_under_its_row() -> None:
    """At 80 columns "saved activations of the micro-batches in flight" wraps; its second
    line is indented two spaces so that it does not read as an allocation of its own."""
    from budget.render.table import overlap_table

    console = Console(width=80, record=True, force_terminal=False)
    console.print(overlap_table(budget_plan(ROOT / "plans" / "gemma2-9b.yaml").worst))
    lines = console.export_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "saved activations" in line)
    assert lines[first].startswith(" saved activations")
    assert lines[first + 1].startswith("   ") and lines[first + 1].strip() == "flight"


def test_the_alive_table_says_its_bytes_count_every_copy() -> None:
    """'embedding dropout mask · copies 8 · 24.0 MiB' is 8 x 3 MiB; read as one copy's size
    it is 8 times too big (review)."""
    from budget.render.table import overlap_table

    report = budget_plan(next(p for p in PLANS if p.name == "gpt3-175b.yaml"))
    console = Console(width=80, color_system=None, record=True)
    console.print(overlap_table(report.worst))
    text = console.export_text()
    assert any(o.count > 1 for o in report.worst.peak_overlap)
    assert "bytes: all the copies together" in text


def test_a_fractional_in_flight_count_is_explained() -> None:
    """Interleaving holds 4.60 stages' worth of micro-batches on stage 0 (review: the
    column printed 11.50 ... 4.50 with no word on what a fraction of a micro-batch is)."""
    from budget.pipeline import build_report
    from tests.builders import make_plan

    plan = make_plan(pp=4, schedule="interleaved", virtual_stages=4, global_batch=1024)
    console = Console(width=80, color_system=None, record=True)
    console.print(stage_table(build_report(plan), False))
    assert "in flight: micro-batches' activations held, in whole stages" in console.export_text()


def _rendered(table) -> str:
    console = Console(width=80, record=True)
    console.print(table)
    return console.export_text()


def test_the_collective_table_names_formats_and_algorithms_at_any_width() -> None:
    """Each collective states its format and algorithm in the terminal too (only the JSON
    and markdown did; review): the legend names the usual payload format and the default
    algorithms, an op in another format names it, and one over two links says 2L, which at
    80 columns is the only sign of it, the link column being left out there."""
    gpt3 = budget_plan(GPT3)
    table, legend = collective_table(gpt3, wide=False)
    assert legend[1] == (
        "payloads in bf16 unless the op names another; algorithms ring (AG, RS, AR), direct (P2P)"
    )
    assert (
        "each row's link and placements: at 110 columns or more, and in -f markdown (the Links "
        "table below says which groups each link carries)"
    ) in legend
    lines = _rendered(table).splitlines()
    (grads,) = [i for i, line in enumerate(lines) if re.match(r"  gradients +RS ", line)]
    assert lines[grads + 1].split() == ["fp32"]
    wide, _ = collective_table(gpt3, wide=True)
    console = Console(width=120, record=True)
    console.print(wide)
    text = console.export_text()
    assert "RS fp32 P→S(0)" in text and "AR fp32 P→R" in text and "AG fp32" not in text
    mixtral = budget_plan(ROOT / "plans" / "mixtral-8x7b.yaml")
    table, legend = collective_table(mixtral, wide=False)
    # across nodes the all-to-all is NCCL's grouped send/recv with every peer at once, each
    # level carrying its own peers' blocks (`collectives._exchange_across`), no longer the
    # two-level decomposition, which the legend said as "A2A one collective on each"
    assert legend[1].endswith(
        "pairwise (A2A), direct (P2P); 2L = across levels: AG, RS one ring through every "
        "link; A2A one exchange with every peer, each link carrying its peers' blocks"
    )
    assert "one collective on each" not in legend[1]
    lines = _rendered(table).splitlines()
    dispatch = [i for i, line in enumerate(lines) if "MoE dispatch " in line]
    # the op wraps at 80 columns: A2A on the row, 2L below it
    assert dispatch and all(" A2A " in lines[i] and "2L" in lines[i + 1].split() for i in dispatch)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
@pytest.mark.parametrize("width", [80, 100, 110, 120])
def test_every_collective_row_keeps_its_rule_whole(path, width) -> None:
    """The rule column is a row's only link to its overlap rule: at any width from 80 it
    is whole on every row (the format and 2L marks had pushed it past 80 columns, cut to
    "[" on five shipped plans; review)."""
    table, _ = collective_table(budget_plan(path), wide=width >= 110)
    console = Console(width=width, record=True)
    console.print(table)
    rows = [
        line
        for line in console.export_text().splitlines()
        if line.startswith("  ") and line[2:3].isalpha()
    ]
    assert rows and all(re.search(r"\[\d+\] *$", line) for line in rows)


def test_a_serving_plans_phase_table_says_its_rows_are_the_whole_batch() -> None:
    """A decode plan's rows are its prefill and every decode pass (their sum is the batch's
    11.6 s), which the title called "one step" (review)."""
    from budget.render.table import phase_table

    assert str(phase_table(budget_plan(GPT3), wide=False).title).startswith("Phases of one step (")
    served = phase_table(budget_plan(ROOT / "plans" / "llama3-70b-decode.yaml"), wide=False)
    assert str(served.title).startswith("Phases of the batch: its prefill and 511 decode passes (")


def test_a_group_of_one_rank_gives_no_placement() -> None:
    """ "logits · shard(vocab) on tp" in a tp 1 plan says nothing true (a user audit): the
    alive table names placements on groups of more than one rank only, in the terminal and
    the markdown; the JSON keeps them all."""
    from budget.render.markdown import render_markdown
    from budget.render.table import overlap_table

    small = budget_plan(next(p for p in PLANS if p.name == "gpt-1.3b.yaml"))
    assert small.layout["tp"] == 1
    assert any(o.placement.endswith(" on tp") for o in small.worst.peak_overlap)
    assert " on tp" not in _rendered(overlap_table(small.worst, small.layout))
    alive = render_markdown(small).split("### Alive at the peak")[1].split("###")[0]
    assert " on tp" not in alive
    big = budget_plan(GPT3)
    assert " on tp" in _rendered(overlap_table(big.worst, big.layout))


def test_a_hierarchical_all_reduce_is_marked_two_levels(tmp_path) -> None:
    """A hierarchical all-reduce runs three stages on two links: "2L", not "3L" (a review)."""
    from tests.plan_files import variant

    path = variant(
        tmp_path,
        "h.yaml",
        ("  zero: 1", "  zero: 0"),
        (
            "topology: {preset: dgx-h100, nodes: 8}",
            "collectives: {all-reduce: hierarchical}\ntopology: {preset: dgx-h100, nodes: 8}",
        ),
        base=ROOT / "plans" / "gemma2-9b.yaml",
    )
    report = budget_plan(path)
    (grads,) = [c for p in report.phases for c in p.collectives if c.group == "dp"]
    assert (grads.algorithm, len(grads.levels)) == ("hierarchical", 3)
    table, legend = collective_table(report, wide=False)
    assert " 2L" in _rendered(table) and " 3L" not in _rendered(table)
    assert "2L = across levels: AR one collective on each" in " ".join(legend)


def test_zero_over_one_data_parallel_rank_says_it_shards_nothing(tmp_path: Path) -> None:
    """GPT-3 at dp 1 (tp 8 x pp 8 on 64 GPUs) with ZeRO 1: the optimizer states shard over
    one rank, which is no shard; the header said "ZeRO stage 1" as if they were."""
    from budget.render.table import header
    from tests.plan_files import variant

    one = variant(
        tmp_path,
        "dp1.yaml",
        ("dp: 16", "dp: 1"),
        ("nodes: 128", "nodes: 8"),
        ("global: 1536", "global: 96"),
    )
    said = " ".join(header(budget_plan(one)))
    assert "ZeRO stage 1 (one data-parallel rank: nothing to shard)" in said
    assert "nothing to shard" not in " ".join(header(budget_plan(GPT3)))


def test_the_device_line_states_the_roofline_derates(tmp_path: Path) -> None:
    """Rule 9's roofline runs at a share of each peak: a preset's measured GEMM curve (the
    A100's 82.2 % of 312 TFLOP/s at the largest GEMMs, Azure's sustained cuBLASLt run;
    81.2 % of 2,039 GB/s streaming) or a written device's flat 0.8 of each, which the report
    never said (a DESIGN audit); the JSON carries the same."""
    from budget.plan.load import load_plan_data
    from budget.render.table import header
    from tests.plan_files import gpt13_written

    preset = budget_plan(ROOT / "plans" / "gpt-1.3b.yaml")
    assert preset.device["matmul_by_size"] is True
    assert round(preset.device["matmul_ceiling"], 3) == 0.822
    assert round(preset.device["memory_efficiency"], 3) == 0.812
    line = " ".join(header(preset))
    # with the peak and the bandwidth they are shares of (a user audit, m434: a plan may
    # write either over its preset's)
    assert "GEMMs up to 82.2% of the 312 TFLOP/s bf16 peak, memory at 81.2% of its 2.039 TB/s" in (
        line
    )
    written = load_plan_data(gpt13_written().encode(), "written.yaml")
    from budget.pipeline import build_report

    report = build_report(written)
    assert report.device["matmul_by_size"] is False
    assert (report.device["matmul_ceiling"], report.device["memory_efficiency"]) == (0.8, 0.8)
    assert "GEMMs at 80.0% of the 312 TFLOP/s bf16 peak, memory at 80.0% of its 2.039 TB/s" in (
        " ".join(header(report))
    )
    # fp8 GEMMs follow the fp8 ceiling (the H100's 68.4 %, Bekman's H200 MSMF), not bf16's
    # 74.1 % (a review), and a device with no peaks times nothing, so states no derate
    text = (ROOT / "plans" / "llama3-70b.yaml").read_text("utf-8")
    fp8 = build_report(
        load_plan_data(
            text.replace("  activations: bf16", "  activations: bf16\n  matmul: fp8").encode(),
            "fp8.yaml",
        )
    )
    assert round(fp8.device["matmul_ceiling"], 3) == 0.684
    assert "GEMMs up to 68.4% of the 1.979 PFLOP/s fp8 peak" in " ".join(header(fp8))
    untimed = gpt13_written().replace("  flops: {bf16: 312 TFLOP/s, fp32: 19.5 TFLOP/s}\n", "")
    report = build_report(load_plan_data(untimed.encode(), "untimed.yaml"))
    assert report.step["time_s"] is None and "GEMMs" not in " ".join(header(report))


MTP_LAST = """\
model: {layers: 8, hidden: 1024, heads: 8, vocab: 32000, mtp_layers: 2}
batch: {seq: 512, micro: 1, global: 4}
parallel: {pp: 2}
device: {preset: h100-sxm}
topology: {preset: dgx-h100, gpus: 2}
"""


def test_the_phases_table_says_whose_figures_its_last_row_and_slowdowns_are() -> None:
    """GPT-3's last row is stage 7's micro-batches with stage 0's reduction and optimizer,
    whose reduction ends latest (and whose optimizer puts the next step off longest); the
    405B 128K plan's
    ZeRO 2 dp.grads has no kernels, its compute the slowdown its hidden reductions cause in
    the backward; and its step line says the reductions run after each micro-batch's
    backward (an audit read all three as wrong)."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan, load_plan_data
    from budget.render.table import _t, pacing_note, slowdown_note, summary
    from budget.schedule import step_time
    from budget.step import derive

    gpt3 = budget_plan(GPT3)
    assert (gpt3.step["pacing_stage"], gpt3.step["after_stage"]) == (7, 0)
    assert pacing_note(gpt3) == (
        "pacing stage 7: the step's totals, from that stage's micro-batches, then the "
        "gradient reduction and optimizer of stage 0, whose reduction ends latest; each row "
        "above is its phase on the stage where it costs most, so the rows need not add up to "
        "them"
    )
    assert gpt3.step["optimizer_stage"] == 0
    # the rows come from several stages, the totals from the phases the step waits for (an
    # audit summed Llama 3 70B's exposed column, 2.01 s against its last row's 1.97 s): the
    # last stage's micro-batches, and stage 0's reduction, which started with no lead and
    # so ends latest though the last stage's is a microsecond longer, and its optimizer:
    # the last stage's takes longer, but runs while the stages ahead of it fill the next
    # step's pipeline
    path = next(p for p in PLANS if p.name == "llama3-70b.yaml")
    llama = budget_plan(path)
    step = llama.step
    assert (step["pacing_stage"], step["after_stage"], step["optimizer_stage"]) == (3, 0, 0)
    plan = load_plan(path)
    stages = step_time(plan, derive(plan)).stages
    assert stages[3].optimizer_s > stages[0].optimizer_s
    assert stages[3].optimizer_s - stages[3].fill_s < stages[0].optimizer_s
    rows = sum(p.exposed_s or 0.0 for p in llama.phases)
    assert rows > llama.step["exposed_comm_s"] * 1.01
    assert pacing_note(llama).startswith(
        "pacing stage 3: the step's totals, from that stage's micro-batches, then the gradient "
        "reduction and optimizer of stage 0, whose reduction ends latest; "
    )
    # where the optimizer's stage is another: the last, two prediction modules' weights on it
    mtp = build_report(load_plan_data(MTP_LAST.encode(), "mtp.yaml"))
    step = mtp.step
    assert (step["pacing_stage"], step["after_stage"], step["optimizer_stage"]) == (1, 0, 1)
    assert pacing_note(mtp).startswith(
        "pacing stage 1: the step's totals, from that stage's micro-batches, then the gradient "
        "reduction of stage 0, which ends latest, and the optimizer of stage 1, which puts the "
        "next step off longest; "
    )
    said = (
        f"(stage 1's optimizer, which puts the next step off longest, runs {_t(step['filled_s'])}"
    )
    assert step["filled_s"] > 0 and said in " ".join(summary(mtp)[0].split())
    assert slowdown_note(gpt3) == ""  # nothing hides behind the micro-batches
    long = budget_plan(next(p for p in PLANS if p.name == "llama3-405b-128k.yaml"))
    grads = next(p for p in long.phases if p.name == "dp.grads")
    assert grads.compute_s == grads.slowdown_s > 0
    assert slowdown_note(long).startswith("compute of the phases after the micro-batches")
    assert f"dp.grads {grads.slowdown_s * 1e3:.0f} ms," in slowdown_note(long)
    said = "gradient reductions after each of the 16 micro-batches' backward (ZeRO 2) and"
    assert said in summary(long)[0]
    assert "+ gradient reduction and optimizer" in summary(gpt3)[0]  # ZeRO 1: one after


SERVING = """name: serve-long-gen
mode: decode
model: {{preset: llama3-70b}}
batch: {{sequences: {sequences}, prompt: 1024, generate: {generate}}}
precision: {{params: bf16, activations: bf16, kv_cache: fp8}}
parallel: {{tp: 8, pp: 1, dp: 1}}
device: {{preset: h200, reserved: 4 GiB}}
topology: {{preset: dgx-h200, nodes: 1}}
"""


@pytest.mark.parametrize(
    ("sequences", "generate", "dropped"),
    [
        (256, 131_072, ["sent/rank left out"]),
        (256, 1_048_576, ["sent/rank left out"]),
        # the collectives keep their exposed time, squeezed (it was left out here)
        (1, 10**9, ["comm and sent/rank left out"]),
    ],
)
def test_a_long_generation_prints_every_figure_whole_at_80_columns(
    tmp_path: Path, sequences: int, generate: int, dropped: list[str]
) -> None:
    """An audit: at 80 columns these printed decode.attention's compute "712,039…", the sum
    of rows "719,652…", the phase names "decode.attent…" and the collectives' rule column
    "[1" under "rul". Now the tables drop columns until every cell is whole, and say which."""
    from budget.render.table import render_table
    from budget.units import format_duration

    plan = tmp_path / "serve.yaml"
    plan.write_text(SERVING.format(sequences=sequences, generate=generate))
    report = budget_plan(plan)
    console = Console(width=80, color_system=None, record=True)
    render_table(console, report)
    text = console.export_text()
    assert "…" not in text
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines())
    words = set(text.split())
    for p in report.phases:
        assert p.name in words and f"{p.count:,}" in words
        assert format_duration(p.compute_s or 0).split()[0] in words
        for c in p.collectives:
            assert f"{c.count:,}" in words
    assert format_duration(report.step["compute_s"]) in text
    assert "rule" in words and {"[1]", "[2]", "[3]"} <= words
    for note in dropped:
        assert f"{note} at this width (see -f json)" in text
    assert "exposed left out" not in text and "exposed" in text.split("Collectives", 1)[1]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
@pytest.mark.parametrize("width", [80, 110, 120])
def test_the_shipped_plans_lose_no_column_at_80_110_or_120_columns(plan: Path, width: int) -> None:
    """Dropping columns is for tables too wide for the terminal: every plan in plans/
    prints all of its columns, as before. At 110 columns the stage table's fill bar was
    cut to "███···…"; it takes 5 cells there now."""
    from budget.render.table import render_table

    console = Console(width=width, color_system=None, record=True)
    render_table(console, budget_plan(plan))
    text = console.export_text()
    assert "left out at this width" not in text and "…" not in text


def test_a_tiny_plan_reads_its_small_figures(tmp_path: Path) -> None:
    """An audit: a 171,136-parameter model printed "0.00 billion parameters" and "MFU
    0.0%" (the JSON: 0.049 %), and a 1-token sequence "at 1 keys per call". Hand count
    (learned positions, no linear biases, tied head): embeddings 1,000·64 + 1·64 = 64,064;
    each layer 4·64² (attention) + 2·64·256 (MLP) + 2·2·64 (two layernorms) = 49,408, twice
    98,816; the final layernorm 128: 163,008."""
    from budget.render.table import header, summary

    plan = tmp_path / "tiny.yaml"
    plan.write_text(
        "name: tiny\nmode: train\n"
        "model: {layers: 2, hidden: 64, heads: 2, vocab: 1000, mlp: gelu, norm: layernorm, "
        "position: learned}\n"
        "batch: {seq: 1, micro: 1, global: 1}\n"
        "parallel: {tp: 1, pp: 1, dp: 1}\n"
        "device: {preset: h100-sxm, reserved: 3 GiB}\n"
        "topology: {preset: dgx-h100, gpus: 1}\n"
    )
    report = budget_plan(plan)
    assert report.model["params_total"] == 64_064 + 98_816 + 128
    lines = header(report)
    assert lines[1].startswith("model: 163,008 parameters (")
    assert " at 1 key per call " in lines[3]
    mfu = float(report.step["mfu"])
    assert 0 < mfu < 0.0005
    assert f"MFU {mfu * 100:.2g}% of the bf16 peak" in summary(report)[-1]


def test_a_slow_generation_says_its_rate_to_three_figures(tmp_path: Path) -> None:
    """An audit: one sequence generating 10^9 tokens printed "0 generated tokens/s", where
    the JSON holds 0.396 (2.53 s per token, one sequence)."""
    from budget.render.table import summary

    plan = tmp_path / "serve.yaml"
    plan.write_text(SERVING.format(sequences=1, generate=10**9))
    report = budget_plan(plan)
    assert round(float(report.step["tokens_per_s"]), 3) == 0.396
    assert "; 0.396 generated tokens/s over all sequences" in summary(report)[2]


def test_a_generating_run_says_its_whole_time_and_rate(tmp_path: Path) -> None:
    """The decode rate leaves the prefill out and the exposed share is of the whole run,
    which the table never printed (an audit: Llama 3 70B's 32 sequences of 512 tokens,
    1,851 generated tokens/s beside a 39.1 % share of an 11.6 s run). The run is the
    prefill plus generate − 1 passes (the prefill yields each first token), and the whole
    run's rate is sequences x generate over it."""
    from budget.render.table import summary
    from budget.units import format_amount
    from budget.units import format_duration as format_time

    plan = tmp_path / "serve.yaml"
    plan.write_text(SERVING.format(sequences=4, generate=9))
    step = budget_plan(plan).step
    total, ttft, per_token = (float(step[k]) for k in ("time_s", "ttft_s", "decode_token_s"))
    assert total == pytest.approx(ttft + 8 * per_token)
    assert float(step["tokens_per_s"]) == pytest.approx(4 / per_token)
    lines = summary(budget_plan(plan))
    run = f"Run: {format_time(total)} = prefill {format_time(ttft)} + 8 decode passes of "
    assert lines[1].startswith(run)
    whole = format_amount(4 * 9 / total)
    assert lines[2].endswith(f"while decoding, {whole} over the whole run")
    assert "of the run)" in lines[3]


def test_a_wide_collectives_table_without_its_link_column_marks_the_levels(
    tmp_path: Path,
) -> None:
    """At 110 columns an 8-way tensor-parallel group laid out after dp, so across two
    nodes, needed the link column's "nvlink + infiniband" and cut the rule column to "[1"
    under "rul" (an audit's plan). The link column goes, and each op says the levels it
    spans (2L), as at 80."""
    from budget.render.table import render_table

    plan = tmp_path / "order.yaml"
    plan.write_text(
        "name: order-dp-first\nmode: train\nmodel: {preset: llama3-8b}\n"
        "batch: {seq: 8192, micro: 1, global: 64}\n"
        "parallel: {tp: 8, pp: 2, dp: 2, sequence_parallel: true, zero: 1, "
        "order: [dp, tp, cp, ep, pp]}\n"
        "recompute: selective\ndevice: {preset: h100-sxm, reserved: 3 GiB}\n"
        "topology: {preset: dgx-h100, nodes: 4}\n"
    )
    console = Console(width=110, color_system=None, record=True)
    render_table(console, budget_plan(plan))
    text = console.export_text()
    assert "…" not in text and "link left out at this width (see -f json)" in text
    words = text.split()
    assert "rule" in words and "[1]" in words and "2L" in words
    head = next(line for line in text.splitlines() if line.lstrip().startswith("transition"))
    assert head.split() == ["transition", "op", "group", "sent", "time", "exposed", "calls", "rule"]


def test_the_fit_check_falls_back_to_rich_s_public_measure(monkeypatch) -> None:
    """`whole` reads rich's private column layout (`laid_out`); a rich without it (the
    dependency is `rich>=13`) decides by the table's unbounded width, rich's public
    Measurement, instead of failing the report: a table wider than the terminal does not
    fit, a narrow one does."""
    from rich.table import Table

    from budget.render import table as render

    def missing(*_: object) -> None:
        raise AttributeError("_measure_column")

    monkeypatch.setattr(render, "laid_out", missing)
    console = Console(width=40, record=True)
    wide, narrow = Table(), Table()
    wide.add_column("a", no_wrap=True)
    wide.add_row("x" * 60)
    narrow.add_column("a", no_wrap=True)
    narrow.add_row("x" * 10)
    assert (render.whole(console, wide), render.whole(console, narrow)) == (False, True)


def test_an_fp8_plan_says_how_its_memory_is_counted(tmp_path: Path) -> None:
    """`precision.matmul: fp8` prices the GEMMs at the fp8 peak and counts Transformer
    Engine's FP8 weight copies and FP8-saved GEMM inputs; the stage table says so, as a bf16
    plan's does not (a diff audit read an unexplained peak as a question)."""
    from budget.render.table import FP8_MEMORY, FP8_ZERO3
    from tests.plan_files import variant

    llama = ROOT / "plans" / "llama3-70b.yaml"
    fp8 = variant(tmp_path, "fp8.yaml", ("precision:\n", "precision:\n  matmul: fp8\n"), base=llama)
    fsdp = variant(
        tmp_path,
        "fsdp.yaml",
        ("precision:\n", "precision:\n  matmul: fp8\n"),
        base=ROOT / "plans" / "llama3-8b-fsdp.yaml",
    )
    # under ZeRO-3 the copies are not counted, and the note says so (a review: it said they
    # were)
    zero3 = FP8_ZERO3.strip("; ")
    for plan, said in ((llama, ()), (fp8, (FP8_MEMORY,)), (fsdp, (FP8_MEMORY, zero3))):
        report = budget_plan(plan)
        console = Console(width=120, color_system=None, record=True)
        console.print(stage_table(report, True, 8))
        text = " ".join(console.export_text().split())
        assert [note for note in (FP8_MEMORY, zero3) if note in text] == list(said)


@pytest.mark.parametrize(
    ("name", "shared"),
    [("llama3-405b-128k.yaml", "cp, pp, dp×cp on roce"), ("llama3-70b-decode.yaml", None)],
)
def test_groups_meeting_on_one_level_are_said_to_share_it_so(name: str, shared: str | None) -> None:
    """Collectives of different groups running at once on one GPU's link share it where
    one hides behind a phase or more (`schedule._link_loads`) and otherwise each get the
    whole B_eff, which nothing said (a topology audit); the table and the markdown say it
    where groups meet on a level."""
    from budget.render.markdown import render_markdown
    from budget.render.table import link_table

    report = budget_plan(ROOT / "plans" / name)
    console = Console(width=120, color_system=None, record=True)
    console.print(link_table(report))
    texts = [" ".join(t.split()) for t in (console.export_text(), render_markdown(report))]
    for text in texts:
        if shared is None:
            assert "whole B_eff" not in text
        else:
            assert f"({shared}), one hidden behind a phase or more shares the link" in text
            # markdown escapes the underscore
            assert "the others are each priced at the level's whole B" in text


def _section(text: str, start: str, end: tuple[str, ...]) -> list[str]:
    """The report's lines from the one starting with `start` to the next starting with one
    of `end`."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(i for i in range(first + 1, len(lines)) if lines[i].startswith(end))
    return lines[first:last]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.stem)
@pytest.mark.parametrize("width", [44, 52, 60, 64, 72])
def test_narrow_stage_and_link_tables_print_every_figure_whole(plan: Path, width: int) -> None:
    """An audit: at 64 columns the stage table cropped every byte figure ("17.7 G…") and its
    headers ("sta…", "in flig…", "headro…"), and the links table at 72 its header "colle…",
    at 64 "231.6 GB…" under "share at 16 · 64 · 256 M…". Down to 44 columns each stage's
    figures in the JSON report, formatted, are whole on its rows (split over two tables
    where one is too wide), and each level's rate, latency and shares on its links row or
    under the table."""
    from budget.render.table import render_table
    from budget.report import ramp_shares, to_dict
    from budget.units import format_bytes, format_duration, format_rate

    report = budget_plan(plan)
    console = Console(width=width, color_system=None, record=True)
    render_table(console, report)
    text = console.export_text().replace("\u00a0", " ")
    assert all(len(line.rstrip()) <= width for line in text.splitlines())
    stages = _section(text, "Memory per rank of each", ("What is alive",))
    assert "…" not in "\n".join(stages)
    headers = " ".join(line for line in stages if not line.lstrip()[:1].isdigit()).split()
    assert {"stage", "peak"} <= set(headers) and "states" in headers
    for s in to_dict(report)["memory"]["stages"]:
        rows = " ".join(line for line in stages if line.split()[:1] == [str(s["stage"])])
        figures = [s["peak_bytes"], s["headroom_bytes"], s["transient_bytes"] + s["reserved_bytes"]]
        figures.append(s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"])
        figures += [s[k] for k in ("activations_bytes", "kv_cache_bytes") if s[k]]
        for n in figures:
            assert f" {format_bytes(n)}" in f" {rows} ", (s["stage"], format_bytes(n), rows)
    # the alive table puts each kind after its name, the phases table drops its padding,
    # where they are too narrow (at 44 columns "activati…" and exposed "51.2 …")
    for start, end in (("What is alive", "Phases of"), ("Phases of", "Collectives")):
        assert "…" not in "\n".join(_section(text, start, (end,))), start
    links = _section(text, "Links (per GPU", ("Step:", "Prefill", "Step time"))
    assert "…" not in "\n".join(links)
    assert "collectives" in " ".join(links).split()
    for level in report.links:
        # a row, not the caption's "nvlink 59 · 85 · 96 %": the table's edge is a blank
        (row,) = [line for line in links if line[:1] == " " and line.split()[:1] == [level["name"]]]
        assert format_rate(level["bandwidth_Bps"]) in row
        assert format_duration(level["latency_s"]) in row
        if level.get("ramp"):
            assert ramp_shares(level) in " ".join(" ".join(links).split())


def test_the_step_line_says_a_later_stage_reduced_while_the_pipeline_drained(tmp_path) -> None:
    """32 layers as 2, 6, 8, 16 over 4 stages: the last stage's reduction ends latest,
    started 73.4 ms before the pipeline's end (the backwards of one micro-batch on stages
    0 to 2, which wait for its own); the Step line says so, the phases table's note names
    whose reduction and optimizer the totals take, and they add up to the step less it."""
    from budget.render.table import pacing_note, summary
    from tests.test_schedule import UNEVEN_LATE

    path = tmp_path / "late.yaml"
    path.write_text(UNEVEN_LATE.replace("6, 8, 8, 10", "2, 6, 8, 16"), encoding="utf-8")
    report = budget_plan(path)
    step = report.step
    assert (step["pacing_stage"], step["after_stage"], step["optimizer_stage"]) == (3, 3, 3)
    assert round(step["drained_s"] * 1e3, 1) == 73.4
    line = summary(report)[0]
    assert "(stage 3's reduction, which ends latest, starts 73.4 ms before it, while the " in line
    assert pacing_note(report).startswith("pacing stage 3: the step's totals, from that stage's")


def test_the_step_says_what_keeps_later_stages_gathers_beside_the_fill(tmp_path) -> None:
    """Under 1F1B with overlap.param_gather on, the later stages' gathers in series along the
    fill (`schedule.put_off`) took 1.49 s of GPT-3's 20.5 s step with nothing saying what
    puts them back beside the fill: the summary names both remedies, where they take a
    fiftieth of the step or more, and the remedies do remove them."""
    from budget.render.table import _t, pacing_note, summary
    from tests.plan_files import variant

    overlap = "overlap: {dp_grads: true, param_gather: true}\n"
    edit = ("recompute: selective\n", "recompute: selective\n" + overlap)
    report = budget_plan(variant(tmp_path, "on.yaml", edit))
    gathers = report.step["fill_gathers_s"]
    share = gathers / report.step["time_s"]
    assert share >= 0.02
    said = " ".join(" ".join(summary(report)).split())
    assert (
        f"The parameter gathers of stages 1 to 7 take {_t(gathers)} ({share:.0%} of the step) "
        "one after another" in said
    )
    assert "overlap.param_gather: false gathers in the optimizer step" in said
    # the pacing stage's totals hold them too (a review: the note named only its phases)
    assert pacing_note(report).startswith(
        "pacing stage 7: the step's totals, from that stage's micro-batches, then the gradient "
        "reduction and optimizer of stage 0, whose reduction ends latest, then the parameter "
        f"gathers of stages 1 to 7 one after another ({_t(gathers)}); "
    )
    assert "The parameter gathers" not in " ".join(summary(budget_plan(GPT3)))
    off = edit[1].replace("param_gather: true", "param_gather: false")
    interleaved = "  pipeline: {schedule: interleaved, virtual_stages: 2}\n"
    for edits in [((edit[0], off),), (edit, ("  pipeline: {schedule: 1f1b}\n", interleaved))]:
        other = budget_plan(variant(tmp_path, "other.yaml", *edits))
        assert other.step["fill_gathers_s"] == 0
        assert other.step["time_s"] < report.step["time_s"]


def test_the_markdown_stage_table_has_the_terminal_columns_and_notes(tmp_path: Path) -> None:
    """An audit: the markdown stage table left out the terminal's "in flight" column with
    its note, the fp8 plan's note on how its memory is counted (and that under ZeRO-3 the
    FP8 weight copies are not), and the collectives' legend of the expert and
    context-parallel group names its own rows use (etp, edp, tp_ep, dp×cp)."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan
    from budget.render.markdown import render_markdown
    from budget.render.table import FP8_MEMORY, FP8_ZERO3
    from tests.plan_files import variant

    report = budget_plan(ROOT / "plans" / "llama3-70b.yaml")
    text = render_markdown(report)
    head = "| stage | layers | in flight | params |"
    assert head in text
    rows = [line for line in text.splitlines() if re.match(r"\| \d \| 20 \| ", line)]
    assert [row.split(" | ")[2] for row in rows] == ["4", "3", "2", "1"]
    assert [s.inflight for s in report.stages] == [4, 3, 2, 1]
    assert "in flight: micro-batches whose activations the stage holds." in text
    assert FP8_MEMORY not in text
    # serving has no micro-batches in flight: no column, no note
    decode = render_markdown(budget_plan(ROOT / "plans" / "llama3-70b-decode.yaml"))
    assert "in flight" not in decode and "| stage | layers | params |" in decode
    # fp8 under ZeRO-3: the note and its caution
    fp8 = variant(
        tmp_path,
        "fp8.yaml",
        ("activations: bf16", "activations: bf16\n  matmul: fp8"),
        base=ROOT / "plans" / "llama3-8b-fsdp.yaml",
    )
    zero3 = render_markdown(build_report(load_plan(fp8)))
    assert f"{FP8_MEMORY}{FP8_ZERO3}.".replace("_", "\\_") in zero3
    # the group names of the expert and context-parallel collectives, explained
    legends = {
        "mixtral-8x7b.yaml": ("etp = expert tensor-parallel group", "tp\\_ep = the expert"),
        "llama3-405b-128k.yaml": ("dp×cp = the data-parallel group",),
    }
    for name, said in legends.items():
        text = render_markdown(budget_plan(ROOT / "plans" / name))
        assert all(line in text for line in said), name
    assert "etp = " not in render_markdown(report)  # a dense plan names none
    # the markdown prints int64 whole: no legend of the terminal's "i64" (a review)
    mixtral = render_markdown(budget_plan(ROOT / "plans" / "mixtral-8x7b.yaml"))
    assert "| int64 |" in mixtral and "i64" not in mixtral


@pytest.mark.parametrize("width", [40, 46, 50, 54, 58])
@pytest.mark.parametrize(
    "args",
    [
        ["plans/gpt3-175b.yaml"],
        ["plans/llama3-70b-decode.yaml"],
        ["diff", "plans/llama3-8b-fsdp.yaml", "plans/llama3-8b-tp-loss-gathered.yaml"],
        ["search", "plans/gpt-1.3b.yaml"],
    ],
)
def test_no_figure_is_cut_at_any_width_budget_prints_at(args: list[str], width: int) -> None:
    """An audit (m125): from 40 to 58 columns the collectives table was cropped at its right
    edge (GPT-3's "1,152 calls" read "1", its times lost their units), the phases table cut
    figures to "51.2 …" and "1,1…", a diff's to "1.71 …" and "−186 M…", and search's Pareto
    front its step times to "5.32…". Where no set of a table's columns prints whole it is
    printed as records (`stacked`): every line within the width, no figure cut, and the
    collectives' call counts as the JSON has them."""
    from rich.cells import cell_len
    from typer.testing import CliRunner

    from budget.cli import app, route

    runner = CliRunner()
    out = runner.invoke(app, route(args), env={"COLUMNS": str(width)}).stdout
    lines = out.splitlines()
    assert not [line for line in lines if cell_len(line) > width]
    assert "…" not in out
    if args == ["plans/gpt3-175b.yaml"]:
        said = " ".join(out.split())
        report = budget_plan(GPT3)
        calls = {c.count for p in report.phases for c in p.collectives} - {1}
        assert all(f" {n:,} " in f"{said} " for n in calls), calls


def test_a_stacked_table_keeps_each_row_s_figures_and_names_a_bare_number() -> None:
    """`stacked`: a row's first cell heads it, a bare number named by its column ("stage
    0"); every other non-empty cell follows its header; a row that continues the one above
    (first cell empty) has no heading; a heading row (other cells empty) stays a heading."""
    from budget.render.table import stacked, titled_table

    table = titled_table("T")
    for name in ("stage", "", "A"):
        table.add_column(name)
    table.add_row("0", "peak", "31.8 GiB")
    table.add_row("", "headroom", "47.8 GiB")
    table.add_row("forward.mlp", "", "")
    console = Console(width=40, color_system=None, record=True)
    console.print(stacked(table))
    # a first cell of wide characters is folded where it fills a line, not cut to "…" (a
    # review: "テンソル 😀 gathered over th…" at 45 columns)
    wide = titled_table("T")
    wide.add_column("name")
    wide.add_column("A")
    name = "重い テンソル 😀 gathered over the tensor-parallel group for a very long while"
    wide.add_row(name, "1")
    for width in range(40, 61):
        narrow = Console(width=width, color_system=None, record=True)
        narrow.print(stacked(wide))
        text = narrow.export_text()
        assert "…" not in text and "while" in text, width
    # a field is held whole by no-break spaces (`NBSP`), which a terminal shows as blanks
    text = console.export_text().replace("\u00a0", " ")
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines == [
        "T",
        "stage 0",
        "  peak   A 31.8 GiB",
        "  headroom   A 47.8 GiB",
        "forward.mlp",
    ]


def test_a_buffer_held_through_the_run_is_no_phase_s_addition(tmp_path: Path) -> None:
    """Megatron-LM's eager scores buffer is alive in every phase, made before any: no
    phase's "largest it adds" names it (a last read: every phase named it, and dp.grads and
    the optimizer, which add nothing, named it alone)."""
    from budget.render.table import phase_table

    eager = tmp_path / "eager.yaml"
    eager.write_text(
        GPT3.read_text(encoding="utf-8").replace("attention: flash", "attention: eager"),
        encoding="utf-8",
    )
    report = budget_plan(eager)
    assert any("attention scores buffer" in o.tensor for o in report.worst.peak_overlap)
    console = Console(width=160, color_system=None, record=True)
    console.print(phase_table(report, True))
    rows = console.export_text().splitlines()
    assert not [r for r in rows if "scores buffer" in r]
    (optimizer,) = [r for r in rows if r.lstrip().startswith("optimizer")]
    assert re.search(r"GiB\s+\d+$", optimizer.rstrip())  # its peak stage, nothing it adds


def test_a_narrow_phases_table_says_where_its_largest_column_is_and_markdown_has_it() -> None:
    """Below 110 columns the phases table has no room for what each phase adds at its peak;
    a line under it says where to read it, and markdown carries it (a review: the column went
    without a word at 80 columns and was never in markdown)."""
    from budget.render.markdown import render_markdown
    from budget.render.table import phase_table

    plan = next(p for p in PLANS if p.name == "mixtral-8x7b.yaml")
    report = budget_plan(plan)
    console = Console(width=80, color_system=None, record=True)
    console.print(phase_table(report, False, console))
    text = " ".join(console.export_text().split())
    assert "largest it adds at that peak: each phase's at 110 columns or more, and in -f " in text
    lines = render_markdown(report).splitlines()
    head = next(line for line in lines if line.startswith("| phase | count |"))
    assert head.endswith("| peak stage | largest it adds at that peak |")
    moe = next(line for line in lines if line.startswith("| `forward.moe` |"))
    assert moe.endswith("| 0 | dispatch send and receive buffers 64.0 MiB |")
    assert all(line.count(" | ") == head.count(" | ") for line in lines[lines.index(head) :][:12])


def test_a_table_laid_out_to_fit_is_not_measured_again_to_print() -> None:
    """`whole` lays a table out before it prints; printing takes that layout rather than
    measuring every cell again, and anything that changes the layout lays it out anew."""
    from rich.table import Table

    from budget.render.table import titled_table, whole

    table = titled_table("t")
    table.add_column("name")
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_row("params", "1,024")
    measured: list[int] = []
    real = Table._measure_column

    def counted(self: Table, console: Console, options: object, column: object) -> object:
        measured.append(1)
        return real(self, console, options, column)  # type: ignore[arg-type]

    console = Console(width=60, color_system=None, record=True)
    Table._measure_column = counted  # type: ignore[assignment,method-assign]
    try:
        assert whole(console, table)
        laid = len(measured)
        assert laid >= 2  # both columns measured to lay it out
        console.print(table)
        assert len(measured) == laid  # printed as laid out
        table.add_row("a longer name than before", "1,048,576")  # a row: laid out anew
        console.print(table)
        assert len(measured) == laid + 2
        table.padding = (0, 0)
        console.print(table)
        assert len(measured) == laid + 4
        table.columns[1].header = "bytes per rank, summed"  # a heading renamed (a review)
        console.print(table)
        assert len(measured) == laid + 6
    finally:
        Table._measure_column = real  # type: ignore[method-assign]
    text = console.export_text()
    assert "a longer name than before  1,048,576" in text  # padded, as printed before
    assert "a longer name than before 1,048,576" in text  # unpadded, the box's blank alone
    assert "bytes per rank, summed" in text  # whole, not cut to the old heading's width


def test_a_serving_report_says_its_prefill_is_every_prompt_at_once() -> None:
    """A user audit (m505): the decode plan's time to first token and its peak, in the
    prefill, are of every prompt at once, where vLLM chunks its prefill; the report said so
    nowhere. Both the prefill line and the verdict say it now."""
    report = budget_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    assert report.worst.peak_phase.startswith("prefill")
    console = Console(width=120, color_system=None, record=True)
    from budget.render.table import render_table

    render_table(console, report)
    text = " ".join(console.export_text().split())
    assert "Prefill (time to first token; every prompt at once, unchunked):" in text
    assert (
        "in prefill.mlp (fc2 output reduction), every prompt's prefill at once, unchunked" in text
    )
    # the markdown's verdict and check's summary too (a review, m510)
    from typer.testing import CliRunner

    from budget.cli import app
    from budget.render.markdown import render_markdown

    verdict = next(line for line in render_markdown(report).splitlines() if "Verdict" in line)
    assert "(fc2 output reduction), every prompt's prefill at once, unchunked;" in verdict
    result = CliRunner().invoke(app, ["check", str(ROOT / "plans" / "llama3-70b-decode.yaml")])
    assert "(every prompt's prefill at once)" in " ".join(result.output.split())
