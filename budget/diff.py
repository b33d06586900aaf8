"""Two plans side by side: what changed in the plan, and what that does to the budget.

The plan side flattens the resolved `Plan` dataclasses into dotted keys ("parallel.tp") and
lists the keys whose values differ. The budget side pairs the two reports' figures (memory
per stage, the step, each phase) as `Delta`s that know whether lower or higher is better.
Stages are paired by index; phases by name; hand-written transitions as a line diff pairs
lines (`transition_slots`). Everything here returns data; the renderers in
`budget.render.diff` decide how it looks.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from budget.collectives import OPS
from budget.errors import every_one
from budget.plan.model import AttentionRate, BandwidthRamp, GemmCurve, Plan
from budget.plan.resolve import TRAINING_ONLY
from budget.report import PhaseRow, Report, StageRow, time_word, to_dict
from budget.units import format_flop_count, format_flops, plural

__all__ = [
    "Change",
    "Delta",
    "PlanDiff",
    "Row",
    "diff_files",
    "diff_plans",
    "diff_to_dict",
    "flatten",
]

Scalar = str | int | float | bool | None
Value = Scalar | list[Scalar]
Unit = Literal["bytes", "seconds", "share", "tokens/s", "count"]
# "neither": a figure that explains the others (a phase's calls, a stage's layers) and is
# no better or worse by itself
Better = Literal["lower", "higher", "neither"]
Verdict = Literal["better", "worse", "same", "n/a"]
NEGLIGIBLE = 1e-4  # a relative change below this is no change for a verdict (0.01 %)

# keys that differ between two files of the same plan without changing it
_IGNORED = {"file"}
_IGNORED_LEAVES = {"where"}


@dataclass(frozen=True, slots=True)
class Change:
    """One plan key whose resolved value differs; None on the side where it is absent."""

    key: str
    a: Value
    b: Value


@dataclass(frozen=True, slots=True)
class Delta:
    """One figure in both reports. None where a side does not have it (a missing stage or
    phase, or a step time that was not computed)."""

    metric: str
    unit: Unit
    better: Better
    a: float | None
    b: float | None
    comparable: bool = True  # False: the two sides measure different things (modes differ)

    @property
    def absolute(self) -> float | None:
        if self.a is None or self.b is None:
            return None
        return self.b - self.a

    @property
    def relative(self) -> float | None:
        """(b − a) / |a|; None when a is 0 or a side is missing."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return (self.b - self.a) / abs(self.a)

    @property
    def changed(self) -> bool:
        return self.a != self.b

    @property
    def verdict(self) -> Verdict:
        """Better or worse by the metric's direction; a change under `NEGLIGIBLE` of A's
        figure is the same (a user audit: +520 KiB of 30 GiB and +363 ns of a second were
        flagged worse, at +0.0 %)."""
        change = self.absolute
        if change is None or not self.comparable:
            return "n/a"
        relative = self.relative
        if change == 0 or (relative is not None and abs(relative) < NEGLIGIBLE):
            return "same"
        if self.better == "neither":
            return "n/a"
        return "better" if (change < 0) == (self.better == "lower") else "worse"

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "better": self.better,
            "a": self.a,
            "b": self.b,
            "delta": self.absolute,
            "relative": self.relative,
            "verdict": self.verdict,
        }


@dataclass(frozen=True, slots=True)
class Row:
    """A stage or a phase (by name) and its figures in both plans. A stage row pairs stage
    `stages[0]` of A with `stages[1]` of B (None where a side lacks it): by index when the
    plans have as many stages, else by role, ``first`` and ``last`` (`_stage_rows`)."""

    key: str
    in_a: bool
    in_b: bool
    deltas: tuple[Delta, ...]
    stages: tuple[int | None, int | None] = (None, None)

    @property
    def changed(self) -> bool:
        return not (self.in_a and self.in_b) or any(d.changed for d in self.deltas)


