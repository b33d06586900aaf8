"""The plan schema: one file for editors and the package, errors with positions and hints."""

from __future__ import annotations

import json
import os
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from budget.cli import app, route
from budget.plan.schema import schema, schema_text, validate_tree
from budget.plan.yaml_load import Marks, load_yaml
from tests.guards import refused_in_time

ROOT = Path(__file__).resolve().parent.parent
PLANS = sorted((ROOT / "plans").glob("*.yaml"))


MODEL_HINT = (
    "write the model's dimensions (layers, hidden, heads, vocab), or name a preset "
    "({preset: llama3-8b}; `budget presets` lists them) or a Hugging Face config "
    "({hf_config: config.json})"
)


def errors(text: str) -> list[str]:
    loaded = load_yaml(text, "p.yaml")
    assert loaded.problems == ()
    return [str(p) for p in validate_tree(loaded.tree, loaded.marks, "p.yaml")]


def test_the_schema_is_valid_draft_2020_12() -> None:
    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema())


def test_the_repository_copy_is_the_packaged_copy() -> None:
    """Editors read schemas/plan.schema.json; the installed package reads its own copy."""
    repository = ROOT / "schemas" / "plan.schema.json"
    assert os.readlink(repository) == "../budget/schemas/plan.schema.json"
    packaged = files("budget").joinpath("schemas/plan.schema.json").read_bytes()
    assert repository.read_bytes() == packaged
    assert schema_text().encode("utf-8") == packaged


def test_budget_schema_prints_the_file() -> None:
    result = CliRunner().invoke(app, route(["schema"]))
    assert result.exit_code == 0
    assert result.stdout == (ROOT / "schemas" / "plan.schema.json").read_text(encoding="utf-8")
    assert json.loads(result.stdout) == schema()


