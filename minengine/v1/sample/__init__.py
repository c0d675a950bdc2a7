"""vLLM's ``vllm.v1.sample`` import path (``minengine.v1.sample.logits_processor``); nothing is defined here."""
