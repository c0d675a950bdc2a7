"""Offline throughput: minengine vs transformers static batching (and continuous batching), with the work counted.

The same workload (64 requests, prompts 32-512 tokens, 64-128 new tokens each, greedy, fixed seed) on the same
weights, in one process. For each thread count of the sweep it measures this machine's matmul roof (a GEMM of
the model's own shapes at that thread count, median of repeats), runs minengine and transformers' ``generate`` on
left-padded static batches alternately ``--repeats`` times, and reports median times, output tokens/s, the ratio,
whether the greedy outputs match, the FLOPs and bytes minengine's steps did and the fraction of the roof it
reached. transformers' continuous batching (``init_continuous_batching``) runs once, at the first thread count.

    python benchmarks/throughput.py                        # bundled model, threads 1, 2, all cores
    python benchmarks/throughput.py --model random-20m     # a ~20M-parameter random-weight Llama
    python benchmarks/throughput.py --threads 1 --repeats 1 --skip-continuous   # quicker

Targets (issue 13): >= 70 % of the roof at 1 thread, >= 2x transformers static batching, and never slower
than it at any thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minengine import LLM, SamplingParams  # noqa: E402
from minengine.timing import Hardware, ModelShape, StepCostModel, StepWork  # noqa: E402
from minengine.worker.host_memory import retain_freed_memory  # noqa: E402


def make_random_llama(out_dir: str) -> str:
    """A ~20M-parameter (18.9 M) Llama (GQA) with random weights, saved with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out_dir)
    return out_dir


def make_workload(vocab: int, n: int, seed: int, prompt_lens: tuple[int, int] = (32, 512),
                  output_lens: tuple[int, int] = (64, 128)) -> list[tuple[list[int], int]]:
    """n (prompt token ids, max_tokens) pairs, lengths uniform in the given inclusive ranges."""
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_lens))], rng.randint(*output_lens))
            for _ in range(n)]


# ---- counting the work ----------------------------------------------------------------------------------
# FLOPs and bytes per step come from the step cost model (minengine/timing/cost_model.py): linear layers for
# every new token, causal attention pairs, the LM head for sampling rows only; weights read once per step, K/V
# read for every visible key and written for every new token. Given this machine's measured matmul rate and
# copy bandwidth as a ``Hardware`` (efficiencies 1, no overhead), its ``time_s`` is the step's roofline time.
def model_shape(model_dir: str, dtype_bytes: int = 4) -> ModelShape:
    return ModelShape.from_hf_config(model_dir, dtype_bytes=dtype_bytes)


def linear_shapes(shape: ModelShape) -> list[tuple[int, int]]:
    """(in_features, out_features) of one decoder layer's projections (q, k, v, o, gate, up, down) and the
    LM head: the GEMMs whose rate is this machine's roof for the model."""
    h, i = shape.hidden_size, shape.intermediate_size
    return [(h, shape.q_size), (h, shape.kv_size), (h, shape.kv_size), (shape.q_size, h), (h, i), (h, i), (i, h),
            (h, shape.vocab_size)]


def measured_hardware(gflops: float, gbytes_per_s: float) -> Hardware:
    return Hardware(name="this machine (measured)", peak_flops=gflops * 1e9, memory_bandwidth=gbytes_per_s * 1e9,
                    mfu=1.0, mbu=1.0, step_overhead_s=0.0, combine="max",
                    source="matmul roof and copy bandwidth measured in this run")


def run_work(shape: ModelShape, traces, gflops: float, gbytes_per_s: float) -> tuple[float, float, float]:
    """Total FLOPs and bytes of the steps an engine ran (its ``StepTrace`` list), and their roofline time in
    seconds on this machine (per step max(FLOPs / rate, bytes / bandwidth); Williams et al., "Roofline",
    CACM 2009): the least time these steps could take here."""
    model = StepCostModel(measured_hardware(gflops, gbytes_per_s), shape)
    costs = [model.cost(StepWork.from_step_trace(t)) for t in traces]
    return sum(c.flops for c in costs), sum(c.bytes for c in costs), sum(c.time_s for c in costs)


