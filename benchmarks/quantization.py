"""What fp8 KV and int8 weights cost in quality and buy in memory and (modelled) time, in one run.

Issue 19, part 2. On the bundled tiny Shakespeare Llama, through the real engine (its attention paths read the
FP8 cache; its linear layers run int8 weights):

1. perplexity on the held-out split (the last 10 % of Tiny Shakespeare's characters, the bundled model's own
   validation split, never trained on) in non-overlapping windows, from the engine's prompt logprobs, for float32,
   fp8 KV (scales 1.0, vLLM's default), fp8 KV with scales calibrated on the training split (amax / 448), int8
   weights (whole-window steps: the dequantizing reference path; and in 16-token steps: the packed kernel that
   decodes take), and fp8 KV + int8; bfloat16 as the 2-byte reference;
2. greedy agreement with float32 over ``--prompts`` prompts from the held-out split: the fraction of output
   positions with the same token, the first position that differs (the output length when none does) and how
   many outputs are identical;
3. KV blocks in a fixed ``--budget-mib`` budget (``kv_cache_memory_bytes``) for each KV dtype, from the engines;
   and for Llama-3-8B on one H100 (80 GB x 0.9), the blocks left after the weights;
4. the modelled decode step on an H100 for Llama-3-8B (``StepCostModel``; fp8 KV = 1 byte per KV element, int8
   weights = 1 byte per decoder weight with 16-bit activations) at 1 and ``--batch`` decodes of ``--context``
   tokens;
5. the int8 matmul kernels on this CPU (torch threads 1, median of repeats): ``torch._weight_int8pack_mm`` vs
   dequantize-then-matmul vs the float matmul, for the bundled model's widest layer, which sets
   ``layers/quantization.py``'s choice (``int8_linear``: the packed kernel, float32 through bfloat16, for decodes);
6. decode speed on a real-shaped model, SmolLM-135M's (a random-weight Llama built from its config with
   ``save_pretrained``: hidden 576, 30 layers, 9 query / 3 KV heads, intermediate 1536, vocabulary 49,152, tied
   embeddings; no download), float32 against int8 weights in the same run: one stream, a ``--decode-prompt-len``
   prompt, ``--decode-tokens`` decode steps, torch threads 1, a warm-up, then the engines taken in turn
   ``--decode-repeats`` times; the median of the per-step wall and CPU time (``time.process_time``: on a shared
   machine wall time also counts other processes' turns on the core), with the load average, and beside it the
   perplexity of the same two engines on held-out windows in steps of 16 tokens, so int8's goes through the
   packed kernel its decodes take (random weights: it checks that int8 changes the numbers little, not that the
   model is good).

    python benchmarks/quantization.py --write        # ~5-10 minutes on 2 shared cores
Prints Markdown; ``--write`` also writes ``benchmarks/results/quantization.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.throughput import machine_info  # noqa: E402
from minengine import LLM, SamplingParams  # noqa: E402
from minengine.config import BUNDLED_MODEL  # noqa: E402
from minengine.layers import kv_quant  # noqa: E402
from minengine.layers import quantization as q8  # noqa: E402
from minengine.models.loader import load_tokenizer  # noqa: E402
from minengine.timing import LLAMA_3_8B, StepCostModel  # noqa: E402
from minengine.timing.capacity import memory_fit  # noqa: E402
from minengine.timing.clocks import shape_for_engine  # noqa: E402
from minengine.workloads import find_data_dir  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# SmolLM-135M's config (HuggingFaceTB/SmolLM-135M), the real-shaped model of section 6; its weights are random.
SMOLLM_135M_SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True,
                     "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
DECODE_MODES = {"float32": {}, "int8 weights": {"quantization": "int8"}}
# name -> (EngineConfig settings, calibrated KV scales?)
MODES = {
    "float32": ({}, False),
    "bfloat16": ({"dtype": "bfloat16"}, False),
    "fp8 KV": ({"kv_cache_dtype": "fp8"}, False),
    "fp8 KV, calibrated scales": ({"kv_cache_dtype": "fp8"}, True),
    "int8 weights": ({"quantization": "int8"}, False),
    # Steps of at most INT8PACK_MAX_ROWS tokens: the prompt logprobs then come from the packed int8 kernel, the
    # path decodes take (prefill steps of more rows take the dequantizing reference, as the row above).
    "int8 weights, 16-token steps (packed kernel)": (
        {"quantization": "int8", "max_num_batched_tokens": q8.INT8PACK_MAX_ROWS}, False),
    "fp8 KV + int8 weights": ({"kv_cache_dtype": "fp8", "quantization": "int8"}, False),
}


def splits(tokenizer, data_dir: Path | None) -> tuple[list[int], list[int]]:
    """(training-split ids, held-out ids): the first 90 % / last 10 % of the text's characters, as
    ``scripts/train_tiny_model.py`` split them."""
    path = (data_dir or Path()) / "text" / "tinyshakespeare.txt"
    if data_dir is None or not path.is_file():
        raise SystemExit(f"Tiny Shakespeare not found (looked for {path}); set MINENGINE_DATA or --data")
    text = path.read_text()
    cut = int(len(text) * 0.9)
    return tokenizer(text[:cut])["input_ids"], tokenizer(text[cut:])["input_ids"]


def windows(ids: list[int], length: int, count: int | None) -> list[list[int]]:
    """Non-overlapping windows of ``length`` tokens from the start (``count`` of them, None = all that fit)."""
    out = [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)]
    return out if count is None else out[:count]


def engine(settings: dict, num_blocks: int | None = None) -> LLM:
    extra = {"num_kv_blocks": num_blocks} if num_blocks else {}
    return LLM(BUNDLED_MODEL, max_model_len=1024, **settings, **extra)


def kv_amax(llm: LLM) -> tuple[list[tuple[float, float]], float]:
    """Per layer (max |K|, max |V|) over everything the engine's cache holds, and the fraction of its nonzero
    elements below 2^-6 (e4m3's subnormal range at scale 1)."""
    amax, small, nonzero = [], 0, 0
    for k, v in llm.llm_engine.runner.kv_caches:
        amax.append((k.float().abs().max().item(), v.float().abs().max().item()))
        for t in (k.float().abs(), v.float().abs()):
            nz = t[t > 0]
            small += int((nz < 2.0 ** -6).sum())
            nonzero += nz.numel()
    return amax, small / max(nonzero, 1)


def perplexity(llm: LLM, wins: list[list[int]]) -> float:
    """exp(mean negative log-likelihood) of every window token after the first, from prompt logprobs."""
    outs = llm.generate([{"prompt_token_ids": w} for w in wins], SamplingParams(max_tokens=1, prompt_logprobs=0),
                        use_tqdm=False)
    nll, count = 0.0, 0
    for w, o in zip(wins, outs):
        for tok, lp in zip(w[1:], o.prompt_logprobs[1:]):
            nll -= lp[tok].logprob
            count += 1
    return math.exp(nll / count)


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    """Token-level agreement (same token at the same position), first divergence (mean, median; the length when
    none) and identical outputs."""
    same = sum(a == b for r, g in zip(ref, got) for a, b in zip(r, g))
    total = sum(len(r) for r in ref)
    first = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), len(r)) for r, g in zip(ref, got)]
    return {"token_agreement": same / total, "first_divergence_mean": statistics.mean(first),
            "first_divergence_median": statistics.median(first),
            "identical": sum(r == g for r, g in zip(ref, got)), "num_prompts": len(ref)}


