"""Local compute time: the roofline (DESIGN.md rule 9).

Source: Williams, Waterman & Patterson, "Roofline: An Insightful Visual Performance Model
for Multicore Architectures", CACM 52(4), 2009. A kernel of arithmetic intensity I
(FLOP per byte of memory traffic) on a device with peak compute F (FLOP/s) and memory
bandwidth B (bytes/s) attains at most ``min(F, I·B)`` FLOP/s; the ridge point ``F / B`` is
the intensity above which compute, not memory, binds. Equivalently, an op of W FLOPs that
moves D bytes takes ``max(W / F, D / B)``.

The functions accept floats or numpy arrays (one element per configuration of a sweep).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

__all__ = ["Bound", "Roofline", "op_time", "roofline"]

Bound = Literal["memory", "compute"]
Number: TypeAlias = float | NDArray[Any]


@dataclass(frozen=True, slots=True)
class Roofline:
    """Where an intensity sits under the two ceilings of one device."""

    intensity: float  # FLOP/byte
    bandwidth_Bps: float  # memory bandwidth, bytes/s
    peak_flops: float  # compute ceiling, FLOP/s
    attainable_flops: float  # min(peak, intensity × bandwidth)
    ridge_intensity: float  # peak / bandwidth, FLOP/byte
    bound: Bound  # "memory" below the ridge, "compute" at or above it


def roofline(intensity: float, bandwidth_Bps: float, peak_flops: float) -> Roofline:
    """Attainable FLOP/s = min(F, I·B) and the binding ceiling (Williams et al. 2009, eq. 1).

    The seed's lab: I = 4 FLOP/byte, B = 80 GB/s, F = 1,000 GFLOP/s → 320 GFLOP/s,
    memory-bound, ridge at 12.5 FLOP/byte.
    """
    _positive(bandwidth_Bps=bandwidth_Bps, peak_flops=peak_flops)
    if not np.isfinite(intensity) or intensity < 0:
        raise ValueError(f"intensity must be a finite number ≥ 0 FLOP/byte, got {intensity}")
    memory_ceiling = intensity * bandwidth_Bps
    if not np.isfinite(memory_ceiling) or not np.isfinite(peak_flops / bandwidth_Bps):
        raise ValueError(
            f"intensity × bandwidth ({intensity:g} × {bandwidth_Bps:g} B/s) or peak / "
            f"bandwidth ({peak_flops:g} / {bandwidth_Bps:g}) is past a float's range; give "
            "one device's figures, such as 4, 80GB/s and 1TFLOP/s"
        )
    # the bound is read against the ridge, I ≥ F/B: at the ridge both ceilings are equal, and
    # I·B can round below F there (an audit, m390: 0.29 FLOP/byte at 100 GB/s and 29 GFLOP/s
    # read 28.999999999999996 GFLOP/s, memory-bound, beside a ridge of 0.29)
    ridge = peak_flops / bandwidth_Bps
    compute = intensity >= ridge
    return Roofline(
        intensity=float(intensity),
        bandwidth_Bps=float(bandwidth_Bps),
        peak_flops=float(peak_flops),
        attainable_flops=float(peak_flops if compute else min(peak_flops, memory_ceiling)),
        ridge_intensity=float(ridge),
        bound="compute" if compute else "memory",
    )


def op_time(
    flops: Number, bytes_moved: Number, peak: float, bandwidth: float, efficiency: float = 1.0
) -> Number:
    """Seconds for an op: max(FLOPs / (peak·eff), bytes / (bandwidth·eff)) — the roofline
    read as time (Williams et al. 2009); ``efficiency`` in (0, 1] derates both ceilings."""
    _positive(peak=peak, bandwidth=bandwidth)
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    compute_s = flops / (peak * efficiency)
    memory_s = bytes_moved / (bandwidth * efficiency)
    if isinstance(compute_s, np.ndarray) or isinstance(memory_s, np.ndarray):
        return np.maximum(compute_s, memory_s)
    return max(float(compute_s), float(memory_s))


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
