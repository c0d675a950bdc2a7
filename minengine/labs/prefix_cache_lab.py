"""Lab 2, prefix_cache: the learner writes the chained block hash, the incremental hashing of a request's full
blocks, and the longest-cached-prefix lookup (with the rule that the last token is always computed). The engine's
``KVCacheManager`` then names, indexes and finds every cached block with them."""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from minengine.labs.door import mix_into
from minengine.labs.end_to_end import end_to_end_check
from minengine.labs.grading import Check, LabFailure, expect_equal, hypothesis_settings
from minengine.labs.registry import SKELETONS, LabSpec


def _hashes(m: ModuleType, tokens: list[int], block_size: int) -> list[bytes]:
    hashes: list[bytes] = []
    m.extend_block_hashes(hashes, tokens, block_size)
    return hashes


# Pairs of different blocks a digest must tell apart: each names the shortcut that would make them collide.
DIFFERENT_BLOCKS = {
    "[1, 2, 3, 4] vs [1, 2, 3, 5]": ([1, 2, 3, 4], [1, 2, 3, 5]),
    "[1, 2, 3, 4] vs [4, 3, 2, 1] (order matters)": ([1, 2, 3, 4], [4, 3, 2, 1]),
    "[0, 5] vs [5, 0]": ([0, 5], [5, 0]), "[1, 3] vs [2, 2] (same sum)": ([1, 3], [2, 2]),
    "[256, 0] vs [0, 1] (large ids)": ([256, 0], [0, 1]),
    "[1, 23] vs [12, 3] (the same digits run together: keep the ids apart)": ([1, 23], [12, 3]),
    "[70000, 1] vs [4464, 1] (70000 - 65536 = 4464: an id needs more than 16 bits, vocabularies have ~150k)":
        ([70000, 1], [4464, 1]),
    "[151000] vs [151001] (ids of a 150k vocabulary)": ([151000], [151001]),
}


def check_hash_is_a_digest(m: ModuleType) -> None:
    a, b = m.hash_block(None, [1, 2, 3, 4]), m.hash_block(None, [1, 2, 3, 4])
    if not isinstance(a, bytes):
        raise LabFailure(f"hash_block(None, [1, 2, 3, 4]) must return bytes, got {type(a).__name__} {a!r}")
    expect_equal("hash_block(None, [1, 2, 3, 4]) twice (deterministic)", a, b)
    parent = m.hash_block(None, [9, 9])
    for words, (x, y) in DIFFERENT_BLOCKS.items():
        for shown, p in (("None", None), ("a parent", parent)):
            if m.hash_block(p, x) == m.hash_block(p, y):
                raise LabFailure(f"hash_block({shown}, ...) of different blocks must differ: {words} give the same "
                                 "hash")
    if m.hash_block(b"1", [23]) == m.hash_block(b"12", [3]):
        raise LabFailure("hash_block(b'1', [23]) and hash_block(b'12', [3]) give the same hash: the parent's bytes "
                         "and the token ids run together; keep them apart (e.g. each id as a fixed-width integer, "
                         "struct.pack('<q', id))")


