"""Hand-written transitions: priced like built-in ones, and refused when they would be wrong."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from budget.pipeline import budget_plan
from budget.plan.load import load_plan
from budget.step import derive
from tests.plan_files import GPT3, ROOT

LOGITS = """transitions:
  - name: logits-gather
    phase: loss
    tensor: {shape: [micro * seq, vocab], dtype: fp32}
    group: tp
    from: shard(1)
    to: replicate
    source_alive: true
"""


def _plan(tmp_path: Path, transitions: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(GPT3.read_text(encoding="utf-8") + transitions, encoding="utf-8")
    return path


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, route(list(args)))
    return result.exit_code, result.stdout, result.stderr


def test_gather_is_priced_and_its_buffers_counted(tmp_path):
    """fp32 logits [2048, 51200] = 419,430,400 B gathered over tp 8: ring all-gather sends
    7/8 of it per rank, and the phase holds the full tensor plus the shard (source alive)."""
    report = budget_plan(_plan(tmp_path, LOGITS))
    loss = next(p for p in report.phases if p.name == "loss")
    gather = next(c for c in loss.collectives if c.name == "logits-gather")
    full = 2048 * 51200 * 4
    assert (gather.op, gather.group, gather.ranks, gather.bytes) == ("all-gather", "tp", 8, full)
    assert gather.sent_bytes == gather.recv_bytes == 7 * full // 8
    names = {o.tensor: o.bytes for o in loss.peak_overlap}
    assert names["logits-gather (replicate)"] == full
    assert names["logits-gather (shard(1), source alive)"] == full // 8


def test_a_source_counted_freed_says_it_rests_on_a_fused_kernel(tmp_path):
    """source_alive: false drops the 1/8 shard from the peak, a reduction the seed says
    "needs implementation evidence": the gathered buffer's name and the collective's rule
    both say the figure assumes it (a seeds audit: nothing did)."""
    freed = LOGITS.replace("source_alive: true", "source_alive: false")
    report = budget_plan(_plan(tmp_path, freed))
    loss = next(p for p in report.phases if p.name == "loss")
    gather = next(c for c in loss.collectives if c.name == "logits-gather")
    assert gather.overlap_rule is not None
    assert "source_alive: false), which takes a fused or in-place kernel" in gather.overlap_rule
    names = {o.tensor for o in loss.peak_overlap}
    assert (
        "logits-gather (replicate; its source not counted beside it, source_alive: false)" in names
    )
    assert not any("source alive" in n for n in names)


def test_a_partial_left_unreduced_is_refused(tmp_path):
    plan = _plan(
        tmp_path,
        """transitions:
  - name: scores
    phase: forward
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: replicate
    to: partial
""",
    )
    code, out, err = _run(str(plan))
    assert code == 2 and out == ""
    assert "'scores' is left sum-partial on tp and would be consumed as if complete" in err
    assert "add its reduction" in err
    assert err.startswith(f"{plan}:")


def test_a_partial_gradient_into_the_optimizer_is_refused(tmp_path):
    plan = _plan(
        tmp_path,
        """transitions:
  - name: expert-grads
    phase: optimizer
    tensor: {shape: [hidden, ffn], dtype: fp32}
    group: dp
    from: replicate
    to: partial
""",
    )
    code, _, err = _run(str(plan))
    assert code == 2
    assert "'expert-grads' reaches the optimizer step sum-partial on dp" in err
    assert "the gradient reduction is missing" in err


def test_a_chain_must_start_where_the_last_transition_left_it(tmp_path):
    plan = _plan(
        tmp_path,
        """transitions:
  - name: x
    phase: forward
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: shard(0)
    to: replicate
  - name: x
    phase: backward
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: partial
    to: shard(0)
""",
    )
    code, _, err = _run(str(plan))
    assert code == 2
    assert "'x' starts from partial on tp, but the transition before it on tp left it" in err


def test_a_reduced_chain_is_accepted(tmp_path):
    plan = _plan(
        tmp_path,
        """transitions:
  - name: y
    phase: forward
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: replicate
    to: partial
  - name: y
    phase: forward
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: partial
    to: replicate
""",
    )
    code, _, err = _run(str(plan))
    assert code == 0, err


def _two(first: tuple[str, str, str], second: tuple[str, str, str], group: str) -> str:
    """Two transitions of one tensor G [hidden, hidden] fp32 on `group`, each (phase,
    from, to), in this order in the file."""
    return "transitions:\n" + "".join(
        f"  - {{name: G, phase: {phase}, tensor: {{shape: [hidden, hidden], dtype: fp32}}, "
        f"group: {group}, from: {src}, to: {dst}}}\n"
        for phase, src, dst in (first, second)
    )


@pytest.mark.parametrize("group", ["dp", "tp"])
def test_a_chain_runs_in_step_order_whatever_the_file_s(tmp_path, group):
    """A gradient made partial in the backward and "reduced" in a forward listed above it:
    the forward runs first, so the backward leaves it partial to the optimizer. The chain
    was read in file order and the plan passed, while the same two listed the other way
    round were refused (a seeds audit)."""
    made = ("backward", "replicate", "partial")
    reduced = ("forward", "partial", "shard(0)" if group == "dp" else "replicate")
    for first, second in ((made, reduced), (reduced, made)):
        code, out, err = _run(str(_plan(tmp_path, _two(first, second, group))))
        assert (code, out) == (2, ""), err
        assert f"'G' is left sum-partial on {group} and would be consumed as if complete" in err


def test_a_chain_continues_from_the_phase_the_step_runs_first(tmp_path):
    """Listed backward first, a gather in the forward and its reverse in the backward chain
    as the step runs them (forward, then backward) and are accepted; a break names the
    phase whose transition ran before."""
    gather, scatter = ("forward", "shard(0)", "replicate"), ("backward", "replicate", "shard(0)")
    code, _, err = _run(str(_plan(tmp_path, _two(scatter, gather, "tp"))))
    assert code == 0, err
    broken = ("backward", "partial", "shard(0)")
    code, _, err = _run(str(_plan(tmp_path, _two(broken, gather, "tp"))))
    assert code == 2
    assert (
        "$.transitions[0].from: 'G' starts from partial on tp, but the transition before it "
        "on tp left it replicate (in forward, which the step runs first)" in err
    )


def test_the_peak_of_a_chain_does_not_depend_on_the_file_s_order(tmp_path):
    """A gather and its reverse in forward.mlp (A, C) and a gather in backward.mlp (B): the
    step runs A, C, B whether the file lists A, C, B or A, B, C. Listed A, B, C, the forward
    chain's second step counted its source held again, one replicated bf16 [2048, 12288]
    more, 50,331,648 B (a review): both orders now peak alike."""
    one = "  - {{name: X, phase: {}, tensor: {{shape: [seq, hidden], dtype: bf16}}, group: tp, "
    a = one.format("forward.mlp") + 'from: "shard(0)", to: replicate}\n'
    b = one.format("backward.mlp") + 'from: "shard(0)", to: replicate}\n'
    c = one.format("forward.mlp") + 'from: replicate, to: "shard(0)"}\n'
    peaks = [
        budget_plan(_plan(tmp_path, "transitions:\n" + "".join(listed))).worst.peak_bytes
        for listed in ((a, c, b), (a, b, c))
    ]
    assert peaks[0] == peaks[1]


def test_a_transition_on_a_whole_pass_runs_once_per_micro_batch(tmp_path):
    """DESIGN.md's logits-gather names the forward pass: it ran once per layer of its first
    phase (forward.attention, 12 layers x 96 micro-batches = 1,152 times, +2.05 s on GPT-3;
    an audit). It now runs count times per micro-batch, in a phase of its own, on every
    stage: each stage's time per micro-batch t_i grows by one gather g of 1.66 ms, and 1F1B
    takes m·max(t) + (Σt − max(t)) (`budget.schedule`'s closed form, Narayanan et al.
    section 2.2, v = 1), so with m = 96 and p = 8 the step grows by (m + p − 1)·g = 103
    gathers, not 96: the bubble's 7 micro-batch slots wait on it too. Named by its exact
    phase (loss) it runs count times per instance of that phase, as the built-in moves do."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan

    whole = LOGITS.replace("phase: loss", "phase: forward")
    report = build_report(load_plan(_plan(tmp_path, whole)))
    (phase,) = [p for p in report.phases if p.name == "forward: logits-gather"]
    (gather,) = phase.collectives
    assert (phase.count, gather.count) == (96, 96)
    attention = next(p for p in report.phases if p.name == "forward.attention")
    assert not [c for c in attention.collectives if c.name == "logits-gather"]
    # One gather by hand: fp32 [2048, 51200] = 419,430,400 B (400 MiB) over tp 8 inside a
    # DGX A100, a ring all-gather of n = 7 steps sending 7/8 of it, 367,001,600 B, at the
    # NVLink 3 plateau 231.58 GB/s times the ramp's share at 400 MiB. The ramp's points
    # (budget.catalog.nccl_tests, all-reduce f = 1.75, n = 14, α = 3 µs, taken for
    # all-gather too) at 256 and 512 MiB, the mean of Azure's (busbw 213.87 and 221.58
    # GB/s, t = 1.75·S / busbw) and OCI's (2,121.9 and 4,208.2 µs) shares
    # (1.75·S / 231.58 GB/s) / (t − 42 µs):
    MiB = 2**20

    def share(size: int, t: float) -> float:
        return (1.75 * size / 231.58e9) / (t - 14 * 3e-6)

    def azure(size: int, busbw: float) -> float:
        return share(size, 1.75 * size / busbw)

    at_256 = (azure(256 * MiB, 213.87e9) + share(256 * MiB, 2121.9e-6)) / 2
    at_512 = (azure(512 * MiB, 221.58e9) + share(512 * MiB, 4208.2e-6)) / 2
    assert at_256 == pytest.approx(0.95841, abs=1e-5)
    assert at_512 == pytest.approx(0.97009, abs=1e-5)
    # interpolated in log size: 400 MiB is log2(400/256) = 0.64386 of the way
    at_400 = at_256 + math.log2(400 / 256) * (at_512 - at_256)
    assert at_400 == pytest.approx(0.96593, abs=1e-5)
    one = 7 * 3e-6 + 367_001_600 / (231.58e9 * at_400)  # 21 µs + 1.6407 ms
    assert one == pytest.approx(1.6617e-3, abs=1e-7)
    assert (gather.steps, gather.sent_bytes, gather.link) == (7, 367_001_600, "nvlink")
    assert gather.time_s == pytest.approx(one, rel=1e-9)
    plain = budget_plan(GPT3).step["time_s"]
    assert report.step["time_s"] - plain == pytest.approx(103 * gather.time_s, rel=1e-9)
    assert report.step["time_s"] - plain == pytest.approx(103 * one, rel=1e-9)
    twice = build_report(load_plan(_plan(tmp_path, LOGITS + "    count: 2\n")))
    loss = next(p for p in twice.phases if p.name == "loss")
    (gather,) = [c for c in loss.collectives if c.name == "logits-gather"]
    assert (loss.count, gather.count) == (96, 2 * 96)  # calls a step


