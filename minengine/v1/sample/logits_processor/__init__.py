"""vLLM's ``vllm.v1.sample.logits_processor``: the custom logits processor interface, defined in
``minengine.worker.logits_processors`` (aliases only)."""

from minengine.worker.logits_processors import (
    AdapterLogitsProcessor,
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
    RequestLogitsProcessor,
    process_dict_updates,
)

__all__ = ["AdapterLogitsProcessor", "AddedRequest", "BatchUpdate", "LogitsProcessor", "MoveDirectionality",
           "MovedRequest", "RemovedRequest", "RequestLogitsProcessor", "process_dict_updates"]
