"""Lab 1, block_pool: the learner writes ``BlockPool`` (free queue in LRU order, ref counts, the prefix-cache
index). The engine's ``KVCacheManager`` then allocates, shares, frees and evicts every KV block through it."""

from __future__ import annotations

from types import ModuleType

from minengine.labs.end_to_end import end_to_end_check
from minengine.labs.grading import Check, LabFailure, expect_equal, expect_raises, hypothesis_settings
from minengine.labs.registry import SKELETONS, LabSpec


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def _h(i: int) -> bytes:
    return f"hash-{i}".encode()


def check_new_pool(m: ModuleType) -> None:
    pool = m.BlockPool(4)
    expect_equal("BlockPool(4).blocks' ids", [0, 1, 2, 3], ids(pool.blocks))
    expect_equal("BlockPool(4).num_free_blocks", 4, pool.num_free_blocks)
    expect_equal("BlockPool(4).num_cached_free_blocks", 0, pool.num_cached_free_blocks)
    expect_equal("BlockPool(4).ref_counts()", [0, 0, 0, 0], pool.ref_counts())
    expect_equal("is_free of each block of a new pool", [True] * 4, [pool.is_free(b) for b in pool.blocks])
    expect_raises(ValueError, "BlockPool(0)", lambda: m.BlockPool(0))


def check_takes_in_order(m: ModuleType) -> None:
    pool = m.BlockPool(5)
    first = pool.get_new_blocks(2)
    expect_equal("get_new_blocks(2) on a new pool of 5 (block ids, head of the free queue first)", [0, 1], ids(first))
    expect_equal("ref counts after get_new_blocks(2)", [1, 1, 0, 0, 0], pool.ref_counts())
    expect_equal("then get_new_blocks(3)", [2, 3, 4], ids(pool.get_new_blocks(3)))
    expect_equal("num_free_blocks once all 5 are taken", 0, pool.num_free_blocks)
    expect_equal("is_free of a taken block", False, pool.is_free(first[0]))


def check_last_block(m: ModuleType) -> None:
    pool = m.BlockPool(3)
    expect_raises(ValueError, "get_new_blocks(4) with 3 free blocks", lambda: pool.get_new_blocks(4))
    expect_equal("num_free_blocks after a refused get_new_blocks(4) (nothing may be taken)", 3, pool.num_free_blocks)
    expect_equal("get_new_blocks(3) with exactly 3 free blocks (the last block too)", [0, 1, 2],
                 ids(pool.get_new_blocks(3)))
    expect_raises(ValueError, "get_new_blocks(1) with no free block", lambda: pool.get_new_blocks(1))


def check_lru_reuse(m: ModuleType) -> None:
    pool = m.BlockPool(4)
    b = pool.get_new_blocks(4)
    pool.free_blocks([b[2], b[0]])
    expect_equal("num_free_blocks after freeing 2 of 4 taken blocks", 2, pool.num_free_blocks)
    expect_equal("ref counts after freeing blocks 2 and 0", [0, 1, 0, 1], pool.ref_counts())
    pool.free_blocks([b[3]])
    pool.free_blocks([b[1]])
    expect_equal("get_new_blocks(4) after freeing blocks 2, 0, 3, 1 in that order (least recently freed first)",
                 [2, 0, 3, 1], ids(pool.get_new_blocks(4)))


def check_shared_block(m: ModuleType) -> None:
    pool = m.BlockPool(3)
    [shared] = pool.get_new_blocks(1)
    pool.touch([shared])
    expect_equal("ref_cnt of a block taken once and touched once", 2, shared.ref_cnt)
    pool.free_blocks([shared])
    expect_equal("ref_cnt of a block held twice, freed once", 1, shared.ref_cnt)
    expect_equal("is_free of a block still held by one table", False, pool.is_free(shared))
    expect_equal("get_new_blocks(2) while block 0 is still held (it must not be handed out)", [1, 2],
                 ids(pool.get_new_blocks(2)))
    pool.free_blocks([shared])
    expect_equal("ref_cnt of a shared block after its last reference is freed", 0, shared.ref_cnt)
    expect_equal("is_free of a block whose last reference is freed", True, pool.is_free(shared))


def check_double_free(m: ModuleType) -> None:
    pool = m.BlockPool(2)
    [block] = pool.get_new_blocks(1)
    pool.free_blocks([block])
    expect_raises(RuntimeError, "free_blocks of a block whose ref count is already 0",
                  lambda: pool.free_blocks([block]))
    expect_equal("ref_cnt after a refused second free (never negative)", 0, block.ref_cnt)
    expect_equal("num_free_blocks after a refused second free (a block is queued once)", 2, pool.num_free_blocks)


