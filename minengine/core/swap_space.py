"""SwapSpace: bookkeeping of the CPU swap space's block ids (the tensors live in ``worker/swap.py``).

Idea: vLLM v0's swap preemption (Kwon et al., SOSP 2023, section 4.5): instead of dropping a preempted
request's KV and recomputing it, copy its blocks to CPU memory and copy them back when it resumes.
"""

from __future__ import annotations


class SwapSpace:
    """Which of the ``num_blocks`` CPU swap blocks are free.

    Blocks released by a swap-in are only reusable from the next step on (``begin_step``): the runner copies
    all of a step's swap-outs before its swap-ins, so a swap-out in the same step must not overwrite a CPU
    block a swap-in still has to read. With ``hold_steps=2`` (async scheduling: the step after a step is
    scheduled before that one commits or rolls back) they are reusable one step later, so a rollback of the
    older open step still finds its swapped-in blocks untouched.
    """

    def __init__(self, num_blocks: int, hold_steps: int = 1):
        if num_blocks < 0:
            raise ValueError(f"swap_space_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out the lowest id first
        self._released: list[int] = []  # released in this step
        self._held: list[list[int]] = []  # released in earlier steps, not yet reusable (oldest first)
        self._hold_steps = hold_steps

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free) - len(self._released) - sum(map(len, self._held))

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` CPU blocks. Raises ``ValueError`` when fewer are free (callers check first)."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} swap blocks: only {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def release(self, block_ids: list[int]) -> None:
        """Give blocks back; they become allocatable at the next ``begin_step``."""
        self._released.extend(block_ids)

    def reclaim(self, block_ids: list[int]) -> None:
        """Take back blocks released earlier in this step (a failed step undoes its swap-ins: their CPU
        copies were only read, so they still hold the KV). Raises ``ValueError`` for a block not released."""
        for block_id in block_ids:
            for released in [self._released, *self._held]:
                if block_id in released:
                    released.remove(block_id)
                    break
            else:
                raise ValueError(f"swap block {block_id} was not released in this step")

    def begin_step(self) -> None:
        """Make the blocks released ``hold_steps`` steps ago allocatable again."""
        self._held.append(self._released)
        self._released = []
        while len(self._held) >= self._hold_steps:
            self._free.extend(reversed(self._held.pop(0)))
