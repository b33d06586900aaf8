"""Sliding-window attention (``model.sliding_window``): the fused kernel's work, the KV
cache a serving rank keeps, and the model FLOPs MFU counts, each against a hand count."""

from __future__ import annotations

from pathlib import Path

import pytest

from budget import flops
from budget.inference import kv_cache_bytes
from budget.layers import shapes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Plan
from budget.render.table import header
from tests.plan_files import ROOT

ALTERNATING = ", ".join(["true", "false"] * 40)  # 80 layers: even ones slide


def _plan(tmp_path: Path, name: str, window: str) -> Plan:
    """plans/`name`.yaml with `window` as its model.sliding_window."""
    text = (ROOT / "plans" / f"{name}.yaml").read_text(encoding="utf-8")
    text = text.replace("  attention: flash\n", f"  attention: flash\n  sliding_window: {window}\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return load_plan(path)


def test_the_fused_kernel_splits_between_full_and_sliding_layers(tmp_path: Path) -> None:
    """Llama 3 70B at sequence 8,192 on tp 8 (8 heads of 128 per rank, micro-batch 1),
    every other layer sliding over 2,048 keys. Full causal: 8 x 8192² = 536,870,912
    query-key pairs, 2 products of 2·128 FLOPs each, halved: 137,438,953,472 FLOPs. A
    sliding layer meets 8192·2048 − 2048²/2 pairs per head where a full one meets 8192²/2,
    0.4375 of them: 60,129,542,144 FLOPs. Half the layers each: one layer's kernel is
    68,719,476,736 + 30,064,771,072, the sliding part timed at 2,048 keys per call."""
    plan = _plan(tmp_path, "llama3-70b", f"{{size: 2048, layers: [{ALTERNATING}]}}")
    full, sliding = flops.attention_core(plan, shapes(plan))
    assert (full.flops, full.keys) == (137_438_953_472 // 2, 8192)
    assert (sliding.flops, sliding.keys) == (60_129_542_144 // 2, 2048)
    assert sliding.name == "attention core (flash, sliding window)"
    whole = _plan(tmp_path, "llama3-70b", "{size: 8192}")  # no shorter than the sequence
    assert [w.flops for w in flops.attention_core(whole, shapes(whole))] == [137_438_953_472]
    assert flops.attention_core(whole, shapes(whole))[0].bytes == full.bytes * 2


def test_a_window_shortens_the_step_and_leaves_the_memory_alone(tmp_path: Path) -> None:
    """FlashAttention saves Q, K, V, the output and the softmax statistics whatever the
    window, so the peak does not move; the attention core's time does, and nothing else."""
    plain = build_report(load_plan(ROOT / "plans" / "llama3-70b.yaml"))
    windowed = build_report(_plan(tmp_path, "llama3-70b", "{size: 2048}"))
    assert windowed.worst.peak_bytes == plain.worst.peak_bytes
    assert windowed.step["time_s"] < plain.step["time_s"]
    assert windowed.model["sliding_window"] == {"size": 2048, "layers": 80}
    assert plain.model["sliding_window"] is None
    plan = _plan(tmp_path, "llama3-70b", "{size: 2048}")
    rate = plan.device.attention_fraction("flash", 2048)
    assert windowed.device["attention_window_fraction"] == rate
    assert plain.device["attention_window_fraction"] is None
    model_line, device_line = header(windowed)[1], header(windowed)[3]
    assert model_line.endswith("vocab 128,256; sliding window 2,048 on every layer)")
    assert f"at 8,192 keys per call, sliding layers at {rate:.1%} (measured)" in device_line


def test_sliding_layers_cache_only_their_window(tmp_path: Path) -> None:
    """Llama 3 70B decode, tp 8, 32 sequences of 2,048 + 512 tokens, a window of 1,024 on
    every other layer: a token costs 2 x 1 kv head x 128 x 2 B = 512 B per layer on a rank,
    and the 40 full layers keep 2,560 tokens where the 40 sliding ones keep 1,024."""
    plan = _plan(tmp_path, "llama3-70b-decode", f"{{size: 1024, layers: [{ALTERNATING}]}}")
    assert kv_cache_bytes(plan, 80, 40) == 512 * (40 * 2560 + 40 * 1024) * 32
    report = build_report(plan)
    assert report.stages[0].kv_cache_bytes == 512 * (40 * 2560 + 40 * 1024) * 32
    decode = flops.attention_core(plan, shapes(plan, 1, 2560))
    # decoding reads min(context, W) cached keys: 1,024 of 2,560 on a sliding layer
    assert decode[1].keys == 1024
    assert decode[1].flops * 2560 == pytest.approx(decode[0].flops * 1024, rel=1e-9)


def test_model_flops_count_a_window_as_written(tmp_path: Path) -> None:
    """PaLM's 12·L·h·s attention term counts a sliding layer's queries against the window,
    not the sequence: Llama 3 70B (64 heads x (128 + 128), so 2·64·256 = 32,768 FLOPs per
    query-key pair and layer, x 3 for forward and backward) at 8,192 tokens with 40 layers
    sliding over 2,048 keys counts 3 x 32,768 x 40 x (8192 − 2048) FLOPs per token fewer
    than without the window."""
    plain = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    plan = _plan(tmp_path, "llama3-70b", f"{{size: 2048, layers: [{ALTERNATING}]}}")
    saved = 3 * 32_768 * 40 * (8192 - 2048)
    assert flops.model_flops_per_token(plain) - flops.model_flops_per_token(plan) == saved


def test_mean_keys_below_a_window() -> None:
    """The mean of min(x, W) over a range of query positions, by hand: below the window the
    midpoint; above it W; across it the area (W² − a²)/2 + W·(b − W) over b − a."""
    assert flops._mean_below(0, 1000, 4096) == 500
    assert flops._mean_below(5000, 6000, 4096) == 4096
    assert flops._mean_below(0, 8192, 4096) == (4096**2 / 2 + 4096 * 4096) / 8192 == 3072
