"""Output to a stream that is not UTF-8 (`budget.render.standins`): each character budget prints
has an ASCII stand-in that keeps its meaning, where it printed as ``?`` (an audit: a diff's
``?280 ms`` and ``+83.0% ?``, check's ``step time ? 12 s``, a report's ``267 ?s``), and the
tables stay aligned though a stand-in is wider than its character."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.render.standins import Standins, ascii_str, ascii_text, register, standin
from tests.plan_files import GPT3, ROOT


@pytest.fixture(scope="module")
def wider(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-3 at tp 4 and dp 32: a diff with figures better and worse."""
    text = GPT3.read_text(encoding="utf-8")
    changed = re.sub(r"(?m)^  dp: 16$", "  dp: 32", re.sub(r"(?m)^  tp: 8$", "  tp: 4", text))
    assert changed.count("tp: 4") == 1 and changed.count("dp: 32") == 1
    path = tmp_path_factory.mktemp("plans") / "wider.yaml"
    path.write_text(changed, encoding="utf-8")
    return path


def _peak_change(wider: Path) -> str:
    """The worst-stage peak's change from GPT-3 to `wider`, as the diff rounds it."""
    a, b = (build_report(load_plan(p)).worst.peak_bytes for p in (GPT3, wider))
    return f"{b / a - 1:.1%}"


