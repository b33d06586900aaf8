"""Links shared at once (DESIGN.md rule 5): a collective hidden behind a phase or more keeps,
on each link it uses, only what the collectives hidden inside that window leave of it
(`schedule._link_loads`, `collectives.shared_pace`)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

import budget.schedule as schedule
from budget.accuracy import RUNS, plan_of
from budget.collectives import Link, Stage, Tier, collective_cost, shared_pace
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.report import to_dict
from budget.search import Space, apply, search
from tests.plan_files import ROOT

# One DGX H100 node: Llama 3 8B at tp 2 (comm-GEMM overlap hides its collectives behind
# their GEMMs on NVLink) and dp 4, whose all-reduce of the gradients hides behind the last
# micro-batch's backward on the same NVLink. Short sequences leave a backward too short to
# hide it whole, so how much of the window it has decides its exposed time.
SHARED = """name: shared-nvlink
mode: train
model: {preset: llama3-8b}
batch: {seq: 1024, micro: 1, global: 64}
precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, activations: bf16}
parallel: {tp: 2, dp: 4, sequence_parallel: true, zero: 0}
overlap: {dp_grads: true, param_gather: true, tp: true}
device: {preset: h100-sxm}
topology: {preset: dgx-h100, nodes: 1}
"""


@pytest.fixture()
def shared(tmp_path: Path) -> Path:
    path = tmp_path / "shared.yaml"
    path.write_text(SHARED, encoding="utf-8")
    return path


def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every collective priced as if it had its links to itself (the engine before rule 5's
    sharing)."""
    monkeypatch.setattr(schedule, "_link_loads", lambda *args: {})


def _find(report: dict, phase: str, name: str) -> dict:
    (row,) = (
        c
        for p in report["phases"]
        if p["name"] == phase
        for c in p["collectives"]
        if c["name"] == name
    )
    return row


def test_a_gradient_reduction_beside_tp_overlap_on_nvlink_keeps_the_pace_left(shared, monkeypatch):
    """By hand from the report's own figures: the tp collectives hidden behind their GEMMs in
    one micro-batch's backward hold D seconds of NVLink (each one's bandwidth term times the
    share of it hidden, per call, its calls a micro-batch); the backward's kernels take W,
    which last W / (1 − s) beside a collective (s = 0.189, `overlap.slowdown`); so they hold
    u = D / (W / (1 − s)) of the link there. The all-reduce, one flat ring on NVLink, then
    moves its bytes at (1 − u) of B_eff: pace = T / (n·α + (Q/B) / (1 − u)), and it hides
    behind that share of the room it had alone (exposed = T − (T − exposed alone) · pace, its
    room, not its last bucket, setting it here)."""
    report = to_dict(build_report(load_plan(shared)))
    m = report["microbatches"]
    backward = [p for p in report["phases"] if p["name"].startswith("backward.")]
    held = sum(
        (1 - c["exposed_s"] / c["time_s"]) * c["bandwidth_term_s"] * c["count"] / m
        for p in backward
        for c in p["collectives"]
        if c["group"] == "tp" and c["exposed_s"] < c["time_s"]
    )
    # a phase's compute_s and slowdown_s are its instances' over the step
    window = sum((p["compute_s"] - p["slowdown_s"]) / m for p in backward)
    u = held / (window / (1 - 0.189))
    assert 0.05 < u < 0.1  # 7 %: tp's hidden collectives over the backward's kernels
    grads = _find(report, "dp.grads", "gradients")
    assert (grads["link"], grads["algorithm"], len(grads["levels"])) == ("nvlink", "ring", 1)
    pace = grads["time_s"] / (grads["latency_term_s"] + grads["bandwidth_term_s"] / (1 - u))
    assert grads["pace"] == pytest.approx(pace, rel=1e-9)
    assert (
        "shares nvlink with the tp collectives hidden there, which hold 6.5% of it, so it "
        "runs at 93.5% of its pace alone" in grads["overlap_rule"]
    )
    _alone(monkeypatch)
    alone = to_dict(build_report(load_plan(shared)))
    before = _find(alone, "dp.grads", "gradients")
    assert before["pace"] == 1.0 and "shares" not in before["overlap_rule"]
    assert before["time_s"] == grads["time_s"]  # the collective's own time is its own
    hidden = before["time_s"] - before["exposed_s"]
    assert grads["exposed_s"] == pytest.approx(grads["time_s"] - hidden * pace, rel=1e-9)
    assert grads["exposed_s"] > before["exposed_s"] * 1.1  # 21.1 → 24.0 ms
    # hidden, it runs through the whole window as before, only slower, so it slows the
    # compute beside it as long: s · (T − exposed) / pace, the figure it had alone (review
    # m551: charged at its time alone, sharing a link had lowered the slowdown)
    s = 0.189
    assert grads["slowdown_s"] == pytest.approx(
        s * (grads["time_s"] - grads["exposed_s"]) / pace, rel=1e-9
    )
    assert grads["slowdown_s"] == pytest.approx(before["slowdown_s"], rel=1e-9)
    assert report["step"]["time_s"] > alone["step"]["time_s"]


