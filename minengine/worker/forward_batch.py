"""ForwardBatch: one step flattened into the tensors the model forward needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minengine.core.scheduler_output import SchedulerOutput


@dataclass
class ForwardBatch:
    """A step's tokens, flattened over requests (no padding), with the attention metadata.

    T = total new tokens of the step, B = scheduled requests, S = requests that sample this step.

    Attributes:
        input_ids: [T] int64, the new tokens, request after request.
        positions: [T] int64, each token's position in its own request.
        slot_mapping: [T] int64, ``block_id * block_size + position % block_size``: where its K/V is written.
        block_tables: [B, max_blocks] int32, physical block ids per request, padded with 0 (never read).
        query_start_loc: [B + 1] int32, prefix sums of the new tokens per request.
        seq_lens: [B] int32, tokens with K/V in the cache after this step (context + new).
        logits_indices: [S] int64, rows of the last new token of each sampling request; only these rows go
            through the LM head, so intermediate prefill chunks cost no logits.
        block_tables_list, query_start_loc_list, seq_lens_list: the same as Python lists, for the CPU
            reference attention (no device sync).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    logits_indices: torch.Tensor
    block_tables_list: list[list[int]]
    query_start_loc_list: list[int]
    seq_lens_list: list[int]

    @classmethod
    def build(cls, scheduler_output: SchedulerOutput, block_size: int, device: torch.device) -> ForwardBatch:
        input_ids, positions, slots = [], [], []
        block_tables, starts, seq_lens, logits_indices = [], [0], [], []
        for s in scheduler_output.scheduled:
            input_ids.extend(s.token_ids)
            pos = range(s.start_pos, s.seq_len)
            positions.extend(pos)
            slots.extend(s.block_ids[p // block_size] * block_size + p % block_size for p in pos)
            block_tables.append(s.block_ids)
            starts.append(starts[-1] + s.num_new_tokens)
            seq_lens.append(s.seq_len)
            if s.sample:
                logits_indices.append(starts[-1] - 1)
        width = max(len(b) for b in block_tables)
        padded = [b + [0] * (width - len(b)) for b in block_tables]

        def t(x, dtype):
            return torch.tensor(x, dtype=dtype, device=device)

        return cls(
            input_ids=t(input_ids, torch.long), positions=t(positions, torch.long), slot_mapping=t(slots, torch.long),
            block_tables=t(padded, torch.int32), query_start_loc=t(starts, torch.int32),
            seq_lens=t(seq_lens, torch.int32), logits_indices=t(logits_indices, torch.long),
            block_tables_list=block_tables, query_start_loc_list=starts, seq_lens_list=seq_lens,
        )
