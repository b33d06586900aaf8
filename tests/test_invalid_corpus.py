"""A corpus of invalid plans: each `tests/invalid/NAME.yaml` with its exact stderr in
`NAME.expected`; `budget validate` must exit 2, print nothing on stdout, and never a traceback.

Hostile inputs that would be unpleasant to keep in the repository (an alias bomb, 10,000
levels of nesting, 100 MB, bytes that are not UTF-8) are written to a temporary directory.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from budget.cli import app, route
from budget.errors import MAX_SHOWN
from budget.plan.load import MAX_BYTES
from budget.plan.yaml_load import MAX_DEPTH
from tests.guards import refused_in_time
from tests.plan_files import gpt13_written

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = sorted((HERE / "invalid").glob("*.yaml"))
PLANS = sorted((ROOT / "plans").glob("*.yaml"))


def validate(*files: str) -> Result:
    return CliRunner().invoke(app, route(["validate", *files]))


def test_the_corpus_is_complete() -> None:
    assert len(CORPUS) >= 25
    for plan in CORPUS:
        assert plan.with_suffix(".expected").is_file(), plan.name


@pytest.mark.parametrize("plan", CORPUS, ids=[p.stem for p in CORPUS])
def test_invalid_plan(plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(plan.parent)
    result = validate(plan.name)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr == plan.with_suffix(".expected").read_text(encoding="utf-8")


def test_several_files_report_together_in_the_order_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each file's problems sorted by position, the files in the order given, as `check`
    keeps them (they were sorted by file name, which `check` does not do: a CI audit)."""
    monkeypatch.chdir(HERE / "invalid")
    names = ["schema-wrong-type.yaml", "alias.yaml"]
    result = validate(*names)
    assert result.exit_code == 2
    expected = "".join(
        (HERE / "invalid" / name).with_suffix(".expected").read_text(encoding="utf-8")
        for name in names
    )
    assert result.stderr == expected


