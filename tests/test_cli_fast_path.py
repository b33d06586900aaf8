"""`budget PLAN.yaml` skips building the typer app; it must behave exactly like the app."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from budget.cli import app
from budget.entry import plain_report, route
from tests.plan_files import GPT3, ROOT


@pytest.mark.parametrize(
    ("args", "plain"),
    [
        (["plan.yaml"], True),
        (["plan.yaml", "--format", "json"], True),
        (["plan.yaml", "-f", "markdown"], True),
        (["plan.yaml", "--format=table"], True),
        (["plan.yaml", "--format", "xml"], False),
        (["plan.yaml", "--help"], False),
        (["--help"], False),
        (["check", "plan.yaml"], False),
        (["plan.yaml", "other.yaml"], False),
    ],
)
def test_only_the_plain_report_takes_the_short_way(args, plain):
    assert (plain_report(route(args)) is not None) is plain


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_short_way_prints_what_the_app_prints(fmt):
    app_out = CliRunner().invoke(app, route([str(GPT3), "--format", fmt])).stdout
    process = subprocess.run(
        [sys.executable, "-m", "budget", str(GPT3), "--format", fmt],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert process.stdout == app_out


def test_short_way_reports_problems_like_the_app(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmode: train\nmodle: 3\n", encoding="utf-8")
    runner = CliRunner().invoke(app, route([str(bad)]))
    process = subprocess.run(
        [sys.executable, "-m", "budget", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert process.returncode == runner.exit_code == 2
    assert process.stderr == runner.stderr and process.stdout == ""


def test_short_way_does_not_import_typer():
    code = (
        "import sys; from budget.entry import main; "
        f"main([{str(GPT3)!r}, '--format', 'json']); "
        "print('typer' in sys.modules, file=sys.stderr)"
    )
    process = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert process.stderr.strip() == "False"


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="POSIX signal")
def test_a_reader_that_stops_early_ends_budget_by_sigpipe() -> None:
    """`budget PLAN | head -1` under `set -o pipefail` exited 1, which `check` uses for a
    plan that fails; now the process ends by SIGPIPE, as Unix filters do (shell status 141).
    The 405B report's JSON (184 KB) outgrows the pipe's buffer, so the write does fail."""
    plan = ROOT / "plans" / "llama3-405b-128k.yaml"
    command = [sys.executable, "-m", "budget", str(plan), "-f", "json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()
        proc.wait(timeout=60)
        assert proc.stderr.read() == b""
    assert proc.returncode == -signal.SIGPIPE


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [(["chek", "plan.yaml"], "check"), (["dif", "a", "b"], "diff"), (["valdate"], "validate")],
)
def test_a_mistyped_command_is_named_as_one(args, suggestion, tmp_path, monkeypatch, capsys):
    """`budget chek` said "chek:1:1: error: $: cannot read the plan" (review)."""
    from budget.entry import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"'{args[0]}' is neither a command nor a file; did you mean '{suggestion}'?" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([""], "an empty argument: give a plan file (- for standard input)"),
        (["check", "plans/a.yaml", ""], "an empty argument after 'plans/a.yaml': give a plan file"),
        (["validate-model", "--write-plans", ""], "--write-plans '': an empty value; give the"),
        # a command that reads no plan says what it takes (a note of stop 82)
        (["collective", ""], "an empty argument after 'collective': collective takes one argu"),
        (
            ["-f", "json", "presets", ""],
            "an empty argument after 'presets': presets takes devices,",
        ),
        (["schema", ""], "an empty argument after 'schema': schema takes no argument, only op"),
    ],
)
def test_an_empty_argument_is_refused(args, said, tmp_path, monkeypatch, capsys):
    """`budget ''` read the working folder ('.:1:1: error: ... Is a directory') and
    `validate-model --write-plans ''` wrote its plans there (an audit): nothing is written."""
    from budget.entry import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and list(tmp_path.iterdir()) == []
    assert err.startswith(f"budget: error: {said}") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["check", str(GPT3), "--headroom", "5GiB", "--headroom", "5%"], "--headroom"),
        (["check", str(GPT3), "--max-step=12s", "--max-step", "30s"], "--max-step"),
        ([str(GPT3), "-f", "json", "--format", "table"], "--format"),
        ([str(GPT3), "-fjson", "-f", "markdown"], "--format"),
    ],
)
def test_an_option_given_twice_is_refused(args, name, capsys):
    """The parser kept the last value unsaid: `--headroom 5GiB --headroom 5%` gated on 5 %
    alone (an audit of a CI gate). `collective --level` repeats by design."""
    from budget.entry import main

    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        err == f"budget: error: {name} is given twice; give it once (the last would win unsaid)\n"
    )
    levels = ["--level", "8:450GB/s:3us", "--level", "2:50GB/s:14us"]
    main(["collective", "all-reduce", "--ranks", "16", "--size", "1GiB", *levels])
    assert "error" not in capsys.readouterr().err


def test_a_file_named_like_a_command_is_still_a_plan(tmp_path, monkeypatch):
    from budget.entry import mistyped

    monkeypatch.chdir(tmp_path)
    (tmp_path / "chek").write_text("name: x\n")
    assert mistyped(["chek"]) is None
    assert mistyped(["plans/unknown.yaml"]) is None  # a missing plan, not a command
    assert mistyped(["-f", "dif", "plan.yaml"]) is None  # an option's value (review)


FULL = Path("/dev/full")  # every write fails: ENOSPC
# one invocation of every command, each writing to stdout when it succeeds ({plans}: plans/)
WRITERS = {
    "report": "{plans}/gpt3-175b.yaml",  # the short way
    "check": "check {plans}/gpt3-175b.yaml",  # status 1 would say the plan fails
    "diff": "diff {plans}/gpt-1.3b.yaml {plans}/gpt3-175b.yaml",
    "validate": "validate {plans}/gpt3-175b.yaml",
    "schema": "schema",
    "collective": "collective all-gather --ranks 8 --size 1GiB --bandwidth 450GB/s --latency 1us",
    "roofline": "roofline --intensity 4 --bandwidth 80GB/s --peak 1TFLOP/s",
    "search": "search {plans}/gpt-1.3b.yaml --tp 1,2 --pp 1 --zero 1 --micro 1 --recompute none "
    "--sp false --virtual-stages 1",
    "plot": "plot {plans}/gpt-1.3b.yaml --output {tmp}/gpt-1.3b.svg",
    "validate-model": "validate-model",
    "presets": "presets devices",
}


def test_every_command_is_tried_on_a_full_disk() -> None:
    from budget.entry import COMMANDS

    assert set(WRITERS) == COMMANDS


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "args",
    [*WRITERS.values(), "--version", "check --help"],
    ids=[*WRITERS, "version", "help"],
)
def test_output_that_cannot_be_written_is_one_line_and_exit_2(args: str, tmp_path: Path) -> None:
    """`budget PLAN > /dev/full` ended in an OSError traceback and status 1, which `check`
    gives a plan that fails (user audit). Python's own buffering is kept (no
    PYTHONUNBUFFERED): what could not be written must not fail again at exit (status 120)."""
    if args.startswith("plot"):
        pytest.importorskip("matplotlib")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    words = [word.format(plans=ROOT / "plans", tmp=tmp_path) for word in args.split()]
    command = [sys.executable, "-m", "budget", *words]
    with FULL.open("w") as full:
        process = subprocess.run(
            command, stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
        )
    assert process.stderr == "budget: error: cannot write output: no space left on device\n"
    assert process.returncode == 2


def _closing(stream: int) -> Any:
    """A subprocess `preexec_fn` that closes descriptor `stream` (the shell's `>&-`)."""
    return lambda: os.close(stream)


@pytest.mark.parametrize("args", [["{plan}"], ["check", "{plan}"], ["{plan}", "-f", "json"]])
def test_closed_or_full_standard_streams_end_in_status_2(args: list[str], tmp_path: Path) -> None:
    """An audit: with standard output closed (`>&-`) a report was lost with status 0; with
    standard error closed (`2>&-`) the error lines went to standard output, where a report
    goes; with standard error on a full disk (`2>/dev/full`) an invalid plan ended in status
    1, which `check` gives a plan that fails. Each is now status 2, and nothing on stdout."""
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "tests/invalid/device-zero-peak.yaml").read_text(encoding="utf-8"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}

    def run(plan: Path, **streams: Any) -> subprocess.CompletedProcess[bytes]:
        words = [a.format(plan=plan) for a in args]
        return subprocess.run(
            [sys.executable, "-m", "budget", *words], cwd=ROOT, env=env, check=False, **streams
        )

    closed_out = run(GPT3, stdout=None, stderr=subprocess.PIPE, preexec_fn=_closing(1))
    assert closed_out.returncode == 2
    assert closed_out.stderr == b"budget: error: cannot write output: standard output is closed\n"
    # `check` says on stdout which plan is invalid (its errors being on stderr) and its tally
    said = b"INVALID " + str(bad).encode() + b": its errors are on stderr\n"
    closed_err = run(bad, stdout=subprocess.PIPE, stderr=None, preexec_fn=_closing(2))
    outcomes = [closed_err]
    if FULL.exists():
        with FULL.open("w") as full:
            outcomes.append(run(bad, stdout=subprocess.PIPE, stderr=full))
    for outcome in outcomes:
        assert outcome.returncode == 2
        assert b"error:" not in outcome.stdout
        # (on a full stderr, `check` stops at its first error line, before its verdicts)
        assert outcome.stdout in (b"", said) or outcome.stdout.startswith(said)
        assert args[0] == "check" or outcome.stdout == b""


