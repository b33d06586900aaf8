"""Every JSON output of every command validates against schemas/report.schema.json, and
keeps the promises: no NaN, integers for bytes, stable key order."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from budget.cli import app, route
from budget.report_schema import SCHEMA_VERSION, Kind, report_schema, validation_errors
from tests.plan_files import GPT3, PLANS, ROOT, gpt13_written, invalid, too_big, tp4, variant

runner = CliRunner()
ACCEPTANCE_1 = ["--ranks", "8", "--size", "1GiB", "--bandwidth", "450GB/s", "--latency", "1us"]
FOUR_NODES = ["--level", "8:450GB/s:1us", "--level", "4:50GB/s:5us", "--size", "1GiB"]


def _no_nan(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


def _output(args: list[str], code: int = 0) -> tuple[str, Any]:
    result = runner.invoke(app, route([*args, "--format", "json"]))
    assert result.exit_code == code, result.output
    return result.stdout, _no_nan(result.stdout)


def _promises(data: Any, path: str = "$") -> None:
    """Bytes are ints (never bool, never float); times are floats (an audit: a phase without
    collectives read comm_s 0, an int); numbers are finite."""
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, dict) and value.get("unit") == "bytes":  # a diff's Delta
                for side in ("a", "b", "delta"):
                    assert value[side] is None or type(value[side]) is int, f"{path}.{key}"
            elif key == "bytes" or key.endswith("_bytes"):  # a size, or a list of sizes
                sizes = value if isinstance(value, list) else [value]
                assert all(v is None or type(v) is int for v in sizes), f"{path}.{key} = {value!r}"
            elif key.endswith("_s") and not isinstance(value, (dict, list)):
                assert value is None or type(value) is float, f"{path}.{key} = {value!r}"
            _promises(value, f"{path}.{key}")
    elif isinstance(data, list):
        for i, item in enumerate(data):
            _promises(item, f"{path}[{i}]")
    elif isinstance(data, float):
        assert math.isfinite(data), path


def _valid(data: Any, kind: Kind) -> None:
    assert next(iter(data)) == "schema_version", "the version is the document's first key"
    assert data["schema_version"] == SCHEMA_VERSION
    assert validation_errors(data, kind) == []
    assert validation_errors(data) == []  # the root schema accepts every output too
    _promises(data)


def test_the_schema_is_draft_2020_12_and_the_repository_copy_is_the_packaged_one() -> None:
    Draft202012Validator.check_schema(report_schema())
    link = ROOT / "schemas" / "report.schema.json"
    assert link.is_symlink()
    packaged = ROOT / "budget" / "schemas" / "report.schema.json"
    assert link.resolve() == packaged.resolve()
    assert json.loads(link.read_text(encoding="utf-8")) == report_schema()


def test_the_schema_holds_its_own_version_and_no_other() -> None:
    """The schema accepted any schema_version, so that a script checking an output against
    it could not refuse a version it does not know (an audit, m428); and the README says
    the report's step gives mfu_causal always, which the schema did not require."""
    version = report_schema()["$defs"]["schema_version"]
    assert version["const"] == SCHEMA_VERSION
    assert SCHEMA_VERSION in version["description"].split(":")[1]
    _, data = _output([str(PLANS[0])])
    assert validation_errors(data, "report") == []
    assert validation_errors({**data, "schema_version": "0.1"}, "report") != []
    step = {k: v for k, v in data["step"].items() if k != "mfu_causal"}
    assert validation_errors({**data, "step": step}, "report") != []


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_every_plan_report_validates(plan: Path) -> None:
    text, data = _output([str(plan)])
    _valid(data, "report")
    _described(data)
    again, _ = _output([str(plan)])
    assert text == again  # stable: same keys, same order, same numbers


