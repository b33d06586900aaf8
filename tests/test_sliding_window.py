"""Sliding-window attention (``model.sliding_window``): the fused kernel's work, the KV
cache a serving rank keeps, and the model FLOPs MFU counts, each against a hand count."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from budget import flops
from budget.diff import plan_changes
from budget.errors import BudgetError
from budget.inference import _working_set, decode_keys, derive_inference, kv_cache_bytes
from budget.layers import shapes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Plan
from budget.render.table import header
from budget.report import to_dict
from budget.schedule import step_time
from budget.step import derive
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
    window, so the peak does not move; the attention core's time does, and nothing else.
    Llama 3 70B at 8,192 tokens on tp 8 (8 heads of 128 per rank, micro-batch 1), a window
    of 2,048 on every layer: a head meets 8192·2048 − 2048²/2 = 14,680,064 query-key pairs,
    at 2 products x 2·128 = 512 FLOPs a pair, 8 x 14,680,064 x 512 = 60,129,542,144 FLOPs a
    layer against the causal kernel's 8 x 8192²/2 x 512 = 137,438,953,472. The H100 preset's
    flash kernel is cuDNN (the first it lists), at the FlashAttention-3 paper's bars (arXiv
    2407.08608, head dim 128; of the 989 TFLOP/s dense bf16 peak): causal forward 529 TFLOP/s
    at 8K and 484 at 2K (Figure 5); the unmasked backward's 465 at 2K (Figure 6) made causal
    by cudnn-frontend's H200 sweep at 2K, 0.681 ms unmasked over 2 x 0.464 ms causal."""
    plain = build_report(load_plan(ROOT / "plans" / "llama3-70b.yaml"))
    windowed = build_report(_plan(tmp_path, "llama3-70b", "{size: 2048}"))
    assert windowed.worst.peak_bytes == plain.worst.peak_bytes
    assert windowed.step["time_s"] < plain.step["time_s"]
    assert windowed.model["sliding_window"] == {"size": 2048, "sliding_layers": 80}
    assert plain.model["sliding_window"] is None
    plan = _plan(tmp_path, "llama3-70b", "{size: 2048}")
    (core,) = flops.attention_core(plan, shapes(plan))
    assert core.flops == 8 * (8192 * 2048 - 2048**2 // 2) * 512 == 60_129_542_144
    assert core.keys == 2048
    forward, backward = 484 / 989, 465 * 0.681 / (2 * 0.464) / 989
    rate = (1 + 2.5) / (1 / forward + 2.5 / backward)  # the backward does 2.5 x the FLOPs
    assert windowed.device["attention_window_fraction"] == pytest.approx(rate, rel=1e-12)
    assert plain.device["attention_window_fraction"] is None
    # one layer's forward attention block: only the core's time moves, each at its own rate
    saved = 137_438_953_472 / 529e12 - 60_129_542_144 / 484e12
    whole = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    assert _attention_s(whole, 0) - _attention_s(plan, 0) == pytest.approx(saved, rel=1e-9)
    model_line, device_line = header(windowed)[1], header(windowed)[3]
    assert model_line.endswith("vocab 128,256; sliding window 2,048 on every layer)")
    tail = f"at 8,192 keys per call (measured); sliding layers at {rate:.1%} at 2,048 keys"
    assert device_line.endswith(tail)


def test_sliding_layers_cache_only_their_window(tmp_path: Path) -> None:
    """Llama 3 70B decode, tp 8, 32 sequences of 2,048 + 512 tokens, a window of 1,024 on
    every other layer: a token costs 2 x 1 kv head x 128 x 2 B = 512 B per layer on a rank,
    and the 40 full layers keep 2,560 tokens where the 40 sliding ones keep 1,024. Through
    the prefill the sliding ones hold the whole 2,048-token prompt, as vLLM allocates a new
    request's prompt blocks before freeing those behind the window (an audit, m438): the
    stage peaks there, at 512 x (40 x 2,560 + 40 x 2,048) x 32 B."""
    plan = _plan(tmp_path, "llama3-70b-decode", f"{{size: 1024, layers: [{ALTERNATING}]}}")
    assert kv_cache_bytes(plan, 80, 40) == 512 * (40 * 2560 + 40 * 1024) * 32
    assert kv_cache_bytes(plan, 80, 40, prefill=True) == 512 * (40 * 2560 + 40 * 2048) * 32
    report = build_report(plan)
    assert report.stages[0].peak_phase.startswith("prefill.")
    assert report.stages[0].kv_cache_bytes == 512 * (40 * 2560 + 40 * 2048) * 32 == 3_019_898_880
    # every decode instant holds the window's cache, the prefill's is freed past the window
    phases = derive_inference(plan).stages[0].phases
    held = {
        (p.name.split(".")[0], a.total)
        for p in phases
        for i in p.instants
        for a in i.live
        if a.name == "KV cache (bf16)"
    }
    assert held == {
        ("prefill", 512 * (40 * 2560 + 40 * 2048) * 32),
        ("decode", 512 * (40 * 2560 + 40 * 1024) * 32),
    }
    decode = flops.attention_core(plan, shapes(plan, 1, 2560))
    # decoding reads min(context, W) cached keys: 1,024 of 2,560 on a sliding layer
    assert decode[1].keys == 1024
    assert decode[1].flops * 2560 == pytest.approx(decode[0].flops * 1024, rel=1e-9)


def test_a_sliding_layer_caches_the_whole_context_it_has_not_outgrown(tmp_path: Path) -> None:
    """A sliding layer keeps min(context, W) tokens (Mistral 7B's rolling cache, arXiv
    2310.06825, section 2: the buffer holds the last W keys; vLLM and transformers allocate
    no more than the sequence holds): with a window of 4,096 and a context of 2,048 + 512 =
    2,560 tokens, nothing has slid out yet, so every layer, sliding or not, keeps 2,560.
    Llama 3 70B decode at tp 8, 32 sequences: a token costs 2 (K, V) x 8 kv heads / 8 ranks
    x 128 x 2 B = 512 B per layer on a rank; 80 layers x 2,560 tokens x 32 x 512 B, exactly
    the cache without a window (40 sliding layers at the full 4,096 would add 40 x 1,536
    tokens a sequence)."""
    plan = _plan(tmp_path, "llama3-70b-decode", f"{{size: 4096, layers: [{ALTERNATING}]}}")
    assert (plan.batch.prompt, plan.batch.generate, plan.model.window) == (2048, 512, 4096)
    context = 2048 + 512
    per_token = 2 * (8 // 8) * 128 * 2
    expected = 80 * context * 32 * per_token
    assert kv_cache_bytes(plan, 80, 40) == expected == 3_355_443_200
    assert build_report(plan).stages[0].kv_cache_bytes == expected
    plain = load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    assert kv_cache_bytes(plain, 80) == expected


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


def _attention_s(plan: Plan, stage: int, phase: str = "forward.attention") -> float:
    """Compute seconds of one forward attention block on `stage` (or of `phase`)."""
    timed = step_time(plan, derive(plan)).stages[stage]
    return next(p.compute_s for p in timed.phases if p.name == phase)


def test_each_stage_is_priced_at_its_own_layers_kinds(tmp_path: Path) -> None:
    """Qwen's layout: the first 40 of 80 layers attend fully, the last 40 slide. With 4
    pipeline stages of 20 layers, stages 0 and 1 run full attention exactly as the plan
    without a window does, and stages 2 and 3 run the window on every layer; alternating
    layers put half of each stage on the window instead."""
    flags = ", ".join(["false"] * 40 + ["true"] * 40)
    plain = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    first_full = _plan(tmp_path, "llama3-70b", f"{{size: 1024, layers: [{flags}]}}")
    alternating = _plan(tmp_path, "llama3-70b", f"{{size: 1024, layers: [{ALTERNATING}]}}")
    everywhere = _plan(tmp_path, "llama3-70b", "{size: 1024}")
    assert plain.parallel.pp == 4
    for stage in (0, 1):
        assert _attention_s(first_full, stage) == pytest.approx(_attention_s(plain, stage))
    for stage in (2, 3):
        assert _attention_s(first_full, stage) == pytest.approx(_attention_s(everywhere, stage))
    mixed = _attention_s(alternating, 1)
    assert _attention_s(everywhere, 1) < mixed < _attention_s(plain, 1)
    # layers 20..39 alternate: 10 of the stage's 20 slide, a share of 10/20 = 0.5
    halfway = (_attention_s(plain, 1) + _attention_s(everywhere, 1)) / 2
    assert mixed == pytest.approx(halfway, rel=1e-12)


def test_a_window_never_slows_decoding(tmp_path: Path) -> None:
    """A layer runs one attention kernel, full or sliding, so splitting the average layer's
    kernel between the two kinds charges one kernel startup, not two: a window just short of
    the context saves a little decode time rather than costing a startup.

    Llama 3 70B decode on tp 8 (32 sequences; 8 query heads and 1 kv head of 128 a rank):
    511 passes meet 2,049 ... 2,559 keys, (2,049 + 2,559) / 2 = 2,304 on average. A window of
    2,527 caps the last 32: (479 passes at 2,049 ... 2,527, 479 x 2,288 = 1,095,952 keys, and
    32 x 2,527 = 80,864) / 511 = 2,302.97, 2,303 whole keys. (A window of 2,559 or more caps
    no pass: no split.) Every other layer slides, so each kind is half a launch with half of
    its kernel's 2 products x 2·128 FLOPs for 32 x 8 query-key pairs a key, and half of its
    bytes: K and V, 32 x keys x 2 x 128 x 2 B, and 131,072 B of Q and O rows (2 x 32 x 8 x
    128 x 2 B). The split reads 0.5 x 32 x 1 x 512 B = 8,192 B less a layer and pass, and
    charges one startup as the whole kernel does: the block runs 8,192 B at the H100's
    streaming rate (BabelStream copy, mul, add, triad: 2.90, 2.90, 2.97, 2.97 TB/s) faster."""
    plain_plan = load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    plain = build_report(plain_plan)
    plan = _plan(tmp_path, "llama3-70b-decode", f"{{size: 2527, layers: [{ALTERNATING}]}}")
    barely = build_report(plan)
    assert -(-(479 * (2049 + 2527) // 2 + 32 * 2527) // 511) == 2303  # 1,176,816 / 511, up
    assert decode_keys(plan) == (2304, 2303)
    (stage,) = derive_inference(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "decode.attention"]
    full, sliding = [w for w in phase.works if w.kind == "attention"]
    assert [full.launches, sliding.launches] == [0.5, 0.5]
    assert (full.keys, sliding.keys) == (2304, 2303)
    assert full.flops == 0.5 * 2 * 32 * 8 * 256 * 2304 == 150_994_944
    assert sliding.flops == 0.5 * 2 * 32 * 8 * 256 * 2303 == 150_929_408
    rows = 2 * 32 * 8 * 128 * 2  # Q and O rows, bf16: 131,072 B
    assert full.bytes == (32 * 2304 * 2 * 128 * 2 + rows) // 2 == 18_939_904
    assert sliding.bytes == (32 * 2303 * 2 * 128 * 2 + rows) // 2 == 18_931_712
    stream = (2.90 + 2.90 + 2.97 + 2.97) / 4 * 1e12  # B/s
    saved = _attention_s(plain_plan, 0, "decode.attention") - _attention_s(
        plan, 0, "decode.attention"
    )
    assert saved == pytest.approx(8192 / stream, rel=1e-9)
    assert barely.step["decode_token_s"] <= plain.step["decode_token_s"]
    # 80 layers in a decode pass, each 8,192 B shorter
    shorter = plain.step["decode_token_s"] - barely.step["decode_token_s"]
    assert shorter == pytest.approx(80 * 8192 / stream, rel=1e-6)


def test_eager_attention_pays_for_every_score_but_decodes_against_the_window(
    tmp_path: Path,
) -> None:
    """Eager attention masks the scores outside the window but computes them, so training
    costs what it costs without one; decoding, the cache holds only the window's keys, so
    its two products and softmax meet 1,024 of the context's 2,560 on a sliding layer."""
    text = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "eager.yaml"
    path.write_text(text.replace("attention: flash", "attention: eager"), encoding="utf-8")
    plain = load_plan(path)
    path.write_text(
        text.replace("attention: flash", "attention: eager\n  sliding_window: {size: 1024}"),
        encoding="utf-8",
    )
    windowed = load_plan(path)
    assert flops.attention_core(windowed, shapes(windowed)) == flops.attention_core(
        plain, shapes(plain)
    )
    decode = _plan(tmp_path, "llama3-70b-decode", "{size: 1024}")
    decode = replace(decode, model=replace(decode.model, attention="eager"))
    whole = replace(decode, model=replace(decode.model, window=0))
    windowed_works = flops.attention_core(decode, shapes(decode, 1, 2560))
    whole_works = flops.attention_core(whole, shapes(whole, 1, 2560))
    assert [w.name for w in windowed_works] == [
        # K and V copied up to the query heads over the window's keys (an audit: untimed)
        f"{flops.KV_REPEATED} (sliding window)",
        "attention scores QKᵀ (sliding window)",
        "softmax (sliding window)",
        "attention × V (sliding window)",
    ]
    for w, f in zip(windowed_works, whole_works, strict=True):
        assert w.flops * 2560 == pytest.approx(f.flops * 1024, rel=1e-9)
    # its scores, 2 B x 32 sequences x 8 heads x 1 query x 1,024 keys, not 2,560, and the
    # keys and values repeated to the query heads over those keys alone
    held = {a.name: a.bytes for a in _working_set(decode, shapes(decode, 1, 2560), "attention")}
    assert held["attention scores QKᵀ (working)"] == 2 * 32 * 8 * 1024
    assert held["attention probabilities"] == 2 * 32 * 8 * 1024
    assert held["keys repeated to the query heads"] == 2 * 32 * 1024 * 8 * 128


def test_diff_names_the_window_as_a_plan_spells_it_and_no_sliding_layer_is_no_window(
    tmp_path: Path,
) -> None:
    plain = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    windowed = _plan(tmp_path, "llama3-70b", "{size: 2048}")
    changes = {c.key: (c.a, c.b) for c in plan_changes(plain, windowed)}
    assert changes == {
        "model.sliding_window.size": (None, 2048),
        "model.sliding_window.layers": (None, "every layer"),
    }
    alternating = _plan(tmp_path, "llama3-70b", f"{{size: 2048, layers: [{ALTERNATING}]}}")
    (change,) = [c for c in plan_changes(windowed, alternating) if c.key.endswith("layers")]
    assert change.b == "40 of 80: 0–78 by 2"
    gemma3 = ", ".join((["true"] * 5 + ["false"]) * 13 + ["true", "true"])
    gemma = _plan(tmp_path, "llama3-70b", f"{{size: 2048, layers: [{gemma3}]}}")
    (change,) = [c for c in plan_changes(windowed, gemma) if c.key.endswith("layers")]
    assert change.b.startswith("67 of 80: 0–4, 6–10, 12–16,") and change.b.endswith("78–79")
    listed = _plan(tmp_path, "llama3-70b", f"{{size: 2048, layers: [{', '.join(['true'] * 80)}]}}")
    assert plan_changes(windowed, listed) == ()
    none = _plan(tmp_path, "llama3-70b", f"{{size: 2048, layers: [{', '.join(['false'] * 80)}]}}")
    assert (none.model.window, any(none.model.sliding)) == (0, False)


def test_a_split_kernel_ramps_as_one_kernel_on_a_device_without_attention_rates(
    tmp_path: Path,
) -> None:
    """On a preset with no measured attention rate (the MI300X with its FlashAttention-2
    rate taken away: the GEMM curve, with its size ramp, times the kernel) a window
    of 1,023 keys over 1,024 leaves the work all but unchanged, so alternating layers cost
    what full layers do: each half of the average layer's kernel ramps as the whole kernel,
    not as a kernel of half its FLOPs."""
    text = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    text = text.replace("seq: 8192", "seq: 1024").replace("h100-sxm", "mi300x")
    path = tmp_path / "mi300x.yaml"
    path.write_text(text, encoding="utf-8")
    plain = _unmeasured(load_plan(path))
    assert plain.device.attention_source("flash") == "gemm"
    path.write_text(
        text.replace(
            "  attention: flash\n",
            f"  attention: flash\n  sliding_window: {{size: 1023, layers: [{ALTERNATING}]}}\n",
        ),
        encoding="utf-8",
    )
    windowed = _unmeasured(load_plan(path))
    assert _attention_s(windowed, 1) == pytest.approx(_attention_s(plain, 1), rel=2e-3)


def _unmeasured(plan: Plan) -> Plan:
    return replace(plan, device=replace(plan.device, attention=()))


def test_the_shipped_gemma_plan_is_what_its_released_config_reads_as(tmp_path: Path) -> None:
    """plans/gemma2-9b.yaml writes out the model tests/data/hf/gemma-2-9b/config.json reads
    as (window and layer kinds, sandwich norms, soft-capped logits, GeGLU): the same
    report, and the released file's 9,241,705,984 parameters (transformers' count)."""
    text = (ROOT / "plans" / "gemma2-9b.yaml").read_text(encoding="utf-8")
    start, end = text.index("model:\n"), text.index("batch:\n")
    config = ROOT / "tests" / "data" / "hf" / "gemma-2-9b" / "config.json"
    path = tmp_path / "gemma-hf.yaml"
    path.write_text(text[:start] + f"model: {{hf_config: {config}}}\n" + text[end:], "utf-8")
    hand = to_dict(build_report(load_plan(ROOT / "plans" / "gemma2-9b.yaml")))
    hf = to_dict(build_report(load_plan(path)))
    assert hand.pop("plan")["name"] == hf.pop("plan")["name"]
    hand["model"].pop("name"), hf["model"].pop("name")
    assert hand == hf
    assert hand["model"]["params_total"] == 9_241_705_984


def test_sliding_window_null_turns_a_configs_window_off(tmp_path: Path) -> None:
    """Gemma 2 9B from its config with `sliding_window: null`: every layer attends to the
    whole context, as the same dimensions with the window's layers all false do; and a
    layer count that no longer matches the config's list says how to turn it off."""
    plan = (ROOT / "plans" / "gemma2-9b.yaml").read_text(encoding="utf-8")
    config = ROOT / "tests" / "data" / "hf" / "gemma-2-9b" / "config.json"
    model = plan[plan.index("\nmodel:\n") + 1 : plan.index("\nbatch:\n") + 1]
    written = plan.replace(model, f"model:\n  hf_config: {config}\n")
    off = tmp_path / "off.yaml"
    off.write_text(written.replace("model:\n", "model:\n  sliding_window: null\n", 1))
    report = to_dict(build_report(load_plan(off)))
    assert report["model"]["sliding_window"] is None
    assert report["device"]["attention_window_keys"] is None
    # the same report as the plan's own dimensions with no layer sliding (an audit: the
    # claim was not checked): step, MFU, peaks and every phase's compute alike
    whole = tmp_path / "whole.yaml"
    window = plan[plan.index("    layers: [") : plan.index("batch:\n")]
    whole.write_text(plan.replace(window, window.replace("true", "false")), encoding="utf-8")
    hand = to_dict(build_report(load_plan(whole)))
    for key in ("time_s", "mfu", "compute_s"):
        assert report["step"][key] == pytest.approx(hand["step"][key], rel=1e-12), key
    assert report["memory"] == hand["memory"]
    assert [p["compute_s"] for p in report["phases"]] == pytest.approx(
        [p["compute_s"] for p in hand["phases"]], rel=1e-12
    )
    on = tmp_path / "on.yaml"
    on.write_text(written)
    assert to_dict(build_report(load_plan(on)))["model"]["sliding_window"] == {
        "size": 4096,
        "sliding_layers": 21,
    }
    fewer = tmp_path / "fewer.yaml"
    fewer.write_text(written.replace("model:\n", "model:\n  layers: 40\n", 1))
    with pytest.raises(BudgetError) as refused:
        load_plan(fewer)
    (problem,) = refused.value.problems
    # at the key the plan wrote, which no longer matches the config's list (an audit: as
    # `heads` written over a preset's kv_heads is told at heads)
    assert problem.path == "$.model.layers"
    assert problem.message.endswith("per layer, or sliding_window: null for none")


def test_soft_capped_attention_runs_flash_attention_not_cudnn(tmp_path: Path) -> None:
    """cuDNN's fused attention cannot cap the scores: Transformer Engine rules it out beside
    a softcap and falls back to FlashAttention (NVIDIA/TransformerEngine PR 3391). So
    Gemma 2 9B as shipped (attention: flash on H100, whose default is cuDNN) runs
    FlashAttention-2 and is timed as a plan naming flash2 is (an audit: timed at cuDNN's
    rate, 4.52 s a step where FlashAttention-2 took 4.90; 4.56 and 4.94 since the final
    logits' soft-cap is priced as its three kernels); naming cudnn beside the cap is
    refused, and without the cap flash is cuDNN again."""
    from tests.plan_files import variant

    shipped = ROOT / "plans" / "gemma2-9b.yaml"
    flash = ("attention: flash\n", "attention: flash2\n")
    named = variant(tmp_path, "flash2.yaml", flash, base=shipped)
    capped, explicit = (to_dict(build_report(load_plan(p))) for p in (shipped, named))
    assert capped["device"]["attention_kernel"] == "flash2"
    assert capped["step"]["time_s"] == explicit["step"]["time_s"]
    assert round(capped["step"]["time_s"], 2) == 4.94
    off = ("attention_softcap: true", "attention_softcap: false")
    uncapped = to_dict(build_report(load_plan(variant(tmp_path, "off.yaml", off, base=shipped))))
    assert uncapped["device"]["attention_kernel"] == "cudnn"
    assert round(uncapped["step"]["time_s"], 2) == 4.56
    cudnn = variant(
        tmp_path, "cudnn.yaml", ("attention: flash\n", "attention: cudnn\n"), base=shipped
    )
    with pytest.raises(BudgetError) as caught:
        load_plan(cudnn)
    (problem,) = caught.value.problems
    assert problem.path == "$.model.attention"
    assert "cuDNN's fused attention cannot cap the scores" in problem.message


def test_a_mixed_stage_keeps_every_launch_of_a_several_kernel_work(tmp_path: Path) -> None:
    """Decoding past the window on a stage where half the layers slide, each attention work
    is split in two parts, one for each kind of layer; each part had counted one launch
    whatever the work's own (an audit: eager attention's soft-cap, 3 kernels, and its K/V
    copies, 2, each charged one start-up a layer, Gemma 2's eager decode 0.21 s short).
    Llama 3 70B's decode plan under eager attention, every other layer over 1,024 keys: the
    copies' two parts stand for 2 x 0.5 launches each, 2 a layer, as without a window."""
    layers = "[" + ", ".join(["true, false"] * 40) + "]"
    decode = _plan(tmp_path, "llama3-70b-decode", f"{{size: 1024, layers: {layers}}}")
    decode = replace(decode, model=replace(decode.model, attention="eager"))
    s = shapes(decode, 1, 2560)
    assert s.sliding == 0.5
    works = flops.attention_core(decode, s)
    copies = [w for w in works if w.name.startswith(flops.KV_REPEATED)]
    assert [w.launches for w in copies] == [1.0, 1.0]  # 2 kernels x 0.5 of the layers each
    assert sum(w.launches for w in works) == pytest.approx(2 + 1 + 1 + 1)  # copies, 3 works


def test_the_cp_ring_beside_a_sliding_window_is_refused_whatever_its_length(tmp_path) -> None:
    """Gemma 2 at 4,096 tokens, its window as long: the window masks nothing, but Megatron-LM
    hands Transformer Engine the window on every sliding layer and TE's ring refuses it
    ("The context parallel running configs cannot support sliding window attention!"), so
    cp 2 on the ring is refused and the search rules it out; the all-gather runs it (an
    audit, m469: priced and written by the search)."""
    from budget.search import Space, search

    text = (ROOT / "plans" / "gemma2-9b.yaml").read_text(encoding="utf-8")
    assert text.count("seq: 8192") == 1 and text.count("  dp: 16\n") == 1
    text = text.replace("seq: 8192", "seq: 4096")
    path = tmp_path / "ring.yaml"
    path.write_text(text.replace("  dp: 16\n", "  dp: 8\n  cp: 2\n"), encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    assert [p.path for p in raised.value.problems] == ["$.parallel.cp"]
    gathered = tmp_path / "gathered.yaml"
    gathered.write_text(
        text.replace("  dp: 16\n", "  dp: 8\n  cp: 2\n  cp_attention: allgather\n"),
        encoding="utf-8",
    )
    assert load_plan(gathered).parallel.cp == 2
    plain = tmp_path / "plain.yaml"
    plain.write_text(text, encoding="utf-8")
    outcome = search(load_plan(plain), 64, Space(cp=(1, 2)), keep=5)
    assert all(r.config.cp == 1 for r in outcome.results)
    assert "a sliding window on the cp ring needs cp 1" in outcome.ruled_out
