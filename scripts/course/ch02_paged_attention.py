# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 2: PagedAttention: block tables, slot mapping, memory waste, paged == dense attention."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(2, "PagedAttention: block tables and slot mapping", [
        "Explain how a block table maps a request's logical KV blocks to physical blocks, and compute a slot mapping.",
        "Measure, on a real prompt workload, the KV memory wasted by max-length contiguous reservation vs paging.",
        "See why block size trades internal fragmentation against table size and kernel efficiency.",
        "Show that attention read through block tables equals dense attention (and the engine matches transformers).",
    ], ["Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention*, SOSP 2023, sections 3-4",
        "vLLM docs, *Paged Attention* design page", "MT-Bench (Zheng et al., NeurIPS 2023) and Arena-Hard prompts"]),
    code(SETUP + "import math\n\nimport torch\n"),
    md("""
    ## The problem
    Before PagedAttention, serving systems reserved one contiguous KV region per request, as long as the longest
    the request *might* grow (`max_model_len`), because the output length is unknown up front. Kwon et al. (SOSP'23,
    Fig. 2) measured that such systems kept actual token states in only about 20-40 % of their KV memory; the rest
    was reserved-but-unused space and fragmentation. The fix borrows virtual memory's idea: split the cache into
    fixed-size **blocks** of `block_size` tokens, give each request a **block table** (logical block i -> physical
    block id), and allocate a block only when the request fills the previous one.
    """),
    md("## Toy: a block allocator in ten lines"),
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
    Three requests of different lengths; `trace_block_tables=True` records each step's tables and ref counts.
    """),
    code("""
    from minengine.workloads import SHAKESPEARE_OPENINGS

    engine = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, num_kv_blocks=32, max_num_batched_tokens=256,
                                   enable_prefix_caching=False, trace_block_tables=True)
    for i, prompt in enumerate(SHAKESPEARE_OPENINGS[:3]):
        engine.add_request(f"req-{i}", prompt * (i + 1), SamplingParams(temperature=0.0, max_tokens=pick(24, 12), ignore_eos=True))
    run_to_completion(engine)
    snapshot = max(engine.traces, key=lambda t: len(t.block_tables or {}))   # the busiest step
    viz.block_tables_figure(snapshot).show()
    viz.block_pool_figure(snapshot).show()
    """),
    code("""
    rid, table = next(iter(snapshot.block_tables.items()))
    bs = engine.config.block_size
    chunk = next(c for c in snapshot.chunks if c.request_id == rid)
    positions = range(chunk.start_pos, chunk.start_pos + chunk.num_tokens)
    slot_mapping = [table[p // bs] * bs + p % bs for p in positions]
    show(f"At step {snapshot.step}, `{rid}` holds physical blocks {table}. It computed positions "
         f"{chunk.start_pos}..{chunk.start_pos + chunk.num_tokens - 1}, written to slots {slot_mapping[:8]}"
         f"{' ...' if len(slot_mapping) > 8 else ''}.")
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
    stored, paged, contiguous = (sum(col) for col in zip(*rows))
    fig = go.Figure([go.Scatter(y=[r[i] for r in rows], name=name, mode="lines")
                     for i, name in enumerate(["tokens stored", "paged: slots held (block_size 16)", "contiguous: slots reserved"])])
    fig.update_layout(title="KV slots per step", xaxis_title="step", yaxis=dict(title="KV slots (tokens)", type="log"))
    fig.show()
    show(f"Over {len(rows)} steps with {len(prompts)} real prompts: contiguous reservation used **{stored / contiguous:.1%}** "
         f"of what it reserved; paging used **{stored / paged:.1%}** of what it held (the rest is the unfilled tail "
         f"of each request's last block).")
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
    """),
    *exercise(1, """
        Request `rid` (above) has block table `table_of_rid = snapshot.block_tables[rid]`. With `block_size = 16`, in
        which **slot** is the K/V of its token at position 20 stored?
        """, "Position 20 is in logical block 20 // 16 = 1, at offset 20 % 16 = 4.", "answer_1",
        "table_of_rid = snapshot.block_tables[rid]\nanswer_1 = table_of_rid[20 // 16] * 16 + 20 % 16",
        """
        assert len(snapshot.block_tables[rid]) >= 2, "needs a request with at least two blocks"
        check("Exercise 1: slot of position 20", answer_1, snapshot.block_tables[rid][1] * bs + 4)
        """),
    *exercise(2, """
        A request has a 100-token prompt and generates 30 tokens (`block_size = 16`). During its **last** step, how many
        of its tokens have K/V in the cache, and how many blocks does it hold? Answer `(tokens, blocks)`.
        """, """
        The last step computes the K/V of the 129th token and samples the 130th, whose K/V is never needed.
        """, "answer_2",
        "answer_2 = (100 + 30 - 1, math.ceil((100 + 30 - 1) / 16))",
        """
        eng2 = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, trace_block_tables=True)
        eng2.add_request("x", {"prompt_token_ids": [5] * 100}, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
        run_to_completion(eng2)
        last = eng2.traces[-1]
        check("Exercise 2: tokens cached and blocks held in the last step", answer_2,
              (last.chunks[0].start_pos + last.chunks[0].num_tokens, len(last.block_tables["x"])))
        """),
    *exercise(3, """
        Using `final_lens` (the final lengths of the workload above), what fraction of the slots held by a paged cache
        with `block_size = 64` is wasted? Answer a number between 0 and 1.
        """, "Each request holds ceil(n / 64) x 64 slots; waste = 1 - stored / held.", "answer_3",
        "answer_3 = 1 - sum(final_lens) / sum(math.ceil(n / 64) * 64 for n in final_lens)",
        """
        check_close("Exercise 3: waste at block_size 64", answer_3, tail_waste(64), rel_tol=0.01)
        """),
    *summary([
        "A block table maps logical KV blocks to physical ones; the slot mapping says where each new token's K/V goes.",
        "Paging allocates on demand: waste is only the unfilled tail of each request's last block, vs reserving max_model_len per request.",
        "Block size trades tail waste (small blocks) against table size and kernel efficiency (large blocks); 16 is vLLM's default.",
        "Reading K/V through block tables changes no number: paged attention equals dense attention, and the engine matches transformers.",
        "Blocks also make sharing possible (prefix caching, chapter 5) and preemption cheap to express (chapter 6).",
    ]),
    *glossary([
        ("PagedAttention", "分页注意力", "attention that reads K/V through block tables from a pool of fixed-size blocks"),
        ("KV block", "KV 块", "block_size token slots of K and V in every layer"),
        ("block table", "块表", "a request's logical block index -> physical block id"),
        ("slot mapping", "槽位映射", "for each new token: block_id x block_size + offset, where its K/V is written"),
        ("internal fragmentation", "内部碎片", "unused slots in a request's last block"),
        ("reservation", "预留", "memory held for tokens that may never come (contiguous allocation)"),
        ("block_size", "块大小", "tokens per KV block"),
    ]),
]
