"""Hand-written transitions: priced like built-in ones, and refused when they would be wrong."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from budget.cli import app, route
from budget.pipeline import budget_plan
from tests.plan_files import GPT3

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
