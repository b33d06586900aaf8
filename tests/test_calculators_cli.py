"""`budget collective` and `budget roofline` through the CLI runner: numbers, JSON keys,
renderers and user errors (exit 2, one line on stderr, no traceback)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from budget.calculators import collective, roofline
from budget.cli import app, route
from budget.render.calculators import render_collective, render_roofline

runner = CliRunner()

COLLECTIVE_KEYS = {
    "schema_version",
    "op",
    "algorithm",
    "ranks",
    "size_bytes",
    "steps",
    "sent_bytes",
    "recv_bytes",
    "aggregate_sent_bytes",
    "aggregate_recv_bytes",
    "payload_bytes",
    "latency_term_s",
    "bandwidth_term_s",
    "latency_s",
    "bandwidth_Bps",
    "time_s",
    "bus_bandwidth_Bps",
    "algorithm_bandwidth_Bps",
}
ROOFLINE_KEYS = {
    "schema_version",
    "intensity",
    "bandwidth_Bps",
    "peak_flops",
    "attainable_flops",
    "ridge_intensity",
    "bound",
}
ACCEPTANCE_1 = ["--ranks", "8", "--size", "1GiB", "--bandwidth", "450GB/s", "--latency", "1us"]
FOUR_NODES = ["--level", "8:450GB/s:1us", "--level", "4:50GB/s:5us", "--size", "1GiB"]


def _ranks(ranks: str) -> list[str]:
    """A 1 GiB collective on a 1 GB/s, 1 µs link over `ranks` ranks, as typed."""
    return ["--ranks", ranks, "--size", "1GiB", "--bandwidth", "1GB/s", "--latency", "1us"]


def _link(bandwidth: str, latency: str) -> list[str]:
    """A 1 GiB collective over 8 ranks on one link, its bandwidth and latency as typed."""
    return ["--ranks", "8", "--size", "1GiB", "--bandwidth", bandwidth, "--latency", latency]


def _json(args: list[str]) -> dict[str, Any]:
    result = runner.invoke(app, route([*args, "--format", "json"]))
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _errors(args: list[str]) -> list[str]:
    result = runner.invoke(app, route(args))
    # a crash keeps its traceback in result.exception, never in the output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    return result.stderr.splitlines()


def _error(args: list[str]) -> str:
    lines = _errors(args)
    assert len(lines) == 1
    return lines[0]


def test_acceptance_1_ring_all_gather_and_all_reduce() -> None:
    # DESIGN.md reference: 7 steps, 939,524,096 B each way per rank, 2094.831 µs.
    data = _json(["collective", "all-gather", *ACCEPTANCE_1])
    assert set(data) == COLLECTIVE_KEYS
    assert (data["op"], data["algorithm"], data["ranks"]) == ("all-gather", "ring", 8)
    assert data["size_bytes"] == 2**30
    assert data["steps"] == 7
    assert data["sent_bytes"] == data["recv_bytes"] == 939_524_096
    assert data["time_s"] * 1e6 == pytest.approx(2094.831, abs=5e-4)
    assert data["latency_s"] == 1e-6 and data["bandwidth_Bps"] == 450e9
    assert data["bus_bandwidth_Bps"] == pytest.approx(939_524_096 / data["time_s"])
    # all-reduce: 14 steps, 4189.663 µs
    data = _json(["collective", "all-reduce", *ACCEPTANCE_1])
    assert data["steps"] == 14
    assert data["time_s"] * 1e6 == pytest.approx(4189.663, abs=5e-4)


def test_acceptance_1_table_shows_exact_bytes_and_microseconds() -> None:
    result = runner.invoke(app, route(["collective", "all-gather", *ACCEPTANCE_1]))
    assert result.exit_code == 0
    out = result.stdout
    assert "896 MiB (939,524,096 B)" in out
    assert "2,094.831 µs" in out
    assert "bandwidth-bound" in out
    assert "7.000 µs" in out  # n·α
    assert "(S over T)" in out


def test_an_all_to_alls_algorithm_bandwidth_says_it_is_of_one_ranks_buffer() -> None:
    """nccl-tests' alltoall_perf divides one rank's buffer by the time: 1 GiB over 8 ranks
    in 267.98 µs is 500.9 GB/s, not S / T = 4,007 GB/s (an audit read it as a mistake)."""
    args = ["collective", "all-to-all", "--ranks", "8", "--size", "1GiB"]
    args += ["--bandwidth", "450GB/s", "--latency", "1us"]
    data = _json(args)
    assert data["algorithm_bandwidth_Bps"] == pytest.approx(2**30 / 8 / data["time_s"])
    out = " ".join(runner.invoke(app, route(args), terminal_width=200).stdout.split())
    assert "(S / P over T: one rank's buffer, as nccl-tests counts an all-to-all)" in out


def test_an_all_to_all_behind_a_slower_spine_names_its_busiest_level() -> None:
    """Its bandwidth term is the spine's 4 MiB at 25 GB/s, the level that sets it
    (`collectives._exchange_ports`; the hand calculation is test_collectives_audit's), and
    the text says each level carries its own peers' blocks and those past it."""
    args = ["collective", "all-to-all", "--ranks", "8", "--size", "64MiB"]
    args += ["--level", "1:450GB/s:3us", "--level", "4:50GB/s:10us", "--level", "2:25GB/s:20us"]
    assert _json(args)["time_s"] == pytest.approx(110e-6 + 4 * 2**20 / 25e9, rel=1e-12)
    out = " ".join(runner.invoke(app, route(args), terminal_width=200).stdout.split())
    assert "(Q = 4 MiB (4,194,304 B) over level 3 at 25 GB/s of the 7 MiB" in out
    assert "each outer level the blocks for peers on it or past it, at its own rate" in out
    assert "the outer ones at the slowest one's rate" not in out


@pytest.mark.parametrize(
    ("op", "algorithm", "sent", "received"),
    [
        (
            "send-recv",
            "auto",
            "1 GiB (1,073,741,824 B) (the sender; the receiver sends none)",
            "1 GiB (1,073,741,824 B) (the receiver)",
        ),
        # an audit: over 8 ranks a chain, a pipeline's, whose aggregate is 7 sends of S
        (
            "send-recv-chain",
            "auto",
            "1 GiB (1,073,741,824 B) (each rank but the last, which sends none)",
            "1 GiB (1,073,741,824 B) (each rank but the first, which receives none)",
        ),
        # a chain: the root and every rank but the last forward S once (nccl-tests' one
        # copy a rank); a binomial tree's root sends it once for each of log2(8) = 3 levels
        (
            "broadcast",
            "ring",
            "1 GiB (1,073,741,824 B) (the busiest rank; the chain's last rank sends none)",
            "1 GiB (1,073,741,824 B) (each rank but the root, which receives none)",
        ),
        (
            "broadcast",
            "tree",
            "3 GiB (3,221,225,472 B) (the busiest rank; the tree's leaves send none)",
            "1 GiB (1,073,741,824 B) (each rank but the root, which receives none)",
        ),
        (
            "all-gather",
            "ring",
            "896 MiB (939,524,096 B) received",
            "896 MiB (939,524,096 B) sent by",
        ),
    ],
)
def test_a_one_way_collectives_bytes_say_which_ranks_they_are_of(
    op: str, algorithm: str, sent: str, received: str
) -> None:
    """A user audit read send-recv's "sent per rank 1 GiB" and "received per rank 1 GiB" as
    every rank's, where the receiver sends nothing; a broadcast's root receives nothing.
    An all-gather's every rank sends and receives (P − 1)/P · S = 7/8 GiB, unqualified."""
    ranks = "2" if op == "send-recv" else "8"
    op = op.removesuffix("-chain")
    args = ["collective", op, "--ranks", ranks, "--size", "1GiB", "--algorithm", algorithm]
    out = runner.invoke(app, route([*args, "--bandwidth", "450GB/s", "--latency", "1us"]))
    assert out.exit_code == 0, out.stdout
    text = " ".join(out.stdout.split())
    assert f"sent per rank {sent}" in text
    assert f"received per rank {received}" in text


def test_acceptance_2_seed_example() -> None:
    # 4 phases × 5 µs + 100 MB / 50 GB/s = 20 µs + 2 ms = 2.02 ms.
    data = _json(
        [
            "collective",
            "all-gather",
            "--ranks",
            "5",
            "--size",
            "125MB",
            "--bandwidth",
            "50GB/s",
            "--latency",
            "5us",
        ]
    )
    assert data["steps"] == 4
    assert data["sent_bytes"] == 100_000_000
    assert data["time_s"] == pytest.approx(2.02e-3)


def test_acceptance_3_ring_across_levels_and_hierarchical() -> None:
    # The default across levels, NCCL's ring (tests/test_collectives.py, by hand): of its
    # 2(P - 1) = 62 steps NCCL counts 2·nNodes = 2 · 4 = 8 on the network (tuning.cc at
    # b647562; 2(nNodes - 1) = 6 before), the other 54 inside the nodes, each at its link's
    # α: 54 · 1 µs + 8 · 5 µs = 94 µs. The bandwidth term is as before: each rank's port
    # carries 1/8 of its 2 · 31/32 · 2^30 B = 260,046,848 B, / 50 GB/s = 5,200.937 µs; so
    # T = 94 + 5,200.937 = 5,294.937 µs.
    ring = _json(["collective", "all-reduce", *FOUR_NODES])
    assert ring["algorithm"] == "ring" and ring["steps"] == 62
    assert ring["latency_term_s"] * 1e6 == pytest.approx(54 * 1 + 8 * 5)
    assert ring["bandwidth_term_s"] == pytest.approx(2 * 31 * 2**30 / 32 / 8 / 50e9)
    assert ring["time_s"] * 1e6 == pytest.approx(5294.937, abs=5e-4)
    assert [(s["link"], s["steps"]) for s in ring["levels"]] == [("level 1", 54), ("level 2", 8)]
    assert ring["latency_term_s"] + ring["bandwidth_term_s"] == pytest.approx(ring["time_s"])
    # Named hierarchical: RS inside 8 (2094.831 µs) + AR across 4 on S/8 (30 µs +
    # 4026.532 µs) + AG inside (2094.831 µs) = 8246.194 µs; one flat ring on the 50 GB/s
    # link: 62 · 5 µs + 2 · 31/32 · 2^30 B / 50 GB/s = 41,917.5 µs.
    data = _json(["collective", "all-reduce", *FOUR_NODES, "--algorithm", "hierarchical"])
    assert set(data) == COLLECTIVE_KEYS | {"levels"}
    assert data["algorithm"] == "hierarchical" and data["ranks"] == 32
    assert data["time_s"] * 1e6 == pytest.approx(8246.194, abs=5e-4)
    assert [(s["op"], s["ranks"], s["steps"]) for s in data["levels"]] == [
        ("reduce-scatter", 8, 7),
        ("all-reduce", 4, 6),
        ("all-gather", 8, 7),
    ]
    assert data["levels"][1]["size_bytes"] == 2**30 // 8
    # T's terms sum the levels' (7 + 30 + 7 = 44 us of latency), which steps x latency_s
    # (20 x 5 us, the slowest link's) is not (review: the JSON did not give them)
    assert data["latency_term_s"] * 1e6 == pytest.approx(44.0)
    assert data["latency_term_s"] + data["bandwidth_term_s"] == pytest.approx(data["time_s"])
    assert data["latency_term_s"] != pytest.approx(data["steps"] * data["latency_s"])
    flat = _json(["collective", "all-reduce", *FOUR_NODES, "--algorithm", "recursive"])
    assert flat["algorithm"] == "recursive" and flat["steps"] == 10
    assert flat["bandwidth_Bps"] == 50e9  # every step at the slowest link spanned
    assert flat["latency_term_s"] == pytest.approx(10 * 5e-6)


def test_a_named_tree_on_one_level_is_nccls_chain_and_its_table_fits_80_columns() -> None:
    """`--algorithm double-tree` on one level prices NCCL's chain inside a node (2(P - 1)
    steps, 2S at 92 % x its correction: 0.8 at 100 MB) and says so; over two levels the
    stage table names the op only (the title says whose hops), which had run to 83
    columns and cut the time column at 80 (a review)."""
    one = ["collective", "all-reduce", "--size", "100MB", "--level", "8:370GB/s:3us"]
    chain = _json([*one, "--algorithm", "double-tree"])
    assert chain["algorithm"] == "double-tree" and chain["steps"] == 14
    assert chain["bandwidth_term_s"] == pytest.approx(2e8 / (370e9 * 0.92 * 0.8))
    levels = ["--level", "8:370GB/s:3us", "--level", "16:47GB/s:14us"]
    args = ["collective", "all-reduce", "--size", "100MB", *levels, "--algorithm", "double-tree"]
    out = runner.invoke(app, route(args), env={"COLUMNS": "80"}).stdout
    assert "chain" not in out and "the tree's hops on each level" in out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    said = runner.invoke(app, route([*one, "--algorithm", "double-tree"]), env={"COLUMNS": "80"})
    assert "NCCL's chain inside one node" in " ".join(said.stdout.split())


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_a_hierarchical_broadcast_s_stages_are_not_said_to_receive_what_they_send(fmt: str) -> None:
    """An audit: a two-level broadcast's node leader receives S once (across the nodes) and
    sends it on both levels, 2 GiB sent and 1 GiB received per rank, but its stage table was
    headed "per rank: received = sent". A symmetric one keeps that heading."""
    args = ["collective", "broadcast", "--ranks", "32", *FOUR_NODES, "--algorithm"]
    data = _json([*args, "hierarchical"])
    assert (data["sent_bytes"], data["recv_bytes"]) == (2 * 2**30, 2**30)
    out = runner.invoke(app, route([*args, "hierarchical", "--format", fmt])).stdout
    assert "received = sent" not in out
    assert "stages (sent per rank; received, above)" in out
    reduce = ["collective", "all-reduce", "--ranks", "32", *FOUR_NODES, "--algorithm"]
    out = runner.invoke(app, route([*reduce, "hierarchical", "--format", fmt])).stdout
    assert "stages (per rank: received = sent)" in out


def test_hierarchical_asked_for_over_one_link_is_refused() -> None:
    """A plan's group inside one level falls back to the flat default quietly; asked for
    on the command line over one link, it printed 'ring' with no word (review)."""
    one_link = ["--ranks", "8", "--size", "1GiB", "--bandwidth", "450GB/s", "--latency", "1us"]
    message = _error(["collective", "all-gather", *one_link, "--algorithm", "hierarchical"])
    assert message.startswith("budget: error: --algorithm hierarchical needs ranks on two or")
    assert "it would be ring" in message
    idle = ["--level", "8:450GB/s:1us", "--level", "1:50GB/s:5us", "--algorithm", "hierarchical"]
    assert "two or more levels" in _error(["collective", "all-gather", "--size", "1GiB", *idle])


def test_ranks_must_match_the_levels_when_given() -> None:
    assert _json(["collective", "all-reduce", *FOUR_NODES, "--ranks", "32"])["ranks"] == 32
    message = _error(["collective", "all-reduce", *FOUR_NODES, "--ranks", "16"])
    assert (
        message
        == "budget: error: --ranks 16 does not match the levels, which hold 8 × 4 = 32 ranks"
    )
    one = _error(
        ["collective", "all-reduce", "--level", "8:450GB/s:1us", "--ranks", "16", "--size", "1GiB"]
    )
    assert (
        one == "budget: error: --ranks 16 does not match the levels, which hold 8 ranks"
    )  # not "8 = 8"
    single = ["collective", "all-reduce", "--level", "1:450GB/s:1us", "--ranks", "2"]
    assert _error([*single, "--size", "1GiB"]).endswith("which hold 1 rank")


def test_two_levels_of_one_name_are_refused() -> None:
    """As a plan's levels are (`resolve`): a report naming each level's share would print
    "ib: ...; ib: ..." and could not tell them apart (a review)."""
    levels = ["--level", "8:450GB/s:1us:nvlink", "--level", "4:50GB/s:5us:ib"]
    args = ["collective", "all-reduce", *levels, "--level", "2:25GB/s:10us:ib", "--size", "1GiB"]
    assert _error(args) == (
        "budget: error: --level names must differ, as a plan's levels must: 'ib' twice"
    )
    unnamed = ["collective", "all-reduce", "--level", "8:450GB/s:1us", "--level", "4:50GB/s:5us"]
    assert _json([*unnamed, "--size", "1GiB"])["ranks"] == 32  # "level 1", "level 2"
    # nor one that reads as two: reports join the levels a collective spans with " + "
    joined = ["collective", "all-reduce", "--level", "8:450GB/s:1us:nv + sw", *levels[2:]]
    assert _error([*joined, "--size", "1GiB"]) == (
        "budget: error: --level '8:450GB/s:1us:nv + sw': NAME 'nv + sw' contains ' + ', which "
        "reports put between the levels a collective spans"
    )


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_a_group_of_one_rank_moves_nothing_in_every_format(fmt: str) -> None:
    """One rank: no step, no byte, no link; the table and markdown raised an IndexError
    naming the links the collective used (a seeds audit), where JSON answered."""
    for link in (["--bandwidth", "450GB/s", "--latency", "1us"], ["--level", "1:450GB/s:1us"]):
        args = ["collective", "all-gather", "--ranks", "1", "--size", "1GiB", *link]
        result = runner.invoke(app, route([*args, "--format", fmt]))
        assert result.exit_code == 0, result.output
        if fmt == "json":
            data = json.loads(result.stdout)
            assert (data["steps"], data["sent_bytes"], data["time_s"]) == (0, 0, 0.0)
        else:
            assert "none: a group of one rank sends nothing" in result.stdout


def test_auto_says_what_it_chose_and_why() -> None:
    data = _json(["collective", "all-reduce", *FOUR_NODES, "--algorithm", "auto"])
    assert data["algorithm"] == "ring"
    times = {c["algorithm"]: c["time_s"] for c in data["candidates"]}
    assert set(times) == {"hierarchical", "ring", "double-tree", "recursive", "tree"}
    assert min(times, key=lambda name: times[name]) == "ring"
    # NCCL's tree: 2 x (7 x 1 us + 2 x 5 us) = 34 us, each rank's 2 x 2^30 B with its port's
    # eighth at 92 % of 50 GB/s: 268,435,456 / 46e9 = 5,835.553 us, 5,869.553 us in all
    assert times["double-tree"] * 1e6 == pytest.approx(5869.553, abs=5e-4)
    table = runner.invoke(app, route(["collective", "all-reduce", *FOUR_NODES, "-f", "json"]))
    assert "candidates" not in json.loads(table.stdout)


def test_auto_lists_its_candidates_in_one_unit_right_aligned() -> None:
    """The candidates' times were left-aligned in the unit each took on its own, so that
    "40,345.318 µs" above "171.879 ms" read as the larger (an audit): one column in the
    fastest's unit, right-aligned."""
    levels = ["--level", "8:450GB/s:3us", "--level", "2:50GB/s:10us"]
    args = ["collective", "all-reduce", "--ranks", "16", "--size", "1GiB", *levels]
    data = _json([*args, "--algorithm", "auto"])
    times = {c["algorithm"]: c["time_s"] for c in data["candidates"]}
    out = runner.invoke(app, route([*args, "--algorithm", "auto"]), env={"COLUMNS": "80"}).stdout
    rows = out.split("auto: candidates")[1].split("\n\n")[1].splitlines()[2:]
    assert [row.split()[0] for row in rows] == list(times)
    shown = {row.split()[0]: row.rstrip() for row in rows}
    for name, seconds in times.items():
        assert shown[name].endswith(f"{seconds * 1e6:,.3f} µs"), shown[name]
    assert len({len(row) for row in shown.values()}) == 1  # the figures' last digits aligned
    assert "chosen" in shown[data["algorithm"]]


def test_acceptance_4_roofline() -> None:
    args = ["roofline", "--intensity", "4", "--bandwidth", "80GB/s", "--peak", "1000GFLOP/s"]
    data = _json(args)
    assert set(data) == ROOFLINE_KEYS
    assert data["attainable_flops"] == pytest.approx(320e9)
    assert data["bound"] == "memory"
    assert data["ridge_intensity"] == pytest.approx(12.5)
    table = runner.invoke(app, route(args)).stdout
    assert "320 GFLOP/s" in table and "memory-bound" in table and "12.5 FLOP/byte" in table
    assert "sent and received" not in table  # the collectives' footnote is not a roofline's
    # the intensity takes its unit as every other quantity does (a DESIGN audit)
    for written in ("4FLOP/byte", "4 FLOP/B", "4 flops/byte"):
        assert _json([*args[:2], written, *args[3:]])["attainable_flops"] == pytest.approx(320e9)
    refused = runner.invoke(app, route([*args[:2], "4GB", *args[3:]]))
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "--intensity must be a number of FLOP/byte, such as 4 or 4FLOP/byte" in refused.stderr


def test_an_intensity_on_its_ridge_reads_compute_bound_at_the_peak() -> None:
    """0.29 FLOP/byte at 100 GB/s under 29 GFLOP/s: I·B rounds to 28.999999999999996
    GFLOP/s, which read memory-bound beside a ridge of 0.29 (an audit, m390); on the ridge
    both ceilings meet, and the table says so at the peak, within 80 columns."""
    args = ["roofline", "--intensity", "0.29", "--bandwidth", "100GB/s", "--peak", "29GFLOP/s"]
    data = _json(args)
    assert (data["bound"], data["attainable_flops"]) == ("compute", 29e9)
    table = runner.invoke(app, route(args), env={"COLUMNS": "80"}).stdout
    assert "compute-bound (on the ridge: I·B = F = 29 GFLOP/s)" in table
    assert "28.99" not in table and max(len(line) for line in table.splitlines()) <= 80


def test_a_memory_bound_rate_just_under_the_ceiling_reads_under_it() -> None:
    """I·B = 12.4999 x 80 GB/s = 999.992 GFLOP/s under a 1 TFLOP/s ceiling read "1000
    GFLOP/s", memory-bound and "< F" beside F = "1 TFLOP/s" (review)."""
    args = ["roofline", "--intensity", "12.4999", "--bandwidth", "80GB/s", "--peak", "1TFLOP/s"]
    table = runner.invoke(app, route(args)).stdout
    assert "attainable min(F, I·B)   0.99999 TFLOP/s" in table
    assert "memory-bound (I·B = 0.99999 TFLOP/s < F)" in table
    assert "1000 GFLOP/s" not in table


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_renderers_write_only_to_the_console_they_are_given(fmt: str) -> None:
    console = Console(width=100, color_system=None, record=True)
    render_collective(
        console,
        collective(
            "all-reduce",
            None,
            "1GiB",
            None,
            None,
            ["8:450GB/s:1us:nvlink", "4:50GB/s:5us:ib"],
            "auto",
        ),
        fmt,
    )
    render_roofline(console, roofline(4, "80GB/s", "1000GFLOP/s"), fmt)
    text = console.export_text()
    # auto's ring over 4 nodes of 8 (test_acceptance_3_ring_across_levels_and_hierarchical):
    # 54 nvlink steps of 1 µs and NCCL's 2·nNodes = 8 ib steps of 5 µs, 94 µs, + 1/8 of
    # 2 · 31/32 · 2^30 B on each 50 GB/s port, 5,200.937 µs: 5,294.937 µs
    assert "5,294.937 µs" in text and "hops on each level" in text and "chosen" in text
    assert "nvlink: B 450 GB/s per GPU, α 1 µs; ib: B 50 GB/s per GPU, α 5 µs" in text
    if fmt == "markdown":
        assert (
            "| time T | 5,294.937 µs  (bandwidth-bound; the total, all of it exposed: no compute "
            "beside it, see --beside) |" in text
        )


def test_a_zero_latency_needs_no_unit() -> None:
    """0 is 0 in every unit: a bare --latency 0 prices the bandwidth term alone."""
    assert _json(["collective", "all-gather", *_link("450GB/s", "0")])["latency_s"] == 0.0


def test_latency_bound_is_named() -> None:
    result = runner.invoke(
        app,
        route(
            [
                "collective",
                "all-reduce",
                "--ranks",
                "64",
                "--size",
                "1KiB",
                "--bandwidth",
                "50GB/s",
                "--latency",
                "5us",
            ]
        ),
    )
    assert "latency-bound" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["collective", "gather", *ACCEPTANCE_1], "unknown collective 'gather'"),
        (
            ["collective", "all-gather", *ACCEPTANCE_1, "--algorithm", "tree"],
            "--algorithm 'tree': all-gather has no 'tree' algorithm",
        ),
        (
            ["collective", "all-gather", *ACCEPTANCE_1, "--algorithm", "magic"],
            "--algorithm 'magic': unknown algorithm",
        ),
        (
            ["collective", "all-gather", *_ranks("0")],
            "--ranks must be from 1 to 16,777,216, got 0",
        ),
        (
            ["collective", "all-gather", *_ranks("-3")],
            "--ranks must be from 1 to 16,777,216, got -3",
        ),
        (
            ["collective", "all-reduce", *_ranks("99999999999999999999")],
            # an OverflowError traceback from the rank list until this was checked
            "--ranks must be from 1 to 16,777,216, got 99,999,999,999,999,999,999",
        ),
        (
            [
                "collective",
                "all-reduce",
                "--level",
                "99999999999:450GB/s:1us",
                "--level",
                "4:50GB/s:5us",
                "--size",
                "1GiB",
            ],
            "the levels hold 99999999999 × 4 = 399,999,999,996 ranks; at most 16,777,216",
        ),
        (
            [
                "collective",
                "all-gather",
                "--ranks",
                "8",
                "--size",
                "-1GiB",
                "--bandwidth",
                "1GB/s",
                "--latency",
                "1us",
            ],
            "is negative",
        ),
        (
            [
                "collective",
                "all-gather",
                "--ranks",
                "8",
                "--size",
                "1GiB",
                "--bandwidth",
                "0GB/s",
                "--latency",
                "1us",
            ],
            "--bandwidth '0GB/s': a link's bandwidth is at least 1 B/s",
        ),
        (  # under 1 B/s the time is past a float's range: it was inf s, and JSON crashed
            [
                "collective",
                *("all-reduce", "--ranks", "8", "--size", "1GiB"),
                *("--bandwidth", "1e-300B/s", "--latency", "1us", "--format", "json"),
            ],
            "--bandwidth '1e-300B/s': a link's bandwidth is at least 1 B/s",
        ),
        (
            ["collective", "all-reduce", "--size", "1GiB", "--level", "8:0.5B/s:1us"],
            "--level '8:0.5B/s:1us': a link's bandwidth is at least 1 B/s",
        ),
        (  # I·B past a float's range ended in a traceback from the table's units
            ["roofline", "--intensity", "1e300", "--bandwidth", "80GB/s", "--peak", "1TFLOP/s"],
            "past a float's range",
        ),
        (  # and F/B in the JSON's
            [
                *("roofline", "--intensity", "1", "--bandwidth", "1e-300B/s"),
                *("--peak", "1TFLOP/s", "--format", "json"),
            ],
            "past a float's range",
        ),
        (
            ["collective", "all-gather", "--ranks", "8", "--size", "1GiB", "--bandwidth", "1GB/s"],
            "give --ranks, --bandwidth and --latency",
        ),
        (
            [
                "collective",
                "all-gather",
                "--ranks",
                "8",
                "--bandwidth",
                "1GB/s",
                "--latency",
                "1us",
            ],
            "--size is required",
        ),
        (
            ["collective", "all-gather", "--size", "1GiB", "--level", "8:450GB/s"],
            "expected SIZE:BANDWIDTH:LATENCY",
        ),
        (
            ["collective", "all-gather", "--size", "1GiB", "--level", "0:450GB/s:1us"],
            "SIZE must be at least 1",
        ),
        (
            [
                "collective",
                "all-gather",
                "--size",
                "1GiB",
                "--level",
                "8:450GB/s:1us",
                "--bandwidth",
                "1GB/s",
            ],
            "not both",
        ),
        (
            [
                "collective",
                "reduce-scatter",
                "--ranks",
                "6",
                "--size",
                "1GiB",
                "--bandwidth",
                "1GB/s",
                "--latency",
                "1us",
                "--algorithm",
                "recursive",
            ],
            "power-of-two",
        ),
        (
            ["roofline", "--intensity", "-4", "--bandwidth", "80GB/s", "--peak", "1TFLOP/s"],
            "intensity must be a finite number",
        ),
        (
            ["roofline", "--intensity", "4", "--bandwidth", "80 parsecs", "--peak", "1TFLOP/s"],
            "--bandwidth '80 parsecs': expected a bandwidth",
        ),
        # bare numbers were read as B/s, seconds and FLOP/s: 450 B/s and 3 s a phase priced a
        # 1 GiB all-reduce at 48 days, without a word (user audit)
        (
            ["collective", "all-reduce", *_link("450", "3us")],
            "--bandwidth '450': 450 has no unit; write a bandwidth with its unit, such as "
            "'450 GB/s' or '450 Gb/s'",
        ),
        (
            ["collective", "all-reduce", *_link("450GB/s", "3")],
            "--latency '3': 3 has no unit; write a time with its unit, such as '3 us', '3 ms' "
            "or '3 s'",
        ),
        (
            ["collective", "all-reduce", "--size", "1GiB", "--level", "8:450:1us"],
            "--level '8:450:1us': 450 has no unit; write a bandwidth with its unit",
        ),
        (
            ["collective", "all-reduce", "--size", "1GiB", "--level", "8:450GB/s:1"],
            "--level '8:450GB/s:1': 1 has no unit; write a time with its unit",
        ),
        (
            ["roofline", "--intensity", "4", "--bandwidth", "3350", "--peak", "989TFLOP/s"],
            "--bandwidth '3350': 3350 has no unit; write a bandwidth with its unit, such as "
            "'3350 GB/s' or '3350 Gb/s'",
        ),
        (
            ["roofline", "--intensity", "4", "--bandwidth", "3350GB/s", "--peak", "989"],
            "--peak '989': 989 has no unit; write a compute rate with its unit, such as "
            "'989 TFLOP/s'",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    line = _error(args)
    assert line.startswith("budget: error: ")
    assert message in line


@settings(max_examples=80, deadline=None)
@given(
    op=st.sampled_from(["all-gather", "all-reduce", "all-to-all", "broadcast", "send-recv", "x"]),
    size=st.text(max_size=12),
    bandwidth=st.text(max_size=12),
    ranks=st.integers(-5, 100),
)
def test_no_input_makes_the_cli_raise_a_traceback(
    op: str, size: str, bandwidth: str, ranks: int
) -> None:
    args = [
        "collective",
        op,
        "--ranks",
        str(ranks),
        "--size",
        size,
        "--bandwidth",
        bandwidth,
        "--latency",
        "1us",
    ]
    result = runner.invoke(app, route(args))
    assert result.exit_code in (0, 2)
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_folded_recursive_all_reduce_says_why_q_exceeds_what_a_rank_sends() -> None:
    """Rabenseifner on 7 ranks folds 3 into partners (p′ = 4): a typical rank sends
    2(p′−1)/p′·S + S = 2.5 GiB of 1 GiB, while a partner, on the critical path, also takes S
    first and sends S last: Q = 1.5 S + 2 S = 3.5 GiB. The table says why Q is larger."""
    gib = 2**30
    args = ["collective", "all-reduce", "--ranks", "7", "--size", "1GiB"]
    args += ["--bandwidth", "450GB/s", "--latency", "3us", "--algorithm", "recursive"]
    data = _json(args)
    assert data["sent_bytes"] == 2 * 3 * gib // 4 + gib
    assert data["payload_bytes"] == 2 * 3 * gib // 4 + 2 * gib
    result = runner.invoke(app, route(args), env={"COLUMNS": "200"})
    assert "the busiest rank's bytes on the critical path" in " ".join(result.stdout.split())


def test_a_size_error_names_its_option_and_bytes_are_whole() -> None:
    """'--size 1.5' was priced as 2 B without a word, and '-1GiB' said only that it is
    negative (review)."""
    link = ["--ranks", "8", "--bandwidth", "100GB/s", "--latency", "1us"]
    for size, message in (
        ("1.5", "--size '1.5': '1.5' is 1.5 bytes; bytes are whole"),
        ("1.5B", "--size '1.5B': '1.5B' is 1.5 bytes; bytes are whole"),
        ("-1GiB", "--size '-1GiB': '-1GiB' is negative"),
    ):
        result = runner.invoke(app, route(["collective", "all-reduce", "--size", size, *link]))
        assert result.exit_code == 2 and message in result.stderr
    ok = runner.invoke(app, route(["collective", "all-reduce", "--size", "1.5KiB", *link]))
    assert ok.exit_code == 0 and "1.5 KiB (1,536 B)" in ok.stdout


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (
            "--bandwidth",
            "0GB/s",
            "--bandwidth '0GB/s': the memory bandwidth must be more than 0 B/s, such as '80GB/s'",
        ),
        (
            "--peak",
            "0",
            "--peak '0': the compute ceiling must be more than 0 FLOP/s, such as '1000GFLOP/s'",
        ),
        (
            "--intensity",
            "nan",
            "--intensity 'nan': the intensity must be a finite number ≥ 0 FLOP/byte, such as 4",
        ),
        (
            "--intensity",
            "-4FLOP/byte",
            "--intensity '-4FLOP/byte': the intensity must be a finite number ≥ 0 FLOP/byte, "
            "such as 4",
        ),
    ],
)
def test_a_roofline_error_names_its_flag(option: str, value: str, message: str) -> None:
    """They named the engine's parameters: "bandwidth_Bps must be a finite number > 0, got
    0.0", "peak_flops must be ...", "intensity must be ..." (audit)."""
    options = {"--intensity": "4", "--bandwidth": "80GB/s", "--peak": "1TFLOP/s", option: value}
    args = ["roofline", *(item for pair in options.items() for item in pair)]
    assert _error(args) == f"budget: error: {message}"


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_a_roofline_too_small_to_write_as_a_rate_is_printed_not_a_traceback(fmt: str) -> None:
    """An audit: 1e-310 FLOP/byte at 1 GB/s attains 1e-301 FLOP/s, which the table wrote and
    then read back to compare with the ceiling, a rate past what the parser takes: a
    traceback, where the JSON already printed it."""
    args = ["roofline", "--intensity", "1e-310", "--bandwidth", "1GB/s", "--peak", "1GFLOP/s"]
    result = runner.invoke(app, route([*args, "-f", fmt]))
    assert result.exit_code == 0, result.stderr
    assert "1e-301 FLOP/s" in result.stdout


