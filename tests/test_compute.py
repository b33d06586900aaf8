"""Roofline (Williams, Waterman & Patterson, CACM 2009) and op time (DESIGN.md rule 9)."""

from __future__ import annotations

import numpy as np
import pytest

from budget.compute import op_time, roofline


def test_seed_roofline_lab() -> None:
    # The seed's lab: I = 4 FLOP/byte, B = 80 GB/s, ceiling 1,000 GFLOP/s.
    # I·B = 320 GFLOP/s < 1,000 → memory-bound; ridge = 1e12 / 8e10 = 12.5 FLOP/byte.
    r = roofline(4, 80e9, 1000e9)
    assert r.attainable_flops == pytest.approx(320e9)
    assert r.bound == "memory"
    assert r.ridge_intensity == pytest.approx(12.5)


def test_above_and_at_the_ridge_compute_binds() -> None:
    assert roofline(100, 80e9, 1000e9).attainable_flops == pytest.approx(1000e9)
    assert roofline(100, 80e9, 1000e9).bound == "compute"
    assert roofline(12.5, 80e9, 1000e9).bound == "compute"


@pytest.mark.parametrize(("intensity", "peak"), [(0.29, 29e9), (0.57, 57e9)])
def test_at_a_ridge_that_rounds_the_compute_ceiling_binds(intensity: float, peak: float) -> None:
    """0.29 FLOP/byte x 100 GB/s is 29 GFLOP/s, the peak, but 0.29 x 1e11 rounds to
    28,999,999,999.999996 in binary: read against the product, the input on its own ridge
    (0.29) was memory-bound below the peak (an audit, m390). Read against the ridge, it is
    compute-bound at the peak."""
    r = roofline(intensity, 100e9, peak)
    assert intensity * 100e9 < peak  # the rounding the bound no longer reads
    assert r.ridge_intensity == intensity
    assert (r.bound, r.attainable_flops) == ("compute", peak)
    below = roofline(intensity * (1 - 1e-12), 100e9, peak)
    assert below.bound == "memory" and below.attainable_flops < peak


def test_op_time_is_the_larger_of_compute_and_memory_time() -> None:
    # 2 TFLOP on 1 PFLOP/s = 2 ms; 1 GB at 3.35 TB/s = 0.2985 ms → compute-bound, 2 ms.
    assert op_time(2e12, 1e9, 1e15, 3.35e12) == pytest.approx(2e-3)
    # 1 GFLOP, 10 GB: memory-bound, 10 GB / 3.35 TB/s; efficiency 0.5 doubles it.
    assert op_time(1e9, 10e9, 1e15, 3.35e12) == pytest.approx(10e9 / 3.35e12)
    assert op_time(1e9, 10e9, 1e15, 3.35e12, efficiency=0.5) == pytest.approx(2 * 10e9 / 3.35e12)


def test_op_time_takes_arrays() -> None:
    flops = np.array([2e12, 1e9])
    moved = np.array([1e9, 10e9])
    times = op_time(flops, moved, 1e15, 3.35e12)
    assert np.allclose(times, [2e-3, 10e9 / 3.35e12])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 0.0, 1e12), "bandwidth_Bps must be a finite number > 0"),
        ((4, 8e10, -1.0), "peak_flops must be a finite number > 0"),
        ((-1, 8e10, 1e12), "intensity must be a finite number ≥ 0"),
        ((float("inf"), 8e10, 1e12), "intensity must be a finite number ≥ 0"),
    ],
)
def test_bad_roofline_input(args: tuple[float, float, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        roofline(*args)


def test_bad_efficiency() -> None:
    with pytest.raises(ValueError, match=r"efficiency must be in \(0, 1\]"):
        op_time(1.0, 1.0, 1.0, 1.0, efficiency=0)
