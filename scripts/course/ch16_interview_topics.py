# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 16: interview topics the earlier chapters leave out, each with a number the learner computes and a check:
speculative decoding beyond n-gram (draft models, Medusa / EAGLE heads, tree verification), FlashAttention-2 and -3
against FlashAttention-1, weight quantization algorithms (GPTQ, AWQ, SmoothQuant, W8A8 / W4A16), and the ways to
shrink the KV cache (MQA, GQA, MLA, sliding windows, cross-layer sharing)."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(16, "Interview topics, computed: decoding and memory", [
        "Price a draft model, Medusa / EAGLE heads and tree verification with the acceptance math, checked against a simulated acceptance run and the modelled H100.",
        "Say what FlashAttention-2 and FlashAttention-3 change over FlashAttention-1 (work partitioning, warp specialisation, FP8) and compute the two numbers behind them: SMs kept busy by the grid, and the exponential's share of a tile's time.",
        "Compare weight quantization schemes (GPTQ, AWQ, SmoothQuant's W8A8, W4A16) by their bytes and their error, with GPTQ and SmoothQuant run as small toys.",
        "Compute the KV bytes per token of GQA, MQA, MLA, a sliding window and cross-layer sharing from published configs, and what each buys in concurrent long requests.",
    ], ["Leviathan et al., *Fast Inference from Transformers via Speculative Decoding*, ICML 2023",
        "Cai et al., *Medusa*, ICML 2024; Li et al., *EAGLE*, ICML 2024",
        "Dao et al., *FlashAttention*, NeurIPS 2022; Dao, *FlashAttention-2*, ICLR 2024; Shah et al., *FlashAttention-3*, NeurIPS 2024",
        "Frantar et al., *GPTQ*, ICLR 2023; Lin et al., *AWQ*, MLSys 2024; Xiao et al., *SmoothQuant*, ICML 2023",
        "Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need*, 2019; Ainslie et al., *GQA*, EMNLP 2023; DeepSeek-AI, *DeepSeek-V2*, 2024; Brandon et al., *Reducing Transformer Key-Value Cache Size with Cross-Layer Attention*, 2024",
        "minengine `core/spec_decode.py`, `timing/cost_model.py`, `timing/model_shape.py`"]),
    code(SETUP + """\
import math
import random

import torch

from minengine.timing import LLAMA_3_8B, StepCostModel
from minengine.viz.cost_figures import roofline_figure
"""),
    md("""
    ## Speculative decoding beyond n-gram: draft models, heads and trees
    Chapter 13 derived the expected tokens of one verify step, `(1 - α^(k+1)) / (1 - α)` for `k` proposals each
    accepted with probability `α`, and measured the engine's n-gram proposer. The proposer is the only part that
    changes between the methods interviewers ask about; the verify step is the same:
    - a **draft model** (a small model of the same tokenizer) runs `k` steps to propose; each costs `c` of a target
      step, so a round costs `k c + 1` target steps and the expected speed-up is the expected tokens over that
      (Leviathan et al., ICML 2023, theorem 3.8);
    - **Medusa** heads (Cai et al., ICML 2024) are extra output heads on the target's last hidden state, head `i`
      guessing the token `i + 1` ahead, and **EAGLE** (Li et al., ICML 2024) is a one-layer draft that runs on the
      target's own features: both cost almost nothing to run, so `c` is near zero;
    - both propose a **tree**: several candidates per position, every path verified in one forward pass with a tree
      attention mask, the longest path the target agrees with accepted.

    With `w` independent candidates per position, a position fails only when all `w` are wrong, so the chain formula
    holds with `1 - (1 - α)^w` in place of `α`; the tree costs `w + w² + ... + w^k` verified tokens. Simulate both:
    """),
    code("""
    def expected_tokens(alpha, k):
        \"\"\"Tokens one verify step yields: accepted proposals plus the target's own token.\"\"\"
        return (1 - alpha ** (k + 1)) / (1 - alpha)


    def simulate(alpha, k, width, rounds, rng):
        \"\"\"Mean tokens per verify step: at each depth `width` candidates, each right with probability alpha.\"\"\"
        total = 0
        for _ in range(rounds):
            depth = 0
            while depth < k and any(rng.random() < alpha for _ in range(width)):
                depth += 1
            total += depth + 1  # the target's token after the last accepted one
        return total / rounds


    ALPHA, K, WIDTH, C_DRAFT = 0.6, 4, 2, 0.05
    ROUNDS = pick(40_000, 10_000)
    rng = random.Random(0)
    chain_sim, tree_sim = simulate(ALPHA, K, 1, ROUNDS, rng), simulate(ALPHA, K, WIDTH, ROUNDS, rng)
    alpha_tree = 1 - (1 - ALPHA) ** WIDTH
    chain_formula, tree_formula = expected_tokens(ALPHA, K), expected_tokens(alpha_tree, K)
    tree_nodes = sum(WIDTH ** d for d in range(1, K + 1))
    print(f"chain: simulated {chain_sim:.3f}, formula {chain_formula:.3f} tokens per verify, {K} proposals verified")
    print(f"tree (width {WIDTH}): simulated {tree_sim:.3f}, formula {tree_formula:.3f}, {tree_nodes} proposals verified")
    """),
    md("""
    What does the tree cost? A verify step of `1 + proposals` tokens on the modelled H100 (Llama-3-8B, 1,000 tokens of
    context), at batch 1, where a decode reads the weights and computes little, and at batch 64; and the draft model's
    speed-up for each `k` at `c` = `C_DRAFT`. (The engine's own verify step, with n-gram proposals, is measured in
    chapter 13; a draft model or heads would fill the same slots of the step.)
    """),
    code("""
    cm = StepCostModel("h100", LLAMA_3_8B)


    def tokens_per_ms(batch, proposals, tokens_per_verify):
        return batch * tokens_per_verify / (cm.cost([(1 + proposals, 1000, 1)] * batch).time_s * 1e3)


    rate = {b: {"no speculation": tokens_per_ms(b, 0, 1.0), "chain": tokens_per_ms(b, K, chain_formula),
                "tree": tokens_per_ms(b, tree_nodes, tree_formula)} for b in (1, 64)}
    for b, r in rate.items():
        print(f"batch {b:3d}: " + ", ".join(f"{name} {v:.2f} tok/ms" for name, v in r.items()))
    speedup = {k: expected_tokens(ALPHA, k) / (k * C_DRAFT + 1) for k in range(1, 13)}
    best_k = max(speedup, key=speedup.get)
    print("draft model speed-up by k:", {k: round(s, 2) for k, s in speedup.items()}, "| best k:", best_k)
    verify_steps = {f"{name}, batch {b}": cm.cost([(1 + proposals, 1000, 1)] * b)
                    for b in (1, 64) for name, proposals in (("decode", 0), ("chain", K), ("tree", tree_nodes))}
    roofline_figure(cm, verify_steps, title=f"Verify steps on the roofline ({cm.label}): the tree's extra tokens move a step toward the compute roof").show()
    """),
    conclusion("""
    b1, b64 = rate[1], rate[64]
    side = "below" if b64["tree"] < b64["chain"] else "at or above"
    conclude(f"The simulation gives **{chain_sim:.2f}** tokens per verify for the chain (formula {chain_formula:.2f}) and **{tree_sim:.2f}** "
             f"for a width-{WIDTH} tree (formula {tree_formula:.2f}), at α = {ALPHA}, k = {K}. The tree verifies {tree_nodes} proposals "
             f"instead of {K}: at batch 1 that is nearly free on the modelled H100 ({b1['tree']:.2f} tokens per ms against the chain's "
             f"{b1['chain']:.2f} and plain decoding's {b1['no speculation']:.2f}), at batch 64 the extra tokens cost compute and the tree "
             f"falls {side} the chain ({b64['tree']:.1f} against {b64['chain']:.1f}). A draft model at c = {C_DRAFT} peaks at k = {best_k} "
             f"with a {speedup[best_k]:.2f}x speed-up.",
             [("the chain simulation matches the formula within 2 %", abs(chain_sim / chain_formula - 1) < 0.02),
              ("the tree simulation matches the formula within 2 %", abs(tree_sim / tree_formula - 1) < 0.02),
              ("at batch 1 the tree beats the chain, which beats no speculation", b1["tree"] > b1["chain"] > b1["no speculation"]),
              ("at batch 1 the tree's verify step is within 10 % of a plain decode step", verify_steps["tree, batch 1"].time_s < 1.1 * verify_steps["decode, batch 1"].time_s),
              ("the tree's lead over the chain shrinks at batch 64", b64["tree"] / b64["chain"] < b1["tree"] / b1["chain"]),
              ("the stated side", (b64["tree"] < b64["chain"]) == (side == "below")),
              ("the best k is inside the range tried", 1 < best_k < 12)])
    """),
    *exercise(1, """
    Write `draft_speedup(alpha, k, c)`: the expected speed-up of speculative decoding with a draft model, over plain
    decoding, when each of the `k` proposals is accepted with probability `alpha` and one draft step costs `c` of a
    target step (Leviathan et al., theorem 3.8). Checked on several `(alpha, k, c)`.
    """, "Tokens per round: accepted proposals plus the target's own token. Time per round: k draft steps plus one verify.",
        "draft_speedup",
        """
    def draft_speedup(alpha, k, c):
        return (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + 1)
    """,
        """
    CASES = [((a, k, c), expected_tokens(a, k) / (k * c + 1)) for a in (0.5, 0.8, 0.9) for k in (1, 4, 7) for c in (0.0, 0.05, 0.2)]
    check_function("draft_speedup", draft_speedup, CASES, hint="A round yields (1 - α^(k+1)) / (1 - α) tokens and costs k c + 1 target steps.", rel_tol=1e-9)
    """,
        wrong=[
            "draft_speedup = lambda alpha, k, c: (1 - alpha ** k) / (1 - alpha) / (k * c + 1)  # off by one: the target's token forgotten",
            "draft_speedup = lambda alpha, k, c: (1 - alpha ** (k + 1)) / (1 - alpha)  # the draft's cost forgotten",
            "draft_speedup = lambda alpha, k, c: (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + 1) if c == 0 else (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c)  # the verify step forgotten when c > 0",
        ]),
    *question("why does a tree pay at batch 1 and not at batch 64?",
              "The tree verifies many more proposals than the chain. Why is that almost free for one request and not for a full batch?",
              "At batch 1 a decode step reads all the weights to compute one token: the GPU is memory-bound and has compute to spare, so verifying more tokens in the same pass barely lengthens it (checked: at batch 1 the tree's verify step is within 10 % of a plain decode step). At batch 64 the step already computes many tokens per weight read; multiplying its tokens by the tree's size pushes it toward the compute roof, where time grows with tokens (checked: the tree's lead over the chain shrinks at batch 64). This is why vLLM and SGLang shrink or switch off speculation at large batches."),
    md("""
    ## FlashAttention-2 and FlashAttention-3: what each changes over FlashAttention-1
    FlashAttention (Dao et al., NeurIPS 2022) tiles attention so the score matrix never leaves on-chip memory
    (chapter 11 runs its online softmax). Each later version keeps that algorithm and changes how the GPU runs it:
    - **FlashAttention-2** (Dao, ICLR 2024): fewer non-matmul operations (the output is rescaled once at the end of a
      row's loop, not at every key block); the grid is split over the **sequence** as well as batch and heads, so a
      long prompt at small batch still fills the GPU; and within a thread block the warps split the queries, not the
      keys, so they need not exchange partial results through shared memory.
    - **FlashAttention-3** (Shah et al., NeurIPS 2024) is written for Hopper: **warp specialisation** (producer warps
      only issue TMA loads, consumer warps only run the tensor-core GEMMs, through a circular buffer), **ping-pong**
      scheduling so one warpgroup's softmax runs while another's GEMM does, and **FP8** with per-block scales and a
      random Hadamard transform ("incoherent processing") that spreads outliers before rounding.

    Two numbers are behind those changes. First the grid: FlashAttention-1 launches one thread block per (batch, head),
    FlashAttention-2 one per (batch, head, query block) (Dao, ICLR 2024, section 3.2). A prefill of `SEQ` tokens at
    batch 1 with Llama-3-8B's 32 heads on an H100's 132 SMs (source: NVIDIA H100 Tensor Core GPU Architecture
    whitepaper), blocks scheduled in waves, every query block taking one unit of time:
    """),
    code("""
    SMS, HEADS, SEQ, BLOCK_M = 132, 32, 8192, 128


    def makespan(block_times, sms):
        \"\"\"Time to run thread blocks on `sms` SMs, each block to the SM that frees first (a toy of the GPU's block scheduler).\"\"\"
        free_at = [0.0] * sms
        for t in block_times:
            i = free_at.index(min(free_at))
            free_at[i] += t
        return max(free_at)


    q_blocks = SEQ // BLOCK_M
    fa1 = makespan([q_blocks] * HEADS, SMS)        # one block per head loops over all its query blocks
    fa2 = makespan([1] * (HEADS * q_blocks), SMS)  # one block per (head, query block)
    busy1, busy2 = HEADS * q_blocks / (fa1 * SMS), HEADS * q_blocks / (fa2 * SMS)
    print(f"FA1 grid {HEADS} blocks: {fa1:.0f} units, SMs busy {busy1:.0%} | FA2 grid {HEADS * q_blocks} blocks: {fa2:.0f} units, SMs busy {busy2:.0%}")
    """),
    md("""
    Then the exponential. Per score, the two GEMMs of a tile do `4 d` FLOPs (`QKᵀ` and `PV`, `2 d` each) and the
    softmax one exponential. An H100 SXM5 does 989 TFLOPS of FP16 matmul but only 3.9 TFLOPS of special functions such
    as the exponential (Shah et al., NeurIPS 2024, section 3.2). If the two ran one after the other:
    """),
    code("""
    MATMUL_FP16, MATMUL_FP8, EXP = 989e12, 1979e12, 3.9e12  # FLOP/s (Shah et al., section 3.2; NVIDIA H100 datasheet for FP8)
    HEAD_DIM = 128
    exp_share = {name: (1 / EXP) / (4 * HEAD_DIM / peak) for name, peak in (("FP16", MATMUL_FP16), ("FP8", MATMUL_FP8))}
    print({name: f"exp time = {s:.0%} of the GEMM time" for name, s in exp_share.items()})
    """),
    conclusion("""
    conclude(f"At batch 1 with {HEADS} heads, FlashAttention-1's grid keeps **{busy1:.0%}** of the {SMS} SMs busy and FlashAttention-2's "
             f"**{busy2:.0%}**, so the same work finishes **{fa1 / fa2:.1f}x** sooner in this toy. And per score the exponential takes "
             f"**{exp_share['FP16']:.0%}** of the GEMMs' time in FP16 and **{exp_share['FP8']:.0%}** in FP8, where the GEMMs are twice as fast and the "
             "exponential is not: run one after the other, the tensor cores would idle that long, which is what FlashAttention-3's ping-pong "
             "and warp specialisation hide.",
             [("FA1's grid leaves most SMs idle", busy1 < 0.5),
              ("FA2's grid keeps nearly all busy", busy2 > 0.9),
              ("FA2 finishes sooner", fa2 < fa1),
              ("the exponential is about half the FP16 GEMM time (the paper's 50 %)", 0.45 < exp_share["FP16"] < 0.55),
              ("FP8 makes it worse", exp_share["FP8"] > exp_share["FP16"])])
    """),
    *exercise(2, """
    Write `sm_busy(num_blocks, sms)`: the fraction of SM time kept busy when `num_blocks` equal thread blocks run in
    waves on `sms` SMs (every wave but the last full). Checked against the toy scheduler above on small and large grids.
    """, "Count the waves: the last may be partly empty. Busy time is one unit per block; the SMs are held for every wave.",
        "sm_busy",
        """
    def sm_busy(num_blocks, sms):
        return num_blocks / (math.ceil(num_blocks / sms) * sms)
    """,
        """
    CASES = [((n, s), n / (makespan([1] * n, s) * s)) for n, s in ((32, 132), (132, 132), (133, 132), (2048, 132), (300, 108), (7, 8))]
    check_function("sm_busy", sm_busy, CASES, hint="Waves = ceil(blocks / SMs).", rel_tol=1e-9)
    """,
        wrong=[
            "sm_busy = lambda num_blocks, sms: min(1.0, num_blocks / sms)  # right for one wave only",
            "sm_busy = lambda num_blocks, sms: num_blocks / sms / max(1, num_blocks // sms)  # floor: a partial wave not counted",
            "sm_busy = lambda num_blocks, sms: 1.0  # every grid fills the GPU",
        ]),
    md("""
    ## Weight quantization: GPTQ, AWQ, SmoothQuant, W8A8 and W4A16
    A scheme is named by its weight and activation bits: **W4A16** keeps activations in 16 bits and stores 4-bit
    weights with one 16-bit scale per group of weights (a zero point too when asymmetric), dequantized inside the GEMM
    kernel (Marlin in vLLM): it cuts the bytes a memory-bound decode reads. **W8A8** quantizes activations too, so the
    GEMM runs on int8 (or FP8) tensor cores: it cuts compute-bound prefill time. The algorithms choose the rounding:
    - round-to-nearest (**RTN**): each weight to its nearest level; the baseline;
    - **GPTQ** (Frantar et al., ICLR 2023): quantize a layer's input columns one at a time and push each column's
      rounding error onto the columns not yet quantized, weighted by the inverse Hessian `(XᵀX)⁻¹` of calibration
      inputs `X`, so the layer's *output* error is minimised, not the weights';
    - **AWQ** (Lin et al., MLSys 2024): a few input channels see large activations, and their weights matter most;
      scale those weights up (and the activations down) before rounding, so they lose less; no error feedback;
    - **SmoothQuant** (Xiao et al., ICML 2023): for W8A8 the activations' outlier channels ruin a per-tensor int8 scale;
      divide channel `j` of the activations by `s_j = max|X_j|^α / max|W_j|^(1-α)` and multiply the weights' row by it,
      moving the difficulty from activations to weights.

    Bytes first: Llama-3-8B's decoder layers quantized, the embedding and LM head kept in bf16, one fp16 scale per
    group (per output channel for W8A8):
    """),
    code("""
    s = LLAMA_3_8B
    layer, rest = s.num_layer_params, s.num_params - s.num_layer_params
    GROUP = 128
    scheme_bits = {"bf16": 16, "W8A8 (per-channel scale)": 8 + 16 / s.hidden_size, "W4A16 g128": 4 + 16 / GROUP,
                   "W4A16 g128 + zero point (AWQ)": 4 + (16 + 4) / GROUP}
    scheme_gib = {name: (layer * bits / 8 + rest * 2) / 2**30 for name, bits in scheme_bits.items()}
    for name, gib in scheme_gib.items():
        print(f"{name:32s} {scheme_bits[name]:6.3f} bits per layer weight -> {gib:5.2f} GiB, decode at batch 1 reads it in "
              f"{gib * 2**30 / 3.35e12 * 1e3:.2f} ms at full HBM bandwidth")
    """),
    md("""
    Then the error, on toys the size of one small layer. GPTQ against RTN at 4 bits, same scales, the error measured on
    the layer's output for held-out inputs; then SmoothQuant's smoothing against plain per-tensor W8A8 on activations
    with a few outlier channels (as Xiao et al. observed in large models):
    """),
    code("""
    torch.manual_seed(0)
    D_IN, D_OUT, N_CAL = 128, 64, 512
    mix = torch.randn(D_IN, D_IN, dtype=torch.float64) / D_IN ** 0.5
    X_cal = torch.randn(N_CAL, D_IN, dtype=torch.float64) @ (torch.eye(D_IN, dtype=torch.float64) + mix)  # correlated inputs
    X_test = torch.randn(N_CAL, D_IN, dtype=torch.float64) @ (torch.eye(D_IN, dtype=torch.float64) + mix)
    W = torch.randn(D_OUT, D_IN, dtype=torch.float64)
    scale = W.abs().amax(dim=1, keepdim=True) / 7  # symmetric 4-bit, one scale per output row


    def rtn(w):
        return torch.clamp(torch.round(w / scale), -8, 7) * scale


    def gptq(w, x, damp=0.01):
        \"\"\"GPTQ's column loop (Frantar et al., algorithm 1, one block): quantize column j, spread its error over columns > j.\"\"\"
        w = w.clone()
        h = x.T @ x
        h += damp * h.diag().mean() * torch.eye(len(h), dtype=h.dtype)
        hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
        q = torch.zeros_like(w)
        for j in range(w.shape[1]):
            q[:, j] = rtn(w)[:, j]
            err = (w[:, j] - q[:, j]) / hinv[j, j]
            w[:, j + 1:] -= err[:, None] * hinv[j, j + 1:][None, :]
        return q


    def out_err(q, x):
        return ((x @ (W - q).T).norm() / (x @ W.T).norm()).item()


    err_rtn, err_gptq = out_err(rtn(W), X_test), out_err(gptq(W, X_cal), X_test)
    X_act = torch.randn(N_CAL, D_IN, dtype=torch.float64)
    X_act[:, :4] *= 50  # four outlier channels


    def int8(t):
        return torch.round(t / (t.abs().max() / 127)) * (t.abs().max() / 127)


    def w8a8_err(x, w):
        return ((int8(x) @ int8(w).T - x @ w.T).norm() / (x @ w.T).norm()).item()


    smooth = (X_act.abs().amax(0) ** 0.5 / W.abs().amax(0) ** 0.5)  # SmoothQuant's s_j at alpha = 0.5
    err_plain, err_smooth = w8a8_err(X_act, W), w8a8_err(X_act / smooth, W * smooth)
    print(f"W4 output error: RTN {err_rtn:.4f}, GPTQ {err_gptq:.4f} | W8A8 output error: per-tensor {err_plain:.4f}, smoothed {err_smooth:.4f}")
    """),
    conclusion("""
    bf16, w4 = scheme_gib["bf16"], scheme_gib["W4A16 g128"]
    conclude(f"Llama-3-8B's weights take **{bf16:.2f} GiB** in bf16 and **{w4:.2f} GiB** as W4A16 with group 128 (the scales add "
             f"{16 / GROUP:.3f} bits per weight; the embedding and LM head, kept in bf16, are **{rest * 2 / 2**30 / w4:.0%}** of what is left): a batch-1 decode reads "
             f"{bf16 / w4:.1f}x fewer bytes. On the toys, GPTQ's error feedback cuts the 4-bit layer's output error from {err_rtn:.4f} to "
             f"**{err_gptq:.4f}** ({1 - err_gptq / err_rtn:.0%} less) with the same scales, and smoothing cuts W8A8's error from "
             f"{err_plain:.4f} to **{err_smooth:.4f}** when four activation channels are outliers.",
             [("W4A16 is under 40 % of bf16", w4 < 0.4 * bf16),
              ("every quantized scheme is smaller than bf16", all(v < bf16 for k, v in scheme_gib.items() if k != "bf16")),
              ("the zero point costs bytes", scheme_gib["W4A16 g128 + zero point (AWQ)"] > w4),
              ("GPTQ beats RTN on held-out inputs", err_gptq < err_rtn),
              ("smoothing beats plain per-tensor W8A8", err_smooth < err_plain)])
    """),
    *exercise(3, """
    Write `quantized_bytes(params, bits, group_size)`: the bytes of `params` weights stored with `bits` bits each and
    one fp16 scale per `group_size` weights. Checked on Llama-3-8B's layer weights and other sizes at 4 and 8 bits.
    """, "Bits are not bytes; the scales are 2 bytes each, one per group.",
        "quantized_bytes",
        """
    def quantized_bytes(params, bits, group_size):
        return params * bits / 8 + params / group_size * 2
    """,
        """
    CASES = [((p, b, g), p * (b + 16 / g) / 8) for p in (layer, 1e9, 4096 * 4096) for b, g in ((4, 128), (4, 32), (8, 4096))]
    check_function("quantized_bytes", quantized_bytes, CASES, hint="params x bits / 8, plus 2 bytes per group.", rel_tol=1e-9)
    """,
        wrong=[
            "quantized_bytes = lambda params, bits, group_size: params * bits / 8  # scales forgotten",
            "quantized_bytes = lambda params, bits, group_size: params * bits + params / group_size * 2  # bits counted as bytes",
            "quantized_bytes = lambda params, bits, group_size: params * bits / 8 + params / group_size * 16  # the scale counted in bits",
        ]),
    md("""
    ## Shrinking the KV cache: MQA, GQA, MLA, windows and cross-layer sharing
    Chapter 02 computed the bytes per token of MHA, GQA, MQA and MLA. Here the question an interviewer asks next: how
    many long requests fit? Per token and layer the cache holds K and V for each KV head (MHA: every head; **GQA**
    (Ainslie et al., EMNLP 2023): a few; **MQA** (Shazeer, 2019): one); **MLA** (DeepSeek-AI, DeepSeek-V2, 2024)
    holds one latent of `kv_lora_rank` plus a RoPE key of `qk_rope_head_dim`, shared by K, V and every head; a
    **sliding window** keeps only the last `w` tokens; **cross-layer attention** (Brandon et al., 2024) lets two
    adjacent layers share one K/V. The shapes are the models' published `config.json` values (source: Hugging Face
    config.json of meta-llama/Meta-Llama-3-8B, tiiuae/falcon-7b, mistralai/Mistral-7B-v0.1, deepseek-ai/DeepSeek-V2),
    bf16, for requests of `LONG` tokens in a KV pool of `POOL_GIB`:
    """),
    code("""
    BF16, LONG, POOL_GIB = 2, 32768, 40


    def kv_per_token(layers, kv_heads, head_dim, dtype_bytes=BF16, layers_per_kv=1):
        \"\"\"K and V of every KV head; one K/V for every `layers_per_kv` layers (cross-layer sharing).\"\"\"
        return 2 * (layers // layers_per_kv) * kv_heads * head_dim * dtype_bytes


    DESIGNS = {  # name: (bytes per token, tokens kept of a LONG request)
        "Llama-3-8B as MHA (32 KV heads)": (kv_per_token(32, 32, 128), LONG),
        "Llama-3-8B, GQA (8 KV heads)": (kv_per_token(LLAMA_3_8B.num_layers, LLAMA_3_8B.num_kv_heads, LLAMA_3_8B.head_dim), LONG),
        "Llama-3-8B, GQA + CLA-2": (kv_per_token(32, 8, 128, layers_per_kv=2), LONG),
        "Falcon-7B, MQA (1 KV head of 64)": (kv_per_token(32, 1, 64), LONG),
        "Mistral-7B-v0.1, GQA + window 4096": (kv_per_token(32, 8, 128), min(LONG, 4096)),
        "DeepSeek-V2, MLA (60 layers, 512 + 64)": (60 * (512 + 64) * BF16, LONG),
    }
    fits = {name: int(POOL_GIB * 2**30 // (per_tok * kept)) for name, (per_tok, kept) in DESIGNS.items()}
    for name, (per_tok, kept) in DESIGNS.items():
        print(f"{name:40s} {per_tok / 1024:7.1f} KiB per token | a {LONG}-token request holds {per_tok * kept / 2**30:6.2f} GiB | {fits[name]:4d} fit in {POOL_GIB} GiB")
    mla_mha_equiv = 60 * 2 * 128 * 128 * BF16  # DeepSeek-V2's 128 heads of 128 as plain MHA (without the RoPE part)
    print(f"DeepSeek-V2 as MHA would cache {mla_mha_equiv / 1024:.0f} KiB per token: MLA holds 1/{mla_mha_equiv / DESIGNS['DeepSeek-V2, MLA (60 layers, 512 + 64)'][0]:.0f} of it")
    """),
    conclusion("""
    gqa, mha = fits["Llama-3-8B, GQA (8 KV heads)"], fits["Llama-3-8B as MHA (32 KV heads)"]
    cla, mla = fits["Llama-3-8B, GQA + CLA-2"], fits["DeepSeek-V2, MLA (60 layers, 512 + 64)"]
    ratio = mla_mha_equiv / DESIGNS["DeepSeek-V2, MLA (60 layers, 512 + 64)"][0]
    conclude(f"In {POOL_GIB} GiB, **{gqa}** requests of {LONG} tokens fit with Llama-3-8B's GQA, {mha} as MHA, {cla} with cross-layer sharing "
             f"on top and {fits['Falcon-7B, MQA (1 KV head of 64)']} with Falcon-7B's MQA (one KV head of 64); DeepSeek-V2's MLA fits **{mla}** though it has {60} layers: its latent is **{ratio:.0f}x** smaller than its heads' K and V "
             f"would be. A window bounds the tokens instead of their size: Mistral-7B fits {fits['Mistral-7B-v0.1, GQA + window 4096']}, "
             "whatever the requests' length beyond the window.",
             [("GQA's token is a quarter of MHA's (8 KV heads of 32)", 4 * DESIGNS["Llama-3-8B, GQA (8 KV heads)"][0] == DESIGNS["Llama-3-8B as MHA (32 KV heads)"][0]),
              ("GQA fits more than MHA", gqa > mha),
              ("cross-layer sharing fits about twice GQA", cla >= 2 * gqa),
              ("MLA fits more than GQA", mla > gqa),
              ("the window fits more than the same GQA without it", fits["Mistral-7B-v0.1, GQA + window 4096"] > gqa),
              ("MQA fits the most of the unwindowed designs", fits["Falcon-7B, MQA (1 KV head of 64)"] == max(v for k, v in fits.items() if "window" not in k)),
              ("MLA's ratio against its MHA is above 50", ratio > 50)])
    """),
    *exercise(4, """
    Write `kv_per_token_bytes(layers, kv_heads, head_dim, dtype_bytes, layers_per_kv)`: the KV cache bytes of one
    token, for a model whose K/V is shared by every `layers_per_kv` adjacent layers (1: no sharing). Checked on
    Llama-3-8B, Falcon-7B and Llama-2-7B shapes, in bf16 and fp8, with and without sharing.
    """, "Both K and V; KV heads, not query heads; one K/V per group of layers.",
        "kv_per_token_bytes",
        """
    def kv_per_token_bytes(layers, kv_heads, head_dim, dtype_bytes, layers_per_kv):
        return 2 * (layers // layers_per_kv) * kv_heads * head_dim * dtype_bytes
    """,
        """
    CASES = [((l, h, d, b, c), kv_per_token(l, h, d, b, c)) for l, h, d in ((32, 8, 128), (32, 1, 64), (32, 32, 128)) for b in (2, 1) for c in (1, 2)]
    check_function("kv_per_token_bytes", kv_per_token_bytes, CASES, hint="2 x (layers / layers_per_kv) x kv_heads x head_dim x bytes.")
    """,
        wrong=[
            "kv_per_token_bytes = lambda layers, kv_heads, head_dim, dtype_bytes, layers_per_kv: (layers // layers_per_kv) * kv_heads * head_dim * dtype_bytes  # K only",
            "kv_per_token_bytes = lambda layers, kv_heads, head_dim, dtype_bytes, layers_per_kv: 2 * layers * layers_per_kv * kv_heads * head_dim * dtype_bytes  # sharing multiplies",
            "kv_per_token_bytes = lambda layers, kv_heads, head_dim, dtype_bytes, layers_per_kv: 2 * (layers // layers_per_kv) * kv_heads * head_dim * 2  # always 2 bytes",
        ]),
    md("""
    Try other draft settings (the acceptance math only):
    """),
    code("""
    import ipywidgets as widgets


    def draft_round(alpha=0.7, k=4, c=0.05, width=1):
        a = 1 - (1 - alpha) ** width
        print(f"per position {a:.3f} | tokens per verify {expected_tokens(a, k):.2f} | proposals verified {sum(width ** d for d in range(1, k + 1))} "
              f"| draft-model speed-up {expected_tokens(a, k) / (k * c + 1):.2f}x")


    widgets.interact_manual(draft_round, alpha=widgets.FloatSlider(value=0.7, min=0.05, max=0.95, step=0.05), k=widgets.IntSlider(value=4, min=1, max=10),
                            c=widgets.FloatSlider(value=0.05, min=0.0, max=0.5, step=0.01), width=widgets.IntSlider(value=1, min=1, max=4))
    """),
    *question("why does MLA not make decode's attention cheaper in bytes only?",
              "MLA caches a latent of `kv_lora_rank + qk_rope_head_dim` per token and layer. At decode, what must the kernel do with it, and why does DeepSeek 'absorb' the up-projection into the query?",
              "Without absorption every head's K and V would be rebuilt from the latent for every cached token at every step: the bytes read shrink (checked: MLA's ratio against its MHA is above 50) but the FLOPs grow with the context (source: DeepSeek-AI, *DeepSeek-V2*, 2024, section 2.1.2, on absorbing the up-projections). Absorbing the K up-projection into the query (and the V up-projection into the output projection) lets all heads attend directly to the shared latent, like MQA with a head of `kv_lora_rank + qk_rope_head_dim`: one read of the latent serves every head, so decode stays memory-bound on the small cache."),
    *summary([
        "Draft models, Medusa / EAGLE heads and trees change only the proposer; expected tokens per verify follow `(1 - α^(k+1)) / (1 - α)`, with `1 - (1 - α)^w` per position for a width-w tree, as the simulation confirms; trees pay at small batches (checked: the chain simulation matches the formula within 2 %; the tree simulation matches the formula within 2 %; at batch 1 the tree beats the chain, which beats no speculation).",
        "FlashAttention-2 splits the grid over the sequence, keeping the SMs busy at batch 1; FlashAttention-3 overlaps the exponential, about half the GEMM time per tile in FP16, with the GEMMs (checked: FA2's grid keeps nearly all busy; the exponential is about half the FP16 GEMM time (the paper's 50 %)).",
        "W4A16 cuts the bytes decode reads, W8A8 the compute of prefill; GPTQ's error feedback and SmoothQuant's smoothing lower the error at the same bits (checked: W4A16 is under 40 % of bf16; GPTQ beats RTN on held-out inputs; smoothing beats plain per-tensor W8A8).",
        "GQA, MQA, MLA and cross-layer sharing shrink each token's KV, a window the tokens kept; MLA's latent is a small fraction of its heads' K and V (checked: Shrinking the KV cache).",
    ]),
    *glossary([
        ("draft model", "草稿模型", "a small model that proposes k tokens for the target to verify in one pass"),
        ("Medusa / EAGLE heads", "Medusa / EAGLE 头", "cheap extra heads (or a one-layer draft) on the target's own features that propose tokens"),
        ("tree verification", "树形验证", "verifying several candidate continuations in one forward pass with a tree attention mask"),
        ("warp specialisation", "warp 专用化", "some warps only load data (TMA), others only compute (tensor cores), overlapping the two"),
        ("W4A16 / W8A8", "W4A16 / W8A8", "weight bits and activation bits of a quantized GEMM"),
        ("multi-head latent attention (MLA)", "多头潜在注意力", "caches one compressed latent per token and layer; each head's K and V are rebuilt from it"),
        ("cross-layer attention (CLA)", "跨层注意力", "adjacent layers share one K/V, dividing the KV cache by the sharing factor"),
    ]),
]
