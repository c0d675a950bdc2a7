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
     "while the prefills are what lengthens the run (fewer steps for prefill, chunks nearer the ridge point); past that point they add only tail. "
     "On an H100-class GPU a prefill chunk becomes compute-bound from about 512 tokens. Among the budgets whose P99 ITL fits the SLO, pick the "
     "one with the most throughput (not simply the largest: the sweep above shows why), and benchmark it; keep headroom for the decodes (budget >= "
     "max_num_seqs). vLLM's defaults: 8,192 (server) / 16,384 (offline) on H100-class GPUs, 2,048 / 8,192 elsewhere (source: vLLM's "
     "`EngineArgs.get_batch_defaults`, chapter 4). Check first that the slots "
     "(`max_num_seqs`) are not the real limit.",
     "Chapter 1 (step time vs tokens), chapter 4 (chunk sweep, vLLM's defaults), chapter 7 (slots), the budget sweep above"),
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
     "Chapter 7 (the budget experiment), the budget sweep above"),
    ("Which scheduling policy would you pick for a product?",
     "It depends on whom the business favours: real-time chat wants smooth streams (decode-first, lowest P99 ITL); RAG or batch jobs want prompts "
     "through (prefill-first: lower TTFT, higher throughput for a burst); a multi-tenant service with paying users wants priority (with aging); "
     "round-robin keeps one long prompt from starving another.",
     "Chapter 7 (each choice backed by a run), chapter 4 (policies on a contended budget)"),
    ("Recompute or swap on preemption?",
     "Recompute frees the KV and prefills prompt + generated tokens again: costs GPU compute (in a step other requests share), no extra memory, "
     "simple. Swap copies blocks to host memory and back: costs PCIe bandwidth and host memory, and the copy can overlap compute. Counted on "
     "the modelled H100 below, the copy takes less time than the recompute at every context length tried; vLLM v1 still only recomputes "
     "(simplicity, no host memory to manage). Either way the output must not change.",
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
     "Chapter 3 (iteration-level), chapter 4 (budget, policies), chapter 5 (cache), chapter 6 (admission, preemption), chapter 7 (SLOs, "
     "priority, cancellation)"),
    ("How much KV cache does Llama-3-8B hold for an 8k-token conversation, in bf16 and in fp8?",
     "Per token: 2 (K and V) x 32 layers x 8 KV heads x 128 dims x bytes per element = 128 KiB in bf16, 64 KiB in fp8; at 8,192 tokens "
     "that is 1 GiB and 0.5 GiB. GQA is why it is not 4 GiB: the 32 query heads share 8 KV heads.",
     "Chapter 1 (KV bytes per token), chapter 2 (blocks)"),
    ("Tensor parallelism: what is communicated in each layer, and how many bytes?",
     "Megatron-style TP splits the attention heads and the MLP's columns; the attention output and the MLP down projection are row-parallel, so "
     "each GPU holds a partial sum that is all-reduced: 2 all-reduces per layer, each of tokens x hidden x 2 bytes (bf16). A decode step's "
     "messages are small (latency-bound); a long prefill's are megabytes per layer.",
     "The step cost model (`StepCostModel.allreduce_count_and_bytes`, what the engine's real collectives per step must equal)"),
    ("Why is FlashAttention fast when it does the same FLOPs?",
     "IO. Standard attention writes the n x n score and probability matrices to HBM and reads them back; FlashAttention tiles Q, K and V "
     "through on-chip SRAM with an online softmax (a running max and a running sum, rescaled as tiles arrive), so HBM sees Q and O once "
     "and K and V once per tile of queries (shared by the query heads of a GQA group). It is exact, not an approximation (Dao et al., 2022).",
     "Chapter 11 (the kernels, bytes counted)"),
    ("Speculative decoding: how does the acceptance rate turn into a speed-up?",
     "With k proposals each accepted with probability a, one verify step yields (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al., "
     "2023). The speed-up is that divided by the verify step's cost in decode steps: at batch 1 decode is memory-bound, so checking k + 1 "
     "tokens costs about one decode; at large batch the verify step costs more, so the same a buys less.",
     "Chapter 13 (the formula simulated, the engine's acceptance, break-even a by batch)"),
]

