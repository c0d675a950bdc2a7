# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 17: interview topics of scale, each with a number the learner computes and a check: n > 1 and beam search
on a paged cache (blocks shared, copied and recomputed, measured on the real engine), collectives (ring vs tree
all-reduce in the alpha-beta model, a ring all-reduce and ring attention run as toys) and sequence / context
parallelism, pipeline parallelism's bubble against a toy schedule, and LoRA with multi-LoRA batching on the modelled
clock."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(17, "Interview topics, computed: samples, GPUs and adapters", [
        "Measure on the engine what `n > 1` shares on a paged cache (prompt blocks with ref counts) and what each sample holds alone; price copy-on-write for beam search with a block-level toy.",
        "Compute ring and tree all-reduce times in the α–β model, find where they cross, and check a ring all-reduce and ring attention (context parallelism) as toys.",
        "Derive the pipeline bubble `(p - 1) / (m + p - 1)` and check it against a toy schedule, with unequal stages too.",
        "Size LoRA adapters and price serving many of them in one batch (Punica / S-LoRA) against one batch per adapter on the modelled H100.",
    ], ["Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention*, SOSP 2023 (copy-on-write, beam search)",
        "Thakur, Rabenseifner and Gropp, *Optimization of Collective Communication Operations in MPICH*, IJHPCA 2005 (α–β costs)",
        "Liu et al., *Ring Attention with Blockwise Transformers*, ICLR 2024; Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*, MLSys 2023 (sequence parallelism)",
        "Huang et al., *GPipe*, NeurIPS 2019; Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, SC 2021",
        "Hu et al., *LoRA*, ICLR 2022; Chen et al., *Punica*, MLSys 2024; Sheng et al., *S-LoRA*, MLSys 2024",
        "minengine `engine/parallel_sampling.py`, `core/kv_cache_manager.py`, `timing/cost_model.py`"]),
    code(SETUP + """\
import math
import random

import torch

from minengine.timing import LLAMA_3_8B, LLAMA_3_70B, StepCostModel, StepWork
from minengine.timing.hardware import get_hardware
"""),
    md("""
    ## n > 1, beam search and copy-on-write on a paged cache
    `SamplingParams(n=4)` asks for four samples of one prompt. The engine does what vLLM v1 does
    (`engine/parallel_sampling.py`): it fans the request out into `n` ordinary child requests, and the children find
    the prompt's **full** blocks in the prefix cache, so those blocks are held once with a ref count of `n`. The last,
    partly filled prompt block is not shared: each child computes those tokens again into a block of its own (and a
    prompt that fills its last block exactly has that block recomputed too, since a hit never covers the whole
    prompt). PagedAttention's first design (Kwon et al., SOSP 2023) shared the partial block as well and **copied** it
    when a child first wrote to it (copy-on-write). Measure the engine, with the prefix cache on and off:
    """),
    code("""
    def serve_n(prompt_len, out_len, n, prefix_caching=True):
        eng = modelled_engine(enable_prefix_caching=prefix_caching)
        prompt = [5 + (7 * i) % 300 for i in range(prompt_len)]
        eng.add_request("p", {"prompt_token_ids": prompt}, SamplingParams(n=n, temperature=1.0, seed=0, max_tokens=out_len, ignore_eos=True))
        run_to_completion(eng)
        first = eng.traces[0]
        return {"peak_blocks": max(t.num_used_blocks for t in eng.traces),
                "prefill_tokens": sum(c.num_tokens for t in eng.traces for c in t.chunks if c.is_prefill),
                "shared_blocks": sum(1 for r in first.block_ref_counts if r == n) if n > 1 else 0, "engine": eng}


    PROMPT, OUT, N = 100, 20, 4
    on, off = serve_n(PROMPT, OUT, N), serve_n(PROMPT, OUT, N, prefix_caching=False)
    peaks = {(L, o, n): serve_n(L, o, n)["peak_blocks"] for L, o, n in ((96, 20, 4), (37, 40, 2))}  # for exercise 1
    peaks[(PROMPT, OUT, N)] = on["peak_blocks"]
    BLOCK = on["engine"].config.block_size
    print(f"n = {N}, prompt {PROMPT} tokens, {OUT} out, block {BLOCK}")
    for name, r in (("prefix cache on", on), ("prefix cache off", off)):
        print(f"{name:17s}: peak {r['peak_blocks']} blocks, {r['prefill_tokens']} prompt tokens computed, {r['shared_blocks']} blocks shared by all {N}")
    viz.block_tables_figure(on["engine"].traces[0]).update_layout(title=f"n = {N}: the children's block tables after the first step (shared blocks dark, *)").show()
    """),
    conclusion("""
    full = (PROMPT - 1) // BLOCK
    cow_tokens = PROMPT  # copy-on-write: the prompt computed once, the partial block copied n - 1 times
    conclude(f"With the prefix cache the {N} samples hold **{on['shared_blocks']}** prompt blocks once (ref count {N}) and peak at "
             f"**{on['peak_blocks']}** blocks against {off['peak_blocks']} without it; they compute **{on['prefill_tokens']}** prompt tokens "
             f"instead of {off['prefill_tokens']}: the prompt once, plus {PROMPT - full * BLOCK} tokens of the partial block again for each other child. "
             f"Copy-on-write would compute {cow_tokens} and copy {N - 1} blocks instead: v1 trades a block copy for recomputing fewer than "
             f"{BLOCK} tokens per child.",
             [("the shared blocks are the prompt's full blocks", on["shared_blocks"] == full),
              ("sharing holds fewer blocks", on["peak_blocks"] < off["peak_blocks"]),
              ("the prompt is computed once plus the partial block per other child", on["prefill_tokens"] == PROMPT + (N - 1) * (PROMPT - full * BLOCK)),
              ("without the cache every child computes the whole prompt", off["prefill_tokens"] == N * PROMPT)])
    """),
    md("""
    **Beam search** keeps the `W` best partial sequences; at every step each new beam extends one of the old ones, so
    beams fork and die at every token. On a paged cache a fork copies no full block: the child's table points at the
    parent's blocks and their ref counts go up; only when two beams would write into the same partly filled last
    block is it copied (copy-on-write). (vLLM v1 runs beam search above the engine, each beam an ordinary request
    that finds its prefix in the prefix cache (source: vLLM's `LLM.beam_search`, vllm/entrypoints/llm.py).) A block-level toy, beams picking their parents at random:
    """),
    code("""
    def beam_search_blocks(width, steps, prompt_len, block, rng):
        \"\"\"Peak live blocks and copies of copy-on-write beam search; each step every new beam extends a random old one.\"\"\"
        ref, next_id = {}, 0

        def new_block():
            nonlocal next_id
            next_id += 1
            ref[next_id] = 1
            return next_id

        beams = [([new_block() for _ in range(math.ceil(prompt_len / block))], prompt_len)]
        peak, copies = len(ref), 0
        for _ in range(steps):
            children = [(list(t), n) for t, n in (beams[rng.randrange(len(beams))] for _ in range(width))]
            for table, _ in children:
                for b in table:
                    ref[b] += 1
            for table, _ in beams:  # the old beams are replaced
                for b in table:
                    ref[b] -= 1
                    if ref[b] == 0:
                        del ref[b]
            beams = []
            for table, n in children:
                if n % block == 0:
                    table.append(new_block())       # a fresh block for the new token
                elif ref[table[-1]] > 1:            # a shared partial block: copy before writing
                    ref[table[-1]] -= 1
                    table[-1] = new_block()
                    copies += 1
                beams.append((table, n + 1))
            peak = max(peak, len(ref))
        return peak, copies


    WIDTH, STEPS = 4, pick(64, 32)
    peak_cow, copies = beam_search_blocks(WIDTH, STEPS, PROMPT, BLOCK, random.Random(0))
    peak_copy = WIDTH * math.ceil((PROMPT + STEPS) / BLOCK)  # every beam holding its own table
    print(f"beam width {WIDTH}, {STEPS} steps: copy-on-write peaks at {peak_cow} live blocks with {copies} block copies; own tables need {peak_copy}")
    """),
    conclusion("""
    conclude(f"Copy-on-write beam search (width {WIDTH}, {STEPS} steps) peaks at **{peak_cow}** live blocks against **{peak_copy}** "
             f"for beams with their own tables, and copies **{copies}** blocks in {STEPS} steps: at most {WIDTH - 1} per step, "
             "one block each, never a whole table.",
             [("sharing holds fewer blocks", peak_cow < peak_copy),
              ("at most width - 1 copies per step", copies <= (WIDTH - 1) * STEPS),
              ("some copies happened", copies > 0)])
    """),
    *exercise(1, """
    Write `n_sample_blocks(prompt_len, out_len, n, block_size)`: the peak KV blocks the engine holds for one request with
    `SamplingParams(n=n)`, prefix caching on, `out_len` tokens each (the last sampled token is never written to the
    cache). Checked against the engine, run on prompts that fill their last block and prompts that do not.
    """, "Shared: the prompt's full blocks a child can hit (a hit never covers the whole prompt). Own: each child's blocks from there to its last written token.",
        "n_sample_blocks",
        """
    def n_sample_blocks(prompt_len, out_len, n, block_size):
        shared = (prompt_len - 1) // block_size
        return shared + n * (math.ceil((prompt_len + out_len - 1) / block_size) - shared)
    """,
        """
    CASES = [((L, o, n, BLOCK), peak) for (L, o, n), peak in peaks.items()]  # measured on the engine above
    check_function("n_sample_blocks", n_sample_blocks, CASES, hint="(prompt_len - 1) // block_size blocks are shared; each child holds the rest of its blocks.")
    """,
        wrong=[
            "n_sample_blocks = lambda prompt_len, out_len, n, block_size: n * math.ceil((prompt_len + out_len - 1) / block_size)  # nothing shared",
            "n_sample_blocks = lambda prompt_len, out_len, n, block_size: prompt_len // block_size + n * (math.ceil((prompt_len + out_len - 1) / block_size) - prompt_len // block_size)  # a full last prompt block shared too",
            "n_sample_blocks = lambda prompt_len, out_len, n, block_size: math.ceil(prompt_len / block_size) + n * math.ceil(out_len / block_size)  # the partial block shared, outputs block-aligned",
        ]),
    md("""
    ## Collectives: ring and tree all-reduce, and context parallelism
    Tensor parallelism ends its attention and MLP with an **all-reduce** (chapter 14). In the α–β model a message of
    `b` bytes costs `α + b / bw`: a latency per hop and a time per byte (Thakur et al., IJHPCA 2005). Over `p` ranks:
    - **ring**: a reduce-scatter then an all-gather, each `p - 1` hops of `n / p` bytes: `2 (p - 1) α + 2 (p - 1) / p · n / bw`;
      the bandwidth term barely grows with `p`, the latency term grows linearly;
    - **tree** (reduce up a binary tree, broadcast down): `2 ⌈log₂ p⌉ (α + n / bw)`: logarithmic latency, but the whole
      message on every hop. NCCL chooses between its ring and (pipelined, double binary) tree algorithms by message
      size and rank count (source: NCCL's `NCCL_ALGO` documentation).

    First the ring run as a toy, to count its messages; then both formulas at a few sizes, with an assumed `ALPHA_S`
    per hop and `BW` per link:
    """),
    code("""
    def ring_allreduce(data):
        \"\"\"data[r][c]: rank r's chunk c (p chunks each). Reduce-scatter then all-gather around the ring; returns the result and messages per rank.\"\"\"
        p, x, sent = len(data), [list(d) for d in data], 0
        for step in range(p - 1):  # rank r sends chunk (r - step) to r + 1, which adds it
            msgs = [(r, (r - step) % p, x[r][(r - step) % p]) for r in range(p)]
            for r, c, v in msgs:
                x[(r + 1) % p][c] += v
            sent += 1
        for step in range(p - 1):  # rank r sends its finished chunk (r + 1 - step) to r + 1, which keeps it
            msgs = [(r, (r + 1 - step) % p, x[r][(r + 1 - step) % p]) for r in range(p)]
            for r, c, v in msgs:
                x[(r + 1) % p][c] = v
            sent += 1
        return x, sent


    P_TOY = 8
    toy = [[random.Random(r * 100 + c).random() for c in range(P_TOY)] for r in range(P_TOY)]
    reduced, sent_per_rank = ring_allreduce(toy)
    totals = [sum(toy[r][c] for r in range(P_TOY)) for c in range(P_TOY)]
    ring_ok = all(abs(reduced[r][c] - totals[c]) < 1e-12 for r in range(P_TOY) for c in range(P_TOY))
    print(f"ring all-reduce over {P_TOY} ranks: every rank holds the sum: {ring_ok}; messages per rank: {sent_per_rank}, each 1/{P_TOY} of the data")

    ALPHA_S, BW = 10e-6, 50e9  # assumed: 10 µs per hop, 50 GB/s per link (one 400 Gb/s NIC per GPU)


    def ring_time(n_bytes, p):
        return 2 * (p - 1) * ALPHA_S + 2 * (p - 1) / p * n_bytes / BW


    def tree_time(n_bytes, p):
        return 2 * math.ceil(math.log2(p)) * (ALPHA_S + n_bytes / BW)


    SIZES = [2**10, 2**16, 2**20, 2**24, 2**28]
    for p in (8, 64):
        print(f"p = {p:2d}: " + " | ".join(f"{n / 2**20:g} MiB ring {ring_time(n, p) * 1e3:.3f} ms, tree {tree_time(n, p) * 1e3:.3f} ms" for n in SIZES))
    crossover = {p: (2 * (p - 1) - 2 * math.ceil(math.log2(p))) * ALPHA_S * BW / (2 * math.ceil(math.log2(p)) - 2 * (p - 1) / p) for p in (8, 64)}
    print("sizes where they cross:", {p: f"{c / 2**20:.2f} MiB" for p, c in crossover.items()})
    """),
    conclusion("""
    c8, c64 = crossover[8], crossover[64]
    conclude(f"The toy ring leaves the full sum on all {P_TOY} ranks after **{sent_per_rank}** messages per rank, 2 (p - 1), each 1/p of the data. "
             f"With α = {ALPHA_S * 1e6:.0f} µs and {BW / 1e9:.0f} GB/s, the tree is faster below **{c8 / 2**20:.2f} MiB** at 8 ranks and below "
             f"**{c64 / 2**20:.2f} MiB** at 64, the ring above: the ring's latency grows with p, the tree's bytes with log p. A decode step's "
             f"all-reduce for Llama-3-8B at 64 tokens is {64 * LLAMA_3_8B.hidden_size * 2 / 2**20:.1f} MiB, on the tree side at 64 ranks.",
             [("the toy ring is exact", ring_ok),
              ("2 (p - 1) messages per rank", sent_per_rank == 2 * (P_TOY - 1)),
              ("at the crossover the times agree", abs(ring_time(c64, 64) / tree_time(c64, 64) - 1) < 1e-9),
              ("the tree wins below and the ring above, at 64 ranks", tree_time(c64 / 2, 64) < ring_time(c64 / 2, 64) and ring_time(c64 * 2, 64) < tree_time(c64 * 2, 64)),
              ("more ranks move the crossover up", c64 > c8),
              ("a 64-token decode all-reduce is below the 64-rank crossover", 64 * LLAMA_3_8B.hidden_size * 2 < c64)])
    """),
    md("""
    **Sequence and context parallelism** split the *sequence* over GPUs. Megatron's sequence parallelism (Korthikanti
    et al., MLSys 2023) splits the norms' and dropouts' activations along the sequence between TP's matmuls, turning
    each all-reduce into a reduce-scatter plus an all-gather of the same total bytes. **Context parallelism** splits a
    long prompt's attention: in **ring attention** (Liu et al., ICLR 2024) each of `p` ranks keeps its queries and
    passes its block of K/V around the ring, merging each block into its output with the online softmax, while the
    next block is in flight (DeepSpeed-Ulysses instead trades sequence for heads with two all-to-alls). It overlaps
    when a block's attention takes longer than sending the next block's K/V. A toy, then that condition for
    Llama-3-8B on the H100 preset (its peak FLOP/s and NVLink bandwidth) and over the link above:
    """),
    code("""
    torch.manual_seed(0)
    S, D, P_CP = 64, 16, 4
    q, k, v = (torch.randn(S, D, dtype=torch.float64) for _ in range(3))
    full = torch.softmax(q @ k.T / D ** 0.5, dim=-1) @ v
    blocks = list(zip(k.chunk(P_CP), v.chunk(P_CP)))
    outs = []
    for r, q_r in enumerate(q.chunk(P_CP)):           # rank r: its queries, the K/V blocks arriving around the ring
        m = torch.full((len(q_r), 1), -math.inf, dtype=torch.float64)
        l, o = torch.zeros_like(m), torch.zeros(len(q_r), D, dtype=torch.float64)
        for step in range(P_CP):
            k_b, v_b = blocks[(r - step) % P_CP]
            s = q_r @ k_b.T / D ** 0.5
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            o = o * torch.exp(m - m_new) + torch.exp(s - m_new) @ v_b
            l = l * torch.exp(m - m_new) + torch.exp(s - m_new).sum(-1, keepdim=True)
            m = m_new
        outs.append(o / l)
    ring_err = (torch.cat(outs) - full).abs().max().item()

    h100 = get_hardware("h100")
    sh = LLAMA_3_8B


    def min_tokens_per_rank(flops, bw):
        \"\"\"Tokens per rank where a block's attention (4 t^2 heads head_dim FLOPs) outlasts sending t tokens' K and V.\"\"\"
        return 2 * sh.num_kv_heads * sh.head_dim * sh.dtype_bytes * flops / (4 * sh.num_heads * sh.head_dim * bw)


    overlap = {"NVLink": min_tokens_per_rank(h100.peak_flops * h100.mfu, h100.interconnect_bandwidth),
               "network link": min_tokens_per_rank(h100.peak_flops * h100.mfu, BW)}
    print(f"ring attention over {P_CP} ranks vs full attention: max |difference| {ring_err:.1e}")
    print("tokens per rank from which the K/V transfer hides behind compute:", {k: round(t) for k, t in overlap.items()})
    """),
    conclusion("""
    conclude(f"Ring attention over {P_CP} ranks equals full attention to **{ring_err:.0e}** (float64). For Llama-3-8B on the modelled H100 "
             f"the K/V transfer hides behind the block's attention once each rank holds about **{overlap['NVLink']:,.0f}** tokens over NVLink, "
             f"**{overlap['network link']:,.0f}** over the {BW / 1e9:.0f} GB/s link: context parallelism pays for long prompts, not short ones.",
             [("ring attention is exact", ring_err < 1e-12),
              ("a slower link needs longer shards", overlap["network link"] > overlap["NVLink"]),
              ("both thresholds are below a 32K prompt split 8 ways", overlap["network link"] < 32768 / 8)])
    """),
    *exercise(2, """
    Write `ring_allreduce_time(n_bytes, p, alpha, bw)`: the α–β time of a ring all-reduce of `n_bytes` over `p` ranks,
    `alpha` seconds per hop, `bw` bytes per second per link. Checked at 2, 8 and 64 ranks, small and large messages.
    """, "A reduce-scatter and an all-gather, each p - 1 hops of n / p bytes.",
        "ring_allreduce_time",
        """
    def ring_allreduce_time(n_bytes, p, alpha, bw):
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / bw
    """,
        """
    hops = {p: ring_allreduce([[0.0] * p for _ in range(p)])[1] for p in (2, 8, 64)}  # messages per rank, counted by the toy
    CASES = [((n, p, a, b), hops[p] * (a + n / p / b)) for n in (2**10, 2**26) for p in hops for a, b in ((10e-6, 50e9), (2e-6, 450e9))]
    check_function("ring_allreduce_time", ring_allreduce_time, CASES, hint="2 (p - 1) hops; each moves n / p bytes.", rel_tol=1e-9)
    """,
        wrong=[
            "ring_allreduce_time = lambda n_bytes, p, alpha, bw: 2 * (p - 1) * alpha + 2 * n_bytes / bw  # (p - 1) / p forgotten: right only for large p",
            "ring_allreduce_time = lambda n_bytes, p, alpha, bw: (p - 1) * alpha + (p - 1) / p * n_bytes / bw  # the reduce-scatter only",
            "ring_allreduce_time = lambda n_bytes, p, alpha, bw: alpha + 2 * (p - 1) / p * n_bytes / bw  # one latency for the whole collective",
        ]),
    md("""
    ## Pipeline parallelism: bubbles and micro-batches
    Pipeline parallelism (PP) gives each of `p` GPUs a contiguous slice of the layers; activations go from one stage to
    the next. One batch would keep one stage busy at a time, so the batch is cut into `m` **micro-batches** that follow
    each other through the stages (GPipe, Huang et al., NeurIPS 2019). With equal stages the pipeline takes `m + p - 1`
    slots, of which each stage works `m`: the **bubble**, the idle share, is `(p - 1) / (m + p - 1)`. (Training's 1F1B
    schedule keeps the same bubble with less activation memory; the interleaved schedule divides it by the chunks per
    GPU (Narayanan et al., SC 2021). Serving engines keep `p` batches in flight, one per stage, so decode has no
    bubble when `p` batches are ready.) A toy schedule, each micro-batch starting on a stage when both the stage and
    the micro-batch are free:
    """),
    code("""
    def pipeline_bubble(stage_times, m):
        \"\"\"Idle share of a forward pipeline: micro-batch j enters stage s when stage s is free and stage s - 1 has finished it.\"\"\"
        p = len(stage_times)
        done = [[0.0] * m for _ in range(p)]
        for s in range(p):
            for j in range(m):
                start = max(done[s - 1][j] if s else 0.0, done[s][j - 1] if j else 0.0)
                done[s][j] = start + stage_times[s]
        return 1 - m * sum(stage_times) / (p * done[-1][-1])


    P_PP, MICRO = 4, [1, 2, 4, 8, 16, 32]
    simulated = {m: pipeline_bubble([1.0] * P_PP, m) for m in MICRO}
    formula = {m: (P_PP - 1) / (m + P_PP - 1) for m in MICRO}
    uneven = {m: pipeline_bubble([1.0, 1.0, 1.0, 1.5], m) for m in MICRO}
    for m in MICRO:
        print(f"m = {m:2d}: bubble simulated {simulated[m]:.3f}, formula {formula[m]:.3f}, one stage 1.5x slower {uneven[m]:.3f}")
    tp4 = StepCostModel("h100", LLAMA_3_70B, tp=4).allreduce_count_and_bytes(StepWork.of([(1, 1000, 1)] * 64))
    pp4_bytes = (P_PP - 1) * 64 * LLAMA_3_70B.hidden_size * 2  # p - 1 activation hand-offs of 64 tokens
    print(f"Llama-3-70B, 64 decodes: TP 4 does {tp4[0]} all-reduces of {tp4[1] / 1e6:.1f} MB in all; PP {P_PP} hands on {P_PP - 1} activations, {pp4_bytes / 1e6:.2f} MB")
    """),
    conclusion("""
    conclude(f"The toy schedule's bubble equals `(p - 1) / (m + p - 1)` at every m tried (p = {P_PP}): **{simulated[1]:.0%}** with one micro-batch, "
             f"**{simulated[32]:.1%}** with 32. One stage 1.5x slower than the others raises it to {uneven[32]:.1%} at 32: the slowest stage sets the pace. "
             f"PP talks little: for 64 Llama-3-70B decodes over 4 GPUs it hands on {pp4_bytes / 1e6:.2f} MB, where TP 4 all-reduces "
             f"{tp4[1] / 1e6:.0f} MB in {tp4[0]} collectives, which is why PP goes between nodes and TP within one.",
             [("simulation = formula for equal stages", all(abs(simulated[m] - formula[m]) < 1e-12 for m in MICRO)),
              ("the bubble falls with more micro-batches", all(simulated[a] > simulated[b] for a, b in zip(MICRO, MICRO[1:]))),
              ("an uneven stage makes a larger bubble from two micro-batches on", all(uneven[m] > simulated[m] for m in MICRO if m > 1)),
              ("PP moves fewer bytes than TP", pp4_bytes < tp4[1])])
    """),
    *exercise(3, """
    Write `bubble(p, m)`: the idle share of a pipeline of `p` equal stages running `m` micro-batches. Checked against the
    toy schedule for several `p` and `m`, including `m = 1` and `m < p`.
    """, "Count the slots from the first micro-batch entering stage 1 to the last leaving stage p; each stage works m of them.",
        "bubble",
        """
    def bubble(p, m):
        return (p - 1) / (m + p - 1)
    """,
        """
    CASES = [((p, m), pipeline_bubble([1.0] * p, m)) for p in (2, 4, 8) for m in (1, 3, 8, 64)]
    check_function("bubble", bubble, CASES, hint="m + p - 1 slots in all.", rel_tol=1e-9)
    """,
        wrong=[
            "bubble = lambda p, m: (p - 1) / m  # over the working slots: above 1 when m < p - 1",
            "bubble = lambda p, m: (p - 1) / (m + p)  # off by one",
            "bubble = lambda p, m: 1 / m  # right only for p = 2",
        ]),
    md("""
    ## LoRA and serving many adapters
    LoRA (Hu et al., ICLR 2022) fine-tunes a model by adding `B A` to a frozen weight `W` (`d_out × d_in`), with `A`
    `r × d_in` and `B` `d_out × r`: `r (d_in + d_out)` parameters per adapted matrix instead of `d_in d_out`. Serving
    merges nothing: the base weights stay shared and each request carries its adapter. Punica's SGMV kernel (Chen et
    al., MLSys 2024) runs one batch whose requests use different adapters: the base GEMM once for everyone, each
    adapter's small GEMMs for its own rows; S-LoRA (Sheng et al., MLSys 2024) pages adapters in and out of GPU memory
    beside the KV cache. The alternative is one batch per adapter. Adapter bytes for Llama-3-8B, then one decode step of
    `BATCH` requests spread over `ADAPTERS` adapters on the modelled H100, each adapter's weights read once more:
    """),
    code("""
    s = LLAMA_3_8B
    kv = s.num_kv_heads * s.head_dim
    MATRICES = {"q": (s.hidden_size, s.hidden_size), "k": (s.hidden_size, kv), "v": (s.hidden_size, kv), "o": (s.hidden_size, s.hidden_size),
                "gate": (s.hidden_size, s.intermediate_size), "up": (s.hidden_size, s.intermediate_size), "down": (s.intermediate_size, s.hidden_size)}
    RANK, BATCH, ADAPTERS = 16, 64, 8


    def adapter_bytes(rank, names, dtype_bytes=2):
        return s.num_layers * rank * sum(sum(MATRICES[n]) for n in names) * dtype_bytes


    attn_only, all_linear = adapter_bytes(RANK, "qkvo"), adapter_bytes(RANK, MATRICES)
    print(f"rank {RANK}: attention only {attn_only / 2**20:.1f} MiB, every linear layer {all_linear / 2**20:.1f} MiB; base weights {s.weight_bytes / 2**30:.1f} GiB")

    cm = StepCostModel("h100", s)
    bw = get_hardware("h100").memory_bandwidth * get_hardware("h100").mbu
    one_batch = cm.cost([(1, 1000, 1)] * BATCH).time_s + ADAPTERS * all_linear / bw      # SGMV: base once, every adapter once
    per_adapter = ADAPTERS * (cm.cost([(1, 1000, 1)] * (BATCH // ADAPTERS)).time_s + all_linear / bw)  # one step per adapter
    print(f"{BATCH} decodes over {ADAPTERS} adapters: one mixed batch {one_batch * 1e3:.2f} ms, one batch per adapter {per_adapter * 1e3:.2f} ms")
    """),
    conclusion("""
    share = all_linear / s.weight_bytes
    conclude(f"A rank-{RANK} adapter on every linear layer of Llama-3-8B is **{all_linear / 2**20:.0f} MiB**, {share:.2%} of the base weights "
             f"(attention only: {attn_only / 2**20:.0f} MiB): {int(10 * 2**30 // all_linear)} of them fit in 10 GiB beside the KV cache. Serving {BATCH} decodes over {ADAPTERS} "
             f"adapters in one mixed batch takes **{one_batch * 1e3:.2f} ms** on the modelled H100 against **{per_adapter * 1e3:.2f} ms** for one "
             f"batch per adapter ({per_adapter / one_batch:.1f}x): each separate batch reads the base weights again.",
             [("an adapter is under 1 % of the base", share < 0.01),
              ("attention-only adapters are smaller", attn_only < all_linear),
              ("the mixed batch is faster", one_batch < per_adapter)])
    """),
    *exercise(4, """
    Write `lora_bytes(rank, shapes, layers, dtype_bytes)`: the bytes of a LoRA adapter of rank `rank` on the matrices
    `shapes` (a list of `(d_in, d_out)`) in each of `layers` layers. Checked on Llama-3-8B's attention and MLP
    matrices at several ranks.
    """, "A is rank x d_in, B is d_out x rank, in every layer.",
        "lora_bytes",
        """
    def lora_bytes(rank, shapes, layers, dtype_bytes):
        return layers * rank * sum(d_in + d_out for d_in, d_out in shapes) * dtype_bytes
    """,
        """
    CASES = [((r, [MATRICES[n] for n in names], s.num_layers, b), adapter_bytes(r, names, b)) for r in (8, 16, 64) for names in ("qkvo", "qv", list(MATRICES)) for b in (2, 4)]
    check_function("lora_bytes", lora_bytes, CASES, hint="r (d_in + d_out) parameters per matrix.")
    """,
        wrong=[
            "lora_bytes = lambda rank, shapes, layers, dtype_bytes: layers * rank * sum(d_in * d_out for d_in, d_out in shapes) * dtype_bytes  # the full matrix times r",
            "lora_bytes = lambda rank, shapes, layers, dtype_bytes: rank * sum(d_in + d_out for d_in, d_out in shapes) * dtype_bytes  # one layer only",
            "lora_bytes = lambda rank, shapes, layers, dtype_bytes: layers * rank * sum(d_in + d_out for d_in, d_out in shapes)  # parameters, not bytes",
        ]),
    md("""
    Try other pipelines (the toy schedule only):
    """),
    code("""
    import ipywidgets as widgets


    def pipeline(stages=4, micro_batches=8, slow_stage_factor=1.0):
        times = [1.0] * (stages - 1) + [slow_stage_factor]
        print(f"bubble {pipeline_bubble(times, micro_batches):.3f} | formula for equal stages {(stages - 1) / (micro_batches + stages - 1):.3f}")


    widgets.interact_manual(pipeline, stages=widgets.IntSlider(value=4, min=1, max=16), micro_batches=widgets.IntSlider(value=8, min=1, max=64),
                            slow_stage_factor=widgets.FloatSlider(value=1.0, min=0.5, max=3.0, step=0.1))
    """),
    *question("why does vLLM v1 recompute the partial block instead of copying it?",
              "Copy-on-write shares even the partly filled last block and copies it on the first write. The engine (like vLLM v1) shares only full blocks. What does each cost, and why is the recompute simpler?",
              "Copy-on-write needs a block copy kernel and a per-block 'who writes next' check inside the step; sharing only full blocks reuses the prefix cache as it is (hash of full blocks, ref counts) and costs at most `block_size - 1` recomputed tokens per extra sample, folded into the same prefill step (checked: the shared blocks are the prompt's full blocks; the prompt is computed once plus the partial block per other child)."),
    *question("what if the pipeline has fewer micro-batches than stages?",
              "With p = 8 stages and m = 4 micro-batches, what share of the GPUs' time is idle, and what do serving engines do about it?",
              "The bubble is `(8 - 1) / (4 + 8 - 1) = 7/11`, most of the time (checked: Pipeline parallelism). A serving engine keeps as many batches in flight as there are stages (vLLM's virtual engines), so in steady state every stage has work; the bubble returns when there are too few requests to form p batches."),
    *summary([
        "`n > 1` on the engine shares the prompt's full blocks with a ref count of n and recomputes the partial block per child; copy-on-write beam search copies one block per fork at most (checked: n > 1, beam search and copy-on-write).",
        "Ring all-reduce costs `2 (p - 1) α + 2 (p - 1)/p · n/bw`, a tree `2 ⌈log₂ p⌉ (α + n/bw)`; the tree wins small messages at many ranks (checked: the tree wins below and the ring above, at 64 ranks).",
        "Ring attention is exact and hides its K/V transfer once each rank's shard is long enough (checked: Collectives).",
        "The pipeline bubble is `(p - 1)/(m + p - 1)` for equal stages, larger with a slow stage; PP moves fewer bytes than TP (checked: an uneven stage makes a larger bubble from two micro-batches on; PP moves fewer bytes than TP).",
        "A LoRA adapter is a small share of the base model, and one mixed batch over many adapters beats a batch per adapter (checked: an adapter is under 1 % of the base; the mixed batch is faster).",
    ]),
    *glossary([
        ("parallel sampling (n > 1)", "并行采样", "several samples of one prompt; the engine runs them as child requests sharing the prompt's blocks"),
        ("copy-on-write", "写时复制", "a shared block is copied only when one of its holders writes to it"),
        ("all-reduce (ring / tree)", "全归约（环 / 树）", "every rank ends with the sum of all ranks' data"),
        ("context parallelism", "上下文并行", "a long sequence's attention split over GPUs, K/V blocks passed around a ring"),
        ("pipeline bubble", "流水线气泡", "the share of time a pipeline stage waits idle"),
        ("micro-batch", "微批次", "a slice of the batch that moves through the pipeline stages on its own"),
        ("LoRA adapter", "LoRA 适配器", "a low-rank update B A added to a frozen weight"),
    ]),
]
