"""Read a plan's YAML into plain data, remembering where every value sat in the file.

The tree is built from PyYAML's *event stream* rather than its composer, for three reasons:

- positions: every key and value gets a ``(line, col)`` mark (1-based) under its JSON path
  (``$.parallel.tp``, ``$.topology.levels[0].size``), so later errors can point at it;
- safety: the composer is recursive (10,000 nested ``[`` exhaust Python's stack) and expands
  aliases (a "billion laughs" file grows exponentially). Here nesting depth is checked as
  each collection opens and the node count is capped, so a hostile file stops at the first
  event past either; aliases are never expanded (each stands as nothing: the first is
  reported with the count of the rest) and a value under a tag a plan may not use is never
  constructed, so both are problems of the file and reading goes on to find the others;
- strictness: duplicate keys are errors, only the standard YAML scalar tags are accepted,
  numbers must be finite and fit in 64 bits, and written in decimal: YAML 1.1's octal
  (``012`` is 10), hexadecimal, binary and base-60 (``1:30`` is 90) forms are refused, as
  are digits with a leading zero it leaves as text (``02048``).

Scalars are resolved with the safe loader's own resolver and constructors (YAML 1.1, as
PyYAML), plus YAML 1.2's exponent floats (``1e9``, ``1.5e9``), which PyYAML would otherwise
leave as strings; a scalar of over 64 characters is resolved to the same tag by string
methods (`_long_tag`), as the resolver's patterns took seconds on a value of megabytes.
The libyaml parser is used when PyYAML was built with it; its marks are the same as the
pure-Python parser's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml
from yaml.nodes import ScalarNode

from budget.errors import Problem
from budget.units import MAX_INT

__all__ = [
    "MAX_DEPTH",
    "MAX_INT",
    "MAX_KEY",
    "MAX_NODES",
    "MAX_PATH",
    "Loaded",
    "Marks",
    "child_path",
    "decode",
    "load_yaml",
]

MAX_DEPTH = 64  # a plan nests four levels deep; 64 leaves room and stops stack attacks
MAX_NODES = 20_000  # a plan has a few hundred values; per-layer lists hold up to 4,096 each
# MAX_INT (2**63): integers beyond int64 are typos or attacks, not plan dimensions; it is
# defined beside the unit parsers, which bound a size with a unit ("1e30 B") by it too
# Every value keeps its JSON path (`Marks`), so key length times depth times values is
# memory: a 113 KB file of 62 nested 1,000-character keys over 5,000 values took 633 MB.
# A plan's keys are names of under 20 characters and its deepest path under 60.
MAX_KEY = 128
MAX_PATH = 512

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STANDARD = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_STANDARD + name for name in ("str", "int", "float", "bool", "null", "map", "seq")}
_KEEP_AS_TEXT = {_STANDARD + name for name in ("timestamp", "binary", "merge", "value")}
# YAML 1.2 core schema floats that PyYAML's YAML 1.1 resolver leaves as strings ("1e9").
_FLOAT_12 = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# YAML 1.1 reads 012 as octal 10, 0x10 as 16, 0b10 as 2 and 1:30 as 90 (base 60); a plan's
# numbers are decimal, so these are refused, as are digits with a leading zero that are
# not octal (02048), which YAML 1.1 leaves as text
_DECIMAL_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$")
# digits grouped by thousands (16_384); YAML 1.1 drops every underscore, so 2_4 reads 24
_GROUPED_INT = re.compile(r"^[-+]?[1-9][0-9]{0,2}(?:_[0-9]{3})+$")
# and a float's whole part likewise (1_000.5, !!float 1_000), its fraction and exponent
# without any
_GROUPED_FLOAT = re.compile(
    r"^[-+]?[1-9][0-9]{0,2}(?:_[0-9]{3})+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?$"
)
_NOT_DECIMAL = (
    (re.compile(r"^[-+]?0x"), "hexadecimal"),
    (re.compile(r"^[-+]?0b"), "binary"),
    (re.compile(r":"), "base-60"),
    (re.compile(r"^[-+]?0[0-9_oO]"), "octal"),  # 012, and Python's 0o12 under !!int
)
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")
# said of the file beside the plan it holds, which is checked on as a whole
SECOND_DOCUMENT = "a plan is one YAML document; found a second one"
# A number with a colon longer than this is refused unbuilt (`_Builder.scalar`); shorter,
# it has at most 32 places, which PyYAML builds at once, so the message can say its value.
# A plain scalar longer than this is also resolved by `_long_tag`, not PyYAML's resolver.
_SHORT = 64
# PyYAML's YAML 1.1 int and float forms (yaml/resolver.py) less their base-60 ones, which
# `_base_60` reads: a pattern's repeated group, `(?::[0-5]?[0-9])+`, matched an 8 MiB
# base-60 number in 1 s and 570 MB, and gave 8 MiB of digits back place by place in 0.7 s.
# Their runs are possessive (`*+`, `++`: what follows a run is never in its class, so giving
# characters back never matches): an 8 MiB float whose exponent lacks its sign ("1.000…e5")
# backtracked through every digit, 0.5 s (an audit)
_INT_11 = re.compile(
    r"^(?:[-+]?0b[0-1_]++|[-+]?0[0-7_]++|[-+]?(?:0|[1-9][0-9_]*+)|[-+]?0x[0-9a-fA-F_]++)$"
)
_FLOAT_11 = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*+)\.[0-9_]*+(?:[eE][-+][0-9]++)?"
    r"|\.[0-9][0-9_]*+(?:[eE][-+][0-9]++)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
# a base-60 number's parts, each one character class: head:places.fraction
_HEAD_60 = re.compile(r"[-+]?[0-9][0-9_]*")
_PLACES_60 = re.compile(r"[0-9_:]+")
_FRACTION_60 = re.compile(r"[0-9_]*")
# a YAML 1.1 place is [0-5]?[0-9]: its digits as 'a' (0-5) and 'b' (6-9), it is a, b, aa
# or ab, so a run of letters holding ba, bb, aaa or aab is no place
_PLACE_DIGITS = str.maketrans("0123456789", "aaaaaabbbb")
_NO_PLACE = ("ba", "bb", "aaa", "aab")

Position = tuple[int, int]


def child_path(parent: str, key: str | int) -> str:
    """The JSON path of a child: ``$.model`` + ``"layers"`` → ``$.model.layers``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{parent}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{parent}['{escaped}']"