# Run in a fresh interpreter: load the learner's file (not the minengine package: its imports would cost seconds)
# and print the hashes of a first block and of a block chained on it.
_OTHER_PROCESS = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lab_submission", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["lab_submission"] = module
spec.loader.exec_module(module)
first = module.hash_block(None, [1, 2, 3, 4])
print(first.hex(), module.hash_block(first, [5, 6, 7, 8]).hex())
"""


def check_hash_is_the_same_in_another_process(m: ModuleType) -> None:
    import os
    import subprocess
    import sys

    path = getattr(m, "__file__", None)
    if not path:
        raise LabFailure("the prefix_cache submission has no file: hash_block's determinism across processes is "
                         "checked by loading the file in a fresh Python")
    first = m.hash_block(None, [1, 2, 3, 4])
    here = f"{first.hex()} {m.hash_block(first, [5, 6, 7, 8]).hex()}"
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # another salt than this process's
    try:
        done = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, path], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONHASHSEED": seed})
    except subprocess.TimeoutExpired:
        raise LabFailure(f"loading {path} and calling hash_block in a fresh Python took over 60 s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabFailure(f"hash_block in a fresh Python process (PYTHONHASHSEED={seed}) raised: {tail}")
    there = done.stdout.strip()
    if there != here:
        raise LabFailure(f"hash_block(None, [1, 2, 3, 4]) and the block [5, 6, 7, 8] chained on it give other bytes "
                         f"in another Python process (PYTHONHASHSEED={seed}): {here} here, {there} there. A block's "
                         "hash must name its K/V in any process: use hashlib, not Python's hash() (salted per "
                         "process for bytes and str)")


def check_hash_is_chained(m: ModuleType) -> None:
    first, other = m.hash_block(None, [7, 7]), m.hash_block(None, [8, 8])
    if m.hash_block(first, [1, 2]) == m.hash_block(other, [1, 2]):
        raise LabFailure("hash_block(parent, [1, 2]) is the same under two different parents: the hash must chain on "
                         "the parent, or two prompts that differ only in an earlier block would share K/V")
    if m.hash_block(first, [1, 2]) == m.hash_block(None, [1, 2]):
        raise LabFailure("hash_block(parent, [1, 2]) equals hash_block(None, [1, 2]): a block after a first block "
                         "must not look like a first block")


def check_full_blocks_only(m: ModuleType) -> None:
    tokens = list(range(10, 20))
    hashes = _hashes(m, tokens, 4)
    expect_equal("len(block_hashes) after extend_block_hashes([], 10 tokens, block_size=4) (2 full blocks; the "
                 "partial third gets no hash)", 2, len(hashes))
    expect_equal("block_hashes[0] for 10 tokens, block_size=4", m.hash_block(None, tokens[0:4]), hashes[0])
    expect_equal("block_hashes[1] for 10 tokens, block_size=4 (chained on block_hashes[0])",
                 m.hash_block(hashes[0], tokens[4:8]), hashes[1])
    expect_equal("len(block_hashes) for 3 tokens, block_size=4", 0, len(_hashes(m, tokens[:3], 4)))
    expect_equal("len(block_hashes) for exactly 8 tokens, block_size=4", 2, len(_hashes(m, tokens[:8], 4)))


def check_extends_incrementally(m: ModuleType) -> None:
    tokens = list(range(30, 43))
    hashes: list[bytes] = []
    m.extend_block_hashes(hashes, tokens[:6], 4)
    first = list(hashes)
    m.extend_block_hashes(hashes, tokens[:6], 4)
    expect_equal("len(block_hashes) after extend_block_hashes twice with the same 6 tokens, block_size=4 (nothing "
                 "new to hash)", 1, len(hashes))
    if hashes != first:
        raise LabFailure("extend_block_hashes changed a hash already in block_hashes (it may only append)")
    m.extend_block_hashes(hashes, tokens, 4)
    expect_equal("len(block_hashes) grown from 6 to 13 tokens, block_size=4", 3, len(hashes))
    if hashes != _hashes(m, tokens, 4):
        raise LabFailure("block_hashes grown from 6 to 13 tokens (block_size=4) differ from hashing the 13 at once")


class _Cache:
    """A fake index: ``cached`` hashes map to block names; records every lookup."""

    def __init__(self, cached: dict):
        self.cached, self.asked = cached, []

    def __call__(self, block_hash):
        self.asked.append(block_hash)
        return self.cached.get(block_hash)


def check_stops_at_first_miss(m: ModuleType) -> None:
    hashes = [b"h0", b"h1", b"h2", b"h3"]
    got = m.longest_cached_prefix(hashes, 17, 4, _Cache({b"h0": "block 5", b"h2": "block 9", b"h3": "block 1"}))
    expect_equal("longest_cached_prefix with blocks 0, 2, 3 cached and block 1 missing (17 tokens, block_size=4): "
                 "the prefix ends at the first miss", ["block 5"], list(got))
    got = m.longest_cached_prefix(hashes, 17, 4, _Cache({b"h1": "block 9"}))
    expect_equal("longest_cached_prefix with only block 1 cached (a prefix must start at block 0)", [], list(got))


def check_last_token_is_computed(m: ModuleType) -> None:
    hashes = [b"h0", b"h1", b"h2"]
    everything = _Cache({h: f"block of {h.decode()}" for h in hashes})
    cases = [(12, ["block of h0", "block of h1"], "12 tokens = exactly 3 full blocks, all cached: the last block "
                                                   "holds the last token and is computed again"),
             (13, ["block of h0", "block of h1", "block of h2"], "13 tokens, 3 full blocks cached"),
             (9, ["block of h0", "block of h1"], "9 tokens, block_size=4"),
             (8, ["block of h0"], "8 tokens = 2 full blocks"), (4, [], "4 tokens = 1 full block"),
             (1, [], "1 token")]
    for num_tokens, expected, words in cases:
        got = m.longest_cached_prefix(hashes[:max(0, num_tokens // 4)], num_tokens, 4, everything)
        expect_equal(f"longest_cached_prefix, {words}", expected, list(got))


def check_equal_hash_iff_equal_prefix(m: ModuleType) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    tokens = st.lists(st.integers(0, 3), max_size=14)

    @hypothesis_settings(150)
    @given(tokens, tokens, st.integers(1, 4))
    def equal_iff(a, b, block_size):
        ha, hb = _hashes(m, a, block_size), _hashes(m, b, block_size)
        for i in range(min(len(ha), len(hb))):
            same_prefix = a[:(i + 1) * block_size] == b[:(i + 1) * block_size]
            if (ha[i] == hb[i]) != same_prefix:
                raise LabFailure(f"block_size={block_size}, tokens {a} and {b}: block {i}'s hashes are "
                                 f"{'equal' if ha[i] == hb[i] else 'different'} but the prefixes up to that block are "
                                 f"{'equal' if same_prefix else 'different'}")

    equal_iff()


def check_growing_requests(m: ModuleType) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    @hypothesis_settings(100)
    @given(st.lists(st.integers(0, 50), max_size=30), st.lists(st.integers(0, 30), max_size=4), st.integers(1, 5))
    def grows(tokens, cuts, block_size):
        hashes: list[bytes] = []
        for cut in sorted(cuts) + [len(tokens)]:
            m.extend_block_hashes(hashes, tokens[:cut], block_size)
        if hashes != _hashes(m, tokens, block_size):
            raise LabFailure(f"block_hashes of {tokens} (block_size={block_size}) extended at lengths {sorted(cuts)} "
                             f"differ from hashing them at once ({len(hashes)} vs "
                             f"{len(_hashes(m, tokens, block_size))} hashes)")

    grows()


def check_lookup_random(m: ModuleType) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from minengine.labs.solutions.prefix_cache import longest_cached_prefix as reference

    @hypothesis_settings(150)
    @given(st.integers(1, 40), st.integers(1, 6), st.sets(st.integers(0, 12)))
    def lookup(num_tokens, block_size, cached):
        hashes = [f"h{i}".encode() for i in range(num_tokens // block_size)]
        index = {f"h{i}".encode(): f"block {i}" for i in cached}
        expected = reference(hashes, num_tokens, block_size, index.get)
        got = list(m.longest_cached_prefix(hashes, num_tokens, block_size, _Cache(index)))
        expect_equal(f"longest_cached_prefix for {num_tokens} tokens, block_size={block_size}, blocks {sorted(cached)} "
                     "cached", expected, got)

    lookup()


class LearnersPrefixCache:
    """A ``KVCacheManager`` mixin: each request's block hashes and its cached prefix come from the learner's
    ``extend_block_hashes`` and ``longest_cached_prefix`` (``lab_module``); the pool, the staging of a step's blocks
    and the accounting stay the engine's."""

    lab_module: ClassVar[ModuleType]

    def _update_block_hashes(self, request) -> None:
        self.lab_module.extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size)

    def get_computed_blocks(self, request):
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0  # as the engine's own: no hit for a request that asks for prompt logprobs
        self._update_block_hashes(request)
        hits = list(self.lab_module.longest_cached_prefix(
            request.block_hashes, request.num_tokens, self.block_size,
            lambda block_hash: self.pool.get_cached_block(block_hash) or self._staged_by_hash.get(block_hash)))
        return hits, len(hits) * self.block_size


