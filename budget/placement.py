"""Placements on a parallel group and the collective each layout transition implies.

A tensor sits on a group of P ranks as ``shard(dim)`` (a true partition: each rank holds
1/P of dimension `dim`), ``replicate`` (every rank holds the full tensor) or ``partial``
(every rank holds a full-shaped tensor that is one summand of the true value). This is
PyTorch DTensor's vocabulary (Shard, Replicate, Partial); the table of transitions follows
DESIGN.md rule 3 and DTensor's redistribute rules:

    shard → replicate        all-gather
    partial → shard          reduce-scatter
    partial → replicate      all-reduce
    shard(i) → shard(j)      all-to-all
    replicate → shard        local slice, no communication
    replicate → partial      local (keep the value on one rank, zeros elsewhere), none
    shard → partial          illegal: a shard is not a summand of the full tensor
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["shard", "replicate", "partial"]
Op = Literal["all-gather", "reduce-scatter", "all-reduce", "all-to-all", "broadcast", "send-recv"]

_SHARD = re.compile(r"^shard\(([0-9]{1,9})\)$")  # as the plan schema bounds it


class IllegalTransition(ValueError):
    """A from → to pair that no collective implements."""


@dataclass(frozen=True, slots=True)
class Placement:
    kind: Kind
    dim: int | None = None  # the sharded dimension, for shard only

    def __str__(self) -> str:
        return f"shard({self.dim})" if self.kind == "shard" else self.kind

    @classmethod
    def parse(cls, text: str) -> Placement:
        """Read "shard(1)", "replicate" or "partial"."""
        text = text.strip()
        if text in ("replicate", "partial"):
            return cls(text)  # type: ignore[arg-type]
        match = _SHARD.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a placement; use shard(DIM), replicate or partial")
        return cls("shard", int(match[1]))


REPLICATE = Placement("replicate")
PARTIAL = Placement("partial")


def shard(dim: int) -> Placement:
    return Placement("shard", dim)


def collective_for(src: Placement, dst: Placement) -> Op | None:
    """The collective that turns `src` into `dst` on one group (None: local, no traffic).

    Source: DESIGN.md rule 3; PyTorch DTensor `redistribute` (torch/distributed/tensor).
    """
    if src == dst:
        return None
    if src.kind == "shard":
        if dst.kind == "replicate":
            return "all-gather"
        if dst.kind == "shard":
            return "all-to-all"
        raise IllegalTransition(
            f"{src} → {dst} is not a layout transition: a shard is not a summand of the full "
            "tensor, so it cannot become partial without a reduction; did you mean "
            "replicate → partial?"
        )
    if src.kind == "partial":
        return "all-reduce" if dst.kind == "replicate" else "reduce-scatter"
    return None  # replicate → shard slices locally; replicate → partial keeps one summand