@dataclass(frozen=True, slots=True)
class PlanDiff:
    changes: tuple[Change, ...]
    summary: tuple[Delta, ...]  # worst-stage memory and the step
    stages: tuple[Row, ...]
    phases: tuple[Row, ...]
    stage_counts: tuple[int, int]
    fits: tuple[bool, bool]
    modes: tuple[str, str] = ("train", "train")
    # collectives both plans run (by phase and name) that B prices with another algorithm
    # than A: (phase, collective, A's, B's); a default can change under a plan (NCCL's ring
    # or its tree, by size and span), which no plan key shows
    algorithms: tuple[tuple[str, str, str, str], ...] = ()
    # what one step of each does (`work_of`): tokens per training step, or a serving run's
    # sequences, prompt and generated tokens; per-step figures compare only where they match
    work: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    pacing: tuple[int | None, int | None] = (None, None)  # the stage each step waits on
    # the format whose dense peak each side's MFU is a share of (`schedule.mfu_format`)
    mfu_formats: tuple[str, str] = ("bf16", "bf16")
    mfu_peaks: tuple[float, float] = (0.0, 0.0)  # those peaks, FLOP/s per GPU
    gpus: tuple[int, int] = (0, 0)  # each plan's world size (0: not said)
    # whether each side's step time is computed (a device with no peak FLOP/s or bandwidth)
    timed: tuple[bool, bool] = (True, True)

    @property
    def one_peak(self) -> bool:
        """Whether both sides' MFUs are shares of one peak: the same format's on devices of
        the same rate (an audit: an A100's 59.3 % read as better than an H100's 43.5 %, at
        43 % of its tokens/s). A side whose step is not computed has no MFU to be a share of
        anything, so there are no two peaks to warn of (an audit: "B's of 0 FLOP/s")."""
        if not all(self.timed):
            return True
        return self.mfu_formats[0] == self.mfu_formats[1] and self.mfu_peaks[0] == self.mfu_peaks[1]

    @property
    def identical(self) -> bool:
        """No plan key and no figure differs."""
        return (
            not self.changes
            and not any(row.changed for row in (*self.stages, *self.phases))
            and not any(d.changed for d in self.summary)
        )

    @property
    def note(self) -> str | None:
        """What to keep in mind reading the deltas: plans of different modes, whose step,
        tokens/s and MFU measure different things, and how stages were paired when the
        plans have different pipeline depths."""
        notes = []
        untimed = [side for side, timed in zip("AB", self.timed, strict=True) if not timed]
        if untimed:
            whose, are, its = (
                ("A's and B's step times", "are", "their")
                if len(untimed) == 2
                else (f"{untimed[0]}'s step time", "is", "its")
            )
            notes.append(
                f"{whose} {are} not computed (the device section has no peak FLOP/s or memory "
                f"bandwidth), so {its} times, tokens/s and MFU have no figure to compare; "
                "memory and the bytes sent do"
            )
        ma, mb = self.modes
        if ma != mb:
            notes.append(
                f"A is a {ma} plan and B a {mb} plan: their step, tokens/s and MFU measure "
                "different things, so those deltas are not like for like"
            )
        na, nb = self.stage_counts
        wa, wb = self.work
        fa, fb = self.mfu_formats
        ga, gb = self.gpus
        if ma == mb and ga != gb:
            notes.append(_gpus_note(ma, ga, gb, mfu=self.one_peak))
        if ma == mb and wa != wb:
            notes.append(_work_note(ma, wa, wb, mfu=self.one_peak, per_gpu=ga != gb))
        pa, pb = self.pacing
        if na == nb and pa is not None and pb is not None and pa != pb:
            notes.append(
                f"the step is paced by stage {pa} in A and by stage {pb} in B: its compute, "
                "communication and exposed time are each its pacing stage's, so they carry "
                "no verdict; the step time does"
            )
        if na != nb:  # (a decode plan's last stage has no loss: an audit, m529)
            notes.append(
                f"A has {plural(na, 'pipeline stage')} and B has {nb}, so their stages hold "
                "different layers: the first stage of each (the embedding, the most "
                "micro-batches in flight) and the last (the output layer, and a training "
                "plan's loss) are compared, and the worst "
                "stage of each is in the step table"
            )
        if ma == mb and not self.one_peak:
            ra, rb = (format_flops(peak) for peak in self.mfu_peaks)
            peaks = (
                f"the {fa} peak and B's of the {fb} peak"
                if fa != fb
                else f"a GPU's {fa} peak of {ra} and B's of {rb}"
            )
            rate = "tokens/s per GPU" if self.gpus[0] != self.gpus[1] else "tokens/s"
            notes.append(
                f"A's MFU is a share of {peaks}: shares of different peaks, so MFU carries no "
                f"verdict; {rate} does"
            )
        if self.algorithms:
            moved = ", ".join(f"{c} in {p} ({a} → {b})" for p, c, a, b in self.algorithms[:4])
            more = len(self.algorithms) - 4
            notes.append(
                f"B runs {plural(len(self.algorithms), 'collective')} with another algorithm: "
                + moved
                + (f" and {more} more" if more > 0 else "")
            )
        return "; ".join(notes) or None


def work_of(report: Report) -> tuple[int, ...]:
    """What one step (or serving run) of a plan does: (tokens,) of a training step, global
    batch × sequence; (sequences, prompt, generated) of a serving run."""
    layout = report.layout
    if report.mode == "train":
        return (int(layout["global"]) * int(layout["seq"]),)
    # a prefill generates nothing: its generate sizes the KV cache, not the work (a review:
    # two prefills apart in generate alone lost their verdicts)
    generated = int(layout["generate"]) if report.mode == "decode" else 0
    return (int(layout["sequences"]), int(layout["prompt"]), generated)


