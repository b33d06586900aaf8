"""Read a Hugging Face ``config.json`` into the plan language's `model:` keys.

Every key of the file is either read (it changes the budget), known and ignored (it does
not: tokenizer ids, RoPE base, dtype tags, router loss weights), or an error naming it, so
that a config whose meaning the budget would silently drop is never accepted.

Key meanings follow the ``transformers`` configuration classes: ``LlamaConfig``,
``MixtralConfig`` (num_local_experts, num_experts_per_tok), ``Qwen2MoeConfig`` (num_experts,
moe_intermediate_size, shared_expert_intermediate_size, decoder_sparse_step,
mlp_only_layers: layer i is sparse when i is not in mlp_only_layers and
(i + 1) % decoder_sparse_step == 0) and DeepSeek-V3's ``configuration_deepseek.py``
(n_routed_experts, n_shared_experts, first_k_dense_replace: layer i is sparse when
i ≥ first_k_dense_replace; moe_layer_freq, which transformers' classes ignore and DeepSeek's
code reads, is refused but at 1, where the two agree; q_lora_rank,
kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim of its multi-head latent
attention become ``model.mla``, and num_nextn_predict_layers, its multi-token prediction
modules, ``model.mtp_layers``).

Every architecture whose config has these keys builds a gated MLP, gate and up projections
then a down projection (``LlamaMLP``, ``MistralMLP``, ``Qwen2MLP``, ``GemmaMLP`` and the
experts of Mixtral, Qwen-MoE and DeepSeek), whatever its activation: ``silu`` is SwiGLU and
the GELU variants are GeGLU (Gemma), never a two-matrix GeLU MLP. The activation is
``hidden_activation`` where a file sets it (Gemma 2 and 3 read only that key), else
``hidden_act``; for Gemma 1 either is a GELU, which is all the price depends on.

A sliding window (``model.sliding_window``: its ``size`` and, unless every layer slides,
its ``layers``) is read from ``layer_types`` where a config carries it (one kind per layer,
``sliding_attention`` or ``full_attention``), and otherwise from ``sliding_window`` with the
layer kinds the config class builds: Qwen's configurations (``qwen2``, ``qwen2_moe``,
``qwen3``, ``qwen3_moe``) slide only with ``use_sliding_window`` true and then only from
layer ``max_window_layers`` on (28 by default: ``Qwen2Config``, ``Qwen3Config``; their MoE
configurations must give ``layer_types`` to slide); Gemma 2 and gpt-oss alternate, the
first layer sliding (``Gemma2Config``, ``GptOssConfig``); Gemma 3 keeps every
``sliding_window_pattern``-th layer (6 by default) full (``Gemma3TextConfig``), OLMo 3
every fourth (``Olmo3Config``); Mistral, Mixtral and Phi-3 slide on every layer. A file
without ``sliding_window`` slides at its config class's default, as transformers builds
it (4,096 for Mistral, Qwen 2 and 3, Gemma 2 and 3 and OLMo 3; 128 for gpt-oss; none for
Mixtral and Phi-3), and Qwen's slide only with ``use_sliding_window``, whatever
``layer_types`` says; no other family's class reads ``use_sliding_window``, so false there
is refused where it would switch off a window transformers builds. A family whose
attention never slides in transformers (Llama among them) is refused when it sets
``sliding_window`` or lists sliding layers in ``layer_types``, since nothing in the model
would use it; Mistral's and Mixtral's attention slides every layer whatever ``layer_types``
says, so full_attention beside a window is refused there. Any other layer kind (linear,
chunked attention) is refused here.

Beyond the Llama family's own keys the reader knows those of ``Phi3Config`` (dropout
probabilities ``embd_pdrop`` and ``resid_pdrop``, the pre-extension context
``original_max_position_embeddings``), ``GraniteConfig`` (four scalar multipliers),
InternLM2 (``bias``; ``attn_implementation``, a kernel choice: the plan's attention is the
fused kernel whatever it says), ``Gemma2Config`` and ``Gemma3TextConfig`` (the logits'
soft-capping, ``model.logit_softcap``; the attention scores' soft-capping,
``model.attention_softcap``; the query scale, the local RoPE base, the cache kind, and
``sliding_window_size``, Gemma 2's copy of ``sliding_window``), ``Glm4MoeConfig``
(``partial_rotary_factor``, ``use_qk_norm``) and ``GptOssConfig`` (``swiglu_limit``, a
clamp; its files also carry ``experts_per_token``, a copy of num_experts_per_tok).

Q and K norms have no key in most files: the model class builds them. ``model.qk_norm`` is
``per_head`` for ``qwen3``, ``qwen3_moe`` and ``gemma3_text`` (``Qwen3Attention`` and
``Gemma3Attention``: ``q_norm`` and ``k_norm`` of ``head_dim``) and wherever
``use_qk_norm`` is true (``Glm4MoeAttention``), and ``full_width`` for ``olmo2`` and
``olmo3`` (``Olmo2Attention``: ``q_norm`` of heads·head_dim, ``k_norm`` of
kv_heads·head_dim). Their parameters, their saved input (Q and K before the norm, wider
than the model in GLM-4.5: 96 heads of 128 against 5120) and their pass are budgeted.
Gemma 2 and 3 (``gemma2``, ``gemma3_text``) norm each block's output as well as its input
(``Gemma2DecoderLayer``: ``post_attention_layernorm`` and ``post_feedforward_layernorm``):
``model.sandwich_norm``.

Qwen2 always gives q, k and v biases (``Qwen2Attention``) and Qwen2-MoE as its ``qkv_bias``
says, true by default (``Qwen2MoeAttention``), as GLM's ``attention_bias`` does
(``GlmAttention``, ``Glm4Attention``, ``Glm4MoeAttention``), as does a config's own
``qkv_bias`` switch: each reads as ``model.qkv_bias``, not as ``bias``, which would put
biases on every linear layer. The attention's biases and the MLP's are separate switches:
``attention_bias`` (InternLM2's ``bias``: ``wqkv`` and ``wo``) reads as ``model.bias``, and
the MLP keeps none (``model.mlp_bias: false``) unless ``mlp_bias`` says so (``LlamaMLP``,
``GraniteMLP``) or the family always has them (gpt-oss: ``GptOssExperts`` and
``GptOssTopKRouter``). GLM-4-0414 (``glm4``) norms each block's output too
(``Glm4DecoderLayer``: ``post_self_attn_layernorm`` and ``post_mlp_layernorm``), as Gemma 2
and 3 do.

gpt-oss (``gpt_oss``) gives every head a learned sink logit (``GptOssAttention.sinks``):
``model.attention_sinks``, which brings gpt-oss-120b's dimensions to transformers'
116,829,156,672 parameters. The released files read for this (Llama 2 and 3, Mistral,
Mixtral, Qwen 2.5 and 3, Gemma 2 and 3, GLM-4.5 and 4.7, Phi-3 and 4, Granite, OLMo 2,
DeepSeek-V2-Lite and V3, Kimi K2 and gpt-oss, whose mxfp4 quantization_config was deleted
to read it; 25 files, compared with transformers 5.24's
count on the meta device) come to transformers' count exactly; those kept under
``tests/data/hf`` are tested to it.

What that reading over-counts, small but named here:

- ``dropout`` is one switch: any non-zero dropout probability (attention, hidden,
  residual or embedding) budgets every dropout mask the plan language knows, where a model
  may drop out in fewer places.

``model_type`` names the model class, and so the layers it builds with no key of their
own: a file whose ``model_type`` is not one of `FAMILIES` (the classes above) is refused
rather than read as Llama; one without ``model_type`` (written by hand) is read as Llama,
unless its ``architectures`` name another class (`_architecture_problems`). It also names
the keys the class reads: a key only other classes read (an expert layout's widths and
periods, latent attention, multi-token prediction, InternLM2's ``bias``, GLM's
``use_qk_norm``, Gemma's activation and soft-cap, ``qkv_bias``) is refused where it is set,
as transformers would build the model without it (`_foreign_problems`), unless it states
what the class builds anyway (``use_qk_norm`` true where its attention makes per-head
norms, as Qwen3-Coder-480B's files write); the expert count's
three names are read as one another, so two of them must agree.

A key the file leaves out takes the default of the class its ``model_type`` names
(`CLASS_DEFAULTS`), as transformers would build the model: ``save_pretrained`` writes a
composite model's ``text_config`` without the keys equal to its class's defaults, so
Gemma 3 12B's lists neither ``head_dim`` (256) nor ``vocab_size`` (262,208), and a language
model's config copied out of it (as the refusal of such files advises) is read right.
Those defaults differ from Llama's conventions in ways that move the budget: 15 of the 22
classes default ``num_key_value_heads`` to a number rather than to the heads, Qwen 3, Gemma,
GLM and gpt-oss fix ``head_dim``, Gemma's MLP gates with a GeLU and its embeddings are tied, every
other class's are not. hidden_size, num_hidden_layers and num_attention_heads take their
class's defaults too, as transformers reads them (Gemma 3 4B's text_config has no
num_attention_heads: Gemma3TextConfig's 8). A file without ``model_type`` (written by hand)
must give those three and vocab_size, and otherwise takes the ``PretrainedConfig`` default,
``tie_word_embeddings`` true, no sliding window, and the plan language's defaults.

A key the file sets to null is not left out: the class keeps the None, and a class default
does not fill it. Where the class gives None a meaning it is read so (``sliding_window``: no
window; ``head_dim`` where the class derives it, hidden / heads; ``num_key_value_heads``: the
heads; ``q_lora_rank``: queries not compressed; ``mlp_only_layers``: none; a switch: false;
``rope_scaling``, ``quantization_config``: none). A size, count or period the class builds
its layers from and takes no None for (``nn.Linear(hidden, None)``, ``range(None)``,
``i % None``) is refused when null, naming it (`_NO_NULL`): an audit read DeepSeek-V3 with
a null ``moe_intermediate_size`` as 5.9 trillion parameters, its experts at the dense
width. A file without model_type, written by hand, reads a null as the key left out.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budget.files import exists
from budget.plan.yaml_load import rounded_away
from budget.units import MAX_INT

__all__ = [
    "CLASS_DEFAULTS",
    "FAMILIES",
    "IGNORED",
    "READ",
    "HfConfigError",
    "HfModel",
    "read_hf_config",
    "translate",
]

READ = frozenset(
    {
        # the model class: the layers it builds with no key of their own (module docstring:
        # q, k and v biases, q and k norms, post-block norms; Qwen's sliding-window rule)
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "tie_word_embeddings",
        "hidden_act",
        "hidden_activation",  # Gemma; read before hidden_act
        "max_position_embeddings",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "attention_bias",
        "mlp_bias",
        "sliding_window",  # model.sliding_window.size (`_window`)
        "use_sliding_window",
        "sliding_window_size",  # Gemma 2: a copy of sliding_window
        "layer_types",  # full_attention, or sliding_attention: model.sliding_window.layers
        "max_window_layers",  # Qwen: the first layer that slides (`_window`)
        "sliding_window_pattern",  # Gemma 3 without layer_types: every n-th layer is full
        "_sliding_window_pattern",  # transformers 5's copy of it, in re-saved Gemma 3 files
        # Gemma: false in every decoder; true is an encoder (EmbeddingGemma), refused
        "use_bidirectional_attention",
        # the checkpoint's weight format: fp8 (DeepSeek-V3, Kimi K2) is the serving default
        # of precision.params (`HfModel.weights`); other methods are refused
        "quantization_config",
        # Mixtral
        "num_local_experts",
        "num_experts_per_tok",
        "experts_per_token",  # gpt-oss: a copy of num_experts_per_tok
        # dropout probabilities: any non-zero one is model.dropout
        "attention_dropout",
        "hidden_dropout",
        "embd_pdrop",
        "resid_pdrop",
        "bias",  # InternLM2: biases on its attention's projections (wqkv, wo)
        "lm_head_bias",  # Phi-4-mini; refused when true (no output-layer bias is priced)
        "final_logit_softcapping",  # Gemma 2 and 3: model.logit_softcap when set
        "attn_logit_softcapping",  # Gemma 2 and 3: model.attention_softcap when set
        "use_qk_norm",  # GLM: per-head q and k norms, model.qk_norm
        "qkv_bias",  # q, k and v biases alone: model.qkv_bias
        # Qwen-MoE
        "num_experts",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
        # DeepSeek
        "n_routed_experts",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
        # DeepSeek multi-head latent attention (model.mla)
        "v_head_dim",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "qk_head_dim",  # transformers 5's nope + rope, in re-saved files: checked
        # DeepSeek-V3 multi-token prediction modules (model.mtp_layers)
        "num_nextn_predict_layers",
        # transformers' PretrainedConfig: an encoder-decoder's, cross-attention's or a
        # pruned model's, refused where set (`_STRUCTURAL`); a decoder's file leaves them off
        "is_encoder_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "cross_attention_hidden_size",
        "pruned_heads",
    }
)

# The keys above that build another model than a decoder-only one where they are set (not
# false, null or empty): transformers' PretrainedConfig attributes an encoder-decoder, a
# decoder with cross-attention, or a model with heads pruned away.
_STRUCTURAL = {
    "is_encoder_decoder": "builds an encoder-decoder",
    "add_cross_attention": "builds cross-attention layers",
    "tie_encoder_decoder": "ties an encoder-decoder's encoder to its decoder",
    "cross_attention_hidden_size": "builds cross-attention layers",
    "pruned_heads": "builds layers with heads pruned away",
}

# transformers' PretrainedConfig attributes every config has (configuration_utils.py,
# ``PretrainedConfig.__init__``), which a file saved with every attribute written out keeps
# (an audit, m531: a Qwen2.5-3B fine-tune's 45 of them were refused as not understood):
# generation defaults, the output switches, label maps, token ids and tags. None builds a
# weight or changes a shape; the structural ones are read above.
_GENERIC = frozenset(
    {
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
        "tf_legacy_loss",
        "chunk_size_feed_forward",
        "is_decoder",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "finetuning_task",
        "id2label",
        "label2id",
        "tokenizer_class",
        "prefix",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
        "problem_type",
        "_commit_hash",
        "_attn_implementation_internal",
    }
)

# Keys that do not change memory, communication or time in this model.
IGNORED = frozenset(
    {
        "_name_or_path",
        "architectures",  # read only where model_type is left out (`_architecture_problems`)
        "auto_map",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "initializer_range",
        "use_cache",
        "pretraining_tp",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",  # transformers 5: rope_theta and rope_scaling together
        "use_mrope",  # Qwen2.5: multimodal rotary sections, the same rotation cost
        "rope_local_base_freq",  # Gemma 3: the RoPE base of its sliding layers
        "partial_rotary_factor",  # rotates part of each head: fewer elements, same shapes
        "original_max_position_embeddings",  # Phi-3: the context before RoPE scaling
        "interpolate_factor",  # Phi-4-mini: left from Microsoft's code, unused by transformers
        "full_attn_mod",  # Phi-4-mini: likewise
        "initial_context_length",  # gpt-oss: its context before YaRN scaling
        # scalars on activations or logits: no parameters, bytes or FLOPs to speak of
        "attention_multiplier",  # Granite
        "embedding_multiplier",  # Granite
        "residual_multiplier",  # Granite
        "logits_scaling",  # Granite
        "query_pre_attn_scalar",  # Gemma 2 and 3: the softmax scale
        "swiglu_limit",  # gpt-oss: a clamp on the gate
        "swiglu_alpha",  # gpt-oss: the gate's sigmoid scale, which transformers 5 writes
        "rope_interleave",  # DeepSeek: which rotary layout, the same rotation cost
        "rope_interleaved",  # nanotron's files (SmolLM2): likewise
        "is_llama_config",  # nanotron's files: a tag
        "unsloth_fixed",  # unsloth's mirrors: tags of its tokenizer and template fixes
        "unsloth_version",
        # Qwen2.5-1M: vLLM's kernel for long prompts; weights, cache and shapes unchanged
        "dual_chunk_attention_config",
        "cache_implementation",  # Gemma 2 and 3: how transformers lays out its KV cache
        "attn_implementation",  # InternLM2: a kernel choice
        "_attn_implementation_autoset",  # transformers 4.47-4.50 saves it: likewise
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "norm_topk_prob",
        # DeepSeek routing and auxiliary settings
        "aux_loss_alpha",
        "ep_size",
        # group-limited routing: read, not priced (README, model.experts: the busiest ep
        # rank's experts at small decode batches are undercounted where ranks hold groups)
        "n_group",
        "topk_group",
        "topk_method",
        "routed_scaling_factor",
        "scoring_func",
        "seq_aux",
    }
    | _GENERIC
)

_ACTIVATIONS = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu": "geglu",
    "gelu_new": "geglu",
    "gelu_fast": "geglu",
    "gelu_pytorch_tanh": "geglu",
}


# what a JSON value other than an object is called, in JSON's words (an audit: "holds
# NoneType", "holds list")
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number"}


class HfConfigError(Exception):
    """A config.json that cannot be read or holds keys the budget does not understand; one
    sentence per problem (`messages`). `model`: the file read all the same where its only
    problem is keys it does not understand, so that what it gives is checked too."""

    def __init__(self, *messages: str, model: HfModel | None = None) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages
        self.model = model


@dataclass(frozen=True, slots=True)
class HfModel:
    tree: dict[str, Any]  # plan-language `model:` keys
    ignored: tuple[str, ...] = field(default=())
    weights: str | None = None  # the released weights' format when quantized ("fp8")


MAX_BYTES = 2**20  # released config.json files are a few kilobytes; this bounds the work


def read_hf_config(path: Path) -> HfModel:
    """Load ``path`` and translate it; `HfConfigError` with a sentence on failure.

    Read with the plan file's care: at most `MAX_BYTES`, UTF-8 only, a key twice in one
    object refused (``json`` would keep the last silently) and so is nesting deeper than
    the parser's recursion allows."""
    shown = repr(str(path))
    if exists(path) and not path.is_file():  # a FIFO or a device would block or never end
        raise HfConfigError(f"{shown} is not a regular file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise HfConfigError(f"cannot read {shown}: {error.strerror or error}") from None
    except ValueError:  # a NUL byte, which no file name holds
        raise HfConfigError(f"{shown} is not a file name: it holds a NUL byte") from None
    if len(data) > MAX_BYTES:
        raise HfConfigError(f"{shown} is over {MAX_BYTES:,} bytes, so it was not read")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark, as plans
    except UnicodeDecodeError as error:
        raise HfConfigError(f"{shown} is not UTF-8 text (byte {error.start:,})") from None
    reading = _Reading()
    try:
        config = json.loads(
            text,
            object_pairs_hook=reading.unique_keys,
            parse_int=reading.int63,
            parse_float=reading.real,
            parse_constant=reading.finite,
        )
    except json.JSONDecodeError as error:
        # some of the scanner's messages end in "at" already ("Invalid control character
        # at"), as its own "…: line 17 column 21" follows them (an audit: "at at")
        what = error.msg.removesuffix(" at")
        raise HfConfigError(
            f"{shown} is not JSON: {what} at line {error.lineno} column {error.colno}"
        ) from None
    except RecursionError:
        raise HfConfigError(f"{shown} nests its values too deeply to be a config") from None
    found = reading.said(shown, _refused_paths(config) if reading.values else [])
    if isinstance(config, _Refused):  # a whole file of 1e400 or NaN: said above, once
        raise HfConfigError(*found)
    if not isinstance(config, dict):
        kind = (
            json.dumps(config)  # null, true, false
            if config is None or isinstance(config, bool)
            else _JSON_KINDS.get(type(config), type(config).__name__)
        )
        raise HfConfigError(*found, f"{shown} holds {kind}, not a JSON object")
    if not found:  # every message names the file as the reading ones do, quoted
        return translate(config, shown)
    # every problem of the file at once: what the hooks found, then what the keys they left
    # sound say (a refused value stands as null, and its key is not judged again)
    refused = frozenset(k for k, v in config.items() if _holds(v, _REFUSED))
    try:
        unknown, problems = _check(_without(config, _REFUSED), shown, refused)
    except HfConfigError as error:  # a file of several models: said instead of its keys
        raise HfConfigError(*found, *error.messages) from None
    raise HfConfigError(*found, *unknown, *problems)


class _Refused:
    """What a refused JSON value (a number too large or not finite) stands as while the
    file is read, so that its key is known (`read_hf_config`)."""


_REFUSED = _Refused()


class Written(float):
    """A config.json number that prints otherwise than the file wrote it (8.000000000000001
    reads as 8.000000000000002, 1e-5 prints 1e-05), keeping the file's text for the
    messages that quote it (`_dumps`); a float in every other way."""

    text: str

    def __new__(cls, value: float, text: str) -> Written:
        made = super().__new__(cls, value)
        made.text = text
        return made

    def __getnewargs__(self) -> tuple[float, str]:  # type: ignore[override]
        """What a copy or a pickle builds it from (review m497: float's gives the value
        alone, which `__new__` refuses)."""
        return float(self), self.text


def _dumps(value: Any) -> str:
    """A config value as a message quotes it: a number as the file wrote it (`Written`),
    anything else as JSON writes it."""
    if isinstance(value, Written):
        return value.text if len(value.text) <= 30 else value.text[:27] + "..."
    # a list's or an object's numbers too (review m498: mlp_only_layers = [8.000000000000002,
    # 2] for the file's 8.000000000000001), in json.dumps's own separators
    if isinstance(value, list):
        return "[" + ", ".join(_dumps(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


class _Reading:
    """The ``json`` hooks of one read: each problem is noted, not raised, so a file with
    several (a key twice, a NaN, an integer past 2**63) gets them all at once."""

    def __init__(self) -> None:
        self.problems: list[str | int] = []  # a message, or which of `values` comes here
        self.values: list[tuple[str, str]] = []  # a refused value as written, and why
        self.twice = False  # a key written twice in one object: the orders part (`said`)

    def refuse(self, text: str, why: str) -> _Refused:
        self.problems.append(len(self.values))
        self.values.append((text, why))
        return _REFUSED

    def said(self, shown: str, paths: list[str]) -> tuple[str, ...]:
        """The problems as met, each refused value under its key where the keys holding
        one (`_refused_paths`, in the file's order, as the hooks met them) are as many as
        the values refused: ``rope_theta = NaN in 'config.json' is not a finite number``,
        where "has NaN" left the reader to search the file for it (an audit). In a file
        with a key written twice none is named: the object keeps the key where it first
        stood and the value it last had, so the hooks' order and the keys' may part (a
        review: NaN and Infinity each named under the other's key)."""
        named = not self.twice and len(paths) == len(self.values) and all(paths)
        out = []
        for problem in self.problems:
            if isinstance(problem, str):
                out.append(f"{shown} has {problem}")
                continue
            text, why = self.values[problem]
            if named:
                out.append(f"{paths[problem]} = {text} in {shown} is {why}")
            else:
                out.append(f"{shown} has {text}, {why}")
        return tuple(out)

    def int63(self, text: str) -> int | _Refused:
        """An integer as the plan's YAML loader takes one: below `MAX_INT` in magnitude (the
        length test first, so that a 5,000-digit number is never converted)."""
        if len(text.lstrip("-")) > 19 or abs(value := int(text)) >= MAX_INT:
            shown = text if len(text) <= 24 else text[:21] + "..."
            return self.refuse(shown, "too large (integers must be below 2**63)")
        return value

    def real(self, text: str) -> float | _Refused:
        if not math.isfinite(value := float(text)):
            return self.finite(text)
        lost = rounded_away(text, value)  # 1e-400 read as 0.0 (an audit, m447)
        if lost is not None:
            return self.refuse(text, lost)
        # quoted as written where it prints otherwise (an audit, m495: num_attention_heads
        # = 8.000000000000001 was told 8.000000000000002 is not an integer)
        return value if text == repr(value) else Written(value, text)

    def finite(self, text: str) -> _Refused:
        """NaN, Infinity and -Infinity, which ``json`` takes as numbers, and overflowing
        floats."""
        return self.refuse(text, "not a finite number")

    def unique_keys(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) < len(pairs):
            self.twice = True
            twice = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
            keys = "key" if len(twice) == 1 else "keys"
            self.problems.append(f"{keys} {', '.join(map(repr, twice))} twice in one object")
        return out


def _refused_paths(config: Any) -> list[str]:
    """Where each refused value stands, in the file's order: ``rope_theta``,
    ``text_config.num_hidden_layers``, ``layer_types[3]``; "" for the whole file."""
    paths: list[str] = []
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        path, item = stack.pop()
        if item is _REFUSED:
            paths.append(path)
        elif isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return paths


def _holds(value: Any, mark: object) -> bool:
    """Whether `value` is `mark` or holds it, at any depth (iteratively: JSON nests deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is mark:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _without(config: dict[str, Any], mark: object) -> dict[str, Any]:
    """`config` with `mark` replaced by None wherever it stands (in place, iteratively)."""
    stack: list[Any] = [config]
    while stack:
        item = stack.pop()
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, value in list(pairs):
            if value is mark:
                item[key] = None
            elif isinstance(value, dict | list):
                stack.append(value)
    return config


def _int(config: Mapping[str, Any], key: str, where: str) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HfConfigError(f"{key} = {_dumps(value)} in {where} is not a non-negative integer")
    return value


def _optional(config: Mapping[str, Any], key: str, where: str, default: int, least: int = 0) -> int:
    """An integer key of at least `least`, `default` when absent (the config class's default)
    or null where the null was not refused before (`_NO_NULL`: a file written by hand, which
    reads it as left out); anything else, 2.5 or "2" among them, is an error naming it."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive integer" if least == 1 else "a non-negative integer"
        raise HfConfigError(f"{key} = {_dumps(value)} in {where} is not {kind}")
    return value


def _layer_list(config: Mapping[str, Any], key: str, where: str) -> set[int]:
    """A list of layer indices (Qwen-MoE's ``mlp_only_layers``), empty when absent or null."""
    problem = _layer_list_problem(config, key, where)
    if problem is not None:
        raise HfConfigError(problem)
    return set(config.get(key) or ())


def _layer_list_problem(config: Mapping[str, Any], key: str, where: str) -> str | None:
    """Why `key` is not a list of layer indices (`_layer_list`), or None."""
    value = config.get(key)
    if value is None or (
        isinstance(value, list)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    ):
        return None
    return f"{key} = {_shown(value)} in {where} is not a list of layer indices"


def _layer_types_problem(config: Mapping[str, Any], where: str) -> str | None:
    """Why ``layer_types`` is not one kind budget prices for each layer, or None where it
    is, or is absent (`_window`; a count of layers that is not one is its own problem)."""
    kinds = config.get("layer_types")
    if kinds is None:
        return None
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        return (
            f"layer_types in {where} is not a list of layer kinds; give one string per "
            "layer, such as 'full_attention'"
        )
    layers = config.get("num_hidden_layers")
    counted = isinstance(layers, int) and not isinstance(layers, bool)
    if counted and len(kinds) != layers:
        return (
            f"layer_types in {where} lists {len(kinds)} kinds for num_hidden_layers = "
            f"{_dumps(layers)}; give one kind per layer"
        )
    other = sorted({k for k in kinds if k not in ("full_attention", "sliding_attention")})
    if other:
        count = sum(k in other for k in kinds)
        return (
            f"{where} has {count} of {len(kinds)} layers of kind {', '.join(other)} in "
            "layer_types: budget prices softmax attention, over the whole context or a "
            "sliding window; write the model's dimensions out to budget every layer as "
            "full attention"
        )
    return None


def _switch(config: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    """A true-or-false key: absent, `default` (the config class's); null, false, as the
    modelling code reads it (``if config.tie_word_embeddings:``, ``nn.Linear(bias=None)``
    builds no bias); any other value, a string "false" among them, is an error naming it as
    JSON writes it."""
    if key not in config:
        return default
    value = config[key]
    if value is None:
        return False
    if not isinstance(value, bool):
        raise HfConfigError(f"{key} = {_dumps(value)} in {where} is not true or false")
    return value


def _refuse_wrapper(config: Mapping[str, Any], where: str) -> None:
    """A multimodal model's file (Gemma 3 from 4B up, Llama 4, Mistral 3, Qwen2.5-VL) nests
    its language model's keys under ``text_config`` beside its encoders' (``vision_config``,
    ``audio_config``). Read alone, the language model would leave the encoders' parameters,
    activations and compute out of the budget, so the file is refused with what to do."""
    if not isinstance(config.get("text_config"), Mapping):
        return
    others = sorted(
        k
        for k in config
        if k.endswith("_config") and k not in ("text_config", "quantization_config")
    )
    beside = f" beside {', '.join(others)}" if others else ""
    inner = config["text_config"].get("model_type")
    if inner is None or (isinstance(inner, str) and inner in FAMILIES):
        advice = (
            "give hf_config the language model's own config.json, or text_config alone saved "
            "as a file (the keys it leaves out take its model_type's defaults)"
        )
    else:  # saving it alone would only meet the family refusal (an audit: Llama 4)
        advice = (
            f"write the model's dimensions out: its language model (model_type "
            f"{_dumps(inner)}) is not a family budget reads either "
            f"({', '.join(sorted(FAMILIES))})"
        )
    raise HfConfigError(
        f"{where} configures a model of several parts (model_type "
        f"{_dumps(config.get('model_type'))}): the language model's keys are under "
        f"text_config{beside}, and budget prices a language model alone; {advice}"
    )


def translate(config: Mapping[str, Any], where: str = "config.json") -> HfModel:
    """A config.json dictionary → plan-language `model:` keys (module docstring)."""
    unknown, problems = _check(config, where)
    if problems:  # every key of the wrong kind, together
        raise HfConfigError(*unknown, *problems)
    try:  # unknown keys are a problem, and the keys it reads are read on for theirs
        model = _translate(config, where)
    except HfConfigError as error:
        raise HfConfigError(*unknown, *error.messages) from None
    if unknown:  # and what the rest gives, checked beside them (an audit, m396: in rounds)
        raise HfConfigError(*unknown, model=model)
    return model


def _check(
    config: Mapping[str, Any], where: str, refused: frozenset[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """The problems found before reading the keys together: the unknown keys (a sentence,
    or none), and every other (a family budget does not read, a count, a switch or an
    activation of the wrong kind, a null the class takes no None for, a required key
    missing), after which `_translate` is not run, since it stops at its first problem and
    reads later keys in the light of earlier ones. `refused` are the keys whose value the
    reading refused (already a problem of their own)."""
    _refuse_wrapper(config, where)
    problems = []
    family = config.get("model_type")
    known = family is None or (isinstance(family, str) and family in FAMILIES)
    if not known:
        problems.append(
            f"model_type = {_dumps(family)} in {where} is not a family budget reads: "
            "write the model's dimensions out instead (its model class may build layers no "
            "key announces, norms or biases, which budget would leave out); the families it "
            f"reads: {', '.join(sorted(FAMILIES))}"
        )
    elif family is None:
        problems += _architecture_problems(config.get("architectures"), where)
    unknown = sorted(set(config) - READ - IGNORED)
    said = []
    if unknown and known:  # a refused family: removing its keys would not help
        names = ", ".join(repr(k) for k in unknown)
        one = len(unknown) == 1
        # many keys: the count and the advice before the list, which a long message clips
        # (an audit, m531: 46 keys clipped before the advice and the one that mattered)
        said.append(
            f"{where} has key{'' if one else 's'} {names} that budget does not understand; "
            f"if {'it builds' if one else 'they build'} nothing (a tag, a kernel setting), "
            f"remove {'it' if one else 'them'}, or else write the model's dimensions out"
            if len(unknown) <= 8
            else f"{where} has {len(unknown)} keys that budget does not understand; if they "
            "build nothing (tags, kernel settings), remove them, or else write the model's "
            f"dimensions out: {names}"
        )
    problems += [
        f"{where} sets {key} = {_dumps(config[key])}, which {built}; budget prices a "
        "decoder-only model: write the model's dimensions out if its decoder is what to price"
        for key, built in _STRUCTURAL.items()
        if config.get(key) not in (None, False, 0, {}, [])
    ]
    sound = {k: v for k, v in config.items() if k not in refused}
    if known:
        # a file written by hand may use any key; its expert count's names must still agree
        if family is None or family in _MOE:  # the others' are refused whole, `_experts`
            problems += _count_problems(sound, where)
        problems += _foreign_problems(sound, family, where)
    problems += _integer_problems(sound, family if known else None, where)
    problems += _kind_problems(sound, where)
    if known:  # keys neither the file nor its class gives (a refused value stands as null)
        missing = [k for k in _REQUIRED if k not in _with_class_defaults(config, family)]
        problems += [f"{where} lacks {', '.join(missing)}"] if missing else []
        problems += _top_k_problems(_with_class_defaults(sound, family), family, where)
    return said, problems


# Keys only some model classes read, each with those classes: in a file of another family
# transformers builds the model without them, where reading them changed the budget (an
# audit: Mixtral-8x22B with moe_intermediate_size read its experts 1,024 wide, 13.8 billion
# parameters for 140.6; Llama with DeepSeek's latent-attention ranks read as MLA). Expert
# keys matter only in `_MOE`'s families (the others read them only beside an expert count,
# which `_experts` refuses whole); a file without model_type, written by hand, may use any
# (module docstring).
_DEEPSEEK_LIKE = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
_QWEN_MOE = frozenset({"qwen2_moe", "qwen3_moe"})
# (The expert count's three names, and gpt-oss's copy of the top-k, are read as one another,
# as transformers 5's attribute maps do: they must agree instead, `_count_problems`.)
_EXPERT_OWNERS: dict[str, frozenset[str]] = {
    "moe_intermediate_size": _QWEN_MOE | _DEEPSEEK_LIKE | {"glm4_moe"},
    "shared_expert_intermediate_size": frozenset({"qwen2_moe"}),  # Qwen3-MoE has none
    "decoder_sparse_step": _QWEN_MOE,
    "mlp_only_layers": _QWEN_MOE,
    "n_shared_experts": _DEEPSEEK_LIKE | {"glm4_moe"},
    "first_k_dense_replace": _DEEPSEEK_LIKE | {"glm4_moe"},
    "moe_layer_freq": _DEEPSEEK_LIKE,
}
_OWNERS: dict[str, frozenset[str]] = {
    # DeepSeek's multi-head latent attention (``DeepseekV2Attention``, ``DeepseekV3Attention``)
    **dict.fromkeys(
        ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        _DEEPSEEK_LIKE,
    ),
    # multi-token prediction modules: DeepSeek-V3's files and GLM-4.5's
    "num_nextn_predict_layers": frozenset({"deepseek_v3", "kimi_k2", "glm4_moe"}),
    "bias": frozenset({"internlm2"}),  # InternLM2Attention's wqkv and wo
    "use_qk_norm": frozenset({"glm4_moe"}),  # Glm4MoeAttention
    "hidden_activation": frozenset({"gemma", "gemma2", "gemma3_text"}),
    "final_logit_softcapping": frozenset({"gemma2", "gemma3_text"}),
    "attn_logit_softcapping": frozenset({"gemma2", "gemma3_text"}),
    # Qwen2MoeAttention's q, k and v biases (modular_qwen2_moe.py at 8fb1742; true by default)
    "qkv_bias": frozenset({"qwen2_moe"}),
}
# Classes whose projections' biases are fixed whatever the file says (transformers at
# 008e574, an audit): reading the key there counted biases the model does not have
# (Mistral 7B with attention_bias: +327,680 parameters; Qwen3-30B-A3B with mlp_bias: +22.0M)
_FIXED_BIAS: dict[str, dict[str, str]] = {
    "attention_bias": {
        "mistral": "MistralAttention builds no bias",
        "mixtral": "MixtralAttention, Mistral's, builds no bias",
        "qwen2": "Qwen2Attention builds q, k and v biases and no other",
        "qwen2_moe": "Qwen2MoeAttention's q, k and v biases follow qkv_bias",
        "phi3": "Phi3Attention builds no bias",  # modular_phi3.py at 06053b8
        # InternLM2Attention's wqkv and wo take bias=config.bias (modeling_internlm2.py)
        "internlm2": "InternLM2Attention's biases follow bias",
    },
    "mlp_bias": {
        "qwen2": "Qwen2MLP builds no bias",
        "qwen3": "Qwen3MLP, Gemma's, builds no bias",
        "gemma": "GemmaMLP builds no bias",
        "gemma2": "Gemma2MLP, Gemma's, builds no bias",
        "gemma3_text": "Gemma3MLP, Gemma's, builds no bias",
        "phi3": "Phi3MLP builds no bias",
        "mistral": "MistralMLP builds no bias",
        "mixtral": "MixtralExperts build no bias",
        "qwen2_moe": "Qwen2MoeMLP and its experts build no bias",
        "qwen3_moe": "its MLPs and experts, Qwen2-MoE's, build no bias",
        "deepseek_v3": "DeepseekV3MLP, Qwen2-MoE's, builds no bias",
        # an audit, each MLP's projections bias=False (transformers' modeling_glm.py,
        # modular_glm4.py, modeling_olmo2.py, modular_olmo3.py, modular_glm4_moe.py,
        # modeling_deepseek_v2.py; InternLM2's own modeling_internlm2.py)
        "deepseek_v2": "DeepseekV2MLP builds no bias",
        "kimi_k2": "its MLPs, DeepSeek-V3's, build no bias",
        "glm": "GlmMLP builds no bias",
        "glm4": "Glm4MLP, GLM's, builds no bias",
        "glm4_moe": "Glm4MoeMLP, DeepSeek-V3's, builds no bias",
        "olmo2": "Olmo2MLP builds no bias",
        "olmo3": "its MLP, OLMo 2's, builds no bias",
        "internlm2": "InternLM2MLP builds no bias",
    },
}


def _foreign_problems(config: Mapping[str, Any], family: str | None, where: str) -> list[str]:
    """The keys of `config` that its family's class does not read but that would change
    the budget here, being set (not null, 0, false or empty): one problem each
    (`_OWNERS`)."""
    if family is None:
        return []
    owners = {**_OWNERS, **(_EXPERT_OWNERS if family in _MOE else {})}
    problems = []
    for key, families in owners.items():
        value = config.get(key)
        if family in families or value in (None, 0, False, [], ""):
            continue
        if key == "use_qk_norm" and value is True and _QK_NORMS.get(family) == "per_head":
            # states what the class builds anyway: Qwen3's and Gemma 3's attention makes
            # per-head q and k norms whatever the file says, and Qwen3-Coder-480B's files
            # say so (an audit, m372: the release was refused)
            continue
        read = (
            f"the {', '.join(sorted(families))} "
            + ("classes read it" if len(families) > 1 else "class reads it")
            if families
            else "only a file without model_type, written by hand, uses it"
        )
        problems.append(_unread(key, value, family, where, read))
    for key, fixed in _FIXED_BIAS.items():
        if family in fixed and config.get(key) is True:  # another value: `_kind_problems`
            problems.append(_unread(key, True, family, where, fixed[family]))
    return problems


def _unread(key: str, value: Any, family: str, where: str, why: str) -> str:
    return (
        f"{key} = {_dumps(value)} in {where}: model_type {_dumps(family)}'s class "
        f"does not read it ({why}), so transformers builds the model without it; remove it, "
        "or correct model_type"
    )


def _count_problems(config: Mapping[str, Any], where: str) -> list[str]:
    """The expert count written under two of its names with two values (an audit: Qwen2-57B's
    num_experts 64 beside a stray num_local_experts 8 read as 8 experts, 14.2 billion
    parameters for 57.4)."""
    # whole numbers alone: another value is the integer check's to refuse (8.0 beside 8 was
    # told to agree with it: a review)
    given = {k: v for k, v in config.items() if k in _COUNT_KEYS and type(v) is int}
    if len(set(map(json.dumps, given.values()))) < 2:
        return []
    names = " and ".join(f"{k} = {_dumps(v)}" for k, v in sorted(given.items()))
    return [f"{where} sets {names}, names of one count, the routed experts; make them agree"]


def _architecture_problems(names: Any, where: str) -> list[str]:
    """A file without ``model_type`` is read as Llama (module docstring), which is only
    right where ``architectures``, the model classes it was saved from, says nothing else:
    a stripped or hand-edited GPT-NeoX file (``GPTNeoXForCausalLM``, two-matrix GeLU MLP)
    read as Llama's gated MLP priced GPT-NeoX-20B at 27.2 billion parameters, not 20.6 (an
    audit). Each name's stem (``MistralForCausalLM`` → mistral) is matched to `FAMILIES`
    with their underscores dropped, as transformers names its classes after them."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return []  # not the list of class names transformers writes: a tag, ignored
    families = {f.replace("_", ""): f for f in FAMILIES} | {"gemma3": "gemma3_text"}
    found = {stem: families.get(stem.lower()) for stem in map(_stem, names)}
    if all(family == "llama" for family in found.values()):
        return []
    shown = ", ".join(json.dumps(name) for name in names)
    named = sorted({f for f in found.values() if f is not None and f != "llama"})
    if named and None not in found.values() and len(named) == 1:
        return [
            f"{where} has no model_type, which budget reads as Llama, but its architectures "
            f'({shown}) are {named[0]}\'s: add "model_type": "{named[0]}", which says '
            "the layers its model class builds"
        ]
    return [
        f"{where} has no model_type, which budget reads as Llama, but its architectures "
        f"({shown}) name a model class of no family budget reads "
        f"({', '.join(sorted(FAMILIES))}): write the model's dimensions out instead"
    ]


def _stem(name: str) -> str:
    """``GPTNeoXForCausalLM`` → ``GPTNeoX``: a transformers class name without the head it
    adds to the model, whichever task it is for (``LlamaForSequenceClassification``: a
    review found it refused as no family's)."""
    head = re.search(r"(For[A-Z]\w*|LMHeadModel|Model)$", name)
    return name[: head.start()] if head and head.start() > 0 else name


# the keys `_translate` reads as counts or sizes (`_int`, `_optional`), when not null
_INTEGERS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "v_head_dim",
    "qk_head_dim",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "kv_lora_rank",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_shared_experts",
    "num_nextn_predict_layers",
    "max_window_layers",
    "first_k_dense_replace",
)
_POSITIVE = ("moe_layer_freq", "decoder_sparse_step")  # a period: 0 would divide by it
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_PERIOD_KEYS = (*_POSITIVE, "sliding_window_pattern", "_sliding_window_pattern")
# The sizes, counts and periods a null of which is refused (module docstring), each with the
# families whose class builds layers from it and takes no None (None: every class; the
# `_REQUIRED` keys, a file written by hand's too). The classes pass it to nn.Linear, range
# or % (``LlamaMLP``; ``MixtralSparseMoeBlock``; ``Qwen2MoeSparseMoeBlock``, whose shared
# expert is unconditional, and ``Qwen2MoeDecoderLayer``: num_experts > 0, (i + 1) %
# decoder_sparse_step; ``DeepseekV3MoE`` and ``Glm4MoeMoE``: moe_intermediate_size ×
# n_shared_experts; ``DeepseekV3Attention``: kv_lora_rank + qk_rope_head_dim; the layer
# kinds ``Qwen2Config`` builds from max_window_layers and ``Gemma3TextConfig`` from
# sliding_window_pattern). Left out, as None has a meaning there: num_key_value_heads (the
# heads), q_lora_rank (``if config.q_lora_rank is None``: no query compression),
# qk_head_dim (recomputed), num_nextn_predict_layers (transformers builds no MTP module:
# none), mlp_only_layers (``Qwen2MoeConfig``: []), head_dim where the class derives it;
# n_shared_experts in ``DeepseekV2Moe`` and DeepSeek's own code (Kimi K2's), which build no
# shared expert for None, and n_routed_experts in the latter, which builds dense layers.
_NO_NULL: dict[str, frozenset[str] | None] = {
    **dict.fromkeys(_REQUIRED, None),
    "intermediate_size": None,  # gpt-oss too: GptOssExperts, the experts' width
    # a number its class sets, not hidden / heads (Gemma2Config's 256, GptOssConfig's 64)
    # and where the attention reads getattr(config, "head_dim", hidden // heads), which
    # gives a null back (Qwen3MoeAttention, Glm4MoeAttention; a review)
    "head_dim": frozenset(
        {
            "qwen3",
            "qwen3_moe",
            "gemma",
            "gemma2",
            "gemma3_text",
            "glm",
            "glm4",
            "glm4_moe",
            "gpt_oss",
        }
    ),
    "num_local_experts": frozenset({"mixtral", "gpt_oss"}),
    "num_experts": _QWEN_MOE,
    "n_routed_experts": frozenset({"deepseek_v2", "deepseek_v3", "glm4_moe"}),
    "moe_intermediate_size": _EXPERT_OWNERS["moe_intermediate_size"],
    "shared_expert_intermediate_size": _EXPERT_OWNERS["shared_expert_intermediate_size"],
    "n_shared_experts": frozenset({"deepseek_v3", "glm4_moe"}),
    "first_k_dense_replace": _EXPERT_OWNERS["first_k_dense_replace"],
    "moe_layer_freq": _EXPERT_OWNERS["moe_layer_freq"],
    "decoder_sparse_step": _EXPERT_OWNERS["decoder_sparse_step"],
    **dict.fromkeys(
        ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), _DEEPSEEK_LIKE
    ),
    "max_window_layers": frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}),
    "sliding_window_pattern": frozenset({"gemma3_text"}),
    "_sliding_window_pattern": frozenset({"gemma3_text"}),
}


def _least(key: str, floor: int) -> int:
    """The least value `key` takes: 1 for the model's `_REQUIRED` sizes, else `floor`."""
    return 1 if key in _REQUIRED else floor


def _kind(least: int) -> str:
    return "positive" if least else "non-negative"


def _integer_problems(config: Mapping[str, Any], family: str | None, where: str) -> list[str]:
    """Every key of `_INTEGERS` whose value is no non-negative integer (no positive one for
    the model's `_REQUIRED` sizes: a model of 0 layers, heads or hidden width, or with an
    empty vocabulary, is none), and every null the file's class takes no None for
    (`_NO_NULL`), so a file with several gets them all at once (`_translate` stops at its
    first problem, since later keys are read in the light of earlier ones; an audit, m366: a
    0 there was said only once the file's negative values were mended). `family` is the
    file's model_type when budget reads it, else None."""
    problems = []
    for keys, floor in ((_INTEGERS, 0), (_POSITIVE, 1)):
        for key in keys:
            value, least = config.get(key), _least(key, floor)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                problems.append(
                    f"{key} = {_dumps(value)} in {where} is not a {_kind(least)} integer"
                )
    for key, families in _NO_NULL.items():
        if key not in config or config[key] is not None:
            continue
        if key in _REQUIRED or (family is not None and (families is None or family in families)):
            kind = _kind(1 if key in _PERIOD_KEYS else _least(key, 0))
            problems.append(f"{key} = null in {where} is not a {kind} integer")
    return problems


def _top_k_problems(config: Mapping[str, Any], family: str | None, where: str) -> list[str]:
    """A null top-k beside an expert count, in a file whose family routes (`_experts`), which
    no class can route by; `config` has its class's defaults."""
    count_key = next((k for k in _COUNT_KEYS if config.get(k)), None)
    if count_key is None or (family is not None and family not in _MOE):
        return []  # no experts, or refused whole (`_experts`)
    # what save_pretrained writes for DeepseekV2Config's default, None: its router, as any
    # class's, cannot route with it
    return [
        f"{top_k} = null in {where}, beside {count_key}: give the number of experts each "
        "token is routed to"
        for top_k in ("num_experts_per_tok", "experts_per_token")
        if top_k in config and config[top_k] is None
    ]


# the keys `_translate` reads as switches (`_switch`): true, false or null
_SWITCHES = (
    "tie_word_embeddings",
    "attention_bias",
    "bias",
    "mlp_bias",
    "qkv_bias",
    "lm_head_bias",
    "use_bidirectional_attention",
    "use_qk_norm",
    "use_sliding_window",
)


def _kind_problems(config: Mapping[str, Any], where: str) -> list[str]:
    """Every switch that is not true, false or null, the activation if it is not one
    budget prices, every dropout probability outside 0 to 1 and a quantization_config that
    is not an object, as `_translate` would
    say each (it stops at the first), so that a file with several gets them all at once."""
    problems = [
        f"{key} = {_dumps(config[key])} in {where} is not true or false"
        for key in _SWITCHES
        if config.get(key) is not None and not isinstance(config[key], bool)
    ]
    act_key = "hidden_activation" if config.get("hidden_activation") else "hidden_act"
    act = config.get(act_key, "silu")  # left out: the class's default, which is priced
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        problems.append(_activation_problem(act_key, act, where))
    for key in _DROPOUTS:
        value = config.get(key) or 0.0
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            problems.append(_probability_problem(key, value, where))
    quant = config.get("quantization_config")
    if quant is not None and not isinstance(quant, Mapping):  # "fp8" is no quant_method
        problems.append(_quantization_problem(quant, where))
    # the lists of layers, whose problems `_translate` meets only after the file's others
    # (an audit, m447: a bad decoder_sparse_step hid a bad mlp_only_layers, and the reverse
    # a layer_types of kinds not priced)
    lists = (
        _layer_list_problem(config, "mlp_only_layers", where),
        _layer_types_problem(config, where),
    )
    problems += [p for p in lists if p is not None]
    # keys read but priced by none of their values, which must still be what the class
    # takes (an audit, m396: rms_norm_eps -1 and max_position_embeddings [1, 2] read)
    for key in _EPSILONS:
        value = config.get(key)
        if value is not None and not _positive_number(value):
            problems.append(f"{key} = {_shown(value)} in {where} is not a positive number")
    for key in _LENGTHS:
        value = config.get(key)
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and not (whole and value >= 1):
            problems.append(f"{key} = {_shown(value)} in {where} is not a positive integer")
    return problems


_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
_LENGTHS = ("max_position_embeddings", "original_max_position_embeddings")


def _positive_number(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )


def _shown(value: Any) -> str:
    """`value` as JSON writes it, a number as the file wrote it (`_dumps`; review m497:
    max_position_embeddings = 8.192e3 was quoted 8192.0), cut to 40 characters."""
    shown = _dumps(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _quantization_problem(quant: Any, where: str) -> str:
    return (
        f"quantization_config = {_shown(quant)} in {where} is not an object; transformers writes a "
        'mapping such as {"quant_method": "fp8", ...}: give that, or delete the key to budget '
        "the weights in precision.params' format"
    )


def _activation_problem(key: str, act: Any, where: str) -> str:
    return (
        f"{key} = {_dumps(act)} in {where} is not one of "
        f"{', '.join(sorted(_ACTIVATIONS))}, the gated MLPs budget prices; write the "
        "model's dimensions out for another"
    )


def _probability_problem(key: str, value: Any, where: str) -> str:
    return f"{key} = {_dumps(value)} in {where} is not a probability from 0 to 1"


def _derived_head_dim(tree: dict[str, Any], where: str) -> None:
    """InternLM2Attention sets head_dim to hidden_size // num_attention_heads and refuses a
    hidden size the heads do not divide (modeling_internlm2.py), never reading head_dim: a
    file's other head_dim would size an attention the model does not build (an audit: 32
    for 64 halved the attention's weights)."""
    hidden, heads = tree["hidden"], tree["heads"]
    if heads and hidden % heads:
        raise HfConfigError(
            f"hidden_size = {hidden} in {where} is not divisible by num_attention_heads = "
            f"{heads}, which InternLM2Attention refuses; correct one of them"
        )
    if "head_dim" in tree and heads and tree["head_dim"] != hidden // heads:
        raise HfConfigError(
            f'head_dim = {tree["head_dim"]} in {where}: model_type "internlm2"\'s class does '
            f"not read it (InternLM2Attention takes hidden_size / num_attention_heads = "
            f"{hidden // heads}); remove it, or correct model_type"
        )


def _translate(config: Mapping[str, Any], where: str) -> HfModel:
    """`translate` past the unknown keys: the first problem it meets ends it."""
    family = config.get("model_type")  # one of FAMILIES, or None (`_check`)
    config = _with_class_defaults(config, family)  # with every `_REQUIRED` key (`_check`)
    layers = _int(config, "num_hidden_layers", where)  # before `_window` lists its layers
    window = _window(config, _source(config, "sliding_window", "sliding_window_size", where), where)
    tree: dict[str, Any] = {
        "layers": layers,
        "hidden": _int(config, "hidden_size", where),
        "heads": _int(config, "num_attention_heads", where),
        "vocab": _int(config, "vocab_size", where),
        "position": "rope",
        "attention": "flash",
        # transformers.PretrainedConfig defaults tie_word_embeddings to true
        "tied_embeddings": _switch(config, "tie_word_embeddings", where, default=True),
        # the attention's biases (InternLM2 calls them bias); the MLP's are mlp_bias's
        "bias": _switch(config, "attention_bias", where) or _switch(config, "bias", where),
    }
    # gpt-oss's experts and router always have biases: its classes never read mlp_bias
    mlp_bias = family in _MLP_BIAS or _switch(config, "mlp_bias", where)
    if family == "qwen2":  # Qwen2Attention: q, k and v only, always
        tree["qkv_bias"] = True
    elif family == "qwen2_moe":  # Qwen2MoeAttention: its qkv_bias, true
        tree["qkv_bias"] = _switch(config, "qkv_bias", where, default=True)
    elif config.get("model_type") in _GLM:
        # GlmAttention, Glm4Attention and Glm4MoeAttention: attention_bias on q, k and v
        tree["qkv_bias"], tree["bias"] = tree["bias"], False
    tree["mlp_bias"] = mlp_bias  # always: an override of `bias` must not move the MLP's
    if family != "qwen2_moe" and _switch(config, "qkv_bias", where):  # a hand-written file's
        tree["qkv_bias"] = True
    if _switch(config, "lm_head_bias", where):
        raise HfConfigError(
            f"{where} sets lm_head_bias: budget counts no bias on the output layer; write the "
            "model's dimensions out to budget the model without it"
        )
    if _switch(config, "use_bidirectional_attention", where):
        raise HfConfigError(
            f"{where} sets use_bidirectional_attention: an encoder (EmbeddingGemma) attends "
            "both ways and generates nothing; budget prices decoders, whose attention is causal"
        )
    if any(_probability(config, k, where) for k in _DROPOUTS):
        tree["dropout"] = True
    if config.get("model_type") in _SANDWICH:
        tree["sandwich_norm"] = True
    if config.get("model_type") == "gpt_oss":  # GptOssAttention: a sink logit per head
        tree["attention_sinks"] = True
    qk_norm = _QK_NORMS.get(str(config.get("model_type")), "none")
    if _switch(config, "use_qk_norm", where):
        qk_norm = "per_head"
    if qk_norm != "none":
        tree["qk_norm"] = qk_norm
    for key, name in (
        ("final_logit_softcapping", "logit_softcap"),
        ("attn_logit_softcapping", "attention_softcap"),
    ):
        cap = config.get(key)
        # a class that does not read the key builds no cap whatever it holds (its set values
        # are refused, `_foreign_problems`; a review: a Llama file's 0 was told to be positive)
        if cap is None or (family is not None and family not in _OWNERS[key]):
            continue
        if isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0:
            raise HfConfigError(
                f"{key} = {_dumps(cap)} in {where} is not a positive number; set the cap, "
                "or null for none"
            )
        tree[name] = True
    for key, name in (
        ("num_key_value_heads", "kv_heads"),
        ("intermediate_size", "ffn"),
        ("head_dim", "head_dim"),
    ):
        if config.get(key) is not None:
            tree[name] = _int(config, key, where)
    if family == "internlm2":
        _derived_head_dim(tree, where)
    if config.get("kv_lora_rank"):
        _latent(config, tree, where)
    elif "head_dim" not in tree and config.get("v_head_dim") is not None:
        tree["head_dim"] = _int(config, "v_head_dim", where)
    if not config.get("kv_lora_rank") and config.get("qk_head_dim") is not None:
        head = tree.get("head_dim", tree["hidden"] // max(tree["heads"], 1))
        if _int(config, "qk_head_dim", where) != head:
            raise HfConfigError(
                f"{where} sets qk_head_dim = {_dumps(config['qk_head_dim'])}, but its heads "
                f"are {head} wide; make them agree"
            )
    act_key = "hidden_activation" if config.get("hidden_activation") else "hidden_act"
    act = config.get(act_key, "silu")
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        raise HfConfigError(_activation_problem(act_key, act, where))
    tree["mlp"] = _ACTIVATIONS[act]
    # every class of FAMILIES builds RMSNorm, whatever epsilon key a file carries (an audit:
    # a Mistral file with layer_norm_eps read as LayerNorm); a file written by hand (no
    # model_type) says LayerNorm by naming its epsilon so
    layer_norm = "layer_norm_eps" in config or "layer_norm_epsilon" in config
    tree["norm"] = "layernorm" if layer_norm and family is None else "rmsnorm"
    experts = _experts(config, tree["layers"], where)  # refused where the family has none
    if experts is not None:
        tree["experts"] = experts
    if config.get("num_nextn_predict_layers"):
        tree["mtp_layers"] = _int(config, "num_nextn_predict_layers", where)
    if window is not None:
        tree["sliding_window"] = window
    ignored = tuple(sorted(set(config) & IGNORED))
    return HfModel(tree, ignored, _quantized(config, where))


def _quantized(config: Mapping[str, Any], where: str) -> str | None:
    """The weights' format a ``quantization_config`` announces, fp8 for the methods that
    store 8-bit floating-point weights: ``fp8`` (DeepSeek-V3's and Kimi K2's block-scaled
    e4m3), ``fbgemm_fp8`` (transformers' ``FbgemmFp8Config``, Meta's Llama 3.1 405B FP8) and
    ``compressed-tensors`` whose every group's weights are 8-bit floats (llm-compressor's
    ``float-quantized`` format: ``config_groups.*.weights``, ``num_bits: 8``, ``type:
    float``), unless it keeps some of the blocks' layers in bf16 (`_kept_out`), which one
    weight format cannot price. budget prices no other format (int4, mxfp4 and their
    scales), so those are refused rather than budgeted as bf16."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, Mapping):  # refused before (`_kind_problems`)
        raise HfConfigError(_quantization_problem(quant, where))
    method = quant.get("quant_method")
    if method in ("fp8", "fbgemm_fp8") or (
        method == "compressed-tensors" and _float8_groups(quant)
    ):
        kept = _kept_out(quant, where)
        if kept:
            one = len(kept) == 1
            raise HfConfigError(
                f"quantization_config in {where} keeps {len(kept)} module"
                f"{'' if one else 's'} of the blocks out of fp8 ({kept[0]}"
                f"{'' if one else ', ...'}), and budget prices every block's linear layers "
                "in one format; delete quantization_config to budget them in bf16, or write "
                "precision.params: fp8 to budget them all in fp8 (fewer bytes than the "
                "checkpoint holds)"
            )
        return "fp8"
    raise HfConfigError(
        f"quantization_config.quant_method = {_dumps(method)} in {where} stores weights in "
        "a format budget does not price (it prices bf16 and fp8 weights); delete "
        "quantization_config to budget the weights in precision.params' format (bf16 unless "
        "the plan names another)"
    )


# Modules an fp8 checkpoint may leave in bf16 that the budget keeps so anyway or that weigh
# nothing: the embedding and output layer (`flops.VOCAB_WEIGHT_BYTES`) and MoE routers; and
# any norm (a name ending in "norm": input_layernorm, q_norm, ...), which no fp8 config
# converts, transformers' `_replace_with_fp8_linear` (integrations/finegrained_fp8.py)
# replacing linear layers alone (Qwen3-Coder-480B-A35B-Instruct-FP8 lists each layer's two
# norms; an audit, m372: the release was refused)
_KEPT_ANYWAY = ("lm_head", "embed_tokens", "gate", "shared_expert_gate", "router")


def _kept_out(quant: Mapping[str, Any], where: str) -> list[str]:
    """The modules an fp8 ``quantization_config`` leaves unquantized (``modules_to_not_convert``
    of transformers' fp8 configs, ``ignore`` of compressed-tensors'; a name or a ``re:``
    pattern) beyond those the budget keeps in bf16 anyway and the norms (`_KEPT_ANYWAY`).
    Either, where given, is a list of names (an audit: a bare string was passed over, its
    module budgeted in fp8)."""
    lists = [quant.get(key) for key in ("modules_to_not_convert", "ignore")]
    for key, value in zip(("modules_to_not_convert", "ignore"), lists, strict=True):
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(n, str) for n in value)
        ):
            raise HfConfigError(
                f"quantization_config.{key} = {_shown(value)} in {where} is not a list of "
                "module names"
            )
    names = [str(n) for names in lists if isinstance(names, list) for n in names]
    last = [n.removeprefix("re:").rstrip("$").split(".")[-1] for n in names]
    return [
        n
        for n, module in zip(names, last, strict=True)
        if module not in _KEPT_ANYWAY and not module.endswith("norm")
    ]


def _float8_groups(quant: Mapping[str, Any]) -> bool:
    """Whether the quantization groups of a compressed-tensors config store every linear
    layer's weights as 8-bit floats (``targets: [Linear]``; a group that targets some layers
    by pattern leaves the rest in bf16, which one weight format cannot price)."""
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return False

    def float8(group: Any) -> bool:  # every linear layer, its weights in 8-bit floats
        w = group.get("weights") if isinstance(group, Mapping) else None
        return (
            group.get("targets") == ["Linear"]
            and isinstance(w, Mapping)
            and w.get("num_bits") == 8
            and w.get("type") == "float"
        )

    return all(float8(g) for g in groups.values())


_DROPOUTS = ("attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop")


def _probability(config: Mapping[str, Any], key: str, where: str) -> float:
    value = config.get(key) or 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise HfConfigError(_probability_problem(key, value, where))
    return float(value)


def _source(config: Mapping[str, Any], key: str, copy: str, where: str) -> str:
    """The key to read `key`'s value from: `key`, or `copy` (a second key some files write
    for the same value) when `key` is absent; the two must agree when both are there."""
    if copy not in config:
        return key
    if key in config and config[key] != config[copy]:
        raise HfConfigError(
            f"{where} sets {key} = {_dumps(config[key])} but its copy {copy} = "
            f"{_dumps(config[copy])}; make them agree"
        )
    return copy if key not in config else key


# Q/K norms no key announces, by the model class a model_type builds (module docstring)
_QK_NORMS = {
    "qwen3": "per_head",
    "qwen3_moe": "per_head",
    "gemma3_text": "per_head",
    "olmo2": "full_width",
    "olmo3": "full_width",
}
# the model classes whose layers the reader knows, each from its transformers modelling
# file (and its tests' config.json): anything else may build what no key says
FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "granite",
        "olmo2",
        "olmo3",
        "deepseek_v2",
        "deepseek_v3",
        "kimi_k2",
        "glm",
        "glm4",
        "glm4_moe",
        "gpt_oss",
        "internlm2",
    }
)
# What each class's __init__ gives a key the file leaves out, where that is a value rather
# than a rule the reader already applies (kv heads = heads, head_dim = hidden / heads, a
# config's sliding window: `_DEFAULT_WINDOWS`). Read in transformers 5.24.0's
# ``models/<family>/configuration_<family>.py`` (each class built with no arguments, the
# same in 4.57.6); kimi_k2 and internlm2 are remote code: DeepSeek-V3's
# ``configuration_deepseek.py``, whose class Kimi K2's file declares, and InternLM's
# ``configuration_internlm2.py`` (its copy in InternLM/xtuner at 98c193e).
_LLAMA_LIKE = {"hidden_act": "silu", "tie_word_embeddings": False}


def _dims(hidden: int, layers: int, heads: int) -> dict[str, int]:
    """A class's default width, depth and heads: a text_config saved beside a vision
    encoder leaves out the ones equal to them (Gemma 3 4B's has no num_attention_heads,
    Gemma3TextConfig's 8; an audit found it refused as lacking them). Read in transformers'
    ``configuration_<family>.py`` at 008e574 (Llama, Mixtral, Qwen 2 and 3 and their MoE,
    Gemma 1 and 2, Phi-3, Granite, OLMo 2 and 3, DeepSeek-V2, GLM and GLM-4), 001f85b
    (Mistral, DeepSeek-V3, whose class Kimi K2 declares), 02b8f42 (gpt-oss), 008f5c8
    (Gemma 3) and 008c726 (GLM-4.5's Glm4Moe); InternLM2's from InternLM2Config as
    sgl-project/sglang copies it (b87b167)."""
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads}


_GEMMA = {"head_dim": 256, "tie_word_embeddings": True, "attention_bias": False}
_DEEPSEEK = {
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
_DEEPSEEK_V3 = {
    **_dims(7168, 61, 128),
    **_LLAMA_LIKE,
    **_DEEPSEEK,
    "vocab_size": 129280,
    "intermediate_size": 18432,
    "num_key_value_heads": 128,
    "attention_bias": False,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
}
_GLM_DENSE = {
    **_dims(4096, 40, 32),
    **_LLAMA_LIKE,
    "vocab_size": 151552,
    "intermediate_size": 13696,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "attention_bias": True,
}
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 32000,
        "intermediate_size": 11008,
    },
    "mistral": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
    },
    "mixtral": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 32000,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen2": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
    },
    "qwen2_moe": {
        **_dims(2048, 24, 16),
        **_LLAMA_LIKE,
        "vocab_size": 151936,
        "intermediate_size": 5632,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
    },
    "qwen3": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "head_dim": 128,
    },
    "qwen3_moe": {
        **_dims(2048, 24, 32),
        **_LLAMA_LIKE,
        "vocab_size": 151936,
        "intermediate_size": 6144,
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
    },
    "gemma": {
        **_dims(3072, 28, 16),
        **_GEMMA,
        "vocab_size": 256000,
        "intermediate_size": 24576,
        "num_key_value_heads": 16,
        "hidden_act": "gelu_pytorch_tanh",
    },
    "gemma2": {
        **_dims(2304, 26, 8),
        **_GEMMA,
        "vocab_size": 256000,
        "intermediate_size": 9216,
        "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma3_text": {
        **_dims(2304, 26, 8),
        **_GEMMA,
        "vocab_size": 262208,
        "intermediate_size": 9216,
        "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "phi3": {**_dims(3072, 32, 32), **_LLAMA_LIKE, "vocab_size": 32064, "intermediate_size": 8192},
    "granite": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 32000,
        "intermediate_size": 11008,
    },
    "olmo2": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 50304,
        "intermediate_size": 11008,
    },
    "olmo3": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 50304,
        "intermediate_size": 11008,
    },
    "deepseek_v2": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        **_DEEPSEEK,
        "vocab_size": 32000,  # DeepseekV2Config's (an audit: 102,400, DeepSeek's own file's)
        "intermediate_size": 11008,
        "n_routed_experts": 64,
        "moe_intermediate_size": 1407,
        "n_shared_experts": 2,
    },
    "deepseek_v3": _DEEPSEEK_V3,
    "kimi_k2": _DEEPSEEK_V3,
    "glm": _GLM_DENSE,
    "glm4": _GLM_DENSE,
    "glm4_moe": {
        **_dims(4096, 46, 96),
        **_LLAMA_LIKE,
        "vocab_size": 151552,
        "intermediate_size": 10944,
        "num_key_value_heads": 8,
        "n_routed_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 1408,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
    },
    "gpt_oss": {
        **_dims(2880, 36, 64),
        **_LLAMA_LIKE,
        "vocab_size": 201088,
        "intermediate_size": 2880,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "attention_bias": True,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
    },
    "internlm2": {
        **_dims(4096, 32, 32),
        **_LLAMA_LIKE,
        "vocab_size": 103168,
        "intermediate_size": 11008,
        "bias": True,
    },
}
# keys that name one quantity: a default of one is not added beside another the file sets
# the expert count's names, in the order the reader takes the first one set (`_experts`)
_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_ALIASES = (
    frozenset(_COUNT_KEYS),
    frozenset({"num_experts_per_tok", "experts_per_token"}),
)


def _with_class_defaults(config: Mapping[str, Any], family: str | None) -> Mapping[str, Any]:
    """`config` with its class's default for each key it leaves out (`CLASS_DEFAULTS`)."""
    defaults = CLASS_DEFAULTS.get(family or "", {})
    given = set(config)
    for group in _ALIASES:
        if given & group:
            given |= group
    added = {k: v for k, v in defaults.items() if k not in given}
    return {**config, **added} if added else config


# families whose transformers class builds experts from the config's expert keys; the others
# ignore such keys (LlamaForCausalLM with num_local_experts is still dense)
_MOE = frozenset(
    {
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "deepseek_v2",
        "deepseek_v3",
        "kimi_k2",
        "glm4_moe",
        "gpt_oss",
    }
)
_SANDWICH = ("gemma2", "gemma3_text", "glm4")  # a norm after each block too (docstring)
_GLM = ("glm", "glm4", "glm4_moe")  # attention_bias on q, k and v only
_MLP_BIAS = ("gpt_oss",)  # GptOssExperts and GptOssTopKRouter: biases with no key saying so
_QWEN = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # slide only with use_sliding_window
# families whose attention can slide (transformers' Mistral, Mixtral, Qwen 2 and 3, Gemma 2
# and 3, Phi-3, gpt-oss and OLMo 3 attention classes pass the config's window to the kernel)
# MistralAttention's families: every layer slides where sliding_window is set, none where not
_MISTRAL = ("mistral", "mixtral")
_SLIDES = (*_MISTRAL, *_QWEN, "gemma2", "gemma3_text", "phi3", "gpt_oss", "olmo3")
# without layer_types: every period-th layer attends to the whole context (Gemma2Config,
# GptOssConfig: (i + 1) % 2; Gemma3TextConfig: (i + 1) % sliding_window_pattern, 6;
# Olmo3Config: (i + 1) % 4, with a window of 4,096 when the file gives none)
_PERIODS = {"gemma2": 2, "gpt_oss": 2, "gemma3_text": 6, "olmo3": 4}
# the window a config class slides at when its file has no sliding_window key (MistralConfig,
# Qwen2Config, Qwen3Config, Gemma2Config, Gemma3TextConfig, Olmo3Config: 4,096;
# GptOssConfig: 128); Mixtral and Phi-3 default to none
_DEFAULT_WINDOWS = {
    "mistral": 4096,
    "qwen2": 4096,
    "qwen3": 4096,
    "gemma2": 4096,
    "gemma3_text": 4096,
    "olmo3": 4096,
    "gpt_oss": 128,
}
_MAX_LAYERS = 4096  # plan.schema.json's maximum for model.layers


def _window(config: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    """``model.sliding_window`` (module docstring): the window's length and which layers
    slide, or None when none does; `key` is where the file keeps the window's length."""
    layers = config["num_hidden_layers"]  # a non-negative integer (`translate`)
    # the plan schema refuses more layers than that; list none for such a file
    count = layers if layers <= _MAX_LAYERS else 0
    kinds = config.get("layer_types")
    family = config.get("model_type")
    if key not in config and family in _DEFAULT_WINDOWS:  # the config class's own default
        config = {**config, key: _DEFAULT_WINDOWS[str(family)]}
    qwen_off = family in _QWEN and not _switch(config, "use_sliding_window", where)
    if kinds is not None:
        problem = _layer_types_problem(config, where)
        if problem is not None:
            raise HfConfigError(problem)
        if family in _MISTRAL and config.get(key) and "full_attention" in kinds:
            raise HfConfigError(
                f"{where} gives full_attention layers in layer_types beside a window, but "
                f"MistralAttention (model_type {_dumps(family)}) slides every layer "
                "whatever layer_types says in the transformers budget reads, and which ones "
                "slide is not one rule across its releases; give every layer one kind (or "
                "sliding_window null for none), or write the model's dimensions out"
            )
        if "sliding_attention" not in kinds or qwen_off:  # Qwen3Config: no window unless
            return None  # use_sliding_window, whatever layer_types says
        if family is not None and family not in _SLIDES:  # as sliding_window is, below
            raise HfConfigError(
                f"{where} lists sliding_attention layers in layer_types, but model_type "
                f"{_dumps(family)} builds no sliding-window attention in transformers; "
                "make them full_attention (an audit: Llama read 40 sliding layers)"
            )
        flags = [k == "sliding_attention" for k in kinds]
    elif not config.get(key):
        return None
    elif family is not None and family not in _SLIDES:
        raise HfConfigError(
            f"{where} sets {key} = {_dumps(config.get(key))}, but model_type "
            f"{_dumps(family)} builds no sliding-window attention in transformers; remove "
            "it (or set it to null)"
        )
    elif family in _QWEN:
        if qwen_off:
            return None
        if family in ("qwen2_moe", "qwen3_moe"):
            raise HfConfigError(
                f"{where} turns use_sliding_window on without layer_types: which layers of "
                f"model_type {_dumps(family)} slide then is not one rule across "
                "transformers releases; give layer_types (one kind per layer)"
            )
        first = _optional(config, "max_window_layers", where, 28)  # Qwen2/3Config's default
        flags = [i >= first for i in range(count)]
        if not any(flags):
            return None
    elif family is None and config.get("use_sliding_window", True) is False:
        return None  # a file without model_type, written by hand, says it has none
    else:
        # the layer kinds the config class builds without layer_types: Gemma 2 and gpt-oss
        # alternate, sliding first; Gemma 3 keeps every sliding_window_pattern-th layer
        # full (6 by default); the other families slide on every layer
        period = _PERIODS.get(str(family), 0)
        if family == "gemma3_text":
            pattern = _source(config, "sliding_window_pattern", "_sliding_window_pattern", where)
            period = _optional(config, pattern, where, period, least=1)
        flags = [not period or (i + 1) % period != 0 for i in range(count)]
    window = config.get(key)
    if window is None and family in _MISTRAL:  # MistralModel: a causal mask
        return None  # where sliding_window is None, whatever layer_types says (a review)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise HfConfigError(
            f"{where} has sliding layers but {key} = {_dumps(window)} is not a positive "
            "number of tokens; set the window's length, or null for no window"
        )
    if family is not None and family not in _QWEN and config.get("use_sliding_window") is False:
        # MistralConfig, Phi3Config, Gemma2Config and the rest have no such key: the model
        # slides as above whatever it says (an audit: Mistral 7B's KV cache read 5 GiB, not 1)
        raise HfConfigError(
            _unread(
                "use_sliding_window",
                False,
                family,
                where,
                "only the qwen2, qwen2_moe, qwen3 and qwen3_moe classes read it",
            )
        )
    if all(flags):
        return {"size": window}
    return {"size": window, "layers": flags}


def _latent(config: Mapping[str, Any], tree: dict[str, Any], where: str) -> None:
    """DeepSeek's multi-head latent attention (``configuration_deepseek.py``): head_dim is
    the value head dimension, and every head has its own key and value."""
    missing = [k for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if k not in config]
    if missing:
        raise HfConfigError(f"{where} sets kv_lora_rank but lacks {', '.join(missing)}")
    tree["head_dim"] = _int(config, "v_head_dim", where)
    tree.pop("kv_heads", None)  # num_key_value_heads equals the heads under MLA
    nope, rope = _int(config, "qk_nope_head_dim", where), _int(config, "qk_rope_head_dim", where)
    if config.get("qk_head_dim") is not None and _int(config, "qk_head_dim", where) != nope + rope:
        raise HfConfigError(
            f"{where} sets qk_head_dim = {_dumps(config['qk_head_dim'])}, but "
            f"qk_nope_head_dim + qk_rope_head_dim = {nope + rope}; make them agree"
        )
    tree["mla"] = {
        "q_rank": _int(config, "q_lora_rank", where) if config.get("q_lora_rank") else 0,
        "kv_rank": _int(config, "kv_lora_rank", where),
        "nope_dim": _int(config, "qk_nope_head_dim", where),
        "rope_dim": _int(config, "qk_rope_head_dim", where),
    }


def _experts(config: Mapping[str, Any], layers: int, where: str) -> dict[str, Any] | None:
    family = config.get("model_type")
    # num_experts too, which the reader takes as Mixtral's and DeepSeek's count (a review)
    counts = [k for k in _COUNT_KEYS if k != "num_experts" or family not in _QWEN_MOE]
    # 0, 0.0 or false alike (a review: typed as an int only, 0.0 was read as dense again)
    zero = next((k for k in counts if config.get(k) is not None and config[k] == 0), None)
    if zero is not None and family in _MOE:
        # a router over no experts, which these classes still build (Qwen-MoE's alone
        # read num_experts 0 as dense layers): an audit read Mixtral-8x22B with
        # num_local_experts 0 as a dense model of 22.2 billion parameters
        raise HfConfigError(
            f"{zero} = {_dumps(config[zero])} in {where}: model_type "
            f"{_dumps(family)} routes each MoE "
            "layer's tokens among its experts, and none is given; give their number"
        )
    count_key = next(
        (k for k in _COUNT_KEYS if config.get(k)),
        None,
    )
    if count_key is None:
        return None
    if family is not None and family not in _MOE:
        raise HfConfigError(
            f"{where} has expert keys, but model_type {_dumps(family)} builds no mixture "
            "of experts in transformers (its class ignores them, and so would the model); "
            "remove them"
        )
    top_k = _source(config, "num_experts_per_tok", "experts_per_token", where)
    if top_k not in config:  # a null one is refused before (`_top_k_problems`)
        owner = f"model_type {_dumps(family)}" if family else "a file without model_type"
        raise HfConfigError(
            f"{where} sets {count_key} but not num_experts_per_tok, and {owner} has no "
            "default for it: give the number of experts each token is routed to"
        )
    experts: dict[str, Any] = {
        "count": _int(config, count_key, where),
        "top_k": _int(config, top_k, where),
    }
    # a 0 too, which the model's own check refuses (an audit, m396: read as absent, the
    # experts took the dense intermediate_size, DeepSeek-V3 at 5.9 trillion parameters;
    # transformers' expert MLPs take the dense width only for None)
    if config.get("moe_intermediate_size") is not None:
        experts["ffn"] = _int(config, "moe_intermediate_size", where)
    if config.get("shared_expert_intermediate_size"):
        experts["shared_ffn"] = _int(config, "shared_expert_intermediate_size", where)
        experts["shared_gate"] = True  # Qwen2-MoE's shared_expert_gate
    if config.get("n_shared_experts"):
        width = (
            experts["ffn"] if "ffn" in experts else _optional(config, "intermediate_size", where, 0)
        )
        experts["shared_ffn"] = _int(config, "n_shared_experts", where) * width
    first = _optional(config, "first_k_dense_replace", where, 0)
    freq = _optional(config, "moe_layer_freq", where, 1, least=1)
    if freq != 1:
        raise HfConfigError(
            f"moe_layer_freq = {freq} in {where}: DeepSeek's own modeling code makes one "
            f"layer in {freq} from first_k_dense_replace on an MoE layer, but transformers' "
            f"class for model_type {_dumps(config.get('model_type'))} ignores the key "
            "and makes every one MoE (an audit); the two build different models, so budget "
            "reads neither. Every released file sets 1; write the model's dimensions out"
        )
    step = _optional(config, "decoder_sparse_step", where, 1, least=1)
    dense_only = _layer_list(config, "mlp_only_layers", where)
    if freq == 1 and step == 1 and not dense_only:
        if first:
            experts["first_dense_layers"] = first
        return experts
    if layers > _MAX_LAYERS:  # refused as model.layers, before a list of them is built (an
        return experts  # audit, m396: 10^7 layers in a 1 KB file ran past 20 s)
    experts["pattern"] = [
        i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
        for i in range(layers)
    ]
    # every layer dense (mlp_only_layers listing them all): transformers builds a dense
    # model, as budget reads one, where a written pattern of no MoE layer is refused (review
    # m493: such a config, read dense before, was refused with a hint at a pattern it never
    # wrote)
    return experts if any(experts["pattern"]) else None