def _walk(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """Every property schema in the document, with a readable path."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            found.append((f"{path}.{name}", sub))
        for key, sub in node.items():
            if key in ("allOf", "if", "then", "else", "not", "anyOf"):
                continue  # conditions, not property definitions
            if key in ("properties", "$defs") and isinstance(sub, dict):
                for name, child in sub.items():
                    found.extend(_walk(child, f"{path}.{name}"))
            elif isinstance(sub, dict | list):
                found.extend(_walk(sub, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            found.extend(_walk(sub, f"{path}[{i}]"))
    return found


def test_every_property_has_a_description_and_examples() -> None:
    """Editors show them on hover and completion."""
    properties = _walk(schema())
    assert len(properties) > 80
    for path, sub in properties:
        assert sub.get("description"), path
        assert sub.get("examples"), path


def test_every_object_forbids_unknown_keys() -> None:
    def objects(node: Any) -> list[dict[str, Any]]:
        if isinstance(node, dict):
            own = [node] if node.get("type") == "object" else []
            return own + [o for sub in node.values() for o in objects(sub)]
        if isinstance(node, list):
            return [o for sub in node for o in objects(sub)]
        return []

    found = objects(schema())
    assert len(found) >= 12
    assert all(o.get("additionalProperties") is False for o in found)


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_shipped_plans_pass_the_schema_and_name_it(plan: Path) -> None:
    text = plan.read_text(encoding="utf-8")
    assert text.startswith("# yaml-language-server: $schema=../schemas/plan.schema.json\n")
    assert errors(text) == []


MINIMAL = """\
model: {layers: 2, hidden: 64, heads: 4, vocab: 100}
batch: {seq: 16, micro: 1, global: 1}
device: {memory: 80 GiB}
topology: {gpus: 1, levels: [{name: nvlink, bandwidth: 450 GB/s, latency: 3 us}]}
"""


def test_a_minimal_plan_passes() -> None:
    assert errors(MINIMAL) == []


def test_a_zero_rate_or_time_needs_no_unit() -> None:
    """0 reads the same in every unit: a link without latency, a device without startup."""
    assert errors(MINIMAL.replace("3 us", "0", 1)) == []
    assert errors(MINIMAL.replace("3 us", "'0'", 1)) == []
    assert errors(MINIMAL.replace("80 GiB}", "80 GiB, kernel_startup: 0.0}", 1)) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("layers: 2", "layers: 0"),
            "p.yaml:1:17: error: $.model.layers: 0 is less than the minimum of 1",
        ),
        (
            ("layers: 2, ", ""),
            f"p.yaml:1:1: error: $.model: 'layers' is a required property: {MODEL_HINT}",
        ),
        (
            # one line for one typo: the key it suggests is not also said to be missing at
            # the section's first line (a user audit, m413)
            ("heads: 4", "heds: 4"),
            ["p.yaml:1:32: error: $.model.heds: unknown key 'heds' (did you mean 'heads'?)"],
        ),
        (
            ("layers: 2", "layers: two"),
            "p.yaml:1:17: error: $.model.layers: 'two' is not an integer",
        ),
        (
            ("layers: 2", "layers: 2.5"),
            "p.yaml:1:17: error: $.model.layers: 2.5 is not an integer",
        ),
        (
            ("layers: 2", "layers: true"),
            "p.yaml:1:17: error: $.model.layers: true is not an integer; YAML reads an "
            "unquoted yes, no, on or off as true or false: write a number",
        ),
        (
            ("80 GiB", "80 GBs"),
            "p.yaml:3:18: error: $.device.memory: '80 GBs' is not a size such as '80 GiB', '80GB' "
            "or a number of bytes",
        ),
        (
            ("450 GB/s", "-1 GB/s"),
            "p.yaml:4:56: error: $.topology.levels[0].bandwidth: '-1 GB/s' is not a bandwidth "
            "such as '450 GB/s' or '200 Gb/s'",
        ),
        (
            ("3 us", "3 min"),
            "p.yaml:4:75: error: $.topology.levels[0].latency: '3 min' is not a time such as "
            "'3 us', '2 ms' or '12 s'",
        ),
        (
            ("450 GB/s", "450"),
            "p.yaml:4:56: error: $.topology.levels[0].bandwidth: 450 has no unit; write a "
            "bandwidth with its unit, such as '450 GB/s' or '450 Gb/s'",
        ),
        (
            ("450 GB/s", "'450'"),
            "p.yaml:4:56: error: $.topology.levels[0].bandwidth: 450 has no unit; write a "
            "bandwidth with its unit, such as '450 GB/s' or '450 Gb/s'",
        ),
        (
            ("3 us", "3"),
            "p.yaml:4:75: error: $.topology.levels[0].latency: 3 has no unit; write a time "
            "with its unit, such as '3 us', '3 ms' or '3 s'",
        ),
        (
            ("3 us", "true"),
            "p.yaml:4:75: error: $.topology.levels[0].latency: true is not a time such as "
            "'3 us', '2 ms' or '12 s'",
        ),
        (
            ("memory: 80 GiB", "memory: 80 GiB, flops: {bf16: 989}"),
            "p.yaml:3:40: error: $.device.flops.bf16: 989 has no unit; write a compute rate "
            "with its unit, such as '989 TFLOP/s'",
        ),
        (
            ("heads: 4", "heads: 4, mlp: gleu"),
            "p.yaml:1:47: error: $.model.mlp: 'gleu' is not one of gelu, swiglu, geglu, "
            "squared_relu (did you mean 'gelu'?)",
        ),
        (
            ("model: {", "modle: {"),
            ["p.yaml:1:1: error: $.modle: unknown key 'modle' (did you mean 'model'?)"],
        ),
    ],
)
def test_schema_errors(edit: tuple[str, str], expected: str | list[str]) -> None:
    """Each edit's problems, exactly: the one expected (or those listed), and no other."""
    old, new = edit
    assert old in MINIMAL
    found = errors(MINIMAL.replace(old, new, 1))
    lines = [expected] if isinstance(expected, str) else expected
    for line in lines:
        assert line in found
    assert found == lines


def test_unknown_key_without_a_close_match_lists_the_keys() -> None:
    found = errors(MINIMAL + "parallel: {xyzzy: 1}\n")
    assert found == [
        "p.yaml:5:12: error: $.parallel.xyzzy: unknown key 'xyzzy' (expected one of: "
        "cp, cp_attention, dp, dp_shard, ep, etp, fsdp, fsdp_root, fsdp_unit, order, pipeline, "
        "pp, reduce_bucket, reshard_after_forward, sequence_parallel, tp, tp_style, zero)"
    ]


def test_only_the_unknown_keys_that_can_be_shown_get_a_suggestion(monkeypatch) -> None:
    """A suggestion costs a difflib search over the section's keys: 9,900 unknown keys
    spent 5 s there, for 200 lines printed (an audit). The first MAX_SHOWN in file order,
    the ones that can be printed, still get theirs."""
    import budget.plan.schema as schema_module
    from budget.errors import MAX_SHOWN

    calls = []
    closest = schema_module._closest
    monkeypatch.setattr(
        schema_module,
        "_closest",
        lambda word, choices: calls.append(word) or closest(word, choices),
    )
    keys = "".join(f"  hiddenx{i}: 1\n" for i in range(3 * MAX_SHOWN))
    block = "model:\n  layers: 2\n  hidden: 64\n  heads: 4\n  vocab: 100\n" + keys
    found = errors(MINIMAL.replace("model: {layers: 2, hidden: 64, heads: 4, vocab: 100}\n", block))
    assert len(found) == 3 * MAX_SHOWN and len(calls) == MAX_SHOWN
    assert calls == [f"hiddenx{i}" for i in range(MAX_SHOWN)]  # the first, in file order
    assert "(did you mean 'hidden'?)" in found[0]


def test_mode_decides_the_required_batch_keys() -> None:
    """A section's missing keys are one line (a user audit, m413: three at one place)."""
    found = errors(MINIMAL.replace("model:", "mode: decode\nmodel:"))
    assert found == [
        "p.yaml:3:1: error: $.batch: 'sequences', 'prompt' and 'generate' are required properties"
    ]


@pytest.mark.parametrize("mode", ["decod", "trian", "null", "[decode]"])
def test_a_mode_that_is_none_holds_back_the_batch_keys_it_decides(mode: str) -> None:
    """`mode: decod` under a serving batch said 'global', 'micro' and 'seq' were required
    besides the mode's own error (the training batch was required unless the mode was
    prefill or decode), pushing toward a training batch: the training batch is required
    where the mode is train or left out, so a mode that is none asks for no batch keys."""
    serving = MINIMAL.replace("batch: {seq: 16, micro: 1, global: 1}", "batch: {sequences: 2}")
    for text in (serving, MINIMAL):
        found = errors(text.replace("model:", f"mode: {mode}\nmodel:"))
        assert len(found) == 1 and " error: $.mode: " in found[0], found
    trained = errors(MINIMAL.replace("model:", "mode: train\nmodel:").replace(", global: 1", ""))
    assert trained == ["p.yaml:3:1: error: $.batch: 'global' is a required property"]
    assert errors(MINIMAL.replace(", global: 1", "")) == [
        "p.yaml:2:1: error: $.batch: 'global' is a required property"
    ]


def test_presets_relax_the_required_fields() -> None:
    text = (
        "model: {preset: llama3-70b}\nbatch: {seq: 16, micro: 1, global: 1}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 2}\n"
    )
    assert errors(text) == []


def test_all_errors_are_reported_sorted() -> None:
    text = MINIMAL.replace("layers: 2", "layers: 0").replace("80 GiB", "lots") + "zero: 1\n"
    assert errors(text) == [
        "p.yaml:1:17: error: $.model.layers: 0 is less than the minimum of 1",
        "p.yaml:3:18: error: $.device.memory: 'lots' is not a size such as '80 GiB', '80GB' or "
        "a number of bytes",
        "p.yaml:5:1: error: $.zero: unknown key 'zero'; zero goes under parallel",
    ]


def test_a_key_in_the_wrong_section_says_where_it_goes() -> None:
    """`parallel: {recompute: full}` listed the parallel keys and no word of where recompute
    goes (a user audit): a key another section takes says which; a top-level key says so;
    a key of several sections names them; a key of none says nothing more. A key told where
    it goes is told so first, and this section's spelling near it after (an audit:
    batch.sequence_parallel was asked "did you mean 'sequences'?", a serving key a train
    plan refuses, before where it goes; a review: overlap.grads more likely means
    dp_grads than precision.grads, so the hint stays)."""
    for key, value, home in [
        ("recompute", "full", "; recompute is a top-level key"),
        ("reserved", "3 GiB", "; reserved goes under device"),
        ("tp", "2", "; tp goes under parallel or overlap"),
        ("sequence_parallel", "true", "; sequence_parallel goes under parallel"),
        # a link's keys (an audit: topology.bandwidth listed the topology's keys alone)
        ("speed", "1", ""),
        ("size", "8", ""),  # a batch's size is no level's (a review)
    ]:
        text = MINIMAL.replace("batch: {", f"batch: {{{key}: {value}, ")
        (message,) = [e for e in errors(text) if f"unknown key {key!r}" in e]
        if home:  # where it goes first; a spelling of this section's, if any, after
            assert f"unknown key {key!r}{home}" in message, message
            assert message.endswith((home, "here?")), message
        else:
            assert message.endswith(")"), message
    for text in (
        MINIMAL.replace("device: {", "device: {bandwidth: 50 GB/s, "),
        MINIMAL + "latency: 3 us\n",
    ):
        (message,) = [
            e
            for e in errors(text)
            if "unknown key 'bandwidth'" in e or "unknown key 'latency'" in e
        ]
        assert " goes under each of topology.levels" in message, message


def test_a_key_of_a_mapping_inside_a_section_says_where_it_goes() -> None:
    """A user audit, m488: parallel.virtual_stages (`budget search --virtual-stages`
    names it) listed the parallel keys and no word of parallel.pipeline; so did a top-level
    one and Megatron-LM's virtual_pipeline_model_parallel_size. Words several mappings share
    (count, size) stay unplaced."""
    for key, value, said in [
        ("virtual_stages", "2", "; virtual_stages goes under parallel.pipeline"),
        ("schedule", "interleaved", "; schedule goes under parallel.pipeline"),
        ("top_k", "2", "; top_k goes under model.experts"),
        ("kv_rank", "512", "; kv_rank goes under model.mla"),
        (
            "virtual_pipeline_model_parallel_size",
            "2",
            ": budget calls it parallel.pipeline.virtual_stages",
        ),
        ("count", "2", " (expected one of"),
    ]:
        for text in (MINIMAL + f"parallel: {{{key}: {value}}}\n", MINIMAL + f"{key}: {value}\n"):
            (message,) = [e for e in errors(text) if f"unknown key {key!r}" in e]
            assert f"unknown key {key!r}{said}" in message, message


@pytest.mark.parametrize(
    ("slowdown", "problem"),
    [
        ("0", None),
        ("0.189", None),
        ("1", "is greater than or equal to the maximum of 1"),
        ("-0.1", "is less than the minimum of 0"),
        ("yes", "true is not a number"),
        # a percentage where the fraction is asked for: the message names the fraction
        ("18.9", "is greater than or equal to the maximum of 1; a fraction: 18.9 % is 0.189"),
        ("18.9%", "'18.9%' is not a number; write a percentage as its fraction, 0.189"),
    ],
)
def test_overlap_slowdown_is_a_fraction_below_one(slowdown: str, problem: str | None) -> None:
    found = errors(MINIMAL + f"overlap: {{tp: true, slowdown: {slowdown}}}\n")
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and "$.overlap.slowdown" in found[0] and problem in found[0]


@pytest.mark.parametrize(
    ("written", "problems"),
    [
        ("24", []),
        ("{attention: 24, mlp: 8}", []),
        ("-3", ["$.overlap.tp_comm_sms: -3 is less than the minimum of 0"]),
        ('"16"', ["$.overlap.tp_comm_sms: '16' is not an integer or a mapping"]),
        (
            '{attention: "24", mlp: -1}',
            [
                "$.overlap.tp_comm_sms.attention: '24' is not an integer",
                "$.overlap.tp_comm_sms.mlp: -1 is less than the minimum of 0",
            ],
        ),
        ("{attention: 24, proj: 4}", ["$.overlap.tp_comm_sms.proj: unknown key 'proj'"]),
    ],
)
def test_tp_comm_sms_is_one_count_or_one_per_gemm(written: str, problems: list[str]) -> None:
    """Each bad count is reported at its own key, all of them (a oneOf had reported any
    problem as one line at the parent: review)."""
    found = errors(MINIMAL + f"overlap: {{tp: true, tp_comm_sms: {written}}}\n")
    assert len(found) == len(problems)
    for line, problem in zip(found, problems, strict=True):
        assert problem in line


@pytest.mark.parametrize(("written", "read"), [("no", "true or false"), ("1.3", "a number")])
def test_a_name_yaml_read_as_another_type_says_so(written: str, read: str) -> None:
    """`name: no` is YAML 1.1's false and `name: 1.3` a number: the error says YAML read
    them so and that quoting keeps them text (it said only "false is not a name")."""
    (found,) = errors(f"name: {written}\n" + MINIMAL)
    assert f"YAML reads the unquoted value as {read}: quote it to keep it text" in found


def test_a_scalar_where_a_section_goes_names_the_sections_keys() -> None:
    """`precision: bf16` said only "'bf16' is not a mapping" (an audit)."""
    tree = {"precision": "bf16", "batch": 5}
    found = {p.path: p.message for p in validate_tree(tree, Marks(), "p.yaml")}
    assert found["$.precision"] == (
        "'bf16' is not a mapping; its keys are activations, grad_reduce, grads, kv_cache, "
        "master, matmul, optimizer, optimizer_kernel, ..."
    )
    assert found["$.batch"] == (
        "5 is not a mapping; its keys are generate, global, micro, prompt, seq, sequences"
    )


def test_a_preset_named_bare_says_how_to_name_it() -> None:
    tree = {"model": "llama3-8b", "device": "h100-sxm"}
    found = {p.path: p.message for p in validate_tree(tree, Marks(), "p.yaml")}
    assert found["$.model"] == "'llama3-8b' is not a mapping; name a preset as {preset: llama3-8b}"
    assert found["$.device"] == "'h100-sxm' is not a mapping; name a preset as {preset: h100-sxm}"


@pytest.mark.parametrize(("written", "read"), [("[1]", "[1]"), ("{a: 1}", "{'a': 1}")])
def test_a_name_that_is_no_string_is_told_so(written: str, read: str) -> None:
    """`name: [1]` was "not a name of printable characters": it is no text at all."""
    assert errors(f"name: {written}\n" + MINIMAL) == [
        f"p.yaml:1:1: error: $.name: {read} is not a string"
    ]


# -- the schema's patterns answer in linear time ------------------------------------------

# The size pattern before the fix: `\s*` on both sides of an optional unit, so a run of n
# spaces not followed by the end was split n² ways (100,000 spaces took 54 s: audit)
_OLD_SIZE = (
    r"^\s*(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*(?:(?:[kKMGTP]|[KMGTP]i)?B)?"
    r"\s*$"
)


def _patterns(node: Any) -> list[str]:
    """Every `pattern` in the schema."""
    if isinstance(node, dict):
        own = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return own + [p for sub in node.values() for p in _patterns(sub)]
    if isinstance(node, list):
        return [p for sub in node for p in _patterns(sub)]
    return []


# text built of what the patterns accept, with short runs of spaces (the old pattern is
# quadratic in them) and characters they refuse
_size_like = st.lists(
    st.sampled_from(
        [*"019.eE+- kKMGTPiBbx", "  ", "\t", "/s", "KiB", "GB", " GiB", "\n", "\u00a0"]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=500)
@given(_size_like)
def test_the_size_pattern_accepts_what_it_accepted(text: str) -> None:
    """The fixed pattern reads the same strings as before but "KB", which the units parser
    refuses too (`parse_bytes`): an editor checking a plan against the schema alone refuses
    what budget refuses."""
    new = schema()["$defs"]["size"]["pattern"]
    assert new != _OLD_SIZE
    accepted = re.search(_OLD_SIZE, text) is not None and not text.rstrip().endswith("KB")
    assert (re.search(new, text) is not None) == accepted


def test_jedec_kilo_is_refused_by_the_schema_with_the_parsers_sentence() -> None:
    """ "80 KB" and "3 Kb/s" fail the schema's own patterns (an editor flags them) and the
    error says why, in the words `budget.units` uses, not "is not a size"."""
    plan = MINIMAL.replace("80 GiB", "80 KB", 1)
    assert plan != MINIMAL
    [problem] = errors(plan)
    assert problem.endswith(
        "$.device.memory: ambiguous prefix 'K' in '80 KB': write kB for 1000 bytes or KiB for 1024"
    )
    size = Draft202012Validator(schema()["$defs"]["size"])
    bandwidth = Draft202012Validator(schema()["$defs"]["bandwidth"])
    assert not size.is_valid("80 KB") and size.is_valid("80 kB") and size.is_valid("80 KiB")
    assert not bandwidth.is_valid("3 Kb/s") and not bandwidth.is_valid("3 KB/s")
    assert bandwidth.is_valid("3 kb/s") and bandwidth.is_valid("3 Kib/s")
    [problem] = errors(MINIMAL.replace("450 GB/s", "3 Kb/s", 1))
    assert problem.endswith(
        "$.topology.levels[0].bandwidth: ambiguous prefix 'K' in '3 Kb/s': write kb for 1000"
        " bits or Kib for 1024"
    )


def test_a_size_with_a_long_run_of_spaces_is_refused_fast() -> None:
    text = MINIMAL.replace("80 GiB", '"3' + " " * 100_000 + 'x"')
    with refused_in_time():
        found = errors(text)
    assert found == [
        "p.yaml:3:18: error: $.device.memory: '3                                   ... is not "
        "a size such as '80 GiB', '80GB' or a number of bytes"
    ]
    assert not re.search(schema()["$defs"]["size"]["pattern"], "80 KB")  # JEDEC's kilo: refused


_SPACES = " " * 20_000
# inputs that make a pattern with two adjacent runs of \s*, or a run of digits, backtrack
_ADVERSARIAL = [
    f"1{_SPACES}x",
    f"{_SPACES}x",
    f"1{_SPACES}B{_SPACES}x",
    f"1e5{_SPACES}GB/s{_SPACES}x",
    f"0{_SPACES}x",
    f"1{_SPACES}us{_SPACES}\x00",
    f"shard({_SPACES}1{_SPACES}){_SPACES}x",
    "1" * 20_000 + "x",
    "a" * 20_000 + "\x00",
]


def test_every_pattern_in_the_schema_answers_an_adversarial_string_fast() -> None:
    patterns = sorted(set(_patterns(schema())))
    assert len(patterns) >= 6  # size, bandwidth, duration, flops, placement, names
    assert schema()["$defs"]["size"]["pattern"] in patterns
    for pattern in patterns:
        for text in _ADVERSARIAL:
            with refused_in_time():
                re.search(pattern, text)  # as jsonschema matches a pattern


def test_no_required_key_offers_a_default() -> None:
    """A key the schema requires cannot be left out, so a default beside it tells an editor
    it can (an audit: a transition's ``group`` offered "tp" and was refused when left out)."""
    import json
    from pathlib import Path

    schema = json.loads(
        (Path(__file__).parents[1] / "budget" / "schemas" / "plan.schema.json").read_text("utf-8")
    )
    offending = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            properties = node.get("properties", {})
            for key in node.get("required", []):
                if isinstance(properties.get(key), dict) and "default" in properties[key]:
                    offending.append(f"{path}.{key}")
            for key, value in node.items():
                walk(value, f"{path}.{key}" if key != "properties" else path)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    walk(schema, "$")
    assert offending == []


@pytest.mark.parametrize(
    ("section", "catalogue"),
    [("model", "MODELS"), ("device", "DEVICES"), ("topology", "TOPOLOGIES")],
)
def test_the_schema_names_every_preset_of_the_catalogue(section: str, catalogue: str) -> None:
    """The preset's description, which `budget schema` prints and editors show, lists the
    catalogue's presets: the model list lacked gpt-oss-120b (a user audit)."""
    import budget.catalog.devices
    import budget.catalog.models
    import budget.catalog.topologies

    modules = (budget.catalog.models, budget.catalog.devices, budget.catalog.topologies)
    names = next(getattr(m, catalogue) for m in modules if hasattr(m, catalogue))
    text = schema()["properties"][section]["properties"]["preset"]["description"]
    listed = re.search(r"\(([^)]*)\)", text)
    assert listed is not None
    assert listed[1].split(", ") == list(names)


@pytest.mark.parametrize(
    ("text", "missing", "hint"),
    [
        ("topology: {gpus: 1}", "levels", "{preset: dgx-h100, gpus: 1}"),
        ("device: {flops: {bf16: 1 TFLOP/s}}", "memory", "{preset: h100-sxm}"),
        ("model: {layers: 2}", "hidden", "{hf_config: config.json}"),
    ],
)
def test_a_section_missing_a_key_a_preset_would_fill_says_so(
    text: str, missing: str, hint: str
) -> None:
    """`topology: {gpus: 1}` said only "'levels' is a required property" (a user audit),
    where a preset with its size is what a one-GPU plan writes."""
    found = [e for e in errors(text + "\n") if f"'{missing}'" in e and "required" in e]
    assert found and hint in found[0]


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("num_attention_heads", "heads"),  # it had said 'attention_sinks', a flag
        ("ffn_hidden", "ffn"),  # it had said 'hidden', set already
        ("ffn_hidden_size", "ffn"),  # it had offered nothing
        ("intermediate_size", "ffn"),
        ("num_hidden_layers", "layers"),
        ("num_key_value_heads", "kv_heads"),
        ("n_heads", "heads"),  # MPT's yamls
        ("max_position_embeddings", "max_positions"),
    ],
)
def test_another_tools_name_for_a_model_size_is_told_budgets(written: str, meant: str) -> None:
    """An audit: Hugging Face's and Megatron-LM's names for the model's sizes were offered
    the nearest spelling, another key (num_attention_heads → attention_sinks, a flag;
    ffn_hidden → hidden, set two lines above), or nothing."""
    text = MINIMAL.replace("vocab: 100}", f"vocab: 100, {written}: 8}}")
    (found,) = [e for e in errors(text) if f"'{written}'" in e]
    assert found.endswith(f"(did you mean '{meant}'?)"), found


