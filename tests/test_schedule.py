"""Time: totals and exposed parts of every collective, overlap rules and the step time."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budget.accuracy import RUNS, plan_file_name, plan_of
from budget.flops import Work
from budget.layers import chunk_times_differ, chunks_differ, stage_classes
from budget.pipeline import budget_plan, build_report
from budget.plan.load import load_plan
from budget.plan.model import Device, Overlap
from budget.schedule import (
    Replay,
    _by_name,
    _chunk_times,
    _extrapolated,
    _replay_ends,
    pipeline_replay,
    pipeline_replays,
    replay_of,
    shortened_count,
    step_time,
    work_time,
)
from budget.step import derive
from tests.builders import make_plan
from tests.plan_files import ROOT, refusal, variant

PLANS = sorted(Path(__file__).parent.parent.glob("plans/*.yaml"))
A100 = Device(
    memory=80 * 2**30,
    flops=(("bf16", 312e12), ("fp32", 19.5e12)),
    memory_bandwidth=2039e9,
)


def _timed(**kw):
    return replace(make_plan(**kw), device=A100)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_every_collective_has_total_at_least_exposed_at_least_zero(path):
    report = build_report(load_plan(path))
    assert report.step["time_s"] is not None
    for phase in report.phases:
        for c in phase.collectives:
            assert c.time_s is not None and c.exposed_s is not None
            assert c.time_s >= c.exposed_s >= 0, (phase.name, c.name)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_summary_is_the_phases_the_step_waits_for(path):
    """Training: the step's compute and exposed communication are the pacing stage's (and
    the longest gradient reduction's), so with the bubble they make the step; the rows, each
    at its costliest stage, add up to the step only with one stage (with stages, the loss of
    the last and the layers of a fuller middle one added up to 119 % of the step). Serving:
    the rows, each summed over the stages a pass crosses, add up to the step."""
    report = build_report(load_plan(path))
    step = report.step
    if report.mode == "train":
        waited = step["compute_s"] + step["exposed_comm_s"] + step["bubble_s"]
        # less the reduction a later stage ran while the stages ahead of it drained, and the
        # optimizer step one ran while they filled the next step's pipeline
        left = waited - step["drained_s"] - step["filled_s"]
        assert left == pytest.approx(step["time_s"], rel=1e-12)
        assert step["pacing_stage"] in range(len(report.stages))
    else:
        assert step["pacing_stage"] is None
    if report.mode != "train" or len(report.stages) == 1:
        assert step["compute_s"] == pytest.approx(sum(p.compute_s for p in report.phases))
        assert step["comm_s"] == pytest.approx(sum(p.comm_s for p in report.phases))
        assert step["exposed_comm_s"] == pytest.approx(sum(p.exposed_s for p in report.phases))
    for p in report.phases:
        assert p.comm_s == pytest.approx(sum(c.time_s * c.count for c in p.collectives))
        assert p.exposed_s == pytest.approx(sum(c.exposed_s * c.count for c in p.collectives))


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_overlapping_dp_grads_lowers_exposed_time_not_total(path):
    plan = load_plan(path)
    if plan.parallel.dp * plan.parallel.cp == 1:
        pytest.skip("no data-parallel reduction")
    plans = [replace(plan, overlap=replace(plan.overlap, dp_grads=x)) for x in (False, True)]
    off, on = (build_report(p) for p in plans)
    # every stage's communication takes as long either way (the rows may be other stages')
    totals = [
        [sum(p.comm_s * p.count for p in s.phases) for s in step_time(p, derive(p)).stages]
        for p in plans
    ]
    assert totals[1] == pytest.approx(totals[0])
    assert on.step["exposed_comm_s"] < off.step["exposed_comm_s"]
    assert on.step["time_s"] < off.step["time_s"]


def _dp_grads(plan, stage):
    """Stage `stage`'s data-parallel gradient reduction as timed (`schedule.TimedMove`)."""
    stages = step_time(plan, derive(plan)).stages
    phase = next(p for p in stages[stage].phases if p.name == "dp.grads")
    return phase.moves[0], stages[stage]


def test_dp_overlap_leaves_the_last_bucket_exposed():
    """Megatron-LM's --overlap-grad-reduce: the first stage's buckets reduce behind the
    backward of the last micro-batch; the last bucket (one layer's gradients here) cannot be
    hidden: exposed = max(T/L, T − (L − 1)/L · W), L = 12 layers a stage, W that backward.
    A later stage of a 1F1B pipeline keeps its gradients in one bucket (Megatron-Core sets
    ``bucket_size`` to None past pipeline rank 0) and reduces it once its last backward is
    done: all of T is exposed, from its own end (its lead, `StageTime.lead_s`).

    GPT-3 at tp 8, pp 8 (rotary positions, tied embeddings): 12 layers of 12h²/8 = 1.5h²
    sharded weights and 2 LayerNorms' scale and bias (4h, replicated) each; the first stage
    adds the embedding, 51,200·h/8, the last the tied output layer's copy of it and the
    final LayerNorm, 2h; h = 12,288:
    first 12 x (226,492,416 + 49,152) + 78,643,200 = 2,797,142,016 parameters per rank,
    last 2,797,142,016 + 24,576 = 2,797,166,592; in fp32 gradients 11,188,568,064 B and
    11,188,666,368 B, reduce-scattered over the dp group."""
    layer = 3 * 12288**2 // 2 + 4 * 12288
    first = 12 * layer + 51200 * 12288 // 8
    assert (first, first + 2 * 12288) == (2_797_142_016, 2_797_166_592)
    sizes = (4 * first, 4 * (first + 2 * 12288))  # fp32
    assert sizes == (11_188_568_064, 11_188_666_368)

    # dp 2, 8 micro-batches of 8: one backward of 8 sequences (~0.76 s) hides all but the
    # first stage's last bucket, so the floor binds. The dp pair is 8 ranks apart (order tp,
    # ..., dp): one ring step on InfiniBand (25 GB/s, 10 µs) of S/2:
    # first T = 10 µs + 5,594,284,032 B / 25e9 = 223.781 ms; its last bucket, a call of its
    # own, exposed: its own 10 µs and 1/12 of the bytes' time, 18.658 ms (an audit, m148:
    # T/12, 18.648 ms, charged the bucket a twelfth of the ring's n·α);
    # last T = 10 µs + 5,594,333,184 B / 25e9 = 223.783 ms, all of it exposed.
    plan = replace(_timed(zero=1, micro=8, dp=2, global_batch=256), overlap=Overlap(dp_grads=True))
    assert build_report(plan).stages[0].layers == 12
    grads, _ = _dp_grads(plan, 0)
    assert grads.move.size_bytes == sizes[0]
    t = 10e-6 + (sizes[0] // 2) / 25e9
    assert t * 1e3 == pytest.approx(223.781, abs=5e-4)
    assert grads.time_s == pytest.approx(t, rel=1e-12)
    assert grads.exposed_s == pytest.approx(10e-6 + (t - 10e-6) / 12, rel=1e-12)
    assert grads.exposed_s * 1e3 == pytest.approx(18.658, abs=5e-4)
    grads, last = _dp_grads(plan, 7)
    assert grads.move.size_bytes == sizes[1]
    t = 10e-6 + (sizes[1] // 2) / 25e9
    assert t * 1e3 == pytest.approx(223.783, abs=5e-4)
    assert grads.time_s == pytest.approx(t, rel=1e-12)
    assert grads.exposed_s == pytest.approx(t, rel=1e-12)
    assert last.lead_s > t  # reduced in the drain: the first stage's last bucket ends later

    # dp 16, micro-batch 1: one sequence's backward W hides less, so T − 11/12·W binds. The
    # 16 ranks are one per node: a ring of 15 steps on InfiniBand, each rank sending
    # 15/16 · S = 10,489,282,560 B: T = 150 µs + 419.571 ms = 419.721 ms. W is the engine's
    # roofline of the first stage's backward kernels (`_windows`), taken as given: what is
    # under test is the overlap rule exposed = max(T/L, T − share·W) and the hand-computed
    # T, not the kernel times (those are checked against the roofline elsewhere, e.g.
    # test_gemm_time_is_flops_over_derated_peak). The compute beside the reduction runs s =
    # 18.9 % slower (`overlap.slowdown`: at 1 − s of its rate), so it lasts 11/12·W / (1 − s)
    # and hides that much of T, adding s times that to the compute (an audit: T − 11/12·W,
    # and the slowdown added beside it, charged the slowed compute twice).
    from budget.plan.model import OVERLAP_SLOWDOWN
    from budget.schedule import _kernels, _windows

    plan = replace(_timed(zero=1), overlap=Overlap(dp_grads=True))
    grads, _ = _dp_grads(plan, 0)
    assert grads.exposed_s >= grads.time_s / 12 - 1e-12
    t = 15 * 10e-6 + 15 * (sizes[0] // 16) / 25e9
    assert t * 1e3 == pytest.approx(419.721, abs=5e-4)
    assert grads.time_s == pytest.approx(t, rel=1e-12)
    step = derive(plan)
    first_stage = step.stages[0]
    kernels = _kernels(plan, first_stage)
    window = _windows(first_stage, kernels, step.microbatches)["@backward-microbatch"]
    hidden = 11 / 12 * window / (1 - OVERLAP_SLOWDOWN)
    assert t - hidden > t / 12  # the case where the window, not the floor, binds
    assert grads.exposed_s == pytest.approx(t - hidden, rel=1e-12)
    assert grads.slowdown_s == pytest.approx(OVERLAP_SLOWDOWN * hidden, rel=1e-12)
    # the window and its slowdown end under the reduction's hidden part: W/12 + T in all
    assert 11 / 12 * window + grads.slowdown_s + grads.exposed_s == pytest.approx(t, rel=1e-12)
    # an interleaved stage reduces chunk by chunk, bucketed or not: no later stage's
    # reduction is exposed whole
    plan = replace(
        _timed(zero=1, schedule="interleaved", virtual_stages=2), overlap=Overlap(dp_grads=True)
    )
    grads, _ = _dp_grads(plan, 7)
    assert grads.exposed_s < grads.time_s


def test_tp_overlap_hides_forward_collectives_behind_gemms():
    off = build_report(_timed())
    on = build_report(replace(_timed(), overlap=Overlap(tp=True)))
    fwd = {p.name: p for p in on.phases}["forward.mlp"]
    assert all(c.exposed_s < c.time_s for c in fwd.collectives)
    assert on.step["exposed_comm_s"] < off.step["exposed_comm_s"]
    # the input's all-gather hides behind 7/8 of fc1 (ring exchange, tp = 8 GEMM chunks):
    # T = 7 x 3 µs + 7/8 x (2048 x 12288 x 2 B) / 300e9 = 167.80064 µs against
    # G = 2 x 2048 x 12288 x 6144 / (0.8 x 312e12) = 1,238.933 µs: max(0, T − 7/8·G) = 0
    gather = {c.name: c for c in fwd.collectives}["MLP input"]
    t = 7 * 3e-6 + 7 / 8 * (2048 * 12288 * 2) / 300e9
    g = 2 * 2048 * 12288 * 6144 / (0.8 * 312e12)
    assert gather.time_s == pytest.approx(t, rel=1e-12)
    assert gather.exposed_s == max(0.0, t - 7 / 8 * g) == 0.0


def _row_gemm_and_scatter(plan, phase: str, gemm: str, scatter: str):
    """(the row-parallel GEMM's seconds, that phase's reduce-scatter row) of `plan`."""
    report = build_report(plan)
    rows = {c.name: c for c in {p.name: p for p in report.phases}[phase].collectives}
    step = derive(plan)
    works = next(p for p in step.stages[0].phases if p.name == phase).works
    seconds = sum(work_time(plan, w) for w in works if w.name == gemm)
    return seconds, rows[scatter]


@pytest.mark.parametrize(
    ("hidden", "tp"),
    [(12288, 8), (2048, 8)],  # GPT-3's fc2 far longer than its scatter; a 2048-wide model's not
)
def test_tp_overlap_pipelines_the_row_parallel_reduce_scatter_in_4_chunks(hidden, tp):
    """Transformer Engine pipelines the row-parallel GEMM and its reduce-scatter in 4 chunks
    (``num_splits`` 4 for proj_fprop and fc2_fprop; NeMo's H100 recipes keep it): each
    chunk is a reduce-scatter of its own, n·α included, behind the next GEMM chunk; the first
    GEMM chunk has nothing to hide and the last chunk's scatter nothing beside it. With α
    and B the unchunked latency and bandwidth terms, G the GEMM and s the overlap slowdown
    (18.9 %: the GEMM chunks beside the scatter run at 1 − s of their rate, so last 1 / (1 −
    s) as long, and hide as much more): 4α + B in all, and exposed max(α + B/4, 4α + B −
    3G/4 / (1 − s)).

    By hand, NVLink 300 GB/s at 3 µs (no ramp), the scattered tensor 2048 tokens x h x 2 B,
    each chunk a ring reduce-scatter over 8 of 7 steps moving 7/8 of its quarter:
    h = 12,288: S = 50,331,648 B; 4 x 7 x 3 µs = 84 µs of latency and
    4 x (7/8 x 12,582,912) B / 300e9 = 146.80064 µs: T = 230.80064 µs; fc2 (2 x 2048 x 6144
    x 12288 FLOPs at 0.8 x 312 TFLOP/s) takes 1,238.933 µs, so the last chunk alone waits,
    21 + 36.70016 = 57.70016 µs.
    h = 2048: S = 8,388,608 B; 84 µs + 7/8 x 8,388,608 / 300e9 = 24.46677 µs: T = 108.46677
    µs; fc2, G = 2 x 2048 x 1024 x 2048 / (0.8 x 312e12) = 34.41480 µs (compute-bound: its
    16 MiB of operands and output take 10.3 µs at 0.8 x 2,039 GB/s), so exposed =
    T − 0.75·G / 0.811 = 76.64051 µs."""
    plan = replace(
        _timed(hidden=hidden, heads=hidden // 128, ffn=4 * hidden), overlap=Overlap(tp=True)
    )
    gemm, scatter = _row_gemm_and_scatter(plan, "forward.mlp", "MLP fc2", "MLP output")
    size = 2048 * hidden * 2
    latency = 4 * 7 * 3e-6  # four chunks of 7 ring steps at α = 3 µs
    bandwidth = 4 * (7 / 8 * size / 4) / 300e9
    alpha = latency / 4  # one chunk's n·α
    fc2 = 2 * 2048 * (4 * hidden // tp) * hidden / (0.8 * 312e12)
    if hidden == 12288:
        assert (latency + bandwidth) * 1e6 == pytest.approx(230.80064, abs=1e-9)
        assert (alpha + bandwidth / 4) * 1e6 == pytest.approx(57.70016, abs=1e-9)
    else:
        assert bandwidth * 1e6 == pytest.approx(24.46677, abs=5e-6)
        assert fc2 * 1e6 == pytest.approx(34.41480, abs=5e-6)
        slowed = 0.75 * fc2 / 0.811
        assert (latency + bandwidth - slowed) * 1e6 == pytest.approx(76.64051, abs=5e-6)
    assert gemm == pytest.approx(fc2, rel=1e-12)
    assert scatter.op == "reduce-scatter"
    assert scatter.bytes == size
    assert scatter.latency_term_s == pytest.approx(latency, rel=1e-12)
    assert scatter.bandwidth_term_s == pytest.approx(bandwidth, rel=1e-12)
    assert scatter.time_s == pytest.approx(4 * alpha + bandwidth, rel=1e-12)
    assert scatter.steps == 4 * (8 - 1)  # four ring reduce-scatters over 8 ranks
    assert scatter.chunks == 4
    expected = max(alpha + bandwidth / 4, 4 * alpha + bandwidth - 0.75 * fc2 / 0.811)
    assert scatter.exposed_s == pytest.approx(expected, rel=1e-12)
    assert "in 4 chunks, each its own collective (the last one exposed)" in scatter.overlap_rule
    report = build_report(plan)
    gather = {c.name: c for c in {p.name: p for p in report.phases}["forward.mlp"].collectives}
    assert gather["MLP input"].op == "all-gather"  # ring exchange: no chunk left over
    # the all-gather hides behind 7/8 of fc1 (one GEMM chunk of tp has nothing to receive),
    # slowed, fc1 as long as fc2 here (h x 4h/tp either way): T = 7 x 3 µs + 7/8·S / 300e9
    gathered = 7 * 3e-6 + 7 / 8 * size / 300e9
    assert gather["MLP input"].time_s == pytest.approx(gathered, rel=1e-12)
    assert gather["MLP input"].exposed_s == pytest.approx(
        max(0.0, gathered - 7 / 8 * fc2 / 0.811), rel=1e-12, abs=1e-15
    )
    if hidden == 12288:  # the scatter is far shorter than its GEMM: only its last chunk waits
        assert expected == alpha + bandwidth / 4
        assert gather["MLP input"].exposed_s == 0.0
    else:  # four n·α and a GEMM too short to cover three chunks
        assert expected == 4 * alpha + bandwidth - 0.75 * fc2 / 0.811 > alpha + bandwidth / 4
        # 45.46677 − 7/8 x 34.41480 / 0.811 = 8.33613 µs of the gather waits
        assert gather["MLP input"].exposed_s * 1e6 == pytest.approx(8.33613, abs=5e-6)


def test_tp_overlap_without_sequence_parallelism_leaves_the_all_reduce_exposed():
    """Megatron-LM allows --tp-comm-overlap only with sequence parallelism."""
    report = build_report(replace(_timed(sp=False), overlap=Overlap(tp=True)))
    rows = {c.name: c for c in {p.name: p for p in report.phases}["forward.mlp"].collectives}
    reduce = rows["MLP output"]
    assert reduce.op == "all-reduce" and reduce.exposed_s == reduce.time_s
    assert reduce.overlap_rule == "tp forward: exposed (overlap.tp needs sequence parallelism)"


def test_overlap_slowdown_charges_the_hidden_part_to_compute():
    """Lee et al. (arXiv 2507.03114): compute beside a running collective is 18.9 % slower
    on average. A collective of total T hidden down to e adds 0.189·(T − e) of compute to
    its phase; what the step waits for on the collective (e) does not change."""
    plan = replace(_timed(), overlap=Overlap(tp=True))
    ideal = build_report(replace(plan, overlap=Overlap(tp=True, slowdown=0.0)))
    real = build_report(plan)
    assert plan.overlap.slowdown == 0.189
    fully_hidden = 0
    for p0, p1 in zip(ideal.phases, real.phases, strict=True):
        added = 0.0
        for c0, c1 in zip(p0.collectives, p1.collectives, strict=True):
            assert (c1.time_s, c1.exposed_s) == (c0.time_s, c0.exposed_s)
            assert c0.slowdown_s == 0.0
            assert c1.slowdown_s == pytest.approx(0.189 * (c0.time_s - c0.exposed_s))
            if c0.exposed_s == 0.0:  # all of it hidden: 18.9 % of its time, by hand
                fully_hidden += 1
                assert c1.slowdown_s == pytest.approx(0.189 * c1.time_s)
                assert "slows the compute beside it 18.9%" in (c1.overlap_rule or "")
            added += c1.slowdown_s * c1.count
        assert p1.slowdown_s == pytest.approx(added)
        assert p1.compute_s == pytest.approx(p0.compute_s + added)
        assert p1.exposed_s == pytest.approx(p0.exposed_s)
    assert fully_hidden
    assert real.step["exposed_comm_s"] == pytest.approx(ideal.step["exposed_comm_s"])
    assert real.step["overlap_slowdown_s"] == pytest.approx(
        real.step["compute_s"] - ideal.step["compute_s"]
    )
    assert real.step["time_s"] > ideal.step["time_s"]


def test_a_collective_that_outlasts_its_slowed_compute_sets_the_time_once(tmp_path):
    """Compute beside a running collective makes progress at 1 − s of its rate, so its W
    seconds last W / (1 − s) beside it. A collective hidden whole for T adds s·T; one that
    outlasts its compute hides W / (1 − s) of itself and waits the rest: compute, slowdown
    and exposed wait add up to T, as they do with no slowdown (an audit: it waited T − W
    beside a slowdown of s·W, T + s·W in all). Llama 3 8B under FSDP2 over 8 H100s at 512
    tokens: a layer's gather outlasts its forward; that phase takes as long as with no
    slowdown, its collective's time. (In the backward the gather and the gradients'
    reduce-scatter outlast a layer's compute too, but the first layer's reduce-scatter runs
    by the embedding's backward instead, so that phase averages in one instance where the
    gather alone hides: an audit, m454.)"""
    path = variant(
        tmp_path,
        "short.yaml",
        ("seq: 8192", "seq: 512"),
        base=ROOT / "plans" / "llama3-8b-fsdp.yaml",
    )
    plan = load_plan(path)
    s = plan.overlap.slowdown
    assert s == 0.189
    ideal = build_report(replace(plan, overlap=replace(plan.overlap, slowdown=0.0)))
    real = build_report(plan)
    hidden_whole = 0
    for p0, p1 in zip(ideal.phases, real.phases, strict=True):
        for c0, c1 in zip(p0.collectives, p1.collectives, strict=True):
            assert c1.time_s == c0.time_s
            hidden = c1.time_s - c1.exposed_s
            # for as long as it runs hidden: slower where it shares a link (`pace`, the
            # head gradients' beside the layers' reduce-scatters on NVLink)
            assert c1.slowdown_s == pytest.approx(s * hidden / c1.pace, rel=1e-12, abs=1e-15)
            if c0.exposed_s == 0.0:  # hidden whole: the same wait, s·T more compute
                hidden_whole += 1
                assert c1.exposed_s == 0.0
    assert hidden_whole
    phases = [{p.name: p for p in report.phases} for report in (ideal, real)]
    (gather0,), (gather,) = (p["forward.attention"].collectives for p in phases)
    window = gather0.time_s - gather0.exposed_s  # the forward it hides behind, unslowed
    assert gather.time_s - gather.exposed_s == pytest.approx(window / (1 - s), rel=1e-12)
    assert window + gather.slowdown_s + gather.exposed_s == pytest.approx(gather.time_s)
    for name in ("forward.attention",):
        before, after = (p[name] for p in phases)
        assert after.exposed_s > 0 and after.slowdown_s > 0  # slowed, and still outlasted
        assert after.compute_s + after.exposed_s == pytest.approx(
            before.compute_s + before.exposed_s, rel=1e-12
        )
        assert after.compute_s + after.exposed_s == pytest.approx(
            before.compute_s
            - sum((c.time_s - c.exposed_s) * c.count for c in before.collectives)
            + sum(c.time_s * c.count for c in after.collectives),
            rel=1e-12,
        )


def test_overlap_slowdown_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match=r"overlap\.slowdown"):
        Overlap(slowdown=1.0)
    with pytest.raises(ValueError, match=r"overlap\.slowdown"):
        Overlap(slowdown=-0.1)


def test_gemm_time_is_flops_over_derated_peak():
    """Roofline (Williams et al. 2009): a large GEMM is compute-bound, so its time is
    2mkn / (peak x efficiency)."""
    from budget.flops import gemm

    work = gemm("test", 8192, 8192, 8192, 2)
    plan = _timed()
    expected = 2 * 8192**3 / (312e12 * plan.device.matmul_efficiency)
    assert work_time(plan, work) == pytest.approx(expected)


def test_pipeline_step_time_follows_the_1f1b_bubble():
    """Narayanan et al. (arXiv 2104.04473) eq. 1: the bubble is (p - 1)/m of the ideal time
    when every stage takes the same time per micro-batch; interleaving divides it by v."""
    plan = _timed(tp=8, pp=4, dp=1, global_batch=32, sp=True)
    times = step_time(plan, derive(plan))
    slowest = max(s.microbatch_s for s in times.stages)
    assert times.pipeline_s == pytest.approx(
        32 * slowest + sum(s.microbatch_s for s in times.stages) - slowest
    )
    assert times.bubble_s == pytest.approx(3 * slowest, rel=0.05)
    # exactly the closed form's Σt − max(t) from the stage times (the stages differ a little:
    # the embedding on the first, the loss on the last, so (p − 1)·max(t) only to 5 %)
    stage_times = [s.microbatch_s for s in times.stages]
    assert times.bubble_s == pytest.approx(sum(stage_times) - max(stage_times), rel=1e-12)
    inter = _timed(tp=8, pp=4, dp=1, global_batch=32, schedule="interleaved", virtual_stages=2)
    times2 = step_time(inter, derive(inter))
    assert times2.bubble_s == pytest.approx(times.bubble_s / 2, rel=0.05)
    # and interleaved, (Σt − max(t))/v with v = 2, but for the loss: the replay of
    # Megatron-LM's order (`layers.chunk_times_differ`) lets the last stage's last chunk,
    # which holds it, pace the stages waiting on it, a bubble up to 1 % longer where sends
    # leave as their ops end (overlap.pp), and 1.7 % without overlapped sends, whose steady
    # forwards' outputs leave with the backward after them (`schedule.late_waits`)
    stage_times2 = [s.microbatch_s for s in times2.stages]
    closed = (sum(stage_times2) - max(stage_times2)) / 2
    assert closed < times2.bubble_s < 1.02 * closed
    late = replay_of(inter, list(times2.stages), 32)
    extra = late.pipeline() - replace(late, late=False).pipeline()
    assert late.late and extra > 0 and closed < times2.bubble_s - extra < 1.01 * closed


def test_mfu_counts_model_flops_only():
    """PaLM (arXiv 2204.02311) appendix B: MFU = (6N + 12·L·h·s) x tokens / (time x peak)."""
    plan = _timed()
    report = build_report(plan)
    h = 12288  # tied embeddings: the one V·h matrix is the output layer's GEMM, counted
    n = 12 * 96 * h * h + 4 * 96 * h + 2 * h + 51200 * h  # test_step's hand count
    tokens = 1536 * 2048
    flops = (6 * n + 12 * 96 * 12288 * 2048) * tokens
    expected = flops / (report.step["time_s"] * 1024 * 312e12)
    assert report.step["mfu"] == pytest.approx(expected)


def _nvlink3_share(mib: int) -> float:
    """The NVLink 3 ramp's share at a published size, recomputed from the published runs the
    catalogue cites (`budget.catalog.nccl_tests`): 8 x A100 all_reduce, Azure
    AI-benchmarking-guide ``Azure_Results/ND_A100_v4_results.md`` at 3bb66ca (in-place busbw)
    and OCI BM.GPU4.8 (oracle-japan/ocitutorials ``spinup-gpu-cluster.md``, out-of-place
    time). share(S) = (f·S / B) / (t(S) − n·α), f = 2 x 7/8, n = 14, α = 3 µs, B = 231.58
    GB/s (the plateau), t = f·S / busbw for Azure; the two runs averaged."""
    azure_busbw = {8: 89.99e9, 16: 109.22e9, 32: 132.77e9, 64: 166.63e9}  # GB/s
    oci_time = {8: 185.8e-6, 16: 245.1e-6, 32: 398.2e-6, 64: 589.5e-6}  # µs
    f, n, alpha, plateau = 1.75, 14, 3e-6, 231.58e9
    size = mib * 2**20
    ideal = f * size / plateau
    return (
        ideal / (f * size / azure_busbw[mib] - n * alpha) + ideal / (oci_time[mib] - n * alpha)
    ) / 2


def test_pipelined_chunks_reach_the_bandwidth_of_their_own_size():
    """On a link with a measured ramp (NVLink 3 from nccl-tests sweeps) a quarter-size
    reduce-scatter reaches less of the plateau, so four chunks' bandwidth terms sum to more
    than the whole collective's.

    GPT-3's MLP output, S = 2048 x 12288 x 2 B = 48 MiB, each rank sending 7/8 of it,
    44,040,192 B (four chunks of 12 MiB: 11,010,048 B each). The ramp's shares at the
    published sizes (`_nvlink3_share`; reduce-scatter takes the all-reduce's, as the
    catalogue assumes): 0.48208 at 8 MiB, 0.59160 at 16, 0.67267 at 32, 0.84570 at 64,
    interpolated in lg S, lg(48/32) = lg(12/8) = 0.58496 of the way:
    share(48 MiB) = 0.67267 + 0.58496 x (0.84570 − 0.67267) = 0.77388,
    share(12 MiB) = 0.48208 + 0.58496 x (0.59160 − 0.48208) = 0.54614.
    Whole: 44,040,192 / (231.58e9 x 0.77388) = 245.74 µs; chunked: 4 x 11,010,048 /
    (231.58e9 x 0.54614) = 348.21 µs."""
    plan = load_plan(Path(__file__).parent.parent / "plans" / "gpt3-175b.yaml")
    rows = {}
    for on in (False, True):
        report = build_report(replace(plan, overlap=replace(plan.overlap, tp=on)))
        mlp = {p.name: p for p in report.phases}["forward.mlp"].collectives
        rows[on] = {c.name: c for c in mlp}["MLP output"]
    whole, chunked = rows[False], rows[True]
    assert (whole.chunks, chunked.chunks) == (1, 4)
    assert chunked.sent_bytes == pytest.approx(whole.sent_bytes, rel=1e-6)
    assert chunked.bandwidth_term_s > whole.bandwidth_term_s
    assert chunked.latency_term_s == pytest.approx(4 * whole.latency_term_s)
    shares = {mib: _nvlink3_share(mib) for mib in (8, 16, 32, 64)}
    expected_shares = {8: 0.48208, 16: 0.59160, 32: 0.67267, 64: 0.84570}
    assert shares == pytest.approx(expected_shares, abs=5e-6)
    x = math.log2(1.5)  # 48 MiB between 32 and 64, 12 MiB between 8 and 16
    big = shares[32] + x * (shares[64] - shares[32])
    small = shares[8] + x * (shares[16] - shares[8])
    assert (big, small) == pytest.approx((0.77388, 0.54614), abs=5e-6)
    assert whole.sent_bytes == 7 * 48 * 2**20 // 8 == 44_040_192
    assert whole.latency_term_s == pytest.approx(7 * 3e-6, rel=1e-12)
    unchunked = 44_040_192 / (231.58e9 * big)
    pieces = 4 * 11_010_048 / (231.58e9 * small)
    assert (unchunked * 1e6, pieces * 1e6) == pytest.approx((245.74, 348.21), abs=5e-3)
    assert whole.bandwidth_term_s == pytest.approx(unchunked, rel=1e-12)
    assert chunked.bandwidth_term_s == pytest.approx(pieces, rel=1e-12)


def test_overlap_pp_under_1f1b_says_it_needs_the_interleaved_schedule():
    """Megatron-LM turns --overlap-p2p-communication off without virtual stages, and
    Megatron-Core's 1F1B schedule raises on it: the sends stay exposed, and the rule says
    why rather than nothing (it read as if the flag were off)."""
    from tests.plan_files import ROOT

    plan = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    assert plan.parallel.pipeline.schedule == "1f1b" and plan.parallel.pp > 1
    on = build_report(replace(plan, overlap=replace(plan.overlap, pp=True)))
    off = build_report(plan)
    sends = [c for p in on.phases for c in p.collectives if c.op == "send-recv"]
    assert sends and all(c.exposed_s == c.time_s for c in sends)
    assert all("overlap.pp needs the interleaved schedule" in (c.overlap_rule or "") for c in sends)
    assert on.step["time_s"] == off.step["time_s"]


def test_moves_sharing_a_window_hide_one_after_the_other(tmp_path):
    """Ring attention's backward sends K/V and dK/dV around the ring together (Transformer
    Engine's ``AttnFuncWithCPAndKVP2P.backward``), both beside the attention backward, each
    of its cp steps beside its own (an audit: priced beside (cp - 1)/cp of it): of that
    window W, the K/V exchange hides min(T₁, W) and the dK/dV exchange only what is left
    (each was given all of W: review). Llama 3 70B at tp 8 and cp 4, so that the cp ring
    crosses InfiniBand, at 4,096 tokens, where the two outlast W and the first alone does
    not.
    Sequence parallelism's re-gather and reduce-scatter split the QKV backward GEMM between
    them instead (its input- and weight-gradient halves), each hiding behind its own half.
    What is left of a window runs 1 / (1 − s) as long beside a move that outlasts it (s the
    overlap slowdown), and hides that much of it."""
    from budget.schedule import _by_name, price_move, time_phase

    text = (Path(__file__).parent.parent / "plans" / "llama3-70b.yaml").read_text("utf-8")
    path = tmp_path / "cp4.yaml"
    text = text.replace("  dp: 16\n", "  dp: 4\n  cp: 4\n").replace("seq: 8192", "seq: 4096")
    path.write_text(text, encoding="utf-8")
    plan = load_plan(path)
    (phase,) = [p for p in derive(plan).stages[0].phases if p.name == "backward.attention"]
    kernels = _by_name(plan, phase)
    timed = {t.move.name: t for t in time_phase(plan, phase, {}, price_move, kernels).moves}
    kv, dkv = timed["attention K/V (ring exchange)"], timed["attention dK/dV (ring exchange)"]
    window = kernels[kv.move.window]
    stretch = 1 / (1 - plan.overlap.slowdown)
    assert kv.time_s < window * stretch < kv.time_s + dkv.time_s
    assert kv.exposed_s == pytest.approx(max(0.0, kv.time_s - window * stretch))
    left = window - (kv.time_s - kv.exposed_s) / stretch  # compute seconds it left
    assert dkv.exposed_s == pytest.approx(max(0.0, dkv.time_s - left * stretch))
    assert dkv.exposed_s > max(0.0, dkv.time_s - window * stretch)  # the case the rule changes
    regather = timed["attention input again, for weight grad"]
    reduce = timed["attention input gradient"]
    half = kernels[regather.move.window] / 2
    for t in (regather, reduce):
        assert t.exposed_s == pytest.approx(max(0.0, t.time_s - half * stretch))


@pytest.mark.parametrize("v", [2, 4])
def test_an_interleaved_stage_reduces_its_gradients_chunk_by_chunk(v):
    """Megatron-LM launches an interleaved stage's gradient reduction per model chunk, as the
    chunk finishes its last micro-batch (``backward_step_helper_postprocess`` calls
    ``grad_sync_func[chunk]``): chunk v - 1's part runs behind the p backward steps of each
    later chunk, and only the last chunk's part waits, all of it: it is launched once that
    chunk's last backward, the stage's last, has ended (an audit: its own backward had been
    taken to hide share·W/v of it). GPT-3 at tp 8, pp 8, dp 16 with overlap.dp_grads: the
    reduction T outlasts one micro-batch's backward window W (share (L - 1)/L), so at v = 1
    it waits T - share·W; interleaved, f·T, f the share of stage 0's parameters in its
    chunk 0 (1/v of its layers and the embeddings: review), and the earlier chunks' (1 - f)·T
    fit in (v - 1)·p/v of the window (it waited as if in one piece)."""
    from budget.schedule import _kernels, _windows, price_move, time_phase

    def reduction(virtual: int):
        plan = replace(
            _timed(schedule="interleaved" if virtual > 1 else "1f1b", virtual_stages=virtual),
            overlap=Overlap(dp_grads=True, slowdown=0.0),
        )
        stage = derive(plan).stages[0]
        kernels = _kernels(plan, stage)
        windows = _windows(stage, kernels, derive(plan).microbatches)
        (i,) = [i for i, p in enumerate(stage.phases) if p.name == "dp.grads"]
        moves = time_phase(plan, stage.phases[i], windows, price_move, kernels[i]).moves
        (t,) = [t for t in moves if t.move.name == "gradients"]  # the sp-partial ones apart
        layers = stage.layers
        return t, (layers - 1) / layers * windows["@backward-microbatch"], t.time_s / layers, plan

    from budget.layers import stage_params

    one, room, _, _ = reduction(1)
    assert one.exposed_s == pytest.approx(one.time_s - room) and one.exposed_s > 0
    chunked, room, last_bucket, plan = reduction(v)
    assert chunked.time_s == pytest.approx(one.time_s)  # the same bytes, in v launches
    params = stage_params(plan, 0)
    root = sum(n for name, n in params.parts if "embedding" in name)
    f = ((params.per_rank - root) / v + root) / params.per_rank
    assert 1 / v < f < 1 / v + 0.1  # 51,200 x 12,288 / 8 embedding rows (+ positions) are small
    assert (1 - f) * chunked.time_s <= room * (v - 1) * 8 / v  # the earlier parts hide
    assert chunked.exposed_s == pytest.approx(max(last_bucket, f * chunked.time_s))
    assert "interleaved: per model chunk" in chunked.rule


def test_stage_sends_are_priced_on_the_link_their_own_pair_crosses(tmp_path):
    """GPT-3 at tp 4, pp 4 with pp inside dp (order tp, pp, ...) on DGX A100s: the pp group
    is ranks 0, 4, 8, 12, so stages 0-1 and 2-3 talk over NVLink and stages 1-2 across
    nodes. Each stage's sends are priced on its own pair's link (an audit, m446: every one had been
    priced on the slowest pair's; before a review, every one on the first pair's, 57 µs).
    The send is a micro-batch's activation split over tp by sequence parallelism, 2048 x
    12288 x 2 B / 4 = 12,582,912 B, in one step; on the dgx-a100 preset's InfiniBand (24
    GB/s, the HDR share; α 14 µs, no ramp): 14 µs + 12,582,912 / 24e9 s = 538.288 µs. The
    report's row is the stage where the phase costs most: one whose send crosses nodes."""
    from budget.schedule import move_span

    text = (Path(__file__).parent.parent / "plans" / "gpt3-175b.yaml").read_text("utf-8")
    text = text.replace("  tp: 8\n  pp: 8\n  dp: 16\n", "  tp: 4\n  pp: 4\n  dp: 64\n")
    text = text.replace("order: [tp, cp, ep, dp, pp]", "order: [tp, pp, cp, ep, dp]")
    path = tmp_path / "pp-inside.yaml"
    path.write_text(text, encoding="utf-8")
    plan = load_plan(path)
    links = {}
    for stage in derive(plan).stages:
        for phase in stage.phases:
            for move in phase.moves:
                if move.op == "send-recv":
                    (tier,) = move_span(plan, move).tiers
                    assert tier.ranks == 2
                    links[stage.stage, phase.name] = tier.link.name
    # one model chunk a stage: the last sends nothing forward, the first nothing back
    assert (3, "pipeline.forward") not in links and (0, "pipeline.backward") not in links
    forward = [links[s, "pipeline.forward"] for s in range(3)]
    backward = [links[s, "pipeline.backward"] for s in range(1, 4)]
    # boundaries 0-1, 1-2 and 2-3; backward, stage s sends across s-1 to s
    assert forward == backward == ["nvlink", "infiniband", "nvlink"]
    report = build_report(plan)
    (row,) = [c for p in report.phases if p.name == "pipeline.forward" for c in p.collectives]
    assert row.link == "infiniband"
    assert row.bytes == 2048 * 12288 * 2 // 4 == 12_582_912
    assert row.steps == 1
    assert row.time_s == pytest.approx(14e-6 + 12_582_912 / 24e9, rel=1e-12)
    assert row.time_s * 1e6 == pytest.approx(538.288, abs=5e-4)


def test_reductions_sharing_an_interleaved_window_wait_the_same_in_either_order(tmp_path):
    """Mixtral at seq 1,024, ep 2, pp 4, two model chunks, dp overlaps on: the dense and the
    expert gradients' reductions share the last micro-batch's backward, each drawing its
    last chunk's part from the last chunk's 1/v of it and its earlier parts from the later
    chunks' steps. What they leave waiting is the same whichever is launched first (it
    differed by 6 ms, 44.1 against 38.2, when one pool stood for both; review)."""
    from budget.schedule import _kernels, _windows, price_move, time_phase

    text = (Path(__file__).parent.parent / "plans" / "mixtral-8x7b.yaml").read_text("utf-8")
    text = text.replace("seq: 4096", "seq: 1024").replace("  ep: 8\n", "  ep: 2\n")
    text = text.replace(
        "  zero: 1\n", "  zero: 1\n  pipeline: {schedule: interleaved, virtual_stages: 2}\n"
    )
    text += "overlap: {dp_grads: true, param_gather: true}\n"
    path = tmp_path / "mixtral-interleaved.yaml"
    path.write_text(text, encoding="utf-8")
    plan = load_plan(path)
    step = derive(plan)
    stage = step.stages[0]
    kernels = _kernels(plan, stage)
    windows = _windows(stage, kernels, step.microbatches)
    for i, phase in enumerate(stage.phases):
        if phase.name not in ("dp.grads", "optimizer"):
            continue
        shared = [m for m in phase.moves if m.window]
        assert len(shared) == 2 and {m.rounds for m in shared} == {2}
        waits = [
            time_phase(plan, replace(phase, moves=moves), windows, price_move, kernels[i]).exposed_s
            for moves in (phase.moves, tuple(reversed(phase.moves)))
        ]
        assert waits[0] == pytest.approx(waits[1], rel=1e-9)


def test_earlier_chunks_wait_where_the_later_chunks_steps_are_too_short():
    """GPT-3 at tp 8 and pp 2, two model chunks: a stage's 11 B parameters reduce in about
    a second over 64 data-parallel ranks. The chunks' parts run one after the other on one
    communicator, all within the p = 2 steps of the later chunk (1/v of a micro-batch's
    backward each) and chunk 0's within its own last step, so the stage waits
    max(f·T - share·W/v, T - (v - 1)·p/v·share·W): here the second, T - share·W, a step
    more than chunk 0's own part alone would leave (review: chunk 0's last step was counted
    in both)."""
    from budget.schedule import _kernels, _windows, price_move, time_phase

    plan = replace(
        _timed(pp=2, dp=64, schedule="interleaved", virtual_stages=2),
        overlap=Overlap(dp_grads=True, slowdown=0.0),
    )
    step = derive(plan)
    stage = step.stages[0]
    kernels = _kernels(plan, stage)
    windows = _windows(stage, kernels, step.microbatches)
    (i,) = [i for i, p in enumerate(stage.phases) if p.name == "dp.grads"]
    moves = time_phase(plan, stage.phases[i], windows, price_move, kernels[i]).moves
    (t,) = [t for t in moves if t.move.name == "gradients"]
    room = (stage.layers - 1) / stage.layers * windows["@backward-microbatch"]
    whole = t.time_s - room * (2 - 1) * 2 / 2
    assert whole > t.time_s * t.move.last_part - room / 2 > 0
    assert t.exposed_s == pytest.approx(whole)


def test_chunk_0_carries_its_own_layers_when_the_split_is_uneven():
    """Model chunk 0 of an interleaved stage need not hold 1/v of the stage's layers (a
    search's uneven split, layers_per_stage): its share of the reduction counts its own
    layers and, on stage 0, the embedding (review: 0.293 where the split gives 0.214).
    GPT-3 at pp 8 and v 2 with stage 0's chunks of 10 and 2 layers."""
    from budget.layers import stage_params

    sizes = (10, 6, 6, 6, 6, 6, 6, 6, 2, 6, 6, 6, 6, 6, 6, 6)
    base = _timed(schedule="interleaved", virtual_stages=2)
    pipeline = replace(base.parallel.pipeline, layers_per_stage=sizes)
    plan = replace(
        base,
        parallel=replace(base.parallel, pipeline=pipeline),
        overlap=Overlap(dp_grads=True),
    )
    (phase,) = [p for p in derive(plan).stages[0].phases if p.name == "dp.grads"]
    (move,) = [m for m in phase.moves if m.name == "gradients"]
    params = stage_params(plan, 0)
    root = sum(n for name, n in params.parts if "embedding" in name)
    per_layer = (params.per_rank - root) / 12
    assert move.last_part == pytest.approx((10 * per_layer + root) / params.per_rank)


def test_tp_ring_exchange_hides_behind_all_but_the_last_gemm_chunk(tmp_path):
    """Transformer Engine's ring exchange runs tp - 1 transfers beside tp GEMM chunks, the
    last chunk with nothing to receive: (tp - 1)/tp of the column-parallel GEMM hides the
    input's all-gather (it was the whole GEMM). The output gradient's all-gather overlaps
    the dgrad GEMM only (ub_overlap_ag_dgrad), as the wgrad GEMM reads what it gathers: half
    of the row-parallel layer's backward, by ring. An audit of the overlap rules."""
    from budget.plan.load import load_plan
    from budget.step import derive
    from tests.plan_files import ROOT

    path = tmp_path / "tp.yaml"
    text = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    path.write_text(text + "overlap: {tp: true}\n", encoding="utf-8")
    plan = load_plan(path)
    assert plan.overlap.tp and plan.parallel.tp == 8
    moves = {(p.name, m.name): m for p in derive(plan).stages[0].phases for m in p.moves}
    gather = moves["forward.attention", "attention input"]
    assert (gather.window, gather.share) == ("QKV projection", 7 / 8)
    grad = moves["backward.attention", "attention output gradient"]
    assert (grad.window, grad.share, grad.part) == (
        "attention output projection backward",
        7 / 16,
        "input gradient",
    )


def test_tp_overlap_splits_its_gemms_and_narrows_the_pipelined_one(tmp_path):
    """Transformer Engine's comm-GEMM overlap (``initialize_ub`` defaults): the ring
    exchange runs its GEMM in tp chunks; the pipelined reduce-scatter's GEMM in 4 chunks on
    the device's SMs less the 16 the collective holds (``set_sm_margin``), which stands in
    for overlap.slowdown there. Llama 3 70B at tp 8 on H100 SXM (132 SMs), by hand from
    each kernel's FLOPs: fc2 forward of F FLOPs takes F / (989e12 · c(F/4)) · 132/116, with
    c(x) = ceiling · x / (x + half_flops) the device's curve; the QKV projection F /
    (989e12 · c(F/8)); the attention output projection's backward (dgrad + wgrad, two
    launches) ramps as 8 + 1 launches. Without overlap.tp every GEMM stays whole. Each is
    also slowed by its inner dimension (`inner_factor`): splitting a GEMM along its rows
    leaves that alone."""
    from budget.efficiency import curve_fraction, inner_factor

    base = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "tp.yaml"
    path.write_text(base + "overlap: {tp: true}\n", encoding="utf-8")
    plan = load_plan(path)
    whole = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    assert plan.device.sms == 132 and plan.overlap.tp_comm_sms.mlp == 16
    curve = plan.device.gemm
    assert curve is not None

    def seconds(work: Work, launches: float, sms: float = 132) -> float:
        depth = inner_factor(curve, work.inner)  # F / (x·g) + ramp: g·c(F/g)
        rate = 989e12 * depth * curve_fraction(curve, work.flops / launches / depth)
        return work.flops / rate * 132 / sms

    phases = {p.name: p for p in derive(plan).stages[0].phases}
    (fc2,) = [w for w in phases["forward.mlp"].works if w.name == "MLP fc2"]
    (qkv,) = [w for w in phases["forward.attention"].works if w.name == "QKV projection"]
    (proj,) = [
        w
        for w in phases["backward.attention"].works
        if w.name == "attention output projection backward"
    ]
    assert proj.launches == 2
    # inner dimensions by hand: fc2 over ffn / tp = 28672 / 8, QKV over hidden 8192, the
    # projection's backward over hidden (input gradient) and 8192 tokens (weight gradient)
    assert (fc2.inner, qkv.inner, proj.inner) == ((3584,), (8192,), (8192, 8192))
    # fc1's backward tells the two apart: its input gradient over the gate and up columns
    # (2 x 3584), its weight gradient over the 8192 tokens
    (fc1_back,) = [w for w in phases["backward.mlp"].works if w.name == "MLP fc1 backward"]
    assert fc1_back.inner == (7168, 8192)
    kernels = {p.name: _by_name(plan, p) for p in derive(plan).stages[0].phases}
    assert kernels["forward.mlp"]["MLP fc2"] == pytest.approx(seconds(fc2, 4, 116))
    assert kernels["forward.attention"]["QKV projection"] == pytest.approx(seconds(qkv, 8))
    assert kernels["backward.attention"]["attention output projection backward"] == (
        pytest.approx(seconds(proj, 9))
    )
    plain = {p.name: _by_name(whole, p) for p in derive(whole).stages[0].phases}
    assert plain["forward.mlp"]["MLP fc2"] == pytest.approx(seconds(fc2, 1))
    # the output layer is Megatron-LM's own ColumnParallelLinear, with no userbuffers: its
    # all-gather hides behind it, but it stays one GEMM (review)
    last = {p.name: _by_name(plan, p) for p in derive(plan).stages[-1].phases}
    last_whole = {p.name: _by_name(whole, p) for p in derive(whole).stages[-1].phases}
    assert last["loss"]["output layer"] == last_whole["loss"]["output layer"]
    # the pipelined reduce-scatter's hidden time no longer adds overlap.slowdown
    rows = {c.name: c for p in build_report(plan).phases for c in p.collectives}
    assert "its GEMM runs on 116 of 132 SMs" in rows["MLP output"].overlap_rule
    assert "slows the compute" not in rows["MLP output"].overlap_rule
    assert "slows the compute" in rows["MLP input"].overlap_rule


def test_an_aggregated_ring_exchange_runs_its_gemm_in_half_the_chunks(tmp_path):
    """A userbuffers configuration's ``aggregate: 1`` (`overlap.tp_comm_aggregate`) runs the
    ring exchange's GEMM in tp / 2 chunks of two (Transformer Engine's ``split_overlap_ag``):
    Llama 3 70B at tp 8 with qkv_fprop and proj_dgrad aggregated, by hand as in the test
    above: the QKV projection ramps as 4 launches, the attention output projection's
    backward as 4 + 1; MLP fc1, not named, keeps 8, and `true` names all four."""
    from budget.efficiency import curve_fraction, inner_factor
    from budget.step import ring_splits

    base = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "tp.yaml"
    some = "overlap: {tp: true, tp_comm_aggregate: [proj_dgrad, qkv_fprop]}\n"
    path.write_text(base + some, encoding="utf-8")
    plan = load_plan(path)
    assert plan.overlap.tp_comm_aggregate == ("qkv_fprop", "proj_dgrad")  # TE's order
    curve = plan.device.gemm
    assert curve is not None

    def seconds(work: Work, launches: float) -> float:
        depth = inner_factor(curve, work.inner)
        return work.flops / (989e12 * depth * curve_fraction(curve, work.flops / launches / depth))

    phases = {p.name: p for p in derive(plan).stages[0].phases}
    kernels = {name: _by_name(plan, p) for name, p in phases.items()}
    works = {w.name: w for p in phases.values() for w in p.works}
    projection = "attention output projection backward"
    assert kernels["forward.attention"]["QKV projection"] == pytest.approx(
        seconds(works["QKV projection"], 4)
    )
    assert kernels["backward.attention"][projection] == pytest.approx(seconds(works[projection], 5))
    assert kernels["forward.mlp"]["MLP fc1"] == pytest.approx(seconds(works["MLP fc1"], 8))
    rows = {c.name: c for p in build_report(plan).phases for c in p.collectives}
    assert (
        "by ring exchange in 4 GEMM chunks, aggregated: its first chunk's transfer waited for"
        in rows["attention input"].overlap_rule
    )
    assert "by ring exchange in 8 GEMM chunks" in rows["MLP input"].overlap_rule
    # its first GEMM, of two chunks, waits for the neighbour's first chunk (review m370): one
    # transfer of tp - 1 exposed, the other six beside three of the four GEMMs
    moves = {(p.name, m.name): m for p in phases.values() for m in p.moves}
    gather = moves["forward.attention", "attention input"]
    assert (gather.share, gather.floor) == (6 / 8, 1 / 7)
    grad = moves["backward.attention", "attention output gradient"]
    assert (grad.share, grad.floor) == (6 / 16, 1 / 7)
    timed, qkv = rows["attention input"], kernels["forward.attention"]["QKV projection"]
    hidden = 6 / 8 * qkv / (1 - plan.overlap.slowdown)
    assert timed.exposed_s == pytest.approx(max(timed.time_s / 7, timed.time_s - hidden))
    assert timed.exposed_s >= timed.time_s / 7 > 0
    assert moves["forward.mlp", "MLP input"].floor == 0
    path.write_text(base + "overlap: {tp: true, tp_comm_aggregate: true}\n", encoding="utf-8")
    every = load_plan(path)
    assert {ring_splits(every, gemm) for gemm in ("QKV projection", "MLP fc1")} == {4}
    assert ring_splits(every, "MLP fc2 backward") == ring_splits(every, projection) == 4
    assert ring_splits(load_plan(ROOT / "plans" / "llama3-70b.yaml"), "MLP fc1") == 8
    # without overlap.tp nothing is exchanged by ring, so aggregating would change nothing:
    # refused at the key (it was priced exposed whole and the key silently ignored)
    path.write_text(base + "overlap: {tp: false, tp_comm_aggregate: true}\n", encoding="utf-8")
    problem = refusal(path)
    assert problem.path == "$.overlap.tp_comm_aggregate"
    assert "overlap.tp turns on, and it is off here" in problem.message
    path.write_text(base + "overlap: {tp_comm_sms: 24}\n", encoding="utf-8")
    assert refusal(path).path == "$.overlap.tp_comm_sms"
    path.write_text(base + "overlap: {tp_comm_aggregate: false}\n", encoding="utf-8")
    assert load_plan(path).overlap.tp_comm_aggregate == ()  # none aggregated: nothing to tune


def test_an_aggregated_ring_exchange_over_two_ranks_hides_nothing(tmp_path):
    """At tp 2 Transformer Engine's aggregated exchange is one swap and one GEMM over both
    chunks, which waits for it (review m370: priced hidden, and the step faster than
    without aggregating)."""
    base = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    base = base.replace("tp: 8", "tp: 2").replace("dp: 16", "dp: 64")
    path = tmp_path / "tp2.yaml"
    path.write_text(base + "overlap: {tp: true, tp_comm_aggregate: [fc1_fprop]}\n", "utf-8")
    plan = load_plan(path)
    assert plan.parallel.tp == 2
    rows = {c.name: c for p in build_report(plan).phases for c in p.collectives}
    assert rows["MLP input"].exposed_s == rows["MLP input"].time_s > 0
    assert rows["attention input"].exposed_s == 0


def test_zero3_last_block_reduce_scatter_of_a_micro_batch_runs_by_the_embedding(tmp_path):
    """Under ZeRO-3 with overlap.dp_grads each block's gradients reduce behind the next
    block's backward, but the stage's first attention block is the backward's last of a
    layer: FSDP's post-backward hook issues its reduce-scatter before autograd reaches the
    embedding, so it runs beside the embedding's backward, and the root's after both (an
    audit, m454: it had been exposed whole, one call of 24 a micro-batch). gpt-1.3b (24
    layers): 23 attention reduce-scatters a micro-batch hidden in the layers' phase, the
    24th in the embedding's, exposed beyond that phase's compute at the overlap's slowdown
    s (W / (1 − s)); the MLP's stay hidden."""
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    path = variant(tmp_path, "z3.yaml", ("zero: 1", "zero: 3"), base=base)
    path.write_text(
        path.read_text(encoding="utf-8") + "overlap: {dp_grads: true}\n", encoding="utf-8"
    )
    plan = load_plan(path)
    report = build_report(plan)
    phases = {p.name: p for p in report.phases}
    (attention,) = [c for c in phases["backward.attention"].collectives if c.op == "reduce-scatter"]
    (mlp,) = [c for c in phases["backward.mlp"].collectives if c.op == "reduce-scatter"]
    assert (attention.count, attention.exposed_s, mlp.exposed_s) == (23 * 16, 0, 0)
    (first,) = [c for c in phases["backward.embedding"].collectives if c.name == attention.name]
    assert first.count == 16 and first.time_s == attention.time_s
    from budget.schedule import _kernels

    (stage,) = derive(plan).stages
    (w,) = [
        sum(k.values())
        for p, k in zip(stage.phases, _kernels(plan, stage), strict=True)
        if p.name == "backward.embedding"
    ]
    room = w / (1 - plan.overlap.slowdown)
    assert first.exposed_s == pytest.approx(max(0.0, first.time_s - room), rel=1e-9)


def test_the_forward_window_leaves_out_the_loss_phases_backward_kernels(tmp_path):
    """The loss phase runs the output layer's forward and backward: only its forward
    kernels are part of the forward a parameter gather hides behind (the gathered
    parameters are all in use before the output layer's backward; an audit). Gemma 2 9B at
    sequence 1024 (plans/gemma2-9b.yaml, tp 4, pp 1, dp 16): the updated-parameter gather
    hides behind 41/42 of one micro-batch's forward kernels (each forward phase's kernels
    times its instances per micro-batch) less the loss phase's backward kernels, slowed
    beside it by the overlap slowdown s, so lasting 1 / (1 − s) as long.

    S, the bf16 parameters one tp rank holds (Gemma Team, arXiv 2408.00118, Table 1; h =
    3584): per layer the attention's Q, K, V and O, 3584 x (4096 + 2048 + 2048 + 4096) =
    3584 x 12288, and the GeGLU's gate, up and down, 3 x 3584 x 14336, sharded over tp 4
    with the tied 256,000 x 3584 embedding; replicated, 4 RMSNorms a layer (sandwich norms)
    and the final one, (42 x 4 + 1) x 3584 = 605,696 scales:
    (42 x (3584 x 12288 + 3 x 3584 x 14336) + 256000 x 3584) / 4 = 2,310,275,072;
    + 605,696 = 2,310,880,768 parameters, x 2 B = 4,621,761,536 B. The gather is NCCL's
    ring through the 16 dp ranks, 2 in each of 8 nodes: each rank sends 15/16 of S,
    4,332,901,440 B, half of it through its InfiniBand port (8 of the ring's 16 hops cross
    a node): 8 x 3 us + 7 x 14 us + 2,166,450,720 B / 47 GB/s = 46.217 ms."""
    from budget.flops import GRADIENT_PASSES as PASSES
    from tests.plan_files import ROOT, variant

    path = variant(
        tmp_path, "g.yaml", ("seq: 8192", "seq: 1024"), base=ROOT / "plans" / "gemma2-9b.yaml"
    )
    plan = load_plan(path)
    report = build_report(plan)
    (gather,) = [c for p in report.phases for c in p.collectives if c.name == "updated parameters"]
    sharded = (42 * (3584 * 12288 + 3 * 3584 * 14336) + 256000 * 3584) // 4
    assert sharded == 2_310_275_072
    params = sharded + (42 * 4 + 1) * 3584
    assert params == 2_310_880_768
    size = 2 * params
    assert size == 4_621_761_536 == gather.bytes
    assert size * 15 // 16 == 4_332_901_440
    assert gather.sent_bytes == 4_332_901_440
    assert gather.time_s * 1e3 == pytest.approx(46.217, abs=5e-4)
    assert gather.time_s == pytest.approx(122e-6 + 2_166_450_720 / 47e9, abs=1e-9)
    stage = derive(plan).stages[0]
    per_microbatch = plan.batch.global_batch // (plan.batch.micro * plan.parallel.dp)
    forward = loss_backward = 0.0
    for phase in stage.phases:
        if phase.name.startswith("forward.") or phase.name == "loss":
            kernels = _by_name(plan, phase)
            forward += sum(kernels.values()) * phase.count / per_microbatch
        if phase.name == "loss":
            # the output layer's gradients and the passes that follow them (main-grad
            # accumulation, FSDP's gradient passes)
            backward = [t for n, t in kernels.items() if n.endswith(" backward") or n in PASSES]
            loss_backward = sum(backward) * phase.count / per_microbatch
    assert loss_backward > 0.1 * forward  # worth leaving out: the rule is seen
    window = forward - loss_backward
    stretch = 1 / (1 - plan.overlap.slowdown)
    assert gather.exposed_s == pytest.approx(gather.time_s - 41 / 42 * window * stretch, abs=5e-6)


def test_the_first_stages_last_bucket_holds_its_embedding():
    """Without interleaving, the first stage's last gradient bucket is no smaller than its
    embedding: Megatron-LM fills buckets in reverse parameter order, the embedding's
    gradient comes last in the backward, and the next forward needs it first (an audit: the
    floor was one layer's share). Gemma 2 9B as shipped (tp 4, pp 1, dp 16, overlap on):
    the tied 256,000 x 3584 embedding over tp 4 is 229,376,000 of the rank's 2,310,880,768
    parameters (the test above), 9.93 %, where one layer of 42 is 2.38 %. The fp32
    gradients' reduce-scatter over the ring of 16 (2 ranks in each of 8 nodes): 8 x 3 us +
    7 x 14 us + (15/16 x 4 B x 2,310,880,768) / 2 / 47 GB/s = 92.311 ms, 9.273 ms of it
    exposed (the bucket's own 122 us and its share of the bytes' time: an audit, m148, found
    the share of the whole call's); the bf16 gather 46.217 ms, 4.697 ms exposed."""
    report = build_report(load_plan(ROOT / "plans" / "gemma2-9b.yaml"))
    moves = {c.name: c for p in report.phases for c in p.collectives}
    embedding, params = 256000 * 3584 // 4, 2_310_880_768
    assert embedding == 229_376_000
    share = embedding / params
    assert share == pytest.approx(0.09926, abs=5e-6) and share > 1 / 42
    grads, gather = moves["gradients"], moves["updated parameters"]
    assert grads.bytes == 4 * params
    assert grads.time_s == pytest.approx(122e-6 + 15 * 4 * params // 16 // 2 / 47e9, rel=1e-9)
    assert grads.time_s * 1e3 == pytest.approx(92.311, abs=5e-4)
    for move, ms in ((grads, 9.273), (gather, 4.697)):
        latency = move.latency_term_s
        assert latency == pytest.approx(122e-6, rel=1e-12)
        assert move.exposed_s == pytest.approx(latency + share * (move.time_s - latency), rel=1e-12)
        assert move.exposed_s * 1e3 == pytest.approx(ms, abs=5e-4)


_TRAINING_RUNS = [run for run in RUNS if plan_of(run).mode == "train"]
_TRAINING_PLANS = [p for p in PLANS if load_plan(p).mode == "train"]


@pytest.mark.parametrize(
    "plan",
    [*(load_plan(p) for p in _TRAINING_PLANS), *(plan_of(r) for r in _TRAINING_RUNS)],
    ids=[*(p.stem for p in _TRAINING_PLANS), *(plan_file_name(r) for r in _TRAINING_RUNS)],
)
def test_the_phase_rows_add_up_to_at_least_the_step(plan) -> None:
    """Each phase row is the stage where the phase takes longest, so the rows' compute and
    exposed time add up to at least the step's (which takes the pacing stage's micro-batch
    phases and the slowest stage's reduction and optimizer). Rows chosen by bytes sent had
    Nemotron-4 340B's gradient reduction and optimizer from stage 7 (19.9 ms exposed each)
    where the step waits for stage 0's (31.7 and 37.4 ms): the rows summed to 114 ms of
    exposed time against the step's 130 (review)."""
    report = build_report(plan)
    for column, figure in (("compute_s", "compute_s"), ("exposed_s", "exposed_comm_s")):
        rows = sum(getattr(p, column) for p in report.phases)
        assert rows >= report.step[figure] * (1 - 1e-12), column


@pytest.mark.parametrize(
    ("p", "v", "m"), [(2, 1, 2), (4, 1, 8), (8, 1, 3), (3, 1, 1), (8, 2, 16), (4, 3, 8)]
)
def test_the_replay_of_alike_stages_is_the_closed_form(p, v, m) -> None:
    """Stages and chunks alike (forward 1, backward 2 a chunk, so t = 3v a stage): Megatron's
    order takes m·t + (p − 1)·t/v, Narayanan et al.'s closed form."""
    t = 3.0 * v
    replay = pipeline_replay([[1.0] * v] * p, [[2.0] * v] * p, m)
    assert replay == pytest.approx(m * t + (p - 1) * t / v, rel=1e-12)


def _replay_by_events(forward, backward, m, delays=None, late=False):
    """Megatron-LM's order replayed the plain way (the engine's first replay, kept as an
    oracle): each stage's ops listed in turn (warm-up forwards, one forward and one backward,
    the remaining backwards), run round-robin as soon as what each waits for has ended, and
    for another stage's op, its send has arrived (`delays`: stage s's forward send at s,
    its backward send at p + s). `late`: the interleaved schedule's batched calls without
    overlapped sends (apex's ``_forward_backward_pipelining_with_interleaving``): past its
    warm-up a stage runs a forward, a backward, then one call that sends both outputs and
    waits for the next forward's input and the next backward's gradient, so a forward's
    output reaches its receiver when the backward after it ends, and the forward waits for
    that backward's gradient too."""
    p, v = len(forward), len(forward[0])
    delays = [0.0] * (2 * p) if delays is None else list(delays)
    total = m * v
    late = late and v > 1

    def chunk_mb(k, back):
        c = (k // p) % v
        return (v - 1 - c if back else c), (k // (p * v)) * p + k % p

    orders, warms = [], []
    for s in range(p):
        warm = min(p - s - 1 if v == 1 else (p - s - 1) * 2 + (v - 1) * p, total)
        ops = [(False, *chunk_mb(k, False)) for k in range(warm)]
        for k in range(total - warm):
            ops += [(False, *chunk_mb(warm + k, False)), (True, *chunk_mb(k, True))]
        ops += [(True, *chunk_mb(k, True)) for k in range(total - warm, total)]
        orders.append(ops)
        warms.append(warm)

    def needed(back, s, c, mb):
        if not back:
            return (False, s - 1, c, mb) if s else (False, p - 1, c - 1, mb) if c else None
        if s == p - 1 and c == v - 1:
            return (False, s, c, mb)
        return (True, s + 1, c, mb) if s < p - 1 else (True, 0, c + 1, mb)

    ends, arrived, free, at = {}, {}, [0.0] * p, [0] * p  # arrived: when its output leaves
    while any(at[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while at[s] < len(orders[s]):
                back, c, mb = orders[s][at[s]]
                steady = late and not back and at[s] >= warms[s]  # a backward follows it
                first = needed(back, s, c, mb)
                needs = [] if first is None else [first]
                if steady:  # the call before it waits for the next backward's gradient too
                    after, chunk, batch = orders[s][at[s] + 1]
                    gradient = needed(after, s, chunk, batch)
                    if gradient is not None and gradient[1] != s:
                        needs.append(gradient)
                seen = [ends if n[1] == s else arrived for n in needs]
                if any(n not in table for n, table in zip(needs, seen, strict=True)):
                    break
                start = free[s]
                for n, table in zip(needs, seen, strict=True):
                    sent = delays[n[1] + (p if n[0] else 0)] if n[1] != s else 0.0
                    start = max(start, table[n] + sent)
                free[s] = start + (backward if back else forward)[s][c]
                ends[(back, s, c, mb)] = free[s]
                if not steady:
                    arrived[(back, s, c, mb)] = free[s]
                if late and back and at[s] - 1 >= warms[s] and not orders[s][at[s] - 1][0]:
                    # the steady forward before it leaves with it
                    arrived[(False, s, *orders[s][at[s] - 1][1:])] = free[s]
                at[s] += 1
    return max(free)


# pipelines of 1 to 8 stages, of 1 to 4 chunks, and m: a multiple of p when interleaved
PIPELINES = {
    "p": st.integers(1, 8),
    "v": st.sampled_from([1, 1, 2, 3, 4]),
    "rounds": st.integers(1, 4),
    "extra": st.integers(0, 7),
    "seed": st.integers(0, 2**32 - 1),
}


@settings(max_examples=150, deadline=None)
@given(**PIPELINES)
def test_the_replay_runs_megatrons_order_op_by_op(p, v, rounds, extra, seed) -> None:
    """`pipeline_replay` runs a precomputed order (`replay_order`: ops sorted by place on
    their stage) in one pass; it ends every op exactly when the round-robin replay of the
    same order does, for any stage and chunk times (interleaving with m a multiple of p,
    as Megatron-LM requires; 1F1B with any m)."""
    rng = random.Random(seed)
    m = rounds * p if v > 1 else rounds + extra
    forward = [[rng.uniform(0.1, 3.0) for _ in range(v)] for _ in range(p)]
    backward = [[rng.uniform(0.1, 6.0) for _ in range(v)] for _ in range(p)]
    assert pipeline_replay(forward, backward, m) == _replay_by_events(forward, backward, m)


@settings(max_examples=150, deadline=None)
@given(**PIPELINES, spread=st.sampled_from([1.0, 1.2, 3.0, 20.0]))
def test_the_replay_bounds_hold_the_replay_between_them(p, v, rounds, extra, seed, spread) -> None:
    """`Replay.bound`, which a sweep ranks an unreplayed uneven layout by, is at most the
    replay, and `Replay.ceiling`, which settles the limits a layout is far from, at least,
    for any stage and chunk times (chunks from alike to 20 times apart); both are the
    replay's own figure where every chunk is alike. A search that ranked and pruned by a
    bound above the replay could drop a layout that belongs in its ranking; a ceiling
    below it could reject one within a limit."""
    rng = random.Random(seed)
    m = rounds * p if v > 1 else rounds + extra
    chunks = np.array(
        [
            [[rng.uniform(1.0, spread) * scale for _ in range(v)] for _ in range(p)]
            for scale in (1, 2)
        ]
    )
    replay = Replay(chunks, m, rest=0.5, after=0.75, floor=0.0)
    step = replay.pipeline() + replay.after
    assert replay.bound() <= step * (1 + 1e-12) and replay.ceiling() >= step * (1 - 1e-12)
    alike = Replay(np.ones_like(chunks) * chunks[:, :1, :1], m, rest=0.5, after=0.75, floor=0.0)
    step = alike.pipeline() + alike.after
    assert alike.bound() == pytest.approx(step, rel=1e-12)
    assert alike.ceiling() == pytest.approx(step, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(**PIPELINES, layouts=st.sampled_from([1, 3, 40]))
def test_layouts_replayed_together_end_as_each_alone(p, v, rounds, extra, seed, layouts) -> None:
    """`pipeline_replays` runs a level of the order at a time for many layouts; each ends
    bit for bit where `pipeline_replay` ends it alone (at p · n ≥ 32 the levels run, below
    it the layouts run one by one). `Replay.steps` gives each layout's `pipeline` + `after`,
    layouts of different micro-batch counts grouped apart."""
    rng = np.random.default_rng(seed)
    m = rounds * p if v > 1 else rounds + extra
    chunks = rng.uniform(0.1, 6.0, size=(2, p, v, layouts))
    together = pipeline_replays(chunks, m)
    alone = [pipeline_replay(chunks[0, ..., i], chunks[1, ..., i], m) for i in range(layouts)]
    assert together.tolist() == alone
    counts = np.array([m + (p if v > 1 else 1) * (i % 2) for i in range(layouts)])
    rest, after = rng.uniform(0, 1, layouts), rng.uniform(0, 1, layouts)
    replay = Replay(chunks, counts, rest, after, np.zeros(layouts))
    each = [replay.take(i).pipeline() + replay.take(i).after for i in range(layouts)]
    assert replay.steps().tolist() == each


def test_a_receiver_waits_for_the_send_of_what_it_waits_for() -> None:
    """An op waiting for another stage's op starts once that op has ended and its send has
    arrived (`schedule._send_wait`): two stages, one chunk, one micro-batch, forwards of 1 s,
    backwards of 2 s and sends of d: stage 0's forward ends at 1, stage 1's runs from 1 + d
    to 2 + d, its backward (its own forward's, no send) to 4 + d, stage 0's from 4 + 2d to
    6 + 2d. A send the sender waits for (exposed) is in its op's time and delays nothing."""
    d = 0.25
    forward, backward = [[1.0], [1.0]], [[2.0], [2.0]]
    assert pipeline_replay(forward, backward, 1) == 6.0
    assert pipeline_replay(forward, backward, 1, [d, d, d, d]) == 6.0 + 2 * d
    assert _replay_by_events(forward, backward, 1, [d, d, d, d]) == 6.0 + 2 * d


@settings(max_examples=100, deadline=None)
@given(**PIPELINES, layouts=st.sampled_from([1, 40]))
def test_sends_delay_a_replay_as_the_plain_one_delays_it(p, v, rounds, extra, seed, layouts):
    """With each stage's sends keeping their receivers waiting (`Replay.delays`), the
    replay ends where the round-robin oracle does (to rounding), alone and in a batch of
    layouts (bit for bit with each alone), and the bound without replaying stays above it."""
    rng = np.random.default_rng(seed)
    m = rounds * p if v > 1 else rounds + extra
    chunks = rng.uniform(0.1, 6.0, size=(2, p, v, layouts))
    delays = rng.uniform(0.0, 2.0, size=(2 * p, layouts))
    alone = [
        pipeline_replay(chunks[0, ..., i], chunks[1, ..., i], m, delays[:, i])
        for i in range(layouts)
    ]
    assert pipeline_replays(chunks, m, delays).tolist() == alone
    oracle = _replay_by_events(
        chunks[0, ..., 0].tolist(), chunks[1, ..., 0].tolist(), m, delays[:, 0]
    )
    assert alone[0] == pytest.approx(oracle, rel=1e-12)
    replay = Replay(chunks, m, 0.0, 0.0, np.zeros(layouts), delays=delays)
    assert replay.steps().tolist() == alone
    assert (replay.ceiling() >= np.array(alone) * (1 - 1e-12)).all()
    assert replay.take(0).pipeline() == alone[0]


def test_the_interleaved_sends_pace_nemotron_4_340b() -> None:
    """Nemotron-4 340B on 2,048 H100s (NeMo, `budget.accuracy`): p 8, v 12, m 16, each
    stage send 18 MiB over InfiniBand, 0.416 ms, hidden from its sender by overlap.pp. A
    round of p micro-batches leaves no slack on the edges from the last stage back to the
    first, so the receivers' waits add up: a review (m354), replaying the engine's own order
    and chunk times with each cross-stage wait delayed by that send rounded to 0.416 ms, read
    the pipeline at 4,160.17 ms where the engine had 4,087.91; at the send's 0.41558 ms the
    same replay ends 0.07 ms sooner. The embedding's own kernels after its lookup, priced
    since (audits m358 and m360, `flops.embedding_output`), lengthen stage 0's first chunk:
    4,163.62 ms. The recipe defers the output layer's weight-gradient GEMMs to the drain
    (``defer_embedding_wgrad_compute``, limit 22 of its 16 micro-batches; `step._drain`),
    which takes one such GEMM off each of the last stage's last chunk's 16 backwards, and
    that chunk paces the stages behind it: 4,048.60 ms, 115.02 ms sooner."""
    from budget.accuracy import RUNS, plan_of

    (run,) = [r for r in RUNS if r.name == "Nemotron-4 340B, 2,048 GPUs"]
    plan = plan_of(run)
    timed = step_time(plan, derive(plan))
    sends = [
        t
        for s in timed.stages
        for ph in s.phases
        if ph.name.startswith("pipeline.")
        for t in ph.moves
    ]
    assert {round(t.time_s * 1e3, 3) for t in sends} == {0.416} and not any(
        t.exposed_s for t in sends
    )
    assert timed.pipeline_s == pytest.approx(4.04860, abs=1e-5)
    # the deferral's whole effect on the pipeline: m times what it takes off the last stage's
    # loss phase, the last chunk's forward (the GEMM and its accumulation), which paces the
    # stages behind it every round (review m371: the figure above alone is the engine's)
    inline = replace(plan, overlap=replace(plan.overlap, defer_embedding_wgrad=False))
    before = step_time(inline, derive(inline))

    def loss(t) -> float:  # type: ignore[no-untyped-def]
        (phase,) = [p for p in t.stages[-1].phases if p.name == "loss"]
        return float(phase.compute_s + phase.exposed_s)

    taken = 16 * (loss(before) - loss(timed))
    assert before.pipeline_s - timed.pipeline_s == pytest.approx(taken, rel=1e-9)
    assert taken == pytest.approx(0.11502, abs=1e-5)


@settings(max_examples=80, deadline=None)
@given(
    p=st.integers(4, 8),
    v=st.sampled_from([1, 1, 2, 3, 4]),
    rounds=st.integers(24, 60),
    seed=st.integers(0, 2**32 - 1),
    spread=st.sampled_from([1.0, 1.05, 3.0, 20.0]),
    layouts=st.sampled_from([1, 40]),
)
def test_a_long_replay_extends_a_shorter_steady_one(p, v, rounds, seed, spread, layouts) -> None:
    """Past a few rounds `pipeline_replay` replays fewer micro-batches (`shortened_count`)
    and adds a steady round's shift for each one left out (`_extrapolated`), or replays
    them all where its ops do not yet shift alike. Either way it ends where the round-robin
    replay of all m ends (to rounding: 1e-12 of the step), alone and in a batch of layouts
    (`pipeline_replays`, bit for bit with each alone)."""
    rng = np.random.default_rng(seed)
    m = rounds * p
    chunks = (
        rng.uniform(1.0, spread, size=(2, p, v, layouts))
        * np.array([1.0, 2.0])[:, None, None, None]
    )
    alone = [pipeline_replay(chunks[0, ..., i], chunks[1, ..., i], m) for i in range(layouts)]
    assert pipeline_replays(chunks, m).tolist() == alone
    for i in (0, layouts - 1):
        oracle = _replay_by_events(chunks[0, ..., i].tolist(), chunks[1, ..., i].tolist(), m)
        assert alone[i] == pytest.approx(oracle, rel=1e-12)


def test_a_long_replay_by_hand_and_one_not_yet_steady() -> None:
    """Alike chunks (forward 1, backward 2) at p 8, v 4 and m 800: the closed form
    m·t + (p − 1)·t/v with t = v·(f + b) = 12 a micro-batch, 9,600 + 21 = 9,621, from a
    replay of 64 micro-batches (`shortened_count`: past the first stage's 38 warm-up
    forwards twice and five rounds of 32, 59 at least, 800 less a multiple of 8) and 92
    steady rounds of 8 micro-batches. And two stages of two
    chunks that at 14 micro-batches still drift apart (one stage's ops shift by more than
    the other's each round): `_extrapolated` leaves m = 400 to a whole replay, which the
    oracle's 2,601.8 confirms. A small replay is run whole (`SHORTEN`)."""
    assert shortened_count(8, 4, 800) == 64 and shortened_count(8, 4, 64) is None
    assert pipeline_replay([[1.0] * 4] * 8, [[2.0] * 4] * 8, 800) == pytest.approx(
        9621.0, rel=1e-12
    )
    forward, backward = [[1.0, 1.0], [1.1, 1.25]], [[2.5, 2.0], [2.0, 2.0]]
    short = shortened_count(2, 2, 400)
    times = np.concatenate([np.ravel(forward), np.ravel(backward)]).tolist()
    ends = np.array(_replay_ends(times, 2, 2, short))[:, None]
    assert short == 14 and np.isnan(_extrapolated(ends, 2, 2, short, 400)).all()
    assert pipeline_replay(forward, backward, 400) == pytest.approx(2601.8, rel=1e-12)
    assert _replay_by_events(forward, backward, 400) == pytest.approx(2601.8, rel=1e-12)
    assert shortened_count(2, 2, 40) is None  # 2·2·40 = 160 chunk forwards: whole


def test_the_replay_bound_by_hand() -> None:
    """The slow first stage of `test_the_replay_of_a_slow_first_stage_by_hand` (forward 2
    and backward 4 on stage 0, 1 and 2 on stage 1, m = 2): stage 0 works 2·6 = 12 with
    nothing before it; stage 1 waits 2 for the first forward and is waited on 4 by the last
    backward, 2 + 2·3 + 4 = 12. The bound is 12 against the replay's 13 (and the closed
    form's 15); arrays over two layouts give each its own."""
    one = Replay(np.array([[[2.0], [1.0]], [[4.0], [2.0]]]), 2, 0.0, 0.0, 0.0)
    assert one.bound() == 12.0 and one.pipeline() == 13.0
    two = Replay(np.stack([one.chunks, one.chunks * 3], axis=-1), np.array([2, 2]), 0.0, 0.0, 0.0)
    assert two.bound().tolist() == [12.0, 36.0]


def test_the_replay_of_a_slow_first_stage_by_hand() -> None:
    """Two stages, two micro-batches, stage 0 twice as slow (forward 2, backward 4) as
    stage 1 (1, 2). By hand: stage 0 runs F0 [0, 2] and F1 [2, 4]; stage 1 F0 [2, 3], B0
    [3, 5], F1 [5, 6], B1 [6, 8]; stage 0's B0 waits for 5 and runs [5, 9], B1 [9, 13]. The
    closed form m·max(t) + Σt − max(t) = 2·6 + 3 = 15 overcounts by 2."""
    assert pipeline_replay([[2.0], [1.0]], [[4.0], [2.0]], 2) == 13.0


def test_a_split_of_unlike_chunks_runs_at_megatrons_order(tmp_path) -> None:
    """GPT-3 at p 8, v 2 (the shipped plan interleaved): stage 0 in chunks of 10 and 2
    layers, every other chunk 6 (12 layers a stage everywhere). Every stage holds the same
    work, so the closed form over stage totals gave the even split's time to the digit;
    replayed, the 10-layer chunk paces every stage that waits on it (an audit's replay of
    the same order with per-layer times put the pipeline 22 % longer). The chunk times add
    up to each stage's micro-batch time, and an even split keeps the closed form."""
    interleaved = "pipeline: {schedule: interleaved, virtual_stages: 2"
    even_path = variant(tmp_path, "even", ("pipeline: {schedule: 1f1b", interleaved))
    even = build_report(load_plan(even_path))
    split = "[10, 6, 6, 6, 6, 6, 6, 6, 2, 6, 6, 6, 6, 6, 6, 6]"
    unlike_split = f"{interleaved}, layers_per_stage: {split}"
    path = variant(tmp_path, "unlike", ("pipeline: {schedule: 1f1b", unlike_split))
    plan = load_plan(path)
    assert chunks_differ(plan) and not chunks_differ(load_plan(even_path))
    unlike = build_report(plan)
    assert unlike.step["time_s"] > 1.15 * even.step["time_s"]
    times = step_time(plan, derive(plan))
    forward, backward = _chunk_times(plan, list(times.stages), derive(plan).microbatches)
    for stage, f, b in zip(times.stages, forward, backward, strict=True):
        assert sum(f) + sum(b) == pytest.approx(stage.microbatch_s, rel=1e-12)
    assert forward[0][0] > forward[1][0] > forward[0][1]


def test_without_overlapped_sends_an_interleaved_step_runs_megatrons_batched_calls(
    tmp_path: Path,
) -> None:
    """The same GPT-3 split without overlap.pp: Megatron-LM's interleaved schedule then
    sends a steady forward's output only with the backward after it, in one batched call
    that also waits for the next backward's gradient (`schedule.late_waits`; a review found
    the replay 2.5 % short of that order on an uneven Llama 3 70B). The report's step is
    that replay's, longer than the order that sends each output as its op ends; with
    overlap.pp the sends are posted as their ops end, and the plain order (with each send's
    wait) holds."""
    interleaved = "pipeline: {schedule: interleaved, virtual_stages: 2"
    split = "[10, 6, 6, 6, 6, 6, 6, 6, 2, 6, 6, 6, 6, 6, 6, 6]"
    edit = ("pipeline: {schedule: 1f1b", f"{interleaved}, layers_per_stage: {split}")
    plan = load_plan(variant(tmp_path, "unlike", edit))
    assert not plan.overlap.pp
    times = step_time(plan, derive(plan))
    m = derive(plan).microbatches
    replay = replay_of(plan, list(times.stages), m)
    assert replay.late and replay.delays is None
    early = replace(replay, late=False)
    assert replay.pipeline() > early.pipeline() * 1.001
    step = build_report(plan).step["time_s"]
    assert step == pytest.approx(replay.pipeline() + replay.after, rel=1e-12)
    overlapped = replace(plan, overlap=replace(plan.overlap, pp=True))
    stages = list(step_time(overlapped, derive(overlapped)).stages)
    assert not replay_of(overlapped, stages, m).late


@settings(max_examples=150, deadline=None)
@given(**PIPELINES, layouts=st.sampled_from([1, 40]))
def test_the_batched_calls_replay_ends_where_their_oracle_does(p, v, rounds, extra, seed, layouts):
    """The interleaved order without overlapped sends (`late_waits`) ends where the
    round-robin oracle running Megatron-LM's batched calls does (to rounding), alone and in
    a batch of layouts (bit for bit with each alone); its bounds hold it between them; one
    chunk sends as its ops end, the plain order; and alike chunks keep the closed form."""
    rng = np.random.default_rng(seed)
    m = rounds * p if v > 1 else rounds + extra
    chunks = rng.uniform(0.1, 6.0, size=(2, p, v, layouts))
    alone = [
        pipeline_replay(chunks[0, ..., i], chunks[1, ..., i], m, late=True) for i in range(layouts)
    ]
    assert pipeline_replays(chunks, m, late=True).tolist() == alone
    first = (chunks[0, ..., 0].tolist(), chunks[1, ..., 0].tolist())
    assert alone[0] == pytest.approx(_replay_by_events(*first, m, late=True), rel=1e-12)
    plain = pipeline_replay(*first, m)
    assert alone[0] >= plain * (1 - 1e-12) and (v > 1 or alone[0] == plain)
    replay = Replay(chunks, m, 0.0, 0.0, np.zeros(layouts), late=True)
    assert replay.steps().tolist() == alone and replay.take(0).pipeline() == alone[0]
    assert (replay.bound() <= np.array(alone) * (1 + 1e-12)).all()
    assert (replay.ceiling() >= np.array(alone) * (1 - 1e-12)).all()
    t = 3.0 * v
    closed = m * t + (p - 1) * t / v
    alike = pipeline_replay([[1.0] * v] * p, [[2.0] * v] * p, m, late=True)
    assert alike == pytest.approx(closed, rel=1e-12)


def test_a_forward_sent_with_the_backward_after_it_paces_the_next_stage() -> None:
    """p 4, v 2, m 8, forwards of 1 but stage 1's first chunk 2, backwards twice the
    forwards (a review's case): sending each output as its op ends, 76; Megatron-LM's
    batched calls without overlapped sends, 81, by its oracle too."""
    forward = [[1.0, 1.0], [2.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    backward = [[2 * t for t in row] for row in forward]
    assert pipeline_replay(forward, backward, 8) == 76.0
    assert pipeline_replay(forward, backward, 8, late=True) == 81.0
    assert _replay_by_events(forward, backward, 8, late=True) == 81.0


EXPOSED_128K = ("overlap: {dp_grads: true,", "overlap: {dp_grads: false,")


def test_a_reduction_after_every_backward_waits_in_the_pipelines_fill_and_drain(
    tmp_path: Path,
) -> None:
    """ZeRO-2 reduce-scatters after every micro-batch's backward (`step._reduce`); exposed,
    it lengthens each micro-batch on its stage, so the fill and drain of the pipeline wait
    for it on each stage they cross, not only once a micro-batch at the end (review: the
    shipped 128K plan with its reductions exposed, p 16 and 16 micro-batches, was 4 s
    short). Its stages expose one reduce-scatter a micro-batch each, so the bubble grows by
    (p − 1) of them, give or take their differences between stages."""
    base = ROOT / "plans" / "llama3-405b-128k.yaml"
    plan = load_plan(variant(tmp_path, "exposed", EXPOSED_128K, base=base))
    assert plan.parallel.zero == 2 and not plan.overlap.dp_grads
    times = step_time(plan, derive(plan))
    report = build_report(plan)
    (dp,) = [p for p in report.phases if p.name == "dp.grads"]
    (rs,) = [c for c in dp.collectives if c.count == derive(plan).microbatches]
    waits = [s.each_microbatch_s for s in times.stages]
    assert max(waits) == pytest.approx(rs.exposed_s, rel=1e-12)  # the row is the costliest
    p, totals = plan.parallel.pp, [s.microbatch_s for s in times.stages]
    closed = sum(totals) - max(totals)  # the bubble without the waits (v = 1)
    grown = times.bubble_s - closed
    assert (p - 1) * min(waits) <= grown <= (p - 1) * max(waits)
    assert grown > 3.5  # 15 waits of about 0.27 s


def test_a_hidden_reduction_after_every_backward_slows_the_micro_batches_it_hides_behind():
    """The 128K plan as shipped overlaps its ZeRO-2 reduce-scatter with the backward of the
    micro-batch it follows: a share of it is exposed, and the backward beside the rest runs
    `overlap.slowdown` slower (`time_phase`), on every stage. Both lengthen each micro-batch
    that the pipeline's fill and drain cross (audit m401: the slowdown was left past the
    pipeline, counted m times for one stage only, and the step was 0.66 s short, 18.71 s
    against 19.37 s). By hand, stage k waits E + s·(T − E) a micro-batch, E and T its
    reduce-scatter's exposed and total time, s the slowdown."""
    plan = load_plan(ROOT / "plans" / "llama3-405b-128k.yaml")
    assert plan.parallel.zero == 2 and plan.overlap.dp_grads
    times = step_time(plan, derive(plan))
    m, s = derive(plan).microbatches, plan.overlap.slowdown
    for stage in times.stages:
        (dp,) = [p for p in stage.phases if p.name == "dp.grads"]
        (rs,) = [t for t in dp.moves if t.move.each_microbatch]
        assert rs.move.count * dp.count == m
        assert 0 < rs.exposed_s < rs.time_s  # partly hidden: a slowdown to count
        hand = rs.exposed_s + s * (rs.time_s - rs.exposed_s)
        assert stage.each_microbatch_s == pytest.approx(hand, rel=1e-12)
    # the replay's backwards hold it, and the tail no longer counts it m times for one stage
    assert times.time_s == pytest.approx(19.3695, rel=1e-4)


def test_the_closed_forms_fill_and_drain_wait_for_a_hidden_reductions_slowdown(tmp_path):
    """Llama 3 70B as shipped (tp 8, pp 4 under 1F1B, equal stages: the closed form) at
    ZeRO 2 with its reductions overlapped: each stage's micro-batch ends its backward with a
    reduce-scatter, E of it exposed and the backward beside the rest slowed by s·(T − E).
    By hand, the bubble is Σ_k w_k − max_k w_k with w_k = t_k + E_k + s·(T_k − E_k), t_k the
    stage's micro-batch (audit m401: 0.798 s, without the slowdowns, against 0.883 s)."""
    path = variant(
        tmp_path,
        "z2.yaml",
        ("zero: 1", "zero: 2"),
        ("recompute: selective", "recompute: selective\noverlap: {dp_grads: true}"),
        base=ROOT / "plans" / "llama3-70b.yaml",
    )
    plan = load_plan(path)
    assert not chunk_times_differ(plan) and plan.parallel.pipeline.virtual_stages == 1
    times = step_time(plan, derive(plan))
    s, waits, slowed = plan.overlap.slowdown, [], 0.0
    for stage in times.stages:
        (dp,) = [p for p in stage.phases if p.name == "dp.grads"]
        (rs,) = [t for t in dp.moves if t.move.each_microbatch]
        slowed += s * (rs.time_s - rs.exposed_s)
        waits.append(stage.microbatch_s + rs.exposed_s + s * (rs.time_s - rs.exposed_s))
    assert slowed > 0.05  # the slowdowns the old bubble left out
    assert times.bubble_s == pytest.approx(sum(waits) - max(waits), rel=1e-12)


def test_a_replayed_split_keeps_the_zero2_wait_and_gpipe_keeps_the_closed_form(tmp_path):
    """The 128K plan (ZeRO-2, p 16, its reductions exposed) with one layer moved from its
    first stage to its last ([6, 8 × 15]) is replayed; its reduce-scatter after every
    backward still waits in the fill and drain (without it the step fell from 27.7 to 24.3 s;
    review), so moving a layer keeps the step within a few percent. A GPipe split keeps the
    closed form (the replay is of 1F1B's order): m·max(t) + Σt − max(t) from its own stage times."""
    base = variant(tmp_path, "exposed", EXPOSED_128K, base=ROOT / "plans" / "llama3-405b-128k.yaml")
    shipped = budget_plan(base).step
    moved_split = "[6, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]"
    path = variant(
        tmp_path,
        "moved",
        ("[7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]", moved_split),
        base=base,
    )
    assert chunks_differ(load_plan(path))
    moved = budget_plan(path).step
    assert abs(moved["time_s"] / shipped["time_s"] - 1) < 0.05
    assert moved["bubble_s"] > 0.9 * shipped["bubble_s"]
    gpipe = variant(
        tmp_path,
        "gpipe",
        (
            "pipeline: {schedule: 1f1b",
            "pipeline: {schedule: gpipe, layers_per_stage: [14, 12, 12, 12, 12, 12, 12, 10]",
        ),
    )
    plan = load_plan(gpipe)
    times = step_time(plan, derive(plan))
    t = [s.microbatch_s for s in times.stages]
    m = derive(plan).microbatches
    assert times.pipeline_s == pytest.approx(m * max(t) + sum(t) - max(t), rel=1e-12)


def _interleaved_70b(tmp_path: Path, virtual: int, overlap: str, *edits: tuple[str, str]) -> Path:
    """plans/llama3-70b.yaml under the interleaved schedule of `virtual` model chunks a
    stage, with `overlap` (the overlap mapping's keys) and any further `edits`."""
    return variant(
        tmp_path,
        f"il{virtual}.yaml",
        (
            "pipeline: {schedule: 1f1b}",
            f"pipeline: {{schedule: interleaved, virtual_stages: {virtual}}}",
        ),
        ("recompute: selective", f"recompute: selective\noverlap: {{{overlap}}}"),
        *edits,
        base=ROOT / "plans" / "llama3-70b.yaml",
    )


def test_an_interleaved_zero2_reduction_is_each_chunks_share(tmp_path):
    """Under interleaving a ZeRO-2 reduction after every backward is each model chunk's
    (Megatron-Core gives each chunk its own DDP buffers), its share by layers after that
    chunk's backward. Lumped on chunk 0, Llama 3 70B at pp 4 over 5 virtual stages (equal
    chunks of 4 layers) replayed 11.52 s against the closed form's 11.10 s, 3.7 % apart (an
    audit); the replay of alike chunks is the closed form, but for the loss in the last
    chunk and the embedding in the first, which the closed form spreads over the stage
    (0.2 % here), and which the replay, as `budget PLAN` now prices every interleaved
    pipeline (`layers.chunk_times_differ`), keeps."""
    path = _interleaved_70b(
        tmp_path, 5, "dp_grads: true, param_gather: true", ("zero: 1", "zero: 2")
    )
    plan = load_plan(path)
    assert not chunks_differ(plan)  # alike chunks: the closed form is exact but for the loss
    times = step_time(plan, derive(plan))
    assert min(s.each_microbatch_s for s in times.stages) > 0.01  # a reduction to wait for
    m, v = derive(plan).microbatches, 5
    waits = [s.microbatch_s + s.each_microbatch_s for s in times.stages]
    closed = m * max(s.microbatch_s for s in times.stages) + (sum(waits) - max(waits)) / v
    assert closed < times.pipeline_s < (1 + 2e-3) * closed


@pytest.mark.parametrize(
    ("edits", "idle"),
    [
        ((), None),  # 96 micro-batches through 8 stages: a 6 % bubble, nothing said
        ((("global: 1536", "global: 128"),), "(p − 1)/m = 7/8"),
        (
            (
                ("global: 1536", "global: 128"),
                ("{schedule: 1f1b}", "{schedule: interleaved, virtual_stages: 2}"),
            ),
            "(p − 1)/(v·m) = 7/16",
        ),
    ],
)
def test_a_large_bubble_is_explained_with_what_shrinks_it(tmp_path, edits, idle):
    """A bubble of a fifth of the step or more says why, by Narayanan et al.'s (p − 1)/m or
    (p − 1)/(v·m), and what shrinks it (a user audit: 2 micro-batches through 4 stages left
    a 1.01 s bubble in a 1.78 s step, unsaid); at micro 1, not a smaller micro-batch."""
    from budget.render.table import BUBBLE_NOTE, summary

    report = budget_plan(variant(tmp_path, "bubble.yaml", *edits))
    share = report.step["bubble_s"] / report.step["time_s"]
    said = [line for line in summary(report) if line.startswith("The bubble is")]
    if idle is None:
        assert share < BUBBLE_NOTE and not said
        return
    (line,) = said
    assert share >= BUBBLE_NOTE and f"The bubble is {share:.0%} of the step" in line
    assert "8 micro-batches a step through 8 stages" in line and idle in line
    assert "smaller batch.micro" not in line and "a larger batch.global" in line


def test_the_bubble_note_says_what_interleaving_needs_where_the_plan_lacks_it(tmp_path):
    """An audit: 1 micro-batch through 4 stages was told to use virtual stages, which
    `validate` then refuses (the interleaved schedule needs the micro-batches a step to be
    a multiple of pp). GPT-3's plan at global 96 runs 96 / 16 = 6 micro-batches through 8
    stages: the note says the multiple; at 8 micro-batches it need not."""
    from budget.render.table import summary

    def said(global_batch: int) -> str:
        plan = variant(
            tmp_path, f"g{global_batch}.yaml", ("global: 1536", f"global: {global_batch}")
        )
        (line,) = [x for x in summary(budget_plan(plan)) if x.startswith("The bubble is")]
        return line

    assert "6 micro-batches a step" in said(96)
    assert "needs the micro-batches a step to be a multiple of pp = 8" in said(96)
    assert "multiple of pp" not in said(128)


UNEVEN_LATE = """\
name: heavier-later-stages
mode: train
model: {layers: 32, hidden: 4096, heads: 32, vocab: 51200, mlp: gelu, norm: layernorm,
        tied_embeddings: false, position: rope, attention: flash}
batch: {seq: 2048, micro: 1, global: 16}
precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, activations: bf16}
parallel:
  tp: 2
  pp: 4
  dp: 2
  sequence_parallel: true
  zero: 1
  pipeline: {schedule: 1f1b, layers_per_stage: [6, 8, 8, 10]}
  order: [tp, cp, ep, pp, dp]
recompute: selective
device: {preset: a100-80gb, reserved: 3 GiB}
topology: {preset: dgx-a100, nodes: 2}
"""


@pytest.mark.parametrize(("split", "reducing"), [("6, 8, 8, 10", 0), ("2, 6, 8, 16", 3)])
def test_each_stage_reduces_its_gradients_from_its_own_last_backward(tmp_path, split, reducing):
    """An audit: every stage's gradient reduction started at the pipeline's end, where
    Megatron-LM's finalize_model_grads runs on each rank once its own schedule returns, and
    a later stage's last backward ends before those of the stages ahead of it. 32 layers
    over 4 stages, 8 micro-batches: each stage's end read off the replay itself (its last
    op's end, by `replay_order`), each reduction from there, then the optimizer once every
    stage has reduced (the gradient norm's all-reduce over the model-parallel group), each
    stage's before its first forward of the next step, which the replay starts as late as
    the fill puts it (`StageTime.fill_s`):
    max_s(end_s + reduce_s) + max_s(optimizer_s - start_s), shorter than the pipeline's end plus the
    longest reduction and optimizer (as 6, 8, 8, 10: 0.8634 s against 0.8970 s when the
    audit was mended); each stage's lead is how much earlier than stage 0's its replay ends,
    the backwards of one micro-batch on the stages ahead, so it grows down the pipeline. As
    2, 6, 8, 16 the last stage's reduction ends latest, though it starts a lead earlier: the
    report's totals add up to the step less that lead (`drained_s`). (The figures are the
    replay's own: an audit found them pinned as expected values; the rule is what is
    checked.)"""
    from budget.schedule import replay_order

    path = tmp_path / "late.yaml"
    path.write_text(UNEVEN_LATE.replace("6, 8, 8, 10", split), encoding="utf-8")
    plan = load_plan(path)
    step = derive(plan)
    m = step.microbatches
    times = step_time(plan, step)
    forward, backward = _chunk_times(plan, list(times.stages), m)
    p, v = len(forward), len(forward[0])
    ops, before, waits, runs = (c.tolist() for c in replay_order(p, v, m))
    durations = np.concatenate([np.ravel(forward), np.ravel(backward)]).tolist()
    ends = [0.0] * (len(ops) + 1)
    starts = {}
    for op, a, b, t in zip(ops, before, waits, runs, strict=True):
        starts[op] = max(ends[a], ends[b])
        ends[op] = starts[op] + durations[t]
    stage_of = {op: (t % (p * v)) // v for op, t in zip(ops, runs, strict=True)}
    stage_end = [max(e for op, e in enumerate(ends) if op and stage_of[op] == s) for s in range(p)]
    stage_start = [min(starts[op] for op in starts if stage_of[op] == s) for s in range(p)]
    reduce = [s.after_s - s.optimizer_s for s in times.stages]
    put_off = [s.optimizer_s - start for s, start in zip(times.stages, stage_start, strict=True)]
    expected = max(e + r for e, r in zip(stage_end, reduce, strict=True)) + max(put_off)
    assert times.time_s == pytest.approx(expected, rel=1e-12)
    assert [s.fill_s for s in times.stages] == pytest.approx(stage_start, rel=1e-9)
    assert stage_start[0] == 0 and all(a < b for a, b in itertools.pairwise(stage_start))
    replayed = [stage_end[0] - e for e in stage_end]
    assert [s.lead_s for s in times.stages] == pytest.approx(replayed, rel=1e-9)
    # a later stage's last backward ends before those of the stages ahead of it
    assert replayed[0] == 0 and all(a < b for a, b in itertools.pairwise(replayed))
    old = max(stage_end) + max(s.after_s for s in times.stages)
    assert times.time_s < old
    summary = build_report(plan).step
    optimizing = put_off.index(max(put_off))
    assert (summary["after_stage"], summary["optimizer_stage"]) == (reducing, optimizing)
    assert summary["drained_s"] == pytest.approx(replayed[reducing])
    assert (summary["drained_s"] > 0) == (reducing > 0)
    assert summary["filled_s"] == pytest.approx(stage_start[optimizing])
    waited = summary["compute_s"] + summary["exposed_comm_s"] + summary["bubble_s"]
    left = waited - summary["drained_s"] - summary["filled_s"]
    assert left == pytest.approx(summary["time_s"], rel=1e-12)


def test_an_interleaved_pipeline_is_replayed_where_only_the_loss_sets_its_chunks_apart():
    """Nemotron-4 340B on 128 GPUs (NeMo's run, `budget.accuracy`): 96 layers over pp 8 × 12
    are 96 alike chunks of one layer, but the last stage's last chunk also runs the output
    layer over 256,000 rows and the loss, four times a chunk's forward. The closed form over
    stage totals, m·max(t) + (Σt − max(t))/v, spreads that over the stage; Megatron-LM's
    order lets that chunk pace every stage waiting on it, 17.7 ms longer with sends left out
    by a simulation of ``schedules.py`` (an audit). `budget PLAN` replays it, and with the
    waits for each send (`schedule._send_wait`, the test above) longer still."""
    from budget.accuracy import RUNS, plan_of

    (run,) = [r for r in RUNS if r.name == "Nemotron-4 340B, 128 GPUs"]
    plan = plan_of(run)
    assert not chunks_differ(plan) and chunk_times_differ(plan)
    times = step_time(plan, derive(plan))
    m, v = derive(plan).microbatches, 12
    waits = [s.microbatch_s + s.each_microbatch_s for s in times.stages]
    closed = m * max(s.microbatch_s for s in times.stages) + (sum(waits) - max(waits)) / v
    replay = replay_of(plan, list(times.stages), m)
    unsent = replace(replay, delays=None).pipeline()
    assert 1.003 * closed < unsent < 1.01 * closed
    assert times.pipeline_s == pytest.approx(replay.pipeline(), rel=1e-12)
    assert times.pipeline_s > unsent + 0.05


def _gpt3_overlapped(tmp_path, param_gather: bool):
    """GPT-3 as shipped (tp 8, pp 8 under 1F1B, dp 16, ZeRO 1) with its data-parallel
    reduction overlapped and its parameter gather overlapped or not."""
    overlap = f"overlap: {{dp_grads: true, param_gather: {str(param_gather).lower()}}}\n"
    name = f"gpt3-{param_gather}.yaml"
    return variant(tmp_path, name, ("recompute: selective\n", "recompute: selective\n" + overlap))


def test_a_later_1f1b_stage_gathers_its_one_bucket_once_its_input_is_in(tmp_path):
    """Megatron-Core keeps a later pipeline stage's parameters in one bucket (``bucket_size``
    None past pipeline rank 0); under 1F1B its forward pre-hook launches that bucket's
    all-gather once the first forward's input has arrived and waits for all of it
    (``finish_param_sync``; ``align_param_gather``, which would launch them together, is
    only kept under interleaving). Stage k's first forward thus starts its whole gather
    G_k after stage k - 1's, and the last stage's is put off by G_1 + ... + G_7 beyond the
    first stage's: the step spends their sum past the pipeline, once the optimizer step
    (stage 0's, each stage's alike) and stage 0's first bucket are done. With the gathers
    in the optimizer step (``overlap.param_gather`` off) every stage gathers at once and a
    later stage's runs beside the fill. The figures the README quotes are the report's."""
    from budget.units import format_duration

    on = load_plan(_gpt3_overlapped(tmp_path, True))
    off = load_plan(_gpt3_overlapped(tmp_path, False))
    times = step_time(on, derive(on))
    gathers = []
    for stage in times.stages:
        phase = next(p for p in stage.phases if p.name == "optimizer")
        gather = next(t for t in phase.moves if t.move.name == "updated parameters")
        gathers.append(gather)
    # stage 0 buckets (its first bucket exposed); every later one waits for all of its own
    assert gathers[0].exposed_s < gathers[0].time_s
    assert all(g.exposed_s == g.time_s > 0 for g in gathers[1:])
    assert [s.gather_s for s in times.stages] == [0.0] + [g.time_s for g in gathers[1:]]
    # each stage's fill, the forwards of one micro-batch on the stages ahead, as a replay of
    # the schedule times them (`_chunk_times`, op by op), less the sends between stages,
    # which the fill leaves out as the drain does (`_one_chunk`): a lower bound
    m = derive(on).microbatches
    forward, _ = _chunk_times(on, list(times.stages), m)

    def send(stage):
        phase = next(p for p in stage.phases if p.name == "pipeline.forward")
        return (phase.compute_s + phase.exposed_s) * phase.count / m

    ahead = [f[0] - send(s) for f, s in zip(forward[:-1], times.stages, strict=False)]
    assert all(send(s) > 0 for s in times.stages[:-1])
    expected = list(itertools.accumulate([0.0, *ahead]))
    assert [s.fill_s for s in times.stages] == pytest.approx(expected, rel=1e-12)
    later = sum(g.time_s for g in gathers[1:])
    assert times.stages[0].behind_s == pytest.approx(later, rel=1e-12)
    # the step: the pipeline, the latest reduction past it, stage 0's optimizer step with
    # its first bucket and the later stages' gathers behind its first forward
    reduction = max(s.reduce_s - s.lead_s for s in times.stages)
    tail = reduction + times.stages[0].optimizer_s + later
    assert times.time_s == pytest.approx(times.pipeline_s + tail, rel=1e-12)
    report = build_report(on).step
    assert report["optimizer_stage"] == 0
    assert report["fill_gathers_s"] == pytest.approx(later, rel=1e-12)
    waited = report["compute_s"] + report["exposed_comm_s"] + report["bubble_s"]
    left = waited - report["drained_s"] - report["filled_s"]
    assert left == pytest.approx(report["time_s"], rel=1e-12)
    slower = build_report(off).step
    assert slower["fill_gathers_s"] == 0
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = (
        f"on spends {format_duration(later)} of a {format_duration(report['time_s'])} step "
        f"on them, where with the same gathers in the optimizer step "
        f"(`overlap.param_gather: false`) the whole step takes "
        f"{format_duration(slower['time_s'])}."
    )
    assert said in readme
    # interleaved, each stage's first chunks are gathered as its schedule starts: none
    # waits for its input
    interleaved = replace(
        on,
        parallel=replace(
            on.parallel,
            pipeline=replace(on.parallel.pipeline, schedule="interleaved", virtual_stages=2),
        ),
    )
    assert all(s.gather_s == 0 for s in step_time(interleaved, derive(interleaved)).stages)
    # Megatron-LM runs no GPipe: its buckets are not assumed there (a review)
    gpipe = replace(
        on, parallel=replace(on.parallel, pipeline=replace(on.parallel.pipeline, schedule="gpipe"))
    )
    gpipe_times = step_time(gpipe, derive(gpipe))
    assert all(s.gather_s == 0 for s in gpipe_times.stages)
    _, last = _dp_grads(gpipe, 7)
    grads = next(p for p in last.phases if p.name == "dp.grads").moves[0]
    assert grads.exposed_s < grads.time_s


def test_the_1f1b_closed_form_is_exact_where_the_last_stage_is_slowest_and_over_else():
    """`layers.chunk_times_differ` keeps the closed form m·max(t) + Σ others for an even 1F1B
    pipeline. An audit found its docstring's "exact for stages of any times" untrue: with
    the first stage slowest (p 2, m 2; stage 0 forward 10 and backward 1, stage 1 1 and 1)
    Megatron-LM's order runs stage 0's two forwards 0-20, stage 1's F0 B0 at 10-12, F1 B1
    at 20-22, and stage 0's B0 20-21 and B1 22-23: 23, where the closed form says
    2·11 + 2 = 24. With the last stage slowest, the same stages reversed, it is exact."""

    def closed(times: list[float], m: int) -> float:
        return m * max(times) + sum(times) - max(times)

    assert pipeline_replay([[10.0], [1.0]], [[1.0], [1.0]], 2) == 23.0
    assert closed([11.0, 2.0], 2) == 24.0
    assert pipeline_replay([[1.0], [10.0]], [[1.0], [1.0]], 2) == closed([2.0, 11.0], 2) == 24.0
    for m in (4, 8, 32):  # the last stage slowest: the closed form, at any m
        forward, backward = [[1.0], [1.5], [2.0], [4.0]], [[2.0], [3.0], [4.0], [8.0]]
        times = [f[0] + b[0] for f, b in zip(forward, backward, strict=True)]
        assert pipeline_replay(forward, backward, m) == pytest.approx(closed(times, m))


def test_the_output_layers_input_gather_stays_exposed_under_comm_gemm_overlap(tmp_path):
    """An audit: `overlap.tp` hid the output layer's input all-gather behind its GEMM, but
    Megatron-Core's output layer is a ``tensor_parallel.ColumnParallelLinear``, which
    all-gathers and then multiplies (``LinearWithGradAccumulationAndAsyncCommunication``)
    and which Transformer Engine's comm-GEMM overlap never reaches: exposed in full, as
    without the flag, while the attention's and MLP's gathers are hidden; its backward's
    re-gather and reduce-scatter overlap its GEMMs either way."""
    plain = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    edit = ("recompute: selective", "recompute: selective\noverlap: {tp: true}")
    base = ROOT / "plans" / "llama3-70b.yaml"
    overlapped = load_plan(variant(tmp_path, "overlapped.yaml", edit, base=base))
    assert overlapped.overlap.tp and not plain.overlap.tp

    def loss(plan):
        stage = step_time(plan, derive(plan)).stages[-1]
        (phase,) = [p for p in stage.phases if p.name == "loss"]
        return {t.move.name: t for t in phase.moves}

    before, after = loss(plain), loss(overlapped)
    gather = after["output layer input"]
    assert gather.move.window == "" and gather.exposed_s == gather.time_s > 0
    assert gather.exposed_s == before["output layer input"].exposed_s
    assert gather.slowdown_s == 0
    again = after["output layer input again, for weight grad"]
    assert again.move.window  # beside the input-gradient GEMM, as without the flag
    assert again.exposed_s == before["output layer input again, for weight grad"].exposed_s
    stage = step_time(overlapped, derive(overlapped)).stages[-1]
    (attention,) = [p for p in stage.phases if p.name == "forward.attention"]
    (hidden,) = [t for t in attention.moves if t.move.name == "attention input"]
    assert hidden.exposed_s < hidden.time_s


def test_the_first_stage_waits_for_its_first_chunk_s_buckets_whole(tmp_path):
    """Megatron-Core buckets model chunk 0 of the first pipeline stage alone, and each
    module's forward pre-hook waits for its own bucket group; but under the interleaved
    schedule (``align_param_gather``) every bucket group of chunk 0 is launched at once before
    the first forward (``start_param_sync``), in the buckets' order, the reverse of the
    model's ("all-gathers happen in reverse order of buckets"), so the embedding's group, which
    the first forward waits for, arrives last: chunk 0's part is waited for whole, as a later
    stage's one bucket is. Llama 3 70B at pp 4, v 2, every overlap on: stage 0's gather of
    updated parameters takes T = 90.8 ms, chunk 0's part f T = 48.0 ms, all of it exposed
    (audit m345), where it had been priced bucket by bucket behind that forward, W = 62.7 ms,
    0.95 · (W / 2) / (1 − 0.189) = 36.7 ms of it hidden and 11.3 ms exposed (audit m320); the
    step is 30 ms longer than that. (W was 62.5 ms before the embedding's own kernels after
    its lookup were priced, `flops.embedding_output`.)"""
    plan = _interleaved_70b(tmp_path, 2, "dp_grads: true, param_gather: true, pp: true, tp: true")
    from budget import schedule

    loaded = load_plan(plan)
    step = derive(loaded)

    def gathered(stage: int) -> tuple[float, float, float]:
        s = step.stages[stage]
        kernels = schedule._kernels(loaded, s)
        windows = schedule._windows(s, kernels, step.microbatches)
        for phase, k in zip(s.phases, kernels, strict=True):
            for t in schedule.time_phase(loaded, phase, windows, kernels=k).moves:
                if t.move.name == "updated parameters":
                    return t.time_s, t.exposed_s, windows["@forward-microbatch"]
        raise AssertionError("no gather")

    total, exposed, window = gathered(0)
    assert (total, window) == (pytest.approx(90.80e-3, rel=1e-3), pytest.approx(62.69e-3, 1e-3))
    first = 48.03e-3  # chunk 0's part, f·T
    assert exposed == pytest.approx(first, rel=2e-3)
    hidden = 0.95 * (window / 2) / (1 - 0.189)  # what the bucket-by-bucket pricing hid
    assert first - hidden == pytest.approx(11.31e-3, 2e-3)
    # a later stage's chunk 0 is one bucket, waited for whole (its fill hides it instead)
    later_total, later_exposed, _ = gathered(1)
    assert later_exposed > 0.45 * later_total
    base = budget_plan(plan).step["time_s"]
    # 7.830 bucket by bucket, before m351, m354; 7.866 before the embedding kernels, m358/m360
    assert base == pytest.approx(7.870, abs=2e-3)


def _mixed_links(tmp_path: Path, name: str, v: int = 1) -> Path:
    """gpt-1.3b at tp 2, pp 8, dp 1 over two DGX A100 nodes: under the order [tp, cp, ep,
    dp, pp] stage s sits on GPUs 2s and 2s + 1, so stages 0-3 share node 0 and 4-7 node 1,
    and only the boundary between stages 3 and 4 (and the last stage's wrap to the first,
    which an interleaved schedule's sends take) crosses InfiniBand."""
    schedule = "interleaved" if v > 1 else "1f1b"
    pipeline = f"  pipeline: {{schedule: {schedule}, virtual_stages: {v}}}\n"
    edits = [
        ("  tp: 1\n  pp: 1\n  dp: 8\n", f"  tp: 2\n  pp: 8\n  dp: 1\n{pipeline}"),
        ("  micro: 4\n  global: 512\n", "  micro: 1\n  global: 16\n"),
        ("nodes: 1}", "nodes: 2}"),
    ]
    if v > 1:
        edits.append(("  layers: 24\n", "  layers: 32\n"))
    return variant(tmp_path, name, *edits, base=ROOT / "plans" / "gpt-1.3b.yaml")


def test_each_training_stage_sends_on_its_own_pair_of_stages_link(tmp_path):
    """In Megatron-LM's 1F1B a stage exchanges with its neighbours only (forward sends with
    ``send_forward_recv_backward`` to the next, backward sends with
    ``send_backward_recv_forward`` to the previous), so a send across nodes lengthens the
    two stages beside it, not every stage (an audit, m446: each was priced at InfiniBand's,
    the step 8.8 ms long). A micro-batch's activations, 2,048 x 2,048 x 2 B = 8 MiB (no
    sequence parallelism: the whole tensor), cost 14 µs + 8,388,608 B / 24 GB/s = 363.5 µs
    over InfiniBand, and 3 µs + 8,388,608 B / B_nvlink over NVLink."""
    plan = load_plan(_mixed_links(tmp_path, "mixed.yaml"))
    nvlink, infiniband = plan.topology.levels[0], plan.topology.levels[1]
    size = 2048 * 2048 * 2
    far = 14e-6 + size / 24e9
    assert infiniband.latency + size / infiniband.bandwidth == pytest.approx(far, rel=1e-12)
    near = nvlink.latency + size / nvlink.bandwidth
    assert far > 5 * near  # the test tells the links apart
    times = step_time(plan, derive(plan))
    sends = {}
    for stage in times.stages:
        for phase in stage.phases:
            if phase.name.startswith("pipeline.") and phase.count:
                (move,) = phase.moves
                sends[stage.stage, phase.name] = move.time_s
    # forward sends on stages 0-6 (the last has no next stage), backward on stages 1-7
    crossing = {(3, "pipeline.forward"), (4, "pipeline.backward")}
    assert len(sends) == 14
    for key, time_s in sends.items():
        assert time_s == pytest.approx(far if key in crossing else near, rel=1e-9), key
    # the pipeline is its stages' closed form, m·t_max + Σ of the others' (no chunk differs)
    m = 16
    per_stage = [s.microbatch_s for s in times.stages]
    assert times.pipeline_s == pytest.approx((m - 1) * max(per_stage) + sum(per_stage), rel=1e-9)
    # the links table lists pp on both levels its sends use, where the phase rows hold the
    # costliest stage's, an InfiniBand one (an audit, m452: pp on infiniband alone)
    from budget.render.table import link_groups

    report = build_report(plan)
    assert (link_groups(report, "nvlink"), link_groups(report, "infiniband")) == ("tp, pp", "pp")


def test_an_interleaved_pipelines_wrap_sends_on_the_last_and_first_stages_link(tmp_path):
    """With two model chunks a stage, the last stage sends chunk 0's output on to chunk 1
    on the first stage, and the first stage sends that chunk's gradients back: across the
    wrap, between GPUs 14 and 0, in different nodes here, so on InfiniBand, as the sends
    across stages 3 and 4 are; every other stage's stay on NVLink."""
    from budget.schedule import move_span

    plan = load_plan(_mixed_links(tmp_path, "wrap.yaml", v=2))
    step = derive(plan)
    links = {}
    for stage in step.stages:
        for phase in stage.phases:
            for move in phase.moves:
                if move.op == "send-recv":
                    links[stage.stage, phase.name] = move_span(plan, move).tiers[-1].link.name
    assert links[7, "pipeline.forward"] == links[0, "pipeline.backward"] == "infiniband"
    assert links[3, "pipeline.forward"] == links[4, "pipeline.backward"] == "infiniband"
    others = {k: v for k, v in links.items() if k[0] not in (0, 3, 4, 7)}
    assert set(others.values()) == {"nvlink"}


@pytest.mark.parametrize("v", [1, 2])
def test_a_search_prices_each_stage_send_on_its_own_link_as_the_report(tmp_path, v):
    """Layouts of gpt-1.3b on two DGX A100 nodes whose stages share a node in twos, fours or
    not at all: their stage classes split by the links their sends cross (`StageClass.
    links`), so every layout the sweep prices is budgeted as `budget PLAN` budgets it."""
    from budget.search import Space, _Counts, apply, candidates, evaluate, structure

    plan = load_plan(_mixed_links(tmp_path, f"mixed{v}.yaml", v))
    space = Space(micro=(1,), zero=(1,), recompute=("none",), virtual_stages=(v,))
    cols = candidates(plan, 16, space, _Counts())
    keys = [tuple(k) for k in structure(plan, cols).tolist()]
    configs = cols.configs()
    groups: dict[tuple[int, ...], list] = {}
    for key, config in zip(keys, configs, strict=True):
        groups.setdefault(key, []).append(config)
    mixed = 0
    random.seed(46)
    for group in groups.values():
        sample = random.sample(group, min(4, len(group)))
        for result in evaluate(plan, sample, 16):
            layout = apply(plan, result.config, 16)
            links = {c.links for c in stage_classes(layout, merge=False)}
            mixed += len({level for pair in links for level in pair}) > 1
            report = build_report(layout)
            assert report.worst.peak_bytes == result.peak_bytes, result.config
            assert report.step["time_s"] == pytest.approx(result.step_time_s, rel=1e-9)
            assert report.step["exposed_comm_s"] == pytest.approx(
                result.exposed_comm_s, rel=1e-9, abs=1e-15
            )
    assert mixed >= 3  # layouts whose sends cross both links were among them
