"""The rules of hand-written transitions that need no derived step, checked as the plan
resolves so that their problems come with the rest of the file's (every problem at once):
the phases a plan of each mode has, each tensor's chain (DESIGN.md rule 7), and what a
plan without a pipeline lacks (`pipeline_phase`, `no_stage_to_send_to`). Where else a named phase
is in the step (a send from the stage at the model's end) is checked when it is derived."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from budget.errors import Problem, close_matches
from budget.phases import PHASE_ORDER, pass_within
from budget.placement import IllegalTransition, Op, Placement, collective_for
from budget.plan.model import Mode, Transition

# a transition naming one of these runs once per micro-batch (serving: per pass)
WHOLE_PASSES = ("forward", "backward", "prefill", "decode")
PASSES: dict[Mode, tuple[str, ...]] = {
    "train": ("forward", "backward"),
    "prefill": ("prefill",),
    "decode": ("prefill", "decode"),
}
_SERVING = ("embedding", "attention", "mlp", "moe", "output", "pipeline")
# the phases each mode's step can have (`budget.step`, `budget.inference`), in step order
PHASES: dict[Mode, tuple[str, ...]] = {
    "train": PHASE_ORDER,
    "prefill": tuple(f"prefill.{part}" for part in _SERVING),
    "decode": tuple(f"{run}.{part}" for run in ("prefill", "decode") for part in _SERVING),
}


def known_phase(mode: Mode, name: str) -> bool:
    """Whether a `mode` plan can have the phase `name`: a whole pass, a phase, or a prefix
    of one's dotted name ("dp" → dp.grads)."""
    return name in PASSES[mode] or any(p == name or p.startswith(name + ".") for p in PHASES[mode])


