"""NCCL's bandwidth by message size (`BandwidthRamp`): the shares derived from published
nccl-tests sweeps, worked out by hand here from the printed rows, and how collectives, the
plan language and the report use them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from budget.catalog.nccl_tests import curve_shares
from budget.catalog.topologies import RAMPS, TOPOLOGIES
from budget.cli import app, route
from budget.collectives import Link, Tier, collective_cost
from budget.pipeline import budget_plan
from tests.plan_files import NVLINK, written_topology

MiB, GiB = 2**20, 2**30
ALPHA = 3e-6  # the engine's NVLink α
runner = CliRunner()


def _share(f: float, n: int, size: int, t_s: float, plateau_Bps: float) -> float:
    """(f·S / B) / (t − n·α), B the preset level's bandwidth, for the hand calculations."""
    return (f * size / plateau_Bps) / (t_s - n * ALPHA)


def test_h100_ring_all_reduce_share_at_64_mib_from_the_together_run() -> None:
    """Together's 8 x H100 ring all_reduce: 64 MiB in 368.67 µs. f = 2·7/8 = 1.75, n = 14,
    B = 370 GB/s (the NVLink 4 presets): (1.75·64 MiB / 370 GB/s = 317.41 µs) / (368.67 − 42
    µs) = 0.972. The α term alone already explains most of this curve."""
    expected = _share(1.75, 14, 64 * MiB, 368.67e-6, 370e9)
    assert expected == pytest.approx(0.9717, abs=1e-4)
    assert RAMPS["nvlink4"].share("all-reduce", 64 * MiB) == pytest.approx(expected)


def test_h100_all_gather_share_at_64_mib() -> None:
    """all_gather_ring.out: 64 MiB in 210.89 µs; f = 7/8, n = 7, B = 370 GB/s:
    (58,720,256 B / 370 GB/s = 158.70 µs) / (210.89 − 21 µs) = 0.836. At 8 GiB it reaches
    357.90 GB/s, 0.967 of 370: the ramp keeps all-gather's lower plateau."""
    expected = _share(0.875, 7, 64 * MiB, 210.89e-6, 370e9)
    assert expected == pytest.approx(0.8358, abs=1e-4)
    assert RAMPS["nvlink4"].share("all-gather", 8 * GiB) == pytest.approx(357.9 / 370, abs=2e-3)
    assert RAMPS["nvlink4"].share("all-gather", 64 * MiB) == pytest.approx(expected)


def test_a100_share_at_64_mib_is_the_mean_of_the_azure_and_oci_runs() -> None:
    """Azure ND A100 v4 prints only busbw: 166.63 GB/s at 64 MiB, so t = 1.75·64 MiB /
    166.63 GB/s = 704.8 µs and, against the presets' 231.58 GB/s, the share is 507.1 / 662.8
    = 0.765. OCI's BM.GPU4.8 run: 589.5 µs at 64 MiB: 507.1 / 547.5 = 0.926. The NVLink 3
    ramp averages them: 0.846, and all-gather and reduce-scatter take the same (no 8 x A100
    sweep of them was found)."""
    azure_t = 1.75 * 64 * MiB / 166.63e9
    azure = _share(1.75, 14, 64 * MiB, azure_t, 231.58e9)
    oci = _share(1.75, 14, 64 * MiB, 589.5e-6, 231.58e9)
    assert azure == pytest.approx(0.7651, abs=1e-3)
    assert oci == pytest.approx(0.9263, abs=1e-3)
    ramp = RAMPS["nvlink3"]
    for op in ("all-reduce", "all-gather", "reduce-scatter"):
        assert ramp.share(op, 64 * MiB) == pytest.approx((azure + oci) / 2, rel=2e-3)


