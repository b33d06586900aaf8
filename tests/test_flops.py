"""Memory-bound work the step adds around the GEMMs, checked by hand.

- Main-gradient accumulation: Megatron-LM adds every micro-batch's weight gradients into an
  fp32 ``main_grad`` buffer (``LinearWithGradAccumulationAndAsyncCommunication``), a read
  and a write of 4 bytes per parameter: 8 bytes per parameter per micro-batch.
- The optimizer step as Megatron-LM's mixed-precision optimizer runs it
  (``megatron/core/optimizer/optimizer.py``): gradient norm (read fp32 grad, 4 B), fused
  Adam (read grad 4, master 4 and two moments 8, write master 4 and moments 8: 28 B),
  master copy to the bf16 parameter (read 4, write 2: 6 B) and zeroing the gradient (4 B):
  42 bytes per parameter.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from budget import flops
from budget.accuracy import RUNS, plan_of
from budget.layers import shapes
from budget.plan.load import load_plan
from budget.plan.model import Mla, Plan
from budget.step import derive

PLAN = Path(__file__).parent.parent / "plans" / "gpt3-175b.yaml"


def test_main_grad_accumulation_reads_and_writes_fp32() -> None:
    plan = load_plan(PLAN)
    (work,) = flops.grad_accumulation(plan, 1_000_000)
    assert work.kind == "elementwise"
    assert work.bytes == 8_000_000


def test_optimizer_moves_42_bytes_per_parameter() -> None:
    plan = load_plan(PLAN)
    works = flops.optimizer_work(plan, 1_000_000)
    # the module docstring's bytes per parameter, kernel by kernel: 4, 28, 6 and 4
    assert [w.bytes for w in works] == [4_000_000, 28_000_000, 6_000_000, 4_000_000]
    assert sum(w.bytes for w in works) == 42_000_000
    assert works[1].flops == 16_000_000  # AdamW as apex's ADAM_MODE_1 writes it (the docstring)
    assert [w.name for w in works] == [
        "gradient norm",
        "adam step",
        "master weights to parameters",
        "zero main gradients",
    ]


def test_cross_entropy_moves_four_fp32_passes_and_twice_that_back() -> None:
    """GPT-3 175B at TP 8, micro-batch 1 of 2,048 tokens: a rank's logits are 2,048 × 6,400
    (51,200 / 8); the fp32 cross-entropy reads them for the maximum, reads and writes the
    exponent and reads it for the sum, 16 bytes per logit (209,715,200 B), and its backward
    twice that (an audit: no test held this count)."""
    plan = load_plan(PLAN)
    works = {w.name: w for w in flops.loss_work(plan, shapes(plan))}
    assert works["cross-entropy (fp32)"].bytes == 16 * 2048 * 6400 == 209_715_200
    assert works["cross-entropy (fp32) backward"].bytes == 2 * 209_715_200


def test_every_backward_block_accumulates_its_own_parameters() -> None:
    """GPT-3 175B at TP 8 (hidden 12288, ffn 49152, biases): the MLP block a rank holds is
    fc1 12288 x 6144 + bias 6144, fc2 6144 x 12288 + bias 12288 (replicated) and the MLP
    norm's 2 x 12288: 151,037,952 parameters, so 1,208,303,616 bytes (fp32 main gradients
    read and written) per micro-batch (an audit found 1,024 parameters too many here)."""
    plan = load_plan(PLAN)
    stage = derive(plan).stages[0]
    mlp = next(p for p in stage.phases if p.name == "backward.mlp")
    (acc,) = [w for w in mlp.works if w.name == "main-grad accumulation"]
    h, f = 12288, 49152 // plan.parallel.tp
    assert acc.bytes == 8 * (h * f + f + f * h + h + 2 * h) == 1_208_303_616


def test_rotary_embeddings_read_and_write_q_and_k() -> None:
    """Llama 3 70B at TP 8 (plans/llama3-70b.yaml: 64 heads of 128, 8 KV heads, sequence
    8192, micro-batch 1): a rank holds 8 query heads (1024 columns) and one KV head (128), so
    RoPE reads and writes 8192 x (1024 + 128) bf16 values: 2 x 2 x 8192 x 1152 bytes. GPT-3's
    learned positions have no such pass."""
    plan = load_plan(PLAN.parent / "llama3-70b.yaml")
    assert (plan.parallel.tp, plan.batch.seq, plan.batch.micro) == (8, 8192, 1)
    stage = derive(plan).stages[0]
    forward = next(p for p in stage.phases if p.name == "forward.attention")
    (rope,) = [w for w in forward.works if w.name == "rotary embedding of Q and K"]
    tokens = 8192 // plan.parallel.cp
    assert rope.kind == "elementwise" and rope.bytes == 2 * 2 * tokens * (1024 + 128)
    backward = next(p for p in stage.phases if p.name == "backward.attention")
    (back,) = [w for w in backward.works if w.name == "rotary embedding of Q and K backward"]
    assert back.bytes == rope.bytes  # gradients rotated back: the same traffic
    # Megatron-Core rotates the query and the key by a call each (a review, m351); a
    # serving engine rotates both in one kernel
    assert rope.launches == back.launches == 2
    decode = load_plan(PLAN.parent / "llama3-70b-decode.yaml")
    served = flops.rotary(decode, shapes(decode))
    assert [w.launches for w in served] == [1]
    gpt3 = derive(load_plan(PLAN)).stages[0]
    assert not [w for p in gpt3.phases for w in p.works if "rotary" in w.name]


def test_a_serving_pass_writes_its_new_keys_and_values_into_the_cache() -> None:
    """vLLM's ``reshape_and_cache_flash``, one kernel a layer before the attention kernel
    (an audit, m479): it reads the pass's K and V in the activations' format and writes
    them in the cache's. The shipped decode plan (Llama 3 70B at tp 8, one KV head of 128 a
    rank, 32 sequences a pass): (2 + 2) x 32 x (128 + 128) = 32,768 B, an fp8 cache
    (2 + 1) x 32 x 256 = 24,576; its prefill, 32 prompts of 2,048 tokens, 65,536 tokens;
    DeepSeek-V3's latent cache (kv_rank 512 + rope 64, every rank all of it) 4 x 32 x 576.
    Training keeps no cache."""
    decode = load_plan(PLAN.parent / "llama3-70b-decode.yaml")
    assert (decode.parallel.tp, decode.batch.micro, decode.batch.prompt) == (8, 32, 2048)

    def written(plan: Plan, query_len: int | None = 1) -> int:
        (work,) = flops.kv_cache_write(plan, shapes(plan, query_len=query_len))
        assert work.kind == "elementwise" and work.launches == 1 and work.backward == 0
        return int(work.bytes)

    assert written(decode) == 4 * 32 * 256 == 32_768
    fp8 = replace(decode, precision=replace(decode.precision, kv_cache="fp8"))
    assert written(fp8) == 3 * 32 * 256
    assert written(decode, query_len=2048) == 4 * 32 * 2048 * 256
    latent = Mla(kv_rank=512, nope_dim=128, rope_dim=64, q_rank=1536)  # DeepSeek-V3's
    assert written(replace(decode, model=replace(decode.model, mla=latent))) == 4 * 32 * 576
    assert flops.kv_cache_write(load_plan(PLAN), shapes(load_plan(PLAN))) == []
    stage = derive(decode).stages[0]
    (attention,) = [p for p in stage.phases if p.name == "decode.attention"]
    assert flops.KV_CACHE_WRITE in [w.name for w in attention.works]


def test_a_pytorch_stack_s_layernorm_backward_reads_its_input_twice() -> None:
    """ATen's LayerNorm backward, which PyTorch FSDP stacks run (llm-foundry's LPLayerNorm
    calls ``F.layer_norm``), is two kernels: the input gradient's (reads dY and X, writes
    dX) and ``GammaBetaBackwardCUDAKernel``'s (reads dY and X again): 5 passes to the
    forward's 2, in two launches (a review, m352). MPT 7B, micro-batch 6 of 2,048 tokens,
    hidden 4,096, bf16: the forward's 2 x 2 x 12,288 x 4,096 = 201,326,592 B, the backward
    503,316,480. Megatron-Core's (Transformer Engine's ``layernorm_bwd``) makes 3, GPT-3's
    plan; so does an FSDP stack's RMSNorm, whose kernel is not pinned."""
    (run,) = [r for r in RUNS if r.name == "MPT 7B, 8 GPUs"]
    mpt = plan_of(run)
    stage = derive(mpt).stages[0]

    def norm(stage, phase: str, name: str):
        (work,) = [w for p in stage.phases if p.name == phase for w in p.works if w.name == name]
        return work

    forward, backward = (
        norm(stage, "forward.attention", "attention norm"),
        norm(stage, "backward.attention", "attention norm backward"),
    )
    assert forward.bytes == 2 * 2 * 6 * 2048 * 4096 == 201_326_592
    assert backward.bytes == 503_316_480 and (forward.launches, backward.launches) == (1, 2)
    gpt3 = derive(load_plan(PLAN)).stages[0]
    te = norm(gpt3, "backward.attention", "attention norm backward")
    assert te.bytes == 1.5 * norm(gpt3, "forward.attention", "attention norm").bytes
    assert te.launches == 1
    rms = replace(mpt, model=replace(mpt.model, norm="rmsnorm"))
    rms_stage = derive(rms).stages[0]
    assert norm(rms_stage, "backward.attention", "attention norm backward").bytes == 1.5 * (
        forward.bytes
    )


