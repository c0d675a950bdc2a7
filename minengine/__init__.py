"""minengine: a compact, readable LLM serving engine (paged KV cache, continuous batching, chunked prefill,
prefix caching, preemption) with vLLM's public API."""

from minengine.config import BUNDLED_MODEL, EngineConfig
from minengine.core.policies import POLICIES
from minengine.engine.llm import LLM
from minengine.engine.llm_engine import LLMEngine
from minengine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minengine.sampling_params import SamplingParams

__all__ = ["BUNDLED_MODEL", "LLM", "POLICIES", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestMetrics",
           "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
