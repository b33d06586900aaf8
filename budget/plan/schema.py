"""The plan JSON Schema (Draft 2020-12): the contract editors load, and the first check.

The schema ships inside the package (``budget/schemas/plan.schema.json``); the repository's
``schemas/plan.schema.json`` is a link to the same file. Every jsonschema error becomes a
`Problem` positioned at the offending node, with a short message a person can act on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from importlib.resources import files
from typing import Any

from budget.errors import MAX_SHOWN, Problem, close_matches
from budget.plan.yaml_load import Marks, ancestors, child_path
from budget.units import ambiguous_prefix, missing_unit

__all__ = ["model_problems", "schema", "schema_text", "validate_tree"]


@cache
def schema_text() -> str:
    """The schema file's text, exactly as shipped (``budget schema`` prints it)."""
    return files("budget").joinpath("schemas/plan.schema.json").read_text(encoding="utf-8")


@cache
def schema() -> dict[str, Any]:
    """The schema as a dictionary."""
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


@cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema())


def validate_tree(
    tree: Any,
    marks: Marks,
    file: str,
    refused: frozenset[str] = frozenset(),
    unfinished: frozenset[str] = frozenset(),
) -> list[Problem]:
    """Every way `tree` breaks the schema, one `Problem` each, positioned by `marks`.

    `refused` are the paths where the loader refused a value and left None in its place
    (already a problem of their own): the schema's complaint about that None is not
    repeated, but any other problem at the same path (an unknown key) still is.
    `unfinished` are the collections a cap stopped the reading in (`Loaded.partial`): what
    they lack or how they match is not said, only the keys they hold that no plan takes."""
    problems: list[Problem] = []
    # the keys a section lacks, and what would fill them where the schema says (a preset)
    missing: dict[str, tuple[list[str], str | None]] = {}
    meant: set[str] = set()  # paths of keys an unknown key's problem suggests in its place
    holders = _holders(marks)  # the paths that hold a scalar quoted as written
    for error in _validator().iter_errors(tree):
        path = _path(error.absolute_path)
        held = path in unfinished or (error.instance is None and path in refused)
        if held and error.validator != "additionalProperties":
            continue
        if error.validator == "required":
            hint = error.schema.get("x-missing") if isinstance(error.schema, dict) else None
            keys = [k for k in error.validator_value if repr(k) in error.message]
            found = missing.setdefault(path, ([], hint))
            found[0].extend(k for k in keys if k not in found[0])
            continue
        if error.validator == "additionalProperties":
            found_keys = _unknown_keys(error, path, marks, file)
            problems.extend(problem for problem, _ in found_keys)
            meant.update(child_path(path, key) for _, key in found_keys if key)
            continue
        problems.extend(_problems(error, marks, file, holders))
    for path, (keys, hint) in missing.items():
        # one problem a section, not one a key: each said the same remedy (four times for
        # a model written without its dimensions); none for a key an unknown one beside it
        # is told it likely is (a user audit, m413: `micro_batch: 1` was also told that
        # 'micro' is required, at the section's first line, before the line of the typo)
        named = [repr(k) for k in keys if child_path(path, k) not in meant]
        if not named:
            continue
        listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
        verb = "is a required property" if len(named) == 1 else "are required properties"
        said = f"{listed} {verb}" + (f": {hint}" if hint else "")
        problems.append(Problem(file, *marks.at(path), path, said))
    return sorted(set(problems))