DECODE = ROOT / "plans" / "llama3-70b-decode.yaml"
H100 = "device: {preset: h100-sxm, reserved: 4 GiB}"
V3 = """model: {preset: deepseek-v3}
batch: {seq: 4096, micro: 1, global: 4096}
parallel: {tp: 1, pp: 1, ep: 64, dp: 2048, zero: 1}
precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, activations: bf16}
device: {preset: h800}
topology: {preset: hgx-h800, nodes: 256}
"""


@pytest.mark.parametrize(
    "case",
    [
        "prefill-mi300x",
        "attention-efficiency",
        "written-device",
        "latent-attention",
        "prompt-one",
    ],
)
def test_the_report_sections_validate_in_every_form(tmp_path: Path, case: str) -> None:
    """The model, device, layout and topology sections in the forms the shipped plans do not
    take: prefill on an AMD preset, a fused kernel with no measurement (the GEMM curve, on a
    written device), a rate the plan gives, a
    device and topology written out (no preset name, no ramp), latent attention and
    multi-token prediction."""
    if case == "prefill-mi300x":
        plan = variant(
            tmp_path,
            "p.yaml",
            (H100, "device: {preset: mi300x}"),
            ("mode: decode", "mode: prefill"),
            base=DECODE,
        )
    elif case == "attention-efficiency":
        plan = variant(
            tmp_path,
            "p.yaml",
            (H100, "device: {preset: h100-sxm, attention_efficiency: 0.4}"),
            base=DECODE,
        )
    elif case == "prompt-one":  # decoding from a start token: 1 key per prefill call
        plan = variant(
            tmp_path,
            "p.yaml",
            ("prompt: 2048", "prompt: 1"),
            (H100, "device: {preset: h100-sxm}"),
            base=DECODE,
        )
    elif case == "written-device":
        plan = tmp_path / "p.yaml"
        plan.write_text(gpt13_written(), encoding="utf-8")
    else:
        plan = tmp_path / "p.yaml"
        plan.write_text(V3, encoding="utf-8")
    _, data = _output([str(plan)])
    _valid(data, "report")
    device, model = data["device"], data["model"]
    expected = {
        "prefill-mi300x": ("mi300x", "measured"),
        "attention-efficiency": ("h100-sxm", "plan"),
        "written-device": ("", "gemm"),
        "latent-attention": ("h800", "measured"),
        "prompt-one": ("h100-sxm", "measured"),
    }[case]
    assert (device["name"], device["attention_rate"]) == expected
    assert (model["mla"] is not None) == (case == "latent-attention")
    assert (model["mtp_layers"] == 1) == (case == "latent-attention")
    _described(data)


def _described(data: dict[str, Any]) -> None:
    """Every key of the described sections has its entry in the schema: a key the code adds
    without one fails here rather than reaching users undocumented."""
    properties = report_schema()["$defs"]["report"]["properties"]
    for section in ("layout", "model", "device"):
        assert set(data[section]) <= set(properties[section]["properties"]), section
    level = properties["topology"]["properties"]["levels"]["items"]["properties"]
    assert all(set(lv) <= set(level) for lv in data["topology"]["levels"])


def test_the_schema_holds_the_report_sections_to_their_types() -> None:
    """Each section the schema describes refuses a value of the wrong kind."""
    _, data = _output([str(GPT3)])
    for section, key, wrong in [
        ("layout", "tp", "8"),
        ("layout", "schedule", "zigzag"),
        ("model", "sliding_window", {"size": 4096}),
        ("model", "hidden", None),
        ("device", "attention_rate", "guessed"),
        ("device", "attention_fraction", 1.5),
        ("device", "memory_bytes", 8.0e10 + 0.5),
    ]:
        bad = json.loads(json.dumps(data))
        bad[section][key] = wrong
        assert validation_errors(bad, "report"), (section, key, wrong)
    bad = json.loads(json.dumps(data))
    bad["topology"]["levels"][0]["latency_s"] = "3us"
    assert validation_errors(bad, "report")
    bad["topology"]["levels"] = []
    assert validation_errors(bad, "report")


