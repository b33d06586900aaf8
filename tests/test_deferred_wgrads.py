"""`overlap.defer_embedding_wgrad`: Megatron-Core's last pipeline stage runs the output layer's
weight-gradient GEMMs of the step's first micro-batches in the pipeline's drain
(``defer_embedding_wgrad_compute``, ``wgrad_deferral_limit``; `step._drain`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from budget.accuracy import RUNS, plan_of
from budget.errors import BudgetError
from budget.memory import memory
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Plan
from budget.plan.write import layout_yaml
from budget.report import to_dict
from budget.report_schema import validation_errors
from budget.schedule import per_microbatch, step_time
from budget.step import derive
from tests.plan_files import searched_layout, variant

ROOT = Path(__file__).parent.parent
GPT3 = ROOT / "plans" / "gpt3-175b.yaml"
# one output-layer weight-gradient GEMM of Nemotron-4 340B: 2 · 4,096 tokens · 18,432 hidden ·
# 32,000 vocabulary rows a tp rank (256,000 over tp 8)
NEMOTRON_WGRAD = 2 * 4096 * 18432 * 32000


def _row(name: str) -> Plan:
    (run,) = [r for r in RUNS if r.name == name]
    return plan_of(run)


def _off(plan: Plan) -> Plan:
    return replace(plan, overlap=replace(plan.overlap, defer_embedding_wgrad=False))


def _last(plan: Plan):  # type: ignore[no-untyped-def]
    return {p.name: p for p in derive(plan).stages[-1].phases}


def _work(phase, name: str):  # type: ignore[no-untyped-def]
    (work,) = [w for w in phase.works if w.name == name]
    return work


def _calls(phase, name: str) -> float:  # type: ignore[no-untyped-def]
    return sum(m.count for m in phase.moves if m.name == name) * phase.count


def test_the_drain_runs_every_weight_gradient_the_loss_gives_up() -> None:
    """Nemotron-4 340B on 2,048 GPUs (the recipe's limit 22 over its 16 micro-batches): every
    weight-gradient GEMM leaves the loss, whose backward keeps the input-gradient GEMM alone
    (the forward's size), and runs once a micro-batch in the drain; no FLOP, no byte of the
    head's main-gradient accumulation and no call of the input's all-gather is lost or
    gained, and the loss's re-gathers for the weight gradient become the drain's gathers."""
    on = _row("Nemotron-4 340B, 2,048 GPUs")
    assert on.overlap.defer_embedding_wgrad == 22 and on.microbatches == 16
    deferred, inline = _last(on), _last(_off(on))
    drain = deferred["head.wgrad"]
    assert drain.count == 16
    wgrad = _work(drain, "output layer weight gradient (deferred)")
    assert wgrad.flops == NEMOTRON_WGRAD == 4_831_838_208_000
    assert wgrad.launches == 1 and wgrad.inner == (4096,)
    loss_on, loss_off = deferred["loss"], inline["loss"]
    assert _work(loss_on, "output layer backward").flops == NEMOTRON_WGRAD
    assert _work(loss_off, "output layer backward").flops == 2 * NEMOTRON_WGRAD
    assert _work(loss_on, "output layer backward").launches == 1

    def accumulated(phases) -> float:  # type: ignore[no-untyped-def]
        return sum(
            w.bytes * p.count
            for p in phases.values()
            for w in p.works
            if w.name == "main-grad accumulation" and p.name in ("loss", "head.wgrad")
        )

    assert accumulated(deferred) == pytest.approx(accumulated(inline), rel=1e-12)
    again = "output layer input again, for weight grad"
    assert _calls(loss_off, again) == 16 and _calls(loss_on, again) == 0
    assert _calls(drain, "output layer input, gathered for its deferred weight gradient") == 16


def test_a_limit_defers_the_first_micro_batches_and_the_rest_run_in_line() -> None:
    """Llama 3.1 405B on 576 GPUs: 63 micro-batches, limit 50. The loss phase stands for the
    average micro-batch: its backward kernel keeps 1 + 13/63 of its two GEMMs, and 13
    re-gathers a step are left to it."""
    on = _row("Llama 3.1 405B, 576 GPUs")
    assert on.overlap.defer_embedding_wgrad == 50 and on.microbatches == 63
    deferred, inline = _last(on), _last(_off(on))
    assert deferred["head.wgrad"].count == 50
    kept = _work(deferred["loss"], "output layer backward")
    whole = _work(inline["loss"], "output layer backward")
    assert kept.flops == pytest.approx(whole.flops * (1 + 13 / 63) / 2, rel=1e-12)
    assert kept.launches == pytest.approx(1 + 13 / 63)
    again = "output layer input again, for weight grad"
    assert _calls(deferred["loss"], again) == pytest.approx(13)
    assert all("head.wgrad" not in (p.name for p in s.phases) for s in derive(on).stages[:-1])
    # the input gradient's reduce-scatter: hidden behind the weight-gradient GEMM where it
    # runs in line, waited for whole beside a deferred one (review m369); whole call counts
    rows = {c.name: c for p in build_report(on).phases for c in p.collectives}
    alone, beside = (
        rows["output layer input gradient (weight gradient deferred)"],
        rows["output layer input gradient"],
    )
    assert (alone.count, beside.count, rows[again].count) == (50, 13, 13)
    assert alone.exposed_s == alone.time_s > 0 and beside.exposed_s == 0
    assert "weight-gradient GEMM deferred" in alone.overlap_rule


def test_the_kept_inputs_and_logits_gradients_are_held_until_the_drain() -> None:
    """Each deferred micro-batch keeps its output-layer input as the layer reads it (the
    sequence-parallel shard, 4,096 / 8 tokens × 18,432 × 2 B) and its logits gradient over
    the rank's vocabulary shard (4,096 × 32,000 × 2 B): 281,018,368 B, 16 of them on the
    340B's last stage, which its peak holds and the gradient reduction after the drain does
    not."""
    on = _row("Nemotron-4 340B, 128 GPUs")
    each = (4096 // 8 * 18432 + 4096 * 32000) * 2
    assert each == 281_018_368
    with_buffers = memory(derive(on), on.device.memory).stages[-1]
    without = memory(derive(_off(on)), on.device.memory).stages[-1]
    assert with_buffers.peak_bytes - without.peak_bytes == 16 * each
    name = "output-layer inputs and logits gradients kept for the deferred weight gradients"
    phases = _last(on)
    for phase in ("loss", "backward.mlp", "head.wgrad"):
        assert all(name in (a.name for a in i.live) for i in phases[phase].instants), phase
    for phase in ("dp.grads", "optimizer"):
        assert all(name not in (a.name for a in i.live) for i in phases[phase].instants), phase


def test_the_drain_runs_after_the_last_backward_in_the_stages_lead() -> None:
    """The drain is no part of a micro-batch: the last stage runs it after its last backward,
    before its gradient reduction, so it counts in the stage's reduction (while the stages
    ahead of it drain), and its first gather waits whole while each later one hides behind
    the GEMM before it. The step is shorter for it: the last chunk paces the stages behind."""
    on = _row("Nemotron-4 340B, 2,048 GPUs")
    off = _off(on)
    assert not per_microbatch("head.wgrad")
    timed_on, timed_off = step_time(on, derive(on)), step_time(off, derive(off))
    last_on, last_off = timed_on.stages[-1], timed_off.stages[-1]
    (drain,) = [p for p in last_on.phases if p.name == "head.wgrad"]
    (gather,) = drain.moves
    assert drain.exposed_s * drain.count == pytest.approx(gather.time_s, rel=1e-9)
    busy = (drain.compute_s + drain.exposed_s) * drain.count
    assert last_on.reduce_s - last_off.reduce_s == pytest.approx(busy, rel=1e-9)
    assert last_on.microbatch_s < last_off.microbatch_s
    assert timed_on.pipeline_s < timed_off.pipeline_s and timed_on.time_s < timed_off.time_s


def test_the_report_says_how_many_are_deferred(tmp_path) -> None:
    """The layout's defer_embedding_wgrad is the count the last stage defers, null without;
    the table's layout line says it."""
    report = build_report(_row("Nemotron-4 340B, 128 GPUs"))
    assert report.layout["defer_embedding_wgrad"] == 16
    assert build_report(load_plan(GPT3)).layout["defer_embedding_wgrad"] is None
    plan = variant(
        tmp_path,
        "deferred.yaml",
        ("recompute: selective", "recompute: selective\noverlap: {defer_embedding_wgrad: 20}"),
    )
    data = build_report(load_plan(plan))
    assert data.layout["defer_embedding_wgrad"] == 20  # of 1,536 / 16 dp = 96 micro-batches
    assert validation_errors(to_dict(data), "report") == []


@pytest.mark.parametrize(
    ("edits", "says"),
    [
        ((("  pp: 8\n", "  pp: 1\n"), ("dp: 16", "dp: 128")), "this plan has one stage"),
        ((("recompute: selective", "recompute: selective\nloss: pytorch"),), "loss is pytorch"),
    ],
)
def test_a_plan_megatron_would_refuse_is_refused(tmp_path, edits, says) -> None:
    """Megatron-Core refuses the deferral without a pipeline; its buffers hang on its own
    output layer (``loss: megatron``)."""
    deferred = (
        "recompute: selective",
        "recompute: selective\noverlap: {defer_embedding_wgrad: true}",
    )
    path = variant(tmp_path, "refused.yaml", *edits)
    text = path.read_text(encoding="utf-8").replace(*deferred)
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BudgetError) as caught:
        load_plan(path)
    # GPT-3 ties its embeddings: under loss: pytorch over pp 8 that is refused apart too
    # (`resolve._check_tied_pipeline`)
    (problem,) = [p for p in caught.value.problems if p.path != "$.loss"]
    assert problem.path == "$.overlap.defer_embedding_wgrad" and says in problem.message


