"""Device presets: datasheet peaks and memory, and a calibrated GEMM efficiency curve. Peaks
are dense (the datasheets print sparse figures twice as large, footnoted "with sparsity");
FLOP/s are decimal (1 TFLOP/s = 1e12); bandwidths are decimal bytes per second. Memory is the
card's total as its driver reports it, not the datasheet's rounded "GB", which is neither 10^9
nor 2^30 bytes exactly: nvidia-smi's memory.total is 40,960 MiB on the A100 40GB and 81,920
MiB on the A100 80GB, 81,559 MiB on the H100 80GB (modal-labs/modal-client PR 2797, which
lists nvidia-smi totals by GPU; NVIDIA/nccl issue 1264 on an HGX H100), the same 81,559 MiB on
the H100 PCIe and the H800 (public nvidia-smi logs), 143,771 MiB on the H200 "141GB"
(NVIDIA/TensorRT-LLM issue 16827), 183,359 MiB on the B200 "180GB" (NVIDIA/TensorRT-LLM issue
10278) and 189,471 MiB on the GB200 "186GB" (the same total in several unrelated public
nvidia-smi listings of the part; no vendor page gives it); rocminfo gives the MI300X "192 GB"
a global pool of 201,310,208 KiB (ROCm/legacy-rocm-build issue 4414). Read as decimal GB, the
H200 would lose 9.1 GiB and the B200 11.4 GiB that a plan can use; read as GiB, the H100 would
gain 0.35 GiB it does not have. What a process cannot use of that total is not reserved by a
preset: the part CUDA itself keeps out of it (PyTorch's out-of-memory messages give an H100 "a
total capacity of 79.10 GiB", 0.55 GiB under nvidia-smi's), the CUDA context on top, NCCL's
buffers and the allocator's slack; a plan states them as ``device.reserved``.
GEMM efficiency (`budget.efficiency`): ``peak_fraction`` is the
fraction of the dense bf16 peak a public matmul microbenchmark sustains on that device;
``half_flops`` is the GEMM size reaching half of it (at the calibration's inner dimension,
`budget.efficiency`). Sources of the calibration, none of them a training run:

- MSMF and MAMF: S. Bekman, "Machine Learning Engineering", compute/accelerator/README.md,
  "Maximum Achievable and Sustainable Matmul FLOPS comparison table" (BF16 and FP8,
  torch.matmul on random inputs, mamf-finder.py benchmark version 4, read at ml-engineering
  commit 0359db8). MSMF ("maximum sustainable") is the throughput a shape holds over a 2 s
  window once the chip sits at its power limit; MAMF ("maximum achievable") is a short burst
  at the boost clock. The source says to use MSMF for training throughput, and a training
  step keeps every GPU of a node at its power limit for seconds, so the ceiling is MSMF
  wherever it was measured: H200 SXM 755 of 989 (76.3 %, measured with the node's other GPUs
  busy), B200 SXM 1439 of 2250 (64.0 %, likewise), MI300X 659 TFLOP/s (50.4 % of the 1,307.4
  datasheet peak). The GB200 has only a burst there (MAMF 1822 of 2500, in a later version
  of the chapter than 0359db8, measured with torch 2.10.0.dev20250916+cu130); it takes the
  B200's ratio of sustained to burst (MSMF 1439 over the MAMF 1745 that later version
  lists, torch 2.7.1+cu128) on the same design, 1502.5 (60.1 %,
  marked assumed), which Azure's sustained FP8 run on ND GB200 v6 bears out: 2906.9 TFLOP/s
  at 16384³ (``Azure_Results/ND_GB200_v6_results.md`` at 2a370be) at the B200's bf16-to-FP8
  MSMF ratio (1439 / 2788) is 1500.3. The A100 SXM has no MSMF there (only a burst, MAMF 271
  of 312); it takes Azure's cuBLASLt run instead (AI-benchmarking-guide,
  ``Azure_Results/ND_A100_v4_results.md`` at 3bb66ca, "GEMM CuBLASLt": random inputs after
  10,000 warm-up iterations, so at the power limit): 256.5 of 312 at 16384³, the largest of
  its shapes (82.2 %). The same procedure on the H100 (``Azure
  Results/ND_H100_v5_results.md``, f350e7e, FP8) gives 1377.3 at 16384³ and 1351.4 at 6144 x
  12288 x 12288, within 2 % of Bekman's FP8 MSMF of the H200 (1354) and below the H100's FP8
  burst (1403), so it reads as a sustained rate. Bekman's H100 SXM row has only a burst (MAMF
  795). Its sustained bf16 rate comes from huggingface/gpu-fryer, a stress test that runs
  cuBLASLt 8192³ matmuls on every GPU of a node, 60 s by default, and averages each GPU's
  completed FLOPs per second after the first 4 (``src/main.rs`` at 0487190; inputs are random
  u32 values cast to bf16, so random mantissas as with randn): "~730" TFLOP/s BF16 on "NVIDIA
  H100 80GB HBM3" (README at 2b6fb06, "for reference"; how long that run lasted is not said,
  so "sustained" is the tool's default, inferred). The H100's ceiling is set so that its curve
  (ramp below) gives 730 at F = 2·8192³: 733.2 of 989 (74.1 %), 3 % under the H200's MSMF on
  the same die, whose own figure the H200 keeps (until this was read, the H100 took the
  H200's, an assumption). gpu-fryer's FP8 figure is not used: its u32 inputs saturate float8
  e4m3 (largest finite value 448), which the README itself warns draws less power. The 300 W
  A100 PCIe's MSMF (258) is not carried to the 400 W SXM, because the power limit is what sets
  the sustained clock. FP8 GEMMs (``precision.matmul: fp8``) follow the MSMF table's FP8
  figure as a fraction of the dense FP8 peak, at the bf16 ramp time (no trusted FP8 sweep):
  H200 1354 of 1979 (68.4 %, also the H100's, within 2 % of Azure's sustained H100 FP8 run
  above), B200 2788 of 4500 (62.0 %), MI300X 1187 of 2614.9 (45.4 %); the GB200 takes Azure's
  sustained run above, 58.2 % of its 5,000 at the sm_100 ramp. The cast and transpose kernels
  an FP8 recipe adds are priced apart, as memory-bound passes (`flops._fp8_cast`); the amax
  and scale bookkeeping is not.
- The ramp, A100: the cuBLAS column of the Triton tutorial "03 Matrix Multiplication" as
  published on triton-lang.org (fp16, M = N = K from 256 to 4096, run on an A100: the fp8
  column has no cuBLAS entry and stays below fp16, as on a GPU without fp8 tensor cores):
  1024³ reaches 110.4 TFLOP/s, half of the 2560³–4096³ plateau (mean 213.5 TFLOP/s). A GEMM
  of 2·1024³ = 2.1e9 FLOPs at half the plateau is a ramp of F_half / plateau ≈ 9.4 µs.
- The ramp, Hopper and Blackwell: OpenXLA's measured matmul table for its GPU cost model
  (``xla/backends/gpu/cost_model/matmul_interpolator_data.h``, vendored in
  tensorflow/tensorflow at a305421, keys ``sm_90`` and ``sm_100``: XLA dot ops timed over b
  ∈ {1, 2, 4} and M, N, K from 256 to 4096). Its entries show a GEMM's inner dimension K
  setting its rate beside its size: at the same 34 GFLOP, 4096·4096·1024 runs at 685 TFLOP/s
  and 2048·4096·4096 at 752 on sm_90. So the ramp and the K₀ of the inner-dimension factor
  (`budget.efficiency`) are fitted together, least squares of T = F / (x · K / (K + K₀)) +
  ramp in relative error over the 15 bf16 entries with at least 4096·2048 outputs (256 tiles
  of 128×256 or more: nearly two waves on 132 SMs): sm_90 K₀ = 125 and 6.52 µs (H100, H200),
  2.0 % rms in sample and 2.4 % left out one at a time (4.7 % for a size-only curve fitted
  so); sm_100 K₀ = 289 and 4.90 µs (B200), 0.9 % in sample and 1.6 % left out. Until then
  the ramp came from two entries as the A100's does (1024³ against 4096³: 5.7 and 5.9 µs)
  and the curve had no K, which missed these entries by 13 % rms (29 % at worst, a 256-deep
  GEMM); on the table's other 110 entries the new curve misses by 13.6 % rms against the old
  one's 15.6 %, though the smallest shapes, which the old ramp was drawn from, got worse.
  Only the bf16 shape dependence is taken from that table, not its level x: its fp8 entries
  on sm_90 exceed the datasheet's dense fp8 peak (4096³: 2,424 of 1,979 TFLOP/s), so its
  absolute figures are not a ceiling this catalogue trusts; the fp8 curves take the bf16
  ramp and K₀. The A100's sweep is square, so its curve has no K₀ (nor has the MI300X's,
  which borrows the A100's ramp).
- A device without a sweep (MI300X) keeps the A100's ramp time at its own ceiling, an
  assumption.

Every device sets ``half_flops = ceiling · peak · ramp``: the ramp time, not the size, carries
over from the sweep to the sustained ceiling.

The H800 SXM (DeepSeek-V3's GPU) is the H100 SXM with its NVLink cut from 900 to 400 GB/s
and its FP64 cut, "based on the Hopper architecture, similar to the H100 GPU" (Zhao et al.,
"Insights into DeepSeek-V3", arXiv 2505.09343): it takes every number of the H100 SXM; its
NVLink is the topology's (`budget.catalog.topologies`, ``hgx-h800``).

Memory-bound kernels (``memory_efficiency``) run at the fraction of the datasheet HBM
bandwidth that BabelStream's four streaming kernels (copy, mul, add, triad; the dot
reduction left out) reach on average, as Azure's AI-benchmarking-guide publishes them (one
run of each on a cloud VM, about 268 MB per array; ``Azure_Results/ND_*_results.md``, "HBM
Bandwidth"): A100 SXM4 80GB 1.61/1.61/1.70/1.70 of 2.039 TB/s (81.2 %, commit 3bb66ca);
H100 SXM 2.90/2.90/2.97/2.97 of 3.35 (87.6 %, f350e7e); H200 4.01/4.00/4.15/4.15 of 4.8
(84.9 %, 7f20e5f); MI300X 4.11/4.26/4.14/4.09 of 5.3 (78.3 %, samuel-bohman's copy of the
guide, 3de0c29; a virtualised GPU). A100 40GB and H100 PCIe take the fraction of the same
chip; no B200 or GB200 measurement was found, so they keep the codebase's 0.8. The fraction itself
does not depend on the kernel's size; the fixed startup below is what makes small kernels
slower (kernels whose data fits in L2 run faster, which is not modelled).

FP8 layouts (``fp8_transpose``): Hopper's FP8 tensor-core GEMMs take both operands K-major
(the "TN" layout) only, so a training step's backward needs an FP8 weight and an FP8 saved
input transposed; Transformer Engine keeps those transposes as separate buffers
(``Float8TensorBase``'s ``_data`` and ``_transpose``; ``is_non_tn_fp8_gemm_supported`` is
true from compute capability 10.0 on, TransformerEngine 2.5 ``pytorch/utils.py``), so on
Blackwell (B200, GB200) one FP8 copy serves both. The MI300X, whose FP8 GEMM layouts were
not read, takes Hopper's (assumed, the larger count).

A memory-bound kernel also takes a fixed startup (``kernel_startup``) beyond its bytes at
that bandwidth: the launch gap, the first bytes' DRAM latency and the tail of its last
wave, so that a kernel of V bytes takes a + V / b and small ones reach a small share of the
bandwidth. te42kyfo/gpu-benches (``gpu-small-kernels``, commit 11f5daa) times 10,000
back-to-back streaming kernels (``A[i] = B[i] * 0.25``, launched from a CUDA graph, so
without the CPU's launch cost) at sizes from 64 KB to 4 GB; a least-squares fit of
T = a + V / b to its points beyond twice the L2 (fastest block size, as the repository's
own plot takes it) gives a = 3.31 µs on the A100 80GB (84 MB - 1 GB, b = 1,753 GB/s, every
point within 0.1 %) and 3.23 µs on the H200 (106 MB - 4.3 GB, b = 3,414 GB/s, within 0.13 %).
The A100 40GB takes the A100 80GB's and the H100 SXM and PCIe the H200's (the same die and
launch path). B200, GB200 and MI300X have no such run here; they take the H200's, an assumption
(marked in `budget presets`): a startup of 0 would be a bound no GPU reaches, and it made
their decode look 15-17 % faster against the H100 than the bytes alone do (Llama 3 70B at
tp 8: 11.1 ms a token on B200 at 0, 13.4 ms at 3.23 µs).

Fused attention (``attention``) runs far below the GEMM ceiling: its softmax, masking and
rescaling sit between two matrix products in one kernel. Each preset lists the kernels
measured on it as the fractions of the dense bf16 peak its forward and its backward
reach, each pass timed at its own (FLOPs as FlashAttention's benchmark counts them:
4·s²·heads·head_dim per sequence, halved under a causal mask, backward 2.5 × forward); the
figures below quote the two together, 3.5 / (1/forward + 2.5/backward). The first kernel is
what ``model.attention: flash`` means on that device, the one a current stack runs there:

- FlashAttention-2, Azure's AI-benchmarking-guide ("Flash Attention 2.0": the
  flash-attention repository's benchmark, batch 2, sequence 8192, forward + backward): H100
  SXM 327.9 TFLOP/s (head dim 128, f350e7e; 33.2 %), H200 329.3 (7f20e5f; 33.3 %), A100 SXM4
  80GB 179.5 (3bb66ca; 57.5 %, head dim 64). All three are unmasked: the guide's scripts of
  that time keep the benchmark's ``causal=False`` case (``FlashAttention.py`` at 09ea18d
  greps ``causal=False, headdim=128``, the head dim the H100 and H200 files state; the
  earlier ``Benchmarks/FlashAttention.py`` takes the first match, ``causal=False``, head dim
  64); only a later version, whose results print a causal column, takes the causal case.
- cuDNN and FlashAttention-3 on H100 SXM: Shah et al., "FlashAttention-3" (arXiv
  2407.08608), bar labels of Figure 5 (forward, head dim 128, sequence 8K: FA2 333, cuDNN
  529, FA3 602 TFLOP/s with the causal mask, 370, 600, 646 without it) and Figure 6
  (backward, head dim 128, without a causal mask as published: 318, 518, 559); run with
  cuDNN 9.1.1 and FlashAttention 2.5.8 at a clock fixed at 1,830 MHz (appendix C.1), below
  the 1,860-1,918 MHz the H200 holds at its power limit in matmuls (Bekman, below).
- Causal against unmasked calls: NVIDIA/cudnn-frontend's SDPA training benchmark on an H200
  (the H100's die; cuDNN 9.19.1, bf16, 64 query and 8 KV heads of 128, batch 1;
  ``benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/``, df73764) times forward
  and backward with the causal mask and without it at 2K to 32K tokens. A causal call does
  half the FLOPs, so its rate over the unmasked one is t_unmasked / (2 · t_causal): backward
  0.73, 0.85, 0.91 and 0.95 at 2K, 4K, 8K and 16K, forward 0.76 to 0.96. Every training call
  is causal, so each Hopper kernel's unmasked backward bars above are slowed by the backward
  ratio at their length (held at 2K's below 2K, where there is no sweep); that cuDNN's ratio
  carries to FlashAttention-2 and -3, which skip and mask the same tiles, is an assumption.
  Combined as 3.5 / (1/forward + 2.5/backward), at 8K: cuDNN 487 TFLOP/s (49.2 %), FA3 533
  (53.9 %). FlashAttention-2 takes the bars' shape at Azure's level: its unmasked bars at
  8K (370 forward, 318 backward) give 331.3, within 1 % of Azure's unmasked 327.9, which is
  why the bars are read as they are; causal, 297.8 at 8K on the H100. (The sweep's forward
  ratio at 8K, 0.93, is near the paper's own causal-to-unmasked forward bars: 0.90 for FA2,
  0.88 for cuDNN 9.1, 0.93 for FA3.) The A100's one figure becomes a causal call
  at 8K by the 8K ratios, forward and backward alike at 179.5: 164.6 (52.7 %). No A100
  sweep was found, so carrying Hopper's ratios to Ampere is an assumption too. Each rate
  also keeps the unmasked call's (the unmasked bars; the A100's figure as measured):
  context-parallel calls are partly unmasked and a decoding call wholly
  (`budget.flops.causal_share`), and each share of their FLOPs is timed at its own rate.

The rate depends on how many keys each query meets in one kernel call (the sequence, or
seq / cp per ring step: `budget.flops.attention_keys`): a short call spends more of its time
in the prologue, the epilogue and the masked diagonal tiles. The same two figures give bars
at 512, 1K, 2K, 4K, 8K and 16K tokens (16K tokens per batch, so batch × length is fixed),
made causal and combined the same way at each length: cuDNN 244, 324, 373, 446, 487, 502
TFLOP/s; FA3 246, 337, 401, 487, 533, 553; FA2 164, 204, 230, 273, 298, 309 on Azure's level
(the paper's FA2 bars give only the shape). The rate is interpolated in log keys and held
at the end bars outside 512 ... 16K. The A100's one measured length (8192) stands for every
length: no A100 sweep by length was found. A ring's causal calls are read at seq / cp keys
(`budget.flops.attention_keys`) and its unmasked ones at seq / (2·cp), the length its
slowest rank meets at every unmasked step (`budget.flops.unmasked_keys`); an all-gather's
forward at the gathered seq keys and its backward at seq / (2·cp), the chunk of queries each
of its key blocks loops over (`budget.flops.backward_keys`).

cuDNN is first on Hopper (Transformer Engine and PyTorch's scaled_dot_product_attention
pick it there); FlashAttention-2 on the A100 (FA3 needs Hopper). H100 PCIe takes the SXM's
fractions of its own peak and H200 the H100's cuDNN and FA3 ones (same die). The B200's
cuDNN (first) and FlashAttention-2 come from NVIDIA/cudnn-frontend's SDPA benchmark on a B200
(cuDNN 9.13, PyTorch 2.9, CUDA 13.0, FlashAttention 2.7.4, as its run log prints; batch 1,
128 query and 8 KV heads of 128, causal, 2K to 128K tokens): cuDNN 998 TFLOP/s at 8K (44.4 %)
and 1,183 at 32K, FlashAttention-2 338 at 8K (15.0 %). Its 512- and 1,024-token rows are left
out: a call of one sequence there is launch-bound (0.10 ms for 8.6 GFLOP at 512), which a
training call of several sequences is not, so shorter calls hold the 2K rate. They are no
bound either way: they ran at the free clock, where the B200's GEMMs are held at a
power-limited 1,399-1,443 MHz (Bekman's MSMF, below), but the same benchmark's GB200 run on
cuDNN 9.19.1 reaches 1,382 at 8K (on a GB200, whose peak is 11 % higher). An unmasked call
takes each part over the causal-to-unmasked ratio of that GB200 run (0.93 forward and
backward at 8K); that cuDNN's ratio carries to FlashAttention-2 is an assumption, as on
Hopper. The GB200 takes cuDNN from its own run of that benchmark (cuDNN 9.19.1, 64
query and 8 KV heads of 128, causal and unmasked, 2K to 32K tokens: 1,382 TFLOP/s at 8K
causal, 55.3 % of its 2,500) and FlashAttention-2 at the B200's fractions of peak, marked
derived: no GB200 sweep of it was found. Azure's FlashAttention-2 run on ND GB200 v6
(373.9 TFLOP/s at 8K, ``Azure_Results/ND_GB200_v6_results.md`` at 2a370be) does not say
which mask it ran: it is within 0.4 % of the 375.3 this gives a causal call and 7 % under
the 403.0 of an unmasked one, so it is a check, not the level.
The MI300X takes FlashAttention-2 (ROCm's port, its only fused kernel here) from the same
Azure guide's run on ND MI300X v5 (``Azure_Results/ND_MI300X_v5_results.md`` in
samuel-bohman's copy at 3de0c29, the file its streaming share comes from): 328.6 TFLOP/s at
head dim 64, batch 2, sequence 8192 (25.1 % of its 1,307.4), read as unmasked and made
causal by Hopper's 8K ratios, as the A100's one figure is (the same head dim and script
version). Until it was read the MI300X's fused attention ran on the GEMM curve (50.4 %),
which put a Llama 3 8B step at 8K tokens 11 % faster.

FlashAttention in Triton (``triton``), the 2023 kernel that llm-foundry's ``attn_impl:
triton`` runs (flash-attn's ``flash_attn_triton.py``, which starts from Phil Tillet's Triton
tutorial kernel and needs the pre-MLIR Triton), is never a default: a plan names it to price
a stack of that time. No sweep of it was found on these devices, so it is FlashAttention-2's
rate slowed by the ratios the FlashAttention-2 paper measured on an A100 80GB against its
sibling, OpenAI Triton's own fused-attention op (``triton.ops.flash_attention``, which the
paper's benchmark script times; Dao, arXiv 2307.08691, section 4.1: FlashAttention-2 is
"around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x
faster in the backward pass"): the forward at 1/1.4 of FlashAttention-2's, the backward at
1/2, combined as above, 0.55 of FlashAttention-2's rate. The port's own header agrees from
another side: its forward and backward together are "slightly slower" than FlashAttention's
CUDA kernel, which the same paper puts at about half of FlashAttention-2. On Hopper the
forward and causal backward bars of FlashAttention-2 above are slowed that way at each
length; the A100 has only the combined 179.5 TFLOP/s, taken as forward and backward alike
(the H100's unmasked FA2 bars differ by 16 % at 8K, 370 against 318), made causal as above
(167.2 forward, 163.5 backward), so 3.5 / (1.4/167.2 + 2.5 · 2/163.5) = 89.9 TFLOP/s
(28.8 %); unmasked, 98.2 (31.5 %).
Taking the sibling's ratios for the port is one assumption; carrying the A100's to Hopper
another: the Triton kernel of 2023 used none of Hopper's new instructions, and neither does
FlashAttention-2 (FlashAttention-3 is the one that does), whose H100 rate is the one slowed
here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from budget.plan.model import FUSED_BACKWARD, AttentionRate, GemmCurve, fused_rate

__all__ = ["DEVICES", "RAMP_S", "DevicePreset"]

GiB = 2**30
MiB = 2**20
T = 1e12

# Triton tutorial 03, cuBLAS fp16 on A100: 2·1024³ FLOPs reach half of the 213.5 TFLOP/s
# plateau, so F_half = 2·1024³ · (213.5 / 110.4 − 1) and the ramp is F_half / 213.5e12.
_GEMM_1024 = 2 * 1024**3


def _ramp(f_1024: float, plateau: float) -> float:
    """Seconds of ramp of ``F / (F + F_half)`` through a sweep's 1024³ point and plateau."""
    return _GEMM_1024 * (plateau / f_1024 - 1) / plateau


