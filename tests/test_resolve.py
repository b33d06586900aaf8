"""Resolution: defaults, units, shapes and the semantic rules, from YAML text to `Plan`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from budget.errors import BudgetError
from budget.plan.load import load_plan
from budget.plan.model import Experts, Level, Plan
from budget.plan.resolve import SHAPE_NAMES, llama_ffn, parse_placement, resolve
from budget.plan.schema import validate_tree
from budget.plan.yaml_load import Marks, load_yaml

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30

BASE = """\
model:
  layers: 4
  hidden: 1024
  heads: 16
  vocab: 32000
batch: {seq: 2048, micro: 2, global: 32}
parallel: {tp: 2, pp: 2, dp: 2}
device:
  memory: 80 GiB
  reserved: 3 GiB
  flops: {bf16: 989 TFLOP/s, fp32: 67 TFLOP/s}
  memory_bandwidth: 3.35 TB/s
topology:
  gpus: 8
  levels:
    - {name: nvlink, size: 4, bandwidth: 450 GB/s, latency: 3 us}
    - {name: infiniband, bandwidth: 50 GB/s, latency: 10 us}
"""


def plan_of(text: str, file: str = "p.yaml") -> Plan:
    loaded = load_yaml(text, file)
    assert loaded.problems == ()
    assert validate_tree(loaded.tree, loaded.marks, file) == []
    return resolve(loaded.tree, loaded.marks, file)


def problems_of(text: str) -> list[str]:
    with pytest.raises(BudgetError) as caught:
        plan_of(text)
    return [str(p) for p in caught.value.problems]


def test_defaults() -> None:
    plan = plan_of(BASE)
    assert plan.name == "p"  # the file's stem when the plan has no name
    assert plan.mode == "train"
    m = plan.model
    assert (m.kv_heads, m.head_dim, m.ffn) == (16, 64, 4096)
    assert (m.mlp, m.norm, m.position, m.attention) == ("gelu", "layernorm", "rope", "flash")
    assert m.experts is None
    p = plan.parallel
    assert (p.cp, p.ep, p.etp, p.zero, p.sequence_parallel) == (1, 1, None, 0, False)
    assert p.order == ("tp", "cp", "ep", "dp", "pp")
    assert p.pipeline.schedule == "1f1b"
    assert p.pipeline.virtual_stages == 1
    assert plan.recompute == "none"
    assert plan.precision.master == "fp32"
    assert plan.microbatches == 32 // (2 * 2)
    assert plan.transitions == ()


def test_units_are_parsed() -> None:
    plan = plan_of(BASE)
    assert plan.device.memory == 80 * GIB
    assert plan.device.reserved == 3 * GIB
    assert plan.device.peak_flops("bf16") == 989e12
    assert plan.device.peak_flops("fp32") == 67e12
    assert plan.device.memory_bandwidth == 3.35e12
    assert plan.topology.levels == (
        Level(name="nvlink", bandwidth=450e9, latency=3e-6, size=4),
        Level(name="infiniband", bandwidth=50e9, latency=10e-6, size=None),
    )


@pytest.mark.parametrize(("hidden", "ffn"), [(4096, 11008), (5120, 13824), (8192, 22016)])
def test_llama_ffn_rule(hidden: int, ffn: int) -> None:
    """Llama 1/2 model cards: 7B 11008, 13B 13824; int(8·8192/3) = 21845 → 22016."""
    assert llama_ffn(hidden) == ffn


def test_swiglu_default_ffn_is_the_llama_rule() -> None:
    plan = plan_of(BASE.replace("vocab: 32000", "vocab: 32000\n  mlp: swiglu"))
    assert plan.model.ffn == llama_ffn(1024) == 2816


def test_gqa_and_explicit_head_dim() -> None:
    plan = plan_of(BASE.replace("heads: 16", "heads: 16\n  kv_heads: 4\n  head_dim: 128"))
    assert (plan.model.kv_heads, plan.model.head_dim) == (4, 128)


def test_integral_floats_become_ints() -> None:
    plan = plan_of(BASE.replace("vocab: 32000", "vocab: 3.2e4"))
    assert plan.model.vocab == 32000
    assert isinstance(plan.model.vocab, int)


def test_experts() -> None:
    plan = plan_of(
        BASE.replace("vocab: 32000", "vocab: 32000\n  experts: {count: 8, top_k: 2}").replace(
            "dp: 2}", "dp: 2, ep: 2, sequence_parallel: true}"
        )
    )
    assert plan.model.experts == Experts(count=8, top_k=2, ffn=4096)
    assert plan.parallel.ep == 2


def test_an_mlp_width_tp_does_not_divide_is_refused_not_rounded_up() -> None:
    """Megatron-LM's ColumnParallelLinear and RowParallelLinear assert divide(ffn, tp); an
    audit found ffn 4,100 over tp 8 budgeted as 513 columns a rank. The tps offered split
    the heads too."""
    text = BASE.replace("heads: 16", "heads: 16\n  ffn: 4097")
    assert problems_of(text) == [
        "p.yaml:8:16: error: $.parallel.tp: model.ffn = 4097 is not divisible by tp = 2: each "
        "tensor-parallel rank holds whole columns of the MLP's up projection and rows of its "
        "down projection; choose tp among 1"
    ]
    assert plan_of(text.replace("tp: 2, pp: 2, dp: 2", "tp: 1, pp: 2, dp: 4")).model.ffn == 4097
    twelve = text.replace("hidden: 1024\n  heads: 16", "hidden: 1536\n  heads: 12")
    twelve = twelve.replace("tp: 2, pp: 2, dp: 2", "tp: 8, pp: 1, dp: 1")
    (heads,) = problems_of(twelve.replace("4097", "4104"))
    assert heads.endswith("holds whole attention heads; choose tp among 1, 2, 3, 4, 6, 12")
    width, heads = problems_of(twelve.replace("4097", "4100"))
    assert "model.ffn = 4100 is not divisible by tp = 8" in width
    assert heads.endswith("holds whole attention heads; choose tp among 1, 2, 4")


def test_expert_widths_divide_by_their_own_degree() -> None:
    """The shared experts' width splits over tp, an expert's over etp (tp when etp is not
    set); a model whose every layer is MoE has no dense ffn to split."""
    moe = BASE.replace(
        "vocab: 32000", "vocab: 32000\n  ffn: 4097\n  experts: {count: 8, top_k: 2, ffn: 1408}"
    ).replace("dp: 2}", "dp: 2, ep: 2, sequence_parallel: true}")
    assert plan_of(moe).model.ffn == 4097  # read by no layer
    dense_first = moe.replace("top_k: 2,", "top_k: 2, first_dense_layers: 1,")
    assert [p.split(": ")[2] for p in problems_of(dense_first)] == ["$.parallel.tp"]
    shared = moe.replace("ffn: 1408}", "ffn: 1408, shared_ffn: 2817}")
    assert "model.experts.shared_ffn = 2817 is not divisible by tp = 2" in problems_of(shared)[0]
    odd = moe.replace("ffn: 1408}", "ffn: 1409}")
    assert "model.experts.ffn = 1409 is not divisible by tp = 2" in problems_of(odd)[0]
    etp = odd.replace("ep: 2,", "ep: 2, etp: 1,")
    assert plan_of(etp).model.experts.ffn == 1409
    wide = moe.replace("ffn: 1408}", "ffn: 1410}").replace("ep: 2,", "ep: 1, etp: 4,")
    assert problems_of(wide) == [
        "p.yaml:9:45: error: $.parallel.etp: model.experts.ffn = 1410 is not divisible by etp = "
        "4: each expert-tensor-parallel rank holds whole columns of an expert's up projection "
        "and rows of its down projection; choose etp among 1, 2, 3, 5, 6, 10, 15, 30, ..."
    ]


def test_inference_batch() -> None:
    text = BASE.replace(
        "batch: {seq: 2048, micro: 2, global: 32}",
        "mode: decode\nbatch: {sequences: 16, prompt: 1000, generate: 24}",
    )
    plan = plan_of(text)
    assert plan.mode == "decode"
    b = plan.batch
    assert (b.seq, b.prompt, b.generate) == (1024, 1000, 24)
    assert (b.global_batch, b.micro) == (16, 8)  # micro: sequences per data-parallel replica


def test_master_none() -> None:
    plan = plan_of(BASE + "precision: {master: none, optimizer: sgd}\n")
    assert plan.precision.master is None
    assert plan.precision.optimizer == "sgd"


def test_uneven_stages() -> None:
    """Llama 3 405B puts 126 layers on 16 stages: uneven splits are listed explicitly."""
    plan = plan_of(
        BASE.replace("layers: 4", "layers: 5").replace(
            "dp: 2}", "dp: 2, pipeline: {layers_per_stage: [2, 3]}}"
        )
    )
    assert plan.parallel.pipeline.layers_per_stage == (2, 3)


def test_transitions_evaluate_their_shapes() -> None:
    text = BASE + (
        "transitions:\n"
        "  - name: logits-gather\n"
        "    phase: forward\n"
        "    tensor: {shape: [micro * seq / tp, vocab], dtype: fp32}\n"
        "    group: tp\n"
        "    from: shard( 1 )\n"
        "    to: replicate\n"
        "    count: 3\n"
    )
    (t,) = plan_of(text).transitions
    assert t.shape == (2 * 2048 // 2, 32000)
    assert (t.src, t.dst, t.group, t.dtype, t.count, t.source_alive) == (
        "shard(1)",
        "replicate",
        "tp",
        "fp32",
        3,
        True,
    )
    assert t.where is not None
    assert (t.where.line, t.where.col, t.where.path) == (19, 5, "$.transitions[0]")


def test_every_shape_name_is_available() -> None:
    total = " + ".join(SHAPE_NAMES)
    text = BASE + (
        f"transitions:\n  - {{name: t, phase: forward, tensor: {{shape: [{total}], dtype: bf16}},"
        " group: dp, from: replicate, to: replicate}\n"
    )
    (t,) = plan_of(text).transitions
    values = (2, 2048, 32, 1024, 16, 16, 64, 4096, 32000, 4, 2, 1, 1, 2, 2)
    assert len(values) == len(SHAPE_NAMES)
    assert t.shape == (sum(values),)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("shard(0)", ("shard", 0)), (" shard ( 12 ) ", ("shard", 12)), ("partial", ("partial", None))],
)
def test_parse_placement(text: str, expected: tuple[str, int | None]) -> None:
    assert parse_placement(text) == expected


def test_all_semantic_problems_at_once() -> None:
    text = (
        BASE.replace("layers: 4", "layers: 3")
        .replace("global: 32", "global: 30")
        .replace("tp: 2", "tp: 32")
    )
    assert problems_of(text) == [
        "p.yaml:6:38: error: $.batch.global: batch.global = 30 is not divisible by micro × dp = "
        "2 × 2 = 4: every data-parallel rank runs the same number of micro-batches; the nearest "
        "valid values are 28 and 32",
        "p.yaml:7:1: error: $.parallel: tp × cp × pp × dp = 32 × 1 × 2 × 2 = 128 but the "
        "topology has 8 GPUs; choose degrees whose product is 8 (or set topology.gpus to 128)",
        "p.yaml:7:16: error: $.parallel.tp: model.heads = 16 is not divisible by tp = 32: each "
        "tensor-parallel rank holds whole attention heads; choose tp among 1, 2, 4, 8, 16",
        "p.yaml:7:24: error: $.parallel.pp: model.layers = 3 is not divisible by pp = 2: every "
        "stage gets the same number of layers; choose among 1, 3 stages, or list an uneven split "
        "in parallel.pipeline.layers_per_stage",
    ]


def test_load_plan_reads_shipped_plans() -> None:
    gpt3 = load_plan(ROOT / "plans" / "gpt3-175b.yaml")
    assert (gpt3.parallel.tp, gpt3.parallel.pp, gpt3.parallel.dp) == (8, 8, 16)
    assert gpt3.microbatches == 1536 // 16
    assert gpt3.model.ffn == 4 * 12288
    llama = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    assert (llama.model.kv_heads, llama.model.head_dim, llama.model.ffn) == (8, 128, 28672)
    assert llama.topology.gpus == 8 * 4 * 16
    small = load_plan(ROOT / "plans" / "gpt-1.3b.yaml")
    assert small.model.head_dim == 128
    assert small.topology.levels[0].size == 8


def test_load_plan_reports_schema_and_duplicate_problems_together(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BASE.replace("heads: 16", "heads: 16\n  heads: 0\n  depth: 3"), "utf-8")
    with pytest.raises(BudgetError) as caught:
        load_plan(path)
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:5:3: error: $.model.heads: duplicate key 'heads' (first defined on line 4)",
        f"{path}:6:3: error: $.model.depth: unknown key 'depth' (expected one of: attention, "
        "attention_sinks, attention_softcap, bias, dropout, experts, ffn, head_dim, heads, "
        "hf_config, hidden, kv_heads, layers, logit_softcap, max_positions, mla, mlp, mlp_bias, "
        "mtp_layers, norm, position, preset, qk_norm, qkv_bias, sandwich_norm, sliding_window, "
        "tied_embeddings, vocab)",
    ]


@pytest.mark.parametrize("seq", [4098, 4100])
def test_the_lengths_offered_for_cp_and_sequence_parallelism_satisfy_both(
    tmp_path: Path, seq: int
) -> None:
    """tp 3 and ring cp 2 with sequence parallelism: the sequence must split into 4 ring
    chunks and over 2 × 3 ranks, so a multiple of 12. Each rule used to offer its own
    multiple (4, then 6), whose nearest values failed the other rule."""
    plan = tmp_path / "odd.yaml"
    plan.write_text(
        f"""model: {{layers: 4, hidden: 1536, heads: 24, vocab: 32000}}