# The number behind each answer (same order as QA): a conclusion cell computed here, on the modelled H100
# (Llama-3-8B shapes) or from the budget sweep run above.
NUMBERS = [
    """
    dec10 = [(1, 1000, 1)] * 10
    stall, chunked, alone = ms(dec10 + [(8000, 0, 1)]), ms(dec10 + [(512, 0, 1)]), ms(dec10)
    conclude(f"10 decodes (1,000-token contexts) joined by an 8,000-token prompt: unchunked, one step of **{stall:.0f} ms** (every decode waits "
             f"that long for its next token); with 512-token chunks each step is **{chunked:.1f} ms**, against {alone:.1f} ms for the decodes alone.",
             [("the unchunked step is over 5x a chunked one", stall > 5 * chunked), ("a chunk still costs the decodes", chunked > alone)])
    """,
    """
    ridge_tokens = next(t for t in (2 ** i for i in range(15)) if h100.cost([(t, 0, 1)]).bound == "compute")
    best = max(budgets, key=lambda b: budget_rows[b]["total_tok_s"])
    conclude(f"On the modelled H100 a prefill step becomes compute-bound at **{ridge_tokens} tokens** (powers of two tried). In the sweep above "
             f"the most throughput came at budget **{best}**, not at the largest ({budgets[-1]}).",
             [("512-token chunks are compute-bound", h100.cost([(512, 0, 1)]).bound == "compute"),
              ("the ridge is at most 512 tokens", ridge_tokens <= 512)])
    """,
    """
    kv_tokens = (H.memory_bytes * 0.9 - S.weight_bytes) / S.kv_bytes_per_token
    conclude(f"Llama-3-8B on one {H.memory_bytes / 1e9:.0f} GB H100 at 90 % use: weights **{S.weight_bytes / 1e9:.1f} GB**, room for "
             f"**{kv_tokens:,.0f} tokens** of KV ({kv_tokens / 8192:.0f} conversations of 8k tokens), while a step's token budget is a few thousand "
             "tokens: the two budgets bound different resources.",
             [("the KV pool holds far more tokens than one step computes", kv_tokens > 10 * 8192)])
    """,
    """
    small, best = budgets[0], max(budgets, key=lambda b: budget_rows[b]["total_tok_s"])
    tail = budget_rows[best]["engine"]
    worst_step = max(tail.traces, key=lambda tr: tr.duration)
    conclude(f"In the sweep above, budget {best} against {small}: **{budget_rows[best]['total_tok_s'] / budget_rows[small]['total_tok_s']:.1f}x** "
             f"the throughput and **{budget_rows[best]['itl_p99_ms'] / budget_rows[small]['itl_p99_ms']:.2f}x** the P99 ITL; the longest step of "
             f"budget {best} computed {worst_step.num_prefill_tokens} prefill tokens beside its decodes: step composition is the first thing to check.",
             [("more throughput", budget_rows[best]["total_tok_s"] > budget_rows[small]["total_tok_s"]),
              ("a worse tail", budget_rows[best]["itl_p99_ms"] > budget_rows[small]["itl_p99_ms"]),
              ("the longest step carries prefill", worst_step.num_prefill_tokens > 0)])
    """,
    """
    d8 = [(1, 1000, 1)] * 8
    conclude(f"What the policies trade, on the modelled H100: 8 decodes alone take **{ms(d8):.1f} ms** a step (decode-first keeps chat at this "
             f"pace); letting a 512-token prefill chunk into the same step makes it **{ms(d8 + [(512, 0, 1)]):.1f} ms** (prefill-first gets "
             "prompts through sooner, and every stream waits that long).",
             [("the chunk slows the decodes' step", ms(d8 + [(512, 0, 1)]) > 1.5 * ms(d8))])
    """,
    """
    swap_rows = {ctx: (ms([(ctx, 0, 1)]), 2 * S.kv_bytes_per_token * ctx / H.host_link_bandwidth * 1e3) for ctx in (200, 2000, 8000)}
    conclude("Recompute (one prefill step of the context) vs swap (its KV out and back over a "
             f"{H.host_link_bandwidth / 1e9:.0f} GB/s link): " + "; ".join(f"{ctx:,} tokens: {r:.1f} ms vs {w:.1f} ms" for ctx, (r, w) in swap_rows.items())
             + ". The copy takes less time at every length here; what it costs is host memory and the bookkeeping.",
             [("swap's copy is shorter than the recompute at every length", all(w < r for r, w in swap_rows.values()))])
    """,
    """
    waste_mib = (16 - 1) * S.kv_bytes_per_token / 2**20
    conclude(f"Block 16 for Llama-3-8B: at most **{waste_mib:.2f} MiB** of a request's KV is empty (15 slots of "
             f"{S.kv_bytes_per_token // 1024} KiB), and an 8k-token request's block table has **{8192 // 16}** entries (8,192 with block 1).",
             [("the waste is under 2 MiB", waste_mib < 2)])
    """,
    """
    shared, fresh = 2000, 100
    cold, warm = ms([(shared + fresh, 0, 1)]), ms([(fresh, shared, 1)])
    conclude(f"A 2,000-token shared system prompt (125 full blocks) plus {fresh} new tokens: the first token takes **{cold:.1f} ms** without the "
             f"cache and **{warm:.1f} ms** with it ({cold / warm:.1f}x), on the modelled H100.",
             [("the cache cuts the first step by over 3x", cold > 3 * warm)])
    """,
    """
    pf, dc = h100.cost([(2048, 0, 1)]), h100.cost([(1, 1000, 1)] * 16)
    ridge = H.peak_flops_for(2) / H.memory_bandwidth
    conclude(f"A 2,048-token prefill does **{pf.arithmetic_intensity:.0f} FLOP/byte** ({pf.bound}-bound), 16 decodes "
             f"**{dc.arithmetic_intensity:.0f}** ({dc.bound}-bound); the H100's ridge is {ridge:.0f} FLOP/byte: two phases on opposite sides.",
             [("prefill is compute-bound", pf.bound == "compute"), ("decode is memory-bound", dc.bound == "memory"),
              ("they sit either side of the ridge", dc.arithmetic_intensity < ridge < pf.arithmetic_intensity)])
    """,
    """
    slo_ms = 10.0

    def attained(b):
        return sum(max(m.itls) * 1e3 <= slo_ms for rid, m in budget_rows[b]["engine"].request_metrics.items() if rid.startswith("dec"))
    best = max(budgets, key=lambda b: budget_rows[b]["total_tok_s"])
    conclude(f"Throughput alone hides the users: with an ITL SLO of {slo_ms:.0f} ms (every gap of a stream), budget {budgets[0]} serves "
             f"**{attained(budgets[0])} of 8** decode streams within it and budget {best}, the highest throughput, **{attained(best)} of 8**.",
             [("the highest-throughput budget meets the SLO for fewer streams", attained(best) < attained(budgets[0]))])
    """,
    """
    blocks_8k = math.ceil(8192 / 16)
    pool_blocks = int((H.memory_bytes * 0.9 - S.weight_bytes) // (16 * S.kv_bytes_per_token))
    conclude(f"The admission check in numbers: an 8k-token request needs **{blocks_8k} blocks** of 16; the H100's pool above has "
             f"**{pool_blocks:,}**, so at most {pool_blocks // blocks_8k} such requests run at once, whatever the token budget: beyond that "
             "the scheduler queues or preempts.",
             [("the pool holds a whole number of 8k requests", pool_blocks // blocks_8k >= 1)])
    """,
    """
    def kv_per_token_engine(dtype):
        # the engine's own formula on one Llama-3-8B-shaped layer (building 32 would take GBs), then x 32 layers
        cfg = LlamaConfig(hidden_size=S.num_kv_heads * S.head_dim, num_attention_heads=S.num_kv_heads, num_key_value_heads=S.num_kv_heads,
                          head_dim=S.head_dim, num_hidden_layers=1, intermediate_size=64, vocab_size=16)
        return kv_bytes_per_block(LlamaForCausalLM(cfg), 16, dtype) / 16 * S.num_layers

    gib = {name: kv_per_token_engine(dt) * 8192 / 2**30 for name, dt in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn))}
    conclude(f"Llama-3-8B at 8,192 tokens: **{gib['bf16']:.2f} GiB** of KV in bf16, **{gib['fp8']:.2f} GiB** in fp8 (the engine's "
             "`kv_bytes_per_block`; the cost model's `ModelShape` gives the same).",
             [("bf16 equals the cost model's shape", gib["bf16"] == S.kv_bytes_per_token * 8192 / 2**30),
              ("fp8 equals the shape with 1-byte KV", gib["fp8"] == S.with_(kv_dtype_bytes=1).kv_bytes_per_token * 8192 / 2**30),
              ("fp8 halves it", gib["fp8"] * 2 == gib["bf16"])])
    """,
    """
    tp2 = StepCostModel("h100", S, tp=2)
    comm = {name: tp2.allreduce_count_and_bytes(work) for name, work in (("64 decodes", [(1, 1000, 1)] * 64), ("a 2,048-token prefill", [(2048, 0, 1)]))}
    per_layer = {name: b / S.num_layers for name, (n, b) in comm.items()}
    conclude("TP 2, Llama-3-8B on H100s, per layer: " + "; ".join(f"{name}: {comm[name][0] // S.num_layers} all-reduces, **{v / 2**20:.2f} MiB**"
                                                                    for name, v in per_layer.items()) + " (the cost model the engine's collectives are checked against).",
             [("2 all-reduces per layer", all(n == 2 * S.num_layers for n, _ in comm.values())),
              ("each is tokens x hidden x 2 bytes", per_layer["64 decodes"] == 2 * 64 * S.hidden_size * 2
               and per_layer["a 2,048-token prefill"] == 2 * 2048 * S.hidden_size * 2)])
    """,
    """
    from minengine.course.attention_traffic import dense_bytes, flash_bytes   # chapter 11's counts, checked there on toy kernels

    n_att, q_tile, group = 8192, 128, S.num_heads // S.num_kv_heads
    dense_io = S.num_heads * dense_bytes(n_att, n_att, S.head_dim)                                   # every query head: S and P in HBM
    flash_io = S.num_kv_heads * flash_bytes(n_att, n_att, S.head_dim, q_tile=q_tile, group=group)    # K/V tiles shared by a GQA group
    unpacked_io = S.num_heads * flash_bytes(n_att, n_att, S.head_dim, q_tile=q_tile)                 # each query head reads its own K/V
    conclude(f"One layer of Llama-3-8B, a prefill of {n_att:,} tokens, bf16: standard attention moves **{dense_io / 1e9:.1f} GB** of HBM traffic, "
             f"FlashAttention with {q_tile}-query tiles **{flash_io / 1e9:.2f} GB** when each K/V tile serves the {group} query heads of its KV head "
             f"(**{dense_io / flash_io:.1f}x less**), {unpacked_io / 1e9:.2f} GB without that GQA packing ({dense_io / unpacked_io:.1f}x less): "
             "chapter 11's `dense_bytes` and `flash_bytes`, the counts its toy kernels check, with K/V re-read for every query tile.",
             [("the n x n term dominates the dense traffic", S.num_heads * 2 * 4 * n_att * n_att > 0.9 * dense_io),
              ("flash moves over 10x less with GQA packing", dense_io > 10 * flash_io),
              ("GQA packing divides the K/V re-reads", unpacked_io > flash_io)])
    """,
    """
    def expected_tokens(a, k):
        return (1 - a ** (k + 1)) / (1 - a)

    def spec_speedup(a, k, batch):
        return expected_tokens(a, k) * ms([(1, 1000, 1)] * batch) / ms([(1 + k, 1000, 1 + k)] * batch)

    k_spec = 4
    conclude(f"k = {k_spec}, a = 0.7: **{expected_tokens(0.7, k_spec):.2f} tokens** per verify step; on the modelled H100 that is a "
             f"**{spec_speedup(0.7, k_spec, 1):.2f}x** speed-up at batch 1 and **{spec_speedup(0.7, k_spec, 256):.2f}x** at batch 256.",
             [("batch 1 keeps almost all of it", spec_speedup(0.7, k_spec, 1) > 0.95 * expected_tokens(0.7, k_spec)),
              ("a large batch keeps less", spec_speedup(0.7, k_spec, 256) < spec_speedup(0.7, k_spec, 1))])
    """,
]

