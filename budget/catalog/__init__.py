"""Named hardware, clusters and models: the numbers people would otherwise type by hand.

Every number sits next to its source. Devices carry datasheet peaks and an achieved-
efficiency curve calibrated from public microbenchmarks (`budget.efficiency`); topologies
carry link rates, latencies and the share of the link rate collectives reach; models carry
the dimensions of the paper or model card that introduced them.
"""

from __future__ import annotations

from budget.catalog.devices import DEVICES, DevicePreset
from budget.catalog.models import MODELS, ModelPreset
from budget.catalog.topologies import TOPOLOGIES, LinkSpec, TopologyPreset

__all__ = [
    "DEVICES",
    "MODELS",
    "TOPOLOGIES",
    "DevicePreset",
    "LinkSpec",
    "ModelPreset",
    "TopologyPreset",
]
