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


def _training(tmp_path: Path):
    """DeepSeek-V3 training at sequence 4096 on 16 GPUs, tp 8 with sequence parallelism,
    its fp8 parameters beside the distributed optimizer (ZeRO 1), as Megatron-LM's
    --fp8-param-gather needs."""
    text = SERVING.format(model="{preset: deepseek-v3}", tp=8, dp=2, ep=2)
    text = text.replace("mode: decode\n", "").replace(
        "batch: {sequences: 256, prompt: 4096, generate: 1024}",
        "batch: {seq: 4096, micro: 1, global: 64}",
    )
    path = tmp_path / "train.yaml"
    path.write_text(text.replace("ep: 2}", "ep: 2, sequence_parallel: true, zero: 1}"), "utf-8")
    return load_plan(path)


def test_deepseek_v3_attention_parameters_by_hand(tmp_path: Path) -> None:
    """One layer's attention: query down-projection 7168 x 1536 and its norm 1536, query
    up-projection 1536 x 128·(128 + 64), key/value down-projection 7168 x (512 + 64) and
    its norm 512, key/value up-projection 512 x 128·(128 + 128), output 128·128 x 7168,
    and the attention RMSNorm 7168: 11,010,048 + 1,536 + 37,748,736 + 4,128,768 + 512 +
    16,777,216 + 117,440,512 + 7,168 = 187,114,496, all on one rank at tp 1."""
    plan = _plan(tmp_path)
    assert attention_params(plan) == (187_114_496, 187_114_496)


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
    = 32,768 for full multi-head attention: 57 times less. It is not split over tp."""
    one, eight = _plan(tmp_path), _plan(tmp_path, tp=8, dp=2, ep=2)
    per_rank = 256 // 16  # sequences per data-parallel replica
    assert kv_cache_bytes(one, 61) == 61 * 576 * 2 * (4096 + 1024) * per_rank
    assert kv_cache_bytes(eight, 61) == 61 * 576 * 2 * (4096 + 1024) * (256 // 2)


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


def test_decode_runs_the_absorbed_up_projections_as_two_batched_gemms(tmp_path: Path) -> None:
    """Decoding, each head's no-rope query is taken into the latent space before the core
    (q_nope [T, H, 128] × W_UK [H, 128, 512]) and the core's latent output back to values
    after it ([T, H, 512] × W_UV [H, 512, 128]): the FLOPs and fp8 weights of the latent's
    up-projection, but activations of T·H·(128 + 512 + 512 + 128) elements. At tp 8 (16 heads
    a rank), 128 sequences a replica, fp8 GEMM operands (1 B): 128 · 16 · 1,280 = 2,621,440 B
    and 16 · 512 · 256 = 2,097,152 B of weights, 4,718,592 B; the kernel had read the
    latent's up-projection's 128 · (512 + 16 · 256) = 589,824 B of activations (an audit). In
    training and prefill the latent is up-projected to keys and values, one GEMM."""
    plan = _plan(tmp_path, tp=8, dp=2, ep=2)
    s = shapes(plan, query_len=1, kv_len=4096 + 1024)
    *_, up = flops.qkv_projections(plan, s)
    assert up.name == flops.UP_PROJECTIONS and s.tokens == 128 and s.heads == 16
    assert up.flops == 2 * 128 * 512 * 16 * (128 + 128)
    assert up.bytes == 128 * 16 * 1280 + 16 * 512 * 256 == 4_718_592
    assert up.launches == 2
    prefill = shapes(plan, query_len=4096, kv_len=4096)
    *_, whole = flops.qkv_projections(plan, prefill)
    rows = prefill.tokens
    assert whole.bytes == rows * (512 + 16 * 256) + 16 * 512 * 256
    assert whole.launches == 1


def test_decode_combines_the_latent_outputs_over_cp(tmp_path: Path) -> None:
    """Split over cp 2, each rank's partial output per head is the 512-wide latent, which
    the value up-projection widens to 128 only after the combine: the ranks exchange 32
    sequences (256 over dp 8) x 128 heads x (512 + 1 log-sum-exp) fp32 each (an audit: it
    was sized at the 128-wide head)."""
    from budget.inference import derive_inference

    text = SERVING.format(model="{preset: deepseek-v3}", tp=1, dp=8, ep=16)
    path = tmp_path / "cp.yaml"
    path.write_text(text.replace("ep: 16}", "ep: 16, cp: 2}"), encoding="utf-8")
    plan = load_plan(path)
    (phase, *_) = [
        p for s in derive_inference(plan).stages for p in s.phases if p.name == "decode.attention"
    ]
    (combine,) = [m for m in phase.moves if m.group == "cp"]
    # the all-gathered buffer: × cp 2 ranks × fp32 4 B × 32 sequences (256 over dp 8)
    # × 128 heads × (512 + 1) = 16,809,984 B
    assert combine.size_bytes == 2 * 4 * (256 // 8) * 128 * (512 + 1) == 16_809_984
    assert (combine.op, combine.ranks) == ("all-gather", 2)


def test_prefill_and_training_attend_with_full_heads(tmp_path: Path) -> None:
    """Without absorption, QKᵀ runs over 128 + 64 dimensions and the product with V over
    128, halved by the causal mask; the projections are the latent GEMMs."""
    plan = _plan(tmp_path)
    s = shapes(plan, query_len=4096, kv_len=4096)  # the prompt of 16 sequences
    (core,) = flops.attention_core(plan, s)
    pairs = 16 * 128 * 4096 * 4096
    assert core.flops == (2 * pairs * 192 + 2 * pairs * 128) // 2
    down, norms, q_up, kv_up = flops.qkv_projections(plan, s)
    assert down.name == "latent down-projection"
    assert down.flops == 2 * s.tokens * 7168 * (1536 + 576)
    assert norms.bytes == 2 * 2 * s.tokens * (1536 + 512)  # read and write both latents
    # one name, so that together they are the window of the latents' gather
    assert q_up.name == kv_up.name == flops.UP_PROJECTIONS
    assert q_up.flops == 2 * s.tokens * 1536 * 128 * 192
    assert kv_up.flops == 2 * s.tokens * 512 * 128 * 256
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
    assert "set kv_heads to 8" in messages["$.model.kv_heads"]


def test_tensor_parallelism_splits_the_up_projections_not_the_down_projections(tmp_path):
    """At tp 8 a rank holds an eighth of the head-split up-projections and the output
    projection (1536 x 128·192 + 512 x 128·256 + 128·128 x 7168 = 171,966,464) and all of
    the down-projections with their norms (7168 x (1536 + 512 + 64) + 1536 + 512 =
    15,140,864) and the attention norm (7168)."""
    plan = _plan(tmp_path, tp=8, dp=2, ep=2)
    total, per_rank = attention_params(plan)
    assert total == 187_114_496
    assert per_rank == 171_966_464 // 8 + 15_140_864 + 7168 == 36_643_840


def test_direct_queries_without_a_query_latent(tmp_path):
    """DeepSeek-V2-Lite has no query latent (q_lora_rank null): queries come straight from
    the hidden state, 2048 x 16·192. Its config gives 15.7B parameters (DeepSeek-V2, arXiv
    2405.04434, section 3.1.2); per layer the attention is 2048 x 3072 + 2048 x 576 + 512 +
    512 x 16·256 + 16·128 x 2048 + 2048 = 13,765,120, and at tp 2 a rank holds half of the
    query, key/value up- and output projections and all of the rest, 7,473,664."""
    from tests.test_search import V2_LITE

    path = tmp_path / "lite.yaml"
    path.write_text(V2_LITE, encoding="utf-8")
    plan = load_plan(path)
    assert attention_params(plan) == (13_765_120, 7_473_664)
    assert params_total(plan) == pytest.approx(15.7e9, rel=1e-3)
    s = shapes(plan)
    down, norms, q_proj, kv_up = flops.qkv_projections(plan, s)
    # the key/value latent from the rank's shard, normed there; the queries from the
    # gathered hidden state
    assert down.flops == 2 * (4096 // 2) * 2048 * 576
    assert norms.bytes == 2 * 2 * (4096 // 2) * 512
    assert q_proj.flops == 2 * 4096 * 2048 * (16 * 192 // 2)
    assert kv_up.flops == 2 * 4096 * 512 * (16 * 256 // 2)
    # the gather (and its backward mirror) carries the hidden state and the kv latent
    from budget.step import derive

    stage = derive(plan).stages[0]
    moves = {(p.name, m.name): m for p in stage.phases for m in p.moves}
    width = 2 * 4096 * (2048 + 576)
    assert moves[("forward.attention", "attention latents")].size_bytes == width
    assert moves[("backward.attention", "attention latents gradient")].size_bytes == width


def test_keys_and_values_keep_their_own_widths(tmp_path):
    """Prefill and training store and move K of heads·(128 + 64) and V of heads·128, and
    rotate only the 64 rotary dimensions of each query head and of the one shared key."""
    from budget.layers import layer_saved

    plan = _plan(tmp_path, tp=8, dp=2, ep=2)
    s = shapes(plan, query_len=4096, kv_len=4096)
    assert (s.q_cols, s.k_cols, s.v_cols, s.out_cols) == (16 * 192, 16 * 192, 16 * 128, 16 * 128)
    (rotary,) = flops.rotary(plan, s)
    assert rotary.bytes == 2 * 2 * s.tokens * (16 + 1) * 64
    train = _training(tmp_path)  # sequence 4096, sequence parallel over tp 8
    saved = {a.name: a.bytes for block in layer_saved(train, shapes(train)) for a in block}
    assert saved["attention K"] == 2 * 4096 * 16 * 192
    assert saved["attention V"] == 2 * 4096 * 16 * 128
    # query and key/value latents before and after their norms, the rotary key once, on
    # the rank's sequence shard
    assert saved["attention latents (MLA)"] == 2 * (4096 // 8) * (2 * (1536 + 512) + 64)


def test_eager_decode_reads_the_latent_twice(tmp_path):
    """Without a fused kernel, the scores read the whole cached latent and rotary key (576)
    and the product with the scores reads its 512-wide latent again."""
    plan = _plan(tmp_path, model="{preset: deepseek-v3, attention: eager}")
    s = shapes(plan, query_len=1, kv_len=5120)
    scores_qk, _, times_v = flops.attention_core(plan, s)
    scores = 2 * 16 * 128 * 5120
    assert scores_qk.bytes == 2 * 16 * 128 * 576 + 2 * 16 * 5120 * 576 + scores
    assert times_v.bytes == scores + 2 * 16 * 5120 * 512 + 2 * 16 * 128 * 512


def test_the_kv_cache_is_labelled_replicated_over_tp(tmp_path):
    report = build_report(_plan(tmp_path, tp=8, dp=2, ep=2))
    cache = next(a for a in report.stages[0].peak_overlap if a.category == "kv_cache")
    assert cache.placement == "replicate on tp"


def test_sequence_parallel_gathers_the_latents_not_the_hidden_state(tmp_path):
    """Training at tp 8 with sequence parallelism: each rank projects its 4096 / 8 tokens
    down, and the attention block gathers the latents, 4096 x (1536 + 512 + 64) bf16, where
    a standard block gathers 4096 x 7168. After the backward the replicated down-
    projections' and norms' gradients, partial over tp, are all-reduced there."""
    from budget.layers import sequence_parallel_params
    from budget.step import derive

    plan = _training(tmp_path)
    stage = derive(plan).stages[0]
    forward = next(p for p in stage.phases if p.name == "forward.attention")
    moves = {m.name: m for m in forward.moves}
    assert moves["attention latents"].size_bytes == 2 * 4096 * (1536 + 512 + 64)
    assert moves["attention latents"].op == "all-gather"
    backward = next(p for p in stage.phases if p.name == "backward.attention")
    back = {m.name: m for m in backward.moves}
    latents = 2 * 4096 * (1536 + 512 + 64)
    assert back["attention latents gradient"].op == "reduce-scatter"
    assert back["attention latents gradient"].size_bytes == latents
    # an audit: the up-projections gather their saved inputs again for their weight
    # gradients, the latents without the rotary key, which feeds RoPE and no GEMM
    # (``gather_from_sequence_parallel_region``, whose backward only reduce-scatters)
    again = 2 * 4096 * (1536 + 512)
    assert back["attention latents again, for weight grad"].size_bytes == again
    regathered = [a for i in backward.instants for a in i.live if "re-gathered" in a.name]
    assert regathered and all(a.bytes == again for a in regathered)
    # both overlap the up-projections that read the latents, not the down-projection
    assert back["attention latents gradient"].window == f"{flops.UP_PROJECTIONS} backward"
    assert moves["attention latents"].window == flops.UP_PROJECTIONS
    gathered = [a for i in forward.instants for a in i.live if "all-gathered" in a.name]
    assert gathered and all(a.bytes == latents for a in gathered)
    assert moves["attention output"].size_bytes == 2 * 4096 * 7168
    grads = next(p for p in stage.phases if p.name == "dp.grads")
    (partial,) = [m for m in grads.moves if m.name == "weight gradients partial over tp"]
    dense = 2 * 7168 + 15_140_864  # two RMSNorms and the down-projections with their norms
    assert sequence_parallel_params(plan) == dense
    assert sequence_parallel_params(plan, moe=True) == dense + 7168 * 256
    # 3 dense and 58 MoE layers, the multi-token prediction module's MoE layer and three
    # norms, and the final norm, all on this one stage, in fp32
    moe = dense + 7168 * 256
    assert partial.size_bytes == 4 * (3 * dense + 58 * moe + moe + 3 * 7168 + 7168)


def test_context_parallelism_exchanges_keys_and_values_of_their_own_widths(tmp_path):
    """Under context parallelism the ring moves this rank's K (heads/tp x (128 + 64)) and V
    (heads/tp x 128) for the whole sequence: 2 B x 4096 x 16 x (192 + 128) at tp 8."""
    plan = _training(tmp_path)
    text = Path(plan.file).read_text().replace("dp: 2, ep: 2", "dp: 1, cp: 2, ep: 2")
    Path(plan.file).write_text(text)
    from budget.step import derive

    stage = derive(load_plan(Path(plan.file))).stages[0]
    forward = next(p for p in stage.phases if p.name == "forward.attention")
    (ring,) = [m for m in forward.moves if m.group == "cp"]
    assert ring.size_bytes == 2 * 4096 * 16 * (192 + 128)


def test_attention_bias_sits_on_the_down_and_output_projections(tmp_path):
    """DeepSeek's attention_bias gives q_a_proj, kv_a_proj_with_mqa and o_proj a bias, not
    the up-projections: 1536 + 576 + 7168 more parameters per layer."""
    plan = _plan(tmp_path, model="{preset: deepseek-v3, bias: true}")
    total, _ = attention_params(plan)
    assert total == 187_114_496 + 1536 + 576 + 7168


def test_without_sequence_parallelism_the_latents_gradient_is_all_reduced(tmp_path):
    """At tp 8 without sequence parallelism (a dense model with DeepSeek-V3's attention, so
    training allows it) the replicated down-projections run on all tokens and the
    column-parallel up-projections' input gradient, the latents' gradient, is all-reduced:
    2 B x 4096 x (1536 + 512 + 64), not the hidden state's 4096 x 7168."""
    from budget.step import derive

    model = (
        "{layers: 4, hidden: 7168, heads: 128, head_dim: 128, ffn: 18432, vocab: 129280, "
        "mlp: swiglu, norm: rmsnorm, mla: {q_rank: 1536, kv_rank: 512, nope_dim: 128, "
        "rope_dim: 64}}"
    )
    text = SERVING.format(model=model, tp=8, dp=2, ep=1).replace("mode: decode\n", "")
    text = text.replace(
        "batch: {sequences: 256, prompt: 4096, generate: 1024}",
        "batch: {seq: 4096, micro: 1, global: 64}",
    )
    path = tmp_path / "dense.yaml"
    path.write_text(text.replace(", ep: 1", ", zero: 1"), encoding="utf-8")  # fp8 params
    stage = derive(load_plan(path)).stages[0]
    backward = next(p for p in stage.phases if p.name == "backward.attention")
    (reduce,) = [m for m in backward.moves if m.name == "attention latents gradient"]
    assert reduce.op == "all-reduce"
    assert reduce.size_bytes == 2 * 4096 * (1536 + 512 + 64)
    assert not [m for m in backward.moves if "input" in m.name]


