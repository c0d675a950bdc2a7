"""``vllm.v1.engine.async_llm.AsyncLLM`` is minengine's ``AsyncLLMEngine`` (``minengine.entrypoints.async_engine``)."""

from minengine.entrypoints.async_engine import AsyncLLMEngine as AsyncLLM

__all__ = ["AsyncLLM"]