def test_a_roofline_says_every_bad_option_at_once() -> None:
    """Only --intensity was said, as `budget check` and `search` say all of theirs."""
    args = ["roofline", "--intensity", "x", "--bandwidth", "y", "--peak", "0"]
    assert _errors(args) == [
        "budget: error: --intensity must be a number of FLOP/byte, such as 4 or 4FLOP/byte, "
        "got 'x'",
        "budget: error: --bandwidth 'y': expected a bandwidth such as '450 GB/s' or '200 "
        "Gb/s', got 'y'",
        "budget: error: --peak '0': the compute ceiling must be more than 0 FLOP/s, such as "
        "'1000GFLOP/s'",
    ]


def test_a_collective_says_every_bad_option_at_once() -> None:
    """Only the first bad option was said (two bad --level, the first alone), as `budget
    check` and `search` say all of theirs: each option in the order --help lists them,
    each part of a level, then how the options fit together."""
    levels = ["--level", "x:450GB/s:1us", "--level", "4:abc:5", "--size", "1GiB"]
    assert _errors(["collective", "all-reduce", *levels]) == [
        "budget: error: --level 'x:450GB/s:1us': SIZE 'x' is not a whole number",
        "budget: error: --level '4:abc:5': expected a bandwidth such as '450 GB/s' or "
        "'200 Gb/s', got 'abc'",
        "budget: error: --level '4:abc:5': 5 has no unit; write a time with its unit, such "
        "as '5 us', '5 ms' or '5 s'",
    ]
    args = ["collective", "gather", "--ranks", "0", "--size", "-1", "--bandwidth", "0"]
    args += ["--latency", "1 parsec", "--algorithm", "fast", "--ramp", "x", "--beside", "y"]
    assert _errors(args) == [
        "budget: error: unknown collective 'gather'; expected one of all-gather, "
        "reduce-scatter, all-reduce, all-to-all, broadcast, send-recv",
        "budget: error: --ranks must be from 1 to 16,777,216, got 0",
        "budget: error: --size '-1': '-1' is negative; expected a size such as '80 GiB' or '80 GB'",
        "budget: error: --bandwidth '0': a link's bandwidth is at least 1 B/s, such as '450GB/s'",
        "budget: error: --latency '1 parsec': expected a time such as '3 us', '2 ms' or "
        "'12 s', got '1 parsec'",
        "budget: error: --algorithm 'fast': unknown algorithm; expected one of ring, recursive, "
        "tree, pairwise, bruck, direct, hierarchical, double-tree, auto",
        "budget: error: --ramp 'x': unknown ramp; expected one of none, nvlink3, nvlink4, nvlink5",
        "budget: error: --beside 'y': expected a time such as '3 us', '2 ms' or '12 s', got 'y'",
    ]
    named = ["--level", "8:450GB/s:1us:a", "--level", "4:50GB/s:5us:a", "--ranks", "16"]
    assert _errors(["collective", "all-reduce", "--size", "1GiB", *named]) == [
        "budget: error: --level names must differ, as a plan's levels must: 'a' twice",
        "budget: error: --ranks 16 does not match the levels, which hold 8 × 4 = 32 ranks",
    ]