batch: {{seq: {seq}, micro: 1, global: 8}}
parallel: {{tp: 3, cp: 2, dp: 2, sequence_parallel: true}}
device: {{preset: h100-sxm}}
topology: {{gpus: 12, levels: [{{name: nvlink, size: 12, bandwidth: 450 GB/s, latency: 3 us}}]}}
""",
        encoding="utf-8",
    )
    with pytest.raises(BudgetError) as refused:
        load_plan(plan)
    (problem,) = refused.value.problems
    assert "make batch.seq a multiple of 12" in problem.message or (
        "make it a multiple of 12" in problem.message
    )
    assert "(nearest: 4092 and 4104)" in problem.message


def test_sizes_past_any_real_model_are_refused_where_they_are_written() -> None:
    """hidden: 2^62 passed the 64-bit literal check and budgeted a 4.6e40-byte peak (exit 0);
    a transition's shape of 99999999999³ × vocab elements one of 2.3e38 bytes. The schema
    bounds each model size (hidden 2^20, ffn and expert widths 2^24, vocab 2^40) and a
    shape its element count (2^48), each error at the key (review)."""
    huge = BASE.replace("hidden: 1024", "hidden: 4611686018427387904")
    loaded = load_yaml(huge, "p.yaml")
    (problem,) = validate_tree(loaded.tree, loaded.marks, "p.yaml")
    assert str(problem) == (
        "p.yaml:3:11: error: $.model.hidden: 4611686018427387904 is greater than the maximum "
        "of 1048576"
    )
    shape = "[99999999999 * 99999999999 * 99999999999, vocab]"
    text = BASE + (
        f"transitions:\n  - {{name: t, phase: forward, tensor: {{shape: {shape}, dtype: bf16}},"
        " group: dp, from: replicate, to: replicate}\n"
    )
    (problem,) = problems_of(text)
    assert problem.startswith("p.yaml:19:")
    assert "$.transitions[0].tensor.shape: " in problem and "more than the 2^48" in problem
    edge = BASE + (  # 2^48 elements exactly is still a tensor
        "transitions:\n  - {name: t, phase: forward, tensor: {shape: [65536, 65536, 65536], "
        "dtype: bf16}, group: dp, from: replicate, to: replicate}\n"
    )
    assert plan_of(edge).transitions[0].shape == (65536,) * 3


def test_sms_come_from_the_preset_or_the_plan_and_must_leave_some_to_the_gemm() -> None:
    """An H100 SXM preset has 132 SMs, a device written out none (its GEMMs stay whole)
    unless it gives ``sms``; a margin of all of them leaves the overlapped GEMM nothing."""
    preset = BASE.replace(
        "  memory: 80 GiB\n  reserved: 3 GiB\n  flops: {bf16: 989 TFLOP/s, fp32: 67 TFLOP/s}\n"
        "  memory_bandwidth: 3.35 TB/s\n",
        "  preset: h100-sxm\n",
    )
    assert plan_of(preset).device.sms == 132
    assert plan_of(BASE).device.sms == 0
    written = BASE.replace("  reserved: 3 GiB\n", "  reserved: 3 GiB\n  sms: 100\n")
    assert plan_of(written).device.sms == 100
    overlap = "overlap: {tp: true, tp_comm_sms: 132}\n"
    (problem,) = problems_of(preset + overlap)
    assert "$.overlap.tp_comm_sms" in problem
    assert "leaves none of the device's 132 streaming multiprocessors" in problem
    held = plan_of(preset + "overlap: {tp: true, tp_comm_sms: 24}\n").overlap.tp_comm_sms
    assert (held.attention, held.mlp) == (24, 24)
    # a recipe's two counts (NeMo's Llama 3.1 405B: 24 beside the projection, 8 beside fc2)
    text = preset + "overlap: {tp: true, tp_comm_sms: {attention: 24, mlp: 8}}\n"
    held = plan_of(text).overlap.tp_comm_sms
    assert (held.attention, held.mlp, held.of("attention"), held.of("MLP")) == (24, 8, 24, 8)
    assert (plan_of(preset).overlap.tp_comm_sms.attention) == 16  # the default
    problems = problems_of(
        preset + "overlap: {tp: true, tp_comm_sms: {attention: 140, mlp: 200}}\n"
    )
    assert [p.split(": ")[2] for p in problems] == [
        "$.overlap.tp_comm_sms.attention",
        "$.overlap.tp_comm_sms.mlp",
    ]


def test_an_interleaved_split_suggests_degrees_that_work_with_its_virtual_stages() -> None:
    """24 layers on pp 4 × 5 virtual stages: the message listed the stage counts dividing 24,
    pp 4 among them, which fails with 5 virtual stages all the same (UX audit)."""

    def message(pp: int, v: int) -> str:
        tree = {
            "model": {"preset": "llama3-8b", "layers": 24},
            "batch": {"seq": 4096, "micro": 1, "global": 8 * pp * 4},
            "parallel": {
                "pp": pp,
                "dp": 8 // pp if pp <= 8 else 1,
                "pipeline": {"schedule": "interleaved", "virtual_stages": v},
            },
            "device": {"preset": "h100-sxm"},
            "topology": {
                "gpus": max(pp, 8),
                "levels": [
                    {"name": "nvlink", "size": 8, "bandwidth": "370 GB/s", "latency": "3 us"}
                ],
            },
        }
        with pytest.raises(BudgetError) as caught:
            resolve(tree, Marks(), "p.yaml")
        (found,) = [p.message for p in caught.value.problems if p.path == "$.parallel.pp"]
        return found.split("; ", 1)[1]

    split = "or list an uneven split in parallel.pipeline.layers_per_stage"
    assert message(4, 5) == f"choose virtual_stages among 2, 3, 6 with pp = 4, {split}"
    assert (
        message(8, 2) == f"choose pp among 2, 3, 4, 6, 12 with 2 virtual stages or "
        f"virtual_stages among 3 with pp = 8, {split}"
    )
    # 35 model chunks over 24 layers: no uneven split gives each one a layer (a review)
    assert message(7, 5) == "make pp × virtual_stages 24 at most"


def _all_problems(text: str) -> list[str]:
    from budget.plan.load import load_plan_data

    with pytest.raises(BudgetError) as caught:
        load_plan_data(text.encode(), "p.yaml")
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


def test_a_broken_section_holds_back_only_the_rules_that_read_it() -> None:
    """`layers: x` broke the schema and every semantic check waited for the next run
    (review: a file's problems came in rounds). The layout against the GPUs and the global
    batch read no model and are checked beside it; heads over tp reads the model and waits."""
    text = BASE.replace("layers: 4", "layers: x").replace("global: 32", "global: 30")
    text = text.replace("{tp: 2, pp: 2, dp: 2}", "{tp: 3, pp: 2, dp: 2}")
    found = _all_problems(text)
    assert found[0] == "$.model.layers: 'x' is not an integer"
    assert [p.split(":")[0] for p in found[1:]] == ["$.batch.global", "$.parallel"]
    assert "= 12 but the topology has 8 GPUs" in found[2]
    # with the model whole, its own rules come back (heads 16 over tp 3)
    whole = _all_problems(text.replace("layers: x", "layers: 4"))
    assert any(p.startswith("$.parallel.tp: model.heads = 16") for p in whole)


@pytest.mark.parametrize(
    ("change", "only"),
    [
        (("model:\n", "mode: serve\nmodel:\n"), "$.mode"),  # every section reads the mode
        (("batch: {seq: 2048, micro: 2, global: 32}\n", ""), "$"),  # a section missing
    ],
)
def test_a_plan_wide_problem_holds_back_every_semantic_rule(change, only) -> None:
    text = BASE.replace("{tp: 2, pp: 2, dp: 2}", "{tp: 3, pp: 2, dp: 2}").replace(*change)
    assert [p.split(":")[0] for p in _all_problems(text)] == [only]


def test_a_section_an_alias_stood_for_is_not_read() -> None:
    """The sections aliases stood for are known from the loader's refused values, whether
    each alias is listed or counted (a fuzz found `topology: *a` read as None)."""
    head, _, _ = BASE.partition("topology:")
    text = "x: &a {gpus: 8}\ny: *a\n" + head + "topology: *a\n"
    found = _all_problems(text)
    assert "$.y: YAML aliases (*a) are not allowed in a plan; write the value out" in found
    alias = "$.topology: YAML aliases (*a) are not allowed in a plan; write the value out"
    assert [p for p in found if p.startswith("$.topology")] == [alias]


@pytest.mark.parametrize("key", ["paralel", "Parallel", "precison", "mdoe"])
def test_a_key_that_is_no_section_holds_back_every_semantic_rule(key) -> None:
    """A misspelt optional section left the real one to its defaults, and those were
    checked (review: `paralel: {tp: 2, pp: 2, dp: 2}` read as 1 x 1 x 1 x 1 on 8 GPUs)."""
    text = BASE.replace("parallel: {tp: 2, pp: 2, dp: 2}\n", f"{key}: {{tp: 2}}\n")
    found = _all_problems(text)
    assert [p.split(":")[0] for p in found] == [f"$.{key}"]


def test_a_plan_without_a_parallel_section_is_told_at_its_topology() -> None:
    """An audit: with no parallel section, degrees 1 x 1 x 1 x 1 against 8 GPUs were said at
    the file's first line; the topology, which gives the 8, is where it is said now."""
    from budget.plan.load import load_plan_data

    text = BASE.replace("parallel: {tp: 2, pp: 2, dp: 2}\n", "").replace("global: 32", "global: 16")
    with pytest.raises(BudgetError) as caught:
        load_plan_data(text.encode(), "p.yaml")
    (problem,) = caught.value.problems
    assert (problem.path, problem.line, problem.col) == ("$.topology", 12, 1)
    assert problem.message.startswith("with no parallel section, tp × cp × pp × dp = ")


def test_a_broken_batch_holds_back_only_the_rules_that_read_the_batch() -> None:
    """Degrees against the GPUs and heads over tp read no batch (review: they waited), nor
    does sequence parallelism's need of a tp group (an audit: it waited too)."""
    text = BASE.replace("global: 32", "global: x").replace("{tp: 2,", "{tp: 3,")
    found = [p.split(":")[0] for p in _all_problems(text)]
    # heads 16 and ffn 4,096 over tp 3, each its own problem
    assert found == ["$.batch.global", "$.parallel", "$.parallel.tp", "$.parallel.tp"]
    alone = BASE.replace("global: 32", "global: x")
    alone = alone.replace("{tp: 2, pp: 2, dp: 2}", "{tp: 1, pp: 2, dp: 4, sequence_parallel: true}")
    assert [p.split(":")[0] for p in _all_problems(alone)] == [
        "$.batch.global",
        "$.parallel.sequence_parallel",
    ]


def test_a_broken_parallel_section_leaves_the_batch_its_own_rules() -> None:
    """The batch's own rules need no dp: a train plan's `prompt` is still refused."""
    text = BASE.replace("global: 32}", "global: 32, prompt: 8}").replace("dp: 2}", "dp: x}")
    found = [p.split(":")[0] for p in _all_problems(text)]
    assert found == ["$.batch.prompt", "$.parallel.dp"]


def test_a_job_inside_one_middle_domain_still_has_its_groups_checked() -> None:
    """rail-fat-tree's rail units hold 256 GPUs; a 24-GPU job fills none partially, so the
    levels accept it, and its tp 3 groups straddle nodes unevenly: refused as on dgx-h100,
    where it was a traceback at pricing (a fuzzing audit: `validate` said ok, `budget` and
    `check` exited 1)."""
    text = (
        "model: {layers: 2, hidden: 768, heads: 6, vocab: 32000}\n"
        "batch: {seq: 2048, micro: 1, global: 8}\n"
        "parallel: {tp: 3, cp: 8}\n"
        "device: {preset: h100-sxm}\n"
        "topology: {preset: rail-fat-tree, nodes: 3}\n"
    )
    (problem,) = problems_of(text)
    assert "$.parallel: the tp group: group [6, 7, 8] puts [1, 2] ranks in different" in problem
    even = text.replace("heads: 6", "heads: 8").replace("tp: 3, cp: 8", "tp: 8, cp: 3")
    assert plan_of(even.replace("seq: 2048", "seq: 2052")).topology.gpus == 24


def test_a_serving_plan_without_a_prompt_is_refused_once() -> None:
    """prompt 0 and generate 0: one refusal at batch.prompt, not a second that adds nothing
    (a fuzzing audit)."""
    text = BASE.replace(
        "batch: {seq: 2048, micro: 2, global: 32}",
        "mode: prefill\nbatch: {sequences: 16, prompt: 0, generate: 0}",
    )
    (problem,) = problems_of(text)
    assert "a prefill plan reads at least one prompt token" in problem


def test_more_stages_than_layers_asks_for_fewer_not_an_uneven_split() -> None:
    """pp 128 over 80 layers: no layers_per_stage gives each stage a layer, and following
    the advice to list one gave 48 errors (a review)."""
    text = (
        "model: {preset: llama3-70b}\nbatch: {seq: 8192, micro: 1, global: 128}\n"
        "parallel: {tp: 1, pp: 128, dp: 1}\ndevice: {preset: h100-sxm}\n"
        "topology: {preset: dgx-h100, nodes: 16}\n"
    )
    (message,) = [m for m in _all_problems(text) if "layers" in m]
    assert message.endswith(
        "pp = 128 stages is more than the model's 80 layers: every stage needs one at least; "
        "choose among 1, 2, 4, 5, 8, 10, 16, 20, ... stages"
    )
    assert "layers_per_stage" not in message


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ('"1e30 B"', "'1e30 B'"),
        ('"9223372036854775808 B"', "'9223372036854775808 B'"),
        ("1e30", "1e+30"),
    ],
)
def test_a_device_of_2_to_the_63_bytes_or_more_is_refused_where_it_is_written(
    written: str, shown: str
) -> None:
    """`memory: "1e30 B"` was budgeted as a device of 10^30 bytes (exit 0), where the bare
    integer 9223372036854775808 is refused (audit): refused the same, at its line:col,
    beside the file's other problems."""
    text = BASE.replace("memory: 80 GiB", f"memory: {written}").replace(
        "reserved: 3 GiB", 'reserved: "9223372036854775808 B"'
    )
    assert problems_of(text) == [
        f"p.yaml:9:11: error: $.device.memory: {shown} is too large (sizes must be below "
        "2**63 bytes)",
        "p.yaml:10:13: error: $.device.reserved: '9223372036854775808 B' is too large (sizes "
        "must be below 2**63 bytes)",
    ]
    bare = BASE.replace("memory: 80 GiB", "memory: 9223372036854775808")
    assert [str(p) for p in load_yaml(bare, "p.yaml").problems] == [
        "p.yaml:9:11: error: $.device.memory: 9223372036854775808 is too large (integers must "
        "be below 2**63)"
    ]
    assert plan_of(BASE.replace("80 GiB", "9223372036854775807 B")).device.memory == 2**63 - 1