def _gpus_note(mode: str, a: int, b: int, mfu: bool = True) -> str:
    """Why a whole job's rate (and a training step's times and bytes) do not compare
    between plans on other numbers of GPUs, and what still does (`_summary`)."""
    on = f"A runs on {plural(a, 'GPU')} and B on {b:,}"
    still = f"tokens/s per GPU, memory{', MFU' if mfu else ''} and the exposed share do"
    if mode != "train":  # a serving latency stays a latency
        return f"{on}: tokens/s is the whole job's, so it carries no verdict; {still}"
    return (
        f"{on}: the step's and each phase's times and the bytes a rank sends are not like "
        f"for like, nor is the whole job's tokens/s, so they carry no verdict; {still}"
    )


def _work_note(
    mode: str, a: tuple[int, ...], b: tuple[int, ...], mfu: bool = True, per_gpu: bool = False
) -> str:
    """Why per-step figures do not compare: B's step does other work than A's; the shares
    and rates that still do (MFU only where both sides' are of one peak, `mfu`), unless the
    plans' GPUs differ too (`per_gpu`), whose note says them."""
    if mode == "train":
        (ta,), (tb,) = a, b
        times = f"{tb / ta:.3g}×" if ta else "other"
        did = f"B's step runs {times} A's tokens ({tb:,} against {ta:,})"
    else:
        (sb, pb, gb), (sa, pa, ga) = b, a
        did = f"B serves {sb:,} sequences of {pb:,} + {gb:,} tokens where A serves {sa:,} of "
        did += f"{pa:,} + {ga:,}"
    times = f"the {time_word(mode)}'s and each phase's times and the bytes they send"
    if per_gpu:  # what still compares is said once, in the GPUs' note (`_gpus_note`)
        return f"{did}: {times} are not like for like either"
    return (
        f"{did}: {times} are not like for like, so they carry no verdict; memory, tokens/s"
        f"{', MFU' if mfu else ''} and the exposed share do"
    )


def flatten(value: Any, prefix: str = "") -> dict[str, Value]:
    """A resolved plan (or any nest of dataclasses, dicts and tuples) as dotted keys.

    Tuples of scalars stay one value (a list); tuples of (name, number) pairs become keys
    under their names ("device.flops.bf16"); other tuples are indexed ("topology.levels.0").
    """
    if prefix == "device.attention." and value == ():
        return {"device.attention": "none measured"}
    if prefix == "collectives.":  # (op, algorithm) pairs: an op a plan does not name reads
        # "default" (NCCL's ring, or its tree where faster), not "–" (a review)
        named = dict(value)
        return {f"collectives.{op}": named.get(op, "default") for op in OPS}
    if prefix == "transitions.":  # keyed as a plan file spells them; none: no keys at all
        return {
            f"transitions.{i}.{key}": item
            for i, t in enumerate(value)
            for key, item in (
                ("name", t.name),
                ("phase", t.phase),
                ("tensor.shape", list(t.shape)),
                ("tensor.dtype", t.dtype),
                ("group", t.group),
                ("from", t.src),
                ("to", t.dst),
                ("source_alive", t.source_alive),
                ("count", t.count),
            )
        }
    calibration = _calibration(value)
    if calibration is not None:
        return {prefix.rstrip("."): Calibration(calibration, value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        out: dict[str, Value] = {}
        for key, item in value.items():
            if key in _IGNORED_LEAVES or (not prefix and key in _IGNORED):
                continue
            out |= flatten(item, f"{prefix}{key}.")
        return out
    if isinstance(value, tuple | list):
        if not value:  # nothing written: no key, where a table of no rows (a device's
            # `flops` without a format) read "device.flops – → []" beside its removed rows
            return {}
        if all(_is_pair(item) for item in value):
            return {f"{prefix}{name}": number for name, number in value}
        if all(_is_scalar(item) for item in value):
            return {prefix.rstrip("."): list(value)}
        out = {}
        for i, item in enumerate(value):
            out |= flatten(item, f"{prefix}{i}.")
        return out
    if prefix in _UNSET_AT_ZERO and value == 0:  # not given: no key, read "–" as `flops`'
        return {}
    return {prefix.rstrip("."): value}


# device keys whose 0 stands for "not given" (no bandwidth: no times; SMs not known), not a
# value: a device with no rates read "2.039 TB/s → 0 B/s" beside "312 TFLOP/s → –" (an audit)
_UNSET_AT_ZERO = {"device.memory_bandwidth.", "device.sms."}


class Calibration(str):
    """A calibration shown as one line but compared whole: two ramps or curves that read
    alike and differ in a sample point are still a change."""

    whole: Any

    def __new__(cls, text: str, whole: Any) -> Calibration:
        made = super().__new__(cls, text)
        made.whole = whole
        return made

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Calibration):
            return bool(self.whole == other.whole)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


def _calibration(value: Any) -> str | None:
    """A device's or link's measured calibration (GEMM curve, attention rates, bandwidth
    ramp) as one line, so that a preset against a written device reads as "the curve
    changed" rather than dozens of sample points; None for anything else. Attention rates
    read at 8,192 keys, as `budget presets` shows them."""
    if isinstance(value, GemmCurve):
        own = "".join(f"; {d} {f:.1%}" for d, f, _ in value.by_dtype)
        half = format_flop_count(value.half_flops)
        # K₀ (`efficiency.inner_factor`): a GEMM's loop over K runs at half rate at K = K₀
        k0 = value.inner_half
        depth = f", its loop at half rate at K = {k0:g}" if k0 else ""
        return f"{value.peak_fraction:.1%} of peak, half of it at {half}{depth}{own}"
    if isinstance(value, BandwidthRamp):
        return f"by message size: {value.source}"
    if isinstance(value, tuple) and value and all(isinstance(v, AttentionRate) for v in value):
        return "; ".join(
            f"{r.kernel} {float(r.at(8192)):.1%}" + (" (derived)" if r.derived else "")
            for r in value
        )
    return None


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int | float)
    )


