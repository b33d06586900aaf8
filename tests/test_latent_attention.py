"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1) against the
published DeepSeek-V3 sizes and hand calculations."""

from __future__ import annotations

from pathlib import Path

import pytest

from budget import flops
from budget.errors import BudgetError
from budget.inference import kv_cache_bytes
from budget.layers import active_params, attention_params, params_total, shapes
from budget.pipeline import build_report
from budget.plan.load import load_plan

DATA = Path(__file__).parent / "data"

SERVING = """\
name: deepseek-v3-serving
mode: decode
model: {model}
batch: {{sequences: 256, prompt: 4096, generate: 1024}}
precision: {{params: fp8, activations: bf16, matmul: fp8}}
parallel: {{tp: {tp}, dp: {dp}, ep: {ep}}}
device: {{preset: h200}}
topology: {{preset: dgx-h200, nodes: 2}}
"""


def _plan(
    tmp_path: Path, model: str = "{preset: deepseek-v3}", tp: int = 1, dp: int = 16, ep: int = 16
):
    path = tmp_path / "plan.yaml"
    path.write_text(SERVING.format(model=model, tp=tp, dp=dp, ep=ep), encoding="utf-8")
    return load_plan(path)


def test_deepseek_v3_attention_parameters_by_hand(tmp_path: Path) -> None:
    """One layer's attention: query down-projection 7168 x 1536 and its norm 1536, query
    up-projection 1536 x 128·(128 + 64), key/value down-projection 7168 x (512 + 64) and
    its norm 512, key/value up-projection 512 x 128·(128 + 128), output 128·128 x 7168,
    and the attention RMSNorm 7168."""
    plan = _plan(tmp_path)
    by_hand = (
        7168 * 1536 + 1536
        + 1536 * 128 * 192
        + 7168 * 576 + 512
        + 512 * 128 * 256
        + 128 * 128 * 7168
        + 7168
    )  # fmt: skip
    assert by_hand == 187_114_496
    assert attention_params(plan) == (by_hand, by_hand)


def test_deepseek_v3_totals_match_the_technical_report(tmp_path: Path) -> None:
    """DeepSeek-V3 Technical Report (arXiv 2412.19437), abstract: 671B total parameters,
    37B activated per token (the multi-token prediction module is extra). By hand: two
    embeddings 2 x 129280 x 7168, the final norm, 61 layers of attention (above) and an MLP
    norm, 3 dense MLPs 3 x 7168 x 18432, and 58 MoE layers of a 7168 x 256 router, 256
    routed and 1 shared expert of 3 x 7168 x 2048; active: the shared and 8 routed."""
    plan = _plan(tmp_path)
    expert = 3 * 7168 * 2048
    common = 2 * 129280 * 7168 + 7168 + 61 * (187_114_496 + 7168) + 3 * 3 * 7168 * 18432
    assert params_total(plan) == common + 58 * (7168 * 256 + 257 * expert) == 671_026_404_352
    assert active_params(plan) == common + 58 * (7168 * 256 + 9 * expert) == 37_552_282_624
    assert params_total(plan) == pytest.approx(671e9, rel=1e-3)
    assert active_params(plan) == pytest.approx(37e9, rel=0.02)


def test_the_cache_keeps_the_latent_on_every_tp_rank(tmp_path: Path) -> None:
    """The cache holds kv_rank + rope_dim = 576 elements per token and layer, 4.5 head
    dimensions (DeepSeek-V2, Table 1: (d_c + d_h^R)·l ≈ 9/2·d_h·l), against 2 x 128 x 128
    for full multi-head attention: 57 times less. It is not split over tp."""
    one, eight = _plan(tmp_path), _plan(tmp_path, tp=8, dp=2, ep=2)
    per_rank = 256 // 16  # sequences per data-parallel replica
    assert kv_cache_bytes(one, 61) == 61 * 576 * 2 * (4096 + 1024) * per_rank
    assert kv_cache_bytes(eight, 61) == 61 * 576 * 2 * (4096 + 1024) * (256 // 2)
    assert round(2 * 128 * 128 / 576, 1) == 56.9


def test_decode_attends_in_the_latent_space(tmp_path: Path) -> None:
    """Decoding absorbs the key and value up-projections (DeepSeek-V2 section 2.1.3): each
    of the 128 heads' query (512 + 64) meets 5,120 cached latents and produces a 512-wide
    output, reading the latent cache once for all heads."""
    plan = _plan(tmp_path)
    s = shapes(plan, query_len=1, kv_len=4096 + 1024)
    (core,) = flops.attention_core(plan, s)
    sequences = 16
    pairs = sequences * 128 * 5120
    assert core.flops == 2 * pairs * 576 + 2 * pairs * 512
    cache = 2 * sequences * 5120 * 576
    assert core.bytes == 2 * sequences * 128 * (576 + 512) + cache


def test_prefill_and_training_attend_with_full_heads(tmp_path: Path) -> None:
    """Without absorption, QKᵀ runs over 128 + 64 dimensions and the product with V over
    128, halved by the causal mask; the projections are the latent GEMMs."""
    plan = _plan(tmp_path)
    s = shapes(plan, query_len=4096, kv_len=4096)  # the prompt of 16 sequences
    (core,) = flops.attention_core(plan, s)
    pairs = 16 * 128 * 4096 * 4096
    assert core.flops == (2 * pairs * 192 + 2 * pairs * 128) // 2
    names = [w.name for w in flops.qkv_projections(plan, s)]
    assert names == [
        "QKV projection",
        "latent norms",
        "query up-projection",
        "key/value up-projection",
    ]
    down = flops.qkv_projections(plan, s)[0]
    assert down.flops == 2 * s.tokens * 7168 * (1536 + 576)
    per_token = flops.model_flops_per_token(plan)
    attention = 6 * 61 * 128 * (192 + 128) * 5120  # batch.seq: prompt + generated
    assert per_token - attention == 6 * (active_params(plan) - 129280 * 7168)


def test_hf_config_gives_the_preset(tmp_path: Path) -> None:
    """The released config.json reads to the same model as the preset."""
    preset = build_report(_plan(tmp_path))
    config = DATA / "hf" / "deepseek-v3" / "config.json"
    hf = build_report(_plan(tmp_path, model=f"{{hf_config: {config}}}"))
    assert hf.model["params_total"] == preset.model["params_total"]
    assert hf.model["mla"] == preset.model["mla"] == {
        "q_rank": 1536, "kv_rank": 512, "nope_dim": 128, "rope_dim": 64, "v_dim": 128
    }  # fmt: skip
    assert hf.step == preset.step


def test_mla_needs_the_value_head_dimension(tmp_path: Path) -> None:
    model = (
        "{layers: 4, hidden: 1024, heads: 8, vocab: 1000, kv_heads: 2, "
        "mla: {kv_rank: 256, nope_dim: 64, rope_dim: 32}}"
    )
    with pytest.raises(BudgetError) as raised:
        _plan(tmp_path, model=model)
    messages = {p.path: p.message for p in raised.value.problems}
    assert "needs model.head_dim" in messages["$.model.mla"]
    assert "remove kv_heads" in messages["$.model.kv_heads"]