def test_a_key_or_value_in_another_case_is_offered_budgets() -> None:
    """An audit: 'TP' was listed the parallel keys and 'GeGLU' offered nothing, difflib
    scoring them under its cutoff against 'tp' and 'geglu'."""
    (key,) = errors(MINIMAL + "parallel: {TP: 1}\n")
    assert key.endswith("unknown key 'TP' (did you mean 'tp'?)"), key
    (value,) = errors(MINIMAL.replace("vocab: 100}", "vocab: 100, mlp: GeGLU}"))
    assert value.endswith("(did you mean 'geglu'?)"), value


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("tensor_parallel", "tp"),  # it had said 'sequence_parallel', a boolean
        ("pipeline_model_parallel_size", "pp"),
        ("data_parallel", "dp"),
        ("context_parallel", "cp"),
        ("expert_parallel", "ep"),
    ],
)
def test_another_tools_name_for_a_degree_is_told_budgets(written: str, meant: str) -> None:
    """An audit: the nearest spelling of Megatron-LM's or Hugging Face's name for a key is
    another key (tensor_parallel → sequence_parallel, sequence_length → sequences), whose
    advice, followed, failed; the key budget means is said instead."""
    text = MINIMAL + f"parallel: {{{written}: 2}}\n"
    (found,) = [e for e in errors(text) if f"'{written}'" in e]
    assert found.endswith(f"(did you mean '{meant}'?)"), found
    # a batch's keys depend on the mode, which the key list does not: no guess, the list
    # (a review: a decode plan was told 'seq', which it refuses)
    seq = [e for e in errors(MINIMAL.replace("seq: ", "sequence_length: ", 1)) if "unknown" in e]
    assert seq and "did you mean" not in seq[0] and "expected one of:" in seq[0], seq
    # outside parallel, where budget keeps it (an audit: a top-level tensor_parallel was
    # listed the top-level keys; "goes under parallel or overlap" would have misled too)
    (top,) = [e for e in errors(MINIMAL + f"{written}: 2\n") if f"'{written}'" in e]
    assert top.endswith(f"unknown key '{written}': budget calls it parallel.{meant}"), top
    # a batch's other names outside batch are told where the batch goes (a review)
    (size,) = [e for e in errors(MINIMAL + "micro_batch_size: 2\n") if "micro_batch_size" in e]
    assert size.endswith(
        "unknown key 'micro_batch_size': budget's batch sizes go under batch, as seq, micro "
        "and global in training and sequences, prompt and generate in serving"
    ), size