def check_cache_index(m: ModuleType) -> None:
    pool = m.BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_block(a, _h(1))
    if pool.get_cached_block(_h(1)) is not a:
        raise LabFailure("cache_full_block(block 0, h1) then get_cached_block(h1): expected block 0, got "
                         f"{pool.get_cached_block(_h(1))!r}")
    expect_equal("block_hash of block 0 after cache_full_block(block 0, h1)", _h(1), a.block_hash)
    pool.cache_full_block(b, _h(1))
    expect_equal("get_cached_block(h1) after a second block was offered under h1 (the first copy stays)", 0,
                 getattr(pool.get_cached_block(_h(1)), "block_id", None))
    expect_equal("block_hash of the second block offered under an indexed hash", None, b.block_hash)
    pool.cache_full_block(a, _h(2))
    expect_equal("block_hash of block 0 offered again under h2 (a block keeps its first hash)", _h(1), a.block_hash)
    expect_equal("get_cached_block(h2) (never indexed)", None, pool.get_cached_block(_h(2)))


def check_touch_revives(m: ModuleType) -> None:
    pool = m.BlockPool(3)
    a, _, _ = pool.get_new_blocks(3)
    pool.cache_full_block(a, _h(1))
    pool.free_blocks([a])
    expect_equal("num_free_blocks with one free block, which keeps its hash (a cached free block is free: "
                 "get_new_blocks may hand it out)", 1, pool.num_free_blocks)
    expect_equal("num_cached_free_blocks after freeing a cached block", 1, pool.num_cached_free_blocks)
    expect_equal("get_cached_block(h1) of a freed cached block (still a hit until evicted)", 0,
                 getattr(pool.get_cached_block(_h(1)), "block_id", None))
    pool.touch([a])
    expect_equal("ref_cnt of a free cached block after touch", 1, a.ref_cnt)
    expect_equal("is_free of a free cached block after touch (in use again)", False, pool.is_free(a))
    expect_equal("num_free_blocks after touch took the only free block back", 0, pool.num_free_blocks)
    expect_equal("num_cached_free_blocks after touch", 0, pool.num_cached_free_blocks)
    expect_raises(ValueError, "get_new_blocks(1) when the only free block was touched back into use",
                  lambda: pool.get_new_blocks(1))
    pool = m.BlockPool(2)
    [b] = pool.get_new_blocks(1)
    pool.free_blocks([b])
    pool.touch([b])  # no hash: touch's contract is about any block at ref count 0, cached or not
    expect_equal("is_free of a free block WITHOUT a hash after touch (any block at ref count 0 leaves the free "
                 "queue when touched, cached or not)", False, pool.is_free(b))
    expect_equal("num_free_blocks of a pool of 2 after block 0 (no hash) was freed and touched", 1,
                 pool.num_free_blocks)
    expect_equal("get_new_blocks(1) while the touched block 0 is held (it must not be handed out)", [1],
                 ids(pool.get_new_blocks(1)))


def check_eviction(m: ModuleType) -> None:
    pool = m.BlockPool(2)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_block(a, _h(1))
    pool.free_blocks([a, b])
    expect_equal("get_new_blocks(1) when cached block 0 was freed before block 1", [0], ids(pool.get_new_blocks(1)))
    expect_equal("block_hash of a cached block handed out again (evicted)", None, a.block_hash)
    expect_equal("get_cached_block(h1) after its block was handed out again (evicted: a hit would read "
                 "overwritten K/V)", None, pool.get_cached_block(_h(1)))
    expect_equal("num_cached_free_blocks after the eviction", 0, pool.num_cached_free_blocks)


def check_cached_free_count(m: ModuleType) -> None:
    pool = m.BlockPool(4)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_block(blocks[0], _h(1))
    pool.cache_full_block(blocks[1], _h(2))
    expect_equal("num_cached_free_blocks while the cached blocks are in use", 0, pool.num_cached_free_blocks)
    pool.free_blocks(blocks)
    expect_equal("num_cached_free_blocks after freeing 2 cached and 2 uncached blocks", 2, pool.num_cached_free_blocks)
    pool.touch([blocks[0]])
    expect_equal("num_cached_free_blocks after touching one of them", 1, pool.num_cached_free_blocks)
    expect_equal("get_new_blocks(3) (block 0 is held again; blocks 1, 2, 3 free in that order)", [1, 2, 3],
                 ids(pool.get_new_blocks(3)))
    expect_equal("num_cached_free_blocks after block 1 (cached) was handed out", 0, pool.num_cached_free_blocks)


