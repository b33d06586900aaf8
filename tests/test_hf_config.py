"""Hugging Face config.json import, on the released configs kept in tests/data/hf."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from budget.cli import app, route
from budget.errors import BudgetError, Problem
from budget.layers import active_params, mlp_saved, params_total, shapes
from budget.pipeline import build_report
from budget.plan.hf_config import (
    CLASS_DEFAULTS,
    FAMILIES,
    HfConfigError,
    read_hf_config,
    translate,
)
from budget.plan.load import load_plan
from budget.plan.model import Plan
from budget.plan.resolve import resolve
from budget.plan.yaml_load import Marks
from budget.report import to_dict

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def _read(name: str) -> dict[str, object]:
    return read_hf_config(DATA / "hf" / name / "config.json").tree


def _raw(name: str) -> dict[str, object]:
    """tests/data/hf/`name`/config.json as the file has it."""
    raw: dict[str, object] = json.loads((DATA / "hf" / name / "config.json").read_text())
    return raw


def _plan(name: str, seq: int = 4096) -> Plan:
    """A one-node training plan whose model is tests/data/hf/`name`/config.json."""
    return _plan_at(DATA / "hf" / name / "config.json", seq)


def _plan_at(config: Path, seq: int = 4096) -> Plan:
    """A one-node training plan whose model is the config.json at `config`."""
    tree = {
        "model": {"hf_config": str(config)},
        "batch": {"seq": seq, "micro": 1, "global": 8},
        "parallel": {"dp": 8},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    return resolve(tree, Marks(), "plan.yaml")


def _embedding(plan: Plan) -> int:
    m = plan.model
    return m.vocab * m.hidden * (1 if m.tied_embeddings else 2)


def test_llama3_70b() -> None:
    tree = _read("llama3-70b")
    assert tree == {
        "layers": 80,
        "hidden": 8192,
        "heads": 64,
        "kv_heads": 8,
        "ffn": 28672,
        "vocab": 128256,
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "bias": False,
        "mlp_bias": False,
        "tied_embeddings": False,
        "position": "rope",
        "attention": "flash",
    }


def test_mixtral_experts() -> None:
    assert _read("mixtral-8x7b")["experts"] == {"count": 8, "top_k": 2}


def test_qwen_moe_experts() -> None:
    assert _read("qwen1.5-moe-a2.7b")["experts"] == {
        "count": 60,
        "top_k": 4,
        "ffn": 1408,
        "shared_ffn": 5632,
        "shared_gate": True,
    }


def test_qwen3_moe_has_heads_wider_than_the_model_and_the_published_counts() -> None:
    """Qwen3-30B-A3B: 32 query heads of 128 over a 2048-wide model (head_dim is not hidden /
    heads), 128 experts of 768 with 8 per token on every layer and no shared expert. Qwen's
    model card: 30.5 B parameters, 3.3 B activated."""
    tree = _read("qwen3-30b-a3b")
    assert (tree["hidden"], tree["heads"], tree["kv_heads"], tree["head_dim"]) == (
        2048,
        32,
        4,
        128,
    )
    assert tree["experts"] == {"count": 128, "top_k": 8, "ffn": 768}
    plan = _plan("qwen3-30b-a3b")
    assert round(params_total(plan) / 1e9, 1) == 30.5
    # exactly: 48 x (q and o 2048 x 4096, k and v 2048 x 512, per-head q and k norms 2 x 128,
    # two norms, router 2048 x 128, 128 experts of 3 x 2048 x 768) + final norm + untied
    # embeddings 2 x 151,936 x 2048
    per_layer = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 2 * 2048 + 2048 * 128
    per_layer += 128 * 3 * 2048 * 768
    assert params_total(plan) == 48 * per_layer + 2048 + 2 * 151_936 * 2048 == 30_532_122_624
    # the card's "3.3B activated": 3.35 B here, counting both embeddings (3.04 B without the
    # input one)
    assert 3.3e9 <= active_params(plan) < 3.4e9


def test_deepseek_v3_experts() -> None:
    tree = _read("deepseek-v3")
    assert tree["experts"] == {
        "count": 256,
        "top_k": 8,
        "ffn": 2048,
        "shared_ffn": 2048,
        "first_dense_layers": 3,
    }
    assert tree["head_dim"] == 128  # v_head_dim
    assert "kv_heads" not in tree
    assert tree["mla"] == {"q_rank": 1536, "kv_rank": 512, "nope_dim": 128, "rope_dim": 64}


def test_latent_attention_needs_its_head_dimensions() -> None:
    """DeepseekV3Config gives a file without qk_rope_head_dim 64; written by hand (no
    model_type, so no class), the file must give it."""
    config = json.loads((DATA / "hf" / "deepseek-v3" / "config.json").read_text())
    del config["qk_rope_head_dim"]
    assert translate(config).tree["mla"]["rope_dim"] == 64
    del config["model_type"], config["architectures"]  # which would name DeepSeek-V3's class
    with pytest.raises(HfConfigError, match="lacks qk_rope_head_dim"):
        translate(config)


def test_sparse_step_and_dense_only_layers_become_a_pattern() -> None:
    config = json.loads((DATA / "hf" / "qwen1.5-moe-a2.7b" / "config.json").read_text())
    config.update(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
    assert translate(config).tree["experts"]["pattern"] == [False, True, False, False]
    # every layer in mlp_only_layers: transformers builds a dense model, and so does budget
    # (review m493: a written pattern of no MoE layer is refused, and this one was with it)
    config.update(decoder_sparse_step=1, mlp_only_layers=[0, 1, 2, 3])
    assert "experts" not in translate(config).tree


def test_unknown_key_is_named() -> None:
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config["mystery_width"] = 3
    with pytest.raises(HfConfigError, match="'mystery_width'"):
        translate(config)


def test_hf_plan_gives_the_same_report_as_the_hand_written_plan() -> None:
    """Acceptance 2 of issue 7: identical reports except the plan's file."""
    hand = to_dict(build_report(load_plan(ROOT / "plans" / "llama3-70b.yaml")))
    hf = to_dict(build_report(load_plan(DATA / "llama3-70b-hf.yaml")))
    assert hand.pop("plan")["name"] == hf.pop("plan")["name"]
    assert hand == hf


def _hf_problem(tmp_path: Path, config: dict[str, object], model: str = "") -> Problem:
    """The one problem of the Llama 3 70B hf_config plan with `config` as its config.json
    and `model` as extra lines under `model:`."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = (
        (DATA / "llama3-70b-hf.yaml")
        .read_text()
        .replace("  hf_config: hf/llama3-70b/config.json", f"{model}  hf_config: config.json")
    )
    path = tmp_path / "plan.yaml"
    path.write_text(plan)
    with pytest.raises(BudgetError) as raised:
        load_plan(path)
    (problem,) = raised.value.problems
    return problem


def test_unknown_key_error_points_at_the_hf_config_node(tmp_path: Path) -> None:
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config["mystery_width"] = 3
    problem = _hf_problem(tmp_path, config)
    assert problem.path == "$.model.hf_config"
    assert (problem.line, problem.col) == (7, 14)
    assert "'mystery_width'" in problem.message


def _window(config: dict[str, object]) -> object:
    return translate(config).tree.get("sliding_window")


def test_a_sliding_window_reads_with_its_length() -> None:
    """Mistral 7B v0.1's config sets sliding_window 4096 and every layer slides. Null
    (Mixtral) is no window; use_sliding_window, which only Qwen's classes read, is refused
    where it would switch a window off that transformers builds (an audit: Mistral 7B read
    without its window), and a family whose attention never slides (Llama) is refused rather
    than read with one."""
    config = json.loads((DATA / "hf" / "mistral-7b-v0.3" / "config.json").read_text())
    config["sliding_window"] = 4096
    assert _window(config) == {"size": 4096}
    config["use_sliding_window"] = True  # MistralConfig has no such key: no change
    assert _window(config) == {"size": 4096}
    config["use_sliding_window"] = False
    with pytest.raises(HfConfigError, match=r"use_sliding_window = false in .*does not read it"):
        translate(config)
    gemma = json.loads((DATA / "hf" / "gemma-2-9b" / "config.json").read_text())
    with pytest.raises(HfConfigError, match='"gemma2"\'s class does not read it'):
        translate({**gemma, "use_sliding_window": False})
    qwen = {**config, "model_type": "qwen2", "use_sliding_window": False}
    assert _window(qwen) is None  # Qwen2Config reads it
    config.update(sliding_window=None, use_sliding_window=True)
    assert _window(config) is None
    config["sliding_window"] = -1
    with pytest.raises(HfConfigError, match="not a positive number of tokens"):
        translate(config)
    llama = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    with pytest.raises(HfConfigError, match='"llama" builds no sliding-window attention'):
        translate({**llama, "sliding_window": 4096})
    # nor experts: LlamaForCausalLM ignores num_local_experts and counts 70.55 B, where the
    # keys read as experts made a 465 B MoE (review)
    with pytest.raises(HfConfigError, match='"llama" builds no mixture of experts'):
        translate({**llama, "num_local_experts": 8, "num_experts_per_tok": 2})


@pytest.mark.parametrize(
    ("model_type", "layers", "full"),
    [
        ("gemma2", 42, set(range(1, 42, 2))),  # Gemma2Config: (i + 1) % 2, odd layers full
        ("gpt_oss", 24, set(range(1, 24, 2))),  # GptOssConfig, likewise
        ("gemma3_text", 26, {5, 11, 17, 23}),  # Gemma3TextConfig: every 6th layer full
        ("olmo3", 16, {3, 7, 11, 15}),  # Olmo3Config: every 4th layer full
    ],
)
def test_layer_kinds_without_layer_types_are_the_config_class_defaults(
    model_type: str, layers: int, full: set[int]
) -> None:
    config = json.loads((DATA / "hf" / "gemma-2-9b" / "config.json").read_text())
    config.update(model_type=model_type, num_hidden_layers=layers)
    if not model_type.startswith("gemma"):  # Gemma's own keys, which the others refuse
        for key in ("hidden_activation", "final_logit_softcapping", "attn_logit_softcapping"):
            del config[key]
    window = _window(config)
    assert isinstance(window, dict) and window["size"] == 4096
    flags = window["layers"]
    assert len(flags) == layers and full == {i for i, f in enumerate(flags) if not f}
    config["sliding_window_pattern"] = 2
    if model_type == "gemma3_text":
        assert _window(config) == window | {"layers": [i % 2 == 0 for i in range(layers)]}


def test_a_long_sequence_reads_with_its_window_and_cp_is_refused_beside_it(
    tmp_path: Path,
) -> None:
    """A window shorter than the sequence is priced, not refused; context parallelism
    beside it is, at parallel.cp, since budget prices ring and gathered attention over the
    whole context. A window no shorter than the sequence masks nothing, but Transformer
    Engine's ring still refuses it (Megatron-LM hands it the window on every sliding layer;
    an audit, m469): cp there takes the all-gather."""
    config = json.loads((DATA / "hf" / "mistral-7b-v0.3" / "config.json").read_text())
    config["sliding_window"] = 4096
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = (
        (DATA / "llama3-70b-hf.yaml")
        .read_text()
        .replace("hf_config: hf/llama3-70b/config.json", "hf_config: config.json")
    )
    (tmp_path / "plan.yaml").write_text(plan)
    assert load_plan(tmp_path / "plan.yaml").model.window == 4096
    (tmp_path / "plan.yaml").write_text(plan.replace("dp: 16", "cp: 2\n  dp: 8"))
    with pytest.raises(BudgetError) as raised:
        load_plan(tmp_path / "plan.yaml")
    (problem,) = raised.value.problems
    assert problem.path == "$.parallel.cp"
    assert "sliding window of 4,096 tokens shorter than batch.seq = 8,192" in problem.message
    cp = plan.replace("dp: 16", "cp: 2\n  dp: 8").replace("seq: 8192", "seq: 4096")
    (tmp_path / "plan.yaml").write_text(cp)
    with pytest.raises(BudgetError) as raised:
        load_plan(tmp_path / "plan.yaml")
    (problem,) = raised.value.problems
    assert (
        problem.path == "$.parallel.cp" and "on the ring beside a sliding window" in problem.message
    )
    gathered = cp.replace("cp: 2\n", "cp: 2\n  cp_attention: allgather\n")
    (tmp_path / "plan.yaml").write_text(gathered)
    assert load_plan(tmp_path / "plan.yaml").parallel.cp == 2


def test_a_value_head_dimension_without_latent_attention_is_the_head_dimension() -> None:
    """In a file written by hand (no model_type); LlamaAttention reads no v_head_dim, so a
    Llama file with one is refused (`test_keys_another_family_reads_are_refused`)."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config["v_head_dim"] = 96
    del config["model_type"], config["architectures"]
    assert translate(config).tree["head_dim"] == 96


def test_a_preset_and_a_config_together_are_refused(tmp_path: Path) -> None:
    """Each describes the whole model; what one omits the other would leak into it."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    problem = _hf_problem(tmp_path, config, "  preset: deepseek-v3\n")
    assert problem.path == "$.model.hf_config"
    assert "both describe the whole model" in problem.message


def test_the_schema_alone_refuses_a_preset_with_a_config() -> None:
    """Editors check plans against the schema file only, so it refuses the pair itself, at
    the hf_config key (where yaml-language-server flags it, in its own words); budget's
    schema check gives the loader's sentence, and the loader keeps the rule for trees that
    skip the schema."""
    from budget.plan.resolve import PRESET_AND_CONFIG, resolve
    from budget.plan.schema import schema, validate_tree
    from budget.plan.yaml_load import Marks

    (rule,) = schema()["properties"]["model"]["allOf"]
    assert rule["then"]["properties"]["hf_config"]["x-message"] == PRESET_AND_CONFIG
    tree = {"model": {"preset": "llama3-8b", "hf_config": "config.json"}}
    problems = [
        p for p in validate_tree(tree, Marks(), "plan.yaml") if p.path.startswith("$.model")
    ]
    assert [(p.path, p.message) for p in problems] == [("$.model.hf_config", PRESET_AND_CONFIG)]
    for one in ({"preset": "llama3-8b"}, {"hf_config": "config.json"}):
        found = validate_tree({"model": one}, Marks(), "plan.yaml")
        assert not [p for p in found if p.path.startswith("$.model")]
    whole = {
        **tree,
        "batch": {"seq": 2048, "micro": 1, "global": 8},
        "parallel": {"dp": 8},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    with pytest.raises(BudgetError) as raised:
        resolve(whole, Marks(), "plan.yaml")
    assert PRESET_AND_CONFIG in {p.message for p in raised.value.problems}


def test_gemma_gelu_is_a_gated_mlp_with_the_papers_parameter_count() -> None:
    """Gemma's config says ``hidden_act: gelu`` and ``GemmaMLP`` gates it (gate, up and down
    projections). Gemma Team, arXiv 2403.08295, Table 2: Gemma 2B has 1,981,884,416
    non-embedding parameters. By hand, per layer: q and o 2048 x (8 x 256) each, k and v
    2048 x 256 each (one kv head) = 9,437,184; the MLP 3 x 2048 x 16384 = 100,663,296; two
    RMSNorm scales 4,096; 18 layers = 1,981,882,368, plus the final norm's 2,048. A two-matrix
    GeLU MLP would give 1.38 B."""
    tree = _read("gemma-2b")
    assert (tree["mlp"], tree["kv_heads"], tree["head_dim"]) == ("geglu", 1, 256)
    assert tree["tied_embeddings"] is True  # no key: transformers' default, as Gemma ties
    plan = _plan("gemma-2b")
    assert params_total(plan) - _embedding(plan) == 1_981_884_416


def test_hidden_activation_is_read_before_hidden_act() -> None:
    """GemmaConfig's ``hidden_activation`` supersedes the legacy ``hidden_act``."""
    config = json.loads((DATA / "hf" / "gemma-2b" / "config.json").read_text())
    config.update(hidden_act="silu", hidden_activation="gelu_pytorch_tanh")
    assert translate(config).tree["mlp"] == "geglu"
    config["hidden_activation"] = None
    assert translate(config).tree["mlp"] == "swiglu"