def test_a_misplaced_key_near_a_key_of_its_own_section_is_told_both() -> None:
    """A review: `overlap: {grads: true}` most likely means overlap.dp_grads, though
    precision.grads is the key of that name; the message says where the key goes first
    and this section's spelling near it after, as batch.sequence_parallel is told parallel
    first and 'sequences' after."""
    text = MINIMAL + "overlap: {grads: true}\n"
    (message,) = [e for e in errors(text) if "unknown key 'grads'" in e]
    assert message.endswith(
        "unknown key 'grads'; grads goes under precision, or did you mean 'dp_grads' here?"
    )


def test_a_level_s_bandwidth_is_described_as_what_collectives_reach() -> None:
    """An audit: the schema (what editors show on hover) described a level's bandwidth as
    "Bandwidth per GPU, one direction" beside the example 450 GB/s, a DGX H100's NVLink 4
    datasheet rate, where budget reads the key as B_eff, the share of it collectives reach:
    written so, a DGX H100 topology priced Llama 3 70B's step 6.8 % short of the preset's.
    The example is the dgx-h100 preset's NVLink level, 450 GB/s x 0.822."""
    from budget.catalog.topologies import TOPOLOGIES
    from budget.units import format_rate

    level = schema()["properties"]["topology"]["properties"]["levels"]["items"]
    bandwidth = level["properties"]["bandwidth"]
    assert "B_eff" in bandwidth["description"]
    assert "not the datasheet's rate" in bandwidth["description"]
    nvlink = TOPOLOGIES["dgx-h100"].levels[0]
    assert nvlink.rate == 450e9
    assert bandwidth["examples"] == [format_rate(nvlink.rate * nvlink.fraction)] == ["370 GB/s"]