def check_reset(m: ModuleType) -> None:
    pool = m.BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_block(a, _h(1))
    pool.cache_full_block(b, _h(2))
    pool.free_blocks([b])
    pool.reset_prefix_cache()
    expect_equal("get_cached_block(h1), get_cached_block(h2) after reset_prefix_cache", [None, None],
                 [pool.get_cached_block(_h(1)), pool.get_cached_block(_h(2))])
    expect_equal("block_hash of blocks 0 and 1 after reset_prefix_cache", [None, None], [a.block_hash, b.block_hash])
    expect_equal("num_cached_free_blocks after reset_prefix_cache", 0, pool.num_cached_free_blocks)
    expect_equal("ref counts after reset_prefix_cache (unchanged)", [1, 0, 0], pool.ref_counts())


NUM_HASHES = 3


def _observe(pool) -> dict:
    """Everything the engine can see of a pool."""
    return {
        "ref_counts()": list(pool.ref_counts()),
        "num_free_blocks": pool.num_free_blocks,
        "num_cached_free_blocks": pool.num_cached_free_blocks,
        "is_free of each block": [pool.is_free(b) for b in pool.blocks],
        f"get_cached_block(h0..h{NUM_HASHES - 1}) ids": [getattr(pool.get_cached_block(_h(h)), "block_id", None)
                                         for h in range(NUM_HASHES)],
        "block_hash of each block": [b.block_hash for b in pool.blocks],
    }


def _check_invariants(pool, num_blocks: int, where: str) -> None:
    refs = list(pool.ref_counts())
    if any(r < 0 for r in refs):
        raise LabFailure(f"{where}: a ref count went negative: ref_counts() = {refs}")
    held = sum(1 for r in refs if r > 0)
    if held + pool.num_free_blocks != num_blocks:
        raise LabFailure(f"{where}: blocks leaked or counted twice: {held} blocks held + num_free_blocks "
                         f"{pool.num_free_blocks} != {num_blocks} blocks")


def _apply(op: tuple, ref, pool, holders: list[list[int]]) -> None:
    """Apply one operation to the reference pool and the learner's, the same way (holders: the block tables)."""
    kind = op[0]
    if kind == "alloc":
        if op[1] > ref.num_free_blocks:
            expect_raises(ValueError, f"get_new_blocks({op[1]}) with {ref.num_free_blocks} free blocks",
                          lambda: pool.get_new_blocks(op[1]))
            return
        expected, got = ids(ref.get_new_blocks(op[1])), ids(pool.get_new_blocks(op[1]))
        expect_equal(f"get_new_blocks({op[1]})", expected, got)
        holders.append(expected)
    elif kind == "free" and holders:
        table = holders.pop(op[1] % len(holders))
        ref.free_blocks([ref.blocks[i] for i in reversed(table)])
        pool.free_blocks([pool.blocks[i] for i in reversed(table)])
    elif kind == "hit":
        block = ref.get_cached_block(_h(op[1]))
        if block is not None:
            ref.touch([block])
            pool.touch([pool.blocks[block.block_id]])
            holders.append([block.block_id])
    elif kind == "cache" and holders and holders[op[1] % len(holders)]:
        table = holders[op[1] % len(holders)]
        block_id = table[op[3] % len(table)]
        ref.cache_full_block(ref.blocks[block_id], _h(op[2]))
        pool.cache_full_block(pool.blocks[block_id], _h(op[2]))
    elif kind == "reset":
        ref.reset_prefix_cache()
        pool.reset_prefix_cache()


def _describe(op: tuple) -> str:
    words = {"alloc": "get_new_blocks({1})", "free": "free table #{1}", "hit": "touch the block cached under h{1}",
             "cache": "cache_full_block(block #{3} of table #{1}, h{2})", "reset": "reset_prefix_cache()"}
    return words[op[0]].format(*op)


