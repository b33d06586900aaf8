"""An audit of `budget.flops` against its sources, each figure worked by hand here: the MoE
dispatcher's memory passes (Megatron-Core's ``MoEAlltoAllTokenDispatcher``), the capacity
drop MFU counts and the skew it reports, FlashAttention's backward under unequal head
dimensions, the final norm's backward and the operands of the GEMMs outside Transformer
Engine under an FP8 recipe."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from budget import flops, schedule
from budget.layers import shapes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.report import to_dict
from budget.step import derive
from tests.plan_files import ROOT, variant

PLANS = ROOT / "plans"
DEEPSEEK = PLANS / "deepseek-moe-16b.yaml"
MIXTRAL = PLANS / "mixtral-8x7b.yaml"


def _load_text(tmp_path: Path, text: str):
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    return load_plan(path)


def _with_experts(plan, **keys):
    experts = replace(plan.model.experts, **keys)
    return replace(plan, model=replace(plan.model, experts=experts))


def _phase(plan, name: str, stage: int = 0):
    return {p.name: p for p in derive(plan).stages[stage].phases}[name]


def _bytes(works) -> dict[str, int]:
    return {w.name: w.bytes for w in works}


# --- 1. the dispatcher's permutations ------------------------------------------------------


def test_deepseek_sorts_and_unsorts_the_rows_of_its_eight_local_experts():
    """DeepSeekMoE 16B (plans/deepseek-moe-16b.yaml): tp 1, sequence 4,096, top 6 of 64
    experts over ep 8, so 8 experts a rank. The rank permutes its own 4,096 × 6 = 24,576
    rows of 2,048 bf16 (24,576 × 2,048 × 2 B = 100,663,296 B, 100.7 MB) before the
    all-to-all, a read and a write: 201,326,592 B; unpermutes them after the combine, three
    passes: 301,989,888 B. With 8 local experts it also sorts the 24,576 rows it receives
    by expert and unsorts the experts' output (``sort_chunks_by_idxs``), a read and a write
    each: 2 × 201,326,592 = 4 × 100.7 MB more per MoE layer forward, and as much in
    backward (each one's backward is the other's kernel on the gradient)."""
    plan = load_plan(DEEPSEEK)
    s = shapes(plan)
    assert (s.tokens_sp, s.sent, s.routed, s.local_experts) == (4096, 24_576, 24_576, 8)
    rows = 24_576 * 2048 * 2
    assert rows == 100_663_296
    forward = _bytes(_phase(plan, "forward.moe").works)
    assert forward["token permutation"] == 2 * rows == 201_326_592
    assert forward[flops.MOE_SORT] == forward[flops.MOE_UNSORT] == 2 * rows
    assert forward["unpermute and combine"] == 3 * rows == 301_989_888
    names = [w.name for w in _phase(plan, "forward.moe").works]
    # permute, sort, experts, unsort, unpermute: the dispatcher's order
    assert names.index("token permutation") < names.index(flops.MOE_SORT)
    assert names.index(flops.MOE_SORT) < names.index("expert fc1")
    assert names.index("expert fc2") < names.index(flops.MOE_UNSORT)
    assert names.index(flops.MOE_UNSORT) < names.index("unpermute and combine")
    backward = _bytes(_phase(plan, "backward.moe").works)
    assert backward[f"{flops.MOE_SORT} backward"] == 2 * rows
    assert backward[f"{flops.MOE_UNSORT} backward"] == 2 * rows
    # each the other's kernel on the gradient, the weighted unpermute's reading the saved
    # rows for the probabilities' gradient (an audit, m515, and its review, m520:
    # `backward_of`'s twice, ten passes where there are six)
    assert backward["token permutation backward"] == 3 * rows
    assert backward["unpermute and combine backward"] == 3 * rows


def test_mixtral_permutes_the_rows_it_sends_not_the_rows_etp_gathers():
    """Mixtral 8x7B (plans/mixtral-8x7b.yaml): tp 2 with sequence parallelism, so etp 2,
    and 8 experts over ep 8, one a rank. A rank holds 4,096 / 2 = 2,048 tokens and sends
    2,048 × 2 = 4,096 rows of 4,096 bf16 (33,554,432 B): the permutation reads and writes
    them, 67,108,864 B (67 MB; it read the 8,192 rows the etp all-gather gives the experts,
    134 MB), the unpermute three passes, 100,663,296 B (101 MB, not 201 MB). The experts'
    GEMMs stay on the 8,192 gathered rows, each on its etp half of the expert's columns;
    with one expert a rank nothing is sorted. In
    backward the permutation is twice its forward, 134,217,728 B."""
    plan = load_plan(MIXTRAL)
    s = shapes(plan)
    assert (s.tokens_sp, s.sent, s.routed, s.local_experts) == (2048, 4096, 8192, 1)
    rows = 4096 * 4096 * 2
    assert rows == 33_554_432
    forward = _phase(plan, "forward.moe", stage=3).works
    kernels = _bytes(forward)
    assert kernels["token permutation"] == 2 * rows == 67_108_864
    assert kernels["unpermute and combine"] == 3 * rows == 100_663_296
    assert flops.MOE_SORT not in kernels and flops.MOE_UNSORT not in kernels
    (fc1,) = [w for w in forward if w.name == "expert fc1"]
    # the gathered rows on the rank's half (etp 2) of fc1's gate and up: 2 × 14,336 / 2
    assert fc1.flops == 2 * 8192 * 4096 * 2 * 7168
    backward = _bytes(_phase(plan, "backward.moe", stage=3).works)
    assert backward["token permutation backward"] == 3 * rows == 100_663_296
    assert backward["unpermute and combine backward"] == 3 * rows


def test_serving_with_tokens_replicated_permutes_its_experts_rows_and_sorts_nothing(tmp_path):
    """Mixtral served at tp 8 without sequence parallelism (vLLM's tensor-parallel fused
    MoE): every rank holds all 32 decoded tokens, nothing is exchanged, and it permutes the
    32 × 2 = 64 rows its experts take straight into their order and back, 64 × 4,096 × 2 B
    = 524,288 B a pass; 8 local experts, but no received rows to sort."""
    plan = _load_text(
        tmp_path,
        "name: mixtral-serving\nmode: decode\nmodel: {preset: mixtral-8x7b}\n"
        "batch: {sequences: 32, prompt: 2048, generate: 512}\n"
        "parallel: {tp: 8}\ndevice: {preset: h100-sxm}\n"
        "topology: {preset: dgx-h100, nodes: 1}\n",
    )
    s = shapes(plan, query_len=1, kv_len=2048 + 512)
    assert (s.routed, s.local_experts) == (64, 8)
    kernels = _bytes(flops.moe_forward(plan, s))
    rows = 64 * 4096 * 2
    assert kernels["token permutation"] == 2 * rows == 1_048_576
    assert kernels["unpermute and combine"] == 3 * rows
    assert flops.MOE_SORT not in kernels


def test_a_sweep_sorts_where_its_ranks_hold_several_experts():
    """A sweep's layouts in one pass (numpy arrays in `Shapes`): DeepSeekMoE at ep 8 (8
    experts a rank) and ep 64 (one a rank). The sort and unsort move 201,326,592 B at ep 8
    and nothing at ep 64, each layout as it prices alone."""
    plan = load_plan(DEEPSEEK)
    swept = replace(plan, parallel=replace(plan.parallel, ep=np.array([8, 64])))
    kernels = _bytes(flops.moe_forward(swept, shapes(swept)))
    assert kernels[flops.MOE_SORT].tolist() == [2 * 24_576 * 2048 * 2, 0]
    assert kernels[flops.MOE_UNSORT].tolist() == [201_326_592, 0]
    for i, ep in enumerate((8, 64)):
        one = replace(plan, parallel=replace(plan.parallel, ep=ep))
        alone = _bytes(flops.moe_forward(one, shapes(one)))
        for name, value in kernels.items():
            assert np.broadcast_to(value, (2,))[i] == alone.get(name, 0), (name, ep)


# --- 2. the capacity drop MFU counts -------------------------------------------------------


def _mixtral_decode(tmp_path: Path, sequences: int, parallel: str = "{tp: 8}"):
    return _load_text(
        tmp_path,
        "name: mixtral-decode\nmode: decode\nmodel: {preset: mixtral-8x7b}\n"
        f"batch: {{sequences: {sequences}, prompt: 1024, generate: 256}}\n"
        f"parallel: {parallel}\ndevice: {{preset: h100-sxm}}\n"
        "topology: {preset: dgx-h100, nodes: 1}\n",
    )


def test_a_capacity_drops_nothing_from_one_decoded_sequence(tmp_path):
    """Mixtral decoding one sequence at tp 8 (tokens replicated: T = 1 on every rank) under
    capacity factor 0.5: C = ⌈1·2·0.5/8⌉ = ⌈0.125⌉ = 1 row an expert, E·C = 8 ≥ T·k = 2, so
    nothing is dropped and the served parameters are the dropless ones (the drop read
    (1 − c)·k = 1 expert a layer: 32 × 176,160,768 parameters fewer)."""
    plan = _mixtral_decode(tmp_path, 1)
    capped = _with_experts(plan, capacity_factor=0.5)
    assert -(-1 * 2 * 1 // (8 * 2)) == 1  # ⌈1·2·(1/2)/8⌉
    assert flops.serving_params(capped) == flops.serving_params(plan)
    s = shapes(capped, query_len=1, kv_len=1024 + 256)
    assert (s.tokens_sp, s.sent) == (1, 2)  # both rows kept


def test_a_capacity_keeps_what_its_rounded_capacity_holds(tmp_path):
    """Mixtral decoding 12 sequences at tp 8 under c = 0.5: T = 12, T·k = 24 rows, C =
    ⌈12·2·0.5/8⌉ = ⌈1.5⌉ = 2, E·C = 16 kept: 2/3 of each token's 2 assignments, so a third
    of top 2 is dropped, 32 layers × 2 × 176,160,768 (3 × 4,096 × 14,336) / 3 =
    3,758,096,384 parameters, where (1 − c)·k dropped half."""
    plan = _mixtral_decode(tmp_path, 12)
    capped = _with_experts(plan, capacity_factor=0.5)
    expert = 3 * 4096 * 14336
    assert expert == 176_160_768 and -(-12 * 2 * 1 // (8 * 2)) == 2
    dropped = 32 * 2 * expert * (24 - 16) // 24
    assert dropped == 3_758_096_384
    assert flops.serving_params(plan) - flops.serving_params(capped) == dropped
    assert shapes(capped, query_len=1, kv_len=1024 + 256).sent == 16


# --- 3. the skew the rows are sized at -----------------------------------------------------


def test_the_reported_skew_is_the_rows_as_sized_with_capacity_rounding(tmp_path):
    """Mixtral decoding 4 sequences, ep 8 inside tp 8 (etp 1, one expert a rank), capacity
    1.25, imbalance 2: T = 4, T·k = 8 rows sent; C = ⌈4·2·1.25/8⌉ = ⌈1.25⌉ = 2, E·C = 16;
    the busiest rank is sized at min(⌈8·2⌉, 16) = 16 dispatched over 8 sent, a skew of 2
    (min(f, c)/min(c, 1) read 1.25). Its expert GEMM takes ⌈16 / 8⌉ = 2 rows, from 2 /
    (1 expert × 2/8 × skew 2) = 4 tokens, so it reaches its expert with chance 1 − (6/8)^4
    and the busiest of 8 ranks with `most_reached`; fc1 reads 2 rows of 4,096 and writes 2
    of 2 × 14,336 in bf16, and that share of the expert's 4,096 × 28,672 weights."""
    plan = _mixtral_decode(tmp_path, 4, "{tp: 8, dp: 1, ep: 8, etp: 1}")
    plan = _with_experts(plan, capacity_factor=1.25, imbalance=2.0)
    s = shapes(plan, query_len=1, kv_len=1024 + 256)
    assert (s.tokens_sp, s.sent, s.dispatched, s.routed) == (4, 8, 16, 2)
    assert flops.routing_skew(plan) == flops.routing_skew(plan, s) == 16 / 8 == 2.0
    (fc1,) = [w for w in flops.moe_forward(plan, s) if w.name == "expert fc1"]
    tokens = 2 / (1 * (2 / 8) * 2.0)
    assert tokens == 4
    reached = flops.most_reached(1, 1 - (6 / 8) ** 4, 8)
    weights = round(reached * 4096 * 2 * 14336)
    assert fc1.bytes == 2 * (2 * 4096 + 2 * 2 * 14336) + 2 * weights
    assert to_dict(build_report(plan))["model"]["experts"]["imbalance"] == 2.0