def measure_matmul_roof(shape: ModelShape, rows: int, repeats: int = 7,
                        min_batch_s: float = 0.03) -> tuple[float, float]:
    """GFLOP/s of ``x @ w.T`` (what ``nn.Linear`` runs) on [rows, in] x the model's own weight shapes (one
    decoder layer and the LM head) at the current thread count. Each shape is timed in batches of calls that
    last >= ``min_batch_s`` (so a descheduled thread on a shared machine is averaged over, not sampled), the
    median of ``repeats`` batches is taken, and the shapes are combined FLOP-weighted (total FLOPs / total
    median time). Returns (per wall second, per second of this process's CPU time): the second holds still
    when other processes take turns on the cores."""
    total_flops = total_wall = total_cpu = 0.0
    for fan_in, fan_out in linear_shapes(shape):
        x, w = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in)
        out = torch.empty(rows, fan_out)
        start = time.perf_counter()
        calls = 0
        while time.perf_counter() - start < min_batch_s or calls < 3:  # warm-up, and calibrates the batch
            torch.matmul(x, w.t(), out=out)
            calls += 1
        wall, cpu = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            for _ in range(calls):
                torch.matmul(x, w.t(), out=out)
            wall.append((time.perf_counter() - t) / calls)
            cpu.append((time.process_time() - c) / calls)
        total_flops += 2.0 * rows * fan_in * fan_out
        total_wall += statistics.median(wall)
        total_cpu += statistics.median(cpu)
    return total_flops / total_wall / 1e9, total_flops / total_cpu / 1e9


def measure_copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """GB/s of a large tensor copy (bytes read + bytes written per second) at the current thread count,
    median of ``repeats`` (the memory roof of the roofline; a STREAM-copy-like number)."""
    return measure_copy_bandwidths(megabytes, repeats)[0]


def measure_copy_bandwidths(megabytes: int = 256, repeats: int = 5) -> tuple[float, float]:
    """``measure_copy_bandwidth`` per wall second and per second of this process's CPU time (the second holds
    still when other processes take turns on the cores)."""
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        dst.copy_(src)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    nbytes = 2 * src.numel() * 4
    return nbytes / statistics.median(wall) / 1e9, nbytes / max(statistics.median(cpu), 1e-9) / 1e9


# ---- the systems ----------------------------------------------------------------------------------------
def engine_kwargs(threads: int | None) -> dict:
    """``num_cpu_threads`` for the engine when this version of ``EngineConfig`` has it."""
    from minengine.config import EngineConfig

    fields = getattr(EngineConfig, "__dataclass_fields__", {})
    return {"num_cpu_threads": threads} if threads and "num_cpu_threads" in fields else {}


def run_minengine(model: str, work, max_num_batched_tokens: int, threads: int | None = None, **engine_args):
    """A fresh engine (no prefix-cache hits from an earlier repeat), a 2-request warm-up, then the workload.
    ``engine_args`` go to ``LLM`` too (``dtype``, ``quantization``: benchmarks/real_shape.py).
    Returns (wall seconds, process CPU seconds, output token ids per request, the engine's step traces of
    the timed run)."""
    llm = LLM(model, max_model_len=1024, max_num_seqs=len(work), max_num_batched_tokens=max_num_batched_tokens,
              **engine_kwargs(threads), **engine_args)
    prompts = [{"prompt_token_ids": p} for p, _ in work]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in work]
    # Warm-up on prompts of the workload's lengths but other tokens: the workload's own would leave their
    # blocks in the prefix cache and the timed run would skip their prefill.
    warm = [{"prompt_token_ids": [1 + (t + 1) % 2 for t in p["prompt_token_ids"]]} for p in prompts[:2]]
    llm.generate(warm, params[:2], use_tqdm=False)
    llm.llm_engine.reset_stats()
    t, c = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    return elapsed, cpu, [o.outputs[0].token_ids for o in outs], list(llm.llm_engine.traces)


