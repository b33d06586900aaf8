"""What a plan writes over a device or topology preset is said where the preset is named: the
report's header and JSON, the search's hardware line and the diff (a user audit, m434: 835
TFLOP/s over the H100's 989 moved the step 12 % with no figure said)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from budget.catalog import device_overrides, topology_overrides
from budget.cli import app, route
from budget.diff import plan_changes
from budget.pipeline import build_report
from budget.plan.load import load_plan
from budget.render.table import header
from budget.report import to_dict
from budget.report_schema import validation_errors
from tests.plan_files import ROOT, variant

LLAMA = ROOT / "plans" / "llama3-70b.yaml"
DEVICE = "device: {preset: h100-sxm, reserved: 3 GiB}"
TOPOLOGY = "topology: {preset: dgx-h100, nodes: 64}"


def _plan(tmp_path: Path, name: str, old: str, new: str) -> Path:
    return variant(tmp_path, name, (old, new), base=LLAMA)


def test_a_preset_kept_as_it_is_has_no_overrides(tmp_path: Path) -> None:
    plan = load_plan(LLAMA)
    assert device_overrides(plan.device) == () and topology_overrides(plan.topology) == ()
    report = build_report(plan)
    assert header(report)[0].startswith("llama3-70b · train · 512 GPUs in dgx-h100 = tp 8")
    data = to_dict(report)
    assert data["device"]["overrides"] == [] and data["topology"]["overrides"] == []
    assert data["device"]["flops"]["bf16"] == 989e12
    assert data["device"]["memory_bandwidth_Bps"] == 3.35e12
    assert data["topology"]["name"] == "dgx-h100"
    assert validation_errors(data, "report") == []


def test_an_overridden_peak_and_bandwidth_are_named_and_read(tmp_path: Path) -> None:
    """flops and memory_bandwidth over the H100 SXM's: the header reads the plan's peak
    beside the share GEMMs reach of it, and names the keys the plan wrote."""
    written = "device: {preset: h100-sxm, reserved: 3 GiB, flops: {bf16: 835 TFLOP/s}, "
    written += "memory_bandwidth: 3.9 TB/s}"
    plan = load_plan(_plan(tmp_path, "flops.yaml", DEVICE, written))
    assert device_overrides(plan.device) == ("flops", "memory_bandwidth")
    report = build_report(plan)
    device = " ".join(" ".join(header(report)).split())
    assert "device: h100-sxm (the plan's flops, memory_bandwidth), 79.6 GiB per GPU" in device
    assert "GEMMs up to 74.1% of the 835 TFLOP/s bf16 peak, memory at 87.6% of its 3.9 TB/s" in (
        device
    )
    data = to_dict(report)
    assert data["device"]["overrides"] == ["flops", "memory_bandwidth"]
    # the preset's other peaks stay (a format written is merged into them)
    assert (data["device"]["flops"]["bf16"], data["device"]["flops"]["fp8"]) == (835e12, 1979e12)
    assert validation_errors(data, "report") == []


def test_a_preset_topologys_written_levels_are_said(tmp_path: Path) -> None:
    """Levels written on a preset replace all of its own: the report and the search say the
    plan's levels where the search said "in dgx-h100" of 25 GB/s InfiniBand alone."""
    written = (
        "topology: {preset: dgx-h100, nodes: 64, levels: [{name: infiniband, "
        "bandwidth: 25 GB/s, latency: 14 us}]}"
    )
    path = _plan(tmp_path, "levels.yaml", TOPOLOGY, written)
    plan = load_plan(path)
    assert topology_overrides(plan.topology) == ("levels",)
    report = build_report(plan)
    assert header(report)[0].startswith("llama3-70b · train · 512 GPUs in dgx-h100 (the plan's")
    data = to_dict(report)
    assert (data["topology"]["name"], data["topology"]["overrides"]) == ("dgx-h100", ["levels"])
    args = ["search", str(path), "--tp", "8", "--pp", "4", "--micro", "1", "--zero", "1"]
    out = CliRunner().invoke(app, route([*args, "--recompute", "selective"])).stdout
    assert "Priced on h100-sxm in dgx-h100 (the plan's levels);" in " ".join(out.split())


def test_the_diff_shows_no_flat_gemm_fraction_where_the_preset_runs_its_curve(
    tmp_path: Path,
) -> None:
    """A preset's GEMMs run on its measured curve; the diff showed the dataclass's unused
    0.8 beside a written 0.5 ("80.0% → 50.0%")."""
    written = "device: {preset: h100-sxm, reserved: 3 GiB, matmul_efficiency: 0.5}"
    a, b = load_plan(LLAMA), load_plan(_plan(tmp_path, "flat.yaml", DEVICE, written))
    assert device_overrides(b.device) == ("matmul_efficiency",)
    (change,) = [c for c in plan_changes(a, b) if c.key == "device.matmul_efficiency"]
    assert (change.a, change.b) == (None, 0.5)


def test_a_level_written_at_another_size_is_the_plans(tmp_path: Path) -> None:
    """The preset's own levels written again are no override, the outermost at any size that
    holds every GPU; NVLink written at a domain of 4 GPUs moved the step 17.5 % and was not
    said (a review, m435)."""
    levels = (
        "topology: {{preset: dgx-h100, nodes: 64, levels: [{{name: nvlink, bandwidth: 370 GB/s, "
        "latency: 3 us, size: {nvlink}, ramp: nvlink4}}, {{name: infiniband, bandwidth: 47 GB/s, "
        "latency: 14 us{outer}}}]}}"
    )
    for name, nvlink, outer, said in (
        ("same.yaml", 8, "", ()),
        ("open.yaml", 8, ", size: 512", ()),
        ("four.yaml", 4, "", ("levels",)),
    ):
        path = _plan(tmp_path, name, TOPOLOGY, levels.format(nvlink=nvlink, outer=outer))
        assert topology_overrides(load_plan(path).topology) == said, name
