"""DeepSeek-V3's multi-token prediction module (arXiv 2412.19437, section 2.2) as
Megatron-Core trains it, against hand calculations from the released weights' shapes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from budget import flops
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
parallel: {{tp: {tp}, pp: {pp}, dp: 2, ep: 2, sequence_parallel: {sp}{split}}}
recompute: full
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


def _plan(
    tmp_path: Path,
    model: str = "{preset: deepseek-v3}",
    tp: int = 8,
    pp: int = 1,
    sp: bool = True,
    name: str = "plan.yaml",
):
    split = ", pipeline: {layers_per_stage: [31, 30]}" if pp == 2 else ""
    text = TRAIN.format(
        model=model,
        tp=tp,
        pp=pp,
        sp=str(sp).lower(),
        split=split,
        batch=8 if pp == 2 else 2,
        nodes=2 * pp * tp // 8 or 1,
    )
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_plan(path)


def _without_mtp(plan):
    return replace(plan, model=replace(plan.model, mtp_layers=0))


def test_one_module_by_hand_and_the_model_card() -> None:
    """11,610,067,968 parameters by hand (above); with its own copies of the embedding and
    the output layer it is 13.46 B, the model card's "14B of MTP module weights" of 685B."""
    assert MODULE == 11_610_067_968
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
    """tp 8 with sequence parallelism, 4096 tokens: the projection is 2 x 4096 x 2·7168 x
    7168/8 FLOPs forward; the embedding of the next tokens is reduce-scattered, the 2·hidden
    input gathered, the hidden-sharded output gathered (2 B x 4096 x width each); the head
    repeats the main one's output layer and cross-entropy."""
    plan = _plan(tmp_path)
    (stage,) = derive(plan).stages
    phases = {p.name: p for p in stage.phases}
    mtp = phases["mtp"]
    assert mtp.count == plan.microbatches == 1
    works = {w.name: w for w in mtp.works}
    assert works[flops.MTP_PROJECTION].flops == 2 * 4096 * 2 * H * (H // 8)
    assert works[f"{flops.MTP_PROJECTION} backward"].flops == 2 * works[flops.MTP_PROJECTION].flops
    assert works["output layer"].flops == phases["loss"].works[1].flops
    moves = {m.name: m for m in mtp.moves}
    token = 2 * 4096
    assert moves["multi-token prediction embedding output"].op == "reduce-scatter"
    assert moves["multi-token prediction embedding output"].size_bytes == token * H
    assert moves[f"{flops.MTP_PROJECTION} input"].size_bytes == token * 2 * H
    assert moves["multi-token prediction projection output"].op == "all-gather"
    assert moves["multi-token prediction projection output"].size_bytes == token * H
    assert moves[f"{flops.MTP_PROJECTION} input gradient"].op == "reduce-scatter"
    assert moves["cross-entropy statistics"].count == 3
    # windows name kernels of this phase
    kernels = set(works)
    assert all(m.window in kernels for m in mtp.moves if m.window)
    # without sequence parallelism (a dense model: MoE under tp needs it) the embedding and
    # the input gradient are all-reduced, and the input needs no gather
    dense = tmp_path / "dense.yaml"
    dense.write_text(
        TRAIN.format(
            model="{preset: llama3-8b, mtp_layers: 1}",
            tp=8,
            pp=1,
            sp="false",
            split="",
            batch=2,
            nodes=2,
        ).replace(", ep: 2", ""),
        encoding="utf-8",
    )
    (phase,) = [p for p in derive(load_plan(dense)).stages[0].phases if p.name == "mtp"]
    plain = {m.name: m for m in phase.moves}
    assert plain["multi-token prediction embedding output"].op == "all-reduce"
    assert plain[f"{flops.MTP_PROJECTION} input gradient"].op == "all-reduce"
    assert f"{flops.MTP_PROJECTION} input" not in plain


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
    names = [p.name for p in stage.phases]
    assert names.index("loss") + 1 == names.index("mtp")


def test_model_flops_count_the_module(tmp_path: Path) -> None:
    """Per token: 6 x (its layer with 8 of 256 experts, eh_proj, its norms and one more
    output layer) + 3 x 2 x 128 heads x (192 + 128) x 4096 for its attention products."""
    plan = _plan(tmp_path)
    active = MODULE - EXPERTS + EXPERTS * 8 // 256 + V * H
    extra = flops.model_flops_per_token(plan) - flops.model_flops_per_token(_without_mtp(plan))
    assert extra == 6 * active + 3 * 2 * 128 * (192 + 128) * 4096


def test_serving_runs_no_module(tmp_path: Path) -> None:
    """The module is a draft head for speculative decoding, which is not priced: a decode
    plan of the preset is the same with mtp_layers 0."""
    text = TRAIN.format(
        model="{preset: deepseek-v3}", tp=8, pp=1, sp="false", split="", batch=2, nodes=2
    )
    text = text.replace(
        "batch: {seq: 4096, micro: 1, global: 2}",
        "mode: decode\nbatch: {sequences: 64, prompt: 1024, generate: 256}",
    )
    text = text.replace("recompute: full\n", "")
    path = tmp_path / "serve.yaml"
    path.write_text(text, encoding="utf-8")
    plan = load_plan(path)
    assert plan.model.mtp_layers == 1 and mtp_layers(plan) == 0
    assert to_dict(build_report(plan)) == to_dict(build_report(_without_mtp(plan)))
