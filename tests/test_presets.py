"""`budget presets`: the catalogue as users read it, its numbers checked against the
published figures they come from, in every format and at terminal widths."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from budget.catalog import DEVICES, MODELS, TOPOLOGIES
from budget.cli import app
from budget.entry import COMMANDS, route
from budget.presets import catalogue
from budget.render.presets import render_presets
from budget.report_schema import SCHEMA_VERSION

runner = CliRunner()


def test_every_cli_command_is_routed_as_a_command() -> None:
    """`budget NAME` runs plan NAME unless NAME is a command: a command missing from
    `entry.COMMANDS` would read as a plan file (`budget presets` did, before it was added)."""
    names = {c.name for c in app.registered_commands if c.name}
    assert names <= COMMANDS
    assert route(["presets", "models"]) == ["presets", "models"]


def test_catalogue_lists_every_preset_once() -> None:
    data = catalogue()
    assert [d["name"] for d in data["devices"]] == list(DEVICES)
    assert [t["name"] for t in data["topologies"]] == list(TOPOLOGIES)
    assert [m["name"] for m in data["models"]] == list(MODELS)
    assert list(catalogue("models")) == ["models"]


def test_model_parameters_are_the_published_counts() -> None:
    """Exact parameter counts of the released checkpoints (Hugging Face model pages):
    Meta-Llama-3-8B 8,030,261,248; Meta-Llama-3-70B 70,553,706,496; Mixtral-8x7B
    46,702,792,704. Rounded ones: Llama 3.1 405B "405B" (405.9 here), Mixtral 8x22B "141B,
    39B active", Qwen1.5-MoE-A2.7B "14.3B, 2.7B activated", DeepSeek-V3 "671B, 37B
    activated" (arXiv 2412.19437, section 1) and 11,610,067,968 in its multi-token
    prediction module (`test_multi_token_prediction`).

    "Active" counts both embeddings, as Mistral's 12.9 B for Mixtral does (all but 6 of each
    layer's 8 experts of 3 x 4096 x 14336 weights). DeepSeek does not say whether its 37 B
    counts the input embedding (129,280 x 7,168, of which a lookup reads one row): this count
    is 37.55 B with it and 36.63 B without, so the test holds the latter to "37B"."""
    models = {m["name"]: m for m in catalogue("models")["models"]}
    assert models["llama3-8b"]["params"] == 8_030_261_248
    assert models["llama3-70b"]["params"] == 70_553_706_496
    assert round(models["llama3-405b"]["params"] / 1e9, 1) == 405.9
    mixtral = models["mixtral-8x7b"]
    assert mixtral["params"] == 46_702_792_704
    assert mixtral["active_params"] == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336
    assert round(mixtral["active_params"] / 1e9, 1) == 12.9
    big = models["mixtral-8x22b"]
    assert (round(big["params"] / 1e9), round(big["active_params"] / 1e9)) == (141, 39)
    qwen = models["qwen-moe"]
    assert (round(qwen["params"] / 1e9, 1), round(qwen["active_params"] / 1e9, 1)) == (14.3, 2.7)
    v3 = models["deepseek-v3"]
    assert round(v3["params"] / 1e9) == 671
    assert round((v3["active_params"] - 129_280 * 7_168) / 1e9) == 37
    assert v3["mtp_params"] == 11_610_067_968 and v3["mla"]
    assert v3["experts"] == {"count": 256, "top_k": 8, "ffn": 2048, "shared_ffn": 2048}
    assert models["llama3-8b"]["experts"] is None and models["llama3-8b"]["mtp_params"] == 0


def test_device_and_topology_figures_are_the_catalogue_s() -> None:
    """H100 SXM: 733.17 TFLOP/s sustained (gpu-fryer's 730 at 8192³); cuDNN attention at 8K
    keys is the FlashAttention-3 paper's causal forward 529 and unmasked backward 518 TFLOP/s,
    the backward made causal at 0.91108 (cuDNN's H200 sweep, test_catalog), combined as
    3.5 / (1/529 + 2.5/471.94) = 486.9 of 989 (49.2 %), each pass given apart, the rate it
    is timed at. H800 NVLink: 160 of 200 GB/s."""
    devices = {d["name"]: d for d in catalogue("devices")["devices"]}
    h100 = devices["h100-sxm"]
    assert h100["gemm"]["ceiling_flops"] == pytest.approx(733.17e12, rel=1e-4)
    cudnn = h100["attention"][0]
    assert (cudnn["kernel"], cudnn["keys"]) == ("cudnn", 8192)
    assert cudnn["fraction"] == pytest.approx(486.94 / 989, abs=1e-4)
    assert cudnn["forward"] == pytest.approx(529 / 989, abs=1e-6)
    assert cudnn["backward"] == pytest.approx(518 * 0.91108 / 989, abs=1e-5)
    assert h100["memory_bytes"] == 81_559 * 2**20 and h100["flops"]["fp8"] == 1979e12
    assert h100["assumed"] == ["gemm-fp8", "start"]  # the H200's FP8 ceiling and startup
    # every figure measured on it, or (its triton rate) derived from what was
    assert devices["a100-80gb"]["assumed"] == []
    assert devices["mi300x"]["attention"][0]["kernel"] == "flash2"  # Azure's ND MI300X v5 run
    assert devices["b200"]["attention"][0]["kernel"] == "cudnn"  # cudnn-frontend's B200 run
    # every rate names its benchmark; every measured one, the sweep that makes it causal
    for device in devices.values():
        for rate in device["attention"]:
            assert rate["source"], (device["name"], rate["kernel"])
            assert rate["derived"] or "cudnn-frontend" in rate["source"]
    assert "Azure" in {r["kernel"]: r for r in h100["attention"]}["flash2"]["source"]
    topologies = {t["name"]: t for t in catalogue("topologies")["topologies"]}
    nvlink, ib = topologies["hgx-h800"]["levels"]
    assert (nvlink["rate_Bps"], nvlink["bandwidth_Bps"]) == (200e9, pytest.approx(160e9))
    assert nvlink["ramp"] and not ib["ramp"] and ib["size"] is None
    assert (nvlink["assumed"], ib["assumed"]) == (["ramp", "latency"], [])
    # α per step, NCCL's tuning model (tuning.cc hwLat, Ring/Simple): NET 14 µs, NVLink 3.4
    # µs, against the 3 µs the NVLink level takes from the smallest nccl-tests messages
    assert (ib["latency_s"], nvlink["latency_s"]) == (pytest.approx(14e-6), pytest.approx(3e-6))
    assert ib["bandwidth_Bps"] == pytest.approx(47e9)  # NCCL's maintainers, per NDR NIC
    assert topologies["dgx-h100"]["levels"][0]["assumed"] == []


def test_json_is_the_catalogue() -> None:
    result = runner.invoke(app, ["presets", "--format", "json"])
    assert result.exit_code == 0
    versioned = {"schema_version": SCHEMA_VERSION, **catalogue()}
    assert json.loads(result.stdout) == json.loads(json.dumps(versioned))


def _table_text(width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    render_presets(console, catalogue(), "table")
    return console.export_text()


@pytest.mark.parametrize("width", [30, 40, 44, 50, 52, 60, 70, 79, 80, 120])
def test_every_name_and_figure_stays_whole_at_any_width(width: int) -> None:
    """Names are typed into plans and figures read as they are: at no width is a cell
    shortened with an ellipsis, a name split, or a line longer than the terminal; below the
    width a table needs, each row becomes a line of labelled figures."""
    text = _table_text(width)
    assert "…" not in text
    # at 30 columns only a name or path longer than the line may overflow it, whole
    lines = text.splitlines() if width >= 40 else [x for x in text.splitlines() if " " in x.strip()]
    assert max(len(line) for line in lines) <= width
    # no figure ends a line whose next line starts with its unit
    assert not re.search(r"\d\n *(?:[kMGTP]i?B|[GT]b/s|[PT]FLOP|µs|%)", text)
    words = set(text.replace(",", " ").replace("\u00a0", " ").split())
    for name in [*DEVICES, *TOPOLOGIES, *MODELS]:
        assert name in words or f"{name}:" in words
    for figure in ["128256", "129280", "1.555", "231.6", "µs†", "82.2%†", "256×2048", "52.7%†"]:
        assert figure in words, figure
    assert "hgx-h800 nvlink: " in text.replace("\n    ", " ")
    assert "llama3-8b, llama3-70b, llama3-405b: " in text.replace("\n    ", " ")
    assert "deepseek-v3 has 11.61 B more in multi-token" in " ".join(text.split())


@pytest.mark.parametrize("width", [79, 80, 81, 100])
def test_an_ascii_stream_gets_whole_tables_or_rows_as_lines(width: int) -> None:
    """On a stream that is not UTF rich draws an ASCII box whose rows end in "|": at 80
    columns the model table was drawn (its width measured as UTF's blank edge) and lost
    its right border; a table that does not fit with its border is lines instead."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    console = Console(width=width, file=stream, color_system=None)
    with console.capture() as captured:
        render_presets(console, catalogue(), "table")
    lines = captured.get().splitlines()
    assert max(len(line) for line in lines) <= width
    rows = [line for line in lines if line.startswith("|")]
    assert rows and all(line.endswith("|") for line in rows)


def test_narrow_terminals_get_rows_as_lines() -> None:
    head = re.compile(r"^ device +GiB +bf16", re.MULTILINE)
    assert head.search(_table_text(80)) and not head.search(_table_text(60))
    assert "h100-sxm: GiB 79.6, bf16 989" in _table_text(60)


def test_assumed_figures_carry_a_dagger() -> None:
    """A figure borrowed from another device or assumed is marked; a measured one is not."""
    text = _table_text(120)
    (h100,) = [line for line in text.splitlines() if line.startswith(" h100-sxm ")]
    # GEMM ceiling: gpu-fryer's 730 TFLOP/s at F = 2·8192³ on the curve x·F / (F + x·ramp),
    # the sm_90 ramp of 6.52 µs (least squares over OpenXLA's sm_90 table, test_catalog's
    # `test_the_sm90_and_sm100_ramps_and_k0_are_the_sweeps_least_squares`): x = 733.17
    # TFLOP/s, 74.1 % of 989; BabelStream's mean of 2.90, 2.90, 2.97, 2.97 TB/s of 3.35; the
    # kernel startup borrowed from the H200's fit
    flops, ramp = 2 * 8192**3, 6.52e-6
    ceiling_flops = 730e12 * flops / (flops - 730e12 * ramp)
    assert ceiling_flops == pytest.approx(733.17e12, rel=1e-5)
    gemm = {d["name"]: d for d in catalogue("devices")["devices"]}["h100-sxm"]["gemm"]
    assert gemm["ceiling_flops"] == pytest.approx(ceiling_flops)  # unrounded, as the JSON has it
    assert gemm["half_flops"] == pytest.approx(ceiling_flops * ramp)
    ceiling = ceiling_flops / 989e12
    stream = (2.90 + 2.90 + 2.97 + 2.97) / 4 / 3.35
    assert f"{ceiling:.1%} " in h100 and f"{stream:.1%} " in h100 and "3.23 µs†" in h100
    (a100,) = [line for line in text.splitlines() if line.startswith(" a100-80gb ")]
    assert "†" not in a100


def test_markdown_has_one_table_per_kind() -> None:
    result = runner.invoke(app, ["presets", "-f", "markdown"])
    assert result.exit_code == 0
    text = result.stdout
    assert text.count("### ") == 3
    assert "| hgx-h800 | nvlink | 8 | 200 | 80.0% | 160.0 | 3 µs† | measured† |" in text
    assert "| deepseek-v3 | 671.03 | 37.55 | 61 | 7168 | 128 MLA |" in text


def test_unknown_kind_is_a_usage_error_in_our_words() -> None:
    """Typer's own enum check said "Invalid value for 'kind': Value error, 'device' is not
    one of ..." (its validator's prefix, as it did for --format: audit); the kind is read
    as the format is, in any case."""
    result = runner.invoke(app, ["presets", "device"])
    assert result.exit_code == 2
    assert result.stdout == ""
    said = "Invalid value for 'KIND': 'device' is not one of devices, topologies or models\n"
    assert result.stderr.endswith(said) and "Value error" not in result.stderr
    upper = runner.invoke(app, ["presets", "Devices", "-f", "json"])
    assert upper.exit_code == 0 and set(json.loads(upper.stdout)) == {"schema_version", "devices"}


def test_help_names_the_kinds_the_catalogue_has() -> None:
    """The argument's choices in --help are `budget.presets.KINDS`, which the CLI keeps a copy
    of so that --help imports nothing."""
    from budget.cli import PresetKind
    from budget.presets import KINDS

    assert tuple(kind.value for kind in PresetKind) == KINDS
    result = runner.invoke(app, ["presets", "--help"], env={"COLUMNS": "100"})
    assert " presets [OPTIONS] [KIND]\n" in result.stdout
    assert "  KIND  devices|topologies|models: which catalogue to list" in result.stdout
    assert "<str>" not in result.stdout


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_s_keys_written_out_budget_as_its_preset(name: str, tmp_path) -> None:
    """The JSON's `model` is every key the preset writes: a plan's model section of those
    keys resolves to the same model as `preset: NAME` (the summary figures left the norms,
    biases, windows and latent ranks out; an audit)."""
    import yaml

    from budget.plan.load import load_plan

    (entry,) = [m for m in catalogue()["models"] if m["name"] == name]
    rest = (
        "batch: {seq: 2048, micro: 1, global: 8}\nparallel: {dp: 8}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n"
    )
    preset, written = tmp_path / "preset.yaml", tmp_path / "written.yaml"
    preset.write_text(f"name: p\nmodel: {{preset: {name}}}\n{rest}", encoding="utf-8")
    model = yaml.safe_dump({"model": entry["model"]}, default_flow_style=None)
    written.write_text(f"name: p\n{model}{rest}", encoding="utf-8")
    from dataclasses import replace

    # the same model, but for the name a preset gives it
    assert replace(load_plan(written).model, name=name) == load_plan(preset).model


def test_a_preset_s_layer_list_beside_layers_overridden_is_said_at_the_override(tmp_path):
    """An audit (m130): gpt-oss-120b's preset lists which of its 36 layers slide; a plan
    writing `layers: 24` over it was told of the preset's list at $.model.preset, where the
    plan's own key is what no longer matches."""
    from pathlib import Path

    from budget.errors import BudgetError
    from budget.plan.load import load_plan

    base = Path(__file__).parents[1] / "plans" / "llama3-70b-decode.yaml"
    text = base.read_text(encoding="utf-8")
    start = text.index("model:\n")
    end = text.index("\nbatch:", start)
    plan = tmp_path / "oss.yaml"
    plan.write_text(text[:start] + "model: {preset: gpt-oss-120b, layers: 24}" + text[end:])
    with pytest.raises(BudgetError) as caught:
        load_plan(plan)
    (problem,) = [p for p in caught.value.problems if "sliding_window.layers" in p.message]
    assert problem.path == "$.model.layers"
    assert problem.message.startswith(
        "the sliding_window.layers of preset gpt-oss-120b has 36 entries but the model has 24"
    )