def test_two_levels_of_one_name_are_refused_at_the_second_name() -> None:
    """Levels nvlink/2, infiniband/4, infiniband were accepted, and the sweep (which places
    a group's ranks by level) and the report (which names a collective's links, and the
    Links table's rows, by name) disagreed on them (an audit): the second name is refused
    where it is written, beside the file's other problems."""
    levels = (
        "    - {name: nvlink, size: 4, bandwidth: 450 GB/s, latency: 3 us}\n"
        "    - {name: infiniband, bandwidth: 50 GB/s, latency: 10 us}\n"
    )
    three = (
        "    - {name: nvlink, size: 2, bandwidth: 450 GB/s, latency: 3 us}\n"
        "    - {name: infiniband, size: 4, bandwidth: 50 GB/s, latency: 10 us}\n"
        "    - {name: infiniband, bandwidth: 25 GB/s, latency: 10 us}\n"
    )
    text = BASE.replace(levels, three).replace("global: 32", "global: 30")
    assert problems_of(text) == [
        "p.yaml:6:38: error: $.batch.global: batch.global = 30 is not divisible by micro × dp = "
        "2 × 2 = 4: every data-parallel rank runs the same number of micro-batches; the nearest "
        "valid values are 28 and 32",
        "p.yaml:18:14: error: $.topology.levels[2].name: level name 'infiniband' is already "
        "levels[1]'s; give each level a name of its own: the report names the links a "
        "collective runs on, and the Links table's rows, by it",
    ]
    renamed = plan_of(
        BASE.replace(
            levels, three.replace("{name: infiniband, bandwidth", "{name: spine, bandwidth")
        )
    )
    assert [level.name for level in renamed.topology.levels] == ["nvlink", "infiniband", "spine"]


