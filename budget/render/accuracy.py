"""Render the accuracy table (`budget validate-model`) as a rich table, JSON or markdown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from budget.accuracy import Accuracy, Row
from budget.render import print_wrapped
from budget.render.table import printable

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["accuracy_dict", "accuracy_markdown", "render_accuracy"]

_UNIT = {
    "step_s": "s/step",
    "tflops_per_gpu": "TFLOP/s/GPU",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "peak_bytes": "GiB at peak",
    "latency_s": "ms/batch",
}
_REFERENCE = "Reference, layout incomplete (not counted in the mean or maximum)"
_MEMORY = "Peak memory per GPU against published measurements"
_SERVING = "Serving: a static batch's latency against published measurements"
# short enough to title a table at 80 columns on one line; what it is follows under it
_DIAGNOSTIC = "Diagnostic, not counted: chosen after the table was seen"
_DIAGNOSTIC_SAID = (
    "Chosen after the scored table was seen: to part the training stack from the device, "
    "the H100 rows' five models, GPUs and sequence length from the same README's A100 "
    "table; and the step times the three peak-memory tests log on H100, CI runs in "
    "deterministic mode (the GPT tests with the fused attention's deterministic backward, "
    "no gradient-accumulation fusion and 16 SMs held off LayerNorm) logging norms every "
    "step, which no plan can say. Not counted in the mean or maximum."
)


# each metric's unit, said beside it in the JSON (an audit, m483: TFLOP/s where every other
# FLOP rate of the JSON is in FLOP/s, said nowhere): the sources' own units
METRIC_UNITS = {
    "step_s": "s",
    "tflops_per_gpu": "TFLOP/s",
    "tokens_per_s_per_gpu": "tokens/s",
    "peak_bytes": "bytes",
    "latency_s": "s",
}


def _row_dict(r: Row) -> dict[str, Any]:
    return {
        "name": r.run.name,
        "gpu": r.run.gpu,
        "stack": r.run.stack,
        "metric": r.run.metric,
        "unit": METRIC_UNITS[r.run.metric],
        # bytes are integers, as everywhere in the JSON
        "predicted": round(r.predicted) if r.run.metric == "peak_bytes" else r.predicted,
        "measured": r.run.measured,
        "error": r.error,
        "source": r.run.source,
        "note": r.run.note,
        "peak_bytes": r.peak_bytes,
        "capacity_bytes": r.capacity_bytes,
        "fits": r.fits,
    }


def accuracy_dict(acc: Accuracy) -> dict[str, Any]:
    """``{runs[{name, gpu, stack, metric, predicted, measured, error, source, note}],
    mean_abs_error, max_abs_error, by_gpu[{gpu, runs, mean_abs_error, max_abs_error}],
    by_stack[{gpu, stack, runs, ...}], reference[...], diagnostic[...]}``; errors are signed
    fractions, the summary ones absolute and over ``runs`` only (``reference`` rows have an
    incomplete published layout, ``diagnostic`` rows were chosen after the scored ones were
    seen)."""
    return {
        "runs": [_row_dict(r) for r in acc.rows],
        "mean_abs_error": acc.mean_abs_error,
        "max_abs_error": acc.max_abs_error,
        "by_gpu": [
            {
                "gpu": part.rows[0].run.gpu,
                "runs": len(part.rows),
                "mean_abs_error": part.mean_abs_error,
                "max_abs_error": part.max_abs_error,
            }
            for part in acc.by_gpu()
        ],
        "by_stack": [
            {
                "gpu": part.rows[0].run.gpu,
                "stack": part.rows[0].run.stack,
                "runs": len(part.rows),
                "mean_abs_error": part.mean_abs_error,
                "max_abs_error": part.max_abs_error,
            }
            for part in acc.by_stack()
        ],
        "reference": [_row_dict(r) for r in acc.reference],
        "diagnostic": [_row_dict(r) for r in acc.diagnostic],
        **({"memory": _scored_apart(acc.peak_memory())} if acc.memory else {}),
        **({"serving": _scored_apart(acc.serving_latency())} if acc.serving else {}),
    }


def _scored_apart(part: Accuracy) -> dict[str, Any]:
    """A table scored on its own (peak memory, serving latency): its runs, mean and maximum."""
    return {
        "runs": [_row_dict(r) for r in part.rows],
        "mean_abs_error": part.mean_abs_error,
        "max_abs_error": part.max_abs_error,
    }


def _memory_summary(memory: Accuracy) -> str:
    return (
        "Error = predicted / measured − 1: negative is a peak the engine puts below what "
        "the run allocated. Measured: torch.cuda.max_memory_allocated on the last rank "
        "(the last pipeline stage) once Adam's moments exist; predicted: the engine's peak "
        "of that stage, with nothing reserved (the CUDA context and NCCL's buffers are "
        "outside PyTorch's allocator). "
        f"Mean absolute error {memory.mean_abs_error:.1%}, maximum "
        f"{memory.max_abs_error:.1%} over {len(memory.rows)} runs."
    )


def _serving_summary(serving: Accuracy) -> str:
    return (
        "Error = predicted / measured − 1: negative is a batch the engine finishes sooner "
        "than the run did. Measured: FasterTransformer's time for one generate call of a "
        "static batch (the prefill over the input, whose last position gives the first "
        "token, then output − 1 decoder passes), FP16 with top-p sampling on A100 80GB "
        "nodes; predicted: the report's time for the batch. "
        f"Mean absolute error {serving.mean_abs_error:.1%}, maximum "
        f"{serving.max_abs_error:.1%} over {len(serving.rows)} runs."
    )


def _summary(acc: Accuracy) -> str:
    """Mean and maximum over all scored runs, then over each GPU generation's, then over
    each generation and training stack's."""

    def parts(groups: tuple[Accuracy, ...], stack: bool) -> str:
        return "; ".join(
            f"{part.rows[0].run.gpu}{' ' + part.rows[0].run.stack if stack else ''} "
            f"{part.mean_abs_error:.1%} mean, {part.max_abs_error:.1%} maximum "
            f"({len(part.rows)} runs)"
            for part in groups
        )

    return (
        "Error = predicted / measured − 1, so a prediction faster than the run is negative "
        "in s/step and positive in tokens/s or TFLOP/s. "
        f"Mean absolute error {acc.mean_abs_error:.1%}, maximum {acc.max_abs_error:.1%} "
        f"over {len(acc.rows)} runs. By GPU: {parts(acc.by_gpu(), False)}. By GPU and "
        f"training stack: {parts(acc.by_stack(), True)}.{_misses(acc.rows)}"
    )