def test_gb200_share_at_16_mib_is_the_azure_4_gpu_run() -> None:
    """Azure ND GB200 v6 prints busbw only: 331.09 GB/s at 16 MiB on 4 GPUs, so t = 1.5·16 MiB
    / 331.09 GB/s = 76.01 µs; f = 2·3/4 = 1.5 and n = 6 at P = 4; against the preset's 679.61
    GB/s: (37.03 µs) / (76.01 − 18 µs) = 0.638, where NVLink 4's ramp (taken before this
    run was read) gives 0.94. So a 4-rank all-reduce of 16 MiB on the ramped link takes the
    measured 76 µs, not the 57.5 µs NVLink 4's shares gave."""
    t = 1.5 * 16 * MiB / 331.09e9
    expected = (1.5 * 16 * MiB / 679.61e9) / (t - 6 * ALPHA)
    assert expected == pytest.approx(0.6384, abs=1e-4)
    ramp = RAMPS["nvlink5"]
    for op in ("all-reduce", "all-gather", "reduce-scatter"):
        assert ramp.share(op, 16 * MiB) == pytest.approx(expected)
    assert RAMPS["nvlink4"].share("all-reduce", 16 * MiB) > 0.9
    link = Link("nvlink", 679.61e9, ALPHA, ramp=ramp)
    cost = collective_cost("all-reduce", [Tier(4, link)], 16 * MiB)
    assert cost.time_s == pytest.approx(t)
    # 1 MiB in 19.5 µs, 18 of them n·α: faster than the plateau leaves, so clipped to 1;
    # 2 MiB: (1.5 · 2 MiB / 679.61 GB/s = 4.63 µs) / (28.49 − 18 µs) = 0.441
    assert ramp.share("all-reduce", MiB) == 1.0
    assert ramp.share("all-reduce", 2 * MiB) == pytest.approx(0.441, abs=1e-3)
    assert ramp.share("all-reduce", 4 * MiB) == pytest.approx(0.370, abs=1e-3)


def test_only_points_faster_than_their_latency_term_are_dropped() -> None:
    """A point is kept wherever the measured time exceeds n·α: at 1 MiB the ring all_reduce
    on 8 H100s takes 46.52 µs, 14 x 3 µs of it latency, which leaves 4.52 µs for the 4.96
    µs the plateau needs (1.75 · 1 MiB / 370 GB/s): clipped to 1. A run faster than n·α
    leaves nothing to divide by."""
    sizes = [MiB, 64 * MiB, 8 * GiB]
    kept = curve_shares("all-reduce", sizes, [46.52e-6, 368.67e-6, 40838.9e-6], ALPHA, 370e9)
    assert kept[MiB] == 1.0
    assert curve_shares("all-reduce", [MiB], [41e-6], ALPHA, 370e9) == {}
    # the run's own plateau, 368.09 of 370 GB/s, and a little more once n·α is taken out
    assert kept[8 * GiB] == pytest.approx(_share(1.75, 14, 8 * GiB, 40838.9e-6, 370e9))
    assert kept[8 * GiB] == pytest.approx(0.9959, abs=1e-4)
    faster = curve_shares("all-reduce", sizes[1:], [1e-4, 1e-3], ALPHA, 370e9)
    assert faster == {64 * MiB: 1.0, 8 * GiB: 1.0}  # faster than the link: clipped


# Together's H100 ring runs (budget/catalog/nccl_tests.py), out-of-place µs at 1, 2, 4 and
# 8 MiB, as the run's files print them
H100_SMALL_US = {
    "all-reduce": (46.52, 42.06, 53.09, 80.49),
    "all-gather": (41.67, 41.48, 41.34, 47.01),
    "reduce-scatter": (40.60, 41.66, 41.70, 50.44),
}


@pytest.mark.parametrize("op", sorted(H100_SMALL_US))
def test_small_collectives_on_nvlink_4_take_the_times_the_cited_run_measured(op) -> None:
    """An audit: below 8 MiB the ramp held its 8 MiB share, so an 8-rank all-gather of
    1 MiB was priced 7 x 3 µs + 0.875 MiB / (370 GB/s x 0.763) = 24.25 µs where the cited run
    measured 41.67. All-gather and reduce-scatter now take the measured times, but where a
    larger buffer ran faster than a smaller one (all-gather: 41.48 µs at 2 MiB, 41.34 at 4,
    under 1 MiB's 41.67) the smaller's (`nccl_tests._rising`); the ring all-reduce, whose
    14 x 3 µs of n·α is above what NCCL took at 2 MiB (42.06 µs), stays over them by what
    n·α and the plateau add: 42 + 1.75 x 2 MiB / 370 GB/s = 51.92 µs, 23 %."""
    link = Link("nvlink", 370e9, ALPHA, ramp=RAMPS["nvlink4"])
    predicted = [
        collective_cost(op, [Tier(8, link)], size * MiB).time_s / 1e-6 for size in (1, 2, 4, 8)
    ]
    if op != "all-reduce":
        measured = H100_SMALL_US[op]
        rising = [max(measured[: i + 1]) for i in range(len(measured))]
        assert predicted == pytest.approx(rising, rel=1e-9)
        return
    floor = [14 * 3 + 1.75 * size * MiB / 370e9 / 1e-6 for size in (1, 2, 4, 8)]
    assert predicted == pytest.approx(floor, rel=1e-9)  # the share is 1: n·α + f·S / B
    assert predicted[1] / H100_SMALL_US[op][1] == pytest.approx(1.234, abs=1e-3)