@pytest.mark.parametrize(
    ("gpus", "batch", "said"),
    [
        # dp 3 would split 32 sequences in micro-batches of 2 unevenly: not offered
        ("12", "{seq: 2048, micro: 2, global: 32}", "choose degrees whose product is 12"),
        ("16", "{seq: 2048, micro: 2, global: 48}", "change dp to 4 (or set topology.gpus to 8)"),
        # 10 GPUs fill no whole number of 4-GPU domains: resizing is what is offered
        ("10", "{seq: 2048, micro: 1, global: 30}", "but the topology has 10 GPUs; set topology"),
    ],
)
def test_a_dp_is_offered_only_where_the_plan_would_take_it(gpus, batch, said) -> None:
    """The world check offered dp 15 for 60 GPUs of 8-GPU nodes, which the batch and the
    topology checks then refused (an audit): a dp is offered where the batch splits over it
    and the GPUs fill the domains; else other degrees, or the topology resized."""
    text = BASE.replace("gpus: 8", f"gpus: {gpus}").replace(
        "batch: {seq: 2048, micro: 2, global: 32}", f"batch: {batch}"
    )
    (world,) = [p for p in problems_of(text) if "$.parallel:" in p]
    assert said in world


def test_a_remedy_is_offered_only_where_its_groups_spread_and_its_schedule_takes_it() -> None:
    """A review: a resize to 3 nodes for dp 3 put 1 and 2 ranks of the dp group in two
    nodes, which the spread check then refused; and dp 16 under the interleaved schedule
    left 1 micro-batch a step for 2 stages, which the batch check refused."""
    straddles = BASE.replace("dp: 2}", "dp: 3}")  # 12 GPUs: dp ranks 0, 2, 4 on 4-GPU domains
    (world,) = [p for p in problems_of(straddles) if "$.parallel:" in p]
    assert world.endswith("; change dp to 2")
    interleaved = BASE.replace("gpus: 8", "gpus: 64").replace(
        "parallel: {tp: 2, pp: 2, dp: 2}",
        "parallel: {tp: 2, pp: 2, dp: 2, pipeline: {schedule: interleaved, virtual_stages: 2}}",
    )
    (world,) = [p for p in problems_of(interleaved) if "$.parallel:" in p]
    assert "choose degrees whose product is 64" in world and "change dp" not in world
    (world,) = [p for p in problems_of(BASE.replace("gpus: 8", "gpus: 64")) if "$.parallel:" in p]
    assert "change dp to 16" in world


