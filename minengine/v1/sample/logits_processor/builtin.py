"""vLLM's ``vllm.v1.sample.logits_processor.builtin`` path for ``process_dict_updates`` (an alias)."""

from minengine.worker.logits_processors import process_dict_updates

__all__ = ["process_dict_updates"]
