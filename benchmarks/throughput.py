"""Offline throughput: minengine vs transformers (padded static batches) vs transformers continuous batching.

The same workload (64 requests, prompts 32-512 tokens, 64-128 new tokens each, greedy, fixed seed) on the same
weights, in one run. Prints output tokens/s of each, the ratios, and whether the greedy outputs match.

    python benchmarks/throughput.py                      # bundled model
    python benchmarks/throughput.py --model random-20m   # a ~20M-parameter random-weight Llama
    python benchmarks/throughput.py --num-requests 16    # quicker

Speed targets (from the issue): minengine >= 2x transformers continuous batching, and >= padded static batching.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from minengine import LLM, SamplingParams


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


def make_workload(vocab: int, n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(32, 512))], rng.randint(64, 128))
            for _ in range(n)]


def run_minengine(model: str, work, max_num_batched_tokens: int) -> tuple[float, list[list[int]]]:
    llm = LLM(model, max_model_len=1024, max_num_seqs=len(work), max_num_batched_tokens=max_num_batched_tokens)
    prompts = [{"prompt_token_ids": p} for p, _ in work]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in work]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t, [o.outputs[0].token_ids for o in outs]


def run_hf_static(model_dir: str, work, batch_size: int) -> tuple[float, list[list[int]]]:
    """transformers ``generate`` on left-padded batches; each batch runs to its longest max_tokens and each
    request keeps only its own first max_tokens tokens (the rest is the waste static batching pays)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs: list[list[int]] = []
    t = time.perf_counter()
    for i in range(0, len(work), batch_size):
        chunk = work[i:i + batch_size]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=max(n for _, n in chunk), do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs += [gen[j, width:width + n].tolist() for j, (_, n) in enumerate(chunk)]
    return time.perf_counter() - t, outs


def run_hf_continuous(model_dir: str, work) -> tuple[float, list[list[int]]]:
    """transformers' continuous batching manager (``init_continuous_batching``), per-request max_new_tokens."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gc = GenerationConfig(do_sample=False, max_new_tokens=128, eos_token_id=-1, pad_token_id=0)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint dir, 'random-20m', or empty for the bundled model")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--static-batch-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-continuous", action="store_true")
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    if a.model == "random-20m":
        model_dir = make_random_llama(tmp.name)
    else:
        from minengine.config import BUNDLED_MODEL

        model_dir = a.model or BUNDLED_MODEL
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    work = make_workload(cfg.vocab_size, a.num_requests, a.seed)
    n_out = sum(n for _, n in work)
    print(f"model {model_dir} | {a.num_requests} requests, prompts 32-512, outputs 64-128 ({n_out} output tokens) "
          f"| torch threads {torch.get_num_threads()}")

    results = {}
    t, me = run_minengine(model_dir, work, a.max_num_batched_tokens)
    results["minengine"] = (t, me)
    t, st = run_hf_static(model_dir, work, a.static_batch_size)
    results[f"transformers static (batch {a.static_batch_size})"] = (t, st)
    if not a.skip_continuous:
        try:
            t, cb = run_hf_continuous(model_dir, work)
            results["transformers continuous batching"] = (t, cb)
        except Exception as exc:  # report, do not hide, a peer that failed to run
            print(f"transformers continuous batching failed: {type(exc).__name__}: {exc}")

    base = results["minengine"][0]
    print(f"\n{'system':<36} {'time (s)':>9} {'out tok/s':>10} {'minengine speedup':>18} {'outputs == minengine':>21}")
    for name, (t, outs) in results.items():
        same = sum(o == m for o, m in zip(outs, me))
        print(f"{name:<36} {t:>9.2f} {n_out / t:>10.1f} {t / base:>17.2f}x {same:>14}/{len(me)}")


if __name__ == "__main__":
    main()
