"""`recompute_early_stop`: PyTorch's non-reentrant checkpoint stops a full recompute once every
tensor the backward reads is made again, before the MLP's fc2 (`step.early_stop`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from budget.accuracy import DIAGNOSTIC_RUNS, RUNS, plan_of
from budget.errors import BudgetError
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.write import layout_yaml
from budget.schedule import step_time, work_time
from budget.step import derive
from budget.units import format_duration
from tests.builders import make_plan
from tests.plan_files import searched_layout, variant

ROOT = Path(__file__).parent.parent
FSDP = ROOT / "plans" / "llama3-8b-fsdp.yaml"
SKIPPED = {"MLP fc2 (recomputed)", "residual add and dropout (recomputed)"}


def _phase(plan, name: str):  # type: ignore[no-untyped-def]
    return next(p for p in derive(plan).stages[0].phases if p.name == name)


def _names(plan, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [w.name for w in _phase(plan, name).works]


def test_the_recompute_stops_before_fc2_and_the_step_loses_exactly_those_kernels() -> None:
    """plans/gpt-1.3b.yaml (dp 8, nothing overlapped, no pipeline) under full recompute: the
    whole difference is the recomputed fc2 GEMM, 2 · 8,192 tokens (micro 4 × 2,048) · 8,192 ·
    2,048 = 274,877,906,944 FLOPs, and the residual add, once per layer and micro-batch."""
    whole = replace(load_plan(ROOT / "plans" / "gpt-1.3b.yaml"), recompute="full")
    stops = replace(whole, recompute_early_stop=True)
    before, after = _names(whole, "backward.mlp"), _names(stops, "backward.mlp")
    assert set(before) >= SKIPPED
    assert after == [n for n in before if n not in SKIPPED]
    assert _names(stops, "backward.attention") == _names(whole, "backward.attention")
    redone = {w.name: w for w in _phase(whole, "backward.mlp").works if w.name in SKIPPED}
    assert redone["MLP fc2 (recomputed)"].flops == 2 * 8192 * 8192 * 2048 == 274_877_906_944
    each = sum(work_time(whole, w) for w in redone.values())
    passes = 24 * whole.microbatches  # layers × micro-batches a step
    assert passes == 24 * 16
    saved = step_time(whole, derive(whole)).time_s - step_time(stops, derive(stops)).time_s
    assert saved == pytest.approx(passes * each, rel=1e-9)
    assert saved > 0


def test_what_fc2_makes_and_something_saves_keeps_it_in_the_recompute() -> None:
    """Dropout's mask after fc2 needs fc2's output (the engine fuses it with the add: the
    block runs again whole); a post-norm saves its input, fc2's output, so only the add is
    skipped; the attention block never ends the layer's recompute."""
    base = make_plan(tp=1, pp=1, dp=8, sp=False, recompute="full", global_batch=16)
    dropout = replace(base, model=replace(base.model, dropout=True))
    assert _names(replace(dropout, recompute_early_stop=True), "backward.mlp") == _names(
        dropout, "backward.mlp"
    )
    sandwich = replace(base, model=replace(base.model, sandwich_norm=True))
    stops = _names(replace(sandwich, recompute_early_stop=True), "backward.mlp")
    assert "MLP fc2 (recomputed)" in stops
    assert "residual add and dropout (recomputed)" not in stops
    assert "MLP post-norm (recomputed)" in stops


def test_an_moe_block_skips_its_residual_add_alone() -> None:
    """An MoE block's combine saves the experts' outputs: its experts' fc2 runs again."""
    mixtral = load_plan(ROOT / "plans" / "mixtral-8x7b.yaml")
    whole = replace(mixtral, recompute="full")
    before = _names(whole, "backward.moe")
    after = _names(replace(whole, recompute_early_stop=True), "backward.moe")
    assert after == [n for n in before if n != "residual add and dropout (recomputed)"]
    assert len(after) == len(before) - 1


@pytest.mark.parametrize("sp", [True, False])
def test_fc2s_output_collective_is_not_run_again(sp: bool) -> None:
    """Under tp in PyTorch's layers (DTensor's styles) the recompute gathers fc1's input
    again (sequence parallelism) but neither reduce-scatters nor all-reduces fc2's output,
    which it does not make. In Megatron-LM's and Transformer Engine's tensor-parallel
    layers fc2 is an autograd Function that saves its input after its GEMM: the GEMM and
    its collective run again, only the residual add is skipped (an audit, m511: the step
    read 0.75 s faster than a run can be)."""
    plan = make_plan(tp=8, pp=1, dp=2, sp=sp, recompute="full", global_batch=16)
    assert plan.parallel.tp_style == "megatron"
    whole = replace(plan, parallel=replace(plan.parallel, tp_style="dtensor"))

    def moves(plan) -> list[str]:  # type: ignore[no-untyped-def]
        return [m.name for m in _phase(plan, "backward.mlp").moves]

    before, after = moves(whole), moves(replace(whole, recompute_early_stop=True))
    assert "MLP output (recomputed forward)" in before
    assert after == [n for n in before if n != "MLP output (recomputed forward)"]
    assert ("MLP input (recomputed forward)" in after) is sp
    stops = replace(plan, recompute_early_stop=True)
    assert moves(stops) == moves(plan)
    kept = _names(stops, "backward.mlp")
    assert "MLP fc2 (recomputed)" in kept
    assert kept == [
        n for n in _names(plan, "backward.mlp") if n != "residual add and dropout (recomputed)"
    ]