def load_hf(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def run_hf_static(model, work, batch_size: int) -> tuple[float, float, list[list[int]]]:
    """transformers ``generate`` on left-padded batches; each batch runs to its longest max_tokens and each
    request keeps only its own first max_tokens tokens (the rest is the waste static batching pays).
    Returns (wall seconds, process CPU seconds, output token ids per request)."""
    outs: list[list[int]] = []
    with torch.no_grad():  # warm-up
        model.generate(torch.tensor([work[0][0][:8]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    t, c = time.perf_counter(), time.process_time()
    for i in range(0, len(work), batch_size):
        chunk = work[i:i + batch_size]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=max(n for _, n in chunk), do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs += [gen[j, width:width + n].tolist() for j, (_, n) in enumerate(chunk)]
    return time.perf_counter() - t, time.process_time() - c, outs


def run_hf_continuous(model, work) -> tuple[float, list[list[int]]]:
    """transformers' continuous batching manager (``init_continuous_batching``), per-request max_new_tokens."""
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=False, max_new_tokens=max(n for _, n in work), eos_token_id=-1, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=gc)
    manager.start()
    try:
        t = time.perf_counter()
        ids = [manager.add_request(p, request_id=str(i), max_new_tokens=n, eos_token_id=-1)
               for i, (p, n) in enumerate(work)]
        results = {}
        while len(results) < len(ids):
            r = manager.get_result(timeout=5)
            if r is not None and r.is_finished():
                results[r.request_id] = r.generated_tokens
        elapsed = time.perf_counter() - t
    finally:
        manager.stop(block=True)
    return elapsed, [list(results[str(i)]) for i in range(len(work))]


# ---- the sweep ------------------------------------------------------------------------------------------
def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}


def parse_threads(text: str) -> list[int]:
    """"1,2,all" -> [1, 2, os.cpu_count()] without duplicates, in order."""
    out: list[int] = []
    for part in text.split(","):
        n = (os.cpu_count() or 1) if part.strip() == "all" else int(part)
        if n < 1:
            raise ValueError(f"--threads: thread counts must be >= 1, got {n}")
        if n not in out:
            out.append(n)
    return out


def parse_range(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    if not 1 <= lo <= hi:
        raise ValueError(f"expected 'lo,hi' with 1 <= lo <= hi, got {text!r}")
    return lo, hi


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint dir, 'random-20m', or empty for the bundled model")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=parse_range, default=(32, 512), help="lo,hi prompt tokens")
    ap.add_argument("--output-len", type=parse_range, default=(64, 128), help="lo,hi new tokens")
    ap.add_argument("--static-batch-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=parse_threads, default=parse_threads("1,2,all"),
                    help="comma-separated torch thread counts to sweep ('all' = every core)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating timed runs per system and thread count")
    ap.add_argument("--skip-continuous", action="store_true", help="skip transformers continuous batching")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args(argv)

    # Process-wide malloc settings (worker/host_memory.py), applied before anything runs so that transformers
    # runs under the same allocator as minengine (minengine's CPU runner applies them anyway).
    malloc_tuned = retain_freed_memory()
    tmp = tempfile.TemporaryDirectory()
    if a.model == "random-20m":
        model_dir = make_random_llama(tmp.name)
    else:
        from minengine.config import BUNDLED_MODEL

        model_dir = a.model or BUNDLED_MODEL
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    shape = model_shape(model_dir)
    work = make_workload(cfg.vocab_size, a.num_requests, a.seed, a.prompt_len, a.output_len)
    n_out = sum(n for _, n in work)
    info = machine_info()
    from minengine.layers import cpu_attention

    info["cpu_attention_kernel"] = not cpu_attention.is_disabled() and cpu_attention.get_kernel() is not None
    print(f"model {a.model or 'bundled'} ({shape.num_params / 1e6:.1f} M params) | "
          f"{a.num_requests} requests, prompts {a.prompt_len[0]}-{a.prompt_len[1]}, outputs "
          f"{a.output_len[0]}-{a.output_len[1]} ({n_out} output tokens) | {info['cpu']}, {info['cores']} cores, "
          f"torch {info['torch']} | malloc retains freed memory: {malloc_tuned} | C++ attention kernel: "
          f"{info['cpu_attention_kernel']} | load average {info['load_average']}")
    hf = load_hf(model_dir)
    rows = []
    for threads in a.threads:
        torch.set_num_threads(threads)
        (roof, roof_cpu), bandwidth = measure_matmul_roof(shape, a.max_num_batched_tokens), measure_copy_bandwidth()
        me_runs, hf_runs = [], []
        for _ in range(a.repeats):  # alternate, so that a burst of load on the machine hits both
            t, cpu, me, traces = run_minengine(model_dir, work, a.max_num_batched_tokens, threads)
            me_runs.append((t, cpu))
            t, cpu, st = run_hf_static(hf, work, a.static_batch_size)
            hf_runs.append((t, cpu))
        flops, nbytes, bound = run_work(shape, traces, roof, bandwidth)
        me_t, hf_t = statistics.median(t for t, _ in me_runs), statistics.median(t for t, _ in hf_runs)
        me_cpu, hf_cpu = statistics.median(c for _, c in me_runs), statistics.median(c for _, c in hf_runs)
        row = {"threads": threads, "roof_gflops": roof, "copy_gbytes_per_s": bandwidth,
               "minengine_s": me_t, "minengine_cpu_s": me_cpu, "minengine_tok_s": n_out / me_t,
               "minengine_runs_s": [t for t, _ in me_runs], "hf_static_s": hf_t, "hf_static_cpu_s": hf_cpu,
               "hf_static_tok_s": n_out / hf_t, "hf_static_runs_s": [t for t, _ in hf_runs],
               "speedup_vs_hf_static": hf_t / me_t, "outputs_equal": sum(o == m for o, m in zip(st, me)),
               "num_requests": len(work), "gflop": flops / 1e9, "gbytes": nbytes / 1e9,
               "achieved_gflops": flops / me_t / 1e9, "roof_fraction": flops / me_t / 1e9 / roof,
               "roof_cpu_gflops": roof_cpu, "roof_fraction_cpu_time": flops / me_cpu / 1e9 / roof_cpu,
               "roofline_s": bound, "roofline_fraction": bound / me_t, "num_steps": len(traces)}
        if not a.skip_continuous and threads == a.threads[0]:
            try:
                t, cb = run_hf_continuous(hf, work)
                row.update(hf_continuous_s=t, hf_continuous_tok_s=n_out / t, speedup_vs_hf_continuous=t / me_t,
                           continuous_outputs_equal=sum(o == m for o, m in zip(cb, me)))
            except Exception as exc:  # report, do not hide, a peer that failed to run
                print(f"transformers continuous batching failed: {type(exc).__name__}: {exc}")
        rows.append(row)
        if a.json:  # after every thread count, so a long sweep cut short keeps what it measured
            a.json.write_text(json.dumps({"model": a.model or "bundled", "machine": info, "rows": rows}, indent=2))

    print(f"\n{'threads':>7} {'roof GFLOP/s':>12} {'copy GB/s':>9} {'minengine tok/s':>15} {'hf static tok/s':>15} "
          f"{'ratio':>6} {'equal':>7} {'GFLOP':>7} {'GB':>6} {'GFLOP/s':>8} {'of roof':>7} {'of roofline':>11} "
          f"{'CPU-time ratio':>14} {'of roof (CPU time)':>18}")
    for r in rows:
        print(f"{r['threads']:>7} {r['roof_gflops']:>12.1f} {r['copy_gbytes_per_s']:>9.1f} "
              f"{r['minengine_tok_s']:>15.1f} {r['hf_static_tok_s']:>15.1f} {r['speedup_vs_hf_static']:>5.2f}x "
              f"{r['outputs_equal']:>3}/{r['num_requests']:<3} {r['gflop']:>7.1f} {r['gbytes']:>6.2f} "
              f"{r['achieved_gflops']:>8.1f} {100 * r['roof_fraction']:>6.1f}% "
              f"{100 * r['roofline_fraction']:>10.1f}% {r['hf_static_cpu_s'] / r['minengine_cpu_s']:>13.2f}x "
              f"{100 * r['roof_fraction_cpu_time']:>17.1f}%")
        if "hf_continuous_s" in r:
            print(f"{'':>7} transformers continuous batching: {r['hf_continuous_tok_s']:.1f} tok/s (minengine "
                  f"{r['speedup_vs_hf_continuous']:.2f}x), outputs equal {r['continuous_outputs_equal']}/{len(work)}")
    print(f"(medians of {a.repeats} alternating runs; 'of roof' = achieved GFLOP/s / the matmul roof; 'of roofline' ="
          f" the steps' roofline time (max of FLOPs/roof, bytes/copy bandwidth per step) / the measured time; the "
          f"CPU-time columns use this process's CPU seconds instead of wall seconds; load average at the end "
          f"{machine_info()['load_average']})")
    result = {"model": a.model or "bundled", "machine": info, "malloc_tuned": malloc_tuned,
              "settings": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(a).items()},
              "num_output_tokens": n_out, "rows": rows}
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