# resolved field names that differ from the key a plan file spells
_PLAN_KEYS = {
    "batch.global_batch": "batch.global",
    "model.window": "model.sliding_window.size",
    "model.window_layers": "model.sliding_window.layers",
    # a preset's name: the key the plan file wrote (a written device or topology has none)
    "model.name": "model.preset",
    "device.name": "device.preset",
    "topology.name": "topology.preset",
}


# what a serving plan does not read (`plan.resolve` refuses it written in one)
_TRAINING_ONLY = ("batch.seq", "batch.micro", *TRAINING_ONLY)


def plan_changes(a: Plan, b: Plan) -> tuple[Change, ...]:
    """The keys whose resolved values differ, named as a plan file spells them, section by
    section in A's order: each section's preset first, then its keys in A's order with B's
    extra ones after them, and hand-written transitions by name (``transitions[NAME].FIELD``)
    in the merged order of both plans (`transition_labels`)."""
    *labels, merged = transition_labels(a, b)
    fa, fb = (
        {_PLAN_KEYS.get(k, k): v for k, v in _relabelled(flatten(p), s).items()}
        for p, s in zip((a, b), labels, strict=True)
    )
    counted_in_nodes = _nodes(a) is not None and _nodes(b) is not None
    for flat, plan in ((fa, a), (fb, b)):
        # where the model, device and topology come from: none, not "", where a section
        # writes its own (a review: preset → hf_config showed only the preset going)
        for key in ("model.preset", "model.hf_config", "device.preset", "topology.preset"):
            flat[key] = flat.get(key) or None
        # only the keys the plan's mode reads, as its file spells them: a serving plan's
        # batch is sequences, prompt and generate; it has no ZeRO, recompute or optimizer
        if plan.mode == "train":
            for key in ("batch.prompt", "batch.generate"):
                flat.pop(key, None)
        else:
            flat["batch.sequences"] = flat.pop("batch.global", None)
            for key in _TRAINING_ONLY:
                flat.pop(key, None)
        # a preset's size in its own nodes, where both plans are whole nodes of a preset
        # (a user audit: nodes 64 → 128 read as topology.gpus 512 → 1,024, a key the file
        # did not write; one side in nodes and the other in GPUs read as two changes)
        if counted_in_nodes:
            flat.pop("topology.gpus", None)
            flat["topology.nodes"] = _nodes(plan)
        if plan.parallel.zero != 3:  # which PyTorch FSDP prices only ZeRO 3's shards
            flat.pop("parallel.fsdp", None)
        # the expert layers' tp as priced, which follows tp unless written (an audit: a tp
        # change moved it unsaid); none for a model without experts
        flat["parallel.etp"] = plan.parallel.expert_tp if plan.model.experts else None
        # a preset's GEMMs run on its measured curve, not the flat fraction the dataclass
        # defaults to, which the row showed beside a written one (a user audit, m434:
        # "80.0% → 50.0%" where A ran at up to 74.1 %); none where the curve is used
        if plan.device.gemm is not None:
            flat["device.matmul_efficiency"] = None
        # the learned position table's rows, 0 standing for batch.seq; none for other
        # positions (a table the model does not have)
        m = plan.model
        learned = m.position == "learned"
        flat["model.max_positions"] = (m.max_positions or plan.batch.seq) if learned else None
        # no window, not size 0; its layers, spelled out
        window = plan.model.window
        flat["model.sliding_window.size"] = window or None
        flat["model.sliding_window.layers"] = _sliding_layers(plan) if window else None
    keys = list(dict.fromkeys([*fa, *fb]))
    # B's extra keys beside their section's (topology.levels.2 after levels.1), each
    # section's preset first: what a file changed, then what it brings; transitions in
    # the merged order of both plans
    rank = {label: i for i, label in enumerate(merged)}
    # (section, not its preset, transition slot) once per key: a transition's name may
    # hold a dot, so its section is read from the whole key
    placed = {}
    for k in keys:
        named = TRANSITION_KEY.fullmatch(k)
        section = "transitions" if named else k.split(".")[0]
        preset = k.count(".") == 1 and k.endswith(".preset")
        placed[k] = (section, not preset, rank[f"transitions[{named[1]}]"] if named else 0)
    sections = {s: i for i, s in enumerate(dict.fromkeys(p[0] for p in placed.values()))}
    keys.sort(key=lambda k: (sections[placed[k][0]], *placed[k][1:]))
    return tuple(Change(k, fa.get(k), fb.get(k)) for k in keys if _differs(fa.get(k), fb.get(k)))