def model_problems(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, message) for every way a `model:` section built elsewhere (from a Hugging Face
    config) breaks the schema, so that its values meet the bounds a written one does."""
    found = []
    for error in _validator().iter_errors({"model": model}):
        if list(error.absolute_path)[:1] == ["model"]:
            found.append((_path(error.absolute_path), _message(error)))
    return sorted(set(found))


def _path(parts: Iterable[str | int]) -> str:
    path = "$"
    for part in parts:
        path = child_path(path, part)
    return path


def _problems(
    error: Any, marks: Marks, file: str, holders: frozenset[str] = frozenset()
) -> list[Problem]:
    path = _path(error.absolute_path)
    line, col = marks.at(path)
    message = _message(error)
    if path in holders:  # the scalars in it as written (`Marks.written`)
        said = _clipped(_spelled(error.instance, path, marks.written))
        message = message.replace(_show(error.instance), said, 1)
    return [Problem(file, line, col, path, message)]


def _holders(marks: Marks) -> frozenset[str]:
    """Each path at or above a scalar the messages quote as written (`Marks.written`: a
    number written otherwise than it prints, a refused value), found once a file (a review:
    asked of every problem against every such scalar, 4,096 of them took 2 s more)."""
    out: set[str] = set()
    for path in marks.written:
        for held in ancestors(path):
            if held in out:  # and every path above it
                break
            out.add(held)
    return frozenset(out)


def _unknown_keys(
    error: Any, path: str, marks: Marks, file: str
) -> list[tuple[Problem, str | None]]:
    """A problem for each key of the mapping at `path` that the schema does not take, with
    the key of this mapping it suggests in its place (None where it suggests none here)."""
    known = sorted(error.schema.get("properties", {}))
    problems: list[tuple[Problem, str | None]] = []
    placed = sorted((marks.key(child_path(path, k)), k) for k in set(error.instance) - set(known))
    degrees = schema()["properties"]["parallel"]["properties"]
    for n, ((line, col), key) in enumerate(placed):
        where = child_path(path, key)
        # a suggestion only for the keys that can be shown: problems print in file order,
        # at most MAX_SHOWN (an audit: 9,900 unknown keys spent 5 s in difflib)
        close = _closest(key, known) if n < MAX_SHOWN else None
        if path == "$.parallel" and close in _DEGREE_OF and _is_count(error.instance[key]):
            # a count where the nearest key takes a mapping: the degree it likely is (a
            # user audit, m413: `pipline: 2` was pointed at pipeline, which refused the 2)
            close = _DEGREE_OF[close]
        # another tool's name for a key of another section: where budget's goes (an audit:
        # a top-level tensor_parallel was listed the top-level keys, no word of parallel.tp)
        meant = _SYNONYMS.get(key)
        elsewhere = meant in degrees and meant not in known and path != "$.parallel"
        # or a key of parallel.pipeline under another name (Megatron-LM's virtual stages)
        elsewhere = elsewhere or (
            isinstance(meant, str) and "." in meant and path != "$.parallel.pipeline"
        )
        batch_like = key in _SYNONYMS and meant is None and path != "$.batch"
        # the key itself, misplaced, is told first where it goes, then this section's
        # spelling near it (an audit: batch.sequence_parallel was asked "did you mean
        # 'sequences'?", a serving key a train plan refuses, before where it goes; a
        # review: overlap.grads still means dp_grads more likely than precision.grads)
        home = None if key == "<<" or elsewhere or batch_like else _home(key, path)
        # a number as a key of a flow mapping: what follows a thousands separator's comma
        separated = key.isascii() and key.isdigit() and where in marks.flow_keys
        if key == "<<":  # YAML 1.1's merge key; the loader merges nothing (aliases are refused)
            message = "YAML merge keys (<<) are not allowed in a plan; write the keys out"
        elif separated:
            # `{global: 1,024}` reads as global: 1 and a key '024' (a user audit, m413)
            message = (
                f"unknown key {key!r}: a comma in a flow mapping ends the value before it, so "
                "a number written with a thousands separator (1,024) reads as two; write "
                "1024 or 1_024"
            )
        elif batch_like:  # a review: the top-level keys listed, no word of batch
            message = (
                f"unknown key {key!r}: budget's batch sizes go under batch, as seq, micro "
                "and global in training and sequences, prompt and generate in serving"
            )
        elif elsewhere:
            message = f"unknown key {key!r}: budget calls it parallel.{meant}"
        elif home:
            message = f"unknown key {key!r}; {key} {home}"
            if close:
                message += f", or did you mean {close!r} here?"
        elif close:
            message = f"unknown key {key!r} (did you mean {close!r}?)"
        else:
            message = f"unknown key {key!r} (expected one of: {', '.join(known)})"
        # what it likely stands for in this mapping: not where it is first told it belongs
        # elsewhere, which is no sign this mapping's key was written (review m417: model.grads
        # told "or did you mean 'heads' here?" left a model truly without heads unsaid)
        said_here = key != "<<" and not (separated or batch_like or elsewhere or home)
        suggested = close if said_here else None
        problems.append((Problem(file, line, col, where, message), suggested))
    return problems


# a parallel key that takes a mapping, and the degree a count written under a spelling near
# it means
_DEGREE_OF = {"pipeline": "pp"}


def _is_count(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _home(key: str, path: str) -> str | None:
    """Where a plan does take `key`, when it is a key of another section: "is a top-level
    key", "goes under parallel" (a user audit: ``parallel: {recompute: full}`` listed the
    parallel keys and no word of where recompute goes). None when it is nowhere else."""
    sections = schema()["properties"]
    if key in sections and path != "$":
        return "is a top-level key"
    homes = [
        name
        for name, section in sections.items()
        if key in section.get("properties", {}) and path != f"$.{name}"
    ]
    if homes:
        return f"goes under {' or '.join(homes)}"
    # a link's keys are a level's where a link is described: at the top, under the topology
    # or the device (an audit: topology: {preset: dgx-h100, bandwidth: ...} listed the
    # topology's keys and no word of the levels'; a review: batch.size is no level's size)
    level = sections["topology"]["properties"]["levels"]["items"]["properties"]
    if key in level and path in ("$", "$.topology", "$.device"):
        return "goes under each of topology.levels"
    # a key of a mapping inside a section (a user audit, m488: parallel.virtual_stages, where
    # `budget search --virtual-stages` names it, listed the parallel keys and no word of
    # parallel.pipeline); not the words several mappings share (count, size, ffn, ...)
    nested = [
        f"{section}.{inner}"
        for section, inner in _NESTED
        if key in sections[section]["properties"][inner]["properties"]
        and key not in _SHARED_WORDS
        and path != f"$.{section}.{inner}"
    ]
    if nested:
        return f"goes under {' or '.join(nested)}"
    return None


# the mappings inside sections whose keys a misplaced one is told of (`_home`), and the words
# too general to place (model.experts' count and ffn are many things' counts and widths)
_NESTED = (("parallel", "pipeline"), ("model", "experts"), ("model", "mla"))
_SHARED_WORDS = frozenset(("count", "ffn", "every", "pattern", "size", "layers"))


# what other tools call a key budget names otherwise (Megatron-LM's arguments, Hugging Face's
# config keys): the spelling nearest such a name can be another key entirely
# ('tensor_parallel' → 'sequence_parallel', 'sequence_length' → 'sequences': an audit)
_SYNONYMS = {
    **dict.fromkeys(
        ("tensor_parallel", "tensor_model_parallel_size", "tensor_parallel_size", "tp_size"), "tp"
    ),
    **dict.fromkeys(
        ("pipeline_parallel", "pipeline_model_parallel_size", "pipeline_parallel_size", "pp_size"),
        "pp",
    ),
    **dict.fromkeys(("data_parallel", "data_parallel_size", "dp_size"), "dp"),
    **dict.fromkeys(("context_parallel", "context_parallel_size", "cp_size"), "cp"),
    **dict.fromkeys(("expert_parallel", "expert_model_parallel_size", "ep_size"), "ep"),
    # Megatron-LM's and NeMo's names of a nested key: where budget's goes (`_home`)
    **dict.fromkeys(
        ("virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank"),
        "pipeline.virtual_stages",
    ),
    # the model's sizes as Hugging Face's configs, Megatron-LM's arguments and MPT's yamls
    # name them (an audit: num_attention_heads was offered attention_sinks, a flag, and
    # ffn_hidden the hidden key set two lines above)
    **dict.fromkeys(("num_attention_heads", "num_heads", "n_heads", "n_head"), "heads"),
    **dict.fromkeys(
        ("num_key_value_heads", "num_query_groups", "num_kv_heads", "n_kv_heads"), "kv_heads"
    ),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layers", "n_layer"), "layers"),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd"), "hidden"),
    **dict.fromkeys(
        ("intermediate_size", "ffn_hidden_size", "ffn_hidden", "ffn_dim", "d_ff"), "ffn"
    ),
    **dict.fromkeys(("vocab_size", "padded_vocab_size"), "vocab"),
    "max_position_embeddings": "max_positions",
    "tie_word_embeddings": "tied_embeddings",
    # a batch's are named by mode (seq or prompt and generate; micro and global or
    # sequences), which the schema's key list does not know: no guess, the list instead (a
    # review: a decode plan was told 'seq', which it refuses)
    **dict.fromkeys(
        (
            "sequence_length",
            "seq_length",
            "seq_len",
            "seqlen",
            "micro_batch_size",
            "global_batch_size",
        ),
        None,
    ),
}


KEYS_LISTED = 8  # a section's keys named where a scalar stood for it


def _closest(word: str, choices: list[str]) -> str | None:
    """The likeliest intended key: another tool's name for one (`_SYNONYMS`), then a
    transposition ('modle' → 'model') before a deletion."""
    if word in _SYNONYMS:
        meant = _SYNONYMS[word]
        return meant if meant in choices else None
    close = close_matches(word, choices, n=3)
    anagrams = [c for c in close if sorted(c) == sorted(word)]
    best = anagrams or close
    return best[0] if best else None


def _show(value: Any) -> str:
    """A value as the YAML author wrote it: true, null, 'text', 42, [true, null] (an
    audit, m495: a list's were Python's True and None), cut to 40 characters."""
    return _clipped(_spelled(value))


def _clipped(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _spelled(value: Any, at: str = "", written: dict[str, str] | None = None) -> str:
    """`value` in YAML's words, a list's and a mapping's items too, each scalar at a path
    of `written` (`Marks.written`, `at` being `value`'s path) as the author wrote it."""
    if written and at in written:
        return written[at]
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list):
        items = (_spelled(x, child_path(at, i), written) for i, x in enumerate(value))
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        pairs = (f"{k!r}: {_spelled(x, child_path(at, k), written)}" for k, x in value.items())
        return "{" + ", ".join(pairs) + "}"
    return repr(value)


