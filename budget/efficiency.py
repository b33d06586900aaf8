"""Achieved efficiency: the fraction of a device's peak that one kernel reaches.

The roofline (Williams, Waterman & Patterson 2009) bounds a kernel by the dense peak and
the memory bandwidth; real kernels reach a fraction of each. A large GEMM reaches a
device-specific ceiling well below the datasheet peak (the "maximum achievable matmul
FLOPS"); a small one reaches less, because it does not fill the device's streaming
multiprocessors with full waves of tiles (NVIDIA, "Matrix Multiplication Background User's
Guide", sections on tile and wave quantization). The model here is the simplest curve with
both properties, a saturating hyperbola in the kernel's FLOPs:

    fraction(F) = peak_fraction · F / (F + half_flops)

equivalent to a GEMM taking F / (peak_fraction · peak) plus a fixed ramp of
half_flops / (peak_fraction · peak) seconds. Both constants come from public
microbenchmarks, once per device (`budget.catalog.devices`), never from a plan or from the
runs the model is validated against (`budget.accuracy`).

Beside its size, a GEMM's inner dimension K sets its rate (`inner_factor`): each output tile
runs K / BK steps of its main loop and then a fixed prologue and epilogue (loading the
pipeline, writing the tile: CUTLASS, "Efficient GEMM in CUDA"), so at the same FLOPs a
shallower K spends a larger share of its time outside the loop. Its loop then runs at
g = (K / (K + K₀)) / (`INNER_REF` / (`INNER_REF` + K₀)) of the rate at the calibration
shapes' K, never faster, while its ramp stays the ramp: T = F / (ceiling · peak · g) +
ramp. K₀ comes from a sweep over K where one was measured (`GemmCurve.inner_half`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from budget.flops import Work
from budget.plan.model import INNER_MIN, INNER_REF, Device, GemmCurve
from budget.vector import vmax, vmin

__all__ = ["curve_fraction", "gemm_efficiency", "inner_factor"]


def curve_fraction(curve: GemmCurve, flops: float) -> float:
    """``peak_fraction · F / (F + half_flops)``; the ceiling for F ≤ 0 (nothing to ramp)."""
    if isinstance(flops, np.ndarray):
        return np.where(
            flops > 0, curve.peak_fraction * flops / (flops + curve.half_flops), curve.peak_fraction
        )
    if flops <= 0:
        return curve.peak_fraction
    return curve.peak_fraction * flops / (flops + curve.half_flops)


def gemm_efficiency(device: Device, work: Work, dtype: str = "bf16") -> float:
    """Fraction of the `dtype` dense peak `work` reaches on `device`.

    A device without a calibrated curve (written out in the plan) keeps its flat
    ``matmul_efficiency``; so does a preset whose plan overrides ``matmul_efficiency``.
    Matrix products (GEMMs and the attention core) follow the curve of the format they are
    read in (`GemmCurve.for_dtype`); memory-bound kernels are priced by bandwidth, and their
    few FLOPs use the curve's ceiling.
    """
    if device.gemm is None:
        return device.matmul_efficiency
    if dtype == "bf16":  # the curve's own format (the hot path: no peaks looked up)
        curve = device.gemm
    else:
        base = device.peak_flops("bf16")
        ratio = device.peak_flops(dtype) / base if base else 1.0
        curve = device.gemm.for_dtype(dtype, ratio or 1.0)
    if work.kind == "elementwise":
        return curve.peak_fraction
    # A Work standing for a share of one kernel (`Work.launches`, the average layer of a
    # stage whose layers differ) ramps as the whole kernel does; a zero share has no FLOPs.
    # A shallow inner dimension slows the loop over K, not the ramp: the GEMM's time is
    # F / (ceiling · g) + ramp, which is g times the curve at F / g.
    g = inner_factor(curve, work.inner)
    fraction: float = g * curve_fraction(curve, work.flops / vmax(work.launches, 1e-9) / g)
    return fraction


def inner_factor(curve: GemmCurve, inner: tuple[Any, ...]) -> Any:
    """The rate of GEMMs of inner dimensions `inner` (kernels of equal FLOPs) against one of
    the calibration's, (K / (K + K₀)) / (`INNER_REF` / (`INNER_REF` + K₀)) each, at most 1
    and at least the factor at `INNER_MIN` (the sweeps measured no shallower GEMM: a MoE
    expert's weight gradient over a few rows is not extrapolated); several kernels take the
    sum of their times, so the factor is the harmonic mean. 1 where the curve has no K₀ or
    the work no GEMM dimensions."""
    k0 = curve.inner_half
    if not k0 or not inner:
        return 1.0
    ref = INNER_REF / (INNER_REF + k0)
    slowdown: Any = 0.0  # seconds per second at the calibration's K, summed over kernels
    for k in inner:
        depth = vmax(k, INNER_MIN)
        slowdown = slowdown + 1 / vmin(1.0, depth / (depth + k0) / ref)
    return len(inner) / slowdown