def test_expert_all_to_alls_paired_with_other_micro_batches_are_not_in_the_last_ones(tmp_path):
    """Under overlap.ep an expert all-to-all hides behind another micro-batch's layer
    (combined 1F1B); the step's last backward, where the gradients reduce, pairs with none,
    so nothing hidden there shares the reduction's links (review m551: DeepSeek-MoE 16B at
    ep 16 over two nodes read 79 % of its pace, from all-to-alls run in earlier micro-batches)."""
    text = (ROOT / "plans" / "deepseek-moe-16b.yaml").read_text(encoding="utf-8")
    for old, new in (("  global: 512", "  global: 32"), ("  ep: 8", "  ep: 16")):
        assert text.count(old) == 1
        text = text.replace(old, new)
    path = tmp_path / "ep.yaml"
    path.write_text(text + "overlap: {ep: true, dp_grads: true}\n", encoding="utf-8")
    report = to_dict(build_report(load_plan(path)))
    moe = [c for p in report["phases"] for c in p["collectives"] if c["group"] == "ep"]
    assert any(c["exposed_s"] < c["time_s"] for c in moe)  # hidden, in the paired ones
    grads = _find(report, "dp.grads", "gradients")
    assert grads["pace"] == 1.0 and "shares" not in grads["overlap_rule"]


def test_collectives_on_links_no_hidden_collective_uses_keep_their_pace():
    """Llama 3.1 405B's gradients reduce over RoCE while its tp collectives hide on NVLink:
    nothing to share, so pace 1 and the same step as with every link to itself."""
    report = to_dict(build_report(load_plan(ROOT / "plans" / "llama3-405b-128k.yaml")))
    grads = _find(report, "dp.grads", "gradients")
    assert grads["link"] == "roce" and grads["pace"] == 1.0
    assert all(
        c["pace"] == 1.0 and "shares" not in c["overlap_rule"]
        for p in report["phases"]
        for c in p["collectives"]
    )


def test_a_ring_paced_by_its_port_is_not_slowed_by_its_inner_fabrics_load():
    """NeMo's Llama 3.1 70B on 64 GPUs: the gradients' ring over dp 4 crosses NVLink and
    InfiniBand at once (a ring across levels, paced by its busiest port, IB's 145 ms against
    NVLink's 19 ms); the tp collectives hidden on NVLink hold a fifth of it at most, which
    stretches NVLink's term to under 25 ms, still not the pace: pace 1."""
    (run,) = (r for r in RUNS if r.name == "Llama 3.1 70B, 64 GPUs")
    report = to_dict(build_report(plan_of(run)))
    grads = _find(report, "dp.grads", "gradients")
    assert [lv["link"] for lv in grads["levels"]] == ["nvlink", "infiniband"]
    nvlink, ib = (lv["time_s"] for lv in grads["levels"])
    assert nvlink / (1 - 0.2) < ib
    assert grads["pace"] == 1.0 and "shares" not in grads["overlap_rule"]


def test_shared_pace_by_hand():
    """One flat ring on a 100 GB/s link of 5 µs steps: an all-reduce of 100 MB over 4 ranks
    takes 6 steps (30 µs) and sends 2 · 3/4 · 100 MB = 150 MB (1.5 ms). With half the link
    held by others its bytes take 3 ms: pace 1.53 / 3.03; a link it does not use changes
    nothing; a link left almost nothing all but stops it."""
    link = Link("nvlink", 100e9, 5e-6)
    cost = collective_cost("all-reduce", [Tier(4, link)], 100_000_000, "ring")
    assert cost.time_s == pytest.approx(30e-6 + 1.5e-3)
    assert shared_pace(cost, {"nvlink": 0.5}) == pytest.approx(1.53e-3 / 3.03e-3)
    assert shared_pace(cost, {"infiniband": 0.5}) == 1.0
    assert shared_pace(cost, {"nvlink": 1e-9}) < 1e-6
    empty = replace(cost, stages=tuple(replace(s, payload_bytes=0, steps=0) for s in cost.stages))
    assert isinstance(cost.stages[0], Stage)
    assert shared_pace(empty, {"nvlink": 0.5}) == 1.0  # moves nothing: keeps its pace


