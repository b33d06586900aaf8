"""`budget search`: options in, a sweep, a rendered answer and an exit code out."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budget.errors import BudgetError, note_line, one_line, problem_lines, usage_line

if TYPE_CHECKING:
    from rich.console import Console

    from budget.check import Limits
    from budget.plan.model import Plan
    from budget.search import Outcome, Result, Space

OBJECTIVES = ("time", "memory", "tokens-per-s")


def space(options: dict[str, str | None]) -> Space:
    """The sweep's dimensions from the command line's pins and ranges; every bad one at
    once (`UsageErrors`, one message each, in the order `budget search --help` lists them)."""
    from budget.errors import UsageErrors
    from budget.search import RECOMPUTE, Space, parse_values

    errors: list[str] = []

    def ints(name: str, low: int = 1, high: int | None = None) -> tuple[int, ...] | None:
        """The option's values, each in [low, high] as the plan schema bounds the key; None
        where it is not given or is bad (the error is kept)."""
        text = options.get(name)
        if text is None:
            return None
        option = f"--{name.replace('_', '-')}"
        try:
            values = parse_values(text, option)
        except ValueError as error:
            errors.append(str(error))
            return None
        bad = [v for v in values if v < low or (high is not None and v > high)]
        if bad:
            bounds = f"{low}..{high}" if high is not None else f"at least {low}"
            errors.append(f"{option} {text!r}: {bad[0]} is out of range ({bounds})")
            return None
        return values

    dims = {
        "tp": ints("tp"),
        "pp": ints("pp", 1, 1024),
        "cp": ints("cp"),
        "ep": ints("ep"),
        "zero": ints("zero", 0, 3),
        "micro": ints("micro"),
        "virtual_stages": ints("virtual_stages"),
    }
    # a value named twice is swept once (it listed every layout twice)
    recompute = tuple(dict.fromkeys(r.strip() for r in (options["recompute"] or "").split(",")))
    if not recompute or any(r not in RECOMPUTE for r in recompute):
        errors.append(f"--recompute {options['recompute']!r}: use none, selective, full")
    flags = {"true": True, "false": False}
    sp = tuple(
        dict.fromkeys(flags.get(v.strip().lower()) for v in (options["sp"] or "").split(","))
    )
    if not sp or None in sp:
        errors.append(f"--sp {options['sp']!r}: use true, false or true,false")
    given = options.get("hybrid") or "false"

    def nodes(value: str) -> int | None:
        """false (0), true (a node's dp ranks: 1), or how many nodes' a shard group takes."""
        value = value.strip().lower()
        if value in flags:
            return int(flags[value])
        return int(value) if value.isdecimal() and 1 <= int(value) <= 1024 else None

    hybrid = tuple(dict.fromkeys(nodes(v) for v in given.split(",")))
    if not hybrid or None in hybrid:
        errors.append(
            f"--hybrid {given!r}: use false, true, or the nodes a shard group spans "
            "(1 to 1024), as in false,true or false,1,2,4"
        )
    if errors:
        raise UsageErrors(errors)
    return Space(
        tp=dims["tp"],
        pp=dims["pp"],
        cp=dims["cp"],
        ep=dims["ep"],
        zero=dims["zero"] or (0, 1, 2, 3),
        sequence_parallel=tuple(v for v in sp if v is not None),
        recompute=recompute,  # type: ignore[arg-type]
        micro=dims["micro"],
        virtual_stages=dims["virtual_stages"] or Space().virtual_stages,
        hybrid=tuple(v for v in hybrid if v is not None),
    )


def run_search(
    path: Path,
    gpus: int | str | None,
    options: dict[str, str | None],
    objective: str,
    top: int | str,
    write: Path | None,
    fmt: str,
    console: Console,
) -> int:
    """0 when a layout fits and keeps the limits (and was written if asked), 1 when none
    does, 2 on bad input."""
    from budget.check import parse_limits
    from budget.collectives import SizeError
    from budget.errors import UsageErrors, format_refusal
    from budget.plan.load import load_plan_data, plan_name, read_plan_bytes
    from budget.plan.resolve import divisors
    from budget.render import dump_document
    from budget.render.search import (
        render_search_markdown,
        render_search_table,
        written_beats_best,
    )
    from budget.search import magnitude, search, to_dict
    from budget.topology import MAX_GPUS
    from budget.units import format_bytes

    # every bad option at once, one line each, in the order --help lists them, before
    # anything is read or swept
    errors: list[str] = []
    # read here, not by typer, whose "not a valid integer" hid every other bad option
    count, keep = _whole(gpus, "--gpus", errors), _whole(top, "--top", errors)
    if count is not None and count < 1:
        errors.append(f"--gpus {count}: lay out at least 1 GPU")
    try:
        sweep = space(options)
    except UsageErrors as error:
        errors.extend(error.messages)
    if objective not in OBJECTIVES:
        errors.append(f"--objective {objective!r}: use {', '.join(OBJECTIVES)}")
    if keep is not None and keep < 1:
        errors.append(f"--top {keep}: list at least 1 layout")
    try:
        if write is not None:
            _writable(write, path)
    except ValueError as error:
        errors.append(str(error))
    given = [options.get(k) for k in ("headroom", "max_exposed", "max_step")]
    try:
        limits = parse_limits(*given) if any(v is not None for v in given) else None
    except UsageErrors as error:
        errors.extend(error.messages)
    errors.extend(format_refusal(fmt))  # read here, as `check` does, to be said beside them
    fmt = fmt.lower()
    if errors:
        for message in errors:
            print(usage_line(message), file=sys.stderr)
        return 2
    shown = 10 if keep is None else keep  # read above: a bad one returned
    file = plan_name(path)
    try:
        data = read_plan_bytes(path)  # once: `-` and pipes cannot be read again
        plan = load_plan_data(data, file, seed=True)  # its layout is what the search replaces
    except BudgetError as error:
        for line in problem_lines(error.problems):
            print(line, file=sys.stderr)
        return 2
    if options.get("virtual_stages") is None:
        sweep = _with_own_stages(sweep, plan)
    room = plan.device.memory - plan.device.reserved  # what any layout could leave free
    required = None if limits is None else limits.required_headroom(plan.device.memory)
    if required is not None and required >= room:
        # a review: every layout was priced and rejected "over a limit"; as a share of the
        # device too (an audit: --headroom 100% priced every layout, then exit 1)
        asked = format_bytes(required)
        if limits is not None and limits.headroom_share is not None:
            asked = f"{options['headroom']} ({asked} of {format_bytes(plan.device.memory)})"
        said = (
            f"--headroom {asked}: the device holds {format_bytes(room)} beside what it "
            "reserves, so no layout can leave that free"
        )
        print(usage_line(said), file=sys.stderr)
        return 2
    if plan.mode != "train":
        print(
            _located(
                data,
                file,
                "$.mode",
                "budget search sweeps training layouts (ZeRO, recompute, micro-batches); this "
                f"plan is mode: {plan.mode}. Budget inference layouts one plan at a time with "
                "`budget PLAN`",
            ),
            file=sys.stderr,
        )
        return 2
    if plan.parallel.dp_shard is not None:
        hybrid = (
            f"budget search sweeps dp, and with --hybrid shard groups of whole nodes; this "
            f"plan shards over dp_shard = {plan.parallel.dp_shard} of its dp, which other "
            "degrees do not keep. Remove dp_shard and search with --hybrid false,true (or "
            "false,1,2,4: the nodes a shard group spans) to weigh hybrid sharding against "
            "ZeRO over all of dp"
        )
        print(_located(data, file, "$.parallel.dp_shard", hybrid), file=sys.stderr)
        return 2
    untimed = _untimed(plan)
    if untimed:
        print(_located(data, file, "$.device", untimed), file=sys.stderr)
        return 2
    n = count or plan.topology.gpus
    if n > MAX_GPUS:  # a plan's own GPUs are held to it as it loads (`resolve.topology`)
        limit = (
            f"budget search lays out at most {MAX_GPUS:,} GPUs (the largest clusters hold a "
            "few hundred thousand)"
        )
        print(usage_line(f"--gpus {n:,}: {limit}"), file=sys.stderr)
        return 2
    for level in plan.topology.levels:
        if level.size and n % level.size and n > level.size:
            message = (
                f"--gpus {n}: the topology's {level.name} domains hold {level.size} GPUs "
                f"each, so a count fills whole domains (a multiple of {level.size}) or sits "
                f"inside one ({level.size} or fewer)"
            )
            print(usage_line(message), file=sys.stderr)
            return 2
    outer = plan.topology.levels[-1]
    if outer.size and outer.size < n:  # as a plan's own GPUs are held (resolve: levels)
        message = (
            f"--gpus {n}: the topology's outermost level {outer.name} holds {outer.size} "
            "GPUs, so no layout of more can be wired; drop its size or add an outer level "
            "in the plan"
        )
        print(usage_line(message), file=sys.stderr)
        return 2
    # every option whose values can build no layout, each said (an audit: the first stopped it)
    unbuilt: list[str] = []
    for name in ("tp", "pp", "cp", "ep"):  # every value of a degree the GPUs cannot hold
        values = getattr(sweep, name)
        if options.get(name) is not None and values and all(n % v for v in values):
            every = divisors(n)
            listed = f" (it divides by {', '.join(map(str, every))})" if len(every) <= 24 else ""
            unbuilt.append(
                f"--{name} {options[name]}: no value divides the {n:,} GPUs, "
                f"so no layout can be built{listed}"
            )
    degrees = frozenset(line.split()[0][2:] for line in unbuilt)  # "--tp 3: ..." → tp
    unbuilt += _refused_values(options, sweep, plan, n, degrees)
    for line in unbuilt:
        print(usage_line(line), file=sys.stderr)
    if unbuilt:
        return 2
    too_many = _too_many(options, sweep, plan, n)
    if too_many:
        print(usage_line(too_many), file=sys.stderr)
        return 2
    too_large = magnitude(plan, n, sweep)
    if too_large:  # the option's values where given (an audit: --micro 1000000 was blamed
        # on the plan's own `micro: 4`)
        if options.get("micro") is not None:
            print(usage_line(f"--micro {options['micro']}: {too_large}"), file=sys.stderr)
        else:  # even one sequence a micro-batch, the sweep's least, is too large: the plan's
            # sizes together, its sequence or its model, not the `micro` it does not keep (an
            # audit, m468: `micro: 4` was named for a billion-token sequence)
            print(_located(data, file, "$", too_large), file=sys.stderr)
        return 2
    try:
        outcome = search(
            plan, n, sweep, objective, _progress(console, fmt), keep=shown, limits=limits
        )
    except (OverflowError, FloatingPointError, SizeError):  # past int64 after all
        overflow = (
            "the plan's sizes overflow the search's 64-bit arithmetic; budget the plan alone "
            "with `budget PLAN`, which counts in Python integers"
        )
        print(_located(data, file, "$.batch", overflow), file=sys.stderr)
        return 2
    contradiction = _contradiction(options, sweep, plan, outcome) if not outcome.evaluated else ""
    if contradiction:
        print(usage_line(contradiction), file=sys.stderr)
        return 2
    written, breaks, refused = _written(data, file, n, plan, limits)
    outcome = dataclasses.replace(outcome, written=written, written_breaks=breaks)
    if refused:  # the layout the search replaces, which `budget PLAN` refuses: said, not fatal
        message = f"the plan as written is not a valid layout ({refused}); searched anew"
        print(note_line(message), file=sys.stderr)
    if write is not None and outcome.best is not None:
        from budget.search import apply

        layout = outcome.best.config.to_dict()
        layout["layers_per_stage"] = apply(
            plan, outcome.best.config, n
        ).parallel.pipeline.layers_per_stage
        try:
            _write(path, data, layout, n, write)
        except OSError as error:  # checked up front; the folder may change during the sweep
            reason = (error.strerror or str(error)).lower()
            print(usage_line(f"--write {write}: {reason}"), file=sys.stderr)
            return 2
    if fmt == "json":
        console.file.write(dump_document(to_dict(outcome, shown), console.file))
    elif fmt == "markdown":
        console.file.write(render_search_markdown(outcome, shown))
    else:
        render_search_table(console, outcome, shown)
        if write is not None and outcome.best is not None:
            # the plan as written may do better, at a setting the sweep never took (a search
            # audit, m507: its own layers_per_stage beat the "best" layout written over it)
            better = (
                " (the plan as written does better: above)" if written_beats_best(outcome) else ""
            )
            console.print(
                f"Wrote the best layout searched to {one_line(str(write))}{better}", markup=False
            )
    if write is not None and outcome.best is None:  # a review: nothing said it wrote nothing
        print(
            note_line(f"--write {write}: no layout ranks, so nothing was written"), file=sys.stderr
        )
    return 0 if outcome.best is not None else 1


def _whole(value: int | str | None, flag: str, errors: list[str]) -> int | None:
    """An option's whole number, or None where it is not given or is no whole number (then
    said in `errors`, "--top abc" beside the other bad options)."""
    if value is None or isinstance(value, int):
        return value
    try:
        return int(value.strip().replace("_", "x"))  # "1_000" is no count a user types
    except ValueError:
        errors.append(f"{flag} {value!r}: expected a whole number, such as 8")
        return None


def _too_many(options: dict[str, str | None], sweep: Space, plan: Plan, gpus: int) -> str:
    """Why the sweep would consider more layouts than `MAX_GRID` (each option is capped at
    1,024 values, but not their product: an audit's five ranges of 1,024 values were killed
    for memory at 24 GB), naming the options given with the most values; "" otherwise."""
    from budget.search import MAX_GRID, grid_size

    size = grid_size(plan, gpus, sweep)
    if size <= MAX_GRID:
        return ""

    def swept(name: str) -> int:
        """The values of an option that reach the grid: a degree's that divide the GPUs
        (a review: --tp 1..1024 on 8 GPUs was named for its 1,024 values, of which 4 count)."""
        values = set(getattr(sweep, name) or ())
        degree = name in ("tp", "pp", "cp")  # ep's every value is on the grid (`_axes`)
        return len({v for v in values if gpus % v == 0} if degree else values)

    counts = {  # the options given, by how many values each sweeps
        f"--{name.replace('_', '-')} {options[name]}": swept(name)
        for name in ("tp", "pp", "cp", "ep", "micro", "virtual_stages")
        if options.get(name) is not None and swept(name) > 1
    }
    widest = sorted(counts, key=lambda option: -counts[option])[:3]
    divide = ("--tp", "--pp", "--cp")
    narrow = (
        "narrow "
        + ", ".join(
            f"{option} ({counts[option]:,} values"
            + (" that divide the GPUs)" if option.startswith(divide) else ")")
            for option in widest
        )
        if widest
        else "narrow the sweep with --tp, --pp, --micro or --virtual-stages"
    )
    return (
        f"the search would consider {size:,} layouts on {gpus:,} GPUs before its rules "
        f"reject any, past the {MAX_GRID:,} it sweeps at most; {narrow}"
    )


def _with_own_stages(sweep: Space, plan: Plan) -> Space:
    """`sweep` with the plan's own virtual stages among its own, once: the plan's own
    interleaving is swept too (an audit: a plan at 12 virtual stages beat the default
    sweep's best, which had only 1, 2 and 4)."""
    stages = tuple(sorted({*sweep.virtual_stages, plan.parallel.pipeline.virtual_stages}))
    return dataclasses.replace(sweep, virtual_stages=stages)


def _untimed(plan: Plan) -> str:
    """Why the sweep cannot time the plan's layouts, "" where it can: every layout is
    ranked, and bounded, by the step its pass prices (an audit: without a peak the sweep
    ranked layouts by their communication alone, 20.6 ms steps at 0.0 % MFU, and without a
    bandwidth at 18,506 % MFU, where `budget PLAN` says the time is not computed)."""
    from budget.schedule import can_time

    if can_time(plan):
        return ""
    device, matmul = plan.device, plan.precision.matmul
    missing = []
    if not device.peak_flops(matmul):
        missing.append(f"a peak FLOP/s for its {matmul} GEMMs (device.flops.{matmul})")
    if not device.memory_bandwidth:
        missing.append("a memory bandwidth (device.memory_bandwidth)")
    them = "them" if len(missing) > 1 else "it"
    return (
        f"budget search times every layout it ranks, which needs {' and '.join(missing)}: "
        f"name a device preset (`budget presets devices`) or write {them}; `budget PLAN` "
        "budgets this plan's memory without it"
    )


def _contradiction(
    options: dict[str, str | None], sweep: Space, plan: Plan, outcome: Outcome
) -> str:
    """Why the layout options given build no layout where the sweep without them builds
    some: values that contradict each other (an audit: `--sp true --tp 1`, `--virtual-stages
    2 --pp 1` and an `--ep` no tp x cp x dp holds each priced nothing, then exit 1, read as
    "none fits"), with the rules that ruled them out, most layouts first; "" otherwise."""
    from budget.search import Space, blocking_rules, buildable

    default, fields = Space(), {"sp": "sequence_parallel"}
    names = ("tp", "pp", "cp", "ep", "zero", "micro", "virtual_stages", "recompute", "sp", "hybrid")
    flags = [
        f"--{name.replace('_', '-')} {options[name]}"
        for name in names
        if options.get(name) is not None
        and (
            name == "virtual_stages"
            or set(getattr(sweep, fields.get(name, name)) or ())
            != set(getattr(default, fields.get(name, name)) or ())
        )
    ]
    if not flags:
        return ""
    # the sweep's own default, the plan's virtual stages once among them (a review: its 1
    # beside the default's counted its layouts twice)
    built = buildable(plan, outcome.gpus, _with_own_stages(default, plan))
    if not built:
        return ""
    # the rules its layouts broke, else (none made) the degrees ruled out whole, as `--tp 64`
    # of 96 heads; the first rule each layout broke where no rule stands alone
    ranked = sorted(outcome.rejected.items(), key=lambda item: -item[1])
    ruled = [f"{reason}: {', '.join(d)}" for reason, d in outcome.ruled_out.items()]
    first = [f"{reason}: {count:,} layouts" for reason, count in ranked]
    why = "; ".join((blocking_rules(plan, outcome.gpus, sweep) or first or ruled)[:3])
    these, them = ("these values together", "them") if len(flags) > 1 else ("it", "it")
    return (
        f"{' '.join(flags)}: no layout can be built from {these} ({why}); without {them} "
        f"the search builds {built:,} on {outcome.gpus:,} GPUs"
    )


def _refused_values(
    options: dict[str, str | None],
    sweep: Space,
    plan: Plan,
    gpus: int,
    said: frozenset[str] = frozenset(),
) -> list[str]:
    """Why values given on the command line can build no layout of the plan's model, as
    `--tp 3` on 8 GPUs is refused (an audit: these priced nothing, or a count of layouts
    "does not divide", then exit 1; so did `--ep 16` over 8 experts and `--tp 8 --pp 8
    --cp 4` on 64 GPUs, each value of which divides them), one reason an option; none
    where they can. `said`: the degrees refused already (not said again, nor their product)."""
    from budget.plan.resolve import divisors

    refused = []
    experts = plan.model.experts
    if experts is None and sweep.ep and any(e > 1 for e in sweep.ep):
        refused.append(f"--ep {options['ep']}: the model has no experts: --ep needs an MoE model")
    unsaid = "ep" not in said
    if experts is not None and sweep.ep and unsaid and all(experts.count % e for e in sweep.ep):
        refused.append(
            f"--ep {options['ep']}: no value divides the model's {experts.count:,} experts, "
            "so no layout can be built"
        )
    chunks = min(sweep.virtual_stages)  # a stage holds at least one layer a chunk
    deep = options.get("pp") and "pp" not in said
    if sweep.pp and deep and all(p * chunks > plan.model.layers for p in sweep.pp):
        least = f" x {chunks} virtual stages" if chunks > 1 else ""
        refused.append(
            f"--pp {options['pp']}: every value makes more pipeline chunks (pp{least}) than "
            f"the model's {plan.model.layers:,} layers, so no layout can be built"
        )
    given = [(name, getattr(sweep, name)) for name in ("tp", "pp", "cp") if options.get(name)]
    if len(given) > 1 and not said:  # a degree not given can be 1, which divides any count
        # the products that divide the GPUs, a degree at a time: a product that does not
        # divide them has no multiple that does, so ranges of 1,000 values stay cheap
        products = {1}
        for _, values in given:
            products = {p * v for p in products for v in set(values) if gpus % (p * v) == 0}
        if not products:
            flags = " ".join(f"--{name} {options[name]}" for name, _ in given)
            names = " x ".join(name for name, _ in given)
            refused.append(
                f"{flags}: no combination's {names} divides the {gpus:,} GPUs, so no layout "
                "can be built"
            )

    batch = plan.batch.global_batch
    if sweep.micro and all(batch % m for m in sweep.micro):
        sizes = divisors(batch)
        listed = f" (it divides by {', '.join(map(str, sizes))})" if len(sizes) <= 24 else ""
        refused.append(
            f"--micro {options['micro']}: no value divides the global batch of "
            f"{batch:,} sequences, so no layout can be built{listed}"
        )
    return refused


def _written(
    data: bytes, file: str, gpus: int, seed: Plan, limits: Limits | None
) -> tuple[Result | None, tuple[str, ...], str]:
    """The plan's own layout as `budget PLAN` budgets it and the limits it breaks
    (`search.as_written`), when the search lays out its GPUs and the layout is a valid one
    (a seed's is not checked); else, where `budget PLAN` refuses it, its first problem
    (and how many more) for a note (a review: the row vanished unsaid)."""
    from budget.plan.load import load_plan_data
    from budget.search import as_written

    if gpus != seed.topology.gpus:
        return None, (), ""
    try:
        return (*as_written(load_plan_data(data, file), limits), "")
    except BudgetError as error:
        first, *rest = error.problems
        more = f", and {len(rest)} more" if rest else ""
        return None, (), f"{first.path}: {first.message}{more}"


def _located(data: bytes, file: str, where: str, message: str) -> str:
    """`message` as a problem of the plan `file` whose bytes are `data` (it loaded, so
    they decode), at the line and column of `where` (a JSON path; its nearest ancestor the
    file has), as the plan's own errors read."""
    from budget.errors import Problem
    from budget.plan.yaml_load import decode, load_yaml

    text = decode(data, file)[0] or ""
    line, col = load_yaml(text, file).marks.at(where)
    return str(Problem(file, line, col, where, message))


def _writable(target: Path, source: Path) -> None:
    """Refuse a ``--write`` path that cannot take a file before the sweep runs, so that a
    typo costs no search and leaves nothing half-printed; and the plan being searched,
    whose comments (its sources) the written plan does not keep."""
    from budget.files import exists, unwritable

    if str(source) == "-":  # the written plan is the searched one rewritten, and stdin is gone
        raise ValueError(
            f"--write {target}: the plan came from standard input, which is read once; give "
            "its file to write a layout from it"
        )
    if exists(target) and exists(source) and target.resolve() == source.resolve():
        raise ValueError(
            f"--write {target}: is the plan being searched; write the layout to another file"
        )
    why = unwritable(target)  # the file it lands in: through links, as the write goes
    if why:
        raise ValueError(f"--write {target}: {why}")


def _write(source: Path, data: bytes, layout: dict[str, Any], gpus: int, target: Path) -> None:
    """Write the layout as a plan at `target`, pointing editors at the same schema as the
    source plan and reading the same ``hf_config`` (both paths made relative to the new
    file, `plan.write.rebased`); at the installed schema where the source's reference
    reaches no file (a plan copied out of the repository: an audit)."""
    from budget.files import plan_folder
    from budget.files import target as landing
    from budget.plan.write import layout_yaml, rebased

    # paths in the plan are relative to the folder its file lands in (through a link)
    folder = landing(target).parent
    reference = os.path.relpath(Path(__file__).parent / "schemas" / "plan.schema.json", folder)
    first = data.decode("utf-8", "replace").partition("\n")[0]
    marker = "$schema="
    if marker in first and "://" not in first:
        theirs = rebased(first.split(marker, 1)[1].strip(), plan_folder(source), folder)
        if (folder / theirs).is_file():  # an absolute one joins as itself
            reference = theirs
    from budget.files import write_atomically

    write_atomically(target, layout_yaml(source, data, layout, gpus, reference, folder))


def _progress(console: Console, fmt: str) -> Any:
    """A progress bar on the terminal for long table-format sweeps; nothing otherwise."""
    if fmt != "table" or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import Progress

    # on stderr, which was asked whether it is a terminal: on stdout it drew into a pipe
    # (`budget search plan | head -1` printed the bar's empty line, a review)
    bar = Progress(transient=True, console=Console(stderr=True))
    task = bar.add_task("budgeting layouts", total=None)
    bar.start()

    def advance(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)
        if done == total:
            bar.stop()

    return advance
