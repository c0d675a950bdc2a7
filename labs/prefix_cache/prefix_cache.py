"""Lab 2: the prefix cache. Write how the engine names a block by its content, and how it finds the longest
prefix of a new prompt whose K/V is already in the cache.

A full block of ``block_size`` tokens gets a hash that depends on its tokens AND on every token before it (the
hash of the block before it, chained):

    tokens   [ The cat sat | on the mat | and then ... ]
    hashes   h0 = H(None, "The cat sat")   h1 = H(h0, "on the mat")   (the partial last block: no hash yet)

Two prompts share ``h1`` only if they share both blocks, so equal hash means equal K/V. A new prompt's blocks
are looked up in order; the first miss ends the hit (the blocks after it were computed after different tokens).
At least the prompt's LAST token is always computed again, even when every block is cached: the step needs its
logits to sample the first output token.

Grade: ``python -m minengine lab grade prefix_cache labs/prefix_cache/prefix_cache.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """The hash of one full block: a digest of ``parent_hash`` (the hash of the block before it; None for the
    first block) and ``token_ids`` (the block's ``block_size`` token ids, in order).

    Must be deterministic, in every process (the grader runs it in a second Python with another
    ``PYTHONHASHSEED``), and different whenever the tokens or the parent differ: ids are up to ~150k (more than 16
    bits), ``[1, 23]`` is not ``[12, 3]``, and the parent's bytes must not run into the tokens'. Use ``hashlib``
    (Python's ``hash`` of bytes is salted per process).
    """
    raise NotImplementedError("implement hash_block: hashlib.sha256 over the parent hash and the token ids")


def extend_block_hashes(block_hashes: list[bytes], token_ids: Sequence[int], block_size: int) -> None:
    """Append to ``block_hashes`` the hash of every FULL block of ``token_ids`` it does not cover yet.

    ``block_hashes[i]`` is the hash of ``token_ids[i * block_size:(i + 1) * block_size]`` chained on
    ``block_hashes[i - 1]``. The list grows as a request's tokens grow (the engine calls this again after each
    step): hashes already there are kept, a partial last block gets no hash.
    """
    raise NotImplementedError("implement extend_block_hashes: hash blocks len(block_hashes), ... while full")


def longest_cached_prefix(block_hashes: Sequence[bytes], num_tokens: int, block_size: int,
                          lookup: Callable[[bytes], object | None]) -> list:
    """The cached blocks of the longest cached prefix of a request with ``num_tokens`` known tokens.

    Args:
        block_hashes: the request's block hashes (``extend_block_hashes``), first block first.
        num_tokens: the request's known tokens (prompt, and outputs after a preemption).
        block_size: tokens per block.
        lookup: ``lookup(hash)`` is the cached block with that hash, or None.

    Returns:
        the blocks ``lookup`` returned for ``block_hashes[0], block_hashes[1], ...``, up to (not including) the
        first miss, and never the block that holds the last known token: that token is always computed again.
    """
    raise NotImplementedError("implement longest_cached_prefix: look blocks up in order; stop at a miss and before "
                              "the block holding the last token")
