"""HybridModelRunner: the runner of a model with two KV cache groups (full-attention and windowed layers).

Each step's ``SchedulerOutput`` carries two block tables per request (``core/hybrid_kv_cache_manager.py``): the
full-attention group's in each ``ScheduledRequest.block_ids``, the windowed group's in
``SchedulerOutput.windowed_block_ids``. The runner builds the step's ``ForwardBatch`` twice, once through each
group's persistent ``BlockTable``: the two batches have the same tokens, positions and row order (the order
depends only on each request's new tokens and start), and differ in the slot mapping (where a layer writes its
K/V) and in the blocks attention reads. The full-attention layers use the first, the windowed layers the second
cut to their window (``models/windowed_llama.py``); each layer's K/V tensors index its own group's pool.
"""

from __future__ import annotations

import dataclasses

from minengine.core.scheduler_output import SchedulerOutput
from minengine.worker.block_table import BlockTable
from minengine.worker.forward_batch import ForwardBatch
from minengine.worker.model_runner import ModelRunner


@dataclasses.dataclass
class HybridForwardBatch(ForwardBatch):
    """The full-attention group's ``ForwardBatch`` (its own fields) with the windowed group's beside it.

    Attributes:
        windowed_group: the same step through the windowed group's block tables: its ``slot_mapping`` and
            attention groups index the windowed layers' K/V tensors.
    """

    windowed_group: ForwardBatch | None = None


def windowed_group_output(scheduler_output: SchedulerOutput) -> SchedulerOutput:
    """The step with each request's ``block_ids`` replaced by its windowed group's table (a shallow copy; the
    step's own objects are not changed).

    Raises:
        KeyError: a scheduled request without a windowed table (a step not built by ``KVCacheGroupSteps``).
    """
    tables = scheduler_output.windowed_block_ids
    scheduled = [dataclasses.replace(s, block_ids=tables[s.request_id]) for s in scheduler_output.scheduled]
    return dataclasses.replace(scheduler_output, scheduled=scheduled)


class HybridModelRunner(ModelRunner):
    """``ModelRunner`` whose batches carry the windowed group's ``ForwardBatch`` too (arguments as
    ``ModelRunner``'s).

    Attributes:
        windowed_block_table: the running requests' windowed-group tables, kept between steps.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.windowed_block_table = BlockTable()

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> HybridForwardBatch:
        """The step's ``ForwardBatch`` through the full group's tables, carrying the windowed group's."""
        full = super().prepare_inputs(scheduler_output)
        windowed = ForwardBatch.build(windowed_group_output(scheduler_output), self.block_size, self.device,
                                      self.windowed_block_table, attention_backend=self.attention_backend)
        fields = {f.name: getattr(full, f.name) for f in dataclasses.fields(ForwardBatch)}
        return HybridForwardBatch(**fields, windowed_group=windowed)