def test_qk_norms_keep_q_and_k_and_add_a_pass() -> None:
    """Llama 3 70B (64 heads and 8 KV heads of 128, 8192 tokens) with ``model.qk_norm``:
    the norms keep their input, Q and K before them, and read and write it once forward
    (backward, a norm's three passes: the saved input and the gradient read, the input
    gradient written; `flops.norm_kernel`). Per head at TP 8 (8 query heads and one KV head
    per rank): 8192 x (1024 + 128) bf16 values per layer and micro-batch, and two head_dim-wide
    RMSNorms, 256 parameters every rank holds. Full width (only at TP 1, where a rank holds
    every head): 8192 x (8192 + 1024) values and 64 x 128 + 8 x 128 = 9,216 parameters."""
    from dataclasses import replace

    from budget.layers import attention_saved, layer_params, shapes

    tp8 = load_plan(PLAN.parent / "llama3-70b.yaml")
    assert (tp8.parallel.tp, tp8.parallel.cp, tp8.batch.micro) == (8, 1, 1)
    tp1 = replace(tp8, parallel=replace(tp8.parallel, tp=1, sequence_parallel=False))
    # Selective recompute's checkpoint saves V as a view of the QKV output, which it holds
    # whole (`layers._qkv_held_by_v`): without norms the rotary embedding writes Q and K
    # anew, so their columns of it are bytes of their own; the norms' inputs are views of
    # them instead, but at TP 1 a rank's 8 groups of 8 query heads reshape Q by a copy
    held = "attention QKV output, held by V (a view of it)"
    cases = (
        (tp8, "per_head", 2 * 8192 * (1024 + 128), 256, 256, 2 * 8192 * (1024 + 128), 0),
        (
            tp1,
            "full_width",
            2 * 8192 * (8192 + 1024),
            9_216,
            9_216,
            2 * 8192 * (8192 + 1024),
            2 * 8192 * 8192,
        ),
    )
    for base, kind, kept, total, rank, held_base, held_normed in cases:
        plan = replace(base, model=replace(base.model, qk_norm=kind))
        s = shapes(plan)
        saved = {a.name: a.bytes for a in attention_saved(plan, s)}
        assert saved.pop("attention Q/K norm input") == kept
        assert saved.pop(held, 0) == held_normed
        unnormed = {a.name: a.bytes for a in attention_saved(base, shapes(base))}
        assert unnormed.pop(held) == held_base
        assert saved == unnormed
        with_norms, without = layer_params(plan), layer_params(base)
        assert with_norms.total - without.total == total
        assert with_norms.per_rank - without.per_rank == rank
        works = flops.attention_forward(plan, s)
        (norm,) = [w for w in works if w.name == "Q/K norms"]
        assert norm.bytes == 2 * kept
        names = [w.name for w in works if w.name != flops.QUERY_COPY]  # Qwen3's grouped Q
        assert names[2:4] == ["Q/K norms", "rotary embedding of Q and K"]
        (back,) = [w for w in flops.backward_of(works) if w.name == "Q/K norms backward"]
        assert back.bytes == 3 * kept


