"""GPU types the performance model knows (``baton list gpus``), each number with its source.

Sources as in ``baton.perf.presets``: [spec] the vendor's datasheet (dense tensor rates,
no sparsity), [smi] total memory as ``nvidia-smi`` reports it, [vidur] Vidur's A100 DGX
all-reduce profile, [none] an assumption that says so.

``peak_flops`` is the rate the named presets were built with; ``dtype_flops`` gives the
dense rate per matmul dtype, used by models that name their dtype (``--model``, a YAML
``model:`` block; see ``baton.perf.hf_config``). A GPU without a measured all-reduce
serves at tensor parallelism 1 only (``HardwareSpec.allreduce_call_s``).
"""

from __future__ import annotations

from baton.perf.specs import HardwareSpec

MiB = 2**20

# [vidur] all-reduce among 2/4/8 NVLink GPUs of a DGX A100: latency = intercept of a linear
# fit of the profile's medians over sizes up to 32 MiB, bus bandwidth from its slope
# (170 GB/s at 2 GPUs); plus Vidur's 20 us NCCL CPU launch cost per call.
_DGX_A100_ALLREDUCE_S = ((2, 45e-6), (4, 49e-6), (8, 48e-6))

# [spec] A100 SXM: BF16/FP16 312 TFLOP/s, INT8 624 TOP/s; no FP8 tensor cores (vLLM runs
# FP8 checkpoints weight-only on Ampere, so their matmuls run at the BF16 rate)
_A100_DTYPES = (("bf16", 312e12), ("fp16", 312e12), ("int8", 624e12), ("fp8", 312e12))
# [spec] H100/H200 SXM: BF16/FP16 989 TFLOP/s, FP8 1,979 TFLOP/s, INT8 1,979 TOP/s
_H100_DTYPES = (("bf16", 989e12), ("fp16", 989e12), ("int8", 1979e12), ("fp8", 1979e12))

HARDWARE: dict[str, HardwareSpec] = {
    # [spec] 312 TFLOP/s, 2.039 TB/s; [smi] 81,920 MiB; [vidur] all-reduce (above)
    "a100-80g": HardwareSpec("a100-80g", 312e12, 2.039e12, 81920 * MiB,
                             interconnect_bytes_per_s=170e9, allreduce_latency_s=_DGX_A100_ALLREDUCE_S,
                             collective_launch_s=20e-6, dtype_flops=_A100_DTYPES),
    # [spec] A100 SXM4 40GB: the 80 GB part's compute, 1.555 TB/s HBM2; [smi] 40,960 MiB
    # (A100-SXM4-40GB). All-reduce [vidur]: the same DGX A100 NVLink 3 / NVSwitch fabric
    # [none: the profile was taken on the 80 GB DGX]
    "a100-40g": HardwareSpec("a100-40g", 312e12, 1.555e12, 40960 * MiB,
                             interconnect_bytes_per_s=170e9, allreduce_latency_s=_DGX_A100_ALLREDUCE_S,
                             collective_launch_s=20e-6, dtype_flops=_A100_DTYPES),
    # [spec] SXM: 989 TFLOP/s, 3.35 TB/s; [smi] 81,559 MiB. All-reduce [vidur, scaled]: no
    # H100 profile exists here, so the A100 DGX one is carried over: the per-call latencies
    # (45/49/48 us at 2/4/8 GPUs, the intercepts above) and the 20 us launch unchanged
    # [none: NVSwitch hop latency assumed equal across the two generations], the bus
    # bandwidth scaled by NVLink 4 over NVLink 3 per-GPU bandwidth (900 / 600 GB/s):
    # 170 -> 255 GB/s.
    "h100": HardwareSpec("h100", 989e12, 3.35e12, 81559 * MiB, interconnect_bytes_per_s=255e9,
                         allreduce_latency_s=_DGX_A100_ALLREDUCE_S, collective_launch_s=20e-6,
                         dtype_flops=_H100_DTYPES),
    # [spec] H200 SXM: the H100's compute (989 BF16 / 1,979 FP8 TFLOP/s), 4.8 TB/s HBM3e,
    # 141 GB; [smi] 143,771 MiB; all-reduce as the H100's (NVLink 4, 900 GB/s per GPU:
    # the same [vidur, scaled] figures)
    "h200": HardwareSpec("h200", 989e12, 4.8e12, 143771 * MiB, interconnect_bytes_per_s=255e9,
                         allreduce_latency_s=_DGX_A100_ALLREDUCE_S, collective_launch_s=20e-6,
                         dtype_flops=_H100_DTYPES),
    # [spec] 148 TFLOP/s BF16, 296 FP8/INT8, 4.0 TB/s; 141 GB per GPU (SIBYL section 5.1);
    # [smi] of the 141 GB HBM3e configuration is 143,771 MiB on H200 [none: assumed the
    # same on H20]
    "h20": HardwareSpec("h20", 148e12, 4.0e12, 143771 * MiB, interconnect_bytes_per_s=450e9,
                        dtype_flops=(("bf16", 148e12), ("fp16", 148e12), ("int8", 296e12), ("fp8", 296e12))),
    # [spec] L40S (PCIe, no NVLink): BF16/FP16 362 TFLOP/s, FP8/INT8 733, 864 GB/s GDDR6;
    # [smi] 46,068 MiB; PCIe Gen4 x16, 32 GB/s each way. No all-reduce measured over
    # PCIe: tensor parallelism > 1 is refused rather than guessed.
    "l40s": HardwareSpec("l40s", 362e12, 0.864e12, 46068 * MiB, interconnect_bytes_per_s=32e9,
                         dtype_flops=(("bf16", 362e12), ("fp16", 362e12), ("int8", 733e12), ("fp8", 733e12))),
    # [spec] INT8 297 TOP/s (W8A8 runs the matmuls on INT8 tensor cores; the rate the
    # ARES preset was built with, kept as peak_flops), 1.008 TB/s; [smi] 24,564 MiB.
    # BF16/FP16 147 TFLOP/s and FP8 294 (FP32 accumulate): AD102 with 114 SMs at a
    # 2.52 GHz boost, per the Ada whitepaper's per-SM rates (GeForce halves FP32-accumulate
    # tensor rates). The whitepaper's dense INT8 for 114 SMs would be 588 TOP/s; int8 stays
    # at 297 so the calibrated ARES preset is unchanged.
    "rtx4090d": HardwareSpec("rtx4090d", 297e12, 1.008e12, 24564 * MiB, interconnect_bytes_per_s=32e9,
                             dtype_flops=(("bf16", 147e12), ("fp16", 147e12), ("fp8", 294e12))),
}
