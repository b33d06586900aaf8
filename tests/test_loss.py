"""The cross-entropy's kernels (plan key ``loss``): what each holds and moves.

Hand counts for Llama 3 8B at 8,192 tokens a micro-batch (plans/llama3-8b-fsdp.yaml):
L = 8,192 tokens x 128,256 logits = 1,050,673,152 on one rank of tp, half that on tp 2.
Megatron's vocab-parallel loss holds the bf16 logits and one fp32 buffer, 6 B a logit,
in its forward and its backward alike. PyTorch's ``F.cross_entropy(logits.float(), ...)``
holds 2 + 4 + 4 = 10 B in its forward (logits, upcast, log-softmax) and 4 + 4 + 4 = 12 B
in its backward (saved log-softmax, nll_loss's gradient, the log-softmax's); under DTensor's
``loss_parallel`` (tp > 1) 2 + 4 + 4 + 4 = 14 B (logits, upcast, x - x_max, its exp) and
4 x 4 = 16 B (saved log-softmax, zeroed grad_input, exp of the log-softmax, their sum).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from budget import flops
from budget.cli import app, route
from budget.layers import shapes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Plan
from budget.report import to_dict
from budget.search import Space, apply, search
from budget.step import derive
from tests.plan_files import ROOT, variant

PLAN = ROOT / "plans" / "llama3-8b-fsdp.yaml"
LOGITS = 8192 * 128_256  # one rank of tp


def _plan(tmp_path: Path, loss: str, *edits: tuple[str, str]) -> Plan:
    path = variant(tmp_path, f"{loss}.yaml", ("loss: pytorch", f"loss: {loss}"), *edits, base=PLAN)
    return load_plan(path)


def _loss_instants(plan: Plan) -> dict[str, int]:
    """Each instant of the last stage's loss phase: its bytes alive."""
    stage = derive(plan).stages[-1]
    (loss,) = [p for p in stage.phases if p.name == "loss"]
    return {i.label: sum(a.total for a in i.live) for i in loss.instants}