def _misses(rows: tuple[Row, ...]) -> str:
    """The runs of one table that ran though the engine's memory model puts them over
    their memory, said under that table (an audit: a reference run's was said under the
    scored table, as if one of the scored runs had been over)."""
    over = [r for r in rows if not r.fits]
    if not over:
        return ""
    gib = 2**30
    runs = "; ".join(
        f"{r.run.name} (worst stage {r.peak_bytes / gib:.1f} GiB of {r.capacity_bytes / gib:.1f})"
        for r in over
    )
    said = "These runs ran" if len(over) > 1 else "This run ran"
    them = "them over their" if len(over) > 1 else "it over its"
    return f" {said}, where the memory model puts {them} GPUs' memory: {runs}."


def _cells(r: Row, stack: bool = True) -> tuple[str, ...]:
    """A row's cells; without `stack`, neither the GPU, the stack nor the metric (a group's
    heading row names them, `_rich_table`)."""
    digits = {"step_s": 2, "peak_bytes": 2, "latency_s": 1}.get(r.run.metric, 0)
    # bytes shown in GiB, a batch's seconds in milliseconds
    scale = {"peak_bytes": 2**30, "latency_s": 1e-3}.get(r.run.metric, 1)
    return (
        r.run.name,
        *((r.run.gpu, r.run.stack, _UNIT[r.run.metric]) if stack else ()),
        f"{r.predicted / scale:,.{digits}f}",
        f"{r.run.measured / scale:,.{digits}f}",
        f"{r.error:+.1%}",
    )


_HEADERS = ("run", "GPU", "stack", "metric", "predicted", "measured", "error")