def unknown_phase(mode: Mode, name: str, known: tuple[str, ...] | None = None) -> str:
    """The message for a transition's phase that `mode` plans (or this plan's step, whose
    phases are `known`) do not have."""
    choices = [*PASSES[mode], *(known if known is not None else PHASES[mode])]
    # the nearest, in any case (a user audit, m413: 'Loss' was offered nothing), where the
    # name is no phase of the mode's: one this plan's step lacks is no misspelling
    if known_phase(mode, name):
        near = []
    elif known_phase(mode, name.lower()):  # a prefix in another case: 'DP' (review m417)
        near = [name.lower()]
    else:
        near = close_matches(name.lower(), choices, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"unknown phase {name!r}{hint}; use one of {', '.join(choices)}"


def problem(file: str, tr: Transition, message: str, key: str = "") -> Problem:
    """`message` at the transition `tr`'s key (``.phase``, ``.to``...) in `file`."""
    where = tr.where
    line, col, path = (*where.of(key), where.path) if where else (0, 0, "$.transitions")
    return Problem(file, line, col, path + key, message)


Parsed = tuple[Transition, Placement, Placement, Op | None]


def step_rank(mode: Mode, name: str) -> int:
    """Where the phase `name` (a whole pass, a phase or a prefix of one's dotted name)
    first runs in a `mode` plan's step: the index of its first phase in `PHASES`, after
    every phase where the mode has no such phase."""
    phases = PHASES[mode]
    for i, phase in enumerate(phases):
        if phase == name or phase.startswith(name + "."):
            return i
    return len(phases)


def check_chains(
    file: str,
    mode: Mode,
    transitions: tuple[Transition, ...],
    degrees: Mapping[str, int] | None = None,
) -> tuple[list[Parsed], list[Problem]]:
    """Parse the hand-written transitions, returned in step order (`step_rank`), and find
    the ones that would make a budget cheaper by being wrong (DESIGN.md rule 7). Their
    phases are checked apart (`known_phase`), as a phase reads nothing else of the plan.

    A tensor has a placement on each group, as a DTensor has one per mesh dimension, and a
    transition changes only its group's: the transitions that share a name and a group
    form that placement's chain, in step order (`step_rank`; the plan's order within one
    phase), as the step runs them whatever the file's order: a gradient made partial in
    the backward and "reduced" in a forward listed above it reaches the optimizer still
    partial (an audit); one whose phase the mode lacks is in no chain, being nowhere in
    the step (that is said apart). Each must start where the previous one on its group
    left the tensor, and a tensor sum-partial on a group must be reduced on that group before the
    chain ends, since whatever consumes it next takes it as complete
    (Megatron-LM's sequence-parallel LayerNorm gradients are partial on tp and on dp, and
    reduced on each). A gradient that reaches the optimizer step still partial has skipped
    its reduction. With the groups' `degrees`, a dimension sharded on two groups at once
    must divide by the product of their degrees (`co_sharded`).
    """
    problems: list[Problem] = []
    parsed: list[Parsed] = []
    last: dict[tuple[str, str], tuple[Transition, Placement]] = {}
    first: dict[str, Transition] = {}  # each tensor's first transition, in step order
    # in step order, the file's within a phase (a stable sort); returned in that order, which
    # the step adds them in
    ordered = sorted(transitions, key=lambda tr: step_rank(mode, tr.phase))
    nesting = _Nesting(ordered, mode)
    for tr in ordered:
        try:
            src, dst = Placement.parse(tr.src), Placement.parse(tr.dst)
            op = collective_for(src, dst)
        except (ValueError, IllegalTransition) as error:
            problems.append(problem(file, tr, str(error)))
            continue
        if not known_phase(mode, tr.phase):  # said apart; where it runs is unknown
            parsed.append((tr, src, dst, op))
            continue
        origin = first.setdefault(tr.name, tr)
        if _unlike(origin, tr):
            problems.append(problem(file, tr, _another_tensor(origin, tr), ".tensor"))
        before = last.get((tr.name, tr.group))
        if before is not None and before[1] != src:
            message = (
                f"{tr.name!r} starts from {src} on {tr.group}, but the transition before it "
                f"on {tr.group} left it {before[1]} ("
                + (
                    "listed above it in the same phase)"
                    if before[0].phase == tr.phase
                    else f"in {before[0].phase}, which the step runs first)"
                )
            )
            problems.append(problem(file, tr, message, ".from"))
        if dst.kind == "partial" and tr.phase.startswith("optimizer"):
            message = (
                f"{tr.name!r} reaches the optimizer step sum-partial on {tr.group}: the "
                "gradient reduction is missing; reduce it with partial → replicate "
                "(all-reduce) or partial → shard(0) (reduce-scatter)"
            )
            problems.append(problem(file, tr, message, ".to"))
        strided = nesting.move(tr, src, dst)
        if strided is not None:
            problems.append(problem(file, tr, strided, ".from"))
        last[tr.name, tr.group] = (tr, dst)
        parsed.append((tr, src, dst, op))
    for (name, _), (tr, dst) in last.items():
        if dst.kind == "partial" and not tr.phase.startswith("optimizer"):
            message = (
                f"{name!r} is left sum-partial on {tr.group} and would be consumed as if "
                "complete: add its reduction (partial → replicate or partial → shard)"
            )
            problems.append(problem(file, tr, message, ".to"))
    if degrees is not None:
        problems += _unevenly_co_sharded(file, mode, parsed, degrees)
    return parsed, problems


class _Nesting:
    """Which of a tensor's shards of one dimension on several groups lies inside which, as far
    as its chain says, so that a gather of the outer one first is refused.

    A dimension split on a group and then, piece by piece, on another (replicate → shard(k)
    on tp while shard(k) on dp, or partial → shard(k), or shard(j) → shard(k)) leaves rank
    (d, t) the block d·tp + t: the later split is inside the earlier. Gathering the inner one
    (tp) gives each rank its whole block of the outer (shard(k) on dp); gathering the outer
    one first gives it every tp-th block, which is no shard(k) on tp (DTensor's
    ``_StridedShard``), so DTensor's redistribute reshards: it replicates the inner group
    first, then the outer, then slices the inner again (``_gen_transform_infos``,
    torch/distributed/tensor/_redistribute.py: "(Shard(0), Shard(0)) -> (Replicate(),
    Shard(0))" needs resharding). Priced as one gather of the outer group, such a
    transition moved the inner group's share of the bytes over the outer group's link (an
    audit: 24 MiB over InfiniBand where DTensor sends 192 MiB there and 56 MiB over NVLink).
    A tensor that starts sharded on one dimension over several groups has no order the
    chain says (FSDP2 under tensor parallelism holds its weights so, the FSDP shard inside
    the tensor-parallel one); each of its gathers is taken to find its group the inner."""

    def __init__(self, ordered: list[Transition], mode: Mode) -> None:
        self.at: dict[tuple[str, str], Placement] = {}  # each group's placement of a tensor
        for tr in ordered:  # before its first transition there: that transition's source
            if known_phase(mode, tr.phase):
                try:
                    self.at.setdefault((tr.name, tr.group), Placement.parse(tr.src))
                except ValueError:
                    continue  # said where it is parsed
        # (tensor, group) -> the groups whose shard of the same dimension lies inside its own
        self.inside: dict[tuple[str, str], dict[str, Transition]] = {}

    def move(self, tr: Transition, src: Placement, dst: Placement) -> str | None:
        """Take `tr` (src → dst on its group); why it leaves a strided shard, or None."""
        name, group = tr.name, tr.group
        message = None
        if src.kind == "shard" and dst != src:  # dimension src.dim leaves this group
            inner = {
                g: by
                for g, by in self.inside.get((name, group), {}).items()
                if self.at.get((name, g)) == src
            }
            if inner:
                g, by = next(iter(inner.items()))
                where = by.where.path if by.where else "an earlier transition"
                message = (
                    f"{name!r} is {src} on {g} inside its {src} on {group} (split after it, "
                    f"in {where}): taking dimension {src.dim} off {group} first leaves each "
                    f"rank every {g}-th block, not {src} on {g}; DTensor reshards it, so "
                    f"write that: {g} {src} → replicate first, then this, then {g} "
                    f"replicate → {src} (a local slice) if it stays split there"
                )
            self.inside.pop((name, group), None)
            for nested in self.inside.values():
                nested.pop(group, None)
        if dst.kind == "shard" and src != dst:  # split inside the groups holding that dimension
            for (other, g), at in self.at.items():
                if other == name and g != group and at == dst:
                    self.inside.setdefault((name, g), {})[group] = tr
        self.at[name, group] = dst
        return message


def _unlike(a: Transition, b: Transition) -> bool:
    """Whether `a` and `b` give one tensor different dtypes or shapes; a sweep's shapes,
    arrays over its layouts (`search.reshaped`), are compared where the plan resolves, and
    the search drops the layouts where they differ (`search._shaped`)."""
    if a.dtype != b.dtype:
        return True
    numbers = all(isinstance(d, int) for d in (*a.shape, *b.shape))
    return numbers and bool(shapes_differ(a.shape, b.shape))


def shapes_differ(a: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """Whether two shapes of one tensor differ: a bool, or where their dimensions are a
    sweep's arrays, one for each layout; shapes of different ranks always do."""
    if len(a) != len(b):
        return True
    differ: Any = False
    for x, y in zip(a, b, strict=True):
        differ = differ | (x != y)  # an array where either is one
    return differ


def _another_tensor(origin: Transition, tr: Transition) -> str:
    """Why `tr` cannot move the tensor `origin` placed first: a name is one tensor, whose
    placements its transitions change (the schema), so a chain that continued from another
    shape's or dtype's placement counted the other's bytes as held (an audit: a [16, 16]
    tensor's replicate stood for the source of a [65536, 65536] one, 8 GiB off the peak)."""

    def tensor(t: Transition) -> str:
        return f"[{', '.join(f'{d:,}' for d in t.shape)}] {t.dtype}"

    where = origin.where.path if origin.where else "an earlier transition"
    return (
        f"{tr.name!r} is {tensor(tr)} here but {tensor(origin)} in {where}: a name is one "
        "tensor, whose shape and dtype its transitions keep; a cast or a reshape makes "
        "another tensor, so give it its own name"
    )


def _unevenly_co_sharded(
    file: str, mode: Mode, parsed: list[Parsed], degrees: Mapping[str, int]
) -> list[Problem]:
    """A problem for each dimension sharded on groups whose degrees' product does not
    divide it (`co_sharded`)."""
    problems = []
    for placing, dim, on in co_sharded(mode, parsed):
        ranks = math.prod(degrees[group] for group in on)
        # the first transition whose own shape the degrees do not divide, if any
        tr = next((t for t in placing if t.shape[dim] % ranks), None)
        if tr is not None:
            over = " × ".join(f"{group} {degrees[group]}" for group in on)
            message = (
                f"{tr.name!r} is shard({dim}) on {' and '.join(on)} at once: dimension {dim} "
                f"of size {tr.shape[dim]:,} splits over {over} = {ranks:,} ranks, which does "
                "not divide evenly"
            )
            problems.append(problem(file, tr, message))
    return problems


def co_sharded(
    mode: Mode, parsed: list[Parsed]
) -> list[tuple[tuple[Transition, ...], int, tuple[str, ...]]]:
    """Where a tensor is shard(d) on two groups or more at once, in the step order of `parsed`
    (`check_chains`'): (the transitions that placed it so on those groups, the first time it
    is, d, the groups). Each group's placement before its first transition is that
    transition's source, as the step walks them (`step._with_transitions`); each placing
    transition's own shape is the one split (a review: another group's, of other dimensions,
    was read, and raised where it had fewer). Its dimension d is split over the product of
    their degrees, which must divide it as one group's degree must (DESIGN.md rule 1: a
    shard is a partition); each degree dividing it alone is not enough (an audit: [8, 65536]
    shard(0) on dp 2 and tp 8 held half a row a rank). Transitions of a phase the plan's
    mode lacks run nowhere, and are left out."""
    walked = [(tr, src, dst) for tr, src, dst, _ in parsed if known_phase(mode, tr.phase)]
    placed: dict[tuple[str, str], tuple[Placement, Transition]] = {}
    for tr, src, _ in walked:
        placed.setdefault((tr.name, tr.group), (src, tr))
    # each placing set once: a tensor co-sharded again later, by transitions of another
    # shape, is checked again (a review: [128, h] then [16, h] on dp 16 x tp 8 passed)
    found: dict[tuple[str, int, tuple[str, ...], tuple[int, ...]], tuple[Transition, ...]] = {}

    def look(tensor: str) -> None:
        groups: dict[int, dict[str, Transition]] = {}
        for (name, group), (at, by) in placed.items():
            if name == tensor and at.kind == "shard" and at.dim is not None:
                groups.setdefault(at.dim, {})[group] = by
        for dim, on in groups.items():
            if len(on) > 1:
                names = tuple(sorted(on))
                placing = tuple(on[group] for group in names)
                found.setdefault((tensor, dim, names, tuple(map(id, placing))), placing)

    for tr, _, dst in walked:
        look(tr.name)  # as the transition finds the tensor, then as it leaves it
        placed[tr.name, tr.group] = (dst, tr)
        look(tr.name)
    return [(by, dim, on) for (_, dim, on, _), by in found.items()]


# the groups of a stage that ep's, drawn from tp × cp × dp (the expert grid), may share ranks with
_BESIDE_EP = ("tp", "cp", "dp")


def placed_beside_ep(mode: Mode, parsed: list[Parsed]) -> list[tuple[Transition, str]]:
    """Where a tensor is split or summed (shard or partial) on ep and on tp, cp or dp at
    once, in the step order of `parsed`: (the transition that first makes it so, the other
    group). ep's group is drawn from the stage's tp × cp × dp ranks (Megatron-Core's expert
    grid, `topology._expert_order`), so the two may hold the same GPUs, where a DTensor's
    mesh dimensions never do (a DeviceMesh is an n-d array of distinct ranks): Mixtral's
    ep 8 is its dp 8 (an audit, m426), and a tensor shard(0) on both was priced as split 64
    ways over 8 GPUs. Whether they share ranks is the layout's (`ep_overlap`)."""
    walked = [(tr, src, dst) for tr, src, dst, _ in parsed if known_phase(mode, tr.phase)]
    at: dict[tuple[str, str], Placement] = {}
    for tr, src, _ in walked:
        at.setdefault((tr.name, tr.group), src)
    found: dict[tuple[str, str], Transition] = {}
    for tr, _, dst in walked:
        before = dict(at)  # as the transition finds the tensor, then as it leaves it
        at[tr.name, tr.group] = dst
        for state in (before, at):
            on_ep = state.get((tr.name, "ep"))
            if on_ep is None or on_ep.kind == "replicate":
                continue
            for group in _BESIDE_EP:
                other = state.get((tr.name, group))
                if other is not None and other.kind != "replicate":
                    found.setdefault((tr.name, group), tr)
    return [(tr, group) for (_, group), tr in found.items()]


def ep_overlap(tr: Transition, group: str, shared: tuple[int, ...], degrees: str) -> str:
    """Why `tr`'s tensor cannot be placed on ep and on `group` at once where their groups
    share the ranks `shared` (`placed_beside_ep`)."""
    ranks = ", ".join(map(str, shared[:4])) + (", …" if len(shared) > 4 else "")
    return (
        f"{tr.name!r} is split or summed on ep and on {group} at once, but with {degrees} "
        f"the two groups share ranks [{ranks}]: ep's is drawn from tp × cp × dp (the expert "
        "grid), so the two placements cut the same GPUs' data twice, no partition; keep it "
        "on one of them (an expert's gradient is reduced over its expert-data-parallel "
        "ranks, which no transition's group names)"
    )


def pipeline_phase(mode: Mode, phase: str) -> str | None:
    """Why a plan without a pipeline (pp 1) has no phase `phase` (a stage send's:
    ``pipeline.forward``, serving's ``decode.pipeline``), or None. Checked as the plan
    resolves, however broken the rest of the transition, so that it comes with the file's
    other problems (a review: it came only once they were mended, from the derived step)."""
    if "pipeline" not in phase.split("."):
        return None
    names = tuple(p for p in PHASES[mode] if "pipeline" not in p.split("."))
    return unknown_phase(mode, phase, names) + " (pp 1: no stage sends)"


def no_stage_to_send_to(name: object, phase: str, pp: int) -> str:
    """Why a placement kept on pp (a send to the next stage, or in the backward to the
    previous one) in `phase` is nowhere: the phase runs only on the stage at the model's end,
    which has no such neighbour, or with pp 1 on the only stage (said as the plan resolves;
    with a pipeline, where the derived step puts the phase)."""
    way, side = ("previous", "first") if pass_within(phase) == "backward" else ("next", "last")
    where = "the only stage" if pp == 1 else f"the {side} stage"
    return (
        f"{name!r} keeps its placement on pp, a send to the {way} stage, but {phase} runs "
        f"only on {where}, which has no {way} stage to send to"
    )