def _said(text: str) -> list[str]:
    """Every problem `budget validate` says of a plan's text, as printed."""
    from budget.errors import BudgetError
    from budget.plan.load import load_plan_data

    with pytest.raises(BudgetError) as refused:
        load_plan_data(text.encode(), "p.yaml")
    return [str(p) for p in refused.value.problems]


def test_a_count_written_under_a_spelling_near_pipeline_is_pointed_at_pp() -> None:
    """A user audit (m413): `pipline: 2` was told "did you mean 'pipeline'?", which then
    refused the 2 as no mapping; a count there is the pipeline's degree, parallel.pp."""
    plan = MINIMAL + "parallel: {pipline: 1}\n"
    assert errors(plan) == [
        "p.yaml:5:12: error: $.parallel.pipline: unknown key 'pipline' (did you mean 'pp'?)"
    ]
    assert errors(plan.replace("pipline: 1", "pipline: {schedule: 1f1b}")) == [
        "p.yaml:5:12: error: $.parallel.pipline: unknown key 'pipline' (did you mean 'pipeline'?)"
    ]
    (said,) = errors(plan.replace("pipline", "pipeline"))
    assert said == (
        "p.yaml:5:22: error: $.parallel.pipeline: 1 is not a mapping: the degree is "
        "parallel.pp; pipeline takes layers_per_stage, scatter_gather, schedule, virtual_stages"
    )


