# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 2: PagedAttention: block tables, slot mapping, memory waste, paged == dense attention."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(2, "PagedAttention: block tables and slot mapping", [
        "Explain how a block table maps a request's logical KV blocks to physical blocks, and compute a slot mapping.",
        "Measure, on a real prompt workload, the KV memory wasted by max-length contiguous reservation vs paging.",
        "See why block size trades internal fragmentation against table size and kernel efficiency.",
        "Show that attention read through block tables equals dense attention (and the engine matches transformers).",
        "See a sliding window give blocks back: a long request holds a bounded number of blocks, and compute the bound.",
    ], ["Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention*, SOSP 2023, sections 3-4",
        "vLLM docs, *Paged Attention* design page", "MT-Bench (Zheng et al., NeurIPS 2023) and Arena-Hard prompts",
        "Jiang et al., *Mistral 7B*, 2023 (sliding-window attention); vLLM's `SlidingWindowManager`"]),
    code(SETUP + "import math\n\nimport torch\n"),
    md("""
    ## The problem
    Before PagedAttention, serving systems reserved one contiguous KV region per request, as long as the request
    could ever become (`max_model_len`), because the output length is unknown up front. Such systems kept actual
    token states in only about 20-40 % of their KV memory, the rest being reserved-but-unused space and fragmentation
    (Kwon et al., SOSP 2023, figure 2). The fix borrows virtual memory's idea: split the cache into
    fixed-size **blocks** of `block_size` tokens, give each request a **block table** (logical block i -> physical
    block id), and allocate a new block when the request has filled the previous one.
    """),
    md("## Toy: a block allocator"),
    code("""
    class ToyPagedCache:
        def __init__(self, num_blocks, block_size):
            self.free, self.block_size, self.tables, self.lens = list(range(num_blocks)), block_size, {}, {}

        def append_token(self, seq):                      # returns the slot the new token's K/V goes to
            n, table = self.lens.get(seq, 0), self.tables.setdefault(seq, [])
            if n % self.block_size == 0:                  # previous block full (or none yet): take a new one
                table.append(self.free.pop(0))
            self.lens[seq] = n + 1
            return table[n // self.block_size] * self.block_size + n % self.block_size   # slot mapping


    toy = ToyPagedCache(num_blocks=8, block_size=4)
    slots = {seq: [toy.append_token(seq) for _ in range(n)] for seq, n in [("A", 6), ("B", 3)]}
    slots["A"] += [toy.append_token("A") for _ in range(3)]      # A grows after B took a block
    print("block tables:", toy.tables)
    print("slots of A:", slots["A"])
    print("slots of B:", slots["B"])
    """),
    md("""
    Request A's blocks are not contiguous (B took one in between) and nothing had to move: the block table hides
    it. The **slot mapping** `block_table[pos // block_size] * block_size + pos % block_size` tells the kernel
    where each new token's K/V goes; attention then reads a request's keys by walking its block table.

    ## The real engine's block tables
    Three requests whose prompts end a few tokens short of a block boundary decode together, so each crosses into a
    new block at a different step and takes the next free block: their tables interleave, as A's and B's did in the
    toy. `trace_block_tables=True` records each step's tables and ref counts.
    """),
    code("""
    from minengine.workloads import SHAKESPEARE_OPENINGS

    engine = modelled_engine(block_size=16, num_kv_blocks=32, max_num_batched_tokens=256, enable_prefix_caching=False,
                             trace_block_tables=True)
    for i, prompt_len in enumerate((13, 29, 42)):   # 3, 3 and 6 tokens short of a 16-token block boundary
        engine.add_request(f"req-{i}", {"prompt_token_ids": [(7 * k + i) % 2000 + 3 for k in range(prompt_len)]},
                           SamplingParams(temperature=0.0, max_tokens=pick(24, 16), ignore_eos=True))
    run_to_completion(engine)
    snapshot = next(t for t in reversed(engine.traces) if len(t.block_tables or {}) == 3)   # the last step all three ran
    viz.block_tables_figure(snapshot).update_traces(textfont={"size": 16}).show()   # physical block ids, readable
    viz.block_pool_figure(snapshot).show()
    """),
    conclusion("""
    bs = engine.config.block_size


    def contiguous(table):
        return all(b == table[0] + i for i, b in enumerate(table))


    rid, table = next((r, t) for r, t in snapshot.block_tables.items() if not contiguous(t))
    chunk = next(c for c in snapshot.chunks if c.request_id == rid)
    seq_len = chunk.start_pos + chunk.num_tokens
    positions = range(chunk.start_pos, seq_len)
    slot_mapping = [table[p // bs] * bs + p % bs for p in positions]
    conclude(f"At step {snapshot.step}, `{rid}` holds physical blocks **{table}**: not contiguous, because the other requests "
             f"took blocks in between as they grew. It computed position {chunk.start_pos}, written to slot {slot_mapping[0]}, "
             f"not slot {chunk.start_pos}: the slot mapping goes through the block table.",
             [("a request's block table is not contiguous", not contiguous(table)),
              ("its token's slot is not its position", slot_mapping[0] != chunk.start_pos)])
    """),
    md("""
    ## Measure: contiguous reservation vs paging on a real workload
    Real user prompts (MT-Bench and Arena-Hard from `../shared/data/prompts/` when present, Shakespeare otherwise),
    tokenized by the bundled tokenizer, served by the engine. At every step we compare three numbers: tokens whose K/V
    is really stored, slots the paged cache holds (whole blocks), and what a contiguous system would reserve
    (`max_model_len` per running request).
    """),
    code("""
    from minengine.workloads import find_data_dir, load_real_prompts

    prompts = load_real_prompts(find_data_dir(), limit=pick(24, 8), max_chars=pick(1200, 300)) or SHAKESPEARE_OPENINGS[:pick(16, 8)]
    max_model_len = pick(1024, 512)


    def serve(block_size, prompts=prompts):
        eng = LLMEngine.from_config(model=COURSE_MODEL, block_size=block_size, max_model_len=max_model_len,
                                    max_num_batched_tokens=pick(512, 256), max_num_seqs=8, num_kv_blocks=max_model_len * 8 // block_size,
                                    enable_prefix_caching=False, trace_block_tables=True)
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, SamplingParams(temperature=0.8, seed=i, max_tokens=pick(48, 16)))
        run_to_completion(eng)
        return eng


    def memory_per_step(eng):
        \"\"\"Per step: (tokens stored, paged slots held, contiguous slots reserved).\"\"\"
        seq_len, rows = {}, []
        for t in eng.traces:
            for c in t.chunks:
                seq_len[c.request_id] = c.start_pos + c.num_tokens
            live = t.block_tables or {}
            rows.append((sum(seq_len[r] for r in live), sum(len(b) for b in live.values()) * eng.config.block_size,
                         len(live) * eng.config.max_model_len))
        return rows


    served = serve(16)
    rows = memory_per_step(served)
    fig = go.Figure([go.Scatter(y=[r[i] for r in rows], name=name, mode="lines")
                     for i, name in enumerate(["tokens stored", "paged: slots held (block_size 16)", "contiguous: slots reserved"])])
    fig.update_layout(title="KV slots per step", xaxis_title="step", yaxis=dict(title="KV slots (tokens)", type="log"))
    fig.show()
    """),
    conclusion("""
    stored, paged, reserved = (sum(col) for col in zip(*rows))
    worst_tail = max(p - s for s, p, _ in rows) / len(prompts)
    conclude(f"Over {len(rows)} steps with {len(prompts)} real prompts: contiguous reservation used **{stored / reserved:.1%}** "
             f"of what it reserved; paging used **{stored / paged:.1%}** of what it held (the rest is the unfilled tail "
             f"of each request's last block, at most {bs - 1} slots per request).",
             [("paging keeps a larger share of its memory useful", stored / paged > stored / reserved),
              ("paging wastes less than one block per running request", all(p - s < bs * max(1, n) for (s, p, _), n in
                                                                       zip(rows, [len(t.block_tables or {}) for t in served.traces])))])
    """),
    md("""
    ## Block size: fragmentation vs bookkeeping
    A request wastes at most `block_size - 1` slots (its last block). Smaller blocks waste less but mean longer block
    tables and smaller, less efficient memory reads in the kernel; vLLM's default is 16 (Kwon et al., section 7.2).
    Using the final lengths of the requests above:
    """),
    code("""
    final_lens = [m.num_prompt_tokens + m.num_output_tokens for m in served.request_metrics.values()]


    def tail_waste(block_size, lens=final_lens):
        held = sum(math.ceil(n / block_size) * block_size for n in lens)
        return 1 - sum(lens) / held


    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    fig = go.Figure(go.Scatter(x=sizes, y=[100 * tail_waste(b) for b in sizes], mode="lines+markers"))
    fig.update_layout(title="Paged KV waste vs block size (final request lengths of this workload)",
                      xaxis=dict(title="block_size (tokens)", type="log"), yaxis_title="wasted slots (% of held)")
    fig.show()
    """),
    md("## Try it: block size on the real engine"),
    code("""
    import ipywidgets as widgets


    def run_block_size(block_size=16):
        eng = serve(block_size, prompts[: pick(8, 4)])
        s, p, c = (sum(col) for col in zip(*memory_per_step(eng)))
        print(f"block_size {block_size}: paged keeps {s / p:.1%} useful, contiguous {s / c:.1%}; "
              f"peak blocks used {eng.summary().peak_kv_blocks_used} of {eng.num_kv_blocks}")
        viz.kv_usage_figure(eng.traces).show()


    widgets.interact_manual(run_block_size, block_size=widgets.SelectionSlider(options=[4, 8, 16, 32, 64], value=16))
    """),
    md("""
    ## Paged attention equals dense attention
    The toy below writes K/V with the engine's own `write_kv` into a pool at scattered slots, reads them back through a
    block table and attends; dense attention over the same keys gives the same output.
    """),
    code("""
    from minengine.layers.attention import write_kv

    torch.manual_seed(0)
    seq, heads, dim, bs_toy, pool_blocks = 37, 2, 8, 4, 16
    q, k, v = (torch.randn(seq, heads, dim) for _ in range(3))
    table = torch.randperm(pool_blocks)[: math.ceil(seq / bs_toy)]                 # scattered physical blocks
    slot_mapping = torch.tensor([int(table[p // bs_toy]) * bs_toy + p % bs_toy for p in range(seq)])
    k_cache, v_cache = torch.zeros(pool_blocks, bs_toy, heads, dim), torch.zeros(pool_blocks, bs_toy, heads, dim)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    k_paged = k_cache[table].reshape(-1, heads, dim)[:seq]                          # gather through the table
    v_paged = v_cache[table].reshape(-1, heads, dim)[:seq]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    paged_out = sdpa(q.transpose(0, 1), k_paged.transpose(0, 1), v_paged.transpose(0, 1), is_causal=True)
    dense_out = sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    paged_equals_dense = torch.allclose(paged_out, dense_out)
    print("paged == dense:", paged_equals_dense, "| max abs difference:", (paged_out - dense_out).abs().max().item())
    claim("attention read through a block table equals dense attention", bool(paged_equals_dense))
    """),
    md("""
    The toy gathers the blocks into one tensor first. The engine's CPU path does not copy them: minengine's C++
    kernel (`minengine/layers/cpu_attention.cpp`, built when the engine starts) walks the block table and reads each
    block where it sits in the pool, as vLLM's paged kernels do. The same toy pool and block table through it:
    """),
    code("""
    from minengine.layers import cpu_attention

    kernel = cpu_attention.kernel_for(q, k_cache)  # None without a C++ compiler or with MINENGINE_CPU_KERNEL=0
    if kernel is None:
        print(f"no C++ kernel here ({cpu_attention.status().message}): the engine attends by the gather + SDPA of the cell above")
    else:
        in_place = torch.empty_like(q)
        # one request, all seq tokens new (q_len = seq), its block table as one row, its length
        kernel(in_place, q, k_cache, v_cache, table.view(1, -1), torch.tensor([seq], dtype=torch.int32), seq,
               dim ** -0.5, 1)
        in_place_diff = (in_place - dense_out.transpose(0, 1)).abs().max().item()
        print(f"in-place kernel == dense: max abs difference {in_place_diff:.1e}")
        claim("the engine's CPU kernel, reading the blocks in place, equals dense attention", in_place_diff < 1e-5)
    """),
    md("""
    And the whole engine: greedy decoding with block sizes 1, 16 and 64 against transformers' `generate` (a dense,
    contiguous KV cache). The tokens must be identical.
    """),
    code("""
    from transformers import AutoModelForCausalLM

    prompt_ids = served.tokenizer(SHAKESPEARE_OPENINGS[0])["input_ids"]
    n_new = pick(24, 8)
    hf = AutoModelForCausalLM.from_pretrained(served.model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        hf_tokens = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(prompt_ids):].tolist()
    engine_tokens = {}
    for b in (1, 16, 64):
        llm_b = LLM(model=COURSE_MODEL, block_size=b)
        out = llm_b.generate({"prompt_token_ids": prompt_ids}, SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True), use_tqdm=False)
        engine_tokens[b] = out[0].outputs[0].token_ids
    for b, toks in engine_tokens.items():
        print(f"block_size {b:3d}: identical to transformers: {toks == hf_tokens}")
    claim("greedy tokens are identical to transformers for every block size", all(t == hf_tokens for t in engine_tokens.values()))
    """),
    md("""
    For the exercise: a position of `rid` inside a block that is **not** where a contiguous layout would put it.
    """),
    code("""
    table_of_rid = snapshot.block_tables[rid]
    position = next(j * bs + 5 for j in range(1, len(table_of_rid)) if table_of_rid[j] != table_of_rid[0] + j and j * bs + 5 < seq_len)
    print(f"{rid}: block table {table_of_rid}, position {position}")
    """),
    *exercise(1, """
        Request `rid` has block table `table_of_rid` (printed above). With `block_size = 16`, in which **slot** of the KV
        pool is the K/V of its token at `position` stored? Write `answer_1(table, position)`, the slot of position `position`
        of a request whose block table is `table`. The check calls it on every position of the three requests of the snapshot
        (the first block, the middle ones and the last) and compares with the engine's own slot mapping.
        """, "`position` is in logical block `position // 16`, at offset `position % 16` inside it; the block table says which physical block that is.", "answer_1",
        "answer_1 = lambda table, position: table[position // 16] * 16 + position % 16",
        """
        from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
        from minengine.worker.forward_batch import ForwardBatch


        def engine_slots(request_id):
            # the engine's own slot mapping: a step that computes positions 0..len - 1 of the request through its table
            table_r = snapshot.block_tables[request_id]
            chunk_r = next(c for c in snapshot.chunks if c.request_id == request_id)
            n = chunk_r.start_pos + chunk_r.num_tokens
            probe_step = SchedulerOutput(scheduled=[ScheduledRequest(request_id, [0] * n, 0, table_r, True, True, SamplingParams(), 0)])
            slots = ForwardBatch.build(probe_step, bs, torch.device("cpu")).slot_mapping.tolist()
            return [((table_r, p), int(slot)) for p, slot in enumerate(slots)]


        cases_1 = [case for request_id in sorted(snapshot.block_tables) for case in engine_slots(request_id)]
        claim("some position lies before its request's last block", any(p // bs < len(t) - 1 for (t, p), _ in cases_1))
        check_function("Exercise 1: slot of a position", answer_1, cases_1)
        """, wrong=["answer_1 = lambda table, position: position  # slot = position: true only for a contiguous table starting at block 0",
                    "answer_1 = lambda table, position: table[0] * 16 + position  # as if the blocks were contiguous",
                    "answer_1 = lambda table, position: table[position // 16] + position % 16  # a block id is not a slot",
                    "answer_1 = lambda table, position: table[position // 16] * 16  # forgot the offset inside the block",
                    "answer_1 = lambda table, position: table[-1] * 16 + position % 16  # the last block: right for the newest tokens only",
                    "answer_1 = lambda table, position: table[(position + 1) // 16] * 16 + (position + 1) % 16  # positions counted from 1",
                    "answer_1 = lambda table, position: table_of_rid[position // 16] * 16 + position % 16  # rid's table, whatever the request"]),
    *exercise(2, """
        A request has a `prompt_len`-token prompt and generates `output_len` tokens (`block_size = 16`). During its
        **last** step, how many of its tokens have K/V in the cache, and how many blocks does it hold? Write a function
        `answer_2(prompt_len, output_len)` returning `(tokens, blocks)`; it is checked on several lengths (a 100-token
        prompt with 30 outputs, lengths that fill a block exactly, one output token, ...), each against the engine's run.
        """, """
        The last step computes the K/V of token `prompt_len + output_len - 1` and samples the last one, whose K/V is never
        needed. A partly filled block is held whole.
        """, "answer_2",
        """
        def answer_2(prompt_len, output_len):
            cached = prompt_len + output_len - 1
            return (cached, math.ceil(cached / 16))
        """,
        """
        def last_step_of(prompt_len, output_len):
            eng2 = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, trace_block_tables=True)
            eng2.add_request("x", {"prompt_token_ids": [5] * prompt_len}, SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
            run_to_completion(eng2)
            last = eng2.traces[-1]
            return (last.chunks[0].start_pos + last.chunks[0].num_tokens, len(last.block_tables["x"]))

        # Lengths where floor and ceiling, "+1" and "-1" disagree: a block filled exactly, one past it, a single output token.
        lengths = [(100, 30), (16, 1), (16, 2), (17, 16), (32, 17), (5, 12)]
        check_function("Exercise 2: tokens cached and blocks held in the last step", answer_2,
                       [((p, o), last_step_of(p, o)) for p, o in lengths])
        """, wrong=["def answer_2(prompt_len, output_len):  # the last token's K/V is never computed\n    return (prompt_len + output_len, math.ceil((prompt_len + output_len) / 16))",
                    "def answer_2(prompt_len, output_len):  # floor: the partly filled last block counts too\n    return (prompt_len + output_len - 1, (prompt_len + output_len - 1) // 16)",
                    "def answer_2(prompt_len, output_len):  # two slips that cancel at 100 + 30: both hold 9 blocks\n    return (prompt_len + output_len - 1, math.ceil((prompt_len + output_len) / 16))",
                    "def answer_2(prompt_len, output_len):  # a block for the token being sampled\n    return (prompt_len + output_len - 1, (prompt_len + output_len - 1) // 16 + 1)"]),
    *exercise(3, """
        Using `final_lens` (the final lengths of the workload above), what fraction of the slots held by a paged cache
        with `block_size = 64` is wasted? Answer a number between 0 and 1.
        """, "Each request holds ceil(n / 64) x 64 slots; waste = 1 - stored / held.", "answer_3",
        "answer_3 = 1 - sum(final_lens) / sum(math.ceil(n / 64) * 64 for n in final_lens)",
        """
        check_close("Exercise 3: waste at block_size 64", answer_3, tail_waste(64), rel_tol=0.01)
        """, wrong=["answer_3 = sum(final_lens) / sum(math.ceil(n / 64) * 64 for n in final_lens)  # the used share, not the waste",
                    "answer_3 = tail_waste(16)  # the default block size",
                    "answer_3 = 1 - sum(final_lens) / (len(final_lens) * max_model_len)  # contiguous reservation"]),
    md("""
    ## Sliding windows: blocks that go back to the pool
    With sliding-window attention every layer lets a token attend to itself and the `w - 1` tokens before it, no
    further back (source: Jiang et al., *Mistral 7B*, 2023). A key older than the window is never read again, so
    the block holding it can return to the pool while the request runs on: the engine does that when every layer of
    a checkpoint is windowed (`WindowedKVCacheManager`, like vLLM's `SlidingWindowManager`). Below, a random-weight
    Mistral-shaped model made here with transformers (no download) serves one long request twice, with its window
    and with the same weights and full attention, and we count the blocks the request holds after every step.
    """),
    code("""
    import tempfile
    from pathlib import Path

    from transformers import MistralConfig, MistralForCausalLM

    WINDOW, SW_BLOCK, SW_PROMPT, SW_OUTPUT = 40, 8, 60, pick(400, 120)
    sw_dir = Path(tempfile.mkdtemp())
    for name, window in (("windowed", WINDOW), ("full", None)):
        torch.manual_seed(0)  # the same weights for both
        cfg = MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=1024, sliding_window=window)
        MistralForCausalLM(cfg).save_pretrained(sw_dir / name)


    def blocks_held(model_dir):
        \"\"\"One request alone: after every step but the last, (tokens with K/V in the cache, blocks it holds).\"\"\"
        eng = LLMEngine.from_config(model=str(model_dir), block_size=SW_BLOCK, max_model_len=1024, max_num_batched_tokens=32)
        eng.add_request("long", {"prompt_token_ids": list(range(3, 3 + SW_PROMPT))},
                        SamplingParams(temperature=0.0, max_tokens=SW_OUTPUT, ignore_eos=True))
        series = []
        while eng.has_unfinished_requests():
            eng.step()
            if eng.has_unfinished_requests():
                series.append((eng.scheduler.requests["long"].num_computed_tokens, eng.kv_cache_manager.num_used_blocks))
        assert eng.kv_cache_manager.num_free_blocks == eng.num_kv_blocks  # every block is back at the end
        return series


    held = {name: blocks_held(sw_dir / name) for name in ("windowed", "full")}
    fig = go.Figure([go.Scatter(x=[c for c, _ in rows], y=[b for _, b in rows], name=name, mode="lines") for name, rows in held.items()])
    fig.update_layout(title=f"KV blocks one request holds (window {WINDOW} tokens, blocks of {SW_BLOCK})",
                      xaxis_title="tokens with K/V in the cache", yaxis_title="blocks held")
    fig.show()
    """),
    conclusion("""
    decode_held = [b for c, b in held["windowed"] if c > SW_PROMPT]  # after a decode step (the last chunk ends at SW_PROMPT)
    full_end = held["full"][-1][1]
    conclude(f"With full attention the request ends holding **{full_end}** blocks, one more every {SW_BLOCK} tokens; with a "
             f"window of {WINDOW} tokens it never holds more than **{max(decode_held)}** blocks while it decodes, however long it runs.",
             [("full attention holds a block per block_size tokens computed", all(b == math.ceil(c / SW_BLOCK) for c, b in held["full"])),
              ("the windowed request holds fewer blocks at the end", held["windowed"][-1][1] < full_end),
              ("the windowed request's blocks stop growing", max(decode_held) == max(decode_held[len(decode_held) // 2:]))])
    """),
    *exercise(4, """
        During a decode step the request's one query at position `c` reads keys `c - w + 1 .. c`. With a window of `w`
        tokens and `block_size` tokens per block, what is the **most** blocks a decoding request holds? Write
        `answer_4(w, block_size)`; it is checked on several windows and block sizes (the one above first, against the
        engine's own count), chosen where the plausible formulas disagree.
        """, """
        The keys read span `w` positions; count the blocks they touch in the worst alignment: the query alone in a
        block it has just opened, the rest of the window in the blocks before it.
        """, "answer_4",
        """
        def answer_4(w, block_size):
            return 1 + math.ceil((w - 1) / block_size)
        """,
        """
        def most_blocks(w, block_size):
            # every position c of a query: the blocks from the one holding key c - w + 1 to the one holding c
            return max((c // block_size) - max(0, c - w + 1) // block_size + 1 for c in range(4 * (w + block_size)))

        claim("the formula's count is the engine's", most_blocks(WINDOW, SW_BLOCK) == max(decode_held))
        cases = [(WINDOW, SW_BLOCK), (17, 16), (33, 8), (42, 8), (16, 16), (1, 16)]
        check_function("Exercise 4: the most blocks a windowed decode holds", answer_4, [((w, b), most_blocks(w, b)) for w, b in cases])
        """, wrong=["def answer_4(w, block_size):  # the window's blocks if it started at a block boundary\n    return math.ceil(w / block_size)",
                    "def answer_4(w, block_size):  # one too many when w - 1 is a multiple of block_size\n    return math.ceil(w / block_size) + 1",
                    "def answer_4(w, block_size):  # one too few when w % block_size is 2 or more\n    return w // block_size + 1",
                    "def answer_4(w, block_size):  # forgot the block the query opens\n    return math.ceil((w - 1) / block_size)"]),
    md("""
    ## Other ways to shrink the KV cache
    A window caps how many tokens a request keeps; the other designs shrink what each token costs. Per token and
    layer, multi-head attention (MHA) caches a K and a V vector per head; grouped-query attention (GQA) lets several
    query heads share one KV head; multi-query attention (MQA) keeps a single KV head; DeepSeek's multi-head latent
    attention (MLA) caches one compressed latent vector plus a small RoPE key, from which every head's K and V are
    rebuilt. The shapes below are each model's published `config.json` (source: the models' Hugging Face
    `config.json` files; for MLA, `kv_lora_rank` and `qk_rope_head_dim`), in bf16.
    """),
    code("""
    BF16 = 2  # bytes per element
    # name: (design, layers, KV heads, head_dim) -- or, for MLA, (design, layers, latent width kv_lora_rank + qk_rope_head_dim, None)
    PUBLISHED = {
        "Llama-2-7B": ("MHA", 32, 32, 128),
        "Llama-3-8B": ("GQA", 32, 8, 128),
        "Mistral-7B-v0.1": ("GQA + window", 32, 8, 128),
        "Falcon-7B": ("MQA", 32, 1, 64),
        "DeepSeek-V3": ("MLA", 61, 512 + 64, None),
    }
    MISTRAL_WINDOW, LONG_CONTEXT = 4096, 32768  # Mistral-7B-v0.1's sliding_window; a long request


    def kv_bytes_per_token(layers, kv_heads_or_latent, head_dim):
        \"\"\"K and V of every KV head in every layer; MLA caches one latent vector per layer instead.\"\"\"
        if head_dim is None:
            return layers * kv_heads_or_latent * BF16
        return layers * 2 * kv_heads_or_latent * head_dim * BF16


    per_token = {name: kv_bytes_per_token(*shape[1:]) for name, shape in PUBLISHED.items()}
    for name, (design, *shape) in PUBLISHED.items():
        tokens_kept = min(LONG_CONTEXT, MISTRAL_WINDOW) if "window" in design else LONG_CONTEXT
        print(f"{name:16s} {design:13s} {per_token[name] / 1024:8.1f} KiB per token; a {LONG_CONTEXT}-token request keeps "
              f"{tokens_kept * per_token[name] / 2**30:6.2f} GiB")
    """),
    conclusion("""
    mha, gqa, mqa, mla = (per_token[n] for n in ("Llama-2-7B", "Llama-3-8B", "Falcon-7B", "DeepSeek-V3"))
    mistral_request = MISTRAL_WINDOW * per_token["Mistral-7B-v0.1"]
    conclude(f"Per token, GQA with {PUBLISHED['Llama-3-8B'][2]} KV heads caches **{mha / gqa:.0f}x** less than MHA, and MQA "
             f"**{mha / mqa:.0f}x** less; DeepSeek-V3's MLA caches {mla / 1024:.1f} KiB per token over {PUBLISHED['DeepSeek-V3'][1]} layers, "
             f"less than Llama-3-8B's {gqa / 1024:.0f} KiB over {PUBLISHED['Llama-3-8B'][1]}. A window caps the tokens instead: a "
             f"{LONG_CONTEXT}-token request on Mistral-7B keeps **{mistral_request / 2**30:.2f} GiB**, not {LONG_CONTEXT * per_token['Mistral-7B-v0.1'] / 2**30:.0f} GiB.",
             [("GQA caches less than MHA per token", gqa < mha),
              ("MQA caches less than GQA per token", mqa < gqa),
              ("MLA caches less per token than an 8B GQA model despite twice the layers", mla < gqa),
              ("the window keeps less of a request longer than it", mistral_request < LONG_CONTEXT * per_token["Mistral-7B-v0.1"])])
    """),
    *question("what if one layer attends to everything?", """
        Qwen2 can window only its upper layers (`max_window_layers`). If one block table served every layer, such a
        model could free no block at all. Why, and what does the engine do instead?
        """, """
        Under one table a block holds the K/V of its tokens in all layers at once. A full-attention layer reads every
        key of the request at every step, so no block is ever outside *every* layer's window. To free the windowed
        layers' memory anyway, vLLM's hybrid allocator gives each kind of layer its own block table (a KV cache
        group): the windowed group frees its blocks, the full group keeps them. minengine does the same
        (`core/hybrid_kv_cache_manager.py`): each layer reads and writes through its own group's table.
        """),
    *question("why is paging's waste at most one block per request?", """
        Contiguous reservation wasted most of its memory above; paging almost none. Why is paging's waste bounded by
        `block_size - 1` slots per request, whatever the output length?
        """, """
        A request takes a new block when it has filled its previous one (allocation on demand), so every block of
        its table but the last is full. So the empty slots are in the last block, at most `block_size - 1` of them.
        Contiguous reservation must hold `max_model_len` slots from the start because the output length is unknown,
        so it wastes the slots the request does not reach: `max_model_len` minus its final length.
        """),
    *question("what if block_size were 1?", """
        With `block_size = 1` there is no tail waste at all. Why does vLLM default to 16 then?
        """, """
        The block table would have one entry per token: long tables to build, copy and read every step, and attention
        kernels reading K/V in 1-token pieces scattered over memory, which wastes the memory bandwidth decode depends on.
        Larger blocks make each read a contiguous chunk and keep tables short; 16 is where the PagedAttention authors
        found the kernel efficient while the tail waste stays small (Kwon et al., section 7.2). Prefix caching also
        shares whole blocks: a shared prefix under one block long is not shared at all.
        """),
    *summary([
        "A block table maps logical KV blocks to physical ones; the slot mapping says where each new token's K/V goes.",
        "Paging allocates on demand: waste is the unfilled tail of each request's last block, vs reserving max_model_len per request.",
        "Block size trades tail waste (small blocks) against table size and kernel efficiency (large blocks); 16 is vLLM's default.",
        "Reading K/V through block tables changes no number: paged attention equals dense attention, and the engine matches transformers.",
        "Blocks also make sharing possible (prefix caching, chapter 5) and preemption cheap to express (chapter 6).",
        "GQA, MQA and MLA shrink the bytes per token, a window the tokens kept (checked: GQA caches less than MHA per token; the window keeps less of a request longer than it).",
        "With a sliding window the blocks behind the window go back to the pool: a decoding request holds at most `1 + ceil((w - 1) / block_size)` blocks, however long it runs (checked: the windowed request holds fewer blocks at the end).",
    ]),
    *glossary([
        ("PagedAttention", "分页注意力", "attention that reads K/V through block tables from a pool of fixed-size blocks"),
        ("KV block", "KV 块", "block_size token slots of K and V in every layer"),
        ("block table", "块表", "a request's logical block index -> physical block id"),
        ("slot mapping", "槽位映射", "for each new token: block_id x block_size + offset, where its K/V is written"),
        ("internal fragmentation", "内部碎片", "unused slots in a request's last block"),
        ("reservation", "预留", "memory held for tokens that may never come (contiguous allocation)"),
        ("block_size", "块大小", "tokens per KV block"),
        ("sliding window", "滑动窗口", "attention to the last w tokens only; older keys are never read again"),
        ("multi-query attention (MQA)", "多查询注意力", "all query heads share a single KV head"),
        ("multi-head latent attention (MLA)", "多头潜在注意力", "caches one compressed latent per token and layer; each head's K and V are rebuilt from it"),
    ]),
]
