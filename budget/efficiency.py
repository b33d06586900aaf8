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
"""

from __future__ import annotations

import numpy as np

from budget.flops import Work
from budget.plan.model import Device, GemmCurve
from budget.vector import vmax

__all__ = ["curve_fraction", "gemm_efficiency"]


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
    curve = device.gemm.for_dtype(dtype)
    if work.kind == "elementwise":
        return curve.peak_fraction
    # a Work standing for a share of one kernel (`Work.launches`, the average layer of a
    # stage whose layers differ) ramps as the whole kernel does; a zero share has no FLOPs
    return curve_fraction(curve, work.flops / vmax(work.launches, 1e-9))