RAMP_S = _ramp(110.4e12, 213.5e12)  # A100, Triton tutorial 03
# Hopper and Blackwell: the ramp and K₀ of the inner-dimension factor K / (K + K₀)
# (`budget.efficiency.inner_factor`), the least-squares fit of a GEMM's time F / (x·g(K)) +
# ramp to the 15 bf16 entries of OpenXLA's matmul table with at least 4096·2048 outputs
# (b = 1, K from 256 to 4096: two waves of tiles or more, where the other dimensions no
# longer leave SMs idle); x, the sweep's own level, is not kept (module docstring).
# sm_90: K₀ = 125, ramp 6.52 µs, rms error 2.0 % (at most 3.5 %), where by size alone with
# the two-entry ramp these entries missed by 13 %; sm_100: K₀ = 289, ramp 4.90 µs, 0.9 %.
_SM90_RAMP_S, _SM90_INNER = 6.52e-6, 125.0
_SM100_RAMP_S, _SM100_INNER = 4.90e-6, 289.0

# BabelStream copy, mul, add, triad (TB/s), Azure AI-benchmarking-guide; mean / datasheet.
_A100_STREAM = (1.61 + 1.61 + 1.70 + 1.70) / 4 / 2.039
_H100_STREAM = (2.90 + 2.90 + 2.97 + 2.97) / 4 / 3.35
_H200_STREAM = (4.01 + 4.00 + 4.15 + 4.15) / 4 / 4.8
_MI300X_STREAM = (4.11 + 4.26 + 4.14 + 4.09) / 4 / 5.3

