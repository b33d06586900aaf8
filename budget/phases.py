"""The vocabulary of a derived step: allocations, layout transitions, instants, phases.

`step.derive` (training) and `inference.derive` (prefill, decode) describe a step in these
terms; `memory`, `schedule` and `pipeline` only read them. Bytes are integers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

import numpy as np

from budget.collectives import Algorithm
from budget.flops import Work
from budget.placement import Op
from budget.plan.model import GroupKind
from budget.vector import holds, vsum

# with the expert tensor- and data-parallel groups, and hybrid sharding's shard group and
# the group of its copies (`step._hybrid`)
MoveGroup = GroupKind | Literal["etp", "edp", "dp_shard", "dp_replicate"]

HAND_WRITTEN = "hand-written transition"  # the rule of a plan's own `transitions:` moves

# The phases of a training step in the order they run; every phase before "head.wgrad" repeats
# per micro-batch, the rest run once per step after the last backward.
PHASE_ORDER: tuple[str, ...] = (
    "forward.embedding",
    "forward.attention",
    "forward.mlp",
    "forward.moe",
    "pipeline.forward",
    "mtp",
    "loss",
    "backward.moe",
    "backward.mlp",
    "backward.attention",
    "backward.embedding",
    "pipeline.backward",
    "head.wgrad",
    "dp.grads",
    "embedding.grads",
    "optimizer",
)


def pass_of(name: str) -> str:
    """The pass a phase belongs to: "decode" of decode.attention and of a hand-written
    transition's "decode: NAME" (`step._with_transitions`)."""
    return name.split(":")[0].split(".")[0]


def pass_within(name: str) -> str:
    """The pass of a micro-batch a phase runs in: forward (the loss and multi-token
    prediction with it) or backward, a stage send with its pass ("pipeline.backward": a
    stage send of the backward, which goes to the previous stage)."""
    if name in ("loss", "mtp"):
        return "forward"
    return name.split(".")[1] if name.startswith("pipeline.") else pass_of(name)


Category = Literal[
    "params", "grads", "optimizer", "activations", "transient", "kv_cache", "reserved"
]
CATEGORIES: tuple[Category, ...] = (
    "params",
    "grads",
    "optimizer",
    "activations",
    "transient",
    "kv_cache",
    "reserved",
)

# How the activations earlier layers and micro-batches leave saved are named at a peak: what
# a phase carries in, as against what it adds (`budget.render.table` tells them apart).
CARRIED_ACTIVATIONS = "saved activations"
# ... and a transient made before the phase and held through it, carried in as well (its
# name ends "held through the micro-batch", "held through the backward")
HELD_THROUGH = "held through the"
# A window: one micro-batch's embedding backward, its own kernels without a unit's gradient
# passes (`schedule._windows`), which FSDP's first layer's reduce-scatter runs beside
# (`step._first_layer_reduction`)
EMBEDDING_BACKWARD_WINDOW = "@embedding-backward"


@dataclass(frozen=True, slots=True)
class Alloc:
    """Bytes alive at an instant: `count` copies of a `bytes`-sized tensor on one rank."""

    name: str
    category: Category
    bytes: int
    count: int = 1
    placement: str = ""  # e.g. "shard(0) on tp", for the reader

    @property
    def total(self) -> int:
        # one copy, the usual case: no product to form (a sweep's bytes are arrays)
        if type(self.count) is int and self.count == 1:
            return self.bytes
        return self.bytes * self.count