def test_a_collective_of_0_bytes_moves_nothing_as_nccl_discards_it() -> None:
    """It priced 14 µs, the ring's 14 steps at 1 µs; NCCL returns before launching a
    collective of count 0 (src/enqueue.cc taskAppend: "Empty collectives can be
    discarded"), as it does for a group of one rank: 0 steps, 0 s."""
    args = ["collective", "all-reduce", "--ranks", "8", "--size", "0"]
    args += ["--bandwidth", "450GB/s", "--latency", "1us"]
    data = _json(args)
    assert (data["steps"], data["time_s"], data["sent_bytes"]) == (0, 0.0, 0)
    table = " ".join(runner.invoke(app, route(args)).stdout.split())
    assert "link none: NCCL discards a collective of 0 B before launching it" in table
    assert "time T 0.000 µs (nothing moves)" in table


def test_the_format_is_read_in_any_case() -> None:
    result = runner.invoke(
        app,
        route(
            [
                "roofline",
                "--intensity",
                "4",
                "--bandwidth",
                "80GB/s",
                "--peak",
                "1TFLOP/s",
                "-f",
                "JSON",
            ]
        ),
    )
    assert result.exit_code == 0 and json.loads(result.stdout)["bound"] == "memory"


def test_an_unknown_format_is_refused_in_our_words() -> None:
    """Typer's own enum check said "Value error, 'xml' is not one of ..." (its validator's
    prefix); the refusal names the three formats and nothing else, exit 2."""
    plan = str(Path(__file__).parents[1] / "plans" / "gpt-1.3b.yaml")
    result = runner.invoke(app, route([plan, "--format", "xml"]))
    assert result.exit_code == 2
    assert "'xml' is not one of table, json or markdown" in result.stderr
    assert "Value error" not in result.stderr and not result.stdout


