"""Problems as users read them: clipped quotes, and a count past the first 200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from budget.errors import BudgetError, Problem, problem_lines
from budget.plan.load import load_plan
from tests.plan_files import ROOT

runner = CliRunner()


def _unknown_keys(path: Path, prefix: str, count: int) -> Path:
    path.write_text("".join(f"{prefix}{i}: 1\n" for i in range(count)), encoding="utf-8")
    return path


def test_a_problem_quotes_a_hostile_value_clipped() -> None:
    """A 5,000,000-digit number or a 900 KB model_type was echoed whole on stderr."""
    from budget.errors import MAX_MESSAGE, Problem

    message = "model_type = " + "x" * 900_000
    problem = Problem("p.yaml", 3, 5, "$.model.hf_config", message)
    line = str(problem)
    assert line.startswith("p.yaml:3:5: error: $.model.hf_config: model_type = xxx")
    # the first MAX_MESSAGE − 40 characters are shown (room for the count), and the count
    # is the rest: 900,013 − 760 = 899,253
    shown = MAX_MESSAGE - 40
    more = len(message) - shown
    assert more == 899_253
    assert (
        line
        == f"p.yaml:3:5: error: $.model.hf_config: {message[:shown]}... ({more:,} characters more)"
    )
    assert len(line) < MAX_MESSAGE + 60
    assert str(Problem("p.yaml", 1, 1, "$", "short")) == "p.yaml:1:1: error: $: short"


def test_a_quoted_line_break_stays_on_its_problem_s_line(tmp_path: Path) -> None:
    """``model: "\\x1E"`` (a record separator, a line boundary to str.splitlines) was quoted
    raw in the preset hint, so stderr had a line that did not begin with the file (found by
    the fuzz test in test_invalid_corpus). Every line break a reader may split on is shown
    escaped, and the hint is offered only for a printable name."""
    from budget.errors import Problem

    breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    line = str(Problem("p.yaml", 1, 1, "$.a" + breaks, "x" + breaks))
    assert line.splitlines() == [line]
    assert line.endswith(r"x\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    named = str(Problem("a\nb.yaml", 2, 3, "$", "m"))  # a file name too (review)
    assert named == r"a\nb.yaml:2:3: error: $: m"
    plan = tmp_path / "plan.yaml"
    plan.write_text('model: "\\x1E"\n', encoding="utf-8")
    result = runner.invoke(app, ["validate", str(plan)])
    assert result.exit_code == 2
    assert all(line.startswith(f"{plan}:") for line in result.stderr.splitlines())
    assert f"{plan}:1:8: error: $.model: '\\x1e' is not a mapping\n" in result.stderr


def test_hundreds_of_problems_print_the_first_two_hundred_and_a_count(tmp_path: Path) -> None:
    """Every problem is found; stderr shows the first 200 by position and counts the rest
    (30,000 faulty transitions printed 210,000 lines)."""
    plan = _unknown_keys(tmp_path / "plan.yaml", "k", 500)
    result = runner.invoke(app, ["validate", str(plan)])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 201
    assert lines[0].startswith(f"{plan}:1:1: error: $: ")
    with pytest.raises(BudgetError) as caught:
        load_plan(plan)
    found = caught.value.problems  # 500 unknown keys and the required ones missing
    assert len(found) > 500 and lines[:-1] == [str(p) for p in found[:200]]
    # the count is a line of the same shape, at the first problem it counts
    first = found[200]
    assert lines[-1] == (
        f"{plan}:{first.line}:{first.col}: error: {first.path}: …and {len(found) - 200} more "
        "problems from here on, not shown (the first 200 above)"
    )
    one = [Problem("p.yaml", i + 1, 1, "$", "x") for i in range(201)]
    assert problem_lines(one)[-1] == (
        "p.yaml:201:1: error: $: …and 1 more problem from here on, not shown (the first 200 above)"
    )


def test_a_shard_of_thousands_of_digits_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    """``from: shard(<4,301 digits>)`` met Python's limit on converting digits to an int: a
    traceback and exit 1 from every plan command, which `check` reads as "does not fit"
    (an audit). The schema bounds a dimension to 9 digits; the value is quoted clipped."""
    plan = ROOT / "plans" / "llama3-8b-tp-loss-gathered.yaml"
    text = plan.read_text(encoding="utf-8").replace("from: shard(1)", f"from: shard({'1' * 4301})")
    path = tmp_path / "huge.yaml"
    path.write_text(text, encoding="utf-8")
    for command in (["validate"], ["check"], []):
        result = runner.invoke(app, route([*command, str(path)]))
        assert result.exit_code == 2, (command, result.output)
        assert "is not a placement: shard(i), replicate or partial" in result.stderr
        assert len(result.stderr) < 400 and "Traceback" not in result.output


def test_an_unreadable_plan_is_said_beside_the_others_problems(tmp_path: Path) -> None:
    """typer refused a plan it could not read in click's words before budget read any, so
    the other plans' problems went unsaid (an audit); budget's reader says it, file:1:1."""
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    locked = tmp_path / "locked.yaml"
    locked.write_text("name: x\n", encoding="utf-8")
    locked.chmod(0)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\n", encoding="utf-8")
    result = runner.invoke(app, ["validate", str(broken), str(locked)])
    assert result.exit_code == 2
    assert f"{locked}:1:1: error: $: cannot read the plan: Permission denied" in result.stderr
    assert f"{broken}:1:1: error: $: 'batch' is a required property" in result.stderr


def test_plan_arguments_leave_reading_to_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """No command asks the system whether a plan is readable before budget reads it (the
    test above needs a user who is not root; this one holds for any): with every such
    question answered no, each plan command still reads its plans itself."""
    import os

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: mode != os.R_OK and real(p, mode))
    plan = str(ROOT / "plans" / "gpt-1.3b.yaml")
    for args in (["validate", plan], ["check", plan], ["diff", plan, plan], [plan]):
        result = runner.invoke(app, route(args))
        assert result.exit_code == 0, (args, result.output)


def test_close_matches_are_not_sought_for_a_word_too_long_to_be_close() -> None:
    """A 6 MiB string in an enum field spent 2-4 s in difflib (an audit): a word more than
    (2 / 0.6 − 1) times the longest choice cannot reach the cutoff, so none is sought; below
    that the matches are difflib's own."""
    import difflib
    import random

    from budget.errors import close_matches

    choices = ["none", "selective", "full", "1f1b", "interleaved", "bf16", "fp8"]
    rng = random.Random(7)
    for _ in range(3000):
        word = "".join(rng.choice("abefilnoprstuv0168") for _ in range(rng.randint(0, 30)))
        assert close_matches(word, choices, 3) == difflib.get_close_matches(word, choices, 3)
    assert close_matches("selective" * 3, choices, 1) == []


