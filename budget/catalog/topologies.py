"""Topology presets: cluster building blocks whose levels price collectives.

Each level stores the link's rate per GPU in one direction, as the system datasheet gives
it, and the share of that rate NCCL collectives reach (``fraction``); the `Level` a plan gets
has bandwidth = rate × fraction, so T = n·α + Q / B_eff prices what collectives achieve.

Collective share. NVLink 3 (A100): Azure's published nccl-tests run on ND A100 v4 (8 x
A100-SXM4-80GB, NCCL 2.18.5; Azure/AI-benchmarking-guide, ``Azure_Results/ND_A100_v4_results.md``
at 3bb66ca, "NCCL Bandwidth") reaches an all_reduce bus bandwidth of 231.58 GB/s at 8 GiB,
231.58 / 300 = 0.772 of the link (a third-party summary, the Alaya docs tech blog, gives
230-250). NVLink 4 (H100, H200): an NCCL maintainer gives the ring figure directly, "with the
protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can
observe as BusBw when running non-allreduce operations, or when running with
NCCL_ALGO=RING" (S. Jeaugey, NVIDIA/nccl-tests issue 212, 2024): 370 / 450 = 0.822. Azure's
H100 and H200 runs reach 479-480 GB/s at 8 GiB, above the link, because NVLink SHARP (NVLS)
reduces inside the switch, which a ring does not model. NVLink 5 (GB200): Azure's nccl-tests
run on ND GB200 v6 (Azure/AI-benchmarking-guide, ``Azure_Results/ND_GB200_v6_results.md`` at
2a370be, NCCL 2.25.1, "bus bandwidth values obtained from the NCCL AllReduce (Ring
algorithm) tests in-place operations") reaches 679.61 GB/s at 8 GiB, 679.61 / 900 = 0.755;
the guide runs it on one host's 4 GPUs (its issue 7), where a ring's bus bandwidth is what
it is on more (on H100 a ring reads 365-370 GB/s from 2 to 4 GPUs, NVIDIA/nccl issue 1455,
as at 8). NCCL's own model puts it a little higher, 18 links x 40.1 GB/s (``SM100_NVLINK_BW``
in src/graph/topo.h) = 721.8 GB/s, 0.802, as its 20.6 per link gives Hopper the 370 above;
the measurement is taken. The H800's NVLink (400 GB/s
bidirectional, 200 one way, against the H100's 900) has its users' own figure: "NVLink
offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)" (DeepSeek-V3
technical report, arXiv 2412.19437, section 3.2.2; IB's 50 GB/s is the 400 Gb/s line rate one
way, so 160 GB/s is read as the one-way rate reached), 160 / 200 = 0.80. DeepSeek's
"3.2 times" sets that reached rate against InfiniBand's line rate; here InfiniBand too is
priced at its reached share, 47 GB/s, so the preset's NVLink is 3.4 times its
InfiniBand. The H800's 400 GB/s is 8 NVLink 4 links of 50 GB/s each (nvidia-smi topo prints
NV8 between H800s, vllm-project/vllm issue 40755, against NV18 between H100s and H200s).
InfiniBand: NCCL's maintainers give the bus bandwidth one NIC reaches inter-node. HDR
200 Gb/s: "We usually consider 24GB/s is the peak performance per 200G NIC (12 GB/s for
100G NICs)" (S. Jeaugey, NVIDIA/nccl-tests issue 119, 2022), and "On an Nvidia DGX-A100
system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW" (D. Addison,
NVIDIA/nccl issue 812, 2023), 24 of 25 GB/s = 0.96. NDR 400 Gb/s: "For NDR @ 400Gbps you
should see 46-48GB/s per NIC" (NVIDIA/nccl-tests issue 290, 2025), the middle of that range,
47 of 50 GB/s = 0.94 (the same maintainer has also written "around 48GB/s" per CX7 NIC,
nccl-tests issue 319: 0.96, one point of the range).
Each IB level takes its generation's share (until these were found the catalogue assumed
0.80, with the accuracy table in view; README).

Latency per message step α: 3 µs inside an NVLink domain and 14 µs across InfiniBand. The
NVLink value agrees with the smallest message of the same Azure runs: a 1 KiB all_reduce at a
bus bandwidth of 0.04 GB/s on 8 A100s takes 1.75 x 1 KiB / 0.04 GB/s = 45 µs, which a ring's
14 steps price at 3.2 µs each (8 H100s with NVLS: 26 µs, so 3 µs is conservative there).
No sweep of an H800 or a GB200 measures its α: their NVLink levels take 3 µs, marked assumed.
The InfiniBand value is NCCL's own: its tuning model prices a ring collective as a base
latency plus a per-step hardware latency for each step, and an inter-node step with the
Simple protocol (the one large messages use) at 14 µs against 3.4 µs for an NVLink step
(``hwLat``, NET and NVLINK rows, Ring/Simple, in ``src/graph/tuning.cc`` of NVIDIA/nccl at
b647562, a 2.2x release; an older release, 01afd20, had 9.6 µs for the network step). The
NVLink step agrees with the measured 3 µs above, which is why the network step is taken from
the same model rather than assumed (until it was read, 10 µs was assumed; the accuracy table
moves by 0.3 points at most between the two). NCCL's per-call base latency (8.4 µs for a
Simple ring) is not added: on NVLink the measured α already holds it, spread over the steps.

Bandwidth by message size. The shares above are the large-message plateau. No single pair
(α, B) fits a whole nccl-tests curve: in the same A100 run the bus bandwidth is 166.6 GB/s at
67 MB and 213.9 GB/s at 268 MB (72 % and 92 % of its 8 GiB plateau), where α and the plateau
alone give 92 % and 98 %. NVLink levels therefore carry a `BandwidthRamp` measured from
published nccl-tests sweeps (`budget.catalog.nccl_tests`): NVLink 3 from two 8 x A100
all-reduce runs, NVLink 4 from 8 x H100 ring all-reduce, all-gather and reduce-scatter runs,
NVLink 5 from the 4 x GB200 ring all-reduce run above (its full 1 MiB to 8 GiB sweep: until
that was read, NVLink 5 took NVLink 4's, which put a 16 MiB all-reduce 24 % faster than
measured); the H800's NVLink takes NVLink 4's (no sweep found; on the H800 the same
shares at the same size are pessimistic, since a slower link spends less of a message's
time in the fixed start-up). InfiniBand levels have none (no complete
multi-node sweep was found) and run at their plateau at every size.
"""