def test_a_dp_is_offered_only_where_the_expert_layers_fold_into_it() -> None:
    """An audit: Mixtral's ep 8 x etp 2 on 2 nodes was told "change dp to 2", whose stage of
    tp 2 x dp 2 = 4 ranks cannot hold 16 expert ranks. Here 8 GPUs would take dp 2; the
    plan as written (dp 8) folds, so no ep problem is said beside the world's."""
    moe = BASE.replace("vocab: 32000", "vocab: 32000\n  experts: {count: 8, top_k: 2}")
    moe = moe.replace("dp: 2}", "dp: 8, ep: 8, sequence_parallel: true}")
    moe = moe.replace("global: 32", "global: 64")
    (world,) = problems_of(moe)  # 32 GPUs of degrees on 8
    assert world.endswith("choose degrees whose product is 8 (or set topology.gpus to 32)")
    # 64 GPUs: dp 16, a stage of tp 2 x dp 16 = 32 ranks, which 16 expert ranks divide
    assert "change dp to 16" in problems_of(moe.replace("gpus: 8", "gpus: 64"))[0]


@pytest.mark.parametrize(
    ("edit", "path", "message"),
    [
        (
            ("  pp: 1\n", "  pp: 1\n  pipeline: {schedule: interleaved, virtual_stages: 2}\n"),
            "$.parallel.pipeline.schedule",
            "the interleaved schedule needs pp ≥ 2; with one stage use 1f1b",
        ),
        (
            ("  pp: 1\n", "  pp: 1\n  pipeline: {virtual_stages: 3}\n"),
            "$.parallel.pipeline.virtual_stages",
            "virtual_stages = 3 needs schedule: interleaved (1f1b runs one model chunk per stage)",
        ),
        (
            ("  pp: 1\n", "  pp: 1\n  pipeline: {layers_per_stage: [12, 12]}\n"),
            "$.parallel.pipeline.layers_per_stage",
            "layers_per_stage has 2 entries but pp = 1 stages need one each",
        ),
        (
            ("  optimizer: adam\n", "  optimizer: none\n"),
            "$.precision.optimizer",
            "optimizer: none is for serving plans; a training step updates its weights (adam "
            "or sgd), and its master copy and parameter gather go with them",
        ),
        (
            ("  zero: 1\n", "  zero: 1\n  sequence_parallel: true\n"),
            "$.parallel.sequence_parallel",
            "sequence_parallel needs tp > 1: it shards norms and dropout along the sequence "
            "over the tensor-parallel group, which has one rank here; set it to false or raise tp",
        ),
        (
            ("  seq: 2048\n", "  seq: 2046\n"),
            "$.parallel.cp",
            "batch.seq = 2046 is not divisible by 2 × cp = 4: context parallelism splits each "
            "sequence into 2 × cp load-balanced chunks, two per rank; make it a multiple of 4 "
            "(nearest: 2044 and 2048)",
        ),
    ],
)
def test_a_broken_model_hides_no_rule_that_does_not_read_it(
    tmp_path: Path, edit: tuple[str, str], path: str, message: str
) -> None:
    """Every problem of the file at once: a misspelt model.mlp hid the pipeline's and the
    precision's rules, which read no model (an audit)."""
    from tests.plan_files import variant

    root = Path(__file__).resolve().parent.parent
    # the sequence's rule needs context parallelism (cp 2 over the same 8 GPUs)
    cp = [("  dp: 8\n", "  dp: 4\n  cp: 2\n")] if path == "$.parallel.cp" else []
    plan = variant(
        tmp_path,
        "p.yaml",
        ("  mlp: gelu\n", "  mlp: relu\n"),
        edit,
        *cp,
        base=root / "plans/gpt-1.3b.yaml",
    )
    with pytest.raises(BudgetError) as caught:
        load_plan(plan)
    found = [(p.path, p.message) for p in caught.value.problems]
    assert [p for p, _ in found] == ["$.model.mlp", path]
    assert found[1][1] == message


