"""Real-shape benchmark: minengine against transformers (and llama.cpp when given) on random-weight checkpoints
with the exact configs of SmolLM-135M, Qwen2.5-0.5B and Llama-3.2-1B (issue 35, "Benchmarks").

The checkpoints are built once, with ``save_pretrained`` from each model's ``config.json`` (``HUB_CONFIGS``
below: written from knowledge of the hub's files, as there is no network here, and kept as the checkpoint's
``config.json``, so both loaders parse the hub's own format) and seeded random weights, in the hub's weight dtype,
into a cache directory keyed by the config and the environment (``~/.cache/minengine/real_shape/<name>-<hash>``,
or ``$MINENGINE_REAL_SHAPE_CACHE``). No download. minengine loads them through ``LLM(path, ...)`` (its real
loader), transformers through ``AutoModelForCausalLM.from_pretrained``.

Per shape, per torch thread count (``--threads``, default 1,2) and per dtype (``--dtypes``: float32; bfloat16,
labelled "not native" on a CPU without AVX512-BF16 / AMX; int8 = ``quantization="int8"``, minengine only, as
transformers has no CPU int8 path without extra packages), median of ``--repeats`` (>= 3 by default) after a
warm-up, minengine and transformers taken in turn so a change of load hits both:

- single stream: a ``--prompt-len`` (512) token prompt, then ``--decode-tokens`` (128) decode steps: prefill tok/s
  (the step that computes the prompt and samples the first token), decode tok/s and ms/step, each in wall and
  in this process's CPU time (``time.process_time``); transformers: ``generate`` (greedy) with a streamer that
  stamps the prompt and every new token;
- batched: ``--batch-requests`` (32) requests of ``--batch-prompt-len`` (64) prompt and ``--batch-output-len``
  (32) new tokens: output tok/s; transformers: static batching with left padding (one batch of all requests).
  Both through ``benchmarks/throughput.py``'s ``run_minengine`` / ``run_hf_static``. (128 + 64 tokens, the
  issue's example, costs about 3x more and takes the default run past 10 minutes on 2 cores: pass
  ``--batch-prompt-len 128 --batch-output-len 64`` for it);
- the roofs at each thread count, measured in the same run: copy bandwidth (a 256 MiB torch copy, bytes read +
  written per second) and a float32 matmul roof (GEMMs of the model's own shapes); decode bytes/s = weight
  bytes a decode step reads (the decoder's linear weights, int8 + scales for int8, and the LM head) / step time,
  and its fraction of the copy bandwidth; prefill and batched GFLOP/s (the step cost model's FLOPs of the steps
  minengine ran) and their fraction of the matmul roof;
- the load average before and after each measurement, and whether greedy outputs equal transformers'.

    python benchmarks/real_shape.py      # SmolLM-135M's shape; meant to fit 10 min on 2 idle cores (unverified)
    python benchmarks/real_shape.py --shapes all --decode-tokens 32   # Llama-3.2-1B: 5 GB in float32
    python benchmarks/real_shape.py --shapes qwen2.5-0.5b --dtypes float32 --threads 1
    python benchmarks/real_shape.py --print-checkpoint smollm-135m   # build it, print its directory

Results: ``benchmarks/results/real_shape.{md,json}`` (``--out`` for another directory).

llama.cpp (only when asked; its ratio is printed only when it ran). Build it from source (CPU only) and convert
the random checkpoint with its own converter::

    git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j --target llama-bench llama-server
    pip install -r requirements/requirements-convert_hf_to_gguf.txt
    CKPT=$(python /path/to/minengine/benchmarks/real_shape.py --print-checkpoint smollm-135m)
    python convert_hf_to_gguf.py $CKPT --outtype f32 --outfile $CKPT/ggml-model-f32.gguf
    python convert_hf_to_gguf.py $CKPT --outtype bf16 --outfile $CKPT/ggml-model-bf16.gguf
    python convert_hf_to_gguf.py $CKPT --outtype q8_0 --outfile $CKPT/ggml-model-q8_0.gguf

(the checkpoint has no tokenizer: give the converter one of the same vocabulary size, e.g. copy the real model's
``tokenizer.json`` and ``tokenizer_config.json`` into ``$CKPT``, or use ``--vocab-only`` from a tokenizer dir).
Then ``--llama-bench build/bin/llama-bench`` runs ``llama-bench -p PROMPT -n DECODE -t THREADS -r REPEATS -o json``
on ``$CKPT/ggml-model-{f32,bf16,q8_0}.gguf`` (the dtype rows float32, bfloat16, int8; a missing file skips its
row) at each thread count: prefill and decode tok/s (wall, llama-bench's own timing). ``--llama-server URL``
(a ``llama-server -m $CKPT/ggml-model-f32.gguf -t 1 -np 32 -c 8192`` started by you; ``--llama-server-threads``
and ``--llama-server-dtype`` say what it runs) adds the single stream (``/completion`` with the same token ids,
``cache_prompt`` off, ``ignore_eos``) and the batched workload (all requests at once, one thread each): wall time,
which for a server is also its CPU-time stand-in.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quantization import weight_bytes_per_decode  # noqa: E402
from benchmarks.throughput import (  # noqa: E402
    machine_info,
    measure_copy_bandwidths,
    measure_matmul_roof,
    model_shape,
    parse_threads,
    run_hf_static,
    run_minengine,
    run_work,
)
from minengine import LLM, SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# The hub's config.json of each model, written from knowledge (no network here): HuggingFaceTB/SmolLM-135M,
# Qwen/Qwen2.5-0.5B, meta-llama/Llama-3.2-1B. "tiny" is a hidden-64 Llama for the test suite.
HUB_CONFIGS: dict[str, dict] = {
    "smollm-135m": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.02,
        "intermediate_size": 1536, "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 9,
        "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
        "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152},
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 151936},
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
    "tiny": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "model_type": "llama",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
        "vocab_size": 512, "bos_token_id": 0, "eos_token_id": 0},
}
REAL_SHAPES = ("smollm-135m", "qwen2.5-0.5b", "llama-3.2-1b")
DTYPES = {"float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16"},
          "int8": {"dtype": "float32", "quantization": "int8"}}
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0"}  # the llama.cpp file of each dtype row


# ---- the checkpoints ------------------------------------------------------------------------------------
def cache_root() -> Path:
    return Path(os.environ.get("MINENGINE_REAL_SHAPE_CACHE", Path.home() / ".cache" / "minengine" / "real_shape"))


def checkpoint_dir(name: str, root: Path | None = None) -> Path:
    """Where shape ``name``'s checkpoint lives: keyed by its config, the seed and this environment (Python
    prefix, torch and transformers versions), so virtualenvs sharing a home directory keep one build each."""
    import transformers

    key = json.dumps([HUB_CONFIGS[name], 0, sys.prefix, torch.__version__, transformers.__version__],
                     sort_keys=True)
    return (root or cache_root()) / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_checkpoint(name: str, root: Path | None = None) -> Path:
    """The checkpoint of shape ``name`` (built on first use): the hub's ``config.json`` as written in
    ``HUB_CONFIGS``, weights from transformers' own initialisation with ``torch.manual_seed(0)``, saved with
    ``save_pretrained`` in the config's ``torch_dtype``; built in a temporary directory and renamed into place.

    Raises:
        ValueError: ``name`` is not one of ``HUB_CONFIGS``.
    """
    if name not in HUB_CONFIGS:
        raise ValueError(f"--shapes: unknown shape {name!r}; choose from {sorted(HUB_CONFIGS)} or 'all'")
    final = checkpoint_dir(name, root)
    if (final / "config.json").is_file():
        return final
    from transformers import AutoConfig, AutoModelForCausalLM

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    tmp.mkdir()
    try:
        hub = HUB_CONFIGS[name]
        (tmp / "config.json").write_text(json.dumps(hub, indent=2))
        cfg = AutoConfig.from_pretrained(tmp)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.to(getattr(torch, hub["torch_dtype"])).save_pretrained(tmp)
        del model
        (tmp / "config.json").write_text(json.dumps(hub, indent=2))  # the hub's file, not transformers' rewrite
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---- single stream ---------------------------------------------------------------------------------------
def random_prompt(vocab: int, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def minengine_single(llm: LLM, prompt: list[int], decode_tokens: int) -> dict:
    """One request alone: its prefill step (the whole prompt, and the first token), then ``decode_tokens``
    decode steps, each step timed in wall and process CPU seconds. Returns the times and the output ids."""
    engine = llm.llm_engine
    engine.add_request(f"single-{time.monotonic_ns()}", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=decode_tokens + 1, ignore_eos=True))
    steps, ids = [], []
    while engine.has_unfinished_requests():
        t, c = time.perf_counter(), time.process_time()
        outs = engine.step()
        steps.append((time.perf_counter() - t, time.process_time() - c))
        ids = [o.outputs[0].token_ids for o in outs if o.finished] or ids
    if len(steps) != decode_tokens + 1:
        raise RuntimeError(f"expected 1 prefill + {decode_tokens} decode steps, the engine took {len(steps)}")
    return single_result(steps[0], steps[1:], len(prompt), list(ids[0]))


def single_result(prefill: tuple[float, float], decode: list[tuple[float, float]], prompt_len: int,
                  ids: list[int]) -> dict:
    """Rates from (wall s, CPU s) of the prefill and of each decode step."""
    wall, cpu = sum(w for w, _ in decode), sum(c for _, c in decode)
    return {"prefill_tok_s": prompt_len / prefill[0], "prefill_cpu_tok_s": prompt_len / max(prefill[1], 1e-9),
            "decode_tok_s": len(decode) / wall, "decode_cpu_tok_s": len(decode) / max(cpu, 1e-9),
            "decode_ms": 1e3 * wall / len(decode), "decode_cpu_ms": 1e3 * cpu / len(decode), "ids": ids}


class _TokenClock:
    """A transformers streamer that stamps (wall, CPU) at the prompt and at every new token."""

    def __init__(self):
        self.marks: list[tuple[float, float]] = []

    def put(self, value) -> None:
        self.marks.append((time.perf_counter(), time.process_time()))

    def end(self) -> None:
        pass


def hf_single(model, prompt: list[int], decode_tokens: int) -> dict:
    """transformers ``generate`` (greedy, no EOS) of ``decode_tokens + 1`` tokens: the prompt's forward and the
    first token, then ``decode_tokens`` steps, from the streamer's stamps."""
    clock = _TokenClock()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=decode_tokens + 1, min_new_tokens=decode_tokens + 1, do_sample=False,
                             eos_token_id=None, pad_token_id=0, streamer=clock)
    m = clock.marks
    if len(m) != decode_tokens + 2:
        raise RuntimeError(f"transformers streamed {len(m) - 1} tokens, expected {decode_tokens + 1}")
    steps = [(m[i + 1][0] - m[i][0], m[i + 1][1] - m[i][1]) for i in range(len(m) - 1)]
    return single_result(steps[0], steps[1:], len(prompt), out[0, len(prompt):].tolist())