@dataclass(frozen=True, slots=True)
class Move:
    """A layout transition on one group: the collective it implies and its payload.

    `size_bytes` is S, the full logical tensor's bytes (DESIGN.md rule 3); `count` is how
    many times it happens per instance of its phase.
    """

    name: str
    op: Op
    group: MoveGroup
    ranks: int
    dtype: str
    size_bytes: int
    src: str
    dst: str
    count: int = 1
    # What the collective may hide behind (DESIGN.md rule 6), decided here where the
    # dependencies are known and priced in `schedule`: the name of a kernel of the same phase
    # (or "@phase", "@forward-microbatch", "@backward-microbatch"), the share of its time
    # that is usable, the `overlap:` flag that allows it ("" = always allowed) and the rule.
    window: str = ""
    share: float = 1.0
    flag: str = ""
    rule: str = "exposed: nothing to overlap with"
    floor: float = 0.0  # share of the collective that is exposed however long the window
    bucket: bool = False  # the floor is a bucket of its own: its own n·α in full
    # overlapped by pipelining: this many collectives of 1/chunks of the size, each with its
    # own n·α, the last one exposed (`schedule.time_phase`)
    chunks: int = 1
    # the part of the window it hides behind, where moves split one kernel between them (the
    # re-gather behind a backward GEMM's input-gradient half, the reduction behind its
    # weight-gradient half); moves in the same part run one after the other beside it
    part: str = ""
    # launched in this many parts, one as each model chunk of an interleaved stage finishes
    # its last micro-batch (`schedule.time_phase`): the dp reduction and gather; `last_part`
    # is the share of the bytes in the part that waits, model chunk 0's, reduced last and
    # gathered first (None: 1/rounds)
    rounds: Any = 1
    last_part: Any = None
    # a flat algorithm over every rank, each step at the slowest link spanned, where the
    # exchange is one between neighbours (ring attention's K/V); None: the default (ring,
    # across levels as NCCL's channels run it, for an all-reduce the faster of that and
    # NCCL's double binary tree; a broadcast NCCL's ring, an all-to-all its grouped exchange)
    algorithm: Algorithm | None = None
    # runs after every micro-batch's backward though its phase comes after the pipeline
    # (ZeRO-2's reduce-scatter): what of it is exposed lengthens each micro-batch of its
    # stage, so the pipeline's fill and drain wait for it too (`schedule.step_time`)
    each_microbatch: bool = False
    # waited for at its stage's first forward of the next step once that forward's input has
    # arrived (a later 1F1B stage's parameter gather, `step._reduce`): under its overlap flag
    # its exposed part runs in series along the pipeline's fill (`schedule.StageTime.gather_s`)
    after_input: Any = False
    # Transformer Engine's comm-GEMM overlap changes the GEMM it hides behind, where the
    # overlap is on (`schedule.overlapped_gemms`): the GEMM runs as `gemm_splits` kernels
    # (its ``num_splits``), and with `gemm_sms` > 0 on the device's SMs less these for its
    # whole length (``set_sm_margin``), the collective's kernels holding them
    gemm_splits: Any = 1
    gemm_sms: int = 0
    # the busiest rank's bytes each way over the per-rank bytes it is priced at, where the two
    # differ: an all-to-all under routing skew, priced at the rows the busiest rank receives
    # (dispatch) or sends back (combine), sends (or receives) the even share (`step._ep_moves`)
    sent_share: Any = 1.0
    recv_share: Any = 1.0
    # the latency steps (n of n·α) it takes of its own where its chunks ride another move's
    # messages: ring attention's dK/dV, sent with the K/V of every backward step but the
    # last (`step._cp_moves`); None: its algorithm's
    steps: Any = None
    # how many collectives one call runs as, each of size_bytes / calls and each paying its
    # algorithm's latency steps: DeepSpeed reduces a backward's gradients a bucket at a time
    # (`step._deepspeed_buckets`); 1: one collective
    calls: Any = 1
    # runs on a stream of its own beside the next move of its phase whose op this names, which
    # hides it too (`schedule.time_phase`): FSDP's all-reduce across hybrid copies of the
    # first layer's gradients, beside the root unit's reduce-scatter (`step._hybrid`)
    beside: str = ""
    # a stage send's boundary b, priced on its own pair of stages' link, stage b's and
    # stage b + 1's (the last stage's and the first's: an interleaved schedule's wrap), not
    # on the outermost link any pair crosses (`schedule.move_span`, `send_boundary`); an
    # array in a sweep, where a stage class's index is one; None: not a stage send
    boundary: Any = None


def hide(
    move: Move,
    window: str,
    flag: str,
    rule: str,
    share: float = 1.0,
    floor: float = 0.0,
    chunks: int = 1,
    bucket: bool = False,
) -> Move:
    """`move` with its overlap window (see `Move`)."""
    return replace(
        move,
        window=window,
        flag=flag,
        rule=rule,
        share=share,
        floor=floor,
        chunks=chunks,
        bucket=bucket,
    )


@dataclass(frozen=True, slots=True)
class Instant:
    """One moment inside a phase and everything alive at it on one rank."""

    label: str
    live: tuple[Alloc, ...]

    @property
    def total(self) -> int:
        return vsum(a.total for a in self.live)


@dataclass(frozen=True, slots=True)
class Phase:
    """A kind of work a stage repeats `count` times per step, with what it moves."""

    name: str
    count: int
    moves: tuple[Move, ...] = ()
    instants: tuple[Instant, ...] = ()
    works: tuple[Work, ...] = ()  # kernels run once per instance, per rank


