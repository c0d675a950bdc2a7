# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 8: interview walkthrough: common questions, crisp answers, each linked to the experiment that shows it."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

QA = [
    ("Continuous batching vs chunked prefill: what is the difference?",
     "Continuous (iteration-level) batching rebuilds the batch every step, so finished requests leave and new ones join at once (Orca). "
     "Chunked prefill splits a long prompt over several steps under a token budget, so a new prompt does not stall the decodes it joins (Sarathi). "
     "The first removes idle slots; the second removes the stall the first introduces.",
     "Chapter 3 (static vs continuous, the stall), chapter 4 (the textbook case)"),
    ("How do you choose the token budget (`max_num_batched_tokens`)?",
     "From the TBT SLO: the budget bounds the work in one step, hence the worst gap between a decode's tokens. Larger budgets raise throughput "
     "(fewer steps for prefill, chunks above the ridge point) until the step time breaks the P99 TBT SLO. Keep prefill chunks at 512 tokens or more "
     "on an H100-class GPU, pick the largest budget whose full step fits the SLO, and benchmark it; keep headroom for the decodes (budget >= "
     "max_num_seqs). vLLM's defaults: 8,192 (server) / 16,384 (offline) on H100-class GPUs, 2,048 / 8,192 elsewhere. Check first that the slots "
     "(`max_num_seqs`) are not the real limit.",
     "Chapter 1 (step time vs tokens), chapter 4 (chunk sweep, vLLM's defaults), chapter 7 (slots), the experiment below"),
    ("Why does a scheduler need both a token budget and a KV block budget?",
     "The token budget bounds the compute of a step (its latency); the KV budget is the memory that holds every running request's context. Check "
     "only tokens and a step can need more blocks than exist (out of memory mid-step); check only blocks and a step can be as large as the pool "
     "allows (a huge stall), and without preemption the engine gets stuck when every running request needs a block. A real scheduler checks both, "
     "plus sequence slots, and preempts when blocks run out.",
     "Chapter 6 (the two toy schedulers beside the real one)"),
    ("Total tok/s went up but P99 TPOT got worse. What do you check?",
     "Step composition (are prefill chunks eating bigger budgets?), the ITL tail and the steps that caused it, whether running requests sit at "
     "max_num_seqs (then slots, not the budget, limit you), preemptions and KV usage, fairness (who gained and who paid: TPOT spread across users), "
     "output backlog (is decode work piling up?), and whether the workload itself shifted.",
     "Chapter 7 (the budget experiment)"),
    ("Which scheduling policy would you pick for a product?",
     "It depends on whom the business favours: real-time chat wants smooth streams (decode-first, lowest P99 ITL); RAG or batch jobs want prompts "
     "through (prefill-first: lower TTFT, higher throughput for a burst); a multi-tenant service with paying users wants priority (with aging); "
     "round-robin keeps one long prompt from starving another.",
     "Chapter 7 (each choice backed by a run), chapter 4 (policies on a contended budget)"),
    ("Recompute or swap on preemption?",
     "Recompute frees the KV and prefills prompt + generated tokens again: costs compute, no extra memory, simple; good when sequences are short "
     "and prefill is fast. Swap copies blocks to host memory and back: costs PCIe bandwidth and host memory; better for long sequences and large "
     "blocks. vLLM v1 only recomputes. Either way the output must not change.",
     "Chapter 6 (recompute vs swap, output unchanged)"),
    ("What block size?",
     "Small blocks waste less memory (only the last block is partly empty) and share prefixes at a finer grain; large blocks mean shorter "
     "block tables and more efficient kernel memory access. 16 tokens is vLLM's default on GPUs.",
     "Chapter 2 (waste vs block size)"),
    ("How does prefix caching work, and when does it not help?",
     "Each full block is named by a chained hash of its tokens and all before; a new request takes matching blocks (ref count +1) instead of "
     "recomputing. Freed blocks stay cached until evicted, least recently used first. It does not help when prompts share nothing, when the "
     "shared part is shorter than a block, or when memory pressure evicts prefixes before they are reused.",
     "Chapter 5 (multi-turn chat, hit rate vs TTFT, LRU slider)"),
    ("Why disaggregate prefill and decode?",
     "Prefill is compute-bound, decode memory-bound; in one batch they interfere (prefills stall decodes, decodes slow prefills) and share one "
     "parallelism setting. Disaggregation runs them on separate GPUs and ships the KV cache between them (DistServe OSDI'24, Splitwise ISCA'24, "
     "Mooncake FAST'25), tuning each for its SLO (TTFT vs TPOT) at the price of KV transfer.",
     "Chapter 1 (the asymmetry), chapter 4 (interference in one batch)"),
    ("What do you alert on?",
     "User-facing: P99 TTFT, P99 ITL/TPOT, SLO attainment (goodput / throughput), error, timeout and abort rates. Leading indicators: waiting "
     "queue length and time in queue, KV cache usage, preemption rate, prefix-cache hit rate, tokens per step vs budget.",
     "Chapter 7 (goodput, queue, utilization), chapter 6 (preemptions)"),
    ("Design an inference scheduler.",
     "Per step: a token budget from the TBT SLO; decodes first (TPOT), then prefill chunks of running requests, then admission of waiting "
     "requests (FCFS or priority with aging for fairness) while budget, sequence slots and KV blocks last; an admission probe that shrinks a chunk "
     "to free memory; preemption of the newest running request not yet scheduled this step (recompute, re-queued at the head) when a running "
     "request needs a block; "
     "prefix caching with ref-counted blocks and LRU eviction; stream tokens as they are sampled; enforce deadlines and aborts; measure "
     "TTFT/ITL per request and watch goodput against the SLO.",
     "Every chapter: 3 (iteration-level), 4 (budget, policies), 5 (cache), 6 (admission, preemption), 7 (SLOs, priority, cancellation)"),
]