def test_a_transition_on_the_pipeline_group_runs_over_every_stage(tmp_path):
    """A hand-written all-reduce over pp 4 (Mixtral on DGX H100s) is a 4-rank ring,
    n = 6 and 2 x 3/4 x 64 MiB sent a rank: 6 x 14 µs + 100,663,296 B / 47 GB/s = 2.226 ms
    over InfiniBand. It was priced as the stage sends are, on one neighbouring pair (2
    ranks, 64 MiB)."""
    from tests.plan_files import ROOT

    text = (ROOT / "plans" / "mixtral-8x7b.yaml").read_text(encoding="utf-8") + (
        "transitions:\n  - {name: ppx, phase: optimizer, tensor: {shape: [8192, 4096], "
        "dtype: bf16}, group: pp, from: partial, to: replicate}\n"
    )
    path = tmp_path / "pp.yaml"
    path.write_text(text, encoding="utf-8")
    report = budget_plan(path)
    (move,) = [c for p in report.phases for c in p.collectives if c.name == "ppx"]
    assert (move.ranks, move.steps, move.sent_bytes) == (4, 6, 100_663_296)
    assert abs(move.time_s - (6 * 14e-6 + 100_663_296 / 47e9)) < 1e-9


def test_a_prefix_names_its_phase_and_a_serving_pass_counts_in_its_latency(tmp_path):
    """`phase: dp` names dp.grads by its prefix and runs there once a step (it became a
    per-micro-batch phase of its own, +1.53 s on GPT-3: a review); a decode transition
    runs once per decode pass and is part of the time per output token."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT

    extra = (
        "transitions:\n  - {name: x, phase: dp, tensor: {shape: [4096, 8192], dtype: fp32}, "
        "group: dp, from: partial, to: replicate}\n"
    )
    report = build_report(load_plan(_plan(tmp_path, extra)))
    (dp,) = [p for p in report.phases if p.name == "dp.grads"]
    (move,) = [c for c in dp.collectives if c.name == "x"]
    assert move.count == 1
    # by hand: fp32 [4096, 8192] = 134,217,728 B all-reduced over dp 16, which on GPT-3's
    # order (tp 8 innermost) is one rank per DGX A100 node: a flat ring over InfiniBand,
    # n = 2·15 = 30 steps of 14 µs, 2·15/16 · 134,217,728 = 251,658,240 B sent a rank at
    # the HDR share 24 GB/s: 420 µs + 10.486 ms = 10.906 ms
    assert (move.ranks, move.steps, move.sent_bytes) == (16, 30, 251_658_240)
    by_hand = 30 * 14e-6 + 251_658_240 / 24e9
    assert by_hand == pytest.approx(10.906e-3, abs=1e-6)
    assert move.time_s == pytest.approx(by_hand, rel=1e-9)
    plain = budget_plan(GPT3).step["time_s"]
    assert report.step["time_s"] - plain == pytest.approx(move.time_s, rel=1e-6)
    assert report.step["time_s"] - plain == pytest.approx(by_hand, rel=1e-6)
    decode = (ROOT / "plans" / "llama3-70b-decode.yaml").read_text(encoding="utf-8") + (
        "transitions:\n  - {name: y, phase: decode, tensor: {shape: [32, 8192], dtype: bf16}, "
        "group: tp, from: partial, to: replicate}\n"
    )
    path = tmp_path / "decode.yaml"
    path.write_text(decode, encoding="utf-8")
    served = build_report(load_plan(path))
    (phase,) = [p for p in served.phases if p.name == "decode: y"]
    (move,) = phase.collectives
    assert phase.count == 511  # one per decode pass: 512 generated tokens, the first from prefill
    # by hand: bf16 [32, 8192] = 524,288 B all-reduced over tp 8 on one DGX H100's NVLink
    # 4, a ring of n = 14 steps of 3 µs sending 2·7/8 · 524,288 = 917,504 B a rank, at the
    # 370 GB/s plateau times the ramp's share at 512 KiB, below its smallest point and so
    # held at it: Together's ring all_reduce, 1 MiB in 46.52 µs, of which n·α = 42 µs,
    # leaving 4.52 µs for the 1.75·1 MiB / 370 GB/s = 4.96 µs the plateau needs: the share
    # is clipped to 1, and 42 µs + 917,504 B / 370 GB/s = 42 + 2.480 µs = 44.48 µs
    from budget.catalog.topologies import RAMPS

    (_, sizes, shares) = next(p for p in RAMPS["nvlink4"].points if p[0] == "all-reduce")
    assert (sizes[0], shares[0]) == (2**20, 1.0)
    by_hand = 14 * 3e-6 + 917_504 / 370e9
    assert by_hand == pytest.approx(44.48e-6, abs=1e-8)
    assert (move.ranks, move.steps, move.sent_bytes) == (8, 14, 917_504)
    assert move.time_s == pytest.approx(by_hand, rel=1e-9)
    base = budget_plan(ROOT / "plans" / "llama3-70b-decode.yaml").step["decode_token_s"]
    assert served.step["decode_token_s"] - base == pytest.approx(move.time_s, rel=1e-6)
    assert served.step["decode_token_s"] - base == pytest.approx(by_hand, rel=1e-6)


@pytest.mark.parametrize("phase", ["forward.embedding", "pipeline.forward"])
def test_a_transition_on_a_phase_without_instants_counts_in_the_peak(tmp_path, phase):
    """An embedding lookup or a stage send holds no tensors of its own (no more than the
    phase beside it), so a transition there is held on top of what the next phase holds at
    its first instant, an upper bound; it had been priced and never counted (an audit).
    fp32 [2048, 51200 · 8] gathered over tp 8: 3,355,443,200 B whole + 419,430,400 B shard
    on GPT-3's stage 0, beside its resident states, and above the plan's own peak; while the
    gather runs, a second 3,355,443,200 B, the copy DTensor makes of a dimension-1 gather
    (`step._dim0_copy`)."""
    big = LOGITS.replace("phase: loss", f"phase: {phase}").replace("vocab]", "vocab * 8]")
    alone = budget_plan(GPT3).stages[0]
    stage = budget_plan(_plan(tmp_path, big)).stages[0]
    # the gathered logits, fp32 [micro · seq, vocab · 8] = [1 · 2048, 51,200 · 8]:
    # 2,048 × 409,600 elements × 4 B = 3,355,443,200 B whole (replicate), and the source
    # kept alive, its shard(1) over tp 8: 3,355,443,200 / 8 = 419,430,400 B
    full = 2048 * 51200 * 8 * 4
    assert (full, full // 8) == (3_355_443_200, 419_430_400)
    added = 2 * 3_355_443_200 + 419_430_400  # = 7,130,316,800 B held on top
    assert stage.peak_phase == phase
    names = {o.tensor: o.bytes for o in stage.peak_overlap}
    assert names["logits-gather (replicate)"] == full
    assert names["logits-gather (shard(1), source alive)"] == full // 8
    states = alone.params_bytes + alone.grads_bytes + alone.optimizer_bytes + alone.reserved_bytes
    assert (
        names[
            "logits-gather (gathered along dimension 0, then copied along dimension 1: "
            "DTensor's all_gather_tensor)"
        ]
        == full
    )
    assert stage.peak_bytes >= states + 2 * full + full // 8
    assert stage.peak_bytes > alone.peak_bytes
    # what the next phase with instants holds at its first one, on stage 0 (no loss there)
    first = {}
    for point in alone.timeline:
        first.setdefault(point.phase, point)
    if phase == "pipeline.forward":
        # next comes backward.mlp, whose first instant (fc2 gradients) is 6,291,456 B
        # (the fc1 input gradient's reduce-scattered shard) below the plan's own peak at
        # its last: the transition adds exactly its two buffers to the first
        assert (alone.peak_phase, alone.peak_instant) == (
            "backward.mlp",
            "fc1 weight and input gradients",
        )
        assert first["backward.mlp"].total_bytes == alone.peak_bytes - 6_291_456
        assert stage.peak_bytes - first["backward.mlp"].total_bytes == 7_130_316_800 == added
    else:
        # next comes forward.attention: its first instant (QKV projection) plus the two
        assert first["forward.attention"].instant == "QKV projection"
        assert stage.peak_bytes == first["forward.attention"].total_bytes + 7_130_316_800


def test_a_phase_this_plan_lacks_is_refused_with_the_plan_s_own_phases(tmp_path):
    """pipeline.forward is a training phase, but not of a plan with no pipeline: said as the
    plan resolves, listing the phases a plan without one has."""
    plan = ROOT / "plans" / "gpt-1.3b.yaml"
    written = LOGITS.replace("phase: loss", "phase: pipeline.forward")
    path = tmp_path / "plan.yaml"
    path.write_text(plan.read_text(encoding="utf-8") + written, encoding="utf-8")
    code, out, err = _run(str(path))
    assert (code, out) == (2, "")
    assert "$.transitions[0].phase: unknown phase 'pipeline.forward'; use one of" in err
    assert "forward.attention" in err and "pipeline.backward" not in err


def test_what_a_plan_without_a_pipeline_lacks_comes_with_its_other_problems(tmp_path):
    """A stage send's phase, and a send kept on pp, in a plan with pp 1 were found only once
    the derived step could be built, so after every other problem of the file had been
    mended: now they come together (a review: a wrong dtype first, then the phase)."""
    plan = ROOT / "plans" / "gpt-1.3b.yaml"
    written = """transitions:
  - {name: a, phase: pipeline.forward, tensor: {shape: [8, 8], dtype: bf16}, group: tp,
     from: shard(0), to: replicate}
  - {name: b, phase: loss, tensor: {shape: [8, 8], dtype: bf17}, group: tp,
     from: shard(0), to: replicate}
  - {name: c, phase: loss, tensor: {shape: [8, 8], dtype: bf16}, group: pp,
     from: replicate, to: replicate}
  - {name: d, phase: pipeline.backward, tensor: {shape: [8, 8], dtype: bf16}, group: tp,
     from: bogus, to: replicate}
  - {name: e, phase: pipeline.forward, tensor: {shape: [8, 8], dtype: bf16}, group: pp,
     from: replicate, to: replicate}
