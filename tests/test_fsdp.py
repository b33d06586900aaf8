"""PyTorch FSDP's mixed precision (ZeRO 3 with fp32 shards gathered in bf16): the gradient
passes it runs in place of a main-gradient accumulation, the format its gradients cross
the data-parallel group in (``precision.grad_reduce``), and what they hold, checked by hand
against torch 2.1.0's ``torch/distributed/fsdp`` (`flops.fsdp_gradient_passes`).

The plan is the MPT 13B run of the accuracy table on 8 H100s (llm-foundry): 40 layers,
d_model 5120, a GELU MLP of 4 x 5120 with biases, LayerNorm. Its MLP block holds
fc1 5120 x 20480 + bias 20480, fc2 20480 x 5120 + bias 5120 and the norm's 2 x 5120:
209,751,040 parameters.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from budget import flops
from budget.accuracy import RUNS
from budget.errors import BudgetError
from budget.phases import Phase
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Plan
from budget.report import to_dict
from budget.step import derive

MLP = 5120 * 20480 + 20480 + 20480 * 5120 + 5120 + 2 * 5120


def _tree(**precision: str) -> dict[str, Any]:
    (run,) = [r for r in RUNS if r.name == "MPT 13B, 8 GPUs"]
    tree = copy.deepcopy(run.tree)
    tree.pop("name")
    tree["precision"].update(precision)
    return tree


def _plan(tmp_path: Path, **precision: str) -> Plan:
    path = tmp_path / "mpt13b.yaml"
    path.write_text(yaml.safe_dump(_tree(**precision)), encoding="utf-8")
    return load_plan(path)


def _phase(plan: Plan, name: str) -> Phase:
    return next(p for p in derive(plan).stages[0].phases if p.name == name)


def test_mlp_block_count_is_the_module_docstrings() -> None:
    assert MLP == 209_751_040


def test_fp32_reduce_passes_by_hand(tmp_path: Path) -> None:
    """fp32 shards, bf16 compute, fp32 reduce over 8 ranks, per parameter of the unit:
    split backward's concatenation reads and writes bf16 (4 B), the cast to fp32 reads 2
    and writes 4 (6 B), the in-place pre-divide by 4 reads and writes fp32 (8 B): 18 B,
    three kernels. On the 1/8 shard: the post-divide by 2 (8 B) and the addition into the
    kept fp32 shard (read both, write one: 12 B), no cast: 20 B of a shard, two kernels."""
    plan = _plan(tmp_path)
    whole, shard = flops.fsdp_gradient_passes(plan, 1_000_000, 8)
    assert (whole.bytes, whole.launches) == (18_000_000, 3)
    assert (shard.bytes, shard.launches) == (20 * 125_000, 2)


def test_bf16_reduce_passes_by_hand(tmp_path: Path) -> None:
    """``grad_reduce: bf16`` (Composer 0.15.1 to 0.16.3's DEFAULT): no cast before the
    reduce-scatter, the pre-divide on bf16 (4 B): 8 B, two kernels; on the shard the
    post-divide (4 B), the cast to the fp32 parameters (2 + 4 B) and the addition (12 B):
    22 B of a shard, three kernels. On 2 ranks the post-divide factor is 1: no pass."""
    plan = _plan(tmp_path, grad_reduce="bf16")
    whole, shard = flops.fsdp_gradient_passes(plan, 1_000_000, 8)
    assert (whole.bytes, whole.launches) == (8_000_000, 2)
    assert (shard.bytes, shard.launches) == (22 * 125_000, 3)
    _, pair = flops.fsdp_gradient_passes(plan, 1_000_000, 2)
    assert (pair.bytes, pair.launches) == (18 * 500_000, 2)


def test_backward_block_takes_fsdp_passes_not_a_main_gradient(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    works = {w.name: w for w in _phase(plan, "backward.mlp").works}
    assert "main-grad accumulation" not in works
    assert works["gradient flattening, cast and pre-divide (FSDP)"].bytes == 18 * MLP
    assert works["sharded gradient post-divide and accumulation (FSDP)"].bytes == 20 * (
        -(-MLP // 8)
    )


def test_optimizer_zeroes_no_gradients_under_fsdp(tmp_path: Path) -> None:
    """FSDP's optimizer drops its gradients (``zero_grad(set_to_none=True)``)."""
    works = {w.name: w.bytes for w in _phase(_plan(tmp_path), "optimizer").works}
    assert works["zero main gradients"] == 0


def test_tied_embedding_gradients_are_summed_not_passed_twice(tmp_path: Path) -> None:
    """One stage holds the embedding and the tied output layer: the shared parameter's
    flat-gradient passes are the loss's (50368 x 5120 parameters); the embedding's backward
    adds its gradient to the output layer's, reading both and writing one in bf16."""
    plan = _plan(tmp_path)
    vocab = 50368 * 5120
    loss = {w.name: w.bytes for w in _phase(plan, "loss").works}
    assert loss["gradient flattening, cast and pre-divide (FSDP)"] == 18 * vocab
    embedding = {w.name: w.bytes for w in _phase(plan, "backward.embedding").works}
    assert embedding == {
        "embedding lookup backward": embedding["embedding lookup backward"],
        "tied embedding gradients summed (FSDP)": 3 * 2 * vocab,
    }


@pytest.mark.parametrize(("reduce", "size"), [(None, 4), ("bf16", 2)])
def test_reduce_scatter_crosses_in_grad_reduce(
    tmp_path: Path, reduce: str | None, size: int
) -> None:
    """The MLP block's reduce-scatter sends the format ``grad_reduce`` names, else the
    gradients' (fp32)."""
    plan = _plan(tmp_path, **({"grad_reduce": reduce} if reduce else {}))
    report = to_dict(build_report(plan))
    mlp = next(p for p in report["phases"] if p["name"] == "backward.mlp")
    (rs,) = [c for c in mlp["collectives"] if c["op"] == "reduce-scatter"]
    assert (rs["dtype"], rs["bytes"]) == (reduce or "fp32", size * MLP)


@pytest.mark.parametrize(("reduce", "per_param"), [(None, 2 + 4), ("bf16", 2)])
def test_whole_gradients_are_the_computed_and_the_cast(
    tmp_path: Path, reduce: str | None, per_param: int
) -> None:
    """Before the reduce-scatter FSDP holds autograd's bf16 flat gradient and, with an fp32
    reduce, its fp32 cast beside it (2 + 4 B a parameter)."""
    plan = _plan(tmp_path, **({"grad_reduce": reduce} if reduce else {}))
    phase = _phase(plan, "backward.mlp")
    sizes = {a.name: a.total for i in phase.instants for a in i.live}
    assert sizes["gradients before reduce-scatter"] == per_param * MLP


def test_a_megatron_plan_keeps_its_main_gradient() -> None:
    """bf16 parameters with an fp32 master (Megatron-LM's mixed precision) are not FSDP's:
    the main-gradient accumulation stays (8 B a parameter)."""
    plan = load_plan(Path(__file__).parents[1] / "plans" / "gpt3-175b.yaml")
    assert not flops.fsdp_mixed(plan)
    names = [w.name for w in _phase(plan, "backward.mlp").works]
    assert "main-grad accumulation" in names
    assert not any("FSDP" in n for n in names)


def test_bad_grad_reduce_is_refused_at_its_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_tree(grad_reduce="fp64")), encoding="utf-8")
    with pytest.raises(BudgetError) as err:
        load_plan(path)
    assert [p.path for p in err.value.problems] == ["$.precision.grad_reduce"]


def test_each_gather_casts_its_shard_first(tmp_path: Path) -> None:
    """Before each all-gather FSDP casts the unit's fp32 shard to bf16 (read 4 B, write 2
    B of each of the 1/8 of the parameters): in the MLP's forward and again before the
    backward's re-gather; the root unit (embedding and tied output layer, 50368 x 5120,
    the learned position table, 2048 x 5120, and the final norm's 2 x 5120) once per
    micro-batch, as FSDP keeps it gathered."""
    plan = _plan(tmp_path)
    name = "parameter shard cast before its gather (FSDP)"
    for phase in ("forward.mlp", "backward.mlp"):
        works = {w.name: w.bytes for w in _phase(plan, phase).works}
        assert works[name] == 6 * -(-MLP // 8)
    embedding = {w.name: w.bytes for w in _phase(plan, "forward.embedding").works}
    assert embedding[name] == 6 * -(-(50368 * 5120 + 2048 * 5120 + 2 * 5120) // 8)
    assert name not in {w.name for w in _phase(plan, "backward.embedding").works}
