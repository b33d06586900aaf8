"""`budget diff`: plan keys that changed, budget deltas with better/worse, alignment of
different pipeline depths, and the three formats."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from budget.catalog.topologies import RAMPS
from budget.cli import app, route
from budget.diff import Delta, diff_files, flatten, plan_changes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.render import NBSP
from budget.render.diff import headline
from budget.units import format_bytes
from tests.gpt3_by_hand import (
    REQUIRED,
    SEQ,
    H,
    fc1_peak,
    stage0_activations,
    stage0_states,
    stage0_transients,
)
from tests.plan_files import (
    GPT3,
    PLANS,
    ROOT,
    gpt13_written,
    invalid,
    tp4,
    untimed_plan,
    variant,
)

runner = CliRunner()
LLAMA = ROOT / "plans" / "llama3-70b.yaml"


def _diff(*args: str | Path, width: int = 100) -> tuple[int, str, str]:
    result = runner.invoke(app, route(["diff", *map(str, args)]), env={"COLUMNS": str(width)})
    # a crash exits 1 with its traceback kept in result.exception, not in the output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_a_plan_against_itself_shows_no_differences(plan: Path) -> None:
    code, out, _ = _diff(plan, plan)
    assert code == 0
    assert "No differences" in out
    assert "Δ" not in out
    *_, diff = diff_files(plan, plan)
    assert diff.identical and diff.changes == ()


def _attention_sent(tp: int, dp: int) -> int:
    """Sequence parallelism's all-gather and reduce-scatter of the s × h bf16 activations
    around attention, (tp − 1)/tp of each sent per rank, in 12 layers, for each of the
    1536 / dp micro-batches of one sequence."""
    return 2 * (tp - 1) * (2 * SEQ * H) // tp * 12 * (1536 // dp)


# GPT-3's tokens in one step: 1536 sequences of 2048
STEP_TOKENS = 1536 * SEQ


def _row(a: int, b: int) -> str:
    """A bytes row as the uncoloured table prints it: more is worse (✗)."""
    gib = 2**30
    sign = "+" if b > a else "−"
    change = f"{sign}{abs(b - a) / gib:.1f} GiB {sign}{abs(b / a - 1):.1%}"
    return f"{a / gib:.1f} GiB {b / gib:.1f} GiB {change} {'✗' if b > a else '✓'}"


def test_tp8_vs_tp4_table(tmp_path: Path) -> None:
    code, out, err = _diff(GPT3, tp4(tmp_path), width=100)
    assert code == 0 and err == ""
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "parallel.tp 8 → 4" in lines
    assert "parallel.dp 16 → 32" in lines
    assert "Memory per rank of each pipeline stage, at its peak" in lines
    states = _row(stage0_states(8, 16), stage0_states(4, 32))
    assert states == "17.7 GiB 33.4 GiB +15.6 GiB +88.0% ✗"
    assert f"0 states {states}" in lines
    sent = _row(_attention_sent(8, 16), _attention_sent(4, 32))
    # dp 16 → 32 halves each rank's micro-batches, 1536 / (16 × 1) → 1536 / (32 × 1), so
    # each phase runs half as often: 12 layers a stage × 96 → 48 micro-batches; the row says
    # so, headed "count" as in the report's phase table (not "calls", the collectives' word)
    # first, the figures it explains after it (a user audit)
    at = lines.index("forward.attention count 1,152 576 −576 −50.0%")
    assert lines[at + 1] == f"sent/rank {sent}"
    assert "No differences" not in out
    # stage 0's activations about double (every term is over tp; tp 8 peaks at the fc1
    # backward, whose two spent inputs it no longer holds, tp 4 at the fc2 one); shown to
    # three figures
    gib, act_a, act_b = 2**30, stage0_activations(8), stage0_activations(4)
    assert (fc1_peak(8), fc1_peak(4)) == (True, False)
    assert act_b == 2 * (act_a + 2 * 2 * SEQ * 4 * H // 8)
    activations = f"{act_a / gib:.2f} GiB {act_b / gib:.1f} GiB +{(act_b - act_a) / gib:.2f} GiB"
    # (818 − 1/4)·sh against (407 − 1/8)·sh, each less its layer's spent MLP dropout mask
    assert act_b / act_a - 1 == 6542 / 3255 - 1  # +101.0 %
    assert f"activations {activations} +{act_b / act_a - 1:.1%} ✗" in lines
    # the step and tokens/s rows and the headline, from each plan's own step time: tokens/s
    # is the step's 1536 × 2048 tokens over it
    a, b, _ = diff_files(GPT3, tmp_path / "tp4.yaml")
    ta, tb = a.step["time_s"], b.step["time_s"]
    assert tb < ta  # tp 4 is faster
    faster = (ta - tb) / ta
    assert f"step time {ta:.1f} s {tb:.1f} s −{(ta - tb) * 1e3:.0f} ms −{faster:.1%} ✓" in lines
    tokens_a, tokens_b = STEP_TOKENS / ta, STEP_TOKENS / tb
    assert (
        f"tokens/s {tokens_a:,.0f} {tokens_b:,.0f} +{tokens_b - tokens_a:,.0f} "
        f"+{tokens_b / tokens_a - 1:.1%} ✓"
    ) in lines
    text = " ".join(out.split())  # undo the wrapping (and the no-break spaces)
    assert f"step time −{faster:.1%} ({ta:.1f} s → {tb:.1f} s); both fit." in text


def test_tp8_vs_tp4_json_deltas(tmp_path: Path) -> None:
    code, out, _ = _diff(GPT3, tp4(tmp_path), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"schema_version", "a", "b", "delta"}
    delta = data["delta"]
    assert delta["identical"] is False
    assert [c["key"] for c in delta["plan"]] == ["parallel.tp", "parallel.dp"]
    assert len(delta["stages"]) == 8
    states = delta["stages"][0]["metrics"]["states_bytes"]
    a = data["a"]["memory"]["stages"][0]
    assert states["a"] == a["params_bytes"] + a["grads_bytes"] + a["optimizer_bytes"]
    assert (states["a"], states["b"]) == (stage0_states(8, 16), stage0_states(4, 32))
    assert states["delta"] == states["b"] - states["a"] and isinstance(states["delta"], int)
    assert states["verdict"] == "worse"
    sent = {p["name"]: p["metrics"]["payload_bytes"] for p in delta["phases"]}
    assert sent["forward.attention"]["a"] == _attention_sent(8, 16)
    assert sent["forward.attention"]["b"] == _attention_sent(4, 32)
    compute = {p["name"]: p["metrics"]["compute_s"] for p in delta["phases"]}
    for phase in data["a"]["phases"]:  # each phase's compute, as each report gives it
        assert compute[phase["name"]]["a"] == phase["compute_s"]
    exposed = {p["name"]: p["metrics"]["exposed_s"] for p in delta["phases"]}
    assert exposed["forward.attention"]["verdict"] == "better"
    assert delta["summary"]["mfu"]["better"] == "higher"
    # stage 0's rows are stage 0's of each report (two rows could swap unseen), by hand
    activations = delta["stages"][0]["metrics"]["activations_bytes"]
    transients = delta["stages"][0]["metrics"]["transient_bytes"]
    b = data["b"]["memory"]["stages"][0]
    assert (activations["a"], activations["b"]) == (a["activations_bytes"], b["activations_bytes"])
    assert (transients["a"], transients["b"]) == (a["transient_bytes"], b["transient_bytes"])
    assert (activations["a"], activations["b"]) == (stage0_activations(8), stage0_activations(4))
    assert (transients["a"], transients["b"]) == (stage0_transients(8), stage0_transients(4))
    # 1/t, less two spent inputs at tp 8 and the spent mask: 817.75·sh against 406.875·sh
    by_hand = (stage0_activations(4) - stage0_activations(8)) / stage0_activations(8)
    assert abs(activations["relative"] - by_hand) < 1e-12
    # every step figure is A's report's beside B's (swapping them had passed every test)
    summary, step_a, step_b = delta["summary"], data["a"]["step"], data["b"]["step"]
    figures = (
        "time_s", "compute_s", "comm_s", "exposed_comm_s", "exposed_share",
        "overlap_slowdown_s", "bubble_s", "tokens_per_s", "mfu",
    )  # fmt: skip
    assert set(figures) <= set(summary)
    for name in figures:
        figure = summary[name]
        assert (figure["a"], figure["b"]) == (step_a[name], step_b[name]), name
        assert figure["delta"] == figure["b"] - figure["a"], name
        assert figure["relative"] == (figure["b"] - figure["a"]) / abs(figure["a"]), name
    for name, side in (("peak_bytes", "peak_bytes"), ("headroom_bytes", "headroom_bytes")):
        assert summary[name]["a"] == data["a"]["memory"][side]
        assert summary[name]["b"] == data["b"]["memory"][side]
    # tokens/s is the step's 1536 × 2048 tokens over its time; tp 4's step is shorter, so
    # both are better, and tokens/s (and MFU, the same FLOPs in less time) rise by the
    # ratio of the step times
    ta, tb = step_a["time_s"], step_b["time_s"]
    assert step_a["tokens_per_s"] == pytest.approx(STEP_TOKENS / ta, rel=1e-12)
    assert step_b["tokens_per_s"] == pytest.approx(STEP_TOKENS / tb, rel=1e-12)
    assert tb < ta and summary["time_s"]["verdict"] == "better"
    assert summary["tokens_per_s"]["verdict"] == summary["mfu"]["verdict"] == "better"
    assert summary["tokens_per_s"]["relative"] == pytest.approx(ta / tb - 1, rel=1e-9)
    assert summary["mfu"]["relative"] == pytest.approx(ta / tb - 1, rel=1e-9)
    # every phase's every figure is that phase's own row in each report
    rows = {p["name"]: p["metrics"] for p in delta["phases"]}
    for side in ("a", "b"):
        phases = data[side]["phases"]
        assert {p["name"] for p in phases} == set(rows)
        for phase in phases:
            metrics = rows[phase["name"]]
            peak = phase["peak_bytes"] if phase["peak_stage"] is not None else None
            assert metrics["peak_bytes"][side] == peak, phase["name"]
            for name in ("payload_bytes", "compute_s", "comm_s", "exposed_s"):
                assert metrics[name][side] == phase[name], (phase["name"], name)


def test_tp8_vs_tp4_markdown_is_a_table(tmp_path: Path) -> None:
    code, out, _ = _diff(GPT3, tp4(tmp_path), "--format", "markdown")
    assert code == 0
    lines = out.splitlines()
    assert "| `parallel.tp` | 8 | 4 |" in lines
    assert "| stage | figure | A | B | Δ | Δ% |" in lines
    assert "| --- | --- | ---: | ---: | ---: | ---: |" in lines
    a, b = stage0_states(8, 16) / 2**30, stage0_states(4, 32) / 2**30
    assert (
        f"| 0 | states | {a:.1f} GiB | {b:.1f} GiB | 🔴 ✗ +{b - a:.1f} GiB | +{b / a - 1:.1%} |"
        in lines
    )
    at = lines.index("| `forward.attention` | count | 1,152 | 576 | −576 | −50.0% |")
    # the sign beside the colour, as in the terminal (an audit: colour alone in markdown)
    assert lines[at + 1].startswith("|  | sent/rank |") and "🟢 ✓" in lines[at + 1]
    # which way is better, as under the table (a markdown audit, m517)
    assert lines[-1] == (
        "Δ = B − A; 🟢 ✓ better, 🔴 ✗ worse (less memory and time, more headroom, tokens/s "
        "and MFU are better)."
    )


def test_a_phase_on_one_side_is_named_as_code_and_its_side_after_it(tmp_path: Path) -> None:
    """GPT-3 on 8 stages against 1 stage of 128-way data parallelism: the pipeline's sends
    exist in A alone. The phase's name is code and "(A only)" is not part of it (an audit:
    "`pipeline.forward (A only)`" read as a phase of that name)."""
    text = GPT3.read_text(encoding="utf-8")
    one = tmp_path / "one-stage.yaml"
    one.write_text(text.replace("pp: 8", "pp: 1").replace("dp: 16", "dp: 128"), "utf-8")
    code, out, _ = _diff(GPT3, one, "--format", "markdown")
    assert code == 0
    assert "| `pipeline.forward` (A only) | count | 96 | – | – | – |" in out.splitlines()
    assert "(A only)`" not in out


def test_different_stage_counts_pair_the_first_and_the_last_stages() -> None:
    """GPT-3 on 8 stages against Llama 3 70B on 4: stage 1 of one holds other layers than
    stage 1 of the other, so only the first stages and the last are paired."""
    code, out, _ = _diff(GPT3, LLAMA, "--format", "markdown")
    assert code == 0
    assert "A has 8 pipeline stages and B has 4, so their stages hold different layers" in out
    # each pair opens with the layers its stages hold: 96 / 8 against 80 / 4
    assert "| first (0) | layers | 12 | 20 | +8 | +66.7% |" in out
    assert "| last (A 7, B 3) | layers | 12 | 20 | +8 | +66.7% |" in out
    assert "(A only)" not in out.split("### Phases")[0]
    data = json.loads(_diff(GPT3, LLAMA, "--format", "json")[1])
    first, last = data["delta"]["stages"]
    assert (first["stage"], first["a_stage"], first["b_stage"]) == ("first", 0, 0)
    assert (last["stage"], last["a_stage"], last["b_stage"]) == ("last", 7, 3)
    peak = last["metrics"]["peak_bytes"]
    assert (peak["a"], peak["b"]) == (
        data["a"]["memory"]["stages"][7]["peak_bytes"],
        data["b"]["memory"]["stages"][3]["peak_bytes"],
    )
    same = json.loads(_diff(GPT3, GPT3, "--format", "json")[1])["delta"]["stages"]
    assert [(s["stage"], s["a_stage"], s["b_stage"]) for s in same] == [(i, i, i) for i in range(8)]


def test_without_colour_the_table_marks_better_and_worse() -> None:
    """Piped into a CI log the colours are gone, so each delta carries ✓ or ✗."""
    code, out, _ = _diff(GPT3, LLAMA)
    assert code == 0 and "\x1b[" not in out
    assert "Δ = B − A; ✓ is better, ✗ is worse" in out
    # GPT-3's step runs other tokens than Llama's (1536 × 2048, 512 × 8192) on twice the
    # GPUs (1,024 and 512), so its time and whole throughput carry no mark and its
    # throughput per GPU does
    rows = {line.split("  ")[0].strip(): line.rstrip() for line in out.splitlines()}
    assert rows["tokens/s per GPU"].endswith(("✓", "✗"))
    assert not rows["tokens/s"].endswith(("✓", "✗"))


def test_invalid_plans_exit_2_with_every_problem(tmp_path: Path) -> None:
    bad = invalid(tmp_path)
    code, out, err = _diff(bad, bad)
    assert code == 2 and out == ""
    assert err.count(f"{bad}:3:1: error: $.modle") == 1  # one file given twice: said once
    # every problem of the file at once: the sections it lacks, in one line, and its
    # misspelt key, which says the model is missing (a user audit, m413: said twice)
    lacking = [repr(key) for key in REQUIRED if key != "model"]
    every = [
        f"{bad}:1:1: error: $: {', '.join(lacking[:-1])} and {lacking[-1]} are required properties",
        f"{bad}:3:1: error: $.modle: unknown key 'modle' (did you mean 'model'?)",
    ]
    assert err.splitlines() == every
    code, out, err = _diff(bad, bad, "--format", "json")
    assert (code, out) == (2, "")  # no partial document
    assert err.splitlines() == every


# the sections a training plan must have (`invalid` writes none of them)
def test_flatten_names_keys_by_path() -> None:
    flat = flatten(load_plan(GPT3))
    assert "file" not in flat
    assert flat["parallel.tp"] == 8
    assert flat["parallel.order"] == ["tp", "cp", "ep", "dp", "pp"]
    assert flat["device.flops.bf16"] == pytest.approx(312e12)
    assert flat["topology.levels.0.name"] == "nvlink"
    assert not [k for k in flat if k.startswith("transitions")]  # none written, no keys


def test_transitions_are_keyed_as_the_plan_file_spells_them() -> None:
    """`from`, `to` and `tensor.shape`, not the resolved fields' src, dst and shape."""
    flat = flatten(load_plan(ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"))
    keys = {k.removeprefix("transitions.0.") for k in flat if k.startswith("transitions.0.")}
    assert keys == {
        "name", "phase", "tensor.shape", "tensor.dtype", "group", "from", "to",
        "source_alive", "count",
    }  # fmt: skip
    assert (flat["transitions.0.from"], flat["transitions.0.to"]) == ("shard(1)", "replicate")
    assert flat["transitions.0.tensor.shape"] == [8192, 128256]


@pytest.mark.parametrize(
    ("better", "a", "b", "verdict"),
    [
        ("lower", 10, 8, "better"),
        ("lower", 10, 12, "worse"),
        ("higher", 0.5, 0.6, "better"),
        ("higher", 0.5, 0.4, "worse"),
        ("lower", 3, 3, "same"),
        ("lower", None, 3, "n/a"),
        ("neither", 3, 4, "n/a"),  # a phase's calls: they explain, they are not judged
        ("neither", 3, 3, "same"),
    ],
)
def test_delta_verdicts(better: str, a: float | None, b: float | None, verdict: str) -> None:
    delta = Delta("x", "bytes", better, a, b)  # type: ignore[arg-type]
    assert delta.verdict == verdict


def test_relative_delta_is_none_from_zero() -> None:
    assert Delta("x", "bytes", "lower", 0, 5).relative is None
    assert Delta("x", "bytes", "lower", 4, 5).relative == pytest.approx(0.25)


def test_values_with_brackets_and_lists_print_as_written(tmp_path: Path) -> None:
    """The table prints plan values as text: a rank order ([tp, cp, ep, pp, dp]) and a name
    with brackets were swallowed as console markup; integers in a list keep no separators
    ([8192], not [8,192])."""
    b = tmp_path / "b.yaml"
    text = LLAMA.read_text(encoding="utf-8").replace("name: llama3-70b", "name: llama3 [tp8] run")
    b.write_text(text, encoding="utf-8")
    code, out, _ = _diff(LLAMA, ROOT / "plans" / "llama3-405b-128k.yaml", width=140)
    assert code == 0
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "parallel.order [tp, cp, ep, dp, pp] → [tp, cp, ep, pp, dp]" in lines
    assert any(
        line.startswith("parallel.pipeline.layers_per_stage – → [7, 8, 8,") for line in lines
    )
    code, out, _ = _diff(LLAMA, b, width=140)
    assert code == 0
    assert "name llama3-70b → llama3 [tp8] run" in [" ".join(x.split()) for x in out.splitlines()]


def test_a_preset_against_a_written_device_shows_one_line_per_calibration(
    tmp_path: Path,
) -> None:
    """A measured GEMM curve, attention rates and bandwidth ramp are one row each, not
    dozens of sample points."""
    shipped = ROOT / "plans" / "gpt-1.3b.yaml"
    a = tmp_path / "written.yaml"
    a.write_text(gpt13_written(), encoding="utf-8")
    code, out, _ = _diff(a, shipped, width=160)
    assert code == 0
    lines = [" ".join(line.split()) for line in out.splitlines()]
    # Azure's 256.5 of 312 TFLOP/s; half of it at the A100 ramp (2·1024³ · (213.5 / 110.4 − 1)
    # / 213.5e12 s) times 256.5 TFLOP/s
    half = 2 * 1024**3 * (213.5 / 110.4 - 1) / 213.5e12 * 256.5e12
    assert (
        f"device.gemm – → {256.5 / 312:.1%} of peak, half of it at {half / 1e9:.4g} GFLOP" in lines
    )
    ramp = f"topology.levels.0.ramp – → by message size: {RAMPS['nvlink3'].source}"
    assert ramp in " ".join(lines)
    assert "device.kernel_startup 0 s → 3.31 µs" in lines
    assert not [line for line in lines if ".points." in line or "attention.0" in line]


def test_plans_of_different_modes_are_flagged() -> None:
    """A training plan against a serving plan: the step, tokens/s and MFU differ in kind."""
    code, out, _ = _diff(LLAMA, ROOT / "plans" / "llama3-70b-decode.yaml", width=200)
    assert code == 0
    assert "A is a train plan and B a decode plan" in " ".join(out.split())
    *_, same = diff_files(LLAMA, LLAMA)
    assert same.note is None
    # each side shows only what its mode reads, spelled as its file spells it: the decode
    # plan has sequences, no seq or micro-batch, no ZeRO; the training plan has no prompt
    *_, modes = diff_files(LLAMA, ROOT / "plans" / "llama3-70b-decode.yaml")
    changes = {c.key: (c.a, c.b) for c in modes.changes}
    assert changes["batch.seq"] == (8192, None)
    assert changes["batch.sequences"] == (None, 32)
    assert changes["batch.prompt"] == (None, 2048)
    assert changes["parallel.zero"] == (1, None)
    assert "batch.global" in changes and changes["batch.global"][1] is None
    # ... and neither side of a step figure is graded better or worse, as the note says;
    # memory is memory in either mode
    verdicts = {d.metric: d.verdict for d in modes.summary}
    assert verdicts["peak_bytes"] == "better"
    for name in ("time_s", "tokens_per_s", "mfu", "exposed_share"):
        assert verdicts[name] == "n/a", name
    assert {d.metric: d.verdict for d in same.summary}["time_s"] == "same"


def test_a_ramp_changed_for_another_is_a_plan_change(tmp_path: Path) -> None:
    """Calibrations are shown as one line but compared whole: NVLink 4's ramp swapped for
    NVLink 3's is a change, though both are nccl-tests sweeps."""
    plan = ROOT / "plans" / "llama3-405b-128k.yaml"
    b = tmp_path / "nvlink3.yaml"
    b.write_text(
        plan.read_text(encoding="utf-8").replace("ramp: nvlink4}", "ramp: nvlink3}"),
        encoding="utf-8",
    )
    *_, diff = diff_files(plan, b)
    assert [c.key for c in diff.changes] == ["topology.levels.0.ramp"]
    (change,) = diff.changes
    assert change.a == f"by message size: {RAMPS['nvlink4'].source}"
    assert change.b == f"by message size: {RAMPS['nvlink3'].source}"


def test_at_80_columns_long_phase_names_wrap_and_no_number_is_cut(tmp_path: Path) -> None:
    """A name such as "pipeline.forward (B only)" widened the first column until the
    numbers were cut to "16.7 G…" and "−100.…"; the name now wraps instead."""
    gemma = ROOT / "plans" / "gemma2-9b.yaml"
    b = variant(
        tmp_path,
        "pp2.yaml",
        ("  tp: 4\n", "  tp: 4\n  pp: 2\n"),
        ("  dp: 16", "  dp: 8"),
        base=gemma,
    )
    code, out, _ = _diff(gemma, b, width=80)
    assert code == 0
    assert "pipeline.forward (B" in out
    assert "…" not in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_serving_plans_compare_time_to_first_token_and_time_per_token(tmp_path):
    """The two figures a serving plan is judged by were missing from the diff (only the
    whole run's time, tokens/s and MFU)."""
    from budget.diff import diff_plans

    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    text = decode.read_text(encoding="utf-8").replace("sequences: 32", "sequences: 8", 1)
    other = tmp_path / "fewer.yaml"
    other.write_text(text, encoding="utf-8")
    a, b, diff = diff_plans(load_plan(decode), load_plan(other))
    summary = {d.metric: (d.a, d.b) for d in diff.summary}
    assert summary["ttft_s"] == (a.step["ttft_s"], b.step["ttft_s"])
    assert summary["decode_token_s"] == (a.step["decode_token_s"], b.step["decode_token_s"])
    assert summary["ttft_s"][1] < summary["ttft_s"][0]
    training = load_plan(ROOT / "plans" / "gpt-1.3b.yaml")
    assert "ttft_s" not in {d.metric for d in diff_plans(training, training)[2].summary}
    # a serving pipeline carries one batch stage after stage: no bubble to compare, which
    # read "pipeline bubble 0 s 0 s" beside a pipeline that cost 15 % of tokens/s (an audit,
    # m546); nor a reduction after it
    piped = tmp_path / "piped.yaml"
    piped.write_text(
        decode.read_text(encoding="utf-8").replace("  tp: 8\n  pp: 1\n", "  tp: 4\n  pp: 2\n"),
        encoding="utf-8",
    )
    assert load_plan(piped).parallel.pp == 2
    metrics = {d.metric for d in diff_plans(load_plan(decode), load_plan(piped))[2].summary}
    assert not {"bubble_s", "after_s"} & metrics
    assert {"bubble_s", "after_s"} <= {d.metric for d in diff_plans(training, training)[2].summary}


def test_a_negative_figure_takes_the_minus_sign_the_deltas_take() -> None:
    """A plan that does not fit has a negative headroom: '-187 GiB' (hyphen) sat beside a
    Δ of '−239 GiB' (U+2212) in one row (review)."""
    from budget.diff import Delta
    from budget.render.diff import _change, _value

    assert _value("bytes", -187 * 2**30) == "−187 GiB"
    assert _change(Delta("headroom_bytes", "bytes", "higher", 52 * 2**30, -187 * 2**30))[0] == (
        "−239 GiB"
    )


def test_a_rate_under_ten_tokens_a_second_keeps_three_figures() -> None:
    """A decode plan at one sequence on 128 GPUs makes 0.494 tokens/s a GPU, which the diff
    printed "0" beside a Δ of "−1" (an audit, m425), where the report writes 0.494."""
    from budget.diff import Delta
    from budget.render.diff import _change, _value

    assert _value("tokens/s", 0.49359) == "0.494"
    assert _value("tokens/s", 63.18) == "63"
    assert _change(Delta("tokens/s", "tokens/s", "higher", 0.99439, 0.49359))[0] == "−0.501"
    assert _change(Delta("tokens/s", "tokens/s", "higher", 63.641, 63.180))[0] == "−0.461"


def test_both_plans_broken_past_loading_are_both_reported(tmp_path: Path) -> None:
    """Two plans whose transitions break a rule each: both problems at once (only A's was
    shown, B's after fixing A; review)."""
    invalid = ROOT / "tests" / "invalid"
    code, out, err = _diff(
        invalid / "transition-unknown-phase.yaml", invalid / "transition-left-partial.yaml"
    )
    assert code == 2 and out == ""
    assert "unknown phase 'nowhere'" in err and "is left sum-partial on dp" in err


def test_one_broken_plan_given_twice_says_each_problem_once() -> None:
    """`budget diff bad.yaml bad.yaml` printed each of the file's errors twice (an audit)."""
    bad = ROOT / "tests" / "invalid" / "transition-unknown-phase.yaml"
    code, out, err = _diff(bad, bad)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and lines
    assert len(lines) == len(set(lines))


def test_a_named_collective_algorithm_is_one_plan_change(tmp_path: Path) -> None:
    """`collectives: {all-reduce: recursive}` reads as one change of that op's algorithm
    (it read 'collectives [] → –' and 'collectives.0 – → [all-reduce, recursive]'), from
    "default" (it read "–", which did not say what ran: a review)."""
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    named = tmp_path / "named.yaml"
    named.write_text(
        decode.read_text(encoding="utf-8") + "collectives: {all-reduce: recursive}\n",
        encoding="utf-8",
    )
    *_, diff = diff_files(decode, named)
    assert [(c.key, c.a, c.b) for c in diff.changes] == [
        ("collectives.all-reduce", "default", "recursive")
    ]


def test_a_position_table_left_to_its_default_is_the_rows_it_resolves_to(tmp_path: Path) -> None:
    """model.max_positions left out means batch.seq rows: gpt-1.3b's written 2,048 against
    the same plan without it is no change (it read "2,048 → 0"); against a rope model the
    table is gone, shown as no value."""
    bare = variant(
        tmp_path,
        "bare.yaml",
        ("  max_positions: 2048\n", ""),
        base=ROOT / "plans" / "gpt-1.3b.yaml",
    )
    *_, same = diff_files(ROOT / "plans" / "gpt-1.3b.yaml", bare)
    assert [c.key for c in same.changes] == []
    *_, rope = diff_files(ROOT / "plans" / "gpt-1.3b.yaml", ROOT / "plans" / "llama3-70b.yaml")
    (rows,) = [c for c in rope.changes if c.key == "model.max_positions"]
    assert (rows.a, rows.b) == (2048, None)


def test_a_share_that_moves_under_a_twentieth_of_a_point_keeps_a_digit() -> None:
    """A share up 0.003 points read "+0.0 pt" beside a worse mark; it keeps one
    significant digit below 0.05 points, and a tenth of a point above."""
    from budget.render.diff import _change

    tiny = Delta("exposed share", "share", "lower", 0.006, 0.00603)
    assert _change(tiny)[0] == "+0.003 pt" and tiny.verdict == "worse"
    assert _change(Delta("exposed share", "share", "lower", 0.006, 0.008))[0] == "+0.2 pt"


def test_the_phase_rows_say_what_they_cover(tmp_path: Path) -> None:
    """Two decode plans' phase rows are each plan's whole batch, which the title called
    "one step"; a training plan beside a serving one covers a run of each (review). And
    what a row is of each plan, as the report's own title says (an audit): a decode plan
    over a pipeline sums its calls and times over the stages a pass crosses, where one
    without gives its one stage's, and the title had said neither."""
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    tp4_decode = variant(tmp_path, "tp4", ("  tp: 8\n  pp: 1", "  tp: 4\n  pp: 2"), base=decode)
    _, out, _ = _diff(decode, tp4_decode, width=120)
    title = " ".join(out.split("\nPhases ")[1].split("\n\n")[0].split())
    assert title == (
        "of the batch: its prefill and 511 decode passes (per rank; A on the stage where "
        "each costs most; B times summed over the stages a pass crosses, payloads of the "
        "costliest)"
    )
    tp2_decode = variant(tmp_path, "tp2", ("  tp: 8\n  pp: 1", "  tp: 2\n  pp: 4"), base=decode)
    _, out, _ = _diff(tp4_decode, tp2_decode, width=120)
    summed = "(per rank; times summed over the stages a pass crosses, payloads of the costliest)"
    assert summed in " ".join(out.split())
    _, out, _ = _diff(GPT3, decode, width=120)
    flat = " ".join(out.split())
    assert "Phases of a run of each plan (per rank, on the stage where each costs most)" in flat
    _, out, _ = _diff(GPT3, tp4(tmp_path), width=120)
    flat = " ".join(out.split())
    assert "Phases of one step (per rank, on the stage where each costs most)" in flat


def test_the_fsdp_version_is_a_change_only_where_a_plan_shards_with_zero_3() -> None:
    """`parallel.fsdp` defaults to 2 in every training plan, but prices only ZeRO 3: listed
    as a change from a Megatron plan to a serving one, it was noise (UX audit)."""
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    keys = [c.key for c in diff_files(LLAMA, decode)[2].changes]
    assert "parallel.fsdp" not in keys and "parallel.zero" in keys
    fsdp = ROOT / "plans" / "llama3-8b-fsdp.yaml"
    changes = {c.key: (c.a, c.b) for c in diff_files(fsdp, LLAMA)[2].changes}
    assert changes["parallel.fsdp"] == (2, None)


def test_an_h100_against_an_a100_names_the_inner_dimension_factor(tmp_path: Path) -> None:
    """The H100's curve has K₀ = 125 (its GEMM loop at half rate at K = 125); the A100's has
    none, so only the H100 side says it, in words a reader can take without the docs."""
    a100 = variant(tmp_path, "a100.yaml", ("preset: h100-sxm", "preset: a100-80gb"), base=LLAMA)
    code, out, _ = _diff(LLAMA, a100, width=200)
    assert code == 0
    (row,) = [" ".join(line.split()) for line in out.splitlines() if "device.gemm" in line]
    h100, a100_side = row.split(" → ")
    assert "its loop at half rate at K = 125" in h100
    assert "half rate" not in a100_side


def test_an_expert_tp_that_follows_tp_is_listed_when_tp_moves(tmp_path) -> None:
    """etp left out follows tp, so a tp change moves the expert layers' split too; the diff
    said only tp changed (an audit). A dense model has no etp to list."""
    moe = ROOT / "plans" / "deepseek-moe-16b.yaml"
    text = moe.read_text(encoding="utf-8")
    assert "etp" not in text
    edits = (("  tp: 1\n", "  tp: 2\n"), ("  dp: 16", "  dp: 8\n  sequence_parallel: true"))
    b = variant(tmp_path, "tp2.yaml", *edits, base=moe)
    changes = {c.key: (c.a, c.b) for c in plan_changes(load_plan(moe), load_plan(b))}
    assert changes["parallel.etp"] == (1, 2)
    dense = plan_changes(load_plan(GPT3), load_plan(tp4(tmp_path)))
    assert "parallel.etp" not in {c.key for c in dense}


def test_a_change_of_a_hundredth_of_a_percent_or_less_is_no_verdict() -> None:
    """+520 KiB of a 30 GiB peak or +363 ns of a 19 s step was flagged worse at "+0.0%"
    (a user audit): under 0.01 % of A's figure the verdict is "same", and the figures
    still show the change."""
    peak = Delta("peak", "bytes", "lower", 30 * 2**30, 30 * 2**30 + 520 * 2**10)
    assert (peak.verdict, peak.absolute) == ("same", 520 * 2**10)
    step = Delta("step", "seconds", "lower", 19.1, 19.1 + 363e-9)
    assert step.verdict == "same"
    assert Delta("step", "seconds", "lower", 19.1, 19.11).verdict == "worse"
    assert Delta("tokens", "count", "higher", 0, 1).verdict == "better"  # no ratio to A


def test_a_whole_transition_added_is_one_row(tmp_path: Path) -> None:
    """Three hand-written transitions added took 27 rows, one per key (a user audit): a
    transition one side lacks reads as one row, as the plan would write it; a transition
    whose keys change on both sides keeps its rows."""
    from budget.diff import plan_changes
    from budget.render.diff import shown_changes

    gathered = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    text = gathered.read_text(encoding="utf-8")
    bare = tmp_path / "bare.yaml"
    bare.write_text(text[: text.index("\ntransitions:") + 1], encoding="utf-8")
    rows = shown_changes(plan_changes(load_plan(bare), load_plan(gathered)))
    assert [key for key, _, _ in rows] == [
        "transitions[logits all-gathered (loss parallel off)]",
        "transitions[logits upcast to fp32]",
        "transitions[log-softmax (fp32) kept for the backward]",
    ]
    assert rows[0][1:] == (
        "–",
        "tp from shard(1) to replicate, [8192, 128256] bf16, in loss, source_alive false, count 1",
    )  # every key the transition has (a review), its name the key
    back = shown_changes(plan_changes(load_plan(gathered), load_plan(bare)))
    assert back[0][1:] == (rows[0][2], "–")
    renamed = variant(
        tmp_path,
        "renamed.yaml",
        ("name: logits upcast to fp32", "name: logits in fp32"),
        base=gathered,
    )
    (row,) = shown_changes(plan_changes(load_plan(gathered), load_plan(renamed)))
    assert row == (
        "transitions[logits upcast to fp32].name",
        "logits upcast to fp32",
        "logits in fp32",
    )
    markdown = runner.invoke(app, route(["diff", str(bare), str(gathered), "-f", "markdown"]))
    assert (
        "| `transitions[logits all-gathered (loss parallel off)]` | – | tp from shard(1)"
        in markdown.stdout
    )


def test_the_gathered_loss_plan_states_what_its_transitions_add(tmp_path: Path) -> None:
    """The plan's header gives the peak and step its transitions add against the same plan
    without them; two audits found its peaks 0.5 GiB stale (23.0 and 32.8 GiB, the engine's
    22.5 and 32.3), so the figures are read from the header and checked here."""
    import re

    gathered = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    text = gathered.read_text(encoding="utf-8")
    bare = tmp_path / "bare.yaml"
    bare.write_text(text[: text.index("\ntransitions:") + 1], encoding="utf-8")
    header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    found = re.search(
        r"the peak rises ([\d.]+) GiB, from ([\d.]+) to ([\d.]+) GiB, and the step (\d+) ms",
        header,
    )
    assert found, "the header no longer states what the transitions add"
    rise, low, high, ms = (float(x) for x in found.groups())
    a, b = (build_report(load_plan(p)) for p in (bare, gathered))
    peak_a, peak_b = (max(s.peak_bytes for s in r.stages) / 2**30 for r in (a, b))
    assert (round(peak_a, 1), round(peak_b, 1)) == (low, high)
    assert round(peak_b - peak_a, 1) == rise
    assert round((b.step["time_s"] - a.step["time_s"]) * 1e3) == ms


def test_transitions_pair_as_a_line_diff_pairs_lines(tmp_path: Path) -> None:
    """Deleting the middle one of three transitions is one removal; paired by index it read
    as the last two rewritten and one removed (a user audit). The others pair by name, a
    run rewritten in place by position, and one side's runs take their own slots."""
    from budget.diff import transition_slots
    from budget.render.diff import shown_changes

    gathered = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    middle = variant(
        tmp_path,
        "middle.yaml",
        (
            """  - name: logits upcast to fp32
    phase: loss
    tensor: {shape: [micro * seq, vocab], dtype: fp32}
    group: tp
    from: replicate
    to: replicate
    source_alive: false
""",
            "",
        ),
        base=gathered,
    )
    a, b = load_plan(gathered), load_plan(middle)
    assert transition_slots(a, b) == ([0, 1, 2], [0, 2])
    (row,) = shown_changes(plan_changes(a, b))
    assert row[0] == "transitions[logits upcast to fp32]" and row[2] == "–"
    assert row[1].startswith("tp from replicate to replicate")
    assert transition_slots(b, a) == ([0, 2], [0, 1, 2])

    def named(*names: str) -> Any:
        return SimpleNamespace(transitions=[SimpleNamespace(name=n) for n in names])

    # the first replaced by two new ones and the third changed: rows in the merged order, each
    # under its name (keys by slot number matched neither file: a review)
    first = """  - name: logits all-gathered (loss parallel off)
    phase: loss
    tensor: {shape: [micro * seq, vocab], dtype: bf16}
    group: tp
    from: shard(1)
    to: replicate
    source_alive: false
"""
    two = first.replace("logits all-gathered (loss parallel off)", "p") + first.replace(
        "logits all-gathered (loss parallel off)", "q"
    )
    two = two.replace("source_alive: false", "source_alive: true")
    both = variant(
        tmp_path,
        "both.yaml",
        (first, two),
        ("source_alive: false\n", "source_alive: true\n"),
        base=middle,
    )
    keys = [key for key, _, _ in shown_changes(plan_changes(b, load_plan(both)))]
    assert keys == [
        "transitions[logits all-gathered (loss parallel off)]",
        "transitions[p]",
        "transitions[q]",
        "transitions[log-softmax (fp32) kept for the backward].source_alive",
    ]

    # x kept, y removed, z kept, w added: the merged list x y z w
    assert transition_slots(named("x", "y", "z"), named("x", "z", "w")) == ([0, 1, 2], [0, 2, 3])
    # two renamed in place pair by position; a run of two replaced by one does not
    assert transition_slots(named("x", "y", "z"), named("x", "p", "q")) == ([0, 1, 2], [0, 1, 2])
    assert transition_slots(named("x", "y", "z"), named("x", "p")) == ([0, 1, 2], [0, 3])


TP_GATHERED = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"


def test_a_preset_change_reads_as_the_key_the_file_wrote_first(tmp_path: Path) -> None:
    """A device or topology preset swapped reads as ``device.preset`` / ``topology.preset``,
    first in its section, and B's extra levels beside A's (an audit: it read
    ``device.name``, a key no plan file has, after the memory rows, and levels.2 after
    ``topology.name``)."""
    h200 = variant(tmp_path, "h200.yaml", ("preset: a100-80gb", "preset: h200"))
    keys = [c.key for c in plan_changes(load_plan(GPT3), load_plan(h200))]
    assert keys[0] == "device.preset" and "device.name" not in keys
    rail = variant(tmp_path, "rail.yaml", ("preset: dgx-a100", "preset: rail-fat-tree"))
    keys = [c.key for c in plan_changes(load_plan(GPT3), load_plan(rail))]
    assert keys[0] == "topology.preset"
    assert keys[1:] == sorted(keys[1:], key=lambda k: k.split(".")[2])  # levels in order
    bigger = variant(
        tmp_path, "bigger.yaml", ("preset: llama3-8b", "preset: llama3-70b"), base=TP_GATHERED
    )
    keys = [c.key for c in plan_changes(load_plan(TP_GATHERED), load_plan(bigger))]
    assert keys[0] == "model.preset" and "model.name" not in keys
    # a preset against a Hugging Face config: both keys, none (not "") where a side lacks one
    hf = ROOT / "tests" / "data" / "llama3-70b-hf.yaml"
    preset = variant(
        tmp_path,
        "preset.yaml",
        ("hf_config: hf/llama3-70b/config.json", "preset: llama3-70b"),
        base=hf,
    )
    shown = {c.key: (c.a, c.b) for c in plan_changes(load_plan(preset), load_plan(hf))}
    assert shown["model.preset"] == ("llama3-70b", None)
    assert shown["model.hf_config"] == (None, "hf/llama3-70b/config.json")


def test_the_stage_rows_add_up_to_the_peak_with_what_is_reserved(tmp_path: Path) -> None:
    """device.reserved moved the peak and no row beside it (an audit): a reserved row,
    shown when a side reserves anything, makes the rows add up."""
    more = variant(tmp_path, "more.yaml", ("reserved: 3 GiB", "reserved: 6.5 GiB"))
    _, _, diff = diff_files(GPT3, more)
    for row in diff.stages:
        d = {delta.metric: delta for delta in row.deltas}
        for side in ("a", "b"):
            parts = ("states_bytes", "activations_bytes", "transient_bytes", "kv_cache_bytes")
            total = sum(getattr(d[m], side) for m in (*parts, "reserved_bytes"))
            assert total == getattr(d["peak_bytes"], side)
        assert d["reserved_bytes"].absolute == 3.5 * 2**30
    out = runner.invoke(app, route(["diff", str(GPT3), str(more)])).stdout
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["reserved"]]
    assert rows and all(r[1:5] == ["3.00", "GiB", "6.50", "GiB"] for r in rows)  # each stage


def test_the_marks_stand_beside_the_colour_and_a_headline_leads(tmp_path: Path) -> None:
    """On a colour terminal the ✓ and ✗ stay (an audit: colour alone told better from
    worse); one sentence under the two plans says what a reviewer most wants to know; in
    markdown, two plans of one name are titled by their files and the stages and phases that
    did not move are named, not tabled."""
    from rich.console import Console

    from budget.render.diff import diff_markdown, headline, render_diff

    more = variant(tmp_path, "more.yaml", ("reserved: 3 GiB", "reserved: 6.5 GiB"))
    a, b, diff = diff_files(GPT3, more)
    console = Console(width=120, color_system="truecolor", force_terminal=True, record=True)
    render_diff(console, a, b, diff, "table")
    coloured = console.export_text(styles=True, clear=False)
    text = console.export_text()
    (peak,) = [line for line in text.splitlines() if line.lstrip().startswith("worst-stage peak")]
    assert peak.rstrip().endswith("✗")  # the row's own mark, not the legend's
    assert "\x1b[" in coloured
    sentence = headline(diff)
    assert sentence.startswith("B against A: worst-stage peak +")
    assert "step time unchanged at" in sentence and sentence.endswith("; both fit")
    # the reserved memory adds 3.5 GiB to the peak and leaves the step as A's report has it
    pa, pb = a.worst.peak_bytes, b.worst.peak_bytes
    assert pb - pa == 3.5 * 2**30 and b.step["time_s"] == a.step["time_s"]
    plain = sentence.replace(chr(0xA0), " ")
    assert plain == (
        f"B against A: worst-stage peak +{pb / pa - 1:.1%} ({pa / 2**30:.1f} GiB → "
        f"{pb / 2**30:.1f} GiB), step time unchanged at {a.step['time_s']:.1f} s; both fit"
    )
    assert sentence + "." in text
    markdown = diff_markdown(a, b, diff)
    assert markdown.startswith("## budget diff: gpt3-175b.yaml → more.yaml\n")
    assert f"**{sentence.replace(chr(0xA0), ' ')}.**" in markdown  # plain spaces there
    assert "Unchanged" not in markdown.split("### Phases")[0]  # every stage's peak moved
    assert "\nUnchanged phases: `forward.embedding`, " in markdown


def test_the_terminal_tables_what_moved_and_names_what_did_not(tmp_path: Path) -> None:
    """One overlap flag moves one phase: the terminal printed all 12 phases' 60 rows and 8
    stages' 48 rows of zeros around it (and, at 80 columns, wrapped the zero table's title
    to its width); it shows the rows that moved and names the rest, as markdown does."""
    hidden = variant(
        tmp_path,
        "hidden.yaml",
        ("recompute: selective\n", "recompute: selective\noverlap: {dp_grads: true}\n"),
    )
    code, out, _ = _diff(GPT3, hidden, width=80)
    assert code == 0
    lines = out.splitlines()
    assert "Memory per rank of each pipeline stage, at its peak: no stage changed." in lines
    assert not any(line.split()[:1] == ["states"] for line in lines)  # no stage row at all
    phases = out.split("Phases of one step (per rank, on the stage where each costs most)")[1]
    table = phases.split("Unchanged")[0].splitlines()
    named = [line.split()[0] for line in table if line[:2].strip() and line[1] not in "─p"]
    assert named == ["dp.grads"]
    unchanged = " ".join(phases.split("Unchanged phases: ")[1].split("\n\n")[0].split())
    assert unchanged.startswith("forward.embedding, forward.attention, ")
    assert "dp.grads" not in unchanged and unchanged.endswith("optimizer.")
    assert all(len(line) <= 80 for line in lines)


def test_two_invalid_plans_report_in_the_order_given(tmp_path: Path) -> None:
    """`diff Z A` with both invalid: Z's problems first, as validate and check keep the files'
    order (a review: they came sorted by file name)."""
    (tmp_path / "z").mkdir()
    (tmp_path / "a").mkdir()
    z, a = invalid(tmp_path / "z"), invalid(tmp_path / "a")
    result = runner.invoke(app, route(["diff", str(z), str(a)]))
    assert result.exit_code == 2
    files = list(dict.fromkeys(line.split(":")[0] for line in result.stderr.splitlines()))
    assert files == [str(z), str(a)]


def test_transition_labels_stay_unique_and_group_by_the_whole_name(tmp_path: Path) -> None:
    """Two transitions named g beside one named "g #2": the second g's label had collided
    with it and its change vanished; and a transition named "a" had swallowed the keys of
    one named "a].b" (a review). The two g are one tensor, which keeps its dtype (a name is
    one tensor: `plan.transitions`); the second's count changes."""
    from budget.render.diff import shown_changes

    def plan(*items: tuple[str, str] | tuple[str, str, int]) -> Any:
        lines = "".join(
            f"  - name: '{name}'\n    phase: loss\n    tensor: {{shape: [micro * seq, vocab], "
            f"dtype: {dtype}}}\n    group: tp\n    from: replicate\n    to: replicate\n"
            f"    count: {count[0] if count else 1}\n"
            for name, dtype, *count in items
        )
        text = TP_GATHERED.read_text(encoding="utf-8")
        text = text[: text.index("\ntransitions:") + 1] + "transitions:\n" + lines
        path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(text, encoding="utf-8")
        return load_plan(path)

    a = plan(("g", "bf16"), ("g", "bf16"), ("g #2", "bf16"))
    b = plan(("g", "bf16"), ("g", "bf16", 2), ("g #2", "fp16"))
    keys = [c.key for c in plan_changes(a, b)]
    assert len(keys) == len(set(keys)) == 2  # both changes, each under its own label
    assert keys[0].endswith(".count") and keys[1].endswith(".tensor.dtype")
    dotted = plan(("a", "bf16"), ("a].b", "bf16"))
    rows = shown_changes(plan_changes(dotted, plan(("a].b", "fp32"))))
    assert [row[0] for row in rows] == ["transitions[a]", "transitions[a].b].tensor.dtype"]


def test_a_serving_headline_names_its_latencies_plainly(tmp_path: Path) -> None:
    """A decode plan against one serving twice the sequences: the headline names the time to
    first token and the time per output token (it read "decode, per token", whose comma read
    as a list's: a review)."""
    from budget.render.diff import headline

    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    more = variant(tmp_path, "more.yaml", ("sequences: 32", "sequences: 64"), base=decode)
    sentence = headline(diff_files(decode, more)[2])
    assert "time to first token +" in sentence and "time per output token +" in sentence


def test_steps_of_other_work_compare_by_throughput_not_by_step(tmp_path: Path) -> None:
    """A global batch of 1,024 against 512: B's step runs twice the tokens, so a longer step
    is no worse (a user audit: "step time +89.0%" read as a regression where tokens/s rose
    5.8 %). The per-step times and each phase's times and bytes carry no verdict, tokens/s
    and MFU keep theirs, the headline names tokens/s, and the note says why."""
    b = variant(tmp_path, "g1024.yaml", ("global: 512", "global: 1024"), base=LLAMA)
    code, out, _ = _diff(LLAMA, b, width=120)
    assert code == 0
    ra, rb, diff = diff_files(LLAMA, b)
    verdicts = {d.metric: d.verdict for d in diff.summary}
    for metric in ("time_s", "compute_s", "comm_s", "exposed_comm_s", "bubble_s", "after_s"):
        assert verdicts[metric] == "n/a", metric
    assert verdicts["tokens_per_s"] == "better" and verdicts["mfu"] == "better"
    assert verdicts["peak_bytes"] == "same"  # memory per rank compares regardless
    for row in diff.phases:
        for d in row.deltas:
            assert d.verdict in ("n/a", "same") or d.metric == "peak_bytes", (row.key, d)
    tokens = (512 * 8192, 1024 * 8192)
    assert diff.work == ((tokens[0],), (tokens[1],))
    text = " ".join(out.split())
    assert f"B's step runs 2× A's tokens ({tokens[1]:,} against {tokens[0]:,})" in text
    # and says that memory keeps its verdict, as the phases' peaks do (an audit: "times and
    # bytes carry no verdict" beside a peak marked ✗)
    assert "times and the bytes they send are not like for like" in text
    assert "; memory, tokens/s, MFU and the exposed share do" in text
    rate = rb.step["tokens_per_s"] / ra.step["tokens_per_s"] - 1
    assert text.startswith("A ") and f"tokens/s +{rate:.1%}" in text.split("Plan changes")[0]
    assert "step time" not in text.split("Plan changes")[0]
    # each phase runs twice the micro-batches: its calls say so, first in its rows
    attention = next(r for r in diff.phases if r.key == "forward.attention")
    calls = attention.deltas[0]
    assert calls.metric == "count" and calls.b == 2 * calls.a


def test_a_preset_topology_changes_by_its_nodes(tmp_path: Path) -> None:
    """`topology: {preset: dgx-h100, nodes: 64}` → 128 reads as the key the file wrote,
    topology.nodes, not topology.gpus 512 → 1,024 (a user audit); dp follows it."""
    b = variant(
        tmp_path, "n128.yaml", ("nodes: 64", "nodes: 128"), ("dp: 16", "dp: 32"), base=LLAMA
    )
    *_, diff = diff_files(LLAMA, b)
    changes = {c.key: (c.a, c.b) for c in diff.changes}
    assert changes == {"parallel.dp": (16, 32), "topology.nodes": (64, 128)}
    # a side that is no whole number of nodes keeps both in GPUs, one key (a review: it read
    # topology.gpus 4 → – beside topology.nodes – → 1)
    four = variant(
        tmp_path,
        "four.yaml",
        ("nodes: 64", "gpus: 4"),
        ("tp: 8", "tp: 4"),
        ("pp: 4", "pp: 1"),
        ("dp: 16", "dp: 1"),
        base=LLAMA,
    )
    one = variant(
        tmp_path,
        "one.yaml",
        ("nodes: 64", "nodes: 1"),
        ("pp: 4", "pp: 1"),
        ("dp: 16", "dp: 1"),
        base=LLAMA,
    )
    keys = {c.key: (c.a, c.b) for c in plan_changes(load_plan(four), load_plan(one))}
    assert keys["topology.gpus"] == (4, 8) and "topology.nodes" not in keys


def test_the_reduction_after_the_pipeline_and_the_pacing_stage_are_shown(tmp_path) -> None:
    """ZeRO 1 → 2 moves the gradient reduction into every micro-batch's backward: the diff
    shows the time after the pipeline (reduction + optimizer) beside the step, which
    it left out (a user audit), and, where the stage that paces the step moves, says so."""
    b = variant(tmp_path, "zero2.yaml", ("zero: 1", "zero: 2"), base=LLAMA)
    ra, rb, diff = diff_files(LLAMA, b)
    after = next(d for d in diff.summary if d.metric == "after_s")
    assert (after.a, after.b) == (ra.step["after_s"], rb.step["after_s"])
    assert after.verdict != "n/a"
    code, out, _ = _diff(LLAMA, b, width=120)
    assert code == 0 and "reduction + optimizer" in out
    assert ra.step["pacing_stage"] == rb.step["pacing_stage"] == 3
    assert "paced by stage" not in (diff.note or "")
    # 23 layers on the first stage: it paces the step in place of the last (a review: the
    # pair above paced alike, so the note went untested)
    skewed = variant(
        tmp_path,
        "skewed.yaml",
        (
            "pipeline: {schedule: 1f1b}",
            "pipeline: {schedule: 1f1b, layers_per_stage: [23, 20, 20, 17]}",
        ),
        base=LLAMA,
    )
    ra, rb, diff = diff_files(LLAMA, skewed)
    assert (ra.step["pacing_stage"], rb.step["pacing_stage"]) == (3, 0)
    assert "the step is paced by stage 3 in A and by stage 0 in B" in (diff.note or "")


def test_two_prefills_apart_in_generate_alone_do_the_same_work(tmp_path: Path) -> None:
    """A prefill generates nothing: its generate sizes the KV cache it allocates, not its
    work, so two prefills apart in generate alone keep their step verdicts (a review: "not
    like for like" on identical 2.78 s steps)."""
    base = ROOT / "plans" / "llama3-70b-decode.yaml"
    a = variant(tmp_path, "a.yaml", ("mode: decode", "mode: prefill"), base=base)
    b = variant(
        tmp_path,
        "b.yaml",
        ("mode: decode", "mode: prefill"),
        ("generate: 512", "generate: 1024"),
        base=base,
    )
    *_, diff = diff_files(a, b)
    assert diff.work[0] == diff.work[1] and diff.note is None
    assert {d.metric: d.verdict for d in diff.summary}["time_s"] != "n/a"
    # a prefill's rate is of its prompts' tokens, as its report says ("prompt tokens/s")
    from budget.render.diff import _summary_label

    assert _summary_label(diff, "tokens_per_s") == "prompt tokens/s"
    assert _summary_label(diff, "mfu") == "MFU"


def test_mfus_of_different_peaks_carry_no_verdict_and_say_whose(tmp_path: Path) -> None:
    """An audit: Llama 3 70B in bf16 against fp8 GEMMs read "MFU 49.1% → 32.6% ✗" where
    tokens/s rose 32.8 %: B's MFU is a share of the fp8 peak, twice the bf16 one. The row
    names each side's peak, has no ✓ or ✗ (verdict n/a in JSON), and a note says why;
    tokens/s keeps its verdict."""
    b = variant(
        tmp_path, "fp8.yaml", ("  params: bf16", "  params: bf16\n  matmul: fp8"), base=LLAMA
    )
    ra, rb, diff = diff_files(LLAMA, b)
    assert (ra.mfu_format, rb.mfu_format) == ("bf16", "fp8")
    verdicts = {d.metric: d.verdict for d in diff.summary}
    assert verdicts["mfu"] == "n/a" and verdicts["tokens_per_s"] == "better"
    assert rb.step["mfu"] < ra.step["mfu"]  # what read as worse
    code, out, _ = _diff(LLAMA, b)
    assert code == 0
    (row,) = [line for line in out.splitlines() if line.lstrip().startswith("MFU")]
    assert row.lstrip().startswith("MFU (bf16 → fp8 peak)")
    assert not row.rstrip().endswith(("✓", "✗"))
    note = "A's MFU is a share of the bf16 peak and B's of the fp8 peak"
    assert note in " ".join(out.split())
    result = runner.invoke(app, route(["diff", "-f", "json", str(LLAMA), str(b)]))
    delta = json.loads(result.stdout)["delta"]
    assert delta["summary"]["mfu"]["verdict"] == "n/a" and note in delta["note"]
    markdown = runner.invoke(app, route(["diff", "-f", "markdown", str(LLAMA), str(b)])).stdout
    assert "| MFU (bf16 → fp8 peak) |" in markdown


def test_mfus_on_devices_of_other_rates_carry_no_verdict(tmp_path: Path) -> None:
    """An audit: Llama 3 70B on A100s against H100s read "MFU 43.5% → 59.3% ✓" at 43 % of
    the tokens/s: both shares of a bf16 peak, but of 989 and 312 TFLOP/s. The row names
    both peaks and carries no verdict; and the headline, which said the peak was unchanged
    and both fit, says the headroom fell from 41.2 to 1.56 GiB."""
    b = variant(tmp_path, "a100.yaml", ("preset: h100-sxm,", "preset: a100-40gb,"), base=LLAMA)
    ra, rb, diff = diff_files(LLAMA, b)
    assert (ra.mfu_peak, rb.mfu_peak) == (989e12, 312e12)
    assert diff.mfu_formats == ("bf16", "bf16") and not diff.one_peak
    verdicts = {d.metric: d.verdict for d in diff.summary}
    assert verdicts["mfu"] == "n/a" and verdicts["tokens_per_s"] == "worse"
    code, out, _ = _diff(LLAMA, b)
    assert code == 0
    (row,) = [line for line in out.splitlines() if line.lstrip().startswith("MFU")]
    assert row.lstrip().startswith("MFU (989 TFLOP/s → 312 TFLOP/s peak)")
    assert not row.rstrip().endswith(("✓", "✗"))
    words = " ".join(out.split())
    assert "A's MFU is a share of a GPU's bf16 peak of 989 TFLOP/s and B's of 312 TFLOP/s" in words
    room = next(d for d in diff.summary if d.metric == "headroom_bytes")
    fell = 1 - room.b / room.a
    a, b_room = (format_bytes(x).replace(NBSP, " ") for x in (room.a, room.b))
    said = f"worst-stage headroom −{fell:.1%} ({a} → {b_room})"
    assert said in headline(diff).replace(NBSP, " ")
    assert fell > 0.9  # the A100's 40 GB leave the same peak almost no room
    # where only the peak moves, the headroom moves with it and the headline leaves it out
    g = variant(tmp_path, "g1024.yaml", ("global: 512", "global: 1024"), base=LLAMA)
    assert "headroom" not in headline(diff_files(LLAMA, g)[2])


def test_plans_of_other_modes_say_what_each_sides_rate_is_of(tmp_path: Path) -> None:
    """An audit: a decode plan's rate of its decode passes, 1,851 tokens/s, sat beside a
    training step's under one "tokens/s", and its whole 11.6 s run under "step time"."""
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    _, _, diff = diff_files(LLAMA, decode)
    from budget.render.diff import _summary_label

    labels = {m: _summary_label(diff, m) for m in ("time_s", "tokens_per_s", "mfu")}
    assert labels == {
        "time_s": "time (step → run)",
        "tokens_per_s": "tokens/s (training → decoding)",
        "mfu": "MFU (step → decoding)",
    }
    prefill = variant(tmp_path, "p.yaml", ("mode: decode", "mode: prefill"), base=decode)
    _, _, diff = diff_files(prefill, decode)
    assert _summary_label(diff, "tokens_per_s") == "tokens/s (prompt → decoding)"
    assert _summary_label(diff, "time_s") == "run time"


def test_mfus_of_one_peak_keep_their_verdict(tmp_path: Path) -> None:
    """Both plans in bf16: MFU is one peak's share on both sides, and keeps its row name
    and its verdict."""
    b = variant(tmp_path, "g1024.yaml", ("global: 512", "global: 1024"), base=LLAMA)
    _, _, diff = diff_files(LLAMA, b)
    assert diff.mfu_formats == ("bf16", "bf16")
    assert next(d for d in diff.summary if d.metric == "mfu").verdict != "n/a"
    assert diff.note is None or "peak" not in diff.note


def test_a_nought_change_reads_in_its_unit_and_a_tiny_one_keeps_its_digits() -> None:
    """ "overlap slowdown 0 s 0 s 0 0%" gave the nought no unit and a percentage of a nought
    the JSON leaves null; a change of 0.004 % read "−0.0%" (an audit); two figures now."""
    from budget.diff import Delta
    from budget.render.diff import _change

    assert _change(Delta("bubble_s", "seconds", "lower", 0.0, 0.0)) == ("0 s", "–")
    assert _change(Delta("activations_bytes", "bytes", "lower", 2**30, 2**30)) == ("0 B", "0%")
    assert _change(Delta("mfu", "share", "higher", 0.5, 0.5)) == ("0 pt", "0%")
    assert _change(Delta("compute_s", "seconds", "lower", 1.0, 0.99996))[1] == "−0.0040%"


def test_plan_changes_say_they_are_resolved_values(tmp_path: Path) -> None:
    """zero 1 → 3 lists parallel.fsdp – → 2 too, a key neither file writes (an audit took
    it for a mistake): under the changes, in both formats, a sentence says why. (Gemma 2
    9B, without a pipeline: ZeRO 3 is priced without one only.)"""
    from budget.render.diff import RESOLVED

    gemma = ROOT / "plans" / "gemma2-9b.yaml"
    b = variant(tmp_path, "z3.yaml", ("zero: 1", "zero: 3"), base=gemma)
    *_, diff = diff_files(gemma, b)
    assert [c.key for c in diff.changes][:1] == ["parallel.zero"]
    for fmt in ("table", "markdown"):
        result = CliRunner().invoke(app, route(["diff", str(gemma), str(b), "-f", fmt]))
        assert RESOLVED in " ".join(result.stdout.split()), fmt


def test_a_long_title_wraps_between_whole_degrees(tmp_path: Path) -> None:
    """At 80 columns "tp 8 × dp" ended a line and "1" began the next (an audit): a degree
    keeps its count, and the rest of the title is indented under its side's letter."""
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    b = variant(tmp_path, "d64.yaml", ("sequences: 32", "sequences: 64"), base=decode)
    code, out, _ = _diff(decode, b, width=80)
    assert code == 0
    first, second = out.splitlines()[:2]
    assert first.startswith("A  ") and second.startswith("   ")
    assert not re.search(r"\b(tp|pp|dp|cp|ep)$", first.rstrip()), first


@pytest.mark.parametrize("width", [44, 52, 60, 80, 120])
def test_no_plan_change_breaks_a_short_word_at_any_width(width: int) -> None:
    """At 52 columns the plan changes' value columns were 7 wide: "gpt3-175b" read "gpt3-1"
    over "75b" and "layernorm" "layern" over "orm". Where three columns cannot hold them,
    each key is a line with its values after it."""
    code, out, _ = _diff(GPT3, LLAMA, width=width)
    assert code == 0
    changes = out.split("Plan changes", 1)[1].split("Values as budget resolves", 1)[0]
    words = changes.split()
    for word in ("gpt3-175b", "llama3-70b", "layernorm", "rmsnorm", "a100-80gb", "dgx-h100"):
        assert word in words, (width, word)
    assert "2.039\u00a0TB/s" in changes or "2.039 TB/s" in changes
    assert all(len(line) <= width for line in out.splitlines())


def test_without_rich_s_layout_the_plan_changes_are_listed(monkeypatch) -> None:
    """A rich without the private layout `whole` reads cannot say the columns hold their
    words, so the plan changes are a key a line, whatever the width."""
    from budget.render import table as render

    def missing(*_: object) -> None:
        raise AttributeError("_calculate_column_widths")

    monkeypatch.setattr(render, "laid_out", missing)
    code, out, _ = _diff(GPT3, LLAMA, width=120)
    assert code == 0
    assert " name  gpt3-175b → llama3-70b" in out.splitlines()


def test_the_headline_keeps_each_figure_with_its_unit() -> None:
    """At 80 columns the sentence under the titles wrapped between "(1.11" and "s → 1.21 s)":
    rich breaks at a no-break space too, so it is held as every wrapped text is."""
    fsdp = ROOT / "plans" / "llama3-8b-fsdp.yaml"
    gathered = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    for width in range(60, 100):
        code, out, _ = _diff(fsdp, gathered, width=width)
        assert code == 0
        lines = out.split("B against A", 1)[1].split("fit.", 1)[0].splitlines()
        assert not any(re.search(r"\d$", line.rstrip()) for line in lines), (width, lines)
        assert all(len(line) <= width for line in lines)


@pytest.mark.parametrize("width", [60, 72, 80, 100, 120])
def test_a_long_plan_name_is_whole_where_the_list_would_hold_it(width: int) -> None:
    """A word capped at 20 characters let "llama3-8b-tp-loss-gathered" break in the table at
    80 columns, where the list holds it on one line (a review)."""
    fsdp = ROOT / "plans" / "llama3-8b-fsdp.yaml"
    gathered = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    code, out, _ = _diff(fsdp, gathered, width=width)
    assert code == 0
    changes = out.split("Plan changes", 1)[1].split("Values as budget resolves", 1)[0]
    assert "llama3-8b-tp-loss-gathered" in changes.split()


def test_a_change_too_small_to_round_apart_is_shown_and_said(tmp_path: Path) -> None:
    """reserved 3 GiB → 3.001 GiB: the plan-changes row read "3.00 GiB → 3.00 GiB", a change
    the reader could not see, and the headline called the peak, 1.02 MiB higher, unchanged
    (an audit). The values are written in full where their rounding is alike, and a peak
    that moved under the diff's threshold is "about the same", with its change."""
    from budget.render.diff import headline, shown_changes

    b = variant(tmp_path, "r.yaml", ("reserved: 3 GiB", "reserved: 3.001 GiB"), base=LLAMA)
    rows = shown_changes(plan_changes(load_plan(LLAMA), load_plan(b)))
    extra = round(0.001 * 2**30)
    assert rows == [("device.reserved", "3,221,225,472 B", f"{3 * 2**30 + extra:,} B")]
    ra, _, diff = diff_files(LLAMA, b)
    sentence = headline(diff)
    peak = format_bytes(ra.worst.peak_bytes).replace(" ", NBSP)  # the plan's own, not pinned
    assert f"worst-stage peak about the same at {peak} (+1.02\u00a0MiB)" in sentence
    assert "step time unchanged at" in sentence  # the step did not move at all


def test_values_written_in_full_keep_every_digit() -> None:
    """Rates and FLOP/s past 10^12 read "3.35e+12 B/s" on both sides at 12 digits (a
    review): an integer is written whole, another float as Python writes it back."""
    from budget.render.diff import plan_values

    assert plan_values("device.memory_bandwidth", 3_350_000_000_000, 3_350_000_000_001) == (
        "3,350,000,000,000 B/s",
        "3,350,000,000,001 B/s",
    )
    assert plan_values("device.flops.bf16", 989e12, 989.0000001e12) == (
        "989,000,000,000,000 FLOP/s",
        "989,000,000,100,000 FLOP/s",
    )
    assert plan_values("device.reserved", 3 * 2**30, 3 * 2**30 + 1.5) == (
        "3,221,225,472 B",
        "3221225473.5 B",
    )


def test_a_changed_key_holding_backticks_stays_one_code_span(tmp_path: Path) -> None:
    """A transition's name, as its author typed it, names the changed key: with a backtick in
    it the key's code span was cut in three in markdown (an audit)."""
    transition = (
        "transitions:\n  - {name: 'kept beside the `.float()` copy', phase: loss,\n"
        "     tensor: {shape: [16, 16], dtype: fp32}, group: tp, from: partial, to: replicate,\n"
        "     source_alive: ALIVE}\n"
    )
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(GPT3.read_text("utf-8") + transition.replace("ALIVE", "false"), "utf-8")
    b.write_text(GPT3.read_text("utf-8") + transition.replace("ALIVE", "true"), "utf-8")
    code, out, _ = _diff(a, b, "--format", "markdown")
    assert code == 0
    row = "| ``transitions[kept beside the `.float()` copy].source_alive`` | false | true |"
    assert row in out.splitlines()


def test_plans_on_other_numbers_of_gpus_compare_their_rate_per_gpu(tmp_path: Path) -> None:
    """An audit: GPT-3 on half the GPUs (pp 4, 64 nodes) read "step time +89.8 %" and
    "tokens/s −47.3 % ✗" where each GPU did 5.4 % more, as MFU said beside them; and 8 GPUs
    against 64 read tokens/s +447.9 % ✓ where each GPU did 31.5 % less. A whole job's rate
    and a training step's times carry no verdict between plans on other numbers of GPUs;
    tokens/s per GPU does, and the headline and the note say so."""
    half = variant(tmp_path, "half.yaml", ("pp: 8", "pp: 4"), ("nodes: 128", "nodes: 64"))
    a, b, diff = diff_files(GPT3, half)
    assert (a.world_size, b.world_size) == (1024, 512) and diff.gpus == (1024, 512)
    summary = {d.metric: d for d in diff.summary}
    per_gpu = summary["tokens_per_s_per_gpu"]
    assert per_gpu.a == a.step["tokens_per_s"] / 1024
    assert per_gpu.b == b.step["tokens_per_s"] / 512
    assert per_gpu.verdict == "better" and summary["mfu"].verdict == "better"
    assert summary["tokens_per_s"].verdict == "n/a" and summary["time_s"].verdict == "n/a"
    assert all(d.verdict == "n/a" for row in diff.phases for d in row.deltas if d.unit == "seconds")
    said = headline(diff).replace(NBSP, " ")
    assert "tokens/s per GPU +5.4% (161 → 169)" in said and "step time" not in said
    assert diff.note is not None
    assert diff.note.startswith(
        "A runs on 1,024 GPUs and B on 512: the step's and each phase's times and the bytes a "
        "rank sends are not like for like, nor is the whole job's tokens/s"
    )
    # beside MFUs of other peaks, what still carries the throughput's verdict is per GPU (a
    # review: the peaks' note said "tokens/s does" after the GPUs' note said it did not)
    peaks = replace(diff, mfu_peaks=(312e12, 989e12)).note
    assert peaks is not None and peaks.endswith("so MFU carries no verdict; tokens/s per GPU does")
    # on as many GPUs the whole job's rate keeps its verdict and no per-GPU row is added
    _, _, same = diff_files(GPT3, GPT3)
    assert "tokens_per_s_per_gpu" not in {d.metric for d in same.summary}


def test_a_device_with_no_rates_lists_only_the_rates_it_lost(tmp_path: Path) -> None:
    """An audit: against a device written with its memory alone, the diff listed each
    removed rate and then "device.flops – → []", a key neither file writes (an empty tuple
    of pairs flattened as a list of no scalars)."""
    untimed = untimed_plan(tmp_path)
    assert "device.flops" not in flatten(load_plan(untimed))
    keys = [
        c.key for c in plan_changes(load_plan(ROOT / "plans" / "gpt-1.3b.yaml"), load_plan(untimed))
    ]
    assert "device.flops.bf16" in keys and "device.flops" not in keys
    # nor a 0 standing for a bandwidth or an SM count not given: "2.039 TB/s → 0 B/s" and
    # "108 → 0" beside "312 TFLOP/s → –" (an audit); its 0 s kernel startup is a value
    changes = {
        c.key: c
        for c in plan_changes(load_plan(ROOT / "plans" / "gpt-1.3b.yaml"), load_plan(untimed))
    }
    assert changes["device.memory_bandwidth"].b is None and changes["device.sms"].b is None
    assert (changes["device.sms"].a, changes["device.kernel_startup"].b) == (108, 0.0)


def test_a_side_with_no_step_time_is_said_so_not_given_a_zero_peak(tmp_path: Path) -> None:
    """An audit: against a device with no rates the summary read "MFU (312 TFLOP/s → 0
    FLOP/s peak)" and the note "B's of 0 FLOP/s: shares of different peaks ... tokens/s
    does", where B has no MFU and no tokens/s (its step is not computed)."""
    untimed = untimed_plan(tmp_path)
    code, out, err = _diff(ROOT / "plans" / "gpt-1.3b.yaml", untimed, width=200)
    assert code == 0, err
    assert "0 FLOP/s" not in out and "different peaks" not in out
    assert re.search(r"^ MFU +70\.7% +– ", out, re.M), out
    assert (
        "B's step time is not computed (the device section has no peak FLOP/s or memory "
        "bandwidth), so its times, tokens/s and MFU have no figure to compare" in out
    )
    _, _, diff = diff_files(untimed, untimed)
    assert diff.note is not None and diff.note.startswith("A's and B's step times are not computed")


def test_the_markdown_note_on_changed_algorithms_escapes_their_names(tmp_path: Path) -> None:
    """The note naming the collectives B runs with another algorithm carries the plan's
    transition names, which went out as written (an audit: "<bos> logits *fp32* gather"
    lost "<bos>" as an HTML tag and turned "fp32" italic); escaped as the report's tables
    escape them."""
    edits = (
        "recompute: none",
        "recompute: none\ntransitions:\n  - {name: '<bos> logits *fp32* gather', "
        "phase: loss, tensor: {shape: [2048, 50304], dtype: bf16}, group: dp, "
        "from: shard(0), to: replicate}",
    )
    base = ROOT / "plans" / "gpt-1.3b.yaml"
    a = variant(tmp_path, "a.yaml", edits, base=base)
    b = variant(
        tmp_path,
        "b.yaml",
        edits,
        ("\ntransitions:", "\ncollectives: {all-gather: bruck}\ntransitions:"),
        base=base,
    )
    code, out, _ = _diff(a, b, "-f", "markdown")
    assert code == 0
    (note,) = [line for line in out.splitlines() if line.startswith("> B runs")]
    assert "\\<bos\\> logits \\*fp32\\* gather in loss (ring → bruck)" in note


def test_the_causal_mfu_is_compared_where_a_report_prints_it(tmp_path: Path) -> None:
    """A long context's MFU counting the attention as the causal mask computes it, which
    each report prints beside PaLM's count where it is a tenth or more below, is compared
    beside MFU (an audit: 64K against 128K tokens showed MFU +7.9 pt, where the causal
    MFU, 18.8 % against 22.4 %, moved +3.6 pt); short contexts, whose reports print one
    MFU, keep one row. The table prints the JSON's figures, in percent and points."""
    long = ROOT / "plans" / "llama3-405b-128k.yaml"
    half = variant(tmp_path, "64k.yaml", ("seq: 131072", "seq: 65536"), base=long)
    half.write_text(half.read_text(encoding="utf-8").replace("global: 128", "global: 256"))
    code, out, _ = _diff(half, long, "--format", "json")
    assert code == 0
    data = json.loads(out)
    causal = data["delta"]["summary"]["mfu_causal"]
    a, b = (data[side]["step"]["mfu_causal"] for side in "ab")
    assert (causal["a"], causal["b"]) == (a, b) and b > a
    assert causal["delta"] == pytest.approx(b - a) and causal["verdict"] == "better"
    assert list(data["delta"]["summary"]).index("mfu_causal") == (
        list(data["delta"]["summary"]).index("mfu") + 1
    )
    _, table, _ = _diff(half, long)
    printed = rf"MFU, causal attention +{a:.1%} +{b:.1%} +\+{(b - a) * 100:.1f} pt"
    assert re.search(printed.replace(".", r"\."), table), table
    _, short, _ = _diff(GPT3, tp4(tmp_path), "--format", "json")
    assert "mfu_causal" not in json.loads(short)["delta"]["summary"]


def test_a_steps_figures_of_two_pacing_stages_carry_no_verdict(tmp_path: Path) -> None:
    """A DeepSeek-V3 audit (m509): a step's compute, communication and exposed time are its
    pacing stage's, and where the two plans are paced by different stages their deltas
    compare two stages (dropping the MTP module, on the last stage alone, read as +28 %
    communication ✗). GPT-3 175B split 9, 13 x 6, 9 is paced by stage 1 where the even
    split is by stage 7: those rows carry no verdict, the step time and tokens/s do, and
    the note says why."""
    split = "schedule: 1f1b, layers_per_stage: [9, 13, 13, 13, 13, 13, 13, 9]"
    b = variant(tmp_path, "split.yaml", ("schedule: 1f1b", split))
    a_report, b_report, diff = diff_files(GPT3, b)
    assert (a_report.step["pacing_stage"], b_report.step["pacing_stage"]) == (7, 1)
    verdicts = {d.metric: d.comparable for d in diff.summary}
    for metric in ("compute_s", "comm_s", "exposed_comm_s", "exposed_share"):
        assert verdicts[metric] is False, metric
    assert verdicts["time_s"] and verdicts["tokens_per_s"] and verdicts["bubble_s"]
    assert "each its pacing stage's, so they carry no verdict" in (diff.note or "")
    *_, same = diff_files(GPT3, GPT3)  # one pacing stage: every figure has its verdict
    assert all(d.comparable for d in same.summary)


def test_figures_that_round_alike_but_moved_take_the_digits_that_tell_them_apart(
    tmp_path: Path,
) -> None:
    """A step 5.98 ms longer read "+0.5% (1.15 s → 1.15 s)", a worse verdict between two
    equal figures (an audit, m529): where A and B print alike and differ, both take A's unit
    with the decimals that part them, in the headline, the table and markdown; a figure
    "about the same" keeps its rounding beside its change."""
    from budget.render.diff import _pair

    gathered = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    bare = tmp_path / "bare.yaml"
    bare.write_text(gathered.read_text(encoding="utf-8").split("\ntransitions:")[0] + "\n")
    ra, rb, diff = diff_files(bare, gathered)
    ta, tb = ra.step["time_s"], rb.step["time_s"]
    assert f"{ta:.2f}" == f"{tb:.2f}" and ta < tb
    shown = (f"{ta:.3f}\u00a0s", f"{tb:.3f}\u00a0s")
    assert shown[0] != shown[1]
    assert f"({shown[0]} → {shown[1]})" in headline(diff)
    step = next(d for d in diff.summary if d.metric == "time_s")
    assert _pair(step) == tuple(s.replace("\u00a0", " ") for s in shown)
    code, out, _ = _diff(bare, gathered, "-f", "markdown")
    assert code == 0 and f"| {ta:.3f} s | {tb:.3f} s |" in out
    # alike and equal, or apart already: as `_value` writes them
    same = replace(step, b=step.a)
    assert _pair(same) == (f"{ta:.2f} s", f"{ta:.2f} s")
    apart = replace(step, b=2 * step.a)
    assert _pair(apart) == (f"{ta:.2f} s", f"{2 * ta:.2f} s")
