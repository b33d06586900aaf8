"""Load a plan file: read (bounded), decode, parse with marks, validate, resolve.

This is the one entry point the CLI and the pipeline use. Every stage reports problems
rather than raising; `load_plan` raises one `BudgetError` carrying all of them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from budget.errors import BudgetError, Problem
from budget.files import STDIN_NAME
from budget.plan.model import Plan
from budget.plan.resolve import preset_problems, resolve, wrong_batch_keys
from budget.plan.schema import schema, validate_tree
from budget.plan.yaml_load import SECOND_DOCUMENT, Loaded, Marks, decode, load_yaml

__all__ = ["MAX_BYTES", "STDIN_NAME", "load_plan", "load_plan_data", "plan_name", "read_plan_bytes"]

MAX_BYTES = 2**20  # plans are a few kilobytes; 1 MiB is generous and bounds the work (m526)


def plan_name(path: Path) -> str:
    """The file name problems give: the path, or `STDIN_NAME` for ``-``."""
    return STDIN_NAME if str(path) == "-" else str(path)


def read_plan_bytes(path: Path) -> bytes:
    """The file's bytes, refusing anything over `MAX_BYTES` before reading it; ``-`` is
    standard input (whose hf_config paths are then relative to the working folder)."""
    file = plan_name(path)
    if file == STDIN_NAME:
        return _read_stdin()
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise _too_large(file, size)
        # opened without waiting: a named pipe no one writes to would block open() forever;
        # once open, a read of it ends at once (no writer is end of file), and a pipe a
        # writer holds (`budget <(...)`) reads as usual
        # (POSIX; Windows has no named pipes in the file system, nor O_NONBLOCK, and needs
        # O_BINARY for bytes as they are)
        waitless = getattr(os, "O_NONBLOCK", 0)
        descriptor = os.open(path, os.O_RDONLY | waitless | getattr(os, "O_BINARY", 0))
        if waitless:
            os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)  # devices and pipes report size 0
    except OSError as error:
        reason = error.strerror or type(error).__name__
        # line 1, column 1 as for the other whole-file problems: editors read 0:0 as no place
        raise BudgetError([Problem(file, 1, 1, "$", f"cannot read the plan: {reason}")]) from None
    if len(data) > MAX_BYTES:  # a device or a pipe: its size is not known, only that
        raise _too_large(file, None)  # it is more (an audit: /dev/zero "is 8,388,609 bytes")
    return data


# standard input holds one plan: a second `-` would read nothing. The stream read is kept
# (not a flag), so a caller that gives the process a new stdin (a test runner) reads again.
_stdin_taken: object = None


def _read_stdin() -> bytes:
    global _stdin_taken
    stdin = sys.stdin

    def problem(message: str) -> BudgetError:
        return BudgetError([Problem(STDIN_NAME, 1, 1, "$", message)])

    if stdin is None:
        raise problem("cannot read the plan: standard input is closed")
    if _stdin_taken is stdin:
        raise problem("standard input holds one plan, and it was read for an earlier `-`")
    _stdin_taken = stdin
    data = stdin.buffer.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise problem(f"a plan is at most {MAX_BYTES:,} bytes (1 MiB), and more came; not read")
    return data


def _too_large(file: str, size: int | None) -> BudgetError:
    """A file over `MAX_BYTES`; `size` None where reading found more than that (a device,
    a pipe), whose size is not known."""
    most = f"{MAX_BYTES:,} bytes (1 MiB)"
    message = (
        f"the file holds more than {most}, the most a plan may be, so it was not read"
        if size is None
        else f"the file is {size:,} bytes; a plan is at most {most}, so it was not read"
    )
    return BudgetError([Problem(file, 1, 1, "$", message)])


def load_plan(path: Path, seed: bool = False) -> Plan:
    """Read, validate and resolve the plan at `path`; `BudgetError` lists every problem.
    `seed`: a search's starting point, whose layout is not checked (`resolve`).

    Schema problems are reported together with load problems (duplicate keys) and the
    semantic problems of the sections that passed the schema (`semantic_problems`), so
    that a file's problems come in one run; semantic checks never see wrong types.
    """
    return load_plan_data(read_plan_bytes(path), plan_name(path), seed)


def load_plan_data(data: bytes, file: str, seed: bool = False) -> Plan:
    """`load_plan` of a plan's bytes already read (`read_plan_bytes`), named `file` in
    problems: a caller that needs the text again (a position for its own message) reads
    standard input or a pipe once."""
    text, problem = decode(data, file)
    if text is None:
        raise BudgetError([problem] if problem is not None else [])
    loaded = load_yaml(text, file)
    tree = loaded.tree if loaded.tree is not None else loaded.partial
    if tree is None:
        raise BudgetError(list(loaded.problems))
    # a batch key of the other mode is said not to apply, whatever its value: the loader's
    # and the schema's problems with it are moot (an audit: a decode plan's `micro: x` was
    # told it is not an integer, and only once it was one that it does not apply; a
    # review: likewise `micro: .inf`, a tag, an alias or the key twice)
    moot = tuple(f"$.batch.{key}" for key in wrong_batch_keys(tree))

    def kept(path: str) -> bool:
        return not any(path == m or path.startswith((m + ".", m + "[")) for m in moot)

    schema_problems = validate_tree(tree, loaded.marks, file, loaded.refused, loaded.unfinished)
    # where reading stopped is said even inside a moot key (a review: a cap inside a decode
    # plan's `micro` was dropped with it, and the half-read plan went on to be resolved)
    problems = [p for p in [*loaded.problems, *schema_problems] if p.ends or kept(p.path)]
    refused = sorted(path for path in loaded.refused if kept(path))
    if problems:  # the broken sections are not resolved: name their unknown presets too
        # a second document after the plan breaks none of its sections (a review: at "$"
        # it read as the whole plan broken, and a bad tp beside it went unsaid); where a cap
        # stopped the reading, the sections it did not finish or reach are held back instead
        # of the place it stopped at
        broken = [p for p in problems if p.message != SECOND_DOCUMENT and not p.ends]
        seen = {p.path for p in broken}
        more = preset_problems(tree, loaded.marks, file)
        paths = [p.path for p in broken] + refused + _unread(loaded)
        more += semantic_problems(tree, loaded.marks, file, paths, seed)
        raise BudgetError(sorted(set(problems + [p for p in more if p.path not in seen])))
    if loaded.tree is None:  # read in part (`Loaded.partial`): its stop is among the problems
        raise BudgetError(list(loaded.problems))
    return resolve(loaded.tree, loaded.marks, file, seed)


def _unread(loaded: Loaded) -> list[str]:
    """The sections a cap's stop left unfinished or unread (`Loaded.partial`), whose rules
    wait for the file to be read whole: none where the file was."""
    if loaded.partial is None:
        return []
    open_ = {path for path in loaded.unfinished if _SECTION.fullmatch(path)}
    unread = set(schema()["properties"]) - set(loaded.partial) - {"mode"}
    return sorted(open_ | {f"$.{section}" for section in unread})


# a plan's top-level key in a problem's path: $.model.layers, $.model['<<'], $.topology[...]
_SECTION = re.compile(r"^\$\.([A-Za-z_][A-Za-z0-9_-]*)")
# one hand-written transition's key, its tensor's by name: "$.transitions[0].group",
# "$.transitions[2].tensor.shape[1]" (tensor.shape and tensor.shape[1]: the list's other
# items are still read), "$.transitions[1].tensor" (tensor)
_TRANSITION = re.compile(r"^\$\.transitions\[(\d+)\](?:\.([a-z_]+(?:\.[a-z_]+)?)(\[\d+\])?)?")


def semantic_problems(
    tree: Any, marks: Marks, file: str, broken: list[str], seed: bool
) -> list[Problem]:
    """The semantic problems of the sections no path in `broken` is in (the load's and the
    schema's problems, and the values the loader refused: an alias past the first is not a
    problem of its own), with the rules relating them (`resolve`'s ``skip``): a plan with
    a wrong type in the model and a bad layout learns both at once. None where a problem
    is the plan's own: a section missing (``$``), the mode, which every section reads, or
    a key that is no section (``paralel:``, ``Parallel:``), which may be one misspelt whose
    defaults would be checked in its place."""
    known = set(schema()["properties"]) - {"mode"}
    sections = set()
    items: dict[int, set[str]] = {}  # a transition's broken keys: the others are still read
    for path in broken:
        match = _SECTION.match(path)
        if match is None or match.group(1) not in known:
            return []
        item = _TRANSITION.match(path)
        if item is None:
            sections.add(match.group(1))
        else:
            keys = items.setdefault(int(item.group(1)), set())
            keys.add(item.group(2) or "")
            if item.group(3):
                keys.add(item.group(2) + item.group(3))
    held = {i: frozenset(keys) for i, keys in items.items()}
    try:
        resolve(tree, marks, file, seed, skip=frozenset(sections), broken_transitions=held)
    except BudgetError as error:
        return error.problems
    return []