CELLS = [
    *header(8, "Interview walkthrough", [
        "Answer the common LLM-serving interview questions crisply, with a number from this course behind each answer.",
        "Tie each answer to the experiment that shows it, and re-run one live (the token budget).",
        "Check yourself with a short quiz whose answers are verified by running the engine.",
    ], ["Yu et al., Orca, OSDI 2022", "Kwon et al., PagedAttention, SOSP 2023", "Agrawal et al., Sarathi-Serve, OSDI 2024",
        "Holmes et al., DeepSpeed-FastGen, 2024", "Zheng et al., SGLang / RadixAttention, 2024", "Zhong et al., DistServe, OSDI 2024",
        "Patel et al., Splitwise, ISCA 2024", "Qin et al., Mooncake, FAST 2025", "vLLM docs (docs.vllm.ai)"]),
    code(SETUP + "import math\n\nfrom minengine.workloads import SHAKESPEARE_OPENINGS\n"),
    md("## Questions and answers\nRead the question, answer aloud in two sentences, then open the model answer."),
    *[cell for i, (q, a, where) in enumerate(QA)
      for cell in question(f"Q{i + 1}. {q}", "Answer aloud in two sentences, then compare.", f"{a}\n\n**Shown in:** {where}.")],
    md("""
    ## Live: choose a token budget
    The same mixed workload (8 decoding requests, prompts of a few hundred tokens arriving) under several budgets, on the
    modelled clock (H100, Llama-3-8B shapes). Each budget gives a step-time tail (the worst ITL a decode sees) and a
    throughput. Pick the largest budget whose P99 ITL meets your SLO.
    """),
    code("""
    def mixed(budget):
        eng = modelled_engine(max_num_batched_tokens=budget, trace_block_tables=False)
        arrivals = [(0, f"dec-{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=pick(48, 24), ignore_eos=True)) for i in range(8)]
        arrivals += [(2 + 2 * j, f"p{j}", {"prompt_token_ids": [(13 * k + j) % 2000 + 3 for k in range(pick(600, 300))]},
                      SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)) for j in range(pick(6, 3))]
        run_with_arrivals(eng, arrivals)
        s = eng.summary()
        return dict(itl_p99_ms=s.itl_p99 * 1000, total_tok_s=s.total_tok_s, steps=s.num_steps, engine=eng)


    budgets = pick([32, 64, 128, 256, 512, 1024], [32, 128, 512])
    budget_rows = {b: mixed(b) for b in budgets}
    for b, r in budget_rows.items():
        print(f"budget {b:5d}: P99 ITL {r['itl_p99_ms']:7.1f} ms | total {r['total_tok_s']:7.0f} tok/s | {r['steps']} steps")
    fig = go.Figure([go.Scatter(x=budgets, y=[r["itl_p99_ms"] for r in budget_rows.values()], name="P99 ITL (ms)", mode="lines+markers"),
                     go.Scatter(x=budgets, y=[r["total_tok_s"] for r in budget_rows.values()], name="total tok/s", yaxis="y2", mode="lines+markers")])
    titled(fig, "Token budget: tail latency vs throughput")
    fig.update_layout(xaxis=dict(title="max_num_batched_tokens (tokens)", type="log"),
                      yaxis_title="P99 ITL (ms)", yaxis2=dict(title="total tokens/s", overlaying="y", side="right"),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0))   # below the plot, clear of the right axis
    fig.show()
    largest = budget_rows[budgets[-1]]["engine"]
    titled(viz.itl_figure(largest.request_metrics, largest.traces, threshold_s=budget_rows[budgets[0]]["itl_p99_ms"] / 1000),
           f"budget {budgets[-1]}: gaps above the smallest budget's P99 ITL, and their causes").show()
    """),
    conclusion("""
    itl = [budget_rows[b]["itl_p99_ms"] for b in budgets]
    tps = [budget_rows[b]["total_tok_s"] for b in budgets]
    conclude(f"From budget {budgets[0]} to {budgets[-1]} the P99 ITL grew from **{itl[0]:.1f} ms** to **{itl[-1]:.1f} ms** and total throughput "
             f"from {tps[0]:,.0f} to {tps[-1]:,.0f} tok/s: the budget buys throughput with the tail. The SLO picks the point.",
             [("a bigger budget never lowers the P99 ITL", all(a <= b + 1e-9 for a, b in zip(itl, itl[1:]))),
              ("the largest budget has a worse tail than the smallest", itl[-1] > itl[0]),
              ("and more throughput", tps[-1] > tps[0])])
    """),
    code("""
    import ipywidgets as widgets


    def budget_for_slo(slo_ms=15.0):
        ok = [b for b, r in budget_rows.items() if r["itl_p99_ms"] <= slo_ms]
        if ok:
            b = max(ok)
            r = mixed(b)   # re-run the chosen budget: on the modelled clock a re-run gives the same numbers
            print(f"P99 ITL SLO {slo_ms:.0f} ms -> budget {b}: re-run gives P99 ITL {r['itl_p99_ms']:.1f} ms, {r['total_tok_s']:.0f} tok/s "
                  f"(first run: {budget_rows[b]['itl_p99_ms']:.1f} ms)")
            titled(viz.itl_figure(r["engine"].request_metrics, r["engine"].traces, threshold_s=slo_ms / 1000), f"budget {b}").show()
        else:
            print(f"no budget tried meets P99 ITL <= {slo_ms:.0f} ms")


    widgets.interact_manual(budget_for_slo, slo_ms=widgets.FloatSlider(value=15.0, min=5.0, max=200.0, step=1.0))
    """),
    md("## Quiz (checked by running the engine)"),
    *exercise(1, """
        A long prompt joins 10 decoding requests. With or without chunked prefill, which gives the **lower worst ITL** for the
        decoding requests? Answer `"chunked"` or `"unchunked"`.
        """, "Chapter 4, the textbook case.", "answer_1",
        'answer_1 = "chunked"',
        """
        def worst_decode_itl(chunked):
            fields = dict(max_num_batched_tokens=138, long_prefill_token_threshold=128) if chunked else dict(enable_chunked_prefill=False, max_num_batched_tokens=1100, max_model_len=1100)
            eng = modelled_engine(trace_block_tables=False, **fields)
            arr = [(0, f"d{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)) for i in range(10)]
            run_with_arrivals(eng, arr + [(3, "long", {"prompt_token_ids": [(3 * k) % 2000 + 3 for k in range(1024)]}, SamplingParams(temperature=0.0, max_tokens=1))])
            return max(x for rid, m in eng.request_metrics.items() if rid.startswith("d") for x in m.itls)

        check("Quiz 1: chunked prefill and the worst ITL", answer_1, min(["chunked", "unchunked"], key=lambda k: worst_decode_itl(k == "chunked")))
        """, wrong=['answer_1 = "unchunked"  # one big step is one stall, as long as the whole prefill']),
    *exercise(2, """
        Llama-3-8B keeps K/V in bf16 for 32 layers, 8 KV heads of dimension 128. How many **MiB** of KV cache does one 4,096-token
        conversation hold?
        """, "2 x layers x KV heads x head_dim x 2 bytes per token, times tokens, divided by 2**20.", "answer_2",
        "answer_2 = 2 * 32 * 8 * 128 * 2 * 4096 / 2**20",
        """
        import torch
        from transformers import LlamaConfig

        from minengine.models.llama import LlamaForCausalLM
        from minengine.worker.model_runner import kv_bytes_per_block

        # The engine's own formula on a Llama-3-8B-shaped layer (one layer built, then x 32: building 32 would take GBs).
        cfg8b = LlamaConfig(hidden_size=8 * 128, num_attention_heads=8, num_key_value_heads=8, head_dim=128, num_hidden_layers=1,
                            intermediate_size=64, vocab_size=16)
        per_token_one_layer = kv_bytes_per_block(LlamaForCausalLM(cfg8b), 16, torch.bfloat16) / 16
        check_close("Quiz 2: KV MiB of a 4,096-token conversation", answer_2, per_token_one_layer * 32 * 4096 / 2**20, rel_tol=1e-9)
        """, wrong=["answer_2 = 32 * 8 * 128 * 2 * 4096 / 2**20  # K only: V is cached too",
                    "answer_2 = 2 * 32 * 32 * 128 * 2 * 4096 / 2**20  # 32 query heads: Llama-3-8B has 8 KV heads (GQA)",
                    "answer_2 = 2 * 32 * 8 * 128 * 2 * 4096 / 1e6  # MB, not MiB"]),
    *exercise(3, """
        Prefix caching with `block_size = 16`: the same 48-token prompt is sent twice. How many prompt tokens of the second request
        come from the cache?
        """, "Full blocks only, and at least the last prompt token is recomputed.", "answer_3",
        "answer_3 = ((48 - 1) // 16) * 16",
        """
        e3 = modelled_engine(block_size=16)
        for rid in ("a", "b"):
            e3.add_request(rid, {"prompt_token_ids": [(9 * k) % 2000 + 3 for k in range(48)]}, SamplingParams(temperature=0.0, max_tokens=1))
            run_to_completion(e3)
        check("Quiz 3: cached tokens of a repeated 48-token prompt", answer_3, e3.request_metrics["b"].num_cached_tokens)
        """, wrong=["answer_3 = (48 // 16) * 16  # forgets that the last token is recomputed to sample",
                    "answer_3 = 48 - 1  # hits come in whole blocks"]),
    *summary([
        "Continuous batching removes idle slots; chunked prefill removes the stalls long prompts cause in a continuous batch.",
        "The token budget is chosen from the TBT SLO (chunks of 512+ tokens, then benchmark; check the slots first); the block size from waste vs efficiency; recompute vs swap from compute vs bandwidth.",
        "A scheduler checks both budgets and preempts; the policy follows the business (chat: decode-first, batch: prefill-first, tenants: priority).",
        "Prefix caching = chained block hashes + ref counts + LRU; disaggregation separates the compute-bound and memory-bound phases.",
        "Alert on what users feel (P99 TTFT, P99 ITL, SLO attainment) and on what predicts it (queue, KV usage, preemptions).",
    ]),
    *glossary([
        ("continuous batching", "连续批处理", "rebuild the batch every step"),
        ("chunked prefill", "分块预填充", "split a prompt over steps under the token budget"),
        ("token budget", "词元预算", "most tokens per step (`max_num_batched_tokens`)"),
        ("preemption (recompute / swap)", "抢占（重算 / 换出）", "take KV back from a running request"),
        ("prefix caching", "前缀缓存", "reuse K/V of shared prompt prefixes"),
        ("disaggregation", "预填充与解码分离", "prefill and decode on different GPUs, KV shipped between"),
        ("goodput", "有效吞吐", "requests per second that met the SLO"),
        ("SLO", "服务等级目标", "latency bounds (TTFT, TPOT, P99 TBT)"),
    ]),
]
