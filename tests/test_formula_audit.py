"""Formulas an audit checked against their sources, each against a hand calculation shown
here or a published figure."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from budget.flops import attention_pair_flops, attention_query_flops
from budget.layers import (
    active_params,
    expert_capacity,
    layer_params,
    params_total,
    shapes,
    stage_chunk_ids,
)
from budget.plan.load import load_plan
from budget.plan.resolve import resolve
from budget.plan.yaml_load import Marks
from tests.builders import GPT3, make_plan
from tests.plan_files import ROOT

MIXTRAL = ROOT / "plans" / "mixtral-8x7b.yaml"


def _gpt_oss(ep: int, etp: int):
    tree = {
        "mode": "train",
        "model": {"preset": "gpt-oss-120b"},
        "batch": {"seq": 4096, "micro": 1, "global": 64},
        "parallel": {"tp": 2, "sequence_parallel": True, "dp": 8, "ep": ep, "etp": etp},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 2},
    }
    return resolve(tree, Marks(), "plan.yaml")


def test_an_experts_fc2_bias_stays_whole_over_etp():
    """gpt-oss-120b (hidden 2880, expert ffn 2880, SwiGLU, biased experts) at ep 8, etp 2.
    One expert: fc1 (gate and up) 2 × 2880 × 2880 weights and 2 × 2880 biases, fc2 2880 ×
    2880 weights, all split over etp: 3 × 8,294,400 + 5,760 = 24,888,960; fc2's bias, 2,880,
    whole on each etp rank (Megatron-Core's TERowParallelGroupedLinear shards its weights
    along axis 1, not its bias). 128 / 8 = 16 experts a rank × (⌈24,888,960 / 2⌉ + 2,880) =
    16 × 12,447,360 = 199,157,760; dividing the bias too gave 16 × ⌈24,891,840 / 2⌉ =
    199,134,720."""
    h = w = 2880
    split = 2 * h * w + 2 * w + w * h  # fc1's two matrices and their biases, fc2's matrix
    assert split == 3 * 8_294_400 + 5_760 == 24_888_960
    x = layer_params(_gpt_oss(ep=8, etp=2), moe=True)
    assert x.expert_total == 128 * (split + h)
    assert x.expert_per_rank == 16 * (-(-split // 2) + h) == 16 * 12_447_360 == 199_157_760
    # at etp 1 nothing is split and the two counts agree
    assert layer_params(_gpt_oss(ep=8, etp=1), moe=True).expert_per_rank == 16 * (split + h)


def _mixtral(seq: int = 4096, **experts):
    plan = load_plan(MIXTRAL)
    e = replace(plan.model.experts, **experts)
    return replace(plan, model=replace(plan.model, experts=e), batch=replace(plan.batch, seq=seq))


def test_a_padded_capacity_rounds_up_per_expert():
    """Megatron-Core's get_capacity(num_tokens=num_tokens·topk, num_experts, c) =
    ⌈tokens·k/E·c⌉ rows an expert takes from a rank. Mixtral 8x7B as shipped (tp 2 with
    sequence parallelism, sequence 4096): 2,048 tokens a rank, top 2, 8 experts, c = 1.1,
    padded: 2,048 × 2 / 8 × 1.1 = 563.2, so 564 an expert and 8 × 564 = 4,512 rows sent
    and received (each of the 8 ep ranks sends this rank's one expert 564); rounding the
    whole rank's 4,505.6 up gave 4,506."""
    plan = _mixtral(capacity_factor=1.1, pad_to_capacity=True)
    assert plan.parallel.ep == 8 and plan.model.experts.count == 8
    s = shapes(plan)
    assert (s.sent, s.dispatched) == (8 * 564, 8 * 564) == (4512, 4512)
    assert s.routed == 2 * 4512  # all-gathered over etp 2, as dropless rows are


def test_a_whole_capacity_stays_whole():
    """3,000 tokens a rank (sequence 6,000 over tp 2) × top 2 = 6,000 rows; 6,000 / 8 × 1.1
    = 825 exactly, 8 × 825 = 6,600 rows. In floats 6,000 × 1.1 = 6,600.000000000001, whose
    ceiling, 6,601, the budget gave; with c taken as 11/10 the ceiling is exact."""
    assert 6000 * 1.1 > 6600 and math.ceil(6000 * 1.1) == 6601  # the float trap
    assert expert_capacity(3000, 2, 8, 1.1) == 825
    s = shapes(_mixtral(seq=6000, capacity_factor=1.1, pad_to_capacity=True))
    assert (s.sent, s.dispatched) == (6600, 6600)


def test_dropping_caps_a_rank_at_every_experts_capacity():
    """Without padding a capacity under the even share drops rows at each expert's
    capacity: Mixtral, 2,048 tokens a rank, top 2, c = 0.9: ⌈2,048 × 2 / 8 × 0.9⌉ =
    ⌈460.8⌉ = 461 an expert, 8 × 461 = 3,688 rows (⌈3,686.4⌉ = 3,687 rounded whole).
    Above the even share nothing is dropped: 4,096 rows; a skew of 1.5 at c = 1.1 fills the
    busiest rank's expert to its capacity from every rank: min(6,144, 8 × 564) = 4,512."""
    s = shapes(_mixtral(capacity_factor=0.9))
    assert (s.sent, s.dispatched) == (8 * 461, 8 * 461) == (3688, 3688)
    assert shapes(_mixtral(capacity_factor=1.1)).dispatched == 2048 * 2
    skewed = shapes(_mixtral(capacity_factor=1.1, imbalance=1.5))
    assert (skewed.sent, skewed.dispatched) == (4096, 4512)
    assert shapes(_mixtral(capacity_factor=1.1, imbalance=1.05)).dispatched == math.ceil(
        4096 * 1.05
    )  # under the cap: the skew's rows, 4,300.8 up to 4,301


def test_capacity_takes_a_sweeps_arrays():
    """`budget.search` passes token counts as arrays: element by element the same rows."""
    tokens = np.array([2048, 3000, 1])
    assert expert_capacity(tokens, 2, 8, 1.1).tolist() == [564, 825, 1]
    assert expert_capacity(tokens, 2, 8, 0.9).tolist() == [461, 675, 1]


def test_params_total_is_narayanans_count_plus_the_final_norm():
    """Narayanan et al., arXiv 2104.04473, section 5.1: P = 12·l·h²·(1 + 13/(12·h) + (V +
    s)/(12·l·h)) for a GPT with biases, LayerNorm, a 4h MLP, a tied embedding and learned
    positions; their Table 1 gives 174.6 B for GPT-3 (l 96, h 12,288, V 51,200, s 2,048):
    12·96·12,288² = 173,946,175,488, 13·96·12,288 = 15,335,424, (51,200 + 2,048)·12,288 =
    654,311,424, in all 174,615,822,336. The budget also counts the final LayerNorm, 2h =
    24,576, which that formula leaves out: 174,615,846,912."""
    plan = make_plan(GPT3, bias=True, position="learned")
    layers, h, v, s = 96, 12288, 51200, 2048
    narayanan = 12 * layers * h * h + 13 * layers * h + (v + s) * h
    assert narayanan == 174_615_822_336 and round(narayanan / 1e8) == 1746
    assert params_total(plan) == narayanan + 2 * h == 174_615_846_912


def test_active_params_are_mixtrals_47b_and_13b():
    """Jiang et al., arXiv 2401.04088, abstract: Mixtral 8x7B has 47B parameters, 13B of
    them active per token. By hand, per layer: q and o 4,096², k and v 4,096 × 1,024
    (41,943,040), the router 4,096 × 8 (32,768), two RMSNorms (8,192) and 8 experts of
    3 × 4,096 × 14,336 = 176,160,768; 32 layers, untied embedding and output 2 × 32,000 ×
    4,096 and the final norm: 46,702,792,704. A token skips 6 experts a layer: 46,702,792,704
    − 32 × 6 × 176,160,768 = 12,879,925,248."""
    plan = load_plan(MIXTRAL)
    expert = 3 * 4096 * 14336
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096 + 8 * expert
    total = 32 * layer + 2 * 32000 * 4096 + 4096
    assert params_total(plan) == total == 46_702_792_704
    assert active_params(plan) == total - 32 * 6 * expert == 12_879_925_248
    assert (round(total / 1e9), round(active_params(plan) / 1e9)) == (47, 13)


def test_a_split_per_stage_under_virtual_stages_is_refused():
    """`resolve` needs pp·v entries in layers_per_stage; a plan built in code with one entry
    a stage under v = 2 was cut into chunks by floor division, losing layers % v a stage
    (GPT-3's 96 layers as 7 stages of 11 and one of 19: chunks of 5 and 9, 88 layers, one
    lost on every stage). It is refused."""
    plan = make_plan(GPT3, pp=8, schedule="interleaved", virtual_stages=2)
    sizes = (11,) * 7 + (19,)
    pipeline = replace(plan.parallel.pipeline, layers_per_stage=sizes)
    bad = replace(plan, parallel=replace(plan.parallel, pipeline=pipeline))
    with pytest.raises(ValueError, match=r"8 entries but pp × virtual_stages = 8 × 2 = 16"):
        stage_chunk_ids(bad)
    good = replace(pipeline, layers_per_stage=(6,) * 16)
    chunks = stage_chunk_ids(replace(plan, parallel=replace(plan.parallel, pipeline=good)))
    assert sum(len(c) for stage in chunks for c in stage) == 96


def test_a_query_key_pair_is_palms_attention_term():
    """PaLM's MFU counts 12·L·H·Q·T FLOPs a trained token over T keys (Chowdhery et al.,
    arXiv 2204.02311, appendix B), forward and backward: one pair's forward is a third of
    12·L·H·Q. GPT-3 175B (L 96, H 96, Q 128): 12 · 96 · 96 · 128 = 14,155,776 trained,
    4,718,592 forward (2 · 96 · 96 · (128 + 128))."""
    assert attention_pair_flops(GPT3) == 4_718_592
    assert 3 * attention_pair_flops(GPT3) == 12 * 96 * 96 * 128


def test_a_prefill_query_meets_its_own_key():
    """Query i of a causal prompt meets keys 1 ... i, as decode's pass k meets P + k: for
    P = 4, 1 + 2 + 3 + 4 = 10 keys, 2.5 a query, (P + 1)/2. `attention_query_flops(m,
    first, last)` averages the keys from `first` to `last`."""
    m = GPT3
    pair = attention_pair_flops(m)
    assert attention_query_flops(m, 1, 4) * 4 == pytest.approx(pair * 10, rel=1e-15)
    assert attention_query_flops(m, 1, 2048) == pytest.approx(pair * 1024.5, rel=1e-15)
