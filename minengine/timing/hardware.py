"""Hardware presets for the step cost model: datasheet peaks, and the fraction of them a serving engine reaches.

A roofline (Williams et al., "Roofline", CACM 2009) needs two peaks, FLOP/s and bytes/s; a serving step never
reaches either, so each preset carries the efficiencies an engine achieves in practice: MFU (model FLOPs
utilization) for compute-bound work and MBU (model bandwidth utilization; Databricks/MosaicML, "LLM Inference
Performance Engineering: Best Practices", 2023) for memory-bound work, plus a fixed per-step overhead
(scheduling, input preparation, kernel launches, sampling).

Datasheet figures are dense (no 2:4 sparsity) tensor-core peaks, in SI units (1 TB/s = 1e12 bytes/s):

- H100 SXM5 80 GB: 989.5 TFLOP/s BF16/FP16, 1,979 TFLOP/s FP8, 3.35 TB/s HBM3, NVLink 900 GB/s (450 GB/s per
  direction), PCIe Gen5 x16 128 GB/s (64 GB/s per direction). NVIDIA H100 Tensor Core GPU datasheet.
- H200 SXM 141 GB: compute as H100 SXM, 4.8 TB/s HBM3e, NVLink 900 GB/s, PCIe Gen5. NVIDIA H200 datasheet.
- A100 SXM4 80 GB: 312 TFLOP/s BF16/FP16 (no FP8), 2,039 GB/s HBM2e, NVLink 600 GB/s (300 per direction),
  PCIe Gen4 x16 64 GB/s (32 per direction). NVIDIA A100 Tensor Core GPU datasheet.
- L4 24 GB: 121 TFLOP/s BF16/FP16, 242.5 TFLOP/s FP8 (the datasheet's 242 / 485 are with sparsity), 300 GB/s
  GDDR6, PCIe Gen4 x16, no NVLink. NVIDIA L4 Tensor Core GPU datasheet.
- GeForce RTX 4090 24 GB: 165.2 TFLOP/s FP16/BF16 with FP32 accumulate (what PyTorch uses; 330.3 with FP16
  accumulate), 1,008 GB/s GDDR6X, PCIe Gen4 x16, no NVLink. NVIDIA Ada GPU Architecture whitepaper, table 2.
  FP8 is left out here (the whitepaper's FP8 rates depend on the accumulator), so FP8 shapes use the 16-bit peak.

Efficiency defaults (all presets but ``cpu``), set from published measurements of real engines, each checked
against other published measurements in ``benchmarks/cost_model_validation.py``:

- ``mbu = 0.7`` and ``step_overhead_s = 1.5e-3``: vLLM's nightly latency benchmark on one H200
  (Llama-3.1-8B, batch 8, 32 prompt + 128 output tokens: 833 ms, i.e. ~6.5 ms per decode step for 16 GB of
  weights that take 3.35 ms at the datasheet bandwidth) and on four H200s (Llama-3-70B, TP 4: 2,078 ms); the
  two runs share the engine and the GPU, so their difference separates bandwidth from fixed cost (round values
  near that solution; the validation table shows -8 % and -1 % on these two runs).
- ``mfu = 0.5``: NVIDIA NIM's published TTFT of 407 ms for a 5,000-token prompt on Llama-3.3-70B (FP8, TP 2,
  2x H100) implies ~50 % of the FP8 peak across the whole prefill (attention included).
- ``allreduce_latency_s = 25e-6``: the fixed cost of one NCCL all-reduce of a small message on an 8x H100
  DGX node: mean times of 20-40 us for messages of 2 KB to 1 MB in Vidur's profiling data (Agrawal et al.,
  MLSys 2024; microsoft/vidur ``data/profiling/network/h100_dgx/all_reduce.csv``). ``comm_efficiency = 0.6``:
  the same file's 2 MB all-reduce (39 us mean) moves 2 x 7/8 x 2 MB in the ~14 us beyond that latency, ~0.6 of
  NVLink's 450 GB/s per direction.

The ``cpu`` preset is not a datasheet: its numbers were fitted by ``minengine.timing.calibrate`` on this
project's 2-core machine (1 torch thread, float32, bundled model; see ``CPU_CALIBRATION_NOTE``). Fit your own
with ``calibrate(engine).hardware``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TERA = 1e12
GIGA = 1e9

COMBINE_MODES = ("max", "sum")


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) as the step cost model sees it. Units: FLOP/s, bytes/s, bytes, seconds.

    Attributes:
        name: shown in figure titles ("H100 SXM").
        peak_flops: dense 16-bit (BF16/FP16) tensor peak, FLOP/s.
        memory_bandwidth: device memory bandwidth, bytes/s.
        memory_bytes: device memory, bytes (for reference; the cost model does not check capacity).
        peak_flops_8bit: dense FP8 peak (FLOP/s) for 1-byte model shapes; ``None`` = use ``peak_flops``.
        interconnect_bandwidth: GPU-to-GPU bandwidth per direction (NVLink), bytes/s; 0 = over ``host_link``.
        host_link_bandwidth: host link per direction (PCIe), bytes/s: KV swap traffic, and tensor parallelism
            without NVLink.
        mfu: fraction of the peak FLOP/s a step reaches when compute-bound, in (0, 1].
        mbu: fraction of the memory bandwidth a step reaches when memory-bound, in (0, 1].
        step_overhead_s: fixed seconds per step (scheduler, input preparation, launches, sampling).
        per_request_overhead_s: extra seconds per scheduled request (host-side bookkeeping; 0 for GPUs, where
            it hides behind the device; fitted for the CPU).
        allreduce_latency_s: fixed seconds of one all-reduce (tensor parallelism only).
        comm_efficiency: fraction of ``interconnect_bandwidth`` an all-reduce reaches, in (0, 1].
        combine: "max" (the roofline: compute and memory traffic overlap, the slower one bounds the step) or
            "sum" (no overlap; what a fitted CPU model uses).
        source: where the figures come from.

    Raises:
        ValueError: a rate or efficiency that is not > 0 (efficiencies also <= 1), a negative overhead, an
            unknown ``combine``.
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float = 0.0
    peak_flops_8bit: float | None = None
    interconnect_bandwidth: float = 0.0
    host_link_bandwidth: float = 32 * GIGA
    mfu: float = 0.5
    mbu: float = 0.7
    step_overhead_s: float = 1.5e-3
    per_request_overhead_s: float = 0.0
    allreduce_latency_s: float = 25e-6
    comm_efficiency: float = 0.6
    combine: str = "max"
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth", "host_link_bandwidth"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"Hardware.{name} must be a number > 0, got {v!r}")
        if self.peak_flops_8bit is not None and not self.peak_flops_8bit > 0:
            raise ValueError(f"Hardware.peak_flops_8bit must be > 0 or None, got {self.peak_flops_8bit!r}")
        for name in ("mfu", "mbu", "comm_efficiency"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
                raise ValueError(f"Hardware.{name} must be in (0, 1], got {v!r}")
        for name in ("memory_bytes", "interconnect_bandwidth", "step_overhead_s", "per_request_overhead_s",
                     "allreduce_latency_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                raise ValueError(f"Hardware.{name} must be a number >= 0, got {v!r}")
        if self.combine not in COMBINE_MODES:
            raise ValueError(f"Hardware.combine must be one of {COMBINE_MODES}, got {self.combine!r}")

    def peak_flops_for(self, dtype_bytes: int) -> float:
        """The peak for a model stored in ``dtype_bytes`` bytes per weight: FP8 (1 byte) uses
        ``peak_flops_8bit`` where the hardware has it, everything else the 16-bit peak."""
        if dtype_bytes == 1 and self.peak_flops_8bit is not None:
            return self.peak_flops_8bit
        return self.peak_flops

    def with_(self, **changes) -> Hardware:
        """A copy with some fields changed (e.g. ``H100.with_(mfu=0.6)``); validated like the constructor."""
        return dataclasses.replace(self, **changes)


H100_SXM = Hardware(
    name="H100 SXM", peak_flops=989.5 * TERA, peak_flops_8bit=1979 * TERA, memory_bandwidth=3.35 * TERA,
    memory_bytes=80e9, interconnect_bandwidth=450 * GIGA, host_link_bandwidth=64 * GIGA,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989.5 TFLOP/s BF16 dense, 3.35 TB/s HBM3, NVLink 900 GB/s")
H200 = Hardware(
    name="H200", peak_flops=989.5 * TERA, peak_flops_8bit=1979 * TERA, memory_bandwidth=4.8 * TERA,
    memory_bytes=141e9, interconnect_bandwidth=450 * GIGA, host_link_bandwidth=64 * GIGA,
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 989.5 TFLOP/s BF16 dense, 4.8 TB/s HBM3e, NVLink 900 GB/s")
A100_80GB = Hardware(
    name="A100 80GB", peak_flops=312 * TERA, memory_bandwidth=2.039 * TERA, memory_bytes=80e9,
    interconnect_bandwidth=300 * GIGA, host_link_bandwidth=32 * GIGA,
    source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): 312 TFLOP/s BF16 dense, 2,039 GB/s, NVLink 600 GB/s")
L4 = Hardware(
    name="L4", peak_flops=121 * TERA, peak_flops_8bit=242.5 * TERA, memory_bandwidth=300 * GIGA, memory_bytes=24e9,
    interconnect_bandwidth=0.0, host_link_bandwidth=32 * GIGA,
    source="NVIDIA L4 Tensor Core GPU datasheet: 121 TFLOP/s BF16 dense (242 with sparsity), 300 GB/s GDDR6")
RTX_4090 = Hardware(
    name="RTX 4090", peak_flops=165.2 * TERA, memory_bandwidth=1.008 * TERA, memory_bytes=24e9,
    interconnect_bandwidth=0.0, host_link_bandwidth=32 * GIGA,
    source="NVIDIA Ada GPU Architecture whitepaper: RTX 4090 165.2 TFLOP/s FP16/BF16 (FP32 accumulate), "
           "1,008 GB/s GDDR6X")

CPU_CALIBRATION_NOTE = ("fitted by minengine.timing.calibrate on the project's 2-core x86_64 machine, 1 torch "
                        "thread, float32, bundled model (2026-12-01)")
# Effective rates of the bundled model's steps on that machine (see CPU_CALIBRATION_NOTE): a linear fit of
# measured step times to FLOPs, bytes, requests and a constant, with compute and memory time added ("sum").
# calibrate(LLMEngine.from_config(max_num_batched_tokens=512, max_num_seqs=32, num_kv_blocks=512,
# max_model_len=1024), repeats=7): prefills of 16-512 tokens, decode batches of 1-32 at 128-token contexts;
# R^2 0.96, worst relative error 18 % (the 512-token prefill), the other points within 7 %.
CPU = Hardware(
    name="CPU (2 cores, fitted)", peak_flops=83.5 * GIGA, memory_bandwidth=51.5 * GIGA, memory_bytes=24e9,
    host_link_bandwidth=51.5 * GIGA, mfu=1.0, mbu=1.0, step_overhead_s=1.18e-3, per_request_overhead_s=52e-6,
    allreduce_latency_s=0.0, combine="sum", source=CPU_CALIBRATION_NOTE)

HARDWARE: dict[str, Hardware] = {
    "h100": H100_SXM, "h200": H200, "a100": A100_80GB, "l4": L4, "rtx4090": RTX_4090, "cpu": CPU,
}
_ALIASES = {"h100-sxm": "h100", "h100_sxm": "h100", "a100-80gb": "a100", "a100_80gb": "a100", "4090": "rtx4090",
            "rtx-4090": "rtx4090"}


def get_hardware(name: str | Hardware) -> Hardware:
    """A preset by name (case-insensitive: "h100", "h200", "a100", "l4", "rtx4090", "cpu"), or a ``Hardware``
    as is.

    Raises:
        ValueError: an unknown name (the message lists the presets).
    """
    if isinstance(name, Hardware):
        return name
    if not isinstance(name, str):
        raise ValueError(f"hardware must be a preset name or a Hardware, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; presets: {', '.join(HARDWARE)}")
    return HARDWARE[key]