def test_a_search_seed_is_refused_what_no_layout_of_it_can_run(tmp_path) -> None:
    """A search's seed skips the rules its layout decides (pp 1 would be searched anew),
    but not a loss the deferral cannot run beside, whatever the layout (review m369: the
    search priced it deferred and wrote a plan `budget` refuses)."""
    deferred = "recompute: selective\noverlap: {defer_embedding_wgrad: true}"
    one_stage = variant(
        tmp_path, "one.yaml", ("  pp: 8\n", "  pp: 1\n"), ("recompute: selective", deferred)
    )
    assert load_plan(one_stage, seed=True).overlap.defer_embedding_wgrad is True
    pytorch = variant(tmp_path, "pt.yaml", ("recompute: selective", f"{deferred}\nloss: pytorch"))
    with pytest.raises(BudgetError) as caught:
        load_plan(pytorch, seed=True)
    (problem,) = caught.value.problems
    assert "loss is pytorch" in problem.message


def test_zero_is_no_limit_a_plan_can_write(tmp_path) -> None:
    """Megatron's limit 0 means every micro-batch; a plan says that with true, so 0 is refused
    by the schema rather than read as either, and the refusal says what to write (it said only
    the minimum, to a user copying Megatron-Core's default)."""
    path = variant(
        tmp_path,
        "zero.yaml",
        ("recompute: selective", "recompute: selective\noverlap: {defer_embedding_wgrad: 0}"),
    )
    with pytest.raises(BudgetError) as caught:
        load_plan(path)
    (problem,) = caught.value.problems
    assert problem.path == "$.overlap.defer_embedding_wgrad"
    assert "less than the minimum of 1" in problem.message
    assert "wgrad_deferral_limit 0, its default, defers every micro-batch's: write true" in (
        problem.message
    )


