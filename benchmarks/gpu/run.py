"""The GPU path, measured on one GPU with nothing to download (``benchmarks/gpu/run.sh``; under 8 min on an H100).

Random-weight models with the shapes of Qwen2.5-0.5B and Llama-3.2-1B are built from configs and saved with
``save_pretrained`` (bf16 weights), then loaded through minengine's and transformers' own loading paths.

(a) correctness: greedy tokens of minengine (Triton paged attention, CUDA graphs) vs transformers on the same GPU
    in float32; a mismatch counts as a tie when transformers' top-2 logit margin at the first differing token
    is below ``--tie-margin`` (random weights give near-flat distributions). bf16: minengine's agreement with the
    float32 reference, beside transformers' own bf16 agreement. Triton attention vs a float64 reference: max
    error on random block tables.
(b) decode step time vs batch size (bf16, CUDA graphs and eager) against the HBM roofline: bytes per step
    (weights + KV read + KV written) / measured device copy bandwidth.
(c) throughput on the CPU benchmark's workload (64 requests, prompts 32-512, 64-128 new tokens) vs
    transformers static batching on the GPU, in one run.

It prints one table and writes a JSON. ``--device cpu --tiny`` runs every code path on tiny shapes on a CPU
(Triton through its interpreter, the graph path as padded eager replay); the test suite does that.

    bash benchmarks/gpu/run.sh                  # on the GPU machine; JSON in $OUT (or benchmarks/results)
    python benchmarks/gpu/run.py --device cpu --tiny --out /tmp/gpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.throughput import make_workload, measured_hardware  # noqa: E402
from minengine import LLM, SamplingParams  # noqa: E402
from minengine.timing import ModelShape, StepCostModel, StepWork  # noqa: E402

# Shapes from the public configs (hidden sizes, heads, layers, vocab, RoPE); the weights are random.
SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True),
    "llama-3.2-1b": dict(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}),
}
TINY_SHAPES = {
    "tiny-qwen2": dict(arch="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "tiny-llama3": dict(arch="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=16384,
                        rms_norm_eps=1e-5, tie_word_embeddings=True,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_model(name: str, spec: dict, out_dir: Path, device: str) -> str:
    """A random-weight checkpoint of the given shape (bf16 safetensors, no tokenizer) in ``out_dir/name``."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    spec = dict(spec)
    arch = spec.pop("arch")
    cfg = (Qwen2Config(use_sliding_window=False, **spec) if arch == "qwen2" else LlamaConfig(**spec))
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 0
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU: seconds instead of a minute for 1.2 B parameters
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = out_dir / name
    model.to(torch.bfloat16).save_pretrained(path)
    del model
    return str(path)


def load_hf(path: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def make_engine(path: str, dtype: str, device: str, max_num_seqs: int, max_model_len: int,
                max_num_batched_tokens: int = 2048, num_kv_blocks: int | None = None) -> LLM:
    """An engine on ``device``. On CUDA the runner defaults to the Triton attention with CUDA graphs; on a CPU
    (the dry run) it is replaced by one that runs the same Triton + padded-graph path (Triton interpreter)."""
    llm = LLM(path, dtype=dtype, device=device, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
              max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False, num_kv_blocks=num_kv_blocks)
    engine = llm.llm_engine
    if device == "cpu":
        from minengine.worker.model_runner import ModelRunner

        engine.runner = ModelRunner(engine.model, engine.num_kv_blocks, engine.config.block_size,
                                    seed=engine.config.seed, attention_backend="triton", cuda_graphs=True,
                                    max_num_seqs=max_num_seqs)
    return llm


def hf_greedy(model, prompt: list[int], max_new: int, device: str) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and, per generated token, its top-1 minus top-2 logit (the margin)."""
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    margins = []
    for step_logits in out.logits:
        top2 = step_logits[0].float().topk(2).values
        margins.append(float(top2[0] - top2[1]))
    return tokens, margins


def compare(reference: list[int], margins: list[float], tokens: list[int], tie_margin: float) -> str:
    """"exact", "tie" (first difference where the reference's margin < tie_margin) or "mismatch"."""
    for i, (r, t) in enumerate(zip(reference, tokens)):
        if r != t:
            return "tie" if margins[i] < tie_margin else "mismatch"
    return "exact" if len(reference) == len(tokens) else "mismatch"


def agreement(reference: list[int], tokens: list[int]) -> float:
    """Fraction of the reference's tokens before the first difference."""
    n = next((i for i, (r, t) in enumerate(zip(reference, tokens)) if r != t), min(len(reference), len(tokens)))
    return n / max(1, len(reference))


def generate(llm: LLM, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


# ---- (a) correctness --------------------------------------------------------------------------------------
def correctness(name: str, path: str, a, device: str) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(*a.prompt_lens))]
               for _ in range(a.num_prompts)]
    max_len = max(map(len, prompts)) + a.max_new + 8
    hf32 = load_hf(path, torch.float32, device)
    refs = [hf_greedy(hf32, p, a.max_new, device) for p in prompts]
    del hf32
    hf16 = load_hf(path, torch.bfloat16, device)
    hf_bf16 = [hf_greedy(hf16, p, a.max_new, device)[0] for p in prompts]
    del hf16
    result = {"model": name}
    for dtype in ("float32", "bfloat16"):
        llm = make_engine(path, dtype, device, max_num_seqs=len(prompts), max_model_len=max_len)
        runner = llm.llm_engine.runner
        tokens = generate(llm, prompts, a.max_new)
        graphs = runner.graphs
        result[dtype] = {
            "attention_backend": runner.attention_backend,
            "graph_replays": graphs.num_replays if graphs else 0,
            "eager_steps": graphs.num_eager_fallbacks if graphs else None,
            "verdicts": [compare(r, m, t, a.tie_margin) for (r, m), t in zip(refs, tokens)],
            "agreement": statistics.mean(agreement(r, t) for (r, _), t in zip(refs, tokens)),
        }
        del llm
    result["hf_bfloat16_agreement"] = statistics.mean(agreement(r, t) for (r, _), t in zip(refs, hf_bf16))
    result["min_reference_margin"] = min(min(m) for _, m in refs)
    return result


