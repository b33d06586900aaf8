"""Mixture of experts, context parallelism and serving, against hand calculations."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from budget.inference import decode_keys, derive_inference, kv_cache_bytes
from budget.layers import (
    active_params,
    attention_saved,
    expert_data_parallel,
    layer_params,
    layer_saved,
    moe_layers,
    moe_saved,
    shapes,
    stage_params,
)
from budget.memory import memory
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Batch, Experts, Model, Plan
from budget.report import to_dict
from budget.step import derive
from tests.builders import make_plan
from tests.plan_files import ROOT, variant

PLANS = Path(__file__).parent.parent / "plans"


def _load_text(tmp_path: Path, text: str):
    """`text` written as a plan file and loaded, as a user's edited copy of a shipped plan."""
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    return load_plan(path)


# Megatron-LM's MoE example with shared experts (issue 5): Qwen1.5-MoE-A2.7B-like.
QWEN_MOE = Model(
    layers=24,
    hidden=2048,
    heads=16,
    kv_heads=16,
    head_dim=128,
    ffn=5632,
    vocab=152064,
    mlp="swiglu",
    norm="rmsnorm",
    bias=False,
    tied_embeddings=False,
    position="rope",
    experts=Experts(
        count=60, top_k=4, ffn=1408, shared_ffn=5632, shared_gate=True, first_dense_layers=1
    ),
)


def _qwen(**kw):
    plan = make_plan(QWEN_MOE, tp=2, pp=2, dp=4, sp=True, zero=1, seq=4096, global_batch=64, **kw)
    return replace(plan, parallel=replace(plan.parallel, ep=4, etp=1))


def test_moe_layer_pattern_and_parameters():
    plan = _qwen()
    assert moe_layers(plan) == [False] + [True] * 23
    h = 2048
    moe = layer_params(plan, moe=True)
    assert moe.expert_total == 60 * 3 * h * 1408
    assert moe.expert_per_rank == 15 * 3 * h * 1408  # 60 experts / ep 4, etp 1
    # router (h x 60) and the shared expert's gate (h) are replicated; the shared expert
    # splits over tp 2 like a dense MLP; attention 4h² over tp; two RMSNorms.
    assert moe.per_rank == 4 * h * h // 2 + 2 * h + 60 * h + 3 * h * 5632 // 2 + h


def test_biases_reach_the_router_and_every_expert():
    """With model.bias every linear layer has one (gpt-oss's attention, router and experts):
    per MoE layer of this Qwen-style model, q, k, v and o biases 4 x 2048 (o's replicated),
    the router's 60, each expert's fc1 2 x 1408 and fc2 2048, and the shared expert's fc1
    2 x 5632 and fc2 2048."""
    h = 2048
    plain = layer_params(_qwen(), moe=True)
    biased = layer_params(_qwen(bias=True), moe=True)
    assert biased.total - plain.total == 4 * h + 60 + (2 * 5632 + h)
    assert biased.expert_total - plain.expert_total == 60 * (2 * 1408 + h)


def test_expert_states_shard_over_the_expert_data_parallel_group():
    """Megatron-Core: expert data parallel = tp·cp·dp / (ep·etp) = 2·1·4 / (4·1) = 2."""
    plan = _qwen()
    assert expert_data_parallel(plan) == 2
    first = stage_params(plan, 0)
    assert first.expert_per_rank == 11 * 15 * 3 * 2048 * 1408  # layers 1..11 are MoE


