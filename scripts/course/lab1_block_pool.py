# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 1's page: the KV block pool (free queue in LRU order, ref counts, the prefix-cache index)."""

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

CELLS = [
    *header(1, "block_pool", "The KV block pool", [
        "See the engine's real block pool after a workload: its free queue in LRU order, the cached blocks' hashes, the ref counts of shared blocks.",
        "Write `BlockPool` yourself, from the skeleton, and grade it.",
        "Run the whole engine on your pool and watch it in the dashboard's figures.",
    ], "[chapter 02, PagedAttention](02_paged_attention.ipynb) and [chapter 05, prefix caching](05_prefix_caching.ipynb)"),
    md("""
    ## The part: the block pool, drawn from the engine
    The KV cache is cut into fixed-size blocks and the pool owns them all. A block held by several block tables (a
    shared prefix) has a ref count above one; a block at zero is free and waits in the **free queue**, the block freed
    longest ago at its head. A free block keeps its content hash in the **index** (`hash -> block`), so a later
    request with the same prefix can take it back (`touch`) until `get_new_blocks` hands it out again and drops the
    hash (eviction). Below, three requests that start with the same three blocks run together on the real engine, in a
    pool of sixteen blocks; the budget of a step admits them one at a time, so the later ones find the first one's
    blocks cached.
    """),
    code("""
    import copy

    engine = modelled_engine(block_size=4, num_kv_blocks=16, max_num_batched_tokens=16, max_model_len=256)
    system = prompt_ids((0, 12))          # three full blocks every request starts with
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, start in enumerate((40, 60, 80)):
        engine.add_request(f"req{i}", {"prompt_token_ids": system + prompt_ids((start, 6))}, params)
    run_to_completion(engine)
    assert len(engine.request_metrics) == 3 and len(system) == 3 * 4, "three requests, three shared blocks"
    pool = engine.kv_cache_manager.pool   # the engine's own BlockPool (yours, once the lab is installed)

    # The free queue's order, read through the pool's public interface: a copy hands out every free block, head first.
    queue = [b.block_id for b in copy.deepcopy(pool).get_new_blocks(pool.num_free_blocks)]
    hashed = {b.block_id: b.block_hash.hex()[:6] for b in pool.blocks if b.block_hash is not None}
    print("free queue, head (freed longest ago) first; (h ...) = still holds a cached prefix:")
    for row in range(0, len(queue), 4):
        print("  " + " | ".join(f"b{i:<2}" + (f" (h {hashed[i]})" if i in hashed else " " * 11) for i in queue[row:row + 4]))
    print("index, hash -> block:", ", ".join(f"{h} -> b{i}" for i, h in hashed.items()))
    busiest = max(engine.traces, key=lambda t: max(t.block_ref_counts or [0]))
    titled(viz.block_pool_figure(busiest), f"The pool at step {busiest.step}: shared blocks have ref count > 1").show()
    """),
    conclusion("""
    hits = {rid: m.num_cached_tokens for rid, m in engine.request_metrics.items()}
    conclude(f"After the run every one of the {pool.num_blocks} blocks is in the free queue, and **{len(hashed)}** of them still "
             f"hold a cached prefix (the pool counts {pool.num_cached_free_blocks}); at step {busiest.step} a block had ref count "
             f"**{max(busiest.block_ref_counts)}**, and the later requests took {hits['req1']} and {hits['req2']} prompt tokens "
             "from the cache.",
             [("every block is free, each once in the queue", sorted(queue) == list(range(pool.num_blocks))),
              ("the hashed free blocks are the pool's cached free blocks", len(hashed) == pool.num_cached_free_blocks),
              ("the system prompt's blocks were shared", max(busiest.block_ref_counts) > 1),
              ("the later requests hit the system prompt", hits["req1"] == hits["req2"] == len(system))])
    """),
    *your_file("block_pool", "You write `BlockPool`: `__init__`, the free counts, `get_new_blocks` (from the queue's head, evicting a cached hash), `touch`, `free_blocks` (to the tail at ref count zero; a double free is a `RuntimeError`), `cache_full_block`, `ref_counts` and `reset_prefix_cache`. Keep the free queue in a structure that removes a touched block from its middle cheaply (an `OrderedDict` does)."),
    *grade_it("block_pool"),
    *engine_on_your_part(
        "block_pool", 'WORKLOADS["prefix_hits"]',
        "the engine's `KVCacheManager` then takes, shares, frees and evicts every block through your pool",
        """
        hit_step = max(mine.traces, key=lambda t: max(t.block_ref_counts or [0]))
        titled(viz.block_pool_figure(hit_step), f"Your pool at step {hit_step.step}").show()
        titled(viz.kv_usage_figure(mine.traces), "KV blocks in use, step by step, on your pool").show()
        """,
        "the pool at its most shared step, then the blocks in use over the run"),
    *summary([
        "A block's ref count is how many block tables hold it; at zero it joins the free queue's tail, and `get_new_blocks` takes from the head: the least recently freed block is reused first.",
        "A free block keeps its hash until it is handed out again, so a repeated prefix can take it back; handing it out evicts the hash from the index.",
        "The grader checks the contract case by case, random workloads against the reference, then the whole engine on your pool against transformers.",
    ]),
]
