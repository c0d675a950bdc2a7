"""Engine profiles: the host-side cost of one step, which depends on the serving engine, not on the GPU.

Between two forward passes an engine schedules, builds the next step's inputs, samples and turns sampled ids into
outputs. A Python engine that does this synchronously (vLLM before its multi-step / async output work, Sarathi,
minengine itself) leaves the GPU idle for that time every step; a C++ runtime with CUDA graphs and an overlapped
scheduler (TensorRT-LLM's, llama.cpp's) hides most of it. Engines also differ in how they all-reduce small
messages: vLLM and TensorRT-LLM use their own one-shot all-reduce kernels over NVLink instead of NCCL for
messages up to a few MB.

Profiles (``ENGINES``):

- ``"vllm"`` (the default of every GPU preset): a vLLM-like Python engine, the kind this project teaches and is.
  Per step ``1.2 ms`` plus ``0.1 ms`` per scheduled request: a least-squares line through Vidur's measured CPU
  overheads of Sarathi, a vLLM-derived Python engine (microsoft/vidur ``data/profiling/a100/cpu_overheads.csv``,
  Llama-2-7B, TP 1, medians of schedule + prepare inputs + sampler + process outputs: 1.97 ms at batch 8, 2.80 at
  16, 4.62 at 32, 7.59 at 64). vLLM's own profile agrees on the per-request part: ``_process_model_outputs``
  alone took 0.2 ms at batch 1 and 3.4 ms at batch 32 (vLLM RFC #6913, Llama-3-70B on 4x H100). Small
  all-reduces (<= 8 MiB) take 10 us: vLLM's custom all-reduce kernel on H100 at TP 2 / 4 / 8 (8.5-11.8 us for
  512 B to 32 KB; sgl-project/sglang PR #2904, "unit test performance in H100").
- ``"cuda-graph"``: a C++ runtime replaying CUDA graphs (TensorRT-LLM, llama.cpp). Per step ``0.1 ms``, per
  request 0: an *assumption* (one graph launch and one device-to-host copy of the sampled ids are tens of
  microseconds; no published per-step figure was found to cite). Small all-reduces take 5 us: the
  TensorRT-LLM-derived one-shot kernel in SGLang on H100 (3.7-5.9 us for 512 B to 32 KB at TP 2 / 4 / 8, same
  PR).
- ``"none"``: no host cost, NCCL all-reduces (the kernels alone; a fitted CPU preset, whose measured overheads
  are the hardware's own).

The engine's overheads add to the hardware's own ``step_overhead_s`` / ``per_request_overhead_s`` (0 for GPUs).
Messages larger than ``custom_allreduce_max_bytes`` go through NCCL (the hardware's fitted latency and bus
bandwidth); smaller ones pay the engine's ``allreduce_latency_s`` instead of NCCL's latency.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class EngineProfile:
    """The host-side cost of an engine's step. Units: seconds, bytes.

    Attributes:
        name: "vllm", "cuda-graph", "none", or your own.
        step_overhead_s: seconds per non-empty step the GPU waits for the host (scheduling, inputs, sampling,
            outputs), >= 0.
        per_request_overhead_s: extra seconds per scheduled request, >= 0.
        allreduce_latency_s: fixed seconds of a small all-reduce with the engine's own kernel; ``None`` = NCCL
            (the hardware's ``allreduce_latency_s``).
        custom_allreduce_max_bytes: the largest message the engine's own kernel takes (vLLM: 8 MiB).
        source: where the numbers come from.

    Raises:
        ValueError: a negative number.
    """

    name: str
    step_overhead_s: float = 0.0
    per_request_overhead_s: float = 0.0
    allreduce_latency_s: float | None = None
    custom_allreduce_max_bytes: int = 8 * MIB
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("step_overhead_s", "per_request_overhead_s", "custom_allreduce_max_bytes"):
            v = getattr(self, field)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                raise ValueError(f"EngineProfile.{field} must be a number >= 0, got {v!r}")
        if self.allreduce_latency_s is not None and not self.allreduce_latency_s >= 0:
            raise ValueError(f"EngineProfile.allreduce_latency_s must be >= 0 or None, "
                             f"got {self.allreduce_latency_s!r}")

    def with_(self, **changes) -> EngineProfile:
        """A copy with some fields changed; validated like the constructor."""
        return dataclasses.replace(self, **changes)


VLLM = EngineProfile(
    "vllm", step_overhead_s=1.2e-3, per_request_overhead_s=1.0e-4, allreduce_latency_s=10e-6,
    source="Vidur's measured CPU overheads of Sarathi (a vLLM-derived Python engine; A100, Llama-2-7B, TP 1, "
           "batch 8-64): 1.2 ms + 0.1 ms per request; vLLM's custom all-reduce ~10 us (sglang PR #2904)")
CUDA_GRAPH = EngineProfile(
    "cuda-graph", step_overhead_s=1.0e-4, per_request_overhead_s=0.0, allreduce_latency_s=5e-6,
    source="assumed 0.1 ms per step (a C++ runtime replaying CUDA graphs, overlapped scheduling); one-shot "
           "all-reduce ~5 us (sglang PR #2904)")
NO_ENGINE = EngineProfile("none", source="no host cost; NCCL all-reduces")

ENGINES: dict[str, EngineProfile] = {"vllm": VLLM, "cuda-graph": CUDA_GRAPH, "none": NO_ENGINE}
_ALIASES = {"python": "vllm", "sarathi": "vllm", "minengine": "vllm", "cuda-graphs": "cuda-graph",
            "trt-llm": "cuda-graph", "tensorrt-llm": "cuda-graph", "trtllm": "cuda-graph", "llama.cpp": "cuda-graph",
            "kernels": "none"}


def get_engine(name: str | EngineProfile) -> EngineProfile:
    """A profile by name (case-insensitive: "vllm", "cuda-graph", "none"; also "trt-llm", "llama.cpp",
    "python"), or an ``EngineProfile`` as is.

    Raises:
        ValueError: an unknown name (the message lists the profiles).
    """
    if isinstance(name, EngineProfile):
        return name
    if not isinstance(name, str):
        raise ValueError(f"engine must be a profile name or an EngineProfile, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; profiles: {', '.join(ENGINES)}")
    return ENGINES[key]
