# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 6: admission and preemption: the two budgets, the admission probe, recompute vs swap, victims."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(6, "Admission and preemption", [
        "Name the two budgets every step must respect (tokens and KV blocks, plus sequence slots) and when a request is admitted.",
        "Watch KV memory run out: which running request becomes the victim, and how it is re-queued at the head.",
        "Compare preemption by recompute and by swap; see the admission probe shrink a chunk until it fits.",
        "Check that preemption does not change the output (greedy and seeded sampling).",
    ], ["Kwon et al., PagedAttention, SOSP 2023, sections 4.5 and 7.3 (swapping vs recomputation)",
        "vLLM docs, *Optimization and Tuning: preemption*", "Yu et al., Orca, OSDI 2022",
        "Agrawal et al., Sarathi-Serve, OSDI 2024"]),
    code(SETUP + "import math\n\nfrom minengine.workloads import SHAKESPEARE_OPENINGS\n"),
    md("""
    ## Two budgets
    A step can only run what fits in **both** budgets:
    - the **token budget** `max_num_batched_tokens` (compute per step), and the **sequence slots** `max_num_seqs`;
    - the **KV block budget**: the free blocks of the pool. A request's next tokens need slots; crossing a block
      boundary needs a new block.

    A waiting request is **admitted** only when its first chunk gets both tokens and blocks. A *running* request that
    needs a block when none is free forces a **preemption**: some running request (the **victim**) gives its blocks back.

    ## Toy: admission with a probe
    """),
    code("""
    def admit(prompt_len, token_budget_left, free_blocks, block_size=16, shrink=True):
        \"\"\"Chunk size to admit now (0 = wait). With `shrink`, cut the chunk to the blocks that are free.\"\"\"
        chunk = min(prompt_len, token_budget_left)
        if math.ceil(chunk / block_size) <= free_blocks:
            return chunk
        return min(chunk, free_blocks * block_size) if shrink else 0


    for free in (10, 3, 0):
        print(f"{free:2d} free blocks: admit {admit(300, 256, free, shrink=False):3d} tokens without probe, "
              f"{admit(300, 256, free):3d} with the probe")
    """),
    md("""
    ## Running out of KV memory on the real engine
    A few requests with short prompts that each want many output tokens (sizes in the cell), in a pool too small to
    hold them all at full length. They are all admitted (their prompts fit), then grow until the pool is exhausted.
    """),
    code("""
    def pressure_run(num_kv_blocks, preemption_mode="recompute", n=pick(8, 6), out_len=pick(64, 40), **extra):
        eng = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=512,
                                    preemption_mode=preemption_mode, enable_prefix_caching=False, trace_block_tables=True, **extra)
        for i in range(n):
            eng.add_request(f"r{i}", {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(48)]},
                            SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True))
        outs = run_to_completion(eng)
        return eng, {rid: o.outputs[0].token_ids for rid, o in outs.items()}


    SMALL_POOL = pick(20, 16)
    small, small_tokens = pressure_run(SMALL_POOL)
    roomy, roomy_tokens = pressure_run(256)
    viz.kv_usage_figure(small.traces).show()
    viz.queue_figure(small.traces).show()
    s = small.summary()
    show(f"With {SMALL_POOL} blocks ({SMALL_POOL * 16} token slots) the run had **{s.num_preemptions} preemptions**; "
         f"with 256 blocks, {roomy.summary().num_preemptions}. Peak blocks used: {s.peak_kv_blocks_used} of {SMALL_POOL}.")
    """),
    md("""
    ## Who is the victim, and where does it go?
    The default policy preempts the **most recently admitted** running request (vLLM v1): it has the least work to lose
    and the oldest requests keep their progress. The victim goes to the **front** of the waiting queue, so it is the
    first to be re-admitted when memory frees up (otherwise it could starve behind newcomers).
    """),
    code("""
    admitted_order = []
    events = []
    for t in small.traces:
        for rid in t.preempted_ids:
            running_before = [r for r in admitted_order]
            events.append((t.step, rid, running_before[-1] if running_before else None))
            admitted_order.remove(rid)
        for rid in t.admitted_ids:
            admitted_order.append(rid)
        for rid in t.finished_ids:
            if rid in admitted_order:
                admitted_order.remove(rid)
    for step, victim, newest in events[:6]:
        readmit = next((t.step for t in small.traces if t.step > step and victim in t.admitted_ids), None)
        print(f"step {step:3d}: preempted {victim} (most recently admitted was {newest}); re-admitted at step {readmit}")
    """),
    md("""
    ## Output unchanged after preemption
    Recompute preemption forgets the K/V but keeps the generated tokens; re-admission prefills prompt + output so far,
    and decoding continues where it stopped. Greedy decoding must give the same tokens as the roomy run; so must seeded
    sampling, because the engine draws token *i* of a seeded request from a generator seeded by `(seed, i)`.
    """),
    code("""
    greedy_same = small_tokens == roomy_tokens
    seeded = {}
    for blocks in (SMALL_POOL, 256):
        eng = LLMEngine.from_config(model=COURSE_MODEL, num_kv_blocks=blocks, enable_prefix_caching=False)
        for i in range(pick(8, 6)):
            eng.add_request(f"s{i}", {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(48)]},
                            SamplingParams(temperature=1.0, seed=100 + i, max_tokens=pick(64, 40), ignore_eos=True))
        seeded[blocks] = {rid: o.outputs[0].token_ids for rid, o in run_to_completion(eng).items()}
        if blocks == SMALL_POOL:
            seeded_preemptions = eng.summary().num_preemptions
    seeded_same = seeded[SMALL_POOL] == seeded[256]
    show(f"Greedy outputs identical with and without preemption: **{greedy_same}**. Seeded sampling "
         f"({seeded_preemptions} preemptions): **{seeded_same}**.")
    """),
    md("""
    ## Recompute vs swap
    **Recompute** frees the victim's blocks and later prefills its tokens again: costs compute. **Swap** copies the
    blocks to CPU memory and back: costs transfer bandwidth, and CPU memory (`swap_space_blocks`). The PagedAttention
    paper (section 7.3, Fig. 19) measured swap losing for small blocks (many small PCIe transfers), winning for large
    ones, and the two comparable at 16-64 tokens per block; vLLM v1 only recomputes. On a CPU the "copy" is within the same memory, so swap looks cheaper here than
    across PCIe.
    """),
    code("""
    def preemption_cost(eng):
        prompt = sum(m.num_prompt_tokens for m in eng.request_metrics.values())
        computed = sum(t.num_prefill_tokens for t in eng.traces)
        return computed - prompt          # prefill tokens computed beyond each prompt once = recomputed tokens


    modes = {}
    for mode in ("recompute", "swap"):
        try:
            eng, tokens = pressure_run(SMALL_POOL, preemption_mode=mode)
        except (TypeError, ValueError) as err:
            print(f"{mode}: not available in this engine ({err})")
            continue
        s = eng.summary()
        modes[mode] = eng
        print(f"{mode:9s}: preemptions {s.num_preemptions:3d} | recomputed tokens {preemption_cost(eng):5d} | "
              f"swapped out/in blocks {getattr(s, 'num_swapped_out_blocks', 0)}/{getattr(s, 'num_swapped_in_blocks', 0)} | "
              f"duration {s.duration_s:.2f} s | same output {tokens == roomy_tokens}")
    """),
    md("""
    ## The admission probe
    With `shrink_prefill_chunks=True`, a new prompt whose chunk needs more blocks than are free is admitted with a
    smaller chunk (down to one block) instead of waiting for a whole chunk's worth of memory.
    """),
    code("""
    def probe_run(shrink):
        try:
            eng = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, num_kv_blocks=40, max_num_batched_tokens=512,
                                        shrink_prefill_chunks=shrink, enable_prefix_caching=False, trace_block_tables=False)
        except (TypeError, ValueError) as err:
            print(f"admission probe not available in this engine ({err})")
            return None
        arrivals = [(0, f"d{i}", {"prompt_token_ids": [(3 * i + k) % 2000 + 3 for k in range(100)]},
                     SamplingParams(temperature=0.0, max_tokens=pick(40, 24), ignore_eos=True)) for i in range(4)]
        arrivals.append((2, "big", {"prompt_token_ids": [(5 * k) % 2000 + 3 for k in range(400)]}, SamplingParams(temperature=0.0, max_tokens=2)))
        run_with_arrivals(eng, arrivals)
        first = next(t for t in eng.traces if "big" in t.admitted_ids)
        return first.step, next(c.num_tokens for c in first.chunks if c.request_id == "big"), eng.request_metrics["big"].ttft


    probe_results = {shrink: probe_run(shrink) for shrink in (False, True)}
    for shrink, r in probe_results.items():
        if r:
            print(f"shrink_prefill_chunks={shrink!s:5s}: 'big' admitted at step {r[0]} with a {r[1]}-token first chunk, TTFT {r[2] * 1000:.0f} ms")
    """),
    code("""
    if all(probe_results.values()):
        (s0, _, t0), (s1, c1, t1) = probe_results[False], probe_results[True]
        show(f"The probe let the big prompt start **{s0 - s1} steps earlier** with a {c1}-token chunk. Its TTFT went from "
             f"{t0 * 1000:.0f} ms to {t1 * 1000:.0f} ms: starting early helps only if the rest of the prompt finds blocks soon; "
             f"a started prompt also holds blocks the running requests may need (more preemption risk).")
    """),
    md("## Try it: pool size vs preemptions"),
    code("""
    import ipywidgets as widgets


    def pool(num_kv_blocks=SMALL_POOL, preemption_mode="recompute"):
        eng, tokens = pressure_run(num_kv_blocks, preemption_mode=preemption_mode)
        s = eng.summary()
        print(f"{num_kv_blocks} blocks, {preemption_mode}: {s.num_preemptions} preemptions, TPOT P99 {s.tpot_p99 * 1000:.1f} ms, "
              f"output identical to the roomy run: {tokens == roomy_tokens}")
        viz.kv_usage_figure(eng.traces).show()


    widgets.interact_manual(pool, num_kv_blocks=widgets.IntSlider(value=SMALL_POOL, min=8, max=64),
                            preemption_mode=widgets.Dropdown(options=["recompute", "swap"]))
    """),
    *exercise(1, """
        `block_size = 16`. A waiting request has a 100-token prompt and the token budget lets it run in one chunk. How many
        free KV blocks does its admission need? The check admits it on the engine and reads its block table.
        """, "ceil(prompt / block_size).", "answer_1",
        "answer_1 = math.ceil(100 / 16)",
        """
        e1 = LLMEngine.from_config(model=COURSE_MODEL, block_size=16, enable_prefix_caching=False, trace_block_tables=True)
        e1.add_request("x", {"prompt_token_ids": [9] * 100}, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(e1)
        check("Exercise 1: blocks to admit", answer_1, len(e1.traces[0].block_tables["x"]))
        """),
    *exercise(2, """
        Predict the first victim of the small-pool run **without** reading `preempted_ids`: replay the trace up to the step of
        the first preemption and take the most recently admitted request that is still running. Store its id.
        """, "Walk `small.traces`: append `admitted_ids`, remove `finished_ids`, stop at the first step with `preempted_ids`.", "answer_2",
        """
        running = []
        for t in small.traces:
            if t.preempted_ids:
                break
            running += t.admitted_ids
            running = [r for r in running if r not in t.finished_ids]
        answer_2 = running[-1]
        """,
        """
        first_preemption = next(t for t in small.traces if t.preempted_ids)
        check("Exercise 2: the first victim", answer_2, first_preemption.preempted_ids[0])
        """),
    *exercise(3, """
        With recompute preemption, does a preempted greedy request produce exactly the same tokens as without preemption?
        Answer `True` or `False`.
        """, "What is kept and what is recomputed? Is recomputed K/V different from the original?", "answer_3",
        "answer_3 = True",
        """
        check("Exercise 3: output unchanged", answer_3, small_tokens == roomy_tokens and small.summary().num_preemptions > 0)
        """),
    *summary([
        "A step runs only what fits the token budget, the sequence slots and the free KV blocks; admission asks for all three.",
        "When a running request needs a block and none is free, the most recently admitted running request is preempted and re-queued at the head.",
        "Recompute frees blocks and prefills again (compute); swap copies blocks out and back (bandwidth, CPU memory).",
        "The admission probe shrinks a new prompt's chunk to the free blocks instead of leaving it waiting.",
        "Preemption never changes the output: generated tokens are kept, and seeded sampling depends only on (seed, token index).",
    ]),
    *glossary([
        ("admission", "准入", "moving a waiting request into the running batch"),
        ("preemption", "抢占", "taking a running request's KV blocks back"),
        ("victim", "牺牲者", "the request chosen to be preempted"),
        ("recompute", "重算", "preemption by freeing K/V and prefilling again"),
        ("swap", "换出 / 换入", "preemption by copying K/V to CPU memory and back"),
        ("KV block budget", "KV 块预算", "the free blocks of the pool"),
        ("admission probe", "准入探测", "shrinking a new chunk until its blocks fit"),
        ("sequence slot", "序列槽位", "one place among `max_num_seqs` running requests"),
    ]),
]
