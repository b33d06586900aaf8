"""YAML with marks: plain data, positions for every node, hostile input refused fast."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from budget.plan.yaml_load import (
    ALIASES_LISTED,
    MAX_DEPTH,
    MAX_KEY,
    MAX_PATH,
    Marks,
    child_path,
    decode,
    load_yaml,
)
from tests.guards import refused_in_time
from tests.plan_files import ROOT


def _not_a_12_float(text: str) -> bool:
    """PyYAML writes '1e5' unquoted (a string in YAML 1.1); this loader reads it as 1.2 does.
    It writes '08' unquoted too (not octal, so text in YAML 1.1), which this loader refuses
    as a number with a leading zero."""
    exponent = re.fullmatch(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+", text)
    return exponent is None and re.fullmatch(r"[-+]?0[0-9_]+", text) is None


def messages(text: str) -> list[str]:
    return [str(p) for p in load_yaml(text, "p.yaml").problems]


def billion_laughs() -> str:
    """The classic alias bomb: 9 levels of 9 references, 9**9 strings when expanded."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        name, previous = chr(ord("a") + i), chr(ord("a") + i - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_plain_data_and_marks() -> None:
    loaded = load_yaml(
        "name: x\nparallel:\n  tp: 8\n  pipeline: {schedule: 1f1b}\n"
        "levels:\n  - {name: nvlink, size: 8}\n  - name: ib\n",
        "p.yaml",
    )
    assert loaded.problems == ()
    assert loaded.tree == {
        "name": "x",
        "parallel": {"tp": 8, "pipeline": {"schedule": "1f1b"}},
        "levels": [{"name": "nvlink", "size": 8}, {"name": "ib"}],
    }
    marks = loaded.marks
    assert marks.at("$.name") == (1, 7)  # scalars: the value
    assert marks.at("$.parallel") == (2, 1)  # collections: the key that introduces them
    assert marks.at("$.parallel.tp") == (3, 7)
    assert marks.key("$.parallel.tp") == (3, 3)
    assert marks.at("$.parallel.pipeline.schedule") == (4, 24)
    assert marks.at("$.levels[0].size") == (6, 26)
    assert marks.at("$.levels[1].name") == (7, 11)


def test_marks_fall_back_to_the_nearest_ancestor() -> None:
    marks = Marks(nodes={"$": (1, 1), "$.parallel": (5, 1)})
    assert marks.at("$.parallel.tp") == (5, 1)
    assert marks.at("$.parallel.pipeline.layers_per_stage[3]") == (5, 1)
    assert marks.at("$.device.memory") == (1, 1)


def test_child_path_quotes_odd_keys() -> None:
    assert child_path("$", "tp") == "$.tp"
    assert child_path("$.levels", 0) == "$.levels[0]"
    assert child_path("$", "a b") == "$['a b']"
    assert child_path("$", "it's") == "$['it\\'s']"


def test_keys_are_their_source_text() -> None:
    """`1:` and `yes:` are names here, not an int and a boolean: JSON keys are strings."""
    assert load_yaml("1: a\nyes: b\n", "p.yaml").tree == {"1": "a", "yes": "b"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e9", 1e9),  # YAML 1.2 exponent floats, which PyYAML leaves as strings
        ("1.5e9", 1.5e9),
        ("1.0e+3", 1000.0),
        ("1_000", 1000),
        ("16_384", 16384),  # digits grouped by thousands
        ("-1_000_000", -1000000),
        ("1_000.5", 1000.5),  # a float's whole part grouped likewise
        ("!!float 1_000", 1000.0),  # tagged, without a fraction (a review)
        ("16_384.0e+3", 16_384_000.0),
        ("'012'", "012"),  # quoted: text
        ("00.5", 0.5),  # floats have no octal form
        ("'1e9'", "1e9"),
        ("true", True),
        ("~", None),
        ("2024-01-01", "2024-01-01"),  # timestamps stay text: plans hold no dates
        ("80 GiB", "80 GiB"),
    ],
)
def test_scalars(text: str, value: object) -> None:
    assert load_yaml(f"a: {text}\n", "p.yaml").tree == {"a": value}


def test_duplicate_keys_point_at_the_second() -> None:
    assert messages("parallel:\n  tp: 8\n  pp: 2\n  tp: 4\n") == [
        "p.yaml:4:3: error: $.parallel.tp: duplicate key 'tp' (first defined on line 2)"
    ]


def test_a_collection_key_is_refused_and_the_file_read_on() -> None:
    """A list used as a key stopped the reading: the duplicate after it went unsaid (an
    audit: a plan's bad layers and seq too). Its value is dropped, read for its problems."""
    assert messages("parallel:\n  ? [a, b]\n  : {x: *y}\n  tp: 1\n  tp: 2\n") == [
        "p.yaml:2:5: error: $.parallel: mapping keys must be plain names",
        "p.yaml:3:9: error: $.parallel['?'].x: YAML aliases (*y) are not allowed in a plan; "
        "write the value out",
        "p.yaml:5:3: error: $.parallel.tp: duplicate key 'tp' (first defined on line 4)",
    ]


def test_each_collection_key_is_said_at_its_own_place() -> None:
    """An audit: a second list or mapping used as a key went unsaid (said at the first
    one's place, the same line twice, kept once), and one after an empty key was placed at
    that key's value."""
    assert messages("model:\n  [a]: c\n  hidden: 1\n  {b: 1}: d\n") == [
        "p.yaml:2:3: error: $.model: mapping keys must be plain names",
        "p.yaml:4:3: error: $.model: mapping keys must be plain names",
    ]
    assert messages('model:\n  "": 5\n  [a]: c\n')[-1] == (
        "p.yaml:3:3: error: $.model: mapping keys must be plain names"
    )


