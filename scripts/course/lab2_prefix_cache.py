# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 2's page: the prefix cache (the chained block hash, hashing a growing request, the longest cached prefix)."""

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

CELLS = [
    *header(2, "prefix_cache", "The prefix cache", [
        "See the engine name each full block of a prompt by a hash chained on the block before it, and find a new prompt's longest cached prefix.",
        "Write `hash_block`, `extend_block_hashes` and `longest_cached_prefix` yourself, from the skeleton, and grade them.",
        "Run the whole engine on your prefix cache and watch its hits in the dashboard's figures.",
    ], "[chapter 05, prefix caching](05_prefix_caching.ipynb)"),
    md("""
    ## The part: block hashes and the longest cached prefix
    A full block is named by a hash of its tokens **chained on the hash of the block before it**, so equal hashes
    mean equal K/V (attention looks back at every earlier token). A partial last block gets no hash. A new prompt's
    blocks are looked up in order until the first miss, and the block holding the prompt's last token is always
    computed again: its logits give the first output token. Below, the engine's own `hash_block` names the blocks of
    three prompts: a first one, one that shares its first two blocks and one that repeats its first three blocks
    exactly. Each runs on the real engine after the first.
    """),
    code("""
    from minengine.core.kv_cache_manager import hash_block

    BLOCK = 4
    prompts = {"first": prompt_ids((0, 14)), "shares two blocks": prompt_ids((0, 9)) + prompt_ids((100, 6)),
               "repeats three blocks": prompt_ids((0, 12))}


    def chain(tokens):
        \"\"\"Each full block's hash, chained on the block before it (the engine's hash_block).\"\"\"
        hashes, parent = [], None
        for start in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
            parent = hash_block(parent, tokens[start:start + BLOCK])
            hashes.append(parent)
        return hashes


    first = chain(prompts["first"])
    assert len(prompts) == 3 and chain(prompts["repeats three blocks"]) == first[:3], "the third repeats three blocks"
    expected = {}
    for name, tokens in prompts.items():
        hashes = chain(tokens)
        matching = next((i for i, (a, b) in enumerate(zip(hashes, first)) if a != b), min(len(hashes), len(first)))
        expected[name] = min(matching, (len(tokens) - 1) // BLOCK) * BLOCK   # the last token's block is computed again
        row = " ".join(h.hex()[:6] + ("=" if i < matching else " ") for i, h in enumerate(hashes))
        print(f"{name:22} {len(tokens):2} tokens  blocks: {row}  -> {expected[name]} tokens from the cache")
    print("(= : the same hash as the first prompt's block at that position)")

    engine = modelled_engine(block_size=BLOCK, num_kv_blocks=32, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for name, tokens in prompts.items():       # one after the other: each later prompt finds the first one's blocks
        engine.add_request(name, {"prompt_token_ids": tokens}, params)
        run_to_completion(engine)
    cached = {name: m.num_cached_tokens for name, m in engine.request_metrics.items()}
    print("the engine took from its cache:", cached)
    """),
    conclusion("""
    conclude(f"The engine took **{cached['shares two blocks']}** tokens of the second prompt and **{cached['repeats three blocks']}** "
             f"of the third from its cache, as the hash chains say: the third prompt's {len(prompts['repeats three blocks']) // BLOCK} "
             "blocks are all cached, but the block holding its last token is computed again.",
             [("the engine's hits are the chained hashes' longest prefix", cached == {**expected, "first": 0}),
              ("the repeated prompt recomputes its last block", cached["repeats three blocks"] == len(prompts["repeats three blocks"]) - BLOCK)])
    """),
    *your_file("prefix_cache", "You write `hash_block` (a digest of the parent hash and the block's token ids), `extend_block_hashes` (hash the full blocks not hashed yet, not the partial last one) and `longest_cached_prefix` (look the hashes up in order, stop at the first miss, leave the last token to compute)."),
    *grade_it("prefix_cache"),
    *engine_on_your_part(
        "prefix_cache", 'WORKLOADS["prefix_hits"]',
        "the engine's prefix cache names and finds every block with your functions",
        """
        hit_step = max(mine.traces, key=lambda t: max(t.block_ref_counts or [0]))
        titled(viz.block_pool_figure(hit_step), f"Blocks found by your prefix cache, shared at step {hit_step.step}").show()
        titled(viz.latency_cdf_figure(mine.request_metrics), "TTFT and TPOT on your prefix cache").show()
        """,
        "the pool where blocks your lookup found are shared, then the requests' latencies"),
    *summary([
        "A full block's hash is chained on the block before it, so a block of the same tokens at another position gets another hash.",
        "A prompt's cached prefix stops at the first block whose hash is not in the index, and does not cover the prompt's last token (checked: the repeated prompt recomputes its last block).",
        "The grader checks the hash and the lookup case by case, random prompts against the reference, then the whole engine on your functions against transformers.",
    ]),
]
