"""Hybrid sharding (`parallel.dp_shard`): ZeRO's states sharded over a shard group of the
data-parallel ranks, dp / dp_shard copies of them, gradients reduce-scattered within a copy
and the shard all-reduced across copies (PyTorch FSDP's HYBRID_SHARD, FSDP2's 2-D mesh,
Megatron-LM's distributed-optimizer instances), checked by hand.

The FSDP plan is plans/llama3-8b-fsdp.yaml on 16 DGX H100 nodes, dp 128, each node one shard
group (dp_shard 8, 16 copies). Llama 3 8B holds 8,030,261,248 parameters (Meta's count), a
layer 218,112,000 (attention 4096 x (4096 + 2 x 1024) + 4096 x 4096 = 41,943,040, SwiGLU
3 x 4096 x 14336 = 176,160,768, two norms 8,192), the embedding 128,256 x 4096 = 525,336,576
and the head that plus the final norm, 525,340,672.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.plan.model import Parallel
from budget.report import Report, to_dict
from budget.topology import group_ranks
from budget.units import format_duration
from tests.plan_files import ROOT

PARAMS = 8_030_261_248
LAYER = 218_112_000
HEAD = 525_340_672


def _write(tmp_path: Path, source: str, edits: list[tuple[str, str]], name: str) -> Path:
    text = (ROOT / "plans" / source).read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _fsdp(tmp_path: Path, shard: int | None = 8, nodes: int = 16) -> Path:
    dp = 8 * nodes
    lines = f"  dp: {dp}\n" + (f"  dp_shard: {shard}\n" if shard is not None else "")
    edits = [
        ("  dp: 8\n", lines),
        ("nodes: 1}", f"nodes: {nodes}}}"),
        ("global: 8", f"global: {dp}"),
    ]
    return _write(tmp_path, "llama3-8b-fsdp.yaml", edits, f"fsdp-{shard}-{nodes}.yaml")


def _report(path: Path) -> dict[str, Any]:
    return to_dict(build_report(load_plan(path)))


def _collectives(report: dict[str, Any], phase: str) -> dict[str, dict[str, Any]]:
    (found,) = [p for p in report["phases"] if p["name"] == phase]
    return {c["name"]: c for c in found["collectives"]}


def _alloc(report: dict[str, Any], start: str) -> int:
    (stage,) = report["memory"]["stages"]
    (row,) = [a for a in stage["peak_overlap"] if a["tensor"].startswith(start)]
    return int(row["bytes"])


def test_the_shard_group_is_the_fastest_dp_ranks() -> None:
    """tp 2 x dp 8 (dp_shard 4) x pp 2 on 32 ranks: rank r = tp_i + 2·(dp_i + 8·pp_i) and
    dp_i = shard_i + 4·copy_i, so rank 0's shard group is dp_i 0..3 (ranks 0, 2, 4, 6), its
    copies dp_i 0 and 4 (ranks 0 and 8); rank 5 (tp 1, dp 2) is in 1, 3, 5, 7 and 5, 13.
    With cp 2 inside dp, the shard group spans cp too: 2 x 4 ranks 2 apart."""
    par = Parallel(tp=2, dp=8, dp_shard=4, pp=2)
    assert group_ranks("dp", par, 32) == (0, 2, 4, 6, 8, 10, 12, 14)
    assert group_ranks("dp_shard", par, 32) == (0, 2, 4, 6)
    assert group_ranks("dp_replicate", par, 32) == (0, 8)
    assert group_ranks("dp_shard", par, 32, 5) == (1, 3, 5, 7)
    assert group_ranks("dp_replicate", par, 32, 5) == (5, 13)
    par = Parallel(tp=2, cp=2, dp=8, dp_shard=4, pp=2)
    assert group_ranks(("dp_shard", "cp"), par, 64) == tuple(range(0, 16, 2))
    assert group_ranks("dp_replicate", par, 64) == (0, 16)
    # dp first in the order: the shard group is ranks 0..3, and with pp (not adjacent to
    # it once dp is split) a lattice, 16 apart
    par = Parallel(tp=2, dp=8, dp_shard=4, pp=2, order=("dp", "tp", "cp", "ep", "pp"))
    assert group_ranks("dp_shard", par, 32) == (0, 1, 2, 3)
    assert group_ranks("dp_replicate", par, 32) == (0, 4)
    assert group_ranks(("dp_shard", "pp"), par, 32) == (0, 1, 2, 3, 16, 17, 18, 19)


def test_states_are_sharded_over_the_shard_group(tmp_path: Path) -> None:
    """fp32 parameters (4 B) and Adam's two fp32 moments (8 B) of 8,030,261,248 parameters
    over 8 ranks: 1,003,782,656 a rank, 4,015,130,624 B and 8,030,261,248 B, where the
    whole of dp (128) held a sixteenth of that."""
    hybrid = _report(_fsdp(tmp_path))
    assert _alloc(hybrid, "parameters (fp32)") == PARAMS // 8 * 4 == 4_015_130_624
    assert _alloc(hybrid, "Adam moments") == PARAMS // 8 * 8
    flat = _report(_fsdp(tmp_path, None))
    assert _alloc(flat, "Adam moments") == PARAMS // 128 * 8
    assert hybrid["layout"]["dp_shard"] == 8 and flat["layout"]["dp_shard"] is None


def test_layer_reduction_is_a_reduce_scatter_then_an_all_reduce_across_copies(
    tmp_path: Path,
) -> None:
    """Each layer's fp32 gradients, 872,448,000 B, reduce-scattered over the node's 8 ranks
    (ring: 7/8 of them sent, 763,392,000 B, on NVLink), then each rank's shard,
    109,056,000 B, all-reduced across the 16 copies, one rank a node (ring: 2 x 15/16 of
    it sent, 204,480,000 B, in 30 steps of the InfiniBand's α 14 µs at its 47 GB/s:
    0.42 ms + 4.3506 ms). The gathers stay within the node."""
    report = _report(_fsdp(tmp_path))
    moves = _collectives(report, "backward.mlp")
    scatter, across = moves["layer gradients"], moves["layer gradient shards"]
    assert (scatter["op"], scatter["group"], scatter["ranks"]) == ("reduce-scatter", "dp_shard", 8)
    assert scatter["bytes"] == LAYER * 4 and scatter["sent_bytes"] == LAYER * 4 * 7 // 8
    assert scatter["link"] == "nvlink"
    assert (across["op"], across["group"], across["ranks"]) == ("all-reduce", "dp_replicate", 16)
    assert across["bytes"] == LAYER * 4 // 8 == 109_056_000
    assert across["sent_bytes"] == 2 * 15 * 109_056_000 // 16 == 204_480_000
    assert across["link"] == "infiniband" and across["steps"] == 30
    assert across["time_s"] == pytest.approx(30 * 14e-6 + 204_480_000 / 47e9, rel=1e-9)
    # the first layer's pair runs by the embedding's backward (an audit, m454)
    assert across["count"] == scatter["count"] == 31
    first = _collectives(report, "backward.embedding")
    assert first["layer gradients"]["count"] == first["layer gradient shards"]["count"] == 1
    gather = moves["layer parameters"]
    assert (gather["group"], gather["ranks"], gather["link"]) == ("dp_shard", 8, "nvlink")
    # the head's unit too, its shard padded to whole elements of 8 ranks
    head = _collectives(report, "loss")["head gradient shards"]
    assert head["bytes"] == -(-HEAD // 8) * 4


def test_a_shard_group_in_a_node_prices_as_a_node_of_its_own(tmp_path: Path) -> None:
    """The shard group of a node is the 8 GPUs the one-node plan shards over: its gathers
    and reduce-scatters cost what they cost there, to the nanosecond."""
    hybrid = _collectives(_report(_fsdp(tmp_path)), "backward.mlp")
    one_node = _collectives(_report(_fsdp(tmp_path, None, nodes=1)), "backward.mlp")
    for name in ("layer parameters", "layer gradients"):
        assert hybrid[name]["time_s"] == pytest.approx(one_node[name]["time_s"], rel=1e-12)
    assert "layer gradient shards" not in one_node


def test_dp_shard_equal_to_dp_changes_nothing(tmp_path: Path) -> None:
    written = _report(_fsdp(tmp_path, 128))
    default = _report(_fsdp(tmp_path, None))
    written.pop("plan"), default.pop("plan")
    assert written == default


def _megatron_report(tmp_path: Path) -> Report:
    """GPT-3 175B (tp 8, pp 8, dp 16, ZeRO 1: Megatron-LM's distributed optimizer) in 4
    instances of 4 data-parallel ranks."""
    edits = [("  dp: 16\n", "  dp: 16\n  dp_shard: 4\n")]
    return build_report(load_plan(_write(tmp_path, "gpt3-175b.yaml", edits, "gpt3-i.yaml")))


def _megatron(tmp_path: Path) -> dict[str, Any]:
    return to_dict(_megatron_report(tmp_path))


def test_distributed_optimizer_instances(tmp_path: Path) -> None:
    """ZeRO 1 reduce-scatters the stage's fp32 gradient buffer within an instance (4 ranks:
    3/4 of it sent), all-reduces the quarter each rank keeps across the 4 instances (2 x 3/4
    of the quarter), and gathers the updated bf16 parameters within the instance (3/4);
    master weights and moments are sharded 4 ways, the parameters and gradients whole."""
    report = _megatron(tmp_path)
    moves = _collectives(report, "dp.grads")
    scatter, across = moves["gradients"], moves["gradient shards"]
    buffer = scatter["bytes"]
    assert (scatter["group"], scatter["ranks"], scatter["dtype"]) == ("dp_shard", 4, "fp32")
    assert scatter["sent_bytes"] == buffer * 3 // 4
    assert (across["group"], across["ranks"]) == ("dp_replicate", 4)
    assert across["bytes"] == -(-buffer // 4 // 4) * 4
    assert across["sent_bytes"] == pytest.approx(2 * 3 / 4 * buffer / 4, abs=8)
    gather = _collectives(report, "optimizer")["updated parameters"]
    assert (gather["group"], gather["ranks"]) == ("dp_shard", 4)
    assert gather["bytes"] * 2 == buffer  # bf16 parameters, fp32 gradients
    rows = {a.tensor: a for a in _megatron_report(tmp_path).stages[0].peak_overlap}
    params = buffer // 4  # the stage's parameters a rank holds
    assert rows["master weights (fp32)"].bytes == -(-params // 4) * 4
    assert rows["gradients (fp32)"].bytes == params * 4
    assert rows["gradients (fp32)"].placement == "replicated over 16 data-parallel ranks"
    assert rows["master weights (fp32)"].placement == (
        "shard over 4 data-parallel ranks, one of 4 copies"
    )


def test_an_all_reduce_hides_where_its_reduce_scatter_does(tmp_path: Path) -> None:
    """overlap.dp_grads on (the plan's): each layer's all-reduce runs after its
    reduce-scatter behind the next layer's backward, the stage's first layer's (the
    backward's last, 1 of 32) beside the embedding's own backward kernels, which it
    outlasts in part (an audit, m454: it had been exposed whole); its all-reduce then runs
    on FSDP's all-reduce stream beside the root's reduce-scatter, which starts as it does
    and outlasts it, and the root's all-reduce follows both (an audit, m472: the four had
    been added, 1.8 ms a step over two nodes): the phase waits RS₀'s exposed part, the
    root's reduce-scatter and the root's all-reduce. Off, the reduce-scatter and the
    all-reduce wait whole (the ZeRO 1 plan's, which has no overlap, too)."""
    report = _report(_fsdp(tmp_path))
    hidden = _collectives(report, "backward.mlp")
    first = _collectives(report, "backward.embedding")
    for name in ("layer gradients", "layer gradient shards"):
        assert hidden[name]["exposed_s"] == 0
    scatter, shard = first["layer gradients"], first["layer gradient shards"]
    root, root_shard = first["embedding gradients"], first["embedding gradient shards"]
    assert 0 < scatter["exposed_s"] < scatter["time_s"]
    assert shard["time_s"] < root["time_s"] and shard["exposed_s"] == 0  # the case in point
    assert "beside the next reduce-scatter, which hides it too" in shard["overlap_rule"]
    (phase,) = [p for p in report["phases"] if p["name"] == "backward.embedding"]
    waited = scatter["exposed_s"] + root["time_s"] + root_shard["time_s"]
    assert phase["exposed_s"] == pytest.approx(waited, rel=1e-12)
    path = _fsdp(tmp_path)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("dp_grads: true", "dp_grads: false"), encoding="utf-8")
    waited = _collectives(_report(path), "backward.mlp")
    moves = _collectives(_megatron(tmp_path), "dp.grads")
    for found, name in [
        (waited, "layer gradients"),
        (waited, "layer gradient shards"),
        (moves, "gradients"),
        (moves, "gradient shards"),
    ]:
        assert found[name]["exposed_s"] == pytest.approx(found[name]["time_s"], rel=1e-12)