def test_check_output_validates(tmp_path: Path) -> None:
    args = ["check", *map(str, PLANS), str(too_big(tmp_path)), str(invalid(tmp_path))]
    _, data = _output([*args, "--headroom", "5%", "--max-exposed", "15%"], code=2)
    _valid(data, "check")
    _, passing = _output(["check", *map(str, PLANS)])
    _valid(passing, "check")
    # the latency limits' reasons, which the schema's limit names had left out
    _, latency = _output(["check", *map(str, PLANS), "--max-ttft", "1ms", "--max-tpot", "1us"], 1)
    assert {"max_ttft", "max_tpot"} <= {r["limit"] for p in latency["plans"] for r in p["reasons"]}
    _valid(latency, "check")


def test_validate_output_validates_and_lists_each_plans_problems(tmp_path: Path) -> None:
    """`budget validate --format json` (DESIGN: every command that reports takes --format; an
    audit found validate took none): each plan with the problems stderr gives it."""
    bad = invalid(tmp_path)
    result = runner.invoke(app, route(["validate", str(GPT3), str(bad), "--format", "json"]))
    assert result.exit_code == 2
    data = _no_nan(result.stdout)
    _valid(data, "validate")
    assert data["valid"] is False
    assert [(p["file"], p["valid"]) for p in data["plans"]] == [
        (str(GPT3), True),
        (str(bad), False),
    ]
    assert data["plans"][1]["problems"] == result.stderr.splitlines()
    assert f"{bad}:3:1: error: $.modle: unknown key" in result.stderr
    _, good = _output(["validate", str(GPT3)])
    _valid(good, "validate")
    assert good["valid"] is True
    markdown = runner.invoke(app, route(["validate", str(GPT3), str(bad), "-f", "markdown"]))
    assert f"| `{GPT3}` | ✅ |" in markdown.stdout and f"`{bad}` is invalid" in markdown.stdout
    # a pipe in a file name is escaped in its cell, as check's table escapes it (a review:
    # "| `a|b.yaml` | ✅ |" split the row)
    piped = tmp_path / "a|b.yaml"
    piped.write_bytes(GPT3.read_bytes())
    markdown = runner.invoke(app, route(["validate", str(piped), "-f", "markdown"]))
    assert f"| `{str(piped).replace('|', chr(92) + '|')}` | ✅ |" in markdown.stdout.splitlines()
    table = runner.invoke(app, route(["validate", str(GPT3), str(bad)]))
    assert table.stdout == f"{GPT3}: ok\n"
    # the files' problems in the order given, as check gives them (they were by file name)
    later = tmp_path / "a-missing.yaml"
    both = runner.invoke(app, route(["validate", str(bad), str(later)]))
    files = dict.fromkeys(line.split(":")[0] for line in both.stderr.splitlines())
    assert list(files) == [str(bad), str(later)]


@pytest.mark.parametrize("pair", ["same", "tp4", "depths"])
def test_diff_output_validates(tmp_path: Path, pair: str) -> None:
    b = {"same": GPT3, "tp4": tp4(tmp_path), "depths": ROOT / "plans" / "llama3-70b.yaml"}[pair]
    _, data = _output(["diff", str(GPT3), str(b)])
    _valid(data, "diff")


@pytest.mark.parametrize(
    "args",
    [
        ["collective", "all-gather", *ACCEPTANCE_1],
        ["collective", "all-reduce", *ACCEPTANCE_1],
        ["collective", "send-recv", *ACCEPTANCE_1],
        ["collective", "all-reduce", *FOUR_NODES],
        ["collective", "all-reduce", *FOUR_NODES, "--algorithm", "auto"],
        ["collective", "all-reduce", *FOUR_NODES, "--beside", "1ms"],
    ],
)
def test_collective_output_validates(args: list[str]) -> None:
    _, data = _output(args)
    _valid(data, "collective")


def test_roofline_output_validates() -> None:
    _, data = _output(
        ["roofline", "--intensity", "4", "--bandwidth", "80GB/s", "--peak", "1TFLOP/s"]
    )
    _valid(data, "roofline")