CELLS = [
    *header(8, "Interview walkthrough", [
        "Answer the common LLM-serving interview questions crisply, with a number computed in this chapter behind each answer.",
        "Answer the GPU questions too: KV size in bf16 and fp8, tensor-parallel traffic, FlashAttention's IO, speculative decoding's speed-up.",
        "Tie each answer to the experiment that shows it, and re-run one live (the token budget).",
        "Check yourself with a short quiz whose answers are verified by running the engine.",
    ], ["Yu et al., Orca, OSDI 2022", "Kwon et al., PagedAttention, SOSP 2023", "Agrawal et al., Sarathi-Serve, OSDI 2024",
        "Holmes et al., DeepSpeed-FastGen, 2024", "Zheng et al., SGLang / RadixAttention, 2024", "Zhong et al., DistServe, OSDI 2024",
        "Patel et al., Splitwise, ISCA 2024", "Qin et al., Mooncake, FAST 2025", "Shoeybi et al., Megatron-LM, 2019",
        "Dao et al., FlashAttention, NeurIPS 2022", "Leviathan et al., speculative decoding, ICML 2023", "vLLM docs (docs.vllm.ai)"]),
    code(SETUP + """import math

import torch
from transformers import LlamaConfig

from minengine.course import teaching_cost_model
from minengine.models.llama import LlamaForCausalLM
from minengine.timing import HARDWARE, LLAMA_3_8B, StepCostModel
from minengine.worker.model_runner import kv_bytes_per_block
from minengine.workloads import SHAKESPEARE_OPENINGS

h100, S, H = teaching_cost_model(), LLAMA_3_8B, HARDWARE["h100"]   # the teaching clock's cost model, shapes and GPU


def ms(work):
    \"\"\"Modelled milliseconds of one step: work = [(new tokens, context, sampled), ...] per request.\"\"\"
    return h100.cost(work).time_s * 1e3
"""),
    md("""
    ## Live: choose a token budget
    The same mixed workload (8 decoding requests, prompts of a few hundred tokens arriving) under several budgets, on the
    modelled clock (H100, Llama-3-8B shapes). Each budget gives a step-time tail (the worst ITL a decode sees) and a
    throughput. Among the budgets whose P99 ITL meets your SLO, pick the one with the most throughput: as the run shows,
    the largest is not always it.
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
                      yaxis_title="P99 ITL (ms)", yaxis2=dict(title="total tokens/s", overlaying="y", side="right", tickmode="auto", showgrid=False),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0))   # below the plot, clear of the right axis
    fig.show()
    largest = budget_rows[budgets[-1]]["engine"]
    titled(viz.itl_figure(largest.request_metrics, largest.traces, threshold_s=budget_rows[budgets[0]]["itl_p99_ms"] / 1000),
           f"budget {budgets[-1]}: gaps above the smallest budget's P99 ITL, and their causes").show()
    """),
    conclusion("""
    itl = [budget_rows[b]["itl_p99_ms"] for b in budgets]
    tps = [budget_rows[b]["total_tok_s"] for b in budgets]
    steps = [budget_rows[b]["steps"] for b in budgets]
    knee = next(b for b in budgets if budget_rows[b]["total_tok_s"] >= 0.95 * max(tps))   # the smallest budget within 5 % of the best
    after = [budget_rows[b] for b in budgets if b >= knee]
    spread = (max(r["total_tok_s"] for r in after) - min(r["total_tok_s"] for r in after)) / max(tps)
    decode_len = pick(48, 24)
    conclude(f"From budget {budgets[0]} to {budgets[-1]} the P99 ITL grew from **{itl[0]:.1f} ms** to **{itl[-1]:.1f} ms**, at every step up. "
             f"Throughput rose from {tps[0]:,.0f} tok/s to within 5 % of its best ({max(tps):,.0f}) by budget **{knee}**; from there on it "
             f"moved by at most {spread:.0%} (its best at budget {budgets[tps.index(max(tps))]}), while the tail grew from "
             f"{budget_rows[knee]['itl_p99_ms']:.1f} to {itl[-1]:.1f} ms. Past budget {knee} the run takes {steps[budgets.index(knee)]} to "
             f"{steps[-1]} steps, about one per decode token ({decode_len}): the decodes, not the prefills, set its length, so a bigger budget "
             "only makes each step longer. A budget buys throughput with the tail only up to that point.",
             [("a bigger budget never lowers the P99 ITL", all(a <= b + 1e-9 for a, b in zip(itl, itl[1:]))),
              ("throughput rose up to the knee", budget_rows[knee]["total_tok_s"] > tps[0]),
              ("past the knee throughput stays within the stated spread", spread <= 0.05 + 1e-12),
              ("past the knee the tail still grows", itl[-1] > budget_rows[knee]["itl_p99_ms"]),
              ("past the knee about one step per decode token", all(decode_len <= r["steps"] <= decode_len + 2 for r in after))])
    """),
    md("""
    "The defaults are mostly good; don't over-tune." How far does this sweep support that? Run the same workload at
    vLLM's server default for an H100-class GPU, 8,192 tokens (source: vLLM's `EngineArgs.get_batch_defaults`), and
    put it beside the budgets tuned by hand:
    """),
    code("""
    VLLM_SERVER_DEFAULT_H100 = 8192
    default_row = mixed(VLLM_SERVER_DEFAULT_H100)
    print(f"budget {VLLM_SERVER_DEFAULT_H100} (vLLM's default): P99 ITL {default_row['itl_p99_ms']:.1f} ms | total {default_row['total_tok_s']:.0f} tok/s")
    """),
    conclusion("""
    best_tps = max(r["total_tok_s"] for r in budget_rows.values())
    lowest_tail = min(budget_rows.values(), key=lambda r: r["itl_p99_ms"])
    within_default = [b for b in budgets if budget_rows[b]["total_tok_s"] >= 0.95 * default_row["total_tok_s"]]
    tuned = min(within_default, key=lambda b: budget_rows[b]["itl_p99_ms"])   # the best tail without losing over 5 % of the default's throughput
    conclude(f"vLLM's default budget reaches **{default_row['total_tok_s'] / best_tps:.1%}** of the best throughput any hand-tuned budget found "
             f"here: for throughput the default is as good as tuning. What tuning can buy is tail: budget {tuned} keeps throughput within 5 % of the "
             f"default's and cuts the P99 ITL from {default_row['itl_p99_ms']:.1f} ms to **{budget_rows[tuned]['itl_p99_ms']:.1f} ms**; going lower "
             f"(budget {budgets[0]}) gives {lowest_tail['itl_p99_ms']:.1f} ms at {lowest_tail['total_tok_s'] / default_row['total_tok_s']:.0%} of the "
             "throughput. So: start from the default and lower the budget only as far as a measured ITL SLO asks, on your own workload; "
             "this sweep is one small workload, so it supports no more than that.",
             [("the default is within 2 % of the best throughput", default_row["total_tok_s"] >= 0.98 * best_tps),
              ("a tuned budget has a lower tail at near the default's throughput", budget_rows[tuned]["itl_p99_ms"] < default_row["itl_p99_ms"]),
              ("the lowest tail is the smallest budget's", lowest_tail is budget_rows[budgets[0]]),
              ("the smallest budget costs throughput", lowest_tail["total_tok_s"] < 0.95 * default_row["total_tok_s"])])
    """),
    code("""
    import ipywidgets as widgets


    def budget_for_slo(slo_ms=15.0):
        ok = [b for b, r in budget_rows.items() if r["itl_p99_ms"] <= slo_ms]
        if not ok:
            print(f"no budget tried meets P99 ITL <= {slo_ms:.0f} ms")
            return
        # the most throughput among those meeting the SLO; on a tie the lower tail
        b = max(ok, key=lambda x: (budget_rows[x]["total_tok_s"], -budget_rows[x]["itl_p99_ms"]))
        dominated_by = [x for x, r in budget_rows.items() if r["total_tok_s"] > budget_rows[b]["total_tok_s"] and r["itl_p99_ms"] <= budget_rows[b]["itl_p99_ms"]]
        claim("no budget tried beats the pick on both throughput and tail", not dominated_by)
        r = mixed(b)   # re-run the chosen budget: on the modelled clock a re-run gives the same numbers
        print(f"P99 ITL SLO {slo_ms:.0f} ms -> budget {b}: re-run gives P99 ITL {r['itl_p99_ms']:.1f} ms, {r['total_tok_s']:.0f} tok/s "
              f"(first run: {budget_rows[b]['itl_p99_ms']:.1f} ms); the largest budget meeting the SLO was {max(ok)}"
              + ("" if max(ok) == b else f" ({budget_rows[max(ok)]['total_tok_s']:.0f} tok/s, P99 ITL {budget_rows[max(ok)]['itl_p99_ms']:.1f} ms: worse on both)"))
        titled(viz.itl_figure(r["engine"].request_metrics, r["engine"].traces, threshold_s=slo_ms / 1000), f"budget {b}").show()


    widgets.interact_manual(budget_for_slo, slo_ms=widgets.FloatSlider(value=15.0, min=5.0, max=200.0, step=1.0))
    """),
    md("## Questions and answers\nRead the question, answer aloud in two sentences, then open the model answer. The cell under each one "
       "computes the number behind it (modelled H100, Llama-3-8B shapes, or the budget sweep above) and asserts what its sentence says."),
    *[cell for i, ((q, a, where), number) in enumerate(zip(QA, NUMBERS, strict=True))
      for cell in [*question(f"Q{i + 1}. {q}", "Answer aloud in two sentences, then compare.", f"{a}\n\n**Shown in:** {where}."),
                   conclusion(number)]],
    md("More interview topics, each with a number computed and checked: [chapter 16](16_interview_topics.ipynb) (draft models and "
       "trees, FlashAttention-2 and -3, weight quantization, shrinking the KV cache) and [chapter 17](17_interview_scale.ipynb) "
       "(`n > 1` and beam search on a paged cache, collectives and context parallelism, pipeline bubbles, LoRA serving)."),
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
        "Continuous batching refills idle slots every step; chunked prefill bounds the stalls long prompts cause in a continuous batch (checked: ch03 · continuous batching needs fewer steps; ch04 · the worst decode gap grows with the chunk).",
        "The token budget is chosen from the TBT SLO (chunks of 512+ tokens, then benchmark; check the slots first); the block size from waste vs efficiency; recompute vs swap from compute vs bandwidth.",
        "A scheduler checks both budgets and preempts; the policy follows the business (chat: decode-first, batch: prefill-first, tenants: priority).",
        "Prefix caching = chained block hashes + ref counts + LRU; disaggregation separates the compute-bound and memory-bound phases.",
        "Alert on what users feel (P99 TTFT, P99 ITL, SLO attainment) and on what predicts it (queue, KV usage, preemptions).",
        "A bigger token budget buys throughput only while the prefills set the run's length; past that it buys only tail: pick the most throughput within the SLO (checked: past the knee throughput stays within the stated spread; no budget tried beats the pick on both throughput and tail).",
        "vLLM's default budget was within a few percent of the best hand-tuned throughput here; tuning bought tail, not throughput: start from the default and lower it only for a measured SLO (checked: the default is within 2 % of the best throughput; a tuned budget has a lower tail at near the default's throughput).",
        "GPU side: KV = 2 x layers x KV heads x head_dim x bytes per token (Llama-3-8B: 128 KiB in bf16); TP all-reduces 2 x tokens x hidden x 2 bytes per layer; FlashAttention removes the n x n HBM traffic; speculation yields (1 - a^(k+1)) / (1 - a) tokens per verify, worth less at large batch (checked: ch13 · the break-even alpha rises with the batch; ch11 · flash moves fewer bytes than dense).",
    ]),
    *glossary([
        ("continuous batching", "连续批处理", "rebuild the batch every step"),
        ("chunked prefill", "分块预填充", "split a prompt over steps under the token budget"),
        ("token budget", "词元预算", "most tokens per step (`max_num_batched_tokens`)"),
        ("preemption (recompute / swap)", "抢占（重算 / 换出）", "take KV back from a running request"),
        ("prefix caching", "前缀缓存", "reuse K/V of shared prompt prefixes"),
        ("disaggregation", "预填充与解码分离", "prefill and decode on different GPUs, KV shipped between"),
        ("goodput", "有效吞吐", "requests per second that met the SLO"),
        ("tensor parallelism (all-reduce)", "张量并行（全归约）", "one layer split over GPUs, partial sums summed"),
        ("speculative decoding (acceptance rate)", "投机解码（接受率）", "propose k tokens cheaply, verify them in one step"),
        ("SLO", "服务等级目标", "latency bounds (TTFT, TPOT, P99 TBT)"),
    ]),
]
