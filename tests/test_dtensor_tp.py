"""Tensor parallelism as PyTorch's DTensor parallel styles run it (`parallel.tp_style:
dtensor`), as torchtitan applies them (``apply_tp``), against Megatron-LM's layers (the
default), by hand on Llama 3 8B at tp 2 with sequence parallelism, 8,192 tokens a micro-batch:
a layer's input is 8,192 x 4,096 bf16 = 64 MiB whole, 32 MiB a sequence shard (an audit,
m489)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from budget.errors import BudgetError
from budget.layers import attention_saved, mlp_saved, shapes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.report import to_dict
from budget.step import derive
from tests.plan_files import ROOT

MIB = 2**20
PLAN = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"


def _variant(tmp_path: Path, style: str, recompute: str = "selective", extra: str = "") -> Path:
    text = PLAN.read_text(encoding="utf-8")
    text = text[: text.index("\ntransitions:")] + "\n"  # the logits' transitions apart
    text = text.replace("  tp_style: dtensor", f"  tp_style: {style}")
    text = text.replace("recompute: full\nrecompute_early_stop: true", f"recompute: {recompute}")
    path = tmp_path / f"{style}-{recompute}.yaml"
    path.write_text(text + extra, encoding="utf-8")
    return path


def _moves(report: dict[str, Any], phase: str) -> dict[str, dict[str, Any]]:
    (found,) = [p for p in report["phases"] if p["name"] == phase]
    return {c["name"]: c for c in found["collectives"] if c["group"] == "tp"}


def test_the_shipped_torchtitan_plan_runs_dtensor_styles() -> None:
    assert load_plan(PLAN).parallel.tp_style == "dtensor"


def test_dtensor_gathers_nothing_again_and_waits_for_every_redistribute(tmp_path: Path) -> None:
    """DTensor's backward of a redistribute is one redistribute of the gradient back
    (``Redistribute.backward``): the input's Shard(1) → Replicate gather becomes the input
    gradient's reduce-scatter, the output's reduce-scatter the output gradient's gather; the
    gathered input is the matmul's own, saved, so Megatron-LM's re-gather for the weight
    gradient is not run, and each redistribute is waited for by the op after it."""
    dtensor = to_dict(build_report(load_plan(_variant(tmp_path, "dtensor"))))
    megatron = to_dict(build_report(load_plan(_variant(tmp_path, "megatron"))))
    for block in ("MLP", "attention"):
        phase = f"backward.{block.lower()}"
        ours, theirs = _moves(dtensor, phase), _moves(megatron, phase)
        assert f"{block} input again, for weight grad" in theirs
        assert set(ours) == {f"{block} output gradient", f"{block} input gradient"}
        for move in ours.values():
            assert move["exposed_s"] == move["time_s"] > 0
            assert move["bytes"] == 64 * MIB and move["ranks"] == 2
        assert theirs[f"{block} input gradient"]["exposed_s"] == 0  # behind the wgrad GEMM
        forward = _moves(dtensor, f"forward.{block.lower()}")
        assert {m["op"] for m in forward.values()} == {"all-gather", "reduce-scatter"}
        assert all(m["exposed_s"] == m["time_s"] for m in forward.values())
    assert "output layer input again, for weight grad" not in _moves(dtensor, "loss")
    assert dtensor["step"]["exposed_comm_s"] > megatron["step"]["exposed_comm_s"]


def test_dtensor_saves_each_column_parallel_input_whole(tmp_path: Path) -> None:
    """torch.nn.Linear saves its input; under DTensor's ColwiseParallel that is the
    redistributed, replicated one: 64 MiB a layer's QKV input and fc1 input at tp 2, where
    Megatron-LM saves the 32 MiB sequence shard. With one micro-batch in flight, 32 layers
    keep 32 x 2 x 32 MiB = 2 GiB more; the output layer's input, gathered whole at the loss
    either way, is saved whole rather than beside its shard (32 MiB less): 2 GiB − 32 MiB at
    the peak without recompute."""
    dtensor, megatron = (load_plan(_variant(tmp_path, s, "none")) for s in ("dtensor", "megatron"))
    for plan, size in ((dtensor, 64 * MIB), (megatron, 32 * MIB)):
        s = shapes(plan)
        saved = {a.name: a.bytes for a in attention_saved(plan, s) + mlp_saved(plan, s)}
        assert saved["attention QKV input"] == saved["MLP fc1 input"] == size
    peaks = [build_report(p).worst.peak_bytes for p in (dtensor, megatron)]
    assert peaks[0] - peaks[1] == 32 * 2 * 32 * MIB - 32 * MIB
    # the normed input's shard its redistribute read stays the block's argument until the
    # block returns (review m490), in place of Megatron-LM's gathered copy beside the shard
    (stage,) = derive(dtensor).stages
    (phase,) = [p for p in stage.phases if p.name == "forward.attention"]
    qkv = {a.name: a.total for a in phase.instants[0].live}
    assert qkv["attention input shard (before its redistribute)"] == 32 * MIB
    assert "attention input (all-gathered)" not in qkv


@pytest.mark.parametrize(
    ("extra", "edit", "said"),
    [
        ("", ("overlap: {dp_grads: true", "overlap: {tp: true, dp_grads: true"), "overlap.tp"),
        ("", ("  activations: bf16", "  activations: bf16\n  matmul: fp8"), "precision.matmul"),
        ("", ("{preset: llama3-8b,", "{preset: llama3-8b, mtp_layers: 1,"), "model.mtp_layers"),
    ],
)
def test_dtensor_refuses_what_it_does_not_price(
    tmp_path: Path, extra: str, edit: tuple[str, str], said: str
) -> None:
    path = _variant(tmp_path, "dtensor", extra=extra)
    text = path.read_text(encoding="utf-8")
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1), encoding="utf-8")
    with pytest.raises(BudgetError) as error:
        load_plan(path)
    message = str(error.value)
    assert "$.parallel.tp_style" in message and said in message


def test_fsdp2_reduces_each_norm_weights_partial_gradient_over_tp(tmp_path: Path) -> None:
    """Under DTensor's styles a SequenceParallel norm's weight is a replicated DTensor whose
    gradient comes out partial over tp; FSDP2's post-backward redistributes each before its
    unit's reduce-scatter (``_fsdp_param.py``, ``_get_grad_inner_tensor``): one bf16
    all-reduce of 4,096 elements a norm weight, 2 a layer and the final norm, 65 on Llama 3
    8B's one stage, each waited for (review m499: one fp32 call, Megatron-LM's
    finalize_model_grads)."""
    report = to_dict(build_report(load_plan(_variant(tmp_path, "dtensor"))))
    (move,) = [m for m in _moves(report, "dp.grads").values() if "partial over tp" in m["name"]]
    assert (move["count"], move["dtype"], move["bytes"]) == (2 * 32 + 1, "bf16", 4096 * 2)
    assert move["exposed_s"] == move["time_s"] > 0 and "FSDP2" in move["overlap_rule"]
    megatron = to_dict(build_report(load_plan(_variant(tmp_path, "megatron"))))
    (theirs,) = [m for m in _moves(megatron, "dp.grads").values() if "partial" in m["name"]]
    assert (theirs["count"], theirs["dtype"]) == (1, "fp32")
    # one call a tensor (review m500): a layernorm's weight and bias, and per-head Q/K norms
    # of head_dim 128, two a layer, partial with or without sequence parallelism
    path = _variant(tmp_path, "dtensor")
    text = path.read_text(encoding="utf-8").replace(
        "attention: flash2", "attention: flash2, norm: layernorm, qk_norm: per_head"
    )
    path.write_text(
        text.replace("  sequence_parallel: true", "  sequence_parallel: false"), encoding="utf-8"
    )
    calls = {
        m["name"]: (m["count"], m["bytes"])
        for m in _moves(to_dict(build_report(load_plan(path))), "dp.grads").values()
    }
    assert calls == {"Q/K norm gradients partial over tp": (2 * 2 * 32, 128 * 2)}


def test_the_search_refuses_what_a_plan_refuses_beside_dtensor(tmp_path: Path) -> None:
    """Review m498: the refusals skipped a search's seed, whose layout the sweep replaces,
    but none of them is a layout's: the search priced FP8 GEMMs beside DTensor's styles and
    wrote a plan `budget` then refused."""
    from typer.testing import CliRunner

    from budget.cli import app, route

    path = _variant(tmp_path, "dtensor")
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("  activations: bf16", "  activations: bf16\n  matmul: fp8"))
    result = CliRunner().invoke(app, route(["search", str(path), "--top", "1"]))
    assert result.exit_code == 2 and result.stdout == ""
    assert "$.parallel.tp_style: tp_style: dtensor is not priced beside precision.matmul" in (
        result.stderr
    )