def test_a_merge_key_with_an_alias_is_one_mistake() -> None:
    """A user audit (m413): `<<: *base` was refused twice, as a merge key and as an alias,
    for one mistake with one remedy; an alias elsewhere is still said."""
    text = "base: &b {tp: 1}\n" + MINIMAL + "parallel:\n  <<: *b\n  dp: 1\n"
    said = [line for line in _said(text) if "'<<'" in line]
    assert said == [
        "p.yaml:7:3: error: $.parallel['<<']: YAML merge keys (<<) are not allowed in a plan; "
        "write the keys out"
    ]
    listed = _said(text.replace("  <<: *b\n", "  <<: [*b, *b]\n"))
    assert not [line for line in listed if "YAML aliases" in line]
    elsewhere = _said(text.replace("  <<: *b\n", "  tp: *b\n"))
    assert any("$.parallel.tp: YAML aliases (*b) are not allowed" in s for s in elsewhere)


@pytest.mark.parametrize(
    ("edit", "hint"),
    [
        (("memory: 80 GiB", "preset: H100-SXM"), "did you mean 'h100-sxm'?"),
        (("gpus: 1, levels", "preset: DGX-H100, nodes: 1, levels"), "did you mean 'dgx-h100'?"),
        (("layers: 2, hidden: 64, heads: 4, vocab: 100", "preset: Llama3-8B"), "'llama3-8b'"),
    ],
)
def test_a_preset_named_in_another_case_is_offered_its_name(
    edit: tuple[str, str], hint: str
) -> None:
    """A user audit (m413): 'H100-SXM' and 'DGX-H100' were listed the presets, none offered."""
    said = _said(MINIMAL.replace(*edit))
    assert any("preset" in s and hint in s for s in said), said