def test_context_parallel_shard_group_spans_cp(tmp_path: Path) -> None:
    """Llama 3 405B at 128K (tp 8, cp 16, pp 16, dp 8, ZeRO 2), dp_shard 2: the shard group
    is dp_shard x cp = 32 ranks, the copies 4."""
    edits = [("  dp: 8\n", "  dp: 8\n  dp_shard: 2\n")]
    report = _report(_write(tmp_path, "llama3-405b-128k.yaml", edits, "405b.yaml"))
    moves = _collectives(report, "dp.grads")
    assert (moves["gradients"]["group"], moves["gradients"]["ranks"]) == ("dp_shard", 32)
    assert (moves["gradient shards"]["group"], moves["gradient shards"]["ranks"]) == (
        "dp_replicate",
        4,
    )
    # ZeRO 2 reduces after every micro-batch: the all-reduce as often as the reduce-scatter
    assert moves["gradient shards"]["count"] == moves["gradients"]["count"] == 16
    # the header names the shard group's cp too (a review: "over dp_shard 2" read as 2 ranks)
    path = _write(tmp_path, "llama3-405b-128k.yaml", edits, "405b.yaml")
    result = CliRunner().invoke(app, route([str(path)]), env={"COLUMNS": "120"})
    assert "hybrid sharding over dp_shard 2 × cp 16, 4 copies" in " ".join(result.stdout.split())