"""
    path = tmp_path / "plan.yaml"
    path.write_text(plan.read_text(encoding="utf-8") + written, encoding="utf-8")
    code, out, err = _run(str(path))
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert any("$.transitions[0].phase: unknown phase 'pipeline.forward'" in x for x in lines)
    assert any("$.transitions[1].tensor.dtype:" in x for x in lines)
    assert any(
        "$.transitions[2].phase: 'c' keeps its placement on pp, a send to the next stage, but "
        "loss runs only on the only stage, which has no next stage to send to" in x
        for x in lines
    )
    # a transition broken elsewhere still has its phase read (a review)
    assert any("$.transitions[3].phase: unknown phase 'pipeline.backward'" in x for x in lines)
    assert any("$.transitions[3].from:" in x for x in lines)
    # a send from a phase that is not there is said once, as that (an audit: "runs only on
    # the only stage" came beside it, at the same place)
    (fifth,) = [x for x in lines if "$.transitions[4]" in x]
    assert "$.transitions[4].phase: unknown phase 'pipeline.forward'" in fifth
    # a serving plan's stage sends are its passes' (decode.pipeline; a review)
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    served = """transitions:
  - {name: s, phase: decode.pipeline, tensor: {shape: [8, 8], dtype: bf16}, group: tp,
     from: shard(0), to: replicate}
  - {name: t, phase: decode.mlp, tensor: {shape: [8, 8], dtype: bf17}, group: tp,
     from: shard(0), to: replicate}
"""
    path.write_text(decode.read_text(encoding="utf-8") + served, encoding="utf-8")
    code, out, err = _run(str(path))
    assert (code, out) == (2, "")
    said = " ".join(err.split())
    assert "$.transitions[0].phase: unknown phase 'decode.pipeline'" in said
    assert "(pp 1: no stage sends)" in said and "$.transitions[1].tensor.dtype:" in said


def test_a_stage_boundary_is_written_as_a_send_to_the_next_stage(tmp_path):
    """DESIGN rule 3's row "stage boundary → send/recv, n = 1, S": on the pp group, a tensor
    that keeps its placement moves to the next stage. GPT-3's [2048, 12288] bf16 once a
    micro-batch over InfiniBand: 14 µs + 50,331,648 B / 24 GB/s = 2.111 ms, as the built-in
    stage sends are priced. It was accepted and priced as nothing (an audit)."""
    send = (
        "transitions:\n  - {name: pp-send, phase: forward, tensor: {shape: [micro * seq, "
        "hidden], dtype: bf16}, group: pp, from: replicate, to: replicate}\n"
    )
    report = budget_plan(_plan(tmp_path, send))
    (move,) = [c for p in report.phases for c in p.collectives if c.name == "pp-send"]
    assert (move.op, move.ranks, move.steps, move.sent_bytes) == ("send-recv", 2, 1, 50_331_648)
    assert move.link == "infiniband" and move.count == 96
    assert abs(move.time_s - (14e-6 + 50_331_648 / 24e9)) < 1e-9


LN_GRAD = """transitions:
  - name: ln-grad
    phase: backward.mlp
    tensor: {{shape: [hidden], dtype: fp32}}
    group: tp
    from: {tp}
    to: {tp_to}
  - name: ln-grad
    phase: dp.grads
    tensor: {{shape: [hidden], dtype: fp32}}
    group: dp
    from: partial
    to: replicate
"""


def test_a_partial_on_one_group_is_not_reduced_on_another(tmp_path):
    """A tensor has a placement on each group: made partial on tp and then reduced on dp,
    its tp partial is never summed. The chain was keyed on the name alone, so the dp
    reduction closed it and the plan passed (an audit)."""
    plan = _plan(tmp_path, LN_GRAD.format(tp="replicate", tp_to="partial"))
    code, out, err = _run(str(plan))
    assert (code, out) == (2, "")
    assert (
        "$.transitions[0].to: 'ln-grad' is left sum-partial on tp and would be consumed as "
        "if complete" in err
    )
    assert "transitions[1]" not in err


def test_a_tensor_partial_on_two_groups_is_reduced_on_each(tmp_path):
    """Megatron-LM's sequence-parallel LayerNorm gradients: partial on tp and on dp, reduced
    on tp in the backward and on dp with the other gradients. The dp reduction starts from
    the dp placement, not from where the tp one left the tensor; it was refused ("starts
    from partial, but the transition before it left it replicate")."""
    plan = _plan(tmp_path, LN_GRAD.format(tp="partial", tp_to="replicate"))
    code, _, err = _run(str(plan))
    assert code == 0, err


def test_a_chain_in_one_phase_holds_its_tensor_once(tmp_path):
    """replicate → partial (source freed), then partial → shard(0) in the same phase: the
    second step's source is the first's result, already held, so the phase holds the
    partial F and the shard F/8, not the partial twice (an audit: 2F + F/8). bf16
    [2048, 12288] = 50,331,648 B on GPT-3, a shard over tp 8 6,291,456 B."""
    chain = """transitions:
  - name: x
    phase: forward.mlp
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: replicate
    to: partial
    source_alive: false
  - name: x
    phase: forward.mlp
    tensor: {shape: [micro * seq, hidden], dtype: bf16}
    group: tp
    from: partial
    to: shard(0)
"""
    report = budget_plan(_plan(tmp_path, chain))
    mlp = next(p for p in report.phases if p.name == "forward.mlp")
    held = {o.tensor: o.bytes for o in mlp.peak_overlap if o.tensor.startswith("x (")}
    assert held == {
        "x (partial; its source not counted beside it, source_alive: false)": 50_331_648,
        "x (shard(0))": 6_291_456,
    }


def test_a_source_is_called_freed_only_where_its_bytes_are(tmp_path):
    """The second step of a chain frees the first's result, and its row says so; the first
    step's source is no transition's, so its row says the source is not counted beside it
    (an audit: "its source counted freed" beside the still-counted tensor it gathered)."""
    chain = """transitions:
  - {name: x, phase: forward.mlp, tensor: {shape: [micro * seq, hidden], dtype: bf16},
     group: tp, from: partial, to: replicate, source_alive: false}
  - {name: x, phase: forward.mlp, tensor: {shape: [micro * seq, hidden], dtype: bf16},
     group: tp, from: replicate, to: shard(0), source_alive: false}
"""
    from budget.plan.load import load_plan
    from budget.step import derive

    chain = chain.replace("to: shard(0)", "to: replicate")  # a second step of the same size
    stage = derive(load_plan(_plan(tmp_path, chain))).stages[0]
    (mlp,) = [p for p in stage.phases if p.name == "forward.mlp"]
    rows = {a.name for i in mlp.instants for a in i.live if a.name.startswith("x (")}
    assert rows == {
        "x (replicate; its source not counted beside it, source_alive: false)",
        "x (replicate; its source freed, source_alive: false)",
    }


def test_a_local_slice_keeps_its_source_alive_when_told(tmp_path):
    """replicate → shard(1) is local, no collective, but source_alive: true still keeps the
    whole tensor while its slice exists (the schema's "the source stays allocated while
    the result exists"); it was dropped, the peak that of source_alive: false. fp32
    [2048, 51200] = 419,430,400 B whole, 52,428,800 B a shard over tp 8."""
    sliced = LOGITS.replace("from: shard(1)", "from: replicate").replace(
        "to: replicate", "to: shard(1)"
    )
    report = budget_plan(_plan(tmp_path, sliced))
    loss = next(p for p in report.phases if p.name == "loss")
    assert not [c for c in loss.collectives if c.name == "logits-gather"]
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("logits-")}
    assert held == {
        "logits-gather (shard(1))": 52_428_800,
        "logits-gather (replicate, source alive)": 419_430_400,
    }


SMALL = """name: small
mode: train
model: {layers: 4, hidden: 1024, heads: 16, ffn: 4096, vocab: 32000, mlp: gelu, norm: layernorm,
  position: learned}
batch: {seq: 2048, micro: 2, global: 32}
precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, activations: bf16}
parallel: {tp: 4, pp: 2, dp: 2, cp: 1}
device: {memory: 80 GiB, flops: {bf16: 1000 TFLOP/s, fp32: 100 TFLOP/s},
  memory_bandwidth: 3 TB/s}
topology:
  gpus: 16
  levels:
    - {name: fast, size: 16, bandwidth: 100 GB/s, latency: 10 us}
"""

STAGE_SEND = """transitions:
  - name: x
    phase: {phase}
    tensor: {{shape: [micro * seq, hidden], dtype: bf16}}
    group: pp
    from: {placement}
    to: {placement}
"""


def _small(tmp_path: Path, phase: str, placement: str = "replicate") -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL + STAGE_SEND.format(phase=phase, placement=placement), "utf-8")
    return path


