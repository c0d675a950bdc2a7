# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 5: prefix caching: hashing full blocks, ref counts, LRU reuse, multi-turn chat, hit rate vs TTFT."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

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
    request can take a cached block instead of recomputing it. A partially filled last block gets no hash, so it is not cached (source: `hash_block` and its callers in `minengine/core/kv_cache_manager.py`).
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
    engine = modelled_engine(block_size=16, num_kv_blocks=64, max_num_batched_tokens=512, enable_prefix_caching=True,
                             trace_block_tables=True)
    tok = engine.get_tokenizer()
    system_ids = tok("You are a helpful assistant who answers in the style of Shakespeare.\\n" * 4)["input_ids"]
    for i, question in enumerate(SHAKESPEARE_OPENINGS[:4]):
        engine.add_request(f"user-{i}", {"prompt_token_ids": system_ids + tok(question)["input_ids"]},
                           SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    run_to_completion(engine)
    busiest = max(engine.traces, key=lambda t: sum(rc > 1 for rc in t.block_ref_counts or []))
    viz.block_pool_figure(busiest).show()
    print({rid: m.num_cached_tokens for rid, m in engine.request_metrics.items()}, "cached prompt tokens per request")
    """),
    conclusion("""
    system_blocks = len(system_ids) // 16
    shared_now = sum(rc > 1 for rc in busiest.block_ref_counts)
    hits = {rid: m.num_cached_tokens for rid, m in engine.request_metrics.items()}
    conclude(f"The system prompt fills **{system_blocks} full blocks**. At step {busiest.step}, {shared_now} blocks were shared, the "
             f"most shared with ref count **{max(busiest.block_ref_counts)}**; the three later requests each took {hits['user-1']} prompt "
             f"tokens from the cache instead of computing them.",
             [("every later request hit the system prompt's full blocks", all(hits[f"user-{i}"] == system_blocks * 16 for i in (1, 2, 3))),
              ("the first one computed everything", hits["user-0"] == 0),
              ("the shared blocks are the system prompt's", shared_now == system_blocks)])
    """),
    md("""
    ## Multi-turn chat: MT-Bench
    MT-Bench has 80 questions with two turns (Zheng et al., NeurIPS 2023). A chat client sends turn 2 as *turn 1 + the model's answer + the new
    question*, so the whole first turn is a prefix the engine has just computed. We serve turn 1, then turn 2, with
    prefix caching on and off (built-in two-turn examples when `../shared/data` is absent).
    """),
    code("""
    data = find_data_dir()
    mt_path = data / "prompts" / "mt_bench_question.jsonl" if data else None
    if mt_path is not None and mt_path.exists():
        conversations = [json.loads(line)["turns"] for line in mt_path.read_text().splitlines() if line.strip()]
        source = "MT-Bench"
    else:
        # built-in: turn 1 asks to go on from a scene of the openings (each conversation starts at a different one)
        conversations = [["".join(SHAKESPEARE_OPENINGS[i:] + SHAKESPEARE_OPENINGS[:i]) + "Go on in the same style.",
                          "Now say it again, but shorter."] for i in range(len(SHAKESPEARE_OPENINGS))]
        source = "built-in (no MT-Bench data)"
    conversations = [[a[:pick(600, 200)], b[:200]] for a, b in conversations[: pick(16, 6)]]


    def chat(enable_prefix_caching, num_kv_blocks=pick(512, 256), flood=0):
        \"\"\"Serve turn 1 of every conversation, optionally `flood` unrelated requests, then every turn 2.\"\"\"
        eng = modelled_engine(enable_prefix_caching=enable_prefix_caching, num_kv_blocks=num_kv_blocks,
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
    """),
    conclusion("""
    conclude(f"Turn 2 of {len(conversations)} {source} conversations: with prefix caching **{hit_on:.0%}** of the prompt tokens came from "
             f"the cache and the median TTFT was **{ttft_on * 1000:.1f} ms**; without it, {hit_off:.0%} and {ttft_off * 1000:.1f} ms: "
             f"the cache spared {hit_on:.0%} of turn 2's prefill, and the first token came {ttft_off / ttft_on:.1f}x sooner.",
             [("caching serves most of turn 2 from the cache", hit_on > 0.5 and hit_off == 0),
              ("and lowers turn 2's TTFT", ttft_on < ttft_off)])
    """),
    code("""
    titled(viz.latency_cdf_figure({k: v for k, v in chat_on.request_metrics.items() if k.endswith("-t2")}), "Turn 2 with prefix caching").show()
    titled(viz.latency_cdf_figure({k: v for k, v in chat_off.request_metrics.items() if k.endswith("-t2")}), "Turn 2 without prefix caching").show()
    """),
    md("""
    ### How much could a real service reuse?
    The Mooncake trace (Qin et al., FAST'25) publishes, for each request, ids of its 512-token prompt blocks; equal ids
    at the same leading positions are reusable prefixes. With an infinite cache, a block hits when it and every block
    before it in that request were seen before. The answer depends on the window: the first requests meet an empty
    cache, so a hit rate of "the trace" must say how many requests it read. The whole trace is small, so both modes
    read all of it and print the hit rate of growing windows and of each window of 1,000 requests on its own:
    """),
    conclusion("""
    mooncake = data / "traces" / "mooncake_fast25" / "synthetic_trace.jsonl" if data else None
    if mooncake is not None and mooncake.exists():
        seen, per_request = set(), []   # (prefix-hit blocks, blocks) of each request, in trace order
        for line in mooncake.read_text().splitlines():
            key, prefix_hit, hits, total = 0, True, 0, 0
            for block_id in json.loads(line)["hash_ids"]:
                key = hash((key, block_id))          # chained: names the block and everything before it
                prefix_hit = prefix_hit and key in seen
                hits += prefix_hit
                total += 1
                seen.add(key)
            per_request.append((hits, total))

        def hit_rate(requests):
            return sum(h for h, _ in requests) / sum(t for _, t in requests)

        n = len(per_request)
        firsts = [w for w in (250, 1000, 2000) if w < n] + [n]
        growing = [hit_rate(per_request[:w]) for w in firsts]
        windows = [(a, min(a + 1000, n)) for a in range(0, n, 1000)]
        alone = [hit_rate(per_request[a:b]) for a, b in windows]
        for w, h in zip(firsts, growing):
            print(f"first {w:5,} requests: {h:6.1%} of their prompt blocks are prefix hits")
        for (a, b), h in zip(windows, alone):
            print(f"requests {a:5,}-{b - 1:5,} alone (the cache holding every earlier one): {h:6.1%}")
        mooncake_text = (
            f"Mooncake trace, {n:,} requests: with an infinite cache **{growing[-1]:.1%}** of all {sum(t for _, t in per_request):,} prompt "
            f"blocks are prefix hits, but only **{hit_rate(per_request[:1000]):.1%}** of the first 1,000 requests' blocks: the cache starts "
            f"empty, and each later window of 1,000 requests finds more of its prefixes already seen ({', '.join(f'{h:.0%}' for h in alone)}). "
            f"A reuse number is the number of a window: say how many requests it read.")
        mooncake_checks = [("the hit rate grows with the window", all(a < b for a, b in zip(growing, growing[1:]))),
                           ("each later window hits more than the one before", all(a < b for a, b in zip(alone, alone[1:])))]
    else:
        mooncake_text, mooncake_checks = "Mooncake trace not found (`../shared/data` absent): nothing to measure here.", []
    conclude(mooncake_text, mooncake_checks)
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
    conclusion("""
    SMALL = pick(256, 64)
    _, hit_small_quiet, _ = chat(True, num_kv_blocks=SMALL, flood=0)
    _, hit_small_flood, _ = chat(True, num_kv_blocks=SMALL, flood=16)
    conclude(f"With a pool of {SMALL} blocks, turn 2 hit **{hit_small_quiet:.0%}** of its prompt tokens when nothing ran in between, and "
             f"**{hit_small_flood:.0%}** when 16 unrelated 200-token requests ran between the turns: their blocks came from the front of the "
             f"free queue, the least recently used cached prefixes first. With {pick(512, 256)} blocks and no traffic it was {hit_on:.0%}.",
             [("unrelated traffic evicts cached prefixes in a small pool", hit_small_flood < hit_small_quiet),
              ("a roomy pool keeps at least as much", hit_on >= hit_small_quiet)])
    """),
    md("""
    ## Hit rate vs TTFT
    Eight requests whose prompts share the first `f` of their tokens (the rest differs); one goes first and fills the cache.
    """),
    code("""
    PROMPT = pick(512, 256)


    def shared_fraction_run(fraction):
        eng = modelled_engine(max_num_batched_tokens=1024, trace_block_tables=False)
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
    titled(fig, f"{PROMPT}-token prompts: prefix-cache hit rate vs TTFT")
    fig.update_layout(xaxis_title="hit rate (% of prompt tokens)", yaxis_title="mean TTFT of the later requests (ms)")
    fig.show()
    """),
    conclusion("""
    hit_rates, ttfts = [h for h, _ in results], [t for _, t in results]
    conclude(f"As the shared part grows from {fractions[0]:.0%} to {fractions[-1]:.0%} of the prompt, the hit rate goes from "
             f"{hit_rates[0]:.0%} to **{hit_rates[-1]:.0%}** and the later requests' mean TTFT from {ttfts[0] * 1000:.1f} ms to "
             f"**{ttfts[-1] * 1000:.1f} ms**: each hit token is a token the step does not compute.",
             [("more sharing, more hits", all(a < b for a, b in zip(hit_rates, hit_rates[1:]))),
              ("more hits, lower TTFT", all(a > b for a, b in zip(ttfts, ttfts[1:])))])
    """),
    md("""
    ## Exercises
    The cell below runs the engine for the cases exercises 1 and 2 check (once, so re-running a check does not run the engine again):
    """),
    code("""
    base = [(3 * k) % 2000 + 3 for k in range(100)]


    def engine_cached(shared, block_size):
        \"\"\"Cached tokens of a 100-token prompt whose first `shared` tokens equal a prompt served just before.\"\"\"
        eng = modelled_engine(block_size=block_size, trace_block_tables=False)
        eng.add_request("first", {"prompt_token_ids": base}, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(eng)
        other = base[:shared] + [t % 2000 + 4 for t in base[shared:]]   # every later token differs from base's
        eng.add_request("second", {"prompt_token_ids": other}, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(eng)
        return eng.request_metrics["second"].num_cached_tokens


    def engine_repeat(n, block_size):
        \"\"\"Cached tokens of an `n`-token prompt sent a second time.\"\"\"
        eng = modelled_engine(block_size=block_size, trace_block_tables=False)
        for rid in ("a", "b"):
            eng.add_request(rid, {"prompt_token_ids": base[:n]}, SamplingParams(temperature=0.0, max_tokens=1))
            run_to_completion(eng)
        return eng.request_metrics["b"].num_cached_tokens


    cases_1 = [((shared, bs), engine_cached(shared, bs)) for shared, bs in ((70, 16), (64, 16), (15, 16), (16, 16), (96, 32), (70, 32), (50, 32))]
    cases_2 = [((n, bs), engine_repeat(n, bs)) for n, bs in ((64, 16), (70, 16), (16, 16), (17, 16), (100, 32), (96, 32))]
    print(f"{len(cases_1) + len(cases_2)} engine runs ready for the checks")
    """),
    *exercise(1, """
        A 100-token prompt whose first `shared` tokens equal a prompt served just before (the rest differs). Write
        `answer_1(shared, block_size)`: how many of its tokens are served from the prefix cache? The check compares it with the engine's runs above for
        several `shared` (some a multiple of the block size, some not) and block sizes 16 and 32.
        """, "Only full blocks are cached and hit; a block matches only if all blocks before it match.", "answer_1",
        "answer_1 = lambda shared, block_size: (shared // block_size) * block_size",
        """
        check_function("Exercise 1: cached tokens", answer_1, cases_1)
        """, wrong=["answer_1 = lambda shared, block_size: shared  # only full blocks are cached",
                    "answer_1 = lambda shared, block_size: shared // block_size  # blocks, not tokens",
                    "answer_1 = lambda shared, block_size: (shared // block_size + 1) * block_size  # the last block is only partly shared",
                    "answer_1 = lambda shared, block_size: -(-shared // block_size) * block_size  # rounds a partly shared block up",
                    "answer_1 = lambda shared, block_size: ((shared - 1) // block_size) * block_size  # the last-token rule applies to a whole prompt hit, not here",
                    "answer_1 = lambda shared, block_size: (shared // 16) * 16  # the block size is an argument: 50 shared tokens fill one 32-token block"]),
    *exercise(2, """
        The exact same `n`-token prompt is sent twice. Write `answer_2(n, block_size)`: how many tokens of the second request are
        served from the cache? (For `n = 64`, `block_size = 16` it is not 64.) The check compares it with the engine's runs above for several `n`, some a
        multiple of the block size and some not.
        """, "The step must produce logits for the last prompt token, so at least that token is computed again; whole blocks only.", "answer_2",
        "answer_2 = lambda n, block_size: ((n - 1) // block_size) * block_size",
        """
        check_function("Exercise 2: a fully cached prompt", answer_2, cases_2)
        """, wrong=["answer_2 = lambda n, block_size: n  # the last token must be computed to sample",
                    "answer_2 = lambda n, block_size: n - 1  # hits come in whole blocks",
                    "answer_2 = lambda n, block_size: (n // block_size) * block_size  # right unless the block size divides n",
                    "answer_2 = lambda n, block_size: (n // block_size - 1) * block_size  # right only when the block size divides n"]),
    *exercise(3, """
        In the shared-system-prompt run, at step `busiest.step`, how many KV blocks did the four requests hold **in all**
        (count each physical block once), and how many would they have held without sharing? Answer `(with_sharing, without)`
        from `busiest.block_tables`.
        """, "A shared block appears in several block tables but is one block of the pool; without sharing each table's blocks would be its own.", "answer_3",
        "answer_3 = (len({b for table in busiest.block_tables.values() for b in table}), sum(len(table) for table in busiest.block_tables.values()))",
        """
        held = sum(1 for rc in busiest.block_ref_counts if rc > 0)   # the pool's own count of blocks in use
        check("Exercise 3: blocks with and without sharing", answer_3, (held, sum(busiest.block_ref_counts)))
        """, wrong=["answer_3 = (sum(len(t) for t in busiest.block_tables.values()), sum(len(t) for t in busiest.block_tables.values()))  # a shared block counted per table",
                    "answer_3 = (max(busiest.block_ref_counts), sum(len(t) for t in busiest.block_tables.values()))  # the ref count is not a number of blocks",
                    "answer_3 = (len({b for t in busiest.block_tables.values() for b in t}), 4 * len({b for t in busiest.block_tables.values() for b in t}))"]),
    *question("why is the last prompt token always recomputed?", """
        Exercise 2 showed that a prompt sent twice does not get all its tokens from the cache. Why must the engine compute
        at least the last prompt token, even when its K/V is cached?
        """, """
        The step must produce the logits that sample the first output token, and logits come from running the model on a
        token: the cache stores K/V, not the final hidden state or the logits of the last position. So at least one prompt
        token goes through the model; since hits come in whole blocks, the engine gives up the whole block that holds it
        (`(len - 1) // block_size` blocks at most). vLLM does the same.
        """),
    *question("what if the system prompt came after the user's question?", """
        The four requests above shared their first blocks because they started with the same system prompt. What if each
        prompt were `question + system_prompt` instead?
        """, """
        Nothing would hit: a block's hash chains everything before it (its K/V depends on every earlier token through attention), so once the first block differs, every later block differs too, even if its own tokens are identical (source: `hash_block` in `minengine/core/kv_cache_manager.py` hashes a block with its parent's hash).
        That is why chat templates put the shared system prompt first, and why RAG systems place shared documents before
        per-user text when they can.
        """),
    *summary([
        "A full block is named by a chained hash of its tokens and every token before it; equal hash means equal K/V.",
        "Sharing is counted in ref counts; freed blocks keep their hash in the free queue and are evicted least recently used first.",
        "Multi-turn chat re-sends the whole conversation: with prefix caching turn 2 mostly hits, and its TTFT drops (checked: caching serves most of turn 2 from the cache; and lowers turn 2's TTFT).",
        "TTFT falls as the hit rate grows (checked: more hits, lower TTFT); the last prompt token is always recomputed so there are logits to sample.",
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