def test_a_whole_capacity_keeps_the_skew_min_f_c():
    """Where T·k·c/E is whole the rule is min(f, c)/min(c, 1), as before: Mixtral training
    (T = 2,048, k 2, E 8) at c 1.25, f 3: C = 2,048·2·1.25/8 = 640, E·C = 5,120 over 4,096
    sent, 1.25; at c 0.5: C = 256, E·C = 2,048 = the rows sent, 1."""
    plan = load_plan(MIXTRAL)
    assert flops.routing_skew(_with_experts(plan, capacity_factor=1.25, imbalance=3.0)) == 1.25
    assert flops.routing_skew(_with_experts(plan, capacity_factor=0.5, imbalance=3.0)) == 1.0


# --- 4. FlashAttention's backward with unequal head dimensions -----------------------------


def test_fused_attention_backward_counts_its_five_products_by_head_dimension(tmp_path):
    """FlashAttention-2's backward recomputes S = QKᵀ and computes dV, dP, dQ and dK: three
    products over d_qk and two over d_v, 2·(3·192 + 2·128) = 1,664 FLOPs a query-key pair
    at DeepSeek-V3's 192/128 against the forward's 2·(192 + 128) = 640: 832/320 = 2.6, not
    2.5. DeepSeek-V3 trained at sequence 4,096, tp 8: 128 / 8 = 16 heads a rank, 16 × 4,096²
    = 268,435,456 pairs, causal halves: forward 320 × 268,435,456 = 85,899,345,920 FLOPs,
    backward 832 × 268,435,456 = 223,338,299,392. Equal dimensions (GPT-3, 128) keep 2.5."""
    plan = _load_text(
        tmp_path,
        "name: deepseek-v3-train\nmodel: {preset: deepseek-v3}\n"
        "batch: {seq: 4096, micro: 1, global: 64}\n"
        "precision: {params: fp8, activations: bf16, matmul: fp8}\n"
        "parallel: {tp: 8, dp: 2, ep: 2, sequence_parallel: true, zero: 1}\n"
        "device: {preset: h200}\ntopology: {preset: dgx-h200, nodes: 2}\n",
    )
    (core,) = flops.attention_core(plan, shapes(plan))
    pairs = 16 * 4096 * 4096
    assert pairs == 268_435_456
    assert core.flops == 320 * pairs == 85_899_345_920
    assert core.backward == flops.fused_backward(192, 128) == 832 / 320 == 2.6
    (back,) = flops.backward_of([core])
    assert back.flops == 832 * pairs == 223_338_299_392
    gpt3 = load_plan(PLANS / "gpt3-175b.yaml")
    (core,) = flops.attention_core(gpt3, shapes(gpt3))
    assert core.backward is None and flops.fused_backward(128, 128) is None
    (back,) = flops.backward_of([core])
    assert back.flops == 5 * core.flops // 2  # (3·128 + 2·128) / (128 + 128)