# a value under a merge key (`<<: *base`, `<<: [*a, *b]`), which the schema refuses
_MERGED = re.compile(r"\['<<'\](\[[0-9]+\])?$")
# YAML aliases a file's problems list one by one, each where it is; the rest are counted
ALIASES_LISTED = 20


@dataclass(frozen=True, slots=True)
class Marks:
    """Where each node of a loaded tree sat: JSON path → (line, col), both 1-based.

    ``nodes`` holds, for a scalar, the position of the value and, for a mapping or a list,
    the position of the key that introduces it (where a reader looks for it); ``keys`` holds
    the position of each mapping key.
    """

    nodes: dict[str, Position] = field(default_factory=dict)
    keys: dict[str, Position] = field(default_factory=dict)
    # the paths of keys written in a flow mapping ({global: 1,024} reads a key '024')
    flow_keys: set[str] = field(default_factory=set)
    # a scalar's text where it reads otherwise, which messages quote as written: a number
    # written otherwise than it prints (8.000000000000001 reads as 8.000000000000002, 1e-5
    # prints 1e-05), or a value refused, which None stands for (`_Builder.scalar`)
    written: dict[str, str] = field(default_factory=dict)

    def at(self, path: str) -> Position:
        """The position of the node at `path`, or of its nearest known ancestor."""
        return _lookup(self.nodes, path)

    def key(self, path: str) -> Position:
        """The position of the key of the node at `path` (for unknown or duplicate keys)."""
        if path in self.keys:
            return self.keys[path]
        return _lookup(self.nodes, path)


def _lookup(table: dict[str, Position], path: str) -> Position:
    for held in ancestors(path):
        if held in table:
            return table[held]
    return table.get("$", (1, 1))


def ancestors(path: str) -> Iterator[str]:
    """`path` and each path above it, nearest first: $.a.b[0], $.a.b, $.a (the root, $,
    is not yielded)."""
    while path:
        yield path
        cut = max(path.rfind("."), path.rfind("["))
        if cut <= 0:
            return
        path = path[:cut]


@dataclass(frozen=True, slots=True)
class Loaded:
    """The result of reading a plan: the tree (None if unusable), its marks and problems."""

    tree: Any
    marks: Marks
    problems: tuple[Problem, ...]
    # paths whose value was refused and stands as None in the tree (a number too large or
    # not finite), so that the schema's complaint about that None is not said twice
    refused: frozenset[str] = frozenset()
    # where a cap stopped the reading (`_Builder.stop`): what was read before it, and the
    # paths of the collections still open there, which it left unfinished (`_Builder.read`)
    partial: Any = None
    unfinished: frozenset[str] = frozenset()