def _differs(a: object, b: object) -> bool:
    """Two resolved values differ, a boolean and a count too: ``defer_embedding_wgrad: true``
    (every micro-batch) against ``1`` (the first), which Python holds equal (review m371:
    the diff read "Plan changes: none" beside a 95 ms difference)."""
    return a != b or isinstance(a, bool) != isinstance(b, bool)


def _nodes(plan: Plan) -> int | None:
    """The nodes of a topology preset (`topology.nodes`); None for a written topology or a
    preset sized in GPUs that are no whole number of its nodes."""
    from budget.catalog import TOPOLOGIES

    preset = TOPOLOGIES.get(plan.topology.name) if plan.topology.name else None
    if preset is None or plan.topology.gpus % preset.gpus_per_node:
        return None
    return plan.topology.gpus // preset.gpus_per_node


# a transition's key: "transitions[NAME].FIELD", NAME as the plan names it
TRANSITION_KEY = re.compile(
    r"transitions\[(.*)\]\.(name|phase|tensor\.shape|tensor\.dtype|group|from|to|source_alive|count)"
)


def transition_labels(a: Plan, b: Plan) -> tuple[list[str], list[str], list[str]]:
    """Each plan's transitions named for the diff's keys by their slot (`transition_slots`):
    "transitions[logits-gather]", A's name where A has the slot, and "#2" after a name a
    slot before took; then every label in the merged order. Keys by index matched neither
    file where a transition was added before another (a review)."""
    slots = transition_slots(a, b)
    names: dict[int, str] = {}
    for plan, own in zip((b, a), slots[::-1], strict=True):  # A's name wins a shared slot
        for t, slot in zip(plan.transitions, own, strict=True):
            names[slot] = t.name
    label: dict[int, str] = {}
    for slot in sorted(names):  # unique, also where a plan names one "g #2" beside two g's
        name, n = names[slot], 1
        while (
            candidate := f"transitions[{name}" + (f" #{n}]" if n > 1 else "]")
        ) in label.values():
            n += 1
        label[slot] = candidate
    return [label[s] for s in slots[0]], [label[s] for s in slots[1]], list(label.values())


def transition_slots(a: Plan, b: Plan) -> tuple[list[int], list[int]]:
    """Each plan's transitions numbered by their place in the merged list of both, as a
    line diff pairs lines: the same names in the same order pair up, a run renamed or
    rewritten in place pairs by position, and the rest are one side's only. Deleting the
    middle one of three then reads as one removal, where pairing by index read as the last
    two changed and one removed (a user audit)."""
    names_a, names_b = ([t.name for t in p.transitions] for p in (a, b))
    slots: tuple[list[int], list[int]] = ([], [])
    start = 0
    match = difflib.SequenceMatcher(None, names_a, names_b, autojunk=False)
    for _, i1, i2, j1, j2 in match.get_opcodes():
        na, nb = i2 - i1, j2 - j1
        shift = 0 if na == nb else na  # paired in place, or A's run before B's
        slots[0].extend(range(start, start + na))
        slots[1].extend(range(start + shift, start + shift + nb))
        start += max(na, nb) if na == nb else na + nb
    return slots


