"""The step's parameters, model states and saved activations against published figures."""

from __future__ import annotations

import pytest

from budget.layers import (
    attention_saved,
    layer_params,
    layer_saved,
    mlp_saved,
    params_total,
    resident_states,
    shapes,
    stage_params,
)
from budget.pipeline import build_report
from budget.plan.model import Precision
from budget.step import derive, inflight
from tests.builders import make_plan

# ZeRO's setting (Rajbhandari et al., arXiv 1910.02054, section 5.1): fp16 parameters and
# gradients, mixed-precision Adam keeping an fp32 master copy, momentum and variance: K = 12.
ZERO_PRECISION = Precision(params="fp16", grads="fp16", master="fp32", optimizer="adam")


def _states(plan, params):
    return sum(a.total for a in resident_states(plan, params) if a.category != "reserved")


@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    [(0, 120.0), (1, 31.40625), (2, 16.640625), (3, 1.875)],
)
def test_zero_table1_for_7_5b_parameters_on_64_ranks(zero, expected_gb):
    """ZeRO Table 1 / Figure 1: Ψ = 7.5B, Nd = 64, K = 12 (GB = 1e9 bytes)."""
    plan = make_plan(tp=1, pp=1, dp=64, zero=zero, precision=ZERO_PRECISION)
    assert _states(plan, 7_500_000_000) == expected_gb * 1e9


@pytest.mark.parametrize("dp", [1, 2, 8, 64, 1024])
def test_zero_table1_formulas_hold_at_any_dp(dp):
    """16Ψ, 4Ψ + 12Ψ/Nd, 2Ψ + 14Ψ/Nd and 16Ψ/Nd for the model's own Ψ."""
    psi = 1024 * 1024 * 3 * 5  # divisible by every dp above
    expected = {
        0: 16 * psi,
        1: 4 * psi + 12 * psi // dp,
        2: 2 * psi + 14 * psi // dp,
        3: 16 * psi // dp,
    }
    for zero, value in expected.items():
        plan = make_plan(tp=1, pp=1, dp=dp, zero=zero, precision=ZERO_PRECISION)
        assert _states(plan, psi) == value