def decode(data: bytes, file: str) -> tuple[str | None, Problem | None]:
    """Decode UTF-8 strictly (a leading BOM is dropped); on failure, say where the bad byte is."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        start = error.start
        # the lines as YAML counts them, a lone CR a break too, as the other errors do (an
        # audit: a CR-only file's bad byte was put at 1:1011 for 14:11)
        lines = _LINE_BREAK.split(data[:start].decode("utf-8").removeprefix("\ufeff"))
        bad = data[start : start + 1].hex()
        message = f"the file is not UTF-8: byte 0x{bad} at offset {start} cannot be decoded"
        return None, Problem(file, len(lines), len(lines[-1]) + 1, "$", message)
    text = text.removeprefix("\ufeff")
    hidden = _HIDDEN_BREAK.search(text)
    if hidden:
        before = _LINE_BREAK.split(text[: hidden.start()])
        name = _HIDDEN_BREAKS[hidden.group()]
        message = (
            f"the file holds {name}, which YAML reads as a line break and editors do not "
            "show, so every line after it would be misnumbered; delete it"
        )
        return None, Problem(file, len(before), len(before[-1]) + 1, "$", message)
    return text, None


# Line breaks to YAML 1.1 but not to editors, grep or git (PyYAML's reader counts them)
_HIDDEN_BREAKS = {
    "\x85": "U+0085 (next line)",
    "\u2028": "U+2028 (line separator)",
    "\u2029": "U+2029 (paragraph separator)",
}
_HIDDEN_BREAK = re.compile("[\x85\u2028\u2029]")
_LINE_BREAK = re.compile("\r\n|\r|\n")


class _Stop(Exception):
    """Raised inside the builder when the input must not be read any further."""


@dataclass(slots=True)
class _Frame:
    container: dict[str, Any] | list[Any]
    path: str
    key: str | None = None  # mappings: the key waiting for its value
    key_mark: Position = (1, 1)
    first_seen: dict[str, int] = field(default_factory=dict)  # key → line of first use
    refused: bool = False  # a collection under a tag a plan may not use: read, then dropped
    discard: bool = False  # mappings: the value waiting is a collection key's, to be dropped
    start: Position = (1, 1)  # where the collection starts
    flow: bool = False  # written in flow style, {...} or [...]


class _Builder:
    """Turns PyYAML events into plain dicts/lists/scalars and a `Marks` table."""

    def __init__(self, loader: yaml.SafeLoader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.marks = Marks()
        self.problems: list[Problem] = []
        self.stack: list[_Frame] = []
        self.root: Any = None
        self.nodes = 0
        self.documents = 0
        self.refused: set[str] = set()
        self.second = False  # reading stopped at a second document, the first read whole
        # aliases met: each of the first ALIASES_LISTED reported where it is, the count of
        # the rest with the last of those (an audit: the second of two had no line of its
        # own; a review: 200 listed hid, past the problems shown, where reading stopped)
        self.aliases = 0
        self.last_alias = -1  # that one's index in `problems`
        self.stopped = False  # reading stopped before the end of the file

    def problem(self, position: Position, path: str, message: str, ends: bool = False) -> None:
        """A problem at `position`; `ends` where the file is read no further."""
        problem = Problem(self.file, position[0], position[1], path, message, ends=ends)
        self.problems.append(problem)

    def stop(self, position: Position, path: str, message: str) -> _Stop:
        self.problem(position, path, message, ends=True)
        self.stopped = True
        return _Stop()

    @property
    def path(self) -> str:
        return self.stack[-1].path if self.stack else "$"

    def read(self) -> Loaded:
        """What a cap's stop (`stop`) leaves: the problems, and the mapping read before it,
        each collection still open put in its place as far as it was read, so that the
        problems of the values before the stop are said with it (an audit: a 129-character
        key on line 48 hid a bad `layers` on line 17). The open collections' own paths come
        with it: unfinished, they cannot be told what they lack."""
        problems = tuple(self.problems)
        root = self.stack[0] if self.stack else None
        if root is None or root.refused or not isinstance(root.container, dict):
            return Loaded(None, self.marks, problems)
        if "mode" not in root.container:  # every section's rules read it: a serving plan's
            # batch would be checked as a training one's (a review: `mode: decode` written
            # last, after the stop, drew six false problems)
            return Loaded(None, self.marks, problems)
        for child, parent in zip(self.stack[:0:-1], self.stack[-2::-1], strict=True):
            if child.refused or parent.discard:
                continue
            if isinstance(parent.container, list):
                parent.container.append(child.container)
            elif parent.key is not None and parent.key not in parent.container:
                parent.container[parent.key] = child.container
        unfinished = frozenset(frame.path for frame in self.stack)
        refused = frozenset(self.refused)
        return Loaded(None, self.marks, problems, refused, self.stack[0].container, unfinished)

    def run(self) -> None:
        loader = self.loader
        try:
            while loader.check_event():
                self.feed(loader.get_event())  # type: ignore[no-untyped-call]
        except yaml.YAMLError:
            self.stopped = True  # a syntax error ends the reading too (a review)
            raise
        finally:
            if self.aliases > ALIASES_LISTED:  # a bomb has thousands: counted, not listed
                last = self.problems[self.last_alias]
                more = self.aliases - ALIASES_LISTED
                where = "before reading stopped" if self.stopped else "in the file"
                self.problems[self.last_alias] = replace(
                    last, message=f"{last.message} ({more:,} more {where})"
                )

    def feed(self, event: yaml.Event) -> None:
        mark = event.start_mark
        where = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                self.second = True  # the first was read whole: its problems are said too
                raise self.stop(where, "$", SECOND_DOCUMENT)
        elif isinstance(event, yaml.AliasEvent):
            # never expanded, so one problem of the file and not the end of reading it
            self.count(where)
            path = self.value_path()
            self.marks.nodes.setdefault(path, where)
            # the merge key an alias is the value of is refused once, for what it is (a user
            # audit, m413: `<<: *base` read as two mistakes, the merge and the alias)
            merged = _MERGED.search(path) is not None
            self.aliases += 0 if merged else 1
            if self.aliases <= ALIASES_LISTED and not merged:
                self.last_alias = len(self.problems)
                message = f"YAML aliases (*{event.anchor}) are not allowed in a plan; "
                self.problem(where, path, message + "write the value out")
            self.refused.add(path)
            self.attach(None)
        elif isinstance(event, yaml.ScalarEvent):
            self.count(where)
            frame = self.stack[-1] if self.stack else None
            if frame is not None and isinstance(frame.container, dict) and frame.key is None:
                self.take_key(frame, event, where)
            else:
                path = self.value_path()
                self.marks.nodes.setdefault(path, where)  # a duplicate key keeps the first place
                self.attach(self.scalar(event, where, path))
        elif isinstance(event, yaml.CollectionStartEvent):
            self.count(where)
            path = self.value_path()
            if len(self.stack) >= MAX_DEPTH:
                raise self.stop(where, path, f"nesting deeper than {MAX_DEPTH} levels")
            refused = self.refuses_tag(
                event.tag, where, path, isinstance(event, yaml.MappingStartEvent)
            )
            self.marks.nodes.setdefault(path, self.introducer(where))
            container: dict[str, Any] | list[Any] = (
                {} if isinstance(event, yaml.MappingStartEvent) else []
            )
            flow = bool(event.flow_style)
            self.stack.append(_Frame(container, path, refused=refused, start=where, flow=flow))
        elif isinstance(event, yaml.CollectionEndEvent):
            frame = self.stack.pop()
            self.attach(None if frame.refused else frame.container, frame.start)

    def count(self, where: Position) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.stop(where, self.path, f"more than {MAX_NODES:,} values; a plan is small")

    def introducer(self, where: Position) -> Position:
        """A collection is best pointed at by the key that introduces it, if any."""
        frame = self.stack[-1] if self.stack else None
        if frame is not None and isinstance(frame.container, dict) and frame.key is not None:
            return frame.key_mark
        return where

    def value_path(self) -> str:
        """The path the next value will have."""
        if not self.stack:
            return "$"
        frame = self.stack[-1]
        if isinstance(frame.container, dict):
            return child_path(frame.path, frame.key if frame.key is not None else "")
        return child_path(frame.path, len(frame.container))

    def take_key(self, frame: _Frame, event: yaml.ScalarEvent, where: Position) -> None:
        if len(event.value) > MAX_KEY:
            shown = child_path(frame.path, _shown(event.value))
            size = f"{len(event.value):,}"
            raise self.stop(where, shown, f"a key of {size} characters; a plan's keys are names")
        path = child_path(frame.path, event.value)
        if len(path) > MAX_PATH:
            message = f"a path of over {MAX_PATH} characters; a plan nests a few short names"
            raise self.stop(where, frame.path[:60] + "...", message)
        if event.tag not in (None, "!", _STANDARD + "str"):
            self.problem(where, path, f"a key cannot carry the tag {_short(event.tag)}")
        if event.value in frame.first_seen:
            line = frame.first_seen[event.value]
            self.problem(
                where, path, f"duplicate key {event.value!r} (first defined on line {line})"
            )
        else:
            frame.first_seen[event.value] = where[0]
            self.marks.keys[path] = where
            if frame.flow:
                self.marks.flow_keys.add(path)
        frame.key = event.value
        frame.key_mark = where

    def attach(self, value: Any, start: Position | None = None) -> None:
        """Put `value` (a collection's where it starts at `start`) in its container."""
        if not self.stack:
            self.root = value
            return
        frame = self.stack[-1]
        if isinstance(frame.container, list):
            frame.container.append(value)
            return
        if frame.key is None:  # a mapping or a list used as a key: its value is read for the
            # problems in it and dropped, and the file read on (an audit: the problems after
            # it went unsaid), each at its own place (an audit: at the first such key's, or at
            # an empty key's value, and a second said at the same place went unsaid)
            where = start or self.marks.nodes.get(self.value_path(), (1, 1))
            self.problem(where, frame.path, "mapping keys must be plain names")
            frame.key, frame.discard = "?", True
            return
        if frame.discard:
            frame.key, frame.discard = None, False
            return
        if frame.key not in frame.container:  # duplicates keep the first value
            frame.container[frame.key] = value
        frame.key = None

    def refuses_tag(self, tag: str | None, where: Position, path: str, mapping: bool) -> bool:
        """Whether a collection's tag is one a plan may not use: a problem, and the
        collection is read (for the problems after it) and then stands as nothing."""
        if tag in (None, "!") or tag == _STANDARD + ("map" if mapping else "seq"):
            return False
        self.refuse(where, path, _tag_message(tag))
        return True

    def scalar(self, event: yaml.ScalarEvent, where: Position, path: str) -> Any:
        """The value of a scalar (`_scalar`), its text kept for the messages that quote it
        where it reads otherwise (`Marks.written`): a number written otherwise than it prints
        (8.000000000000001, 1e-5, 2.50), or one refused, which None stands for (an audit,
        m495: `[.inf, 2]` was quoted as [None, 2]). Not a duplicate key's, whose value is
        not kept."""
        value = self._scalar(event, where, path)
        first = self.marks.nodes.get(path) == where
        stood = value is None and path in self.refused
        if first and (stood or _written_otherwise(event.value, value)):
            self.marks.written[path] = _shown(event.value)
        return value

    def _scalar(self, event: yaml.ScalarEvent, where: Position, path: str) -> Any:
        tag = event.tag
        implicit = tag in (None, "!")
        if implicit and len(event.value) > _SHORT:  # PyYAML's patterns take seconds on MiBs
            tag = _long_tag(event.value, plain=event.implicit[0])
        elif implicit:
            tag = self.loader.resolve(  # type: ignore[no-untyped-call]
                ScalarNode, event.value, event.implicit
            )
        elif tag not in _ALLOWED_TAGS:  # nothing is constructed: one problem, reading goes on
            return self.refuse(where, path, _tag_message(tag))
        text = event.value
        if implicit and tag in _KEEP_AS_TEXT:
            return text
        plain = implicit and event.style in ("", None)
        if plain and tag == _STANDARD + "str" and _FLOAT_12.match(text):
            tag = _STANDARD + "float"
        numeric = tag in (_STANDARD + "int", _STANDARD + "float")
        if numeric and ":" in text and len(text) > _SHORT:
            # YAML 1.1's base 60: PyYAML builds the number place by place, in time quadratic
            # in its length (200,000 places took 12 s), so a long one is never built
            return self.refuse(where, path, _long_base_60(text, tag, resolved=implicit))
        node = ScalarNode(tag, text, None, None, event.style)
        try:
            value = self.loader.construct_object(node, deep=True)
        except Exception:  # PyYAML's constructors raise KeyError and IndexError too
            # `!!bool maybe` was a KeyError and `!!int ""` an IndexError, each a traceback
            digits = len(text) - text.count("_") - text.startswith(("-", "+"))
            if tag == _STANDARD + "int" and digits > 18 and _DECIMAL_INT.match(text):
                # Python refuses to read integers of over 4,300 digits: too large, not malformed
                message = f"an integer of {digits:,} digits; plan numbers are below 2^63"
            else:
                message = f"{_shown(text)!r} is not a valid {_short(tag)[2:]}"
            # one problem of the file, as a number too large is, not the end of reading it
            return self.refuse(where, path, message)
        int_form = tag == _STANDARD + "int" and not _DECIMAL_INT.match(text)
        # base 60 also under a tag (`!!int 1:30`): a long one is refused unbuilt above
        # under an explicit !!int too (an audit: `!!int 0140` read as 96 and `!!int 0x60`
        # as 96, where the plain forms are refused)
        if int_form or (numeric and ":" in text):
            # what the tag reads beyond YAML's forms: Python's int() takes other digits
            # (!!int ٩٦, full-width ９６), a review found them a traceback
            kind = next((k for pattern, k in _NOT_DECIMAL if pattern.search(text)), "non-ASCII")
            # past 2^63 the value is refused anyway; Python cannot even print one of 4,300
            # digits (a hexadecimal literal of 5,000 digits was a traceback)
            big = isinstance(value, int) and abs(value) >= MAX_INT
            article = "an" if kind[0] in "aeiou" else "a"
            number = f"{article} {kind} number of {value.bit_length():,} bits" if big else value
            return self.refuse(
                where,
                path,
                f"{_shown(text)} is read by YAML 1.1 as the {kind} number {number}; write "
                "numbers in decimal (or quote it, if it is text)"
                if not big
                else f"{_shown(text)} is read by YAML 1.1 as {number}; plan numbers are "
                "decimal and below 2^63",
            )
        if tag == _STANDARD + "int" and "_" in text and not _GROUPED_INT.match(text):
            grouped = f", or group the digits by thousands ({value:_})" if abs(value) > 999 else ""
            return self.refuse(
                where,
                path,
                f"{_shown(text)} is read by YAML 1.1 as {value}, every underscore dropped; "
                f"write {value}{grouped}",
            )
        if plain and tag == _STANDARD + "str" and _LEADING_ZERO.match(text):
            return self.refuse(
                where,
                path,
                f"{_shown(text)} has a leading zero, which YAML 1.1 reads as neither a "
                f"decimal nor an octal number; write {text.lstrip('+-0') or '0'} (or quote "
                "it, if it is text)",
            )
        # a number past these bounds is one problem of the file, not the end of reading it:
        # it stands as None, and the file's other problems are still found
        if isinstance(value, float) and not math.isfinite(value):
            return self.refuse(where, path, f"{_shown(text)} is not a finite number")
        if tag == _STANDARD + "float" and not text.isascii():
            # Python's float() takes other digits too (!!float ９６), as int() does above
            return self.refuse(
                where,
                path,
                f"{_shown(text)} is read by YAML 1.1 as the non-ASCII number {value!r}; write "
                "numbers in decimal (or quote it, if it is text)",
            )
        if tag == _STANDARD + "float" and "_" in text and not _GROUPED_FLOAT.match(text):
            # as for an integer: 1_6.0 read as 16.0 (an audit)
            return self.refuse(
                where,
                path,
                f"{_shown(text)} is read by YAML 1.1 as {value!r}, every underscore dropped; "
                f"write {value!r}",
            )
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
            return self.refuse(
                where, path, f"{_shown(text)} is too large (integers must be below 2**63)"
            )
        lost = rounded_away(text, value) if isinstance(value, float) else None
        if lost is not None:
            return self.refuse(where, path, f"{_shown(text)} is {lost}")
        return value

    def refuse(self, where: Position, path: str, message: str) -> None:
        self.problem(where, path, message)
        self.refused.add(path)


def _written_otherwise(text: str, value: Any) -> bool:
    """Whether the number `value` prints otherwise than the author wrote it: with more
    digits than a 64-bit float keeps (8.000000000000001 prints 8.000000000000002), or in
    another form (1e-5 prints 1e-05, 2.50 2.5, 1_000 1000). Not true, false or null, which
    messages say as YAML read them, beside how an unquoted yes reads."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return text.strip() != repr(value)


def rounded_away(text: str, value: float) -> str | None:
    """Why the 64-bit float `value` read from the decimal `text` (a plan's YAML, a
    ``config.json``) is not the number written, where the rounding changes what it is: a
    nonzero number read as 0, or a fraction read as a whole number (an audit, m447:
    `tp: 0.99999999999999999` ran at tp 1, and `tp: 1e-400` was told that "0.0" is below
    the minimum); None where it is not. Said after "<text> is"."""
    try:
        exact = Decimal(text.replace("_", ""))
    except InvalidOperation:
        return None
    if not exact.is_finite():
        return None
    if value == 0 and exact != 0:
        return "too small for a 64-bit float, which reads it as 0; write 0 if zero is meant"
    if value.is_integer() and exact != exact.to_integral_value():
        return (
            "not a whole number, but has more digits than a 64-bit float keeps and reads as "
            f"{value!r}; write {int(value)} if that is meant"
        )
    return None


def _long_tag(text: str, plain: bool) -> str:
    """The tag PyYAML's resolver gives a scalar longer than `_SHORT`, found without its
    patterns (`_INT_11`). Of its other forms only a timestamp can be as long, and it is kept
    as text, as a string is, so it reads as a string."""
    if not plain:
        return _STANDARD + "str"
    if _FLOAT_11.match(text):
        return _STANDARD + "float"
    if _INT_11.match(text):
        return _STANDARD + "int"
    parts = _base_60(text)
    if parts is None or "_" in parts[1]:
        return _STANDARD + "str"
    head, places, fraction = parts
    letters = places.translate(_PLACE_DIGITS)
    if any(run in letters for run in _NO_PLACE):
        return _STANDARD + "str"
    if fraction is not None:  # [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        return _STANDARD + "float"
    # [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+: 0:30 is text
    return _STANDARD + ("str" if head.lstrip("+-").startswith("0") else "int")


def _base_60(text: str) -> tuple[str, str, str | None] | None:
    """A base-60 number's head, places and fraction (``-1:30:15.5`` → ``-1``, ``30:15``,
    ``5``), or None: ``[-+]?[0-9][0-9_]*(?::[0-9_]+)+(?:\\.[0-9_]*)?``, the YAML 1.1
    resolver's forms and an explicit tag's, read part by part with string methods (that
    pattern's repeated group took 0.6 s and hundreds of MB on 8 MiB)."""
    head, _, rest = text.partition(":")
    places, dot, fraction = rest.partition(".")
    if not (_HEAD_60.fullmatch(head) and _PLACES_60.fullmatch(places)):
        return None
    if not _FRACTION_60.fullmatch(fraction) or "::" in places:
        return None
    if places.startswith(":") or places.endswith(":"):
        return None
    return head, places, fraction if dot else None


def _long_base_60(text: str, tag: str, resolved: bool) -> str:
    """What to say of a number with a colon too long to build (`_SHORT`); `resolved`: the
    resolver read it as base 60 (`_long_tag`), not a tag."""
    if not resolved and _base_60(text) is None:  # `!!int "1:x..."`: no number either
        return f"{_shown(text)!r} is not a valid {_short(tag)[2:]}"
    places = text.count(":") + 1
    return (
        f"{_shown(text)} is read by YAML 1.1 as a base-60 number of {places:,} places; write "
        "numbers in decimal (or quote it, if it is text)"
    )


def _shown(text: str) -> str:
    return text if len(text) <= 30 else text[:27] + "..."


def _short(tag: str | None) -> str:
    if tag is None:
        return "(none)"
    return "!!" + tag[len(_STANDARD) :] if tag.startswith(_STANDARD) else tag


def _tag_message(tag: str | None) -> str:
    return (
        f"the tag {_short(tag)} is not allowed in a plan; use plain YAML values "
        "(strings, numbers, booleans, lists and mappings)"
    )


def load_yaml(text: str, file: str) -> Loaded:
    """Parse one YAML document into plain data with marks; never raises on bad input.

    Problems (syntax errors, duplicate keys, refused constructs) come back in `Loaded`;
    when the tree cannot be trusted, ``Loaded.tree`` is None.
    """
    text, directives = _tag_directives(text, file)
    try:
        loader = _Loader(text)
    except yaml.YAMLError as error:  # the pure-Python reader checks characters up front
        line, col = _reader_position(error, text, in_bytes=False)
        message = f"invalid YAML: {_reader_text(error)}"
        return Loaded(None, Marks(), (*directives, Problem(file, line, col, "$", message)))
    builder = _Builder(loader, file)
    builder.problems += directives
    try:
        builder.run()
    except _Stop:
        if not builder.second:
            return builder.read()
        # the plan before it is whole: checked on below, so that every problem of the file
        # is said at once (an audit: a bad layers and a bad tp went unsaid beside it)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        what = error.problem or error.context or "unreadable"
        if "nesting depth" in what:  # libyaml's own limit (1,000), reached while scanning ahead
            end = mark.index if mark is not None else 0
            builder.problem(
                _too_deep(text, end) or where,
                builder.path,
                f"nesting deeper than {MAX_DEPTH} levels",
                ends=True,
            )
            # a cap as the builder's own is: what was read before it is said with it (a
            # review: past 1,000 brackets a bad `layers` above went unsaid)
            return builder.read()
        elif glued := _glued_keys(text, where[0]):
            for i, (where, path, message) in enumerate(glued, 1):
                builder.problem(where, path, message, ends=i == len(glued))
        elif (long := _long_key(text, *where)) is not None:
            # a block key past PyYAML's 1,024 characters of a simple key fails its scanner
            # ("mapping values are not allowed"): said as the builder says a long key (an
            # audit, m526: at "$" with the scanner's words, where 129 to 1,024 read so)
            start, key = long
            lines = text.splitlines()
            parent = _path_to(lines, start[0], "key").rsplit(".", 1)[0]
            row = lines[start[0] - 1]
            if row.lstrip(" ").startswith("- "):  # a list item's first key: its index
                indent = len(row) - len(row.lstrip(" "))
                index = 0
                for above in reversed(lines[: start[0] - 1]):
                    lead = len(above) - len(above.lstrip(" "))
                    if above.strip() and lead < indent:
                        break
                    index += lead == indent and above.lstrip(" ").startswith("- ")
                parent = child_path(parent, index)
            shown = child_path(parent, _shown(key))
            size = f"{len(key):,}"
            message = f"a key of {size} characters; a plan's keys are names"
            builder.problem(start, shown, message, ends=True)
        elif _tab_indented(text, *where):  # PyYAML's words never say "tab" (an audit)
            message = "invalid YAML: a tab indents this line; YAML indents with spaces only"
            builder.problem((where[0], 1), builder.path, message, ends=True)
        else:
            message = f"invalid YAML: {what}{_context(error)}"
            builder.problem(where, builder.path, message, ends=True)
        return Loaded(None, builder.marks, tuple(builder.problems))
    except yaml.YAMLError as error:  # ReaderError: characters YAML does not allow
        where = _reader_position(error, text, in_bytes=_Loader is not yaml.SafeLoader)
        builder.problem(where, "$", f"invalid YAML: {_reader_text(error)}", ends=True)
        return Loaded(None, builder.marks, tuple(builder.problems))
    except RecursionError:  # defensive: the builder is iterative, but a parser might not be
        builder.problem((1, 1), "$", f"nesting deeper than {MAX_DEPTH} levels", ends=True)
        return Loaded(None, builder.marks, tuple(builder.problems))
    finally:
        loader.dispose()
    root = builder.root
    if root is None and "$" in builder.refused:  # the whole file was refused (a tag): said
        return Loaded(None, builder.marks, tuple(builder.problems))
    if not isinstance(root, dict):
        kind = "nothing" if root is None else f"a {_kind(root)}"
        builder.problem(
            builder.marks.at("$"),
            "$",
            f"a plan is a mapping of keys (name, model, batch, ...); this file holds {kind}",
        )
        return Loaded(None, builder.marks, tuple(builder.problems))
    if "$" not in builder.marks.nodes:
        builder.marks.nodes["$"] = (1, 1)
    return Loaded(root, builder.marks, tuple(builder.problems), frozenset(builder.refused))


# a %TAG directive: a line that starts with it, after a LF or a lone CR (both YAML breaks)
_TAG_DIRECTIVE = re.compile(r"(?:^|(?<=\r))%TAG[ \t]", re.MULTILINE)
_BREAKS = re.compile("(\r\n|\r|\n)")
_DOCUMENT_END = re.compile(r"\.\.\.(?:[ \t#]|$)")


def _tag_directives(text: str, file: str) -> tuple[str, tuple[Problem, ...]]:
    """Refuse %TAG directives before the parser reads them, and read on with each made a
    comment in place, so the file's other problems are said at the same positions. A plan
    takes no tags, so a directive declares nothing it can use; and libyaml checks each
    handle against every one before it, time quadratic in their number (an audit: 100,000
    of them, 2.7 MB, held the parser 14 s, 242,000 of them 3.5 minutes). A directive is a
    line of a document's prologue: before its content, at the stream's start or after a
    document's end (``...``); a line of a quoted string that starts so is text (a review)."""
    if _TAG_DIRECTIVE.search(text) is None:
        return text, ()
    pieces = _BREAKS.split(text)  # lines at the even indices, their breaks between
    prologue, found = True, []
    for i in range(0, len(pieces), 2):
        line = pieces[i]
        if not prologue:
            prologue = _DOCUMENT_END.match(line) is not None
        elif _TAG_DIRECTIVE.match(line):
            found.append(i // 2)
            pieces[i] = "#" + line[1:]
        elif not (line.startswith("%") or line.lstrip(" \t").startswith("#") or not line.strip()):
            prologue = False
    if not found:
        return text, ()
    more = f" (and {len(found) - 1:,} more)" if len(found) > 1 else ""
    message = (
        f"a %TAG directive is not allowed in a plan{more}: a plan takes no tags, so it "
        "declares nothing a plan can use; delete it"
    )
    return "".join(pieces), (Problem(file, found[0] + 1, 1, "$", message),)


def _tab_indented(text: str, line: int, column: int) -> bool:
    """Whether a tab is among the spaces that begin line `line` of `text` (1-based) and
    the error is found there, in the indentation: a tab elsewhere on the line, or one a
    flow collection or a quoted string allows before an error further on, is no cause
    (reviews: "\t@2" in a flow list, "\t\\q" in a quoted string)."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return False
    content = lines[line - 1]
    indent = content[: len(content) - len(content.lstrip(" \t"))]
    return "\t" in indent and column <= len(indent)


# a block mapping's key as a line starts it: its indent and one list item's dash, then the
# key's token (an anchor, a tag, the key plain or quoted, spaces before the colon)
_KEY_START = re.compile(r"(?P<lead> *(?:-[ ]+)?)(?P<token>(?:[&!]\S*[ ]+)*(?P<key>.*?)[ ]*)")
# PyYAML's scanner gives up on a simple key past this many characters (``scan_plain`` and
# its ``possible_simple_key``: "could not find expected ':'", or the next colon refused)
_SIMPLE_KEY = 1024


def _long_key(text: str, line: int, column: int) -> tuple[Position, str] | None:
    """Where a block mapping's key past PyYAML's simple-key limit starts on `line`
    (1-based; an anchor's, as the builder places a node), and the key (its quotes taken
    off), where the scanner stopped at its colon
    (`column`): None for any other error, a key under the limit, whose scan cannot fail so
    (a review, m537: a wrapped scalar's line of 199 characters was called a key), or a
    nested list's item."""
    lines = text.splitlines()
    if not 0 < line <= len(lines):
        return None
    head = lines[line - 1][: column - 1]
    found = _KEY_START.fullmatch(head)
    if found is None:
        return None
    # the scanner's limit runs from the token's start to the colon (a review, m542: a key
    # of 1,023 characters in quotes, 1,025 with them, was left to the scanner's words)
    if len(found["token"]) <= _SIMPLE_KEY:
        return None
    key = found["key"]
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":
        key = key[1:-1]
    if ":" in key or key.startswith(("- ", "-\t")):
        return None
    return (line, len(found["lead"]) + 1), key


def _context(error: yaml.MarkedYAMLError) -> str:
    """PyYAML's context, e.g. " (while parsing a flow mapping from line 21, column 7)"."""
    mark = error.context_mark
    if not error.context or not error.problem or mark is None:
        return ""
    return f" ({error.context} from line {mark.line + 1}, column {mark.column + 1})"


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string"


def _reader_position(error: yaml.YAMLError, text: str, in_bytes: bool) -> Position:
    """Where a character YAML does not allow is: libyaml (the C loader) gives its offset in
    the UTF-8 bytes it reads, PyYAML's own reader in characters (an audit: after a "×" in a
    comment, a control character on line 3 was put at 3:2, and after a header's "×" and
    "—" at 29:3 for 28:8). Lines are YAML's, a lone CR a break too (an audit: a CR-only
    file's control character on line 14 was put at 1:1010)."""
    position = getattr(error, "position", None)
    if not isinstance(position, int):
        return (1, 1)
    if in_bytes:
        position = len(text.encode("utf-8", "surrogatepass")[:position].decode("utf-8", "ignore"))
    lines = _LINE_BREAK.split(text[:position])
    return (len(lines), len(lines[-1]) + 1)


def _reader_text(error: yaml.YAMLError) -> str:
    character = getattr(error, "character", None)
    if isinstance(character, str):
        return f"the character {character!r} is not allowed"
    if isinstance(character, int):
        return f"the character {chr(character)!r} is not allowed"
    return str(error).splitlines()[0] if str(error) else "unreadable characters"


# a block mapping's key written against its value, as YAML reads one word: "seq:4096", or
# "tp:" then a no-break space, or "tp 2" with no colon at all
_GLUED = re.compile(
    r"^(?P<lead>\s*(?:- )?)(?P<key>[A-Za-z_][\w-]*)(?P<sep>:(?=[^\s:/])|:\u00a0| +(?=[^\s#:]))"
)
_PARENT = re.compile(r"^(?P<lead>\s*)(?P<key>[A-Za-z_][\w-]*):\s*(?:&\S+\s*)?(?:#.*)?$")
# a list item that opens a mapping ("    - name: nvlink"): its keys go on two columns in
_ITEM = re.compile(r"^(?P<lead>\s*)- (?:[A-Za-z_][\w-]*):")


def _glued_keys(text: str, line: int) -> list[tuple[Position, str, str]]:
    """Where a syntax error PyYAML reports at `line` (1-based) comes from keys glued to their
    values on that line or the three before it, the most common slip: each one's position,
    path and what to write, top to bottom (an audit: of two glued keys in a row only the
    second was said, the first a run later). PyYAML reads `seq:4096` as one word and fails on
    the next key ("mapping values are not allowed" one line below; "could not find expected
    ':'" under the wrong section, an audit). Only a line of a block mapping (the top level,
    or under a `key:` that opens one) is read so: text in a block scalar, a list item or a
    plain scalar's next line is not a key (a review: "  gpt 1.3b run" under `name: >-` was
    told to take a colon). Empty when no line there looks so."""
    lines = text.splitlines()
    glued = []
    for number in range(max(1, line - 3), min(line, len(lines)) + 1):
        found = _GLUED.match(lines[number - 1])
        if found is None or lines[number - 1].lstrip().startswith("#"):
            continue
        key, sep = found["key"], found["sep"]
        if not _in_mapping(lines, number) or (found["lead"].endswith("- ") and sep[0] != ":"):
            continue
        column = found.end("key") + 1
        if sep.startswith(":\u00a0"):
            why = (
                f"'{key}:' is followed by a no-break space (U+00A0), which YAML does not "
                "read as a space; type a plain one"
            )
        elif sep.startswith(":"):
            why = f"'{key}:' needs a space after the colon: YAML reads '{key}:…' as one word"
        else:
            why = f"'{key}' needs a colon after it: write '{key}: …'"
        glued.append(((number, column), _path_to(lines, number, key), f"invalid YAML: {why}"))
    return glued


def _in_mapping(lines: list[str], number: int) -> bool:
    """Whether line `number` (1-based) of block-style YAML sits in a block mapping: at the
    top level, or under a line that is only `key:` (the nearest above it less indented)."""
    own = lines[number - 1]
    indent = len(own) - len(own.lstrip())
    for above in reversed(lines[: number - 1]):
        stripped = above.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        if len(above) - len(stripped) < indent:
            item = _ITEM.match(above)
            return _PARENT.match(above) is not None or (
                item is not None and len(item["lead"]) + 2 == indent
            )
    return indent == 0


def _path_to(lines: list[str], number: int, key: str) -> str:
    """The path of `key` on line `number` (1-based) of block-style YAML, by its indentation
    and the keys above it that open a mapping (`batch:`, then `  seq`): `$.batch.seq`."""
    indent = len(lines[number - 1]) - len(lines[number - 1].lstrip())
    path = [key]
    items = 0  # the list items at `indent` - 2 above the line, while in a list
    for above in reversed(lines[: number - 1]):
        parent, item = _PARENT.match(above), _ITEM.match(above)
        if item and len(item["lead"]) + 2 == indent:
            items += 1  # the line's own item, then its siblings before it
            continue
        if parent and len(parent["lead"]) < indent:
            if items:
                path[-1] = f"[{items - 1}].{path[-1]}"
                items = 0
            path.append(parent["key"])
            indent = len(parent["lead"])
            if indent == 0:
                break
    return "$." + ".".join(reversed(path)).replace(".[", "[")


def _too_deep(text: str, end: int) -> Position | None:
    """Where, before offset `end`, a flow collection first opens past `MAX_DEPTH` levels:
    libyaml stops scanning at its own limit (1,000 brackets on), which an audit read as
    the place to look ("1:1003" for the 65th bracket at column 66). Quoted text (its
    escapes too), comments and a bracket inside a plain word ("a[[") are skipped; None
    when no bracket there goes so deep. A lone CR breaks a line as a LF does (an audit: a
    CR-only file's 65th bracket was put at 1:83 for 4:68)."""
    depth, quote, line, start, comment, escaped, word = 0, "", 1, 0, False, False, False
    for at, char in enumerate(text[:end]):
        if char == "\n" or (char == "\r" and text[at + 1 : at + 2] != "\n"):
            line, start, quote = line + 1, at + 1, quote if quote == '"' else ""
            comment = word = False
        elif comment:
            continue
        elif escaped:
            escaped = False
        elif quote == '"' and char == "\\":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (at == start or text[at - 1] in " \t"):
            comment = True
        elif char in " \t" or (char in ",:" and depth > 0):
            word = False  # in block context "a,[[" and "x:[[" are one plain word (a review)
        elif char == ":" and text[at + 1 : at + 2] in (" ", "\t", "\n", "\r", ""):
            word = False
        elif char in "]}" and depth > 0:  # in a flow collection it ends the word before it
            depth, word = depth - 1, False  # (a review: "{memory: 80 GiB}" left one open)
        elif word:  # "a[[": a plain word's brackets open nothing
            continue
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line, at - start + 1
        else:
            word = True
    return None