def test_the_shipped_fsdp_plan_and_the_report_say_it(tmp_path: Path) -> None:
    """torchtitan's full mode is PyTorch's non-reentrant checkpoint: the shipped plan stops
    early, and its report says so, in the table's layout line and in the JSON."""
    plan = load_plan(FSDP)
    assert plan.recompute_early_stop
    report = build_report(plan)
    assert report.layout["recompute_early_stop"] is True
    reentrant = build_report(replace(plan, recompute_early_stop=False))
    assert report.step["time_s"] < reentrant.step["time_s"]  # type: ignore[operator]
    # the peak is the loss's (12 B a logit), which the recompute does not reach
    assert [s.peak_bytes for s in report.stages] == [s.peak_bytes for s in reentrant.stages]
    decode = build_report(load_plan(ROOT / "plans" / "llama3-70b-decode.yaml"))
    assert decode.layout["recompute_early_stop"] is None
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    steps = (format_duration(r.step["time_s"]) for r in (report, reentrant))  # type: ignore[arg-type]
    assert (
        "its step takes {}, where recomputing each layer whole would take {}.".format(*steps)
        in readme
    )


@pytest.mark.parametrize("recompute", ["selective", "none"])
def test_a_plan_without_full_recompute_is_refused(tmp_path: Path, recompute: str) -> None:
    path = variant(
        tmp_path, "plan.yaml", ("recompute: full\n", f"recompute: {recompute}\n"), base=FSDP
    )
    with pytest.raises(BudgetError) as caught:
        load_plan(path)
    (problem,) = caught.value.problems
    assert str(problem).endswith(
        "$.recompute_early_stop: recompute_early_stop stops a full recompute early, and this "
        f"plan's recompute is {recompute}; set recompute: full, or remove recompute_early_stop"
    )


def test_an_fp8_gemm_saves_after_it_multiplies(tmp_path: Path) -> None:
    """Transformer Engine's modules, which run fp8 GEMMs here, are autograd Functions whose
    saved tensors are packed once the GEMM has run: only the residual add is skipped."""
    path = variant(
        tmp_path,
        "fp8.yaml",
        ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n"),
        base=FSDP,
    )
    stops = load_plan(path)
    before = _names(replace(stops, recompute_early_stop=False), "backward.mlp")
    after = _names(stops, "backward.mlp")
    assert after == [n for n in before if n != "residual add and dropout (recomputed)"]
    assert "MLP fc2 (recomputed)" in after


def test_a_serving_plan_is_told_it_does_not_apply(tmp_path: Path) -> None:
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    path = variant(
        tmp_path,
        "d.yaml",
        ("mode: decode\n", "mode: decode\nrecompute_early_stop: true\n"),
        base=decode,
    )
    with pytest.raises(BudgetError) as caught:
        load_plan(path)
    assert "recompute_early_stop does not apply to a decode plan" in str(caught.value.problems[0])


def test_a_searched_layout_without_full_recompute_drops_it() -> None:
    """`budget search` writes the seed with the ranked layout in: where that layout does not
    recompute in full, the key would be refused, so it goes."""
    data = FSDP.read_bytes()
    layout = searched_layout(dp=8, zero=3)
    kept = yaml.safe_load(layout_yaml(FSDP, data, {**layout, "recompute": "full"}, 8, "s.json"))
    gone = yaml.safe_load(layout_yaml(FSDP, data, {**layout, "recompute": "none"}, 8, "s.json"))
    assert kept["recompute_early_stop"] is True
    assert "recompute_early_stop" not in gone


def test_mpt_30b_runs_stop_early_as_their_yaml_says() -> None:
    """llm-foundry's mpt-30b.yaml sets activation_checkpointing_reentrant: false; its rows
    (H100 and A100) stop before fc2, the rows without checkpointing have no recompute."""
    mpt = [run for run in (*RUNS, *DIAGNOSTIC_RUNS) if run.stack == "llm-foundry"]
    assert len(mpt) == 10
    for run in mpt:
        full = run.tree.get("recompute") == "full"
        assert run.tree.get("recompute_early_stop", False) is full, run.name
        assert full is ("30B" in run.name), run.name
    (row,) = [r for r in RUNS if r.name == "MPT 30B, 8 GPUs"]
    plan = plan_of(row)
    fc2 = next(w for w in _phase(plan, "forward.mlp").works if w.name == "MLP fc2")
    assert fc2.flops == 2 * 6144 * 28672 * 7168  # micro 3 × 2,048 tokens, ffn 4 × 7,168
    assert plan.recompute_early_stop
    assert "MLP fc2 (recomputed)" not in _names(plan, "backward.mlp")


def test_a_sweep_over_tp_stops_early_as_each_layouts_layers_do() -> None:
    """The shipped FSDP plan stops early; a sweep over tp 1 and 2 in Megatron-LM's style
    runs fc2 again at tp 2 alone (`step.early_stop`), so tp 1 and tp 2 are evaluated apart
    (`search.structure`), and each layout budgets as searched."""
    from budget.search import Space, apply, search

    plan = load_plan(FSDP)
    assert plan.recompute_early_stop and plan.parallel.tp_style == "megatron"
    space = Space(tp=(1, 2), pp=(1,), zero=(3,), recompute=("full",), micro=(1,), cp=(1,))
    outcome = search(plan, 8, space, keep=10)
    assert {r.config.tp for r in outcome.results} == {1, 2}
    for result in outcome.results:
        layout = apply(plan, result.config, 8)
        stops = "MLP fc2 (recomputed)" not in _names(layout, "backward.mlp")
        assert stops is (result.config.tp == 1)
        report = build_report(layout)
        assert report.step["time_s"] == pytest.approx(result.step_time_s, rel=1e-12)
        assert report.worst.peak_bytes == result.peak_bytes