def test_a_stage_send_runs_on_the_stages_with_a_next_one(tmp_path):
    """A send named in the forward pass runs on every stage but the last, as the built-in
    `pipeline.forward` does; the last stage paid 8 sends to no one (an audit). bf16
    [4096, 1024] = 8,388,608 B on one 100 GB/s link at 10 µs: g = 10 µs + 83.886 µs =
    93.886 µs. 8 micro-batches (32 / (2 x dp 2)) over pp 2 take 1F1B's m·max(t) + Σt −
    max(t) (`budget.schedule`, Narayanan et al. section 2.2): the last stage, with the
    loss, is the slower by more than g, so stage 0's t + g leaves max(t) as it was and
    the step grows by one g; it grew by (m + 1)·g = 9 g = 0.845 ms with both stages'."""
    g = 10e-6 + 8_388_608 / 100e9
    assert g == pytest.approx(93.886e-6, abs=1e-9)
    plain = tmp_path / "plain.yaml"
    plain.write_text(SMALL, "utf-8")
    report = budget_plan(_small(tmp_path, "forward"))
    (move,) = [c for p in report.phases for c in p.collectives if c.name == "x"]
    assert (move.src, move.dst, move.count) == ("i", "i+1", 8)
    assert move.time_s == pytest.approx(g, rel=1e-9)
    step = report.step["time_s"] - budget_plan(plain).step["time_s"]
    assert step == pytest.approx(g, rel=1e-6)


GATHER_THEN_SEND = """transitions:
  - {{name: x, phase: pipeline.forward, tensor: {{shape: [micro * seq, hidden], dtype: bf16}},
     group: tp, from: shard(0), to: replicate}}
  - {{name: x, phase: pipeline.forward, tensor: {{shape: [micro * seq, hidden], dtype: bf16}},
     group: pp, from: replicate, to: replicate, source_alive: {alive}}}
"""


@pytest.mark.parametrize("alive", ["true", "false"])
def test_a_stage_send_after_a_gather_sends_the_gathered_tensor_in_place(tmp_path, alive):
    """Gathered over tp 4 and then sent to the next stage in one phase, x is one tensor: the
    send reads the gathered buffer in place (``isend`` of it; NCCL's send copies nothing),
    so stage 0 holds the gathered [4096, 1024] bf16, 8,388,608 B, and its shard alive beside
    it, 2,097,152 B: 10,485,760 B, whether the send says its source stays alive or not. The
    default (source_alive: true) counted the gathered tensor again as the send's own
    output, 18,874,368 B (an audit, m385)."""
    path = tmp_path / "sent.yaml"
    path.write_text(SMALL + GATHER_THEN_SEND.format(alive=alive), "utf-8")
    step = derive(load_plan(path))
    phase = next(p for p in step.stages[0].phases if p.name == "pipeline.forward")
    held = {sum(a.total for a in i.live if a.name.startswith("x ")) for i in phase.instants}
    assert held == {8_388_608 + 2_097_152}
    report = budget_plan(path)
    sends = [c for p in report.phases for c in p.collectives if c.name == "x"]
    (send,) = [c for c in sends if c.op == "send-recv"]
    assert (send.bytes, send.src, send.dst) == (8_388_608, "i", "i+1")


def test_a_stage_send_in_the_backward_goes_to_the_previous_stage(tmp_path):
    """pipeline.backward runs on every stage but the first (here the last of 2): its send
    goes to the stage before, i → i-1, as the built-in gradient sends; it was labelled
    i → i+1 (an audit)."""
    report = budget_plan(_small(tmp_path, "pipeline.backward"))
    (move,) = [c for p in report.phases for c in p.collectives if c.name == "x"]
    assert (move.op, move.src, move.dst) == ("send-recv", "i", "i-1")


def test_a_stage_send_where_no_stage_has_a_neighbour_is_refused(tmp_path):
    """The loss runs on the last stage only, which has no next stage: the send is nowhere,
    and the plan says so rather than report it priced as nothing."""
    code, out, err = _run(str(_small(tmp_path, "loss")))
    assert (code, out) == (2, "")
    assert err.endswith(
        "$.transitions[0].phase: 'x' keeps its placement on pp, a send to the next stage, "
        "but loss runs only on the last stage, which has no next stage to send to\n"
    )


@pytest.mark.parametrize(
    ("phase", "placements", "said"),
    [
        (
            "loss",
            ("shard(0)", "replicate"),
            "an all-gather over pp, which every pipeline stage "
            "must join, but loss runs only on stage 1 of 2",
        ),
        (
            "forward.embedding",
            ("partial", "replicate"),
            "an all-reduce over pp, which every "
            "pipeline stage must join, but forward.embedding runs only on stage 0 of 2",
        ),
    ],
)
def test_a_collective_over_pp_in_a_phase_of_one_stage_is_refused(tmp_path, phase, placements, said):
    """Every stage is a member of a collective over pp, but the loss runs on the last stage
    only, and the embedding's forward on the first: the other stage never calls it, so
    NCCL would wait on it. It was priced over the whole group and charged to the stage
    running the phase alone, 192 MiB more at that stage's peak and none at the other's (an
    audit, m426)."""
    path = tmp_path / "small.yaml"
    text = STAGE_SEND.format(phase=phase, placement="{placement}")
    src, dst = placements
    text = text.replace("from: {placement}", f"from: {src}").replace(
        "to: {placement}", f"to: {dst}"
    )
    path.write_text(SMALL + text, "utf-8")
    code, out, err = _run(str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"{path}:16:12: error: $.transitions[0].phase: 'x' is {said}: the others never call "
        "it; move it in a phase every stage runs, or on a group within a stage\n"
    )
    # a phase both stages run (each layer's forward) keeps it, priced over pp 2
    path.write_text(SMALL + text.replace(f"phase: {phase}", "phase: forward.mlp"), "utf-8")
    (move,) = [c for p in budget_plan(path).phases for c in p.collectives if c.name == "x"]
    assert (move.group, move.ranks) == ("pp", 2)


@pytest.mark.parametrize("placement", ["shard(0)", "partial"])
def test_a_stage_send_of_a_share_is_refused(tmp_path, placement):
    """shard(0) → shard(0) on pp held S/pp in the peak but sent all of S: a stage send
    moves the whole tensor, so it is written replicate → replicate."""
    code, out, err = _run(str(_small(tmp_path, "pipeline.forward", placement)))
    assert (code, out) == (2, "")
    assert err == (
        f"{tmp_path / 'small.yaml'}:20:9: error: $.transitions[0].to: {placement} → "
        f"{placement} on pp is a stage send, which moves the whole tensor to the next stage "
        "(a send/recv of all of it), not a share of it held on each stage; write replicate "
        "→ replicate\n"
    )


def test_a_serving_plan_sizes_a_transition_by_its_own_batch(tmp_path):
    """A serving plan's batch is sequences, prompt and generate, and its shapes may name
    them (they were unknown names): Llama 3 70B decode's 32 sequences of a 2,048-token
    prompt and 512 generated, where seq is prompt + generate = 2,560."""
    from budget.plan.load import load_plan

    text = (ROOT / "plans" / "llama3-70b-decode.yaml").read_text(encoding="utf-8") + (
        "transitions:\n  - {name: y, phase: prefill, tensor: {shape: [sequences * prompt, "
        "generate, seq], dtype: bf16}, group: tp, from: partial, to: replicate}\n"
    )
    path = tmp_path / "decode.yaml"
    path.write_text(text, encoding="utf-8")
    (tr,) = load_plan(path).transitions
    assert tr.shape == (32 * 2048, 512, 2048 + 512)
    training = _plan(tmp_path, LOGITS.replace("micro * seq", "sequences"))
    code, _, err = _run(str(training))
    assert code == 2 and "'sequences'" in err


def test_a_tensor_sharded_on_one_group_moves_its_piece_on_another(tmp_path):
    """A tensor has a placement on each group (a DTensor's per mesh dimension): fp32 logits
    [2048, 51200] sliced over dp 16 (replicate → shard(0)) and then gathered over tp 8
    move the dp shard, 419,430,400 / 16 = 26,214,400 B, of which a ring all-gather sends
    7/8 per rank, and hold the pieces: the gathered one (26,214,400 B); the dp slice
    (3,276,800 B), which is the gather's source; and the slice's own source, the whole
    tensor's tp shard (419,430,400 / 8 = 52,428,800 B: before the slice it is shard(1) on
    tp, replicate on dp). Each transition had moved and held the whole tensor (an audit:
    the gather sent 16× the bytes over tp). While the gather runs DTensor's copy of the
    gathered piece along dimension 1 is held too (26,214,400 B, `step._dim0_copy`)."""
    both = """transitions:
  - {name: L, phase: loss, tensor: {shape: [micro * seq, vocab], dtype: fp32}, group: dp,
     from: replicate, to: shard(0), source_alive: true}
  - {name: L, phase: loss, tensor: {shape: [micro * seq, vocab], dtype: fp32}, group: tp,
     from: shard(1), to: replicate, source_alive: true}
"""
    report = budget_plan(_plan(tmp_path, both))
    loss = next(p for p in report.phases if p.name == "loss")
    (gather,) = [c for c in loss.collectives if c.name == "L"]  # a slice sends nothing
    full = 2048 * 51200 * 4
    piece = full // 16
    assert (gather.op, gather.group, gather.ranks, gather.bytes) == ("all-gather", "tp", 8, piece)
    assert gather.sent_bytes == 7 * piece // 8
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("L ")}
    assert held == {
        "L (replicate, source alive)": full // 8,  # the whole tensor's tp shard
        "L (shard(0))": full // 8 // 16,
        "L (replicate)": piece,  # gathered over tp, still dp's slice
        # gathered along dimension 0, then copied along 1 (`step._dim0_copy`), while it runs
        "L (gathered along dimension 0, then copied along dimension 1: DTensor's "
        "all_gather_tensor)": piece,
    }


