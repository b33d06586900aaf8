"""Measured NCCL bandwidth by message size: the `BandwidthRamp` of each NVLink generation.

A collective does not reach its link's plateau bus bandwidth until its buffer is large:
nccl-tests sweeps show an 8-GPU all-reduce on A100s moving 64 MiB at 72-85 % of the busbw
it reaches at 8 GiB, and the latency term n·α explains only a few points of that (NCCL runs
a mid-size buffer on fewer channels and pipeline chunks than a large one). The engine keeps
T = n·α + Q/B_eff and scales B_eff by the share a measured curve implies at the collective's
size S (as nccl-tests counts it: the whole buffer).

Derivation, per published curve: a ring collective of S bytes on P ranks moves Q = f·S per
rank, with f the nccl-tests bus-bandwidth factor (2(P−1)/P all-reduce, (P−1)/P all-gather
and reduce-scatter) in n = 2(P−1) or P−1 steps. Setting the engine's time equal to the
measured time t(S) gives

    share(S) = (f·S / B_plateau) / (t(S) − n·α)

with B the level's bandwidth in the topology presets (NVLink 3: 231.58 GB/s, NVLink 4: 370
GB/s; so an operation whose own plateau is lower, like all-gather's 357.9 GB/s on H100, keeps
that difference at every size) and α the engine's NVLink latency
(`budget.catalog.topologies.NVLINK_LATENCY`, 3 µs). A point is kept wherever t(S) exceeds
n·α, so that the engine reproduces every measured time it can: a rule that kept only points
where n·α was at most half of t(S) dropped the H100 all-gather and reduce-scatter below 8 MiB,
whose 41 µs the held 8 MiB share then priced at 24 µs (an audit). Shares are clipped to 1:
where n·α leaves less than the plateau needs, the engine's time stays above the measured one
(the H100 ring all-reduce from 1 to 8 MiB: 1 to 23 % over, its 42 µs of n·α above the 42 µs
NCCL took at 2 MiB, whose low-latency protocols step faster than α), and a larger buffer a
run measured faster than a smaller one is priced at the smaller's time (`_rising`: the H100
all-gather at 2 and 4 MiB, 0.5 and 0.8 % over). Where a curve gives only busbw, t(S) =
f·S / busbw(S). Several runs of one generation and operation are
averaged at the sizes all of them kept. Below the smallest kept size and above the largest
the share holds (`BandwidthRamp`). The shares are read at the same S for any group size and
any written level's α, though they were derived from 8-rank groups at α = 3 µs.

Curves (sizes 1 MiB to 8 GiB, out-of-place unless noted), none of them a training run:

- NVLink 3, 8 x A100 SXM, all-reduce: Azure/AI-benchmarking-guide
  ``Azure_Results/ND_A100_v4_results.md`` at 3bb66ca (A100-SXM4-80GB, NCCL 2.18.5; in-place
  busbw only) and oracle-japan/ocitutorials ``tutorials/_intermediates/spinup-gpu-cluster.md``
  (an earlier version of the page; BM.GPU4.8, 8 x A100-SXM4-40GB, ``all_reduce_perf -g 8``).
  The two disagree by 7 to 18 points from 4 to 64 MiB (0.52 and 0.34 at 4 MiB, 0.77 and 0.93
  at 64 MiB). No all-gather or reduce-scatter sweep of 8 A100s was found: those take the
  all-reduce shares, an assumption (on the H100 below, all-gather and reduce-scatter reach
  11 to 16 points less than all-reduce from 16 to 64 MiB, where all three curves have
  points).
- NVLink 4, 8 x H100 SXM, ring all-reduce, all-gather and reduce-scatter:
  togethercomputer/together-nccl-tests ``benchmarks/H100/results/20260305_220043/`` at 6698e53,
  ``{all_reduce,all_gather,reduce_scatter}_ring.out`` (NCCL 2.26.2, ``NCCL_ALGO=RING``,
  ``NCCL_NVLS_ENABLE=0``; plateaus 368.1, 357.9 and 363.2 GB/s, against the 370 GB/s the
  topology presets use). The all-reduce rows here are the ring's, not NVLink SHARP's, which
  the engine does not model.
- NVLink 5, 4 x GB200 (one host of an NVL72 rack), ring all-reduce:
  Azure/AI-benchmarking-guide ``Azure_Results/ND_GB200_v6_results.md`` at 2a370be (NCCL
  2.25.1, "NCCL AllReduce (Ring algorithm) tests in-place operations"; busbw only, plateau
  679.61 GB/s, the share the GB200 NVL72 preset takes). Derived at P = 4 (f = 1.5, n = 6),
  the group it ran on. It ramps later than NVLink 4: 37 % of the plateau at 4 MiB and 73 %
  at 32 MiB, where the H100's ring reaches 94 and 92 % (taken for NVLink 5 until this run
  was read). All-gather and reduce-scatter take the all-reduce shares, an assumption, as on
  the A100.

All-to-all, broadcast and send/recv have no sweep here and run at the plateau.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from budget.plan.model import BandwidthRamp

__all__ = [
    "NVLINK3_RAMP_SOURCE",
    "NVLINK4_RAMP_SOURCE",
    "NVLINK5_RAMP_SOURCE",
    "curve_shares",
    "nvlink_ramp",
]

MiB = 2**20
_SIZES = tuple(MiB * 2**i for i in range(14))  # 1 MiB .. 8 GiB

# Azure ND A100 v4, all_reduce in-place busbw (GB/s), 1 MiB .. 8 GiB.
_A100_AZURE_AR_BUSBW = (
    36.22, 53.54, 71.43, 89.99, 109.22, 132.77, 166.63,
    174.18, 213.87, 221.58, 228.10, 230.22, 230.48, 231.58,
)  # fmt: skip
# OCI BM.GPU4.8, all_reduce out-of-place time (µs), 1 MiB .. 8 GiB.
_A100_OCI_AR_US = (
    76.71, 112.4, 134.5, 185.8, 245.1, 398.2, 589.5,
    1191.2, 2121.9, 4208.2, 8166.8, 16232, 32097, 63929,
)  # fmt: skip
# Together H100, NCCL_ALGO=RING, out-of-place time (µs), 1 MiB .. 8 GiB.
_H100_AR_US = (
    46.52, 42.06, 53.09, 80.49, 126.62, 213.96, 368.67,
    702.55, 1351.28, 2641.67, 5218.59, 10329.0, 20495.8, 40838.9,
)  # fmt: skip
_H100_AG_US = (
    41.67, 41.48, 41.34, 47.01, 70.80, 125.45, 210.89,
    393.52, 732.87, 1399.34, 2726.97, 5363.19, 10579.3, 21001.0,
)  # fmt: skip
_H100_RS_US = (
    40.60, 41.66, 41.70, 50.44, 71.97, 118.78, 206.45,
    381.43, 718.20, 1393.15, 2711.56, 5353.24, 10450.3, 20695.6,
)  # fmt: skip

# Azure ND GB200 v6, 4 GPUs, all_reduce (ring) in-place busbw (GB/s), 1 MiB .. 8 GiB.
_GB200_AR_BUSBW = (
    80.48, 110.43, 146.27, 253.46, 331.09, 422.62, 550.73,
    574.19, 593.53, 618.74, 646.87, 666.63, 673.06, 679.61,
)  # fmt: skip
_GB200_RANKS = 4

_RANKS = 8  # the A100 and H100 curves are one 8-GPU node

NVLINK3_RAMP_SOURCE = (
    "nccl-tests all_reduce on 8 A100 SXM: Azure AI-benchmarking-guide ND A100 v4 (3bb66ca) "
    "and OCI BM.GPU4.8 (oracle-japan/ocitutorials); all-gather and reduce-scatter assumed alike"
)
NVLINK4_RAMP_SOURCE = (
    "nccl-tests ring all_reduce, all_gather, reduce_scatter on 8 H100 SXM "
    "(togethercomputer/together-nccl-tests 6698e53, NCCL 2.26.2)"
)
NVLINK5_RAMP_SOURCE = (
    "nccl-tests ring all_reduce on 4 GB200 (Azure AI-benchmarking-guide ND GB200 v6, "
    "2a370be, NCCL 2.25.1); all-gather and reduce-scatter assumed alike"
)


def _factor_steps(op: str, ranks: int) -> tuple[float, int]:
    """nccl-tests' busbw factor f and the ring's latency-bearing steps n."""
    if op == "all-reduce":
        return 2 * (ranks - 1) / ranks, 2 * (ranks - 1)
    return (ranks - 1) / ranks, ranks - 1


def curve_shares(
    op: str,
    sizes: Sequence[int],
    times_s: Sequence[float],
    alpha: float,
    plateau: float,
    ranks: int = _RANKS,
) -> dict[int, float]:
    """``share(S) = (f·S / B) / (t(S) − n·α)`` at every size where n·α < t(S), clipped to
    1; B (``plateau``, bytes/s) is the level's bandwidth in the topology presets (module
    docstring)."""
    f, n = _factor_steps(op, ranks)
    out: dict[int, float] = {}
    for size, t in zip(sizes, times_s, strict=True):
        if n * alpha < t:
            out[size] = min(1.0, (f * size / plateau) / (t - n * alpha))
    return out


def _times_from_busbw(
    op: str, busbw_gbs: Sequence[float], ranks: int = _RANKS
) -> tuple[float, ...]:
    f, _ = _factor_steps(op, ranks)
    return tuple(f * s / (b * 1e9) for s, b in zip(_SIZES, busbw_gbs, strict=True))


def _us(times: Sequence[float]) -> tuple[float, ...]:
    return tuple(t * 1e-6 for t in times)


def _mean_shares(curves: Sequence[dict[int, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Average curves at the sizes every one of them kept (no curve is extrapolated), each
    share then lowered where needed so that S / share never falls from one size to the
    next: a collective's time does not fall as it grows (`_rising`)."""
    sizes = sorted(set.intersection(*(set(c) for c in curves)))
    shares = [float(np.mean([c[s] for c in curves])) for s in sizes]
    return tuple(float(s) for s in sizes), _rising(sizes, shares)