def test_sandwich_norms_keep_each_blocks_output_and_add_a_pass() -> None:
    """Llama 3 70B at TP 8 with sequence parallelism (hidden 8192, 8192 tokens, so 1024 per
    rank in the norms' region) and ``model.sandwich_norm``: each block's post-norm keeps its
    input, 2 x 1024 x 8192 bytes, and reads and writes it once; each layer gains two 8192-wide
    RMSNorms, replicated over tp, whose gradients are partial over tp like the pre-norms'."""
    from dataclasses import replace

    from budget.layers import (
        attention_saved,
        layer_params,
        mlp_saved,
        sequence_parallel_params,
        shapes,
    )

    base = load_plan(PLAN.parent / "llama3-70b.yaml")
    assert base.parallel.sequence_parallel and base.parallel.tp == 8
    plan = replace(base, model=replace(base.model, sandwich_norm=True))
    s = shapes(plan)
    output = 2 * (8192 // 8) * 8192
    for saved, block in ((attention_saved, "attention"), (mlp_saved, "MLP")):
        allocs = {a.name: a.bytes for a in saved(plan, s)}
        assert allocs.pop(f"{block} post-norm input") == output
        assert allocs == {a.name: a.bytes for a in saved(base, shapes(base))}
    assert layer_params(plan).total - layer_params(base).total == 2 * 8192
    assert layer_params(plan).per_rank - layer_params(base).per_rank == 2 * 8192
    assert sequence_parallel_params(plan) - sequence_parallel_params(base) == 2 * 8192
    works = flops.attention_forward(plan, s) + flops.mlp_forward(plan, s)
    posts = [w for w in works if w.name.endswith("post-norm")]
    assert [(w.name, w.bytes) for w in posts] == [
        ("attention post-norm", 2 * output),
        ("MLP post-norm", 2 * output),
    ]


def test_qkv_biases_split_with_their_columns() -> None:
    """Llama 3 70B with ``model.qkv_bias``: q 8192 + k and v 2 x 1024 biases per layer,
    10,240, of which a TP-8 rank holds its columns' 1,280; with ``model.bias`` as well they
    are not counted twice."""
    from dataclasses import replace

    from budget.layers import layer_params

    base = load_plan(PLAN.parent / "llama3-70b.yaml")
    plan = replace(base, model=replace(base.model, qkv_bias=True))
    assert layer_params(plan).total - layer_params(base).total == 10_240
    assert layer_params(plan).per_rank - layer_params(base).per_rank == 1_280
    both = replace(base, model=replace(base.model, qkv_bias=True, bias=True))
    only_bias = replace(base, model=replace(base.model, bias=True))
    assert layer_params(both) == layer_params(only_bias)


def test_per_head_qk_norm_gradients_are_all_reduced_over_tp_even_without_sp() -> None:
    """Megatron-LM all-reduces q_layernorm and k_layernorm gradients over tp whenever tp > 1,
    sequence parallelism or not: each rank applied the shared weights to its own heads only.
    GPT-3 at TP 8, PP 8 (12 layers on the first stage), LayerNorm (scale and bias): 2 norms x
    2 x 128 = 512 parameters per layer, fp32 gradients, so 12 x 512 x 4 = 24,576 bytes
    without SP, added to the sequence-parallel weights with it."""
    from tests.builders import make_plan

    def partial(plan):  # the first stage's all-reduce of weight gradients partial over tp
        grads = next(p for p in derive(plan).stages[0].phases if p.name == "dp.grads")
        found = [m for m in grads.moves if m.name == "weight gradients partial over tp"]
        return found[0].size_bytes if found else None

    assert partial(make_plan(sp=False)) is None
    assert partial(make_plan(sp=False, qk_norm="per_head")) == 12 * 512 * 4
    with_sp = partial(make_plan(sp=True))
    assert partial(make_plan(sp=True, qk_norm="per_head")) == with_sp + 12 * 512 * 4
    assert partial(make_plan(sp=False, qk_norm="per_head", tp=1, dp=128)) is None


def test_the_optimizer_writes_fp8_weights_but_16_bit_vocabulary_rows():
    """Under fp8 weights the embedding and output layer stay bf16 (`outside_operands`), as do
    the norms and biases (`StageParams.beside_gemms_per_rank`), so the master copy cast back
    writes the layers' GEMM weights at 1 B and the rest at 2 B: against bf16 weights it saves
    one byte per GEMM weight of the shard only."""
    from budget.layers import stage_params
    from budget.plan.model import Precision
    from budget.step import derive
    from tests.builders import make_plan

    def cast_bytes(params: str) -> tuple[int, int, int]:
        plan = make_plan(tp=8, pp=2, dp=4, zero=1, precision=Precision(params=params))
        (phase,) = [p for p in derive(plan).stages[0].phases if p.name == "optimizer"]
        (work,) = [w for w in phase.works if w.name == "master weights to parameters"]
        owned = stage_params(plan, 0)
        wide = owned.vocab_per_rank + owned.beside_gemms_per_rank
        return work.bytes, -(-owned.per_rank // 4), -(-wide // 4)

    bf16, shard, vocab = cast_bytes("bf16")
    fp8, _, _ = cast_bytes("fp8")
    assert vocab > 0
    assert bf16 == (4 + 2) * shard
    assert fp8 == 4 * shard + 1 * (shard - vocab) + 2 * vocab


def _phase_works(plan, name):
    from budget.step import derive

    for stage in derive(plan).stages:
        for phase in stage.phases:
            if phase.name == name:
                return phase.works
    raise AssertionError(name)


def test_a_gemm_backward_is_two_kernels_of_the_forward_size():
    """dgrad and wgrad are two GEMMs of the forward's FLOPs: each ramps on the efficiency
    curve and starts on its own, so the backward takes twice the forward kernel's time
    (it was one kernel of twice the size, rated higher on the curve: an audit)."""
    from budget.plan.load import load_plan
    from budget.schedule import work_time
    from tests.plan_files import GPT3

    plan = load_plan(GPT3)
    (fc1,) = [w for w in _phase_works(plan, "forward.mlp") if w.name == "MLP fc1"]
    (back,) = [w for w in _phase_works(plan, "backward.mlp") if w.name == "MLP fc1 backward"]
    assert (back.flops, back.launches) == (2 * fc1.flops, 2.0)
    assert work_time(plan, back) == pytest.approx(2 * work_time(plan, fc1), rel=1e-12)


def test_eager_attention_backward_is_twice_its_forward_flash_two_and_a_half():
    """Eager attention saves its scores, so its backward is four batched GEMMs, twice the
    two products' FLOPs; FlashAttention's computes QKᵀ again, 2.5 times (Dao, arXiv
    2307.08691, section 3.1.2). GPT-3 eager: QKᵀ backward 2 x 1.2885e10 FLOPs a rank."""
    from dataclasses import replace

    from budget.plan.load import load_plan
    from tests.plan_files import GPT3

    plan = load_plan(GPT3)
    eager = replace(plan, model=replace(plan.model, attention="eager"))
    forward = {w.name: w for w in _phase_works(eager, "forward.attention")}
    backward = {w.name: w for w in _phase_works(eager, "backward.attention")}
    # a rank's pairs: 96 / 8 = 12 heads x 2,048 queries x 2,048 keys = 50,331,648; one
    # product is 2 FLOPs a pair and head-dim element (12,288 / 96 = 128)
    pairs = 12 * 2048 * 2048
    qk = forward["attention scores QKᵀ"]
    assert qk.flops == 2 * pairs * 128 == 12_884_901_888
    assert forward[flops.EAGER_LAST].flops == qk.flops
    assert backward["attention scores QKᵀ backward"].flops == 2 * qk.flops == 25_769_803_776
    # the fused kernel's two products over the causal half: (2 x 12,884,901,888) / 2
    flash = {w.name: w for w in _phase_works(plan, "backward.attention")}
    core = {w.name: w for w in _phase_works(plan, "forward.attention")}["attention core (flash)"]
    assert core.flops == 2 * 2 * pairs * 128 // 2 == 12_884_901_888
    assert flash["attention core (flash) backward"].flops == 32_212_254_720  # 2.5 x


@pytest.mark.parametrize("dropout", [False, True])
def test_the_eager_softmax_backward_reads_one_score_tensor_more_than_its_forward(dropout):
    """GPT-3 eager at 12 heads a rank: S = 2 B x 12 x 2,048² = 100,663,296 B of scores a
    micro-batch. Forward, the softmax reads the scores and writes the probabilities (2S);
    dropout, its own kernel, reads them and writes its output and a byte-per-score mask
    (2.5S). Backward, Megatron-LM's fused softmax reads the output gradient and the saved
    probabilities and writes the input gradient (3S), and dropout's backward reads the
    gradient and the mask and writes the gradient (2.5S): 3S alone, 5.5S with dropout, in
    one kernel each (an audit, m456: 4S and 9S, the generic twice)."""
    from tests.plan_files import GPT3

    plan = load_plan(GPT3)
    eager = replace(plan, model=replace(plan.model, attention="eager", dropout=dropout))
    name = "softmax and dropout" if dropout else "softmax"
    (forward,) = [w for w in _phase_works(eager, "forward.attention") if w.name == name]
    (back,) = [w for w in _phase_works(eager, "backward.attention") if w.name == f"{name} backward"]
    scores = 2 * 12 * 2048 * 2048
    assert scores == 100_663_296
    kernels = 2 if dropout else 1
    assert (forward.bytes, forward.launches) == ((4.5 if dropout else 2) * scores, kernels)
    assert (back.bytes, back.launches) == ((5.5 if dropout else 3) * scores, kernels)


def test_eager_grouped_attention_copies_k_and_v_up_to_the_query_heads(tmp_path):
    """Megatron-Core's unfused core (and transformers' ``repeat_kv``) copies K and V up to
    the query heads before its batched GEMMs, which then read the copies; the report held
    the copies' memory but timed neither the copy nor the wider reads (an audit: Llama 3
    70B's eager decode read 17.9 ms a token, about 34.9 with them). The shipped decode plan
    at tp 8: one K/V head and 8 query heads a rank, 32 sequences meeting 2,304 keys on
    average, bf16. K and V are 2 x 32 x 2,304 x 128 B = 18,874,368 B each, their copies 8
    times that, so the copy moves 2 x (18,874,368 + 150,994,944) = 339,738,624 B and
    QKᵀ reads the 150,994,944 B copy of K. Training's backward sums the copies' gradients
    back, the same bytes; plain multi-head attention copies nothing."""
    from budget.schedule import work_time
    from tests.plan_files import GPT3, ROOT, variant

    base = ROOT / "plans" / "llama3-70b-decode.yaml"
    eager = load_plan(
        variant(tmp_path, "eager.yaml", ("attention: flash", "attention: eager"), base=base)
    )
    works = {w.name: w for w in _phase_works(eager, "decode.attention")}
    narrow, wide = 2 * 32 * 2304 * 128, 2 * 32 * 2304 * 1024
    assert narrow == 18_874_368
    repeat = works[flops.KV_REPEATED]
    assert (repeat.bytes, repeat.launches) == (2 * (narrow + wide), 2)
    assert repeat.bytes == 339_738_624
    q, scores = 2 * 32 * 1024, 2 * 32 * 8 * 2304
    assert works["attention scores QKᵀ"].bytes == q + wide + scores
    assert works[flops.EAGER_LAST].bytes == scores + wide + q
    # two kernels at the H100's streaming rate, each with its start-up: 0.12 ms a layer
    device = eager.device
    streamed = repeat.bytes / (3.35e12 * device.memory_efficiency) + 2 * device.kernel_startup
    assert work_time(eager, repeat) == pytest.approx(streamed, rel=1e-9)
    # an fp8 cache's K and V are read at a byte an element, their copies made in bf16 as
    # the memory holds them (a review: the copies had been timed at a byte):
    # 2 x 9,437,184 + 2 x 150,994,944 = 320,864,256 B, and QKᵀ reads the bf16 copy
    fp8_cache = load_plan(
        variant(
            tmp_path,
            "fp8.yaml",
            ("attention: flash", "attention: eager"),
            ("  activations: bf16\n", "  activations: bf16\n  kv_cache: fp8\n"),
            base=base,
        )
    )
    cached = {w.name: w for w in _phase_works(fp8_cache, "decode.attention")}
    assert cached[flops.KV_REPEATED].bytes == 2 * (narrow // 2) + 2 * wide == 320_864_256
    assert cached["attention scores QKᵀ"].bytes == q + wide + scores == 152_240_128
    # training: the backward sums the copies' gradients into K's and V's
    eight_b = ROOT / "plans" / "llama3-8b-fsdp.yaml"
    train = load_plan(
        variant(tmp_path, "t.yaml", ("attention: flash2", "attention: eager"), base=eight_b)
    )
    forward = {w.name: w for w in _phase_works(train, "forward.attention")}
    backward = {w.name: w for w in _phase_works(train, "backward.attention")}
    assert backward[f"{flops.KV_REPEATED} backward"].bytes == forward[flops.KV_REPEATED].bytes
    gpt3 = load_plan(GPT3)
    mha = replace(gpt3, model=replace(gpt3.model, attention="eager"))
    assert flops.KV_REPEATED not in {w.name for w in _phase_works(mha, "forward.attention")}


def test_a_layers_memory_bound_kernels_move_their_hand_counted_bytes():
    """GPT-3 175B at tp 8 with sequence parallelism, one sequence of 2,048 tokens in bf16,
    dropout on. The norms and the residual add see the rank's 256-token shard of [tokens,
    12,288]: 2 B x 256 x 12,288 = 6,291,456 B. A norm reads and writes it; the residual add
    reads two and writes one, and dropout writes its 1-byte mask, 3,145,728 B (Korthikanti
    et al., arXiv 2205.05198, section 4.1, counted as traffic). GeLU reads fc1's output over
    the whole sequence, 2,048 x 6,144 (49,152 / 8), and writes one. Eager attention's softmax
    reads and writes the scores of 12 heads (96 / 8) x 2,048², 100,663,296 B in bf16; dropout
    reads them, writes the dropped scores and a 1-byte mask: 4.5 passes of the scores."""
    from dataclasses import replace

    plan = load_plan(PLAN)
    s = shapes(plan)
    shard = 2 * 256 * 12288
    assert shard == 6_291_456
    attention = {w.name: w.bytes for w in flops.attention_forward(plan, s)}
    mlp = {w.name: w.bytes for w in flops.mlp_forward(plan, s)}
    assert attention["attention norm"] == mlp["MLP norm"] == 2 * shard == 12_582_912
    residual = 3 * shard + shard // 2
    assert attention["residual add and dropout"] == residual == 22_020_096
    assert mlp["residual add and dropout"] == residual
    assert mlp["GeLU"] == 2 * 2 * 2048 * 6144 == 50_331_648
    eager = replace(plan, model=replace(plan.model, attention="eager"))
    scores = 2 * 12 * 2048 * 2048
    kernels = {w.name: w.bytes for w in flops.attention_forward(eager, shapes(eager))}
    assert kernels["softmax and dropout"] == 2 * scores + 2 * scores + scores // 2
    assert kernels["softmax and dropout"] == 452_984_832


def test_fp8_leaves_the_output_layer_and_router_gemms_in_bf16(tmp_path):
    """Megatron-LM's output layer and MoE router are not Transformer Engine modules: an FP8
    recipe runs them in bf16, at the bf16 peak and curve (they ran at fp8's: Llama 3 70B's
    output layer took 1.59 ms a micro-batch where bf16 takes 2.94: an audit)."""
    from budget.plan.load import load_plan
    from budget.schedule import work_time
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "llama3-70b.yaml"
    fp8 = load_plan(
        variant(
            tmp_path,
            "fp8.yaml",
            ("  activations: bf16", "  activations: bf16\n  matmul: fp8"),
            base=base,
        )
    )
    bf16 = load_plan(base)
    (out8,) = [w for w in _phase_works(fp8, "loss") if w.name == "output layer"]
    (out16,) = [w for w in _phase_works(bf16, "loss") if w.name == "output layer"]
    assert out8.dtype == "bf16" and out8.flops == out16.flops
    # at bf16's rate, on its bf16 input and output (it read them at fp8's byte an element:
    # a later audit), so the same bytes and time as the bf16 plan's
    assert out8.bytes == out16.bytes
    assert work_time(fp8, out8) == work_time(bf16, out16)
    (fc1,) = [w for w in _phase_works(fp8, "forward.mlp") if w.name == "MLP fc1"]
    assert fc1.dtype is None  # a Transformer Engine module: precision.matmul, fp8


def test_the_optimizer_zeroes_the_gradient_buffer_the_rank_holds():
    """Under ZeRO-1 the rank keeps every parameter's fp32 gradient and zero_grad_buffer
    clears all of it, not the optimizer's shard: gpt-1.3b at dp 8, 4 x 1,315,819,520 B."""
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT

    plan = load_plan(ROOT / "plans" / "gpt-1.3b.yaml")
    (zero,) = [w for w in _phase_works(plan, "optimizer") if w.name == "zero main gradients"]
    assert zero.bytes == 4 * 1_315_819_520


def test_without_fp8_the_output_layer_runs_in_the_plans_matmul_format(tmp_path):
    """Only an FP8 recipe leaves the output layer outside its format; a tf32 plan's output
    layer runs at tf32 like its other GEMMs (it ran at fp32's 19.5 TFLOP/s: a review)."""
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    path = variant(
        tmp_path, "tf32.yaml", ("activations: bf16", "activations: fp32\n  matmul: tf32"), base=base
    )
    plan = load_plan(path)
    (out,) = [w for w in _phase_works(plan, "loss") if w.name == "output layer"]
    assert out.dtype is None


def _named(works: list[flops.Work], suffix: str) -> dict[str, int]:
    return {w.name: w.bytes for w in works if w.name.endswith(suffix)}


def test_each_biased_linear_reduces_its_output_gradient_over_the_tokens() -> None:
    """gpt3-175b.yaml (tp 8 with sequence parallelism, micro 1 × 2048 tokens, bf16): each
    bias gradient reads its output gradient once and writes one row of it.

    - QKV: 2048 tokens × 3·12288/8 = 4608 columns on the rank: 2 B × 2049 × 4608;
    - attention output and fc2: hidden 12288 on the rank's 2048/8 = 256 tokens after the
      reduce-scatter: 2 B × 257 × 12288;
    - fc1: 4·12288/8 = 6144 columns on 2048 tokens: 2 B × 2049 × 6144."""
    plan = load_plan(PLAN)
    backward = {p.name: p for p in derive(plan).stages[0].phases}
    attention = _named(list(backward["backward.attention"].works), "bias gradient")
    assert attention == {
        "QKV bias gradient": 2 * 2049 * 4608,
        "attention output bias gradient": 2 * 257 * 12288,
    }
    mlp = _named(list(backward["backward.mlp"].works), "bias gradient")
    assert mlp == {
        "MLP fc1 bias gradient": 2 * 2049 * 6144,
        "MLP fc2 bias gradient": 2 * 257 * 12288,
    }


def test_bias_free_layers_and_qkv_only_biases() -> None:
    """Llama-style layers have no bias gradients; Qwen2's ``qkv_bias`` gives the QKV one
    alone."""
    from tests.builders import make_plan

    plain = make_plan(bias=False)
    s = shapes(plain)
    assert flops.bias_gradients(plain, s, "attention") == []
    assert flops.bias_gradients(plain, s, "mlp") == []
    qwen = make_plan(bias=False, qkv_bias=True)
    (qkv,) = flops.bias_gradients(qwen, shapes(qwen), "attention")
    assert qkv.name == "QKV bias gradient"
    assert flops.bias_gradients(qwen, shapes(qwen), "mlp") == []


def test_a_gemm_s_backward_runs_over_the_forward_s_outer_dimensions() -> None:
    """dX = dY·Wᵀ has the forward's n as its inner dimension, dW = Xᵀ·dY its m: MPT 760M's
    QKV projection (24 × 2048 tokens, 1536 → 4608) runs forward over 1536, backward over
    4608 and 49152; a grouped expert GEMM's weight gradient over its expert's rows."""
    fwd = flops.gemm("QKV projection", 49152, 1536, 4608, 2)
    assert fwd.inner == (1536,)
    (back,) = flops.backward_of([fwd])
    assert back.inner == (4608, 49152) and back.flops == 2 * fwd.flops
    (again,) = flops.backward_of([fwd.scaled(1, "QKV projection (recomputed)")])
    assert again.inner == back.inner
    expert = flops.grouped_gemm("expert fc1", 4096, 1024, 2048, 8, 2, 0.25)
    (expert_back,) = flops.backward_of([expert])
    assert expert.inner == (1024,) and expert_back.inner == (2048, 512)


def test_on_an_h100_a_shallow_gemm_takes_longer_than_a_deep_one_of_the_same_flops() -> None:
    """Same 2·8192·8192·1536 FLOPs: over K = 1536 the loop runs at (1536 / 1661) / (8192 /
    8317) = 0.93884 of the rate over K = 8192 (K₀ = 125), and the ramp is the same, so
    T = F / (733.17e12 · g) + 6.52 µs."""
    from budget.schedule import work_time

    plan = load_plan(Path(__file__).parent.parent / "plans" / "llama3-70b.yaml")
    f = 2 * 8192 * 8192 * 1536
    shallow = flops.gemm("shallow", 8192, 1536, 8192, 2)
    deep = flops.gemm("deep", 8192, 8192, 1536, 2)
    assert shallow.flops == deep.flops == f
    g = (1536 / 1661) / (8192 / 8317)
    assert work_time(plan, deep) == pytest.approx(f / 733.17e12 + 6.52e-6, rel=1e-5)
    assert work_time(plan, shallow) == pytest.approx(f / (733.17e12 * g) + 6.52e-6, rel=1e-5)


def test_an_inner_dimension_shallower_than_the_sweeps_is_priced_at_their_shallowest() -> None:
    """OpenXLA's table goes down to K = 256; an expert's weight gradient over 64 rows is
    priced as one over 256, (256 / 381) / (8192 / 8317) = 0.6822 of the rate (K₀ = 125), not
    extrapolated to (64 / 189) / (8192 / 8317) = 0.3438; past 8192, no faster."""
    from budget.catalog import DEVICES
    from budget.efficiency import inner_factor

    curve = DEVICES["h100-sxm"].gemm
    assert inner_factor(curve, (64,)) == pytest.approx((256 / 381) / (8192 / 8317))
    assert inner_factor(curve, (256,)) == inner_factor(curve, (64,))
    assert inner_factor(curve, (16384,)) == 1.0
    both = 2 / (1 / inner_factor(curve, (1024,)) + 1)  # a backward's two GEMMs: harmonic mean
    assert inner_factor(curve, (1024, 16384)) == pytest.approx(both)
    assert inner_factor(DEVICES["a100-80gb"].gemm, (256,)) == 1.0  # no sweep over K


def _long_context(tmp_path: Path) -> Path:
    """Two layers of h 1,024 at 262,144 tokens on one GB200 (a fuzzing audit's plan)."""
    plan_file = tmp_path / "long.yaml"
    plan_file.write_text(
        "model: {layers: 2, hidden: 1024, heads: 8, vocab: 1000}\n"
        "batch: {seq: 262144, micro: 1, global: 1}\n"
        "device: {preset: gb200}\n"
        "topology: {preset: gb200-nvl72, gpus: 1}\n",
        encoding="utf-8",
    )
    return plan_file


def test_a_long_context_s_mfu_also_counts_attention_as_the_causal_mask_computes_it(tmp_path):
    """PaLM's 6N + 12·L·h·s counts every query against all s keys; the causal mask
    computes keys 1 ... i for query i, 6·L·h·(s + 1) a token. Two layers of h 1,024 at
    262,144 tokens on one GB200: PaLM's count over the step reads 101 % of the peak (a
    fuzzing audit), the causal count about half of it, and the two differ by exactly that
    attention term per token."""
    from budget.pipeline import budget_plan

    plan_file = _long_context(tmp_path)
    plan = load_plan(plan_file)
    layers, h, s = 2, 1024, 262_144
    palm = flops.model_flops_per_token(plan)
    causal = flops.model_flops_per_token(plan, causal=True)
    assert palm - causal == 12 * layers * h * s - 6 * layers * h * (s + 1)
    step = budget_plan(plan_file).step
    assert step["mfu"] > 1 > step["mfu_causal"]
    assert step["mfu_causal"] == pytest.approx(step["mfu"] * causal / palm, rel=1e-12)
    # a serving plan's MFU counts the causal products already: the same figure
    decode = budget_plan(Path(__file__).parent.parent / "plans" / "llama3-70b-decode.yaml").step
    assert decode["mfu_causal"] == decode["mfu"]


def test_the_report_gives_the_causal_mfu_where_palm_s_count_parts_from_it(tmp_path):
    """The summary says which count a share of more than the peak is, and gives the causal
    one beside it (an audit: "MFU 104.4% of the bf16 peak" with no word); a plan whose
    attention is a small part of its FLOPs, GPT-3 at 2,048 tokens (2.7 % apart), reads as
    before."""
    from typer.testing import CliRunner

    from budget.cli import app, route
    from budget.pipeline import budget_plan
    from budget.units import format_share

    plan_file = _long_context(tmp_path)
    step = budget_plan(plan_file).step
    out = " ".join(CliRunner().invoke(app, route([str(plan_file)])).stdout.split())
    assert (
        f"MFU {format_share(step['mfu'])} of the bf16 peak (PaLM's count, attention unmasked; "
        f"{format_share(step['mfu_causal'])} counting it as the causal mask computes it)"
    ) in out
    gpt3 = Path(__file__).parent.parent / "plans" / "gpt3-175b.yaml"
    out = " ".join(CliRunner().invoke(app, route([str(gpt3)])).stdout.split())
    # its own MFU, said alone (an audit: the 55.4 % it printed was the expected value)
    mfu = format_share(budget_plan(gpt3).step["mfu"])
    assert f"MFU {mfu} of the bf16 peak" in out and "PaLM's count" not in out


def test_bf16_gradients_beside_an_fp32_master_are_cast_before_the_step():
    """Megatron-LM sets each master parameter's gradient to the bf16 gradient's .float()
    (``_copy_model_grads_to_main_grads``) before the norm and the step, which then read
    4 bytes a parameter: the cast reads 2 and writes 4, the norm reads 4, Adam 4 + 16 +
    8, the master copy back 6, the bf16 buffer zeroed 2: 46 bytes a parameter, where 36
    were priced and `upcast_grads` moved memory alone (an audit). Apex's fused step reading
    them as they are (`upcast_grads: false`) is the 36."""
    from dataclasses import replace

    plan = load_plan(PLAN)
    bf16 = replace(plan, precision=replace(plan.precision, grads="bf16"))
    works = flops.optimizer_work(bf16, 1_000_000)
    assert [w.name for w in works] == [
        "gradients upcast to fp32",
        "gradient norm",
        "adam step",
        "master weights to parameters",
        "zero main gradients",
    ]
    assert [w.bytes for w in works] == [6_000_000, 4_000_000, 28_000_000, 6_000_000, 2_000_000]
    read = replace(bf16, precision=replace(bf16.precision, upcast_grads=False))
    assert sum(w.bytes for w in flops.optimizer_work(read, 1_000_000)) == 36_000_000


def test_fsdp_and_deepspeed_scale_the_gradients_by_the_clipping_coefficient_every_step():
    """An audit (m347): Megatron-LM scales the gradients only where the clipping coefficient
    is below 1 (``if clip_coeff < 1.0``), but PyTorch's ``clip_grads_with_norm_`` multiplies
    them by the clamped coefficient every step (``torch._foreach_mul_``, no branch, no host
    sync) and DeepSpeed's ``unscale_and_clip_grads`` every step too. Per parameter of the
    shard:

    - torchtitan under FSDP2 (plans/llama3-8b-fsdp.yaml: fp32 shards, no master): the norm
      reads 4 B, the scaling reads and writes 4 B (8), fused Adam 4 + 2 x 4 + 2 x 8 = 28, no
      buffer zeroed (FSDP drops its gradients): 40 B, where 32 were priced;
    - DeepSpeed's ZeRO 2 (GPT 1.3B's plan at ZeRO 2 with a bucket, bf16 gradients beside an
      fp32 master): the norm of the bf16 gradients (2), their flattening (2 + 2), the flat
      copy's cast (2 + 4), the fp32 partition unscaled in place (4 + 4), Adam 28, the master
      cast back (4 + 2), the bf16 buffer zeroed (2): 56 B, where 46 were priced (the norm
      read the fp32 copy, nothing flattened or unscaled); its ZeRO 3 the same, flattening
      each parameter's view of its partition (``torch.cat``) before the cast (a review,
      m349: not at ZeRO 3)."""
    fsdp = load_plan(Path(__file__).parent.parent / "plans" / "llama3-8b-fsdp.yaml")
    works = {w.name: w.bytes for w in flops.optimizer_work(fsdp, 1_000_000, grads_held=0)}
    assert works["gradient norm"] == 4_000_000
    assert works["gradients scaled by the clipping coefficient"] == 8_000_000
    assert sum(works.values()) == 40_000_000
    gpt = Path(__file__).parent.parent / "plans" / "gpt-1.3b.yaml"
    text = gpt.read_text(encoding="utf-8")
    assert text.count("zero: 1") == text.count("grads: fp32") == 1
    from budget.plan.load import load_plan_data

    ds = text.replace("zero: 1", "zero: 2\n  reduce_bucket: 500000000")
    deepspeed = load_plan_data(ds.replace("grads: fp32", "grads: bf16").encode(), "ds.yaml")
    works = {w.name: w.bytes for w in flops.optimizer_work(deepspeed, 1_000_000)}
    z3 = ds.replace("zero: 2", "zero: 3").replace("grads: fp32", "grads: bf16")
    stage3 = load_plan_data(z3.encode(), "ds3.yaml")
    assert {w.name: w.bytes for w in flops.optimizer_work(stage3, 1_000_000)} == works
    assert works == {
        "gradients flattened (DeepSpeed)": 4_000_000,
        "gradients upcast to fp32": 6_000_000,
        "gradient norm": 2_000_000,
        "gradients scaled by the clipping coefficient": 8_000_000,
        "adam step": 28_000_000,
        "master weights to parameters": 6_000_000,
        "zero main gradients": 2_000_000,
    }
    # Megatron-LM's own ZeRO 1 on the same formats: no scaling priced, the norm on fp32
    megatron = load_plan_data(text.replace("grads: fp32", "grads: bf16").encode(), "m.yaml")
    names = [w.name for w in flops.optimizer_work(megatron, 1_000_000)]
    assert "gradients scaled by the clipping coefficient" not in names


def _embedding_kernels(plan: Plan) -> dict[str, int]:
    """Bytes of the first stage's embedding kernels, forward and backward, by name."""
    phases = derive(plan).stages[0].phases
    return {
        w.name: int(w.bytes)
        for p in phases
        if p.name in ("forward.embedding", "backward.embedding")
        for w in p.works
    }


def test_a_learned_position_table_is_added_at_the_embedding_and_summed_back() -> None:
    """An audit: the addition of a learned position table (``wte(idx) + wpe(pos)``) was
    never priced. MPT 760M on 8 H100s, micro-batch 24 of 2,048 tokens, d_model 1,536, bf16:
    the forward reads the 24 x 2,048 token rows and the 2,048 position rows and writes the
    24 x 2,048 sums, 2 x (2 x 49,152 + 2,048) x 1,536 = 308,281,344 B; the backward reads
    the incoming gradient and writes the position rows' gradient summed over the 24
    sequences, 2 x (49,152 + 2,048) x 1,536 = 157,286,400 B (not twice the forward's)."""
    (run,) = [r for r in RUNS if r.name == "MPT 760M, 8 GPUs"]
    plan = plan_of(run)
    assert (plan.batch.micro, plan.batch.seq, plan.model.hidden) == (24, 2048, 1536)
    kernels = _embedding_kernels(plan)
    assert kernels[flops.POSITION_ADD] == 2 * (2 * 24 * 2048 + 2048) * 1536 == 308_281_344
    backward = f"{flops.POSITION_ADD} backward"
    assert kernels[backward] == 2 * (24 * 2048 + 2048) * 1536 == 157_286_400
    # the lookup's two passes of [tokens, hidden] are as they were, and twice that back
    assert kernels["embedding lookup"] == 2 * 2 * 24 * 2048 * 1536
    assert kernels["embedding lookup backward"] == 2 * kernels["embedding lookup"]


def test_the_position_add_is_on_the_whole_sequence_under_sequence_parallelism() -> None:
    """Megatron-LM adds the positions before it scatters to the sequence-parallel region
    (``LanguageModelEmbedding.forward``), so GPT-3 at tp 8 with sequence parallelism adds
    the whole 2,048 x 12,288 on every rank: micro-batch 1, 2 x (2 x 2,048 + 2,048) x 12,288
    B forward and 2 x (2,048 + 2,048) x 12,288 B back. A rotary model adds nothing."""
    plan = load_plan(PLAN)
    assert plan.parallel.sequence_parallel and plan.parallel.tp == 8 and plan.batch.micro == 1
    kernels = _embedding_kernels(plan)
    assert kernels[flops.POSITION_ADD] == 2 * 3 * 2048 * 12288 == 150_994_944
    assert kernels[f"{flops.POSITION_ADD} backward"] == 2 * 2 * 2048 * 12288 == 100_663_296
    llama = load_plan(PLAN.parent / "llama3-8b-fsdp.yaml")
    assert llama.model.position == "rope"
    assert not any("position" in name for name in _embedding_kernels(llama))


def test_squared_relu_runs_as_eager_pytorchs_kernels():
    """Nemotron-4's ``torch.pow(relu(x), 2)`` as NeMo runs it, unfused (`flops.activation`).
    On one tp rank of GPT-3 (micro 1, 2,048 tokens, fc1 over 49,152 / 8 = 6,144 columns) fc1's
    output is N = 2 × 2,048 × 6,144 = 25,165,824 B. Forward: relu reads and writes it, the
    square reads and writes: 4N in two launches. Backward: ``threshold_backward`` reads two
    and writes one (3N, one launch); ``pow_backward`` copies x (2N), multiplies by 2 (2N)
    and by the gradient (3N): 7N in three. So 10N in four, where GeLU moves 2N in one and
    3N in one (the gradient and the input read, the input's gradient written)."""
    from dataclasses import replace

    plan = load_plan(PLAN)
    relu = replace(plan, model=replace(plan.model, mlp="squared_relu"))
    n = 2 * 2048 * 6144
    assert n == 25_165_824
    names = ("ReLU", "square", "GeLU")
    act = [w for w in flops.mlp_forward(relu, shapes(relu)) if w.name in names]
    assert [(w.name, w.bytes, w.launches) for w in act] == [
        ("ReLU", 2 * n, 1),
        ("square", 2 * n, 1),
    ]
    back = {w.name: (w.bytes, w.launches) for w in flops.backward_of(act)}
    assert back == {"ReLU backward": (3 * n, 1), "square backward": (7 * n, 3)}
    gelu = [w for w in flops.mlp_forward(plan, shapes(plan)) if w.name in names]
    assert [(w.name, w.bytes) for w in gelu] == [("GeLU", 2 * n)]
    assert [(w.bytes, w.launches) for w in flops.backward_of(gelu)] == [(3 * n, 1)]


def test_shared_experts_run_their_activation():
    """DeepSeek-MoE 16B's two shared experts are one dense SwiGLU MLP of 2 × 1,408 = 2,816
    columns (Megatron-Core's SharedExpertMLP is its MLP), so beside their two GEMMs their
    activation reads the gate and up projections and writes one: 3 × 2 B × 4,096 tokens ×
    2,816 = 69,206,016 B a micro-batch at tp 1 (it had been left out: a review)."""
    from tests.plan_files import ROOT

    plan = load_plan(ROOT / "plans" / "deepseek-moe-16b.yaml")
    works = {w.name: w.bytes for w in flops.moe_forward(plan, shapes(plan))}
    assert works["shared expert activation"] == 3 * 2 * 4096 * 2816 == 69_206_016
    assert "expert activation" in works


def test_megatron_copies_a_grouped_query_and_joins_the_qkv_gradients(tmp_path):
    """Llama 3 70B (64 query heads, 8 key/value groups of 128) at tp 4 holds 16 heads in 2
    groups on a rank: Megatron-Core's ``query.reshape`` cannot view 2 groups of 8 heads each
    a key and a value apart, so it copies Q, a read and a write of 8,192 tokens × 2,048
    columns in bf16, 2 × 2 × 8,192 × 2,048 = 67,108,864 B, with no backward kernel. At tp 8
    one group a rank views it. Its gradients reach the split as three tensors (the rotary
    embedding's backward writes dQ and dK), so the backward concatenates Q, K and V:
    2 × 2 × 8,192 × (2,048 + 256 + 256) = 83,886,080 B at tp 4."""
    from tests.plan_files import ROOT, variant

    tp4 = load_plan(
        variant(
            tmp_path,
            "tp4.yaml",
            ("  tp: 8", "  tp: 4"),
            ("  dp: 16", "  dp: 32"),
            base=ROOT / "plans" / "llama3-70b.yaml",
        )
    )
    s = shapes(tp4)
    assert (s.q_cols, s.k_cols, s.tokens) == (2048, 256, 8192)
    copy = [w for w in flops.attention_forward(tp4, s) if w.name == flops.QUERY_COPY]
    assert [(w.bytes, w.backward) for w in copy] == [(2 * 2 * 8192 * 2048, 0.0)]
    assert copy[0].bytes == 67_108_864
    assert [w.bytes for w in flops.backward_of(copy)] == [0]
    (joined,) = flops.qkv_gradients_joined(tp4, s)
    assert joined.bytes == 2 * 2 * 8192 * (2048 + 256 + 256) == 83_886_080
    tp8 = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    s8 = shapes(tp8)
    assert not [w for w in flops.attention_forward(tp8, s8) if w.name == flops.QUERY_COPY]
    assert [w.bytes for w in flops.qkv_gradients_joined(tp8, s8)] == [
        2 * 2 * 8192 * (1024 + 128 + 128)
    ]


def test_the_qkv_gradients_are_joined_only_where_they_come_apart():
    """Plain multi-head attention with learned positions under a fused kernel (GPT-3) gets
    its gradients back as views of one buffer: nothing joined. Eager attention writes them
    apart (joined); so does llm-foundry's Triton kernel under FSDP (MPT), while a torchtitan
    Llama under FSDP projects Q, K and V by three GEMMs and joins nothing; neither copies Q."""
    from dataclasses import replace

    from tests.plan_files import ROOT

    gpt3 = load_plan(PLAN)
    assert not flops.qkv_gradients_joined(gpt3, shapes(gpt3))
    eager = replace(gpt3, model=replace(gpt3.model, attention="eager"))
    (joined,) = flops.qkv_gradients_joined(eager, shapes(eager))
    assert joined.bytes == 2 * 2 * 2048 * 3 * 1536
    (mpt,) = [r for r in RUNS if r.name == "MPT 760M, 8 GPUs"]
    plan = plan_of(mpt)
    (joined,) = flops.qkv_gradients_joined(plan, shapes(plan))
    assert joined.bytes == 2 * 2 * 24 * 2048 * 3 * 1536
    fsdp = load_plan(ROOT / "plans" / "llama3-8b-fsdp.yaml")
    s = shapes(fsdp)
    assert not flops.qkv_gradients_joined(fsdp, s)
    assert not [w for w in flops.attention_forward(fsdp, s) if w.name == flops.QUERY_COPY]


def test_v_is_copied_for_te_where_rotary_rewrote_q_and_k():
    """Transformer Engine takes no layout of a fresh Q and K beside V still a strided view of
    the QKV output, and copies V (an audit, m358). Nemotron-4 15B at tp 4 (8 key/value heads,
    2 a rank, micro 4 × 4,096 tokens): 2 × 2 × 16,384 × 256 = 16,777,216 B a layer pass, no
    backward. GPT-3 (learned positions) keeps three views TE takes; FSDP's torchtitan Llama
    projects V by a GEMM of its own; eager attention is Megatron-Core's own GEMMs."""
    from dataclasses import replace

    from budget.accuracy import RUNS, plan_of
    from tests.plan_files import ROOT

    (run,) = [r for r in RUNS if r.name == "Nemotron-4 15B, 16 GPUs"]
    plan = plan_of(run)
    s = shapes(plan)
    assert (s.tokens, s.v_cols) == (16384, 256)
    works = flops.attention_forward(plan, s)
    names = [w.name for w in works]
    assert names.index(flops.VALUE_COPY) == names.index("rotary embedding of Q and K") + 1
    (copy,) = [w for w in works if w.name == flops.VALUE_COPY]
    assert copy.bytes == 2 * 2 * 16384 * 256 == 16_777_216
    assert [w.bytes for w in flops.backward_of([copy])] == [0]
    eager = replace(plan, model=replace(plan.model, attention="eager"))
    gpt3 = load_plan(PLAN)
    fsdp = load_plan(ROOT / "plans" / "llama3-8b-fsdp.yaml")
    for other in (eager, gpt3, fsdp):
        assert not flops.value_copy(other, shapes(other)), other.name


def test_megatron_cores_embedding_output_passes():
    """What follows the lookup (two audits, m358 and m360). Nemotron-4 15B (tp 4, sequence
    parallel, micro 4 × 4,096 tokens, hidden 6,144; [tokens, hidden] bf16 is 201,326,592 B):
    the other shards' rows zeroed by a masked fill over all of it and the 16,384-byte mask,
    and in the backward index_put's copy of the gradient and the fill again (4 × 201,326,592
    and the mask; a review, m364, read ATen's masked-fill dispatch); the [b, s, h] → [s, b, h]
    copy, and in the backward the lookup's copy of the transposed gradient; the sequence-
    parallel clone of a quarter. GPT-3 on NeMo (micro 1: no transpose; dropout 0.1): the
    dropout over its 512 × 12,288 shard, a read, a write and the 1-byte mask. torchtitan's
    Llama under FSDP (tp 1) and a serving plan: nothing; at tp 2, DTensor's fill in the
    forward alone."""
    from budget.accuracy import RUNS, plan_of
    from tests.plan_files import ROOT

    def passes(name: str) -> dict[str, tuple[int, int]]:
        (run,) = [r for r in RUNS if r.name == name]
        plan = plan_of(run)
        works = flops.embedding_output(plan, shapes(plan))
        back = flops.backward_of(works)
        return {w.name: (int(w.bytes), int(b.bytes)) for w, b in zip(works, back, strict=True)}

    full = 2 * 16384 * 6144
    assert full == 201_326_592
    assert passes("Nemotron-4 15B, 16 GPUs") == {
        flops.EMBEDDING_MASKED: (2 * full + 16384, 4 * full + 16384),
        flops.EMBEDDING_TRANSPOSE: (2 * full, 2 * full),
        flops.EMBEDDING_CLONE: (2 * full // 4, 0),
    }
    shard = 512 * 12288
    assert passes("GPT-3 175B, 128 GPUs") == {
        flops.EMBEDDING_MASKED: (2 * 2 * 2048 * 12288 + 2048, 4 * 2 * 2048 * 12288 + 2048),
        flops.EMBEDDING_CLONE: (2 * 2 * shard, 0),
        flops.EMBEDDING_DROPOUT: (5 * shard, 5 * shard),
    }
    fsdp = load_plan(ROOT / "plans" / "llama3-8b-fsdp.yaml")
    decode = load_plan(ROOT / "plans" / "llama3-70b-decode.yaml")
    for plan in (fsdp, decode):
        assert not flops.embedding_output(plan, shapes(plan)), plan.name
    split = replace(fsdp, parallel=replace(fsdp.parallel, tp=2, dp=4))
    (fill,) = flops.embedding_output(split, shapes(split))
    assert (fill.name, fill.bytes) == (flops.EMBEDDING_MASKED, 2 * 2 * 8192 * 4096 + 8192)
    assert flops.backward_of([fill])[0].bytes == 0


def test_the_embedding_gradient_is_a_dense_table_zeroed_then_read():
    """PyTorch's embedding backward writes the whole table's gradient, zero-filled first,
    and Megatron-Core's hook reads it again to add it into the main gradient: two passes of
    the tables' bf16 gradient a micro-batch. GPT-3 at tp 8 holds 51,200 / 8 word rows and
    2,048 learned positions of 12,288: 2 × 2 × (6,400 + 2,048) × 12,288 = 415,236,096 B on
    its first stage. Under FSDP the flattening reads it (its own passes), so one: MPT 760M's
    whole tables, 50,368 + 2,048 rows of 1,536, 2 × 80,510,976 = 161,021,952 B."""
    from budget.flops import EMBEDDING_GRADIENT

    def dense(plan):
        (stage, *_) = derive(plan).stages
        (phase,) = [p for p in stage.phases if p.name == "backward.embedding"]
        return [w.bytes for w in phase.works if w.name == EMBEDDING_GRADIENT]

    assert dense(load_plan(PLAN)) == [2 * 2 * (6400 + 2048) * 12288] == [415_236_096]
    (mpt,) = [r for r in RUNS if r.name == "MPT 760M, 8 GPUs"]
    assert dense(plan_of(mpt)) == [2 * (50368 + 2048) * 1536] == [161_021_952]


def test_a_fused_activations_backward_reads_the_gradient_and_the_input():
    """A fused activation's backward reads the incoming gradient (one width) and the saved
    input (``gate`` widths) and writes the input's gradient (``gate``): GELU 3 widths,
    SwiGLU 5 (Megatron-Core's ``swiglu_back(g, y)``). Llama 3 70B at tp 8: fc1 writes
    2 × 28,672 / 8 = 7,168 columns over 8,192 tokens, a width of 2 × 8,192 × 3,584 =
    58,720,256 B: 3 widths forward, 5 backward."""
    from tests.plan_files import ROOT

    plan = load_plan(ROOT / "plans" / "llama3-70b.yaml")
    width = 2 * 8192 * 3584
    (act,) = [w for w in flops.mlp_forward(plan, shapes(plan)) if w.name == "SwiGLU"]
    assert act.bytes == 3 * width == 176_160_768
    assert [w.bytes for w in flops.backward_of([act])] == [5 * width]


def test_the_embedding_gradient_stays_16_bit_under_an_fp8_gather(tmp_path):
    """``--fp8-param-gather`` makes Transformer Engine modules' weights fp8; the embedding is
    not one (`flops.outside_operands`), so its dense gradient is bf16 still: GPT-3's first
    stage moves the same 2 × 2 × (6,400 + 2,048) × 12,288 = 415,236,096 B (a review: it had
    been priced at 1 byte an element)."""
    from budget.flops import EMBEDDING_GRADIENT
    from tests.plan_files import ROOT, variant

    path = variant(
        tmp_path,
        "fp8.yaml",
        ("  params: bf16", "  params: fp8"),  # --fp8-param-gather's FP8 parameters
        ("  activations: bf16", "  activations: bf16\n  matmul: fp8\n  param_gather: fp8"),
        ("preset: a100-80gb, reserved: 3 GiB", "preset: h100-sxm, reserved: 3 GiB"),
        ("preset: dgx-a100", "preset: dgx-h100"),
        base=ROOT / "plans" / "gpt3-175b.yaml",
    )
    plan = load_plan(path)
    assert flops.operands(plan).weights == 1
    (stage, *_) = derive(plan).stages
    (phase,) = [p for p in stage.phases if p.name == "backward.embedding"]
    assert [w.bytes for w in phase.works if w.name == EMBEDDING_GRADIENT] == [415_236_096]


def test_fp8_training_prices_transformer_engine_s_casts_by_hand() -> None:
    """Under FP8 training each Transformer Engine GEMM's operands are cast (TransformerEngine
    2.5 ``linear.py``, ``module/base.py`` ``grad_output_preprocess``,
    ``layernorm_linear.py``). By hand for GPT-3 at tp 8 with sequence parallelism on
    Hopper, s = 2,048, b = 1, h = 12,288, a layer and micro-batch: forward, the output
    projection's input (s × h/8) and fc2's (s × 4h/8) read at 2 B and written at 1 B with
    a 1 B transpose, 4 B an element; backward, QKV's output gradient (s × 3h/8) and fc1's
    (s × 4h/8) the same, the row-parallel gradients (projection, fc2) cast on the shard
    (s/8 × h, 2 + 1 B) and transposed once gathered (s × h, 1 + 1 B): two kernels, and
    without sequence parallelism one, writing its transpose itself (a review); the QKV and
    fc1 inputs gathered again transposed (s × h, 2 B); the weights once a step, 12·h²/8 a
    layer over 12 layers, 2 + 2 B each. On Blackwell (no transposes) 3 B an element
    for the casts and no transpose kernels; none for a bf16 plan."""
    from dataclasses import replace

    from budget.plan.model import Precision
    from tests.builders import make_plan

    s, h = 2048, 12288
    fp8 = make_plan(recompute="none", precision=Precision(matmul="fp8"))

    def casts(plan, launches=False):
        step = derive(plan)
        out = {}
        for phase in step.stages[0].phases:
            for w in phase.works:
                if w.name.startswith("FP8") and w.bytes:
                    out[w.name] = (w.bytes, w.launches) if launches else w.bytes
        return out

    got = casts(fp8)
    assert got == {
        "FP8 cast of the output projection input": s * h // 8 * 4,
        "FP8 cast of the fc2 input": s * 4 * h // 8 * 4,
        "FP8 cast of the QKV output gradient": s * 3 * h // 8 * 4,
        "FP8 cast of the output projection output gradient": s // 8 * h * 3 + s * h * 2,
        "FP8 transpose of the QKV input, gathered again": s * h * 2,
        "FP8 cast of the fc1 output gradient": s * 4 * h // 8 * 4,
        "FP8 cast of the fc2 output gradient": s // 8 * h * 3 + s * h * 2,
        "FP8 transpose of the fc1 input, gathered again": s * h * 2,
        "FP8 casts of the GEMM weights": 12 * h * h // 8 * 12 * 4,
    }
    assert casts(fp8, launches=True)["FP8 cast of the fc2 output gradient"][1] == 2
    no_sp = casts(make_plan(recompute="none", sp=False, precision=Precision(matmul="fp8")), True)
    assert no_sp["FP8 cast of the fc2 output gradient"] == (s * h * 4, 1)
    assert not [name for name in no_sp if "gathered again" in name]
    blackwell = casts(replace(fp8, device=replace(fp8.device, fp8_transpose=False)))
    assert not [name for name in blackwell if "transpose" in name]
    assert blackwell["FP8 cast of the fc2 input"] == s * 4 * h // 8 * 3
    assert blackwell["FP8 cast of the fc2 output gradient"] == s // 8 * h * 3
    assert casts(make_plan(recompute="none")) == {}


def test_fp8_training_casts_the_shared_experts_fc1_input() -> None:
    """Megatron-Core's shared experts' fc1 is a Transformer Engine Linear after the MoE
    block's own norm, so it casts its input itself (a review found it left out): at tp 1,
    without sequence parallelism, with its transpose on Hopper, 2 + 1 + 1 B over s × h;
    DeepSeek-MoE 16B at s = 4,096, h = 2,048, micro 1 (the shipped plan)."""
    from dataclasses import replace

    plan = load_plan(Path(__file__).parents[1] / "plans" / "deepseek-moe-16b.yaml")
    fp8 = replace(plan, precision=replace(plan.precision, matmul="fp8"))
    s = shapes(fp8)
    (cast,) = [w for w in flops.fp8_input_casts(fp8, s, "moe") if "shared expert fc1" in w.name]
    assert s.tokens == s.tokens_sp == 4096 * plan.batch.micro and s.hidden == 2048
    assert cast.bytes == s.tokens * s.hidden * 4


def test_the_mtp_module_s_attention_is_counted_causally_where_the_main_model_s_is(tmp_path):
    """An audit (m144): `mfu_causal` counted DeepSeek-V3's multi-token prediction module's
    attention unmasked, 3 · 2·128·(192 + 128) · 4,096 = 1,006,632,960 FLOPs a token, where
    the causal mask computes (4,096 + 1)/2 keys a query on average: 503,439,360. The
    unmasked count (`mfu`) keeps the whole sequence."""
    from budget.flops import model_flops_per_token
    from budget.plan.load import load_plan

    plan_path = tmp_path / "dsv3.yaml"
    plan_path.write_text(
        "name: dsv3\nmode: train\nmodel: {preset: deepseek-v3}\n"
        "batch: {seq: 4096, micro: 1, global: 128}\n"
        "precision: {params: bf16, grads: fp32, master: fp32, optimizer: adam, "
        "activations: bf16}\n"
        "parallel: {tp: 1, pp: 1, dp: 64, ep: 64, zero: 1}\nrecompute: selective\n"
        "device: {preset: h100-sxm, reserved: 4 GiB}\ntopology: {preset: dgx-h100, nodes: 8}\n",
        encoding="utf-8",
    )
    plan = load_plan(plan_path)
    per_key = 3 * 2 * 128 * (192 + 128)  # a layer's attention, forward and backward, a key
    main = 61 * per_key
    unmasked, causal = model_flops_per_token(plan), model_flops_per_token(plan, causal=True)
    # the main model's 61 layers and the module's one, each at s keys or (s + 1)/2
    assert unmasked - causal == (main + per_key) * (4096 - 4097 / 2)
    assert per_key * 4096 == 1_006_632_960 and per_key * 4097 // 2 == 503_439_360


def test_fp8_weights_keep_norms_and_routers_16_bit_as_their_kernels_read_them(tmp_path):
    """An audit: under fp8 weights the memory table stored DeepSeek-V3's MoE routers and its
    norms at 1 B a parameter while the router's GEMM read its weights at 2 B
    (`outside_operands`): the fp8 release quantizes only the blocks' linear weights, and vLLM
    builds the gate unquantized. DeepSeek-V3 decoding at tp 8, fp8 weights, one rank: the
    layers' GEMM weights at 1 B and the rest at 2 B, where the rest is
    - the embedding and the output layer, ⌈129,280 / 8⌉ x 7,168 each: 231,669,760;
    - the norms, 61 layers x (7,168 x 2 + 1,536 + 512) + the final 7,168: 1,006,592;
    - the routers, 58 MoE layers x 256 x 7,168: 106,430,464.
    It held 85,012,012,032 B; it holds 85,012,012,032 + 106,430,464 + 1,006,592."""
    from budget.step import derive as derive_any

    plan = tmp_path / "v3.yaml"
    plan.write_text(
        "mode: decode\nmodel: {preset: deepseek-v3}\n"
        "batch: {sequences: 16, prompt: 4096, generate: 1001}\n"
        "precision: {params: fp8, activations: bf16}\nparallel: {tp: 8}\n"
        "device: {preset: h200, reserved: 4 GiB}\ntopology: {preset: dgx-h200, nodes: 1}\n",
        encoding="utf-8",
    )
    (stage,) = derive_any(load_plan(plan)).stages
    instant = next(p for p in stage.phases if p.instants).instants[0]
    held = {a.name: a.total for a in instant.live if a.category == "params"}
    vocab, norms, routers = (
        2 * 16_160 * 7_168,
        61 * (2 * 7_168 + 1_536 + 512) + 7_168,
        58 * 256 * 7_168,
    )
    assert (vocab, norms, routers) == (231_669_760, 1_006_592, 106_430_464)
    assert held["embedding and output layer parameters (bf16)"] == 2 * vocab
    assert held["norm and router parameters (bf16)"] == 2 * (norms + routers)
    assert sum(held.values()) == 85_012_012_032 + routers + norms == 85_119_449_088


def test_fp8_weights_keep_expert_biases_16_bit_and_name_each_stage_s_own(tmp_path):
    """A review: gpt-oss-120b's expert biases stayed at 1 B under fp8 weights, beside the
    experts' GEMM weights: at tp 8 (etp 8, ep 1) a rank holds, per layer, 128 experts' fc1
    bias split, 2 x 2,880 / 8 = 720, and fc2's whole, 2,880: 36 x 128 x 3,600 = 16,588,800
    parameters, now 2 B each. And the 16-bit row was named by the model: DeepSeek-V3's first
    stage of three dense layers read "norm, router and multi-token projection"; each stage
    now names what it holds."""
    from budget.step import derive as derive_any

    def params(text: str) -> list[dict[str, int]]:
        plan = tmp_path / "p.yaml"
        plan.write_text(text, encoding="utf-8")
        held = []
        for stage in derive_any(load_plan(plan)).stages:
            instant = next(p for p in stage.phases if p.instants).instants[0]
            held.append({a.name: a.total for a in instant.live if a.category == "params"})
        return held

    (oss,) = params(
        "mode: decode\nmodel: {preset: gpt-oss-120b}\n"
        "batch: {sequences: 16, prompt: 4096, generate: 1001}\n"
        "precision: {params: fp8, activations: bf16}\nparallel: {tp: 8}\n"
        "device: {preset: h100-sxm, reserved: 4 GiB}\ntopology: {preset: dgx-h100, nodes: 1}\n"
    )
    assert 36 * 128 * (2 * 2_880 // 8 + 2_880) == 16_588_800
    assert oss["expert bias parameters (bf16)"] == 2 * 16_588_800
    v3 = params(
        "model: {preset: deepseek-v3}\nbatch: {seq: 2048, micro: 1, global: 1024}\n"
        "precision: {params: fp8, master: fp32}\n"
        "parallel: {tp: 8, pp: 4, dp: 8, ep: 8, zero: 1, sequence_parallel: true,"
        " pipeline: {layers_per_stage: [3, 20, 19, 19]}}\n"
        "device: {preset: h100-sxm, reserved: 4 GiB}\ntopology: {preset: dgx-h100, nodes: 32}\n"
    )
    wide = [{k: v for k, v in s.items() if "(bf16)" in k and "embedding" not in k} for s in v3]
    # three dense layers' norms, 3 x (2 x 7,168 + 1,536 + 512), at 2 B
    assert wide[0] == {"norm parameters (bf16)": 2 * 3 * (2 * 7_168 + 1_536 + 512)}
    assert [list(s) for s in wide[1:]] == [
        ["norm and router parameters (bf16)"],
        ["norm and router parameters (bf16)"],
        ["norm, router and multi-token projection parameters (bf16)"],
    ]


def test_an_fp8_parameter_gather_gathers_the_16_bit_parameters_apart_in_bf16(tmp_path):
    """Megatron-LM's ``--fp8-param-gather`` keeps only Transformer Engine's GEMM weights in
    fp8; the distributed optimizer gathers the rest, kept 16-bit (`layers.resident_states`),
    from a bf16 buffer of its own. They were gathered at fp8's 1 B. DeepSeek-V3's last stage
    of 19 MoE layers and the multi-token prediction module at tp 8: the output layer and the
    module's copy of the word embedding, 2 x ⌈129,280 / 8⌉ x 7,168 = 231,669,760, and its
    norms, routers and projection, 49,901,568 (a review's hand count): 281,571,328
    parameters in bf16, the GEMM weights in fp8 (the experts' group is one rank here)."""
    from budget.layers import class_params, stage_classes
    from budget.step import derive as derive_any

    plan = tmp_path / "v3.yaml"
    plan.write_text(
        "model: {preset: deepseek-v3}\nbatch: {seq: 2048, micro: 1, global: 1024}\n"
        "precision: {params: fp8, master: fp32}\n"
        "parallel: {tp: 8, pp: 4, dp: 8, ep: 8, zero: 1, sequence_parallel: true,"
        " pipeline: {layers_per_stage: [3, 20, 19, 19]}}\n"
        "device: {preset: h100-sxm, reserved: 4 GiB}\ntopology: {preset: dgx-h100, nodes: 32}\n",
        encoding="utf-8",
    )
    layout = load_plan(plan)
    last = derive_any(layout).stages[-1]
    (phase,) = [p for p in last.phases if p.name == "optimizer"]
    gathers = {m.name: (m.dtype, m.size_bytes) for m in phase.moves}
    owned = class_params(layout, stage_classes(layout, merge=False)[-1])
    wide = 231_669_760 + 49_901_568
    assert owned.vocab_per_rank + owned.beside_gemms_per_rank == wide
    assert gathers["updated 16-bit parameters"] == ("bf16", 2 * wide)
    assert gathers["updated parameters"] == ("fp8", owned.per_rank - wide)
    assert set(gathers) == {"updated parameters", "updated 16-bit parameters"}


def test_the_16_bit_part_of_an_fp8_gather_waits_with_the_first_bucket(tmp_path):
    """A review: Megatron-LM merges the buffers an fp8 parameter gather keeps in bf16 into its
    last fp8 bucket group, the model's beginning, gathered first and waited for by the next
    step's first forward (``partition_buckets``, its third case): the 16-bit gather is
    exposed whole, and the fp8 one's first bucket, its 1/36 of gpt-oss-120b's 36 layers, with
    its own n·α. Priced apart, each had the embedding's share exposed and most of the 16-bit
    gather hid (4.58 ms of 6.51 at pp 1, dp 32)."""
    from budget.pipeline import build_report as report_of

    plan = tmp_path / "oss.yaml"
    plan.write_text(
        "model: {preset: gpt-oss-120b}\nbatch: {seq: 4096, micro: 1, global: 256}\n"
        "precision: {params: fp8, master: fp32, param_gather: fp8}\n"
        "parallel: {tp: 4, pp: 1, dp: 32, ep: 8, zero: 1, sequence_parallel: true}\n"
        "overlap: {dp_grads: true, param_gather: true}\n"
        "device: {preset: h100-sxm, reserved: 4 GiB}\ntopology: {preset: dgx-h100, nodes: 16}\n",
        encoding="utf-8",
    )
    (phase,) = [p for p in report_of(load_plan(plan)).phases if p.name == "optimizer"]
    rows = {c.name: c for c in phase.collectives if c.group == "dp"}
    wide, gemm = rows["updated 16-bit parameters"], rows["updated parameters"]
    assert wide.dtype == "bf16" and wide.exposed_s == wide.time_s > 0
    first = gemm.latency_term_s + (gemm.time_s - gemm.latency_term_s) / 36
    assert gemm.exposed_s == pytest.approx(first, rel=1e-12)


def test_an_interleaved_fp8_gather_waits_for_each_part_s_own_chunk_0(tmp_path):
    """A review: interleaved, Megatron-LM merges each model chunk's 16-bit buffers with its
    fp8 ones and the first forward waits for chunk 0's; the fp8 part's chunk-0 share had
    counted the embedding (stage 0 read 9.83 ms exposed) and the head (stage 3 7.52 ms),
    which it does not hold, and the last stage's 16-bit part, its head in the last chunk,
    was exposed whole. Llama 3 70B at pp 4 x 5 virtual stages, 4 of each stage's 20 layers
    in chunk 0: every stage's fp8 gather exposes 1/5 of itself (its chunk 0 waited for whole,
    on the first stage too, whose buckets the schedule launches at once, the embedding's last:
    audit m345); the last stage's 16-bit one only its first bucket, n·α and 1/20 of the
    rest."""
    from budget.schedule import step_time

    plan = tmp_path / "f70.yaml"
    plan.write_text(
        "model: {preset: llama3-70b}\nbatch: {seq: 8192, micro: 1, global: 128}\n"
        "precision: {params: fp8, master: fp32, param_gather: fp8}\n"
        "parallel: {tp: 8, pp: 4, dp: 8, zero: 1, sequence_parallel: true,"
        " pipeline: {schedule: interleaved, virtual_stages: 5}}\n"
        "overlap: {dp_grads: true, param_gather: true, pp: true}\n"
        "device: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 32}\n",
        encoding="utf-8",
    )
    layout = load_plan(plan)
    timed = step_time(layout, derive(layout))
    for i, stage in enumerate(timed.stages):
        (phase,) = [p for p in stage.phases if p.name == "optimizer"]
        gathers = {m.move.name: m for m in phase.moves if "parameters" in m.move.name}
        gemm, wide = gathers["updated parameters"], gathers["updated 16-bit parameters"]
        assert gemm.exposed_s == pytest.approx(gemm.time_s / 5, rel=1e-12), i
        if i == 3:
            alpha = float(wide.cost.latency_s)
            assert wide.exposed_s == pytest.approx(alpha + (wide.time_s - alpha) / 20, rel=1e-12)


def test_fp16_training_unscales_the_main_gradients_before_the_norm(tmp_path):
    """Megatron-LM's fp16 optimizer always has a loss scaler ("None grad scaler is only
    supported for bf16"), and ``_unscale_main_grads_and_check_for_nan`` reads and writes
    every fp32 main gradient (``_amp_foreach_non_finite_check_and_unscale_``): gpt-1.3b at
    ZeRO 0 in fp16, 8 B x 1,315,819,520 = 10,526,556,160 B, about 6.4 ms at the A100's
    1.655 TB/s. A bf16 plan has none (an audit, m436: fp16 was priced as bf16)."""
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    zero0 = ("  zero: 1\n", "  zero: 0\n")
    fp16 = variant(
        tmp_path,
        "fp16.yaml",
        zero0,
        ("  params: bf16", "  params: fp16"),
        ("  activations: bf16", "  activations: fp16"),
        base=base,
    )
    works = {w.name: w for w in _phase_works(load_plan(fp16), "optimizer")}
    assert works[flops.UNSCALED].bytes == 8 * 1_315_819_520 == 10_526_556_160
    names = list(works)
    assert names.index(flops.UNSCALED) < names.index("gradient norm")
    bf16 = variant(tmp_path, "bf16.yaml", zero0, base=base)
    assert flops.UNSCALED not in {w.name for w in _phase_works(load_plan(bf16), "optimizer")}


def test_deepspeed_zero_3_zeroes_no_gradient_buffer(tmp_path):
    """DeepSpeed's ZeRO 3 copies the first micro-batch's gradients into its partition buffer
    ("don't accumulate", stage3.py ``__partition_grads``) and its ``zero_grad`` sets the
    gradients to None: nothing to zero (an audit, m436: 0.33 GB a step was charged). Its
    ZeRO 2 keeps the pass."""
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    zeroed = {}
    for stage in (2, 3):
        path = variant(
            tmp_path,
            f"ds{stage}.yaml",
            ("  zero: 1\n", f"  zero: {stage}\n  reduce_bucket: 500000000\n"),
            ("  grads: fp32", "  grads: bf16"),
            base=base,
        )
        (work,) = [
            w for w in _phase_works(load_plan(path), "optimizer") if w.name == "zero main gradients"
        ]
        zeroed[stage] = work.bytes
    assert zeroed == {2: 2 * 1_315_819_520 // 8, 3: 0}


def test_deepspeed_fp16_scans_its_gradient_partition_for_overflow(tmp_path):
    """DeepSpeed unscales in its clipping pass, in either format, and under fp16 first scans
    its partition of 16-bit gradients: ZeRO 2 with ``check_overflow`` (``_has_inf_or_nan``
    runs ``x.float()``, ``isnan``, ``isinf``, ``logical_or``, ``.float()`` and ``.max()``:
    2 + 4, 4 + 1, 4 + 1, 2 + 1, 1 + 4 and 4 B an element, 28 in all, and its count added,
    seven kernels); ZeRO 3 with ``isinf(...).any()`` and ``isnan(...).any()`` on its flat
    buffer, 2 + 1 + 1 B twice, 8 in all, four kernels (a review, m445). gpt-1.3b over dp 8:
    28 x 1,315,819,520 / 8 = 4,605,368,320 B at ZeRO 2, 8 x 164,477,440 = 1,315,819,520 B at
    ZeRO 3. A bf16 plan has no scan, and a DeepSpeed plan no Megatron-style unscale (a
    review, m444)."""
    from budget.plan.load import load_plan
    from tests.plan_files import ROOT, variant

    base = ROOT / "plans" / "gpt-1.3b.yaml"
    formats = {}
    for fmt, zero in (("bf16", 2), ("fp16", 2), ("fp16", 3)):
        path = variant(
            tmp_path,
            f"ds-{fmt}-{zero}.yaml",
            ("  zero: 1\n", f"  zero: {zero}\n  reduce_bucket: 500000000\n"),
            ("  params: bf16", f"  params: {fmt}"),
            ("  grads: fp32", f"  grads: {fmt}"),
            ("  activations: bf16", f"  activations: {fmt}"),
            base=base,
        )
        formats[fmt, zero] = {w.name: w for w in _phase_works(load_plan(path), "optimizer")}
    scan = formats["fp16", 2][flops.OVERFLOW]
    assert (scan.bytes, scan.launches) == (28 * 1_315_819_520 // 8, 7.0) == (4_605_368_320, 7.0)
    scan = formats["fp16", 3][flops.OVERFLOW]
    assert (scan.bytes, scan.launches) == (8 * 1_315_819_520 // 8, 4.0) == (1_315_819_520, 4.0)
    assert formats["fp16", 2][flops.UNSCALED].bytes == 0  # its unscale is the clipping pass
    bf16 = formats["bf16", 2]
    assert flops.OVERFLOW not in bf16 and flops.UNSCALED not in bf16