def _run(encoding: str, columns: int, *words: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": str(columns)}
    env.pop("FORCE_COLOR", None)
    process = subprocess.run(
        [sys.executable, "-m", "budget", *words], capture_output=True, cwd=ROOT, env=env
    )
    # decoded strictly: a byte the encoding lacks would be a failure of its own
    return process.returncode, process.stdout.decode(encoding), process.stderr.decode(encoding)


def _tables(text: str) -> list[list[str]]:
    """Each table's lines: ASCII boxes begin every line with ``+`` or ``|``."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if line[:1] in ("+", "|"):
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def _commands(wider: Path) -> dict[str, tuple[list[str], int]]:
    gpt3 = str(GPT3)
    collective = "collective all-reduce --ranks 16 --size 1GiB --level 8:450GB/s:3us"
    return {
        "report": ([gpt3], 0),
        "diff": (["diff", gpt3, str(wider)], 0),
        "check": (["check", gpt3, "--max-step", "12s"], 1),
        "collective": ([*collective.split(), "--level", "2:50GB/s:5us"], 0),
    }


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", ["report", "diff", "check", "collective"])
def test_no_question_marks_and_every_table_aligned(encoding, columns, command, wider):
    """No ``?`` at all in these outputs (budget prints none of its own in them), every line of
    each table as wide as the others and none wider than the terminal: a stand-in put in after
    rich measured a cell ("≤" as "<=", rich's own "…" cut mark as "...") pushed its row out,
    and one put in after a line was wrapped pushed the line past the width."""
    words, status = _commands(wider)[command]
    code, out, err = _run(encoding, columns, *words)
    assert (code, err) == (status, "")
    assert "?" not in out, out
    assert max(map(len, out.splitlines())) <= columns
    tables = _tables(out)
    assert tables or command == "check", out
    for table in tables:
        assert len({len(line) for line in table}) == 1, "\n".join(table)


def test_a_diff_says_which_way_each_figure_moved(wider):
    """The signs of the deltas and the verdicts, which ``?`` made one: ``−`` is ``-``, ``✓``
    and ``✗`` are ``ok`` and ``bad``, each as wide, so the percentages stay one under the
    other; the legend says so."""
    _, out, _ = _run("ascii", 100, "diff", str(GPT3), str(wider))
    assert "|figure" in out and "delta |" in out and "delta%|" in out
    step = next(line for line in out.splitlines() if line.startswith("|step time"))
    assert re.search(r"\| +-283 ms \| +-1\.5% +ok\|$", step), step
    peak = next(line for line in out.splitlines() if line.startswith("|worst-stage peak"))
    assert re.search(rf"\|\+25\.2 GiB \|\+{re.escape(_peak_change(wider))} bad\|$", peak), peak
    assert "delta = B - A; ok is better, bad is worse" in out
    # the plans' lines wrap where their paths run long (a fresh clone's deeper folder)
    assert "tp 8 x pp 8 x dp 16" in " ".join(out.split()) and "(19.1 s -> 18.8 s)" in out
    summary = next(t for t in _tables(out) if t[1].startswith("|figure"))
    ends = {m.end(1) for line in summary if (m := re.search(r"([+-][\d.]+%) +(?:ok|bad)\|", line))}
    assert len(ends) == 1, "\n".join(summary)  # the percentages end in one column


def test_check_says_which_way_its_limits_go():
    code, out, _ = _run("ascii", 200, "check", str(GPT3), "--max-step", "12s", "--headroom", "5%")
    assert code == 1
    assert "step time <= 12 s" in out and "headroom >= 5% of capacity" in out
    assert "bad max_step: the step takes 19.1 s" in out


def test_a_report_keeps_its_units_and_separators():
    _, out, _ = _run("ascii", 120, str(GPT3))
    assert "gpt3-175b / train / 1,024 GPUs in dgx-a100 = tp 8 x pp 8 x dp 16" in out
    assert re.search(r"\b267 us\b", out) and "3.00 GiB reserved" in out
    assert "activations -> next" in out and "pp i->i+1" in out
    assert "59 / 85 / 96 %" in out and "the n*alpha term" in out


def test_latin_1_keeps_what_it_has():
    """latin-1 has ``µ``, ``×``, ``·`` and the no-break space, not ``−``, ``✗`` or ``≤``."""
    _, out, _ = _run("latin-1", 100, str(GPT3))
    assert "tp 8 × pp 8 × dp 16" in out and "267 µs" in out and "3.00\u00a0GiB" in out
    _, out, _ = _run("latin-1", 100, "check", str(GPT3), "--max-step", "12s")
    assert "step time <= 12 s" in out and "bad max_step" in out


def test_error_lines_get_the_stand_ins_too(tmp_path):
    """stderr, not drawn by rich: ``×`` in a message of the degrees is ``x``."""
    plan = tmp_path / "bad.yaml"
    plan.write_text(
        re.sub(r"(?m)^  tp: 8$", "  tp: 3", GPT3.read_text(encoding="utf-8")), encoding="utf-8"
    )
    code, out, err = _run("ascii", 100, str(plan))
    assert (code, out) == (2, "")
    assert "tp x cp x pp x dp = 3 x 1 x 8 x 16 = 384" in err and "?" not in err


def test_markdown_drops_the_circles_and_keeps_the_marks(wider):
    _, out, _ = _run("ascii", 100, "diff", str(GPT3), str(wider), "-f", "markdown")
    assert f"| bad +25.2 GiB | +{_peak_change(wider)} |" in out
    assert "delta = B - A; ok better, bad worse (less memory and time," in out


def test_json_is_unchanged_by_the_stand_ins():
    """JSON escapes what the stream lacks (`dump_json`): a value is never a stand-in."""
    _, out, _ = _run("ascii", 80, str(GPT3), "-f", "json")
    assert "activations \\u2192 next stage" in out and "->" not in out


def test_a_middle_dot_separates_between_spaces_and_multiplies_between_terms():
    assert ascii_str("a · b", "ascii") == "a / b"
    assert ascii_str("n·α", "ascii") == "n*alpha"
    assert ascii_str("·", "ascii") == "*"


def test_an_unknown_character_is_a_question_mark_a_column():
    """A character budget has no stand-in for (a plan's own name): ``?``, one a column, so
    that a wide one keeps its width in a table."""
    assert standin("é", 0) == "?"
    assert standin("模", 0) == "??"
    assert standin("e\u0301", 1) == ""  # a combining accent: none, as its width
    assert ascii_str("café", "latin-1") == "café"
    assert ascii_str("café", "ascii") == "caf?"


def test_markdown_marks_read_without_their_emoji():
    """The circles beside ✓ and ✗ stand for nothing, and take their space with them; ⚠ and
    the variation selector after it are ``!``."""
    name = register()
    assert "### ⚠️ `a.yaml` is invalid".encode("ascii", name) == b"### ! `a.yaml` is invalid"
    assert "| 🔴 ✗ +3 ms | ❌ fail |".encode("ascii", name) == b"| bad +3 ms | x fail |"


def test_spans_follow_their_characters():
    """A Text's colours stay on the stand-ins of the characters they covered."""
    text = Text.assemble("Δ = B − A; ", ("✓", "green"), " is better, ", ("✗", "red"))
    swapped = ascii_text(text, "ascii")
    assert swapped.plain == "delta = B - A; ok is better, bad"
    styled = {swapped.plain[s.start : s.end]: str(s.style) for s in swapped.spans}
    assert styled == {"ok": "green", "bad": "red"}


def test_the_no_break_space_is_left_to_the_stream():
    """budget's own wrapping reads it (`held_lines`); the stream's handler prints a space."""
    assert ascii_str("3.00\u00a0GiB", "ascii") == "3.00\u00a0GiB"
    name = register()
    assert "3.00\u00a0GiB ≤ 5 µs".encode("ascii", errors=name) == b"3.00 GiB <= 5 us"


def test_a_hook_lays_the_table_out_with_the_stand_ins():
    """The stand-ins before rich measures: a cell "≤" is "<=", its column two wide."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors=register(output=True))
    console = Console(file=stream, width=60, color_system=None)
    console.push_render_hook(Standins("ascii"))
    table = Table("limit", "value")
    table.add_row("≤", "1 µs")
    table.add_row("α", "–")
    console.print(table)
    stream.flush()
    out = stream.buffer.getvalue().decode("ascii")  # type: ignore[attr-defined]
    lines = [line for line in out.splitlines() if line.strip()]
    assert len({len(line) for line in lines}) == 1, out
    assert "<=" in out and "1 us" in out and "alpha" in out and "?" not in out


@pytest.mark.parametrize("columns", [44, 56, 66])
def test_an_ascii_latency_stays_by_its_unit(columns: int) -> None:
    """A review: on an ASCII stream "α 14 µs" prints "alpha 14 us", and "us", which the
    wrapper did not know for a unit, began the next line at 44, 56 and 66 columns."""
    code, out, _ = _run(
        "ascii",
        columns,
        *[
            "collective",
            "all-reduce",
            "--ranks",
            "64",
            "--size",
            "1GiB",
            "--level",
            "8:450GB/s:1us",
        ],
        *["--level", "8:50GB/s:14us"],
    )
    assert code == 0
    assert re.search(r"alpha 1 us\b", out) and re.search(r"alpha 14 us\b", out)
    assert not re.search(r"alpha \d+ *\|?\s*$", out, re.M)  # no figure ends a line alone


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("columns", [44, 120])
def test_the_catalogue_s_notes_wrap_with_their_stand_ins(encoding: str, columns: int) -> None:
    """A review: `presets` wrapped its notes before "α" became "alpha", so lines ran two to
    four columns past the terminal (46 at 44, 123 at 120), which it then wrapped again."""
    code, out, _ = _run(encoding, columns, "presets")
    assert code == 0
    too_wide = [line for line in out.splitlines() if len(line) > columns and line[:1] not in "+|"]
    assert not too_wide
