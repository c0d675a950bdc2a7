# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 3: static vs iteration-level (continuous) batching, measured; the stall a long prefill causes."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(3, "Continuous batching", [
        "Explain static (request-level) batching and why it wastes slots when output lengths differ.",
        "Explain iteration-level scheduling (continuous batching) and measure its gain on the real engine with real output lengths.",
        "See the stall a long prompt causes when it is prefilled in one step, and name the step that caused it.",
    ], ["Yu et al., *Orca: A Distributed Serving System for Transformer-Based Generative Models*, OSDI 2022",
        "vLLM docs, *Scheduler* / continuous batching", "Patel et al., *Splitwise*, ISCA 2024 (Azure LLM trace)",
        "Agrawal et al., *Sarathi-Serve*, OSDI 2024, section 2 (generation stalls)"]),
    code(SETUP + "import random\n\nfrom minengine.workloads import azure_conv_path, find_data_dir, load_azure_trace\n"),
    md("""
    ## Toy: static vs iteration-level batching
    Each request needs some number of decode steps. **Static** batching takes `B` requests, runs them until the
    *longest* finishes, then takes the next `B`: a finished request's slot sits idle. **Iteration-level** batching
    (Orca) decides again every step: as soon as a request finishes, a waiting one takes its slot.
    """),
    code("""
    def static_steps(lengths, B):
        return sum(max(lengths[i:i + B]) for i in range(0, len(lengths), B))


    def continuous_steps(lengths, B):
        waiting, running, steps = list(lengths), [], 0
        while waiting or running:
            while waiting and len(running) < B:
                running.append(waiting.pop(0))               # fill free slots every step
            running = [r - 1 for r in running if r > 1]       # one decode step for all; finished ones leave
            steps += 1
        return steps


    toy_lengths = [3, 9, 2, 8, 4, 7, 1, 6]
    print("static:", static_steps(toy_lengths, 2), "steps | continuous:", continuous_steps(toy_lengths, 2), "steps")
    """),
    md("""
    ## Real output lengths
    How long are real answers? The Azure LLM inference trace (conversation service, Splitwise ISCA'24) records the
    output length of every request. We scale them down to CPU size and keep their spread; without the data folder we
    fall back to a fixed heavy-tailed list.
    """),
    code("""
    num_requests = pick(32, 12)
    scale = pick(1 / 8, 1 / 16)
    path = azure_conv_path(find_data_dir())
    if path is not None:
        trace = load_azure_trace(path, max_requests=num_requests, length_scale=scale)
        output_lens = [min(r.output_len, 80) for r in trace]
        source = f"Azure conv trace, first {num_requests} requests, lengths x {scale:g}"
    else:
        output_lens = [random.Random(i).choice([2, 4, 8, 16, 32, 64]) for i in range(num_requests)]
        source = "fallback list (no ../shared/data)"
    print(source, "| output lengths:", output_lens)
    """),
    md("""
    ## Measure on the engine
    Static batching is a *driver* policy: add `B` requests, run the engine until they all finish, then the next
    `B`. Continuous batching is what the engine does by itself with `max_num_seqs = B` sequence slots. Same
    requests, same model, greedy decoding, all requests present at time 0, on the modelled clock (an H100 running
    Llama-3-8B shapes: the same numbers on every machine, so the comparison is not at the mercy of warm-up, of which
    strategy runs first, or of whatever else the CPU is doing).
    """),
    code("""
    from minengine.workloads import SHAKESPEARE_OPENINGS


    def make_engine(B):
        return modelled_engine(max_num_seqs=B, max_num_batched_tokens=512)


    def requests():
        return [(f"r{i}", SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)],
                 SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)) for i, n in enumerate(output_lens)]


    def run_static(B):
        eng, reqs = make_engine(B), requests()
        t0 = eng.clock()
        for i in range(0, len(reqs), B):
            for rid, prompt, params in reqs[i:i + B]:
                eng.add_request(rid, prompt, params, arrival_time=t0)     # everyone arrived at t0
            run_to_completion(eng)
        return eng


    def run_continuous(B):
        eng = make_engine(B)
        t0 = eng.clock()
        for rid, prompt, params in requests():
            eng.add_request(rid, prompt, params, arrival_time=t0)
        run_to_completion(eng)
        return eng


    B = 4
    runs = {"static": run_static(B), "continuous": run_continuous(B)}
    for name, eng in runs.items():
        s = eng.summary()
        print(f"{name:10s} steps {s.num_steps:4d} | duration {s.duration_s:6.2f} s | output {s.output_tok_s:7.1f} tok/s | "
              f"TTFT P50 {s.ttft_p50 * 1000:7.1f} ms | P99 {s.ttft_p99 * 1000:7.1f} ms")
    """),
    conclusion("""
    st, co = runs["static"].summary(), runs["continuous"].summary()
    gain = co.output_tok_s / st.output_tok_s
    conclude(f"With {B} slots, continuous batching finished the same {st.num_requests} requests in **{co.num_steps}** steps "
             f"instead of {st.num_steps} ({st.num_steps / co.num_steps:.2f}x fewer), with **{gain:.2f}x** the output throughput and "
             f"a median TTFT of {co.ttft_p50 * 1000:.0f} ms instead of {st.ttft_p50 * 1000:.0f} ms. The throughput gain is about the "
             f"step ratio because a decode step costs about the same however many slots are busy (chapter 1): static batching "
             f"pays full steps for idle slots.",
             [("continuous batching needs fewer steps", co.num_steps < st.num_steps),
              ("and has higher output throughput", gain > 1.0),
              ("and a median TTFT no worse", co.ttft_p50 <= st.ttft_p50),
              ("the throughput gain follows the step ratio (within 15 %)", abs(gain / (st.num_steps / co.num_steps) - 1) < 0.15)])
    """),
    code("""
    titled(viz.queue_figure(runs["static"].traces), "static batching: running / waiting").show()
    titled(viz.queue_figure(runs["continuous"].traces), "continuous batching: running / waiting").show()
    """),
    md("""
    ## Try it: the number of slots
    Re-run both strategies with another `max_num_seqs` (the batch size `B`).
    """),
    code("""
    import ipywidgets as widgets


    def compare(slots=4):
        rows = {name: fn(slots).summary() for name, fn in (("static", run_static), ("continuous", run_continuous))}
        fig = go.Figure(go.Bar(x=list(rows), y=[s.num_steps for s in rows.values()], text=[f"{s.output_tok_s:.0f} tok/s" for s in rows.values()]))
        fig.update_layout(title=f"{slots} slots: steps to finish (label: output tok/s)", yaxis_title="engine steps")
        fig.show()


    widgets.interact_manual(compare, slots=widgets.IntSlider(value=4, min=1, max=16))
    """),
    md("""
    ## The stall: a long prompt prefilled in one step
    Continuous batching admits a new request into a running batch. Without chunked prefill its **whole prompt**
    runs in one step, and every request that is decoding waits for that step: their time between tokens (TBT,
    also called inter-token latency, ITL) jumps. Sarathi-Serve calls this a *generation stall*.
    """),
    code("""
    long_len = pick(4000, 1536)
    stall_engine = modelled_engine(enable_chunked_prefill=False, max_model_len=4096, max_num_batched_tokens=4096,
                                   trace_block_tables=False)
    decoders = [(0, f"dec-{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=pick(30, 16), ignore_eos=True))
                for i in range(4)]
    long_prompt = (0, "long", {"prompt_token_ids": [(13 * i) % 2000 + 3 for i in range(long_len)]},
                   SamplingParams(temperature=0.0, max_tokens=2))
    run_with_arrivals(stall_engine, decoders + [(6, *long_prompt[1:])])
    itls = sorted(x for rid, m in stall_engine.request_metrics.items() if rid.startswith("dec") for x in m.itls)
    threshold = 3 * itls[len(itls) // 2]
    titled(viz.itl_figure(stall_engine.request_metrics, stall_engine.traces, threshold_s=threshold), "A long prompt prefilled in one step").show()
    stalls = viz.find_stalls(stall_engine.request_metrics, stall_engine.traces, threshold_s=threshold)
    for s in stalls[:4]:
        print(f"{s['request_id']}: token {s['token_index']} waited {s['itl_s'] * 1000:.0f} ms <- {s['cause']}")
    """),
    conclusion("""
    worst = max(stalls, key=lambda s: s["itl_s"])
    median_itl = itls[len(itls) // 2]
    conclude(f"Median ITL of the decoding requests: {median_itl * 1000:.1f} ms. The worst gap: **{worst['itl_s'] * 1000:.0f} ms** "
             f"({worst['itl_s'] / median_itl:.0f}x), caused by *{worst['cause']}*: every decoding request waited for the "
             f"{long_len:,}-token prefill. Chapter 4 removes it with chunked prefill.",
             [("the worst gap is a stall (above 3x the median)", worst["itl_s"] > threshold),
              ("caused by the long prompt's prefill", worst["kind"] == "prefill" and worst["cause_request_id"] == "long")])
    """),
    *exercise(1, """
        Toy: output lengths `[5, 1, 1, 5]` with `B = 2` slots. How many steps do static and continuous batching take?
        Answer `(static, continuous)` by hand, then let the check run the toy.
        """, "Static: max of each pair. Continuous: step by step, a finished request frees its slot for the next one at the following step; simulate it on paper.", "answer_1",
        "answer_1 = (5 + 5, 7)",
        """
        check("Exercise 1: static vs continuous steps", answer_1, (static_steps([5, 1, 1, 5], 2), continuous_steps([5, 1, 1, 5], 2)))
        """, wrong=["answer_1 = (10, 6)  # sum(lengths) / B: slots are not perfectly packed",
                    "answer_1 = (5 + 5, 5)  # as if the short ones took no steps", "answer_1 = (12, 7)"]),
    *exercise(2, """
        In the stall experiment, which request's step made the decoders wait longest? Find the step with the longest
        duration in `stall_engine.traces` and give the request id of its largest chunk.
        """, "`max(stall_engine.traces, key=lambda t: t.duration)`, then its `chunks`.", "answer_2",
        """
        slowest = max(stall_engine.traces, key=lambda t: t.duration)
        answer_2 = max(slowest.chunks, key=lambda c: c.num_tokens).request_id
        """,
        """
        longest_prefill = max((c for t in stall_engine.traces for c in t.chunks if c.is_prefill), key=lambda c: c.num_tokens)
        check("Exercise 2: who caused the stall", answer_2, longest_prefill.request_id)
        """, wrong=["answer_2 = worst['request_id']  # the victim of the stall, not its cause",
                    "answer_2 = max(slowest.chunks, key=lambda c: c.start_pos).request_id  # the longest context, a decoder"]),
    *exercise(3, """
        Static batching: what fraction of slot-steps is idle for the toy lengths `toy_lengths` with `B = 2`? A batch
        of requests with lengths `l1, l2` occupies `2 x max(l1, l2)` slot-steps but uses only `l1 + l2`.
        """, "idle = 1 - sum(lengths) / sum(B x max(batch)).", "answer_3",
        "answer_3 = 1 - sum(toy_lengths) / sum(2 * max(toy_lengths[i:i + 2]) for i in range(0, len(toy_lengths), 2))",
        """
        check_close("Exercise 3: idle slot-steps", answer_3, 1 - sum(toy_lengths) / (2 * static_steps(toy_lengths, 2)), rel_tol=1e-6)
        """, wrong=["answer_3 = sum(toy_lengths) / sum(2 * max(toy_lengths[i:i + 2]) for i in range(0, len(toy_lengths), 2))  # the busy share",
                    "answer_3 = 1 - sum(toy_lengths) / static_steps(toy_lengths, 2)  # forgot the 2 slots per step"]),
    *question("why does the throughput gain follow the step ratio?", """
        Continuous batching above took fewer steps and gained about that much output throughput. Why does fewer steps
        mean more tokens per second here, and when would the gain be smaller than the step ratio?
        """, """
        On an H100 a decode step of a small batch costs about the same whatever the batch size (it reads the weights once,
        chapter 1), so the time of a run is roughly (number of steps) x (cost of a step) and the same tokens in fewer steps
        come out faster (checked: continuous batching needs fewer steps; the throughput gain follows the step ratio). The gain shrinks when steps get more expensive as they fill up: large batches with long contexts
        (K/V reads grow with every request) or compute-bound steps, where a fuller step really costs more (checked: ch01 · the step becomes far slower).
        """),
    *question("what if every request had the same output length?", """
        Static batching wastes slots because output lengths differ. What if all requests wanted exactly the same number
        of tokens: would continuous batching still help?
        """, """
        With equal lengths and all requests present at the start, every static batch finishes together and no slot idles,
        so the two strategies take the same steps. Continuous batching still helps as soon as requests *arrive* over time:
        a new request joins at the next step instead of waiting for the current batch to end, so its TTFT does not include
        the rest of someone else's batch. Real traffic has both spread lengths and spread arrivals.
        """),
    *summary([
        "Static batching holds every slot until the longest request of the batch ends; with real, widely spread output lengths that idles many slots.",
        "Iteration-level scheduling (Orca) refills slots every step: fewer steps, higher throughput and a median TTFT no worse for the same requests (checked: continuous batching needs fewer steps; and has higher output throughput; and a median TTFT no worse).",
        "But a new request's prompt now runs *inside* a running batch: prefilled in one step, a long prompt stalls every decoding request.",
        "`viz.find_stalls` names the step behind each stall from the engine's own trace.",
    ]),
    *glossary([
        ("static batching", "静态批处理", "a batch runs until all its requests finish before the next starts"),
        ("continuous batching / iteration-level scheduling", "连续批处理 / 迭代级调度", "the batch is rebuilt every step"),
        ("head-of-line blocking", "队首阻塞", "requests behind a long one wait for it"),
        ("generation stall", "生成停顿", "a decode waits because a long prefill shares its step"),
        ("TBT / ITL", "词元间隔 / 词元间延迟", "time between two output tokens of one request"),
        ("TTFT", "首词元时间", "time from arrival to the first output token"),
        ("sequence slot", "序列槽位", "a place in the running batch (`max_num_seqs`)"),
    ]),
]
