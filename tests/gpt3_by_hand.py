"""GPT-3 175B's first pipeline stage at its peak, by hand, as plans/gpt3-175b.yaml writes it
(tp 8, pp 8, dp 16, sequence parallelism, selective recompute, linear biases, learned
positions): the figures `budget diff` and `budget check` are held to."""

from __future__ import annotations

# GPT-3 175B as plans/gpt3-175b.yaml writes it (linear biases, learned positions), by hand.
H, VOCAB, SEQ = 12288, 51200, 2048


def stage0_params(tp: int) -> int:
    """The first stage's 12 layers (weights and QKV / fc1 biases sharded over tp, the output
    and fc2 biases and both LayerNorms replicated) plus the vocabulary shard and positions."""
    layer = 12 * H * H // tp + 3 * H // tp + H + 4 * H // tp + H + 4 * H
    return 12 * layer + VOCAB * H // tp + SEQ * H


def stage0_states(tp: int, dp: int) -> int:
    """bf16 parameters, fp32 gradients and Adam's 12 bytes sharded over dp (ZeRO 1)."""
    params = stage0_params(tp)
    return 6 * params + 12 * params // dp


def fc1_peak(tp: int) -> bool:
    """Whether stage 0 peaks at the fc1 backward rather than the fc2 one, both in
    backward.mlp. fc1's holds neither spent 2s·4h/t input (fc2's, the GeLU's) but the
    re-gathered input (2sh) and the reduce-scatter's shard of its input gradient (2sh/t)
    beside the rest: 2sh − 14sh/t more than fc2's, so from tp 8 (by 0.25sh, 6,291,456 B)."""
    return 2 * SEQ * H * tp > 14 * SEQ * H


def stage0_activations(tp: int) -> int:
    """Stage 0's saved activations at its peak: Korthikanti et al.'s 34·sbh/t bytes a layer
    (Table 2, TP + SP + selective recompute; s = 2048, b = 1, h = 12288) through its 12
    layers for each of the pp = 8 micro-batches 1F1B keeps in flight on the first stage,
    and each one's 1-byte embedding dropout mask, sbh/t; less the current layer's 1-byte
    MLP dropout mask, sbh/t, which the bias-dropout-add's backward, the MLP block's first,
    has spent; at the fc1 backward less fc2's and the GeLU's inputs too (2 × 2s·4h/t).
    Every term is over t."""
    spent = SEQ * H // tp + (2 * 2 * SEQ * 4 * H // tp if fc1_peak(tp) else 0)
    return 8 * (12 * 34 * SEQ * H // tp + SEQ * H // tp) - spent


def stage0_transients(tp: int) -> int:
    """Stage 0's transients at its peak in backward.mlp. At fc2's gradients: the bf16 output
    gradient all-gathered over tp (2sh) beside its sequence shard (2sh/t), and fc2's input
    gradient (2s·4h/t). At fc1's: the output gradient's shard, the GeLU's input gradient
    (2s·4h/t), the re-gathered fc1 input and its input gradient, partial over tp (2sh
    each), and the reduce-scatter's shard of that (2sh/t)."""
    if fc1_peak(tp):
        return 2 * SEQ * H // tp + 2 * SEQ * 4 * H // tp + 2 * 2 * SEQ * H + 2 * SEQ * H // tp
    return 2 * SEQ * H + 2 * SEQ * H // tp + 2 * SEQ * 4 * H // tp


# the keys an empty plan lacks, as the schema lists them
REQUIRED = ("batch", "device", "model", "topology")