def test_context_parallel_ranks_join_the_expert_data_parallel_group():
    """Megatron-Core's megatron/core/parallel_state.py (``initialize_model_parallel``) sets
    ``expert_data_parallel_size = world_size // (expert_tensor_parallel_size *
    expert_model_parallel_size * pipeline_model_parallel_size)``; with world = tp·cp·dp·pp
    that is tp·cp·dp / (etp·ep): the context-parallel ranks join the expert group.
    Qwen-MoE at tp 2, cp 2, dp 4, ep 4, etp 1: edp = 2·2·4 / (4·1) = 4 (8 / 4 = 2 if cp
    were left out). Stage 0 holds 11 MoE layers of 60 / ep 4 = 15 local experts of
    3·2048·1408 each; under ZeRO 1 (Rajbhandari et al., arXiv 1910.02054, section 5.1)
    their fp32 Adam moments (2 x 4 B) and master weights (4 B) shard over the 4 edp ranks,
    the fp32 gradients do not, and the step reduce-scatters those gradients (fp32) over
    the same 4 ranks."""
    plan = _qwen(cp=2)
    par = plan.parallel
    assert (par.tp, par.cp, par.dp, par.ep, par.expert_tp) == (2, 2, 4, 4, 1)
    edp = par.tp * par.cp * par.dp // (par.ep * par.expert_tp)
    assert edp == 4
    experts = 11 * (60 // 4) * 3 * 2048 * 1408  # stage 0's expert parameters on a rank
    assert experts == 1_427_374_080
    stage = derive(plan).stages[0]
    held = {a.name: a.total for a in stage.resident}
    assert held["expert Adam moments (fp32)"] == 2 * 4 * experts // edp == 2_854_748_160
    assert held["expert master weights (fp32)"] == 4 * experts // edp
    assert held["expert gradients (fp32)"] == 4 * experts
    (grads,) = [p for p in stage.phases if p.name == "dp.grads"]
    (scatter,) = [m for m in grads.moves if m.name == "expert gradients"]
    assert (scatter.op, scatter.group, scatter.ranks) == ("reduce-scatter", "edp", edp)
    assert scatter.size_bytes == 4 * experts
    assert expert_data_parallel(plan) == edp
    # the JSON report says the same bytes at stage 0's peak
    report = to_dict(build_report(plan))["memory"]["stages"][0]
    at_peak = {a["tensor"]: a["bytes"] for a in report["peak_overlap"]}
    assert at_peak["expert Adam moments (fp32)"] == 2 * 4 * experts // edp


def test_megatron_moe_example_weight_and_optimizer_bytes():
    """Issue 5 acceptance 1 quotes 22,096,392,192 B: Megatron-LM's estimator
    (megatron/training/theoretical_memory_usage.py, the version with expert parallelism)
    on this model. That estimator spreads the transformer block evenly over the stages,
    23 MoE layers / 2 = 11.5 per stage. budget places the real layers: stage 0 holds the
    dense first layer and 11 MoE layers, stage 1 holds 12. Per stage, budget gives
    465,418,240 non-expert parameters at 6 + 12/dp = 9 bytes and 11 x 15 local experts of
    3·2048·1408 at 6 + 12/edp = 12 bytes (edp = 16 / (etp 1 · ep 4 · pp 2) = 2), i.e.
    21,317,253,120 B; stage 1 holds 12 MoE layers, the final norm and the output layer's
    shard, 465,545,216 non-expert parameters and 12 x 15 local experts, 22,875,531,264 B;
    Megatron's figure is their mean, to the byte."""
    from budget.layers import resident_states

    plan = _qwen()

    def states(stage: int) -> int:
        params = stage_params(plan, stage)
        allocs = resident_states(plan, params.per_rank, params.expert_per_rank)
        return sum(a.total for a in allocs if a.category != "reserved")

    first = stage_params(plan, 0)
    h = 2048  # stage 0 at tp 2: the embedding shard, the dense layer, 11 MoE layers' non-experts
    dense = 4 * h * h // 2 + 3 * h * 5632 // 2 + 2 * h
    moe = 4 * h * h // 2 + 2 * h + 60 * h + 3 * h * 5632 // 2 + h  # router, shared expert, gate
    assert first.per_rank == 152064 * h // 2 + dense + 11 * moe == 465_418_240
    assert first.expert_per_rank == 11 * 15 * 3 * 2048 * 1408
    assert states(0) == 465_418_240 * 9 + 1_427_374_080 * 12 == 21_317_253_120
    last = stage_params(plan, 1)  # 12 MoE layers, the final norm, the output layer's shard
    assert last.per_rank == 12 * moe + h + 152064 * h // 2 == 465_545_216
    assert last.expert_per_rank == 12 * 15 * 3 * 2048 * 1408
    assert states(1) == 465_545_216 * 9 + 12 * 15 * 3 * 2048 * 1408 * 12 == 22_875_531_264
    megatron = 22_096_392_192
    assert (states(0) + states(1)) // 2 == megatron
    assert (states(0) + states(1)) % 2 == 0  # the mean is whole: no rounding hides in it
    assert states(0) < megatron < states(1)


def test_dispatch_and_combine_follow_tokens_topk_hidden():
    """Issue 5 acceptance 2: all-to-alls on ep of tokens x top_k x hidden per rank (and
    Megatron-Core's of the routing probabilities, one a row, beside the dispatch)."""
    plan = _qwen()
    moe = next(p for p in derive(plan).stages[0].phases if p.name == "forward.moe")
    a2a = [m for m in moe.moves if m.op == "all-to-all"]
    assert [m.name for m in a2a] == ["MoE dispatch", "MoE probabilities", "MoE combine"]
    tokens_per_rank = 4096 // 2  # sequence parallel over tp 2
    per_rank = 2 * tokens_per_rank * 4 * 2048  # bf16 x tokens x top-4 x hidden
    for m in a2a:
        assert m.group == "ep" and m.ranks == 4
    assert [m.size_bytes for m in a2a] == [per_rank * 4, per_rank // 2048 * 4, per_rank * 4]


@pytest.mark.parametrize(
    ("factor", "pad", "rows"),
    [
        (1.25, False, 8192),  # balanced routing fills no expert past its even share
        (0.5, False, 60 * 69),  # a capacity under the even share drops the rest
        (1.25, True, 60 * 171),  # padded: every expert computes its whole capacity
    ],
)
def test_a_capacity_factor_pads_or_drops_the_dispatched_rows(factor, pad, rows):
    """Megatron-Core: --moe-expert-capacity-factor caps each expert at ⌈tokens·k/E·c⌉ rows
    of a rank (``get_capacity``) and drops the overflow; only
    --moe-pad-expert-input-to-capacity fills every expert to it (review: c = 1.25 was taken
    as padded, Mixtral's all-to-all 35 MiB for 28 MiB and its step 17 % longer). Qwen-MoE
    at tp 2 with sequence parallelism: 2,048 tokens a rank x top 4 = 8,192 rows dispatched
    dropless, 136.5 an expert over 60; at c 0.5 each expert takes ⌈68.27⌉ = 69, 60 × 69 =
    4,140 rows; padded at c 1.25 each computes ⌈170.67⌉ = 171, 60 × 171 = 10,260 (4,096 and
    10,240 before rounding per expert, an audit)."""
    plan = _qwen()
    experts = replace(plan.model.experts, capacity_factor=factor, pad_to_capacity=pad)
    capped = replace(plan, model=replace(plan.model, experts=experts))
    assert shapes(plan).dispatched == 4096 // 2 * 4
    assert shapes(capped).dispatched == rows


@pytest.mark.parametrize(
    ("skew", "factor", "pad", "ep", "rows"),
    [
        (1.5, None, False, 4, 1.5 * 8192),  # dropless: the busiest rank takes 1.5 x even
        (9.0, None, False, 4, 4 * 8192),  # at most every row of the ep group (ep 4)
        (100.0, None, False, 32, 15 * 8192),  # at most top 4 of a token's rows, 60 / 4 = 15
        (1.5, 1.25, False, 4, 60 * 171),  # a capacity caps what any expert takes
        (1.5, 0.5, False, 4, 60 * 69),  # ... below the even share too
        (1.5, 1.25, True, 4, 60 * 171),  # padded, every expert computes its capacity anyway
        (1.5, None, False, 1, 8192),  # one rank holds every expert: nothing to be uneven
    ],
)
def test_routing_skew_sizes_the_busiest_rank(skew, factor, pad, ep, rows):
    """experts.imbalance f budgets the busiest expert-parallel rank: tokens·k·min(f, ep)
    rows dispatched and computed dropless, at most E·⌈tokens·k/E·c⌉ under a capacity factor
    c (each of E experts takes at most ⌈tokens·k/E·c⌉ of each rank's rows: 60 × ⌈170.67⌉ =
    10,260 at c 1.25, 60 × ⌈68.27⌉ = 4,140 at c 0.5), all of it padded. Qwen-MoE at tp 2
    with sequence parallelism: 2,048 tokens a rank x
    top 4 = 8,192 rows even; at f 1.5 and ep 4 its all-to-all moves 12,288 rows of 2,048
    bf16 from each of 4 ranks (S = 4 x 12,288 x 2,048 x 2 B), its dispatched-token
    activation and the expert GEMMs' FLOPs grow by 1.5, and the model FLOPs MFU counts stay
    (no assignment is dropped)."""
    from budget.flops import model_flops_per_token

    plan = _qwen()
    experts = replace(
        plan.model.experts, imbalance=skew, capacity_factor=factor, pad_to_capacity=pad
    )
    skewed = replace(
        plan, model=replace(plan.model, experts=experts), parallel=replace(plan.parallel, ep=ep)
    )
    assert shapes(skewed).dispatched == rows
    assert model_flops_per_token(skewed) == model_flops_per_token(
        replace(skewed, model=replace(skewed.model, experts=replace(experts, imbalance=1.0)))
    )
    if (skew, factor, ep) != (1.5, None, 4):
        return
    even = replace(plan, parallel=replace(plan.parallel, ep=4))
    phases = [
        {p.name: p for p in derive(p).stages[0].phases}["forward.moe"] for p in (even, skewed)
    ]
    (dispatch,) = [m for m in phases[1].moves if m.name == "MoE dispatch"]
    assert dispatch.size_bytes == 4 * 12_288 * 2048 * 2
    saved = [
        {a.name: a.total for a in moe_saved(p, shapes(p))}["dispatched tokens"]
        for p in (even, skewed)
    ]
    assert saved[1] == 1.5 * saved[0] == 12_288 * 2048 * 2
    flops = [sum(w.flops for w in ph.works if w.name.startswith("expert fc")) for ph in phases]
    assert flops[1] == pytest.approx(1.5 * flops[0])


@pytest.mark.parametrize(
    ("keys", "skew"),
    [
        ("imbalance: 1.5", 1.5),
        ("imbalance: 8", 4.0),  # 8 experts at ep 8: one a rank, which takes 2 of 2 rows a token
        ("imbalance: 3, capacity_factor: 1.25", 1.25),  # no expert takes more than c
        ("imbalance: 3, capacity_factor: 0.5", 1.0),  # the even share is capped already
        ("imbalance: 3, capacity_factor: 1.5, pad_to_capacity: true", 1.0),  # all compute c
    ],
)
def test_the_report_says_the_skew_it_budgets(tmp_path, keys, skew):
    """The header and the JSON give the skew the rows are sized at, not the one the plan
    wrote (a review: "busiest ep rank 4x" beside rows sized at the even share)."""
    from rich.console import Console

    from budget.render.table import render_table

    mixtral = ROOT / "plans" / "mixtral-8x7b.yaml"
    path = variant(tmp_path, "skewed.yaml", ("top_k: 2", f"top_k: 2, {keys}"), base=mixtral)
    report = build_report(load_plan(path))
    assert to_dict(report)["model"]["experts"]["imbalance"] == skew
    console = Console(width=200, color_system=None, record=True)
    render_table(console, report)
    text = " ".join(console.export_text().split())  # the header wraps where it is long
    assert (f"busiest ep rank {skew:g}× the even share" in text) == (skew > 1)


@pytest.mark.parametrize("pad", [False, True])
def test_mfu_counts_the_assignments_a_capacity_keeps(pad):
    """Model FLOPs count the expert work tokens get (an audit: top 2 at capacity 0.5 read
    67 % MFU where top 1, the same expert work, read 40 %), as the capacity keeps it per
    expert (`layers.expert_capacity`): a rank's T = 4096 / tp 2 = 2,048 tokens send T·k =
    8,192 rows and each of the 60 experts keeps C = ⌈2,048·4·0.5/60⌉ = ⌈68.27⌉ = 69, so
    E·C = 4,140 rows, 4,140 / 2,048 = 2.021484375 assignments a token, not top 4's half, 2:
    23 MoE layers × 6 × 8,650,752 (3 × 2,048 × 1,408) × 44 / 2,048 = 25,648,128 FLOPs a
    token more than top 2 (a later audit: the drop was (1 − c)·k whatever the rounding).
    A capacity above 1 drops nothing, and its padding is no model FLOP, so it counts as
    dropless."""
    from budget.flops import model_flops_per_token

    plan = _qwen()

    def with_experts(**keys):
        experts = replace(plan.model.experts, **keys)
        return model_flops_per_token(replace(plan, model=replace(plan.model, experts=experts)))

    top = plan.model.experts.top_k
    expert = 3 * 2048 * 1408
    assert expert == 8_650_752 and -(-2048 * 4 * 5 // (60 * 10)) == 69
    rounding = 6 * 23 * expert * (60 * 69 - 2048 * 2) // 2048
    assert rounding == 25_648_128
    assert with_experts(capacity_factor=0.5, pad_to_capacity=pad) == (
        with_experts(top_k=top // 2) + rounding
    )
    assert with_experts(capacity_factor=1.25, pad_to_capacity=pad) == model_flops_per_token(plan)


def test_padding_needs_a_capacity(tmp_path):
    from budget.errors import BudgetError

    text = (PLANS / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    flow = "experts: {count: 8, top_k: 2, ffn: 14336"
    assert flow in text
    with pytest.raises(BudgetError, match=r"experts\.pad_to_capacity: pad_to_capacity pads"):
        _load_text(tmp_path, text.replace(flow, flow + ", pad_to_capacity: true"))
    padded = text.replace(flow, flow + ", capacity_factor: 1.25, pad_to_capacity: true")
    assert _load_text(tmp_path, padded).model.experts.pad_to_capacity


def test_dense_plan_has_no_all_to_all():
    step = derive(make_plan())
    assert not [m for s in step.stages for p in s.phases for m in p.moves if m.op == "all-to-all"]


def test_mfu_counts_active_not_total_parameters():
    """MFU's 6N counts the parameters a token uses: the 4 routed experts it picks of 60, not
    all of them (Fedus et al.), less the input embedding, which does no GEMM (PaLM appendix
    B's 6N + 12·L·h·s). Counted by hand for the Qwen-style model: untied embeddings, a
    final RMSNorm, one dense layer, then 23 MoE layers with a router (60 columns), a shared
    expert and its one-column gate."""
    plan = _qwen()
    device = replace(plan.device, flops=(("bf16", 989e12),), memory_bandwidth=3.35e12)
    plan = replace(plan, device=device)
    h, v, seq, layers = 2048, 152064, 4096, 24
    attention = 4 * h * h + 2 * h  # Q, K, V, O (16 kv heads of 128 = h) and the two norms
    dense = attention + 3 * h * 5632
    used_experts = 4 * 3 * h * 1408
    moe = attention + 60 * h + h + 3 * h * 5632 + used_experts
    active = 2 * v * h + h + dense + 23 * moe
    assert active_params(plan) == active
    per_token = 6 * (active - v * h) + 12 * layers * h * seq
    report = build_report(plan)
    peak = 16 * 989e12  # tp 2 × pp 2 × dp 4 GPUs
    tokens = 64 * seq
    assert report.step["mfu"] == pytest.approx(per_token * tokens / (report.step["time_s"] * peak))
    every_expert = per_token + 6 * 23 * 56 * 3 * h * 1408  # the 56 experts a token skips
    assert report.step["mfu"] < 0.75 * every_expert * tokens / (report.step["time_s"] * peak)


def test_context_parallel_divides_saved_activations():
    """Issue 5 acceptance 3: cp 1 → 4 divides what each layer saves by 4 (every saved
    tensor scales with the local tokens) and adds the K/V exchange on cp, once more in
    backward where selective recompute runs the attention core again."""
    one = make_plan(tp=8, pp=8, dp=16, cp=1, seq=8192)
    four = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192)
    per_layer = [
        sum(a.total for block in layer_saved(p, shapes(p)) for a in block) for p in (one, four)
    ]
    assert per_layer[0] == 4 * per_layer[1]
    mem1, mem4 = (memory(derive(p), p.device.memory) for p in (one, four))
    assert mem1.stages[0].by_category["activations"] == pytest.approx(
        4 * mem4.stages[0].by_category["activations"], rel=0.01
    )
    moves = [m for p in derive(four).stages[0].phases for m in p.moves if m.group == "cp"]
    assert {m.name for m in moves} == {
        "attention K/V (ring exchange)",
        "attention K/V (ring exchange) (recomputed forward)",
        "attention dK/dV (ring exchange)",
    }
    assert not [m for p in derive(one).stages[0].phases for m in p.moves if m.group == "cp"]


def test_decode_kv_cache_matches_the_formula():
    """Issue 5 acceptance 4: layers per stage x kv_heads per tp rank x head_dim x 2 x tokens
    x batch x bytes; no gradients or optimizer state; tp collectives latency-bound."""
    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    expected = 80 * (8 // 8) * 128 * 2 * (2048 + 512) * 32 * 2
    assert kv_cache_bytes(plan, 80) == expected
    report = build_report(plan)
    stage = report.stages[0]
    assert stage.kv_cache_bytes == expected
    assert stage.grads_bytes == 0 and stage.optimizer_bytes == 0
    decode = [c for p in report.phases if p.name.startswith("decode.") for c in p.collectives]
    assert decode and all(c.group == "tp" for c in decode)
    for c in decode:  # the layers' all-reduces move a token's rows: n·α > Q/B_eff
        assert c.latency_term_s > c.bandwidth_term_s or c.name == "logits for sampling"
    assert report.step["ttft_s"] > 0 and report.step["decode_token_s"] > 0


def test_decoding_with_context_parallelism_splits_the_prompt_not_the_context(tmp_path):
    """Ring attention chunks the prompt in prefill (2 x cp | prompt); decoding appends one
    token at a time to a cache sharded along the sequence, so prompt + generate need not
    divide: Llama 3 70B decoding at tp 4 and cp 2, 2,048 prompt tokens + 1, holds
    80 layers x 8 / 4 kv heads x 128 x 2 (K, V) x ceil(2,049 / 2) = 1,025 tokens x 32
    sequences x 2 B on each rank."""
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    text = text.replace("generate: 512", "generate: 2").replace("tp: 8", "tp: 4\n  cp: 2")
    plan = _load_text(tmp_path, text)
    assert (plan.parallel.cp, plan.batch.prompt, plan.batch.generate) == (2, 2048, 2)
    assert kv_cache_bytes(plan, 80) == 80 * 2 * 128 * 2 * 1025 * 32 * 2
    # each rank attends its 1,025 cached tokens, not all 2,049: the fused kernel reads
    # 32 x 1,025 x 2 kv heads x 128 x 2 (K, V) x 2 B, and writes/reads one query row
    decode = [
        p for s in derive_inference(plan).stages for p in s.phases if p.name == "decode.attention"
    ]
    (phase,) = decode
    (core,) = [w for w in phase.works if w.kind == "attention"]
    assert core.bytes == 2 * 32 * (16 * 128 + 1025 * 2 * 128 * 2 + 16 * 128)
    # ... in one kernel call on its 1,025 keys, whose rate is that length's (it was halved
    # again, as if the ring of the prefill split the rank's share once more)
    assert core.keys == 1025
    # ... and the two ranks exchange fp32 partial outputs (16 heads x 128) and log-sum-exps
    (combine,) = [m for m in phase.moves if m.group == "cp"]
    assert (combine.op, combine.size_bytes) == ("all-gather", 2 * 4 * 32 * (16 * 128 + 16))


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-moe-16b", "llama3-70b-decode"])
def test_new_plans_fit(name):
    assert build_report(load_plan(PLANS / f"{name}.yaml")).fits


def test_fp8_halves_the_bytes_gemm_inputs_and_parameter_gathers_touch():
    """Issue 5: fp8 matmul inputs and fp8 parameter all-gathers (Micikevicius et al., "FP8
    Formats for Deep Learning", arXiv 2209.05433; Transformer Engine) halve the bytes a GEMM
    reads and a ZeRO gather moves, against bf16: the layers' GEMM weights, that is; the rest
    (vocabulary, norms, biases) is gathered apart in bf16, as Megatron-LM keeps it."""
    from budget import flops
    from budget.plan.model import Precision

    bf16 = make_plan(zero=1)
    fp8 = make_plan(zero=1, precision=Precision(matmul="fp8", param_gather="fp8"))
    gemm = {
        p: next(w for w in flops.mlp_forward(p, shapes(p)) if w.name == "MLP fc1")
        for p in (bf16, fp8)
    }
    assert gemm[fp8].bytes * 2 == gemm[bf16].bytes
    assert gemm[fp8].flops == gemm[bf16].flops

    def gathered(plan, name="updated parameters"):
        stage = derive(plan).stages[0]
        return next(m for p in stage.phases for m in p.moves if m.name == name)

    wide = gathered(fp8, "updated 16-bit parameters")
    assert wide.dtype == "bf16" and wide.size_bytes > 0
    assert gathered(fp8).size_bytes * 2 + wide.size_bytes == gathered(bf16).size_bytes
    assert gathered(fp8).dtype == "fp8"


def test_new_plan_sections_load_from_yaml(tmp_path):
    """Issue 5: expert tensor parallelism, fp8 precision options and all-gather context
    parallelism written in a plan file load and budget."""
    plan = load_plan(
        variant(
            tmp_path,
            "plan.yaml",
            ("  ep: 8\n", "  ep: 8\n  etp: 1\n"),
            ("  params: bf16\n", "  params: fp8\n"),  # --fp8-param-gather's FP8 parameters
            ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n  param_gather: fp8\n"),
            ("reserved: 4 GiB}", "reserved: 4 GiB, flops: {fp8: 1800 TFLOP/s}}"),
            base=PLANS / "mixtral-8x7b.yaml",
        )
    )
    assert plan.device.peak_flops("fp8") == 1800e12  # the plan's figure over the preset's
    assert plan.parallel.etp == 1
    assert plan.precision.matmul == "fp8" and plan.precision.param_gather == "fp8"
    report = build_report(plan)
    assert report.fits and report.step["mfu"] > 0


def test_an_unknown_number_format_is_refused(tmp_path):
    from typer.testing import CliRunner

    from budget.cli import app, route

    source = (PLANS / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "bad.yaml"
    path.write_text(
        source.replace("  activations: bf16\n", "  activations: bf16\n  matmul: fp7\n"),
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, route(["validate", str(path)]))
    assert result.exit_code == 2
    assert "$.precision.matmul" in result.stderr and "fp7" in result.stderr


MIXTRAL_SERVING = """\
name: mixtral-serving
mode: decode
model: {preset: mixtral-8x7b}
batch: {sequences: 32, prompt: 2048, generate: 512}
precision: {params: bf16, activations: bf16}
parallel: {tp: 8}
device: {preset: h100-sxm}
topology: {preset: dgx-h100, nodes: 1}
"""


def test_expert_rows_are_gathered_over_etp_without_expert_parallelism():
    """Training, ep 1, tp = etp 2 with sequence parallelism (Megatron-Core), the Qwen-like
    model at sequence 4096: each rank holds 4096 / 2 = 2048 tokens and routes them top-4
    (8192 rows); the experts split over etp 2 need the rows of both ranks, an all-gather
    of 2 x 8192 rows of hidden 2048 in bf16 before the experts and a reduce-scatter after,
    with no all-to-all. Before, ep 1 dropped the gather and the scatter while the experts
    still computed the gathered rows."""
    plan = _qwen()
    plan = replace(plan, parallel=replace(plan.parallel, ep=1, etp=None))
    s = shapes(plan)
    assert (s.dispatched, s.routed) == (2048 * 4, 2 * 2048 * 4)
    moe = next(p for p in derive(plan).stages[0].phases if p.name == "forward.moe")
    ops = {m.name: (m.op, m.group, m.ranks, m.size_bytes) for m in moe.moves}
    rows = 2 * (2048 * 4) * 2 * 2048  # etp x (local tokens x top-4) x bf16 x hidden
    assert ops["expert input rows"] == ("all-gather", "etp", 2, rows)
    assert ops["expert output rows"] == ("reduce-scatter", "etp", 2, rows)
    assert not [m for m in moe.moves if m.op == "all-to-all"]


def test_training_moe_under_tp_without_sequence_parallelism_is_refused(tmp_path):
    """Megatron-LM's argument check refuses MoE with tp > 1 unless sequence parallelism
    is on: every tp rank would route the same tokens."""
    from budget.errors import BudgetError

    text = MIXTRAL_SERVING.replace("mode: decode", "mode: train").replace(
        "batch: {sequences: 32, prompt: 2048, generate: 512}",
        "batch: {seq: 4096, micro: 1, global: 64}",
    )
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    (problem,) = raised.value.problems
    assert problem.path == "$.parallel.sequence_parallel"
    assert "MoE layers with tp = 8 need sequence_parallel: true" in problem.message
    path.write_text(text.replace("{tp: 8}", "{tp: 8, sequence_parallel: true}"), "utf-8")
    assert load_plan(path).parallel.sequence_parallel


def test_serving_moe_under_tp_computes_each_token_once(tmp_path):
    """Mixtral 8x7B served on 8 H100s with tp 8 (vLLM's tensor-parallel fused MoE): every
    rank holds all 32 sequences' tokens, so each computes their 32 x 2 routed rows (decode,
    one token per sequence, top-2) on its eighth of every expert (14336 / 8 = 1792 columns),
    with nothing gathered, and one all-reduce of the block's output (32 x 4096 bf16) over
    tp. The grouped GEMMs read the weight shards of the local experts the 64 rows reach,
    all but a (7/8)^64 = 0.02 % share of the 8: fc1 4096 x (2 x 1792) and fc2 1792 x 4096
    per expert, in bf16."""
    from budget import flops

    path = tmp_path / "plan.yaml"
    path.write_text(MIXTRAL_SERVING, encoding="utf-8")
    plan = load_plan(path)
    s = shapes(plan, query_len=1, kv_len=2048 + 512)
    assert (s.tokens, s.dispatched, s.routed, s.expert_cols) == (32, 64, 64, 1792)
    assert s.local_experts == 8
    works = {w.name: w for w in flops.moe_forward(plan, s)}
    fc1, fc2 = works["expert fc1"], works["expert fc2"]
    assert fc1.flops == 2 * 64 * 4096 * 3584
    every_expert = pytest.approx
    assert fc1.bytes == every_expert(2 * (64 * 4096 + 8 * 4096 * 3584 + 64 * 3584), rel=3e-4)
    assert fc2.bytes == every_expert(2 * (64 * 1792 + 8 * 1792 * 4096 + 64 * 4096), rel=3e-4)
    report = build_report(plan)
    moe = next(p for p in report.phases if p.name == "decode.moe")
    (reduce,) = moe.collectives
    assert (reduce.op, reduce.group, reduce.ranks) == ("all-reduce", "tp", 8)
    assert reduce.bytes == 32 * 4096 * 2


def _decode_fc1(tmp_path, text: str):
    """The expert fc1 GEMM of a one-stage decode plan's MoE phase."""
    (stage,) = derive_inference(_load_text(tmp_path, text)).stages
    (moe,) = [p for p in stage.phases if p.name == "decode.moe"]
    (fc1,) = [w for w in moe.works if w.name == "expert fc1"]
    return fc1


def test_grouped_gemm_reads_the_weights_of_the_experts_its_rows_reach():
    """Top-1 routing over 8 local experts, counted by inclusion-exclusion: 2 rows reach
    2 − 1/8 = 1.875 experts (they share one an eighth of the time), 3 rows 3 − 3/8 + 1/64
    = 2.640625; a rank holding a single expert reads it for any rows. Top-2 of 8 (Mixtral),
    4 tokens: by enumeration over the 28 pairs a token may pick, an expert is outside 21 of
    them, so it is missed by all four with (21/28)^4 and 8 · (1 − (3/4)^4) = 5.46875 are
    reached, more than 8 independent rows would reach, 8 · (1 − (7/8)^8) = 5.25."""
    from itertools import combinations

    from budget.flops import grouped_gemm

    def weights(rows: int, groups: int, pick: float) -> int:
        gemm = grouped_gemm("x", rows, 4096, 1792, groups, 2, pick)
        return gemm.bytes // 2 - rows * 4096 - rows * 1792

    assert weights(2, 8, 1 / 8) == round(1.875 * 4096 * 1792)
    assert weights(3, 8, 1 / 8) == round(2.640625 * 4096 * 1792)
    assert weights(5, 1, 1.0) == 4096 * 1792
    assert weights(0, 8, 1 / 8) == 0
    pairs = list(combinations(range(8), 2))
    missed = sum(0 not in p for p in pairs) / len(pairs)
    assert missed == 21 / 28
    assert weights(8, 8, 2 / 8) == round(8 * (1 - missed**4) * 4096 * 1792)
    assert weights(8, 8, 2 / 8) == round(5.46875 * 4096 * 1792)


def test_an_expert_parallel_layer_waits_for_the_rank_that_reads_the_most_experts(tmp_path):
    """With ep ranks each holding its own experts, a decode pass waits for the rank whose
    tokens reach the most of them: the expected maximum of ep binomial counts, checked
    against the sum Σ_{x<g} 1 − F(x)^r written with math.comb. Mixtral at tp 8, ep 8 (one
    expert a rank), 4 sequences of top-2: each expert is reached with chance 1 − (6/8)^4 =
    0.684 and some rank's with 1 − 0.316^8 = 0.9999, so a rank's expert GEMMs read its whole
    expert (the mean rank read 0.684 of it; time per output token 7.13 → 8.35 ms on
    H100s). DeepSeek-V3's 8 local experts at ep 32 for 32 tokens: 5.10 on average, 7.58 on
    the busiest rank."""
    import math

    import numpy as np

    from budget.flops import most_reached

    def exact(g: int, q: float, r: int) -> float:
        cdf = [
            sum(math.comb(g, j) * q**j * (1 - q) ** (g - j) for j in range(x + 1)) for x in range(g)
        ]
        return sum(1 - f**r for f in cdf)

    for g, q, r in (
        (1, 1 - 0.75**4, 8),
        (8, 1 - (1 - 8 / 256) ** 32, 32),
        (4, 0.5, 3),
        (16, 0.1, 64),
    ):
        assert abs(most_reached(g, q, r) - exact(g, q, r)) < 1e-12, (g, q, r)
    assert most_reached(8, 0.3, 1) == 8 * 0.3  # one rank: the mean
    # hundreds of local experts: the terms past g once overflowed exp (hostile audit)
    for g, q, r in ((192, 0.6, 8), (300, 0.9, 2), (512, 0.03, 64)):
        assert abs(most_reached(g, q, r) - exact(g, q, r)) < 1e-9 * g, (g, q, r)
    groups, reach, ranks = (
        np.array([8.0, 192, 512]),
        np.array([0.3, 0.6, 0.03]),
        np.array([2.0, 8, 64]),
    )
    swept = most_reached(groups, reach, ranks)  # a sweep's vectors give each plan's bits
    assert list(swept) == [
        most_reached(*map(float, t)) for t in zip(groups, reach, ranks, strict=True)
    ]
    assert round(most_reached(8, 1 - (1 - 8 / 256) ** 32, 32), 2) == 7.58
    text = (
        "name: mixtral-ep\nmode: decode\nmodel: {preset: mixtral-8x7b}\n"
        "batch: {sequences: 4, prompt: 1024, generate: 256}\n"
        "parallel: {tp: 8, dp: 1, ep: 8, etp: 1}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n"
    )
    fc1 = _decode_fc1(tmp_path, text)
    rows = 4 * 2 / 8  # the mean rank's rows: 4 tokens of top-2 over 8 ranks
    expert = 4096 * 2 * 14336  # one expert's gate and up projections
    reached = 1 - (1 - (1 - 0.75**4)) ** 8
    assert fc1.bytes == 2 * (rows * 4096 + rows * 2 * 14336) + 2 * round(reached * expert)


def test_a_rank_groups_only_its_own_experts():
    """60 experts over ep 4: a rank's grouped GEMM spans its 15 experts, and its 2048 x 4
    routed rows (sequence 4096 split over tp 2, top-4; experts with etp 1 gather nothing)
    reach 15·(1 − (14/15)^8192) of them, all 15."""
    from budget import flops

    plan = _qwen()
    s = shapes(plan)
    assert (s.local_experts, s.routed) == (15, 2048 * 4)
    fc1 = next(w for w in flops.moe_forward(plan, s) if w.name == "expert fc1")
    cols = 2 * 1408  # SwiGLU's gate and up projections
    assert fc1.bytes == 2 * (s.routed * 2048 + 15 * 2048 * cols + s.routed * cols)


def test_serving_with_sequence_parallelism_gathers_the_shared_experts_input(tmp_path):
    """Served with sequence parallelism, the shared expert is a dense tensor-parallel MLP on
    the gathered tokens: an all-gather of its input and a reduce-scatter of its output
    over tp, 2 sequences x 1024 prompt tokens x 2048 in bf16 in prefill."""
    path = tmp_path / "plan.yaml"
    path.write_text(
        MIXTRAL_SERVING.replace("{preset: mixtral-8x7b}", "{preset: qwen-moe}")
        .replace(
            "{sequences: 32, prompt: 2048, generate: 512}",
            "{sequences: 8, prompt: 1024, generate: 64}",
        )
        .replace("{tp: 8}", "{tp: 2, dp: 4, ep: 4, etp: 1, sequence_parallel: true}"),
        encoding="utf-8",
    )
    report = build_report(load_plan(path))
    moe = next(p for p in report.phases if p.name == "prefill.moe")
    ops = {c.name: (c.op, c.group, c.bytes) for c in moe.collectives}
    assert ops["shared expert input"] == ("all-gather", "tp", 2 * 1024 * 2048 * 2)
    assert ops["shared expert output"] == ("reduce-scatter", "tp", 2 * 1024 * 2048 * 2)


def test_the_shared_experts_gate_keeps_both_its_factors():
    """An audit: ``output * gate_score`` (Megatron-Core's ``SharedExpertMLP``) keeps the
    shared experts' output after its reduce-scatter, 4,096 / 2 tokens x 2,048 in bf16 at
    tp 2 under sequence parallelism, and the sigmoid's score a token, for the backward;
    without a gate neither is kept."""
    from budget.layers import moe_saved, shapes

    plan = _qwen()
    gateless = replace(
        plan, model=replace(QWEN_MOE, experts=replace(QWEN_MOE.experts, shared_gate=False))
    )
    saved = {a.name: a.total for a in moe_saved(plan, shapes(plan))}
    plain = {a.name: a.total for a in moe_saved(gateless, shapes(gateless))}
    assert set(saved) - set(plain) == {
        "shared expert output, kept for its gate",
        "shared expert gate score",
    }
    assert saved["shared expert output, kept for its gate"] == 2 * 2048 * 2048
    assert saved["shared expert gate score"] == 2 * 2048


def test_sequence_parallel_moe_parameters_include_the_router_and_shared_gate():
    """The Qwen-like MoE layer under sequence parallelism at tp 2: two RMSNorms (2 x 2048),
    the router (2048 x 60) and the shared expert's sigmoid gate (2048) are applied on each
    rank's token shard, 129,024 parameters whose gradients are all-reduced over tp."""
    from budget.layers import sequence_parallel_params

    assert sequence_parallel_params(_qwen(), moe=True) == 2 * 2048 + 2048 * 60 + 2048 == 129_024


DEEPSEEK_TP8_EP8 = """\
name: deepseek-v3-tp8-ep8
mode: decode
model: {preset: deepseek-v3}
batch: {sequences: 64, prompt: 4096, generate: 1024}
precision: {params: fp8, activations: bf16, matmul: fp8}
parallel: {tp: 8, ep: 8, etp: 1}
device: {preset: h200}
topology: {preset: dgx-h200, nodes: 1}
"""


def test_serving_experts_spread_over_the_tp_group_send_nothing(tmp_path):
    """SGLang's and vLLM's expert parallelism inside the tp group (tp 8, ep 8, etp 1): every
    rank holds all 64 sequences' tokens and 256 / 8 = 32 whole experts, computes the rows
    routed to them (64 tokens x top-8 / 8 ranks = 64 in decode) and one all-reduce over tp
    sums the block's output (64 x 7168 bf16). No all-to-all: the tokens are already there."""
    path = tmp_path / "plan.yaml"
    path.write_text(DEEPSEEK_TP8_EP8, encoding="utf-8")
    plan = load_plan(path)
    s = shapes(plan, query_len=1, kv_len=5120)
    assert (s.local_experts, s.routed, s.expert_cols) == (32, 64 * 8 // 8, 2048)
    report = build_report(plan)
    moe = next(p for p in report.phases if p.name == "decode.moe")
    assert [(c.op, c.group, c.bytes) for c in moe.collectives] == [
        ("all-reduce", "tp", 64 * 7168 * 2)
    ]


def test_training_folds_ep_over_the_tensor_parallel_ranks(tmp_path):
    """Training at tp 8, etp 1, ep 8, dp 1 (Megatron-Core's parallel folding: ep × etp = 8
    divides tp × cp × dp = 8, though ep does not divide dp): the ep group is the node's 8
    ranks, so the dispatch all-to-all runs on NVLink. Each rank holds 4096 / 8 = 512 tokens
    (sequence parallelism) and sends them top-8: S = 8 ranks × 512 × 8 rows × 7168 × bf16.
    Before, budget laid ep over cp × dp only and refused this layout."""
    text = (
        DEEPSEEK_TP8_EP8.replace("mode: decode", "mode: train")
        .replace(
            "{sequences: 64, prompt: 4096, generate: 1024}", "{seq: 4096, micro: 1, global: 8}"
        )
        .replace("etp: 1}", "etp: 1, sequence_parallel: true}")
        .replace("{params: fp8, activations: bf16, matmul: fp8}", "{params: bf16}")
    )
    report = build_report(_load_text(tmp_path, text))
    moe = next(p for p in report.phases if p.name == "forward.moe")
    dispatch = next(c for c in moe.collectives if c.name == "MoE dispatch")
    assert (dispatch.group, dispatch.ranks) == ("ep", 8)
    assert [level["link"] for level in dispatch.levels] == ["nvlink"]
    assert dispatch.bytes == 8 * 512 * 8 * 7168 * 2
    assert not [c for c in moe.collectives if c.group == "etp"]  # etp 1 gathers nothing


def test_an_expert_grid_that_does_not_fit_the_stage_is_refused(tmp_path):
    """ep × etp must divide tp × cp × dp (Megatron-Core asserts the same); the error offers
    the ep values that fit: divisors of gcd(256 experts, 8 / etp 2 = 4)."""
    from budget.errors import BudgetError

    text = DEEPSEEK_TP8_EP8.replace("etp: 1}", "etp: 2, ep: 8, sequence_parallel: true}").replace(
        "{tp: 8, ep: 8,", "{tp: 8,"
    )
    with pytest.raises(BudgetError) as raised:
        _load_text(tmp_path, text)
    (problem,) = raised.value.problems
    assert problem.path == "$.parallel.ep"
    assert "ep × etp = 8 × 2 = 16" in problem.message
    assert problem.message.endswith("choose ep among 1, 2, 4")


def test_a_serving_pass_sums_its_stages_in_the_rows_and_the_step(tmp_path: Path) -> None:
    """Llama 3 70B decode on tp 8 × pp 4: a pass crosses the four stages in turn, so the
    step's compute plus exposed communication is the whole serving time (it was one
    stage's: 2.98 s of 11.72 s, and an exposed share of 9.9 % where pp 1 has 38.7 %), and
    each phase row counts every stage's layers."""
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    plan = variant(
        tmp_path, "pp4.yaml", ("  pp: 1", "  pp: 4"), ("nodes: 1}", "nodes: 4}"), base=decode
    )
    report = to_dict(build_report(load_plan(plan)))
    step = report["step"]
    assert step["compute_s"] + step["exposed_comm_s"] == pytest.approx(step["time_s"], rel=1e-12)
    rows = {p["name"]: p for p in report["phases"]}
    assert rows["decode.attention"]["count"] == 80 * 511  # every layer, every decoded token
    assert sum(p["exposed_s"] for p in report["phases"]) == pytest.approx(step["exposed_comm_s"])
    for row in report["phases"]:  # its collectives' calls cover the same stages as its times
        calls = sum(c["time_s"] * c["count"] for c in row["collectives"])
        assert calls == pytest.approx(row["comm_s"], rel=1e-12, abs=1e-15)
    one = to_dict(build_report(load_plan(decode)))["step"]
    assert one["compute_s"] + one["exposed_comm_s"] == pytest.approx(one["time_s"], rel=1e-12)


# tp 4 x cp 4 over two DGX H100 nodes: each cp group holds two ranks of each node
_CP_RING_ACROSS_NODES = (
    "name: cp-ring\nmodel: {preset: llama3-8b}\nbatch: {seq: 32768, micro: 1, global: 8}\n"
    "parallel: {tp: 4, cp: 4, dp: 1, sequence_parallel: true, zero: 1, "
    "cp_attention: ring}\nrecompute: selective\ndevice: {preset: h100-sxm}\n"
    "topology: {preset: dgx-h100, nodes: 2}\n"
)


def test_a_cp_ring_across_nodes_is_paced_by_its_slowest_hop(tmp_path):
    """tp 4 × cp 4 on two DGX H100 nodes: the cp group {0, 4, 8, 12} holds two ranks per
    node, so of the ring's four hops two cross InfiniBand. Ring attention sends each K/V
    chunk to the next cp rank (Transformer Engine's P2P ring), so each of the cp − 1 = 3
    steps waits for an InfiniBand hop: T = 3·(α_IB + c / B_IB), c = S / 4 with S = K and V
    of the whole sequence per tp rank, 2 × 32768 tokens × (8 kv heads / tp 4) × 128 × bf16
    = 32 MiB. Before, it was priced as NCCL's two-level all-gather: 2 steps, 255 µs."""
    from budget.topology import link_of

    plan = _load_text(tmp_path, _CP_RING_ACROSS_NODES)
    report = build_report(plan)
    attention = next(p for p in report.phases if p.name == "forward.attention")
    (ring,) = [c for c in attention.collectives if c.group == "cp"]
    size = 2 * 32768 * 2 * 128 * 2
    assert ring.bytes == size == 32 * 2**20
    assert (ring.algorithm, ring.steps, ring.sent_bytes) == ("ring", 3, 3 * size // 4)
    infiniband = link_of(plan.topology.levels[1])
    step = infiniband.latency + (size // 4) / infiniband.bandwidth_at("all-gather", size)
    assert ring.time_s == pytest.approx(3 * step, rel=1e-12)
    assert [level["link"] for level in ring.levels] == ["infiniband"]


def test_a_cp_ring_s_backward_sends_cp_messages_not_two_rings_of_cp_minus_one(tmp_path):
    """An audit: Transformer Engine's ring backward (``AttnFuncWithCPAndKVP2P.backward``)
    sends K/V at its first step, K/V with the previous step's dK/dV as one tensor at each
    middle one and dK/dV at its last: cp messages, cp latencies, where two rings of cp − 1
    steps were priced. The same two cp − 1 rings of 2·(cp − 1) chunks, as bytes; dK/dV's one
    latency its own. The plan above at cp 4 (two hops of four over InfiniBand): the dK/dV
    ring's time is α + 3·c / B, c = 8 MiB; K/V's in the backward keeps its 3 steps."""
    from budget.topology import link_of

    plan = _load_text(tmp_path, _CP_RING_ACROSS_NODES)
    report = build_report(plan)
    backward = next(p for p in report.phases if p.name == "backward.attention")
    rings = {c.name: c for c in backward.collectives if c.group == "cp"}
    forward, gradients = (
        rings["attention K/V (ring exchange)"],
        rings["attention dK/dV (ring exchange)"],
    )
    size = 32 * 2**20
    assert (forward.steps, forward.sent_bytes) == (3, 3 * size // 4)
    assert (gradients.steps, gradients.sent_bytes) == (1, 3 * size // 4)
    infiniband = link_of(plan.topology.levels[1])
    bandwidth = infiniband.bandwidth_at("reduce-scatter", size)
    assert gradients.latency_term_s == infiniband.latency
    assert gradients.time_s == pytest.approx(infiniband.latency + 3 * (size // 4) / bandwidth)
    assert forward.steps + gradients.steps == 4  # cp messages


def test_dispatch_buffers_hold_the_rows_a_rank_sends_not_the_gathered_ones():
    """Mixtral 8x7B as shipped (tp = etp 2 with sequence parallelism, sequence 4096): a rank
    holds 4096 / 2 = 2048 tokens and sends them top-2, 4096 rows of 4096 × bf16 = 32 MiB,
    which the all-to-all's send and receive buffers each hold (Megatron-Core's alltoall
    dispatcher). The etp all-gather then doubles the rows the experts compute (8192), which
    their own activations count; the buffers were sized from those, 64 MiB each."""
    from budget.step import dispatch_buffers

    plan = load_plan(ROOT / "plans" / "mixtral-8x7b.yaml")
    s = shapes(plan)
    assert (s.dispatched, s.routed) == (2048 * 2, 2 * 2048 * 2)
    buffers = dispatch_buffers(plan, s)
    assert buffers.total == 2 * 4096 * 4096 * 2  # sent and received, as many under balance
    moe = next(p for p in derive(plan).stages[0].phases if p.name == "forward.moe")
    held = {a.name: a.total for i in moe.instants for a in i.live}
    assert held["dispatch send and receive buffers"] == 2 * 32 * 2**20
    # the busiest rank of a skewed router receives 1.5 times its even share, sending its own
    skewed = replace(plan.model.experts, imbalance=1.5)
    plan = replace(plan, model=replace(plan.model, experts=skewed))
    assert dispatch_buffers(plan, shapes(plan)).total == (4096 + 6144) * 4096 * 2
    # on one expert-parallel rank nothing is exchanged: the same bytes (the permuted rows and
    # their copy sorted by expert), not called send and receive buffers (an audit)
    alone = replace(plan, parallel=replace(plan.parallel, ep=1))
    rows = dispatch_buffers(alone, shapes(alone))
    assert rows.name == "routed token rows, permuted and sorted by expert (ep 1: no exchange)"
    assert rows.total == 2 * 4096 * 4096 * 2  # no peer to receive more from under skew


def test_prefill_mfu_counts_the_output_layer_once_per_sequence(tmp_path):
    """A one-layer model with a 256,000-token vocabulary, prefilled 8 × 2,048 tokens on one
    H100: the embedding lookup does no GEMM and the output layer runs on the last position
    of each sequence only (what `inference` prices), so model FLOPs are
    16,384 × (2·N' + attention) + 8 × 2·vocab·hidden, N' the layer and the final norm.
    Before, 2·N per token counted both 256,000 × 4,096 matrices for every prompt token and
    MFU came to 665 %. Attention by hand: one layer of 32 heads of 128, 2·32·(128 + 128) =
    16,384 FLOPs per key (PaLM, arXiv 2204.02311, appendix B: the score and value products,
    a third of 12·L·h·s), a causal prompt's query i meeting keys 1 ... i, itself included
    as decode counts it: (1 + 2,048)/2 = 1,024.5 keys on average (1,024 before, an audit)."""
    text = (
        "mode: prefill\nmodel: {layers: 1, hidden: 4096, heads: 32, ffn: 14336, vocab: 256000, "
        "mlp: swiglu, norm: rmsnorm, tied_embeddings: false}\n"
        "batch: {sequences: 8, prompt: 2048, generate: 0}\n"
        "parallel: {tp: 1, pp: 1, dp: 1}\ndevice: {preset: h100-sxm}\n"
        "topology: {preset: dgx-h100, gpus: 1}\n"
    )
    plan = _load_text(tmp_path, text)
    step = build_report(plan).step
    layer = 4 * 4096**2 + 3 * 4096 * 14336 + 2 * 4096  # q, k, v, o; gate, up, down; 2 norms
    n = layer + 4096  # and the final norm
    attention = 16384 * (1 + 2048) / 2  # 16,384 × 1,024.5 = 16,785,408
    work = 8 * 2048 * (2 * n + attention) + 8 * 2 * 256000 * 4096
    peak = plan.device.peak_flops("bf16")
    assert step["mfu"] * step["time_s"] * peak == pytest.approx(work, rel=1e-12)
    assert 0 < step["mfu"] < 1


def test_decode_mfu_counts_each_generated_token_against_its_context():
    """plans/llama3-70b-decode.yaml, 32 sequences of 2,048 prompt tokens generating 512 on
    8 H100s: decode runs 511 passes (the first token is the prefill's), each token counting
    2·N' (N' the 80 layers and the final norm: per layer q and o 8192², k and v 8192 × 1024,
    gate, up and down 8192 × 28672, two norms), the output layer's 2·128,256·8,192, and the
    attention products, 2·80·64·(128 + 128) = 2,621,440 FLOPs per key (PaLM, arXiv
    2204.02311, appendix B: its 12·L·h·s is three times this forward count) against
    2,049 ... 2,559 keys, 2,304 on average. MFU is that over the decode passes' time at the
    bf16 peak of all 8 GPUs; the prefill's time is not in it (an audit: no test held it)."""
    report = to_dict(build_report(load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")))
    step = report["step"]
    layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    n = 80 * layer + 8192
    per_token = 2 * n + 2 * 128256 * 8192 + 2_621_440 * 2304
    work = 32 * 511 * per_token
    busy = 511 * step["decode_token_s"]
    peak = 8 * 989e12  # H100 SXM dense bf16, the preset's (datasheet: 1,979 with sparsity)
    assert step["mfu"] * busy * peak == pytest.approx(work, rel=1e-9)


def test_the_header_and_json_name_the_experts_and_the_active_parameters():
    """Mixtral 8x7B: 32 MoE layers of 8 experts of 3 × 4096 × 14336 weights, top 2, so a
    token skips 6 of 8 experts in each layer: 46.70 B − 32 × 6 × 3 × 4096 × 14336 = 12.88 B
    active (Jiang et al., arXiv 2401.04088: "13B active parameters")."""
    from rich.console import Console

    from budget.render.table import render_table

    report = build_report(load_plan(ROOT / "plans" / "mixtral-8x7b.yaml"))
    model = to_dict(report)["model"]
    assert model["experts"] == {
        "count": 8,
        "top_k": 2,
        "ffn": 14336,
        "shared_ffn": 0,
        "moe_layers": 32,
        "imbalance": 1.0,
        "capacity_factor": None,  # dropless
        "pad_to_capacity": False,
    }
    assert model["params_active"] == model["params_total"] - 32 * 6 * 3 * 4096 * 14336
    console = Console(width=200, record=True)
    render_table(console, report)
    head = console.export_text().splitlines()[1]
    assert "46.70 billion parameters, 12.88 billion active per token" in head
    assert "32 MoE layers of 8 experts of ffn 14336 (top 2)" in head


@pytest.mark.parametrize(("params", "matmul"), [("bf16", "fp8"), ("fp8", "bf16")])
def test_decode_reads_the_weights_in_the_format_they_are_kept(tmp_path, params, matmul):
    """Llama 3 8B decoding one sequence on one H100 is bound by reading its weights: the
    GEMMs read them as stored (`flops.Operands`). bf16 weights under an fp8 GEMM decoded in
    3.71 ms a token, under the 16.06 GB / 3.35 TB/s = 4.79 ms it takes to read them once;
    fp8 weights under a bf16 GEMM were charged as bf16 (6.27 ms)."""
    text = (
        "mode: decode\nmodel: {preset: llama3-8b}\n"
        "batch: {sequences: 1, prompt: 128, generate: 128}\n"
        f"precision: {{params: {params}, activations: bf16, matmul: {matmul}}}\n"
        "parallel: {tp: 1}\ndevice: {preset: h100-sxm}\ntopology: {preset: dgx-h100, gpus: 1}\n"
    )
    plan = _load_text(tmp_path, text)
    token = build_report(plan).step["decode_token_s"]
    stored = text.replace(f"matmul: {matmul}", f"matmul: {params}")
    same = build_report(_load_text(tmp_path, stored)).step["decode_token_s"]
    weights = 8.03e9 * (2 if params == "bf16" else 1)  # bytes read per token, at least
    assert token > weights / plan.device.memory_bandwidth
    assert token == pytest.approx(same, rel=0.02)  # the GEMM's format barely matters


def test_serving_phases_keep_the_pass_order_across_stages(tmp_path):
    """Llama 3 70B decode on tp 2 × pp 4: the last stage's prefill.output came after every
    decode row (each stage's phases listed in turn); prefill rows come first, in pass order."""
    text = (ROOT / "plans" / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    text = text.replace("tp: 8", "tp: 2", 1).replace("pp: 1", "pp: 4", 1)
    names = [p.name for p in build_report(_load_text(tmp_path, text)).phases]
    prefill = [n for n in names if n.startswith("prefill.")]
    assert names[: len(prefill)] == prefill and prefill[-1] == "prefill.output"
    assert names[-1] == "decode.output"


def test_decode_passes_are_priced_at_their_mean_context(tmp_path):
    """Pass k of the G - 1 decode passes (the prefill yields the first token) attends to
    prompt + k cached keys, so they cost G - 1 passes at the mean context P + G/2 (kipply's
    "Transformer Inference Arithmetic"; vLLM reads each sequence's current length). Prompt
    100 and 201 generated tokens: 200 passes over 101 ... 300 keys, 200.5 on average, rounded
    up to 201, the context of the one pass after a 200-token prompt generating 2, so a pass
    costs the same in both; the cache is still held for all 301 tokens. Before, every pass was
    priced at the last one's context: prompt 128 and 8,192 generated tokens cost as much per
    token as 8,319 prompt tokens and one generated (18.3 ms, where the mean gives 12.4 ms)."""
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")

    def attention(prompt: int, generate: int):
        edited = text.replace("prompt: 2048", f"prompt: {prompt}")
        plan = _load_text(tmp_path, edited.replace("generate: 512", f"generate: {generate}"))
        (stage,) = derive_inference(plan).stages
        (phase,) = [p for p in stage.phases if p.name == "decode.attention"]
        (core,) = [w for w in phase.works if w.kind == "attention"]
        return plan, core

    long, core = attention(100, 201)
    _, single = attention(200, 2)
    assert decode_keys(long) == (201, 0)
    # K and V of 201 keys x 1 kv head per tp rank x 128 x 2 B x 32 sequences, plus the query
    # and output rows (8 heads x 128 x 2 B each)
    assert core.bytes == single.bytes == 32 * (201 * 2 * 128 * 2 + 2 * 8 * 128 * 2)
    assert kv_cache_bytes(long, 80) == 80 * 128 * 2 * 301 * 32 * 2
    # contexts 129 ... 8,319 average 4,224 keys
    _, core = attention(128, 8192)
    assert core.bytes == 32 * (4224 * 2 * 128 * 2 + 2 * 8 * 128 * 2)


def test_a_sliding_layer_decodes_at_the_mean_of_its_window_capped_context():
    """Window 4,096, prompt 2,048 and 4,096 generated tokens: 4,095 passes over contexts
    2,049 ... 6,143, of which the first 2,048 see all of theirs (mean 3,072.5) and the last
    2,047 see 4,096 keys, so a sliding layer's pass meets 14,676,992 / 4,095 = 3,584.1 keys
    on average (rounded up to 3,585), not min(mean context 4,096, 4,096)."""
    plan = make_plan(replace(QWEN_MOE, experts=None, window=4096), tp=1, pp=1, dp=1)
    serving = replace(plan, mode="decode", batch=Batch(6144, 8, 8, prompt=2048, generate=4096))
    assert decode_keys(serving) == (4096, 3585)
    # every context within the window: the layer meets all of them, as a full layer does
    shorter = replace(serving, batch=replace(serving.batch, generate=1000))
    assert decode_keys(shorter) == (2548, 2548)


def test_serving_reduces_the_vocab_parallel_embedding_over_tp():
    """Each tp rank looks up only the tokens its vocabulary rows hold, so the embedding's
    output is sum-partial until an all-reduce (vLLM's VocabParallelEmbedding ends in one):
    Llama 3 70B at tp 8 all-reduces 32 x 2,048 x 8,192 x 2 B = 1 GiB after the prefill's
    lookup and 32 x 8,192 x 2 B = 512 KiB per decoded token. It was consumed as complete."""
    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    (stage,) = derive_inference(plan).stages
    moves = {p.name: p.moves for p in stage.phases if p.name.endswith(".embedding")}
    for name, size in (
        ("prefill.embedding", 32 * 2048 * 8192 * 2),
        ("decode.embedding", 32 * 8192 * 2),
    ):
        (move,) = moves[name]
        assert (move.op, move.group, move.ranks, move.size_bytes) == ("all-reduce", "tp", 8, size)
        assert (move.src, move.dst) == ("partial", "replicate")


def test_the_prefill_mlp_holds_its_activation_output_beside_fc1s():
    """While SwiGLU runs, fc1's output (gate and up, 2 x 28,672 / 8 columns) and the
    activation's (28,672 / 8) are alive together: Llama 3 70B's prefill at tp 8, 32 x 2,048
    tokens, holds 65,536 x 3,584 x 2 B = 448 MiB for the latter, which it left out (review)."""
    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    (stage,) = derive_inference(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "prefill.mlp"]
    instant = phase.instants[0]  # the activation's; fc2's reduction follows
    live = {a.name: a.bytes for a in instant.live}
    assert live["MLP fc1 output"] == 2 * 65536 * 3584 * 2
    assert live["MLP activation output"] == 65536 * 3584 * 2 == 448 * 2**20


def test_a_serving_block_holds_the_residual_stream_beside_its_normed_input(tmp_path):
    """vLLM's decoder layers carry the residual beside the normed input each block reads
    (``hidden_states, residual = self.input_layernorm(hidden_states, residual)``): Llama 3
    70B's prefill at tp 8 holds 65,536 x 8,192 x 2 B = 1 GiB of each, and the stage peaks at
    26.9 GiB where it read 25.9. Under sequence parallelism the residual is 1/8 of it."""
    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    (stage,) = derive_inference(plan).stages
    for name in ("prefill.attention", "prefill.mlp"):
        (phase,) = [p for p in stage.phases if p.name == name]
        for instant in phase.instants:
            live = {a.name: a.bytes for a in instant.live}
            assert live["layer input"] == live["residual stream"] == 65536 * 8192 * 2 == 2**30
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    sp = _load_text(tmp_path, text.replace("dp: 1", "dp: 1\n  sequence_parallel: true"))
    (stage,) = derive_inference(sp).stages
    (phase,) = [p for p in stage.phases if p.name == "prefill.mlp"]
    live = {a.name: a.bytes for a in phase.instants[0].live}
    assert live["residual stream"] == 2**30 // 8


def test_an_fp8_kv_cache_halves_the_cache_and_its_reads_not_the_all_reduces(tmp_path):
    """precision.kv_cache: fp8 (vLLM's --kv-cache-dtype fp8) keeps the cache in 1 byte per
    element: Llama 3 70B at tp 8 holds 80 x 1 kv head x 128 x 2 x 2,560 x 32 x 1 B, and decode
    reads K and V at 1 B, while the all-reduces stay bf16 (with activations: fp8, the only
    way to get an fp8 cache before, they halved too: TTFT 2.76 -> 2.17 s; review)."""
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    bf16 = _load_text(tmp_path, text)
    fp8 = _load_text(
        tmp_path, text.replace("activations: bf16", "activations: bf16\n  kv_cache: fp8")
    )
    assert kv_cache_bytes(fp8, 80) == 80 * 128 * 2 * 2560 * 32 * 1 == kv_cache_bytes(bf16, 80) // 2

    def attention(plan):
        (stage,) = derive_inference(plan).stages
        (phase,) = [p for p in stage.phases if p.name == "decode.attention"]
        (core,) = [w for w in phase.works if w.kind == "attention"]
        return core, [m.size_bytes for m in phase.moves]

    (core16, moves16), (core8, moves8) = attention(bf16), attention(fp8)
    # the 511 decode passes' mean context: 2,049 ... 2,559 keys, (2,049 + 2,559) / 2 = 2,304
    keys = 2304
    assert decode_keys(bf16) == decode_keys(fp8) == (keys, 0)
    # Q read and O written: 32 sequences x 8 query heads x 128 x 2 B each, bf16 = 131,072 B
    rows = 2 * 32 * 8 * 128 * 2
    # K and V read from the cache: 32 sequences x keys x (K, V) x 1 kv head of 128 x 2 B
    assert core16.bytes == 32 * keys * 2 * 128 * 2 + rows == 37_879_808
    assert core8.bytes == 32 * keys * 2 * 128 * 1 + rows == 18_874_368 + 131_072 == 19_005_440
    assert moves8 == moves16  # the all-reduces keep the activations' format


def test_a_training_plan_has_no_kv_cache_format(tmp_path):
    from budget.errors import BudgetError

    text = (PLANS / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    assert "precision:\n" in text
    with pytest.raises(BudgetError, match=r"precision\.kv_cache is the format of a serving plan"):
        _load_text(tmp_path, text.replace("precision:\n", "precision:\n  kv_cache: fp8\n", 1))


def test_fp8_weights_leave_the_embedding_and_output_layer_in_bf16(tmp_path):
    """fp8 checkpoints and Transformer Engine's fp8 weights quantize the blocks' linear
    layers, not the embedding or the output layer (llm-compressor ignores lm_head; ModelOpt
    excludes lm_head; TE's fp8 weights are its own modules'). A Llama 3 8B shape on one GPU
    with params fp8: its 2 x 128,256 x 4,096 = 1.05 B vocabulary parameters take 2 B each,
    so 8.03 B parameters weigh 9.08 GB, not 8.03 GB, and decoding reads the output layer's
    1.05 GB at 2 B (review). So do its norms (an audit), 32 x 2 x 4,096 + 4,096 = 266,240."""
    from budget.layers import params_total

    plan = load_plan(
        variant(
            tmp_path,
            "plan.yaml",
            ("layers: 80", "layers: 32"),
            ("hidden: 8192", "hidden: 4096"),
            ("heads: 64", "heads: 32"),
            ("ffn: 28672", "ffn: 14336"),
            ("tp: 8", "tp: 1"),
            ("nodes: 1}", "gpus: 1}"),
            ("params: bf16", "params: fp8"),
            base=PLANS / "llama3-70b-decode.yaml",
        )
    )
    vocab, norms = 2 * 128256 * 4096, 32 * 2 * 4096 + 4096
    report = build_report(plan)
    # 1 B a parameter and 1 more on the vocabulary and norms
    assert report.stages[0].params_bytes == params_total(plan) + vocab + norms
    (stage,) = derive_inference(plan).stages
    (output,) = [p for p in stage.phases if p.name == "decode.output"]
    (gemm,) = [w for w in output.works if w.name == "output layer"]
    assert gemm.bytes == 2 * 4096 * 128256 + 2 * 32 * (4096 + 128256)  # weights, rows in and out


def test_serving_under_sequence_parallelism_gathers_the_output_layer_input(tmp_path):
    """Under sequence parallelism a tp rank holds 1/tp of the tokens until the final
    norm's output is all-gathered for the output layer, as in training: Llama 3 70B at tp 8,
    32 sequences, 32 x 2,048 x 8,192 x 2 B = 1 GiB in prefill (held gathered beside the
    logits) and 32 x 8,192 x 2 B = 512 KiB a decode pass; both passes run the final norm
    over their tokens (vLLM's models end with ``self.norm`` before ``compute_logits``)."""
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    plan = _load_text(tmp_path, text.replace("dp: 1", "dp: 1\n  sequence_parallel: true"))
    (stage,) = derive_inference(plan).stages
    for name, tokens in (("prefill.output", 32 * 2048), ("decode.output", 32)):
        (phase,) = [p for p in stage.phases if p.name == name]
        (gather,) = [m for m in phase.moves if m.name == "output layer input"]
        assert (gather.op, gather.group, gather.size_bytes) == (
            "all-gather",
            "tp",
            tokens * 8192 * 2,
        )
        (instant,) = phase.instants
        held = {a.name: a.bytes for a in instant.live}
        assert held["output layer input (all-gathered)"] == tokens * 8192 * 2
        (norm,) = [w for w in phase.works if w.name == "final norm"]
        assert norm.bytes == 2 * 2 * tokens // 8 * 8192  # read and write the rank's tokens
    plain = derive_inference(load_plan(PLANS / "llama3-70b-decode.yaml")).stages[0]
    assert not [m for p in plain.phases for m in p.moves if m.name == "output layer input"]


def test_the_sampler_gathers_the_logits_over_tp():
    """Each tp rank holds its vocabulary rows' logits; sampling needs them all (vLLM's
    LogitsProcessor gathers them): 32 sequences x 16,032 rows x 8 ranks x 2 B = 8,208,384 B
    per pass, an all-gather of 7/8 of it per rank: 7 x 3 µs + 7,182,336 B at NVLink's B_eff
    reached at that size. It was left out, the logits consumed where they were computed."""
    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    (stage,) = derive_inference(plan).stages
    for name in ("prefill.output", "decode.output"):
        (phase,) = [p for p in stage.phases if p.name == name]
        (gather,) = phase.moves
        assert (gather.op, gather.group, gather.ranks) == ("all-gather", "tp", 8)
        assert gather.size_bytes == 32 * 16032 * 8 * 2 == 8_208_384
        (instant,) = phase.instants  # the gathered logits are held beside the rank's rows
        live = {a.name: a.bytes for a in instant.live}
        assert live["logits gathered for sampling"] == 8_208_384


def test_the_last_positions_logits_are_held_in_fp32():
    """The logits of the last position of every sequence are sampled in fp32 whatever the
    model's format, over the whole vocabulary once gathered: FasterTransformer's
    ParallelGpt (src/fastertransformer/models/multi_gpu_gpt/ParallelGpt.cc) writes the
    output GEMM in ``CUDA_R_32F`` into ``logits_buf_`` and ``nccl_logits_buf_`` of
    ``sizeof(float) * batchxbeam * vocab_size_padded_``, and vLLM's sampler
    (vllm/v1/sample/sampler.py) casts the gathered logits to float32 before sampling.
    Llama 3 70B decoding at tp 8, 32 sequences: 8 · ⌈128,256 / 8⌉ = 128,256 rows x 32 x 4 B
    = 16,416,768 B on a rank, in the prefill and in each decode pass (an audit: they were
    counted over the rank's 16,032 rows alone)."""
    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    assert (plan.model.vocab, plan.parallel.tp, plan.batch.micro) == (128256, 8, 32)
    rows = 8 * -(-128256 // 8)
    assert rows == 128256
    (stage,) = derive_inference(plan).stages
    for name in ("prefill.output", "decode.output"):
        (phase,) = [p for p in stage.phases if p.name == name]
        (instant,) = phase.instants
        live = {a.name: a for a in instant.live}
        logits = live["logits (fp32) for sampling, whole vocabulary"]
        assert logits.category == "transient"
        assert logits.total == 32 * rows * 4 == 16_416_768


def test_a_plan_names_the_all_reduce_algorithm(tmp_path):
    """`collectives: {all-reduce: recursive}` (DESIGN rule 3): the decode all-reduce of
    32 x 8,192 x 2 B = 512 KiB over tp 8 runs Rabenseifner's halving-doubling, 2 log2 8 = 6
    steps instead of the ring's 14, the same 2 x 7/8 x S bytes per rank: 6 x 3 µs + 917,504 B
    at NVLink's B_eff at that size."""
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    named = _load_text(tmp_path, text + "collectives: {all-reduce: recursive}\n")
    assert named.algorithm("all-reduce") == "recursive" and named.algorithm("all-gather") is None
    ring, recursive = build_report(load_plan(PLANS / "llama3-70b-decode.yaml")), build_report(named)

    def reduce(report):
        (phase,) = [p for p in report.phases if p.name == "decode.attention"]
        (row,) = [c for c in phase.collectives if c.op == "all-reduce"]
        return row

    a, b = reduce(ring), reduce(recursive)
    assert (a.algorithm, a.steps, b.algorithm, b.steps) == ("ring", 14, "recursive", 6)
    assert a.sent_bytes == b.sent_bytes == 2 * 7 * 524288 // 8
    assert b.latency_term_s == pytest.approx(6 * 3e-6)
    # B_eff at 512 KiB: dgx-h100's NVLink 4 plateau, 450 GB/s one way x NCCL's ring share
    # 370/450 = 370 GB/s, times the measured ramp's share. That share holds below the
    # smallest size of the H100 ring all_reduce sweep (togethercomputer/together-nccl-tests
    # 6698e53): 1 MiB takes 46.52 µs, 14 steps x 3 µs of it n·α, which leaves 4.52 µs for
    # the 1.75 x 1 MiB / 370 GB/s = 4.96 µs the plateau needs: the share is clipped to 1
    assert b.bandwidth_Bps == 370e9
    # 917,504 B = 1.75 x 512 KiB: 2.48 µs at the plateau
    assert b.bandwidth_term_s == pytest.approx(917_504 / 370e9, rel=1e-12)
    assert b.time_s == pytest.approx(6 * 3e-6 + 917_504 / 370e9, rel=1e-12)
    assert recursive.step["decode_token_s"] < ring.step["decode_token_s"]
    # README (the collectives section) quotes the ring's time as the default's (an audit,
    # m121: it said 44.6 µs where the ring takes 44.48)
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    assert a.time_s == pytest.approx(14 * 3e-6 + 917_504 / 370e9, rel=1e-12)
    assert f"what NCCL measures: {a.time_s * 1e6:.1f} µs for 512 KiB over 8 H100s" in readme
    from rich.console import Console

    from budget.render.table import collective_table

    table, legend = collective_table(recursive, False, False)
    console = Console(width=80, color_system=None, record=True)
    console.print(table)
    lines = console.export_text().splitlines()  # narrow, the op's mark wraps below it
    marked = [i for i, line in enumerate(lines) if " AR " in line]
    assert marked and all(lines[i + 1].split()[-1] == "rec" for i in marked)
    assert any(line.startswith("rec = recursive halving-doubling") for line in legend)


def test_a_window_no_pass_reaches_changes_nothing_under_context_parallelism():
    """With cp 2 each rank holds half the context; a window longer than the whole context
    (cp beside a shorter one is refused) must price as no window (it priced the sliding
    layers at the whole context's mean, about twice the rank's keys; review)."""
    base = make_plan(replace(QWEN_MOE, experts=None), tp=1, pp=1, dp=1, cp=2)
    serving = replace(base, mode="decode", batch=Batch(2560, 8, 8, prompt=2048, generate=512))
    windowed = replace(serving, model=replace(serving.model, window=100_000))
    assert decode_keys(windowed) == decode_keys(serving) == (-(-(2049 + 2559) // 4), 0)

    def core(plan):
        (stage,) = derive_inference(plan).stages
        (phase,) = [p for p in stage.phases if p.name == "decode.attention"]
        return [(w.flops, w.bytes) for w in phase.works if w.kind == "attention"]

    assert core(windowed) == core(serving)


def test_the_prefill_yields_the_first_token_and_decode_the_rest():
    """G generated tokens take the prefill (whose last position gives the first) and G - 1
    decode passes; time per output token is the decode passes' over G - 1, as vLLM and
    TensorRT-LLM count it (it ran G passes, one too many, and divided by G)."""
    from budget.inference import decode_passes

    plan = load_plan(PLANS / "llama3-70b-decode.yaml")
    assert decode_passes(plan) == 511
    report = to_dict(build_report(plan))
    decode = sum(
        p["compute_s"] + p["exposed_s"] for p in report["phases"] if p["name"].startswith("decode.")
    )
    assert report["step"]["decode_token_s"] == pytest.approx(decode / 511, rel=1e-12)
    assert report["step"]["time_s"] == pytest.approx(report["step"]["ttft_s"] + decode, rel=1e-12)


def test_serving_replicates_key_value_heads_when_tp_exceeds_them(tmp_path):
    """vLLM's QKVParallelLinear at tp > kv_heads: one key/value head per rank, each on
    tp / kv_heads ranks. Llama 3 70B decoding at tp 16 (8 kv heads) over two DGX H100s:

    - per rank, per layer: Q and O 2 x 8,192² / 16 = 8,388,608, K and V at one head
      2 x 8,192 x 128 = 2,097,152 (not 1/16 of 8 heads' 2 x 8,192 x 1,024, which is half a
      head), the MLP 3 x 8,192 x 28,672 / 16 = 44,040,192, two norms 16,384: 54,542,336;
      x 80 layers = 4,363,386,880, + the embedding and output rows 2 x 8,016 x 8,192 =
      131,334,144, + the final norm 8,192 = 4,494,729,216 parameters;
    - the KV cache keeps one head a rank, as at tp 8: 80 x 128 x 2 x 2,560 x 32 x 2 B;
    - the QKV GEMM writes 4 query heads and one K and one V head: 6 x 128 columns."""
    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    plan = _load_text(tmp_path, text.replace("tp: 8", "tp: 16").replace("nodes: 1", "nodes: 2"))
    assert stage_params(plan, 0).per_rank == 4_494_729_216
    assert layer_params(plan).total == layer_params(load_plan(PLANS / f"{plan.name}.yaml")).total
    assert kv_cache_bytes(plan, 80) == 80 * 128 * 2 * 2560 * 32 * 2
    s = shapes(plan)
    assert (s.q_cols, s.k_cols, s.v_cols) == (4 * 128, 128, 128)
    (stage,) = derive_inference(plan).stages
    (qkv,) = [
        w
        for p in stage.phases
        if p.name == "prefill.attention"
        for w in p.works
        if w.name == "QKV projection"
    ]
    assert qkv.flops == 2 * 32 * 2048 * 8192 * (4 + 1 + 1) * 128
    (cache,) = [a for a in stage.resident if a.name.startswith("KV cache (")]
    assert cache.bytes == kv_cache_bytes(plan, 80)
    assert cache.placement == "shard(kv heads) on tp, each head on 2 ranks"


@pytest.mark.parametrize(
    ("mode", "tp", "message"),
    [
        # training keeps Megatron-LM's whole groups per rank
        ("train", 16, r"model\.kv_heads = 8 is not divisible by tp = 16: .* 1, 2, 4, 8$"),
        # serving takes a multiple of kv_heads, not a tp that splits a head unevenly
        ("decode", 32, None),
        ("decode", 12, r"heads = 64 and model\.kv_heads = 8 are not divisible by tp = 12"),
    ],
)
def test_only_serving_shares_a_key_value_head_among_ranks(tmp_path, mode, tp, message):
    from budget.errors import BudgetError

    text = (PLANS / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    text = text.replace("tp: 8", f"tp: {tp}").replace("nodes: 1", f"gpus: {tp}")
    if mode == "train":
        text = text.replace("mode: decode", "mode: train").replace(
            "  sequences: 32\n  prompt: 2048\n  generate: 512",
            "  seq: 2048\n  micro: 1\n  global: 8",
        )
    if message is None:
        assert _load_text(tmp_path, text).parallel.tp == tp
        return
    with pytest.raises(BudgetError, match=message) as caught:
        _load_text(tmp_path, text)
    assert "choose tp among" in str(caught.value)


def test_recompute_runs_the_forward_collectives_again_behind_the_recomputed_kernels(tmp_path):
    """Megatron-LM's full recompute re-runs the whole layer before its backward, the MoE
    block's dispatch and combine all-to-alls included (review: the FLOPs were recomputed,
    the all-to-alls were not: Mixtral 8x7B, 3.98 -> 4.29 s a step); and selective
    recompute re-runs the attention core, inside which Transformer Engine exchanges K/V
    over cp (Llama 3 405B at 128K: one more all-gather of K and one of V per layer and
    micro-batch, as Transformer Engine gathers them, one head each on a tp rank at 131,072
    tokens).
    Each hides, where it may, behind the recomputed kernel, which the backward phase runs."""
    text = (PLANS / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    assert "recompute: selective" in text
    plan = _load_text(tmp_path, text.replace("recompute: selective", "recompute: full"))
    phases = {p.name: p for p in derive(plan).stages[0].phases}
    forward = {m.name: m for m in phases["forward.moe"].moves if m.group in ("ep", "etp")}
    again = {m.name: m for m in phases["backward.moe"].moves if "recomputed" in m.name}
    assert set(again) == {f"{name} (recomputed forward)" for name in forward}
    for name, m in forward.items():
        redo = again[f"{name} (recomputed forward)"]
        assert (redo.op, redo.size_bytes, redo.window) == (m.op, m.size_bytes, m.window)
    long = replace(load_plan(PLANS / "llama3-405b-128k.yaml"), recompute="selective")
    (backward,) = [p for p in derive(long).stages[0].phases if p.name == "backward.attention"]
    for what in ("K", "V"):
        (again,) = [m for m in backward.moves if m.name == f"attention {what} (recomputed forward)"]
        forward_moves = derive(long).stages[0].phases[1].moves
        (core,) = [m for m in forward_moves if m.name == f"attention {what}"]
        assert again.size_bytes == core.size_bytes == 131_072 * 128 * 2  # a head a rank
    ring = replace(long, parallel=replace(long.parallel, cp_attention="ring"))
    (backward,) = [p for p in derive(ring).stages[0].phases if p.name == "backward.attention"]
    (kv,) = [m for m in backward.moves if m.name.endswith("(ring exchange) (recomputed forward)")]
    assert kv.window == "attention core (flash) (recomputed)"
    assert kv.window in {w.name for w in backward.works}


def test_an_moe_block_saves_its_rows_not_the_expert_outputs():
    """Qwen-MoE at tp 2 with sequence parallelism, ep 4, etp 1, micro 1 at 4,096 tokens:
    2,048 tokens a rank x top 4 = 8,192 rows dispatched, and as many computed (etp 1).
    Saved, bf16: norm and router inputs 2 x 2,048 x 2,048 x 2 B; fp32 router
    probabilities 2,048 x 60 x 4; the dispatched rows 8,192 x 2,048 x 2; the SwiGLU fc1
    output 2 x 8,192 x 1,408 x 2 and fc2 input 8,192 x 1,408 x 2; the rows' fp32
    probabilities 8,192 x 4 (Megatron-Core weights rows in the activation,
    ``weighted_bias_swiglu_impl``); the shared experts' fc1 output 2 x 4,096 x 2,816 x 2
    and fc2 input 4,096 x 2,816 x 2 (shared width 5,632 over tp 2). The expert outputs are
    not kept: the combine only un-permutes and sums (review: 64 MiB a layer on Mixtral)."""
    from budget.layers import moe_saved

    plan = _qwen()
    saved = {a.name: a.bytes for a in moe_saved(plan, shapes(plan))}
    assert saved == {
        "MoE norm input": 2048 * 2048 * 2,
        "router input": 2048 * 2048 * 2,
        "router probabilities (fp32)": 2048 * 60 * 4,
        "dispatched tokens": 8192 * 2048 * 2,
        "expert fc1 output": 2 * 8192 * 1408 * 2,
        "expert fc2 input": 8192 * 1408 * 2,
        "expert row probabilities (fp32)": 8192 * 4,
        "shared expert fc1 output": 2 * 4096 * 2816 * 2,
        "shared expert fc2 input": 4096 * 2816 * 2,
        # its sigmoid gate's multiply keeps both factors, on the sequence shard
        "shared expert output, kept for its gate": 2048 * 2048 * 2,
        "shared expert gate score": 2048 * 2,
    }


@pytest.mark.parametrize("ring", [True, False])
def test_the_attention_backward_holds_the_key_value_gradients_beside_them(ring):
    """Context parallel backward: beside the K/V it attends to, the gradients it sends on
    (ring: two dK/dV chunks with the two K/V chunks, Transformer Engine's
    ``AttnFuncWithCPAndKVP2P.backward``) or reduce-scatters (all-gather: the whole
    sequence's dK/dV). GPT-3 at tp 8, cp 4, sequence 8,192: a rank's 2,048 tokens x 12
    heads x 128 x 2 (K, V) x 2 B = 12 MiB a chunk; the ring holds two (24 MiB) of each,
    the all-gather the whole 8,192 tokens (48 MiB) of each."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192)
    plan = replace(
        plan, parallel=replace(plan.parallel, cp_attention="ring" if ring else "allgather")
    )
    (backward,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    size = 2 * 2048 * 12 * 128 * 2 * 2 if ring else 8192 * 12 * 128 * 2 * 2
    names = (
        ("K/V ring buffers (2 chunks)", "dK/dV ring buffers (2 chunks)")
        if ring
        else (
            "K/V all-gathered",
            "dK/dV before reduce-scatter",
        )
    )
    held = {a.name: a.bytes for i in backward.instants for a in i.live if a.name in names}
    assert held == dict.fromkeys(names, size)
    # on the ring, each step's kernel returns its own dQ, dK and dV (``dq_, dk_, dv_``),
    # added into the totals after it: at the diagonal step, over the rank's whole chunk,
    # 2,048 tokens x (12 query + 12 key + 12 value heads) x 128 x 2 B = 18 MiB (an audit:
    # not counted, where the all-gathered mode's ``dq_per_step`` was)
    core = next(i for i in backward.instants if i.label == "attention core gradients")
    step = {a.name: a.bytes for a in core.live if a.name.startswith("one ring step")}
    assert step == (
        {"one ring step's dQ, dK and dV (before they are added in)": 18874368} if ring else {}
    )


def test_all_gathered_key_value_gradients_are_reduce_scattered_after_attention() -> None:
    """Llama 3's all-gather context parallelism reduce-scatters dK/dV once the attention
    backward has made them; the report's rule said the all-gather's "exposed before
    attention" of it (an audit). Transformer Engine (``AttnFuncWithCPAndKVAllGather``)
    gathers K and V in two all-gathers, forward and again in the backward, and
    reduce-scatters dK and dV in two (an audit: one of each paid the cp - 1 latencies once
    where it pays them twice), each of half the K/V bytes here (as many key as value
    columns): GPT-3 at tp 8, cp 4, sequence 8,192, 12 heads of 128 a tp rank, bf16."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192)
    plan = replace(plan, parallel=replace(plan.parallel, cp_attention="allgather"))
    (backward,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    rules = {m.name: (m.op, m.rule, m.size_bytes) for m in backward.moves if m.group == "cp"}
    half = 8192 * 12 * 128 * 2
    expected = {}
    for what in ("K", "V"):
        gather = ("all-gather", f"cp all-gather of {what}: exposed before attention", half)
        expected[f"attention {what}"] = gather
        expected[f"attention {what} (recomputed forward)"] = gather
        expected[f"attention d{what}"] = (
            "reduce-scatter",
            f"cp reduce-scatter of d{what}: exposed after attention",
            half,
        )
    assert rules == expected


def test_all_gathered_context_parallelism_holds_each_steps_key_gradients() -> None:
    """``AttnFuncWithCPAndKVAllGather.backward`` holds the gathered K/V, the whole
    sequence's dK/dV it adds into (zeros), and each of its two steps' dK/dV over the keys
    that step sees (``dk_per_step``: chunks r + 1 and 2·cp - r of the load-balanced 2·cp,
    the whole sequence and one chunk more); budget held the first two alone (an audit).
    GPT-3 at tp 8, cp 4, sequence 8,192: K/V of the whole sequence 8,192 x 12 heads x 128
    x 2 x 2 B = 48 MiB; the steps' 9/8 of it, 54 MiB."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192)
    plan = replace(plan, parallel=replace(plan.parallel, cp_attention="allgather"))
    (backward,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    whole = 8192 * 12 * 128 * 2 * 2
    assert whole == 48 * 2**20
    held = {
        a.name: a.total
        for i in backward.instants
        for a in i.live
        if a.name.startswith(("K/V all-gathered", "dK/dV"))
    }
    assert held == {
        "K/V all-gathered": whole,
        "dK/dV before reduce-scatter": whole,
        "dK/dV of the two steps (their keys' range)": 54 * 2**20,
    }


def test_the_ring_forward_holds_every_chunk_and_step_output_until_its_correction() -> None:
    """Transformer Engine's ring forward (``AttnFuncWithCPAndKVP2P.forward``) fills a list
    of cp K/V buffers and keeps each step's output and fp32 statistics until the correction
    after the last step (it was priced as two K/V chunks in flight; review). GPT-3 at tp 8,
    cp 4, sequence 8,192: a rank's 2,048 tokens; K/V 2,048 x 12 heads x 128 x 2 x 2 B =
    12 MiB a chunk, an output 2,048 x 1,536 x 2 B = 6 MiB, statistics 2,048 x 12 x 4 B; and
    under selective recompute the merged statistics the correction writes, a working tensor
    until the checkpoint returns."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192)
    (forward,) = [p for p in derive(plan).stages[0].phases if p.name == "forward.attention"]
    (after,) = [i for i in forward.instants if i.label == "after attention"]
    held = {a.name: a.total for a in after.live if a.category == "transient"}
    assert held == {
        "K/V ring buffers (one per cp rank)": 4 * 2048 * 12 * 128 * 2 * 2,
        "ring step outputs (one per cp rank)": 4 * 2048 * 1536 * 2,
        "ring step softmax statistics (fp32)": 4 * 2048 * 12 * 4,
        "attention softmax statistics (fp32) (working, not saved)": 2048 * 12 * 4,
    }


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_all_gathered_context_parallelism_saves_its_output_halves(recompute) -> None:
    """``AttnFuncWithCPAndKVAllGather.forward`` saves its two half-sequence outputs for the
    backward apart from the output it returns, which the projection saves: one more
    output's bytes a layer (2,048 tokens x 1,536 x 2 B = 6 MiB at tp 8, cp 4), dropped
    with the core attention under selective recompute (review)."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192, recompute=recompute)
    gathered = replace(plan, parallel=replace(plan.parallel, cp_attention="allgather"))
    ring = {a.name: a.total for a in attention_saved(plan, shapes(plan))}
    saved = {a.name: a.total for a in attention_saved(gathered, shapes(gathered))}
    extra = {k: v for k, v in saved.items() if k not in ring}
    assert extra == (
        {"attention output halves (all-gather cp)": 2048 * 1536 * 2} if recompute == "none" else {}
    )


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_recomputed_ring_forward_holds_its_chunks_in_the_backward(recompute) -> None:
    """Under recompute the backward runs the ring forward again before the core's
    gradients: that instant holds the forward's cp K/V chunks, step outputs and statistics
    beside the output gradient (it had no instant, so a peak there was missed; review).
    GPT-3 at tp 8, cp 4, sequence 8,192, as the test above: 48 + 24 MiB + 384 KiB held.
    Without recompute there is no such instant."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192, recompute=recompute)
    (backward,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    rerun = [i for i in backward.instants if i.label == "attention core (recomputed)"]
    if recompute == "none":
        assert rerun == []
        return
    (instant,) = rerun
    held = {
        a.name: a.total for a in instant.live if a.name.startswith("ring step") or "K/V" in a.name
    }
    assert held == {
        "K/V ring buffers (one per cp rank)": 4 * 2048 * 12 * 128 * 2 * 2,
        "ring step outputs (one per cp rank)": 4 * 2048 * 1536 * 2,
        "ring step softmax statistics (fp32)": 4 * 2048 * 12 * 4,
    }
    # the re-run comes before the core's gradients: none of them is alive yet; the instant
    # after it holds them and no longer the forward's cp chunks (its total is the larger
    # here since each ring step's own dQ, dK and dV are counted, 18 MiB)
    names = {a.name for a in instant.live}
    gradients = {"Q/K/V gradients", "dK/dV ring buffers (2 chunks)"}
    assert not names & gradients
    after = next(i for i in backward.instants if i.label == "attention core gradients")
    after_names = {a.name for a in after.live}
    assert gradients <= after_names and "K/V ring buffers (one per cp rank)" not in after_names


@pytest.mark.parametrize(
    ("attention", "forward", "backward"),
    [
        ("flash", 94_371_840, 198_180_864),
        ("cudnn", 94_371_840, 198_180_864),
        ("allgather", None, None),
    ],
)
def test_ring_attention_merges_its_steps_on_the_busiest_rank(attention, forward, backward):
    """Transformer Engine's ring merges each step's output into the result after the loop
    and accumulates dQ and dK/dV step by step (`flops.ring_merges`). GPT-3 at tp 8, cp 4,
    sequence 8,192, by hand: a rank's 2,048 tokens, Q = O = 2,048 x 1,536 x 2 B =
    6,291,456 B, K+V = 12,582,912 B; a copy is 2 passes, an add 3.

    Forward, rank 3 does the most: the K/V concatenation 2·KV and outputs merged
    2 + 3 + 3 + 3 = 11·O, 94,371,840 B. Backward, rank 0: the K/V refill 2·KV, dQ half copy,
    half adds, then copy-and-add 1 + 1.5 + 1.5 + 2.5 = 6.5·Q, dK/dV copy, adds, add-and-copy
    2 + 3 + 3 + 2.5 = 10.5·KV: 198,180,864 B (rank 3: 2·KV + 11·Q + 7·KV = 182,452,224).
    The same under the cuDNN kernel: its half inputs are views of sbhd tensors, contiguous
    already (an audit: a copy of each was priced, 132,120,576 and 254,803,968 B). The
    all-gather variant merges nothing. The K/V
    exchange hides behind the attention kernel, not the merges listed after it."""
    plan = make_plan(tp=8, pp=8, dp=4, cp=4, seq=8192)
    gathered = attention == "allgather"
    plan = replace(
        plan,
        parallel=replace(plan.parallel, cp_attention="allgather" if gathered else "ring"),
        model=replace(plan.model, attention="flash" if gathered else attention),
    )
    phases = {p.name: p for p in derive(plan).stages[0].phases}
    merges = {
        w.name: w.bytes
        for name in ("forward.attention", "backward.attention")
        for w in phases[name].works
        if w.name.startswith("context-parallel ring merges")
    }
    if gathered:
        assert merges == {}
        return
    assert merges == {
        "context-parallel ring merges": forward,
        # selective recompute runs the core, merges included, again in the backward
        "context-parallel ring merges (recomputed)": forward,
        "context-parallel ring merges backward": backward,
    }
    (exchange,) = [m for m in phases["forward.attention"].moves if m.group == "cp"]
    assert exchange.window.startswith("attention core (")


def test_no_ring_merges_without_context_parallelism() -> None:
    plan = make_plan(tp=8, pp=8, dp=16, seq=8192)
    names = {w.name for p in derive(plan).stages[0].phases for w in p.works}
    assert not any("ring merges" in n for n in names)


@pytest.mark.parametrize("cp", [2, 3, 4, 5, 8, 16])
def test_the_busiest_ring_rank_is_found_among_four(cp) -> None:
    """`flops._ring_backward_most` takes the largest of ranks 0, 1, cp − 2 and cp − 1;
    against every rank's count, for sizes where each term can lead (MHA, GQA, wide O)."""
    from budget.flops import _ring_backward_most

    def rank(r: int, q: int, kv: int) -> float:
        dkv = 3 * cp - 1.5 if r == 0 else 1.5 * cp + 1 if r == cp - 1 else 3 * cp - 1 - 1.5 * r
        return 2 * kv + (0.5 + 1.5 * cp + 1.5 * r) * q + dkv * kv

    for q, kv in ((100, 200), (800, 200), (100, 50), (10, 1000)):
        every_rank = max(rank(r, q, kv) for r in range(cp))
        assert _ring_backward_most(cp, q, kv) == pytest.approx(every_rank)


def test_a_skewed_all_to_all_sends_the_even_share_and_receives_the_busiest(tmp_path) -> None:
    """Under routing skew 2 the busiest ep rank of Mixtral (tp 2 with sequence parallelism,
    ep 8) receives twice the rows it dispatches: it sends 4,096 / 2 tokens x top 2 = 4,096
    rows of 4,096 bf16, 32 MiB, of which 7/8 leave it (28 MiB), and receives 8,192 rows'
    7/8, 56 MiB. The combine sends those 56 MiB back and receives its own 28 MiB; the
    backward mirrors both. The time stays priced at the larger way (the exchange ends when
    the busiest rank has its rows), and the tables name both ways: a received column wide,
    the received bytes under the sent narrow (they printed sent = received = 56 MiB)."""
    from rich.console import Console

    from budget.render.table import render_table

    mixtral = ROOT / "plans" / "mixtral-8x7b.yaml"
    path = variant(tmp_path, "skewed.yaml", ("top_k: 2", "top_k: 2, imbalance: 2"), base=mixtral)
    report = build_report(load_plan(path))
    rows = {(c.phase, c.name): c for p in report.phases for c in p.collectives}
    mib = 2**20
    for phase, name, sent, received in [
        ("forward.moe", "MoE dispatch", 28, 56),
        ("forward.moe", "MoE combine", 56, 28),
        ("backward.moe", "MoE combine gradient", 28, 56),
        ("backward.moe", "MoE dispatch gradient", 56, 28),
    ]:
        c = rows[phase, name]
        assert (c.sent_bytes, c.recv_bytes) == (sent * mib, received * mib), name
        # NCCL's grouped exchange: 3 peers in the node (24 or 12 MiB), 4 across (32 or 16)
        assert [(lv["sent_bytes"], lv["recv_bytes"]) for lv in c.levels] == [
            (3 * sent // 7 * mib, 3 * received // 7 * mib),
            (4 * sent // 7 * mib, 4 * received // 7 * mib),
        ], name
    even = build_report(load_plan(ROOT / "plans" / "mixtral-8x7b.yaml"))
    (plain,) = [c for p in even.phases for c in p.collectives if c.name == "MoE dispatch"]
    assert plain.sent_bytes == plain.recv_bytes == 28 * mib
    dispatch, combine = rows["forward.moe", "MoE dispatch"], rows["forward.moe", "MoE combine"]
    assert dispatch.time_s == combine.time_s > plain.time_s
    for width, wide in ((200, True), (80, False)):
        console = Console(width=width, color_system=None, record=True)
        render_table(console, report)
        text = console.export_text()
        assert ("received = sent" in text) == (not wide)
        line = next(li for li in text.splitlines() if "MoE dispatch " in li)
        if wide:
            assert "28.0 MiB  56.0 MiB" in line
        else:
            after = text.splitlines()[text.splitlines().index(line) + 1]
            assert "28.0 MiB" in line and "56.0 MiB" in after
            assert max(len(li) for li in text.splitlines()) <= 80


def _mixtral_overlapped(tmp_path: Path) -> Plan:
    """Mixtral 8x7B as shipped with overlap.ep on, interleaved over 2 virtual stages (as
    Megatron-Core asks beside a pipeline)."""
    path = tmp_path / "mixtral.yaml"
    shipped = (ROOT / "plans" / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    interleaved = "  pp: 4\n  pipeline: {schedule: interleaved, virtual_stages: 2}\n"
    path.write_text(
        shipped.replace("  pp: 4\n", interleaved) + "overlap: {ep: true}\n", encoding="utf-8"
    )
    return load_plan(path)


def test_overlapped_expert_all_to_alls_hide_behind_the_other_pass_of_a_layer(tmp_path):
    """Megatron-Core's combined 1F1B runs one micro-batch's forward of a layer beside
    another's backward: the forward's dispatch and combine hide behind one MoE layer's
    backward (attention and MoE block), the backward's behind its forward, one after the
    other in what the window leaves, in the chunk passes a stage pairs (an audit: they hid
    behind their own phase's expert GEMMs, and DeepSeek-V3's step exposed twice what
    DualPipe does). Mixtral 8x7B as shipped with overlap.ep on, interleaved over 2 virtual
    stages (as Megatron-Core asks beside a pipeline): m = 256 / 8 = 32 micro-batches over
    pp 4, m·v = 64 chunk passes a stage, of which stage r runs W = 2(3 − r) + (2 − 1)·4 + 1
    alone (``get_pp_rank_microbatches`` with the overlap's one more; an audit, m457: every
    stage had taken 1F1B's p of m), stage 0's 11, a share q = 53/64 paired: a pass's
    all-to-alls, T in all, beside the other pass's W expose q·max(0, T − W) + (1 − q)·T =
    max((1 − q)·T, T − q·W), the unpaired passes' whole (a review: they read 0 where W
    passed T); stage 3 pairs 59 of 64."""
    from budget.schedule import _kernels, _windows, time_phase

    plan = _mixtral_overlapped(tmp_path)
    step = derive(plan)
    stage = step.stages[0]
    kernels = _kernels(plan, stage)
    windows = _windows(stage, kernels, step.microbatches)
    one = {p.name: sum(k.values()) for p, k in zip(stage.phases, kernels, strict=True)}
    assert windows["@forward-layer"] == one["forward.attention"] + one["forward.moe"]
    assert windows["@backward-layer"] == one["backward.attention"] + one["backward.moe"]
    assert step.microbatches == 32
    for name, other in (("forward.moe", "@backward-layer"), ("backward.moe", "@forward-layer")):
        (phase,) = [p for p in stage.phases if p.name == name]
        # the rows' two all-to-alls and Megatron-Core's of the routing probabilities
        timed = [t for t in time_phase(plan, phase, windows).moves if t.move.op == "all-to-all"]
        q = 53 / 64
        assert len(timed) == 3 and all((t.move.share, t.move.floor) == (q, 1 - q) for t in timed)
        total = sum(t.time_s for t in timed)
        exposed = sum(t.exposed_s for t in timed)
        assert windows[other] > total  # both windows cover the pair: the floor is what shows
        assert exposed == pytest.approx((1 - q) * total, rel=1e-12)
        assert exposed == pytest.approx(max((1 - q) * total, total - q * windows[other]))
        assert "another micro-batch's" in timed[0].rule


def test_a_serving_plans_time_is_called_its_run_not_a_step(tmp_path: Path) -> None:
    """A serving plan's time is its whole batch's: `budget check` said "the step takes
    11.6 s" of it, a caution counted its collectives' calls "a step", and `budget diff`
    put two serving plans' times under "step time" (an audit)."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from budget.report import slow_link_notes, time_word
    from budget.units import format_duration

    decode = PLANS / "llama3-70b-decode.yaml"
    runner = CliRunner()
    out = runner.invoke(app, route(["check", str(decode), "--max-step", "10s"]))
    text = " ".join(out.stdout.split())  # the limits line under it too: "run time ≤ 10 s"
    step = build_report(load_plan(decode)).step
    run = format_duration(step["time_s"])  # 11.7 s
    assert out.exit_code == 1 and f"run {run}" in text and f"the run takes {run}" in text
    assert "step" not in text.replace("max_step", "") and "; run time ≤ 10 s" in text
    smaller = variant(tmp_path, "d16.yaml", ("sequences: 32", "sequences: 16"), base=decode)
    out = runner.invoke(app, route(["diff", str(decode), str(smaller)]), env={"COLUMNS": "100"})
    text = " ".join(out.stdout.split())
    assert "Run and worst stage" in text and " run time " in text and "the run's and" in text
    assert "step time" not in text and "Step and" not in text
    # its rate and MFU are its decode passes', as its report says, not the run's
    rate, mfu = f"{step['tokens_per_s']:,.0f}", f"{step['mfu']:.1%}"  # 1,827 and 3.3%
    assert f" tokens/s decoding {rate} " in text and f" decode MFU {mfu} " in text
    # across nodes, tp's per-layer calls are counted over the run
    wide = variant(
        tmp_path, "tp16.yaml", ("tp: 8", "tp: 16"), ("nodes: 1", "nodes: 2"), base=decode
    )
    report = build_report(load_plan(wide))
    assert time_word(report.mode) == "run"
    notes = slow_link_notes(report)
    assert notes and all("calls a run" in n for n in notes)
    assert time_word(build_report(load_plan(ROOT / "plans" / "gpt3-175b.yaml")).mode) == "step"


def test_a_capacity_factor_is_said_in_the_header_and_the_json(tmp_path: Path) -> None:
    """A capacity factor caps the rows an expert takes and changes the all-to-all's bytes,
    but the header still read "(top 2)" and the JSON had no word of it (an audit)."""
    from rich.console import Console

    from budget.render.table import render_table
    from budget.report_schema import validation_errors

    capped = variant(
        tmp_path,
        "cap.yaml",
        ("top_k: 2,", "top_k: 2, capacity_factor: 1.25, pad_to_capacity: true,"),
        base=PLANS / "mixtral-8x7b.yaml",
    )
    report = build_report(load_plan(capped))
    experts = to_dict(report)["model"]["experts"]
    assert (experts["capacity_factor"], experts["pad_to_capacity"]) == (1.25, True)
    assert validation_errors(to_dict(report), "report") == []
    console = Console(width=200, record=True, color_system=None)
    render_table(console, report)
    assert "(top 2, capacity factor 1.25 padded)" in console.export_text()
    whole = variant(
        tmp_path,
        "big.yaml",
        ("top_k: 2,", "top_k: 2, capacity_factor: 1000000,"),
        base=PLANS / "mixtral-8x7b.yaml",
    )
    console = Console(width=200, record=True, color_system=None)
    render_table(console, build_report(load_plan(whole)))
    assert "(top 2, capacity factor 1,000,000)" in console.export_text()  # not 1e+06
    dropless = to_dict(build_report(load_plan(PLANS / "mixtral-8x7b.yaml")))["model"]["experts"]
    assert (dropless["capacity_factor"], dropless["pad_to_capacity"]) == (None, False)


def test_the_busiest_expert_rank_reads_more_experts_than_the_mean_rank_has_rows(tmp_path):
    """An audit: DeepSeek-V3 decoding 16 sequences at dp 2, ep 8 (32 experts a rank) gives
    a rank 8 x 8 / 8 = 8 rows on average, and the busiest rank's tokens reach
    most_reached(32, 1 − (31/32)^8, 8) = 10.636 of its experts (a 20,000-trial Monte Carlo
    of 8 tokens each picking 8 distinct experts of 256: 10.646). The expert GEMMs read those
    10.636 experts' weights (each 7,168 x 2 x 2,048 at 1 B: the preset's fp8 GEMMs), not
    the 8 the mean rank's rows cap; the rows' inputs and outputs are bf16."""
    from budget.flops import most_reached

    text = (
        "name: dsv3-decode\nmode: decode\nmodel: {preset: deepseek-v3}\n"
        "batch: {sequences: 16, prompt: 4096, generate: 512}\n"
        "parallel: {tp: 8, dp: 2, ep: 8, etp: 1}\n"
        "device: {preset: h200}\ntopology: {preset: dgx-h200, nodes: 2}\n"
    )
    import math

    fc1 = _decode_fc1(tmp_path, text)
    reach = 1 - (31 / 32) ** 8
    busiest = most_reached(32, reach, 8)
    # the expected maximum of 8 binomial(32, reach) counts, written with math.comb (an audit:
    # the engine's own 10.636 had been the expected value); the Monte Carlo's 10.646 is
    # within its sampling error of it
    cdf = [
        sum(math.comb(32, j) * reach**j * (1 - reach) ** (32 - j) for j in range(x + 1))
        for x in range(32)
    ]
    assert busiest == pytest.approx(sum(1 - f**8 for f in cdf), rel=1e-12)
    assert busiest == pytest.approx(10.646, abs=0.03)
    rows, expert = 8, 7168 * 2 * 2048
    assert fc1.bytes == 2 * (rows * 7168 + rows * 2 * 2048) + round(busiest * expert)


def test_the_readmes_group_limited_routing_figure_is_the_plans(tmp_path):
    """README ("A decode pass reads the weights of the experts its tokens reach"): DeepSeek-V3
    in fp8 on one 8-GPU H200 node at ep 8 and batch 1, the plan it names, reads a token in
    the engine's decode time, and group-limited routing would make its busiest rank read
    3.0 experts a layer (the README's simulation of the published rule) where the uniform
    picks give most_reached(32, 1 − (1 − 8/256), 8) = 2.544: each expert's three 7,168 x
    2,048 matrices at 1 B, over its 58 MoE layers, at the H200's streaming rate, is the time
    that is due beside it (an audit found the figure stale: 12.1 ms where the engine read
    12.2)."""
    from budget.catalog.devices import DEVICES
    from budget.flops import most_reached

    plan = tmp_path / "dsv3-decode.yaml"
    plan.write_text(
        "name: dsv3-decode\nmode: decode\nmodel: {preset: deepseek-v3}\n"
        "batch: {sequences: 1, prompt: 1024, generate: 256}\n"
        "precision: {params: fp8, activations: bf16}\n"
        "parallel: {tp: 8, ep: 8, etp: 1}\n"
        "device: {preset: h200}\ntopology: {preset: dgx-h200, nodes: 1}\n",
        encoding="utf-8",
    )
    token = build_report(load_plan(plan)).step["decode_token_s"]
    h200 = DEVICES["h200"]
    uniform = most_reached(32, 1 - (1 - 8 / 256), 8)
    extra = (3.0 - uniform) * 3 * 7168 * 2048 * 58
    due = token + extra / (h200.memory_bandwidth * h200.memory_efficiency)
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    said = f"reads {token * 1e3:.1f} ms a token where about {due * 1e3:.1f} ms is due"
    assert said in readme, said


DECODE = PLANS / "llama3-70b-decode.yaml"


def test_a_serving_plan_refuses_dropout(tmp_path):
    """Served models run in eval mode, where dropout is off: `model.dropout: true` in a
    decode plan was read and charged its masks' bytes (time to first token +1.05 %), where
    every other training-only key is refused (an audit)."""
    from budget.errors import BudgetError

    plan = variant(
        tmp_path,
        "d.yaml",
        ("  attention: flash\n", "  attention: flash\n  dropout: true\n"),
        base=DECODE,
    )
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    assert [(p.path, p.message) for p in raised.value.problems] == [
        (
            "$.model.dropout",
            "model.dropout stores a training step's dropout masks; a decode plan runs the "
            "model in eval mode, where dropout is off; remove it",
        )
    ]


def test_a_configs_training_dropout_is_off_when_served(tmp_path):
    """A `config.json` with `attention_dropout: 0.1` (its training setting) turns dropout on
    for training (`hf_config`), but a decode plan of it is served in eval mode: the same
    report as the config without it (an audit: 902 against 896 ms to the first token)."""
    import json

    config = json.loads((ROOT / "tests/data/hf/llama3-70b/config.json").read_text())
    reports = []
    for p in (0.0, 0.1):
        config["attention_dropout"] = p
        (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
        text = DECODE.read_text(encoding="utf-8")
        head, tail = text.split("model:\n", 1)
        tail = tail[tail.index("batch:") :]
        path = tmp_path / f"hf-{p}.yaml"
        path.write_text(f"{head}model: {{hf_config: config.json}}\n{tail}", encoding="utf-8")
        plan = load_plan(path)
        assert plan.model.dropout is False
        reports.append(to_dict(build_report(plan)))
    assert reports[0]["step"] == reports[1]["step"]
    assert reports[0]["step"]["ttft_s"] > 0


def test_a_serving_blocks_working_set_is_its_tensors_by_hand(tmp_path):
    """What a serving block holds while it computes (`inference._working_set`), by hand.
    Llama 3 70B decode plan (tp 8, 32 sequences of 2,048 prompt tokens): the prefill's
    65,536 tokens hold the layer input and the residual, 2 · 65,536 · 8,192 =
    1,073,741,824 B each, Q/K/V of 8 query heads and 1 KV head of 128 a rank, 2 · 65,536 ·
    (1,024 + 128 + 128) = 167,772,160 B, and the attention output, 2 · 65,536 · 1,024 =
    134,217,728 B; a decode pass the same for 32 tokens (524,288, 81,920 and 65,536 B).
    Mixtral 8x7B served at tp 8 (8 sequences of 4,096 tokens, top 2, experts split over
    tp): 65,536 routed rows of 14,336 / 8 = 1,792 expert columns, gated fc1 output 2 · 2 ·
    65,536 · 1,792 = 469,762,048 B, the activation's half that, and the rows permuted in
    and out, 2 · 2 · 65,536 · 4,096 = 1,073,741,824 B (an audit: no test held these)."""
    from budget.inference import derive_inference

    def transients(plan, phase: str) -> dict[str, int]:
        stage = derive_inference(plan).stages[0]
        instant = next(p for p in stage.phases if p.name == phase).instants[0]
        return {a.name: int(a.bytes) for a in instant.live if a.category == "transient"}

    llama = load_plan(PLANS / "llama3-70b-decode.yaml")
    assert transients(llama, "prefill.attention") == {
        "layer input": 1_073_741_824,
        "residual stream": 1_073_741_824,
        "Q/K/V": 2 * 65_536 * (1_024 + 128 + 128),
        "attention output": 2 * 65_536 * 1_024,
    }
    assert transients(llama, "decode.attention") == {
        "layer input": 2 * 32 * 8_192,
        "residual stream": 2 * 32 * 8_192,
        "Q/K/V": 2 * 32 * 1_280,
        "attention output": 2 * 32 * 1_024,
    }
    path = tmp_path / "mixtral-serve.yaml"
    path.write_text(
        "mode: decode\nmodel: {layers: 32, hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, "
        "vocab: 32000, mlp: swiglu, norm: rmsnorm, tied_embeddings: false, position: rope, "
        "attention: flash, experts: {count: 8, top_k: 2, ffn: 14336}}\n"
        "batch: {sequences: 8, prompt: 4096, generate: 64}\n"
        "precision: {params: bf16, activations: bf16}\nparallel: {tp: 8}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, gpus: 8}\n",
        encoding="utf-8",
    )
    rows = 8 * 4_096 * 2
    moe = transients(load_plan(path), "prefill.moe")
    assert moe == {
        "layer input": 2 * 32_768 * 4_096,
        "residual stream": 2 * 32_768 * 4_096,
        "routed token rows, permuted for the rank's experts and back (no exchange)": 2
        * 2
        * rows
        * 4_096,
        "expert fc1 output": 2 * 2 * rows * 1_792,
        "expert activation output": 2 * rows * 1_792,
    }
    assert moe["expert fc1 output"] == 469_762_048


def test_a_prefill_plans_rate_is_its_prompt_tokens_over_the_time_to_first_token(tmp_path):
    """A prefill plan's tokens/s counts every sequence's prompt tokens over the time to the
    first token (`schedule.serving_time`: the batch's prompts, not one sequence's; an
    audit: no test held it)."""
    path = variant(tmp_path, "prefill.yaml", ("mode: decode", "mode: prefill"), base=DECODE)
    step = build_report(load_plan(path)).step
    assert step["tokens_per_s"] == pytest.approx(32 * 2_048 / step["ttft_s"], rel=1e-12)


def test_the_dispatcher_moves_routing_probabilities_and_counts(tmp_path):
    """Megatron-Core 0.13.1's all-to-all dispatcher (``MoEAlltoAllTokenDispatcher``, an
    audit): the routing probabilities go out with the dispatch in an all-to-all of their
    own over ep (``token_dispatch``) and back with its gradient, are all-gathered over etp
    with the rows (``dispatch_postprocess``) and reduce-scattered in the backward; unless
    every expert takes its whole capacity, each rank's row counts per expert (int64) are
    first all-gathered over etp x ep (``preprocess``, ``tp_ep_group``). Mixtral 8x7B as
    shipped: tp 2 with sequence parallelism, ep 8, etp 2, 4,096 tokens: 2,048 tokens a
    rank, top 2, so 4,096 rows of one bf16 probability each: the all-to-all's tensor
    4,096 x 2 B x 8 = 65,536 B; gathered over etp, 8,192 rows, 16,384 B; the counts,
    8 experts x 8 B from each of 16 ranks, 1,024 B. Serving has none of them (vLLM's MoE
    is not Megatron-Core's dispatcher), nor the counts where experts are padded."""
    plan = load_plan(PLANS / "mixtral-8x7b.yaml")
    assert (plan.parallel.tp, plan.parallel.ep, plan.parallel.expert_tp) == (2, 8, 2)
    phases = {p.name: p for p in derive(plan).stages[0].phases}

    def moves(name):
        return [(m.name, m.op, m.group, m.ranks, m.size_bytes) for m in phases[name].moves]

    forward, backward = moves("forward.moe"), moves("backward.moe")
    rows = 2048 * 2
    assert forward[:3] == [
        ("MoE routing counts", "all-gather", "ep", 16, 8 * 8 * 16),
        ("MoE dispatch", "all-to-all", "ep", 8, rows * 4096 * 2 * 8),
        ("MoE probabilities", "all-to-all", "ep", 8, rows * 2 * 8),
    ]
    assert ("MoE probabilities (etp)", "all-gather", "etp", 2, 2 * rows * 2) in forward
    assert backward[-1] == (
        "MoE probabilities gradient",
        "all-to-all",
        "ep",
        8,
        rows * 2 * 8,
    )
    gathered = "MoE probabilities gradient (etp)"
    assert (gathered, "reduce-scatter", "etp", 2, 2 * rows * 2) in backward
    # the counts are priced over the 16 ranks of etp x ep, two nodes of 8
    report = build_report(plan)
    (counts,) = [c for p in report.phases for c in p.collectives if c.name == "MoE routing counts"]
    assert (counts.ranks, counts.dtype) == (16, "int64")
    # its rule names the group as the table does: tp_ep over etp x ep, and where etp is 1
    # ep alone (an audit: DeepSeek-MoE 16B's footnote read "tp_ep" beside "ep 8")
    assert counts.overlap_rule.startswith("tp_ep: exposed")
    deepseek = build_report(load_plan(PLANS / "deepseek-moe-16b.yaml"))
    (ep,) = [c for p in deepseek.phases for c in p.collectives if c.name == "MoE routing counts"]
    assert ep.ranks == deepseek.layout["ep"] == 8
    assert ep.overlap_rule.startswith("ep: exposed, the all-to-all's splits wait for it")
    routed = "experts: {count: 8, top_k: 2, ffn: 14336"
    padded = variant(
        tmp_path,
        "padded.yaml",
        (routed, routed + ", capacity_factor: 1.25, pad_to_capacity: true"),
        base=PLANS / "mixtral-8x7b.yaml",
    )
    padded_phases = {p.name: p for p in derive(load_plan(padded)).stages[0].phases}
    names = {m.name for m in padded_phases["forward.moe"].moves}
    assert "MoE routing counts" not in names and "MoE probabilities" in names


def _serving_instants(plan, phase: str) -> dict[str, dict[str, int]]:
    (stage, *_) = derive(plan).stages
    (found,) = [p for p in stage.phases if p.name == phase]
    return {
        i.label: {a.name: a.total for a in i.live if a.category == "transient"}
        for i in found.instants
    }


def test_serving_holds_a_row_parallel_output_while_it_is_reduced():
    """The output projection and fc2 write their output whole on each tp rank before the
    all-reduce, beside the block's input, residual and the projection's input (the QKV
    output too in the attention, a local until it returns); serving had no instant there
    (an audit: the shipped decode plan's prefill peaked 134,217,728 B under it).

    By hand, Llama 3 70B at tp 8, 32 prompts of 2,048 tokens: 65,536 rows; the input, the
    residual and the partial output 65,536 · 8,192 · 2 B each, the activation's output
    65,536 · 28,672 / 8 · 2 B; Q/K/V (64 + 2 · 8 heads) / 8 · 128 columns, the attention's
    output 64 / 8 · 128."""
    plan = load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    rows, hidden = 32 * 2048, 8192 * 2
    mlp = _serving_instants(plan, "prefill.mlp")["fc2 output reduction"]
    assert mlp == {
        "layer input": rows * hidden,
        "residual stream": rows * hidden,
        "MLP activation output": rows * 28672 // 8 * 2,
        "MLP output (partial, before reduction)": rows * hidden,
    }
    attention = _serving_instants(plan, "prefill.attention")["output projection reduction"]
    assert attention == {
        "layer input": rows * hidden,
        "residual stream": rows * hidden,
        "Q/K/V": rows * (64 + 16) // 8 * 128 * 2,
        "attention output": rows * 64 // 8 * 128 * 2,
        "attention output (partial, before reduction)": rows * hidden,
    }
    (stage,) = build_report(plan).stages
    assert (stage.peak_phase, stage.peak_instant) == ("prefill.mlp", "fc2 output reduction")


def test_serving_output_holds_the_normed_positions_and_the_whole_vocabulary_s_logits():
    """At the output GEMM the final norm's output over every position is alive (the
    positions are picked from it), and the sampler reads fp32 logits over the whole
    vocabulary beside the gathered ones (an audit: they were counted over one rank's
    vocabulary rows). Llama 3 70B at tp 8, 32 sequences, 128,256 tokens' vocabulary."""
    plan = load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    prefill = _serving_instants(plan, "prefill.output")["logits"]
    assert prefill == {
        "final norm output, every position": 32 * 2048 * 8192 * 2,
        "logits (fp32) for sampling, whole vocabulary": 4 * 32 * 128_256,
        "logits gathered for sampling": 2 * 32 * 128_256,
    }
    decode = _serving_instants(plan, "decode.output")["logits"]
    assert decode["final norm output, every position"] == 32 * 8192 * 2


_SMALL_MOE = (
    "name: moe\nmode: train\n"
    "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn: 512, vocab: 128, "
    "mlp: swiglu, norm: rmsnorm, tied_embeddings: false, position: rope, "
    "attention: flash, experts: {count: 8, top_k: 2, ffn: 64}}\n"
    "batch: {seq: 128, micro: 1, global: 8}\n"
    "precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, "
    "activations: bf16}\n"
    "parallel: {tp: 2, pp: 1, dp: 4, ep: 4, sequence_parallel: true, zero: 1}\n"
    "recompute: none\ndevice: {preset: h100-sxm, reserved: 0 GiB}\n"
    "topology: {preset: dgx-h100, nodes: 1}\n"
)


def _moe_instants(plan, phase: str) -> dict[str, dict[str, int]]:
    (stage,) = derive(plan).stages
    (found,) = [p for p in stage.phases if p.name == phase]
    return {i.label: {a.name: a.total for a in i.live} for i in found.instants}


def _beyond(held: dict[str, int], base: dict[str, int]) -> dict[str, int]:
    """What `held` has that `base` has not (or not as many bytes of), by name."""
    return {k: b for k, b in held.items() if base.get(k) != b}


def test_the_experts_output_goes_back_to_its_tokens_in_two_moments(tmp_path):
    """Before the combine all-to-all Megatron-Core's ``MoELayer`` keeps ``expert_output``
    while ``combine_preprocess`` sorts its rows back to their ranks' order (a copy, with
    more than one expert a rank) and reduce-scatters them over etp into a buffer of its
    own; the all-to-all then writes the rows the rank sent into a fresh buffer and the
    un-permute scatters them into its tokens (audits: the forward had no instant past the
    experts' GEMMs, and a small plan's true peak is past them).

    Hidden 256, 8 experts top 2 at tp 2 with sequence parallelism, one sequence of 128
    tokens, 64 a rank, 128 rows dispatched, 2 B an element. Over ep 4 (two experts a
    rank, etp 2): 256 rows once gathered; the output and its sorted copy 256 · 256 · 2 B
    each, the reduce-scattered rows 128 · 256 · 2 B. Over ep 8 with etp 1 (one expert a
    rank): the output 128 · 256 · 2 B, the all-to-all's output as much beside it and the
    64 tokens' 64 · 256 · 2 B; the received rows are the experts' saved input, counted
    once (the audit found them twice)."""
    one_expert = _SMALL_MOE.replace("ep: 4,", "ep: 8, etp: 1,")
    cases = (
        (
            _SMALL_MOE,
            "expert output combine",
            {
                "expert output (fc2)": 256 * 256 * 2,
                "expert output, sorted back to its ranks' order": 256 * 256 * 2,
                "expert output (reduce-scattered over etp)": 128 * 256 * 2,
            },
        ),
        (
            one_expert,
            "combine un-permute",
            {
                "expert output (fc2)": 128 * 256 * 2,
                "combine all-to-all output": 128 * 256 * 2,
                "expert output, un-permuted to its tokens": 64 * 256 * 2,
            },
        ),
    )
    for text, moment, added in cases:  # each plan's peak, beyond what the GEMMs' holds
        plan = _load_text(tmp_path, text)
        forward = _moe_instants(plan, "forward.moe")
        assert _beyond(forward[moment], forward["expert computation"]) == added
        (row,) = build_report(plan).stages
        assert (row.peak_phase, row.peak_instant) == ("forward.moe", moment)
        assert row.peak_bytes == sum(forward[moment].values())
    computing = _moe_instants(_load_text(tmp_path, one_expert), "forward.moe")
    computing = computing["expert computation"]
    assert computing["dispatch send and receive buffers"] == 128 * 256 * 2  # the sent alone
    assert computing["dispatched tokens"] == 128 * 256 * 2
    # under FP8 the experts save Transformer Engine's 1-byte copy, and the received 16-bit
    # rows are a tensor of their own, counted with the buffers (a review)
    fp8 = _load_text(
        tmp_path, one_expert.replace("activations: bf16}", "activations: bf16, matmul: fp8}")
    )
    computing = _moe_instants(fp8, "forward.moe")["expert computation"]
    assert computing["dispatch send and receive buffers"] == 2 * 128 * 256 * 2
    assert computing["dispatched tokens"] == 128 * 256 * 1


def test_an_moe_block_s_backward_holds_each_gradient_while_it_is_alive(tmp_path):
    """Autograd runs the MoE block's forward in reverse, freeing each gradient once the
    next is made and each saved tensor once its node's backward has run; the forward's
    dispatch buffers are not saved for it (an audit: one instant held every gradient and
    those buffers at once, over the true peak by 98,304 B here). By hand, the ep 8, etp 1
    plan of the test above (128 rows of hidden 256 and expert width 64, 2 B an element;
    the output gradient of 64 tokens, 64 · 256 · 2 B, beside every moment): the combine
    all-to-all's backward holds its input and output, 128 · 256 · 2 B each; fc2's the
    output's gradient and its input's, 128 · 64 · 2 B; the activation's that, the gated
    activation's gradient, 2 · 128 · 64 · 2 B, and the fp32 row probabilities', 128 · 4 B,
    fc2's input freed; fc1's the activation's and the token rows', 128 · 256 · 2 B, fc1's
    output and the probabilities freed. Over ep 4 with etp 2 the sort's backward peaks:
    the output gradient and two gradients of the 256 gathered rows, 256 · 256 · 2 B each."""
    one = _load_text(tmp_path, _SMALL_MOE.replace("ep: 4,", "ep: 8, etp: 1,"))
    backward = _moe_instants(one, "backward.moe")
    rows, wide, narrow = 128 * 256 * 2, 2 * 128 * 64 * 2, 128 * 64 * 2
    saved = {"expert fc2 input": narrow, "expert fc1 output": wide}
    saved["expert row probabilities (fp32)"] = 128 * 4
    first = backward["combine gradients"]
    assert {k: first[k] for k in saved} == saved
    moment = {"output gradient", "output gradient rows (un-permuted's backward)"}
    common = {k: b for k, b in first.items() if k not in moment | {"expert output gradients"}}
    assert first["output gradient"] == 64 * 256 * 2
    want = {
        "combine gradients": (
            {},
            {
                "output gradient rows (un-permuted's backward)": rows,
                "expert output gradients": rows,
            },
        ),
        "expert fc2 gradients": (
            {},
            {"expert output gradients": rows, "expert fc2 input gradient": narrow},
        ),
        "expert activation gradients": (
            {"expert fc2 input"},
            {
                "expert fc2 input gradient": narrow,
                "expert activation gradient": wide,
                "expert row probabilities' gradient (fp32)": 128 * 4,
            },
        ),
        "expert fc1 gradients": (
            {"expert fc2 input", "expert fc1 output", "expert row probabilities (fp32)"},
            {"expert activation gradient": wide, "dispatched token gradients": rows},
        ),
    }
    for label, (freed, made) in want.items():
        held = backward[label]
        assert held.pop("output gradient") == 64 * 256 * 2
        assert {k: b for k, b in common.items() if k not in freed} == {
            k: b for k, b in held.items() if k in common
        }, label
        assert {k: b for k, b in held.items() if k not in common} == made, label
    (row,) = build_report(one).stages
    assert max(sum(h.values()) for h in backward.values()) == sum(first.values())
    assert row.peak_phase == "forward.moe"  # past the backward's 4,741,376 B

    plan = _load_text(tmp_path, _SMALL_MOE)
    widened = _moe_instants(plan, "backward.moe")["expert output gradients"]
    assert {k: b for k, b in widened.items() if k.startswith("expert output gradients")} == {
        "expert output gradients": 256 * 256 * 2,
        "expert output gradients, sorted by expert": 256 * 256 * 2,
    }


def test_served_moe_holds_the_shared_experts_output_and_its_combine(tmp_path):
    """Serving an MoE model: the shared experts' output is made before the routed experts
    run and is alive until the combine adds it (vLLM's ``DeepseekMoE.forward``:
    ``shared_output`` first, added after ``fused_moe``); under expert parallelism the
    routed rows come back through the combine as in training (audits: neither was held).
    DeepSeekMoE 16B decoding 64 prompts of 2,048 tokens: 131,072 tokens · 2,048 · 2 B of
    shared output in the prefill; over ep 8 (dp 8) each rank's combine holds its 16,384
    tokens' 6 routed rows each, the experts' output and its sorted copy, then the combine
    all-to-all's output beside the un-permuted tokens."""
    text = (ROOT / "plans" / "deepseek-moe-16b.yaml").read_text(encoding="utf-8")
    trained = _moe_instants(_load_text(tmp_path, text), "forward.moe")  # one 4,096-token sequence
    for held in trained.values():
        assert held["shared experts' output"] == 4096 * 2048 * 2
    text = text.replace("mode: train", "mode: decode")
    text = text.replace("seq: 4096", "sequences: 64").replace("micro: 1", "prompt: 2048")
    text = text.replace("global: 512", "generate: 512")
    for key in ("grads: fp32", "master: fp32", "optimizer: adam", "zero: 1"):
        text = text.replace(f"  {key}\n", "")
    text = text.replace("recompute: selective\n", "")
    served = text.replace("tp: 1", "tp: 8").replace("dp: 16", "dp: 1").replace("ep: 8", "ep: 1")
    served = served.replace("nodes: 2", "nodes: 1")
    tp = _serving_instants(_load_text(tmp_path, served), "prefill.moe")
    assert list(tp) == ["experts"]  # the tokens replicated over tp: permuted back already
    assert tp["experts"]["shared experts' output"] == 64 * 2048 * 2048 * 2
    ep = _serving_instants(
        _load_text(tmp_path, text.replace("dp: 16", "dp: 8").replace("nodes: 2", "nodes: 1")),
        "prefill.moe",
    )
    rows = 64 * 2048 // 8 * 6 * 2048 * 2
    assert list(ep) == ["experts", "expert output combine", "combine un-permute"]
    assert _beyond(ep["expert output combine"], ep["experts"]) == {
        "expert output (fc2)": rows,
        "expert output, sorted back to its ranks' order": rows,
    }
    assert _beyond(ep["combine un-permute"], ep["experts"]) == {
        "expert output, sorted back to its ranks' order": rows,
        "combine all-to-all output": rows,
        "expert output, un-permuted to its tokens": 64 * 2048 // 8 * 2048 * 2,
    }
    # on one expert-parallel rank the all-to-all hands its input back: no buffer of its own
    # (a review), and the stage peaks in the experts' instant
    one = text.replace("dp: 16", "dp: 8").replace("ep: 8", "ep: 1").replace("nodes: 2", "nodes: 1")
    alone = _serving_instants(_load_text(tmp_path, one), "prefill.moe")
    assert "combine all-to-all output" not in alone["combine un-permute"]
    assert sum(alone["combine un-permute"].values()) < sum(alone["experts"].values())


def test_all_gathered_attention_s_backward_holds_its_step_dq_and_reordered_dv(tmp_path):
    """Transformer Engine's ``AttnFuncWithCPAndKVAllGather.backward`` keeps each step's dQ in
    ``dq_per_step`` until it returns, and reorders the whole dK and dV with
    ``torch.index_select`` (a copy beside the original) before their reduce-scatters, which
    alone make the rank's own dK/dV (an audit: the copies were uncounted and the local dK/dV
    counted beside the whole ones). Hidden 512 in 8 heads of 64, 8 K/V heads, 1,024 tokens
    over cp 4: a rank's dQ 256 · 512 · 2 B, a whole dV 1,024 · 512 · 2 B."""
    text = (
        "name: small\nmode: train\n"
        "model: {layers: 2, hidden: 512, heads: 8, kv_heads: 8, ffn: 1024, vocab: 1000, "
        "mlp: swiglu, norm: rmsnorm, tied_embeddings: false, position: rope, "
        "attention: flash}\n"
        "batch: {seq: 1024, micro: 1, global: 8}\n"
        "precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, "
        "activations: bf16}\n"
        "parallel: {tp: 1, cp: 4, pp: 1, dp: 2, zero: 1, cp_attention: allgather}\n"
        "recompute: none\ndevice: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n"
    )
    plan = _load_text(tmp_path, text)
    core = _moe_instants(plan, "backward.attention")["attention core gradients"]
    assert core["dQ of the two steps (dq_per_step)"] == 256 * 512 * 2
    assert core["dV reordered (index_select's copy)"] == 1024 * 512 * 2
    assert core["Q/K/V gradients"] == 256 * 512 * 2  # dQ alone: dK/dV come after
    ring = _load_text(tmp_path, text.replace(", cp_attention: allgather", ""))
    assert (
        _moe_instants(ring, "backward.attention")["attention core gradients"]["Q/K/V gradients"]
        == 256 * 3 * 512 * 2
    )
    # the forward's reorder of the gathered K and V (``index_select``, one at a time): a
    # copy of one, 1,024 · 512 · 2 B, beside both gathered, 2 · 1,024 · 512 · 2 B, before
    # the core has made its output (an audit); none on the ring, whose chunks come in order
    forward = _moe_instants(plan, "forward.attention")
    reordered = forward["K/V reordered for the core"]
    assert reordered["K or V reordered (index_select's copy)"] == 1024 * 512 * 2
    assert reordered["K/V all-gathered"] == 2 * 1024 * 512 * 2
    assert _beyond(forward["after attention"], reordered).keys() >= {
        "attention projection input",
        "attention softmax statistics (fp32)",
    }
    assert "attention projection input" not in reordered
    assert "K/V reordered for the core" not in _moe_instants(ring, "forward.attention")
    # and again before the core's recomputed forward, whose outputs it has not made yet (a
    # review: the copy had been held beside them)
    for mode in ("selective", "full"):
        recomputing = _load_text(tmp_path, text.replace("recompute: none", f"recompute: {mode}"))
        backward = _moe_instants(recomputing, "backward.attention")
        copy = "K or V reordered (index_select's copy)"
        again = backward["K/V reordered for the core (recomputed)"]
        assert again[copy] == 1024 * 512 * 2 and again["K/V all-gathered"] == 2 * 1024 * 512 * 2
        assert copy not in backward["attention core (recomputed)"]
        assert not [n for n in again if "statistics" in n and n.endswith("(recomputed)")]
        assert "attention projection input (recomputed)" not in again


def test_a_serving_pipeline_sends_each_stage_on_its_own_link(tmp_path):
    """An audit: a serving pass runs its stages one after another, so each send is on the
    way, at its own pair's link; they had all been priced at the outermost link any pair
    crosses. pp 4 x tp 4 over two DGX H100 nodes: stages 0-1 and 2-3 share a node, so two
    sends cross NVLink and one InfiniBand, as pp 2 x tp 4 on one node sends (NVLink) and
    pp 2 x tp 8 over two nodes (InfiniBand), the same activations each."""
    base = ROOT / "plans" / "llama3-70b-decode.yaml"

    def pipeline(name, tp, pp, nodes):
        edits = [("  tp: 8\n", f"  tp: {tp}\n"), ("  pp: 1\n", f"  pp: {pp}\n")]
        edits.append(("nodes: 1}", f"nodes: {nodes}}}"))
        report = build_report(load_plan(variant(tmp_path, name, *edits, base=base)))
        phases = {p.name: p for p in report.phases}
        return phases["prefill.pipeline"].comm_s, phases["decode.pipeline"].comm_s, report

    nvlink = pipeline("near.yaml", 4, 2, 1)
    infiniband = pipeline("far.yaml", 8, 2, 2)
    deep = pipeline("deep.yaml", 4, 4, 2)
    for k in (0, 1):
        assert deep[k] == pytest.approx(2 * nvlink[k] + infiniband[k], rel=1e-12)
    assert infiniband[0] > 5 * nvlink[0]  # the links differ: the test can tell them apart
    # a review: the row shows each link's sends, not all seven at the costliest one's
    rows = {p.name: p for p in deep[2].phases}["prefill.pipeline"].collectives
    assert sorted((c.link, c.count) for c in rows) == [("infiniband", 1), ("nvlink", 2)]


def test_a_hand_written_serving_send_is_priced_on_each_pair_link(tmp_path):
    """An audit: a hand-written send of the serving pipeline (a replicated tensor on pp) was
    priced at the outermost link for every pair, where the built-in sends beside it run
    each on their own pair's. pp 4 x tp 4 over two DGX H100 nodes, a 1 GiB bf16 tensor
    (65,536 x 8,192) sent in the prefill's pipeline phase: one InfiniBand send and two
    NVLink ones, 3 µs + 2^30 B / B_nvlink each and 14 µs + 2^30 B / B_ib, so the time to
    first token grows by their sum (it grew by three InfiniBand sends)."""
    base = ROOT / "plans" / "llama3-70b-decode.yaml"
    edits = [("  tp: 8\n", "  tp: 4\n"), ("  pp: 1\n", "  pp: 4\n"), ("nodes: 1}", "nodes: 2}")]
    plain = build_report(load_plan(variant(tmp_path, "plain.yaml", *edits, base=base)))
    sent = (
        "\ntransitions:\n  - {name: XT, phase: prefill.pipeline, tensor: {shape: [65536, 8192],"
        " dtype: bf16}, group: pp, from: replicate, to: replicate}\n"
    )
    path = variant(tmp_path, "sent.yaml", *edits, base=base)
    path.write_text(path.read_text() + sent)
    report = build_report(load_plan(path))
    rows = {p.name: p for p in report.phases}["prefill.pipeline"].collectives
    xt = sorted((c.link, c.count, c.time_s) for c in rows if c.name == "XT")
    assert [(link, count) for link, count, _ in xt] == [("infiniband", 1), ("nvlink", 2)]
    topo = load_plan(path).topology
    nvlink, infiniband = (topo.levels[k] for k in (0, 1))
    size = 65536 * 8192 * 2
    assert xt[0][2] == pytest.approx(infiniband.latency + size / infiniband.bandwidth, rel=1e-9)
    assert xt[1][2] == pytest.approx(nvlink.latency + size / nvlink.bandwidth, rel=1e-9)
    added = report.step["ttft_s"] - plain.step["ttft_s"]
    assert added == pytest.approx(xt[0][2] + 2 * xt[1][2], rel=1e-6)


def test_eager_attention_over_context_parallel_ranks_is_refused_and_not_searched(tmp_path):
    """No stack runs context parallelism through unfused attention: Megatron-Core's
    DotProductAttention asserts context_parallel_size == 1 and Transformer Engine's
    get_attention_backend turns UnfusedDotProductAttention off under cp. Llama 3 70B with
    eager attention over cp 2 was priced (an audit: exit 0, "Fits", an eager scores buffer
    beside a K/V ring); it is refused where cp is written, with nothing on stdout, and a
    search of the eager model keeps cp 1 and says why."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from budget.search import Space, search

    base = ROOT / "plans" / "llama3-70b.yaml"
    eager = ("  attention: flash\n", "  attention: eager\n")
    cp2 = ("  dp: 16\n", "  dp: 8\n  cp: 2\n")
    path = variant(tmp_path, "eager-cp.yaml", eager, cp2, base=base)
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{path}:")
    assert ": error: $.parallel.cp: parallel.cp = 2 with model.attention: eager:" in line
    flash = variant(tmp_path, "flash-cp.yaml", cp2, base=base)
    assert build_report(load_plan(flash)).fits  # the fused kernel over the same cp is priced
    plan = load_plan(variant(tmp_path, "eager.yaml", eager, base=base))
    outcome = search(plan, 512, Space(tp=(8,), pp=(4,), micro=(1,), virtual_stages=(1,)))
    assert outcome.ruled_out["eager attention needs cp 1"]
    assert outcome.results and all(r.config.cp == 1 for r in outcome.results)


def test_fp8_parameters_under_zero_1_or_2_are_gathered_in_fp8(tmp_path):
    """The reverse of the test below (an audit, m313): fp8 parameters gathered in bf16 under
    ZeRO 1 were priced at 2 B a weight (90.8 ms a step on Llama 3 70B, where fp8's 1 B and
    the bf16 vocabulary take 42.9 + 5.5 ms) beside fp8 parameters and no bf16 copy to gather
    into. Megatron-LM gathers FP8 parameters in their own bytes, its parameter buffer uint8
    (``param_and_grad_buffer``): refused, and a search of that model drops ZeRO 1 and 2."""
    from typer.testing import CliRunner

    from budget.cli import app, route

    base = ROOT / "plans" / "llama3-70b.yaml"
    wider = (
        "  activations: bf16\n",
        "  activations: bf16\n  matmul: fp8\n  param_gather: bf16\n",
    )
    path = variant(tmp_path, "pg.yaml", wider, ("params: bf16", "params: fp8"), base=base)
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    said = " ".join(result.stderr.split())
    assert ": error: $.precision.param_gather: param_gather: bf16 under ZeRO 1 beside params: " in (
        said
    )
    assert "gathers fp8 parameters as they are (a uint8 buffer)" in said
    # the same plan with the gather left out follows params: fp8, and loads
    plain = ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n")
    kept = variant(tmp_path, "kept.yaml", plain, ("params: bf16", "params: fp8"), base=base)
    assert load_plan(kept).precision.param_gather == "fp8"
    from budget.search import Space, search

    zero3 = variant(
        tmp_path,
        "z3.yaml",
        wider,
        ("params: bf16", "params: fp8"),
        ("  zero: 1\n", "  zero: 3\n"),
        ("pp: 4", "pp: 1"),
        ("dp: 16", "dp: 64"),
        base=base,
    )
    swept = search(load_plan(zero3), 512, Space(tp=(8,), pp=(1,), micro=(1,), virtual_stages=(1,)))
    rule = "ZeRO 1 or 2 gathering fp8 beside wider parameters, or fp8 parameters wider"
    assert swept.rejected[rule]
    assert swept.results and all(r.config.zero not in (1, 2) for r in swept.results)


def test_an_fp8_parameter_gather_under_zero_1_or_2_needs_fp8_parameters(tmp_path):
    """An audit (m228): ZeRO 1 and 2 refresh each rank's parameters by their all-gather, so
    an fp8 gather leaves fp8 parameters: Megatron-LM's --fp8-param-gather builds Transformer
    Engine's weights as FP8 tensors (``fp8_model_init``) with no 16-bit copy. Llama 3 70B
    with bf16 parameters and an fp8 gather was priced with both, 2 B a GEMM weight more:
    2 x 2,139,095,040 = 4,278,190,080 B a rank on its first stage. It is refused, told to
    write params: fp8, which prices 1 B a weight and its 1 B transpose beside the bf16
    vocabulary and norms: 4,541,513,728 B. Under ZeRO 3 (FSDP2's float8 all-gather casts
    wider parameters to fp8 for the gather) it loads."""
    from typer.testing import CliRunner

    from budget.cli import app, route

    base = ROOT / "plans" / "llama3-70b.yaml"
    gather = ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n  param_gather: fp8\n")
    path = variant(tmp_path, "pg.yaml", gather, base=base)
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    assert ": error: $.precision.param_gather: param_gather: fp8 under ZeRO 1 beside params: " in (
        result.stderr
    )
    assert "write params: fp8 with it" in result.stderr
    fp8 = load_plan(
        variant(tmp_path, "fp8.yaml", gather, ("params: bf16", "params: fp8"), base=base)
    )
    (first, *_) = to_dict(build_report(fp8))["memory"]["stages"]
    assert first["params_bytes"] == 2 * 2_139_095_040 + 262_668_288 + 655_360 == 4_541_513_728
    # and a sweep of the refused plan's model keeps ZeRO 1 and 2 out of it, saying why
    from budget.search import Space, search

    swept = search(
        load_plan(
            variant(
                tmp_path,
                "swept.yaml",
                gather,
                ("  zero: 1\n", "  zero: 3\n"),
                ("pp: 4", "pp: 1"),
                ("dp: 16", "dp: 64"),
                base=base,
            )
        ),
        512,
        Space(tp=(8,), pp=(1,), micro=(1,), virtual_stages=(1,)),
    )
    rule = "ZeRO 1 or 2 gathering fp8 beside wider parameters, or fp8 parameters wider"
    assert swept.rejected[rule] and swept.results
    assert all(r.config.zero == 3 for r in swept.results)
    zero3 = variant(
        tmp_path,
        "z3.yaml",
        gather,
        ("  zero: 1\n", "  zero: 3\n"),
        ("pp: 4", "pp: 1"),
        ("dp: 16", "dp: 64"),
        base=base,
    )
    assert load_plan(zero3).precision.param_gather == "fp8"


def test_fp8_backward_holds_the_column_parallel_output_gradients_quantized(tmp_path):
    """An audit (m228): Transformer Engine's ``_LayerNormLinear.backward`` quantizes its
    output gradient row- and column-wise (``grad_output_preprocess``) and reads it in its
    data- and then its weight-gradient GEMM, beside the bf16 one. Llama 3 70B at tp 8 in
    FP8 on Hopper (1 B an element and 1 B its transpose), 8,192 tokens: fc1's output
    gradient 8,192 x 2 x 28,672 / 8 x 2 B = 117,440,512 B, QKV's 8,192 x (8,192 + 2 x
    1,024) / 8 x 2 B = 20,971,520 B; the first stage peaks at fc1's backward, which holds
    it. None in bf16."""
    base = ROOT / "plans" / "llama3-70b.yaml"
    fp8 = ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n")
    plan = load_plan(variant(tmp_path, "fp8.yaml", fp8, base=base))
    (stage, *_) = derive(plan).stages
    phases = {p.name: p for p in stage.phases}

    def held(phase: str, label: str) -> dict[str, int]:
        (instant,) = [i for i in phases[phase].instants if i.label == label]
        return {a.name: a.total for a in instant.live if "(FP8" in a.name}

    fc1 = "fc1 output gradient (FP8, and its transpose)"
    qkv = "QKV output gradient (FP8, and its transpose)"
    assert held("backward.mlp", "fc1 weight and input gradients") == {fc1: 117_440_512}
    assert held("backward.attention", "QKV weight and input gradients") == {qkv: 20_971_520}
    assert held("backward.mlp", "activation gradients") == {}
    (row, *_) = to_dict(build_report(plan))["memory"]["stages"]
    assert (row["peak_phase"], row["peak_instant"]) == (
        "backward.mlp",
        "fc1 weight and input gradients",
    )
    bf16 = load_plan(base)
    (plain, *_) = derive(bf16).stages
    assert not [a for p in plain.phases for i in p.instants for a in i.live if "FP8" in a.name]


def test_fp8_backward_without_sequence_parallelism_holds_fc2s_output_gradient_quantized(
    tmp_path,
):
    """A row-parallel layer quantizes its output gradient too (TransformerEngine 2.x
    ``_Linear.backward``: ``set_usage(rowwise=True, columnwise=True)`` and
    ``grad_output_preprocess``); with sequence parallelism the gathered FP8 gradient is it,
    without, nothing was counted (an audit, m429). Llama 3 70B at tp 8 without sequence
    parallelism, FP8 on Hopper, 8,192 tokens a micro-batch: 8,192 x 8,192 x (1 + 1) B =
    134,217,728 B at fc2's backward, where with it the all-gathered one stands instead."""
    base = ROOT / "plans" / "llama3-70b.yaml"
    fp8 = ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n")
    label = "fc2 output gradient (FP8, and its transpose)"
    for sp, held in (("false", {label: 134_217_728}), ("true", {})):
        plan = load_plan(
            variant(
                tmp_path,
                f"sp-{sp}.yaml",
                fp8,
                ("sequence_parallel: true", f"sequence_parallel: {sp}"),
                base=base,
            )
        )
        (stage, *_) = derive(plan).stages
        (backward,) = [p for p in stage.phases if p.name == "backward.mlp"]
        (instant,) = [i for i in backward.instants if i.label == "fc2 gradients"]
        assert {a.name: a.total for a in instant.live if a.name == label} == held
        gathered = [a for a in instant.live if a.name.startswith("output gradient (all-gath")]
        assert len(gathered) == (sp == "true")


def test_eager_serving_holds_megatron_cores_scores_thrice_and_repeated_keys_and_values(
    tmp_path: Path,
) -> None:
    """Serving under eager attention holds what Megatron-Core's unfused
    ``DotProductAttention.forward`` holds at its softmax: the scores' input buffer (kept for
    the run at the largest call's size, the prefill's), the raw scores ``baddbmm`` returns
    and the probabilities, and K and V repeated from 8 key/value heads to the 64 query heads
    (8 of each per rank at tp 8). An audit: one copy of the scores was counted, and the
    shipped decode plan's prefill read 29,888,102,400 B where it holds 34,451,505,152."""
    base = ROOT / "plans" / "llama3-70b-decode.yaml"
    eager = variant(tmp_path, "eager.yaml", ("attention: flash", "attention: eager"), base=base)
    held = {}
    for name, path in (("flash", base), ("eager", eager)):
        phases = derive(load_plan(path)).stages[0].phases
        held[name] = {
            (p.name, i.label): i
            for p in phases
            if p.name.endswith(".attention")
            for i in p.instants
        }
    prompt, context, sequences, heads, width = 2048, 2560, 32, 64 // 8, 128
    scores = 2 * sequences * heads * prompt * prompt  # bf16, this rank's heads
    assert scores == 2_147_483_648
    for phase, rows, keys in (("prefill", prompt, prompt), ("decode", 1, context)):
        eager_at, flash_at = (
            held["eager"][f"{phase}.attention", "attention"],
            held["flash"][f"{phase}.attention", "attention"],
        )
        sizes = {a.name: a.total for a in eager_at.live}
        working = 2 * sequences * heads * rows * keys
        repeated = 2 * sequences * keys * heads * width
        assert sizes["attention scores buffer (Megatron-LM's, held through the run)"] == scores
        assert sizes["attention scores QKᵀ (working)"] == working
        assert sizes["attention probabilities"] == working
        assert sizes["keys repeated to the query heads"] == repeated
        assert sizes["values repeated to the query heads"] == repeated
        assert eager_at.total == flash_at.total + scores + 2 * working + 2 * repeated
    report = to_dict(build_report(load_plan(eager)))
    assert report["memory"]["peak_bytes"] == 29_888_102_400 + 2 * scores + 2 * 134_217_728
    assert report["memory"]["peak_bytes"] == 34_451_505_152


def test_expert_overlap_beside_a_pipeline_needs_virtual_stages(tmp_path: Path) -> None:
    """Megatron-Core pairs expert all-to-alls across micro-batches only in its combined
    schedules, and asserts "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size
    must be specified when pipeline_model_parallel_size > 1" (TransformerConfig
    .__post_init__). An audit: Mixtral as shipped (pp 4, 1F1B) with overlap.ep read 2.88 s
    a step where it can only run at 3.24 s, and the search ranked that layout first."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from budget.search import Space, search

    shipped = PLANS / "mixtral-8x7b.yaml"
    text = shipped.read_text(encoding="utf-8") + "overlap: {ep: true}\n"
    plain = tmp_path / "overlap.yaml"
    plain.write_text(text, encoding="utf-8")
    out = CliRunner().invoke(app, route([str(plain)]))
    assert out.exit_code == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"{plain}:") and ": error: $.overlap.ep: overlap.ep over pp = 4" in line
    virtual = tmp_path / "virtual.yaml"
    pipe = "  pp: 4\n  pipeline: {schedule: interleaved, virtual_stages: 2}\n"
    virtual.write_text(text.replace("  pp: 4\n", pipe), encoding="utf-8")
    plan = load_plan(virtual)
    assert plan.overlap.ep and plan.parallel.pp == 4
    outcome = search(plan, 64, Space(pp=(1, 4), virtual_stages=(1, 2)), keep=1000)
    assert outcome.rejected["overlap.ep over a pipeline needs virtual stages"] > 0
    shown = [r.config for r in outcome.results]
    assert shown and all(c.pp == 1 or c.virtual_stages > 1 for c in shown)
    assert any(c.pp == 4 for c in shown)


def test_expert_overlap_beside_full_recompute_is_refused(tmp_path: Path) -> None:
    """Under full recompute Megatron-Core's expert overlap recomputes each model chunk whole
    at the start of its backward, every layer's activations alive at once ("EP A2A overlap
    drives its own VPP-stage full recompute"; earlier versions refuse the pair), which
    budget, recomputing a layer at a time, does not price (a review: Mixtral at pp 1 read a
    33.6 GiB peak where the rebuild holds about 15 GiB more). Refused, and the search of an
    overlap.ep plan leaves full recompute out."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from budget.search import Space, search

    shipped = (PLANS / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    pipe = "  pp: 4\n  pipeline: {schedule: interleaved, virtual_stages: 2}\n"
    text = shipped.replace("  pp: 4\n", pipe) + "overlap: {ep: true}\n"
    path = tmp_path / "full.yaml"
    path.write_text(text.replace("recompute: selective", "recompute: full"), encoding="utf-8")
    out = CliRunner().invoke(app, route([str(path)]))
    assert out.exit_code == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert ": error: $.overlap.ep: overlap.ep with recompute: full: " in line
    path.write_text(text, encoding="utf-8")
    plan = load_plan(path)
    swept = search(plan, 256, Space(pp=(4,), virtual_stages=(2,), micro=(1,)), keep=1000)
    assert swept.rejected["overlap.ep beside full recompute"] > 0
    assert swept.results and all(r.config.recompute != "full" for r in swept.results)


def test_fp8_parameters_in_training_need_zero(tmp_path):
    """Megatron-LM's --fp8-param-gather, which fp8 training parameters are, asserts its
    distributed optimizer ("--fp8-param-gather only supported with distributed optimizer"):
    at ZeRO 0 a run keeps bf16 parameters beside Transformer Engine's fp8 copies. An audit
    (m252): Llama 3 70B with fp8 parameters at ZeRO 0 was priced 3.98 GiB a rank under that.
    Refused, the search leaves ZeRO 0 out for such a model, and serving keeps fp8 weights."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from budget.search import Space, search

    base = ROOT / "plans" / "llama3-70b.yaml"
    fp8 = ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n")
    params = ("params: bf16", "params: fp8")
    path = variant(tmp_path, "z0.yaml", fp8, params, ("  zero: 1\n", "  zero: 0\n"), base=base)
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert ": error: $.precision.params: params: fp8 in training is Megatron-LM's " in line
    assert "write parallel.zero: 1" in line
    plan = load_plan(variant(tmp_path, "z1.yaml", fp8, params, base=base))
    swept = search(plan, 512, Space(tp=(8,), pp=(4,), micro=(1,), virtual_stages=(1,)))
    assert swept.rejected[
        "fp8 parameters need ZeRO (--fp8-param-gather needs the distributed optimizer)"
    ]
    assert swept.results and all(r.config.zero > 0 for r in swept.results)
    decode = load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    served = variant(
        tmp_path,
        "serve.yaml",
        ("params: bf16", "params: fp8"),
        base=ROOT / "plans" / "llama3-70b-decode.yaml",
    )
    assert decode.parallel.zero == 0 and load_plan(served).precision.params == "fp8"


def test_an_expert_grid_megatron_does_not_build_under_the_order_is_refused(tmp_path):
    """Megatron-Core numbers the expert ranks (etp, ep, edp, pp; cp 1) over the plan's order
    as it numbers the dense ones (tp, cp, dp, pp; ep 1), and refuses the grid unless their pp
    groups agree and, with pp not last, edp = dp (``initialize_model_parallel``). Mixtral's tp
    2, pp 4, dp 8, ep 8 (etp = tp = 2, edp = 16 / 16 = 1) under tp, cp, ep, pp, dp (the
    --use-tp-pp-dp-mapping order): a pp group is every rank tp·cp = 2 apart in the dense
    grid and etp·ep = 16 apart in the expert one, and edp 1 ≠ dp 8. It was folded inside
    each stage and priced (an audit). At ep 2, etp 1 (strides 2 and 2, edp 16 / 2 = 8 = dp)
    Megatron builds it, and so does budget; pp last, every grid is built."""
    from tests.test_transitions import _run

    mapping = ("order: [tp, cp, ep, dp, pp]", "order: [tp, cp, ep, pp, dp]")
    mixtral = ROOT / "plans" / "mixtral-8x7b.yaml"
    refused = variant(tmp_path, "refused.yaml", mapping, base=mixtral)
    code, out, err = _run(str(refused))
    assert (code, out) == (2, "")
    assert err.count("error:") == 1
    assert (
        "error: $.parallel.order: Megatron-Core does not build this expert grid under "
        "parallel.order [tp, cp, ep, pp, dp]: numbered in that order, its expert ranks (etp 2 × "
        "ep 8 × edp 1 × pp 4) and its dense ranks (tp 2 × cp 1 × dp 8 × pp 4) fall into "
        "different pipeline groups and have data-parallel sizes 1 and 8 with pp not last; put "
        "pp last in the order (Megatron's default) or use pp 1"
    ) in " ".join(err.split())
    built = variant(
        tmp_path, "built.yaml", mapping, ("  ep: 8\n", "  ep: 2\n  etp: 1\n"), base=mixtral
    )
    assert load_plan(built).parallel.order == ("tp", "cp", "ep", "pp", "dp")
    # a serving plan is not Megatron-Core's training grid: vLLM numbers tp, pp, dp, its
    # expert group a stage's dp x tp ranks (etp 1, ep 8 over tp 4 x dp 2, edp 1; a review)
    serving = tmp_path / "serving.yaml"
    serving.write_text(
        MIXTRAL_SERVING.replace(
            "parallel: {tp: 8}",
            "parallel: {tp: 4, pp: 2, dp: 2, ep: 8, etp: 1, sequence_parallel: true,\n"
            "  order: [tp, cp, ep, pp, dp]}",
        ).replace("nodes: 1", "nodes: 2"),
        encoding="utf-8",
    )
    assert load_plan(serving).parallel.ep == 8
    # and a search over that order ranks no layout the plan loader refuses (its own rule)
    code, out, _ = _run("search", str(refused), "--gpus", "64", "-f", "json", "--top", "200")
    import json

    found = json.loads(out)
    assert found["rejected"]["expert grid Megatron-Core does not build under parallel.order"]
    from budget.plan.model import unlaunchable_expert_grid

    assert len(found["results"]) == 200
    for row in found["results"]:
        c = row["config"]
        etp = c.get("etp") or c["tp"]
        order = ("tp", "cp", "ep", "pp", "dp")
        assert not unlaunchable_expert_grid(order, c["tp"], c["cp"], c["dp"], c["pp"], c["ep"], etp)


def test_each_stage_pairs_the_expert_all_to_alls_its_schedule_pairs(tmp_path):
    """Under overlap.ep the interleaved schedule's stages run different warm-ups, so stage r
    of pp 4 at v 2 leaves 2(3 − r) + 4 + 1 of its 64 chunk passes unpaired: 11, 9, 7 and 5
    (an audit, m457: every stage had read 1F1B's 4 of 32), each stage timed apart, and the
    search prices every layout as its report does."""
    from budget.search import Space, _Counts, apply, candidates, evaluate, structure

    plan = _mixtral_overlapped(tmp_path)
    from budget.schedule import step_time

    times = step_time(plan, derive(plan))
    shares = []
    for stage in times.stages:
        (moe,) = [p for p in stage.phases if p.name == "forward.moe"]
        (dispatch,) = [t for t in moe.moves if t.move.name == "MoE dispatch"]
        shares.append(dispatch.move.floor)
    assert shares == [pytest.approx(w / 64, rel=1e-12) for w in (11, 9, 7, 5)]
    gpus = plan.topology.gpus
    space = Space(micro=(1,), zero=(1,), recompute=("selective",), virtual_stages=(2,))
    cols = candidates(plan, gpus, space, _Counts())
    groups: dict[tuple[int, ...], list] = {}
    for key, config in zip(map(tuple, structure(plan, cols).tolist()), cols.configs(), strict=True):
        if config.pp > 1 and config.ep > 1:
            groups.setdefault(key, []).append(config)
    assert len(groups) >= 2
    for group in groups.values():
        for result in evaluate(plan, group[:: max(1, len(group) // 3)][:3], gpus):
            report = build_report(apply(plan, result.config, gpus))
            assert report.step["time_s"] == pytest.approx(result.step_time_s, rel=1e-9)
            assert report.worst.peak_bytes == result.peak_bytes


def test_one_sequence_over_experts_inside_tp_reads_the_experts_one_token_reaches(tmp_path):
    """Mixtral decoding one sequence at tp 4 = ep 4 (etp 1): the token's two picks over four
    ranks of two experts each are half a row a rank, which the GEMM rounds to one; the
    experts read come from the one token, not from two (an audit, m467: 1.56 experts a rank
    read, where the busiest reads 1 + 1/7 = 1.14 and `most_reached` of one token 1.13; the
    time per token 23 % long). Expert fc1's weights: 4,096 x 2 x 14,336 x 2 B an expert."""
    from budget.flops import most_reached

    path = tmp_path / "one.yaml"
    path.write_text(
        "name: one\nmode: decode\nmodel: {preset: mixtral-8x7b}\n"
        "batch: {sequences: 1, prompt: 512, generate: 32}\n"
        "precision: {params: bf16, activations: bf16}\n"
        "parallel: {tp: 4, pp: 2, dp: 1, ep: 4, etp: 1}\n"
        "device: {preset: h100-sxm, reserved: 4 GiB}\ntopology: {preset: dgx-h100, nodes: 1}\n",
        encoding="utf-8",
    )
    plan = load_plan(path)
    (phase, *_) = [p for p in derive(plan).stages[0].phases if p.name == "decode.moe"]
    (fc1,) = [w for w in phase.works if w.name == "expert fc1"]
    weights = 4096 * 2 * 14336 * 2
    reached = most_reached(2, 1 - (1 - 2 / 8) ** 1, 4)
    assert 1.12 < reached < 1.14
    activations = 2 * (1 * 4096 + 1 * 2 * 14336)  # the one rounded row in and out
    assert fc1.bytes == pytest.approx(reached * weights + activations, rel=1e-6)


@pytest.mark.parametrize("kind", ["ring", "allgather"])
def test_a_context_parallel_prefill_holds_its_attentions_buffers(tmp_path, kind):
    """Transformer Engine's context-parallel forward keeps what it keeps in training
    whatever is_training says (an audit, m491: a prefill's instants held none of it, 4.6 GiB
    of a 1M-token prefill at cp 16). The shipped decode plan at cp 2 over two nodes: a rank
    prefills 32 sequences x 1,024 tokens = 32,768 rows, one K/V head of 128 and 8 query
    heads of 128 at tp 8. The ring keeps cp received K/V chunks, 2 x 32,768 x 256 x 2 B =
    32 MiB, cp step outputs, 2 x 32,768 x 1,024 x 2 B = 128 MiB, and their fp32 statistics,
    2 x 32,768 x 8 x 4 B = 2 MiB; all-gathered, the whole sequence's K and V, 65,536 x 256 x
    2 B = 32 MiB, and before the core the reorder copy of one of them, 16 MiB."""
    plan = variant(
        tmp_path,
        f"cp-{kind}.yaml",
        ("  tp: 8", f"  tp: 8\n  cp: 2\n  cp_attention: {kind}"),
        ("nodes: 1}", "nodes: 2}"),
        base=DECODE,
    )
    (stage,) = derive(load_plan(plan)).stages
    (phase,) = [p for p in stage.phases if p.name == "prefill.attention"]
    held = {i.label: {a.name: a.total for a in i.live} for i in phase.instants}
    attention = held["attention"]
    if kind == "ring":
        assert attention["K/V ring buffers (one per cp rank)"] == 2 * 32_768 * 256 * 2
        assert attention["ring step outputs (one per cp rank)"] == 2 * 32_768 * 1024 * 2
        assert attention["ring step softmax statistics (fp32)"] == 2 * 32_768 * 8 * 4
        assert "K/V reordered for the core" not in held
    else:
        assert attention["K/V all-gathered"] == 65_536 * 256 * 2
        reordered = held["K/V reordered for the core"]
        assert reordered["K or V reordered (index_select's copy)"] == 65_536 * 128 * 2


def test_a_serving_pipeline_says_it_does_not_raise_tokens_per_second(tmp_path):
    """A serving pass crosses the stages in turn, each idle while the others run: the
    report's summary says so where pp > 1 (an audit, m546: nothing said what a serving
    pipeline adds, and tp 4 x pp 2 read 1,554 tokens/s against tp 8's 1,827 unexplained),
    and says nothing of it at pp 1."""
    from budget.render.table import summary

    base = ROOT / "plans" / "llama3-70b-decode.yaml"
    piped = variant(tmp_path, "piped.yaml", ("  tp: 8\n  pp: 1\n", "  tp: 4\n  pp: 2\n"), base=base)
    said = " ".join(summary(build_report(load_plan(piped))))
    assert "Pipeline: the batch crosses the 2 stages in turn, each idle while the others run" in (
        said
    )
    assert "so pp spreads the weights and the cache over more GPUs but does not raise" in said
    assert "Pipeline:" not in " ".join(summary(build_report(load_plan(base))))