@pytest.mark.parametrize(
    ("written", "meant"),
    [("Shard(1)", "shard(1)"), ("Shard(dim=0)", "shard(0)"), ("Replicate()", "replicate")],
)
def test_a_placement_in_dtensors_spelling_is_offered_budgets(written: str, meant: str) -> None:
    """DTensor's reprs, which the schema's description cites (a user audit, m413)."""
    text = MINIMAL + (
        "transitions:\n  - {name: x, phase: loss, tensor: {shape: [seq], dtype: bf16},\n"
        f"     group: tp, from: '{written}', to: partial}}\n"
    )
    (said,) = errors(text)
    assert said.endswith(
        f"is not a placement: shard(i), replicate or partial (did you mean {meant!r}?)"
    )
    assert errors(text.replace(f"'{written}'", "'Sharded(1)'"))[0].endswith("or partial")


def test_levels_written_as_a_mapping_are_shown_a_list_entry() -> None:
    """A user audit (m413): a mapping of named levels was shown as a Python repr cut at 40
    characters and "is not a list", with no word of what an entry looks like."""
    text = MINIMAL.replace(
        "levels: [{name: nvlink, bandwidth: 450 GB/s, latency: 3 us}]",
        "levels: {nvlink: {size: 8, bandwidth: 450 GB/s, latency: 3 us}}",
    )
    assert errors(text) == [
        "p.yaml:4:21: error: $.topology.levels: a mapping is not a list: write each entry as "
        "an item of a list, such as - {name: nvlink, size: 8, bandwidth: 450 GB/s, "
        "latency: 3 us}"
    ]