# Kernel startup a of T = a + V / b, gpu-benches' gpu-small-kernels (module docstring).
_A100_STARTUP = 3.31e-6
_GH100_STARTUP = 3.23e-6  # measured on the H200


# Fused attention, forward + backward (module docstring): the FlashAttention-3 paper's
# Figures 5 and 6 (H100 SXM, head dim 128, TFLOP/s at 512 ... 16K tokens: forward with and
# without the causal mask, backward without it, as published) for cuDNN and FlashAttention-3
# and for the length dependence of FlashAttention-2, whose level is Azure's run at 8K.
_FA3_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
_FA3_FIGURES = {  # kernel: (causal forward, unmasked forward, unmasked backward) TFLOP/s
    "cudnn": (
        (315, 410, 484, 518, 529, 539),
        (497, 574, 617, 609, 600, 595),
        (305, 408, 465, 499, 518, 516),
    ),
    "flash3": (
        (292, 423, 521, 579, 602, 616),
        (467, 565, 625, 638, 646, 648),
        (316, 424, 501, 542, 559, 561),
    ),
    "flash2": (
        (191, 260, 298, 319, 333, 335),
        (309, 350, 362, 368, 370, 370),
        (214, 260, 291, 310, 318, 322),
    ),
}


Pairs = list[tuple[float, float]]  # (forward, backward) TFLOP/s at each length


