"""Hand-written transitions: priced like built-in ones, and refused when they would be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from budget.pipeline import budget_plan
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
    assert "logits-gather (replicate; its source counted freed, source_alive: false)" in names
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
    assert "'x' starts from partial, but the transition before it left it replicate" in err


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


def test_a_transition_on_a_whole_pass_runs_once_per_micro_batch(tmp_path):
    """DESIGN.md's logits-gather names the forward pass: it ran once per layer of its first
    phase (forward.attention, 12 layers x 96 micro-batches = 1,152 times, +2.05 s on GPT-3;
    an audit). It now runs count times per micro-batch, in a phase of its own on the
    pipeline's critical path: 96 gathers of 1.66 ms. Named by its exact phase (loss) it
    runs count times per instance of that phase, as the built-in moves do."""
    from budget.pipeline import build_report
    from budget.plan.load import load_plan

    whole = LOGITS.replace("phase: loss", "phase: forward")
    report = build_report(load_plan(_plan(tmp_path, whole)))
    (phase,) = [p for p in report.phases if p.name == "forward: logits-gather"]
    (gather,) = phase.collectives
    assert (phase.count, gather.count) == (96, 96)
    attention = next(p for p in report.phases if p.name == "forward.attention")
    assert not [c for c in attention.collectives if c.name == "logits-gather"]
    plain = budget_plan(GPT3).step["time_s"]
    assert 96 * gather.time_s < report.step["time_s"] - plain < 1.1 * 96 * gather.time_s
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
    plain = budget_plan(GPT3).step["time_s"]
    assert report.step["time_s"] - plain == pytest.approx(move.time_s, rel=1e-6)
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
    base = budget_plan(ROOT / "plans" / "llama3-70b-decode.yaml").step["decode_token_s"]
    assert served.step["decode_token_s"] - base == pytest.approx(move.time_s, rel=1e-6)


@pytest.mark.parametrize("phase", ["forward.embedding", "pipeline.forward"])
def test_a_transition_on_a_phase_without_instants_counts_in_the_peak(tmp_path, phase):
    """An embedding lookup or a stage send holds no tensors of its own (no more than the
    phase beside it), so a transition there is held on top of what the next phase holds at
    its first instant, an upper bound; it had been priced and never counted (an audit).
    fp32 [2048, 51200 · 8] gathered over tp 8: 3,355,443,200 B whole + 419,430,400 B shard
    on GPT-3's stage 0, beside its resident states, and above the plan's own peak."""
    big = LOGITS.replace("phase: loss", f"phase: {phase}").replace("vocab]", "vocab * 8]")
    alone = budget_plan(GPT3).stages[0]
    stage = budget_plan(_plan(tmp_path, big)).stages[0]
    full = 2048 * 51200 * 8 * 4
    assert stage.peak_phase == phase
    names = {o.tensor: o.bytes for o in stage.peak_overlap}
    assert names["logits-gather (replicate)"] == full
    assert names["logits-gather (shard(1), source alive)"] == full // 8
    states = alone.params_bytes + alone.grads_bytes + alone.optimizer_bytes + alone.reserved_bytes
    assert stage.peak_bytes >= states + full + full // 8
    assert stage.peak_bytes > alone.peak_bytes


def test_a_phase_this_plan_lacks_is_refused_with_the_plan_s_own_phases(tmp_path):
    """pipeline.forward is a training phase, but not of a plan with no pipeline: the step
    says so when it is derived, listing the phases this plan has."""
    plan = ROOT / "plans" / "gpt-1.3b.yaml"
    written = LOGITS.replace("phase: loss", "phase: pipeline.forward")
    path = tmp_path / "plan.yaml"
    path.write_text(plan.read_text(encoding="utf-8") + written, encoding="utf-8")
    code, out, err = _run(str(path))
    assert (code, out) == (2, "")
    assert "$.transitions[0].phase: unknown phase 'pipeline.forward'; use one of" in err
    assert "forward.attention" in err and "pipeline.backward" not in err


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