def test_a_thousands_separator_in_a_flow_mapping_is_said_as_one() -> None:
    """`{global: 1,024}` is YAML for global: 1 and a key '024': the key is told why (a user
    audit, m413: it was listed the batch's keys, as if it were a misspelt one)."""
    (said,) = errors(MINIMAL.replace("global: 1}", "global: 1,024}"))
    assert said == (
        "p.yaml:2:38: error: $.batch['024']: unknown key '024': a comma in a flow mapping "
        "ends the value before it, so a number written with a thousands separator (1,024) "
        "reads as two; write 1024 or 1_024"
    )


def test_a_number_as_a_key_of_a_block_mapping_is_not_told_of_flow_commas() -> None:
    """A key '1' on a line of its own has no comma before it (an audit, m447: it was told of
    a flow mapping's comma in a file without one); written as text with a comma, the number
    is told how to write it."""
    (said,) = errors(MINIMAL + "1: 1\n")
    assert said.startswith("p.yaml:5:1: error: $['1']: unknown key '1' (expected one of: ")
    block = MINIMAL.replace("batch: {seq: 16, micro: 1, global: 1}", "batch:\n  seq: 1,024")
    assert errors(block)[-1] == (
        "p.yaml:3:8: error: $.batch.seq: '1,024' is not an integer; write it without "
        "commas, 1024 or 1_024"
    )


@pytest.mark.parametrize("word", ["yes", "on", "true"])
def test_yes_for_a_number_says_yaml_read_it_as_true(word: str) -> None:
    """`micro: yes` is YAML 1.1's true (an audit, m447: "true is not an integer", a word the
    author never wrote)."""
    (said,) = errors(MINIMAL.replace("micro: 1", f"micro: {word}"))
    assert said == (
        "p.yaml:2:25: error: $.batch.micro: true is not an integer; YAML reads an unquoted "
        "yes, no, on or off as true or false: write a number"
    )


def test_a_key_told_where_it_goes_leaves_this_sections_missing_key_said() -> None:
    """`grads` under model is told it goes under precision, "or did you mean 'heads'
    here?": no sign heads was written, so a model without heads still hears so in the
    same run (review m417: the missing key went unsaid until the next run)."""
    found = errors(MINIMAL.replace("heads: 4", "grads: fp32"))
    assert found == [
        f"p.yaml:1:1: error: $.model: 'heads' is a required property: {MODEL_HINT}",
        "p.yaml:1:32: error: $.model.grads: unknown key 'grads'; grads goes under precision, "
        "or did you mean 'heads' here?",
    ]


def test_a_phase_prefix_in_another_case_is_offered_its_name() -> None:
    """'DP' is dp (every dp.* phase) in another case (review m417), as 'Loss' is loss."""
    from budget.plan.transitions import unknown_phase

    assert unknown_phase("train", "DP").startswith("unknown phase 'DP' (did you mean 'dp'?)")
    assert unknown_phase("train", "Loss").startswith("unknown phase 'Loss' (did you mean 'loss'")
