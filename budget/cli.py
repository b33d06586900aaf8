"""The command line: parse options, call the library, pick a renderer and an exit code.

Exit codes: 0 ok, 1 a check failed (valid plan that does not fit or exceeds a limit),
2 invalid input or usage. User errors are one line per problem on stderr, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand

from budget.entry import main, route, stdout_console
from budget.errors import (
    BudgetError,
    Problem,
    UsageErrors,
    format_refusal,
    one_line,
    usage_line,
)

if TYPE_CHECKING:
    from typer import _click as click

    from budget.accuracy import Accuracy

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Memory and communication budgets for distributed transformer plans.\n\n"
    "Run `budget PLAN.yaml` for a plan's full report (short for `budget report PLAN.yaml`).",
)


def _version(value: bool) -> None:
    if value:
        from budget import __version__

        print(f"budget {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Memory and communication budgets for distributed transformer plans."""


OK, FAILED, INVALID = 0, 1, 2
T = TypeVar("T")
__all__ = ["app", "exit_code", "main", "route"]  # main and route live in `budget.entry`


class Format(StrEnum):
    table = "table"
    json = "json"
    markdown = "markdown"


def _format(value: str) -> Format:
    """The output format named, in any case; typer's own enum check would prefix its
    refusal with its validator's "Value error,"."""
    try:
        return Format(value.lower())
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not one of table, json or markdown") from None


FormatOption = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        callback=_format,
        metavar="<table|json|markdown>",
        help="Output format: table, json or markdown.",
    ),
]
# The same option read by a command that has others it reads itself, to say a bad format
# beside them (`format_refusal`), not alone before them as click's callback would.
LateFormatOption = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        metavar="<table|json|markdown>",
        help="Output format: table, json or markdown.",
    ),
]


def _read_with_format(fmt: str, read: Callable[[], T]) -> tuple[T, str]:
    """`read`'s options and the format named, or every bad one of them said at once: a
    `UsageErrors` (or a `ValueError`'s one line) and then the format's, exit 2."""
    late = format_refusal(fmt)
    try:
        value = read()
    except ValueError as error:
        said = error.messages if isinstance(error, UsageErrors) else (str(error),)
        raise _usage(UsageErrors([*said, *late])) from None
    if late:
        raise _usage(UsageErrors(late))
    return value, fmt.lower()


def _option(metavar: str, help: str, *names: str) -> Any:
    """A typer option that says what it takes (`metavar`: <time>, <size|percent>) where
    typer would print the Python type, <str>."""
    return typer.Option(*names, metavar=metavar, help=help)


# The limits `budget check` gates on and `budget search` ranks within (`check.parse_limits`).
HeadroomOption = Annotated[
    str | None,
    _option("<size|percent>", "Free memory the worst stage must keep: 5% of capacity or 4GiB."),
]
MaxExposedOption = Annotated[
    str | None,
    _option(
        "<percent>",
        "Most of the step in exposed communication, e.g. 20% (a serving plan: of the whole run, "
        "prefill and decode).",
    ),
]
MaxStepOption = Annotated[
    str | None, _option("<time>", "Longest step time, e.g. 12s (a serving plan: the whole run).")
]
MaxTtftOption = Annotated[
    str | None,
    _option("<time>", "Longest time to first token of a serving plan, e.g. 2s (the prefill)."),
]
MaxTpotOption = Annotated[
    str | None, _option("<time>", "Longest time per output token of a decode plan, e.g. 20ms.")
]
# budget search sweeps training layouts only: its limits say nothing of serving runs
SearchExposedOption = Annotated[
    str | None,
    _option("<percent>", "Most of the step in exposed communication, e.g. 20%.", "--max-exposed"),
]
SearchStepOption = Annotated[
    str | None, _option("<time>", "Longest step time, e.g. 12s.", "--max-step")
]


def exit_code(*, valid: bool = True, passed: bool = True) -> int:
    """The one place exit codes are decided: 2 invalid input, 1 a failed check, else 0."""
    return INVALID if not valid else FAILED if not passed else OK


def _argument(metavar: str, help: str, **kw: Any) -> Any:
    """A typer argument named as the README names it (PLAN, PLAN..., OP), in its command's
    usage line and --help alike (`Arguments`). A path is not checked for reading here: typer
    refused an unreadable plan in click's words before budget read any, so the other plans'
    problems went unsaid and `check -f json` printed nothing (an audit); budget's reader
    says it as every other problem, file:1:1."""
    return typer.Argument(metavar=metavar, help=help, readable=False, **kw)