def test_shared_links_budget_exactly_as_searched(shared):
    """The vectorised engine shares links as `budget` does: sampled layouts of the plan
    above, some of whose gradients share NVLink with tp's hidden collectives, priced alike
    to a relative 1e-9."""
    plan = load_plan(shared)
    outcome = search(
        plan, 8, Space(tp=(1, 2, 4), micro=(1, 2), zero=(0, 1), virtual_stages=(1,), pp=(1,))
    )
    random.seed(8)
    sample = random.sample(list(outcome.results), min(12, len(outcome.results)))
    slowed = 0
    for result in sample:
        report = build_report(apply(plan, result.config, 8))
        assert report.step["time_s"] == pytest.approx(result.step_time_s, rel=1e-9), result.config
        assert report.step["exposed_comm_s"] == pytest.approx(result.exposed_comm_s, rel=1e-9)
        slowed += any(
            c.pace is not None and c.pace < 1 for p in report.phases for c in p.collectives
        )
    assert slowed  # the sample holds layouts whose links are shared


def _hybrid(tmp_path: Path, seq: int) -> dict:
    """Llama 3 8B under FSDP2 over 4 DGX H100s, shard groups of 16 ranks (two nodes) and 2
    copies: the shard group's gathers and reduce-scatters and the all-reduce across copies
    all on InfiniBand."""
    text = (ROOT / "plans" / "llama3-8b-fsdp.yaml").read_text(encoding="utf-8")
    edits = (
        ("  seq: 8192", f"  seq: {seq}"),
        ("  global: 8", "  global: 32"),
        ("  dp: 8", "  dp: 32\n  dp_shard: 16"),
        ("nodes: 1}", "nodes: 4}"),
    )
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / f"hybrid-{seq}.yaml"
    path.write_text(text, encoding="utf-8")
    return to_dict(build_report(load_plan(path)))


def _rows(report: dict, phase: str) -> dict:
    """The collectives of `phase` by name."""
    return {c["name"]: c for p in report["phases"] if p["name"] == phase for c in p["collectives"]}


def _ib(row: dict) -> float:
    """A collective's bandwidth term on InfiniBand: its level's time less its n·α there."""
    (level,) = [lv for lv in row["levels"] if lv["link"] == "infiniband"]
    return level["time_s"] - level["steps"] * level["alpha_s"]


def test_an_all_reduce_across_copies_shares_the_nic_with_the_units_collectives(
    tmp_path, monkeypatch
):
    """FSDP's all-reduce of a unit's gradient shard across the hybrid copies runs on its own
    stream beside the next unit's reduce-scatter (another part of the window): it draws on
    what the unit's gather and reduce-scatter, launched first, leave of the NIC (review m555:
    hidden whole, the three took 3.38 ms of a unit's backward where their bandwidth terms
    on InfiniBand come to 4.42 ms). By work conservation the unit's backward, its slowed
    compute (what the gather and reduce-scatter hid alone) and what the two wait beyond it,
    is at least the NIC's work; the reduce-scatter launched first keeps its pace."""
    report = _hybrid(tmp_path, 512)
    rows = _rows(report, "backward.mlp")
    gather, scatter = rows["layer parameters"], rows["layer gradients"]
    across = rows["layer gradient shards"]
    assert across["pace"] < 0.1 < scatter["pace"] == gather["pace"] == 1.0
    _alone(monkeypatch)
    alone = _hybrid(tmp_path, 512)
    before = _rows(alone, "backward.mlp")
    assert before["layer gradient shards"]["exposed_s"] == 0.0  # hidden whole, alone
    # the window the part-"" pair fills alone: the gather's and the reduce-scatter's hidden
    window = sum(
        before[n]["time_s"] - before[n]["exposed_s"]
        for n in ("layer parameters", "layer gradients")
    )
    work = _ib(gather) + _ib(scatter) + _ib(across)
    took = window + scatter["exposed_s"] + across["exposed_s"]
    assert took >= work * 0.999  # 4.44 ms against 4.42 ms
    assert window + before["layer gradients"]["exposed_s"] < work * 0.8  # 3.38 ms alone
    assert report["step"]["time_s"] > alone["step"]["time_s"] * 1.15  # 218 → 258 ms


def test_an_all_reduce_beside_a_reduce_scatter_hides_in_what_it_leaves_of_the_nic(tmp_path):
    """The stage's first layer's all-reduce across copies runs beside the embedding's
    reduce-scatter (`schedule._beside`), both on InfiniBand: it hides only in the link time
    the reduce-scatter leaves, its time less its bandwidth term there (review m555: hidden
    whole, 1.1 ms of NIC work unpriced): exposed T − (T_rs − Q_rs/B), 1.188 − 0.056 ms."""
    report = _hybrid(tmp_path, 8192)
    rows = _rows(report, "backward.embedding")
    across, scatter = rows["layer gradient shards"], rows["embedding gradients"]
    assert "beside the next reduce-scatter" in across["overlap_rule"]
    assert across["overlap_rule"].endswith(
        "shares infiniband with that reduce-scatter, hiding only in the link time it leaves"
        " [overlap.dp_grads on]"
    )
    room = scatter["time_s"] - _ib(scatter)
    assert across["exposed_s"] == pytest.approx(across["time_s"] - room, rel=1e-9)
    assert 1.1e-3 < across["exposed_s"] < across["time_s"]