@pytest.mark.parametrize("text", ["model:\n\tlayers: 2\n", "model:\n  layers: 2\n\thidden: 3\n"])
def test_a_tab_in_the_indentation_is_named(text: str) -> None:
    """PyYAML says "found character that cannot start any token" of a tab that indents, or
    "a tab character that violates indentation": neither said to indent with spaces (an
    audit)."""
    (said,) = messages(text)
    line = text.count("\n", 0, text.index("\t")) + 1
    assert said.startswith(f"p.yaml:{line}:1: error: $")
    assert said.endswith(": invalid YAML: a tab indents this line; YAML indents with spaces only")


def test_syntax_error_has_a_position() -> None:
    assert messages("model:\n  layers: [1, 2\nbatch: 3\n") == [
        "p.yaml:3:6: error: $.model.layers: invalid YAML: did not find expected ',' or ']' "
        "(while parsing a flow sequence from line 2, column 11)"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a: !!python/object/apply:os.system [ls]\n",
            "p.yaml:1:4: error: $.a: the tag !!python/object/apply:os.system is not allowed in "
            "a plan; use plain YAML values (strings, numbers, booleans, lists and mappings)",
        ),
        (
            "a: !custom 3\n",
            "p.yaml:1:4: error: $.a: the tag !custom is not allowed in a plan; use plain YAML "
            "values (strings, numbers, booleans, lists and mappings)",
        ),
        ("a: 1.0e+400\n", "p.yaml:1:4: error: $.a: 1.0e+400 is not a finite number"),
        (  # the tag alone: not also "this file holds nothing" (a user audit)
            "!!python/object/apply:os.system [ls]\n",
            "p.yaml:1:1: error: $: the tag !!python/object/apply:os.system is not allowed in a "
            "plan; use plain YAML values (strings, numbers, booleans, lists and mappings)",
        ),
        (
            "a: 012\n",  # YAML 1.1 octal: layers: 012 was read as 10 layers
            "p.yaml:1:4: error: $.a: 012 is read by YAML 1.1 as the octal number 10; write "
            "numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: 0x10\n",
            "p.yaml:1:4: error: $.a: 0x10 is read by YAML 1.1 as the hexadecimal number 16; "
            "write numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: 1:30\n",
            "p.yaml:1:4: error: $.a: 1:30 is read by YAML 1.1 as the base-60 number 90; write "
            "numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: 2_4\n",  # a typo YAML 1.1 would have read as 24
            "p.yaml:1:4: error: $.a: 2_4 is read by YAML 1.1 as 24, every underscore "
            "dropped; write 24",
        ),
        (
            "a: 1_0000\n",
            "p.yaml:1:4: error: $.a: 1_0000 is read by YAML 1.1 as 10000, every underscore "
            "dropped; write 10000, or group the digits by thousands (10_000)",
        ),
        (
            "a: 02048\n",  # not octal, so YAML 1.1 text: it was refused as 'not an integer'
            "p.yaml:1:4: error: $.a: 02048 has a leading zero, which YAML 1.1 reads as neither "
            "a decimal nor an octal number; write 2048 (or quote it, if it is text)",
        ),
        ("a: 1e400\n", "p.yaml:1:4: error: $.a: 1e400 is not a finite number"),
        ("a: -.inf\n", "p.yaml:1:4: error: $.a: -.inf is not a finite number"),
        (  # a long one is cut as other long values are (an audit: 8 MiB of it came back)
            f"a: {'1' * 400}.5\n",
            "p.yaml:1:4: error: $.a: 111111111111111111111111111... is not a finite number",
        ),
        (
            "a: 9223372036854775808\n",
            "p.yaml:1:4: error: $.a: 9223372036854775808 is too large "
            "(integers must be below 2**63)",
        ),
        (
            "a: &x 1\nb: *x\n",
            "p.yaml:2:4: error: $.b: YAML aliases (*x) are not allowed in a plan; "
            "write the value out",
        ),
        (
            "- 1\n",
            "p.yaml:1:1: error: $: a plan is a mapping of keys (name, model, batch, ...); "
            "this file holds a list",
        ),
        (
            "",
            "p.yaml:1:1: error: $: a plan is a mapping of keys (name, model, batch, ...); "
            "this file holds nothing",
        ),
        (
            "a: 1\n---\nb: 2\n",
            "p.yaml:2:1: error: $: a plan is one YAML document; found a second one",
        ),
        ("? [a]\n: 1\n", "p.yaml:1:3: error: $: mapping keys must be plain names"),
        # PyYAML's constructors raise KeyError and IndexError on these: each was a traceback
        ("a: !!bool maybe\n", "p.yaml:1:4: error: $.a: 'maybe' is not a valid bool"),
        ('a: !!bool ""\n', "p.yaml:1:4: error: $.a: '' is not a valid bool"),
        ('a: !!bool "+"\n', "p.yaml:1:4: error: $.a: '+' is not a valid bool"),
        ('a: !!int ""\n', "p.yaml:1:4: error: $.a: '' is not a valid int"),
        ('a: !!int "+"\n', "p.yaml:1:4: error: $.a: '+' is not a valid int"),
        ('a: !!int "-"\n', "p.yaml:1:4: error: $.a: '-' is not a valid int"),
        ('a: !!float ""\n', "p.yaml:1:4: error: $.a: '' is not a valid float"),
        ("a: !!int x\n", "p.yaml:1:4: error: $.a: 'x' is not a valid int"),
        # under an explicit tag too: 0140 and 0x60 were read as 96 (an audit)
        (
            "a: !!int 0140\n",
            "p.yaml:1:4: error: $.a: 0140 is read by YAML 1.1 as the octal number 96; write "
            "numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: !!int 0x60\n",
            "p.yaml:1:4: error: $.a: 0x60 is read by YAML 1.1 as the hexadecimal number 96; "
            "write numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: !!int 9_6\n",
            "p.yaml:1:4: error: $.a: 9_6 is read by YAML 1.1 as 96, every underscore dropped; "
            "write 96",
        ),
        (  # Python's forms under the tag: a traceback until a review
            "a: !!int 0o14\n",
            "p.yaml:1:4: error: $.a: 0o14 is read by YAML 1.1 as the octal number 12; write "
            "numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: !!int ９６\n",
            "p.yaml:1:4: error: $.a: ９６ is read by YAML 1.1 as the non-ASCII number 96; write "
            "numbers in decimal (or quote it, if it is text)",
        ),
        # floats too: 1_6.0 read as 16.0 and ９６ as 96.0 (an audit); grouped by thousands,
        # a float's whole part is read as written (below)
        (
            "a: 1_6.0\n",
            "p.yaml:1:4: error: $.a: 1_6.0 is read by YAML 1.1 as 16.0, every underscore "
            "dropped; write 16.0",
        ),
        (
            "a: !!float 8__192\n",
            "p.yaml:1:4: error: $.a: 8__192 is read by YAML 1.1 as 8192.0, every underscore "
            "dropped; write 8192.0",
        ),
        (
            "a: !!float ９６\n",
            "p.yaml:1:4: error: $.a: ９６ is read by YAML 1.1 as the non-ASCII number 96.0; "
            "write numbers in decimal (or quote it, if it is text)",
        ),
        (  # base 60 under a tag is base 60 still
            "a: !!int 1:30\n",
            "p.yaml:1:4: error: $.a: 1:30 is read by YAML 1.1 as the base-60 number 90; write "
            "numbers in decimal (or quote it, if it is text)",
        ),
        (
            "a: 1:30.5\n",
            "p.yaml:1:4: error: $.a: 1:30.5 is read by YAML 1.1 as the base-60 number 90.5; "
            "write numbers in decimal (or quote it, if it is text)",
        ),
        ("a: \x00\n", "p.yaml:1:4: error: $: invalid YAML: the character '\\x00' is not allowed"),
        (  # libyaml counts bytes: after "×" (2) and "—" (3) it put this at 3:2 and 2:10
            "# 8 × H100\nname: x\n\x07\n",
            "p.yaml:3:1: error: $: invalid YAML: the character '\\x07' is not allowed",
        ),
        (
            "# 8 × H100 — Llama, 2×4\ntp: 1\x00\n",
            "p.yaml:2:6: error: $: invalid YAML: the character '\\x00' is not allowed",
        ),
        ("a: ×\x07\n", "p.yaml:1:5: error: $: invalid YAML: the character '\\x07' is not allowed"),
    ],
)
def test_refused(text: str, expected: str) -> None:
    assert messages(text) == [expected]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "0.99999999999999999",
            "is not a whole number, but has more digits than a 64-bit float keeps and reads as "
            "1.0; write 1 if that is meant",
        ),
        (
            "1099511627776.0000001",
            "is not a whole number, but has more digits than a 64-bit float keeps and reads as "
            "1099511627776.0; write 1099511627776 if that is meant",
        ),
        (
            "1e-400",
            "is too small for a 64-bit float, which reads it as 0; write 0 if zero is meant",
        ),
        (
            "-1.0e-999",
            "is too small for a 64-bit float, which reads it as 0; write 0 if zero is meant",
        ),
    ],
)
def test_a_float_rounded_into_another_kind_of_number_is_refused(text: str, why: str) -> None:
    """A float's rounding that makes a fraction whole or a nonzero number 0 is refused,
    quoting what was written (an audit, m447: `tp: 0.99999999999999999` ran at tp 1, and
    `tp: 1e-400` was told "0.0 is less than the minimum of 1")."""
    assert messages(f"a: {text}\n") == [f"p.yaml:1:4: error: $.a: {text} {why}"]