def _rate(
    kernel: str,
    keys: tuple[float, ...],
    causal: Pairs,
    unmasked: Pairs,
    peak: float,
    source: str,
    derived: bool = False,
    head_dim: int | None = 128,
) -> AttentionRate:
    """An `AttentionRate` of `kernel` from its (forward, backward) TFLOP/s at each of `keys`,
    of a causal call and of an unmasked one, as fractions of `peak`, measured at `head_dim`
    (128 in every source but Azure's A100 and MI300X runs, 64: module docstring)."""
    forward, backward, unmasked_forward, unmasked_backward = (
        tuple(pair[part] / peak for pair in pairs)
        for pairs in (causal, unmasked)
        for part in (0, 1)
    )
    return AttentionRate(
        kernel,
        keys,
        forward,
        backward,
        derived,
        source,
        unmasked_forward,
        unmasked_backward,
        head_dim,
    )


# Causal against unmasked calls on the Hopper die (module docstring): NVIDIA/cudnn-frontend's
# SDPA training benchmark on an H200, cuDNN 9.19.1, bf16, batch 1, 64 query and 8 KV heads of
# 128 (benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/
# llama3.1_20260227_034703.csv at df73764): median milliseconds of (forward, backward) under
# the causal ("top_left") mask and without a mask, at each length.
# length: ((causal forward, backward), (unmasked forward, backward)), milliseconds
_Sweep = dict[int, tuple[tuple[float, float], tuple[float, float]]]
_CUDNN_SWEEP_MS: _Sweep = {
    2048: ((0.142, 0.464), (0.217, 0.681)),
    4096: ((0.465, 1.450), (0.819, 2.453)),
    8192: ((1.708, 5.083), (3.182, 9.262)),
    16384: ((6.531, 19.002), (12.524, 35.947)),
}