def test_interleaving_over_two_stages_needs_its_sends_overlapped() -> None:
    """Megatron-LM refuses virtual stages over pp ≤ 2 without --overlap-p2p-communication
    (``validate_args``: multiple sends and receives between the same two ranks in one
    batch); budget priced such a plan and its search ranked one first (an audit). With
    overlap.pp it runs, and over pp 4 it needs no overlap."""
    interleaved = BASE.replace(
        "parallel: {tp: 2, pp: 2, dp: 2}",
        "parallel: {tp: 2, pp: 2, dp: 2, pipeline: {schedule: interleaved, virtual_stages: 2}}",
    )
    (problem,) = problems_of(interleaved)
    assert "$.parallel.pipeline.schedule: the interleaved schedule over pp = 2 stages needs " in (
        problem
    )
    assert "overlap.pp: true" in problem
    assert plan_of(interleaved + "overlap: {pp: true}\n").parallel.pp == 2
    # a serving plan has no schedule to interleave: only that is said (a review: it was
    # told to set overlap.pp, which serving refuses in turn)
    decode = Path(__file__).parent.parent / "plans" / "llama3-70b-decode.yaml"
    served = decode.read_text(encoding="utf-8").replace(
        "  tp: 8\n  pp: 1\n",
        "  tp: 4\n  pp: 2\n  pipeline: {schedule: interleaved, virtual_stages: 2}\n",
    )
    loaded = load_yaml(served, "p.yaml")
    said = [str(p) for p in validate_tree(loaded.tree, loaded.marks, "p.yaml")]
    with pytest.raises(BudgetError) as caught:
        resolve(loaded.tree, loaded.marks, "p.yaml")
    said += [str(p) for p in caught.value.problems]
    assert any("does not apply to a decode plan" in p for p in said), said
    assert not [p for p in said if "overlap.pp: true" in p]
    four = interleaved.replace("tp: 2, pp: 2, dp: 2", "tp: 1, pp: 4, dp: 2").replace(
        "layers: 4", "layers: 8"
    )
    assert plan_of(four).parallel.pipeline.virtual_stages == 2


