"""How many torch CPU threads the engine should use: a sweep, idle and with another process busy.

On a shared machine the default (one intra-op thread per core) makes every small per-layer op wait for threads
that another process holds; one thread per engine avoids the wait. This script measures it instead of assuming:
the same offline workload (bundled model, greedy, fixed lengths) at each ``--threads`` setting, alternating the
settings, ``--repeats`` times after a warm-up, reporting medians. ``--busy N`` starts N busy-loop processes
(``python -c 'while True: pass'``) for the loaded measurements and stops them at the end.

    python benchmarks/cpu_threads.py                       # threads 1 and 2, idle and with 1 busy process
    python benchmarks/cpu_threads.py --threads 1 2 4 --busy 2 --repeats 7

The engine's default (``EngineConfig.num_cpu_threads``) was chosen from this measurement (docs/time.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from minengine import LLM, SamplingParams


def workload(n: int, prompt_len: int, max_tokens: int) -> tuple[list[dict], list[SamplingParams]]:
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 2000 + 1 for j in range(prompt_len)]} for i in range(n)]
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True) for _ in range(n)]
    return prompts, params


def time_once(llm: LLM, threads: int, prompts, params) -> float:
    torch.set_num_threads(threads)
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - started


def measure(llm: LLM, thread_settings: list[int], repeats: int, prompts, params) -> dict[int, float]:
    for t in thread_settings:  # warm-up at every setting (thread pools, allocator, caches)
        time_once(llm, t, prompts[:4], params[:4])
    samples: dict[int, list[float]] = {t: [] for t in thread_settings}
    for _ in range(repeats):
        for t in thread_settings:  # alternate, so slow phases of the machine hit every setting alike
            samples[t].append(time_once(llm, t, prompts, params))
    return {t: statistics.median(s) for t, s in samples.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to compare")
    p.add_argument("--busy", type=int, default=1, help="busy-loop processes for the loaded measurement")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    a = p.parse_args(argv)
    if any(t < 1 for t in a.threads) or a.busy < 0 or a.repeats < 1:
        raise SystemExit("--threads must be >= 1, --busy >= 0, --repeats >= 1")
    llm = LLM(max_num_batched_tokens=512, max_num_seqs=a.num_requests, num_kv_blocks=512, max_model_len=1024,
              num_cpu_threads=None)
    prompts, params = workload(a.num_requests, a.prompt_len, a.max_tokens)
    tokens = a.num_requests * a.max_tokens
    print(f"{os.cpu_count()} CPUs; workload: {a.num_requests} requests x ({a.prompt_len} prompt + {a.max_tokens} "
          f"output) tokens, bundled model, float32; medians of {a.repeats} after a warm-up")
    rows = [("idle", measure(llm, a.threads, a.repeats, prompts, params))]
    if a.busy:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        try:
            time.sleep(0.5)
            rows.append((f"{a.busy} busy process{'es' if a.busy > 1 else ''}",
                         measure(llm, a.threads, a.repeats, prompts, params)))
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
    best = min(a.threads)
    print("\n| machine state | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in a.threads) + " |")
    print("|---|" + "---:|" * len(a.threads))
    for name, med in rows:
        cells = [f"{med[t]:.2f} s ({tokens / med[t]:.0f} tok/s, {med[t] / med[best]:.2f}x)" for t in a.threads]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