def quality(args, train: list[int], held_out: list[int]) -> tuple[list[dict], dict]:
    """Sections 1 and 2: one row per mode, plus the K/V magnitudes the scale choice rests on."""
    eval_wins = windows(held_out, args.window_len, args.windows)
    calib_wins = windows(train, args.window_len, args.calibration_windows)
    # Enough blocks that no window's K/V is overwritten (the free queue hands out unused blocks first): the cache
    # then holds every token's K/V for kv_amax.
    pool = (len(calib_wins) + len(eval_wins)) * (-(-args.window_len // 16) + 1) + 16
    calib = engine({}, pool)
    perplexity(calib, calib_wins)
    calib_amax, _ = kv_amax(calib)
    scales = kv_quant.calibrated_kv_scales(calib_amax)
    step = max(1, (len(held_out) - args.prompt_len) // args.prompts)
    prompts = [held_out[i * step:i * step + args.prompt_len] for i in range(args.prompts)]
    rows, reference, magnitudes = [], None, {}
    for name, (settings, calibrated) in MODES.items():
        start = time.perf_counter()
        llm = engine(settings, pool if name == "float32" else None)
        if calibrated:
            kv_quant.set_kv_scales(llm.llm_engine.model, scales)
        ppl = perplexity(llm, eval_wins)
        if name == "float32":
            amax, small = kv_amax(llm)
            magnitudes = {"held_out_k_amax": max(a for a, _ in amax), "held_out_v_amax": max(b for _, b in amax),
                          "fraction_below_2^-6": small, "calibrated_scales": scales}
        out = greedy(llm, prompts, args.max_tokens)
        reference = reference or out
        rows.append({"mode": name, "perplexity": ppl, **agreement(reference, out),
                     "seconds": time.perf_counter() - start})
        print(f"  {name}: perplexity {ppl:.3f} ({rows[-1]['seconds']:.0f} s)", flush=True)
    return rows, magnitudes


def blocks(args) -> list[dict]:
    """Section 3: KV blocks in ``--budget-mib`` for the bundled model (the engines' own count) and in one H100
    for Llama-3-8B (the memory left after the weights, per 16-token block)."""
    budget = args.budget_mib * 2**20
    rows = []
    for dtype, kv in (("float32", "auto"), ("bfloat16", "auto"), ("float32", "fp8"), ("bfloat16", "fp8")):
        e = LLM(BUNDLED_MODEL, dtype=dtype, kv_cache_dtype=kv, kv_cache_memory_bytes=budget).llm_engine
        rows.append({"model": "bundled", "dtype": dtype, "kv_cache_dtype": kv, "quantization": None,
                     "bytes_per_block": e.kv_cache_bytes // e.num_kv_blocks, "num_blocks": e.num_kv_blocks})
    for kv, quant in (("auto", None), ("fp8", None), ("auto", "int8"), ("fp8", "int8")):
        shape = shape_for_engine(LLAMA_3_8B, kv, quant)
        fit = memory_fit("h100", shape)
        per_block = 16 * shape.kv_bytes_per_token
        rows.append({"model": "Llama-3-8B on H100 (x0.9)", "dtype": "bfloat16", "kv_cache_dtype": kv,
                     "quantization": quant, "bytes_per_block": per_block,
                     "num_blocks": int(fit.kv_bytes_per_device // per_block)})
    return rows


def modelled(args) -> list[dict]:
    """Section 4: the modelled decode step of Llama-3-8B on an H100."""
    rows = []
    for kv, quant in (("auto", None), ("fp8", None), ("auto", "int8"), ("fp8", "int8")):
        model = StepCostModel("h100", shape_for_engine(LLAMA_3_8B, kv, quant))
        one = model.cost([(1, args.context - 1, 1)])
        many = model.cost([(1, args.context - 1, 1)] * args.batch)
        rows.append({"kv_cache_dtype": kv, "quantization": quant, "step_ms_batch_1": one.time_s * 1e3,
                     f"step_ms_batch_{args.batch}": many.time_s * 1e3, "weight_gb": many.weight_bytes / 1e9,
                     "kv_gb": many.kv_bytes / 1e9, "bound": many.bound,
                     "tokens_per_s": args.batch / many.time_s})
    return rows


def kernels(args) -> list[dict]:
    """Section 5: ms per call of each int8 matmul way (1 torch thread, median of ``--repeats`` x 10 calls)."""
    torch.set_num_threads(1)
    out_f, in_f = 688, 256  # the bundled model's gate/up projections: its widest linear layers
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_f, in_f, generator=g)
    qweight, scale = q8.quantize_int8(w)
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for m in (1, 4, 16, 32, 128):
            x = torch.randn(m, in_f, generator=g).to(dtype)
            s = scale.to(dtype)
            ways = {"int8pack_ms": lambda x=x, s=s: torch._weight_int8pack_mm(x, qweight, s),
                    "dequantize_ms": lambda x=x, s=s: torch.nn.functional.linear(x, qweight.to(x.dtype)) * s,
                    "float_ms": lambda x=x: torch.nn.functional.linear(x, w.to(x.dtype)),
                    "int8_linear_ms": lambda x=x: q8.int8_linear(x, qweight, scale)}
            row = {"dtype": str(dtype).replace("torch.", ""), "rows": m}
            for name, fn in ways.items():
                fn()
                times = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    for _ in range(10):
                        fn()
                    times.append((time.perf_counter() - t) / 10 * 1e3)
                row[name] = statistics.median(times)
            row["int8_linear_uses"] = "int8pack" if q8.uses_int8pack(x) else "dequantize"
            rows.append(row)
    return rows


def real_shaped_model(out: Path, num_layers: int) -> str:
    """A random-weight Llama with SmolLM-135M's shape (``num_layers`` of its 30 layers), saved in ``out``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**SMOLLM_135M_SHAPE, "num_hidden_layers": num_layers})).save_pretrained(out)
    return str(out)


def weight_bytes_per_decode(llm: LLM) -> int:
    """The bytes of weights a decode step reads: the decoder layers' linear weights (int8 + scales, or float) and
    the LM head (the embedding lookup reads one row and the norms a vector each: left out)."""
    model = llm.llm_engine.model
    layers = sum(t.numel() * t.element_size() for m in model.model.layers.modules()
                 if isinstance(m, (torch.nn.Linear, q8.Int8Linear)) for t in (*m.parameters(False), *m.buffers(False)))
    return layers + model.lm_head.weight.numel() * model.lm_head.weight.element_size()


def linear_parts_ms(llm: LLM, repeats: int) -> tuple[float, float]:
    """(decoder linear layers, LM head): CPU ms of calling them, in the model's order, on one row each as a
    decode does (median of ``repeats``): the part of a decode step that int8 weights change, and one it leaves."""
    model = llm.llm_engine.model
    linears = [m for m in model.model.layers.modules() if isinstance(m, (torch.nn.Linear, q8.Int8Linear))]
    parts = {"decoder": [(m, torch.randn(1, m.in_features)) for m in linears],
             "lm_head": [(model.lm_head, torch.randn(1, model.lm_head.in_features))]}
    out = []
    for calls in parts.values():
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            t = time.process_time()
            with torch.inference_mode():
                for module, x in calls:
                    module(x)
            times.append((time.process_time() - t) * 1e3)
        out.append(statistics.median(times[1:]))
    return out[0], out[1]


def decode_step_ms(llm: LLM, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per decode step of one request alone: its prefill step first (not timed), then
    ``tokens`` decode steps."""
    engine = llm.llm_engine
    engine.add_request(f"decode-{time.monotonic_ns()}", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True))
    engine.step()  # the prefill (and the first token)
    wall, cpu, steps = time.perf_counter(), time.process_time(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return (time.perf_counter() - wall) / steps * 1e3, (time.process_time() - cpu) / steps * 1e3


def decode_speed(args, held_out: list[int]) -> dict:
    """Section 6: per-step decode time and perplexity of float32 and int8 weights on SmolLM-135M's shape."""
    torch.set_num_threads(1)
    prompt = held_out[:args.decode_prompt_len]
    ppl_windows = windows(held_out, args.window_len, args.decode_windows)
    with tempfile.TemporaryDirectory() as tmp:  # the engines are used inside: their weights may map the file
        path = real_shaped_model(Path(tmp), args.decode_layers)
        max_len = max(args.window_len, args.decode_prompt_len + args.decode_tokens + 1)
        # Steps of at most INT8PACK_MAX_ROWS tokens, so the perplexity's prompt logprobs come from the kernel that
        # the timed decodes use (the prompt's prefill, in chunks, is not timed).
        llms = {name: LLM(path, max_model_len=max_len, num_cpu_threads=1,
                          max_num_batched_tokens=q8.INT8PACK_MAX_ROWS, **settings)
                for name, settings in DECODE_MODES.items()}
        load_before = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),)
        for llm in llms.values():
            decode_step_ms(llm, prompt, min(8, args.decode_tokens))  # warm-up
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in llms}
        for _ in range(args.decode_repeats):  # in turn, so a change of load hits both modes alike
            for name, llm in llms.items():
                times[name].append(decode_step_ms(llm, prompt, args.decode_tokens))
        load_after = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),)
        rows = [{"mode": name, "wall_ms": statistics.median(w for w, _ in times[name]),
                 "cpu_ms": statistics.median(c for _, c in times[name]),
                 "weight_mb": weight_bytes_per_decode(llm) / 1e6, "perplexity": perplexity(llm, ppl_windows),
                 **dict(zip(("decoder_linear_ms", "lm_head_ms"), linear_parts_ms(llm, args.decode_repeats)))}
                for name, llm in llms.items()]
    base = rows[0]
    for r in rows:
        r.update(wall_speedup=base["wall_ms"] / r["wall_ms"], cpu_speedup=base["cpu_ms"] / r["cpu_ms"],
                 perplexity_change=r["perplexity"] / base["perplexity"] - 1,
                 bytes_ratio=r["weight_mb"] / base["weight_mb"],
                 rest_ms=r["cpu_ms"] - r["decoder_linear_ms"] - r["lm_head_ms"])
    return {"rows": rows, "load_before": load_before, "load_after": load_after,
            "num_ppl_tokens": len(ppl_windows) * (args.window_len - 1)}


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Markdown table: (header, key, format)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "|".join("---:" if f else "---" for _, _, f in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(format(r[k], f) if f and r[k] is not None else str(r[k])
                                       for _, k, f in columns) + " |")
    return "\n".join(lines)


def report(result: dict, args) -> str:
    info, mag = result["info"], result["magnitudes"]
    q = table(result["quality"], [("mode", "mode", ""), ("perplexity", "perplexity", ".3f"),
                                  ("token agreement", "token_agreement", ".1%"),
                                  ("first divergence (mean)", "first_divergence_mean", ".1f"),
                                  ("(median)", "first_divergence_median", ".1f"),
                                  (f"identical of {args.prompts}", "identical", "d")])
    b = table(result["blocks"], [("model", "model", ""), ("dtype", "dtype", ""),
                                 ("kv_cache_dtype", "kv_cache_dtype", ""), ("quantization", "quantization", ""),
                                 ("bytes per block", "bytes_per_block", ",d"), ("blocks", "num_blocks", ",d")])
    m = table(result["modelled"], [("kv_cache_dtype", "kv_cache_dtype", ""), ("quantization", "quantization", ""),
                                   ("step, 1 decode (ms)", "step_ms_batch_1", ".2f"),
                                   (f"step, {args.batch} decodes (ms)", f"step_ms_batch_{args.batch}", ".2f"),
                                   ("weights read (GB)", "weight_gb", ".2f"), ("KV read (GB)", "kv_gb", ".2f"),
                                   ("bound", "bound", ""), ("tokens/s", "tokens_per_s", ",.0f")])
    k = table(result["kernels"], [("dtype", "dtype", ""), ("rows", "rows", "d"),
                                  ("_weight_int8pack_mm (ms)", "int8pack_ms", ".3f"),
                                  ("dequantize + mm (ms)", "dequantize_ms", ".3f"),
                                  ("float mm (ms)", "float_ms", ".3f"),
                                  ("int8_linear (ms)", "int8_linear_ms", ".3f"),
                                  ("int8_linear takes", "int8_linear_uses", "")])
    d = result["decode"]
    dt = table(d["rows"], [("mode", "mode", ""), ("wall ms / step", "wall_ms", ".2f"),
                           ("CPU ms / step", "cpu_ms", ".2f"), ("speed-up (wall)", "wall_speedup", ".2f"),
                           ("speed-up (CPU)", "cpu_speedup", ".2f"), ("weights read (MB)", "weight_mb", ".1f"),
                           ("of float32's", "bytes_ratio", ".0%"), ("perplexity", "perplexity", ".1f"),
                           ("perplexity change", "perplexity_change", "+.2%")])
    parts = table(d["rows"], [("mode", "mode", ""), ("CPU ms / step", "cpu_ms", ".2f"),
                              ("decoder linears (ms)", "decoder_linear_ms", ".2f"),
                              ("LM head (ms)", "lm_head_ms", ".2f"), ("the rest (ms)", "rest_ms", ".2f")])
    return f"""# Quantized KV cache and weights on the bundled model

Generated by `python benchmarks/quantization.py` ({info['date']}, {info['cpu']}, {info['cores']} cores, torch
{info['torch']}, load average before {info['load_before'][0]:.2f}, after {info['load_after'][0]:.2f}); total
{info['seconds']:.0f} s.

## Quality (bundled model, held-out Tiny Shakespeare)
Perplexity over {result['num_eval_tokens']:,} held-out tokens ({result['num_windows']} windows of {args.window_len}).
Greedy agreement with float32 over {args.prompts} prompts of {args.prompt_len} held-out tokens, {args.max_tokens}
new tokens each. Calibrated scales: amax / 448 per layer over {args.calibration_windows} training windows.
Held-out K/V magnitudes (float32): max |K| {mag['held_out_k_amax']:.2f}, max |V| {mag['held_out_v_amax']:.2f},
{mag['fraction_below_2^-6']:.1%} of the elements below 2^-6 (e4m3's subnormals at scale 1).

{q}

## KV blocks in a fixed budget
Bundled model: `kv_cache_memory_bytes` = {args.budget_mib} MiB, the engines' own block counts. Llama-3-8B: one
H100's 80 GB x 0.9 less the weights, in 16-token blocks.

{b}

## Modelled decode step, Llama-3-8B on an H100 (StepCostModel)
Decodes at {args.context} tokens of context; bfloat16 activations in every row.

{m}

## int8 matmul kernels on this CPU
A [rows, 256] x [256, 688] layer, torch threads 1, median of {args.repeats} x 10 calls.

{k}

## Decode on SmolLM-135M's shape (random weights), float32 vs int8 weights
{d['layers']} layers of SmolLM-135M's shape; one request: a {args.decode_prompt_len}-token prompt, then
{args.decode_tokens} decode steps; torch threads 1; a warm-up, then the two engines in turn {args.decode_repeats}
times, the median per decode step. Load average {d['load_before'][0]:.2f} before, {d['load_after'][0]:.2f} after.
Weights read per step: the decoder's linear layers and the LM head (float32 in both: tied to the embeddings).
Perplexity over {d['num_ppl_tokens']:,} held-out Tiny Shakespeare tokens (the bundled tokenizer's ids), in steps of
16 tokens: int8 through the packed kernel, as its decodes.

{dt}

Where a decode step's CPU time goes: the decoder's linear layers and the LM head timed apart (each called on one
row, in the model's order, median of {args.decode_repeats}), the rest (attention, norms, rotary, sampling, the
engine's host work) by difference. int8 changes only the first column, which bounds the whole step's speed-up.

{parts}
"""


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=None, help="the shared/data folder (default: found as the other benchmarks)")
    p.add_argument("--window-len", type=int, default=256)
    p.add_argument("--windows", type=int, default=None, help="held-out windows (default: all)")
    p.add_argument("--calibration-windows", type=int, default=64)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--budget-mib", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--decode-layers", type=int, default=SMOLLM_135M_SHAPE["num_hidden_layers"])
    p.add_argument("--decode-prompt-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--decode-repeats", type=int, default=5)
    p.add_argument("--decode-windows", type=int, default=16, help="held-out windows for section 6's perplexity")
    p.add_argument("--write", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "quantization.md"))
    args = p.parse_args(argv)
    start = time.perf_counter()
    info = {**machine_info(), "date": datetime.date.today().isoformat(),
            "load_before": os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),)}
    tokenizer = load_tokenizer(BUNDLED_MODEL, required=True)
    train, held_out = splits(tokenizer, find_data_dir(args.data))
    print("quality", flush=True)
    quality_rows, magnitudes = quality(args, train, held_out)
    print("blocks, modelled, kernels, decode", flush=True)
    result = {"quality": quality_rows, "magnitudes": magnitudes, "blocks": blocks(args), "modelled": modelled(args),
              "kernels": kernels(args), "decode": {**decode_speed(args, held_out), "layers": args.decode_layers},
              "num_windows": len(windows(held_out, args.window_len, args.windows)),
              "num_eval_tokens": len(windows(held_out, args.window_len, args.windows)) * (args.window_len - 1)}
    info["load_after"] = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),)
    info["seconds"] = time.perf_counter() - start
    result["info"] = info
    text = report(result, args)
    print(text)
    if args.write:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