def test_the_seeds_worked_example_and_the_compute_beside_it() -> None:
    """The seed's synthetic collective: four latency-bearing phases at 5 µs plus 100 MB at
    50 GB/s, about 2.02 ms (a ring all-gather of 125 MB over 5 ranks sends 4/5 of it in 4
    steps); "cutting local compute to 1 ms exposes this cost unless a valid overlap
    schedule exists": beside 1 ms of compute 1.02 ms stays exposed under ideal overlap
    (--slowdown 0), beside 3 ms none, and without --beside all of T (a seeds audit: no
    command took the compute). At a plan's default slowdown s = 0.189 the compute beside it
    lasts 1 ms / 0.811 = 1.233 ms, so 2.02 − 1.233 = 0.787 ms stays exposed and the hidden
    1.233 ms adds 0.189 × 1.233 = 0.233 ms to the compute, as a plan's report reads the same
    pair (`schedule.time_phase`; an audit: the calculator said 1.02 ms there)."""
    args = ["collective", "all-gather", "--ranks", "5", "--size", "125MB"]
    args += ["--bandwidth", "50GB/s", "--latency", "5us"]
    plain = _json(args)
    assert (plain["steps"], plain["sent_bytes"]) == (4, 100_000_000)
    assert plain["time_s"] == pytest.approx(4 * 5e-6 + 100e6 / 50e9)  # 2.02 ms
    assert "exposed_s" not in plain
    ideal = _json([*args, "--beside", "1ms", "--slowdown", "0"])
    assert (ideal["exposed_s"], ideal["slowdown_s"]) == (pytest.approx(1.02e-3), 0)
    assert _json([*args, "--beside", "3ms"])["exposed_s"] == 0
    slowed = _json([*args, "--beside", "1ms"])
    assert slowed["slowdown"] == 0.189
    assert slowed["exposed_s"] == pytest.approx(2.02e-3 - 1e-3 / 0.811)  # 0.787 ms
    assert slowed["slowdown_s"] == pytest.approx(0.189 * 1e-3 / 0.811)  # 0.233 ms
    table = runner.invoke(app, route([*args, "--beside", "1ms", "--slowdown", "0"])).stdout
    said = " ".join(table.split())
    assert "compute slowdown s none: ideal overlap (--slowdown 0)" in said
    assert "exposed max(0, T − W/(1 − s)) 1,020.000 µs" in said
    assert "compute slowed" not in said
    table = runner.invoke(app, route([*args, "--beside", "1ms"])).stdout
    said = " ".join(table.split())
    assert "compute slowdown s 18.9% slower beside it (--slowdown)" in said
    assert "exposed max(0, T − W/(1 − s)) 786.954 µs" in said
    assert "compute slowed s·(T − exposed) 233.046 µs" in said
    assert "--slowdown '1'" in _error([*args, "--beside", "1ms", "--slowdown", "1"])
    assert "give --beside" in _error([*args, "--slowdown", "0.1"])
    assert "--beside '1 parsec'" in _error([*args, "--beside", "1 parsec"])


