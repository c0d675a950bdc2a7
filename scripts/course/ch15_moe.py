# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 15: mixture of experts and expert parallelism: tokens per expert measured on the engine running a
random-weight Qwen3-MoE checkpoint built in the notebook (the router's choices read with forward hooks), imbalance,
active vs total parameters and what they do to decode's memory-bound step on the modelled H100, the experts a step
hits, and expert parallelism's all-to-all bytes and busiest rank from the cost model."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(15, "Mixture of experts and expert parallelism", [
        "Build a small Qwen3-MoE checkpoint, serve it with the engine and count the tokens each expert receives, step by step, from the router's own choices.",
        "Measure load imbalance (the hottest expert against the mean) and the distinct experts a step hits, against the uniform-routing formula `E (1 - (1 - k/E)^T)`.",
        "Tell total from active parameters (Mixtral-8x7B, Qwen3-30B-A3B) and see what they do to a decode step, which is memory-bound: the bytes follow the experts hit, not the parameters per token.",
        "Price expert parallelism: the all-to-all bytes of dispatch and combine, and why the busiest rank sets a sparse layer's time.",
    ], ["Shazeer et al., *Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer*, ICLR 2017",
        "Jiang et al., *Mixtral of Experts*, 2024 (8 experts, top-2; 46.7 B parameters, 12.9 B active)",
        "Qwen team, *Qwen3 Technical Report*, 2025 (Qwen3-30B-A3B: 128 experts, 8 per token)",
        "Lepikhin et al., *GShard*, ICLR 2021 (expert parallelism, all-to-all dispatch and combine); DeepSeek-AI, *DeepSeek-V3 Technical Report*, 2024 (EPLB: replicating hot experts)",
        "vLLM docs, *Expert Parallel Deployment* (`enable_expert_parallel`)",
        "minengine `layers/moe.py`, `layers/moe_routing.py`, `models/moe.py`, `timing/model_shape.py` (`ModelShape` MoE fields), `timing/moe_cost.py`"]),
    code(SETUP + """\
import random
import tempfile

import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from minengine.layers.moe import SparseMoeBlock
from minengine.timing import LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, QWEN3_30B_A3B, StepCostModel, StepWork
from minengine.timing.model_shape import ModelShape
from minengine.timing.moe_cost import alltoall_bytes
"""),
    md("""
    ## A mixture-of-experts checkpoint, built here
    In a MoE layer the MLP is replaced by a **router** (one linear layer, hidden → one logit per expert) and `E`
    **experts** (each a SwiGLU MLP). Every token goes through the `k` experts with the largest router logits (checked: one token hits exactly k),
    and its output is their outputs weighted by the gate weights. The engine runs Mixtral and Qwen3-MoE checkpoints
    (`models/moe.py`); here we build a small random-weight Qwen3-MoE with transformers, `save_pretrained` it, and
    serve it. The weights are random, so the tokens carry no meaning, but the router is a real router: its choices are
    what we count.
    """),
    code("""
    E, K = 8, 2  # experts per sparse layer, experts per token
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=True, max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # wider than the default init, so the router's logits are not all near zero
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    CKPT = tempfile.mkdtemp(prefix="minengine-moe-")
    hf.save_pretrained(CKPT)
    llm = LLM(CKPT, max_model_len=512, max_num_batched_tokens=256)
    engine = llm.llm_engine
    blocks = [m for m in engine.model.modules() if isinstance(m, SparseMoeBlock)]
    print("checkpoint:", CKPT, "| sparse layers:", len(blocks), "| experts per layer:", E, "| per token:", K)
    """),
    md("""
    ## Tokens per expert, read from the router
    A forward hook on each layer's router (`SparseMoeBlock.gate`) sees its logits for every token of a step; the `k`
    largest are the experts the layer runs for that token (`layers/moe_routing.py`: both routings keep the same `k`).
    Count them per step and per layer while the engine serves a batch of prompts (random token ids: this model has no
    tokenizer), and put the counts next to the step's tokens from the engine's own trace:
    """),
    code("""
    step_loads = []  # one entry per forward: [layer][expert] -> tokens routed there
    current = {}


    def record(layer):
        def hook(module, inputs, logits):
            ids = torch.topk(logits.float(), K, dim=-1).indices
            current[layer] = torch.bincount(ids.reshape(-1), minlength=E).tolist()
        return hook


    handles = [b.gate.register_forward_hook(record(i)) for i, b in enumerate(blocks)]
    N_PROMPTS, N_OUT = pick(16, 8), pick(24, 12)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(20, 120))] for _ in range(N_PROMPTS)]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=N_OUT, ignore_eos=True))
    while engine.has_unfinished_requests():
        current.clear()
        engine.step()
        step_loads.append([current[i] for i in range(len(blocks))])
    for h in handles:
        h.remove()
    traces = engine.traces[-len(step_loads):]
    tokens = [StepWork.from_step_trace(t).num_tokens for t in traces]
    print("steps:", len(step_loads), "| tokens per step (first 6):", tokens[:6], "| loads of step 0, layer 0:", step_loads[0][0])
    viz.batch_composition_figure(traces).update_layout(title="The MoE model's steps (tokens per step)").show()
    """),
    conclusion("""
    pairs_ok = all(sum(layer) == n * K for loads, n in zip(step_loads, tokens) for layer in loads)
    conclude(f"In every one of the **{len(step_loads)} steps** and both sparse layers, the router's choices add up to "
             f"**tokens × k** (k = {K}): each token went to exactly {K} experts, and the hook saw exactly the tokens the "
             "engine's trace says the step computed.",
             [("every layer of every step: sum of loads = tokens x k", pairs_ok),
              ("prefill and decode steps were both seen", max(tokens) > 2 * N_PROMPTS and min(tokens) <= N_PROMPTS)])
    """),
    md("""
    ## Imbalance: the hottest expert against the mean
    With `T` tokens and top-`k`, an expert receives `T k / E` tokens on average. Routing is not uniform: the
    **imbalance** of a layer in a step is its hottest expert's tokens over that mean (1 = perfectly balanced). Sum the
    counts over the whole run, and look at each step too:
    """),
    code("""
    totals = [[sum(loads[l][e] for loads in step_loads) for e in range(E)] for l in range(len(blocks))]


    def imbalance(loads):
        mean = sum(loads) / len(loads)
        return max(loads) / mean if mean else 0.0


    per_step = [imbalance(loads[l]) for loads in step_loads for l in range(len(blocks))]
    fig = go.Figure([go.Bar(name=f"layer {l}", x=[f"expert {e}" for e in range(E)], y=totals[l]) for l in range(len(blocks))])
    titled(fig, "Tokens each expert received over the run (the router's top-k, read by hooks)", clock_label="no clock: counts from the engine")
    fig.update_layout(barmode="group", yaxis_title="tokens").show()
    print("whole run, imbalance per layer:", [round(imbalance(t), 2) for t in totals],
          "| per step: median", round(sorted(per_step)[len(per_step) // 2], 2), "max", round(max(per_step), 2))
    """),
    conclusion("""
    run_imb = [imbalance(t) for t in totals]
    decode_steps = [loads for loads, n in zip(step_loads, tokens) if n <= N_PROMPTS]
    conclude(f"Over the run the hottest expert got **{max(run_imb):.2f}x** the mean in its layer; single steps are more "
             f"unbalanced (worst **{max(per_step):.2f}x**), because a step has few tokens to spread: a decode step of "
             f"{N_PROMPTS} tokens cannot fill {E} experts evenly. Whoever runs the hottest expert works longest.",
             [("the run is not perfectly balanced", max(run_imb) > 1.0),
              ("single steps are at least as unbalanced as the whole run", max(per_step) >= max(run_imb)),
              ("decode steps were seen", len(decode_steps) > 0)])
    """),
    md("""
    ## How many experts does a step hit?
    A decode step of a few tokens does not touch every expert. If each token picked its `k` experts uniformly at random,
    an expert would be missed by one token with probability `1 - k/E`, by all `T` with `(1 - k/E)^T`, so a step hits
    `E (1 - (1 - k/E)^T)` distinct experts in expectation (`ModelShape.expected_experts_hit`). Compare with what the
    router did, step by step:
    """),
    code("""
    shape = ModelShape.from_hf_config(CKPT)  # the model just built, as the cost model sees it
    hits = [(n, sum(1 for c in loads[l] if c)) for loads, n in zip(step_loads, tokens) for l in range(len(blocks))]
    by_tokens = {}
    for n, h in hits:
        by_tokens.setdefault(n, []).append(h)
    xs = sorted(by_tokens)
    fig = go.Figure([go.Scatter(x=xs, y=[sum(by_tokens[n]) / len(by_tokens[n]) for n in xs], mode="markers", name="measured (mean per step size)"),
                     go.Scatter(x=xs, y=[shape.expected_experts_hit(n) for n in xs], mode="lines", name="uniform routing: E (1 - (1 - k/E)^T)")])
    titled(fig, "Distinct experts a step hits, by the step's tokens", clock_label="no clock: counts from the engine")
    fig.update_layout(xaxis_type="log", xaxis_title="tokens in the step", yaxis_title="experts hit (of 8)").show()
    """),
    conclusion("""
    one = [h for n, h in hits if n == 1]
    small = [(n, h) for n, h in hits if n <= 4]
    big = [h for n, h in hits if n >= 64]
    decode_hits = [(n, h) for n, h in hits if n <= N_PROMPTS]
    measured_mean = sum(h for _, h in decode_hits) / len(decode_hits)
    uniform_mean = sum(shape.expected_experts_hit(n) for n, _ in decode_hits) / len(decode_hits)
    side = "fewer" if measured_mean < uniform_mean else "as many as or more"
    conclude(f"Every step hit between k = {K} and min(E, T k) experts, as it must; steps of 64 tokens or more hit all {E} "
             f"(the formula gives {shape.expected_experts_hit(64):.2f} at 64). The decode steps are where few experts are hit and the "
             f"formula matters: they hit **{measured_mean:.2f}** experts on average, {side} than uniform routing's "
             f"{uniform_mean:.2f} for the same step sizes (this random router; a trained one has its own preferences).",
             [("between k and min(E, T k)", all(K <= h <= min(E, n * K) for n, h in hits)),
              ("one token hits exactly k", all(h == K for h in one)),
              ("big steps hit every expert", bool(big) and all(h == E for h in big)),
              ("small steps were seen", bool(small) and bool(decode_hits)),
              ("the stated side of the formula", (measured_mean < uniform_mean) == (side == "fewer"))])
    """),
    md("""
    ## Active and total parameters
    A MoE model **holds** every expert but a token **computes with** `k` of them. `ModelShape` counts both from the
    published configs (`num_params`, `num_active_params`; the counts equal transformers' models, `tests/timing/
    test_moe_cost.py`). Memory is sized by the total, FLOPs per token by the active:
    """),
    code("""
    SHAPES = [LLAMA_3_8B, MIXTRAL_8X7B, QWEN3_30B_A3B, LLAMA_3_70B]
    for s in SHAPES:
        print(f"{s.name:14s} total {s.num_params / 1e9:5.1f} B | active {s.num_active_params / 1e9:5.1f} B "
              f"| experts {s.num_experts or '-':>3} top-{s.top_k or '-'} | bf16 weights {s.weight_bytes / 1e9:6.1f} GB")
    """),
    conclusion("""
    m, q = MIXTRAL_8X7B, QWEN3_30B_A3B
    conclude(f"Mixtral-8x7B holds **{m.num_params / 1e9:.1f} B** parameters and computes with **{m.num_active_params / 1e9:.1f} B** per token "
             f"({m.num_active_params / m.num_params:.0%}); Qwen3-30B-A3B holds {q.num_params / 1e9:.1f} B and computes with "
             f"{q.num_active_params / 1e9:.2f} B ({q.num_active_params / q.num_params:.0%}). Mixtral needs the memory of a "
             f"{m.weight_bytes / 1e9:.0f} GB model and, per token, the FLOPs of a 13 B one.",
             [("Mixtral: 46.7 B total, 12.9 B active", round(m.num_params / 1e9, 1) == 46.7 and round(m.num_active_params / 1e9, 1) == 12.9),
              ("Qwen3-30B-A3B: 30.5 B total", round(q.num_params / 1e9, 1) == 30.5),
              ("active is a small share", q.num_active_params / q.num_params < m.num_active_params / m.num_params < 0.5)])
    """),
    *question("why not just count active parameters to size the GPUs?",
              "Qwen3-30B-A3B computes with about 3 B parameters per token. Why can it not be served on a GPU sized for a 3 B dense model?",
              "Every expert can be chosen by the next token, so all of them must be in GPU memory (or be copied in from host memory over PCIe inside the step). Memory follows the total parameters; the FLOPs per token follow the active ones (checked: active is a small share). What the active count does buy is compute, and at small batches the bytes read per step (checked: active is a small share; batch 1 reads the active weights)."),
    md("""
    ## MoE on the modelled clock: decode reads the experts it hits
    A decode step is memory-bound: its time is about the bytes it reads. A dense model reads all its weights whatever
    the batch. A MoE step reads its attention weights and the experts **its tokens hit**: two per layer for one token
    (Mixtral), all eight once the batch is large enough. `StepCostModel` prices exactly that (expected experts hit under
    uniform routing, each expert one GEMM at the soft roofline). Decode steps at 1,000 tokens of context on an H100:
    """),
    code("""
    BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    models = {s.name: StepCostModel("h100", s) for s in (LLAMA_3_8B, MIXTRAL_8X7B, QWEN3_30B_A3B)}
    models["Llama-3-70B (TP 2)"] = StepCostModel("h100", LLAMA_3_70B, tp=2)
    decode = {name: [m.cost([(1, 1000, 1)] * b) for b in BATCHES] for name, m in models.items()}
    fig = go.Figure([go.Scatter(x=BATCHES, y=[c.weight_bytes / 1e9 for c in costs], name=name, mode="lines+markers") for name, costs in decode.items()])
    titled(fig, "Weight bytes one decode step reads, per GPU", clock_label=models["Mixtral-8x7B"].label)
    fig.update_layout(xaxis_type="log", xaxis_title="decodes in the step", yaxis_title="GB read").show()
    for name, costs in decode.items():
        print(f"{name:20s} step ms: " + " ".join(f"{c.time_s * 1e3:6.1f}" for c in costs) + "   (batch " + ", ".join(map(str, BATCHES)) + ")")
    """),
    conclusion("""
    mx = decode["Mixtral-8x7B"]
    m = MIXTRAL_8X7B
    active_bytes = 2 * (m.num_active_params - m.vocab_size * m.hidden_size - m.num_layers * 2 * m.hidden_size - m.hidden_size)
    conclude(f"One Mixtral decode reads **{mx[0].weight_bytes / 1e9:.1f} GB** of weights (its active parameters, 2 bytes each, "
             f"less the embedding), a 64-decode step **{mx[BATCHES.index(64)].weight_bytes / 1e9:.1f} GB** (every expert: "
             f"{mx[BATCHES.index(64)].experts_hit:.2f} of 8 per layer). So MoE's saving on a memory-bound step is a small-batch saving: "
             f"at batch 1 the modelled step is {mx[0].time_s * 1e3:.1f} ms against Llama-3-70B's {decode['Llama-3-70B (TP 2)'][0].time_s * 1e3:.1f} ms on two GPUs, "
             f"while from 64 decodes on it reads as much as a dense {m.num_params / 1e9:.0f} B model would.",
             [("batch 1 reads the active weights", abs(mx[0].weight_bytes - active_bytes) / active_bytes < 0.05),
              ("batch 64 reads every expert", abs(mx[BATCHES.index(64)].weight_bytes / (2 * m.num_params) - 1) < 0.02),
              ("MoE weight bytes grow with the batch", mx[BATCHES.index(64)].weight_bytes > 3 * mx[0].weight_bytes),
              ("dense weight bytes do not", decode["Llama-3-8B"][0].weight_bytes == decode["Llama-3-8B"][-1].weight_bytes),
              ("batch 1: Mixtral is faster than Llama-3-70B on 2 GPUs", mx[0].time_s < decode["Llama-3-70B (TP 2)"][0].time_s)])
    """),
    md("""
    How far is this clock from a real MoE server? Baseten published one Mixtral-8x7B measurement in full detail: int8
    weights on TensorRT-LLM, one A100, one request of a 512-token prompt and 128 output tokens, 127 ms to the first
    token and 81 tokens per second as the user sees them (source: Baseten, *Faster Mixtral inference with TensorRT-LLM
    and quantization*, 2024). Price the same request on the modelled A100 (int8 weights: 1 byte per layer weight;
    TensorRT-LLM's host cost: the `cuda-graph` engine profile), reading 81 tokens per second as 128 tokens over the
    whole request:
    """),
    code("""
    from minengine.timing.clocks import shape_for_engine

    BASETEN_TOK_S, BASETEN_TTFT_S, PROMPT, OUTPUT = 81.0, 0.127, 512, 128
    a100 = StepCostModel("a100", shape_for_engine(MIXTRAL_8X7B, "auto", "int8"), engine="cuda-graph")
    ttft = a100.cost([(PROMPT, 0, 1)]).time_s
    request_s = ttft + sum(a100.cost([(1, PROMPT + i, 1)]).time_s for i in range(OUTPUT - 1))
    modelled_tok_s = OUTPUT / request_s
    print(f"{a100.label}: TTFT {ttft * 1e3:.0f} ms (measured {BASETEN_TTFT_S * 1e3:.0f}) | {modelled_tok_s:.1f} tok/s (measured {BASETEN_TOK_S:.0f})")
    """),
    conclusion("""
    gap = modelled_tok_s / BASETEN_TOK_S - 1
    conclude(f"The modelled request runs at **{modelled_tok_s:.1f} tokens per second**, {gap:+.0%} against the measured {BASETEN_TOK_S:.0f}: "
             f"the clock is optimistic, and more so on the first token ({ttft * 1e3:.0f} ms against {BASETEN_TTFT_S * 1e3:.0f}, which also holds the "
             "network and the server). It prices int8 weights as one byte read, with no cost to dequantize them. Read its MoE times as on the fast "
             "side; `tests/timing/test_moe_cost.py` keeps this gap within 25 %.",
             [("the model is optimistic", modelled_tok_s > BASETEN_TOK_S and ttft < BASETEN_TTFT_S),
              ("within 25 % of the measurement", abs(gap) <= 0.25)])
    """),
    *exercise(1, """
    Write `experts_hit(T, E, k)`: the expected number of distinct experts `T` tokens reach in one layer when each token
    picks `k` of the `E` experts uniformly at random (without repeating one). Checked against
    `ModelShape.expected_experts_hit` on several shapes and token counts.
    """, "Work out the probability that one given expert is chosen by *none* of the T tokens.",
        "experts_hit",
        """
    def experts_hit(T, E, k):
        return E * (1 - (1 - k / E) ** T)
    """,
        """
    CASES = [((T, s.num_experts, s.top_k), s.expected_experts_hit(T)) for s in (MIXTRAL_8X7B, QWEN3_30B_A3B, shape) for T in (1, 3, 16, 100)]
    check_function("experts_hit", experts_hit, CASES, hint="A token misses a given expert with probability 1 - k/E.", rel_tol=1e-9)
    """,
        wrong=[
            "experts_hit = lambda T, E, k: min(E, T * k)  # no two tokens share an expert",
            "experts_hit = lambda T, E, k: E * (1 - (1 - 1 / E) ** (T * k))  # T*k independent picks, repeats allowed",
            "experts_hit = lambda T, E, k: T * k  # every pair a new expert",
        ]),
    *exercise(2, """
    Write `active_params(shape)`: the parameters one token computes with, for a `ModelShape` (`shape.num_params`,
    `shape.num_experts`, `shape.top_k`, `shape.sparse_layers`, `shape.params_per_expert`). A dense shape
    (`num_experts == 0`) computes with all of them. Checked on Mixtral-8x7B, Qwen3-30B-A3B, the model built above and
    Llama-3-8B.
    """, "Only the experts a token does not go to are idle, and only in the sparse layers; attention, norms, routers and embeddings always work.",
        "active_params",
        """
    def active_params(shape):
        return shape.num_params - shape.sparse_layers * (shape.num_experts - shape.top_k) * shape.params_per_expert
    """,
        """
    CASES = [((s,), s.num_active_params) for s in (MIXTRAL_8X7B, QWEN3_30B_A3B, shape, LLAMA_3_8B)]
    check_function("active_params", active_params, CASES, hint="Subtract (E - k) experts per sparse layer.")
    """,
        wrong=[
            "active_params = lambda shape: shape.num_params * shape.top_k // shape.num_experts if shape.num_experts else shape.num_params  # scales attention too",
            "active_params = lambda shape: shape.num_params - (shape.num_experts - shape.top_k) * shape.params_per_expert  # one layer only",
            "active_params = lambda shape: shape.num_params - shape.sparse_layers * shape.num_experts * shape.params_per_expert  # no expert left",
        ]),
    md("""
    ## Expert parallelism: the all-to-all and the busiest rank
    With **expert parallelism** (EP; vLLM's `enable_expert_parallel`) whole experts are spread over the GPUs, `E / n`
    each, instead of cutting every expert's width over them (what plain TP does). A token's hidden state then travels to
    the GPUs of its `k` experts (**dispatch**, an all-to-all) and their outputs travel back (**combine**, another). With
    the step's tokens spread evenly over `n` ranks and uniform routing, a pair's expert is on another rank with
    probability `(n - 1)/n`, so each rank sends `2 × sparse layers × (T/n) × k × (n - 1)/n × hidden × bytes`
    (`StepCostModel.alltoall_count_and_bytes`, `moe_cost.alltoall_bytes`). Compare with TP's all-reduces for Mixtral-8x7B
    over 2, 4 and 8 H100s at 64 decodes:
    """),
    code("""
    work = StepWork.of([(1, 1000, 1)] * 64)
    rows = {}
    for n in (2, 4, 8):
        tp, ep = StepCostModel("h100", MIXTRAL_8X7B, tp=n), StepCostModel("h100", MIXTRAL_8X7B, tp=n, expert_parallel=True)
        rows[n] = {"tp": tp.cost(work), "ep": ep.cost(work), "a2a": ep.alltoall_count_and_bytes(work), "ar": tp.allreduce_count_and_bytes(work)}
        r = rows[n]
        print(f"{n} GPUs | TP: {r['ar'][0]} all-reduces, {r['ar'][1] / 1e6:.2f} MB of messages, step {r['tp'].time_s * 1e3:.2f} ms | "
              f"EP: {r['a2a'][0]} all-to-alls, {r['a2a'][1] / 1e6:.2f} MB sent per rank, step {r['ep'].time_s * 1e3:.2f} ms")
    """),
    conclusion("""
    b = {n: rows[n]["a2a"][1] for n in rows}
    conclude(f"At 64 decodes each EP rank sends **{b[2] / 1e6:.2f} MB** per step at 2 GPUs, {b[4] / 1e6:.2f} MB at 4 and {b[8] / 1e6:.2f} MB at 8: "
             "the tokens per rank shrink as 1/n while the remote share (n - 1)/n grows, so the bytes per rank fall, but slower than 1/n. "
             f"The all-to-alls replace the MoE all-reduce of every layer ({rows[2]['ar'][0]} all-reduces under TP, "
             f"{rows[2]['ep'].num_allreduces} under EP: attention's only).",
             [("bytes per rank fall with more ranks", b[2] > b[4] > b[8]),
              ("but slower than 1/n", b[8] > b[2] / 4),
              ("the bytes are the formula's", all(rows[n]["a2a"][1] == alltoall_bytes(MIXTRAL_8X7B, 64, n) for n in rows)),
              ("EP keeps one all-reduce per layer", rows[2]["ep"].num_allreduces == MIXTRAL_8X7B.num_layers)])
    """),
    md("""
    Under EP the step waits for the **busiest rank**: the one whose experts received the most tokens. Take the loads
    the router really produced in the prefill steps above (8 experts, top-2, like Mixtral), give them to every layer of
    Mixtral-8x7B on 4 GPUs (`StepWork.expert_loads`: the cost model then runs each expert's own tokens), and compare
    with the same tokens spread perfectly evenly:
    """),
    code("""
    ep4 = StepCostModel("h100", MIXTRAL_8X7B, tp=4, expert_parallel=True)
    prefill = [(loads, n) for loads, n in zip(step_loads, tokens) if n > 2 * N_PROMPTS]
    compare = []
    for loads, n in prefill:
        measured = StepWork.of([(n, 0, 1)], expert_loads=[loads[0]] * MIXTRAL_8X7B.num_layers)
        even_loads = [n * K // E + (1 if e < n * K % E else 0) for e in range(E)]
        even = StepWork.of([(n, 0, 1)], expert_loads=[even_loads] * MIXTRAL_8X7B.num_layers)
        compare.append((n, imbalance(loads[0]), ep4.cost(measured).linear_time_s, ep4.cost(even).linear_time_s))
    for n, imb, t_m, t_e in compare:
        print(f"{n:4d} tokens | imbalance {imb:.2f} | GEMM time, measured routing {t_m * 1e3:.2f} ms vs balanced {t_e * 1e3:.2f} ms")
    """),
    conclusion("""
    worst = max(compare, key=lambda c: c[2] / c[3])
    conclude(f"With the router's real loads the modelled GEMM time of a prefill step was up to **{worst[2] / worst[3]:.2f}x** the balanced one "
             f"({worst[0]} tokens, imbalance {worst[1]:.2f}): the rank holding the hottest experts runs more tokens while the others wait. "
             "That is why DeepSeek-V3 replicates its hot experts (EPLB) and why MoE training adds a load-balancing loss.",
             [("prefill steps were priced", len(compare) > 0),
              ("unbalanced routing is never faster than balanced", all(t_m >= t_e * 0.999 for _, _, t_m, t_e in compare)),
              ("and is slower somewhere", worst[2] > worst[3])])
    """),
    *exercise(3, """
    Write `dispatch_combine_bytes(T, k, hidden, element_bytes, sparse_layers, n)`: the bytes **one rank** sends in one
    step's dispatch and combine all-to-alls under expert parallelism over `n` ranks, with the step's `T` tokens spread
    evenly over the ranks and uniform routing (as above). Checked against the cost model for Mixtral-8x7B and
    Qwen3-30B-A3B.
    """, "Per sparse layer: the rank's T/n tokens, k pairs each, a share (n - 1)/n of them remote; one message out and one back.",
        "dispatch_combine_bytes",
        """
    def dispatch_combine_bytes(T, k, hidden, element_bytes, sparse_layers, n):
        return 2 * sparse_layers * (T / n) * k * (n - 1) / n * hidden * element_bytes
    """,
        """
    CASES = [((T, s.top_k, s.hidden_size, 2, s.sparse_layers, n), StepCostModel("h100", s, tp=n, expert_parallel=True).alltoall_count_and_bytes(StepWork.of([(T, 0, 1)]))[1])
             for s in (MIXTRAL_8X7B, QWEN3_30B_A3B) for T in (1, 64, 512) for n in (2, 8)]
    check_function("dispatch_combine_bytes", dispatch_combine_bytes, CASES, hint="Dispatch and combine; only remote pairs move; each rank holds T/n tokens.", rel_tol=1e-9)
    """,
        wrong=[
            "dispatch_combine_bytes = lambda T, k, hidden, element_bytes, sparse_layers, n: sparse_layers * (T / n) * k * (n - 1) / n * hidden * element_bytes  # dispatch only",
            "dispatch_combine_bytes = lambda T, k, hidden, element_bytes, sparse_layers, n: 2 * sparse_layers * (T / n) * k * hidden * element_bytes  # local pairs sent too",
            "dispatch_combine_bytes = lambda T, k, hidden, element_bytes, sparse_layers, n: 2 * sparse_layers * T * k * (n - 1) / n * hidden * element_bytes  # every token on every rank",
        ]),
    md("""
    Try other models, batches and GPU counts (the cost model only, no engine):
    """),
    code("""
    import ipywidgets as widgets


    def moe_step(model="Mixtral-8x7B", batch=64, gpus=4, expert_parallel=True):
        s = {"Mixtral-8x7B": MIXTRAL_8X7B, "Qwen3-30B-A3B": QWEN3_30B_A3B}[model]
        m = StepCostModel("h100", s, tp=gpus, expert_parallel=expert_parallel and gpus > 1)
        c = m.cost([(1, 1000, 1)] * batch)
        print(f"{m.label}: step {c.time_s * 1e3:.2f} ms | experts hit per layer per GPU {c.experts_hit:.2f} | weights read "
              f"{c.weight_bytes / 1e9:.2f} GB | all-to-all {c.alltoall_bytes / 1e6:.2f} MB per rank | bound: {c.bound}")


    widgets.interact_manual(moe_step, model=["Mixtral-8x7B", "Qwen3-30B-A3B"], batch=widgets.IntSlider(value=64, min=1, max=512),
                            gpus=[1, 2, 4, 8], expert_parallel=True)
    """),
    md("""
    The KV cache of a MoE model is sized by its attention, not its experts: Mixtral has the GQA of Mistral-7B. The other
    ways to shrink the KV cache (MQA, GQA, MLA, sliding windows) are computed for published shapes in
    [chapter 02 · Other ways to shrink the KV cache](02_paged_attention.ipynb).
    """),
    *question("what if the batch grows: does MoE still save?",
              "At batch 1 Mixtral reads its active weights; at 64 decodes it reads all of them. What does that mean for the tokens per second per GPU of a large-batch MoE deployment against a dense model of the same active size?",
              "Once every expert is hit, the step reads the whole model like a dense model of the total size, so in the memory-bound regime a large batch is priced like a dense model of the total size, not of the active size; the saving that remains is compute (FLOPs follow the active parameters), which matters once a step is compute-bound, as in prefill. That is why MoE deployments spread experts over many GPUs (EP): each GPU then reads only its experts (checked: batch 64 reads every expert)."),
    *question("why does the busiest rank set the step, and what can be done?",
              "Under EP every rank runs its own experts, then all wait in the combine all-to-all. Why is the step as slow as the busiest rank, and what do serving systems do about it?",
              "The combine cannot finish until every rank has sent back its experts' outputs, and the next layer needs them all, so the ranks run in lock-step and the slowest one sets the time: unbalanced routing is never faster than balanced routing (checked: unbalanced routing is never faster than balanced). Training adds an auxiliary load-balancing loss so the router spreads tokens; at serving time DeepSeek-V3's EPLB places extra copies of the hottest experts on other GPUs and splits their tokens, and capacity factors cap the tokens an expert accepts (dropping or re-routing the rest, which changes outputs, so inference engines avoid it)."),
    *summary([
        "A MoE layer routes each token to k of E experts; the router's choices, read with forward hooks on the engine's own model, add up to tokens x k in every step and layer (checked: every layer of every step: sum of loads = tokens x k).",
        "Routing is unbalanced, more so within a step than over a run (checked: single steps are at least as unbalanced as the whole run).",
        "A step hits between k and min(E, T k) experts, all of them once the step is large; the uniform expectation is E (1 - (1 - k/E)^T) (checked: big steps hit every expert).",
        "Memory follows total parameters, FLOPs per token the active ones (checked: active is a small share).",
        "A decode step reads the experts its tokens hit: the active weights at batch 1, the whole model from 64 decodes on the modelled H100 (checked: batch 1 reads the active weights; batch 64 reads every expert).",
        "Expert parallelism moves tokens by a dispatch and a combine all-to-all, whose bytes per rank fall slower than 1/n, and waits for the busiest rank, so unbalanced routing costs time (checked: bytes per rank fall with more ranks; but slower than 1/n; unbalanced routing is never faster than balanced).",
    ]),
    *glossary([
        ("mixture of experts (MoE)", "混合专家", "a layer whose MLP is E experts, k of which run per token, chosen by a router"),
        ("router / gate", "路由器 / 门控", "the linear layer giving each token one logit per expert; its top-k picks the experts"),
        ("active parameters", "激活参数", "the parameters one token computes with: all but the experts it does not go to"),
        ("load imbalance", "负载不均衡", "the hottest expert's tokens over the mean tokens per expert"),
        ("expert parallelism (EP)", "专家并行", "whole experts placed on different GPUs; tokens travel to their experts"),
        ("all-to-all (dispatch / combine)", "全对全通信（分发 / 合并）", "every rank sends a different message to every other rank: tokens to their experts, outputs back"),
    ]),
]
