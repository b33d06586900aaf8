"""Rules a plan's problems were once held back from, or that one mode skipped, each said in
the first run beside the others (an audit, m443)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from budget.cli import app, route


def _errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, route(["validate", str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    return [line.split(": error: ", 1)[1] for line in result.stderr.splitlines()]


def test_a_serving_plans_tp_overlap_stays_in_one_nvlink_domain(tmp_path: Path) -> None:
    """Transformer Engine's userbuffers run within one NVLink domain in any mode; a decode
    plan at tp 16 over two DGX H100 nodes was accepted and priced its all-gathers hidden,
    where the same layout in training is refused."""
    errors = _errors(
        tmp_path,
        "mode: decode\nmodel: {preset: llama3-70b}\n"
        "batch: {sequences: 16, prompt: 2048, generate: 256}\n"
        "precision: {params: bf16, activations: bf16}\n"
        "parallel: {tp: 16, pp: 1, dp: 1, sequence_parallel: true}\n"
        "overlap: {tp: true}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 2}\n",
    )
    assert len(errors) == 1 and errors[0].startswith(
        "$.overlap.tp: tp 16 spans 2 nvlink domains of 8, where Transformer Engine's"
    )


def test_a_training_plans_broken_preset_model_holds_back_no_precision_rule(
    tmp_path: Path,
) -> None:
    """A misspelt mlp beside a preset hid both precision problems of a training plan; only a
    serving plan's precision reads the model (a release's stored weight format)."""
    errors = _errors(
        tmp_path,
        "mode: train\nmodel: {preset: llama3-8b, attention: flash2, mlp: swiglue}\n"
        "batch: {seq: 4096, micro: 1, global: 8}\n"
        "precision: {params: fp32, master: fp32, optimizer: none}\n"
        "parallel: {tp: 1, pp: 1, dp: 8}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n",
    )
    assert [e.split(":")[0] for e in errors] == [
        "$.model.mlp",
        "$.precision.master",
        "$.precision.optimizer",
    ]


def test_interleaving_over_two_stages_says_both_of_its_needs(tmp_path: Path) -> None:
    """Without virtual stages and without overlap.pp, interleaving over pp 2 said the first
    need, then the second once the first was mended: Megatron-LM refuses pp 2 without
    overlapped sends whatever the chunks."""
    errors = _errors(
        tmp_path,
        "mode: train\nmodel: {preset: llama3-8b}\nbatch: {seq: 8192, micro: 1, global: 24}\n"
        "precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, "
        "activations: bf16}\n"
        "parallel: {tp: 4, pp: 2, dp: 1, sequence_parallel: true, "
        "pipeline: {schedule: interleaved}}\n"
        "recompute: full\ndevice: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n",
    )
    assert len(errors) == 2
    assert errors[0].startswith("$.parallel.pipeline.schedule: the interleaved schedule needs")
    assert errors[1].startswith(
        "$.parallel.pipeline.schedule: the interleaved schedule over pp = 2 stages needs "
        "overlap.pp: true"
    )
