"""Shape expressions: parsed by a small grammar, evaluated over ints and numpy arrays."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from budget.plan.expr import BinOp, ExprError, Name, Num, evaluate, names_in, parse, unparse

NAMES = {"micro": 2, "seq": 2048, "cp": 2, "hidden": 12288, "tp": 8, "vocab": 51200}


def test_parse_builds_a_left_associative_tree() -> None:
    assert parse("micro * seq / cp") == BinOp(
        "/", BinOp("*", Name("micro"), Name("seq")), Name("cp")
    )
    assert parse("1 + 2 * 3") == BinOp("+", Num(1), BinOp("*", Num(2), Num(3)))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("micro * seq / cp", 2048),
        ("hidden / tp", 1536),
        ("vocab // 3", 17066),
        ("(micro + 2) * 3", 12),
        ("micro - cp + 1", 1),
        ("seq/cp/2", 512),
        ("  4096 ", 4096),
        ("2 * (3 * (4 + 1))", 30),
    ],
)
def test_evaluate_ints(text: str, expected: int) -> None:
    value = evaluate(parse(text), NAMES)
    assert value == expected
    assert isinstance(value, int)


def test_inexact_division_is_an_error_with_the_numbers() -> None:
    with pytest.raises(ExprError, match=r"^micro \* seq / cp = 2048 / 3 does not divide evenly$"):
        evaluate(parse("micro * seq / cp"), {**NAMES, "micro": 1, "cp": 3})


def test_division_by_zero() -> None:
    with pytest.raises(ExprError, match=r"divides by zero \(cp - 2 = 0\)$"):
        evaluate(parse("seq // (cp - 2)"), NAMES)
    with pytest.raises(ExprError, match=r"^micro \* seq / 0 divides by zero$"):  # no "(0 = 0)"
        evaluate(parse("micro * seq / 0"), NAMES)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ExprError, match=r"unknown name 'batch' \(known: cp, hidden"):
        evaluate(parse("batch * seq"), NAMES)


@pytest.mark.parametrize(
    "text",
    ["", "a +", "1 2", "a ** 2", "(a", "a)", "a $ b", "__import__('os')", "a.b", "-1", "1e3"],
)
def test_bad_syntax(text: str) -> None:
    with pytest.raises(ExprError):
        parse(text)


def test_deep_parentheses_and_long_text_are_refused() -> None:
    with pytest.raises(ExprError, match="too deeply"):
        parse("(" * 60 + "1" + ")" * 60)
    with pytest.raises(ExprError, match="at most 200"):
        parse("1 + " * 100 + "1")


def test_evaluate_over_numpy_arrays_matches_ints() -> None:
    """The vectorised search evaluates one tree for many configurations at once."""
    tree = parse("micro * seq / cp")
    micro = np.array([1, 2, 4])
    cp = np.array([1, 2, 8])
    got = evaluate(tree, {"micro": micro, "seq": 2048, "cp": cp})
    assert isinstance(got, np.ndarray)
    assert got.tolist() == [
        evaluate(tree, {"micro": int(m), "seq": 2048, "cp": int(c)})
        for m, c in zip(micro, cp, strict=True)
    ]


def test_array_division_is_exact_in_every_element() -> None:
    with pytest.raises(ExprError, match="does not divide evenly"):
        evaluate(parse("seq / cp"), {"seq": 2048, "cp": np.array([1, 3])})


def test_names_in() -> None:
    assert names_in(parse("micro * seq / cp + 1")) == {"micro", "seq", "cp"}


@pytest.mark.parametrize("text", ["(a + b) * c", "a - (b - c)", "a / (b * c)", "a * b + c // 2"])
def test_unparse_keeps_needed_parentheses(text: str) -> None:
    assert unparse(parse(text)) == text


_exprs = st.recursive(
    st.one_of(
        st.integers(min_value=0, max_value=999).map(str), st.sampled_from(["micro", "seq", "cp"])
    ),
    lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    ),
    max_leaves=12,
)


@given(_exprs)
def test_ring_operations_agree_with_python(text: str) -> None:
    """+, - and * mean what Python means (checked against Python on the same ints)."""
    tree = parse(text)
    expected = eval(text, {"__builtins__": {}}, dict(NAMES))  # the oracle, in the test only
    assert evaluate(tree, NAMES) == expected
    assert evaluate(parse(unparse(tree)), NAMES) == expected


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_expr_error(text: str) -> None:
    try:
        tree = parse(text)
    except ExprError:
        return
    with contextlib.suppress(ExprError):
        evaluate(tree, NAMES)