def test_a_geglu_model_costs_what_the_same_swiglu_model_costs() -> None:
    """The gate's activation is one elementwise pass either way; only its name differs."""
    gemma = _plan("gemma-2b")
    swiglu = dataclasses.replace(gemma, model=dataclasses.replace(gemma.model, mlp="swiglu"))
    a, b = to_dict(build_report(gemma)), to_dict(build_report(swiglu))
    assert a["step"] == b["step"]
    assert a["memory"]["peak_bytes"] == b["memory"]["peak_bytes"]
    saved = {a.name for a in mlp_saved(gemma, shapes(gemma))}
    assert "MLP GeGLU input (gate, up)" in saved


def test_qwen25_reads_with_its_mrope_switch() -> None:
    """Qwen2.5's configs carry ``use_mrope: false`` (multimodal rotary sections: the same
    rotation cost) and a ``sliding_window`` switched off by ``use_sliding_window: false``.
    Qwen2.5-0.5B has 494,032,768 parameters; by hand, embedding 151,936 x 896 = 136,134,656
    (tied); per layer q and o 896 x 896, k and v 896 x 128 = 1,835,008, MLP 3 x 896 x 4864 =
    13,074,432, norms 1,792, q, k and v biases 896 + 2 x 128 = 1,152 (Qwen2Attention adds
    them without a config key: model.qkv_bias), so 24 layers = 357,897,216; final norm
    896."""
    plan = _plan("qwen2.5-0.5b")
    assert (plan.model.qkv_bias, plan.model.bias) == (True, False)
    assert params_total(plan) == 151_936 * 896 + 24 * (1_835_008 + 13_074_432 + 1_792 + 1_152) + 896
    assert params_total(plan) == 494_032_768


def test_a_config_saved_by_transformers_5_reads() -> None:
    """transformers 5 writes ``dtype``, ``rope_parameters`` and one ``layer_types`` entry
    per layer. Qwen2.5-1.5B by hand: per layer q and o 1536 x 1536, k and v 1536 x 256 =
    5,505,024, MLP 3 x 1536 x 8960 = 41,287,680, norms 3,072, q, k and v biases 1536 + 2 x
    256 = 2,048; 28 layers and the final norm = 1,310,340,608 non-embedding (the model
    card's "1.31B")."""
    plan = _plan("qwen2.5-1.5b-transformers5")
    assert params_total(plan) - _embedding(plan) == 1_310_340_608


def test_a_config_saved_by_transformers_4_47_to_4_50_reads_past_its_kernel_tag() -> None:
    """transformers 4.47 to 4.50 saved ``_attn_implementation_autoset: true`` into
    fine-tuned checkpoints' files (an audit found it refused): a kernel choice, like
    ``attn_implementation``, that builds nothing."""
    config = _raw("qwen2.5-0.5b")
    tagged = translate({**config, "_attn_implementation_autoset": True})
    assert tagged.tree == translate(config).tree


def test_layer_types_read_full_and_sliding_layers_and_refuse_others() -> None:
    config = json.loads((DATA / "hf" / "qwen2.5-1.5b-transformers5" / "config.json").read_text())
    config["layer_types"][3] = "linear_attention"
    with pytest.raises(HfConfigError, match="1 of 28 layers of kind linear_attention"):
        translate(config)
    config["layer_types"][3] = "sliding_attention"
    assert _window(config) is None  # Qwen2Config: no window without use_sliding_window
    config["use_sliding_window"] = True
    with pytest.raises(HfConfigError, match="sliding_window = null is not a positive"):
        translate(config)
    config["sliding_window"] = 4096
    window = _window(config)
    assert window == {"size": 4096, "layers": [i == 3 for i in range(28)]}
    config["layer_types"] = "full_attention"
    with pytest.raises(HfConfigError, match="not a list of layer kinds"):
        translate(config)


def test_one_unknown_key_is_named_in_the_singular() -> None:
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config["mystery_width"] = 3
    with pytest.raises(
        HfConfigError, match=r"has key 'mystery_width' .*\(a tag, a kernel setting\), remove it, or"
    ):
        translate(config)
    config["mystery_depth"] = 4
    with pytest.raises(HfConfigError, match=r"has keys 'mystery_depth', 'mystery_width' .*them"):
        translate(config)


@pytest.mark.parametrize(
    ("name", "count"),
    [
        # 32 layers x 100,669,440 (q 3072 x 3072, k and v 3072 x 1024, o 3072 x 3072, MLP
        # 3 x 3072 x 8192, two norms) + final norm 3,072 + tied embedding 200,064 x 3072
        ("phi-4-mini-instruct", 32 * 100_669_440 + 3_072 + 200_064 * 3072),
        # 40 x 199,237,632 (q and o 4096 x 4096, k and v 4096 x 1024, MLP 3 x 4096 x 12800,
        # two norms) + final norm 4,096 + tied embedding 49,159 x 4096
        ("granite-3.3-8b-instruct", 40 * 199_237_632 + 4_096 + 49_159 * 4096),
        # 42 x 198,195,200 (q and o 3584 x 4096, k and v 3584 x 2048, MLP 3 x 3584 x 14336,
        # four norms: sandwich_norm) + final norm + tied embedding 256,000 x 3584
        ("gemma-2-9b", 42 * 198_195_200 + 3_584 + 256_000 * 3584),
        # OLMo 2 7B: 32 x (4 x 4096 x 4096 + 3 x 4096 x 11008 + 2 x 4096 + q and k norms
        # 2 x 4096, full width: 32 heads and 32 kv heads of 128) + 4,096 + untied
        # 2 x 100,352 x 4096
        (
            "olmo-2-7b-instruct",
            32 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 4 * 4096) + 4096 + 2 * 100_352 * 4096,
        ),
        # Qwen3 8B: 36 x (q and o 4096 x 4096, k and v 4096 x 1024, MLP 3 x 4096 x 12288,
        # two norms, per-head q and k norms 2 x 128) + final norm 4,096 + untied
        # 2 x 151,936 x 4096
        (
            "qwen3-8b",
            36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128)
            + 4096
            + 2 * 151_936 * 4096,
        ),
        # Mistral 7B v0.3: 32 x (2 x 4096 x 4096 + 2 x 4096 x 1024 + 3 x 4096 x 14336 +
        # 2 x 4096) + 4,096 + untied 2 x 32,768 x 4096 (sliding_window null)
        (
            "mistral-7b-v0.3",
            32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
            + 4096
            + 2 * 32_768 * 4096,
        ),
        # Kimi K2 reads as DeepSeek-V3 does (its own test counts that architecture by hand);
        # 1,026,408,209,408 is what transformers 5.24 counts building the file on the meta
        # device, and the model card's "1T total"
        ("kimi-k2-instruct", 1_026_408_209_408),
    ],
)
def test_other_families_read_to_the_transformers_count(name: str, count: int) -> None:
    """Phi-3's dropout probabilities and pre-extension context, Granite's four scalar
    multipliers, Gemma 2's soft-capping, query scale, cache kind and sliding_window_size,
    OLMo 2's and Kimi K2's Llama and DeepSeek keys: each changes no parameter, byte or FLOP
    budget prices, so each file reads, to the count (the hand counts above agree with
    transformers 5.24 on the meta device)."""
    assert params_total(_plan(name)) == count


def test_gemma_3_reads_its_sandwich_and_head_norms_to_the_transformers_count() -> None:
    """Gemma 3 1B: 26 x (q 1152 x 4·256 and o, k and v 1152 x 256, MLP 3 x 1152 x 6912,
    four norms 4 x 1152, per-head q and k norms 2 x 256) + final norm + tied embedding
    262,144 x 1152 = 999,885,952, transformers 5.24's count; at its 512-token window."""
    tree = _read("gemma-3-1b")
    assert (tree["sandwich_norm"], tree["qk_norm"], tree["mlp"]) == (True, "per_head", "geglu")
    count = 26 * (2 * 1152 * 1024 + 2 * 1152 * 256 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256)
    assert params_total(_plan("gemma-3-1b", seq=512)) == count + 1152 + 262_144 * 1152


def test_glm_attention_bias_is_on_q_k_and_v_only() -> None:
    """GLM-4.5-Air's ``attention_bias`` gives q, k and v biases (``Glm4MoeAttention``), not
    the output projection's or the experts': read as qkv_bias, the file comes to
    transformers 5.24's 106,852,245,504. By hand, 96 heads and 8 KV heads of 128 over 4096:
    attention q and o 4096 x 12288, k and v 4096 x 1024, q, k and v biases 12288 + 2 x 1024,
    two norms 2 x 4096, on 46 layers; one dense MLP 3 x 4096 x 10944; 45 MoE layers of a
    4096 x 128 router, 128 experts and one shared expert of 3 x 4096 x 1408; the final norm
    and untied embeddings 2 x 151,552 x 4096 (its MTP layer is counted apart). With
    ``use_qk_norm`` its layers gain per-head q and k norms, 2 x 128 each."""
    plan = _plan("glm-4.5-air")
    assert (plan.model.qkv_bias, plan.model.bias, plan.model.qk_norm) == (True, False, "none")
    attention = 2 * 4096 * 12288 + 2 * 4096 * 1024 + 12288 + 2 * 1024 + 2 * 4096
    moe = 4096 * 128 + 129 * 3 * 4096 * 1408
    count = 46 * attention + 3 * 4096 * 10944 + 45 * moe + 4096 + 2 * 151_552 * 4096
    assert params_total(plan) == count == 106_852_245_504
    config = json.loads((DATA / "hf" / "glm-4.5-air" / "config.json").read_text())
    config["use_qk_norm"] = True
    assert translate(config).tree["qk_norm"] == "per_head"


def test_a_non_zero_dropout_probability_turns_dropout_on() -> None:
    config = json.loads((DATA / "hf" / "phi-4-mini-instruct" / "config.json").read_text())
    assert "dropout" not in translate(config).tree  # every probability is 0.0
    config["resid_pdrop"] = 0.1
    assert translate(config).tree["dropout"] is True
    config["resid_pdrop"] = 2
    with pytest.raises(HfConfigError, match=r"resid_pdrop = 2 .* is not a probability"):
        translate(config)


def test_a_copied_key_must_agree_with_its_original() -> None:
    """Gemma 2 writes its window twice (sliding_window_size), gpt-oss its top-k twice
    (experts_per_token): the copy reads when alone and must agree when both are there."""
    config = json.loads((DATA / "hf" / "gemma-2-9b" / "config.json").read_text())
    assert config["sliding_window_size"] == config["sliding_window"] == 4096
    del config["sliding_window"]
    assert _window(config) == {"size": 4096, "layers": [i % 2 == 0 for i in range(42)]}
    config["sliding_window"] = 2048
    with pytest.raises(HfConfigError, match=r"sliding_window = 2048 but its copy .*; make"):
        translate(config)
    mixtral = json.loads((DATA / "hf" / "mixtral-8x7b" / "config.json").read_text())
    del mixtral["num_experts_per_tok"]
    mixtral["experts_per_token"] = 4  # gpt-oss's; Mixtral's 2 is also the default
    assert translate(mixtral).tree["experts"]["top_k"] == 4
    mixtral["experts_per_token"] = [4]  # a bad value is named by the key that holds it
    with pytest.raises(HfConfigError, match=r"experts_per_token = \[4\]"):
        translate(mixtral)


def test_an_output_layer_bias_is_refused() -> None:
    config = json.loads((DATA / "hf" / "phi-4-mini-instruct" / "config.json").read_text())
    assert config["lm_head_bias"] is False
    config["lm_head_bias"] = True
    with pytest.raises(HfConfigError, match="lm_head_bias"):
        translate(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests its values too deeply"),
        ('{"hidden_size": 8192, "hidden_size": 4096}', "has key 'hidden_size' twice"),
        ('{"hidden_size": 1' + "0" * 5000 + "}", "too large (integers must be below 2**63)"),
        ('{"hidden_size": 8192, "rms_norm_eps": NaN}', "rms_norm_eps = NaN in"),
        ("[1, 2]", "holds an array, not a JSON object"),  # in JSON's words: not "list"
        ("null", "holds null, not a JSON object"),  # not "NoneType" (an audit)
        ("true", "holds true, not a JSON object"),
        ("1e400", "has 1e400, not a finite number"),  # and nothing of "holds _Refused"
        ('{"hidden_size": 8192', "is not JSON: Expecting"),
    ],
)
def test_a_hostile_config_is_refused_with_a_sentence(
    tmp_path: Path, text: str, message: str
) -> None:
    """The plan file's own care (bounded, one value per key, integers below 2**63, finite
    numbers) holds for the config.json it points at, and nothing reaches a traceback."""
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    assert message in str(raised.value) and "_Refused" not in str(raised.value)


def test_a_config_too_large_or_not_utf8_is_not_read(tmp_path: Path) -> None:
    from budget.plan.hf_config import MAX_BYTES

    path = tmp_path / "config.json"
    path.write_bytes(b" " * (MAX_BYTES + 1))
    with pytest.raises(HfConfigError, match="so it was not read"):
        read_hf_config(path)
    path.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(HfConfigError, match=r"not UTF-8 text \(byte 13\)"):
        read_hf_config(path)