def _markdown_table(rows: tuple[Row, ...]) -> list[str]:
    lines = ["| " + " | ".join(_HEADERS) + " |", "|---|---|---|---|--:|--:|--:|"]
    return lines + ["| " + " | ".join(_cells(r)) + " |" for r in rows]


def accuracy_markdown(acc: Accuracy) -> str:
    lines = _markdown_table(acc.rows)
    lines.append("")
    lines.append(_summary(acc))
    lines += ["", *_notes(acc.rows)]
    for title, rows, summary in _sections(acc):
        lines += ["", f"{title}:", ""]
        lines += _markdown_table(rows)
        lines += ["", summary] if summary else []
        lines += ["", *_notes(rows)]
    return "\n".join(lines)


def _notes(rows: tuple[Row, ...]) -> list[str]:
    """Each run's layout, as a bullet (an audit: the scored rows' were in the JSON and the
    plan files alone)."""
    return [f"- {r.run.name}: {r.run.note}." for r in rows if r.run.note]


def _sections(acc: Accuracy) -> tuple[tuple[str, tuple[Row, ...], str], ...]:
    """The tables shown below the scored one, each with its title and the sentence under it
    ("" for none), when not empty: reference, diagnostic, peak memory, then serving."""
    memory = _memory_summary(acc.peak_memory()) if acc.memory else ""
    serving = _serving_summary(acc.serving_latency()) if acc.serving else ""
    sections = (
        (_REFERENCE, acc.reference, ""),
        (_DIAGNOSTIC, acc.diagnostic, _DIAGNOSTIC_SAID),
        (_MEMORY, acc.memory, memory),
        (_SERVING, acc.serving, serving),
    )
    return tuple(
        (title, rows, (summary + _misses(rows)).strip())
        for title, rows, summary in sections
        if rows
    )


def _rich_table(title: str, rows: tuple[Row, ...], wide: bool) -> Table:
    """The rows, a break between GPU and training-stack groups. The GPU, the stack and the
    metric get columns of their own only where the longest run name still fits beside them
    (112 columns); narrower, each group (a metric of its own, where a GPU and stack had two)
    opens with a heading row that names them, so that a run's name keeps its line."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    headers = [h for h in _HEADERS if wide or h not in ("GPU", "stack", "metric")]
    for header in headers:
        table.add_column(header, justify="right" if header in _HEADERS[4:] else "left")

    def group(i: int) -> tuple[str, ...]:
        run = rows[i].run
        return (run.gpu, run.stack) if wide else (run.gpu, run.stack, _UNIT[run.metric])

    for i, r in enumerate(rows):
        opens = i == 0 or group(i - 1) != group(i)
        if opens and i:
            table.add_section()
        if opens and not wide:
            table.add_row(" · ".join(group(i)), *[""] * (len(headers) - 1), style="bold")
        table.add_row(*_cells(r, stack=wide))
    return table


_TITLE = "Predicted against published measurements"


def render_accuracy(console: Console, acc: Accuracy, fmt: str) -> None:
    if fmt == "json":
        from budget.render import dump_document

        console.file.write(dump_document(accuracy_dict(acc), console.file))
        return
    if fmt == "markdown":  # a heading as every markdown output has; the README has its own
        console.out(
            f"## budget validate-model\n\n{_TITLE}:\n\n{accuracy_markdown(acc)}", highlight=False
        )
        return
    wide = console.width >= 112
    console.print(printable(console, _rich_table(_TITLE, acc.rows, wide)))
    console.print(_summary(acc), highlight=False)
    console.print()
    _print_notes(console, acc.rows)
    for title, rows, summary in _sections(acc):
        console.print()
        console.print(printable(console, _rich_table(title, rows, wide)))
        if summary:
            console.print(summary, highlight=False)
            console.print()
        _print_notes(console, rows)


def _print_notes(console: Console, rows: tuple[Row, ...]) -> None:
    """Each run's layout under its table, as `_notes` gives it in markdown."""
    for r in rows:
        if r.run.note:
            print_wrapped(console, f"{r.run.name}: {r.run.note}")