@pytest.mark.parametrize("ramp", sorted(RAMPS))
def test_a_collective_never_gets_faster_as_it_grows(ramp) -> None:
    """A review: with the shares of 1, 2 and 4 MiB kept, an interpolation of the share in
    log S priced an 8-rank all-gather of 2.83 MiB at 40.22 µs, under the 41.67 µs of 1 MiB
    and every measured time around it. Swept at 2^(1/8) steps from 64 KiB to 8 GiB, every
    measured op, 2 to 8 ranks, one level at its plateau."""
    link = Link("nvlink", 370e9, ALPHA, ramp=RAMPS[ramp])
    sizes = [int(2 ** (k / 8)) for k in range(16 * 8, 33 * 8 + 1)]
    for op in ("all-reduce", "all-gather", "reduce-scatter"):
        for ranks in (2, 4, 8):
            times = [collective_cost(op, [Tier(ranks, link)], s).time_s for s in sizes]
            # flat where the running maximum held S / share (from 1 MiB), so equal but for
            # the bytes' rounding to whole chunks, (P − 1)·⌈S / P⌉: under P / S = 8e-6
            steps = zip(sizes[1:], times, times[1:], strict=False)  # times is one longer
            falls = [(s, a, b) for s, a, b in steps if b < a * (1 - 1e-5)]
            assert not falls, (op, ranks, falls[:3])


def test_share_holds_outside_the_points_and_interpolates_in_log_size() -> None:
    """Between two points the share is interpolated in log size, bounded so that S / share
    does not fall below the lower point's: from 1 to 4 MiB the H100 all-gather's shares
    grow as S does, and halfway the bound holds it at S x share(1 MiB) / 1 MiB."""
    ramp = RAMPS["nvlink4"]
    (op, sizes, shares) = next(p for p in ramp.points if p[0] == "all-gather")
    assert ramp.share(op, 1024) == shares[0]
    assert ramp.share(op, 16 * GiB) == shares[-1]
    middle = 2 ** ((np.log2(sizes[3]) + np.log2(sizes[4])) / 2)  # halfway in log size
    assert ramp.share(op, middle) == pytest.approx((shares[3] + shares[4]) / 2)
    sagging = 2 ** ((np.log2(sizes[1]) + np.log2(sizes[2])) / 2)  # 2.83 MiB
    assert (shares[1] + shares[2]) / 2 > sagging * shares[1] / sizes[1]
    assert ramp.share(op, sagging) == pytest.approx(sagging * shares[1] / sizes[1], rel=1e-12)
    assert ramp.share("all-to-all", 64 * MiB) == 1.0  # no sweep: the plateau
    array = ramp.share(op, np.array([1024, 64 * MiB, 16 * GiB]))
    assert array.tolist() == pytest.approx([shares[0], ramp.share(op, 64 * MiB), shares[-1]])


def test_a_collective_on_a_ramped_link_is_priced_at_the_share_of_its_size() -> None:
    """T = n·α + Q / (B_eff · share(S)): an 8-rank all-gather of 64 MiB on NVLink 4 at
    370 GB/s moves 7/8 · 64 MiB in 7 steps."""
    plain = Link("nvlink", 370e9, ALPHA)
    ramped = Link("nvlink", 370e9, ALPHA, ramp=RAMPS["nvlink4"])
    share = RAMPS["nvlink4"].share("all-gather", 64 * MiB)
    cost = collective_cost("all-gather", [Tier(8, ramped)], 64 * MiB)
    assert cost.time_s == pytest.approx(7 * ALPHA + 7 / 8 * 64 * MiB / (370e9 * share))
    flat = collective_cost("all-gather", [Tier(8, plain)], 64 * MiB)
    assert flat.latency_s == cost.latency_s
    assert flat.bandwidth_s == pytest.approx(cost.bandwidth_s * share)
    many = collective_cost("all-gather", [Tier(8, ramped)], np.array([64 * MiB, 8 * GiB]))
    at_8gib = RAMPS["nvlink4"].share("all-gather", 8 * GiB)
    last = 7 * ALPHA + 7 / 8 * 8 * GiB / (370e9 * at_8gib)
    assert many.time_s.tolist() == pytest.approx([cost.time_s, last])


