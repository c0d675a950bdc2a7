"""The engine's front: LLMEngine (add_request / step), LLM (offline batch), the incremental detokenizer.

``LLMEngine(config)`` builds the subclass the configuration's doors choose (``engine_doors.py``).
"""
