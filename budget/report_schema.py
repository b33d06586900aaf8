"""The JSON Schema (Draft 2020-12) of every JSON document budget prints.

Shipped inside the package (``budget/schemas/report.schema.json``); the repository's
``schemas/report.schema.json`` links to the same file. Each output has a definition under
``$defs``: ``report`` (a plan), ``check``, ``diff``, ``collective``, ``roofline``,
``search``, ``validate_model`` and ``presets``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any, Literal

__all__ = ["KINDS", "Kind", "report_schema", "validation_errors"]

Kind = Literal[
    "report", "check", "diff", "collective", "roofline", "search", "validate_model", "presets"
]
KINDS: tuple[Kind, ...] = (
    "report",
    "check",
    "diff",
    "collective",
    "roofline",
    "search",
    "validate_model",
    "presets",
)


@cache
def report_schema() -> dict[str, Any]:
    """The schema as shipped."""
    text = files("budget").joinpath("schemas/report.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _validator(kind: Kind | None) -> Any:
    from jsonschema import Draft202012Validator

    schema = dict(report_schema())
    if kind is not None:
        schema.pop("anyOf")
        schema["$ref"] = f"#/$defs/{kind}"
    return Draft202012Validator(schema)


def validation_errors(data: Any, kind: Kind | None = None) -> list[str]:
    """Why `data` is not a valid `kind` output (any output when None); empty when it is."""
    return sorted(
        f"$.{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in _validator(kind).iter_errors(data)
    )