# --- 5. the final norm's backward ----------------------------------------------------------


def test_the_final_norm_has_a_backward():
    """GPT-3 175B (plans/gpt3-175b.yaml: tp 8 with sequence parallelism, sequence 2,048):
    the final norm reads and writes the rank's 2,048 / 8 = 256 tokens of 12,288 bf16,
    2 × 256 × 12,288 × 2 = 12,582,912 B; its backward reads the saved input and the
    incoming gradient and writes the input gradient, three passes where the forward made
    two: 3 × 256 × 12,288 × 2 = 18,874,368 B (it was priced at twice the forward, four,
    until an audit read Transformer Engine's ``rmsnorm_bwd``/``layernorm_bwd``)."""
    plan = load_plan(PLANS / "gpt3-175b.yaml")
    norm = 2 * 256 * 12288 * 2
    assert norm == 12_582_912
    kernels = _bytes(flops.loss_work(plan, shapes(plan)))
    assert kernels["final norm"] == norm
    assert kernels["final norm backward"] == 3 * 256 * 12288 * 2 == 18_874_368
    loss = _bytes(_phase(plan, "loss", stage=7).works)
    assert loss["final norm backward"] == 18_874_368


def test_the_residual_adds_backward_is_the_gradients_sum_and_dropouts_mask():
    """The residual add passes its gradient on unchanged (PyTorch's ``add`` backward), so
    its backward is autograd summing the block input's two gradients, two reads and a write
    of the rank's [tokens, hidden] shard, and under dropout the mask's product before it, a
    read of the gradient and the 1-byte mask and a write. GPT-3 175B (tp 8 with sequence
    parallelism, dropout on): a shard of 256 × 12,288 bf16 is 6,291,456 B and its mask
    3,145,728 B, so the forward moves 3 × 6,291,456 + 3,145,728 = 22,020,096 B and the
    backward 5 × 6,291,456 + 3,145,728 = 34,603,008 B (it was priced at twice the forward,
    44,040,192). Llama 3 70B (no dropout, 8,192 / 8 tokens × 8,192): 3 × 16,777,216 =
    50,331,648 B either way."""
    shard, mask = 256 * 12288 * 2, 256 * 12288
    assert (shard, mask) == (6_291_456, 3_145_728)
    gpt3 = load_plan(PLANS / "gpt3-175b.yaml")
    for block in ("forward.attention", "forward.mlp"):
        assert _bytes(_phase(gpt3, block).works)["residual add and dropout"] == 22_020_096
    for block in ("backward.attention", "backward.mlp"):
        got = _bytes(_phase(gpt3, block).works)["residual add and dropout backward"]
        assert got == 5 * shard + mask == 34_603_008
    llama = load_plan(PLANS / "llama3-70b.yaml")
    shard = 1024 * 8192 * 2
    assert _bytes(_phase(llama, "forward.mlp").works)["residual add and dropout"] == 3 * shard
    back = _bytes(_phase(llama, "backward.mlp").works)["residual add and dropout backward"]
    assert back == 3 * shard == 50_331_648