def test_qk_norms_are_refused_beside_latent_attention(tmp_path: Path) -> None:
    """Latent attention norms its latents (counted with model.mla); a head norm on top
    would be a model the plan language does not describe."""
    with pytest.raises(BudgetError) as raised:
        _plan(tmp_path, model="{preset: deepseek-v3, qk_norm: per_head}")
    (problem,) = raised.value.problems
    assert (problem.path, problem.line) == ("$.model.qk_norm", 3)
    assert problem.message.startswith("model.qk_norm = per_head with model.mla: latent")


def test_qkv_biases_are_refused_beside_latent_attention(tmp_path: Path) -> None:
    with pytest.raises(BudgetError) as raised:
        _plan(tmp_path, model="{preset: deepseek-v3, qkv_bias: true}")
    (problem,) = raised.value.problems
    assert (problem.path, problem.line) == ("$.model.qkv_bias", 3)
    assert "latent attention has no Q, K and V projections" in problem.message


def test_the_up_projections_read_the_latents_they_are_timed_beside(tmp_path):
    """DeepSeek-V3 training (tp 8, sequence parallel): the moment the up-projections run
    holds the latents they read, 2 B × 512 tokens × (2 × (1,536 + 512) + 64) on the rank's
    sequence shard, beside their all-gathered copy and the Q, K and V they write (a review:
    only the outputs were counted there)."""
    from budget.step import derive

    train = _training(tmp_path)
    (stage, *_) = derive(train).stages
    (phase,) = [p for p in stage.phases if p.name == "forward.attention"]
    live = {a.name: a for a in phase.instants[0].live}
    assert phase.instants[0].label == flops.UP_PROJECTIONS
    assert live["attention latents (MLA)"].total == 2 * (4096 // 8) * (2 * (1536 + 512) + 64)
    assert {"attention Q", "attention K", "attention V", "attention latents (all-gathered)"} <= set(
        live
    )
    # and the KV up-projection's output K and V are built from, [4,096 tokens, 128 / 8
    # heads, 128 + 128] in bf16 (an audit, m332: uncounted)
    assert live["KV up-projection output (MLA)"].total == 2 * 4096 * 16 * (128 + 128)