def test_a_folder_or_file_that_cannot_be_written_is_refused_before_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plot -o` into no folder drew for 3 s before refusing, and `validate-model
    --write-plans` at a file priced every run first (an audit): both refuse before the
    work (here made to fail if it runs), with nothing written."""
    import budget.accuracy
    import budget.pipeline

    def no_work(*_: object) -> None:
        raise AssertionError("the work ran before the refusal")

    monkeypatch.setattr(budget.accuracy, "validate_model", no_work)
    monkeypatch.setattr(budget.pipeline, "budget_plan", no_work)
    a_file = tmp_path / "a-file"
    a_file.write_text("", encoding="utf-8")
    result = runner.invoke(app, ["validate-model", "--write-plans", str(a_file)])
    assert result.exit_code == 2 and "is a file; name a folder" in result.stderr
    assert result.stdout == ""
    result = runner.invoke(
        app, ["plot", str(ROOT / "plans" / "gpt-1.3b.yaml"), "-o", str(tmp_path / "no" / "x.png")]
    )
    assert result.exit_code == 2 and "there is no folder" in result.stderr
    assert not (tmp_path / "no").exists()
    # --write-plans makes its folder, but not the folders above it, as `plot -o` does not
    # (an audit: a mistyped /nonexistent/d made /nonexistent)
    deep = tmp_path / "no" / "plans"
    result = runner.invoke(app, ["validate-model", "--write-plans", str(deep)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"budget: error: --write-plans {deep}: there is no folder {tmp_path / 'no'}\n"
    )
    assert not (tmp_path / "no").exists()


def test_each_files_problems_are_capped_and_counted_on_their_own(tmp_path: Path) -> None:
    """Two plans of 205 and 230 unknown keys, validated together: each file shows its own
    first 200 and counts its own rest at its own first left out, on stderr as in the JSON
    (an audit: capped together, the second file's 230 were counted under the first's name,
    none of its lines shown, while the JSON capped each)."""
    one = _unknown_keys(tmp_path / "one.yaml", "a", 205)
    two = _unknown_keys(tmp_path / "two.yaml", "b", 230)
    result = runner.invoke(app, ["validate", str(one), str(two)])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2
    counts = [line for line in lines if ": …and " in line]
    found = {}
    for path in (one, two):
        with pytest.raises(BudgetError) as caught:
            load_plan(path)
        found[path] = caught.value.problems  # the unknown keys and the required ones missing
    assert len(counts) == 2 and len(lines) == 2 * 201
    for path, count in zip((one, two), counts, strict=True):
        first = found[path][200]
        assert count == (
            f"{path}:{first.line}:{first.col}: error: {first.path}: …and "
            f"{len(found[path]) - 200} more problems from here on, not shown (the first 200 above)"
        )
    result = runner.invoke(app, ["validate", str(one), str(two), "--format", "json"])
    plans = json.loads(result.stdout)["plans"]
    assert [line for plan in plans for line in plan["problems"]] == lines


def test_a_count_left_out_counts_what_it_counted(tmp_path: Path) -> None:
    """A config.json of 300 NaNs under a plan with a problem above its hf_config key: the
    plan's problem and 198 of the config's are shown, the config's own count line (102
    more) is the first left out, and the line that counts the rest says 103 (its 102 and
    the batch's problem below it), not 2 (an audit)."""
    config = json.loads((ROOT / "tests" / "data" / "hf" / "llama3-70b" / "config.json").read_text())
    text = json.dumps(config)[:-1] + ', "x": [' + ", ".join(["NaN"] * 300) + "]}"
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "parallel: {tp: 8, dp: 7}\nmodel: {hf_config: config.json}\n"
        "batch: {seq: 2048, micro: 1, global: 9}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n",
        encoding="utf-8",
    )
    with pytest.raises(BudgetError) as caught:
        load_plan(plan)
    found = caught.value.problems
    lines = problem_lines(found)
    assert len(lines) == 201 and found[200].message.startswith("…and ")
    # the config's 300 NaNs and one naming the unread key, 199 of them shown: 102 counted
    assert found[200].counted == 300 + 1 - 199 and len(found) == 202
    counted = ": …and 103 more problems from here on, not shown (the first 200 above)"
    assert lines[-1].endswith(counted)


def test_a_plan_named_twice_is_one_file(tmp_path: Path) -> None:
    """`validate a b a` and `check a a`: a's problems once on stderr, counted once (an
    audit: they were counted twice, "…and 308 more" for 254 problems, or printed twice),
    and each plan's JSON problems are its file's lines."""
    one = _unknown_keys(tmp_path / "one.yaml", "a", 250)
    two = _unknown_keys(tmp_path / "two.yaml", "b", 210)
    with pytest.raises(BudgetError) as caught:
        load_plan(one)
    rest = len(caught.value.problems) - 200
    for args in (["validate", one, two, one], ["check", one, one], ["validate", one, one]):
        result = runner.invoke(app, [str(a) for a in args])
        lines = result.stderr.splitlines()
        mine = [line for line in lines if line.startswith(f"{one}:")]
        assert result.exit_code == 2 and len(mine) == 201 == len(set(mine)), args
        assert mine[-1].endswith(
            f"…and {rest} more problems from here on, not shown (the first 200 above)"
        )
        assert len(lines) == 201 * len({str(a) for a in args[1:]}), args
    result = runner.invoke(app, ["validate", str(one), str(two), str(one), "--format", "json"])
    plans = json.loads(result.stdout)["plans"]
    assert [p["problems"] for p in plans if p["file"] == str(one)] == [mine, mine]


def test_a_device_key_that_does_not_parse_holds_back_no_rule_of_another(tmp_path: Path) -> None:
    """An audit: a memory too large to hold held back the zero bandwidth's problem until a
    second run; each device rule that reads only keys that parsed runs in the same one."""
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    (line,) = [x for x in text.splitlines() if x.startswith("device:")]
    device = "device: {memory: 1e18 GiB, memory_bandwidth: 1e-300 B/s, flops: {bf16: 312 TFLOP/s}}"
    path = tmp_path / "device.yaml"
    path.write_text(text.replace(line, device), encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    paths = [p.path for p in raised.value.problems]
    assert paths == ["$.device.memory", "$.device.memory_bandwidth"]


def test_a_count_of_problems_past_the_first_two_hundred_says_where_reading_stopped(
    tmp_path: Path,
) -> None:
    """Where the reading of a file stops (a cap on values, a syntax error) among the problems
    not shown, the count says reading stopped and the problem that stopped it is shown after
    it (an audit: 500,000 duplicate keys were counted as "9,798 more problems from here on",
    and the cap that ended the count went unsaid)."""
    plan = tmp_path / "dup.yaml"
    plan.write_text("name: x\nmodel: {" + ", ".join(["a: 1"] * 15_000) + "}\n", encoding="utf-8")
    result = runner.invoke(app, ["validate", str(plan)])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and result.stdout == "" and len(lines) == 202
    # no `mode` read before the cap, so no rule runs on what was read (`_Builder.read`)
    assert all(": error: $.model.a: duplicate key 'a'" in line for line in lines[:200])
    # 20,000 values read: name and its value, model, then 9,998 keys and values and a key
    assert lines[200].endswith(
        "…and 9,797 more problems before reading stopped (below), not shown (the first 200 above)"
    )
    assert lines[201].endswith(": error: $.model: more than 20,000 values; a plan is small")
    broken = tmp_path / "broken.yaml"
    keys = "".join(f"  a: {i}\n" for i in range(300))
    broken.write_text(f"name: x\nmodel:\n{keys}batch: [1, 2\n", encoding="utf-8")
    lines = runner.invoke(app, ["validate", str(broken)]).stderr.splitlines()
    assert len(lines) == 202 and ": invalid YAML: " in lines[201]
    assert "…and 99 more problems before reading stopped (below)" in lines[200]
    # where the file was read whole, the count is as it was
    one = [Problem("p.yaml", i + 1, 1, "$", "x") for i in range(203)]
    assert problem_lines(one)[-1].endswith(
        "…and 3 more problems from here on, not shown (the first 200 above)"
    )


@pytest.mark.parametrize("where", ["after the plan", "in its parallel section", "past libyaml's"])
def test_a_cap_that_stops_the_reading_keeps_the_problems_read_before_it(
    tmp_path: Path, where: str
) -> None:
    """A cap on the reading (a key of over 128 characters, nesting past 64 levels) ends it,
    but the problems of what was read before it are said with it (an audit: a 129-character
    key on line 48 hid a `layers: 0` on line 17 and a `tp: x` on line 40). The sections it
    left unfinished or unread are held back, not told what they lack: the stop inside
    `parallel` draws no "required" complaint from it, nor any from the device and topology
    after it, and no rule reads them."""
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    if where == "after the plan":  # every section was read whole: its rules run
        text = text.replace("  hidden: 2048\n", "  hidden: 2050\n") + "k" * 129 + ": 1\n"
        first = "19:$.model.heads: model.hidden = 2050 is not divisible by model.heads = 16"
        stop = "47:$['kkkkkkkkkkkkkkkkkkkkkkkkkkk...']: a key of 129 characters; a plan's"
    else:  # the builder's own depth limit, or past 1,000 brackets libyaml's (a review)
        deep = 70 if where == "in its parallel section" else 1_100
        text = text.replace("  layers: 24\n", "  layers: 0\n")
        text = text.replace("parallel:\n", "parallel:\n  zz: " + "[" * deep + "\n")
        first = "17:$.model.layers: 0 is less than the minimum of 1"
        stop = "40:$.parallel.zz" + ("[0][0]" if deep == 70 else ": nesting deeper")
    plan = tmp_path / "p.yaml"
    plan.write_text(text, encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    said = [f"{p.line}:{p.path}: {p.message}" for p in raised.value.problems]
    assert said[0].startswith(first) and said[-1].startswith(stop), said
    if where == "after the plan":
        assert len(said) == 2
    else:  # the unknown key was read whole; what the parallel section lacks is not said
        assert said[1].startswith("40:$.parallel.zz: unknown key 'zz'") and len(said) == 3


def test_a_cap_before_the_mode_is_read_holds_back_every_rule(tmp_path: Path) -> None:
    """A review: with `mode: decode` written last, after a key of over 128 characters, the
    batch read before the stop was checked as a training plan's (its seq, micro and global
    missing, its sequences, prompt and generate said not to apply): six false problems.
    Every section's rules read the mode, so none runs where the stop came before it."""
    text = (ROOT / "plans" / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    text = text.replace("mode: decode\n", "") + "x" * 200 + ": 1\nmode: decode\n"
    plan = tmp_path / "late.yaml"
    plan.write_text(text, encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    (only,) = raised.value.problems
    assert only.message == "a key of 200 characters; a plan's keys are names"
    # without the long key the same file is a valid decode plan
    plan.write_text(text.replace("x" * 200 + ": 1\n", ""), encoding="utf-8")
    assert load_plan(plan).mode == "decode"


@pytest.mark.parametrize(
    ("lines", "where", "path"),
    [
        (("model:", "  {key}: 24"), (2, 3), "$.model"),
        (("topology:", "  levels:", "    - {{name: a}}", "    - {key}: 3"), (4, 7), ""),
        (("{key}: 1",), (1, 1), "$"),
        # quoted, anchored, and a list item's key past spaces (a review, m537: counted with
        # their quotes, anchor and spaces, and named so)
        (("model:", '  "{key}": 1'), (2, 3), "$.model"),
        (("model:", "  &a {key}: 1"), (2, 3), "$.model"),
        (("topology:", "  levels:", "    - {{name: a}}", "    -   {key}: 3"), (4, 9), ""),
    ],
)
@pytest.mark.parametrize("size", [500, 2_000])
def test_a_key_past_the_yaml_scanner_s_limit_is_said_as_a_long_key(
    tmp_path: Path, lines: tuple[str, ...], where: tuple[int, int], path: str, size: int
) -> None:
    """A key of over 1,024 characters, PyYAML's limit on a simple key, failed its scanner
    ("invalid YAML: mapping values are not allowed in this context" at "$", an audit,
    m526), where one of 129 to 1,024 characters is said as a long key: now both are, at the
    key's start and under its parent's path."""
    key = "k" * size
    plan = tmp_path / "long.yaml"
    plan.write_text("name: x\n" + "\n".join(lines).format(key=key) + "\n", encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    (only,) = raised.value.problems
    assert (only.line, only.col) == (where[0] + 1, where[1])
    parent = path or "$.topology.levels[1]"
    assert only.path == f"{parent}['{'k' * 27}...']"
    assert only.message == f"a key of {size:,} characters; a plan's keys are names"


@pytest.mark.parametrize(
    "written",
    ['"{key}"', "&a {key}", "!!str {key}", "{key}     "],
    ids=["quoted", "anchored", "tagged", "spaced"],
)
def test_the_scanner_s_key_limit_counts_from_the_token_to_its_colon(
    tmp_path: Path, written: str
) -> None:
    """PyYAML's 1,024 characters run from the key token's start (a quote, an anchor, a tag)
    to its colon: a quoted key of 1,023 characters, 1,025 with its quotes, failed the
    scanner and was said in its words at "$" (a review, m542); it is a long key, named
    without its quotes, anchor or tag."""
    key = "k" * 1_023
    plan = tmp_path / "long.yaml"
    plan.write_text(f"name: x\nmodel:\n  {written.format(key=key)}: 1\n", encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    messages = [p.message for p in raised.value.problems]
    assert "a key of 1,023 characters; a plan's keys are names" in messages


def test_a_scanner_error_on_a_line_under_the_key_limit_is_not_called_a_long_key(
    tmp_path: Path,
) -> None:
    """PyYAML scans a block key of up to 1,024 characters: where its scanner fails on a
    shorter line, the line is no long key (a review, m537: a plain scalar's continuation
    line of 199 characters, holding ": ", was said to be "a key of 199 characters")."""
    words = " ".join(["word"] * 40)
    plan = tmp_path / "wrapped.yaml"
    plan.write_text(f"name: t\ndescription: hello\n  {words}: 1\n", encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    (only,) = raised.value.problems
    assert "characters; a plan's keys are names" not in only.message
    assert only.message.startswith("invalid YAML: mapping values are not allowed")


@pytest.mark.parametrize("cap", ["{" + "k" * 129 + ": 1}", "[" * 70, "[" * 1_100])
def test_a_cap_inside_a_batch_key_of_the_other_mode_is_said(tmp_path: Path, cap: str) -> None:
    """A review: a cap that stopped the reading inside a decode plan's `micro`, a key said
    not to apply, was dropped with that key's problems, and the half-read plan went on to
    be resolved: a traceback and exit 1 from every command. Both problems are said."""
    text = (ROOT / "plans" / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    text = text.replace("batch:\n", f"batch:\n  micro: {cap}\n", 1)
    plan = tmp_path / "p.yaml"
    plan.write_text(text, encoding="utf-8")
    with pytest.raises(BudgetError) as raised:
        load_plan(plan)
    moot, stop = raised.value.problems
    assert moot.path == "$.batch.micro" and "does not apply to a decode plan" in moot.message
    assert stop.ends and stop.path.startswith("$.batch.micro")
    result = runner.invoke(app, ["validate", str(plan)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert len(result.stderr.splitlines()) == 2


def test_a_moe_plan_with_a_degree_far_past_its_gpus_is_refused_at_once(tmp_path: Path) -> None:
    """An audit: a MoE plan's dp of 2^30 (the schema's maximum) offered a topology of that
    many GPUs only after laying out its expert groups rank by rank, 10 GB resident and a
    NumPy traceback; a product past what a plan lays out (2^24 GPUs) is not offered, and
    the plan is refused as a dense one is, exit 2, nothing on stdout."""
    text = (ROOT / "plans" / "deepseek-moe-16b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "big.yaml"
    path.write_text(text.replace("  dp: 16\n", "  dp: 1073741824\n"), encoding="utf-8")
    assert "dp: 1073741824" in path.read_text(encoding="utf-8")
    result = runner.invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    assert "= 1,073,741,824 but the topology has 16 GPUs; change dp to 16" in result.stderr
    assert "topology.nodes to" not in result.stderr


def test_a_moe_plan_whose_order_misses_pp_is_told_so(tmp_path: Path) -> None:
    """An audit: Megatron-Core's expert-grid rules read pp's place in the order before the
    order was checked, a traceback (tuple.index) where a dense plan is told the order lacks
    pp."""
    text = (ROOT / "plans" / "mixtral-8x7b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "m7b.yaml"
    path.write_text(text.replace("[tp, cp, ep, dp, pp]", "[tp, cp, ep, dp]"), encoding="utf-8")
    line = text[: text.index("order: [tp, cp, ep, dp, pp]")].count("\n") + 1
    result = runner.invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(
        f"{path}:{line}:3: error: $.parallel.order: parallel.order must name each of tp, cp, "
        "ep, dp, pp exactly once (pp missing)"
    )


def test_a_number_of_more_digits_than_a_float_keeps_is_quoted_as_written(tmp_path: Path) -> None:
    """`tp: 8.000000000000001` was told "8.000000000000002 is not an integer": the float it
    reads as, not what the plan says. A number whose float prints otherwise is quoted as
    written (`Marks.written`), as is one written in another form (1e3, 1_000.5: an audit,
    m495, read them quoted as 1000.0 and 1000.5); one that prints as written (0.1) is not
    marked."""
    from budget.plan.yaml_load import load_yaml

    plan = ROOT / "plans" / "llama3-8b-fsdp.yaml"
    text = plan.read_text(encoding="utf-8").replace("  dp: 8\n", "  dp: 8.000000000000001\n")
    text = text.replace("dp_grads: true", "slowdown: 1.0000000000000003, dp_grads: true")
    path = tmp_path / "digits.yaml"
    path.write_text(text, encoding="utf-8")
    result = runner.invoke(app, route([str(path)]))
    assert result.exit_code == 2 and result.stdout == ""
    assert "$.parallel.dp: 8.000000000000001 is not an integer" in result.stderr
    assert "$.overlap.slowdown: 1.0000000000000003 is greater than or equal to" in result.stderr
    assert "8.000000000000002" not in result.stderr and "1.0000000000000002" not in result.stderr
    loaded = load_yaml("a: 8.000000000000001\nb: 0.1\nc: 1e3\nd: 1_000.5\n", "p.yaml")
    assert loaded.marks.written == {"$.a": "8.000000000000001", "$.c": "1e3", "$.d": "1_000.5"}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("9.5\n  tp: 8.000000000000001", "$.parallel.tp: 9.5 is not an integer"),
        ("[8.000000000000001, 2]", "$.parallel.tp: [8.000000000000001, 2] is not an integer"),
        ("{a: 8.000000000000001}", "$.parallel.tp: {'a': 8.000000000000001} is not an integer"),
        # YAML's words in a list, and a refused item as written, not None (an audit, m495)
        ("[yes, ~, .inf]", "$.parallel.tp: [true, null, .inf] is not an integer"),
        ("1e-5", "$.parallel.tp: 1e-5 is less than the minimum of 1"),
    ],
)
def test_a_number_as_written_is_the_kept_one_and_is_quoted_inside_a_list(
    tmp_path: Path, value: str, said: str
) -> None:
    """Review m480: a duplicate key's second value, which is not kept, was quoted as the
    first's (`tp: 9.5` then `tp: 8.000000000000001` read "8.000000000000001 is not an
    integer"); a number in a list or a mapping was quoted as the float it reads as."""
    plan = ROOT / "plans" / "llama3-70b-decode.yaml"
    text = plan.read_text(encoding="utf-8").replace("tp: 8", f"tp: {value}", 1)
    path = tmp_path / "quoted.yaml"
    path.write_text(text, encoding="utf-8")
    result = runner.invoke(app, route([str(path)]))
    assert result.exit_code == 2 and said in result.stderr, result.stderr


def test_many_numbers_quoted_as_written_are_refused_quickly(tmp_path: Path) -> None:
    """A review: each problem was checked against every number the plan wrote with more
    digits than a float keeps, 4,096 of them in a pattern of 4,096 wrong entries (16.8 M
    prefix tests, over 2 s); the paths holding one are found once a file (`_holders`)."""
    from tests.guards import refused_in_time

    entries = ", ".join(["0.10000000000000000001"] * 4096)
    text = (ROOT / "plans" / "deepseek-moe-16b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "many.yaml"
    path.write_text(
        text.replace("first_dense_layers: 1}", f"first_dense_layers: 1, pattern: [{entries}]}}"),
        encoding="utf-8",
    )
    with refused_in_time(), pytest.raises(BudgetError) as refused:
        load_plan(path)
    first = refused.value.problems[0]
    assert first.path == "$.model.experts.pattern[0]"
    assert first.message == "0.10000000000000000001 is not true or false"


def test_a_list_of_repeated_items_is_quoted_in_yaml_words(tmp_path: Path) -> None:
    """Review m497: jsonschema's "has non-unique elements" quoted Python's [None, None] and
    [True, True]; the list now reads as the plan wrote it, a refused item too."""
    text = (ROOT / "plans" / "llama3-70b.yaml").read_text(encoding="utf-8")
    for written, said in (("[.inf, .inf]", "[.inf, .inf]"), ("[yes, yes]", "[true, true]")):
        path = tmp_path / "repeated.yaml"
        path.write_text(
            text + f"overlap: {{tp: true, tp_comm_aggregate: {written}}}\n", encoding="utf-8"
        )
        result = runner.invoke(app, route([str(path)]))
        assert result.exit_code == 2
        assert f"tp_comm_aggregate: {said} has non-unique elements" in result.stderr, result.stderr
