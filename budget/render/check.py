"""`budget check` output: one line per plan and its failed limits, as a table, JSON or a
markdown summary a CI job can post on a pull request. Invalid plans' problems go to stderr
from the CLI; here they only appear in the JSON and markdown summaries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from budget.errors import one_line, problem_lines
from budget.render import print_wrapped
from budget.render.markdown import code, fence, plain
from budget.report import time_word, time_words
from budget.units import format_bytes, plural

if TYPE_CHECKING:
    from rich.console import Console

    from budget.check import CheckResult, Limits, Verdict
    from budget.errors import Problem

__all__ = ["render_check", "render_validate"]


def render_check(console: Console, result: CheckResult, fmt: str) -> None:
    """Render the gate's outcome on `console` in `fmt` (table, json or markdown): nothing
    where every plan is invalid, whose errors on stderr and exit 2 are all (an audit: one
    bad plan printed an INVALID line, the limits and a tally of none passed; in JSON and
    markdown, a document of it, where the table printed nothing)."""
    if not any(verdict.valid for verdict in result.verdicts):
        return
    if fmt == "json":
        from budget.check import check_to_dict
        from budget.render import dump_document

        console.file.write(dump_document(check_to_dict(result), console.file))
    elif fmt == "markdown":
        console.file.write(check_markdown(result))
    else:
        _table(console, result)


def _figures(verdict: Verdict, limits: Limits) -> str:
    report = verdict.report
    if report is None:
        return ""
    worst = report.worst
    free = worst.headroom_bytes
    text = (
        f"worst stage {worst.stage} peaks at {format_bytes(worst.peak_bytes)} of "
        f"{format_bytes(worst.capacity_bytes)}, "
        + f"{limits.shown_free(free, worst.capacity_bytes)} {'free' if free >= 0 else 'over'}"
    )
    time_s, share = report.step["time_s"], report.step.get("exposed_share")
    if time_s is not None:
        text += f"; {time_word(report.mode)} {limits.shown_step(time_s)}"
    if share is not None:
        text += f", {limits.shown_exposed(share)} exposed communication"
    ttft, tpot = report.step.get("ttft_s"), report.step.get("decode_token_s")
    if ttft is not None:
        text += f"; first token {limits.shown_ttft(ttft)} (every prompt's prefill at once)"
    if tpot is not None:
        text += f", {limits.shown_tpot(tpot)} per output token"
    return text


def _serving(verdict: Verdict) -> bool:
    return verdict.report is not None and verdict.report.step.get("ttft_s") is not None


def _tally(result: CheckResult) -> str:
    total = len(result.verdicts)
    passed = sum(v.passed for v in result.verdicts)
    invalid = sum(not v.valid for v in result.verdicts)
    failed = total - passed - invalid
    parts = [f"{passed} of {plural(total, 'plan')} passed"]
    if failed:
        parts.append(f"{failed} failed")
    if invalid:
        parts.append(f"{invalid} invalid")
    return ", ".join(parts)


def _table(console: Console, result: CheckResult) -> None:
    from rich.markup import escape
    from rich.text import Text

    for verdict in result.verdicts:
        if not verdict.valid:
            # the verdict and the path on one line, unwrapped, for `grep '^FAIL'` in CI logs
            console.print(
                f"[bold red]INVALID[/] {escape(one_line(verdict.file))}: its errors are on stderr",
                soft_wrap=True,
            )
            continue
        mark = "[bold green]PASS[/]" if verdict.passed else "[bold red]FAIL[/]"
        console.print(f"{mark} {escape(one_line(verdict.file))}", highlight=False, soft_wrap=True)
        margin = " " * 5
        print_wrapped(console, _figures(verdict, result.limits), margin, margin, "dim")
        for reason in verdict.reasons:
            line = Text.assemble(("✗ ", "red"), (f"{reason.limit}: ", "bold"), reason.message)
            print_wrapped(console, line, margin + "  ", margin)
        for note in verdict.notes:
            print_wrapped(console, f"– {note}", margin + "  ", margin, "dim")
    print_wrapped(console, "limits: " + "; ".join(result.describe_limits()), style="dim")
    console.print(_tally(result), markup=False, highlight=False)


def check_markdown(result: CheckResult) -> str:
    """A summary for a pull request: a verdict line, one row per plan, then the reasons."""
    icon = "✅" if result.passed else "❌"
    lines = [f"## {icon} budget check: {_tally(result)}", ""]
    # serving latencies get columns when a plan serves (a training plan's read "–")
    serving = any(_serving(v) for v in result.verdicts)
    extra = " TTFT | TPOT |" if serving else ""
    # a training plan's time is its step, a serving plan's its whole run (`time_word`)
    time = time_words(v.report.mode for v in result.verdicts if v.report)
    lines += [
        f"| plan | result | worst stage | peak | capacity | headroom | {time} | exposed comm |"
        + extra,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (2 * serving),
    ]
    for v in result.verdicts:
        report = v.report
        if report is None:
            lines.append(
                f"| {code(v.file, cell=True)} | ⚠️ invalid | | | | | | |" + " |" * (2 * serving)
            )
            continue
        worst = report.worst
        time_s, share = report.step["time_s"], report.step.get("exposed_share")
        cells = [
            code(v.file, cell=True),
            "✅ pass" if v.passed else "❌ fail",
            str(worst.stage),
            format_bytes(worst.peak_bytes),
            format_bytes(worst.capacity_bytes),
            # a shortfall signed as the diff signs it, with a minus, not a hyphen (an audit)
            ("" if (h := worst.headroom_bytes) >= 0 else "−")
            + result.limits.shown_free(h, worst.capacity_bytes),
            "–" if time_s is None else result.limits.shown_step(time_s),
            "–" if share is None else result.limits.shown_exposed(share),
        ]
        if serving:
            ttft, tpot = report.step.get("ttft_s"), report.step.get("decode_token_s")
            cells.append("–" if ttft is None else result.limits.shown_ttft(ttft))
            cells.append("–" if tpot is None else result.limits.shown_tpot(tpot))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Limits: " + "; ".join(result.describe_limits()) + ".", ""]
    for v in result.verdicts:
        if v.reasons:
            lines += [f"### ❌ {code(v.file)}", ""]
            lines += [f"- **{r.limit}**: {plain(r.message)}" for r in v.reasons]
            lines.append("")
        if v.notes:  # limits that do not apply and cautions, none failing the plan (an
            # audit: "Not checked for" read as if a caution had been skipped)
            lines += [f"Notes for {code(v.file)}, none of them failing it:", ""]
            lines += [f"- {plain(note)}" for note in v.notes]
            lines.append("")
        if v.problems:
            lines += [f"### ⚠️ {code(v.file)} is invalid", ""]
            lines += [*fence(problem_lines(v.problems)), ""]
    return "\n".join(lines)


def render_validate(console: Console, outcomes: list[tuple[str, list[Problem]]], fmt: str) -> None:
    """`budget validate`'s outcome: each plan valid or not, with its problems (`problem_lines`,
    which the CLI has also written to stderr). The table lists the valid plans alone, `ok`
    beside each, as the problems are already on stderr."""
    if fmt == "json":
        from budget.render import dump_document

        plans = [
            {"file": file, "valid": not found, "problems": problem_lines(found)}
            for file, found in outcomes
        ]
        valid = all(p["valid"] for p in plans)
        console.file.write(dump_document({"valid": valid, "plans": plans}, console.file))
    elif fmt == "markdown":
        lines = ["| plan | valid |", "|---|---|"]
        # a file name's pipes escaped, as check's own table does (a review: a|b.yaml split)
        lines += [
            f"| {code(file, cell=True)} | {'✅' if not found else '❌'} |"
            for file, found in outcomes
        ]
        lines.append("")
        for file, found in outcomes:
            if found:
                lines += [f"### ⚠️ {code(file)} is invalid", "", *fence(problem_lines(found)), ""]
        console.file.write("\n".join(lines) + "\n")
    else:
        for file, found in outcomes:
            if not found:
                console.file.write(f"{one_line(file)}: ok\n")