def test_a_byte_order_mark_is_read_past_as_in_a_plan(tmp_path: Path) -> None:
    """Python's json refuses a leading BOM in its own words ("decode using utf-8-sig"); a
    plan file may start with one, so a config may too."""
    original = DATA / "hf" / "llama3-70b" / "config.json"
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + original.read_bytes())
    assert read_hf_config(path).tree == read_hf_config(original).tree


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_hidden_layers", 10**9, "model.layers: 1000000000 is greater than the maximum"),
    ],
)
def test_a_config_meets_the_bounds_a_written_model_does(
    tmp_path: Path, key: str, value: int, message: str
) -> None:
    """A billion layers would build per-layer tables for minutes; the schema's bounds
    apply to what a config says as to what a plan says."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config[key] = value
    problem = _hf_problem(tmp_path, config)
    assert problem.path == "$.model.hf_config"
    assert problem.message.startswith(f"'{tmp_path / 'config.json'}' gives {message}")
    assert problem.message.count(" gives ") == 1


@pytest.mark.parametrize("plan_file", ["mixtral-8x7b.yaml", "llama3-70b-decode.yaml"])
def test_geglu_costs_what_swiglu_costs_in_experts_and_serving(plan_file: str) -> None:
    """The experts' gates (MoE) and a decode step's MLP read `Model.gate` like the dense
    training path."""
    plan = load_plan(ROOT / "plans" / plan_file)
    assert plan.model.mlp == "swiglu"
    geglu = dataclasses.replace(plan, model=dataclasses.replace(plan.model, mlp="geglu"))
    a, b = to_dict(build_report(plan)), to_dict(build_report(geglu))
    assert a["step"] == b["step"]
    assert a["memory"]["peak_bytes"] == b["memory"]["peak_bytes"]


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"])
def test_every_gelu_name_is_a_gated_gelu(act: str) -> None:
    config = json.loads((DATA / "hf" / "gemma-2b" / "config.json").read_text())
    config["hidden_act"] = act
    assert translate(config).tree["mlp"] == "geglu"


def test_a_gated_gelu_takes_the_llama_width_by_default() -> None:
    from budget.plan.resolve import llama_ffn

    tree = {
        "model": {"layers": 2, "hidden": 4096, "heads": 32, "vocab": 32000, "mlp": "geglu"},
        "batch": {"seq": 2048, "micro": 1, "global": 8},
        "parallel": {"dp": 8},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    assert resolve(tree, Marks(), "plan.yaml").model.ffn == llama_ffn(4096) == 11008


@pytest.mark.parametrize("value", [["gelu"], 3, "relu"])
def test_an_activation_budget_does_not_price_is_named_by_its_key(value: object) -> None:
    config = json.loads((DATA / "hf" / "gemma-2b" / "config.json").read_text())
    config["hidden_activation"] = value
    with pytest.raises(HfConfigError, match=r"^hidden_activation = .* is not one of"):
        translate(config)


@pytest.mark.parametrize(
    "key", ["attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop"]
)
def test_each_dropout_probability_turns_dropout_on(key: str) -> None:
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    assert "dropout" not in translate(config).tree
    config[key] = 0.1
    assert translate(config).tree["dropout"] is True


def _count(config: dict[str, object]) -> int:
    """Parameters of `config` in a one-node training plan (as `_plan`, from a dictionary)."""
    tree = {
        "model": translate(config).tree,
        "batch": {"seq": 4096, "micro": 1, "global": 8},
        "parallel": {"dp": 8},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    return params_total(resolve(tree, Marks(), "plan.yaml"))


LLAMA3_70B = 70_553_706_496  # transformers' count of tests/data/hf/llama3-70b


@pytest.mark.parametrize(
    ("keys", "biases"),
    [
        # LlamaAttention's attention_bias: q 8192, k and v 1024 each, o 8192 per layer, x 80
        ({"attention_bias": True}, 80 * (8192 + 2 * 1024 + 8192)),
        # LlamaMLP's mlp_bias: gate and up 28672 each, down 8192 per layer, x 80
        ({"mlp_bias": True}, 80 * (2 * 28672 + 8192)),
        ({"attention_bias": True, "mlp_bias": True}, 80 * (18432 + 65536)),
        # InternLM2's bias: wqkv and wo (its MLP w1, w2, w3 have none)
        ({"model_type": "internlm2", "bias": True}, 80 * 18432),
    ],
)
def test_attention_and_mlp_biases_are_separate_switches(
    keys: dict[str, object], biases: int
) -> None:
    """Llama's two switches, and InternLM2's attention-only one, count the biases their
    model classes build and no others, on Llama 3 70B's dimensions."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    assert _count(config) == LLAMA3_70B
    assert _count({**config, **keys}) == LLAMA3_70B + biases


def test_gpt_oss_experts_and_router_keep_their_biases_whatever_attention_bias_says() -> None:
    """GptOssExperts and GptOssTopKRouter build biases with no key saying so (nor one that
    could turn them off): 32 experts of gate-up 2 x 2880 and down 2880 and a router of 32,
    per layer, within the totals below; attention_bias adds q 4096,
    k and v 512 each and o 2880 (gpt-oss-20b's dimensions, 24 layers). With its released
    attention_bias and its 24 x 64 attention sinks, the file comes to the 20.91 B total of
    OpenAI's gpt-oss model card (Table 1); on gpt-oss-120b's dimensions (36 layers, 128
    experts) to transformers' count of the released file, 116,829,156,672."""
    config = {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 201088,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "tie_word_embeddings": False,
        "attention_bias": False,
    }
    assert translate(config).tree["mlp_bias"] is True
    assert translate({**config, "attention_bias": True}).tree["mlp_bias"] is True
    attention = 24 * (4096 + 2 * 512 + 2880)
    assert _count({**config, "attention_bias": True}) == _count(config) + attention
    # GptOssConfig has no mlp_bias: a file's false or null leaves the biases (review)
    assert _count({**config, "mlp_bias": False}) == _count({**config, "mlp_bias": None})
    assert _count({**config, "mlp_bias": None}) == _count(config)
    assert translate(config).tree["attention_sinks"] is True
    assert round(_count({**config, "attention_bias": True}) / 1e9, 2) == 20.91
    big = {**config, "attention_bias": True, "num_hidden_layers": 36, "num_local_experts": 128}
    assert _count(big) == 116_829_156_672


def _qwen(**keys: object) -> dict[str, object]:
    config = json.loads((DATA / "hf" / "qwen2.5-0.5b" / "config.json").read_text())
    del config["use_sliding_window"]
    config.update(sliding_window=4096, **keys)
    return config


@pytest.mark.parametrize(
    ("keys", "window"),
    [
        ({}, None),  # Qwen2Config: use_sliding_window defaults to false
        ({"use_sliding_window": True}, {"size": 4096}),  # from layer max_window_layers = 0
        (
            {"use_sliding_window": True, "max_window_layers": 12},
            {"size": 4096, "layers": [False] * 12 + [True] * 12},
        ),
        ({"use_sliding_window": True, "max_window_layers": 24}, None),  # ... of 24: none
        ({"model_type": "mistral"}, {"size": 4096}),  # elsewhere a window set is one used
    ],
)
def test_qwens_window_slides_as_qwen2config_builds_it(keys: dict[str, object], window: object):
    config = _qwen(**keys)
    if keys.get("use_sliding_window") and "max_window_layers" not in keys:
        config["max_window_layers"] = 0
    assert _window(config) == window


def test_qwen_defaults_and_moe_windows_without_layer_types() -> None:
    """Qwen2Config and Qwen3Config slide from layer 28 when max_window_layers is absent; their
    MoE configurations must list layer_types to slide at all. OLMo 3 slides at 4,096 when
    its file gives no window (Olmo3Config's default)."""
    config = _qwen(use_sliding_window=True, num_hidden_layers=32)
    del config["max_window_layers"]
    assert _window(config) == {"size": 4096, "layers": [i >= 28 for i in range(32)]}
    with pytest.raises(HfConfigError, match=r'"qwen3_moe" slide then .* give layer_types'):
        translate({**config, "model_type": "qwen3_moe"})
    olmo = json.loads((DATA / "hf" / "olmo-2-7b-instruct" / "config.json").read_text())
    window = _window({**olmo, "model_type": "olmo3"})
    assert window == {"size": 4096, "layers": [(i + 1) % 4 != 0 for i in range(32)]}
    assert _window({**olmo, "model_type": "olmo3", "sliding_window": None}) is None


def test_a_window_switch_must_be_true_or_false() -> None:
    with pytest.raises(HfConfigError, match=r'use_sliding_window = "false" .* not true or false'):
        translate(_qwen(use_sliding_window="false"))


@pytest.mark.parametrize(
    ("kinds", "message"),
    [
        (["full_attention"] * 3, "lists 3 kinds for num_hidden_layers = 28; give one kind"),
        (["chunked_attention"] * 28, "28 of 28 layers of kind chunked_attention"),
    ],
)
def test_layer_types_must_cover_every_layer_with_a_kind_budget_prices(
    kinds: list[str], message: str
) -> None:
    config = json.loads((DATA / "hf" / "qwen2.5-1.5b-transformers5" / "config.json").read_text())
    config["layer_types"] = kinds
    with pytest.raises(HfConfigError, match=message):
        translate(config)


def test_gemma2s_logit_soft_capping_keeps_a_logits_copy_and_adds_a_pass() -> None:
    """cap · tanh(logits / cap): the tanh keeps its bf16 output for backward, so the loss
    instant holds one more logits-sized tensor, 2 B x 4,096 tokens x 256,000 = 2,097,152,000
    B (1.95 GiB) for Gemma 2 9B here, and three eager kernels (a division, a tanh, a
    product) each read and write the logits, 6 passes; the backward 7, in 3 launches each
    way (an audit, m391: priced as one fused pass)."""
    from budget.flops import loss_work

    capped = _plan("gemma-2-9b")
    assert capped.model.logit_softcap is True  # final_logit_softcapping: 30.0
    plain = dataclasses.replace(
        capped, model=dataclasses.replace(capped.model, logit_softcap=False)
    )
    a, b = to_dict(build_report(capped)), to_dict(build_report(plain))
    assert a["memory"]["stages"][0]["peak_phase"] == "loss"
    assert a["memory"]["peak_bytes"] - b["memory"]["peak_bytes"] == 2 * 4096 * 256_000
    passes = {w.name: w.bytes for w in loss_work(capped, shapes(capped))}
    assert passes["logit soft-capping"] == 6 * 2 * 4096 * 256_000
    work = {w.name: w for w in loss_work(capped, shapes(capped))}
    assert work["logit soft-capping backward"].bytes == 7 * 2 * 4096 * 256_000
    assert work["logit soft-capping"].launches == work["logit soft-capping backward"].launches == 3
    assert "logit soft-capping" not in {w.name for w in loss_work(plain, shapes(plain))}
    assert a["step"]["time_s"] > b["step"]["time_s"]


def test_gemma2s_attention_soft_capping_keeps_the_tanh_of_the_scores_under_eager(
    tmp_path: Path,
) -> None:
    """An audit: attn_logit_softcapping was read and dropped, so eager attention, which
    transformers' eager_attention_forward runs as scores / cap, tanh, · cap before the mask
    and softmax, left out the tanh output autograd keeps. Gemma 2 9B at tp 4 with sequence
    parallelism, 8,192 tokens, no recompute: 4 heads a rank x 8,192² x 2 B = 536,870,912 B a
    layer, 42 layers 22,548,578,304 B more at the loss (60,104,204,928 -> 82,652,783,232 B),
    and three passes over the scores each way (seven back). The fused kernel takes the cap
    in its registers: nothing more; a file whose cap is null sets none."""
    from budget.flops import ATTENTION_SOFTCAP, attention_core

    config = DATA / "hf" / "gemma-2-9b" / "config.json"
    assert _plan("gemma-2-9b").model.attention_softcap is True  # 50.0
    assert _plan("gemma-3-1b").model.attention_softcap is False  # null
    tree = {
        "model": {"hf_config": str(config), "attention": "eager"},
        "batch": {"seq": 8192, "micro": 1, "global": 256},
        "parallel": {"tp": 4, "dp": 16, "sequence_parallel": True, "zero": 1},
        "overlap": {"dp_grads": True, "param_gather": True},
        "device": {"preset": "h100-sxm", "reserved": "3 GiB"},
        "topology": {"preset": "dgx-h100", "nodes": 8},
    }
    capped = resolve(tree, Marks(), "plan.yaml")
    plain = dataclasses.replace(
        capped, model=dataclasses.replace(capped.model, attention_softcap=False)
    )
    a, b = build_report(capped).worst, build_report(plain).worst
    assert (a.peak_phase, b.peak_bytes) == ("loss", 60_104_204_928)
    assert a.peak_bytes - b.peak_bytes == 42 * 4 * 8192**2 * 2 == 22_548_578_304
    (cap,) = [w for w in attention_core(capped, shapes(capped)) if w.name == ATTENTION_SOFTCAP]
    assert cap.bytes == 6 * 2 * 4 * 8192**2  # read and write, three passes
    flash = dataclasses.replace(capped, model=dataclasses.replace(capped.model, attention="flash"))
    unflashed = dataclasses.replace(
        flash, model=dataclasses.replace(flash.model, attention_softcap=False)
    )
    assert build_report(flash).worst.peak_bytes == build_report(unflashed).worst.peak_bytes


def test_a_non_finite_float_or_a_special_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 1e400}')
    with pytest.raises(HfConfigError, match=r"hidden_size = 1e400 in .* is not a finite number"):
        read_hf_config(path)
    with pytest.raises(HfConfigError, match="is not a regular file"):
        read_hf_config(tmp_path)  # a directory; a FIFO would block the read forever