class _Full(io.StringIO):
    """A standard output on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("args", [[str(GPT3)], ["check", str(GPT3)]], ids=["short", "app"])
def test_a_failed_write_is_reported_in_process_too(args, monkeypatch, capsys) -> None:
    """The same without /dev/full, both ways a command runs (`plain_report` or the app)."""
    from budget.entry import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", _Full())
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    assert (
        capsys.readouterr().err == "budget: error: cannot write output: no space left on device\n"
    )


@pytest.mark.parametrize("columns", ["0", "1", "39"])
def test_a_width_under_40_columns_is_read_as_80(columns, monkeypatch, capsys) -> None:
    """COLUMNS=0 printed nothing and exited 0; COLUMNS=1 one character a line (user audit).
    Both ways a command runs: the short way and the app, here `check` on a plan that fails."""
    from budget.entry import main

    fails = ["check", str(GPT3), "--max-step", "12s"]
    wide = CliRunner().invoke(app, route(fails), env={"COLUMNS": "80"})
    narrow = CliRunner().invoke(app, route(fails), env={"COLUMNS": columns})
    assert narrow.exit_code == wide.exit_code == 1
    assert "FAIL" in narrow.stdout and narrow.stdout == wide.stdout
    monkeypatch.setenv("COLUMNS", "80")
    main([str(GPT3)])
    expected = capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", columns)
    main([str(GPT3)])
    assert capsys.readouterr().out == expected
    assert max(map(len, expected.splitlines())) <= 80 < len(expected)


def test_a_width_of_40_columns_or_more_is_kept(monkeypatch) -> None:
    from budget.entry import stdout_console

    for columns in (40, 100):
        monkeypatch.setenv("COLUMNS", str(columns))
        assert stdout_console().width == columns


def test_a_plan_is_read_from_standard_input_as_dash() -> None:
    """`budget -` read nothing and said "No such command '-'" (UX audit)."""
    text = GPT3.read_text(encoding="utf-8")

    def run(*args: str, stdin: str = text) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "budget", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=ROOT)

    from_file = run(str(GPT3), "-f", "json").stdout
    piped = run("-", "-f", "json")
    assert piped.returncode == 0
    assert piped.stdout == from_file.replace(f'"file": "{GPT3}"', '"file": "<stdin>"')
    assert run("check", "-").stdout.startswith("PASS <stdin>")
    bad = run("-", stdin="name: x\nmodle: 3\n")
    assert bad.returncode == 2 and "<stdin>:2:1: error: $.modle: unknown key 'modle'" in bad.stderr
    search = run("search", "-", "--write", "never.yaml")
    assert search.returncode == 2 and "standard input, which is read once" in search.stderr
    assert not (ROOT / "never.yaml").exists()


def test_standard_input_read_once_closed_or_searched_says_so() -> None:
    """`check - -` read stdin twice (the second plan "held nothing"), a closed stdin was a
    traceback, and `search -` read the plan from disk again to place a problem (review)."""
    text = GPT3.read_text(encoding="utf-8")
    twice = subprocess.run(
        [sys.executable, "-m", "budget", "check", "-", "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert twice.returncode == 2
    assert (
        "<stdin>:1:1: error: $: standard input holds one plan, and it was read for an "
        "earlier `-`" in twice.stderr
    )
    closed = subprocess.run(  # `<&-`: the process starts with no standard input at all
        ["sh", "-c", f"'{sys.executable}' -m budget - <&-"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert closed.returncode == 2
    assert (
        closed.stderr == "<stdin>:1:1: error: $: cannot read the plan: standard input is closed\n"
    )
    decode = (ROOT / "plans" / "llama3-70b-decode.yaml").read_text(encoding="utf-8")
    searched = subprocess.run(
        [sys.executable, "-m", "budget", "search", "-"],
        input=decode,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert searched.returncode == 2 and "Traceback" not in searched.stderr
    assert searched.stderr.startswith("<stdin>:13:7: error: $.mode: budget search sweeps")


def test_each_new_standard_input_is_read_once() -> None:
    """A process reads its stdin for one `-`; a test runner that gives each call its own
    stdin reads each (a flag kept for the whole process refused the second; review)."""
    text = GPT3.read_text(encoding="utf-8")
    runner = CliRunner()
    first = runner.invoke(app, route(["validate", "-"]), input=text)
    second = runner.invoke(app, route(["validate", "-"]), input=text)
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert first.stdout == second.stdout == "<stdin>: ok\n"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize(
    ("words", "status"),
    [(["{plans}/gpt-1.3b.yaml"], 0), (["check", "{plans}/gpt-1.3b.yaml", "--headroom", "90%"], 1)],
    ids=["report", "check"],
)
def test_a_terminal_without_utf8_gets_the_output_not_a_traceback(encoding, words, status):
    """``PYTHONIOENCODING=ascii`` (or latin-1): the middle dot, ``×`` and ``✗`` ended in a
    UnicodeEncodeError traceback and status 1, which `check` gives a plan that fails (user
    audit). Each such character prints as its ASCII stand-in (`budget.render.standins`; it
    was ``?``, which lost a diff's signs, an audit), and the status is the command's own: a
    report 0, a failing check 1."""
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "80"}
    command = [sys.executable, "-m", "budget", *(w.format(plans=ROOT / "plans") for w in words)]
    process = subprocess.run(command, capture_output=True, cwd=ROOT, env=env)
    assert process.returncode == status
    assert process.stderr == b""
    text = process.stdout.decode(encoding)
    shown = "/" if encoding == "ascii" else "·"  # latin-1 has the middle dot, not ─ or ✗
    assert f"gpt-1.3b {shown} train" in text if status == 0 else "FAIL " in text
    if status == 0:  # the fill bar in ASCII, where it was ????? (review)
        assert re.search(r"\|#+\.+\|", text), text


@pytest.mark.parametrize("words", [["schema"], ["{plans}/gpt3-175b.yaml", "-f", "json"]])
def test_json_to_a_stream_without_utf8_escapes_what_it_cannot_show(words):
    """The replacement ``?`` turned the schema's ``µs`` pattern into one that does not
    compile and a report's ``×`` into ``?`` (review): JSON escapes them (``\\u00b5``), so
    it parses to what a UTF-8 stream gets."""
    command = [sys.executable, "-m", "budget", *(w.format(plans=ROOT / "plans") for w in words)]
    runs = [
        subprocess.run(
            command, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONIOENCODING": e}
        )
        for e in ("ascii", "utf-8")
    ]
    assert [r.returncode for r in runs] == [0, 0]
    ascii_out, utf8_out = (r.stdout for r in runs)
    assert ascii_out.isascii() and not utf8_out.isascii()
    assert json.loads(ascii_out) == json.loads(utf8_out)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["presets", "foo"],
            "budget: error: Invalid value for 'KIND': 'foo' is not one of devices, topologies "
            "or models (see 'budget presets --help')",
        ),
        (
            [str(GPT3), "--format", "xml"],
            "budget: error: Invalid value for '--format' / '-f': 'xml' is not one of table, "
            "json or markdown (see 'budget report --help')",
        ),
        (
            ["check", "--headroom"],
            "budget: error: Option '--headroom' requires an argument (see 'budget check --help')",
        ),
    ],
)
def test_command_line_faults_are_one_line_as_budget_s_own(args, said, capsys) -> None:
    """click's usage block and "Error: ..." (a review: `budget presets foo`) become one line,
    `budget: error: ...`, exit 2, nothing on stdout; `budget` alone still prints its help."""
    from budget.entry import main

    with pytest.raises(SystemExit) as leaving:
        main(args)
    out, err = capsys.readouterr()
    assert leaving.value.code == 2 and out == ""
    assert err == said + "\n"
    with pytest.raises(SystemExit) as bare:
        main([])
    assert bare.value.code == 2
    assert capsys.readouterr().err.startswith("Usage: budget [OPTIONS] COMMAND [ARGS]...")


def test_piped_tables_end_no_line_in_spaces():
    """rich pads each table line to the table's width; piped into a file or a CI log, every
    command's lines end at their last character (77 lines of the 1.3B report ended in
    spaces), and a space inside a line, or held at the end of one write until more of its
    line follows, is kept."""
    from budget.entry import TrimmedLines

    for args in ([str(ROOT / "plans" / "gpt-1.3b.yaml")], ["check", str(GPT3)], ["presets"]):
        process = subprocess.run(
            [sys.executable, "-m", "budget", *args], capture_output=True, text=True, check=False
        )
        assert process.stdout.count("\n") >= 5, args
        assert not [line for line in process.stdout.splitlines() if line.endswith(" ")], args
    stream = io.StringIO()
    trimmed = TrimmedLines(stream)
    for part in ("a  b   ", "   ", "c  \n", "  \n", "d "):
        trimmed.write(part)
    assert stream.getvalue() == "a  b      c\n\nd"


def test_after_a_double_dash_the_first_word_is_the_plan(tmp_path: Path) -> None:
    """`budget -- -x.yaml` was refused as an unknown option -x where `budget report --
    -x.yaml` reported (an audit, m422): after ``--`` every word is a file."""
    assert route(["--", "-x.yaml"]) == ["report", "--", "-x.yaml"]
    assert route(["-f", "json", "--", "-x.yaml"]) == ["report", "-f", "json", "--", "-x.yaml"]
    assert route(["--", "check"]) == ["report", "--", "check"]  # a file named check
    assert route(["check", "--", "-x.yaml"]) == ["check", "--", "-x.yaml"]
    (tmp_path / "-x.yaml").write_bytes(GPT3.read_bytes())
    short = subprocess.run(
        [sys.executable, "-m", "budget", "-f", "json", "--", "-x.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    long = subprocess.run(
        [sys.executable, "-m", "budget", "report", "-f", "json", "--", "-x.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert short.returncode == 0 and short.stdout == long.stdout != ""


def test_a_plan_through_a_pipe_reads_its_config_from_the_working_folder(tmp_path: Path) -> None:
    """A plan piped as /dev/stdin reads a relative hf_config from the working folder, as
    `-` does: the pipe's link names /proc/<pid>/fd, where config.json was looked for (an
    audit, m422)."""
    config = ROOT / "tests" / "data" / "hf" / "llama3-70b" / "config.json"
    (tmp_path / "config.json").write_bytes(config.read_bytes())
    text = (ROOT / "tests" / "data" / "llama3-70b-hf.yaml").read_text(encoding="utf-8")
    plan = text.replace("hf/llama3-70b/config.json", "config.json")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "budget", *args, "-f", "json"]
        return subprocess.run(command, input=plan, capture_output=True, text=True, cwd=tmp_path)

    dashed, piped = run("-"), run("/dev/stdin")
    assert dashed.returncode == 0 and piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["model"] == json.loads(dashed.stdout)["model"]


def test_options_before_the_command_word_are_the_commands() -> None:
    """`budget -f json presets` read json as the plan's place and presets as a plan, and
    `budget --version PLAN` said --version is no option (a user audit, m421)."""
    assert route(["-f", "json", "presets"]) == ["presets", "-f", "json"]
    assert route(["-f", "json", "check", "p.yaml"]) == ["check", "-f", "json", "p.yaml"]
    assert route(["--format=json", "presets"]) == ["presets", "--format=json"]
    assert route(["-f", "json", "p.yaml"]) == ["report", "-f", "json", "p.yaml"]
    assert route(["--version", "p.yaml"]) == ["--version"] == route(["p.yaml", "--version"])
    assert route(["--", "--version"]) == ["report", "--", "--version"]  # a file so named
    version = subprocess.run(
        [sys.executable, "-m", "budget", "--version", str(GPT3)], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.startswith("budget ")


def test_the_short_ways_format_without_a_plan_asks_for_the_plan() -> None:
    """`budget -f json` is the report's option with its plan left out: the report says the
    plan is missing, where the top-level app said "No such option: -f" of an option
    `budget -f json PLAN` takes (an audit, m526); other options stay the top level's."""
    assert route(["-f", "json"]) == ["report", "-f", "json"]
    assert route(["--format=json"]) == ["report", "--format=json"]
    assert route(["--help"]) == ["--help"] and route([]) == []
    assert route(["-x"]) == ["-x"]
    for args in (["-f", "json"], ["--format", "markdown"]):
        said = subprocess.run(
            [sys.executable, "-m", "budget", *args], capture_output=True, text=True
        )
        assert (said.returncode, said.stdout) == (2, "")
        assert said.stderr == (
            "budget: error: Missing argument 'PLAN' (see 'budget report --help')\n"
        )


def test_the_command_word_skips_every_options_value(monkeypatch, tmp_path) -> None:
    """Every option of budget's but --help and --version takes the next word (review m424:
    `--headroom 5% check P` read 5% as the plan, and `-f json chek` was offered nothing),
    unless it carries its value; an empty word after one that does not is an argument."""
    from budget.entry import empty_argument, mistyped

    assert route(["--headroom", "5%", "check", "p.yaml"]) == ["check", "--headroom", "5%", "p.yaml"]
    assert route(["--objective", "check", "search", "p.yaml"])[0] == "search"
    assert route(["--format=json", "-o", "x.png", "plot", "p.yaml"])[0] == "plot"
    assert route(["--help", "check"]) == ["check", "--help"]
    monkeypatch.chdir(tmp_path)
    said = mistyped(["-f", "json", "chek", "p.yaml"]) or ""
    assert "'chek' is neither a command nor a file; did you mean 'check'?" in said
    assert "an empty argument after '--headroom=5%'" in (
        empty_argument(["check", "--headroom=5%", ""]) or ""
    )
    assert "an empty argument after '--help'" in (empty_argument(["check", "--help", ""]) or "")
    assert "--tp '': an empty value" in (empty_argument(["search", "p", "--tp", ""]) or "")
