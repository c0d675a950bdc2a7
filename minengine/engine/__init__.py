"""The engine's front: LLMEngine (add_request / step), LLM (offline batch), the incremental detokenizer."""
