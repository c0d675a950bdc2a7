"""vLLM's ``vllm.v1.sample.logits_processor``: the custom logits processor interface, defined in
``minengine.worker.logits_processors`` (aliases only)."""

from minengine.worker.logits_processors import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
    process_dict_updates,
)

__all__ = ["AddedRequest", "BatchUpdate", "LogitsProcessor", "MoveDirectionality", "MovedRequest", "RemovedRequest",
           "process_dict_updates"]