@dataclass(frozen=True, slots=True)
class StageStep:
    stage: int
    layers: int
    inflight: float  # micro-batches whose saved activations are alive together, in layers/L_s
    params: int  # parameters held by one rank of this stage before ZeRO sharding
    resident: tuple[Alloc, ...]  # alive for the whole step: states and reserved memory
    phases: tuple[Phase, ...]
    # Stages with the same key run the same kernels and moves (they differ only in what
    # they hold), so their times are computed once; () means "do not share".
    timing_key: tuple[Any, ...] = ()
    # How many stages this one stands for (a sweep derives one stage per timing key: the
    # first, which holds the most micro-batches in flight and so peaks highest).
    copies: int = 1


@dataclass(frozen=True, slots=True)
class Step:
    microbatches: int
    stages: tuple[StageStep, ...]
    params_total: int
    params_per_layer: int


T = TypeVar("T", Alloc, Move, Work)


def when(items: list[T], condition: Any) -> list[T]:
    """`items` where `condition` holds. For one plan (a bool) they are kept or dropped; for
    a sweep (an array over configurations) they are kept with their bytes or counts zeroed
    where the condition fails, so one pass of the engine serves configurations that differ
    in it and every one of them gets the numbers it would get alone."""
    cond = holds(condition)
    if isinstance(cond, bool):
        return items if cond else []
    if cond.all():
        return items
    if not cond.any():
        return []
    masks = _MASKS[-1] if _MASKS else Masks()
    mask = masks.mask(cond)  # an int per configuration, like the counts it scales
    out: list[Any] = []
    for item in items:  # constructors, not `replace`: a sweep calls this thousands of times
        if isinstance(item, Alloc):
            out.append(
                Alloc(
                    item.name,
                    item.category,
                    masks.scaled(item.bytes, mask),
                    item.count,
                    item.placement,
                )
            )
        elif isinstance(item, Work):
            out.append(
                Work(
                    item.name,
                    item.kind,
                    item.flops,
                    item.bytes,
                    masks.scaled(item.count, mask),
                    backward=item.backward,
                    keys=item.keys,
                    unmasked_keys=item.unmasked_keys,
                    attention_pass=item.attention_pass,
                    backward_keys=item.backward_keys,
                    causal=item.causal,
                    launches=item.launches,
                    dtype=item.dtype,
                    sm_share=item.sm_share,
                    dims=item.dims,
                    inner=item.inner,
                    backward_launches=item.backward_launches,
                )
            )
        else:
            out.append(replace(item, count=masks.scaled(item.count, mask)))
    return out


class Masks:
    """The masks `when` makes of a sweep's conditions and the numbers it scales by them,
    kept for one derivation of a step (`masking`). A derivation asks `when` for the same
    tensor under the same condition again and again (each instant of a phase lists what it
    holds, and full recompute's `step._either` masks every saved tensor twice): made once,
    the Llama 3 405B sweep's step of 16,384 layouts held 590 arrays (73 MiB) rather than
    1,126 (140 MiB), and the search faulted 37,000 fresh pages rather than 54,000. The
    same product is the same number, so sharing it changes none (nothing the engine makes
    is written to in place: an `Alloc` is already shared between the instants holding it).
    """

    def __init__(self) -> None:
        self.masks: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}  # by the condition
        # by the identity of the number scaled and of the mask, with the number itself, so
        # that its id is not reused while kept
        self.products: dict[tuple[int, int], tuple[Any, Any]] = {}

    def mask(self, cond: np.ndarray) -> np.ndarray:
        """`cond` as an int per configuration: one array for each distinct condition."""
        key = (cond.shape, cond.tobytes())
        mask = self.masks.get(key)
        if mask is None:
            mask = self.masks[key] = cond.astype(np.int64)
        return mask

    def scaled(self, value: Any, mask: np.ndarray) -> Any:
        """`value` * `mask`, once for each number and mask."""
        key = (id(value), id(mask))
        kept = self.products.get(key)
        if kept is not None and kept[0] is value:
            return kept[1]
        product = value * mask
        self.products[key] = (value, product)
        return product


_MASKS: list[Masks] = []  # the derivations under way (`masking`), innermost last


@contextmanager
def masking() -> Iterator[None]:
    """Share `when`'s masks and masked numbers (`Masks`) until the block ends: a step's
    derivation, after which they are let go with it."""
    _MASKS.append(Masks())
    try:
        yield
    finally:
        _MASKS.pop()