# ---- llama.cpp (only when given) -------------------------------------------------------------------------
def llama_bench(binary: str, gguf: Path, threads: int, prompt_len: int, decode_tokens: int, repeats: int) -> dict:
    """``llama-bench`` on ``gguf``: pp (prompt) and tg (decode) tok/s, the median of its per-repeat samples (wall,
    its own timing), and the CPU seconds the child used (model load included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([binary, "-m", str(gguf), "-p", str(prompt_len), "-n", str(decode_tokens), "-t", str(threads),
                          "-r", str(repeats), "-o", "json"], capture_output=True, text=True, check=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tests = json.loads(out.stdout)

    def rate(entry: dict) -> float:
        return statistics.median(entry.get("samples_ts") or [entry["avg_ts"]])

    pp = next(rate(e) for e in tests if e["n_prompt"] > 0 and e["n_gen"] == 0)
    tg = next(rate(e) for e in tests if e["n_gen"] > 0 and e["n_prompt"] == 0)
    return {"prefill_tok_s": pp, "decode_tok_s": tg, "decode_ms": 1e3 / tg,
            "child_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


def _completion(url: str, prompt: list[int], n: int) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as resp:
        return json.loads(resp.read())


def llama_server_single(url: str, prompt: list[int], decode_tokens: int) -> dict:
    """One ``/completion`` of ``decode_tokens + 1`` tokens; the server's own timings (wall)."""
    t = _completion(url, prompt, decode_tokens + 1)["timings"]
    return {"prefill_tok_s": t["prompt_per_second"], "decode_tok_s": t["predicted_per_second"],
            "decode_ms": t["predicted_per_token_ms"]}


