"""Peaks are sums of what is alive together, and they name what overlaps."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget.accuracy import plan_of
from budget.layers import attention_saved, params_total, shapes
from budget.memory import memory
from budget.phases import CARRIED_ACTIVATIONS, Instant
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Precision
from budget.step import derive
from tests.builders import GIB, make_plan
from tests.plan_files import ROOT, variant


def _mem(plan):
    return memory(derive(plan), plan.device.memory)


def test_peak_is_the_largest_instant_and_the_sum_of_its_overlap():
    """The peak is the instant of the stage with the most bytes alive, the earliest of
    equals, summed here from its allocations (an audit: the test had compared the peak with
    the list it was made from, which could not fail)."""
    plan = make_plan(pp=2, tp=2, sp=True, recompute="selective")
    step = derive(plan)
    mem = memory(step, plan.device.memory)
    for stage, peak in zip(step.stages, mem.stages, strict=True):
        instants = [(p.name, i) for p in stage.phases for i in p.instants]
        sums = [sum(a.total for a in i.live) for _, i in instants]
        first = sums.index(max(sums))
        assert len(set(sums)) > 1  # there is a largest to find
        assert peak.peak_bytes == max(sums)
        assert (peak.peak_phase, peak.peak_instant) == (
            instants[first][0],
            instants[first][1].label,
        )
        assert peak.peak_bytes == sum(a.total for a in peak.peak_overlap)
        assert peak.peak_bytes == sum(peak.by_category.values())


def test_sequence_parallel_peak_names_the_gathered_buffer_and_its_shard():
    """DESIGN.md rule 2 / issue 2 acceptance 5: an all-gather that materialises the full
    tensor while the shard stays alive costs full + shard at that instant."""
    plan = make_plan(tp=8, sp=True, recompute="selective")
    (stage, *_) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "backward.mlp"]
    (instant,) = [i for i in phase.instants if i.label == "fc1 weight and input gradients"]
    names = {a.name: a for a in instant.live}
    full = names["fc1 input (re-gathered for weight grad)"]
    shard = names["MLP fc1 input"]
    assert full.category == "transient"
    assert shard.category == "activations"
    assert full.total == 8 * shard.total  # tp = 8: the full tensor is 8 shards
    assert "shard(0)" in shard.placement


def test_worst_stage_is_the_first_under_1f1b():
    """Under 1F1B stage k holds p - k micro-batches in flight (Narayanan et al., arXiv
    2104.04473, section 2.2.1), so each stage from 1 to 6 holds one micro-batch of its 12
    layers fewer than the one before it and the same parameters. GPT-3 at tp 8 with
    sequence parallelism, no recompute, flash attention, no dropout: a layer saves
    Korthikanti's 34sbh/t less its two 1-byte dropout masks (2sbh/t), 32sbh/t, plus the
    flash kernel's fp32 softmax statistics, 4 B x a/t heads x s rows. Stage 0 holds the
    word embedding besides, V·h/t parameters at 2 + 4 + 12/16 = 6.75 B each (bf16
    parameters, fp32 gradients, fp32 master and Adam moments over dp 16 under ZeRO-1)."""
    mem = _mem(make_plan(recompute="none"))
    assert mem.worst.stage == 0
    peaks = [s.peak_bytes for s in mem.stages[:-1]]
    assert peaks == sorted(peaks, reverse=True)
    s, h, a, t = 2048, 12288, 96, 8
    micro_batch = 12 * (32 * s * h // t + 4 * (a // t) * s)  # 12 layers' saved tensors
    assert micro_batch == 12 * (100_663_296 + 98_304) == 1_209_139_200
    steps = [k - n for k, n in pairwise(peaks)]
    assert steps[1:] == [micro_batch] * 5  # stages 1 to 6
    embedding = 27 * (51200 * h // t) // 4  # 6.75 B x 78,643,200 parameters
    assert steps[0] == micro_batch + embedding == 1_209_139_200 + 530_841_600


def test_reserved_memory_is_part_of_every_peak():
    plain, reserved = _mem(make_plan()), _mem(make_plan(reserved=3 * GIB))
    for a, b in zip(plain.stages, reserved.stages, strict=True):
        assert b.peak_bytes - a.peak_bytes == 3 * GIB


def test_full_recompute_peak_includes_one_recomputed_layer():
    """GPT-3 at tp 8 and pp 8 without sequence parallelism, full recompute (Korthikanti et
    al., arXiv 2205.05198, Table 2: 2sbh a layer, the layer's input, whole on every tp
    rank), stage 0 at the fc2 backward of its first layer, 1F1B's 8 micro-batches of 12
    layers in flight: 95 earlier layer passes carried as their checkpoints, the current
    layer's checkpoint and its recomputed forward with its output, and the fc2 backward's
    gradients. The
    recomputed forward's attention norm saves the checkpoint itself, which Megatron-LM's
    ``CheckpointFunction.backward`` hands it detached (``detach_variable``, one storage): an
    audit found it counted twice, 2sbh = 50,331,648 B over.
    No reserved memory, no dropout, no biases, rotary positions (`make_plan`)."""
    mem = _mem(make_plan(recompute="full", sp=False))
    names = [a.name for a in mem.worst.peak_overlap]
    assert any(n.endswith("(recomputed)") for n in names)
    s, h, a, t = 2048, 12288, 96, 8
    sbh2 = 2 * s * h  # a bf16 s x h tensor: 50,331,648 B
    held = {o.name: o.total for o in mem.worst.peak_overlap}
    carried = held["saved activations, 95 earlier layer passes"]
    assert carried == 95 * sbh2 == 95 * 50_331_648 == 4_781_506_560
    # stage 0's parameters: 12 layers of 12h²/8 + 4h (two LayerNorms) and the word
    # embedding's vocabulary shard 51200·h/8
    psi = 12 * (12 * h * h // t + 4 * h) + 51200 * h // t
    assert psi == 2_797_142_016
    states = 2 * psi + 4 * psi + (4 + 8) * psi // 16  # bf16, fp32 grads, ZeRO-1 over dp 16
    assert "attention norm input (recomputed)" not in held and "layer input (checkpoint)" in held
    recomputed = (
        3 * sbh2  # QKV input, MLP norm input, fc1 input (whole); the norm's is the checkpoint
        + 2 * (2 * s * 4 * h // t)  # GeLU input and fc2 input, 4h wide, split over tp
        + 4 * (2 * s * h // t)  # Q, K, V and the projection input, split by heads
        + 4 * (a // t) * s  # the flash kernel's fp32 softmax statistics
    )
    gradients = sbh2 + 2 * s * 4 * h // t  # output gradient (whole) and fc2 input gradient
    # the recomputed forward's output, which ``CheckpointFunction.backward`` keeps until the
    # layer's backward returns (an audit, m459), whole without sequence parallelism
    kept = sbh2
    # + this layer's checkpoint
    expected = states + 95 * sbh2 + sbh2 + recomputed + gradients + kept
    assert expected == (
        18_880_708_608 + 4_781_506_560 + 50_331_648 + 226_590_720 + 75_497_472 + 50_331_648
    )
    assert mem.worst.stage == 0 and mem.worst.peak_phase == "backward.mlp"
    assert mem.worst.peak_bytes == expected == 24_064_966_656


def test_a_plan_that_does_not_fit_says_so():
    mem = _mem(make_plan(tp=1, pp=1, dp=1024, zero=0, sp=False, global_batch=1024))
    assert not mem.fits
    assert mem.peak_bytes > 80 * GIB


def test_zero3_holds_the_block_its_gradients_and_the_prefetched_next_block():
    """GPT-3 at tp 8 under ZeRO-3, in the MLP's backward: the MLP block gathered (8h²/8
    weights + 2h LayerNorm = 151,019,520 parameters, 2 B each), its gradients whole until
    their reduce-scatter (fp32: 604,078,080 B, as ZeRO-2's bucket; DeepSpeed's ZeRO-3
    estimate reserves the largest layer's gradients), and, with overlap.param_gather, the
    attention block prefetched behind it (4h²/8 + 2h = 75,522,048 parameters), not a second
    copy of the MLP block, which was counted with or without the prefetch (review)."""
    h = 12288
    mlp, attention = 8 * h * h // 8 + 2 * h, 4 * h * h // 8 + 2 * h

    def held(plan) -> dict[str, int]:
        (stage,) = derive(plan).stages
        (phase,) = [p for p in stage.phases if p.name == "backward.mlp"]
        instant = phase.instants[-1]  # fc1 weight and input gradients
        return {
            a.name: a.bytes
            for a in instant.live
            if "gradients before" in a.name or a.name.startswith("gathered parameters (")
        }

    plan = make_plan(zero=3, tp=8, pp=1, dp=128, global_batch=1536)
    assert held(plan) == {
        "gathered parameters (this block)": 2 * mlp,
        "gradients before reduce-scatter": 4 * mlp,
    }
    prefetching = replace(plan, overlap=replace(plan.overlap, param_gather=True))
    assert held(prefetching) == {
        "gathered parameters (this block)": 2 * mlp,
        "gathered parameters (prefetched attention)": 2 * attention,
        "gradients before reduce-scatter": 4 * mlp,
    }


def test_zero3_overlapped_reduction_keeps_the_previous_blocks_gradients_alive():
    """With overlap.dp_grads the MLP's reduce-scatter runs behind its layer's attention
    backward (FSDP's backward overlap), so the MLP's whole gradients are still held there:
    GPT-3 at tp 8, 151,019,520 fp32 parameters = 604,078,080 B beside the attention's own
    4 · 75,522,048 (it was freed as soon as the attention started: an audit). Behind the
    stage's last MLP runs the head's reduction, whose gradients are held already; behind
    the MLP of the layer below it runs the attention's above, 4 · 75,522,048 B held there,
    with the last layer's saved tensors freed (an audit: that MLP's instants were in no
    phase, and the attention's gradients in none of its peaks)."""
    h = 12288
    mlp, attention = 8 * h * h // 8 + 2 * h, 4 * h * h // 8 + 2 * h
    plan = make_plan(zero=3, tp=8, pp=1, dp=128, global_batch=1536)
    overlapped = replace(plan, overlap=replace(plan.overlap, dp_grads=True))

    def instants(plan, phase: str) -> tuple[Instant, ...]:
        (stage,) = derive(plan).stages
        (found,) = [p for p in stage.phases if p.name == phase]
        return found.instants

    def grads(plan, phase: str, at: int = -1) -> dict[str, int]:
        wanted = ("gradients before reduce-scatter", "reduce-scattering")
        live = instants(plan, phase)[at].live
        return {a.name: a.bytes for a in live if any(w in a.name for w in wanted)}

    assert grads(overlapped, "backward.attention") == {
        "gradients before reduce-scatter": 4 * attention,
        "gradients of the previous mlp block (reduce-scattering)": 4 * mlp,
    }
    assert grads(plan, "backward.attention") == {"gradients before reduce-scatter": 4 * attention}
    assert grads(overlapped, "backward.mlp", 2) == {"gradients before reduce-scatter": 4 * mlp}
    top, below = instants(overlapped, "backward.mlp")[2::3]
    assert below.label == top.label + ", a layer lower"
    assert grads(overlapped, "backward.mlp") == {
        "gradients before reduce-scatter": 4 * mlp,
        "gradients of the attention above (reduce-scattering)": 4 * attention,
    }
    saved = [
        {a.name: a.bytes for a in i.live if a.name.startswith(CARRIED_ACTIVATIONS)}
        for i in (top, below)
    ]
    ((top_name, top_saved),), ((below_name, below_saved),) = (s.items() for s in saved)
    # a layer's saved tensors under selective recompute and sequence parallelism, without
    # dropout: 8 of 2sbh/t (norm, QKV, Q, K, V, projection, norm, fc1 inputs), GeLU's
    # and fc2's inputs, 8sbh/t each, and the QKV output's Q and K columns, which V (a view
    # of it) holds where the rotary embedding writes Q and K anew (`layers._qkv_held_by_v`),
    # 2 of 2sbh/t: 36sbh/t = 113,246,208 B
    current = 36 * 2048 * h // 8
    assert top_saved - below_saved == current  # one layer pass fewer
    assert (top_name, below_name) == (
        f"{CARRIED_ACTIVATIONS}, 95 earlier layer passes",
        f"{CARRIED_ACTIVATIONS}, 94 earlier layer passes",
    )
    assert below.total - top.total == 4 * attention - current
    assert len(instants(plan, "backward.mlp")) == 3  # no overlap, nothing behind the MLP


@settings(max_examples=40, deadline=None)
@given(
    micro=st.sampled_from([1, 2, 3, 4]),
    tp=st.sampled_from([1, 2, 4, 8]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    sp=st.booleans(),
    zero=st.integers(0, 3),
)
def test_memory_is_monotone_in_micro_batch(micro, tp, recompute, sp, zero):
    def peak(m):
        plan = make_plan(
            micro=m,
            tp=tp,
            dp=128 // tp,
            pp=1 if zero == 3 else 8,  # ZeRO 3 is priced without a pipeline only
            sp=sp and tp > 1,
            recompute=recompute,
            zero=zero,
            global_batch=128 // tp * m * 12,
        )
        return [s.peak_bytes for s in _mem(plan).stages]

    smaller, larger = peak(micro), peak(micro + 1)
    assert all(b >= a for a, b in zip(smaller, larger, strict=True))


def test_the_loss_peak_holds_the_logits_and_one_fp32_buffer():
    """Megatron's vocab-parallel cross-entropy turns its fp32 copy of the logits into the
    softmax in place and writes the gradient into that buffer, so gpt-1.3b's loss peak (its
    worst instant) holds the bf16 logits and one fp32 buffer: 2 + 4 B x 8,192 tokens x
    50,304 / 1 = 824,180,736 + 1,648,361,472 B. It counted a separate fp32 gradient too,
    1,648,361,472 B more, a peak of 30,175,369,216 B where it is 28,527,007,744."""
    report = build_report(load_plan(ROOT / "plans" / "gpt-1.3b.yaml"))
    (stage,) = report.stages
    assert (stage.peak_phase, stage.peak_instant) == ("loss", "cross-entropy")
    logits = {o.tensor: o.bytes for o in stage.peak_overlap if o.tensor.startswith("logits")}
    tokens = 4 * 2048  # micro-batch 4 of 2,048 tokens
    assert sorted(logits.values()) == [2 * tokens * 50304, 4 * tokens * 50304]


def test_full_recompute_holds_the_recomputed_attention_through_the_mlp_backward(tmp_path):
    """Full recompute runs a layer's whole forward again before its backward, so the MLP's
    backward happens beside the attention's recomputed tensors. Llama 3 70B at tp 8 with
    sequence parallelism, 8,192 tokens: the attention's QKV input (16 MiB, s·b·h·2 B / tp),
    Q (64 / 8 heads x 128 x 8,192 x 2 B = 16 MiB), K and V (2 MiB each), the output
    projection's input (16 MiB) and the flash kernel's softmax statistics (8 heads x 8,192 x
    4 B = 256 KiB): 71,565,312 B it left out (review), less the norm's input, which is the
    layer's checkpoint, counted once (an audit)."""
    from tests.plan_files import variant

    edit = ("recompute: selective", "recompute: full")
    plan = load_plan(variant(tmp_path, "full.yaml", edit, base=ROOT / "plans" / "llama3-70b.yaml"))
    stage = derive(plan).stages[0]
    (phase,) = [p for p in stage.phases if p.name == "backward.mlp"]
    mib = 2**20
    for instant in phase.instants:
        attention = [
            a.total
            for a in instant.live
            if a.name.startswith("attention ") and a.name.endswith("(recomputed)")
        ]
        assert sum(attention) == (16 + 16 + 2 + 2 + 16) * mib + 8 * 8192 * 4


@pytest.mark.parametrize(
    ("sp", "early", "kept"), [(True, False, 16), (False, False, 128), (True, True, 0)]
)
def test_a_reentrant_checkpoint_keeps_its_recomputed_output_through_the_layer_backward(
    tmp_path, sp, early, kept
):
    """Megatron-LM's ``CheckpointFunction.backward`` runs the layer's forward again and
    keeps its output in a local until the layer's backward returns (an audit, m459: not
    counted). Llama 3 70B at tp 8, 8,192 tokens: 8,192 x 8,192 x 2 B = 128 MiB, 16 MiB a
    rank under sequence parallelism, in every instant of the layer's backward; PyTorch's
    non-reentrant checkpoint, which stops early, drops it."""
    from tests.plan_files import variant

    edits = [
        (
            "recompute: selective",
            "recompute: full" + ("\nrecompute_early_stop: true" if early else ""),
        )
    ]
    if not sp:
        edits.append(("  sequence_parallel: true\n", "  sequence_parallel: false\n"))
    base = ROOT / "plans" / "llama3-70b.yaml"
    plan = load_plan(variant(tmp_path, "full.yaml", *edits, base=base))
    stage = derive(plan).stages[0]
    name = "layer output (recomputed, kept by the checkpoint's backward)"
    for phase in stage.phases:
        for instant in phase.instants:
            held = sum(a.total for a in instant.live if a.name == name)
            layer = phase.name in ("backward.attention", "backward.mlp")
            assert held == (kept * 2**20 if layer else 0), (phase.name, instant.label)


@pytest.mark.parametrize(
    ("attention", "fp8", "kept"),
    [("eager", False, 6_291_456), ("flash", False, 0), ("flash", True, 0)],
)
def test_selective_recompute_keeps_the_cores_recomputed_output_through_its_backward(
    attention, fp8, kept
):
    """Selective recompute checkpoints the attention core reentrantly, so its output made
    again is kept until the core's backward returns (an audit, m459: not counted under eager
    attention, whose projection has freed the original by then). GPT-3 at tp 8: 2,048
    tokens x 96 / 8 heads x 128 x 2 B = 6,291,456 B at the core's gradients. A fused
    kernel saves its own output, still counted, so nothing stands apart there, under FP8
    too (a review, m461: counted twice there)."""
    from dataclasses import replace as swap

    from tests.plan_files import GPT3

    plan = load_plan(GPT3)
    plan = swap(plan, model=swap(plan.model, attention=attention))
    if fp8:
        plan = swap(plan, precision=swap(plan.precision, matmul="fp8"))
    assert plan.recompute == "selective"
    (phase,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    (instant,) = [i for i in phase.instants if i.label == "attention core gradients"]
    name = "attention core output (recomputed, kept by the checkpoint's backward)"
    assert sum(a.total for a in instant.live if a.name == name) == kept


def _alive(p: int, v: int, m: int, rank: int, chunk: int) -> int:
    """Most micro-batches whose `chunk` on `rank` has run forward but not backward, replaying
    Megatron-LM's interleaved order: (p - rank - 1)·2 + (v - 1)·p warm-up forwards, then one
    forward and one backward; forwards walk chunks 0 ... v-1 in runs of p micro-batches,
    backwards walk them v-1 ... 0."""
    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    alive: set[int] = set()
    most = forward = backward = 0

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    while backward < total:
        if forward < total and (forward < warmup or forward - warmup <= backward):
            if (forward // p) % v == chunk:
                alive.add(micro(forward))
            forward += 1
            most = max(most, len(alive))
        else:
            if v - 1 - (backward // p) % v == chunk:
                alive.discard(micro(backward))
            backward += 1
    return most


def test_interleaving_keeps_the_embedding_of_2p_micro_batches_and_the_head_of_one():
    """The embedding's tensors live in stage 0's first chunk and the head's in the last
    stage's last chunk, so their counts follow those chunks, not the stage's in-flight
    units rounded (GPT-3, p 8, v 2: 12 embedding dropout masks where 16 micro-batches are
    alive, and 4 head inputs where 1 is; review). Checked against a replay of the order."""
    from budget.step import outside_counts

    for p, v, m in ((8, 2, 96), (4, 3, 24), (4, 2, 8), (16, 4, 128), (2, 5, 4)):
        plan = make_plan(pp=p, schedule="interleaved", virtual_stages=v, global_batch=16 * m)
        first, last = outside_counts(plan, 0.0, m)
        assert (first, last) == (_alive(p, v, m, 0, 0), _alive(p, v, m, p - 1, v - 1)), (p, v, m)
    plan = make_plan(pp=8, schedule="interleaved", virtual_stages=2, dropout=True)
    stages = derive(plan).stages
    assert _counts(stages[0], "embedding dropout mask") == {
        **{phase: {16} for phase in _LAYER_PHASES},
        "backward.embedding": {15},  # the current one's read by the dropout's backward
    }
    assert _counts(stages[-1], "output layer input") == {"loss": {1}}


_LAYER_PHASES = ("forward.attention", "forward.mlp", "backward.mlp", "backward.attention")


def _counts(stage, name: str) -> dict[str, set[int]]:
    """The counts `name` is alive with in each phase of `stage` that holds it."""
    out: dict[str, set[int]] = {}
    for phase in stage.phases:
        for instant in phase.instants:
            for a in instant.live:
                if a.name == name and a.total:
                    out.setdefault(phase.name, set()).add(a.count)
    return out


def test_the_head_s_inputs_live_from_its_forward_to_its_backward():
    """The final norm's and the output layer's inputs of the micro-batch being worked on
    exist from the head's forward (the loss phase) until its backward, which runs before
    the layers' backward; the others in flight keep theirs throughout (an audit: the
    current one's were counted in every phase, on Llama 3 405B at 128K tokens the last
    stage's peak 2 · 33,554,432 B high, 8,192 tokens / 8 (sequence-parallel) · 16,384 ·
    2 B each). 1F1B's last stage holds one micro-batch, so they are the loss's alone;
    GPipe's holds all m = 8 before its first backward: m - 1 outside the loss."""
    one = derive(make_plan(global_batch=128)).stages[-1]
    assert _counts(one, "final norm input") == _counts(one, "output layer input") == {"loss": {1}}
    gpipe = derive(make_plan(schedule="gpipe", global_batch=128)).stages[-1]
    assert gpipe.inflight == 8
    assert _counts(gpipe, "output layer input") == {
        **{phase: {7} for phase in _LAYER_PHASES},
        "loss": {8},
    }
    plan = load_plan(ROOT / "plans" / "llama3-405b-128k.yaml")
    stage = derive(plan).stages[-1]
    assert _counts(stage, "final norm input") == _counts(stage, "output layer input")
    assert _counts(stage, "output layer input") == {"loss": {1}}
    (loss,) = [p for p in stage.phases if p.name == "loss"]
    sizes = {a.name: a.total for i in loss.instants for a in i.live}
    assert sizes["final norm input"] == sizes["output layer input"] == 33_554_432


def _most_held(p: int, v: int, m: int, rank: int, chunks: list[int]) -> int:
    """Most layer passes saved at once on `rank` whose model chunks hold `chunks` layers,
    replaying Megatron-LM's interleaved order micro-batch by micro-batch (as `_alive` does)
    and summing the layers of every (micro-batch, chunk) whose forward has run and whose
    backward has not."""
    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    alive: set[tuple[int, int]] = set()
    most = forward = backward = 0

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    while backward < total:
        if forward < total and (forward < warmup or forward - warmup <= backward):
            alive.add((micro(forward), (forward // p) % v))
            forward += 1
            most = max(most, sum(chunks[c] for _, c in alive))
        else:
            alive.remove((micro(backward), v - 1 - (backward // p) % v))
            backward += 1
    return most


def _passes(stage) -> int:
    """Layer passes a stage's peak holds: the earlier ones its label counts and the current."""
    (carried,) = [a for a in stage.peak_overlap if "earlier layer passes" in a.tensor]
    return int(carried.tensor.split(", ")[1].split()[0]) + 1, carried.bytes


def test_interleaved_stages_of_unlike_chunks_hold_what_the_order_holds(tmp_path):
    """A split of p·v chunks can give a stage chunks of different sizes; its in-flight
    activations are then not the warm-up's chunk count over v times its layers. GPT-3 at
    pp 8, v 2 with stage 0 in chunks of 10 and 2 layers (its others 6 and 6): the even rule
    said 138 layer passes where the order holds 174 (10 · 15 + 2 · 8 as its first backward
    starts, and 8 more a period later, when a 10-layer forward follows a 2-layer backward).
    Every stage is checked against a replay, at m = 96 and at m = p = 8; the bytes are the
    passes times 34·s·b·h / t (Korthikanti et al. eq. 5 with sequence parallelism and
    selective recompute: 34 · 2048 · 12288 / 8 = 106,954,752)."""
    from tests.plan_files import variant

    held: dict[tuple[int, int, int], int] = {}
    for first, name in ((10, "wide-first.yaml"), (2, "narrow-first.yaml")):
        sizes = [first] + [6] * 7 + [12 - first] + [6] * 7
        for global_batch in (1536, 128):  # m = 96 and m = 8 = p
            path = variant(
                tmp_path,
                name,
                (
                    "pipeline: {schedule: 1f1b}",
                    f"pipeline: {{schedule: interleaved, "
                    f"virtual_stages: 2, layers_per_stage: {sizes}}}",
                ),
                ("global: 1536", f"global: {global_batch}"),
            )
            report = build_report(load_plan(path))
            m = global_batch // 16
            for stage in report.stages:
                chunks = [sizes[stage.stage], sizes[stage.stage + 8]]
                if not any("earlier layer passes" in a.tensor for a in stage.peak_overlap):
                    continue  # a later stage, whose gradients outweigh its activations
                passes, carried = _passes(stage)
                held[first, m, stage.stage] = passes
                assert passes == _most_held(8, 2, m, stage.stage, chunks), (first, m, stage)
                # the current layer's tensors are itemised apart from the carried ones
                assert carried == (passes - 1) * 106_954_752
    assert len(held) >= 8
    # by hand: 15 forwards of the 10-layer chunk and 8 of the 2-layer one, then 8 more
    assert held[10, 96, 0] == 10 * 15 + 2 * 8 + 8 == 174


# GPT-3 175B as shipped (plans/gpt3-175b.yaml: tp 8, pp 8, dp 16, ZeRO-1, sequence
# parallelism, selective recompute, linear biases, learned positions, dropout, 3 GiB
# reserved), stage 0 (12 layers and the embedding), worked out by hand.
_S, _H, _T = 2048, 12288, 8
# Parameters a rank holds: each layer's 12h²/8 weights, its column-parallel QKV and fc1
# biases (3h + 4h)/8, its row-parallel projection and fc2 biases (h + h, replicated) and
# its two LayerNorms (2 x 2h); the word embedding's vocabulary shard 51200·h/8; the learned
# position table, 2048·h, replicated over tp.
_PSI = 12 * (12 * _H * _H // _T + 7 * _H // _T + 2 * _H + 4 * _H) + 51200 * _H // _T + 2048 * _H
# bf16 parameters (2 B), fp32 gradients (4 B), fp32 master (4 B) and Adam moments (8 B)
# sharded over dp 16 by ZeRO-1: 6.75 B a parameter
_STATES = 2 * _PSI + 4 * _PSI + (4 + 8) * _PSI // 16
_RESERVED = 3 * 2**30  # device: {reserved: 3 GiB}, the plan's runtime/NCCL/allocator reserve
_SHARD = 2 * _S * _H // _T  # a bf16 s x h tensor, one sequence shard: 6,291,456 B
_FULL = 2 * _S * _H  # the same tensor all-gathered over tp: 50,331,648 B
_MASK = _S * _H // _T  # a 1-byte dropout mask of one shard: 3,145,728 B
_FFN = 2 * _S * 4 * _H // _T  # a bf16 s x 4h tensor split over tp: 25,165,824 B
# Korthikanti et al. (arXiv 2205.05198) eq. 5 with sequence parallelism and selective
# recompute: 34sbh/t a layer, here 8 shards (both norm inputs, QKV input, Q, K, V, the
# projection input, fc1 input), 2 dropout masks and the GeLU and fc2 inputs (4h wide)
_LAYER = 34 * _S * _H // _T
assert _LAYER == 8 * _SHARD + 2 * _MASK + 2 * _FFN == 106_954_752
# alive at every backward instant of stage 0's first layer: the model states, the reserve,
# the 95 earlier layer passes of 1F1B's 8 micro-batches x 12 layers, and the embedding's
# dropout mask of each of those 8 micro-batches
_BASE = _STATES + _RESERVED + 95 * _LAYER + 8 * _MASK
# the fc2 backward: the current layer's saved tensors still held but the MLP's dropout
# mask, which the bias-dropout-add's backward, the block's first, has spent (an audit), the
# output gradient (a shard), its all-gathered copy and fc2's input gradient
_FC2_INSTANT = _BASE + _LAYER - _MASK + _SHARD + _FULL + _FFN
# the fc1 backward, the stage's peak: the layer's saved tensors less the MLP's mask and
# fc2's and the GeLU's inputs (spent), the output gradient, the GeLU input gradient, the
# re-gathered fc1 input, its partial input gradient (whole) and the reduce-scatter's shard
_MLP_PEAK = _BASE + _LAYER - _MASK - 2 * _FFN + _SHARD + _FFN + 2 * _FULL + _SHARD
# the QKV backward: the norm and QKV inputs still saved, the output gradient, the Q/K/V
# gradients (3 shards), the re-gathered QKV input, its partial input gradient (whole) and
# the reduce-scatter's shard of it
_QKV_INSTANT = _BASE + 2 * _SHARD + _SHARD + 3 * _SHARD + 2 * _FULL + _SHARD


def _check_gpt3_states(overlap) -> None:
    """The model states and reserve of GPT-3's stage 0 peak, term by term."""
    held = {o.tensor: o.bytes for o in overlap}
    assert _PSI == 2_822_731_776
    assert held["parameters (bf16)"] == 2 * _PSI
    assert held["gradients (fp32)"] == 4 * _PSI
    assert held["master weights (fp32)"] == 4 * _PSI // 16
    assert held["Adam moments (fp32)"] == 8 * _PSI // 16
    assert held["reserved (runtime, NCCL, allocator)"] == _RESERVED
    assert held["saved activations, 95 earlier layer passes"] == 95 * _LAYER
    assert held["embedding dropout mask"] == 8 * _MASK


def test_the_mlp_backward_frees_each_saved_tensor_once_its_node_has_run():
    """PyTorch frees a node's saved tensors after its backward: the dropout mask after the
    bias-dropout-add's, fc2's input after fc2's backward, the activation's input after the
    activation's, so the fc1 backward holds none of them (it held all three: audits). GPT-3
    as shipped (tp 8, sp, selective), stage 0: the fc2 backward holds the output gradient,
    its all-gathered copy and fc2's input gradient, 6,291,456 + 50,331,648 + 25,165,824 =
    81,788,928 B of transients; the fc1 backward the re-gathered fc1 input and its partial
    gradient (2 x 50,331,648), the reduce-scatter's 6,291,456 B shard of it (a seeds audit:
    left out, the fc1 instant tied the fc2 one) and the output and activation gradients,
    beside neither freed 25,165,824 B tensor: 32,646,130,176 B at fc2, 32,652,421,632 B at
    fc1, the peak (it read 32,699,607,552 before the frees, 32,655,567,360 with the
    3,145,728 B mask held). At tp 1 the fc1 input gradient is a whole tensor, not a partial
    one, and is still held (gpt-1.3b: 4 x 2048 x 2048 x 2 B)."""
    from tests.plan_files import GPT3

    report = build_report(load_plan(GPT3))
    (mlp,) = [p for p in report.phases if p.name == "backward.mlp"]
    # 19,053,439,488 states + 3 GiB + 95 x 106,954,752 + 8 x 3,145,728 + 106,954,752
    # (this layer) - 3,145,728 (its MLP mask) + 6,291,456 + 50,331,648 + 25,165,824
    assert _FC2_INSTANT == (
        19_053_439_488
        + 3_221_225_472
        + 10_160_701_440
        + 25_165_824
        + 106_954_752
        - 3_145_728
        + 81_788_928
    )
    # the same less fc2's and the GeLU's inputs (2 x 25,165,824), with 6,291,456 (output
    # gradient) + 25,165,824 (GeLU input gradient) + 2 x 50,331,648 + 6,291,456 (shard)
    assert _MLP_PEAK == (
        19_053_439_488
        + 3_221_225_472
        + 10_160_701_440
        + 25_165_824
        + 106_954_752
        - 3_145_728
        - 50_331_648
        + 6_291_456
        + 25_165_824
        + 100_663_296
        + 6_291_456
    )
    assert (_FC2_INSTANT, _MLP_PEAK) == (32_646_130_176, 32_652_421_632)
    assert mlp.peak_bytes == _MLP_PEAK
    (stage0, *_) = report.stages
    assert (stage0.peak_phase, stage0.peak_instant) == (
        "backward.mlp",
        "fc1 weight and input gradients",
    )
    _check_gpt3_states(stage0.peak_overlap)
    (stage, *_) = derive(load_plan(GPT3)).stages
    (phase,) = [p for p in stage.phases if p.name == "backward.mlp"]
    live = {i.label: {a.name: a.total for a in i.live} for i in phase.instants}
    assert list(live) == ["fc2 gradients", "activation gradients", "fc1 weight and input gradients"]
    transients = {
        label: sum(b for n, b in held.items() if n in _TRANSIENTS) for label, held in live.items()
    }
    assert transients["fc2 gradients"] == 6_291_456 + 50_331_648 + 25_165_824
    assert sum(a.total for a in phase.instants[0].live) == _FC2_INSTANT
    assert "MLP fc2 input" in live["fc2 gradients"]
    assert "MLP fc2 input" not in live["activation gradients"]
    assert "MLP GeLU input" in live["activation gradients"]
    fc1 = live["fc1 weight and input gradients"]
    assert "MLP fc2 input" not in fc1 and "MLP GeLU input" not in fc1
    assert (
        fc1["fc1 input (re-gathered for weight grad)"]
        == fc1["fc1 input gradient (partial, before reduction)"]
        == 50_331_648
    )
    assert fc1["fc1 input gradient (reduce-scattered)"] == 6_291_456
    single = derive(load_plan(ROOT / "plans" / "gpt-1.3b.yaml")).stages[0]
    (phase,) = [p for p in single.phases if p.name == "backward.mlp"]
    fc1 = {a.name: a.total for a in phase.instants[-1].live}
    assert fc1["fc1 input gradient"] == 4 * 2048 * 2048 * 2
    assert not [n for n in fc1 if "reduce-scattered" in n]  # no reduction at tp 1


_TRANSIENTS = (
    "output gradient",
    "output gradient (all-gathered)",
    "fc2 input gradient",
    "activation-function input gradient",
    "fc1 input (re-gathered for weight grad)",
    "fc1 input gradient (partial, before reduction)",
)


def test_the_qkv_backward_holds_its_regathered_input_and_partial_gradient():
    """The attention's column-parallel QKV projection runs its backward as fc1 does: under
    sequence parallelism its input gathered again for the weight gradient (2sbh) beside
    its input gradient, partial on tp (2sbh), with the Q/K/V gradients; by then the core's
    and the output projection's saved tensors are spent, and so are the layer's MLP
    tensors, whose backward ran first (a review found them still held: 66,060,288 B on
    GPT-3). GPT-3 as shipped: the QKV instant holds 2 x 50,331,648 B gathered and partial
    and the reduce-scatter's 6,291,456 B shard, and comes to 32,605,235,712 B, below the
    MLP backward's 32,655,567,360 B peak."""
    from tests.plan_files import GPT3

    plan = load_plan(GPT3)
    (stage, *_) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "backward.attention"]
    (core, qkv) = phase.instants
    held = {a.name: a.total for a in qkv.live}
    assert held["QKV input (re-gathered for weight grad)"] == 50_331_648
    assert held["QKV input gradient (partial, before reduction)"] == 50_331_648
    assert held["QKV input gradient (reduce-scattered)"] == 6_291_456
    assert "attention Q" not in held and "attention projection input" not in held
    assert "attention QKV input" in held  # the weight gradient reads its shard's gather
    for instant in (core, qkv):
        assert not [a for a in instant.live if a.name.startswith("MLP ")], instant.label
    assert held["Q/K/V gradients"] == 3 * _SHARD
    # 19,053,439,488 states + 3 GiB + 95 x 106,954,752 + 8 x 3,145,728 + 2 x 6,291,456
    # (norm and QKV inputs) + 6,291,456 (output gradient) + 18,874,368 (Q/K/V gradients)
    # + 2 x 50,331,648 (re-gathered input, partial input gradient) + 6,291,456 (its shard)
    assert _QKV_INSTANT == (
        19_053_439_488
        + 3_221_225_472
        + 10_160_701_440
        + 25_165_824
        + 12_582_912
        + 6_291_456
        + 18_874_368
        + 100_663_296
        + 6_291_456
    )
    assert qkv.total == _QKV_INSTANT == 32_605_235_712
    report = build_report(plan)
    assert (report.worst.peak_bytes, report.worst.peak_phase) == (32_652_421_632, "backward.mlp")
    assert report.worst.peak_bytes == _MLP_PEAK > _QKV_INSTANT


def test_gpipe_keeps_every_earlier_micro_batch_s_softmax_on_the_last_stage():
    """Under GPipe every forward and its loss run before the first backward, so at the last
    micro-batch's cross-entropy the last stage holds the fp32 softmax that each of the m - 1
    earlier ones saved for its backward (Korthikanti section 4.3: 4sbv/t each); 1F1B runs
    each loss's backward at once and holds none (an audit: GPipe counted one). GPT-3,
    tp 8, s = 2048, b = 1, m = 1536 / 16 = 96: one softmax is 4 · 2048 · 51,200 / 8 =
    52,428,800 B per rank."""
    gpipe = derive(make_plan(schedule="gpipe")).stages[-1]
    one_f_one_b = derive(make_plan()).stages[-1]

    def kept(stage):
        (loss,) = [p for p in stage.phases if p.name == "loss"]
        (instant,) = loss.instants
        return [a for a in instant.live if a.name.startswith("cross-entropy softmax (fp32)")]

    (softmaxes,) = kept(gpipe)
    assert (softmaxes.bytes, softmaxes.count) == (4 * 2048 * 51200 // 8, 95)
    assert kept(one_f_one_b) == []


def test_the_loss_holds_one_fp32_logits_buffer_when_the_activations_are_fp32():
    """Megatron-LM's vocab-parallel cross-entropy upcasts the logits (``.float()``) and
    turns that buffer into the softmax and then its gradient in place: beside bf16 logits
    one fp32 buffer, 6 B a logit in all; with fp32 activations ``.float()`` returns the
    logits themselves, so 4 B a logit (an audit: 8 B, the logits counted twice). GPT-3 at
    tp 8, s = 2048, b = 1: 2048 · 51,200 / 8 = 13,107,200 logits a rank."""
    logits = 2048 * 51200 // 8

    def loss_bytes(activations: str) -> dict[str, int]:
        plan = make_plan(precision=Precision(activations=activations))
        (loss,) = [p for p in derive(plan).stages[-1].phases if p.name == "loss"]
        (instant,) = loss.instants
        return {a.name: a.total for a in instant.live if "logits" in a.name}

    fp32 = "logits (fp32), the softmax and then its gradient"
    assert loss_bytes("bf16") == {"logits": 2 * logits, fp32: 4 * logits}
    assert loss_bytes("fp32") == {fp32: 4 * logits}


def test_expert_states_name_the_expert_data_parallel_ranks_that_repeat_them():
    """DeepSeek-MoE 16B at ep 8 on 16 data-parallel ranks: each expert's parameters sit on 2
    expert data-parallel ranks, not on the 16 the other parameters repeat over (an audit:
    both read 'replicated over data-parallel ranks')."""
    report = build_report(load_plan(ROOT / "plans" / "deepseek-moe-16b.yaml"))
    placements = {o.tensor: o.placement for o in report.worst.peak_overlap}
    assert placements["expert parameters (bf16)"] == "replicated over 2 expert data-parallel ranks"
    assert placements["parameters (bf16)"] == "replicated over 16 data-parallel ranks"


def test_the_forward_gemms_hold_their_outputs_beside_their_gathered_inputs():
    """Llama 3 70B at tp 8 with sequence parallelism (8,192 tokens, hidden 8,192, bf16): the
    QKV GEMM writes Q, K and V (8 query heads and one K/V head of 128 a rank: 8,192 × 1,280
    × 2 B = 20 MiB) while its all-gathered input (128 MiB) is alive; fc1 writes the gate and
    up projections (2 × 3,584 columns: 112 MiB) beside its own; and the attention output
    projection's row-parallel output is whole on each rank (128 MiB, partial on tp) before
    its reduce-scatter, as the MLP's fc2 output was (a seeds audit: none of the three was
    counted at that moment)."""
    mib = 2**20
    plan = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    (stage, *_) = derive(plan).stages
    phases = {
        p.name: {i.label: {a.name: a for a in i.live} for i in p.instants} for p in stage.phases
    }
    qkv = phases["forward.attention"]["QKV projection"]
    assert sum(qkv[n].total for n in ("attention Q", "attention K", "attention V")) == 20 * mib
    assert qkv["attention input (all-gathered)"].total == 128 * mib
    fc1 = phases["forward.mlp"]["fc1"]
    assert fc1["MLP input (all-gathered)"].total == 128 * mib
    assert fc1["MLP SwiGLU input (gate, up)"].total == 112 * mib
    out = phases["forward.attention"]["output projection reduction"]
    assert out["attention output (partial, before reduction)"].total == 128 * mib


def _optimizer_instant(tmp_path, *edits: tuple[str, str]) -> dict[str, int]:
    """What plans/gpt-1.3b.yaml with `edits` holds at its optimizer step, by name."""
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    (stage,) = derive(load_plan(path)).stages
    (phase,) = [p for p in stage.phases if p.name == "optimizer"]
    (instant,) = phase.instants
    return {a.name: a.total for a in instant.live}


def test_the_optimizer_step_holds_bf16_gradients_upcast_to_the_master_s_format(tmp_path):
    """Megatron-LM's optimizers step on ``.float()`` of a bf16 gradient, a new fp32 tensor
    beside the bf16 buffer, as DeepSpeed ZeRO 1/2 step on an fp32 copy of their partition
    (its estimator's 16 bytes a parameter: 12 of Adam plus 4 of the copy); a peers audit
    found it left out. GPT 1.3B (Ψ = 1,315,819,520 on its one stage) with bf16 gradients
    beside its fp32 master: 4Ψ = 5,263,278,080 B at ZeRO 0, the step's peak, 29,537,615,872 B
    with full recompute at micro 1 (24,274,337,792 B of states and reserve beside it); at
    ZeRO 1 over dp 8 the shard's, 4 · ⌈Ψ / 8⌉ = 657,909,760 B. None with fp32 gradients,
    nor where the step reads them as they are (upcast_grads: false, Apex's fused Adam)."""
    psi = 1_315_819_520
    bf16 = ("grads: fp32", "grads: bf16")
    copy = "gradients upcast to fp32 for the step"
    zero0 = _optimizer_instant(tmp_path, bf16, ("zero: 1", "zero: 0"))
    assert zero0[copy] == 4 * psi == 5_263_278_080
    assert _optimizer_instant(tmp_path, bf16)[copy] == 4 * -(-psi // 8) == 657_909_760
    assert copy not in _optimizer_instant(tmp_path)
    fused = _optimizer_instant(
        tmp_path, bf16, ("master: fp32", "master: fp32\n  upcast_grads: false")
    )
    assert copy not in fused
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    for old, new in (
        bf16,
        ("zero: 1", "zero: 0"),
        ("recompute: none", "recompute: full"),
        ("micro: 4", "micro: 1"),
    ):
        text = text.replace(old, new)
    path = tmp_path / "full.yaml"
    path.write_text(text, encoding="utf-8")
    worst = build_report(load_plan(path)).worst
    assert (worst.peak_phase, worst.peak_instant) == ("optimizer", "optimizer step")
    assert worst.peak_bytes == 24_274_337_792 + 5_263_278_080 == 29_537_615_872


def test_zero3_upcasts_one_sub_group_of_gradients_at_a_time():
    """DeepSpeed ZeRO-3 steps its shard sub-group by sub-group (``sub_group_size``, 1e9
    elements by default), each one's fp32 gradient copy made and released in turn: a shard
    larger than 1e9 holds 4e9 B of copy, not its whole."""
    # GPT-3 175B on one stage over dp 8: a 21.8e9-parameter shard
    plan = make_plan(tp=1, pp=1, dp=8, zero=3, global_batch=8, precision=Precision(grads="bf16"))
    (stage,) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "optimizer"]
    held = {a.name: a.total for a in phase.instants[0].live}
    assert held["gradients upcast to fp32 for the step"] == 4 * 10**9


def test_eager_attention_saves_its_repeated_keys_and_values(tmp_path):
    """Eager attention repeats K and V up to the query heads before its GEMMs, which save
    the copies (Megatron-LM's unfused ``DotProductAttention``, ``repeat_interleave``); the
    narrow K and V were counted (an audit). Llama 3 70B (64 heads, 8 KV heads of 128) at
    tp 8, 8,192 tokens, sequence parallel, bf16, no recompute: a layer pass saves the norm
    and QKV inputs, the residual-side dropout-free norm inputs (4 × 2·1024·8192), Q and the
    projection input (2 × 2·8192·1024), K and V repeated to 1,024 columns (2 × 2·8192·1024),
    the SwiGLU gate and up and fc2 inputs (3 × 2·8192·3584) and the bf16 softmax
    (2·8·8192²): 1,384,120,320 B, where the narrow K and V (128 columns) made 1,354,760,192.
    Under selective recompute the checkpoint keeps the narrow K and V, as flash does."""
    text = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    text = text.replace("  attention: flash\n", "  attention: eager\n")
    path = tmp_path / "eager.yaml"
    path.write_text(text.replace("recompute: selective", "recompute: none"), encoding="utf-8")
    s, h, cols, ffn = 8192, 8192, 1024, 3584
    layer = 4 * 2 * s * h // 8 + 2 * 2 * s * cols + 2 * 2 * s * cols + 3 * 2 * s * ffn
    layer += 2 * 8 * s * s
    assert layer == 1_384_120_320
    (stage, *_) = build_report(load_plan(path)).stages
    (saved,) = [o for o in stage.peak_overlap if o.tensor.startswith(CARRIED_ACTIVATIONS)]
    passes = int(saved.tensor.split(", ")[1].split()[0])
    assert saved.bytes == passes * layer
    held = {o.tensor: o.bytes for o in stage.peak_overlap}
    assert held["attention K"] == held["attention V"] == 2 * s * cols
    selective = tmp_path / "selective.yaml"
    selective.write_text(text, encoding="utf-8")
    plan = load_plan(selective)
    narrow = attention_saved(plan, shapes(plan))
    kv = [a.total for a in narrow if a.name in ("attention K", "attention V")]
    assert kv == [2 * s * 128, 2 * s * 128]


def test_the_attention_backward_frees_what_ran_before_its_core(tmp_path):
    """The bias-dropout-add's and the output projection's backwards run before the core's:
    the dropout mask is freed by then, and under eager attention the projection's input,
    which only the projection saves; flash's kernel saves that tensor as its output too, so
    it stays until the core's backward (an audit: both were held at the core's gradients)."""
    from tests.plan_files import GPT3

    def core(path):
        (stage, *_) = derive(load_plan(path)).stages
        (phase,) = [p for p in stage.phases if p.name == "backward.attention"]
        (instant,) = [i for i in phase.instants if i.label == "attention core gradients"]
        return {a.name for a in instant.live}

    flash = core(GPT3)
    assert "attention dropout mask" not in flash and "attention projection input" in flash
    eager = tmp_path / "eager.yaml"
    eager.write_text(
        GPT3.read_text(encoding="utf-8").replace("attention: flash", "attention: eager"),
        encoding="utf-8",
    )
    held = core(eager)
    assert "attention dropout mask" not in held and "attention projection input" not in held
    # the core's own (recomputed under GPT-3's selective recompute), until its backward
    assert any(name.startswith("attention softmax output") for name in held), held


def test_eager_squared_relu_holds_fc1s_output_and_a_doubled_copy():
    """Under eager squared ReLU (`flops.activation`) the square runs while fc1's output, its
    caller's argument, is still held beside the relu's output and the square's, both saved:
    an instant of its own, fc1's output (N = 2 × 2,048 × 6,144 B on one tp rank of GPT-3)
    above what the block saves. Its backward holds ``2·x.pow(1)`` beside the gradients
    ``pow_backward`` multiplies: the activation-gradient instant holds N more than GeLU's."""
    plan = load_plan(ROOT / "plans" / "gpt3-175b.yaml")
    relu = replace(plan, model=replace(plan.model, mlp="squared_relu"))
    n = 2 * 2048 * 6144

    def instants(p, phase):
        (stage, *_) = derive(p).stages
        (found,) = [x for x in stage.phases if x.name == phase]
        return {i.label: {a.name: a.total for a in i.live} for i in found.instants}

    forward = instants(relu, "forward.mlp")
    assert list(forward) == ["fc1", "squared ReLU", "fc2 output reduction"]
    square = forward["squared ReLU"]
    assert square["MLP fc1 output"] == n
    assert square["MLP ReLU output"] == square["MLP fc2 input"] == n
    reduction = forward["fc2 output reduction"]
    # and the reduction then holds fc2's partial output and its reduce-scattered shard
    partial = {"MLP output (partial, before reduction)", "MLP output (reduce-scattered)"}
    assert sum(square.values()) - n == sum(b for k, b in reduction.items() if k not in partial)
    grads = instants(relu, "backward.mlp")["activation gradients"]
    assert grads["squared ReLU's 2·x"] == n
    assert (
        sum(grads.values())
        == sum(instants(plan, "backward.mlp")["activation gradients"].values()) + n
    )


def test_eager_squared_relu_experts_hold_their_fc1_output_and_a_doubled_copy():
    """The routed experts under eager squared ReLU hold what the dense MLP's do: fc1's
    output while the square runs, ``2·x`` in its backward, each one expert width over the
    rows the rank's experts compute (a review: the MoE instants had been GELU's)."""
    swiglu = load_plan(ROOT / "plans" / "deepseek-moe-16b.yaml")
    plan = replace(swiglu, model=replace(swiglu.model, mlp="gelu"))  # as wide: one matrix
    relu = replace(plan, model=replace(plan.model, mlp="squared_relu"))
    s = shapes(relu)
    width = s.act * s.routed * s.expert_cols
    assert width > 0

    def live(p, phase, label):
        (stage, *_) = derive(p).stages
        (found,) = [x for x in stage.phases if x.name == phase]
        (instant,) = [i for i in found.instants if i.label == label]
        return {a.name: a.total for a in instant.live}

    forward = live(relu, "forward.moe", "expert computation")
    backward = live(relu, "backward.moe", "expert activation gradients")
    assert forward["expert ReLU input"] == backward["expert squared ReLU's 2·x"] == width
    gelu_f = live(plan, "forward.moe", "expert computation")
    gelu_b = live(plan, "backward.moe", "expert activation gradients")
    assert sum(forward.values()) == sum(gelu_f.values()) + width
    assert sum(backward.values()) == sum(gelu_b.values()) + width


def test_fp8_training_saves_gemm_inputs_in_fp8_and_keeps_fp8_weight_copies():
    """FP8 training as Transformer Engine runs it under Megatron-Core (TransformerEngine 2.5,
    ``linear.py`` and ``layernorm_linear.py``: ``update_usage``; ``module/base.py``:
    ``get_weight_workspace``; read by a research audit). A Linear saves its input's FP8
    transpose (the local FP8 shard under sequence parallelism), LayerNormLinear its normed
    output in FP8: 1 B an element; the norms' inputs, the activation's input (fc1's output)
    and a fused attention kernel's own output stay bf16. By hand for GPT-3 at tp 8 with
    sequence parallelism, s = 2,048, b = 1, h = 12,288, no recompute, e = s·h/8 elements:
    the QKV and fc1 inputs and the projection input go from 2e to e bytes each, fc2's input
    from 8e to 4e, and the kernel's output, which the projection's input had been, is 2e of
    its own: e + e + e + 4e − 2e = 5e less a layer and micro-batch in all. Each GEMM weight
    has an FP8 copy and, on Hopper, its transpose, kept for the step: 12·h²/8 weights a
    layer (Q and K, V and the projection 4h², fc1 and fc2 8h², over tp 8) at 2 B, 12 layers
    on a stage of pp 8;
    1 B where the parameters are FP8 already or the device's FP8 GEMMs take either layout
    (Blackwell), none under ZeRO-3."""
    from budget.layers import mlp_saved

    h, s = 12288, 2048
    e = s * h // 8
    bf16 = make_plan(recompute="none")
    fp8 = make_plan(recompute="none", precision=Precision(matmul="fp8"))

    def saved(plan):
        shape = shapes(plan)
        return {a.name: a.total for a in attention_saved(plan, shape) + mlp_saved(plan, shape)}

    before, after = saved(bf16), saved(fp8)
    for name in ("attention QKV input", "MLP fc1 input", "attention projection input"):
        assert (before[name], after[name]) == (2 * e, e)
    assert (before["MLP fc2 input"], after["MLP fc2 input"]) == (8 * e, 4 * e)
    assert after["attention output (fused kernel's, 16-bit)"] == 2 * e
    assert "attention output (fused kernel's, 16-bit)" not in before
    for name in ("attention norm input", "MLP norm input", "MLP GeLU input"):
        assert after[name] == before[name]
    assert sum(after.values()) - sum(before.values()) == -5 * e
    # selective recompute reruns the core, which then keeps nothing: the projection's FP8 copy
    shape = shapes(replace(fp8, recompute="selective"))
    names = {a.name for a in attention_saved(replace(fp8, recompute="selective"), shape)}
    assert "attention output (fused kernel's, 16-bit)" not in names

    def copies(plan):
        (stage, *_) = derive(plan).stages
        return [a.bytes for a in stage.resident if "Transformer Engine" in a.name]

    weights = 12 * h * h // 8 * 12
    assert copies(bf16) == [] and copies(fp8) == [2 * weights]
    fp8_params = make_plan(recompute="none", precision=Precision(params="fp8", matmul="fp8"))
    blackwell = replace(fp8, device=replace(fp8.device, fp8_transpose=False))
    assert copies(fp8_params) == [weights] and copies(blackwell) == [weights]
    # ZeRO 3 (priced without a pipeline only) gathers its weights and keeps no FP8 copy
    zero3 = make_plan(recompute="none", zero=3, pp=1, precision=Precision(matmul="fp8"))
    assert copies(zero3) == []


def test_fp8_training_saves_the_experts_gemm_inputs_in_fp8():
    """An MoE layer under FP8 training: the experts' grouped GEMMs (Transformer Engine's
    GroupedLinear) save their dispatched rows and fc2's input in FP8, half the bf16 bytes,
    while the norm's and router's inputs and the experts' fc1 output stay bf16; the FP8
    weight copies count the rank's experts, Mixtral 8x7B at ep 8 one expert of 3·4,096 ×
    14,336 weights (gate, up, down) split over expert tp 2 (the plan's tp), and the router
    not at all."""
    from budget.layers import fp8_gemm_weights, moe_saved

    mixtral = load_plan(ROOT / "plans" / "mixtral-8x7b.yaml")
    fp8 = replace(mixtral, precision=replace(mixtral.precision, matmul="fp8"))

    def saved(plan):
        return {a.name: a.total for a in moe_saved(plan, shapes(plan))}

    before, after = saved(mixtral), saved(fp8)
    for name in ("dispatched tokens", "expert fc2 input"):
        assert before[name] == 2 * after[name] > 0
    for name in ("MoE norm input", "router input", "expert fc1 output"):
        assert after[name] == before[name]
    assert fp8_gemm_weights(fp8, moe=True)[1] == 3 * 4096 * 14336 // 2


def test_fp8_instants_hold_the_16_bit_tensor_each_row_parallel_gemm_quantizes():
    """Under FP8 training the output projection, fc2 and the experts' fc2 save an FP8 copy
    of their input, but the 16-bit tensor it is cast from stays alive in the caller through
    the GEMM and its reduction (Megatron-Core's ``MLP.forward`` holds
    ``intermediate_parallel`` over ``linear_fc2``, ``SelfAttention.forward`` the core's
    output over ``linear_proj``; TE's ``_Linear.forward`` holds ``inp``): an audit, m471,
    found those instants smaller than in bf16. By hand for GPT-3 at tp 8, s = 2,048, b = 1,
    e = s·h/8: fc2's 16-bit input is 2·s·4h/8 = 8e bytes in every recompute mode; the
    projection's 2e, except where a fused kernel saves its 16-bit output (no recompute),
    which is that tensor; none of them in bf16. Mixtral's experts: twice their FP8 copy."""
    h, s = 12288, 2048
    e = s * h // 8

    def live(plan, phase, label):
        (stage, *_) = derive(plan).stages
        (found,) = [x for x in stage.phases if x.name == phase]
        (instant,) = [i for i in found.instants if i.label == label]
        return {a.name: a.total for a in instant.live}

    cast = " (16-bit, before its FP8 cast)"
    for recompute in ("none", "selective", "full"):
        for attention in ("flash", "eager"):
            for matmul in ("bf16", "fp8"):
                plan = make_plan(
                    recompute=recompute, precision=Precision(matmul=matmul), attention=attention
                )
                fc2 = live(plan, "forward.mlp", "fc2 output reduction")
                proj = live(plan, "forward.attention", "output projection reduction")
                if matmul == "bf16":
                    assert not [n for n in {*fc2, *proj} if n.endswith(cast)]
                    continue
                assert fc2["MLP fc2 input" + cast] == 8 * e
                fused = proj.get("attention output (fused kernel's, 16-bit)", 0)
                source = proj.get("attention projection input" + cast, 0)
                kept = recompute == "none" and attention == "flash"
                assert (fused, source) == ((2 * e, 0) if kept else (0, 2 * e))
    # eager squared ReLU's instant: the square writes fc2's 16-bit input, not yet cast
    # (review m478: the 1-B copy stood in its place), as in bf16
    for matmul in ("bf16", "fp8"):
        relu = make_plan(recompute="none", precision=Precision(matmul=matmul), mlp="squared_relu")
        square = live(relu, "forward.mlp", "squared ReLU")
        assert square.get("MLP fc2 input", 0) + square.get("MLP fc2 input" + cast, 0) == 8 * e
    mixtral = load_plan(ROOT / "plans" / "mixtral-8x7b.yaml")
    fp8 = replace(mixtral, precision=replace(mixtral.precision, matmul="fp8"))
    held = live(fp8, "forward.moe", "expert computation")
    assert held["expert fc2 input" + cast] == 2 * held["expert fc2 input"] > 0
    assert not [n for n in live(mixtral, "forward.moe", "expert computation") if cast in n]


def test_fp8_training_gathers_the_column_parallel_inputs_in_fp8():
    """Under sequence parallelism Transformer Engine's LayerNormLinear quantizes its normed
    output to FP8 and all-gathers that (``gather_along_first_dim(ln_out, tp_group,
    quantizer=...)``, TransformerEngine 2.5 ``layernorm_linear.py``), forward and again for
    the weight gradient: s·h = 2,048 · 12,288 bytes for GPT-3 at b = 1 where bf16 moves
    twice that, and the gathered copy it holds is FP8 too; gathered again, its transpose is
    made beside it for the weight gradient on Hopper (``update_usage(columnwise_usage=
    True)``; a review), 2·s·h held, s·h on Blackwell. The row-parallel layer's output
    gradient is quantized and gathered in FP8 the same way (``grad_output_preprocess``).
    The output's reduce-scatter, the input gradient's and the output layer (Megatron-Core's
    own ColumnParallelLinear, not Transformer Engine's) stay bf16."""
    s_h = 2048 * 12288
    fp8 = make_plan(recompute="none", precision=Precision(matmul="fp8"))
    moves = {}
    held = {}
    for stage in derive(fp8).stages:
        for phase in stage.phases:
            for m in phase.moves:
                moves[(phase.name, m.name)] = (m.dtype, m.size_bytes)
            for instant in phase.instants:
                held.update({a.name: a.bytes for a in instant.live})
    for phase, block in (("forward.attention", "attention"), ("forward.mlp", "MLP")):
        assert moves[(phase, f"{block} input")] == ("fp8", s_h)
        assert moves[(phase, f"{block} output")] == ("bf16", 2 * s_h)
    assert moves[("backward.mlp", "MLP input again, for weight grad")] == ("fp8", s_h)
    assert moves[("backward.mlp", "MLP input gradient")] == ("bf16", 2 * s_h)
    assert moves[("backward.mlp", "MLP output gradient")] == ("fp8", s_h)
    assert moves[("backward.attention", "attention output gradient")] == ("fp8", s_h)
    assert moves[("loss", "output layer input")] == ("bf16", 2 * s_h)
    for name in ("attention input (all-gathered)", "MLP input (all-gathered)"):
        assert held[name] == s_h
    for name in (
        "QKV input (re-gathered for weight grad)",
        "fc1 input (re-gathered for weight grad)",
        "output gradient (all-gathered)",
    ):
        assert held[name] == 2 * s_h
    blackwell = replace(fp8, device=replace(fp8.device, fp8_transpose=False))
    again = {
        a.name: a.bytes
        for stage in derive(blackwell).stages
        for phase in stage.phases
        for instant in phase.instants
        for a in instant.live
    }
    assert again["QKV input (re-gathered for weight grad)"] == s_h


def test_transformer_engines_userbuffers_are_held_with_what_is_reserved(tmp_path):
    """Transformer Engine's comm-GEMM overlap (``initialize_ub``, TE 2.5) registers ten
    userbuffers a rank for the whole run, each of Megatron-LM's shape [seq · micro / cp,
    hidden]: six that all-gather (1 B an element under FP8) and four that reduce-scatter
    (an audit: counted nowhere). Llama 3 70B at tp 8, 8,192 tokens, hidden 8,192, bf16:
    10 x 8,192 x 8,192 x 2 B = 1.25 GiB; under FP8 (6 x 1 + 4 x 2) x 8,192² = 896 MiB;
    none without the overlap or without sequence parallelism."""
    from budget.layers import te_userbuffers
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "llama3-70b.yaml"
    on = variant(
        tmp_path,
        "on.yaml",
        ("recompute: selective\n", "recompute: selective\noverlap: {tp: true}\n"),
        base=base,
    )
    plan = load_plan(on)
    (buffers,) = te_userbuffers(plan)
    assert (buffers.category, buffers.total) == ("reserved", 10 * 8192 * 8192 * 2)
    assert buffers.total == 1.25 * 2**30
    fp8 = replace(plan, precision=replace(plan.precision, matmul="fp8"))
    assert te_userbuffers(fp8)[0].total == (6 + 4 * 2) * 8192**2 == 896 * 2**20
    # bf16 whatever the activations' format: ``initialize_ub``'s default (a review)
    wide = replace(plan, precision=replace(plan.precision, activations="fp32"))
    assert te_userbuffers(wide)[0].total == buffers.total
    assert te_userbuffers(load_plan(base)) == []  # overlap.tp off
    no_sp = replace(plan, parallel=replace(plan.parallel, sequence_parallel=False))
    assert te_userbuffers(no_sp) == []
    report, shipped = build_report(plan), build_report(load_plan(base))
    for row, before in zip(report.stages, shipped.stages, strict=True):
        assert row.reserved_bytes == before.reserved_bytes + buffers.total


def test_selective_recompute_frees_the_core_attention_when_its_checkpoint_returns():
    """Selective recompute runs the core attention inside a checkpoint that keeps only its
    inputs (Megatron-LM's ``CheckpointFunction.forward`` runs it under ``torch.no_grad``):
    the eager softmax output, its dropout mask and dropout output are alive while it runs,
    and gone by the output projection and the MLP (an audit found them carried to the
    MLP's instants, GPT-3 175B's peak put in forward.mlp 6 MiB over its true one).

    By hand, GPT-3 175B at tp 8, one sequence of 2,048 tokens: 96 / 8 = 12 heads a rank,
    12 · 2048² = 50,331,648 scores; softmax output and dropout output 2 B each, mask 1 B:
    251,658,240 B, held in "after attention" alone, with the raw scores QKᵀ (2 B each) the
    core's ``baddbmm`` wrote; Megatron's buffer of their size it passes as the input stays
    for the run (`test_eager_attention_holds_its_scores_and_megatron_s_buffer`)."""
    flash = load_plan(ROOT / "plans" / "gpt3-175b.yaml")
    assert flash.recompute == "selective" and flash.model.dropout
    eager = replace(flash, model=replace(flash.model, attention="eager"))

    def instants(p, phase):
        (stage, *_) = derive(p).stages
        (found,) = [x for x in stage.phases if x.name == phase]
        return {i.label: {a.name: a.total for a in i.live} for i in found.instants}

    scores = 12 * 2048 * 2048
    working = {
        "attention softmax output (working, not saved)": 2 * scores,
        "attention softmax dropout mask (working, not saved)": scores,
        "attention softmax dropout output (working, not saved)": 2 * scores,
    }
    assert sum(working.values()) == 251_658_240
    working["attention scores QKᵀ (working, freed as the core returns)"] = 2 * scores
    buffer = "attention scores buffer (Megatron-LM's, held through the run)"
    after = instants(eager, "forward.attention")["after attention"]
    assert {k: after[k] for k in working} == working
    flash_after = instants(flash, "forward.attention")["after attention"]
    # flash's own working tensors while its core runs: its statistics, 4 B a row
    assert (
        flash_after.pop("attention softmax statistics (fp32) (working, not saved)") == 4 * 12 * 2048
    )
    assert after[buffer] == 2 * scores
    assert {k: b for k, b in after.items() if k not in working and k != buffer} == flash_after
    # past the checkpoint, eager and flash hold the same tensors: neither kernel's
    for phase, label in (
        ("forward.attention", "output projection reduction"),
        ("forward.mlp", "fc1"),
        ("forward.mlp", "fc2 output reduction"),
    ):
        held = instants(eager, phase)[label]
        assert not [k for k in held if "(working, not saved)" in k and "attention" in k]
        assert held.pop(buffer) == 2 * scores
        assert held == instants(flash, phase)[label]


def _live(plan, phase: str) -> dict[str, dict[str, int]]:
    """Stage 0's instants of `phase`: the bytes of each allocation alive at each."""
    (stage, *_) = derive(plan).stages
    (found,) = [x for x in stage.phases if x.name == phase]
    return {i.label: {a.name: a.total for a in i.live} for i in found.instants}


def test_eager_attention_holds_its_scores_and_megatron_s_buffer():
    """Megatron-LM's unfused attention writes the raw scores with ``torch.baddbmm`` into a
    tensor of their own, alive as a local until the core returns, and passes it a buffer of
    their size from ``get_global_memory_buffer()``, made at the first call and kept for the
    run (an audit: neither was counted; the MoE memory row read 7.5 % under, 3.9 % now).

    By hand, GPT-3 175B at tp 8, one sequence of 2,048 tokens: 12 heads a rank ·
    2,048² · 2 B = 100,663,296 B each; the buffer in every instant of the step, the
    optimizer's too, the scores in "after attention" alone."""
    flash = make_plan(dropout=True)
    eager = replace(flash, model=replace(flash.model, attention="eager"))
    size = 12 * 2048 * 2048 * 2
    buffer = "attention scores buffer (Megatron-LM's, held through the run)"
    scores = "attention scores QKᵀ (working, freed as the core returns)"
    for stage in derive(eager).stages:
        for phase in stage.phases:
            for instant in phase.instants:
                held = {a.name: a.total for a in instant.live}
                assert held[buffer] == size, (phase.name, instant.label)
                assert (scores in held) == (instant.label == "after attention")
    assert _live(eager, "forward.attention")["after attention"][scores] == size
    assert not [a.name for s in derive(flash).stages for a in s.resident if a.name == buffer]


def test_a_block_s_dropout_mask_and_post_norm_input_come_after_its_reduction():
    """Megatron-Core's ``TransformerLayer`` runs a block's bias-dropout-add on its output
    once the row-parallel projection has reduced it, and a sandwich norm after that: the
    mask and the norm's input do not exist at the block's own instants (an audit found
    them there), and are saved from the next block on."""
    plan = make_plan(dropout=True, recompute="none", sandwich_norm=True)
    late = {
        "attention": {"attention dropout mask", "attention post-norm input"},
        "mlp": {"MLP dropout mask", "MLP post-norm input"},
    }
    for block, names in late.items():
        for label, held in _live(plan, f"forward.{block}").items():
            assert not names & set(held), (block, label)
    for label, held in _live(plan, "forward.mlp").items():
        assert late["attention"] <= set(held), label


def test_full_recompute_s_forward_frees_each_tensor_with_its_last_reference():
    """Full recompute's forward runs under ``torch.no_grad`` (Megatron-LM's
    ``CheckpointFunction.forward``): each tensor goes with its last reference (an audit
    found every one of a block held to its end, and the layer input twice, as the
    checkpoint and as the norm's input). Eager GPT-3 175B at tp 8 with sequence
    parallelism, dropout on: the working tensors of each instant, by hand."""
    plan = make_plan(dropout=True, recompute="full")
    plan = replace(plan, model=replace(plan.model, attention="eager"))
    q, k, v = ("attention Q", "attention K", "attention V")
    core = ("attention softmax output", "attention softmax dropout mask")
    core += ("attention softmax dropout output",)
    want = {
        ("forward.attention", "QKV projection"): ("attention QKV input", q, k, v),
        ("forward.attention", "after attention"): (q, k, v, *core, "attention projection input"),
        ("forward.attention", "output projection reduction"): (
            q,
            k,
            v,
            "attention projection input",
        ),
        ("forward.mlp", "fc1"): ("MLP norm input", "MLP fc1 input", "MLP GeLU input"),
        ("forward.mlp", "fc2 output reduction"): ("MLP norm input", "MLP fc2 input"),
    }
    for (phase, label), names in want.items():
        held = _live(plan, phase)[label]
        working = {n.removesuffix(" (working, not saved)") for n in held if "(working, not" in n}
        assert working == set(names), (phase, label)
        assert held["layer input (checkpoint)"] == 2048 // 8 * 12288 * 2


def test_selective_recompute_holds_a_fused_kernel_s_statistics_while_they_exist():
    """Under selective recompute a fused attention kernel's fp32 softmax statistics exist
    while the core runs in the forward (freed as its checkpoint returns) and again from the
    core's recomputed forward, which saves them, to its backward (an audit: they were
    counted under full recompute alone). GPT-3 175B at tp 8, one sequence of 2,048 tokens:
    12 heads a rank · 2,048 rows · 4 B."""
    plan = make_plan()
    assert plan.recompute == "selective" and plan.model.attention == "flash"
    stats = 4 * 12 * 2048
    after = _live(plan, "forward.attention")
    assert (
        after["after attention"]["attention softmax statistics (fp32) (working, not saved)"]
        == stats
    )
    assert not [k for k in after["output projection reduction"] if "statistics" in k]
    core = _live(plan, "backward.attention")["attention core gradients"]
    assert core["attention softmax statistics (fp32) (recomputed)"] == stats


def test_a_multi_token_prediction_module_s_layer_runs_beside_the_head_s_inputs(tmp_path):
    """With multi-token prediction the last stage's last layer pass is the module's own
    transformer layer, run after the decoder's final norm and the module's norms and
    projection have saved their inputs, and its first backward, before the head's backward
    frees them; and the main output layer's input gradient waits for the module's loss's
    backward (an audit: the head's inputs were counted in the loss alone, the gradient
    nowhere). A small latent-attention model with one module at pp 2, 4,096 tokens of
    hidden 1,024: 4,096 · 1,024 · 2 B a tensor."""
    text = (
        "name: mtp\nmode: train\n"
        "model: {layers: 4, hidden: 1024, heads: 8, head_dim: 128, "
        "mla: {q_rank: 512, kv_rank: 256, nope_dim: 128, rope_dim: 64}, ffn: 4096, "
        "mtp_layers: 1, vocab: 32768, mlp: swiglu, norm: rmsnorm, bias: false, "
        "tied_embeddings: false, position: rope, dropout: false, attention: flash}\n"
        "batch: {seq: 4096, micro: 1, global: 8}\n"
        "precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, "
        "activations: bf16}\n"
        "parallel: {tp: 1, pp: 2, dp: 1, zero: 0}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, gpus: 2}\n"
    )
    path = tmp_path / "mtp.yaml"
    path.write_text(text, encoding="utf-8")
    last = derive(load_plan(path)).stages[-1]
    size = 4096 * 1024 * 2
    counts = _counts(last, "final norm input")
    assert counts["forward.attention"] == counts["backward.mlp"] == counts["loss"] == {1}
    (mtp,) = [p for p in last.phases if p.name == "mtp"]
    (instant,) = mtp.instants
    held = {a.name: a.total for a in instant.live}
    assert held["output layer input gradient"] == size


def _fsdp_optimizer(tmp_path, kernel: str, optimizer: str = "adam") -> tuple[dict[str, int], int]:
    """plans/llama3-8b-fsdp.yaml's optimizer step with `optimizer` run by `kernel`: what it
    holds by name, and the bytes its step kernel moves."""
    text = (ROOT / "plans" / "llama3-8b-fsdp.yaml").read_text(encoding="utf-8")
    old = "  optimizer: adam\n"
    assert text.count(old) == 1
    text = text.replace(old, f"  optimizer: {optimizer}\n  optimizer_kernel: {kernel}\n")
    path = tmp_path / f"{kernel}-{optimizer}.yaml"
    path.write_text(text, encoding="utf-8")
    (stage,) = derive(load_plan(path)).stages
    (phase,) = [p for p in stage.phases if p.name == "optimizer"]
    (instant,) = phase.instants
    (step,) = [w for w in phase.works if w.name.startswith(f"{optimizer} step")]
    return {a.name: a.total for a in instant.live}, int(step.bytes)


def test_a_foreach_optimizer_holds_a_temporary_as_large_as_its_shard(tmp_path):
    """PyTorch's foreach Adam (torch.optim's default on GPUs) takes the square root of every
    second moment at once (``torch._foreach_sqrt`` over the one list of a device's fp32
    parameters) and makes a pass per operation, 4 touches of the parameter, 2 of the
    gradient and 14 of the moments or that temporary a parameter (`flops._STEP_PASSES`),
    where a fused kernel touches 2, 1 and 4. Llama 3 8B under FSDP over 8 GPUs, fp32
    parameters, gradients and moments: a shard of ⌈8,030,261,248 / 8⌉ = 1,003,782,656
    parameters, so a temporary of 4 x 1,003,782,656 = 4,015,130,624 B and a step moving
    80 B a parameter, not 28. Foreach SGD (weight decay on) holds the gradients plus the
    decay instead, in the gradients' format; its step moves 3 x 4 + 3 x 4 + 5 x 4 = 44 B,
    fused SGD 2 x 4 + 4 + 2 x 4 = 20."""
    shard = -(-8_030_261_248 // 8)
    assert shard == 1_003_782_656
    fused, fused_bytes = _fsdp_optimizer(tmp_path, "fused")
    foreach, foreach_bytes = _fsdp_optimizer(tmp_path, "foreach")
    root = "square root of Adam's second moment (foreach)"
    assert root not in fused
    assert {k: v for k, v in foreach.items() if k != root} == fused
    assert foreach[root] == 4 * shard == 4_015_130_624
    assert (fused_bytes, foreach_bytes) == (28 * shard, 80 * shard)
    sgd, sgd_bytes = _fsdp_optimizer(tmp_path, "foreach", "sgd")
    assert sgd["gradients plus weight decay (foreach SGD)"] == 4 * shard
    assert sgd_bytes == 44 * shard
    assert _fsdp_optimizer(tmp_path, "fused", "sgd")[1] == 20 * shard


def test_a_for_loop_optimizer_holds_two_temporaries_of_its_largest_tensor(tmp_path):
    """The for-loop kernel (torch.optim with foreach=False, ``_single_tensor_adam``, and
    Composer's ``DecoupledAdamW``) makes foreach's passes a tensor at a time, so it moves the
    same 80 B a parameter but its temporaries are one tensor's: Adam's ``exp_avg_sq.sqrt() /
    bias_correction2_sqrt`` holds the root and the quotient at once. Llama 3 8B under FSDP2
    over 8 GPUs: its largest tensor is the vocabulary table (untied, so the output layer's
    is as large), 128,256 x 4,096 = 525,336,576 elements, a rank's eighth 65,667,072, so two
    fp32 temporaries of 4 x 65,667,072 = 262,668,288 B each, 525,336,576 B held at the step
    beside what the fused kernel holds (4,015,130,624 B under foreach). SGD holds one, the
    gradient plus its decay. A step reading bf16 gradients beside fp32 weights is refused
    as under foreach (torch's ``lerp_`` wants one format)."""
    from budget.errors import BudgetError

    shard = -(-8_030_261_248 // 8)
    table = -(-128_256 * 4_096 // 8)
    assert table == 65_667_072
    fused, _ = _fsdp_optimizer(tmp_path, "fused")
    loop, loop_bytes = _fsdp_optimizer(tmp_path, "for-loop")
    held = "square root of Adam's second moment, and its quotient (for-loop, its largest tensor)"
    assert {k: v for k, v in loop.items() if k != held} == fused
    assert loop[held] == 2 * 4 * table == 525_336_576
    assert loop_bytes == 80 * shard
    sgd, sgd_bytes = _fsdp_optimizer(tmp_path, "for-loop", "sgd")
    assert sgd["gradients plus weight decay (for-loop, its largest tensor)"] == 4 * table
    assert sgd_bytes == 44 * shard
    narrow = variant(
        tmp_path,
        "narrow.yaml",
        ("master: fp32", "master: fp32\n  upcast_grads: false"),
        ("optimizer: adam", "optimizer: adam\n  optimizer_kernel: for-loop"),
        ("grads: fp32", "grads: bf16"),
        base=ROOT / "plans" / "gpt-1.3b.yaml",
    )
    with pytest.raises(BudgetError) as raised:
        load_plan(narrow)
    (problem,) = raised.value.problems
    assert problem.path == "$.precision.optimizer_kernel"


def test_deepspeed_hands_a_for_loop_optimizer_its_flat_partition(tmp_path):
    """DeepSpeed gives the torch optimizer one flat tensor, the rank's fp32 partition
    (ZeRO 1 and 2: ``param_group['params'] = [self.single_partition_of_fp32_groups[i]]``,
    stage_1_and_2.py; ZeRO 3 a sub-group of it, ``fp32_partitioned_groups_flat``), so a
    for-loop Adam's two temporaries are as large as that tensor, not a weight's share (a
    review, m356: an eighth of the vocabulary table was priced). GPT 1.3B over 8 GPUs at
    ZeRO 2 with a 5e8 bucket: a partition of ⌈1,315,819,520 / 8⌉ = 164,477,440 elements,
    the size its gradients' fp32 copy holds, so 2 x 4 x 164,477,440 = 1,315,819,520 B."""
    path = variant(
        tmp_path,
        "deepspeed.yaml",
        ("grads: fp32", "grads: bf16"),
        ("optimizer: adam", "optimizer: adam\n  optimizer_kernel: for-loop"),
        ("zero: 1", "zero: 2\n  reduce_bucket: 500000000"),
        base=ROOT / "plans" / "gpt-1.3b.yaml",
    )
    (stage,) = derive(load_plan(path)).stages
    (phase,) = [p for p in stage.phases if p.name == "optimizer"]
    held = {a.name: a.total for a in phase.instants[-1].live}
    partition = -(-1_315_819_520 // 8)
    assert held["gradients upcast to fp32 for the step"] == 4 * partition
    name = "square root of Adam's second moment, and its quotient (for-loop, its largest tensor)"
    assert held[name] == 2 * 4 * partition == 1_315_819_520


def test_fsdp1_steps_a_flat_parameter_at_a_time_under_the_for_loop_kernel():
    """Under FullyShardedDataParallel (``parallel.fsdp`` 1) the optimizer steps its flat
    parameters, one a unit, so a for-loop kernel's largest tensor is the largest unit's
    shard. MPT 7B over 8 GPUs (Composer's DecoupledAdamW, `budget.accuracy`): a layer unit
    holds 12 x 4,096² + 13 x 4,096 = 201,379,840 parameters (its biases and two LayerNorms'
    weights and biases), the root the tied vocabulary table and the learned positions,
    (50,368 + 2,048) x 4,096 = 214,695,936, the larger; a rank's eighth is 26,836,992, so
    the two fp32 temporaries hold 8 x 26,836,992 = 214,695,936 B."""
    from budget.accuracy import RUNS, plan_of

    (run,) = [r for r in RUNS if r.name == "MPT 7B, 8 GPUs"]
    plan = plan_of(run)
    assert plan.parallel.fsdp == 1 and plan.precision.optimizer_kernel == "for-loop"
    (stage,) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "optimizer"]
    held = {a.name: a.total for a in phase.instants[-1].live}
    name = "square root of Adam's second moment, and its quotient (for-loop, its largest tensor)"
    assert held[name] == 8 * -(-(50_368 + 2_048) * 4_096 // 8) == 214_695_936


def test_deepspeed_zero3_steps_its_foreach_temporary_one_sub_group_at_a_time():
    """A review: DeepSpeed's ZeRO-3 (a master copy beside bf16 parameters) steps its shard one
    ``sub_group_size`` of 1e9 elements at a time, so a foreach Adam's square root covers a
    sub-group, 4e9 B in fp32, not the 21.8e9-parameter shard of GPT-3 175B over dp 8; PyTorch
    FSDP (no master) steps its whole shard (the test above)."""
    plan = make_plan(
        tp=1, pp=1, dp=8, zero=3, global_batch=8, precision=Precision(optimizer_kernel="foreach")
    )
    (stage,) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "optimizer"]
    held = {a.name: a.total for a in phase.instants[0].live}
    assert held["square root of Adam's second moment (foreach)"] == 4 * 10**9


def test_a_foreach_step_on_gradients_narrower_than_its_weights_is_refused(tmp_path):
    """A review: torch refuses a bf16 gradient on an fp32 tensor (and foreach Adam's
    ``_foreach_lerp_`` a bf16 gradient beside fp32 moments), so a foreach step reads
    gradients in the stepped weights' format: a plan whose step would read bf16 gradients
    beside an fp32 master (upcast_grads: false) or fp32 parameters is refused, not priced."""
    from budget.errors import BudgetError

    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    foreach = ("optimizer: adam", "optimizer: adam\n  optimizer_kernel: foreach")
    cases = {
        "master": [("master: fp32", "master: fp32\n  upcast_grads: false")],
        "fsdp": [("master: fp32", "master: none"), ("params: bf16", "params: fp32")],
    }
    for name, edits in cases.items():
        for old, _new in [*edits, foreach, ("grads: fp32", "grads: bf16")]:
            assert text.count(old) == 1, old
        written = text
        for old, new in [*edits, foreach]:
            written = written.replace(old, new)
        narrow = tmp_path / f"{name}.yaml"
        narrow.write_text(written.replace("grads: fp32", "grads: bf16"), encoding="utf-8")
        with pytest.raises(BudgetError) as raised:
            load_plan(narrow)
        (problem,) = raised.value.problems
        if name == "fsdp":  # refused whatever the kernel: the next test
            assert problem.path == "$.precision.grads"
        else:
            assert problem.path == "$.precision.optimizer_kernel"
            assert "torch refuses a bf16 gradient on an fp32 parameter" in problem.message
        # fp32 gradients: the step reads them as they are, priced
        wide = tmp_path / f"{name}-fp32-grads.yaml"
        wide.write_text(written, encoding="utf-8")
        assert load_plan(wide).precision.optimizer_kernel == "foreach"


def test_gradients_narrower_than_parameters_without_a_master_are_refused(tmp_path):
    """An audit: fp32 parameters with no master copy and grads: bf16 were priced at 2 bytes
    a gradient, Llama 3 8B's FSDP shard at 2,007,565,312 B where a run holds 4,015,130,624.
    Where no master copy is stepped, a gradient is kept in its parameter's format: autograd
    accumulates into the parameter's own (``AccumulateGrad``), PyTorch FSDP casts the
    reduced shard back (``_cast_grad_to_param_dtype``; FSDP2's ``foreach_reduce``) and
    Megatron-LM keeps fp32 main grads for fp32 parameters. Refused where written, with the
    plan's way to a bf16 reduction (grad_reduce); with a master copy bf16 gradients stay."""
    from budget.errors import BudgetError

    base = ROOT / "plans" / "llama3-8b-fsdp.yaml"
    assert "grads: fp32" in base.read_text(encoding="utf-8")
    narrow = variant(tmp_path, "narrow.yaml", ("grads: fp32", "grads: bf16"), base=base)
    with pytest.raises(BudgetError) as raised:
        load_plan(narrow)
    (problem,) = raised.value.problems
    assert problem.path == "$.precision.grads"
    assert problem.message.startswith(
        "grads: bf16 beside params: fp32 and no master copy: a gradient is kept in its "
        "parameter's format (fp32)"
    )
    # the bf16 reduction offered where one runs (a review, m537: ZeRO 0 and 1 refuse it)
    assert problem.message.endswith(
        "write grads: fp32 (and at ZeRO 2 or 3, grad_reduce: bf16 to reduce them in bf16; "
        "ZeRO 0 and 1 reduce in place, in the gradients' format)"
    )
    megatron = ROOT / "plans" / "gpt-1.3b.yaml"  # bf16 parameters, an fp32 master
    assert "params: bf16" in megatron.read_text(encoding="utf-8")
    kept = variant(tmp_path, "kept.yaml", ("grads: fp32", "grads: bf16"), base=megatron)
    assert load_plan(kept).precision.grads == "bf16"


def _zero_paper_plan(zero: int, bucket: int = 0):
    """The ZeRO paper's Figure 1 model as near as a plan says it (Rajbhandari et al., arXiv
    1910.02054: about 7.5B parameters over 64 data-parallel ranks, fp16 with an fp32 master
    and Adam): 36 layers of hidden 4,096, a GeLU MLP of 16,384, biases, 1,024 tokens."""
    precision = Precision(params="fp16", grads="fp16", activations="fp16", master="fp32")
    plan = make_plan(
        seq=1024,
        global_batch=64,
        tp=1,
        pp=1,
        dp=64,
        sp=False,
        zero=zero,
        recompute="full",
        precision=precision,
        layers=36,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn=16384,
        vocab=50304,
        bias=True,
    )
    return replace(plan, parallel=replace(plan.parallel, reduce_bucket=bucket))


def _phase_peaks(plan):
    """Each phase's largest instant on the plan's only stage, by name."""
    (stage,) = derive(plan).stages
    return {
        p.name: max(sum(a.total for a in i.live) for i in p.instants)
        for p in stage.phases
        if p.instants
    }


# one MLP block's parameters: fc1 and fc2 weights, their biases and the block's norm
_MLP_BLOCK = 2 * 4096 * 16384 + 16384 + 4096 + 2 * 4096
_FC1_WEIGHT = 4096 * 16384  # its largest weight (fc2's is as large)


def test_deepspeed_zero_3_holds_its_gradient_buffer_for_the_run():
    """An audit: DeepSpeed's ZeRO 3 allocates its contiguous gradient buffer of
    ``reduce_bucket_size`` elements once (stage3.py, ``_setup_for_real_optimizer``) and
    copies each gradient into it as autograd makes it, which budget did not count (a
    DeepSpeed ZeRO 3 plan read 1.0 GB under its run at the optimizer step). With
    ``parallel.reduce_bucket: 5e8`` every instant holds 5e8 fp16 elements more, and the
    MLP block's backward holds its largest weight's gradient (4,096 x 16,384 x 2 B) where
    it held the block's whole gradients (134,246,400 parameters x 2 B)."""
    without = _phase_peaks(_zero_paper_plan(3))
    ds = _zero_paper_plan(3, 500_000_000)
    buffered = _phase_peaks(ds)
    buffer = 500_000_000 * 2
    for name in ("forward.attention", "forward.mlp", "loss"):
        assert buffered[name] - without[name] == buffer, name
    # the epilogue reduce-scatters the last bucket, what 14 full ones leave of the rank's
    # 7,455,727,616 gradients, laid out by rank in one fp16 copy (``reduce_scatter_coalesced``:
    # ``torch.cat``; an audit, m455: none counted)
    last = 7_455_727_616 - 14 * 500_000_000
    assert params_total(ds) == 7_455_727_616 and last == 455_727_616
    assert buffered["dp.grads"] - without["dp.grads"] == buffer + 2 * last
    # a bucket the gradients never fill: all of them in the epilogue's copy, none before
    big = _phase_peaks(_zero_paper_plan(3, 8_000_000_000))
    assert big["dp.grads"] - without["dp.grads"] == 2 * 8_000_000_000 + 2 * 7_455_727_616
    assert big["backward.mlp"] - buffered["backward.mlp"] == 2 * 8_000_000_000 - 2 * buffer
    # and at the step the shard's gradients flattened into one fp16 tensor beside their
    # fp32 cast (``self.flatten(...).to(...)``, `step._flattened_upcast`): Ψ/64 of them
    flat = 2 * -(-params_total(ds) // 64)
    # Ψ: the audit's 7,464,116,224 less its plan's 2,048 learned positions of 4,096
    assert flat == 2 * -(-(7_464_116_224 - 2048 * 4096) // 64)
    assert buffered["optimizer"] - without["optimizer"] == buffer + flat
    # and where a full bucket is reduce-scattered in the backward, its copy (5e8 x 2 B)
    assert without["backward.mlp"] - 2 * _MLP_BLOCK == buffered["backward.mlp"] - (
        buffer + 2 * _FC1_WEIGHT + buffer
    )
    assert build_report(ds).layout["reduce_bucket"] == 500_000_000
    # PyTorch FSDP's mixed precision (fp32 shards gathered in bf16, no master) has none
    fsdp = Precision(params="fp32", grads="fp32", param_gather="bf16", master=None)
    assert _phase_peaks(replace(ds, precision=fsdp)) == _phase_peaks(
        replace(_zero_paper_plan(3), precision=fsdp)
    )
    assert build_report(replace(ds, precision=fsdp)).layout["reduce_bucket"] is None
    # a review: an output layer of its own has its gradient copied into the buffer as it is
    # made, so no layer's backward holds it, where a tied one's waits for the embedding's
    for tied in (True, False):
        model = replace(ds.model, tied_embeddings=tied)
        held = {
            plan.parallel.reduce_bucket: [
                a.total
                for p in derive(plan).stages[0].phases
                if p.name == "backward.mlp"
                for i in p.instants
                for a in i.live
                if a.name.startswith("head gradients")
            ]
            for plan in (replace(ds, model=model), replace(_zero_paper_plan(3), model=model))
        }
        assert held[0] and min(held[0]) == 2 * 50304 * 4096
        assert held[500_000_000] == ([] if not tied else held[0])


def test_deepspeed_zero_2_holds_its_buffers_through_each_backward():
    """DeepSpeed's ZeRO 2 allocates its buffer at every ``backward`` (two under
    ``overlap_comm``) and releases it once that backward's gradients are reduced
    (``independent_gradient_partition_epilogue`` ends in ``_release_ipg_buffers``, after
    every backward; stage_1_and_2.py): the loss, the backward and the reduction hold it,
    no forward (a review: the second micro-batch's forward had held the first's) and not
    the step. It stands where the layer's whole gradients were bucketed (the MLP backward:
    a layer's 201,379,840 parameters at 2 B, held for the largest weight's gradient)."""
    layer = _MLP_BLOCK + 4 * 4096 * 4096 + 4 * 4096 + 2 * 4096  # QKV, projection, biases, norm
    without = _phase_peaks(_zero_paper_plan(2))
    buffered = _phase_peaks(_zero_paper_plan(2, 500_000_000))
    buffer = 500_000_000 * 2
    for name in ("forward.attention", "forward.mlp"):
        assert buffered[name] == without[name], name
    # the step holds none, but the partition's gradients flattened in fp16 beside their
    # fp32 cast (`step._flattened_upcast`)
    flat = 2 * -(-params_total(_zero_paper_plan(2)) // 64)
    assert buffered["optimizer"] - without["optimizer"] == flat
    # and where a full bucket is all-reduced, in the layers' backward and at its end, that
    # bucket flattened into one tensor beside it (``allreduce_bucket``: ``self.flatten``; an
    # audit, m229): 5e8 fp16 elements more; not in the loss, whose backward fills none; at
    # the end, the last bucket's, what 14 full ones leave (an audit, m455: a full one's)
    flattened = 500_000_000 * 2
    last = params_total(_zero_paper_plan(2)) - 14 * 500_000_000
    assert last == 455_727_616
    assert buffered["loss"] - without["loss"] == buffer
    assert buffered["dp.grads"] - without["dp.grads"] == buffer + 2 * last
    assert layer == 201_379_840
    assert buffered["backward.mlp"] - without["backward.mlp"] == buffer + flattened + 2 * (
        _FC1_WEIGHT - layer
    )
    # a bucket the rank's gradients never overflow is reduced only by the epilogue, once the
    # backward is done (``reduce_ipg_grads`` runs when the next gradient would not fit; an
    # audit, m334: the layers' backward had held it flattened, 5.6 GiB over a 1.3B's peak)
    whole = params_total(_zero_paper_plan(2)) + 1
    big = _phase_peaks(_zero_paper_plan(2, whole))
    assert big["backward.mlp"] - without["backward.mlp"] == 2 * whole + 2 * (_FC1_WEIGHT - layer)
    assert big["dp.grads"] - without["dp.grads"] == 2 * whole + 2 * (whole - 1)
    # two micro-batches a rank: the second forward holds none either; overlap_comm
    # (overlap.dp_grads): two buffers
    one = _zero_paper_plan(2, 500_000_000)
    two = replace(one, batch=replace(one.batch, global_batch=128))
    assert (one.microbatches, two.microbatches) == (1, 2)
    plain = replace(_zero_paper_plan(2), batch=two.batch)
    assert _phase_peaks(two)["forward.mlp"] == _phase_peaks(plain)["forward.mlp"]
    doubled = replace(two, overlap=replace(two.overlap, dp_grads=True))
    (stage,) = derive(doubled).stages

    def held(name):
        (phase,) = [p for p in stage.phases if p.name == name]
        return [a for i in phase.instants for a in i.live if a.name.startswith("DeepSpeed")]

    assert {(a.count, a.total) for a in held("backward.mlp")} == {(2, 2 * buffer)}
    assert not held("optimizer") and not held("forward.mlp")


def test_deepspeed_zero_2_all_reduces_each_bucket():
    """An audit (m229): DeepSpeed's ZeRO 2 reduces each bucket of gradients with an
    all-reduce over the data-parallel group, each rank then keeping its own slices
    (stage_1_and_2.py ``average_tensor`` under ``use_multi_rank_bucket_allreduce``, True by
    default: "do an All-Reduce instead of multiple Reduce ops"; ``allreduce_bucket`` calls
    ``dist.all_reduce``), where budget priced Megatron-LM's reduce-scatter, half the bytes.
    The paper plan's 7,455,727,616 fp16 gradients (14,911,455,232 B) over dp 64: a ring
    all-reduce sends 2 x 63/64 of them, 29,356,927,488 B, after every micro-batch's
    backward, against the reduce-scatter's 14,678,463,744."""
    from budget.report import to_dict

    def reduction(plan):
        (found,) = [
            c
            for p in to_dict(build_report(plan))["phases"]
            for c in p["collectives"]
            if c["name"] == "gradients"
        ]
        return found

    megatron = reduction(_zero_paper_plan(2))
    deepspeed = reduction(_zero_paper_plan(2, 500_000_000))
    assert (megatron["op"], megatron["sent_bytes"]) == ("reduce-scatter", 14_678_463_744)
    assert (deepspeed["op"], deepspeed["ranks"], deepspeed["bytes"]) == (
        "all-reduce",
        64,
        14_911_455_232,
    )
    # a collective a bucket, each rounded to its ranks' chunks (`collectives.repeated`)
    assert abs(deepspeed["sent_bytes"] - 2 * 63 * 14_911_455_232 // 64) <= 64 * 2 * 63
    assert "use_multi_rank_bucket_allreduce" in deepspeed["overlap_rule"]
    two = _zero_paper_plan(2, 500_000_000)
    two = replace(two, batch=replace(two.batch, global_batch=128))
    assert reduction(two)["count"] == two.microbatches == 2
    # reduced in fp32 (DeepSpeed's communication_data_type), the flattened fp16 bucket is
    # cast beside itself for the all-reduce (a review): 4 B an element more where it is
    # held, the last bucket's 455,727,616 at the end
    ds = _zero_paper_plan(2, 500_000_000)
    wide = replace(ds, precision=replace(ds.precision, grad_reduce="fp32"))
    assert reduction(wide)["dtype"] == "fp32"
    assert _phase_peaks(wide)["dp.grads"] - _phase_peaks(ds)["dp.grads"] == 455_727_616 * 4


def test_deepspeeds_buffer_beside_a_pipeline_is_refused(tmp_path):
    """A review: DeepSpeed's pipeline engine refuses ZeRO 2 and 3 ("ZeRO-2 and ZeRO-3 are
    incompatible with pipeline parallelism", ``PipelineEngine.__init__``), so a plan naming
    its gradient buffer at either beside pp > 1 is refused, where it was priced, once, as
    DeepSpeed's (not as ZeRO 3 beside a pipeline too); ZeRO 1 beside a pipeline is not
    DeepSpeed's ZeRO 2 or 3 and loads."""
    from budget.errors import BudgetError

    text = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    assert text.count("  zero: 1\n") == 1 and "pp: 4" in text
    # DeepSpeed's ZeRO 2 keeps its gradients in the parameters' format (bf16)
    text = text.replace("  grads: fp32\n", "  grads: bf16\n")
    for zero in (1, 2, 3):
        path = tmp_path / f"zero{zero}.yaml"
        bucketed = f"  zero: {zero}\n  reduce_bucket: 500000000\n"
        path.write_text(text.replace("  zero: 1\n", bucketed), encoding="utf-8")
        if zero == 1:
            assert load_plan(path).parallel.reduce_bucket == 500_000_000
            continue
        with pytest.raises(BudgetError) as raised:
            load_plan(path)
        (problem,) = raised.value.problems
        assert problem.path == "$.parallel.reduce_bucket"
        assert f"DeepSpeed's ZeRO {zero}" in problem.message and "pp = 4" in problem.message


def test_deepspeeds_zero_3_for_a_model_with_experts_is_refused(tmp_path):
    """An audit (m501): DeepSpeed asserts "MoE not supported with Stage 3"
    (``DeepSpeedEngine._configure_zero_optimizer``), so DeepSeek-MoE 16B at ZeRO 3 with
    DeepSpeed's gradient buffer is refused, where it was priced; at ZeRO 2 it loads, and a
    search from it leaves DeepSpeed's ZeRO 3 layouts out by that rule."""
    from budget.errors import BudgetError
    from budget.search import Space, search
    from tests.plan_files import variant

    base = ROOT / "plans" / "deepseek-moe-16b.yaml"
    text = base.read_text(encoding="utf-8")
    assert text.count("  zero: 1\n") == 1 and "  grads: fp32\n" in text
    edits = (("  grads: fp32\n", "  grads: bf16\n"),)
    for zero in (2, 3):
        bucketed = ("  zero: 1\n", f"  zero: {zero}\n  reduce_bucket: 500000000\n")
        path = variant(tmp_path, f"ds{zero}.yaml", *edits, bucketed, base=base)
        if zero == 2:
            plan = load_plan(path)
            continue
        with pytest.raises(BudgetError) as raised:
            load_plan(path)
        (problem,) = raised.value.problems
        assert problem.path == "$.parallel.reduce_bucket"
        assert "MoE not supported with Stage 3" in problem.message
    space = Space(zero=(2, 3), pp=(1,), virtual_stages=(1,))
    outcome = search(plan, plan.topology.gpus, space)
    assert outcome.rejected.get("DeepSpeed's ZeRO 3 runs no experts", 0) > 0
    assert all(r.config.zero == 2 for r in outcome.results)


def test_an_fp16_runs_zero_1_message_names_fp16s_flags(tmp_path):
    """A review (m510): Megatron-LM's gradient-buffer flags sit under --bf16 and --fp16 apart
    (arguments.py): an fp16 run keeps an fp16 buffer by default and an fp32 one with
    --accumulate-allreduce-grads-in-fp32, where it was told bf16's flags."""
    from budget.errors import BudgetError
    from tests.plan_files import variant

    edits = (
        ("  params: bf16\n", "  params: fp16\n"),
        ("  grads: fp32\n", "  grads: fp16\n  grad_reduce: fp32\n"),
    )
    path = variant(tmp_path, "fp16.yaml", *edits, base=ROOT / "plans" / "llama3-70b.yaml")
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    (problem,) = raised.value.problems
    assert (
        "write grads: fp32 (Megatron-LM's --accumulate-allreduce-grads-in-fp32)" in problem.message
    )


def test_fp8_activations_are_refused_in_training_and_serving(tmp_path):
    """An audit (m508): activations: fp8 beside fp8 GEMMs halved every saved activation and
    every tensor- and pipeline-parallel transfer of Llama 3 70B (peak 39.9 → 32.7 GiB),
    where Transformer Engine quantizes the GEMMs' inputs alone (matmul: fp8). Refused in
    training, at its key; and in serving (an audit, m525: a 70B prefill's all-reduces sent
    in 1 byte, its time to first token 17.4 → 12.7 s), where vLLM's FP8 linear layers
    quantize their input and return it in the input's 16-bit format."""
    from tests.plan_files import refusal, variant

    edit = ("  activations: bf16\n", "  activations: fp8\n  matmul: fp8\n")
    path = variant(tmp_path, "fp8act.yaml", edit, base=ROOT / "plans" / "llama3-70b.yaml")
    problem = refusal(path)
    assert problem.path == "$.precision.activations"
    assert "write activations: bf16 with matmul: fp8" in problem.message
    serving = variant(
        tmp_path,
        "decode.yaml",
        ("  activations: bf16\n", "  activations: fp8\n"),
        base=ROOT / "plans" / "llama3-70b-decode.yaml",
    )
    problem = refusal(serving)
    assert problem.path == "$.precision.activations"
    assert "FP8 serving (vLLM, TensorRT-LLM)" in problem.message
    assert "write activations: bf16 with matmul: fp8 (and kv_cache: fp8" in problem.message


def test_a_master_copy_no_wider_than_its_weights_is_refused(tmp_path):
    """An audit (m501): master: fp8 beside params: bf16 was priced, lowering the optimizer
    states; a master copy is kept wider than the weights it updates (Micikevicius et al.,
    section 3.1; MS-AMP keeps fp16 ones beside fp8 weights), one as wide as they are being
    Apex's 16-bit remainder (NeMo's runs) beside bf16 weights alone, and any other no wider
    than its weights is refused at its key (fp16's exponent cannot hold a bf16 remainder: a
    review, m506)."""
    from budget.errors import BudgetError
    from tests.plan_files import variant

    base = ROOT / "plans" / "llama3-70b.yaml"
    for master in ("fp8", "fp16"):
        path = variant(
            tmp_path,
            f"m-{master}.yaml",
            ("  master: fp32\n", f"  master: {master}\n"),
            base=base,
        )
        with pytest.raises(BudgetError) as raised:
            load_plan(path)
        (problem,) = raised.value.problems
        assert problem.path == "$.precision.master"
        assert f"master: {master} beside params: bf16" in problem.message
    remainder = variant(
        tmp_path, "m-bf16.yaml", ("  master: fp32\n", "  master: bf16\n"), base=base
    )
    assert load_plan(remainder).precision.master == "bf16"


def test_comm_gemm_overlap_gathers_and_reduces_in_its_userbuffers(tmp_path):
    """An audit: under overlap.tp Transformer Engine gathers a layer's input into its
    userbuffer and reads a view of it (``fill_userbuffers_buffer_for_all_gather``), and
    writes a partial output or data gradient into its reduce-scatter's buffer
    (``get_buffer``); the ten buffers are counted already, and the tensors had been counted
    again beside them. Llama 3 70B at tp 8, 8,192 tokens: fc1's input gathered again
    (8,192 x 8,192 x 2 B) and its input gradient before reduction (as many) are views;
    under FP8 on Hopper only the gathered input's transpose (1 B an element) is made."""
    from tests.plan_files import variant

    base = ROOT / "plans" / "llama3-70b.yaml"
    edit = ("recompute: selective", "recompute: selective\noverlap: {tp: true}")
    plain = load_plan(base)
    overlapped = load_plan(variant(tmp_path, "overlapped.yaml", edit, base=base))
    full = 8192 * 8192 * 2

    def fc1_backward(plan):
        stage = derive(plan).stages[0]
        (phase,) = [p for p in stage.phases if p.name == "backward.mlp"]
        (instant,) = [i for i in phase.instants if i.label == "fc1 weight and input gradients"]
        return {a.name: a.total for a in instant.live}, sum(a.total for a in instant.live)

    (before, total), (after, overlapped_total) = fc1_backward(plain), fc1_backward(overlapped)
    again, partial = (
        "fc1 input (re-gathered for weight grad)",
        "fc1 input gradient (partial, before reduction)",
    )
    assert before[again] == before[partial] == full
    assert after[again] == after[partial] == 0
    buffers = after["Transformer Engine userbuffers (overlap.tp, 10 buffers)"]
    assert buffers == 10 * full
    assert overlapped_total - buffers == total - 2 * full
    fp8 = replace(overlapped, precision=replace(overlapped.precision, matmul="fp8"))
    assert fc1_backward(fp8)[0][again] == 8192 * 8192  # the transpose alone


def test_deepspeed_zero_2_exposes_its_last_bucket_of_the_size_it_names(tmp_path):
    """DeepSpeed reduces a bucket only when the next gradient would overflow
    reduce_bucket_size, and its epilogue reduces what is left once the backward is done,
    then synchronizes: the exposed share is the last bucket's, n − B·(⌈n/B⌉ − 1) of a rank's
    n gradients (stage_1_and_2.py). GPT 1.3B's 1,315,819,520 gradients, overlapped, at dp 8
    and micro-batch 1: at B = 5e7 under one layer's share (1/24), so a layer's is exposed as
    before; at 5e8, 315,819,520 of them, 24.0 %; at 2e9 all, the step as without overlap
    (an audit: the step read 6.56 s whatever B, 8.45 s at 2e9, with fp32 gradients DeepSpeed
    does not keep at ZeRO 2; bf16 ones reduced in fp32 here)."""
    from budget.report import to_dict
    from tests.plan_files import variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    layout = ("  zero: 1\n", "  zero: 2\n  reduce_bucket: {}\n")
    micro = ("micro: 4", "micro: 1")
    overlap = ("topology: {", "overlap: {dp_grads: true}\ntopology: {")
    # DeepSpeed's ZeRO 2 keeps its gradients in bf16, the parameters' format, and reduces
    # them in fp32 where asked (communication_data_type): the all-reduces as before
    grads = ("  grads: fp32\n", "  grads: bf16\n  grad_reduce: fp32\n")

    def run(size: int, *edits):
        path = variant(
            tmp_path,
            f"b{size}.yaml",
            (layout[0], layout[1].format(size)),
            micro,
            grads,
            *edits,
            base=base,
        )
        report = to_dict(build_report(load_plan(path)))
        (found,) = [
            c for p in report["phases"] for c in p["collectives"] if c["name"] == "gradients"
        ]
        return report["step"]["time_s"], found

    n = 1_315_819_520
    assert n - 500_000_000 * 2 == 315_819_520
    small, at_small = run(50_000_000, overlap)
    default, at_default = run(500_000_000, overlap)
    whole, at_whole = run(2_000_000_000, overlap)
    exposed, _ = run(2_000_000_000)
    assert at_small["exposed_s"] < at_default["exposed_s"] < at_whole["exposed_s"]
    assert small < default < whole
    assert at_whole["exposed_s"] == at_whole["time_s"] and whole == pytest.approx(exposed)
    # each bucket is a collective of its own, paying its n·α (an audit, m548): ⌈n / B⌉ calls
    # of an all-reduce over 8 GPUs, 14 steps each
    calls = {size: -(-n // size) for size in (50_000_000, 500_000_000, 2_000_000_000)}
    assert calls == {50_000_000: 27, 500_000_000: 3, 2_000_000_000: 1}
    for found, size in ((at_small, 50_000_000), (at_default, 500_000_000), (at_whole, n)):
        assert found["steps"] == 14 * calls.get(size, 1)
    # the last bucket is a call of its own: its share of the bytes and its own n·α
    share = at_default["exposed_s"] / at_default["time_s"]
    assert 315_819_520 / n < share < 0.26
    # the README's figures for the three sizes
    from budget.units import format_duration

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = (
        f"a layer's share at 5e7, {format_duration(small)} a step, a quarter of them at the "
        f"default 5e8, {format_duration(default)}, all of them at 2e9, {format_duration(whole)})"
    )
    assert said in text, said


def test_deepspeed_zero_2_with_gradients_unlike_the_parameters_is_refused(tmp_path) -> None:
    """An audit (m334): DeepSpeed's ZeRO 2 keeps its gradient partition in the parameters'
    format (``grads_in_partition``, stage_1_and_2.py; ``gradient_accumulation_dtype`` is read
    at ZeRO 1 only), so bf16 parameters with fp32 gradients beside ``reduce_bucket`` price a
    run DeepSpeed does not make: refused at precision.grads, and left out of a sweep; ZeRO 1
    beside the same keys is taken."""
    from budget.errors import BudgetError
    from budget.plan.load import load_plan
    from budget.search import Space, search
    from tests.plan_files import ROOT, variant

    edits = (("  zero: 1\n", "  zero: 2\n  reduce_bucket: 500000000\n"),)
    path = variant(tmp_path, "z2.yaml", *edits, base=ROOT / "plans" / "gpt-1.3b.yaml")
    assert "grads: fp32" in path.read_text(encoding="utf-8")
    with pytest.raises(BudgetError, match=r"\$\.precision\.grads: precision\.grads = fp32 beside"):
        load_plan(path)
    one = variant(tmp_path, "z1.yaml", ("zero: 2", "zero: 1"), base=path)
    plan = load_plan(one)
    outcome = search(plan, plan.topology.gpus, Space(zero=(1, 2), tp=(1,), pp=(1,)))
    assert {r.config.zero for r in outcome.results} == {1}


@pytest.mark.parametrize(
    ("edit", "where", "message"),
    [
        (
            ("  grads: fp32\n", "  grads: fp32\n  grad_reduce: bf16\n"),
            "$.precision.grad_reduce",
            "grad_reduce: bf16 beside grads: fp32 at ZeRO 1",
        ),
        (  # the flag that keeps fp32 is Megatron-LM's default (an audit, m501: told to write
            # --grad-reduce-in-bf16 for it)
            ("  grads: fp32\n", "  grads: bf16\n  grad_reduce: fp32\n"),
            "$.precision.grad_reduce",
            "grad_reduce: fp32 beside grads: bf16 at ZeRO 1",
        ),
        (
            ("recompute: selective\n", "recompute: selective\noverlap: {param_gather: true}\n"),
            "$.overlap.param_gather",
            "overlap.param_gather without overlap.dp_grads at ZeRO 1",
        ),
    ],
)
def test_megatron_zero_1_refuses_what_its_distributed_optimizer_does_not_run(
    tmp_path, edit, where, message
) -> None:
    """An audit (m337): ZeRO 1 is priced as Megatron-LM's distributed optimizer, which
    reduce-scatters its gradient buffer in place, in the buffer's format (fp32 gradients
    reduced in bf16 had been priced at half the bytes, with no bf16 copy), and which refuses
    --overlap-param-gather without --overlap-grad-reduce (priced as bucketed behind the
    forward). Each is refused at its key, exit 2; the search leaves such layouts out."""
    from budget.errors import BudgetError
    from budget.plan.load import load_plan
    from budget.search import Space, search
    from tests.plan_files import variant

    base = ROOT / "plans" / "llama3-70b.yaml"
    assert edit[0] in base.read_text(encoding="utf-8")
    path = variant(tmp_path, "z1.yaml", edit, base=base)
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    (problem,) = raised.value.problems
    assert problem.path == where and problem.message.startswith(message)
    if "grad_reduce: fp32" in message:
        assert "(Megatron-LM's default with --bf16, grad_reduce_in_fp32 on)" in problem.message
    elif "grad_reduce: bf16" in message:
        assert "(Megatron-LM's --grad-reduce-in-bf16, grad_reduce_in_fp32 off" in problem.message
    # ZeRO 3 (PyTorch FSDP's reduce_dtype, prefetched gathers) takes either
    edits = (("  zero: 1\n", "  zero: 3\n"), ("  pp: 4\n  dp: 16\n", "  pp: 1\n  dp: 64\n"))
    zero3 = variant(tmp_path, "z3.yaml", *edits, base=path)
    text = zero3.read_text(encoding="utf-8")
    assert "zero: 3" in text
    space = Space(tp=(8,), pp=(1,), zero=(1, 3), micro=(1,), virtual_stages=(1,))
    outcome = search(load_plan(zero3), 512, space)
    assert outcome.results and {r.config.zero for r in outcome.results} == {3}


def test_megatron_zero_0_reduces_its_gradients_in_the_format_it_keeps_them(tmp_path) -> None:
    """An audit (m528): ZeRO 0 with fp32 gradients and grad_reduce: bf16 was priced at half
    the all-reduce (gpt-1.3b over dp 8: 4.29 GiB, 20.0 ms, where its buffer sends 8.58 GiB in
    39.9 ms) with no bf16 copy and no cast, a run Megatron-LM's data-parallel wrapper does not
    make: it all-reduces its gradient buffer in place, in the buffer's format
    (``start_grad_sync``), as the distributed optimizer reduce-scatters it. Refused at its
    key, as at ZeRO 1, and left out of a sweep."""
    from budget.plan.load import load_plan
    from budget.search import Space, search
    from tests.plan_files import refusal, variant

    edits = (
        ("  zero: 1\n", "  zero: 0\n"),
        ("  grads: fp32\n", "  grads: fp32\n  grad_reduce: bf16\n"),
    )
    path = variant(tmp_path, "z0.yaml", *edits, base=ROOT / "plans" / "gpt-1.3b.yaml")
    problem = refusal(path)
    assert problem.path == "$.precision.grad_reduce"
    assert problem.message.startswith(
        "grad_reduce: bf16 beside grads: fp32 at ZeRO 0: Megatron-LM's data-parallel wrapper "
        "all-reduces its gradient buffer in place"
    )
    # fp32 parameters keep an fp32 buffer alone: told to reduce in fp32 (a review, m533:
    # "write grads: fp32 or fp32" beside grads: fp32)
    amp = variant(
        tmp_path,
        "amp.yaml",
        ("  params: bf16\n", "  params: fp32\n"),
        ("  master: fp32\n", "  master: none\n"),
        base=path,
    )
    assert refusal(amp).message.endswith(
        "its buffer is fp32 beside fp32 parameters, never bf16: write grad_reduce: fp32, or "
        "remove grad_reduce"
    )
    three = load_plan(variant(tmp_path, "z3.yaml", ("zero: 0", "zero: 3"), base=path))
    outcome = search(three, 8, Space(zero=(0, 1, 3), tp=(1,), pp=(1,)))
    assert "ZeRO 0 or 1 reducing its gradients in another format than it keeps them" in (
        outcome.rejected
    )
    assert outcome.results and {r.config.zero for r in outcome.results} == {3}


def test_a_fused_attention_backward_holds_its_output_gradient_beside_dq_dk_dv():
    """The fused kernel's backward reads dO, the output projection's input gradient, while
    it writes dQ, dK and dV (an audit, m386: left out of the instant). Llama 3 70B at tp 8
    with sequence parallelism, micro 1 at 8,192 tokens: dO is [8192, 64 heads x 128 / 8]
    bf16 = 8192 x 1024 x 2 = 16,777,216 B a rank. Eager attention's first product frees dO
    before dQ and dK exist, so its instant holds the scores' gradient instead of it."""
    plan = load_plan(ROOT / "plans" / "llama3-70b.yaml")

    def core(plan) -> Instant:
        phase = next(p for p in derive(plan).stages[0].phases if p.name == "backward.attention")
        return next(i for i in phase.instants if i.label == "attention core gradients")

    held = {a.name: a.total for a in core(plan).live}
    assert plan.model.attention != "eager"
    assert held["attention output gradient"] == 8192 * 1024 * 2
    eager = replace(plan, model=replace(plan.model, attention="eager"))
    assert "attention output gradient" not in {a.name for a in core(eager).live}


def test_an_interleaved_stage_mixing_dense_and_moe_chunks_peaks_at_a_state_it_holds():
    """The MoE validation layout (pp 2, v 4, chunks of 2 layers, layer 0 dense, 4
    micro-batches): stage 0's chunks hold (1, 1), (0, 2), (0, 2), (0, 2) dense and MoE
    layers. Megatron-LM's order warms up (2 − 0 − 1)·2 + 3·2 = 8 forwards and runs a 9th
    (c0 c0 c1 c1 c2 c2 c3 c3 c0): (3, 15) layer passes at the first backward; the backward
    of c3 leaves (3, 13), the next forward of c0 makes (4, 14), and so on. The most dense
    passes (4) and the most MoE (15) are never held together (an audit, m484: their sum was
    charged, one dense pass, 2.6 GiB, over the stage's peak); the stage keeps the heavier of
    (3, 15) and (4, 14), and an MoE pass keeps more than a dense one here."""
    from budget.accuracy import MEMORY_RUNS
    from budget.layers import flight_layers, frontier, stage_classes

    assert flight_layers([(1, 1), (0, 2), (0, 2), (0, 2)], 2, 0, 4) == ((4, 14), (3, 15))
    assert frontier([(3, 15), (4, 14), (3, 13), (2, 10), (4, 12)]) == ((4, 14), (3, 15))
    (run,) = [r for r in MEMORY_RUNS if r.name.startswith("MoE with MLA")]
    plan = plan_of(run)
    assert (plan.parallel.pp, plan.parallel.pipeline.virtual_stages) == (2, 4)
    classes = stage_classes(plan)
    assert classes[0].flight == ((4, 14), (3, 15))

    def peak(flight: tuple[tuple[int, int], ...]) -> int:
        held = [replace(classes[0], flight=flight), *classes[1:]]
        step = derive(plan, representatives=True, classes=held)
        return memory(step, plan.device.memory).stages[0].peak_bytes

    states = [peak(((d, e),)) for d, e in ((4, 14), (3, 15), (4, 15), (3, 14))]
    dense_pass, moe_pass = states[2] - states[1], states[1] - states[3]
    assert 0 < dense_pass < moe_pass  # one pass of each, as the stage keeps them
    assert peak(classes[0].flight) == max(states[:2]) == states[1]
    assert build_report(plan).stages[0].peak_bytes == states[1]  # was states[2], (4, 15)


def test_deepspeed_buckets_are_priced_each_at_its_own_size(tmp_path) -> None:
    """DeepSpeed reduces a backward's gradients a bucket at a time, each a collective of its
    own (an audit, m548: priced as one, n·α once), and each at its own size: NCCL picks the
    algorithm and reaches the bandwidth a bucket's size does (a review, m550: priced at the
    whole tensor's, a 20 MB bucket ran at the plateau it does not reach). GPT 1.3B at dp 8,
    ZeRO 2, B = 5e6: ⌈1,315,819,520 / 5e6⌉ = 264 all-reduces of 20 MB in fp32."""
    from dataclasses import replace

    from budget.schedule import price_move
    from budget.step import derive
    from tests.plan_files import variant

    edits = (
        ("  zero: 1\n", "  zero: 2\n  reduce_bucket: 5000000\n"),
        ("micro: 4", "micro: 1"),
        ("  grads: fp32\n", "  grads: bf16\n  grad_reduce: fp32\n"),
    )
    plan = load_plan(variant(tmp_path, "b.yaml", *edits, base=ROOT / "plans" / "gpt-1.3b.yaml"))
    (move,) = [
        m
        for p in derive(plan).stages[0].phases
        for m in p.moves
        if m.name == "gradients" and m.op == "all-reduce"
    ]
    assert move.calls == -(-1_315_819_520 // 5_000_000) == 264
    bucketed = price_move(plan, move)
    one = price_move(plan, replace(move, calls=1, size_bytes=move.size_bytes // 264))
    whole = price_move(plan, replace(move, calls=1))
    assert float(bucketed.time_s) == pytest.approx(264 * float(one.time_s))
    assert bucketed.steps == 264 * one.steps == 264 * 14
    # 264 buckets of 20 MB take longer than one call of 5.26 GB: their n·α and their ramp
    assert float(bucketed.time_s) > float(whole.time_s) + 263 * float(whole.latency_s)
