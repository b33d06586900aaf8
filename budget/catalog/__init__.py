"""Named hardware, clusters and models: the numbers people would otherwise type by hand.

Every number sits next to its source. Devices carry datasheet peaks and an achieved-
efficiency curve calibrated from public microbenchmarks (`budget.efficiency`); topologies
carry link rates, latencies and the share of the link rate collectives reach; models carry
the dimensions of the paper or model card that introduced them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from budget.catalog.devices import DEVICES, DevicePreset
from budget.catalog.models import MODELS, ModelPreset
from budget.catalog.topologies import TOPOLOGIES, LinkSpec, TopologyPreset

if TYPE_CHECKING:
    from budget.plan.model import Device, Level, Topology

__all__ = [
    "DEVICES",
    "MODELS",
    "TOPOLOGIES",
    "DevicePreset",
    "LinkSpec",
    "ModelPreset",
    "TopologyPreset",
    "device_overrides",
    "topology_overrides",
]


def device_overrides(device: Device) -> tuple[str, ...]:
    """The device keys a plan wrote over its preset's figures (`device: {preset: NAME, ...}`),
    by plan key; none for a device written out or one that keeps them (its reserve is the
    plan's own anyway). An override moved the step where the report still read as the
    preset's (a user audit, m434: 835 TFLOP/s over the H100's 989, step +12 %, no figure
    said)."""
    preset = DEVICES.get(device.name) if device.name else None
    if preset is None:
        return ()
    differs = {
        "memory": device.memory != preset.memory,
        "flops": dict(device.flops) != dict(preset.flops),
        "memory_bandwidth": device.memory_bandwidth != preset.memory_bandwidth,
        "matmul_efficiency": device.gemm is None,  # a flat fraction where the curve was
        "memory_efficiency": device.memory_efficiency != preset.memory_efficiency,
        "attention_efficiency": device.attention_efficiency is not None,
        "kernel_startup": device.kernel_startup != preset.kernel_startup,
        "sms": device.sms != preset.sms,
        "fp8_transpose": device.fp8_transpose != preset.fp8_transpose,
    }
    return tuple(key for key, written in differs.items() if written)


def topology_overrides(topology: Topology) -> tuple[str, ...]:
    """("levels",) where a plan wrote a preset topology's levels (which replace all of the
    preset's, `resolve`) with other figures than the preset's; none otherwise."""
    preset = TOPOLOGIES.get(topology.name) if topology.name else None
    if preset is None:
        return ()
    own = [(s.name, s.bandwidth, s.latency, s.ramp, 1) for s in preset.levels]
    written = [(v.name, v.bandwidth, v.latency, v.ramp, v.shared_by) for v in topology.levels]

    def sized_alike(spec: LinkSpec, level: Level) -> bool:
        """A domain of the preset's size; the preset's open outermost level is any size
        that holds every GPU (a review, m435: nvlink written at size 4 moved the step
        17.5 % and was not said)."""
        if spec.size is None:
            return level.size is None or level.size >= topology.gpus
        return level.size == spec.size

    same = own == written and all(
        sized_alike(s, v) for s, v in zip(preset.levels, topology.levels, strict=True)
    )
    return () if same else ("levels",)