@pytest.mark.parametrize("text", ["0.1", "8.0", "1e-300", "0.0", "-0.0", "2.5e3", "1_000.5"])
def test_a_float_that_rounds_within_its_kind_is_read(text: str) -> None:
    loaded = load_yaml(f"a: {text}\n", "p.yaml")
    assert loaded.problems == ()
    assert loaded.tree == {"a": float(text.replace("_", ""))}


def test_a_huge_integer_literal_is_refused_quickly() -> None:
    with refused_in_time():
        problems = messages("a: " + "9" * 10_000 + "\n")
    assert problems == [
        "p.yaml:1:4: error: $.a: an integer of 10,000 digits; plan numbers are below 2^63"
    ]  # Python reads no int of over 4,300 digits: it was "'999...' is not a valid int"
    hexadecimal = messages("a: 0x" + "f" * 5000 + "\n")  # printed in decimal: a traceback
    assert hexadecimal == [
        "p.yaml:1:4: error: $.a: 0xfffffffffffffffffffffffff... is read by YAML 1.1 as a "
        "hexadecimal number of 20,000 bits; plan numbers are decimal and below 2^63"
    ]
    octal = messages("a: 0" + "7" * 5000 + "\n")
    assert octal[0].endswith(
        "as an octal number of 15,000 bits; plan numbers are decimal and below 2^63"
    )


