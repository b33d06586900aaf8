"""Model presets: dimensions in the plan language's own keys (`model:` in a plan).

A preset is the tree a person would have written under `model:`; the plan's own keys next to
`preset:` override it, and `budget.plan.resolve` builds the `Model` from the merge exactly as
from a hand-written section. DeepSeek-V3's multi-head latent attention is written out in
``mla:``; its multi-token prediction module is ``mtp_layers: 1``, whose parameters a report
counts apart from the 671 B, as the model card does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MODELS", "ModelPreset"]


@dataclass(frozen=True, slots=True)
class ModelPreset:
    name: str
    tree: dict[str, Any]
    source: str
    # the released checkpoint's weight format where it is quantized: what a serving plan
    # keeps them in unless it writes precision.params, as an hf_config of the same release
    # does (`budget.plan.resolve`); a format budget does not price (mxfp4) makes a serving
    # plan write precision.params, as hf_config refuses the release; None for a bf16 release
    weights: str | None = None


_LLAMA3 = {
    "mlp": "swiglu",
    "norm": "rmsnorm",
    "bias": False,
    "tied_embeddings": False,
    "position": "rope",
    "attention": "flash",
    "vocab": 128256,  # released tokenizer: 128,000 tokens + 256 special (config vocab_size)
}
_LLAMA3_SOURCE = (
    'Llama Team, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 3 (layers, model '
    "dimension, FFN dimension, attention and key/value heads); vocabulary, RMSNorm and "
    "untied embeddings from the released config.json (meta-llama/Meta-Llama-3*)"
)

MODELS: dict[str, ModelPreset] = {
    "gpt3-175b": ModelPreset(
        "gpt3-175b",
        {
            "layers": 96,
            "hidden": 12288,
            "heads": 96,
            "vocab": 51200,  # GPT-2's 50,257 BPE tokens padded as Megatron-LM pads them
            "mlp": "gelu",
            "norm": "layernorm",
            "bias": True,
            "tied_embeddings": True,
            "position": "learned",
            "max_positions": 2048,
            "attention": "flash",
        },
        'Brown et al., "Language Models are Few-Shot Learners" (arXiv 2005.14165), Table '
        "2.1: 96 layers, d_model 12288, 96 heads of 128, context 2048; section 2.1: GPT-2's "
        "architecture (Radford et al. 2019: learned positions, LayerNorm, biases, a 4 x "
        "d_model GeLU MLP, an output layer tied to the embedding, a 50,257-token BPE "
        "vocabulary, here padded to 51,200 as Megatron-LM pads it for tp 8); dense "
        "attention in every layer, as Megatron-LM's GPT-3 runs (Narayanan et al., arXiv "
        "2104.04473) train it: section 2.1's alternating locally banded sparse layers give "
        "no band width",
    ),
    "llama3-8b": ModelPreset(
        "llama3-8b",
        {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, **_LLAMA3},
        _LLAMA3_SOURCE,
    ),
    "llama3-70b": ModelPreset(
        "llama3-70b",
        {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, **_LLAMA3},
        _LLAMA3_SOURCE,
    ),
    "llama3-405b": ModelPreset(
        "llama3-405b",
        {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, **_LLAMA3},
        _LLAMA3_SOURCE,
    ),
    "mixtral-8x7b": ModelPreset(
        "mixtral-8x7b",
        {
            "layers": 32,
            "hidden": 4096,
            "heads": 32,
            "kv_heads": 8,
            "head_dim": 128,
            "ffn": 14336,
            "vocab": 32000,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "tied_embeddings": False,
            "position": "rope",
            "experts": {"count": 8, "top_k": 2, "ffn": 14336},
        },
        'Jiang et al., "Mixtral of Experts" (arXiv 2401.04088), Table 1: dim 4096, 32 layers, '
        "head_dim 128, hidden_dim 14336, 32 heads, 8 kv heads, vocab 32000, 8 experts, top 2",
    ),
    "mixtral-8x22b": ModelPreset(
        "mixtral-8x22b",
        {
            "layers": 56,
            "hidden": 6144,
            "heads": 48,
            "kv_heads": 8,
            "head_dim": 128,
            "ffn": 16384,
            "vocab": 32768,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "tied_embeddings": False,
            "position": "rope",
            "experts": {"count": 8, "top_k": 2, "ffn": 16384},
        },
        "Mistral AI model card and config.json of mistralai/Mixtral-8x22B-v0.1: hidden_size "
        "6144, intermediate_size 16384, 56 layers, 48 heads, 8 kv heads, vocab 32768, "
        "8 local experts, 2 per token",
    ),
    "deepseek-v3": ModelPreset(
        "deepseek-v3",
        {
            "layers": 61,
            "hidden": 7168,
            "heads": 128,
            # Multi-head latent attention: query latent 1536, key/value latent 512, per-head
            # query/key of 128 + 64 rotary dimensions, value head dimension 128
            "head_dim": 128,
            "mla": {"q_rank": 1536, "kv_rank": 512, "nope_dim": 128, "rope_dim": 64},
            "ffn": 18432,  # the 3 leading dense layers
            "vocab": 129280,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "tied_embeddings": False,
            "position": "rope",
            "experts": {
                "count": 256,
                "top_k": 8,
                "ffn": 2048,
                "shared_ffn": 2048,  # 1 shared expert of width 2048
                "first_dense_layers": 3,
            },
            "mtp_layers": 1,
        },
        'DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), section 4.2: 61 '
        "layers, hidden 7168, 128 heads of 128 (query/key 128 + 64 rotary), KV compression "
        "dimension 512, query compression 1536, first 3 layers dense, 1 shared + 256 routed "
        "experts of width 2048, 8 routed per token; vocab 129,280 and dense FFN 18,432 from "
        "the released config.json. 671B main-model parameters, 37B activated per token; "
        "section 4.2 sets the multi-token prediction depth to 1 (the config's "
        "num_nextn_predict_layers); the model card counts that module apart, 14B of the "
        "685B released, with its own copies of the embedding and output layer it shares; "
        "weights released in fp8 (config.json quantization_config: quant_method fp8, e4m3 "
        "in 128 × 128 blocks; report section 3.3)",
        weights="fp8",
    ),
    "gpt-oss-120b": ModelPreset(
        "gpt-oss-120b",
        {
            "layers": 36,
            "hidden": 2880,
            "heads": 64,
            "kv_heads": 8,
            "head_dim": 64,
            "ffn": 2880,
            "vocab": 201088,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "bias": True,
            "mlp_bias": True,
            "attention_sinks": True,
            "tied_embeddings": False,
            "position": "rope",
            "attention": "flash",
            "experts": {"count": 128, "top_k": 4, "ffn": 2880},
            "sliding_window": {"size": 128, "layers": [i % 2 == 0 for i in range(36)]},
        },
        'OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925), section 2: 36 '
        "layers, residual width 2880, 128 experts of which 4 per token, 64 query heads of 64 "
        "and 8 key/value heads, layers alternating between a 128-token band and full "
        "attention, a learned sink per head; vocabulary 201,088, untied embeddings, "
        "attention biases and the experts' and router's biases from the released "
        "config.json (openai/gpt-oss-120b) and GptOssExperts; 116,829,156,672 parameters, "
        "as transformers counts the released file; its experts' weights released in MXFP4 "
        "(config.json quantization_config: quant_method mxfp4; model card section 2), a "
        "format budget does not price: a serving plan names precision.params",
        weights="mxfp4",
    ),
    "qwen-moe": ModelPreset(
        "qwen-moe",
        {
            "layers": 24,
            "hidden": 2048,
            "heads": 16,
            "kv_heads": 16,
            "ffn": 5632,
            "vocab": 151936,
            "mlp": "swiglu",
            "norm": "rmsnorm",
            "bias": False,
            "qkv_bias": True,
            "tied_embeddings": False,
            "position": "rope",
            "experts": {
                "count": 60,
                "top_k": 4,
                "ffn": 1408,
                "shared_ffn": 5632,
                "shared_gate": True,
            },
        },
        'Qwen Team, "Qwen1.5-MoE: Matching 7B Model Performance with 1/3 Activated '
        'Parameters" (blog, 2024) and config.json of Qwen/Qwen1.5-MoE-A2.7B: 24 layers, '
        "hidden 2048, 16 heads, 60 experts of 1408, top 4, a gated shared expert of 5632; "
        "q, k and v biases (Qwen2MoeAttention)",
    ),
}
