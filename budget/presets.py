"""What the catalogue holds (`budget presets`): every device, topology and model preset with
the numbers a plan gets from it and where they come from, as plain data.

The numbers are the catalogue's own (`budget.catalog`), not re-derived: a device's GEMM
ceiling is its calibrated curve's ``peak_fraction`` of the dense bf16 peak, a topology
level's B_eff is its link rate times the collective share, and a model's parameter count is
`budget.layers.params_total` of a plan holding only that preset, the count a report's header
prints. Bytes are integers, rates bytes/s or FLOP/s, times seconds.
"""

from __future__ import annotations

import copy
from typing import Any

from budget.catalog import DEVICES, MODELS, TOPOLOGIES, DevicePreset, ModelPreset, TopologyPreset

__all__ = ["KINDS", "catalogue", "device_dict", "model_dict", "topology_dict"]

KINDS = ("devices", "topologies", "models")
# The sequence length at which a device's fused-attention rates are listed: the length its
# measurements were published at (`budget.catalog.devices`).
ATTENTION_KEYS = 8192


def device_dict(d: DevicePreset) -> dict[str, Any]:
    """``{name, memory_bytes, flops{dtype: FLOP/s}, memory_bandwidth_Bps, gemm{ceiling,
    ceiling_flops, half_flops, inner_half, by_dtype, source}, memory_efficiency,
    kernel_startup_s, sms, fp8_transpose, attention[{kernel, keys, fraction, derived, head_dim,
    source}],
    assumed,
    source}``; ``inner_half`` is K₀ of a GEMM's inner-dimension factor
    (`budget.efficiency`); the first attention kernel is what ``model.attention: flash``
    runs (its share of the bf16 peak when each query meets ``keys`` keys; ``derived``:
    computed from another kernel's measurement), an empty list means attention stays on the
    GEMM curve; ``assumed`` names the figures borrowed from another device or assumed
    ("gemm", "gemm-fp8" for the FP8 ceiling alone, "stream", "attention", "start",
    "fp8-transpose")."""
    peak = dict(d.flops)["bf16"]
    return {
        "name": d.name,
        "memory_bytes": d.memory,
        "flops": dict(d.flops),
        "memory_bandwidth_Bps": d.memory_bandwidth,
        "gemm": {
            "ceiling": d.gemm.peak_fraction,
            "ceiling_flops": d.gemm.peak_fraction * peak,
            "half_flops": d.gemm.half_flops,
            "inner_half": d.gemm.inner_half,
            "by_dtype": {dtype: fraction for dtype, fraction, _ in d.gemm.by_dtype},
            "source": d.gemm.source,
        },
        "memory_efficiency": d.memory_efficiency,
        "kernel_startup_s": d.kernel_startup,
        "sms": d.sms,
        "fp8_transpose": d.fp8_transpose,
        "attention": [
            {
                "kernel": rate.kernel,
                "keys": ATTENTION_KEYS,
                "fraction": float(rate.at(ATTENTION_KEYS)),
                "forward": float(rate.at(ATTENTION_KEYS, part="forward")),
                "backward": float(rate.at(ATTENTION_KEYS, part="backward")),
                "derived": rate.derived,
                "head_dim": rate.head_dim,
                "source": rate.source,
            }
            for rate in d.attention
        ],
        "assumed": list(d.assumed),
        "source": d.source,
    }


def topology_dict(t: TopologyPreset) -> dict[str, Any]:
    """``{name, gpus_per_node, levels[{name, size, rate_Bps, fraction, bandwidth_Bps,
    latency_s, ramp, assumed, source}], source}``, levels innermost first; ``size`` is the
    GPUs per domain (None for the outermost), ``ramp`` whether a bandwidth ramp by message
    size applies, ``assumed`` the figures assumed or borrowed ("share", "latency",
    "ramp")."""
    return {
        "name": t.name,
        "gpus_per_node": t.gpus_per_node,
        "levels": [
            {
                "name": level.name,
                "size": level.size,
                "rate_Bps": level.rate,
                "fraction": level.fraction,
                "bandwidth_Bps": level.bandwidth,
                "latency_s": level.latency,
                "ramp": level.ramp is not None,
                "assumed": list(level.assumed),
                "source": level.source,
            }
            for level in t.levels
        ],
        "source": t.source,
    }


def model_dict(m: ModelPreset) -> dict[str, Any]:
    """``{name, params, active_params, mtp_params, layers, hidden, heads, kv_heads, ffn,
    vocab, mla, experts{count, top_k, ffn, shared_ffn} or None, weights, source}``;
    ``params`` leaves the multi-token prediction modules out (``mtp_params``), as the
    report's header does; ``weights`` is the released checkpoint's format if quantized;
    ``active_params`` is what one token touches, both embeddings included (as Mistral counts
    Mixtral's 12.9 B; DeepSeek's "37B activated" may leave the input embedding out, which
    would make DeepSeek-V3's 37.55 B here 36.63 B)."""
    from budget.layers import active_params, mtp_layers, mtp_total, params_total

    plan = _plan_of(m)
    model = plan.model
    experts = model.experts
    return {
        "name": m.name,
        "params": params_total(plan),
        "active_params": active_params(plan),
        "mtp_params": mtp_total(plan) if mtp_layers(plan) else 0,
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "kv_heads": model.kv_heads,
        "ffn": model.ffn,
        "vocab": model.vocab,
        "mla": model.mla is not None,
        "experts": None
        if experts is None
        else {
            "count": experts.count,
            "top_k": experts.top_k,
            "ffn": experts.ffn,
            "shared_ffn": experts.shared_ffn,
        },
        "weights": m.weights,
        "source": m.source,
        # every key the preset writes, as a plan's model section would (mlp, norm, biases,
        # positions, windows, latent ranks...): the figures above are a summary (an audit)
        "model": copy.deepcopy(m.tree),
    }


def _plan_of(m: ModelPreset) -> Any:
    """A training plan holding only the preset: one DGX H100 node as 8 data-parallel ranks,
    sequence 2048 (every preset's positions reach it)."""
    from budget.plan.resolve import resolve
    from budget.plan.yaml_load import Marks

    tree = {
        "name": m.name,
        "model": {"preset": m.name},
        "batch": {"seq": 2048, "micro": 1, "global": 8},
        "parallel": {"dp": 8},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    return resolve(tree, Marks(), f"<preset {m.name}>")


def catalogue(kind: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{devices: [...], topologies: [...], models: [...]}``, or only ``kind``'s list."""
    builders = {
        "devices": lambda: [device_dict(d) for d in DEVICES.values()],
        "topologies": lambda: [topology_dict(t) for t in TOPOLOGIES.values()],
        "models": lambda: [model_dict(m) for m in MODELS.values()],
    }
    kinds = KINDS if kind is None else (kind,)
    return {k: builders[k]() for k in kinds}