def test_presets_ramp_nvlink_and_not_infiniband() -> None:
    for preset in TOPOLOGIES.values():
        for level in preset.levels:
            if level.name == "nvlink":
                generation = {
                    "dgx-a100": "nvlink3",
                    "gb200-nvl72": "nvlink5",
                    "dgx-b200": "nvlink5",
                }
                assert level.ramp is RAMPS[generation.get(preset.name, "nvlink4")]
                assert level.latency == 3e-6  # the smallest nccl-tests messages (test_presets)
            else:
                assert level.ramp is None


def test_a_written_level_names_its_ramp_and_the_report_shows_it(tmp_path: Path) -> None:
    """`ramp: nvlink3` on a hand-written level prices its collectives like the preset's; the
    report's collective rows give the B_eff reached at their size, the levels their ramp."""
    base = written_topology(tmp_path, "plain.yaml")
    ramped = written_topology(
        tmp_path, "ramped.yaml", (NVLINK, NVLINK.replace("3 us}", "3 us, ramp: nvlink3}"))
    )
    plain, report = budget_plan(base), budget_plan(ramped)
    assert report.links[0]["ramp"]["source"] == RAMPS["nvlink3"].source
    assert report.links[1]["ramp"] is None and plain.links[0]["ramp"] is None
    rows = [c for p in report.phases for c in p.collectives if c.link == "nvlink"]
    assert rows
    for row in rows:
        share = RAMPS["nvlink3"].share(row.op, row.bytes)
        assert row.bandwidth_Bps == pytest.approx(report.links[0]["bandwidth_Bps"] * share)
    assert report.step["time_s"] > plain.step["time_s"]
    out = runner.invoke(app, route([str(ramped), "--format", "json"])).stdout
    assert json.loads(out)["topology"]["levels"][0]["ramp"]["points"][0]["op"] == "all-reduce"
    table = runner.invoke(app, route([str(ramped)]), env={"COLUMNS": "120"}).stdout
    assert "share at 16 · 64 · 256 MiB" in table
    shown = [round(100 * RAMPS["nvlink3"].share("all-reduce", s * MiB)) for s in (16, 64, 256)]
    assert " · ".join(map(str, shown)) + " %" in table
    markdown = runner.invoke(app, route([str(ramped), "--format", "markdown"])).stdout
    assert "| share at 16 · 64 · 256 MiB |" in markdown
    assert "| " + " · ".join(map(str, shown)) + " % |" in markdown
    plain_table = runner.invoke(app, route([str(base)]), env={"COLUMNS": "120"}).stdout
    assert "share at" not in plain_table


def test_an_unknown_ramp_is_refused_with_its_place(tmp_path: Path) -> None:
    path = written_topology(
        tmp_path, "bad.yaml", (NVLINK, NVLINK.replace("3 us}", "3 us, ramp: nvlink9}"))
    )
    result = runner.invoke(app, route([str(path)]))
    assert result.exit_code == 2
    assert "$.topology.levels[0].ramp" in result.stderr
    assert result.stdout == ""


def test_the_collective_calculator_takes_the_same_ramp() -> None:
    """`budget collective --ramp nvlink4` prices the link as a plan's ramped level does."""
    args = ["collective", "all-gather", "--ranks", "8", "--size", "64MiB"]
    args += ["--bandwidth", "370GB/s", "--latency", "3us", "--ramp", "nvlink4", "-f", "json"]
    out = json.loads(runner.invoke(app, route(args)).stdout)
    share = RAMPS["nvlink4"].share("all-gather", 64 * MiB)
    assert out["bandwidth_Bps"] == pytest.approx(370e9 * share)
    assert out["time_s"] == pytest.approx(7 * ALPHA + 7 / 8 * 64 * MiB / (370e9 * share))
    table = runner.invoke(app, route(args[:-2]), env={"COLUMNS": "80"}).stdout
    assert f"{round(100 * share)} % of B at this size" in table
    bad = runner.invoke(app, route([*args[:-3], "nvlink9"]))
    assert bad.exit_code == 2 and "--ramp 'nvlink9': unknown ramp" in bad.stderr


