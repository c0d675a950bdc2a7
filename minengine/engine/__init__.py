"""The engine's front: LLMEngine (add_request / step), LLM (offline batch), the incremental detokenizer.

The async-scheduling engine is imported here so that it is registered with ``LLMEngine`` (which builds it for
``async_scheduling=True``) whichever module of the package is imported first.
"""

import minengine.engine.async_scheduling_engine  # noqa: F401
