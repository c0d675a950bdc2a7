"""minengine: a compact, readable LLM serving engine (paged KV cache, continuous batching, chunked prefill,
prefix caching, preemption) with vLLM's public API."""

from minengine.config import BUNDLED_MODEL, EngineConfig
from minengine.core.policies import POLICIES
from minengine.engine.arg_utils import AsyncEngineArgs, EngineArgs
from minengine.engine.llm import LLM
from minengine.engine.llm_engine import LLMEngine
from minengine.entrypoints.async_engine import AsyncLLMEngine
from minengine.inputs import PromptType, TextPrompt, TokensPrompt
from minengine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from minengine.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["BUNDLED_MODEL", "LLM", "POLICIES", "AsyncEngineArgs", "AsyncLLMEngine", "CompletionOutput", "EngineArgs",
           "EngineConfig", "LLMEngine", "Logprob", "PromptType", "RequestMetrics", "RequestOutput",
           "RequestOutputKind", "SamplingParams", "TextPrompt", "TokensPrompt"]
__version__ = "0.1.0"