def test_a_report_marks_and_explains_the_rows_nccls_tree_carries(tmp_path) -> None:
    """GPT-3 at tp 16 spans two DGX nodes: its small all-reduces (the cross-entropy
    statistics, 16 KiB) take NCCL's tree and the 90 MiB embedding all-reduce the ring; at 80
    columns the tree's rows are marked `dbt` whole, and the legend says what that is."""
    from tests.plan_files import variant

    plan = variant(tmp_path, "tp16.yaml", ("  tp: 8", "  tp: 16"), ("  dp: 16", "  dp: 8"))
    out = runner.invoke(app, route([str(plan)]), env={"COLUMNS": "80"}).stdout
    assert re.search(r"cross-entropy .*\n.*fp32.*\n.*2L.*\n +dbt\b", out)
    assert "dbt = NCCL's double binary tree" in out and "dbt…" not in out
    rows = json.loads(runner.invoke(app, route([str(plan), "-f", "json"])).stdout)["phases"]
    algorithms = {c["name"]: c["algorithm"] for p in rows for c in p["collectives"]}
    assert algorithms["cross-entropy statistics"] == "double-tree"
    assert algorithms["embedding output"] == "ring"


def test_the_markdown_calculator_sets_its_figures_right_as_the_table_does() -> None:
    """A table of several columns sets its figures, from the third column on, right as the
    terminal's does, and a quantity's value left; the markdown set every column left (an
    audit, m394: 32.622 µs and 167.772 µs out of line)."""
    args = ["collective", "all-to-all", "--ranks", "16", "--size", "256MiB", "--level"]
    args += ["8:450GB/s:1us", "--level", "2:50GB/s:5us", "--algorithm", "auto", "-f", "markdown"]
    lines = runner.invoke(app, route(args)).stdout.splitlines()
    stages = lines.index("| stage | link | P | n | sent/rank | n·α | Q/B | time |")
    assert lines[stages + 1] == "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    assert lines[lines.index("| quantity | value |") + 1] == "| --- | --- |"


