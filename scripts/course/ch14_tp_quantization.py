# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 14: parallelism and quantization: tensor parallelism on 2 CPU processes with the engine's real TP (greedy
tokens equal to TP 1, the bytes all-reduced per layer counted by the workers against the cost model, KV per GPU with
the KV heads sharded); how many GPUs Llama-3-70B needs and why; fp8 KV and int8 weights: blocks gained in a fixed
budget against perplexity lost, and the modelled decode step of Llama-3-8B on an H100."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(14, "Parallelism and quantization", [
        "Run the engine's real tensor parallelism (2 worker processes, gloo) and see its greedy tokens equal TP 1's.",
        "Count what is all-reduced per layer, in bytes, in the workers, and check it against the cost model's formula.",
        "See why TP multiplies the KV blocks a GPU holds (its KV heads are sharded) and when heads are replicated instead.",
        "Size Llama-3-70B: how many H100s its weights and KV need at a context, in bf16, fp8 and int8.",
        "Measure what fp8 KV and int8 weights buy (the engine's own block counts in a fixed budget) and cost (perplexity on held-out text), and price the decode step on the modelled clock.",
    ], ["Shoeybi et al., *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism*, 2019 (section 3: column- and row-parallel layers, two all-reduces per layer)",
        "Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention*, SOSP 2023 (KV blocks; vLLM's `tensor_parallel_size`, `kv_cache_dtype=\"fp8\"`)",
        "Micikevicius et al., *FP8 Formats for Deep Learning*, 2022 (e4m3); Dettmers et al., *LLM.int8()*, NeurIPS 2022",
        "Meta-Llama-3-70B `config.json` (80 layers, hidden 8192, 8 KV heads of 128)",
        "minengine `distributed.py` (`TensorParallelGroup`, `kv_heads_of_rank`), `executor/`, `timing/` (`StepCostModel`, `ModelShape`, `memory_fit`), `benchmarks/quantization.py`"]),
    code(SETUP + """\
import dataclasses
import math

from minengine.config import BUNDLED_MODEL
from minengine.distributed import kv_heads_of_rank
from minengine.timing import LLAMA_3_8B, LLAMA_3_70B, StepCostModel
from minengine.timing.capacity import memory_fit
from minengine.timing.clocks import shape_for_engine
from minengine.timing.cost_model import StepWork
from minengine.timing.model_shape import get_model_shape
from minengine.workloads import SHAKESPEARE_OPENINGS, find_data_dir

BUDGET = 4 * 2**20  # the KV budget of every engine below: 4 MiB per rank (kv_cache_memory_bytes)
data = find_data_dir()
path = data / "text" / "tinyshakespeare.txt" if data else None
if path is not None and path.exists():
    text = path.read_text()
    held_out = text[int(len(text) * 0.9):]  # the bundled model's validation split: the last 10 %, never trained on
    HELD_OUT = True
    TEXT_SOURCE = "Tiny Shakespeare's held-out last 10 %"
else:
    held_out = "".join(SHAKESPEARE_OPENINGS) * 20
    HELD_OUT = False   # famous openings: the model may well have trained on them
    TEXT_SOURCE = "the bundled Shakespeare openings (no held-out split found: set MINENGINE_DATA)"
print("text:", TEXT_SOURCE)
"""),
    md("""
    ## Tensor parallelism: one layer over two processes
    Megatron-LM's split of a decoder layer over `tp` ranks: q/k/v and gate/up are **column-parallel** (each rank
    computes its own heads and its own slice of the MLP width, no communication), o_proj and down_proj are
    **row-parallel** (each rank multiplies its slice of the input by its rows of the weight, giving a *partial sum* of
    the full `[tokens, hidden]` output). The partial sums are added with one **all-reduce**. So a layer costs two
    all-reduces of `tokens × hidden` activations, whatever `tp` is, and no rank ever holds a whole weight.

    The engine does exactly this on a CPU: `LLM(tensor_parallel_size=2)` starts 2 worker processes (forked, as
    vLLM does), each loads only its shard, and they all-reduce over `torch.distributed` with the gloo backend (NCCL
    between GPUs). One scheduler stays in this process and sends every step to both workers. Start it (several seconds on a busy
    machine) next to a TP 1 engine, same KV budget per rank, and compare greedy tokens:
    """),
    code("""
    tp1 = LLM(BUNDLED_MODEL, kv_cache_memory_bytes=BUDGET, max_model_len=512)
    tokenizer = tp1.llm_engine.tokenizer
    held_ids = tokenizer(held_out[:40_000])["input_ids"]
    N_PROMPTS, N_OUT = pick(8, 4), pick(32, 16)
    prompts = [held_ids[i * 200:i * 200 + 40] for i in range(N_PROMPTS)]
    GREEDY = SamplingParams(temperature=0, max_tokens=N_OUT, ignore_eos=True)


    def greedy(llm):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


    tokens_tp1 = greedy(tp1)
    start = time.perf_counter()
    tp2 = LLM(BUNDLED_MODEL, tensor_parallel_size=2, kv_cache_memory_bytes=BUDGET, max_model_len=512)
    print(f"TP 2 engine started in {time.perf_counter() - start:.1f} s (wall clock: process start and loading, not a result)")
    tokens_tp2 = greedy(tp2)
    engine2 = tp2.llm_engine
    print("worker processes:", engine2.runner.worker_pids, "| model in this process:", engine2.model)
    for p, a, b in zip(prompts[:2], tokens_tp1, tokens_tp2):
        print(repr(tokenizer.decode(p[-12:])), "->", repr(tokenizer.decode(b)), "| same as TP 1:", a == b)
    """),
    conclusion("""
    same = sum(a == b for a, b in zip(tokens_tp1, tokens_tp2))
    conclude(f"With the model split over **2 processes** (no weight of it in this one), greedy decoding gave the same tokens "
             f"as TP 1 on **{same} of {len(prompts)}** prompts ({N_OUT} tokens each). Not guaranteed bit for bit in general: "
             "a float32 all-reduce adds the partial sums in another order than one matmul, so a near-tie between the top two "
             "logits could flip (`tests/engine/test_tensor_parallel.py` allows exactly that, and checks the gap).",
             [("two worker processes, no model in the driver", len(engine2.runner.worker_pids) == 2 and engine2.model is None),
              ("every prompt's greedy tokens equal TP 1's", same == len(prompts))])
    """),
    md("""
    ## What is all-reduced, counted
    Every worker counts its collectives (`TensorParallelGroup`: `num_all_reduces`, `all_reduce_bytes`, reset each step)
    and sends them back with its tokens (`engine.runner.last_replies`, one per rank). The cost model that prices a
    step on the modelled clock has its own formula for the same thing,
    `StepCostModel.allreduce_count_and_bytes(work)`: `2 × layers` messages of `tokens × hidden × bytes`. Step the TP
    engine by hand with a prefill and a decode in flight and put the two side by side (the bundled model: 4 layers,
    hidden 256, float32 activations on the CPU):
    """),
    code("""
    shape = dataclasses.replace(get_model_shape(BUNDLED_MODEL), dtype_bytes=4)  # the engine runs float32 on the CPU
    cost_model = StepCostModel("h100", shape, tp=2)
    engine2.add_request("long", {"prompt_token_ids": held_ids[3000:3090]}, SamplingParams(max_tokens=4))
    engine2.add_request("short", {"prompt_token_ids": held_ids[3500:3507]}, SamplingParams(max_tokens=4))
    rows = []
    while engine2.has_unfinished_requests():
        engine2.step()
        trace = engine2.traces[-1]
        work = StepWork.from_step_trace(trace)
        counted = [(r.num_all_reduces, r.all_reduce_bytes) for r in engine2.runner.last_replies]
        rows.append((trace.step, work.num_tokens, counted, cost_model.allreduce_count_and_bytes(work)))
    print("step | tokens | (all-reduces, bytes) per rank, counted | cost model")
    for step, n, counted, modelled in rows:
        print(f"{step:4d} | {n:6d} | {counted} | {modelled}")
    measured = [(n, counted[0][1]) for _, n, counted, _ in rows]  # (tokens in the step, bytes rank 0 all-reduced)
    """),
    conclusion("""
    per_token_layer = shape.hidden_size * 4  # one message's bytes per token: hidden x float32
    conclude(f"In every one of the {len(rows)} steps, each rank ran **{rows[0][2][0][0]} all-reduces** "
             f"(2 per layer x {shape.num_layers} layers) and moved exactly the bytes the cost model charges: "
             f"`2 x layers x tokens x hidden x 4 bytes`, {2 * shape.num_layers * per_token_layer:,} bytes per token of the step "
             f"({rows[0][1]} tokens: {rows[0][2][0][1]:,} bytes; a {rows[-1][1]}-token decode step: {rows[-1][2][0][1]:,}). "
             "The message is the activations, not the weights: it grows with the tokens of the step, not with tp.",
             [("counted equals modelled on every rank and step", all(c == m for _, _, cs, m in rows for c in cs)),
              ("two all-reduces per layer", all(cs[0][0] == 2 * shape.num_layers for _, _, cs, _ in rows)),
              ("bytes are proportional to the step's tokens", all(b == 2 * shape.num_layers * n * per_token_layer for n, b in measured)),
              ("steps of different sizes were seen", len({n for n, _ in measured}) > 1)])
    """),
    md("""
    The same steps as the scheduler saw them (TP is invisible to it: same block tables, same token budget):
    """),
    code("""
    viz.batch_composition_figure(engine2.traces[-len(rows):]).update_layout(title="The hand-stepped TP 2 steps (tokens per step)").show()
    """),
    md("""
    ## KV per GPU: the heads are sharded
    A rank computes attention only for its own heads, so it stores only its own **KV heads**: with the bundled model's
    2 KV heads at TP 2, one per rank. Every rank holds *all* the blocks (the scheduler's block tables do not change),
    each block a half as wide. In the same per-rank budget, a rank therefore fits twice the blocks. When there are more
    ranks than KV heads, a head is **replicated** (`kv_heads_of_rank`: at TP 4, each of the 2 heads on 2 ranks), and
    the KV per rank stops shrinking.
    """),
    code("""
    e1 = tp1.llm_engine
    print(f"TP 1: {e1.num_kv_blocks} blocks in {BUDGET / 2**20:.0f} MiB | TP 2: {engine2.num_kv_blocks} blocks, "
          f"{engine2.kv_cache_bytes / 2 / 2**20:.0f} MiB on each of 2 ranks")
    heads = {tp: [kv_heads_of_rank(shape.num_kv_heads, tp, r) for r in range(tp)] for tp in (1, 2, 4)}
    for tp, ranks in heads.items():
        print(f"tp {tp}: (first KV head, KV heads) per rank {ranks}")
    engine2.shutdown()  # stop the workers: the rest of the chapter runs in this process
    """),
    conclusion("""
    conclude(f"In the same {BUDGET / 2**20:.0f} MiB per rank, TP 2 holds **{engine2.num_kv_blocks} blocks** against TP 1's "
             f"**{e1.num_kv_blocks}**: each rank stores 1 of the 2 KV heads. At TP 4 a rank still stores 1 head "
             "(each head replicated on 2 ranks), so TP beyond the KV heads buys no more KV per GPU.",
             [("TP 2: twice the blocks", engine2.num_kv_blocks == 2 * e1.num_kv_blocks),
              ("each rank uses the budget", engine2.kv_cache_bytes == 2 * BUDGET),
              ("one head per rank at TP 2", all(n == 1 for _, n in heads[2])),
              ("replicated at TP 4", all(n == 1 for _, n in heads[4]) and len({f for f, _ in heads[4]}) == 2)])
    """),
    *question("why an all-reduce, and why two per layer?",
              "A column-parallel layer needs no communication, a row-parallel one needs an all-reduce. Why does Megatron-LM pair them (column then row) in both attention and the MLP, and what would splitting every matrix by columns cost?",
              "Column-parallel q/k/v gives each rank whole heads, and attention is independent per head; column-parallel gate/up gives each rank a slice of the MLP width, and SiLU-and-multiply is elementwise. So the next matrix (o_proj, down_proj) can take that slice as its input rows: each rank's product is a partial sum of the full output, and one all-reduce adds them. That is one collective per pair, two per layer. Splitting everything by columns would need an all-gather of the activations before every matrix that needs the whole input (4 per layer instead of 2), and the messages are the same size."),
    md("""
    ## How many GPUs does Llama-3-70B need?
    Two things must fit on each GPU: its share of the **weights** and its share of the **KV cache** for the requests in
    flight. Both are split by TP (weights by the Megatron split, KV by the heads: Llama-3-70B has 8 KV heads, so up to
    TP 8). A GPU can use `0.9 × 80 GB` of an H100 (vLLM's `gpu_memory_utilization` default; the rest is activations,
    the CUDA context). From the published config (`ModelShape` preset), in bytes:
    """),
    code("""
    H100 = memory_fit("h100", LLAMA_3_70B).usable_bytes_per_device
    VARIANTS = {"bf16": LLAMA_3_70B,
                "int8 weights, bf16 KV": shape_for_engine(LLAMA_3_70B, "auto", "int8"),
                "fp8 weights + fp8 KV": LLAMA_3_70B.with_(dtype_bytes=1)}


    def per_gpu(shape, batch, context, tp):
        \"\"\"(weight bytes, KV bytes) one GPU holds: both split over tp ranks.\"\"\"
        return shape.weight_bytes / tp, batch * context * shape.kv_bytes_per_token / tp


    def min_tp_reference(shape, batch, context):
        for tp in (1, 2, 4, 8):
            if sum(per_gpu(shape, batch, context, tp)) <= memory_fit("h100", shape, tp=tp).usable_bytes_per_device:
                return tp
        return None


    CONTEXT = 8192
    for name, s in VARIANTS.items():
        print(f"{name:22s} weights {s.weight_bytes / 1e9:6.1f} GB | KV {s.kv_bytes_per_token / 1024:.0f} KiB per token, "
              f"{CONTEXT * s.kv_bytes_per_token / 1e9:.2f} GB per {CONTEXT}-token request | "
              + " | ".join(f"batch {b}: TP {min_tp_reference(s, b, CONTEXT)}" for b in (1, 32)))
    b32 = {name: [per_gpu(s, 32, CONTEXT, tp) for tp in (1, 2, 4, 8)] for name, s in VARIANTS.items()}
    fig = go.Figure()
    for part, idx in (("weights", 0), ("KV, 32 x 8k tokens", 1)):
        fig.add_trace(go.Bar(name=part, x=[[n for n in VARIANTS for _ in (1, 2, 4, 8)], [f"TP {tp}" for _ in VARIANTS for tp in (1, 2, 4, 8)]],
                             y=[b32[n][i][idx] / 1e9 for n in VARIANTS for i in range(4)]))
    fig.add_hline(y=H100 / 1e9, line_dash="dash", annotation_text="usable per H100: 0.9 x 80 GB")
    titled(fig, "Llama-3-70B: GB per GPU, 32 requests of 8,192 tokens", clock_label="no clock: bytes from the published config")
    fig.update_layout(barmode="stack", yaxis_title="GB per GPU").show()
    """),
    conclusion("""
    bf16, i8, f8 = (VARIANTS[k] for k in VARIANTS)
    tps = {name: (min_tp_reference(s, 1, CONTEXT), min_tp_reference(s, 32, CONTEXT)) for name, s in VARIANTS.items()}
    HALVING_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
    tp_by_batch = {name: [min_tp_reference(s, b, CONTEXT) for b in HALVING_BATCHES] for name, s in VARIANTS.items()}
    halved = all(f8_tp * 2 == bf16_tp for f8_tp, bf16_tp in zip(tp_by_batch["fp8 weights + fp8 KV"], tp_by_batch["bf16"]))
    conclude(f"In bf16 the weights alone are **{bf16.weight_bytes / 1e9:.0f} GB**, more than one H100's {H100 / 1e9:.0f} usable GB: "
             f"Llama-3-70B needs TP {tps['bf16'][0]} for one 8k request and **TP {tps['bf16'][1]}** for 32 of them, whose KV "
             f"({32 * CONTEXT * bf16.kv_bytes_per_token / 1e9:.0f} GB) alone is more than one GPU holds. int8 weights halve only the layers' "
             f"weights ({i8.weight_bytes / 1e9:.0f} GB) and leave the KV: still TP {tps['int8 weights, bf16 KV'][1]} at batch 32. "
             f"fp8 weights and KV halve both: **TP {tps['fp8 weights + fp8 KV'][1]}** at batch 32, and half of bf16's GPUs at every batch "
             f"from {HALVING_BATCHES[0]} to {HALVING_BATCHES[-1]} (powers of two; bf16 TP {', '.join(map(str, tp_by_batch['bf16']))} -> fp8 TP "
             f"{', '.join(map(str, tp_by_batch['fp8 weights + fp8 KV']))}).",
             [("bf16 weights do not fit one GPU", bf16.weight_bytes > H100),
              ("the batch-32 KV alone exceeds one GPU", 32 * CONTEXT * bf16.kv_bytes_per_token > H100),
              ("bf16 at batch 32 needs more GPUs than at batch 1", tps["bf16"][1] > tps["bf16"][0]),
              ("int8 weights alone do not lower the batch-32 TP", tps["int8 weights, bf16 KV"][1] == tps["bf16"][1]),
              ("fp8 weights + KV halve the GPUs at batch 32", tps["fp8 weights + fp8 KV"][1] * 2 == tps["bf16"][1]),
              ("fp8 weights + KV halve the GPUs at every batch stated", halved)])
    """),
    *exercise(1, """
    Write `min_tp(shape, batch, context)`: the smallest tensor-parallel size in `(1, 2, 4, 8)` at which a `ModelShape`
    serves `batch` requests of `context` tokens each on H100s, or `None` when even 8 are not enough. Each GPU holds a
    `1/tp` share of the weights (`shape.weight_bytes`) **and** of the KV (`shape.kv_bytes_per_token` per token), and
    may use `0.9 × 80e9` bytes. It is checked on several models, dtypes, batches and contexts.
    """, "Both terms are divided by `tp` (the KV heads are split too, up to 8 here). The usable memory is 0.9 of 80 GB, not 80 GB.",
        "min_tp",
        """
    def min_tp(shape, batch, context):
        for tp in (1, 2, 4, 8):
            if (shape.weight_bytes + batch * context * shape.kv_bytes_per_token) / tp <= 0.9 * 80e9:
                return tp
        return None
    """,
        """
    CASES = [((s, b, c), min_tp_reference(s, b, c)) for s, b, c in [
        (LLAMA_3_70B, 1, 8192), (LLAMA_3_70B, 4, 8192), (LLAMA_3_70B, 32, 8192), (LLAMA_3_70B, 64, 8192), (LLAMA_3_70B, 256, 8192),
        (LLAMA_3_70B.with_(dtype_bytes=1), 32, 8192), (shape_for_engine(LLAMA_3_70B, "auto", "int8"), 64, 8192),
        (LLAMA_3_8B, 64, 8192), (LLAMA_3_8B, 1, 131072), (LLAMA_3_8B.with_(kv_dtype_bytes=1), 64, 8192)]]
    check_function("min_tp", min_tp, CASES, hint="KV grows with batch x context and is split over the ranks like the weights.")
    """,
        wrong=[
            """
    def min_tp(shape, batch, context):  # weights only
        for tp in (1, 2, 4, 8):
            if shape.weight_bytes / tp <= 0.9 * 80e9:
                return tp
        return None
    """,
            """
    def min_tp(shape, batch, context):  # the KV replicated on every GPU
        for tp in (1, 2, 4, 8):
            if shape.weight_bytes / tp + batch * context * shape.kv_bytes_per_token <= 0.9 * 80e9:
                return tp
        return None
    """,
            """
    def min_tp(shape, batch, context):  # all 80 GB usable
        for tp in (1, 2, 4, 8):
            if (shape.weight_bytes + batch * context * shape.kv_bytes_per_token) / tp <= 80e9:
                return tp
        return None
    """,
            """
    def min_tp(shape, batch, context):  # GiB for GB: 0.9 x 80 GiB is 77.3 GB, not 72 (batch 4 at TP 2 holds 75.9 GB)
        for tp in (1, 2, 4, 8):
            if (shape.weight_bytes + batch * context * shape.kv_bytes_per_token) / tp <= 0.9 * 80 * 2**30:
                return tp
        return None
    """,
        ]),
    md("""
    Try other deployments (no engine runs: bytes from the config):
    """),
    code("""
    import ipywidgets as widgets


    def gpus_needed(model="Llama-3-70B", weights="bf16", kv="bf16", batch=32, context=8192):
        shape = {"Llama-3-70B": LLAMA_3_70B, "Llama-3-8B": LLAMA_3_8B}[model]
        shape = shape.with_(dtype_bytes=1) if weights == "fp8" else shape_for_engine(shape, "auto", "int8") if weights == "int8" else shape
        shape = shape.with_(kv_dtype_bytes=1 if kv == "fp8" else 2)
        tp = min_tp_reference(shape, batch, context)
        for t in (1, 2, 4, 8):
            w, k = per_gpu(shape, batch, context, t)
            print(f"TP {t}: weights {w / 1e9:6.1f} GB + KV {k / 1e9:6.1f} GB = {(w + k) / 1e9:6.1f} GB of {H100 / 1e9:.0f} per GPU")
        print("smallest TP that fits:", tp or "none up to 8: lower the batch or the context, or quantize")


    widgets.interact_manual(gpus_needed, model=["Llama-3-70B", "Llama-3-8B"], weights=["bf16", "int8", "fp8"], kv=["bf16", "fp8"],
                            batch=widgets.IntSlider(value=32, min=1, max=256), context=widgets.IntSlider(value=8192, min=512, max=131072, step=512))
    """),
    md("""
    ## fp8 KV and int8 weights: blocks gained, perplexity lost
    Two quantizations the engine runs for real: `kv_cache_dtype="fp8"` stores K and V as e4m3 (1 byte per element; the
    attention paths dequantize as they read), `quantization="int8"` stores every decoder weight as int8 with a scale per
    output channel (weight-only: the matmul's inputs and outputs stay in the model's dtype). What they buy: KV blocks in
    a fixed memory budget, counted by the engine from `kv_cache_memory_bytes`. What they cost: perplexity, measured
    from the engine's own prompt logprobs on Tiny Shakespeare's held-out split, text the model never trained on
    (found under `MINENGINE_DATA`; without it, the bundled Shakespeare openings, which it may have seen: the
    conclusion says which).
    """),
    code("""
    MODES = {"float32": {}, "bfloat16": {"dtype": "bfloat16"}, "fp8 KV": {"kv_cache_dtype": "fp8"},
             "int8 weights": {"quantization": "int8"}, "fp8 KV + int8 weights": {"kv_cache_dtype": "fp8", "quantization": "int8"}}
    WINDOW, N_WINDOWS = 256, pick(16, 4)
    windows = [held_ids[i:i + WINDOW] for i in range(0, WINDOW * N_WINDOWS, WINDOW)]


    def perplexity(llm):
        \"\"\"exp(mean negative log-likelihood) of every window token after the first, from prompt logprobs.\"\"\"
        outs = llm.generate([{"prompt_token_ids": w} for w in windows], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        nll = [-lp[tok].logprob for w, o in zip(windows, outs) for tok, lp in zip(w[1:], o.prompt_logprobs[1:])]
        return math.exp(sum(nll) / len(nll)), len(nll)


    quant = {}
    for name, settings in MODES.items():
        eng = LLM(BUNDLED_MODEL, kv_cache_memory_bytes=BUDGET, max_model_len=512, **settings)
        ppl, n = perplexity(eng)
        quant[name] = {"blocks": eng.llm_engine.num_kv_blocks, "ppl": ppl}
        print(f"{name:22s} blocks in {BUDGET / 2**20:.0f} MiB: {quant[name]['blocks']:4d} | perplexity {ppl:.3f} over {n} tokens")
    # the change from float32 on an axis as wide as the 1 % the chapter checks: a raw perplexity axis spans the modes'
    # few hundredths of a percent at full height, and modes that agree to 0.03 % look far apart
    change_pct = {name: 100 * (q["ppl"] / quant["float32"]["ppl"] - 1) for name, q in quant.items()}
    fig = go.Figure(go.Scatter(x=[q["blocks"] for q in quant.values()], y=list(change_pct.values()), text=list(quant),
                               mode="markers+text", textposition="top center"))
    fig.add_hline(y=0, line_dash="dot", line_color="gray")
    titled(fig, f"KV blocks in {BUDGET / 2**20:.0f} MiB vs perplexity change from float32 ({TEXT_SOURCE})",
           clock_label="no clock: the engine's block counts and logprobs")
    fig.update_layout(xaxis_title="KV blocks (engine's count)", yaxis=dict(title="perplexity change from float32 (%)", range=[-1, 1])).show()
    """),
    conclusion("""
    base = quant["float32"]
    worst = max(abs(q["ppl"] / base["ppl"] - 1) for q in quant.values())
    conclude(f"In the same {BUDGET / 2**20:.0f} MiB the engine counts **{quant['fp8 KV']['blocks']} fp8 blocks** against "
             f"{base['blocks']} float32 ones (4 bytes to 1) and {quant['bfloat16']['blocks']} bfloat16 ones (2 to 1: what a GPU "
             f"serving bf16 gains). int8 weights do not change the blocks here: the budget is fixed (on a GPU they free weight "
             f"memory for KV: below). Perplexity on {len(windows) * (WINDOW - 1)} tokens of {TEXT_SOURCE} "
             f"({'never trained on' if HELD_OUT else 'text the model may have trained on'}) moved by at most **{worst:.2%}** over all modes "
             f"(float32: {base['ppl']:.3f}; fp8 KV + int8: {quant['fp8 KV + int8 weights']['ppl']:.3f}), on this tiny model: "
             "it says nothing about a large model, whose outlier features are why LLM.int8() keeps some in 16 bits (Dettmers et al., 2022).",
             [("fp8 KV: 4x float32's blocks", quant["fp8 KV"]["blocks"] == 4 * base["blocks"]),
              ("bfloat16: 2x float32's blocks", quant["bfloat16"]["blocks"] == 2 * base["blocks"]),
              ("int8 weights leave the KV blocks", quant["int8 weights"]["blocks"] == base["blocks"]),
              ("every mode within 1 % perplexity", worst < 0.01)])
    """),
    md("""
    ### On the modelled clock: Llama-3-8B decode on an H100
    A decode step reads every weight once and every request's KV. `StepCostModel` prices the step from the bytes each
    setting stores (`shape_for_engine`: fp8 KV = 1 byte per KV element, int8 = 1 byte per decoder weight with 16-bit
    activations), at 1 and 64 decodes with 2,047 tokens of context before them:
    """),
    code("""
    SETTINGS = {"bf16": ("auto", None), "fp8 KV": ("fp8", None), "int8 weights": ("auto", "int8"), "fp8 KV + int8": ("fp8", "int8")}
    step = {}
    for name, (kv, q) in SETTINGS.items():
        m = StepCostModel("h100", shape_for_engine(LLAMA_3_8B, kv, q))
        one, many = m.cost([(1, 2047, 1)]), m.cost([(1, 2047, 1)] * 64)
        fit = memory_fit("h100", m.shape)  # what is left for KV after the weights, per 16-token block
        blocks = int(fit.kv_bytes_per_device // (16 * m.shape.kv_bytes_per_token))
        step[name] = {"1": one.time_s * 1e3, "64": many.time_s * 1e3, "weights": many.weight_bytes / 1e9, "kv": many.kv_bytes / 1e9,
                      "blocks": blocks}
        print(f"{name:14s} weights read {step[name]['weights']:5.2f} GB | KV read {step[name]['kv']:5.2f} GB | "
              f"step, 1 decode {step[name]['1']:5.2f} ms | 64 decodes {step[name]['64']:5.2f} ms | KV blocks in 0.9 x 80 GB: {blocks:,}")
    """),
    conclusion("""
    gain = {n: {b: step["bf16"][b] / s[b] for b in ("1", "64")} for n, s in step.items()}
    conclude(f"At **1 decode** the weights dominate: int8 weights cut the modelled step {gain['int8 weights']['1']:.2f}x, fp8 KV only "
             f"{gain['fp8 KV']['1']:.2f}x. At **64 decodes of 2k** the KV read ({step['bf16']['kv']:.1f} GB) outweighs the weights "
             f"({step['bf16']['weights']:.1f} GB) and fp8 KV gains more ({gain['fp8 KV']['64']:.2f}x vs {gain['int8 weights']['64']:.2f}x). "
             f"Both: {gain['fp8 KV + int8']['64']:.2f}x. (The modelled clock: an H100 roofline model, not a measurement.) In memory, "
             f"the H100 holds **{step['bf16']['blocks']:,}** KV blocks of Llama-3-8B after bf16 weights, {step['int8 weights']['blocks']:,} "
             f"after int8 ones (the weights freed), {step['fp8 KV']['blocks']:,} with fp8 KV.",
             [("batch 1: int8 weights beat fp8 KV", gain["int8 weights"]["1"] > gain["fp8 KV"]["1"]),
              ("batch 64: KV read exceeds weights read", step["bf16"]["kv"] > step["bf16"]["weights"]),
              ("batch 64: fp8 KV beats int8 weights", gain["fp8 KV"]["64"] > gain["int8 weights"]["64"]),
              ("int8 weights free memory for KV", step["int8 weights"]["blocks"] > step["bf16"]["blocks"]),
              ("fp8 KV doubles the blocks", abs(step["fp8 KV"]["blocks"] - 2 * step["bf16"]["blocks"]) <= 1),
              ("both together beat either", all(gain["fp8 KV + int8"][b] > max(gain["fp8 KV"][b], gain["int8 weights"][b]) for b in ("1", "64")))])
    """),
    *exercise(2, """
    Write `allreduce_bytes(num_tokens, num_layers, hidden_size, element_bytes)`: the bytes **one rank** all-reduces in a
    tensor-parallel step of `num_tokens` tokens (the messages' total size, as `TensorParallelGroup` counts it). It is
    checked against what the bundled model's workers counted in the steps above and against the cost model for
    Llama-3-70B at TP 8.
    """, "How many row-parallel layers per decoder layer? What shape is each message? Does tp change the message?",
        "allreduce_bytes",
        """
    def allreduce_bytes(num_tokens, num_layers, hidden_size, element_bytes):
        return 2 * num_layers * num_tokens * hidden_size * element_bytes
    """,
        """
    seventy = StepCostModel("h100", LLAMA_3_70B, tp=8)
    CASES = [((n, shape.num_layers, shape.hidden_size, 4), b) for n, b in measured]
    CASES += [((n, 80, 8192, 2), seventy.allreduce_count_and_bytes(StepWork.of([(n, 0, 1)]))[1]) for n in (1, 7, 512)]
    check_function("allreduce_bytes", allreduce_bytes, CASES, hint="One all-reduce after o_proj, one after down_proj; each is [tokens, hidden].")
    """,
        wrong=[
            "allreduce_bytes = lambda num_tokens, num_layers, hidden_size, element_bytes: num_layers * num_tokens * hidden_size * element_bytes  # one per layer",
            "allreduce_bytes = lambda num_tokens, num_layers, hidden_size, element_bytes: 2 * num_layers * hidden_size * element_bytes  # forgot the tokens",
            "allreduce_bytes = lambda num_tokens, num_layers, hidden_size, element_bytes: 2 * num_layers * num_tokens * hidden_size * element_bytes // 2  # divided by tp",
        ]),
    *question("what if a model has fewer KV heads than GPUs?",
              "Llama-3-70B has 8 KV heads. What happens to the KV per GPU at TP 16, and what does that do to the answer of Exercise 1?",
              "Each KV head is then replicated on 2 GPUs (`kv_heads_of_rank`): a GPU still stores one head, so the KV per GPU stays at TP 8's while the weights per GPU halve again. The formula `KV / tp` of Exercise 1 holds up to tp = number of KV heads; beyond it the KV share is `KV / num_kv_heads`. Deployments that big usually add pipeline parallelism (split the layers) instead, which splits KV by layers."),
    *question("why does fp8 KV pay at large batches and int8 weights at small ones?",
              "Both halve bytes. Why did the modelled decode step favour int8 weights at batch 1 and fp8 KV at batch 64?",
              "A decode step is memory-bound: its time is about the bytes read. The weights are read once per step whatever the batch; the KV read is batch x context x KV bytes per token. At batch 1 the weights are almost all of the bytes, so halving them gains most; at 64 requests of 2,047-token contexts the KV read is larger than the weights, so halving it gains more, and fp8 KV also doubles the blocks, so the batch itself can grow (checked: batch 1: int8 weights beat fp8 KV; batch 64: KV read exceeds weights read; batch 64: fp8 KV beats int8 weights; fp8 KV doubles the blocks)."),
    *summary([
        "The engine's TP runs the model in 2 worker processes (Megatron split, gloo); greedy tokens equalled TP 1's on every prompt above.",
        "Each rank all-reduces 2 messages per layer of `tokens x hidden` activations: counted in the workers, equal to `StepCostModel.allreduce_count_and_bytes` on every step.",
        "KV heads are sharded: the same per-rank budget holds tp times the blocks, until tp exceeds the KV heads, then replicated (checked: TP 2: twice the blocks; replicated at TP 4).",
        "Llama-3-70B's bf16 weights alone do not fit one H100; the KV of the batch decides between TP 2, 4 and 8; fp8 weights and KV halve the GPUs (checked: fp8 weights + KV halve the GPUs at every batch stated).",
        "fp8 KV: 4x float32's (2x bf16's) blocks in the engine's budget; perplexity moved under 1 % on this tiny model; on the modelled H100, int8 weights help small-batch decode and fp8 KV large-batch decode (checked: fp8 KV: 4x float32's blocks; bfloat16: 2x float32's blocks; every mode within 1 % perplexity; batch 1: int8 weights beat fp8 KV; batch 64: fp8 KV beats int8 weights).",
    ]),
    *glossary([
        ("tensor parallelism (TP)", "张量并行", "every weight matrix split over tp GPUs; one all-reduce per row-parallel layer"),
        ("all-reduce", "全规约", "every rank ends with the sum of every rank's tensor"),
        ("column-parallel / row-parallel", "列并行 / 行并行", "split a weight's outputs / inputs over the ranks"),
        ("KV head replication", "KV 头复制", "more ranks than KV heads: a head stored on several ranks"),
        ("fp8 (e4m3)", "FP8（e4m3）", "1-byte float: 4 exponent bits, 3 mantissa bits (Micikevicius et al., *FP8 Formats for Deep Learning*, 2022); the KV cache's dtype here"),
        ("weight-only int8", "仅权重 int8 量化", "int8 weights with a per-output-channel scale, 16/32-bit activations"),
        ("perplexity", "困惑度", "exp of the mean negative log-likelihood per token; lower is better"),
    ]),
]
