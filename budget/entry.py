"""The `budget` console script and `python -m budget`.

The command people run most, `budget PLAN.yaml [--format F]`, is answered here without
importing typer or building its app, which together cost about a tenth of the whole
report (issue 2: the report within twice a bare import of its libraries). Every other
form, including every mistake, goes to the typer app in `budget.cli` and its messages.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, cast

if TYPE_CHECKING:
    from rich.console import Console

COMMANDS = frozenset(
    {
        "report",
        "validate",
        "schema",
        "collective",
        "roofline",
        "check",
        "diff",
        "search",
        "plot",
        "validate-model",
        "presets",
    }
)
FORMATS = ("table", "json", "markdown")
STDIN = "-"  # a plan argument that reads the plan from standard input
NARROWEST, FALLBACK_WIDTH = 40, 80  # columns


_FLAGS = frozenset({"--help", "--version"})  # budget's only options that take no value


def takes_value(arg: str) -> bool:
    """Whether the option word `arg` takes the next word as its value: every option of
    budget's commands but --help and --version, unless it carries its value (--format=json,
    -fjson)."""
    if arg in _FLAGS or "=" in arg:
        return False
    return arg.startswith("--") or len(arg) == 2


def command_word(args: list[str]) -> tuple[int, str] | None:
    """Where the first word that is neither an option nor an option's value stands, and the
    word, before any ``--``: the command, or the plan of the short way."""
    skip = False
    for i, arg in enumerate(args):
        if skip:  # an option's value is no command word (`-f json presets`: m421)
            skip = False
        elif arg == "--":
            return None
        elif arg.startswith("-") and arg != STDIN:
            skip = takes_value(arg)
        else:
            return i, arg
    return None


def route(args: list[str]) -> list[str]:
    """`budget PLAN.yaml ...` is short for `budget report PLAN.yaml ...`; after ``--`` every
    word is a file, the first of them the plan (an audit, m422: `budget -- -x.yaml` was
    refused as an unknown option -x, where `budget report -- -x.yaml` reported); options
    written before the command word are the command's (`budget -f json presets`, m421)."""
    head = args[: args.index("--")] if "--" in args else args
    if "--version" in head:  # said alone, whatever else is given (a user audit, m421)
        return ["--version"]
    found = command_word(args)
    if found is None:
        # the short way's own option with no plan is the report's, whose message names the
        # missing plan (an audit, m526: `budget -f json` read "No such option: -f")
        formats = any(a.startswith(("-f", "--format")) for a in head)
        return ["report", *args] if "--" in args or formats else list(args)
    i, word = found
    if word not in COMMANDS:
        return ["report", *args]
    return [word, *args[:i], *args[i + 1 :]]


def mistyped(args: list[str]) -> str | None:
    """A command word (`command_word`: no option's value, `-f dif`) that is no file but
    nearly a command ("chek"): what to say instead of "chek:1:1: error: $: cannot read the
    plan", after options too (`budget -f json chek`, review m424)."""
    import difflib

    found = command_word(args)  # the word `route` takes for the command (review m424)
    first = found[1] if found else "-"
    from budget.files import exists

    if first.startswith("-") or first in COMMANDS or exists(Path(first)):
        return None
    close = difflib.get_close_matches(first, sorted(COMMANDS), n=1, cutoff=0.7)
    if not close:
        return None
    from budget.errors import usage_line

    return usage_line(f"{first!r} is neither a command nor a file; did you mean {close[0]!r}?")


def plain_report(args: list[str]) -> tuple[Path, str] | None:
    """`budget report PLAN.yaml [--format F]`, if that is all `args` (routed) says."""
    if len(args) < 2 or args[0] != "report" or (args[1].startswith("-") and args[1] != STDIN):
        return None
    rest, fmt = args[2:], "table"
    if len(rest) == 2 and rest[0] in ("--format", "-f"):
        fmt = rest[1]
    elif len(rest) == 1 and rest[0].startswith("--format="):
        fmt = rest[0].removeprefix("--format=")
    elif rest:
        return None
    return (Path(args[1]), fmt) if fmt in FORMATS else None