@pytest.mark.parametrize("kind", [None, "devices", "topologies", "models"])
def test_presets_output_validates(kind: str | None) -> None:
    _, data = _output(["presets"] if kind is None else ["presets", kind])
    _valid(data, "presets")
    kinds = ["devices", "topologies", "models"] if kind is None else [kind]
    assert list(data) == ["schema_version", *kinds]


def test_the_presets_schema_names_every_assumed_tag_and_kernel() -> None:
    """A tag or kernel the catalogue gains must be added to the schema, or this fails."""
    _, data = _output(["presets", "devices"])
    data["devices"][0]["assumed"].append("guess")
    assert validation_errors(data, "presets")
    data["devices"][0]["assumed"].pop()
    data["devices"][0]["attention"][0]["kernel"] = "flash9"
    assert validation_errors(data, "presets")


def test_the_schema_rejects_a_float_for_bytes() -> None:
    _, data = _output([str(GPT3)])
    data["memory"]["stages"][0]["peak_bytes"] = 1.5
    assert validation_errors(data, "report")


def test_mfu_names_the_peak_it_is_a_share_of(tmp_path: Path) -> None:
    """MFU is of the dense peak of precision.matmul's format: an fp8 Llama 3 70B runs faster
    yet reads lower than its bf16 twin, since the H100's fp8 peak is twice its bf16 one; the
    report says which peak (an audit found it said neither)."""
    plan = ROOT / "plans" / "llama3-70b.yaml"
    fp8 = variant(
        tmp_path,
        "fp8.yaml",
        ("  activations: bf16\n", "  activations: bf16\n  matmul: fp8\n"),
        base=plan,
    )
    _, bf16_data = _output([str(plan)])
    _, fp8_data = _output([str(fp8)])
    assert (bf16_data["step"]["mfu_format"], fp8_data["step"]["mfu_format"]) == ("bf16", "fp8")
    assert fp8_data["step"]["tokens_per_s"] > bf16_data["step"]["tokens_per_s"]
    assert fp8_data["step"]["mfu"] < bf16_data["step"]["mfu"]
    table = runner.invoke(app, route([str(fp8)]), env={"COLUMNS": "200"}).stdout
    assert f"MFU {fp8_data['step']['mfu']:.1%} of the fp8 peak" in table


def test_mfu_is_of_the_attention_cores_peak_where_that_is_higher(tmp_path: Path) -> None:
    """fp32 GEMMs beside the bf16 fused attention kernel (precision.activations): counted
    against the fp32 peak, a 32K-token Llama 3 8B read 112 % (a fuzzing audit), since its
    attention FLOPs ran at the bf16 rate. MFU is then of the bf16 peak, the higher of the
    two formats its products run in, and at most 1; its MFU x peak is the same model FLOP/s
    whichever format is named."""
    path = tmp_path / "fp32.yaml"
    path.write_text(
        "model: {preset: llama3-8b}\n"
        "batch: {seq: 32768, micro: 1, global: 8}\n"
        "parallel: {dp: 8, zero: 3}\n"
        "precision: {matmul: fp32}\n"
        "recompute: full\n"
        "device: {preset: h100-sxm, reserved: 2 GiB}\n"
        "topology: {preset: dgx-h100, nodes: 1}\n",
        encoding="utf-8",
    )
    _, data = _output([str(path)])
    step = data["step"]
    assert step["mfu_format"] == "bf16" and 0 < step["mfu"] <= 1
    _valid(data, "report")
    # fp32 activations too: the fused kernel is still timed at its bf16 rate (a review
    # found 111 % of the fp32 peak); eager attention's products run in the activations'
    # format, bf16 here, so 64K tokens of them read against the bf16 peak (it read 114 %)
    text = path.read_text(encoding="utf-8")
    fp32 = text.replace("{matmul: fp32}", "{matmul: fp32, activations: fp32}")
    eager = text.replace("llama3-8b}", "llama3-8b, attention: eager}").replace("32768", "65536")
    for name, variant_text in [("fp32", fp32), ("eager", eager)]:
        other = tmp_path / f"{name}.yaml"
        other.write_text(variant_text, encoding="utf-8")
        _, data = _output([str(other)])
        assert data["step"]["mfu_format"] == "bf16" and 0 < data["step"]["mfu"] <= 1, name