def test_every_stage_follows_the_whole_chain(tmp_path):
    """GPT-3 on 8 stages: X is sliced over dp in the forward, gathered again in the loss,
    which only the last stage runs, then gathered over tp in the backward: every stage
    gathers the whole tensor over tp, 2048 × 12288 × 2 = 50,331,648 B. Stages 0-6 had kept
    the dp slice the loss undoes on the last stage, and gathered a sixteenth of it (a
    review)."""
    from budget.plan.load import load_plan
    from budget.step import derive

    chain = """transitions:
  - {name: X, phase: forward.attention, tensor: {shape: [2048, 12288], dtype: bf16},
     group: dp, from: replicate, to: shard(0)}
  - {name: X, phase: loss, tensor: {shape: [2048, 12288], dtype: bf16}, group: dp,
     from: shard(0), to: replicate}
  - {name: X, phase: backward.attention, tensor: {shape: [2048, 12288], dtype: bf16},
     group: tp, from: shard(1), to: replicate}
"""
    step = derive(load_plan(_plan(tmp_path, chain)))
    sizes = {
        st.stage: m.size_bytes
        for st in step.stages
        for p in st.phases
        if p.name == "backward.attention"
        for m in p.moves
        if m.name == "X"
    }
    assert sizes == {stage: 2048 * 12288 * 2 for stage in range(8)}


@pytest.mark.parametrize("plan", ["gpt3-175b.yaml", "llama3-70b-decode.yaml"])
def test_a_shape_is_read_against_the_names_it_is_evaluated_over(plan: str) -> None:
    """Where a section a shape is evaluated over broke, its expressions are still read, and
    their names checked against `shape_keys`: the names `shape_names` gives values to, for
    a training plan and a serving one alike."""
    from budget.plan.load import load_plan
    from budget.plan.resolve import shape_keys, shape_names

    p = load_plan(ROOT / "plans" / plan)
    serving = p.mode != "train"
    assert sorted(shape_keys(serving)) == sorted(shape_names(p.model, p.batch, p.parallel, serving))


def test_a_tensor_s_transitions_in_one_pass_are_one_phase_with_each_collective(tmp_path):
    """Two reductions of one tensor in the backward, on tp then on dp: one phase, "backward:
    x", with both all-reduces, whose times add up to the phase's communication and to what
    the step gains over the plan without them. Each had a phase of the same name, and the
    report's one row per name showed the tp all-reduce alone while the step counted both
    (an audit: the dp one, 2.70 ms on InfiniBand, was nowhere in the collectives)."""
    both = """transitions:
  - {name: x, phase: backward, tensor: {shape: [micro * seq, hidden], dtype: bf16}, group: tp,
     from: partial, to: replicate}
  - {name: x, phase: backward, tensor: {shape: [micro * seq, hidden], dtype: bf16}, group: dp,
     from: partial, to: replicate}
"""
    report = budget_plan(_plan(tmp_path, both))
    bare = budget_plan(GPT3)
    (phase,) = [p for p in report.phases if p.name == "backward: x"]
    ops = {(c.group, c.op, c.bytes) for c in phase.collectives}
    full = 2048 * 12288 * 2  # micro 1 x seq 2,048 x hidden 12,288, bf16
    assert ops == {("tp", "all-reduce", full), ("dp", "all-reduce", full)}
    assert phase.comm_s == pytest.approx(sum(c.time_s * c.count for c in phase.collectives))
    assert report.step["comm_s"] - bare.step["comm_s"] == pytest.approx(phase.comm_s)


_CO_SHARDED = """transitions:
  - {{name: x, phase: loss, tensor: {{shape: [{rows}, hidden], dtype: bf16}}, group: dp,
     from: replicate, to: shard(0)}}
  - {{name: x, phase: loss, tensor: {{shape: [{rows}, hidden], dtype: bf16}}, group: tp,
     from: replicate, to: shard(0)}}
"""


def test_a_dimension_sharded_on_two_groups_divides_by_both_degrees(tmp_path):
    """GPT-3's dp 16 and tp 8 each divide 16 rows, but a tensor shard(0) on both splits its
    rows over 128 ranks: refused, as one group's uneven shard is (DESIGN.md rule 1: a shard
    partitions). It was priced at an eighth of a row a rank (an audit, [8, 65536] on dp 2
    and tp 8: half a row). 128 rows divide; the pieces are 128 x 12,288 x 2 B / 128."""
    code, out, err = _run(str(_plan(tmp_path, _CO_SHARDED.format(rows=16))))
    assert (code, out) == (2, "")
    assert err.endswith(
        "error: $.transitions[0]: 'x' is shard(0) on dp and tp at once: dimension 0 of size 16 "
        "splits over dp 16 × tp 8 = 128 ranks, which does not divide evenly\n"
    )
    assert err.count("error:") == 1
    report = budget_plan(_plan(tmp_path, _CO_SHARDED.format(rows=128)))
    loss = next(p for p in report.phases if p.name == "loss")
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("x (")}
    assert held["x (shard(0))"] == 12288 * 2


def test_a_co_sharded_dimension_is_read_in_the_shapes_that_shard_it(tmp_path):
    """A tensor's transition on a third group, of another shape, is no part of its shards on
    dp and tp: [hidden] on cp raised an IndexError reading dimension 1 of it, and [7, 7]
    refused 128 rows as 7 (a review). A tensor keeps its shape now (a name is one tensor:
    `test_one_name_is_one_tensor`), so those are refused as such, with no traceback; of
    one shape, 128 rows over dp 16 x tp 8 divide."""
    for cp_shape in ("[hidden]", "[7, 7]", "[128, hidden]"):
        three = f"""transitions:
  - {{name: x, phase: loss, tensor: {{shape: {cp_shape}, dtype: bf16}}, group: cp,
     from: replicate, to: replicate}}
  - {{name: x, phase: backward, tensor: {{shape: [128, hidden], dtype: bf16}}, group: tp,
     from: shard(0), to: replicate}}
  - {{name: x, phase: backward, tensor: {{shape: [128, hidden], dtype: bf16}}, group: dp,
     from: shard(0), to: replicate}}
"""
        code, _, err = _run("validate", str(_plan(tmp_path, three)))
        if cp_shape == "[128, hidden]":
            assert (code, err) == (0, ""), cp_shape
        else:
            assert code == 2 and "Traceback" not in err, cp_shape
            assert err.count("a name is one tensor") == 2, err


def test_a_tensor_co_sharded_again_later_is_checked_again(tmp_path):
    """128 rows on dp 16 x tp 8 divide in the forward; the same tensor sharded again in the
    backward as [16, hidden] does not, and was accepted, the first co-shard alone checked
    (a review): priced at an eighth of a row a rank."""
    again = """transitions:
  - {name: x, phase: forward, tensor: {shape: [128, hidden], dtype: bf16}, group: dp,
     from: shard(0), to: replicate}
  - {name: x, phase: forward, tensor: {shape: [128, hidden], dtype: bf16}, group: tp,
     from: shard(0), to: replicate}
  - {name: x, phase: backward, tensor: {shape: [16, hidden], dtype: bf16}, group: dp,
     from: replicate, to: shard(0)}
  - {name: x, phase: backward, tensor: {shape: [16, hidden], dtype: bf16}, group: tp,
     from: replicate, to: shard(0)}
"""
    code, out, err = _run(str(_plan(tmp_path, again)))
    assert (code, out) == (2, "")
    assert "$.transitions[2]: 'x' is shard(0) on dp and tp at once: dimension 0 of size 16" in err
    # and, a name being one tensor, its second shape is refused as such
    assert "$.transitions[2].tensor: 'x' is [16, 12,288] bf16 here but [128, 12,288]" in err


@pytest.mark.parametrize(
    ("second", "said"),
    [
        ("{shape: [65536, 65536], dtype: bf16}", "is [65,536, 65,536] bf16 here but [16, 16] bf16"),
        ("{shape: [16, 16], dtype: fp32}", "is [16, 16] fp32 here but [16, 16] bf16"),
    ],
)
def test_one_name_is_one_tensor(tmp_path, second, said):
    """A name is one tensor (the schema: a tensor by name has a placement on each group),
    whose shape and dtype its transitions keep: X [16, 16] gathered, then "X" [65536,
    65536] scattered from the replicate the first left, counted that 512 B replicate as
    the 8 GiB source, the peak 8 GiB low (an audit). Refused at the second's tensor."""
    text = f"""transitions:
  - {{name: X, phase: loss, tensor: {{shape: [16, 16], dtype: bf16}}, group: tp,
     from: shard(1), to: replicate}}
  - name: X
    phase: loss
    tensor: {second}
    group: tp
    from: replicate
    to: shard(0)
"""
    path = _plan(tmp_path, text)
    code, out, err = _run(str(path))
    line = path.read_text(encoding="utf-8").splitlines().index(f"    tensor: {second}") + 1
    assert (code, out) == (2, "")
    assert err == (
        f"{path}:{line}:5: error: $.transitions[1].tensor: 'X' {said} in $.transitions[0]: "
        "a name is one tensor, whose shape and dtype its transitions keep; a cast or a "
        "reshape makes another tensor, so give it its own name\n"
    )


def test_a_source_freed_in_a_chain_is_gone_once_its_output_is_made(tmp_path):
    """fp32 [8192, 8192] (256 MiB) gathered over tp 8, then scattered back, both in the
    loss with source_alive: false: the gather's moment holds the replicate (S), the
    scatter's the shard (S/8), and the peak is S, as for the gather alone. The replicate
    stayed beside the shard (S + S/8), while the shard's name said its source was counted
    freed (an audit)."""
    one = """transitions:
  - {name: B, phase: loss, tensor: {shape: [8192, 8192], dtype: fp32}, group: tp,
     from: shard(1), to: replicate, source_alive: false}
"""
    both = (
        one
        + """  - {name: B, phase: loss, tensor: {shape: [8192, 8192], dtype: fp32}, group: tp,
     from: replicate, to: shard(0), source_alive: false}
"""
    )

    def loss(text: str, name: str) -> object:
        report = budget_plan(_plan(tmp_path / name, text))
        return next(p for p in report.phases if p.name == "loss")

    (tmp_path / "one").mkdir(), (tmp_path / "both").mkdir()
    alone, chain = loss(one, "one"), loss(both, "both")
    full = 8192 * 8192 * 4
    assert chain.peak_bytes == alone.peak_bytes
    overlap = {o.tensor: o.bytes for o in chain.peak_overlap if o.tensor.startswith("B ")}
    # and while the gather runs, its dimension-1 copy (`step._dim0_copy`), freed before the
    # scatter
    assert overlap == {
        "B (replicate; its source not counted beside it, source_alive: false)": full,
        "B (gathered along dimension 0, then copied along dimension 1: DTensor's "
        "all_gather_tensor)": full,
    }


