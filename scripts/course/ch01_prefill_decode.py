# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 1: prefill vs decode, step time vs tokens per step (this CPU, measured with care, beside the modelled
H100), the roofline drawn with the cost model, the KV cache from scratch."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(1, "Prefill and decode", [
        "Explain why prefill is compute-bound and decode is memory-bandwidth-bound (arithmetic intensity).",
        "Measure the engine's step time against tokens per step on this CPU the careful way (one thread, warm-up, medians, the step really computed what it claims), and put it beside the same steps on a modelled H100.",
        "Read a roofline drawn from the step cost model, with real prefill and decode steps placed on it.",
        "Build a KV cache from scratch and show that it gives the same attention output with far less work; compute the KV cache size per token of a model from its config.",
    ], ["Williams et al., *Roofline*, CACM 2009", "NVIDIA H100 and H200 Tensor Core GPU datasheets",
        "Pope et al., *Efficiently Scaling Transformer Inference*, MLSys 2023",
        "Kwon et al., PagedAttention, SOSP 2023, section 2",
        "Agrawal et al., *Sarathi-Serve*, OSDI 2024, section 2"]),
    code(SETUP + """\
import random

import torch

from minengine.course import cpu_engine, median_of, teaching_cost_model
from minengine.timing import HARDWARE, LLAMA_3_8B, StepCostModel, StepWork
from minengine.viz.cost_figures import roofline_figure
from minengine.worker.model_runner import kv_bytes_per_block
"""),
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
    conclusion("""
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
    same = torch.allclose(no_cache, cached, atol=1e-5)
    conclude(f"For a 20-token prompt and 10 new tokens the cache-free loop projected K/V **{work_no_cache}** times; "
             f"the cached loop **{work_cached}** times, {work_no_cache / work_cached:.1f}x less, with the same outputs.",
             [("both loops give the same outputs", bool(same)), ("the cache does less work", work_cached < work_no_cache)])
    """),
    md("""
    The price is memory: every layer keeps K and V for every token of every running request. Per token that is
    `2 (K and V) x layers x kv_heads x head_dim x bytes per element`. Grouped-query attention (fewer KV heads than
    query heads) shrinks it.
    """),
    conclusion("""
    engine = modelled_engine(max_num_batched_tokens=2048, num_kv_blocks=256)
    cfg = engine.hf_config
    kv_per_token = kv_bytes_per_block(engine.model, 1, torch.float32)
    llama = LLAMA_3_8B   # from its published config.json (minengine.timing preset): 32 layers, 8 KV heads, head_dim 128, bf16
    llama3_8b_per_token = 2 * llama.num_layers * llama.num_kv_heads * llama.head_dim * llama.dtype_bytes
    conclude(f"This model: {cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} KV heads of dim "
             f"{engine.model.head_dim}, float32: **{kv_per_token:,} bytes per token**. Llama-3-8B in bf16: "
             f"**{llama3_8b_per_token / 1024:.0f} KiB per token**, so an 8,192-token context holds "
             f"{llama3_8b_per_token * 8192 / 2**30:.1f} GiB of KV for one request.",
             [("the formula matches the cost model's preset", llama3_8b_per_token == llama.kv_bytes_per_token)])
    """),
    md("""
    ## Measure this CPU: step time against tokens per step
    This is the one place where the course times this machine on purpose, so it does it the careful way:
    - **one torch thread** (`num_cpu_threads=1`, the engine's default): on a shared CPU, torch's default of one thread
      per core makes every small op wait for cores another process holds;
    - the step's **CPU time** (`make_clock("cpu")`: the process's CPU time, which other processes do not inflate);
    - a **warm-up** run before timing (first calls pay for allocations and caches), then the **median** of several;
    - **fresh prompts and prefix caching off**, and a check that each timed step computed exactly the tokens it claims
      (a prompt that is a prefix of an earlier one would hit the prefix cache and compute only part of itself).

    Each timed step is then costed two more ways: by the `cpu` hardware preset (a roofline *fitted* on this project's
    machine with `minengine.timing.calibrate`, bundled model shape) and by the teaching clock (H100, Llama-3-8B shapes).
    """),
    code("""
    cpu = cpu_engine(enable_prefix_caching=False, max_num_batched_tokens=2048, num_kv_blocks=256)
    cpu_fit = StepCostModel("cpu", "bundled")     # the fitted CPU roofline, this model's shape
    h100 = teaching_cost_model()                  # H100 SXM, Llama-3-8B shapes
    rng = random.Random(0)


    def fresh_ids(n):
        return [rng.randrange(3, cfg.vocab_size) for _ in range(n)]


    def prefill_step_s(n):
        \"\"\"CPU seconds of one step that prefills a fresh n-token prompt; checks the step computed n new tokens.\"\"\"
        cpu.add_request(f"p{n}-{cpu.num_steps}", {"prompt_token_ids": fresh_ids(n)}, SamplingParams(temperature=0.0, max_tokens=1))
        run_to_completion(cpu)
        step = cpu.traces[-1]
        claim(f"the timed step prefilled {n} new tokens, none from the prefix cache",
              step.num_scheduled_tokens == n and step.num_prefill_tokens == n and step.prefix_hit_tokens == 0)
        return step.duration


    def decode_step_s(batch, steps=6):
        \"\"\"Median CPU seconds of the decode-only steps of `batch` requests decoding together.\"\"\"
        start = len(cpu.traces)
        for i in range(batch):
            cpu.add_request(f"d{batch}-{i}-{start}", {"prompt_token_ids": fresh_ids(8)},
                            SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
        run_to_completion(cpu)
        times = sorted(t.duration for t in cpu.traces[start:] if t.num_prefill_tokens == 0 and len(t.chunks) == batch)
        claim(f"{batch} requests decoded together", len(times) >= steps - 2)
        return times[len(times) // 2]


    prefill_sizes = pick([1, 4, 16, 64, 128, 256, 512, 1024], [1, 16, 64, 256])
    decode_batches = pick([1, 2, 4, 8, 16, 32], [1, 4, 32])
    repeats = pick(5, 3)
    rows = []
    for n in prefill_sizes:
        work = StepWork.of([(n, 0, 1)])
        rows.append(("prefill", n, median_of(lambda: prefill_step_s(n), repeats) * 1e3, cpu_fit.cost(work).time_s * 1e3, h100.cost(work).time_s * 1e3))
    for b in decode_batches:
        work = StepWork.of([(1, 8, 1)] * b)
        rows.append(("decode", b, median_of(lambda: decode_step_s(b), repeats) * 1e3, cpu_fit.cost(work).time_s * 1e3, h100.cost(work).time_s * 1e3))
    print(f"{'step':8s} {'tokens':>6s} | {'CPU measured':>12s} | {'CPU fitted model':>16s} | {'H100, Llama-3-8B':>16s}   (ms, medians of {repeats})")
    for kind, n, measured, fitted, modelled in rows:
        print(f"{kind:8s} {n:6d} | {measured:12.2f} | {fitted:16.2f} | {modelled:16.2f}")
    """),
    code("""
    fig = go.Figure()
    for kind, dash in (("prefill", "solid"), ("decode", "dot")):
        pts = [r for r in rows if r[0] == kind]
        label = "prefill of one prompt" if kind == "prefill" else "decode, one token per request"
        fig.add_trace(go.Scatter(x=[r[1] for r in pts], y=[r[2] for r in pts], mode="lines+markers", line={"dash": dash},
                                 name=f"{label}: this CPU, measured (bundled model)"))
        fig.add_trace(go.Scatter(x=[r[1] for r in pts], y=[r[4] for r in pts], mode="lines+markers", line={"dash": dash},
                                 name=f"{label}: modelled H100, Llama-3-8B shapes"))
    fig.update_layout(title="Step time vs tokens per step: this CPU (measured CPU time, 1 thread, medians) and a modelled H100",
                      xaxis=dict(title="tokens in the step", type="log"), yaxis=dict(title="step time (ms)", type="log"))
    fig.show()
    """),
    conclusion("""
    pre = {n: (m, f, h) for kind, n, m, f, h in rows if kind == "prefill"}
    dec = {b: (m, f, h) for kind, b, m, f, h in rows if kind == "decode"}
    n_max, b_max = prefill_sizes[-1], decode_batches[-1]
    cpu_gain = pre[1][0] / (pre[n_max][0] / n_max)       # per-token cost, 1 token vs the largest prefill
    gpu_gain = pre[1][2] / (pre[n_max][2] / n_max)
    cpu_dec, gpu_dec = dec[b_max][0] / dec[1][0], dec[b_max][2] / dec[1][2]
    num_params_m = sum(p.numel() for p in engine.model.parameters()) / 1e6
    weights_gb = LLAMA_3_8B.num_params * LLAMA_3_8B.dtype_bytes / 1e9
    conclude(f"On this CPU one token alone costs **{pre[1][0]:.2f} ms**; in a {n_max}-token prefill each token costs "
             f"**{pre[n_max][0] / n_max:.3f} ms**, {cpu_gain:.0f}x less. On the modelled H100 the same comparison gives "
             f"{pre[1][2]:.2f} ms against {pre[n_max][2] / n_max:.3f} ms, {gpu_gain:.0f}x less. Decoding {b_max} requests together "
             f"takes {cpu_dec:.1f}x the time of one on this CPU and {gpu_dec:.2f}x on the H100, for {b_max}x the tokens. "
             f"The shape is the same (a fixed cost per step that the tokens in it share); the numbers differ because the "
             f"fixed costs differ: here it is the engine's per-step work on a {num_params_m:.1f} M-parameter model "
             f"(about {pre[1][0]:.1f} ms), on the H100 it is reading {weights_gb:.0f} GB of Llama-3-8B weights once per step "
             f"(about {pre[1][2]:.1f} ms), and the H100 has ~{HARDWARE['h100'].peak_flops / HARDWARE['cpu'].peak_flops:,.0f}x this "
             f"CPU's fitted FLOP/s, so its steps grow only slowly until the ridge point (64 tokens: {pre[64][2] / pre[1][2]:.2f}x one token, "
             f"256: {pre[256][2] / pre[1][2]:.2f}x) where this CPU's bend after a few dozen (64 tokens: {pre[64][0] / pre[1][0]:.1f}x one token).",
             [("batching prefill tokens lowers the cost per token on the CPU", cpu_gain > 3),
              ("and far more on the H100", gpu_gain > cpu_gain),
              ("decoding many requests together costs far less than one step each, on both", cpu_dec < b_max / 2 and gpu_dec < 1.5),
              ("the H100 step is nearly flat at 64 tokens, this CPU's is not", pre[64][2] / pre[1][2] < 1.25 < 1.5 < pre[64][0] / pre[1][0])])
    """),
    md("""
    ### The two phases in one request's life
    One long prompt, then its decode steps, next to 8 short requests (modelled clock): the batch composition shows one
    big prefill step, then steps of one token per request; the token timeline shows the first token late (TTFT) and
    then a steady pace (TPOT).
    """),
    code("""
    phases = modelled_engine(max_num_batched_tokens=1024, num_kv_blocks=256)
    phases.add_request("long-prompt", {"prompt_token_ids": [(3 * i) % 2000 + 3 for i in range(pick(1000, 512))]},
                       SamplingParams(temperature=0.0, max_tokens=pick(32, 12), ignore_eos=True))
    for i in range(8):
        phases.add_request(f"short-{i}", {"prompt_token_ids": [20 + i] * 8}, SamplingParams(temperature=0.0, max_tokens=pick(32, 12), ignore_eos=True))
    run_to_completion(phases)
    viz.batch_composition_figure(phases.traces).show()
    titled(viz.token_timeline_figure(phases.request_metrics), "One long prompt and 8 short ones").show()
    """),
    md("""
    ## The roofline, drawn with the cost model
    A kernel's attainable FLOP/s is `min(peak FLOP/s, intensity x memory bandwidth)` (Williams et al. 2009). For a
    decoder with `N` parameters in bf16, a step over `T` tokens does about `2 N T` FLOPs and must read the `2 N`
    bytes of weights at least once, so **intensity ≈ T FLOP/byte**: tokens per step (attention and the K/V reads only
    make decode worse). The teaching clock's cost model (`minengine.timing.StepCostModel`) computes each step's FLOPs
    and bytes exactly that way and divides by the H100's datasheet peaks times the efficiencies a serving engine
    reaches (MFU, MBU; sources in `minengine/timing/hardware.py`). Below, real steps placed on its roofline.
    """),
    code("""
    steps = {f"decode x{b}": h100.cost(StepWork.of([(1, 1000, 1)] * b)) for b in (1, 16, 64)}
    steps.update({f"prefill {n}": h100.cost(StepWork.of([(n, 0, 1)])) for n in (64, 512, 2048)})
    roof = roofline_figure(h100, steps, title=f"Roofline with real steps ({h100.label}; decodes have 1,000 tokens of context)")
    roof.for_each_trace(lambda tr: tr.update(textposition="middle left") if tr.name.startswith("decode") else None)  # clear of the prefills
    roof.show()
    for name, c in steps.items():
        print(f"{name:12s} {c.time_s * 1e3:7.2f} ms  intensity {c.arithmetic_intensity:7.1f} FLOP/byte  {c.bound}-bound")
    """),
    conclusion("""
    ridge = {name: HARDWARE[name].peak_flops / HARDWARE[name].memory_bandwidth for name in ("h100", "h200")}
    weights = LLAMA_3_8B.num_params * LLAMA_3_8B.dtype_bytes
    floor_ms = {name: weights / HARDWARE[name].memory_bandwidth * 1e3 for name in ("h100", "h200")}
    conclude(f"Datasheet ridge points: H100 **{ridge['h100']:.0f}** FLOP/byte, H200 **{ridge['h200']:.0f}** (same peak, more bandwidth, "
             f"so it turns compute-bound sooner). Every decode batch above is **memory-bound** (one weight read serves 1 to 64 "
             f"tokens); the 2,048-token prefill is **compute-bound**. A decode step of an 8B model cannot beat reading its "
             f"{weights / 1e9:.0f} GB of weights: {floor_ms['h100']:.1f} ms on H100, {floor_ms['h200']:.1f} ms on H200 at the datasheet "
             f"bandwidth, whatever the batch; the modelled step is {steps['decode x1'].time_s * 1e3:.1f} ms at the bandwidth an engine reaches.",
             [("decode batches are memory-bound", all(steps[f"decode x{b}"].bound == "memory" for b in (1, 16, 64))),
              ("a 2,048-token prefill is compute-bound", steps["prefill 2048"].bound == "compute"),
              ("the H200's ridge is lower", ridge["h200"] < ridge["h100"]),
              ("no decode step beats the weight read", all(steps[f"decode x{b}"].time_s * 1e3 > floor_ms["h100"] for b in (1, 16, 64)))])
    """),
    md("""
    ## How true is the modelled clock?
    Every teaching figure of this course runs on the modelled H100. Before trusting it, compare it with GPUs that were
    really measured: `benchmarks/cost_model_validation.py` models published end-to-end runs (TensorRT-LLM's
    performance tables, vLLM's nightly benchmark and a vLLM pull request, NVIDIA NIM, llama.cpp; A100, H100, H200,
    RTX 4090; TP 1 to 4) the way each benchmark ran them, with the same cost model. None of these numbers set a
    parameter of the model (its kernel efficiencies come from Vidur's operator profiles). The error is on time:
    `modelled / measured - 1`. The cell below recomputes every row.
    """),
    code("""
    import sys
    from pathlib import Path

    import minengine

    sys.path.insert(0, str(Path(minengine.__file__).resolve().parents[1]))   # the repository's benchmarks/ folder
    from benchmarks import cost_model_validation as validation

    rows = validation.points()
    errors = {id(p): p.modelled_s / p.measured_s - 1 for p in rows}
    table = ["| measurement | setup | published | modelled | error |", "|---|---|---:|---:|---:|"]
    for p in sorted(rows, key=lambda p: -abs(errors[id(p)])):
        mark = " **(outside ±30 %)**" if abs(errors[id(p)]) > validation.WITHIN else ""
        table.append(f"| {p.what} | {p.setup} | {p.published} | {p.modelled_s * 1e3:,.1f} ms | {errors[id(p)]:+.0%}{mark} |")
    fig = go.Figure([go.Scatter(x=[p.measured_s for p in rows if p.engine == e], y=[p.modelled_s for p in rows if p.engine == e],
                                mode="markers", name={"vllm": "vLLM", "cuda-graph": "TensorRT-LLM, NIM, llama.cpp"}.get(e, e),
                                text=[f"{p.what}<br>{p.setup}" for p in rows if p.engine == e]) for e in sorted({p.engine for p in rows})])
    lo, hi = min(p.measured_s for p in rows) / 2, max(p.measured_s for p in rows) * 2
    fig.add_trace(go.Scatter(x=[lo, hi, hi, lo], y=[lo * 0.7, hi * 0.7, hi * 1.3, lo * 1.3], fill="toself", mode="none",
                             fillcolor="rgba(44,160,44,0.15)", name="±30 %"))
    fig.update_layout(title=f"The modelled clock against {len(rows)} published GPU runs",
                      xaxis=dict(title="published (s)", type="log"), yaxis=dict(title="modelled (s)", type="log"))
    fig.show()
    show("\\n".join(table))
    """),
    conclusion("""
    abs_err = sorted(abs(e) for e in errors.values())
    within = sum(e <= validation.WITHIN for e in abs_err)
    median_err = abs_err[len(abs_err) // 2] if len(abs_err) % 2 else (abs_err[len(abs_err) // 2 - 1] + abs_err[len(abs_err) // 2]) / 2
    misses = [p for p in rows if abs(errors[id(p)]) > validation.WITHIN]
    conclude(f"**{within} of {len(rows)}** published runs are modelled within ±30 %; the median error is **{median_err:.0%}**, the worst "
             f"**{max(abs_err):.0%}**. All {len(misses)} misses are TensorRT-LLM's Llama-2-70B FP8 runs on several H100s, and there the "
             "model is *too fast* (its time is shorter than the measured one). The benchmark's reading of them, a cited explanation and "
             f"not checked here: *{validation.MISSES}* So the modelled clock gives the right magnitude and the right shape (what is "
             "compute- or memory-bound, what grows with what); it is not a prediction to a few per cent.",
             [("the count within the band", within == sum(abs(errors[id(p)]) <= validation.WITHIN for p in rows)),
              ("most runs are within ±30 %", within > len(rows) / 2),
              ("every miss is a Llama-2-70B FP8 TensorRT-LLM run on H100s", all("70B" in p.setup and "FP8" in p.setup and p.gpu == "h100"
                                                                               and p.source == validation.TRT_PERF and p.tp > 1 for p in misses)),
              ("every miss is modelled too fast", all(errors[id(p)] < 0 for p in misses)),
              ("the same numbers as the benchmark's summary", abs(validation.summary(rows)["median"] - median_err) < 1e-12)])
    """),
    md("""
    ### This CPU on the same axes
    The same measurement as a roofline: a float32 matmul for the peak, a large copy for the bandwidth; one thread,
    a warm-up, the median of five (the H100 and H200 lines are their datasheet figures, from the presets).
    """),
    code("""
    def measure_cpu(n=pick(1024, 512), mb=pick(256, 64)):
        a, b = torch.randn(n, n), torch.randn(n, n)
        x = torch.empty(mb * 2**20 // 4); y = torch.empty_like(x)

        def mm():
            t = time.perf_counter(); torch.mm(a, b); return time.perf_counter() - t

        def copy():
            t = time.perf_counter(); y.copy_(x); return time.perf_counter() - t

        return 2 * n**3 / median_of(mm, 5), 2 * x.numel() * 4 / median_of(copy, 5)   # FLOP/s; bytes/s (read + write)


    cpu_flops, cpu_bw = measure_cpu()
    machines = {name: (HARDWARE[key].peak_flops, HARDWARE[key].memory_bandwidth) for name, key in (("H100 SXM (datasheet)", "h100"), ("H200 (datasheet)", "h200"))}
    machines[f"this CPU (measured, {torch.get_num_threads()} thread, fp32)"] = (cpu_flops, cpu_bw)
    intensity = [2**i for i in range(-2, 13)]
    fig = go.Figure([go.Scatter(x=intensity, y=[min(peak, i * bw) / 1e12 for i in intensity], name=name, mode="lines")
                     for name, (peak, bw) in machines.items()])
    fig.update_layout(title="Roofline: attainable TFLOP/s vs arithmetic intensity",
                      xaxis=dict(title="arithmetic intensity (FLOP/byte) ≈ tokens per step for bf16 weights", type="log"),
                      yaxis=dict(title="attainable TFLOP/s", type="log"))
    fig.show()
    for name, (peak, bw) in machines.items():
        print(f"{name:44s} peak {peak / 1e12:8.3f} TFLOP/s  bandwidth {bw / 1e9:7.1f} GB/s  ridge {peak / bw:6.1f} FLOP/byte")
    """),
    md("""
    ## Try it: one step of your size
    Pick the number of prompt tokens and press *Run*: the engine prefills a fresh prompt of that size in one step
    (median of 3 after a warm-up, checked to compute exactly that many tokens), beside the fitted CPU model and the
    modelled H100.
    """),
    code("""
    import ipywidgets as widgets


    def one_step(tokens=128):
        ms = median_of(lambda: prefill_step_s(tokens), 3) * 1e3
        work = StepWork.of([(tokens, 0, 1)])
        print(f"{tokens} tokens in one step: this CPU {ms:.2f} ms ({tokens / ms * 1000:,.0f} tokens/s) | fitted CPU model "
              f"{cpu_fit.cost(work).time_s * 1e3:.2f} ms | modelled H100, Llama-3-8B {h100.cost(work).time_s * 1e3:.2f} ms "
              f"({h100.cost(work).bound}-bound)")


    widgets.interact_manual(one_step, tokens=widgets.IntSlider(value=128, min=1, max=pick(2048, 512), step=1))
    """),
    *exercise(1, """
        How many bytes of KV cache does **one token** take in the bundled model (float32)? Compute it from the model's
        config (`cfg.num_hidden_layers`, `cfg.num_key_value_heads`, `engine.model.head_dim`).
        """, "2 (K and V) x layers x KV heads x head_dim x 4 bytes.", "answer_1",
        "answer_1 = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * engine.model.head_dim * 4",
        """
        check("Exercise 1: KV bytes per token", answer_1, kv_bytes_per_block(engine.model, engine.config.block_size, torch.float32) // engine.config.block_size)
        """, wrong=["answer_1 = cfg.num_hidden_layers * cfg.num_key_value_heads * engine.model.head_dim * 4  # K only",
                    "answer_1 = 2 * cfg.num_hidden_layers * cfg.num_attention_heads * engine.model.head_dim * 4  # query heads",
                    "answer_1 = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * engine.model.head_dim  # elements, not bytes"]),
    *exercise(2, """
        From the H200's datasheet figures (`HARDWARE["h200"]`: `peak_flops`, `memory_bandwidth`), what is the ridge point
        in FLOP/byte, i.e. roughly how many tokens per step a bf16 model needs before the step becomes compute-bound?
        """, "peak FLOP/s divided by bytes/s.", "answer_2",
        'answer_2 = HARDWARE["h200"].peak_flops / HARDWARE["h200"].memory_bandwidth',
        """
        check_close("Exercise 2: H200 ridge point", answer_2, ridge["h200"], rel_tol=0.05)
        """, wrong=['answer_2 = HARDWARE["h200"].memory_bandwidth / HARDWARE["h200"].peak_flops  # upside down',
                    'answer_2 = HARDWARE["h100"].peak_flops / HARDWARE["h100"].memory_bandwidth  # the H100',
                    'answer_2 = HARDWARE["h200"].peak_flops_8bit / HARDWARE["h200"].memory_bandwidth  # the FP8 peak']),
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
        """, wrong=["answer_3 = (30 * 5, 30 + 5)  # the last token is sampled, never fed back",
                    "answer_3 = (sum(30 + k for k in range(1, 6)), 30 + 5 - 1)",
                    "answer_3 = (30 + 5 - 1, sum(30 + k - 1 for k in range(1, 6)))  # swapped"]),
    *question("why does a batch of 64 decodes cost about what one decode costs on an H100?", """
        In the roofline above, `decode x1` and `decode x64` take nearly the same time. Why? And what if each of the 64
        requests had 32,000 tokens of context instead of 1,000?
        """, """
        A decode step must read all of the model's weights (16 GB for Llama-3-8B in bf16) whatever the batch, and 64
        tokens of arithmetic on them is far below the H100's ridge point: the step is memory-bound, and the weight read
        is shared by every request in the batch. That is why engines batch decodes. With 32,000 tokens of context each,
        the K/V reads grow: 64 x 32,000 tokens x 128 KiB is about 270 GB per step, some 18 times the weights the
        step reads, so the step becomes far slower and the attention's memory traffic, not the weights, dominates. The
        cell below checks it on the modelled H100.
        """),
    code("""
    # The model answer, on the modelled H100: 64 decodes at 1,000 and at 32,000 tokens of context.
    short_ctx, long_ctx = (h100.cost(StepWork.of([(1, ctx, 1)] * 64)) for ctx in (1000, 32000))
    print(f"64 decodes: {short_ctx.time_s * 1e3:.1f} ms at 1,000 tokens of context, {long_ctx.time_s * 1e3:.1f} ms at 32,000; "
          f"K/V read {long_ctx.kv_bytes / 1e9:.0f} GB = {long_ctx.kv_bytes / long_ctx.weight_bytes:.1f}x the weights read")
    claim("64 x 32,000 tokens x 128 KiB of K/V is about 270 GB", abs(long_ctx.kv_bytes / 270e9 - 1) < 0.05)
    claim("some 18 times the weights", round(long_ctx.kv_bytes / long_ctx.weight_bytes) == 18)
    claim("the step becomes far slower (over 5x)", long_ctx.time_s > 5 * short_ctx.time_s)
    """),
    *question("what if you measured with torch's default threads on a busy machine?", """
        The measurement above pins one torch thread and reads the process's CPU time. What goes wrong with torch's
        default (one thread per core) and the wall clock, when another program is running?
        """, """
        Every small op is split over all cores and waits for the slowest slice; when another process holds a core,
        the op waits for the operating system to give it back, and the wall clock counts that wait. This project measured
        a 20x slowdown of the engine with 2 threads next to one busy process, against 1.1x with 1 thread (source: this
        project's manual, docs/time.md, *Measured time that holds still*). Process CPU time does not count time spent waiting for a core, and one thread has no sibling to wait for, so the numbers hold still.
        """),
    *summary([
        "Prefill: many tokens per weight loaded, compute-bound. Decode: one token per request per weight loaded, memory-bandwidth-bound.",
        "Tokens per step is the arithmetic intensity of a bf16 step; below the ridge point (computed above for the H100 and H200, in FLOP/byte) extra decode requests ride almost free.",
        "Measuring a CPU honestly: one thread, CPU time, warm-up, medians, and a check that the timed step computed what it claims; the curve's shape matches the modelled GPU's, its magnitudes do not.",
        "The KV cache trades memory for compute: each token's K/V is computed once; its size per token is 2 x layers x KV heads x head_dim x bytes.",
        "This is why serving engines batch many decodes together and why memory for the KV cache limits the batch (next chapter).",
    ]),
    *glossary([
        ("prefill", "预填充", "the pass over the prompt that fills the KV cache and yields the first token"),
        ("decode", "解码", "one new token per request per step, reading the whole KV cache"),
        ("arithmetic intensity", "算术强度", "FLOPs per byte moved from memory"),
        ("roofline", "屋顶线模型", "attainable FLOP/s = min(peak, intensity x bandwidth)"),
        ("compute-bound / memory-bound", "计算受限 / 访存受限", "limited by arithmetic / by memory bandwidth"),
        ("MFU / MBU", "模型算力利用率 / 模型带宽利用率", "fraction of peak FLOP/s / of memory bandwidth a step reaches"),
        ("KV cache", "KV 缓存", "keys and values of past tokens kept for later steps"),
        ("grouped-query attention (GQA)", "分组查询注意力", "several query heads share one KV head, shrinking the cache"),
    ]),
]