def test_mfu_of_a_fused_kernel_without_a_rate_is_of_the_activations_peak(tmp_path: Path) -> None:
    """A written-out device has no attention rate: its fused kernel is priced on the GEMM
    curve in the activations' format, fp32 here, so MFU is of the fp32 peak (a review: it
    read 4.4 % of the bf16 peak where the plan ran at 65 % of its own)."""
    path = tmp_path / "written.yaml"
    path.write_text(
        "model: {preset: llama3-8b}\n"
        "batch: {seq: 8192, micro: 1, global: 8}\n"
        "parallel: {dp: 8, zero: 3}\n"
        "precision: {matmul: fp32, activations: fp32}\n"
        "recompute: full\n"
        "device: {memory: 80 GiB, memory_bandwidth: 3.35 TB/s, reserved: 2 GiB,\n"
        "  flops: {bf16: 989 TFLOP/s, fp32: 67 TFLOP/s}}\n"
        "topology: {preset: dgx-h100, nodes: 1}\n",
        encoding="utf-8",
    )
    _, data = _output([str(path)])
    assert data["step"]["mfu_format"] == "fp32" and 0.3 < data["step"]["mfu"] <= 1


def _undocumented(data: Any, node: dict[str, Any], path: str = "$") -> list[str]:
    """The keys of `data` its schema `node` does not name: an object's keys outside its
    `properties` (a `patternProperties` match says a type, not what the key is), where the
    object is not a map of names (`additionalProperties` a schema) or of free values."""
    defs = report_schema()["$defs"]
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    found: list[str] = []
    if isinstance(data, dict):
        named = node.get("properties")
        extra = node.get("additionalProperties")
        for key, value in data.items():
            if named is not None and key in named:
                found += _undocumented(value, named[key], f"{path}.{key}")
            elif isinstance(extra, dict):  # a map: its keys are names, its values alike
                found += _undocumented(value, extra, f"{path}.{key}")
            elif named is not None:
                found.append(f"{path}.{key}")
    elif isinstance(data, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(data):
            found += _undocumented(item, node["items"], f"{path}[{i}]")
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        if isinstance(data, dict) and branch.get("type") in ("object", ["object", "null"]):
            found = [p for p in found if p in _undocumented(data, branch, path)]
    return found


def test_every_key_a_command_prints_is_named_by_its_schema(tmp_path: Path) -> None:
    """An audit (m124) found keys the schema named nowhere, or matched by `_s$` alone: the
    report's step.exposed_share, after_s, ttft_s and decode_token_s; check's notes and
    latency limits, and each plan's ttft_s and tpot_s; search's serving limits;
    validate-model's reference and diagnostic rows' stack, peak_bytes, capacity_bytes and
    fits; the collective's payload_bytes. Every key is now described where it stands."""
    defs = report_schema()["$defs"]
    decode = ROOT / "plans" / "llama3-70b-decode.yaml"
    outputs: list[tuple[list[str], Kind, int]] = [
        *[([str(plan)], "report", 0) for plan in PLANS],
        (["check", str(GPT3), str(decode), "--max-ttft", "1ms", "--max-tpot", "1us"], "check", 1),
        (["search", str(PLANS[2]), "--top", "2", "--max-step", "100s"], "search", 0),
        (["validate-model"], "validate_model", 0),
        (["collective", "all-reduce", "--ranks", "32", *FOUR_NODES], "collective", 0),
        (["diff", str(GPT3), str(tp4(tmp_path))], "diff", 0),
    ]
    for args, kind, code in outputs:
        _, data = _output(args, code)
        assert _undocumented(data, defs[kind]) == [], args
