"""Decode steps eager vs compiled (``torch.compile``, ``worker/compiled_decode.py``) on SmolLM-135M's shape.

Issue 35, "fewer, fused small ops on the decode path". A random-weight Llama with SmolLM-135M's exact config (built
with ``save_pretrained``, no download; ``benchmarks/quantization.real_shaped_model``), two engines in one process:
``enforce_eager=True`` and ``enforce_eager=False`` (the default for this size compiles too). For torch threads 1
and 2, taken in turn ``--repeats`` times after a warm-up (which also compiles):

- single stream: one request with a ``--prompt-len`` prompt, its prefill untimed, then ``--steps`` decode steps;
- batch: ``--batch`` requests prefilled together (untimed), then ``--batch-steps`` steps in which all of them decode.

Each row is the median over the repeats of the per-step wall time and CPU time (``time.process_time``: on a
shared machine wall time also counts other processes' turns on the cores), with the load average before and after.
Compile time, cold (an empty Inductor cache) and warm (the cache the cold run filled), is the first decode step's
time minus a compiled step's, each in a fresh process (Dynamo traces again in every process). The eager step's
count of aten ops (``TorchDispatchMode``) is printed beside it.

    python benchmarks/compile_decode.py --write       # ~20-30 minutes on 2 shared cores
Prints Markdown; ``--write`` also writes ``benchmarks/results/compile_decode.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.quantization import real_shaped_model  # noqa: E402
from benchmarks.throughput import machine_info  # noqa: E402
from minengine import LLM, SamplingParams  # noqa: E402
from minengine.layers import cpu_attention  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {"eager": True, "compiled": False}  # name -> enforce_eager


def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def prompt(i: int, length: int) -> list[int]:
    return [(7 * i + 13 * j) % 4000 + 100 for j in range(length)]


def decode_steps(llm: LLM, num_requests: int, prompt_len: int, steps: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per step of ``steps`` decode steps of ``num_requests`` requests, after their prefill."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", {"prompt_token_ids": prompt(i, prompt_len)}, params)
    while engine.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                                          for r in engine.scheduler.running):
        engine.step()  # prefills (the first token of each comes with its last chunk)
    wall, cpu, n = time.perf_counter(), time.process_time(), 0
    while engine.has_unfinished_requests():
        engine.step()
        n += 1
    return (time.perf_counter() - wall) / n * 1e3, (time.process_time() - cpu) / n * 1e3


def aten_ops_per_step(llm: LLM, prompt_len: int) -> int:
    """aten ops one eager single-stream decode step's forward dispatches (prefill first, not counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    engine = llm.llm_engine
    engine.add_request("count", {"prompt_token_ids": prompt(0, prompt_len)},
                       SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.step()
    runner, forward = engine.runner, engine.runner.model.forward

    def counted(batch, kv_caches):
        with Count():
            return forward(batch, kv_caches)

    runner.model.forward = counted
    try:
        engine.step()
    finally:
        del runner.model.forward
    while engine.has_unfinished_requests():
        engine.step()
    return Count.n


def compile_time(path: str, cache_dir: str, prompt_len: int) -> dict:
    """In a fresh process with Inductor's cache in ``cache_dir``: the first compiled decode step's wall and CPU
    seconds, and a later step's (``--first-step`` mode of this script)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, __file__, "--first-step", path, "--prompt-len", str(prompt_len)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_step(path: str, prompt_len: int) -> None:
    torch.set_num_threads(1)
    cpu_attention.get_kernel()
    llm = LLM(path, enforce_eager=False, max_model_len=1024)
    times = []
    engine = llm.llm_engine
    engine.add_request("first", {"prompt_token_ids": prompt(0, prompt_len)},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()  # prefill: eager
    while engine.has_unfinished_requests():
        wall, cpu = time.perf_counter(), time.process_time()
        engine.step()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    assert engine.runner.graphs.num_replays == len(times) and engine.runner.graphs.failed is None
    print(json.dumps({"first_wall_s": times[0][0], "first_cpu_s": times[0][1], "step_wall_s": times[-1][0],
                      "step_cpu_s": times[-1][1]}))


def measure(args) -> dict:
    cpu_attention.get_kernel()
    with tempfile.TemporaryDirectory() as tmp:
        path = real_shaped_model(Path(tmp), args.layers)
        result = {"load_before": os.getloadavg() if hasattr(os, "getloadavg") else None, "rows": []}
        with tempfile.TemporaryDirectory() as cache:
            result["compile_cold"] = compile_time(path, cache, args.prompt_len)
            result["compile_warm"] = compile_time(path, cache, args.prompt_len)
        max_len = args.prompt_len + max(args.steps, args.batch_steps) + 2
        llms = {name: LLM(path, enforce_eager=eager, max_model_len=max_len, max_num_seqs=max(args.batch, 1))
                for name, eager in MODES.items()}
        result["aten_ops_eager_step"] = aten_ops_per_step(llms["eager"], args.prompt_len)
        for threads in args.threads:
            torch.set_num_threads(threads)
            for llm in llms.values():  # warm-up (the compiled engine compiles here, at the first threads)
                decode_steps(llm, 1, args.prompt_len, 4)
                decode_steps(llm, args.batch, args.batch_prompt_len, 2)
            times = {(name, b): [] for name in llms for b in (1, args.batch)}
            for _ in range(args.repeats):
                for name, llm in llms.items():
                    times[name, 1].append(decode_steps(llm, 1, args.prompt_len, args.steps))
                    times[name, args.batch].append(decode_steps(llm, args.batch, args.batch_prompt_len,
                                                                args.batch_steps))
            for (name, b), ts in times.items():
                result["rows"].append({"threads": threads, "mode": name, "batch": b,
                                       "wall_ms": statistics.median(w for w, _ in ts),
                                       "cpu_ms": statistics.median(c for _, c in ts)})
        graphs = llms["compiled"].llm_engine.runner.graphs
        result["compiled_steps"], result["eager_fallbacks"] = graphs.num_replays, graphs.num_eager_fallbacks
        result["recompiles"] = dict(torch._dynamo.utils.counters["stats"])
        result["load_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    base = {(r["threads"], r["batch"]): r for r in result["rows"] if r["mode"] == "eager"}
    for r in result["rows"]:
        e = base[r["threads"], r["batch"]]
        r["cpu_speedup"], r["wall_speedup"] = e["cpu_ms"] / r["cpu_ms"], e["wall_ms"] / r["wall_ms"]
    return result


def report(result: dict, args) -> str:
    lines = ["# Decode steps, eager vs torch.compile (SmolLM-135M's shape, random weights)", "",
             f"Machine: {machine_info()}; load average before {result['load_before']}, after "
             f"{result['load_after']}. Prompt {args.prompt_len} tokens (single stream), {args.batch} requests of "
             f"{args.batch_prompt_len} (batch); medians of {args.repeats} repeats of {args.steps} / "
             f"{args.batch_steps} steps.", "",
             "| threads | batch | mode | CPU ms/step | wall ms/step | CPU speed-up | wall speed-up |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in sorted(result["rows"], key=lambda r: (r["threads"], r["batch"], r["mode"] != "eager")):
        lines.append(f"| {r['threads']} | {r['batch']} | {r['mode']} | {r['cpu_ms']:.1f} | {r['wall_ms']:.1f} | "
                     f"{r['cpu_speedup']:.2f}x | {r['wall_speedup']:.2f}x |")
    cold, warm = result["compile_cold"], result["compile_warm"]
    cold_wall, cold_cpu = cold["first_wall_s"] - cold["step_wall_s"], cold["first_cpu_s"] - cold["step_cpu_s"]
    warm_wall, warm_cpu = warm["first_wall_s"] - warm["step_wall_s"], warm["first_cpu_s"] - warm["step_cpu_s"]
    lines += ["", f"Compile time (first decode step minus a compiled step, 1 thread, fresh process): cold cache "
              f"{cold_wall:.1f} s wall / {cold_cpu:.1f} s CPU; warm cache {warm_wall:.1f} s wall / {warm_cpu:.1f} s "
              "CPU (the compiling process's CPU time; Inductor's C++ compiler runs in child processes).",
              f"aten ops dispatched by one eager single-stream decode forward: {result['aten_ops_eager_step']}.",
              f"Compiled engine: {result['compiled_steps']} steps compiled, {result['eager_fallbacks']} eager "
              f"(prefills); Dynamo stats {result['recompiles']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, default=30, help="of SmolLM-135M's 30 (fewer: a quick check)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batch-prompt-len", type=int, default=64)
    parser.add_argument("--batch-steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--first-step", metavar="MODEL", help=argparse.SUPPRESS)  # compile_time's child
    args = parser.parse_args(argv)
    if args.first_step:
        first_step(args.first_step, args.prompt_len)
        return None
    result = measure(args)
    text = report(result, args)
    print(text)
    if args.write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "compile_decode.md").write_text(text)
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        (RESULTS / "compile_decode.json").write_text(json.dumps({"date": stamp, "args": vars(args), **result},
                                                                indent=1, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