def main(argv: list[str] | None = None) -> None:
    # a reader that stops early (`budget check ... | head -1`) ends the process as any
    # Unix filter ends, by SIGPIPE (shell status 141), not with status 1, which `check`
    # uses to say a plan fails; only as the program itself (a caller passing `argv` keeps
    # its own handling), and only where the platform and the thread allow it
    if argv is None and hasattr(signal, "SIGPIPE"):
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv is None:
        _closed_streams()
        _encodable_streams()
    try:
        try:
            _run(list(sys.argv[1:] if argv is None else argv))
        except KeyboardInterrupt:  # Ctrl-C, as `budget check -` ends: quietly, status 130
            sys.exit(130)
        finally:
            if sys.stdout is not None:  # None when closed (`>&-`): rich then writes nowhere
                sys.stdout.flush()
    except BrokenPipeError:
        raise  # a reader that stopped early: SIGPIPE's or rich's own handler's to end
    except OSError as error:
        if error.filename is not None:  # a named file's, not the output's
            raise
        _cannot_write(error)


class _Closed(io.TextIOBase):
    """Standard output closed by the shell (`>&-`), where Python sets `sys.stdout` to None
    and rich then wrote nowhere: a report lost with status 0 (an audit). Writing to it
    fails as a full disk does, one line and status 2 (`_cannot_write`)."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _closed_streams() -> None:
    """Closed standard streams, which Python sets to None: `print(file=None)` writes to
    standard output, so error lines went where a report goes (`2>&-`, an audit); they now
    go nowhere, and the exit status says what happened."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's)
    if sys.stdout is None:
        sys.stdout = _Closed()


def _encodable_streams() -> None:
    """Output to a stream whose encoding lacks what budget prints (``PYTHONIOENCODING=ascii``,
    or latin-1; Python itself reads a C locale as UTF-8) ended in an encoding traceback and
    status 1, which `check` uses to say a plan fails; then each such character printed as
    ``?``, which left a diff's signs and verdicts and check's limits unreadable (an audit).
    Each now prints as its ASCII stand-in (`budget.render.standins`: ``−`` as ``-``, ``≤`` as
    ``<=``, ``✗`` as ``bad``), and only a character budget does not know of as ``?``. JSON
    escapes them instead (`render.dump_json`), so that its values stay what they are."""
    from budget.render import utf  # imported by every command that renders anyway

    for stream in (sys.stdout, sys.stderr):
        if stream is not None and not utf(stream):
            from budget.render.standins import register

            with contextlib.suppress(AttributeError, ValueError):  # not a TextIOWrapper
                stream.reconfigure(errors=register(stream is sys.stdout))  # type: ignore[union-attr]


def empty_argument(args: list[str]) -> str | None:
    """What to say of an empty argument, which no file or option value of budget's can be:
    as a path it reads as the working folder (`budget ''` said ".:1:1: error: ... Is a
    directory", and `validate-model --write-plans ''` wrote its plans there)."""
    if "" not in args:
        return None
    from budget.errors import usage_line

    after = args.index("")
    before = args[after - 1] if after else ""
    if before.startswith("-") and before not in (STDIN, "--") and takes_value(before):
        # an option's value, said as the option's (a user audit, m419: `--tp ""` was told
        # to give a plan file)
        return usage_line(f"{before} '': an empty value; give the option's value")
    where = f" after {before!r}" if after else ""
    found = command_word(args)
    takes = _ARGUMENTS.get(found[1] if found else "", "give a plan file (- for standard input)")
    return usage_line(f"an empty argument{where}: {takes}")


# what the commands that read no plan take instead (`budget presets ''` was told to give a
# plan file: a note of stop 82)
_ARGUMENTS = {
    "collective": "collective takes one argument, the operation: all-gather, reduce-scatter, "
    "all-reduce, all-to-all, broadcast or send-recv",
    "presets": "presets takes devices, topologies or models, or nothing for all three",
    **{
        word: f"{word} takes no argument, only options"
        for word in ("schema", "roofline", "validate-model")
    },
}


def _app(args: list[str]) -> None:
    """The typer app on `args`, its command-line faults (an unknown option, a bad choice, a
    missing value) one line on stderr as budget's own are, exit 2, where click printed a
    usage block and "Error: ..." (`budget presets foo`, a review)."""
    from budget.cli import app
    from budget.errors import usage_line

    try:
        code = app(args=args, prog_name="budget", standalone_mode=False)
    except Exception as error:  # click's, as typer vendors it: known by what it carries
        said, status = getattr(error, "format_message", None), getattr(error, "exit_code", None)
        if said is None or not isinstance(status, int):
            raise
        if type(error).__name__ == "NoArgsIsHelpError":  # `budget` alone: the help, as asked
            error.show()  # type: ignore[attr-defined]
            sys.exit(status)
        context = getattr(error, "ctx", None)
        command = (
            context.command_path
            if context is not None
            else f"budget {args[0]}"
            if args and not args[0].startswith("-")
            else "budget"
        )
        print(usage_line(f"{said().rstrip('.')} (see '{command} --help')"), file=sys.stderr)
        sys.exit(status)
    if isinstance(code, int) and code:  # typer.Exit(code), returned without standalone mode
        sys.exit(code)