def test_a_group_of_one_rank_names_no_link(tmp_path):
    """A transition over cp 1 moves nothing over no link: its JSON row said link "" beside
    NVLink's α and B (an audit); it says none of them, as the schema allows (null)."""
    import json

    text = """transitions:
  - {name: c, phase: loss, tensor: {shape: [16, 16], dtype: bf16}, group: cp,
     from: shard(1), to: replicate}
"""
    code, out, err = _run(str(_plan(tmp_path, text)), "--format", "json")
    assert code == 0, err
    loss = next(p for p in json.loads(out)["phases"] if p["name"] == "loss")
    (row,) = [c for c in loss["collectives"] if c["name"] == "c"]
    assert (row["ranks"], row["steps"], row["sent_bytes"], row["time_s"]) == (1, 0, 0, 0.0)
    assert (row["link"], row["alpha_s"], row["bandwidth_Bps"]) == (None, None, None)


def test_a_chain_of_three_freed_sources_holds_one_output_at_a_time(tmp_path):
    """X [16384, 16384] fp32 (1 GiB) gathered, scattered and gathered again over tp 8 in
    the loss, each freeing its source: one output at a time, so the peak is the gather's
    alone. The first gather's replicate was counted beside the third's (a review)."""

    def transition(src: str, dst: str) -> str:
        return (
            "  - {name: X, phase: loss, tensor: {shape: [16384, 16384], dtype: fp32}, "
            f"group: tp, from: {src}, to: {dst}, source_alive: false}}\n"
        )

    gather, scatter = transition("shard(0)", "replicate"), transition("replicate", "shard(0)")
    # Y [16384, 16384] fp32 moved shard(0) → shard(1) → shard(0) between X's steps, each
    # freeing its source: at most X's replicate and one Y shard at once (X's first
    # replicate was counted beside its third where Y freed a source between: a review),
    # and beside that shard, while each all-to-all runs, DTensor's rearranging copy of one
    # (`test_an_all_to_all_holds_dtensor_s_rearranging_copies`)
    y = [
        transition(src, dst).replace("name: X", "name: Y")
        for src, dst in (("shard(0)", "shard(1)"), ("shard(1)", "shard(0)"))
    ]
    chains = {
        "one": gather,
        "three": gather + scatter + gather,
        "one and y": gather + y[0],
        "three with y between": gather + y[0] + scatter + y[1] + gather,
    }
    peaks = {}
    for name, chain in chains.items():
        (tmp_path / name).mkdir()
        report = budget_plan(_plan(tmp_path / name, "transitions:\n" + chain))
        peaks[name] = next(p for p in report.phases if p.name == "loss").peak_bytes
    assert peaks["one"] == peaks["three"]
    assert peaks["one and y"] == peaks["three with y between"] == peaks["one"] + 2 * 2**30 // 8


def test_a_search_drops_the_layouts_that_give_a_tensor_two_shapes(tmp_path):
    """X as [micro * seq, vocab] and as [2 * seq, vocab] is one tensor at micro 2 and two
    shapes at micro 1 and 4, which `budget PLAN` refuses (a name is one tensor); the search
    priced and could write them (a review). They are rejected with their reason."""
    from budget.plan.load import load_plan
    from budget.search import Space, search

    text = """transitions:
  - {name: X, phase: loss, tensor: {shape: [micro * seq, vocab], dtype: bf16}, group: tp,
     from: shard(0), to: replicate}
  - {name: X, phase: loss, tensor: {shape: [2 * seq, vocab], dtype: bf16}, group: tp,
     from: replicate, to: shard(0)}
"""
    path = _plan(tmp_path, text)
    path.write_text(path.read_text().replace("  micro: 1\n", "  micro: 2\n", 1))
    plan = load_plan(path)  # GPT-3 at micro 2, where the two shapes are one
    space = Space(tp=(8,), pp=(8,), micro=(1, 2, 4), zero=(1,), recompute=("selective",))
    outcome = search(plan, 1024, space)
    assert {r.config.micro for r in outcome.results} <= {2}
    reason = "a hand-written transition gives its tensor another shape"
    assert outcome.rejected[reason] > 0


def test_a_reduce_scatter_freeing_its_source_holds_the_source_while_it_runs(tmp_path):
    """fp32 [2048, 51200] = 419,430,400 B, partial over tp 8 and reduce-scattered to
    shard(0) with source_alive: false: the reduction reads the whole partial, and NCCL's
    in-place reduce-scatter writes the 52,428,800 B shard into its buffer, so the phase
    holds 419,430,400 B, as the all-reduce of the same tensor does. It held the shard
    alone, 7/8 of the partial below that all-reduce (an audit)."""

    def held(to: str, alive: str) -> dict[str, int]:
        text = (
            "transitions:\n"
            "  - {name: t, phase: loss, tensor: {shape: [micro * seq, vocab], dtype: fp32},\n"
            f"     group: tp, from: partial, to: {to}, source_alive: {alive}}}\n"
        )
        (tmp_path / to / alive).mkdir(parents=True)
        report = budget_plan(_plan(tmp_path / to / alive, text))
        loss = next(p for p in report.phases if p.name == "loss")
        return {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("t (")}

    whole, shard = 2048 * 51200 * 4, 2048 * 51200 * 4 // 8
    assert held("shard(0)", "false") == {
        "t (shard(0); made in its partial source's buffer, freed with it, "
        "source_alive: false)": whole
    }
    assert sum(held("replicate", "false").values()) == whole
    assert held("shard(0)", "true") == {"t (shard(0))": shard, "t (partial, source alive)": whole}


def _chain(made: str, used: str, shape: str) -> str:
    """One tensor gathered over tp in `made` and sliced back in `used`: a chain."""
    return "".join(
        f"  - {{name: X, phase: {phase}, tensor: {{shape: {shape}, dtype: bf16}}, group: tp,\n"
        f"     from: {src}, to: {dst}, source_alive: false}}\n"
        for phase, src, dst in ((made, "shard(1)", "replicate"), (used, "replicate", "shard(1)"))
    )


def _deltas(tmp_path: Path, pp: int, chain: str) -> dict[tuple[int, str, str], int]:
    """Each stage's instants with the chain, less without it (bytes), where both have
    them (a phase without instants of its own borrows one where a transition holds)."""
    text = SMALL.replace("pp: 2, dp: 2", f"pp: {pp}, dp: {16 // (4 * pp)}")
    bare, with_chain = tmp_path / "bare.yaml", tmp_path / "chain.yaml"
    bare.write_text(text, encoding="utf-8")
    with_chain.write_text(text + "transitions:\n" + chain, encoding="utf-8")
    a, b = budget_plan(bare), budget_plan(with_chain)
    before = {(s.stage, p.phase, p.instant): p.total_bytes for s in a.stages for p in s.timeline}
    after = {(s.stage, p.phase, p.instant): p.total_bytes for s in b.stages for p in s.timeline}
    return {key: after[key] - total for key, total in before.items() if key in after}


def test_a_chain_s_tensor_is_held_between_its_transitions(tmp_path):
    """A seeds audit: a tensor gathered in forward.embedding and sliced back in
    backward.embedding was counted in those two phases alone; the replicated 1 GiB it held
    through the loss (8,192 x 65,536 bf16) was missing from the loss's peak. One stage, one
    micro-batch in flight: one copy, in every instant between."""
    deltas = _deltas(
        tmp_path, 1, _chain("forward.embedding", "backward.embedding", "[8192, 65536]")
    )
    full = 8192 * 65536 * 2
    between = {k: v for k, v in deltas.items() if k[1] not in ("dp.grads", "optimizer")}
    assert set(between.values()) == {full} and len(between) > 8
    assert deltas[0, "dp.grads", "gradient reduction"] == 0


def test_a_chain_from_the_forward_into_the_backward_is_held_as_a_saved_activation(tmp_path):
    """A tensor made in each layer's forward MLP and read in its backward MLP is a saved
    activation: on pp 2 (1F1B), stage 0 holds 2 micro-batches of its 2 layers, 4 copies of
    2,048 x 2,048 bf16 (8 MiB), stage 1 one micro-batch's 2. The engine's forward instants
    are the last layer of the last micro-batch admitted, so the earlier copies stand there
    beside it (3 before the one its MLP makes); its backward ones the first layer's, so the
    copies not read yet stand there (3 in the layer, 2 of the other micro-batch once its
    layers are done, at backward.embedding)."""
    deltas = _deltas(tmp_path, 2, _chain("forward.mlp", "backward.mlp", "[2048, 2048]"))
    mib8 = 2048 * 2048 * 2
    copies = {
        (0, "forward.attention"): 3,
        (0, "forward.mlp"): 4,
        (0, "backward.mlp"): 4,  # 3 not read, and the one read, sliced in its own buffer
        (0, "backward.attention"): 3,
        (0, "backward.embedding"): 2,
        (1, "forward.attention"): 1,
        (1, "forward.mlp"): 2,
        (1, "loss"): 2,
        (1, "backward.mlp"): 2,
        (1, "backward.attention"): 1,
    }
    for (stage, phase, _), delta in deltas.items():
        assert delta == copies.get((stage, phase), 0) * mib8, (stage, phase)