def install(engine, module: ModuleType) -> None:
    """The engine's ``KVCacheManager`` hashes and looks up prefixes with the learner's functions."""
    mix_into(engine.kv_cache_manager, type("LearnersPrefixCache", (LearnersPrefixCache,), {"lab_module": module}))


SPEC = LabSpec(
    name="prefix_cache", title="The prefix cache", order=2, minutes=45,
    teaches="automatic prefix caching: naming K/V by a chained hash of its tokens, finding the longest cached "
            "prefix, and why the last prompt token is always computed again",
    part="the prefix cache's block hashes and lookup (minengine/core/kv_cache_manager.py)",
    skeleton=SKELETONS / "prefix_cache" / "prefix_cache.py", solution="minengine.labs.solutions.prefix_cache",
    checks=[
        Check("hash_block is a deterministic digest of the tokens", "unit", check_hash_is_a_digest),
        Check("hash_block gives the same bytes in another process", "unit",
              check_hash_is_the_same_in_another_process),
        Check("hash_block chains on the parent hash", "unit", check_hash_is_chained),
        Check("extend_block_hashes hashes full blocks only, chained", "unit", check_full_blocks_only),
        Check("extend_block_hashes extends, never repeats", "unit", check_extends_incrementally),
        Check("longest_cached_prefix stops at the first miss", "unit", check_stops_at_first_miss),
        Check("longest_cached_prefix leaves the last token to compute", "unit", check_last_token_is_computed),
        Check("random prompts: equal hash exactly when equal prefix", "property", check_equal_hash_iff_equal_prefix),
        Check("random growth: extending equals hashing at once", "property", check_growing_requests),
        Check("random caches: the longest prefix, capped", "property", check_lookup_random),
        Check("the engine on your prefix cache matches transformers: prefix hits, evictions", "end_to_end",
              end_to_end_check("prefix_cache", ["prefix_hits", "evictions"])),
    ],
    install=install,
)