_SHORT_NAMES = {"-f": "--format", "-o": "--output"}
_REPEATABLE = frozenset({"--level"})  # `collective --level`, one per topology level


def repeated_option(args: list[str]) -> str | None:
    """What to say of an option given twice: the parser keeps the last silently, so
    `budget check --headroom 5GiB --headroom 5%` gated on 5 % alone, and a CI line built
    from two sources could lose a limit unseen (an audit). Options taken once per level
    (`_REPEATABLE`) may repeat."""
    from budget.errors import usage_line

    seen: set[str] = set()
    for token in args:
        if token == "--":  # what follows is arguments, not options
            break
        # -f json, -fjson and --format=json are one option (a review: -fjson slipped by)
        name = _SHORT_NAMES.get(token[:2], token) if not token.startswith("--") else token
        name = name.split("=", 1)[0]
        if not name.startswith("--") or name in _REPEATABLE:
            continue  # an argument, a negative number, or an option meant to repeat
        if name in seen:
            return usage_line(f"{name} is given twice; give it once (the last would win unsaid)")
        seen.add(name)
    return None


def _run(given: list[str]) -> None:
    wrong = empty_argument(given) or mistyped(given) or repeated_option(given)
    if wrong is not None:
        print(wrong, file=sys.stderr)
        sys.exit(2)
    args = route(given)
    if STDIN in args and sys.stdin is not None and sys.stdin.isatty():  # a person typing
        print("budget: reading a plan from standard input; end it with Ctrl-D", file=sys.stderr)
    plain = plain_report(args)
    if plain is None:
        _app(args)
        return
    from budget.errors import BudgetError, problem_lines
    from budget.pipeline import budget_plan
    from budget.render import render_report

    try:
        report = budget_plan(plain[0])
    except BudgetError as error:
        for line in problem_lines(error.problems):
            print(line, file=sys.stderr)
        sys.exit(2)
    render_report(stdout_console(), report, plain[1])


def stdout_console() -> Console:
    """The console every command renders its output on. A width under 40 columns fits no
    table (COLUMNS=0 printed nothing at all, COLUMNS=1 a character a line): 80 instead, as
    when no width is known."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=False)
    isatty = getattr(console.file, "isatty", None)
    if not (isatty and isatty()):  # the stream itself: FORCE_COLOR makes rich call it one
        # rich pads every table line to the table's width; piped into a file, a CI log or
        # a diff, those spaces are noise (a review: 77 of a report's lines ended in them)
        console.file = cast(IO[str], TrimmedLines(console.file))
    if console.width < NARROWEST:
        console.width = FALLBACK_WIDTH
    from budget.render import utf

    if not utf(console.file):  # the stand-ins in before rich measures a table's cells
        from budget.render.standins import Standins

        console.push_render_hook(Standins(getattr(console.file, "encoding", "ascii")))
    return console


class TrimmedLines:
    """A text stream that writes each line without its trailing spaces: spaces at the end
    of one write wait for the next, and are written only if more than spaces follow them
    on the same line. Everything else is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.pending = ""

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        last = lines[-1].rstrip(" ")
        self.pending = lines[-1][len(last) :]
        self.stream.write("\n".join([line.rstrip(" ") for line in lines[:-1]] + [last]))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _cannot_write(error: OSError) -> NoReturn:
    """Output that could not be written (`> /dev/full`, a full disk): one line and exit 2,
    as for bad input; not a traceback and status 1, which `budget check` gives a plan that
    fails."""
    reason = (error.strerror or str(error)).lower()
    from budget.errors import usage_line

    # a standard error that cannot be written either (`2>/dev/full`) leaves the status to say
    # it, its buffer taken to /dev/null as standard output's below
    try:
        print(usage_line(f"cannot write output: {reason}"), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    # what could not be written is still buffered, and Python's flush at exit would fail on
    # it again, loudly: the descriptor takes it to /dev/null instead (a test's stdout has none)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(2)
