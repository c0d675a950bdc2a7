"""vLLM v1's custom logits processor interface, and the persistent batch it sees.

A custom logits processor (vLLM's ``vllm.v1.sample.logits_processor.LogitsProcessor``; ``LLM(model,
logits_processors=[MyProcessor])``) is one object per engine that edits the logits of the whole batch at once:
``apply(logits)`` gets a [B, V] tensor whose row i belongs to the request at batch index i. The processor keeps
its own per-request state keyed by that index, kept current by ``update_state(batch_update)``, which tells it,
before each step, which requests left the batch (``removed``), which joined (``added``: index, params, prompt ids,
and a live reference to the output ids) and which moved to another index (``moved``). vLLM's batch is its
persistent ``InputBatch``; here the batch of a step is the requests it samples for, and ``CustomLogitsProcessors``
keeps each in the same slot while it keeps sampling, reusing freed slots first and moving the last ones into the
holes so the batch stays dense (vLLM's condensing). Processors are built with ``(vllm_config, device,
is_pin_memory)``. As in vLLM, they cannot be combined with speculative decoding.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minengine.core.scheduler_output import ScheduledRequest
    from minengine.sampling_params import SamplingParams


class MoveDirectionality(Enum):
    """A move in the batch: ``UNIDIRECTIONAL`` a -> b (b's old entry is gone), or ``SWAP`` a <-> b."""

    UNIDIRECTIONAL = auto()
    SWAP = auto()


RemovedRequest = int
AddedRequest = tuple  # (index, SamplingParams, prompt_token_ids, output_token_ids: the request's live list)
MovedRequest = tuple  # (index a, index b, MoveDirectionality)


@dataclass(frozen=True)
class BatchUpdate:
    """How the batch changed since the last step (vLLM's ``BatchUpdate``). Process ``removed``, then
    ``added``, then ``moved``; an added request may take the index of a removed one (never listed in both)."""

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """vLLM v1's custom logits processor base class (``vllm.v1.sample.logits_processor.LogitsProcessor``)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ``ValueError`` for a request's params this processor cannot take (called when it is added)."""
        return None

    @abstractmethod
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Edit the batch's logits ([B, V] float32, row = batch index); return them (in place or new)."""
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when ``apply`` never changes a row's argmax (vLLM then skips it for greedy requests)."""
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Before each step: the batch's changes, or None when its makeup did not change."""
        raise NotImplementedError


# a request-level processor: (output ids, logits row [V]) -> row, or (prompt ids, output ids, row) -> row
RequestLogitsProcessor = Callable[[list[int], torch.Tensor], torch.Tensor] | \
    Callable[[list[int], list[int], torch.Tensor], torch.Tensor]


class AdapterLogitsProcessor(LogitsProcessor):
    """vLLM's adapter from request-level logits processors (v0's interface: a callable per request) to the batch
    interface. A subclass gives ``new_req_logits_processor(params)``: the request's callable, or None to leave
    its row alone; ``apply`` then calls each request's callable on its own row (its output ids are the live
    list, so the callable sees every token generated so far). Row by row, so slower than a batched processor.
    """

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.req_info: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}

    @abstractmethod
    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        """The request-level processor for a request's ``params`` (None: this processor skips it)."""
        raise NotImplementedError

    def _new_state(self, params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]):
        req_lp = self.new_req_logits_processor(params)
        if req_lp is None:
            return None
        takes_prompt = len(inspect.signature(req_lp).parameters) == 3
        return functools.partial(req_lp, prompt_ids, output_ids) if takes_prompt else \
            functools.partial(req_lp, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.req_info, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, req_lp in self.req_info.items():
            logits[index] = req_lp(logits[index])
        return logits


def process_dict_updates(req_entries: dict, batch_update: BatchUpdate | None,
                         new_state: Callable[[SamplingParams, list[int] | None, list[int]], object]) -> bool:
    """vLLM's helper for a processor that keeps ``{batch index: state}``: apply a ``BatchUpdate`` to it, with
    ``new_state(params, prompt_ids, output_ids)`` giving an added request's state (None: not tracked). Returns
    whether the dict changed."""
    if not batch_update:
        return False
    updated = False
    for index in batch_update.removed:
        updated |= req_entries.pop(index, None) is not None
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            req_entries[index] = state
            updated = True
        elif req_entries.pop(index, None) is not None:
            updated = True
    for a, b, direction in batch_update.moved:
        a_entry, b_entry = req_entries.pop(a, None), req_entries.pop(b, None)
        if a_entry is not None:
            req_entries[b] = a_entry
        if direction is MoveDirectionality.SWAP and b_entry is not None:
            req_entries[a] = b_entry
        updated |= a_entry is not None or b_entry is not None
    return updated


def load_logits_processors(specs: Sequence) -> list[type[LogitsProcessor]]:
    """The processor classes of ``LLM(logits_processors=...)``: classes, or ``"module.path:ClassName"`` strings
    (vLLM's fully qualified names).

    Raises:
        ValueError: naming ``logits_processors``: a string that does not import, or anything that is not a
            ``LogitsProcessor`` subclass.
    """
    classes = []
    for i, spec in enumerate(specs):
        obj = spec
        if isinstance(spec, str):
            module, _, qualname = spec.partition(":")
            try:
                obj = importlib.import_module(module)
                for attr in qualname.split(".") if qualname else ():
                    obj = getattr(obj, attr)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"logits_processors[{i}] {spec!r} cannot be loaded: {exc}") from None
        if not (isinstance(obj, type) and issubclass(obj, LogitsProcessor)):
            raise ValueError(f"logits_processors[{i}] must be a LogitsProcessor subclass (vLLM's "
                             f"vllm.v1.sample.logits_processor.LogitsProcessor) or its 'module:Class' name, "
                             f"got {spec!r}")
        classes.append(obj)
    return classes