def _rising(sizes: Sequence[int], shares: Sequence[float]) -> tuple[float, ...]:
    """Shares whose S / share is the running maximum of the measured ones: the engine's
    bandwidth term f·S / (B·share) then never falls as S grows, where a run measured a
    larger buffer a little faster than a smaller one (the H100 all-gather: 41.67 µs at
    1 MiB, 41.48 µs at 2 MiB and 41.34 µs at 4 MiB, whose shares 0.242 and 0.488 become
    0.240 and 0.480, each priced at 1 MiB's 41.67 µs)."""
    out, most = [], 0.0
    for size, share in zip(sizes, shares, strict=True):
        most = max(most, size / share)
        out.append(size / most)
    return tuple(out)


def _all_reduce_alike(curves: Sequence[dict[int, float]], source: str) -> BandwidthRamp:
    """A ramp from all-reduce curves alone: all-gather and reduce-scatter take their shares
    (no sweep of them was found for the generation, an assumption)."""
    sizes, shares = _mean_shares(curves)
    ops = ("all-reduce", "all-gather", "reduce-scatter")
    return BandwidthRamp(tuple((op, sizes, shares) for op in ops), source, ops[1:])


def nvlink_ramp(generation: int, alpha: float, plateau: float) -> BandwidthRamp:
    """The measured ramp of NVLink ``generation`` 3 (A100), 4 (H100, H200) or 5 (GB200), as
    shares of ``plateau`` bytes/s."""
    if generation == 5:
        times = _times_from_busbw("all-reduce", _GB200_AR_BUSBW, _GB200_RANKS)
        gb200 = curve_shares("all-reduce", _SIZES, times, alpha, plateau, _GB200_RANKS)
        return _all_reduce_alike([gb200], NVLINK5_RAMP_SOURCE)
    if generation == 3:
        azure_times = _times_from_busbw("all-reduce", _A100_AZURE_AR_BUSBW)
        azure = curve_shares("all-reduce", _SIZES, azure_times, alpha, plateau)
        oci = curve_shares("all-reduce", _SIZES, _us(_A100_OCI_AR_US), alpha, plateau)
        return _all_reduce_alike([azure, oci], NVLINK3_RAMP_SOURCE)
    curves = {"all-reduce": _H100_AR_US, "all-gather": _H100_AG_US, "reduce-scatter": _H100_RS_US}
    points = tuple(
        (op, *_mean_shares([curve_shares(op, _SIZES, _us(us), alpha, plateau)]))
        for op, us in curves.items()
    )
    return BandwidthRamp(points, NVLINK4_RAMP_SOURCE)
