"""StepTrace: what one engine step did, complete enough to redraw it (block tables, batch, queues)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScheduledChunk:
    """One request's part of a step: ``num_tokens`` tokens from position ``start_pos``.

    Speculative decoding: the last ``num_spec_tokens`` of the ``num_tokens`` were proposals, of which the model
    accepted the first ``num_accepted_tokens`` (the rest were rejected); ``num_tokens - num_spec_tokens`` is 1,
    the decode's own token. Both 0 for every other chunk.
    """

    request_id: str
    num_tokens: int
    start_pos: int
    is_prefill: bool
    sampled: bool
    num_spec_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def num_rejected_tokens(self) -> int:
        return self.num_spec_tokens - self.num_accepted_tokens


@dataclass
class StepTrace:
    """One step, as the course and the dashboard draw it. Times in seconds on the engine clock.

    Block state (``block_tables``, ``block_ref_counts``, ``cached_block_ids``, free counts) is taken after
    scheduling, i.e. what the step's forward pass used. Queue lengths are taken after the step.
    ``block_tables`` etc. are None when the engine runs with ``trace_block_tables=False``.
    Swap preemption: ``num_swapped_out_blocks`` / ``num_swapped_in_blocks`` KV blocks copied to / from the CPU
    swap space before this step's forward, taking ``swap_time_s`` seconds (wall clock, inside the step).
    ``timed_out_ids`` finished with reason "timeout" at the start of the step (they are in ``finished_ids``).
    ``prefix_queried_tokens`` / ``prefix_hit_tokens`` count first admissions only; ``readmission_hit_tokens``
    are the tokens recompute-preempted requests got back from the prefix cache when re-admitted.
    A model with two KV cache groups (``core/hybrid_kv_cache_manager.py``): ``block_tables``,
    ``block_ref_counts`` and ``cached_block_ids`` are the full-attention group's, and ``windowed_block_tables``
    (-1 where the window released a block) and ``windowed_block_ref_counts`` the windowed group's, over its own
    pool of ``num_total_blocks`` blocks; ``num_free_blocks`` is the smaller of the two groups' free counts.
    ``rolled_back``: the step failed (its forward, sampling or detokenizing raised) and was rolled back, so no
    chunk ran and it cost no modelled time; it is recorded because its preemptions stand (``preempted_ids``), and
    every count of preemptions (request metrics, traces, ``summary()``, ``vllm:num_preemptions``) agrees.
    """

    step: int
    start_time: float
    end_time: float
    token_budget: int
    chunks: list[ScheduledChunk]
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_cached_free_blocks: int
    num_total_blocks: int
    preempted_ids: list[str]
    admitted_ids: list[str]
    finished_ids: list[str]
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    block_tables: dict[str, list[int]] | None = None
    block_ref_counts: list[int] | None = None
    cached_block_ids: list[int] | None = None
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0
    swap_time_s: float = 0.0
    timed_out_ids: list[str] = field(default_factory=list)
    readmission_hit_tokens: int = 0
    rolled_back: bool = False
    windowed_block_tables: dict[str, list[int]] | None = None
    windowed_block_ref_counts: list[int] | None = None

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if c.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.is_prefill)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_spec_tokens(self) -> int:
        """Speculative tokens proposed in this step (all requests)."""
        return sum(c.num_spec_tokens for c in self.chunks)

    @property
    def num_accepted_tokens(self) -> int:
        """Speculative tokens accepted in this step (all requests)."""
        return sum(c.num_accepted_tokens for c in self.chunks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (for saving traces or feeding plotting code)."""
        d = dict(self.__dict__)
        d["chunks"] = [c.__dict__.copy() for c in self.chunks]
        return d
