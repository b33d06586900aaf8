"""Memory per pipeline stage: the live bytes at each instant of the step, and the peak.

Memory at an instant is the sum of the allocations alive at that instant (DESIGN.md rule 2),
so a stage's peak is the largest such sum over the instants `step.derive` describes, and the
report names every allocation alive there ("peak overlap"). The worst stage decides whether
the plan fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from budget.phases import CATEGORIES, Alloc, Category, Instant, StageStep, Step


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    layers: int
    inflight: float
    by_category: dict[Category, int]  # bytes alive at the peak, per category
    peak_bytes: int
    peak_phase: str
    peak_instant: str
    peak_overlap: tuple[Alloc, ...]  # largest first
    phase_peaks: dict[str, int]  # the largest live total of each phase on this stage


@dataclass(frozen=True, slots=True)
class Memory:
    capacity_bytes: int
    stages: tuple[StageMemory, ...]

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.stage))

    @property
    def peak_bytes(self) -> int:
        return self.worst.peak_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


def _categories(live: tuple[Alloc, ...]) -> dict[Category, int]:
    totals: dict[Category, int] = dict.fromkeys(CATEGORIES, 0)
    for alloc in live:
        totals[alloc.category] += alloc.total
    return totals


def stage_memory(stage: StageStep) -> StageMemory:
    """The peak of one stage: the instant with the most live bytes (ties: the earliest)."""
    best: tuple[str, Instant] | None = None
    phase_peaks: dict[str, int] = {}
    for phase in stage.phases:
        for instant in phase.instants:
            total = instant.total
            phase_peaks[phase.name] = max(phase_peaks.get(phase.name, 0), total)
            if best is None or total > best[1].total:
                best = (phase.name, instant)
    if best is None:
        best = ("resident", Instant("resident", stage.resident))
    name, instant = best
    overlap = tuple(sorted(instant.live, key=lambda a: -a.total))
    return StageMemory(
        stage=stage.stage,
        layers=stage.layers,
        inflight=stage.inflight,
        by_category=_categories(instant.live),
        peak_bytes=instant.total,
        peak_phase=name,
        peak_instant=instant.label,
        peak_overlap=overlap,
        phase_peaks=phase_peaks,
    )


def memory(step: Step, capacity_bytes: int) -> Memory:
    """Per-stage peaks of a derived step against the device's capacity in bytes."""
    return Memory(capacity_bytes, tuple(stage_memory(s) for s in step.stages))
