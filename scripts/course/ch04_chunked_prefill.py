# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 4: chunked prefill under a token budget; chunk-size sweep; scheduling policies; Dynamic SplitFuse."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(4, "Chunked prefill and the token budget", [
        "Run the textbook case: 10 decoding requests and one long prompt, with and without 512-token chunks, and compare their TBT.",
        "Sweep the chunk size and see the trade: small chunks = smooth decodes but more overhead for the long prompt.",
        "Explain why intermediate chunks do not sample a token, from the engine's trace.",
        "Compare decode-first, prefill-first, balanced and Dynamic SplitFuse on one workload.",
    ], ["Agrawal et al., *SARATHI: Efficient LLM Inference by Piggybacking Decodes with Chunked Prefills*, 2023",
        "Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve*, OSDI 2024",
        "Holmes et al., *DeepSpeed-FastGen: High-throughput Text Generation for LLMs via MII and DeepSpeed-Inference*, 2024 (Dynamic SplitFuse)",
        "vLLM docs, *Optimization and Tuning: chunked prefill*"]),
    code(SETUP + "import math\n\nfrom minengine.workloads import SHAKESPEARE_OPENINGS\n"),
    md("""
    ## The idea
    Every step has a **token budget** (`max_num_batched_tokens`). Decodes take 1 token each; a prompt that does not
    fit in what is left is cut into **chunks** and finished over several steps (Sarathi). Each step then does a
    similar amount of work, so decoding requests keep a steady pace while the long prompt makes progress.
    `long_prefill_token_threshold` caps one request's chunk (vLLM's name).

    ## Toy: cut a prompt to fit a budget
    """),
    code("""
    def plan_steps(prompt_len, num_decoding, budget):
        \"\"\"Decode-first: each step gives every decoding request 1 token, the prompt gets the rest.\"\"\"
        steps, done = [], 0
        while done < prompt_len:
            chunk = min(prompt_len - done, budget - num_decoding)
            steps.append((num_decoding, chunk)); done += chunk
        return steps


    for decodes, chunk in plan_steps(prompt_len=1200, num_decoding=10, budget=512):
        print(f"{decodes} decode tokens + {chunk:3d}-token chunk = {decodes + chunk} tokens")
    """),
    md("""
    ## The textbook case on the real engine
    Ten requests are decoding when one long prompt arrives (8,000 tokens; 2,048 in fast mode). Without chunking the
    prompt runs in one step. With chunking it goes in chunks (512 tokens; 256 in fast mode): budget = chunk + 10 so the
    10 decodes always fit, and `long_prefill_token_threshold = chunk`. At full size the unchunked run takes a while on
    a laptop CPU: that wait is the stall every decoding request suffers.
    """),
    code("""
    LONG = pick(8000, 2048)
    CHUNK = pick(512, 256)
    NUM_DECODING = 10
    long_ids = [(17 * i) % 2000 + 3 for i in range(LONG)]


    def textbook(chunk=None, long_len=LONG, decode_tokens=None, policy="decode-first"):
        \"\"\"10 decoding requests; the long prompt arrives at step 3. chunk=None: no chunked prefill.\"\"\"
        decode_tokens = decode_tokens or pick(40, 24)
        fields = dict(model=COURSE_MODEL, max_model_len=max(long_len + 16, 512), trace_block_tables=False,
                      num_kv_blocks=(long_len + 16 * 64) // 16 + 64, scheduling_policy=policy)
        if chunk is None:
            fields.update(enable_chunked_prefill=False, max_num_batched_tokens=long_len + 16 + NUM_DECODING)
        else:
            fields.update(max_num_batched_tokens=chunk + NUM_DECODING, long_prefill_token_threshold=chunk)
        eng = LLMEngine.from_config(**fields)
        arrivals = [(0, f"dec-{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=decode_tokens, ignore_eos=True))
                    for i in range(NUM_DECODING)]
        arrivals.append((3, "long", {"prompt_token_ids": long_ids[:long_len]}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
        run_with_arrivals(eng, arrivals)
        return eng


    def decode_itls(eng):
        return sorted(x for rid, m in eng.request_metrics.items() if rid.startswith("dec") for x in m.itls)


    unchunked, chunked = textbook(None), textbook(CHUNK)
    for name, eng in (("one step", unchunked), (f"{CHUNK}-token chunks", chunked)):
        x = decode_itls(eng)
        print(f"{name:18s} decode ITL median {x[len(x) // 2] * 1000:6.1f} ms | max {x[-1] * 1000:7.1f} ms | "
              f"TTFT of the long prompt {eng.request_metrics['long'].ttft * 1000:7.0f} ms")
    """),
    code("""
    threshold = 3 * decode_itls(chunked)[len(decode_itls(chunked)) // 2]
    viz.itl_figure(unchunked.request_metrics, unchunked.traces, threshold_s=threshold).update_layout(title="Without chunked prefill").show()
    viz.itl_figure(chunked.request_metrics, chunked.traces, threshold_s=threshold).update_layout(title=f"Chunked prefill, {CHUNK}-token chunks").show()
    viz.batch_composition_figure(chunked.traces).show()
    """),
    code("""
    u, c = decode_itls(unchunked), decode_itls(chunked)
    t_one, t_chunked = unchunked.request_metrics["long"].ttft, chunked.request_metrics["long"].ttft
    why = ("chunking costs the long prompt latency: each chunk re-reads the K/V of the chunks before it and shares its step with the decodes"
           if t_chunked > t_one else
           "on this CPU the one huge step was even slower than the chunks together (see chapter 1's step-time curve); on a GPU chunking usually costs the long prompt a little")
    show(f"Chunking the {LONG:,}-token prompt cut the worst decode gap from **{u[-1] * 1000:.0f} ms** to **{c[-1] * 1000:.0f} ms**; "
         f"the long prompt's own TTFT went from {t_one * 1000:.0f} ms to {t_chunked * 1000:.0f} ms: {why}.")
    """),
    md("""
    ## Why intermediate chunks do not sample
    A chunk that does not reach the end of the prompt has no next token to produce: the token after position `p`
    is already known (it is the prompt's token `p + 1`). So only the **last** chunk samples. The engine computes
    logits only for sampling rows (`ForwardBatch.logits_indices`), so intermediate chunks cost no LM-head work either.
    """),
    code("""
    long_chunks = [(t.step, ch) for t in chunked.traces for ch in t.chunks if ch.request_id == "long" and ch.is_prefill]
    for step, ch in long_chunks:
        print(f"step {step:3d}: positions {ch.start_pos:5d}..{ch.start_pos + ch.num_tokens - 1:5d}  sampled={ch.sampled}")
    """),
    md("""
    ## Chunk-size sweep: overhead vs smoothness
    Smaller chunks keep each step short (smooth decodes), but the prompt needs more steps, each with its fixed costs
    and each re-reading all earlier K/V of the prompt, so it finishes later. Sarathi-Serve picks the chunk from the
    TBT SLO the deployment must meet.
    """),
    code("""
    SWEEP_LEN = pick(2048, 1024)
    chunk_sizes = pick([64, 128, 256, 512, 1024], [64, 256, 1024])
    sweep = {}
    for size in chunk_sizes:
        eng = textbook(size, long_len=SWEEP_LEN, decode_tokens=pick(40, 20))
        x = decode_itls(eng)
        sweep[size] = (x[-1], eng.request_metrics["long"].ttft)
    fig = go.Figure([go.Scatter(x=chunk_sizes, y=[v[0] * 1000 for v in sweep.values()], name="worst decode ITL (ms)", mode="lines+markers"),
                     go.Scatter(x=chunk_sizes, y=[v[1] * 1000 for v in sweep.values()], name="TTFT of the long prompt (ms)", mode="lines+markers", yaxis="y2")])
    fig.update_layout(title=f"Chunk size sweep ({SWEEP_LEN}-token prompt, 10 decoding requests)",
                      xaxis=dict(title="chunk size (tokens)", type="log"), yaxis=dict(title="worst decode ITL (ms)"),
                      yaxis2=dict(title="long prompt TTFT (ms)", overlaying="y", side="right"))
    fig.show()
    """),
    md("""
    ## Try it: chunk size vs TBT
    Move the slider and press *Run*: the textbook case runs again with that chunk size and redraws the ITL plot.
    """),
    code("""
    import ipywidgets as widgets


    def redraw(chunk=CHUNK):
        eng = textbook(chunk, long_len=SWEEP_LEN, decode_tokens=pick(40, 20))
        viz.itl_figure(eng.request_metrics, eng.traces, threshold_s=threshold).update_layout(title=f"{chunk}-token chunks").show()


    widgets.interact_manual(redraw, chunk=widgets.SelectionSlider(options=[32, 64, 128, 256, 512, 1024, 2048], value=CHUNK))
    """),
    md("""
    ## Who goes first? Scheduling policies
    The budget is fixed; the policy decides its order (`EngineConfig(scheduling_policy=...)`):
    - **decode-first** (vLLM v1, Sarathi-Serve's stall-free batching): running requests first, new prompts get the rest. Protects TPOT.
    - **prefill-first** (vLLM v0 default, Orca-like): new prompts first, decodes fill what is left. Good TTFT, stalls decodes.
    - **balanced**: the budget split by `prefill_decode_ratio` between the two.
    - **dynamic-splitfuse** (DeepSpeed-FastGen): every forward aims at the same size `splitfuse_target_tokens`; prefill chunks take exactly what decodes leave.

    Workload: 8 decoding requests while 4 prompts arrive one after another, budget 256 tokens.
    """),
    code("""
    def policy_run(policy):
        try:
            eng = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=256, scheduling_policy=policy,
                                        trace_block_tables=False)
        except (TypeError, ValueError) as err:   # engines without this policy
            print(f"{policy}: not available in this engine ({err})")
            return None
        arrivals = [(0, f"dec-{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=pick(40, 24), ignore_eos=True)) for i in range(8)]
        arrivals += [(2 + 3 * j, f"prompt-{j}", {"prompt_token_ids": long_ids[j * 7: j * 7 + pick(600, 300)]},
                      SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)) for j in range(4)]
        run_with_arrivals(eng, arrivals)
        return eng


    policy_rows = {}
    for policy in ["decode-first", "prefill-first", "balanced", "dynamic-splitfuse"]:
        eng = policy_run(policy)
        if eng is None:
            continue
        x = decode_itls(eng)
        ttfts = [m.ttft for rid, m in eng.request_metrics.items() if rid.startswith("prompt")]
        policy_rows[policy] = dict(p99_itl_ms=1000 * x[min(len(x) - 1, int(0.99 * len(x)))], max_itl_ms=1000 * x[-1],
                                   mean_prompt_ttft_ms=1000 * sum(ttfts) / len(ttfts), steps=len(eng.traces))
    for policy, row in policy_rows.items():
        print(f"{policy:18s} " + " | ".join(f"{k} {v:8.1f}" for k, v in row.items()))
    """),
    code("""
    if policy_rows:
        fig = go.Figure([go.Bar(name="decode P99 ITL (ms)", x=list(policy_rows), y=[r["p99_itl_ms"] for r in policy_rows.values()]),
                         go.Bar(name="mean prompt TTFT (ms)", x=list(policy_rows), y=[r["mean_prompt_ttft_ms"] for r in policy_rows.values()])])
        fig.update_layout(barmode="group", title="Scheduling policy: decode smoothness vs prompt latency", yaxis_title="ms")
        fig.show()
    """),
    *exercise(1, """
        The long prompt of the chunked textbook run has `LONG` tokens and chunks of `CHUNK` tokens. In how many steps was it
        prefilled? Give a formula, the check counts the chunks in the trace.
        """, "ceil(LONG / CHUNK).", "answer_1",
        "answer_1 = math.ceil(LONG / CHUNK)",
        """
        check("Exercise 1: number of chunks", answer_1, len(long_chunks))
        """),
    *exercise(2, """
        How many of those chunks sampled a token? And at which position does the sampling chunk end (its last position)?
        Answer `(number_sampled, last_position)`.
        """, "Only the chunk that reaches the end of the prompt samples.", "answer_2",
        "answer_2 = (1, LONG - 1)",
        """
        sampled = [ch for _, ch in long_chunks if ch.sampled]
        check("Exercise 2: which chunks sample", answer_2, (len(sampled), sampled[-1].start_pos + sampled[-1].num_tokens - 1))
        """),
    *exercise(3, """
        Decode-first, budget `max_num_batched_tokens = 512`, no `long_prefill_token_threshold`, 10 requests decoding. How many
        prompt tokens fit in a step next to the decodes? The check runs it and reads the largest chunk.
        """, "Each decoding request takes 1 token of the budget.", "answer_3",
        "answer_3 = 512 - 10",
        """
        eng3 = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=512, trace_block_tables=False)
        arr = [(0, f"d{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)) for i in range(10)]
        run_with_arrivals(eng3, arr + [(3, "p", {"prompt_token_ids": long_ids[:1500]}, SamplingParams(temperature=0.0, max_tokens=1))])
        mixed = [ch.num_tokens for t in eng3.traces if t.num_decode_tokens == 10 for ch in t.chunks if ch.request_id == "p"]
        check("Exercise 3: prefill tokens next to 10 decodes", answer_3, max(mixed))
        """),
    *summary([
        "Chunked prefill splits a long prompt over several steps under the token budget, so decodes keep a steady pace (no generation stall).",
        "Chunk size trades decode smoothness (small chunks) against the long prompt's TTFT and per-step overhead (large chunks).",
        "Only the chunk that reaches the end of the known tokens samples; intermediate chunks skip the LM head.",
        "The policy orders the budget: decode-first protects TPOT, prefill-first favours TTFT, balanced splits, Dynamic SplitFuse keeps forward size constant.",
    ]),
    *glossary([
        ("chunked prefill", "分块预填充", "splitting a prompt's prefill over several steps"),
        ("token budget (`max_num_batched_tokens`)", "令牌预算", "most tokens (prefill + decode) per step"),
        ("chunk", "块 / 分块", "the part of a prompt computed in one step"),
        ("stall-free batching", "无停顿批处理", "decodes first, prefill chunks fill the rest (Sarathi-Serve)"),
        ("Dynamic SplitFuse", "动态拆分融合", "constant forward size: split long prompts, fuse short ones (DeepSpeed-FastGen)"),
        ("decode-first / prefill-first", "解码优先 / 预填充优先", "which kind of work gets the budget first"),
        ("TBT / ITL", "令牌间隔", "time between two output tokens of one request"),
    ]),
]