def llama_server_batched(url: str, work: list[tuple[list[int], int]]) -> float:
    """All requests at once, a client thread each; the wall seconds until the last one returned."""
    t = time.perf_counter()
    with ThreadPoolExecutor(len(work)) as pool:
        list(pool.map(lambda w: _completion(url, w[0], w[1]), work))
    return time.perf_counter() - t


# ---- one shape ---------------------------------------------------------------------------------------------
def load() -> list[float]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else []


def engine_for(path: Path, dtype: str, threads: int, max_model_len: int, num_seqs: int) -> LLM:
    return LLM(str(path), max_model_len=max_model_len, max_num_seqs=num_seqs, num_cpu_threads=threads,
               **DTYPES[dtype])


def load_hf(path: Path, dtype: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


def median_of(runs: list[dict]) -> dict:
    """Per key, the median over runs (numbers); ``ids`` of the first run."""
    keys = [k for k in runs[0] if k != "ids"]
    return {**{k: statistics.median(r[k] for r in runs) for k in keys}, "runs": [r["decode_tok_s"] for r in runs]}


def measure_single(a, path: Path, vocab: int, dtype: str, threads: int, hf) -> dict:
    """Single-stream rows of minengine (and transformers when ``hf``), alternating, median of ``a.repeats``."""
    llm = engine_for(path, dtype, threads, a.prompt_len + a.decode_tokens + 2, 1)
    prompts = [random_prompt(vocab, a.prompt_len, seed) for seed in range(a.repeats + 1)]
    before = load()
    torch.set_num_threads(threads)
    minengine_single(llm, prompts[-1], min(4, a.decode_tokens))  # warm-up, on a prompt of its own
    if hf is not None:
        hf_single(hf, prompts[-1][:32], 2)
    me, ref = [], []
    for p in prompts[:-1]:  # other prompts each time: no prefix-cache hit
        me.append(minengine_single(llm, p, a.decode_tokens))
        if hf is not None:
            ref.append(hf_single(hf, p, a.decode_tokens))
    out = {"minengine": {**median_of(me), "weight_bytes_per_step": weight_bytes_per_decode(llm)}}
    traces = list(llm.llm_engine.traces)
    out["prefill_trace"], out["decode_traces"] = traces[-a.decode_tokens - 1], traces[-a.decode_tokens:]
    if ref:
        out["transformers"] = median_of(ref)
        out["outputs_equal"] = sum(m["ids"] == r["ids"] for m, r in zip(me, ref))
    out["load_before"], out["load_after"] = before, load()
    del llm
    return out


def measure_batched(a, path: Path, vocab: int, dtype: str, threads: int, hf) -> dict:
    """The batched workload through ``throughput.run_minengine`` / ``run_hf_static`` (one static batch)."""
    rng = random.Random(1)
    work = [(random_prompt(vocab, a.batch_prompt_len, rng.randrange(1 << 30)), a.batch_output_len)
            for _ in range(a.batch_requests)]
    n_out = a.batch_requests * a.batch_output_len
    blocks = a.batch_requests * -(-(a.batch_prompt_len + a.batch_output_len + 1) // 16) + 16  # every request at once
    before = load()
    me, ref, traces = [], [], []
    for _ in range(a.repeats):
        t, cpu, me_ids, traces = run_minengine(str(path), work, max(2048, a.batch_prompt_len), threads,
                                               num_kv_blocks=blocks, **DTYPES[dtype])
        me.append({"tok_s": n_out / t, "cpu_tok_s": n_out / cpu, "wall_s": t, "cpu_s": cpu})
        if hf is not None:
            torch.set_num_threads(threads)
            t, cpu, hf_ids = run_hf_static(hf, work, len(work))
            ref.append({"tok_s": n_out / t, "cpu_tok_s": n_out / cpu, "wall_s": t, "cpu_s": cpu})
    out = {"minengine": {k: statistics.median(r[k] for r in me) for k in me[0]}, "traces": traces,
           "num_output_tokens": n_out}
    out["minengine"]["runs"] = [r["tok_s"] for r in me]
    if ref:
        out["transformers"] = {k: statistics.median(r[k] for r in ref) for k in ref[0]}
        out["transformers"]["runs"] = [r["tok_s"] for r in ref]
        out["outputs_equal"] = sum(list(m) == list(r) for m, r in zip(me_ids, hf_ids))
    out["load_before"], out["load_after"] = before, load()
    return out, work


def roofs(shape, threads: int, rows: int) -> dict:
    torch.set_num_threads(threads)
    gflops, gflops_cpu = measure_matmul_roof(shape, rows, repeats=3)
    copy, copy_cpu = measure_copy_bandwidths()
    return {"matmul_gflops": gflops, "matmul_cpu_gflops": gflops_cpu, "copy_gbytes_per_s": copy,
            "copy_cpu_gbytes_per_s": copy_cpu}


def run_shape(a, name: str, shapes: list[dict], saved) -> None:
    """Every dtype and thread count of one shape, appended to ``shapes`` as it goes (``saved()`` after each row)."""
    path = build_checkpoint(name)
    shape = model_shape(str(path))
    vocab = HUB_CONFIGS[name]["vocab_size"]
    result = {"shape": name, "checkpoint": str(path), "config": HUB_CONFIGS[name],
              "num_params": shape.num_params, "roofs": {}, "rows": []}
    shapes.append(result)
    for threads in a.threads:
        roof = result["roofs"][threads] = roofs(shape, threads, a.prompt_len)
        progress(f"[{name}] {threads} thread(s): matmul roof {roof['matmul_gflops']:.1f} GFLOP/s, copy "
                 f"{roof['copy_gbytes_per_s']:.1f} GB/s")
    for dtype in a.dtypes:  # dtype by dtype, so a run cut short has every thread count of the first ones
        hf = load_hf(path, dtype) if dtype in ("float32", "bfloat16") and not a.skip_transformers else None
        for threads in a.threads:
            row = measure_row(a, name, path, shape, vocab, dtype, threads, result["roofs"][threads], hf)
            compare_int8(row, result["rows"])
            result["rows"].append(row)
            print(row_line(row), flush=True)
            saved()
        del hf
    if a.llama_server:
        result["llama_server"] = ls = measure_llama_server(a, vocab)
        match = [r for r in result["rows"] if r["dtype"] == ls["dtype"] and r["threads"] == ls["threads"]]
        if match:
            ls["ratios"] = ratios(match[0]["minengine"], ls, "llama-server")
        saved()


def measure_row(a, name, path, shape, vocab, dtype, threads, roof, hf) -> dict:
    progress(f"[{name}] {dtype}, {threads} thread(s): single stream")
    single = measure_single(a, path, vocab, dtype, threads, hf)
    progress(f"[{name}] {dtype}, {threads} thread(s): batched")
    batched, work = measure_batched(a, path, vocab, dtype, threads, hf)
    me = single["minengine"]
    prefill_flops, _, _ = run_work(shape, [single["prefill_trace"]], roof["matmul_gflops"], roof["copy_gbytes_per_s"])
    batch_flops, _, _ = run_work(shape, batched["traces"], roof["matmul_gflops"], roof["copy_gbytes_per_s"])
    step_bytes = me["weight_bytes_per_step"]
    m = {"single": me, "batched": batched["minengine"],
         "prefill_gflops": prefill_flops / 1e9 * me["prefill_tok_s"] / a.prompt_len,
         "prefill_cpu_gflops": prefill_flops / 1e9 * me["prefill_cpu_tok_s"] / a.prompt_len,
         "decode_gbytes_per_s": step_bytes / me["decode_ms"] * 1e3 / 1e9,
         "decode_cpu_gbytes_per_s": step_bytes / me["decode_cpu_ms"] * 1e3 / 1e9,
         "batched_gflops": batch_flops / 1e9 / batched["minengine"]["wall_s"],
         "batched_cpu_gflops": batch_flops / 1e9 / batched["minengine"]["cpu_s"]}
    # fractions of the roofs: wall against the wall roofs, CPU time against the CPU-time roofs
    m["decode_bandwidth_fraction"] = m["decode_gbytes_per_s"] / roof["copy_gbytes_per_s"]
    m["decode_bandwidth_fraction_cpu"] = m["decode_cpu_gbytes_per_s"] / roof["copy_cpu_gbytes_per_s"]
    for part in ("prefill", "batched"):
        m[f"{part}_roof_fraction"] = m[f"{part}_gflops"] / roof["matmul_gflops"]
        m[f"{part}_roof_fraction_cpu"] = m[f"{part}_cpu_gflops"] / roof["matmul_cpu_gflops"]
    row = {"shape": name, "dtype": dtype, "threads": threads, "minengine": m,
           "load_before": single["load_before"], "load_after": batched["load_after"]}
    if "transformers" in single:
        hf = single["transformers"]
        row["transformers"] = {"single": hf, "batched": batched["transformers"],
                               "decode_gbytes_per_s": me["weight_bytes_per_step"] / (hf["decode_ms"] / 1e3) / 1e9}
        row["outputs_equal"] = {"single": f"{single['outputs_equal']}/{a.repeats}",
                                "batched": f"{batched['outputs_equal']}/{len(work)}"}
        row["ratios"] = ratios(row["minengine"], row["transformers"], "transformers")
    if a.llama_bench:
        gguf = path / f"ggml-model-{GGUF_TYPES[dtype]}.gguf"
        if gguf.is_file():
            row["llama_bench"] = llama_bench(a.llama_bench, gguf, threads, a.prompt_len, a.decode_tokens, a.repeats)
            row["ratios_llama_bench"] = ratios(row["minengine"], {"single": row["llama_bench"]}, "llama.cpp")
        else:
            row["llama_bench_skipped"] = f"{gguf} not found (see the docstring to convert it)"
    return row


def compare_int8(row: dict, earlier: list[dict]) -> None:
    """An int8 row's ratios against the float32 row of the same thread count measured before it: transformers
    float32 (it has no int8 here) and minengine float32 (the issue's "int8 decode >= 1.6x float32")."""
    base = [r for r in earlier if r["dtype"] == "float32" and r["threads"] == row["threads"]]
    if row["dtype"] != "int8" or not base:
        return
    if "transformers" in base[0]:
        row["ratios"] = ratios(row["minengine"], base[0]["transformers"], "transformers float32")
    me, ref = row["minengine"]["single"], base[0]["minengine"]["single"]
    batched, batched_ref = row["minengine"]["batched"], base[0]["minengine"]["batched"]
    row["int8_over_float32"] = {"decode": me["decode_tok_s"] / ref["decode_tok_s"],
                                "decode_cpu": me["decode_cpu_tok_s"] / ref["decode_cpu_tok_s"],
                                "batched": batched["tok_s"] / batched_ref["tok_s"],
                                "batched_cpu": batched["cpu_tok_s"] / batched_ref["cpu_tok_s"]}


def ratios(me: dict, peer: dict, name: str) -> dict:
    """minengine / peer: > 1 means minengine is faster. CPU-time ratios only where the peer has CPU time."""
    s, p = me["single"], peer["single"]
    out = {"prefill": s["prefill_tok_s"] / p["prefill_tok_s"], "decode": s["decode_tok_s"] / p["decode_tok_s"]}
    if "decode_cpu_tok_s" in p:
        out["prefill_cpu"] = s["prefill_cpu_tok_s"] / p["prefill_cpu_tok_s"]
        out["decode_cpu"] = s["decode_cpu_tok_s"] / p["decode_cpu_tok_s"]
    if "batched" in peer:
        out["batched"] = me["batched"]["tok_s"] / peer["batched"]["tok_s"]
        if "cpu_tok_s" in peer["batched"]:
            out["batched_cpu"] = me["batched"]["cpu_tok_s"] / peer["batched"]["cpu_tok_s"]
    return {"peer": name, **out}


def measure_llama_server(a, vocab: int) -> dict:
    """The server peer, at the thread count and dtype it was started with (``--llama-server-threads/-dtype``)."""
    prompts = [random_prompt(vocab, a.prompt_len, seed) for seed in range(a.repeats + 1)]
    llama_server_single(a.llama_server, prompts[-1][:32], 2)  # warm-up
    single = [llama_server_single(a.llama_server, p, a.decode_tokens) for p in prompts[:-1]]
    rng = random.Random(1)
    work = [(random_prompt(vocab, a.batch_prompt_len, rng.randrange(1 << 30)), a.batch_output_len)
            for _ in range(a.batch_requests)]
    walls = [llama_server_batched(a.llama_server, work) for _ in range(a.repeats)]
    n_out = a.batch_requests * a.batch_output_len
    return {"threads": a.llama_server_threads, "dtype": a.llama_server_dtype,
            "single": {k: statistics.median(r[k] for r in single) for k in single[0]},
            "batched": {"tok_s": n_out / statistics.median(walls), "wall_s": statistics.median(walls),
                        "runs": [n_out / w for w in walls]}}


# ---- output ------------------------------------------------------------------------------------------------
_START = (time.perf_counter(), time.process_time())


def progress(text: str) -> None:
    """A line on stderr with the wall and CPU seconds since the start and the load average."""
    print(f"{time.perf_counter() - _START[0]:7.1f} s wall, {time.process_time() - _START[1]:7.1f} s CPU, load "
          f"{_loads(load())}: {text}", file=sys.stderr, flush=True)


def row_line(r: dict) -> str:
    me = r["minengine"]
    text = (f"[{r['shape']}] {r['dtype']:>8} {r['threads']}t minengine: prefill {me['single']['prefill_tok_s']:.0f} "
            f"tok/s, decode {me['single']['decode_tok_s']:.1f} tok/s ({me['single']['decode_ms']:.1f} ms/step, "
            f"{me['decode_gbytes_per_s']:.1f} GB/s), batched {me['batched']['tok_s']:.0f} tok/s")
    if "ratios" in r:
        x = r["ratios"]
        text += (f" | vs transformers: prefill {x['prefill']:.2f}x, decode {x['decode']:.2f}x (CPU "
                 f"{x['decode_cpu']:.2f}x), batched {x['batched']:.2f}x (CPU {x['batched_cpu']:.2f}x)")
    if "outputs_equal" in r:
        text += f", equal {r['outputs_equal']['single']} / {r['outputs_equal']['batched']}"
    if "int8_over_float32" in r:
        text += f" | int8 / float32 decode {r['int8_over_float32']['decode']:.2f}x"
    if "ratios_llama_bench" in r:
        text += f" | vs llama-bench: decode {r['ratios_llama_bench']['decode']:.2f}x"
    return text


def _fmt(x, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    info, s = result["machine"], result["settings"]
    lines = [f"# Real-shape benchmark: minengine vs transformers{' and llama.cpp' if result['llama_ran'] else ''}",
             "",
             f"Generated by `python benchmarks/real_shape.py {' '.join(result['argv'])}` on {result['date']}: "
             f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}, transformers {result['transformers']}; "
             f"native bf16: {'yes' if result['bf16_native'] else 'no'} (bf16/AMX CPU flags: "
             f"{', '.join(result['cpu_flags']) or 'none'}); load average (1/5/15 min) before "
             f"{_loads(result['load_before'])}, after {_loads(result['load_after'])}; total "
             f"{result['elapsed_s']:.0f} s wall, {result['cpu_s']:.0f} s CPU. Random weights with each model's exact "
             f"config; medians of {s['repeats']} timed runs after a warm-up, minengine and transformers in turn.",
             "" if result["complete"] else "\n**Partial: the run had not finished when this was written; the rows "
             "below are the ones it measured.**\n",
             f"Single stream: a {s['prompt_len']}-token prompt (prefill: the step that computes it and samples the "
             f"first token), then {s['decode_tokens']} decode steps. Batched: {s['batch_requests']} requests x "
             f"({s['batch_prompt_len']} prompt + {s['batch_output_len']} output) tokens, output tokens per second "
             f"(transformers: one static batch). 'x hf': minengine / transformers (> 1: minengine faster), in wall "
             f"time and in CPU time (this process's `time.process_time`; on a busy machine wall time also counts "
             f"other processes' turns on the cores). int8 is minengine's `quantization=\"int8\"`, compared with "
             f"transformers float32. Decode GB/s: the weight bytes a decode step reads (decoder linear layers and "
             f"LM head) / step time, and its share of the copy bandwidth measured in the run (CPU time against "
             f"the CPU-time copy rate); '% roof': GFLOP/s of minengine's steps (step cost model) / the float32 "
             f"matmul roof measured in the run (CPU time against CPU time).",
             ""]
    for shape in result["shapes"]:
        lines += [f"## {shape['shape']} ({shape['num_params'] / 1e6:.1f} M parameters)", "",
                  "| threads | matmul roof GFLOP/s (wall / CPU) | copy GB/s (wall / CPU) |", "|---:|---:|---:|"]
        lines += [f"| {t} | {r['matmul_gflops']:.1f} / {r['matmul_cpu_gflops']:.1f} | {r['copy_gbytes_per_s']:.1f} / "
                  f"{r['copy_cpu_gbytes_per_s']:.1f} |" for t, r in shape["roofs"].items()]
        lines += ["", "Single stream:", "",
                  "| dtype | threads | prefill tok/s | x hf (wall / CPU) | % roof (CPU) | decode tok/s | ms/step "
                  "(wall / CPU) | hf decode tok/s | x hf (wall / CPU) | decode GB/s (CPU) | % copy (CPU) | "
                  "outputs = hf | load before → after |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        lines += [single_line(r, result["bf16_native"]) for r in shape["rows"]]
        lines += ["", "Batched:", "",
                  "| dtype | threads | tok/s | CPU s | hf tok/s | hf CPU s | x hf (wall / CPU) | % roof (wall / CPU) "
                  "| outputs = hf |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [batched_line(r, result["bf16_native"]) for r in shape["rows"]]
        lines += [f"\nint8 / float32 (minengine, {r['threads']} thread(s)): decode {x['decode']:.2f}x (CPU time "
                  f"{x['decode_cpu']:.2f}x), batched {x['batched']:.2f}x (CPU time {x['batched_cpu']:.2f}x)."
                  for r in shape["rows"] if (x := r.get("int8_over_float32"))]
        lines += llama_lines(shape)
        lines.append("")
    return "\n".join(lines)


def _label(r: dict, bf16_native: bool) -> str:
    return r["dtype"] + (" (not native)" if r["dtype"] == "bfloat16" and not bf16_native else "")


def single_line(r: dict, bf16_native: bool) -> str:
    me, x = r["minengine"], r.get("ratios", {})
    s, hf = me["single"], r.get("transformers", {}).get("single", {})
    return (f"| {_label(r, bf16_native)} | {r['threads']} | {s['prefill_tok_s']:.0f} | "
            f"{_fmt(x.get('prefill'), '.2f')} / {_fmt(x.get('prefill_cpu'), '.2f')} | "
            f"{100 * me['prefill_roof_fraction_cpu']:.0f} % | {s['decode_tok_s']:.1f} | {s['decode_ms']:.1f} / "
            f"{s['decode_cpu_ms']:.1f} | {_fmt(hf.get('decode_tok_s'))} | {_fmt(x.get('decode'), '.2f')} / "
            f"{_fmt(x.get('decode_cpu'), '.2f')} | {me['decode_gbytes_per_s']:.1f} "
            f"({me['decode_cpu_gbytes_per_s']:.1f}) | {100 * me['decode_bandwidth_fraction']:.0f} % "
            f"({100 * me['decode_bandwidth_fraction_cpu']:.0f} %) | "
            f"{r.get('outputs_equal', {}).get('single', '—')} | {_loads(r['load_before'])} → "
            f"{_loads(r['load_after'])} |")


def batched_line(r: dict, bf16_native: bool) -> str:
    me, x = r["minengine"], r.get("ratios", {})
    b, hf = me["batched"], r.get("transformers", {}).get("batched", {})
    return (f"| {_label(r, bf16_native)} | {r['threads']} | {b['tok_s']:.0f} | {b['cpu_s']:.1f} | "
            f"{_fmt(hf.get('tok_s'), '.0f')} | {_fmt(hf.get('cpu_s'))} | {_fmt(x.get('batched'), '.2f')} / "
            f"{_fmt(x.get('batched_cpu'), '.2f')} | {100 * me['batched_roof_fraction']:.0f} % / "
            f"{100 * me['batched_roof_fraction_cpu']:.0f} % | {r.get('outputs_equal', {}).get('batched', '—')} |")


def llama_lines(shape: dict) -> list[str]:
    rows = [r for r in shape["rows"] if "llama_bench" in r]
    out = []
    if rows:
        out += ["", "llama.cpp (`llama-bench`, wall):", "", "| dtype | threads | prefill tok/s | decode tok/s | "
                "minengine / llama.cpp prefill | decode |", "|---|---:|---:|---:|---:|---:|"]
        out += [f"| {r['dtype']} | {r['threads']} | {r['llama_bench']['prefill_tok_s']:.0f} | "
                f"{r['llama_bench']['decode_tok_s']:.1f} | {r['ratios_llama_bench']['prefill']:.2f}x | "
                f"{r['ratios_llama_bench']['decode']:.2f}x |" for r in rows]
    if "llama_server" in shape:
        ls = shape["llama_server"]
        out += ["", f"llama.cpp server ({ls['dtype']}, {ls['threads']} thread(s), wall): prefill "
                f"{ls['single']['prefill_tok_s']:.0f} tok/s, decode {ls['single']['decode_tok_s']:.1f} tok/s, batched "
                f"{ls['batched']['tok_s']:.0f} tok/s; minengine / server: " + ", ".join(
                    f"{k} {v:.2f}x" for k, v in ls.get("ratios", {}).items() if k != "peer")]
    return out


def _loads(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "n/a"


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted({f for f in line.split(":", 1)[1].split() if "bf16" in f or f.startswith("amx")})
    except OSError:
        pass
    return []


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm-135m", help=f"comma-separated of {list(HUB_CONFIGS)}, or 'all' "
                    f"(= {', '.join(REAL_SHAPES)})")
    ap.add_argument("--dtypes", default="float32,int8,bfloat16", help=f"comma-separated of {list(DTYPES)} (int8 "
                    "after float32 to be compared with it)")
    ap.add_argument("--threads", type=parse_threads, default=parse_threads("1,2"))
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per system after the warm-up (median)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--batch-requests", type=int, default=32)
    ap.add_argument("--batch-prompt-len", type=int, default=64)
    ap.add_argument("--batch-output-len", type=int, default=32)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--llama-bench", default=None, help="path of llama.cpp's llama-bench binary")
    ap.add_argument("--llama-server", default=None, help="URL of a running llama-server (e.g. http://127.0.0.1:8080)")
    ap.add_argument("--llama-server-threads", type=int, default=1, help="the -t the server was started with")
    ap.add_argument("--llama-server-dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for real_shape.{md,json}")
    ap.add_argument("--print-checkpoint", default=None, metavar="SHAPE", help="build SHAPE, print its dir, exit")
    a = ap.parse_args(argv)
    a.shapes = list(REAL_SHAPES) if a.shapes == "all" else [s.strip() for s in a.shapes.split(",")]
    a.dtypes = [d.strip() for d in a.dtypes.split(",")]
    for s in a.shapes:
        if s not in HUB_CONFIGS:
            ap.error(f"--shapes: unknown shape {s!r}; choose from {list(HUB_CONFIGS)} or 'all'")
    for d in a.dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: unknown dtype {d!r}; choose from {list(DTYPES)}")
    for field in ("repeats", "prompt_len", "decode_tokens", "batch_requests", "batch_prompt_len", "batch_output_len"):
        if getattr(a, field) < 1:
            ap.error(f"--{field.replace('_', '-')} must be >= 1, got {getattr(a, field)}")
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.print_checkpoint:
        print(build_checkpoint(a.print_checkpoint))
        return {}
    import transformers

    start, start_cpu = time.perf_counter(), time.process_time()
    info, flags = machine_info(), cpu_flags()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "argv": argv if argv is not None else sys.argv[1:], "machine": info,
              "transformers": transformers.__version__, "cpu_flags": flags,
              "bf16_native": any(f in flags for f in ("avx512_bf16", "amx_bf16")),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
              "load_before": load(), "complete": False, "shapes": []}
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}; bf16/AMX CPU flags: {flags or 'none'}; "
          f"load average {_loads(result['load_before'])}", flush=True)

    def save(complete: bool) -> None:  # after every row, so a run cut short keeps what it measured
        llama_ran = any("llama_server" in sh or any("llama_bench" in r for r in sh["rows"]) for sh in result["shapes"])
        result.update(load_after=load(), elapsed_s=time.perf_counter() - start, cpu_s=time.process_time() - start_cpu,
                      complete=complete, llama_ran=llama_ran)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "real_shape.json").write_text(json.dumps(result, indent=2))
        (a.out / "real_shape.md").write_text(markdown(result))

    for name in a.shapes:
        run_shape(a, name, result["shapes"], lambda: save(False))
    save(True)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
