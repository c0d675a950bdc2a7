"""BlockTable: the block tables of the running requests, kept between steps as rows of one numpy array.

Idea: vLLM V1's persistent batch (``vllm/v1/worker/block_table.py``, ``gpu_input_batch.py``): instead of
rebuilding every request's block table from Python lists each step, the runner keeps one preallocated
``[rows, max_blocks]`` int32 array and only writes the blocks a step added. A running request's block table
only grows (``KVCacheManager.allocate_slots`` appends); it is rebuilt from scratch when the request is
(re)admitted, the only moment its blocks can change otherwise (a preemption frees them).
"""

from __future__ import annotations

import numpy as np

from minengine.core.scheduler_output import SchedulerOutput


class BlockTable:
    """Rows of physical block ids, one row per request seen recently, updated incrementally.

    Args:
        max_rows, max_blocks: initial capacity; both grow (doubling) when a step needs more.

    Attributes:
        table: [rows, max_blocks] int32; row ``r`` holds the block ids of the request in that row, in logical
            order; entries past ``num_blocks[r]`` are stale or 0 and must be masked by the reader.
        num_blocks: [rows] int32, valid entries per row.
    """

    def __init__(self, max_rows: int = 64, max_blocks: int = 64):
        self.table = np.zeros((max_rows, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(max_rows, dtype=np.int32)
        self._row: dict[str, int] = {}  # request id -> row
        self._owner: list[str | None] = [None] * max_rows
        # Where the row's last update started writing: a failed step rolled back (``Scheduler.rollback``) can
        # only have changed the blocks that step appended, so the next update re-checks exactly those.
        self._written_from: list[int] = [0] * max_rows
        self._free: list[int] = list(range(max_rows - 1, -1, -1))

    @property
    def num_rows(self) -> int:
        return self.table.shape[0]

    def row_of(self, request_id: str) -> int | None:
        return self._row.get(request_id)

    def update(self, scheduler_output: SchedulerOutput, block_size: int | None = None) -> np.ndarray:
        """Bring the rows of this step's requests up to date; returns their rows ([B] int64, step order).

        ``block_size`` (tokens per block) bounds what must be re-checked: blocks before the one holding a
        request's first new token hold computed K/V and never change while it runs; from that one on, a block
        that held only rejected speculative proposals may have been freed (``KVCacheManager.truncate``) and
        another allocated at the same index since the last update, at the same row length. None re-checks
        every stored block.

        Per request this costs O(1) plus the blocks added since its last step (a decode adds one block every
        ``block_size`` steps). A request admitted this step (new, resumed after preemption, swapped in) or
        without a row gets its whole table written; after a rolled-back step the blocks it had appended are
        compared and rewritten. Rows of preempted requests are released; rows of finished
        requests (which the runner is not told about) are reclaimed when the rows run out.
        """
        for rid in scheduler_output.preempted_ids:
            self._release(rid)
        admitted = set(scheduler_output.admitted_ids)
        scheduled = scheduler_output.scheduled
        width = max((len(s.block_ids) for s in scheduled), default=0)
        if width > self.table.shape[1]:
            self._grow(self.num_rows, width)
        rows = np.empty(len(scheduled), dtype=np.int64)
        step_ids = None
        for i, s in enumerate(scheduled):
            ids = s.block_ids
            row = self._row.get(s.request_id)
            if row is None:
                if not self._free:
                    step_ids = step_ids or {x.request_id for x in scheduled}
                    self._reclaim(step_ids)
                row = self._free.pop()
                self._owner[row] = s.request_id
                self._row[s.request_id] = row
                stored = 0
            elif s.request_id in admitted:
                stored = 0
            else:
                stored = int(self.num_blocks[row])
                # Append-only between admissions, except after a rolled-back step or a speculative rejection:
                # re-check what the last update appended and the blocks from the step's first new token on
                # (usually one or two) and rewrite from there if they changed.
                start = min(self._written_from[row], s.start_pos // block_size if block_size else 0)
                changed = start < stored and ids[start:stored] != self.table[row, start:stored].tolist()
                if len(ids) < stored or changed:
                    stored = min(start, len(ids))
            if len(ids) > stored:
                self.table[row, stored:len(ids)] = ids[stored:]
            self.num_blocks[row] = len(ids)
            self._written_from[row] = stored
            rows[i] = row
        return rows

    def _release(self, request_id: str) -> None:
        row = self._row.pop(request_id, None)
        if row is not None:
            self._owner[row] = None
            self.num_blocks[row] = 0
            self._written_from[row] = 0
            self._free.append(row)

    def _reclaim(self, step_ids: set[str]) -> None:
        """No free row: release every row whose request is not in this step if that frees at least half of
        the rows (amortised O(1) per row; a live request that loses its row gets it rebuilt when next
        scheduled), else double the rows."""
        stale = [owner for owner in self._owner if owner is not None and owner not in step_ids]
        if 2 * len(stale) >= self.num_rows:
            for owner in stale:
                self._release(owner)
        else:
            self._grow(2 * self.num_rows, self.table.shape[1])

    def _grow(self, rows: int, width: int) -> None:
        old_rows, old_width = self.table.shape
        rows, width = max(rows, old_rows), max(width, old_width)
        width = 1 << (width - 1).bit_length()  # a power of two: few regrowths
        table = np.zeros((rows, width), dtype=np.int32)
        table[:old_rows, :old_width] = self.table
        num_blocks = np.zeros(rows, dtype=np.int32)
        num_blocks[:old_rows] = self.num_blocks
        self.table, self.num_blocks = table, num_blocks
        self._owner += [None] * (rows - old_rows)
        self._written_from += [0] * (rows - old_rows)
        self._free += list(range(rows - 1, old_rows - 1, -1))