# The same benchmark on a GB200 (Blackwell, cuDNN 9.19.1; gb200_919_only_cudnn/
# llama3.1_20260226_174648.csv at df73764), for Blackwell's kernels.
_BLACKWELL_SWEEP_MS: _Sweep = {
    2048: ((0.066, 0.206), (0.110, 0.315)),
    4096: ((0.206, 0.607), (0.345, 1.068)),
    8192: ((0.688, 2.097), (1.286, 3.901)),
    16384: ((2.606, 7.845), (4.972, 15.111)),
    32768: ((10.226, 29.863), (19.759, 58.606)),
}


def _causal(length: int, sweep: _Sweep = _CUDNN_SWEEP_MS) -> tuple[float, float]:
    """A causal call's (forward, backward) rate over an unmasked call's at `length` keys: half
    the FLOPs in the causal time against all of them in the unmasked one, t_u / (2·t_c);
    held at the nearest length swept outside the sweep's."""
    causal, unmasked = sweep[min(max(length, min(sweep)), max(sweep))]
    return unmasked[0] / (2 * causal[0]), unmasked[1] / (2 * causal[1])


def _bars(kernel: str, causal: bool = True) -> list[tuple[float, float]]:
    """`kernel`'s (forward, backward) TFLOP/s at each of `_FA3_LENGTHS`, of a causal call:
    the FlashAttention-3 paper's causal forward bars and its unmasked backward bars slowed by
    `_causal`'s backward ratio; of an unmasked call: its unmasked bars, as published."""
    causal_forward, forward, backward = _FA3_FIGURES[kernel]
    if not causal:
        return list(zip(forward, backward, strict=True))
    slowed = (b * _causal(n)[1] for b, n in zip(backward, _FA3_LENGTHS, strict=True))
    return list(zip(causal_forward, slowed, strict=True))


def _fa2_level(unmasked_8k: float) -> float:
    """The factor from the FlashAttention-3 paper's FlashAttention-2 bars to a device's own
    unmasked FA2 measurement at 8K (Azure's), against the bars' unmasked rate there."""
    bars: float = fused_rate(*_bars("flash2", causal=False)[_FA3_LENGTHS.index(8192)])
    return unmasked_8k / bars


def _scaled(
    kernel: str, scale: float, each: Callable[[float, float], tuple[float, float]] | None = None
) -> tuple[Pairs, Pairs]:
    """`kernel`'s bars (`_bars`) at `scale`, each (forward, backward) pair passed through
    `each` where given: a causal call's at each length, then an unmasked call's."""
    causal, unmasked = (
        [(f * scale, b * scale) for f, b in _bars(kernel, mask)] for mask in (True, False)
    )
    if each is None:
        return causal, unmasked
    return [each(*pair) for pair in causal], [each(*pair) for pair in unmasked]


_FA3_PAPER = "FlashAttention-3 paper (arXiv 2407.08608), Figures 5 and 6"
_CAUSAL = "causal: NVIDIA/cudnn-frontend SDPA sweep, H200 (df73764)"


def _azure_fa2(gpu: str, commit: str) -> str:
    return f"Azure AI-benchmarking-guide FlashAttention-2, {gpu} ({commit}, unmasked)"


def _fa3_paper(kernel: str, peak: float, scale: float = 1.0, cited: str = "") -> AttentionRate:
    """`kernel`'s forward and backward rates (`_bars`) as fractions of `peak` TFLOP/s, times
    `scale` (`_fa2_level`, from the measurement `cited` names)."""
    causal, unmasked = _scaled(kernel, scale)
    source = f"{cited}; shape: {_FA3_PAPER}" if cited else _FA3_PAPER
    return _rate(kernel, _FA3_LENGTHS, causal, unmasked, peak, f"{source}; {_CAUSAL}")


# FlashAttention-2 paper, section 4.1 (A100): FA2 is about 1.4x (1.3-1.5) as fast as
# FlashAttention in Triton in the forward pass and 2x in the backward (module docstring).
_TRITON_SLOWER = (1.4, 2.0)


def _triton(fa2_forward: float, fa2_backward: float) -> tuple[float, float]:
    """FlashAttention in Triton, TFLOP/s of its forward and backward, from FlashAttention-2's."""
    slower_forward, slower_backward = _TRITON_SLOWER
    return fa2_forward / slower_forward, fa2_backward / slower_backward


_TRITON_SOURCE = (
    "the device's FlashAttention-2 rate above (its benchmark and causal sweep), slowed by the "
    "FlashAttention-2 paper's ratios (section 4.1)"
)


def _triton_hopper(peak: float, scale: float) -> AttentionRate:
    """``triton`` on Hopper: the FlashAttention-3 paper's FA2 bars (`_bars`) slowed at each
    length, at the level of the device's measured FA2 (`_fa2_level`)."""
    causal, unmasked = _scaled("flash2", scale, _triton)
    return _rate("triton", _FA3_LENGTHS, causal, unmasked, peak, _TRITON_SOURCE, derived=True)


# The A100's one FA2 measurement is unmasked; a causal call at 8K takes the forward and
# backward ratios of `_causal` there (the A100 has no sweep of its own, module docstring).
_A100_FA2 = 179.5 * _causal(8192)[0], 179.5 * _causal(8192)[1]
_A100_ATTENTION = (  # one length measured
    _rate(
        "flash2",
        (8192,),
        [_A100_FA2],
        [(179.5, 179.5)],
        312,
        f"{_azure_fa2('A100', '3bb66ca')}; {_CAUSAL}, at 8K",
        head_dim=64,
    ),
    _rate(
        "triton",
        (8192,),
        [_triton(*_A100_FA2)],
        [_triton(179.5, 179.5)],
        312,
        _TRITON_SOURCE,
        derived=True,
        head_dim=64,
    ),
)
# MI300X: one unmasked FA2 figure (Azure, 3de0c29), made causal as the A100's is.
_MI300X_FA2 = 328.6 * _causal(8192)[0], 328.6 * _causal(8192)[1]
_MI300X_ATTENTION = (
    _rate(
        "flash2",
        (8192,),
        [_MI300X_FA2],
        [(328.6, 328.6)],
        1307.4,
        f"{_azure_fa2('MI300X', '3de0c29')}; {_CAUSAL}, at 8K",
        head_dim=64,
    ),
)
_H100_ATTENTION = (
    _fa3_paper("cudnn", 989),
    _fa3_paper("flash3", 989),
    _fa3_paper("flash2", 989, _fa2_level(327.9), _azure_fa2("H100", "f350e7e")),
    _triton_hopper(989, _fa2_level(327.9)),
)
_H200_ATTENTION = (
    *_H100_ATTENTION[:2],
    _fa3_paper("flash2", 989, _fa2_level(329.3), _azure_fa2("H200", "7f20e5f")),
    _triton_hopper(989, _fa2_level(329.3)),
)