def test_switching_the_mode_says_every_batch_key_at_once(tmp_path: Path) -> None:
    """A training plan switched to decode was told to add prompt, generate and sequences,
    and only once they were there that seq, micro and global do not apply (an audit: three
    runs for one change); both come in the first run, and an unknown mode says only itself."""
    text = (Path(__file__).parent.parent / "plans" / "llama3-70b.yaml").read_text("utf-8")
    plan = tmp_path / "decode.yaml"
    plan.write_text(text.replace("mode: train", "mode: decode", 1), "utf-8")
    result = CliRunner().invoke(app, route(["validate", str(plan)]))
    said = result.stderr
    missing = "'sequences', 'prompt' and 'generate' are required properties"
    assert result.exit_code == 2 and missing in said
    for key in ("seq", "micro", "global"):
        assert f"batch.{key} does not apply to a decode plan" in said
    plan.write_text(text.replace("mode: train", "mode: inference", 1), "utf-8")
    said = CliRunner().invoke(app, route(["validate", str(plan)])).stderr
    assert "'inference' is not one of" in said and "does not apply" not in said


def test_a_batch_key_of_the_other_mode_is_refused_whatever_its_value() -> None:
    """An audit: a decode plan's `micro: x` was told it is not an integer, and only once it
    was one that micro does not apply; its value is moot, and the first run says so. The
    mode's own keys keep their schema problems."""
    text = BASE.replace(
        "batch: {seq: 2048, micro: 2, global: 32}",
        "mode: decode\nbatch: {sequences: 16, prompt: y, generate: 24, micro: x, seq: [1]}",
    )
    # nor where the loader refused it: not finite, too large, a tag, the key twice (a review)
    for value in (".inf", "1e400", "12345678901234567890123", "!!binary aGVsbG8="):
        refused = text.replace("micro: x", f"micro: {value}")
        assert [p for p in _all_problems(refused) if "$.batch.micro" in p] == [
            "$.batch.micro: batch.micro does not apply to a decode plan, whose batch is "
            "sequences, prompt, generate"
        ], value
    twice = text.replace("micro: x,", "micro: 1, micro: 2,")
    assert [p for p in _all_problems(twice) if "$.batch.micro" in p] == [
        "$.batch.micro: batch.micro does not apply to a decode plan, whose batch is "
        "sequences, prompt, generate"
    ]
    found = _all_problems(text)
    assert found == [
        "$.batch.prompt: 'y' is not an integer",
        "$.batch.micro: batch.micro does not apply to a decode plan, whose batch is sequences, "
        "prompt, generate",
        "$.batch.seq: batch.seq does not apply to a decode plan, whose batch is sequences, "
        "prompt, generate",
    ]


