"""minengine: a compact, readable LLM serving engine (paged KV cache, continuous batching, chunked prefill,
prefix caching, preemption) with vLLM's public API.

The names below are imported on first use (PEP 562 ``__getattr__``), so ``import minengine.core`` or
``import minengine.fleet`` does not load torch; ``from minengine import LLM`` works as before.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BUNDLED_MODEL": "minengine.config", "EngineConfig": "minengine.config", "POLICIES": "minengine.core.policies",
    "AsyncEngineArgs": "minengine.engine.arg_utils", "EngineArgs": "minengine.engine.arg_utils",
    "LLM": "minengine.engine.llm", "LLMEngine": "minengine.engine.llm_engine",
    "AsyncLLMEngine": "minengine.entrypoints.async_engine",
    "PromptType": "minengine.inputs", "TextPrompt": "minengine.inputs", "TokensPrompt": "minengine.inputs",
    "CompletionOutput": "minengine.outputs", "Logprob": "minengine.outputs", "RequestMetrics": "minengine.outputs",
    "RequestOutput": "minengine.outputs",
    "RequestOutputKind": "minengine.sampling_params", "SamplingParams": "minengine.sampling_params",
}

__all__ = ["BUNDLED_MODEL", "LLM", "POLICIES", "AsyncEngineArgs", "AsyncLLMEngine", "CompletionOutput", "EngineArgs",
           "EngineConfig", "LLMEngine", "Logprob", "PromptType", "RequestMetrics", "RequestOutput",
           "RequestOutputKind", "SamplingParams", "TextPrompt", "TokensPrompt"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'minengine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