# B200: NVIDIA/cudnn-frontend's SDPA benchmark on a B200 at its free clock (cuDNN 9.13,
# FlashAttention 2.7.4; benchmark/sdpa_benchmark_training/artifacts/
# sdpa_bf16_benchmark_results_NVIDIA_B200.csv at bb37575): batch 1, 128 query and 8 KV heads
# of 128, causal; (forward, backward) TFLOP/s from 2K to 128K tokens (module docstring).
_B200_LENGTHS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
_B200_SWEEP = {  # kernel: ((forward, backward) at each of _B200_LENGTHS)
    "cudnn": (
        (478.921, 371.486),
        (855.678, 701.265),
        (1171.278, 942.509),
        (1332.415, 1074.776),
        (1419.000, 1108.688),
        (1382.330, 1073.059),
        (1355.418, 1047.843),
    ),
    "flash2": (
        (254.381, 198.845),
        (342.990, 273.484),
        (399.925, 318.004),
        (425.128, 336.635),
        (435.762, 345.634),
        (441.285, 348.981),
        (443.738, 348.253),
    ),
}
_B200_SOURCE = (
    "NVIDIA/cudnn-frontend SDPA benchmark, B200 (bb37575, causal, free clock); "
    "unmasked: its GB200 sweep (df73764)"
)


def _gb200_sweep(length: int, mask: int) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of the GB200 sweep's call at `length` keys, causal (`mask`
    0) or unmasked (1): batch 1, 64 query heads of 128, the forward 4·s²·heads·d FLOPs (half
    of them causal) in its milliseconds, the backward 2.5 times as many in its own."""
    forward_flops = 4 * length**2 * 64 * 128 / (2 if mask == 0 else 1)
    forward_ms, backward_ms = _BLACKWELL_SWEEP_MS[length][mask]
    return forward_flops / forward_ms / 1e9, FUSED_BACKWARD * forward_flops / backward_ms / 1e9


_GB200_CUDNN = _rate(
    "cudnn",
    tuple(_BLACKWELL_SWEEP_MS),
    [_gb200_sweep(n, 0) for n in _BLACKWELL_SWEEP_MS],
    [_gb200_sweep(n, 1) for n in _BLACKWELL_SWEEP_MS],
    2500,
    "NVIDIA/cudnn-frontend SDPA benchmark, GB200 (df73764, cuDNN 9.19.1, free clock)",
)


def _b200(kernel: str) -> AttentionRate:
    """`kernel`'s causal forward and backward rates on the B200 from its sweep, as fractions
    of the 2,250 TFLOP/s peak; unmasked, each over the GB200 sweep's ratio at its length."""
    causal = list(_B200_SWEEP[kernel])
    ratios = [_causal(n, _BLACKWELL_SWEEP_MS) for n in _B200_LENGTHS]
    unmasked = [(f / r[0], b / r[1]) for (f, b), r in zip(causal, ratios, strict=True)]
    return _rate(kernel, _B200_LENGTHS, causal, unmasked, 2250, _B200_SOURCE)


def _gb200_flash2() -> AttentionRate:
    """FlashAttention-2 on the GB200: no sweep of its own, so the B200's fractions of its
    peak (`_b200`), the same kernel on the same SM design at the GB200's higher clock; marked
    derived. Azure's FlashAttention-2 run on ND GB200 v6 (373.9 TFLOP/s at 8K, its mask
    unstated) is within 0.4 % of its causal call (module docstring)."""
    return replace(_b200("flash2"), derived=True, source=f"{_B200_SOURCE}, as fractions of peak")


_MSMF = "Bekman, ML Engineering, MAMF/MSMF table (commit 0359db8)"
# A later version of that chapter than 0359db8 adds the GB200 row (a burst only).
_GB200_MAMF = (
    "Bekman, ML Engineering, MAMF table, GB200 SXM 1822 TFLOP/s (torch 2.10.0.dev20250916)"
)
_TRITON = "Triton tutorial 03 cuBLAS sweep (A100)"
_XLA = "OpenXLA matmul table (tensorflow a305421), {} bf16"


def _curve(
    fraction: float,
    peak: float,
    source: str,
    ramp_s: float = RAMP_S,
    fp8: tuple[float, float] | None = None,
    inner_half: float = 0.0,
) -> GemmCurve:
    """bf16 at `fraction` of `peak`; `fp8` = (sustained fraction, fp8 peak), same ramp time
    and inner-dimension factor (`inner_half`, K₀)."""
    by_dtype = () if fp8 is None else (("fp8", fp8[0], fp8[0] * fp8[1] * ramp_s),)
    return GemmCurve(fraction, fraction * peak * ramp_s, source, by_dtype, inner_half)


@dataclass(frozen=True, slots=True)
class DevicePreset:
    name: str
    memory: int  # bytes, the driver's total (module docstring)
    flops: tuple[tuple[str, float], ...]  # (dtype, dense peak FLOP/s)
    memory_bandwidth: float  # bytes/s
    gemm: GemmCurve
    source: str
    memory_efficiency: float = 0.8  # fraction of memory_bandwidth a streaming kernel reaches
    attention: tuple[AttentionRate, ...] = ()  # fused kernels' rates, the default first
    kernel_startup: float = 0.0  # seconds a kernel takes beyond bytes / bandwidth (docstring)
    # Figures not measured on this device, but borrowed from another or assumed (docstring):
    # any of "gemm" ("gemm-fp8": its FP8 ceiling alone), "stream", "attention", "start",
    # "fp8-transpose".
    assumed: tuple[str, ...] = ()
    sms: int = 0  # streaming multiprocessors (AMD: compute units) enabled (below)
    # its FP8 GEMMs take only K-major operands, so Transformer Engine keeps an FP8 weight's
    # and a saved input's transpose for the backward (docstring)
    fp8_transpose: bool = True


# NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web):
# BF16/FP16 312 TFLOPS, TF32 156, FP32 19.5 (dense); 40GB HBM2 1,555 GB/s; 80GB HBM2e
# 2,039 GB/s (SXM). No FP8 tensor cores.
_A100_FLOPS = (("bf16", 312 * T), ("fp16", 312 * T), ("tf32", 156 * T), ("fp32", 19.5 * T))
# A100 SXM: no MSMF in Bekman's table (MAMF 271 is a burst); Azure's cuBLASLt run on ND A100
# v4 (fp16, random inputs, 10,000 warm-up iterations) sustains 256.5 of 312 TFLOP/s at 16384³.
_A100_GEMM = _curve(
    256.5 / 312, 312 * T, f"Azure AI-benchmarking-guide cuBLASLt, A100 SXM; ramp: {_TRITON}"
)

