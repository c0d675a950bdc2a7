"""vLLM's ``vllm.v1`` import paths, as aliases of minengine's own modules, so that a vLLM script runs with
``vllm`` replaced by ``minengine`` in its imports: ``minengine.v1.engine.async_llm.AsyncLLM`` and
``minengine.v1.metrics.reader``. Nothing is defined here."""