@pytest.mark.parametrize("key", ["final_logit_softcapping", "attn_logit_softcapping"])
def test_a_class_that_reads_no_soft_cap_builds_none_from_a_zero(key: str) -> None:
    """A review: a Llama file carrying a cap of 0, which LlamaConfig never reads, was told
    the cap must be positive; a set one is still refused as a key the class does not read."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config[key] = 0
    tree = translate(config).tree
    assert "logit_softcap" not in tree and "attention_softcap" not in tree
    config[key] = 50.0
    with pytest.raises(HfConfigError, match="class does not read it"):
        translate(config)


@pytest.mark.parametrize("cap", ["yes", -30, [1], True])
def test_a_soft_cap_must_be_a_positive_number(cap: object) -> None:
    config = json.loads((DATA / "hf" / "gemma-2-9b" / "config.json").read_text())
    config["final_logit_softcapping"] = cap
    with pytest.raises(HfConfigError, match="is not a positive number"):
        translate(config)
    config["final_logit_softcapping"] = None
    assert "logit_softcap" not in translate(config).tree


def test_full_width_qk_norms_are_refused_under_tensor_parallelism(tmp_path) -> None:
    """OLMo 2 norms the whole query projection: a tp rank lacks the other heads' share of
    it, and the gathers that would fetch them are not priced."""
    from budget.errors import BudgetError

    tree = {
        "model": {"hf_config": str(DATA / "hf" / "olmo-2-7b-instruct" / "config.json")},
        "batch": {"seq": 4096, "micro": 1, "global": 8},
        "parallel": {"tp": 8, "sequence_parallel": True},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    with pytest.raises(BudgetError) as raised:
        resolve(tree, Marks(), "plan.yaml")
    (problem,) = raised.value.problems
    assert problem.path == "$.parallel.tp"
    assert problem.message.startswith("model.qk_norm = full_width with tp = 8: a norm over")


@pytest.mark.parametrize("model_type", ["glm", "glm4"])
def test_glm_and_glm4_read_qkv_biases_and_glm4_its_post_norms(model_type: str) -> None:
    """GlmAttention and Glm4Attention put attention_bias on q, k and v only (o_proj and the
    MLP have none); Glm4DecoderLayer norms each block's output as well
    (post_self_attn_layernorm, post_mlp_layernorm); GlmDecoderLayer does not."""
    config = {
        "model_type": model_type,
        "hidden_size": 4096,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "intermediate_size": 13696,
        "vocab_size": 151552,
        "attention_bias": True,
        "rms_norm_eps": 1e-5,
    }
    tree = translate(config).tree
    assert (tree["bias"], tree["qkv_bias"]) == (False, True)
    assert tree.get("sandwich_norm", False) is (model_type == "glm4")


def test_a_config_qkv_bias_switch_reads_and_switches_are_checked() -> None:
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    assert "qkv_bias" not in translate(config).tree
    # no class of FAMILIES reads it: a file written by hand may switch it on, a Llama file
    # not (LlamaAttention ignores it; `test_keys_another_family_reads_are_refused`)
    by_hand = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    assert translate({**by_hand, "qkv_bias": True}).tree["qkv_bias"] is True
    with pytest.raises(HfConfigError, match=r'^qkv_bias = true in .*: model_type "llama"'):
        translate({**config, "qkv_bias": True})
    assert "qkv_bias" not in translate({**config, "qkv_bias": False}).tree
    keys = ("qkv_bias", "use_qk_norm", "attention_bias", "mlp_bias", "tie_word_embeddings")
    for key in (*keys, "lm_head_bias", "bias"):
        with pytest.raises(HfConfigError, match=rf'{key} = "false" in .* is not true or false'):
            translate({**config, key: "false"})
        translate({**config, key: None})  # JSON null: false (`test_a_null_switch_...`)
    assert translate({**config, "tie_word_embeddings": None}).tree["tied_embeddings"] is False


def test_an_unknown_model_type_is_refused_not_read_as_llama() -> None:
    """Its class may build norms or biases no key announces (as Qwen2's biases and OLMo 2's
    norms are), which a Llama reading would silently leave out."""
    config = json.loads((DATA / "hf" / "qwen3-8b" / "config.json").read_text())
    with pytest.raises(HfConfigError, match=r'model_type = "qwen3_x" in .* is not a family'):
        translate({**config, "model_type": "qwen3_x"})
    del config["model_type"]
    # its architectures still name Qwen3's class: told to say so, not read as Llama (an
    # audit: a GPT-NeoX file without model_type was priced with Llama's gated MLP)
    with pytest.raises(HfConfigError, match=r'are qwen3\'s: add "model_type": "qwen3"'):
        translate(config)
    del config["architectures"]
    assert "qk_norm" not in translate(config).tree  # by hand: read as Llama


def test_a_file_without_model_type_is_read_as_llama_only_where_its_class_is_llamas() -> None:
    """`architectures` names the class a file was saved from: Llama's is read as Llama,
    another family's is told to name its model_type, and a class of no family budget reads
    (GPT-NeoX, whose two-matrix GeLU MLP read as Llama's gated one made GPT-NeoX-20B 27.2
    billion parameters, not 20.6) is refused with the families it reads."""
    config = {k: v for k, v in _raw("llama3-70b").items() if k != "model_type"}
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert translate(config).tree == translate({**config, "architectures": "a tag"}).tree
    neox = {**config, "architectures": ["GPTNeoXForCausalLM"]}
    with pytest.raises(HfConfigError) as caught:
        translate(neox)
    assert '("GPTNeoXForCausalLM") name a model class of no family budget reads' in str(
        caught.value
    )
    assert "qwen3_moe): write the model's dimensions out instead" in str(caught.value)
    with pytest.raises(HfConfigError, match=r'are gemma3_text\'s: add "model_type"'):
        translate({**config, "architectures": ["Gemma3ForCausalLM"]})
    with pytest.raises(HfConfigError, match="name a model class of no family"):  # two kinds
        translate({**config, "architectures": ["LlamaForCausalLM", "FalconForCausalLM"]})


def test_a_multimodal_file_is_refused_with_where_its_language_model_is() -> None:
    """Gemma 3 4B's file nests the language model under text_config (keys as released, the
    vision tower's cut short): reading that alone would drop the vision tower's cost."""
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
        "quantization_config": {"quant_method": "fp8"},  # not a part of the model
        "mm_tokens_per_image": 256,
    }
    with pytest.raises(HfConfigError) as raised:
        translate(config, "gemma-3-4b-it/config.json")
    message = str(raised.value)
    assert message.startswith(
        'gemma-3-4b-it/config.json configures a model of several parts (model_type "gemma3"): '
        "the language model's keys are under text_config beside vision_config"
    )
    assert "mm_tokens_per_image" not in message  # not a list of unknown keys
    assert message.endswith(
        "or text_config alone saved as a file (the keys it leaves out take "
        "its model_type's defaults)"
    )


def test_a_wrapper_whose_language_model_is_no_family_says_so():
    """Llama 4 Scout's language model is "llama4_text", which budget does not read: the
    refusal says so rather than advising a text_config file that would be refused next (an
    audit; keys as released, the vision tower's cut short)."""
    config = {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {"model_type": "llama4_text", "hidden_size": 5120},
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408},
    }
    with pytest.raises(HfConfigError) as raised:
        translate(config, "Llama-4-Scout/config.json")
    message = str(raised.value)
    assert (
        "budget prices a language model alone; write the model's dimensions out: its language "
        'model (model_type "llama4_text") is not a family budget reads either ('
    ) in message  # the advice before the list of families, which a terminal cuts (a review)
    assert "saved as a file" not in message


@pytest.mark.parametrize(
    ("name", "key", "value", "message"),
    [
        (
            "deepseek-v3",
            "first_k_dense_replace",
            "x",
            'first_k_dense_replace = "x" .* not a non-negative integer',
        ),
        (
            "deepseek-v3",
            "first_k_dense_replace",
            2.7,
            "first_k_dense_replace = 2.7 .* not a non-negative",
        ),
        ("deepseek-v3", "moe_layer_freq", [2], r"moe_layer_freq = \[2\] .* not a positive integer"),
        ("deepseek-v3", "moe_layer_freq", -1, "moe_layer_freq = -1 .* not a positive integer"),
        ("deepseek-v3", "moe_layer_freq", 0, "moe_layer_freq = 0 .* not a positive integer"),
        ("qwen1.5-moe-a2.7b", "decoder_sparse_step", 2.5, "decoder_sparse_step = 2.5 .* positive"),
        ("qwen1.5-moe-a2.7b", "mlp_only_layers", 5, "mlp_only_layers = 5 .* not a list of layer"),
        ("qwen1.5-moe-a2.7b", "mlp_only_layers", "abc", 'mlp_only_layers = "abc" .* not a list'),
        ("qwen1.5-moe-a2.7b", "mlp_only_layers", [1, -2], r"mlp_only_layers = \[1, -2\] .* list"),
    ],
)
def test_a_malformed_expert_layout_key_is_named_not_truncated_or_a_traceback(
    name: str, key: str, value: object, message: str
) -> None:
    """These keys used to pass through int() or set(): "x" and [2] raised a traceback, 2.5
    was truncated to 2, -1 acted as 1 and "abc" as no dense layers. A null reads as the key
    left out of a file written by hand (a class's default fills only a key left out)."""
    config = json.loads((DATA / "hf" / name / "config.json").read_text())
    with pytest.raises(HfConfigError, match=message):
        translate({**config, key: value})
    by_hand = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    absent = {k: v for k, v in by_hand.items() if k != key}
    assert translate({**by_hand, key: None}).tree == translate(absent).tree


def test_the_lists_of_layers_are_said_beside_the_files_other_problems() -> None:
    """Qwen1.5-MoE with a decoder_sparse_step of 0, a junk mlp_only_layers and layer kinds
    budget does not price: all three in one run (an audit, m447: each hid the next, since
    the lists were read only once every other key was sound)."""
    config = json.loads((DATA / "hf" / "qwen1.5-moe-a2.7b" / "config.json").read_text())
    layers = config["num_hidden_layers"]
    bad = {"decoder_sparse_step": 0, "mlp_only_layers": [-1, "a"], "layer_types": ["x"] * layers}
    with pytest.raises(HfConfigError) as error:
        translate({**config, **bad})
    said = error.value.messages
    assert len(said) == 3
    assert said[0].startswith("decoder_sparse_step = 0 in config.json is not a positive")
    assert 'mlp_only_layers = [-1, "a"] in config.json is not a list of layer indices' in said
    assert any(f"{layers} of {layers} layers of kind x in layer_types" in s for s in said)
    # alone, each is what `_translate` says of it
    for key, value in bad.items():
        with pytest.raises(HfConfigError) as one:
            translate({**config, key: value})
        assert len(one.value.messages) == 1 and one.value.messages[0] in said


def test_a_float_a_config_rounds_to_zero_is_refused_as_written(tmp_path: Path) -> None:
    """1e-400 is read by JSON as 0.0, and was told "rms_norm_eps = 0.0 is not a positive
    number" (an audit, m447)."""
    path = tmp_path / "config.json"
    path.write_text('{"rms_norm_eps": 1e-400}')
    with pytest.raises(HfConfigError, match=r"rms_norm_eps = 1e-400 in .* is too small for a"):
        read_hf_config(path)


def test_a_problem_with_a_key_the_config_gave_is_placed_at_hf_config(tmp_path: Path) -> None:
    """Mixtral's config with 9 experts per token of 8: the plan writes no experts, so the
    problem is at the hf_config node (line 7, column 14), naming the file, not at model:."""
    config = json.loads((DATA / "hf" / "mixtral-8x7b" / "config.json").read_text())
    problem = _hf_problem(tmp_path, {**config, "num_experts_per_tok": 9})
    assert problem.path == "$.model.hf_config"
    assert (problem.line, problem.col) == (7, 14)
    assert "config.json' gives model.experts.top_k: top_k = 9 routes each token" in problem.message


def test_a_model_type_that_is_not_a_string_is_refused_too() -> None:
    config = json.loads((DATA / "hf" / "qwen3-8b" / "config.json").read_text())
    with pytest.raises(HfConfigError, match=r'model_type = \["qwen3"\] in .* is not a family'):
        translate({**config, "model_type": ["qwen3"]})


def test_a_bad_layer_count_beside_a_window_is_refused_before_layers_are_listed() -> None:
    """The window's layer kinds are listed only once num_hidden_layers is a sound integer,
    and not at all past the plan schema's 4,096 layers (the schema refuses those): a count
    of 10^10 answers at once instead of building ten billion flags."""
    config = json.loads((DATA / "hf" / "gemma-2-9b" / "config.json").read_text())
    with pytest.raises(HfConfigError, match=r'num_hidden_layers = "abc" .* a positive integer'):
        translate({**config, "num_hidden_layers": "abc"})
    tree = translate({**config, "num_hidden_layers": 10**10}).tree
    assert tree["sliding_window"] == {"size": 4096}


@pytest.mark.parametrize(
    ("model_type", "window"),
    [("mistral", 4096), ("gemma2", 4096), ("gpt_oss", 128), ("mixtral", None), ("phi3", None)],
)
def test_a_file_without_a_window_key_slides_at_its_config_class_default(
    model_type: str, window: int | None
) -> None:
    config = json.loads((DATA / "hf" / "mistral-7b-v0.3" / "config.json").read_text())
    del config["sliding_window"]
    read = _window({**config, "model_type": model_type})
    assert (read["size"] if isinstance(read, dict) else read) == window


def test_an_fp8_checkpoint_is_served_in_fp8_unless_the_plan_says_otherwise(tmp_path) -> None:
    """DeepSeek-V3's config.json says its weights are fp8 (quantization_config: quant_method
    fp8, e4m3 in 128 × 128 blocks): serving it keeps them in fp8 (671 B parameters, about
    78 GiB a rank at tp 8), where budget read the file as bf16 and found it did not fit.
    A plan that writes precision.params keeps its own; training keeps bf16."""
    config = (DATA / "hf" / "deepseek-v3" / "config.json").resolve()

    def plan(mode: str, extra: str = "") -> Plan:
        batch = (
            "{seq: 4096, micro: 1, global: 8}"
            if mode == "train"
            else "{sequences: 8, prompt: 1024, generate: 128}"
        )
        text = (
            f"mode: {mode}\nmodel: {{hf_config: {config}}}\nbatch: {batch}\n{extra}"
            "parallel: {tp: 8, ep: 8, etp: 1, sequence_parallel: true}\n"
            "device: {preset: h200}\ntopology: {preset: dgx-h200, nodes: 1}\n"
        )
        path = tmp_path / f"{mode}.yaml"
        path.write_text(text, encoding="utf-8")
        return load_plan(path)

    assert translate(json.loads(config.read_text(encoding="utf-8"))).weights == "fp8"
    assert plan("decode").precision.params == "fp8"
    assert plan("decode", "precision: {params: bf16}\n").precision.params == "bf16"
    assert plan("train").precision.params == "bf16"
    with pytest.raises(HfConfigError, match=r'quant_method = "awq" in c\.json stores weights'):
        translate(
            {
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
                "vocab_size": 8,
                "quantization_config": {"quant_method": "awq"},
            },
            "c.json",
        )


def test_unknown_keys_do_not_hide_the_next_problem(tmp_path: Path) -> None:
    """Unknown keys and a negative layer count: both in one run, each its own error line at
    $.model.hf_config (only the unknown keys were reported; review)."""
    llama = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**llama, "foo": 1, "bar": 2, "num_hidden_layers": -3}))
    with pytest.raises(HfConfigError) as caught:
        read_hf_config(config)
    first, second = caught.value.messages
    assert "keys 'bar', 'foo' that budget does not understand" in first
    assert "num_hidden_layers" in second
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: x\nmodel: {hf_config: config.json}\nbatch: {seq: 8192, micro: 1, global: 8}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n"
        "parallel: {tp: 8}\n",
        encoding="utf-8",
    )
    with pytest.raises(BudgetError) as problems:
        load_plan(plan)
    assert [p.path for p in problems.value.problems] == ["$.model.hf_config"] * 2


