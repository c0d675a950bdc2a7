# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 1: prefill vs decode, step time vs tokens per step, the roofline, the KV cache from scratch."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(1, "Prefill and decode", [
        "Explain why prefill is compute-bound and decode is memory-bandwidth-bound (arithmetic intensity).",
        "Measure the engine's step time against tokens per step on this CPU, and read a roofline with published H100/H200 figures.",
        "Build a KV cache from scratch and show that it gives the same attention output with far less work.",
        "Compute the KV cache size per token of a model from its config.",
    ], ["Williams et al., *Roofline*, CACM 2009", "NVIDIA H100 and H200 Tensor Core GPU datasheets",
        "Pope et al., *Efficiently Scaling Transformer Inference*, MLSys 2023",
        "Kwon et al., PagedAttention, SOSP 2023, section 2",
        "Agrawal et al., *Sarathi-Serve*, OSDI 2024, section 2"]),
    code(SETUP + "import torch\nfrom minengine.worker.model_runner import kv_bytes_per_block\n"),
    md("""
    ## Two phases of one request
    A request first **prefills**: the model reads all prompt tokens at once, writes their keys and values (K/V)
    into the cache and produces the first output token. Then it **decodes**: one token per step, each step reading
    the whole cache. Prefill does a lot of arithmetic per weight it loads (every weight is used for all prompt
    tokens); decode does very little (every weight is loaded to be used for one token per request). That ratio
    is the *arithmetic intensity* (FLOPs per byte moved), and it decides which resource limits a step.
    """),
    md("""
    ## The KV cache from scratch (toy)
    Single-head attention over a growing sequence. Without a cache, every new token re-projects K and V for the
    whole sequence; with a cache, each token's K/V is projected once and appended.
    """),
    code("""
    torch.manual_seed(0)
    d = 16
    Wq, Wk, Wv = (torch.randn(d, d) / d**0.5 for _ in range(3))


    def attend_last(x):                       # no cache: project K/V for all tokens, attend from the last
        q, k, v = x[-1] @ Wq, x @ Wk, x @ Wv
        return torch.softmax(q @ k.T / d**0.5, -1) @ v, len(x)          # output, K/V projections done


    def attend_cached(x_new, cache):          # cache: lists of K and V rows, one per past token
        cache["k"].append(x_new @ Wk); cache["v"].append(x_new @ Wv)
        k, v = torch.stack(cache["k"]), torch.stack(cache["v"])
        return torch.softmax((x_new @ Wq) @ k.T / d**0.5, -1) @ v, 1    # one projection per new token
    """),
    code("""
    def toy_decode(prompt_len, new_tokens, use_cache):
        \"\"\"Feed prompt_len + new_tokens random embeddings one by one; return outputs and K/V projections done.\"\"\"
        x = torch.randn(prompt_len + new_tokens, d, generator=torch.Generator().manual_seed(1))
        outs, work, cache = [], 0, {"k": [], "v": []}
        if use_cache:
            for t in range(prompt_len):                 # prefill: all prompt K/V, kept in the cache
                o, w = attend_cached(x[t], cache); work += w
            outs.append(o)
            for t in range(prompt_len, prompt_len + new_tokens - 1):
                o, w = attend_cached(x[t], cache); work += w; outs.append(o)
        else:
            for t in range(prompt_len, prompt_len + new_tokens):
                o, w = attend_last(x[:t]); work += w; outs.append(o)
        return torch.stack(outs), work


    no_cache, work_no_cache = toy_decode(20, 10, use_cache=False)
    cached, work_cached = toy_decode(20, 10, use_cache=True)
    print("same outputs:", torch.allclose(no_cache, cached, atol=1e-5))
    show(f"For a 20-token prompt and 10 new tokens the cache-free loop projected K/V **{work_no_cache}** times; "
         f"the cached loop **{work_cached}** times, {work_no_cache / work_cached:.1f}x less, with the same outputs.")
    """),
    md("""
    The price is memory: every layer keeps K and V for every token of every running request. Per token that is
    `2 (K and V) x layers x kv_heads x head_dim x bytes per element`. Grouped-query attention (fewer KV heads than
    query heads) shrinks it.
    """),
    code("""
    engine = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=2048, num_kv_blocks=256)
    cfg = engine.hf_config
    kv_per_token = kv_bytes_per_block(engine.model, 1, torch.float32)
    # Llama-3-8B from its published config.json: 32 layers, 8 KV heads, head_dim 128, bf16 (2 bytes).
    llama3_8b_per_token = 2 * 32 * 8 * 128 * 2
    show(f"This model: {cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} KV heads of dim "
         f"{engine.model.head_dim}, float32: **{kv_per_token:,} bytes per token**. Llama-3-8B in bf16: "
         f"**{llama3_8b_per_token / 1024:.0f} KiB per token**, so an 8,192-token context holds "
         f"{llama3_8b_per_token * 8192 / 2**30:.1f} GiB of KV for one request.")
    """),
    md("""
    ## Measure: step time against tokens per step
    The real engine, one request at a time with `max_tokens=1`: the single step is a prefill of `n` tokens.
    Then decode steps with `b` running requests (one token each). Each point is the fastest of a few runs.
    """),
    code("""
    def prefill_step_s(n, repeats=3):
        \"\"\"Fastest duration (s) of a step that prefills one n-token prompt.\"\"\"
        best = float("inf")
        for r in range(repeats):
            engine.add_request(f"p{n}-{r}-{len(engine.traces)}", {"prompt_token_ids": [(7 * i + r) % 2000 + 3 for i in range(n)]},
                               SamplingParams(temperature=0.0, max_tokens=1))
            run_to_completion(engine)
            best = min(best, engine.traces[-1].duration)
        return best


    def decode_step_s(batch, steps=6):
        \"\"\"Median duration (s) of the decode-only steps of `batch` requests decoding together.\"\"\"
        start = len(engine.traces)
        for i in range(batch):
            engine.add_request(f"d{batch}-{i}-{start}", {"prompt_token_ids": [11 + i] * 8},
                               SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
        run_to_completion(engine)
        times = sorted(t.duration for t in engine.traces[start:] if t.num_prefill_tokens == 0 and len(t.chunks) == batch)
        return times[len(times) // 2]


    prefill_sizes = pick([1, 4, 16, 64, 128, 256, 512, 1024], [1, 8, 64, 256])
    decode_batches = pick([1, 2, 4, 8, 16, 32], [1, 4, 16])
    prefill_ms = [prefill_step_s(n) * 1000 for n in prefill_sizes]
    decode_ms = [decode_step_s(b) * 1000 for b in decode_batches]
    fig = go.Figure([go.Scatter(x=prefill_sizes, y=prefill_ms, mode="lines+markers", name="prefill of one prompt"),
                     go.Scatter(x=decode_batches, y=decode_ms, mode="lines+markers", name="decode, one token per request")])
    fig.update_layout(title="Step time vs tokens per step (this CPU, bundled model)",
                      xaxis=dict(title="tokens in the step", type="log"), yaxis=dict(title="step time (ms)", type="log"))
    fig.show()
    """),
    code("""
    per_token_1 = prefill_ms[0]
    per_token_big = prefill_ms[-1] / prefill_sizes[-1]
    show(f"One token alone costs **{per_token_1:.2f} ms**; in a {prefill_sizes[-1]}-token prefill each token costs "
         f"**{per_token_big:.3f} ms**, {per_token_1 / per_token_big:.0f}x less. Decoding {decode_batches[-1]} requests "
         f"together takes {decode_ms[-1]:.2f} ms per step vs {decode_ms[0]:.2f} ms for one: {decode_batches[-1]}x the tokens "
         f"for {decode_ms[-1] / decode_ms[0]:.1f}x the time. A step has a large fixed cost (reading every weight, launching "
         f"every layer) that the tokens in it share; that is why a serving engine batches decodes.")
    """),
    md("""
    ### The two phases in one request's life
    One long prompt, then its decode steps, next to 8 short requests: the batch composition shows one big
    prefill step, then steps of one token per request; the token timeline shows the first token late (TTFT) and then a
    steady pace (TPOT).
    """),
    code("""
    phases = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=1024, num_kv_blocks=256)
    phases.add_request("long-prompt", {"prompt_token_ids": [(3 * i) % 2000 + 3 for i in range(pick(512, 256))]},
                       SamplingParams(temperature=0.0, max_tokens=pick(32, 12), ignore_eos=True))
    for i in range(8):
        phases.add_request(f"short-{i}", {"prompt_token_ids": [20 + i] * 8}, SamplingParams(temperature=0.0, max_tokens=pick(32, 12), ignore_eos=True))
    run_to_completion(phases)
    viz.batch_composition_figure(phases.traces).show()
    viz.token_timeline_figure(phases.request_metrics).show()
    """),
    md("""
    ## The roofline
    A kernel's attainable FLOP/s is `min(peak FLOP/s, intensity x memory bandwidth)` (Williams et al. 2009).
    For a decoder with `N` parameters in bf16, a step over `T` tokens does about `2 N T` FLOPs and must read the
    `2 N` bytes of weights at least once, so **intensity ≈ T FLOP/byte**: tokens per step (ignoring attention and
    the KV reads, which only make decode worse). Published figures (dense BF16 tensor-core peak, HBM bandwidth):
    H100 SXM 989 TFLOP/s and 3.35 TB/s; H200 SXM 989 TFLOP/s and 4.8 TB/s (NVIDIA datasheets). We measure this
    CPU the same way: a float32 matmul for the peak, a large copy for the bandwidth.
    """),
    code("""
    GPUS = {"H100 SXM (datasheet)": (989e12, 3.35e12), "H200 SXM (datasheet)": (989e12, 4.8e12)}


    def measure_cpu(n=pick(1024, 512), mb=pick(256, 64)):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        t = time.perf_counter(); torch.mm(a, b); flops = 2 * n**3 / (time.perf_counter() - t)
        x = torch.empty(mb * 2**20 // 4); y = torch.empty_like(x); y.copy_(x)
        t = time.perf_counter(); y.copy_(x); bw = 2 * x.numel() * 4 / (time.perf_counter() - t)   # read + write
        return flops, bw


    cpu_flops, cpu_bw = measure_cpu()
    machines = {**GPUS, f"this CPU (measured, {torch.get_num_threads()} thread(s), fp32)": (cpu_flops, cpu_bw)}
    ridge = {name: peak / bw for name, (peak, bw) in machines.items()}
    intensity = [2**i for i in range(-2, 13)]
    fig = go.Figure([go.Scatter(x=intensity, y=[min(peak, i * bw) / 1e12 for i in intensity], name=name, mode="lines")
                     for name, (peak, bw) in machines.items()])
    fig.update_layout(title="Roofline: attainable TFLOP/s vs arithmetic intensity",
                      xaxis=dict(title="arithmetic intensity (FLOP/byte) ≈ tokens per step for bf16 weights", type="log"),
                      yaxis=dict(title="attainable TFLOP/s", type="log"))
    fig.show()
    for name, r in ridge.items():
        print(f"{name:48s} ridge point {r:7.1f} FLOP/byte")
    """),
    code("""
    h100, h200 = ridge["H100 SXM (datasheet)"], ridge["H200 SXM (datasheet)"]
    weights_8b = 8.0e9 * 2
    show(f"On an H100 a bf16 step needs about **{h100:.0f} tokens** to leave the memory-bound region, on an H200 "
         f"**{h200:.0f}** (more bandwidth, same peak, so it turns compute-bound sooner). A decode step of an 8B model "
         f"cannot be faster than reading its {weights_8b / 1e9:.0f} GB of weights: "
         f"{weights_8b / 3.35e12 * 1000:.1f} ms on H100, {weights_8b / 4.8e12 * 1000:.1f} ms on H200, whether the "
         f"batch has 1 request or 64. A prefill of a 2,048-token prompt sits far right of the ridge: compute-bound.")
    """),
    md("""
    ## Try it: one step of your size
    Pick the number of prompt tokens and press *Run*: the engine prefills a prompt of that size in one step and
    reports its time next to the curve measured above.
    """),
    code("""
    import ipywidgets as widgets


    def one_step(tokens=128):
        ms = prefill_step_s(tokens, repeats=2) * 1000
        print(f"{tokens} tokens in one step: {ms:.2f} ms, {tokens / ms * 1000:,.0f} tokens/s")


    widgets.interact_manual(one_step, tokens=widgets.IntSlider(value=128, min=1, max=pick(2048, 512), step=1))
    """),
    *exercise(1, """
        How many bytes of KV cache does **one token** take in the bundled model (float32)? Compute it from the model's
        config (`cfg.num_hidden_layers`, `cfg.num_key_value_heads`, `engine.model.head_dim`).
        """, "2 (K and V) x layers x KV heads x head_dim x 4 bytes.", "answer_1",
        "answer_1 = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * engine.model.head_dim * 4",
        """
        check("Exercise 1: KV bytes per token", answer_1, kv_bytes_per_block(engine.model, engine.config.block_size, torch.float32) // engine.config.block_size)
        """),
    *exercise(2, """
        From the H200 datasheet figures above, what is the ridge point in FLOP/byte, i.e. roughly how many tokens per
        step a bf16 model needs before the step becomes compute-bound?
        """, "peak FLOP/s divided by bytes/s.", "answer_2",
        "answer_2 = 989e12 / 4.8e12",
        """
        check_close("Exercise 2: H200 ridge point", answer_2, ridge["H200 SXM (datasheet)"], rel_tol=0.05)
        """),
    *exercise(3, """
        In the toy, a 30-token prompt generates 5 tokens. How many K/V projections does the cache-free loop do, and
        how many the cached loop? Answer as a tuple `(without_cache, with_cache)`.
        """, """
        Without a cache, the step that produces output token k (k = 1..5) re-projects all `30 + k - 1` tokens. With
        a cache, each of the `30 + 5 - 1` tokens that enters the model is projected once.
        """, "answer_3",
        "answer_3 = (sum(30 + k - 1 for k in range(1, 6)), 30 + 5 - 1)",
        """
        check("Exercise 3: projections with and without a cache", answer_3,
              (toy_decode(30, 5, use_cache=False)[1], toy_decode(30, 5, use_cache=True)[1]))
        """),
    *summary([
        "Prefill: many tokens per weight loaded, compute-bound. Decode: one token per request per weight loaded, memory-bandwidth-bound.",
        "Tokens per step is the arithmetic intensity of a bf16 step; below the ridge point (hundreds of tokens on H100/H200) extra decode requests ride almost free.",
        "The KV cache trades memory for compute: each token's K/V is computed once; its size per token is 2 x layers x KV heads x head_dim x bytes.",
        "This is why serving engines batch many decodes together and why memory for the KV cache limits the batch (next chapter).",
    ]),
    *glossary([
        ("prefill", "预填充", "the pass over the prompt that fills the KV cache and yields the first token"),
        ("decode", "解码", "one new token per request per step, reading the whole KV cache"),
        ("arithmetic intensity", "算术强度", "FLOPs per byte moved from memory"),
        ("roofline", "屋顶线模型", "attainable FLOP/s = min(peak, intensity x bandwidth)"),
        ("compute-bound / memory-bound", "计算受限 / 访存受限", "limited by arithmetic / by memory bandwidth"),
        ("KV cache", "KV 缓存", "keys and values of past tokens kept for later steps"),
        ("grouped-query attention (GQA)", "分组查询注意力", "several query heads share one KV head, shrinking the cache"),
    ]),
]