# NVIDIA H100 Tensor Core GPU datasheet: SXM BF16/FP16 1,979 and FP8 3,958 TFLOPS with
# sparsity (989 / 1,979 dense), TF32 989 sparse (494.5 dense), FP32 67; 80GB HBM3 3.35 TB/s.
# PCIe: BF16 1,513 sparse (756 dense), FP8 3,026 sparse (1,513 dense), TF32 756 sparse
# (378 dense), FP32 51; 80GB HBM2e 2 TB/s.
_H100_SXM_FLOPS = (
    ("bf16", 989 * T),
    ("fp16", 989 * T),
    ("fp8", 1979 * T),
    ("tf32", 494.5 * T),
    ("fp32", 67 * T),
)
_H100_PCIE_FLOPS = (
    ("bf16", 756 * T),
    ("fp16", 756 * T),
    ("fp8", 1513 * T),
    ("tf32", 378 * T),
    ("fp32", 51 * T),
)
# H200 SXM MSMF 755 of 989 TFLOP/s (torch 2.14, CUDA 13.0; 685-688 W at 1860-1918 MHz, the
# node's other GPUs running matmuls).
_H200_SUSTAINED = 755 / 989
# FP8 (float8_e4m3fn), same table: H200 SXM MSMF 1354 of 1979 (683-689 W at 1767-1848 MHz);
# the H100 SXM's own row is a burst, MAMF 1403, so the H100 takes the H200's.
_GH100_FP8_SUSTAINED = 1354 / 1979
_SM90_RAMP = f"ramp: {_XLA.format('sm_90')}"
_GPU_FRYER = "huggingface/gpu-fryer README (2b6fb06): ~730 TFLOP/s bf16 sustained at 8192³"
# H100 SXM, gpu-fryer: 730 TFLOP/s sustained at F = 2·8192³. On the curve x·F / (F + x·ramp)
# with ceiling x, that is x = 730e12 · F / (F − 730e12 · ramp) = 733.2 TFLOP/s.
_GEMM_8192 = 2 * 8192**3
_H100_SUSTAINED = 730e12 * _GEMM_8192 / (_GEMM_8192 - 730e12 * _SM90_RAMP_S) / (989 * T)
_H100_GEMM = _curve(
    _H100_SUSTAINED,
    989 * T,
    f"{_GPU_FRYER}; fp8: {_MSMF}, H200 SXM MSMF; {_SM90_RAMP}",
    _SM90_RAMP_S,
    fp8=(_GH100_FP8_SUSTAINED, 1979 * T),
    inner_half=_SM90_INNER,
)
# GB200: Bekman's table has only a burst (MAMF 1822 of 2500); at the B200's ratio of
# sustained to burst (MSMF 1439 over MAMF 1745) that is 1502.5 TFLOP/s. Azure's sustained
# FP8 cuBLASLt run on ND GB200 v6 (random inputs, 10,000 warm-up iterations) gives 2906.9 at
# 16384³, taken as the fp8 ceiling on the sm_100 ramp: x = 2906.9e12 · F / (F − 2906.9e12 ·
# ramp) at F = 2·16384³.
_GB200_SUSTAINED = 1822 * 1439 / 1745 / 2500
_GEMM_16384 = 2 * 16384**3
_GB200_FP8_SUSTAINED = (
    2906.9e12 * _GEMM_16384 / (_GEMM_16384 - 2906.9e12 * _SM100_RAMP_S) / (5000 * T)
)
_H200_GEMM = _curve(
    _H200_SUSTAINED,
    989 * T,
    f"{_MSMF}: H200 SXM MSMF, bf16 and fp8; {_SM90_RAMP}",
    _SM90_RAMP_S,
    fp8=(_GH100_FP8_SUSTAINED, 1979 * T),
    inner_half=_SM90_INNER,
)

# Streaming multiprocessors enabled on each product (`DevicePreset.sms`: what a kernel can be
# launched on, and what Transformer Engine's comm-GEMM overlap takes its ``num_sm`` from,
# `budget.schedule`).
# A100: 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper, "The A100 GPU ... 108
# SMs"); H100 SXM5 132 and H100 PCIe 114 (NVIDIA H100 Tensor Core GPU Architecture
# whitepaper, table "NVIDIA H100 ... compared to NVIDIA A100"); the H800 and H200 are the
# H100 SXM's GH100 configuration (132); B200: 74 of each die's 80 SMs enabled, 148 (Chips and
# Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling", 2025); GB200: 152, as CUDA
# reports it in public kernel notes on the part (which set it beside the B300's 148; no
# vendor page gives it, so it is the weakest figure here); MI300X: 304 compute
# units (AMD CDNA 3 architecture whitepaper).
# What the driver reports as the card's memory (module docstring), said beside each preset's
# datasheet figure, which rounds it: nvidia-smi's memory.total, or rocminfo's global pool.
_MODAL = "modal-labs/modal-client PR 2797"
_SMI_A100_40 = f"memory: nvidia-smi's 40,960 MiB ({_MODAL})"
_SMI_A100_80 = f"memory: nvidia-smi's 81,920 MiB ({_MODAL})"
_SMI_H100 = f"memory: nvidia-smi's 81,559 MiB ({_MODAL}; NVIDIA/nccl issue 1264)"
_SMI_H100_LOGS = "memory: nvidia-smi's 81,559 MiB, as the H100 SXM's (public nvidia-smi logs)"
_SMI_H200 = "memory: nvidia-smi's 143,771 MiB (NVIDIA/TensorRT-LLM issue 16827)"
_SMI_B200 = "memory: nvidia-smi's 183,359 MiB (NVIDIA/TensorRT-LLM issue 10278)"
_ROCM_MI300X = "memory: rocminfo's global pool, 201,310,208 KiB (ROCm/legacy-rocm-build issue 4414)"

