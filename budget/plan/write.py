"""Write a plan file for a layout the search found: the original plan with its layout keys
replaced, so presets, units and comments-worth of intent (hf_config paths, overrides) stay
as the user wrote them and the new file budgets exactly as the search evaluated it."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from budget.errors import BudgetError
from budget.files import plan_folder
from budget.plan.model import FSDP_KEYS
from budget.plan.yaml_load import decode, load_yaml


def _tree(data: bytes, file: str) -> dict[str, Any]:
    text, problem = decode(data, file)
    if text is None:
        raise BudgetError([problem] if problem is not None else [])
    loaded = load_yaml(text, file)
    if loaded.tree is None or loaded.problems:
        raise BudgetError(list(loaded.problems))
    tree: dict[str, Any] = loaded.tree
    return tree


def _gpus_per_node(preset: Any) -> int:
    """GPUs per node of the topology preset named `preset`; 0 when there is none."""
    from budget.catalog import TOPOLOGIES

    known = TOPOLOGIES.get(preset) if isinstance(preset, str) else None
    return known.gpus_per_node if known is not None else 0


def rebased(written: str, origin: Path, folder: Path) -> str:
    """A path `written` relative to `origin`, made relative to `folder` (an absolute one
    as it is). Through symlinks as the file system resolves them: "link/.." is where the
    link points, not the folder holding the link; absolute if no relative path reaches."""
    if Path(written).is_absolute():
        return written
    target = (origin / written).resolve()
    relative = Path(os.path.relpath(target, folder.resolve()))
    return (relative if (folder / relative).resolve() == target else target).as_posix()


def layout_yaml(
    source: Path,
    data: bytes,
    layout: dict[str, Any],
    gpus: int,
    schema_ref: str,
    folder: Path | None = None,
) -> str:
    """The plan at `source`, whose bytes the search read (`data`: read once, as a pipe or a
    file edited during the sweep cannot be read again as it was), with `layout` (tp, pp,
    dp, cp, ep, zero, sequence_parallel, recompute, micro, virtual_stages, dp_shard) and `gpus`
    written in, to be saved in `folder` (the source's own by default): a relative
    ``model.hf_config``, which a plan reads from its own folder, is rewritten relative to
    that one (an absolute one is kept). Hand-written transitions are kept as the file writes
    them: their shapes' expressions take the new layout's values, as the search priced them
    (`search.reshaped`)."""
    tree = copy.deepcopy(_tree(data, str(source)))
    model = tree.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str) and folder:
        model["hf_config"] = rebased(model["hf_config"], plan_folder(source), folder)
    parallel = tree.setdefault("parallel", {})
    for key in ("tp", "pp", "dp", "cp", "ep", "zero", "sequence_parallel"):
        parallel[key] = layout[key]
    if layout.get("dp_shard"):  # hybrid sharding's shard group (`search.Space.hybrid`)
        parallel["dp_shard"] = layout["dp_shard"]
    else:
        parallel.pop("dp_shard", None)
    v = layout["virtual_stages"]
    pipeline = dict(parallel.get("pipeline") or {})
    pipeline.pop("layers_per_stage", None)
    if layout.get("layers_per_stage"):
        pipeline["layers_per_stage"] = list(layout["layers_per_stage"])
    if v > 1:
        pipeline.update(schedule="interleaved", virtual_stages=v)
    else:
        pipeline["schedule"] = (
            "1f1b"
            if pipeline.get("schedule") == "interleaved"
            else (pipeline.get("schedule", "1f1b"))
        )
        pipeline.pop("virtual_stages", None)
    parallel["pipeline"] = pipeline
    tree.setdefault("batch", {})["micro"] = layout["micro"]
    tree["recompute"] = layout["recompute"]
    if layout["recompute"] != "full":  # only a full recompute stops early (a plan refuses it)
        tree.pop("recompute_early_stop", None)
    if layout["zero"] != 3:  # only ZeRO 3 has FSDP's units (a plan refuses their keys)
        for key in FSDP_KEYS:
            parallel.pop(key, None)
    if layout["pp"] == 1:  # only a pipeline has a drain to defer into (a plan refuses it)
        tree.get("overlap", {}).pop("defer_embedding_wgrad", None)
    topology = tree.setdefault("topology", {})
    # a preset counts nodes of its own servers' size, whatever levels the plan overrides;
    # a count that is not whole nodes (4 GPUs of a DGX) is written in GPUs
    per_node = _gpus_per_node(topology.get("preset"))
    if per_node and gpus % per_node == 0:
        topology.pop("gpus", None)
        topology["nodes"] = gpus // per_node
    else:
        topology.pop("nodes", None)
        topology["gpus"] = gpus
    body = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, default_flow_style=None)
    header = (
        f"# yaml-language-server: $schema={schema_ref}\n"
        f"# Written by `budget search` from {source.name}: the layout it ranked first.\n"
    )
    return header + body