class CustomLogitsProcessors:
    """The engine's custom processors and the batch slots of the requests they see.

    Args:
        classes: the processor classes (``load_logits_processors``).
        vllm_config: what each constructor receives as ``vllm_config`` (``minengine.config.VllmConfig``).
        device: the device of the logits they get (the sampler's: the CPU).
    """

    def __init__(self, classes: Sequence[type[LogitsProcessor]], vllm_config, device: torch.device):
        self.classes = list(classes)
        self.processors = [cls(vllm_config, device, False) for cls in self.classes]
        self.slots: dict[str, int] = {}  # request id -> batch index

    def batch_update(self, requests: Sequence[ScheduledRequest]) -> BatchUpdate | None:
        """Give this step's requests their batch indices; the changes since the last step (None: none)."""
        current = {s.request_id: s for s in requests}
        removed = sorted(slot for rid, slot in self.slots.items() if rid not in current)
        for rid in [rid for rid in self.slots if rid not in current]:
            del self.slots[rid]
        holes = list(removed)
        added = []
        for rid, s in current.items():
            if rid in self.slots:
                continue
            slot = holes.pop(0) if holes else len(self.slots)
            self.slots[rid] = slot
            added.append((slot, s.sampling_params, list(s.prompt_token_ids), s.output_token_ids))
        reused = {a[0] for a in added}
        removed = [i for i in removed if i not in reused]
        moved = []
        size = len(current)
        by_slot = {slot: rid for rid, slot in self.slots.items()}
        for hole in sorted(h for h in holes if h < size):  # condense: the last requests fill the holes
            last = max(by_slot)
            rid = by_slot.pop(last)
            self.slots[rid] = hole
            by_slot[hole] = rid
            moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        if not (removed or added or moved):
            return None
        return BatchUpdate(batch_size=size, removed=removed, added=added, moved=moved)

    def apply(self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> torch.Tensor:
        """Run every processor over the step's logits ([R, V] float32, one row per request in ``requests``
        order; edited and returned): rows are put in batch-index order for them and back."""
        update = self.batch_update(requests)
        for lp in self.processors:
            lp.update_state(update)
        order = [0] * len(requests)
        for row, s in enumerate(requests):
            order[self.slots[s.request_id]] = row
        identity = order == list(range(len(order)))
        batch = logits if identity else logits[order]
        for lp in self.processors:
            batch = lp.apply(batch)
        if not identity:
            logits[order] = batch
        return batch if identity else logits
