"""DeepSeek-V3's multi-token prediction module (arXiv 2412.19437, section 2.2) as
Megatron-Core trains it, against hand calculations from the released weights' shapes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from budget import flops
from budget.errors import BudgetError
from budget.layers import class_params, mtp_layers, mtp_total, stage_classes
from budget.pipeline import build_report
from budget.plan.hf_config import IGNORED, translate
from budget.plan.load import load_plan
from budget.report import to_dict
from budget.step import derive

DATA = Path(__file__).parent / "data"

TRAIN = """\
name: deepseek-v3-mtp
model: {model}
batch: {{seq: 4096, micro: 1, global: {batch}}}
parallel: {{tp: {tp}, pp: {pp}, dp: 2{ep}, sequence_parallel: {sp}{split}}}
recompute: {recompute}
device: {{preset: h100-sxm}}
topology: {{preset: dgx-h100, nodes: {nodes}}}
"""

H, V = 7168, 129280
# One MTP module of DeepSeek-V3 besides the embedding and output layer it shares, from the
# shapes of model.layers.61.* in the released checkpoint (configuration: hidden 7168, MLA
# query rank 1536, kv rank 512, 128 heads of 128 + 64 rotary, value 128, 256 experts and one
# shared of width 2048):
ATTENTION = (
    H * 1536  # q_a_proj
    + 1536  # q_a_layernorm
    + 1536 * 128 * 192  # q_b_proj
    + H * (512 + 64)  # kv_a_proj_with_mqa
    + 512  # kv_a_layernorm
    + 512 * 128 * (128 + 128)  # kv_b_proj
    + 128 * 128 * H  # o_proj
)
EXPERTS = 256 * 3 * H * 2048
MODULE = (
    ATTENTION
    + 2 * H  # input_layernorm, post_attention_layernorm
    + 256 * H  # router
    + EXPERTS
    + 3 * H * 2048  # shared expert
    + 2 * H * H  # eh_proj
    + 3 * H  # enorm, hnorm, shared_head.norm
)


def _text(
    model: str = "{preset: deepseek-v3}",
    tp: int = 8,
    pp: int = 1,
    sp: bool = True,
    recompute: str = "full",
) -> str:
    """A training plan on 2 x pp x tp H100s; DeepSeek-V3 (the default) with ep 2 and its 61
    layers split 31 + 30 over two stages, a dense model without experts."""
    moe = "deepseek-v3" in model
    split = ", pipeline: {layers_per_stage: [31, 30]}" if pp == 2 and moe else ""
    return TRAIN.format(
        model=model,
        tp=tp,
        pp=pp,
        ep=", ep: 2" if moe else "",
        sp=str(sp).lower(),
        split=split,
        recompute=recompute,
        batch=8 if pp == 2 else 2,
        nodes=2 * pp * tp // 8 or 1,
    )


def _plan(tmp_path: Path, name: str = "plan.yaml", **plan: Any):
    path = tmp_path / name
    path.write_text(_text(**plan), encoding="utf-8")
    return load_plan(path)


def _without_mtp(plan):
    return replace(plan, model=replace(plan.model, mtp_layers=0))


def test_one_module_by_hand_and_the_model_card(tmp_path: Path) -> None:
    """11,610,067,968 parameters by hand (above); with its own copies of the embedding and
    the output layer (model.layers.61.embed_tokens and .shared_head.head, each V x H) it is
    13.46 B, the model card's "14B of MTP module weights" of 685B. The card (DeepSeek-V3 on
    Hugging Face: "685B, which includes 671B of the Main Model weights and 14B of the
    Multi-Token Prediction (MTP) Module weights") gives 14B as 685B − 671B, two figures
    rounded to the billion, so it stands for anything within a billion or so of 14B; 4 %
    is 0.56 B (13.46 B is 3.8 % under it)."""
    assert MODULE == 11_610_067_968
    plan = _plan(tmp_path)
    with_copies = mtp_total(plan) + 2 * V * H  # 11,610,067,968 + 2 x 926,679,040
    assert with_copies == MODULE + 2 * 129280 * 7168 == 13_463_426_048
    assert with_copies == pytest.approx(14e9, rel=0.04)
    config = json.loads((DATA / "hf" / "deepseek-v3" / "config.json").read_text())
    model = translate(config).tree
    assert model["mtp_layers"] == 1
    assert "num_nextn_predict_layers" not in IGNORED


def test_the_preset_counts_the_module_apart(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert mtp_total(plan) == MODULE
    report = build_report(plan)
    assert report.model["mtp_layers"] == 1
    assert report.model["mtp_params"] == MODULE
    assert report.model["params_total"] == 671_026_404_352  # the main model, as before


def test_the_last_stage_holds_the_module_and_a_copy_of_the_embedding(tmp_path: Path) -> None:
    """pp 2 split 31 + 30: the first stage has the 3 dense and 28 MoE layers; the last its
    30 MoE layers and the module's MoE layer (the kind of the model's last layer). Its rank
    holds one more layer, eh_proj / tp 8 = 12,845,056, three norms, and the word embedding
    / tp = 115,834,880 (the output layer is not tied, so the module's lookups need a copy)."""
    plan = _plan(tmp_path, pp=2)
    first, last = stage_classes(plan)
    assert (first.dense, first.moe) == (3, 28)
    assert (last.dense, last.moe) == (0, 31)
    plain = _without_mtp(plan)
    assert stage_classes(plain)[1].moe == 30
    with_mtp, without = class_params(plan, last), class_params(plain, stage_classes(plain)[1])
    layer = class_params(plan, replace(last, last=False, moe=1))
    extra = (with_mtp.per_rank + with_mtp.expert_per_rank) - (
        without.per_rank + without.expert_per_rank
    )
    one_layer = layer.per_rank + layer.expert_per_rank
    assert extra == one_layer + 2 * H * H // 8 + 3 * H + V * H // 8
    assert with_mtp.total - without.total == MODULE + V * H
    # the two copies of the embedding are kept in step after the backward
    grads = [p for s in derive(plan).stages for p in s.phases if p.name == "embedding.grads"]
    assert len(grads) == 2
    (move,) = grads[0].moves
    assert (move.name, move.group, move.size_bytes) == (
        "shared embedding grads",
        "pp",
        4 * V * H // 8,
    )


def test_the_module_runs_its_projection_and_head_per_microbatch(tmp_path: Path) -> None:
    """V3, tp 8 with sequence parallelism and full recompute, 4096 tokens (512 per rank
    along the sequence), 2-byte activations, hidden 7168, vocab 129280 / 8 = 16160 a rank:

    - the next tokens' lookup writes and reads 2 x 2 x 4096 x 7168 B, the other vocabulary
      shards' rows zeroed (a masked fill over it and its 4,096-byte mask) and the
      sequence-parallel clone (2 x 2 x 512 x 7168 B), `flops.embedding_output`; the two
      norms 2 x 2 x 2 x 512 x 7168 B; the
      projection 2 x 4096 x 14336 x 896 FLOPs; full recompute runs the norms and the
      projection again (not the embedding's kernels), and each has a backward;
    - the output layer and cross-entropy repeat the main head's kernels;
    - gradients added into fp32 main gradients: the output layer and the embedding, 2 x
      16160 x 7168, and the projection and norms, 7168 x 14336 / 8 + 3 x 7168, read and
      written: 8 B x 244,536,320;
    - moves, each S = the full tensor: the lookup reduce-scattered and its gradient
      gathered (2 x 4096 x 7168 B); the 2·hidden input gathered for the projection and for
      its recomputation, again for its weight gradient, and its gradient reduce-scattered
      (2 x 4096 x 14336 B); the hidden-sharded output gathered, again when recomputed, and
      its gradient gathered along the sequence; the head's statistics and input moves."""
    plan = _plan(tmp_path)
    (stage,) = derive(plan).stages
    phases = {p.name: p for p in stage.phases}
    mtp = phases["mtp"]
    assert mtp.count == plan.microbatches == 1
    proj, norms = flops.MTP_PROJECTION, "multi-token prediction norms"
    lookup = 2 * 2 * 4096 * H
    f = 2 * 4096 * 2 * H * (H // 8)
    main = [(w.name, w.flops, w.bytes) for w in phases["loss"].works[:-1]]
    works = [(w.name, w.flops, w.bytes) for w in mtp.works]
    accumulate = 8 * (2 * 16160 * H + 2 * H * H // 8 + 3 * H)
    assert [(n, b) for n, _, b in works[:5]] == [
        ("embedding lookup", lookup),
        (flops.EMBEDDING_MASKED, 2 * 2 * 4096 * H + 4096),
        (flops.EMBEDDING_CLONE, 2 * 2 * 512 * H),
        (norms, 2 * 2 * 2 * 512 * H),
        (proj, 2 * (4096 * 2 * H + 2 * H * 896 + 4096 * 896)),
    ]
    assert works[4][1] == f
    assert [n for n, _, _ in works[5:12]] == [
        f"{norms} (recomputed)",
        f"{proj} (recomputed)",
        "embedding lookup backward",
        f"{flops.EMBEDDING_MASKED} backward",
        f"{flops.EMBEDDING_CLONE} backward",
        f"{norms} backward",
        f"{proj} backward",
    ]
    assert works[11][1] == 2 * f and works[7][2] == 2 * lookup
    assert works[12:-1] == main
    assert works[-1][0] == "main-grad accumulation" and works[-1][2] == accumulate
    token = 2 * 4096
    moves = {m.name: (m.op, m.size_bytes, m.count) for m in mtp.moves}
    wide, narrow = token * 2 * H, token * H
    assert moves == {
        "multi-token prediction embedding output": ("reduce-scatter", narrow, 1),
        "multi-token prediction embedding output gradient": ("all-gather", narrow, 1),
        f"{proj} input": ("all-gather", wide, 1),
        f"{proj} input (recomputed forward)": ("all-gather", wide, 1),
        "multi-token prediction projection output": ("all-gather", narrow, 1),
        "multi-token prediction projection output (recomputed)": ("all-gather", narrow, 1),
        "multi-token prediction projection output gradient": ("all-gather", narrow, 1),
        f"{proj} input again, for weight grad": ("all-gather", wide, 1),
        f"{proj} input gradient": ("reduce-scatter", wide, 1),
        "cross-entropy statistics": ("all-reduce", 4 * 4096, 3),
        "output layer input": ("all-gather", narrow, 1),
        "output layer input again, for weight grad": ("all-gather", narrow, 1),
        "output layer input gradient": ("reduce-scatter", narrow, 1),
    }
    kernels = {w.name for w in mtp.works}
    assert all(m.window in kernels for m in mtp.moves if m.window)
    # full recompute keeps 3 hidden-wide tensors a token (2 B x 512 tokens x 7168)
    (saved,) = [a for a in mtp_live(stage) if a.name.startswith("multi-token")]
    assert saved.bytes == 3 * 2 * 512 * H


def test_two_modules_without_sequence_parallelism(tmp_path: Path) -> None:
    """Llama 3 8B with two modules, tp 8 without sequence parallelism (a dense model: MoE
    under tp needs it), no recompute: two module passes a micro-batch; the lookup and the
    projection's input gradient are all-reduced, only the output is gathered; each module
    keeps 6 hidden-wide tensors a token, 2 x 6 x 2 B x 4096 x 4096 in all."""
    dense = {"model": "{preset: llama3-8b, mtp_layers: 2}", "sp": False}
    plan = _plan(tmp_path, "dense.yaml", recompute="none", **dense)
    (stage,) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "mtp"]
    assert phase.count == 2 * plan.microbatches
    token = 2 * 4096
    moves = {m.name: (m.op, m.size_bytes) for m in phase.moves}
    assert moves == {
        "multi-token prediction embedding output": ("all-reduce", token * 4096),
        "multi-token prediction projection output": ("all-gather", token * 4096),
        f"{flops.MTP_PROJECTION} input gradient": ("all-reduce", token * 2 * 4096),
        "cross-entropy statistics": ("all-reduce", 4 * 4096),
        "output layer input gradient": ("all-reduce", token * 4096),
    }
    assert not [w for w in phase.works if "recomputed" in w.name]
    (saved,) = [a for a in mtp_live(stage) if a.name.startswith("multi-token")]
    assert saved.bytes == 2 * 6 * 2 * 4096 * 4096
    (kept,) = [a for a in phase.instants[0].live if a.name.startswith("softmax")]
    assert kept.count == 1  # the second module's head holds the first's
    # full recompute re-gathers the projection's output; its input needs no gather
    full = _plan(tmp_path, "full.yaml", recompute="full", **dense)
    (again,) = [p for p in derive(full).stages[0].phases if p.name == "mtp"]
    names = {m.name for m in again.moves}
    assert "multi-token prediction projection output (recomputed)" in names
    assert not [n for n in names if "recomputed forward" in n]


def test_tied_embeddings_on_the_last_stage_and_learned_positions_refused(tmp_path: Path) -> None:
    """pp 2: with a tied output layer the last stage's copy already is the word embedding,
    so no second copy. Learned positions are refused with the modules, as Megatron-LM
    refuses them (the modules embed tokens shifted by one position)."""
    model = "{preset: llama3-8b, mtp_layers: 1, tied_embeddings: true}"
    plan = _plan(tmp_path, "tied.yaml", model=model, pp=2)
    last = dict(class_params(plan, stage_classes(plan)[-1]).parts)
    assert "word embedding (copy for multi-token prediction)" not in last
    assert last["output layer (tied copy)"] == 128256 * 4096 // 8
    with pytest.raises(BudgetError) as caught:
        _plan(
            tmp_path,
            "learned.yaml",
            model=model.replace("tied_embeddings: true", "position: learned"),
            pp=2,
        )
    (problem,) = caught.value.problems
    assert problem.path == "$.model.mtp_layers"
    assert "learned" in problem.message


def test_the_main_head_peaks_with_the_module_softmax_kept(tmp_path: Path) -> None:
    """The module's cross-entropy runs first and keeps its fp32 softmax (4 B x 4096 x
    129280/8) for the backward, so the main head's instant holds it too."""
    plan = _plan(tmp_path)
    (stage,) = derive(plan).stages
    phases = {p.name: p for p in stage.phases}
    logits = 4096 * -(-V // 8)
    (kept,) = [a for a in phases["loss"].instants[0].live if a.name.startswith("softmax")]
    assert (kept.bytes, kept.count) == (4 * logits, 1)
    assert not [a for a in phases["mtp"].instants[0].live if a.name.startswith("softmax")]
    plain = derive(_without_mtp(plan)).stages[0]
    assert "mtp" not in [p.name for p in plain.phases]
    # the module's head runs first, as its softmax in the main head's peak says
    names = [p.name for p in stage.phases]
    assert names.index("mtp") + 1 == names.index("loss")


def test_model_flops_count_the_module(tmp_path: Path) -> None:
    """Per token: 6 x (its layer with 8 of 256 experts, eh_proj, its norms and one more
    output layer) + 3 x 2 x 128 heads x (192 + 128) x 4096 for its attention products."""
    plan = _plan(tmp_path)
    active = MODULE - EXPERTS + EXPERTS * 8 // 256 + V * H
    extra = flops.model_flops_per_token(plan) - flops.model_flops_per_token(_without_mtp(plan))
    assert extra == 6 * active + 3 * 2 * 128 * (192 + 128) * 4096


def test_model_flops_of_the_module_keep_what_a_capacity_keeps(tmp_path: Path) -> None:
    """At capacity 0.5 the module's MoE layer computes 4 of its 8 assignments a token, as
    the main model's do: its model FLOPs drop by 6 x 4 experts' weights (an audit: the
    module kept all 8 while the main model's layers dropped half)."""
    plan = _plan(tmp_path)
    halved = replace(
        plan, model=replace(plan.model, experts=replace(plan.model.experts, capacity_factor=0.5))
    )
    module = flops.model_flops_per_token(plan) - flops.model_flops_per_token(_without_mtp(plan))
    kept = flops.model_flops_per_token(halved) - flops.model_flops_per_token(_without_mtp(halved))
    assert module - kept == 6 * EXPERTS * 4 // 256


def test_serving_runs_no_module(tmp_path: Path) -> None:
    """The module is a draft head for speculative decoding, which is not priced: a decode
    plan of the preset is the same with mtp_layers 0."""
    text = _text(sp=False).replace(
        "batch: {seq: 4096, micro: 1, global: 2}",
        "mode: decode\nbatch: {sequences: 64, prompt: 1024, generate: 256}",
    )
    text = text.replace("recompute: full\n", "")
    path = tmp_path / "serve.yaml"
    path.write_text(text, encoding="utf-8")
    plan = load_plan(path)
    assert plan.model.mtp_layers == 1 and mtp_layers(plan) == 0
    assert to_dict(build_report(plan)) == to_dict(build_report(_without_mtp(plan)))


def mtp_live(stage):
    """What is alive at the module's own cross-entropy."""
    (phase,) = [p for p in stage.phases if p.name == "mtp"]
    return phase.instants[0].live


@pytest.mark.parametrize("modules", [1, 2, 3])
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_a_pipeline_with_modules_is_never_shorter_than_its_work(
    tmp_path: Path, modules: int, schedule: str
) -> None:
    """The modules' layers are counted in the last stage's layer phases and run in its last
    chunk: the step's compute, exposed communication and bubble add up to it (less the
    optimizer step the last stage, the modules on it, runs beside the next step's fill),
    the bubble is no less than nothing (a fuzzing audit: at 2 modules the replay left them out, the
    step 11.9 ms against 12.9 ms of compute, its bubble -1.40 ms)."""
    virtual = ", pipeline: {schedule: interleaved, virtual_stages: 2}" if schedule != "1f1b" else ""
    path = tmp_path / "small.yaml"
    path.write_text(
        f"model: {{layers: 8, hidden: 1024, heads: 8, vocab: 32000, mtp_layers: {modules}}}\n"
        "batch: {seq: 512, micro: 1, global: 4}\n"
        f"parallel: {{pp: 2{virtual}}}\n"
        "device: {preset: h100-sxm}\n"
        "topology: {preset: dgx-h100, gpus: 2}\n" + ("overlap: {pp: true}\n" if virtual else ""),
        # interleaving over 2 stages needs its sends overlapped (Megatron-LM's rule)
        encoding="utf-8",
    )
    step = to_dict(build_report(load_plan(path)))["step"]
    assert step["bubble_s"] >= 0
    waited = step["compute_s"] + step["exposed_comm_s"] + step["bubble_s"]
    assert waited - step["drained_s"] - step["filled_s"] == pytest.approx(step["time_s"])


def test_full_recompute_keeps_no_checkpoint_of_the_modules_own_layer(tmp_path: Path) -> None:
    """An audit: Megatron-Core checkpoints each whole module under full recompute
    (``MultiTokenPredictionLayer`` runs ``_proj_and_transformer_layer`` under
    ``_checkpointed_forward``), which keeps its two inputs, and the output layer its own:
    three hidden-size tensors, and no input of the module's transformer layer, which had
    been counted as one more of the stage's layers (4,096 x 7,168 x 2 B / tp 8 a micro-batch).
    Selective recompute keeps that layer's tensors as any layer's."""
    full = _plan(tmp_path, recompute="full")
    unit = 2 * 4096 * H // 8  # a hidden-size tensor, sequence-sharded over tp 8

    def loss_live(plan):
        (stage,) = derive(plan).stages
        (loss,) = [p for p in stage.phases if p.name == "loss"]
        return {a.name: a.total for a in loss.instants[0].live}

    with_module, without = loss_live(full), loss_live(_without_mtp(full))
    carried = "saved activations of the micro-batches in flight"
    assert with_module[carried] == without[carried] == 61 * unit
    inputs = "multi-token prediction inputs (norms, projection, output layer)"
    assert with_module[inputs] == 3 * unit
    selective = _plan(tmp_path, "selective.yaml", recompute="selective")
    kept, plain = loss_live(selective), loss_live(_without_mtp(selective))
    assert kept[carried] > plain[carried]
    # without full recompute six inputs a module, and its layer's input is a slice of the
    # projection's output all-gathered over tp 8, which the slice keeps whole: 7 shards
    # more (an audit, m466: Megatron-Core's split returns a view, not a copy)
    assert kept[inputs] == (6 + 7) * unit


def test_the_report_writes_the_module_apart_from_the_last_stages_layers(tmp_path: Path) -> None:
    """pp 2 split 31 + 30: the stage table's layers read 31 and 31, which summed to 62 of a
    61-layer model, and nothing said the last stage's 31st was the module (a user audit,
    m431); they read "31" and "30 + 1 MTP" in the table and in the markdown."""
    from budget.render import stage_layers

    report = build_report(_plan(tmp_path, pp=2))
    assert [s.layers for s in report.stages] == [31, 31]  # the JSON's count, the module's too
    assert [stage_layers(report, s.stage, s.layers) for s in report.stages] == [
        "31",
        "30 + 1 MTP",
    ]
    without = build_report(_without_mtp(_plan(tmp_path, pp=2)))
    assert [stage_layers(without, s.stage, s.layers) for s in without.stages] == ["31", "30"]
    # the JSON says which of them are modules, and `budget diff` compares the stages' own
    # layers and the modules apart (a user audit, m488: "layers 30 → 31" beside the
    # tables' "30 + 1 MTP" and the model's 61)
    from budget.diff import diff_reports

    stages = to_dict(report)["memory"]["stages"]
    assert [(s["layers"], s["mtp_layers"]) for s in stages] == [(31, 0), (31, 1)]
    compared = diff_reports(without, report)
    (last,) = [r for r in compared.stages if r.key == "1"]
    deltas = {d.metric: (d.a, d.b) for d in last.deltas}
    assert deltas["layers"] == (30, 30) and deltas["mtp_layers"] == (0, 1)


def test_a_split_that_counts_the_mtp_module_is_told_where_the_module_runs(tmp_path) -> None:
    """A DeepSeek-V3 audit (m509): 61 layers over pp 2 were told only that they do not
    divide, and a split that counted the MTP module in it (31 + 31) that it sums to 62; each
    message now says the module runs on the last stage beside its split."""
    path = tmp_path / "split.yaml"
    for split, where, said in (
        (
            "[31, 31]",
            "layers_per_stage",
            "sums to 62 layers but model.layers = 61; the "
            "multi-token prediction (model.mtp_layers = 1) runs on the last stage beside its "
            "split and is not listed in it",
        ),
        (
            None,
            "pp",
            "(of the 61 layers alone: the last stage runs the multi-token "
            "prediction, model.mtp_layers = 1, beside its share)",
        ),
    ):
        text = _text(pp=2)
        text = (
            text.replace("[31, 30]", split)
            if split
            else text.replace(", pipeline: {layers_per_stage: [31, 30]}", "")
        )
        path.write_text(text, encoding="utf-8")
        with pytest.raises(BudgetError) as raised:
            load_plan(path)
        (problem,) = raised.value.problems
        assert problem.path.endswith(where) and said in problem.message