def test_tf32_parameters_are_stored_fp32_and_are_their_own_master(tmp_path: Path) -> None:
    """tf32 is a matmul mode: its parameters are stored fp32, their own master copy, as
    fp32 parameters are (Megatron-LM's distributed optimizer: 16 B a parameter with fp32
    parameters and gradients, 8 + 8/d under ZeRO 1). An audit: params: tf32 defaulted to
    a second fp32 master, 20 B a parameter, 10.9 GB more on GPT-3's stage 1 at ZeRO 0; and
    params: fp32 beside master: tf32, or tf32 beside tf32, loaded as that second copy."""
    from budget.pipeline import build_report
    from tests.plan_files import variant

    fp32 = variant(
        tmp_path, "fp32.yaml", ("params: bf16", "params: fp32"), ("  master: fp32\n", "")
    )
    tf32 = variant(
        tmp_path, "tf32.yaml", ("params: bf16", "params: tf32"), ("  master: fp32\n", "")
    )
    wide, narrow = (build_report(load_plan(p)).stages[1] for p in (fp32, tf32))
    assert load_plan(tf32).precision.master is load_plan(fp32).precision.master is None
    assert narrow.optimizer_bytes == wide.optimizer_bytes
    assert narrow.params_bytes == wide.params_bytes
    for params, master in (("tf32", "fp32"), ("fp32", "tf32"), ("tf32", "tf32")):
        path = variant(
            tmp_path,
            "two.yaml",
            ("params: bf16", f"params: {params}"),
            ("master: fp32", f"master: {master}"),
        )
        with pytest.raises(BudgetError) as caught:
            load_plan(path)
        (problem,) = caught.value.problems
        assert problem.path == "$.precision.master"
        assert f"master: {master} beside params: {params} is a second fp32 copy" in problem.message


def test_the_triton_kernel_is_refused_what_it_cannot_run(tmp_path) -> None:
    """llm-foundry's Triton FlashAttention takes Q, K, V, an additive bias and the causal
    flag, and asserts a head dimension of at most 128 (``flash_attn_triton.py``): Gemma 2
    9B on it was priced, "Fits, 5.72 s", with its window's saving (an audit). Each thing it
    cannot run is named, at model.attention; MPT's own heads of 128 load."""
    from budget.errors import BudgetError
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    gemma = variant(
        tmp_path,
        "g.yaml",
        ("attention: flash\n", "attention: triton\n"),
        base=ROOT / "plans" / "gemma2-9b.yaml",
    )
    with pytest.raises(BudgetError) as raised:
        load_plan(gemma)
    (problem,) = raised.value.problems
    assert problem.path == "$.model.attention"
    assert problem.message == (
        "model.attention = triton (llm-foundry's Triton FlashAttention) cannot run head "
        "dimension 256 (it takes 128 at most) or a sliding window (it has no window) or "
        "soft-capped scores (it has no cap); use flash2, flash or eager"
    )
    llama = variant(
        tmp_path,
        "l.yaml",
        ("  attention: flash\n", "  attention: triton\n"),
        base=ROOT / "plans" / "llama3-70b.yaml",
    )
    assert load_plan(llama).model.attention == "triton"  # head dimension 128


def test_an_interleaved_plans_global_batch_is_offered_values_its_schedule_takes() -> None:
    """Under the interleaved schedule the micro-batches a step must also be a multiple of pp
    (Megatron-LM), so the values offered for a global batch that micro × dp does not divide
    are multiples of micro × dp × pp = 2 × 2 × 2 = 8: 30 is offered 24 and 32, not 28,
    which the schedule's own rule then refused (an audit, m468)."""
    text = BASE.replace("global: 32", "global: 30").replace(
        "parallel: {tp: 2, pp: 2, dp: 2}",
        "parallel: {tp: 2, pp: 2, dp: 2, pipeline: {schedule: interleaved, virtual_stages: 2}}",
    )
    (said,) = [p for p in problems_of(text) if "$.batch.global" in p]
    assert said.endswith(
        "every data-parallel rank runs the same number of micro-batches (and, interleaved, "
        "their count a multiple of pp = 2); the nearest valid values are 24 and 32"
    )
    fixed = text.replace("global: 30", "global: 24")
    assert not [p for p in problems_of(fixed) if "$.batch.global" in p]