def test_files_re_saved_by_transformers_5_read_as_the_released_ones() -> None:
    """A fine-tune's save_pretrained under transformers 5 writes keys the released file did
    not: Gemma's use_bidirectional_attention (false) and Gemma 3's _sliding_window_pattern,
    DeepSeek's qk_head_dim (nope + rope) and rope_interleave, gpt-oss's swiglu_alpha. Each
    re-saved file reads as its original (they were refused; review)."""
    for name, extra in (
        ("gemma-2b", {"use_bidirectional_attention": False}),
        ("gemma-2-9b", {"use_bidirectional_attention": False}),
        ("gemma-3-1b", {"use_bidirectional_attention": False, "_sliding_window_pattern": 6}),
        ("deepseek-v3", {"qk_head_dim": 192, "rope_interleave": True}),
    ):
        config = _raw(name)
        assert translate({**config, **extra}).tree == translate(config).tree, name
    gemma3 = _raw("gemma-3-1b")
    del gemma3["sliding_window_pattern"]  # the copy alone then sets which layers slide
    every_third = translate({**gemma3, "_sliding_window_pattern": 3}).tree["sliding_window"]
    assert every_third["layers"][:6] == [True, True, False, True, True, False]
    with pytest.raises(HfConfigError, match=r"qk_head_dim = 128, but qk_nope_head_dim \+ "):
        translate({**_raw("deepseek-v3"), "qk_head_dim": 128})
    with pytest.raises(HfConfigError, match=r"use_bidirectional_attention: an encoder"):
        translate({**_raw("gemma-3-1b"), "use_bidirectional_attention": True})


@pytest.mark.parametrize(
    "quant",
    [
        # Meta's Llama 3.1 405B FP8 (transformers' FbgemmFp8Config)
        {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0},
        # llm-compressor's float-quantized format
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {
                "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}
            },
        },
    ],
)
def test_other_fp8_formats_read_as_fp8(quant: dict[str, object]) -> None:
    llama = _raw("llama3-70b")
    assert translate({**llama, "quantization_config": quant}).weights == "fp8"


def test_four_bit_weights_are_refused_with_a_way_forward() -> None:
    """gpt-oss ships only its mxfp4 file, so "use the unquantized config.json" could not be
    followed (review): the message says to delete the block to budget the weights in bf16."""
    groups = {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}
    for quant in (
        {"quant_method": "mxfp4"},
        {"quant_method": "compressed-tensors", "config_groups": groups},
    ):
        with pytest.raises(HfConfigError, match=r"delete quantization_config to budget the"):
            translate({**_raw("llama3-70b"), "quantization_config": quant})


def test_a_refused_family_is_not_told_to_remove_its_keys() -> None:
    """Phi-3.5-MoE's input_jitter_noise beside model_type phimoe: removing the key cannot
    help, so only the family is named (review)."""
    config = {**_raw("llama3-70b"), "model_type": "phimoe", "input_jitter_noise": 0.01}
    with pytest.raises(HfConfigError) as caught:
        translate(config)
    assert caught.value.messages[0].startswith('model_type = "phimoe"')
    assert "input_jitter_noise" not in str(caught.value)


def test_an_fp8_checkpoint_that_keeps_block_layers_in_bf16_is_refused() -> None:
    """Meta's Llama 3.1 405B FP8 leaves the attention projections and the first and last
    layers' MLPs in bf16 (``modules_to_not_convert``); read as fp8 throughout, a rank at tp
    8 would hold about 9 GiB less than the checkpoint does (review). The output layer,
    embedding and MoE routers, which budget keeps in bf16 or which weigh nothing, may stay
    out of fp8."""
    llama = _raw("llama3-70b")
    kept = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}
    assert translate({**llama, "quantization_config": kept}).weights == "fp8"
    ignore = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}
        },
        "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"],
    }
    assert translate({**llama, "quantization_config": ignore}).weights == "fp8"
    # Qwen3-Coder-480B-A35B-Instruct-FP8 lists every layer's norms and router, which no fp8
    # config converts (transformers replaces linear layers alone; an audit: refused)
    norms = ["lm_head", "model.layers.0.input_layernorm", "model.layers.0.mlp.gate"]
    norms += ["model.layers.0.post_attention_layernorm", "re:.*self_attn.q_norm$"]
    listed = {"quant_method": "fp8", "modules_to_not_convert": norms}
    assert translate({**llama, "quantization_config": listed}).weights == "fp8"
    attention = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "lm_head"]
    meta = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": attention}
    with pytest.raises(HfConfigError, match=r"keeps 2 modules of the blocks out of fp8 \("):
        translate({**llama, "quantization_config": meta})
    # a bare name, not a list, was passed over and its module budgeted in fp8 (an audit)
    bare = {"quant_method": "fp8", "modules_to_not_convert": "model.layers.0.mlp.down_proj"}
    with pytest.raises(
        HfConfigError, match=r"modules_to_not_convert = \"model\.layers.*is not a list"
    ):
        translate({**llama, "quantization_config": bare})


def test_a_head_width_key_must_agree_with_the_heads() -> None:
    """qk_head_dim, which transformers 5 writes for latent attention, is checked where a
    file without latent attention carries it too (it was read and ignored; review)."""
    llama = _raw("llama3-70b")
    assert translate({**llama, "qk_head_dim": 128}).tree == translate(llama).tree
    with pytest.raises(HfConfigError, match=r"qk_head_dim = 999, but its heads are 128 wide"):
        translate({**llama, "qk_head_dim": 999})


def test_a_compressed_tensors_group_that_targets_some_layers_is_refused() -> None:
    """A group that quantizes only the MLP projections leaves the attention in bf16 without
    listing it in ignore; read as fp8 throughout, it was priced all fp8 (review)."""
    mlp = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {"targets": ["re:.*mlp.*proj$"], "weights": {"num_bits": 8, "type": "float"}}
        },
    }
    with pytest.raises(HfConfigError, match=r"delete quantization_config to budget the"):
        translate({**_raw("llama3-70b"), "quantization_config": mlp})


def test_a_preset_serves_in_the_format_its_config_does(tmp_path: Path) -> None:
    """The deepseek-v3 preset serves the fp8 weights its release holds, as an hf_config
    of the same release does: one decode plan written both ways reports the same bytes and
    times (the preset served bf16, 79.9 against 40.1 GiB of states a rank at tp 16; review)."""
    config = (DATA / "hf" / "deepseek-v3" / "config.json").resolve()
    body = (
        "mode: decode\nbatch: {sequences: 32, prompt: 2048, generate: 512}\n"
        "parallel: {tp: 16}\ndevice: {preset: h200}\n"
        "topology: {preset: dgx-h200, nodes: 2}\n"
    )
    reports = []
    for name, model in (
        ("preset", "{preset: deepseek-v3}"),
        ("config", f"{{hf_config: {config}}}"),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: s\nmodel: {model}\n{body}", encoding="utf-8")
        plan = load_plan(path)
        assert plan.precision.params == "fp8"
        reports.append(to_dict(build_report(plan)))
    preset, from_config = reports
    assert preset.keys() == from_config.keys()
    differ = [key for key in preset if preset[key] != from_config[key]]
    assert differ == ["plan", "model"]  # the file, and the model's name
    assert {**preset["model"], "name": "s"} == from_config["model"]


# google/gemma-3-12b-it's text_config as its config.json nests it: transformers writes only
# the keys that differ from Gemma3TextConfig's defaults (quoted in a public test of a Gemma 3
# reader, "omits vocab_size, head_dim"; search id 66438928834), here given to hf_config alone
GEMMA_3_12B_TEXT = {
    "hidden_size": 3840,
    "intermediate_size": 15360,
    "model_type": "gemma3_text",
    "num_attention_heads": 16,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "sliding_window": 1024,
}


def test_a_text_config_copied_out_reads_with_its_class_defaults(tmp_path: Path) -> None:
    """Gemma 3 12B's language model: head_dim 256, vocab 262,208 and tied embeddings are
    Gemma3TextConfig's defaults (read as Llama's conventions, head_dim would be 3840 / 16 =
    240 and the count 11.62 B). By hand: 48 x (q and o 2 x 3840 x 16·256, k and v
    2 x 3840 x 8·256, MLP 3 x 3840 x 15360, four norms 4 x 3840, per-head q and k norms
    2 x 256) + final norm 3840 + tied embedding 262,208 x 3840 = 11,766,034,176."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA_3_12B_TEXT))
    tree = read_hf_config(path).tree
    assert (tree["head_dim"], tree["vocab"], tree["kv_heads"]) == (256, 262_208, 8)
    assert (tree["tied_embeddings"], tree["mlp"]) == (True, "geglu")
    layer = 2 * 3840 * 4096 + 2 * 3840 * 2048 + 3 * 3840 * 15360 + 4 * 3840 + 2 * 256
    assert layer == 224_148_992
    plan = _plan_at(path)
    assert params_total(plan) == 48 * layer + 3840 + 262_208 * 3840 == 11_766_034_176


def test_every_family_has_its_class_defaults() -> None:
    assert set(CLASS_DEFAULTS) == FAMILIES


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (DATA / "hf").iterdir() if (p / "config.json").exists())
)
def test_a_released_file_without_the_keys_equal_to_its_class_defaults_reads_the_same(
    name: str,
) -> None:
    """What ``save_pretrained`` leaves out of a nested text_config: every key whose value is
    its class's default. Dropping them from each released file changes nothing."""
    config = _raw(name)
    defaults = CLASS_DEFAULTS[str(config["model_type"])]
    trimmed = {k: v for k, v in config.items() if k not in defaults or defaults[k] != v}
    assert len(trimmed) < len(config)  # each file has at least one key at its default
    assert translate(trimmed).tree == translate(config).tree


def test_a_class_default_is_not_added_beside_the_key_a_file_names_it_by() -> None:
    """transformers 5 reads Mixtral's ``num_experts`` as ``num_local_experts``: a file giving
    4 experts by that name has 4, not MixtralConfig's default 8 added beside them."""
    config = _raw("mixtral-8x7b")
    del config["num_local_experts"]
    assert translate({**config, "num_experts": 4}).tree["experts"]["count"] == 4
    assert translate(config).tree["experts"]["count"] == 8  # left out: the class's 8


def test_a_hand_written_file_keeps_the_plan_language_defaults() -> None:
    """Without model_type there is no class: vocab_size is required, embeddings are tied
    (PretrainedConfig), kv heads are the heads and head_dim hidden / heads."""
    config = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8}
    with pytest.raises(HfConfigError, match="lacks vocab_size"):
        translate(config)
    tree = translate({**config, "vocab_size": 1000}).tree
    assert tree["tied_embeddings"] is True
    assert "kv_heads" not in tree and "head_dim" not in tree
    llama = translate({**config, "model_type": "llama"}).tree  # LlamaConfig's defaults
    assert (llama["tied_embeddings"], llama["vocab"], llama["ffn"]) == (False, 32000, 11008)


def test_a_null_switch_reads_false_as_the_modelling_code_does() -> None:
    """``tie_word_embeddings: null`` sets the attribute to None, and ``if
    config.tie_word_embeddings:`` leaves the output layer untied; absent, the class's default
    (Llama's: untied; Gemma's: tied)."""
    gemma = _raw("gemma-2b")
    assert translate(gemma).tree["tied_embeddings"] is True
    gemma["tie_word_embeddings"] = None
    assert translate(gemma).tree["tied_embeddings"] is False
    del gemma["tie_word_embeddings"]
    assert translate(gemma).tree["tied_embeddings"] is True  # GemmaConfig's default
    glm = {**_raw("llama3-70b"), "model_type": "glm"}  # GlmConfig: attention_bias true
    glm.pop("attention_bias", None)
    assert translate(glm).tree["qkv_bias"] is True
    assert translate({**glm, "attention_bias": None}).tree["qkv_bias"] is False


def test_experts_without_a_top_k_and_no_class_default_are_refused() -> None:
    """DeepseekV2Config defaults num_experts_per_tok to None: no number to route by. Mixtral's
    class default is 2, read when the file leaves it out."""
    deepseek = {**_raw("deepseek-v3"), "model_type": "deepseek_v2"}
    del deepseek["num_experts_per_tok"], deepseek["num_nextn_predict_layers"]  # V3's alone
    with pytest.raises(HfConfigError, match='model_type "deepseek_v2" has no default'):
        translate(deepseek)
    # save_pretrained writes the class's None as null; a null is refused whatever the class
    # (Mixtral's default, 2, is for a key left out), naming the key the file has (review)
    with pytest.raises(HfConfigError, match=r"^num_experts_per_tok = null in .*, beside "):
        translate({**deepseek, "num_experts_per_tok": None})
    with pytest.raises(HfConfigError, match=r"^num_experts_per_tok = null in "):
        translate({**_raw("mixtral-8x7b"), "num_experts_per_tok": None})
    oss = {**_raw("mixtral-8x7b"), "experts_per_token": None}
    del oss["num_experts_per_tok"]
    with pytest.raises(HfConfigError, match=r"^experts_per_token = null in "):
        translate(oss)
    # a family with no experts at all is told to drop the keys, not to add a top-k (review)
    stray = {**_raw("llama3-70b"), "num_local_experts": 8}
    with pytest.raises(HfConfigError, match='model_type "llama" builds no mixture of experts'):
        translate(stray)
    with pytest.raises(HfConfigError, match=r"num_experts_per_tok = 2\.5 in .* non-negative"):
        translate({**_raw("mixtral-8x7b"), "num_experts_per_tok": 2.5})
    mixtral = _raw("mixtral-8x7b")
    del mixtral["num_experts_per_tok"]
    assert translate(mixtral).tree["experts"]["top_k"] == 2
    hand = {
        k: v for k, v in _raw("mixtral-8x7b").items() if k not in ("model_type", "architectures")
    }
    del hand["num_experts_per_tok"]
    with pytest.raises(HfConfigError, match="a file without model_type has no default"):
        translate(hand)


