# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 5: prefix caching: hashing full blocks, ref counts, LRU reuse, multi-turn chat, hit rate vs TTFT."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(5, "Prefix caching", [
        "Explain how full KV blocks are identified by a chained hash, shared through ref counts, and evicted in LRU order.",
        "Watch several requests share the physical blocks of a common system prompt.",
        "Measure prefix-cache hits and TTFT on multi-turn chat (MT-Bench two-turn questions) with caching on and off.",
        "Measure TTFT against the fraction of a prompt that is shared.",
    ], ["vLLM docs, *Automatic Prefix Caching* design page", "Zheng et al., *SGLang: Efficient Execution of Structured Language Model Programs* (RadixAttention), NeurIPS 2024",
        "Zheng et al., *Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena*, NeurIPS 2023",
        "Qin et al., *Mooncake: Trading More Storage for Less Computation*, FAST 2025"]),
    code(SETUP + "import hashlib\nimport json\n\nfrom minengine.workloads import SHAKESPEARE_OPENINGS, find_data_dir\n"),
    md("""
    ## Toy: name a block by everything before it
    A full block's K/V depends on its own tokens **and all tokens before it** (attention looks back). So a block is
    named by a chained hash: `hash(parent_hash, tokens of this block)`. Equal hashes then mean equal K/V, and a new
    request can take a cached block instead of recomputing it. A partially filled last block is never cached.
    """),
    code("""
    def block_hashes(tokens, block_size=4):
        hashes, parent = [], b""
        for i in range(0, len(tokens) - len(tokens) % block_size, block_size):   # full blocks only
            parent = hashlib.sha256(parent + bytes(tokens[i:i + block_size])).digest()
            hashes.append(parent.hex()[:8])
        return hashes


    system = [1, 2, 3, 4, 5, 6, 7, 8]
    print("A:", block_hashes(system + [10, 11, 12, 13, 14]))
    print("B:", block_hashes(system + [20, 21, 22, 23]))
    print("C:", block_hashes([9] + system))          # same tokens, shifted: no block matches
    """),
    md("""
    The engine does the same in `minengine/core/kv_cache_manager.py` (`hash_block`), keeps `hash -> block` in the
    `BlockPool`, and counts in `ref_cnt` how many block tables hold each block. A finished request drops its
    references; a block at ref count 0 keeps its hash and joins the free queue's tail, so it can still be hit until the
    pool needs it (least recently used first). SGLang's RadixAttention keeps the same information as a radix tree.

    ## Shared system prompt on the real engine
    Four requests start with the same system prompt. The first computes it; the others hit its blocks.
    """),
    code("""
    engine = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, num_kv_blocks=64, max_num_batched_tokens=512,
                                   enable_prefix_caching=True, trace_block_tables=True)
    tok = engine.get_tokenizer()
    system_prompt = "You are a helpful assistant who answers in the style of Shakespeare.\\n" * 2
    for i, question in enumerate(SHAKESPEARE_OPENINGS[:4]):
        engine.add_request(f"user-{i}", system_prompt + question, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    run_to_completion(engine)
    busiest = max(engine.traces, key=lambda t: max(t.block_ref_counts or [0]))
    viz.block_pool_figure(busiest).show()
    system_blocks = len(tok(system_prompt)["input_ids"]) // 16
    print({rid: m.num_cached_tokens for rid, m in engine.request_metrics.items()}, "cached prompt tokens per request")
    show(f"The system prompt fills {system_blocks} full blocks. At step {busiest.step} the most shared block had ref count "
         f"**{max(busiest.block_ref_counts)}**; prefix hits over the run: {engine.summary().prefix_hit_tokens} tokens.")
    """),
    md("""
    ## Multi-turn chat: MT-Bench
    MT-Bench has 80 questions with two turns. A chat client sends turn 2 as *turn 1 + the model's answer + the new
    question*, so the whole first turn is a prefix the engine has just computed. We serve turn 1, then turn 2, with
    prefix caching on and off (built-in two-turn examples when `../shared/data` is absent).
    """),
    code("""
    data = find_data_dir()
    mt_path = data / "prompts" / "mt_bench_question.jsonl" if data else None
    if mt_path is not None and mt_path.exists():
        conversations = [json.loads(line)["turns"] for line in mt_path.read_text().splitlines() if line.strip()]
    else:
        conversations = [[o, "Now say it again, but shorter."] for o in SHAKESPEARE_OPENINGS]
    conversations = [[a[:pick(600, 200)], b[:200]] for a, b in conversations[: pick(16, 6)]]


    def chat(enable_prefix_caching, num_kv_blocks=pick(512, 256), flood=0):
        \"\"\"Serve turn 1 of every conversation, optionally `flood` unrelated requests, then every turn 2.\"\"\"
        eng = LLMEngine.from_config(model=COURSE_MODEL, enable_prefix_caching=enable_prefix_caching, num_kv_blocks=num_kv_blocks,
                                    max_model_len=1024, max_num_batched_tokens=512, trace_block_tables=False)
        t = eng.get_tokenizer()
        params = SamplingParams(temperature=0.0, max_tokens=pick(32, 12), ignore_eos=True)
        turn1 = {f"c{i}-t1": t(a)["input_ids"] for i, (a, _) in enumerate(conversations)}
        for rid, ids in turn1.items():
            eng.add_request(rid, {"prompt_token_ids": ids}, params)
        answers = {rid: out.outputs[0].token_ids for rid, out in run_to_completion(eng).items()}
        for j in range(flood):
            eng.add_request(f"flood-{j}", {"prompt_token_ids": [(j * 31 + k) % 2000 + 3 for k in range(200)]}, params)
        run_to_completion(eng)
        hits_before = sum(tr.prefix_hit_tokens for tr in eng.traces)
        for i, (_, b) in enumerate(conversations):
            ids = turn1[f"c{i}-t1"] + answers[f"c{i}-t1"] + t("\\n" + b)["input_ids"]
            eng.add_request(f"c{i}-t2", {"prompt_token_ids": ids}, params)
        run_to_completion(eng)
        turn2 = {rid: m for rid, m in eng.request_metrics.items() if rid.endswith("-t2")}
        prompt_tokens = sum(m.num_prompt_tokens for m in turn2.values())
        hit_rate = sum(m.num_cached_tokens for m in turn2.values()) / prompt_tokens
        ttfts = sorted(m.ttft for m in turn2.values())
        return eng, hit_rate, ttfts[len(ttfts) // 2]


    chat_on, hit_on, ttft_on = chat(True)
    chat_off, hit_off, ttft_off = chat(False)
    show(f"Turn 2 of {len(conversations)} conversations: with prefix caching **{hit_on:.0%}** of the prompt tokens came from "
         f"the cache and the median TTFT was **{ttft_on * 1000:.0f} ms**; without it, {hit_off:.0%} and {ttft_off * 1000:.0f} ms.")
    """),
    code("""
    viz.latency_cdf_figure({k: v for k, v in chat_on.request_metrics.items() if k.endswith("-t2")}).update_layout(title="Turn 2 with prefix caching").show()
    viz.latency_cdf_figure({k: v for k, v in chat_off.request_metrics.items() if k.endswith("-t2")}).update_layout(title="Turn 2 without prefix caching").show()
    """),
    md("""
    ### How much could a real service reuse?
    The Mooncake trace (Qin et al., FAST'25) publishes, for each request, ids of its 512-token prompt blocks; equal ids
    at the same leading positions are reusable prefixes. With an infinite cache, a block hits when it and every block
    before it in that request were seen before:
    """),
    code("""
    mooncake = data / "traces" / "mooncake_fast25" / "synthetic_trace.jsonl" if data else None
    if mooncake is not None and mooncake.exists():
        seen, hits, total = set(), 0, 0
        for line in mooncake.read_text().splitlines()[: pick(None, 1000)]:
            key, prefix_hit = 0, True
            for block_id in json.loads(line)["hash_ids"]:
                key = hash((key, block_id))          # chained: names the block and everything before it
                prefix_hit = prefix_hit and key in seen
                hits += prefix_hit
                total += 1
                seen.add(key)
        show(f"Mooncake trace: **{hits / total:.1%}** of {total:,} prompt blocks are prefix hits with an infinite cache.")
    else:
        print("Mooncake trace not found (../shared/data absent): skipped.")
    """),
    md("""
    ## LRU reuse under memory pressure
    Cached blocks live only in *free* memory. Between turn 1 and turn 2, other users' requests take blocks from the
    front of the free queue (least recently used first), evicting cached prefixes. Move the sliders: fewer KV blocks
    or more unrelated traffic in between means fewer turn-2 hits.
    """),
    code("""
    import ipywidgets as widgets


    def lru(num_kv_blocks=pick(512, 256), flood=8):
        _, hit, ttft = chat(True, num_kv_blocks=num_kv_blocks, flood=flood)
        print(f"{num_kv_blocks} KV blocks, {flood} unrelated requests in between: turn-2 hit rate {hit:.0%}, median TTFT {ttft * 1000:.0f} ms")


    widgets.interact_manual(lru, num_kv_blocks=widgets.IntSlider(value=pick(512, 256), min=64, max=1024, step=32),
                            flood=widgets.IntSlider(value=8, min=0, max=32))
    """),
    md("""
    ## Hit rate vs TTFT
    Eight requests whose prompts share the first `f` of their tokens (the rest differs); one goes first and fills the cache.
    """),
    code("""
    PROMPT = pick(512, 256)


    def shared_fraction_run(fraction):
        eng = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=1024, trace_block_tables=False)
        shared = int(PROMPT * fraction)
        arrivals = []
        for i in range(pick(8, 5)):
            ids = [(5 * k) % 2000 + 3 for k in range(shared)] + [(7 * k + 97 * (i + 1)) % 2000 + 3 for k in range(PROMPT - shared)]
            arrivals.append((0 if i == 0 else 2, f"r{i}", {"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=2)))
        run_with_arrivals(eng, arrivals)
        later = [m for rid, m in eng.request_metrics.items() if rid != "r0"]
        return (sum(m.num_cached_tokens for m in later) / sum(m.num_prompt_tokens for m in later),
                sum(m.ttft for m in later) / len(later))


    fractions = pick([0.0, 0.25, 0.5, 0.75, 0.95], [0.0, 0.5, 0.95])
    results = [shared_fraction_run(f) for f in fractions]
    fig = go.Figure(go.Scatter(x=[100 * h for h, _ in results], y=[1000 * t for _, t in results], mode="lines+markers",
                               text=[f"shared {f:.0%}" for f in fractions]))
    fig.update_layout(title=f"{PROMPT}-token prompts: prefix-cache hit rate vs TTFT", xaxis_title="hit rate (% of prompt tokens)",
                      yaxis_title="mean TTFT of the later requests (ms)")
    fig.show()
    """),
    *exercise(1, """
        `block_size = 16`. A 100-token prompt whose first 70 tokens equal a prompt served just before. How many of its tokens
        are served from the prefix cache?
        """, "Only full blocks are cached and hit; a block matches only if all blocks before it match.", "answer_1",
        "answer_1 = (70 // 16) * 16",
        """
        e1 = LLMEngine.from_config(model=COURSE_MODEL, block_size=16)
        base = [(3 * k) % 2000 + 3 for k in range(100)]
        e1.add_request("first", {"prompt_token_ids": base}, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(e1)
        e1.add_request("second", {"prompt_token_ids": base[:70] + [1999 - k for k in range(30)]}, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(e1)
        check("Exercise 1: cached tokens", answer_1, e1.request_metrics["second"].num_cached_tokens)
        """),
    *exercise(2, """
        The exact same 64-token prompt is sent twice (`block_size = 16`). How many tokens of the second request are served from
        the cache? (It is not 64.)
        """, "The step must produce logits for the last prompt token, so at least that token is computed again; it sits in the 4th block.", "answer_2",
        "answer_2 = ((64 - 1) // 16) * 16",
        """
        e2 = LLMEngine.from_config(model=COURSE_MODEL, block_size=16)
        for rid in ("a", "b"):
            e2.add_request(rid, {"prompt_token_ids": base[:64]}, SamplingParams(temperature=0.0, max_tokens=1))
            run_to_completion(e2)
        check("Exercise 2: a fully cached prompt", answer_2, e2.request_metrics["b"].num_cached_tokens)
        """),
    *exercise(3, """
        In the shared-system-prompt run, what is the largest ref count any block reached? (How many block tables held the most
        shared block at once?) Read it from `engine.traces`.
        """, "Each `StepTrace` has `block_ref_counts`, one number per physical block.", "answer_3",
        "answer_3 = max(max(t.block_ref_counts) for t in engine.traces)",
        """
        tables_holding = [sum(block in table for table in t.block_tables.values())
                          for t in engine.traces for block in {b for table in t.block_tables.values() for b in table}]
        check("Exercise 3: the most shared block", answer_3, max(tables_holding))
        """),
    *summary([
        "A full block is named by a chained hash of its tokens and every token before it; equal hash means equal K/V.",
        "Sharing is counted in ref counts; freed blocks keep their hash in the free queue and are evicted least recently used first.",
        "Multi-turn chat re-sends the whole conversation: with prefix caching turn 2 mostly hits, and its TTFT drops.",
        "TTFT falls as the hit rate grows; the last prompt token is always recomputed so there are logits to sample.",
    ]),
    *glossary([
        ("prefix caching", "前缀缓存", "reusing the K/V of a prompt prefix computed before"),
        ("prefix cache hit", "前缀缓存命中", "a block found in the cache by its hash"),
        ("chained block hash", "链式块哈希", "hash(parent hash, this block's tokens)"),
        ("ref count", "引用计数", "how many block tables hold a block"),
        ("LRU eviction", "最近最少使用淘汰", "the least recently freed cached block is reused first"),
        ("radix tree (RadixAttention)", "基数树", "SGLang's tree of cached prefixes"),
        ("multi-turn conversation", "多轮对话", "each turn re-sends the history as its prompt prefix"),
    ]),
]