def test_a_named_tree_is_said_in_legend_markdown_diff_and_the_calculator(tmp_path) -> None:
    """A plan naming `double-tree` for its all-reduces: the table's legend no longer counts
    them with the default ring (it read "algorithms ring (AG, RS, AR)" beside rows marked
    dbt, and "algorithms ; 2L = ..." where every collective was a tree), markdown explains
    the algorithm column's double-tree, `diff` reads the unnamed side as "default" and
    says which collectives B runs with another algorithm, and `budget collective` says
    which of NCCL's two it passed over (a review)."""
    from tests.plan_files import GPT3, variant

    named = variant(
        tmp_path,
        "named.yaml",
        ("recompute: selective", "recompute: selective\ncollectives: {all-reduce: double-tree}"),
    )
    table = runner.invoke(app, route([str(named)]), env={"COLUMNS": "80"}).stdout
    legend = " ".join(table.split())
    assert "algorithms ring (AG, RS), direct (P2P)" in legend and "algorithms ;" not in legend
    assert "dbt = NCCL's double binary tree" in legend
    markdown = runner.invoke(app, route([str(named), "-f", "markdown"])).stdout
    assert "double-tree: NCCL's double binary tree" in markdown
    diff = runner.invoke(app, route(["diff", str(GPT3), str(named)]), env={"COLUMNS": "120"})
    said = " ".join(diff.stdout.split())
    assert "collectives.all-reduce default → double-tree" in said
    assert "B runs 4 collectives with another algorithm: embedding output in" in said
    assert "(ring → double-tree)" in said
    levels = ["--level", "8:450GB/s:1us", "--level", "4:50GB/s:5us"]
    out = runner.invoke(app, route(["collective", "all-reduce", "--size", "8MiB", *levels]))
    text = " ".join(out.stdout.split())
    # NCCL's ring at 8 MiB over 4 nodes of 8: 54 steps of 1 µs inside the nodes and
    # 2·nNodes = 8 of 5 µs across them, 94 µs, + 1/8 of 2 · 31 · 8 MiB/32 = 2,031,616 B on
    # a 50 GB/s port, 40.632 µs: 134.632 µs (126.632 µs with 2(nNodes - 1) = 6 across)
    assert "double-tree: faster here than NCCL's ring (134.632 µs)" in text


def test_the_group_s_aggregate_bytes_are_reported_as_such() -> None:
    """DESIGN.md rule 4: bytes summed over ranks are reported as aggregate bytes, never over
    one link's rate. A ring all-reduce of 1 GiB over 8 ranks: each sends 2·7/8 GiB, the
    group 8 × that = 14 GiB; across two levels (8 × 4 ranks), ring or two-level, every rank
    takes part in every stage, so 32 × each rank's."""
    args = ["collective", "all-reduce", "--size", "1GiB"]
    flat = _json([*args, "--ranks", "8", "--bandwidth", "450GB/s", "--latency", "1us"])
    assert flat["sent_bytes"] == 2 * 7 * 2**30 // 8
    assert flat["aggregate_sent_bytes"] == flat["aggregate_recv_bytes"] == 14 * 2**30
    levels = ["--level", "8:450GB/s:1us", "--level", "4:50GB/s:5us"]
    for algorithm in ("ring", "hierarchical"):
        two = _json([*args, *levels, "--algorithm", algorithm])
        assert two["aggregate_sent_bytes"] == 32 * two["sent_bytes"], algorithm
    table = runner.invoke(
        app, route([*args, "--ranks", "8", "--bandwidth", "450GB/s", "--latency", "1us"])
    ).stdout
    assert "sent by all ranks        14 GiB (15,032,385,536 B)  (aggregate over the 8" in table
    # a group of one sends nothing, and the table says it of its one rank (an audit, m365:
    # "aggregate over the 1 ranks")
    alone = runner.invoke(
        app, route([*args, "--ranks", "1", "--bandwidth", "450GB/s", "--latency", "1us"])
    ).stdout
    assert "0 B  (aggregate over its one rank;" in alone and "the 1 ranks" not in alone


def test_every_missing_or_bad_calculator_option_is_said_at_once() -> None:
    """An audit: `budget roofline` named only its first missing option, and `--ranks 2.5`
    (typer's integer) hid a negative --size beside it."""
    result = runner.invoke(app, route(["roofline"]))
    assert result.exit_code == 2 and result.stdout == ""
    assert [line.split()[4] for line in result.stderr.splitlines()] == [
        "--intensity,",
        "--bandwidth,",
        "--peak,",
    ]
    args = ["collective", "all-reduce", "--ranks", "2.5", "--size", "-1GB"]
    result = runner.invoke(app, route([*args, "--bandwidth", "1GB/s", "--latency", "1us"]))
    assert result.exit_code == 2
    assert [line.split()[2] for line in result.stderr.splitlines()] == ["--ranks", "--size"]


def test_a_negative_zero_intensity_reads_as_zero() -> None:
    """An audit: `--intensity -0` printed "-0 FLOP/byte" and "-0 FLOP/s"."""
    args = ["roofline", "--intensity", "-0", "--bandwidth", "1GB/s", "--peak", "1TFLOP/s"]
    data = json.loads(runner.invoke(app, route([*args, "-f", "json"])).stdout)
    assert str(data["intensity"]) == "0.0" and str(data["attainable_flops"]) == "0.0"


