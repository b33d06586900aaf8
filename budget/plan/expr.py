"""Shape expressions such as ``micro * seq / cp``: parsed by a small parser, never ``eval``.

Grammar (the usual precedence; all operators left-associative)::

    expr   := term (("+" | "-") term)*
    term   := atom (("*" | "/" | "//") atom)*
    atom   := INTEGER | NAME | "(" expr ")"

``/`` is exact division: a shape that does not divide evenly is an error, not a rounding.
``//`` is floor division, for when rounding down is meant. The parsed tree is kept, so a
vectorised search can evaluate the same expression over numpy integer arrays, one element
per configuration.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "BinOp",
    "Expr",
    "ExprError",
    "Name",
    "Num",
    "Value",
    "evaluate",
    "evaluate_each",
    "names_in",
    "parse",
    "unparse",
]

MAX_LENGTH = 200
MAX_DEPTH = 32  # parentheses; keeps the recursive descent far from Python's stack limit

IntArray: TypeAlias = npt.NDArray[np.integer]
Value: TypeAlias = int | IntArray


class ExprError(ValueError):
    """An expression that cannot be parsed or evaluated; the message says why."""


@dataclass(frozen=True, slots=True)
class Num:
    value: int


@dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str  # "+", "-", "*", "/", "//"
    left: Expr
    right: Expr


Expr: TypeAlias = Num | Name | BinOp

_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*/()]))")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "num", "name", "op", "end"
    text: str
    col: int  # 1-based column in the expression


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.lastgroup is None:
            bad = text[pos:].lstrip()[:1]
            col = len(text) - len(text[pos:].lstrip()) + 1
            raise ExprError(f"unexpected {bad!r} at column {col} of {text!r}")
        kind = match.lastgroup
        tokens.append(_Token(kind, match[kind], match.start(kind) + 1))
        pos = match.end()
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expr(self) -> Expr:
        node = self.term()
        while self.peek().text in ("+", "-") and self.peek().kind == "op":
            op = self.take().text
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.atom()
        while self.peek().text in ("*", "/", "//") and self.peek().kind == "op":
            op = self.take().text
            node = BinOp(op, node, self.atom())
        return node

    def atom(self) -> Expr:
        token = self.take()
        if token.kind == "num":
            if len(token.text) > 18:
                raise ExprError(f"{token.text} in {self.text!r} is too large")
            return Num(int(token.text))
        if token.kind == "name":
            return Name(token.text)
        if token.text == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ExprError(f"{self.text[:40]!r}... nests parentheses too deeply")
            node = self.expr()
            closing = self.take()
            if closing.text != ")":
                raise ExprError(f"expected ')' at column {closing.col} of {self.text!r}")
            self.depth -= 1
            return node
        found = "the end" if token.kind == "end" else repr(token.text)
        raise ExprError(
            f"expected a number, a name or '(' at column {token.col} of {self.text!r}, "
            f"found {found}"
        )


def parse(text: str) -> Expr:
    """Parse a shape expression: ``parse("micro * seq / cp")``."""
    if len(text) > MAX_LENGTH:
        raise ExprError(f"an expression is at most {MAX_LENGTH} characters")
    parser = _Parser(text)
    node = parser.expr()
    rest = parser.peek()
    if rest.kind != "end":
        raise ExprError(f"unexpected {rest.text!r} at column {rest.col} of {text!r}")
    return node


def unparse(node: Expr) -> str:
    """The expression as text, with only the parentheses it needs."""
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Name):
        return node.name
    mine = _PRECEDENCE[node.op]
    left = unparse(node.left)
    if isinstance(node.left, BinOp) and _PRECEDENCE[node.left.op] < mine:
        left = f"({left})"
    right = unparse(node.right)
    if isinstance(node.right, BinOp) and _PRECEDENCE[node.right.op] <= mine:
        right = f"({right})"
    return f"{left} {node.op} {right}"


def names_in(node: Expr) -> frozenset[str]:
    """Every name the expression refers to."""
    if isinstance(node, Num):
        return frozenset()
    if isinstance(node, Name):
        return frozenset({node.name})
    return names_in(node.left) | names_in(node.right)


def _show(value: Value) -> str:
    if isinstance(value, int):
        return str(value)
    return np.array2string(np.asarray(value), threshold=6)


def check_names(node: Expr, known: Collection[str]) -> None:
    """Raise `ExprError`, in `evaluate`'s words, for the first name in `node` (in sorted
    order) that is not `known`: an expression's names checked before there are values."""
    for name in sorted(names_in(node)):
        if name not in known:
            raise ExprError(_unknown(name, known))


def _unknown(name: str, known: Collection[str]) -> str:
    return f"unknown name {name!r} (known: {', '.join(sorted(known))})"


def evaluate(node: Expr, names: Mapping[str, Value]) -> Value:
    """Evaluate over plain ints or numpy integer arrays (elementwise, broadcasting).

    Raises `ExprError` for an unknown name, a division by zero or a ``/`` that leaves a
    remainder (for arrays: in any element).
    """
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Name):
        if node.name not in names:
            raise ExprError(_unknown(node.name, names))
        return names[node.name]
    left = evaluate(node.left, names)
    right = evaluate(node.right, names)
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    if np.any(np.asarray(right) == 0):
        # "seq / (tp - 2) divides by zero (tp - 2 = 0)"; a written 0 needs no sum
        shown = "" if unparse(node.right) == "0" else f" ({unparse(node.right)} = 0)"
        raise ExprError(f"{unparse(node)} divides by zero{shown}")
    if node.op == "/" and np.any(np.asarray(left % right) != 0):
        raise ExprError(f"{unparse(node)} = {_show(left)} / {_show(right)} does not divide evenly")
    return left // right


Checked = tuple[Value, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]


def evaluate_each(node: Expr, names: Mapping[str, Value]) -> Checked:
    """`evaluate` element by element, where a sweep's names are arrays: the values; where
    no division was by zero; and where, besides, every ``/`` divided evenly. An element that
    did not evaluate holds a number of no meaning. An unknown name still raises. Names given
    as object arrays of Python integers are counted without wrapping, the divisions too."""
    if isinstance(node, Num | Name):
        return evaluate(node, names), np.array(True), np.array(True)
    left, left_defined, left_even = evaluate_each(node.left, names)
    right, right_defined, right_even = evaluate_each(node.right, names)
    defined, even = left_defined & right_defined, left_even & right_even
    if node.op == "+":
        return left + right, defined, even
    if node.op == "-":
        return left - right, defined, even
    if node.op == "*":
        return left * right, defined, even
    # a Python int (a product of literals) kept as one: np.where would make it int64
    right = np.asarray(right, dtype=object) if isinstance(right, int) else right
    zero = np.asarray(right) == 0
    divisor = np.where(zero, 1, right)
    defined = defined & ~zero
    if node.op == "/":
        even = even & (np.asarray(left % divisor) == 0)
    return left // divisor, defined, even