@pytest.mark.parametrize(
    ("edits", "logits", "forward", "backward"),
    [
        ((), LOGITS, 10, 12),  # ATen's log_softmax and nll_loss on the whole vocabulary
        ((("  dp: 8\n", "  tp: 2\n  dp: 4\n"),), LOGITS // 2, 14, 16),  # loss_parallel
        ((("activations: bf16", "activations: fp32"),), LOGITS, 8, 12),  # .float() copies none
    ],
)
def test_pytorchs_cross_entropy_holds_its_own_buffers_in_each_pass(
    tmp_path: Path, edits: tuple[tuple[str, str], ...], logits: int, forward: int, backward: int
) -> None:
    """Against Megatron's loss on the same layout, whose one instant holds 6 B a logit (4 B
    with fp32 logits, where the upcast is the logits themselves): PyTorch's forward and
    backward each hold their own count over the rank's logits, everything else alike."""
    megatron = _loss_instants(_plan(tmp_path, "megatron", *edits))
    pytorch = _loss_instants(_plan(tmp_path, "pytorch", *edits))
    fp32 = bool(edits) and "fp32" in edits[0][1]
    held = megatron.pop("cross-entropy") - (4 if fp32 else 6) * logits
    assert pytorch.pop("cross-entropy forward") == held + forward * logits
    assert pytorch.pop("cross-entropy backward") == held + backward * logits
    assert pytorch == megatron  # the instants after the cross-entropy: no change


def test_the_shipped_plan_peaks_at_pytorchs_backward_12_bytes_a_logit() -> None:
    """plans/llama3-8b-fsdp.yaml prices torchtitan's loss: its peak is the cross-entropy's
    backward, whose three fp32 buffers are 3 x 4 x L = 12,608,077,824 B, and its layout line
    and JSON say which loss it is."""
    plan = load_plan(PLAN)
    assert plan.loss == "pytorch"
    report = build_report(plan)
    assert (report.worst.peak_phase, report.worst.peak_instant) == (
        "loss",
        "cross-entropy backward",
    )
    stage = derive(plan).stages[0]
    (loss,) = [p for p in stage.phases if p.name == "loss"]
    (backward,) = [i for i in loss.instants if i.label == "cross-entropy backward"]
    fp32 = [a.total for a in backward.live if "(fp32)" in a.name and a.category == "transient"]
    assert sum(fp32) == 12 * LOGITS == 12_608_077_824
    assert to_dict(report)["layout"]["loss"] == "pytorch"


def test_the_loss_kernels_bytes_and_launches_are_counted_kernel_by_kernel(tmp_path: Path) -> None:
    """`flops.loss_work`'s cross-entropy, per logit: Megatron's 16 B forward and 32 B
    backward, one kernel each; PyTorch's on one rank of tp 6 + 16 = 22 B in 3 kernels and
    4 + 16 + 6 = 26 B in 4 (48 B, Megatron's total); under loss_parallel 6 + 32 = 38 B in
    25 kernels and 32 + 6 = 38 B in 21 (its per-token ops counted too: a review)."""

    def entropy(plan: Plan) -> list[tuple[str, int, int]]:
        s = shapes(plan)
        works = flops.loss_work(plan, s)
        return [(w.name, w.bytes // s.tokens, w.launches) for w in works if "entropy" in w.name]

    tp2 = ("  dp: 8\n", "  tp: 2\n  dp: 4\n")
    vocab = 128_256
    assert entropy(_plan(tmp_path, "megatron")) == [
        ("cross-entropy (fp32)", 16 * vocab, 1),
        ("cross-entropy (fp32) backward", 32 * vocab, 1),
    ]
    assert entropy(_plan(tmp_path, "pytorch")) == [
        ("cross-entropy (fp32)", 22 * vocab, 3),
        ("cross-entropy (fp32) backward", 26 * vocab, 4),
    ]
    assert entropy(_plan(tmp_path, "pytorch", tp2)) == [
        ("cross-entropy (fp32)", 38 * vocab // 2, 25),
        ("cross-entropy (fp32) backward", 38 * vocab // 2, 21),
    ]


def test_a_serving_plan_refuses_a_loss(tmp_path: Path) -> None:
    """A serving plan computes no loss: the key is refused at its line, nothing printed."""
    from typer.testing import CliRunner

    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    path = tmp_path / "decode.yaml"
    text = decode.read_text(encoding="utf-8")
    path.write_text(text + "loss: pytorch\n", encoding="utf-8")
    line = text.count("\n") + 1
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"decode.yaml:{line}:1: error: $.loss: loss names the training loss's" in result.stderr


def test_a_sweep_prices_pytorchs_loss_as_a_single_plan_does() -> None:
    """The search evaluates tp 1 and 2 together, ATen's and loss_parallel's buffers in one
    pass of the engine: each sampled layout's peak and step as `budget` gives them."""
    plan = load_plan(PLAN)
    space = Space(micro=(1,), zero=(3,), tp=(1, 2), pp=(1,), cp=(1,))
    outcome = search(plan, plan.topology.gpus, space)
    assert {r.config.tp for r in outcome.results} == {1, 2}
    random.seed(7)
    for result in random.sample(list(outcome.results), min(6, len(outcome.results))):
        report = build_report(apply(plan, result.config, plan.topology.gpus))
        assert report.worst.peak_bytes == result.peak_bytes, result.config
        assert report.step["time_s"] == pytest.approx(result.step_time_s, rel=1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_a_pipeline_holds_the_logits_to_their_backward(tmp_path: Path, schedule: str) -> None:
    """A review: ``torch.distributed.pipelining`` keeps the last stage's output, the logits,
    from its forward (``fwd_cache``) to its backward, where torchtitan without a pipeline
    drops them (``del pred``): under pp 2 the cross-entropy's backward holds 2 + 12 = 14 B a
    logit, and under GPipe each other micro-batch in flight keeps its logits beside its
    log-softmax, 6 B a logit where Megatron's keeps its 4 B softmax."""
    edits = (
        ("  dp: 8\n", f"  dp: 4\n  pp: 2\n  pipeline: {{schedule: {schedule}}}\n"),
        ("  zero: 3\n", "  zero: 1\n"),
        ("  fsdp: 2\n  fsdp_unit: layer\n  fsdp_root: split\n", ""),
        ("global: 8", "global: 16"),
        ("  param_gather: bf16\n", ""),
        ("overlap: {dp_grads: true, param_gather: true}", "overlap: {dp_grads: true}"),
    )

    def held(loss: str) -> tuple[int, int]:
        plan = _plan(tmp_path, loss, *edits)
        stage = derive(plan).stages[-1]
        (phase,) = [p for p in stage.phases if p.name == "loss"]
        last = [i for i in phase.instants if i.label.startswith("cross-entropy")][-1]
        others = [a for a in last.live if "of the other micro-batches in flight" in a.name]
        return sum(a.total for a in last.live), sum(a.total for a in others)

    (megatron, kept_m), (pytorch, kept_p) = held("megatron"), held("pytorch")
    assert pytorch - kept_p - (megatron - kept_m) == (14 - 6) * LOGITS
    if schedule == "gpipe":
        # micro-batches 4 a stage step (16 / dp 4), all forwards before the first backward:
        # three others in flight beside the one whose backward runs
        assert (kept_m, kept_p) == (3 * 4 * LOGITS, 3 * 6 * LOGITS)
    else:
        assert kept_m == kept_p == 0


TP2 = ("  dp: 8\n", "  tp: 2\n  dp: 4\n")


def test_a_gathered_loss_holds_atens_buffers_over_the_whole_vocabulary(tmp_path: Path) -> None:
    """``loss: pytorch-gathered`` at tp 2 (torchtitan's disable_loss_parallel, transformers'
    colwise_rep lm_head): every tp rank holds the one-rank cross-entropy's 10 B and 12 B a
    logit over all 128,256 logits, L, not loss_parallel's 14 B and 16 B over its L / 2:
    against Megatron's 6 B over L / 2 on the same layout, the forward holds 10 L - 3 L more
    and the backward 12 L - 3 L; the output layer's weight gradient reads the rank's shard
    of the logits' gradient, L / 2 x 2 B, as under Megatron's loss."""
    megatron = _loss_instants(_plan(tmp_path, "megatron", TP2))
    gathered = _loss_instants(_plan(tmp_path, "pytorch-gathered", TP2))
    held = megatron.pop("cross-entropy") - 6 * LOGITS // 2
    assert gathered.pop("cross-entropy forward") == held + 10 * LOGITS
    assert gathered.pop("cross-entropy backward") == held + 12 * LOGITS
    assert gathered == megatron


def test_a_gathered_loss_all_gathers_the_logits_in_the_statistics_place(tmp_path: Path) -> None:
    """Its one collective of its own is the output layer's Shard(-1) -> Replicate all-gather
    over tp 2, S = 2 B x L = 2,101,346,304 B, each rank sending S / 2; the three all-reduces
    of per-token statistics are gone; and it costs what the hand-written transition of the
    same gather in plans/llama3-8b-tp-loss-gathered.yaml costs, the same engine's ring."""

    def loss_rows(path: Path) -> dict[str, dict[str, object]]:
        report = to_dict(build_report(load_plan(path)))
        (loss,) = [p for p in report["phases"] if p["name"] == "loss"]
        return {c["name"]: c for c in loss["collectives"]}

    path = variant(tmp_path, "g.yaml", ("loss: pytorch", "loss: pytorch-gathered"), TP2, base=PLAN)
    ours = loss_rows(path)
    assert "cross-entropy statistics" not in ours
    gather = ours["logits all-gathered (loss parallel off)"]
    assert (gather["op"], gather["group"], gather["dtype"]) == ("all-gather", "tp", "bf16")
    assert gather["bytes"] == 2 * LOGITS == 2_101_346_304
    assert gather["sent_bytes"] == gather["recv_bytes"] == LOGITS
    assert gather["exposed_s"] == gather["time_s"] > 0
    hand = loss_rows(ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml")
    (written,) = [c for n, c in hand.items() if n.startswith("logits all-gathered")]
    assert written["bytes"] == gather["bytes"]
    assert written["time_s"] == pytest.approx(gather["time_s"], rel=1e-12)


def test_a_gathered_loss_runs_the_one_rank_kernels_on_every_rank(tmp_path: Path) -> None:
    """`flops.loss_work` at tp 2: 22 B and 26 B a logit over all 128,256 (ATen's kernels,
    3 and 4 launches, as on one rank); the forward's concatenation of the gathered chunks
    along the vocabulary (DTensor's all_gather_tensor of a dimension other than 0), a read
    and a write of 2 B over all 128,256: 4 x 128,256 B a token more, one launch (a review,
    m344); and the backward's slice of the rank's shard out of the replicated gradient, a
    read and a write of 2 B over 128,256 / 2: 2 x 2 x 64,128 = 256,512 B a token more, one
    launch."""
    plan = _plan(tmp_path, "pytorch-gathered", TP2)
    s = shapes(plan)
    works = [w for w in flops.loss_work(plan, s) if "entropy" in w.name]
    vocab = 128_256
    assert [(w.bytes // s.tokens, w.launches) for w in works] == [
        (22 * vocab + 2 * 2 * vocab, 4),
        (26 * vocab + 2 * 2 * vocab // 2, 5),
    ]


def test_a_gathered_loss_on_one_tp_rank_is_pytorchs(tmp_path: Path) -> None:
    """At tp 1 there is nothing to gather: the same report as ``loss: pytorch`` but the
    name of the loss in its layout (and of the plan's file)."""
    pytorch = to_dict(build_report(_plan(tmp_path, "pytorch")))
    gathered = to_dict(build_report(_plan(tmp_path, "pytorch-gathered")))
    del pytorch["plan"]["file"], gathered["plan"]["file"]
    assert (pytorch["layout"].pop("loss"), gathered["layout"].pop("loss")) == (
        "pytorch",
        "pytorch-gathered",
    )
    assert gathered == pytorch


def test_a_sweep_prices_a_gathered_loss_as_a_single_plan_does(tmp_path: Path) -> None:
    """tp 1, 2, 4 and 8 in one pass of the engine, the gathered rows a scalar beside the
    sweep's arrays: each layout's peak and step as `budget` gives them."""
    plan = _plan(tmp_path, "pytorch-gathered")
    space = Space(micro=(1,), zero=(3,), tp=(1, 2, 4, 8), pp=(1,), cp=(1,))
    outcome = search(plan, plan.topology.gpus, space)
    assert {r.config.tp for r in outcome.results} == {1, 2, 4, 8}
    for result in outcome.results:
        report = build_report(apply(plan, result.config, plan.topology.gpus))
        assert report.worst.peak_bytes == result.peak_bytes, result.config
        assert report.step["time_s"] == pytest.approx(result.step_time_s, rel=1e-9)


def test_the_hand_written_gathered_loss_against_the_built_in_one(tmp_path: Path) -> None:
    """plans/llama3-8b-tp-loss-gathered.yaml writes the gathered loss by hand over
    Megatron's; ``loss: pytorch-gathered`` in place of its transitions prices the same run,
    as its comments and the README say. The peak, the cross-entropy's backward in both, is
    lower by 1 B a logit of the whole vocabulary, L = 1,050,673,152 B (1002 MiB): Megatron's
    6 B over L / 2 plus the transitions' 2 + 4 + 4 B over L is 13 L, the built-in 12 L. The
    step is longer by the kernels over the whole vocabulary, two micro-batches of (22 + 4 +
    26 + 2) L (the gather's concatenation and the gradient's slice among them) against
    Megatron's 48 L / 2, 60 L bytes at the device's achieved memory bandwidth, 21.5 ms, less
    the three statistics all-reduces a micro-batch it no longer makes and plus its seven
    more kernel launches a micro-batch."""
    hand = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    text = hand.read_text(encoding="utf-8")
    built = tmp_path / "built.yaml"
    built.write_text(text[: text.index("\ntransitions:")] + "\nloss: pytorch-gathered\n", "utf-8")
    plan = load_plan(built)
    written, ours = build_report(load_plan(hand)), build_report(plan)
    assert written.worst.peak_bytes - ours.worst.peak_bytes == LOGITS
    assert ours.worst.peak_bytes / 2**30 == pytest.approx(31.3, abs=0.05)
    rate = plan.device.memory_bandwidth * plan.device.memory_efficiency
    (loss,) = [p for p in to_dict(written)["phases"] if p["name"] == "loss"]
    (stats,) = [c for c in loss["collectives"] if c["name"] == "cross-entropy statistics"]
    launches = 2 * 7 * plan.device.kernel_startup
    longer = 60 * LOGITS / rate - stats["count"] * stats["exposed_s"] + launches
    assert ours.step["time_s"] - written.step["time_s"] == pytest.approx(longer, rel=1e-3)
    assert longer == pytest.approx(0.0215, abs=5e-4)


def test_a_tied_model_over_a_pipeline_under_pytorchs_loss_is_refused(tmp_path: Path) -> None:
    """An audit (m519): torchtitan refuses weight tying with pipeline parallelism
    (``PipelineStage`` keeps no shared weight's gradient in step), and budget priced Llama 3
    70B tied over pp 4 under loss: pytorch with Megatron-LM's embedding all-reduce. Refused
    at $.loss; the search leaves such layouts out (pp 1 still ranks)."""
    from budget.errors import BudgetError
    from budget.search import Space, search
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "llama3-70b.yaml"
    edits = (("  tied_embeddings: false\n", "  tied_embeddings: true\n"),)
    tied = variant(tmp_path, "tied.yaml", *edits, base=base)
    path = tmp_path / "tied-pytorch.yaml"
    path.write_text(tied.read_text(encoding="utf-8") + "loss: pytorch\n", encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    (problem,) = raised.value.problems
    assert problem.path == "$.loss" and "does not tie weights across stages" in problem.message
    one = tmp_path / "one-stage.yaml"
    text = (
        path.read_text(encoding="utf-8")
        .replace("  pp: 4\n", "  pp: 1\n")
        .replace("  dp: 16\n", "  dp: 64\n")
    )
    one.write_text(text, encoding="utf-8")
    plan = load_plan(one)
    space = Space(tp=(8,), pp=(1, 2), zero=(1,), micro=(1,), virtual_stages=(1,), cp=(1,))
    outcome = search(plan, plan.topology.gpus, space)
    assert outcome.rejected.get("PyTorch's pipeline ties no weights across stages", 0) > 0
    assert all(r.config.pp == 1 for r in outcome.results)


def test_a_tied_model_over_a_pipeline_in_dtensors_styles_is_refused(tmp_path: Path) -> None:
    """A review (m520): torchtitan refuses weight tying with pipeline parallelism whatever
    its loss, and `tp_style: dtensor` is its stack: GPT-3 175B (tied, pp 8) in DTensor's
    styles is refused at $.parallel.tp_style, where the Megatron-LM plan loads."""
    from tests.plan_files import ROOT, refusal, variant

    base = ROOT / "plans" / "gpt3-175b.yaml"
    path = variant(
        tmp_path, "dtensor.yaml", ("  tp: 8\n", "  tp: 8\n  tp_style: dtensor\n"), base=base
    )
    problem = refusal(path)
    assert problem.path == "$.parallel.tp_style"
    assert "does not tie weights across stages" in problem.message
    assert load_plan(base).model.tied_embeddings