def run_operations(m: ModuleType, num_blocks: int, ops: list[tuple]) -> None:
    """Run ``ops`` on the learner's pool and the reference pool; after each, both must look the same and keep the
    invariants; at the end, freeing every table must leave every block free."""
    from minengine.labs.solutions.block_pool import BlockPool as Reference

    ref, pool, holders = Reference(num_blocks), m.BlockPool(num_blocks), []
    done: list[str] = []
    for op in ops:
        done.append(_describe(op))
        where = f"pool of {num_blocks} blocks, after [{'; '.join(done)}]"
        try:
            _apply(op, ref, pool, holders)
        except LabFailure as failure:
            raise LabFailure(f"{where}: {failure}") from None
        _check_invariants(pool, num_blocks, where)
        expected, got = _observe(ref), _observe(pool)
        for key in expected:
            if expected[key] != got[key]:
                raise LabFailure(f"{where}: {key}: expected {expected[key]}, got {got[key]}")
    for table in holders:
        pool.free_blocks([pool.blocks[i] for i in reversed(table)])
    if pool.num_free_blocks != num_blocks or any(pool.ref_counts()):
        raise LabFailure(f"pool of {num_blocks} blocks, after [{'; '.join(done)}] and freeing every table: "
                         f"expected every block free, got num_free_blocks {pool.num_free_blocks}, "
                         f"ref_counts() {list(pool.ref_counts())}")


# Operation kinds, repeated to weigh them: hits and caching often enough to share and revive blocks, resets rarely.
KINDS = ("alloc", "alloc", "free", "free", "hit", "hit", "hit", "cache", "cache", "cache", "reset")


def _op(kind: str, a: int, b: int, c: int) -> tuple:
    """An operation: ("alloc", n), ("free", table), ("hit", hash), ("cache", table, hash, position), ("reset",)."""
    return {"alloc": (kind, a % 4), "free": (kind, a), "hit": (kind, b), "cache": (kind, a, b, c),
            "reset": (kind,)}[kind]


def check_random_workloads(m: ModuleType) -> None:
    from hypothesis import example, given
    from hypothesis import strategies as st

    op = st.builds(_op, st.sampled_from(KINDS), st.integers(0, 7), st.integers(0, NUM_HASHES - 1), st.integers(0, 3))

    @hypothesis_settings(100)
    @given(st.integers(1, 6), st.lists(op, max_size=24))
    @example(3, [("alloc", 1), ("cache", 0, 1, 0), ("hit", 1), ("free", 0), ("free", 0)])  # shared, freed twice
    @example(2, [("alloc", 2), ("cache", 0, 0, 0), ("free", 0), ("hit", 0), ("alloc", 1)])  # revived, then allocate
    def random_workload(num_blocks, ops):
        run_operations(m, num_blocks, ops)

    random_workload()


def install(engine, module: ModuleType) -> None:
    """The engine's ``KVCacheManager`` takes every block from the learner's pool (built empty, before any request)."""
    engine.kv_cache_manager.pool = module.BlockPool(engine.num_kv_blocks)


SPEC = LabSpec(
    name="block_pool", title="The KV block pool", order=1, minutes=60,
    teaches="paged KV memory: a free list in LRU order, ref counts for shared prefix blocks, eviction of cached "
            "blocks, and the invariants (no leak, no negative count) that keep a server alive",
    part="the KV block pool (minengine/core/block_pool.py)",
    skeleton=SKELETONS / "block_pool" / "block_pool.py", solution="minengine.labs.solutions.block_pool",
    checks=[
        Check("a new pool: every block free, ids in order", "unit", check_new_pool),
        Check("get_new_blocks takes the free queue's head, ref count 1", "unit", check_takes_in_order),
        Check("the last free block can be taken; one more is a ValueError", "unit", check_last_block),
        Check("freed blocks are reused least recently freed first", "unit", check_lru_reuse),
        Check("a shared block stays held until its last reference is freed", "unit", check_shared_block),
        Check("a double free is a RuntimeError, ref counts never negative", "unit", check_double_free),
        Check("cache_full_block indexes a block; the first copy stays", "unit", check_cache_index),
        Check("touch takes a free block (cached or not) back into use", "unit", check_touch_revives),
        Check("handing a cached block out again evicts its hash", "unit", check_eviction),
        Check("num_cached_free_blocks counts free blocks with a hash", "unit", check_cached_free_count),
        Check("reset_prefix_cache forgets every hash", "unit", check_reset),
        Check("random workloads: same as the reference pool, no leak", "property", check_random_workloads),
        Check("the engine on your pool matches transformers: prefix hits, evictions", "end_to_end",
              end_to_end_check("block_pool", ["prefix_hits", "evictions"])),
        Check("the engine on your pool matches transformers: preemption", "end_to_end",
              end_to_end_check("block_pool", ["preemption"])),
    ],
    install=install,
)
