"""Topology presets: cluster building blocks whose levels price collectives.

Each level stores the link's rate per GPU in one direction, as the system datasheet gives
it, and the share of that rate NCCL collectives reach (``fraction``); the `Level` a plan gets
has bandwidth = rate × fraction, so T = n·α + Q / B_eff prices what collectives achieve.

Collective share: nccl-tests all_reduce_perf bus bandwidth at large sizes on 8 × A100 SXM4
over NVLink 3 is 230–250 GB/s of the 300 GB/s link ("NCCL-tests in practice", Alaya
docs tech blog, reference table): 240 / 300 = 0.80. The same table gives 460–480 GB/s on
8 × H100 SXM5, above the 450 GB/s link because NVLink SHARP reduces inside the switch,
which a ring does not model. For NVLink 4 (H100, H200) an NCCL maintainer gives the ring
figure directly: "with the protocol overhead (~20%) NCCL can get an effective NVLink
bandwidth of 370GB/s, which you can observe as BusBw when running non-allreduce operations,
or when running with NCCL_ALGO=RING" (S. Jeaugey, NVIDIA/nccl-tests issue 212, 2024):
370 / 450 = 0.82. NVLink 5 takes the NVLink 3 share, 0.80. No verified busbw table for
InfiniBand was found: IB levels take the same 0.80, an assumption.

Latency per message step α: 3 µs inside an NVLink domain and 10 µs across InfiniBand, the
values this project's hand-written plans use; they are assumptions, not measurements, and
matter only for small messages.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLLECTIVE_FRACTION", "TOPOLOGIES", "LinkSpec", "TopologyPreset"]

GB = 1e9
COLLECTIVE_FRACTION = 240 / 300  # nccl-tests busbw on DGX A100 NVLink 3 (module docstring)
NVLINK4_FRACTION = 370 / 450  # NCCL ring busbw on H100 NVLink 4 (module docstring)
NVLINK_LATENCY = 3e-6  # assumption (module docstring)
IB_LATENCY = 10e-6  # assumption (module docstring)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One level: ``size`` GPUs per domain (None for the outermost), the link rate per GPU
    in one direction in bytes/s, the collective share of it, the latency per step."""

    name: str
    rate: float
    latency: float
    size: int | None
    fraction: float = COLLECTIVE_FRACTION
    source: str = ""

    @property
    def bandwidth(self) -> float:
        return self.rate * self.fraction


@dataclass(frozen=True, slots=True)
class TopologyPreset:
    name: str
    gpus_per_node: int
    levels: tuple[LinkSpec, ...]
    source: str


def _nvlink(
    rate_gb: float, size: int, source: str, fraction: float = COLLECTIVE_FRACTION
) -> LinkSpec:
    return LinkSpec("nvlink", rate_gb * GB, NVLINK_LATENCY, size, fraction, source)


def _ib(gbit: float, source: str, size: int | None = None, name: str = "infiniband") -> LinkSpec:
    return LinkSpec(name, gbit / 8 * GB, IB_LATENCY, size, source=source)


_DGX_A100 = "NVIDIA DGX A100 datasheet"
_DGX_H100 = "NVIDIA DGX H100 datasheet"

TOPOLOGIES: dict[str, TopologyPreset] = {
    "dgx-a100": TopologyPreset(
        "dgx-a100",
        8,
        (
            # NVLink 3: 600 GB/s bidirectional per GPU through 6 NVSwitches.
            _nvlink(300, 8, f"{_DGX_A100}: NVLink 3, 600 GB/s bidirectional per GPU"),
            # 8 single-port ConnectX-6 HDR 200 Gb/s InfiniBand adapters, one per GPU.
            _ib(200, f"{_DGX_A100}: 8 x ConnectX-6 200 Gb/s HDR InfiniBand"),
        ),
        _DGX_A100,
    ),
    "dgx-h100": TopologyPreset(
        "dgx-h100",
        8,
        (
            # NVLink 4: 900 GB/s bidirectional per GPU through 4 NVSwitches.
            _nvlink(
                450,
                8,
                f"{_DGX_H100}: NVLink 4, 900 GB/s bidirectional per GPU",
                NVLINK4_FRACTION,
            ),
            # 8 ConnectX-7 400 Gb/s NDR InfiniBand ports (in 4 OSFP cages), one per GPU.
            _ib(400, f"{_DGX_H100}: 8 x ConnectX-7 400 Gb/s NDR InfiniBand"),
        ),
        _DGX_H100,
    ),
    "dgx-h200": TopologyPreset(
        "dgx-h200",
        8,
        (
            _nvlink(
                450, 8, "NVIDIA DGX H200 datasheet: NVLink 4, 900 GB/s per GPU", NVLINK4_FRACTION
            ),
            _ib(400, "NVIDIA DGX H200 datasheet: 8 x ConnectX-7 400 Gb/s NDR InfiniBand"),
        ),
        "NVIDIA DGX H200 datasheet",
    ),
    "gb200-nvl72": TopologyPreset(
        "gb200-nvl72",
        72,
        (
            # NVLink 5: 1.8 TB/s bidirectional per GPU, 72 GPUs in one NVLink domain.
            _nvlink(900, 72, "NVIDIA GB200 NVL72 specifications: NVLink 5, 1.8 TB/s per GPU"),
            # Scale-out: one 400 Gb/s ConnectX-7 InfiniBand port per GPU.
            _ib(400, "NVIDIA GB200 NVL72 reference architecture: 400 Gb/s IB per GPU"),
        ),
        "NVIDIA GB200 NVL72 specifications",
    ),
    "rail-fat-tree": TopologyPreset(
        "rail-fat-tree",
        8,
        (
            _nvlink(
                450,
                8,
                f"{_DGX_H100}: NVLink 4, 900 GB/s bidirectional per GPU",
                NVLINK4_FRACTION,
            ),
            # Rail-optimised: GPU i of every node in a 32-node scalable unit shares leaf
            # switch i, one hop (NVIDIA DGX SuperPOD reference architecture, H100: 32-node
            # scalable units, 8 rails of NDR 400 Gb/s).
            _ib(
                400,
                "NVIDIA DGX SuperPOD H100 reference architecture: 32-node SU, rail leaves",
                size=256,
                name="ib-rail",
            ),
            # Across scalable units through the spine: same per-GPU rate, non-blocking.
            _ib(400, "NVIDIA DGX SuperPOD H100 reference architecture: spine", name="ib-spine"),
        ),
        "NVIDIA DGX SuperPOD H100 reference architecture (generic rail-optimised fat tree)",
    ),
}
