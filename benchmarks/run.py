"""Benchmarks: print figures and compare them with the targets the issues set.

Run with `make bench`. Nothing here asserts: timings belong in a report, not in tests.

- Issue 2, acceptance 7: `budget plans/gpt3-175b.yaml` must take no more than twice a bare
  `python -c "import typer, rich, yaml, jsonschema, numpy"` (median of several runs each).
- Engine cost per plan: load + derive + price + render-free report, per shipped plan.
- Issue 6, acceptance 2: layouts evaluated per second by `budget search` for GPT-3 175B on
  1,024 GPUs and Llama 3 405B on 16,384 GPUs (target: 100,000 per second on one core).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 7


def _median_seconds(command: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def startup() -> None:
    bare = _median_seconds([sys.executable, "-c", "import typer, rich, yaml, jsonschema, numpy"])
    plan = _median_seconds([sys.executable, "-m", "budget", "plans/gpt3-175b.yaml"])
    ratio = plan / bare
    verdict = "meets" if ratio <= 2 else "MISSES"
    print(
        f"startup: bare imports {bare * 1e3:.0f} ms, budget plans/gpt3-175b.yaml "
        f"{plan * 1e3:.0f} ms, ratio {ratio:.2f} (target ≤ 2.00: {verdict}; "
        f"median of {RUNS})"
    )


def engine() -> None:
    from budget.pipeline import build_report
    from budget.plan.load import load_plan

    for path in sorted((ROOT / "plans").glob("*.yaml")):
        plan = load_plan(path)
        build_report(plan)  # warm caches and imports
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            build_report(plan)
            times.append(time.perf_counter() - start)
        print(
            f"engine: {path.name:<26} {statistics.median(times) * 1e3:7.1f} ms per report "
            f"({plan.parallel.pp} stages)"
        )


def sweep() -> None:
    from budget.plan.load import load_plan
    from budget.search import Space, search

    cases = [
        ("gpt3-175b", 1024, Space(micro=(1, 2, 4, 8), virtual_stages=(1, 2))),
        ("llama3-405b-128k", 16384, Space(micro=(1,), virtual_stages=(1, 2))),
    ]
    for name, gpus, space in cases:
        plan = load_plan(ROOT / "plans" / f"{name}.yaml")
        outcome = search(plan, gpus, space)
        rate = outcome.evaluated / outcome.elapsed_s
        verdict = "meets" if rate >= 100_000 else "MISSES"
        print(
            f"search: {name} on {gpus:,} GPUs: {outcome.evaluated:,} layouts in "
            f"{outcome.elapsed_s:.1f} s = {rate:,.0f} per second in {outcome.groups} "
            f"structure groups (target ≥ 100,000: {verdict})"
        )


if __name__ == "__main__":
    startup()
    engine()
    sweep()