def test_an_all_to_all_no_sweep_measured_is_said_to_run_at_the_plateau() -> None:
    """No published sweep measures an all-to-all on NVLink, so it runs at the plateau; the
    calculator said its 100 % was "at this size (measured ramp)", and a report's Links note
    that every collective reached the shares shown (an audit)."""
    args = ["collective", "all-to-all", "--ranks", "8", "--size", "128MiB"]
    args += ["--bandwidth", "370GB/s", "--latency", "3us", "--ramp", "nvlink4"]
    assert not RAMPS["nvlink4"].measures("all-to-all")
    assert RAMPS["nvlink4"].measures("all-gather")
    out = json.loads(runner.invoke(app, route([*args, "-f", "json"])).stdout)
    assert out["bandwidth_Bps"] == pytest.approx(370e9)  # the plateau
    table = " ".join(runner.invoke(app, route(args), env={"COLUMNS": "80"}).stdout.split())
    assert "100 % of B: no sweep measured an all-to-all here" in table
    assert "measured ramp" not in table
    root = Path(__file__).parents[1] / "plans"
    moe = budget_plan(root / "deepseek-moe-16b.yaml")
    dense = budget_plan(root / "gpt3-175b.yaml")
    from budget.report import BORROWED_NOTE, RAMP_NOTE, ramp_note

    # its expert all-to-all runs on NVLink, its pipeline sends do not; InfiniBand has no
    # ramp, which its "–" says (an audit: read as a level no collective used)
    flat = "; – on infiniband, which no sweep measured: its collectives run at the plateau"
    assert (
        ramp_note(moe)
        == f"{RAMP_NOTE}; all-to-all, which no sweep measured, runs at the plateau{flat}"
    )
    # its stage sends cross InfiniBand, unramped; its NVLink all-gathers and reduce-scatters
    # (sequence parallelism) take the A100 all-reduce sweep's shares (a review, m514)
    borrowed = "; " + BORROWED_NOTE.format("all-gather and reduce-scatter").lstrip("; ")
    assert ramp_note(dense) == RAMP_NOTE + borrowed + flat
    table = " ".join(runner.invoke(app, route([str(root / "gpt3-175b.yaml")])).stdout.split())
    assert "infiniband 24 GB/s 14 µs – pp, dp" in table and flat.lstrip("; ") in table


def test_a_pipeline_inside_a_node_is_not_said_to_run_an_all_to_all(tmp_path: Path) -> None:
    """The note names the unmeasured operations the plan runs on a ramped level: a dense
    plan's send-recv inside a node, not an all-to-all it does not have (a review)."""
    from budget.report import BORROWED_NOTE, RAMP_NOTE, ramp_note
    from tests.plan_files import variant

    plan = variant(
        tmp_path,
        "pp2.yaml",
        ("pp: 1", "pp: 2"),
        ("dp: 8", "dp: 4"),
        base=Path(__file__).parents[1] / "plans" / "gpt-1.3b.yaml",
    )
    note = ramp_note(budget_plan(plan))
    flat = "; – on infiniband, which no sweep measured: its collectives run at the plateau"
    borrowed = "; " + BORROWED_NOTE.format("all-gather and reduce-scatter").lstrip("; ")
    assert note == (
        f"{RAMP_NOTE}{borrowed}; send-recv, which no sweep measured, runs at the plateau{flat}"
    )


def test_a_share_copied_from_the_all_reduce_sweep_is_not_said_measured() -> None:
    """A review (m514): the A100's and GB200's all-gather and reduce-scatter take the
    all-reduce sweeps' shares (no sweep of them was found), and `budget collective` called
    them a measured ramp; H100's were measured apart."""
    assert (
        RAMPS["nvlink5"].borrowed == RAMPS["nvlink3"].borrowed == ("all-gather", "reduce-scatter")
    )
    assert RAMPS["nvlink4"].borrowed == ()

    def said(op: str, ramp: str) -> str:
        args = ["collective", op, "--ranks", "8", "--size", "16MiB", "--bandwidth", "679.61GB/s"]
        out = CliRunner().invoke(app, [*args, "--latency", "3us", "--ramp", ramp]).stdout
        return " ".join(out.split())

    copied = "(the all-reduce sweep's ramp: no sweep measured an all-gather here)"
    assert copied in said("all-gather", "nvlink5")
    assert "(measured ramp)" in said("all-reduce", "nvlink5")
    assert "(measured ramp)" in said("all-gather", "nvlink4")
    # a report names them where they run on the borrowing level alone (a review, m520): GPT-3
    # without sequence parallelism gathers and reduce-scatters over InfiniBand only
    from budget.report import BORROWED_NOTE, ramp_note
    from tests.plan_files import GPT3

    clause = BORROWED_NOTE.format("all-gather and reduce-scatter")
    assert clause in ramp_note(budget_plan(GPT3))
    text = GPT3.read_text(encoding="utf-8").replace(
        "sequence_parallel: true", "sequence_parallel: false"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / "nosp.yaml"
        plain.write_text(text, encoding="utf-8")
        assert clause not in ramp_note(budget_plan(plain))