def _relabelled(flat: dict[str, Value], labels: list[str]) -> dict[str, Value]:
    """`flatten`'s keys with each transition's index replaced by its label."""

    def key(k: str) -> str:
        m = re.fullmatch(r"transitions\.(\d+)\.(.+)", k)
        return f"{labels[int(m[1])]}.{m[2]}" if m else k

    return {key(k): v for k, v in flat.items()}


def _sliding_layers(plan: Plan) -> str:
    """Which layers slide, losslessly and short: "every layer", or "40 of 80: 0–78 by 2"
    (runs of evenly spaced layer indices)."""
    flags = plan.model.sliding
    ids = [i for i, f in enumerate(flags) if f]
    if len(ids) == len(flags):
        return "every layer"
    runs: list[str] = []
    i = 0
    while i < len(ids):
        step = ids[i + 1] - ids[i] if i + 1 < len(ids) else 1
        j = i
        while j + 1 < len(ids) and ids[j + 1] - ids[j] == step:
            j += 1
        if j == i:
            runs.append(str(ids[i]))
        else:
            runs.append(f"{ids[i]}–{ids[j]}" + (f" by {step}" if step > 1 else ""))
        i = j + 1
    return f"{len(ids)} of {len(flags)}: {', '.join(runs)}"


def _states(s: StageRow) -> int:
    return s.params_bytes + s.grads_bytes + s.optimizer_bytes


_STAGE: tuple[tuple[str, Unit, Better, Callable[[StageRow], float]], ...] = (
    # the stage's own layers, the multi-token prediction modules apart, as the reports'
    # tables write them (a user audit, m488: "layers 6 → 7" beside "5 + 1 MTP → 6 + 1 MTP")
    ("layers", "count", "neither", lambda s: s.layers - s.mtp_layers),
    ("mtp_layers", "count", "neither", lambda s: s.mtp_layers),
    ("inflight", "count", "neither", lambda s: s.inflight),
    ("states_bytes", "bytes", "lower", _states),
    ("activations_bytes", "bytes", "lower", lambda s: s.activations_bytes),
    ("transient_bytes", "bytes", "lower", lambda s: s.transient_bytes),
    ("kv_cache_bytes", "bytes", "lower", lambda s: s.kv_cache_bytes),
    # what device.reserved adds, so that the rows add up to the peak (an audit)
    ("reserved_bytes", "bytes", "lower", lambda s: s.reserved_bytes),
    ("peak_bytes", "bytes", "lower", lambda s: s.peak_bytes),
    ("headroom_bytes", "bytes", "higher", lambda s: s.headroom_bytes),
)
_PHASE: tuple[tuple[str, Unit, Better, Callable[[PhaseRow], float | None]], ...] = (
    ("count", "count", "neither", lambda p: p.count),
    ("payload_bytes", "bytes", "lower", lambda p: p.payload_bytes),
    ("peak_bytes", "bytes", "lower", lambda p: p.peak_bytes if p.peak_stage is not None else None),
    ("compute_s", "seconds", "lower", lambda p: p.compute_s),
    ("comm_s", "seconds", "lower", lambda p: p.comm_s),
    ("exposed_s", "seconds", "lower", lambda p: p.exposed_s),
)
_STEP: tuple[tuple[str, Unit, Better], ...] = (
    ("time_s", "seconds", "lower"),
    ("compute_s", "seconds", "lower"),
    ("comm_s", "seconds", "lower"),
    ("exposed_comm_s", "seconds", "lower"),
    ("exposed_share", "share", "lower"),
    ("overlap_slowdown_s", "seconds", "lower"),
    ("bubble_s", "seconds", "lower"),
    ("after_s", "seconds", "lower"),
    ("tokens_per_s", "tokens/s", "higher"),
    ("mfu", "share", "higher"),
)


def _stage_rows(a: Report, b: Report) -> tuple[Row, ...]:
    """Stage i of A beside stage i of B when the plans have as many stages. Otherwise
    their stages hold different layers and a pairing by index compares unlike things (A's
    stage 1 of 8 against B's stage 1 of 16 holds twice its layers): the first stages, which
    hold the embedding and the most micro-batches in flight, and the last, which hold the
    loss, are paired instead."""
    na, nb = len(a.stages), len(b.stages)
    if na == nb:
        pairs = [(str(i), i, i) for i in range(na)]
    else:
        pairs = [("first", 0, 0), ("last", na - 1, nb - 1)]
    return tuple(_row(key, a.stages[i], b.stages[j], _STAGE, stages=(i, j)) for key, i, j in pairs)