# --- 6. GEMMs outside Transformer Engine under FP8 -----------------------------------------


def test_fp8_leaves_the_router_and_output_layer_operands_in_bf16(tmp_path):
    """Mixtral with an FP8 recipe and fp8 parameter gathers: the router (Megatron-Core's
    ``Router``, a plain bf16 parameter) and the output layer are not Transformer Engine
    modules and run in bf16, reading and writing 2-byte operands. Router: 2,048 tokens a
    rank × 4,096 into 8 experts: 2 × (2,048 × 4,096 + 2,048 × 8) + 2 × 4,096 × 8 =
    16,875,520 B (it read 8,437,760 at fp8's byte, weights too). Output layer: 4,096 tokens
    × 4,096 into 32,000 / tp 2 = 16,000 vocabulary rows: 2 × (4,096 × 4,096 + 4,096 ×
    16,000) + 2 × 4,096 × 16,000 = 295,698,432 B. Expert fc1, a TE GEMM, stays fp8."""
    fp8 = load_plan(
        variant(
            tmp_path,
            "fp8.yaml",
            ("  params: bf16", "  params: fp8"),  # --fp8-param-gather's FP8 parameters
            ("  activations: bf16", "  activations: bf16\n  matmul: fp8\n  param_gather: fp8"),
            base=MIXTRAL,
        )
    )
    bf16 = load_plan(MIXTRAL)
    assert flops.operands(fp8) == flops.Operands(1, 1)
    s = shapes(fp8)
    router = 2 * (2048 * 4096 + 2048 * 8) + 2 * 4096 * 8
    assert router == 16_875_520
    (r8,) = [w for w in flops.moe_forward(fp8, s) if w.name == "router"]
    (r16,) = [w for w in flops.moe_forward(bf16, shapes(bf16)) if w.name == "router"]
    assert (r8.bytes, r8.dtype) == (router, "bf16") and r16.bytes == router
    output = 2 * (4096 * 4096 + 4096 * 16000) + 2 * 4096 * 16000
    assert output == 295_698_432
    (out8,) = [w for w in flops.loss_work(fp8, s) if w.name == "output layer"]
    assert (out8.bytes, out8.dtype) == (output, "bf16")
    (out16,) = [w for w in flops.loss_work(bf16, shapes(bf16)) if w.name == "output layer"]
    assert schedule.work_time(fp8, out8) == schedule.work_time(bf16, out16)
    (fc1,) = [w for w in flops.moe_forward(fp8, s) if w.name == "expert fc1"]
    assert fc1.dtype is None  # precision.matmul: fp8, 1-byte operands
    (fc1_bf16,) = [w for w in flops.moe_forward(bf16, shapes(bf16)) if w.name == "expert fc1"]
    assert fc1.bytes < fc1_bf16.bytes


# --- 7. the module's docstring --------------------------------------------------------------


def test_the_module_names_the_function_that_times_a_work():
    """`schedule.work_time` turns a Work into seconds; `compute.op_time` takes numbers."""
    assert "`schedule.work_time` turns it into seconds" in (flops.__doc__ or "")
    assert callable(schedule.work_time)


@pytest.mark.parametrize("plan_file", [DEEPSEEK, MIXTRAL])
def test_moe_kernel_bytes_are_integers(plan_file):
    """Bytes are integers, the new kernels' among them."""
    plan = load_plan(plan_file)
    for w in flops.moe_forward(plan, shapes(plan)):
        assert isinstance(w.bytes, int), w.name