def test_a_sweep_holds_a_chain_s_copies_as_the_report_does(tmp_path):
    """The sweep prices the same chain per layout, its copies arrays of the layouts'
    micro-batches in flight and layers: each ranked layout's peak is its report's."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan
    from budget.search import Space, apply, search

    text = SMALL
    path = tmp_path / "chain.yaml"
    chain = _chain("forward.mlp", "backward.mlp", "[micro * 2048, 2048]")
    path.write_text(text + "transitions:\n" + chain, encoding="utf-8")
    plan = load_plan(path)
    space = Space(tp=(1, 4), pp=(1, 2, 4), micro=(1, 2), zero=(1,), recompute=("none",))
    outcome = search(plan, 16, space, keep=None)
    assert len(outcome.results) > 6
    for result in outcome.results:
        report = build_report(apply(plan, result.config, 16))
        assert report.worst.peak_bytes == result.peak_bytes, result.config


def test_a_chain_on_whole_passes_is_held_once_a_micro_batch(tmp_path):
    """A review: a tensor gathered in `phase: forward` and sliced back in `phase: backward`
    runs once a micro-batch (`WHOLE_PASSES`), but the forward's first phase with instants is
    per-layer (forward.attention), and its copies were counted a layer each: 4 on one stage
    of 4 layers where one micro-batch in flight holds 1 (24 MiB too many)."""
    deltas = _deltas(tmp_path, 1, _chain("forward", "backward", "[2048, 2048]"))
    mib8 = 2048 * 2048 * 2
    loss = deltas[0, "loss", "cross-entropy"]
    assert loss == mib8  # one copy, where it had been 4
    assert max(deltas.values()) == mib8


@pytest.mark.parametrize(
    ("shape", "src", "dst", "copy"),
    [
        ("[8192, 8192]", "shard(0)", "replicate", None),
        (
            "[8192, 8192]",
            "shard(1)",
            "replicate",
            "gathered along dimension 0, then copied along "
            "dimension 1: DTensor's all_gather_tensor",
        ),
        ("[1, 67108864]", "shard(1)", "replicate", None),  # a view: the dimension before is 1
        ("[8192, 8192]", "partial", "shard(0)", None),
        (
            "[8192, 8192]",
            "partial",
            "shard(1)",
            "its chunks along dimension 1 copied to "
            "dimension 0 for the reduce-scatter: DTensor's reduce_scatter_tensor",
        ),
    ],
)
def test_a_transition_of_a_dimension_other_than_0_holds_dtensor_s_copy(
    tmp_path, shape, src, dst, copy
):
    """NCCL gathers and scatters along dimension 0 only, so DTensor's all_gather_tensor of a
    dimension k > 0 concatenates the gathered chunks along k into a second full tensor (a view
    where every dimension before k has size 1), and its reduce_scatter_tensor first copies
    the partial's chunks along k to dimension 0 (PyTorch, _functional_collectives.py). fp32
    [8192, 8192] = S = 268,435,456 B over tp 8, source alive: the moment of the transition holds
    the full tensor (replicate or partial, S), the shard (S/8 = 33,554,432 B) and, for the
    copying cases, S more: 2S + S/8 = 570,425,344 B where it had read S + S/8 = 301,989,888 B
    (an audit). A second tensor made after it in the phase (Y, an fp32 [4096, 4096] replicate,
    67,108,864 B) is held after the copy is freed, not beside it."""
    text = (
        "transitions:\n"
        f"  - {{name: X, phase: loss, tensor: {{shape: {shape}, dtype: fp32}}, group: tp,\n"
        f"     from: {src}, to: {dst}, source_alive: true}}\n"
        "  - {name: Y, phase: loss, tensor: {shape: [4096, 4096], dtype: fp32}, group: tp,\n"
        "     from: replicate, to: replicate}\n"
    )
    report = budget_plan(_plan(tmp_path, text))
    stage = report.stages[-1]  # the loss runs on the last stage
    moments = [p for p in stage.timeline if p.phase == "loss"]
    whole, piece, other = 268_435_456, 33_554_432, 67_108_864
    assert whole == 8192 * 8192 * 4 and piece == whole // 8 and other == 4096 * 4096 * 4
    base = budget_plan(GPT3).stages[-1]
    alone = max(p.total_bytes for p in base.timeline if p.phase == "loss")
    most = max(p.total_bytes for p in moments)
    if copy is None:
        assert most == alone + whole + piece + other
    else:
        assert whole + whole + piece == 570_425_344
        assert most == alone + 570_425_344  # Y is not beside the copy: 2S + S/8 > S + S/8 + Y
        loss = next(p for p in report.phases if p.name == "loss")
        held = {o.tensor: o.bytes for o in loss.peak_overlap}
        assert held[f"X ({copy})"] == whole
        assert not any(name.startswith("Y") for name in held)


_NESTED = """transitions:
  - {{name: W, phase: forward, tensor: {{shape: [8192, 8192], dtype: fp32}}, group: dp,
     from: replicate, to: shard(0)}}
  - {{name: W, phase: forward, tensor: {{shape: [8192, 8192], dtype: fp32}}, group: tp,
     from: replicate, to: shard(0)}}
{loss}"""
_GATHER = """  - {{name: W, phase: loss, tensor: {{shape: [8192, 8192], dtype: fp32}},
     group: {group}, from: {src}, to: {dst}}}
"""


def _gathers(*steps: tuple[str, str, str]) -> str:
    return "".join(_GATHER.format(group=g, src=s, dst=d) for g, s, d in steps)


def test_a_gather_of_the_outer_of_two_nested_shards_is_refused(tmp_path):
    """W is split over dp 16 and then, each dp piece, over tp 8: rank (d, t) holds row block
    d·8 + t of 128. Gathering over dp first leaves it every 8th block, which is no shard(0)
    on tp, and was priced as one dp all-gather of the 2 MiB tp shard (an audit); DTensor
    reshards: tp first, then dp, then a local slice on tp. That order is accepted and priced
    as DTensor runs it: a tp all-gather of the dp piece, 268,435,456 / 16 = 16,777,216 B,
    then a dp all-gather of the whole 268,435,456 B."""
    refused = _plan(tmp_path, _NESTED.format(loss=_gathers(("dp", "shard(0)", "replicate"))))
    code, out, err = _run(str(refused))
    assert (code, out) == (2, "")
    assert err.count("error:") == 1
    assert "error: $.transitions[2].from: 'W' is shard(0) on tp inside its shard(0) on dp " in err
    assert "tp shard(0) → replicate first, then this" in err
    dtensor = _gathers(
        ("tp", "shard(0)", "replicate"),
        ("dp", "shard(0)", "replicate"),
        ("tp", "replicate", "shard(0)"),
        ("tp", "shard(0)", "replicate"),
    )
    report = budget_plan(_plan(tmp_path, _NESTED.format(loss=dtensor)))
    loss = next(p for p in report.phases if p.name == "loss")
    moved = [(c.group, c.op, c.bytes) for c in loss.collectives if c.name == "W"]
    assert moved[:2] == [("tp", "all-gather", 16_777_216), ("dp", "all-gather", 268_435_456)]


def test_a_tensor_that_starts_split_twice_gathers_either_group_first(tmp_path):
    """Starting placements say no order (FSDP2 under tensor parallelism holds a weight
    shard(0) on dp inside shard(0) on tp): a gather of either is taken to find its group the
    inner one. Split again by the chain (tp, then dp inside it), the order is known: dp's
    gather first is accepted, tp's is refused."""
    start = """transitions:
  - {name: W, phase: forward, tensor: {shape: [8192, 8192], dtype: fp32}, group: dp,
     from: shard(0), to: replicate}
  - {name: W, phase: loss, tensor: {shape: [8192, 8192], dtype: fp32}, group: tp,
     from: shard(0), to: replicate}
  - {name: W, phase: backward, tensor: {shape: [8192, 8192], dtype: fp32}, group: tp,
     from: replicate, to: shard(0)}
  - {name: W, phase: backward, tensor: {shape: [8192, 8192], dtype: fp32}, group: dp,
     from: replicate, to: shard(0)}
"""
    last = (
        "  - {{name: W, phase: optimizer, tensor: {{shape: [8192, 8192], dtype: fp32}},\n"
        "     group: {}, from: shard(0), to: replicate}}\n"
    )
    (tmp_path / "dp").mkdir(), (tmp_path / "tp").mkdir()
    assert _run(str(_plan(tmp_path / "dp", start + last.format("dp"))))[0] == 0
    code, _, err = _run(str(_plan(tmp_path / "tp", start + last.format("tp"))))
    assert code == 2
    assert "$.transitions[4].from: 'W' is shard(0) on dp inside its shard(0) on tp" in err