def _row(
    key: str,
    ra: Any,
    rb: Any,
    metrics: Any,
    stages: tuple[int | None, int | None] = (None, None),
    unlike: frozenset[str] = frozenset(),
) -> Row:
    """One row of deltas for `key`, from A's and B's records (None where a side lacks it);
    the metrics in `unlike` measure different work on the two sides (no verdict)."""
    deltas = tuple(
        Delta(
            metric,
            unit,
            better,
            None if ra is None else get(ra),
            None if rb is None else get(rb),
            metric not in unlike,
        )
        for metric, unit, better, get in metrics
    )
    return Row(key, ra is not None, rb is not None, deltas, stages)


# a step's figures that add up over what the step does: they compare only between steps
# that do the same work (`work_of`); shares, rates and memory compare regardless
_PER_STEP = frozenset(
    {"time_s", "compute_s", "comm_s", "exposed_comm_s", "overlap_slowdown_s", "bubble_s"}
    | {"after_s", "payload_bytes", "exposed_s"}
)


# the step's figures that are its pacing stage's (`schedule.paced_by`), not the step's
_PACED = frozenset({"compute_s", "comm_s", "exposed_comm_s", "exposed_share", "overlap_slowdown_s"})


def _same_steps(a: Report, b: Report) -> bool:
    """Whether two plans' per-step times and bytes compare: one mode and the same work a
    step, and for training as many GPUs (an audit: 8 GPUs against 64 read tokens/s +447.9 %
    ✓ where each GPU did 31.5 % less, MFU ✗ beside it); a serving latency stays a latency."""
    world = a.world_size == b.world_size or a.mode != "train"
    return a.mode == b.mode and work_of(a) == work_of(b) and world


def _phase_rows(a: Report, b: Report) -> tuple[Row, ...]:
    unlike = frozenset() if _same_steps(a, b) else _PER_STEP
    pa = {p.name: p for p in a.phases}
    pb = {p.name: p for p in b.phases}
    names = list(pa)
    for i, name in enumerate(pb):  # B's extra phases after their predecessor in B
        if name not in names:
            before = list(pb)[i - 1] if i else None
            names.insert(names.index(before) + 1 if before in names else len(names), name)
    return tuple(_row(name, pa.get(name), pb.get(name), _PHASE, unlike=unlike) for name in names)


def _summary(a: Report, b: Report) -> tuple[Delta, ...]:
    wa, wb = a.worst, b.worst
    out = [
        Delta("peak_bytes", "bytes", "lower", wa.peak_bytes, wb.peak_bytes),
        Delta("headroom_bytes", "bytes", "higher", wa.headroom_bytes, wb.headroom_bytes),
    ]
    # a training step and a serving pass (or prefill and decode) are different things: the
    # figures are shown, but neither side is better (`PlanDiff.note`)
    like = a.mode == b.mode
    same_work = _same_steps(a, b)
    # a step's compute and communication are its pacing stage's: two stages' apart say
    # nothing of either (a DeepSeek-V3 audit, m509: dropping the MTP module, which changes
    # the last stage alone, read as +28 % communication ✗, stage 15's against stage 1's)
    paced = len(a.stages) != len(b.stages) or _pacing(a) == _pacing(b)
    # on other numbers of GPUs the whole job's rate does not compare, its rate per GPU does
    world = a.world_size == b.world_size
    comparable = {
        # an fp8 plan's MFU is of the fp8 peak, twice the bf16 one: an audit read a bf16
        # plan's 49.1 % against an fp8 one's 32.6 % as worse, where its tokens/s rose 32.8 %
        "mfu": like and (a.mfu_format, a.mfu_peak) == (b.mfu_format, b.mfu_peak),
        _RATE: like and world,
    }
    out += [
        Delta(
            k,
            u,
            bt,
            a.step.get(k),
            b.step.get(k),
            (same_work and (paced or k not in _PACED))
            if k in _PER_STEP
            else comparable.get(k, like) and (paced or k not in _PACED),
        )
        for k, u, bt in _STEP
        # the reduction and optimizer after a training pipeline, and its bubble: serving has
        # neither (its pipeline carries one batch stage after stage, each stage idle while
        # the others run: an audit, m546, read "pipeline bubble 0 s" as a free pipeline)
        if k not in ("after_s", "bubble_s") or "train" in (a.mode, b.mode)
    ]
    if a.causal_mfu is not None or b.causal_mfu is not None:
        # beside MFU, where either report prints it (an audit: a long context's causal MFU
        # moved 3.6 points where the diff showed only PaLM's count, 7.9)
        at = next(i for i, d in enumerate(out) if d.metric == "mfu") + 1
        causal = (a.step.get("mfu_causal"), b.step.get("mfu_causal"))
        out.insert(at, Delta("mfu_causal", "share", "higher", *causal, comparable["mfu"]))
    if not world:  # beside the whole job's rate
        at = next(i for i, d in enumerate(out) if d.metric == _RATE) + 1
        metric = f"{_RATE}_per_gpu"
        out.insert(at, Delta(metric, "tokens/s", "higher", _per_gpu(a), _per_gpu(b), like))
    out += [  # serving's own figures, where either side serves
        Delta(k, "seconds", "lower", a.step.get(k), b.step.get(k))
        for k in ("ttft_s", "decode_token_s")
        if a.step.get(k) is not None or b.step.get(k) is not None
    ]
    return tuple(out)