def test_every_integer_key_of_the_wrong_kind_is_reported_at_once() -> None:
    """A config.json with three bad counts names all three, not the first alone and the
    others a run each (an audit); they come with an unknown key's problem too."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    bad = {**config, "hidden_size": "a", "num_attention_heads": -1, "vocab_size": 1.5}
    with pytest.raises(HfConfigError) as caught:
        translate({**bad, "hidden_layers_typo": 80})
    messages = caught.value.messages
    assert len(messages) == 4 and "'hidden_layers_typo'" in messages[0]
    for shown in ('hidden_size = "a"', "num_attention_heads = -1", "vocab_size = 1.5"):
        assert any(m.startswith(shown) and "a positive integer" in m for m in messages), shown


def test_a_family_refusal_says_what_to_do_before_the_families() -> None:
    """Messages are cut at 400 characters; the list of 22 families came first and cut the
    advice off (a review): the advice comes first."""
    from budget.errors import Problem

    with pytest.raises(HfConfigError) as raised:
        translate({"model_type": "falcon", "hidden_size": 64}, "falcon/config.json")
    shown = str(Problem("p.yaml", 1, 1, "$.model.hf_config", str(raised.value)))
    assert "write the model's dimensions out instead" in shown
    # and the families after it, whole, beside a Hugging Face cache path (an audit: cut at
    # "kimi_k..." they hid olmo2 beside a refused olmoe)
    cache = (
        "'/home/user/.cache/huggingface/hub/models--allenai--OLMoE-1B-7B-0924/snapshots/"
        "0123456789abcdef0123456789abcdef01234567/config.json'"
    )
    with pytest.raises(HfConfigError) as raised:
        translate({"model_type": "olmoe", "hidden_size": 64}, cache)
    shown = str(Problem("p.yaml", 1, 1, "$.model.hf_config", str(raised.value)))
    assert shown.endswith(f"reads: {', '.join(sorted(FAMILIES))}")


def _cli_problems(tmp_path: Path, config: str) -> tuple[int, str, str, Path]:
    """`budget plan.yaml` on a plan whose model is `config` (the text of its config.json):
    the exit code, stdout, stderr and the config's path."""
    from typer.testing import CliRunner

    from budget.cli import app, route

    path = tmp_path / "config.json"
    path.write_text(config, encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: x\nmodel:\n  hf_config: config.json\nbatch: {seq: 8192, micro: 1, global: 8}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n"
        "parallel: {tp: 8}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, route([str(plan)]))
    return result.exit_code, result.stdout, result.stderr, path


def test_every_switch_and_activation_problem_is_reported_at_once(tmp_path: Path) -> None:
    """A bad activation and two switches that are not true or false: only
    tie_word_embeddings was reported, the others one run later each (audit)."""
    llama = _raw("llama3-70b")
    bad = {**llama, "hidden_act": "bogus", "tie_word_embeddings": "no", "attention_bias": "yes"}
    code, out, err, path = _cli_problems(tmp_path, json.dumps(bad))
    assert (code, out) == (2, "")
    at = f"{tmp_path / 'plan.yaml'}:3:14: error: $.model.hf_config: "
    shown = repr(str(path))  # quoted in every message, as the reader's own (a review)
    assert err.splitlines() == [
        f'{at}attention_bias = "yes" in {shown} is not true or false',
        f'{at}hidden_act = "bogus" in {shown} is not one of gelu, gelu_fast, gelu_new, '
        "gelu_pytorch_tanh, silu, swish, the gated MLPs budget prices; write the model's "
        "dimensions out for another",
        f'{at}tie_word_embeddings = "no" in {shown} is not true or false',
    ]


def test_what_the_json_reader_refuses_does_not_hide_the_other_problems(tmp_path: Path) -> None:
    """An unknown key, hidden_size twice and a NaN: only the NaN was reported, since the
    reader's hooks raised at their first find (audit). A refused value stands as null, and
    its key is not judged again (a too-large layer count is not also "not an integer")."""
    llama = _raw("llama3-70b")
    text = json.dumps({**llama, "foo": 1, "rope_theta": 1.5, "num_hidden_layers": 1})
    text = text.replace('"rope_theta": 1.5', '"rope_theta": NaN')
    text = text.replace('"hidden_size": 8192', '"hidden_size": 8192, "hidden_size": 4096')
    text = text.replace('"num_hidden_layers": 1', '"num_hidden_layers": 1' + "0" * 30)
    text = text.replace("}", ', "mlp_bias": "no", "hidden_dropout": Infinity}')
    code, out, err, path = _cli_problems(tmp_path, text)
    assert (code, out) == (2, "")
    at = f"{tmp_path / 'plan.yaml'}:3:14: error: $.model.hf_config: "
    shown = repr(str(path))
    assert err.splitlines() == [  # sorted, as every file's problems are; a key twice, so
        # no refused value is named by its key (`_Reading.said`)
        f"{at}{shown} has 100000000000000000000..., too large (integers must be below 2**63)",
        f"{at}{shown} has Infinity, not a finite number",
        f"{at}{shown} has NaN, not a finite number",
        f"{at}{shown} has key 'foo' that budget does not understand; if it builds nothing (a "
        "tag, a kernel setting), remove it, or else write the model's dimensions out",
        f"{at}{shown} has key 'hidden_size' twice in one object",
        f'{at}mlp_bias = "no" in {shown} is not true or false',
    ]
    with pytest.raises(HfConfigError) as raised:  # the reader's, as it met them, then the rest
        read_hf_config(path)
    assert [m.removeprefix(f"{shown} has ") for m in raised.value.messages] == [
        "100000000000000000000..., too large (integers must be below 2**63)",  # layers
        "NaN, not a finite number",  # rope_theta
        "Infinity, not a finite number",  # hidden_dropout, the last value
        "key 'hidden_size' twice in one object",  # said as the object closes
        "key 'foo' that budget does not understand; if it builds nothing (a tag, "
        "a kernel setting), remove it, or else write the model's dimensions out",
        f'mlp_bias = "no" in {shown} is not true or false',
    ]


def test_a_refused_value_a_later_key_replaced_is_said_without_a_key(tmp_path: Path) -> None:
    """A NaN under a key written twice is gone from the object the reader returns, so the
    values refused and the keys holding one no longer pair: each is said as written, none
    under a key that may not be its own."""
    path = tmp_path / "config.json"
    path.write_text('{"rope_theta": NaN, "rope_theta": 1.0, "hidden_size": Infinity}', "utf-8")
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    shown = repr(str(path))
    assert raised.value.messages[:3] == (
        f"{shown} has NaN, not a finite number",
        f"{shown} has Infinity, not a finite number",
        f"{shown} has key 'rope_theta' twice in one object",  # said as the object closes
    )
    # as many values refused as keys holding one, but the object keeps a key where it first
    # stood: NaN and Infinity were each named under the other's key (a review)
    path.write_text('{"rope_theta": 1, "max_position_embeddings": NaN, "rope_theta": Infinity}')
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    assert raised.value.messages[:2] == (
        f"{shown} has NaN, not a finite number",
        f"{shown} has Infinity, not a finite number",
    )


def test_refused_values_deep_in_lists_and_objects_stand_as_null(tmp_path: Path) -> None:
    """What the reader refuses stands as null wherever it is, so that no later message
    quotes a placeholder, and the other keys are still judged."""
    path = tmp_path / "config.json"
    path.write_text(
        '{"mlp_only_layers": [NaN, {"a": -Infinity}], "num_hidden_layers": "x", '
        '"quantization_config": {"weights": [1' + "0" * 40 + "]}}",
        encoding="utf-8",
    )
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    shown = repr(str(path))
    assert raised.value.messages == (  # each under its key: the reader need not search
        f"mlp_only_layers[0] = NaN in {shown} is not a finite number",
        f"mlp_only_layers[1].a = -Infinity in {shown} is not a finite number",
        f"quantization_config.weights[0] = 100000000000000000000... in {shown} is too large "
        "(integers must be below 2**63)",
        f'num_hidden_layers = "x" in {shown} is not a positive integer',
        f"{shown} lacks hidden_size, num_attention_heads, vocab_size",  # said together
    )


def test_a_zero_size_is_said_beside_a_negative_one(tmp_path: Path) -> None:
    """A model of no layers or no heads is none: an audit (m366) found a file's 0 layers said
    only once its negative hidden size was mended, a second run for one file's problems."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text("utf-8"))
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({**config, "hidden_size": -5, "num_hidden_layers": 0, "num_attention_heads": 0}),
        encoding="utf-8",
    )
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    shown = repr(str(path))
    assert set(raised.value.messages) == {
        f"{key} = {value} in {shown} is not a positive integer"
        for key, value in (
            ("hidden_size", -5),
            ("num_hidden_layers", 0),
            ("num_attention_heads", 0),
        )
    }


def test_a_named_family_builds_rmsnorm_whatever_epsilon_key_its_file_has() -> None:
    """Every class budget reads builds RMSNorm: a Mistral file with a layer_norm_eps added
    read as LayerNorm (a scale and a bias a norm, +266,240 parameters: an audit). A file
    with no model_type, written by hand, still says LayerNorm by naming its epsilon so."""
    config = json.loads((DATA / "hf" / "mistral-7b-v0.3" / "config.json").read_text("utf-8"))
    assert translate({**config, "layer_norm_eps": 1e-5}).tree["norm"] == "rmsnorm"
    assert translate(config).tree["norm"] == "rmsnorm"
    by_hand = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    assert translate({**by_hand, "layer_norm_eps": 1e-5}).tree["norm"] == "layernorm"


def test_the_readmes_active_parameters_of_gpt_oss_count_its_embedding() -> None:
    """The README says the report's active parameters count the embeddings, as Mistral's
    12.9B for Mixtral 8x7B does, and gpt-oss-120b's read 5.71B where OpenAI's card, which
    leaves the input embedding (201,088 × 2,880) out, says 5.13B."""
    from budget.layers import active_params
    from budget.plan.load import load_plan_data

    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text("utf-8").split())
    text = (
        "model: {preset: gpt-oss-120b}\nbatch: {seq: 4096, micro: 1, global: 8}\n"
        "parallel: {tp: 1, pp: 1, dp: 8}\ndevice: {preset: h100-sxm}\n"
        "topology: {preset: dgx-h100, nodes: 1}\n"
    )
    active = active_params(load_plan_data(text.encode(), "gpt-oss.yaml"))
    assert f"(budget: {active / 1e9:.2f}B)" in readme
    assert round((active - 201_088 * 2_880) / 1e9, 2) == 5.13


def test_a_text_config_saved_alone_takes_its_class_default_heads(tmp_path: Path) -> None:
    """Gemma 3 4B's released text_config (google/gemma-3-4b-it) lists no num_attention_heads,
    which save_pretrained drops as Gemma3TextConfig's default, 8: saved alone, as the
    refusal of the whole file advises, it was refused as lacking it (an audit). Its language
    model by hand: 34 layers of q 2560 x 2048, k and v 2560 x 1024, o 2048 x 2560 (head_dim
    256, 8 heads, 4 kv heads), a 3 x 2560 x 10240 GeGLU MLP, 4 norms of 2560 and q and k
    norms of 256; 262,208 x 2560 tied embeddings and a final norm: 3,880,263,168."""
    text_config = {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    }
    tree = translate(text_config).tree
    assert (tree["heads"], tree["kv_heads"], tree["head_dim"]) == (8, 4, 256)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(text_config), encoding="utf-8")
    plan = _plan_at(path)
    layer = 2560 * 2048 + 2 * 2560 * 1024 + 2048 * 2560 + 3 * 2560 * 10240 + 4 * 2560 + 2 * 256
    assert params_total(plan) == 34 * layer + 262_208 * 2560 + 2560 == 3_880_263_168


def test_a_task_head_of_a_known_class_reads_as_its_family() -> None:
    """`LlamaForSequenceClassification` (any `For...` head) is Llama's class: read as Llama
    without model_type, and Mistral's told to name its model_type (a review: refused as a
    class of no family, beside a list naming llama)."""
    config = {k: v for k, v in _raw("llama3-70b").items() if k != "model_type"}
    read = translate({**config, "architectures": ["LlamaForSequenceClassification"]}).tree
    assert read == translate(config).tree
    with pytest.raises(HfConfigError, match=r'are mistral\'s: add "model_type": "mistral"'):
        translate({**config, "architectures": ["MistralForTokenClassification"]})


@pytest.mark.parametrize(
    ("name", "key", "value", "readers"),
    [
        # Mixtral's experts are intermediate_size wide: read as 1,024, Mixtral-8x22B came to
        # 13.8 billion parameters for 140.6 (an audit)
        (
            "mixtral-8x7b",
            "moe_intermediate_size",
            1024,
            "deepseek_v2, deepseek_v3, glm4_moe, kimi_k2, qwen2_moe, qwen3_moe",
        ),
        ("mixtral-8x7b", "decoder_sparse_step", 2, "qwen2_moe, qwen3_moe"),
        ("qwen3-30b-a3b", "shared_expert_intermediate_size", 4096, "qwen2_moe"),
        ("qwen3-30b-a3b", "n_shared_experts", 1, "deepseek_v2, deepseek_v3, glm4_moe, kimi_k2"),
        (
            "qwen1.5-moe-a2.7b",
            "first_k_dense_replace",
            3,
            "deepseek_v2, deepseek_v3, glm4_moe, kimi_k2",
        ),
        ("llama3-70b", "kv_lora_rank", 512, "deepseek_v2, deepseek_v3, kimi_k2"),
        ("llama3-70b", "num_nextn_predict_layers", 1, "deepseek_v3, glm4_moe, kimi_k2"),
        ("llama3-70b", "bias", True, "internlm2"),
        ("llama3-70b", "use_qk_norm", True, "glm4_moe"),
        ("qwen3-8b", "final_logit_softcapping", 30.0, "gemma2, gemma3_text"),
    ],
)
def test_keys_another_family_reads_are_refused(
    name: str, key: str, value: object, readers: str
) -> None:
    """A key only other model classes read was read whatever model_type said, where
    transformers builds the model without it (an audit, on real files with one key added:
    Llama read as latent attention, Qwen3-MoE given Qwen2-MoE's shared expert). Set, it is
    refused, naming the classes that read it; null it changes nothing and is left alone."""
    config = _raw(name)
    with pytest.raises(HfConfigError) as refused:
        translate({**config, key: value})
    family = config["model_type"]
    assert (
        f'{key} = {json.dumps(value)} in config.json: model_type "{family}"\'s class does not '
        in str(refused.value)
    )
    said = "class reads it" if "," not in readers else "classes read it"
    assert f"(the {readers} {said})" in str(refused.value)
    assert translate({**config, key: None}).tree == translate(config).tree


def test_a_qk_norm_key_the_class_builds_anyway_is_read() -> None:
    """Qwen3's and Gemma 3's attention builds per-head q and k norms whatever the file says,
    and Qwen3-Coder-480B's files say so, use_qk_norm true beside model_type qwen3_moe: read
    as the norms it builds (an audit: the release was refused as if transformers built it
    without them). Where the class builds none (Llama) or full-width ones (OLMo 2), the key
    still names what the model does not have, and is refused."""
    for name in ("qwen3-30b-a3b", "qwen3-8b", "gemma-3-1b"):
        config = _raw(name)
        config = config.get("text_config", config)
        read = translate({**config, "use_qk_norm": True}).tree
        assert read == translate(config).tree
        assert read["qk_norm"] == "per_head"
    for name in ("llama3-70b", "olmo-2-7b-instruct"):
        with pytest.raises(HfConfigError, match=r"use_qk_norm = true in config\.json"):
            translate({**_raw(name), "use_qk_norm": True})


def test_an_expert_count_is_one_count_and_not_zero() -> None:
    """Its names are read as one another (transformers 5 maps num_experts to Mixtral's
    num_local_experts), so two of them must agree: Qwen2-MoE's num_experts 60 beside a
    stray num_local_experts 8 read as 8 experts. A router over none is refused where the
    class builds one (Mixtral with num_local_experts 0 read as a dense model), while
    Qwen-MoE's num_experts 0 is its dense layers, as Qwen2MoeDecoderLayer builds them."""
    qwen = _raw("qwen1.5-moe-a2.7b")
    assert qwen["num_experts"] == 60
    with pytest.raises(HfConfigError, match="sets num_experts = 60 and num_local_experts = 8, "):
        translate({**qwen, "num_local_experts": 8})
    assert translate({**qwen, "num_local_experts": 60}).tree == translate(qwen).tree
    mixtral = _raw("mixtral-8x7b")
    for zero in (0, 0.0, False):  # a review: 0.0 and false were read as dense again
        said = rf'^num_local_experts = {json.dumps(zero)} in .*: model_type "mixtral"'
        with pytest.raises(HfConfigError, match=said):
            translate({**mixtral, "num_local_experts": zero})
    dense = translate({**qwen, "num_experts": 0}).tree
    assert "experts" not in dense and dense["ffn"] == qwen["intermediate_size"]
    # num_experts is Mixtral's count too, and zero there too (a review)
    by_name = {k: v for k, v in mixtral.items() if k != "num_local_experts"}
    assert translate({**by_name, "num_experts": 8}).tree == translate(mixtral).tree
    with pytest.raises(HfConfigError, match=r'^num_experts = 0 in .*: model_type "mixtral"'):
        translate({**by_name, "num_experts": 0})
    # a file written by hand is read as a Llama that may have experts: its names agree too
    by_hand = {k: v for k, v in qwen.items() if k not in ("model_type", "architectures")}
    with pytest.raises(HfConfigError, match="sets num_experts = 60 and num_local_experts = 8, "):
        translate({**by_hand, "num_local_experts": 8})


# (file, key, kind): each class builds its layers from the key and takes no None for it
# (nn.Linear(hidden, None), range(None), i % None; hf_config's `_NO_NULL` names the classes)
_NO_NULL_CASES = [
    ("deepseek-v3", "moe_intermediate_size", "non-negative"),  # was 5.9 T parameters
    ("deepseek-v3", "first_k_dense_replace", "non-negative"),  # was 61 MoE layers
    ("deepseek-v3", "kv_lora_rank", "non-negative"),  # was no MLA
    ("deepseek-v3", "qk_rope_head_dim", "non-negative"),
    ("deepseek-v3", "n_routed_experts", "non-negative"),  # was a dense model
    ("deepseek-v3", "n_shared_experts", "non-negative"),  # DeepseekV3MoE: moe × n_shared
    ("deepseek-v3", "moe_layer_freq", "positive"),
    ("llama3-70b", "intermediate_size", "non-negative"),  # was ffn 22016, absent 11008
    ("qwen1.5-moe-a2.7b", "moe_intermediate_size", "non-negative"),  # was 51.7 B
    ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size", "non-negative"),  # was none
    ("qwen1.5-moe-a2.7b", "num_experts", "non-negative"),
    ("qwen1.5-moe-a2.7b", "decoder_sparse_step", "positive"),
    ("mixtral-8x7b", "num_local_experts", "non-negative"),
    ("gemma-2-9b", "head_dim", "non-negative"),  # Gemma2Config's 256, not hidden / heads
    # Qwen3MoeAttention's getattr(config, "head_dim", ...) gives the null back (a review:
    # read as 2048 / 32 = 64 where the file's is 128); Glm4MoeAttention's the same
    ("qwen3-30b-a3b", "head_dim", "non-negative"),
    ("glm-4.5-air", "head_dim", "non-negative"),
    ("qwen3-8b", "max_window_layers", "non-negative"),
    ("gemma-3-1b", "sliding_window_pattern", "positive"),
]


@pytest.mark.parametrize(("name", "key", "kind"), _NO_NULL_CASES)
def test_a_null_size_the_class_takes_no_none_for_is_refused_naming_it(
    tmp_path: Path, name: str, key: str, kind: str
) -> None:
    """A null is not the key left out: transformers keeps the None and cannot build the
    model, where budget read the plan's or another default, silently (an audit: DeepSeek-V3
    with a null moe_intermediate_size read its experts 18,432 wide, 5.9 trillion
    parameters). Refused as a null num_hidden_layers is, at the hf_config node, exit 2."""
    code, out, err, path = _cli_problems(tmp_path, json.dumps({**_raw(name), key: None}))
    at = f"{tmp_path / 'plan.yaml'}:3:14: error: $.model.hf_config: "
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"{at}{key} = null in {str(path)!r} is not a {kind} integer"]
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    assert raised.value.messages == (f"{key} = null in {str(path)!r} is not a {kind} integer",)


