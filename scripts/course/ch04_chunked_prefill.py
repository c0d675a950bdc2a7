# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 4: chunked prefill under a token budget; KV continuity across chunks; both roofs; chunk-size sweep and
vLLM's budget defaults; scheduling policies; Dynamic SplitFuse with its own target."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(4, "Chunked prefill and the token budget", [
        "Run the textbook case: 10 decoding requests and one 8,000-token prompt, with and without 512-token chunks, and compare their TBT (modelled H100).",
        "Follow the long prompt's block table growing chunk by chunk: the KV of earlier chunks stays where it is.",
        "Explain, with the cost model, why a prefill chunk and decodes in one step share one weight read (the GEMMs fill both roofs) while the decodes still pay their attention.",
        "Sweep the chunk size, read vLLM's real `max_num_batched_tokens` defaults, and see why the advice is chunks of at least 512 tokens, then benchmark.",
        "Compare decode-first, prefill-first and balanced on a contended workload, and Dynamic SplitFuse with a target below the budget.",
    ], ["Agrawal et al., *SARATHI: Efficient LLM Inference by Piggybacking Decodes with Chunked Prefills*, 2023",
        "Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve*, OSDI 2024",
        "Holmes et al., *DeepSpeed-FastGen: High-throughput Text Generation for LLMs via MII and DeepSpeed-Inference*, 2024 (Dynamic SplitFuse)",
        "vLLM docs, *Optimization and Tuning: chunked prefill*; vLLM source, `EngineArgs.get_batch_defaults` (vllm/engine/arg_utils.py)"]),
    code(SETUP + """\
import math

from minengine.course import teaching_cost_model
from minengine.timing import StepCostModel, StepWork
from minengine.viz.cost_figures import roofs_figure
from minengine.workloads import SHAKESPEARE_OPENINGS
"""),
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
    Ten requests are decoding when one 8,000-token prompt arrives. Without chunking the prompt runs in one step. With
    chunking it goes in 512-token chunks: budget = chunk + 10 so the 10 decodes always fit, and
    `long_prefill_token_threshold = chunk`. The tokens are computed by the bundled model on this CPU; the time is
    the modelled H100 running Llama-3-8B shapes.
    """),
    code("""
    LONG = 8000
    CHUNK = 512
    NUM_DECODING = 10
    long_ids = [(17 * i) % 2000 + 3 for i in range(LONG)]


    def textbook(chunk=None, long_len=LONG, decode_tokens=None, trace_block_tables=False):
        \"\"\"10 decoding requests; the long prompt arrives at step 3. chunk=None: no chunked prefill.\"\"\"
        decode_tokens = decode_tokens or pick(40, 24)
        fields = dict(max_model_len=max(long_len + 16, 512), trace_block_tables=trace_block_tables,
                      num_kv_blocks=(long_len + 16 * 64) // 16 + 64)
        if chunk is None:
            fields.update(enable_chunked_prefill=False, max_num_batched_tokens=long_len + 16 + NUM_DECODING)
        else:
            fields.update(max_num_batched_tokens=chunk + NUM_DECODING, long_prefill_token_threshold=chunk)
        eng = modelled_engine(**fields)
        arrivals = [(0, f"dec-{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=decode_tokens, ignore_eos=True))
                    for i in range(NUM_DECODING)]
        arrivals.append((3, "long", {"prompt_token_ids": long_ids[:long_len]}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
        run_with_arrivals(eng, arrivals)
        return eng


    def decode_itls(eng):
        return sorted(x for rid, m in eng.request_metrics.items() if rid.startswith("dec") for x in m.itls)


    unchunked, chunked = textbook(None), textbook(CHUNK, trace_block_tables=True)
    for name, eng in (("one step", unchunked), (f"{CHUNK}-token chunks", chunked)):
        x = decode_itls(eng)
        print(f"{name:18s} decode ITL median {x[len(x) // 2] * 1000:6.1f} ms | max {x[-1] * 1000:7.1f} ms | "
              f"TTFT of the long prompt {eng.request_metrics['long'].ttft * 1000:7.1f} ms")
    """),
    code("""
    threshold = 3 * decode_itls(chunked)[len(decode_itls(chunked)) // 2]
    titled(viz.itl_figure(unchunked.request_metrics, unchunked.traces, threshold_s=threshold), "Without chunked prefill").show()
    titled(viz.itl_figure(chunked.request_metrics, chunked.traces, threshold_s=threshold), f"Chunked prefill, {CHUNK}-token chunks").show()
    viz.batch_composition_figure(chunked.traces).show()
    """),
    conclusion("""
    u, c = decode_itls(unchunked), decode_itls(chunked)
    t_one, t_chunked = unchunked.request_metrics["long"].ttft, chunked.request_metrics["long"].ttft
    n_chunks = math.ceil(LONG / CHUNK)
    conclude(f"Without chunking the {LONG:,}-token prefill stalls every decode for **{u[-1] * 1000:.0f} ms** (the sources say about 0.3 s on one H100); "
             f"with {CHUNK}-token chunks the worst decode gap is **{c[-1] * 1000:.1f} ms**, {u[-1] / c[-1]:.0f}x less. The price is the long "
             f"prompt's own TTFT: {t_chunked * 1000:.0f} ms instead of {t_one * 1000:.0f} ms (**{t_chunked / t_one - 1:.0%} more**), because each of its "
             f"{n_chunks} chunks pays a step's fixed costs (reading the weights, the per-step overhead), runs its GEMMs nearer the ridge point, where they are less efficient, and re-reads the K/V of the chunks before it.",
             [("chunking cuts the worst decode gap", c[-1] < u[-1] / 5),
              ("the unchunked stall is on the order of 0.3 s", 0.2 < u[-1] < 0.4),
              ("chunking costs the long prompt some TTFT, not a multiple", 1.0 < t_chunked / t_one < 2.0)])
    """),
    md("""
    ## Memory: the other reason to cut a long prefill
    A prefill's activations grow with its length, and some grow with its square. Count three buffers of one
    8,192-token Llama-3-8B prefill: the logits of every position in fp32 (what a plain forward pass returns; the engine
    computes logits only at the positions it samples, `logits_indices`), one layer's attention score matrix in bf16 as
    naive attention writes it (heads × n × n; FlashAttention never writes it, chapter 11), and the bf16 KV the prompt
    leaves in the cache. Then a 32K-token prompt's prefill time on the teaching clock:
    """),
    code("""
    from minengine.timing import LLAMA_3_8B

    N_ACT, N_32K = 8192, 32768
    logits_gib = N_ACT * LLAMA_3_8B.vocab_size * 4 / 2**30                # fp32, every position
    scores_gib = LLAMA_3_8B.num_heads * N_ACT * N_ACT * 2 / 2**30         # bf16, one layer, naive attention
    kv_gib = N_ACT * LLAMA_3_8B.kv_bytes_per_token / 2**30                # bf16, all layers
    chunk_scores_mib = LLAMA_3_8B.num_heads * CHUNK * N_ACT * 2 / 2**20   # the last 512-token chunk against the whole prompt
    prefill_32k_s = teaching_cost_model().cost([(N_32K, 0, 1)]).time_s
    print(f"logits {logits_gib:.2f} GiB | scores {scores_gib:.2f} GiB per layer | KV {kv_gib:.2f} GiB | "
          f"one chunk's scores {chunk_scores_mib:.0f} MiB | {N_32K:,}-token prefill {prefill_32k_s:.2f} s ({CLOCK_LABEL})")
    """),
    conclusion("""
    conclude(f"An {N_ACT:,}-token Llama-3-8B prefill's fp32 logits for every position are **{logits_gib:.1f} GiB** and its naive score matrix "
             f"**{scores_gib:.0f} GiB per layer**, against the **{kv_gib:.0f} GiB** of KV it leaves behind: the transient activations, not the "
             f"cache, are what a long prefill risks. The engine keeps logits for the sampled positions only, and a {CHUNK}-token chunk's score "
             f"matrix against the whole prompt is {chunk_scores_mib:.0f} MiB. In time, a {N_32K:,}-token prefill takes **{prefill_32k_s:.2f} s** "
             "on the modelled H100, between 1 and 2 s: every decode sharing that step would wait that long without chunking.",
             [("the logits are about 3.9 GiB", round(logits_gib, 1) == 3.9),
              ("the naive scores are 4 GiB per layer", scores_gib == 4.0),
              ("the KV is 1 GiB", kv_gib == 1.0),
              ("both activations exceed the KV", min(logits_gib, scores_gib) > kv_gib),
              ("a chunk's scores are a fraction of the whole", chunk_scores_mib / 1024 < scores_gib / 10),
              ("the 32K prefill takes 1 to 2 s", 1.0 < prefill_32k_s < 2.0)])
    """),
    md("""
    ## KV continuity across chunks
    A chunk only *adds* to the request: `num_computed_tokens` moves forward, the block table gets the blocks the new
    positions need, and every block written by an earlier chunk stays where it is, read again by the later chunks'
    attention. Here is the long prompt's block table after each of its chunks (`trace_block_tables=True`).
    """),
    code("""
    bs = chunked.config.block_size
    growth = [(t.step, ch.start_pos + ch.num_tokens, t.block_tables["long"]) for t in chunked.traces for ch in t.chunks
              if ch.request_id == "long" and ch.is_prefill]
    for step, computed, table in growth:
        print(f"step {step:3d}: {computed:5d} tokens computed, {len(table):3d} blocks: {table[:4]} ... {table[-2:]}")
    fig = go.Figure(go.Scatter(x=[g[0] for g in growth], y=[len(g[2]) for g in growth], mode="lines+markers", line_shape="hv",
                               text=[f"{g[1]} tokens" for g in growth]))
    fig.update_layout(title="The long prompt's block table, chunk by chunk", xaxis_title="step", yaxis_title="blocks in its table")
    fig.show()
    viz.block_tables_figure(next(t for t in chunked.traces if t.step == growth[len(growth) // 2][0])).show()
    """),
    conclusion("""
    prefix_kept = all(later[: len(earlier)] == earlier for (_, _, earlier), (_, _, later) in zip(growth, growth[1:]))
    right_size = all(len(table) == math.ceil(computed / bs) for _, computed, table in growth)
    conclude(f"Over {len(growth)} chunks the table grew from {len(growth[0][2])} to **{len(growth[-1][2])} blocks** "
             f"(= ceil({LONG:,} / {bs})), one chunk's worth at a time, and every earlier block id stayed in place: each chunk "
             f"continues the KV the previous ones wrote.",
             [("each chunk's table starts with the previous table", prefix_kept),
              ("each table holds exactly the blocks its computed tokens need", right_size)])
    """),
    md("""
    ## Why intermediate chunks do not sample
    A chunk that does not reach the end of the prompt has no next token to produce: the token after position `p`
    is already known (it is the prompt's token `p + 1`). So the **last** chunk is the one that samples. The engine computes logits only for sampling rows (source: `ForwardBatch.logits_indices` in `minengine/worker/forward_batch.py`), so intermediate chunks cost no LM-head work either.
    """),
    code("""
    long_chunks = [(t.step, ch) for t in chunked.traces for ch in t.chunks if ch.request_id == "long" and ch.is_prefill]
    for step, ch in long_chunks:
        print(f"step {step:3d}: positions {ch.start_pos:5d}..{ch.start_pos + ch.num_tokens - 1:5d}  sampled={ch.sampled}")
    """),
    md("""
    ## Mixing fills both roofs, for the GEMMs
    Why is a step with a 512-token chunk *and* the decodes cheaper than the two steps apart? Chapter 1's roofline: a
    decode batch is memory-bound (it reads the weights and the K/V for a few tokens of arithmetic, the compute units
    idle), a 512-token chunk is compute-bound (the weights are read once and used 512 times). In one step the decodes'
    rows join the chunk's GEMMs, which read the weights once for both. Attention is a kernel of its own: the decodes'
    K/V reads run after the GEMMs, not under them, and each request still costs the engine its host time. The cost
    model, 64 decodes with 1,000 tokens of context each:
    """),
    code("""
    h100 = teaching_cost_model()
    decodes = [(1, 1000, 1)] * 64
    roofs = {"64 decodes": h100.cost(StepWork.of(decodes)), "512-token chunk": h100.cost(StepWork.of([(512, 0, 0)])),
             "chunk + 64 decodes": h100.cost(StepWork.of([(512, 0, 0)] + decodes))}
    titled(roofs_figure(roofs), "Compute time and memory time of three steps (decodes with 1,000 tokens of context)").show()
    for name, cst in roofs.items():
        print(f"{name:20s} {cst.time_s * 1e3:6.2f} ms: compute {cst.compute_time_s * 1e3:5.2f} ms, memory {cst.memory_time_s * 1e3:5.2f} ms ({cst.bound}-bound)")
    """),
    conclusion("""
    d, p, mixed = roofs["64 decodes"], roofs["512-token chunk"], roofs["chunk + 64 decodes"]
    saved = d.time_s + p.time_s - mixed.time_s
    conclude(f"The mixed step lasts **{mixed.time_s * 1e3:.1f} ms** and serves 64 decodes that would take {d.time_s * 1e3:.1f} ms as a step "
             f"of their own: separately the two cost {(d.time_s + p.time_s) * 1e3:.1f} ms, so mixing saves **{saved * 1e3:.1f} ms**. "
             f"The saving is in the GEMMs: the decodes' rows ride on the chunk's weight read ({mixed.linear_time_s * 1e3:.1f} ms of GEMMs "
             f"mixed, {p.linear_time_s * 1e3:.1f} ms for the chunk alone, {d.linear_time_s * 1e3:.1f} ms for the decodes alone) and one step "
             f"pays the step's overhead once. Their attention ({d.attention_time_s * 1e3:.1f} ms of K/V reads) and their per-request host "
             f"time are paid (nearly) in full: attention is its own kernel. That is why Sarathi-Serve mixes them, and why the decodes are not free.",
             [("a decode batch is memory-bound and a 512-token chunk compute-bound", d.bound == "memory" and p.bound == "compute"),
              ("mixing costs less than two steps", mixed.time_s < 0.9 * (d.time_s + p.time_s)),
              ("the decodes ride on the chunk's GEMMs", mixed.linear_time_s < 1.15 * p.linear_time_s < p.linear_time_s + d.linear_time_s),
              ("but their attention is paid nearly in full", mixed.attention_time_s > 0.85 * (d.attention_time_s + p.attention_time_s)),
              ("the mixed step keeps both roofs busier", mixed.memory_time_s > p.memory_time_s and mixed.compute_time_s > d.compute_time_s)])
    """),
    md("""
    ## Chunk-size sweep: overhead vs smoothness
    Smaller chunks keep each step short (smooth decodes), but the prompt needs more steps, each paying the step's fixed
    costs, so it finishes later (checked: 512-token chunks cost far less TTFT than the smallest). Sarathi-Serve picks the chunk from the TBT SLO the deployment must meet.
    """),
    code("""
    SWEEP_LEN = pick(6000, 4000)
    chunk_sizes = pick([64, 256, 512, 2048], [128, 512, 2048])
    sweep = {}
    for size in chunk_sizes:
        eng = textbook(size, long_len=SWEEP_LEN, decode_tokens=pick(40, 20))
        x = decode_itls(eng)
        sweep[size] = (x[-1], eng.request_metrics["long"].ttft)
    fig = go.Figure([go.Scatter(x=chunk_sizes, y=[v[0] * 1000 for v in sweep.values()], name="worst decode ITL (ms)", mode="lines+markers"),
                     go.Scatter(x=chunk_sizes, y=[v[1] * 1000 for v in sweep.values()], name="TTFT of the long prompt (ms)", mode="lines+markers", yaxis="y2")])
    fig.add_vline(x=512, line_dash="dash", annotation_text="512")
    titled(fig, f"Chunk size sweep ({SWEEP_LEN:,}-token prompt, 10 decoding requests)")
    fig.update_layout(xaxis=dict(title="chunk size (tokens)", type="log"), yaxis=dict(title="worst decode ITL (ms)"),
                      yaxis2=dict(title="long prompt TTFT (ms)", overlaying="y", side="right", tickmode="auto", showgrid=False),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0))   # below the plot, clear of the right axis
    fig.show()
    for size, (itl, ttft) in sweep.items():
        print(f"chunk {size:5d}: worst decode ITL {itl * 1000:6.1f} ms | long prompt TTFT {ttft * 1000:6.1f} ms")
    """),
    md("""
    ### vLLM's defaults, and "chunks of at least 512 tokens, then benchmark"
    vLLM sets the budget from the GPU and from how it is used (source: vLLM's `EngineArgs.get_batch_defaults`): on GPUs with at least
    70 GiB that are not A100s (H100, H200, MI300x) the offline `LLM` class gets **16,384** tokens and the OpenAI server
    **8,192**; on other GPUs **8,192** and **2,048**. (vLLM's comment there: a large budget *reduced* A100 throughput,
    PR #17885.) Its tuning guide: smaller values (e.g. 2,048) give better ITL, larger ones better TTFT, and above
    8,192 for best throughput (source: vLLM docs, *Optimization and Tuning*). What those budgets cost per step, when a prefill fills them, on the cost model:
    """),
    code("""
    budgets = [512, 2048, 8192, 16384]
    gpus = {"h100": "H100 SXM", "a100": "A100 80GB", "l4": "L4"}
    full_step_ms = {(g, b): StepCostModel(g, "llama-3-8b").cost(StepWork.of([(b, 0, 0)])).time_s * 1e3 for g in gpus for b in budgets}
    print("a step whose prefill chunk fills the budget, Llama-3-8B shapes (ms) = the gap every decode in it waits")
    print(f"{'budget':>8s} " + " ".join(f"{name:>10s}" for name in gpus.values()))
    for b in budgets:
        print(f"{b:8,d} " + " ".join(f"{full_step_ms[(g, b)]:10.1f}" for g in gpus))
    """),
    conclusion("""
    ttft = {size: v[1] for size, v in sweep.items()}
    best = min(ttft.values())
    small = min(chunk_sizes)
    conclude(f"On the sweep, {CHUNK}-token chunks cost the long prompt **{ttft[CHUNK] / best - 1:.0%}** more TTFT than the best chunk size, "
             f"while {small}-token chunks cost **{ttft[small] / best:.1f}x** the best: below the ridge point (chapter 1) a chunk is "
             f"memory-bound, so every step pays a full weight read and the step's overhead for a few tokens of work. Larger chunks "
             f"still shorten the TTFT, but every decode's worst gap keeps growing ({sweep[CHUNK][0] * 1000:.0f} ms at {CHUNK}, "
             f"{sweep[max(chunk_sizes)][0] * 1000:.0f} ms at {max(chunk_sizes)}): the TTFT bigger chunks buy back is paid by every decode "
             f"sharing their steps. Hence the advice: chunks of at least 512 tokens, then benchmark your own SLO. vLLM's server default of "
             f"8,192 on an H100 means a prefill-filled step of {full_step_ms[('h100', 8192)]:.0f} ms; the 2,048 default elsewhere keeps an "
             f"A100's full step at {full_step_ms[('a100', 2048)]:.0f} ms, where 8,192 would take {full_step_ms[('a100', 8192)]:.0f} ms.",
             [("512-token chunks cost far less TTFT than the smallest", ttft[CHUNK] / best - 1 < 0.5 * (ttft[small] / best - 1)),
              ("the smallest chunks cost at least 1.5x the best TTFT", ttft[small] / best > 1.5),
              ("the worst decode gap grows with the chunk", sweep[max(chunk_sizes)][0] > sweep[CHUNK][0] > sweep[small][0] * 0.99),
              ("the same budget takes longer on an A100 than on an H100", full_step_ms[("a100", 8192)] > full_step_ms[("h100", 8192)])])
    """),
    md("""
    ## Try it: chunk size vs TBT
    Move the slider and press *Run*: the textbook case runs again with that chunk size and redraws the ITL plot.
    """),
    code("""
    import ipywidgets as widgets


    def redraw(chunk=CHUNK):
        eng = textbook(chunk, long_len=pick(8000, 2048), decode_tokens=pick(40, 20))
        titled(viz.itl_figure(eng.request_metrics, eng.traces, threshold_s=threshold), f"{chunk}-token chunks").show()
        x = decode_itls(eng)
        print(f"{chunk}-token chunks: worst decode ITL {x[-1] * 1000:.1f} ms, long prompt TTFT {eng.request_metrics['long'].ttft * 1000:.0f} ms")


    widgets.interact_manual(redraw, chunk=widgets.SelectionSlider(options=[32, 64, 128, 256, 512, 1024, 2048], value=CHUNK))
    """),
    md("""
    ## Who goes first? Scheduling policies
    The budget is fixed; the policy decides its order (`EngineConfig(scheduling_policy=...)`):
    - **decode-first** (vLLM v1, Sarathi-Serve's stall-free batching): running requests first, new prompts get the rest. Protects TPOT.
    - **prefill-first** (vLLM v0 default, Orca-like): new prompts first, decodes fill what is left. Good TTFT, stalls decodes.
    - **balanced**: the budget split by `prefill_decode_ratio` between the two (here 3: a quarter for decodes).

    The order matters only when the budget is contended: here many requests are decoding (they alone take half the
    budget) while four long prompts arrive one after another.
    """),
    code("""
    BUDGET = pick(256, 128)
    NUM_DECODERS = BUDGET // 2
    PROMPT_LEN = pick(1200, 400)


    def policy_run(policy, **fields):
        eng = modelled_engine(max_num_batched_tokens=BUDGET, max_num_seqs=256, scheduling_policy=policy, trace_block_tables=False, **fields)
        arrivals = [(0, f"dec-{i}", {"prompt_token_ids": [(5 * i + k) % 2000 + 3 for k in range(8)]},
                     SamplingParams(temperature=0.0, max_tokens=pick(48, 32), ignore_eos=True)) for i in range(NUM_DECODERS)]
        arrivals += [(3 + 4 * j, f"prompt-{j}", {"prompt_token_ids": long_ids[j * 7: j * 7 + PROMPT_LEN]},
                      SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)) for j in range(4)]
        run_with_arrivals(eng, arrivals)
        return eng


    def longest_turn_gap(eng):
        \"\"\"The most steps in a row any decoder went without being scheduled, between its first and last chunk.\"\"\"
        served = {}
        for trace in eng.traces:
            for c in trace.chunks:
                if c.request_id.startswith("dec"):
                    served.setdefault(c.request_id, []).append(trace.step)
        return max(b - a - 1 for steps in served.values() for a, b in zip(steps, steps[1:]))


    policy_runs = {"decode-first": policy_run("decode-first"), "prefill-first": policy_run("prefill-first"),
                   "balanced": policy_run("balanced", prefill_decode_ratio=3.0)}
    policy_rows = {}
    for policy, eng in policy_runs.items():
        x = decode_itls(eng)
        ttfts = [m.ttft for rid, m in eng.request_metrics.items() if rid.startswith("prompt")]
        policy_rows[policy] = dict(p99_itl_ms=1000 * x[min(len(x) - 1, int(0.99 * len(x)))], max_itl_ms=1000 * x[-1],
                                   mean_prompt_ttft_ms=1000 * sum(ttfts) / len(ttfts), steps=len(eng.traces),
                                   longest_gap_steps=longest_turn_gap(eng))
    # balanced's decode share (a quarter of the budget) serves the decodes least recently served first: with at most
    # NUM_DECODERS + 4 decodes (the prompts decode too), none should wait more than ceil(decodes / share) - 1 steps.
    DECODE_SHARE = policy_runs["balanced"].scheduler.policy.decode_share(BUDGET)
    TURN_BOUND = math.ceil((NUM_DECODERS + 4) / DECODE_SHARE) - 1
    for policy, row in policy_rows.items():
        print(f"{policy:14s} " + " | ".join(f"{k} {v:8.1f}" for k, v in row.items()))
    fig = go.Figure([go.Bar(name="decode P99 ITL (ms)", x=list(policy_rows), y=[r["p99_itl_ms"] for r in policy_rows.values()]),
                     go.Bar(name="mean prompt TTFT (ms)", x=list(policy_rows), y=[r["mean_prompt_ttft_ms"] for r in policy_rows.values()])])
    titled(fig, f"Scheduling policy: decode smoothness vs prompt latency ({NUM_DECODERS} decoding, budget {BUDGET})")
    fig.update_layout(barmode="group", yaxis_title="ms")
    fig.show()
    """),
    conclusion("""
    r = policy_rows
    conclude(f"**decode-first** kept the decodes' P99 ITL at {r['decode-first']['p99_itl_ms']:.1f} ms, the lowest, but the prompts waited "
             f"{r['decode-first']['mean_prompt_ttft_ms']:.0f} ms on average for their first token, since the {NUM_DECODERS} decodes take "
             f"{NUM_DECODERS} of the {BUDGET} tokens every step. **prefill-first** gave the prompts their first token in "
             f"{r['prefill-first']['mean_prompt_ttft_ms']:.0f} ms, the lowest, by stalling the decodes (P99 ITL "
             f"{r['prefill-first']['p99_itl_ms']:.0f} ms). **balanced** (a quarter of the budget for decodes) sits between on TTFT "
             f"({r['balanced']['mean_prompt_ttft_ms']:.0f} ms) and rations the decodes for as long as prompts are pending "
             f"(P99 ITL {r['balanced']['p99_itl_ms']:.0f} ms): each decode waits its turn for a slice of the budget. Its "
             f"{DECODE_SHARE}-token share goes to the decodes least recently served, so no decoder went more than "
             f"{r['balanced']['longest_gap_steps']} steps in a row without a token (at most {TURN_BOUND} with {DECODE_SHARE} of up "
             f"to {NUM_DECODERS + 4} decodes served per step; decode-first: {r['decode-first']['longest_gap_steps']}, prefill-first: "
             f"{r['prefill-first']['longest_gap_steps']}).",
             [("decode-first has the lowest decode P99 ITL", r["decode-first"]["p99_itl_ms"] == min(x["p99_itl_ms"] for x in r.values())),
              ("prefill-first has the lowest prompt TTFT", r["prefill-first"]["mean_prompt_ttft_ms"] == min(x["mean_prompt_ttft_ms"] for x in r.values())),
              ("balanced's prompt TTFT is between the two", r["prefill-first"]["mean_prompt_ttft_ms"] < r["balanced"]["mean_prompt_ttft_ms"] < r["decode-first"]["mean_prompt_ttft_ms"]),
              ("balanced: each decode waits its turn (longest gap within the rotation's bound, and some decode did wait)",
               1 <= r["balanced"]["longest_gap_steps"] <= TURN_BOUND),
              ("prefill-first stalled a decode longer than balanced", r["prefill-first"]["longest_gap_steps"] > r["balanced"]["longest_gap_steps"])])
    """),
    md("""
    ### Dynamic SplitFuse: a target forward size of its own
    DeepSpeed-FastGen's Dynamic SplitFuse aims every forward at the same size, `splitfuse_target_tokens`: the decodes
    run, and prefill chunks (split from long prompts, or several short prompts fused) take exactly what is left of the
    target. With the target equal to the budget (the default) that is decode-first; the point of the policy is a
    target *below* the budget, chosen where the forward is already efficient, so steps stay short and even while the
    budget remains the hard cap (decodes beyond the target still run). 16 decoding requests, two 2,000-token prompts,
    budget 1,024, target 384:
    """),
    code("""
    def splitfuse_run(policy, **fields):
        eng = modelled_engine(max_num_batched_tokens=1024, scheduling_policy=policy, trace_block_tables=False, **fields)
        arrivals = [(0, f"dec-{i}", SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)],
                     SamplingParams(temperature=0.0, max_tokens=pick(40, 24), ignore_eos=True)) for i in range(16)]
        arrivals += [(2 + 2 * j, f"prompt-{j}", {"prompt_token_ids": long_ids[j * 11: j * 11 + pick(2000, 1000)]},
                      SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)) for j in range(2)]
        run_with_arrivals(eng, arrivals)
        return eng


    TARGET = 384
    split_runs = {"decode-first (budget 1024)": splitfuse_run("decode-first"),
                  f"dynamic-splitfuse (target {TARGET})": splitfuse_run("dynamic-splitfuse", splitfuse_target_tokens=TARGET),
                  "dynamic-splitfuse (target = budget)": splitfuse_run("dynamic-splitfuse")}
    fig = go.Figure([go.Scatter(y=[t.num_scheduled_tokens for t in eng.traces], name=name, mode="lines", line_shape="hv")
                     for name, eng in list(split_runs.items())[:2]])
    fig.add_hline(y=TARGET, line_dash="dash", annotation_text=f"target {TARGET}")
    titled(fig, "Tokens per step: decode-first fills the budget, Dynamic SplitFuse holds its target")
    fig.update_layout(xaxis_title="step", yaxis_title="tokens in the step")
    fig.show()
    for name, eng in split_runs.items():
        x = decode_itls(eng)
        ttfts = [m.ttft for rid, m in eng.request_metrics.items() if rid.startswith("prompt")]
        print(f"{name:36s} max tokens/step {max(t.num_scheduled_tokens for t in eng.traces):5d} | worst decode ITL {x[-1] * 1000:5.1f} ms | "
              f"mean prompt TTFT {1000 * sum(ttfts) / len(ttfts):6.1f} ms")
    """),
    conclusion("""
    df, dsf, dsf_budget = split_runs.values()
    with_prefill = [t.num_scheduled_tokens for t in dsf.traces if t.num_prefill_tokens]
    x_df, x_dsf = decode_itls(df), decode_itls(dsf)
    t_df = [m.ttft for rid, m in df.request_metrics.items() if rid.startswith("prompt")]
    t_dsf = [m.ttft for rid, m in dsf.request_metrics.items() if rid.startswith("prompt")]
    full_target = sum(n == TARGET for n in with_prefill)
    conclude(f"With target {TARGET}, **{full_target} of {len(with_prefill)}** steps that carried a prefill chunk had exactly {TARGET} tokens and "
             f"none more, where decode-first filled the budget ({max(t.num_scheduled_tokens for t in df.traces)} tokens). The decodes' worst gap fell "
             f"from {x_df[-1] * 1000:.1f} ms to {x_dsf[-1] * 1000:.1f} ms; the prompts' mean TTFT rose from {1000 * sum(t_df) / len(t_df):.0f} ms to "
             f"{1000 * sum(t_dsf) / len(t_dsf):.0f} ms. With the target equal to the budget the policy schedules exactly as decode-first.",
             [("no step with a prefill chunk exceeds the target", max(with_prefill) <= TARGET),
              ("most of them hit it exactly", full_target >= len(with_prefill) // 2),
              ("decode-first fills a bigger step", max(t.num_scheduled_tokens for t in df.traces) > TARGET),
              ("a smaller forward gives a smaller worst gap, at a TTFT price", x_dsf[-1] < x_df[-1] and sum(t_dsf) > sum(t_df)),
              ("target = budget is decode-first", [t.chunks for t in dsf_budget.traces] == [t.chunks for t in df.traces])])
    """),
    *exercise(1, """
        Write a function `answer_1(prompt_len, chunk)` giving the number of steps the engine needs to prefill a prompt
        of `prompt_len` tokens alone with chunks of at most `chunk` tokens. The check compares it with the engine's own
        trace: the textbook run above, and a few more lengths (some divide by the chunk, some do not).
        """, "Every step but the last computes a full chunk; the last computes what is left (at least one token).", "answer_1",
        "answer_1 = lambda prompt_len, chunk: math.ceil(prompt_len / chunk)",
        """
        def engine_chunks(prompt_len, chunk):
            eng = modelled_engine(max_num_batched_tokens=chunk, trace_block_tables=False)
            eng.add_request("p", {"prompt_token_ids": long_ids[:prompt_len]}, SamplingParams(temperature=0.0, max_tokens=1))
            run_to_completion(eng)
            return sum(1 for t in eng.traces for ch in t.chunks if ch.is_prefill)


        cases = [((LONG, CHUNK), len(long_chunks))] + [((n, c), engine_chunks(n, c)) for n, c in ((64, 16), (65, 16), (100, 30), (96, 32))]
        check_function("Exercise 1: number of chunks", answer_1, cases)
        """, wrong=["answer_1 = lambda prompt_len, chunk: prompt_len // chunk  # floor drops the last, short chunk",
                    "answer_1 = lambda prompt_len, chunk: prompt_len / chunk  # a number of steps is a whole number",
                    "answer_1 = lambda prompt_len, chunk: prompt_len // chunk + 1  # one too many when chunk divides the length",
                    "answer_1 = lambda prompt_len, chunk: round(prompt_len / chunk)"]),
    *exercise(2, """
        How many of the long prompt's chunks sampled a token? And at which position does the sampling chunk end (its last position)?
        Answer `(number_sampled, last_position)`.
        """, "Only the chunk that reaches the end of the prompt samples.", "answer_2",
        "answer_2 = (1, LONG - 1)",
        """
        sampled = [ch for _, ch in long_chunks if ch.sampled]
        check("Exercise 2: which chunks sample", answer_2, (len(sampled), sampled[-1].start_pos + sampled[-1].num_tokens - 1))
        """, wrong=["answer_2 = (math.ceil(LONG / CHUNK), LONG - 1)  # every chunk samples", "answer_2 = (1, LONG)  # positions start at 0"]),
    *exercise(3, """
        Decode-first, budget `max_num_batched_tokens = 512`, no `long_prefill_token_threshold`, 10 requests decoding. How many
        prompt tokens fit in a step next to the decodes? The check runs it and reads the largest chunk.
        """, "Each decoding request takes 1 token of the budget.", "answer_3",
        "answer_3 = 512 - 10",
        """
        eng3 = modelled_engine(max_num_batched_tokens=512, trace_block_tables=False)
        arr = [(0, f"d{i}", SHAKESPEARE_OPENINGS[i], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)) for i in range(10)]
        run_with_arrivals(eng3, arr + [(3, "p", {"prompt_token_ids": long_ids[:1500]}, SamplingParams(temperature=0.0, max_tokens=1))])
        mixed = [ch.num_tokens for t in eng3.traces if t.num_decode_tokens == 10 for ch in t.chunks if ch.request_id == "p"]
        check("Exercise 3: prefill tokens next to 10 decodes", answer_3, max(mixed))
        """, wrong=["answer_3 = 512  # the decodes take their tokens first", "answer_3 = 512 // 10", "answer_3 = 512 - 10 - 1"]),
    *question("why does chunking raise the long prompt's own TTFT?", """
        The chunked run gave the decodes a smooth pace but the 8,000-token prompt its first token later than the one big
        step did. Where does the extra time go? What if the chunks were 64 tokens?
        """, """
        Each chunk is a step, and each step pays fixed costs: the per-step overhead and, on a GPU, the read of all the
        weights (a 512-token chunk reads them once for 512 tokens; the single 8,000-token step read them once for 8,000).
        Each chunk also re-reads the K/V of the chunks before it for its attention. With 64-token chunks a chunk is far
        below the ridge point: every step is memory-bound, over 40 % as long as a 512-token step but doing an
        eighth of the work, so the prompt needs eight times as many steps and its TTFT grows past 1.5x the best
        chunk's (checked: the smallest chunks cost at least 1.5x the best TTFT).
        """),
    *question("what if every running request had a 32,000-token context?", """
        The roofs figure used decodes with 1,000 tokens of context. Would mixing a chunk with 64 decodes still save
        most of a step if each decode had 32,000 tokens of context?
        """, """
        No. Each decode reads its whole K/V every step: 64 x 32,000 tokens x 128 KiB (Llama-3-8B, bf16) is about
        270 GB, far more than the 16 GB of weights, so the memory time grows past the chunk's compute time and the mixed
        step becomes memory-bound and long; the weight read the decodes share with the chunk is now a small part of
        their cost, and mixing saves a much smaller share of the two steps than at 1,000 tokens. Long contexts are why
        KV reads, not weights, dominate decode at scale. The cell below checks it.
        """),
    code("""
    # The model answer on the modelled H100: the roofs experiment again, with 32,000 tokens of context per decode.
    def mixing_saving(context):
        dec, chunk = h100.cost(StepWork.of([(1, context, 1)] * 64)), h100.cost(StepWork.of([(512, 0, 0)]))
        mixed = h100.cost(StepWork.of([(512, 0, 0)] + [(1, context, 1)] * 64))
        return mixed, 1 - mixed.time_s / (dec.time_s + chunk.time_s)


    long_mixed, long_saving = mixing_saving(32000)
    short_saving = mixing_saving(1000)[1]
    print(f"chunk + 64 decodes at 32,000 tokens: {long_mixed.time_s * 1e3:.0f} ms, {long_mixed.bound}-bound, K/V read "
          f"{long_mixed.kv_bytes / 1e9:.0f} GB vs {long_mixed.weight_bytes / 1e9:.0f} GB of weights; mixing saves "
          f"{long_saving:.0%} of the two steps (at 1,000 tokens: {short_saving:.0%})")
    claim("about 270 GB of K/V", abs(long_mixed.kv_bytes / 270e9 - 1) < 0.05)
    claim("far more than the weights", long_mixed.kv_bytes > 10 * long_mixed.weight_bytes)
    claim("the mixed step is memory-bound and long", long_mixed.bound == "memory" and long_mixed.memory_time_s > 5 * long_mixed.compute_time_s)
    claim("mixing saves a much smaller share than at 1,000 tokens", long_saving < short_saving / 2)
    """),
    *summary([
        "Chunked prefill splits a long prompt over several steps under the token budget, so decodes keep a steady pace (no generation stall); the long prompt pays some TTFT for it.",
        "A long prefill's transient activations (every position's fp32 logits, naive attention's scores per layer) dwarf the KV it leaves; the engine samples logits at few positions and chunks bound the rest (checked: both activations exceed the KV).",
        "Chunks only add: the block table grows chunk by chunk and the KV of earlier chunks stays in place (checked: each chunk's table starts with the previous table).",
        "A prefill chunk is compute-bound and decodes are memory-bound: in one step the decodes' rows ride on the chunk's GEMMs (one weight read for both); their attention and host time are still paid.",
        "Chunks below the ridge point waste steps; at least 512 tokens on an H100, then benchmark. vLLM's defaults: 8,192 (server) / 16,384 (offline) on H100-class GPUs, 2,048 / 8,192 elsewhere.",
        "The policy orders the budget: decode-first protects ITL, prefill-first favours TTFT, balanced rations both; Dynamic SplitFuse holds each forward at its own target below the budget.",
    ]),
    *glossary([
        ("chunked prefill", "分块预填充", "splitting a prompt's prefill over several steps"),
        ("token budget (`max_num_batched_tokens`)", "词元预算", "most tokens (prefill + decode) per step"),
        ("chunk", "分块", "the part of a prompt computed in one step (块 alone is the KV block)"),
        ("stall-free batching", "无停顿批处理", "decodes first, prefill chunks fill the rest (Sarathi-Serve)"),
        ("Dynamic SplitFuse", "动态拆分融合", "constant forward size: split long prompts, fuse short ones (DeepSpeed-FastGen)"),
        ("decode-first / prefill-first", "解码优先 / 预填充优先", "which kind of work gets the budget first"),
        ("TBT / ITL", "词元间隔", "time between two output tokens of one request"),
        ("ridge point", "屋脊点", "intensity where a step turns from memory-bound to compute-bound"),
    ]),
]