def _flow(value: Any) -> str:
    """A schema example as YAML's flow style writes it: {name: nvlink, size: 8}."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _show(value) if isinstance(value, bool) or value is None else str(value)


_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


_THOUSANDS = re.compile(r"[0-9]{1,3}(,[0-9]{3})+")


def _read_as(value: Any, wanted: Any) -> str:
    """Why a value is of the wrong type when YAML, not the author, decided it: an unquoted
    no, off or 1.3 where text is expected, yes where a number is, 1,024 (text) where a
    number is, or 18.9% where a fraction is."""
    names = [wanted] if isinstance(wanted, str) else list(wanted or ())
    if "string" in names and isinstance(value, bool | int | float):
        kind = "true or false" if isinstance(value, bool) else "a number"
        return f"; YAML reads the unquoted value as {kind}: quote it to keep it text"
    numeric = "integer" in names or "number" in names
    if numeric and isinstance(value, bool):  # `tp: yes` was "true is not an integer" (m447)
        return "; YAML reads an unquoted yes, no, on or off as true or false: write a number"
    if numeric and isinstance(value, str) and _THOUSANDS.fullmatch(value.strip()):
        digits = value.strip().replace(",", "")
        return f"; write it without commas, {digits} or {int(digits):_}"
    if "number" in names and isinstance(value, str) and value.strip().endswith("%"):
        try:
            fraction = float(value.strip()[:-1]) / 100
        except ValueError:
            return ""
        return f"; write a percentage as its fraction, {fraction:g}"
    return ""


def _placement_hint(error: Any, schema: dict[str, Any]) -> str:
    """Which placement a DTensor spelling is (a user audit, m413: 'Shard(1)', the repr the
    schema's description cites, was offered nothing): Shard(dim=1), Replicate(), Partial()."""
    placement = str(schema.get("x-expected", "")).startswith("a placement")
    if not placement or not isinstance(error.instance, str) or len(error.instance) > 40:
        return ""
    text = re.sub(r"\s+", "", error.instance.lower()).replace("dim=", "")
    text = re.sub(r"^(replicate|partial)\(\)$", r"\1", text)
    if re.fullmatch(schema.get("pattern", "$^"), text) is None:
        return ""
    return f" (did you mean {text!r}?)"


def _message(error: Any) -> str:
    kind: str = error.validator
    schema = error.schema if isinstance(error.schema, dict) else {}
    expected = schema.get("x-expected")
    if kind == "uniqueItems":  # jsonschema's own words quote Python's (review m497)
        return f"{_show(error.instance)} has non-unique elements"
    if kind == "not" and "x-message" in schema:
        return str(error.schema["x-message"])
    quantity = schema.get("x-quantity")
    if quantity and (bare := missing_unit(error.instance, quantity)):
        return bare  # "bandwidth: 450": which unit, the author knows; budget does not guess
    # "80 KB": the patterns leave JEDEC's K out, and say why as the parser would (`_prefix`)
    size_like = kind in ("pattern", "anyOf") and quantity in (None, "bandwidth")
    if size_like and (refused := ambiguous_prefix(error.instance)):
        return refused
    # a value that is no string at all where only a string is taken (`name: [1]`) is told
    # so: the description is of the string's content ("a name of printable characters")
    not_text = kind == "type" and schema.get("type") == "string"
    if kind in ("pattern", "type", "anyOf") and expected and not not_text:
        why = _read_as(error.instance, schema.get("type")) or _placement_hint(error, schema)
        return f"{_show(error.instance)} is not {expected}{why}"
    if kind == "type":
        wanted = error.validator_value
        preset = "preset" in schema.get("properties", {}) and isinstance(error.instance, str)
        if preset and wanted == "object":  # `model: llama3-8b`: a preset's name, bare
            name = error.instance
            if name.isprintable() and name.strip() and len(name) <= 40:
                return f"{_show(name)} is not a mapping; name a preset as {{preset: {name}}}"
            return f"{_show(name)} is not a mapping"
        keys = sorted(schema.get("properties", {}))
        where = tuple(error.absolute_path)
        degree = _DEGREE_OF.get(str(where[-1])) if where[:-1] == ("parallel",) else None
        if wanted == "object" and degree and _is_count(error.instance):
            # `pipeline: 2` (a user audit, m413): the count is the degree's
            return (
                f"{_show(error.instance)} is not a mapping: the degree is parallel.{degree}; "
                f"{where[-1]} takes {', '.join(keys)}"
            )
        if wanted == "object" and keys:  # `precision: bf16`: which keys the section takes
            listed = ", ".join(keys[:KEYS_LISTED]) + (", ..." if len(keys) > KEYS_LISTED else "")
            return f"{_show(error.instance)} is not a mapping; its keys are {listed}"
        if wanted == "array" and isinstance(error.instance, dict):
            # a mapping's repr, cut at 40 characters, said nothing of what an entry is (a
            # user audit, m413: topology.levels written as a mapping of named levels)
            example = (schema.get("items") or {}).get("examples") or [None]
            such = f", such as - {_flow(example[0])}" if example[0] is not None else ""
            return f"a mapping is not a list: write each entry as an item of a list{such}"
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        shown = " or ".join(_TYPE_NAMES[n] for n in names)
        return f"{_show(error.instance)} is not {shown}{_read_as(error.instance, wanted)}"
    if kind == "minimum" and "x-below-minimum" in schema:  # what a peer tool's 0 means here
        return f"{error.message}; {schema['x-below-minimum']}"
    fraction_over = kind in ("maximum", "exclusiveMaximum") and error.validator_value == 1
    if fraction_over and 1 < error.instance <= 100:  # a percentage where a fraction is asked
        fraction = error.instance / 100
        return f"{error.message}; a fraction: {error.instance:g} % is {fraction:g}"
    if kind == "enum":
        options = [v for v in error.validator_value if v is not None]
        shown = ", ".join(str(v) for v in options)
        close = close_matches(str(error.instance), [str(v) for v in options], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if isinstance(error.instance, bool) and all(isinstance(v, str) for v in options):
            # `recompute: no` read as false, and the message said only "false" (an audit)
            hint = "; YAML reads an unquoted no, off, yes or on as false or true" + (
                ": write none" if not error.instance and "none" in options else ""
            )
        return f"{_show(error.instance)} is not one of {shown}{hint}"
    if kind == "const":
        return f"{_show(error.instance)} must be {error.validator_value!r}"
    if kind == "maxLength":
        return f"{_show(error.instance)} is longer than {error.validator_value} characters"
    if kind == "minLength":
        return "must not be empty"
    if kind == "minItems":
        return f"needs at least {error.validator_value} entries"
    if kind == "maxItems":
        return f"has more than {error.validator_value} entries"
    message: str = error.message
    return message