def test_a_null_the_class_gives_a_meaning_is_read_so_and_the_files_keep_their_counts() -> None:
    """Where the class reads None as something, a null reads so: LlamaConfig's head_dim,
    hidden / heads, and num_key_value_heads, the heads; DeepSeek's q_lora_rank, queries
    not compressed; MTP modules, none; Qwen2MoeConfig's mlp_only_layers, []; DeepseekV2Moe's
    and DeepSeek's own code's n_shared_experts, no shared expert, and the latter's
    n_routed_experts (Kimi K2's), dense layers; rope_scaling, none. The released files keep
    their counts (transformers 5.24 on the meta device, as the tests above)."""
    counts = {
        "llama3-70b": 70_553_706_496,
        "deepseek-v3": 671_026_404_352,
        "qwen1.5-moe-a2.7b": 14_315_784_192,
        "mixtral-8x7b": 46_702_792_704,  # its sliding_window is null: no window
    }
    for name, count in counts.items():
        assert params_total(_plan(name, seq=512)) == count
    llama = _raw("llama3-70b")
    assert llama["rope_scaling"] is None
    tree = translate({**llama, "head_dim": None}).tree
    assert tree == translate(llama).tree  # 8192 / 64 = 128, as the file says
    tree = translate({**llama, "num_key_value_heads": None}).tree
    assert "kv_heads" not in tree  # the plan's default: the heads
    deepseek = _raw("deepseek-v3")
    tree = translate({**deepseek, "q_lora_rank": None, "num_nextn_predict_layers": None}).tree
    assert tree["mla"]["q_rank"] == 0 and "mtp_layers" not in tree
    qwen = _raw("qwen1.5-moe-a2.7b")
    assert translate({**qwen, "mlp_only_layers": None}).tree == translate(qwen).tree
    v2 = {**deepseek, "model_type": "deepseek_v2", "n_shared_experts": None}
    del v2["num_nextn_predict_layers"]  # V3's alone
    assert "shared_ffn" not in translate(v2).tree["experts"]
    kimi = {**_raw("kimi-k2-instruct"), "n_routed_experts": None}
    assert "experts" not in translate(kimi).tree


def test_a_null_in_a_file_without_model_type_reads_as_left_out() -> None:
    """A file written by hand names no class whose None could mean anything: its null reads
    as the key left out (the plan language's default), as it did; its four sizes are still
    required, null or not."""
    by_hand = {k: v for k, v in _raw("llama3-70b").items() if k != "architectures"}
    del by_hand["model_type"]
    absent = {k: v for k, v in by_hand.items() if k != "intermediate_size"}
    assert translate({**by_hand, "intermediate_size": None}).tree == translate(absent).tree
    with pytest.raises(HfConfigError, match=r"^vocab_size = null in .* a positive integer$"):
        translate({**by_hand, "vocab_size": None})


@pytest.mark.parametrize(
    ("change", "keys"),
    [
        # each printed alone before, the second one run later (audit)
        (
            {"num_hidden_layers": None, "num_attention_heads": None},
            ["num_attention_heads = null", "num_hidden_layers = null"],
        ),
        (
            {"hidden_size": "x", "num_hidden_layers": None},
            ['hidden_size = "x"', "num_hidden_layers = null"],
        ),
        (
            {"intermediate_size": None, "mlp_bias": "no"},
            ["intermediate_size = null", 'mlp_bias = "no"'],
        ),
    ],
)
def test_every_null_and_wrong_kind_is_listed_in_one_run(
    tmp_path: Path, change: dict[str, object], keys: list[str]
) -> None:
    code, out, err, path = _cli_problems(tmp_path, json.dumps({**_raw("llama3-70b"), **change}))
    at = f"{tmp_path / 'plan.yaml'}:3:14: error: $.model.hf_config: "
    shown = repr(str(path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"{at}{key} in {shown} is not "
        + ("true or false" if key.startswith("mlp_bias") else _integer_kind(key))
        for key in keys
    ]


def _integer_kind(key: str) -> str:
    """How a bad value of `key` is named: the model's four sizes are positive (a model of
    none is no model), the other counts non-negative."""
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    return "a positive integer" if key.split(" ")[0] in sizes else "a non-negative integer"


def test_a_null_top_k_is_listed_with_the_other_problems(tmp_path: Path) -> None:
    """Mixtral's num_experts_per_tok null beside a null intermediate_size: the top-k was
    refused only once every other problem was mended, in `_translate`."""
    config = {**_raw("mixtral-8x7b"), "num_experts_per_tok": None, "intermediate_size": None}
    with pytest.raises(HfConfigError) as raised:
        translate(config, "c.json")
    assert raised.value.messages == (
        "intermediate_size = null in c.json is not a non-negative integer",
        "num_experts_per_tok = null in c.json, beside num_local_experts: give the number of "
        "experts each token is routed to",
    )


@pytest.mark.parametrize("value", ["fp8", ["fp8"], 8])
def test_a_quantization_config_that_is_not_an_object_is_refused_as_such(
    tmp_path: Path, value: object
) -> None:
    """``"quantization_config": "fp8"`` read as an object with no quant_method: "quant_method =
    null ... a format budget does not price" (an audit). It is said not to be an object."""
    code, out, err, path = _cli_problems(
        tmp_path, json.dumps({**_raw("llama3-70b"), "quantization_config": value})
    )
    at = f"{tmp_path / 'plan.yaml'}:3:14: error: $.model.hf_config: "
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"{at}quantization_config = {json.dumps(value)} in {str(path)!r} is not an object; "
        'transformers writes a mapping such as {"quant_method": "fp8", ...}: give that, or '
        "delete the key to budget the weights in precision.params' format"
    ]