DEVICES: dict[str, DevicePreset] = {
    "a100-40gb": DevicePreset(
        "a100-40gb",
        40_960 * MiB,
        _A100_FLOPS,
        1555e9,
        _A100_GEMM,
        "NVIDIA A100 datasheet (A100 40GB SXM: 40GB HBM2, 1,555 GB/s); "
        f"{_SMI_A100_40}; GEMM curve of the A100 SXM (same chip)",
        memory_efficiency=_A100_STREAM,
        attention=_A100_ATTENTION,
        kernel_startup=_A100_STARTUP,
        sms=108,
        assumed=("gemm", "stream", "attention", "start"),  # the A100 80GB's: same chip
    ),
    "a100-80gb": DevicePreset(
        "a100-80gb",
        81_920 * MiB,
        _A100_FLOPS,
        2039e9,
        _A100_GEMM,
        f"NVIDIA A100 datasheet (A100 80GB SXM: 80GB HBM2e, 2,039 GB/s); {_SMI_A100_80}",
        memory_efficiency=_A100_STREAM,
        attention=_A100_ATTENTION,
        kernel_startup=_A100_STARTUP,
        sms=108,
    ),
    "h100-sxm": DevicePreset(
        "h100-sxm",
        81_559 * MiB,
        _H100_SXM_FLOPS,
        3.35e12,
        _H100_GEMM,
        f"NVIDIA H100 datasheet (H100 SXM: 80GB HBM3, 3.35 TB/s); {_SMI_H100}",
        memory_efficiency=_H100_STREAM,
        attention=_H100_ATTENTION,
        kernel_startup=_GH100_STARTUP,
        sms=132,
        assumed=("gemm-fp8", "start"),  # the H200's: same die and power limit
    ),
    "h100-pcie": DevicePreset(
        "h100-pcie",
        81_559 * MiB,
        _H100_PCIE_FLOPS,
        2.0e12,
        # No measurement of the PCIe card: the SXM's sustained fractions of its own (lower) peak.
        _curve(
            _H100_SUSTAINED,
            756 * T,
            f"H100 SXM fractions ({_GPU_FRYER}; fp8: {_MSMF}, H200 SXM MSMF); {_SM90_RAMP}",
            _SM90_RAMP_S,
            fp8=(_GH100_FP8_SUSTAINED, 1513 * T),
            inner_half=_SM90_INNER,
        ),
        f"NVIDIA H100 datasheet (H100 PCIe: 80GB HBM2e, 2 TB/s); {_SMI_H100_LOGS}",
        memory_efficiency=_H100_STREAM,
        attention=_H100_ATTENTION,
        kernel_startup=_GH100_STARTUP,
        sms=114,
        assumed=("gemm", "stream", "attention", "start"),  # the SXM's fractions
    ),
    "h800": DevicePreset(
        "h800",
        81_559 * MiB,
        _H100_SXM_FLOPS,
        3.35e12,
        _H100_GEMM,
        'Zhao et al. (DeepSeek-AI), "Insights into DeepSeek-V3" (arXiv 2505.09343): '
        "the H800 SXM is the Hopper H100 SXM with NVLink cut from 900 to 400 GB/s "
        "and FP64 cut (neither enters here); tensor-core peaks, 80GB HBM3 at 3.35 TB/s and the "
        "GEMM, attention and streaming calibration of the H100 SXM (same die and memory); "
        f"{_SMI_H100_LOGS}",
        memory_efficiency=_H100_STREAM,
        attention=_H100_ATTENTION,
        kernel_startup=_GH100_STARTUP,
        sms=132,
        assumed=("gemm", "stream", "attention", "start"),  # the H100 SXM's
    ),
    "h200": DevicePreset(
        "h200",
        143_771 * MiB,
        _H100_SXM_FLOPS,
        4.8e12,
        _H200_GEMM,
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: same tensor-core peaks as H100 SXM, "
        f"141GB HBM3e, 4.8 TB/s); {_SMI_H200}",
        memory_efficiency=_H200_STREAM,
        attention=_H200_ATTENTION,
        kernel_startup=_GH100_STARTUP,
        sms=132,
        assumed=("attention",),  # cuDNN and FlashAttention-3: the H100's
    ),
    "b200": DevicePreset(
        "b200",
        183_359 * MiB,
        (
            ("bf16", 2250 * T),
            ("fp16", 2250 * T),
            ("fp8", 4500 * T),
            ("tf32", 1125 * T),
            ("fp32", 75 * T),
        ),
        7.7e12,
        # B200 SXM MSMF 1439 of 2250 (978-987 W at 1399-1443 MHz, the other GPUs busy);
        # FP8 MSMF 2788 of 4500 (975-982 W at 1399-1447 MHz).
        _curve(
            1439 / 2250,
            2250 * T,
            f"{_MSMF}: B200 SXM MSMF, bf16 and fp8; ramp: {_XLA.format('sm_100')}",
            _SM100_RAMP_S,
            fp8=(2788 / 4500, 4500 * T),
            inner_half=_SM100_INNER,
        ),
        "NVIDIA HGX B200 / DGX B200 specifications, divided by 8 GPUs and halved for density "
        "(36 PFLOPS FP16/BF16, 72 PFLOPS FP8, 18 PFLOPS TF32 with sparsity; 600 TFLOPS FP32; "
        "1,440 GB HBM3e); HBM bandwidth 7.7 TB/s a GPU, NVIDIA's Blackwell datasheet "
        "(nvdam.widen.net blackwell-datasheet-3384703, as ai-dynamo/aiconfigurator PR 1246 "
        "reads it; the HGX table's 64 TB/s, 8 a GPU, is now 'up to 62 TB/s'), borne out by the "
        "driver: a 7,680-bit bus at 3,996 MHz double data rate, 7.672 TB/s (pytorch/ao PR "
        f"4002, an audit, m482); {_SMI_B200}",
        attention=(_b200("cudnn"), _b200("flash2")),
        kernel_startup=_GH100_STARTUP,
        sms=148,
        fp8_transpose=False,
        assumed=("stream", "start"),  # 0.8 of the bandwidth, the H200's startup: none measured
    ),
    "gb200": DevicePreset(
        "gb200",
        189_471 * MiB,
        (
            ("bf16", 2500 * T),
            ("fp16", 2500 * T),
            ("fp8", 5000 * T),
            ("tf32", 1250 * T),
            ("fp32", 80 * T),
        ),
        8.0e12,
        # No MSMF: the MAMF burst 1822 of 2500 at the B200's sustained-to-burst ratio (1439 /
        # 1745), 1502 TFLOP/s; FP8: Azure's sustained cuBLASLt run, 2906.9 at 16384³.
        _curve(
            _GB200_SUSTAINED,
            2500 * T,
            f"{_GB200_MAMF} at the B200's MSMF/MAMF ({_MSMF}); fp8: Azure AI-benchmarking-guide "
            f"cuBLASLt, ND GB200 v6 (2a370be); ramp: {_XLA.format('sm_100')}",
            _SM100_RAMP_S,
            fp8=(_GB200_FP8_SUSTAINED, 5000 * T),
            inner_half=_SM100_INNER,
        ),
        "NVIDIA GB200 NVL72 specifications, divided by 72 GPUs and halved for density "
        "(360 PFLOPS FP16/BF16, 720 PFLOPS FP8, 180 PFLOPS TF32 with sparsity; 5,760 TFLOPS "
        "FP32; 13.4 TB HBM3e at 576 TB/s); memory: nvidia-smi's 189,471 MiB",
        attention=(_GB200_CUDNN, _gb200_flash2()),
        kernel_startup=_GH100_STARTUP,
        sms=152,
        fp8_transpose=False,
        assumed=("gemm", "stream", "start"),  # bf16 ceiling derived; B200's 0.8, H200's start
    ),
    "mi300x": DevicePreset(
        "mi300x",
        201_310_208 * 1024,
        (
            ("bf16", 1307.4 * T),
            ("fp16", 1307.4 * T),
            ("fp8", 2614.9 * T),
            ("tf32", 653.7 * T),
            ("fp32", 163.4 * T),
        ),
        5.3e12,
        # MI300X MSMF 659 TFLOP/s (the table's peak rounded to 1300; 750 W at 1290 MHz; an
        # earlier benchmark version);
        # FP8 (float8_e4m3fnuz) MSMF 1187 (750 W at 1189 MHz).
        _curve(
            659 / 1307.4,
            1307.4 * T,
            f"{_MSMF}: MI300X MSMF, bf16 and fp8; ramp: {_TRITON}, assumed",
            fp8=(1187 / 2614.9, 2614.9 * T),
        ),
        "AMD Instinct MI300X data sheet (dense FP16/BF16 1,307.4 TFLOPS, FP8 2,614.9, TF32 "
        f"653.7, FP32 matrix 163.4; 192 GB HBM3, 5.3 TB/s); {_ROCM_MI300X}",
        memory_efficiency=_MI300X_STREAM,
        attention=_MI300X_ATTENTION,
        kernel_startup=_GH100_STARTUP,
        sms=304,
        # the A100's ramp time, the H200's startup, Hopper's FP8 layouts: none measured
        assumed=("gemm", "start", "fp8-transpose"),
    ),
}