from __future__ import annotations

from dataclasses import dataclass

from budget.catalog.nccl_tests import nvlink_ramp
from budget.plan.model import BandwidthRamp

__all__ = [
    "H800_NVLINK_FRACTION",
    "HDR_FRACTION",
    "IB_FRACTIONS",
    "NDR_FRACTION",
    "NVLINK3_FRACTION",
    "NVLINK4_FRACTION",
    "NVLINK5_FRACTION",
    "RAMPS",
    "TOPOLOGIES",
    "LinkSpec",
    "TopologyPreset",
]

GB = 1e9
NVLINK3_FRACTION = 231.58 / 300  # nccl-tests all_reduce busbw, 8 x A100 (module docstring)
NVLINK4_FRACTION = 370 / 450  # NCCL ring busbw on H100 NVLink 4 (module docstring)
NVLINK5_FRACTION = 679.61 / 900  # nccl-tests ring all_reduce busbw, GB200 (module docstring)
H800_NVLINK_FRACTION = 160 / 200  # DeepSeek-V3's achieved NVLink rate on H800 (docstring)
HDR_FRACTION = 24 / 25  # NCCL busbw per HDR 200 Gb/s NIC, maintainers (module docstring)
NDR_FRACTION = 47 / 50  # NCCL busbw per NDR 400 Gb/s NIC, maintainers (module docstring)
IB_FRACTIONS = {200: HDR_FRACTION, 400: NDR_FRACTION}  # by link rate, Gb/s
NVLINK_LATENCY = 3e-6  # checked against the smallest nccl-tests messages (module docstring)
IB_LATENCY = 14e-6  # NCCL tuning model, inter-node ring step, Simple (module docstring)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One level: ``size`` GPUs per domain (None for the outermost), the link rate per GPU
    in one direction in bytes/s, the collective share of it, the latency per step."""

    name: str
    rate: float
    latency: float
    size: int | None
    fraction: float  # the share of `rate` collectives reach (module docstring)
    source: str = ""
    ramp: BandwidthRamp | None = None  # measured share of the bandwidth by message size
    # Figures not measured on this link but assumed or borrowed from another (module
    # docstring): any of "share", "latency", "ramp".
    assumed: tuple[str, ...] = ()

    @property
    def bandwidth(self) -> float:
        return self.rate * self.fraction


@dataclass(frozen=True, slots=True)
class TopologyPreset:
    name: str
    gpus_per_node: int
    levels: tuple[LinkSpec, ...]
    source: str


_NVLINK3_RAMP = nvlink_ramp(3, NVLINK_LATENCY, 300 * GB * NVLINK3_FRACTION)
_NVLINK4_RAMP = nvlink_ramp(4, NVLINK_LATENCY, 450 * GB * NVLINK4_FRACTION)
_NVLINK5_RAMP = nvlink_ramp(5, NVLINK_LATENCY, 900 * GB * NVLINK5_FRACTION)


# The plan language's names for the measured ramps (``topology.levels[].ramp``).
RAMPS: dict[str, BandwidthRamp] = {
    "nvlink3": _NVLINK3_RAMP,
    "nvlink4": _NVLINK4_RAMP,
    "nvlink5": _NVLINK5_RAMP,
}


def _nvlink(
    rate_gb: float,
    size: int,
    source: str,
    fraction: float,
    ramp: BandwidthRamp,
    assumed: tuple[str, ...] = (),
) -> LinkSpec:
    return LinkSpec("nvlink", rate_gb * GB, NVLINK_LATENCY, size, fraction, source, ramp, assumed)


def _ib(gbit: int, source: str, size: int | None = None, name: str = "infiniband") -> LinkSpec:
    """An InfiniBand level at its generation's collective share and NCCL's per-step network
    latency (module docstring)."""
    share = IB_FRACTIONS[gbit]
    return LinkSpec(name, gbit / 8 * GB, IB_LATENCY, size, share, source)


_DGX_A100 = "NVIDIA DGX A100 datasheet"
_H800 = 'Zhao et al. (DeepSeek-AI), "Insights into DeepSeek-V3" (arXiv 2505.09343), H800 node'
_DSV3 = "DeepSeek-V3 technical report (arXiv 2412.19437)"
_DGX_H100 = "NVIDIA DGX H100 datasheet"
_DGX_B200 = "NVIDIA DGX B200 datasheet"

TOPOLOGIES: dict[str, TopologyPreset] = {
    "dgx-a100": TopologyPreset(
        "dgx-a100",
        8,
        (
            # NVLink 3: 600 GB/s bidirectional per GPU through 6 NVSwitches.
            _nvlink(
                300,
                8,
                f"{_DGX_A100}: NVLink 3, 600 GB/s bidirectional per GPU",
                NVLINK3_FRACTION,
                _NVLINK3_RAMP,
                # its all-gather and reduce-scatter take the all-reduce sweeps' shares (no
                # 8 x A100 sweep of them was found: `nccl_tests`; an audit, m513, found the
                # ramp shown as measured)
                assumed=("ramp",),
            ),
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
                _NVLINK4_RAMP,
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
                450,
                8,
                "NVIDIA DGX H200 datasheet: NVLink 4, 900 GB/s per GPU",
                NVLINK4_FRACTION,
                _NVLINK4_RAMP,
            ),
            _ib(400, "NVIDIA DGX H200 datasheet: 8 x ConnectX-7 400 Gb/s NDR InfiniBand"),
        ),
        "NVIDIA DGX H200 datasheet",
    ),
    "dgx-b200": TopologyPreset(
        "dgx-b200",
        8,
        (
            # NVLink 5: 14.4 TB/s across the 8 GPUs through 2 NVSwitch chips, 1.8 TB/s
            # bidirectional per GPU; the share, ramp and α are the GB200 NVL72's NVLink 5
            # (no 8 x B200 nccl-tests sweep was found; a catalogue audit, m513, found B200
            # plans left on dgx-h100's NVLink 4 for want of a preset)
            _nvlink(
                900,
                8,
                f"{_DGX_B200}: NVLink 5, 1.8 TB/s bidirectional per GPU (14.4 TB/s in all); "
                "share: the GB200 NVL72's (Azure ND GB200 v6 nccl-tests)",
                NVLINK5_FRACTION,
                _NVLINK5_RAMP,
                assumed=("share", "latency", "ramp"),
            ),
            # 8 single-port ConnectX-7 VPI, 400 Gb/s InfiniBand, one per GPU (4 OSFP cages).
            _ib(400, f"{_DGX_B200}: 8 x ConnectX-7 400 Gb/s InfiniBand"),
        ),
        _DGX_B200,
    ),
    "hgx-h800": TopologyPreset(
        "hgx-h800",
        8,
        (
            # NVLink 4 with fewer links: 400 GB/s bidirectional per GPU (arXiv 2505.09343),
            # of which DeepSeek-V3 reaches 160 GB/s one way (arXiv 2412.19437, section 3.2.2).
            _nvlink(
                200,
                8,
                f"{_H800}: NVLink 400 GB/s bidirectional per GPU; {_DSV3}: 160 GB/s achieved",
                H800_NVLINK_FRACTION,
                _NVLINK4_RAMP,
                # the H100's sweep, and the A100's α (no H800 measurement: module docstring)
                assumed=("ramp", "latency"),
            ),
            # Eight 400 Gb/s ConnectX-7 InfiniBand NICs per node, one per GPU.
            _ib(400, f"{_H800}: 8 x 400 Gb/s ConnectX-7 InfiniBand per node"),
        ),
        f"{_H800}; {_DSV3}",
    ),
    "gb200-nvl72": TopologyPreset(
        "gb200-nvl72",
        72,
        (
            # NVLink 5: 1.8 TB/s bidirectional per GPU, 72 GPUs in one NVLink domain.
            _nvlink(
                900,
                72,
                "NVIDIA GB200 NVL72 specifications: NVLink 5, 1.8 TB/s per GPU; share: Azure "
                "ND GB200 v6 nccl-tests ring all_reduce, 679.61 GB/s at 8 GiB",
                NVLINK5_FRACTION,
                _NVLINK5_RAMP,
                # α is the A100's: the sweep's smallest point, 1 MiB all_reduce at 80.48 GB/s
                # bus bandwidth, 1.5 x 1 MiB / 80.48 GB/s = 19.5 µs over 6 steps, bounds it at
                # 3.26 µs but does not measure it (an audit); its all-gather and
                # reduce-scatter take the all-reduce sweep's shares (m513)
                assumed=("latency", "ramp"),
            ),
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
                _NVLINK4_RAMP,
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