def _total(tmp_path: Path, config: dict[str, object]) -> int:
    """The parameter count budget reads from `config`, written as a file."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return params_total(_plan_at(path))


def test_qwen2_moe_s_q_k_and_v_biases_follow_its_qkv_bias(tmp_path: Path) -> None:
    """Qwen2MoeAttention builds q_proj, k_proj and v_proj with ``bias=config.qkv_bias``, true
    by default (transformers' modular_qwen2_moe.py at 8fb1742): a file transformers re-saves
    carries ``"qkv_bias": true``, which was refused as a key the class does not read, and
    false was ignored (an audit). Qwen1.5-MoE-A2.7B: 24 layers of 2,048 + 2,048 + 2,048."""
    raw = _raw("qwen1.5-moe-a2.7b")
    released = _total(tmp_path, raw)
    assert released == 14_315_784_192
    assert _total(tmp_path, {**raw, "qkv_bias": True}) == released
    assert _total(tmp_path, {**raw, "qkv_bias": False}) == released - 24 * 3 * 2048


@pytest.mark.parametrize(
    ("name", "key", "built"),
    [
        ("mistral-7b-v0.3", "attention_bias", "MistralAttention builds no bias"),
        ("mistral-7b-v0.3", "mlp_bias", "MistralMLP builds no bias"),
        ("mixtral-8x7b", "mlp_bias", "MixtralExperts build no bias"),
        ("qwen3-30b-a3b", "mlp_bias", "its MLPs and experts, Qwen2-MoE's, build no bias"),
        ("qwen2.5-0.5b", "attention_bias", "Qwen2Attention builds q, k and v biases and no other"),
        ("deepseek-v3", "mlp_bias", "DeepseekV3MLP, Qwen2-MoE's, builds no bias"),
        ("qwen2.5-0.5b", "mlp_bias", "Qwen2MLP builds no bias"),  # a review: +254,976
        ("qwen3-8b", "mlp_bias", "Qwen3MLP, Gemma's, builds no bias"),
        ("gemma-2b", "mlp_bias", "GemmaMLP builds no bias"),
        ("gemma-2-9b", "mlp_bias", "Gemma2MLP, Gemma's, builds no bias"),  # +1,354,752
        ("gemma-3-1b", "mlp_bias", "Gemma3MLP, Gemma's, builds no bias"),
        ("phi-4-mini-instruct", "attention_bias", "Phi3Attention builds no bias"),
        ("phi-4-mini-instruct", "mlp_bias", "Phi3MLP builds no bias"),
        # an audit: each read +2 x (gate + up + down) biases a layer
        ("glm-4.5-air", "mlp_bias", "Glm4MoeMLP, DeepSeek-V3's, builds no bias"),
        ("kimi-k2-instruct", "mlp_bias", "its MLPs, DeepSeek-V3's, build no bias"),
        ("olmo-2-7b-instruct", "mlp_bias", "Olmo2MLP builds no bias"),
    ],
)
def test_a_bias_its_class_fixes_is_refused_not_counted(name: str, key: str, built: str) -> None:
    """Classes that fix their projections' biases build none for attention_bias or mlp_bias
    (transformers at 008e574): Mistral 7B with attention_bias read +327,680 parameters and
    Qwen3-30B-A3B with mlp_bias +22.0M (an audit). Set false, the key says what is built."""
    with pytest.raises(HfConfigError, match=re.escape(f"does not read it ({built})")):
        translate({**_raw(name), key: True})
    translate({**_raw(name), key: False})
    with pytest.raises(HfConfigError) as raised:  # a value of the wrong kind: said once, as that
        translate({**_raw(name), key: "false"})
    assert [m for m in raised.value.messages if key in m] == [
        f'{key} = "false" in config.json is not true or false'
    ]


_SMALL = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


@pytest.mark.parametrize(
    ("family", "key", "built"),
    [
        ("glm", "mlp_bias", "GlmMLP builds no bias"),
        ("glm4", "mlp_bias", "Glm4MLP, GLM's, builds no bias"),
        ("olmo3", "mlp_bias", "its MLP, OLMo 2's, builds no bias"),
        ("internlm2", "mlp_bias", "InternLM2MLP builds no bias"),
        ("deepseek_v2", "mlp_bias", "DeepseekV2MLP builds no bias"),
        ("internlm2", "attention_bias", "InternLM2Attention's biases follow bias"),
    ],
)
def test_a_small_file_of_a_class_that_fixes_a_bias_is_refused(
    family: str, key: str, built: str
) -> None:
    """The families no released file in tests/data stands for, each class's projections
    read in transformers (InternLM2's in its own modeling_internlm2.py): a file of 256
    hidden, 2 layers and 512 of MLP read +2,560 MLP biases (an audit), InternLM2's
    attention_bias +1,536 attention biases where only its bias key builds them."""
    config = {**_SMALL, "model_type": family}
    if family == "deepseek_v2":
        config |= {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
    with pytest.raises(HfConfigError, match=re.escape(f"does not read it ({built})")):
        translate({**config, key: True})
    translate({**config, key: False})


def test_internlm2_derives_its_head_dim() -> None:
    """InternLM2Attention takes hidden / heads and refuses hidden sizes the heads do not
    divide, never reading head_dim: a file's head_dim 32 for 64 read half the attention's
    weights (an audit). The derived one is accepted, and bias builds wqkv's and wo's."""
    config = {**_SMALL, "model_type": "internlm2"}
    with pytest.raises(HfConfigError, match=re.escape("head_dim = 32 in config.json: model_type")):
        translate({**config, "head_dim": 32})
    assert translate({**config, "head_dim": 64}).tree["head_dim"] == 64
    with pytest.raises(
        HfConfigError, match=re.escape("hidden_size = 250 in config.json is not divisible")
    ):
        translate({**config, "hidden_size": 250})
    assert translate({**config, "bias": True}).tree["bias"] is True


def test_moe_layer_freq_other_than_one_is_refused_for_deepseek() -> None:
    """DeepSeek's own modeling code makes every moe_layer_freq-th layer MoE; transformers'
    DeepseekV2/V3 classes ignore the key (``layer_idx >= config.first_k_dense_replace``). At
    2 one builds 13 MoE layers of DeepSeek-V2-Lite's 27, the other 26 (an audit): budget
    reads neither. Every released file sets 1, which is read."""
    raw = _raw("deepseek-v3")
    assert raw["moe_layer_freq"] == 1 and translate(raw)
    with pytest.raises(
        HfConfigError, match=re.escape("moe_layer_freq = 2 in config.json: DeepSeek's own")
    ):
        translate({**raw, "moe_layer_freq": 2})


def test_layer_types_cannot_make_a_family_slide_that_never_does() -> None:
    """Llama's attention never slides in transformers (LlamaConfig has no sliding_window):
    a file with sliding_attention in layer_types read 40 sliding layers, where
    sliding_window alone is refused (an audit). Mistral's attention slides every layer
    whatever layer_types says, so a mix is refused; one kind throughout is read."""
    llama = {**_raw("llama3-70b"), "sliding_window": 4096}
    kinds = ["sliding_attention", "full_attention"] * 40
    with pytest.raises(HfConfigError, match='model_type "llama" builds no sliding-window'):
        translate({**llama, "layer_types": kinds})
    assert translate({**llama, "sliding_window": None, "layer_types": ["full_attention"] * 80})
    mistral = _raw("mistral-7b-v0.3")
    with pytest.raises(HfConfigError, match="MistralAttention"):
        translate({**mistral, "sliding_window": 4096, "layer_types": kinds[:32]})
    with pytest.raises(HfConfigError, match="MistralAttention"):  # every layer full: a review
        translate({**mistral, "sliding_window": 4096, "layer_types": ["full_attention"] * 32})
    assert (
        "sliding_window"
        not in translate(
            {**mistral, "sliding_window": None, "layer_types": ["full_attention"] * 32}
        ).tree
    )
    # no window, whatever layer_types says: MistralModel masks causally where sliding_window
    # is None (a review: refused as "null is not a positive number of tokens")
    for kinds_given in (["sliding_attention"] * 32, kinds[:32]):
        config = {**mistral, "sliding_window": None, "layer_types": kinds_given}
        assert "sliding_window" not in translate(config).tree
    whole = translate(
        {**mistral, "sliding_window": 4096, "layer_types": ["sliding_attention"] * 32}
    )
    assert whole.tree["sliding_window"] == {"size": 4096}


def test_deepseek_v2_s_class_vocabulary_is_transformers_default() -> None:
    """DeepseekV2Config's vocab_size is 32,000 (transformers at 008e574); a file without
    the key read 102,400, 288M parameters more for DeepSeek-V2-Lite's width (an audit)."""
    from budget.plan.hf_config import CLASS_DEFAULTS

    assert CLASS_DEFAULTS["deepseek_v2"]["vocab_size"] == 32000


def test_a_config_of_many_problems_shows_the_first_in_order_and_counts_the_rest(tmp_path):
    """A config.json with 1,000 NaNs in one list: each is a problem at the plan's hf_config
    key, and sorted by text x[1000] had come before x[2], so "the first 200" were not the
    first; the problems of one config are now capped at what stderr shows, the rest
    counted (an audit: 260,000 of them took 3 s)."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    # and a key whose text sorts after the count's "…" (a review: it was printed below it)
    text = json.dumps(config)[:-1] + ', "€": NaN, "x": [' + ", ".join(["NaN"] * 1000) + "]}"
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: {hf_config: config.json}\nbatch: {seq: 2048, micro: 1, global: 8}\n"
        "parallel: {tp: 8}\ndevice: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, route(["validate", str(plan)]))
    lines = result.stderr.splitlines()
    assert (result.exit_code, result.stdout, len(lines)) == (2, "", 200)
    named = [line.split("$.model.hf_config: ")[1].split(" = ")[0] for line in lines]
    listed = [n for n in named if n.startswith("x[")]
    assert listed == [f"x[{i}]" for i in range(len(listed))] and len(listed) >= 190
    # 1,002 in all: x's 1,000 NaNs, €'s, and one naming both keys, which no class reads;
    # 199 of them shown
    assert any(" € = NaN" in line for line in lines)
    more = 1000 + 1 + 1 - 199
    config = str(tmp_path / "config.json")
    assert lines[-1].endswith(f"…and {more:,} more problems in {config!r} than the 199 above")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"name": "a\x00b"}', "is not JSON: Invalid control character at line 1 column 12"),
        ('{"name": "ab', "is not JSON: Unterminated string starting at line 1 column 10"),
    ],
)
def test_a_json_error_says_where_once(tmp_path: Path, text: str, said: str) -> None:
    """Some of the JSON scanner's messages end in "at" already, before its own position
    (an audit: "Invalid control character at at line 17 column 21")."""
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(HfConfigError) as raised:
        read_hf_config(path)
    assert said in str(raised.value) and " at at " not in str(raised.value)


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-30b-a3b", "glm-4.5-air"])
def test_an_expert_width_of_0_is_refused_not_read_as_the_dense_width(
    tmp_path: Path, name: str
) -> None:
    """moe_intermediate_size 0 builds experts of no width in transformers, which takes the
    dense intermediate_size only for None; read as absent, the experts took the dense width
    (an audit, m396: DeepSeek-V3 at 5,922,731,219,968 parameters, exit 0). Refused as the
    model's own expert width, exit 2."""
    code, out, err, path = _cli_problems(
        tmp_path, json.dumps({**_raw(name), "moe_intermediate_size": 0})
    )
    assert (code, out) == (2, "")
    assert f"{str(path)!r} gives model.experts.ffn: 0 is less than the minimum of 1" in err


def test_a_layer_count_past_the_maximum_is_refused_before_an_expert_pattern_is_built(
    tmp_path: Path,
) -> None:
    """Qwen3-MoE's decoder_sparse_step makes a pattern of MoE layers, one entry a layer:
    num_hidden_layers 10^12 in a file under 1 KB built that list until it ran out of
    memory (an audit, m396: 10^7 layers ran past 20 s). Refused as model.layers, at once."""
    from tests.guards import refused_in_time

    config = {**_raw("qwen3-30b-a3b"), "num_hidden_layers": 10**12, "decoder_sparse_step": 2}
    with refused_in_time():
        code, out, err, _ = _cli_problems(tmp_path, json.dumps(config))
    assert (code, out) == (2, "")
    assert "gives model.layers: 1000000000000 is greater than the maximum of 4096" in err


def test_an_unknown_key_is_said_beside_what_the_rest_of_the_file_breaks(tmp_path: Path) -> None:
    """A key budget does not understand, and an intermediate_size of 0 the model refuses:
    both in one run, as a plan that writes them out has them (an audit, m396: the second
    came only once the first was removed)."""
    config = {**_raw("llama3-70b"), "intermediate_size": 0, "hiden": 3}
    code, out, err, path = _cli_problems(tmp_path, json.dumps(config))
    assert (code, out) == (2, "")
    assert f"{str(path)!r} gives model.ffn: 0 is less than the minimum of 1" in err
    assert "has key 'hiden' that budget does not understand" in err
    assert len(err.splitlines()) == 2


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("rms_norm_eps", -1, "number"),
        ("rms_norm_eps", "x", "number"),
        ("max_position_embeddings", -5, "integer"),
        ("max_position_embeddings", [1, 2], "integer"),
        ("max_position_embeddings", 4096.5, "integer"),
    ],
)
def test_a_key_read_but_priced_by_no_value_must_still_be_one_the_class_takes(
    key: str, value: object, kind: str
) -> None:
    """The norm's epsilon and the context length price nothing here, but a file whose
    values the class would not take is no model: refused naming the key (an audit, m396:
    rms_norm_eps -1 and max_position_embeddings [1, 2] were read, exit 0). The released
    files' values pass."""
    raw = _raw("qwen3-8b")
    with pytest.raises(HfConfigError) as raised:
        translate({**raw, key: value})
    assert raised.value.messages == (
        f"{key} = {json.dumps(value)} in config.json is not a positive {kind}",
    )
    for name in sorted(p.name for p in (DATA / "hf").iterdir()):
        translate(_raw(name))


def test_a_number_is_quoted_as_the_file_wrote_it(tmp_path: Path) -> None:
    """An audit, m495: num_attention_heads = 8.000000000000001 was told "8.000000000000002
    is not a positive integer", the float JSON reads, as plans were before (2f7e4c2); the
    file's text now (`hf_config.Written`), and a number that prints as written unchanged."""
    config = json.loads((DATA / "hf" / "llama3-70b" / "config.json").read_text())
    text = json.dumps(config).replace(
        '"num_attention_heads": 64', '"num_attention_heads": 8.000000000000001'
    )
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(HfConfigError) as refused:
        read_hf_config(path)
    assert "num_attention_heads = 8.000000000000001 in " in str(refused.value)
    path.write_text(text.replace("8.000000000000001", "64.5"), encoding="utf-8")
    with pytest.raises(HfConfigError) as half:
        read_hf_config(path)
    assert "num_attention_heads = 64.5 in " in str(half.value)
    # the length and epsilon checks quote it so too (review m497: 8192.0 for 8.192e3)
    path.write_text(
        json.dumps(config).replace(
            '"max_position_embeddings": 8192', '"max_position_embeddings": 8.192e3'
        ),
        encoding="utf-8",
    )
    with pytest.raises(HfConfigError) as length:
        read_hf_config(path)
    assert "max_position_embeddings = 8.192e3 in " in str(length.value)
    from budget.plan.hf_config import Written, _dumps

    assert _dumps([Written(8.000000000000002, "8.000000000000001"), 2]) == "[8.000000000000001, 2]"
    assert _dumps({"a": [1.5, None]}) == json.dumps({"a": [1.5, None]})
    # a copy or a pickle keeps the text (review m497: float's own arguments refused)
    import copy
    import pickle

    from budget.plan.hf_config import Written

    for made in (
        copy.deepcopy(Written(1e-5, "1e-5")),
        pickle.loads(pickle.dumps(Written(1e-5, "1e-5"))),
    ):
        assert (made, made.text) == (1e-5, "1e-5")


# transformers' PretrainedConfig defaults, which a config.json saved with every attribute
# written out carries beside the model's own keys (configuration_utils.py)
_FULL_DUMP: dict[str, object] = {
    "add_cross_attention": False,
    "bad_words_ids": None,
    "begin_suppress_tokens": None,
    "chunk_size_feed_forward": 0,
    "cross_attention_hidden_size": None,
    "decoder_start_token_id": None,
    "diversity_penalty": 0.0,
    "do_sample": False,
    "early_stopping": False,
    "encoder_no_repeat_ngram_size": 0,
    "exponential_decay_length_penalty": None,
    "finetuning_task": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
    "is_decoder": False,
    "is_encoder_decoder": False,
    "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "length_penalty": 1.0,
    "max_length": 20,
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "num_beam_groups": 1,
    "num_beams": 1,
    "num_return_sequences": 1,
    "output_attentions": False,
    "output_hidden_states": False,
    "output_scores": False,
    "prefix": None,
    "problem_type": None,
    "pruned_heads": {},
    "remove_invalid_values": False,
    "repetition_penalty": 1.0,
    "return_dict": True,
    "return_dict_in_generate": False,
    "sep_token_id": None,
    "suppress_tokens": None,
    "task_specific_params": None,
    "temperature": 1.0,
    "tf_legacy_loss": False,
    "tie_encoder_decoder": False,
    "tokenizer_class": None,
    "top_k": 50,
    "top_p": 1.0,
    "torchscript": False,
    "typical_p": 1.0,
    "use_bfloat16": False,
}


def test_a_file_with_every_pretrained_config_attribute_reads_as_the_model(tmp_path: Path) -> None:
    """A config.json saved with transformers' PretrainedConfig attributes written out
    (generation defaults, label maps, output switches) was refused for 45 keys "budget does
    not understand" (an audit, m531: a Qwen2.5-3B fine-tune's); none builds a weight, so the
    file reads as the model. Set, the structural ones (an encoder-decoder, cross-attention,
    pruned heads) build another model and are refused by name."""
    qwen = _raw("qwen2.5-0.5b")
    assert params_total(_plan("qwen2.5-0.5b")) == _total(tmp_path, {**qwen, **_FULL_DUMP})
    for key, value, built in (
        ("is_encoder_decoder", True, "builds an encoder-decoder"),
        ("add_cross_attention", True, "builds cross-attention layers"),
        ("pruned_heads", {"0": [1, 2]}, "builds layers with heads pruned away"),
    ):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**qwen, **_FULL_DUMP, key: value}), encoding="utf-8")
        with pytest.raises(HfConfigError) as caught:
            read_hf_config(path)
        (said,) = caught.value.messages
        assert f"sets {key} = {json.dumps(value)}, which {built}" in said


def test_many_unknown_keys_say_their_count_and_what_to_do_before_the_list(tmp_path: Path) -> None:
    """A long list of unknown keys was one sentence whose clipped tail held the advice and
    the keys that sort late (an audit, m531: the advice, and the one key that changed the
    model, 46th of 46, were cut): past eight keys the count and the advice come first, so
    that a message clipped at its length keeps them."""
    qwen = _raw("qwen2.5-0.5b")
    unknown = {f"tag_{i:02}": i for i in range(40)} | {"use_parallel_residual": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**qwen, **unknown}), encoding="utf-8")
    with pytest.raises(HfConfigError) as caught:
        read_hf_config(path)
    (said,) = caught.value.messages
    assert said.startswith(f"'{path}' has 41 keys that budget does not understand; if they ")
    assert said.endswith(", 'tag_39', 'use_parallel_residual'")