def test_valid_plans_beside_an_invalid_one_are_still_named_ok(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Validating a folder of plans with one bad file says which of the others passed (it
    printed nothing but the bad file's problems); the exit code still says one failed."""
    monkeypatch.chdir(ROOT)
    bad = HERE / "invalid" / "alias.yaml"
    result = validate("plans/gpt-1.3b.yaml", str(bad), "plans/gpt3-175b.yaml")
    assert result.exit_code == 2
    assert result.stdout == "plans/gpt-1.3b.yaml: ok\nplans/gpt3-175b.yaml: ok\n"
    assert "alias.yaml" in result.stderr and "gpt" not in result.stderr


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_shipped_plans_validate(plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    name = str(plan.relative_to(ROOT))
    result = validate(name)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{name}: ok\n"
    assert result.stderr == ""


def test_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = validate(str(missing))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"{missing}:1:1: error: $: cannot read the plan: No such file or directory\n"
    )


# -- hostile input, generated ----------------------------------------------------------


def _refused(path: Path) -> Result:
    """`budget validate` of `path`, within the blow-up guard (`tests.guards`)."""
    with refused_in_time():
        return validate(str(path))


def test_billion_laughs_fails_fast(tmp_path: Path) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        name, previous = chr(ord("a") + i), chr(ord("a") + i - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    path = tmp_path / "lol.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _refused(path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert (
        f"{path}:2:8: error: $.b[0]: YAML aliases (*a) are not allowed in a plan; "
        "write the value out\n"
    ) in result.stderr
    assert result.stderr.count("YAML aliases") == 20 and "(61 more in the file)" in result.stderr
    missing = "'model', 'batch', 'device' and 'topology' are required properties"
    assert f"{path}:1:1: error: $: {missing}\n" in result.stderr


def test_ten_thousand_deep_nesting_fails_fast(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("model: " + "[" * 10_000 + "]" * 10_000 + "\n", encoding="utf-8")
    result = _refused(path)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{path}:1:")
    assert lines[0].endswith(f": error: $.model: nesting deeper than {MAX_DEPTH} levels")


def test_a_100_mb_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as handle:  # sparse: the size is there, the blocks are not
        handle.truncate(100 * 10**6)
    result = _refused(path)
    assert result.exit_code == 2
    assert result.stderr == (
        f"{path}:1:1: error: $: the file is 100,000,000 bytes; a plan is at most "
        f"{MAX_BYTES:,} bytes (1 MiB), so it was not read\n"
    )


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_an_endless_device_is_refused() -> None:
    result = _refused(Path("/dev/zero"))
    assert result.exit_code == 2
    assert result.stdout == ""
    # its size is not known, only that it holds more (it read "the file is 8,388,609
    # bytes", the cap and one: an audit)
    assert result.stderr == (
        f"/dev/zero:1:1: error: $: the file holds more than {MAX_BYTES:,} bytes (1 MiB), the "
        "most a plan may be, so it was not read\n"
    )


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: x\nmodel:\n  norm: caf\xe9\n")
    result = validate(str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"{path}:3:12: error: $: the file is not UTF-8: byte 0xe9 at offset 26 cannot be decoded\n"
    )


def test_a_directory(tmp_path: Path) -> None:
    result = validate(str(tmp_path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"{tmp_path}:1:1: error: $: cannot read the plan: ")
    assert result.stderr == f"{tmp_path}:1:1: error: $: cannot read the plan: Is a directory\n"


# -- no input makes the CLI print a traceback --------------------------------------------

_GOOD = gpt13_written()  # every device and topology key a slot to corrupt
_line_edits = st.lists(
    st.tuples(st.integers(0, 60), st.text(max_size=30)),
    max_size=4,
)


def _mutate(edits: list[tuple[int, str]]) -> str:
    lines = _GOOD.splitlines()
    for index, text in edits:
        i = index % len(lines)
        key, _, _ = lines[i].partition(":")
        lines[i] = f"{key}: {text}" if text else key
    return "\n".join(lines) + "\n"


def _check_no_traceback(tmp_path: Path, text: str | bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(text)
    result = validate(str(path))
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert result.stdout == ""
        _check_problem_lines(path, result.stderr)


def _check_problem_lines(path: Path, stderr: str) -> None:
    """Every line of `stderr` is `file:line:col: error: $.path: message`, line and column
    from 1, the count of the problems past `MAX_SHOWN` too."""
    lines = stderr.splitlines()
    assert lines, "exit code 2 with nothing on stderr"
    if len(lines) == MAX_SHOWN + 1:
        counted = rf"[0-9,]+ more problems? from here on, not shown \(the first {MAX_SHOWN} above\)"
        assert re.search(rf": …and {counted}$", lines[-1]), lines[-1]
    shape = re.compile(rf"^{re.escape(str(path))}:([0-9]+):([0-9]+): error: \$")
    for line in lines:
        assert line.startswith(f"{path}:"), line
        assert ": error: $" in line, line
        match = shape.match(line)
        assert match is not None, line
        assert int(match[1]) >= 1 and int(match[2]) >= 1, line


_settings = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(st.text(max_size=300))
def test_arbitrary_text_never_shows_a_traceback(tmp_path: Path, text: str) -> None:
    _check_no_traceback(tmp_path, text)


@_settings
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_show_a_traceback(tmp_path: Path, data: bytes) -> None:
    _check_no_traceback(tmp_path, data)


@_settings
@given(_line_edits)
def test_edited_plans_never_show_a_traceback(tmp_path: Path, edits: list[tuple[int, str]]) -> None:
    """Arbitrary values in a real plan's slots: reach the schema and the semantic checks."""
    _check_no_traceback(tmp_path, _mutate(edits))


_yaml_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(["80 GiB", "450 GB/s", "3 us", "shard(1)", "micro * seq / cp", "tp"]),
    ),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["model", "batch", "parallel", "layers", "tp", "size", "levels", "shape", "x"]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@_settings
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "mode",
                "model",
                "batch",
                "parallel",
                "device",
                "topology",
                "transitions",
                "precision",
            ]
        ),
        _yaml_values,
        max_size=9,
    )
)
def test_arbitrary_yaml_trees_never_show_a_traceback(
    tmp_path: Path, tree: dict[str, object]
) -> None:
    import yaml

    _check_no_traceback(tmp_path, yaml.safe_dump(tree, allow_unicode=True))


