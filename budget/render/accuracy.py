"""Render the accuracy table (`budget validate-model`) as a rich table, JSON or markdown."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from budget.accuracy import Accuracy, Row

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["accuracy_dict", "accuracy_markdown", "render_accuracy"]

_UNIT = {"step_s": "s/step", "tflops_per_gpu": "TFLOP/s/GPU"}


def accuracy_dict(acc: Accuracy) -> dict[str, Any]:
    """``{runs[{name, gpu, metric, predicted, measured, error, source, note}], mean_abs_error,
    max_abs_error}``; errors are signed fractions, the summary ones absolute."""
    return {
        "runs": [
            {
                "name": r.run.name,
                "gpu": r.run.gpu,
                "metric": r.run.metric,
                "predicted": r.predicted,
                "measured": r.run.measured,
                "error": r.error,
                "source": r.run.source,
                "note": r.run.note,
            }
            for r in acc.rows
        ],
        "mean_abs_error": acc.mean_abs_error,
        "max_abs_error": acc.max_abs_error,
    }


def _cells(r: Row) -> tuple[str, str, str, str, str, str]:
    digits = 2 if r.run.metric == "step_s" else 0
    return (
        r.run.name,
        r.run.gpu,
        _UNIT[r.run.metric],
        f"{r.predicted:,.{digits}f}",
        f"{r.run.measured:,.{digits}f}",
        f"{r.error:+.1%}",
    )


_HEADERS = ("run", "GPU", "metric", "predicted", "measured", "error")


def accuracy_markdown(acc: Accuracy) -> str:
    lines = ["| " + " | ".join(_HEADERS) + " |", "|---|---|---|--:|--:|--:|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in acc.rows]
    lines.append("")
    lines.append(
        f"Mean absolute error {acc.mean_abs_error:.1%}, maximum {acc.max_abs_error:.1%} "
        f"over {len(acc.rows)} runs."
    )
    return "\n".join(lines)


def render_accuracy(console: Console, acc: Accuracy, fmt: str) -> None:
    if fmt == "json":
        console.out(json.dumps(accuracy_dict(acc), indent=2, allow_nan=False), highlight=False)
        return
    if fmt == "markdown":
        console.out(accuracy_markdown(acc), highlight=False)
        return
    table = Table(title="Predicted against published measurements", box=box.SIMPLE_HEAD)
    for i, header in enumerate(_HEADERS):
        table.add_column(header, justify="right" if i >= 3 else "left")
    for r in acc.rows:
        table.add_row(*_cells(r))
    console.print(table)
    console.print(
        f"mean absolute error {acc.mean_abs_error:.1%} · maximum {acc.max_abs_error:.1%} · "
        f"{len(acc.rows)} runs"
    )