_RATE = "tokens_per_s"


def _per_gpu(report: Report) -> float | None:
    """A report's tokens/s per GPU of its world."""
    rate = report.step.get(_RATE)
    return None if rate is None else float(rate) / report.world_size


def diff_reports(a: Report, b: Report, changes: tuple[Change, ...] = ()) -> PlanDiff:
    """Pair two reports' figures: worst stage and step, each stage by index, each phase by
    name."""
    return PlanDiff(
        changes=changes,
        summary=_summary(a, b),
        stages=_stage_rows(a, b),
        phases=_phase_rows(a, b),
        stage_counts=(len(a.stages), len(b.stages)),
        fits=(a.fits, b.fits),
        modes=(a.mode, b.mode),
        algorithms=_algorithm_changes(a, b),
        work=(work_of(a), work_of(b)),
        pacing=(_pacing(a), _pacing(b)),
        mfu_formats=(a.mfu_format, b.mfu_format),
        mfu_peaks=(a.mfu_peak, b.mfu_peak),
        gpus=(a.world_size, b.world_size),
        timed=(a.step.get("time_s") is not None, b.step.get("time_s") is not None),
    )


def _pacing(report: Report) -> int | None:
    """The stage a training step waits on (`schedule.paced_by`); None for serving."""
    stage = report.step.get("pacing_stage")
    return None if stage is None or report.mode != "train" else int(stage)


def _algorithm_changes(a: Report, b: Report) -> tuple[tuple[str, str, str, str], ...]:
    """Collectives of the same phase and name in both reports priced with different
    algorithms, in B's order, each once."""
    theirs = {(p.name, c.name): c.algorithm for p in a.phases for c in p.collectives}
    moved = {
        (p.name, c.name, theirs[(p.name, c.name)], c.algorithm): None
        for p in b.phases
        for c in p.collectives
        if theirs.get((p.name, c.name), c.algorithm) != c.algorithm
    }
    return tuple(moved)


def diff_plans(a: Plan, b: Plan) -> tuple[Report, Report, PlanDiff]:
    """Budget both resolved plans and compare them; a BudgetError carries both plans'
    problems (a transition rule broken in each is reported for each)."""
    from budget.pipeline import build_report

    ra, rb = every_one(build_report, (a, b))
    return ra, rb, diff_reports(ra, rb, plan_changes(a, b))


def diff_files(path_a: Path, path_b: Path) -> tuple[Report, Report, PlanDiff]:
    """Load, budget and compare two plan files; a BudgetError carries both files' problems."""
    from budget.plan.load import load_plan

    a, b = every_one(load_plan, (path_a, path_b))
    return diff_plans(a, b)


def _rows(rows: tuple[Row, ...], key: str) -> list[dict[str, Any]]:
    """Phase rows by name; stage rows by index (``stage``: an integer) or, when the plans
    have different numbers of stages, by role (``"first"``, ``"last"``), each with the
    stage of A and of B it pairs (``a_stage``, ``b_stage``)."""
    out = []
    for row in rows:
        record: dict[str, Any] = {key: row.key}
        if key == "stage":
            record[key] = int(row.key) if row.key.isdigit() else row.key
            record["a_stage"], record["b_stage"] = row.stages
        out.append(
            {
                **record,
                "in_a": row.in_a,
                "in_b": row.in_b,
                "changed": row.changed,
                "metrics": {d.metric: d.to_dict() for d in row.deltas},
            }
        )
    return out


def diff_to_dict(a: Report, b: Report, diff: PlanDiff) -> dict[str, Any]:
    """`{a, b, delta}` (DESIGN.md): the two full reports and what changed between them."""
    return {
        "a": to_dict(a),
        "b": to_dict(b),
        "delta": {
            "identical": diff.identical,
            "plan": [{"key": c.key, "a": c.a, "b": c.b} for c in diff.changes],
            "fits": {"a": diff.fits[0], "b": diff.fits[1]},
            "stage_counts": {"a": diff.stage_counts[0], "b": diff.stage_counts[1]},
            "note": diff.note,
            "summary": {d.metric: d.to_dict() for d in diff.summary},
            "stages": _rows(diff.stages, "stage"),
            "phases": _rows(diff.phases, "name"),
        },
    }