def test_a_searched_layout_without_a_pipeline_drops_it(tmp_path) -> None:
    """`budget search` writes the seed with the ranked layout in: a layout of one stage has no
    drain (a plan would be refused), so the key goes."""
    seed = variant(
        tmp_path,
        "seed.yaml",
        ("recompute: selective", "recompute: selective\noverlap: {defer_embedding_wgrad: 22}"),
    )
    data = seed.read_bytes()
    layout = searched_layout(tp=8, zero=1, sequence_parallel=True, recompute="selective")
    kept = yaml.safe_load(layout_yaml(seed, data, {**layout, "pp": 8, "dp": 16}, 1024, "s.json"))
    gone = yaml.safe_load(layout_yaml(seed, data, {**layout, "dp": 128}, 1024, "s.json"))
    assert kept["overlap"]["defer_embedding_wgrad"] == 22
    assert "defer_embedding_wgrad" not in gone.get("overlap", {})


def test_the_nemo_rows_defer_and_aggregate_as_their_recipes_say() -> None:
    """The recipes' own settings (`budget.accuracy`): defer_embedding_wgrad_compute with its
    limit on the 70B, 405B and 340B, and the userbuffers configuration's aggregated ring
    exchanges on the 405B (all four) and GPT-3 (fc2_dgrad); the others leave both."""
    deferred = {"Llama 3.1 70B": 22, "Llama 3.1 405B": 50, "Nemotron-4 340B": 22}
    aggregated = {
        "Llama 3.1 405B": ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"),
        "GPT-3 175B": ("fc2_dgrad",),
    }
    nemo = [run for run in RUNS if run.stack == "NeMo"]
    assert len(nemo) == 12
    for run in nemo:
        model = run.name.split(",")[0]
        overlap = plan_of(run).overlap
        assert overlap.defer_embedding_wgrad == deferred.get(model, False), run.name
        assert overlap.tp_comm_aggregate == aggregated.get(model, ()), run.name


