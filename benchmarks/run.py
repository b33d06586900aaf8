"""Benchmarks: print figures and compare them with the targets the issues set.

Run with `make bench`. Nothing here asserts: timings belong in a report, not in tests.

- Issue 2, acceptance 7: `budget plans/gpt3-175b.yaml` must take no more than twice a bare
  `python -c "import typer, rich, yaml, jsonschema, numpy"` (median of several runs each).
- Engine cost per plan: load + derive + price + render-free report, per shipped plan.
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


if __name__ == "__main__":
    startup()
    engine()