def test_the_all_reduce_says_it_is_exposed_or_hidden_as_its_reduce_scatter(tmp_path: Path) -> None:
    """The embedding's reduce-scatter waits whole as the backward ends, and so does its
    all-reduce across copies: its rule said "hidden" (a review)."""
    moves = _collectives(_report(_fsdp(tmp_path)), "backward.embedding")
    across = moves["embedding gradient shards"]
    assert across["exposed_s"] == pytest.approx(across["time_s"], rel=1e-12)
    rule = across["overlap_rule"]
    assert rule.startswith("hybrid sharding: the reduce-scatter's shard, all-reduced across the 16")
    assert "hidden or exposed as the reduce-scatter is" in rule
    assert moves["embedding gradients"]["overlap_rule"] in rule


def test_an_uneven_shard_group_is_told_at_dp_shard(tmp_path: Path) -> None:
    """dp 24 in shard groups of 3 on three 8-GPU nodes: the group of ranks 6, 7, 8 straddles
    two nodes; the error names dp_shard, not "degrees"."""
    path = _fsdp(tmp_path, 3, 3)
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "error: $.parallel.dp_shard: the dp_shard group: group [6, 7, 8]" in line
    assert "choose a dp_shard that divides the domain sizes (nvlink 8)" in line


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ([("  dp_shard: 8\n", "  dp_shard: 3\n")], "dp_shard = 3 must divide dp = 128"),
        ([("  zero: 3\n", "  zero: 0\n")], "zero is 0 and shards nothing"),
        ([("  dp_shard: 8\n", "  dp_shard: 1\n")], "leaves ZeRO a shard group of one rank"),
        (
            [("  fsdp_unit: layer\n  fsdp_root: split\n", "  reduce_bucket: 500000\n")],
            "parallel.reduce_bucket prices DeepSpeed",
        ),
    ],
)
def test_refusals(tmp_path: Path, edits: list[tuple[str, str]], message: str) -> None:
    path = _fsdp(tmp_path)
    text = path.read_text(encoding="utf-8")
    for old, new in edits:
        text = text.replace(old, new, 1)
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    lines = [ln for ln in result.stderr.splitlines() if "$.parallel.dp_shard" in ln]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: error: \$\.parallel\.dp_shard: ", lines[0])