def test_megatron_weight_and_optimizer_memory_gpt3_first_stage():
    """Megatron-LM's theoretical memory (megatron/training/theoretical_memory_usage.py):
    18 bytes per parameter, 6 + 12/DP with the distributed optimizer. GPT-3 175B at TP 8,
    PP 8, DP 16, first stage, LayerNorm with bias, no linear biases, tied embeddings, no
    position parameters: 50,348,611,584 B and 18,880,729,344 B (issue 2, acceptance 4).

    Megatron's formula spreads the final LayerNorm (2h) over the pp stages, 2·12288 / 8 =
    3,072 parameters on the first stage that hold no final norm here: the stage holds
    12 layers of 12h²/8 + 4h (two LayerNorms with bias, replicated over tp) and the
    vocabulary shard V·h/8, exactly, and differs from Megatron's figure by 3,072 parameters'
    bytes and nothing else."""
    h, vocab = 12288, 51200
    params = 12 * (12 * h * h // 8 + 4 * h) + vocab * h // 8
    for zero, per_param, megatron in ((0, 18, 50_348_611_584), (1, 6 + 12 / 16, 18_880_729_344)):
        plan = make_plan(zero=zero)
        per_rank = stage_params(plan, 0).per_rank
        assert per_rank == params
        assert _states(plan, per_rank) == per_param * params
        assert megatron - _states(plan, per_rank) == per_param * 2 * h // 8


def test_gpt3_parameter_count():
    """175B: 96 layers of 12h² + 13h (with biases) plus the embeddings; Brown et al. quote
    175.0B. Without linear biases and positions it is 12·96·h² + 4·96·h + 2h + vh."""
    h = 12288
    expected = 12 * 96 * h * h + 96 * 4 * h + 2 * h + 51200 * h
    assert params_total(make_plan()) == expected
    with_bias = make_plan(bias=True, position="learned")
    # per layer 12h² weights and 13h: QKV biases 3h, projection bias h, fc1 biases 4h, fc2
    # bias h, two LayerNorms 2 x 2h; the final LayerNorm 2h; the tied word embedding
    # 51,200 x h; the learned position table 2,048 x h
    exact = 12 * 96 * h * h + 13 * 96 * h + 2 * h + 51200 * h + 2048 * h
    assert params_total(with_bias) == exact == 174_615_846_912
    # Brown et al.'s Table 2.1 quotes 175.0B (with GPT-2's 50,257 tokens, not Megatron's
    # padded 51,200: 174.6B either way)
    assert params_total(with_bias) == pytest.approx(175.0e9, rel=0.005)


def test_tensor_parallel_shards_matrices_and_replicates_norms():
    plan = make_plan(tp=8)
    h = 12288
    lp = layer_params(plan)
    assert lp.total == 12 * h * h + 4 * h
    assert lp.per_rank == 12 * h * h // 8 + 4 * h


def test_gqa_and_swiglu_layer_parameters():
    """Llama 3 70B: h 8192, 64 heads, 8 kv heads of 128, SwiGLU ffn 28672, RMSNorm."""
    plan = make_plan(
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        ffn=28672,
        mlp="swiglu",
        norm="rmsnorm",
        tp=1,
        layers=80,
        vocab=128256,
        tied_embeddings=False,
    )
    h = 8192
    attention = h * (64 * 128 + 2 * 8 * 128) + 64 * 128 * h
    mlp = 3 * h * 28672
    assert layer_params(plan).total == attention + mlp + 2 * h
    # 80 layers, two untied vocabulary matrices and the final norm: 70,553,706,496, the
    # count of the released checkpoint (meta-llama/Meta-Llama-3-70B), which Meta rounds to
    # 70.6B
    total = 80 * (attention + mlp + 2 * h) + 2 * 128256 * h + h
    assert params_total(plan) == total == 70_553_706_496


def test_tied_embedding_is_kept_on_the_last_stage_too():
    plan = make_plan(tp=8, pp=8)
    first = stage_params(plan, 0).parts
    last = stage_params(plan, 7).parts
    assert ("word embedding", 51200 * 12288 // 8) in first
    assert ("output layer (tied copy)", 51200 * 12288 // 8) in last
    single = make_plan(tp=8, pp=1, dp=128)
    parts = stage_params(single, 0).parts
    assert all("output layer" not in name for name, _ in parts)


# Korthikanti et al. (arXiv 2205.05198) Table 2: activation bytes per transformer layer,
# 16-bit activations, eager attention with dropout (their assumptions), GPT-3 175B, t = 8.
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "expected"),
    [
        (1, False, "none", SBH * 34 + 5 * A * S * S * B),
        (T, False, "none", SBH * 10 + SBH * 24 // T + 5 * A * S * S * B // T),
        (T, True, "none", SBH * 34 // T + 5 * A * S * S * B // T),
        (T, False, "selective", SBH * 10 + SBH * 24 // T),
        (T, True, "selective", SBH * 34 // T),
        (T, False, "full", 2 * SBH),
    ],
    ids=["no-parallelism", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "full"],
)
def test_korthikanti_table2_activations_per_layer(tp, sp, recompute, expected):
    # GPT-3 as Korthikanti et al. train it: learned positions, so that Q, K and V are all
    # views of the QKV output selective recompute holds (`layers._qkv_held_by_v`)
    plan = make_plan(
        tp=tp,
        sp=sp,
        recompute=recompute,
        attention="eager",
        dropout=True,
        dp=128 // tp,
        position="learned",
    )
    attn, mlp = layer_saved(plan, shapes(plan))
    assert sum(a.total for a in attn + mlp) == expected


def test_flash_attention_stores_row_statistics_not_scores():
    """FlashAttention (Dao et al., arXiv 2205.14135) keeps the fp32 log-sum-exp per row."""
    plan = make_plan(tp=8, attention="flash", dropout=True, recompute="none")
    names = {a.name: a.total for a in attention_saved(plan, shapes(plan))}
    assert names["attention softmax statistics (fp32)"] == 4 * (96 // 8) * 2048
    assert not any("softmax output" in n for n in names)


def test_gqa_shrinks_saved_k_and_v():
    plan = make_plan(tp=8, kv_heads=8, recompute="none")
    saved = {a.name: a.total for a in attention_saved(plan, shapes(plan))}
    assert saved["attention K"] == saved["attention Q"] // 12


def test_swiglu_saves_gate_up_and_product():
    plan = make_plan(tp=8, mlp="swiglu", ffn=32768, recompute="none")
    saved = {a.name: a.total for a in mlp_saved(plan, shapes(plan))}
    assert saved["MLP SwiGLU input (gate, up)"] == 2 * 2 * 2048 * 32768 // 8
    assert saved["MLP fc2 input"] == 2 * 2048 * 32768 // 8


@pytest.mark.parametrize(
    ("schedule", "v", "stage", "expected"),
    [
        ("1f1b", 1, 0, 8),
        ("1f1b", 1, 5, 3),
        ("1f1b", 1, 7, 1),
        ("gpipe", 1, 3, 96),
        # Korthikanti section 4.2.3: p·(1 + (p − 1)/(p·v)) on the first stage.
        ("interleaved", 2, 0, 8 * (1 + 7 / (8 * 2))),
        ("interleaved", 4, 0, 8 * (1 + 7 / (8 * 4))),
    ],
)
def test_microbatches_in_flight(schedule, v, stage, expected):
    plan = make_plan(schedule=schedule, virtual_stages=v)
    assert inflight(plan, stage, plan.microbatches) == pytest.approx(expected)


def test_every_stage_has_forward_backward_and_reduction_phases():
    step = derive(make_plan())
    for stage in step.stages:
        names = [p.name for p in stage.phases]
        for required in (
            "forward.attention",
            "forward.mlp",
            "backward.mlp",
            "backward.attention",
            "dp.grads",
            "optimizer",
        ):
            assert required in names
    assert "loss" in [p.name for p in step.stages[-1].phases]
    assert "loss" not in [p.name for p in step.stages[0].phases]


def test_zero0_all_reduces_and_zero1_reduce_scatters_then_gathers():
    def dp_ops(zero, pp=8):
        stage = derive(make_plan(zero=zero, pp=pp)).stages[0]
        return [(m.op, p.name) for p in stage.phases for m in p.moves if m.group == "dp"]

    def dp_sizes(zero):
        stage = derive(make_plan(zero=zero)).stages[0]
        return [
            (m.op, m.dtype, m.size_bytes) for p in stage.phases for m in p.moves if m.group == "dp"
        ]

    assert dp_ops(0) == [("all-reduce", "dp.grads")]
    assert dp_ops(1) == [("reduce-scatter", "dp.grads"), ("all-gather", "optimizer")]
    # stage 0's parameters, Ψ_r: 12 layers of 12h²/8 + 4h (two LayerNorms, no biases) and
    # the word embedding's vocabulary shard 51200·h/8; the gradients cross in fp32 (4 B),
    # the updated parameters come back in bf16 (2 B)
    h = 12288
    psi = 12 * (12 * h * h // 8 + 4 * h) + 51200 * h // 8
    assert psi == 2_797_142_016
    assert dp_sizes(0) == [("all-reduce", "fp32", 4 * psi)]
    assert dp_sizes(1) == [
        ("reduce-scatter", "fp32", 4 * psi),  # 11,188,568,064 B
        ("all-gather", "bf16", 2 * psi),  # 5,594,284,032 B
    ]
    assert 4 * psi == 11_188_568_064 and 2 * psi == 5_594_284_032
    ops3 = dp_ops(3, pp=1)  # ZeRO 3 is priced without a pipeline only
    assert ("all-gather", "forward.attention") in ops3
    assert ("reduce-scatter", "backward.mlp") in ops3
    assert not [o for o in ops3 if o[1] == "dp.grads"]


def test_zero2_reduce_scatters_after_every_micro_batch_and_zero1_once():
    """ZeRO-2 keeps only its shard of the gradients, so it cannot accumulate a full copy
    over the micro-batches: one reduce-scatter per micro-batch's backward (DeepSpeed issue
    2252), where ZeRO-1 reduces its accumulated buffer once. Same size each time: the
    rank's gradients, so ZeRO-2's step moves m times ZeRO-1's bytes."""
    from budget.schedule import step_time

    def grads(zero: int, micro: int) -> tuple[object, int, float]:
        plan = make_plan(zero=zero, micro=micro)
        stage = derive(plan).stages[0]
        (phase,) = [p for p in stage.phases if p.name == "dp.grads"]
        (move,) = [m for m in phase.moves if m.group == "dp"]
        timed = step_time(plan, derive(plan)).stages[0]
        (priced,) = [p for p in timed.phases if p.name == "dp.grads"]
        (t,) = [t for t in priced.moves if t.move.group == "dp"]
        return move.count, move.size_bytes, t.time_s * t.move.count

    m = make_plan(micro=1).microbatches
    assert m > 1
    one, two = grads(1, 1), grads(2, 1)
    assert one[0] == 1 and two[0] == m
    assert m == 1536 // 16  # global batch over dp 16, micro-batch 1
    assert one[1] == two[1]  # the same bytes per call
    # the rank's fp32 gradients: stage 0's 12 layers of 12h²/8 + 4h and the vocabulary
    # shard 51200·h/8, 2,797,142,016 parameters at 4 B
    h = 12288
    assert one[1] == 4 * (12 * (12 * h * h // 8 + 4 * h) + 51200 * h // 8) == 11_188_568_064
    assert two[2] == pytest.approx(m * one[2])


def test_sequence_parallel_replaces_all_reduce_with_gather_and_scatter():
    def tp_ops(sp):
        stage = derive(make_plan(sp=sp)).stages[1]
        return sorted(m.op for p in stage.phases if p.name == "forward.mlp" for m in p.moves)

    assert tp_ops(False) == ["all-reduce"]
    assert tp_ops(True) == ["all-gather", "reduce-scatter"]


@pytest.mark.parametrize(
    ("position", "sp", "op", "sent"),
    [
        ("rope", True, "reduce-scatter", 7 / 8),
        ("learned", True, "all-reduce", 2 * 7 / 8),
        ("rope", False, "all-reduce", 2 * 7 / 8),
        ("learned", False, "all-reduce", 2 * 7 / 8),
    ],
)
def test_the_embedding_output_is_reduce_scattered_only_without_a_position_table(
    position, sp, op, sent
):
    """Megatron-Core reduce-scatters the vocab-parallel lookup into sequence shards only
    where no learned position table is added (``reduce_scatter_embeddings``); GPT-3's
    positions are added after an all-reduce, then each rank keeps its shard (a split). A
    review found GPT-3 reduce-scattered: half the bytes, 267 against 533 us a micro-batch
    on the shipped plan. Per rank, S = 2 B x 2048 tokens x 12288 over tp 8."""
    plan = make_plan(sp=sp, position=position)
    (phase,) = [p for p in derive(plan).stages[0].phases if p.name == "forward.embedding"]
    (move,) = [m for m in phase.moves if m.name == "embedding output"]
    size = 2 * 2048 * 12288
    assert (move.op, move.group, move.ranks, move.size_bytes) == (op, "tp", 8, size)
    assert ("keeps its shard" in move.rule) == (position == "learned" and sp)
    rows = [c for p in build_report(plan).phases for c in p.collectives]
    (row,) = [c for c in rows if c.name == "embedding output"]
    assert row.sent_bytes == row.recv_bytes == sent * size


def test_sequence_parallel_norm_and_bias_gradients_are_all_reduced_over_tp():
    """Megatron-LM's finalize_model_grads all-reduces over tp the gradients of what every tp
    rank applies to its own token shard under sequence parallelism. GPT-3 (LayerNorm with
    bias, biased linears), 12 layers on a middle stage: two LayerNorms of 2 x 12288 and the
    two row-parallel output biases of 12288 per layer, 12 x 73,728 = 884,736 fp32
    gradients, 3,538,944 B; the last stage adds the final LayerNorm's 24,576. Nothing
    without sequence parallelism."""

    def reduced(sp: bool, stage: int) -> list[int]:
        phases = derive(make_plan(sp=sp, bias=True)).stages[stage].phases
        grads = next(p for p in phases if p.name == "dp.grads")
        return [m.size_bytes for m in grads.moves if m.group == "tp"]

    assert reduced(True, 1) == [12 * (2 * 2 * 12288 + 2 * 12288) * 4] == [3_538_944]
    assert reduced(True, 7) == [3_538_944 + 2 * 12288 * 4]
    assert reduced(False, 1) == []


def _pipelined(sp: bool, scatter_gather: bool):
    from budget.plan.resolve import resolve
    from budget.plan.yaml_load import Marks

    tree = {
        "model": {"preset": "gpt3-175b", "layers": 8},
        "batch": {"seq": 2048, "micro": 1, "global": 8},
        "parallel": {
            "tp": 8,
            "pp": 2,
            "sequence_parallel": sp,
            "pipeline": {"scatter_gather": scatter_gather},
        },
        "device": {
            "memory": "80 GiB",
            "memory_bandwidth": "2 TB/s",
            "flops": {"bf16": "312 TFLOP/s"},
        },
        "topology": {
            "gpus": 16,
            "levels": [
                {"name": "nvlink", "size": 8, "bandwidth": "300 GB/s", "latency": "3 us"},
                {"name": "infiniband", "bandwidth": "25 GB/s", "latency": "10 us"},
            ],
        },
    }
    return resolve(tree, Marks(), "plan.yaml")


def test_scatter_gather_sends_one_tp_share_and_gathers_it_over_nvlink() -> None:
    """Narayanan et al. section 4.1 by hand, GPT-3 hidden 12288, sequence 2048, bf16: the
    stage output is 2 · 2048 · 12288 = 50,331,648 B, replicated over tp 8 without sequence
    parallelism. Sent whole over InfiniBand it takes 10 µs + 50,331,648 / 25e9 = 2.023 ms;
    with scatter/gather each rank sends 6,291,456 B (0.262 ms) and the receivers all-gather
    it over NVLink in 7 steps: 7 · 3 µs + 7/8 · 50,331,648 / 300e9 = 0.168 ms."""
    from budget.layers import shapes
    from budget.schedule import price_move
    from budget.step import at_boundary
    from budget.step import pipeline_moves as built

    def pipeline_moves(plan, s, forward):  # stage 0's sends, to stage 1 and back from it
        return at_boundary(built(plan, s, forward=forward), 0)

    full = 2 * 2048 * 12288
    whole = _pipelined(sp=False, scatter_gather=False)
    (send,) = pipeline_moves(whole, shapes(whole), forward=True)
    assert send.size_bytes == full
    assert price_move(whole, send).time_s == pytest.approx(10e-6 + full / 25e9)
    split = _pipelined(sp=False, scatter_gather=True)
    for forward in (True, False):
        shard, gather = pipeline_moves(split, shapes(split), forward=forward)
        assert (shard.op, shard.size_bytes) == ("send-recv", full // 8)
        assert price_move(split, shard).time_s == pytest.approx(10e-6 + full / 8 / 25e9)
        assert (gather.op, gather.group, gather.size_bytes) == ("all-gather", "tp", full)
        assert price_move(split, gather).time_s == pytest.approx(7 * 3e-6 + 7 / 8 * full / 300e9)
    # with sequence parallelism the activations are already sharded: the flag changes nothing
    for flag in (False, True):
        sp = _pipelined(sp=True, scatter_gather=flag)
        (sharded,) = pipeline_moves(sp, shapes(sp), forward=True)
        assert sharded.size_bytes == full // 8


def test_the_header_says_when_stage_sends_are_split_over_tp() -> None:
    from budget.pipeline import build_report
    from budget.render.table import header

    split = build_report(_pipelined(sp=False, scatter_gather=True))
    assert split.layout["scatter_gather"] is True
    assert "scatter/gather stage sends" in " ".join(header(split))
    # with sequence parallelism the flag has nothing to split: the header does not claim it
    sharded = build_report(_pipelined(sp=True, scatter_gather=True))
    assert "scatter/gather" not in " ".join(header(sharded))


def _plans_to_walk():
    """Every shipped plan and every run of the accuracy table, as plans."""
    from pathlib import Path

    from budget.accuracy import DIAGNOSTIC_RUNS, REFERENCE_RUNS, RUNS, plan_of
    from budget.plan.load import load_plan

    plans = [load_plan(p) for p in sorted((Path(__file__).parent.parent / "plans").glob("*.yaml"))]
    return plans + [plan_of(run) for run in (*RUNS, *REFERENCE_RUNS, *DIAGNOSTIC_RUNS)]


def test_every_overlap_window_names_a_kernel_of_its_phase(tmp_path):
    """A move hidden behind a kernel names it (`Move.window`); a name no kernel carries
    would fall back to the whole phase's compute and hide too much. Walked: the shipped
    plans, the accuracy table's runs, and latent attention with and without a query latent
    under sequence parallelism and full recompute."""
    from budget.plan.load import load_plan
    from tests.test_search import V2_LITE

    lite = tmp_path / "lite.yaml"
    lite.write_text(V2_LITE.replace("recompute: selective", "recompute: full"), "utf-8")
    v3 = tmp_path / "v3.yaml"
    v3.write_text(
        V2_LITE.replace("recompute: selective", "recompute: full").replace(
            "mla: {kv_rank: 512", "mla: {q_rank: 1536, kv_rank: 512"
        ),
        "utf-8",
    )
    for plan in [*_plans_to_walk(), load_plan(lite), load_plan(v3)]:
        for stage in derive(plan).stages:
            for phase in stage.phases:
                kernels = {w.name for w in phase.works}
                for move in phase.moves:
                    if move.window and not move.window.startswith("@"):
                        assert move.window in kernels, (plan.name, phase.name, move.window)


def test_zero3_gathers_and_reduces_the_parameters_outside_the_layers():
    """Under ZeRO-3 the embedding, final norm and output layer (FSDP's root unit) are
    gathered once a micro-batch, held through its backward, and their gradients
    reduce-scattered at its end. GPT-3 at tp 8 on one stage (ZeRO 3 is priced without a
    pipeline only): the word embedding is 51200 / 8 x 12288 = 78,643,200 parameters a rank,
    tied to the output layer, and the final LayerNorm adds 2 x 12288; bf16 gathers and fp32
    gradients over dp 16."""
    word, norm = 51200 // 8 * 12288, 2 * 12288
    (one,) = derive(make_plan(zero=3, tp=8, pp=1, dp=16, global_batch=192)).stages
    assert moves(one, "forward.embedding") == {
        "embedding+head weights": ("all-gather", "dp", 16, 2 * (word + norm))
    }
    assert moves(one, "backward.embedding") == {
        "embedding+head gradients": ("reduce-scatter", "dp", 16, 4 * (word + norm))
    }
    assert 2 * (word + norm) == 157_335_552 and 4 * (word + norm) == 314_671_104
    assert "loss" in [p.name for p in one.phases] and not moves(one, "loss")
    live = [a for p in one.phases for i in p.instants for a in i.live]
    held = [a for a in live if a.name.startswith("gathered embedding+head parameters")]
    assert held and all(a.bytes == 2 * (word + norm) for a in held)
    # the head's unsharded gradient (bf16, as computed) lives through the backward
    grads = [
        a
        for p in one.phases
        if p.name.startswith("backward")
        for i in p.instants
        for a in i.live
        if a.name.startswith("head gradients")
    ]
    assert grads and all(a.bytes == 2 * word for a in grads)
    # the group is dp x cp; ZeRO-1 and ZeRO-2 hold every parameter, dp 1 has no group
    (cp,) = derive(make_plan(zero=3, tp=8, pp=1, dp=8, cp=2, global_batch=192)).stages
    assert moves(cp, "forward.embedding")["embedding+head weights"][2] == 16
    # gathered in the gather dtype, whatever the sharded parameters are kept in
    fp32 = Precision(params="fp32", master=None, param_gather="bf16")
    (kept,) = derive(make_plan(zero=3, tp=8, pp=1, dp=16, global_batch=192, precision=fp32)).stages
    assert moves(kept, "forward.embedding")["embedding+head weights"][3] == 2 * (word + norm)
    for zero, dp in ((1, 16), (2, 16), (3, 1)):
        plain = derive(make_plan(zero=zero, tp=8, pp=1, dp=dp, global_batch=192)).stages[0]
        assert not moves(plain, "forward.embedding"), (zero, dp)


def test_zero3_root_of_an_moe_model_leaves_out_its_layers(tmp_path):
    """Mixtral 8x7B at tp 2 under ZeRO-3 (dp 32, no pipeline: ZeRO 3 is priced without
    one only): the root unit is the word embedding and the untied output layer, each
    32000 / 2 x 4096 = 65,536,000 parameters, and the final RMSNorm's 4096, not the MoE
    layers (each has its own gathers). Gathered in the plan's bf16 before the embedding,
    gradients reduced in fp32 after its backward, and no other root move."""
    from pathlib import Path

    from budget.plan.load import load_plan

    text = (Path(__file__).parents[1] / "plans" / "mixtral-8x7b.yaml").read_text("utf-8")
    path = tmp_path / "mixtral.yaml"
    text = text.replace("  zero: 1\n", "  zero: 3\n", 1)
    path.write_text(text.replace("  pp: 4\n  dp: 8\n", "  pp: 1\n  dp: 32\n", 1), "utf-8")
    plan = load_plan(path)
    assert plan.parallel.zero == 3 and (plan.parallel.tp, plan.parallel.pp) == (2, 1)
    (stage,) = derive(plan).stages
    root = 2 * (32000 // 2 * 4096) + 4096
    gather = ("all-gather", "dp", 32, 2 * root)
    assert moves(stage, "forward.embedding") == {"embedding+head weights": gather}
    scatter = ("reduce-scatter", "dp", 32, 4 * root)
    assert moves(stage, "backward.embedding") == {"embedding+head gradients": scatter}
    rest = [p for p in stage.phases if p.name not in ("forward.embedding", "backward.embedding")]
    assert not [m for p in rest for m in p.moves if "root unit" in m.rule]


def moves(stage, phase):
    """The FSDP-root moves of `phase` on `stage`: name -> (op, group, ranks, S bytes)."""
    (p,) = [p for p in stage.phases if p.name == phase]
    return {
        m.name: (m.op, m.group, m.ranks, m.size_bytes) for m in p.moves if "root unit" in m.rule
    }


def test_the_embedding_is_split_by_whole_vocabulary_rows():
    """Megatron-LM splits the word embedding by whole vocabulary rows (VocabParallelEmbedding):
    with GPT-2's unpadded 50,257 tokens over tp 8 a rank holds ceil(50,257 / 8) = 6,283 rows
    of 12,288 = 77,205,504 weights (not ceil(50,257 x 12,288 / 8) = 77,194,752) on the first
    stage and, tied, on the last; the embedding group all-reduces exactly those fp32
    gradients, 77,205,504 x 4 = 308,822,016 B."""
    plan = make_plan(tp=8, pp=8, dp=16, vocab=50257)
    rows = 6_283 * 12_288
    assert rows == 77_205_504
    assert dict(stage_params(plan, 0).parts)["word embedding"] == rows
    assert dict(stage_params(plan, 7).parts)["output layer (tied copy)"] == rows
    phases = [p for s in derive(plan).stages for p in s.phases if p.name == "embedding.grads"]
    assert len(phases) == 2  # the first stage's copy and the last stage's
    for phase in phases:
        (move,) = phase.moves
        assert (move.name, move.op, move.size_bytes) == (
            "tied embedding grads",
            "all-reduce",
            308_822_016,
        )


def _json_report(path):
    from budget.pipeline import build_report
    from budget.plan.load import load_plan
    from budget.report import to_dict

    return to_dict(build_report(load_plan(path)))


def test_fp32_parameters_are_their_own_master_and_are_gathered_in_fp32(tmp_path):
    """Megatron-LM's distributed optimizer table (docs distrib_optimizer.md): "fp32 param,
    fp32 grads" take 4 + 4 + 8/d bytes a parameter with Adam, no separate master copy; the
    updated parameters are all-gathered in their own format. gpt-1.3b at dp 8, ZeRO-1:
    Ψ = 1,315,819,520, so Adam's moments are 8Ψ/8 = 1,315,819,520 bytes and the gather moves
    7/8 · 4Ψ = 4,605,368,320 bytes a rank. Writing master: fp32 beside them is refused."""
    from budget.errors import BudgetError
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    fp32 = ("params: bf16", "params: fp32")
    path = variant(tmp_path, "fp32.yaml", fp32, ("  master: fp32\n", ""), base=base)
    report = _json_report(path)
    stage = report["memory"]["stages"][0]
    # 24 layers of 12h² + 13h (weights, biases, two LayerNorms), the tied word embedding
    # 50,304 x h, the learned position table 2,048 x h and the final LayerNorm 2h; h = 2048
    psi = 12 * 24 * 2048**2 + 13 * 24 * 2048 + 50304 * 2048 + 2048 * 2048 + 2 * 2048
    assert psi == 1_315_819_520
    assert stage["params_bytes"] == stage["grads_bytes"] == 4 * psi
    assert stage["optimizer_bytes"] == 8 * psi // 8
    (gather,) = [
        c for p in report["phases"] for c in p["collectives"] if c["name"] == "updated parameters"
    ]
    assert (gather["dtype"], gather["bytes"], gather["sent_bytes"]) == (
        "fp32",
        4 * psi,
        4_605_368_320,
    )
    assert gather["sent_bytes"] == 7 * 4 * psi // 8  # ring all-gather: (d - 1)/d of 4Ψ
    with pytest.raises(BudgetError, match="own master copy"):
        load_plan(variant(tmp_path, "both.yaml", fp32, base=base))


def _peak_bucket(path) -> int:
    """The ZeRO-2 bucket at the peak of the MoE block's backward (the stage's peak may be
    elsewhere: in a forward moment, where no bucket is held)."""
    (phase,) = [p for p in _json_report(path)["phases"] if p["name"] == "backward.moe"]
    (bucket,) = [
        a for a in phase["peak_overlap"] if a["tensor"] == "gradient bucket before reduce-scatter"
    ]
    return bucket["bytes"]


def test_zero2_bucket_of_an_moe_layer_is_that_layers_gradients(tmp_path):
    """ZeRO-2's bucket holds one layer's gradients before their reduce-scatter. Mixtral's
    layers are all MoE: 21,012,480 non-expert parameters a rank (attention, norms, router),
    its experts not in it, as ep 8 x etp 2 over tp 2 x dp 8 leaves one expert
    data-parallel rank; fp32: 84,049,920 bytes (it was a dense layer's, 436,240,384, an
    MLP Mixtral does not have).
    DeepSeekMoE 16B at ep 8 keeps two expert data-parallel ranks, so its bucket also holds
    the layer's experts: 4 · (34,213,888 + 69,206,016) = 413,679,616 bytes."""
    from tests.plan_files import ROOT, variant

    plans = ROOT / "plans"
    zero2 = ("zero: 1", "zero: 2")
    mixtral = variant(tmp_path, "m.yaml", zero2, base=plans / "mixtral-8x7b.yaml")
    # Mixtral at tp 2 (h 4096, 32 query heads and 8 K/V heads of 128): the QKV projection
    # 4096 x (4096 + 2 x 1024) and the output projection 4096², both split over tp; two
    # RMSNorms 2 x 4096 and the router 4096 x 8 experts, replicated
    mixtral_layer = 4096 * (4096 + 2048) // 2 + 4096**2 // 2 + 2 * 4096 + 4096 * 8
    assert mixtral_layer == 21_012_480
    assert _peak_bucket(mixtral) == 4 * 21_012_480
    deepseek = variant(
        tmp_path,
        "d.yaml",
        zero2,
        ("vocab: 102400", "vocab: 32000"),
        base=plans / "deepseek-moe-16b.yaml",
    )
    # DeepSeekMoE 16B at tp 1 (h 2048, 16 heads of 128): attention 4h², the shared experts'
    # SwiGLU of 2,816 (3 matrices), two RMSNorms 2h and the router h x 64 experts; the
    # routed experts, 64 over ep 8 = 8 on the rank, each a SwiGLU of 1,408
    layer = 4 * 2048**2 + 3 * 2048 * 2816 + 2 * 2048 + 2048 * 64
    experts = 8 * 3 * 2048 * 1408
    assert (layer, experts) == (34_213_888, 69_206_016)
    assert _peak_bucket(deepseek) == 4 * (34_213_888 + 69_206_016)


def test_zero2_tied_embedding_grads_are_all_reduced_as_the_shard_each_copy_keeps(tmp_path):
    """Under ZeRO-2 each stage keeps only its 1/dp shard of the embedding gradient, so the
    first and last stages all-reduce that shard (as under ZeRO-3): GPT-3's 51,200 × 12,288
    / tp 8 fp32 gradient is 314,572,800 bytes, over dp 16 19,660,800."""
    from tests.plan_files import GPT3, variant

    report = _json_report(variant(tmp_path, "z2.yaml", ("zero: 1", "zero: 2"), base=GPT3))
    sizes = {
        c["bytes"]
        for p in report["phases"]
        for c in p["collectives"]
        if c["name"] == "tied embedding grads"
    }
    assert sizes == {314_572_800 // 16}


def test_a_training_plan_without_an_optimizer_is_refused(tmp_path):
    """optimizer: none is the serving format; a training plan with it kept master weights
    (658 MB on gpt-1.3b at ZeRO-1) and gathered updated parameters no optimizer wrote."""
    from budget.errors import BudgetError
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    path = variant(tmp_path, "none.yaml", ("optimizer: adam", "optimizer: none"), base=base)
    with pytest.raises(BudgetError, match=r"optimizer: none is for serving plans"):
        load_plan(path)


def test_a_sweeps_masked_work_keeps_every_field_but_its_count() -> None:
    """`phases.when` rebuilds each Work with its constructor (not `replace`, for speed): it
    must copy every field, or a sweep would price a kernel differently from the same layout
    alone. Every field is set off its default here, and only ``count`` may change."""
    from dataclasses import fields, replace

    import numpy as np

    from budget.flops import Work
    from budget.phases import when

    work = Work(
        "attention core (flash) backward",
        "attention",
        10**12,
        10**6,
        count=3,
        backward=2.5,
        keys=4096,
        unmasked_keys=2048,
        attention_pass="backward",
        backward_keys=1024,
        causal=0.5,
        launches=2.0,
        dtype="bf16",
        sm_share=0.875,
        dims=(1, 2, 3),
        inner=(7,),
        backward_launches=3,
    )
    defaults = Work("x", "matmul", 0, 0)
    unset = [f.name for f in fields(Work) if getattr(work, f.name) == getattr(defaults, f.name)]
    assert not unset  # every field given a value of its own
    (masked,) = when([work], np.array([True, False]))
    assert list(masked.count) == [3, 0]
    assert replace(masked, count=work.count) == work


def test_a_stage_send_is_waited_for_by_the_stage_that_receives_it():
    """1F1B's sends are exposed both ways: the forward's output waits at the next stage,
    the backward's gradient at the previous one, so the rule names the receiving stage
    (it said "the next stage" under the backward's send too: a user audit)."""
    report = build_report(make_plan(pp=4, dp=2))
    rules = {
        p.name: {c.overlap_rule for c in p.collectives}
        for p in report.phases
        if p.name.startswith("pipeline.")
    }
    assert set(rules) == {"pipeline.forward", "pipeline.backward"}
    for phase, said in rules.items():
        assert said == {"pp send/recv: exposed, the receiving stage waits for it"}, phase


def test_the_tp_gradient_all_reduce_names_what_it_holds():
    """finalize_model_grads' all-reduce over tp holds the sequence-parallel weights and,
    where the model has them, the per-head Q/K norms; its rule named Q/K norms for models
    without any (an audit), and a model with them but no sequence parallelism holds only
    those."""
    from dataclasses import replace

    from tests.builders import GPT3

    def rule(sp: bool, qk: str) -> set[str]:
        plan = make_plan(replace(GPT3, qk_norm=qk), sp=sp)
        grads = next(p for p in derive(plan).stages[1].phases if p.name == "dp.grads")
        return {m.rule for m in grads.moves if m.group == "tp"}

    said = "tp: exposed, after the last backward (Megatron-LM's finalize_model_grads: {})"
    assert rule(True, "none") == {said.format("sequence-parallel weights")}
    assert rule(True, "per_head") == {said.format("sequence-parallel weights, per-head Q/K norms")}
    assert rule(False, "per_head") == {said.format("per-head Q/K norms")}
    assert rule(False, "none") == set()


def test_the_expert_tp_scatter_is_waited_for_by_the_next_exchange():
    """Mixtral at etp 2: the forward's output rows are scattered before the combine, the
    backward's input-row gradient before the dispatch's gradient exchange (its rule said
    "before combine" in the backward too: an audit)."""
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT

    report = build_report(load_plan(ROOT / "plans" / "mixtral-8x7b.yaml"))
    rules = {
        p.name: {
            c.overlap_rule for c in p.collectives if c.op == "reduce-scatter" and c.group == "etp"
        }
        for p in report.phases
        if p.name in ("forward.moe", "backward.moe")
    }
    assert rules == {
        "forward.moe": {"etp: exposed before combine"},
        "backward.moe": {"etp: exposed before the dispatch's gradient"},
    }


def test_full_recompute_adds_one_whole_forward_to_each_blocks_backward():
    """Korthikanti et al. (arXiv 2205.05198), section 5: full activation recomputation runs
    each layer's forward pass again before its backward, so a layer's GEMMs cost forward 1 +
    backward 2 + recomputed forward 1 = 4 forward passes against 3 without it, the 4/3 of
    their hardware over model FLOPs. GPT-3 175B at tp 8, sequence 2,048, micro-batch 1
    (s = 2,048 tokens a rank, h = 12,288): a layer's forward GEMMs are QKV 2·s·h·3h/tp, the
    output projection 2·s·h·h/tp and the MLP's fc1 and fc2 2·s·h·4h/tp each, 24·s·h²/tp in
    all (Korthikanti's 24bsh² per layer, split over tp). Each backward block then holds
    every kernel of its forward again, the norms, rotary, flash core and residual adds too:
    the backward's FLOPs and bytes with `recompute: full` less those without are the
    forward's, kernel for kernel."""
    s, h, tp = 2048, 12288, 8
    gemms = 2 * s * h * (3 * h + h + 4 * h + 4 * h) // tp
    assert gemms == 24 * s * h**2 // tp == 927_712_935_936

    def blocks(recompute: str) -> dict[str, tuple[int, int, int]]:
        """(all FLOPs, GEMM FLOPs, bytes) of one instance of each layer phase, stage 0."""
        phases = derive(make_plan(recompute=recompute)).stages[0].phases
        return {
            p.name: (
                sum(w.flops * w.count for w in p.works),
                sum(w.flops * w.count for w in p.works if w.kind == "matmul"),
                sum(w.bytes * w.count for w in p.works),
            )
            for p in phases
            if p.name.split(".")[-1] in ("attention", "mlp")
        }

    none, full = blocks("none"), blocks("full")
    forward = none["forward.attention"][1] + none["forward.mlp"][1]
    assert forward == gemms
    for recompute in (none, full):  # the forward itself does not change
        assert recompute["forward.attention"] == none["forward.attention"]
        assert recompute["forward.mlp"] == none["forward.mlp"]
    plain = none["backward.attention"][1] + none["backward.mlp"][1]
    redone = full["backward.attention"][1] + full["backward.mlp"][1]
    assert plain == 2 * gemms  # input and weight gradients, each a forward-sized GEMM
    assert redone == 3 * gemms  # ... and the recomputed forward
    assert (forward + redone) * 3 == (forward + plain) * 4  # Korthikanti's 4/3
    for block in ("attention", "mlp"):
        pairs = zip(full[f"backward.{block}"], none[f"backward.{block}"], strict=True)
        added = tuple(f - n for f, n in pairs)
        assert added == none[f"forward.{block}"]  # all FLOPs, GEMM FLOPs and bytes alike


def _live_by_instant(path, stage: int = 0) -> dict[tuple[str, str], dict[str, int]]:
    from budget.plan.load import load_plan

    found = derive(load_plan(path)).stages[stage]
    return {
        (p.name, i.label): {a.name: a.total for a in i.live}
        for p in found.phases
        for i in p.instants
    }


def test_zero2_holds_the_head_s_and_the_embedding_s_gradients_until_reduced(tmp_path):
    """Under ZeRO-2 the output layer's weight gradient is made in the loss's backward and is
    whole until its bucket is reduce-scattered; a tied one not before the embedding's
    backward adds its part, so through the layers' backward; the embedding's gradient has
    its bucket beside it (an audit: none of them was held). GPT 1.3B at dp 8, 4,096-token
    vocabulary, tied: 4,096 · 2,048 · 4 B (fp32 gradients) through every backward instant;
    untied, the head's only in the loss, and the embedding's bucket in its backward."""
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    edits = (("vocab: 50304", "vocab: 4096"), ("zero: 1", "zero: 2"))
    tied = _live_by_instant(variant(tmp_path, "tied.yaml", *edits, base=base))
    size = 4096 * 2048 * 4
    held = "head gradients (ZeRO-2, whole until reduced, held through the backward)"
    made = ("loss", "output layer weight gradient")  # once the fp32 gradient is freed
    for (phase, label), live in tied.items():
        holds = phase.startswith("backward") or (phase, label) == made
        assert live.get(held) == (size if holds else None), (phase, label)
        assert "embedding gradient bucket before reduce-scatter (ZeRO-2)" not in live
    # the output layer's weight gradient beside the logits' gradient cast back to bf16, not
    # beside the cross-entropy's fp32 buffer (an audit)
    assert "logits (fp32), the softmax and then its gradient" not in tied[made]
    assert tied[made]["logits gradient"] == 2048 * 4 * 4096 * 2
    assert tied[made]["output layer input gradient"] == 2048 * 4 * 2048 * 2  # at tp 1, whole
    # under sequence parallelism the input gradient whole beside its reduce-scatter's shard
    # while the weight gradient's GEMM runs (a review: the shard alone); GPT-3 at tp 8
    (*_, last) = derive(make_plan(zero=2)).stages
    (loss,) = [p for p in last.phases if p.name == "loss"]
    (weights,) = [i for i in loss.instants if i.label == made[1]]
    held = {a.name: a.total for a in weights.live}
    assert held["output layer input gradient (partial, before reduction)"] == 2048 * 12288 * 2
    assert held["output layer input gradient (reduce-scattered)"] == 2048 // 8 * 12288 * 2
    untied_edits = (*edits, ("tied_embeddings: true", "tied_embeddings: false"))
    untied = _live_by_instant(variant(tmp_path, "untied.yaml", *untied_edits, base=base))
    head = "head gradients (ZeRO-2, whole until reduced)"
    for (phase, label), live in untied.items():
        assert live.get(head) == (size if (phase, label) == made else None), (phase, label)
    bucket = untied["backward.embedding", "embedding weight gradient"]
    assert bucket["embedding gradient bucket before reduce-scatter (ZeRO-2)"] == size


def test_the_qkv_output_v_held_is_freed_with_the_checkpoints_saved_tensors() -> None:
    """Under selective recompute V's view keeps the QKV projection's output (a tensor of
    Q's and K's columns where the rotary embedding wrote them anew: 8,192 tokens x (1,024
    + 128) bf16 at Llama 3 70B's tp 8, 18,874,368 B); the core's checkpoint releases it
    with its saved tensors once its backward has run, so the QKV projection's backward no
    longer holds it (an audit: counted there, 42,615,750,656 B where Megatron holds
    42,596,876,288). It is held at the core's gradients, before that."""
    from pathlib import Path

    from budget.layers import QKV_HELD_BY_V
    from budget.plan.load import load_plan

    plan = load_plan(Path(__file__).parent.parent / "plans" / "llama3-70b.yaml")
    assert plan.recompute == "selective"
    (phase,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    at = {i.label: {a.name: a.total for a in i.live} for i in phase.instants}
    held = 2 * 8192 * (1024 + 128)
    assert held == 18_874_368
    assert at["attention core gradients"][QKV_HELD_BY_V] == held
    assert QKV_HELD_BY_V not in at["QKV weight and input gradients"]
    (qkv,) = [i for i in phase.instants if i.label == "QKV weight and input gradients"]
    assert qkv.total == 42_615_750_656 - held == 42_596_876_288
