"""Does a model shape fit the modelled hardware? The weights a GPU holds, against its memory.

The step cost model prices any hardware x model pair, including deployments that cannot exist (Llama-3-70B in
BF16 is ~141 GB of weights: 4 x L4 hold 96 GB in all). A figure on such a pair would teach a number no engine
can produce, so the dashboard warns with this check. The usable share is vLLM's ``gpu_memory_utilization``
default (0.9); what is left after the weights is the KV cache, which must hold at least one full-length request
in a real deployment (not checked here: the dashboard's workloads are small).
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.timing.hardware import Hardware, get_hardware
from minengine.timing.model_shape import ModelShape, get_model_shape

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory the engine may use


@dataclass(frozen=True)
class MemoryFit:
    """Weights per device against usable device memory, in bytes (``fits``: the weights leave room for KV)."""

    weight_bytes_per_device: float
    usable_bytes_per_device: float

    @property
    def fits(self) -> bool:
        return self.weight_bytes_per_device < self.usable_bytes_per_device

    @property
    def kv_bytes_per_device(self) -> float:
        """Bytes left for the KV cache on each device (0 when the weights do not fit)."""
        return max(0.0, self.usable_bytes_per_device - self.weight_bytes_per_device)


def memory_fit(hardware: str | Hardware, model: str | ModelShape, tp: int = 1,
               gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> MemoryFit:
    """The weights one device holds (``shape.weight_bytes / tp``: tensor parallelism splits the weights
    evenly) against ``gpu_memory_utilization x memory_bytes`` of that device.

    Raises:
        ValueError: ``tp`` < 1, ``gpu_memory_utilization`` outside (0, 1], an unknown preset, or hardware with no
            ``memory_bytes``.
    """
    hw, shape = get_hardware(hardware), get_model_shape(model)
    if not (isinstance(tp, int) and tp >= 1):
        raise ValueError(f"tp must be an integer >= 1 (devices), got {tp!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if not hw.memory_bytes > 0:
        raise ValueError(f"hardware {hw.name!r} has no memory_bytes to check against")
    return MemoryFit(weight_bytes_per_device=shape.weight_bytes / tp,
                     usable_bytes_per_device=gpu_memory_utilization * hw.memory_bytes)
