"""Plan files for CLI tests: the shipped plans, and variants written to a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from budget.errors import Problem

ROOT = Path(__file__).resolve().parent.parent
PLANS = sorted((ROOT / "plans").glob("*.yaml"))
GPT3 = ROOT / "plans" / "gpt3-175b.yaml"


def searched_layout(**degrees: object) -> dict[str, object]:
    """A layout as `budget search` hands `budget.plan.write.layout_yaml` one: every key it
    writes, one rank of each group, one micro-batch and no recompute unless `degrees` says
    otherwise."""
    return {
        "tp": 1,
        "pp": 1,
        "dp": 1,
        "cp": 1,
        "ep": 1,
        "zero": 0,
        "sequence_parallel": False,
        "recompute": "none",
        "micro": 1,
        "virtual_stages": 1,
        "dp_shard": None,
        **degrees,
    }


def variant(tmp_path: Path, name: str, *edits: tuple[str, str], base: Path = GPT3) -> Path:
    """A copy of `base` with each (old, new) line fragment replaced exactly once."""
    text = base.read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# GPT-3's DGX A100 cluster written out level by level instead of by its preset name
PRESET_TOPOLOGY = "topology: {preset: dgx-a100, nodes: 128}"
NVLINK = "{name: nvlink, size: 8, bandwidth: 300 GB/s, latency: 3 us}"
WRITTEN_TOPOLOGY = f"""topology:
  gpus: 1024
  levels:
    - {NVLINK}
    - {{name: infiniband, bandwidth: 25 GB/s, latency: 10 us}}"""


# gpt-1.3b's A100 and one-node topology written out key by key instead of by preset names
GPT13_PRESETS = (
    "device: {preset: a100-80gb, reserved: 3 GiB}\ntopology: {preset: dgx-a100, nodes: 1}"
)
GPT13_WRITTEN = """device:
  memory: 80 GiB
  reserved: 3 GiB
  flops: {bf16: 312 TFLOP/s, fp32: 19.5 TFLOP/s}
  memory_bandwidth: 2039 GB/s
topology:
  gpus: 8
  levels:
    - {name: nvlink, size: 8, bandwidth: 300 GB/s, latency: 3 us}"""


def gpt13_written() -> str:
    """plans/gpt-1.3b.yaml with its device and topology written out (`GPT13_WRITTEN`)."""
    text = (ROOT / "plans" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    assert text.count(GPT13_PRESETS) == 1
    return text.replace(GPT13_PRESETS, GPT13_WRITTEN)


def written_topology(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """GPT-3 175B with its topology written out (link rates, no ramp), then `edits`."""
    return variant(tmp_path, name, (PRESET_TOPOLOGY, WRITTEN_TOPOLOGY), *edits)


def too_big(tmp_path: Path) -> Path:
    """GPT-3 175B on 24 GiB devices: stage 0 peaks at 30.45 GiB, 6.45 GiB over."""
    return variant(
        tmp_path, "too-big.yaml", ("reserved: 3 GiB}", "reserved: 3 GiB, memory: 24 GiB}")
    )


def tp4(tmp_path: Path) -> Path:
    """GPT-3 175B with TP 4 and DP 32 instead of TP 8 and DP 16 (same 1,024 GPUs)."""
    return variant(tmp_path, "tp4.yaml", ("  tp: 8", "  tp: 4"), ("  dp: 16", "  dp: 32"))


def invalid(tmp_path: Path) -> Path:
    path = tmp_path / "invalid.yaml"
    path.write_text("name: x\nmode: train\nmodle: 3\n", encoding="utf-8")
    return path


def untimed_plan(tmp_path: Path) -> Path:
    """plans/gpt-1.3b.yaml on a device written with its memory alone: no rates, so no step
    time is computed."""
    return variant(
        tmp_path,
        "untimed.yaml",
        (
            "device: {preset: a100-80gb, reserved: 3 GiB}",
            "device: {memory: 80 GiB, reserved: 3 GiB}",
        ),
        base=ROOT / "plans" / "gpt-1.3b.yaml",
    )


def refusal(path: Path) -> Problem:
    """The one problem `budget` refuses the plan at `path` with."""
    import pytest

    from budget.errors import BudgetError
    from budget.plan.load import load_plan

    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    (problem,) = raised.value.problems
    return problem