def test_hierarchical_needs_two_levels_of_more_than_one_unit_in_either_order() -> None:
    """An audit: 8 GPUs then 1 node was refused, 1 then 8 priced as "hierarchical" at the
    ring's time; a level of one unit adds no stage either way."""
    for levels in (("8:450GB/s:1us", "1:50GB/s:5us"), ("1:450GB/s:1us", "8:50GB/s:5us")):
        args = ["collective", "all-reduce", "--size", "1GiB", "--algorithm", "hierarchical"]
        result = runner.invoke(app, route([*args, "--level", levels[0], "--level", levels[1]]))
        assert result.exit_code == 2
        assert "needs ranks on two or more levels" in result.stderr


def test_the_all_reduce_the_default_passed_over_is_in_the_json() -> None:
    """The table says "ring: faster here than NCCL's double binary tree (5,869.553 µs)"; the
    JSON said nothing of it (an audit). Both figures are the collective priced each way."""
    levels = ["--level", "8:450GB/s:1us", "--level", "4:50GB/s:5us"]
    args = ["collective", "all-reduce", "--size", "1GiB", *levels, "-f", "json"]
    data = json.loads(runner.invoke(app, route(args)).stdout)
    tree = json.loads(runner.invoke(app, route([*args, "--algorithm", "double-tree"])).stdout)
    assert data["algorithm"] == "ring"
    assert data["passed_over"] == {"algorithm": "double-tree", "time_s": tree["time_s"]}
    assert data["time_s"] < tree["time_s"]


@pytest.mark.parametrize(
    ("args", "before"),
    [
        (
            ["check", "plans/gpt-1.3b.yaml", "--headroom", "banana", "--max-step", "3furlongs"],
            ["--headroom 'banana'", "--max-step '3furlongs'"],
        ),
        (["search", "plans/gpt-1.3b.yaml", "--gpus", "x"], ["--gpus 'x'"]),
        (["collective", "all-reduce", "--ranks", "2.5", "--size", "1GiB"], ["--ranks must"]),
        (["roofline", "--intensity", "4"], ["missing option --bandwidth", "missing option --peak"]),
    ],
)
def test_a_bad_format_is_said_beside_the_other_bad_options(args, before) -> None:
    """An audit: `check -f xml --headroom banana` said only the format (click's check ran
    before the command read its limits), so a user mended one option a run. A command that
    reads its own options says the format last, as --help lists it, after every other
    refusal; exit 2, nothing on stdout."""
    root = Path(__file__).parents[1]
    argv = [str(root / a) if a.startswith("plans/") else a for a in args]
    result = runner.invoke(app, route([*argv, "-f", "xml"]))
    assert result.exit_code == 2 and not result.stdout
    lines = result.stderr.splitlines()
    assert lines[-1] == "budget: error: --format 'xml': expected table, json or markdown"
    assert [any(line.startswith(f"budget: error: {b}") for line in lines) for b in before] == [
        True
    ] * len(before)
    assert len(lines) == len(before) + 1


def test_the_calculator_says_where_it_rounds_chunks_up() -> None:
    """An audit: a 7 B all-to-all over 64 ranks reads 63 B sent per rank (63 blocks of
    ⌈7 / 4,096⌉ = 1 B) and 4,032 B by all, 576 times the tensor, unsaid; a size that splits
    evenly says nothing of rounding."""
    link = ["--bandwidth", "50GB/s", "--latency", "1us"]
    tiny = runner.invoke(
        app, route(["collective", "all-to-all", "--ranks", "64", "--size", "7B", *link])
    )
    assert tiny.exit_code == 0
    text = " ".join(tiny.stdout.split())
    assert "sent per rank 63 B" in text
    assert (
        "S does not split into 4,096 equal chunks of whole bytes: each is rounded up to 1 B" in text
    )
    even = runner.invoke(
        app, route(["collective", "all-reduce", "--ranks", "8", "--size", "1GiB", *link])
    )
    assert "rounded up" not in even.stdout
    odd = runner.invoke(
        app, route(["collective", "all-reduce", "--ranks", "3", "--size", "1000003B", *link])
    )
    assert "split into 3 equal chunks of whole bytes: each is rounded up to 333,335 B" in " ".join(
        odd.stdout.split()
    )


# a figure and its unit, as the calculators print them ("50 GB/s", "14 µs", "1.86 GiB")
_FIGURE = re.compile(r"(?<![\w.])\d[\d,.]* (?:[KMGTP]i?B|B|[kMGT]B/s|µs|ms|s)(?![\w/])")
_HELD = [
    "collective all-reduce --ranks 32 --size 100MB --level 8:450GB/s:1us --level 4:50GB/s:5us",
    "collective all-reduce --ranks 1024 --size 1GB --level 8:231.6GB/s:3us --level 128:24GB/s:14us",
    "collective all-to-all --ranks 32 --size 100MB --level 8:450GB/s:1us --level 4:50GB/s:5us",
    "roofline --intensity 4 --bandwidth 80GB/s --peak 1TFLOP/s",
]


@pytest.mark.parametrize("args", _HELD, ids=["two-levels", "1024-ranks", "all-to-all", "roof"])
def test_no_width_parts_a_figure_from_its_unit(args: str) -> None:
    """An audit: at 80 columns the value column wrapped "level 2: B 50" / "GB/s per GPU",
    at 100 "α 14" / "µs", and at 44 the stages table cut "161.68 MiB" to "161.6…". From 44
    to 160 columns every figure printed at 400 is on one line with its unit, and with "α"
    or "B" before it, and none is cut."""
    wide = runner.invoke(app, route(args.split()), env={"COLUMNS": "400"}).stdout
    figures = sorted(f for line in wide.splitlines() for f in _FIGURE.findall(line))
    assert figures
    for width in range(44, 161, 4):
        out = runner.invoke(app, route(args.split()), env={"COLUMNS": str(width)}).stdout
        lines = out.splitlines()
        assert "…" not in out and all(len(line) <= width for line in lines), width
        assert sorted(f for line in lines for f in _FIGURE.findall(line)) == figures, width
        for named in re.findall(r"(?<![\w/])(?:α|B) \d[\d.]* (?:µs|GB/s)", wide):
            assert any(named in line for line in lines), (width, named)


# each command's arguments as the README names them
_USAGE = {
    "report": "PLAN",
    "check": "PLAN...",
    "diff": "A B",
    "plot": "PLAN",
    "search": "PLAN",
    "validate": "PLAN...",
    "collective": "OP",
    "presets": "[KIND]",
    "schema": "",
    "roofline": "",
    "validate-model": "",
}


@pytest.mark.parametrize("command", sorted(_USAGE))
def test_help_names_arguments_as_the_readme_does(command: str) -> None:
    """`budget check --help` showed "plans... <list[Path]>", a Python type, and `budget
    report --help` "Usage: budget report [OPTIONS] {plan}" (an audit): every command's
    usage and Arguments name them PLAN, PLAN..., A B, OP or [KIND], and no type."""
    from budget.entry import COMMANDS

    assert set(_USAGE) == COMMANDS
    out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"}, prog_name="budget").stdout
    usage = f"Usage: budget {command} [OPTIONS] {_USAGE[command]}".rstrip()
    assert out.splitlines()[0] == usage
    arguments = out.split("Arguments:\n")[1].split("\n\n")[0] if _USAGE[command] else ""
    assert not re.search(r"[{}]|<list\[|<path>|<str>|\[Path\]", out.split("Options:")[0])
    names = [line.split()[0] for line in arguments.splitlines() if line[2:3] != " "]
    assert names == _USAGE[command].strip("[]").split() if arguments else not names


def test_a_share_and_a_catalogue_figure_stay_by_their_units() -> None:
    """A review: `collective` ended a line on "100" with "% of B" on the next (at 68
    columns), and `presets` on "11.61" / "B more", "(2^30" / "B)" and "201,310,208" / "KiB":
    neither wrapper knew "%", a bare "B" or "KiB" for units."""
    args = "collective all-to-all --ranks 16 --size 256KiB --level 8:450GB/s:3us"
    args += " --level 2:50GB/s:10us --ramp nvlink4"
    for width in range(60, 81):
        out = runner.invoke(app, route(args.split()), env={"COLUMNS": str(width)}).stdout
        lines = out.splitlines()
        parted = [
            (a, b)
            for a, b in itertools.pairwise(lines)
            if re.search(r"\d$", a) and b.split("|")[-1].lstrip().startswith("%")
        ]
        assert "100 %" in " ".join(out.split()) and not parted, (width, parted)
    for width in range(44, 121):
        out = runner.invoke(app, route(["presets"]), env={"COLUMNS": str(width)}).stdout
        ends = [
            line for line in out.splitlines() if re.search(r"(11\.61|\(2\^30|201,310,208)$", line)
        ]
        assert not ends, (width, ends)


