"""Speculative decoding by prompt lookup (n-gram): tokens per step and TPOT with and without speculation.

Issue 11, part 2. Three workloads on the bundled tiny model, ``ignore_eos``, all requests at once:

- copy (repetitive, "summarisation-style"): a Tiny Shakespeare passage, then its first 16 tokens again, greedy:
  the model goes on copying the passage from its prompt, and prompt lookup (Saxena, 2023) proposes the copy;
- random, greedy: prompts of uniformly random token ids. Nothing in the prompt to copy, but a tiny model's
  greedy output soon repeats ITSELF, and prompt lookup searches the output too: acceptance stays substantial;
- random, sampled: the same prompts, temperature 1 with a seed per request (the verification is exact for
  seeded sampling): the output barely repeats, so there are few proposals and most are rejected.

For each workload and each ``num_speculative_tokens`` k (0 = off) it reports tokens per decode (1 + accepted
proposals per request-step), steps, acceptance rate, the TPOT on the MODELLED clock (``--hardware``,
``--model-shape``: the roofline time of each step; verifying k + 1 tokens in a memory-bound decode costs little
more than one, which is where speculation pays, Leviathan et al. 2023) and the MEASURED TPOT of the tiny model on
this CPU (process CPU time per step, torch at one thread, one warm-up run, the median over ``--repeats`` runs of
the median request TPOT). Outputs are checked to be token-identical with and without speculation.

    python benchmarks/spec_decode.py                 # ~1-2 minutes on 2 CPU cores
    python benchmarks/spec_decode.py --ks 0 2 4 8 --repeats 5
Prints a Markdown table; ``--write`` also writes ``benchmarks/results/spec_decode.md``.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from minengine import EngineConfig, LLMEngine, SamplingParams
from minengine.config import BUNDLED_MODEL
from minengine.core.spec_decode import SpecDecodeStats
from minengine.timing import ClockSpec
from minengine.workloads import find_data_dir

RESULTS = Path(__file__).resolve().parent / "results" / "spec_decode.md"
FALLBACK_TEXT = ("ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
                 "Arise, fair sun, and kill the envious moon,\nWho is already sick and pale with grief,\n") * 8


def workloads(tokenizer, num_requests: int, prompt_len: int, max_tokens: int,
              seed: int) -> dict[str, tuple[list[list[int]], list[SamplingParams]]]:
    """name -> (``num_requests`` prompts, their sampling parameters): "copy" (passage + its start again,
    greedy), "random, greedy" and "random, sampled" (random ids; temperature 1, seed i for request i)."""
    data = find_data_dir(None)
    path = data / "text" / "tinyshakespeare.txt" if data is not None else None
    text = path.read_text() if path is not None and path.exists() else FALLBACK_TEXT
    ids = tokenizer(text[:200_000])["input_ids"]
    rng = random.Random(seed)
    repetitive = []
    for _ in range(num_requests):
        start = rng.randrange(0, len(ids) - prompt_len)
        passage = ids[start:start + prompt_len]
        repetitive.append(passage + passage[:16])  # the model continues the copy
    vocab = len(tokenizer)
    rand = [[rng.randrange(3, vocab) for _ in range(prompt_len + 16)] for _ in range(num_requests)]
    greedy = [SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)] * num_requests
    sampled = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=True)
               for i in range(num_requests)]
    return {"copy": (repetitive, greedy), "random, greedy": (rand, greedy), "random, sampled": (rand, sampled)}


def run(model: str, prompts: list[list[int]], params: list[SamplingParams], k: int, clock: ClockSpec) -> LLMEngine:
    spec = None if k == 0 else {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
                                "prompt_lookup_max": 4}
    engine = LLMEngine(EngineConfig(model=model, max_model_len=2048, max_num_batched_tokens=512,
                                    speculative_config=spec, trace_block_tables=False), clock=clock.make())
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, sp)
    engine.outputs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                engine.outputs[o.request_id] = o.outputs[0].token_ids
    return engine


def median_tpot(engine: LLMEngine) -> float:
    return statistics.median(m.tpot for m in engine.request_metrics.values() if m.tpot is not None)


def tokens_per_decode(engine: LLMEngine) -> float:
    """Tokens a decode chunk produced on average: 1 + its accepted proposals (1 without speculation)."""
    decodes = [c for t in engine.traces for c in t.chunks if c.sampled and not c.is_prefill]
    return statistics.fmean(1 + c.num_accepted_tokens for c in decodes)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the benchmark (see the module docstring); returns one row per (workload, k)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=BUNDLED_MODEL)
    p.add_argument("--ks", type=int, nargs="*", default=[0, 2, 4, 8], help="num_speculative_tokens (0 = off)")
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=96, help="passage tokens (the prompt has 16 more)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3, help="measured runs per setting (after one warm-up)")
    p.add_argument("--hardware", default="h100")
    p.add_argument("--model-shape", default="llama-3-8b")
    p.add_argument("--write", action="store_true", help="write the table to --out")
    p.add_argument("--out", default=str(RESULTS), help="the Markdown file --write writes")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    modelled = ClockSpec("modelled", hardware=a.hardware, model=a.model_shape)
    measured = ClockSpec("cpu")
    from transformers import AutoTokenizer

    loads = workloads(AutoTokenizer.from_pretrained(a.model), a.num_requests, a.prompt_len, a.max_tokens, seed=0)
    started = time.perf_counter()
    warm_prompts, warm_params = loads["copy"]
    run(a.model, warm_prompts[:2], warm_params[:2], 4, measured)  # warm-up (allocator, kernels)
    rows = []
    for name, (prompts, params) in loads.items():
        reference = None
        for k in a.ks:
            m = run(a.model, prompts, params, k, modelled)
            stats = SpecDecodeStats.of_steps(m.traces)
            if reference is None:
                reference = m.outputs
            same = m.outputs == reference
            cpu = statistics.median(median_tpot(run(a.model, prompts, params, k, measured))
                                    for _ in range(a.repeats))
            rows.append({"workload": name, "k": k, "tokens_per_decode": tokens_per_decode(m),
                         "steps": len(m.traces), "acceptance": stats.acceptance_rate,
                         "modelled_tpot_ms": median_tpot(m) * 1000, "measured_tpot_ms": cpu * 1000, "same": same})
            r = rows[-1]
            print(f"{name:16s} k={k}: {r['tokens_per_decode']:.2f} tok/decode, {r['steps']} steps, acceptance "
                  f"{r['acceptance']:.0%}, TPOT modelled {r['modelled_tpot_ms']:.2f} ms, measured "
                  f"{r['measured_tpot_ms']:.2f} ms, same tokens {same}", flush=True)
    base = {r["workload"]: r for r in rows if r["k"] == a.ks[0]}
    lines = ["| workload | k | tokens per decode | steps | acceptance | modelled TPOT (ms) | vs off | measured TPOT "
             "(ms) | vs off | same tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        b = base[r["workload"]]
        acc = "n/a" if r["acceptance"] != r["acceptance"] else f"{r['acceptance']:.0%}"
        lines.append(f"| {r['workload']} | {r['k'] or 'off'} | {r['tokens_per_decode']:.2f} | {r['steps']} | {acc} "
                     f"| {r['modelled_tpot_ms']:.2f} | x{b['modelled_tpot_ms'] / r['modelled_tpot_ms']:.2f} "
                     f"| {r['measured_tpot_ms']:.2f} | x{b['measured_tpot_ms'] / r['measured_tpot_ms']:.2f} "
                     f"| {'yes' if r['same'] else 'NO'} |")
    text = "\n".join([
        "# Speculative decoding (prompt lookup) on the bundled model", "",
        f"Generated by `python benchmarks/spec_decode.py` ({time.strftime('%Y-%m-%d')}, "
        f"{platform.processor() or platform.machine()}, torch threads 1); total {time.perf_counter() - started:.0f} s.",
        "",
        f"{a.num_requests} requests at once, prompts of {a.prompt_len + 16} tokens, {a.max_tokens} new tokens each, "
        "ignore_eos; prompt_lookup_min 2, prompt_lookup_max 4; max_num_batched_tokens 512. Modelled TPOT: "
        f"{modelled.label}, the median request's. Measured TPOT: this CPU, process time per step, median over "
        f"{a.repeats} runs after a warm-up. 'vs off' = TPOT without speculation / with it (> 1: faster).", "",
        *lines, ""])
    print("\n" + text)
    if a.write:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        print(f"wrote {a.out}")
    return rows


if __name__ == "__main__":
    main()