@pytest.mark.parametrize(
    ("shape", "src", "dst", "copies", "label"),
    [
        (
            "[8192, 8192]",
            "shard(0)",
            "shard(1)",
            1,
            "its chunks along dimension 1 moved to dimension 0",
        ),
        (
            "[8192, 8192]",
            "shard(1)",
            "shard(0)",
            1,
            "the buffer it receives into, then moved to dimension 1",
        ),
        (
            "[8, 4096, 2048]",
            "shard(1)",
            "shard(2)",
            2,
            "its chunks along dimension 2 moved to dimension 0 and the buffer it receives "
            "into, then moved to dimension 1",
        ),
        # contiguous() passes over dimensions of size 1 (a review, m346): the received
        # [8, 1, 1024, 1024] moved to [1, 8, 1024, 1024] is not copied, nor the source's
        # [1, 65536, 8, 128] chunks moved to the front
        (
            "[1, 8192, 8192]",
            "shard(1)",
            "shard(2)",
            1,
            "its chunks along dimension 2 moved to dimension 0",
        ),
        (
            "[1, 65536, 1024]",
            "shard(2)",
            "shard(1)",
            1,
            "the buffer it receives into, then moved to dimension 2",
        ),
    ],
)
def test_an_all_to_all_holds_dtensor_s_rearranging_copies(tmp_path, shape, src, dst, copies, label):
    """An audit (m340): DTensor's shard(i) → shard(j) (``shard_dim_alltoall``,
    Functional.cpp) copies the source's chunks along j to dimension 0 unless j is 0
    (``movedim(shard_dim, 0).contiguous()``), receives into a buffer of a shard's size and
    makes the output from it by a copy unless i is 0 (``recv_tensor.movedim(0,
    gather_dim).contiguous()``). fp32 S = 268,435,456 B over tp 8, a shard P = S/8 =
    33,554,432 B: the moment holds the source and the output, 2P, and one P more for each of
    i and j that is not 0, where it held 2P."""
    text = (
        "transitions:\n"
        f"  - {{name: X, phase: loss, tensor: {{shape: {shape}, dtype: fp32}}, group: tp,\n"
        f"     from: {src}, to: {dst}, source_alive: true}}\n"
    )
    report = budget_plan(_plan(tmp_path, text))
    piece = 268_435_456 // 8
    base = budget_plan(GPT3).stages[-1]
    alone = max(p.total_bytes for p in base.timeline if p.phase == "loss")
    most = max(p.total_bytes for p in report.stages[-1].timeline if p.phase == "loss")
    assert most == alone + (2 + copies) * piece
    loss = next(p for p in report.phases if p.name == "loss")
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("X (")}
    assert held[f"X ({label}: DTensor's shard_dim_alltoall)"] == copies * piece
    (moved,) = [c for c in loss.collectives if c.name == "X"]
    assert (moved.op, moved.sent_bytes) == ("all-to-all", 7 * piece // 8)


def test_a_group_of_one_rank_makes_no_rearranging_copy(tmp_path):
    """Over one rank DTensor's redistribute runs no collective ("only one shard",
    ``redistribute_local_tensor``): the source is the output, so a shard(1) → replicate over
    cp 1 holds the tensor (fp32 [8192, 8192], 268,435,456 B) once, no second copy and no
    source beside it (a review: 2 GiB of phantom peak on a tp 1 plan's logits gather; an
    audit, m340: the source, the same size, was still counted beside it, a search's tp 1
    layouts 2 GiB high on the loss-gathered plan's gather)."""
    text = (
        "transitions:\n"
        "  - {name: X, phase: loss, tensor: {shape: [8192, 8192], dtype: fp32}, group: cp,\n"
        "     from: shard(1), to: replicate, source_alive: true}\n"
    )
    report = budget_plan(_plan(tmp_path, text))
    loss = next(p for p in report.phases if p.name == "loss")
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("X (")}
    assert held == {"X (replicate)": 268_435_456}


_EXPERT_GRADIENT = """transitions:
  - {name: E, phase: dp.grads, tensor: {shape: [8, 4096, 4096], dtype: fp32}, group: ep,
     from: shard(0), to: shard(0)}
  - {name: E, phase: dp.grads, tensor: {shape: [8, 4096, 4096], dtype: fp32}, group: dp,
     from: partial, to: replicate}
"""


@pytest.mark.parametrize(("ep", "refused"), [("ep: 8", True), ("ep: 2\n  etp: 1", False)])
def test_a_tensor_on_ep_and_on_a_group_sharing_its_ranks_is_refused(tmp_path, ep, refused):
    """Mixtral's ep 8 is drawn from its dp 8: group_ranks gives both as ranks 0, 2, ..., 14
    (order tp, cp, ep, dp, pp; tp 2). An expert gradient kept shard(0) on ep and all-reduced
    over dp was priced as 112 MiB sent a rank, a sum of different experts' gradients, where
    Megatron reduces it over the expert-data-parallel group, of 2·8 / (8·2) = 1 rank here (an
    audit, m426). With etp 1 under tp 2, ep 2 is the tp group instead (ranks 0 and 1), apart
    from dp's, and the all-reduce stands: 64 MiB over dp 8 as a ring sends 2·7/8 of it."""
    text = (ROOT / "plans" / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "experts.yaml"
    path.write_text(text.replace("  ep: 8", f"  {ep}") + _EXPERT_GRADIENT, encoding="utf-8")
    code, out, err = _run(str(path))
    if refused:
        assert (code, out) == (2, "")
        assert err == (
            f"{path}:51:86: error: $.transitions[0].group: 'E' is split or summed on ep and on "
            "dp at once, but with ep 8, dp 8 the two groups share ranks [0, 2, 4, 6, …]: ep's "
            "is drawn from tp × cp × dp (the expert grid), so the two placements cut the same "
            "GPUs' data twice, no partition; keep it on one of them (an expert's gradient is "
            "reduced over its expert-data-parallel ranks, which no transition's group names)\n"
        )
        return
    assert code == 0
    (move,) = [c for p in budget_plan(path).phases for c in p.collectives if c.name == "E"]
    shard = 8 * 4096 * 4096 * 4 // 2  # shard(0) on ep 2
    assert (move.op, move.group, move.ranks) == ("all-reduce", "dp", 8)
    assert move.sent_bytes == 2 * 7 * shard // 8


_CHAIN_OVER_CP = (
    "transitions:\n"
    "  - {name: X, phase: loss, tensor: {shape: [8192, 8192], dtype: fp32}, group: cp,\n"
    "     from: shard(0), to: replicate}\n"
    "  - {name: X, phase: loss, tensor: {shape: [8192, 8192], dtype: fp32}, group: cp,\n"
    "     from: replicate, to: shard(0)}\n"
)


def test_a_chain_over_a_group_of_one_rank_holds_its_tensor_once(tmp_path):
    """Over cp 1 both links of a chain run nothing and hand the local tensor on (DTensor's
    ``redistribute_local_tensor``; the schema: "the source is the result: one buffer"), so
    the loss holds fp32 [8192, 8192] = 268,435,456 B once, as the chain's first link alone
    does. An audit (m527): the second link's output was held beside the first's, 1 GiB of
    phantom peak on a chain of 1 GiB tensors."""
    first = _CHAIN_OVER_CP.split("  - {name: X", 2)
    alone = budget_plan(_plan(tmp_path, first[0] + "  - {name: X" + first[1]))
    report = budget_plan(_plan(tmp_path, _CHAIN_OVER_CP))
    loss = next(p for p in report.phases if p.name == "loss")
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("X (")}
    assert held == {"X (replicate)": 268_435_456}
    assert report.worst.peak_bytes == alone.worst.peak_bytes
    # over cp 2 the second link's shard is a tensor of its own beside its held source
    two = _plan(tmp_path, _CHAIN_OVER_CP)
    two.write_text(
        two.read_text(encoding="utf-8").replace("  dp: 16\n", "  dp: 8\n  cp: 2\n"),
        encoding="utf-8",
    )
    split = budget_plan(two)
    loss = next(p for p in split.phases if p.name == "loss")
    held = {o.tensor: o.bytes for o in loss.peak_overlap if o.tensor.startswith("X (")}
    assert held == {
        "X (shard(0), source alive)": 268_435_456 // 2,
        "X (replicate)": 268_435_456,
        "X (shard(0))": 268_435_456 // 2,
    }


def test_a_sweep_holds_a_chain_over_one_rank_once_and_over_two_twice(tmp_path):
    """A search sweeps cp 1 and 2 in one pass of the engine, whose group sizes are then an
    array: at cp 1 the chain peaks where its first link alone does, at cp 2 above it, and
    each layout's peak is the one `budget PLAN` gives it written out."""
    from budget.pipeline import build_report
    from budget.search import Space, apply, search

    space = Space(
        tp=(8,),
        pp=(8,),
        cp=(1, 2),
        micro=(1,),
        virtual_stages=(1,),
        zero=(1,),
        recompute=("selective",),
        sequence_parallel=(True,),
    )
    # 8 GiB a tensor, so that the loss holds the step's peak
    chain = _CHAIN_OVER_CP.replace("[8192, 8192]", "[65536, 32768]")
    first = chain.split("  - {name: X", 2)
    peaks = {}
    for name, text in (("chain", chain), ("first", first[0] + "  - {name: X" + first[1])):
        plan = load_plan(_plan(tmp_path, text))
        results = {r.config.cp: r for r in search(plan, 1024, space).results}
        assert set(results) == {1, 2}
        for result in results.values():
            written = build_report(apply(plan, result.config, 1024))
            assert written.worst.peak_bytes == result.peak_bytes
        peaks[name] = {cp: r.peak_bytes for cp, r in results.items()}
    assert peaks["chain"][1] == peaks["first"][1]
    assert peaks["chain"][2] > peaks["first"][2]


def test_full_recompute_runs_a_layer_s_hand_written_collective_again(tmp_path):
    """Under full recompute a layer's forward runs again before its backward, its
    collectives included (Megatron-LM's ``CheckpointFunction.backward``), as budget's own
    tensor-parallel moves do: a gather written in forward.attention is priced once more in
    backward.attention, as many times, and exposed. An audit (m527): it ran 96 times a
    micro-batch in a 96-layer step's accounting where the step ran it 192. Selective
    recompute reruns the attention core alone, which holds no hand-written collective."""
    text = (
        "transitions:\n"
        "  - {name: G, phase: forward.attention, tensor: {shape: [micro * seq, hidden],\n"
        "     dtype: bf16}, group: tp, from: shard(0), to: replicate}\n"
    )
    path = _plan(tmp_path, text)
    selective = budget_plan(path)
    path.write_text(
        path.read_text(encoding="utf-8").replace("recompute: selective", "recompute: full"),
        encoding="utf-8",
    )
    full = budget_plan(path)

    def gathers(report):
        return {
            (p.name, c.name): (c.count, c.sent_bytes, c.exposed_s)
            for p in report.phases
            for c in p.collectives
            if c.name.startswith("G")
        }

    forward = gathers(selective)[("forward.attention", "G")]
    assert list(gathers(selective)) == [("forward.attention", "G")]
    assert gathers(full) == {
        ("forward.attention", "G"): forward,
        ("backward.attention", "G (recomputed forward)"): forward,
    }
    # 2048 tokens x 12,288 x 2 B gathered over tp 8: 7/8 sent per rank
    assert forward[1] == 7 * 2048 * 12288 * 2 // 8
