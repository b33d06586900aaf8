"""Plans built in code for engine tests, independent of YAML loading."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from budget.plan.model import (
    Batch,
    Device,
    Level,
    Model,
    Parallel,
    Pipeline,
    Plan,
    Precision,
    Topology,
)

GIB = 2**30

# GPT-3 175B (Brown et al., arXiv 2005.14165, Table 2.1) with Megatron's padded vocabulary.
GPT3 = Model(
    layers=96,
    hidden=12288,
    heads=96,
    kv_heads=96,
    head_dim=128,
    ffn=4 * 12288,
    vocab=51200,
    mlp="gelu",
    norm="layernorm",
    bias=False,
    tied_embeddings=True,
    position="rope",
    attention="flash",
    dropout=False,
)


def make_plan(
    model: Model = GPT3,
    *,
    seq: int = 2048,
    micro: int = 1,
    global_batch: int = 1536,
    tp: int = 8,
    pp: int = 8,
    dp: int = 16,
    cp: int = 1,
    sp: bool = True,
    zero: int = 1,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    recompute: str = "selective",
    memory: int = 80 * GIB,
    reserved: int = 0,
    precision: Precision | None = None,
    **model_overrides: Any,
) -> Plan:
    """A training plan; the world size is whatever the degrees multiply to."""
    if model_overrides:
        model = replace(model, **model_overrides)
    gpus = tp * pp * dp * cp
    return Plan(
        name="test",
        file="test.yaml",
        mode="train",
        model=model,
        batch=Batch(seq=seq, micro=micro, global_batch=global_batch),
        precision=precision or Precision(),
        parallel=Parallel(
            tp=tp,
            pp=pp,
            dp=dp,
            cp=cp,
            sequence_parallel=sp,
            zero=zero,
            pipeline=Pipeline(schedule=schedule, virtual_stages=virtual_stages),  # type: ignore[arg-type]
        ),
        device=Device(memory=memory, reserved=reserved),
        topology=Topology(
            gpus=gpus,
            levels=(Level("nvlink", 300e9, 3e-6, 8), Level("infiniband", 25e9, 10e-6)),
        ),
        recompute=recompute,  # type: ignore[arg-type]
    )