def test_billion_laughs_is_refused_without_expanding() -> None:
    text = billion_laughs()
    with refused_in_time():
        problems = messages(text)
    # never expanded: the first 20 of the 81 aliases are problems where they are, the last
    # of them counting the rest, and the rest of the file is still read (it was the end of
    # reading, so a plan's other problems came one run later; review)
    assert len(problems) == ALIASES_LISTED == 20
    assert problems[0] == (
        "p.yaml:2:8: error: $.b[0]: YAML aliases (*a) are not allowed in a plan; "
        "write the value out"
    )
    assert problems[-1] == (
        "p.yaml:4:12: error: $.d[1]: YAML aliases (*c) are not allowed in a plan; "
        "write the value out (61 more in the file)"
    )


def test_aliases_past_the_first_twenty_are_counted_and_where_reading_stopped_is_said() -> None:
    """An audit: of a plan's aliases only the first had a line, the others a count beside
    it; the first `ALIASES_LISTED` now have their own. A review: listing 200 put the problem
    that stopped the reading of a 100,000-alias list past the problems a file shows, and
    the count beside them read as the file's; it is of those read before reading stopped."""
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 100_000) + "]\n"
    with refused_in_time():
        problems = messages(text)
    assert len(problems) == ALIASES_LISTED + 1
    assert problems[1].startswith("p.yaml:2:9: error: $.b[1]: YAML aliases (*a)")
    assert problems[ALIASES_LISTED - 1].endswith("more before reading stopped)")
    assert problems[-1].endswith("$.b: more than 20,000 values; a plan is small")


@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_ten_thousand_deep_flow_nesting_is_refused_fast(opening: str) -> None:
    closing = "]" if opening == "[" else "}"
    text = "a: " + opening * 10_000 + "1" + closing * 10_000 + "\n"
    with refused_in_time():
        problems = messages(text)
    assert len(problems) == 1
    assert problems[0].endswith(f"nesting deeper than {MAX_DEPTH} levels")


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_a_reader_error_and_deep_nesting_are_placed_on_yaml_s_lines(eol: str) -> None:
    """A lone CR breaks a line for YAML, so the characters the reader refuses and the
    bracket past the depth limit are placed on YAML's lines (an audit: a CR-only file's
    control character put at 1:1010 for 14:10, its 65th bracket at 1:83 for 4:68)."""
    head = eol.join(["a: 1", "b: 2", "c: 3", ""])
    (control,) = messages(head + "name: gpt\x01x" + eol)
    assert control.startswith("p.yaml:4:10: error: $: invalid YAML: the character"), control
    (deep,) = messages(head + "x: " + "[" * 10_000 + eol)
    assert deep == f"p.yaml:4:68: error: $.x: nesting deeper than {MAX_DEPTH} levels"


def test_the_depth_limit_s_place_counts_a_flow_mapping_s_close_after_a_word() -> None:
    """A review: a flow mapping that ends in a plain word (`{memory: 80 GiB}`) left its
    brace uncounted as a close, so past libyaml's own limit the 65th bracket of a later line
    was put a column early (and one more for each such line)."""
    head = "device: {memory: 80 GiB}\ntopology: {preset: dgx-a100, nodes: 1}\n"
    (deep,) = messages(head + "extra: " + "[" * 1_100 + "\n")
    assert deep == f"p.yaml:3:72: error: $.extra: nesting deeper than {MAX_DEPTH} levels"


def test_deep_block_nesting_is_refused_at_the_limit() -> None:
    text = "".join("  " * i + f"k{i}:\n" for i in range(200))
    problems = messages(text)
    assert problems == [
        f"p.yaml:65:129: error: $.{'.'.join(f'k{i}' for i in range(64))}: "
        f"nesting deeper than {MAX_DEPTH} levels"
    ]


def test_nesting_just_under_the_limit_is_fine() -> None:
    text = "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    assert load_yaml(text, "p.yaml").problems == ()


def test_decode_reports_the_bad_byte() -> None:
    text, problem = decode(b"name: x\nmodel: caf\xc3\xa9 \xff\n", "p.yaml")
    assert text is None
    assert str(problem) == (
        "p.yaml:2:13: error: $: the file is not UTF-8: byte 0xff at offset 21 cannot be decoded"
    )


def test_decode_drops_a_bom() -> None:
    assert decode(b"\xef\xbb\xbfa: 1\n", "p.yaml") == ("a: 1\n", None)


@given(st.text(max_size=200))
def test_any_text_loads_or_reports(text: str) -> None:
    loaded = load_yaml(text, "p.yaml")
    assert loaded.tree is None or isinstance(loaded.tree, dict)
    assert loaded.tree is not None or loaded.problems


@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**62), 2**62),
            st.text(max_size=10).filter(_not_a_12_float),
        ),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_round_trip_with_pyyaml_dump(value: object) -> None:
    """What PyYAML's safe dumper writes reads back the same (YAML 1.2 floats aside)."""
    import yaml

    text = yaml.safe_dump({"root": value})
    loaded = load_yaml(text, "p.yaml")
    assert loaded.problems == ()
    assert loaded.tree == {"root": value}