class _Argument(TyperArgument):
    """An argument said in --help by its metavar alone: typer put a required one in braces
    ("Usage: budget report [OPTIONS] {plan}") and a Python type beside it ("plans...
    <list[Path]>", an audit), where the README writes PLAN and PLAN..."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        name = self.metavar or self.name or ""
        return [name if self.required else f"[{name}]"]

    def display_type_rich(self, ctx: click.Context) -> str | None:
        return None  # the help after it says what it takes


class Arguments(TyperCommand):
    """A command whose arguments are `_Argument`s: typer builds its own, and a command's
    class is the one place it lets a caller choose (`app.command(cls=...)`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                param.__class__ = _Argument


def _problems(problems: list[Problem]) -> None:
    from budget.errors import problem_lines

    for line in problem_lines(problems):
        print(line, file=sys.stderr)


def _fail(problems: BudgetError) -> typer.Exit:
    _problems(problems.problems)
    return typer.Exit(code=exit_code(valid=False))


def _usage(error: str | ValueError) -> typer.Exit:
    """A fault of the command line on stderr, one line for each of a `UsageErrors`'
    messages (every bad option at once); exit 2."""
    for message in error.messages if isinstance(error, UsageErrors) else (str(error),):
        print(usage_line(message), file=sys.stderr)
    return typer.Exit(code=exit_code(valid=False))


@app.command("report", cls=Arguments)
def report_command(
    plan: Annotated[Path, _argument("PLAN", "The plan to budget (YAML).")],
    fmt: FormatOption = Format.table,
) -> None:
    """Validate PLAN, calculate its budget and render it (the default command)."""
    _report(plan, str(fmt))


def _report(plan: Path, fmt: str) -> None:
    from budget.pipeline import budget_plan
    from budget.render import render_report

    try:
        report = budget_plan(plan)
    except BudgetError as error:
        raise _fail(error) from None
    render_report(stdout_console(), report, fmt)


@app.command("check", cls=Arguments)
def check_command(
    plans: Annotated[list[Path], _argument("PLAN...", "Plans that must fit (YAML).")],
    headroom: HeadroomOption = None,
    max_exposed: MaxExposedOption = None,
    max_step: MaxStepOption = None,
    max_ttft: MaxTtftOption = None,
    max_tpot: MaxTpotOption = None,
    fmt: LateFormatOption = Format.table,
) -> None:
    """CI gate: exit 0 when every plan fits its limits, 1 when one does not, 2 when one is
    invalid (its problems go to stderr; the other plans are still checked)."""
    from budget.check import check_plans, parse_limits
    from budget.render.check import render_check

    # every bad option, one line each
    limits, shape = _read_with_format(
        fmt, lambda: parse_limits(headroom, max_exposed, max_step, max_ttft, max_tpot)
    )
    result = check_plans(plans, limits)
    _problems(result.problems)
    render_check(stdout_console(), result, shape)
    raise typer.Exit(code=exit_code(valid=not result.invalid, passed=result.passed))


@app.command("diff", cls=Arguments)
def diff_command(
    a: Annotated[Path, _argument("A", "The plan before (YAML).")],
    b: Annotated[Path, _argument("B", "The plan after (YAML).")],
    fmt: FormatOption = Format.table,
) -> None:
    """Compare two plans: changed keys, then memory, step time and phases with deltas."""
    from budget.diff import diff_files
    from budget.render.diff import render_diff

    try:
        report_a, report_b, diff = diff_files(a, b)
    except BudgetError as error:
        raise _fail(error) from None
    render_diff(stdout_console(), report_a, report_b, diff, str(fmt))


@app.command("plot", cls=Arguments)
def plot_command(
    plan: Annotated[Path, _argument("PLAN", "The plan to draw (YAML).")],
    output: Annotated[Path, _option("<file>", "FILE.png or FILE.svg.", "--output", "-o")],
) -> None:
    """Picture: the worst stage's memory over the step, and exposed vs hidden communication
    per phase (needs matplotlib: pip install 'budget[plot]')."""
    from budget.files import unwritable
    from budget.pipeline import budget_plan
    from budget.plan.load import plan_name
    from budget.render.plot import PlotUnavailable, picture_format, plot_report

    # the command line's faults before the plan is read, as every command says them (an
    # audit: a .gif was refused only once the plan's problems were mended), and before the
    # drawing (an audit: refused after 3 s of it)
    faults = [f"cannot write {output}: {why}"] if (why := unwritable(output)) else []
    try:
        picture_format(output)
    except ValueError as error:
        faults.insert(0, str(error))
    if faults:
        raise _usage(UsageErrors(faults))
    try:
        plot_report(budget_plan(plan), output)
    except BudgetError as error:
        raise _fail(error) from None
    except (PlotUnavailable, ValueError) as error:
        raise _usage(str(error)) from None
    except OSError as error:  # the picture could not be written where asked
        reason = error.strerror or str(error)
        raise _usage(f"cannot write {output}: {reason.lower()}") from None
    print(f"{one_line(plan_name(plan))}: wrote {one_line(str(output))}")


@app.command("search", cls=Arguments)
def search_command(
    plan: Annotated[Path, _argument("PLAN", "The plan whose model, batch and cluster to use.")],
    # whole numbers read by `run_search`, which says a bad one beside the other bad options
    gpus: Annotated[
        str | None, _option("<count>", "GPUs to lay out (default: the plan's).")
    ] = None,
    tp: Annotated[str | None, _option("<list>", "Tensor parallel sizes: 4,8 or 1..8.")] = None,
    pp: Annotated[str | None, _option("<list>", "Pipeline depths.")] = None,
    cp: Annotated[str | None, _option("<list>", "Context parallel sizes.")] = None,
    ep: Annotated[str | None, _option("<list>", "Expert parallel sizes.")] = None,
    zero: Annotated[str, _option("<list>", "ZeRO stages.")] = "0..3",
    micro: Annotated[str | None, _option("<list>", "Micro-batch sizes.")] = None,
    virtual_stages: Annotated[
        str | None,
        _option("<list>", "Virtual pipeline stages (default: 1,2,4 and the plan's own)."),
    ] = None,
    recompute: Annotated[
        str, _option("<list>", "Recompute: none,selective,full.")
    ] = "none,selective,full",
    sp: Annotated[str, _option("<list>", "Sequence parallelism: true,false.")] = "false,true",
    hybrid: Annotated[
        str,
        _option(
            "<list>",
            "Hybrid sharding (parallel.dp_shard) under ZeRO 1 to 3: false (the default), "
            "true (a shard group of a node's dp ranks), or how many nodes' dp ranks a shard "
            "group takes, as in false,1,2,4.",
        ),
    ] = "false",
    objective: Annotated[str, _option("<time|memory|tokens-per-s>", "What to rank by.")] = "time",
    top: Annotated[str, _option("<count>", "How many layouts to list.")] = "10",
    write: Annotated[Path | None, _option("<file>", "Write the best layout as a plan.")] = None,
    headroom: HeadroomOption = None,
    max_exposed: SearchExposedOption = None,
    max_step: SearchStepOption = None,
    fmt: LateFormatOption = Format.table,
) -> None:
    """Sweep the parallel layouts of PLAN's model on the cluster; rank those that fit (and
    keep the limits given, as `budget check` counts them). Training plans only: budget a
    serving plan's layouts one plan at a time with `budget PLAN` and `budget check`."""
    from budget.search_cli import run_search

    code = run_search(
        plan,
        gpus,
        dict(
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            zero=zero,
            micro=micro,
            virtual_stages=virtual_stages,
            recompute=recompute,
            sp=sp,
            hybrid=hybrid,
            headroom=headroom,
            max_exposed=max_exposed,
            max_step=max_step,
        ),
        objective,
        top,
        write,
        fmt,
        stdout_console(),
    )
    if code:
        raise typer.Exit(code=code)


@app.command("validate", cls=Arguments)
def validate_command(
    plans: Annotated[list[Path], _argument("PLAN...", "Plans to check (YAML).")],
    fmt: FormatOption = Format.table,
) -> None:
    """Check plans against the schema and the semantic rules only: each valid plan's
    file and "ok" on stdout, every problem of the others on stderr (exit 2 if there is one);
    json and markdown list every plan with its problems on stdout as well."""
    from budget.plan.load import load_plan, plan_name
    from budget.render.check import render_validate
    from budget.step import derive

    outcomes: list[tuple[str, list[Problem]]] = []
    for path in plans:
        try:
            # deriving the step runs the rules that need the phases too: hand-written
            # transitions name a phase that exists and leave no tensor sum-partial
            derive(load_plan(path))
        except BudgetError as error:
            outcomes.append((plan_name(path), list(error.problems)))
            continue
        outcomes.append((plan_name(path), []))
    # the files in the order given, as `check` keeps them; each file's by position already
    # (`BudgetError`)
    problems = [p for _, found in outcomes for p in found]
    _problems(problems)
    render_validate(stdout_console(), outcomes, str(fmt))
    if problems:
        raise typer.Exit(code=exit_code(valid=False))


@app.command("schema")
def schema_command() -> None:
    """Print the plan JSON schema (Draft 2020-12)."""
    import json

    from budget.plan.schema import schema_text
    from budget.render import dump_json, utf

    text = schema_text()
    # as it is kept, unless the stream would turn its µ into ? (`dump_json`)
    sys.stdout.write(text if utf(sys.stdout) else dump_json(json.loads(text), sys.stdout))


@app.command("collective", cls=Arguments)
def collective_command(
    op: Annotated[
        str,
        _argument(
            "OP", "all-gather, reduce-scatter, all-reduce, all-to-all, broadcast or send-recv."
        ),
    ],
    # read by `collective`, so that "2.5" is said beside the other bad options (an audit)
    ranks: Annotated[str | None, _option("<count>", "Group size P.")] = None,
    size: Annotated[str, _option("<size>", "Full logical tensor size S, e.g. 1GiB.")] = "",
    bandwidth: Annotated[
        str | None, _option("<rate>", "Per-rank link bandwidth, e.g. 450GB/s.")
    ] = None,
    latency: Annotated[str | None, _option("<time>", "Latency per phase, e.g. 1us.")] = None,
    level: Annotated[
        list[str] | None,
        _option(
            "<size:rate:time>",
            "SIZE:BANDWIDTH:LATENCY[:NAME], innermost first; repeat per level.",
        ),
    ] = None,
    algorithm: Annotated[
        str | None,
        _option(
            "<name>",
            "ring, recursive, tree, pairwise, bruck, direct, hierarchical, double-tree or auto "
            "(the cheapest the op can use). Default: ring (all-to-all pairwise, send-recv "
            "direct); over two or more --level a ring through every rank as NCCL runs it for "
            "all-gather, reduce-scatter and broadcast, for all-reduce that ring or NCCL's "
            "double binary tree (double-tree), whichever is faster, as NCCL's tuner picks, "
            "and for all-to-all NCCL's grouped send/recv with every peer at once; "
            "hierarchical names the two-level decomposition. tree is the textbook binomial "
            "tree (whole tensor each step, for small messages).",
        ),
    ] = None,
    ramp: Annotated[
        str | None,
        _option(
            "<name>",
            "Measured bandwidth ramp of the (innermost) link by message size: nvlink3, "
            "nvlink4 or nvlink5, as the topology presets' NVLink levels carry; none (the "
            "default).",
        ),
    ] = None,
    beside: Annotated[
        str | None,
        _option(
            "<time>",
            "Compute W the collective runs beside, e.g. 1ms: its exposed part is then "
            "max(0, T − W/(1 − s)), if an overlap schedule lets them run together.",
        ),
    ] = None,
    slowdown: Annotated[
        str | None,
        _option(
            "<fraction>",
            "With --beside, how much slower the compute s runs beside the collective, as a "
            "plan's overlap.slowdown: 0.189 (the default, Lee et al.'s average) or 0 for ideal "
            "overlap.",
        ),
    ] = None,
    fmt: LateFormatOption = Format.table,
) -> None:
    """Price one collective: phases, bytes sent/received per rank, time."""
    from budget.calculators import collective
    from budget.render.calculators import render_collective

    # every bad option, one line each (`UsageErrors`)
    result, shape = _read_with_format(
        fmt,
        lambda: collective(
            op, ranks, size, bandwidth, latency, level or [], algorithm, ramp, beside, slowdown
        ),
    )
    render_collective(stdout_console(), result, shape)


@app.command("roofline")
def roofline_command(
    # not required by typer, which said only the first missing one: `roofline` says each
    intensity: Annotated[
        str | None, _option("<flop/byte>", "Arithmetic intensity, e.g. 4 or 4FLOP/byte.")
    ] = None,
    bandwidth: Annotated[str | None, _option("<rate>", "Memory bandwidth, e.g. 80GB/s.")] = None,
    peak: Annotated[str | None, _option("<flop/s>", "Compute ceiling, e.g. 1000GFLOP/s.")] = None,
    fmt: LateFormatOption = Format.table,
) -> None:
    """Attainable FLOP/s = min(peak, intensity x bandwidth), and which ceiling binds."""
    from budget.calculators import roofline
    from budget.render.calculators import render_roofline

    # every bad option, one line each (`UsageErrors`)
    result, shape = _read_with_format(fmt, lambda: roofline(intensity, bandwidth, peak))
    render_roofline(stdout_console(), result, shape)


class PresetKind(StrEnum):  # `budget.presets.KINDS`, kept here so --help imports nothing
    devices = "devices"
    topologies = "topologies"
    models = "models"


def _preset_kind(value: str) -> PresetKind:
    """The catalogue named, in any case; typer's own enum check would prefix its refusal
    with its validator's "Value error," (as `_format` says)."""
    try:
        return PresetKind(value.lower())
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not one of devices, topologies or models") from None


@app.command("presets", cls=Arguments)
def presets_command(
    kind: Annotated[
        PresetKind | None,
        _argument(
            "KIND",
            f"{'|'.join(PresetKind)}: which catalogue to list; all three when left out.",
            parser=_preset_kind,
        ),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """The catalogue: every device, topology and model preset, its numbers and sources."""
    from budget.presets import catalogue
    from budget.render.presets import render_presets

    render_presets(stdout_console(), catalogue(None if kind is None else kind.value), str(fmt))


@app.command("validate-model")
def validate_model_command(
    fmt: FormatOption = Format.table,
    write_plans: Annotated[
        Path | None,
        typer.Option(
            "--write-plans",
            help="Also write every run as a plan file into this directory, to rerun one row "
            "with `budget FILE`.",
        ),
    ] = None,
) -> None:
    """Predicted against published measurements of training step times, peak memory and
    serving latency: each run's error, each table's mean and maximum."""
    from budget.accuracy import validate_model
    from budget.render.accuracy import render_accuracy

    if write_plans is not None:  # a folder that cannot be one, before the runs are priced
        _plans_folder(write_plans)
    accuracy = validate_model()
    if write_plans is not None:
        _write_run_plans(accuracy, write_plans)
    render_accuracy(stdout_console(), accuracy, str(fmt))


def _plans_folder(directory: Path) -> None:
    """Make `directory` for ``--write-plans``, or refuse it as a usage error: checked before
    `validate_model` prices its runs (an audit: a file named as the folder was refused only
    after 4.6 s of them)."""
    import os

    from budget.files import exists

    if exists(directory) and not directory.is_dir():
        raise _usage(f"--write-plans {directory}: is a file; name a folder to write the plans in")
    parent = directory.absolute().parent
    if not parent.is_dir():  # made one level deep, as `plot -o` and `search --write` write
        # into a folder that is there (an audit: a mistyped /nonexistent/d made /nonexistent)
        raise _usage(f"--write-plans {directory}: there is no folder {parent}")
    try:
        directory.mkdir(exist_ok=True)
    except OSError as error:
        raise _usage(f"--write-plans {directory}: {error.strerror or error}") from None
    if not os.access(directory, os.W_OK):
        raise _usage(f"--write-plans {directory}: the folder is not writable")


def _write_run_plans(accuracy: Accuracy, directory: Path) -> None:
    """Each scored, reference, diagnostic and peak-memory run as ``DIRECTORY/<run>.yaml``,
    its schema reference relative to the directory; a note on stderr says how many."""
    import os

    from budget.accuracy import plan_file_name, plan_text
    from budget.files import write_all

    schema = Path(__file__).parent / "schemas" / "plan.schema.json"
    reference = os.path.relpath(schema, os.path.realpath(directory))  # through a link
    sections = (
        ("scored", accuracy.rows),
        ("reference", accuracy.reference),
        ("diagnostic", accuracy.diagnostic),
        ("peak-memory", accuracy.memory),
        ("serving", accuracy.serving),
    )
    files = [
        (directory / plan_file_name(row.run), plan_text(row.run, kind, reference))
        for kind, rows in sections
        for row in rows
    ]
    try:  # all of them or none
        write_all(files)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise _usage(
            f"--write-plans {directory}: cannot write {error.filename}: {reason}"
        ) from None
    print(f"budget: wrote {len(files)} run plans to {one_line(str(directory))}", file=sys.stderr)