def reference_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale):
    """float64 causal attention per request, K/V gathered through the block table."""
    hq, hkv, bs = query.shape[1], k_cache.shape[2], k_cache.shape[1]
    out = torch.zeros(query.shape, dtype=torch.float64, device=query.device)
    for i in range(seq_lens.shape[0]):
        s, e, n = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
        if e == s:
            continue
        blocks = block_tables[i, :math.ceil(n / bs)].long()
        k = k_cache[blocks].reshape(-1, hkv, k_cache.shape[-1])[:n].double().repeat_interleave(hq // hkv, 1)
        v = v_cache[blocks].reshape(-1, hkv, v_cache.shape[-1])[:n].double().repeat_interleave(hq // hkv, 1)
        scores = torch.einsum("qhd,khd->hqk", query[s:e].double(), k) * scale
        q_pos = torch.arange(n - (e - s), n, device=query.device)[:, None]
        scores = scores.masked_fill(torch.arange(n, device=query.device)[None, :] > q_pos, float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def triton_check(shape: ModelShape, dtype: torch.dtype, device: str, seed: int, tiny: bool) -> float:
    """Max |Triton - float64 reference| over a mixed step (prefills, chunks after context, decodes) whose
    blocks are scattered over a shuffled pool."""
    from minengine.layers.triton_attention import triton_paged_attention

    gen = torch.Generator().manual_seed(seed)
    bs, heads, kv_heads, head_dim = 16, shape.num_heads, shape.num_kv_heads, shape.head_dim
    # tiny (the Triton interpreter runs each (token, head) program in Python): a prefill, a decode over 3 blocks, a
    # chunk after context that crosses a block edge, a 1-token prefill, a chunk starting on a block edge
    requests = [(0, 3), (40, 1), (30, 3), (0, 1), (16, 2)] if tiny else \
        [(0, 300), (1000, 1), (500, 64), (0, 1), (2047, 1), (64, 128)] + [(int(x), 1) for x in
                                                                          torch.randint(1, 3000, (32,), generator=gen)]
    seq = [c + q for c, q in requests]
    nblocks = [math.ceil(s / bs) for s in seq]
    pool = sum(nblocks) + 1
    perm = torch.randperm(pool, generator=gen)
    tables = torch.zeros(len(requests), max(nblocks), dtype=torch.int32)
    at = 0
    for i, n in enumerate(nblocks):
        tables[i, :n] = perm[at:at + n].to(torch.int32)
        at += n
    k_cache = torch.randn(pool, bs, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(pool, bs, kv_heads, head_dim, generator=gen).to(dtype)
    q_lens = [q for _, q in requests]
    query = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    args = [x.to(device) for x in (query, k_cache, v_cache, tables, qsl, torch.tensor(seq, dtype=torch.int32))]
    scale = head_dim ** -0.5
    out = triton_paged_attention(*args, scale)
    ref = reference_attention(*args, scale)
    return float((out.double() - ref).abs().max())


# ---- (b) decode step time vs batch size --------------------------------------------------------------------
def copy_bandwidth(device: str, megabytes: int) -> float:
    """GB/s of a device-to-device copy (bytes read + written), median of 10."""
    src = torch.ones(megabytes * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def decode_sweep(name: str, path: str, a, device: str, bandwidth: float) -> list[dict]:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    # Bytes per step from the step cost model (bf16 weights and KV); only the bandwidth side matters here.
    cost_model = StepCostModel(measured_hardware(1e6, bandwidth), ModelShape.from_hf_config(path, dtype_bytes=2))
    max_b = max(a.batch_sizes)
    context = a.decode_context
    max_len = context + a.decode_steps + 64
    # Room for every request of the largest batch at its longest: no preemption during the sweep.
    llm = make_engine(path, "bfloat16", device, max_num_seqs=max_b, max_model_len=max_len,
                      max_num_batched_tokens=max(2048, context), num_kv_blocks=max_b * math.ceil(max_len / 16) + 16)
    engine = llm.llm_engine
    graphs = engine.runner.graphs
    rng = random.Random(2)
    rows = []
    for b in a.batch_sizes:
        for mode in ("graphs", "eager"):
            if mode == "graphs" and graphs is None:
                continue
            engine.runner.graphs = graphs if mode == "graphs" else None
            params = SamplingParams(temperature=0, max_tokens=a.decode_steps + 16, ignore_eos=True)
            ids = [f"{mode}-{b}-{i}" for i in range(b)]
            for rid in ids:
                engine.add_request(rid, {"prompt_token_ids": [rng.randrange(3, cfg.vocab_size)
                                                              for _ in range(context)]}, params)
            while True:  # prefill until a step is b decodes
                engine.step()
                if engine.traces[-1].num_prefill_tokens == 0 and engine.traces[-1].num_decode_tokens == b:
                    break
            for _ in range(1 if a.tiny else 3):  # warm-up
                engine.step()
            times, work = [], []
            for _ in range(a.decode_steps):
                t = time.perf_counter()
                engine.step()  # ends with the sampled tokens on the host: a device sync
                times.append(time.perf_counter() - t)
                work.append(cost_model.cost(StepWork.from_step_trace(engine.traces[-1])).bytes)
            engine.abort_request(ids)
            step_s = statistics.median(times)
            nbytes = statistics.median(work)
            rows.append({"model": name, "batch": b, "mode": mode, "context": context, "step_ms": 1e3 * step_s,
                         "tok_s": b / step_s, "bytes_per_step": nbytes, "roofline_ms": 1e3 * nbytes / bandwidth / 1e9,
                         "roofline_fraction": nbytes / bandwidth / 1e9 / step_s})
            log(f"decode {name} B={b} {mode}: {1e3 * step_s:.2f} ms/step, roofline {rows[-1]['roofline_ms']:.2f} ms")
    engine.runner.graphs = graphs
    if graphs is not None:
        rows_captured = graphs.captured_sizes
        log(f"captured graph sizes: {rows_captured}")
    return rows


# ---- (c) throughput vs transformers static batching ---------------------------------------------------------
def hf_static(model, work, batch_size: int, device: str) -> tuple[float, list[list[int]]]:
    outs = []
    sync(device)
    t = time.perf_counter()
    for i in range(0, len(work), batch_size):
        chunk = work[i:i + batch_size]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk], device=device)
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=max(n for _, n in chunk),
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        outs += [gen[j, width:width + n].tolist() for j, (_, n) in enumerate(chunk)]
    sync(device)
    return time.perf_counter() - t, outs


def throughput(name: str, path: str, a, device: str) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    work = make_workload(cfg.vocab_size, a.num_requests, 0, a.workload_prompt_lens, a.workload_output_lens)
    n_out = sum(n for _, n in work)
    llm = make_engine(path, "bfloat16", device, max_num_seqs=len(work), max_model_len=1024)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in work]
    prompts = [{"prompt_token_ids": p} for p, _ in work]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up: Triton compile, graph captures
    sync(device)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    me_s = time.perf_counter() - t
    me = [o.outputs[0].token_ids for o in outs]
    del llm
    hf = load_hf(path, torch.bfloat16, device)
    hf_static(hf, work[:2], 2, device)  # warm-up
    result = {"model": name, "dtype": "bfloat16", "num_requests": len(work), "output_tokens": n_out,
              "minengine_s": me_s, "minengine_tok_s": n_out / me_s}
    for bsz in a.static_batch_sizes:
        t, st = hf_static(hf, work, bsz, device)
        result[f"hf_static_{bsz}_s"] = t
        result[f"hf_static_{bsz}_tok_s"] = n_out / t
        result[f"speedup_vs_hf_static_{bsz}"] = t / me_s
        result[f"hf_static_{bsz}_agreement"] = statistics.mean(agreement(s, m) for s, m in zip(st, me))
    return result


# ---- main -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and sizes (a CPU dry run of every path)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu.json")
    ap.add_argument("--tie-margin", type=float, default=1e-3, help="logit margin below which a mismatch is a tie")
    a = ap.parse_args(argv)
    device = a.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu --tiny for a dry run")
    shapes = TINY_SHAPES if a.tiny else SHAPES
    # Sizes: the real run fits in < 8 minutes on an H100; the tiny run in about a minute on a CPU.
    a.num_prompts, a.prompt_lens, a.max_new = (2, (5, 16), 3) if a.tiny else (8, (16, 200), 32)
    a.batch_sizes = [2] if a.tiny else [1, 4, 16, 32, 64, 128, 256]
    a.decode_context, a.decode_steps = (3, 2) if a.tiny else (512, 30)
    a.num_requests = 2 if a.tiny else 64
    a.workload_prompt_lens, a.workload_output_lens = ((6, 12), (2, 3)) if a.tiny else ((32, 512), (64, 128))
    a.static_batch_sizes = [2] if a.tiny else [16, 64]

    info = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "tiny": a.tiny}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    log(f"{info}")
    result: dict = {"info": info, "correctness": [], "triton": [], "decode": [], "throughput": None}
    tmp = tempfile.TemporaryDirectory()
    paths = {}
    for name, spec in shapes.items():
        t = time.perf_counter()
        paths[name] = make_model(name, spec, Path(tmp.name), device)
        log(f"built {name} in {time.perf_counter() - t:.1f} s")

    a.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every section, so a run cut short still leaves what it measured
        a.out.write_text(json.dumps(result, indent=2))

    for name, path in paths.items():
        result["correctness"].append(correctness(name, path, a, device))
        log(f"correctness {name}: {result['correctness'][-1]}")
        shape = ModelShape.from_hf_config(path)
        for dtype in (torch.float32, torch.bfloat16):
            err = triton_check(shape, dtype, device, seed=3, tiny=a.tiny)
            result["triton"].append({"model": name, "dtype": str(dtype).removeprefix("torch."), "max_abs_err": err})
        save()
    bandwidth = copy_bandwidth(device, 64 if a.tiny else 1024)
    result["copy_gbytes_per_s"] = bandwidth
    first = next(iter(paths))
    result["decode"] = decode_sweep(first, paths[first], a, device, bandwidth)
    save()
    result["throughput"] = throughput(first, paths[first], a, device)
    save()
    print_table(result)
    log(f"wrote {a.out}")
    return result


def print_table(r: dict) -> None:
    lines = [f"GPU path on {r['info']['device']} (torch {r['info']['torch']}, triton {r['info']['triton']}), "
             f"{r['info']['date']}; device copy bandwidth {r['copy_gbytes_per_s']:.0f} GB/s", "",
             "| check | model | result |", "|---|---|---|"]
    for c in r["correctness"]:
        v = c["float32"]["verdicts"]
        lines.append(f"| greedy fp32 vs transformers fp32 | {c['model']} | {v.count('exact')} exact, {v.count('tie')} "
                     f"ties, {v.count('mismatch')} mismatches of {len(v)} (graph replays "
                     f"{c['float32']['graph_replays']}) |")
        lines.append(f"| bf16 agreement with fp32 reference | {c['model']} | minengine "
                     f"{100 * c['bfloat16']['agreement']:.0f} %, transformers bf16 "
                     f"{100 * c['hf_bfloat16_agreement']:.0f} % |")
    for t in r["triton"]:
        lines.append(f"| Triton vs float64 reference, {t['dtype']} | {t['model']} | "
                     f"max abs err {t['max_abs_err']:.2e} |")
    lines += ["", "| model | batch | mode | ms/step | tok/s | roofline ms | of roofline |",
              "|---|---:|---|---:|---:|---:|---:|"]
    for d in r["decode"]:
        lines.append(f"| {d['model']} | {d['batch']} | {d['mode']} | {d['step_ms']:.2f} | {d['tok_s']:.0f} | "
                     f"{d['roofline_ms']:.2f} | {100 * d['roofline_fraction']:.0f} % |")
    t = r["throughput"]
    lines += ["", "| system | tok/s | minengine speedup | agreement |", "|---|---:|---:|---:|",
              f"| minengine ({t['model']}, bf16) | {t['minengine_tok_s']:.0f} | | |"]
    for key in sorted(k for k in t if k.startswith("hf_static_") and k.endswith("_tok_s")):
        bsz = key.removeprefix("hf_static_").removesuffix("_tok_s")
        lines.append(f"| transformers static (batch {bsz}) | {t[key]:.0f} | {t[f'speedup_vs_hf_static_{bsz}']:.2f}x | "
                     f"{100 * t[f'hf_static_{bsz}_agreement']:.0f} % |")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
