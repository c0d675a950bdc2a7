"""A wrong prefix cache. The bug: hash_block digests the token ids' digits run together with no separator:
[1, 23] and [12, 3] both read "123" and collide.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """sha256(parent hash || the block's token ids as 8-byte integers): equal only for equal blocks with equal
    prefixes before them."""
    h = hashlib.sha256(parent_hash or b"")
    h.update("".join(str(t) for t in token_ids).encode())  # BUG: no separator between the ids
    return h.digest()


def extend_block_hashes(block_hashes: list[bytes], token_ids: Sequence[int], block_size: int) -> None:
    """Append the hash of every full block of ``token_ids`` that ``block_hashes`` does not cover yet."""
    while (len(block_hashes) + 1) * block_size <= len(token_ids):
        i = len(block_hashes)
        parent = block_hashes[-1] if block_hashes else None
        block_hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size]))


def longest_cached_prefix(block_hashes: Sequence[bytes], num_tokens: int, block_size: int,
                          lookup: Callable[[bytes], object | None]) -> list:
    """The cached blocks of the longest cached prefix, leaving at least the last token to compute."""
    max_blocks = (num_tokens - 1) // block_size  # the last token is recomputed: its logits are sampled
    hits = []
    for block_hash in block_hashes[:max_blocks]:
        block = lookup(block_hash)
        if block is None:  # a prefix ends at its first miss: a later block's K/V depends on this one
            break
        hits.append(block)
    return hits