def test_a_flat_algorithm_across_levels_says_the_alpha_its_steps_take() -> None:
    """A flat tree over 8-GPU nodes (α 20 µs) and InfiniBand (5 µs) takes each of its 10
    steps at the largest α it spans, 200 µs in all, as the JSON's latency_s says; the link
    row read "ib: α 5 µs" (an audit). A level priced at its own α says only that."""
    levels = ["8:450GB/s:20us:nvlink", "4:50GB/s:5us:ib"]
    result = collective("all-reduce", None, "1MiB", None, None, levels, "tree")
    assert float(result.cost.latency_s) == pytest.approx(10 * 20e-6)
    out = runner.invoke(
        app,
        ["collective", "all-reduce", "--size", "1MiB", "--algorithm", "tree"]
        + [x for level in levels for x in ("--level", level)],
        env={"COLUMNS": "200"},
    )
    assert (
        "ib: B 50 GB/s per GPU, α 20 µs a step (the largest α the group spans; ib's own 5 µs)"
        in out.stdout
    )
    ring = runner.invoke(
        app,
        [
            "collective",
            "all-reduce",
            "--size",
            "1GiB",
            "--ranks",
            "8",
            "--bandwidth",
            "450GB/s",
            "--latency",
            "1us",
        ],
        env={"COLUMNS": "200"},
    )
    assert "B 450 GB/s per GPU, α 1 µs" in ring.stdout and "a step" not in ring.stdout


@pytest.mark.parametrize(("ranks", "gib"), [(2, 2), (3, 4), (4, 6), (8, 14)])
def test_a_double_tree_moves_two_p_minus_one_times_s_in_all(ranks: int, gib: int) -> None:
    """Each of the two binary trees has P − 1 edges, each carrying a half of S up and a half
    down: 2(P − 1)S over all ranks, as a ring all-reduce moves; P times the busiest rank's 2S
    counted every leaf as an inner node (an audit: 8 GiB at P = 4). Of two ranks each moves S."""
    result = collective("all-reduce", ranks, "1GiB", "100GB/s", "1us", [], "double-tree")
    chunk = -(-(2**30) // ranks)  # rounded up to whole bytes: 8 B more than 4 GiB at P = 3
    moved = sum(int(s.group_sent_bytes) for s in result.cost.stages)
    assert moved == 2 * (ranks - 1) * ranks * chunk  # 2(P − 1)S, S = P chunks
    assert moved - gib * 2**30 < ranks * ranks  # the table's GiB, but for the rounding


def test_an_intensity_per_bit_is_refused_not_read_per_byte() -> None:
    """A lowercase b is a bit wherever budget reads a unit (640Gb/s is 80 GB/s): 4FLOP/b
    read as 4 FLOP a byte (an audit). B and byte stay bytes."""
    args = ["roofline", "--bandwidth", "80GB/s", "--peak", "1TFLOP/s", "--intensity"]
    for bits in ("4FLOP/b", "4 flop/bit", "4FLOPs/bits"):
        result = runner.invoke(app, [*args, bits])
        assert result.exit_code == 2 and "b is a bit" in result.stderr, bits
    for per_byte in ("4FLOP/B", "4 flops/byte", "4FLOP/Byte", "4"):
        result = runner.invoke(app, [*args, per_byte, "-f", "json"])
        assert result.exit_code == 0 and json.loads(result.stdout)["intensity"] == 4.0, per_byte


def test_the_time_says_it_is_the_total_and_what_of_it_is_exposed() -> None:
    """Every time says whether it is the total or the exposed part: without --beside, T is
    the total and all of it exposed; with it, the total, its exposed part on the next row."""
    args = [
        "collective",
        "all-reduce",
        "--ranks",
        "8",
        "--size",
        "1GiB",
        "--bandwidth",
        "450GB/s",
        "--latency",
        "1us",
        "-f",
        "markdown",
    ]
    alone = runner.invoke(app, args).stdout
    assert (
        "(bandwidth-bound; the total, all of it exposed: no compute beside it, see --beside)"
        in alone
    )
    beside = runner.invoke(app, [*args, "--beside", "1ms"]).stdout
    assert "| time T | 4,189.663 µs  (bandwidth-bound; the total) |" in beside
    # 4,189.663 − 1,000 / (1 − 0.189) µs: the compute beside it, slowed, lasts 1,233.046 µs
    assert "| exposed max(0, T − W/(1 − s)) | 2,956.617 µs" in beside


@pytest.mark.parametrize(("op", "meant"), [("all-to-all", "pairwise"), ("send-recv", "direct")])
def test_ring_names_an_all_to_alls_pairwise_exchange_and_says_so(op: str, meant: str) -> None:
    """DESIGN rule 3's ring row: an all-to-all's ring is its pairwise exchange (step k sends
    to rank i + k), a send-recv's its direct send. Asked for by that name, the table says
    which it priced, and a wrong name's list of choices has ring in it (an audit: ring was
    taken but the list left it out, and the table said pairwise with no word of why)."""
    args = ["collective", op, *ACCEPTANCE_1]
    assert _json([*args, "--algorithm", "ring"])["algorithm"] == meant
    result = runner.invoke(app, route([*args, "--algorithm", "ring"]), env={"COLUMNS": "100"})
    assert result.stdout.splitlines()[0].endswith(f"(what --algorithm ring means for {op})")
    assert f"{meant} (also named ring)" in _error([*args, "--algorithm", "recursive"])


def test_a_ring_across_levels_names_the_bytes_that_pace_its_bandwidth_term() -> None:
    """A 1 GiB all-reduce over 8 nodes of 8: each rank sends 2·63/64·S = 2,113,929,216 B,
    an eighth of the ring's hops crossing the network (264,241,152 B at 50 GB/s: 5.2848 ms)
    and seven eighths the NVLink (1,849,688,064 B at 450 GB/s: 4.1104 ms). The term is the
    longer, and its Q is those bytes, not the 1.97 GiB, which gives the term at no link's
    rate (an audit: 400 GB/s); with a 400 GB/s network the NVLink's bytes pace it."""
    args = ["collective", "all-reduce", "--size", "1GiB", "--level", "8:450GB/s:3us:nvlink"]
    data = _json([*args, "--level", "8:50GB/s:14us:ib"])
    assert data["bandwidth_term_s"] == pytest.approx(264_241_152 / 50e9)
    assert [level["sent_bytes"] for level in data["levels"]] == [1_849_688_064, 264_241_152]
    for network, q in (
        ("50GB/s", "Q = 252 MiB (264,241,152 B) over ib at 50 GB/s of the 1.97 GiB"),
        ("400GB/s", "Q = 1.72 GiB (1,849,688,064 B) over nvlink at 450 GB/s of the 1.97 GiB"),
    ):
        result = runner.invoke(
            app, route([*args, "--level", f"8:{network}:14us:ib"]), env={"COLUMNS": "200"}
        )
        assert q in " ".join(result.stdout.split())


def test_a_trees_per_rank_bytes_are_said_to_be_its_busiest_ranks() -> None:
    """A user audit: a binomial tree's all-reduce of 64 KiB over 8 ranks read "sent per rank
    192 KiB" beside "sent by all ranks 896 KiB", 8 x 192 ≠ 896: the per-rank figure is the
    root's, 3 children x 64 KiB in the broadcast, where the 14 sends of 64 KiB average 112
    KiB. It says so; a ring's, whose ranks all send 2·7/8·64 = 112 KiB, says nothing more."""
    base = ["collective", "all-reduce", "--ranks", "8", "--size", "64KiB"]
    link = ["--bandwidth", "370GB/s", "--latency", "3us"]
    tree = runner.invoke(app, route([*base, *link, "--algorithm", "tree"]), env={"COLUMNS": "200"})
    assert tree.exit_code == 0, tree.stderr
    (sent,) = [line for line in tree.stdout.splitlines() if "sent per rank" in line]
    assert " ".join(sent.split()) == (
        "sent per rank 192 KiB (196,608 B) (the busiest rank; 112 KiB a rank on average)"
    )
    ring = runner.invoke(app, route([*base, *link, "--algorithm", "ring"]), env={"COLUMNS": "200"})
    (sent,) = [line for line in ring.stdout.splitlines() if "sent per rank" in line]
    assert " ".join(sent.split()) == "sent per rank 112 KiB (114,688 B)"