def test_a_search_says_the_recipe_settings_every_layout_keeps(tmp_path) -> None:
    """`budget search` keeps the plan's deferral and aggregated ring exchanges for every layout
    (the sweep does not turn them) and says so, in JSON and in its table's notes."""
    from typer.testing import CliRunner

    from budget.cli import app, route

    settings = "overlap: {tp: true, defer_embedding_wgrad: 4, tp_comm_aggregate: [fc2_dgrad]}"
    plan = variant(
        tmp_path, "s.yaml", ("recompute: selective", f"recompute: selective\n{settings}")
    )
    args = ["search", str(plan), "--tp", "8", "--pp", "8,16", "--zero", "1", "--micro", "1"]
    runner = CliRunner()
    data = json.loads(runner.invoke(app, route([*args, "--format", "json"])).stdout)
    hardware = data["hardware"]
    assert (hardware["defer_embedding_wgrad"], hardware["tp_comm_aggregate"]) == (4, ["fc2_dgrad"])
    assert validation_errors(data) == []
    text = " ".join(runner.invoke(app, route(args), env={"COLUMNS": "200"}).stdout.split())
    assert "defer up to 4 micro-batches' output-layer weight gradients to the drain" in text
    assert "Ring exchanges aggregated (the plan's tp_comm_aggregate): fc2_dgrad." in text


def test_a_diff_tells_every_micro_batch_from_the_first(tmp_path) -> None:
    """`true` (every micro-batch) and `1` (the first) are different plans, which Python holds
    equal (review m371: "Plan changes: none" beside a 95 ms difference)."""
    from budget.diff import plan_changes

    every = variant(
        tmp_path,
        "t.yaml",
        ("recompute: selective", "recompute: selective\noverlap: {defer_embedding_wgrad: true}"),
    )
    first = variant(
        tmp_path,
        "one.yaml",
        ("recompute: selective", "recompute: selective\noverlap: {defer_embedding_wgrad: 1}"),
    )
    (change,) = plan_changes(load_plan(every), load_plan(first))
    assert (change.key, change.a, change.b) == ("overlap.defer_embedding_wgrad", True, 1)


def test_the_step_line_names_the_drain_in_the_stage_that_ends_the_step() -> None:
    """The 340B's last stage ends the step with its deferred weight gradients, then its
    reduction: the step line and the pacing note say both (review m371: "reduction" alone,
    two thirds of it the drain's GEMMs)."""
    from budget.render.table import pacing_note, summary

    report = build_report(_row("Nemotron-4 340B, 2,048 GPUs"))
    assert report.step["after_stage"] == 7
    line = " ".join(summary(report)[0].split())
    assert "+ deferred output-layer weight gradients, gradient reduction and optimizer" in line
    assert "(stage 7's weight gradients and reduction, which end latest, start " in line
    assert "weight gradients and gradient reduction of stage 7, which end latest" in (
        pacing_note(report)
    )
    plain = " ".join(summary(build_report(_off(_row("Nemotron-4 340B, 2,048 GPUs"))))[0].split())
    assert "+ gradient reduction and optimizer" in plain and "weight gradients" not in plain