@pytest.mark.parametrize(
    "text",
    [
        "a: \x00\n",
        "a: &x 1\nb: *x\n",
        "a: !!python/name:os.system x\n",
        "a: 1e400\n",
        "a: 1\na: 2\n",
        "a: " + "[" * 10_000 + "]" * 10_000 + "\n",
    ],
)
def test_the_pure_python_parser_refuses_the_same(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without libyaml, PyYAML's own parser is used; the refusals must not change."""
    import yaml

    import budget.plan.yaml_load as yaml_load

    expected = [p.message for p in load_yaml(text, "p.yaml").problems]
    monkeypatch.setattr(yaml_load, "_Loader", yaml.SafeLoader)
    with refused_in_time():
        assert [p.message for p in load_yaml(text, "p.yaml").problems] == expected


def test_an_alias_or_a_tag_does_not_hide_the_problems_after_it() -> None:
    """Every problem of the file at once: an alias hid the forbidden tag after it, and a tag
    the unknown key after it, each found one run later (review)."""
    assert messages("name: &x a\nfoo: *x\nmode: !!python/object:os.system train\n") == [
        "p.yaml:2:6: error: $.foo: YAML aliases (*x) are not allowed in a plan; write the "
        "value out",
        "p.yaml:3:7: error: $.mode: the tag !!python/object:os.system is not allowed in a plan; "
        "use plain YAML values (strings, numbers, booleans, lists and mappings)",
    ]
    assert messages("a: !!python/tuple [1, 2]\nb: {c: 1, c: 2}\n") == [
        "p.yaml:1:4: error: $.a: the tag !!python/tuple is not allowed in a plan; use plain "
        "YAML values (strings, numbers, booleans, lists and mappings)",
        "p.yaml:2:11: error: $.b.c: duplicate key 'c' (first defined on line 2)",
    ]


def test_a_long_key_ends_reading_with_one_problem() -> None:
    """Every value keeps its path, so long keys over many values were memory: 62 nested
    1,000-character keys over 5,000 values took 633 MB (hostile audit)."""
    nested = "".join("  " * i + "k" * 1000 + ":\n" for i in range(62))
    values = "".join("  " * 62 + f"v{i}: {i}\n" for i in range(5000))
    problems = messages(nested + values)
    assert problems == [
        f"p.yaml:1:1: error: $['{'k' * 27}...']: a key of 1,000 characters; a plan's keys are names"
    ]


def test_a_path_of_many_nested_keys_ends_reading_with_one_problem() -> None:
    """Keys within the limit, nested until their path passes it: refused at the key."""
    key = "k" * MAX_KEY
    text = "".join("  " * i + f"{key}:\n" for i in range(10)) + "  " * 10 + "v: 1\n"
    (problem,) = messages(text)
    assert problem.startswith("p.yaml:4:7: error: $.kkk")
    assert problem.endswith(f"a path of over {MAX_PATH} characters; a plan nests a few short names")
    fine = "".join("  " * i + f"{key}:\n" for i in range(3)) + "  " * 3 + "v: 1\n"
    assert load_yaml(fine, "p.yaml").problems == ()


@pytest.mark.parametrize(
    ("char", "name"),
    [("\x85", "U+0085 (next line)"), ("\u2028", "U+2028 (line separator)")],
)
def test_a_line_break_editors_do_not_show_is_refused_where_they_show_it(
    char: str, name: str
) -> None:
    """PyYAML counts U+0085 and U+2028 as line breaks, so every position after one was a
    line further down than an editor or grep shows it (hostile audit)."""
    text, problem = decode(f"name: a\r\nmode: train # x{char}y\nbatch: 1\n".encode(), "p.yaml")
    assert text is None and problem is not None
    assert str(problem) == (
        f"p.yaml:2:16: error: $: the file holds {name}, which YAML reads as a line break "
        "and editors do not show, so every line after it would be misnumbered; delete it"
    )


def test_a_file_of_tens_of_thousands_of_values_is_refused_at_the_limit() -> None:
    """30,000 faulty transitions took 3.4 s and printed 210,000 problems; a plan's largest
    lists are per-layer, at most 4,096 entries."""
    text = "transitions:\n" + "".join("  - {a: 1}\n" for _ in range(30_000))
    assert messages(text) == [
        "p.yaml:6667:9: error: $.transitions[6665]: more than 20,000 values; a plan is small"
    ]


class _CountingLoader(yaml.SafeLoader):
    """The pure-Python loader, counting the values it is asked to construct."""

    built = 0

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        type(self).built += 1
        return super().construct_object(node, deep)


@pytest.mark.parametrize(
    ("value", "tag"), [("59", ""), ("59", "!!int "), ("59", "!!float "), ("0", "")]
)
def test_a_long_base_60_number_is_refused_without_being_built(
    value: str, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyYAML builds a base-60 number place by place, in time quadratic in its length: one
    of 200,000 places (a million bits) took 12.5 s (audit). It is refused unbuilt: no value
    is constructed, and the file's other problems are still found."""
    import budget.plan.yaml_load as yaml_load

    monkeypatch.setattr(yaml_load, "_Loader", _CountingLoader)
    monkeypatch.setattr(_CountingLoader, "built", 0)
    text = f"a: {tag}1:" + ":".join([value] * 200_000) + "\nb: !!bool maybe\n"
    with refused_in_time():
        problems = messages(text)
    assert _CountingLoader.built == 1  # `maybe` alone
    shown = ("1:" + ":".join([value] * 20))[:27]
    assert problems == [
        f"p.yaml:1:4: error: $.a: {shown}... is read by YAML 1.1 as a base-60 number of "
        "200,001 places; write numbers in decimal (or quote it, if it is text)",
        "p.yaml:2:4: error: $.b: 'maybe' is not a valid bool",
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "1:" * (4 * 2**20 - 100) + "1",
            "1:1:1:1:1:1:1:1:1:1:1:1:1:1... is read by YAML 1.1 as a base-60 number of "
            "4,194,205 places; write numbers in decimal (or quote it, if it is text)",
        ),
        (
            "1:" * (4 * 2**20 - 100) + "1.5",
            "1:1:1:1:1:1:1:1:1:1:1:1:1:1... is read by YAML 1.1 as a base-60 number of "
            "4,194,205 places; write numbers in decimal (or quote it, if it is text)",
        ),
        ("9" * (8 * 2**20 - 100), "an integer of 8,388,508 digits; plan numbers are below 2^63"),
    ],
    ids=["base-60", "base-60-float", "digits"],
)
def test_a_number_of_8_mib_is_refused_in_time_and_memory(body: str, expected: str) -> None:
    """PyYAML's resolver matched an 8 MiB base-60 number in 2.3 s and 572 MB (a repeated
    group in its pattern), and 8 MiB of digits in 2 s (its base-60 form gave the digits
    back one by one; counting them took 1 s more): a long scalar is resolved by string
    methods (`_long_tag`), which hold a few copies of the text (audit)."""
    import tracemalloc

    text = "a: " + body + "\n"
    tracemalloc.start()
    try:
        with refused_in_time():
            problems = messages(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problems == [f"p.yaml:1:4: error: $.a: {expected}"]
    assert peak < 64 * 2**20


_PLACE = st.text("0123456789", min_size=1, max_size=3)


@given(
    st.sampled_from(["", "-", "+"]),
    st.one_of(
        st.text("0123456789_", min_size=1, max_size=3),
        st.sampled_from(["0x", "0b", ".", ".inf", "1e", "0xf", "", "1-"]),
    ),
    st.lists(st.one_of(_PLACE, st.sampled_from(["", "_", "5_", "x"])), min_size=1, max_size=40),
    st.one_of(st.none(), st.text("0123456789_", max_size=3), st.just("5e+3")),
)
def test_a_long_scalar_resolves_as_pyyaml_resolves_it(
    sign: str, head: str, places: list[str], fraction: str | None
) -> None:
    """`_long_tag` reads a scalar over `_SHORT` without PyYAML's patterns: it must give the
    tag they give (a timestamp, kept as text as a string is, reads as a string)."""
    from budget.plan.yaml_load import _SHORT, _long_tag

    places += ["0"] * (_SHORT + 1)  # longer than _SHORT even with every other part empty
    for text in (
        sign + head + ":" + ":".join(places) + ("" if fraction is None else "." + fraction),
        sign + head + "".join(places) + ("" if fraction is None else "." + fraction),
    ):
        resolved = yaml.SafeLoader.resolve(  # type: ignore[no-untyped-call]
            yaml.SafeLoader, yaml.ScalarNode, text, (True, False)
        )
        if resolved == "tag:yaml.org,2002:timestamp":
            resolved = "tag:yaml.org,2002:str"
        assert len(text) > _SHORT
        assert _long_tag(text, plain=True) == resolved, text


def test_a_long_tagged_value_with_colons_that_is_no_number_is_refused_unbuilt() -> None:
    text = "a: !!int " + "1:x" * 100 + "\n"
    assert messages(text) == [f"p.yaml:1:4: error: $.a: '{('1:x' * 9)[:27]}...' is not a valid int"]


def test_a_huge_integer_or_a_bad_tagged_value_does_not_hide_the_other_problems() -> None:
    """Each was the end of reading (`stop`), so the file's next problem came one run later:
    now each is one problem of the file, its value standing as nothing (audit)."""
    text = "a: " + "9" * 5000 + "\nb: !!bool maybe\nc: !!int ''\nd: 0x10\nd: 2\n"
    loaded = load_yaml(text, "p.yaml")
    assert [str(p) for p in loaded.problems] == [
        "p.yaml:1:4: error: $.a: an integer of 5,000 digits; plan numbers are below 2^63",
        "p.yaml:2:4: error: $.b: 'maybe' is not a valid bool",
        "p.yaml:3:4: error: $.c: '' is not a valid int",
        "p.yaml:4:4: error: $.d: 0x10 is read by YAML 1.1 as the hexadecimal number 16; write "
        "numbers in decimal (or quote it, if it is text)",
        "p.yaml:5:1: error: $.d: duplicate key 'd' (first defined on line 4)",
    ]
    assert loaded.tree == {"a": None, "b": None, "c": None, "d": None}
    assert loaded.refused == {"$.a", "$.b", "$.c", "$.d"}


@given(
    st.sampled_from(["int", "float", "bool", "null", "str"]),
    st.text(max_size=40),
    st.booleans(),
)
def test_any_text_under_a_standard_tag_loads_or_is_one_problem(
    tag: str, text: str, quoted: bool
) -> None:
    """`!!bool maybe` and `!!int ""` were tracebacks (KeyError, IndexError): whatever the
    text under a standard scalar tag, it reads or is a problem at the value, and the value
    after it is still read."""
    import json

    written = json.dumps(text) if quoted else text
    loaded = load_yaml(f"a: !!{tag} {written}\nb: 2\n", "p.yaml")
    assert loaded.tree is None or isinstance(loaded.tree, dict)
    if loaded.tree is not None and "$.a" in loaded.refused:
        assert loaded.tree.get("a") is None
        assert any(p.path == "$.a" and (p.line, p.col) == (1, 4) for p in loaded.problems)


def test_a_second_document_does_not_hide_the_first_ones_problems(tmp_path) -> None:
    """Reading stops at a second document, but the first was read whole: its own problems
    are said beside it (an audit: a bad layers went unsaid), every problem at once."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from tests.plan_files import GPT3

    text = GPT3.read_text(encoding="utf-8").replace("\n  layers: 96\n", "\n  layers: x\n", 1)
    plan = tmp_path / "two.yaml"
    plan.write_text(text + "---\nname: y\n", encoding="utf-8")
    result = CliRunner().invoke(app, route([str(plan)]))
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert any(line.endswith("$.model.layers: 'x' is not an integer") for line in lines)
    assert lines[-1].endswith("$: a plan is one YAML document; found a second one")
    loaded = load_yaml("a: 1\n---\nb: 2\n", "p.yaml")
    assert loaded.tree == {"a": 1}  # the first document, checked on by the caller
    # and its problems across sections too (a review: a bad tp went unsaid beside it)
    text = GPT3.read_text(encoding="utf-8").replace("\n  tp: 8\n", "\n  tp: 3\n", 1)
    plan.write_text(text + "---\nname: y\n", encoding="utf-8")
    err = CliRunner().invoke(app, route([str(plan)])).stderr
    assert "error: $.parallel: tp × cp × pp × dp = 3 × 1 × 8 × 16 = 384" in err


def test_a_terminals_control_characters_reach_it_escaped(tmp_path) -> None:
    """A key holding ESC ] 0 ; TITLE BEL ESC [ 2 J was echoed raw in its problem's $ path
    (its message escaped it), retitling the window and clearing the screen of whoever ran
    `budget validate`; so was a file name holding one, in `validate`'s "ok" line and its
    markdown. A plan name with a right-to-left override, which reorders what follows it,
    is refused as the control characters are."""
    from typer.testing import CliRunner

    from budget.cli import app, route

    runner = CliRunner()
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text('name: x\n"a\\x1b]0;TITLE\\x07\\x1b[2J": {}\n', encoding="utf-8")
    result = runner.invoke(app, route(["validate", str(keyed)]))
    shown = "a\\x1b]0;TITLE\\x07\\x1b[2J"
    said = f"{keyed}:2:1: error: $['{shown}']: unknown key '{shown}'"
    assert result.exit_code == 2 and said in result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    plan = tmp_path / "f\x1b[2J\u202e.yaml"
    plan.write_bytes((ROOT / "plans" / "gpt-1.3b.yaml").read_bytes())
    out = runner.invoke(app, route(["validate", str(plan)])).stdout
    assert out == f"{tmp_path}/f\\x1b[2J\\u202e.yaml: ok\n"
    out = runner.invoke(app, route(["validate", str(plan), "-f", "markdown"])).stdout
    assert "`" + f"{tmp_path}/f\\x1b[2J\\u202e.yaml" + "`" in out and "\x1b" not in out
    # the files search writes and plot draws are named so too (a review)
    written = tmp_path / "w\x1b[2J.yaml"
    args = ["search", str(plan), "--tp", "1", "--pp", "1", "--top", "1", "--write", str(written)]
    out = runner.invoke(app, route(args)).stdout
    assert "\x1b" not in out
    assert f"Wrote the best layout searched to {tmp_path}/w\\x1b[2J.yaml" in " ".join(out.split())
    pytest.importorskip("matplotlib")
    result = runner.invoke(app, route(["plot", str(plan), "-o", str(tmp_path / "p\x07.png")]))
    assert result.exit_code == 0 and "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert result.stdout.endswith(f"f\\x1b[2J\\u202e.yaml: wrote {tmp_path}/p\\x07.png\n")
    named = tmp_path / "named.yaml"
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    named.write_text(re.sub(r"(?m)^name: .*$", 'name: "abc\\\\u202edef"', text), encoding="utf-8")
    result = runner.invoke(app, route([str(named)]))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.endswith(
        "$.name: 'abc\\u202edef' is not a name of printable characters (no tabs, line breaks, "
        "control characters or bidirectional overrides)\n"
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("batch:\n  seq:2048\n  micro: 1\n", ((2, 6), "$.batch.seq", "'seq:' needs a space")),
        ("parallel:\n  tp 2\n  dp: 4\n", ((2, 5), "$.parallel.tp", "'tp' needs a colon")),
        ("mode:train\nname: x\n", ((1, 5), "$.mode", "'mode:' needs a space")),
        # a list item's keys (a review: the mend had stopped reading them) and an anchor's
        (
            "levels:\n  - name: a\n    size: 8\n  - name: b\n    bandwidth:50 GB/s\n    x: 1\n",
            ((5, 14), "$.levels[1].bandwidth", "'bandwidth:' needs a space"),
        ),
        ("batch: &b\n  seq:2048\n  micro: 1\n", ((2, 6), "$.batch.seq", "'seq:' needs a space")),
    ],
)
def test_a_key_glued_to_its_value_is_said_at_the_key(text: str, where: tuple) -> None:
    """An audit: PyYAML reads `seq:2048` as one word and fails on the next line, under the
    section after it ("$.parallel: could not find expected ':'" for a top-level line)."""
    (problem,) = load_yaml(text, "f").problems
    position, path, said = where
    assert ((problem.line, problem.col), problem.path) == (position, path)
    assert said in problem.message


def test_two_keys_glued_in_a_row_are_both_said() -> None:
    """An audit: of `seq:2048` and `micro:4` on consecutive lines only the second was said,
    the first a run later; each is said at its key, top to bottom."""
    text = "batch:\n  seq:2048\n  micro:4\n  global: 8\n"
    found = [((p.line, p.col), p.path) for p in load_yaml(text, "f").problems]
    assert found == [((2, 6), "$.batch.seq"), ((3, 8), "$.batch.micro")]


@pytest.mark.parametrize(
    "text",
    [
        "name: >-\n  gpt 1.3b run\nmode: train\n  bad: [\n",  # a block scalar's text
        "order:\n  - full recompute\ndevice: {preset: a100-80gb\nx: 1\n",  # a list item
        "name: a long\n  name goes on\nmode: train\n  bad: [\n",  # a plain scalar's next line
    ],
)
def test_text_that_is_no_key_is_not_told_to_take_a_colon(text: str) -> None:
    """A review: "  gpt 1.3b run" under `name: >-` was told "'gpt' needs a colon", hiding
    the error PyYAML found; only a line of a block mapping is read as a glued key."""
    (problem,) = load_yaml(text, "f").problems
    assert "needs a colon" not in problem.message and "needs a space" not in problem.message


def test_a_nesting_bomb_is_placed_at_its_bracket_past_the_limit() -> None:
    """An audit: 10,000 `[` were refused at column 1,001, where libyaml's own limit fired;
    the 65th bracket is at column 65. Quoted brackets (an escaped quote among them), a
    comment's and a plain word's ("a[[[") open nothing (a review)."""
    assert [(p.line, p.col) for p in load_yaml("[" * 10_000, "f").problems] == [(1, MAX_DEPTH + 1)]
    deep = "x: " + "[" * 1100 + "]" * 1100 + "\n"
    words = ("name: a" + "[" * 70, "name: a," + "[" * 70, "name: x:" + "[" * 70)  # one word each
    for first in ('name: "a\\" ' + "[" * 70 + '"', *words, "# " + "[" * 70):
        (problem,) = load_yaml(first + "\n" + deep, "f").problems
        assert (problem.line, problem.col) == (2, 3 + MAX_DEPTH + 1), first


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('name: "abc\n\tdef" x: 1\n', "p.yaml:2:7: error: $: invalid YAML: did not find"),
        ("model: [1,\n\t2 : 3 : 4]\n", "p.yaml:2:8: error: $.model: invalid YAML: did not find"),
        ("model: [1,\n\t@2]\n", "p.yaml:2:2: error: $.model: invalid YAML: found character"),
        ('name: "abc\n\t\\q"\n', "p.yaml:2:2: error: $: invalid YAML: found unknown escape"),
    ],
)
def test_a_tab_that_is_not_the_error_is_not_blamed(text: str, said: str) -> None:
    """A tab inside a quoted string, or before an error further along its line, is not what
    YAML refused: the error keeps PyYAML's words and place (a review: "a tab indents this
    line" hid them, and replacing the tab left the error)."""
    (message,) = messages(text)
    assert message.startswith(said), message


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_decode_puts_the_bad_byte_on_yaml_s_lines(eol: str) -> None:
    """A lone CR is a line break to YAML, so the bad byte's line and column are counted as
    the parser's errors are (an audit: a CR-only file's put at 1:1011 for 14:11)."""
    data = eol.join(["name: x", "model:", "  layers: 2", "  name: gpt-\xff"]).encode("latin-1")
    text, problem = decode(data, "p.yaml")
    assert text is None and problem is not None
    assert (problem.line, problem.col) == (4, 13)


def test_tag_directives_are_refused_and_the_file_read_on() -> None:
    """A plan takes no tags, so a %TAG directive declares nothing it can use, and libyaml
    checks each handle against every one before it, time quadratic in their number (an
    audit: 100,000 of them held the parser 14 s). They are refused before it reads them,
    the first named with the count of the rest, and the file read on at the same lines."""
    text = "%TAG !a! tag:x,1:\n%TAG !b! tag:x,2:\n---\nname: x\nname: y\n"
    assert messages(text) == [
        "p.yaml:1:1: error: $: a %TAG directive is not allowed in a plan (and 1 more): a plan "
        "takes no tags, so it declares nothing a plan can use; delete it",
        "p.yaml:5:1: error: $.name: duplicate key 'name' (first defined on line 4)",
    ]
    assert messages(text.replace("\n", "\r")) == messages(text)
    bomb = "".join(f"%TAG !t{i}! tag:x,{i}:\n" for i in range(100_000)) + "---\na: 1\n"
    with refused_in_time():
        problems = messages(bomb)
    assert problems == [
        "p.yaml:1:1: error: $: a %TAG directive is not allowed in a plan (and 99,999 more): a "
        "plan takes no tags, so it declares nothing a plan can use; delete it"
    ]
    # not a directive: text that only holds one, or a key that starts like one, or a
    # quoted string's line (a review: refused, and its value rewritten)
    assert load_yaml('a: "%TAG !x! y"\nb: x%TAG\n', "p.yaml").problems == ()
    quoted = load_yaml('name: "gpt\n%TAG 1.3b"\nmode: train\n', "p.yaml")
    assert quoted.problems == () and quoted.tree == {"name": "gpt %TAG 1.3b", "mode": "train"}
    # after a document's end a prologue starts again
    second = messages("a: 1\n...\n%TAG !a! tag:x,1:\n---\nb: 2\n")
    assert second[0].startswith("p.yaml:3:1: error: $: a %TAG directive is not allowed")


def test_aliases_before_a_syntax_error_are_counted_as_read_before_it() -> None:
    """A review: a syntax error stops the reading as a limit does, so the aliases counted
    past the first twenty are those read before it, not the file's."""
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 25) + "]\nc: [unclosed\nd: *a\n"
    problems = messages(text)
    assert problems[ALIASES_LISTED - 1].endswith("(5 more before reading stopped)")
    assert "invalid YAML" in problems[-1]
