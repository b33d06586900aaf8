"""`budget plot`: real PNG and SVG files, usage errors, and a clear message without
matplotlib."""

from __future__ import annotations

import contextlib
import itertools
import re
import struct
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from tests.plan_files import GPT3, too_big

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _plot(plan: Path, out: Path) -> tuple[int, str, str]:
    result = runner.invoke(app, route(["plot", str(plan), "-o", str(out)]))
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("plan", ["fits", "too-big"])
def test_png_is_a_real_image(tmp_path: Path, plan: str) -> None:
    pytest.importorskip("matplotlib")
    path = GPT3 if plan == "fits" else too_big(tmp_path)
    out = tmp_path / "memory.png"
    code, stdout, _ = _plot(path, out)
    assert code == 0
    assert stdout.strip() == f"{path}: wrote {out}"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1000 and height >= 700
    assert len(data) > 50_000


def test_svg_is_a_real_image(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "memory.svg"
    code, _, _ = _plot(GPT3, out)
    assert code == 0
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    text = out.read_text(encoding="utf-8")
    assert "capacity 80.0 GiB" in text  # the a100-80gb preset: 81,920 MiB as nvidia-smi shows
    # labels are text, not outlines, so they can be searched and read aloud (an audit)
    labels = {e.text for e in root.iter("{http://www.w3.org/2000/svg}text")}
    assert "live memory per rank (GiB)" in labels


def test_the_same_plan_draws_the_same_svg(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    assert _plot(GPT3, first)[0] == 0 and _plot(GPT3, second)[0] == 0
    assert first.read_bytes() == second.read_bytes()


def test_other_suffixes_are_usage_errors(tmp_path: Path) -> None:
    code, out, err = _plot(GPT3, tmp_path / "memory.jpg")
    assert code == 2 and out == ""
    assert err.strip().endswith("the picture must be a .png or .svg file")


def test_a_bad_picture_is_said_before_the_plan_is_read(tmp_path: Path) -> None:
    """An audit: a .gif was refused only once the plan's own problems were mended; the
    command line's faults come first, each on its line, as a folder that is not there."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nmode: train\nmodel: {layers: zero}\n", encoding="utf-8")
    code, out, err = _plot(broken, tmp_path / "memory.gif")
    assert code == 2 and out == ""
    assert err.strip().endswith("the picture must be a .png or .svg file")
    code, out, err = _plot(broken, tmp_path / "nowhere" / "memory.gif")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2 and "cannot write" in lines[1]


def test_without_matplotlib_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    code, out, err = _plot(GPT3, tmp_path / "memory.png")
    assert code == 2 and out == ""
    assert err == "budget: error: budget plot needs matplotlib: pip install 'budget[plot]'\n"


def test_an_unwritable_output_is_a_usage_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "missing" / "memory.png"
    code, stdout, err = _plot(GPT3, out)
    assert (code, stdout) == (2, "")
    assert err.strip() == f"budget: error: cannot write {out}: there is no folder {out.parent}"


def test_the_title_reads_the_peak_as_its_marker_does(tmp_path: Path) -> None:
    """The title said "peak 140 GiB of 79.6 GiB" above a marker "peak 139.9" (review): both
    now read GiB to the tenth."""
    pytest.importorskip("matplotlib")
    from budget.pipeline import budget_plan

    out = tmp_path / "p.svg"
    code, _, err = _plot(GPT3, out)
    assert code == 0, err
    report = budget_plan(GPT3)
    peak = f"{report.worst.peak_bytes / 2**30:.1f}"
    text = out.read_text(encoding="utf-8")
    assert f"peak {peak} GiB of 80.0 GiB" in text and f"peak {peak}" in text


def test_the_communication_panel_says_whose_phases_its_bars_are(tmp_path: Path) -> None:
    """The bars are each phase on the stage where it costs most (the report's rows, which no
    one rank runs all of: GPT-3's add to 3.97 s), the title's totals the step's, paced by
    stage 7 (3.86 s); the title read as the bars' sum "on one rank" (an audit)."""
    pytest.importorskip("matplotlib")
    from budget.pipeline import budget_plan
    from budget.units import format_duration

    out = tmp_path / "p.svg"
    code, _, err = _plot(GPT3, out)
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    step = budget_plan(GPT3).step
    assert "communication per phase, each on the stage where it costs most" in text
    assert f"the step, paced by stage {step['pacing_stage']}: " in text
    assert f"{format_duration(step['comm_s'])} (" in text and "on one rank" not in text


def _laid_out(report: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """The memory panel as `plot_report` draws it, laid out: its axes and each of its
    texts with the box it takes on the page (pixels)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from budget.render.plot import draw, panels

    fig, (ax, bottom) = panels(plt)
    try:
        draw(fig, (ax, bottom), report)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        return ax, [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]
    finally:
        plt.close(fig)


def test_the_peak_label_stands_clear_of_the_headroom_label() -> None:
    """Llama 3 405B at 128K peaks 7.9 GiB under its capacity: a peak label centred above the
    bar ran into the headroom arrow's label beside it (a read of the picture); it now ends
    at the bar's centre."""
    from budget.pipeline import budget_plan

    report = budget_plan(Path(__file__).parents[1] / "plans" / "llama3-405b-128k.yaml")
    _, boxes = _laid_out(report)
    peak = next(box for text, box in boxes if text.startswith("peak "))
    free = next(box for text, box in boxes if text.endswith(" GiB free"))
    arrow = next(box for text, box in boxes if text == "")  # the headroom's double arrow
    assert peak.x1 < arrow.x0 and not peak.overlaps(free)  # was 716 against 714 px


@pytest.mark.parametrize("reserved", ["4 GiB", "14 GiB"])
def test_the_capacity_label_stands_clear_of_the_bars_labels(tmp_path: Path, reserved: str) -> None:
    """Llama 3 405B at 128K with 14 GiB reserved peaks 2.2 GiB over its memory, every layer
    bar a little over the line: the capacity label, at the axis, hid the first bars' labels
    (a read of the picture); it now stands where the bars under it end below it, over the
    gradient reduction's. With 4 GiB reserved (7.9 GiB free) it stays at the axis."""
    from budget.pipeline import budget_plan
    from tests.plan_files import variant

    base = Path(__file__).parents[1] / "plans" / "llama3-405b-128k.yaml"
    plan = variant(tmp_path, "p.yaml", ("reserved: 4 GiB", f"reserved: {reserved}"), base=base)
    report = budget_plan(plan)
    assert report.worst.fits is (reserved == "4 GiB")
    ax, boxes = _laid_out(report)
    label = next(box for text, box in boxes if text.startswith("capacity "))
    figures = [box for text, box in boxes if re.fullmatch(r"[0-9.]+", text)]
    assert len(figures) == len(report.worst.timeline) - 1  # every bar but the peak's
    assert not any(label.overlaps(box) for box in figures)
    left = ax.transData.transform((-0.45, 0))[0]
    assert bool(label.x0 == pytest.approx(left)) is (reserved == "4 GiB")


def test_a_serving_plan_is_drawn_over_its_run(tmp_path: Path) -> None:
    """A decode plan's 11.6 s is its whole run (prefill and 511 decode passes), as the report
    and `budget check` call it; the picture called it "the 11.6 s step" and its axis
    "communication per step", which read as one decode step (17.3 ms) (an audit)."""
    pytest.importorskip("matplotlib")
    from budget.pipeline import budget_plan
    from budget.units import format_duration

    plan = GPT3.parent / "llama3-70b-decode.yaml"
    out = tmp_path / "d.svg"
    code, _, err = _plot(plan, out)
    assert code == 0, err
    root = ET.parse(out).getroot()
    labels = {e.text or "" for e in root.iter("{http://www.w3.org/2000/svg}text")}
    run = format_duration(budget_plan(plan).step["time_s"])
    assert any(f"of the {run} run)" in label for label in labels), labels
    assert "communication per run (s)" in labels
    assert not [label for label in labels if re.search(r"\bstep\b", label)]


@pytest.mark.parametrize("name", ["8b for $5k or $10k", r"run $\frac$ x"])
def test_a_plan_name_is_drawn_as_typed(tmp_path: Path, name: str) -> None:
    """Two $ in a plan's name made matplotlib read it as mathtext: the first name lost its
    dollar signs, the second stopped the plot with a parse error (an audit)."""
    pytest.importorskip("matplotlib")
    plan = tmp_path / "dollar.yaml"
    text = GPT3.read_text(encoding="utf-8")
    named = re.sub(r"(?m)^name: .*$", lambda _: f"name: '{name}'", text, count=1)
    plan.write_text(named, encoding="utf-8")
    out = tmp_path / "memory.svg"
    code, _, stderr = _plot(plan, out)
    assert code == 0, stderr
    labels = [
        e.text or "" for e in ET.parse(out).getroot().iter("{http://www.w3.org/2000/svg}text")
    ]
    assert any(label.startswith(f"{name}: stage 0") for label in labels), labels[:3]


@pytest.mark.parametrize("reserved", ["4 GiB", "10 GiB", "14 GiB"])
def test_the_headroom_label_stands_clear_of_the_capacity_line(
    tmp_path: Path, reserved: str
) -> None:
    """An audit: the headroom's label was centred on the gap between the peak and the
    capacity line, so a gap shorter than the label ("4.1 GiB free" on Llama 3 405B at 128K,
    "9.0 GiB over" on GPT-3 without recompute) ran across the line; it now stands level
    above both, and above the next bar's figure, where it would not fit between them."""
    from budget.pipeline import budget_plan
    from tests.plan_files import variant

    base = Path(__file__).parents[1] / "plans" / "llama3-405b-128k.yaml"
    plan = variant(tmp_path, "p.yaml", ("reserved: 4 GiB", f"reserved: {reserved}"), base=base)
    report = budget_plan(plan)
    ax, boxes = _laid_out(report)
    (label,) = [box for text, box in boxes if re.fullmatch(r"[0-9.]+ GiB (free|over)", text)]
    line = ax.transData.transform((0, report.worst.capacity_bytes / 2**30))[1]
    assert label.y0 > line or label.y1 < line  # pixels: not across the line
    figures = [box for text, box in boxes if re.fullmatch(r"[0-9.]+", text)]
    assert not any(label.overlaps(box) for box in figures)


def test_a_serving_pipeline_s_bars_are_summed_over_its_stages(tmp_path: Path) -> None:
    """An audit: Llama 3 70B decoding over pp 2 drew each phase summed over both stages (80
    layers' all-reduces in prefill.attention, as the report's rows are) under a title saying
    "on one rank", which runs 40 of them; the title now says what the report does."""
    pytest.importorskip("matplotlib")
    from tests.plan_files import variant

    base = GPT3.parent / "llama3-70b-decode.yaml"
    plan = variant(tmp_path, "pp2.yaml", ("tp: 8\n  pp: 1", "tp: 4\n  pp: 2"), base=base)
    out = tmp_path / "d.svg"
    code, _, err = _plot(plan, out)
    assert code == 0, err
    root = ET.parse(out).getroot()
    labels = {e.text or "" for e in root.iter("{http://www.w3.org/2000/svg}text")}
    summed = "communication per phase, summed over the stages a pass crosses: "
    assert any(label.startswith(summed) for label in labels), labels
    assert not any("on one rank" in label for label in labels)


def test_the_panels_stand_clear_of_each_other_and_the_peak_box_wraps(tmp_path: Path) -> None:
    """An audit: Llama 3 8B's long instant names ("embedding+head gradients' reduce-scatter"),
    rotated under the memory panel, pushed its axis label into the communication panel's
    title, 10 px of overlap at 120 dpi under a fixed space between the panels; the space now
    grows with them (`_separate`). And one allocation's 120-character name in the peak's box
    made the picture 2,387 px wide for panels of 1,200: names wrap at 60 characters (a
    hand-written transition's, 3.9 GiB at the loss, as the plan once held one)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from budget.pipeline import budget_plan
    from budget.render.plot import _GAP_PX, draw, panels

    plan = Path(__file__).parents[1] / "plans" / "llama3-8b-fsdp.yaml"
    path = tmp_path / "long.yaml"
    name = "log-softmax (fp32) kept for the backward beside the .float() copy, " * 2
    path.write_text(
        plan.read_text(encoding="utf-8")
        + f"transitions:\n  - name: {name.strip()}\n    phase: loss\n"
        + "    tensor: {shape: [micro * seq, vocab], dtype: fp32}\n"
        + "    group: tp\n    from: replicate\n    to: replicate\n    source_alive: false\n",
        encoding="utf-8",
    )
    report = budget_plan(path)
    long_name = max((o.tensor for o in report.worst.peak_overlap[:6]), key=len)
    assert len(long_name) > 100
    fig, (top, bottom) = panels(plt)
    try:
        draw(fig, (top, bottom), report)
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        above, below = top.get_tightbbox(renderer), bottom.get_tightbbox(renderer)
        assert above.y0 - below.y1 >= _GAP_PX - 0.5  # was -10 px
        (box,) = [t for t in top.texts if t.get_text().startswith("alive at the peak")]
        assert max(len(line) for line in box.get_text().splitlines()) <= 13 + 60
        assert box.get_window_extent(renderer).x1 - above.x0 < 1.5 * 1440  # 12 in at 120 dpi
    finally:
        plt.close(fig)


def test_a_plan_that_moves_nothing_is_not_said_to_be_untimed(tmp_path: Path) -> None:
    """An audit: on one GPU, where the report times the step and its communication is 0 s,
    the communication panel read "communication time not computed", which is for a device
    with no rates. It says there is none, of the step's time; a device with no rates keeps
    "not computed"."""
    pytest.importorskip("matplotlib")
    from budget.pipeline import budget_plan
    from budget.units import format_duration
    from tests.plan_files import ROOT, untimed_plan, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    one = variant(
        tmp_path,
        "one.yaml",
        ("  dp: 8\n", "  dp: 1\n"),
        ("global: 512", "global: 64"),
        ("{preset: dgx-a100, nodes: 1}", "{preset: dgx-a100, gpus: 1}"),
        base=base,
    )
    step = budget_plan(one).step
    assert step["comm_s"] == 0.0 and step["time_s"] is not None
    out = tmp_path / "one.svg"
    code, _, err = _plot(one, out)
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert "not computed" not in text
    assert f"no communication: 0 s of the {format_duration(step['time_s'])} step" in text
    untimed = untimed_plan(tmp_path)
    code, _, err = _plot(untimed, tmp_path / "untimed.svg")
    assert code == 0, err
    assert "communication time not computed" in (tmp_path / "untimed.svg").read_text("utf-8")


@contextlib.contextmanager
def _drawn(name: str) -> Iterator[tuple[Any, Any, Any]]:
    """A shipped plan drawn as `budget plot` draws it: the top panel, the figure's renderer
    and the figure, closed after."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from budget.pipeline import budget_plan
    from budget.render.plot import draw, panels

    report = budget_plan(Path(__file__).parents[1] / "plans" / f"{name}.yaml")
    fig, (top, bottom) = panels(plt)
    try:
        draw(fig, (top, bottom), report)
        yield top, fig.canvas.get_renderer(), fig
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", ["llama3-8b-fsdp", "deepseek-moe-16b"])
def test_phase_names_along_the_top_do_not_run_into_each_other(name: str) -> None:
    """An audit (m338): a phase with one instant has a band about one bar wide, and its name
    was centred on it whatever its width: "dp grads" beside "optimizer" read
    "gradsoptimizer", and DeepSeek-MoE's "backward embedding", "dp grads" and "optimizer"
    ran together. A name that would overlap the one before it is lifted a row (two blank
    rows under it); the names of each row stand apart, and the title clears them."""
    with _drawn(name) as (top, renderer, _):
        (names,) = list(top.child_axes)
        labels = [t for t in names.get_xticklabels() if t.get_text()]
        lifted = [t.get_text().endswith("\n\n") for t in labels]
        assert any(lifted)  # these plans have such neighbours
        for row in (False, True):
            boxes = [
                t.get_window_extent(renderer)
                for t, up in zip(labels, lifted, strict=True)
                if up is row
            ]
            for left, right in itertools.pairwise(boxes):
                assert left.x1 <= right.x0, (row, left, right)
        # the panel's title is its left one (`_memory`), not the empty centre one (a review)
        title = top._left_title.get_window_extent(renderer)
        highest = max(t.get_window_extent(renderer).y1 for t in labels)
        assert title.y0 >= highest


@pytest.mark.parametrize("name", ["llama3-8b-tp-loss-gathered", "gpt3-175b"])
def test_the_peaks_box_stands_clear_of_the_legend(name: str) -> None:
    """An audit (m338): the loss-gathered plan's long names wrapped the peak's box to 11
    lines, which, set on the panel's floor and growing up, ran through the legend's
    "parameters" and "reserved" ("48.sereved Adam moments NCCL fp32"). Where it would, it
    hangs from under the legend instead; a short box stays on the floor."""
    with _drawn(name) as (top, renderer, _):
        (box,) = [t for t in top.texts if t.get_text().startswith("alive at the peak")]
        legend = top.get_legend().get_window_extent(renderer)
        assert box.get_bbox_patch().get_window_extent(renderer).y1 <= legend.y0
        hung = name == "llama3-8b-tp-loss-gathered"
        assert box.get_va() == ("top" if hung else "bottom")


def test_the_communication_axis_takes_the_unit_of_its_bars_labels(tmp_path: Path) -> None:
    """An audit, m494: a tiny model's phases move tens of microseconds, labelled "49.2 µs"
    on axis ticks of 0.00 to 0.05 "ms"; the axis now steps to µs as the labels do (and keeps
    ms where its tallest bar is that long: GPT-3's hundreds of milliseconds)."""
    pytest.importorskip("matplotlib")
    text = (GPT3.parent / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    for old, new in (
        ("layers: 24", "layers: 2"),
        ("hidden: 2048", "hidden: 128"),
        ("heads: 16", "heads: 2"),
        ("vocab: 50304", "vocab: 1024"),
        ("seq: 2048", "seq: 128"),
        ("micro: 4", "micro: 1"),
        ("global: 512", "global: 8"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(text, encoding="utf-8")
    for plan, unit in ((tiny, "µs"), (GPT3, "ms")):
        out = tmp_path / f"{plan.stem}.svg"
        code, _, err = _plot(plan, out)
        assert code == 0, err
        labels = {e.text for e in ET.parse(out).getroot().iter("{http://www.w3.org/2000/svg}text")}
        assert f"communication per step ({unit})" in labels, labels
