"""Presets: every number has a source, plans resolve from presets, overrides win."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from budget.catalog import DEVICES, MODELS, TOPOLOGIES
from budget.efficiency import curve_fraction, gemm_efficiency, inner_factor
from budget.errors import BudgetError
from budget.flops import Work, backward_of
from budget.plan.model import Device
from budget.plan.resolve import resolve
from budget.plan.yaml_load import Marks


def _tree(**sections: object) -> dict[str, object]:
    tree: dict[str, object] = {
        "model": {"preset": "llama3-8b"},
        "batch": {"seq": 8192, "micro": 1, "global": 64},
        "parallel": {"tp": 8},
        "device": {"preset": "h100-sxm"},
        "topology": {"preset": "dgx-h100", "nodes": 1},
    }
    tree.update(sections)
    return tree


def _resolve(tree: dict[str, object]):
    return resolve(tree, Marks(), "plan.yaml")


def test_every_preset_names_its_source() -> None:
    for device in DEVICES.values():
        assert device.source and device.gemm.source
    for topology in TOPOLOGIES.values():
        assert topology.source and all(level.source for level in topology.levels)
    for model in MODELS.values():
        assert model.source


def _peak(name: str, dtype: str = "bf16") -> float:
    """The preset's own dense peak in FLOP/s (checked against its datasheet below), so that a
    rate quoted as a fraction of that peak fails with a wrong peak, not only with a wrong
    fraction."""
    return dict(DEVICES[name].flops)[dtype]


def test_device_datasheet_peaks() -> None:
    """Dense peaks and HBM bandwidths as the datasheets `budget.catalog.devices` cites print
    them: sparse figures ("with sparsity") halved, node figures divided by the node's GPUs."""
    # NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16/FP16 1,979, FP8 3,958, TF32 989
    # TFLOPS with sparsity (989, 1,979, 494.5 dense), FP32 67; 80GB HBM3 at 3.35 TB/s
    assert dict(DEVICES["h100-sxm"].flops) == {
        "bf16": 989e12,
        "fp16": 989e12,
        "fp8": 1979e12,
        "tf32": 494.5e12,
        "fp32": 67e12,
    }
    assert DEVICES["h100-sxm"].memory_bandwidth == 3.35e12
    # the same datasheet, PCIe: BF16/FP16 1,513, FP8 3,026, TF32 756 with sparsity (756,
    # 1,513, 378 dense), FP32 51; 80GB HBM2e at 2 TB/s
    assert dict(DEVICES["h100-pcie"].flops) == {
        "bf16": 756e12,
        "fp16": 756e12,
        "fp8": 1513e12,
        "tf32": 378e12,
        "fp32": 51e12,
    }
    assert DEVICES["h100-pcie"].memory_bandwidth == 2.0e12
    # NVIDIA H200 Tensor Core GPU datasheet: the H100 SXM's tensor-core peaks, HBM3e 4.8 TB/s
    assert DEVICES["h200"].flops == DEVICES["h100-sxm"].flops
    assert DEVICES["h200"].memory_bandwidth == 4.8e12
    # NVIDIA HGX B200 / DGX B200 specifications, one node of 8 GPUs: 36 PFLOPS FP16/BF16,
    # 72 PFLOPS FP8 and 18 PFLOPS TF32 with sparsity (÷ 8 GPUs, ÷ 2 dense), 600 TFLOPS FP32
    assert dict(DEVICES["b200"].flops) == {
        "bf16": 36e15 / 8 / 2,  # 2,250 TFLOP/s
        "fp16": 36e15 / 8 / 2,
        "fp8": 72e15 / 8 / 2,  # 4,500
        "tf32": 18e15 / 8 / 2,  # 1,125
        "fp32": 600e12 / 8,  # 75
    }
    # NVIDIA's Blackwell datasheet: 7.7 TB/s a B200 (the driver's 7,680-bit bus at 3,996 MHz
    # DDR, 7.672 TB/s; the first HGX table's 64 TB/s over 8 had 8, an audit, m482)
    assert DEVICES["b200"].memory_bandwidth == 7.7e12
    assert DEVICES["b200"].memory_bandwidth == pytest.approx(7680 / 8 * 3996e6 * 2, rel=0.01)
    # AMD Instinct MI300X data sheet (dense): FP16/BF16 1,307.4 TFLOPS, FP8 2,614.9, TF32
    # 653.7, FP32 matrix 163.4; 192 GB HBM3 at 5.3 TB/s
    assert dict(DEVICES["mi300x"].flops) == {
        "bf16": 1307.4e12,
        "fp16": 1307.4e12,
        "fp8": 2614.9e12,
        "tf32": 653.7e12,
        "fp32": 163.4e12,
    }
    assert DEVICES["mi300x"].memory_bandwidth == 5.3e12
    # NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 312 TFLOPS, TF32 156, FP32 19.5
    # (dense), no FP8; 40GB HBM2 at 1,555 GB/s, 80GB HBM2e at 2,039 GB/s (SXM)
    a100 = {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
    assert dict(DEVICES["a100-80gb"].flops) == dict(DEVICES["a100-40gb"].flops) == a100
    assert dict(DEVICES["h100-sxm"].flops)["bf16"] == 989e12
    assert dict(DEVICES["h100-sxm"].flops)["fp8"] == 1979e12
    assert dict(DEVICES["a100-80gb"].flops)["bf16"] == 312e12
    assert DEVICES["a100-80gb"].memory_bandwidth == 2039e9
    assert DEVICES["a100-40gb"].memory_bandwidth == 1555e9
    assert "fp8" not in dict(DEVICES["a100-80gb"].flops)


def test_device_memory_is_the_driver_s_total() -> None:
    """nvidia-smi memory.total (MiB) as public logs print it, rocminfo's pool for the MI300X:
    the datasheet's "141GB" H200 holds 143,771 MiB = 140.4 GiB, not 141e9 B = 131.3 GiB, and
    the "80GB" H100 81,559 MiB = 79.6 GiB, not 80 GiB."""
    mib = {name: d.memory / 2**20 for name, d in DEVICES.items()}
    assert mib == {
        "a100-40gb": 40_960,
        "a100-80gb": 81_920,
        "h100-sxm": 81_559,
        "h100-pcie": 81_559,
        "h800": 81_559,
        "h200": 143_771,
        "b200": 183_359,
        "gb200": 189_471,
        "mi300x": 201_310_208 / 1024,
    }
    plan = _resolve(_tree(device={"preset": "h200"}, topology={"preset": "dgx-h200", "nodes": 1}))
    assert plan.device.memory == 150_754_820_096  # 143,771 x 2^20 B, 140.4 GiB
    # each preset's printed source says the figure it holds, beside the datasheet's rounded
    # "GB" (an audit: "1,440 GB HBM3e" over 8 is 167.6 GiB, the B200 preset holds 179.1)
    for name, device in DEVICES.items():
        kib = device.memory // 1024  # nvidia-smi says MiB, rocminfo KiB
        said = (f"{kib // 1024:,} MiB", f"{kib:,} KiB")
        assert "memory: " in device.source, name
        assert any(figure in device.source for figure in said), name


def test_gemm_curve_saturates_at_the_measured_ceiling() -> None:
    """Sustained rates at the power limit: the H100 SXM reaches gpu-fryer's 730 TFLOP/s at
    2·8192³ = 1.0995e12 FLOPs, so with the sm_90 ramp r (6.52 µs, fitted to OpenXLA's
    sweep: `test_the_sm90_and_sm100_ramps_and_k0_are_the_sweeps_least_squares`) its ceiling
    is 730e12 · F / (F − 730e12 · r) = 733.17 TFLOP/s. The H200's MSMF is 755 of 989; half of
    the ceiling at half_flops; the B200's MSMF 1439 of 2250; the A100 SXM's sustained
    cuBLASLt rate on Azure's ND A100 v4 (Bekman has only its burst, 271), 256.5 of 312."""
    # each ceiling against the preset's own peak (`_peak`, the datasheet's: test above)
    curve, h100 = DEVICES["h100-sxm"].gemm, _peak("h100-sxm")
    assert curve.half_flops / (curve.peak_fraction * h100) == pytest.approx(6.52e-6)
    assert curve.peak_fraction * h100 == pytest.approx(733.17e12, rel=1e-5)
    assert curve_fraction(curve, 2 * 8192**3) * h100 == pytest.approx(730e12)
    assert DEVICES["h200"].gemm.peak_fraction * _peak("h200") == pytest.approx(755e12)
    assert DEVICES["h800"].gemm == curve
    assert DEVICES["b200"].gemm.peak_fraction * _peak("b200") == pytest.approx(1439e12)
    a100 = DEVICES["a100-80gb"].gemm.peak_fraction * _peak("a100-80gb")
    assert a100 == pytest.approx(256.5e12)
    assert DEVICES["mi300x"].gemm.peak_fraction * _peak("mi300x") == pytest.approx(659e12)
    assert curve_fraction(curve, curve.half_flops) == pytest.approx(curve.peak_fraction / 2)
    assert curve_fraction(curve, 1e15) == pytest.approx(curve.peak_fraction, rel=1e-3)


def test_a_format_without_its_own_curve_keeps_the_ramp_time() -> None:
    """tf32 on an H100 has no sweep of its own: it keeps the bf16 curve's ceiling and its
    ramp of 6.52 µs (the ramp time carries over, `budget.catalog.devices`), where taking the
    bf16 half size against tf32's 494.5 TFLOP/s peak had doubled the ramp, and fp32's
    (67 TFLOP/s) made it 96 µs (an audit).

    By hand: the ceiling x = 730e12 · F / (F − 730e12 · 6.52e-6) / 989e12 = 0.741328 with
    F = 2·8192³ (gpu-fryer's 730 TFLOP/s at 8192³ on the sm_90 ramp); tf32's half size is
    x · 494.5e12 · 6.52e-6 = 2.3901e9 FLOPs, so a GEMM of 1e9 FLOPs (no inner dimension
    given: no K factor) reaches x · 1e9 / (1e9 + 2.3901e9) = 0.21867 of tf32's peak; fp32's
    is x · 67e12 · 6.52e-6 = 3.2384e8, and 0.55998."""
    preset = DEVICES["h100-sxm"]
    device = Device(memory=1, flops=preset.flops, gemm=preset.gemm)
    peaks = dict(preset.flops)
    flops_8192, ramp = 2 * 8192**3, 6.52e-6
    ceiling = 730e12 * flops_8192 / (flops_8192 - 730e12 * ramp) / 989e12
    assert ceiling == pytest.approx(0.741328, abs=5e-7)
    expected = {"tf32": (494.5e12, 2.3901e9, 0.21867), "fp32": (67e12, 3.2384e8, 0.55998)}
    for dtype, (peak, rounded_half, rounded_efficiency) in expected.items():
        assert peaks[dtype] == peak  # H100 datasheet (`test_device_datasheet_peaks`)
        half = ceiling * peak * ramp
        efficiency = ceiling * 1e9 / (1e9 + half)
        assert half == pytest.approx(rounded_half, rel=5e-5)  # the figures of the docstring
        assert efficiency == pytest.approx(rounded_efficiency, abs=5e-6)
        curve = preset.gemm.for_dtype(dtype, peaks[dtype] / peaks["bf16"])
        assert curve.half_flops / (curve.peak_fraction * peaks[dtype]) == pytest.approx(6.52e-6)
        assert curve.peak_fraction == pytest.approx(ceiling)
        assert curve.half_flops == pytest.approx(half)
        work = Work("gemm", "matmul", 10**9, 10**6)
        assert gemm_efficiency(device, work, dtype) == pytest.approx(efficiency)
    assert preset.gemm.for_dtype("bf16") is preset.gemm


def test_flat_efficiency_without_a_curve() -> None:
    work = Work("gemm", "matmul", 10**9, 10**6)
    assert gemm_efficiency(Device(memory=1, matmul_efficiency=0.7), work) == 0.7


def test_device_preset_with_overrides() -> None:
    plan = _resolve(
        _tree(device={"preset": "a100-80gb", "reserved": "3 GiB", "matmul_efficiency": 0.6})
    )
    assert plan.device.name == "a100-80gb"
    assert plan.device.memory == 80 * 2**30
    assert plan.device.reserved == 3 * 2**30
    assert plan.device.gemm is None and plan.device.matmul_efficiency == 0.6


def test_topology_preset_counts_nodes() -> None:
    plan = _resolve(_tree(parallel={"tp": 8, "dp": 4}, topology={"preset": "dgx-a100", "nodes": 4}))
    assert plan.topology.gpus == 32
    nvlink, ib = plan.topology.levels
    assert (nvlink.size, nvlink.bandwidth) == (8, pytest.approx(231.58e9))
    # NCCL's maintainers: 24 GB/s bus bandwidth per HDR 200 Gb/s NIC (nccl-tests issue 119)
    assert ib.bandwidth == pytest.approx(24e9)


def test_model_preset_overrides_win() -> None:
    plan = _resolve(_tree(model={"preset": "llama3-8b", "layers": 16}))
    assert plan.model.layers == 16 and plan.model.hidden == 4096
    assert plan.model.name == "llama3-8b"


@pytest.mark.parametrize("section", ["model", "device", "topology"])
def test_unknown_preset_is_a_problem(section: str) -> None:
    tree = _tree()
    tree[section] = {"preset": "nope", "nodes": 1} if section == "topology" else {"preset": "nope"}
    with pytest.raises(BudgetError) as raised:
        _resolve(tree)
    assert any(
        p.path == f"$.{section}.preset" and "unknown" in p.message for p in raised.value.problems
    )


def test_an_unknown_device_preset_still_has_its_own_keys_read() -> None:
    """`device: {preset: h100, reserved: 4}` said the preset, and the bare 4 only once the
    preset was mended (a user audit); a memory the preset would give is not guessed."""
    with pytest.raises(BudgetError) as raised:
        _resolve(_tree(device={"preset": "h100", "reserved": 4}))
    assert [p.path for p in raised.value.problems] == ["$.device.preset", "$.device.reserved"]
    with pytest.raises(BudgetError) as raised:
        _resolve(_tree(device={"preset": "h100", "reserved": "90 GiB"}))
    assert [p.path for p in raised.value.problems] == ["$.device.preset"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_preset_resolves(name: str) -> None:
    tree = _tree(
        model={"preset": name},
        batch={"seq": 2048, "micro": 1, "global": 64},
        # MoE layers under tp need sequence parallelism, as Megatron-LM requires
        parallel={"tp": 8, "sequence_parallel": True},
    )
    plan = _resolve(tree)
    assert plan.model.name == name


def test_every_plan_dir_plan_still_loads() -> None:
    from budget.plan.load import load_plan

    for path in sorted((Path(__file__).parent.parent / "plans").glob("*.yaml")):
        load_plan(path)


def test_nvlink4_collective_share_is_the_nccl_ring_figure() -> None:
    """NCCL reaches ~370 GB/s of the 450 GB/s NVLink 4 line rate on a ring (S. Jeaugey,
    NVIDIA/nccl-tests issue 212): the DGX H100 NVLink level prices at 370 GB/s."""
    nvlink = TOPOLOGIES["dgx-h100"].levels[0]
    assert nvlink.bandwidth == pytest.approx(370e9)
    # Azure's nccl-tests all_reduce on 8 x A100 SXM4: 231.58 GB/s bus bandwidth at 8 GiB.
    assert TOPOLOGIES["dgx-a100"].levels[0].bandwidth == pytest.approx(231.58e9)
    # NVLink 5: Azure's ND GB200 v6 ring all_reduce, 679.61 GB/s at 8 GiB of 900
    assert TOPOLOGIES["gb200-nvl72"].levels[0].bandwidth == pytest.approx(679.61e9)
    # and its ramp is that run's own sweep (it borrowed NVLink 4's until the sweep was read);
    # its α is the A100's, which that sweep's smallest point (1 MiB) bounds but does not
    # measure: marked assumed (an audit)
    assert TOPOLOGIES["gb200-nvl72"].levels[0].assumed == ("latency", "ramp")
    # the all-gather and reduce-scatter shares are the all-reduce sweeps' on A100 and GB200,
    # marked assumed (an audit, m513: shown as measured); DGX B200 borrows NVLink 5's figures
    assert TOPOLOGIES["dgx-a100"].levels[0].assumed == ("ramp",)
    b200 = TOPOLOGIES["dgx-b200"].levels[0]
    assert (b200.rate, b200.size, b200.bandwidth) == (900e9, 8, pytest.approx(679.61e9))
    assert b200.assumed == ("share", "latency", "ramp")
    assert TOPOLOGIES["dgx-b200"].levels[1].bandwidth == pytest.approx(47e9)


# OpenXLA's measured matmul table (tensorflow/tensorflow a305421,
# third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h), key "sm_90",
# b = 1, bf16 x bf16 -> bf16: (m, n, k) -> TFLOP/s: shapes across three orders of magnitude
# of FLOPs, two of them among the entries the ramp and K₀ are fitted to (`_WELL_OCCUPIED`).
_SM90_BF16 = {
    (256, 256, 256): 6.72,
    (1024, 2048, 1024): 384.0,
    (4096, 1024, 1024): 497.6,
    (512, 4096, 4096): 661.6,
    (4096, 4096, 1024): 685.2,
    (4096, 2048, 2048): 727.5,
    (1024, 4096, 4096): 751.9,
}


def _at_sweep_level(device: str, plateau: float, m: int, n: int, k: int) -> float:
    """TFLOP/s of an m·n·k GEMM timed as the engine times it, F / (x·g(K)) + ramp (its
    ramp and inner-dimension factor), at the level x of a sweep whose 4096³ entry is
    `plateau` TFLOP/s."""
    curve = DEVICES[device].gemm
    ramp_s = curve.half_flops / (curve.peak_fraction * DEVICES[device].flops[0][1])
    big = 2 * 4096**3
    level = big / ((big / (plateau * 1e12) - ramp_s) * inner_factor(curve, (4096,)))
    flops = 2 * m * n * k
    return flops / (flops / (level * inner_factor(curve, (k,))) + ramp_s) / 1e12


@pytest.mark.parametrize(("shape", "measured"), sorted(_SM90_BF16.items()))
def test_hopper_ramp_follows_xla_sweep(shape: tuple[int, int, int], measured: float) -> None:
    """The H100 curve, scaled to the sweep's own 4096³ plateau (780.2 TFLOP/s), reproduces
    these shapes within 10 % over three orders of magnitude of FLOPs (five of the seven are
    not among the entries the ramp and K₀ were fitted to). The exception is 256³ (33 MFLOP,
    a few tiles on 132 SMs): 24 % slow, where the size-only curve, whose ramp came from
    1024³, was 14 % slow; the ramp is now fitted to GEMMs that fill the SMs."""
    tolerance = 0.25 if shape == (256, 256, 256) else 0.10
    assert _at_sweep_level("h100-sxm", 780.2, *shape) == pytest.approx(measured, rel=tolerance)


# The same table's bf16 entries with at least 4096·2048 outputs (256 tiles of 128×256 or
# more, nearly two waves on 132 SMs), b = 1: at each size, K from 256 to 4096. K₀ (`_SM90_INNER`,
# `_SM100_INNER`) is the least-squares fit of these.
_WELL_OCCUPIED_SHAPES = (
    (2048, 4096, 256),
    (4096, 2048, 256),
    (2048, 4096, 512),
    (4096, 2048, 512),
    (2048, 4096, 1024),
    (4096, 2048, 1024),
    (2048, 4096, 2048),
    (4096, 2048, 2048),
    (2048, 4096, 4096),
    (4096, 2048, 4096),
    (4096, 4096, 256),
    (4096, 4096, 512),
    (4096, 4096, 1024),
    (4096, 4096, 2048),
    (4096, 4096, 4096),
)
_WELL_OCCUPIED = {
    "h100-sxm": (
        780.2,
        dict(
            zip(
                _WELL_OCCUPIED_SHAPES,
                (
                    303.3,
                    308.2,
                    449.3,
                    449.6,
                    596.5,
                    604.6,
                    725.5,
                    727.5,
                    752.3,
                    759.4,
                    398.6,
                    551.8,
                    685.2,
                    735.6,
                    780.2,
                ),
                strict=True,
            )
        ),
    ),
    "b200": (
        1416.9,
        dict(
            zip(
                _WELL_OCCUPIED_SHAPES,
                (
                    406.1,
                    403.6,
                    647.5,
                    652.3,
                    911.4,
                    913.8,
                    1172.8,
                    1170.0,
                    1342.5,
                    1343.5,
                    514.7,
                    805.3,
                    1075.6,
                    1277.8,
                    1416.9,
                ),
                strict=True,
            )
        ),
    ),
}


@pytest.mark.parametrize("device", sorted(_WELL_OCCUPIED))
def test_the_sm90_and_sm100_ramps_and_k0_are_the_sweeps_least_squares(device: str) -> None:
    """The catalogue's ramp and K₀ for Hopper and Blackwell are the least-squares fit of
    T = F / (x·K/(K + K₀)) + ramp to the well-occupied entries, in relative error: for each
    integer K₀ the level and ramp solve a linear least-squares problem in (1/x, ramp), and
    the K₀ with the smallest residual wins (sm_90: 125 and 6.52 µs; sm_100: 289, 4.90 µs)."""
    import numpy as np

    _, table = _WELL_OCCUPIED[device]
    m, n, k = (np.array([s[i] for s in table], dtype=float) for i in range(3))
    rate = np.array(list(table.values())) * 1e12
    flops = 2 * m * n * k
    best = None
    for k0 in range(0, 400):
        depth = k / (k + k0)
        design = np.stack([flops / depth, np.ones_like(flops)], axis=1) / (flops / rate)[:, None]
        coef = np.linalg.lstsq(design, np.ones_like(flops), rcond=None)[0]
        residual = float(np.sum((design @ coef - 1) ** 2))
        if best is None or residual < best[0]:
            best = (residual, k0, coef[1])
    curve = DEVICES[device].gemm
    ramp_s = curve.half_flops / (curve.peak_fraction * DEVICES[device].flops[0][1])
    assert curve.inner_half == best[1]
    assert ramp_s == pytest.approx(best[2], rel=5e-3)


@pytest.mark.parametrize("device", sorted(_WELL_OCCUPIED))
def test_a_shallow_inner_dimension_slows_a_gemm_as_the_sweep_measured(device: str) -> None:
    """At 34 GFLOP the H100 sweep runs 4096·4096·1024 at 685 TFLOP/s and 2048·4096·4096 at
    752: the inner dimension, not the size. The curve with its K₀ (125 on sm_90, 289 on
    sm_100) reproduces the well-occupied entries within 6 % each; by size alone, with the
    ramp the same two entries gave before (1024³: 252.8 and 288.0 TFLOP/s), the rms error
    is more than twice as large."""
    plateau, table = _WELL_OCCUPIED[device]
    errors = [_at_sweep_level(device, plateau, *s) / r - 1 for s, r in table.items()]
    at_1024 = {"h100-sxm": 252.8, "b200": 288.0}[device]
    ramp_s = 2 * 1024**3 * (plateau / at_1024 - 1) / (plateau * 1e12)
    size_only = []
    for (m, n, k), measured in table.items():
        flops = 2 * m * n * k
        size_only.append(plateau * flops / (flops + plateau * 1e12 * ramp_s) / measured - 1)
    rms = (sum(e * e for e in errors) / len(errors)) ** 0.5
    rms_size = (sum(e * e for e in size_only) / len(size_only)) ** 0.5
    assert max(abs(e) for e in errors) < 0.06
    assert rms_size > 2 * rms


def test_memory_bound_fraction_is_babelstream_on_the_preset() -> None:
    """Azure's BabelStream runs: copy, mul, add, triad average 2.935 of 3.35 TB/s on H100
    SXM and 1.655 of 2.039 on A100 SXM4 80GB; a plan's own memory_efficiency wins."""
    assert DEVICES["h100-sxm"].memory_efficiency == pytest.approx(2.935 / 3.35)
    assert DEVICES["a100-80gb"].memory_efficiency == pytest.approx(1.655 / 2.039)
    # Azure's H200 run (AI-benchmarking-guide, 7f20e5f): copy, mul, add, triad 4.01, 4.00,
    # 4.15, 4.15 TB/s of the datasheet's 4.8; the MI300X's (samuel-bohman's copy of the
    # guide, 3de0c29) 4.11, 4.26, 4.14, 4.09 of 5.3
    h200 = (4.01 + 4.00 + 4.15 + 4.15) / 4 / 4.8
    assert DEVICES["h200"].memory_efficiency == pytest.approx(h200)
    mi300x = (4.11 + 4.26 + 4.14 + 4.09) / 4 / 5.3
    assert DEVICES["mi300x"].memory_efficiency == pytest.approx(mi300x)
    # the A100 40GB and the H100 PCIe take their chip's fraction, marked assumed
    assert DEVICES["a100-40gb"].memory_efficiency == pytest.approx(1.655 / 2.039)
    assert DEVICES["h100-pcie"].memory_efficiency == pytest.approx(2.935 / 3.35)
    assert {"stream"} <= set(DEVICES["a100-40gb"].assumed) & set(DEVICES["h100-pcie"].assumed)
    assert DEVICES["b200"].memory_efficiency == 0.8  # no measurement found
    assert DEVICES["gb200"].memory_efficiency == 0.8 and "stream" in DEVICES["gb200"].assumed
    plan = _resolve(_tree(device={"preset": "h100-sxm"}))
    assert plan.device.memory_efficiency == pytest.approx(2.935 / 3.35)
    plan = _resolve(_tree(device={"preset": "h100-sxm", "memory_efficiency": 0.7}))
    assert plan.device.memory_efficiency == 0.7


def test_fp8_gemms_follow_the_fp8_sustained_ceiling() -> None:
    """Bekman's FP8 table: an H200 sustains 1354 of 1979 dense FP8 TFLOP/s, which the H100
    takes. A 16384³ GEMM read in fp8 on an H100 plan takes 2·16384³ / (1354e12 · F/(F + F½))
    with the bf16 ramp time; in bf16 it takes the same FLOPs at the bf16 ceiling (733.17e12).
    Its inner dimension, 16384, is past the calibration's 8192: no faster for it."""
    from budget.flops import gemm
    from budget.schedule import work_time

    flops = 2 * 16384**3
    work = gemm("big", 16384, 16384, 16384, 1)
    fp8 = _resolve(_tree(precision={"matmul": "fp8"}))
    bf16 = _resolve(_tree())
    ceiling = 733.174e12  # gpu-fryer's 730 at 8192³ on the curve (test above)
    ramp_s = 6.52e-6  # the sm_90 ramp
    expected_fp8 = (flops + 1354e12 * ramp_s) / 1354e12
    expected_bf16 = (flops + ceiling * ramp_s) / ceiling
    assert work_time(fp8, work) == pytest.approx(expected_fp8, rel=1e-4)
    big = gemm("big", 16384, 16384, 16384, 2)
    assert work_time(bf16, big) == pytest.approx(expected_bf16, rel=1e-4)
    # The attention core stays in bf16 under an FP8 recipe (Transformer Engine).
    core = Work("attention core (flash)", "attention", flops, 10**6, keys=8192)
    assert work_time(fp8, core) == pytest.approx(work_time(bf16, core))
    # An A100 has no FP8 tensor cores: the plan is refused, at precision.matmul.
    with pytest.raises(BudgetError) as refused:
        _resolve(_tree(device={"preset": "a100-80gb"}, precision={"matmul": "fp8"}))
    (problem,) = refused.value.problems
    assert problem.path == "$.precision.matmul"
    assert "a100-80gb preset has no fp8 peak" in problem.message


def test_attention_core_runs_in_the_activations_format() -> None:
    """Under an FP8 recipe the attention core stays in the activations' bf16; a plan whose
    activations are fp16 times it at the fp16 peak (the same 989 TFLOP/s on an H100)."""
    from budget.schedule import work_time

    core = Work("attention core (flash)", "attention", 2 * 8192**3, 10**6, keys=8192)
    bf16 = _resolve(_tree())
    fp8 = _resolve(_tree(precision={"matmul": "fp8"}))
    assert fp8.precision.activations == "bf16"
    assert work_time(fp8, core) == pytest.approx(work_time(bf16, core))
    # `flash` on an H100 is cuDNN's fused attention: 529 TFLOP/s forward (causal) and 518
    # backward (unmasked; FlashAttention-3 paper, Figures 5 and 6, 8K), the backward made
    # causal at 0.9111 (test below): 471.94, and 3.5 / (1/529 + 2.5/471.94) = 486.9 together.
    # Each pass runs at its own rate: the forward kernel at 529, its backward (2.5 times the
    # FLOPs) at 471.94, so the two take the FLOPs of both at 486.9.
    (backward,) = backward_of([core])
    assert work_time(bf16, core) == pytest.approx(core.flops / 529e12, rel=1e-4)
    assert work_time(bf16, backward) == pytest.approx(
        2.5 * core.flops / (518 * 0.91108 * 1e12), rel=1e-4
    )
    both = work_time(bf16, core) + work_time(bf16, backward)
    assert both == pytest.approx(3.5 * core.flops / 486.9e12, rel=1e-4)


def test_causal_calls_run_at_the_cudnn_sweeps_causal_to_unmasked_ratios() -> None:
    """NVIDIA/cudnn-frontend's H200 sweep (cuDNN 9.19.1, head dim 128): a causal call does
    half the FLOPs of an unmasked one, so its rate over the unmasked rate is t_u / (2·t_c).
    At 8K, forward 3.182 / (2 · 1.708) = 0.9315 and backward 9.262 / (2 · 5.083) = 0.9111; at
    2K 0.681 / (2 · 0.464) = 0.7338 backward. Held at 2K below it and at 16K above."""
    from budget.catalog.devices import _causal

    assert _causal(8192) == pytest.approx((0.93150, 0.91108), abs=5e-5)
    assert _causal(2048)[1] == pytest.approx(0.73384, abs=5e-5)
    assert _causal(512) == _causal(2048) and _causal(131072) == _causal(16384)


def test_fused_attention_rates_are_the_published_measurements() -> None:
    """cuDNN and FlashAttention-3 on H100 from the FlashAttention-3 paper (8K, head dim 128):
    causal forward 529 and 602, unmasked backward 518 and 559, made causal at 0.91108 (test
    above), combined as 3.5 / (1/fwd + 2.5/bwd): 486.9 and 532.7 TFLOP/s. FlashAttention-2
    from Azure's unmasked runs (batch 2, sequence 8192): H100 327.9, H200 329.3, A100 179.5.
    The paper's unmasked FA2 bars at 8K (forward 370, backward 318) give 3.5 / (1/370 +
    2.5/318) = 331.30, within 1 % of Azure's H100 run; causal (333, and 318 · 0.91108 =
    289.72) they give 3.5 / (1/333 + 2.5/289.72) = 300.89, and at Azure's level 300.89 ·
    327.9 / 331.30 = 297.80. The A100's one figure made causal at 8K: forward 179.5 ·
    0.93150 = 167.20, backward 179.5 · 0.91108 = 163.54, together 164.57."""
    # TFLOP/s at each preset's own bf16 peak (`_peak`: 989 and 312, their datasheets')
    peak = _peak("h100-sxm") / 1e12
    h100 = {rate.kernel: rate for rate in DEVICES["h100-sxm"].attention}
    assert h100["cudnn"].at(8192) * peak == pytest.approx(486.94, abs=0.02)
    assert h100["flash3"].at(8192) * peak == pytest.approx(532.73, abs=0.02)
    assert h100["flash2"].at(8192) * peak == pytest.approx(297.80, abs=0.02)
    h200 = {rate.kernel: rate for rate in DEVICES["h200"].attention}
    h200_flash2 = h200["flash2"].at(8192) * _peak("h200") / 1e12
    assert h200_flash2 == pytest.approx(300.89 * 329.3 / 331.30, abs=0.02)
    a100 = DEVICES["a100-80gb"].attention[0]
    assert a100.kernel == "flash2"
    assert a100.at(8192) * _peak("a100-80gb") / 1e12 == pytest.approx(164.57, abs=0.02)
    # MI300X: Azure's unmasked 328.6 TFLOP/s at 8K, made causal by the same 8K ratios
    (mi300x,) = DEVICES["mi300x"].attention
    assert mi300x.kernel == "flash2" and not mi300x.derived
    assert mi300x.at(8192) * _peak("mi300x") / 1e12 == pytest.approx(
        164.57 * 328.6 / 179.5, abs=0.02
    )


def test_b200_attention_is_its_cudnn_frontend_sweep() -> None:
    """The B200's causal rates are cudnn-frontend's B200 run (cuDNN 9.13, FlashAttention
    2.7.4): cuDNN at 8K forward 1,171.278 and backward 942.509 TFLOP/s, 3.5 / (1/1171.278 +
    2.5/942.509) = 998.2 of 2,250 (44.4 %); FlashAttention-2 399.925 and 318.004, 337.8.
    Unmasked, over the GB200 run's ratios at 8K (1.286 / (2 · 0.688) = 0.93459 forward,
    3.901 / (2 · 2.097) = 0.93014 backward): 3.5 / (0.93459/1171.278 + 2.5 · 0.93014/942.509)
    = 1071.9. Below 2K the 2K rate holds: 3.5 / (1/478.921 + 2.5/371.486) = 396.9."""
    rates = {rate.kernel: rate for rate in DEVICES["b200"].attention}
    assert list(rates) == ["cudnn", "flash2"]  # `flash` runs cuDNN
    peak = _peak("b200") / 1e12  # the preset's own: 2,250 (`test_device_datasheet_peaks`)
    assert rates["cudnn"].at(8192) * peak == pytest.approx(998.2, abs=0.05)
    assert rates["flash2"].at(8192) * peak == pytest.approx(337.8, abs=0.05)
    assert rates["cudnn"].at(8192, 0.0) * peak == pytest.approx(1071.9, abs=0.05)
    assert rates["cudnn"].at(512) * peak == pytest.approx(396.9, abs=0.05)
    assert "cudnn-frontend" in rates["cudnn"].source


def test_gb200_is_its_own_part_with_its_own_cudnn_sweep() -> None:
    """The GB200 is not the B200. Peaks from NVIDIA's GB200 NVL72 specifications (360 PFLOPS
    FP16/BF16 with sparsity over 72 GPUs, halved: 2,500 TFLOP/s; FP8 720 → 5,000; TF32 180
    → 1,250; FP32 5,760 TFLOPS over 72 = 80; 576 TB/s over 72 = 8 TB/s).

    GEMM: Bekman's GB200 burst, 1822, at the B200's MSMF/MAMF (1439 / 1745) is 1502.50
    TFLOP/s, 60.1 %; the same from Azure's sustained FP8 run at the B200's bf16/FP8 MSMF,
    2906.9 · 1439 / 2788 = 1500.35, agrees within 0.2 %. The FP8 curve passes through that
    run: 2906.9 TFLOP/s at F = 2·16384³ on the sm_100 ramp.

    cuDNN from cudnn-frontend's GB200 sweep (batch 1, 64 heads of 128): a causal 8K call's
    forward is 2·8192²·64·128 = 1.0995e12 FLOPs in 0.688 ms, 1,598.1 TFLOP/s, its backward
    2.5 times that in 2.097 ms, 1,310.8, together 3.5 / (1/1598.1 + 2.5/1310.8) = 1,381.8;
    unmasked, 2.199e12 in 1.286 ms (1,710.0) and 2.5 times in 3.901 ms (1,409.3): 1,483.8.
    FlashAttention-2 at the B200's fractions: 337.8 / 2,250 · 2,500 = 375.3, within 0.4 % of
    Azure's GB200 figure (373.9), and marked derived."""
    gb200, b200 = DEVICES["gb200"], DEVICES["b200"]
    assert dict(gb200.flops) == {
        "bf16": 2500e12,
        "fp16": 2500e12,
        "fp8": 5000e12,
        "tf32": 1250e12,
        "fp32": 80e12,
    }
    assert gb200.memory_bandwidth == 576e12 / 72 and gb200.sms == 152
    assert gb200.gemm.peak_fraction * 2500e12 == pytest.approx(1502.50e12, rel=1e-5)
    assert gb200.gemm.peak_fraction * 2500e12 == pytest.approx(2906.9e12 * 1439 / 2788, rel=2e-3)
    fp8 = gb200.gemm.for_dtype("fp8", 2.0)
    assert curve_fraction(fp8, 2 * 16384**3) * 5000e12 == pytest.approx(2906.9e12)
    assert "gemm" in gb200.assumed  # its bf16 ceiling is derived from a burst
    rates = {rate.kernel: rate for rate in gb200.attention}
    assert list(rates) == ["cudnn", "flash2"]  # `flash` runs cuDNN, as on the B200
    assert rates["cudnn"].at(8192) * 2500 == pytest.approx(1381.8, abs=0.05)
    assert rates["cudnn"].at(8192, 0.0) * 2500 == pytest.approx(1483.8, abs=0.05)
    assert not rates["cudnn"].derived and "GB200" in rates["cudnn"].source
    b200_flash2 = {rate.kernel: rate for rate in b200.attention}["flash2"]
    assert rates["flash2"].at(8192) == pytest.approx(b200_flash2.at(8192))
    assert rates["flash2"].at(8192) * 2500 == pytest.approx(373.9, rel=0.004)
    assert rates["flash2"].derived


def test_triton_attention_is_flashattention2_slowed_by_the_fa2_papers_ratios() -> None:
    """FlashAttention in Triton: FlashAttention-2's causal forward at 1/1.4 and backward at
    1/2 (FA2 paper, section 4.1). A100, at FA2's causal 167.20 and 163.54 (test above): 3.5
    / (1.4/167.20 + 2.5·2/163.54) = 89.87 TFLOP/s. H100 at 8K, FA2 bars 333 forward and
    289.72 backward: 3.5 / (1.4/333 + 5/289.72) = 163.08, at Azure's FA2 level × 327.9 /
    331.30 = 161.40; at 2K (298, and 291 · 0.73384 = 213.55): 124.50 · 0.98973 = 123.22.
    Never a default."""
    a100 = {rate.kernel: rate for rate in DEVICES["a100-80gb"].attention}
    assert a100["triton"].at(2048) * 312 == pytest.approx(89.87, abs=0.01)
    h100 = {rate.kernel: rate for rate in DEVICES["h100-sxm"].attention}
    assert h100["triton"].at(8192) * 989 == pytest.approx(161.40, abs=0.02)
    assert h100["triton"].at(2048) * 989 == pytest.approx(123.22, abs=0.02)
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h800", "h200"):
        kernels = [rate.kernel for rate in DEVICES[name].attention]
        assert "triton" in kernels and kernels[0] != "triton"


def test_fused_attention_rates_follow_the_keys_per_call() -> None:
    """The same figures at 2K: cuDNN forward 484, backward 465 · 0.73384 = 341.24 (causal,
    test above), so 3.5 / (1/484 + 2.5/341.24) = 372.65 TFLOP/s, 23 % below its 486.9 at 8K.
    FlashAttention-2 takes the paper's shape at Azure's level: 298 and 291 · 0.73384 =
    213.55 at 2K give 232.36, × 0.98973 = 229.97. Between lengths the rate is interpolated in
    log keys; outside 512 ... 16K it holds the nearest bar (at 512 with 2K's causal ratio).
    The A100's one measured length holds at every length."""
    h100 = {rate.kernel: rate for rate in DEVICES["h100-sxm"].attention}
    assert h100["cudnn"].at(2048) * 989 == pytest.approx(372.65, abs=0.02)
    assert h100["flash2"].at(2048) * 989 == pytest.approx(229.97, abs=0.02)
    for part in ("forward", "backward"):
        rate = partial(h100["cudnn"].at, part=part)
        assert rate(2048 * 2**0.5) == pytest.approx((rate(2048) + rate(4096)) / 2)
    at_512 = 3.5 / (1 / 315 + 2.5 / (305 * 0.73384))  # cuDNN's bars at 512 tokens: 244.0
    assert h100["cudnn"].at(128) == h100["cudnn"].at(512) == pytest.approx(at_512 / 989, 1e-4)
    assert h100["cudnn"].at(131072) == h100["cudnn"].at(16384)
    a100 = DEVICES["a100-80gb"].attention[0]
    assert a100.at(1024) == a100.at(8192) == a100.at(65536)
    # The array path (search) reads the same values as the scalar one (a plan).
    import numpy as np

    keys = np.array([100, 2048, 3000, 8192, 50000])
    assert np.allclose(h100["flash3"].at(keys), [h100["flash3"].at(int(k)) for k in keys])
    shares = np.array([1.0, 0.5, 0.25, 1 / 16, 0.0])
    assert np.allclose(
        h100["cudnn"].at(keys, shares),
        [h100["cudnn"].at(int(k), float(c)) for k, c in zip(keys, shares, strict=True)],
    )
    # a call without a mask (decoding) runs at the unmasked rate: at 8K 539.05 TFLOP/s
    assert h100["cudnn"].at(8192, 0.0) * 989 == pytest.approx(539.05, abs=0.02)


def test_ring_context_parallelism_calls_the_kernel_on_one_block_of_keys() -> None:
    """Ring attention calls the kernel once per ring step on seq / cp keys; all-gather
    context parallelism once on the whole gathered sequence. The header says which.
    Under Megatron's load-balanced split only the ring's diagonal step is causal (1/cp of
    the FLOPs) and all-gather masks c²/2 of each chunk's pairs (1/(2·cp)); the rest run
    unmasked, the ring's on c = seq/(2·cp) = 2,048 keys (its slowest rank's length at every
    unmasked step, `budget.flops.unmasked_keys`). cuDNN causal at 4K: 3.5 / (1/518 +
    2.5/(499 · 0.84586)) = 445.66; unmasked at 2K (the paper's unmasked bars) 3.5 / (1/617
    + 2.5/465) = 500.21, so the cp-2 ring's calls run at 2 / (1/445.66 + 1/500.21) = 471.36
    TFLOP/s. The all-gather's forward calls meet 8K keys, a quarter causal: 1 / (0.25/529 +
    0.75/600) = 580.52; its backward loops each key block over one chunk's 2,048 queries
    (`budget.flops.backward_keys`), read at 2K: 1 / (0.25/341.24 + 0.75/465) = 426.34, so
    together 3.5 / (1/580.52 + 2.5/426.34) = 461.35."""
    from budget.flops import backward_keys, causal_share, unmasked_keys
    from budget.pipeline import build_report
    from budget.render.table import header

    ring_plan = _resolve(_tree(parallel={"tp": 4, "cp": 2, "cp_attention": "ring"}))
    gathered_plan = _resolve(_tree(parallel={"tp": 4, "cp": 2, "cp_attention": "allgather"}))
    assert causal_share(ring_plan) == 0.5 and causal_share(gathered_plan) == 0.25
    assert causal_share(_resolve(_tree())) == 1.0
    ring, gathered = build_report(ring_plan), build_report(gathered_plan)
    assert ring.device["attention_keys"] == 4096
    assert gathered.device["attention_keys"] == 8192
    assert unmasked_keys(ring_plan, 8192) == 2048
    assert unmasked_keys(gathered_plan, 8192) == 8192
    assert unmasked_keys(_resolve(_tree()), 8192) == 8192
    assert backward_keys(gathered_plan, 8192) == 2048
    assert backward_keys(ring_plan, 8192) is None
    assert backward_keys(_resolve(_tree()), 8192) is None
    assert ring.device["attention_unmasked_keys"] == 2048
    assert gathered.device["attention_unmasked_keys"] == 8192
    assert ring.device["attention_fraction"] * 989 == pytest.approx(471.36, abs=0.02)
    assert gathered.device["attention_fraction"] * 989 == pytest.approx(461.35, abs=0.02)
    assert gathered.device["attention_backward_keys"] == 2048
    assert ring.device["attention_backward_keys"] is None
    assert ring.device["attention_causal"] == 0.5
    assert gathered.device["attention_causal"] == 0.25
    text = " ".join(header(ring))
    assert (
        "at 4,096 keys per call (measured); 1/2 of the calls' work under the causal mask, "
        "the rest unmasked at 2,048 keys" in text
    )
    said = " ".join(header(gathered))
    assert "of peak, its forward at 8,192 keys per call (measured)" in said
    assert "the rest unmasked; its backward at 2,048 keys a call" in said
    plain = build_report(_resolve(_tree()))
    assert plain.device["attention_causal"] == 1.0
    assert plain.device["attention_unmasked_keys"] is None
    assert "causal mask" not in " ".join(header(plain))

    # the kernel on fewer keys runs slower: the same attention FLOPs take longer in the ring
    # plan's forward attention phase
    def attention_s(report):
        (row,) = [p for p in report.phases if p.name == "forward.attention"]
        return row.compute_s

    assert attention_s(ring) > attention_s(gathered)


def test_a_derived_attention_rate_says_so() -> None:
    """The Triton kernel's rate is computed from FlashAttention-2's, not measured: the report
    says ``derived`` (JSON and header) and still reads it at the keys each call meets."""
    from budget.pipeline import build_report
    from budget.render.table import header

    report = build_report(_resolve(_tree(model={"preset": "llama3-8b", "attention": "triton"})))
    assert report.device["attention_rate"] == "derived"
    assert report.device["attention_keys"] == 8192
    assert "(derived from another kernel's measurement)" in header(report)[-1]
    measured = build_report(_resolve(_tree(model={"preset": "llama3-8b", "attention": "flash2"})))
    assert measured.device["attention_rate"] == "measured"


def test_flash_is_the_device_default_kernel_and_named_kernels_need_a_rate() -> None:
    h100 = _resolve(_tree()).device
    assert h100.attention_fraction("flash", 8192) == h100.attention_fraction("cudnn", 8192)
    a100 = _resolve(_tree(device={"preset": "a100-80gb"})).device
    assert a100.attention_fraction("flash", 8192) * 312 == pytest.approx(164.57, abs=0.02)
    with pytest.raises(BudgetError) as refused:
        _resolve(
            _tree(
                device={"preset": "a100-80gb"}, model={"preset": "llama3-8b", "attention": "flash3"}
            )
        )
    (problem,) = refused.value.problems
    assert problem.path == "$.model.attention"
    assert (
        "a100-80gb preset has no rate for it" in problem.message
        and "(it has flash2, triton (derived))" in problem.message
    )
    forced = _resolve(
        _tree(
            device={"preset": "a100-80gb", "attention_efficiency": 0.5},
            model={"preset": "llama3-8b", "attention": "flash3"},
        )
    )
    assert forced.device.attention_fraction("flash3", 2048) == 0.5
    with pytest.raises(BudgetError) as no_cudnn:  # an AMD GPU runs no cuDNN
        _resolve(
            _tree(device={"preset": "mi300x"}, model={"preset": "llama3-8b", "attention": "cudnn"})
        )
    assert "(it has flash2)" in no_cudnn.value.problems[0].message


def test_fused_kernels_time_attention_at_their_rate_and_keep_flash_memory() -> None:
    from budget.pipeline import build_report
    from budget.schedule import work_time

    core = Work("attention core (flash)", "attention", 2 * 8192**3, 10**6, keys=8192)
    times = {}
    peaks = {}
    for kernel in ("flash", "flash2", "flash3", "cudnn", "triton"):
        plan = _resolve(_tree(model={"preset": "llama3-8b", "attention": kernel}))
        times[kernel] = sum(work_time(plan, w) for w in (core, *backward_of([core])))
        peaks[kernel] = build_report(plan).worst.peak_bytes
    # forward and backward: 3.5 times the forward's FLOPs at FlashAttention-2's 297.80
    assert times["flash2"] == pytest.approx(3.5 * core.flops / 297.80e12, rel=1e-4)
    assert times["flash"] == times["cudnn"] < times["flash2"] < times["triton"]
    assert times["flash3"] < times["cudnn"]
    assert len(set(peaks.values())) == 1  # every fused kernel keeps only row statistics
    eager = _resolve(_tree(model={"preset": "llama3-8b", "attention": "eager"}))
    assert build_report(eager).worst.peak_bytes > peaks["flash"]


def test_fused_attention_rates_are_of_the_bf16_peak_whatever_the_activations() -> None:
    """The kernels were measured in bf16: fp32 activations (whose peak is a fifteenth of
    bf16's on an H100) do not make the measured cuDNN kernel fifteen times slower. (fp8
    activations, whose peak is twice bf16's, are refused in training and serving alike: audits
    m508 and m525.)"""
    from budget.schedule import work_time

    core = Work("attention core (flash)", "attention", 2 * 8192**3, 10**6, keys=8192)
    bf16 = _resolve(_tree())
    fp32 = _resolve(_tree(precision={"activations": "fp32"}))
    assert fp32.precision.activations == "fp32"
    assert fp32.device.peak_flops("fp32") < bf16.device.peak_flops("bf16") / 10
    assert work_time(fp32, core) == pytest.approx(work_time(bf16, core))
    assert work_time(bf16, core) == pytest.approx(core.flops / 529e12, rel=1e-4)


def test_the_report_says_which_kernel_times_attention() -> None:
    from budget.pipeline import build_report
    from budget.render.table import header

    report = build_report(_resolve(_tree()))
    assert report.device["attention_kernel"] == "cudnn"
    assert report.device["attention_fraction"] == pytest.approx(486.94 / 989, rel=1e-4)
    assert report.device["attention_keys"] == 8192
    assert (
        "attention: flash = cudnn at 49.2% of peak at 8,192 keys per call (measured)"
        in header(report)[-1]
    )
    # a preset with no measured kernel (none ships without one) prices it on its GEMM curve
    plan = _resolve(_tree(device={"preset": "mi300x"}))
    unmeasured = build_report(replace(plan, device=replace(plan.device, attention=())))
    assert unmeasured.device["attention_fraction"] is None
    assert "attention: flash on the GEMM curve (not measured on this device)" in " ".join(
        header(unmeasured)
    )
    given = build_report(
        _resolve(_tree(device={"preset": "h100-sxm", "attention_efficiency": 0.3}))
    )
    assert "flash = cudnn at 30.0% of peak (device.attention_efficiency)" in header(given)[-1]


def test_the_header_says_when_a_rate_is_held_or_the_device_is_written_out() -> None:
    """The A100 has one measured length (8,192 keys): at 2,048 the header says the rate is
    carried from there, not measured. A device written out by hand has no measurement at
    all, and the header says how to give one."""
    from budget.pipeline import build_report
    from budget.render.table import header

    a100 = build_report(
        _resolve(
            _tree(device={"preset": "a100-80gb"}, batch={"seq": 2048, "micro": 1, "global": 64})
        )
    )
    assert a100.device["attention_held_at"] == 8192
    assert (
        "at 2,048 keys per call (measured at 8,192 keys and held there; a shorter call likely "
        "runs slower)"
    ) in " ".join(header(a100))
    h100 = build_report(_resolve(_tree()))
    assert h100.device["attention_held_at"] is None  # 8,192 keys: between 512 and 16K
    written = {
        "memory": "80 GiB",
        "flops": {"bf16": "989 TFLOP/s"},
        "memory_bandwidth": "3.35 TB/s",
    }
    plain = build_report(_resolve(_tree(device=written)))
    assert "flash like a GEMM at the written device's matmul efficiency" in " ".join(header(plain))


def test_a_serving_plan_reports_the_rate_of_its_prefill_calls() -> None:
    """Decode is memory-bound; the kernel's rate matters in the prefill, whose calls meet the
    prompt's keys and run forward only (2,048 here: cuDNN's causal forward at 484 TFLOP/s,
    48.9 % of 989; a training call's forward and backward together would be 372.65)."""
    from budget.pipeline import build_report
    from budget.render.table import header

    serving = _tree(
        mode="decode",
        model={"preset": "llama3-70b"},
        batch={"prompt": 2048, "generate": 512, "sequences": 32},
    )
    report = build_report(_resolve(serving))
    assert report.device["attention_keys"] == 2048
    assert report.device["attention_fraction"] * 989 == pytest.approx(484.0, abs=0.02)
    assert "at 48.9% of peak at 2,048 keys per prefill call (measured)" in header(report)[-1]


# gpu-benches' gpu-small-kernels (te42kyfo/gpu-benches 11f5daa, *_graph.txt): elements d of a
# streaming scale kernel (16 bytes moved each) and the GB/s of the fastest block size, at
# sizes beyond twice the L2; the presets' startup is the least-squares a of T = a + V / b.
_SMALL_KERNELS = {
    "a100-80gb": {
        5250033: 1641, 6613527: 1663, 8331138: 1679, 10494834: 1694, 13220466: 1706,
        16653979: 1715, 20979216: 1722, 26427769: 1728, 33291376: 1734, 41937544: 1738,
        52829226: 1741, 61620009: 1742,
    },
    "h200": {
        6613527: 3089, 8331138: 3153, 10494834: 3200, 13220466: 3243, 16653979: 3276,
        20979216: 3308, 26427769: 3326, 33291376: 3343, 41937544: 3358, 52829226: 3374,
        66549609: 3378, 83833340: 3386, 105605863: 3391, 133032972: 3396, 167583229: 3400,
        211106603: 3402, 265933520: 3405,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(_SMALL_KERNELS))
def test_kernel_startup_is_the_fit_of_the_published_small_kernel_sweep(name) -> None:
    import numpy as np

    points = _SMALL_KERNELS[name]
    volume = np.array([16.0 * d for d in points])
    seconds = volume / (np.array(list(points.values())) * 1e9)
    (a, per_byte), *_ = np.linalg.lstsq(
        np.vstack([np.ones_like(volume), volume]).T, seconds, rcond=None
    )
    assert np.max(np.abs((a + per_byte * volume) / seconds - 1)) < 0.002  # the model fits
    assert DEVICES[name].kernel_startup == pytest.approx(a, rel=0.01)
    assert DEVICES["h100-sxm"].kernel_startup == DEVICES["h200"].kernel_startup  # same die
    assert DEVICES["a100-40gb"].kernel_startup == DEVICES["a100-80gb"].kernel_startup
    # no sweep of either: the H200's, marked assumed (a startup of 0 made their decode
    # 15-17 % faster against the H100 than their bytes; review)
    for name in ("b200", "gb200", "mi300x"):
        assert DEVICES[name].kernel_startup == DEVICES["h200"].kernel_startup
        assert "start" in DEVICES[name].assumed


def test_a_memory_bound_kernel_takes_its_startup_beyond_its_bytes() -> None:
    """On an H100: 1 MB of norm traffic takes 3.23 µs + 1e6 / (3.35e12 · 0.876) = 3.57 µs,
    0.34 µs of it moving bytes; a compute-bound GEMM is unchanged; an empty kernel is free.
    A written device has no startup unless the plan gives one."""
    from budget.flops import elementwise, gemm
    from budget.schedule import work_time

    h100 = _resolve(_tree())
    stream = 3.35e12 * (2.90 + 2.90 + 2.97 + 2.97) / 4 / 3.35
    norm = elementwise("attention norm", 10**6)
    assert work_time(h100, norm) == pytest.approx(3.23e-6 + 1e6 / stream)
    assert work_time(h100, elementwise("empty", 0)) == 0.0
    big = gemm("MLP fc1", 8192, 8192, 28672, 2)
    no_startup = _resolve(_tree(device={"preset": "h100-sxm", "kernel_startup": "0 us"}))
    assert work_time(h100, big) == work_time(no_startup, big)
    assert work_time(no_startup, norm) == pytest.approx(1e6 / stream)
    written = {
        "memory": "80 GiB",
        "memory_bandwidth": "3.35 TB/s",
        "flops": {"bf16": "989 TFLOP/s"},
    }
    assert _resolve(_tree(device=written)).device.kernel_startup == 0.0
    given = _resolve(_tree(device={**written, "kernel_startup": "2 us"}))
    assert given.device.kernel_startup == pytest.approx(2e-6)
    with pytest.raises(BudgetError) as refused:
        _resolve(_tree(device={**written, "kernel_startup": "soon"}))
    assert refused.value.problems[0].path == "$.device.kernel_startup"


def _attention_cores(plan) -> list[Work]:
    """Every attention kernel of every phase of `plan`'s step."""
    from budget.step import derive

    return [
        work
        for stage in derive(plan).stages
        for phase in stage.phases
        for work in phase.works
        if work.kind == "attention"
    ]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_every_attention_kernel_of_a_step_carries_its_keys_per_call(recompute) -> None:
    """Forward, recomputed and backward attention cores all meet seq / cp keys per ring
    step (8192 / 4 here) in their causal calls and seq / (2·cp) in their unmasked ones; the
    forward and its recomputed copies run at the forward's rate, the backward at its own. A
    Work rebuilt without keys would be refused, not priced at the shortest measured
    length."""
    from budget.schedule import work_time

    plan = _resolve(_tree(parallel={"tp": 2, "cp": 4}, recompute=recompute))
    cores = _attention_cores(plan)
    names = {work.name for work in cores}
    assert "attention core (flash)" in names and "attention core (flash) backward" in names
    if recompute != "none":
        assert any("(recomputed)" in name for name in names)
    assert {work.keys for work in cores} == {2048}
    assert {work.unmasked_keys for work in cores} == {1024}
    passes = {work.name: work.attention_pass for work in cores}
    assert {passes[name] for name in names if name.endswith(" backward")} == {"backward"}
    assert {passes[name] for name in names if not name.endswith(" backward")} == {"forward"}
    lost = Work("attention core (flash)", "attention", 10**12, 10**6)
    with pytest.raises(ValueError, match="no keys per call"):
        work_time(plan, lost)


def test_an_all_gather_backward_runs_on_one_chunk_of_queries() -> None:
    """All-gather context parallelism: the forward calls meet the gathered 8192 keys, the
    backward calls (and only they) loop over one chunk, 8192 / (2·4) = 1024, for the causal
    and the unmasked share alike; recomputed forwards keep the forward's length."""
    plan = _resolve(
        _tree(parallel={"tp": 2, "cp": 4, "cp_attention": "allgather"}, recompute="full")
    )
    cores = _attention_cores(plan)
    lengths = {(w.attention_pass, w.keys, w.unmasked_keys) for w in cores}
    assert lengths == {("forward", 8192, 8192), ("backward", 1024, 1024)}
    assert any(w.name.endswith("(recomputed)") for w in cores)


# Published parameter counts (total, activated per token): GPT-3 175B (Brown et al., arXiv
# 2005.14165, Table 2.1); Llama 3 8B, 70B and 405B (arXiv 2407.21783, Table 3, and the model
# cards' 8.03B and 70.6B); Mixtral 8x7B 47B / 13B (arXiv 2401.04088, section 2.1) and 8x22B
# 141B / 39B (Mistral AI's release post); DeepSeek-V3 671B / 37B (arXiv 2412.19437,
# abstract); Qwen1.5-MoE-A2.7B 14.3B / 2.7B (Qwen's release post); gpt-oss-120b 116.83B /
# 5.13B (arXiv 2508.10925, Table 1), whose active count leaves out the input embedding
# table (201,088 x 2880 = 579,133,440): with it, 5.71B. DeepSeek-V3's "37B" does not say
# whether it counts the input embedding (129,280 x 7,168, of which a lookup reads one row):
# held, as `tests/test_presets.py` holds it, without it to the rounding of "37B" (its 671B
# total to the rounding of "671B", half a billion, 0.075 %); None: not a relative tolerance.
PUBLISHED: dict[str, tuple[float, float | None, float]] = {
    "gpt3-175b": (175e9, 175e9, 0.005),
    "llama3-8b": (8.03e9, 8.03e9, 0.005),
    "llama3-70b": (70.6e9, 70.6e9, 0.005),
    "llama3-405b": (405e9, 405e9, 0.005),
    "mixtral-8x7b": (46.7e9, 12.9e9, 0.01),
    "mixtral-8x22b": (141e9, 39e9, 0.01),
    "deepseek-v3": (671e9, None, 0.5e9 / 671e9),
    "qwen-moe": (14.3e9, 2.7e9, 0.01),
    "gpt-oss-120b": (116.83e9, 5.13e9 + 579_133_440, 0.001),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_preset_has_its_published_size(name: str) -> None:
    from budget.layers import active_params, params_total

    total, active, tolerance = PUBLISHED[name]
    tree = _tree(
        model={"preset": name},
        batch={"seq": 2048, "micro": 1, "global": 64},
        parallel={"tp": 8, "sequence_parallel": True},
    )
    plan = _resolve(tree)
    assert params_total(plan) == pytest.approx(total, rel=tolerance)
    if active is None:  # DeepSeek-V3: "37B" without the input embedding, 36.5 ≤ x < 37.5 B
        assert name == "deepseek-v3"
        assert 36.5e9 <= active_params(plan) - 129_280 * 7_168 < 37.5e9
    else:
        assert active_params(plan) == pytest.approx(active, rel=tolerance)


def test_experts_and_mla_override_a_preset_key_by_key() -> None:
    """A plan may change one key of a preset's experts or latent attention; a section the
    preset lacks must be written out whole."""
    parallel = {"tp": 8, "sequence_parallel": True}
    plan = _resolve(
        _tree(
            model={"preset": "mixtral-8x7b", "experts": {"capacity_factor": 1.25}},
            parallel=parallel,
        )
    )
    assert (plan.model.experts.count, plan.model.experts.capacity_factor) == (8, 1.25)
    plan = _resolve(
        _tree(model={"preset": "deepseek-v3", "mla": {"kv_rank": 256}}, parallel=parallel)
    )
    assert (plan.model.mla.kv_rank, plan.model.mla.nope_dim, plan.model.mla.q_rank) == (
        256,
        128,
        1536,
    )
    with pytest.raises(BudgetError) as raised:
        _resolve(_tree(model={"preset": "llama3-8b", "experts": {"capacity_factor": 1.25}}))
    (problem,) = raised.value.problems
    assert problem.path == "$.model.experts"
    assert "lacks count and top_k" in problem.message


def test_h800_is_the_h100_sxm_with_its_own_nvlink() -> None:
    """The H800 SXM is the H100 SXM with NVLink cut to 400 GB/s both ways (arXiv 2505.09343):
    every device number is the H100 SXM's. DeepSeek-V3 reaches 160 GB/s of NVLink one way and
    names IB's 50 GB/s (arXiv 2412.19437, section 3.2.2): 160 of the 200 GB/s line rate."""
    h800, h100 = DEVICES["h800"], DEVICES["h100-sxm"]
    assert (h800.flops, h800.memory, h800.memory_bandwidth) == (
        h100.flops,
        h100.memory,
        h100.memory_bandwidth,
    )
    assert (h800.gemm, h800.attention, h800.memory_efficiency, h800.kernel_startup) == (
        h100.gemm,
        h100.attention,
        h100.memory_efficiency,
        h100.kernel_startup,
    )
    nvlink, ib = TOPOLOGIES["hgx-h800"].levels
    assert (nvlink.rate, nvlink.bandwidth) == (200e9, pytest.approx(160e9))
    # 46-48 GB/s per NDR 400 Gb/s NIC, NCCL's maintainers (nccl-tests issue 290)
    assert ib.rate == 50e9 and ib.bandwidth == pytest.approx(47e9)
    plan = _resolve(
        _tree(
            parallel={"tp": 8, "dp": 32},
            device={"preset": "h800"},
            topology={"preset": "hgx-h800", "nodes": 32},
        )
    )
    assert plan.topology.gpus == 256 and plan.device.name == "h800"
    assert [level.bandwidth for level in plan.topology.levels] == [
        pytest.approx(160e9),
        pytest.approx(47e9),
    ]


def test_an_attention_rate_says_where_it_is_held() -> None:
    """One length measured (A100, 8,192 keys) holds everywhere else; a sweep of 512 ... 16K
    (H100) holds only outside it."""
    a100 = DEVICES["a100-80gb"].attention[0]
    assert (a100.held_at(2048), a100.held_at(8192), a100.held_at(65536)) == (8192, None, 8192)
    cudnn = DEVICES["h100-sxm"].attention[0]
    assert (cudnn.held_at(256), cudnn.held_at(4096), cudnn.held_at(131072)) == (512, None, 16384)


def test_the_qwen_moe_preset_is_its_config_json() -> None:
    """The preset and Qwen1.5-MoE-A2.7B's released config.json give the same model: the
    Hub's 14,315,784,192 parameters, q, k and v biases (24 x 3 x 2048) included."""
    from budget.layers import params_total

    data = Path(__file__).parent / "data" / "hf" / "qwen1.5-moe-a2.7b" / "config.json"
    batch = {"seq": 2048, "micro": 1, "global": 64}
    parallel = {"tp": 2, "dp": 4, "sequence_parallel": True}
    preset = _resolve(_tree(model={"preset": "qwen-moe"}, batch=batch, parallel=parallel))
    config = _resolve(_tree(model={"hf_config": str(data)}, batch=batch, parallel=parallel))
    assert params_total(preset) == params_total(config) == 14_315_784_192


def test_a_problem_with_a_key_the_preset_gave_is_placed_where_the_author_looks() -> None:
    """A check between two model keys is placed at the one the plan writes (heads written
    as 30 against the preset's 8 kv_heads: at heads); one about a key only the preset
    gives is placed at model.preset and says the preset gave it."""
    with pytest.raises(BudgetError) as preset:
        _resolve(_tree(model={"preset": "deepseek-v3", "layers": 2}, parallel={"dp": 8}))
    (problem,) = preset.value.problems
    assert problem.path == "$.model.preset"
    assert problem.message.startswith(
        "preset deepseek-v3 gives model.experts.first_dense_layers: first_dense_layers = 3 "
        "leaves no MoE layer in a model of 2 layers"
    )
    with pytest.raises(BudgetError) as refused:
        _resolve(_tree(model={"preset": "llama3-8b", "heads": 30, "head_dim": 128}))
    problem, _tp = refused.value.problems  # and heads against tp 8
    assert problem.path == "$.model.heads"  # the key the plan writes
    assert problem.message.startswith("model.heads = 30 is not divisible by model.kv_heads = 8")
    with pytest.raises(BudgetError) as gave:  # a written hidden the preset's heads do not divide
        _resolve(_tree(model={"preset": "gpt3-175b", "hidden": 12290}))
    problem, *_ = gave.value.problems
    assert problem.path == "$.model.hidden"
    assert problem.message.startswith("model.hidden = 12290 is not divisible by model.heads = 96")
    with pytest.raises(BudgetError) as written:
        _resolve(_tree(model={"preset": "llama3-8b", "kv_heads": 6}))
    problem, _tp = written.value.problems
    assert problem.path == "$.model.kv_heads"
    assert problem.message.startswith("model.heads = 32 is not divisible by model.kv_heads = 6")


def test_a_release_in_a_format_budget_does_not_price_makes_serving_name_its_weights(
    tmp_path,
) -> None:
    """gpt-oss-120b's experts are released in MXFP4 (its config.json's quantization_config),
    which budget does not price; a serving plan on the preset priced them as bf16, 3.6 times
    the release, where hf_config refuses the file (an audit). Training keeps bf16 weights."""
    serve = (
        "name: oss\nmode: decode\nmodel: {preset: gpt-oss-120b}\n"
        "batch: {sequences: 8, prompt: 1024, generate: 256}\n"
        "parallel: {tp: 8}\ndevice: {preset: h100-sxm}\ntopology: {preset: dgx-h100, nodes: 1}\n"
    )
    from budget.plan.load import load_plan

    path = tmp_path / "oss.yaml"
    path.write_text(serve, encoding="utf-8")
    with pytest.raises(BudgetError) as refused:
        load_plan(path)
    (problem,) = refused.value.problems
    assert problem.path == "$.model.preset" and "released with weights in mxfp4" in problem.message
    path.write_text(serve + "precision: {params: fp8}\n", encoding="utf-8")
    assert load_plan(path).precision.params == "fp8"


def test_a_misnamed_device_preset_is_offered_its_own_family() -> None:
    """`h100-80gb` was told "did you mean 'a100-80gb'?", the nearest spelling and another GPU,
    which followed ran silently on an A100 (an audit); a name of a known family is offered
    that family's presets."""
    with pytest.raises(BudgetError) as raised:
        _resolve(_tree(device={"preset": "h100-80gb"}))
    (problem,) = [p for p in raised.value.problems if p.path == "$.device.preset"]
    assert "did you mean 'h100-pcie' or 'h100-sxm'?" in problem.message
    # a model's or a topology's first word is no family: their nearest spelling stands
    with pytest.raises(BudgetError) as raised:
        _resolve(_tree(model={"preset": "gpt-3-175b"}))
    assert any("did you mean 'gpt3-175b'?" in p.message for p in raised.value.problems)


def test_a_pattern_keeps_the_first_dense_layers_dense() -> None:
    """An audit, m492: `pattern` beside `first_dense_layers` made the leading layers MoE,
    unsaid (DeepSeek-MoE 16B with an all-true pattern read 28 MoE layers and 0.5 B more
    parameters). The leading layers stay dense under a pattern, a preset's too (DeepSeek-V3's
    3), and 0 lifts them; a pattern with no MoE layer past them is refused."""
    written = {"tp": 1, "dp": 8, "ep": 8}
    base = {"preset": "deepseek-v3", "layers": 8}
    flags = _resolve(
        _tree(model={**base, "experts": {"pattern": [True] * 8}}, parallel=written)
    ).model.moe_flags
    assert flags == (False,) * 3 + (True,) * 5
    lifted = {**base, "experts": {"pattern": [True] * 8, "first_dense_layers": 0}}
    assert _resolve(_tree(model=lifted, parallel=written)).model.moe_flags == (True,) * 8
    none_left = {**base, "experts": {"pattern": [True] * 3 + [False] * 5}}
    with pytest.raises(BudgetError) as refused:
        _resolve(_tree(model=none_left, parallel=written))
    (problem,) = refused.value.problems
    assert problem.path == "$.model.experts.pattern"
    assert "no layer an MoE layer past the first_dense_layers = 3" in problem.message


def test_the_header_says_where_the_attention_rate_was_measured_at_another_head_dim() -> None:
    """Every fused-attention rate was measured at one head dimension: 128 in the
    FlashAttention-3 paper's figures and cudnn-frontend's sweeps, 64 in Azure's A100 and
    MI300X runs (a review, m537: the MI300X's read as not stated). A model of another runs
    at a rate not measured (the paper's cuDNN forward bars at 8K: 412 TFLOP/s at head dim 64
    against 600 at 128), and the header said "(measured)" of it (an audit, m536): it now
    names both where they differ, as `budget search` does, and the report and `budget
    presets` give the measured one."""
    from budget.pipeline import budget_plan
    from budget.presets import device_dict
    from budget.render.table import header

    plans = Path(__file__).parent.parent / "plans"
    said = {}
    for name in ("llama3-70b", "gemma2-9b", "gpt3-175b"):
        report = budget_plan(plans / f"{name}.yaml")
        said[name] = (
            report.device["attention_head_dim"],
            " ".join(" ".join(header(report)).split()),
        )
    assert said["llama3-70b"][0] == 128 and "head dim" not in said["llama3-70b"][1]
    assert said["gemma2-9b"][0] == 128
    assert "measured at head dim 128, where this model's is 256" in said["gemma2-9b"][1]
    assert said["gpt3-175b"][0] == 64
    assert "measured at head dim 64, where this model's is 128" in said["gpt3-175b"][1]
    from budget.plan.load import load_plan
    from budget.render.search import hardware_text
    from budget.search import hardware

    searched = hardware(load_plan(plans / "gemma2-9b.yaml"))
    assert (searched["attention_head_dim"], searched["head_dim"]) == (128, 256)
    text = " ".join(hardware_text(searched).split())
    assert "(measured), measured at head dim 128, where this model's is 256" in text
    dims = {
        name: {rate["kernel"]: rate["head_dim"] for rate in device_dict(DEVICES[name])["attention"]}
        for name in ("a100-80gb", "h100-sxm", "b200", "mi300x")
    }
    assert dims == {
        "a100-80gb": {"flash2": 64, "triton": 64},
        "h100-sxm": {"cudnn": 128, "flash3": 128, "flash2": 128, "triton": 128},
        "b200": {"cudnn": 128, "flash2": 128},
        "mi300x": {"flash2": 64},
    }