def test_experts_split_apart_are_refused(tmp_path: Path) -> None:
    text = (ROOT / "plans" / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    dp = re.search(r"\n  dp: (\d+)\n", text)
    assert dp is not None and int(dp.group(1)) % 2 == 0
    path = tmp_path / "mixtral.yaml"
    path.write_text(text.replace(dp.group(0), f"{dp.group(0)}  dp_shard: 2\n", 1), "utf-8")
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2
    assert "$.parallel.dp_shard: dp_shard is priced for dense layers" in result.stderr


def test_experts_not_split_apart_shard_with_the_rest(tmp_path: Path) -> None:
    """Mixtral 8x7B at ep 1 (tp 2, pp 4, dp 8, ZeRO 1), dp_shard 2: its experts' data-parallel
    group is then the dense one, so their states shard over the 2 ranks of a copy too
    (Megatron-Core splits the expert data-parallel group into the optimizer's instances;
    FSDP shards a unit's experts over its mesh) and their gradients reduce as the rest do.
    A rank's experts: 8 layers of 8 experts of 3 x 4096 x 14336 over tp 2, 5,637,144,576
    parameters; fp32 master weights over 2 ranks, 11,274,289,152 B (a review: they were
    sharded over all 8, 23.6 GiB low, and the plan read as fitting)."""
    edits = [("  ep: 8\n", "  ep: 1\n"), ("  dp: 8\n", "  dp: 8\n  dp_shard: 2\n")]
    path = _write(tmp_path, "mixtral-8x7b.yaml", edits, "mixtral-ep1.yaml")
    report = build_report(load_plan(path))
    experts = 8 * 8 * 3 * 4096 * 14336 // 2
    assert experts == 5_637_144_576
    rows = {a.tensor: a for a in report.stages[0].peak_overlap}
    master = rows["expert master weights (fp32)"]
    assert master.bytes == experts // 2 * 4 == 11_274_289_152
    assert master.placement == "shard over 2 expert data-parallel ranks, one of 4 copies"
    assert not report.fits
    moves = _collectives(to_dict(report), "dp.grads")
    scatter, across = moves["expert gradients"], moves["expert gradient shards"]
    assert (scatter["group"], scatter["ranks"], scatter["bytes"]) == ("dp_shard", 2, experts * 4)
    assert (across["group"], across["ranks"], across["bytes"]) == ("dp_replicate", 4, experts * 2)


def test_search_refuses_a_plan_with_dp_shard(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, route(["search", str(_fsdp(tmp_path))]))
    assert result.exit_code == 2 and result.stdout == ""
    assert "$.parallel.dp_shard: budget search sweeps dp" in result.stderr
    assert "--hybrid false,true (or false,1,2,4: the nodes" in " ".join(result.stderr.split())


def test_terminal_and_json_name_the_groups(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, route([str(_fsdp(tmp_path))]), env={"COLUMNS": "120"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "hybrid sharding over dp_shard 8, 16 copies" in text
    assert "dp_shard = ZeRO's shard group (hybrid sharding)" in text
    assert "dp_replicate = the copies' group" in text
    out = CliRunner().invoke(app, route([str(_fsdp(tmp_path)), "-f", "json"]))
    assert json.loads(out.stdout)["layout"]["dp_shard"] == 8


def test_the_exposed_column_stays_at_80_columns(tmp_path: Path) -> None:
    """At 80 columns "dp_replicate 16" made the collectives table two columns too wide,
    and its exposed column was left out (the phases table and JSON kept it): it is now
    squeezed before that column goes. The embedding's gradient all-reduce ends the
    backward, so all of its time shows as exposed."""
    result = CliRunner().invoke(app, route([str(_fsdp(tmp_path))]), env={"COLUMNS": "80"})
    assert result.exit_code == 0
    table = result.stdout.split("Collectives", 1)[1].split("\n\n", 2)[1]
    assert all(len(line) <= 80 for line in table.splitlines())
    heads = ["transition", "op", "group", "sent", "time", "exposed", "calls", "rule"]
    assert table.split()[:8] == heads
    assert "left out at this width" not in result.stdout
    report = build_report(load_plan(_fsdp(tmp_path)))
    (shards,) = [
        c
        for p in report.phases
        if p.name == "backward.embedding"
        for c in p.collectives
        if c.group == "dp_replicate" and c.name.startswith("embedding")
    ]
    assert shards.exposed_s == shards.time_s > 0
    cell = format_duration(shards.exposed_s)
    # its time and its exposed time, on its row alone (the head's shards take as long, hidden)
    rows = [line for line in table.splitlines() if "dp_replicate 16" in line]
    # (the first layer's shards beside the embedding's backward, an audit, m454, too)
    assert [line.count(cell) for line in rows] == [1, 0, 0, 2]


def test_a_latency_bound_flat_layout_is_told_of_hybrid_sharding(tmp_path: Path) -> None:
    """Flat FSDP over 4,096 ranks: each layer's gather is a ring of 4,095 steps, 3,584 of
    them inside a node at NVLink's α 3 µs and 511 between nodes at InfiniBand's 14 µs:
    n·α = 10.752 + 7.154 = 17.906 ms of its 19.1 ms, and the step waits for some of them: a
    caution says so and names dp_shard. Over 128 ranks n·α is a third of a gather, and
    hybrid plans gather within a node: no caution."""
    from budget.report import slow_link_notes

    def notes(path: Path) -> tuple[str, ...]:
        return slow_link_notes(build_report(load_plan(path)))

    (note,) = notes(_fsdp(tmp_path, None, 512))
    gather = _collectives(_report(_fsdp(tmp_path, None, 512)), "backward.mlp")["layer parameters"]
    assert gather["latency_term_s"] == pytest.approx(3584 * 3e-6 + 511 * 14e-6, rel=1e-12)
    assert gather["latency_term_s"] > gather["bandwidth_term_s"]
    assert note.startswith("ZeRO 3's per-layer collectives over dp 4,096 are latency-bound (n·α ")
    # the bytes' time, the ring's slowest level: each GPU's InfiniBand port carries an eighth
    # of the 4,095/4,096 of 436,224,000 B it sends (8 ports a node) at 47 GB/s, 1.1599 ms
    ib = 436_224_000 * 4095 / 4096 / 8 / 47e9
    assert gather["time_s"] == pytest.approx(gather["latency_term_s"] + ib, rel=1e-6)
    took = f"{format_duration(gather['latency_term_s'])} of the {format_duration(gather['time_s'])}"
    assert took == "17.9 ms of the 19.1 ms"
    assert f"{took} a call of layer parameters takes" in note
    assert "hybrid sharding (parallel.dp_shard)" in note
    assert notes(_fsdp(tmp_path, None, 16)) == ()
    assert notes(_fsdp(tmp_path, 8, 512)) == ()
    result = CliRunner().invoke(app, route([str(_fsdp(tmp_path, None, 512))]))
    assert "Caution: ZeRO 3's per-layer collectives over dp 4,096" in result.stdout


def test_no_caution_where_the_step_waits_only_for_bandwidth(tmp_path: Path) -> None:
    """48 nodes (dp 384): a layer's gather is latency-bound but hidden; of the layers'
    collectives the step waits only for the stage's first layer's reduce-scatter, beside the
    embedding's backward, bandwidth-bound (n·α 1.67 ms of 2.31 ms of bytes): no caution (a
    review: it fired, where a shard group per node is slower)."""
    from budget.report import slow_link_notes

    path = _fsdp(tmp_path, None, 48)
    report = _report(path)
    gathers = [
        _collectives(report, phase)["layer parameters"]
        for phase in ("forward.attention", "backward.mlp")
    ]
    scatter = _collectives(report, "backward.embedding")["layer gradients"]
    assert all(g["latency_term_s"] > g["bandwidth_term_s"] for g in gathers)
    assert all(g["exposed_s"] == 0 for g in gathers)
    assert scatter["latency_term_s"] < scatter["bandwidth_term_s"] and scatter["exposed_s"] > 0
    assert _collectives(report, "backward.mlp")["layer gradients"]["exposed_s"] == 0
    assert slow_link_notes(build_report(load_plan(path))) == ()


def test_no_caution_where_the_plan_could_not_take_dp_shard(tmp_path: Path) -> None:
    """Mixtral 8x7B under ZeRO 3 over dp 512 with experts over ep 8 (without a pipeline,
    where ZeRO 3 is priced only): its dense gathers are latency-bound and exposed, but
    hybrid sharding is refused beside ep > 1 (a review: the caution advised a key the plan
    is then refused for)."""
    from budget.report import slow_link_notes

    edits = [
        ("global: 256", "global: 4096"),
        ("  pp: 4\n  dp: 8\n", "  pp: 1\n  dp: 512\n"),
        ("  zero: 1\n  order: [tp, cp, ep, dp, pp]\n", "  zero: 3\n"),
        ("nodes: 8}", "nodes: 128}"),
    ]
    report = build_report(load_plan(_write(tmp_path, "mixtral-8x7b.yaml", edits, "moe.yaml")))
    rows = [c for p in report.phases for c in p.collectives if c.group == "dp"]
    assert any(
        c.latency_term_s > c.bandwidth_term_s and (c.exposed_s or 0) > 0
        for c in rows
        if c.latency_term_s is not None and c.bandwidth_term_s is not None
    )
    assert not any("ZeRO 3's per-layer" in note for note in slow_link_notes(report))


def _step(report: dict[str, Any]) -> str:
    return f"{report['step']['time_s']:.2f} s"


def test_the_readme_figures(tmp_path: Path) -> None:
    """The README's paragraph on `parallel.dp_shard`: Llama 3 8B's states a GPU, flat and
    hybrid, on 16 nodes and the steps there, and on 512 nodes the flat ring's n·α, a layer's
    gather and both steps, as the engine prices them."""
    from budget.units import format_bytes

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    start = text.index("`parallel.dp_shard` is hybrid sharding")
    paragraph = text[start : text.index("(search it without the key)", start)]
    hybrid, flat = _report(_fsdp(tmp_path, 8, 16)), _report(_fsdp(tmp_path, None, 16))

    def states(report: dict[str, Any]) -> str:
        (stage,) = report["memory"]["stages"]
        return format_bytes(stage["params_bytes"] + stage["grads_bytes"] + stage["optimizer_bytes"])

    longer = hybrid["step"]["time_s"] / flat["step"]["time_s"] - 1
    assert (
        f"its states take {states(hybrid)} a GPU where sharding over all 128 GPUs takes "
        f"{states(flat)}, and its step is {100 * longer:.1f} % longer ({_step(hybrid)} "
        f"against {_step(flat)}" in paragraph
    )
    hybrid, flat = _report(_fsdp(tmp_path, 8, 512)), _report(_fsdp(tmp_path, None, 512))
    gather = _collectives(flat, "backward.mlp")["layer parameters"]
    assert gather["ranks"] == 4096
    assert (
        f"over 4,096 ranks takes {format_duration(gather['latency_term_s'])} of n·α, a layer's "
        f"gather {format_duration(gather['time_s'])}, and its step is {_step(flat)} against "
        f"hybrid sharding's {_step(hybrid)}" in paragraph
    )


def _priced_as_searched(plan: Any, results: Any, gpus: int) -> None:
    """Each searched layout of `results` is `budget`'s for it written as a plan: the same
    peak, the same step to 1e-12."""
    from budget.search import apply

    for r in results:
        report = build_report(apply(plan, r.config, gpus))
        assert report.worst.peak_bytes == r.peak_bytes, r.config
        assert float(report.step["time_s"]) == pytest.approx(r.step_time_s, rel=1e-12)


def test_search_weighs_hybrid_sharding(tmp_path: Path) -> None:
    """`budget search --hybrid false,true` (`Space.hybrid`) prices each ZeRO 1 to 3 layout
    also with a shard group of the dp ranks a node holds: 8 / (tp x cp), tp and cp varying
    faster than dp. On 128 nodes the fastest Llama 3 8B layout is hybrid (the flat one's
    rings over 1,024 ranks are latency-bound), and the sweep's bytes and seconds for every
    layout it ranks are `budget`'s for that layout written as a plan."""
    from budget.search import Space, search

    plan = load_plan(_fsdp(tmp_path, None, 128))
    outcome = search(plan, 1024, Space(hybrid=(False, True)), keep=200)
    best = outcome.results[0].config
    assert (best.tp, best.cp, best.dp, best.dp_shard) == (1, 1, 1024, 8)
    hybrid = [r for r in outcome.results if r.config.dp_shard]
    assert hybrid and len(hybrid) < len(outcome.results)
    for r in hybrid:
        c = r.config
        assert c.zero >= 1 and c.dp_shard == 8 // (c.tp * c.cp) and c.dp % c.dp_shard == 0
    _priced_as_searched(plan, outcome.results, 1024)


def test_search_keeps_hybrid_sharding_where_a_plan_takes_it(tmp_path: Path) -> None:
    """Mixtral's layouts with experts over ep > 1 and ZeRO 0 ones are not made hybrid
    (`resolve._check_hybrid` refuses both), and without --hybrid no layout is."""
    from budget.search import Space, search

    plan = load_plan(ROOT / "plans" / "mixtral-8x7b.yaml")
    outcome = search(plan, 64, Space(hybrid=(False, True)), keep=10**6)
    hybrid = [r.config for r in outcome.results if r.config.dp_shard]
    assert hybrid and all(c.ep == 1 and c.zero >= 1 for c in hybrid)
    assert outcome.rejected["hybrid sharding needs ZeRO 1 to 3"] > 0
    assert (
        outcome.rejected["hybrid sharding is priced for experts not split apart (ep 1, etp = tp)"]
        > 0
    )
    default = search(plan, 64, Space(), keep=10**6)
    assert not any(r.config.dp_shard for r in default.results)
    assert all(r.config.to_dict()["dp_shard"] is None for r in default.results[:5])


def test_search_cli_hybrid(tmp_path: Path) -> None:
    """`--hybrid` takes true, false or both; the best layout written with --write carries its
    dp_shard, and `budget` prices that plan as the search did."""
    path = _fsdp(tmp_path, None, 128)
    for value in ("maybe", "0", "1025", "2.5"):
        bad = CliRunner().invoke(app, route(["search", str(path), "--hybrid", value]))
        said = f"--hybrid '{value}': use false, true, or the nodes a shard group spans"
        assert bad.exit_code == 2 and said in " ".join(bad.stderr.split()), value
    best = tmp_path / "best.yaml"
    args = ["search", str(path), "--hybrid", "false,true", "--write", str(best), "-f", "json"]
    result = CliRunner().invoke(app, route(args))
    assert result.exit_code == 0, result.stderr
    ranked = json.loads(result.stdout)["results"][0]
    assert ranked["config"]["dp_shard"] == 8
    written = _report(best)
    assert written["layout"]["dp_shard"] == 8
    assert written["step"]["time_s"] == pytest.approx(ranked["step_time_s"], rel=1e-12)


def test_search_takes_shard_groups_of_several_nodes(tmp_path: Path) -> None:
    """`--hybrid false,1,2,4` (`Space.hybrid` (0, 1, 2, 4)): a shard group of the dp ranks
    1, 2 or 4 nodes hold, nodes x 8 / (tp x cp), the next node holding the next dp ranks.
    Llama 3 70B (70,553,706,496 parameters) under FSDP on 64 nodes: a node's shard group
    holds 16 B of fp32 parameters, gradients and Adam moments a parameter over 8 GPUs,
    141.1 GB a GPU, which no H100 holds, so every hybrid layout it ranks spans 2 or 4
    nodes, and each is `budget`'s for that layout written as a plan."""
    from budget.search import Space, search

    path = _write(
        tmp_path,
        "llama3-8b-fsdp.yaml",
        [
            ("preset: llama3-8b", "preset: llama3-70b"),
            ("  dp: 8\n", "  dp: 512\n"),
            ("global: 8\n", "global: 512\n"),
            ("nodes: 1}", "nodes: 64}"),
        ],
        "llama70b.yaml",
    )
    plan = load_plan(path)
    assert 16 * 70_553_706_496 // 8 == 141_107_412_992
    space = Space(tp=(1, 2), pp=(1,), hybrid=(0, 1, 2, 4))
    outcome = search(plan, 512, space, keep=10**6)
    hybrid = [r for r in outcome.results if r.config.dp_shard]
    spans = {r.config.dp_shard * r.config.tp * r.config.cp // 8 for r in hybrid}
    assert spans == {2, 4}
    assert all(r.config.zero == 3 and r.config.dp % r.config.dp_shard == 0 for r in hybrid)
    assert [r.config.dp_shard for r in hybrid if r.config.tp * r.config.cp == 1][:1] == [32]
    _priced_as_searched(plan, hybrid[:12], 512)
    one = search(plan, 512, Space(tp=(1, 2), pp=(1,), hybrid=(0, 1)), keep=10**6)
    assert not [r for r in one.results if r.config.dp_shard]


def test_search_takes_shard_groups_where_a_dp_rank_spans_nodes(tmp_path: Path) -> None:
    """At tp 8 x cp 2 a dp rank spans two 8-GPU nodes: 2 nodes hold one dp rank (dp_shard
    1, times cp 2) and 4 nodes two, where one node holds none (a review: the shard group
    was rounded to whole dp ranks per node before it was multiplied by the nodes, so no
    count gave one); each is `budget`'s for that layout written as a plan."""
    from budget.search import Space, search

    plan = load_plan(_fsdp(tmp_path, None, 16))
    space = Space(tp=(8,), cp=(2,), pp=(1,), zero=(3,), hybrid=(0, 1, 2, 4))
    outcome = search(plan, 128, space, keep=10**6)
    assert {(r.config.dp, r.config.dp_shard) for r in outcome.results} == {(8, 0), (8, 1), (8, 2)}
    _priced_as_searched(plan, outcome.results, 128)


def test_the_readme_search_figures(tmp_path: Path) -> None:
    """The README's `budget search --hybrid false,true` sentence: on 128 nodes the fastest
    Llama 3 8B layout is hybrid, dp 1,024 with dp_shard 8, and its step and the fastest
    flat layout's are the figures said."""
    from budget.search import Space, search

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    plan = load_plan(_fsdp(tmp_path, None, 128))
    both = search(plan, 1024, Space(hybrid=(False, True)), keep=1).results[0]
    flat = search(plan, 1024, Space(), keep=1).results[0]
    assert (both.config.dp, both.config.dp_shard, flat.config.dp_shard) == (1024, 8, 0)
    said = (
        "on 128 nodes Llama 3 8B's fastest layout is dp 1,024 with dp_shard 8, "
        f"{format_duration(both.step_time_s)} a step against "
        f"{format_duration(flat.step_time_s)} for the fastest with ZeRO over all of dp"
    )
    assert said in text


def test_dp_before_cp_in_the_order_is_refused_beside_cp(tmp_path: Path) -> None:
    """An audit (m328): with dp before cp in parallel.order, Megatron-LM's distributed-
    optimizer instances are consecutive ranks of the dp × cp group, dp varying fastest
    (tp 2, dp 4, cp 2, two instances: ranks 0, 2, 4, 6 shard, 0 and 8 copies), where budget
    prices dp_shard × cp (0, 2, 8, 10 shard, 0 and 4 copies), their links swapped. Refused
    beside cp > 1, and left out of a sweep; with cp 1 the two agree and the plan is taken."""
    from budget.search import Space, search

    path = _fsdp(tmp_path)
    text = path.read_text(encoding="utf-8").replace(
        "  dp: 128\n  dp_shard: 8\n",
        "  cp: 2\n  dp: 64\n  dp_shard: 4\n  order: [tp, dp, cp, ep, pp]\n",
    )
    assert "order: [tp, dp, cp, ep, pp]" in text
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = [ln for ln in result.stderr.splitlines() if "$.parallel.dp_shard" in ln]
    assert "with dp before cp Megatron-LM's instances are consecutive ranks" in line
    flat = path.read_text(encoding="utf-8").replace("  cp: 2\n  dp: 64\n", "  dp: 128\n")
    path.write_text(flat, encoding="utf-8")
    assert load_plan(path).parallel.dp_shard == 4  # cp 1: taken
    unsharded = flat.replace("  dp_shard: 4\n", "")
    path.write_text(unsharded, encoding="utf-8")
    space = Space(tp=(1,), pp=(1,), cp=(1, 2), zero=(3,), hybrid=(0, 1))
    outcome = search(load_plan(path), 128, space, keep=10**6)
    hybrid = [r.config for r in outcome.results if r.config.dp_shard]
    assert hybrid and all(c.cp == 1 for c in hybrid)
    assert any(r.config.cp == 2 for r in outcome.results)


QWEN_MOE_HYBRID = """name: qwen-moe-hybrid
mode: train
model: {preset: qwen-moe, attention: flash2}
batch: {seq: 4096, micro: 1, global: 16}
precision: {params: fp32, master: none, param_gather: bf16, grads: fp32, optimizer: adam,
  activations: bf16}
parallel: {dp: 16, zero: 3, fsdp: 2, fsdp_unit: layer, fsdp_root: split, dp_shard: 8}
recompute: full
recompute_early_stop: true
loss: pytorch
overlap: {dp_grads: true, param_gather: true}
device: {preset: h100-sxm, reserved: 3 GiB}
topology: {preset: dgx-h100, nodes: 2}
"""


def test_fsdps_all_reduce_across_copies_runs_beside_the_next_reduce_scatter(
    tmp_path: Path,
) -> None:
    """PyTorch FSDP all-reduces a unit's gradient shard on a stream of its own, which waits
    for that unit's reduce-scatter alone (FSDP2's ``foreach_reduce`` on
    ``all_reduce_stream``; FSDP1's ``_all_reduce_stream``), so each link's collectives hide
    behind the backward on their own. A Qwen-MoE layer's expert reduce-scatter over NVLink
    (5.2 ms) and all-reduce over InfiniBand (5.5 ms) each fit the 7.07 ms its backward's
    5.73 ms of kernels last beside a collective (/ (1 − 0.189)); drawn one after the other,
    5.4 ms of every layer's all-reduce waited, 130 ms a step (an audit, m430). Each now
    hides whole, as its reduce-scatter does (the stage's first layer's, the backward's last,
    runs by the embedding's backward: an audit, m454)."""
    path = tmp_path / "qwen-moe-hybrid.yaml"
    path.write_text(QWEN_MOE_HYBRID, encoding="utf-8")
    report = _report(path)
    (phase,) = [p for p in report["phases"] if p["name"] == "backward.moe"]
    moves = _collectives(report, "backward.moe")
    kernels = (phase["compute_s"] - phase["slowdown_s"]) / phase["count"]
    window = kernels / (1 - 0.189)
    scatters = moves["layer gradients"]["time_s"] + moves["layer expert gradients"]["time_s"]
    shards = (
        moves["layer gradient shards"]["time_s"] + moves["layer expert gradient shards"]["time_s"]
    )
    assert scatters < window and shards < window < scatters + shards  # the case in point
    for name in ("layer gradient shards", "layer expert gradient shards"):
        scatter = moves[name.replace(" shards", "s")]
        assert scatter["exposed_s"] == moves[name]["exposed_s"] == 0
        assert "on FSDP's all-reduce stream" in moves[name]["overlap_rule"]
    assert phase["exposed_s"] < 0.02


def test_a_move_beside_the_next_reduce_scatter_hides_behind_its_time() -> None:
    """`Move.beside` (`schedule._beside`): a move on a stream of its own waits only what
    outlasts the next move of its phase of the op it names, which starts as it does; one
    that outlasts it waits the difference, and beside a move a sweep's configuration lacks
    (its count 0) it waits whole. By hand: 3 ms beside 2 ms waits 1 ms. On a link both use,
    it hides only in what the other leaves of it (review m555): beside a 2 ms reduce-scatter
    of 100 MB over 2 ranks on 100 GB/s InfiniBand, whose bandwidth term is 50 MB / 100 GB/s =
    0.5 ms, 1.5 ms of link time is left, and 3 ms waits 1.5 ms."""
    from budget.collectives import Link, Tier, collective_cost
    from budget.phases import Move
    from budget.schedule import TimedMove, _beside

    ib, nvlink = Link("infiniband", 100e9, 5e-6), Link("nvlink", 450e9, 1e-6)

    def timed(
        op: str, seconds: float, count: int = 1, beside: str = "", link: Link = nvlink
    ) -> TimedMove:
        move = Move(op, op, "dp", 2, "fp32", 1, "partial", "replicate", count, beside=beside)  # type: ignore[arg-type]
        cost = collective_cost(op, [Tier(2, link)], 100_000_000)  # type: ignore[arg-type]
        return TimedMove(move, cost, seconds, seconds, "exposed")

    plan = load_plan(ROOT / "plans" / "llama3-8b-fsdp.yaml")
    shard = timed("all-reduce", 3e-3, beside="reduce-scatter", link=ib)
    rest = [timed("all-gather", 5e-3), timed("reduce-scatter", 2e-3), timed("all-reduce", 4e-3)]
    out = _beside(plan, [shard, *rest])
    assert out[0].exposed_s == pytest.approx(1e-3) and out[1:] == rest
    assert _beside(plan, [shard, timed("reduce-scatter", 2e-3, count=0)])[0].exposed_s == 3e-3
    assert _beside(plan, [shard])[0].exposed_s == 3e-3
    sharing = timed("reduce-scatter", 2e-3, link=ib)
    assert sharing.cost.bandwidth_s == pytest.approx(0.5e-3)
    assert _beside(plan, [shard, sharing])[0].exposed_s == pytest.approx(1.5e-3)


def test_the_first_layers_all_reduce_waits_whole_without_overlap(tmp_path: Path) -> None:
    """With overlap.dp_grads off every reduce-scatter and all-reduce across copies waits
    whole, the first layer's in the embedding's phase too (review m478: it was hidden behind
    the root's reduce-scatter still, 2.3 ms a step on Llama 3 8B over two nodes)."""
    path = _fsdp(tmp_path, 8, 2)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("dp_grads: true", "dp_grads: false"), encoding="utf-8")
    first = _collectives(_report(path), "backward.embedding")
    for name in ("layer gradients", "layer gradient shards"):
        assert first[name]["exposed_s"] == pytest.approx(first[name]["time_s"], rel=1e-12)