# YAML 1.1's standard scalar tags over any text: `!!bool maybe` was a KeyError and
# `!!int ""` an IndexError, each a traceback (audit)
_tagged = st.tuples(
    st.sampled_from(["int", "float", "bool", "null"]), st.text(max_size=30), st.booleans()
)


@_settings
@given(_tagged)
def test_any_text_under_a_scalar_tag_never_shows_a_traceback(
    tmp_path: Path, tagged: tuple[str, str, bool]
) -> None:
    tag, text, quoted = tagged
    written = json.dumps(text) if quoted else text
    assert _GOOD.count("layers: 24") == 1
    _check_no_traceback(tmp_path, _GOOD.replace("layers: 24", f"layers: !!{tag} {written}"))


# -- the `budget PLAN.yaml` fast path (budget/entry.py), which skips the typer app --------

_HOSTILE_VALUES = [
    "!!bool maybe",
    '!!int ""',
    '!!float ""',
    "9" * 5000,
    ":".join(["59"] * 2000),
    '"3' + " " * 2000 + 'x"',
    '"1e30 B"',
    '"9223372036854775808 B"',
    "0x10",
    "[1]",
    "&a 1",
    "*a",
    "!!python/object/apply:os.system [ls]",
    "{",
]


def _generated_plans() -> list[str]:
    """A real plan with two of its values replaced by hostile ones, each hostile value once,
    in slots picked at random (seeded: the same files on every run)."""
    pick = random.Random(2024)
    lines = _GOOD.splitlines()
    slots = [i for i, line in enumerate(lines) if re.match(r"^ *[a-z_]+: \S", line)]
    pairs = zip(_HOSTILE_VALUES[::2], _HOSTILE_VALUES[1::2], strict=True)
    return [_mutate(list(zip(pick.sample(slots, 2), pair, strict=True))) for pair in pairs]


def test_the_fast_path_answers_generated_bad_plans_by_the_contract(tmp_path: Path) -> None:
    """`budget PLAN.yaml` is answered in budget/entry.py without the typer app: a few
    generated bad plans through it, as a user runs it (exit 2, nothing on stdout, every
    line `file:line:col: error: $...`, no traceback), the same lines as `budget validate`."""
    for index, text in enumerate(_generated_plans()):
        path = tmp_path / f"plan{index}.yaml"
        path.write_text(text, encoding="utf-8")
        process = subprocess.run(
            [sys.executable, "-m", "budget", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert process.returncode == 2, (text, process.stdout, process.stderr)
        assert "Traceback" not in process.stderr, process.stderr
        assert process.stdout == ""
        _check_problem_lines(path, process.stderr)
        assert process.stderr == validate(str(path)).stderr


def test_a_huge_integer_beside_another_fault_reports_both(tmp_path: Path) -> None:
    """A number too long to read ended the reading, so `tp: q` two dozen lines below came
    one run later (audit): both at once, each at its line:col."""
    path = tmp_path / "both.yaml"
    text = _GOOD.replace("layers: 24", "layers: " + "9" * 5000).replace("tp: 1", "tp: q")
    path.write_text(text, encoding="utf-8")
    result = validate(str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"{path}:17:11: error: $.model.layers: an integer of 5,000 digits; plan numbers are "
        "below 2^63\n"
        f"{path}:40:7: error: $.parallel.tp: 'q' is not an integer\n"
    )
